//! Accepting connections: one loop per listening socket on each proxy
//! thread. Each connection is admitted with three permits that its task
//! owns and gives back when it ends, whatever way it ends: its listener's
//! (`maxConnections`), the process-wide cap kept below the open-files
//! limit, and its source address's (`maxConnectionsPerSource`). A reload
//! may change the first and the last; the cap follows the open-files limit,
//! which is fixed at start.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use causeway_config::{Listener, ListenerKind, Upstream};
use causeway_runtime::Shutdown;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::connection::{handle, Held};
use crate::metrics::ProxyMetrics;
use crate::route::SniRoutes;
use crate::server::{ProxyError, Shared};

/// Where a listener sends a connection.
pub(crate) enum Routing {
    Plain(Target),
    Sni(SniRoutes<Target>),
}

impl Routing {
    /// The route labels its series carry.
    pub(crate) fn labels(&self) -> Vec<&str> {
        match self {
            Routing::Plain(t) => vec![t.route.as_str()],
            Routing::Sni(routes) => routes.targets().map(|t| t.route.as_str()).collect(),
        }
    }
}

/// A route's upstream, with the route's metric series, looked up when the
/// routes are built rather than per connection. The route label comes from
/// the config (an SNI pattern, `default`, or a plain listener's upstream),
/// never from what a client sent, so the series stay as few as the routes.
pub(crate) struct Target {
    pub(crate) upstream: Upstream,
    /// The route label of its series.
    pub(crate) route: String,
    pub(crate) accepted: prometheus::IntCounter,
    pub(crate) active: prometheus::IntGauge,
}

impl Target {
    pub(crate) fn new(
        metrics: &ProxyMetrics,
        listener: &str,
        route: &str,
        upstream: &Upstream,
    ) -> Self {
        Target {
            upstream: upstream.clone(),
            route: route.to_string(),
            accepted: metrics.route_accepted.with_label_values(&[listener, route]),
            active: metrics.route_active.with_label_values(&[listener, route]),
        }
    }
}

pub(crate) struct ListenerState {
    pub(crate) listen: SocketAddr,
    pub(crate) label: String,
    /// Swapped whole by a reload; a connection keeps the routing it began with.
    pub(crate) routing: RwLock<Arc<Routing>>,
    pub(crate) proxy_protocol: bool,
    pub(crate) limit: Arc<ConnectionLimit>,
    pub(crate) counters: ListenerCounters,
}

/// This listener's metric series, looked up once rather than per
/// connection.
pub(crate) struct ListenerCounters {
    pub(crate) accepted: prometheus::IntCounter,
    pub(crate) active: prometheus::IntGauge,
    pub(crate) bytes_up: prometheus::IntCounter,
    pub(crate) bytes_down: prometheus::IntCounter,
    pub(crate) connect_seconds: prometheus::Histogram,
}

impl ListenerCounters {
    pub(crate) fn new(m: &ProxyMetrics, label: &str) -> Self {
        ListenerCounters {
            accepted: m.accepted.with_label_values(&[label]),
            active: m.active.with_label_values(&[label]),
            bytes_up: m.bytes.with_label_values(&[label, "up"]),
            bytes_down: m.bytes.with_label_values(&[label, "down"]),
            connect_seconds: m.connect_seconds.with_label_values(&[label]),
        }
    }
}

impl ListenerState {
    pub(crate) fn routing(&self) -> Arc<Routing> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub(crate) fn routing_of(l: &Listener, metrics: &ProxyMetrics) -> Result<Routing, ProxyError> {
    let listener = l.listen.port().to_string();
    let target = |route: &str, u: &Upstream| Target::new(metrics, &listener, route, u);
    Ok(match &l.kind {
        ListenerKind::Plain(u) => Routing::Plain(target(&u.to_string(), u)),
        ListenerKind::Sni { routes, default } => Routing::Sni(
            SniRoutes::new(
                routes
                    .iter()
                    .map(|(pattern, u)| (pattern.clone(), target(pattern, u))),
                default.as_ref().map(|u| target("default", u)),
            )
            .map_err(|source| ProxyError::Routes {
                addr: l.listen,
                source,
            })?,
        ),
    })
}

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

/// A listener's `maxConnections`: a semaphore whose size a reload can
/// change while connections hold its permits. Growing adds permits;
/// shrinking forgets those free now and owes the rest, and each permit
/// given back while anything is owed is forgotten instead of returned. So
/// the connections already open stay, and new ones are refused until fewer
/// than the new size are open.
pub(crate) struct ConnectionLimit {
    permits: Arc<Semaphore>,
    /// The size last set; under the lock so two resizes cannot interleave.
    size: Mutex<usize>,
    /// Permits still to be taken out of circulation as connections end.
    owed: AtomicUsize,
}

/// One connection's place under a [`ConnectionLimit`].
pub(crate) struct LimitPermit {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<ConnectionLimit>,
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        let paid = self
            .limit
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                owed.checked_sub(1)
            })
            .is_ok();
        if let (true, Some(permit)) = (paid, self.permit.take()) {
            permit.forget();
        }
    }
}

