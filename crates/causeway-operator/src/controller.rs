//! The Infra controller: observe (the Infra, its HostedCluster, its
//! NetworkAttachmentDefinition, what it owns), render with the pure
//! functions, apply with server-side apply, report status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde_json::json;

use crate::crd::{ComponentStatus, Infra, InfraStatus};
use crate::render::{self, Component, Owner, Workload};
use crate::status::{self, ComponentState, Observed};
use crate::validate::{self, HostedClusterFacts};

/// The field manager of every server-side apply.
pub const MANAGER: &str = "causeway-operator";
const CONTROLLER: &str = "infra";

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("the Infra has no namespace")]
    NoNamespace,
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    seconds: HistogramVec,
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
        };
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.seconds.clone()))?;
        Ok(m)
    }
}

pub struct Context {
    pub client: Client,
    /// The image the data-plane pods run.
    pub image: String,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
}

fn nad_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"),
        "network-attachment-definitions",
    )
}

pub fn hosted_cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("hypershift.openshift.io", "v1beta1", "HostedCluster"),
        "hostedclusters",
    )
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// What a referenced HostedCluster says, or why it could not be read.
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
            "hostedClusterRef: reading HostedCluster {hc_ns}/{}: {e}",
            r.name
        )),
    }
}

async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(&name, &apply_params(), &Patch::Apply(obj)).await
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(name, "deleted: its component is disabled");
            Ok(())
        }
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

fn ready_replicas(w: &Workload) -> i32 {
    match w {
        Workload::StatefulSet(s) => s
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0),
        Workload::Deployment(d) => d
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0),
    }
}

/// One pass over one Infra.
pub async fn reconcile(infra: Arc<Infra>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let result = reconcile_inner(&infra, &ctx).await;
    if let Some(m) = &ctx.metrics {
        m.seconds
            .with_label_values(&[CONTROLLER])
            .observe(started.elapsed().as_secs_f64());
        let label = match &result {
            Ok((_, true)) => "ok",
            Ok((_, false)) => "invalid",
            Err(_) => "error",
        };
        m.reconciles.with_label_values(&[CONTROLLER, label]).inc();
    }
    result.map(|(action, _)| action)
}

/// The action, and whether the spec was valid.
async fn reconcile_inner(infra: &Infra, ctx: &Context) -> Result<(Action, bool), ReconcileError> {
    let ns = infra.namespace().ok_or(ReconcileError::NoNamespace)?;
    let name = infra.name_any();
    let client = &ctx.client;
    let owner = Owner {
        name: name.clone(),
        namespace: ns.clone(),
        uid: infra.metadata.uid.clone().unwrap_or_default(),
    };

    // Observe.
    let hc = hosted_cluster(client, infra, &ns).await;
    let plan = match hc {
        Ok(facts) => validate::validate(&infra.spec, &ns, facts.as_ref()),
        Err(why) => Err(vec![why]),
    };
    let plan = match plan {
        Ok(plan) => {
            let nads: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &plan.nad_namespace, &nad_resource());
            match nads.get_opt(&plan.nad_name).await? {
                Some(_) => Ok(plan),
                None => Err(vec![format!(
                    "networkConfig.networkAttachmentDefinition: NetworkAttachmentDefinition {}/{} not found",
                    plan.nad_namespace, plan.nad_name
                )]),
            }
        }
        Err(e) => Err(e),
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(errors) => {
            // Nothing is changed while the spec is invalid: what runs keeps
            // running. Checked again on the next change or in a minute
            // (a missing NAD may appear).
            tracing::warn!(infra = %name, namespace = %ns, errors = ?errors, "invalid Infra");
            let observed = Observed {
                valid: Err(errors.clone()),
                warnings: Vec::new(),
                components: Vec::new(),
            };
            write_status(ctx, infra, &observed, None).await?;
            return Ok((Action::requeue(Duration::from_secs(60)), false));
        }
    };

    // Render and apply.
    let rendered = render::render(&plan, &owner, &ctx.image, infra.spec.resources.as_ref());
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    apply(&sas, &rendered.service_account).await?;
    let mut states = Vec::new();
    for component in Component::ALL {
        let Some(objects) = rendered
            .components
            .iter()
            .find(|c| c.component == component)
        else {
            delete_if_present(&cms, &render::config_map_name(&owner, component)).await?;
            let workload = render::object_name(&owner, component);
            match component {
                Component::Dhcp => delete_if_present(&sets, &workload).await?,
                _ => delete_if_present(&deploys, &workload).await?,
            }
            states.push((component, ComponentState::Disabled));
            continue;
        };
        apply(&cms, &objects.config).await?;
        let live = match &objects.workload {
            Workload::StatefulSet(s) => Workload::StatefulSet(apply(&sets, s).await?),
            Workload::Deployment(d) => Workload::Deployment(apply(&deploys, d).await?),
        };
        let ready = ready_replicas(&live);
        states.push((
            component,
            if ready >= 1 {
                ComponentState::Ready
            } else {
                ComponentState::NotReady(format!("0 of 1 {} pods ready", component.name()))
            },
        ));
    }

    let observed = Observed {
        valid: Ok(()),
        warnings: plan.warnings.clone(),
        components: states,
    };
    write_status(ctx, infra, &observed, Some(&observed.components)).await?;
    // Owned objects are watched, so changes come as events; this is the
    // backstop for anything missed.
    Ok((Action::requeue(Duration::from_secs(300)), true))
}

async fn write_status(
    ctx: &Context,
    infra: &Infra,
    observed: &Observed,
    components: Option<&[(Component, ComponentState)]>,
) -> Result<(), ReconcileError> {
    let ns = infra.namespace().ok_or(ReconcileError::NoNamespace)?;
    let previous = infra.status.clone().unwrap_or_default();
    let conditions = status::conditions(
        &previous.conditions,
        observed,
        infra.metadata.generation,
        &Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let ready = |c: Component| {
        components.is_some_and(|all| {
            all.iter()
                .any(|(k, s)| *k == c && *s == ComponentState::Ready)
        })
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
    let was_ready = is_ready(&previous);
    let now_ready = is_ready(&next);
    if next == previous {
        return Ok(());
    }
    let api: Api<Infra> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(
        &infra.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": next })),
    )
    .await?;
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
    let Some(recorder) = &ctx.recorder else {
        return;
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &infra.object_ref(&())).await {
        tracing::warn!(error = %e, "could not publish an event");
    }
}

fn error_policy(infra: Arc<Infra>, error: &ReconcileError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(infra = %infra.name_any(), %error, "reconcile failed; retrying in 15 s");
    Action::requeue(Duration::from_secs(15))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    image: String,
    metrics: OperatorMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        image,
        recorder: Some(recorder),
        metrics: Some(metrics),
    });
    let infras: Api<Infra> = Api::all(client.clone());
    let config = watcher::Config::default();
    Controller::new(infras, config.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), config.clone())
        .owns(Api::<Deployment>::all(client.clone()), config.clone())
        .owns(Api::<StatefulSet>::all(client.clone()), config.clone())
        .owns(Api::<ServiceAccount>::all(client), config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(infra = %obj.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "controller"),
            }
        })
        .await;
}
