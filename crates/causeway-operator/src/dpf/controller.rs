//! The DPF bridge's controller. Per reconcile of one provisioner:
//! - observe: the provisioner and the settings singleton from reflector
//!   stores; the DPUCluster, the Secrets, the HostedCluster and NodePool,
//!   the MetalLB objects, read live;
//! - decide: [`spec`], [`render`] and [`status`], pure;
//! - apply: server-side apply under the operator's field manager, only
//!   where the live object differs from the rendering ([`drift`]), so
//!   drift is undone and a steady state writes nothing; status by apply
//!   on `/status`, only when it changed.
//!
//! Nothing is applied while a check fails: a HostedCluster is never half
//! made from a bad spec. A finalizer deletes, in order, the injected
//! kubeconfig (and the DPUCluster's reference to it), the NodePool, the
//! HostedCluster, the Secret copies and the MetalLB objects.
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::context::Context;
use super::crd::{DPFHCPProvisioner, DPFHCPProvisionerConfig, LocalRef};
use super::execute::apply;
use super::render;
use super::teardown::delete;
use crate::error::Error;
use crate::k8s::apply::{Applier, Noise};
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::{
    dpf_operator_config_resource, dpu_cluster_resource, dpu_flavor_resource,
    hosted_cluster_resource, node_pool_resource,
};
use crate::k8s::watch::{cached, cached_optional, once_served, touched, OptionalKind, Scope};

const CONTROLLER: &str = "dpfhcp";
const RECONCILE_CONCURRENCY: u16 = 16;
/// One reconcile, with its metrics.
pub async fn reconcile(p: Arc<DPFHCPProvisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.configs.ready() {
        // The settings object not listed yet: the defaults might be the
        // opposite of what it says (MetalLB on where it is disabled).
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let timer = ReconcileTimer::start(ctx.metrics.as_ref(), CONTROLLER);
    let result = if p.metadata.deletion_timestamp.is_some() {
        delete(&p, &ctx).await
    } else {
        apply(&p, &ctx).await
    };
    // The bridge reports an invalid spec through its conditions, not as a
    // reconcile result: every pass that did not fail counts as ok.
    timer.finish(&result, true);
    result
}

fn error_policy(p: Arc<DPFHCPProvisioner>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), %error, "reconcile failed; retrying in 15 s");
    Action::requeue(Duration::from_secs(15))
}

/// The provisioners a Secret's change concerns: those naming it, and the
/// one whose admin kubeconfig (or its copy) it is.
fn secret_owners(
    store: &Store<DPFHCPProvisioner>,
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<DPFHCPProvisioner>> {
    let ns = secret.namespace().unwrap_or_default();
    let name = secret.name_any();
    let labels = secret.labels();
    store
        .state()
        .into_iter()
        .filter(|p| {
            let p_ns = p.namespace().unwrap_or_default();
            let names = |r: &Option<LocalRef>| r.as_ref().is_some_and(|r| r.name == name);
            (p_ns == ns
                && (names(&p.spec.ssh_key_secret_ref)
                    || names(&p.spec.pull_secret_ref)
                    || name == format!("{}-admin-kubeconfig", p.name_any())))
                || (labels.get(render::NAME_LABEL) == Some(&p.name_any())
                    && labels.get(render::NAMESPACE_LABEL) == Some(&p_ns))
        })
        .map(|p| ObjectRef::from_obj(&*p))
        .collect()
}

fn owner_ref_of(meta: &PartialObjectMeta<DynamicObject>) -> Option<ObjectRef<DPFHCPProvisioner>> {
    let ns = meta.namespace()?;
    meta.owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "DPFHCPProvisioner")
        .map(|r| ObjectRef::new(&r.name).within(&ns))
}

