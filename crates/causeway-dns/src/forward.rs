//! Forwarding: names we are not authoritative for go to the upstream
//! resolvers. Identical misses in flight share one upstream query; the
//! number of upstream queries is bounded; upstreams that keep failing are
//! skipped for a while; answers are cached and, when every upstream fails,
//! served stale.
//!
//! What is shared lives here: the cache, the queries in flight by name,
//! upstream health and the bound. How one query goes upstream is the
//! [`crate::exchange`] state machine's; the UDP serving threads drive it
//! themselves ([`crate::outbound`]), and [`drive`] drives it on the runtime
//! for queries that came over TCP and for answers fetched again over TCP.

use causeway_runtime::fds::{FdBudget, FdReservation, Holder};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use causeway_config::{DnsConfig, UpstreamPolicy};
use rand::seq::SliceRandom;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::cache::{key_of, Cache, CacheKey, Hit};
pub(crate) use crate::exchange::FetchError;
use crate::exchange::{Event, Exchange, Route, Transmit, Transport};
use crate::message::ParsedQuery;
use crate::metrics::DnsMetrics;
use causeway_runtime::endpoint::Endpoint;

/// Consecutive failures after which an upstream is skipped.
const FAILURES_TO_SKIP: u32 = 3;
/// How long a failing upstream is skipped before it is tried again.
const SKIP_FOR: Duration = Duration::from_secs(5);
/// Clients that may wait on one name's upstream query. The number of names
/// upstream is bounded by `maxUpstreamInFlight`; this bounds what a flood
/// of one name can hold while its upstream does not answer.
pub(crate) const MAX_WAITERS_PER_NAME: usize = 256;
/// Bytes all waiting clients together may hold. The two bounds above still
/// let 256 clients wait on each of `maxUpstreamInFlight` (1,024) names, a
/// quarter of a million in all, while an upstream black-holes them for the
/// whole upstream timeout; this is what they may hold between them, a few
/// thousand clients whatever the names. Those beyond it get SERVFAIL at
/// once, as when a name's list is full: the answer they would most likely
/// have waited for anyway.
pub(crate) const MAX_JOINED_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A response on the wire (ID not yet the client's).
    Response(Vec<u8>),
    ServFail,
}

struct Upstream {
    addr: SocketAddr,
    label: String,
    failures: AtomicU32,
    /// Milliseconds since `epoch` until which it is skipped.
    skip_until: AtomicU64,
}

/// A UDP client waiting for a forwarded answer: where its reply goes, from
/// which socket, and the query it must answer.
pub(crate) struct Client {
    pub endpoint: Arc<Endpoint>,
    pub q: ParsedQuery,
    pub view: usize,
    /// The request's header and question: all that asking upstream
    /// ([`crate::message::upstream_query`]) and answering the client
    /// ([`crate::message::patch_for`]) read of it.
    pub request: Vec<u8>,
    pub to: SocketAddr,
    pub local: Option<Ipv4Addr>,
}

impl Client {
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        q: ParsedQuery,
        view: usize,
        request: &[u8],
        to: SocketAddr,
        local: Option<Ipv4Addr>,
    ) -> Self {
        // What follows the question (other records, the client's OPT and
        // its options: up to the whole datagram) would be held for the
        // upstream timeout by every client waiting, and is never read.
        let request = request.get(..q.question_end).unwrap_or(request).to_vec();
        Client {
            endpoint,
            q,
            view,
            request,
            to,
            local,
        }
    }
}

/// Someone waiting for the answer to a query already on its way upstream.
pub(crate) enum Waiter {
    /// A task serving a TCP client.
    Task(oneshot::Sender<Answer>),
    /// A UDP client, answered by whoever gets the answer.
    Datagram(Box<Client>),
}

/// What a waiter holds while it waits, as counted against
/// [`MAX_JOINED_BYTES`]: an estimate that errs high, of its own size, its
/// place in the list and what it keeps on the heap.
pub(crate) trait Retained {
    fn retained(&self) -> usize;
}

/// What an allocation costs beyond its bytes: the allocator's header and
/// rounding.
const ALLOCATION: usize = 16;

