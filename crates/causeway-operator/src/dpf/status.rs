//! A provisioner's status as a pure function of what a reconcile saw: the
//! conditions (the Go operator's names and reasons, HyperShift's mirrored,
//! and the Applied/Available/Health summary), Ready checked in order, and
//! the phase. Also the decisions that read status-like facts: how far an
//! upgrade has got and what kubeconfig injection must do.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::crd::Phase;
use crate::k8s::conditions;

pub const READY: &str = "Ready";
pub const SPEC_VALID: &str = "SpecValid";
pub const PROVISIONER_CONFIG: &str = "ProvisionerConfig";
pub const DPU_CLUSTER_MISSING: &str = "DPUClusterMissing";
pub const CLUSTER_TYPE_VALID: &str = "ClusterTypeValid";
pub const DPU_CLUSTER_IN_USE: &str = "DPUClusterInUse";
pub const SECRETS_VALID: &str = "SecretsValid";
pub const PREREQUISITES: &str = "PrerequisitesInstalled";
pub const METALLB_CONFIGURED: &str = "MetalLBConfigured";
pub const KUBECONFIG_INJECTED: &str = "KubeConfigInjected";
pub const UPGRADING: &str = "HostedClusterUpgrading";
pub const CLEANUP: &str = "HostedClusterCleanup";
pub const APPLIED: &str = "Applied";
pub const AVAILABLE: &str = "Available";
pub const HEALTH: &str = "Health";
pub const HOSTED_CLUSTER_AVAILABLE: &str = "HostedClusterAvailable";
pub const CSR_AUTO_APPROVAL_ACTIVE: &str = "CSRAutoApprovalActive";
pub const DPU_JOIN_BLOCKED: &str = "DPUJoinBlocked";
pub const IGNITION_CONFIGURED: &str = "IgnitionConfigured";
/// The Go operator's name for the BlueField image lookup's condition.
pub const BLUEFIELD_IMAGE_FOUND: &str = "BlueFieldOCPLayerImageFound";
/// The same condition under the name the chart README and webhook use.
pub const BLUEFIELD_IMAGE_AVAILABLE: &str = "BlueFieldContainerImageAvailable";

/// HostedCluster conditions copied verbatim, under these names.
pub const MIRRORED: [(&str, &str); 13] = [
    ("Available", HOSTED_CLUSTER_AVAILABLE),
    ("Progressing", "HostedClusterProgressing"),
    ("Degraded", "HostedClusterDegraded"),
    ("ValidReleaseInfo", "ValidReleaseInfo"),
    ("ValidReleaseImage", "ValidReleaseImage"),
    ("IgnitionEndpointAvailable", "IgnitionEndpointAvailable"),
    (
        "IgnitionServerValidReleaseInfo",
        "IgnitionServerValidReleaseInfo",
    ),
    ("EtcdAvailable", "EtcdAvailable"),
    ("KubeAPIServerAvailable", "KubeAPIServerAvailable"),
    ("InfrastructureReady", "InfrastructureReady"),
    ("EtcdRecoveryActive", "EtcdRecoveryActive"),
    (
        "HostedClusterRestoredFromBackup",
        "HostedClusterRestoredFromBackup",
    ),
    (
        "DataPlaneConnectionAvailable",
        "DataPlaneConnectionAvailable",
    ),
];

/// One condition before timestamps: what a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Check {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Check {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

pub use crate::hosted::facts::{HcCondition, HistoryEntry, HostedClusterFacts};

/// HyperShift's conditions under the names the product specs use.
pub fn mirror(hc: &HostedClusterFacts) -> Vec<Check> {
    MIRRORED
        .iter()
        .filter_map(|(from, to)| {
            let c = hc.condition(from)?;
            // Unknown is carried as False: a condition here is a yes or no.
            Some(Check {
                type_: to,
                status: c.status == "True",
                reason: if c.reason.is_empty() {
                    "Unknown".into()
                } else {
                    c.reason.clone()
                },
                message: c.message.clone(),
            })
        })
        .collect()
}

