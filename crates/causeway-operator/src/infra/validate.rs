//! From an `Infra` (and what the cluster says about it) to a [`Plan`]: per
//! enabled component, the appliance config its pod runs, built as the
//! config crate's own file types and checked by the config crate's own
//! validator, exactly as the pod will load it. Each error the validator
//! reports by its config path is reported back by the Infra field it came
//! from. Pure, so every message is tested without a cluster.
//!
//! What only an Infra can get wrong (a missing `serverIP`, a prefix that is
//! not the VLAN's, a Service that is not there) is checked here; everything
//! about addresses, ranges, names and durations is the validator's.

use std::net::{Ipv4Addr, Ipv6Addr};

use causeway_config::{
    Config, FileAdmin, FileCluster, FileConfig, FileDhcp, FileDhcpListen, FileDns, FileDuration,
    FileHa, FileHaLease, FileLog, FileNetwork, FileProxy, FileRange, FileRecord, FileReplica,
    FileReservation, FileRoutedV6, FileRouting, FileServedCluster, FileSubnet, FileView, HaMode,
};
use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::Value;

use super::attachment::{
    AttachedClusterRef, AttachmentDns, Candidate, InfraClusterAttachment,
    InfraClusterAttachmentSpec, InfraRef,
};
use super::crd::{DhcpSpec, DnsSpec, InfraSpec, ProxySpec};
use super::plan::{
    names, Component, ComponentPlan, ExternalServicePlan, Plan, ADMIN_PORT, HA_DIR, HA_KEY,
    LEASE_DIR, MAX_REPLICAS, VLAN_INTERFACE,
};

/// What the operator learned from a referenced HostedCluster (its name,
/// namespace and base domain are what validation reads).
pub use crate::hosted::facts::HostedClusterFacts;

/// What `internalProxyService` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InternalProxyTarget {
    Address(Ipv4Addr),
    Service { namespace: String, name: String },
}

/// What the cluster says about a Service `internalProxyService` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceAddress {
    ClusterIp(Ipv4Addr),
    /// Headless, or IPv6 only.
    NoClusterIp,
    Missing,
}

