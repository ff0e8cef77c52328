//! Leader election on a coordination.k8s.io Lease, so two replicas never
//! reconcile at once. The holder renews every few seconds; another replica
//! takes over only after the lease has gone unrenewed for its duration.
//! Updates carry the resourceVersion they read, so two candidates cannot
//! both win a race.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Whether `spec`, read at `now`, may be taken by `me`.
pub fn may_take(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(holder) if holder == me => true,
        Some(_) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            match &spec.renew_time {
                Some(MicroTime(renewed)) => {
                    now.duration_since(*renewed) > SignedDuration::from_secs(duration)
                }
                None => true,
            }
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    me: String,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, me: &str) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            me: me.into(),
        }
    }

    /// One attempt to take or renew the lease; true when we hold it.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        if !may_take(spec, &self.me, now) {
            return Ok(false);
        }
        let renewing = spec.and_then(|s| s.holder_identity.as_deref()) == Some(self.me.as_str());
        let mut next = LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            renew_time: Some(MicroTime(now)),
            acquire_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.and_then(|s| s.lease_transitions).unwrap_or(0)),
            ..LeaseSpec::default()
        };
        if renewing {
            next.acquire_time = spec.and_then(|s| s.acquire_time.clone());
        } else if current.is_some() {
            next.lease_transitions = next.lease_transitions.map(|t| t + 1);
        }
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(next),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                // Keeps the resourceVersion read above: a concurrent
                // writer makes this fail with 409 instead of both winning.
                lease.spec = Some(next);
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

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    tracing::info!(lease = %self.name, identity = %self.me, "leader election won");
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the lease")
                }
            }
            tokio::time::sleep(RENEW_EVERY).await;
        }
    }

    /// Renews until a renewal fails for longer than the lease lasts, then
    /// returns: leadership is lost, and the caller must stop reconciling.
    pub async fn keep(&self) {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            match self.try_acquire().await {
                Ok(true) => last_ok = std::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "leader election lost: another replica holds the lease");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renewal failed");
                    if last_ok.elapsed() > LEASE_DURATION {
                        tracing::error!("leader election lost: could not renew the lease in time");
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_fresh_lease_of_another_is_not_taken() {
        let now: Timestamp = "2026-11-22T10:00:10Z".parse().unwrap();
        assert!(!may_take(
            Some(&spec("b", "2026-11-22T10:00:00Z")),
            "a",
            now
        ));
        assert!(may_take(Some(&spec("a", "2026-11-22T10:00:00Z")), "a", now));
    }

    #[test]
    fn an_expired_or_empty_lease_is_taken() {
        let now: Timestamp = "2026-11-22T10:00:16Z".parse().unwrap();
        assert!(may_take(Some(&spec("b", "2026-11-22T10:00:00Z")), "a", now));
        assert!(may_take(None, "a", now));
        assert!(may_take(Some(&LeaseSpec::default()), "a", now));
    }
}
