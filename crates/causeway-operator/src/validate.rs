//! From an `Infra` (and what the cluster says about it) to a [`Plan`]:
//! every address parsed and checked against the VLAN, every default
//! filled in. Pure, so every message is tested without a cluster.

use std::net::Ipv4Addr;

use causeway_config::{DEFAULT_PRIORITY, DEFAULT_TABLE};
use ipnet::Ipv4Net;

use crate::crd::{DnsRecordSpec, InfraSpec, ProxySpec, Reservation};

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

/// What the operator learned from a referenced HostedCluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostedClusterFacts {
    pub name: String,
    pub namespace: String,
    pub base_domain: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DhcpPlan {
    pub server_ip: Ipv4Addr,
    pub range_start: Ipv4Addr,
    pub range_end: Ipv4Addr,
    pub lease_time: String,
    pub reservations: Vec<Reservation>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DnsPlan {
    pub server_ip: Ipv4Addr,
    pub records: Vec<DnsRecordSpec>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ProxyPlan {
    pub server_ip: Ipv4Addr,
    pub internal_address: Option<Ipv4Addr>,
    pub control_plane_namespace: String,
    pub api_server_service: String,
    pub ingress_https: Option<String>,
    pub ingress_http: Option<String>,
    pub extra_routes: Vec<(u16, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingPlan {
    pub table: u32,
    pub priority: u32,
    pub extra_routes: Vec<Ipv4Net>,
}

/// A valid Infra, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub cidr: Ipv4Net,
    pub gateway: Ipv4Addr,
    pub nad_name: String,
    pub nad_namespace: String,
    pub upstreams: Vec<Ipv4Addr>,
    pub cluster_name: Option<String>,
    pub base_domain: Option<String>,
    pub dhcp: Option<DhcpPlan>,
    pub dns: Option<DnsPlan>,
    pub proxy: Option<ProxyPlan>,
    pub routing: RoutingPlan,
    /// Accepted but ignored fields, for a warning condition.
    pub warnings: Vec<String>,
}

impl Plan {
    /// Every fixed VLAN address of the enabled components.
    pub fn static_ips(&self) -> Vec<Ipv4Addr> {
        [
            self.dhcp.as_ref().map(|d| d.server_ip),
            self.dns.as_ref().map(|d| d.server_ip),
            self.proxy.as_ref().map(|p| p.server_ip),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

struct Check {
    errors: Vec<String>,
}

impl Check {
    fn fail(&mut self, msg: impl Into<String>) {
        self.errors.push(msg.into());
    }

    fn ip(&mut self, path: &str, text: &str) -> Option<Ipv4Addr> {
        match text.trim().parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                self.fail(format!("{path}: {text:?} is not an IPv4 address"));
                None
            }
        }
    }

    /// A pod's static address: [`Check::vlan_ip`], optionally written with
    /// a prefix length, which must then be the VLAN's (the Go operator's
    /// users write `192.168.100.2/24`).
    fn server_ip(
        &mut self,
        path: &str,
        text: Option<&str>,
        cidr: Option<Ipv4Net>,
    ) -> Option<Ipv4Addr> {
        let Some((address, prefix)) = text.and_then(|t| t.split_once('/')) else {
            return self.vlan_ip(path, text, cidr);
        };
        let ip = self.vlan_ip(path, Some(address), cidr)?;
        match (prefix.trim().parse::<u8>(), cidr) {
            (Ok(p), Some(net)) if p == net.prefix_len() => Some(ip),
            (Ok(p), Some(net)) => {
                self.fail(format!(
                    "{path}: prefix /{p} differs from networkConfig.cidr {net}"
                ));
                None
            }
            (Ok(_), None) => Some(ip),
            (Err(_), _) => {
                self.fail(format!("{path}: {prefix:?} is not a prefix length"));
                None
            }
        }
    }

    /// A required address inside the VLAN, and not its network or
    /// broadcast address.
    fn vlan_ip(
        &mut self,
        path: &str,
        text: Option<&str>,
        cidr: Option<Ipv4Net>,
    ) -> Option<Ipv4Addr> {
        let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
            self.fail(format!("{path}: required when the component is enabled"));
            return None;
        };
        let ip = self.ip(path, text)?;
        if let Some(net) = cidr {
            if !net.contains(&ip) {
                self.fail(format!("{path}: {ip} is outside networkConfig.cidr {net}"));
            } else if ip == net.network() || ip == net.broadcast() {
                self.fail(format!(
                    "{path}: {ip} is the network or broadcast address of {net}"
                ));
            }
        }
        Some(ip)
    }
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

/// Validates `spec`. `hosted_cluster` is what the referenced HostedCluster
/// says, when there is a reference and it was read; `services` answers for
/// the Service `internalProxyService` may name.
pub fn validate(
    spec: &InfraSpec,
    infra_namespace: &str,
    hosted_cluster: Option<&HostedClusterFacts>,
    services: &dyn Fn(&str, &str) -> ServiceAddress,
) -> Result<Plan, Vec<String>> {
    let mut c = Check { errors: Vec::new() };
    let net = &spec.network_config;
    let comps = &spec.infra_components;

    let cidr = match net.cidr.trim().parse::<Ipv4Net>() {
        Ok(n) if n.prefix_len() <= 30 => Some(n.trunc()),
        Ok(n) => {
            c.fail(format!(
                "networkConfig.cidr: {n} leaves no room for a gateway and servers (use /30 or larger)"
            ));
            None
        }
        Err(_) => {
            c.fail(format!(
                "networkConfig.cidr: {:?} is not an IPv4 CIDR such as 192.168.100.0/24",
                net.cidr
            ));
            None
        }
    };
    let gateway = c.vlan_ip("networkConfig.gateway", Some(&net.gateway), cidr);
    if net.network_attachment_definition.trim().is_empty() {
        c.fail("networkConfig.networkAttachmentDefinition: required");
    }
    let upstreams: Vec<Ipv4Addr> = net
        .dns_servers
        .iter()
        .enumerate()
        .filter_map(|(i, s)| c.ip(&format!("networkConfig.dnsServers[{i}]"), s))
        .collect();

    // Names come from the dns object even when DNS itself is disabled, as
    // the proxy's routes need them too.
    let cluster_name = comps
        .dns
        .as_ref()
        .and_then(|d| d.cluster_name.clone())
        .filter(|s| !s.trim().is_empty())
        .or_else(|| hosted_cluster.map(|h| h.name.clone()));
    let base_domain = comps
        .dns
        .as_ref()
        .and_then(|d| d.base_domain.clone())
        .filter(|s| !s.trim().is_empty())
        .or_else(|| hosted_cluster.and_then(|h| h.base_domain.clone()));
    let dns_spec = comps.dns_enabled();
    let proxy_spec = comps.proxy_enabled();
    let needs_cluster = dns_spec.is_some() || proxy_spec.is_some();
    if needs_cluster && cluster_name.is_none() {
        c.fail("infraComponents.dns.clusterName: required for DNS and the proxy (or set hostedClusterRef)");
    }
    if needs_cluster && base_domain.is_none() {
        c.fail("infraComponents.dns.baseDomain: required for DNS and the proxy (or set hostedClusterRef to a HostedCluster with spec.dns.baseDomain)");
    }

    let dhcp = if let Some(d) = comps.dhcp_enabled() {
        let server_ip = c.server_ip(
            "infraComponents.dhcp.serverIP",
            d.server_ip.as_deref(),
            cidr,
        );
        let start = c.vlan_ip(
            "infraComponents.dhcp.rangeStart",
            d.range_start.as_deref(),
            cidr,
        );
        let end = c.vlan_ip(
            "infraComponents.dhcp.rangeEnd",
            d.range_end.as_deref(),
            cidr,
        );
        if let (Some(s), Some(e)) = (start, end) {
            if s > e {
                c.fail(format!(
                    "infraComponents.dhcp.rangeEnd: {e} is before rangeStart {s}"
                ));
            }
        }
        let lease_time = d.lease_time.clone().unwrap_or_else(|| "1h".into());
        if causeway_config::parse_duration(&lease_time).is_none() {
            c.fail(format!(
                "infraComponents.dhcp.leaseTime: {lease_time:?} is not a duration such as 1h or 24h"
            ));
        }
        for (i, r) in d.reservations.iter().enumerate() {
            let path = format!("infraComponents.dhcp.reservations[{i}]");
            if causeway_config::parse_mac(&r.mac).is_none() {
                c.fail(format!("{path}.mac: {:?} is not a MAC address", r.mac));
            }
            if let (Some(ip), Some(net)) = (c.ip(&format!("{path}.ip"), &r.ip), cidr) {
                if !net.contains(&ip) {
                    c.fail(format!(
                        "{path}.ip: {ip} is outside networkConfig.cidr {net}"
                    ));
                }
            }
        }
        match (server_ip, start, end) {
            (Some(server_ip), Some(range_start), Some(range_end)) => Some(DhcpPlan {
                server_ip,
                range_start,
                range_end,
                lease_time,
                reservations: d.reservations.clone(),
            }),
            _ => None,
        }
    } else {
        None
    };
    let dns = if let Some(d) = dns_spec {
        c.server_ip("infraComponents.dns.serverIP", d.server_ip.as_deref(), cidr)
            .map(|server_ip| DnsPlan {
                server_ip,
                records: d.records.clone(),
            })
    } else {
        None
    };
    let proxy = if let Some(p) = proxy_spec {
        let server_ip = c.server_ip(
            "infraComponents.proxy.serverIP",
            p.server_ip.as_deref(),
            cidr,
        );
        let internal_address = match internal_proxy_target(p, infra_namespace) {
            None => None,
            Some(InternalProxyTarget::Address(ip)) => Some(ip),
            Some(InternalProxyTarget::Service { namespace, name }) => {
                match services(&namespace, &name) {
                    ServiceAddress::ClusterIp(ip) => Some(ip),
                    ServiceAddress::Missing => {
                        c.fail(format!(
                            "infraComponents.proxy.internalProxyService: Service {namespace}/{name} not found"
                        ));
                        None
                    }
                    ServiceAddress::NoClusterIp => {
                        c.fail(format!(
                            "infraComponents.proxy.internalProxyService: Service {namespace}/{name} has no IPv4 ClusterIP"
                        ));
                        None
                    }
                }
            }
        };
        let control_plane_namespace =
            control_plane_namespace(spec, infra_namespace).unwrap_or_default();
        let mut extra_routes = Vec::new();
        for (i, r) in p.extra_routes.iter().enumerate() {
            if r.port == 0 {
                c.fail(format!(
                    "infraComponents.proxy.extraRoutes[{i}].port: must be 1 to 65535"
                ));
            }
            extra_routes.push((r.port, r.upstream.clone()));
        }
        server_ip.map(|server_ip| ProxyPlan {
            server_ip,
            internal_address,
            control_plane_namespace,
            api_server_service: p
                .api_server_service
                .clone()
                .unwrap_or_else(|| "kube-apiserver".into()),
            ingress_https: p.ingress_https.clone(),
            ingress_http: p.ingress_http.clone(),
            extra_routes,
        })
    } else {
        None
    };

    // One static address per pod: two pods, or a pod and the gateway or a
    // lease, on one address would break both.
    let statics: Vec<(&str, Ipv4Addr)> = [
        ("dhcp", dhcp.as_ref().map(|d| d.server_ip)),
        ("dns", dns.as_ref().map(|d| d.server_ip)),
        ("proxy", proxy.as_ref().map(|p| p.server_ip)),
    ]
    .into_iter()
    .filter_map(|(n, ip)| ip.map(|ip| (n, ip)))
    .collect();
    for (i, (name, ip)) in statics.iter().enumerate() {
        for (other, other_ip) in &statics[..i] {
            if ip == other_ip {
                c.fail(format!(
                    "infraComponents.{name}.serverIP: {ip} is also infraComponents.{other}.serverIP"
                ));
            }
        }
        if Some(*ip) == gateway {
            c.fail(format!(
                "infraComponents.{name}.serverIP: {ip} is the gateway"
            ));
        }
        if let Some(d) = &dhcp {
            if d.range_start <= *ip && *ip <= d.range_end {
                c.fail(format!(
                    "infraComponents.{name}.serverIP: {ip} is inside the DHCP range {}-{}",
                    d.range_start, d.range_end
                ));
            }
        }
    }
    if let (Some(d), Some(g)) = (&dhcp, gateway) {
        if d.range_start <= g && g <= d.range_end {
            c.fail(format!(
                "infraComponents.dhcp.rangeStart: the range {}-{} holds the gateway {g}",
                d.range_start, d.range_end
            ));
        }
    }

    let routing = spec.routing.clone().unwrap_or_default();
    let routing = RoutingPlan {
        table: routing.table.unwrap_or(DEFAULT_TABLE),
        priority: routing.priority.unwrap_or(DEFAULT_PRIORITY),
        extra_routes: routing
            .extra_routes
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t.trim().parse::<Ipv4Net>() {
                Ok(n) => Some(n.trunc()),
                Err(_) => {
                    c.fail(format!(
                        "routing.extraRoutes[{i}]: {t:?} is not an IPv4 CIDR"
                    ));
                    None
                }
            })
            .collect(),
    };

    let mut warnings = Vec::new();
    let proxy_set = |f: fn(&ProxySpec) -> bool| comps.proxy.as_ref().is_some_and(f);
    for (path, set) in [
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
    ] {
        if set {
            warnings.push(format!(
                "{path} is ignored: every component runs the operator's causeway image"
            ));
        }
    }

    if !c.errors.is_empty() {
        return Err(c.errors);
    }
    let (Some(cidr), Some(gateway)) = (cidr, gateway) else {
        return Err(vec!["networkConfig: invalid".into()]);
    };
    Ok(Plan {
        cidr,
        gateway,
        nad_name: net.network_attachment_definition.trim().to_string(),
        nad_namespace: net
            .network_attachment_namespace
            .clone()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| infra_namespace.to_string()),
        upstreams,
        cluster_name,
        base_domain,
        dhcp,
        dns,
        proxy,
        routing,
        warnings,
    })
}