/// `internalProxyService` read as the Go operator's users write it: an
/// address, or a Service as `name`, `name.namespace` or
/// `name.namespace.svc[.cluster.local]`.
pub fn internal_proxy_target(p: &ProxySpec, infra_namespace: &str) -> Option<InternalProxyTarget> {
    let text = p.internal_proxy_service.as_deref()?.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(ip) = text.parse() {
        return Some(InternalProxyTarget::Address(ip));
    }
    let text = text
        .strip_suffix(".svc.cluster.local")
        .or_else(|| text.strip_suffix(".svc"))
        .unwrap_or(text);
    let (name, namespace) = match text.split_once('.') {
        Some((name, ns)) => (name, ns),
        None => (text, infra_namespace),
    };
    Some(InternalProxyTarget::Service {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// The control-plane namespace: `controlPlaneNamespace`, else HyperShift's
/// `<namespace>-<name>` of the referenced HostedCluster, else
/// `clusters-<clusterName>`. From the spec alone, so cleanup can find it
/// whatever the cluster says by then.
pub fn control_plane_namespace(spec: &InfraSpec, infra_namespace: &str) -> Option<String> {
    let given = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
    let comps = &spec.infra_components;
    comps
        .proxy
        .as_ref()
        .and_then(|p| given(&p.control_plane_namespace))
        .or_else(|| {
            spec.hosted_cluster_ref.as_ref().map(|r| {
                let ns = given(&r.namespace).unwrap_or_else(|| infra_namespace.to_string());
                format!("{ns}-{}", r.name)
            })
        })
        .or_else(|| {
            comps
                .dns
                .as_ref()
                .and_then(|d| given(&d.cluster_name))
                .map(|n| format!("clusters-{n}"))
        })
}

/// Errors, deduplicated in order (the components' configs share sections,
/// so the validator may report one Infra field once per component).
#[derive(Default)]
struct Errors(Vec<String>);

impl Errors {
    fn fail(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        if !self.0.contains(&msg) {
            self.0.push(msg);
        }
    }
}

/// A `serverIP` as text for the config (the validator checks the address),
/// its prefix, when written, checked against the VLAN's.
fn server_address(
    e: &mut Errors,
    path: &str,
    text: Option<&str>,
    cidr: Option<Ipv4Net>,
) -> Option<String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        e.fail(format!("{path}: required when the component is enabled"));
        return None;
    };
    let (address, prefix) = match text.split_once('/') {
        Some((a, p)) => (a.trim(), Some(p)),
        None => (text, None),
    };
    // An address that is not one would be reported once per config that
    // names it; said once here instead.
    if address.parse::<Ipv4Addr>().is_err() {
        e.fail(format!("{path}: {address:?} is not an IPv4 address"));
        return None;
    }
    let Some(prefix) = prefix else {
        return Some(address.to_string());
    };
    match (prefix.trim().parse::<u8>(), cidr) {
        (Ok(p), Some(net)) if p != net.prefix_len() => {
            e.fail(format!(
                "{path}: prefix /{p} differs from networkConfig.cidr {net}"
            ));
            None
        }
        (Ok(_), _) => Some(address.trim().to_string()),
        (Err(_), _) => {
            e.fail(format!("{path}: {prefix:?} is not a prefix length"));
            None
        }
    }
}

/// `replicas` of one component: 1 when left out.
fn replicas(e: &mut Errors, path: &str, given: Option<i32>) -> i32 {
    match given.unwrap_or(1) {
        n @ 1..=MAX_REPLICAS => n,
        n => {
            e.fail(format!(
                "{path}: {n} is not 1 or 2 (two replicas are one active and one standing by)"
            ));
            1
        }
    }
}

/// The `ha` section of a component with two replicas: the StatefulSet's
/// two pods, each reached under the peers Service, the Lease as witness,
/// and `address` (the serverIP) moving between them on the VLAN.
fn ha_section(
    infra_name: &str,
    infra_namespace: &str,
    component: Component,
    address: String,
) -> FileHa {
    FileHa {
        enabled: true,
        mode: HaMode::Lease,
        // Each pod learns its own name from CAUSEWAY_HA_NODE: one config
        // serves both.
        node: None,
        replicas: (0..2)
            .map(|i| FileReplica {
                name: names::replica(infra_name, component, i),
                address: names::replica_address(infra_name, infra_namespace, component, i),
                priority: None,
                // Lease mode: the Lease, not a second advert path, settles
                // who holds the addresses when the pod network is cut.
                vlan_address: None,
            })
            .collect(),
        listen: None,
        // The peers reach each other over the pod network; adverts and the
        // lease stream are never received on the VLAN.
        listen_interface: Some("eth0".into()),
        key_file: format!("{HA_DIR}/{HA_KEY}").into(),
        interface: VLAN_INTERFACE.into(),
        addresses: vec![address],
        // The Infra has no v6 network yet.
        addresses_v6: Vec::new(),
        preempt: false,
        advert_interval: None,
        dead_adverts: None,
        replication_timeout: None,
        lease: Some(FileHaLease {
            // The pod's own namespace, where the operator made the Lease.
            namespace: None,
            name: names::lease(infra_name, component),
            renew_interval: None,
            api_timeout: None,
        }),
    }
}

/// Where each rendered config path came from in the Infra.
struct Origins {
    /// (config path prefix, Infra path), longest prefix first.
    map: Vec<(String, String)>,
}

impl Origins {
    fn new() -> Self {
        Origins { map: Vec::new() }
    }

    fn add(&mut self, config: impl Into<String>, infra: impl Into<String>) {
        self.map.push((config.into(), infra.into()));
    }

    fn knows(&self, config_path: &str) -> bool {
        !self.infra_path(config_path).starts_with("spec (")
    }

    /// The Infra path of a config path: the longest known prefix, with what
    /// follows it kept (`dhcp.subnets[0].reservations[2].mac`).
    fn infra_path(&self, config_path: &str) -> String {
        let best = self
            .map
            .iter()
            .filter(|(prefix, _)| {
                config_path == prefix
                    || config_path.starts_with(&format!("{prefix}."))
                    || config_path.starts_with(&format!("{prefix}["))
            })
            .max_by_key(|(prefix, _)| prefix.len());
        match best {
            Some((prefix, infra)) => format!("{infra}{}", &config_path[prefix.len()..]),
            None => format!("spec (rendered config {config_path})"),
        }
    }

    /// A validator message with the config paths it names (`is outside
    /// network.cidr`) put in Infra terms too.
    fn infra_message(&self, message: &str) -> String {
        let mut known: Vec<&(String, String)> = self.map.iter().collect();
        known.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let mut out = message.to_string();
        for (prefix, infra) in known {
            if out.contains(prefix.as_str()) {
                out = out.replace(prefix.as_str(), infra);
            }
        }
        out
    }
}

/// A config as the ConfigMap holds it: YAML without the unset fields.
pub fn config_yaml(file: &FileConfig) -> String {
    // Unset and empty mean the same to the validator for every field the
    // operator leaves empty, and the ConfigMap reads better without them.
    fn prune(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.values_mut().for_each(prune);
                map.retain(|_, v| match v {
                    Value::Null => false,
                    Value::Array(a) => !a.is_empty(),
                    Value::Object(o) => !o.is_empty(),
                    _ => true,
                });
            }
            Value::Array(items) => items.iter_mut().for_each(prune),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(file).unwrap_or(Value::Null);
    prune(&mut value);
    let body = serde_saphyr::to_string(&value).unwrap_or_default();
    format!("# Rendered by causeway-operator; edits are overwritten.\n{body}")
}

/// Validates `spec` of the Infra `infra_name` (its objects' names, and with
/// two replicas the pods' names, derive from it). `hosted_cluster` is what
/// the referenced HostedCluster says, when there is a reference and it was
/// read; `services` answers for the Service `internalProxyService` may name.
/// `attached` are the clusters its InfraClusterAttachments bring, conflicts
/// already settled ([`super::attachment::aggregate`]); when there are any,
/// they are the clusters served, and the Infra's own cluster fields (the
/// older, single-cluster form) are ignored.
pub fn validate(
    spec: &InfraSpec,
    infra_name: &str,
    infra_namespace: &str,
    hosted_cluster: Option<&HostedClusterFacts>,
    services: &dyn Fn(&str, &str) -> ServiceAddress,
    attached: &[Candidate],
) -> Result<Plan, Vec<String>> {
    let mut e = Errors::default();
    let net = &spec.network_config;
    let comps = &spec.infra_components;
    let Some(cidr) = net.cidr.trim().parse::<Ipv4Net>().ok().map(|n| n.trunc()) else {
        // Everything else is placed in the VLAN: nothing more can be said.
        return Err(vec![format!(
            "networkConfig.cidr: {:?} is not an IPv4 CIDR such as 192.168.100.0/24",
            net.cidr
        )]);
    };
    let network =
        super::network::normalize(net, infra_namespace, comps.dhcp_enabled().is_some(), cidr);
    if let Err(errors) = &network {
        for err in errors {
            e.fail(err.clone());
        }
    }
    check_dns_servers(&mut e, spec);
    let mut warnings = Vec::new();
    let served = served_clusters(&mut e, &mut warnings, spec, hosted_cluster, attached);
    let proxy_spec = comps.proxy_enabled();
    let mut waiting = Vec::new();
    if proxy_spec.is_some() && attached.is_empty() && !served.legacy_named {
        waiting.push((
            Component::Proxy,
            "no hosted cluster to route to: create an InfraClusterAttachment for this Infra (or set dns.clusterName and dns.baseDomain)".to_string(),
        ));
    }
    let placed = place_components(&mut e, spec, cidr, infra_name);
    let internal_address = internal_proxy_address(&mut e, proxy_spec, infra_namespace, services);
    let control_plane_namespaces =
        served_control_plane_namespaces(spec, infra_namespace, attached, served.single_cluster);
    let has_ingress =
        proxy_spec.is_some_and(|p| p.ingress_https.is_some() || p.ingress_http.is_some());
    if !attached.is_empty() && has_ingress {
        warnings.push("infraComponents.proxy.ingressHttps and ingressHttp are ignored: with InfraClusterAttachments each cluster's apps are its attachment's".to_string());
    }
    let proxy_configured = proxy_spec.is_some() && waiting.is_empty();
    let infra_external = proxy_spec
        .filter(|_| proxy_configured)
        .and_then(|p| p.external_service.as_ref())
        .filter(|x| x.service.enabled)
        .map(|x| external_service_plan(x, attached));
    let render = Render {
        spec,
        infra_name,
        infra_namespace,
        cidr,
        attached,
        placed: &placed,
        internal_address,
        cluster: match (&served.cluster_name, &served.base_domain) {
            (Some(name), Some(domain)) if served.single_cluster => Some(FileCluster {
                name: name.clone(),
                base_domain: domain.clone(),
            }),
            _ => None,
        },
        control_plane_namespace: control_plane_namespaces
            .first()
            .cloned()
            .filter(|_| served.single_cluster),
        ingress: served.single_cluster && has_ingress,
        external_proxy: proxy_configured
            && (attached.iter().any(|a| a.external) || infra_external.is_some()),
    };

    let mut components = Vec::new();
    let mut unplaced = Vec::new();
    for (component, own_path, address) in &placed.servers {
        let (mut file, mut origins) = render.common(*component, own_path, address);
        match component {
            Component::Dhcp => {
                let Some(d) = comps.dhcp_enabled() else {
                    continue;
                };
                render.dhcp(&mut e, &mut file, &mut origins, d);
            }
            Component::Dns => {
                let Some(d) = comps.dns_enabled() else {
                    continue;
                };
                render.dns(&mut file, &mut origins, d, address);
            }
            Component::Proxy => {
                let Some(p) = proxy_spec.filter(|_| proxy_configured) else {
                    continue;
                };
                render.proxy(&mut file, &mut origins, p, address);
            }
        }
        let replicas = placed.replicas_of(*component);
        if replicas > 1 {
            render.ha(&mut file, &mut origins, *component, own_path, address);
        }
        if let Some(mut plan) =
            checked(&mut e, &mut unplaced, *component, replicas, &file, &origins)
        {
            plan.server_ipv6 = placed.v6_of(*component);
            components.push(plan);
        }
    }
    warnings.extend(ignored_images(spec));
    warnings.extend(infra_apps_ingress_warning(
        spec,
        infra_name,
        infra_namespace,
        hosted_cluster,
    ));

    if e.0.is_empty() {
        for message in unplaced {
            e.fail(message);
        }
    }
    let network = match network {
        Ok(n) if e.0.is_empty() => n,
        _ => return Err(e.0),
    };
    Ok(Plan {
        cidr,
        cidr_v6: placed.cidr_v6,
        nad_name: network.nad_name,
        nad_namespace: network.nad_namespace,
        components,
        control_plane_namespaces,
        waiting,
        warnings,
        external_proxy: render.external_proxy,
        external_service: infra_external,
    })
}

/// The InfraClusterAttachment that runs the apps ingress an Infra carries
/// in the Go operator's first form (`spec.appsIngress`), for the cluster
/// the Infra serves by its own fields: the same cluster name, domain,
/// control-plane namespace and API Service, and the same apps ingress.
/// `Err` says what the Infra lacks to name its cluster.
pub fn attachment_for_infra_apps_ingress(
    spec: &InfraSpec,
    infra_name: &str,
    infra_namespace: &str,
    hosted_cluster: Option<&HostedClusterFacts>,
) -> Option<Result<InfraClusterAttachment, String>> {
    let apps = spec.apps_ingress.as_ref().filter(|a| a.apps.enabled)?;
    let given = |s: Option<&String>| s.filter(|s| !s.trim().is_empty()).cloned();
    let dns = spec.infra_components.dns.as_ref();
    let proxy = spec.infra_components.proxy.as_ref();
    // As the Infra's own DNS and proxy name their cluster: its fields, or
    // its HostedCluster's.
    let cluster_name = given(dns.and_then(|d| d.cluster_name.as_ref()))
        .or_else(|| hosted_cluster.map(|h| h.name.clone()));
    // The Go operator's own default namespace for the ref under appsIngress.
    let hosted = match (&apps.hosted_cluster_ref, &spec.hosted_cluster_ref) {
        (Some(r), _) => Some((
            r.name.clone(),
            given(r.namespace.as_ref()).unwrap_or_else(|| "clusters".into()),
        )),
        (None, Some(r)) => Some((
            r.name.clone(),
            given(r.namespace.as_ref()).unwrap_or_else(|| infra_namespace.to_string()),
        )),
        (None, None) => cluster_name.clone().map(|n| (n, "clusters".to_string())),
    };
    let Some((hosted_name, hosted_namespace)) = hosted else {
        return Some(Err("neither appsIngress.hostedClusterRef, hostedClusterRef nor infraComponents.dns.clusterName names the hosted cluster".into()));
    };
    let Some(base_domain) = given(dns.and_then(|d| d.base_domain.as_ref()))
        .or_else(|| hosted_cluster.and_then(|h| h.base_domain.clone()))
    else {
        return Some(Err(
            "infraComponents.dns.baseDomain is not set, nor its HostedCluster's".into(),
        ));
    };
    let spec = InfraClusterAttachmentSpec {
        infra_ref: InfraRef {
            name: infra_name.to_string(),
        },
        hosted_cluster_ref: AttachedClusterRef {
            name: hosted_name.clone(),
            namespace: hosted_namespace,
        },
        dns: AttachmentDns {
            cluster_name: cluster_name.unwrap_or_else(|| hosted_name.clone()),
            base_domain,
        },
        control_plane_namespace: control_plane_namespace(spec, infra_namespace),
        api_server_service: given(proxy.and_then(|p| p.api_server_service.as_ref())),
        workers: Vec::new(),
        external_service: None,
        apps_ingress: Some(apps.apps.clone()),
    };
    let mut attachment = InfraClusterAttachment::new(&hosted_name, spec);
    attachment.metadata.namespace = Some(infra_namespace.to_string());
    Some(Ok(attachment))
}

/// What the Infra's `IgnoredFields` says of its `spec.appsIngress`.
fn infra_apps_ingress_warning(
    spec: &InfraSpec,
    infra_name: &str,
    infra_namespace: &str,
    hosted_cluster: Option<&HostedClusterFacts>,
) -> Option<String> {
    let converted =
        attachment_for_infra_apps_ingress(spec, infra_name, infra_namespace, hosted_cluster)?;
    let head = "spec.appsIngress (the Go operator's first form) is kept but not run from the Infra";
    let mut text = match converted.map(|a| serde_json::to_string(&a)) {
        Ok(Ok(json)) => format!("{head}: apply this InfraClusterAttachment to run it: {json}"),
        Ok(Err(e)) => format!("{head}: {e}"),
        Err(lacking) => format!("{head}; to run it from an InfraClusterAttachment, the Infra must name its cluster ({lacking})"),
    };
    let second = spec
        .apps_ingress
        .as_ref()
        .and_then(|a| a.base_domain.as_ref())
        .filter(|d| !d.trim().is_empty());
    let first = spec
        .infra_components
        .dns
        .as_ref()
        .and_then(|d| d.base_domain.as_ref());
    if let Some(d) = second.filter(|d| Some(*d) != first) {
        text.push_str(&format!(
            "; its second domain *.apps.{d} has no attachment field and is not served"
        ));
    }
    Some(text)
}

/// The annotation ExternalDNS reads the names to publish from.
pub const EXTERNAL_DNS_HOSTNAME: &str = "external-dns.alpha.kubernetes.io/hostname";

/// The Infra's external Service as its spec and attachments make it. With
/// `publishAttachmentOAuths`, `oauth.<domain>` of each served attachment
/// whose Ready is True joins the ExternalDNS names, after the user's.
fn external_service_plan(
    spec: &super::crd::InfraExternalServiceSpec,
    attached: &[Candidate],
) -> ExternalServicePlan {
    let mut annotations = spec.service.annotations.clone();
    if spec.publish_attachment_oauths {
        let ready: Vec<String> = attached
            .iter()
            .filter(|a| a.ready)
            .map(|a| format!("oauth.{}", a.domain()))
            .collect();
        let given = annotations.get(EXTERNAL_DNS_HOSTNAME).map(String::as_str);
        if let Some(names) = published_names(given, &ready) {
            annotations.insert(EXTERNAL_DNS_HOSTNAME.into(), names);
        }
    }
    if let Some(pool) = spec
        .service
        .address_pool_name
        .as_deref()
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        annotations.insert(super::apps_ingress::POOL_ANNOTATION.into(), pool.into());
    }
    ExternalServicePlan {
        labels: spec.service.labels.clone(),
        annotations,
    }
}

