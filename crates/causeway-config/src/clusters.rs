//! The hosted clusters one appliance serves. `cluster:` names one (with
//! its control plane and ingress under `proxy:`); `clusters:` lists
//! several that share the VLAN's DHCP, DNS and proxy, each with its own
//! control-plane namespace, ingress and worker addresses. Both become the
//! same [`ServedCluster`] list, from which DNS derives its zones and
//! records and the proxy its routes.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::collector::Collector;
use crate::name::{valid_label, valid_name, NameRules};
use crate::network::{Cluster, Network};
use crate::upstream::{upstream, Upstream};

/// One entry of `clusters:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileServedCluster {
    pub name: String,
    pub base_domain: String,
    /// By default `clusters-<name>`.
    pub control_plane_namespace: Option<String>,
    /// By default `kube-apiserver`.
    pub api_server_service: Option<String>,
    /// `host:port` of this cluster's ingress, for `*.apps` on 443.
    pub ingress_https: Option<String>,
    /// `host:port` of this cluster's ingress, for port 80.
    pub ingress_http: Option<String>,
    /// An address on the VLAN (a load balancer's) that `*.apps` resolves to
    /// directly in the views that reach the VLAN.
    pub apps_address: Option<String>,
    /// This cluster's worker addresses (or CIDRs). Connections from them
    /// that name no cluster (`kubernetes.default.svc`, or the API by
    /// address on 6443) go to this cluster's API server.
    #[serde(default)]
    pub workers: Vec<String>,
}

/// A hosted cluster as the services see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedCluster {
    pub cluster: Cluster,
    pub control_plane_namespace: String,
    pub api_server_service: String,
    pub ingress_https: Option<Upstream>,
    pub ingress_http: Option<Upstream>,
    pub apps_address: Option<Ipv4Addr>,
    pub workers: Vec<Ipv4Net>,
}

impl ServedCluster {
    /// `<name>.<baseDomain>`.
    pub fn domain(&self) -> String {
        self.cluster.domain()
    }

    /// Whether the proxy routes this cluster's `*.apps`.
    pub fn apps_via_proxy(&self) -> bool {
        self.ingress_https.is_some() || self.ingress_http.is_some()
    }
}

