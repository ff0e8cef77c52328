//! The `Infra` custom resource. Every field of the schema that Go-operator
//! users already write is accepted under the same name with the same
//! meaning; causeway's additions are optional.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn yes() -> bool {
    true
}

/// An optional string enum as API servers take it: `nullable` rather than
/// a `null` among the values, which 1.20's structural schema check refuses.
fn string_enum(values: &[&str]) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "enum": values, "nullable": true})
}

fn optional_topology(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&["Localnet", "Layer2", "Layer3"])
}

fn optional_role(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&["Secondary", "Primary"])
}

fn optional_exposure(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&["Layer2", "BGP"])
}

fn optional_ipam(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    string_enum(&["DHCP", "External", "OVNKubernetes"])
}

/// The isolated VLAN and its hosted cluster's infrastructure services.
// The printer columns repeat `type_ = "string"` by nature.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hostedcluster.densityops.com",
    version = "v1alpha1",
    kind = "Infra",
    plural = "infras",
    shortname = "infra",
    namespaced,
    status = "InfraStatus",
    doc = "DHCP, split-horizon DNS and an L4 proxy to the control plane for a hosted cluster's nodes on an isolated VLAN, run by causeway",
    annotation("helm.sh/resource-policy", "keep"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "DHCP",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='DHCPReady')].status"
    ),
    printcolumn(
        name = "DNS",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='DNSReady')].status"
    ),
    printcolumn(
        name = "Proxy",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='ProxyReady')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InfraSpec {
    pub network_config: NetworkConfig,
    #[serde(default)]
    pub infra_components: InfraComponents,
    /// The HostedCluster (hypershift.openshift.io/v1beta1) these services
    /// are for. When set, the cluster name, base domain and control-plane
    /// namespace default to the HostedCluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_cluster_ref: Option<HostedClusterRef>,
    /// Policy routing inside each pod: the routing table and rule priority
    /// for the VLAN interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingSpec>,
    /// Resources for every data-plane container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// Apps ingress on the Infra, as the Go operator's first generations
    /// had it: kept, so a stored Infra loses nothing, but run only from an
    /// InfraClusterAttachment; the Infra's `IgnoredFields` condition gives
    /// the attachment that runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps_ingress: Option<InfraAppsIngressSpec>,
}

/// The Infra's apps ingress (the Go operator's first form): an
/// attachment's fields, and the two it had only here.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraAppsIngressSpec {
    #[serde(flatten)]
    pub apps: super::attachment::AppsIngressSpec,
    /// A second `*.apps` domain, when it differs from
    /// `infraComponents.dns.baseDomain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_domain: Option<String>,
    /// The hosted cluster whose router is published; by default the
    /// Infra's `hostedClusterRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_cluster_ref: Option<HostedClusterRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// The VLAN's IPv4 network, such as 192.168.100.0/24.
    pub cidr: String,
    /// The VLAN's gateway; the default route the DHCP server hands out.
    /// Required for a Secondary network with DHCP or External IPAM.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// The Multus NetworkAttachmentDefinition of the VLAN (the older form;
    /// or `attachment` with the fields below).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network_attachment_definition: String,
    /// Its namespace; by default the Infra's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_attachment_namespace: Option<String>,
    /// Upstream resolvers for names outside the hosted cluster's zone, at
    /// most 15; `resolv.conf` stands for the DNS pod's own resolvers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers: Vec<String>,
    /// The structured form: what the VLAN is attached through. With it,
    /// topology, role, exposure and ipam are all required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachment: Option<NetworkAttachmentRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_topology")]
    pub topology: Option<Topology>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_role")]
    pub role: Option<NetworkRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_exposure")]
    pub exposure: Option<Exposure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "optional_ipam")]
    pub ipam: Option<Ipam>,
    /// The RouteAdvertisements (cluster-scoped) of a BGP-exposed network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_advertisements_ref: Option<NamedRef>,
    /// A causeway addition for a dual-stack VLAN: its IPv6 prefix and
    /// router. Each component given `serverIPv6` then serves over v6 too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<NetworkV6>,
}

/// The VLAN's IPv6 side.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkV6 {
    /// The VLAN's IPv6 prefix, such as fd42:10::/64.
    pub cidr: String,
    /// The VLAN's IPv6 router (often link-local, fe80::1): the pods' v6
    /// replies to routed clients go through it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// The DHCP pod advertises the prefix (SLAAC, router lifetime 0: the
    /// VLAN's router stays the default router) with the O flag and the DNS
    /// pod's serverIPv6, and answers stateless DHCPv6 with the same.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub router_advertisements: bool,
    /// Stateful DHCPv6: the DHCP pod leases v6 addresses (IA_NA) from
    /// this range of the prefix, kept in its lease store beside the v4
    /// leases; with routerAdvertisements the M flag tells hosts to ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_range: Option<RangeV6>,
}

