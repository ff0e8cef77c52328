//! The `dhcp6:` section. Stateless DHCPv6 (RFC 8415 section 6.1): the DNS
//! servers and search domains for hosts that form their addresses by SLAAC
//! and ask for the rest with an Information-Request (the O flag of the
//! router advertisements tells them to). Stateful DHCPv6 when `pools` or
//! `reservations` are given: addresses (IA_NA) leased from the pools, kept
//! in the `dhcp` section's lease file beside the v4 leases.

use std::net::Ipv6Addr;
use std::time::Duration;

use ipnet::Ipv6Net;
use serde::{Deserialize, Serialize};

use crate::collector::{yes, Collector, FileDuration};
use crate::network::Cluster;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileDhcp6 {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The VLAN interface; `network.interface` when left out.
    pub interface: Option<String>,
    #[serde(default)]
    pub dns_servers: Vec<String>,
    /// The cluster's domain when left out and a `cluster` is configured.
    pub domain_search: Option<Vec<String>>,
    /// How long hosts keep the answer before asking again (RFC 8415's
    /// default, a day, when left out).
    pub information_refresh_time: Option<FileDuration>,
    /// The server's DUID as hex; DUID-LL of the interface's MAC when left
    /// out.
    pub server_duid: Option<String>,
    /// The link's prefix: addresses are leased from it, and a Confirm is
    /// answered by whether the client's addresses are inside it.
    pub prefix: Option<String>,
    #[serde(default)]
    pub pools: Vec<FilePool6>,
    #[serde(default)]
    pub reservations: Vec<FileReservation6>,
    /// 1h when left out.
    pub preferred_lifetime: Option<FileDuration>,
    /// Twice the preferred lifetime when left out.
    pub valid_lifetime: Option<FileDuration>,
    /// Answer a Solicit carrying Rapid Commit with the lease at once
    /// (RFC 8415 section 18.3.1); off by default, as in RFC 8415.
    #[serde(default)]
    pub rapid_commit: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilePool6 {
    pub start: String,
    pub end: String,
}

/// A fixed address for one client, chosen by its DUID, or by its
/// link-layer address: read from a DUID-LL or DUID-LLT, or from the Client
/// Link-Layer Address a relay adds (RFC 6939).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileReservation6 {
    pub duid: Option<String>,
    pub mac: Option<String>,
    pub ip: String,
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool6 {
    pub start: Ipv6Addr,
    pub end: Ipv6Addr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation6 {
    pub duid: Option<Vec<u8>>,
    pub mac: Option<[u8; 6]>,
    pub ip: Ipv6Addr,
    pub hostname: Option<String>,
}

/// What stateful DHCPv6 leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stateful6 {
    pub prefix: Ipv6Net,
    pub pools: Vec<Pool6>,
    pub reservations: Vec<Reservation6>,
    pub preferred_lifetime: Duration,
    pub valid_lifetime: Duration,
    pub rapid_commit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dhcp6Config {
    pub interface: String,
    pub dns_servers: Vec<Ipv6Addr>,
    pub domain_search: Vec<String>,
    pub information_refresh_time: Option<Duration>,
    pub server_duid: Option<Vec<u8>>,
    /// Set when addresses are leased; stateless only when `None`.
    pub stateful: Option<Stateful6>,
}

pub(crate) fn validate(
    c: &mut Collector,
    d: FileDhcp6,
    network_interface: Option<&str>,
    cluster: Option<&Cluster>,
) -> Option<Dhcp6Config> {
    const P: &str = "dhcp6";
    let interface = match d.interface.as_deref().or(network_interface) {
        Some(i) if !i.trim().is_empty() => Some(i.trim().to_string()),
        _ => {
            c.push(
                format!("{P}.interface"),
                "is required: the VLAN interface to serve on (or set network.interface)",
            );
            None
        }
    };
    let dns_servers: Vec<Ipv6Addr> = d
        .dns_servers
        .iter()
        .enumerate()
        .filter_map(|(i, t)| match t.trim().parse::<Ipv6Addr>() {
            Ok(a) if a.is_unspecified() || a.is_multicast() => {
                c.push(
                    format!("{P}.dnsServers[{i}]"),
                    format!("{a} is not a unicast address"),
                );
                None
            }
            Ok(a) => Some(a),
            Err(_) => {
                c.push(
                    format!("{P}.dnsServers[{i}]"),
                    format!("{t} is not an IPv6 address"),
                );
                None
            }
        })
        .collect();
    let domain_search = match &d.domain_search {
        Some(list) => list.clone(),
        None => cluster.map(|cl| vec![cl.domain()]).unwrap_or_default(),
    };
    for (i, name) in domain_search.iter().enumerate() {
        if !crate::name::valid_name(name.trim_end_matches('.'), crate::name::NameRules::DNS) {
            c.push(
                format!("{P}.domainSearch[{i}]"),
                format!("{name} is not a DNS name"),
            );
        }
    }
    let information_refresh_time = d.information_refresh_time.as_ref().and_then(|v| {
        let path = format!("{P}.informationRefreshTime");
        let t = c.duration(&path, v)?;
        // RFC 8415 section 21.23: at least IRT_MINIMUM, 600 s.
        if t < Duration::from_secs(600) || t.as_secs() > u64::from(u32::MAX) {
            c.push(
                path,
                format!(
                    "{} is outside 10m–136y (RFC 8415's minimum is 600 s)",
                    humantime::format_duration(t)
                ),
            );
            return None;
        }
        Some(t)
    });
    let server_duid = d.server_duid.as_deref().and_then(|t| {
        match crate::collector::parse_hex(t) {
            // RFC 8415 section 11.1: 2 bytes of type and up to 128 more.
            Some(b) if (3..=130).contains(&b.len()) => Some(b),
            _ => {
                c.push(
                    format!("{P}.serverDuid"),
                    format!("{t} is not a DUID: 3 to 130 bytes of hex"),
                );
                None
            }
        }
    });
    let stateful = stateful(c, &d);
    if dns_servers.is_empty() && domain_search.is_empty() && stateful.is_none() {
        c.push(
            format!("{P}.dnsServers"),
            "serves nothing: give dnsServers or domainSearch (or a cluster for its domain)",
        );
    }
    Some(Dhcp6Config {
        interface: interface?,
        dns_servers,
        domain_search: domain_search
            .iter()
            .map(|d| d.trim_end_matches('.').to_ascii_lowercase())
            .collect(),
        information_refresh_time,
        server_duid,
        stateful,
    })
}

/// The most addresses one pool may span: far beyond any VLAN's hosts, and
/// small enough that a pool's offset fits the allocator's counters.
const MAX_POOL_SIZE: u128 = 1 << 32;

fn v6(c: &mut Collector, path: String, text: &str) -> Option<Ipv6Addr> {
    match text.trim().parse::<Ipv6Addr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(path, format!("{text} is not an IPv6 address"));
            None
        }
    }
}

