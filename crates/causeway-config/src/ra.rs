//! The `routerAdvertisements:` section: IPv6 router advertisements on the
//! VLAN interface (RFC 4861), so a worker forms its v6 address by SLAAC
//! and learns its DNS servers and search domains (RFC 8106) with no
//! DHCPv6 at all, or learns from the M and O flags that DHCPv6 serves it.
//!
//! The bounds are RFC 4861's (section 6.2.1) and RFC 8106's (section 5):
//! a value outside them is refused with the rule it breaks, since hosts
//! are entitled to ignore an advertisement that breaks them.

use std::net::Ipv6Addr;
use std::time::Duration;

use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use crate::collector::{yes, Collector, FileDuration};
use crate::network::Cluster;

/// RFC 4861's default MaxRtrAdvInterval.
pub const DEFAULT_MAX_INTERVAL: Duration = Duration::from_secs(600);
/// RFC 4861's default AdvValidLifetime: 30 days.
pub const DEFAULT_VALID_LIFETIME: Duration = Duration::from_secs(2_592_000);
/// RFC 4861's default AdvPreferredLifetime: 7 days.
pub const DEFAULT_PREFERRED_LIFETIME: Duration = Duration::from_secs(604_800);
/// The hop limit hosts use for their own packets; 64 as Linux's default.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRouterAdvertisements {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The VLAN interface; `network.interface` when left out.
    pub interface: Option<String>,
    #[serde(default)]
    pub prefixes: Vec<FilePrefix>,
    /// M: addresses come from DHCPv6.
    #[serde(default)]
    pub managed: bool,
    /// O: other settings (DNS) come from DHCPv6.
    #[serde(default)]
    pub other_config: bool,
    /// How long hosts keep this router as a default router; `0` announces
    /// prefixes and DNS without becoming one.
    pub router_lifetime: Option<FileDuration>,
    pub min_interval: Option<FileDuration>,
    pub max_interval: Option<FileDuration>,
    pub hop_limit: Option<u8>,
    pub mtu: Option<u32>,
    /// RDNSS: the DNS servers' v6 addresses.
    #[serde(default)]
    pub dns_servers: Vec<String>,
    /// DNSSL: the search domains; the cluster's domain when left out and a
    /// `cluster` is configured.
    pub search_domains: Option<Vec<String>>,
    /// How long hosts may use the DNS servers and search domains.
    pub dns_lifetime: Option<FileDuration>,
    /// The link-local address to send from: under HA, a floating one, so
    /// that hosts see the same router after a failover.
    pub source: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilePrefix {
    pub prefix: String,
    #[serde(default = "yes")]
    pub on_link: bool,
    /// Hosts form addresses in the prefix themselves (SLAAC).
    #[serde(default = "yes")]
    pub autonomous: bool,
    pub valid_lifetime: Option<FileDuration>,
    pub preferred_lifetime: Option<FileDuration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdvertisedPrefix {
    pub prefix: Ipv6Net,
    pub on_link: bool,
    pub autonomous: bool,
    pub valid_lifetime: Duration,
    pub preferred_lifetime: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterAdvertConfig {
    pub interface: String,
    pub prefixes: Vec<AdvertisedPrefix>,
    pub managed: bool,
    pub other_config: bool,
    pub router_lifetime: Duration,
    pub min_interval: Duration,
    pub max_interval: Duration,
    pub hop_limit: u8,
    pub mtu: Option<u32>,
    pub dns_servers: Vec<Ipv6Addr>,
    pub search_domains: Vec<String>,
    pub dns_lifetime: Duration,
    pub source: Option<Ipv6Addr>,
}

/// The IPv6 join subnets OVN-Kubernetes routes inside a cluster's nodes:
/// its default fd98::/64, fd97::/64 between, and fd99::/64, which
/// HyperShift gives KubeVirt guests since its PR #8421. A node with an
/// address there sends that prefix's traffic into OVN, not onto the VLAN.
const OVN_JOIN_PREFIXES: [u16; 3] = [0xfd97, 0xfd98, 0xfd99];

/// Refuses a VLAN prefix that overlaps an OVN join subnet.
pub(crate) fn refuse_ovn_overlap_v6(c: &mut Collector, path: &str, net: Ipv6Net) {
    let overlapping = OVN_JOIN_PREFIXES
        .iter()
        .filter_map(|first| Ipv6Net::new(Ipv6Addr::new(*first, 0, 0, 0, 0, 0, 0, 0), 64).ok())
        .find(|join| join.contains(&net.network()) || net.contains(&join.network()));
    if let Some(join) = overlapping {
        c.push(
            path,
            format!(
                "{net} overlaps {join}, inside fd97::/64–fd99::/64: the join subnets OVN-Kubernetes routes inside a hosted cluster's nodes (fd98::/64 by default, fd99::/64 for KubeVirt guests); nodes with addresses there would send this prefix's traffic into OVN instead of onto the VLAN. Choose a prefix outside that range"
            ),
        );
    }
}

fn ipv6(c: &mut Collector, path: &str, text: &str) -> Option<Ipv6Addr> {
    match text.trim().parse() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(path, format!("{text} is not an IPv6 address"));
            None
        }
    }
}

