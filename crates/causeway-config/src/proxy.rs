//! The `proxy:` section: listeners by port, each forwarding to one upstream
//! or routing by TLS server name, with routes derived from the cluster.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::clusters::{ServedCluster, KUBERNETES_ALIASES};
use crate::collector::{yes, Collector, FileDuration};
use crate::network::Network;
use crate::upstream::upstream;
pub use crate::upstream::Upstream;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileProxy {
    #[serde(default = "yes")]
    pub enabled: bool,
    pub listen_address: Option<String>,
    /// A v6 address every listener binds as well, for a dual-stack VLAN.
    pub listen_address_v6: Option<String>,
    pub control_plane_namespace: Option<String>,
    /// The kube-apiserver Service's name in the control-plane namespace.
    pub api_server_service: Option<String>,
    /// `host:port` of the hosted cluster's ingress, for `*.apps` on 443.
    pub ingress_https: Option<String>,
    /// `host:port` of the hosted cluster's ingress, for port 80.
    pub ingress_http: Option<String>,
    #[serde(default)]
    pub listeners: Vec<FileListener>,
    /// Listeners added to the derived (or listed) ones.
    #[serde(default)]
    pub extra_listeners: Vec<FileListener>,
    pub connect_timeout: Option<FileDuration>,
    pub hello_timeout: Option<FileDuration>,
    pub idle_timeout: Option<FileDuration>,
    pub max_connections: Option<usize>,
    pub max_connections_per_source: Option<usize>,
    #[serde(default)]
    pub resolvers: Vec<String>,
    /// A port on every address (`0.0.0.0`) taking the routes of port 443,
    /// so a load balancer on another network reaches them (OAuth from
    /// outside) without the VLAN address.
    pub external_port: Option<u16>,
    /// `roundRobin` (the default) or `leastConnections`.
    pub balance: Option<String>,
    pub health_check: Option<FileHealthCheck>,
}

/// Active TCP health checking of every upstream address.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileHealthCheck {
    pub interval: Option<FileDuration>,
    pub timeout: Option<FileDuration>,
    pub unhealthy_threshold: Option<u32>,
    pub healthy_threshold: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileListener {
    pub port: u16,
    #[serde(default)]
    pub proxy_protocol: bool,
    /// The protocol's client sends first (TLS, HTTP): the upstream
    /// connect holds back its handshake's last ACK to carry it on the
    /// client's first bytes.
    #[serde(default)]
    pub client_speaks_first: bool,
    pub upstream: Option<String>,
    #[serde(default)]
    pub routes: Vec<FileRoute>,
    pub default: Option<String>,
}

/// A route of an SNI listener: by the name the ClientHello carries, by the
/// client's address, or by both.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileRoute {
    /// A host name or `*.` wildcard; left out, the route takes what no
    /// named route took (no name, a name no route has, or not TLS), from
    /// `sources` only.
    pub sni: Option<String>,
    /// Client addresses or CIDRs this route is for; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    pub upstream: String,
}

/// One route of an SNI listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Lowercase host name or `*.` wildcard; None for a route by source
    /// alone.
    pub sni: Option<String>,
    /// Empty: any client.
    pub sources: Vec<IpNet>,
    pub upstream: Upstream,
    /// What its metric series say: the name, or the sources.
    pub label: String,
}

impl Route {
    /// A route by name, for any client.
    pub fn named(sni: impl Into<String>, upstream: Upstream) -> Self {
        let sni = sni.into();
        Route {
            label: sni.clone(),
            sni: Some(sni),
            sources: Vec::new(),
            upstream,
        }
    }
}

