//! `causeway appliance`: start every enabled service, serve the admin
//! endpoints, reload on SIGHUP or file change, stop gracefully on SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use causeway_config::{Config, LogFormat};
use causeway_dhcp::{
    Dhcp6Metrics, Dhcp6Server, DhcpMetrics, DhcpServer, LeaseObserver, LeaseState,
};
use causeway_dns::{DnsMetrics, DnsServer, DynamicNames};
use causeway_proxy::{ProxyMetrics, ProxyServer};
use causeway_route::{AdvertMetrics, PolicyRouting, RouteMetrics, RouterAdvertiser};
use causeway_runtime::admin::Admin;
use causeway_runtime::{readiness::Readiness, reload, service, signals, telemetry, Shutdown};

/// Which services of the config to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    All,
    Dns,
    Proxy,
}

impl Only {
    fn select(self, mut cfg: Config) -> Config {
        match self {
            Only::All => {}
            Only::Dns => {
                cfg.dhcp = None;
                cfg.proxy = None;
                cfg.routing = None;
                cfg.router_advertisements = None;
                cfg.dhcp6 = None;
            }
            Only::Proxy => {
                cfg.dhcp = None;
                cfg.dns = None;
                cfg.routing = None;
                cfg.router_advertisements = None;
                cfg.dhcp6 = None;
            }
        }
        cfg
    }
}

/// How long established proxied connections may run on after SIGTERM.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

pub fn run(path: Option<PathBuf>, only: Only) -> anyhow::Result<()> {
    let cfg = match &path {
        Some(p) => Config::load(p)?,
        None => Config::from_yaml(causeway_config::EMBEDDED_DEFAULT)
            .context("the embedded default config")?,
    };
    let cfg = only.select(cfg);
    if only == Only::Dns && cfg.dns.is_none() {
        anyhow::bail!("the config has no dns section");
    }
    if only == Only::Proxy && cfg.proxy.is_none() {
        anyhow::bail!("the config has no proxy section");
    }
    let format = match cfg.log.format {
        LogFormat::Text => telemetry::Format::Text,
        LogFormat::Json => telemetry::Format::Json,
    };
    telemetry::init(&cfg.log.level, format)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("causeway")
        .build()
        .context("starting the async runtime")?
        .block_on(serve(path, cfg, only))
}

/// Registers DHCP hostnames in DNS as leases become durable, and drops
/// names whose leases ran out as new ones come, with the table's size and
/// refusals as metrics.
fn dhcp_names(
    cfg: &Config,
    names: &Arc<DynamicNames>,
    registry: &prometheus::Registry,
) -> anyhow::Result<Option<LeaseObserver>> {
    if cfg.dns.as_ref().and_then(|d| d.zone.as_ref()).is_none() {
        return Ok(None);
    }
    let held = prometheus::IntGauge::new(
        "causeway_dns_dhcp_names",
        "Names learned from DHCP leases held for DNS (expired ones until swept)",
    )?;
    let refused = prometheus::IntCounter::new(
        "causeway_dns_dhcp_names_refused_total",
        "DHCP names not registered because the table held its maximum",
    )?;
    registry.register(Box::new(held.clone()))?;
    registry.register(Box::new(refused.clone()))?;
    let names = names.clone();
    Ok(Some(Arc::new(move |lease: &causeway_dhcp::LeaseRecord| {
        // A for a v4 lease, AAAA for a v6 one, under the same rules.
        let ip = lease.ip;
        match (lease.state, &lease.hostname) {
            (LeaseState::Active, Some(host)) => {
                names.register(host, ip, lease.expires);
                names.forget_expired_if_due(causeway_runtime::clock::unix_now());
            }
            // A renewal without a name (no option 12) carries none: the
            // address's old name goes now, not at the old lease's expiry.
            (LeaseState::Active, None) | (LeaseState::Released | LeaseState::Declined, _) => {
                names.unregister(ip)
            }
            _ => {}
        }
        held.set(i64::try_from(names.len()).unwrap_or(i64::MAX));
        let total = names.refused();
        if total > refused.get() {
            refused.inc_by(total - refused.get());
        }
    })))
}

