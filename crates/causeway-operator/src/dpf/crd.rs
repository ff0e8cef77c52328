//! The DPF bridge's custom resources: `DPFHCPProvisioner` and its
//! cluster-scoped settings singleton `DPFHCPProvisionerConfig`.
//!
//! Every field the Go operator's CRD has is here under the same name, with
//! the same validation, defaults and immutability, so its objects apply
//! unchanged. Four fields of the original operator spec are optional
//! extensions (`exposeThroughLoadBalancer`, `infrastructureAvailabilityPolicy`,
//! `clusterType`, `metalLBVirtualIP`). CEL rules hold on servers from 1.25;
//! the operator checks the same rules itself ([`super::spec`]), because
//! older servers drop them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}

/// A string enum, for an optional field: schemars would list `null` among
/// the values, which API servers refuse.
fn string_enum(values: &[&str]) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": values})
}

fn optional_policy(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&["SingleReplica", "HighlyAvailable"])
}

fn optional_phase(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&[
        "Pending",
        "WaitingForControlPlane",
        "GeneratingIgnition",
        "ClusterVersionProgressing",
        "Ready",
        "Failed",
        "Error",
        "Deleting",
    ])
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

fn highly_available() -> AvailabilityPolicy {
    AvailabilityPolicy::HighlyAvailable
}

