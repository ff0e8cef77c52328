//! The operator's Prometheus metrics, shared by every controller: one
//! reconcile timer, the API write counter and the CSR approver's gauges.

use std::time::Instant;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::error::Error;

#[derive(Clone)]
pub struct OperatorMetrics {
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    writes: IntCounterVec,
    seconds: HistogramVec,
    csr_decisions: IntCounterVec,
    csr_live_certificates: IntCounterVec,
    csr_passes: prometheus::IntCounter,
    csr_pending: IntGaugeVec,
    csr_max_pending: IntGaugeVec,
    csr_not_running: IntCounterVec,
    template_outcomes: IntCounterVec,
    leader: IntGauge,
    conditions: IntGaugeVec,
    deletions: IntGaugeVec,
}

/// Why a hosted cluster's CSR approver could not run: the `reason` label
/// of `causeway_operator_csr_approver_not_running_total`.
pub const APPROVER_NOT_RUNNING: [&str; 3] = [
    "KubeconfigNotAvailable",
    "HostedClusterNotReachable",
    "LeastPrivilegeUnavailable",
];

/// What the status metrics say of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectState {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Each condition's type and whether its status is True.
    pub conditions: Vec<(String, bool)>,
    /// The deletionTimestamp, in Unix seconds, while the object is going.
    pub deleting_since: Option<i64>,
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
            csr_passes: prometheus::IntCounter::new(
                "causeway_operator_csr_approval_passes_total",
                "Approval passes over a hosted cluster's pending CSRs; events that arrive within 250 ms of the one that started a pass join it",
            )?,
            csr_live_certificates: IntCounterVec::new(
                Opts::new(
                    "causeway_operator_csr_live_certificates_total",
                    "Reads of a kubelet's live serving certificate for a serving renewal, by result: verified (renewal held to it), refused (not the node's serving certificate of the kubelet serving CA), unreachable, no_address (no assigned InternalIP), no_ca (the CA bundle could not be read); all but verified fall back to the recorded SANs",
                ),
                &["result"],
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
            leader: IntGauge::new(
                "causeway_operator_leader",
                "1 while this replica runs the controllers (it holds the Lease, or election is off); 0 while it waits",
            )?,
            conditions: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_condition",
                    "Status conditions of the objects the operator reconciles: 1 when True, 0 when False or Unknown",
                ),
                &["kind", "object_namespace", "name", "type"],
            )?,
            deletions: IntGaugeVec::new(
                Opts::new(
                    "causeway_operator_deletion_timestamp_seconds",
                    "The deletionTimestamp (Unix seconds) of an object whose deletion waits on its finalizer",
                ),
                &["kind", "object_namespace", "name"],
            )?,
        };
        registry.register(Box::new(m.leader.clone()))?;
        registry.register(Box::new(m.conditions.clone()))?;
        registry.register(Box::new(m.deletions.clone()))?;
        registry.register(Box::new(m.template_outcomes.clone()))?;
        registry.register(Box::new(m.csr_decisions.clone()))?;
        registry.register(Box::new(m.csr_live_certificates.clone()))?;
        registry.register(Box::new(m.csr_passes.clone()))?;
        registry.register(Box::new(m.csr_not_running.clone()))?;
        registry.register(Box::new(m.csr_pending.clone()))?;
        registry.register(Box::new(m.csr_max_pending.clone()))?;
        registry.register(Box::new(m.reconciles.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.writes.clone()))?;
        registry.register(Box::new(m.seconds.clone()))?;
        Ok(m)
    }

    /// Makes `controller`'s reconcile series, at zero, before its first
    /// reconcile: an alert's rate over a series that appears only with its
    /// first error misses that error, and an absent series looks healthy.
    pub fn controller_started(&self, controller: &str) {
        for result in ["ok", "invalid", "error"] {
            self.reconciles.with_label_values(&[controller, result]);
        }
        for kind in Error::METRIC_LABELS {
            self.errors.with_label_values(&[controller, kind]);
        }
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Replaces every object's status series with `objects`: a series of
    /// an object or condition no longer there goes with it.
    pub fn object_states(&self, objects: &[ObjectState]) {
        self.conditions.reset();
        self.deletions.reset();
        for o in objects {
            for (type_, true_) in &o.conditions {
                self.conditions
                    .with_label_values(&[o.kind, o.namespace.as_str(), o.name.as_str(), type_])
                    .set(i64::from(*true_));
            }
            if let Some(at) = o.deleting_since {
                self.deletions
                    .with_label_values(&[o.kind, o.namespace.as_str(), o.name.as_str()])
                    .set(at);
            }
        }
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

    pub fn csr_pass(&self) {
        self.csr_passes.inc();
    }

    pub fn csr_live_certificate(&self, result: &str) {
        self.csr_live_certificates
            .with_label_values(&[result])
            .inc();
    }

    /// Makes a hosted cluster's not-running series, at zero, as its
    /// approver starts: the first failure then shows as an increase.
    pub fn approver_started(&self, namespace: &str, provisioner: &str) {
        for reason in APPROVER_NOT_RUNNING {
            self.csr_not_running
                .with_label_values(&[namespace, provisioner, reason]);
        }
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
                for reason in APPROVER_NOT_RUNNING {
                    let _ =
                        self.csr_not_running
                            .remove_label_values(&[namespace, provisioner, reason]);
                }
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
