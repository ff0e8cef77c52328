//! The `dns:` section: split-horizon views with records derived from the
//! cluster identity, forwarding, cache and serving limits.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

use crate::clusters::{ServedCluster, KUBERNETES_ALIASES};
use crate::collector::{yes, Collector, FileDuration};
use crate::name::{self, NameRules};
use crate::network::Network;

pub const DEFAULT_DNS_TTL: u32 = 30;
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// The forwarding cache's default budget: far above what the names of a
/// VLAN's machines need, far below what would put the appliance (and its
/// DHCP server) at risk of an OOM kill.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;
const MIN_CACHE_BYTES: usize = 64 << 10;
/// Above the 1,232-byte EDNS answer every UDP client gets, so only large
/// answers fetched over TCP go uncached.
pub const DEFAULT_CACHE_ENTRY_BYTES: usize = 8 << 10;

/// The hosted-cluster names that point at the proxy.
pub const PROXIED_NAMES: &[&str] = &["api", "api-int", "oauth", "ignition", "konnectivity"];

/// The most upstreams `dns.upstreams` may list: queries go to them in turn
/// within one client's timeout, so past a handful more only add waiting.
/// CoreDNS's `forward` takes the same number.
pub const MAX_UPSTREAMS: usize = 15;
/// The `dns.upstreams` entry that stands for the host's own resolvers, the
/// `nameserver` lines of /etc/resolv.conf (a pod's are its cluster DNS).
pub const SYSTEM_UPSTREAMS: &str = "resolv.conf";

