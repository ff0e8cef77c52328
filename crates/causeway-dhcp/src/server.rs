//! Socket I/O around the engine: bind, receive, decode, hand to the engine,
//! and send each reply once its lease is durable.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use causeway_config::{DhcpConfig, DhcpListen};
use causeway_runtime::endpoint::{BatchHeaders, Endpoint};
use causeway_runtime::readiness::ReadyHandle;
use causeway_runtime::Shutdown;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::task::JoinHandle;

use crate::clock::{self, unix_secs, ClockCheck, LeaseClock};
use crate::engine::{Destination, Engine, Ignored, Ingress, Outcome, CLIENT_PORT, SERVER_PORT};
use crate::lease::LeaseObserver;
use crate::lease::{Lease, LeaseRecord};
use crate::lease6::Leases6;
use crate::metrics::{message_type_label, DhcpMetrics};
use crate::store::{HealthObserver, LeaseStore, StoreError};
use crate::v6::{Ignored6, Relayed};
use crate::wire;

#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("DHCP listen {what}: {reason}")]
    Bind { what: String, reason: String },
}

/// Everything the receive tasks and the store's completions share.
struct Shared {
    engine: Mutex<Engine>,
    metrics: DhcpMetrics,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    last_exhausted_warning: AtomicU64,
    /// Sources whose relayed packets were dropped as from no listed relay,
    /// and when that was last logged: one warning per source and ten
    /// minutes, however many packets.
    warned_relays: Mutex<HashMap<Ipv4Addr, u64>>,
    store: LeaseStore,
    observer: Option<LeaseObserver>,
    /// Unset until the wall clock is no longer behind the lease file.
    clock: Arc<LeaseClock>,
    /// Whether the wall clock offset has been reported, so a step is
    /// logged once rather than every tick.
    offset_reported: std::sync::atomic::AtomicBool,
    /// Seconds the lease clock was anchored behind this machine's wall
    /// clock at start, to match a peer's (not a step of the wall clock).
    anchored_behind: AtomicU64,
    /// Stateful DHCPv6: its leases live in this server's store.
    v6: Mutex<V6Side>,
}

/// The DHCPv6 half of a server's leases.
struct V6Side {
    leases: Option<Leases6>,
    /// v6 records recovered (or adopted) before DHCPv6 was configured.
    waiting: Vec<LeaseRecord>,
}

/// Where records adopted from a rejoining standby's log go.
enum AdoptInto {
    Early(Vec<LeaseRecord>),
    Server(std::sync::Weak<Shared>),
}

impl Shared {
    /// Takes records a rejoining standby's log held and this replica's
    /// lacked (already durable here).
    fn adopt(&self, records: &[LeaseRecord]) {
        if records.is_empty() {
            return;
        }
        self.engine().adopt(records);
        {
            let mut v6 = self.v6();
            match &mut v6.leases {
                Some(l) => l.adopt(records),
                None => v6
                    .waiting
                    .extend(records.iter().filter(|r| r.ip.is_ipv6()).cloned()),
            }
        }
        if let Some(observe) = &self.observer {
            for r in records {
                observe(r);
            }
        }
    }

    fn v6(&self) -> MutexGuard<'_, V6Side> {
        self.v6.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn engine(&self) -> MutexGuard<'_, Engine> {
        // The engine's state stays consistent across a panic in a reader
        // (there are none on input paths); keep serving rather than abort.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct DhcpServer {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    /// One receiving thread per listener (see [`receive_batches`]).
    receivers: Vec<std::thread::JoinHandle<()>>,
    listen: Vec<DhcpListen>,
}

/// The wall clock in unix seconds; the engine runs on [`LeaseClock`].
pub fn unix_now() -> u64 {
    unix_secs(SystemTime::now())
}

impl DhcpServer {
    /// Recovers the lease store, binds every listener and starts serving.
    /// `ready` is set once serving, and follows the lease store's health
    /// from then on: a store that cannot make leases durable acknowledges
    /// nothing, and the service is not ready.
    pub async fn start(
        cfg: &DhcpConfig,
        metrics: DhcpMetrics,
        shutdown: Shutdown,
        observer: Option<LeaseObserver>,
        ready: ReadyHandle,
    ) -> Result<Self, DhcpError> {
        DhcpServer::start_replicated(cfg, metrics, shutdown, observer, ready, None).await
    }