/// Available, as the adapter pattern defines it: the HostedCluster's
/// Available, and while it is not, whether it is still progressing.
pub fn available(hc: Option<&HostedClusterFacts>) -> Check {
    let Some(hc) = hc else {
        return Check::new(AVAILABLE, false, "Unknown", "no HostedCluster yet");
    };
    match hc.condition("Available") {
        Some(c) if c.status == "True" => Check::new(
            AVAILABLE,
            true,
            "ControlPlaneReady",
            "the control plane is ready and operational",
        ),
        Some(_) if hc.is("Progressing", "True") => Check::new(
            AVAILABLE,
            false,
            "Provisioning",
            "control plane provisioning in progress",
        ),
        Some(_) => Check::new(
            AVAILABLE,
            false,
            "NotReady",
            "the control plane is not ready",
        ),
        None => Check::new(
            AVAILABLE,
            false,
            "Unknown",
            "the control plane's status is not reported yet",
        ),
    }
}

/// Where a deletion has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cleanup {
    /// Waiting for `what` to go.
    InProgress {
        what: String,
    },
    /// Still there after the timeout of `seconds`.
    Failed {
        what: String,
        seconds: u64,
    },
    Succeeded,
}

pub fn cleanup_condition(c: &Cleanup) -> Check {
    match c {
        Cleanup::InProgress { what } => Check::new(
            CLEANUP,
            false,
            "InProgress",
            format!("waiting for {what} to be deleted"),
        ),
        Cleanup::Failed { what, seconds } => Check::new(
            CLEANUP,
            false,
            "Failed",
            format!("{what} is still there {seconds} s after the deletion started"),
        ),
        Cleanup::Succeeded => Check::new(
            CLEANUP,
            true,
            "Succeeded",
            "everything the provisioner made is deleted",
        ),
    }
}

/// Health: False when the control plane is degraded, when a deletion is
/// stuck, or when the operator hit an error it will not retry.
pub fn health(
    hc: Option<&HostedClusterFacts>,
    cleanup: Option<&Cleanup>,
    permanent_error: Option<&str>,
) -> Check {
    if let Some(Cleanup::Failed { what, seconds }) = cleanup {
        return Check::new(
            HEALTH,
            false,
            "DeletionStuck",
            format!(
                "{what} has not gone {seconds} s after the deletion started. Look at its finalizers and at the HyperShift operator's logs \
                 (kubectl -n hypershift logs deploy/operator); once it is gone the provisioner's deletion completes by itself. \
                 Removing its finalizers by hand leaves its control-plane namespace and cloud resources behind"
            ),
        );
    }
    if let Some(why) = permanent_error {
        return Check::new(HEALTH, false, "AdapterError", why);
    }
    if let Some(c) = hc
        .and_then(|h| h.condition("Degraded"))
        .filter(|c| c.status == "True")
    {
        return Check::new(
            HEALTH,
            false,
            "Degraded",
            format!("the control plane is degraded: {}", c.message),
        );
    }
    Check::new(HEALTH, true, "NoIssues", "no degradation detected")
}

/// How far the control plane is with the release the spec asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollout {
    /// The newest rollout completed, at the wanted release.
    Done,
    /// A release completed before, and the wanted one has not yet.
    Upgrading,
    /// Nothing has completed yet: the first install.
    Installing,
}

/// Where the rollout of `wanted_image` is. `was_upgrading` is whether the
/// provisioner last reported an upgrade in progress: an upgrade ends only
/// when the control plane completed the new release *and* the hosted
/// cluster's version stopped progressing (HyperShift's
/// `ClusterVersionProgressing`), as DPF's upgrade scripts expect. Outside
/// an upgrade that condition does not matter, so a first install is Ready
/// on the control plane alone and a later, unrelated progressing of the
/// hosted cluster's version does not look like an upgrade.
pub fn rollout(wanted_image: &str, hc: &HostedClusterFacts, was_upgrading: bool) -> Rollout {
    match hc.history.first() {
        Some(h) if h.state == "Completed" && h.image == wanted_image => {
            if was_upgrading && hc.is("ClusterVersionProgressing", "True") {
                Rollout::Upgrading
            } else {
                Rollout::Done
            }
        }
        _ if hc.history.iter().any(|h| h.state == "Completed") => Rollout::Upgrading,
        _ => Rollout::Installing,
    }
}

pub fn upgrading_condition(r: Rollout, wanted_image: &str, hc: &HostedClusterFacts) -> Check {
    match r {
        Rollout::Upgrading => {
            let from = hc
                .history
                .iter()
                .find(|h| h.state == "Completed" && h.image != wanted_image)
                .map_or("the previous release", |h| h.image.as_str());
            // One message for the whole upgrade: a change of message is an
            // event, and the upgrade starts once.
            Check::new(
                UPGRADING,
                true,
                "UpgradeInProgress",
                format!("Upgrade started: {from} → {wanted_image}"),
            )
        }
        Rollout::Done | Rollout::Installing => Check::new(
            UPGRADING,
            false,
            "UpgradeComplete",
            match hc.history.first() {
                Some(h)
                    if h.state == "Completed"
                        && hc.history.iter().filter(|e| e.state == "Completed").count() > 1 =>
                {
                    format!("HostedCluster upgrade to {} completed", h.image)
                }
                _ => "no upgrade in progress".to_string(),
            },
        ),
    }
}

