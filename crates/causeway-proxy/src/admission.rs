//! Admitting connections. Each connection is admitted with three permits
//! that its task owns and gives back when it ends, whatever way it ends:
//! its listener's (`maxConnections`), the process-wide cap kept below the
//! open-files limit, and its source address's (`maxConnectionsPerSource`).
//! A reload may change the first and the last; the cap follows the
//! open-files limit, which is fixed at start.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::port::{ConnectionLimit, LimitPermit};

/// Descriptors one proxied connection holds: the client's and the
/// upstream's.
const FDS_PER_CONNECTION: u64 = 2;
/// Descriptors kept back from the open-files limit for the rest of the
/// process (DNS sockets, the lease store, admin, health checks, runtime),
/// and never less than a tenth of the limit.
const RESERVED_FDS: u64 = 256;

/// The most connections the proxy holds at once across all its listeners
/// under an open-files limit of `nofile`: so many that the upstream
/// connects and everything else in the process still find descriptors.
pub fn connection_cap(nofile: u64) -> usize {
    let reserve = RESERVED_FDS.max(nofile / 10);
    let cap = nofile.saturating_sub(reserve) / FDS_PER_CONNECTION;
    usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .clamp(1, Semaphore::MAX_PERMITS)
}

/// Why a connection was closed on arrival; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Listener,
    Total,
    Source,
}

impl Refusal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Listener => "listener",
            Refusal::Total => "total",
            Refusal::Source => "source",
        }
    }
}

/// The process-wide limits every listener shares.
pub(crate) struct Admission {
    total: Arc<Semaphore>,
    per_source: AtomicUsize,
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// What an admitted connection holds until it ends.
pub(crate) struct Permit {
    _listener: LimitPermit,
    _total: OwnedSemaphorePermit,
    _source: SourceSlot,
}

/// One connection counted against its source address.
struct SourceSlot {
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = sources.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // No entry outlives a source's last connection, so the map
                // is as large as the set of connected sources.
                sources.remove(&self.ip);
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(cap: usize, per_source: usize) -> Self {
        Admission {
            total: Arc::new(Semaphore::new(cap)),
            per_source: AtomicUsize::new(per_source),
            sources: Arc::default(),
        }
    }

    pub(crate) fn set_per_source(&self, per_source: usize) {
        self.per_source.store(per_source, Ordering::Relaxed);
    }

    /// Takes every permit a connection from `source` needs on a listener
    /// with `limit`, or says which one ran out.
    pub(crate) fn admit(
        &self,
        limit: &Arc<ConnectionLimit>,
        source: IpAddr,
    ) -> Result<Permit, Refusal> {
        let listener = limit.try_acquire().ok_or(Refusal::Listener)?;
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::Total)?;
        let per_source = self.per_source.load(Ordering::Relaxed);
        {
            let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
            let n = sources.entry(source).or_insert(0);
            if *n >= per_source {
                if *n == 0 {
                    sources.remove(&source);
                }
                return Err(Refusal::Source);
            }
            *n += 1;
        }
        Ok(Permit {
            _listener: listener,
            _total: total,
            _source: SourceSlot {
                sources: self.sources.clone(),
                ip: source,
            },
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest_of_the_process() {
        // 1024: 256 kept back, two a connection.
        assert_eq!(connection_cap(1024), 384);
        // A large limit keeps a tenth back.
        assert_eq!(connection_cap(1_048_576), 471_859);
        // Never zero, even under a limit smaller than the reserve.
        assert_eq!(connection_cap(64), 1);
    }

    #[test]
    fn each_limit_refuses_by_name_and_every_permit_comes_back() {
        let admission = Admission::new(3, 2);
        let listener = ConnectionLimit::new(10);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = admission.admit(&listener, a).unwrap();
        let second = admission.admit(&listener, a).unwrap();
        assert_eq!(admission.admit(&listener, a).err(), Some(Refusal::Source));
        let third = admission.admit(&listener, b).unwrap();
        assert_eq!(admission.admit(&listener, b).err(), Some(Refusal::Total));
        // A refusal took nothing: the listener lent exactly three.
        assert_eq!(listener.available(), 7);
        drop((first, second, third));
        assert_eq!(listener.available(), 10);
        assert!(
            admission.sources.lock().unwrap().is_empty(),
            "a source outlived its last connection"
        );
        let small = ConnectionLimit::new(1);
        let _held = admission.admit(&small, a).unwrap();
        assert_eq!(admission.admit(&small, b).err(), Some(Refusal::Listener));
        // A reload lowers the per-source limit for new connections.
        admission.set_per_source(1);
        assert_eq!(admission.admit(&listener, a).err(), Some(Refusal::Source));
    }
}
