//! The DPUServiceTemplates a DPF DPUDeployment names: `ovn`,
//! `doca-telemetry-service` and `hbn`, kept in every namespace that holds
//! the DPUCluster of a live provisioner, while the settings object says
//! `manageDPUServiceTemplates: true`.
//!
//! One reconcile per DPU cluster namespace:
//! - management off, or no settings object: nothing is touched (turning
//!   the flag off never deletes);
//! - a provisioner that is not being deleted names a DPUCluster there: the
//!   three templates are applied ([`values`] renders them, pure);
//! - otherwise the templates there labelled as ours are deleted.
//!
//! Ownership is the label [`values::MANAGED_LABEL`] alone: a template of
//! one of the three names without it is someone else's, logged, counted
//! and left as it is. Errors are retried with a growing delay.
//!
//! Everything a reconcile decides on is read live (provisioners, the
//! settings object, DPFOperatorConfig, the DaemonSet, ClusterVersion), so a
//! decision to delete is never taken on a cache not yet filled; the watches
//! only say which namespaces to look at.

pub mod payload;
pub mod values;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::crd::{DPFHCPProvisioner, DPFHCPProvisionerConfig, CONFIG_NAME};
use crate::error::Error;
use crate::k8s::apply::{get_present, not_found, Applier, Noise};
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::{
    cluster_version_resource, dpf_operator_config_resource, dpu_service_template_resource,
};
use crate::k8s::watch::{once_served, touched, OptionalKind, Scope};
use crate::registry::{Credentials, Registry};
use values::{NamespacePlan, OvnInputs, OvnPlan, Ownership, Rollout, Values};

const CONTROLLER: &str = "dpuservicetemplate";
/// The overrides ConfigMap, in the operator's namespace.
pub const OVERRIDES_CONFIGMAP: &str = "dpuservicetemplate-overrides";
/// The host-side OVN DaemonSet whose image and rollout the `ovn` template
/// follows.
pub const OVN_NAMESPACE: &str = "openshift-ovn-kubernetes";
pub const OVN_DAEMONSET: &str = "ovnkube-node-dpu-host";
pub const OVN_CONTAINER: &str = "ovnkube-controller";
/// The cluster's pull secret, whose credentials read the release payload.
pub const PULL_SECRET_NAMESPACE: &str = "openshift-config";
pub const PULL_SECRET: &str = "pull-secret";
/// The backstop resync of every known namespace.
const RESYNC: Duration = Duration::from_secs(600);
const FIRST_RETRY: Duration = Duration::from_secs(5);
const LAST_RETRY: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    /// Where provisioners are looked for.
    pub scopes: Vec<Scope>,
    pub operator_namespace: String,
    pub registry: Registry,
    pub metrics: Option<OperatorMetrics>,
    /// The unmanaged templates already reported at warning level.
    pub reported: std::sync::Mutex<BTreeSet<String>>,
}

impl Context {
    fn outcome(&self, template: &str, outcome: &str) {
        if let Some(m) = &self.metrics {
            m.template_outcome(template, outcome);
        }
    }
}

fn input(e: impl std::fmt::Display) -> Error {
    Error::Input(e.to_string())
}

/// Whether a provisioner that is not being deleted uses `namespace` for
/// its DPUCluster.
async fn live_provisioner_in(ctx: &Context, namespace: &str) -> Result<bool, Error> {
    for scope in &ctx.scopes {
        let api: Api<DPFHCPProvisioner> = scope.api(&ctx.client);
        let found = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|p| {
                p.spec.dpu_cluster_ref.namespace == namespace
                    && p.metadata.deletion_timestamp.is_none()
            });
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One reconcile of a DPU cluster namespace, with its metrics.
pub async fn reconcile(namespace: &str, ctx: &Context) -> Result<(), Error> {
    let timer = ReconcileTimer::start(ctx.metrics.as_ref(), CONTROLLER);
    let result = reconcile_inner(namespace, ctx).await;
    timer.finish(&result, true);
    result
}

async fn reconcile_inner(namespace: &str, ctx: &Context) -> Result<(), Error> {
    let config = Api::<DPFHCPProvisionerConfig>::all(ctx.client.clone())
        .get_opt(CONFIG_NAME)
        .await?;
    let manage = config
        .as_ref()
        .map(|c| c.spec.manage_dpu_service_templates.unwrap_or(false));
    if manage != Some(true) {
        return Ok(());
    }
    let live = live_provisioner_in(ctx, namespace).await?;
    match values::namespace_plan(manage, live) {
        NamespacePlan::Idle => Ok(()),
        NamespacePlan::Prune => prune(namespace, ctx).await,
        NamespacePlan::Ensure => {
            let pull_secret = config.and_then(|c| c.spec.dpu_services_image_pull_secret);
            ensure(namespace, ctx, pull_secret.as_deref()).await
        }
    }
}

fn templates(ctx: &Context, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &dpu_service_template_resource(),
    )
}