/// TCP connections one client address may hold, by default.
pub const DEFAULT_TCP_PER_SOURCE: usize = 64;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileDns {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub listen: Vec<String>,
    pub proxy_address: Option<String>,
    pub proxy_address_v6: Option<String>,
    pub ingress_address: Option<String>,
    pub ttl: Option<u32>,
    #[serde(default)]
    pub records: Vec<FileRecord>,
    #[serde(default)]
    pub views: Vec<FileView>,
    #[serde(default)]
    pub upstreams: Vec<String>,
    pub upstream_policy: Option<String>,
    pub upstream_timeout: Option<FileDuration>,
    pub max_upstream_in_flight: Option<usize>,
    #[serde(default)]
    pub cache: FileCache,
    pub recursion_clients: Option<Vec<String>>,
    pub tcp_idle_timeout: Option<FileDuration>,
    pub max_tcp_connections: Option<usize>,
    pub max_tcp_connections_per_source: Option<usize>,
    pub udp_sockets: Option<usize>,
    pub pin_udp_threads: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileCache {
    pub max_entries: Option<usize>,
    pub max_bytes: Option<usize>,
    pub max_entry_bytes: Option<usize>,
    pub max_ttl: Option<FileDuration>,
    pub max_negative_ttl: Option<FileDuration>,
    pub serve_stale: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRecord {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
    pub ttl: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileView {
    pub name: String,
    pub clients: Vec<String>,
    pub proxy_address: Option<String>,
    pub proxy_address_v6: Option<String>,
    pub ingress_address: Option<String>,
    #[serde(default)]
    pub records: Vec<FileRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamPolicy {
    /// Always try the first healthy upstream first.
    Sequential,
    /// Spread queries over the healthy upstreams.
    Random,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    pub max_entries: usize,
    /// What the entries may hold in all, counted as their bytes plus a
    /// fixed overhead each.
    pub max_bytes: usize,
    /// A response larger than this is forwarded but not cached.
    pub max_entry_bytes: usize,
    pub max_ttl: Duration,
    pub max_negative_ttl: Duration,
    pub serve_stale: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DnsConfig {
    pub listen: Vec<SocketAddr>,
    /// `<cluster>.<baseDomain>.`, when the cluster is known: the first
    /// served cluster's, where DHCP names are registered and relative
    /// record names live.
    pub zone: Option<String>,
    /// The other served clusters' zones, answered with the same authority.
    pub other_zones: Vec<String>,
    /// The VLAN, whose reverse names this server answers.
    pub reverse: Option<Ipv4Net>,
    /// The VLAN's DHCPv6 prefix (`dhcp6.prefix`), whose reverse names
    /// under ip6.arpa this server answers.
    pub reverse_v6: Option<ipnet::Ipv6Net>,
    /// Views in order; the first whose clients match wins. The last one is
    /// the default and matches every client.
    pub views: Vec<DnsView>,
    pub upstreams: Vec<SocketAddr>,
    /// Ask the host's resolvers (/etc/resolv.conf) too, after `upstreams`;
    /// also what an empty list means.
    pub system_upstreams: bool,
    pub upstream_policy: UpstreamPolicy,
    pub upstream_timeout: Duration,
    pub max_upstream_in_flight: usize,
    pub cache: CacheConfig,
    pub recursion_clients: Vec<IpNet>,
    pub tcp_idle_timeout: Duration,
    pub max_tcp_connections: usize,
    /// TCP connections one client address may hold at once, so one host
    /// cannot take every slot.
    pub max_tcp_connections_per_source: usize,
    /// UDP sockets per listen address (SO_REUSEPORT); 0 means one per core.
    pub udp_sockets: usize,
    /// Bind the thread serving UDP socket N to the CPU that socket is
    /// steered to. Off by default: see docs/dns.md for when it pays.
    pub pin_udp_threads: bool,
    pub ttl: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DnsView {
    pub name: String,
    /// Empty for the default view.
    pub clients: Vec<IpNet>,
    pub records: Vec<DnsRecord>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DnsRecord {
    /// Absolute, lowercase, with the trailing dot; may start with `*.`.
    pub name: String,
    pub ttl: u32,
    pub data: RecordData,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecordData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    /// Absolute target.
    Cname(String),
    Srv {
        priority: u16,
        weight: u16,
        port: u16,
        target: String,
    },
    Txt(String),
    Ptr(String),
}

impl RecordData {
    pub fn type_name(&self) -> &'static str {
        match self {
            RecordData::A(_) => "A",
            RecordData::Aaaa(_) => "AAAA",
            RecordData::Cname(_) => "CNAME",
            RecordData::Srv { .. } => "SRV",
            RecordData::Txt(_) => "TXT",
            RecordData::Ptr(_) => "PTR",
        }
    }
}

/// Names in the config are relative to the cluster zone unless they end
/// with a dot.
fn absolute(name: &str, zone: Option<&str>) -> Option<String> {
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() {
        return None;
    }
    if name == "@" {
        return zone.map(str::to_string);
    }
    if name.ends_with('.') {
        return Some(name);
    }
    zone.map(|z| format!("{name}.{z}"))
}

/// A record's name: DNS labels (underscores and edge hyphens allowed),
/// perhaps a leading `*`, a trailing dot or not.
fn valid_name(text: &str) -> bool {
    let rules = NameRules {
        wildcard: true,
        ..NameRules::DNS
    };
    name::valid_name(text.trim_end_matches('.'), rules)
}

/// The reverse name of an address: `4.3.2.1.in-addr.arpa.`.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::with_capacity(73);
            for b in v6.octets().iter().rev() {
                s.push_str(&format!("{:x}.{:x}.", b & 0xf, b >> 4));
            }
            s.push_str("ip6.arpa.");
            s
        }
    }
}

fn record(
    c: &mut Collector,
    path: &str,
    r: &FileRecord,
    zone: Option<&str>,
    ttl: u32,
) -> Option<DnsRecord> {
    let kind = r.kind.trim().to_ascii_uppercase();
    let name = if kind == "PTR" {
        // A PTR may name its address instead of the reverse name.
        match r.name.trim().parse::<IpAddr>() {
            Ok(ip) => Some(reverse_name(ip)),
            Err(_) => absolute(&r.name, zone),
        }
    } else {
        absolute(&r.name, zone)
    };
    let Some(name) = name.filter(|n| valid_name(n)) else {
        let why = if zone.is_none() && !r.name.trim().ends_with('.') {
            "is relative, but there is no cluster zone: end it with a dot or set cluster"
        } else {
            "is not a valid DNS name"
        };
        c.push(format!("{path}.name"), format!("{} {why}", r.name));
        return None;
    };
    let target = |c: &mut Collector, t: &str| -> Option<String> {
        let abs = absolute(t, zone).filter(|n| valid_name(n) && !n.starts_with("*."));
        if abs.is_none() {
            c.push(
                format!("{path}.value"),
                format!("{t} is not a valid target name"),
            );
        }
        abs
    };
    let value = r.value.trim();
    let data = match kind.as_str() {
        "A" => match value.parse() {
            Ok(a) => RecordData::A(a),
            Err(_) => {
                c.push(
                    format!("{path}.value"),
                    format!("{value} is not an IPv4 address"),
                );
                return None;
            }
        },
        "AAAA" => match value.parse() {
            Ok(a) => RecordData::Aaaa(a),
            Err(_) => {
                c.push(
                    format!("{path}.value"),
                    format!("{value} is not an IPv6 address"),
                );
                return None;
            }
        },
        "CNAME" => RecordData::Cname(target(c, value)?),
        "PTR" => RecordData::Ptr(target(c, value)?),
        "TXT" => {
            if value.len() > 255 {
                c.push(
                    format!("{path}.value"),
                    "a TXT string holds at most 255 bytes",
                );
                return None;
            }
            RecordData::Txt(value.to_string())
        }
        "SRV" => {
            let parts: Vec<&str> = value.split_whitespace().collect();
            let parsed = match parts.as_slice() {
                [p, w, port, t] => match (p.parse(), w.parse(), port.parse()) {
                    (Ok(priority), Ok(weight), Ok(port)) => Some((priority, weight, port, *t)),
                    _ => None,
                },
                _ => None,
            };
            let Some((priority, weight, port, t)) = parsed else {
                c.push(
                    format!("{path}.value"),
                    format!("{value} is not \"priority weight port target\", such as \"0 10 2379 etcd-0\""),
                );
                return None;
            };
            RecordData::Srv {
                priority,
                weight,
                port,
                target: target(c, t)?,
            }
        }
        other => {
            c.push(
                format!("{path}.type"),
                format!("{other} is not one of: A, AAAA, CNAME, SRV, TXT, PTR"),
            );
            return None;
        }
    };
    Some(DnsRecord {
        name,
        ttl: r.ttl.unwrap_or(ttl),
        data,
    })
}

/// Explicit records replace derived ones of the same name and type.
fn merge(base: &[DnsRecord], overrides: Vec<DnsRecord>) -> Vec<DnsRecord> {
    let mut out: Vec<DnsRecord> = base
        .iter()
        .filter(|b| {
            !overrides
                .iter()
                .any(|o| o.name == b.name && o.data.type_name() == b.data.type_name())
        })
        .cloned()
        .collect();
    out.extend(overrides);
    out
}

struct Addresses {
    proxy: Option<Ipv4Addr>,
    proxy_v6: Option<Ipv6Addr>,
    /// `ingressAddress`: where the first cluster's `*.apps` resolves,
    /// whatever else is set.
    ingress: Option<Ipv4Addr>,
    /// The view reaches the VLAN (it has no proxy address of its own):
    /// clusters' `appsAddress` and the `kubernetes` aliases are answered
    /// in it, as only the VLAN reaches those addresses and has workers.
    on_vlan: bool,
}

fn derived(
    clusters: &[ServedCluster],
    a: &Addresses,
    appliance: Option<Ipv4Addr>,
    ttl: u32,
) -> Vec<DnsRecord> {
    let mut out = Vec::new();
    let a_record = |name: String, ip: Ipv4Addr| DnsRecord {
        name,
        ttl,
        data: RecordData::A(ip),
    };
    for (i, cl) in clusters.iter().enumerate() {
        let zone = format!("{}.", cl.domain().to_ascii_lowercase());
        for name in PROXIED_NAMES {
            if let Some(ip) = a.proxy {
                out.push(a_record(format!("{name}.{zone}"), ip));
            }
            if let Some(ip) = a.proxy_v6 {
                out.push(DnsRecord {
                    name: format!("{name}.{zone}"),
                    ttl,
                    data: RecordData::Aaaa(ip),
                });
            }
        }
        // *.apps resolves only where something answers it: a load
        // balancer on the VLAN, or the proxy when it routes the apps (a
        // proxy without an ingress would refuse those connections).
        let apps = a
            .ingress
            .filter(|_| i == 0)
            .or(cl.apps_address.filter(|_| a.on_vlan))
            .or(a.proxy.filter(|_| cl.apps_via_proxy()));
        if let Some(ip) = apps {
            out.push(a_record(format!("*.apps.{zone}"), ip));
        }
        if let Some(ip) = a.proxy_v6.filter(|_| cl.apps_via_proxy()) {
            out.push(DnsRecord {
                name: format!("*.apps.{zone}"),
                ttl,
                data: RecordData::Aaaa(ip),
            });
        }
    }
    // The in-cluster names of the API name no cluster: the proxy tells the
    // clusters apart by the worker's address.
    if a.on_vlan && clusters.iter().any(|cl| !cl.workers.is_empty()) {
        if let Some(ip) = a.proxy {
            for alias in KUBERNETES_ALIASES {
                out.push(a_record(format!("{alias}."), ip));
            }
        }
    }
    let Some(primary) = clusters.first() else {
        return out;
    };
    let zone = format!("{}.", primary.domain().to_ascii_lowercase());
    // The appliance names itself, forward and reverse, so tools like
    // traceroute show something meaningful.
    if let Some(ip) = appliance {
        out.push(a_record(format!("causeway.{zone}"), ip));
        out.push(DnsRecord {
            name: reverse_name(IpAddr::V4(ip)),
            ttl,
            data: RecordData::Ptr(format!("causeway.{zone}")),
        });
    }
    if let Some(ip) = a.proxy.filter(|p| Some(*p) != appliance) {
        out.push(DnsRecord {
            name: reverse_name(IpAddr::V4(ip)),
            ttl,
            data: RecordData::Ptr(format!("api.{zone}")),
        });
    }
    out
}

fn opt_ipv4(c: &mut Collector, path: &str, text: &Option<String>) -> Option<Ipv4Addr> {
    text.as_deref().and_then(|t| c.ipv4(path, t))
}

fn opt_ipv6(c: &mut Collector, path: &str, text: &Option<String>) -> Option<Ipv6Addr> {
    let t = text.as_deref()?;
    match t.trim().parse() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(path, format!("{t} is not an IPv6 address"));
            None
        }
    }
}

fn ip_nets(c: &mut Collector, path: &str, texts: &[String]) -> Vec<IpNet> {
    let mut out = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let t = t.trim();
        let parsed = t
            .parse::<IpNet>()
            .ok()
            .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from));
        match parsed {
            Some(n) => out.push(n.trunc()),
            None => c.push(
                format!("{path}[{i}]"),
                format!("{t} is not a CIDR or address"),
            ),
        }
    }
    out
}

