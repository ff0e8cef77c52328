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

/// The IPv4 join subnets OVN-Kubernetes routes inside a cluster's nodes:
/// its default, 100.64.0.0/16, and 100.66.0.0/16, which HyperShift has
/// given KubeVirt guests since its PR #8421 so that a hosted cluster's join
/// subnet differs from its management cluster's, with 100.65.0.0/16
/// between them. A hosted cluster's node with an address there sends that
/// network's traffic into OVN instead of onto the VLAN.
const OVN_JOIN_SUBNETS: [[u8; 2]; 3] = [[100, 64], [100, 65], [100, 66]];

/// Refuses a VLAN or worker prefix that overlaps an OVN join subnet.
pub(crate) fn refuse_ovn_overlap(c: &mut Collector, path: &str, cidr: Ipv4Net) {
    let overlapping: Vec<Ipv4Net> = OVN_JOIN_SUBNETS
        .iter()
        .filter_map(|[a, b]| Ipv4Net::new(Ipv4Addr::new(*a, *b, 0, 0), 16).ok())
        .filter(|join| join.contains(&cidr.network()) || cidr.contains(&join.network()))
        .collect();
    if let Some(first) = overlapping.first() {
        c.push(
            path,
            format!(
                "{cidr} overlaps {first}, inside 100.64.0.0/16–100.66.0.0/16: the join subnets OVN-Kubernetes routes inside a hosted cluster's nodes (100.64.0.0/16 by default, 100.66.0.0/16 for KubeVirt guests); nodes with addresses there would send this network's traffic into OVN instead of onto the VLAN. Choose a prefix outside that range"
            ),
        );
    }
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
    refuse_ovn_overlap(c, "network.cidr", cidr);
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
