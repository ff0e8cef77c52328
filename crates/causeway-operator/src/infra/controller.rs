//! The Infra controller, in three steps per reconcile:
//! - observe: the Infra comes from the controller's reflector store, what it
//!   owns from the watch-fed [`index`](crate::index); the few foreign
//!   objects it names (its HostedCluster, NetworkAttachmentDefinition,
//!   internal proxy Service, and the policy in the control-plane namespace)
//!   are read;
//! - render: [`validate`] then [`render`], pure functions of the above;
//! - apply: server-side apply under one field manager, only for objects
//!   whose live state differs from the rendering ([`drift`]), so a reconcile
//!   in steady state reads and writes nothing. Status is applied to `/status` the
//!   same way, and only when it changed.
//!
//! A finalizer removes what owner references cannot reach: the
//! NetworkPolicy in the control-plane namespace.
//!
//! A component whose workload changes kind or shape (one replica to two and
//! back) has its old workload deleted first, pods before it, and nothing
//! else of it changed until that is done: the old pods never run the new
//! config, and the serverIP is never held by an old pod and a new one.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::finalizer::{finalizer, Event as Finalize};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::attachment::{self, Aggregate, InfraClusterAttachment};
use super::crd::{AttachmentCounts, ComponentStatus, Infra, InfraStatus, ReplicaStatus};
use super::plan::{Component, Owner, Settings, MAX_REPLICAS};
use super::pod_monitors::PodMonitors;
use super::render::{self, ComponentObjects, HaObjects, Rendered, Workload};
use super::status::{self, AttachmentsSeen, ComponentState, Observed};
use super::validate::{self, HostedClusterFacts, InternalProxyTarget, ServiceAddress};
use crate::error::Error;
use crate::k8s::apply::{api_message, not_found, Applier, Noise, OnMissing};
use crate::k8s::conditions;
use crate::k8s::events::publish_about;
use crate::k8s::finalizer as finalizers;
use crate::k8s::index::{Index, Owned, WorkloadFacts};
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::{hosted_cluster_resource, machine_resource, nad_resource, resource};
use crate::k8s::watch::{
    cached, cached_optional, owned, owned_dynamic, touched, Everywhere, OptionalKind,
    OptionalStore, Scope,
};

/// Removes the control-plane NetworkPolicy before the Infra goes.
pub const FINALIZER: &str = "causeway.io/cleanup";
const CONTROLLER: &str = "infra";
/// Reconciles in flight at once, per watched namespace scope.
pub const RECONCILE_CONCURRENCY: u16 = 32;

/// What the reconciler reads from: one index per kind it owns, all limited
/// to the watched namespace (or all) and to objects it made.
#[derive(Clone, Default)]
pub struct Indexes {
    pub config_maps: Index,
    pub deployments: Index,
    pub stateful_sets: Index,
    pub service_accounts: Index,
    pub services: Index,
    pub network_policies: Index,
    pub leases: Index,
    pub disruption_budgets: Index,
    pub roles: Index,
    pub role_bindings: Index,
}

impl Indexes {
    /// Whether every watch has delivered its first list: until then a
    /// missing entry may only be one not listed yet.
    pub fn ready(&self) -> bool {
        [
            &self.config_maps,
            &self.deployments,
            &self.stateful_sets,
            &self.service_accounts,
            &self.services,
            &self.network_policies,
            &self.leases,
            &self.disruption_budgets,
            &self.roles,
            &self.role_bindings,
        ]
        .iter()
        .all(|i| i.ready())
    }
}

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub settings: Settings,
    pub indexes: Indexes,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
    /// PodDisruptionBudgets in the version the API server serves.
    pub disruption_budget: ApiResource,
    /// PodMonitors, when they are asked for and the API server serves them.
    pub pod_monitors: PodMonitors,
    /// The replicas' key Secrets known to exist: the operator may create
    /// and delete Secrets but not read them, so it remembers.
    pub ha_keys: Mutex<HashSet<(String, String)>>,
    /// Every InfraClusterAttachment in scope.
    pub attachments: OptionalStore<InfraClusterAttachment>,
    /// Every Cluster API Machine in scope (empty while the kind is not
    /// served).
    pub machines: Everywhere,
}

/// Every address of every Machine in `ns`.
pub fn machine_addresses(machines: &Everywhere, ns: &str) -> Vec<String> {
    machines
        .state()
        .iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
        .filter_map(|m| m.data.pointer("/status/addresses")?.as_array().cloned())
        .flatten()
        .filter_map(|a| a.get("address")?.as_str().map(str::to_string))
        .collect()
}