    /// As [`DhcpServer::start`], with every lease batch also confirmed by
    /// the standby `replica` serves before its ACKs leave.
    pub async fn start_replicated(
        cfg: &DhcpConfig,
        metrics: DhcpMetrics,
        shutdown: Shutdown,
        observer: Option<LeaseObserver>,
        ready: ReadyHandle,
        replica: Option<Arc<crate::replica::Replicator>>,
    ) -> Result<Self, DhcpError> {
        // The store's health and the end of start-up both set readiness;
        // one lock keeps a late `true` from hiding an early failure.
        let store_healthy = Arc::new(Mutex::new(true));
        let lease_clock = Arc::new(LeaseClock::default());
        let health: HealthObserver = {
            let (store_healthy, ready) = (store_healthy.clone(), ready.clone());
            let lease_clock = lease_clock.clone();
            Box::new(move |healthy| {
                let mut state = store_healthy.lock().unwrap_or_else(|p| p.into_inner());
                *state = healthy;
                ready.set(healthy && lease_clock.now().is_some());
            })
        };
        // Read before the store opens: cutting a torn tail off rewrites it.
        let last_write = std::fs::metadata(&cfg.lease_file)
            .and_then(|m| m.modified())
            .ok()
            .map(unix_secs);
        // A standby may join as soon as the store opens, before the engine
        // exists: what its log adds waits here until the engine does.
        let adopt_into = Arc::new(Mutex::new(AdoptInto::Early(Vec::new())));
        if let Some(r) = &replica {
            let target = adopt_into.clone();
            r.set_adopter(Some(Box::new(move |records: &[LeaseRecord]| {
                let mut target = target.lock().unwrap_or_else(|p| p.into_inner());
                match &mut *target {
                    AdoptInto::Early(held) => held.extend_from_slice(records),
                    AdoptInto::Server(shared) => {
                        if let Some(shared) = shared.upgrade() {
                            shared.adopt(records);
                        }
                    }
                }
            })));
        }
        let peer_wall = replica.clone();
        let (store, recovery) = LeaseStore::open_replicated(
            &cfg.lease_file,
            Some(metrics.clone()),
            Some(health),
            replica,
        )?;
        let mut engine = Engine::new(cfg);
        let skipped = engine.restore(&recovery.records);
        let corrupt = recovery.corrupt_lines + skipped;
        let unreadable = recovery.unreadable_newest();
        metrics.corrupt_lines.inc_by(corrupt as u64);
        if corrupt > 0 {
            tracing::warn!(
                path = %cfg.lease_file.display(),
                corrupt_lines = corrupt,
                "lease log lines skipped: not JSON, or a client id that is not hex \
                 (see causeway_dhcp_store_corrupt_lines_total)"
            );
        }
        tracing::info!(
            path = %cfg.lease_file.display(),
            records = recovery.records.len(),
            leases = engine.lease_count(),
            corrupt_lines = corrupt,
            torn_tail_bytes = recovery.torn_tail_bytes,
            "lease store recovered"
        );
        let waiting: Vec<LeaseRecord> = recovery
            .records
            .iter()
            .filter(|r| r.ip.is_ipv6())
            .cloned()
            .collect();
        drop(recovery);
        if let Some(observe) = &observer {
            for lease in engine.leases() {
                observe(&lease.to_record());
            }
        }
        let shared = Arc::new(Shared {
            engine: Mutex::new(engine),
            metrics,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(cfg.max_in_flight),
            last_exhausted_warning: AtomicU64::new(0),
            warned_relays: Mutex::new(HashMap::new()),
            store,
            observer,
            clock: lease_clock,
            offset_reported: std::sync::atomic::AtomicBool::new(false),
            anchored_behind: AtomicU64::new(0),
            v6: Mutex::new(V6Side {
                leases: None,
                waiting,
            }),
        });
        {
            let mut target = adopt_into.lock().unwrap_or_else(|p| p.into_inner());
            if let AdoptInto::Early(held) = &*target {
                shared.adopt(held);
            }
            *target = AdoptInto::Server(Arc::downgrade(&shared));
        }
        let gate = Gate {
            peer_wall,
            last_write,
            tolerance: cfg.clock_behind_tolerance,
            store_healthy: store_healthy.clone(),
            ready: ready.clone(),
            unreadable: unreadable
                .iter()
                .filter_map(|ip| match ip {
                    std::net::IpAddr::V4(v4) => Some(*v4),
                    std::net::IpAddr::V6(_) => None,
                })
                .collect(),
        };
        let open = gate.try_open(&shared, true);
        let mut tasks = Vec::new();
        let mut receivers = Vec::new();
        for listen in &cfg.listen {
            let (endpoint, sender, ingress) = bind(listen)?;
            tracing::info!(listen = ?listen, "DHCP listening");
            let endpoint = Arc::new(endpoint);
            let receiving = {
                let (shared, endpoint) = (Arc::downgrade(&shared), endpoint.clone());
                std::thread::Builder::new()
                    .name("dhcp-receive".into())
                    .spawn(move || receive_batches(shared, &endpoint, &Arc::new(sender), &ingress))
                    .map_err(|e| DhcpError::Bind {
                        what: format!("{listen:?}"),
                        reason: format!("cannot start its receiving thread: {e}"),
                    })?
            };
            receivers.push(receiving);
            let shutdown = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                shutdown.cancelled().await;
                endpoint.wake();
            }));
        }
        if !open {
            tasks.push(tokio::spawn(gate.wait(shared.clone(), shutdown.clone())));
        }
        tasks.push(tokio::spawn(housekeeping(shared.clone(), shutdown)));
        Ok(DhcpServer {
            shared,
            tasks,
            receivers,
            listen: cfg.listen.clone(),
        })
    }

    /// Applies a new config to the running engine. Leases are kept; a change
    /// of listeners needs a restart and is reported.
    pub fn reload(&self, cfg: &DhcpConfig) -> Result<(), DhcpError> {
        if cfg.listen != self.listen {
            tracing::warn!(
                "dhcp.listen changed; restart to apply it (the rest of the change is applied)"
            );
        }
        self.shared
            .max_in_flight
            .store(cfg.max_in_flight, Ordering::Relaxed);
        self.shared.engine().reconfigure(cfg);
        Ok(())
    }

    /// Serves stateful DHCPv6 through `port` from this server's store.
    pub fn serve_v6(&self, port: &V6Port) {
        port.attach(&self.shared);
    }

    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.lease_source()()
    }

    /// A cheap handle for the admin server's `/leases`.
    pub fn lease_source(&self) -> impl Fn() -> Vec<LeaseRecord> + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || {
            // The engine lock is held for a copy of the table only (a
            // memcpy per lease for most client keys); formatting the
            // records and sorting them run after it is released, so a
            // large table never stalls the DHCP path.
            let snapshot: Vec<Lease> = shared.engine().leases().cloned().collect();
            let mut out: Vec<LeaseRecord> = snapshot.iter().map(Lease::to_record).collect();
            if let Some(l) = &shared.v6().leases {
                out.extend(l.records());
            }
            out.sort_unstable_by_key(|r| r.ip);
            out
        }
    }

    /// Waits for the tasks (already told to stop by the shutdown signal),
    /// then lets the store write out everything queued.
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
        // Woken by the shutdown above, each finishes the packet in hand.
        let receivers = self.receivers;
        let _ = tokio::task::spawn_blocking(move || {
            for r in receivers {
                let _ = r.join();
            }
        })
        .await;
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.store.flush()).await;
    }
}

