//! Serving: UDP (several SO_REUSEPORT sockets per address) and TCP on every
//! configured address, a prepared-response cache in front of the
//! authority, and forwarding for the rest.

use causeway_runtime::fds::{FdBudget, Holder};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use causeway_config::DnsConfig;
use causeway_runtime::cpus;
use causeway_runtime::Shutdown;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::authority::{Authority, DynamicNames};
use crate::forward::{Client, Forwarder};
use crate::metrics::DnsMetrics;
use crate::outbound::Outbound;
use crate::prepared::Prepared;
use crate::responder::{unix_now, Responder, Step};
use causeway_runtime::endpoint::{BatchHeaders, Datagram, Endpoint, Outgoing};

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("DNS listen on {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
    #[error("DNS records: {0}")]
    Records(#[from] crate::authority::BuildError),
    #[error("DNS upstream socket: {0}")]
    Upstream(io::Error),
}

pub struct DnsServer {
    responder: Arc<Responder>,
    tasks: Vec<JoinHandle<()>>,
    /// One per UDP socket, each served by a thread of its own.
    udp: Vec<(Arc<Endpoint>, oneshot::Receiver<()>)>,
    /// What only a restart changes: the addresses, the UDP sockets and
    /// their threads, the cache's size and the bound on upstream queries.
    listen: Vec<SocketAddr>,
    udp_sockets: usize,
    pin_udp_threads: bool,
    cache: causeway_config::CacheConfig,
    max_upstream_in_flight: usize,
}

impl DnsServer {
    pub async fn start(
        cfg: &DnsConfig,
        dynamic: Arc<DynamicNames>,
        metrics: DnsMetrics,
        shutdown: Shutdown,
    ) -> Result<Self, DnsError> {
        let authority = Authority::new(cfg, dynamic.clone(), serial())?;
        let upstreams = upstreams_of(cfg);
        let forwarder = if upstreams.is_empty() {
            tracing::warn!("no DNS upstreams configured or found in /etc/resolv.conf: names outside our zones get SERVFAIL");
            None
        } else {
            tracing::info!(upstreams = ?upstreams, "DNS forwarding");
            Some(Forwarder::new(cfg, upstreams, metrics.clone()))
        };
        let responder = Arc::new(Responder {
            authority: RwLock::new(Arc::new(authority)),
            reloads: AtomicU64::new(0),
            forwarder,
            dynamic,
            metrics,
            tcp_idle: cfg.tcp_idle_timeout,
        });
        let sockets = match cfg.udp_sockets {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let usable_cpus = cpus::usable();
        let tcp_limit = Arc::new(TcpSlots::new(
            cfg.max_tcp_connections,
            cfg.max_tcp_connections_per_source,
        ));
        let runtime = tokio::runtime::Handle::current();
        // Built up as sockets are bound: when one fails, dropping this wakes
        // the UDP threads already started and stops the TCP loops.
        let mut server = DnsServer {
            responder: responder.clone(),
            tasks: Vec::new(),
            udp: Vec::new(),
            listen: cfg.listen.clone(),
            udp_sockets: cfg.udp_sockets,
            pin_udp_threads: cfg.pin_udp_threads,
            cache: cfg.cache.clone(),
            max_upstream_in_flight: cfg.max_upstream_in_flight,
        };
        for addr in &cfg.listen {
            for index in 0..sockets {
                let cpu = cpus::for_slot(index, &usable_cpus);
                let socket = udp_socket(*addr, cpu)?;
                let endpoint = Arc::new(
                    Endpoint::new(socket, HOUSEKEEPING).map_err(|e| bind_error(*addr, &e))?,
                );
                let mut outbound = match &responder.forwarder {
                    Some(fwd) => Some(
                        Outbound::new(fwd.clone(), runtime.clone()).map_err(DnsError::Upstream)?,
                    ),
                    None => None,
                };
                let (done_tx, done_rx) = oneshot::channel();
                let (responder, thread_endpoint, shutdown) =
                    (responder.clone(), endpoint.clone(), shutdown.clone());
                let pin_to = cpu.filter(|_| cfg.pin_udp_threads);
                let (running_tx, running_rx) = oneshot::channel();
                std::thread::Builder::new()
                    .name(format!("dns-udp-{index}"))
                    .spawn(move || {
                        if let Some(cpu) = pin_to {
                            // The thread serves queries either way; pinned
                            // or not only changes where it runs.
                            if let Err(e) = cpus::pin_current_thread(cpu) {
                                tracing::warn!(cpu, error = %e, "could not pin a DNS UDP thread; it runs unpinned");
                            }
                        }
                        let _ = running_tx.send(());
                        udp_thread(&responder, &thread_endpoint, outbound.as_mut(), &shutdown);
                        let _ = done_tx.send(());
                    })
                    .map_err(|e| bind_error(*addr, &e))?;
                server.udp.push((endpoint, done_rx));
                // Once start returns, every thread runs where it will stay.
                let _ = running_rx.await;
            }
            let listener = tcp_listener(*addr)?;
            server.tasks.push(tokio::spawn(tcp_loop(
                responder.clone(),
                listener,
                tcp_limit.clone(),
                shutdown.clone(),
            )));
            tracing::info!(
                listen = %addr,
                udp_sockets = sockets,
                steered_to_cpus = ?&usable_cpus[..sockets.min(usable_cpus.len())],
                threads_pinned = cfg.pin_udp_threads,
                "DNS listening on UDP and TCP"
            );
        }
        // The UDP threads block in the kernel; shutting their sockets' read
        // side is what gets them to look at the shutdown signal promptly.
        let endpoints: Vec<Arc<Endpoint>> = server.udp.iter().map(|(e, _)| e.clone()).collect();
        let stop = shutdown.clone();
        server.tasks.push(tokio::spawn(async move {
            stop.cancelled().await;
            for e in &endpoints {
                e.wake();
            }
        }));
        Ok(server)
    }

    /// Swaps in new records, views and upstreams; queries in flight finish
    /// on the old.
    pub fn reload(&self, cfg: &DnsConfig) -> Result<(), DnsError> {
        let authority = Authority::new(cfg, self.responder.dynamic.clone(), serial())?;
        *self
            .responder
            .authority
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(authority);
        let upstreams = upstreams_of(cfg);
        match &self.responder.forwarder {
            Some(fwd) => {
                if fwd.upstreams() != upstreams {
                    tracing::info!(upstreams = ?upstreams, "DNS forwarding to new upstreams");
                }
                fwd.reload(cfg, &upstreams);
            }
            None if !upstreams.is_empty() => tracing::warn!(
                "dns.upstreams given to a server started without any; restart to forward (records and views are applied)"
            ),
            None => {}
        }
        if cfg.cache != self.cache || cfg.max_upstream_in_flight != self.max_upstream_in_flight {
            tracing::warn!(
                "dns.cache or dns.maxUpstreamInFlight changed; restart to apply it (records, views and upstreams are applied)"
            );
        }
        self.responder.reloads.fetch_add(1, Ordering::AcqRel);
        if cfg.listen != self.listen {
            tracing::warn!(
                "dns.listen changed; restart to apply it (records and views are applied)"
            );
        }
        if cfg.udp_sockets != self.udp_sockets || cfg.pin_udp_threads != self.pin_udp_threads {
            tracing::warn!(
                "dns.udpSockets or dns.pinUdpThreads changed; restart to apply it (records and views are applied)"
            );
        }
        Ok(())
    }

    pub async fn wait(mut self) {
        for (_, done) in std::mem::take(&mut self.udp) {
            let _ = done.await;
        }
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
    }
}

impl causeway_runtime::Service for DnsServer {
    type Config = DnsConfig;
    type Error = DnsError;
    const NAME: &'static str = "DNS";

    async fn reload(&self, cfg: &DnsConfig) -> Result<(), DnsError> {
        DnsServer::reload(self, cfg)
    }

    /// Queries in flight are answered or dropped within the forwarding
    /// timeout; nothing here outlives the serving threads.
    async fn stop(self, _deadline: std::time::Duration) {
        self.wait().await
    }
}

impl Drop for DnsServer {
    /// A server dropped without a shutdown (a test, a start that failed
    /// half-way) must not leave its threads and tasks holding the sockets.
    /// After [`DnsServer::wait`] there is nothing left here to stop.
    fn drop(&mut self) {
        for (endpoint, _) in &self.udp {
            endpoint.wake();
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The SOA serial: seconds since the epoch, so every reload increases it.
fn serial() -> u32 {
    u32::try_from(unix_now()).unwrap_or(u32::MAX)
}

/// The upstreams a config asks: its own, then the host's resolvers when it
/// names none or asks for them too.
fn upstreams_of(cfg: &DnsConfig) -> Vec<SocketAddr> {
    let mut upstreams = cfg.upstreams.clone();
    if upstreams.is_empty() || cfg.system_upstreams {
        for a in system_resolvers() {
            if !upstreams.contains(&a) {
                upstreams.push(a);
            }
        }
    }
    upstreams
}

/// `nameserver` lines of /etc/resolv.conf, for a server given no upstreams
/// (in a pod, that is the cluster's DNS).
fn system_resolvers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

fn bind_error(addr: SocketAddr, e: &io::Error) -> DnsError {
    let reason = match e.kind() {
        io::ErrorKind::PermissionDenied => {
            format!("port {} needs CAP_NET_BIND_SERVICE", addr.port())
        }
        io::ErrorKind::AddrInUse => format!("{addr} is already in use by another process"),
        io::ErrorKind::AddrNotAvailable => format!("{} is not an address of this host", addr.ip()),
        _ => e.to_string(),
    };
    DnsError::Bind { addr, reason }
}

/// A service address that moves between HA replicas may be bound before
/// this replica holds it: queries reach the socket once it does.
fn floating_bind(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    if causeway_runtime::ha::is_floating(addr.ip()) {
        if addr.is_ipv6() {
            socket.set_freebind_ipv6(true)?;
        } else {
            socket.set_freebind(true)?;
        }
    }
    Ok(())
}

/// One socket of the address's SO_REUSEPORT group, steered to `cpu`.
fn udp_socket(addr: SocketAddr, cpu: Option<usize>) -> Result<std::net::UdpSocket, DnsError> {
    let fail = |e: io::Error| bind_error(addr, &e);
    let socket =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(fail)?;
    // Several sockets on one address, each with its own thread. Each takes
    // the queries its CPU processes (see causeway_runtime::cpus); where no
    // socket matches a CPU, the kernel spreads by hash.
    socket.set_reuse_port(true).map_err(fail)?;
    if let Some(cpu) = cpu {
        if let Err(e) = cpus::steer(SockRef::from(&socket), cpu) {
            tracing::debug!(%addr, cpu, error = %e, "UDP socket not steered to its CPU");
        }
    }
    let _ = socket.set_recv_buffer_size(4 << 20);
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(true);
    }
    floating_bind(&socket, addr).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    Ok(socket.into())
}

fn tcp_listener(addr: SocketAddr) -> Result<TcpListener, DnsError> {
    let fail = |e: io::Error| bind_error(addr, &e);
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    socket.set_reuse_address(true).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(true);
    }
    floating_bind(&socket, addr).map_err(fail)?;
    socket.bind(&addr.into()).map_err(fail)?;
    socket.listen(1024).map_err(fail)?;
    TcpListener::from_std(socket.into()).map_err(fail)
}

/// Datagrams read (and replies sent) per system call at most.
const BATCH: usize = 32;
/// How often an idle UDP thread wakes to publish its counts.
const HOUSEKEEPING: Duration = Duration::from_secs(1);

/// Serves one UDP socket until shutdown, or until the socket is shut
/// ([`Endpoint::wake`], when the server is dropped). Everything is done on
/// this thread: local answers, and forwarding on its own upstream socket
/// (`outbound`, absent when there are no upstreams).
fn udp_thread(
    responder: &Arc<Responder>,
    socket: &Arc<Endpoint>,
    mut outbound: Option<&mut Outbound>,
    shutdown: &Shutdown,
) {
    let mut headers = BatchHeaders::new(socket, BATCH);
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; 4096]).collect();
    let mut got: Vec<Datagram> = Vec::with_capacity(BATCH);
    // Reply bytes, reused from batch to batch, and where each goes.
    let mut replies: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut targets: Vec<(usize, SocketAddr, Option<Ipv4Addr>)> = Vec::with_capacity(BATCH);
    let mut prepared = Prepared::new(responder);
    let mut flushed = Instant::now();
    loop {
        if flushed.elapsed() >= HOUSEKEEPING {
            prepared.flush(responder);
            flushed = Instant::now();
        }
        // With queries upstream, wait on both sockets (and the next
        // upstream timeout); without, block on the clients' socket alone.
        let block = match outbound.as_deref_mut() {
            Some(out) if !out.is_idle() => {
                let wait = out.next_timer().map_or(HOUSEKEEPING, |at| {
                    at.saturating_duration_since(Instant::now())
                        .min(HOUSEKEEPING)
                });
                let (queries, answers) = socket
                    .poll_with(out.readiness(), wait)
                    .unwrap_or((true, true));
                if answers {
                    out.receive(responder);
                }
                out.expire(responder);
                if !queries {
                    if shutdown.is_cancelled() {
                        break;
                    }
                    continue;
                }
                false
            }
            _ => true,
        };
        match socket.recv_batch(&mut headers, &mut bufs, &mut got, block) {
            Ok(true) if !got.is_empty() => {}
            Ok(false) => break,
            // Nothing read (the wait ran out, or a woken read): the shutdown
            // signal is looked at here, off the path that serves queries.
            other => {
                if let Err(e) = other {
                    tracing::debug!(error = %e, "DNS UDP receive failed");
                }
                if shutdown.is_cancelled() {
                    break;
                }
                continue;
            }
        }
        let now = unix_now();
        targets.clear();
        for d in &got {
            let request = &bufs[d.buf][..d.len];
            let reply = &mut replies[targets.len()];
            reply.clear();
            if let Some(wire) = prepared.answer(responder, request, d.from.ip(), now) {
                reply.extend_from_slice(wire);
                targets.push((targets.len(), d.from, d.local));
                continue;
            }
            let step = responder.step(request, d.from.ip(), true);
            prepared.learn(&step, now);
            match step {
                Step::Reply { wire, .. } => {
                    reply.extend_from_slice(&wire);
                    targets.push((targets.len(), d.from, d.local));
                }
                Step::Drop => {}
                // A query is forwarded only when there are upstreams, and
                // then every thread has its outbound socket.
                Step::Forward(q, view) => {
                    if let Some(out) = outbound.as_deref_mut() {
                        out.forward(
                            responder,
                            Client::new(socket.clone(), q, view, request, d.from, d.local),
                        );
                    }
                }
            }
        }
        let out: Vec<Outgoing<'_>> = targets
            .iter()
            .map(|(k, to, local)| Outgoing {
                wire: &replies[*k],
                to: *to,
                local: *local,
            })
            .collect();
        socket.send_batch(&mut headers, &out);
    }
    if let Some(out) = outbound {
        out.abandon(responder);
    }
    prepared.flush(responder);
}

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The TCP connection slots: so many in all, and so many for one client
/// address, so one host sending a query every few seconds on many
/// connections cannot hold every slot.
struct TcpSlots {
    all: Arc<Semaphore>,
    per_source: usize,
    held: std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>,
}

/// A connection's slot, given back when dropped.
struct TcpSlot {
    slots: Arc<TcpSlots>,
    source: IpAddr,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl TcpSlots {
    fn new(all: usize, per_source: usize) -> Self {
        TcpSlots {
            all: Arc::new(Semaphore::new(all)),
            per_source,
            held: Default::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<IpAddr, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a connection from `source`, or which bound it is over.
    fn take(self: &Arc<Self>, source: IpAddr) -> Result<TcpSlot, &'static str> {
        let mut held = self.held();
        if held.get(&source).is_some_and(|n| *n >= self.per_source) {
            return Err("tcp_per_source");
        }
        // The entry is made only for a connection that gets a slot: a
        // refused one leaves nothing behind, however many sources try.
        let permit = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| "tcp_full")?;
        *held.entry(source).or_insert(0) += 1;
        Ok(TcpSlot {
            slots: self.clone(),
            source,
            _permit: permit,
        })
    }
}

impl Drop for TcpSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held();
        if let Some(n) = held.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.source);
            }
        }
    }
}

