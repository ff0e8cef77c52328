//! What a provisioner's objects should be, as pure functions of the spec and
//! the facts observed: the HostedCluster and NodePool, the Secret copies
//! HyperShift reads, and the MetalLB pool and advertisement.
//!
//! The HostedCluster is rendered in two layers: [`hosted_cluster`] holds
//! everything that does not depend on where the nodes run, and takes the
//! [`Platform`] as a parameter. The DPF bridge asks for `Platform::None`; a
//! renderer for KubeVirt workers on an isolated VLAN adds a variant and its
//! own caller (which also renders an Infra beside it), not a copy of this.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use serde_json::{json, Value};

use super::crd::{AvailabilityPolicy, DPFHCPProvisionerSpec, NetworkEntry};
use super::spec::{Checked, Publishing, ResolvedNetworking};
use super::status::{node_pool_release, Rollout};
use crate::k8s::MANAGED_BY;

pub const HYPERSHIFT_API_VERSION: &str = "hypershift.openshift.io/v1beta1";
pub const METALLB_API_VERSION: &str = "metallb.io/v1beta1";
/// The ownership labels of every object the bridge makes, the same as the
/// Go operator's, so objects it made are recognised.
pub const NAME_LABEL: &str = "dpfhcpprovisioner.dpu.hcp.io/name";
pub const NAMESPACE_LABEL: &str = "dpfhcpprovisioner.dpu.hcp.io/namespace";
pub const ETCD_SIZE: &str = "8Gi";
/// Capabilities a DPU cluster has no use for.
pub const DISABLED_CAPABILITIES: [&str; 6] = [
    "ImageRegistry",
    "Insights",
    "Console",
    "openshift-samples",
    "Ingress",
    "NodeTuning",
];
pub const CONTROL_PLANE_NODE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// The provisioner the objects are for.
pub use crate::k8s::Owner;

// The provisioner's names for what it makes: an inherent impl of the
// shared owner type, kept beside the rendering that uses it.
impl Owner {
    pub fn reference(&self) -> OwnerReference {
        self.controller_reference("provisioning.dpu.hcp.io/v1alpha1", "DPFHCPProvisioner")
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        [
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (NAME_LABEL.to_string(), self.name.clone()),
            (NAMESPACE_LABEL.to_string(), self.namespace.clone()),
        ]
        .into()
    }

    /// HyperShift's namespace for the control plane of this cluster.
    pub fn control_plane_namespace(&self) -> String {
        format!("{}-{}", self.namespace, self.name)
    }

    pub fn pull_secret_name(&self) -> String {
        format!("{}-pull-secret", self.name)
    }
    pub fn ssh_key_name(&self) -> String {
        format!("{}-ssh-key", self.name)
    }
    pub fn etcd_key_name(&self) -> String {
        format!("{}-etcd-encryption-key", self.name)
    }
    /// HyperShift's admin kubeconfig Secret, and the name of its copy in
    /// the DPUCluster's namespace.
    pub fn admin_kubeconfig_name(&self) -> String {
        format!("{}-admin-kubeconfig", self.name)
    }
    pub fn l2_advertisement_name(&self) -> String {
        format!("advertise-{}", self.name)
    }
}

/// Where the nodes run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Platform {
    /// Nodes HyperShift does not provision: the DPUs join by themselves.
    None,
}

impl Platform {
    fn value(&self) -> Value {
        match self {
            Platform::None => json!({"type": "None"}),
        }
    }
}

/// How each control-plane service is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServicePublishing {
    /// The API server by a LoadBalancer Service, the rest by Routes.
    LoadBalancer,
    /// Every service on a NodePort of the node with this address.
    NodePort { address: String },
}

/// Everything of a HostedCluster that does not depend on the platform.
#[derive(Debug, Clone, PartialEq)]
pub struct HostedClusterInput {
    pub release_image: String,
    pub base_domain: String,
    pub infra_id: String,
    pub etcd_storage_class: Option<String>,
    pub networking: ResolvedNetworking,
    pub allocate_node_cidrs: bool,
    pub controller_availability: AvailabilityPolicy,
    pub infrastructure_availability: Option<AvailabilityPolicy>,
    pub node_selector: BTreeMap<String, String>,
    pub publishing: ServicePublishing,
    pub disabled_capabilities: Vec<String>,
}