fn is_link_local(a: Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// A duration that may be zero (a lifetime of 0 means "not at all").
fn duration_or_zero(c: &mut Collector, path: &str, value: &FileDuration) -> Option<Duration> {
    match value {
        FileDuration::Seconds(0) => Some(Duration::ZERO),
        FileDuration::Text(t) if t.trim() == "0" || t.trim() == "0s" => Some(Duration::ZERO),
        other => c.duration(path, other),
    }
}

/// Whole seconds, as every lifetime and interval goes on the wire.
fn whole_seconds(c: &mut Collector, path: &str, d: Duration) -> Option<Duration> {
    if d.subsec_nanos() == 0 {
        Some(d)
    } else {
        c.push(
            path,
            format!(
                "{} is not a whole number of seconds, as router advertisements carry it",
                humantime::format_duration(d)
            ),
        );
        None
    }
}

fn prefix(c: &mut Collector, path: &str, p: &FilePrefix) -> Option<AdvertisedPrefix> {
    let net = match p.prefix.trim().parse::<Ipv6Net>() {
        Ok(n) if n.trunc() == n => Some(n),
        Ok(n) => {
            c.push(
                format!("{path}.prefix"),
                format!(
                    "{} has host bits set; the prefix is {}",
                    p.prefix,
                    n.trunc()
                ),
            );
            None
        }
        Err(_) => {
            c.push(
                format!("{path}.prefix"),
                format!("{} is not an IPv6 prefix such as fd42:10::/64", p.prefix),
            );
            None
        }
    };
    let valid = match &p.valid_lifetime {
        Some(v) => duration_or_zero(c, &format!("{path}.validLifetime"), v)
            .and_then(|d| whole_seconds(c, &format!("{path}.validLifetime"), d)),
        None => Some(DEFAULT_VALID_LIFETIME),
    };
    let preferred = match &p.preferred_lifetime {
        Some(v) => duration_or_zero(c, &format!("{path}.preferredLifetime"), v)
            .and_then(|d| whole_seconds(c, &format!("{path}.preferredLifetime"), d)),
        None => Some(DEFAULT_PREFERRED_LIFETIME.min(valid.unwrap_or(DEFAULT_VALID_LIFETIME))),
    };
    let net = net?;
    let first = net.network().segments()[0];
    if is_link_local(net.network()) || first >> 8 == 0xff || net.network().is_unspecified() {
        c.push(
            format!("{path}.prefix"),
            format!("{net} is link-local, multicast or unspecified; hosts ignore such a prefix"),
        );
    }
    refuse_ovn_overlap_v6(c, &format!("{path}.prefix"), net);
    if p.autonomous && net.prefix_len() != 64 {
        c.push(
            format!("{path}.prefix"),
            format!(
                "{net} is not a /64: hosts on Ethernet form SLAAC addresses only from a /64 (RFC 4862 with RFC 4291's 64-bit interface identifiers); set autonomous: false to announce it on-link only"
            ),
        );
    }
    let (valid, preferred) = (valid?, preferred?);
    if preferred > valid {
        c.push(
            format!("{path}.preferredLifetime"),
            format!(
                "{} is longer than validLifetime {}",
                humantime::format_duration(preferred),
                humantime::format_duration(valid)
            ),
        );
    }
    for (field, d) in [("validLifetime", valid), ("preferredLifetime", preferred)] {
        if d.as_secs() > u64::from(u32::MAX) {
            c.push(
                format!("{path}.{field}"),
                "is longer than a router advertisement carries (2^32 - 1 seconds)",
            );
        }
    }
    Some(AdvertisedPrefix {
        prefix: net,
        on_link: p.on_link,
        autonomous: p.autonomous,
        valid_lifetime: valid,
        preferred_lifetime: preferred,
    })
}

pub(crate) fn validate(
    c: &mut Collector,
    r: FileRouterAdvertisements,
    network_interface: Option<&str>,
    cluster: Option<&Cluster>,
) -> Option<RouterAdvertConfig> {
    const P: &str = "routerAdvertisements";
    let interface = match r.interface.as_deref().or(network_interface) {
        Some(i) if !i.trim().is_empty() => Some(i.trim().to_string()),
        _ => {
            c.push(
                format!("{P}.interface"),
                "is required: the VLAN interface to advertise on (or set network.interface)",
            );
            None
        }
    };
    let max_interval = match &r.max_interval {
        Some(v) => c
            .duration(&format!("{P}.maxInterval"), v)
            .and_then(|d| whole_seconds(c, &format!("{P}.maxInterval"), d)),
        None => Some(DEFAULT_MAX_INTERVAL),
    };
    if let Some(max) = max_interval {
        if !(4..=1800).contains(&max.as_secs()) {
            c.push(
                format!("{P}.maxInterval"),
                format!(
                    "{} is outside 4s–1800s (RFC 4861's MaxRtrAdvInterval)",
                    humantime::format_duration(max)
                ),
            );
        }
    }
    let max = max_interval.unwrap_or(DEFAULT_MAX_INTERVAL);
    let min_interval = match &r.min_interval {
        Some(v) => c.duration(&format!("{P}.minInterval"), v).and_then(|d| {
            let upper = max.mul_f64(0.75);
            if d < Duration::from_secs(3) || d > upper {
                c.push(
                    format!("{P}.minInterval"),
                    format!(
                        "{} is outside 3s–{} (RFC 4861's MinRtrAdvInterval: at least 3 s, at most 0.75 × maxInterval)",
                        humantime::format_duration(d),
                        humantime::format_duration(upper)
                    ),
                );
                None
            } else {
                Some(d)
            }
        }),
        // RFC 4861's default is a third of the maximum; below 9 s that
        // would be under its 3 s floor, so three quarters instead.
        None if max >= Duration::from_secs(9) => Some(max.mul_f64(0.33)),
        None => Some(max.mul_f64(0.75).max(Duration::from_secs(3))),
    };
    let router_lifetime = match &r.router_lifetime {
        Some(v) => duration_or_zero(c, &format!("{P}.routerLifetime"), v)
            .and_then(|d| whole_seconds(c, &format!("{P}.routerLifetime"), d)),
        None => Some((max * 3).min(Duration::from_secs(9000))),
    };
    if let Some(l) = router_lifetime {
        if !l.is_zero() && (l < max || l.as_secs() > 9000) {
            c.push(
                format!("{P}.routerLifetime"),
                format!(
                    "{} is neither 0 nor between maxInterval ({}) and 9000s (RFC 4861's AdvDefaultLifetime)",
                    humantime::format_duration(l),
                    humantime::format_duration(max)
                ),
            );
        }
    }
    if r.hop_limit == Some(0) {
        c.push(
            format!("{P}.hopLimit"),
            "must be 1–255; leave it out for the default of 64",
        );
    }
    if let Some(mtu) = r.mtu {
        if !(1280..=65535).contains(&mtu) {
            c.push(
                format!("{P}.mtu"),
                format!("{mtu} is outside 1280–65535 (IPv6's minimum link MTU up)"),
            );
        }
    }
    let prefixes: Vec<AdvertisedPrefix> = r
        .prefixes
        .iter()
        .enumerate()
        .filter_map(|(i, p)| prefix(c, &format!("{P}.prefixes[{i}]"), p))
        .collect();
    for (i, p) in prefixes.iter().enumerate() {
        if let Some(j) = prefixes[..i].iter().position(|o| {
            o.prefix.contains(&p.prefix.network()) || p.prefix.contains(&o.prefix.network())
        }) {
            c.push(
                format!("{P}.prefixes[{i}].prefix"),
                format!("{} overlaps prefixes[{j}]", p.prefix),
            );
        }
    }
    let dns_servers: Vec<Ipv6Addr> = r
        .dns_servers
        .iter()
        .enumerate()
        .filter_map(|(i, t)| ipv6(c, &format!("{P}.dnsServers[{i}]"), t))
        .collect();
    for (i, a) in dns_servers.iter().enumerate() {
        if a.is_unspecified() || a.is_multicast() {
            c.push(
                format!("{P}.dnsServers[{i}]"),
                format!("{a} is not a unicast address"),
            );
        }
    }
    let search_domains = match &r.search_domains {
        Some(list) => list.clone(),
        None => cluster.map(|cl| vec![cl.domain()]).unwrap_or_default(),
    };
    for (i, d) in search_domains.iter().enumerate() {
        if !crate::name::valid_name(d.trim_end_matches('.'), crate::name::NameRules::DNS) {
            c.push(
                format!("{P}.searchDomains[{i}]"),
                format!("{d} is not a DNS name"),
            );
        }
    }
    let dns_lifetime = match &r.dns_lifetime {
        Some(v) => c
            .duration(&format!("{P}.dnsLifetime"), v)
            .and_then(|d| whole_seconds(c, &format!("{P}.dnsLifetime"), d)),
        // RFC 8106 section 5.1: by default at least three times the
        // longest interval, so one or two lost advertisements do not
        // take the servers away.
        None => Some(max * 3),
    };
    if let Some(l) = dns_lifetime {
        if l < max || l.as_secs() > u64::from(u32::MAX - 1) {
            c.push(
                format!("{P}.dnsLifetime"),
                format!(
                    "{} is under maxInterval ({}): hosts would drop the DNS servers between advertisements (RFC 8106 section 5.1)",
                    humantime::format_duration(l),
                    humantime::format_duration(max)
                ),
            );
        }
    }
    let source = r
        .source
        .as_deref()
        .and_then(|s| ipv6(c, &format!("{P}.source"), s));
    if let Some(s) = source {
        if !is_link_local(s) {
            c.push(
                format!("{P}.source"),
                format!("{s} is not link-local (fe80::/10): hosts accept router advertisements only from a link-local source (RFC 4861 section 6.1.2)"),
            );
        }
    }
    if prefixes.is_empty() && dns_servers.is_empty() && !r.managed && !r.other_config {
        c.push(
            format!("{P}.prefixes"),
            "announces nothing: give a prefix, dnsServers, or the managed or otherConfig flag",
        );
    }
    Some(RouterAdvertConfig {
        interface: interface?,
        prefixes,
        managed: r.managed,
        other_config: r.other_config,
        router_lifetime: router_lifetime?,
        min_interval: min_interval?,
        max_interval: max_interval?,
        hop_limit: r.hop_limit.unwrap_or(DEFAULT_HOP_LIMIT),
        mtu: r.mtu,
        dns_servers,
        search_domains: search_domains
            .iter()
            .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
            .collect(),
        dns_lifetime: dns_lifetime?,
        source,
    })
}