impl Retained for Box<Client> {
    fn retained(&self) -> usize {
        // The query's name is kept twice (as asked and lowercased); each
        // copy spills to the heap once it outgrows its inline storage.
        let name = self.q.query.name().len();
        std::mem::size_of::<Waiter>()
            + std::mem::size_of::<Client>()
            + ALLOCATION
            + self.request.capacity()
            + ALLOCATION
            + 2 * (name + ALLOCATION)
    }
}

impl Retained for oneshot::Sender<Answer> {
    fn retained(&self) -> usize {
        // The channel's state, shared with the task that waits on it.
        std::mem::size_of::<Waiter>() + std::mem::size_of::<Answer>() + 64 + ALLOCATION
    }
}

impl Retained for Waiter {
    fn retained(&self) -> usize {
        match self {
            Waiter::Task(tx) => tx.retained(),
            Waiter::Datagram(client) => client.retained(),
        }
    }
}

impl From<Box<Client>> for Waiter {
    fn from(client: Box<Client>) -> Self {
        Waiter::Datagram(client)
    }
}

impl From<oneshot::Sender<Answer>> for Waiter {
    fn from(tx: oneshot::Sender<Answer>) -> Self {
        Waiter::Task(tx)
    }
}

/// What [`Forwarder::join`] made of a query; the waiter comes back unless
/// it joined.
pub(crate) enum Join<W> {
    /// An identical query was upstream: the waiter will be answered with it.
    Joined,
    /// None was: the caller asks upstream, and must [`Forwarder::settle`].
    Lead(W),
    /// One was, but the name has as many waiting as may, or all names
    /// together hold [`MAX_JOINED_BYTES`]: the caller answers SERVFAIL.
    Full(W),
}

/// The names on their way upstream, and who else waits for each.
#[derive(Default)]
struct Joined {
    by_name: HashMap<CacheKey, Vec<Waiter>>,
    /// The sum of every waiter's [`Retained::retained`].
    bytes: usize,
}

