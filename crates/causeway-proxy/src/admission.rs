//! Admitting connections. Each connection is admitted with three permits
//! that its task owns and gives back when it ends, whatever way it ends:
//! its listener's (`maxConnections`), its two descriptors from the
//! process's descriptor budget (which keeps the proxy's share below what
//! DNS and the lease store need), and its source address's
//! (`maxConnectionsPerSource`). A reload may change the first and the
//! last; the budget follows the open-files limit, fixed at start. A
//! connection that moves bulk data reserves its splice pipes from the same
//! budget as it needs them (see `relay`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use causeway_runtime::fds::{FdBudget, FdReservation, Holder};

use crate::port::{ConnectionLimit, LimitPermit};

/// Descriptors one proxied connection holds before it moves bulk data:
/// the client's and the upstream's.
const FDS_PER_CONNECTION: u64 = 2;

/// The most connections the proxy holds at once across all its listeners
/// under an open-files limit of `nofile`, while none of them splices.
pub fn connection_cap(nofile: u64) -> usize {
    let cap = causeway_runtime::fds::proxy_share_under(nofile) / FDS_PER_CONNECTION;
    usize::try_from(cap).unwrap_or(usize::MAX)
}

/// Why a connection was closed on arrival; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Listener,
    Total,
    Source,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 3] = [Refusal::Listener, Refusal::Total, Refusal::Source];

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
    budget: &'static FdBudget,
    per_source: AtomicUsize,
    sources: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// What an admitted connection holds until it ends.
pub(crate) struct Permit {
    _listener: LimitPermit,
    _descriptors: FdReservation,
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
    pub(crate) fn new(budget: &'static FdBudget, per_source: usize) -> Self {
        Admission {
            budget,
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
        let descriptors = self
            .budget
            .try_reserve(Holder::ProxyConnection, FDS_PER_CONNECTION)
            .ok_or(Refusal::Total)?;
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
            _descriptors: descriptors,
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
        // 1024: 64 fixed, 16 for the lease store, 128 for the services,
        // two a connection.
        assert_eq!(connection_cap(1024), 408);
        // A large limit keeps a tenth back for the services.
        assert_eq!(connection_cap(1_048_576), 471_822);
        // Under a limit smaller than the reserves, no connection at all.
        assert_eq!(connection_cap(64), 0);
    }

    #[test]
    fn each_limit_refuses_by_name_and_every_permit_comes_back() {
        // Room for three connections' descriptors (150 lendable, 144 kept
        // for the services and the store).
        let budget: &'static FdBudget = Box::leak(Box::new(FdBudget::new(214)));
        let admission = Admission::new(budget, 2);
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