/// Runs the bridge over `scope` until `shutdown` resolves.
pub async fn run(
    client: Client,
    scope: Scope,
    operator_namespace: String,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    if let Some(m) = &metrics {
        m.controller_started(CONTROLLER);
    }
    // The bridge's own CRDs may be applied after the operator started
    // (`causeway operator crd dpfhcpprovisioner`): watched once served.
    let (provisioners, provisioner_stream) = cached_optional(
        &client,
        scope.api::<DPFHCPProvisioner>(&client),
        OptionalKind::of(
            &ApiResource::erase::<DPFHCPProvisioner>(&()),
            "the DPF bridge has nothing to do",
        ),
        watcher::Config::default(),
    );
    let provisioners = provisioners.store().clone();
    let (configs, config_stream) = cached_optional(
        &client,
        Api::<DPFHCPProvisionerConfig>::all(client.clone()),
        OptionalKind::of(
            &ApiResource::erase::<DPFHCPProvisionerConfig>(&()),
            "provisioners use the built-in settings",
        ),
        watcher::Config::default(),
    );
    let (blue_field_images, images_stream) = cached(
        Api::<ConfigMap>::namespaced(client.clone(), &operator_namespace),
        watcher::Config::default().fields(&format!(
            "metadata.name={}",
            super::bluefield::IMAGES_CONFIGMAP
        )),
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Info),
        provisioners: provisioners.clone(),
        configs,
        blue_field_images,
        blue_field: super::bluefield::Resolver::shared(),
        ignition_checked: Default::default(),
        operator_namespace,
        last_config: std::sync::Mutex::new(None),
        recorder,
        metrics,
    });
    // HyperShift's and DPF's kinds may be installed after the operator:
    // each is watched once served, and the reconciles report what is
    // missing meanwhile.
    let foreign = |resource: ApiResource, all: bool, labelled: bool, meanwhile: &'static str| {
        let api: Api<PartialObjectMeta<DynamicObject>> = match (&scope, all) {
            (Scope::Namespace(ns), false) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        let config = if labelled {
            watcher::Config::default().labels(render::NAME_LABEL)
        } else {
            watcher::Config::default()
        };
        once_served(
            client.clone(),
            OptionalKind::of(&resource, meanwhile),
            Default::default(),
            move || touched(api, config),
        )
    };
    let hosted_clusters = foreign(
        hosted_cluster_resource(),
        false,
        true,
        "provisioners report that HyperShift is not installed",
    );
    let node_pools = foreign(
        node_pool_resource(),
        false,
        true,
        "provisioners report that HyperShift is not installed",
    );
    // DPUClusters may live in any namespace.
    let dpu_clusters = foreign(
        dpu_cluster_resource(),
        true,
        false,
        "provisioners report their DPUCluster missing",
    );
    // A DPUFlavor's content and the DPFOperatorConfig's MTU go into the
    // boot template: an edit makes it again at once rather than at the
    // next resync.
    let dpu_flavors = foreign(
        dpu_flavor_resource(),
        true,
        false,
        "no DPU boot template is made",
    );
    let operator_configs = foreign(
        dpf_operator_config_resource(),
        true,
        false,
        "no DPU boot template is made",
    );
    let secrets = touched(
        scope.api::<PartialObjectMeta<Secret>>(&client),
        watcher::Config::default(),
    );
    let all = provisioners.clone();
    let every = provisioners.clone();
    let by_template = provisioners.clone();
    // The bfcfg templates, wherever their DPUClusters are: one deleted or
    // edited is made again at once.
    let templates = touched(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        watcher::Config::default().labels(&format!("{}=true", super::ignition::TEMPLATE_LABEL)),
    );
    let by_dpu = provisioners.clone();
    let by_flavor = provisioners.clone();
    let by_operator_config = provisioners.clone();
    let by_secret = provisioners.clone();
    Controller::for_stream(provisioner_stream, provisioners)
        .watches_stream(config_stream, move |_c: DPFHCPProvisionerConfig| {
            all.state().iter().map(|p| ObjectRef::from_obj(&**p)).collect::<Vec<_>>()
        })
        .watches_stream(images_stream, move |_c: ConfigMap| {
            every.state().iter().map(|p| ObjectRef::from_obj(&**p)).collect::<Vec<_>>()
        })
        .watches_stream(templates, move |m: PartialObjectMeta<ConfigMap>| {
            let ns = m.namespace().unwrap_or_default();
            let name = m.name_any();
            by_template
                .state()
                .into_iter()
                .filter(|p| {
                    p.spec.dpu_cluster_ref.namespace == ns
                        && super::ignition::configmap_name(&p.spec.dpu_cluster_ref.name) == name
                })
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .watches_stream_with(hosted_clusters, |m| owner_ref_of(&m), hosted_cluster_resource())
        .watches_stream_with(node_pools, |m| owner_ref_of(&m), node_pool_resource())
        .watches_stream_with(
            dpu_clusters, move |m: PartialObjectMeta<DynamicObject>| {
            let ns = m.namespace().unwrap_or_default();
            let name = m.name_any();
            by_dpu
                .state()
                .into_iter()
                .filter(|p| p.spec.dpu_cluster_ref.namespace == ns && p.spec.dpu_cluster_ref.name == name)
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
            },
            dpu_cluster_resource(),
        )
        .watches_stream_with(
            dpu_flavors,
            move |m: PartialObjectMeta<DynamicObject>| {
                // The flavor's name is in the DPUDeployment, which the
                // store does not hold: every provisioner whose DPUDeployment
                // is in the flavor's namespace looks again.
                let ns = m.namespace().unwrap_or_default();
                by_flavor
                    .state()
                    .into_iter()
                    .filter(|p| p.spec.dpu_deployment_ref.as_ref().is_some_and(|r| r.namespace == ns))
                    .map(|p| ObjectRef::from_obj(&*p))
                    .collect::<Vec<_>>()
            },
            dpu_flavor_resource(),
        )
        .watches_stream_with(
            operator_configs,
            move |_m: PartialObjectMeta<DynamicObject>| {
                by_operator_config.state().iter().map(|p| ObjectRef::from_obj(&**p)).collect::<Vec<_>>()
            },
            dpf_operator_config_resource(),
        )
        .watches_stream(secrets, move |s: PartialObjectMeta<Secret>| secret_owners(&by_secret, &s))
        .with_config(kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(provisioner = %obj.name, namespace = ?obj.namespace, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "dpf controller"),
            }
        })
        .await;
}