/// One of the bounded upstream queries, given back when dropped.
pub(crate) struct InFlight {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus::IntGauge,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

pub struct Forwarder {
    /// Every upstream this forwarder has been given, at the index routes
    /// and events carry. It only grows (by a new address, at a reload), so
    /// an exchange begun before a reload reports on the upstream it asked.
    known: RwLock<Vec<Arc<Upstream>>>,
    /// What a reload may change: the upstreams asked, their order and the
    /// time allowed.
    asking: RwLock<Arc<Asking>>,
    coalesce: Mutex<Joined>,
    permits: Arc<Semaphore>,
    pub cache: Cache,
    metrics: DnsMetrics,
    epoch: Instant,
}

/// The upstreams in use, in config order, each with its index in
/// [`Forwarder::known`], and how they are asked. A query reads only this.
struct Asking {
    order: Vec<(usize, Arc<Upstream>)>,
    policy: UpstreamPolicy,
    timeout: Duration,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Forwarder {
    pub fn new(cfg: &DnsConfig, upstreams: Vec<SocketAddr>, metrics: DnsMetrics) -> Arc<Self> {
        let forwarder = Arc::new(Forwarder {
            known: RwLock::new(Vec::new()),
            asking: RwLock::new(Arc::new(Asking {
                order: Vec::new(),
                policy: cfg.upstream_policy,
                timeout: cfg.upstream_timeout,
            })),
            coalesce: Mutex::new(Joined::default()),
            permits: Arc::new(Semaphore::new(cfg.max_upstream_in_flight)),
            cache: Cache::new(cfg.cache.clone()),
            metrics,
            epoch: Instant::now(),
        });
        forwarder.reload(cfg, &upstreams);
        forwarder
    }

    /// Asks `upstreams` from now on, with `cfg`'s policy and timeout.
    /// Exchanges under way finish with the upstreams they began with. An
    /// upstream kept keeps its failure count; the cache is kept, as its
    /// answers carry their own TTLs.
    pub fn reload(&self, cfg: &DnsConfig, upstreams: &[SocketAddr]) {
        let mut known = write(&self.known);
        let mut order = Vec::with_capacity(upstreams.len());
        for addr in upstreams {
            let index = match known.iter().position(|u| u.addr == *addr) {
                Some(i) => i,
                None => {
                    known.push(Arc::new(Upstream {
                        addr: *addr,
                        label: addr.to_string(),
                        failures: AtomicU32::new(0),
                        skip_until: AtomicU64::new(0),
                    }));
                    known.len() - 1
                }
            };
            // Each upstream's latency series exists from the start, empty:
            // a dashboard then lists an upstream that has never answered.
            self.metrics
                .upstream_seconds
                .with_label_values(&[addr.to_string().as_str()]);
            if !order.iter().any(|(i, _)| *i == index) {
                order.push((index, known[index].clone()));
            }
        }
        *write(&self.asking) = Arc::new(Asking {
            order,
            policy: cfg.upstream_policy,
            timeout: cfg.upstream_timeout,
        });
    }

    /// The upstreams asked now, in config order.
    pub fn upstreams(&self) -> Vec<SocketAddr> {
        read(&self.asking)
            .order
            .iter()
            .map(|(_, u)| u.addr)
            .collect()
    }

    fn upstream(&self, index: usize) -> Option<Arc<Upstream>> {
        read(&self.known).get(index).cloned()
    }

    /// Answers `q` (whose bytes are `request`) from the cache or upstream,
    /// for a TCP client. Also returns those who joined the query meanwhile,
    /// for the caller to answer.
    pub(crate) async fn resolve(
        &self,
        q: &ParsedQuery,
        request: &[u8],
        now: u64,
    ) -> (Answer, Vec<Waiter>) {
        let key = key_of(q);
        if let Some(wire) = self.cached(&key, now) {
            return (Answer::Response(wire), Vec::new());
        }
        let (tx, rx) = oneshot::channel();
        match self.join(&key, tx) {
            Join::Joined => return (rx.await.unwrap_or(Answer::ServFail), Vec::new()),
            Join::Full(_) => return (Answer::ServFail, Vec::new()),
            Join::Lead(_) => {}
        }
        let result = match self.in_flight() {
            Some(_slot) => {
                let mut exchange = self.exchange(q, request, Instant::now());
                drive(self, &mut exchange, None).await
            }
            None => Err(FetchError::Overloaded),
        };
        self.settle(&key, q, result, now)
    }

    /// A fresh cached answer, counting the hit or the miss.
    pub(crate) fn cached(&self, key: &[u8], now: u64) -> Option<Vec<u8>> {
        if let Hit::Fresh(wire) = self.cache.get(key, now, false) {
            self.metrics.cache.with_label_values(&["hit"]).inc();
            return Some(wire);
        }
        self.metrics.cache.with_label_values(&["miss"]).inc();
        None
    }

    /// Joins `waiter` to the identical query on its way upstream, if there
    /// is one and it has room. If there is none, hands the waiter back and
    /// marks the name as on its way.
    pub(crate) fn join<W: Into<Waiter> + Retained>(&self, key: &CacheKey, waiter: W) -> Join<W> {
        let mut joined = lock(&self.coalesce);
        let held = joined.bytes;
        let Some(waiters) = joined.by_name.get_mut(key) else {
            joined.by_name.insert(key.clone(), Vec::new());
            return Join::Lead(waiter);
        };
        if waiters.len() >= MAX_WAITERS_PER_NAME {
            self.refused("name_full");
            return Join::Full(waiter);
        }
        let cost = waiter.retained();
        if held + cost > MAX_JOINED_BYTES {
            self.refused("byte_budget");
            return Join::Full(waiter);
        }
        waiters.push(waiter.into());
        joined.bytes = held + cost;
        self.metrics.coalesced.inc();
        self.metrics.coalesced_bytes.set(gauge(joined.bytes));
        Join::Joined
    }

    fn refused(&self, reason: &str) {
        self.metrics
            .coalesce_refused
            .with_label_values(&[reason])
            .inc();
    }

    /// What the clients waiting on queries upstream hold, as counted
    /// against [`MAX_JOINED_BYTES`].
    #[cfg(test)]
    fn joined_bytes(&self) -> usize {
        lock(&self.coalesce).bytes
    }

    /// One upstream query's place under the bound, if one is free.
    pub(crate) fn in_flight(&self) -> Option<InFlight> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        self.metrics.upstream_in_flight.inc();
        Some(InFlight {
            _permit: permit,
            gauge: self.metrics.upstream_in_flight.clone(),
        })
    }

