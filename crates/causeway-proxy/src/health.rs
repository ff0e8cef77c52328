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
        match shared.upstreams.health.record(addr, ok, rule) {
            Some(Transition::Down) => {
                shared
                    .metrics
                    .upstream_down
                    .with_label_values(&[label.as_str()])
                    .set(1);
                tracing::warn!(address = %addr, "upstream address down: failed its health checks");
            }
            Some(Transition::Up) => {
                shared
                    .metrics
                    .upstream_down
                    .with_label_values(&[label.as_str()])
                    .set(0);
                tracing::info!(address = %addr, "upstream address up again: passed its health checks");
            }
            None => {}
        }
    }
    shared.upstreams.health.retain(|a| checked.contains(a));
}