/// How long a receiving thread blocks with nothing to read before it looks
/// again whether its server is still there (a server dropped without a
/// shutdown, as a test may).
const RECEIVE_WAIT: Duration = Duration::from_millis(500);

fn bind(listen: &DhcpListen) -> Result<(Endpoint, std::net::UdpSocket, Ingress), DhcpError> {
    let what = match listen {
        DhcpListen::Interface(name) => format!("on interface {name}"),
        DhcpListen::Address(a) => format!("on {a}"),
    };
    let fail = |reason: String| DhcpError::Bind {
        what: what.clone(),
        reason,
    };
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| fail(e.to_string()))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| fail(e.to_string()))?;
    socket
        .set_broadcast(true)
        .map_err(|e| fail(e.to_string()))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| fail(e.to_string()))?;
    // Bursts of thousands of clients booting at once must queue, not drop.
    let _ = socket.set_recv_buffer_size(4 << 20);
    let _ = socket.set_send_buffer_size(4 << 20);
    let (addr, ingress) = match listen {
        DhcpListen::Interface(name) => {
            socket.bind_device(Some(name.as_bytes())).map_err(|e| {
                fail(match e.raw_os_error() {
                    // EPERM
                    Some(1) => {
                        "binding to an interface needs CAP_NET_RAW (run as root or grant the capability)".to_string()
                    }
                    // ENODEV
                    Some(19) => format!("interface {name} does not exist"),
                    _ => e.to_string(),
                })
            })?;
            (
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER_PORT),
                Ingress::Interface(name.clone()),
            )
        }
        DhcpListen::Address(a) => (*a, Ingress::Address),
    };
    socket.bind(&SocketAddr::V4(addr).into()).map_err(|e| {
        fail(match e.kind() {
            io::ErrorKind::PermissionDenied => {
                format!(
                    "port {} needs CAP_NET_BIND_SERVICE (run as root or grant the capability)",
                    addr.port()
                )
            }
            io::ErrorKind::AddrInUse => format!("{addr} is already in use by another process"),
            io::ErrorKind::AddrNotAvailable => {
                format!("{} is not an address of this host", addr.ip())
            }
            _ => e.to_string(),
        })
    })?;
    let std_socket: std::net::UdpSocket = socket.into();
    let sender = std_socket.try_clone().map_err(|e| fail(e.to_string()))?;
    // The endpoint makes the socket blocking; replies are sent without
    // waiting all the same (MSG_DONTWAIT in `send_now`).
    let endpoint = Endpoint::new(std_socket, RECEIVE_WAIT).map_err(|e| fail(e.to_string()))?;
    Ok((endpoint, sender, ingress))
}

