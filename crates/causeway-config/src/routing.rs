//! The `routing:` section: policy routing so replies leave through the
//! VLAN interface a request came in on.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::collector::{yes, Collector};
use crate::network::Network;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRouting {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// For the `network` interface; each entry of `interfaces` has its own.
    pub table: Option<u32>,
    pub priority: Option<u32>,
    #[serde(default)]
    pub extra_routes: Vec<String>,
    /// Other VLAN interfaces; empty means the `network` interface alone.
    #[serde(default)]
    pub interfaces: Vec<FileRoutedInterface>,
    /// Set `rp_filter` to loose (2) on each routed interface.
    #[serde(default = "yes")]
    pub loose_rp_filter: bool,
    /// The `network` interface's v6 side, for a dual-stack VLAN.
    pub ipv6: Option<FileRoutedV6>,
}

/// An interface's v6 prefix, its own address there and the router, routed
/// in the v6 table of the same number with the same rule priority.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoutedV6 {
    pub cidr: String,
    pub address: String,
    /// Inside `cidr`, or link-local as v6 routers usually are.
    pub gateway: String,
    #[serde(default)]
    pub extra_routes: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoutedInterface {
    pub interface: String,
    pub cidr: String,
    pub address: String,
    pub gateway: String,
    pub table: Option<u32>,
    pub priority: Option<u32>,
    #[serde(default)]
    pub extra_routes: Vec<String>,
    pub ipv6: Option<FileRoutedV6>,
}

/// One VLAN interface and the routing table that answers from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedInterface {
    pub interface: String,
    pub cidr: Ipv4Net,
    pub address: Ipv4Addr,
    pub gateway: Ipv4Addr,
    pub table: u32,
    pub priority: u32,
    /// Remote subnets reached through `gateway`, besides the default route.
    pub extra_routes: Vec<Ipv4Net>,
    pub ipv6: Option<RoutedV6>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedV6 {
    pub cidr: Ipv6Net,
    pub address: Ipv6Addr,
    pub gateway: Ipv6Addr,
    pub extra_routes: Vec<Ipv6Net>,
}

fn routed_v6(c: &mut Collector, path: &str, f: &FileRoutedV6) -> Option<RoutedV6> {
    let cidr = match f.cidr.trim().parse::<Ipv6Net>() {
        Ok(n) => Some(n.trunc()),
        Err(_) => {
            c.push(
                format!("{path}.cidr"),
                format!("{} is not an IPv6 CIDR such as fd42:10::/64", f.cidr),
            );
            None
        }
    };
    let v6 = |c: &mut Collector, field: &str, text: &str| match text.trim().parse::<Ipv6Addr>() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(
                format!("{path}.{field}"),
                format!("{text} is not an IPv6 address"),
            );
            None
        }
    };
    let address = v6(c, "address", &f.address);
    let gateway = v6(c, "gateway", &f.gateway);
    let extra_routes: Vec<Ipv6Net> = f
        .extra_routes
        .iter()
        .enumerate()
        .filter_map(|(i, t)| match t.trim().parse::<Ipv6Net>() {
            Ok(n) => Some(n.trunc()),
            Err(_) => {
                c.push(
                    format!("{path}.extraRoutes[{i}]"),
                    format!("{t} is not an IPv6 CIDR"),
                );
                None
            }
        })
        .collect();
    let (cidr, address, gateway) = (cidr?, address?, gateway?);
    crate::ra::refuse_ovn_overlap_v6(c, &format!("{path}.cidr"), cidr);
    if !cidr.contains(&address) {
        c.push(
            format!("{path}.address"),
            format!("{address} is not in {cidr}"),
        );
    }
    let link_local = gateway.segments()[0] & 0xffc0 == 0xfe80;
    if !link_local && !cidr.contains(&gateway) {
        c.push(
            format!("{path}.gateway"),
            format!("{gateway} is neither in {cidr} nor link-local"),
        );
    }
    Some(RoutedV6 {
        cidr,
        address,
        gateway,
        extra_routes,
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingConfig {
    pub interfaces: Vec<RoutedInterface>,
    pub loose_rp_filter: bool,
}

/// The first table and rule priority causeway uses when none is given.
pub const DEFAULT_TABLE: u32 = 100;
pub const DEFAULT_PRIORITY: u32 = 1000;

/// Tables the kernel reserves: unspecified, default, main, local.
const RESERVED_TABLES: [u32; 4] = [0, 253, 254, 255];

fn check_table(c: &mut Collector, path: &str, table: u32) {
    if RESERVED_TABLES.contains(&table) {
        c.push(
            path,
            format!(
                "table {table} is reserved by the kernel (0, 253 default, 254 main, 255 local)"
            ),
        );
    }
}

fn check_priority(c: &mut Collector, path: &str, priority: u32) {
    // 0 is the local-table rule; 32766 and 32767 the main and default ones.
    if priority == 0 || priority >= 32766 {
        c.push(
            path,
            format!(
                "priority {priority} must be between 1 and 32765, before the main table's rule"
            ),
        );
    }
}

fn nets(c: &mut Collector, path: &str, texts: &[String]) -> Vec<Ipv4Net> {
    texts
        .iter()
        .enumerate()
        .filter_map(|(i, t)| match t.trim().parse::<Ipv4Net>() {
            Ok(n) => Some(n.trunc()),
            Err(_) => {
                c.push(
                    format!("{path}[{i}]"),
                    format!("{t} is not an IPv4 CIDR such as 10.20.0.0/16"),
                );
                None
            }
        })
        .collect()
}

fn ip(c: &mut Collector, path: &str, text: &str) -> Option<Ipv4Addr> {
    match text.trim().parse() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(path, format!("{text} is not an IPv4 address"));
            None
        }
    }
}

