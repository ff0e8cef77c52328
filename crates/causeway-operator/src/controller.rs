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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind, NamespaceResourceScope};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{finalizer, Event as Finalize};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::crd::{ComponentStatus, Infra, InfraStatus};
use crate::drift;
use crate::error::Error;
use crate::index::{Index, Owned, WorkloadFacts};
use crate::render::{self, Component, ComponentObjects, Owner, Rendered, Settings, Workload};
use crate::status::{self, ComponentState, Observed};
use crate::validate::{self, HostedClusterFacts, InternalProxyTarget, ServiceAddress};

/// The field manager of every server-side apply.
pub const MANAGER: &str = "causeway-operator";
/// Removes the control-plane NetworkPolicy before the Infra goes.
pub const FINALIZER: &str = "causeway.io/cleanup";
/// The label every object the operator makes carries; the child watches
/// select on it, so the stores hold ours and nothing else.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", MANAGER);
const CONTROLLER: &str = "infra";
/// Reconciles in flight at once, per watched namespace scope.
pub const RECONCILE_CONCURRENCY: u16 = 32;

#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    writes: IntCounterVec,
    seconds: HistogramVec,
    csr_decisions: IntCounterVec,
    csr_pending: IntGaugeVec,
    csr_max_pending: IntGaugeVec,
    csr_not_running: IntCounterVec,
}

impl OperatorMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = OperatorMetrics {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_reconciles_total",
                    "Reconciles, by controller and result (ok, invalid, error)",
                ),
                &["controller", "result"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_reconcile_errors_total",
                    "Failed reconciles, by controller and kind of error",
                ),
                &["controller", "error"],
            )?,
            writes: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_api_writes_total",
                    "Requests that change objects (apply, delete), by kind and verb",
                ),
                &["kind", "verb"],
            )?,
            seconds: HistogramVec::new(
                HistogramOpts::new(
                    "causeway_operator_reconcile_seconds",
                    "Time per reconcile, by controller",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                ]),
                &["controller"],
            )?,
            csr_decisions: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_csr_decisions_total",
                    "Kubelet CSR decisions, by kind (bootstrap, serving), verdict (approve, deny, ignore) and reason; each CSR counts once per reason",
                ),
                &["kind", "verdict", "reason"],
            )?,
            csr_pending: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_csr_pending",
                    "Kubelet CSRs pending in a hosted cluster (created in the last hour)",
                ),
                &["namespace", "provisioner"],
            )?,
            csr_max_pending: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_csr_max_pending",
                    "The pending-CSR cap of a hosted cluster: above it nothing is approved",
                ),
                &["namespace", "provisioner"],
            )?,
            csr_not_running: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_csr_approver_not_running_total",
                    "Times a hosted cluster's CSR approver could not run, by reason (KubeconfigNotAvailable, HostedClusterNotReachable, LeastPrivilegeUnavailable); nothing is approved meanwhile",
                ),
                &["namespace", "provisioner", "reason"],
            )?,
        };
        registry.register(Box::new(m.csr_decisions.clone()))?;
        registry.register(Box::new(m.csr_not_running.clone()))?;
        registry.register(Box::new(m.csr_pending.clone()))?;
        registry.register(Box::new(m.csr_max_pending.clone()))?;
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.writes.clone()))?;
        registry.register(Box::new(m.seconds.clone()))?;
        Ok(m)
    }

    pub fn write(&self, kind: &str, verb: &str) {
        self.writes.with_label_values(&[kind, verb]).inc();
    }

    pub fn csr_decision(&self, kind: &str, verdict: &str, reason: &str) {
        self.csr_decisions
            .with_label_values(&[kind, verdict, reason])
            .inc();
    }

    pub fn csr_not_running(&self, namespace: &str, provisioner: &str, reason: &str) {
        self.csr_not_running
            .with_label_values(&[namespace, provisioner, reason])
            .inc();
    }

    /// The pending count and cap of one hosted cluster; `None` forgets it.
    pub fn csr_pending(&self, namespace: &str, provisioner: &str, counts: Option<(u32, u32)>) {
        let labels = [namespace, provisioner];
        match counts {
            Some((pending, max)) => {
                self.csr_pending
                    .with_label_values(&labels)
                    .set(pending.into());
                self.csr_max_pending
                    .with_label_values(&labels)
                    .set(max.into());
            }
            None => {
                let _ = self.csr_pending.remove_label_values(&labels);
                let _ = self.csr_max_pending.remove_label_values(&labels);
            }
        }
    }

    /// One reconcile of `controller`: its time, result and error kind.
    pub fn reconciled(&self, controller: &str, seconds: f64, result: &str, error: Option<&str>) {
        self.seconds
            .with_label_values(&[controller])
            .observe(seconds);
        self.reconciles
            .with_label_values(&[controller, result])
            .inc();
        if let Some(kind) = error {
            self.errors.with_label_values(&[controller, kind]).inc();
        }
    }
}

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
        ]
        .iter()
        .all(|i| i.ready())
    }
}

pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub indexes: Indexes,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
}

/// A kind the operator reads or writes without Rust types of its own.
pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn nad_resource() -> ApiResource {
    resource(
        "k8s.cni.cncf.io",
        "v1",
        "NetworkAttachmentDefinition",
        "network-attachment-definitions",
    )
}

pub fn hosted_cluster_resource() -> ApiResource {
    resource(
        "hypershift.openshift.io",
        "v1beta1",
        "HostedCluster",
        "hostedclusters",
    )
}

pub(crate) fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
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
        Ok(Some(hc)) => Ok(Some(HostedClusterFacts {
            name: r.name.clone(),
            namespace: hc_ns,
            base_domain: hc
                .data
                .pointer("/spec/dns/baseDomain")
                .and_then(|v| v.as_str())
                .map(str::to_string),
        })),
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

/// An API error as a condition message: a 404 on the whole resource means
/// its CRD is not installed.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => "the API is not installed (no CRD)".into(),
        other => other.to_string(),
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

impl Context {
    fn counted(&self, kind: &str, verb: &str) {
        if let Some(m) = &self.metrics {
            m.write(kind, verb);
        }
    }

    /// Applies `desired` unless the index shows the object is already it;
    /// an object the index cannot vouch for is read once and compared.
    async fn ensure<K>(&self, index: &Index, mut desired: K) -> Result<(), Error>
    where
        K: Owned
            + Resource<Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        drift::stamp(&mut desired);
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let name = desired.meta().name.clone().unwrap_or_default();
        let wanted = drift::desired_hash(&desired);
        if index.is_current(&ns, &name, &wanted) {
            return Ok(());
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let must_apply = match index.get(&ns, &name) {
            None => true,
            Some(seen) if seen.desired.as_deref() != Some(wanted.as_str()) => true,
            // Changed since last verified, by someone: look before writing.
            Some(_) => match api.get_opt(&name).await? {
                None => true,
                Some(live) if drift::needs_apply(&desired, Some(&live)) => true,
                Some(live) => {
                    index.verified(&live, &wanted);
                    false
                }
            },
        };
        if !must_apply {
            return Ok(());
        }
        let applied = api
            .patch(&name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        index.verified(&applied, &wanted);
        self.counted(&K::kind(&()), "apply");
        tracing::debug!(kind = %K::kind(&()), namespace = %ns, %name, "applied");
        Ok(())
    }

    /// Deletes an object of ours the index still shows.
    async fn remove<K>(&self, index: &Index, ns: &str, name: &str) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        if index.get(ns, name).is_none() {
            return Ok(());
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                self.counted(&K::kind(&()), "delete");
                tracing::info!(kind = %K::kind(&()), namespace = %ns, %name, "deleted: its component is disabled");
                Ok(())
            }
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The control-plane policy lives outside the watched objects: read,
    /// compared and applied like the rest.
    async fn ensure_read<K>(&self, mut desired: K) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Serialize
            + DeserializeOwned
            + std::fmt::Debug,
    {
        drift::stamp(&mut desired);
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let name = desired.meta().name.clone().unwrap_or_default();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let current = api.get_opt(&name).await?;
        if !drift::needs_apply(&desired, current.as_ref()) {
            return Ok(());
        }
        api.patch(&name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        self.counted(&K::kind(&()), "apply");
        Ok(())
    }
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

/// One pass over one Infra, wrapped in the finalizer.
pub async fn reconcile(infra: Arc<Infra>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
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
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Finalizer(other.to_string()),
    });
    if let Some(m) = &ctx.metrics {
        let label = match &result {
            Ok(_) if valid => "ok",
            Ok(_) => "invalid",
            Err(_) => "error",
        };
        m.reconciled(
            CONTROLLER,
            started.elapsed().as_secs_f64(),
            label,
            result.as_ref().err().map(Error::metric_label),
        );
    }
    result
}

async fn cleanup(infra: &Infra, ctx: &Context) -> Result<Action, Error> {
    let owner = owner_of(infra)?;
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
        match api
            .delete(&policy.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => ctx.counted("NetworkPolicy", "delete"),
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(infra = %owner.name, namespace = %owner.namespace, "cleaned up; owned objects go by garbage collection");
    Ok(Action::await_change())
}

fn owner_of(infra: &Infra) -> Result<Owner, Error> {
    Ok(Owner {
        name: infra.name_any(),
        namespace: infra.namespace().ok_or(Error::NoNamespace)?,
        uid: infra.metadata.uid.clone().unwrap_or_default(),
    })
}

/// The action, and whether the spec was valid.
async fn apply_infra(infra: &Infra, ctx: &Context) -> Result<(Action, bool), Error> {
    if !ctx.indexes.ready() {
        // Right after start: an object not listed yet would be applied
        // again for nothing.
        return Ok((Action::requeue(Duration::from_secs(1)), true));
    }
    let owner = owner_of(infra)?;
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
    let plan = match hc {
        Ok(facts) => validate::validate(&infra.spec, &ns, facts.as_ref(), &lookup),
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
        };
        write_status(ctx, infra, &observed).await?;
        return Ok((Action::requeue(Duration::from_secs(30)), true));
    }

    // Render, and apply what differs.
    let rendered = render::render(&plan, &owner, &ctx.settings);
    let states = apply_rendered(ctx, &owner, rendered).await?;

    let observed = Observed {
        valid: Ok(()),
        network_attachment: Some(Ok(())),
        warnings: plan.warnings.clone(),
        components: states,
    };
    write_status(ctx, infra, &observed).await?;
    // Owned objects are watched, so changes come as events; this is the
    // backstop for anything missed, and it writes nothing when all is well.
    Ok((Action::requeue(Duration::from_secs(300)), true))
}

async fn apply_rendered(
    ctx: &Context,
    owner: &Owner,
    rendered: Rendered,
) -> Result<Vec<(Component, ComponentState)>, Error> {
    let s = &ctx.indexes;
    let Rendered {
        service_account,
        components,
        admin_policy,
        control_plane_policy,
    } = rendered;
    let shared = async {
        ctx.ensure(&s.service_accounts, service_account).await?;
        ctx.ensure(&s.network_policies, admin_policy).await?;
        if let Some(policy) = control_plane_policy {
            let target = policy.metadata.namespace.clone().unwrap_or_default();
            match ctx.ensure_read(policy).await {
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
    let component = |c: Component| {
        let objects = components.iter().find(|o| o.component == c).cloned();
        component_state(ctx, owner, c, objects)
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
        (Component::Dhcp, dhcp),
        (Component::Dns, dns),
        (Component::Proxy, proxy),
    ])
}

/// One component's objects applied, config first, or removed when it is
/// disabled; its state as the workload's status shows it.
async fn component_state(
    ctx: &Context,
    owner: &Owner,
    component: Component,
    objects: Option<ComponentObjects>,
) -> Result<ComponentState, Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let name = render::object_name(owner, component);
    let Some(objects) = objects else {
        ctx.remove::<ConfigMap>(
            &s.config_maps,
            ns,
            &render::config_map_name(owner, component),
        )
        .await?;
        match component {
            Component::Dhcp => {
                ctx.remove::<StatefulSet>(&s.stateful_sets, ns, &name)
                    .await?
            }
            _ => ctx.remove::<Deployment>(&s.deployments, ns, &name).await?,
        }
        if component == Component::Dns {
            ctx.remove::<Service>(&s.services, ns, &name).await?;
        }
        return Ok(ComponentState::Disabled);
    };
    ctx.ensure(&s.config_maps, objects.config).await?;
    if let Some(service) = objects.service {
        ctx.ensure(&s.services, service).await?;
    }
    let facts = match objects.workload {
        Workload::StatefulSet(set) => {
            ctx.ensure(&s.stateful_sets, set).await?;
            s.stateful_sets.get(ns, &name).and_then(|w| w.workload)
        }
        Workload::Deployment(d) => {
            ctx.ensure(&s.deployments, d).await?;
            s.deployments.get(ns, &name).and_then(|w| w.workload)
        }
    };
    Ok(workload_state(facts, component))
}

async fn write_status(ctx: &Context, infra: &Infra, observed: &Observed) -> Result<(), Error> {
    let ns = infra.namespace().ok_or(Error::NoNamespace)?;
    let previous = infra.status.clone().unwrap_or_default();
    let conditions = status::conditions(
        &previous.conditions,
        observed,
        infra.metadata.generation,
        &Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let ready = |c: Component| {
        observed
            .components
            .iter()
            .any(|(k, s)| *k == c && *s == ComponentState::Ready)
    };
    let next = InfraStatus {
        conditions,
        observed_generation: infra.metadata.generation,
        component_status: Some(ComponentStatus {
            dhcp_ready: ready(Component::Dhcp),
            dns_ready: ready(Component::Dns),
            proxy_ready: ready(Component::Proxy),
        }),
    };
    if next == previous {
        return Ok(());
    }
    let was_ready = is_ready(&previous);
    let now_ready = is_ready(&next);
    let api: Api<Infra> = Api::namespaced(ctx.client.clone(), &ns);
    let body = serde_json::json!({
        "apiVersion": Infra::api_version(&()),
        "kind": Infra::kind(&()),
        "status": next,
    });
    api.patch_status(&infra.name_any(), &apply_params(), &Patch::Apply(&body))
        .await?;
    ctx.counted("Infra", "apply-status");
    if was_ready != now_ready {
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
        publish(ctx, infra, type_, reason, note).await;
    }
    Ok(())
}

fn is_ready(s: &InfraStatus) -> bool {
    s.conditions
        .iter()
        .any(|c| c.type_ == status::READY && c.status == "True")
}

async fn publish(ctx: &Context, infra: &Infra, type_: EventType, reason: &str, note: String) {
    publish_event(
        ctx.recorder.as_ref(),
        &infra.object_ref(&()),
        type_,
        reason,
        note,
    )
    .await;
}

/// An event about `about`, when there is a recorder; a failure to publish
/// is logged, never an error of the reconcile.
pub(crate) async fn publish_event(
    recorder: Option<&Recorder>,
    about: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish_related_event(recorder, about, None, type_, reason, note).await;
}

/// An event about `about` concerning `related` as well: events with a
/// different `related` object are kept apart rather than counted as a
/// series of one.
pub(crate) async fn publish_related_event(
    recorder: Option<&Recorder>,
    about: &k8s_openapi::api::core::v1::ObjectReference,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let Some(recorder) = recorder else {
        return;
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: related,
    };
    if let Err(e) = recorder.publish(&event, about).await {
        tracing::warn!(error = %e, "could not publish an event");
    }
}

fn error_policy(infra: Arc<Infra>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(infra = %infra.name_any(), namespace = ?infra.namespace(), %error, "reconcile failed; retrying in 15 s");
    Action::requeue(Duration::from_secs(15))
}

/// Which namespaces one controller watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }
}

/// A watch over our objects of one kind: the index it feeds, and the
/// stream of slimmed objects (names and owners only) that triggers the
/// owners' reconciles.
fn owned<K>(
    api: Api<K>,
) -> (
    Index,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Owned + Clone + Default + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let config = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let index = Index::default();
    let feed = index.clone();
    let stream = watcher(api, config)
        .map_ok(move |event| {
            feed.observe(&event);
            event.modify(|obj| *obj = slim(obj))
        })
        .default_backoff()
        .touched_objects();
    (index, stream)
}

/// Only what the controller needs to map an object to its owner.
fn slim<K: Resource + Default>(obj: &K) -> K {
    let mut out = K::default();
    let meta = out.meta_mut();
    meta.name = obj.meta().name.clone();
    meta.namespace = obj.meta().namespace.clone();
    meta.owner_references = obj.meta().owner_references.clone();
    out
}

/// A reflector whose store keeps objects without their managedFields,
/// which nothing here reads and which are often the larger part of an
/// object applied by several managers.
pub(crate) fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .reflect(writer)
        .default_backoff()
        .touched_objects();
    (reader, stream)
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
pub async fn run(
    client: Client,
    scope: Scope,
    settings: Settings,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (config_maps, cm_stream) = owned(scope.api::<ConfigMap>(&client));
    let (deployments, deploy_stream) = owned(scope.api::<Deployment>(&client));
    let (stateful_sets, sts_stream) = owned(scope.api::<StatefulSet>(&client));
    let (service_accounts, sa_stream) = owned(scope.api::<ServiceAccount>(&client));
    let (services, svc_stream) = owned(scope.api::<Service>(&client));
    let (network_policies, np_stream) = owned(scope.api::<NetworkPolicy>(&client));
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings,
        indexes: Indexes {
            config_maps,
            deployments,
            stateful_sets,
            service_accounts,
            services,
            network_policies,
        },
        recorder,
        metrics,
    });
    let (infras, infra_stream) = cached(scope.api::<Infra>(&client), watcher::Config::default());
    let controller = Controller::for_stream(infra_stream, infras.clone());
    // Any Service an Infra names as its internal proxy: its ClusterIP is
    // rendered into the DNS config, so a new or replaced Service re-renders.
    let named_services = watcher(scope.api::<Service>(&client), watcher::Config::default())
        .default_backoff()
        .touched_objects();
    controller
        .owns_stream(cm_stream)
        .owns_stream(deploy_stream)
        .owns_stream(sts_stream)
        .owns_stream(sa_stream)
        .owns_stream(svc_stream)
        .owns_stream(np_stream)
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