/// The user's comma-separated names (trimmed, empty and repeated ones
/// dropped, order and spelling kept), then the `added` names not already
/// there, sorted; `None` leaves the annotation as the user wrote it (no
/// name to add). A name matches another whatever its case and one
/// trailing dot.
pub fn published_names(given: Option<&str>, added: &[String]) -> Option<String> {
    if added.is_empty() {
        return None;
    }
    let key = |s: &str| {
        let s = s.trim().to_ascii_lowercase();
        s.strip_suffix('.').map(str::to_string).unwrap_or(s)
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out: Vec<String> = Vec::new();
    for name in given.unwrap_or_default().split(',') {
        let name = name.trim();
        if !name.is_empty() && seen.insert(key(name)) {
            out.push(name.to_string());
        }
    }
    let mut more: Vec<String> = added
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty() && seen.insert(key(n)))
        .collect();
    more.sort();
    out.extend(more);
    Some(out.join(","))
}

/// `networkConfig.dnsServers` as only the Infra can get it wrong.
fn check_dns_servers(e: &mut Errors, spec: &InfraSpec) {
    let net = &spec.network_config;
    let comps = &spec.infra_components;
    // Worded as the DNS config's own check, so the two say it once.
    if net.dns_servers.len() > causeway_config::MAX_UPSTREAMS {
        e.fail(format!(
            "networkConfig.dnsServers: {} listed; at most {} (each is tried in turn within one client's timeout)",
            net.dns_servers.len(),
            causeway_config::MAX_UPSTREAMS
        ));
    }
    let system_resolvers = net
        .dns_servers
        .iter()
        .any(|d| d.trim() == causeway_config::SYSTEM_UPSTREAMS);
    if system_resolvers && comps.dns_enabled().is_none() && comps.dhcp_enabled().is_some() {
        e.fail("networkConfig.dnsServers: \"resolv.conf\" means the DNS pod's own resolvers; with DNS disabled, DHCP hands these servers to clients and needs addresses");
    }
}