pub(crate) fn validate(
    c: &mut Collector,
    d: FileDns,
    network: Option<&Network>,
    clusters: &[ServedCluster],
) -> Option<DnsConfig> {
    let mut zones = clusters
        .iter()
        .map(|cl| format!("{}.", cl.domain().to_ascii_lowercase()));
    let zone = zones.next();
    let other_zones: Vec<String> = zones.collect();
    let zone = zone.as_deref();
    let ttl = d.ttl.unwrap_or(DEFAULT_DNS_TTL);
    let appliance = network.and_then(|n| n.address);

    let mut listen = Vec::new();
    for (i, text) in d.listen.iter().enumerate() {
        match text.trim().parse::<SocketAddr>() {
            Ok(a) => listen.push(a),
            Err(_) => c.push(
                format!("dns.listen[{i}]"),
                format!("{text} is not an address:port such as 127.0.0.1:53"),
            ),
        }
    }
    if d.listen.is_empty() {
        match appliance {
            Some(a) => {
                listen.push(SocketAddr::from((a, 53)));
                listen.push(SocketAddr::from((Ipv4Addr::LOCALHOST, 53)));
            }
            None => c.push(
                "dns.listen",
                "nothing to listen on: list addresses, or set network.address",
            ),
        }
    }

    let top = Addresses {
        proxy: opt_ipv4(c, "dns.proxyAddress", &d.proxy_address).or(appliance),
        proxy_v6: opt_ipv6(c, "dns.proxyAddressV6", &d.proxy_address_v6),
        ingress: opt_ipv4(c, "dns.ingressAddress", &d.ingress_address),
        on_vlan: true,
    };
    let explicit: Vec<DnsRecord> = d
        .records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| record(c, &format!("dns.records[{i}]"), r, zone, ttl))
        .collect();
    let base = merge(&derived(clusters, &top, appliance, ttl), explicit.clone());

    let mut views = Vec::new();
    for (i, v) in d.views.iter().enumerate() {
        let path = format!("dns.views[{i}]");
        if v.clients.is_empty() {
            c.push(
                format!("{path}.clients"),
                "a view needs at least one client CIDR",
            );
        }
        if d.views[..i].iter().any(|o| o.name == v.name) || v.name == "default" {
            c.push(
                format!("{path}.name"),
                format!(
                    "{} is used twice (\"default\" is the last, implicit view)",
                    v.name
                ),
            );
        }
        let clients = ip_nets(c, &format!("{path}.clients"), &v.clients);
        let own_proxy = opt_ipv4(c, &format!("{path}.proxyAddress"), &v.proxy_address);
        let addrs = Addresses {
            on_vlan: own_proxy.is_none(),
            proxy: own_proxy.or(top.proxy),
            proxy_v6: opt_ipv6(c, &format!("{path}.proxyAddressV6"), &v.proxy_address_v6)
                .or(top.proxy_v6),
            ingress: opt_ipv4(c, &format!("{path}.ingressAddress"), &v.ingress_address)
                .or(top.ingress),
        };
        let own: Vec<DnsRecord> = v
            .records
            .iter()
            .enumerate()
            .filter_map(|(j, r)| record(c, &format!("{path}.records[{j}]"), r, zone, ttl))
            .collect();
        // A view starts from the derived records for its own addresses and
        // the shared explicit records, then applies its own.
        let shared = merge(&derived(clusters, &addrs, appliance, ttl), explicit.clone());
        views.push(DnsView {
            name: v.name.clone(),
            clients,
            records: merge(&shared, own),
        });
    }
    views.push(DnsView {
        name: "default".into(),
        clients: Vec::new(),
        records: base,
    });

    let mut upstreams = Vec::new();
    let mut system_upstreams = false;
    if d.upstreams.len() > MAX_UPSTREAMS {
        c.push(
            "dns.upstreams",
            format!(
                "{} listed; at most {MAX_UPSTREAMS} (each is tried in turn within one client's timeout)",
                d.upstreams.len()
            ),
        );
    }
    for (i, text) in d.upstreams.iter().enumerate() {
        let t = text.trim();
        if t == SYSTEM_UPSTREAMS || t == "/etc/resolv.conf" {
            system_upstreams = true;
            continue;
        }
        let parsed = t
            .parse::<SocketAddr>()
            .ok()
            .or_else(|| t.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)));
        match parsed {
            Some(a) => upstreams.push(a),
            None => c.push(
                format!("dns.upstreams[{i}]"),
                format!("{t} is not an address or address:port"),
            ),
        }
    }
    let upstream_policy = match d.upstream_policy.as_deref() {
        None | Some("sequential") => UpstreamPolicy::Sequential,
        Some("random") => UpstreamPolicy::Random,
        Some(other) => {
            c.push(
                "dns.upstreamPolicy",
                format!("{other} is not one of: sequential, random"),
            );
            UpstreamPolicy::Sequential
        }
    };
    let upstream_timeout = d
        .upstream_timeout
        .as_ref()
        .and_then(|v| c.duration("dns.upstreamTimeout", v))
        .unwrap_or(DEFAULT_UPSTREAM_TIMEOUT);
    let cache = CacheConfig {
        max_entries: d.cache.max_entries.unwrap_or(100_000),
        max_bytes: match d.cache.max_bytes {
            Some(n) if n < MIN_CACHE_BYTES => {
                c.push(
                    "dns.cache.maxBytes",
                    format!("{n} is too small: at least {MIN_CACHE_BYTES} (64 KiB)"),
                );
                DEFAULT_CACHE_BYTES
            }
            Some(n) => n,
            None => DEFAULT_CACHE_BYTES,
        },
        max_entry_bytes: match d.cache.max_entry_bytes {
            Some(n) if !(512..=65535).contains(&n) => {
                c.push(
                    "dns.cache.maxEntryBytes",
                    format!("{n} is out of range: 512 to 65535 (a DNS message's largest size)"),
                );
                DEFAULT_CACHE_ENTRY_BYTES
            }
            Some(n) => n,
            None => DEFAULT_CACHE_ENTRY_BYTES,
        },
        max_ttl: d
            .cache
            .max_ttl
            .as_ref()
            .and_then(|v| c.duration("dns.cache.maxTtl", v))
            .unwrap_or(Duration::from_secs(3600)),
        max_negative_ttl: d
            .cache
            .max_negative_ttl
            .as_ref()
            .and_then(|v| c.duration("dns.cache.maxNegativeTtl", v))
            .unwrap_or(Duration::from_secs(300)),
        serve_stale: d.cache.serve_stale.unwrap_or(true),
    };
    let recursion_clients = match &d.recursion_clients {
        Some(list) => ip_nets(c, "dns.recursionClients", list),
        None => {
            let mut v: Vec<IpNet> = ["127.0.0.0/8", "::1/128"]
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect();
            if let Some(n) = network {
                v.push(IpNet::V4(n.cidr));
            }
            v
        }
    };
    let tcp_idle_timeout = d
        .tcp_idle_timeout
        .as_ref()
        .and_then(|v| c.duration("dns.tcpIdleTimeout", v))
        .unwrap_or(Duration::from_secs(10));

    Some(DnsConfig {
        listen,
        zone: zone.map(str::to_string),
        other_zones,
        reverse: network.map(|n| n.cidr),
        reverse_v6: None,
        views,
        upstreams,
        system_upstreams,
        upstream_policy,
        upstream_timeout,
        max_upstream_in_flight: d.max_upstream_in_flight.unwrap_or(1024).max(1),
        cache,
        recursion_clients,
        tcp_idle_timeout,
        max_tcp_connections: d.max_tcp_connections.unwrap_or(1024).max(1),
        max_tcp_connections_per_source: d
            .max_tcp_connections_per_source
            .unwrap_or(DEFAULT_TCP_PER_SOURCE)
            .clamp(1, d.max_tcp_connections.unwrap_or(1024).max(1)),
        udp_sockets: d.udp_sockets.unwrap_or(0),
        pin_udp_threads: d.pin_udp_threads.unwrap_or(false),
        ttl,
    })
}
