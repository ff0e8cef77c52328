//! The proxy's I/O: listeners, the SNI peek, upstream connection with
//! failover across resolved addresses, and the byte relay with half-close.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use causeway_config::{HealthCheck, Listener, ListenerKind, ProxyConfig, Upstream};
use causeway_runtime::Shutdown;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::balance::{self, Health, OpenCounts, Transition};
use crate::hello::{peek, Peek, MAX_HELLO};
use crate::metrics::ProxyMetrics;
use crate::relay::relay;
use crate::resolve::DnsResolver;
use crate::route::{RouteError, SniRoutes};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy listen on {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
    #[error("proxy routes on {addr}: {source}")]
    Routes {
        addr: SocketAddr,
        source: RouteError,
    },
}

/// Where a listener sends a connection.
enum Routing {
    Plain(Target),
    Sni(SniRoutes<Target>),
}

impl Routing {
    /// The route labels its series carry.
    fn labels(&self) -> Vec<&str> {
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
struct Target {
    upstream: Upstream,
    /// The route label of its series.
    route: String,
    accepted: prometheus::IntCounter,
    active: prometheus::IntGauge,
}

impl Target {
    fn new(metrics: &ProxyMetrics, listener: &str, route: &str, upstream: &Upstream) -> Self {
        Target {
            upstream: upstream.clone(),
            route: route.to_string(),
            accepted: metrics.route_accepted.with_label_values(&[listener, route]),
            active: metrics.route_active.with_label_values(&[listener, route]),
        }
    }
}

/// Holds a connection in a gauge until dropped.
struct Held<'a>(&'a prometheus::IntGauge);

impl<'a> Held<'a> {
    fn new(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        Held(gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

struct ListenerState {
    listen: SocketAddr,
    label: String,
    /// Swapped whole by a reload; a connection keeps the routing it began with.
    routing: RwLock<Arc<Routing>>,
    proxy_protocol: bool,
    limit: Semaphore,
    counters: ListenerCounters,
}

/// This listener's metric series, looked up once rather than per
/// connection.
struct ListenerCounters {
    accepted: prometheus::IntCounter,
    active: prometheus::IntGauge,
    bytes_up: prometheus::IntCounter,
    bytes_down: prometheus::IntCounter,
    connect_seconds: prometheus::Histogram,
}

impl ListenerCounters {
    fn new(m: &ProxyMetrics, label: &str) -> Self {
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
    fn routing(&self) -> Arc<Routing> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn routing_of(l: &Listener, metrics: &ProxyMetrics) -> Result<Routing, ProxyError> {
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

/// Consecutive connect failures after which an address is skipped.
const FAILURES_TO_EJECT: u32 = 3;
/// How long an ejected address is skipped.
const EJECT_FOR: Duration = Duration::from_secs(10);

/// Passive outlier ejection: addresses that keep failing to connect are
/// tried last for a while.
#[derive(Default)]
struct Outliers {
    state: Mutex<HashMap<SocketAddr, (u32, Option<Instant>)>>,
}

impl Outliers {
    fn ejected(&self, addr: &SocketAddr) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .get(addr)
            .and_then(|(_, until)| *until)
            .is_some_and(|u| Instant::now() < u)
    }

    /// Records a failure; true when it ejects the address.
    fn failed(&self, addr: SocketAddr) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let entry = state.entry(addr).or_insert((0, None));
        entry.0 += 1;
        if entry.0 >= FAILURES_TO_EJECT && entry.1.is_none_or(|u| Instant::now() >= u) {
            entry.1 = Some(Instant::now() + EJECT_FOR);
            return true;
        }
        false
    }

    fn succeeded(&self, addr: &SocketAddr) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(addr);
    }
}

/// After a failed lookup, how long an upstream's name is not asked again:
/// new connections get the last good answer meanwhile, or fail at once if
/// there is none. With a resolver that black-holes queries, one connection
/// in this long waits out the lookup, not every one.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// What the lookups of one upstream's name left behind.
#[derive(Default)]
struct Known {
    /// The last good answer; empty while the name has never resolved.
    addrs: Vec<SocketAddr>,
    /// Set by a failed lookup: until when the name is not asked again.
    retry_at: Option<Instant>,
}

/// Upstream host names resolve at each connection, so a changed address is
/// followed at once; the last good answer is kept for when resolution fails.
#[derive(Default)]
struct Resolver {
    /// Keyed by configured upstream, so it holds no more entries than the
    /// config has upstreams.
    known: Mutex<HashMap<String, Known>>,
    next: AtomicUsize,
    /// Configured DNS servers, when names are not left to the system.
    dns: Option<DnsResolver>,
}

impl Resolver {
    async fn lookup(&self, up: &Upstream) -> io::Result<Vec<SocketAddr>> {
        match &self.dns {
            Some(dns) => Ok(dns
                .lookup(&up.host)
                .await?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, up.port))
                .collect()),
            None => Ok(tokio::net::lookup_host((up.host.as_str(), up.port))
                .await?
                .collect()),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn addresses(&self, up: &Upstream) -> io::Result<Vec<SocketAddr>> {
        if !up.addresses.is_empty() {
            return Ok(up.addresses.clone());
        }
        let key = up.to_string();
        if let Some(held) = self.held(&key, up) {
            return held;
        }
        let failure = match self.lookup(up).await {
            Ok(addrs) if !addrs.is_empty() => {
                self.known().insert(
                    key,
                    Known {
                        addrs: addrs.clone(),
                        retry_at: None,
                    },
                );
                return Ok(addrs);
            }
            Ok(_) => io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} has no address", up.host),
            ),
            Err(e) => e,
        };
        let mut known = self.known();
        let entry = known.entry(key).or_default();
        entry.retry_at = Some(Instant::now() + RETRY_AFTER);
        if entry.addrs.is_empty() {
            return Err(failure);
        }
        tracing::warn!(upstream = %up, error = %failure, "resolution failed; using the last good addresses");
        Ok(entry.addrs.clone())
    }

    /// Within [`RETRY_AFTER`] of a failed lookup: the last good answer, or
    /// the failure at once when there is none.
    fn held(&self, key: &str, up: &Upstream) -> Option<io::Result<Vec<SocketAddr>>> {
        let known = self.known();
        let entry = known.get(key)?;
        let left = entry
            .retry_at?
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())?;
        Some(if entry.addrs.is_empty() {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} did not resolve; asking again in {} ms",
                    up.host,
                    left.as_millis()
                ),
            ))
        } else {
            Ok(entry.addrs.clone())
        })
    }

    /// Advances the rotation that spreads connections over equal addresses.
    fn turn(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

struct Shared {
    /// Swapped whole by a reload; a connection reads it once.
    cfg: RwLock<Arc<ProxyConfig>>,
    metrics: ProxyMetrics,
    resolver: Resolver,
    outliers: Outliers,
    open: OpenCounts,
    health: Health,
    /// Connections being served, and a wake-up for the drain when the
    /// count reaches zero.
    active: AtomicUsize,
    drained: Notify,
}

impl Shared {
    fn cfg(&self) -> Arc<ProxyConfig> {
        self.cfg.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The proxy runs on threads of its own, one per core, each with a
/// single-threaded runtime, its own SO_REUSEPORT listener per port, and
/// every connection it accepted: a connection's wake-ups never cross
/// threads.
pub struct ProxyServer {
    shared: Arc<Shared>,
    listeners: Vec<Arc<ListenerState>>,
    health: JoinHandle<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Set when draining is over: the workers drop what is left.
    release_workers: watch::Sender<bool>,
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ProxyError> {
    let fail = |e: io::Error| ProxyError::Bind {
        addr,
        reason: match e.kind() {
            io::ErrorKind::PermissionDenied => {
                format!("port {} needs CAP_NET_BIND_SERVICE", addr.port())
            }
            io::ErrorKind::AddrInUse => format!("{addr} is already in use by another process"),
            io::ErrorKind::AddrNotAvailable => {
                format!("{} is not an address of this host", addr.ip())
            }
            _ => e.to_string(),
        },
    };
    let s =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    s.set_reuse_address(true).map_err(fail)?;
    // One listener per core on the same port; the kernel spreads accepts.
    s.set_reuse_port(true).map_err(fail)?;
    s.set_nonblocking(true).map_err(fail)?;
    crate::relay::keepalive(socket2::SockRef::from(&s)).map_err(fail)?;
    s.set_nodelay(true).map_err(fail)?;
    s.bind(&addr.into()).map_err(fail)?;
    s.listen(1024).map_err(fail)?;
    Ok(s.into())
}

async fn connect_one(addr: SocketAddr) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // Keepalive waits for the relay's first watchdog tick (see
    // relay::keepalive); only the no-delay a short exchange needs is set now.
    socket.set_nodelay(true)?;
    socket.connect(addr).await
}

impl ProxyServer {
    pub async fn start(
        cfg: &ProxyConfig,
        metrics: ProxyMetrics,
        shutdown: Shutdown,
    ) -> Result<Self, ProxyError> {
        let shared = Arc::new(Shared {
            cfg: RwLock::new(Arc::new(cfg.clone())),
            metrics,
            resolver: Resolver {
                dns: (!cfg.resolvers.is_empty()).then(|| DnsResolver::new(cfg.resolvers.clone())),
                ..Resolver::default()
            },
            outliers: Outliers::default(),
            open: OpenCounts::default(),
            health: Health::default(),
            active: AtomicUsize::new(0),
            drained: Notify::new(),
        });
        let mut listeners = Vec::new();
        let workers_n = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Bound here, so a port in use fails the start with its reason.
        let mut bound: Vec<Vec<(Arc<ListenerState>, std::net::TcpListener)>> =
            (0..workers_n).map(|_| Vec::new()).collect();
        for l in &cfg.listeners {
            let routing = routing_of(l, &shared.metrics)?;
            let label = l.listen.port().to_string();
            let state = Arc::new(ListenerState {
                listen: l.listen,
                counters: ListenerCounters::new(&shared.metrics, &label),
                label,
                routing: RwLock::new(Arc::new(routing)),
                proxy_protocol: l.proxy_protocol,
                limit: Semaphore::new(cfg.max_connections),
            });
            listeners.push(state.clone());
            for per_worker in &mut bound {
                per_worker.push((state.clone(), bind(l.listen)?));
            }
            tracing::info!(listen = %l.listen, "proxy listening");
        }
        let (release_workers, released) = watch::channel(false);
        let mut workers = Vec::new();
        for (i, sockets) in bound.into_iter().enumerate() {
            let (shared, shutdown, released) = (shared.clone(), shutdown.clone(), released.clone());
            let worker = std::thread::Builder::new()
                .name(format!("causeway-proxy-{i}"))
                .spawn(move || worker(shared, sockets, shutdown, released))
                .map_err(|e| ProxyError::Bind {
                    addr: cfg
                        .listeners
                        .first()
                        .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |l| l.listen),
                    reason: format!("cannot start a proxy thread: {e}"),
                })?;
            workers.push(worker);
        }
        let health = tokio::spawn(health_loop(shared.clone(), shutdown));
        Ok(ProxyServer {
            shared,
            listeners,
            health,
            workers,
            release_workers,
        })
    }

    /// Applies new routes and timeouts to the running listeners. Established
    /// connections keep their upstream; a change of listen addresses needs
    /// a restart and is reported.
    pub fn reload(&self, cfg: &ProxyConfig) -> Result<(), ProxyError> {
        let mut next = Vec::new();
        for l in &cfg.listeners {
            if let Some(state) = self.listeners.iter().find(|s| s.listen == l.listen) {
                next.push((state.clone(), routing_of(l, &self.shared.metrics)?));
            }
        }
        let same =
            cfg.listeners.len() == self.listeners.len() && next.len() == self.listeners.len();
        if !same {
            tracing::warn!(
                "proxy listeners changed; restart to open or close ports (routes are applied)"
            );
        }
        for (state, routing) in next {
            let routing = Arc::new(routing);
            let old = std::mem::replace(
                &mut *state.routing.write().unwrap_or_else(|p| p.into_inner()),
                routing.clone(),
            );
            // A removed route's series would otherwise be exported for ever
            // at their last values. Connections still on it keep counting
            // into the unexported series; the listener's gauge still has them.
            let kept = routing.labels();
            for route in old.labels().into_iter().filter(|r| !kept.contains(r)) {
                let series = [state.label.as_str(), route];
                let m = &self.shared.metrics;
                let _ = m.route_accepted.remove_label_values(&series);
                let _ = m.route_active.remove_label_values(&series);
            }
        }
        *self.shared.cfg.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg.clone());
        tracing::info!("proxy routes reloaded");
        Ok(())
    }

    /// After shutdown: the accept loops have stopped; established
    /// connections get until `deadline` to finish on their own.
    pub async fn drain(self, deadline: Duration) {
        let _ = self.health.await;
        let open = self.shared.active.load(Ordering::Acquire);
        if open > 0 {
            tracing::info!(connections = open, "draining proxied connections");
        }
        let shared = &self.shared;
        let _ = tokio::time::timeout(deadline, async {
            loop {
                let drained = shared.drained.notified();
                tokio::pin!(drained);
                // Registered before the check, so a last close between the
                // two still wakes it.
                drained.as_mut().enable();
                if shared.active.load(Ordering::Acquire) == 0 {
                    return;
                }
                drained.await;
            }
        })
        .await;
        let _ = self.release_workers.send(true);
        let workers = self.workers;
        let _ = tokio::task::spawn_blocking(move || {
            for w in workers {
                let _ = w.join();
            }
        })
        .await;
    }
}

/// One proxy thread: accepts on its own listeners until shutdown, and runs
/// its connections until they end or the drain releases it.
fn worker(
    shared: Arc<Shared>,
    sockets: Vec<(Arc<ListenerState>, std::net::TcpListener)>,
    shutdown: Shutdown,
    mut released: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start a proxy thread's runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let mut loops = Vec::new();
        for (state, socket) in sockets {
            match TcpListener::from_std(socket) {
                Ok(listener) => loops.push(tokio::spawn(accept_loop(
                    shared.clone(),
                    state,
                    listener,
                    shutdown.clone(),
                ))),
                Err(e) => tracing::error!(listen = %state.listen, error = %e, "cannot register a proxy listener"),
            }
        }
        for l in loops {
            let _ = l.await;
        }
        // Accepting is over; the connections on this thread go on until
        // the drain is done with them (or the server is dropped).
        let _ = released.wait_for(|r| *r).await;
    });
}