/// The release the NodePool should run: the control plane goes first, so
/// the pool moves to a new release only once the control plane completed
/// it; a new pool starts at the wanted one.
pub fn node_pool_release(wanted_image: &str, r: Rollout, live_pool_image: Option<&str>) -> String {
    match (r, live_pool_image) {
        (Rollout::Done, _) | (_, None) => wanted_image.to_string(),
        (_, Some(live)) => live.to_string(),
    }
}

/// The state of the kubeconfig copy in the DPUCluster's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    Missing,
    Current,
    Stale,
}

/// What injection must do, from the copy's state and what
/// `DPUCluster.spec.kubeconfig` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    Nothing,
    Act {
        write_secret: bool,
        set_field: bool,
    },
    /// The field names another Secret, and it cannot change once set.
    Conflict(String),
}

pub fn injection(copy: Copy, field: Option<&str>, ours: &str) -> Injection {
    let field = field.filter(|f| !f.is_empty());
    match field {
        Some(other) if other != ours => Injection::Conflict(other.to_string()),
        Some(_) if copy == Copy::Current => Injection::Nothing,
        Some(_) => Injection::Act {
            write_secret: true,
            set_field: false,
        },
        None => Injection::Act {
            write_secret: copy != Copy::Current,
            set_field: true,
        },
    }
}

/// What a pass found and did, part by part: what status is made from.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub deleting: bool,
    /// Validation checks, in the order Ready looks at them.
    pub validations: Vec<Check>,
    /// `None` in NodePort mode, where MetalLB plays no part.
    pub metal_lb: Option<Check>,
    pub applied: Option<Check>,
    pub hosted_cluster: Option<HostedClusterFacts>,
    pub kubeconfig: Option<Check>,
    /// IgnitionConfigured, once there is a control plane to ask.
    pub ignition: Option<Check>,
    pub wanted_image: String,
    /// The provisioner last reported HostedClusterUpgrading=True.
    pub was_upgrading: bool,
    pub cleanup: Option<Cleanup>,
    pub permanent_error: Option<String>,
    /// Informational conditions (ProvisionerConfig).
    pub notes: Vec<Check>,
}

/// A validation check holds when its status is the good one: the two
/// "Missing"/"InUse" conditions are good when False.
pub fn holds(c: &Check) -> bool {
    match c.type_ {
        DPU_CLUSTER_MISSING | DPU_CLUSTER_IN_USE => !c.status,
        _ => c.status,
    }
}

fn failed_validation(o: &Outcome) -> Option<&Check> {
    o.validations.iter().find(|c| !holds(c))
}

fn kubeconfig_injected(o: &Outcome) -> bool {
    o.kubeconfig.as_ref().is_some_and(|c| c.status)
}

fn ignition_configured(o: &Outcome) -> bool {
    o.ignition.as_ref().is_some_and(|c| c.status)
}

/// An ignition that failed for a reason a retry will not change.
fn ignition_failed(o: &Outcome) -> bool {
    o.ignition.as_ref().is_some_and(|c| {
        !c.status
            && matches!(
                c.reason.as_str(),
                "IgnitionGenerationFailed" | "MachineOSURLMissing" | "DPUDeploymentRefMissing"
            )
    })
}

fn hc_available(o: &Outcome) -> bool {
    o.hosted_cluster
        .as_ref()
        .is_some_and(|h| h.is("Available", "True"))
}