/// The attachments naming `infra`, not being deleted, decided over; each
/// with the worker addresses its cluster's Machines report.
pub fn attachments_of(
    store: &Store<InfraClusterAttachment>,
    machines: &Everywhere,
    infra: &Infra,
) -> Aggregate {
    let ns = infra.namespace().unwrap_or_default();
    let name = infra.name_any();
    let cidr = infra
        .spec
        .network_config
        .cidr
        .trim()
        .parse::<ipnet::Ipv4Net>()
        .ok()
        .map(|n| n.trunc());
    let mine = store
        .state()
        .into_iter()
        .filter(|a| {
            a.namespace().as_deref() == Some(ns.as_str())
                && a.spec.infra_ref.name == name
                && a.metadata.deletion_timestamp.is_none()
        })
        .map(|a| {
            let n = a.name_any();
            let c = attachment::candidate(&n, &a.spec, cidr).map(|mut c| {
                let found = machine_addresses(machines, &c.control_plane_namespace);
                attachment::add_discovered(&mut c, found.iter().map(String::as_str), cidr);
                c.apps = super::apps_ingress::ready_endpoint(
                    a.spec.apps_ingress.as_ref(),
                    a.status
                        .as_ref()
                        .and_then(|s| s.apps_ingress_status.as_ref()),
                );
                c
            });
            (n, c)
        })
        .collect();
    attachment::aggregate(mine)
}

/// What a referenced HostedCluster says, or why it could not be read. A
/// HostedCluster that is there but malformed gives what could be read.
async fn hosted_cluster(
    client: &Client,
    infra: &Infra,
    ns: &str,
) -> Result<Option<HostedClusterFacts>, String> {
    let Some(r) = &infra.spec.hosted_cluster_ref else {
        return Ok(None);
    };
    let hc_ns = r.namespace.clone().unwrap_or_else(|| ns.to_string());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &hc_ns, &hosted_cluster_resource());
    match api.get_opt(&r.name).await {
        Ok(Some(hc)) => {
            let object = serde_json::to_value(&hc).unwrap_or_default();
            Ok(Some(HostedClusterFacts {
                name: r.name.clone(),
                namespace: hc_ns,
                ..HostedClusterFacts::from_object(&object)
            }))
        }
        Ok(None) => Err(format!(
            "hostedClusterRef: HostedCluster {hc_ns}/{} not found",
            r.name
        )),
        Err(e) => Err(format!(
            "hostedClusterRef: reading HostedCluster {hc_ns}/{}: {}",
            r.name,
            api_message(&e)
        )),
    }
}

/// Whether the NetworkAttachmentDefinition is there: `Err` says why not.
async fn network_attachment(client: &Client, ns: &str, name: &str) -> Result<(), String> {
    let nads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &nad_resource());
    match nads.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!("NetworkAttachmentDefinition {ns}/{name} not found")),
        Err(e) => Err(format!(
            "NetworkAttachmentDefinition {ns}/{name}: {}",
            api_message(&e)
        )),
    }
}

/// The Service `internalProxyService` names, read live (it is not ours,
/// so not in a store; its changes still trigger a reconcile).
async fn service_address(client: &Client, ns: &str, name: &str) -> Result<ServiceAddress, Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    Ok(match api.get_opt(name).await? {
        None => ServiceAddress::Missing,
        Some(svc) => svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .map_or(ServiceAddress::NoClusterIp, ServiceAddress::ClusterIp),
    })
}

fn workload_state(w: Option<WorkloadFacts>, component: Component) -> ComponentState {
    let pods = component.name();
    // One message for every way of not being ready (no workload yet, a
    // workload controller that has not caught up, a pod starting), so
    // status is not rewritten for each step of a rollout.
    match w {
        Some(f) if f.observed_generation >= f.generation && f.updated && f.ready_replicas >= 1 => {
            ComponentState::Ready
        }
        _ => ComponentState::NotReady(format!("0 of 1 {pods} pods ready and up to date")),
    }
}

/// Two replicas: ready when both are ready on the latest template; while
/// one is, the component serves without a standby (degraded, not down),
/// whatever the workload controller is doing.
pub fn replicated_state(w: Option<WorkloadFacts>, component: Component) -> ComponentState {
    let pods = component.name();
    match w {
        Some(f)
            if f.observed_generation >= f.generation
                && f.updated
                && f.ready_replicas >= MAX_REPLICAS =>
        {
            ComponentState::Ready
        }
        Some(f) if f.ready_replicas >= 1 => ComponentState::Degraded(format!(
            "{pods} serves from one replica: the other is not ready or not up to date, so there is no standby"
        )),
        _ => ComponentState::NotReady(format!(
            "0 of {MAX_REPLICAS} {pods} pods ready and up to date"
        )),
    }
}