/// The cluster the older, single-cluster form of the Infra names.
struct Served {
    cluster_name: Option<String>,
    base_domain: Option<String>,
    /// A name or a domain is given (from the Infra or its HostedCluster).
    legacy_named: bool,
    /// Both are, and no attachment overrides them.
    single_cluster: bool,
}

/// The single-cluster form names its cluster on the Infra; with
/// attachments those fields are ignored, and without either the Infra
/// waits for an attachment (DNS forwards meanwhile).
fn served_clusters(
    e: &mut Errors,
    warnings: &mut Vec<String>,
    spec: &InfraSpec,
    hosted_cluster: Option<&HostedClusterFacts>,
    attached: &[Candidate],
) -> Served {
    let comps = &spec.infra_components;
    // Names come from the dns object even when DNS itself is disabled, as
    // the proxy's routes need them too.
    let given = |s: Option<&String>| s.filter(|s| !s.trim().is_empty()).cloned();
    let cluster_name = given(comps.dns.as_ref().and_then(|d| d.cluster_name.as_ref()))
        .or_else(|| hosted_cluster.map(|h| h.name.clone()));
    let base_domain = given(comps.dns.as_ref().and_then(|d| d.base_domain.as_ref()))
        .or_else(|| hosted_cluster.and_then(|h| h.base_domain.clone()));
    let legacy_named = cluster_name.is_some() || base_domain.is_some();
    if !attached.is_empty() {
        if legacy_named || spec.hosted_cluster_ref.is_some() {
            warnings.push("infraComponents.dns.clusterName, dns.baseDomain, proxy.controlPlaneNamespace, proxy.apiServerService and hostedClusterRef are ignored: the Infra's InfraClusterAttachments name its clusters".to_string());
        }
    } else if (comps.dns_enabled().is_some() || comps.proxy_enabled().is_some()) && legacy_named {
        if cluster_name.is_none() {
            e.fail("infraComponents.dns.clusterName: required for DNS and the proxy (or set hostedClusterRef)");
        }
        if base_domain.is_none() {
            e.fail("infraComponents.dns.baseDomain: required for DNS and the proxy (or set hostedClusterRef to a HostedCluster with spec.dns.baseDomain)");
        }
    }
    let single_cluster = attached.is_empty() && cluster_name.is_some() && base_domain.is_some();
    Served {
        cluster_name,
        base_domain,
        legacy_named,
        single_cluster,
    }
}

/// Each enabled component's address on the VLAN and replica count.
struct Placed {
    /// (component, the Infra path of its serverIP, the address), in the
    /// order DHCP, DNS, proxy; a component whose address is wrong is left
    /// out (its error is reported).
    servers: Vec<(Component, &'static str, String)>,
    replica_counts: Vec<(Component, i32)>,
    /// The VLAN's v6 prefix and each component's v6 address, where given.
    cidr_v6: Option<Ipv6Net>,
    servers_v6: Vec<(Component, Ipv6Addr)>,
}

impl Placed {
    fn replicas_of(&self, c: Component) -> i32 {
        self.replica_counts
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(1, |(_, n)| *n)
    }