/// Ready, checked in order: the first part that does not hold says why.
pub fn ready(o: &Outcome) -> Check {
    if o.deleting {
        return Check::new(READY, false, "Deleting", "the provisioner is being deleted");
    }
    if let Some(c) = failed_validation(o) {
        return Check::new(
            READY,
            false,
            "ValidationFailed",
            format!("{}: {}", c.type_, c.message),
        );
    }
    if let Some(a) = o.applied.as_ref().filter(|a| !a.status) {
        return Check::new(READY, false, "HostedClusterNotReady", a.message.clone());
    }
    if let Some(m) = o.metal_lb.as_ref().filter(|m| !m.status) {
        return Check::new(READY, false, "MetalLBNotConfigured", m.message.clone());
    }
    if !hc_available(o) {
        return Check::new(
            READY,
            false,
            "HostedClusterNotReady",
            "the HostedCluster is not available yet",
        );
    }
    if !kubeconfig_injected(o) {
        return Check::new(
            READY,
            false,
            "KubeConfigNotInjected",
            "the kubeconfig is not in the DPUCluster yet",
        );
    }
    if !ignition_configured(o) {
        return Check::new(
            READY,
            false,
            "IgnitionNotConfigured",
            o.ignition
                .as_ref()
                .map_or("the DPU ignition is not published yet".into(), |c| {
                    c.message.clone()
                }),
        );
    }
    let rolled_out = o
        .hosted_cluster
        .as_ref()
        .is_some_and(|h| rollout(&o.wanted_image, h, o.was_upgrading) == Rollout::Done);
    if !rolled_out {
        return Check::new(
            READY,
            false,
            "ControlPlaneProgressing",
            format!(
                "the control plane has not completed rolling out {}",
                o.wanted_image
            ),
        );
    }
    Check::new(
        READY,
        true,
        "AllComponentsOperational",
        "the hosted cluster is available and its kubeconfig is in the DPUCluster",
    )
}

/// The phase, first match wins.
pub fn phase(o: &Outcome, ready: &Check) -> Phase {
    if o.deleting {
        return Phase::Deleting;
    }
    let conflict = o
        .applied
        .as_ref()
        .is_some_and(|a| !a.status && a.reason == "Conflict");
    if failed_validation(o).is_some()
        || conflict
        || o.permanent_error.is_some()
        || ignition_failed(o)
    {
        return Phase::Failed;
    }
    if let Some(hc) = &o.hosted_cluster {
        let blocked = hc
            .condition("Progressing")
            .is_some_and(|c| c.status == "False" && c.reason == "Blocked");
        if blocked || hc.is("Degraded", "True") {
            return Phase::Error;
        }
    }
    if ready.status {
        return Phase::Ready;
    }
    let Some(hc) = &o.hosted_cluster else {
        return Phase::Pending;
    };
    // Only the rollout is left when the rest holds: a first install is
    // the version progressing, an upgrade waits for the control plane.
    let metal_lb_ok = o.metal_lb.as_ref().is_none_or(|m| m.status);
    if metal_lb_ok
        && hc_available(o)
        && kubeconfig_injected(o)
        && ignition_configured(o)
        && rollout(&o.wanted_image, hc, o.was_upgrading) == Rollout::Installing
    {
        return Phase::ClusterVersionProgressing;
    }
    // An upgrade waits for the control plane before the ignition is made
    // again; a first install makes it as soon as the cluster is up.
    if hc_available(o)
        && kubeconfig_injected(o)
        && !ignition_configured(o)
        && rollout(&o.wanted_image, hc, o.was_upgrading) != Rollout::Upgrading
    {
        return Phase::GeneratingIgnition;
    }
    Phase::WaitingForControlPlane
}

/// Every condition of the status, in a stable order.
pub fn checks(o: &Outcome) -> Vec<Check> {
    let mut out = Vec::new();
    out.extend(o.notes.iter().cloned());
    out.extend(o.validations.iter().cloned());
    out.extend(o.metal_lb.iter().cloned());
    out.extend(o.kubeconfig.iter().cloned());
    out.extend(o.ignition.iter().cloned());
    if let Some(hc) = &o.hosted_cluster {
        out.extend(mirror(hc));
        out.push(upgrading_condition(
            rollout(&o.wanted_image, hc, o.was_upgrading),
            &o.wanted_image,
            hc,
        ));
    }
    out.extend(o.cleanup.iter().map(cleanup_condition));
    let applied = match &o.applied {
        Some(a) => a.clone(),
        None if o.deleting => Check::new(
            APPLIED,
            false,
            "Deleting",
            "the provisioner is being deleted",
        ),
        None => Check::new(
            APPLIED,
            false,
            "NotApplied",
            "the HostedCluster is not applied until every check passes",
        ),
    };
    out.push(applied);
    out.push(available(o.hosted_cluster.as_ref()));
    out.push(health(
        o.hosted_cluster.as_ref(),
        o.cleanup.as_ref(),
        o.permanent_error.as_deref(),
    ));
    out.push(ready(o));
    out
}