/// Deletes the templates labelled as ours in `namespace`.
async fn prune(namespace: &str, ctx: &Context) -> Result<(), Error> {
    let api = templates(ctx, namespace);
    let selector = format!("{}=true", values::MANAGED_LABEL);
    let list = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l,
        // DPF not installed: there is nothing of ours.
        Err(e) if not_found(&e) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for t in list.items {
        let name = t.name_any();
        if !ctx.applier.gone_from(&api, values::KIND, &name).await? {
            tracing::info!(%namespace, template = %name, "DPUServiceTemplate deleted: no provisioner uses this DPU cluster namespace");
            ctx.outcome(&name, "deleted");
        }
    }
    Ok(())
}

/// The DPF version's `major.minor`, from the one DPFOperatorConfig.
async fn dpf_version(ctx: &Context) -> Result<String, Error> {
    let api: Api<DynamicObject> =
        Api::all_with(ctx.client.clone(), &dpf_operator_config_resource());
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| match e {
            e if not_found(&e) => input("no DPFOperatorConfig API: is DPF installed?"),
            e => e.into(),
        })?;
    let config = match list.items.as_slice() {
        [one] => one,
        [] => return Err(input("no DPFOperatorConfig found: is DPF installed?")),
        more => {
            return Err(input(format!(
                "{} DPFOperatorConfigs found; DPF runs with exactly one",
                more.len()
            )))
        }
    };
    values::dpf_major_minor(config.data["status"]["version"].as_str()).map_err(input)
}

/// The overrides ConfigMap's rows, when it exists.
async fn overrides(ctx: &Context) -> Result<Option<BTreeMap<String, values::Row>>, Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.operator_namespace);
    let Some(cm) = api.get_opt(OVERRIDES_CONFIGMAP).await? else {
        return Ok(None);
    };
    let name = format!("{}/{OVERRIDES_CONFIGMAP}", ctx.operator_namespace);
    match cm.data.as_ref().and_then(|d| d.get(values::OVERRIDES_KEY)) {
        Some(text) => values::parse_overrides(text, &name)
            .map(Some)
            .map_err(input),
        None => Err(input(format!(
            "ConfigMap {name} has no key {}",
            values::OVERRIDES_KEY
        ))),
    }
}

async fn ensure(namespace: &str, ctx: &Context, pull_secret: Option<&str>) -> Result<(), Error> {
    let version = dpf_version(ctx).await?;
    let overrides = overrides(ctx).await?;
    let table = values::table().map_err(input)?;
    let v = values::resolve(&table, overrides.as_ref(), &version).map_err(input)?;
    let api = templates(ctx, namespace);
    put(
        ctx,
        &api,
        values::DTS,
        values::dts(namespace, &v, pull_secret),
    )
    .await?;
    put(
        ctx,
        &api,
        values::HBN,
        values::hbn(namespace, &v, pull_secret),
    )
    .await?;
    ensure_ovn(namespace, ctx, &api, &v).await
}

/// Applies one template unless a template of that name is someone else's.
async fn put(
    ctx: &Context,
    api: &Api<DynamicObject>,
    name: &str,
    desired: Value,
) -> Result<(), Error> {
    let live = get_present(api, name).await?;
    let live_json = live.as_ref().map(serde_json::to_value).transpose();
    let live_json = live_json.map_err(|e| Error::Render(e.to_string()))?;
    if values::ownership(live_json.as_ref()) == Ownership::Foreign {
        skip_foreign(ctx, api, name);
        return Ok(());
    }
    let wanted: DynamicObject =
        serde_json::from_value(desired.clone()).map_err(|e| Error::Render(e.to_string()))?;
    let before = live.as_ref().and_then(|l| l.resource_version());
    let applied = ctx
        .applier
        .ensure_dynamic(&dpu_service_template_resource(), wanted, live)
        .await?;
    let replaced = drop_foreign_spec_fields(ctx, api, name, &applied, &desired).await?;
    let changed = replaced || before.is_none() || applied.resource_version() != before;
    ctx.outcome(name, if changed { "applied" } else { "unchanged" });
    Ok(())
}