/// A range of v6 addresses, both ends included.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RangeV6 {
    pub start: String,
    pub end: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAttachmentRef {
    pub kind: AttachmentKind,
    #[schemars(length(min = 1))]
    pub name: String,
    /// A NetworkAttachmentDefinition's namespace (by default the Infra's),
    /// or for a ClusterUserDefinedNetwork the namespace whose generated
    /// NetworkAttachmentDefinition the pods use (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AttachmentKind {
    #[default]
    NetworkAttachmentDefinition,
    ClusterUserDefinedNetwork,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Topology {
    Localnet,
    Layer2,
    Layer3,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum NetworkRole {
    Secondary,
    Primary,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Exposure {
    Layer2,
    #[serde(rename = "BGP")]
    Bgp,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Ipam {
    #[serde(rename = "DHCP")]
    Dhcp,
    External,
    #[serde(rename = "OVNKubernetes")]
    OvnKubernetes,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamedRef {
    #[schemars(length(min = 1))]
    pub name: String,
}

/// The components to run. As with the Go operator, a component whose
/// object is left out is disabled; one that is written is enabled unless it
/// says `enabled: false`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraComponents {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<DhcpSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
}

impl InfraComponents {
    pub fn dhcp_enabled(&self) -> Option<&DhcpSpec> {
        self.dhcp.as_ref().filter(|d| d.enabled)
    }

    pub fn dns_enabled(&self) -> Option<&DnsSpec> {
        self.dns.as_ref().filter(|d| d.enabled)
    }

    pub fn proxy_enabled(&self) -> Option<&ProxySpec> {
        self.proxy.as_ref().filter(|p| p.enabled)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The DHCP pod's static address on the VLAN, optionally with the
    /// VLAN's prefix length (`192.168.100.2/24`).
    #[serde(rename = "serverIP", default, skip_serializing_if = "Option::is_none")]
    pub server_ip: Option<String>,
    /// A causeway addition: the pod's static IPv6 address on the VLAN
    /// (inside networkConfig.ipv6.cidr), optionally with its prefix length.
    #[serde(
        rename = "serverIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub server_ipv6: Option<String>,
    /// 1 (the default) or 2, a causeway addition: two pods run the
    /// component, one active holding serverIP and one standing by; a
    /// coordination.k8s.io Lease settles which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    /// Such as 1h or 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_time: Option<String>,
    /// Accepted for compatibility and ignored (a warning condition says
    /// so): every component runs the operator's causeway image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Fixed addresses for known clients.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
}

impl Default for DhcpSpec {
    fn default() -> Self {
        DhcpSpec {
            enabled: true,
            server_ip: None,
            server_ipv6: None,
            replicas: None,
            range_start: None,
            range_end: None,
            lease_time: None,
            image: None,
            reservations: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub mac: String,
    pub ip: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DnsSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The DNS pod's static address on the VLAN (optionally with the
    /// VLAN's prefix length); the DNS server DHCP hands out.
    #[serde(rename = "serverIP", default, skip_serializing_if = "Option::is_none")]
    pub server_ip: Option<String>,
    /// A causeway addition: the pod's static IPv6 address on the VLAN
    /// (inside networkConfig.ipv6.cidr), optionally with its prefix length.
    #[serde(
        rename = "serverIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub server_ipv6: Option<String>,
    /// 1 (the default) or 2, a causeway addition: two pods run the
    /// component, one active holding serverIP and one standing by; a
    /// coordination.k8s.io Lease settles which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// Accepted for compatibility and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra records, as in the appliance config's `dns.records`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<DnsRecordSpec>,
}

impl Default for DnsSpec {
    fn default() -> Self {
        DnsSpec {
            enabled: true,
            server_ip: None,
            server_ipv6: None,
            replicas: None,
            base_domain: None,
            cluster_name: None,
            image: None,
            records: Vec::new(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DnsRecordSpec {
    pub name: String,
    /// A, AAAA, CNAME, SRV, TXT or PTR.
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The proxy pod's static address on the VLAN (optionally with the
    /// VLAN's prefix length); api, api-int, oauth, ignition, konnectivity
    /// and, with an ingress target, *.apps resolve to it on the VLAN.
    #[serde(rename = "serverIP", default, skip_serializing_if = "Option::is_none")]
    pub server_ip: Option<String>,
    /// A causeway addition: the pod's static IPv6 address on the VLAN
    /// (inside networkConfig.ipv6.cidr), optionally with its prefix length.
    #[serde(
        rename = "serverIPv6",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub server_ipv6: Option<String>,
    /// 1 (the default) or 2, a causeway addition: two pods run the
    /// component, one active holding serverIP and one standing by; a
    /// coordination.k8s.io Lease settles which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Where clients off the VLAN (the default DNS view) reach the control
    /// plane: an IP address, or a Service as `name` (in the Infra's
    /// namespace) or `name.namespace`, whose ClusterIP is used and followed
    /// when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_proxy_service: Option<String>,
    /// By default `<hostedCluster namespace>-<name>`, or
    /// `clusters-<clusterName>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_namespace: Option<String>,
    /// The kube-apiserver Service's name in the control-plane namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_service: Option<String>,
    /// Accepted for compatibility and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Accepted for compatibility and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_image: Option<String>,
    /// Accepted for compatibility and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_image: Option<String>,
    /// `host:port` of the hosted cluster's ingress for `*.apps` on 443 (and
    /// `ingressHttp` for 80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_https: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_http: Option<String>,
    /// Listeners beyond the derived ones, as in the appliance config's
    /// `proxy.listeners`: `{port, upstream}` or `{port, routes, default}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_routes: Vec<ProxyRouteSpec>,
    /// A LoadBalancer Service `<infra>-proxy-external` in this namespace
    /// exposing only the proxy's port 443 routes, mainly for OAuth: the Go
    /// operator's place for it before it moved to each
    /// InfraClusterAttachment (where causeway takes it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_service: Option<InfraExternalServiceSpec>,
}

/// The Infra's external Service for the proxy: an attachment's fields, and
/// the OAuth names of its attachments to publish.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct InfraExternalServiceSpec {
    #[serde(flatten)]
    pub service: super::attachment::ExternalServiceSpec,
    /// Adds `oauth.<domain>` of every attachment the Infra serves whose
    /// `Ready` is True to the `external-dns.alpha.kubernetes.io/hostname`
    /// annotation, after the names given there.
    #[serde(
        rename = "publishAttachmentOAuths",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub publish_attachment_oauths: bool,
}

impl Default for ProxySpec {
    fn default() -> Self {
        ProxySpec {
            enabled: true,
            server_ip: None,
            server_ipv6: None,
            replicas: None,
            internal_proxy_service: None,
            control_plane_namespace: None,
            api_server_service: None,
            image: None,
            proxy_image: None,
            manager_image: None,
            ingress_https: None,
            ingress_http: None,
            extra_routes: Vec::new(),
            external_service: None,
        }
    }
}

/// One extra TCP listener of the proxy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyRouteSpec {
    pub port: u16,
    /// `host:port` every connection goes to.
    pub upstream: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterRef {
    pub name: String,
    /// By default the Infra's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSpec {
    /// Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// Remote client subnets behind the VLAN gateway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_routes: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Readiness per component, as in the Go operator's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component_status: Option<ComponentStatus>,
    /// The InfraClusterAttachments naming this Infra, and how many are
    /// served; absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<AttachmentCounts>,
    /// A causeway addition: the control-plane namespaces holding the
    /// policy that lets the proxy in, so one no longer served is cleaned
    /// up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control_plane_namespaces: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentCounts {
    pub total: i32,
    /// Served: valid and in no conflict over a HostedCluster or domain.
    pub ready: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentStatus {
    #[serde(default)]
    pub dhcp_ready: bool,
    #[serde(default)]
    pub dns_ready: bool,
    #[serde(default)]
    pub proxy_ready: bool,
    /// A causeway addition, for a component with two replicas: which one
    /// is active and how many are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<ReplicaStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<ReplicaStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ReplicaStatus>,
}

/// A component with two replicas, as its workload and its Lease show it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub replicas: i32,
    #[serde(default)]
    pub ready_replicas: i32,
    /// The pod holding the component's Lease, so its serverIP; absent
    /// while nobody does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_replica: Option<String>,
}

/// The CRD as YAML, exactly as `charts/causeway/templates/crd-infra.yaml`
/// holds it.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let body = serde_saphyr::to_string(&Infra::crd())?;
    Ok(format!(
        "# Generated by `causeway operator crd`; do not edit. A test fails when\n# this file differs from what the code generates.\n{body}"
    ))
}