/// The label of a route: its name, with its sources when it has them
/// (`kubernetes from 10.0.0.5/32+3`).
fn route_label(sni: Option<&str>, sources: &[IpNet]) -> String {
    let from = match sources {
        [] => String::new(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first}+{}", rest.len()),
    };
    match (sni, from.is_empty()) {
        (Some(n), true) => n.to_string(),
        (Some(n), false) => format!("{n} from {from}"),
        (None, _) => format!("from {from}"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenerKind {
    /// Every connection to one upstream.
    Plain(Upstream),
    /// By the ClientHello's server name, then by the client's address;
    /// `default` takes the rest.
    Sni {
        routes: Vec<Route>,
        default: Option<Upstream>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub listen: SocketAddr,
    pub kind: ListenerKind,
    /// Send a PROXY protocol v2 header to the upstream first.
    pub proxy_protocol: bool,
    /// The client sends first on this listener's protocol (TLS, HTTP), so
    /// the upstream connect may hold back its handshake's last ACK for the
    /// client's first bytes to carry. An SNI listener reads the client's
    /// hello before it connects, so it has bytes to send either way.
    pub client_speaks_first: bool,
}

/// How a connection picks among an upstream's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    LeastConnections,
}

/// Active TCP health checks: an address is marked down after
/// `unhealthy_threshold` failed connects in a row and up again after
/// `healthy_threshold` good ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    pub interval: Duration,
    pub timeout: Duration,
    pub unhealthy_threshold: u32,
    pub healthy_threshold: u32,
}

/// A node's kubelet, its host-network pods and their watches share one
/// address; a few hundred connections from one machine is already a lot.
pub const DEFAULT_MAX_CONNECTIONS_PER_SOURCE: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    pub listeners: Vec<Listener>,
    pub connect_timeout: Duration,
    pub hello_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Connections at once from one client address, across listeners.
    pub max_connections_per_source: usize,
    /// DNS servers to resolve upstream names with, honouring TTLs; empty
    /// means the system resolver at each connection.
    pub resolvers: Vec<SocketAddr>,
    pub balance: Balance,
    /// None: only passive ejection on failed connects.
    pub health_check: Option<HealthCheck>,
}

/// The listeners HyperShift's control planes need, for every served
/// cluster. One cluster whose workers are not listed keeps a plain 6443,
/// as every client of it means that cluster; otherwise 6443 routes by name
/// (`api`, `api-int`) and then by the worker's address, for clients that
/// name no cluster (the in-cluster Service path dials an address).
fn derived(clusters: &[ServedCluster]) -> Vec<(u16, ListenerKind)> {
    let svc = |cl: &ServedCluster, name: &str, port: u16| {
        Upstream::named(format!("{name}.{}.svc", cl.control_plane_namespace), port)
    };
    let api = |cl: &ServedCluster| svc(cl, &cl.api_server_service, 6443);
    let by_source = |cl: &ServedCluster, sni: Option<String>, upstream: Upstream| {
        let sources: Vec<IpNet> = cl.workers.iter().copied().map(IpNet::V4).collect();
        Route {
            label: route_label(sni.as_deref(), &sources),
            sni,
            sources,
            upstream,
        }
    };
    let mut out = Vec::new();
    match clusters {
        [one] if one.workers.is_empty() => out.push((6443, ListenerKind::Plain(api(one)))),
        _ => {
            let mut routes = Vec::new();
            for cl in clusters {
                let zone = cl.domain();
                routes.push(Route::named(format!("api.{zone}"), api(cl)));
                routes.push(Route::named(format!("api-int.{zone}"), api(cl)));
            }
            for cl in clusters.iter().filter(|cl| !cl.workers.is_empty()) {
                routes.push(by_source(cl, None, api(cl)));
            }
            out.push((
                6443,
                ListenerKind::Sni {
                    routes,
                    default: None,
                },
            ));
        }
    }
    let mut routes = Vec::new();
    for cl in clusters {
        let zone = cl.domain();
        routes.push(Route::named(
            format!("oauth.{zone}"),
            svc(cl, "oauth-openshift", 6443),
        ));
        routes.push(Route::named(
            format!("ignition.{zone}"),
            svc(cl, "ignition-server-proxy", 443),
        ));
        routes.push(Route::named(
            format!("konnectivity.{zone}"),
            svc(cl, "konnectivity-server", 8091),
        ));
        if let Some(i) = &cl.ingress_https {
            routes.push(Route::named(format!("*.apps.{zone}"), i.clone()));
        }
    }
    for cl in clusters.iter().filter(|cl| !cl.workers.is_empty()) {
        for alias in KUBERNETES_ALIASES {
            routes.push(by_source(cl, Some(alias.to_string()), api(cl)));
        }
    }
    out.push((
        443,
        ListenerKind::Sni {
            routes,
            default: None,
        },
    ));
    let http: Vec<&ServedCluster> = clusters
        .iter()
        .filter(|cl| cl.ingress_http.is_some())
        .collect();
    match http.as_slice() {
        [] => {}
        // Plain HTTP names no cluster in its first bytes: one cluster's
        // ingress takes port 80 whole, several share it by worker address.
        [one] if clusters.len() == 1 || one.workers.is_empty() => {
            if let Some(i) = &one.ingress_http {
                out.push((80, ListenerKind::Plain(i.clone())));
            }
        }
        several => {
            let routes = several
                .iter()
                .filter(|cl| !cl.workers.is_empty())
                .filter_map(|cl| cl.ingress_http.clone().map(|i| by_source(cl, None, i)))
                .collect();
            out.push((
                80,
                ListenerKind::Sni {
                    routes,
                    default: None,
                },
            ));
        }
    }
    out
}

/// Listeners as written, each checked; `taken` are ports already in use.
fn parse_listeners(
    c: &mut Collector,
    prefix: &str,
    file: &[FileListener],
    taken: &[u16],
) -> Vec<(u16, ListenerKind, bool, bool)> {
    let mut listeners = Vec::new();
    for (i, l) in file.iter().enumerate() {
        let path = format!("{prefix}[{i}]");
        if l.port == 0 {
            c.push(format!("{path}.port"), "must be a port from 1 to 65535");
        }
        if file[..i].iter().any(|o| o.port == l.port) {
            c.push(
                format!("{path}.port"),
                format!("port {} is listed twice", l.port),
            );
        } else if taken.contains(&l.port) {
            c.push(
                format!("{path}.port"),
                format!("port {} is already a proxy listener", l.port),
            );
        }
        let kind = match (&l.upstream, l.routes.is_empty()) {
            (Some(u), true) => upstream(c, &format!("{path}.upstream"), u).map(ListenerKind::Plain),
            (None, false) => {
                let routes: Vec<Route> = l
                    .routes
                    .iter()
                    .enumerate()
                    .filter_map(|(j, r)| route(c, &format!("{path}.routes[{j}]"), r))
                    .collect();
                let default = l
                    .default
                    .as_deref()
                    .and_then(|d| upstream(c, &format!("{path}.default"), d));
                Some(ListenerKind::Sni { routes, default })
            }
            _ => {
                c.push(
                    &path,
                    "give either upstream, or routes (with an optional default)",
                );
                None
            }
        };
        if let Some(kind) = kind {
            listeners.push((l.port, kind, l.proxy_protocol, l.client_speaks_first));
        }
    }
    listeners
}

fn route(c: &mut Collector, path: &str, r: &FileRoute) -> Option<Route> {
    let sni = r
        .sni
        .as_deref()
        .map(|s| s.trim().trim_end_matches('.').to_ascii_lowercase())
        .filter(|s| !s.is_empty());
    let mut sources = Vec::new();
    for (k, text) in r.sources.iter().enumerate() {
        let t = text.trim();
        match t
            .parse::<IpNet>()
            .ok()
            .or_else(|| t.parse::<IpAddr>().ok().map(IpNet::from))
        {
            Some(n) => sources.push(n.trunc()),
            None => c.push(
                format!("{path}.sources[{k}]"),
                format!("{t} is not an address or CIDR"),
            ),
        }
    }
    if sni.is_none() && r.sources.is_empty() {
        c.push(
            path,
            "give sni, sources or both (a route for everything else is the listener's default)",
        );
        return None;
    }
    let upstream = upstream(c, &format!("{path}.upstream"), &r.upstream)?;
    Some(Route {
        label: route_label(sni.as_deref(), &sources),
        sni,
        sources,
        upstream,
    })
}

pub(crate) fn validate(
    c: &mut Collector,
    p: FileProxy,
    network: Option<&Network>,
    clusters: &[ServedCluster],
) -> Option<ProxyConfig> {
    let listen_ip: IpAddr = match &p.listen_address {
        Some(t) => match t.trim().parse() {
            Ok(ip) => ip,
            Err(_) => {
                c.push("proxy.listenAddress", format!("{t} is not an IP address"));
                return None;
            }
        },
        None => match network.and_then(|n| n.address) {
            Some(a) => IpAddr::V4(a),
            None => {
                c.push(
                    "proxy.listenAddress",
                    "missing, and network.address is not set",
                );
                return None;
            }
        },
    };
    let mut listeners = parse_listeners(c, "proxy.listeners", &p.listeners, &[]);
    if p.listeners.is_empty() {
        if clusters.is_empty() {
            c.push(
                "proxy.listeners",
                "none listed, and no cluster to derive them from",
            );
        }
        // Every listener derived for a hosted control plane carries TLS or
        // HTTP, whose clients speak first.
        listeners = derived(clusters)
            .into_iter()
            .map(|(port, kind)| (port, kind, false, true))
            .collect();
    }
    let taken: Vec<u16> = listeners.iter().map(|(port, ..)| *port).collect();
    listeners.extend(parse_listeners(
        c,
        "proxy.extraListeners",
        &p.extra_listeners,
        &taken,
    ));
    let connect_timeout = p
        .connect_timeout
        .as_ref()
        .and_then(|v| c.duration("proxy.connectTimeout", v))
        .unwrap_or(Duration::from_secs(5));
    let hello_timeout = p
        .hello_timeout
        .as_ref()
        .and_then(|v| c.duration("proxy.helloTimeout", v))
        .unwrap_or(Duration::from_secs(10));
    let idle_timeout = p
        .idle_timeout
        .as_ref()
        .and_then(|v| c.duration("proxy.idleTimeout", v))
        .unwrap_or(Duration::from_secs(3600));
    let mut resolvers = Vec::new();
    for (i, t) in p.resolvers.iter().enumerate() {
        let t = t.trim();
        match t
            .parse::<SocketAddr>()
            .or_else(|_| t.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        {
            Ok(a) => resolvers.push(a),
            Err(_) => c.push(
                format!("proxy.resolvers[{i}]"),
                format!("{t} is not an address or address:port"),
            ),
        }
    }
    let balance = match p.balance.as_deref().map(str::trim) {
        None | Some("roundRobin") => Balance::RoundRobin,
        Some("leastConnections") => Balance::LeastConnections,
        Some(other) => {
            c.push(
                "proxy.balance",
                format!("{other} is not roundRobin or leastConnections"),
            );
            Balance::RoundRobin
        }
    };
    let health_check = p.health_check.as_ref().map(|h| {
        let interval = h
            .interval
            .as_ref()
            .and_then(|v| c.duration("proxy.healthCheck.interval", v))
            .unwrap_or(Duration::from_secs(5));
        let timeout = h
            .timeout
            .as_ref()
            .and_then(|v| c.duration("proxy.healthCheck.timeout", v))
            .unwrap_or(Duration::from_secs(1));
        if interval.is_zero() {
            c.push("proxy.healthCheck.interval", "must be above zero");
        }
        if timeout > interval {
            c.push(
                "proxy.healthCheck.timeout",
                "must not be longer than the interval",
            );
        }
        let threshold = |c: &mut Collector, name: &str, v: Option<u32>, default: u32| match v {
            Some(0) => {
                c.push(format!("proxy.healthCheck.{name}"), "must be at least 1");
                default
            }
            Some(n) => n,
            None => default,
        };
        HealthCheck {
            interval,
            timeout,
            unhealthy_threshold: threshold(c, "unhealthyThreshold", h.unhealthy_threshold, 2),
            healthy_threshold: threshold(c, "healthyThreshold", h.healthy_threshold, 1),
        }
    });
    let mut listeners: Vec<Listener> = listeners
        .into_iter()
        .map(
            |(port, kind, proxy_protocol, client_speaks_first)| Listener {
                listen: SocketAddr::new(listen_ip, port),
                kind,
                proxy_protocol,
                client_speaks_first,
            },
        )
        .collect();
    let listen_v6 =
        p.listen_address_v6
            .as_deref()
            .and_then(|t| match t.trim().parse::<std::net::Ipv6Addr>() {
                Ok(ip) if listen_ip == IpAddr::V6(ip) => {
                    c.push(
                        "proxy.listenAddressV6",
                        format!("{ip} is also proxy.listenAddress"),
                    );
                    None
                }
                Ok(ip) if ip.is_multicast() => {
                    c.push(
                        "proxy.listenAddressV6",
                        format!("{ip} is a multicast address"),
                    );
                    None
                }
                Ok(ip) => Some(ip),
                Err(_) => {
                    c.push(
                        "proxy.listenAddressV6",
                        format!("{t} is not an IPv6 address"),
                    );
                    None
                }
            });
    if let Some(v6) = listen_v6 {
        let v6_listeners: Vec<Listener> = listeners
            .iter()
            .map(|l| Listener {
                listen: SocketAddr::new(IpAddr::V6(v6), l.listen.port()),
                ..l.clone()
            })
            .collect();
        listeners.extend(v6_listeners);
    }
    if let Some(port) = p.external_port {
        let https = listeners.iter().find(|l| l.listen.port() == 443).cloned();
        match https {
            _ if port == 0 => c.push("proxy.externalPort", "must be a port from 1 to 65535"),
            _ if listeners.iter().any(|l| l.listen.port() == port) => c.push(
                "proxy.externalPort",
                format!("port {port} is already a proxy listener"),
            ),
            None => c.push(
                "proxy.externalPort",
                "there is no listener on 443 whose routes it would take",
            ),
            Some(l) => listeners.push(Listener {
                listen: SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), port),
                ..l
            }),
        }
    }
    Some(ProxyConfig {
        balance,
        health_check,
        listeners,
        connect_timeout,
        hello_timeout,
        idle_timeout,
        resolvers,
        max_connections: p.max_connections.unwrap_or(10_000).max(1),
        max_connections_per_source: p
            .max_connections_per_source
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_SOURCE)
            .max(1),
    })
}
