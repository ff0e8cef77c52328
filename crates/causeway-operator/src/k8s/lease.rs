//! The one writer of coordination.k8s.io Leases: the operator's leader
//! election and the HA pair's witness (lease mode) both take, renew and
//! hand back a Lease by compare-and-swap. A write carries the
//! resourceVersion of the object it was computed from, so of two writers
//! racing one gets a 409 and learns it lost; a Lease not there yet is
//! created, and of two creators one gets the 409.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// One Lease, written as `me`.
pub struct LeaseWriter {
    api: Api<Lease>,
    name: String,
    me: String,
}

/// The spec that makes `me` the holder as of `now`, from the spec read
/// (`None`: no Lease yet). A renewal keeps the acquire time; a change of
/// holder (from another, or from none after a hand-back) counts as a
/// transition.
pub fn held_by(
    previous: Option<&LeaseSpec>,
    me: &str,
    duration_seconds: i32,
    now: Timestamp,
) -> LeaseSpec {
    let renewing = previous.and_then(|s| s.holder_identity.as_deref()) == Some(me);
    let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration_seconds),
        renew_time: Some(MicroTime(now)),
        acquire_time: if renewing {
            previous.and_then(|s| s.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        lease_transitions: Some(if renewing || previous.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

/// Whether `lease` is held by `me`.
pub fn holder_is(lease: &Lease, me: &str) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(me)
}

impl LeaseWriter {
    pub fn new(api: Api<Lease>, name: &str, me: &str) -> LeaseWriter {
        LeaseWriter {
            api,
            name: name.to_string(),
            me: me.to_string(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn me(&self) -> &str {
        &self.me
    }

    pub async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(&self.name).await
    }

    /// Writes `spec` over `read` (the object as read: its resourceVersion
    /// guards the write), or creates the Lease when `read` is `None`.
    /// `Ok(false)` when another writer got there first.
    pub async fn write(&self, read: Option<Lease>, spec: LeaseSpec) -> Result<bool, kube::Error> {
        let result = match read {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes `me` the holder of `read` (see [`held_by`]).
    pub async fn hold(
        &self,
        read: Option<Lease>,
        duration_seconds: i32,
    ) -> Result<bool, kube::Error> {
        let spec = held_by(
            read.as_ref().and_then(|l| l.spec.as_ref()),
            &self.me,
            duration_seconds,
            Timestamp::now(),
        );
        self.write(read, spec).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    #[test]
    fn a_renewal_keeps_the_acquire_time_and_a_takeover_counts() {
        let t0 = at("2026-11-29T10:00:00Z");
        let t1 = at("2026-11-29T10:00:02Z");
        let first = held_by(None, "a", 15, t0);
        assert_eq!(first.lease_transitions, Some(0));
        assert_eq!(first.acquire_time, Some(MicroTime(t0)));
        let renewed = held_by(Some(&first), "a", 15, t1);
        assert_eq!(renewed.acquire_time, Some(MicroTime(t0)));
        assert_eq!(renewed.renew_time, Some(MicroTime(t1)));
        assert_eq!(renewed.lease_transitions, Some(0));
        let taken = held_by(Some(&renewed), "b", 15, t1);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(MicroTime(t1)));
        assert_eq!(taken.lease_transitions, Some(1));
        // Handed back (no holder), then taken again: a transition too.
        let released = LeaseSpec {
            holder_identity: None,
            ..taken
        };
        assert_eq!(
            held_by(Some(&released), "b", 15, t1).lease_transitions,
            Some(2)
        );
    }
}
