//! One file-descriptor budget for the whole process.
//!
//! The proxy, the DNS server and the lease store share one open-files
//! limit. Left to itself, the proxy's bulk transfers (a socket each way and
//! a splice pipe, two descriptors, per direction: up to six a connection)
//! would take the last descriptor, and the failure would land wherever the
//! next `socket()` happened to be: a DNS query's upstream socket (SERVFAIL
//! for every forwarded name), the lease compaction, a health check. So
//! every holder reserves from this budget before it opens, and the holders
//! are tiered: the proxy may use the budget only down to a floor kept for
//! the services, and the services only down to a floor kept for the lease
//! store. A refused reservation is the holder's to handle cleanly (the
//! proxy refuses the connection or copies without a pipe, DNS answers
//! SERVFAIL for that one query, the compaction waits).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Descriptors a process of ours holds whatever it does (standard streams,
/// listeners, epoll and event descriptors, the lease log, the runtime's
/// threads): never lent.
const FIXED: u64 = 64;
/// Kept from the proxy for the services, at least: the DNS server's
/// upstream sockets and TCP clients, health checks, the admin.
const SERVICE_FLOOR_MIN: u64 = 128;
/// Kept from everything else for the lease store's compaction and repair.
const STORE_FLOOR: u64 = 16;

/// Who holds descriptors, in the order of how much they may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A proxied connection's two sockets.
    ProxyConnection,
    /// A splice pipe of a proxied connection (two descriptors).
    ProxyPipe,
    /// A DNS query's upstream socket.
    DnsUpstream,
    /// A DNS client's TCP connection.
    DnsTcpClient,
    /// A proxy health check's connection.
    HealthCheck,
    /// The lease store's compaction files.
    LeaseStore,
}

const HOLDERS: [Holder; 6] = [
    Holder::ProxyConnection,
    Holder::ProxyPipe,
    Holder::DnsUpstream,
    Holder::DnsTcpClient,
    Holder::HealthCheck,
    Holder::LeaseStore,
];

impl Holder {
    pub fn label(self) -> &'static str {
        match self {
            Holder::ProxyConnection => "proxy_connection",
            Holder::ProxyPipe => "proxy_pipe",
            Holder::DnsUpstream => "dns_upstream",
            Holder::DnsTcpClient => "dns_tcp_client",
            Holder::HealthCheck => "health_check",
            Holder::LeaseStore => "lease_store",
        }
    }

    fn index(self) -> usize {
        HOLDERS.iter().position(|h| *h == self).unwrap_or(0)
    }
}

/// The budget: what may be lent, and to whom how much.
pub struct FdBudget {
    /// Descriptors that may be lent at all.
    lendable: u64,
    /// What must stay free after a proxy reservation.
    proxy_floor: u64,
    /// What must stay free after a service's reservation.
    service_floor: u64,
    in_use: AtomicU64,
    held: [AtomicU64; HOLDERS.len()],
    /// None only if the constant metric definitions were refused.
    metrics: Option<BudgetMetrics>,
}

#[derive(Clone)]
struct BudgetMetrics {
    limit: IntGauge,
    held: IntGaugeVec,
    refused: IntCounterVec,
}

impl BudgetMetrics {
    fn new() -> Option<Self> {
        Some(BudgetMetrics {
            limit: IntGauge::new(
                "causeway_fd_budget_limit",
                "File descriptors the process lends to its connections, sockets and files: the open-files limit less a fixed part",
            )
            .ok()?,
            held: IntGaugeVec::new(
                Opts::new("causeway_fd_budget_held", "File descriptors held from the budget, by holder"),
                &["holder"],
            )
            .ok()?,
            refused: IntCounterVec::new(
                Opts::new(
                    "causeway_fd_budget_refused_total",
                    "Reservations the descriptor budget refused, by holder (the proxy refuses the connection or copies without a pipe; DNS answers SERVFAIL; a compaction waits)",
                ),
                &["holder"],
            )
            .ok()?,
        })
        .inspect(|m| {
            // At zero from the start, so the first refusal shows as an
            // increase (alerts read it).
            for h in HOLDERS {
                m.refused.with_label_values(&[h.label()]);
            }
        })
    }
}

/// Descriptors lent to one holder; given back on drop.
#[must_use = "the descriptors are given back when the reservation drops"]
pub struct FdReservation {
    budget: &'static FdBudget,
    holder: Holder,
    count: u64,
}

impl Drop for FdReservation {
    fn drop(&mut self) {
        self.budget.give_back(self.holder, self.count);
    }
}

impl std::fmt::Debug for FdReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FdReservation({} x{})", self.holder.label(), self.count)
    }
}

static GLOBAL: OnceLock<FdBudget> = OnceLock::new();

impl FdBudget {
    /// The budget under an open-files limit of `nofile`.
    pub fn new(nofile: u64) -> FdBudget {
        let (lendable, proxy_floor, service_floor) = shares(nofile);
        let metrics = BudgetMetrics::new();
        if let Some(m) = &metrics {
            m.limit.set(i64::try_from(lendable).unwrap_or(i64::MAX));
        }
        FdBudget {
            lendable,
            proxy_floor,
            service_floor,
            in_use: AtomicU64::new(0),
            held: Default::default(),
            metrics,
        }
    }