    /// Ends the query for `key` that [`Self::join`] let the caller lead:
    /// caches the answer, or falls back to a stale one, and returns the
    /// answer with everyone who waits for it.
    pub(crate) fn settle(
        &self,
        key: &CacheKey,
        q: &ParsedQuery,
        result: Result<Vec<u8>, FetchError>,
        now: u64,
    ) -> (Answer, Vec<Waiter>) {
        let answer = match result {
            Ok(wire) => {
                if self.cache.insert(key.clone(), &wire, now).is_some() {
                    self.metrics
                        .cache_bytes
                        .set(i64::try_from(self.cache.bytes()).unwrap_or(i64::MAX));
                    self.metrics
                        .cache_entries
                        .set(i64::try_from(self.cache.len()).unwrap_or(i64::MAX));
                }
                Answer::Response(wire)
            }
            Err(e) => {
                tracing::debug!(name = %q.lower, error = %e, "forwarding failed");
                // Counted by reason so that our own shortage (local) and
                // the in-flight bound (overloaded) show apart from
                // upstreams that fail, which upstream_errors counts per
                // upstream.
                let (answer, answered) = match self.cache.get(key, now, true) {
                    Hit::Stale(wire) | Hit::Fresh(wire) => {
                        self.metrics.cache.with_label_values(&["stale"]).inc();
                        (Answer::Response(wire), "stale")
                    }
                    Hit::Miss => (Answer::ServFail, "servfail"),
                };
                self.metrics
                    .forward_failures
                    .with_label_values(&[e.label(), answered])
                    .inc();
                answer
            }
        };
        let mut joined = lock(&self.coalesce);
        let waiters = joined.by_name.remove(key).unwrap_or_default();
        let released: usize = waiters.iter().map(Retained::retained).sum();
        joined.bytes = joined.bytes.saturating_sub(released);
        self.metrics.coalesced_bytes.set(gauge(joined.bytes));
        drop(joined);
        (answer, waiters)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The upstreams to try, in order: those not being skipped first, in
    /// config order (sequential) or shuffled (random).
    fn routes(&self, asking: &Asking) -> Vec<Route> {
        self.routes_at(asking, self.now_ms())
    }

    /// [`Self::routes`] at `now` (milliseconds since `epoch`).
    fn routes_at(&self, asking: &Asking, now: u64) -> Vec<Route> {
        let mut order: Vec<(usize, &Upstream)> =
            asking.order.iter().map(|(i, u)| (*i, &**u)).collect();
        if asking.policy == UpstreamPolicy::Random {
            order.shuffle(&mut rand::rng());
        }
        order.sort_by_key(|(_, u)| u.skip_until.load(Ordering::Relaxed) > now);
        order
            .into_iter()
            .map(|(index, u)| Route {
                index,
                addr: u.addr,
            })
            .collect()
    }

    /// A new exchange with the upstreams for the query `request`: the
    /// whole upstream timeout over all of them, and for each a share that
    /// leaves time for the others if the first does not answer.
    pub(crate) fn exchange(&self, q: &ParsedQuery, request: &[u8], now: Instant) -> Exchange {
        let asking = read(&self.asking).clone();
        let per_try =
            (asking.timeout / asking.order.len().max(1) as u32).max(Duration::from_millis(300));
        Exchange::new(
            &crate::message::upstream_query(q, request),
            q.question_end,
            self.routes(&asking),
            asking.timeout,
            per_try,
            now,
        )
    }

    /// Takes in what an exchange reports of an upstream.
    pub(crate) fn observe(&self, event: Event) {
        match event {
            Event::Answered { upstream, took } => self.succeeded(upstream, took),
            Event::Failed { upstream, reason } => self.failed(upstream, reason),
            Event::Unexpected => self
                .metrics
                .dropped
                .with_label_values(&["unexpected_upstream_response"])
                .inc(),
        }
    }

    fn failed(&self, index: usize, reason: &str) {
        let Some(up) = self.upstream(index) else {
            return;
        };
        self.metrics
            .upstream_errors
            .with_label_values(&[up.label.as_str(), reason])
            .inc();
        if up.failures.fetch_add(1, Ordering::Relaxed) + 1 >= FAILURES_TO_SKIP {
            up.skip_until.store(
                self.now_ms() + SKIP_FOR.as_millis() as u64,
                Ordering::Relaxed,
            );
        }
    }

    fn succeeded(&self, index: usize, took: Duration) {
        let Some(up) = self.upstream(index) else {
            return;
        };
        up.failures.store(0, Ordering::Relaxed);
        up.skip_until.store(0, Ordering::Relaxed);
        self.metrics
            .upstream_seconds
            .with_label_values(&[up.label.as_str()])
            .observe(took.as_secs_f64());
    }
}

/// Drives `exchange` to its outcome on the runtime, starting with `pending`
/// if the caller has already taken its transmit. TCP clients' queries run
/// here from the start; a UDP thread hands a query over when it must be
/// asked again over TCP, since a stream would hold up the thread.
pub(crate) async fn drive(
    fwd: &Forwarder,
    exchange: &mut Exchange,
    mut pending: Option<Transmit>,
) -> Result<Vec<u8>, FetchError> {
    // The socket of the attempt waiting for a datagram, and its number.
    let mut socket: Option<(u32, Reserved<UdpSocket>)> = None;
    loop {
        while let Some(event) = exchange.poll_event() {
            fwd.observe(event);
        }
        if let Some(outcome) = exchange.poll_outcome() {
            return outcome;
        }
        if let Some(t) = pending.take().or_else(|| exchange.poll_transmit()) {
            // Each attempt on a socket of its own; the previous one closes.
            socket = None;
            match t.transport {
                Transport::Udp => match udp_send(t.to, exchange.payload()).await {
                    Ok(s) => socket = Some((t.attempt, s)),
                    Err(e) => exchange.handle_error(Instant::now(), t.attempt, e),
                },
                Transport::Tcp => {
                    let until = exchange.poll_timeout().unwrap_or_else(Instant::now);
                    let asked = tokio::time::timeout_at(
                        until.into(),
                        tcp_exchange(t.to, exchange.payload()),
                    )
                    .await;
                    let now = Instant::now();
                    match asked {
                        Ok(Ok(wire)) => exchange.handle_stream(now, t.attempt, &wire),
                        Ok(Err(e)) => exchange.handle_error(now, t.attempt, e),
                        Err(_) => exchange.handle_timeout(now),
                    }
                }
            }
            continue;
        }
        let (Some(until), Some((attempt, s))) = (exchange.poll_timeout(), &socket) else {
            // An exchange not over always waits on a socket until a time;
            // were that ever untrue, fail rather than spin.
            return Err(FetchError::Timeout);
        };
        let attempt = *attempt;
        // Wait for readiness, not for a read into a buffer of our own: a
        // buffer held across the wait would cost 64 KiB per query in
        // flight (over a thousand of them when an upstream is slow), while
        // the worker thread's one buffer serves them all.
        let woke = tokio::select! {
            ready = s.readable() => Some(ready),
            () = tokio::time::sleep_until(until.into()) => None,
        };
        let now = Instant::now();
        match woke {
            Some(Ok(())) => DATAGRAM.with_borrow_mut(|buf| match s.try_recv(buf) {
                Ok(n) => exchange.handle_datagram(now, attempt, &buf[..n]),
                // Readiness can be spurious; wait again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => exchange.handle_error(now, attempt, e),
            }),
            Some(Err(e)) => exchange.handle_error(now, attempt, e),
            None => exchange.handle_timeout(now),
        }
    }
}

thread_local! {
    /// Where [`drive`] reads an upstream datagram, one per runtime thread;
    /// borrowed only between a socket's readiness and the exchange taking
    /// the bytes, with no await in between.
    static DATAGRAM: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 65535]);
}

