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
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

use super::crd::{
    BridgeSettings, DPFHCPProvisioner, DPFHCPProvisionerConfig, DPFHCPProvisionerConfigSpec,
    DPFHCPProvisionerStatus, HostedClusterReference, LocalRef, CONFIG_NAME,
};
use super::render::{self, Owner};
use super::spec::{self, Publishing};
use super::status::{self, Check, Cleanup, HostedClusterFacts, Observed};
use crate::error::Error;
use crate::k8s::apply::{
    apply_params, get_present, installed, not_found, permanent, Applier, Noise, OnMissing,
};
use crate::k8s::conditions;
use crate::k8s::events::publish_about;
use crate::k8s::finalizer as finalizers;
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::{
    dpu_cluster_resource, dpu_deployment_resource, hosted_cluster_resource,
    ip_address_pool_resource, l2_advertisement_resource, node_pool_resource,
};
use crate::k8s::watch::{cached, Scope};

/// The Go operator's finalizer, so provisioners it made are cleaned up the
/// same way after a migration.
pub const FINALIZER: &str = "dpfhcpprovisioner.provisioning.dpu.hcp.io/finalizer";
const CONTROLLER: &str = "dpfhcp";
const RECONCILE_CONCURRENCY: u16 = 16;
/// Polls while something outside the operator's watches is awaited
/// (MetalLB or HyperShift being installed, a deletion finishing).
const SHORT_POLL: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_secs(30);
/// How long the settings of a deleted singleton still hold.
const CONFIG_GRACE: Duration = Duration::from_secs(30);
/// The backstop resync of a provisioner whose state is settled.
const RESYNC: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub provisioners: Store<DPFHCPProvisioner>,
    pub configs: Store<DPFHCPProvisionerConfig>,
    pub operator_namespace: String,
    /// The settings last seen, and when they went: see [`Context::settings`].
    pub last_config: std::sync::Mutex<Option<(DPFHCPProvisionerConfigSpec, Option<Instant>)>>,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
    /// ConfigMap `ocp-bluefield-images` in the operator's namespace.
    pub blue_field_images: Store<ConfigMap>,
    pub blue_field: super::bluefield::Resolver,
    /// Provisioners whose ignition was checked since this process started:
    /// the first check regenerates it (OperatorRestarted), per provisioner.
    pub ignition_checked: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The settings object to use: the live one, else for [`CONFIG_GRACE`]
/// after it went the one last seen. `last` remembers it and when it went.
fn remembered(
    live: Option<DPFHCPProvisionerConfigSpec>,
    last: &mut Option<(DPFHCPProvisionerConfigSpec, Option<Instant>)>,
    now: Instant,
) -> Option<DPFHCPProvisionerConfigSpec> {
    match live {
        Some(spec) => {
            *last = Some((spec.clone(), None));
            Some(spec)
        }
        None => {
            let (spec, gone) = last.as_mut()?;
            let since = *gone.get_or_insert(now);
            (now.duration_since(since) < CONFIG_GRACE).then(|| spec.clone())
        }
    }
}

fn controlled_by(meta: &kube::api::ObjectMeta, uid: &str) -> Option<bool> {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    let controller = refs.iter().find(|r| r.controller == Some(true))?;
    Some(controller.uid == uid)
}

fn labelled_ours(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    let labels = meta.labels.clone().unwrap_or_default();
    labels.get(render::NAME_LABEL) == Some(&owner.name)
        && labels.get(render::NAMESPACE_LABEL) == Some(&owner.namespace)
}

fn to_dynamic(v: Value) -> Result<DynamicObject, Error> {
    serde_json::from_value(v).map_err(|e| Error::Render(e.to_string()))
}

impl Context {
    /// The settings in force. The chart's hook deletes and re-creates the
    /// singleton on every upgrade; for a short while after it goes, the
    /// settings it had still hold, so a `disableMetalLB: true` does not
    /// flip to the default and make MetalLB objects in that moment.
    fn settings(&self) -> BridgeSettings {
        let live = self
            .configs
            .get(&ObjectRef::new(CONFIG_NAME))
            .map(|c| c.spec.clone());
        let mut last = self
            .last_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let config = remembered(live, &mut last, Instant::now());
        BridgeSettings::resolve(config.as_ref(), &self.operator_namespace)
    }
}

/// What the two user Secrets hold, once checked.
struct SecretData {
    pull_secret: Vec<u8>,
    ssh_key: Vec<u8>,
}

fn valid_ssh_key(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let Some(line) = lines.next() else {
        return false;
    };
    let mut words = line.split_whitespace();
    let (Some(kind), Some(body)) = (words.next(), words.next()) else {
        return false;
    };
    let known =
        kind.starts_with("ssh-") || kind.starts_with("ecdsa-sha2-") || kind.starts_with("sk-");
    let base64 = body.len() % 4 == 0
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
    known && base64 && body.len() >= 16
}

