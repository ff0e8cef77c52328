//! `InfraClusterAttachment`: one hosted cluster bound to an Infra's VLAN
//! stack, so several hosted clusters share one VLAN's DHCP, DNS and proxy.
//! The resource, and the pure [`aggregate`] that decides which
//! attachments an Infra serves: both the Infra controller (which renders
//! them) and the attachment controller (which reports on each) run it over
//! the same attachments, so they agree.
//!
//! Conflicts exclude what conflicts and nothing else: two attachments for
//! one HostedCluster, or for one domain, are both left out (neither is
//! more right than the other, and serving one would depend on names);
//! a worker address two attachments claim is dropped from both, their
//! names still served.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use causeway_config::{valid_label, valid_name, NameRules};

/// The Go Infra operator's finalizer on the attachments it managed. Its
/// presence says the attachment's apps ingress objects are the Go
/// operator's (and their names its defaults); causeway releases it, with
/// the cleanup it stood for, when the attachment is deleted.
pub const GO_OPERATOR_FINALIZER: &str = "hostedcluster.densityops.com/apps-ingress-cleanup";

/// Who made an attachment's apps ingress objects first, which decides the
/// names they default to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lineage {
    Causeway,
    /// The Go operator: its Service `oooi-ingress`, and MetalLB installed in
    /// `openshift-operators` with the pool and advertisement beside it.
    GoOperator,
}

impl Lineage {
    pub fn of(att: &InfraClusterAttachment) -> Self {
        let go = att
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == GO_OPERATOR_FINALIZER);
        if go {
            Lineage::GoOperator
        } else {
            Lineage::Causeway
        }
    }
}

fn default_hosted_cluster_namespace() -> String {
    "clusters".into()
}