/// Sends from `source` (the reply's server identifier) where the host holds
/// it: a socket on an interface otherwise sends from the interface's first
/// address, and under HA the server identifier is the service address the
/// active holds beside its own.
///
/// Never waits: a reply that finds the send buffer full is lost, as any
/// UDP reply may be (the socket itself blocks, for its receiving thread).
fn send_now(
    sender: &std::net::UdpSocket,
    bytes: &[u8],
    to: SocketAddrV4,
    source: Option<Ipv4Addr>,
) -> io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};
    use std::os::fd::AsRawFd;
    let info = source.map(|source| libc::in_pktinfo {
        ipi_ifindex: 0,
        ipi_spec_dst: libc::in_addr {
            s_addr: u32::from(source).to_be(),
        },
        ipi_addr: libc::in_addr { s_addr: 0 },
    });
    let cmsg = info.as_ref().map(ControlMessage::Ipv4PacketInfo);
    let dest = SockaddrIn::from(to);
    sendmsg(
        sender.as_raw_fd(),
        &[io::IoSlice::new(bytes)],
        cmsg.as_slice(),
        MsgFlags::MSG_DONTWAIT,
        Some(&dest),
    )
    .map_err(io::Error::from)
}

fn send(
    sender: &std::net::UdpSocket,
    metrics: &DhcpMetrics,
    bytes: &[u8],
    dest: Destination,
    source: Option<Ipv4Addr>,
    kind: &'static str,
    received: Instant,
) {
    let to = match dest {
        Destination::Unicast(a) => a,
        Destination::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT),
    };
    // An address not (yet) on the host cannot be the source: the kernel's
    // choice is then the best there is.
    let sent = match source {
        Some(_) => {
            send_now(sender, bytes, to, source).or_else(|_| send_now(sender, bytes, to, None))
        }
        None => send_now(sender, bytes, to, None),
    };
    match sent {
        Ok(_) => {
            metrics.sent.with_label_values(&[kind]).inc();
            metrics
                .reply_seconds
                .with_label_values(&[kind])
                .observe(received.elapsed().as_secs_f64());
        }
        Err(e) => {
            metrics.dropped.with_label_values(&["send_failed"]).inc();
            tracing::debug!(to = %to, error = %e, "reply not sent");
        }
    }
}

/// Reads one listener's datagrams in batches (one recvmmsg for every
/// datagram queued) on a thread of its own, blocking in the kernel between
/// them: no event loop registration, no readiness callback per datagram.
/// Ends when its endpoint is woken at shutdown, or once the server is gone.
fn receive_batches(
    shared: std::sync::Weak<Shared>,
    endpoint: &Endpoint,
    sender: &Arc<std::net::UdpSocket>,
    ingress: &Ingress,
) {
    const BATCH: usize = 32;
    let mut headers = BatchHeaders::new(endpoint, BATCH);
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; 4096]).collect();
    let mut got = Vec::with_capacity(BATCH);
    loop {
        match endpoint.recv_batch(&mut headers, &mut bufs, &mut got, true) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(error = %e, "DHCP receive failed");
                // Whatever failed is not retried in a tight loop.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        for d in &got {
            let SocketAddr::V4(from) = d.from else {
                continue;
            };
            handle_packet(&shared, sender, ingress, &bufs[d.buf][..d.len], from);
        }
    }
}