/// IgnitionConfigured: the bfcfg template is published and made from what
/// the provisioner says now, or is made again (HyperShift's ignition, the
/// OS image replaced) when it is missing, stale or first seen by this
/// process.
#[allow(clippy::too_many_arguments)]
async fn ignition_check(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    dpu: &DynamicObject,
    facts: &HostedClusterFacts,
    rollout: status::Rollout,
    os_image: Option<String>,
) -> Result<Check, Error> {
    use super::ignition as ign;
    let check = |ok: bool, reason: &str, message: String| {
        Ok(Check::new(status::IGNITION_CONFIGURED, ok, reason, message))
    };
    let Some(os_image) = os_image else {
        return check(false, "MachineOSURLMissing", "no machineOSURL and no BlueField image found for the release: see BlueFieldContainerImageAvailable".into());
    };
    let dpu_ns = dpu.namespace().unwrap_or_default();
    let mut inputs = ign::Inputs {
        dpu_cluster: dpu.name_any(),
        dpu_cluster_namespace: dpu_ns.clone(),
        release_image: p.spec.ocp_release_image.clone(),
        os_image: os_image.clone(),
        ..Default::default()
    };
    if let Some(r) = &p.spec.dpu_deployment_ref {
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &r.namespace, &dpu_deployment_resource());
        match get_present(&api, &r.name).await? {
            Some(d) => {
                let field = |ptr: &str| {
                    d.data
                        .pointer(ptr)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                inputs.bfb = field("/spec/dpus/bfb").map(|b| (b, r.namespace.clone()));
                inputs.flavor = field("/spec/dpus/flavor").map(|f| (f, r.namespace.clone()));
            }
            None => {
                return check(
                    false,
                    "DependencyDeleted",
                    format!("DPUDeployment {}/{} not found", r.namespace, r.name),
                );
            }
        }
    }
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &dpu_ns);
    let name = ign::configmap_name(&inputs.dpu_cluster);
    let published = match cms.get_opt(&name).await {
        Ok(c) => c,
        Err(e) if permanent(&e) => {
            return check(
                false,
                "IgnitionGenerationFailed",
                format!("reading ConfigMap {dpu_ns}/{name}: {e}"),
            );
        }
        Err(e) => return Err(e.into()),
    };
    let uid = p.uid().unwrap_or_default();
    let first = ctx
        .ignition_checked
        .lock()
        .map(|mut seen| seen.insert(uid))
        .unwrap_or(false);
    let failed_before = p.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == status::IGNITION_CONFIGURED && c.reason == "IgnitionGenerationFailed"
        })
    });
    let why = ign::stale(published.as_ref().map(|c| c.annotations()), &inputs)
        .or(first.then_some("OperatorRestarted"))
        .or(failed_before.then_some("IgnitionGenerationFailed"));
    let Some(why) = why else {
        return check(
            true,
            "IgnitionGenerated",
            format!(
                "ConfigMap {dpu_ns}/{name} holds the ignition for {} with OS image {os_image}",
                inputs.release_image
            ),
        );
    };
    // A new release's ignition is served once its control plane is on it.
    if why == "ReleaseImageUpdated" && rollout != status::Rollout::Done {
        return check(
            false,
            why,
            format!(
                "waiting for the control plane to roll out {} before making the ignition again",
                inputs.release_image
            ),
        );
    }
    match generate(ctx, owner, facts, &inputs).await {
        Ok(()) => {
            tracing::info!(provisioner = %owner.name, namespace = %owner.namespace, configmap = %name, why, "DPU ignition published");
            check(true, "IgnitionGenerated", format!("ConfigMap {dpu_ns}/{name} holds the ignition for {} with OS image {os_image} (made again: {why})", inputs.release_image))
        }
        Err(e) => {
            tracing::warn!(provisioner = %owner.name, namespace = %owner.namespace, error = %e, "DPU ignition");
            check(false, "IgnitionGenerationFailed", e)
        }
    }
}

/// Fetches HyperShift's ignition, replaces the OS image and applies the
/// template ConfigMap.
async fn generate(
    ctx: &Context,
    owner: &Owner,
    facts: &HostedClusterFacts,
    inputs: &super::ignition::Inputs,
) -> Result<(), String> {
    let endpoint = facts
        .ignition_endpoint
        .as_deref()
        .ok_or("the HostedCluster reports no ignitionEndpoint yet")?;
    let cp_ns = format!("{}-{}", owner.namespace, owner.name);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &cp_ns);
    let key = |s: &Secret, k: &str| s.data.as_ref().and_then(|d| d.get(k)).map(|b| b.0.clone());
    let ca = secrets
        .get_opt("ignition-server-ca-cert")
        .await
        .map_err(|e| format!("Secret {cp_ns}/ignition-server-ca-cert: {e}"))?
        .and_then(|s| key(&s, "tls.crt"))
        .ok_or(format!(
            "no Secret {cp_ns}/ignition-server-ca-cert with tls.crt"
        ))?;
    let prefix = format!("token-{}-", owner.name);
    let token = secrets
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("Secrets of {cp_ns}: {e}"))?
        .items
        .into_iter()
        .filter(|s| s.name_any().starts_with(&prefix))
        .find_map(|s| key(&s, "token"))
        .ok_or(format!("no Secret {cp_ns}/{prefix}* with a token"))?;
    let ignition = super::ignition::fetch(endpoint, &token, &ca).await?;
    let ignition = super::ignition::override_os_image(&ignition, &inputs.os_image)
        .map_err(|e| e.to_string())?;
    let body = super::ignition::configmap(inputs, &ignition, &owner.labels());
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &inputs.dpu_cluster_namespace);
    cms.patch(
        &super::ignition::configmap_name(&inputs.dpu_cluster),
        &apply_params(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|e| format!("applying the bfcfg ConfigMap: {e}"))?;
    ctx.applier.counted("ConfigMap", "apply");
    Ok(())
}

/// The BlueField OS image for the release: skipped when `machineOSURL`
/// names one.
async fn blue_field_check(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    repository: &str,
    secrets: &SecretData,
) -> (Check, Option<String>) {
    use super::bluefield::{Credentials, Lookup};
    if let Some(url) = p.spec.machine_os_url.as_deref().filter(|u| !u.is_empty()) {
        return (
            Check::new(
                status::BLUEFIELD_IMAGE_FOUND,
                true,
                "LookupSkipped",
                format!("machineOSURL is set: {url}"),
            ),
            None,
        );
    }
    let configured = ctx
        .blue_field_images
        .get(&ObjectRef::new(super::bluefield::IMAGES_CONFIGMAP).within(&ctx.operator_namespace))
        .map(|cm| cm.data.clone().unwrap_or_default());
    let lookup = Lookup {
        release_image: p.spec.ocp_release_image.clone(),
        repository: repository.to_string(),
        configured,
        configmap_namespace: ctx.operator_namespace.clone(),
        credentials: Credentials::from_docker_config(&secrets.pull_secret),
    };
    match ctx.blue_field.resolve(&lookup, None).await {
        Ok(found) => (
            Check::new(
                status::BLUEFIELD_IMAGE_FOUND,
                true,
                "ImageFound",
                format!(
                    "{} for OpenShift {} (from the {})",
                    found.image, found.version, found.source
                ),
            ),
            Some(found.image),
        ),
        Err(e) => (
            Check::new(
                status::BLUEFIELD_IMAGE_FOUND,
                false,
                e.reason(),
                e.to_string(),
            ),
            None,
        ),
    }
}