/// CSRAutoApprovalActive, from what the approver recorded in the status
/// (it writes `status.csrApproval`; the conditions list is written here
/// alone, so two writers never replace each other's entries).
pub fn csr_approval_condition(record: Option<&super::crd::CsrApprovalStatus>) -> Vec<Check> {
    let Some(r) = record else {
        return Vec::new();
    };
    vec![
        Check::new(
            CSR_AUTO_APPROVAL_ACTIVE,
            r.active,
            &r.reason,
            r.message.clone(),
        ),
        join_blocked_condition(&r.blocked_joins),
    ]
}

/// DPUJoinBlocked: DPUs denied a bootstrap certificate because a Node of
/// their name is still in the hosted cluster. The denial stands (a Node
/// that exists is never handed to whoever holds a bootstrap token); the
/// condition names each Node and what to do.
pub fn join_blocked_condition(blocked: &[super::crd::BlockedJoin]) -> Check {
    if blocked.is_empty() {
        return Check::new(
            DPU_JOIN_BLOCKED,
            false,
            "NoStaleNodes",
            "no DPU is kept from joining by an old Node",
        );
    }
    let nodes: Vec<&str> = blocked.iter().map(|b| b.node.as_str()).collect();
    let list = nodes.join(" ");
    Check::new(
        DPU_JOIN_BLOCKED,
        true,
        "StaleNode",
        format!(
            "Node {} still exists in the hosted cluster while a DPU of that name asks to join again, so its bootstrap CSRs are denied (NodeExists; status.csrApproval.blockedJoins names the newest). If the DPU was re-provisioned, delete the old Node in the hosted cluster: kubectl --kubeconfig <the hosted cluster's admin kubeconfig> delete node {list}. DPF deletes the Node itself when the DPU object is deleted; one left behind means the DPU was re-installed without that, or the deletion failed.",
            nodes.join(", "),
        ),
    )
}