/// One pass over one Infra, wrapped in the finalizer.
pub async fn reconcile(infra: Arc<Infra>, ctx: Arc<Context>) -> Result<Action, Error> {
    let timer = ReconcileTimer::start(ctx.metrics.as_ref(), CONTROLLER);
    let ns = infra.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<Infra> = Api::namespaced(ctx.client.clone(), &ns);
    let mut valid = true;
    let result = finalizer(&api, FINALIZER, infra, |event| async {
        match event {
            Finalize::Apply(infra) => {
                let (action, was_valid) = apply_infra(&infra, &ctx).await?;
                valid = was_valid;
                Ok(action)
            }
            Finalize::Cleanup(infra) => cleanup(&infra, &ctx).await,
        }
    })
    .await
    .map_err(finalizers::from_kube);
    timer.finish(&result, valid);
    result
}

async fn cleanup(infra: &Infra, ctx: &Context) -> Result<Action, Error> {
    let owner = Owner::of(infra)?;
    // The policy is wherever the Infra's proxy reached: found by its labels
    // across namespaces, as the spec that named the namespace may have
    // changed since. An operator limited to some namespaces may not list
    // across them; it looks where the spec points now.
    let selector = format!(
        "{}={},{}={}",
        render::INFRA_NAME_LABEL,
        owner.name,
        render::INFRA_NAMESPACE_LABEL,
        owner.namespace
    );
    let params = kube::api::ListParams::default().labels(&selector);
    let everywhere: Api<NetworkPolicy> = Api::all(ctx.client.clone());
    let found = match everywhere.list(&params).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            match validate::control_plane_namespace(&infra.spec, &owner.namespace) {
                Some(ns) => match Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &ns)
                    .list(&params)
                    .await
                {
                    Ok(list) => list.items,
                    Err(e) if not_found(&e) => Vec::new(),
                    Err(e) => return Err(e.into()),
                },
                None => Vec::new(),
            }
        }
        Err(e) => return Err(e.into()),
    };
    for policy in found {
        let ns = policy.namespace().unwrap_or_default();
        let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        ctx.applier
            .gone_from(&api, "NetworkPolicy", &policy.name_any())
            .await?;
    }
    if let Ok(mut keys) = ctx.ha_keys.lock() {
        for c in Component::ALL {
            keys.remove(&(owner.namespace.clone(), render::ha_key_name(&owner, c)));
        }
    }
    tracing::info!(infra = %owner.name, namespace = %owner.namespace, "cleaned up; owned objects go by garbage collection");
    Ok(Action::await_change())
}

/// The action, and whether the spec was valid.
async fn apply_infra(infra: &Infra, ctx: &Context) -> Result<(Action, bool), Error> {
    if !ctx.indexes.ready() || !ctx.attachments.ready() {
        // Right after start: an object not listed yet would be applied
        // again for nothing.
        return Ok((Action::requeue(Duration::from_secs(1)), true));
    }
    let owner = Owner::of(infra)?;
    let ns = owner.namespace.clone();
    let client = &ctx.client;

    // Observe what the Infra names.
    let hc = hosted_cluster(client, infra, &ns).await;
    let mut service_addresses = BTreeMap::new();
    if let Some(InternalProxyTarget::Service { namespace, name }) = infra
        .spec
        .infra_components
        .proxy_enabled()
        .and_then(|p| validate::internal_proxy_target(p, &ns))
    {
        let address = service_address(client, &namespace, &name).await?;
        service_addresses.insert((namespace, name), address);
    }
    let lookup = |ns: &str, name: &str| {
        service_addresses
            .get(&(ns.to_string(), name.to_string()))
            .copied()
            .unwrap_or(ServiceAddress::Missing)
    };
    let attached = attachments_of(ctx.attachments.store(), &ctx.machines, infra);
    let attachments = AttachmentsSeen::of(&attached);
    // With attachments, the Infra's own HostedCluster reference is ignored.
    let hc = if attached.verdicts.is_empty() {
        hc
    } else {
        Ok(None)
    };
    let plan = match hc {
        Ok(facts) => validate::validate(
            &infra.spec,
            &owner.name,
            &ns,
            facts.as_ref(),
            &lookup,
            &attached.served,
        ),
        Err(why) => Err(vec![why]),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(errors) => {
            // Nothing is changed while the spec is invalid: what runs keeps
            // running. Checked again on the next change or in a minute
            // (a HostedCluster or Service named may appear).
            tracing::warn!(infra = %owner.name, namespace = %ns, errors = ?errors, "invalid Infra");
            let observed = Observed {
                valid: Err(errors),
                network_attachment: None,
                warnings: Vec::new(),
                components: Vec::new(),
                replicas: Vec::new(),
                attachments: attachments.clone(),
                control_plane_namespaces: kept_namespaces(infra),
            };
            write_status(ctx, infra, &observed).await?;
            return Ok((Action::requeue(Duration::from_secs(60)), false));
        }
    };
    if let Err(why) = network_attachment(client, &plan.nad_namespace, &plan.nad_name).await {
        tracing::warn!(infra = %owner.name, namespace = %ns, %why, "network attachment missing");
        let observed = Observed {
            valid: Ok(()),
            network_attachment: Some(Err(why)),
            warnings: plan.warnings.clone(),
            components: Vec::new(),
            replicas: Vec::new(),
            attachments: attachments.clone(),
            control_plane_namespaces: kept_namespaces(infra),
        };
        write_status(ctx, infra, &observed).await?;
        return Ok((Action::requeue(Duration::from_secs(30)), true));
    }

    // Render, and apply what differs.
    let rendered = render::render(&plan, &owner, &ctx.settings);
    let previous_namespaces = infra
        .status
        .as_ref()
        .map(|s| s.control_plane_namespaces.clone())
        .unwrap_or_default();
    let states = apply_rendered(ctx, &owner, rendered, &plan.waiting, &previous_namespaces).await?;

    let observed = Observed {
        valid: Ok(()),
        network_attachment: Some(Ok(())),
        warnings: plan.warnings.clone(),
        replicas: states
            .iter()
            .filter_map(|(c, _, r)| r.clone().map(|r| (*c, r)))
            .collect(),
        components: states.into_iter().map(|(c, s, _)| (c, s)).collect(),
        attachments,
        control_plane_namespaces: plan.control_plane_namespaces.clone(),
    };
    write_status(ctx, infra, &observed).await?;
    // Owned objects are watched, so changes come as events; this is the
    // backstop for anything missed, and it writes nothing when all is well.
    Ok((Action::requeue(Duration::from_secs(300)), true))
}