/// Raises the open-files limit to its hard maximum: every proxied
/// connection holds two sockets (and two pipes while bytes move), and the
/// usual soft limit of 1024 would cap the proxy near 500 connections.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "open-files limit raised"),
            Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise the open-files limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open-files limit"),
    }
}

async fn serve(path: Option<PathBuf>, cfg: Config, only: Only) -> anyhow::Result<()> {
    let started = Instant::now();
    // Before anything else that can fail: a service address left on the
    // interface by this replica's last life (a kill -9, a crash) must not
    // stay there while this one fails to start, answering ARP for an
    // address the other replica holds.
    if let Some(ha) = &cfg.ha {
        crate::ha::release_left_addresses(ha).await;
    }
    raise_open_files_limit();
    match &path {
        Some(p) => tracing::info!(config = %p.display(), "causeway appliance starting"),
        None => tracing::info!(
            "causeway appliance starting on the embedded loopback config (examples/local.yaml)"
        ),
    }
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .context("registering process metrics")?;
    warn_unreachable(&cfg);
    let reloads_done = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "causeway_config_reloads_total",
            "Config reloads, by result: applied, invalid (the file did not load) or refused (it changes what only a restart may)",
        ),
        &["result"],
    )
    .context("making the reload metric")?;
    registry
        .register(Box::new(reloads_done.clone()))
        .context("registering the reload metric")?;
    // At zero from the start: the first refused reload then shows as an
    // increase.
    for result in ["applied", "invalid", "refused"] {
        reloads_done.with_label_values(&[result]);
    }
    let readiness = Readiness::default();
    let stop = Shutdown::new();
    let mut stop_signals = signals().context("installing the SIGTERM and SIGINT handlers")?;

    let mut admin = Admin::new(registry.clone(), readiness.clone());
    let names = Arc::new(DynamicNames::for_zone(
        cfg.dns.as_ref().and_then(|d| d.zone.as_deref()),
    ));
    // Routing first: replies from every other service depend on it.
    let routing = match &cfg.routing {
        Some(routing_cfg) => {
            let ready = readiness.register("routing");
            let metrics = RouteMetrics::new(&registry).context("registering routing metrics")?;
            // A service address that moves between HA replicas is routed
            // once this replica holds it, not required at start.
            let floating = cfg.ha.as_ref().is_some_and(|ha| {
                routing_cfg
                    .interfaces
                    .iter()
                    .any(|i| ha.addresses.iter().any(|n| n.addr() == i.address))
            });
            let (routing, report) = PolicyRouting::start_with(
                routing_cfg.clone(),
                Some(metrics),
                stop.clone(),
                !floating,
            )
            .await
            .context("policy routing failed to start")?;
            for (interface, status) in &report.interfaces {
                tracing::info!(
                    interface,
                    status = status.label(),
                    changes = report.changed,
                    "policy routing applied"
                );
            }
            ready.set(true);
            Some(routing)
        }
        None => None,
    };
    let ha = match &cfg.ha {
        Some(ha_cfg) => Some(
            crate::ha::start(
                ha_cfg,
                cfg.dhcp.as_ref().map(|d| d.lease_file.as_path()),
                &registry,
            )
            .await
            .context("high availability failed to start")?,
        ),
        None => None,
    };
    if let Some(ha) = &ha {
        let status: causeway_runtime::readiness::Detail = Arc::new({
            let status = ha.leadership.status_source();
            move || serde_json::to_value(status()).unwrap_or_default()
        });
        readiness.detail("ha", status.clone());
        admin = admin.json("/ha", status);
    }
    // Under HA, DHCP runs as the role says: the server on the active, the
    // lease stream's follower on the standby.
    // Stateful DHCPv6 keeps its leases in the DHCP server's store.
    let v6_port = cfg
        .dhcp6
        .as_ref()
        .filter(|d| d.stateful.is_some() && cfg.dhcp.is_some())
        .map(|_| causeway_dhcp::V6Port::new());
    let ha_dhcp = match (&cfg.dhcp, &ha) {
        (Some(dhcp_cfg), Some(ha)) => {
            let ready = readiness.register("dhcp");
            let metrics = DhcpMetrics::new(&registry).context("registering DHCP metrics")?;
            let observer =
                dhcp_names(&cfg, &names, &registry).context("registering the DHCP name metrics")?;
            let server = causeway_dhcp::ha::HaDhcp::start(
                dhcp_cfg,
                &ha.dhcp,
                &ha.leadership,
                causeway_dhcp::ha::HaDhcpParts {
                    metrics,
                    observer,
                    ready,
                    v6: v6_port.clone(),
                },
                &registry,
                stop.clone(),
            )?;
            let leases = server.lease_source();
            admin = admin.json(
                "/leases",
                Arc::new(move || serde_json::to_value(leases()).unwrap_or_default()),
            );
            Some(server)
        }
        _ => None,
    };
    let dhcp = match cfg.dhcp.as_ref().filter(|_| ha.is_none()) {
        Some(dhcp_cfg) => {
            let ready = readiness.register("dhcp");
            let metrics = DhcpMetrics::new(&registry).context("registering DHCP metrics")?;
            let server = DhcpServer::start(
                dhcp_cfg,
                metrics,
                stop.clone(),
                dhcp_names(&cfg, &names, &registry).context("registering the DHCP name metrics")?,
                ready,
            )
            .await
            .context("DHCP failed to start")?;
            if let Some(port) = &v6_port {
                server.serve_v6(port);
            }
            let leases = server.lease_source();
            admin = admin.json(
                "/leases",
                Arc::new(move || serde_json::to_value(leases()).unwrap_or_default()),
            );
            Some(server)
        }
        None => None,
    };
    let dns = match &cfg.dns {
        Some(dns_cfg) => {
            let ready = readiness.register("dns");
            let metrics = DnsMetrics::new(&registry).context("registering DNS metrics")?;
            let server = DnsServer::start(dns_cfg, names.clone(), metrics, stop.clone())
                .await
                .context("DNS failed to start")?;
            ready.set(true);
            Some(server)
        }
        None => None,
    };
    let proxy = match &cfg.proxy {
        Some(proxy_cfg) => {
            let ready = readiness.register("proxy");
            let metrics = ProxyMetrics::new(&registry).context("registering proxy metrics")?;
            let server = ProxyServer::start(proxy_cfg, metrics, stop.clone())
                .await
                .context("the proxy failed to start")?;
            ready.set(true);
            Some(server)
        }
        None => None,
    };
    let adverts = match &cfg.router_advertisements {
        Some(ra_cfg) => {
            let ready = readiness.register("router advertisements");
            let metrics = AdvertMetrics::new(&registry)
                .context("registering router advertisement metrics")?;
            // Under HA the peer goes on as the same router after a
            // handover, so stopping must not withdraw it from the hosts.
            let adverts = RouterAdvertiser::start(
                ra_cfg.clone(),
                Some(metrics),
                stop.clone(),
                cfg.ha.is_none(),
            )
            .context("router advertisements failed to start")?;
            ready.set(true);
            Some(adverts)
        }
        None => None,
    };
    let dhcp6 = match &cfg.dhcp6 {
        Some(d6) => {
            let ready = readiness.register("dhcp6");
            let metrics = Dhcp6Metrics::new(&registry).context("registering DHCPv6 metrics")?;
            let server = Dhcp6Server::start(d6, metrics, stop.clone(), v6_port.clone())
                .context("DHCPv6 failed to start")?;
            ready.set(true);
            Some(server)
        }
        None => None,
    };
    let (admin_addr, admin_task) = admin
        .bind(
            cfg.admin.listen,
            cfg.admin.interface.as_deref(),
            stop.clone(),
        )
        .await
        .with_context(|| format!("admin server on {}", cfg.admin.listen))?;
    tracing::info!(admin = %admin_addr, ready = readiness.is_ready(), startup_ms = started.elapsed().as_millis() as u64, "causeway appliance serving");

    let mut reloads = reload::watch(path.clone(), Duration::from_secs(2), stop.clone())
        .context("installing the reload watcher")?;
    let mut running = cfg;
    loop {
        tokio::select! {
            name = stop_signals.recv() => { tracing::info!("{name}: shutting down"); break; }
            cause = reloads.recv() => {
                let Some(cause) = cause else { break };
                let Some(p) = &path else {
                    tracing::info!("reload requested, but the embedded config cannot change");
                    continue;
                };
                let loaded = Config::load(p).map(|c| {
                    let next = only.select(c);
                    let refused = restart_only_changes(&running, &next);
                    (next, refused)
                });
                match loaded {
                    Ok((_, refused)) if !refused.is_empty() => {
                        reloads_done.with_label_values(&["refused"]).inc();
                        tracing::error!(
                            ?cause,
                            "reload refused, nothing of it is applied; the running config stays: {}",
                            refused.join("; ")
                        );
                    }
                    Ok((next, _)) => {
                        reloads_done.with_label_values(&["applied"]).inc();
                        service::reload(routing.as_ref(), next.routing.as_ref()).await;
                        if ha_dhcp.is_some() {
                            service::reload(ha_dhcp.as_ref(), next.dhcp.as_ref()).await;
                        } else {
                            service::reload(dhcp.as_ref(), next.dhcp.as_ref()).await;
                        }
                        service::reload(dns.as_ref(), next.dns.as_ref()).await;
                        service::reload(proxy.as_ref(), next.proxy.as_ref()).await;
                        service::reload(adverts.as_ref(), next.router_advertisements.as_ref()).await;
                        service::reload(dhcp6.as_ref(), next.dhcp6.as_ref()).await;
                        warn_restart_only(&running, &next);
                        warn_unreachable(&next);
                        tracing::info!(?cause, "config reloaded");
                        running = next;
                    }
                    Err(e) => {
                        reloads_done.with_label_values(&["invalid"]).inc();
                        tracing::error!(?cause, "reload rejected; the running config stays:\n{e}");
                    }
                }
            }
        }
    }
    stop.cancel();
    // Under HA: DHCP's lease log first (so the standby's stream is whole),
    // then the addresses go to the peer at once rather than after its dead
    // interval; connections to them cannot outlive the move.
    service::stop(ha_dhcp, DRAIN_DEADLINE).await;
    if let Some(ha) = ha {
        ha.leadership.stop().await;
        tracing::info!("service addresses handed to the peer");
    }
    // Clients' connections first (up to the deadline), then what is
    // durable: DHCP last, so every lease queued reaches the disk.
    service::stop(adverts, DRAIN_DEADLINE).await;
    service::stop(dhcp6, DRAIN_DEADLINE).await;
    service::stop(proxy, DRAIN_DEADLINE).await;
    service::stop(dns, DRAIN_DEADLINE).await;
    service::stop(dhcp, DRAIN_DEADLINE).await;
    service::stop(routing, DRAIN_DEADLINE).await;
    let _ = admin_task.await;
    tracing::info!("causeway appliance stopped");
    Ok(())
}

