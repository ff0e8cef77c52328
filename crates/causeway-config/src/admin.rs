//! The process-level sections: `log` (how the process logs) and `admin`
//! (the HTTP server with /metrics, /healthz, /readyz and /leases).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::collector::Collector;

pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileLog {
    pub level: Option<String>,
    pub format: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileAdmin {
    pub listen: Option<String>,
    pub interface: Option<String>,
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

pub(crate) fn validate_log(c: &mut Collector, log: FileLog) -> LogConfig {
    LogConfig {
        level: log.level.unwrap_or_else(|| "info".to_string()),
        format: match log.format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                c.push("log.format", format!("{other} is not one of: text, json"));
                LogFormat::Text
            }
        },
    }
}

pub(crate) fn validate_admin(c: &mut Collector, admin: FileAdmin) -> AdminConfig {
    let admin_text = admin
        .listen
        .unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.to_string());
    let admin_listen = match admin_text.parse::<SocketAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            c.push(
                "admin.listen",
                format!("{admin_text} is not an address:port such as 127.0.0.1:9090"),
            );
            // Only reached when validation fails, so the value never escapes.
            SocketAddr::from(([127, 0, 0, 1], 9090))
        }
    };

    let admin_interface = admin
        .interface
        .as_deref()
        .map(str::trim)
        .map(str::to_string);
    if admin_interface
        .as_deref()
        .is_some_and(|i| i.is_empty() || i.len() > 15)
    {
        c.push(
            "admin.interface",
            "must be an interface name of 1 to 15 characters",
        );
    }
    AdminConfig {
        listen: admin_listen,
        interface: admin_interface,
    }
}
