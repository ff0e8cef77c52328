//! The causeway appliance config: one schema for the standalone appliance
//! and for what the operator renders into ConfigMaps.
//!
//! This crate parses YAML, validates it with an error per bad value (each
//! with its path), and derives defaults from the VLAN: pools, router, DNS
//! and domain. It also holds the value readers the product shares:
//! durations ([`parse_duration`]) and host and DNS names ([`valid_name`]).
//!
//! It is not for running anything: it does no I/O beyond reading the file
//! it is given, and it knows nothing of how services use the values.

mod admin;
mod clusters;
mod collector;
mod config;
mod dhcp;
mod dhcp6;
mod dns;
mod error;
mod ha;
mod name;
mod network;
mod proxy;
mod ra;
mod routing;
mod upstream;

pub use admin::{AdminConfig, FileAdmin, FileLog, LogConfig, LogFormat, DEFAULT_ADMIN_LISTEN};
pub use clusters::{FileServedCluster, ServedCluster, KUBERNETES_ALIASES, MAX_CLUSTERS};
pub use collector::{parse_duration, parse_hex, parse_mac, FileDuration};
pub use config::{validate, Config, FileConfig};
pub use dhcp::{
    AddressRange, ClientMatch, CustomOption, DhcpConfig, DhcpListen, FileDhcp, FileDhcpListen,
    FileOption, FileRange, FileReservation, FileRoute, FileSubnet, Reservation, Subnet,
    SubnetOptions, DEFAULT_DECLINE_PROBATION, DEFAULT_LEASE_FILE, DEFAULT_LEASE_TIME,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_OFFER_TIMEOUT, DEFAULT_RATE_LIMIT_PER_CLIENT,
};
pub use dhcp6::{
    Dhcp6Config, FileDhcp6, FilePool6, FileReservation6, Pool6, Reservation6, Stateful6,
};
pub use dns::{
    reverse_name, CacheConfig, DnsConfig, DnsRecord, DnsView, FileCache, FileDns, FileRecord,
    FileView, RecordData, UpstreamPolicy, MAX_UPSTREAMS, PROXIED_NAMES, SYSTEM_UPSTREAMS,
};
pub use error::{ConfigErrors, FieldError, LoadError};
pub use ha::{
    FileHa, FileHaLease, FileReplica, HaConfig, HaLease, HaMode, Replica, DEFAULT_ADVERT_INTERVAL,
    DEFAULT_API_TIMEOUT, DEFAULT_DEAD_ADVERTS, DEFAULT_REPLICATION_TIMEOUT,
};
pub use name::{valid_label, valid_name, NameRules};
pub use network::{Cluster, FileCluster, FileNetwork, Network};
pub use proxy::{
    Balance, FileListener, FileProxy, FileRoute as FileProxyRoute, HealthCheck, Listener,
    ListenerKind, ProxyConfig, Route, Upstream, DEFAULT_MAX_CONNECTIONS_PER_SOURCE,
};
pub use ra::{
    AdvertisedPrefix, FilePrefix, FileRouterAdvertisements, RouterAdvertConfig,
    DEFAULT_MAX_INTERVAL as DEFAULT_RA_MAX_INTERVAL,
};
pub use routing::{
    FileRoutedV6, FileRouting, RoutedInterface, RoutedV6, RoutingConfig, DEFAULT_PRIORITY,
    DEFAULT_TABLE,
};

use std::path::Path;

use serde::Deserialize;

/// The unprivileged loopback config the appliance runs when given none.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../examples/local.yaml");

impl Config {
    /// Parses and validates YAML text, reporting every problem at once.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigErrors> {
        let mut track = serde_path_to_error::Track::new();
        let mut options = serde_saphyr::Options::default();
        // One line per error: the path says where, the message what.
        options.with_snippet = false;
        let parsed = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
            FileConfig::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
        });
        match parsed {
            Ok(file) => validate(file),
            Err(err) => {
                let path = track.path().to_string();
                let path = if path == "." { String::new() } else { path };
                Err(ConfigErrors(vec![FieldError {
                    path,
                    message: err.to_string(),
                }]))
            }
        }
    }

    pub fn load(path: &Path) -> Result<Config, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Config::from_yaml(&text)?)
    }
}

#[cfg(test)]
mod tests;