fn lifetime(c: &mut Collector, path: &str, v: Option<&FileDuration>) -> Option<Option<Duration>> {
    let Some(v) = v else { return Some(None) };
    let t = c.duration(path, v)?;
    if t.as_secs() == 0 || t.as_secs() >= u64::from(u32::MAX) {
        c.push(
            path,
            format!(
                "{} is outside 1s–136y (0xffffffff means forever, which a lease is not)",
                humantime::format_duration(t)
            ),
        );
        return None;
    }
    Some(Some(t))
}

fn stateful(c: &mut Collector, d: &FileDhcp6) -> Option<Stateful6> {
    const P: &str = "dhcp6";
    if d.pools.is_empty() && d.reservations.is_empty() {
        for (field, set) in [
            ("prefix", d.prefix.is_some()),
            ("preferredLifetime", d.preferred_lifetime.is_some()),
            ("validLifetime", d.valid_lifetime.is_some()),
            ("rapidCommit", d.rapid_commit),
        ] {
            if set {
                c.push(
                    format!("{P}.{field}"),
                    "applies to leased addresses: give pools or reservations as well",
                );
            }
        }
        return None;
    }
    let prefix = match d
        .prefix
        .as_deref()
        .map(|t| (t, t.trim().parse::<Ipv6Net>()))
    {
        Some((_, Ok(net))) if net.prefix_len() <= 120 => {
            crate::ra::refuse_ovn_overlap_v6(c, &format!("{P}.prefix"), net.trunc());
            Some(net.trunc())
        }
        Some((t, Ok(_))) => {
            c.push(format!("{P}.prefix"), format!("{t} is longer than /120"));
            None
        }
        Some((t, Err(_))) => {
            c.push(format!("{P}.prefix"), format!("{t} is not an IPv6 prefix"));
            None
        }
        None => {
            c.push(
                format!("{P}.prefix"),
                "is required with pools or reservations: the link's prefix, such as fd42:10::/64",
            );
            None
        }
    };
    let mut pools: Vec<Pool6> = Vec::new();
    for (i, p) in d.pools.iter().enumerate() {
        let path = format!("{P}.pools[{i}]");
        let (Some(start), Some(end)) = (
            v6(c, format!("{path}.start"), &p.start),
            v6(c, format!("{path}.end"), &p.end),
        ) else {
            continue;
        };
        if u128::from(start) > u128::from(end) {
            c.push(path, format!("starts after it ends ({start} > {end})"));
            continue;
        }
        if u128::from(end) - u128::from(start) >= MAX_POOL_SIZE {
            c.push(
                path,
                "spans more than 2^32 addresses; split it or narrow it".to_string(),
            );
            continue;
        }
        if let Some(net) = prefix {
            if !net.contains(&start) || !net.contains(&end) {
                c.push(
                    path,
                    format!("{start}–{end} is not inside the prefix {net}"),
                );
                continue;
            }
        }
        if let Some(other) = pools.iter().position(|o| {
            u128::from(start) <= u128::from(o.end) && u128::from(o.start) <= u128::from(end)
        }) {
            c.push(path, format!("overlaps {P}.pools[{other}]"));
            continue;
        }
        pools.push(Pool6 { start, end });
    }
    let mut reservations: Vec<Reservation6> = Vec::new();
    for (i, r) in d.reservations.iter().enumerate() {
        let path = format!("{P}.reservations[{i}]");
        let Some(ip) = v6(c, format!("{path}.ip"), &r.ip) else {
            continue;
        };
        if let Some(net) = prefix {
            if !net.contains(&ip) {
                c.push(
                    format!("{path}.ip"),
                    format!("{ip} is not inside the prefix {net}"),
                );
            }
        }
        let duid = r
            .duid
            .as_deref()
            .and_then(|t| match crate::collector::parse_hex(t) {
                Some(b) if (3..=130).contains(&b.len()) => Some(b),
                _ => {
                    c.push(
                        format!("{path}.duid"),
                        format!("{t} is not a DUID: 3 to 130 bytes of hex"),
                    );
                    None
                }
            });
        let mac = r
            .mac
            .as_deref()
            .and_then(|t| match crate::collector::parse_mac(t) {
                Some(m) => Some(m),
                None => {
                    c.push(format!("{path}.mac"), format!("{t} is not a MAC address"));
                    None
                }
            });
        if r.duid.is_none() && r.mac.is_none() {
            c.push(path.clone(), "names no client: give duid or mac");
        }
        if let Some(h) = &r.hostname {
            if !crate::name::valid_name(h, crate::name::NameRules::HOST) || h.contains('.') {
                c.push(
                    format!("{path}.hostname"),
                    format!("{h} is not a host name"),
                );
            }
        }
        let clash = reservations.iter().position(|o| {
            o.ip == ip || (duid.is_some() && o.duid == duid) || (mac.is_some() && o.mac == mac)
        });
        if let Some(other) = clash {
            c.push(
                path,
                format!("names the address or the client of {P}.reservations[{other}] again"),
            );
            continue;
        }
        reservations.push(Reservation6 {
            duid,
            mac,
            ip,
            hostname: r.hostname.clone(),
        });
    }
    let preferred = lifetime(
        c,
        &format!("{P}.preferredLifetime"),
        d.preferred_lifetime.as_ref(),
    )?
    .unwrap_or(Duration::from_secs(3600));
    let valid = lifetime(c, &format!("{P}.validLifetime"), d.valid_lifetime.as_ref())?
        .unwrap_or(preferred.saturating_mul(2));
    if preferred > valid {
        c.push(
            format!("{P}.preferredLifetime"),
            "is longer than validLifetime (RFC 8415 section 21.6: clients discard such an address)",
        );
    }
    Some(Stateful6 {
        prefix: prefix?,
        pools,
        reservations,
        preferred_lifetime: preferred,
        valid_lifetime: valid,
        rapid_commit: d.rapid_commit,
    })
}