fn entries(list: &[NetworkEntry]) -> Value {
    Value::Array(
        list.iter()
            .map(|e| match e.host_prefix {
                Some(p) => json!({"cidr": e.cidr, "hostPrefix": p}),
                None => json!({"cidr": e.cidr}),
            })
            .collect(),
    )
}

fn services(publishing: &ServicePublishing) -> Value {
    let with = |service: &str, strategy: Value| json!({"service": service, "servicePublishingStrategy": strategy});
    match publishing {
        ServicePublishing::LoadBalancer => json!([
            with("APIServer", json!({"type": "LoadBalancer"})),
            with("OAuthServer", json!({"type": "Route"})),
            with("Konnectivity", json!({"type": "Route"})),
            with("Ignition", json!({"type": "Route"})),
        ]),
        ServicePublishing::NodePort { address } => {
            let mut names = [
                "APIServer",
                "OAuthServer",
                "OIDC",
                "Konnectivity",
                "Ignition",
            ];
            names.sort_unstable();
            Value::Array(
                names
                    .iter()
                    .map(|s| {
                        with(
                            s,
                            json!({"type": "NodePort", "nodePort": {"address": address}}),
                        )
                    })
                    .collect(),
            )
        }
    }
}

/// A HostedCluster named for its owner, on `platform`.
pub fn hosted_cluster(owner: &Owner, input: &HostedClusterInput, platform: &Platform) -> Value {
    let mut persistent_volume = json!({"size": ETCD_SIZE});
    if let Some(class) = &input.etcd_storage_class {
        persistent_volume["storageClassName"] = json!(class);
    }
    let mut spec = json!({
        "release": {"image": input.release_image},
        "pullSecret": {"name": owner.pull_secret_name()},
        "sshKey": {"name": owner.ssh_key_name()},
        "dns": {"baseDomain": input.base_domain},
        "infraID": input.infra_id,
        "etcd": {
            "managementType": "Managed",
            "managed": {"storage": {"type": "PersistentVolume", "persistentVolume": persistent_volume}},
        },
        "networking": {
            "networkType": "Other",
            "serviceNetwork": entries(&input.networking.service_network),
            "clusterNetwork": entries(&input.networking.cluster_network),
            "allocateNodeCIDRs": if input.allocate_node_cidrs { "Enabled" } else { "Disabled" },
        },
        "platform": platform.value(),
        "controllerAvailabilityPolicy": input.controller_availability.as_str(),
        "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": owner.etcd_key_name()}}},
        "capabilities": {"disabled": input.disabled_capabilities},
        "nodeSelector": input.node_selector,
        "services": services(&input.publishing),
    });
    // Left out when empty, as HyperShift's own types write it (and the Go
    // operator's clusters have it): an adopted HostedCluster keeps its spec.
    if !input.networking.machine_network.is_empty() {
        spec["networking"]["machineNetwork"] = entries(&input.networking.machine_network);
    }
    if let Some(p) = input.infrastructure_availability {
        spec["infrastructureAvailabilityPolicy"] = json!(p.as_str());
    }
    json!({
        "apiVersion": HYPERSHIFT_API_VERSION,
        "kind": "HostedCluster",
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": owner.labels(),
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    })
}

/// HyperShift's infraID for a new cluster: the name made DNS-safe and cut
/// to 21 characters, then 5 characters that differ per provisioner object.
/// Derived from the UID rather than drawn at random, so rendering stays a
/// pure function and a re-created provisioner gets a new one.
pub fn infra_id(owner: &Owner) -> String {
    let mut base: String = owner
        .name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() {
                c
            } else {
                '-'
            }
        })
        .take(21)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    let mut h = std::hash::DefaultHasher::new();
    owner.uid.hash(&mut h);
    let mut n = h.finish();
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let suffix: String = (0..5)
        .map(|_| {
            let c = alphabet[(n % 36) as usize] as char;
            n /= 36;
            c
        })
        .collect();
    format!("{base}-{suffix}")
}