async fn accept_loop(
    shared: Arc<Shared>,
    state: Arc<ListenerState>,
    listener: TcpListener,
    mut shutdown: Shutdown,
) {
    loop {
        let (client, from) = tokio::select! {
            _ = shutdown.wait() => return,
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
        let Ok(permit) = state.limit.try_acquire() else {
            shared
                .metrics
                .refused
                .with_label_values(&[state.label.as_str()])
                .inc();
            drop(client);
            continue;
        };
        permit.forget();
        let (shared, state) = (shared.clone(), state.clone());
        tokio::spawn(async move {
            shared.active.fetch_add(1, Ordering::AcqRel);
            state.counters.accepted.inc();
            {
                let _open = Held::new(&state.counters.active);
                handle(&shared, &state, client, from).await;
            }
            state.limit.add_permits(1);
            if shared.active.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.drained.notify_waiters();
            }
        });
    }
}

/// How one connection went, for the access log.
struct Outcome {
    route: String,
    upstream: Option<SocketAddr>,
    up_bytes: u64,
    down_bytes: u64,
    reason: &'static str,
}

async fn handle(shared: &Shared, state: &ListenerState, mut client: TcpStream, from: SocketAddr) {
    let started = Instant::now();
    let outcome = serve(shared, state, &mut client).await;
    tracing::info!(
        target: "causeway::access",
        client = %from,
        listener = %state.listen,
        route = if outcome.route.is_empty() { "-" } else { outcome.route.as_str() },
        upstream = outcome.upstream.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
        bytes_up = outcome.up_bytes,
        bytes_down = outcome.down_bytes,
        duration_ms = started.elapsed().as_millis() as u64,
        reason = outcome.reason,
        "connection closed"
    );
}