/// The template's `spec` is ours whole: fields another writer added inside
/// it, which an apply leaves alone, are removed. Only fields some manager
/// owns are looked at, so what the server defaults stays.
async fn drop_foreign_spec_fields(
    ctx: &Context,
    api: &Api<DynamicObject>,
    name: &str,
    live: &DynamicObject,
    desired: &Value,
) -> Result<bool, Error> {
    let managed = live.metadata.managed_fields.as_deref().unwrap_or_default();
    let extra = crate::k8s::drift::foreign_fields(managed, crate::k8s::MANAGER, "spec", desired);
    if extra.is_empty() {
        return Ok(false);
    }
    let ops: Vec<Value> = extra
        .iter()
        .map(|path| serde_json::json!({"op": "remove", "path": path}))
        .collect();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| Error::Render(e.to_string()))?;
    let params = kube::api::PatchParams {
        field_manager: Some(crate::k8s::MANAGER.into()),
        ..Default::default()
    };
    ctx.applier
        .patch(
            api,
            values::KIND,
            name,
            &params,
            &kube::api::Patch::Json::<()>(patch),
        )
        .await?;
    tracing::info!(
        namespace = api.namespace().unwrap_or_default(),
        template = %name,
        removed = ?extra,
        "DPUServiceTemplate spec: fields another writer added removed"
    );
    Ok(true)
}

/// Says once per template (at warning level; later passes at debug) that
/// it is someone else's, and counts every pass that skips it.
fn skip_foreign(ctx: &Context, api: &Api<DynamicObject>, name: &str) {
    let namespace = api.namespace().unwrap_or_default();
    let first = ctx
        .reported
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(format!("{namespace}/{name}"));
    let message = "a DPUServiceTemplate of this name exists without the managed label: it is left alone and never adopted; label it dpfhcpprovisioner.dpu.hcp.io/managed=true or delete it to let the operator keep it";
    if first {
        tracing::warn!(%namespace, template = %name, "{message}");
    } else {
        tracing::debug!(%namespace, template = %name, "{message}");
    }
    ctx.outcome(name, "skipped_unmanaged");
}

/// The host OVN DaemonSet's `ovnkube-controller` image and its rollout.
async fn host_ovn(ctx: &Context) -> Result<(String, Rollout), Error> {
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), OVN_NAMESPACE);
    let ds = api.get_opt(OVN_DAEMONSET).await?.ok_or_else(|| {
        input(format!(
            "DaemonSet {OVN_NAMESPACE}/{OVN_DAEMONSET} not found: the ovn DPUServiceTemplate follows its {OVN_CONTAINER} image (is the cluster's OVN in DPU-host mode?)"
        ))
    })?;
    let image = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == OVN_CONTAINER))
        .and_then(|c| c.image.clone())
        .ok_or_else(|| {
            input(format!(
                "DaemonSet {OVN_NAMESPACE}/{OVN_DAEMONSET} has no container {OVN_CONTAINER} with an image"
            ))
        })?;
    let status = ds.status.unwrap_or_default();
    let rollout = Rollout {
        generation: ds.metadata.generation.unwrap_or_default(),
        observed_generation: status.observed_generation.unwrap_or_default(),
        desired: status.desired_number_scheduled,
        updated: status.updated_number_scheduled.unwrap_or_default(),
        available: status.number_available.unwrap_or_default(),
    };
    Ok((image, rollout))
}

/// ClusterVersion `version`'s `status.desired.{version,image}`.
async fn desired_release(ctx: &Context) -> Result<(String, String), Error> {
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &cluster_version_resource());
    let cv = get_present(&api, "version")
        .await?
        .ok_or_else(|| input("ClusterVersion version not found"))?;
    let desired = &cv.data["status"]["desired"];
    match (desired["version"].as_str(), desired["image"].as_str()) {
        (Some(v), Some(i)) if !v.is_empty() && !i.is_empty() => Ok((v.to_string(), i.to_string())),
        _ => Err(input(
            "ClusterVersion version has no status.desired.version and image yet",
        )),
    }
}

async fn pull_credentials(ctx: &Context) -> Result<Credentials, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), PULL_SECRET_NAMESPACE);
    let secret = api.get_opt(PULL_SECRET).await?.ok_or_else(|| {
        input(format!(
            "Secret {PULL_SECRET_NAMESPACE}/{PULL_SECRET} not found"
        ))
    })?;
    let json = secret
        .data
        .as_ref()
        .and_then(|d| d.get(".dockerconfigjson"))
        .ok_or_else(|| {
            input(format!(
                "Secret {PULL_SECRET_NAMESPACE}/{PULL_SECRET} has no .dockerconfigjson"
            ))
        })?;
    Ok(Credentials::from_docker_config(&json.0))
}

