//! The Infra's status conditions, computed from what one reconcile saw.
//! Pure; a condition keeps its `lastTransitionTime` while its status does
//! not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::crd::ReplicaStatus;
use super::plan::Component;
use crate::k8s::conditions::condition;

/// How one component stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentState {
    Disabled,
    Ready,
    /// Two replicas, one of them serving and no standby: ready, as the
    /// service answers, but a fault away from down.
    Degraded(String),
    /// Why not, for the condition's message.
    NotReady(String),
}

/// What a reconcile found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `Err` holds every validation message.
    pub valid: Result<(), Vec<String>>,
    /// Whether the NetworkAttachmentDefinition is there (`Err` says why
    /// not); `None` when not looked at, for an invalid spec.
    pub network_attachment: Option<Result<(), String>>,
    pub warnings: Vec<String>,
    pub components: Vec<(Component, ComponentState)>,
    /// Components with two replicas: for `status.componentStatus`.
    pub replicas: Vec<(Component, ReplicaStatus)>,
    pub attachments: AttachmentsSeen,
    /// Where the proxy's control-plane policies are now.
    pub control_plane_namespaces: Vec<String>,
}

/// What the Infra's status says of its attachments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachmentsSeen {
    pub total: i32,
    pub served: i32,
    /// (reason, message) per conflict, sorted.
    pub conflicts: Vec<(&'static str, String)>,
}

impl AttachmentsSeen {
    pub fn of(a: &super::attachment::Aggregate) -> Self {
        AttachmentsSeen {
            total: i32::try_from(a.verdicts.len()).unwrap_or(i32::MAX),
            served: i32::try_from(a.served.len()).unwrap_or(i32::MAX),
            conflicts: a.conflicts(),
        }
    }
}

pub const READY: &str = "Ready";
pub const VALID: &str = "Valid";
pub const NETWORK_ATTACHMENT: &str = "NetworkAttachment";
pub const IGNORED_FIELDS: &str = "IgnoredFields";
/// Whether every InfraClusterAttachment naming the Infra is served; only
/// while there are any.
pub const ATTACHMENTS: &str = "Attachments";
/// The reason of a component condition, and of `Ready`, while a component
/// with two replicas serves from one.
pub const DEGRADED: &str = "Degraded";

pub fn condition_type(component: Component) -> &'static str {
    match component {
        Component::Dhcp => "DHCPReady",
        Component::Dns => "DNSReady",
        Component::Proxy => "ProxyReady",
    }
}