/// The DPF bridge's HostedCluster: platform None, no ingress, etcd on a
/// persistent volume, secrets encrypted with the generated key.
pub fn dpf_hosted_cluster(
    owner: &Owner,
    spec: &DPFHCPProvisionerSpec,
    checked: &Checked,
    infra_id: &str,
    publishing: ServicePublishing,
) -> Value {
    let input = HostedClusterInput {
        release_image: spec.ocp_release_image.clone(),
        base_domain: spec.base_domain.clone(),
        infra_id: infra_id.into(),
        etcd_storage_class: spec.etcd_storage_class.clone().filter(|s| !s.is_empty()),
        networking: checked.networking.clone(),
        allocate_node_cidrs: spec.flannel_enabled,
        controller_availability: spec.control_plane_availability_policy,
        infrastructure_availability: spec.infrastructure_availability_policy,
        node_selector: spec
            .node_selector
            .clone()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| [(CONTROL_PLANE_NODE_LABEL.to_string(), String::new())].into()),
        publishing,
        disabled_capabilities: DISABLED_CAPABILITIES
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    hosted_cluster(owner, &input, &Platform::None)
}

/// The NodePool the DPUs join through: no machines of its own (replicas
/// 0), replaced rather than updated in place on an upgrade.
/// The HostedCluster a provisioner should have, from its spec, the checks,
/// the live HostedCluster (whose `infraID`, once set, is kept: HyperShift
/// names cloud resources after it) and the node address a NodePort
/// publishing uses.
pub fn desired_hosted_cluster(
    owner: &Owner,
    spec: &DPFHCPProvisionerSpec,
    checked: &Checked,
    live: Option<&Value>,
    node: Option<&str>,
) -> Value {
    let publishing = service_publishing(checked, node).unwrap_or(ServicePublishing::LoadBalancer);
    let id = live
        .and_then(|h| h.pointer("/spec/infraID"))
        .and_then(Value::as_str)
        .map_or_else(|| infra_id(owner), str::to_string);
    dpf_hosted_cluster(owner, spec, checked, &id, publishing)
}

/// The NodePool a provisioner should have: at the wanted release, except
/// that while the HostedCluster's rollout to it is not done the live pool
/// keeps the release it has, so workers never run ahead of their control
/// plane.
pub fn desired_node_pool(
    owner: &Owner,
    wanted_image: &str,
    rollout: Rollout,
    live: Option<&Value>,
) -> Value {
    let live_image = live
        .and_then(|np| np.pointer("/spec/release/image"))
        .and_then(Value::as_str);
    node_pool(owner, &node_pool_release(wanted_image, rollout, live_image))
}

pub fn node_pool(owner: &Owner, release_image: &str) -> Value {
    json!({
        "apiVersion": HYPERSHIFT_API_VERSION,
        "kind": "NodePool",
        "metadata": {
            "name": owner.name,
            "namespace": owner.namespace,
            "labels": owner.labels(),
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "clusterName": owner.name,
            "replicas": 0,
            "management": {"upgradeType": "Replace"},
            "platform": {"type": "None"},
            "release": {"image": release_image},
        },
    })
}

/// A Node's address for NodePort publishing: its external DNS name, else
/// its external IP, else its internal IP.
pub fn node_address(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["ExternalDNS", "ExternalIP", "InternalIP"]
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a.type_ == *t)
                .map(|a| a.address.clone())
        })
}

/// The node NodePort publishing points at: among the control-plane nodes
/// (labelled control-plane or master) that have an address, the first by
/// name. The same node every time, whatever order the list came in.
pub fn publishing_node(nodes: &[k8s_openapi::api::core::v1::Node]) -> Option<(String, String)> {
    let mut candidates: Vec<(String, String)> = nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref();
            labels.is_some_and(|l| {
                l.contains_key(CONTROL_PLANE_NODE_LABEL)
                    || l.contains_key("node-role.kubernetes.io/master")
            })
        })
        .filter_map(|n| Some((n.metadata.name.clone()?, node_address(n)?)))
        .collect();
    candidates.sort();
    candidates.into_iter().next()
}

fn owned_secret(
    owner: &Owner,
    name: String,
    type_: &str,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(owner.namespace.clone()),
            labels: Some(owner.labels()),
            owner_references: Some(vec![owner.reference()]),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(data),
        ..Default::default()
    }
}

pub const PULL_SECRET_KEY: &str = ".dockerconfigjson";
pub const SSH_KEY_KEY: &str = "id_rsa.pub";