/// Conditions with their transition times: kept while the status holds,
/// `now` when it changes.
pub fn conditions(
    prev: &[Condition],
    checks: &[Check],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    checks
        .iter()
        .map(|c| {
            conditions::condition(
                prev,
                c.type_,
                c.status,
                &c.reason,
                c.message.clone(),
                generation,
                now,
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hc(conditions: &[(&str, &str, &str)], history: &[(&str, &str)]) -> HostedClusterFacts {
        HostedClusterFacts {
            conditions: conditions
                .iter()
                .map(|(t, s, r)| HcCondition {
                    type_: t.to_string(),
                    status: s.to_string(),
                    reason: r.to_string(),
                    message: format!("{t} says {s}"),
                })
                .collect(),
            history: history
                .iter()
                .map(|(state, image)| HistoryEntry {
                    state: state.to_string(),
                    image: image.to_string(),
                    version: format!("v-{image}"),
                })
                .collect(),
            ..HostedClusterFacts::default()
        }
    }

    fn good() -> Outcome {
        Outcome {
            validations: vec![
                Check::new(DPU_CLUSTER_MISSING, false, "DPUClusterFound", ""),
                Check::new(SECRETS_VALID, true, "SecretsValid", ""),
            ],
            metal_lb: Some(Check::new(METALLB_CONFIGURED, true, "MetalLBReady", "")),
            applied: Some(Check::new(APPLIED, true, "HostedClusterApplied", "")),
            hosted_cluster: Some(hc(
                &[("Available", "True", "AsExpected")],
                &[("Completed", "img:1")],
            )),
            kubeconfig: Some(Check::new(KUBECONFIG_INJECTED, true, "Injected", "")),
            ignition: Some(Check::new(
                IGNITION_CONFIGURED,
                true,
                "IgnitionGenerated",
                "",
            )),
            wanted_image: "img:1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn ready_is_checked_in_order_and_the_first_failure_says_why() {
        let r = ready(&good());
        assert!(r.status);
        assert_eq!(r.reason, "AllComponentsOperational");
        assert_eq!(phase(&good(), &r), Phase::Ready);

        type Step = fn(&mut Outcome);
        let cases: [(Step, &str, Phase); 11] = [
            (
                |o| o.validations[0].status = true,
                "ValidationFailed",
                Phase::Failed,
            ),
            (
                |o| o.validations[1].status = false,
                "ValidationFailed",
                Phase::Failed,
            ),
            (
                |o| o.metal_lb.as_mut().unwrap().status = false,
                "MetalLBNotConfigured",
                Phase::WaitingForControlPlane,
            ),
            (
                |o| {
                    o.hosted_cluster = Some(hc(
                        &[("Available", "False", "X"), ("Progressing", "True", "")],
                        &[],
                    ))
                },
                "HostedClusterNotReady",
                Phase::WaitingForControlPlane,
            ),
            (
                |o| {
                    o.kubeconfig = Some(Check::new(
                        KUBECONFIG_INJECTED,
                        false,
                        "KubeconfigPending",
                        "",
                    ))
                },
                "KubeConfigNotInjected",
                Phase::WaitingForControlPlane,
            ),
            (
                |o| {
                    o.ignition = Some(Check::new(
                        IGNITION_CONFIGURED,
                        false,
                        "ConfigMapDeleted",
                        "",
                    ))
                },
                "IgnitionNotConfigured",
                Phase::GeneratingIgnition,
            ),
            (
                |o| {
                    o.ignition = Some(Check::new(
                        IGNITION_CONFIGURED,
                        false,
                        "IgnitionGenerationFailed",
                        "",
                    ))
                },
                "IgnitionNotConfigured",
                Phase::Failed,
            ),
            (
                |o| {
                    o.ignition = Some(Check::new(
                        IGNITION_CONFIGURED,
                        false,
                        "DPUDeploymentRefMissing",
                        "",
                    ))
                },
                "IgnitionNotConfigured",
                Phase::Failed,
            ),
            (
                |o| {
                    o.ignition = Some(Check::new(
                        IGNITION_CONFIGURED,
                        false,
                        "DPUFlavorChanged",
                        "",
                    ))
                },
                "IgnitionNotConfigured",
                Phase::GeneratingIgnition,
            ),
            (
                |o| o.hosted_cluster.as_mut().unwrap().history = vec![],
                "ControlPlaneProgressing",
                Phase::ClusterVersionProgressing,
            ),
            (
                |o| o.wanted_image = "img:2".into(),
                "ControlPlaneProgressing",
                Phase::WaitingForControlPlane,
            ),
        ];
        for (break_it, reason, want_phase) in cases {
            let mut o = good();
            break_it(&mut o);
            let r = ready(&o);
            assert!(!r.status);
            assert_eq!(r.reason, reason);
            assert_eq!(phase(&o, &r), want_phase, "{reason}");
        }
        // Two broken parts: the earlier one is reported.
        let mut o = good();
        o.metal_lb.as_mut().unwrap().status = false;
        o.kubeconfig = None;
        assert_eq!(ready(&o).reason, "MetalLBNotConfigured");
    }

    #[test]
    fn phases_for_deletion_errors_and_the_start() {
        let mut o = good();
        o.deleting = true;
        assert_eq!(phase(&o, &ready(&o)), Phase::Deleting);
        let mut o = good();
        o.hosted_cluster = Some(hc(
            &[("Available", "True", ""), ("Degraded", "True", "")],
            &[("Completed", "img:1")],
        ));
        assert_eq!(phase(&o, &ready(&o)), Phase::Error);
        o.hosted_cluster = Some(hc(&[("Progressing", "False", "Blocked")], &[]));
        assert_eq!(phase(&o, &ready(&o)), Phase::Error);
        let mut o = good();
        o.hosted_cluster = None;
        o.applied = None;
        assert_eq!(phase(&o, &ready(&o)), Phase::Pending);
        let mut o = good();
        o.applied = Some(Check::new(APPLIED, false, "Conflict", "not ours"));
        assert_eq!(phase(&o, &ready(&o)), Phase::Failed);
        let mut o = good();
        o.permanent_error = Some("forbidden".into());
        assert_eq!(phase(&o, &ready(&o)), Phase::Failed);
    }

    #[test]
    fn every_phase_maps_onto_the_five_summary_phases() {
        use Phase::*;
        let all = [
            Pending,
            WaitingForControlPlane,
            GeneratingIgnition,
            ClusterVersionProgressing,
            Ready,
            Failed,
            Error,
            Deleting,
        ];
        let summaries: Vec<&str> = all.iter().map(|p| p.summary()).collect();
        assert_eq!(
            summaries,
            [
                "Pending",
                "Provisioning",
                "Provisioning",
                "Provisioning",
                "Ready",
                "Failed",
                "Failed",
                "Deleting"
            ]
        );
    }

    #[test]
    fn summary_conditions_follow_the_adapter_semantics() {
        assert_eq!(available(None).reason, "Unknown");
        let progressing = hc(
            &[("Available", "False", ""), ("Progressing", "True", "")],
            &[],
        );
        assert_eq!(available(Some(&progressing)).reason, "Provisioning");
        let stalled = hc(&[("Available", "False", "")], &[]);
        assert_eq!(available(Some(&stalled)).reason, "NotReady");
        let up = hc(&[("Available", "True", "")], &[]);
        assert!(available(Some(&up)).status);

        assert!(health(Some(&up), None, None).status);
        let degraded = hc(&[("Degraded", "True", "")], &[]);
        let h = health(Some(&degraded), None, None);
        assert_eq!((h.status, h.reason.as_str()), (false, "Degraded"));
        assert!(h.message.contains("Degraded says True"));
        let stuck = Cleanup::Failed {
            what: "HostedCluster ns/x".into(),
            seconds: 1800,
        };
        let h = health(Some(&up), Some(&stuck), None);
        assert_eq!(h.reason, "DeletionStuck");
        assert!(
            h.message.contains("finalizers"),
            "remediation text: {}",
            h.message
        );
        assert_eq!(health(None, None, Some("403")).reason, "AdapterError");
    }

    #[test]
    fn hyper_shift_conditions_are_mirrored_under_the_seed_names() {
        let facts = hc(
            &[
                ("Available", "True", "AsExpected"),
                ("Degraded", "False", "AsExpected"),
                ("EtcdAvailable", "True", "QuorumAvailable"),
                ("SomethingElse", "True", ""),
            ],
            &[],
        );
        let m = mirror(&facts);
        let names: Vec<&str> = m.iter().map(|c| c.type_).collect();
        assert_eq!(
            names,
            [
                "HostedClusterAvailable",
                "HostedClusterDegraded",
                "EtcdAvailable"
            ]
        );
        assert_eq!(m[2].reason, "QuorumAvailable");
        assert_eq!(m[0].message, "Available says True");
    }

    #[test]
    fn facts_are_read_from_a_hosted_cluster_object_and_junk_is_ignored() {
        let obj = json!({
            "spec": {"release": {"image": "img:2"}},
            "status": {
                "conditions": [{"type": "Available", "status": "True", "reason": "AsExpected", "message": "ok"}, {"status": "True"}, 7],
                "controlPlaneVersion": {"history": [{"state": "Partial", "image": "img:2", "version": "4.20.0"}, {"state": "Completed", "image": "img:1", "version": "4.19.0"}]},
                "controlPlaneEndpoint": {"host": "192.168.1.100", "port": 6443},
            }
        });
        let f = HostedClusterFacts::from_object(&obj);
        assert_eq!(f.conditions.len(), 1);
        assert_eq!(f.endpoint.as_deref(), Some("https://192.168.1.100:6443"));
        assert_eq!(f.version().as_deref(), Some("4.19.0"));
        assert_eq!(f.release_image.as_deref(), Some("img:2"));
        assert_eq!(rollout("img:2", &f, false), Rollout::Upgrading);
        assert_eq!(rollout("img:1", &f, false), Rollout::Upgrading);
        let junk = HostedClusterFacts::from_object(
            &json!({"status": {"conditions": "no", "controlPlaneEndpoint": {"host": "fd00::1", "port": 6443}}}),
        );
        assert!(junk.conditions.is_empty());
        assert_eq!(junk.endpoint.as_deref(), Some("https://[fd00::1]:6443"));
    }

    #[test]
    fn the_node_pool_follows_the_control_plane() {
        let installing = hc(&[], &[("Partial", "img:1")]);
        assert_eq!(rollout("img:1", &installing, false), Rollout::Installing);
        assert_eq!(
            node_pool_release("img:1", Rollout::Installing, None),
            "img:1"
        );
        assert_eq!(
            node_pool_release("img:2", Rollout::Upgrading, Some("img:1")),
            "img:1"
        );
        assert_eq!(
            node_pool_release("img:2", Rollout::Done, Some("img:1")),
            "img:2"
        );
        let rolling = hc(&[], &[("Partial", "img:2"), ("Completed", "img:1")]);
        let c = upgrading_condition(Rollout::Upgrading, "img:2", &rolling);
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            (true, "UpgradeInProgress", "Upgrade started: img:1 → img:2")
        );
        let done = hc(&[], &[("Completed", "img:2"), ("Completed", "img:1")]);
        let c = upgrading_condition(Rollout::Done, "img:2", &done);
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            (
                false,
                "UpgradeComplete",
                "HostedCluster upgrade to img:2 completed"
            )
        );
        let fresh = hc(&[], &[("Completed", "img:1")]);
        assert_eq!(
            upgrading_condition(Rollout::Done, "img:1", &fresh).message,
            "no upgrade in progress",
            "a first install is no upgrade"
        );
    }

    #[test]
    fn an_upgrade_ends_when_the_hosted_cluster_version_stops_progressing() {
        let cvp = |on: &str| {
            hc(
                &[
                    ("Available", "True", "AsExpected"),
                    ("ClusterVersionProgressing", on, "AsExpected"),
                ],
                &[("Completed", "img:2"), ("Completed", "img:1")],
            )
        };
        // Mid-upgrade, the control plane done, the version still progressing.
        assert_eq!(rollout("img:2", &cvp("True"), true), Rollout::Upgrading);
        assert_eq!(rollout("img:2", &cvp("False"), true), Rollout::Done);
        // Not in an upgrade: the version progressing later is no upgrade,
        // and a first install is Ready on the control plane alone.
        assert_eq!(rollout("img:2", &cvp("True"), false), Rollout::Done);
        let first = hc(
            &[("ClusterVersionProgressing", "True", "AsExpected")],
            &[("Completed", "img:1")],
        );
        assert_eq!(rollout("img:1", &first, false), Rollout::Done);
        // The phase and Ready hold back while the version progresses.
        let mut o = good();
        o.wanted_image = "img:2".into();
        o.was_upgrading = true;
        o.hosted_cluster = Some(cvp("True"));
        let r = ready(&o);
        assert_eq!(
            (r.status, r.reason.as_str()),
            (false, "ControlPlaneProgressing")
        );
        assert_eq!(phase(&o, &r), Phase::WaitingForControlPlane);
        o.hosted_cluster = Some(cvp("False"));
        assert!(ready(&o).status);
    }

    #[test]
    fn kubeconfig_injection_follows_the_idempotency_table() {
        let ours = "p-admin-kubeconfig";
        let act = |w, s| Injection::Act {
            write_secret: w,
            set_field: s,
        };
        assert_eq!(
            injection(Copy::Current, Some(ours), ours),
            Injection::Nothing
        );
        assert_eq!(injection(Copy::Stale, Some(ours), ours), act(true, false));
        assert_eq!(injection(Copy::Current, None, ours), act(false, true));
        assert_eq!(injection(Copy::Stale, Some(""), ours), act(true, true));
        assert_eq!(injection(Copy::Missing, Some(ours), ours), act(true, false));
        assert_eq!(injection(Copy::Missing, None, ours), act(true, true));
        assert_eq!(
            injection(Copy::Current, Some("other"), ours),
            Injection::Conflict("other".into())
        );
    }

    #[test]
    fn transition_times_move_only_with_the_status() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let first = conditions(&[], &[Check::new(READY, false, "A", "")], Some(1), &t0);
        let same = conditions(&first, &[Check::new(READY, false, "B", "")], Some(2), &t1);
        assert_eq!(same[0].last_transition_time, t0);
        let flipped = conditions(&same, &[Check::new(READY, true, "C", "")], Some(2), &t1);
        assert_eq!(flipped[0].last_transition_time, t1);
    }

    #[test]
    fn a_stale_node_is_named_with_its_remedy_and_clears() {
        use super::super::crd::{BlockedJoin, CsrApprovalStatus};
        let mut record = CsrApprovalStatus {
            active: true,
            reason: "Active".into(),
            ..Default::default()
        };
        let checks = csr_approval_condition(Some(&record));
        assert_eq!(
            checks
                .iter()
                .map(|c| (c.type_, c.status, c.reason.as_str()))
                .collect::<Vec<_>>(),
            [
                (CSR_AUTO_APPROVAL_ACTIVE, true, "Active"),
                (DPU_JOIN_BLOCKED, false, "NoStaleNodes"),
            ]
        );
        record.blocked_joins.push(BlockedJoin {
            node: "dpu-7".into(),
            csr_name: "csr-abc".into(),
            since: "2026-11-26T10:00:00Z".into(),
        });
        let blocked = &csr_approval_condition(Some(&record))[1];
        assert_eq!(
            (blocked.status, blocked.reason.as_str()),
            (true, "StaleNode")
        );
        assert!(
            blocked.message.contains("Node dpu-7 still exists")
                && blocked.message.contains("delete node dpu-7"),
            "{}",
            blocked.message
        );
        assert!(csr_approval_condition(None).is_empty());
    }
}