/// The Infras whose attachments put their control plane in `ns`.
pub fn infras_of_namespace(
    attachments: &Store<InfraClusterAttachment>,
    ns: &str,
) -> Vec<ObjectRef<Infra>> {
    let mut out: Vec<ObjectRef<Infra>> = attachments
        .state()
        .iter()
        .filter(|a| {
            attachment::candidate(&a.name_any(), &a.spec, None)
                .is_ok_and(|c| c.control_plane_namespace == ns)
        })
        .filter_map(|a| {
            a.namespace()
                .map(|own| ObjectRef::new(&a.spec.infra_ref.name).within(&own))
        })
        .collect();
    out.sort_by_key(|r| (r.namespace.clone(), r.name.clone()));
    out.dedup();
    out
}

/// Where the policies are while a pass changes nothing: where they were.
fn kept_namespaces(infra: &Infra) -> Vec<String> {
    infra
        .status
        .as_ref()
        .map(|s| s.control_plane_namespaces.clone())
        .unwrap_or_default()
}

/// Each component's state, and for two replicas what its status shows.
type ComponentOutcome = (Component, ComponentState, Option<ReplicaStatus>);

async fn apply_rendered(
    ctx: &Context,
    owner: &Owner,
    rendered: Rendered,
    waiting: &[(Component, String)],
    previous_namespaces: &[String],
) -> Result<Vec<ComponentOutcome>, Error> {
    let s = &ctx.indexes;
    let Rendered {
        service_account,
        components,
        admin_policy,
        control_plane_policies,
    } = rendered;
    let shared = async {
        ctx.applier
            .ensure_indexed(&s.service_accounts, service_account)
            .await?;
        ctx.applier
            .ensure_indexed(&s.network_policies, admin_policy)
            .await?;
        // A control-plane namespace no longer served (its attachment went,
        // or lost a conflict) loses its policy: the status says where the
        // last pass put them, wherever the operator may watch.
        let policy_name = render::control_plane_policy_name(owner);
        let keep: Vec<String> = control_plane_policies
            .iter()
            .filter_map(|p| p.metadata.namespace.clone())
            .collect();
        for ns in previous_namespaces.iter().filter(|ns| !keep.contains(ns)) {
            let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
            ctx.applier
                .gone_from(&api, "NetworkPolicy", &policy_name)
                .await?;
        }
        if let Some(resource) = ctx.pod_monitors.resource(&ctx.client).await {
            match ensure_pod_monitor(ctx, owner, &resource).await {
                // The namespace is there (the Infra is in it): the kind is
                // what went away.
                Err(Error::Kube(e)) if not_found(&e) => ctx.pod_monitors.gone(),
                other => other?,
            }
        }
        for policy in control_plane_policies {
            let target = policy.metadata.namespace.clone().unwrap_or_default();
            match ctx.applier.ensure_live(policy).await {
                // HyperShift makes the control-plane namespace; until it
                // has, there is nothing to let through. Tried again on the
                // resync.
                Err(Error::Kube(e)) if not_found(&e) => {
                    tracing::info!(namespace = %target, "control-plane namespace not there yet: its NetworkPolicy waits");
                }
                other => other?,
            }
        }
        Ok::<(), Error>(())
    };
    // Boxed: each is a deep future, and three side by side inline would
    // outgrow a worker thread's stack in a debug build.
    let component = |c: Component| {
        let objects = components.iter().find(|o| o.component == c).cloned();
        let wait = waiting
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, why)| why.clone());
        Box::pin(async move {
            match wait {
                // Left as it is: nothing to run it with yet, and what runs
                // of it may still serve.
                Some(why) => Ok((ComponentState::NotReady(why), None)),
                None => component_state(ctx, owner, c, objects).await,
            }
        })
    };
    // The objects of different components do not depend on each other:
    // applied side by side, a reconcile takes a few round trips, not ten.
    let ((), dhcp, dns, proxy) = futures::try_join!(
        shared,
        component(Component::Dhcp),
        component(Component::Dns),
        component(Component::Proxy),
    )?;
    Ok(vec![
        (Component::Dhcp, dhcp.0, dhcp.1),
        (Component::Dns, dns.0, dns.1),
        (Component::Proxy, proxy.0, proxy.1),
    ])
}

