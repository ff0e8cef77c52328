//! The operator's Prometheus metrics, shared by every controller: one
//! reconcile timer, the API write counter and the CSR approver's gauges.

use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::error::Error;

#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    writes: IntCounterVec,
    seconds: HistogramVec,
    csr_decisions: IntCounterVec,
    csr_pending: IntGaugeVec,
    csr_max_pending: IntGaugeVec,
    csr_not_running: IntCounterVec,
    template_outcomes: IntCounterVec,
}

impl OperatorMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = OperatorMetrics {
            reconciles: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_reconciles_total",
                    "Reconciles, by controller and result (ok, invalid, error)",
                ),
                &["controller", "result"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_reconcile_errors_total",
                    "Failed reconciles, by controller and kind of error",
                ),
                &["controller", "error"],
            )?,
            writes: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_api_writes_total",
                    "Requests that change objects (apply, delete), by kind and verb",
                ),
                &["kind", "verb"],
            )?,
            seconds: HistogramVec::new(
                HistogramOpts::new(
                    "causeway_operator_reconcile_seconds",
                    "Time per reconcile, by controller",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                ]),
                &["controller"],
            )?,
            csr_decisions: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_csr_decisions_total",
                    "Kubelet CSR decisions, by kind (bootstrap, serving), verdict (approve, deny, ignore) and reason; each CSR counts once per reason",
                ),
                &["kind", "verdict", "reason"],
            )?,
            csr_pending: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_csr_pending",
                    "Kubelet CSRs pending in a hosted cluster (created in the last hour)",
                ),
                &["namespace", "provisioner"],
            )?,
            csr_max_pending: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_csr_max_pending",
                    "The pending-CSR cap of a hosted cluster: above it nothing is approved",
                ),
                &["namespace", "provisioner"],
            )?,
            csr_not_running: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_csr_approver_not_running_total",
                    "Times a hosted cluster's CSR approver could not run, by reason (KubeconfigNotAvailable, HostedClusterNotReachable, LeastPrivilegeUnavailable); nothing is approved meanwhile",
                ),
                &["namespace", "provisioner", "reason"],
            )?,
            template_outcomes: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_dpu_service_templates_total",
                    "DPUServiceTemplate decisions, by template and outcome (applied, unchanged, skipped_unmanaged, gated_rollout, deleted)",
                ),
                &["template", "outcome"],
            )?,
        };
        registry.register(Box::new(m.template_outcomes.clone()))?;
        registry.register(Box::new(m.csr_decisions.clone()))?;
        registry.register(Box::new(m.csr_not_running.clone()))?;
        registry.register(Box::new(m.csr_pending.clone()))?;
        registry.register(Box::new(m.csr_max_pending.clone()))?;
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.writes.clone()))?;
        registry.register(Box::new(m.seconds.clone()))?;
        Ok(m)
    }

    pub fn write(&self, kind: &str, verb: &str) {
        self.writes.with_label_values(&[kind, verb]).inc();
    }

    /// One DPUServiceTemplate decision.
    pub fn template_outcome(&self, template: &str, outcome: &str) {
        self.template_outcomes
            .with_label_values(&[template, outcome])
            .inc();
    }

    pub fn csr_decision(&self, kind: &str, verdict: &str, reason: &str) {
        self.csr_decisions
            .with_label_values(&[kind, verdict, reason])
            .inc();
    }

    pub fn csr_not_running(&self, namespace: &str, provisioner: &str, reason: &str) {
        self.csr_not_running
            .with_label_values(&[namespace, provisioner, reason])
            .inc();
    }

    /// The pending count and cap of one hosted cluster; `None` forgets it.
    pub fn csr_pending(&self, namespace: &str, provisioner: &str, counts: Option<(u32, u32)>) {
        let labels = [namespace, provisioner];
        match counts {
            Some((pending, max)) => {
                self.csr_pending
                    .with_label_values(&labels)
                    .set(pending.into());
                self.csr_max_pending
                    .with_label_values(&labels)
                    .set(max.into());
            }
            None => {
                let _ = self.csr_pending.remove_label_values(&labels);
                let _ = self.csr_max_pending.remove_label_values(&labels);
            }
        }
    }

    /// One reconcile of `controller`: its time, result and error kind.
    pub fn reconciled(&self, controller: &str, seconds: f64, result: &str, error: Option<&str>) {
        self.seconds
            .with_label_values(&[controller])
            .observe(seconds);
        self.reconciles
            .with_label_values(&[controller, result])
            .inc();
        if let Some(kind) = error {
            self.errors.with_label_values(&[controller, kind]).inc();
        }
    }
}

/// One reconcile being timed: started when the reconcile starts, and
/// recorded once with its result.
pub struct ReconcileTimer<'a> {
    metrics: Option<&'a OperatorMetrics>,
    controller: &'static str,
    started: Instant,
}

impl<'a> ReconcileTimer<'a> {
    pub fn start(metrics: Option<&'a OperatorMetrics>, controller: &'static str) -> Self {
        ReconcileTimer {
            metrics,
            controller,
            started: Instant::now(),
        }
    }

    /// Records the reconcile: `ok` or, for a reconcile that found the spec
    /// invalid, `invalid`; `error` with the error's kind.
    pub fn finish<T>(self, result: &Result<T, Error>, valid: bool) {
        let Some(m) = self.metrics else { return };
        let label = match result {
            Ok(_) if valid => "ok",
            Ok(_) => "invalid",
            Err(_) => "error",
        };
        m.reconciled(
            self.controller,
            self.started.elapsed().as_secs_f64(),
            label,
            result.as_ref().err().map(Error::metric_label),
        );
    }
}