/// A HyperShift hosted cluster for a DPF DPU cluster: one object in, a
/// working control plane out.
// The printer columns repeat `type_ = "string"` by nature.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "provisioning.dpu.hcp.io",
    version = "v1alpha1",
    kind = "DPFHCPProvisioner",
    plural = "dpfhcpprovisioners",
    shortname = "dpfhcp",
    namespaced,
    status = "DPFHCPProvisionerStatus",
    doc = "A HyperShift hosted control plane for a DPF DPUCluster, run by causeway",
    annotation("helm.sh/resource-policy", "keep"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "HostedCluster",
        type_ = "string",
        json_path = ".status.hostedClusterRef.name"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.controlPlaneAvailabilityPolicy != 'HighlyAvailable' || (has(self.virtualIP) && size(self.virtualIP) > 0) || (has(self.metalLBVirtualIP) && size(self.metalLBVirtualIP) > 0)").message("virtualIP is required when controlPlaneAvailabilityPolicy is HighlyAvailable"),
    validation = Rule::new("!has(self.virtualIP) || !has(self.metalLBVirtualIP) || self.virtualIP == self.metalLBVirtualIP").message("metalLBVirtualIP is an alias of virtualIP: give one, or both equal"),
    validation = Rule::new("!has(self.sshKey)").message("sshKey is a file path, which cannot be read inside a cluster: put the public key in a Secret (key id_rsa.pub) in this namespace and name it in sshKeySecretRef"),
    validation = Rule::new("!has(self.pullSecret)").message("pullSecret is a file path, which cannot be read inside a cluster: put it in a Secret (key .dockerconfigjson) in this namespace and name it in pullSecretRef"),
    validation = Rule::new("has(self.sshKeySecretRef)").message("sshKeySecretRef is required: a Secret in this namespace with key id_rsa.pub"),
    validation = Rule::new("has(self.pullSecretRef)").message("pullSecretRef is required: a Secret in this namespace with key .dockerconfigjson"),
)]
#[serde(rename_all = "camelCase")]
pub struct DPFHCPProvisionerSpec {
    /// The DPF DPUCluster this hosted cluster serves (1:1). Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("dpuClusterRef is immutable"))]
    pub dpu_cluster_ref: ObjectRef,
    /// The hosted cluster's base domain. Immutable.
    #[schemars(
        length(min = 4, max = 253),
        regex(pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("baseDomain is immutable"))]
    pub base_domain: String,
    /// The OpenShift release image. A change upgrades the control plane,
    /// then the NodePool. At most 512 characters: it keys the BlueField
    /// lookup's answers, and a reference is far shorter.
    #[schemars(length(max = 512))]
    pub ocp_release_image: String,
    /// A Secret in this namespace with key `id_rsa.pub`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("sshKeySecretRef is immutable"))]
    pub ssh_key_secret_ref: Option<LocalRef>,
    /// A Secret in this namespace with key `.dockerconfigjson`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("pullSecretRef is immutable"))]
    pub pull_secret_ref: Option<LocalRef>,
    /// The StorageClass of etcd's volumes; the cluster default when unset.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("etcdStorageClass is immutable"))]
    pub etcd_storage_class: Option<String>,
    /// Immutable.
    #[serde(default = "highly_available")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("controlPlaneAvailabilityPolicy is immutable"))]
    pub control_plane_availability_policy: AvailabilityPolicy,
    /// The hosted cluster's infrastructureAvailabilityPolicy (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_policy")]
    pub infrastructure_availability_policy: Option<AvailabilityPolicy>,
    /// The address MetalLB announces for the API server. Required when the
    /// control plane is HighlyAvailable. Immutable.
    #[serde(rename = "virtualIP", default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self == oldSelf").message("virtualIP is immutable"),
        validation = Rule::new(r"self == '' || self.matches('^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])[.]){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$') || self.matches('^[0-9a-fA-F:]*:[0-9a-fA-F:.]*$')").message("virtualIP must be an IP address"),
    )]
    pub virtual_ip: Option<String>,
    /// The original spec's name for virtualIP (extension).
    #[serde(
        rename = "metalLBVirtualIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("metalLBVirtualIP is immutable"))]
    pub metal_lb_virtual_ip: Option<String>,
    /// Where the control plane's pods run; by default the management
    /// cluster's control-plane nodes. At most 20 entries. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 20))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeSelector is immutable"))]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Flannel on the DPUs: the hosted cluster allocates node CIDRs.
    /// Immutable.
    #[serde(default = "yes")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("flannelEnabled is immutable"))]
    pub flannel_enabled: bool,
    /// The DPF DPUDeployment whose flavor the DPUs' ignition is built from.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("dpuDeploymentRef is immutable"))]
    pub dpu_deployment_ref: Option<ObjectRef>,
    /// The DPU OS image; when unset it is looked up from the release.
    #[serde(
        rename = "machineOSURL",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub machine_os_url: Option<String>,
    /// The hosted cluster's networks; defaults apply to what is unset.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("networking is immutable"))]
    pub networking: Option<Networking>,
    /// Publish the API server through a MetalLB LoadBalancer (true) or
    /// NodePorts (false). Unset: LoadBalancer when the control plane is
    /// HighlyAvailable or a virtualIP is given (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("exposeThroughLoadBalancer is immutable"))]
    pub expose_through_load_balancer: Option<bool>,
    /// The DPUCluster type expected; when set, the DPUCluster's
    /// `spec.type` must equal it (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_type: Option<String>,
    /// Rejected: a file path cannot be read in a cluster. Use sshKeySecretRef.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key: Option<String>,
    /// Rejected: a file path cannot be read in a cluster. Use pullSecretRef.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
}

#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct ObjectRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct LocalRef {
    #[schemars(length(min = 1))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum AvailabilityPolicy {
    SingleReplica,
    HighlyAvailable,
}

impl AvailabilityPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            AvailabilityPolicy::SingleReplica => "SingleReplica",
            AvailabilityPolicy::HighlyAvailable => "HighlyAvailable",
        }
    }
}

/// HyperShift's networking entries, one of each at most.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Networking {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1))]
    pub service_network: Vec<NetworkEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1))]
    pub cluster_network: Vec<NetworkEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1))]
    pub machine_network: Vec<NetworkEntry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkEntry {
    #[schemars(length(max = 43))]
    pub cidr: String,
    /// clusterNetwork only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_prefix: Option<i32>,
}

/// The Go operator's eight phases. README-era tooling speaks of five;
/// docs/operator.md maps one onto the other.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    WaitingForControlPlane,
    GeneratingIgnition,
    ClusterVersionProgressing,
    Ready,
    Failed,
    Error,
    Deleting,
}

