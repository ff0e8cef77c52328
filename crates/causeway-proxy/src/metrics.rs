//! The proxy's Prometheus metrics, labelled by listener port.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub struct ProxyMetrics {
    pub accepted: IntCounterVec,
    pub active: IntGaugeVec,
    pub route_accepted: IntCounterVec,
    pub route_active: IntGaugeVec,
    pub refused: IntCounterVec,
    pub bytes: IntCounterVec,
    pub connect_errors: IntCounterVec,
    pub connect_seconds: HistogramVec,
    pub sni_failures: IntCounterVec,
    pub ejections: IntCounterVec,
    pub upstream_open: IntGaugeVec,
    pub health_checks: IntCounterVec,
    pub upstream_down: IntGaugeVec,
    pub route_upstreams: IntGaugeVec,
}

impl ProxyMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = ProxyMetrics {
            accepted: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_connections_total",
                    "Client connections accepted, per listener port",
                ),
                &["listener"],
            )?,
            active: IntGaugeVec::new(
                Opts::new(
                    "causeway_proxy_connections_active",
                    "Client connections open, per listener port",
                ),
                &["listener"],
            )?,
            route_accepted: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_route_connections_total",
                    "Connections routed, per listener port and route (the SNI pattern as configured, default, or a plain listener's upstream)",
                ),
                &["listener", "route"],
            )?,
            route_active: IntGaugeVec::new(
                Opts::new(
                    "causeway_proxy_route_connections_active",
                    "Routed connections open, per listener port and route",
                ),
                &["listener", "route"],
            )?,
            refused: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_refused_total",
                    "Connections closed on arrival, by the limit they met: listener (its maxConnections), total (the proxy's share of the process's descriptor budget), source (maxConnectionsPerSource)",
                ),
                &["listener", "limit"],
            )?,
            bytes: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_bytes_total",
                    "Bytes relayed, per listener and direction (up: client to upstream)",
                ),
                &["listener", "direction"],
            )?,
            connect_errors: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_connect_errors_total",
                    "Upstream connections that failed, per listener and reason",
                ),
                &["listener", "reason"],
            )?,
            connect_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "causeway_proxy_connect_seconds",
                    "Time to connect to an upstream",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0,
                ]),
                &["listener"],
            )?,
            sni_failures: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_sni_failures_total",
                    "ClientHellos not read, per listener and reason",
                ),
                &["listener", "reason"],
            )?,
            ejections: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_ejections_total",
                    "Upstream addresses ejected after repeated connect failures",
                ),
                &["listener"],
            )?,
            upstream_open: IntGaugeVec::new(
                Opts::new(
                    "causeway_proxy_upstream_connections_active",
                    "Connections open to each upstream address",
                ),
                &["address"],
            )?,
            health_checks: IntCounterVec::new(
                Opts::new(
                    "causeway_proxy_health_checks_total",
                    "Active TCP health checks, per upstream address and result (ok, failed)",
                ),
                &["address", "result"],
            )?,
            upstream_down: IntGaugeVec::new(
                Opts::new(
                    "causeway_proxy_upstream_down",
                    "1 while active health checks hold an upstream address down",
                ),
                &["address"],
            )?,
            route_upstreams: IntGaugeVec::new(
                Opts::new(
                    "causeway_proxy_route_upstream_addresses",
                    "A route's upstream addresses by state: available, or unavailable (ejected after connect failures, or down by health checks); none while its name has never resolved",
                ),
                &["listener", "route", "state"],
            )?,
        };
        registry.register(Box::new(m.route_upstreams.clone()))?;
        registry.register(Box::new(m.upstream_open.clone()))?;
        registry.register(Box::new(m.health_checks.clone()))?;
        registry.register(Box::new(m.upstream_down.clone()))?;
        registry.register(Box::new(m.ejections.clone()))?;
        registry.register(Box::new(m.accepted.clone()))?;
        registry.register(Box::new(m.active.clone()))?;
        registry.register(Box::new(m.route_accepted.clone()))?;
        registry.register(Box::new(m.route_active.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.bytes.clone()))?;
        registry.register(Box::new(m.connect_errors.clone()))?;
        registry.register(Box::new(m.connect_seconds.clone()))?;
        registry.register(Box::new(m.sni_failures.clone()))?;
        Ok(m)
    }
}
