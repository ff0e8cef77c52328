//! The InfraClusterAttachment controller: it reports, on each attachment,
//! whether its Infra serves it and why not ([`attachment::aggregate`], the
//! decision the Infra controller renders from), and its finalizer removes
//! what the attachment caused outside its Infra's namespace: the policy in
//! its control-plane namespace that lets the proxy in.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{finalizer, Event as Finalize};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::apps_ingress::{self, HostedClients};
use super::attachment::{
    self, ExternalServiceSpec, InfraClusterAttachment, InfraClusterAttachmentStatus, Lineage,
    Verdict, GO_OPERATOR_FINALIZER, INFRA_NOT_FOUND, INVALID_CONFIGURATION,
};
use super::plan::{Component, EXTERNAL_PROXY_PORT};
use crate::hosted::HostedEndpoint;
use crate::k8s::MANAGED_BY;

/// MetalLB's annotation choosing the pool a LoadBalancer's address comes
/// from.
pub const METALLB_POOL_ANNOTATION: &str = "metallb.universe.tf/address-pool";
use super::controller::infras_of_namespace;
use super::crd::Infra;
use super::observe::attachments_of;
use super::plan::Owner;
use super::render;
use crate::error::Error;
use crate::k8s::apply::{Applier, Noise, OnMissing};
use crate::k8s::conditions::{self, condition};
use crate::k8s::finalizer as finalizers;
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::machine_resource;
use crate::k8s::watch::{
    cached, cached_optional, once_served, touched, Everywhere, OptionalKind, Scope,
};

/// Removes the attachment's control-plane policy before it goes.
pub const FINALIZER: &str = "causeway.io/attachment-cleanup";
const CONTROLLER: &str = "infraclusterattachment";
pub const READY: &str = "Ready";
/// Whether every worker address it lists is routed by source.
pub const WORKERS_ROUTED: &str = "WorkersRouted";

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub metrics: Option<OperatorMetrics>,
    pub attachments: Store<InfraClusterAttachment>,
    pub infras: Store<Infra>,
    /// Cluster API Machines, whose addresses add to the workers.
    pub machines: Everywhere,
    /// How hosted clusters' API servers are reached, for apps ingress.
    pub endpoint: HostedEndpoint,
    pub hosted: HostedClients,
    /// Wakes an attachment when its hosted cluster's objects change.
    pub wake: futures::channel::mpsc::UnboundedSender<ObjectRef<InfraClusterAttachment>>,
    /// How long a deleted attachment waits for an unreachable hosted
    /// cluster before its hosted objects are left behind (and said so).
    pub hosted_cleanup_timeout: Duration,
    pub recorder: Option<kube::runtime::events::Recorder>,
}

/// [`Context::hosted_cleanup_timeout`] by default.
pub const HOSTED_CLEANUP_TIMEOUT: Duration = Duration::from_secs(600);
/// The Go operator's policy in a control-plane namespace, which its
/// finalizer removed; it has no owner, so nothing else would.
pub const GO_OPERATOR_POLICY: &str = "allow-infrastructure";
/// The condition saying a deletion waits for the hosted cluster.
pub const HOSTED_CLEANUP: &str = "HostedCleanup";

fn ready(store_ready: impl std::future::Future<Output = Result<(), impl std::fmt::Debug>>) -> bool {
    matches!(store_ready.now_or_never(), Some(Ok(())))
}

pub async fn reconcile(
    att: Arc<InfraClusterAttachment>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let timer = ReconcileTimer::start(ctx.metrics.as_ref(), CONTROLLER);
    let ns = att.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<InfraClusterAttachment> = Api::namespaced(ctx.client.clone(), &ns);
    if att.metadata.deletion_timestamp.is_some() && Lineage::of(&att) == Lineage::GoOperator {
        let result = release_go_finalizer(&api, &att, &ctx).await;
        timer.finish(&result, true);
        return result;
    }
    let result = finalizer(&api, FINALIZER, att, |event| async {
        match event {
            Finalize::Apply(att) => report(&att, &ctx).await,
            Finalize::Cleanup(att) => cleanup(&att, &ctx).await,
        }
    })
    .await
    .map_err(finalizers::from_kube);
    timer.finish(&result, true);
    result
}