/// Changes a reload must refuse whole, because applying the rest would
/// leave the process on one setting and its next start on another.
/// `dhcp.leaseFile` is one: the server keeps writing the file it opened,
/// so a reload that "applied the rest" would have the next start load the
/// other file and forget every lease acknowledged meanwhile.
fn restart_only_changes(running: &Config, next: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if running.ha != next.ha {
        out.push(
            "the ha section changed: a replica's election, addresses and lease stream are set at start; restart the replicas one at a time".to_string(),
        );
    }
    if let (Some(a), Some(b)) = (&running.dhcp, &next.dhcp) {
        if a.lease_file != b.lease_file {
            out.push(format!(
                "dhcp.leaseFile changed from {} to {}: the lease store cannot move while the server runs (every acknowledged lease is in the first); put it back, or stop the server, move the file and start it again",
                a.lease_file.display(),
                b.lease_file.display()
            ));
        }
    }
    if let (Some(a), Some(b)) = (&running.router_advertisements, &next.router_advertisements) {
        if a.interface != b.interface {
            out.push(format!(
                "routerAdvertisements.interface changed from {} to {}: the advertising socket is bound to its interface at start",
                a.interface, b.interface
            ));
        }
    }
    out
}

/// Subnets a valid config leaves no client a way to reach (`causeway
/// check` says the same).
fn warn_unreachable(cfg: &Config) {
    for note in cfg
        .dhcp
        .as_ref()
        .map(|d| d.unreachable_subnets())
        .unwrap_or_default()
    {
        tracing::warn!("{note}");
    }
}