async fn tcp_loop(
    responder: Arc<Responder>,
    listener: TcpListener,
    limit: Arc<TcpSlots>,
    shutdown: Shutdown,
) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let (stream, from) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) if causeway_runtime::resources::local_resources_exhausted(&e) => {
                    // Out of descriptors or memory: the pending connection
                    // stays queued and accept would fail again at once, so
                    // trying in a loop would only burn a core. Wait, longer
                    // each time, for something to close.
                    responder.metrics.dropped.with_label_values(&["tcp_accept_starved"]).inc();
                    if backoff == ACCEPT_BACKOFF_MIN {
                        tracing::warn!(error = %e, "DNS TCP accept failed; backing off until descriptors free up");
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
                Err(_) => continue,
            },
        };
        backoff = ACCEPT_BACKOFF_MIN;
        // The accept has the descriptor already; a client the budget
        // cannot cover is closed now, before it holds one for its idle time.
        let Some(descriptor) = FdBudget::global().try_reserve(Holder::DnsTcpClient, 1) else {
            responder.metrics.tcp_refused.inc();
            responder
                .metrics
                .dropped
                .with_label_values(&["tcp_descriptors"])
                .inc();
            drop(stream);
            continue;
        };
        let permit = match limit.take(from.ip()) {
            Ok(slot) => slot,
            Err(bound) => {
                responder.metrics.tcp_refused.inc();
                if bound == "tcp_per_source" {
                    responder.metrics.dropped.with_label_values(&[bound]).inc();
                }
                drop(stream);
                continue;
            }
        };
        let (responder, shutdown) = (responder.clone(), shutdown.clone());
        tokio::spawn(async move {
            responder.metrics.tcp_connections.inc();
            let _ = tcp_connection(&responder, stream, from.ip(), shutdown).await;
            responder.metrics.tcp_connections.dec();
            drop((permit, descriptor));
        });
    }
}