impl Phase {
    /// The five phases of the chart README (Pending, Provisioning, Ready,
    /// Failed, Deleting).
    pub fn summary(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::WaitingForControlPlane
            | Phase::GeneratingIgnition
            | Phase::ClusterVersionProgressing => "Provisioning",
            Phase::Ready => "Ready",
            Phase::Failed | Phase::Error => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DPFHCPProvisionerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_phase")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_cluster_ref: Option<HostedClusterReference>,
    /// The injected kubeconfig Secret, in the DPUCluster's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config_secret_ref: Option<LocalRef>,
    /// The BlueField OS layer image for the release.
    #[serde(
        rename = "blueFieldOCPLayerImage",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub blue_field_ocp_layer_image: Option<String>,
    /// The same image under the chart README's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_field_container_image: Option<String>,
    /// `https://host:port` of the hosted API server, once HyperShift
    /// reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<String>,
    /// The control plane's version, once a rollout has completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The immutable fields as first provisioned: a later change to one is
    /// refused (condition SpecValid) on servers that do not run the CRD's
    /// CEL rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub provisioned_spec: Option<serde_json::Value>,
    /// The CSR approver's state and the approvals later requests are held
    /// to. Written by the approver alone, under its own field manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr_approval: Option<CsrApprovalStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CsrApprovalStatus {
    /// Whether CSRs of this hosted cluster are being approved now.
    pub active: bool,
    pub reason: String,
    pub message: String,
    /// One bootstrap approval per DPU and provisioning cycle: a second
    /// bootstrap CSR for the same DPU is denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bootstrap: Vec<BootstrapApproval>,
    /// The SANs approved for each DPU's serving certificate: a renewal may
    /// not add to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving: Vec<ServingApproval>,
    /// When each DPU was first seen joining in this provisioning cycle: a
    /// bootstrap CSR made before then is denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<JoiningDpu>,
    /// Nodes whose DPU tries to join again while the old Node object is
    /// still in the hosted cluster: the bootstrap CSR is denied
    /// (NodeExists) until the Node is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_joins: Vec<BlockedJoin>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedJoin {
    pub node: String,
    /// The newest bootstrap CSR denied for it.
    pub csr_name: String,
    /// RFC 3339: when the first was denied.
    pub since: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoiningDpu {
    pub node: String,
    #[serde(rename = "dpuUID")]
    pub dpu_uid: String,
    /// RFC 3339.
    pub since: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapApproval {
    pub node: String,
    #[serde(rename = "csrUID")]
    pub csr_uid: String,
    /// The DPU object the approval belongs to: a recreated DPU starts a
    /// new cycle.
    #[serde(rename = "dpuUID")]
    pub dpu_uid: String,
    pub approved_at: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingApproval {
    pub node: String,
    #[serde(rename = "dpuUID")]
    pub dpu_uid: String,
    pub sans: Vec<String>,
}

/// An ObjectReference as the Go operator writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// The rest of an ObjectReference, kept when a migrated object's status
    /// has them; causeway does not write them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
}

/// The bridge's settings; one object, named `default`. When it is absent
/// the documented defaults apply and each provisioner says so in its
/// `ProvisionerConfig` condition.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "provisioning.dpu.hcp.io",
    version = "v1alpha1",
    kind = "DPFHCPProvisionerConfig",
    plural = "dpfhcpprovisionerconfigs",
    shortname = "dpfhcpconfig",
    doc = "Settings of causeway's DPF bridge: a singleton named default",
    annotation("helm.sh/resource-policy", "keep"),
    printcolumn(
        name = "BlueFieldOCPLayerRepo",
        type_ = "string",
        json_path = ".spec.blueFieldOCPLayerRepo"
    ),
    printcolumn(
        name = "DisableMetalLB",
        type_ = "boolean",
        json_path = ".spec.disableMetalLB"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new("self.metadata.name == 'default'").message("the one DPFHCPProvisionerConfig is named default")
)]
#[serde(rename_all = "camelCase")]
pub struct DPFHCPProvisionerConfigSpec {
    /// Where BlueField OS layer images are looked up (`<repo>:<version>`).
    #[serde(
        rename = "blueFieldOCPLayerRepo",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("default" = DEFAULT_BLUEFIELD_REPO), length(max = 512))]
    pub blue_field_ocp_layer_repo: Option<String>,
    /// Do not create MetalLB objects (MetalLB is managed elsewhere).
    #[serde(
        rename = "disableMetalLB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("default" = false))]
    pub disable_metal_lb: Option<bool>,
    /// The namespace of the IPAddressPools and L2Advertisements.
    #[serde(
        rename = "metalLBNamespace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub metal_lb_namespace: Option<String>,
    /// The operator's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_namespace: Option<String>,
    /// How long a deletion may wait for the HostedCluster to go before
    /// Health turns False, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub hosted_cluster_deletion_timeout_seconds: Option<u32>,
    /// Keep the ovn, doca-telemetry-service and hbn DPUServiceTemplates in
    /// each DPU cluster namespace a provisioner uses.
    #[serde(
        rename = "manageDPUServiceTemplates",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(extend("default" = false))]
    pub manage_dpu_service_templates: Option<bool>,
    /// An image pull Secret for the doca-telemetry-service and hbn
    /// templates.
    #[serde(
        rename = "dpuServicesImagePullSecret",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub dpu_services_image_pull_secret: Option<String>,
}