    fn v6_of(&self, c: Component) -> Option<Ipv6Addr> {
        self.servers_v6
            .iter()
            .find(|(k, _)| *k == c)
            .map(|(_, a)| *a)
    }

    fn address_of(&self, c: Component) -> Option<String> {
        self.servers
            .iter()
            .find(|(k, _, _)| *k == c)
            .map(|(_, _, a)| a.clone())
    }
}

fn place_components(e: &mut Errors, spec: &InfraSpec, cidr: Ipv4Net, infra_name: &str) -> Placed {
    let comps = &spec.infra_components;
    let cidr_v6 =
        spec.network_config
            .ipv6
            .as_ref()
            .and_then(|v6| match v6.cidr.trim().parse::<Ipv6Net>() {
                Ok(n) => Some(n.trunc()),
                Err(_) => {
                    e.fail(format!(
                        "networkConfig.ipv6.cidr: {:?} is not an IPv6 CIDR such as fd42:10::/64",
                        v6.cidr
                    ));
                    None
                }
            });
    if spec
        .network_config
        .ipv6
        .as_ref()
        .is_some_and(|v| v.router_advertisements)
        && comps.dhcp_enabled().is_none()
    {
        e.fail("networkConfig.ipv6.routerAdvertisements: needs infraComponents.dhcp, whose pod sends them");
    }
    if let Some(range) = spec
        .network_config
        .ipv6
        .as_ref()
        .and_then(|v| v.dhcp_range.as_ref())
    {
        if comps.dhcp_enabled().is_none() {
            e.fail("networkConfig.ipv6.dhcpRange: needs infraComponents.dhcp, whose pod leases the addresses");
        }
        let mut end_of = |what: &str, text: &str| match text.trim().parse::<Ipv6Addr>() {
            Ok(a) if cidr_v6.is_none_or(|n| n.contains(&a)) => Some(a),
            Ok(a) => {
                e.fail(format!(
                    "networkConfig.ipv6.dhcpRange.{what}: {a} is outside networkConfig.ipv6.cidr"
                ));
                None
            }
            Err(_) => {
                e.fail(format!(
                    "networkConfig.ipv6.dhcpRange.{what}: {text:?} is not an IPv6 address"
                ));
                None
            }
        };
        if let (Some(start), Some(end)) = (end_of("start", &range.start), end_of("end", &range.end))
        {
            if u128::from(start) > u128::from(end) {
                e.fail(format!(
                    "networkConfig.ipv6.dhcpRange: starts after it ends ({start} > {end})"
                ));
            }
        }
    }
    let mut placed = Placed {
        servers: Vec::new(),
        replica_counts: Vec::new(),
        cidr_v6,
        servers_v6: Vec::new(),
    };
    let given_v6 = [
        (
            Component::Dhcp,
            comps.dhcp_enabled().and_then(|d| d.server_ipv6.as_deref()),
        ),
        (
            Component::Dns,
            comps.dns_enabled().and_then(|d| d.server_ipv6.as_deref()),
        ),
        (
            Component::Proxy,
            comps.proxy_enabled().and_then(|p| p.server_ipv6.as_deref()),
        ),
    ];
    for (component, text) in given_v6 {
        let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
            continue;
        };
        let path = format!("infraComponents.{}.serverIPv6", component.name());
        let Some(net) = placed.cidr_v6 else {
            if spec.network_config.ipv6.is_none() {
                e.fail(format!(
                    "{path}: needs networkConfig.ipv6 (the VLAN's IPv6 prefix)"
                ));
            }
            continue;
        };
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a.trim(), Some(p.trim())),
            None => (text, None),
        };
        let Ok(address) = address.parse::<Ipv6Addr>() else {
            e.fail(format!("{path}: {address:?} is not an IPv6 address"));
            continue;
        };
        if prefix.is_some_and(|p| p.parse::<u8>().ok() != Some(net.prefix_len())) {
            e.fail(format!(
                "{path}: prefix /{} differs from networkConfig.ipv6.cidr {net}",
                prefix.unwrap_or_default()
            ));
            continue;
        }
        if !net.contains(&address) {
            e.fail(format!(
                "{path}: {address} is outside networkConfig.ipv6.cidr {net}"
            ));
            continue;
        }
        if let Some((other, _)) = placed.servers_v6.iter().find(|(_, a)| *a == address) {
            e.fail(format!(
                "{path}: {address} is also infraComponents.{}.serverIPv6",
                other.name()
            ));
            continue;
        }
        placed.servers_v6.push((component, address));
    }
    let enabled = [
        (
            Component::Dhcp,
            comps
                .dhcp_enabled()
                .map(|d| (d.server_ip.as_deref(), d.replicas)),
        ),
        (
            Component::Dns,
            comps
                .dns_enabled()
                .map(|d| (d.server_ip.as_deref(), d.replicas)),
        ),
        (
            Component::Proxy,
            comps
                .proxy_enabled()
                .map(|p| (p.server_ip.as_deref(), p.replicas)),
        ),
    ];
    for (component, given) in enabled {
        let Some((server_ip, replicas_given)) = given else {
            continue;
        };
        let path = server_ip_path(component);
        if let Some(a) = server_address(e, path, server_ip, Some(cidr)) {
            placed.servers.push((component, path, a));
        }
        let n = replicas(
            e,
            &format!("infraComponents.{}.replicas", component.name()),
            replicas_given,
        );
        placed.replica_counts.push((component, n));
    }
    for (component, n) in &placed.replica_counts {
        let workload = names::workload(infra_name, *component);
        // A StatefulSet labels its pods `<name>-<10-character hash>`, at
        // most 63 characters; its peers Service (`<name>-peers`, one DNS
        // label) fits then too.
        if *n > 1 && workload.len() > 52 {
            e.fail(format!(
                "metadata.name: {infra_name:?} is too long for two {} replicas: their StatefulSet {workload} would be over 52 characters, the most its pods' labels allow",
                component.name()
            ));
        }
    }
    placed
}

fn server_ip_path(component: Component) -> &'static str {
    match component {
        Component::Dhcp => "infraComponents.dhcp.serverIP",
        Component::Dns => "infraComponents.dns.serverIP",
        Component::Proxy => "infraComponents.proxy.serverIP",
    }
}