/// What a reload cannot change.
fn warn_restart_only(running: &Config, next: &Config) {
    if running.admin != next.admin {
        tracing::warn!("admin.listen changed; restart to apply it");
    }
    if running.log != next.log {
        tracing::warn!("log settings changed; restart to apply them");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(ip: [u8; 4], hostname: Option<&str>, state: LeaseState) -> causeway_dhcp::LeaseRecord {
        causeway_dhcp::LeaseRecord {
            ip: ip.into(),
            client: "01:02:00:00:00:00:01".into(),
            hw: "02:00:00:00:00:01".into(),
            state,
            expires: causeway_runtime::clock::unix_now() + 3600,
            hostname: hostname.map(str::to_string),
            term: 0,
        }
    }

    #[test]
    fn a_renewal_without_a_name_drops_the_addresss_old_name_at_once() {
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\n\
             dns:\n  listen: [\"127.0.0.1:5353\"]\n  proxyAddress: 192.168.100.2\n  upstreams: [\"127.0.0.1:9\"]\n",
        )
        .expect("a config with a DNS zone");
        let names = Arc::new(DynamicNames::for_zone(
            cfg.dns.as_ref().and_then(|d| d.zone.as_deref()),
        ));
        let observe = dhcp_names(&cfg, &names, &prometheus::Registry::new())
            .expect("the observer")
            .expect("a zone, so an observer");
        observe(&lease([10, 0, 0, 5], Some("node1"), LeaseState::Active));
        assert_eq!(names.len(), 1);
        // The same address renewed, the client sending no hostname.
        observe(&lease([10, 0, 0, 5], None, LeaseState::Active));
        assert_eq!(names.len(), 0, "the old name is still registered");
        // A client without a name changes nothing that is not its own.
        observe(&lease([10, 0, 0, 6], Some("node2"), LeaseState::Active));
        observe(&lease([10, 0, 0, 7], None, LeaseState::Active));
        assert_eq!(names.len(), 1);
        // A DHCPv6 lease under the same rules: named, then renewed without
        // the FQDN option, then released.
        let v6 = |hostname: Option<&str>, state| causeway_dhcp::LeaseRecord {
            ip: "fd42:10::105".parse().expect("an address"),
            ..lease([0; 4], hostname, state)
        };
        observe(&v6(Some("node6"), LeaseState::Active));
        assert_eq!(names.len(), 2, "the v6 name is registered beside node2");
        observe(&v6(None, LeaseState::Active));
        assert_eq!(names.len(), 1, "the v6 name outlived a renewal without it");
        observe(&v6(Some("node6"), LeaseState::Active));
        observe(&v6(Some("node6"), LeaseState::Released));
        assert_eq!(names.len(), 1, "the v6 name outlived its release");
    }
}