/// One component's objects applied, config first, or removed when it is
/// disabled; its state as the workload's status shows it.
async fn component_state(
    ctx: &Context,
    owner: &Owner,
    component: Component,
    objects: Option<ComponentObjects>,
) -> Result<(ComponentState, Option<ReplicaStatus>), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let name = render::object_name(owner, component);
    let Some(objects) = objects else {
        ctx.applier
            .remove::<ConfigMap>(
                &s.config_maps,
                ns,
                &render::config_map_name(owner, component),
            )
            .await?;
        // Either kind: DNS and the proxy are StatefulSets with two replicas.
        ctx.applier
            .remove::<StatefulSet>(&s.stateful_sets, ns, &name)
            .await?;
        ctx.applier
            .remove::<Deployment>(&s.deployments, ns, &name)
            .await?;
        if component == Component::Dns {
            ctx.applier
                .remove::<Service>(&s.services, ns, &name)
                .await?;
        }
        Box::pin(remove_ha(ctx, owner, component)).await?;
        return Ok((ComponentState::Disabled, None));
    };

    // A workload of another kind or shape goes first, with its pods;
    // until it has, nothing of the component changes.
    let replacing = match &objects.workload {
        Workload::StatefulSet(set) => {
            let stale_shape = s
                .stateful_sets
                .get(ns, &name)
                .is_some_and(|seen| seen.shape != set.shape());
            if stale_shape {
                ctx.applier
                    .remove_foreground::<StatefulSet>(&s.stateful_sets, ns, &name)
                    .await?;
            }
            ctx.applier
                .remove_foreground::<Deployment>(&s.deployments, ns, &name)
                .await?;
            stale_shape || s.deployments.get(ns, &name).is_some()
        }
        Workload::Deployment(_) => {
            ctx.applier
                .remove_foreground::<StatefulSet>(&s.stateful_sets, ns, &name)
                .await?;
            s.stateful_sets.get(ns, &name).is_some()
        }
    };
    if replacing {
        return Ok((
            ComponentState::NotReady(format!(
                "replacing the {} workload: its old pods go before the new ones start",
                component.name()
            )),
            None,
        ));
    }

    ctx.applier
        .ensure_indexed(&s.config_maps, objects.config)
        .await?;
    if let Some(service) = objects.service {
        ctx.applier.ensure_indexed(&s.services, service).await?;
    }
    let replicated = objects.ha.is_some();
    match objects.ha {
        Some(ha) => Box::pin(ensure_ha(ctx, owner, component, ha)).await?,
        None => Box::pin(remove_ha(ctx, owner, component)).await?,
    }
    let facts = match objects.workload {
        Workload::StatefulSet(set) => {
            ctx.applier.ensure_indexed(&s.stateful_sets, set).await?;
            s.stateful_sets.get(ns, &name).and_then(|w| w.workload)
        }
        Workload::Deployment(d) => {
            ctx.applier.ensure_indexed(&s.deployments, d).await?;
            s.deployments.get(ns, &name).and_then(|w| w.workload)
        }
    };
    if !replicated {
        return Ok((workload_state(facts, component), None));
    }
    let replicas = ReplicaStatus {
        replicas: MAX_REPLICAS,
        ready_replicas: facts.map_or(0, |f| f.ready_replicas),
        active_replica: s
            .leases
            .get(ns, &render::lease_name(owner, component))
            .and_then(|l| l.holder),
    };
    Ok((replicated_state(facts, component), Some(replicas)))
}