/// Sends `payload` from a socket of its own: a port the kernel picks at
/// random, connected to the upstream, so a forger must guess the port as
/// well as the ID (RFC 5452 §9.2) and the kernel drops datagrams from any
/// other address.
async fn udp_send(to: SocketAddr, payload: &[u8]) -> io::Result<Reserved<UdpSocket>> {
    let reserved = reserve_upstream_descriptor()?;
    let socket = UdpSocket::bind(any_port_for(to)).await?;
    socket.connect(to).await?;
    socket.send(payload).await?;
    Ok(Reserved {
        socket,
        _descriptor: reserved,
    })
}

/// A socket with the descriptor it was reserved from the process's budget.
pub(crate) struct Reserved<S> {
    pub(crate) socket: S,
    _descriptor: FdReservation,
}

impl<S> std::ops::Deref for Reserved<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.socket
    }
}

impl<S> Reserved<S> {
    pub(crate) fn new(socket: S, descriptor: FdReservation) -> Self {
        Reserved {
            socket,
            _descriptor: descriptor,
        }
    }
}

/// One descriptor for an upstream query's socket, from the process's
/// budget; refused as EMFILE would be, so the exchange treats it as our own
/// shortage (this query fails, no upstream is blamed).
pub(crate) fn reserve_upstream_descriptor() -> io::Result<FdReservation> {
    FdBudget::global()
        .try_reserve(Holder::DnsUpstream, 1)
        .ok_or_else(|| io::Error::from_raw_os_error(nix::libc::EMFILE))
}