pub fn conditions(
    prev: &[Condition],
    observed: &Observed,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut out = Vec::new();
    let valid = observed.valid.is_ok();
    out.push(match &observed.valid {
        Ok(()) => condition(
            prev,
            VALID,
            true,
            "Valid",
            "the spec is valid".into(),
            generation,
            now,
        ),
        Err(errors) => condition(
            prev,
            VALID,
            false,
            "Invalid",
            errors.join("; "),
            generation,
            now,
        ),
    });
    match &observed.network_attachment {
        Some(Ok(())) => out.push(condition(
            prev,
            NETWORK_ATTACHMENT,
            true,
            "Found",
            "the NetworkAttachmentDefinition is there".into(),
            generation,
            now,
        )),
        Some(Err(why)) => out.push(condition(
            prev,
            NETWORK_ATTACHMENT,
            false,
            "NotFound",
            why.clone(),
            generation,
            now,
        )),
        None => {}
    }
    let attachment_missing = matches!(observed.network_attachment, Some(Err(_)));
    let mut not_ready = Vec::new();
    let mut degraded = Vec::new();
    for (component, state) in &observed.components {
        let t = condition_type(*component);
        out.push(match state {
            ComponentState::Disabled => condition(
                prev,
                t,
                true,
                "Disabled",
                format!("{} is disabled", component.name()),
                generation,
                now,
            ),
            ComponentState::Ready => condition(
                prev,
                t,
                true,
                "Ready",
                if observed.replicas.iter().any(|(c, _)| c == component) {
                    format!("both {} replicas are ready", component.name())
                } else {
                    format!("the {} pod is ready", component.name())
                },
                generation,
                now,
            ),
            ComponentState::Degraded(why) => {
                degraded.push(component.name());
                condition(prev, t, true, DEGRADED, why.clone(), generation, now)
            }
            ComponentState::NotReady(why) => {
                not_ready.push(component.name());
                condition(prev, t, false, "NotReady", why.clone(), generation, now)
            }
        });
    }
    out.push(if !valid {
        condition(
            prev,
            READY,
            false,
            "Invalid",
            "the spec is invalid; see the Valid condition".into(),
            generation,
            now,
        )
    } else if attachment_missing {
        condition(
            prev,
            READY,
            false,
            "NetworkAttachmentMissing",
            "the NetworkAttachmentDefinition is missing; see the NetworkAttachment condition"
                .into(),
            generation,
            now,
        )
    } else if not_ready.is_empty() && degraded.is_empty() {
        condition(
            prev,
            READY,
            true,
            "Ready",
            "every enabled component is ready".into(),
            generation,
            now,
        )
    } else if not_ready.is_empty() {
        condition(
            prev,
            READY,
            true,
            DEGRADED,
            format!(
                "every enabled component serves; without a standby: {}",
                degraded.join(", ")
            ),
            generation,
            now,
        )
    } else {
        condition(
            prev,
            READY,
            false,
            "ComponentsNotReady",
            format!("not ready: {}", not_ready.join(", ")),
            generation,
            now,
        )
    });
    let seen = &observed.attachments;
    if seen.total > 0 {
        // Its own condition, not Ready's: a conflict between two
        // attachments leaves the stack serving every other one.
        out.push(match seen.conflicts.first() {
            None => condition(
                prev,
                ATTACHMENTS,
                true,
                "Served",
                format!("{} of {} attachments served", seen.served, seen.total),
                generation,
                now,
            ),
            Some((reason, _)) => condition(
                prev,
                ATTACHMENTS,
                false,
                reason,
                format!(
                    "{} of {} attachments served; {}",
                    seen.served,
                    seen.total,
                    seen.conflicts
                        .iter()
                        .map(|(_, m)| m.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                generation,
                now,
            ),
        });
    }
    if !observed.warnings.is_empty() {
        out.push(condition(
            prev,
            IGNORED_FIELDS,
            true,
            "Ignored",
            observed.warnings.join("; "),
            generation,
            now,
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn observed(dns: ComponentState) -> Observed {
        Observed {
            valid: Ok(()),
            network_attachment: Some(Ok(())),
            warnings: vec![],
            components: vec![
                (Component::Dhcp, ComponentState::Ready),
                (Component::Dns, dns),
                (Component::Proxy, ComponentState::Disabled),
            ],
            replicas: vec![],
            attachments: AttachmentsSeen::default(),
            control_plane_namespaces: vec![],
        }
    }

    fn find<'a>(c: &'a [Condition], t: &str) -> &'a Condition {
        c.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn ready_needs_every_enabled_component() {
        let now = at("2026-11-22T10:00:00Z");
        let c = conditions(
            &[],
            &observed(ComponentState::NotReady("0 of 1 pods ready".into())),
            Some(3),
            &now,
        );
        let ready = find(&c, READY);
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            ("False", "not ready: dns")
        );
        assert_eq!(find(&c, "DNSReady").message, "0 of 1 pods ready");
        assert_eq!(find(&c, "ProxyReady").reason, "Disabled");
        assert_eq!(ready.observed_generation, Some(3));
        let c = conditions(&c, &observed(ComponentState::Ready), Some(3), &now);
        assert_eq!(find(&c, READY).status, "True");
    }

    #[test]
    fn a_component_without_its_standby_is_degraded_not_down() {
        let now = at("2026-11-22T10:00:00Z");
        let c = conditions(
            &[],
            &observed(ComponentState::Degraded(
                "dns serves from one replica".into(),
            )),
            Some(4),
            &now,
        );
        let dns = find(&c, "DNSReady");
        assert_eq!(
            (dns.status.as_str(), dns.reason.as_str()),
            ("True", DEGRADED)
        );
        let ready = find(&c, READY);
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_str(),
                ready.message.as_str()
            ),
            (
                "True",
                DEGRADED,
                "every enabled component serves; without a standby: dns"
            )
        );
        // Back to two: Ready again, and the transition time kept.
        let later = at("2026-11-22T10:05:00Z");
        let mut both = observed(ComponentState::Ready);
        both.replicas = vec![(
            Component::Dns,
            ReplicaStatus {
                replicas: 2,
                ready_replicas: 2,
                active_replica: Some("x-dns-0".into()),
            },
        )];
        let c = conditions(&c, &both, Some(4), &later);
        assert_eq!(find(&c, READY).reason, "Ready");
        assert_eq!(find(&c, "DNSReady").message, "both dns replicas are ready");
        assert_eq!(find(&c, "DHCPReady").message, "the dhcp pod is ready");
        assert_eq!(find(&c, READY).last_transition_time, now);
        // A component down outweighs one degraded.
        let mut obs = observed(ComponentState::Degraded("x".into()));
        obs.components[0].1 = ComponentState::NotReady("0 of 1".into());
        let c = conditions(&[], &obs, Some(4), &now);
        assert_eq!(find(&c, READY).reason, "ComponentsNotReady");
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let t0 = at("2026-11-22T10:00:00Z");
        let t1 = at("2026-11-22T10:05:00Z");
        let t2 = at("2026-11-22T10:09:00Z");
        let first = conditions(&[], &observed(ComponentState::Ready), Some(1), &t0);
        let same = conditions(&first, &observed(ComponentState::Ready), Some(2), &t1);
        assert_eq!(find(&same, READY).last_transition_time, t0);
        assert_eq!(find(&same, READY).observed_generation, Some(2));
        let flipped = conditions(
            &same,
            &observed(ComponentState::NotReady("x".into())),
            Some(2),
            &t2,
        );
        assert_eq!(find(&flipped, READY).last_transition_time, t2);
        assert_eq!(find(&flipped, "DHCPReady").last_transition_time, t0);
    }

    #[test]
    fn an_invalid_spec_says_why_and_is_not_ready() {
        let now = at("2026-11-22T10:00:00Z");
        let obs = Observed {
            valid: Err(vec!["a: bad".into(), "b: worse".into()]),
            network_attachment: None,
            warnings: vec!["x is ignored".into()],
            components: vec![],
            replicas: vec![],
            attachments: AttachmentsSeen::default(),
            control_plane_namespaces: vec![],
        };
        let c = conditions(&[], &obs, None, &now);
        assert_eq!(find(&c, VALID).message, "a: bad; b: worse");
        assert_eq!(find(&c, READY).reason, "Invalid");
        assert_eq!(find(&c, IGNORED_FIELDS).message, "x is ignored");
        assert!(c.iter().all(|c| c.type_ != NETWORK_ATTACHMENT));
    }

    #[test]
    fn a_missing_network_attachment_has_its_own_condition() {
        let now = at("2026-11-22T10:00:00Z");
        let obs = Observed {
            valid: Ok(()),
            network_attachment: Some(Err(
                "NetworkAttachmentDefinition default/vlan100 not found".into()
            )),
            warnings: vec![],
            components: vec![],
            replicas: vec![],
            attachments: AttachmentsSeen::default(),
            control_plane_namespaces: vec![],
        };
        let c = conditions(&[], &obs, Some(1), &now);
        assert_eq!(find(&c, VALID).status, "True");
        let nad = find(&c, NETWORK_ATTACHMENT);
        assert_eq!(
            (nad.status.as_str(), nad.reason.as_str()),
            ("False", "NotFound")
        );
        assert!(nad.message.contains("default/vlan100"));
        assert_eq!(find(&c, READY).reason, "NetworkAttachmentMissing");
    }
}