    /// The process's budget, sized from the open-files limit in force at
    /// the first call (the appliance raises the limit before any service
    /// starts).
    pub fn global() -> &'static FdBudget {
        GLOBAL.get_or_init(|| FdBudget::new(open_files_limit()))
    }

    /// Publishes the budget's metrics in `registry`.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        if let Some(m) = &self.metrics {
            registry.register(Box::new(m.limit.clone()))?;
            registry.register(Box::new(m.held.clone()))?;
            registry.register(Box::new(m.refused.clone()))?;
        }
        Ok(())
    }

    /// The most the proxy may hold at once.
    pub fn proxy_share(&self) -> u64 {
        self.lendable - self.proxy_floor
    }

    pub fn lendable(&self) -> u64 {
        self.lendable
    }

    pub fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Acquire)
    }

    pub fn held_by(&self, holder: Holder) -> u64 {
        self.held[holder.index()].load(Ordering::Acquire)
    }

    fn floor(&self, holder: Holder) -> u64 {
        match holder {
            Holder::ProxyConnection | Holder::ProxyPipe => self.proxy_floor,
            Holder::DnsUpstream | Holder::DnsTcpClient | Holder::HealthCheck => self.service_floor,
            Holder::LeaseStore => 0,
        }
    }

    /// Lends `count` descriptors to `holder`, or refuses when that would
    /// leave less free than the holder's tier must leave.
    pub fn try_reserve(&'static self, holder: Holder, count: u64) -> Option<FdReservation> {
        let ceiling = self.lendable.saturating_sub(self.floor(holder));
        let taken = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |in_use| {
                (in_use + count <= ceiling).then_some(in_use + count)
            });
        if taken.is_err() {
            if let Some(m) = &self.metrics {
                m.refused.with_label_values(&[holder.label()]).inc();
            }
            return None;
        }
        self.held[holder.index()].fetch_add(count, Ordering::AcqRel);
        if let Some(m) = &self.metrics {
            m.held
                .with_label_values(&[holder.label()])
                .add(i64::try_from(count).unwrap_or(i64::MAX));
        }
        Some(FdReservation {
            budget: self,
            holder,
            count,
        })
    }

    fn give_back(&self, holder: Holder, count: u64) {
        self.in_use.fetch_sub(count, Ordering::AcqRel);
        self.held[holder.index()].fetch_sub(count, Ordering::AcqRel);
        if let Some(m) = &self.metrics {
            m.held
                .with_label_values(&[holder.label()])
                .sub(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

/// What may be lent under an open-files limit of `nofile`, and the floors
/// the proxy's and the services' reservations must leave free.
fn shares(nofile: u64) -> (u64, u64, u64) {
    let lendable = nofile.saturating_sub(FIXED);
    let service_floor = STORE_FLOOR.min(lendable);
    let proxy_floor = (service_floor + SERVICE_FLOOR_MIN.max(lendable / 10)).min(lendable);
    (lendable, proxy_floor, service_floor)
}

/// The most descriptors the proxy may hold under an open-files limit of
/// `nofile`.
pub fn proxy_share_under(nofile: u64) -> u64 {
    let (lendable, proxy_floor, _) = shares(nofile);
    lendable - proxy_floor
}

/// The soft open-files limit now in force, or 1024 when it cannot be read.
pub fn open_files_limit() -> u64 {
    use nix::sys::resource::{getrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => soft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open-files limit; assuming 1024");
            1024
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn budget(nofile: u64) -> &'static FdBudget {
        Box::leak(Box::new(FdBudget::new(nofile)))
    }

    #[test]
    fn the_proxy_cannot_take_what_the_services_and_the_store_need() {
        // 1,000 lendable: the store keeps 16, the services 128 more at
        // least (a tenth of 1,000 is less).
        let b = budget(1064);
        assert_eq!(b.lendable(), 1000);
        assert_eq!(b.proxy_share(), 1000 - 16 - 128);
        let mut proxy = Vec::new();
        while let Some(r) = b.try_reserve(Holder::ProxyConnection, 2) {
            proxy.push(r);
        }
        assert_eq!(b.held_by(Holder::ProxyConnection), 856);
        assert!(b.try_reserve(Holder::ProxyPipe, 2).is_none());
        // DNS still gets its sockets, down to the store's floor.
        let mut dns = Vec::new();
        while let Some(r) = b.try_reserve(Holder::DnsUpstream, 1) {
            dns.push(r);
        }
        assert_eq!(dns.len(), 128);
        // And the store its files.
        let store = b.try_reserve(Holder::LeaseStore, 3).unwrap();
        assert_eq!(b.in_use(), 856 + 128 + 3);
        drop((proxy, dns, store));
        assert_eq!(b.in_use(), 0);
        for h in HOLDERS {
            assert_eq!(b.held_by(h), 0, "{h:?}");
        }
    }

    #[test]
    fn a_large_limit_keeps_a_tenth_for_the_services() {
        let b = budget(1_048_576);
        let lendable = 1_048_576 - FIXED;
        assert_eq!(b.proxy_share(), lendable - 16 - lendable / 10);
    }

    #[test]
    fn a_tiny_limit_lends_nothing_to_the_proxy_and_never_underflows() {
        let b = budget(70);
        assert_eq!(b.lendable(), 6);
        assert_eq!(b.proxy_share(), 0);
        assert!(b.try_reserve(Holder::ProxyConnection, 2).is_none());
        assert!(b.try_reserve(Holder::LeaseStore, 6).is_some());
        let none = budget(10);
        assert_eq!(none.lendable(), 0);
        assert!(none.try_reserve(Holder::LeaseStore, 1).is_none());
    }
}