/// Serves length-prefixed queries on one connection until the client
/// closes it, it idles past the timeout, or shutdown.
async fn tcp_connection(
    responder: &Responder,
    mut stream: TcpStream,
    client: IpAddr,
    shutdown: Shutdown,
) -> io::Result<()> {
    loop {
        let len = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = tokio::time::timeout(responder.tcp_idle, stream.read_u16()) => match r {
                Ok(Ok(len)) => len,
                _ => return Ok(()),
            },
        };
        let mut request = vec![0u8; usize::from(len)];
        tokio::time::timeout(responder.tcp_idle, stream.read_exact(&mut request))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        let wire = match responder.step(&request, client, false) {
            Step::Reply { wire, .. } => wire,
            Step::Drop => return Ok(()),
            Step::Forward(q, view) => responder.forward(&q, view, &request).await,
        };
        let Ok(n) = u16::try_from(wire.len()) else {
            continue;
        };
        let mut framed = Vec::with_capacity(wire.len() + 2);
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&wire);
        // A client that sends and never reads would otherwise hold its
        // connection (and one of the bounded slots) for ever.
        if tokio::time::timeout(responder.tcp_idle, stream.write_all(&framed))
            .await
            .is_err()
        {
            responder
                .metrics
                .dropped
                .with_label_values(&["tcp_write_timeout"])
                .inc();
            return Ok(());
        }
    }
}