/// The address the DNS gives clients off the VLAN for the proxy, from
/// `internalProxyService`.
fn internal_proxy_address(
    e: &mut Errors,
    proxy_spec: Option<&ProxySpec>,
    infra_namespace: &str,
    services: &dyn Fn(&str, &str) -> ServiceAddress,
) -> Option<Ipv4Addr> {
    match internal_proxy_target(proxy_spec?, infra_namespace)? {
        InternalProxyTarget::Address(ip) => Some(ip),
        InternalProxyTarget::Service { namespace, name } => match services(&namespace, &name) {
            ServiceAddress::ClusterIp(ip) => Some(ip),
            ServiceAddress::Missing => {
                e.fail(format!(
                    "infraComponents.proxy.internalProxyService: Service {namespace}/{name} not found"
                ));
                None
            }
            ServiceAddress::NoClusterIp => {
                e.fail(format!(
                    "infraComponents.proxy.internalProxyService: Service {namespace}/{name} has no IPv4 ClusterIP"
                ));
                None
            }
        },
    }
}

/// The namespaces of the control planes the proxy routes to: each
/// attachment's, or the single cluster's.
fn served_control_plane_namespaces(
    spec: &InfraSpec,
    infra_namespace: &str,
    attached: &[Candidate],
    single_cluster: bool,
) -> Vec<String> {
    if spec.infra_components.proxy_enabled().is_none() {
        return Vec::new();
    }
    if !attached.is_empty() {
        let mut all: Vec<String> = attached
            .iter()
            .map(|a| a.control_plane_namespace.clone())
            .collect();
        all.sort();
        all.dedup();
        return all;
    }
    if single_cluster {
        return vec![control_plane_namespace(spec, infra_namespace).unwrap_or_default()];
    }
    Vec::new()
}

/// The DHCP pods' DHCPv6 server DUID: a DUID-LL of a locally
/// administered MAC taken from the Infra's namespace and name (FNV-1a), the
/// same for every replica and every reconcile.
fn pair_duid(namespace: &str, name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in namespace.bytes().chain([b'/']).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    format!(
        "00:03:00:01:02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[3], b[4], b[5], b[6], b[7]
    )
}

/// What every component's config is built from, settled once.
struct Render<'a> {
    spec: &'a InfraSpec,
    infra_name: &'a str,
    infra_namespace: &'a str,
    cidr: Ipv4Net,
    attached: &'a [Candidate],
    placed: &'a Placed,
    internal_address: Option<Ipv4Addr>,
    /// The single cluster's `cluster` section.
    cluster: Option<FileCluster>,
    control_plane_namespace: Option<String>,
    /// `*.apps` resolves to the proxy: it has an ingress to send it to.
    ingress: bool,
    external_proxy: bool,
}