/// Whether a drop from `source` should be logged now: the first in ten
/// minutes. The table is bounded: a flood of spoofed sources empties it
/// rather than grows it.
fn first_drop_in_a_while(shared: &Shared, source: Ipv4Addr, now: u64) -> bool {
    const EVERY: u64 = 600;
    const SOURCES: usize = 1024;
    let mut warned = shared
        .warned_relays
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if warned.get(&source).is_some_and(|&at| now < at + EVERY) {
        return false;
    }
    if warned.len() >= SOURCES {
        warned.clear();
    }
    warned.insert(source, now);
    true
}

fn handle_packet(
    shared: &Arc<Shared>,
    sender: &Arc<std::net::UdpSocket>,
    ingress: &Ingress,
    bytes: &[u8],
    from: SocketAddrV4,
) {
    let received = Instant::now();
    let m = &shared.metrics;
    let msg = match wire::decode(bytes) {
        Ok(msg) => msg,
        Err(e) => {
            m.dropped.with_label_values(&[e.label()]).inc();
            tracing::debug!(from = %from, reason = %e, "malformed DHCP packet dropped");
            return;
        }
    };
    m.received
        .with_label_values(&[message_type_label(msg.opts().msg_type())])
        .inc();
    if shared.in_flight.load(Ordering::Relaxed) >= shared.max_in_flight.load(Ordering::Relaxed) {
        m.dropped.with_label_values(&["overloaded"]).inc();
        return;
    }
    let Some(now) = shared.clock.now() else {
        m.dropped.with_label_values(&["clock_behind"]).inc();
        return;
    };
    // The engine lock is held until the records are queued, so the log has
    // them in the order the engine made them: a later change to an address
    // is never written before an earlier one.
    let mut engine = shared.engine();
    // Under high availability with no standby confirming, new addresses
    // come from this replica's share only (see crate::merge).
    let share = shared.store.share();
    engine.set_share(share);
    let outcome = engine.handle(now, &msg, from, ingress);
    match outcome {
        Outcome::Reply {
            mut reply,
            commit,
            vacated,
        } => {
            let kind = message_type_label(reply.message_type());
            let source = match reply
                .message
                .opts()
                .get(dhcproto::v4::OptionCode::ServerIdentifier)
            {
                Some(dhcproto::v4::DhcpOption::ServerIdentifier(ip)) => Some(*ip),
                _ => None,
            };
            let bytes = match wire::encode(&mut reply.message) {
                Ok(b) => b,
                Err(e) => {
                    for record in commit.iter().chain(vacated.as_deref()) {
                        if engine.settle(record, false) {
                            m.changes_undone.inc();
                        }
                    }
                    drop(engine);
                    m.dropped.with_label_values(&["encode_failed"]).inc();
                    tracing::warn!(error = %e, "reply could not be encoded");
                    return;
                }
            };
            if let Some(record) = vacated {
                queue(shared, *record, None);
            }
            match commit {
                None => {
                    drop(engine);
                    send(sender, m, &bytes, reply.destination, source, kind, received);
                }
                Some(record) => {
                    let sender = sender.clone();
                    let dest = reply.destination;
                    queue_chosen(
                        shared,
                        record,
                        Some(Box::new(move |m: &DhcpMetrics| {
                            send(&sender, m, &bytes, dest, source, kind, received)
                        })),
                        share.is_none(),
                    );
                }
            }
        }
        Outcome::Commit(record) => queue(shared, record, None),
        Outcome::Ignore(reason) => {
            drop(engine);
            m.dropped.with_label_values(&[reason.label()]).inc();
            if reason == Ignored::UnknownRelay && first_drop_in_a_while(shared, *from.ip(), now) {
                tracing::warn!(from = %from, giaddr = %msg.giaddr(), "relayed DHCP packet dropped (unknown_relay): on an interface listener a relayed packet is served only when its source is listed in the relayAddresses or relaySources of the subnet its giaddr chooses; list the relay agent's giaddr in relayAddresses and, when it sends from another address, that address in relaySources (`causeway check` names the subnets no client can reach)");
            }
            if reason == Ignored::PoolExhausted {
                // One line per ten seconds, however hard the pool is hammered.
                let last = shared.last_exhausted_warning.load(Ordering::Relaxed);
                if now >= last + 10
                    && shared
                        .last_exhausted_warning
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(giaddr = %msg.giaddr(), "address pool exhausted: no offer sent (see causeway_dhcp_pool_addresses)");
                }
            }
        }
    }
}

/// What to do once a record is durable, besides telling the engine and the
/// observer: send the reply that waited for it.
type OnDurable = Box<dyn FnOnce(&DhcpMetrics) + Send>;