fn valid_pull_secret(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .is_some_and(|v| v.get("auths").is_some_and(Value::is_object))
}

/// The two Secrets the spec names: their content, or the condition that
/// says what is wrong.
async fn read_secrets(
    client: &Client,
    p: &DPFHCPProvisioner,
    ns: &str,
) -> Result<Result<SecretData, Check>, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let bad = |reason: &str, message: String| {
        Ok(Err(Check::new(
            status::SECRETS_VALID,
            false,
            reason,
            message,
        )))
    };
    let mut found = Vec::new();
    for (r, key, missing, invalid, valid) in [
        (
            &p.spec.ssh_key_secret_ref,
            render::SSH_KEY_KEY,
            "SSHKeySecretMissing",
            "SSHKeySecretInvalid",
            valid_ssh_key as fn(&[u8]) -> bool,
        ),
        (
            &p.spec.pull_secret_ref,
            render::PULL_SECRET_KEY,
            "PullSecretMissing",
            "PullSecretInvalid",
            valid_pull_secret,
        ),
    ] {
        let name = r.as_ref().map(|r| r.name.clone()).unwrap_or_default();
        let secret = match api.get_opt(&name).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                return bad(
                    "SecretsAccessDenied",
                    format!("reading Secret {ns}/{name}: {}", s.message),
                )
            }
            Err(e) => return Err(e.into()),
        };
        let Some(secret) = secret else {
            return bad(missing, format!("Secret {ns}/{name} not found"));
        };
        let Some(value) = secret.data.as_ref().and_then(|d| d.get(key)) else {
            return bad(invalid, format!("Secret {ns}/{name} has no key {key}"));
        };
        if !valid(&value.0) {
            let what = if key == render::SSH_KEY_KEY {
                "an SSH public key (type, then base64)"
            } else {
                "a docker config (JSON with an auths object)"
            };
            return bad(
                invalid,
                format!("Secret {ns}/{name} key {key} is not {what}"),
            );
        }
        found.push(value.0.clone());
    }
    let pull_secret = found.pop().unwrap_or_default();
    let ssh_key = found.pop().unwrap_or_default();
    Ok(Ok(SecretData {
        pull_secret,
        ssh_key,
    }))
}

fn previous_condition<'a>(
    p: &'a DPFHCPProvisioner,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The DPUCluster checks: whether it is there, its type, and whether an
/// older provisioner already uses it.
async fn check_dpu_cluster(
    ctx: &Context,
    p: &DPFHCPProvisioner,
) -> Result<(Vec<Check>, Option<DynamicObject>), Error> {
    let r = &p.spec.dpu_cluster_ref;
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &r.namespace, &dpu_cluster_resource());
    let missing = |reason: &str, message: String| {
        Check::new(status::DPU_CLUSTER_MISSING, true, reason, message)
    };
    let dpu = match api.get_opt(&r.name).await {
        Ok(d) => d,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Ok((
                vec![missing(
                    "DPUClusterAccessDenied",
                    format!(
                        "reading DPUCluster {}/{}: {}",
                        r.namespace, r.name, s.message
                    ),
                )],
                None,
            ));
        }
        Err(e) if not_found(&e) => None,
        Err(e) => return Err(e.into()),
    };
    let Some(dpu) = dpu else {
        let was_found = previous_condition(p, status::DPU_CLUSTER_MISSING)
            .is_some_and(|c| c.status == "False" || c.reason == "DPUClusterDeleted");
        let (reason, message) = if was_found {
            ("DPUClusterDeleted", format!("DPUCluster {}/{} was deleted; the hosted cluster is kept as it is until the DPUCluster is back or this provisioner is deleted", r.namespace, r.name))
        } else {
            (
                "DPUClusterNotFound",
                format!("DPUCluster {}/{} not found", r.namespace, r.name),
            )
        };
        return Ok((vec![missing(reason, message)], None));
    };
    let mut checks = vec![Check::new(
        status::DPU_CLUSTER_MISSING,
        false,
        "DPUClusterFound",
        format!("DPUCluster {}/{} found", r.namespace, r.name),
    )];
    let type_ = dpu
        .data
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    checks.push(match &p.spec.cluster_type {
        _ if type_ == "kamaji" => Check::new(
            status::CLUSTER_TYPE_VALID,
            false,
            "ClusterTypeUnsupported",
            "DPUCluster type kamaji has its own control plane and cannot use a hosted one",
        ),
        Some(want) if want != type_ => Check::new(
            status::CLUSTER_TYPE_VALID,
            false,
            "ClusterTypeMismatch",
            format!("spec.clusterType is {want:?} but the DPUCluster's type is {type_:?}"),
        ),
        _ => Check::new(
            status::CLUSTER_TYPE_VALID,
            true,
            "ClusterTypeValid",
            format!("DPUCluster type {type_:?} is supported"),
        ),
    });
    // 1:1: the oldest provisioner naming the DPUCluster keeps it, so two
    // racing objects do not both fail (nor both win).
    let key = |o: &DPFHCPProvisioner| {
        (
            o.metadata.creation_timestamp.clone().map(|t| t.0),
            o.namespace().unwrap_or_default(),
            o.name_any(),
        )
    };
    let mine = key(p);
    let holder = ctx
        .provisioners
        .state()
        .into_iter()
        .filter(|o| {
            o.metadata.uid != p.metadata.uid && o.spec.dpu_cluster_ref == p.spec.dpu_cluster_ref
        })
        .filter(|o| key(o) < mine)
        .min_by_key(|o| key(o));
    checks.push(match holder {
        Some(o) => Check::new(
            status::DPU_CLUSTER_IN_USE,
            true,
            "DPUClusterInUse",
            format!(
                "DPUCluster {}/{} is already used by DPFHCPProvisioner {}/{}",
                r.namespace,
                r.name,
                o.namespace().unwrap_or_default(),
                o.name_any()
            ),
        ),
        None => Check::new(
            status::DPU_CLUSTER_IN_USE,
            false,
            "DPUClusterAvailable",
            "no other provisioner uses the DPUCluster",
        ),
    });
    Ok((checks, Some(dpu)))
}