/// One query on a connection of its own; the answer is the exchange's to
/// check.
async fn tcp_exchange(to: SocketAddr, payload: &[u8]) -> io::Result<Vec<u8>> {
    let len = u16::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "query over 64 KiB"))?;
    let _reserved = reserve_upstream_descriptor()?;
    let mut stream = TcpStream::connect(to).await?;
    let mut framed = Vec::with_capacity(payload.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(payload);
    stream.write_all(&framed).await?;
    let n = stream.read_u16().await?;
    let mut wire = vec![0u8; usize::from(n)];
    stream.read_exact(&mut wire).await?;
    Ok(wire)
}

/// Where a socket that asks `upstream` binds: the unspecified address of
/// its family, on a port the kernel picks at random.
pub(crate) fn any_port_for(upstream: SocketAddr) -> SocketAddr {
    let any = match upstream {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(any, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_config::Config;

    /// A forwarder on the default DNS config, with its metrics; its one
    /// upstream (the discard port) is never asked by these tests.
    fn forwarder() -> (Arc<Forwarder>, DnsMetrics) {
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\ndns:\n  listen: ['127.0.0.1:5353']\n",
        )
        .unwrap()
        .dns
        .unwrap();
        let metrics = DnsMetrics::new(&prometheus::Registry::new()).unwrap();
        let upstream = vec!["127.0.0.1:9".parse().unwrap()];
        (Forwarder::new(&cfg, upstream, metrics.clone()), metrics)
    }

    /// Routes of a reloaded forwarder are the new upstreams in config
    /// order; an event of an exchange begun before the reload is counted
    /// for the upstream that exchange asked, even where the new list holds
    /// another at its position.
    #[test]
    fn a_reload_routes_to_the_new_upstreams_and_old_events_count_for_the_upstream_asked() {
        let (fwd, metrics) = forwarder();
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\ndns:\n  listen: ['127.0.0.1:5353']\n",
        )
        .unwrap()
        .dns
        .unwrap();
        let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) = (
            "127.0.0.1:9".parse().unwrap(),
            "127.0.0.2:53".parse().unwrap(),
            "127.0.0.3:53".parse().unwrap(),
        );
        let before = fwd.routes(&read(&fwd.asking).clone());
        assert_eq!(before.iter().map(|r| r.addr).collect::<Vec<_>>(), [a]);
        fwd.reload(&cfg, &[b, c]);
        assert_eq!(fwd.upstreams(), [b, c]);
        let after = fwd.routes(&read(&fwd.asking).clone());
        assert_eq!(after.iter().map(|r| r.addr).collect::<Vec<_>>(), [b, c]);
        // The exchange begun before reports its upstream failed.
        fwd.observe(Event::Failed {
            upstream: before[0].index,
            reason: "timeout",
        });
        let errors = |u: SocketAddr| {
            metrics
                .upstream_errors
                .with_label_values(&[u.to_string().as_str(), "timeout"])
                .get()
        };
        assert_eq!((errors(a), errors(b)), (1, 0));
        // Back to the first upstream: the same entry, its count kept.
        fwd.reload(&cfg, &[a]);
        let again = fwd.routes(&read(&fwd.asking).clone());
        assert_eq!(again[0].index, before[0].index);
        assert_eq!(read(&fwd.known).len(), 3);
    }

    /// Three failures in a row put an upstream last for five seconds;
    /// two do not, an answer clears the count, and once the five seconds
    /// are over it is back in its place.
    #[test]
    fn three_failures_in_a_row_put_an_upstream_last_for_five_seconds() {
        let (fwd, _) = forwarder();
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\ndns:\n  listen: ['127.0.0.1:5353']\n",
        )
        .unwrap()
        .dns
        .unwrap();
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.2:53".parse().unwrap(),
            "127.0.0.3:53".parse().unwrap(),
        );
        fwd.reload(&cfg, &[a, b]);
        let asking = read(&fwd.asking).clone();
        let first = fwd.routes(&asking)[0].index;
        let order = |now: u64| -> Vec<SocketAddr> {
            fwd.routes_at(&asking, now).iter().map(|r| r.addr).collect()
        };
        let fail = || {
            fwd.observe(Event::Failed {
                upstream: first,
                reason: "timeout",
            })
        };
        fail();
        fail();
        assert_eq!(order(fwd.now_ms()), [a, b], "skipped after two failures");
        // An answer starts the count over.
        fwd.observe(Event::Answered {
            upstream: first,
            took: Duration::from_millis(1),
        });
        fail();
        fail();
        assert_eq!(
            order(fwd.now_ms()),
            [a, b],
            "the answer did not clear the count"
        );
        let failed_at = fwd.now_ms();
        fail();
        let until = read(&fwd.known)[first].skip_until.load(Ordering::Relaxed);
        assert!(
            (failed_at + 5_000..=fwd.now_ms() + 5_000).contains(&until),
            "skipped until {until} ms, failed at {failed_at} ms"
        );
        assert_eq!(
            order(fwd.now_ms()),
            [b, a],
            "not tried last after three failures"
        );
        assert_eq!(order(until - 1), [b, a], "back before five seconds");
        assert_eq!(order(until), [a, b], "still last after five seconds");
    }

    #[tokio::test]
    async fn a_name_takes_only_so_many_waiters() {
        let (fwd, _) = forwarder();
        let key: CacheKey = b"one name".to_vec();
        let waiter = || oneshot::channel::<Answer>().0;
        assert!(matches!(fwd.join(&key, waiter()), Join::Lead(_)));
        for _ in 0..MAX_WAITERS_PER_NAME {
            assert!(matches!(fwd.join(&key, waiter()), Join::Joined));
        }
        assert!(matches!(fwd.join(&key, waiter()), Join::Full(_)));
        let other: CacheKey = b"another name".to_vec();
        assert!(matches!(fwd.join(&other, waiter()), Join::Lead(_)));
        let (_, waiters) = fwd.settle(&key, &probe(), Err(FetchError::Timeout), 0);
        assert_eq!(waiters.len(), MAX_WAITERS_PER_NAME);
        // Settled, the name starts over.
        assert!(matches!(fwd.join(&key, waiter()), Join::Lead(_)));
    }

    /// A query for `name` with EDNS and about 4 KB of records after its
    /// question, as any client may send.
    fn bulky_query(name: &str) -> Vec<u8> {
        use hickory_proto::rr::{rdata::TXT, Name, RData, Record, RecordType};
        let n = Name::from_ascii(name).unwrap();
        let mut m = hickory_proto::op::Message::new();
        m.add_query(hickory_proto::op::Query::query(n.clone(), RecordType::A));
        for i in 0..16 {
            let text = vec![format!("{i:0>250}")];
            m.add_additional(Record::from_rdata(n.clone(), 0, RData::TXT(TXT::new(text))));
        }
        m.set_edns(hickory_proto::op::Edns::new());
        m.to_vec().unwrap()
    }

    #[test]
    fn joined_waiters_hold_no_more_than_the_byte_budget() {
        let (fwd, metrics) = forwarder();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let endpoint = Arc::new(Endpoint::new(socket, Duration::from_millis(10)).unwrap());
        let request = bulky_query("a-label-longer-than-inline-storage.example.net.");
        assert!(request.len() > 4000, "{} bytes", request.len());
        let q = crate::message::parse(&request).unwrap();
        let to: SocketAddr = "192.0.2.1:5353".parse().unwrap();
        let client = || {
            Box::new(Client::new(
                endpoint.clone(),
                q.clone(),
                0,
                &request,
                to,
                None,
            ))
        };
        // The upstream black-holes every name: nothing is settled while
        // names and their waiters pile up, as far as the bounds let them.
        let (mut keys, mut joined, mut refused) = (Vec::new(), 0usize, 0u64);
        for name in 0..1024 {
            let key: CacheKey = format!("name {name}").into_bytes();
            assert!(matches!(fwd.join(&key, client()), Join::Lead(_)));
            keys.push(key.clone());
            for _ in 0..MAX_WAITERS_PER_NAME {
                match fwd.join(&key, client()) {
                    Join::Joined => joined += 1,
                    Join::Full(_) => refused += 1,
                    Join::Lead(_) => panic!("a second lead for one name"),
                }
                assert!(
                    fwd.joined_bytes() <= MAX_JOINED_BYTES,
                    "{} bytes held by {joined} waiters, over the budget of {MAX_JOINED_BYTES}",
                    fwd.joined_bytes()
                );
            }
            if refused > MAX_WAITERS_PER_NAME as u64 {
                break;
            }
        }
        let refusals = |reason: &str| metrics.coalesce_refused.with_label_values(&[reason]).get();
        assert_eq!(refusals("byte_budget"), refused);
        assert_eq!(refusals("name_full"), 0);
        assert_eq!(metrics.coalesced_bytes.get(), gauge(fwd.joined_bytes()));
        // The budget is filled before anyone is refused.
        let one = client().retained();
        assert!(fwd.joined_bytes() > MAX_JOINED_BYTES - one);
        // A waiter keeps its query's header and question, not the records
        // after it, so the budget holds thousands of waiters.
        assert!(one < 1024, "one waiter holds {one} bytes");
        assert!(joined > 4000, "{joined} waiters");
        // Answered (or timed out), the waiters give their bytes back.
        let mut answered = 0;
        for key in &keys {
            answered += fwd.settle(key, &q, Err(FetchError::Timeout), 0).1.len();
        }
        assert_eq!(answered, joined);
        assert_eq!((fwd.joined_bytes(), metrics.coalesced_bytes.get()), (0, 0));
        assert!(matches!(fwd.join(&keys[0], client()), Join::Lead(_)));
        assert!(matches!(fwd.join(&keys[0], client()), Join::Joined));
    }

    #[test]
    fn a_failed_forward_is_counted_by_reason_and_by_what_the_client_got() {
        let (fwd, metrics) = forwarder();
        let q = probe();
        let key = key_of(&q);
        let emfile = std::io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32);
        let (answer, _) = fwd.settle(&key, &q, Err(FetchError::Local(emfile)), 0);
        assert!(matches!(answer, Answer::ServFail));
        let failures = |reason: &str, answered: &str| {
            metrics
                .forward_failures
                .with_label_values(&[reason, answered])
                .get()
        };
        assert_eq!(failures("local", "servfail"), 1);
        // Once the name has been answered (TTL 10 s), a failure 20 s later
        // is served stale.
        let name = hickory_proto::rr::Name::from_ascii("a.example.net.").unwrap();
        let mut answered = hickory_proto::op::Message::new();
        answered.set_message_type(hickory_proto::op::MessageType::Response);
        answered.add_query(hickory_proto::op::Query::query(
            name.clone(),
            hickory_proto::rr::RecordType::A,
        ));
        answered.add_answer(hickory_proto::rr::Record::from_rdata(
            name,
            10,
            hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A::new(192, 0, 2, 1)),
        ));
        fwd.settle(&key, &q, Ok(answered.to_vec().unwrap()), 0);
        let (answer, _) = fwd.settle(&key, &q, Err(FetchError::Overloaded), 20);
        assert!(matches!(answer, Answer::Response(_)));
        assert_eq!(failures("overloaded", "stale"), 1);
        assert_eq!(failures("local", "servfail"), 1);
    }

    fn probe() -> ParsedQuery {
        let mut m = hickory_proto::op::Message::new();
        m.add_query(hickory_proto::op::Query::query(
            hickory_proto::rr::Name::from_ascii("a.example.net.").unwrap(),
            hickory_proto::rr::RecordType::A,
        ));
        crate::message::parse(&m.to_vec().unwrap()).unwrap()
    }

    #[test]
    fn a_query_socket_binds_the_family_of_its_upstream() {
        let v4: SocketAddr = "192.0.2.1:53".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::1]:53".parse().unwrap();
        assert_eq!(any_port_for(v4), "0.0.0.0:0".parse().unwrap());
        assert_eq!(any_port_for(v6), "[::]:0".parse().unwrap());
    }
}