impl ConnectionLimit {
    pub(crate) fn new(size: usize) -> Arc<Self> {
        let size = size.min(Semaphore::MAX_PERMITS);
        Arc::new(ConnectionLimit {
            permits: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
            owed: AtomicUsize::new(0),
        })
    }

    fn try_acquire(self: &Arc<Self>) -> Option<LimitPermit> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(LimitPermit {
            permit: Some(permit),
            limit: self.clone(),
        })
    }

    pub(crate) fn resize(&self, size: usize) {
        let size = size.min(Semaphore::MAX_PERMITS);
        let mut current = self.size.lock().unwrap_or_else(|p| p.into_inner());
        if size > *current {
            // What is still owed is cancelled first; only the rest is new.
            let grow = size - *current;
            let owed_before = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                    Some(owed - owed.min(grow))
                })
                .unwrap_or(0);
            self.permits.add_permits(grow - owed_before.min(grow));
        } else {
            let shrink = *current - size;
            let forgotten = self.permits.forget_permits(shrink);
            self.owed.fetch_add(shrink - forgotten, Ordering::AcqRel);
        }
        *current = size;
    }

    /// Connections that may open now.
    #[cfg(test)]
    fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Why a connection was closed on arrival; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Listener,
    Total,
    Source,
}

impl Refusal {
    fn label(self) -> &'static str {
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
struct Permit {
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
    fn admit(&self, limit: &Arc<ConnectionLimit>, source: IpAddr) -> Result<Permit, Refusal> {
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

pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    state: Arc<ListenerState>,
    listener: TcpListener,
    shutdown: Shutdown,
) {
    loop {
        let (client, from) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors or memory: retrying at once would
                    // spin; give connections a moment to close.
                    shared.metrics.connect_errors.with_label_values(&[state.label.as_str(), "accept"]).inc();
                    tracing::warn!(listen = %state.listen, error = %e, "accept failed; pausing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let permit = match shared.admission.admit(&state.limit, from.ip()) {
            Ok(p) => p,
            Err(refusal) => {
                shared
                    .metrics
                    .refused
                    .with_label_values(&[state.label.as_str(), refusal.label()])
                    .inc();
                drop(client);
                continue;
            }
        };
        let (shared, state) = (shared.clone(), state.clone());
        // Tracked, so the drain waits for it; the permits go with the task.
        shared.connections.clone().spawn(async move {
            let _permit = permit;
            state.counters.accepted.inc();
            let _open = Held::new(&state.counters.active);
            handle(&shared, &state, client, from).await;
        });
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

    #[test]
    fn a_resized_limit_keeps_open_connections_and_admits_to_the_new_size() {
        let limit = ConnectionLimit::new(4);
        let mut open: Vec<LimitPermit> = (0..3).map(|_| limit.try_acquire().unwrap()).collect();
        // Down to 1 with 3 open: the free one goes now, two are owed.
        limit.resize(1);
        assert_eq!(limit.available(), 0);
        assert!(limit.try_acquire().is_none());
        open.pop();
        open.pop();
        assert!(
            limit.try_acquire().is_none(),
            "still one open, the new size"
        );
        open.pop();
        let only = limit.try_acquire().expect("below the new size");
        assert!(limit.try_acquire().is_none());
        drop(only);
        // Up to 3, then down to 2 and up to 5 while 2 are open and 1 is owed
        // (the owed one is cancelled rather than added on top).
        limit.resize(3);
        assert_eq!(limit.available(), 3);
        let held: Vec<LimitPermit> = (0..3).map(|_| limit.try_acquire().unwrap()).collect();
        limit.resize(2);
        limit.resize(5);
        assert_eq!(limit.available(), 2);
        drop(held);
        assert_eq!(limit.available(), 5, "every permit back, none twice");
    }
}
