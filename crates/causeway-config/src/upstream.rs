//! An upstream as the config names it: `host:port` or a list of
//! `address:port`s. Shared by the proxy's listeners and the clusters'
//! ingresses.

use std::net::{IpAddr, SocketAddr};

use crate::collector::Collector;
use crate::name::{valid_name, NameRules};

/// `host:port`, where host is a DNS name (resolved, and re-resolved, at
/// connect time) or an address; or several `address:port`s separated by
/// commas, tried in turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    /// Static addresses, when the upstream was given as a list of them.
    pub addresses: Vec<SocketAddr>,
}

impl Upstream {
    pub fn named(host: impl Into<String>, port: u16) -> Self {
        Upstream {
            host: host.into(),
            port,
            addresses: Vec::new(),
        }
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.addresses.len() > 1 {
            let all: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
            return write!(f, "{}", all.join(","));
        }
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => write!(f, "[{}]:{}", self.host, self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

pub(crate) fn upstream(c: &mut Collector, path: &str, text: &str) -> Option<Upstream> {
    let t = text.trim();
    if t.contains(',') {
        let addrs: Result<Vec<SocketAddr>, _> = t
            .split(',')
            .map(|a| a.trim().parse::<SocketAddr>())
            .collect();
        return match addrs {
            Ok(addrs) => Some(Upstream {
                host: addrs[0].ip().to_string(),
                port: addrs[0].port(),
                addresses: addrs,
            }),
            Err(_) => {
                c.push(
                    path,
                    format!("{text} is not a list of address:port separated by commas"),
                );
                None
            }
        };
    }
    if let Ok(addr) = t.parse::<SocketAddr>() {
        return Some(Upstream {
            host: addr.ip().to_string(),
            port: addr.port(),
            addresses: vec![addr],
        });
    }
    let parsed = t.rsplit_once(':').and_then(|(h, p)| {
        let port: u16 = p.parse().ok().filter(|p| *p > 0)?;
        // Letters, digits and hyphens anywhere, of any length.
        let rules = NameRules {
            underscore: false,
            lengths: false,
            ..NameRules::DNS
        };
        let ok = valid_name(h, rules);
        ok.then(|| Upstream::named(h.to_ascii_lowercase(), port))
    });
    if parsed.is_none() {
        c.push(
            path,
            format!("{text} is not host:port, such as kube-apiserver.clusters-hc1.svc:6443"),
        );
    }
    parsed
}
