//! What a provisioner's reconcile reads before it writes: the DPUCluster,
//! the user's Secrets, the cluster's prerequisites, the BlueField image,
//! the node-port address, and the ignition the DPUs boot from. Each read
//! becomes a [`Check`] for status.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::bfcfg::{content_digest, Flavor};
use super::crd::DPFHCPProvisioner;
use super::render::{self, Owner};
use super::status::{self, Check, HostedClusterFacts};
use crate::error::Error;
use crate::k8s::apply::{api_message, get_present, installed, not_found, permanent};
use crate::k8s::resources::{
    dpf_operator_config_resource, dpu_cluster_resource, dpu_deployment_resource,
    dpu_flavor_resource, hosted_cluster_resource, node_pool_resource,
};

use super::context::{publish_note, Context};
use super::events::Note;
use super::spec::{valid_pull_secret, valid_ssh_key};

/// What the two user Secrets hold, once checked.
pub(super) struct SecretData {
    pub(super) pull_secret: Vec<u8>,
    pub(super) ssh_key: Vec<u8>,
}

/// IgnitionConfigured: the bfcfg template is published and made from what
/// the provisioner, its DPUDeployment, DPUFlavor and the DPFOperatorConfig
/// say now, or is made again when it is missing, stale or first seen by
/// this process.
#[allow(clippy::too_many_arguments)]
pub(super) async fn ignition_check(
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
    // The template is built around the DPUDeployment's flavor, so there is
    // nothing to publish without one.
    let Some(r) = &p.spec.dpu_deployment_ref else {
        return check(
            false,
            "DPUDeploymentRefMissing",
            "spec.dpuDeploymentRef is not set: the DPU boot template is built from the DPUDeployment's DPUFlavor".into(),
        );
    };
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &r.namespace, &dpu_deployment_resource());
    let Some(d) = get_present(&deployments, &r.name).await? else {
        return check(
            false,
            "DependencyDeleted",
            format!("DPUDeployment {}/{} not found", r.namespace, r.name),
        );
    };
    let field = |ptr: &str| {
        d.data
            .pointer(ptr)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    inputs.bfb = field("/spec/dpus/bfb").map(|b| (b, r.namespace.clone()));
    let Some(flavor_name) = field("/spec/dpus/flavor") else {
        return check(
            false,
            "IgnitionGenerationFailed",
            format!(
                "DPUDeployment {}/{} has no spec.dpus.flavor",
                r.namespace, r.name
            ),
        );
    };
    inputs.flavor = Some((flavor_name.clone(), r.namespace.clone()));
    let flavors: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &r.namespace, &dpu_flavor_resource());
    let Some(flavor) = get_present(&flavors, &flavor_name).await? else {
        return check(
            false,
            "DependencyDeleted",
            format!("DPUFlavor {}/{flavor_name} not found", r.namespace),
        );
    };
    let flavor = match serde_json::to_value(&flavor) {
        Ok(v) => v,
        Err(e) => {
            return check(
                false,
                "IgnitionGenerationFailed",
                format!("DPUFlavor {}/{flavor_name}: {e}", r.namespace),
            )
        }
    };
    let parsed = match Flavor::from_object(&flavor) {
        Ok(f) => f,
        Err(e) => return check(false, e.reason(), e.to_string()),
    };
    let mtu = match high_speed_mtu(&ctx.client).await? {
        Ok(mtu) => mtu,
        Err(message) => return check(false, "IgnitionGenerationFailed", message),
    };
    inputs.content_digest = Some(content_digest(&flavor, mtu));
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
    let was_configured = p.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::IGNITION_CONFIGURED && c.status == "True")
    });
    if let Some(note) = super::events::regeneration_note(why, was_configured) {
        publish_note(ctx, p, note).await;
    }
    match generate(ctx, owner, facts, &inputs, &parsed, mtu).await {
        Ok(()) => {
            publish_note(
                ctx,
                p,
                Note::normal(
                    "IgnitionConfigured",
                    format!("Ignition ConfigMap {name} configured successfully"),
                ),
            )
            .await;
            tracing::info!(provisioner = %owner.name, namespace = %owner.namespace, configmap = %name, why, "DPU ignition published");
            check(true, "IgnitionGenerated", format!("ConfigMap {dpu_ns}/{name} holds the ignition for {} with OS image {os_image} (made again: {why})", inputs.release_image))
        }
        Err((reason, e)) => {
            tracing::warn!(provisioner = %owner.name, namespace = %owner.namespace, error = %e, "DPU ignition");
            publish_note(ctx, p, Note::warning("IgnitionGenerationFailed", e.clone())).await;
            check(false, reason, e)
        }
    }
}