/// The copies HyperShift reads, owned by the provisioner, kept in step
/// with the user's Secrets.
pub fn secret_copies(owner: &Owner, pull_secret: &[u8], ssh_key: &[u8]) -> [Secret; 2] {
    [
        owned_secret(
            owner,
            owner.pull_secret_name(),
            "kubernetes.io/dockerconfigjson",
            [(
                PULL_SECRET_KEY.to_string(),
                ByteString(pull_secret.to_vec()),
            )]
            .into(),
        ),
        owned_secret(
            owner,
            owner.ssh_key_name(),
            "Opaque",
            [(SSH_KEY_KEY.to_string(), ByteString(ssh_key.to_vec()))].into(),
        ),
    ]
}

/// The etcd encryption key: made once, never rewritten (a new key would
/// leave etcd's data unreadable).
pub fn etcd_key(owner: &Owner, key: [u8; 32]) -> Secret {
    owned_secret(
        owner,
        owner.etcd_key_name(),
        "Opaque",
        [("key".to_string(), ByteString(key.to_vec()))].into(),
    )
}

/// MetalLB's pool of the one VIP, for the control-plane namespace only, and
/// its layer-2 advertisement. Cluster objects in another namespace, so
/// not owned: found by the ownership labels, removed by the finalizer.
pub fn metal_lb(owner: &Owner, namespace: &str, vip: IpAddr) -> (Value, Value) {
    let prefix = if vip.is_ipv4() { 32 } else { 128 };
    let pool = json!({
        "apiVersion": METALLB_API_VERSION,
        "kind": "IPAddressPool",
        "metadata": {"name": owner.name, "namespace": namespace, "labels": owner.labels()},
        "spec": {
            "addresses": [format!("{vip}/{prefix}")],
            "autoAssign": true,
            "serviceAllocation": {"namespaces": [owner.control_plane_namespace()]},
        },
    });
    let advertisement = json!({
        "apiVersion": METALLB_API_VERSION,
        "kind": "L2Advertisement",
        "metadata": {"name": owner.l2_advertisement_name(), "namespace": namespace, "labels": owner.labels()},
        "spec": {"ipAddressPools": [owner.name]},
    });
    (pool, advertisement)
}

/// The copy of the admin kubeconfig in the DPUCluster's namespace, under
/// the key DPF reads.
pub fn injected_kubeconfig(owner: &Owner, namespace: &str, kubeconfig: &[u8]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(owner.admin_kubeconfig_name()),
            namespace: Some(namespace.into()),
            labels: Some(owner.labels()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some([(INJECTED_KEY.to_string(), ByteString(kubeconfig.to_vec()))].into()),
        ..Default::default()
    }
}

pub const ADMIN_KUBECONFIG_KEY: &str = "kubeconfig";
pub const INJECTED_KEY: &str = "super-admin.conf";

/// How a publishing strategy follows from the checked spec and, in NodePort
/// mode, the chosen node.
pub fn service_publishing(checked: &Checked, node: Option<&str>) -> Option<ServicePublishing> {
    match checked.publishing {
        Publishing::LoadBalancer { .. } => Some(ServicePublishing::LoadBalancer),
        Publishing::NodePort => node.map(|address| ServicePublishing::NodePort {
            address: address.into(),
        }),
    }
}

/// Whether the object's controller is the provisioner of `uid`: `None`
/// when nothing controls it.
pub fn controlled_by(meta: &kube::api::ObjectMeta, uid: &str) -> Option<bool> {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    let controller = refs.iter().find(|r| r.controller == Some(true))?;
    Some(controller.uid == uid)
}