async fn check_prerequisites(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    ns: &str,
) -> Result<Check, Error> {
    let c = &ctx.client;
    let not = |reason: &str, message: &str| {
        Check::new(status::PREREQUISITES, false, reason, message.to_string())
    };
    if !installed(c, ns, &hosted_cluster_resource()).await?
        || !installed(c, ns, &node_pool_resource()).await?
    {
        return Ok(not("HyperShiftNotInstalled", "the HyperShift APIs (hostedclusters, nodepools.hypershift.openshift.io) are not installed"));
    }
    if !installed(
        c,
        &p.spec.dpu_cluster_ref.namespace,
        &dpu_cluster_resource(),
    )
    .await?
    {
        return Ok(not(
            "DPFNotInstalled",
            "the DPF API (dpuclusters.provisioning.dpu.nvidia.com) is not installed",
        ));
    }
    if let Some(class) = p
        .spec
        .etcd_storage_class
        .as_deref()
        .filter(|s| !s.is_empty())
    {
        let api: Api<StorageClass> = Api::all(c.clone());
        if api.get_opt(class).await?.is_none() {
            return Ok(not(
                "StorageClassNotFound",
                &format!("etcdStorageClass {class:?} does not exist"),
            ));
        }
    }
    Ok(Check::new(
        status::PREREQUISITES,
        true,
        "AllInstalled",
        "HyperShift and DPF are installed",
    ))
}

/// The node NodePort publishing points at, or a condition saying there is
/// none.
async fn node_port_address(ctx: &Context) -> Result<Result<String, Check>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let list = nodes.list(&ListParams::default()).await?;
    Ok(match render::publishing_node(&list.items) {
        Some((_, address)) => Ok(address),
        None => Err(Check::new(status::APPLIED, false, "NoControlPlaneNode", "NodePort publishing needs a control-plane node (label node-role.kubernetes.io/control-plane or master) with an address")),
    })
}

