//! The Infra controller, in three steps per reconcile:
//! - observe: the Infra comes from the controller's reflector store, what it
//!   owns from the watch-fed indexes ([`super::context`]); the few foreign
//!   objects it names (its HostedCluster, NetworkAttachmentDefinition,
//!   internal proxy Service: [`super::observe`], and the policy in the
//!   control-plane namespace) are read;
//! - render: [`validate`] then [`render`], pure functions of the above;
//! - apply: server-side apply under one field manager, one component at a
//!   time ([`super::components`]), only for objects whose live state differs
//!   from the rendering ([`drift`]), so a reconcile in steady state reads
//!   and writes nothing. Status is applied to `/status` the same way, and
//!   only when it changed.
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
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
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

use super::attachment::{self, InfraClusterAttachment};
use super::components::{component_state, disruption_budget_resource};
use super::context::{Context, Indexes};
use super::crd::{AttachmentCounts, ComponentStatus, Infra, InfraStatus, ReplicaStatus};
use super::observe::{attachments_of, hosted_cluster, network_attachment, service_address};
use super::plan::{Component, Owner, Settings};
use super::pod_monitors::PodMonitors;
use super::render::{self, Rendered};
use super::status::{self, AttachmentsSeen, ComponentState, Observed};
use super::validate::{self, InternalProxyTarget, ServiceAddress};
use crate::error::Error;
use crate::k8s::apply::{not_found, Applier, Noise, OnMissing};
use crate::k8s::conditions;
use crate::k8s::events::publish_about;
use crate::k8s::finalizer as finalizers;
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::machine_resource;
use crate::k8s::watch::{
    cached, cached_optional, owned, owned_dynamic, touched, Everywhere, OptionalKind, Scope,
};

/// Removes the control-plane NetworkPolicy before the Infra goes.
pub const FINALIZER: &str = "causeway.io/cleanup";
const CONTROLLER: &str = "infra";
/// Reconciles in flight at once, per watched namespace scope.
pub const RECONCILE_CONCURRENCY: u16 = 32;

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
        external_service,
    } = rendered;
    let shared = async {
        ctx.applier
            .ensure_indexed(&s.service_accounts, service_account)
            .await?;
        ctx.applier
            .ensure_indexed(&s.network_policies, admin_policy)
            .await?;
        // Made (taking over the Go operator's of the same name, which the
        // index of ours does not hold), or gone when no longer rendered.
        let external_name = render::external_service_name(owner);
        match external_service {
            Some(svc) => ctx.applier.ensure_indexed(&s.services, svc).await?,
            None if s.services.get(&owner.namespace, &external_name).is_some() => {
                let services: Api<Service> = Api::namespaced(ctx.client.clone(), &owner.namespace);
                ctx.applier
                    .gone_from(&services, "Service", &external_name)
                    .await?;
            }
            None => {}
        }
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
#[path = "controller_tests.rs"]
mod tests;