/// In-cluster names of the API a worker may resolve: they name no hosted
/// cluster, so they are answered and routed by the worker's address.
pub const KUBERNETES_ALIASES: &[&str] = &[
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The most `clusters:` entries: each adds five SNI routes and a zone, and
/// a VLAN with more hosted clusters than this is better split.
pub const MAX_CLUSTERS: usize = 64;

/// What `proxy:` says of the one cluster of `cluster:`.
#[derive(Debug, Clone, Default)]
pub(crate) struct SingleClusterProxy {
    pub(crate) control_plane_namespace: Option<String>,
    pub(crate) api_server_service: Option<String>,
    pub(crate) ingress_https: Option<String>,
    pub(crate) ingress_http: Option<String>,
}

/// The served clusters from `cluster:` or `clusters:` (never both), with
/// the running proxy's single-cluster fields folded into the one of
/// `cluster:`.
pub(crate) fn validate(
    c: &mut Collector,
    single: Option<&Cluster>,
    list: &[FileServedCluster],
    proxy: Option<&SingleClusterProxy>,
    network: Option<&Network>,
) -> Vec<ServedCluster> {
    if !list.is_empty() {
        if single.is_some() {
            c.push(
                "clusters",
                "set either cluster (one hosted cluster) or clusters (several), not both",
            );
        }
        if let Some(p) = proxy {
            for (field, set) in [
                ("controlPlaneNamespace", p.control_plane_namespace.is_some()),
                ("apiServerService", p.api_server_service.is_some()),
                ("ingressHttps", p.ingress_https.is_some()),
                ("ingressHttp", p.ingress_http.is_some()),
            ] {
                if set {
                    c.push(
                        format!("proxy.{field}"),
                        format!("with clusters listed, set {field} on each entry of clusters"),
                    );
                }
            }
        }
        if list.len() > MAX_CLUSTERS {
            c.push(
                "clusters",
                format!(
                    "{} clusters listed; at most {MAX_CLUSTERS} share one VLAN",
                    list.len()
                ),
            );
        }
        return listed(c, list, network);
    }
    let Some(cluster) = single else {
        return Vec::new();
    };
    let https = proxy
        .and_then(|p| p.ingress_https.as_deref())
        .and_then(|t| upstream(c, "proxy.ingressHttps", t));
    let http = proxy
        .and_then(|p| p.ingress_http.as_deref())
        .and_then(|t| upstream(c, "proxy.ingressHttp", t));
    vec![ServedCluster {
        cluster: cluster.clone(),
        control_plane_namespace: proxy
            .and_then(|p| p.control_plane_namespace.clone())
            .unwrap_or_else(|| format!("clusters-{}", cluster.name)),
        api_server_service: proxy
            .and_then(|p| p.api_server_service.clone())
            .unwrap_or_else(|| "kube-apiserver".into()),
        ingress_https: https,
        ingress_http: http,
        apps_address: None,
        workers: Vec::new(),
    }]
}

fn listed(
    c: &mut Collector,
    list: &[FileServedCluster],
    network: Option<&Network>,
) -> Vec<ServedCluster> {
    let mut out: Vec<ServedCluster> = Vec::new();
    for (i, f) in list.iter().enumerate() {
        let path = format!("clusters[{i}]");
        let name = f.name.trim().to_ascii_lowercase();
        let base_domain = f
            .base_domain
            .trim()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if !valid_label(&name, NameRules::HOST) {
            c.push(
                format!("{path}.name"),
                format!("{:?} is not a DNS label", f.name),
            );
        }
        if !valid_name(&base_domain, NameRules::HOST) {
            c.push(
                format!("{path}.baseDomain"),
                format!("{:?} is not a DNS name", f.base_domain),
            );
        }
        let cluster = Cluster {
            name: name.clone(),
            base_domain,
        };
        let domain = cluster.domain();
        if let Some(j) = out.iter().position(|o| o.domain() == domain) {
            c.push(
                format!("{path}.name"),
                format!("{domain} is also clusters[{j}]'s domain"),
            );
        }
        let https = f
            .ingress_https
            .as_deref()
            .and_then(|t| upstream(c, &format!("{path}.ingressHttps"), t));
        let http = f
            .ingress_http
            .as_deref()
            .and_then(|t| upstream(c, &format!("{path}.ingressHttp"), t));
        let apps_address = f
            .apps_address
            .as_deref()
            .and_then(|t| c.ipv4(&format!("{path}.appsAddress"), t));
        let mut workers: Vec<Ipv4Net> = Vec::new();
        for (w, text) in f.workers.iter().enumerate() {
            let wpath = format!("{path}.workers[{w}]");
            let t = text.trim();
            let parsed = t
                .parse::<Ipv4Net>()
                .ok()
                .or_else(|| t.parse::<Ipv4Addr>().ok().map(Ipv4Net::from));
            let Some(net) = parsed else {
                c.push(
                    wpath,
                    format!("{t} is not an IPv4 address or CIDR (IPv6 workers are not routed yet)"),
                );
                continue;
            };
            let net = net.trunc();
            if let Some(n) = network {
                if !n.cidr.contains(&net) {
                    c.push(&wpath, format!("{net} is outside network.cidr {}", n.cidr));
                    continue;
                }
            }
            // One address in two clusters' lists would be routed by whichever
            // came first: refused rather than guessed.
            let clash = out.iter().enumerate().find_map(|(j, o)| {
                o.workers
                    .iter()
                    .find(|x| x.contains(&net.network()) || net.contains(&x.network()))
                    .map(|x| (j, *x))
            });
            if let Some((j, other)) = clash {
                c.push(
                    &wpath,
                    format!("{net} overlaps {other}, a worker of clusters[{j}]"),
                );
                continue;
            }
            workers.push(net);
        }
        let namespace = f
            .control_plane_namespace
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map_or_else(|| format!("clusters-{name}"), str::to_string);
        if !valid_label(&namespace, NameRules::HOST) {
            c.push(
                format!("{path}.controlPlaneNamespace"),
                format!("{namespace:?} is not a namespace name"),
            );
        }
        out.push(ServedCluster {
            cluster,
            control_plane_namespace: namespace,
            api_server_service: f
                .api_server_service
                .clone()
                .filter(|s| !s.trim().is_empty())
                .unwrap_or_else(|| "kube-apiserver".into()),
            ingress_https: https,
            ingress_http: http,
            apps_address,
            workers,
        });
    }
    out
}
