//! Leader election on a coordination.k8s.io Lease, so two replicas never
//! reconcile at once. The holder renews every [`RETRY_PERIOD`]; another
//! replica takes over only after the lease has gone unrenewed for
//! [`LEASE_DURATION`]. A holder that could not renew for [`RENEW_DEADLINE`]
//! stops acting, and that deadline is shorter than the lease duration, so
//! the old leader has stopped before anyone else may start. Updates carry
//! the resourceVersion they read, so two candidates cannot both win a race.
//!
//! The timings are client-go's defaults. No maintained Rust crate for
//! Lease election offered more than these ~100 lines, with its own
//! dependency pins, so this stays ours.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::Client;

use super::lease::{holder_is, LeaseWriter};

pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long the holder keeps acting without a successful renewal.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the holder renews and a candidate retries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

// Two leaders at once would be possible otherwise.
const _: () = assert!(RENEW_DEADLINE.as_secs() < LEASE_DURATION.as_secs());
const _: () = assert!(RETRY_PERIOD.as_secs() < RENEW_DEADLINE.as_secs());

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
    lease: LeaseWriter,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, name: &str, me: &str) -> Self {
        LeaderElector {
            lease: LeaseWriter::new(Api::namespaced(client, namespace), name, me),
        }
    }

    /// One attempt to take or renew the lease; true when we hold it.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let current = self.lease.get().await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        if !may_take(spec, self.lease.me(), Timestamp::now()) {
            return Ok(false);
        }
        self.lease
            .hold(current, LEASE_DURATION.as_secs() as i32)
            .await
    }

    /// Hands the lease back when this replica holds it, so a standby takes
    /// over at once rather than when the lease runs out: no holder, and a
    /// duration of one second. `true` when it was ours and is now free.
    /// Guarded by the resourceVersion read, like every other write.
    pub async fn release(&self) -> Result<bool, kube::Error> {
        let Some(lease) = self.lease.get().await? else {
            return Ok(false);
        };
        if !holder_is(&lease, self.lease.me()) {
            return Ok(false);
        }
        let mut spec = lease.spec.clone().unwrap_or_default();
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.lease.write(Some(lease), spec).await
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire().await {
                Ok(true) => {
                    tracing::info!(lease = %self.lease.name(), identity = %self.lease.me(), "leader election won");
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the lease")
                }
            }
            tokio::time::sleep(RETRY_PERIOD).await;
        }
    }

    /// Renews until no renewal has succeeded for [`RENEW_DEADLINE`], or
    /// another replica holds the lease, then returns: leadership is lost,
    /// and the caller must stop reconciling at once.
    pub async fn keep(&self) {
        let mut last_ok = std::time::Instant::now();
        loop {
            tokio::time::sleep(RETRY_PERIOD).await;
            // A renewal that hangs must not carry us past the deadline.
            let left = RENEW_DEADLINE.saturating_sub(last_ok.elapsed());
            match tokio::time::timeout(left, self.try_acquire()).await {
                Ok(Ok(true)) => last_ok = std::time::Instant::now(),
                Ok(Ok(false)) => {
                    tracing::error!(lease = %self.lease.name(), "leader election lost: another replica holds the lease");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "leader election: renewal failed"),
                Err(_) => tracing::warn!("leader election: renewal timed out"),
            }
            if last_ok.elapsed() >= RENEW_DEADLINE {
                tracing::error!(
                    deadline_seconds = RENEW_DEADLINE.as_secs(),
                    "leader election lost: could not renew the lease in time"
                );
                return;
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