/// MetalLB's pool and advertisement for the VIP, or why not.
async fn ensure_metal_lb(
    ctx: &Context,
    owner: &Owner,
    settings: &BridgeSettings,
    vip: std::net::IpAddr,
) -> Result<Check, Error> {
    let no = |reason: &str, message: String| {
        Ok(Check::new(
            status::METALLB_CONFIGURED,
            false,
            reason,
            message,
        ))
    };
    if !settings.metal_lb_enabled {
        return Ok(Check::new(
            status::METALLB_CONFIGURED,
            true,
            "MetalLBDisabled",
            "disableMetalLB is set: the VIP is announced by something else",
        ));
    }
    let ns = &settings.metal_lb_namespace;
    let pool_res = ip_address_pool_resource();
    let l2_res = l2_advertisement_resource();
    if !installed(&ctx.client, ns, &pool_res).await? || !installed(&ctx.client, ns, &l2_res).await?
    {
        return no(
            "MetalLBNotInstalled",
            "the MetalLB APIs (ipaddresspools, l2advertisements.metallb.io) are not installed"
                .into(),
        );
    }
    let (pool, l2) = render::metal_lb(owner, ns, vip);
    for (resource, desired, failed) in [
        (&pool_res, pool, "CreatingIPAddressPool"),
        (&l2_res, l2, "L2AdvertisementFailed"),
    ] {
        let name = desired["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, resource);
        let live = api.get_opt(&name).await?;
        if let Some(l) = &live {
            if !labelled_ours(&l.metadata, owner) {
                return no(failed, format!("{} {ns}/{name} exists and was not made for this provisioner (labels {} and {})", resource.kind, render::NAME_LABEL, render::NAMESPACE_LABEL));
            }
        }
        if let Err(e) = ctx
            .applier
            .ensure_dynamic(resource, to_dynamic(desired)?, live)
            .await
        {
            match e {
                Error::Kube(ke) if permanent(&ke) => {
                    return no(failed, format!("{} {ns}/{name}: {ke}", resource.kind))
                }
                other => return Err(other),
            }
        }
    }
    Ok(Check::new(
        status::METALLB_CONFIGURED,
        true,
        "MetalLBReady",
        format!("{vip} is announced from IPAddressPool {ns}/{}", owner.name),
    ))
}

/// Copies HyperShift's admin kubeconfig into the DPUCluster's namespace
/// and names it in the DPUCluster.
async fn inject_kubeconfig(
    ctx: &Context,
    owner: &Owner,
    dpu: &DynamicObject,
) -> Result<Check, Error> {
    let no = |reason: &str, message: String| {
        Ok(Check::new(
            status::KUBECONFIG_INJECTED,
            false,
            reason,
            message,
        ))
    };
    let name = owner.admin_kubeconfig_name();
    let source_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let source = source_api.get_opt(&name).await?;
    let Some(kubeconfig) = source
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(render::ADMIN_KUBECONFIG_KEY))
    else {
        return no(
            "KubeconfigPending",
            format!(
                "waiting for HyperShift to write Secret {}/{name} (key kubeconfig)",
                owner.namespace
            ),
        );
    };
    let dpu_ns = dpu.namespace().unwrap_or_default();
    let dest_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &dpu_ns);
    let dest = dest_api.get_opt(&name).await?;
    let copy = match dest
        .as_ref()
        .and_then(|d| d.data.as_ref())
        .and_then(|d| d.get(render::INJECTED_KEY))
    {
        None => status::Copy::Missing,
        Some(v) if v.0 == kubeconfig.0 => status::Copy::Current,
        Some(_) => status::Copy::Stale,
    };
    let field = dpu.data.pointer("/spec/kubeconfig").and_then(Value::as_str);
    match status::injection(copy, field, &name) {
        status::Injection::Conflict(other) => {
            return no("InjectionFailed", format!("DPUCluster {dpu_ns}/{} already names kubeconfig Secret {other:?}, and the field cannot change once set; re-create the DPUCluster, or delete the provisioner that set it", dpu.name_any()));
        }
        status::Injection::Nothing => {}
        status::Injection::Act {
            write_secret,
            set_field,
        } => {
            if write_secret {
                ctx.applier
                    .ensure_live(render::injected_kubeconfig(owner, &dpu_ns, &kubeconfig.0))
                    .await?;
            }
            if set_field {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(ctx.client.clone(), &dpu_ns, &dpu_cluster_resource());
                let patch = json!({"spec": {"kubeconfig": name}});
                match api
                    .patch(
                        &dpu.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => ctx.applier.counted("DPUCluster", "patch"),
                    Err(e) if permanent(&e) => {
                        return no(
                            "InjectionFailed",
                            format!(
                                "setting DPUCluster {dpu_ns}/{} spec.kubeconfig: {e}",
                                dpu.name_any()
                            ),
                        )
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(Check::new(
        status::KUBECONFIG_INJECTED,
        true,
        "Injected",
        format!("Secret {dpu_ns}/{name} (key super-admin.conf) is named in the DPUCluster"),
    ))
}

/// One reconcile, with its metrics.
pub async fn reconcile(p: Arc<DPFHCPProvisioner>, ctx: Arc<Context>) -> Result<Action, Error> {
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

/// The provisioner's own API, in its namespace.
fn api_of(ctx: &Context, p: &DPFHCPProvisioner) -> Api<DPFHCPProvisioner> {
    Api::namespaced(ctx.client.clone(), &p.namespace().unwrap_or_default())
}

async fn add_finalizer(ctx: &Context, p: &DPFHCPProvisioner) -> Result<(), Error> {
    finalizers::add(&api_of(ctx, p), p, FINALIZER).await
}

async fn remove_finalizer(ctx: &Context, p: &DPFHCPProvisioner) -> Result<(), Error> {
    finalizers::remove(&api_of(ctx, p), p, FINALIZER).await
}

/// What a reconcile writes to status beyond the conditions.
#[derive(Default)]
struct Extra {
    hosted_cluster: bool,
    kubeconfig: bool,
    provisioned_spec: Option<Value>,
    /// The BlueField image found, when looked up.
    blue_field_image: Option<String>,
}

async fn apply(p: &DPFHCPProvisioner, ctx: &Context) -> Result<Action, Error> {
    add_finalizer(ctx, p).await?;
    let owner = Owner::of(p)?;
    let ns = owner.namespace.clone();
    let settings = ctx.settings();
    let mut o = Observed {
        wanted_image: p.spec.ocp_release_image.clone(),
        ..Default::default()
    };
    o.notes.push(if settings.from_object {
        Check::new(status::PROVISIONER_CONFIG, true, "Found", format!("settings from DPFHCPProvisionerConfig {CONFIG_NAME}"))
    } else {
        Check::new(status::PROVISIONER_CONFIG, true, "DefaultsUsed", format!(
            "no DPFHCPProvisionerConfig {CONFIG_NAME}: defaults in use (MetalLB on, in namespace {}; BlueField repository {})",
            settings.metal_lb_namespace, settings.blue_field_repo
        ))
    });
    let mut extra = Extra {
        provisioned_spec: p.status.as_ref().and_then(|s| s.provisioned_spec.clone()),
        ..Default::default()
    };
    let hc_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &hosted_cluster_resource());
    let read_hc = get_present(&hc_api, &owner.name);

    // The spec alone, then against what was provisioned.
    let (checked, mut spec_errors) = match spec::check(&p.spec) {
        Ok(checked) => (Some(checked), Vec::new()),
        Err(errors) => (None, errors),
    };
    if let Some(was) = &extra.provisioned_spec {
        spec_errors.extend(spec::changed_immutable(was, &p.spec));
    }
    let spec_check = match (spec_errors.first(), &checked) {
        (None, Some(_)) => Check::new(status::SPEC_VALID, true, "Valid", "the spec is valid"),
        (first, _) => Check::new(
            status::SPEC_VALID,
            false,
            first.map_or("Invalid", |e| e.reason),
            spec_errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    o.validations.push(spec_check);
    let mut dpu = None;
    let mut secrets = None;
    if let (true, Some(_)) = (spec_errors.is_empty(), &checked) {
        let (checks, found) = check_dpu_cluster(ctx, p).await?;
        o.validations.extend(checks);
        dpu = found;
        match read_secrets(&ctx.client, p, &ns).await? {
            Ok(data) => {
                o.validations.push(Check::new(
                    status::SECRETS_VALID,
                    true,
                    "SecretsValid",
                    "the SSH key and pull secret are there and parse",
                ));
                secrets = Some(data);
            }
            Err(check) => o.validations.push(check),
        }
        o.validations.push(check_prerequisites(ctx, p, &ns).await?);
        if let Some(data) = &secrets {
            let (check, image) = blue_field_check(ctx, p, &settings.blue_field_repo, data).await;
            o.notes.push(Check {
                type_: status::BLUEFIELD_IMAGE_AVAILABLE,
                ..check.clone()
            });
            // A registry that does not answer for a moment is noted, not
            // a failed validation: it is asked again on the next pass.
            if check.status || check.reason != "RegistryAccessError" {
                o.validations.push(check);
            } else {
                o.notes.push(check);
            }
            extra.blue_field_image = image;
        }
    }
    let live_hc = read_hc.await?;
    let ours = live_hc
        .as_ref()
        .map(|hc| controlled_by(&hc.metadata, &owner.uid));
    let (Some(checked), Some(secrets)) = (checked, secrets) else {
        return settle_invalid(ctx, p, o, live_hc, ours, extra).await;
    };
    if o.validations.iter().any(|c| !status::holds(c)) {
        return settle_invalid(ctx, p, o, live_hc, ours, extra).await;
    }
    if matches!(ours, Some(None) | Some(Some(false))) {
        o.applied = Some(Check::new(status::APPLIED, false, "Conflict", format!(
            "HostedCluster {ns}/{} exists and is not this provisioner's: it is left alone. Delete it, or give the provisioner another name",
            owner.name
        )));
        return finish(ctx, p, o, None, extra, POLL).await;
    }

    // Everything checks out: make the objects.
    let mut requeue = RESYNC;
    let outcome: Result<(), Error> = async {
        let [pull, ssh] = render::secret_copies(&owner, &secrets.pull_secret, &secrets.ssh_key);
        ctx.applier.ensure_live(pull).await?;
        ctx.applier.ensure_live(ssh).await?;
        let etcd_key: [u8; 32] = rand::random();
        let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        match secrets_api
            .create(&PostParams::default(), &render::etcd_key(&owner, etcd_key))
            .await
        {
            Ok(_) => ctx.applier.counted("Secret", "create"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        return permanent_or(ctx, p, o, e, extra).await;
    }
    if let Publishing::LoadBalancer { vip } = checked.publishing {
        let check = ensure_metal_lb(ctx, &owner, &settings, vip).await?;
        if check.reason == "MetalLBNotInstalled" {
            requeue = SHORT_POLL;
        }
        o.metal_lb = Some(check);
    }
    let node = match checked.publishing {
        Publishing::NodePort => match node_port_address(ctx).await? {
            Ok(address) => Some(address),
            Err(check) => {
                o.applied = Some(check);
                return finish(
                    ctx,
                    p,
                    o,
                    live_hc
                        .as_ref()
                        .map(|h| HostedClusterFacts::from_object(&h.data)),
                    extra,
                    POLL,
                )
                .await;
            }
        },
        Publishing::LoadBalancer { .. } => None,
    };
    let publishing = render::service_publishing(&checked, node.as_deref())
        .unwrap_or(render::ServicePublishing::LoadBalancer);
    let infra_id = live_hc
        .as_ref()
        .and_then(|h| {
            h.data
                .pointer("/spec/infraID")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| render::infra_id(&owner));
    let desired_hc = render::dpf_hosted_cluster(&owner, &p.spec, &checked, &infra_id, publishing);
    let hc = match ctx
        .applier
        .ensure_dynamic(&hosted_cluster_resource(), to_dynamic(desired_hc)?, live_hc)
        .await
    {
        Ok(hc) => hc,
        Err(e) => return permanent_or(ctx, p, o, e, extra).await,
    };
    extra.hosted_cluster = true;
    extra
        .provisioned_spec
        .get_or_insert_with(|| spec::immutable_part(&p.spec));
    let facts = HostedClusterFacts::from_object(&hc.data);
    let np_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &node_pool_resource());
    let live_np = get_present(&np_api, &owner.name).await?;
    let np_image = live_np.as_ref().and_then(|np| {
        np.data
            .pointer("/spec/release/image")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let rollout = status::rollout(&p.spec.ocp_release_image, &facts);
    let release =
        status::node_pool_release(&p.spec.ocp_release_image, rollout, np_image.as_deref());
    if let Err(e) = ctx
        .applier
        .ensure_dynamic(
            &node_pool_resource(),
            to_dynamic(render::node_pool(&owner, &release))?,
            live_np,
        )
        .await
    {
        return permanent_or(ctx, p, o, e, extra).await;
    }
    o.applied = Some(Check::new(
        status::APPLIED,
        true,
        "HostedClusterApplied",
        format!("HostedCluster and NodePool {ns}/{} are applied", owner.name),
    ));
    if rollout == status::Rollout::Upgrading {
        // HyperShift reports progress in status, which the watch delivers;
        // the poll is the backstop.
        requeue = requeue.min(POLL);
    }
    if let Some(dpu) = &dpu {
        let check = inject_kubeconfig(ctx, &owner, dpu).await?;
        extra.kubeconfig = check.status;
        o.kubeconfig = Some(check);
        if extra.kubeconfig && facts.is("Available", "True") {
            let os_image = p
                .spec
                .machine_os_url
                .clone()
                .filter(|u| !u.is_empty())
                .or_else(|| extra.blue_field_image.clone());
            let check = ignition_check(ctx, p, &owner, dpu, &facts, rollout, os_image).await?;
            if !check.status {
                requeue = requeue.min(POLL);
            }
            o.ignition = Some(check);
        }
    }
    finish(ctx, p, o, Some(facts), extra, requeue).await
}

/// A failed check: nothing is written but status. The HostedCluster, if
/// there, is left as it is and still reported.
async fn settle_invalid(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    live_hc: Option<DynamicObject>,
    ours: Option<Option<bool>>,
    mut extra: Extra,
) -> Result<Action, Error> {
    let facts = match (live_hc, ours) {
        (Some(hc), Some(Some(true))) => {
            o.applied = Some(Check::new(
                status::APPLIED,
                true,
                "HostedClusterKept",
                "the HostedCluster is kept as it is and not updated while a check fails",
            ));
            extra.hosted_cluster = true;
            Some(HostedClusterFacts::from_object(&hc.data))
        }
        _ => None,
    };
    extra.kubeconfig = p
        .status
        .as_ref()
        .is_some_and(|s| s.kube_config_secret_ref.is_some());
    // Checks that fail wait for a change to what they read (watched) or
    // a minute; none is a write retried in a loop.
    finish(ctx, p, o, facts, extra, Duration::from_secs(60)).await
}

/// A write refused for good sets Health=False and waits for a change; any
/// other error is retried with backoff.
async fn permanent_or(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    e: Error,
    extra: Extra,
) -> Result<Action, Error> {
    match e {
        Error::Kube(ke) if permanent(&ke) => {
            tracing::warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), error = %ke, "refused by the API server; not retried until something changes");
            o.permanent_error = Some(ke.to_string());
            if o.applied.is_none() {
                o.applied = Some(Check::new(
                    status::APPLIED,
                    false,
                    "ApplyFailed",
                    ke.to_string(),
                ));
            }
            finish(ctx, p, o, None, extra, RESYNC).await
        }
        other => Err(other),
    }
}

async fn finish(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    facts: Option<HostedClusterFacts>,
    extra: Extra,
    requeue: Duration,
) -> Result<Action, Error> {
    o.hosted_cluster = facts;
    write_status(ctx, p, &o, &extra).await?;
    Ok(Action::requeue(requeue))
}

async fn write_status(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    o: &Observed,
    extra: &Extra,
) -> Result<(), Error> {
    let ns = p.namespace().ok_or(Error::NoNamespace)?;
    let previous = p.status.clone().unwrap_or_default();
    let mut checks = status::checks(o);
    checks.extend(status::csr_approval_condition(
        previous.csr_approval.as_ref(),
    ));
    let ready = status::ready(o);
    let phase = status::phase(o, &ready);
    let conditions = status::conditions(
        &previous.conditions,
        &checks,
        p.metadata.generation,
        &conditions::now(),
    );
    let hc = o.hosted_cluster.as_ref();
    let next = DPFHCPProvisionerStatus {
        phase: Some(phase),
        conditions,
        observed_generation: p.metadata.generation,
        hosted_cluster_ref: extra.hosted_cluster.then(|| HostedClusterReference {
            api_version: render::HYPERSHIFT_API_VERSION.into(),
            kind: "HostedCluster".into(),
            name: p.name_any(),
            namespace: ns.clone(),
        }),
        kube_config_secret_ref: extra.kubeconfig.then(|| LocalRef {
            name: format!("{}-admin-kubeconfig", p.name_any()),
        }),
        blue_field_ocp_layer_image: extra
            .blue_field_image
            .clone()
            .or_else(|| previous.blue_field_ocp_layer_image.clone()),
        blue_field_container_image: extra
            .blue_field_image
            .clone()
            .or_else(|| previous.blue_field_container_image.clone()),
        control_plane_endpoint: hc.and_then(|h| h.endpoint.clone()),
        version: hc.and_then(HostedClusterFacts::version),
        provisioned_spec: extra.provisioned_spec.clone(),
        // The approver's part: compared, never written from here.
        csr_approval: previous.csr_approval.clone(),
    };
    let mut written = next.clone();
    written.csr_approval = None;
    let api: Api<DPFHCPProvisioner> = Api::namespaced(ctx.client.clone(), &ns);
    // Deleted under us: there is no status left to write.
    let wrote = ctx
        .applier
        .apply_status(
            &api,
            &p.name_any(),
            &previous,
            &next,
            &written,
            OnMissing::Skip,
        )
        .await?;
    if wrote && previous.phase != next.phase {
        tracing::info!(provisioner = %p.name_any(), namespace = %ns, phase = ?next.phase, why = %ready.message, "phase");
        let type_ = if matches!(phase, super::crd::Phase::Failed | super::crd::Phase::Error) {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish_about(
            ctx.recorder.as_ref(),
            p,
            type_,
            &format!("{phase:?}"),
            ready.message.clone(),
        )
        .await;
    }
    Ok(())
}

/// The deletion, one step per pass until each is done: the kubeconfig
/// copy and the DPUCluster's reference to it; the NodePool, then the
/// HostedCluster, each waited for; the Secret copies; MetalLB.
async fn delete(p: &DPFHCPProvisioner, ctx: &Context) -> Result<Action, Error> {
    if !p.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let owner = Owner::of(p)?;
    let ns = owner.namespace.clone();
    let settings = ctx.settings();
    let mut o = Observed {
        deleting: true,
        wanted_image: p.spec.ocp_release_image.clone(),
        ..Default::default()
    };
    let extra = Extra {
        provisioned_spec: p.status.as_ref().and_then(|s| s.provisioned_spec.clone()),
        ..Default::default()
    };

    // 1. The kubeconfig copy, then the DPUCluster's reference, so another
    // provisioner can inject into it later.
    let dpu_ref = &p.spec.dpu_cluster_ref;
    let copies: Api<Secret> = Api::namespaced(ctx.client.clone(), &dpu_ref.namespace);
    if let Some(copy) = copies.get_opt(&owner.admin_kubeconfig_name()).await? {
        if labelled_ours(&copy.metadata, &owner) {
            match copies
                .delete(&owner.admin_kubeconfig_name(), &DeleteParams::default())
                .await
            {
                Ok(_) => ctx.applier.counted("Secret", "delete"),
                Err(e) if not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let dpus: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &dpu_ref.namespace,
        &dpu_cluster_resource(),
    );
    let dpu = get_present(&dpus, &dpu_ref.name).await?;
    if let Some(dpu) = dpu {
        if dpu.data.pointer("/spec/kubeconfig").and_then(Value::as_str)
            == Some(owner.admin_kubeconfig_name().as_str())
        {
            // Removing the field, unlike changing it, passes DPF's
            // set-once rule.
            let patch = json!({"spec": {"kubeconfig": null}});
            dpus.patch(
                &dpu_ref.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
            ctx.applier.counted("DPUCluster", "patch");
        }
    }

    // 2. The NodePool, then the HostedCluster: HyperShift wants the pools
    // gone first.
    let since = p.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let waited = since
        .map(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t)
                .as_secs()
                .max(0) as u64
        })
        .unwrap_or(0);
    for (resource, kind) in [
        (node_pool_resource(), "NodePool"),
        (hosted_cluster_resource(), "HostedCluster"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        let live = get_present(&api, &owner.name).await?;
        let Some(live) = live else { continue };
        if controlled_by(&live.metadata, &owner.uid) != Some(true) {
            continue;
        }
        if live.metadata.deletion_timestamp.is_none() {
            ctx.applier.gone_from(&api, kind, &owner.name).await?;
        }
        let what = format!("{kind} {ns}/{}", owner.name);
        let timed_out = waited >= u64::from(settings.deletion_timeout_seconds);
        if timed_out {
            tracing::warn!(provisioner = %owner.name, namespace = %ns, "{what} still there after {waited} s");
        }
        o.cleanup = Some(if timed_out {
            Cleanup::Failed {
                what,
                seconds: u64::from(settings.deletion_timeout_seconds),
            }
        } else {
            Cleanup::InProgress { what }
        });
        if kind == "NodePool" {
            o.applied = Some(Check::new(
                status::APPLIED,
                false,
                "NodePoolsExist",
                "the NodePool is deleted before the HostedCluster",
            ));
        }
        o.hosted_cluster =
            (kind == "HostedCluster").then(|| HostedClusterFacts::from_object(&live.data));
        write_status(ctx, p, &o, &extra).await?;
        let left = u64::from(settings.deletion_timeout_seconds).saturating_sub(waited);
        let next = if left > 0 {
            SHORT_POLL.min(Duration::from_secs(left))
        } else {
            POLL
        };
        return Ok(Action::requeue(next));
    }

    // 3. The Secret copies (owned, but not left to the garbage collector,
    // which would only act after the provisioner is gone).
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    for name in [
        owner.pull_secret_name(),
        owner.ssh_key_name(),
        owner.etcd_key_name(),
    ] {
        match secrets.get_opt(&name).await? {
            Some(s) if controlled_by(&s.metadata, &owner.uid) == Some(true) => {
                match secrets.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => ctx.applier.counted("Secret", "delete"),
                    Err(e) if not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            _ => {}
        }
    }

    // 4. MetalLB, only what carries this provisioner's labels.
    let mlb_ns = &settings.metal_lb_namespace;
    for (resource, name) in [
        (ip_address_pool_resource(), owner.name.clone()),
        (l2_advertisement_resource(), owner.l2_advertisement_name()),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), mlb_ns, &resource);
        let live = get_present(&api, &name).await?;
        if live.is_some_and(|l| labelled_ours(&l.metadata, &owner)) {
            ctx.applier.gone_from(&api, &resource.kind, &name).await?;
        }
    }

    o.cleanup = Some(Cleanup::Succeeded);
    o.applied = Some(Check::new(
        status::APPLIED,
        false,
        "Deleted",
        "everything the provisioner made is deleted",
    ));
    write_status(ctx, p, &o, &extra).await?;
    remove_finalizer(ctx, p).await?;
    tracing::info!(provisioner = %owner.name, namespace = %ns, "deleted");
    Ok(Action::await_change())
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
    let (provisioners, provisioner_stream) = cached(
        scope.api::<DPFHCPProvisioner>(&client),
        watcher::Config::default(),
    );
    let (configs, config_stream) = cached(
        Api::<DPFHCPProvisionerConfig>::all(client.clone()),
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
        blue_field: super::bluefield::Resolver::default(),
        ignition_checked: Default::default(),
        operator_namespace,
        last_config: std::sync::Mutex::new(None),
        recorder,
        metrics,
    });
    let dynamic = |resource: ApiResource, labelled: bool| {
        let api: Api<PartialObjectMeta<DynamicObject>> = match &scope {
            Scope::All => Api::all_with(client.clone(), &resource),
            Scope::Namespace(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        };
        let config = if labelled {
            watcher::Config::default().labels(render::NAME_LABEL)
        } else {
            watcher::Config::default()
        };
        watcher(api, config).default_backoff().touched_objects()
    };
    let hosted_clusters = dynamic(hosted_cluster_resource(), true);
    let node_pools = dynamic(node_pool_resource(), true);
    // DPUClusters may live in any namespace.
    let dpu_clusters = watcher(
        Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), &dpu_cluster_resource()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects();
    let secrets = watcher(
        scope.api::<PartialObjectMeta<Secret>>(&client),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects();
    let all = provisioners.clone();
    let every = provisioners.clone();
    let by_template = provisioners.clone();
    // The bfcfg templates, wherever their DPUClusters are: one deleted or
    // edited is made again at once.
    let templates = watcher(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        watcher::Config::default().labels(&format!("{}=true", super::ignition::TEMPLATE_LABEL)),
    )
    .default_backoff()
    .touched_objects();
    let by_dpu = provisioners.clone();
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_settings_object_holds_for_the_grace_period_only() {
        let t0 = Instant::now();
        let mut last = None;
        assert_eq!(
            remembered(None, &mut last, t0),
            None,
            "never seen: defaults"
        );
        let off = DPFHCPProvisionerConfigSpec {
            disable_metal_lb: Some(true),
            ..Default::default()
        };
        assert_eq!(
            remembered(Some(off.clone()), &mut last, t0),
            Some(off.clone())
        );
        // Deleted (the hook's delete-and-recreate): still in force.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(remembered(None, &mut last, t1), Some(off.clone()));
        assert_eq!(
            remembered(
                None,
                &mut last,
                t1 + CONFIG_GRACE - Duration::from_millis(1)
            ),
            Some(off.clone())
        );
        // Gone for good: the defaults.
        assert_eq!(remembered(None, &mut last, t1 + CONFIG_GRACE), None);
        // Back: live again, and a later deletion starts a new grace.
        assert_eq!(
            remembered(Some(off.clone()), &mut last, t1 + CONFIG_GRACE * 2),
            Some(off.clone())
        );
        assert_eq!(
            remembered(None, &mut last, t1 + CONFIG_GRACE * 3),
            Some(off)
        );
    }

    #[test]
    fn ssh_keys_and_pull_secrets_are_parsed_not_just_present() {
        assert!(valid_ssh_key(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb3J3yRzq0k1Jq8F6c1bq6Xq0v4cX1mZq1k2l3m4n5o user@host\n"));
        assert!(valid_ssh_key(
            b"# comment\necdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY=\n"
        ));
        assert!(!valid_ssh_key(b"hello"));
        assert!(!valid_ssh_key(b"ssh-rsa not*base64"));
        assert!(!valid_ssh_key(b"-----BEGIN OPENSSH PRIVATE KEY-----"));
        assert!(!valid_ssh_key(&[0xff, 0xfe]));
        assert!(valid_pull_secret(
            br#"{"auths": {"quay.io": {"auth": "eDp5"}}}"#
        ));
        assert!(!valid_pull_secret(br#"{"auths": []}"#));
        assert!(!valid_pull_secret(b"not json"));
    }

    #[test]
    fn only_4xx_refusals_are_permanent() {
        let api =
            |code| kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed());
        assert!(permanent(&api(403)));
        assert!(permanent(&api(422)));
        assert!(!permanent(&api(409)));
        assert!(!permanent(&api(429)));
        assert!(!permanent(&api(500)));
    }
}