/// A deleted attachment the Go operator managed: the cleanup its finalizer
/// stood for (the hosted apps ingress objects, its policy and causeway's),
/// then the finalizer released. Causeway's own finalizer, if there, is
/// released on the next pass, whose cleanup finds nothing left.
async fn release_go_finalizer(
    api: &Api<InfraClusterAttachment>,
    att: &InfraClusterAttachment,
    ctx: &Context,
) -> Result<Action, Error> {
    cleanup(att, ctx).await?;
    let name = att.name_any();
    let finalizers = att.finalizers();
    let Some(at) = finalizers.iter().position(|f| f == GO_OPERATOR_FINALIZER) else {
        return Ok(Action::await_change());
    };
    // The test keeps a concurrent change to the list from being undone.
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{at}"), "value": GO_OPERATOR_FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{at}")},
    ]))
    .map_err(|e| Error::Input(format!("finalizer patch: {e}")))?;
    api.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Json::<()>(patch),
    )
    .await?;
    tracing::info!(attachment = %name, namespace = ?att.namespace(), finalizer = GO_OPERATOR_FINALIZER, "released the Go operator's finalizer after its cleanup");
    Ok(Action::await_change())
}

fn infra_of(ctx: &Context, att: &InfraClusterAttachment) -> Option<Arc<Infra>> {
    let ns = att.namespace()?;
    ctx.infras
        .get(&ObjectRef::new(&att.spec.infra_ref.name).within(&ns))
}

