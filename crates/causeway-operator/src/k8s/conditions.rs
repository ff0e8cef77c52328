//! Status conditions, merged one way for every controller: a condition's
//! `lastTransitionTime` moves only when its status does. This is the one
//! place transition times are set.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition `type_` as it now is, keeping the transition time of the
/// previous one of that type when its status has not changed.
pub fn condition(
    prev: &[Condition],
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// Gives each condition of `next` the transition time of the previous
/// condition of its type when the status is the same: for conditions made
/// whole elsewhere (a pure status function) rather than by [`condition`].
pub fn keep_transitions(prev: &[Condition], next: &mut [Condition]) {
    for n in next {
        if let Some(p) = prev
            .iter()
            .find(|p| p.type_ == n.type_ && p.status == n.status)
        {
            n.last_transition_time = p.last_transition_time.clone();
        }
    }
}

/// Now, as a condition's time.
pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2_000).unwrap());
        let first = condition(&[], "Ready", false, "Waiting", "w".into(), Some(1), &t0);
        assert_eq!(first.last_transition_time, t0);
        let prev = [first];
        let same = condition(&prev, "Ready", false, "Other", "m".into(), Some(2), &t1);
        assert_eq!(same.last_transition_time, t0);
        assert_eq!(
            (same.reason.as_str(), same.observed_generation),
            ("Other", Some(2))
        );
        let flipped = condition(&prev, "Ready", true, "Ready", "r".into(), Some(2), &t1);
        assert_eq!(flipped.last_transition_time, t1);
        let other_type = condition(&prev, "Valid", false, "Waiting", "w".into(), Some(2), &t1);
        assert_eq!(other_type.last_transition_time, t1);
        // The same rule for conditions made elsewhere, in any order.
        let mut next = [flipped.clone(), same.clone(), other_type.clone()];
        for c in &mut next {
            c.last_transition_time = t1.clone();
        }
        let prev = [other_type.clone(), prev[0].clone()];
        keep_transitions(&prev, &mut next);
        assert_eq!(next[0].last_transition_time, t1, "Ready flipped");
        assert_eq!(next[1].last_transition_time, t0, "Ready unchanged");
        assert_eq!(next[2].last_transition_time, t1, "Valid as it was");
    }
}
