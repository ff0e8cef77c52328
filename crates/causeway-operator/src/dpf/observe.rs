//! Everything a provisioner's reconcile reads, read before anything is
//! written: [`gather`] reads the HostedCluster, then what the checks need
//! (the DPUCluster, the user's Secrets, the cluster's prerequisites, the
//! BlueField image), then, when every check holds, what making the
//! objects needs (MetalLB's objects, the node address, the NodePool, the
//! kubeconfig copies, the boot template's inputs). What a read finds
//! wrong is already a [`Check`]; [`super::plan::decide`] puts them
//! together. Nothing here writes.

use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::Value;

use super::bfcfg::{content_digest, DpuMode, Flavor};
use super::crd::{BridgeSettings, DPFHCPProvisioner};
use super::plan::{
    self, IgnitionSource, KubeconfigRead, MetalLbRead, Observed, ProvisioningReads, SecretData,
    Validated,
};
use super::render::{self, Owner};
use super::spec::Publishing;
use super::status::{self, Check, HostedClusterFacts, Rollout};
use crate::error::Error;
use crate::k8s::apply::{api_message, get_present, installed, not_found, permanent};
use crate::k8s::resources::{
    dpf_operator_config_resource, dpu_cluster_resource, dpu_deployment_resource,
    dpu_flavor_resource, hosted_cluster_resource, ip_address_pool_resource,
    l2_advertisement_resource, node_pool_resource,
};

use super::context::Context;
use super::spec::{valid_pull_secret, valid_ssh_key};

/// Reads everything one pass of `p` needs, in the order the checks gate
/// it: a failing check stops the reads its failure makes moot.
pub(super) async fn gather(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    settings: &BridgeSettings,
) -> Result<Observed, Error> {
    let hc_api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &owner.namespace,
        &hosted_cluster_resource(),
    );
    let live_hc = get_present(&hc_api, &owner.name).await?;
    let (checked, spec_check) = plan::spec_verdict(p);
    let Some(checked) = checked else {
        return Ok(Observed {
            live_hc,
            ..Default::default()
        });
    };
    let (dpu_checks, dpu) = check_dpu_cluster(ctx, p).await?;
    let secrets = read_secrets(&ctx.client, p, &owner.namespace).await?;
    let prerequisites = check_prerequisites(ctx, p, &owner.namespace).await?;
    let blue_field = match (&secrets, plan::blue_field_kept(p)) {
        (Ok(_), Some((check, image))) => Some((check, Some(image))),
        (Ok(data), None) => Some(blue_field_check(ctx, p, &settings.blue_field_repo, data).await),
        (Err(_), _) => None,
    };
    let validated = Validated {
        dpu_checks,
        dpu,
        secrets,
        prerequisites,
        blue_field,
    };
    let (validations, _) = plan::validations(spec_check, Some(&validated));
    let ours = plan::hosted_cluster_ours(live_hc.as_ref(), owner);
    if !plan::may_provision(&validations, ours) {
        return Ok(Observed {
            live_hc,
            validated: Some(validated),
            provisioning: None,
        });
    }
    let mut reads = ProvisioningReads::default();
    match checked.publishing {
        Publishing::LoadBalancer { .. } if settings.metal_lb_enabled => {
            reads.metal_lb = Some(read_metal_lb(ctx, owner, &settings.metal_lb_namespace).await?);
        }
        Publishing::LoadBalancer { .. } => {}
        Publishing::NodePort => reads.node_address = Some(node_port_address(ctx).await?),
    }
    let np_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &owner.namespace, &node_pool_resource());
    reads.live_np = get_present(&np_api, &owner.name).await?;
    if let Some(dpu) = &validated.dpu {
        reads.kubeconfig = Some(read_kubeconfig(ctx, owner, dpu).await?);
        let facts = live_hc
            .as_ref()
            .map(|h| HostedClusterFacts::from_object(&h.data))
            .unwrap_or_default();
        let was_upgrading = p.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == status::UPGRADING && c.status == "True")
        });
        let upgrade = status::rollout(&p.spec.ocp_release_image, &facts, was_upgrading);
        if upgrade != Rollout::Upgrading && facts.is("Available", "True") {
            reads.ignition = Some(read_ignition(ctx, p, dpu).await?);
        }
    }
    Ok(Observed {
        live_hc,
        validated: Some(validated),
        provisioning: Some(reads),
    })
}

/// MetalLB's pool and advertisement of the provisioner's name, when its
/// APIs answer.
async fn read_metal_lb(ctx: &Context, owner: &Owner, ns: &str) -> Result<MetalLbRead, Error> {
    let pool_res = ip_address_pool_resource();
    let l2_res = l2_advertisement_resource();
    if !installed(&ctx.client, ns, &pool_res).await? || !installed(&ctx.client, ns, &l2_res).await?
    {
        return Ok(MetalLbRead::NotInstalled);
    }
    let pools: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &pool_res);
    let l2s: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &l2_res);
    Ok(MetalLbRead::Live {
        pool: pools.get_opt(&owner.name).await?.map(Box::new),
        l2: l2s
            .get_opt(&owner.l2_advertisement_name())
            .await?
            .map(Box::new),
    })
}