/// The status the attachment's verdict gives.
pub fn status_of(
    att: &InfraClusterAttachment,
    infra: Option<&Infra>,
    verdict: Option<&Verdict>,
    served: Option<&attachment::Candidate>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> InfraClusterAttachmentStatus {
    let prev = att
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let generation = att.metadata.generation;
    let cidr = infra.and_then(|i| i.spec.network_config.cidr.trim().parse().ok());
    let read = attachment::candidate(&att.name_any(), &att.spec, cidr);
    let (ok, reason, message) = match (infra, verdict) {
        (None, _) => (
            false,
            INFRA_NOT_FOUND,
            format!(
                "Infra {:?} not found in this namespace",
                att.spec.infra_ref.name
            ),
        ),
        (Some(_), Some(Verdict::Served { .. })) => (
            true,
            "ReconciliationSucceeded",
            "served by the Infra's shared DHCP, DNS and proxy".to_string(),
        ),
        (Some(_), Some(Verdict::Excluded { reason, message })) => (false, *reason, message.clone()),
        (Some(_), Some(Verdict::Invalid(errors))) => {
            (false, INVALID_CONFIGURATION, errors.join("; "))
        }
        (Some(_), None) => (
            false,
            "Pending",
            "not yet seen by the Infra's aggregation".to_string(),
        ),
    };
    let mut out = vec![condition(
        &prev, READY, ok, reason, message, generation, now,
    )];
    if let Some(Verdict::Served { dropped }) = verdict {
        out.push(if dropped.is_empty() {
            condition(
                &prev,
                WORKERS_ROUTED,
                true,
                "Routed",
                "every worker address is routed to this cluster".into(),
                generation,
                now,
            )
        } else {
            condition(
                &prev,
                WORKERS_ROUTED,
                false,
                attachment::DUPLICATE_SOURCE_IP,
                dropped
                    .iter()
                    .map(|(net, other)| {
                        format!("worker {net} is claimed by attachment {other:?} too, so routed for neither")
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
                generation,
                now,
            )
        });
    }
    InfraClusterAttachmentStatus {
        conditions: out,
        observed_generation: generation,
        domain: read.as_ref().ok().map(|c| c.domain()),
        control_plane_namespace: read
            .as_ref()
            .ok()
            .map(|c| c.control_plane_namespace.clone()),
        routed_workers: served
            .map(|c| c.workers.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        apps_ingress_status: None,
    }
}

/// The name of an attachment's external Service.
pub fn external_service_name(attachment: &str) -> String {
    format!("{attachment}-proxy-external")
}

/// An attachment's external Service: a LoadBalancer in the Infra's
/// namespace, owned by the attachment, selecting the Infra's proxy pods and
/// exposing their port 443 routes (on the pod network's
/// [`EXTERNAL_PROXY_PORT`]) and nothing else.
pub fn external_service(
    att: &InfraClusterAttachment,
    spec: &ExternalServiceSpec,
) -> Result<Service, Error> {
    let ns = att.namespace().ok_or(Error::NoNamespace)?;
    let infra = Owner {
        name: att.spec.infra_ref.name.clone(),
        namespace: ns.clone(),
        uid: String::new(),
    };
    let own = Owner::of(att)?;
    let mut labels = spec.labels.clone();
    labels.insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    labels.insert("app.kubernetes.io/name".into(), "causeway".into());
    labels.insert("app.kubernetes.io/instance".into(), infra.name.clone());
    let mut annotations = spec.annotations.clone();
    // Set last: the pool named in the spec is the one used.
    if let Some(pool) = spec
        .address_pool_name
        .as_deref()
        .filter(|p| !p.trim().is_empty())
    {
        annotations.insert(METALLB_POOL_ANNOTATION.into(), pool.trim().into());
    }
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(external_service_name(&own.name)),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![own.controller_reference(
                "hostedcluster.densityops.com/v1alpha1",
                "InfraClusterAttachment",
            )]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(render::selector_labels(&infra, Component::Proxy)),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: 443,
                target_port: Some(IntOrString::Int(EXTERNAL_PROXY_PORT)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    })
}

/// Makes or removes the attachment's external Service: there while the
/// attachment is served, asks for one, and its Infra runs a proxy.
async fn reconcile_external_service(
    ctx: &Context,
    att: &InfraClusterAttachment,
    infra: Option<&Infra>,
    served: bool,
) -> Result<(), Error> {
    let ns = att.namespace().ok_or(Error::NoNamespace)?;
    let wanted = att
        .spec
        .external_service
        .as_ref()
        .filter(|e| e.enabled)
        .filter(|_| served)
        .filter(|_| infra.is_some_and(|i| i.spec.infra_components.proxy_enabled().is_some()));
    match wanted {
        Some(spec) => ctx.applier.ensure_live(external_service(att, spec)?).await,
        None => {
            let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
            let name = external_service_name(&att.name_any());
            if api.get_opt(&name).await?.is_some() {
                ctx.applier.gone_from(&api, "Service", &name).await?;
            }
            Ok(())
        }
    }
}

async fn report(att: &InfraClusterAttachment, ctx: &Context) -> Result<Action, Error> {
    if !ready(ctx.attachments.wait_until_ready()) || !ready(ctx.infras.wait_until_ready()) {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let name = att.name_any();
    let infra = infra_of(ctx, att);
    let aggregate = infra
        .as_deref()
        .map(|i| attachments_of(&ctx.attachments, &ctx.machines, i));
    let verdict = aggregate.as_ref().and_then(|a| a.verdicts.get(&name));
    let served = aggregate
        .as_ref()
        .and_then(|a| a.served.iter().find(|c| c.name == name));
    let previous = att.status.clone().unwrap_or_default();
    let mut next = status_of(att, infra.as_deref(), verdict, served, &conditions::now());
    // The transition times come from the previous conditions; a status
    // otherwise the same is not written again.
    conditions::keep_transitions(&previous.conditions, &mut next.conditions);
    reconcile_external_service(ctx, att, infra.as_deref(), served.is_some()).await?;
    let apps = reconcile_apps(ctx, att, served.is_some()).await;
    if let Some(a) = apps.as_ref().filter(|a| a.phase != apps_ingress::READY) {
        // Apps ingress not there yet: the attachment is not ready, as
        // *.apps does not work, whatever else is served.
        if let Some(ready) = next.conditions.iter_mut().find(|c| c.type_ == READY) {
            if ready.status == "True" {
                *ready = condition(
                    &previous.conditions,
                    READY,
                    false,
                    &a.reason,
                    a.message.clone(),
                    att.metadata.generation,
                    &conditions::now(),
                );
            }
        }
    }
    // MetalLB's kinds appearing, or a failure clearing, are not watched
    // in the hosted cluster (that would take reading its CRDs): looked at
    // again soon. Nodes and the router Service wake it as they change.
    let again = match apps.as_ref().map(|a| a.reason.as_str()) {
        None | Some("ReconciliationSucceeded") => Duration::from_secs(300),
        Some("WaitingForHostedClusterNodes" | "WaitingForExternalIP") => Duration::from_secs(300),
        Some(_) => Duration::from_secs(10),
    };
    // A change of apps ingress phase or reason is an event too (a hosted
    // API that went away, or came back, shows in `kubectl get events`).
    let was = previous
        .apps_ingress_status
        .as_ref()
        .map(|a| (a.phase.clone(), a.reason.clone()));
    if let Some(a) = apps
        .as_ref()
        .filter(|a| was.as_ref() != Some(&(a.phase.clone(), a.reason.clone())))
    {
        let type_ = if a.phase == apps_ingress::DEGRADED {
            kube::runtime::events::EventType::Warning
        } else {
            kube::runtime::events::EventType::Normal
        };
        // The status's own reason (events of one reason are one series,
        // whose note is the first one's), and one for every way of being
        // ready.
        let reason = if a.phase == apps_ingress::READY {
            "AppsIngressReady"
        } else {
            a.reason.as_str()
        };
        crate::k8s::events::publish_about(
            ctx.recorder.as_ref(),
            att,
            type_,
            reason,
            format!("apps ingress {}: {}", a.phase, a.message),
        )
        .await;
    }
    next.apps_ingress_status = apps;
    let ns = att.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<InfraClusterAttachment> = Api::namespaced(ctx.client.clone(), &ns);
    let mut previous = previous;
    if previous.apps_ingress_status.is_some() && next.apps_ingress_status.is_none() {
        // An apply leaving the field out does not clear every part of it
        // (the API server refused the remains as incomplete): cleared
        // explicitly.
        ctx.applier
            .patch_status(
                &api,
                "InfraClusterAttachment",
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    serde_json::json!({"status": {"appsIngressStatus": null}}),
                ),
            )
            .await?;
        previous.apps_ingress_status = None;
    }
    ctx.applier
        .apply_status(&api, &name, &previous, &next, &next, OnMissing::Skip)
        .await?;
    Ok(Action::requeue(again))
}

/// Apps ingress for a served attachment that enables it; for one that no
/// longer does, what it made in the hosted cluster is removed (kept in the
/// status until it is).
async fn reconcile_apps(
    ctx: &Context,
    att: &InfraClusterAttachment,
    served: bool,
) -> Option<attachment::AppsIngressStatus> {
    let h = apps_ingress::Hosted {
        management: &ctx.client,
        endpoint: ctx.endpoint,
        clients: &ctx.hosted,
        wake: ctx.wake.clone(),
    };
    let spec = att.spec.apps_ingress.as_ref().filter(|a| a.enabled);
    if let (Some(spec), true) = (spec, served) {
        return Some(apps_ingress::reconcile(&h, att, spec).await);
    }
    let applied = att
        .status
        .as_ref()
        .and_then(|s| s.apps_ingress_status.as_ref())
        .and_then(|s| s.applied.clone())?;
    match apps_ingress::cleanup(&h, att, &applied).await {
        apps_ingress::Cleanup::Done | apps_ingress::Cleanup::ClusterGone => None,
        apps_ingress::Cleanup::Blocked(why) => Some(apps_ingress::status(
            apps_ingress::DEGRADED,
            "CleanupBlocked",
            format!("apps ingress is off, but what it made in the hosted cluster could not be removed yet: {why}"),
            Some(applied),
        )),
    }
}

/// Removes the proxy's policy from the attachment's control-plane
/// namespace, unless another attachment the same Infra serves still needs
/// it there.
async fn cleanup(att: &InfraClusterAttachment, ctx: &Context) -> Result<Action, Error> {
    let name = att.name_any();
    let ns = att.namespace().ok_or(Error::NoNamespace)?;
    let lineage = Lineage::of(att);
    // The hosted cluster first: while it cannot be reached, the deletion
    // waits (and says so), up to a timeout after which what is there is
    // left behind, with a warning naming it. An attachment the Go operator
    // made, deleted before causeway recorded what it took over, has what
    // the Go operator's cleanup would have removed: the objects its spec
    // names.
    let recorded = att
        .status
        .as_ref()
        .and_then(|s| s.apps_ingress_status.as_ref())
        .and_then(|s| s.applied.clone());
    let go_made = || {
        let spec = att.spec.apps_ingress.as_ref().filter(|a| a.enabled)?;
        let p = apps_ingress::plan(spec, lineage).ok()?;
        Some(p.applied(p.install))
    };
    let applied = match lineage {
        Lineage::GoOperator => recorded.or_else(go_made),
        Lineage::Causeway => recorded,
    };
    if let Some(applied) = applied {
        let h = apps_ingress::Hosted {
            management: &ctx.client,
            endpoint: ctx.endpoint,
            clients: &ctx.hosted,
            wake: ctx.wake.clone(),
        };
        if let apps_ingress::Cleanup::Blocked(why) = apps_ingress::cleanup(&h, att, &applied).await
        {
            let waited = att
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| {
                    let now = k8s_openapi::jiff::Timestamp::now();
                    Duration::from_secs(
                        now.as_second().saturating_sub(t.0.as_second()).max(0) as u64
                    )
                })
                .unwrap_or_default();
            if waited < ctx.hosted_cleanup_timeout {
                let previous = att.status.clone().unwrap_or_default();
                let mut next = previous.clone();
                next.conditions.retain(|c| c.type_ != HOSTED_CLEANUP);
                next.conditions.push(condition(
                    &previous.conditions,
                    HOSTED_CLEANUP,
                    false,
                    "HostedClusterUnreachable",
                    format!("waiting up to {} s for the hosted cluster to remove the apps ingress objects: {why}", ctx.hosted_cleanup_timeout.as_secs()),
                    att.metadata.generation,
                    &conditions::now(),
                ));
                let api: Api<InfraClusterAttachment> = Api::namespaced(ctx.client.clone(), &ns);
                ctx.applier
                    .apply_status(&api, &name, &previous, &next, &next, OnMissing::Skip)
                    .await?;
                return Err(Error::Input(format!(
                    "attachment {ns}/{name}: hosted cleanup blocked: {why}"
                )));
            }
            tracing::warn!(attachment = %name, namespace = %ns, service = %applied.service_name, pool = %applied.address_pool_name, %why, "hosted cluster unreachable past the cleanup timeout: its apps ingress objects are left behind");
        }
    }
    let Ok(own) = attachment::candidate(&name, &att.spec, None) else {
        return Ok(Action::await_change());
    };
    if lineage == Lineage::GoOperator {
        let policies: Api<NetworkPolicy> =
            Api::namespaced(ctx.client.clone(), &own.control_plane_namespace);
        ctx.applier
            .gone_from(&policies, "NetworkPolicy", GO_OPERATOR_POLICY)
            .await?;
    }
    let infra_name = &att.spec.infra_ref.name;
    let still_needed = infra_of(ctx, att).is_some_and(|infra| {
        attachments_of(&ctx.attachments, &ctx.machines, &infra)
            .served
            .iter()
            .any(|c| c.name != name && c.control_plane_namespace == own.control_plane_namespace)
    });
    if !still_needed {
        let owner = Owner {
            name: infra_name.clone(),
            namespace: ns.clone(),
            uid: String::new(),
        };
        let policies: Api<NetworkPolicy> =
            Api::namespaced(ctx.client.clone(), &own.control_plane_namespace);
        ctx.applier
            .gone_from(
                &policies,
                "NetworkPolicy",
                &render::control_plane_policy_name(&owner),
            )
            .await?;
    }
    tracing::info!(attachment = %name, namespace = %ns, "attachment cleaned up");
    Ok(Action::await_change())
}

fn error_policy(att: Arc<InfraClusterAttachment>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(attachment = %att.name_any(), namespace = ?att.namespace(), %error, "reconcile failed; retrying in 15 s");
    Action::requeue(Duration::from_secs(15))
}

/// How the attachment controller reaches hosted clusters.
#[derive(Debug, Clone, Copy)]
pub struct HostedAccess {
    pub endpoint: HostedEndpoint,
    /// [`Context::hosted_cleanup_timeout`].
    pub cleanup_timeout: Duration,
}

/// Runs the attachment controller over `scope` until `shutdown` resolves.
/// `all_scopes` are every scope the operator works in: Machines are
/// watched in all of them.
pub async fn run(
    client: Client,
    scope: Scope,
    all_scopes: Vec<Scope>,
    hosted: HostedAccess,
    recorder: Option<kube::runtime::events::Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let HostedAccess {
        endpoint,
        cleanup_timeout: hosted_cleanup_timeout,
    } = hosted;
    if let Some(m) = &metrics {
        m.controller_started(CONTROLLER);
    }
    let kind = OptionalKind::of(
        &kube::core::ApiResource::erase::<InfraClusterAttachment>(&()),
        "no attachment is reconciled",
    );
    let (attachments, att_stream) = cached_optional(
        &client,
        scope.api::<InfraClusterAttachment>(&client),
        kind.clone(),
        watcher::Config::default(),
    );
    let attachments = attachments.store().clone();
    let (infras, infra_stream) = cached(scope.api::<Infra>(&client), watcher::Config::default());
    let (machines, machine_stream) = Everywhere::watch(
        &client,
        &all_scopes,
        &machine_resource(),
        "attachments' worker addresses come from their Infra's spec only",
    );
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let ctx = Arc::new(Context {
        client: client.clone(),
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Debug),
        metrics,
        attachments: attachments.clone(),
        infras,
        machines,
        endpoint,
        hosted: HostedClients::default(),
        wake,
        hosted_cleanup_timeout,
        recorder,
    });
    let siblings = attachments.clone();
    let of_infra = attachments.clone();
    let of_namespace = attachments.clone();
    // A sibling's change (a conflict made or settled) changes this one's
    // verdict: every attachment of the same Infra is looked at again.
    let sibling_api = scope.api::<InfraClusterAttachment>(&client);
    let sibling_events = once_served(client.clone(), kind, Default::default(), move || {
        touched(sibling_api, watcher::Config::default())
    });
    Controller::for_stream(att_stream, attachments)
        .watches_stream(sibling_events, move |changed: InfraClusterAttachment| {
            let ns = changed.namespace().unwrap_or_default();
            let infra = changed.spec.infra_ref.name.clone();
            siblings
                .state()
                .into_iter()
                .filter(|a| {
                    a.namespace().as_deref() == Some(ns.as_str())
                        && a.spec.infra_ref.name == infra
                        && a.name_any() != changed.name_any()
                })
                .map(|a| ObjectRef::from_obj(&*a))
                .collect::<Vec<_>>()
        })
        // An Infra coming, going or changing its CIDR changes every
        // verdict over its attachments.
        .watches_stream(infra_stream, move |infra: Infra| {
            let ns = infra.namespace().unwrap_or_default();
            let name = infra.name_any();
            of_infra
                .state()
                .into_iter()
                .filter(|a| {
                    a.namespace().as_deref() == Some(ns.as_str()) && a.spec.infra_ref.name == name
                })
                .map(|a| ObjectRef::from_obj(&*a))
                .collect::<Vec<_>>()
        })
        // A Machine's addresses change the workers of the attachments whose
        // control plane is in its namespace, and so their siblings'.
        .watches_stream_with(
            machine_stream,
            move |m: DynamicObject| {
                let ns = m.metadata.namespace.clone().unwrap_or_default();
                let infras = infras_of_namespace(&of_namespace, &ns);
                of_namespace
                    .state()
                    .into_iter()
                    .filter(|a| {
                        infras.iter().any(|i| {
                            i.name == a.spec.infra_ref.name
                                && i.namespace.as_deref() == a.namespace().as_deref()
                        })
                    })
                    .map(|a| ObjectRef::from_obj(&*a))
                    .collect::<Vec<_>>()
            },
            machine_resource(),
        )
        // A hosted cluster's Node or router Service changed.
        .reconcile_on(woken)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "attachment controller");
            }
        })
        .await;
}