/// What two replicas need beside their workload, the identity before what
/// it is granted. The key is made once: asked for again only while the
/// replicas are not both ready, as a key Secret deleted by hand keeps new
/// pods from starting.
async fn ensure_ha(
    ctx: &Context,
    owner: &Owner,
    component: Component,
    ha: HaObjects,
) -> Result<(), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let HaObjects {
        peers,
        disruption_budget,
        lease,
        service_account,
        role,
        role_binding,
    } = ha;
    ctx.applier
        .ensure_indexed(&s.service_accounts, service_account)
        .await?;
    ctx.applier.ensure_indexed(&s.leases, lease).await?;
    ctx.applier.ensure_indexed(&s.roles, role).await?;
    ctx.applier
        .ensure_indexed(&s.role_bindings, role_binding)
        .await?;
    ctx.applier.ensure_indexed(&s.services, peers).await?;
    let budget = disruption_budget_object(&ctx.disruption_budget, &disruption_budget)?;
    ctx.applier
        .ensure_indexed_dynamic(&s.disruption_budgets, &ctx.disruption_budget, budget)
        .await?;

    let key = (ns.to_string(), render::ha_key_name(owner, component));
    let both_ready = s
        .stateful_sets
        .get(ns, &render::object_name(owner, component))
        .and_then(|w| w.workload)
        .is_some_and(|f| f.ready_replicas >= MAX_REPLICAS);
    if both_ready && known_key(ctx, &key) {
        return Ok(());
    }
    ctx.applier
        .create_absent(&render::ha_key(owner, component, rand::random()))
        .await?;
    if let Ok(mut keys) = ctx.ha_keys.lock() {
        keys.insert(key);
    }
    Ok(())
}

fn known_key(ctx: &Context, key: &(String, String)) -> bool {
    ctx.ha_keys.lock().is_ok_and(|keys| keys.contains(key))
}

/// The Infra's PodMonitor, read first so an unchanged one is not applied
/// again. Owned by the Infra: garbage collection removes it.
async fn ensure_pod_monitor(
    ctx: &Context,
    owner: &Owner,
    resource: &ApiResource,
) -> Result<(), Error> {
    let desired: DynamicObject = serde_json::from_value(render::pod_monitor(owner))
        .map_err(|e| Error::Render(e.to_string()))?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &owner.namespace, resource);
    let live = api.get_opt(&render::pod_monitor_name(owner)).await?;
    ctx.applier.ensure_dynamic(resource, desired, live).await?;
    Ok(())
}

/// The budget as the version the API server serves: v1 and v1beta1 have
/// the same fields for what is set here.
fn disruption_budget_object(
    resource: &ApiResource,
    budget: &k8s_openapi::api::policy::v1::PodDisruptionBudget,
) -> Result<DynamicObject, Error> {
    let mut value = serde_json::to_value(budget).map_err(|e| Error::Render(e.to_string()))?;
    value["apiVersion"] = resource.api_version.clone().into();
    value["kind"] = resource.kind.clone().into();
    serde_json::from_value(value).map_err(|e| Error::Render(e.to_string()))
}

/// Removes what only two replicas have, once they are gone: the key first
/// (the operator cannot see it; the others say whether there is anything
/// to remove) and the Lease last, so an interrupted removal is taken up
/// again.
async fn remove_ha(ctx: &Context, owner: &Owner, component: Component) -> Result<(), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let identity = render::ha_identity_name(owner, component);
    let peers = render::peers_name(owner, component);
    let workload = render::object_name(owner, component);
    let lease = render::lease_name(owner, component);
    let any = s.leases.get(ns, &lease).is_some()
        || s.roles.get(ns, &identity).is_some()
        || s.role_bindings.get(ns, &identity).is_some()
        || s.service_accounts.get(ns, &identity).is_some()
        || s.services.get(ns, &peers).is_some()
        || s.disruption_budgets.get(ns, &workload).is_some();
    if !any {
        return Ok(());
    }
    let key = render::ha_key_name(owner, component);
    ctx.applier.remove_unindexed::<Secret>(ns, &key).await?;
    if let Ok(mut keys) = ctx.ha_keys.lock() {
        keys.remove(&(ns.to_string(), key));
    }
    ctx.applier
        .remove_dynamic(&s.disruption_budgets, &ctx.disruption_budget, ns, &workload)
        .await?;
    ctx.applier
        .remove::<Service>(&s.services, ns, &peers)
        .await?;
    ctx.applier
        .remove::<RoleBinding>(&s.role_bindings, ns, &identity)
        .await?;
    ctx.applier.remove::<Role>(&s.roles, ns, &identity).await?;
    ctx.applier
        .remove::<ServiceAccount>(&s.service_accounts, ns, &identity)
        .await?;
    ctx.applier.remove::<Lease>(&s.leases, ns, &lease).await?;
    Ok(())
}

/// The PodDisruptionBudget API the server serves: policy/v1 from 1.21,
/// policy/v1beta1 before (1.20, which the operator still supports).
async fn disruption_budget_resource(client: &Client) -> ApiResource {
    if crate::k8s::watch::served_eventually(client, "policy/v1", "poddisruptionbudgets").await {
        return resource(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        );
    }
    tracing::info!("no policy/v1 PodDisruptionBudgets: using policy/v1beta1");
    resource(
        "policy",
        "v1beta1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
    )
}