async fn ensure_ovn(
    namespace: &str,
    ctx: &Context,
    api: &Api<DynamicObject>,
    v: &Values,
) -> Result<(), Error> {
    let live = get_present(api, values::OVN).await?;
    let live = live
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| Error::Render(e.to_string()))?;
    if values::ownership(live.as_ref()) == Ownership::Foreign {
        skip_foreign(ctx, api, values::OVN);
        return Ok(());
    }
    let (source, rollout) = host_ovn(ctx).await?;
    let plan = values::ovn_plan(live.as_ref(), &source, &rollout);
    if plan == OvnPlan::Gated {
        tracing::info!(%namespace, ?rollout, "the host OVN DaemonSet is rolling out: the ovn DPUServiceTemplate waits for it to finish");
        ctx.outcome(values::OVN, "gated_rollout");
        return Ok(());
    }
    let (ocp_version, release_image) = desired_release(ctx).await?;
    let (image, daemonset_version) = match plan {
        OvnPlan::Keep {
            image,
            daemonset_version,
        } => (image, daemonset_version),
        _ => {
            let release = values::aarch64_release(&release_image, &ocp_version).map_err(input)?;
            let creds = pull_credentials(ctx).await?;
            let found =
                payload::image_in_release(&ctx.registry, &release, payload::OVN_TAG, &creds)
                    .await
                    .map_err(|e| Error::Registry(e.to_string()))?;
            tracing::info!(%namespace, %release, image = %found, host_image = %source, "DPU OVN image read from the release payload");
            (
                values::chart_image(&found).map_err(input)?,
                values::ovn_daemonset_version(&ocp_version).to_string(),
            )
        }
    };
    let inputs = OvnInputs {
        image,
        daemonset_version,
        ocp_version,
        source_x86_image: source,
    };
    put(ctx, api, values::OVN, values::ovn(namespace, v, &inputs)).await
}

/// What a watch event asks for.
enum Wake {
    Namespace(String),
    /// Every namespace known to need a look.
    All,
}

fn meta_wakes<K>(
    stream: impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    what: &'static str,
    map: impl Fn(K) -> Wake + Send + 'static,
) -> BoxStream<'static, Wake>
where
    K: Send + 'static,
{
    stream
        .filter_map(move |r| {
            let wake = match r {
                Ok(obj) => Some(map(obj)),
                Err(e) => {
                    tracing::debug!(error = %e, watch = what, "DPUServiceTemplate controller watch");
                    None
                }
            };
            futures::future::ready(wake)
        })
        .boxed()
}