impl Render<'_> {
    /// The sections every component's config shares, and where each of
    /// their paths comes from in the Infra.
    fn common(&self, component: Component, own_path: &str, address: &str) -> (FileConfig, Origins) {
        let net = &self.spec.network_config;
        let mut origins = Origins::new();
        origins.add("network.cidr", "networkConfig.cidr");
        origins.add("network.gateway", "networkConfig.gateway");
        origins.add("network.address", own_path);
        origins.add("cluster.name", "infraComponents.dns.clusterName");
        for (i, a) in self.attached.iter().enumerate() {
            origins.add(
                format!("clusters[{i}]"),
                format!("InfraClusterAttachment {}", a.name),
            );
        }
        origins.add("cluster.baseDomain", "infraComponents.dns.baseDomain");
        origins.add("routing.table", "routing.table");
        origins.add("routing.priority", "routing.priority");
        origins.add("routing.extraRoutes", "routing.extraRoutes");
        let others: Vec<&(Component, &str, String)> = self
            .placed
            .servers
            .iter()
            .filter(|(k, _, _)| *k != component)
            .collect();
        for (i, (_, path, _)) in others.iter().enumerate() {
            origins.add(format!("network.staticAddresses[{i}]"), *path);
        }
        let routing = self.spec.routing.clone().unwrap_or_default();
        let file = FileConfig {
            log: FileLog {
                level: None,
                format: Some("json".into()),
            },
            admin: FileAdmin {
                // The pod network only: never reachable from the VLAN.
                listen: Some(format!("0.0.0.0:{ADMIN_PORT}")),
                interface: Some("eth0".into()),
            },
            cluster: self.cluster.clone(),
            clusters: self
                .attached
                .iter()
                .map(|a| FileServedCluster {
                    name: a.cluster_name.clone(),
                    base_domain: a.base_domain.clone(),
                    control_plane_namespace: Some(a.control_plane_namespace.clone()),
                    api_server_service: a.api_server_service.clone(),
                    workers: a.workers.iter().map(ToString::to_string).collect(),
                    // The router's load balancer: answered directly on the
                    // VLAN, reached through the proxy from elsewhere.
                    apps_address: a.apps.map(|e| e.address.to_string()),
                    ingress_https: a.apps.map(|e| format!("{}:{}", e.address, e.https)),
                    ingress_http: a.apps.map(|e| format!("{}:{}", e.address, e.http)),
                })
                .collect(),
            network: Some(FileNetwork {
                interface: Some(VLAN_INTERFACE.into()),
                cidr: net.cidr.trim().to_string(),
                gateway: Some(net.gateway.trim().to_string()).filter(|g| !g.is_empty()),
                address: Some(address.to_string()),
                static_addresses: others.iter().map(|(_, _, a)| a.clone()).collect(),
            }),
            routing: Some(FileRouting {
                enabled: true,
                table: routing.table,
                priority: routing.priority,
                extra_routes: routing.extra_routes.clone(),
                interfaces: Vec::new(),
                // /proc/sys is read-only in a container, and a new pod
                // network namespace starts with rp_filter off.
                loose_rp_filter: false,
                ipv6: self.routing_v6(component, &mut origins),
            }),
            ..FileConfig::default()
        };
        (file, origins)
    }

    fn dhcp(&self, e: &mut Errors, file: &mut FileConfig, origins: &mut Origins, d: &DhcpSpec) {
        let net = &self.spec.network_config;
        origins.add("dhcp.leaseTime", "infraComponents.dhcp.leaseTime");
        origins.add(
            "dhcp.subnets[0].pools[0].start",
            "infraComponents.dhcp.rangeStart",
        );
        origins.add(
            "dhcp.subnets[0].pools[0].end",
            "infraComponents.dhcp.rangeEnd",
        );
        origins.add(
            "dhcp.subnets[0].pools[0]",
            "infraComponents.dhcp.rangeStart",
        );
        origins.add(
            "dhcp.subnets[0].reservations",
            "infraComponents.dhcp.reservations",
        );
        // Clients resolve through causeway DNS when it runs, else
        // through the configured upstreams.
        let dns_servers = match self.placed.address_of(Component::Dns) {
            Some(dns) => {
                origins.add("dhcp.subnets[0].dnsServers", "infraComponents.dns.serverIP");
                vec![dns]
            }
            None => {
                origins.add("dhcp.subnets[0].dnsServers", "networkConfig.dnsServers");
                // "resolv.conf" is refused by check_dns_servers: not said
                // twice.
                net.dns_servers
                    .iter()
                    .filter(|d| d.trim() != causeway_config::SYSTEM_UPSTREAMS)
                    .cloned()
                    .collect()
            }
        };
        file.dhcp = Some(FileDhcp {
            enabled: true,
            listen: vec![FileDhcpListen {
                interface: Some(VLAN_INTERFACE.into()),
                address: None,
            }],
            lease_file: Some(format!("{LEASE_DIR}/dhcp-leases.jsonl")),
            lease_time: Some(FileDuration::Text(
                d.lease_time.clone().unwrap_or_else(|| "1h".into()),
            )),
            subnets: vec![FileSubnet {
                pools: vec![FileRange {
                    start: d.range_start.clone().unwrap_or_default(),
                    end: d.range_end.clone().unwrap_or_default(),
                }],
                dns_servers: (!dns_servers.is_empty()).then_some(dns_servers),
                reservations: d
                    .reservations
                    .iter()
                    .map(|r| FileReservation {
                        mac: Some(r.mac.clone()),
                        client_id: None,
                        ip: r.ip.trim().to_string(),
                        hostname: r.hostname.clone(),
                        options: Vec::new(),
                    })
                    .collect(),
                ..FileSubnet::default()
            }],
            ..FileDhcp::default()
        });
        self.advertise_v6(file, origins);
        if d.range_start.as_deref().is_none_or(|s| s.trim().is_empty()) {
            e.fail("infraComponents.dhcp.rangeStart: required when the component is enabled");
        }
        if d.range_end.as_deref().is_none_or(|s| s.trim().is_empty()) {
            e.fail("infraComponents.dhcp.rangeEnd: required when the component is enabled");
        }
    }

    fn dns(&self, file: &mut FileConfig, origins: &mut Origins, d: &DnsSpec, address: &str) {
        let net = &self.spec.network_config;
        origins.add("dns.listen[0]", "infraComponents.dns.serverIP");
        origins.add("dns.proxyAddress", "infraComponents.proxy.serverIP");
        origins.add("dns.upstreams", "networkConfig.dnsServers");
        origins.add("dns.records", "infraComponents.dns.records");
        origins.add(
            "dns.views[1].proxyAddress",
            "infraComponents.proxy.internalProxyService",
        );
        let proxy = self.placed.address_of(Component::Proxy);
        let apps = proxy.clone().filter(|_| self.ingress);
        let views = match self.internal_address {
            // Split horizon: the VLAN gets the proxy's VLAN address,
            // every other client the internal one.
            Some(internal) => vec![
                FileView {
                    name: "vlan".into(),
                    clients: vec![net.cidr.trim().to_string()],
                    ingress_address: apps.clone(),
                    ..FileView::default()
                },
                FileView {
                    name: "internal".into(),
                    clients: vec!["0.0.0.0/0".into()],
                    proxy_address: Some(internal.to_string()),
                    ..FileView::default()
                },
            ],
            None => Vec::new(),
        };
        let own_v6 = self.placed.v6_of(Component::Dns);
        if own_v6.is_some() {
            origins.add("dns.listen[1]", "infraComponents.dns.serverIPv6");
        }
        let proxy_v6 = self.placed.v6_of(Component::Proxy);
        origins.add("dns.proxyAddressV6", "infraComponents.proxy.serverIPv6");
        file.dns = Some(FileDns {
            enabled: true,
            listen: std::iter::once(format!("{address}:53"))
                .chain(own_v6.map(|a| format!("[{a}]:53")))
                .collect(),
            proxy_address: proxy,
            proxy_address_v6: proxy_v6.map(|a| a.to_string()),
            ingress_address: if views.is_empty() { apps } else { None },
            upstreams: net.dns_servers.clone(),
            records: d
                .records
                .iter()
                .map(|r| FileRecord {
                    name: r.name.clone(),
                    kind: r.kind.clone(),
                    value: r.value.clone(),
                    ttl: None,
                })
                .collect(),
            views,
            ..FileDns::default()
        });
    }

    /// The component's v6 policy routing, when it has a v6 address and the
    /// VLAN a v6 router to answer routed clients through.
    fn routing_v6(&self, component: Component, origins: &mut Origins) -> Option<FileRoutedV6> {
        let address = self.placed.v6_of(component)?;
        let net = self.placed.cidr_v6?;
        let gateway = self.spec.network_config.ipv6.as_ref()?.gateway.trim();
        if gateway.is_empty() {
            return None;
        }
        origins.add("routing.ipv6.cidr", "networkConfig.ipv6.cidr");
        origins.add("routing.ipv6.gateway", "networkConfig.ipv6.gateway");
        origins.add(
            "routing.ipv6.address",
            format!("infraComponents.{}.serverIPv6", component.name()),
        );
        Some(FileRoutedV6 {
            cidr: net.to_string(),
            address: address.to_string(),
            gateway: gateway.to_string(),
            extra_routes: Vec::new(),
        })
    }

    /// `networkConfig.ipv6.routerAdvertisements`: the DHCP pod announces the
    /// prefix and answers stateless DHCPv6. Neither needs HA: with router
    /// lifetime 0 no replica becomes a router, and both replicas of a pair
    /// advertise and answer the same, which hosts take from either.
    /// `networkConfig.ipv6.dhcpRange`: the DHCP pod leases addresses too,
    /// in its lease store (replicated with the v4 leases under HA), and
    /// the advertisement carries the M flag.
    fn advertise_v6(&self, file: &mut FileConfig, origins: &mut Origins) {
        let Some(v6) = self.spec.network_config.ipv6.as_ref() else {
            return;
        };
        let Some(net) = self
            .placed
            .cidr_v6
            .filter(|_| v6.router_advertisements || v6.dhcp_range.is_some())
        else {
            return;
        };
        let pools: Vec<causeway_config::FilePool6> = v6
            .dhcp_range
            .iter()
            .map(|r| causeway_config::FilePool6 {
                start: r.start.trim().to_string(),
                end: r.end.trim().to_string(),
            })
            .collect();
        let stateful = !pools.is_empty();
        if stateful {
            origins.add("dhcp6.prefix", "networkConfig.ipv6.cidr");
            origins.add("dhcp6.pools", "networkConfig.ipv6.dhcpRange");
        }
        let dns: Vec<String> = self
            .placed
            .v6_of(Component::Dns)
            .map(|a| a.to_string())
            .into_iter()
            .collect();
        origins.add(
            "routerAdvertisements.prefixes[0].prefix",
            "networkConfig.ipv6.cidr",
        );
        origins.add(
            "routerAdvertisements.dnsServers[0]",
            "infraComponents.dns.serverIPv6",
        );
        origins.add("dhcp6.dnsServers", "infraComponents.dns.serverIPv6");
        origins.add("dhcp6", "networkConfig.ipv6.routerAdvertisements");
        file.router_advertisements =
            v6.router_advertisements
                .then(|| causeway_config::FileRouterAdvertisements {
                    enabled: true,
                    interface: None,
                    prefixes: vec![causeway_config::FilePrefix {
                        prefix: net.to_string(),
                        on_link: true,
                        autonomous: true,
                        valid_lifetime: None,
                        preferred_lifetime: None,
                    }],
                    managed: stateful,
                    other_config: true,
                    router_lifetime: Some(FileDuration::Seconds(0)),
                    min_interval: None,
                    max_interval: None,
                    hop_limit: None,
                    mtu: None,
                    dns_servers: dns.clone(),
                    search_domains: None,
                    dns_lifetime: None,
                    source: None,
                });
        file.dhcp6 = Some(causeway_config::FileDhcp6 {
            enabled: true,
            interface: None,
            dns_servers: dns,
            domain_search: None,
            information_refresh_time: None,
            // One DUID for both replicas of a pair: a client renews with
            // the Server Identifier it was given, which another DUID on a
            // new active would have to discard.
            server_duid: stateful.then(|| pair_duid(self.infra_namespace, self.infra_name)),
            prefix: stateful.then(|| net.to_string()),
            pools,
            reservations: Vec::new(),
            preferred_lifetime: None,
            valid_lifetime: None,
            rapid_commit: false,
        });
    }

    /// Two replicas: the `ha` section, `address` moving between them.
    fn ha(
        &self,
        file: &mut FileConfig,
        origins: &mut Origins,
        component: Component,
        own_path: &str,
        address: &str,
    ) {
        origins.add("ha.addresses", own_path);
        origins.add(
            "ha",
            format!("infraComponents.{}.replicas", component.name()),
        );
        let mut ha = ha_section(
            self.infra_name,
            self.infra_namespace,
            component,
            format!("{address}/{}", self.cidr.prefix_len()),
        );
        if let (Some(a), Some(net)) = (self.placed.v6_of(component), self.placed.cidr_v6) {
            origins.add(
                "ha.addressesV6",
                format!("infraComponents.{}.serverIPv6", component.name()),
            );
            ha.addresses_v6 = vec![format!("{a}/{}", net.prefix_len())];
        }
        file.ha = Some(ha);
    }

    fn proxy(&self, file: &mut FileConfig, origins: &mut Origins, p: &ProxySpec, address: &str) {
        origins.add("proxy.listenAddress", "infraComponents.proxy.serverIP");
        origins.add(
            "proxy.controlPlaneNamespace",
            "infraComponents.proxy.controlPlaneNamespace",
        );
        origins.add(
            "proxy.apiServerService",
            "infraComponents.proxy.apiServerService",
        );
        origins.add("proxy.ingressHttps", "infraComponents.proxy.ingressHttps");
        origins.add("proxy.ingressHttp", "infraComponents.proxy.ingressHttp");
        origins.add("proxy.extraListeners", "infraComponents.proxy.extraRoutes");
        origins.add("proxy.listenAddressV6", "infraComponents.proxy.serverIPv6");
        file.proxy = Some(FileProxy {
            enabled: true,
            listen_address: Some(address.to_string()),
            listen_address_v6: self.placed.v6_of(Component::Proxy).map(|a| a.to_string()),
            control_plane_namespace: self.control_plane_namespace.clone(),
            api_server_service: p.api_server_service.clone(),
            ingress_https: p.ingress_https.clone(),
            ingress_http: p.ingress_http.clone(),
            external_port: self
                .external_proxy
                .then_some(super::plan::EXTERNAL_PROXY_PORT as u16),
            extra_listeners: p
                .extra_routes
                .iter()
                .map(|r| causeway_config::FileListener {
                    port: r.port,
                    upstream: Some(r.upstream.clone()),
                    ..causeway_config::FileListener::default()
                })
                .collect(),
            ..FileProxy::default()
        });
    }
}