/// The singleton DPFOperatorConfig's `spec.networking.highSpeedMTU`, or
/// why it cannot be read: none or several configs, or a value that is not
/// an MTU.
async fn high_speed_mtu(client: &Client) -> Result<Result<Option<u32>, String>, Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &dpf_operator_config_resource());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) if not_found(&e) || permanent(&e) => {
            return Ok(Err(format!(
                "listing DPFOperatorConfigs: {}",
                api_message(&e)
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let [config] = list.items.as_slice() else {
        let names: Vec<String> = list
            .items
            .iter()
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        return Ok(Err(format!(
            "exactly one DPFOperatorConfig is needed for the high-speed MTU; found {}: {names:?}",
            list.items.len()
        )));
    };
    Ok(match config.data.pointer("/spec/networking/highSpeedMTU") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|m| u32::try_from(m).ok())
            .map(Some)
            .ok_or(format!(
                "DPFOperatorConfig {}/{}: spec.networking.highSpeedMTU {v} is not an MTU",
                config.namespace().unwrap_or_default(),
                config.name_any()
            )),
    })
}

/// Fetches HyperShift's ignition, builds the boot template around it and
/// applies the template ConfigMap; a failure comes with its
/// IgnitionConfigured reason.
pub(super) async fn generate(
    ctx: &Context,
    owner: &Owner,
    facts: &HostedClusterFacts,
    inputs: &super::ignition::Inputs,
    flavor: &Flavor,
    high_speed_mtu: Option<u32>,
) -> Result<(), (&'static str, String)> {
    let failed = |e: String| ("IgnitionGenerationFailed", e);
    let endpoint = facts
        .ignition_endpoint
        .as_deref()
        .ok_or_else(|| failed("the HostedCluster reports no ignitionEndpoint yet".into()))?;
    let cp_ns = format!("{}-{}", owner.namespace, owner.name);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &cp_ns);
    let key = |s: &Secret, k: &str| s.data.as_ref().and_then(|d| d.get(k)).map(|b| b.0.clone());
    let ca = secrets
        .get_opt("ignition-server-ca-cert")
        .await
        .map_err(|e| failed(format!("Secret {cp_ns}/ignition-server-ca-cert: {e}")))?
        .and_then(|s| key(&s, "tls.crt"))
        .ok_or_else(|| {
            failed(format!(
                "no Secret {cp_ns}/ignition-server-ca-cert with tls.crt"
            ))
        })?;
    let prefix = format!("token-{}-", owner.name);
    let token = secrets
        .list(&ListParams::default())
        .await
        .map_err(|e| failed(format!("Secrets of {cp_ns}: {e}")))?
        .items
        .into_iter()
        .filter(|s| s.name_any().starts_with(&prefix))
        .find_map(|s| key(&s, "token"))
        .ok_or_else(|| failed(format!("no Secret {cp_ns}/{prefix}* with a token")))?;
    let ignition = super::ignition::fetch(endpoint, &token, &ca)
        .await
        .map_err(failed)?;
    let template = super::bfcfg::template(&super::bfcfg::Inputs {
        hcp_ignition: &ignition,
        flavor,
        high_speed_mtu,
        os_image: &inputs.os_image,
    })
    .map_err(|e| (e.reason(), e.to_string()))?;
    let body = super::ignition::configmap(inputs, &template, &owner.labels());
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &inputs.dpu_cluster_namespace);
    ctx.applier
        .apply_as(
            &cms,
            "ConfigMap",
            &super::ignition::configmap_name(&inputs.dpu_cluster),
            &body,
        )
        .await
        .map_err(|e| failed(format!("applying the bfcfg ConfigMap: {e}")))?;
    Ok(())
}

/// The BlueField OS image for the release: skipped when `machineOSURL`
/// names one.
pub(super) async fn blue_field_check(
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

/// The two Secrets the spec names: their content, or the condition that
/// says what is wrong.
pub(super) async fn read_secrets(
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

pub(super) fn previous_condition<'a>(
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
pub(super) async fn check_dpu_cluster(
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

pub(super) async fn check_prerequisites(
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
pub(super) async fn node_port_address(ctx: &Context) -> Result<Result<String, Check>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let list = nodes.list(&ListParams::default()).await?;
    Ok(match render::publishing_node(&list.items) {
        Some((_, address)) => Ok(address),
        None => Err(Check::new(status::APPLIED, false, "NoControlPlaneNode", "NodePort publishing needs a control-plane node (label node-role.kubernetes.io/control-plane or master) with an address")),
    })
}