/// Forwarding through a running server, from the UDP threads
/// ([`crate::outbound`]) and for TCP clients.
#[cfg(test)]
#[path = "forwarding_tests.rs"]
mod forwarding_tests;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use causeway_config::Config;
    use hickory_proto::op::{Message, Query, ResponseCode};
    use hickory_proto::rr::{Name, RecordType};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// With every slot taken, a flood of connections from new sources is
    /// refused without leaving an entry for each in the per-source map:
    /// refused sources cost nothing that stays.
    #[tokio::test]
    async fn sources_refused_for_a_full_server_leave_no_entry_behind() {
        let slots = Arc::new(TcpSlots::new(1, 2));
        let _held = slots.take(IpAddr::from([10, 0, 0, 1])).unwrap();
        for i in 0..10_000u32 {
            let source = IpAddr::from((0x0a01_0000 + i).to_be_bytes());
            assert_eq!(slots.take(source).err(), Some("tcp_full"));
        }
        assert_eq!(slots.held().len(), 1, "entries for refused sources");
        // The source holding its share is still counted, and refused at it.
        let again = slots.take(IpAddr::from([10, 0, 0, 1]));
        assert_eq!(again.err(), Some("tcp_full"));
        assert_eq!(slots.held().get(&IpAddr::from([10, 0, 0, 1])), Some(&1));
    }

    /// `extra` is more of the `dns:` block, each line indented by two.
    fn config(listen: &[SocketAddr], extra: &str) -> DnsConfig {
        let listen: Vec<String> = listen.iter().map(|a| format!("\"{a}\"")).collect();
        let yaml = format!(
            "cluster: {{name: hc1, baseDomain: example.com}}\n\
             dns:\n  listen: [{}]\n  proxyAddress: 192.168.100.2\n  upstreams: [\"127.0.0.1:9\"]\n  udpSockets: 2\n{extra}",
            listen.join(", ")
        );
        Config::from_yaml(&yaml).unwrap().dns.unwrap()
    }

    /// An address on 127.0.0.1 whose port is this test process's, for UDP
    /// and TCP alike (the server binds both): see `causeway_test_ports`.
    pub(crate) fn reserved_address() -> SocketAddr {
        SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            causeway_test_ports::reserved_port(),
        ))
    }

    /// A plain bind (no SO_REUSEPORT) succeeds only once no socket of the
    /// server holds the address any more.
    fn released(addr: SocketAddr) -> bool {
        std::net::UdpSocket::bind(addr).is_ok()
    }

    /// Polls, a millisecond apart and for at most 2 s, until `done`.
    async fn within_2s(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..2000 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        done()
    }

    async fn start(listen: &[SocketAddr], shutdown: Shutdown) -> Result<DnsServer, DnsError> {
        start_with(listen, "", shutdown).await.0
    }

    /// A server with `extra` in its `dns:` block, and its metrics.
    async fn start_with(
        listen: &[SocketAddr],
        extra: &str,
        shutdown: Shutdown,
    ) -> (Result<DnsServer, DnsError>, DnsMetrics) {
        let metrics = DnsMetrics::new(&prometheus::Registry::new()).unwrap();
        let names = Arc::new(DynamicNames::for_zone(None));
        let server =
            DnsServer::start(&config(listen, extra), names, metrics.clone(), shutdown).await;
        (server, metrics)
    }

    /// One query for a local name over `stream`; the reply's ID and rcode,
    /// or None when the connection is closed or says nothing in 5 s.
    async fn ask_tcp(stream: &mut TcpStream, id: u16) -> Option<(u16, ResponseCode)> {
        let mut q = Message::new();
        q.set_id(id).set_recursion_desired(true);
        q.add_query(Query::query(
            Name::from_ascii("api.hc1.example.com.").ok()?,
            RecordType::A,
        ));
        let wire = q.to_vec().ok()?;
        let mut framed = u16::try_from(wire.len()).ok()?.to_be_bytes().to_vec();
        framed.extend_from_slice(&wire);
        let exchange = async {
            stream.write_all(&framed).await.ok()?;
            let len = stream.read_u16().await.ok()?;
            let mut reply = vec![0u8; usize::from(len)];
            stream.read_exact(&mut reply).await.ok()?;
            let m = Message::from_vec(&reply).ok()?;
            Some((m.id(), m.response_code()))
        };
        tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .ok()?
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_tcp_connection_is_closed_after_the_idle_timeout() {
        let addr = reserved_address();
        let shutdown = causeway_runtime::Shutdown::new();
        let (server, metrics) = start_with(&[addr], "  tcpIdleTimeout: 300ms\n", shutdown).await;
        let _server = server.unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            ask_tcp(&mut client, 1).await,
            Some((1, ResponseCode::NoError))
        );
        let idle_from = Instant::now();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut byte))
            .await
            .expect("closed by the server within 5 s");
        assert!(matches!(read, Ok(0)), "{read:?}");
        let idle = idle_from.elapsed();
        assert!(
            idle >= Duration::from_millis(250),
            "closed after {idle:?}, inside the timeout"
        );
        assert!(within_2s(|| metrics.tcp_connections.get() == 0).await);
    }

    /// Pipelines local queries on `stream` and never reads, until the
    /// server stops reading too (its replies fill both buffers).
    async fn flood_without_reading(stream: &mut TcpStream) -> usize {
        let mut q = Message::new();
        q.set_id(7).set_recursion_desired(true);
        q.add_query(Query::query(
            Name::from_ascii("api.hc1.example.com.").unwrap(),
            RecordType::A,
        ));
        let wire = q.to_vec().unwrap();
        let mut framed = u16::try_from(wire.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&wire);
        let burst: Vec<u8> = framed.repeat(512);
        let mut sent = 0;
        // Bounded: 64 MiB of queries at most, and a write that makes no
        // progress for 500 ms means both buffers are full.
        while sent < 64 << 20 {
            match tokio::time::timeout(Duration::from_millis(500), stream.write_all(&burst)).await {
                Ok(Ok(())) => sent += burst.len(),
                _ => break,
            }
        }
        sent
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_that_never_read_lose_their_connections_after_the_write_timeout() {
        let addr = reserved_address();
        let shutdown = causeway_runtime::Shutdown::new();
        let (server, metrics) = start_with(
            &[addr],
            "  maxTcpConnections: 2\n  tcpIdleTimeout: 1s\n",
            shutdown,
        )
        .await;
        let _server = server.unwrap();
        let mut hogs = Vec::new();
        for _ in 0..2 {
            let mut hog = TcpStream::connect(addr).await.unwrap();
            assert!(flood_without_reading(&mut hog).await > 0);
            hogs.push(hog);
        }
        // Both slots are held by clients that do not read; within the write
        // timeout (and a margin) the server gives them up, and a client
        // that reads is served again.
        // A deadline rather than a count of tries: on a loaded machine each
        // refused try takes longer, and the write timeout is what is tested.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut served = false;
        let mut id = 0u16;
        while !served && std::time::Instant::now() < deadline {
            let mut c = TcpStream::connect(addr).await.unwrap();
            served = ask_tcp(&mut c, id).await.is_some();
            id = id.wrapping_add(1);
            if !served {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(served, "the slots stayed with clients that never read");
        assert!(
            metrics
                .dropped
                .with_label_values(&["tcp_write_timeout"])
                .get()
                >= 1
        );
    }

    /// One host holding connections open cannot take every slot: past its
    /// share its new connections are closed, while another host is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_source_cannot_hold_every_tcp_slot() {
        let addr = reserved_address();
        let shutdown = causeway_runtime::Shutdown::new();
        let (server, metrics) = start_with(
            &[addr],
            "  maxTcpConnections: 4\n  maxTcpConnectionsPerSource: 2\n",
            shutdown,
        )
        .await;
        let _server = server.unwrap();
        let mut held = Vec::new();
        for id in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            assert_eq!(ask_tcp(&mut c, id).await, Some((id, ResponseCode::NoError)));
            held.push(c);
        }
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            ask_tcp(&mut third, 2).await,
            None,
            "a third connection from one host was served"
        );
        assert_eq!(
            metrics.dropped.with_label_values(&["tcp_per_source"]).get(),
            1
        );
        // Another host (another loopback address) still gets a slot.
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut other = other.connect(addr).await.unwrap();
        assert_eq!(
            ask_tcp(&mut other, 3).await,
            Some((3, ResponseCode::NoError))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tcp_connections_past_the_bound_are_closed_and_counted() {
        let addr = reserved_address();
        let shutdown = causeway_runtime::Shutdown::new();
        let (server, metrics) = start_with(&[addr], "  maxTcpConnections: 2\n", shutdown).await;
        let _server = server.unwrap();
        let mut held = Vec::new();
        for id in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            assert_eq!(ask_tcp(&mut c, id).await, Some((id, ResponseCode::NoError)));
            held.push(c);
        }
        let mut third = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            ask_tcp(&mut third, 2).await,
            None,
            "a third connection was served"
        );
        assert_eq!(metrics.tcp_refused.get(), 1);
        assert_eq!(metrics.tcp_connections.get(), 2);
        // The two held go on; once one closes, a new connection is served.
        assert_eq!(
            ask_tcp(&mut held[1], 3).await,
            Some((3, ResponseCode::NoError))
        );
        drop(held.remove(0));
        let mut served = false;
        for id in 10..60 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            if ask_tcp(&mut c, id).await.is_some() {
                served = true;
                break;
            }
            // Refused because the server has not seen the close yet.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(served, "no connection served after one of the two closed");
    }

    #[tokio::test]
    async fn a_start_that_fails_half_way_releases_what_it_bound() {
        let first = reserved_address();
        // The second address's TCP port is taken, so the start fails after
        // the first address's UDP threads are running.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let second = taken.local_addr().unwrap();
        let shutdown = causeway_runtime::Shutdown::new();
        let started = start(&[first, second], shutdown).await;
        assert!(matches!(started, Err(DnsError::Bind { addr, .. }) if addr == second));
        assert!(within_2s(|| released(first)).await, "{first} still held");
    }

    #[tokio::test]
    async fn shutdown_stops_the_udp_threads_and_wait_returns() {
        let addr = reserved_address();
        let shutdown = causeway_runtime::Shutdown::new();
        let trigger = shutdown.clone();
        let server = start(&[addr], shutdown).await.unwrap();
        assert!(!released(addr));
        trigger.cancel();
        // Well inside the threads' 1 s receive timeout: the wake did it.
        tokio::time::timeout(Duration::from_millis(900), server.wait())
            .await
            .expect("the server stopped");
        assert!(within_2s(|| released(addr)).await, "{addr} still held");
    }
}