/// Hands `record` to the store. Called with the engine lock held, so
/// records reach the log in engine order; the store's queue never blocks.
fn queue(shared: &Arc<Shared>, record: LeaseRecord, on_durable: Option<OnDurable>) {
    queue_chosen(shared, record, on_durable, false);
}

/// As [`queue`]; `full_pool` says the engine chose from the whole pool.
fn queue_chosen(
    shared: &Arc<Shared>,
    record: LeaseRecord,
    on_durable: Option<OnDurable>,
    full_pool: bool,
) {
    shared.in_flight.fetch_add(1, Ordering::Relaxed);
    shared.metrics.in_flight.inc();
    let done_shared = shared.clone();
    let settled = record.clone();
    shared.store.append_chosen(
        record,
        Box::new(move |durable| {
            let m = &done_shared.metrics;
            done_shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            m.in_flight.dec();
            // A withheld record is in the log all the same: the engine keeps
            // it, so the address is not given to another client while the
            // peer may have acknowledged it.
            let on_disk = durable.is_ok() || durable == Err(crate::store::WITHHELD);
            if done_shared.engine().settle(&settled, on_disk) {
                m.changes_undone.inc();
            }
            if durable.is_err() {
                return;
            }
            if let Some(then) = on_durable {
                then(m);
            }
            if let Some(observe) = &done_shared.observer {
                observe(&settled);
            }
        }),
        full_pool,
    );
}

/// Holds the server back while the wall clock is behind the lease file.
struct Gate {
    /// Under high availability: the peer's wall clock, counted from when
    /// it is behind this one's (see [`clock::pair_wall`]).
    peer_wall: Option<Arc<crate::replica::Replicator>>,
    last_write: Option<u64>,
    tolerance: Duration,
    store_healthy: Arc<Mutex<bool>>,
    ready: ReadyHandle,
    /// Addresses whose newest log line could not be read, held back once
    /// the clock is known.
    unreadable: Vec<Ipv4Addr>,
}

impl Gate {
    /// Starts the lease clock if the wall clock allows; says so either way.
    fn try_open(&self, shared: &Arc<Shared>, first: bool) -> bool {
        let peer_now = self.peer_wall.as_ref().and_then(|r| r.peer_wall_now());
        let (wall, shift) = clock::pair_wall(unix_now(), peer_now);
        if shift > 0 {
            shared.anchored_behind.store(shift, Ordering::Relaxed);
            tracing::warn!(
                ahead_seconds = shift,
                "this replica's wall clock is ahead of its peer's: lease times count from the peer's, so no lease it wrote ends early here"
            );
        }
        let last_write = self.last_write.map(|w| w.saturating_sub(shift));
        match clock::check(wall, last_write, self.tolerance) {
            ClockCheck::Serve { from } => {
                shared.clock.start(from);
                self.hold_unreadable(shared, from);
                shared.metrics.clock_behind.set(0);
                if !first {
                    tracing::info!(
                        serving_from = from,
                        "the wall clock has caught up with the lease file: DHCP serving"
                    );
                }
                let healthy = self.store_healthy.lock().unwrap_or_else(|p| p.into_inner());
                self.ready.set(*healthy);
                true
            }
            ClockCheck::Behind { by } => {
                shared
                    .metrics
                    .clock_behind
                    .set(i64::try_from(by).unwrap_or(i64::MAX));
                if first {
                    tracing::error!(
                        behind_seconds = by,
                        tolerance_seconds = self.tolerance.as_secs(),
                        "the wall clock is behind the lease file's last write: DHCP waits (not ready, \
                         nothing answered) until the clock is set, because lease times read with \
                         this clock would hand out addresses still in use; set the clock (NTP), \
                         or raise dhcp.clockBehindTolerance"
                    );
                }
                false
            }
        }
    }

    fn hold_unreadable(&self, shared: &Arc<Shared>, now: u64) {
        if self.unreadable.is_empty() {
            return;
        }
        let shown: Vec<String> = self
            .unreadable
            .iter()
            .take(16)
            .map(|ip| ip.to_string())
            .collect();
        tracing::warn!(
            addresses = self.unreadable.len(),
            first = %shown.join(","),
            "lease log lines that could not be read were the newest for these addresses: each is \
             held back (quarantined as declined) for one lease time, because the lost line may \
             have given it to a client that still uses it"
        );
        let mut engine = shared.engine();
        for record in engine.hold_unreadable(now, &self.unreadable) {
            queue(shared, record, None);
        }
    }

    async fn wait(self, shared: Arc<Shared>, shutdown: Shutdown) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.try_open(&shared, false) {
                return;
            }
        }
    }
}