async fn serve(shared: &Shared, state: &ListenerState, client: &mut TcpStream) -> Outcome {
    let mut out = Outcome {
        route: String::new(),
        upstream: None,
        up_bytes: 0,
        down_bytes: 0,
        reason: "closed",
    };
    let label = state.label.as_str();
    let cfg = shared.cfg();
    let routing = state.routing();
    let mut peeked = Vec::new();
    let target = match routing.as_ref() {
        Routing::Plain(u) => u,
        Routing::Sni(routes) => {
            let found =
                tokio::time::timeout(cfg.hello_timeout, read_hello(client, &mut peeked)).await;
            let p = match found {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => {
                    out.reason = "client_closed_before_hello";
                    return out;
                }
                Err(_) => {
                    shared
                        .metrics
                        .sni_failures
                        .with_label_values(&[label, "hello_timeout"])
                        .inc();
                    out.reason = "hello_timeout";
                    return out;
                }
            };
            match &p {
                Peek::Sni(name) => out.route = name.clone(),
                Peek::NoSni => out.route = "(no sni)".into(),
                Peek::NotTls(why) => {
                    shared
                        .metrics
                        .sni_failures
                        .with_label_values(&[label, why.label()])
                        .inc();
                    out.route = "(not tls)".into();
                }
                Peek::NeedMore => {}
            }
            match routes.choose(&p) {
                Some(u) => u,
                None => {
                    shared
                        .metrics
                        .connect_errors
                        .with_label_values(&[label, "no_route"])
                        .inc();
                    out.reason = "no_route";
                    return out;
                }
            }
        }
    };
    target.accepted.inc();
    let _routed = Held::new(&target.active);
    let target = &target.upstream;
    // Only the access log reads it: no formatting when that is off.
    if out.route.is_empty() && tracing::enabled!(target: "causeway::access", tracing::Level::INFO) {
        out.route = target.to_string();
    }
    let Some((mut upstream, addr)) = connect(shared, state, &cfg, target).await else {
        out.reason = "connect_failed";
        return out;
    };
    out.upstream = Some(addr);
    let _counted = OpenGuard::new(shared, addr);
    if state.proxy_protocol {
        let local = client.local_addr().unwrap_or(state.listen);
        let from = client.peer_addr().unwrap_or(local);
        peeked.splice(0..0, crate::proxy_protocol::header_v2(from, local));
    }
    if !peeked.is_empty() {
        if upstream.write_all(&peeked).await.is_err() {
            out.reason = "upstream_write_failed";
            return out;
        }
        out.up_bytes += peeked.len() as u64;
    }
    let relayed = relay(client, &upstream, cfg.idle_timeout).await;
    out.up_bytes += relayed.up;
    out.down_bytes = relayed.down;
    out.reason = relayed.ended.label();
    state.counters.bytes_up.inc_by(out.up_bytes);
    state.counters.bytes_down.inc_by(out.down_bytes);
    out
}

