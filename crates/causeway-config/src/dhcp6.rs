//! The `dhcp6:` section: stateless DHCPv6 (RFC 8415 section 6.1): the DNS
//! servers and search domains for hosts that form their addresses by SLAAC
//! and ask for the rest with an Information-Request (the O flag of the
//! router advertisements tells them to).

use std::net::Ipv6Addr;
use std::time::Duration;

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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dhcp6Config {
    pub interface: String,
    pub dns_servers: Vec<Ipv6Addr>,
    pub domain_search: Vec<String>,
    pub information_refresh_time: Option<Duration>,
    pub server_duid: Option<Vec<u8>>,
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
    if dns_servers.is_empty() && domain_search.is_empty() {
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
    })
}
