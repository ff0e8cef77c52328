//! Upstreams: names resolved (and the last good answer kept), addresses
//! ordered by the balancing policy, connects tried in turn, and addresses
//! that keep failing ejected for a while.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use causeway_config::{ProxyConfig, Upstream};
use tokio::net::TcpStream;

use crate::balance::{self, Health, OpenCounts};
use crate::metrics::ProxyMetrics;
use crate::resolve::NameResolver;

/// What the proxy knows of its upstreams across connections: their names'
/// addresses, the connections open to each address, the addresses ejected
/// after failed connects, and the health checks' verdicts.
pub(crate) struct Upstreams {
    pub(crate) resolver: Resolver,
    pub(crate) outliers: Outliers,
    pub(crate) open: OpenCounts,
    pub(crate) health: Health,
}

/// Consecutive connect failures after which an address is skipped.
const FAILURES_TO_EJECT: u32 = 3;
/// How long an ejected address is skipped.
const EJECT_FOR: Duration = Duration::from_secs(10);

/// Passive outlier ejection: addresses that keep failing to connect are
/// tried last for a while.
#[derive(Default)]
pub(crate) struct Outliers {
    state: Mutex<HashMap<SocketAddr, (u32, Option<Instant>)>>,
}

impl Outliers {
    pub(crate) fn ejected(&self, addr: &SocketAddr) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .get(addr)
            .and_then(|(_, until)| *until)
            .is_some_and(|u| Instant::now() < u)
    }

    /// Records a failure; true when it ejects the address.
    pub(crate) fn failed(&self, addr: SocketAddr) -> bool {
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

/// Upstream host names are looked up at each connection through the
/// resolver's cache, so a changed address is followed once its TTL runs
/// out; the last good answer is kept for when resolution fails.
pub(crate) struct Resolver {
    /// Keyed by configured upstream, so it holds no more entries than the
    /// config has upstreams.
    known: Mutex<HashMap<String, Known>>,
    next: AtomicUsize,
    /// `None` only when the system's resolver config could not be read
    /// (said at start): names then go to the C library's resolver.
    names: Option<NameResolver>,
}

impl Resolver {
    /// Asks `servers`, or the system's when the list is empty.
    pub(crate) fn new(servers: &[SocketAddr]) -> Self {
        let names = match NameResolver::new(servers) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %e, "upstream names go to the C library's resolver, uncached");
                None
            }
        };
        Resolver {
            known: Mutex::default(),
            next: AtomicUsize::new(0),
            names,
        }
    }

    async fn lookup(&self, up: &Upstream) -> io::Result<Vec<SocketAddr>> {
        match &self.names {
            Some(names) => Ok(names
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

    pub(crate) async fn addresses(&self, up: &Upstream) -> io::Result<Vec<SocketAddr>> {
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

    /// The addresses `up` had at its last good lookup (or its fixed ones),
    /// without asking: `None` while its name has never resolved.
    pub(crate) fn known_addresses(&self, up: &Upstream) -> Option<Vec<SocketAddr>> {
        if !up.addresses.is_empty() {
            return Some(up.addresses.clone());
        }
        self.known()
            .get(&up.to_string())
            .map(|k| k.addrs.clone())
            .filter(|a| !a.is_empty())
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
    pub(crate) fn turn(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed)
    }
}

/// Connects to `addr`. With `first_bytes_ready` (the relay has bytes to
/// write the moment the connect completes: a peeked hello, a PROXY header,
/// or a client that speaks first), quick ACKs are off for the handshake,
/// so its last ACK rides on those bytes instead of going alone: one packet
/// less per connection, the upstream's accept and first read in one
/// wake-up. With nothing to send, the kernel would hold that ACK up to
/// 200 ms, which is why a listener has to say its clients speak first.
pub(crate) async fn connect_one(
    addr: SocketAddr,
    first_bytes_ready: bool,
) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    // Keepalive waits for the relay's first watchdog tick (see
    // relay::keepalive); only the no-delay a short exchange needs is set now.
    socket.set_nodelay(true)?;
    if first_bytes_ready {
        // Best effort: without it the handshake sends its ACK alone.
        let _ = socket.set_quickack(false);
    }
    match socket.connect(&addr.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    // Writable once the handshake is done. A connect that failed is also
    // reported as an error event (EPOLLERR), and only then is the socket's
    // error read: a connect that succeeds costs no getsockopt, where
    // tokio's own connect reads SO_ERROR every time.
    let ready = stream
        .ready(tokio::io::Interest::WRITABLE | tokio::io::Interest::ERROR)
        .await?;
    if ready.is_error() || ready.is_write_closed() {
        return Err(stream
            .take_error()?
            .unwrap_or_else(|| io::Error::from(io::ErrorKind::ConnectionRefused)));
    }
    Ok(stream)
}

/// Why a connect to an upstream address failed, as far as the proxy acts
/// on it; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectFailure {
    /// This process ran out of descriptors or memory: no fault of the
    /// address, and every other would fail the same way now, so the
    /// client's attempt ends and no address's health changes.
    LocalResources,
    Refused,
    /// EADDRNOTAVAIL or EADDRINUSE: no usable source address or port for
    /// this destination. The address's failure; the next one is tried.
    AddressUnavailable,
    Other,
}

impl ConnectFailure {
    /// Classifies the error of a connect from an unbound socket, as
    /// [`connect_one`] makes.
    ///
    /// EADDRNOTAVAIL from connect(2) on Linux means either that the
    /// address is not usable from this host (no source address to reach
    /// it from: an IPv6 address with IPv6 off, say) or that no ephemeral
    /// port is left. It would be tempting to call the second our own
    /// exhaustion, but an unbound socket's port is chosen per destination:
    /// a port is only unavailable if the same source address and port are
    /// already connected to this very address and port. With one ephemeral
    /// port, a second connect to A fails so while a connect to B gets that
    /// same port (the namespace test below shows it). So in both cases
    /// another address can still be reached, and steering connections
    /// away from this one for a while is the remedy; the error counts as
    /// the address's failure. EADDRINUSE (a clash of the same four-tuple)
    /// likewise. Were the proxy ever to bind a source address before
    /// connecting, a bind's EADDRINUSE would be ours again.
    pub(crate) fn of(e: &io::Error) -> Self {
        use nix::libc::{EADDRINUSE, EADDRNOTAVAIL};
        match e.raw_os_error() {
            Some(EADDRNOTAVAIL | EADDRINUSE) => ConnectFailure::AddressUnavailable,
            _ if causeway_runtime::resources::local_resources_exhausted(e) => {
                ConnectFailure::LocalResources
            }
            _ if e.kind() == io::ErrorKind::ConnectionRefused => ConnectFailure::Refused,
            _ => ConnectFailure::Other,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            ConnectFailure::LocalResources => "local_resources",
            ConnectFailure::Refused => "refused",
            ConnectFailure::AddressUnavailable => "address_unavailable",
            ConnectFailure::Other => "error",
        }
    }
}

/// Connects to the first address of `up` that answers, trying each in turn,
/// for the listener labelled `label`: its errors are counted under that
/// label, and the time of the connect that succeeds goes to
/// `connect_seconds`.
pub(crate) async fn connect(
    upstreams: &Upstreams,
    metrics: &ProxyMetrics,
    cfg: &ProxyConfig,
    label: &str,
    connect_seconds: &prometheus::Histogram,
    up: &Upstream,
    first_bytes_ready: bool,
) -> Option<(TcpStream, SocketAddr)> {
    let addrs = match upstreams.resolver.addresses(up).await {
        Ok(a) => balance::order(
            cfg.balance,
            a,
            upstreams.resolver.turn(),
            |addr| upstreams.open.get(addr),
            |addr| upstreams.outliers.ejected(addr) || upstreams.health.is_down(addr),
        ),
        Err(e) => {
            metrics
                .connect_errors
                .with_label_values(&[label, "resolve"])
                .inc();
            tracing::warn!(upstream = %up, error = %e, "cannot resolve upstream");
            return None;
        }
    };
    for addr in addrs {
        let started = Instant::now();
        let attempt =
            tokio::time::timeout(cfg.connect_timeout, connect_one(addr, first_bytes_ready)).await;
        let failure = match attempt {
            Ok(Ok(s)) => {
                upstreams.outliers.succeeded(&addr);
                connect_seconds.observe(started.elapsed().as_secs_f64());
                return Some((s, addr));
            }
            Ok(Err(e)) => {
                let failure = ConnectFailure::of(&e);
                if failure == ConnectFailure::LocalResources {
                    // Every other address would fail the same way now.
                    metrics
                        .connect_errors
                        .with_label_values(&[label, failure.label()])
                        .inc();
                    tracing::warn!(upstream = %up, address = %addr, error = %e,
                        "cannot open a connection upstream: out of local resources (the address keeps its health)");
                    return None;
                }
                failure.label()
            }
            Err(_) => "timeout",
        };
        metrics
            .connect_errors
            .with_label_values(&[label, failure])
            .inc();
        if upstreams.outliers.failed(addr) {
            metrics.ejections.with_label_values(&[label]).inc();
            tracing::warn!(upstream = %up, address = %addr, "address ejected after repeated connect failures");
        }
    }
    None
}

/// Counts a connection against its upstream address while it is open, for
/// least-connections and the per-address gauge.
pub(crate) struct OpenGuard<'a> {
    open: &'a OpenCounts,
    addr: SocketAddr,
    gauge: prometheus::IntGauge,
}

impl<'a> OpenGuard<'a> {
    pub(crate) fn new(open: &'a OpenCounts, metrics: &ProxyMetrics, addr: SocketAddr) -> Self {
        let gauge = open.opened(addr, || {
            metrics
                .upstream_open
                .with_label_values(&[addr.to_string().as_str()])
        });
        gauge.inc();
        OpenGuard { open, addr, gauge }
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.gauge.dec();
        self.open.closed(&self.addr);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Whether the upstream listener has a connection to accept right now.
    fn accept_now(listener: &std::net::TcpListener) -> Option<std::net::TcpStream> {
        listener.set_nonblocking(true).unwrap();
        match listener.accept() {
            Ok((s, _)) => Some(s),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("accept: {e}"),
        }
    }

    #[tokio::test]
    async fn with_first_bytes_ready_the_handshake_ack_waits_for_them() {
        use std::io::Read as _;
        use tokio::io::AsyncWriteExt as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();

        // Without: the handshake completes on its own (its ACK goes alone),
        // so the upstream has the connection before any byte is sent.
        let plain = connect_one(addr, false).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut accepted = accept_now(&listener);
        while accepted.is_none() && Instant::now() < deadline {
            tokio::task::yield_now().await;
            accepted = accept_now(&listener);
        }
        assert!(
            accepted.is_some(),
            "the plain connect's handshake never completed"
        );
        drop((plain, accepted));

        // With: the last ACK is held for the first bytes, so the upstream
        // cannot accept until they are written, then gets both at once.
        let started = Instant::now();
        let mut held = connect_one(addr, true).await.unwrap();
        let early = accept_now(&listener);
        if started.elapsed() < Duration::from_millis(150) {
            assert!(
                early.is_none(),
                "the upstream accepted before any byte was sent: the handshake's ACK went alone"
            );
        } else {
            // The kernel sends a held ACK after 200 ms at most: a test this
            // slow cannot tell.
            eprintln!(
                "SKIP the held-ACK check: {:?} passed before it",
                started.elapsed()
            );
        }
        held.write_all(b"hello").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut accepted = early;
        while accepted.is_none() && Instant::now() < deadline {
            tokio::task::yield_now().await;
            accepted = accept_now(&listener);
        }
        let mut upstream = accepted.expect("the upstream never got the connection");
        upstream.set_nonblocking(false).unwrap();
        upstream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut got = [0u8; 5];
        upstream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
    }

    /// How many queries are waiting on a stand-in server, taking them.
    fn take_queries(server: &std::net::UdpSocket) -> usize {
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let mut n = 0;
        while server.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    }

    #[tokio::test]
    async fn after_a_failed_lookup_the_last_answer_stands_before_asking_again() {
        let server = crate::resolve::tests::stand_in_resolver();
        let resolver = Resolver::new(&[server.local_addr().unwrap()]);
        let up = Upstream::named("api.test", 443);
        let kept = vec![SocketAddr::from(([10, 0, 0, 1], 443))];
        resolver.known().insert(
            up.to_string(),
            Known {
                addrs: kept.clone(),
                retry_at: None,
            },
        );
        // The server answers the first query with no address, and leaves
        // any other (the other address family) unanswered.
        let answering = std::thread::spawn(move || {
            crate::resolve::tests::answer_with_no_address(&server);
            server
        });
        assert_eq!(resolver.addresses(&up).await.unwrap(), kept);
        let failed_by = Instant::now();
        let server = answering.join().unwrap();
        take_queries(&server);
        assert_eq!(resolver.addresses(&up).await.unwrap(), kept);
        assert_eq!(
            take_queries(&server),
            0,
            "the servers were asked again within RETRY_AFTER"
        );
        // Held for five seconds from the failure, not more: once that has
        // passed (moved to now here, rather than waited for) the servers
        // are asked again, and the last good answer still stands while
        // they fail.
        let retry_at = resolver.known()[&up.to_string()].retry_at.unwrap();
        assert!(
            retry_at <= failed_by + Duration::from_secs(5)
                && retry_at + Duration::from_millis(500) > failed_by + Duration::from_secs(5),
            "held for {:?} after the failure",
            retry_at.saturating_duration_since(failed_by)
        );
        resolver.known().get_mut(&up.to_string()).unwrap().retry_at = Some(Instant::now());
        // Unanswered this time: the lookup ends at its query timeout.
        assert_eq!(resolver.addresses(&up).await.unwrap(), kept);
        assert!(
            take_queries(&server) > 0,
            "the servers were not asked again once RETRY_AFTER had passed"
        );
    }

    #[test]
    fn a_connect_error_is_ours_only_when_descriptors_or_memory_ran_out() {
        use nix::libc::*;
        let of = |errno| ConnectFailure::of(&io::Error::from_raw_os_error(errno));
        for errno in [EMFILE, ENFILE, ENOBUFS, ENOMEM] {
            assert_eq!(of(errno), ConnectFailure::LocalResources, "errno {errno}");
        }
        for errno in [EADDRNOTAVAIL, EADDRINUSE] {
            assert_eq!(
                of(errno),
                ConnectFailure::AddressUnavailable,
                "errno {errno} was taken for our own shortage"
            );
        }
        assert_eq!(of(ECONNREFUSED), ConnectFailure::Refused);
        for errno in [ENETUNREACH, EHOSTUNREACH, EINVAL, ECONNRESET, ETIMEDOUT] {
            assert_eq!(of(errno), ConnectFailure::Other, "errno {errno}");
        }
    }

    /// A resolver that black-holes queries must cost one new connection in
    /// RETRY_AFTER the lookup timeout, not every one: the second connection
    /// fails without asking.
    #[tokio::test]
    async fn a_name_that_never_resolved_is_not_asked_again_at_once() {
        let black_hole = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let resolver = Resolver::new(&[black_hole.local_addr().unwrap()]);
        let up = Upstream::named("never.test", 443);
        assert!(resolver.addresses(&up).await.is_err());
        assert!(take_queries(&black_hole) > 0, "the first was asked");
        let second = resolver.addresses(&up).await.unwrap_err();
        assert!(second.to_string().contains("asking again in"), "{second}");
        assert_eq!(
            take_queries(&black_hole),
            0,
            "the second connection asked again"
        );
    }
}