/// Whether the object carries the provisioner's ownership labels (objects
/// in other namespaces, which an owner reference cannot point from).
pub fn labelled_ours(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    let labels = meta.labels.clone().unwrap_or_default();
    labels.get(NAME_LABEL) == Some(&owner.name)
        && labels.get(NAMESPACE_LABEL) == Some(&owner.namespace)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::dpf::spec::{self, tests as spec_tests};
    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};

    fn owner() -> Owner {
        Owner {
            name: "prod-dpu-cluster".into(),
            namespace: "my-dpu-clusters".into(),
            uid: "0b5e6c1a-7f1e-4bb4-9a52-3f6f1c2e9d11".into(),
        }
    }

    fn render(spec: &DPFHCPProvisionerSpec, publishing: ServicePublishing) -> Value {
        let checked = spec::check(spec).unwrap();
        dpf_hosted_cluster(&owner(), spec, &checked, &infra_id(&owner()), publishing)
    }

    #[test]
    fn a_live_infra_id_is_kept_and_a_new_cluster_gets_ours() {
        let spec = spec_tests::sample();
        let checked = spec::check(&spec).unwrap();
        let fresh = desired_hosted_cluster(&owner(), &spec, &checked, None, None);
        assert_eq!(fresh["spec"]["infraID"], json!(infra_id(&owner())));
        let live = json!({"spec": {"infraID": "made-by-the-go-operator"}});
        let kept = desired_hosted_cluster(&owner(), &spec, &checked, Some(&live), None);
        assert_eq!(kept["spec"]["infraID"], json!("made-by-the-go-operator"));
    }

    #[test]
    fn the_node_pool_waits_for_its_control_plane_to_reach_the_release() {
        let live = json!({"spec": {"release": {"image": "old"}}});
        let image = |np: Value| np["spec"]["release"]["image"].clone();
        for (rollout, live, want) in [
            (Rollout::Upgrading, Some(&live), "old"),
            (Rollout::Installing, Some(&live), "old"),
            (Rollout::Done, Some(&live), "new"),
            (Rollout::Upgrading, None, "new"),
        ] {
            let np = desired_node_pool(&owner(), "new", rollout, live);
            assert_eq!(image(np), json!(want), "{rollout:?} with {live:?}");
        }
    }

    #[test]
    fn the_readme_sample_renders_the_hosted_cluster_field_by_field() {
        let hc = render(&spec_tests::sample(), ServicePublishing::LoadBalancer);
        let s = &hc["spec"];
        assert_eq!(hc["metadata"]["name"], "prod-dpu-cluster");
        assert_eq!(hc["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            s["release"]["image"],
            "quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64"
        );
        assert_eq!(s["pullSecret"]["name"], "prod-dpu-cluster-pull-secret");
        assert_eq!(s["sshKey"]["name"], "prod-dpu-cluster-ssh-key");
        assert_eq!(s["dns"]["baseDomain"], "clusters.example.com");
        assert_eq!(s["platform"]["type"], "None");
        assert_eq!(s["networking"]["networkType"], "Other");
        assert_eq!(s["networking"]["allocateNodeCIDRs"], "Enabled");
        assert_eq!(
            s["networking"]["serviceNetwork"][0]["cidr"],
            "172.31.0.0/16"
        );
        assert_eq!(
            s["networking"]["clusterNetwork"][0]["cidr"],
            "10.132.0.0/14"
        );
        assert!(
            s["networking"].get("machineNetwork").is_none(),
            "no machine network: the field is left out"
        );
        assert_eq!(s["etcd"]["managementType"], "Managed");
        let pv = &s["etcd"]["managed"]["storage"]["persistentVolume"];
        assert_eq!(pv["size"], "8Gi");
        assert_eq!(pv["storageClassName"], "ocs-storagecluster-ceph-rbd");
        assert_eq!(s["secretEncryption"]["type"], "aescbc");
        assert_eq!(
            s["secretEncryption"]["aescbc"]["activeKey"]["name"],
            "prod-dpu-cluster-etcd-encryption-key"
        );
        assert_eq!(s["controllerAvailabilityPolicy"], "HighlyAvailable");
        assert!(s.get("infrastructureAvailabilityPolicy").is_none());
        assert_eq!(
            s["nodeSelector"],
            json!({"node-role.kubernetes.io/control-plane": ""})
        );
        assert_eq!(s["capabilities"]["disabled"].as_array().unwrap().len(), 6);
        assert_eq!(
            s["services"],
            json!([
                {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer"}},
                {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route"}},
                {"service": "Konnectivity", "servicePublishingStrategy": {"type": "Route"}},
                {"service": "Ignition", "servicePublishingStrategy": {"type": "Route"}},
            ])
        );
    }

    #[test]
    fn node_port_mode_publishes_every_service_on_one_node_sorted_by_name() {
        let hc = render(
            &spec_tests::sample(),
            ServicePublishing::NodePort {
                address: "10.0.0.5".into(),
            },
        );
        let services: Vec<&str> = hc["spec"]["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["service"].as_str().unwrap())
            .collect();
        assert_eq!(
            services,
            [
                "APIServer",
                "Ignition",
                "Konnectivity",
                "OAuthServer",
                "OIDC"
            ]
        );
        for s in hc["spec"]["services"].as_array().unwrap() {
            assert_eq!(
                s["servicePublishingStrategy"]["nodePort"]["address"],
                "10.0.0.5"
            );
        }
    }

    #[test]
    fn flannel_off_policies_and_selectors_reach_the_hosted_cluster() {
        let mut spec = spec_tests::sample();
        spec.flannel_enabled = false;
        spec.infrastructure_availability_policy = Some(AvailabilityPolicy::SingleReplica);
        spec.node_selector = Some([("zone".to_string(), "a".to_string())].into());
        spec.etcd_storage_class = None;
        let hc = render(&spec, ServicePublishing::LoadBalancer);
        assert_eq!(hc["spec"]["networking"]["allocateNodeCIDRs"], "Disabled");
        assert_eq!(
            hc["spec"]["infrastructureAvailabilityPolicy"],
            "SingleReplica"
        );
        assert_eq!(hc["spec"]["nodeSelector"], json!({"zone": "a"}));
        assert!(hc["spec"]["etcd"]["managed"]["storage"]["persistentVolume"]
            .get("storageClassName")
            .is_none());
    }

    #[test]
    fn the_infra_id_is_dns_safe_short_and_stable_per_object() {
        let mut o = owner();
        o.name = "A_Very.Long.Provisioner-Name-That-Goes-On".into();
        let id = infra_id(&o);
        assert_eq!(id, infra_id(&o));
        assert!(id.len() <= 27, "{id}");
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
        let mut other = o.clone();
        other.uid = "another".into();
        assert_ne!(infra_id(&other), id);
    }

    #[test]
    fn the_node_pool_has_no_machines_and_replaces_on_upgrade() {
        let np = node_pool(&owner(), "img:1");
        assert_eq!(np["spec"]["replicas"], 0);
        assert_eq!(np["spec"]["clusterName"], "prod-dpu-cluster");
        assert_eq!(np["spec"]["management"]["upgradeType"], "Replace");
        assert_eq!(np["spec"]["platform"]["type"], "None");
        assert_eq!(np["spec"]["release"]["image"], "img:1");
    }

    #[test]
    fn metal_lb_announces_the_vip_alone_for_the_control_plane_namespace() {
        let (pool, l2) = metal_lb(&owner(), "metallb-system", "192.168.1.100".parse().unwrap());
        assert_eq!(pool["metadata"]["namespace"], "metallb-system");
        assert_eq!(pool["spec"]["addresses"], json!(["192.168.1.100/32"]));
        assert_eq!(
            pool["spec"]["serviceAllocation"]["namespaces"],
            json!(["my-dpu-clusters-prod-dpu-cluster"])
        );
        assert_eq!(pool["metadata"]["labels"][NAME_LABEL], "prod-dpu-cluster");
        assert_eq!(l2["metadata"]["name"], "advertise-prod-dpu-cluster");
        assert_eq!(l2["spec"]["ipAddressPools"], json!(["prod-dpu-cluster"]));
        let (v6, _) = metal_lb(&owner(), "m", "fd00::5".parse().unwrap());
        assert_eq!(v6["spec"]["addresses"], json!(["fd00::5/128"]));
    }

    fn node(name: &str, labels: &[&str], addresses: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|l| (l.to_string(), String::new()))
                .collect(),
        );
        n.status = Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: t.to_string(),
                        address: a.to_string(),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    #[test]
    fn node_port_publishing_picks_the_same_control_plane_node_whatever_the_order() {
        let worker = node(
            "a-worker",
            &["node-role.kubernetes.io/worker"],
            &[("InternalIP", "10.0.0.1")],
        );
        let m2 = node(
            "m2",
            &[CONTROL_PLANE_NODE_LABEL],
            &[("InternalIP", "10.0.0.12"), ("ExternalIP", "1.2.3.12")],
        );
        let m1 = node(
            "m1",
            &["node-role.kubernetes.io/master"],
            &[("InternalIP", "10.0.0.11")],
        );
        let bare = node("m0", &[CONTROL_PLANE_NODE_LABEL], &[]);
        let one = publishing_node(&[worker.clone(), m2.clone(), m1.clone(), bare.clone()]);
        let two = publishing_node(&[m1.clone(), bare, m2.clone(), worker.clone()]);
        assert_eq!(one, Some(("m1".into(), "10.0.0.11".into())));
        assert_eq!(one, two);
        assert_eq!(publishing_node(&[m2]).unwrap().1, "1.2.3.12");
        assert_eq!(publishing_node(&[worker]), None);
    }
}