/// Reads the client's first bytes until the hello's name is known.
async fn read_hello(client: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Peek> {
    loop {
        let p = peek(buf);
        if p != Peek::NeedMore {
            return Ok(p);
        }
        if buf.len() >= MAX_HELLO {
            return Ok(peek(buf));
        }
        client.readable().await?;
        let n = match read_into(client, buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // The client sent what it will send: whatever it is goes to
            // the default route.
            return Ok(match peek(buf) {
                Peek::NeedMore => Peek::NotTls(crate::hello::NotTls::Malformed),
                p => p,
            });
        }
    }
}

/// Appends what is ready, never past [`MAX_HELLO`]. The read goes through
/// the thread's scratch buffer, so a client that has sent nothing yet costs
/// no buffer in its task.
fn read_into(client: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let room = MAX_HELLO.saturating_sub(buf.len()).max(1);
    crate::relay::with_scratch(|scratch| {
        let take = room.min(scratch.len());
        let n = client.try_read(&mut scratch[..take])?;
        buf.extend_from_slice(&scratch[..n]);
        Ok(n)
    })
}

/// Connects to the first address of `up` that answers, trying each in turn.
async fn connect(
    shared: &Shared,
    state: &ListenerState,
    cfg: &ProxyConfig,
    up: &Upstream,
) -> Option<(TcpStream, SocketAddr)> {
    let label = state.label.as_str();
    let addrs = match shared.resolver.addresses(up).await {
        Ok(a) => balance::order(
            cfg.balance,
            a,
            shared.resolver.turn(),
            |addr| shared.open.get(addr),
            |addr| shared.outliers.ejected(addr) || shared.health.is_down(addr),
        ),
        Err(e) => {
            shared
                .metrics
                .connect_errors
                .with_label_values(&[label, "resolve"])
                .inc();
            tracing::warn!(upstream = %up, error = %e, "cannot resolve upstream");
            return None;
        }
    };
    for addr in addrs {
        let started = Instant::now();
        let attempt = tokio::time::timeout(cfg.connect_timeout, connect_one(addr)).await;
        if let Ok(Err(e)) = &attempt {
            if causeway_runtime::resources::local_resources_exhausted(e) {
                // Our descriptors, memory or ports ran out: no fault of this
                // address, and every other would fail the same way now.
                shared
                    .metrics
                    .connect_errors
                    .with_label_values(&[label, "local_resources"])
                    .inc();
                tracing::warn!(upstream = %up, address = %addr, error = %e,
                    "cannot open a connection upstream: out of local resources (the address keeps its health)");
                return None;
            }
        }
        if !matches!(attempt, Ok(Ok(_))) && shared.outliers.failed(addr) {
            shared.metrics.ejections.with_label_values(&[label]).inc();
            tracing::warn!(upstream = %up, address = %addr, "address ejected after repeated connect failures");
        }
        match attempt {
            Ok(Ok(s)) => {
                shared.outliers.succeeded(&addr);
                state
                    .counters
                    .connect_seconds
                    .observe(started.elapsed().as_secs_f64());
                return Some((s, addr));
            }
            Ok(Err(e)) => {
                let reason = match e.kind() {
                    io::ErrorKind::ConnectionRefused => "refused",
                    _ => "error",
                };
                shared
                    .metrics
                    .connect_errors
                    .with_label_values(&[label, reason])
                    .inc();
            }
            Err(_) => shared
                .metrics
                .connect_errors
                .with_label_values(&[label, "timeout"])
                .inc(),
        }
    }
    None
}

/// Counts a connection against its upstream address while it is open, for
/// least-connections and the per-address gauge.
struct OpenGuard<'a> {
    shared: &'a Shared,
    addr: SocketAddr,
    gauge: prometheus::IntGauge,
}