/// A hosted cluster bound to an Infra's shared DHCP, DNS and proxy.
// The printer columns repeat `type_ = "string"` by nature.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hostedcluster.densityops.com",
    version = "v1alpha1",
    kind = "InfraClusterAttachment",
    plural = "infraclusterattachments",
    shortname = "infraattachment",
    shortname = "ica",
    namespaced,
    status = "InfraClusterAttachmentStatus",
    doc = "A hosted cluster served by an Infra's shared DHCP, DNS and proxy on its VLAN",
    annotation("helm.sh/resource-policy", "keep"),
    printcolumn(name = "Infra", type_ = "string", json_path = ".spec.infraRef.name"),
    printcolumn(
        name = "HostedCluster",
        type_ = "string",
        json_path = ".spec.hostedClusterRef.name"
    ),
    printcolumn(name = "Domain", type_ = "string", json_path = ".status.domain"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InfraClusterAttachmentSpec {
    /// The Infra, in this namespace, whose VLAN stack serves the cluster.
    pub infra_ref: InfraRef,
    pub hosted_cluster_ref: AttachedClusterRef,
    pub dns: AttachmentDns,
    /// Where the cluster's control plane runs; by default
    /// `<hostedClusterRef.namespace>-<hostedClusterRef.name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_namespace: Option<String>,
    /// The kube-apiserver Service in the control-plane namespace; by default
    /// `kube-apiserver`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server_service: Option<String>,
    /// A causeway addition: the cluster's worker addresses (or CIDRs)
    /// inside the Infra's CIDR. A connection from one that names no
    /// cluster (`kubernetes.default.svc`, or the API by address on 6443)
    /// goes to this cluster's API server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<String>,
    /// A LoadBalancer Service on the management cluster exposing only the
    /// proxy's port 443 (mainly for OAuth), with labels and annotations
    /// for ExternalDNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_service: Option<ExternalServiceSpec>,
    /// `*.apps` on the VLAN: the hosted cluster's router gets a MetalLB
    /// address on the VLAN, which DNS and the proxy point `*.apps` at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps_ingress: Option<AppsIngressSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppsIngressSpec {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub metallb: AppsMetalLb,
    #[serde(default)]
    pub service: AppsService,
    #[serde(default)]
    pub ports: AppsPorts,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppsMetalLb {
    /// The IPAddressPool made in the hosted cluster; required when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_pool_name: Option<String>,
    /// Its addresses on the VLAN, a range (`192.0.2.200-192.0.2.209`) or a
    /// CIDR, inside the Infra's CIDR; required when enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address_pool_range: Option<String>,
    /// By default `advertise-<addressPoolName>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2_advertisement_name: Option<String>,
    /// Where MetalLB runs in the hosted cluster, and so where its pool and
    /// advertisement go; by default `metallb-system`, or
    /// `openshift-operators` when MetalLB is installed by causeway (or was
    /// by the Go operator), which is the only namespace allowed then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// A causeway addition: install MetalLB (an OLM Subscription and the
    /// MetalLB resource, in `openshift-operators`) when it is not there.
    /// Off by default: MetalLB in a hosted cluster is its owner's, and is
    /// used when present. An attachment the Go operator made keeps the
    /// install it had.
    #[serde(default)]
    pub install: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppsService {
    /// By default `causeway-apps` (`oooi-ingress` on an attachment the Go
    /// operator made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// By default `openshift-ingress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppsPorts {
    /// By default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<i32>,
    /// By default 443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https: Option<i32>,
}

/// Where apps ingress stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppsIngressStatus {
    /// `Pending`, `Ready` or `Degraded`.
    pub phase: String,
    pub reason: String,
    pub message: String,
    #[serde(
        rename = "externalIP",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub external_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_hostname: Option<String>,
    /// What was made in the hosted cluster, so a rename, a disable or a
    /// deletion removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<AppliedApps>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedApps {
    pub service_name: String,
    pub service_namespace: String,
    pub address_pool_name: String,
    pub l2_advertisement_name: String,
    #[serde(rename = "metalLBNamespace")]
    pub metallb_namespace: String,
    /// MetalLB was installed by causeway (and goes with it).
    #[serde(default)]
    pub installed_metallb: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalServiceSpec {
    #[serde(default)]
    pub enabled: bool,
    /// The MetalLB pool to take the address from: the
    /// `metallb.universe.tf/address-pool` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_pool_name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraRef {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachedClusterRef {
    pub name: String,
    #[serde(default = "default_hosted_cluster_namespace")]
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentDns {
    /// One DNS label, such as `hc1`.
    pub cluster_name: String,
    /// Such as `clusters.example.com`.
    pub base_domain: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfraClusterAttachmentStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `<clusterName>.<baseDomain>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_namespace: Option<String>,
    /// The worker addresses the proxy routes by, after conflicts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routed_workers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps_ingress_status: Option<AppsIngressStatus>,
}

/// Condition reasons, as the Go operator names them.
pub const DUPLICATE_HOSTED_CLUSTER: &str = "DuplicateHostedCluster";
pub const DUPLICATE_HOSTNAME: &str = "DuplicateHostname";
pub const DUPLICATE_SOURCE_IP: &str = "DuplicateSourceIP";
pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
pub const INFRA_NOT_FOUND: &str = "InfraNotFound";

/// An attachment as the aggregation reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: String,
    /// `<namespace>/<name>` of the HostedCluster.
    pub hosted_cluster: String,
    pub cluster_name: String,
    pub base_domain: String,
    pub control_plane_namespace: String,
    pub api_server_service: Option<String>,
    pub workers: Vec<Ipv4Net>,
    /// Its external Service is enabled: the proxy takes 443's routes on
    /// the pod network too.
    pub external: bool,
    /// Its apps' load balancer on the VLAN, once apps ingress is ready.
    pub apps: Option<AppsEndpoint>,
    /// Its status says `Ready` True (as last written): what the Infra's
    /// `proxy.externalService.publishAttachmentOAuths` goes by.
    pub ready: bool,
}

/// The hosted cluster's router on the VLAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppsEndpoint {
    pub address: Ipv4Addr,
    pub http: u16,
    pub https: u16,
}

impl Candidate {
    pub fn domain(&self) -> String {
        format!("{}.{}", self.cluster_name, self.base_domain)
    }
}

/// Reads one attachment; `Err` holds every reason it cannot be served,
/// by field. `cidr` is the Infra's VLAN, which worker addresses must lie
/// in.
pub fn candidate(
    name: &str,
    spec: &InfraClusterAttachmentSpec,
    cidr: Option<Ipv4Net>,
) -> Result<Candidate, Vec<String>> {
    let mut errors = Vec::new();
    let cluster_name = spec.dns.cluster_name.trim().to_ascii_lowercase();
    if !valid_label(&cluster_name, NameRules::HOST) {
        errors.push(format!(
            "dns.clusterName: {:?} is not a DNS label such as hc1",
            spec.dns.cluster_name
        ));
    }
    let base_domain = spec
        .dns
        .base_domain
        .trim()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if !valid_name(&base_domain, NameRules::HOST) || !base_domain.contains('.') {
        errors.push(format!(
            "dns.baseDomain: {:?} is not a domain of two labels or more such as example.com",
            spec.dns.base_domain
        ));
    }
    let hc = &spec.hosted_cluster_ref;
    if hc.name.trim().is_empty() {
        errors.push("hostedClusterRef.name: required".into());
    }
    let control_plane_namespace = spec
        .control_plane_namespace
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map_or_else(|| format!("{}-{}", hc.namespace, hc.name), str::to_string);
    if !valid_label(&control_plane_namespace, NameRules::HOST) {
        errors.push(format!(
            "controlPlaneNamespace: {control_plane_namespace:?} is not a namespace name"
        ));
    }
    let mut workers = Vec::new();
    for (i, text) in spec.workers.iter().enumerate() {
        let t = text.trim();
        let parsed = t
            .parse::<Ipv4Net>()
            .ok()
            .or_else(|| t.parse::<Ipv4Addr>().ok().map(Ipv4Net::from));
        match (parsed, cidr) {
            (None, _) => errors.push(format!(
                "workers[{i}]: {t:?} is not an IPv4 address or CIDR (IPv6 is not routed yet)"
            )),
            (Some(n), Some(vlan)) if !vlan.contains(&n.trunc()) => errors.push(format!(
                "workers[{i}]: {} is outside the Infra's networkConfig.cidr {vlan}",
                n.trunc()
            )),
            (Some(n), _) => workers.push(n.trunc()),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(Candidate {
        name: name.to_string(),
        hosted_cluster: format!("{}/{}", hc.namespace, hc.name),
        cluster_name,
        base_domain,
        control_plane_namespace,
        api_server_service: spec
            .api_server_service
            .clone()
            .filter(|s| !s.trim().is_empty()),
        workers,
        external: spec.external_service.as_ref().is_some_and(|e| e.enabled),
        apps: None,
        ready: false,
    })
}

/// The most worker addresses one attachment routes by: past it the list
/// is cut (and logged), as the proxy's route tables stay small.
pub const MAX_WORKERS: usize = 256;

/// Adds to `c` the worker addresses its cluster's Machines report inside
/// `cidr`, each as a /32, after those written in its spec; at most
/// [`MAX_WORKERS`] in all. `machine_addresses` are every address of every
/// Machine in the control-plane namespace.
pub fn add_discovered<'a>(
    c: &mut Candidate,
    machine_addresses: impl IntoIterator<Item = &'a str>,
    cidr: Option<Ipv4Net>,
) {
    let mut found: Vec<Ipv4Net> = machine_addresses
        .into_iter()
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .filter(|ip| cidr.is_some_and(|n| n.contains(ip)))
        .map(Ipv4Net::from)
        .filter(|n| !c.workers.iter().any(|w| w.contains(&n.network())))
        .collect();
    found.sort();
    found.dedup();
    c.workers.extend(found);
    if c.workers.len() > MAX_WORKERS {
        tracing::warn!(attachment = %c.name, found = c.workers.len(), "more worker addresses than routed: the first {MAX_WORKERS} are");
        c.workers.truncate(MAX_WORKERS);
    }
}

/// What the aggregation decided for one attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served; `dropped` are worker addresses left out because another
    /// attachment claims them too, each with that attachment's name.
    Served {
        dropped: Vec<(Ipv4Net, String)>,
    },
    /// Not served: the reason (a condition reason) and a message naming
    /// the other side.
    Excluded {
        reason: &'static str,
        message: String,
    },
    Invalid(Vec<String>),
}

/// Which attachments an Infra serves.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Aggregate {
    /// In name order, with workers after conflicts.
    pub served: Vec<Candidate>,
    pub verdicts: BTreeMap<String, Verdict>,
}

impl Aggregate {
    /// The conflicts, one line each, for the Infra's condition: (reason,
    /// message), sorted.
    pub fn conflicts(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        for v in self.verdicts.values() {
            match v {
                Verdict::Excluded { reason, message } => out.push((reason, message.clone())),
                Verdict::Served { dropped } => {
                    for (net, other) in dropped {
                        out.push((
                            DUPLICATE_SOURCE_IP,
                            format!("worker {net} is claimed by attachment {other:?} too"),
                        ));
                    }
                }
                Verdict::Invalid(_) => {}
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// Decides over `attachments` (each read by [`candidate`]), in name
/// order.
pub fn aggregate(mut attachments: Vec<(String, Result<Candidate, Vec<String>>)>) -> Aggregate {
    attachments.sort_by(|a, b| a.0.cmp(&b.0));
    let mut verdicts = BTreeMap::new();
    let valid: Vec<&Candidate> = attachments
        .iter()
        .filter_map(|(name, c)| match c {
            Ok(c) => Some(c),
            Err(errors) => {
                verdicts.insert(name.clone(), Verdict::Invalid(errors.clone()));
                None
            }
        })
        .collect();
    let mut excluded: BTreeMap<&str, (&'static str, Vec<String>)> = BTreeMap::new();
    for (i, a) in valid.iter().enumerate() {
        for b in &valid[i + 1..] {
            let clash = if a.hosted_cluster == b.hosted_cluster {
                Some((
                    DUPLICATE_HOSTED_CLUSTER,
                    format!("HostedCluster {}", a.hosted_cluster),
                ))
            } else if a.domain() == b.domain() {
                Some((DUPLICATE_HOSTNAME, format!("domain {}", a.domain())))
            } else {
                None
            };
            if let Some((reason, what)) = clash {
                let line = format!("attachments {:?} and {:?} declare {what}", a.name, b.name);
                for side in [a, b] {
                    let entry = excluded
                        .entry(side.name.as_str())
                        .or_insert((reason, Vec::new()));
                    entry.1.push(line.clone());
                }
            }
        }
    }
    let mut served: Vec<Candidate> = valid
        .iter()
        .filter(|c| !excluded.contains_key(c.name.as_str()))
        .map(|c| (*c).clone())
        .collect();
    for (name, (reason, lines)) in &excluded {
        verdicts.insert(
            name.to_string(),
            Verdict::Excluded {
                reason,
                message: lines.join("; "),
            },
        );
    }
    // A worker address two served attachments claim is routed for neither.
    let mut dropped: BTreeMap<String, Vec<(Ipv4Net, String)>> = BTreeMap::new();
    for i in 0..served.len() {
        for j in i + 1..served.len() {
            for a in &served[i].workers {
                for b in &served[j].workers {
                    if a.contains(&b.network()) || b.contains(&a.network()) {
                        dropped
                            .entry(served[i].name.clone())
                            .or_default()
                            .push((*a, served[j].name.clone()));
                        dropped
                            .entry(served[j].name.clone())
                            .or_default()
                            .push((*b, served[i].name.clone()));
                    }
                }
            }
        }
    }
    for c in &mut served {
        let gone = dropped.get(&c.name).cloned().unwrap_or_default();
        c.workers.retain(|w| !gone.iter().any(|(g, _)| g == w));
        verdicts.insert(c.name.clone(), Verdict::Served { dropped: gone });
    }
    Aggregate { served, verdicts }
}

/// The CRD as YAML, exactly as the chart holds it.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let body = serde_saphyr::to_string(&InfraClusterAttachment::crd())?;
    Ok(format!(
        "# Generated by `causeway operator crd`; do not edit. A test fails when\n# this file differs from what the code generates.\n{body}"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(cluster: &str, domain: &str, hc: &str, workers: &[&str]) -> InfraClusterAttachmentSpec {
        InfraClusterAttachmentSpec {
            infra_ref: InfraRef {
                name: "vlan100".into(),
            },
            hosted_cluster_ref: AttachedClusterRef {
                name: hc.into(),
                namespace: "clusters".into(),
            },
            dns: AttachmentDns {
                cluster_name: cluster.into(),
                base_domain: domain.into(),
            },
            workers: workers.iter().map(|w| w.to_string()).collect(),
            ..InfraClusterAttachmentSpec::default()
        }
    }

    fn cidr() -> Option<Ipv4Net> {
        Some("192.168.100.0/24".parse().unwrap())
    }

    fn read(name: &str, s: InfraClusterAttachmentSpec) -> (String, Result<Candidate, Vec<String>>) {
        (name.to_string(), candidate(name, &s, cidr()))
    }

    #[test]
    fn defaults_follow_hypershift() {
        let c = candidate("a", &spec("HC1", "Example.com.", "hc1", &[]), cidr()).unwrap();
        assert_eq!(c.domain(), "hc1.example.com");
        assert_eq!(c.control_plane_namespace, "clusters-hc1");
        assert_eq!(c.hosted_cluster, "clusters/hc1");
    }

    #[test]
    fn bad_fields_are_each_named() {
        let mut s = spec("a.b", "localhost", "", &["10.0.0.1", "nope"]);
        s.control_plane_namespace = Some("Bad_NS".into());
        assert_eq!(
            candidate("a", &s, cidr()).unwrap_err(),
            vec![
                "dns.clusterName: \"a.b\" is not a DNS label such as hc1",
                "dns.baseDomain: \"localhost\" is not a domain of two labels or more such as example.com",
                "hostedClusterRef.name: required",
                "controlPlaneNamespace: \"Bad_NS\" is not a namespace name",
                "workers[0]: 10.0.0.1/32 is outside the Infra's networkConfig.cidr 192.168.100.0/24",
                "workers[1]: \"nope\" is not an IPv4 address or CIDR (IPv6 is not routed yet)",
            ]
        );
    }

    #[test]
    fn conflicts_exclude_both_sides_and_only_them() {
        let agg = aggregate(vec![
            read("c", spec("hc3", "example.com", "hc3", &[])),
            read("a", spec("hc1", "example.com", "hc1", &[])),
            read("b", spec("other", "example.com", "hc1", &[])),
            read("d", spec("hc3", "example.com", "hc4", &[])),
            read("e", spec("hc5", "example.com", "hc5", &[])),
        ]);
        let served: Vec<&str> = agg.served.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(served, vec!["e"]);
        assert_eq!(
            agg.verdicts["a"],
            Verdict::Excluded {
                reason: DUPLICATE_HOSTED_CLUSTER,
                message: "attachments \"a\" and \"b\" declare HostedCluster clusters/hc1".into()
            }
        );
        assert_eq!(
            agg.verdicts["d"],
            Verdict::Excluded {
                reason: DUPLICATE_HOSTNAME,
                message: "attachments \"c\" and \"d\" declare domain hc3.example.com".into()
            }
        );
        assert_eq!(agg.conflicts().len(), 2);
    }

    #[test]
    fn a_shared_worker_is_dropped_from_both_and_their_names_stay() {
        let agg = aggregate(vec![
            read(
                "a",
                spec(
                    "hc1",
                    "example.com",
                    "hc1",
                    &["192.168.100.20", "192.168.100.30"],
                ),
            ),
            read(
                "b",
                spec(
                    "hc2",
                    "example.com",
                    "hc2",
                    &["192.168.100.20/31", "192.168.100.40"],
                ),
            ),
        ]);
        assert_eq!(agg.served.len(), 2);
        assert_eq!(
            agg.served[0].workers,
            vec!["192.168.100.30/32".parse().unwrap()]
        );
        assert_eq!(
            agg.served[1].workers,
            vec!["192.168.100.40/32".parse().unwrap()]
        );
        assert_eq!(
            agg.conflicts(),
            vec![
                (
                    DUPLICATE_SOURCE_IP,
                    "worker 192.168.100.20/31 is claimed by attachment \"a\" too".to_string()
                ),
                (
                    DUPLICATE_SOURCE_IP,
                    "worker 192.168.100.20/32 is claimed by attachment \"b\" too".to_string()
                ),
            ]
        );
    }

    #[test]
    fn machines_add_their_in_vlan_addresses_once_each() {
        let mut c = candidate(
            "a",
            &spec("hc1", "example.com", "hc1", &["192.168.100.20"]),
            cidr(),
        )
        .unwrap();
        add_discovered(
            &mut c,
            [
                "192.168.100.31",
                "10.128.0.7",
                "192.168.100.20",
                "fe80::1",
                "192.168.100.31",
                "hc1-worker-0",
            ],
            cidr(),
        );
        let shown: Vec<String> = c.workers.iter().map(ToString::to_string).collect();
        assert_eq!(shown, vec!["192.168.100.20/32", "192.168.100.31/32"]);
        let many: Vec<String> = (0..300)
            .map(|i| format!("192.168.{}.{}", 100 + i / 250, i % 250 + 1))
            .collect();
        let mut c = candidate(
            "b",
            &spec("hc2", "example.com", "hc2", &[]),
            Some("192.168.0.0/16".parse().unwrap()),
        )
        .unwrap();
        add_discovered(
            &mut c,
            many.iter().map(String::as_str),
            Some("192.168.0.0/16".parse().unwrap()),
        );
        assert_eq!(c.workers.len(), MAX_WORKERS);
    }

    #[test]
    fn when_one_side_goes_the_other_is_served_again() {
        let both = aggregate(vec![
            read("a", spec("hc1", "example.com", "hc1", &[])),
            read("b", spec("hc1", "example.com", "hc2", &[])),
        ]);
        assert!(both.served.is_empty());
        let one = aggregate(vec![read("b", spec("hc1", "example.com", "hc2", &[]))]);
        assert_eq!(one.served.len(), 1);
        assert_eq!(one.verdicts["b"], Verdict::Served { dropped: vec![] });
    }
}
