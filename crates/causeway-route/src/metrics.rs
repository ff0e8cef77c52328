//! Policy routing's Prometheus metrics: reconciles by result, and the rules
//! and routes they changed.

use prometheus::{IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct RouteMetrics {
    /// Reconciles, by result (`ok`, `error`).
    pub(crate) reconciles: IntCounterVec,
    /// Rules and routes changed, by kind (`add`, `remove`).
    pub(crate) changes: IntCounterVec,
}

impl RouteMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = RouteMetrics {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "causeway_route_reconciles_total",
                    "Policy-routing reconciles, by result (ok, error)",
                ),
                &["result"],
            )?,
            changes: IntCounterVec::new(
                Opts::new(
                    "causeway_route_changes_total",
                    "Rules and routes added or removed, by kind (add, remove)",
                ),
                &["kind"],
            )?,
        };
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.changes.clone()))?;
        Ok(m)
    }
}