/// Reclaims expired leases and refreshes the pool gauges.
async fn housekeeping(shared: Arc<Shared>, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(now) = shared.clock.now() else {
            continue;
        };
        report_wall_offset(&shared);
        let (stats, count) = {
            let mut engine = shared.engine();
            engine.reclaim(now);
            (engine.pool_stats(now), engine.lease_count())
        };
        shared.metrics.record_pools(&stats);
        let (v6_stats, v6_count) = {
            let v6 = shared.v6();
            match &v6.leases {
                Some(l) => (Some(l.stats(now)), l.lease_count()),
                None => (None, 0),
            }
        };
        if let Some(s) = v6_stats {
            let gauge = |state: &str, n: u128| {
                shared
                    .metrics
                    .addresses6
                    .with_label_values(&[state])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            };
            gauge("total", s.size);
            gauge("leased", u128::from(s.active));
            gauge("declined", u128::from(s.declined));
        }
        shared
            .metrics
            .leases
            .set(i64::try_from(count + v6_count).unwrap_or(i64::MAX));
    }
}

/// Publishes how far the wall clock has stepped from the lease clock, and
/// logs the first step bigger than a minute: lease times written from now
/// on are that far from the wall clock, which a restart reads again.
fn report_wall_offset(shared: &Shared) {
    let Some(offset) = shared.clock.wall_offset(unix_now()) else {
        return;
    };
    let behind = i64::try_from(shared.anchored_behind.load(Ordering::Relaxed)).unwrap_or(0);
    let offset = offset - behind;
    shared.metrics.clock_wall_offset.set(offset);
    if offset.abs() > 60 && !shared.offset_reported.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            offset_seconds = offset,
            "the wall clock stepped while DHCP was serving; lease times keep counting from the \
             clock at start (so no lease ends early or late), and a restart reads the new clock \
             (see docs/dhcp.md, \"Clocks\")"
        );
    }
}

impl causeway_runtime::Service for DhcpServer {
    type Config = DhcpConfig;
    type Error = DhcpError;
    const NAME: &'static str = "DHCP";

    async fn reload(&self, cfg: &DhcpConfig) -> Result<(), DhcpError> {
        DhcpServer::reload(self, cfg)
    }

    /// Every lease change queued is made durable, however long it takes:
    /// those are acknowledged or about to be.
    async fn stop(self, _deadline: std::time::Duration) {
        self.wait().await
    }
}

/// Where the DHCPv6 server hands the messages that lease addresses: the
/// DHCP server whose store keeps the leases, while one serves here (under
/// high availability, only on the active).
#[derive(Clone, Default)]
pub struct V6Port {
    inner: Arc<Mutex<PortInner>>,
}

#[derive(Default)]
struct PortInner {
    server: std::sync::Weak<Shared>,
    config: Option<(causeway_config::Dhcp6Config, Vec<u8>)>,
}

/// Sends a reply, of the type given, once its leases are durable (on the
/// store's thread).
pub type SendReply = Box<dyn FnOnce(Vec<u8>, dhcproto::v6::MessageType) + Send>;

impl V6Port {
    pub fn new() -> V6Port {
        V6Port::default()
    }

