//! The `cluster` section (the hosted cluster's name and base domain) and
//! the `network` section (the VLAN: its CIDR, gateway, and the appliance's
//! own and its peers' static addresses).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::collector::Collector;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileCluster {
    pub name: String,
    pub base_domain: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileNetwork {
    pub interface: Option<String>,
    pub cidr: String,
    pub gateway: Option<String>,
    pub address: Option<String>,
    #[serde(default)]
    pub static_addresses: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub base_domain: String,
}

impl Cluster {
    /// `<name>.<baseDomain>`: the zone every hosted-cluster name lives in.
    pub fn domain(&self) -> String {
        format!("{}.{}", self.name, self.base_domain)
    }
}

/// The VLAN the appliance serves.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    pub interface: Option<String>,
    pub cidr: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    /// The appliance's own static address on the VLAN.
    pub address: Option<Ipv4Addr>,
    pub static_addresses: Vec<Ipv4Addr>,
}

pub(crate) fn validate_network(c: &mut Collector, n: FileNetwork) -> Option<Network> {
    let cidr = c.cidr("network.cidr", &n.cidr);
    let gateway = n
        .gateway
        .as_deref()
        .and_then(|g| c.ipv4("network.gateway", g));
    let address = n
        .address
        .as_deref()
        .and_then(|a| c.ipv4("network.address", a));
    let statics = c.ipv4_list("network.staticAddresses", &n.static_addresses);
    let cidr = cidr?;
    if let Some(g) = gateway {
        c.inside("network.gateway", g, cidr, "network.cidr");
    }
    if let Some(a) = address {
        if c.inside("network.address", a, cidr, "network.cidr") && Some(a) == gateway {
            c.push("network.address", format!("{a} is also the gateway"));
        }
    }
    for (i, s) in statics.iter().enumerate() {
        let path = format!("network.staticAddresses[{i}]");
        if c.inside(&path, *s, cidr, "network.cidr") {
            if Some(*s) == gateway {
                c.push(&path, format!("{s} is also the gateway"));
            }
            if Some(*s) == address {
                c.push(&path, format!("{s} is also network.address"));
            } else if let Some(j) = statics[..i].iter().position(|o| o == s) {
                c.push(&path, format!("{s} is also network.staticAddresses[{j}]"));
            }
        }
    }
    for (path, addr) in [("network.gateway", gateway), ("network.address", address)]
        .into_iter()
        .filter_map(|(p, a)| a.map(|a| (p, a)))
    {
        if cidr.prefix_len() < 31 && (addr == cidr.network() || addr == cidr.broadcast()) {
            c.push(
                path,
                format!("{addr} is the network or broadcast address of {cidr}"),
            );
        }
    }
    Some(Network {
        interface: n.interface,
        cidr,
        gateway,
        address,
        static_addresses: statics,
    })
}

pub(crate) fn validate_cluster(c: &mut Collector, cl: FileCluster) -> Cluster {
    if cl.name.trim().is_empty() {
        c.push("cluster.name", "must not be empty");
    }
    if cl.base_domain.trim().is_empty() {
        c.push("cluster.baseDomain", "must not be empty");
    }
    Cluster {
        name: cl.name.trim().to_string(),
        base_domain: cl.base_domain.trim().trim_end_matches('.').to_string(),
    }
}