/// The pod loads exactly this text: it is checked the way the pod will
/// check it, each complaint put in Infra terms. A complaint about a part of
/// the config no Infra field fills is a consequence of an error already
/// reported, kept in `unplaced` in case none was.
fn checked(
    e: &mut Errors,
    unplaced: &mut Vec<String>,
    component: Component,
    replicas: i32,
    file: &FileConfig,
    origins: &Origins,
) -> Option<ComponentPlan> {
    let text = config_yaml(file);
    match Config::from_yaml(&text) {
        Ok(config) => {
            let server_ip = config.network.as_ref().and_then(|n| n.address)?;
            Some(ComponentPlan {
                component,
                server_ip,
                // Set by the caller, which placed it.
                server_ipv6: None,
                replicas,
                config_text: text,
            })
        }
        Err(errors) => {
            for err in errors.0 {
                let path = origins.infra_path(&err.path);
                let message = format!("{path}: {}", origins.infra_message(&err.message));
                if origins.knows(&err.path) {
                    e.fail(message);
                } else {
                    unplaced.push(message);
                }
            }
            None
        }
    }
}

/// The Go operator's image fields: accepted, and said to be ignored.
fn ignored_images(spec: &InfraSpec) -> Vec<String> {
    let comps = &spec.infra_components;
    let proxy_set = |f: fn(&ProxySpec) -> bool| comps.proxy.as_ref().is_some_and(f);
    [
        (
            "infraComponents.dhcp.image",
            comps.dhcp.as_ref().is_some_and(|d| d.image.is_some()),
        ),
        (
            "infraComponents.dns.image",
            comps.dns.as_ref().is_some_and(|d| d.image.is_some()),
        ),
        (
            "infraComponents.proxy.image",
            proxy_set(|p| p.image.is_some()),
        ),
        (
            "infraComponents.proxy.proxyImage",
            proxy_set(|p| p.proxy_image.is_some()),
        ),
        (
            "infraComponents.proxy.managerImage",
            proxy_set(|p| p.manager_image.is_some()),
        ),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(path, _)| {
        format!("{path} is ignored: every component runs the operator's causeway image")
    })
    .collect()
}