/// Runs the controller until `shutdown` resolves. `scopes` are where
/// provisioners are (one controller serves them all).
pub async fn run(
    client: Client,
    scopes: Vec<Scope>,
    operator_namespace: String,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    if let Some(m) = &metrics {
        m.controller_started(CONTROLLER);
    }
    let mut wakes: Vec<BoxStream<'static, Wake>> = Vec::new();
    // The bridge's own kinds may be applied after the operator started:
    // each is watched once served.
    let provisioner_kind = ApiResource::erase::<DPFHCPProvisioner>(&());
    for scope in &scopes {
        let api: Api<DPFHCPProvisioner> = scope.api(&client);
        let stream = once_served(
            client.clone(),
            OptionalKind::of(&provisioner_kind, "no DPUServiceTemplate is written"),
            Default::default(),
            move || touched(api, watcher::Config::default()),
        );
        wakes.push(meta_wakes(
            stream,
            "provisioners",
            |p: DPFHCPProvisioner| Wake::Namespace(p.spec.dpu_cluster_ref.namespace),
        ));
    }
    let configs_api = Api::<DPFHCPProvisionerConfig>::all(client.clone());
    let configs = once_served(
        client.clone(),
        OptionalKind::of(
            &ApiResource::erase::<DPFHCPProvisionerConfig>(&()),
            "the built-in settings decide whether templates are kept",
        ),
        Default::default(),
        move || touched(configs_api, watcher::Config::default()),
    );
    wakes.push(meta_wakes(configs, "settings", |_| Wake::All));
    // DPF's version picks the values: an upgrade of DPF is seen at once.
    let dpf_configs_api = Api::<PartialObjectMeta<DynamicObject>>::all_with(
        client.clone(),
        &dpf_operator_config_resource(),
    );
    let dpf_configs = once_served(
        client.clone(),
        OptionalKind::of(
            &dpf_operator_config_resource(),
            "service templates wait for DPF's version",
        ),
        Default::default(),
        move || touched(dpf_configs_api, watcher::Config::default()),
    );
    wakes.push(meta_wakes(dpf_configs, "DPFOperatorConfig", |_| Wake::All));
    // Status changes (the rollout's progress) are what the gate waits on:
    // the full object is watched, not its metadata.
    let daemonset = touched(
        Api::<DaemonSet>::namespaced(client.clone(), OVN_NAMESPACE),
        watcher::Config::default().fields(&format!("metadata.name={OVN_DAEMONSET}")),
    );
    wakes.push(meta_wakes(daemonset, "OVN DaemonSet", |_| Wake::All));
    let overrides = touched(
        Api::<PartialObjectMeta<ConfigMap>>::namespaced(client.clone(), &operator_namespace),
        watcher::Config::default().fields(&format!("metadata.name={OVERRIDES_CONFIGMAP}")),
    );
    wakes.push(meta_wakes(overrides, "overrides", |_| Wake::All));
    let templates_api = Api::<PartialObjectMeta<DynamicObject>>::all_with(
        client.clone(),
        &dpu_service_template_resource(),
    );
    let templates = once_served(
        client.clone(),
        OptionalKind::of(
            &dpu_service_template_resource(),
            "no DPUServiceTemplate is written",
        ),
        Default::default(),
        move || touched(templates_api, watcher::Config::default()),
    );
    wakes.push(meta_wakes(
        templates,
        "DPUServiceTemplates",
        |t: PartialObjectMeta<DynamicObject>| Wake::Namespace(t.namespace().unwrap_or_default()),
    ));
    let ctx = std::sync::Arc::new(Context {
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Info),
        client,
        scopes,
        operator_namespace,
        registry: Registry::new(),
        metrics,
        reported: Default::default(),
    });
    drive(futures::stream::select_all(wakes), ctx, shutdown).await;
}

/// The work queue: each namespace reconciled by one task at a time, asked
/// again when it was woken meanwhile; failures come back after a delay
/// that doubles up to [`LAST_RETRY`].
async fn drive(
    mut wakes: impl futures::Stream<Item = Wake> + Unpin,
    ctx: std::sync::Arc<Context>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut running: BTreeSet<String> = BTreeSet::new();
    let mut failures: HashMap<String, u32> = HashMap::new();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(String, bool)>();
    let (retry_tx, mut retry_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut tasks = tokio::task::JoinSet::new();
    let mut resync = tokio::time::interval(RESYNC);
    resync.tick().await;
    tokio::pin!(shutdown);
    loop {
        let ready: Vec<String> = pending.difference(&running).cloned().collect();
        for ns in ready {
            pending.remove(&ns);
            running.insert(ns.clone());
            let ctx = ctx.clone();
            let done = done_tx.clone();
            tasks.spawn(async move {
                let ok = match reconcile(&ns, &ctx).await {
                    Ok(()) => true,
                    Err(error) => {
                        tracing::warn!(namespace = %ns, %error, "DPUServiceTemplates: reconcile failed");
                        false
                    }
                };
                let _ = done.send((ns, ok));
            });
        }
        tokio::select! {
            _ = &mut shutdown => break,
            wake = wakes.next() => match wake {
                Some(Wake::Namespace(ns)) => {
                    if !ns.is_empty() {
                        known.insert(ns.clone());
                        pending.insert(ns);
                    }
                }
                Some(Wake::All) => pending.extend(known.iter().cloned()),
                None => break,
            },
            Some((ns, ok)) = done_rx.recv() => {
                running.remove(&ns);
                if ok {
                    failures.remove(&ns);
                } else {
                    let n = failures.entry(ns.clone()).or_insert(0);
                    let delay = FIRST_RETRY.saturating_mul(1u32 << (*n).min(6)).min(LAST_RETRY);
                    *n += 1;
                    let retry = retry_tx.clone();
                    tasks.spawn(async move {
                        tokio::time::sleep(delay).await;
                        let _ = retry.send(ns);
                    });
                }
            }
            Some(ns) = retry_rx.recv() => { pending.insert(ns); }
            _ = resync.tick() => pending.extend(known.iter().cloned()),
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tasks.shutdown().await;
}