async fn write_status(ctx: &Context, infra: &Infra, observed: &Observed) -> Result<(), Error> {
    let ns = infra.namespace().ok_or(Error::NoNamespace)?;
    let previous = infra.status.clone().unwrap_or_default();
    let conditions = status::conditions(
        &previous.conditions,
        observed,
        infra.metadata.generation,
        &conditions::now(),
    );
    // A component without a standby still serves.
    let ready = |c: Component| {
        observed.components.iter().any(|(k, s)| {
            *k == c && matches!(s, ComponentState::Ready | ComponentState::Degraded(_))
        })
    };
    let replicas = |c: Component| {
        observed
            .replicas
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, r)| r.clone())
    };
    let next = InfraStatus {
        conditions,
        observed_generation: infra.metadata.generation,
        control_plane_namespaces: observed.control_plane_namespaces.clone(),
        attachments: (observed.attachments.total > 0).then_some(AttachmentCounts {
            total: observed.attachments.total,
            ready: observed.attachments.served,
        }),
        component_status: Some(ComponentStatus {
            dhcp_ready: ready(Component::Dhcp),
            dns_ready: ready(Component::Dns),
            proxy_ready: ready(Component::Proxy),
            dhcp: replicas(Component::Dhcp),
            dns: replicas(Component::Dns),
            proxy: replicas(Component::Proxy),
        }),
    };
    let api: Api<Infra> = Api::namespaced(ctx.client.clone(), &ns);
    let written = ctx
        .applier
        .apply_status(
            &api,
            &infra.name_any(),
            &previous,
            &next,
            &next,
            OnMissing::Fail,
        )
        .await?;
    let was_ready = is_ready(&previous);
    let now_ready = is_ready(&next);
    if written && was_ready != now_ready {
        let (type_, reason, note) = if now_ready {
            (
                EventType::Normal,
                "Ready",
                "every enabled component is ready".to_string(),
            )
        } else {
            let why = next
                .conditions
                .iter()
                .find(|c| c.type_ == status::READY)
                .map(|c| c.message.clone())
                .unwrap_or_default();
            (EventType::Warning, "NotReady", why)
        };
        publish_about(ctx.recorder.as_ref(), infra, type_, reason, note).await;
    }
    Ok(())
}

fn is_ready(s: &InfraStatus) -> bool {
    s.conditions
        .iter()
        .any(|c| c.type_ == status::READY && c.status == "True")
}

fn error_policy(infra: Arc<Infra>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(infra = %infra.name_any(), namespace = ?infra.namespace(), %error, "reconcile failed; retrying in 15 s");
    Action::requeue(Duration::from_secs(15))
}

/// Whether `infra` names `svc` as its internal proxy Service.
fn names_service(infra: &Infra, svc_ns: &str, svc_name: &str) -> bool {
    let Some(ns) = infra.namespace() else {
        return false;
    };
    matches!(
        infra
            .spec
            .infra_components
            .proxy
            .as_ref()
            .and_then(|p| validate::internal_proxy_target(p, &ns)),
        Some(InternalProxyTarget::Service { namespace, name }) if namespace == svc_ns && name == svc_name
    )
}

