//! The validated config: every value parsed, every default derived.
//!
//! Services only ever see these types, so they never re-check what
//! validation already proved.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::Ipv4Net;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub log: LogConfig,
    pub admin: AdminConfig,
    pub cluster: Option<Cluster>,
    pub network: Option<Network>,
    pub dhcp: Option<DhcpConfig>,
    pub dns: Option<crate::dns::DnsConfig>,
    pub proxy: Option<crate::proxy::ProxyConfig>,
    pub routing: Option<crate::routing::RoutingConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// A `tracing` filter directive such as `info` or `causeway_dhcp=debug`.
    pub level: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// Accept only connections arriving on this interface (SO_BINDTODEVICE),
    /// so a pod's probes reach it on the pod network and the VLAN cannot.
    pub interface: Option<String>,
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

#[derive(Debug, Clone, PartialEq)]
pub struct DhcpConfig {
    pub listen: Vec<DhcpListen>,
    pub lease_file: PathBuf,
    pub lease_time: Duration,
    pub renew_time: Option<Duration>,
    pub rebind_time: Option<Duration>,
    pub offer_timeout: Duration,
    pub decline_probation: Duration,
    pub rapid_commit: bool,
    pub authoritative: bool,
    pub rate_limit_per_client: u32,
    pub max_in_flight: usize,
    pub subnets: Vec<Subnet>,
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
    pub relay_addresses: Vec<Ipv4Addr>,
    /// The interface whose broadcast clients this subnet serves.
    pub interface: Option<String>,
    pub server_id: Ipv4Addr,
    pub lease_time: Option<Duration>,
    pub options: SubnetOptions,
    pub reservations: Vec<Reservation>,
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
