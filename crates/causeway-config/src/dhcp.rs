//! The `dhcp` section: listeners, lease store and times, and the subnets
//! with their pools, options and reservations.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::collector::{parse_hex, parse_mac, yes, Collector, FileDuration};
use crate::name::{valid_label, valid_name, NameRules};
use crate::network::{Cluster, Network};

pub const DEFAULT_LEASE_FILE: &str = "/var/lib/causeway/dhcp-leases.jsonl";

pub const DEFAULT_LEASE_TIME: Duration = Duration::from_secs(3600);

pub const DEFAULT_OFFER_TIMEOUT: Duration = Duration::from_secs(30);

/// A minute: an NTP correction is never bigger, and a clock that starts
/// from its epoch (no RTC) is years behind.
pub const DEFAULT_CLOCK_BEHIND_TOLERANCE: Duration = Duration::from_secs(60);

pub const DEFAULT_DECLINE_PROBATION: Duration = Duration::from_secs(86400);

pub const DEFAULT_RATE_LIMIT_PER_CLIENT: u32 = 20;

pub const DEFAULT_MAX_IN_FLIGHT: usize = 4096;

/// Option codes the server manages itself; configuring them would break
/// the protocol, so they are refused.
const MANAGED_OPTION_CODES: &[u16] = &[0, 50, 51, 52, 53, 54, 55, 57, 58, 59, 61, 80, 82, 255];

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileDhcp {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub listen: Vec<FileDhcpListen>,
    pub lease_file: Option<String>,
    pub lease_time: Option<FileDuration>,
    pub renew_time: Option<FileDuration>,
    pub rebind_time: Option<FileDuration>,
    pub offer_timeout: Option<FileDuration>,
    pub decline_probation: Option<FileDuration>,
    pub clock_behind_tolerance: Option<FileDuration>,
    pub rapid_commit: Option<bool>,
    pub authoritative: Option<bool>,
    pub rate_limit_per_client: Option<u32>,
    pub rate_limit_per_relay: Option<u32>,
    pub rate_limit_per_subnet: Option<u32>,
    pub rate_limit_global: Option<u32>,
    pub max_in_flight: Option<usize>,
    #[serde(default)]
    pub subnets: Vec<FileSubnet>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileDhcpListen {
    pub interface: Option<String>,
    pub address: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSubnet {
    pub cidr: Option<String>,
    #[serde(default)]
    pub pools: Vec<FileRange>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub relay_addresses: Vec<String>,
    #[serde(default)]
    pub relay_sources: Vec<String>,
    pub interface: Option<String>,
    pub server_id: Option<String>,
    pub router: Option<Vec<String>>,
    pub dns_servers: Option<Vec<String>>,
    pub domain_name: Option<String>,
    #[serde(default)]
    pub domain_search: Vec<String>,
    pub mtu: Option<u16>,
    #[serde(default)]
    pub ntp_servers: Vec<String>,
    #[serde(default)]
    pub classless_routes: Vec<FileRoute>,
    pub lease_time: Option<FileDuration>,
    #[serde(default)]
    pub options: Vec<FileOption>,
    #[serde(default)]
    pub reservations: Vec<FileReservation>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRange {
    pub start: String,
    pub end: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoute {
    pub destination: String,
    pub gateway: String,
}

/// An option by code with exactly one typed value.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileOption {
    pub code: u16,
    pub ipv4: Option<Vec<String>>,
    pub string: Option<String>,
    pub u8: Option<u8>,
    pub u16: Option<u16>,
    pub u32: Option<u32>,
    pub bool: Option<bool>,
    pub hex: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileReservation {
    pub mac: Option<String>,
    pub client_id: Option<String>,
    pub ip: String,
    pub hostname: Option<String>,
    #[serde(default)]
    pub options: Vec<FileOption>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DhcpConfig {
    pub listen: Vec<DhcpListen>,
    pub lease_file: PathBuf,
    pub lease_time: Duration,
    pub renew_time: Option<Duration>,
    pub rebind_time: Option<Duration>,
    pub offer_timeout: Duration,
    pub decline_probation: Duration,
    /// How far the wall clock may be behind the lease file's last write at
    /// start for the server to serve anyway; further behind, it waits.
    pub clock_behind_tolerance: Duration,
    pub rapid_commit: bool,
    pub authoritative: bool,
    pub rate_limit_per_client: u32,
    /// Messages per second from one relay agent (by source address);
    /// `None`: no limit.
    pub rate_limit_per_relay: Option<u32>,
    /// Messages per second into one subnet; `None`: no limit.
    pub rate_limit_per_subnet: Option<u32>,
    /// Messages per second the server takes in all; `None`: no limit.
    pub rate_limit_global: Option<u32>,
    pub max_in_flight: usize,
    pub subnets: Vec<Subnet>,
}

impl DhcpConfig {
    /// Subnets no client can reach with these listeners, each as a
    /// sentence naming it and why: a valid config that serves nobody there.
    /// Direct clients reach a subnet only through an interface listener on
    /// the interface it names; on an interface listener a relayed packet is
    /// served only from an address the chosen subnet lists in
    /// `relayAddresses` or `relaySources`; an address listener takes relayed
    /// packets from anywhere.
    pub fn unreachable_subnets(&self) -> Vec<String> {
        let interfaces: Vec<&str> = self
            .listen
            .iter()
            .filter_map(|l| match l {
                DhcpListen::Interface(name) => Some(name.as_str()),
                DhcpListen::Address(_) => None,
            })
            .collect();
        let address_listener = self
            .listen
            .iter()
            .any(|l| matches!(l, DhcpListen::Address(_)));
        if address_listener {
            return Vec::new();
        }
        self.subnets
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                let direct = s
                    .interface
                    .as_deref()
                    .is_some_and(|i| interfaces.contains(&i));
                let relayed = !s.relay_addresses.is_empty() || !s.relay_sources.is_empty();
                !direct && !relayed
            })
            .map(|(i, s)| {
                let direct = match &s.interface {
                    Some(name) => format!("no listener is on its interface {name}"),
                    None => "it names no interface".to_string(),
                };
                format!(
                    "dhcp.subnets[{i}] ({}): no client can reach it: {direct}, and every listener is an interface listener, where a relayed packet is served only from an address the subnet lists in relayAddresses (the relay's giaddr, when it also sends from it) or relaySources (the address it sends from, when that is not its giaddr), and it lists none",
                    s.cidr
                )
            })
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DhcpListen {
    /// Broadcast clients on a directly attached segment.
    Interface(String),
    /// Relayed requests (and unicast renewals) arriving on a UDP address.
    Address(SocketAddrV4),
}

/// An inclusive range of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    pub start: Ipv4Addr,
    pub end: Ipv4Addr,
}

impl AddressRange {
    pub fn single(addr: Ipv4Addr) -> Self {
        Self {
            start: addr,
            end: addr,
        }
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        self.start <= addr && addr <= self.end
    }

    pub fn len(&self) -> u64 {
        u64::from(u32::from(self.end)) - u64::from(u32::from(self.start)) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl std::fmt::Display for AddressRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Subnet {
    pub cidr: Ipv4Net,
    pub pools: Vec<AddressRange>,
    /// Addresses never handed out dynamically: configured exclusions plus
    /// the gateway, the appliance and every static infrastructure address.
    pub exclude: Vec<AddressRange>,
    /// Relay agents' `giaddr`s that select this subnet even when outside
    /// its `cidr`.
    pub relay_addresses: Vec<Ipv4Addr>,
    /// Source addresses a relay agent of this subnet sends from when that
    /// is not its `giaddr` (a relay on another segment sends from the
    /// address facing the server, but names its client-side address in
    /// `giaddr`). On an interface listener a relayed packet is served only
    /// from an address of the chosen subnet's `relayAddresses` or
    /// `relaySources`.
    pub relay_sources: Vec<Ipv4Addr>,
    /// The interface whose broadcast clients this subnet serves.
    pub interface: Option<String>,
    pub server_id: Ipv4Addr,
    pub lease_time: Option<Duration>,
    pub options: SubnetOptions,
    pub reservations: Vec<Reservation>,
}

impl Subnet {
    /// Whether a relayed packet from `source` may draw from this subnet on
    /// an interface listener: a relay sending from its `giaddr`, or from an
    /// address listed as one of its relay sources.
    pub fn relays_from(&self, source: Ipv4Addr) -> bool {
        self.relay_addresses.contains(&source) || self.relay_sources.contains(&source)
    }
}

/// The option values a subnet hands out, already typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubnetOptions {
    pub router: Vec<Ipv4Addr>,
    pub dns_servers: Vec<Ipv4Addr>,
    pub domain_name: Option<String>,
    pub domain_search: Vec<String>,
    pub mtu: Option<u16>,
    pub ntp_servers: Vec<Ipv4Addr>,
    pub classless_routes: Vec<(Ipv4Net, Ipv4Addr)>,
    pub custom: Vec<CustomOption>,
}

/// Any other option, by code, already encoded to its wire value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomOption {
    pub code: u8,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientMatch {
    Mac([u8; 6]),
    /// The raw bytes of option 61.
    ClientId(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub client: ClientMatch,
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    pub options: Vec<CustomOption>,
}

pub(crate) fn validate_dhcp(
    c: &mut Collector,
    d: FileDhcp,
    network: Option<&Network>,
    cluster: Option<&Cluster>,
) -> Option<DhcpConfig> {
    let mut listen = Vec::new();
    for (i, l) in d.listen.iter().enumerate() {
        let path = format!("dhcp.listen[{i}]");
        match (&l.interface, &l.address) {
            (Some(name), None) if !name.trim().is_empty() => {
                listen.push(DhcpListen::Interface(name.trim().to_string()))
            }
            (None, Some(text)) => match text.parse::<SocketAddrV4>() {
                Ok(addr) => listen.push(DhcpListen::Address(addr)),
                Err(_) => c.push(
                    format!("{path}.address"),
                    format!("{text} is not an IPv4 address:port such as 127.0.0.1:6767"),
                ),
            },
            _ => c.push(path, "give exactly one of interface or address"),
        }
    }
    if d.listen.is_empty() {
        match network.and_then(|n| n.interface.clone()) {
            Some(iface) => listen.push(DhcpListen::Interface(iface)),
            None => c.push(
                "dhcp.listen",
                "nothing to listen on: list an interface or address, or set network.interface",
            ),
        }
    }

    let lease_time = d
        .lease_time
        .as_ref()
        .and_then(|v| c.duration("dhcp.leaseTime", v))
        .unwrap_or(DEFAULT_LEASE_TIME);
    let renew_time = d
        .renew_time
        .as_ref()
        .and_then(|v| c.duration("dhcp.renewTime", v));
    let rebind_time = d
        .rebind_time
        .as_ref()
        .and_then(|v| c.duration("dhcp.rebindTime", v));
    if let (Some(t1), Some(t2)) = (renew_time, rebind_time) {
        if t1 >= t2 {
            c.push("dhcp.renewTime", "must be shorter than dhcp.rebindTime");
        }
    }
    for (path, t) in [
        ("dhcp.renewTime", renew_time),
        ("dhcp.rebindTime", rebind_time),
    ] {
        if t.is_some_and(|t| t >= lease_time) {
            c.push(path, "must be shorter than dhcp.leaseTime");
        }
    }
    let clock_behind_tolerance = d
        .clock_behind_tolerance
        .as_ref()
        .and_then(|v| c.duration("dhcp.clockBehindTolerance", v))
        .unwrap_or(DEFAULT_CLOCK_BEHIND_TOLERANCE);
    let offer_timeout = d
        .offer_timeout
        .as_ref()
        .and_then(|v| c.duration("dhcp.offerTimeout", v))
        .unwrap_or(DEFAULT_OFFER_TIMEOUT);
    let decline_probation = d
        .decline_probation
        .as_ref()
        .and_then(|v| c.duration("dhcp.declineProbation", v))
        .unwrap_or(DEFAULT_DECLINE_PROBATION);
    let rate_limit_per_client = d
        .rate_limit_per_client
        .unwrap_or(DEFAULT_RATE_LIMIT_PER_CLIENT);
    if rate_limit_per_client == 0 {
        c.push("dhcp.rateLimitPerClient", "must be at least 1");
    }
    for (path, limit) in [
        ("dhcp.rateLimitPerRelay", d.rate_limit_per_relay),
        ("dhcp.rateLimitPerSubnet", d.rate_limit_per_subnet),
        ("dhcp.rateLimitGlobal", d.rate_limit_global),
    ] {
        if limit == Some(0) {
            c.push(path, "must be at least 1 (leave it out for no limit)");
        }
    }
    let max_in_flight = d.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT);
    if max_in_flight == 0 {
        c.push("dhcp.maxInFlight", "must be at least 1");
    }

    let mut file_subnets = d.subnets;
    if file_subnets.is_empty() {
        if network.is_some() {
            file_subnets.push(FileSubnet::default());
        } else {
            c.push(
                "dhcp.subnets",
                "no subnet to serve: list dhcp.subnets or set network.cidr",
            );
        }
    }
    let mut subnets: Vec<Subnet> = Vec::new();
    for (i, s) in file_subnets.into_iter().enumerate() {
        let path = format!("dhcp.subnets[{i}]");
        if let Some(subnet) = validate_subnet(c, &path, s, network, cluster) {
            if let Some(prior) = subnets.iter().find(|p| {
                p.cidr.contains(&subnet.cidr.network()) || subnet.cidr.contains(&p.cidr.network())
            }) {
                c.push(
                    format!("{path}.cidr"),
                    format!("{} overlaps subnet {}", subnet.cidr, prior.cidr),
                );
            }
            subnets.push(subnet);
        }
    }
    for l in &listen {
        if let DhcpListen::Interface(name) = l {
            let served = subnets
                .iter()
                .filter(|s| s.interface.as_deref() == Some(name.as_str()))
                .count();
            if served == 0 {
                c.push(
                    "dhcp.listen",
                    format!("no subnet is served on interface {name}: set that subnet's interface"),
                );
            }
        }
    }

    Some(DhcpConfig {
        listen,
        lease_file: PathBuf::from(
            d.lease_file
                .unwrap_or_else(|| DEFAULT_LEASE_FILE.to_string()),
        ),
        lease_time,
        renew_time,
        rebind_time,
        offer_timeout,
        decline_probation,
        clock_behind_tolerance,
        rapid_commit: d.rapid_commit.unwrap_or(false),
        authoritative: d.authoritative.unwrap_or(true),
        rate_limit_per_client,
        rate_limit_per_relay: d.rate_limit_per_relay,
        rate_limit_per_subnet: d.rate_limit_per_subnet,
        rate_limit_global: d.rate_limit_global,
        max_in_flight,
        subnets,
    })
}

fn validate_subnet(
    c: &mut Collector,
    path: &str,
    s: FileSubnet,
    network: Option<&Network>,
    cluster: Option<&Cluster>,
) -> Option<Subnet> {
    let cidr = match (&s.cidr, network) {
        (Some(text), _) => {
            let cidr = c.cidr(&format!("{path}.cidr"), text)?;
            crate::network::refuse_ovn_overlap(c, &format!("{path}.cidr"), cidr);
            cidr
        }
        (None, Some(n)) => n.cidr,
        (None, None) => {
            c.push(
                format!("{path}.cidr"),
                "missing, and network.cidr is not set",
            );
            return None;
        }
    };
    // The subnet that is the VLAN itself inherits the VLAN's facts.
    let vlan = network.filter(|n| n.cidr == cidr);

    let mut exclude: Vec<AddressRange> = Vec::new();
    for (i, text) in s.exclude.iter().enumerate() {
        let p = format!("{path}.exclude[{i}]");
        let range = match text.split_once('-') {
            Some((a, b)) => {
                let start = c.ipv4(&p, a);
                let end = c.ipv4(&p, b);
                match (start, end) {
                    (Some(start), Some(end)) if start <= end => Some(AddressRange { start, end }),
                    (Some(_), Some(_)) => {
                        c.push(&p, format!("{text}: the start is after the end"));
                        None
                    }
                    _ => None,
                }
            }
            None => c.ipv4(&p, text).map(AddressRange::single),
        };
        if let Some(r) = range {
            if c.inside(&p, r.start, cidr, "subnet") {
                c.inside(&p, r.end, cidr, "subnet");
            }
            exclude.push(r);
        }
    }
    if let Some(n) = vlan {
        exclude.extend(
            n.gateway
                .iter()
                .chain(n.address.iter())
                .chain(n.static_addresses.iter())
                .map(|a| AddressRange::single(*a)),
        );
    }

    let first_host = if cidr.prefix_len() >= 31 {
        cidr.network()
    } else {
        Ipv4Addr::from(u32::from(cidr.network()) + 1)
    };
    let last_host = if cidr.prefix_len() >= 31 {
        cidr.broadcast()
    } else {
        Ipv4Addr::from(u32::from(cidr.broadcast()) - 1)
    };
    let mut pools: Vec<AddressRange> = Vec::new();
    for (i, r) in s.pools.iter().enumerate() {
        let p = format!("{path}.pools[{i}]");
        let start = c.ipv4(&format!("{p}.start"), &r.start);
        let end = c.ipv4(&format!("{p}.end"), &r.end);
        if let (Some(start), Some(end)) = (start, end) {
            let in_start = c.inside(&format!("{p}.start"), start, cidr, "subnet");
            let in_end = c.inside(&format!("{p}.end"), end, cidr, "subnet");
            if !(in_start && in_end) {
                continue;
            }
            if start > end {
                c.push(&p, format!("start {start} is after end {end}"));
                continue;
            }
            let range = AddressRange { start, end };
            if let Some(other) = pools.iter().find(|o| o.overlaps(&range)) {
                c.push(&p, format!("{range} overlaps pool {other}"));
            }
            pools.push(range);
        }
    }
    if s.pools.is_empty() {
        pools.push(AddressRange {
            start: first_host,
            end: last_host,
        });
    }

    let relay_addresses = c.ipv4_list(&format!("{path}.relayAddresses"), &s.relay_addresses);
    let relay_sources = c.ipv4_list(&format!("{path}.relaySources"), &s.relay_sources);

    let server_id = match &s.server_id {
        Some(text) => c.ipv4(&format!("{path}.serverId"), text),
        None => vlan.and_then(|n| n.address),
    };

    let router = match &s.router {
        Some(list) => c.ipv4_list(&format!("{path}.router"), list),
        None => vlan.and_then(|n| n.gateway).into_iter().collect(),
    };
    let dns_servers = match &s.dns_servers {
        Some(list) => c.ipv4_list(&format!("{path}.dnsServers"), list),
        None => vlan.and_then(|n| n.address).into_iter().collect(),
    };
    let domain_name = s
        .domain_name
        .clone()
        .or_else(|| cluster.map(Cluster::domain));
    if let Some(name) = domain_name
        .as_deref()
        .filter(|n| !valid_name(n.trim_end_matches('.'), NameRules::HOST))
    {
        c.push(
            format!("{path}.domainName"),
            format!("{name} is not a domain name"),
        );
    }
    for (i, name) in s.domain_search.iter().enumerate() {
        if !valid_name(name.trim_end_matches('.'), NameRules::HOST) {
            c.push(
                format!("{path}.domainSearch[{i}]"),
                format!("{name} is not a domain name"),
            );
        }
    }
    if let Some(mtu) = s.mtu {
        if mtu < 68 {
            c.push(
                format!("{path}.mtu"),
                format!("{mtu} is below the IPv4 minimum of 68"),
            );
        }
    }
    let ntp_servers = c.ipv4_list(&format!("{path}.ntpServers"), &s.ntp_servers);
    let mut classless_routes = Vec::new();
    for (i, r) in s.classless_routes.iter().enumerate() {
        let p = format!("{path}.classlessRoutes[{i}]");
        let dest = c.cidr(&format!("{p}.destination"), &r.destination);
        let gw = c.ipv4(&format!("{p}.gateway"), &r.gateway);
        if let (Some(dest), Some(gw)) = (dest, gw) {
            classless_routes.push((dest, gw));
        }
    }
    let lease_time = s
        .lease_time
        .as_ref()
        .and_then(|v| c.duration(&format!("{path}.leaseTime"), v));
    let custom = validate_options(c, &format!("{path}.options"), &s.options);

    let mut reservations: Vec<Reservation> = Vec::new();
    for (i, r) in s.reservations.iter().enumerate() {
        let p = format!("{path}.reservations[{i}]");
        let client = match (&r.mac, &r.client_id) {
            (Some(mac), None) => parse_mac(mac).map(ClientMatch::Mac).or_else(|| {
                c.push(
                    format!("{p}.mac"),
                    format!("{mac} is not a MAC address such as 52:54:00:12:34:56"),
                );
                None
            }),
            (None, Some(id)) => parse_hex(id)
                .filter(|b| !b.is_empty())
                .map(ClientMatch::ClientId)
                .or_else(|| {
                    c.push(
                        format!("{p}.clientId"),
                        format!("{id} is not hex bytes such as 01:52:54:00:12:34:56"),
                    );
                    None
                }),
            _ => {
                c.push(&p, "give exactly one of mac or clientId");
                None
            }
        };
        let ip = c.ipv4(&format!("{p}.ip"), &r.ip);
        if let Some(ip) = ip {
            let ip_path = format!("{p}.ip");
            if c.inside(&ip_path, ip, cidr, "subnet") {
                if exclude.iter().any(|e| e.contains(ip)) {
                    c.push(&ip_path, format!("{ip} is excluded or a static address"));
                }
                if let Some(other) = reservations.iter().position(|o| o.ip == ip) {
                    c.push(
                        &ip_path,
                        format!("{ip} is also reserved by {path}.reservations[{other}]"),
                    );
                }
            }
        }
        if let Some(client) = &client {
            if reservations.iter().any(|o| &o.client == client) {
                c.push(&p, "this client already has a reservation in this subnet");
            }
        }
        if let Some(h) = &r.hostname {
            if !valid_label(h, NameRules::HOST) {
                c.push(format!("{p}.hostname"), format!("{h} is not a host name"));
            }
        }
        let options = validate_options(c, &format!("{p}.options"), &r.options);
        if let (Some(client), Some(ip)) = (client, ip) {
            reservations.push(Reservation {
                client,
                ip,
                hostname: r.hostname.clone(),
                options,
            });
        }
    }

    let server_id = match server_id {
        Some(id) => id,
        None => {
            c.push(
                format!("{path}.serverId"),
                "cannot be derived: set it, or network.address for the VLAN subnet",
            );
            return None;
        }
    };

    Some(Subnet {
        cidr,
        pools,
        exclude,
        relay_addresses,
        relay_sources,
        interface: s
            .interface
            .clone()
            .or_else(|| vlan.and_then(|n| n.interface.clone())),
        server_id,
        lease_time,
        options: SubnetOptions {
            router,
            dns_servers,
            domain_name,
            domain_search: s.domain_search.clone(),
            mtu: s.mtu,
            ntp_servers,
            classless_routes,
            custom,
        },
        reservations,
    })
}

fn validate_options(c: &mut Collector, path: &str, options: &[FileOption]) -> Vec<CustomOption> {
    let mut out = Vec::new();
    for (i, o) in options.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if o.code == 0 || o.code > 254 {
            c.push(
                format!("{p}.code"),
                format!("{} is not an option code from 1 to 254", o.code),
            );
            continue;
        }
        if MANAGED_OPTION_CODES.contains(&o.code) {
            c.push(
                format!("{p}.code"),
                format!(
                    "option {} is managed by the server and cannot be set",
                    o.code
                ),
            );
            continue;
        }
        let given = [
            o.ipv4.is_some(),
            o.string.is_some(),
            o.u8.is_some(),
            o.u16.is_some(),
            o.u32.is_some(),
            o.bool.is_some(),
            o.hex.is_some(),
        ]
        .iter()
        .filter(|g| **g)
        .count();
        if given != 1 {
            c.push(
                &p,
                "give exactly one value: ipv4, string, u8, u16, u32, bool or hex",
            );
            continue;
        }
        let value = if let Some(list) = &o.ipv4 {
            c.ipv4_list(&format!("{p}.ipv4"), list)
                .iter()
                .flat_map(|a| a.octets())
                .collect()
        } else if let Some(s) = &o.string {
            s.as_bytes().to_vec()
        } else if let Some(v) = o.u8 {
            vec![v]
        } else if let Some(v) = o.u16 {
            v.to_be_bytes().to_vec()
        } else if let Some(v) = o.u32 {
            v.to_be_bytes().to_vec()
        } else if let Some(v) = o.bool {
            vec![u8::from(v)]
        } else if let Some(h) = &o.hex {
            match parse_hex(h) {
                Some(bytes) => bytes,
                None => {
                    c.push(
                        format!("{p}.hex"),
                        format!("{h} is not hex bytes such as 0a:0b:0c"),
                    );
                    continue;
                }
            }
        } else {
            continue;
        };
        if value.len() > 255 {
            c.push(
                &p,
                format!(
                    "the value is {} bytes; an option holds at most 255",
                    value.len()
                ),
            );
            continue;
        }
        if out
            .iter()
            .any(|x: &CustomOption| u16::from(x.code) == o.code)
        {
            c.push(
                format!("{p}.code"),
                format!("option {} is set twice", o.code),
            );
            continue;
        }
        out.push(CustomOption {
            code: o.code as u8,
            value,
        });
    }
    out
}