/// Runs the Infra controller over `scope` until `shutdown` resolves.
/// `all_scopes` are every scope the operator works in: Machines are
/// watched in all of them.
pub async fn run(
    client: Client,
    scope: Scope,
    all_scopes: Vec<Scope>,
    settings: Settings,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    if let Some(m) = &metrics {
        m.controller_started(CONTROLLER);
    }
    let disruption_budget = disruption_budget_resource(&client).await;
    let pod_monitors = PodMonitors::at_start(&client, settings.pod_monitors).await;
    let (machines, machine_stream) = Everywhere::watch(
        &client,
        &all_scopes,
        &machine_resource(),
        "attachments' worker addresses come from their Infra's spec only",
    );
    let (attachments, attachment_stream) = cached_optional(
        &client,
        scope.api::<InfraClusterAttachment>(&client),
        OptionalKind::of(
            &kube::core::ApiResource::erase::<InfraClusterAttachment>(&()),
            "Infras are rendered without attachments",
        ),
        watcher::Config::default(),
    );
    let attachment_store = attachments.store().clone();
    let (config_maps, cm_stream) = owned(scope.api::<ConfigMap>(&client));
    let (deployments, deploy_stream) = owned(scope.api::<Deployment>(&client));
    let (stateful_sets, sts_stream) = owned(scope.api::<StatefulSet>(&client));
    let (service_accounts, sa_stream) = owned(scope.api::<ServiceAccount>(&client));
    let (services, svc_stream) = owned(scope.api::<Service>(&client));
    let (network_policies, np_stream) = owned(scope.api::<NetworkPolicy>(&client));
    let (leases, lease_stream) = owned(scope.api::<Lease>(&client));
    let (roles, role_stream) = owned(scope.api::<Role>(&client));
    let (role_bindings, binding_stream) = owned(scope.api::<RoleBinding>(&client));
    let (disruption_budgets, pdb_stream) = owned_dynamic(
        scope.api_with::<DynamicObject>(&client, &disruption_budget),
        disruption_budget.clone(),
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Debug),
        settings,
        indexes: Indexes {
            config_maps,
            deployments,
            stateful_sets,
            service_accounts,
            services,
            network_policies,
            leases,
            disruption_budgets,
            roles,
            role_bindings,
        },
        recorder,
        metrics,
        disruption_budget: disruption_budget.clone(),
        pod_monitors,
        ha_keys: Mutex::new(HashSet::new()),
        attachments: attachments.clone(),
        machines,
    });
    let (infras, infra_stream) = cached(scope.api::<Infra>(&client), watcher::Config::default());
    let controller = Controller::for_stream(infra_stream, infras.clone());
    // Any Service an Infra names as its internal proxy: its ClusterIP is
    // rendered into the DNS config, so a new or replaced Service re-renders.
    let named_services = touched(scope.api::<Service>(&client), watcher::Config::default());
    controller
        .owns_stream(cm_stream)
        .owns_stream(deploy_stream)
        .owns_stream(sts_stream)
        .owns_stream(sa_stream)
        .owns_stream(svc_stream)
        .owns_stream(np_stream)
        .owns_stream(lease_stream)
        .owns_stream(role_stream)
        .owns_stream(binding_stream)
        .owns_stream_with(pdb_stream, disruption_budget)
        // An attachment names its Infra; that Infra renders it. (One that
        // moves to another Infra leaves the old one to its resync.)
        // A Machine's addresses are its cluster's workers: the Infras whose
        // attachments have that control-plane namespace render them.
        .watches_stream_with(
            machine_stream,
            move |m: DynamicObject| {
                let ns = m.metadata.namespace.clone().unwrap_or_default();
                infras_of_namespace(&attachment_store, &ns)
            },
            machine_resource(),
        )
        .watches_stream(attachment_stream, |a: InfraClusterAttachment| {
            a.namespace()
                .map(|ns| ObjectRef::new(&a.spec.infra_ref.name).within(&ns))
        })
        .watches_stream(named_services, move |svc: Service| {
            let ns = svc.namespace().unwrap_or_default();
            let name = svc.name_any();
            infras
                .state()
                .into_iter()
                .filter(|i| names_service(i, &ns, &name))
                .map(|i| ObjectRef::from_obj(&*i))
                .collect::<Vec<_>>()
        })
        // Bounded: a burst of Infras (a restart, a bulk apply) is worked
        // through a few at a time, which keeps the peak memory of in-flight
        // reconciles small and the API server's queue short.
        .with_config(
            kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => {
                    tracing::debug!(infra = %obj.name, namespace = ?obj.namespace, "reconciled")
                }
                Err(e) => tracing::debug!(error = %e, "controller"),
            }
        })
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn facts(ready: i32, updated: bool, observed: i64) -> Option<WorkloadFacts> {
        Some(WorkloadFacts {
            generation: 3,
            observed_generation: observed,
            ready_replicas: ready,
            updated,
        })
    }

    #[test]
    fn two_replicas_are_ready_degraded_or_down() {
        let c = Component::Dhcp;
        assert_eq!(
            replicated_state(facts(2, true, 3), c),
            ComponentState::Ready
        );
        // One left, or a rollout replacing one: it still serves.
        for f in [facts(1, true, 3), facts(2, false, 3), facts(1, false, 2)] {
            assert!(
                matches!(replicated_state(f, c), ComponentState::Degraded(_)),
                "{f:?}"
            );
        }
        for f in [facts(0, true, 3), None] {
            assert_eq!(
                replicated_state(f, c),
                ComponentState::NotReady("0 of 2 dhcp pods ready and up to date".into())
            );
        }
    }

    #[test]
    fn the_budget_is_applied_in_the_version_served() {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let mut budget = PodDisruptionBudget::default();
        budget.metadata.name = Some("x-dns".into());
        let v1beta1 = resource(
            "policy",
            "v1beta1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        );
        let obj = disruption_budget_object(&v1beta1, &budget).unwrap();
        let value = serde_json::to_value(&obj).unwrap();
        assert_eq!(value["apiVersion"], "policy/v1beta1");
        assert_eq!(value["kind"], "PodDisruptionBudget");
        assert_eq!(value["metadata"]["name"], "x-dns");
    }
}
