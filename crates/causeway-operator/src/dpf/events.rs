//! Which events a status change is worth. Users of the Go operator watch a
//! provisioner with `kubectl get events --field-selector
//! involvedObject.name=<name>`; the reasons and types they see there are
//! kept: a condition that changes (status, reason or message) gives the
//! event its new value stands for, as the Go operator emits on change.
//! Events that mark an action rather than a state (a template published, a
//! Secret rewritten, a clean-up step done) are published where the action
//! happens. Pure: the caller publishes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::status;

/// An event to publish about the provisioner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Note {
    pub fn normal(reason: &str, message: impl Into<String>) -> Self {
        Note {
            warning: false,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn warning(reason: &str, message: impl Into<String>) -> Self {
        Note {
            warning: true,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The event a condition's new value stands for, if any. `before` is the
/// condition as it was, when there was one.
fn note_for(before: Option<&Condition>, now: &Condition) -> Option<Note> {
    let on = now.status == "True";
    let reason = now.reason.as_str();
    let message = now.message.clone();
    let same_reason = |good: bool| {
        Some(if good {
            Note::normal(reason, message.clone())
        } else {
            Note::warning(reason, message.clone())
        })
    };
    match now.type_.as_str() {
        // Good when False.
        status::DPU_CLUSTER_MISSING | status::DPU_CLUSTER_IN_USE => same_reason(!on),
        status::CLUSTER_TYPE_VALID | status::SECRETS_VALID => same_reason(on),
        // A skipped lookup is no news.
        status::BLUEFIELD_IMAGE_FOUND if reason == "LookupSkipped" => None,
        status::BLUEFIELD_IMAGE_FOUND => same_reason(on),
        status::METALLB_CONFIGURED if on => Some(Note::normal("MetalLBConfigured", message)),
        status::METALLB_CONFIGURED => Some(Note::warning("MetalLBConfigurationFailed", message)),
        status::KUBECONFIG_INJECTED => same_reason(on),
        status::CSR_AUTO_APPROVAL_ACTIVE => same_reason(on),
        status::DPU_JOIN_BLOCKED if on => Some(Note::warning(reason, message)),
        status::DPU_JOIN_BLOCKED => before
            .filter(|b| b.status == "True")
            .map(|_| Note::normal("StaleNodeCleared", message)),
        status::UPGRADING if on => Some(Note::normal("UpgradeInProgress", message)),
        // Completion is news only after an upgrade, not on a first install.
        status::UPGRADING => before
            .filter(|b| b.status == "True")
            .map(|_| Note::normal("UpgradeComplete", message)),
        status::IGNITION_CONFIGURED if !on && reason == "DependencyDeleted" => {
            Some(Note::warning(reason, message))
        }
        _ => None,
    }
}

/// The events a status change is worth, in the order of `next`.
pub fn condition_notes(previous: &[Condition], next: &[Condition]) -> Vec<Note> {
    next.iter()
        .filter_map(|now| {
            let before = previous.iter().find(|c| c.type_ == now.type_);
            let changed = before.is_none_or(|b| {
                (b.status.as_str(), b.reason.as_str(), b.message.as_str())
                    != (
                        now.status.as_str(),
                        now.reason.as_str(),
                        now.message.as_str(),
                    )
            });
            if changed {
                note_for(before, now)
            } else {
                None
            }
        })
        .collect()
}

/// The event for why a published template is made again, announced
/// before it is: `why` is the IgnitionConfigured reason the staleness check
/// gave, `was_configured` whether a template had been published. A first
/// publication has no news but its success.
pub fn regeneration_note(why: &str, was_configured: bool) -> Option<Note> {
    match why {
        "ConfigMapDeleted" if was_configured => Some(Note::warning(
            "IgnitionConfigMapDeleted",
            "Ignition ConfigMap was deleted, will regenerate",
        )),
        "OperatorRestarted" => Some(Note::normal(
            "IgnitionRegeneration",
            "Operator restarted, regenerating ignition to apply any updates",
        )),
        "DPUDeploymentChanged" => Some(Note::normal(
            "DPUDeploymentChanged",
            "DPUDeployment changed, triggering ignition regeneration",
        )),
        "SecretsChanged" => Some(Note::normal(
            "SecretsChanged",
            "Pull secret or SSH key changed, triggering ignition regeneration",
        )),
        // causeway's own: the Go operator does not act on a flavor edit.
        "DPUFlavorChanged" => Some(Note::normal(
            "DPUFlavorChanged",
            "DPUFlavor content or the high-speed MTU changed, triggering ignition regeneration",
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn c(type_: &str, on: bool, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: if on { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn reasons(notes: &[Note]) -> Vec<(bool, &str)> {
        notes
            .iter()
            .map(|n| (n.warning, n.reason.as_str()))
            .collect()
    }

    #[test]
    fn a_first_pass_announces_what_it_found() {
        let next = [
            c(
                status::DPU_CLUSTER_MISSING,
                false,
                "DPUClusterFound",
                "found",
            ),
            c(
                status::CLUSTER_TYPE_VALID,
                true,
                "ClusterTypeValid",
                "static",
            ),
            c(
                status::DPU_CLUSTER_IN_USE,
                false,
                "DPUClusterAvailable",
                "free",
            ),
            c(status::SECRETS_VALID, true, "SecretsValid", "both"),
            c(status::BLUEFIELD_IMAGE_FOUND, true, "ImageFound", "img"),
            c(
                status::METALLB_CONFIGURED,
                false,
                "MetalLBNotInstalled",
                "no CRDs",
            ),
            c(
                status::KUBECONFIG_INJECTED,
                false,
                "KubeconfigPending",
                "waiting",
            ),
            c(status::UPGRADING, false, "UpgradeComplete", "none"),
            c(status::READY, false, "HostedClusterNotReady", "not yet"),
        ];
        assert_eq!(
            reasons(&condition_notes(&[], &next)),
            [
                (false, "DPUClusterFound"),
                (false, "ClusterTypeValid"),
                (false, "DPUClusterAvailable"),
                (false, "SecretsValid"),
                (false, "ImageFound"),
                (true, "MetalLBConfigurationFailed"),
                (true, "KubeconfigPending"),
            ],
            "no UpgradeComplete on a first install, nothing for Ready"
        );
    }

    #[test]
    fn only_a_change_is_news() {
        let before = [
            c(status::SECRETS_VALID, true, "SecretsValid", "both"),
            c(
                status::METALLB_CONFIGURED,
                false,
                "MetalLBNotInstalled",
                "no CRDs",
            ),
            c(
                status::DPU_CLUSTER_MISSING,
                false,
                "DPUClusterFound",
                "found",
            ),
        ];
        assert!(condition_notes(&before, &before).is_empty());
        let after = [
            c(
                status::SECRETS_VALID,
                false,
                "PullSecretInvalid",
                "no auths",
            ),
            c(
                status::METALLB_CONFIGURED,
                true,
                "MetalLBReady",
                "announced",
            ),
            c(
                status::DPU_CLUSTER_MISSING,
                true,
                "DPUClusterDeleted",
                "gone",
            ),
        ];
        let notes = condition_notes(&before, &after);
        assert_eq!(
            reasons(&notes),
            [
                (true, "PullSecretInvalid"),
                (false, "MetalLBConfigured"),
                (true, "DPUClusterDeleted"),
            ]
        );
        assert_eq!(notes[1].message, "announced");
        // The message alone changing is a change, as the Go operator counts it.
        let reworded = [c(
            status::SECRETS_VALID,
            true,
            "SecretsValid",
            "both, again",
        )];
        assert_eq!(
            reasons(&condition_notes(&before, &reworded)),
            [(false, "SecretsValid")]
        );
    }

    #[test]
    fn an_upgrade_starts_and_completes_once_each() {
        let idle = [c(status::UPGRADING, false, "UpgradeComplete", "none")];
        let rolling = [c(
            status::UPGRADING,
            true,
            "UpgradeInProgress",
            "Upgrade started: a → b",
        )];
        let done = [c(status::UPGRADING, false, "UpgradeComplete", "none")];
        let start = condition_notes(&idle, &rolling);
        assert_eq!(reasons(&start), [(false, "UpgradeInProgress")]);
        assert_eq!(start[0].message, "Upgrade started: a → b");
        assert!(condition_notes(&rolling, &rolling).is_empty());
        assert_eq!(
            reasons(&condition_notes(&rolling, &done)),
            [(false, "UpgradeComplete")]
        );
    }

    #[test]
    fn a_skipped_lookup_and_the_approver_are_reported_as_the_go_operator_does() {
        let skipped = [c(
            status::BLUEFIELD_IMAGE_FOUND,
            true,
            "LookupSkipped",
            "machineOSURL",
        )];
        assert!(condition_notes(&[], &skipped).is_empty());
        let missing = [c(
            status::BLUEFIELD_IMAGE_FOUND,
            false,
            "VersionNotFound",
            "4.99",
        )];
        assert_eq!(
            reasons(&condition_notes(&skipped, &missing)),
            [(true, "VersionNotFound")]
        );
        let down = [c(
            status::CSR_AUTO_APPROVAL_ACTIVE,
            false,
            "HostedClusterNotReachable",
            "refused",
        )];
        let up = [c(
            status::CSR_AUTO_APPROVAL_ACTIVE,
            true,
            "Active",
            "running",
        )];
        assert_eq!(reasons(&condition_notes(&down, &up)), [(false, "Active")]);
        assert_eq!(
            reasons(&condition_notes(&up, &down)),
            [(true, "HostedClusterNotReachable")]
        );
    }

    #[test]
    fn a_template_made_again_says_why_once_it_had_been_published() {
        let reason = |why, was| regeneration_note(why, was).map(|n| (n.warning, n.reason));
        assert_eq!(
            reason("ConfigMapDeleted", false),
            None,
            "a first publication"
        );
        assert_eq!(
            reason("ConfigMapDeleted", true),
            Some((true, "IgnitionConfigMapDeleted".to_string()))
        );
        assert_eq!(
            reason("OperatorRestarted", true),
            Some((false, "IgnitionRegeneration".to_string()))
        );
        assert_eq!(
            reason("DPUDeploymentChanged", true),
            Some((false, "DPUDeploymentChanged".to_string()))
        );
        assert_eq!(
            reason("DPUFlavorChanged", true),
            Some((false, "DPUFlavorChanged".to_string()))
        );
        assert_eq!(reason("MachineOSURLChanged", true), None);
    }
}
