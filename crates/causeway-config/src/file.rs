//! The config file as written by a person: every address, CIDR and duration
//! is still text here.
//!
//! Keeping values as text until validation lets one pass report every bad
//! value with its path, instead of stopping at the first one as serde would.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub log: FileLog,
    #[serde(default)]
    pub admin: FileAdmin,
    pub cluster: Option<FileCluster>,
    pub network: Option<FileNetwork>,
    pub dhcp: Option<FileDhcp>,
    pub dns: Option<crate::dns::FileDns>,
    pub proxy: Option<crate::proxy::FileProxy>,
    pub routing: Option<crate::routing::FileRouting>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileLog {
    pub level: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileAdmin {
    pub listen: Option<String>,
    pub interface: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileCluster {
    pub name: String,
    pub base_domain: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileNetwork {
    pub interface: Option<String>,
    pub cidr: String,
    pub gateway: Option<String>,
    pub address: Option<String>,
    #[serde(default)]
    pub static_addresses: Vec<String>,
}

#[derive(Debug, Deserialize)]
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
    pub rapid_commit: Option<bool>,
    pub authoritative: Option<bool>,
    pub rate_limit_per_client: Option<u32>,
    pub max_in_flight: Option<usize>,
    #[serde(default)]
    pub subnets: Vec<FileSubnet>,
}

pub(crate) fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileDhcpListen {
    pub interface: Option<String>,
    pub address: Option<String>,
}

/// A duration as `90`, `90s`, `15m`, `1h` or `2d`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum FileDuration {
    Seconds(u64),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileSubnet {
    pub cidr: Option<String>,
    #[serde(default)]
    pub pools: Vec<FileRange>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub relay_addresses: Vec<String>,
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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRange {
    pub start: String,
    pub end: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoute {
    pub destination: String,
    pub gateway: String,
}

/// An option by code with exactly one typed value.
#[derive(Debug, Deserialize)]
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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileReservation {
    pub mac: Option<String>,
    pub client_id: Option<String>,
    pub ip: String,
    pub hostname: Option<String>,
    #[serde(default)]
    pub options: Vec<FileOption>,
}