impl<'a> OpenGuard<'a> {
    fn new(shared: &'a Shared, addr: SocketAddr) -> Self {
        let gauge = shared.open.opened(addr, || {
            shared
                .metrics
                .upstream_open
                .with_label_values(&[addr.to_string().as_str()])
        });
        gauge.inc();
        OpenGuard {
            shared,
            addr,
            gauge,
        }
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
        self.shared.open.closed(&self.addr);
    }
}

/// Every upstream the listeners may send to.
fn upstreams_of(cfg: &ProxyConfig) -> Vec<Upstream> {
    let mut all: Vec<Upstream> = Vec::new();
    for l in &cfg.listeners {
        match &l.kind {
            ListenerKind::Plain(u) => all.push(u.clone()),
            ListenerKind::Sni { routes, default } => {
                all.extend(routes.iter().map(|(_, u)| u.clone()));
                all.extend(default.iter().cloned());
            }
        }
    }
    all.dedup();
    all
}

/// Active health checks: each interval, a TCP connect to every address of
/// every upstream, all at once; the config is re-read each round so a
/// reload can turn checks on, off or retime them.
async fn health_loop(shared: Arc<Shared>, mut shutdown: Shutdown) {
    let mut checking = false;
    loop {
        let cfg = shared.cfg();
        let pause = match cfg.health_check {
            Some(rule) => {
                checking = true;
                check_round(&shared, &cfg, &rule).await;
                rule.interval
            }
            None => {
                // Checks just turned off by a reload: forget their verdicts.
                if std::mem::take(&mut checking) {
                    shared.health.retain(|_| false);
                    shared.metrics.upstream_down.reset();
                }
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

async fn check_round(shared: &Shared, cfg: &ProxyConfig, rule: &HealthCheck) {
    let mut checks = tokio::task::JoinSet::new();
    let mut checked = HashSet::new();
    for up in upstreams_of(cfg) {
        let addrs = match shared.resolver.addresses(&up).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(upstream = %up, error = %e, "health check cannot resolve upstream");
                continue;
            }
        };
        for addr in addrs {
            if checked.insert(addr) {
                let timeout = rule.timeout;
                checks.spawn(async move {
                    let ok = matches!(
                        tokio::time::timeout(timeout, TcpStream::connect(addr)).await,
                        Ok(Ok(_))
                    );
                    (addr, ok)
                });
            }
        }
    }
    while let Some(done) = checks.join_next().await {
        let Ok((addr, ok)) = done else { continue };
        let label = addr.to_string();
        shared
            .metrics
            .health_checks
            .with_label_values(&[label.as_str(), if ok { "ok" } else { "failed" }])
            .inc();
        match shared.health.record(addr, ok, rule) {
            Some(Transition::Down) => {
                shared
                    .metrics
                    .upstream_down
                    .with_label_values(&[label.as_str()])
                    .set(1);
                tracing::warn!(address = %addr, "upstream address down: failed its health checks");
            }
            Some(Transition::Up) => {
                shared
                    .metrics
                    .upstream_down
                    .with_label_values(&[label.as_str()])
                    .set(0);
                tracing::info!(address = %addr, "upstream address up again: passed its health checks");
            }
            None => {}
        }
    }
    shared.health.retain(|a| checked.contains(a));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The route labels the registry exports, as Prometheus text.
    fn exported_routes(registry: &prometheus::Registry) -> String {
        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&registry.gather(), &mut text)
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with("causeway_proxy_route_"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[tokio::test]
    async fn a_reload_stops_exporting_the_series_of_removed_routes() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = |pattern: &str| {
            causeway_config::Config::from_yaml(&format!(
                "proxy:\n  listenAddress: 127.0.0.1\n  listeners:\n    - port: {port}\n      routes: [{{sni: {pattern}, upstream: \"127.0.0.1:9\"}}]\n      default: \"127.0.0.1:9\"\n"
            ))
            .unwrap()
            .proxy
            .unwrap()
        };
        let registry = prometheus::Registry::new();
        let (trigger, shutdown) = causeway_runtime::shutdown::channel();
        let server = ProxyServer::start(
            &cfg("old.test"),
            ProxyMetrics::new(&registry).unwrap(),
            shutdown,
        )
        .await
        .unwrap();
        let before = exported_routes(&registry);
        assert!(before.contains("route=\"old.test\""), "{before}");
        assert!(before.contains("route=\"default\""), "{before}");
        server.reload(&cfg("new.test")).unwrap();
        let after = exported_routes(&registry);
        assert!(after.contains("route=\"new.test\""), "{after}");
        assert!(!after.contains("route=\"old.test\""), "{after}");
        assert!(
            after.contains("route=\"default\""),
            "a route the reload kept lost its series: {after}"
        );
        trigger.trigger();
        server.drain(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn after_a_failed_lookup_the_last_answer_stands_before_asking_again() {
        let server = crate::resolve::tests::stand_in_resolver();
        let resolver = Resolver {
            dns: Some(DnsResolver::new(vec![server.local_addr().unwrap()])),
            ..Resolver::default()
        };
        let up = Upstream::named("api.test", 443);
        let kept = vec![SocketAddr::from(([10, 0, 0, 1], 443))];
        resolver.known().insert(
            up.to_string(),
            Known {
                addrs: kept.clone(),
                retry_at: None,
            },
        );
        // The server answers, with no address.
        let answering = std::thread::spawn(move || {
            crate::resolve::tests::answer_with_no_address(&server);
            server
        });
        assert_eq!(resolver.addresses(&up).await.unwrap(), kept);
        let server = answering.join().unwrap();
        assert_eq!(resolver.addresses(&up).await.unwrap(), kept);
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        assert!(
            server.recv_from(&mut buf).is_err(),
            "the servers were asked again within RETRY_AFTER"
        );
    }

    /// A resolver that black-holes queries must cost one new connection in
    /// RETRY_AFTER the lookup timeout, not every one: the second connection
    /// fails without asking.
    #[tokio::test]
    async fn a_name_that_never_resolved_is_not_asked_again_at_once() {
        let black_hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let resolver = Resolver {
            dns: Some(DnsResolver::new(vec![black_hole.local_addr().unwrap()])),
            ..Resolver::default()
        };
        let up = Upstream::named("never.test", 443);
        assert!(resolver.addresses(&up).await.is_err());
        let second = resolver.addresses(&up).await.unwrap_err();
        assert!(second.to_string().contains("asking again in"), "{second}");
        black_hole.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        assert!(
            black_hole.recv_from(&mut buf).is_ok(),
            "the first was asked"
        );
        assert!(
            black_hole.recv_from(&mut buf).is_err(),
            "the second connection asked again"
        );
    }

    /// Keepalive and no-delay are set once on the listener: the accepted
    /// socket must have inherited them, or clients would go without.
    #[tokio::test]
    async fn accepted_sockets_inherit_keepalive_and_nodelay() {
        let listener =
            TcpListener::from_std(bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.keepalive().unwrap());
        assert!(sock.nodelay().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), Duration::from_secs(60));

        let upstream = connect_one(addr).await.unwrap();
        let sock = socket2::SockRef::from(&upstream);
        assert!(sock.nodelay().unwrap());
        assert!(!sock.keepalive().unwrap(), "set later, by the relay");
    }
}
