//! The `ha:` section: two replicas of the same services behind floating
//! service addresses. One replica is active and holds the addresses; the
//! other stands by, receives the DHCP lease log, and takes the addresses
//! over when the active stops answering.
//!
//! Two ways to decide who is active:
//! - `peer` (a VM pair): authenticated adverts between the two replicas,
//!   with priorities and optional preemption, as VRRP does. A partition of
//!   the link between them makes both active.
//! - `lease` (Kubernetes): the same adverts for fast detection, and a
//!   `coordination.k8s.io` Lease as the witness that settles a partition:
//!   a replica takes over only by winning the Lease, and an active that can
//!   reach neither its peer nor the API server gives its addresses up.

use std::path::PathBuf;
use std::time::Duration;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::collector::{yes, Collector, FileDuration};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum HaMode {
    /// The replicas decide between themselves (no API server).
    #[default]
    Peer,
    /// A Kubernetes Lease settles who is active when the peers cannot hear
    /// each other.
    Lease,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileHa {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub mode: HaMode,
    /// This replica's name, one of `replicas`. Left out: the environment's
    /// `CAUSEWAY_HA_NODE`, else the host name.
    pub node: Option<String>,
    /// Exactly two: this replica and its peer.
    #[serde(default)]
    pub replicas: Vec<FileReplica>,
    /// Where adverts (UDP) and the lease stream (TCP) are received. Left
    /// out: every address, on the port of this replica's entry.
    pub listen: Option<String>,
    /// Receive adverts and the lease stream on this interface only (the
    /// peer link or the pod network), never on the VLAN the clients share.
    pub listen_interface: Option<String>,
    /// A file holding the secret both replicas share; adverts and the lease
    /// stream are authenticated with it. At least 16 bytes.
    pub key_file: PathBuf,
    /// The VLAN interface the service addresses move on.
    pub interface: String,
    /// The service addresses, with their prefix (`192.168.10.2/24`).
    pub addresses: Vec<String>,
    /// The v6 service addresses, with their prefix (`fd42:10::2/64`),
    /// moved with the v4 ones; a link-local one (`fe80::1/64`) keeps the
    /// router advertisements' source across a failover.
    #[serde(default)]
    pub addresses_v6: Vec<String>,
    /// A higher-priority replica takes the addresses back from a lower one
    /// once it is in sync.
    #[serde(default)]
    pub preempt: bool,
    pub advert_interval: Option<FileDuration>,
    /// Adverts missed before the peer counts as gone.
    pub dead_adverts: Option<u32>,
    /// How long a DHCP ACK waits for the standby to confirm its batch before
    /// the active counts the standby as behind and serves alone.
    pub replication_timeout: Option<FileDuration>,
    pub lease: Option<FileHaLease>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileReplica {
    pub name: String,
    /// `host:port` its adverts and lease stream are sent to; a host name is
    /// resolved again whenever it is used (a pod's address changes).
    pub address: String,
    pub priority: Option<u8>,
    /// `ip:port` of this replica's own address on the clients' VLAN: the
    /// adverts go this way too, so a cut peer link alone is no partition.
    /// Set on both replicas or neither.
    pub vlan_address: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileHaLease {
    /// Left out: the namespace the pod runs in.
    pub namespace: Option<String>,
    pub name: String,
    /// The active writes the Lease this often while all is well, so the
    /// Lease shows a live holder; takeovers do not wait for it.
    pub renew_interval: Option<FileDuration>,
    /// The longest an API request may take before it counts as failed.
    pub api_timeout: Option<FileDuration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub name: String,
    pub address: String,
    pub priority: u8,
    pub vlan_address: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaLease {
    pub namespace: Option<String>,
    pub name: String,
    pub renew_interval: Duration,
    pub api_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaConfig {
    pub mode: HaMode,
    pub node: Option<String>,
    pub replicas: [Replica; 2],
    pub listen: Option<std::net::SocketAddr>,
    pub listen_interface: Option<String>,
    pub key_file: PathBuf,
    pub interface: String,
    pub addresses: Vec<Ipv4Net>,
    pub addresses_v6: Vec<ipnet::Ipv6Net>,
    pub preempt: bool,
    pub advert_interval: Duration,
    pub dead_adverts: u32,
    pub replication_timeout: Duration,
    pub lease: Option<HaLease>,
}

pub const DEFAULT_ADVERT_INTERVAL: Duration = Duration::from_millis(200);
pub const DEFAULT_DEAD_ADVERTS: u32 = 3;
pub const DEFAULT_REPLICATION_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest `replicationTimeout` accepted: a DHCP client retransmits
/// after about 4 s, so an ACK held longer is lost to it.
pub const MAX_REPLICATION_TIMEOUT: Duration = Duration::from_secs(4);
pub const DEFAULT_PRIORITY: u8 = 100;
pub const DEFAULT_LEASE_RENEW: Duration = Duration::from_secs(60);
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_millis(500);

impl HaConfig {
    /// How long the peer may be silent before it counts as gone.
    pub fn dead_after(&self) -> Duration {
        self.advert_interval * self.dead_adverts
    }

    /// This replica's entry and its peer's, for the name this process runs
    /// as; `None` when the name is neither.
    pub fn split(&self, node: &str) -> Option<(&Replica, &Replica)> {
        match &self.replicas {
            [a, b] if a.name == node => Some((a, b)),
            [a, b] if b.name == node => Some((b, a)),
            _ => None,
        }
    }
}

/// `host:port` with a port that is not zero.
fn host_port(c: &mut Collector, path: &str, text: &str) -> bool {
    let ok = text
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !ok {
        c.push(
            path,
            format!("{text} is not host:port such as 10.0.0.2:7946 or dhcp-1.dhcp-peers:7946"),
        );
    }
    ok
}

pub(crate) fn validate(c: &mut Collector, h: FileHa) -> Option<HaConfig> {
    let before = c.errors.len();
    let mut replicas = Vec::new();
    if h.replicas.len() != 2 {
        c.push(
            "ha.replicas",
            format!(
                "needs exactly two replicas (this one and its peer), found {}",
                h.replicas.len()
            ),
        );
    }
    for (i, r) in h.replicas.iter().enumerate() {
        let path = format!("ha.replicas[{i}]");
        if !crate::valid_label(&r.name, crate::NameRules::HOST) {
            c.push(
                format!("{path}.name"),
                format!(
                    "{:?} is not a name of lowercase letters, digits and '-'",
                    r.name
                ),
            );
        }
        host_port(c, &format!("{path}.address"), &r.address);
        let priority = r.priority.unwrap_or(DEFAULT_PRIORITY);
        if priority == 0 || priority == 255 {
            c.push(
                format!("{path}.priority"),
                "must be between 1 and 254".to_string(),
            );
        }
        let vlan_address = r.vlan_address.as_deref().and_then(|text| {
            match text.trim().parse::<std::net::SocketAddr>() {
                Ok(a) if a.is_ipv4() && a.port() != 0 && !a.ip().is_unspecified() => Some(a),
                _ => {
                    c.push(
                        format!("{path}.vlanAddress"),
                        format!("{text} is not this replica's own VLAN address and a port, such as 192.168.100.5:7946"),
                    );
                    None
                }
            }
        });
        replicas.push(Replica {
            name: r.name.clone(),
            address: r.address.clone(),
            priority,
            vlan_address,
        });
    }
    if let [a, b] = replicas.as_slice() {
        if a.name == b.name {
            c.push(
                "ha.replicas[1].name",
                format!("{} names both replicas", a.name),
            );
        }
    }
    let vlan_set: Vec<bool> = h
        .replicas
        .iter()
        .map(|r| r.vlan_address.is_some())
        .collect();
    if vlan_set.iter().any(|s| *s) {
        if !vlan_set.iter().all(|s| *s) {
            c.push(
                "ha.replicas",
                "vlanAddress is set on one replica only: adverts over the VLAN need both",
            );
        }
        if h.listen_interface.is_none() {
            c.push(
                "ha.listenInterface",
                "vlanAddress needs the peer link named here, so that the adverts of the two paths arrive on sockets of their own",
            );
        }
        if let [a, b] = replicas.as_slice() {
            if a.vlan_address.is_some()
                && a.vlan_address.map(|x| x.ip()) == b.vlan_address.map(|x| x.ip())
            {
                c.push(
                    "ha.replicas[1].vlanAddress",
                    "is the other replica's: each replica has its own address on the VLAN",
                );
            }
        }
        for (i, r) in replicas.iter().enumerate() {
            let Some(v) = r.vlan_address else { continue };
            if h.addresses
                .iter()
                .filter_map(|t| t.trim().parse::<Ipv4Net>().ok())
                .any(|n| std::net::IpAddr::V4(n.addr()) == v.ip())
            {
                c.push(
                    format!("ha.replicas[{i}].vlanAddress"),
                    "is a service address, which moves with the active replica; use the replica's own",
                );
            }
        }
    }
    if let Some(node) = &h.node {
        if !h.replicas.iter().any(|r| &r.name == node) {
            c.push(
                "ha.node",
                format!("{node} is not the name of either replica"),
            );
        }
    }
    let listen = h.listen.as_deref().and_then(|l| match l.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            c.push(
                "ha.listen",
                format!("{l} is not ip:port such as 0.0.0.0:7946"),
            );
            None
        }
    });
    if h.listen_interface
        .as_deref()
        .is_some_and(|i| i.trim().is_empty() || i == h.interface)
    {
        c.push(
            "ha.listenInterface",
            "names no interface, or the VLAN interface the clients share; use the peer link or the pod network",
        );
    }
    if h.key_file.as_os_str().is_empty() {
        c.push("ha.keyFile", "names no file");
    }
    if h.interface.trim().is_empty() {
        c.push("ha.interface", "names no interface");
    }
    let addresses: Vec<Ipv4Net> = h
        .addresses
        .iter()
        .enumerate()
        .filter_map(|(i, t)| match t.trim().parse::<Ipv4Net>() {
            Ok(n) => Some(n),
            Err(_) => {
                c.push(
                    format!("ha.addresses[{i}]"),
                    format!("{t} is not an address with its prefix, such as 192.168.10.2/24"),
                );
                None
            }
        })
        .collect();
    if h.addresses.is_empty() {
        c.push("ha.addresses", "needs at least one service address");
    }
    let addresses_v6: Vec<(usize, ipnet::Ipv6Net)> = h
        .addresses_v6
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let path = format!("ha.addressesV6[{i}]");
            match t.trim().parse::<ipnet::Ipv6Net>() {
                Ok(n) if n.addr().is_multicast() || n.addr().is_unspecified() => {
                    c.push(path, format!("{t} is not a unicast address"));
                    None
                }
                Ok(n) => {
                    if n.addr().segments()[0] & 0xffc0 != 0xfe80 {
                        crate::ra::refuse_ovn_overlap_v6(c, &path, n.trunc());
                    }
                    Some((i, n))
                }
                Err(_) => {
                    c.push(
                        path,
                        format!("{t} is not a v6 address with its prefix, such as fd42:10::2/64"),
                    );
                    None
                }
            }
        })
        .collect();
    for (k, (i, a)) in addresses_v6.iter().enumerate() {
        if let Some((j, _)) = addresses_v6[..k].iter().find(|(_, o)| o.addr() == a.addr()) {
            c.push(
                format!("ha.addressesV6[{i}]"),
                format!("{} is also ha.addressesV6[{j}]", a.addr()),
            );
        }
    }
    let addresses_v6: Vec<ipnet::Ipv6Net> = addresses_v6.into_iter().map(|(_, n)| n).collect();
    let advert_interval = h
        .advert_interval
        .as_ref()
        .and_then(|d| c.duration("ha.advertInterval", d))
        .unwrap_or(DEFAULT_ADVERT_INTERVAL);
    if advert_interval < Duration::from_millis(20) || advert_interval > Duration::from_secs(10) {
        c.push(
            "ha.advertInterval",
            format!(
                "{} must be between 20ms and 10s",
                humantime::format_duration(advert_interval)
            ),
        );
    }
    let dead_adverts = h.dead_adverts.unwrap_or(DEFAULT_DEAD_ADVERTS);
    if !(2..=20).contains(&dead_adverts) {
        c.push(
            "ha.deadAdverts",
            format!("{dead_adverts} must be between 2 and 20"),
        );
    }
    let replication_timeout = h
        .replication_timeout
        .as_ref()
        .and_then(|d| c.duration("ha.replicationTimeout", d))
        .unwrap_or(DEFAULT_REPLICATION_TIMEOUT);
    // Every ACK of a batch may wait this long: past a few seconds a DHCP
    // client has retransmitted, and a slow standby stalls every client.
    if replication_timeout > MAX_REPLICATION_TIMEOUT {
        c.push(
            "ha.replicationTimeout",
            format!(
                "{} is over {}: every ACK may wait this long for the standby",
                humantime::format_duration(replication_timeout),
                humantime::format_duration(MAX_REPLICATION_TIMEOUT)
            ),
        );
    }
    let lease = match (h.mode, h.lease) {
        (HaMode::Lease, None) => {
            c.push(
                "ha.lease",
                "mode lease needs the Lease's name (ha.lease.name)",
            );
            None
        }
        (HaMode::Peer, Some(_)) => {
            c.push(
                "ha.lease",
                "only for mode lease; mode peer has no API server",
            );
            None
        }
        (HaMode::Peer, None) => None,
        (HaMode::Lease, Some(l)) => {
            if !crate::valid_name(&l.name, crate::NameRules::HOST) {
                c.push(
                    "ha.lease.name",
                    format!("{:?} is not an object name", l.name),
                );
            }
            let renew_interval = l
                .renew_interval
                .as_ref()
                .and_then(|d| c.duration("ha.lease.renewInterval", d))
                .unwrap_or(DEFAULT_LEASE_RENEW);
            let api_timeout = l
                .api_timeout
                .as_ref()
                .and_then(|d| c.duration("ha.lease.apiTimeout", d))
                .unwrap_or(DEFAULT_API_TIMEOUT);
            Some(HaLease {
                namespace: l.namespace,
                name: l.name,
                renew_interval,
                api_timeout,
            })
        }
    };
    if c.errors.len() > before {
        return None;
    }
    let [a, b]: [Replica; 2] = replicas.try_into().ok()?;
    Some(HaConfig {
        mode: h.mode,
        node: h.node,
        replicas: [a, b],
        listen,
        listen_interface: h.listen_interface,
        key_file: h.key_file,
        interface: h.interface,
        addresses,
        addresses_v6,
        preempt: h.preempt,
        advert_interval,
        dead_adverts,
        replication_timeout,
        lease,
    })
}