    fn inner(&self) -> MutexGuard<'_, PortInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn attach(&self, shared: &Arc<Shared>) {
        let mut inner = self.inner();
        inner.server = Arc::downgrade(shared);
        if let Some((cfg, duid)) = &inner.config {
            configure(shared, cfg, duid);
        }
    }

    /// Stops leasing through this port until a server attaches again.
    pub fn detach(&self) {
        self.inner().server = std::sync::Weak::new();
    }

    /// The DHCPv6 config and the server's DUID; applied to the server now
    /// and to every server attached later.
    pub fn configure(&self, cfg: &causeway_config::Dhcp6Config, duid: Vec<u8>) {
        let mut inner = self.inner();
        if let Some(shared) = inner.server.upgrade() {
            configure(&shared, cfg, &duid);
        }
        inner.config = Some((cfg.clone(), duid));
    }

    /// Every DHCPv6 lease of the attached server, for the admin endpoint.
    pub fn records(&self) -> Vec<LeaseRecord> {
        let server = self.inner().server.upgrade();
        server
            .and_then(|s| s.v6().leases.as_ref().map(Leases6::records))
            .unwrap_or_default()
    }

    /// Answers a client's message: `send` is called with the reply at
    /// once when nothing is leased, or on the store's thread once every
    /// lease change is durable (never when one is not).
    pub fn handle(
        &self,
        relayed: &Relayed,
        msg: &dhcproto::v6::Message,
        send: SendReply,
    ) -> Result<(), Ignored6> {
        let Some(shared) = self.inner().server.upgrade() else {
            return Err(Ignored6::NoLeaseStore);
        };
        let Some(now) = shared.clock.now() else {
            return Err(Ignored6::NoLeaseStore);
        };
        // Under high availability with no standby confirming, new
        // addresses come from this replica's share only.
        let share = shared.store.share();
        let mut v6 = shared.v6();
        let leases = v6.leases.as_mut().ok_or(Ignored6::NotServed)?;
        let out = leases.handle(now, relayed, msg, share)?;
        if out.commit.is_empty() {
            drop(v6);
            send(out.reply, out.kind);
            return Ok(());
        }
        // The reply waits for the last of its records; one that fails
        // keeps it from being sent at all.
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(out.commit.len()));
        let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kind = out.kind;
        let reply = Arc::new(Mutex::new(Some((out.reply, send))));
        for record in out.commit {
            let (pending, failed, reply) = (pending.clone(), failed.clone(), reply.clone());
            let done_shared = shared.clone();
            let settled = record.clone();
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            shared.metrics.in_flight.inc();
            // Called with the v6 lock held, so the log has the records in
            // the order the engine made them.
            shared.store.append_chosen(
                record,
                Box::new(move |durable| {
                    let m = &done_shared.metrics;
                    done_shared.in_flight.fetch_sub(1, Ordering::Relaxed);
                    m.in_flight.dec();
                    let on_disk = durable.is_ok() || durable == Err(crate::store::WITHHELD);
                    if let Some(l) = done_shared.v6().leases.as_mut() {
                        if l.settle(&settled, on_disk) {
                            m.changes_undone.inc();
                        }
                    }
                    if durable.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    } else if let Some(observe) = &done_shared.observer {
                        observe(&settled);
                    }
                    if pending.fetch_sub(1, Ordering::AcqRel) == 1
                        && !failed.load(Ordering::Relaxed)
                    {
                        let taken = reply.lock().unwrap_or_else(|p| p.into_inner()).take();
                        if let Some((bytes, send)) = taken {
                            send(bytes, kind);
                        }
                    }
                }),
                share.is_none(),
            );
        }
        Ok(())
    }
}

fn configure(shared: &Shared, cfg: &causeway_config::Dhcp6Config, duid: &[u8]) {
    let mut v6 = shared.v6();
    let reconfigured = match &mut v6.leases {
        Some(l) => l.reconfigure(cfg, duid.to_vec()),
        None => false,
    };
    if reconfigured {
        return;
    }
    match Leases6::new(cfg, duid.to_vec()) {
        Some(mut leases) => {
            let waiting = std::mem::take(&mut v6.waiting);
            let skipped = leases.restore(&waiting);
            let records = leases.records();
            shared.metrics.corrupt_lines.inc_by(skipped as u64);
            tracing::info!(leases = records.len(), skipped, "DHCPv6 leases recovered");
            if let Some(observe) = &shared.observer {
                for r in &records {
                    observe(r);
                }
            }
            v6.leases = Some(leases);
        }
        None => {
            // Leasing turned off: the leases wait, as read, for it to
            // come back (they stay in the log either way).
            if let Some(l) = v6.leases.take() {
                v6.waiting = l.records();
            }
        }
    }
}

#[cfg(test)]
mod v6_port_tests {
    use super::*;

    /// A port no server is attached to (a standby's, or one whose server
    /// detached it on losing the active role) leases nothing.
    #[test]
    fn a_port_without_its_server_leases_nothing() {
        let mut m =
            dhcproto::v6::Message::new_with_id(dhcproto::v6::MessageType::Solicit, [1, 2, 3]);
        m.opts_mut().insert(dhcproto::v6::DhcpOption::ClientId(vec![
            0, 3, 0, 1, 2, 0, 0, 0, 0, 9,
        ]));
        let bytes = crate::v6::encode(&m).unwrap();
        let relayed = crate::v6::unwrap_relays(&bytes).unwrap();
        let msg = crate::v6::decode_client(relayed.client).unwrap();
        let port = V6Port::new();
        let sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = sent.clone();
        let got = port.handle(
            &relayed,
            &msg,
            Box::new(move |_, _| flag.store(true, Ordering::Relaxed)),
        );
        assert_eq!(got.err(), Some(Ignored6::NoLeaseStore));
        port.detach();
        assert!(!sent.load(Ordering::Relaxed));
    }
}
