//! The whole config: the file as written ([`FileConfig`]), the validated
//! model ([`Config`]), and the one pass from the first to the second.

use serde::{Deserialize, Serialize};

use crate::admin::{AdminConfig, FileAdmin, FileLog, LogConfig};
use crate::collector::Collector;
use crate::dhcp::{DhcpConfig, FileDhcp};
use crate::error::ConfigErrors;
use crate::network::{validate_network, Cluster, FileCluster, FileNetwork, Network};

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub log: FileLog,
    #[serde(default)]
    pub admin: FileAdmin,
    pub cluster: Option<FileCluster>,
    /// Several hosted clusters sharing the VLAN's services, instead of
    /// `cluster`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<crate::clusters::FileServedCluster>,
    pub network: Option<FileNetwork>,
    pub dhcp: Option<FileDhcp>,
    pub dns: Option<crate::dns::FileDns>,
    pub proxy: Option<crate::proxy::FileProxy>,
    pub routing: Option<crate::routing::FileRouting>,
    pub ha: Option<crate::ha::FileHa>,
    pub router_advertisements: Option<crate::ra::FileRouterAdvertisements>,
    pub dhcp6: Option<crate::dhcp6::FileDhcp6>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub log: LogConfig,
    pub admin: AdminConfig,
    /// The first (or only) served cluster: DHCP's domain and the zone of
    /// DHCP-registered names.
    pub cluster: Option<Cluster>,
    /// Every hosted cluster DNS and the proxy serve, `cluster` first.
    pub clusters: Vec<crate::clusters::ServedCluster>,
    pub network: Option<Network>,
    pub dhcp: Option<DhcpConfig>,
    pub dns: Option<crate::dns::DnsConfig>,
    pub proxy: Option<crate::proxy::ProxyConfig>,
    pub routing: Option<crate::routing::RoutingConfig>,
    pub ha: Option<crate::ha::HaConfig>,
    pub router_advertisements: Option<crate::ra::RouterAdvertConfig>,
    pub dhcp6: Option<crate::dhcp6::Dhcp6Config>,
}

pub fn validate(file: FileConfig) -> Result<Config, ConfigErrors> {
    let mut c = Collector { errors: Vec::new() };

    let log = crate::admin::validate_log(&mut c, file.log);
    let admin = crate::admin::validate_admin(&mut c, file.admin);
    let single = file
        .cluster
        .map(|cl| crate::network::validate_cluster(&mut c, cl));
    let network = file.network.and_then(|n| validate_network(&mut c, n));
    let single_proxy =
        file.proxy
            .as_ref()
            .filter(|p| p.enabled)
            .map(|p| crate::clusters::SingleClusterProxy {
                control_plane_namespace: p.control_plane_namespace.clone(),
                api_server_service: p.api_server_service.clone(),
                ingress_https: p.ingress_https.clone(),
                ingress_http: p.ingress_http.clone(),
            });
    let clusters = crate::clusters::validate(
        &mut c,
        single.as_ref(),
        &file.clusters,
        single_proxy.as_ref(),
        network.as_ref(),
    );
    let cluster = clusters.first().map(|cl| cl.cluster.clone()).or(single);

    let dhcp = match file.dhcp {
        Some(d) if d.enabled => {
            crate::dhcp::validate_dhcp(&mut c, d, network.as_ref(), cluster.as_ref())
        }
        _ => None,
    };
    // Only a running proxy routes the apps: without it, *.apps resolves to
    // a load balancer or not at all.
    let proxy_runs = file.proxy.as_ref().is_some_and(|p| p.enabled);
    let dns_clusters: Vec<crate::clusters::ServedCluster> = clusters
        .iter()
        .cloned()
        .map(|mut cl| {
            if !proxy_runs {
                cl.ingress_https = None;
                cl.ingress_http = None;
            }
            cl
        })
        .collect();
    let dns = match file.dns {
        Some(d) if d.enabled => crate::dns::validate(&mut c, d, network.as_ref(), &dns_clusters),
        _ => None,
    };
    let proxy = match file.proxy {
        Some(p) if p.enabled => crate::proxy::validate(&mut c, p, network.as_ref(), &clusters),
        _ => None,
    };
    let routing = match file.routing {
        Some(r) if r.enabled => crate::routing::validate(&mut c, r, network.as_ref()),
        _ => None,
    };

    let ha = match file.ha {
        Some(h) if h.enabled => crate::ha::validate(&mut c, h),
        _ => None,
    };

    let router_advertisements = match file.router_advertisements {
        Some(r) if r.enabled => crate::ra::validate(
            &mut c,
            r,
            network.as_ref().and_then(|n| n.interface.as_deref()),
            cluster.as_ref(),
        ),
        _ => None,
    };

    let dhcp6 = match file.dhcp6 {
        Some(d) if d.enabled => crate::dhcp6::validate(
            &mut c,
            d,
            network.as_ref().and_then(|n| n.interface.as_deref()),
            cluster.as_ref(),
        ),
        _ => None,
    };
    // DHCPv6 names get their reverse names from the DNS server too.
    let mut dns = dns;
    if let (Some(dns), Some(prefix)) = (
        dns.as_mut(),
        dhcp6
            .as_ref()
            .and_then(|d| d.stateful.as_ref())
            .map(|s| s.prefix),
    ) {
        dns.reverse_v6 = Some(prefix);
    }
    if dhcp6.as_ref().is_some_and(|d| d.stateful.is_some()) && dhcp.is_none() {
        c.push(
            "dhcp6.pools",
            "leased DHCPv6 addresses are kept in the dhcp section's lease file, beside the v4 leases: configure dhcp (its leaseFile) as well",
        );
    }

    if c.errors.is_empty() {
        Ok(Config {
            log,
            admin,
            cluster,
            clusters,
            network,
            dhcp,
            dns,
            proxy,
            routing,
            ha,
            router_advertisements,
            dhcp6,
        })
    } else {
        Err(ConfigErrors(c.errors))
    }
}