/// HyperShift's admin kubeconfig and the copy of it the DPUCluster names.
async fn read_kubeconfig(
    ctx: &Context,
    owner: &Owner,
    dpu: &DynamicObject,
) -> Result<KubeconfigRead, Error> {
    let name = owner.admin_kubeconfig_name();
    let value = |s: Option<Secret>, key: &str| {
        s.and_then(|s| s.data)
            .and_then(|mut d| d.remove(key))
            .map(|b| b.0)
    };
    let source: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let copies: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &dpu.namespace().unwrap_or_default());
    Ok(KubeconfigRead {
        source: value(source.get_opt(&name).await?, render::ADMIN_KUBECONFIG_KEY),
        copy: value(copies.get_opt(&name).await?, render::INJECTED_KEY),
    })
}

/// What the boot template is made from, read: the DPUDeployment's BFB and
/// flavor, the DPUFlavor, the DPFOperatorConfig's MTU and the template
/// published now; or the IgnitionConfigured condition saying which of
/// them is missing.
pub(super) async fn read_ignition(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    dpu: &DynamicObject,
) -> Result<Result<IgnitionSource, Check>, Error> {
    use super::ignition as ign;
    let check = |reason: &str, message: String| {
        Ok(Err(Check::new(
            status::IGNITION_CONFIGURED,
            false,
            reason,
            message,
        )))
    };
    let dpu_ns = dpu.namespace().unwrap_or_default();
    let mut inputs = ign::Inputs {
        dpu_cluster: dpu.name_any(),
        dpu_cluster_namespace: dpu_ns.clone(),
        release_image: p.spec.ocp_release_image.clone(),
        ..Default::default()
    };
    // The template is built around the DPUDeployment's flavor, so there is
    // nothing to publish without one.
    let Some(r) = &p.spec.dpu_deployment_ref else {
        return check(
            "DPUDeploymentRefMissing",
            "spec.dpuDeploymentRef is not set: the DPU boot template is built from the DPUDeployment's DPUFlavor".into(),
        );
    };
    let deployments: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &r.namespace, &dpu_deployment_resource());
    let Some(d) = get_present(&deployments, &r.name).await? else {
        return check(
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
            "DependencyDeleted",
            format!("DPUFlavor {}/{flavor_name} not found", r.namespace),
        );
    };
    let flavor = match serde_json::to_value(&flavor) {
        Ok(v) => v,
        Err(e) => {
            return check(
                "IgnitionGenerationFailed",
                format!("DPUFlavor {}/{flavor_name}: {e}", r.namespace),
            )
        }
    };
    let parsed = match Flavor::from_object(&flavor) {
        Ok(f) => f,
        Err(e) => return check(e.reason(), e.to_string()),
    };
    let config = match operator_config(&ctx.client).await? {
        Ok(config) => config,
        Err(message) => return check("IgnitionGenerationFailed", message),
    };
    let mtu = match high_speed_mtu(&config) {
        Ok(mtu) => mtu,
        Err(message) => return check("IgnitionGenerationFailed", message),
    };
    let bfb_registry = match parsed.mode() {
        DpuMode::Trusted => None,
        DpuMode::ZeroTrust => match bfb_registry(&ctx.client, &config).await? {
            Ok(url) => Some(url),
            Err(why) => {
                let e = super::bfcfg::BfcfgError::NoBfbRegistry(parsed.name().to_string(), why);
                return check(e.reason(), e.to_string());
            }
        },
    };
    inputs.content_digest = Some(content_digest(&flavor, mtu, bfb_registry.as_deref()));
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &dpu_ns);
    let name = ign::configmap_name(&inputs.dpu_cluster);
    let published = match cms.get_opt(&name).await {
        Ok(c) => c,
        Err(e) if permanent(&e) => {
            return check(
                "IgnitionGenerationFailed",
                format!("reading ConfigMap {dpu_ns}/{name}: {e}"),
            );
        }
        Err(e) => return Err(e.into()),
    };
    let uid = p.uid().unwrap_or_default();
    let first_look = ctx
        .ignition_checked
        .lock()
        .map(|seen| !seen.contains(&uid))
        .unwrap_or(false);
    Ok(Ok(IgnitionSource {
        inputs,
        flavor: parsed,
        high_speed_mtu: mtu,
        bfb_registry,
        published: published.map(|c| c.annotations().clone()),
        first_look,
    }))
}

/// The singleton DPFOperatorConfig, or why there is not exactly one.
async fn operator_config(client: &Client) -> Result<Result<DynamicObject, String>, Error> {
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
    Ok(Ok(config.clone()))
}

/// The DPFOperatorConfig's `spec.networking.highSpeedMTU`, or why it is
/// not an MTU.
fn high_speed_mtu(config: &DynamicObject) -> Result<Option<u32>, String> {
    match config.data.pointer("/spec/networking/highSpeedMTU") {
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
    }
}

/// Zero-trust: the BFB registry's URL, from the DPFOperatorConfig, its
/// namespace's `bfb-registry` Service and the Nodes.
async fn bfb_registry(
    client: &Client,
    config: &DynamicObject,
) -> Result<Result<String, String>, Error> {
    use super::bfcfg::{bfb_registry_url, BFB_REGISTRY_SERVICE};
    let ns = config.namespace().unwrap_or_default();
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns);
    let service = services.get_opt(BFB_REGISTRY_SERVICE).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = nodes.list(&ListParams::default()).await?.items;
    Ok(bfb_registry_url(&config.data, service.as_ref(), &nodes))
}

/// The BlueField OS image for the release: skipped when `machineOSURL`
/// names one.
pub(super) async fn blue_field_check(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    repository: &str,
    secrets: &SecretData,
) -> (Check, Option<String>) {
    use super::bluefield::Lookup;
    use crate::registry::Credentials;
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