pub(crate) fn validate(
    c: &mut Collector,
    r: FileRouting,
    network: Option<&Network>,
) -> Option<RoutingConfig> {
    let mut interfaces = Vec::new();
    if r.interfaces.is_empty() {
        let Some(n) = network else {
            c.push(
                "routing",
                "needs network (interface, address, gateway) or routing.interfaces",
            );
            return None;
        };
        let mut missing = Vec::new();
        if n.interface.is_none() {
            missing.push("network.interface");
        }
        if n.address.is_none() {
            missing.push("network.address");
        }
        if n.gateway.is_none() {
            missing.push("network.gateway");
        }
        if !missing.is_empty() {
            c.push("routing", format!("needs {}", missing.join(", ")));
            return None;
        }
        let table = r.table.unwrap_or(DEFAULT_TABLE);
        let priority = r.priority.unwrap_or(DEFAULT_PRIORITY);
        check_table(c, "routing.table", table);
        check_priority(c, "routing.priority", priority);
        interfaces.push(RoutedInterface {
            interface: n.interface.clone().unwrap_or_default(),
            cidr: n.cidr,
            address: n.address.unwrap_or(Ipv4Addr::UNSPECIFIED),
            gateway: n.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED),
            table,
            priority,
            extra_routes: nets(c, "routing.extraRoutes", &r.extra_routes),
            ipv6: r
                .ipv6
                .as_ref()
                .and_then(|v| routed_v6(c, "routing.ipv6", v)),
        });
    } else {
        if r.table.is_some()
            || r.priority.is_some()
            || !r.extra_routes.is_empty()
            || r.ipv6.is_some()
        {
            c.push(
                "routing",
                "with interfaces listed, give table, priority, extraRoutes and ipv6 per interface",
            );
        }
        for (i, f) in r.interfaces.iter().enumerate() {
            let path = format!("routing.interfaces[{i}]");
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let table = f.table.unwrap_or(DEFAULT_TABLE.saturating_add(index));
            let priority = f.priority.unwrap_or(DEFAULT_PRIORITY.saturating_add(index));
            check_table(c, &format!("{path}.table"), table);
            check_priority(c, &format!("{path}.priority"), priority);
            if f.interface.trim().is_empty() {
                c.push(format!("{path}.interface"), "must not be empty");
            }
            let cidr = match f.cidr.trim().parse::<Ipv4Net>() {
                Ok(n) => Some(n.trunc()),
                Err(_) => {
                    c.push(
                        format!("{path}.cidr"),
                        format!("{} is not an IPv4 CIDR", f.cidr),
                    );
                    None
                }
            };
            let address = ip(c, &format!("{path}.address"), &f.address);
            let gateway = ip(c, &format!("{path}.gateway"), &f.gateway);
            let extra_routes = nets(c, &format!("{path}.extraRoutes"), &f.extra_routes);
            let ipv6 = f
                .ipv6
                .as_ref()
                .and_then(|v| routed_v6(c, &format!("{path}.ipv6"), v));
            if let (Some(cidr), Some(address), Some(gateway)) = (cidr, address, gateway) {
                if !cidr.contains(&address) {
                    c.push(
                        format!("{path}.address"),
                        format!("{address} is not in {cidr}"),
                    );
                }
                if !cidr.contains(&gateway) {
                    c.push(
                        format!("{path}.gateway"),
                        format!("{gateway} is not in {cidr}"),
                    );
                }
                interfaces.push(RoutedInterface {
                    interface: f.interface.trim().to_string(),
                    cidr,
                    address,
                    gateway,
                    table,
                    priority,
                    extra_routes,
                    ipv6,
                });
            }
        }
    }
    for (i, a) in interfaces.iter().enumerate() {
        for b in &interfaces[..i] {
            if a.table == b.table {
                c.push(
                    "routing",
                    format!(
                        "{} and {} both use table {}",
                        b.interface, a.interface, a.table
                    ),
                );
            }
            if a.interface == b.interface {
                c.push(
                    "routing",
                    format!("interface {} is listed twice", a.interface),
                );
            }
        }
    }
    Some(RoutingConfig {
        interfaces,
        loose_rp_filter: r.loose_rp_filter,
    })
}
