//! Active health checks of every upstream address.

use causeway_runtime::fds::{FdBudget, Holder};
use causeway_runtime::resources::local_resources_exhausted;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use causeway_config::{HealthCheck, ListenerKind, ProxyConfig, Upstream};
use causeway_runtime::Shutdown;
use tokio::net::TcpStream;

use crate::balance::Transition;
use crate::state::ProxyState;

/// Every upstream the listeners may send to.
fn upstreams_of(cfg: &ProxyConfig) -> Vec<Upstream> {
    let mut all: Vec<Upstream> = Vec::new();
    for l in &cfg.listeners {
        match &l.kind {
            ListenerKind::Plain(u) => all.push(u.clone()),
            ListenerKind::Sni { routes, default } => {
                all.extend(routes.iter().map(|r| r.upstream.clone()));
                all.extend(default.iter().cloned());
            }
        }
    }
    all.dedup();
    all
}

/// How often each route's available and unavailable addresses are
/// counted for `causeway_proxy_route_upstream_addresses`.
const AVAILABILITY_EVERY: Duration = Duration::from_secs(2);

/// Every route of every listener, by the labels its connection series
/// carry (see `port::routing_of`), with its upstream.
fn routes_of(cfg: &ProxyConfig) -> Vec<(String, String, Upstream)> {
    let mut all = Vec::new();
    for l in &cfg.listeners {
        let listener = l.listen.port().to_string();
        match &l.kind {
            ListenerKind::Plain(u) => all.push((listener, u.to_string(), u.clone())),
            ListenerKind::Sni { routes, default } => {
                for r in routes {
                    all.push((listener.clone(), r.label.clone(), r.upstream.clone()));
                }
                if let Some(u) = default {
                    all.push((listener.clone(), "default".to_string(), u.clone()));
                }
            }
        }
    }
    all
}

/// Counts, for each route, the addresses a connection would use now and
/// those it would skip, so one alert can say that a route has none left.
/// Only addresses already known are counted: this never sends a lookup.
pub(crate) async fn availability_loop(shared: Arc<ProxyState>, shutdown: Shutdown) {
    let gauge = &shared.metrics.route_upstreams;
    loop {
        let cfg = shared.cfg();
        let mut counted = Vec::new();
        for (listener, route, up) in routes_of(&cfg) {
            let Some(addrs) = shared.upstreams.resolver.known_addresses(&up) else {
                continue;
            };
            let unavailable = addrs
                .iter()
                .filter(|a| {
                    shared.upstreams.outliers.ejected(a) || shared.upstreams.health.is_down(a)
                })
                .count();
            let available = addrs.len() - unavailable;
            counted.push((listener, route, available, unavailable));
        }
        // Reset and refill together, so a route gone by a reload loses its
        // series and no scrape sees a half-made set for long.
        gauge.reset();
        for (listener, route, available, unavailable) in counted {
            for (state, n) in [("available", available), ("unavailable", unavailable)] {
                gauge
                    .with_label_values(&[listener.as_str(), route.as_str(), state])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(AVAILABILITY_EVERY) => {}
        }
    }
}

/// Active health checks: each interval, a TCP connect to every address of
/// every upstream, all at once; the config is re-read each round so a
/// reload can turn checks on, off or retime them.
pub(crate) async fn health_loop(shared: Arc<ProxyState>, shutdown: Shutdown) {
    let mut checking = false;
    loop {
        let cfg = shared.cfg();
        let pause = match cfg.health_check {
            Some(rule) => {
                checking = true;
                check_round(&shared, &cfg, &rule).await;
                rule.interval
            }
            None => {
                // Checks just turned off by a reload: forget their verdicts.
                if std::mem::take(&mut checking) {
                    shared.upstreams.health.retain(|_| false);
                    shared.metrics.upstream_down.reset();
                }
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

async fn check_round(shared: &ProxyState, cfg: &ProxyConfig, rule: &HealthCheck) {
    let mut checks = tokio::task::JoinSet::new();
    let mut checked = HashSet::new();
    for up in upstreams_of(cfg) {
        let addrs = match shared.upstreams.resolver.addresses(&up).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(upstream = %up, error = %e, "health check cannot resolve upstream");
                continue;
            }
        };
        for addr in addrs {
            if checked.insert(addr) {
                let timeout = rule.timeout;
                checks.spawn(async move {
                    // A check that cannot get a descriptor says nothing of
                    // the upstream: no verdict this round.
                    let _reserved = FdBudget::global().try_reserve(Holder::HealthCheck, 1)?;
                    let ok = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                        Ok(Ok(_)) => true,
                        Ok(Err(e)) if local_resources_exhausted(&e) => return None,
                        _ => false,
                    };
                    Some((addr, ok))
                });
            }
        }
    }
    while let Some(done) = checks.join_next().await {
        let Ok(Some((addr, ok))) = done else { continue };
        let label = addr.to_string();
        shared
            .metrics
            .health_checks
            .with_label_values(&[label.as_str(), if ok { "ok" } else { "failed" }])
            .inc();
        let transition = shared.upstreams.health.record(addr, ok, rule);
        // Every checked address has its series, 0 while up, so a dashboard
        // shows what is checked and not only what has failed.
        shared
            .metrics
            .upstream_down
            .with_label_values(&[label.as_str()])
            .set(i64::from(shared.upstreams.health.is_down(&addr)));
        match transition {
            Some(Transition::Down) => {
                tracing::warn!(address = %addr, "upstream address down: failed its health checks");
            }
            Some(Transition::Up) => {
                tracing::info!(address = %addr, "upstream address up again: passed its health checks");
            }
            None => {}
        }
    }
    shared.upstreams.health.retain(|a| checked.contains(a));
}