pub const DEFAULT_BLUEFIELD_REPO: &str =
    "registry.redhat.io/dpu-kit-for-nvidia/bluefield-ocp-layer-rhel10";
pub const DEFAULT_METALLB_NAMESPACE: &str = "openshift-operators";
pub const DEFAULT_DELETION_TIMEOUT_SECONDS: u32 = 30 * 60;
/// The singleton's one allowed name.
pub const CONFIG_NAME: &str = "default";

/// The settings in force: the singleton's, with defaults for what it
/// leaves out.
#[derive(Clone, Debug, PartialEq)]
pub struct BridgeSettings {
    pub blue_field_repo: String,
    pub metal_lb_enabled: bool,
    pub metal_lb_namespace: String,
    pub operator_namespace: String,
    pub deletion_timeout_seconds: u32,
    /// Whether the singleton exists (false: all defaults).
    pub from_object: bool,
}

impl BridgeSettings {
    pub fn resolve(config: Option<&DPFHCPProvisionerConfigSpec>, operator_namespace: &str) -> Self {
        let d = DPFHCPProvisionerConfigSpec::default();
        let c = config.unwrap_or(&d);
        BridgeSettings {
            blue_field_repo: c
                .blue_field_ocp_layer_repo
                .clone()
                .unwrap_or_else(|| DEFAULT_BLUEFIELD_REPO.into()),
            metal_lb_enabled: !c.disable_metal_lb.unwrap_or(false),
            metal_lb_namespace: c
                .metal_lb_namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_METALLB_NAMESPACE.into()),
            operator_namespace: c
                .operator_namespace
                .clone()
                .unwrap_or_else(|| operator_namespace.into()),
            deletion_timeout_seconds: c
                .hosted_cluster_deletion_timeout_seconds
                .unwrap_or(DEFAULT_DELETION_TIMEOUT_SECONDS),
            from_object: config.is_some(),
        }
    }
}

/// Both CRDs as YAML, exactly as the chart's templates hold them.
pub fn crd_yaml() -> Result<(String, String), serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let header = "# Generated by `causeway operator crd`; do not edit. A test fails when\n# this file differs from what the code generates.\n";
    Ok((
        format!(
            "{header}{}",
            serde_saphyr::to_string(&DPFHCPProvisioner::crd())?
        ),
        format!(
            "{header}{}",
            serde_saphyr::to_string(&DPFHCPProvisionerConfig::crd())?
        ),
    ))
}

/// The chart's templates of the two CRDs: the generated CRDs, installed
/// only while the bridge is on (`dpf.enabled`).
pub fn chart_templates() -> Result<(String, String), serde_saphyr::SerializeError> {
    let (provisioner, config) = crd_yaml()?;
    let wrap = |body: String| format!("{{{{- if .Values.dpf.enabled }}}}\n{body}{{{{- end }}}}\n");
    Ok((wrap(provisioner), wrap(config)))
}
