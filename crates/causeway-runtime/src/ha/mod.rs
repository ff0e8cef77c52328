//! Leadership between two replicas: which one holds the service addresses.
//!
//! [`election`] decides (pure), [`advert`] is what the replicas say to each
//! other; this module carries it out: adverts over UDP to the peer, a tick,
//! requests to the witness with a timeout, and the addresses added or
//! removed through an [`Addresses`] the binary provides. Services watch
//! [`Leadership::role`] to serve or stand by.

pub mod advert;
pub mod election;
pub mod gate;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use advert::{Advert, AdvertKey, ReplayGuard, MAX_ADVERT};
pub use election::{
    Action, Election, Mode, PeerState, Reason, Role, Timers, WitnessRequest, WitnessResult,
    WitnessView,
};
pub use gate::{AckGate, Alone, GateState};

/// Adds and removes the service addresses.
pub trait Addresses: Send + Sync + 'static {
    fn take(&self) -> impl Future<Output = Result<(), String>> + Send;
    fn release(&self) -> impl Future<Output = Result<(), String>> + Send;
    /// Tells the network again who holds the addresses (gratuitous ARP),
    /// for hosts that learned the peer's MAC meanwhile.
    fn announce(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The compare-and-swap object that settles a partition (lease mode).
pub trait Witness: Send + Sync + 'static {
    fn read(&self) -> impl Future<Output = Result<WitnessView, String>> + Send;
    /// Makes this replica the holder if the object is still at `version`:
    /// `Ok(true)` won, `Ok(false)` it changed meanwhile.
    fn claim(&self, version: String) -> impl Future<Output = Result<bool, String>> + Send;
    /// Writes the object again if this replica holds it: `Ok(false)` when
    /// another does.
    fn renew(&self) -> impl Future<Output = Result<bool, String>> + Send;
}

/// Peer mode has no witness.
pub struct NoWitness;

impl Witness for NoWitness {
    async fn read(&self) -> Result<WitnessView, String> {
        Err("peer mode has no witness".into())
    }
    async fn claim(&self, _version: String) -> Result<bool, String> {
        Err("peer mode has no witness".into())
    }
    async fn renew(&self) -> Result<bool, String> {
        Err("peer mode has no witness".into())
    }
}

/// Service addresses a listener may bind before this replica holds them
/// (`IP_FREEBIND`): the standby's DNS and proxy listen from the start, and
/// packets reach them only once the address is theirs.
static FLOATING: OnceLock<Vec<IpAddr>> = OnceLock::new();

pub fn set_floating(addresses: Vec<IpAddr>) {
    let _ = FLOATING.set(addresses);
}

pub fn is_floating(ip: IpAddr) -> bool {
    FLOATING.get().is_some_and(|f| f.contains(&ip))
}

#[derive(Clone)]
pub struct HaMetrics {
    role: IntGaugeVec,
    changes: IntCounterVec,
    peer_heard: IntGauge,
    peer_active: IntGauge,
    in_sync: IntGauge,
    degraded: IntGauge,
    adverts_refused: IntCounterVec,
    witness: IntCounterVec,
    address_errors: IntCounterVec,
    peer_clock_offset: prometheus::Gauge,
    peer_heard_on: IntGaugeVec,
    leg_up: IntGauge,
}

impl HaMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<HaMetrics> {
        let m = HaMetrics {
            role: IntGaugeVec::new(
                Opts::new(
                    "causeway_ha_role",
                    "1 for this replica's role (active or standby), 0 for the other",
                ),
                &["role"],
            )?,
            changes: IntCounterVec::new(
                Opts::new(
                    "causeway_ha_role_changes_total",
                    "Role changes, by the role taken and why (peer_silent, peer_not_active, preempted, higher_peer_active, fenced, vlan_leg_down)",
                ),
                &["role", "reason"],
            )?,
            peer_heard_on: IntGaugeVec::new(
                Opts::new(
                    "causeway_ha_peer_heard_on",
                    "1 while the peer's adverts arrive by this path (peer_link, vlan) within the dead interval",
                ),
                &["path"],
            )?,
            leg_up: IntGauge::new(
                "causeway_ha_vlan_leg_up",
                "1 while the interface of the service addresses has carrier (peer mode hands the role to a peer whose leg has it)",
            )?,
            peer_heard: IntGauge::new(
                "causeway_ha_peer_heard",
                "1 while the peer's adverts arrive within the dead interval",
            )?,
            peer_active: IntGauge::new(
                "causeway_ha_peer_active",
                "1 while the peer says it holds the service addresses",
            )?,
            in_sync: IntGauge::new(
                "causeway_ha_in_sync",
                "1 while this replica's lease log is complete (a standby that received the active's snapshot and follows its stream, or a replica without DHCP)",
            )?,
            degraded: IntGauge::new(
                "causeway_ha_degraded",
                "1 while this replica is active with no standby to fail over to (the peer is not heard, or its lease log is behind)",
            )?,
            adverts_refused: IntCounterVec::new(
                Opts::new(
                    "causeway_ha_adverts_refused_total",
                    "Adverts refused, by reason: size, tag (wrong key or forged), body, replay, self",
                ),
                &["reason"],
            )?,
            witness: IntCounterVec::new(
                Opts::new(
                    "causeway_ha_witness_requests_total",
                    "Requests to the witness (the Kubernetes Lease), by request and result",
                ),
                &["request", "result"],
            )?,
            address_errors: IntCounterVec::new(
                Opts::new(
                    "causeway_ha_address_errors_total",
                    "Service addresses not added or removed, by operation",
                ),
                &["operation"],
            )?,
            peer_clock_offset: prometheus::Gauge::new(
                "causeway_ha_peer_clock_offset_seconds",
                "The peer's wall clock minus this replica's, as its last advert said (positive: the peer is ahead)",
            )?,
        };
        registry.register(Box::new(m.role.clone()))?;
        registry.register(Box::new(m.peer_clock_offset.clone()))?;
        registry.register(Box::new(m.changes.clone()))?;
        registry.register(Box::new(m.peer_heard.clone()))?;
        registry.register(Box::new(m.peer_heard_on.clone()))?;
        registry.register(Box::new(m.leg_up.clone()))?;
        registry.register(Box::new(m.peer_active.clone()))?;
        registry.register(Box::new(m.in_sync.clone()))?;
        registry.register(Box::new(m.degraded.clone()))?;
        registry.register(Box::new(m.adverts_refused.clone()))?;
        registry.register(Box::new(m.witness.clone()))?;
        registry.register(Box::new(m.address_errors.clone()))?;
        Ok(m)
    }

    fn show_role(&self, role: Role) {
        for r in [Role::Active, Role::Standby] {
            self.role
                .with_label_values(&[r.label()])
                .set(i64::from(r == role));
        }
    }
}

pub struct HaSettings {
    pub mode: Mode,
    pub name: String,
    pub peer_name: String,
    /// `host:port`, resolved again every second.
    pub peer_address: String,
    pub listen: SocketAddr,
    /// Bind the advert socket to this interface (SO_BINDTODEVICE).
    pub listen_interface: Option<String>,
    pub priority: u8,
    pub preempt: bool,
    pub timers: Timers,
    pub key: Vec<u8>,
    /// Where the highest term held or heard is kept across restarts (see
    /// [`Election::highest_term`]); none keeps it in memory only.
    pub term_file: Option<std::path::PathBuf>,
    /// The replicas replicate a DHCP lease log: this one is not in sync
    /// until it has followed the active's stream (or become active).
    pub replicates_leases: bool,
    /// A second path for the adverts, over the clients' VLAN: a cut peer
    /// link alone is then no partition.
    pub vlan_path: Option<VlanPath>,
    /// The interface the service addresses live on: without carrier, a
    /// replica hands the role to a peer whose leg has it (peer mode).
    pub track_interface: Option<String>,
}

/// Adverts over the VLAN: sent from `listen` (this replica's own address on
/// the VLAN, bound to `interface`) to the peer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanPath {
    pub listen: SocketAddr,
    pub peer: SocketAddr,
    pub interface: String,
}

/// The two ways an advert arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AdvertPath {
    PeerLink = 0,
    Vlan = 1,
}

impl AdvertPath {
    fn label(self) -> &'static str {
        match self {
            AdvertPath::PeerLink => "peer_link",
            AdvertPath::Vlan => "vlan",
        }
    }
}

/// Whether `interface` has carrier, as the kernel says in sysfs; an
/// interface that is missing or administratively down has none.
fn has_carrier(interface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{interface}/carrier"))
        .is_ok_and(|c| c.trim() == "1")
}

/// Reads the persisted term; a missing file is term 0.
fn read_term(path: &std::path::Path) -> std::io::Result<u64> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse().map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a term: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Writes the term durably: a crash leaves the old value or the new one.
fn write_term(path: &std::path::Path, term: u64) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(format!("{term}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What the admin endpoint and the readiness detail show.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HaStatus {
    pub node: String,
    pub role: String,
    pub peer: String,
    pub peer_heard: bool,
    pub peer_active: bool,
    pub peer_in_sync: bool,
    pub in_sync: bool,
    /// Active without a standby it can fail over to: the peer is not heard,
    /// or its lease log is behind.
    pub degraded: bool,
    /// The peer's adverts arrive over the peer link, and over the VLAN
    /// (when adverts take both).
    pub peer_heard_on_peer_link: bool,
    pub peer_heard_on_vlan: bool,
    /// The interface of the service addresses has carrier.
    pub vlan_leg_up: bool,
}

/// An advert socket, twice: the runtime's handle waits for datagrams, and
/// a duplicate of the descriptor reads what the kernel holds right now.
/// The runtime's own non-blocking read answers from the readiness it last
/// saw, not from the kernel: a process resumed from a stall may run its
/// tick before the runtime has polled the socket, and would then read "no
/// datagrams" while the peer's takeover waits in the queue.
struct AdvertSocket {
    waits: UdpSocket,
    reads_now: std::net::UdpSocket,
}

impl AdvertSocket {
    /// The next queued datagram, straight from the kernel; `None` when the
    /// queue is empty (or unreadable: the waiting side reports errors).
    fn read_queued(&self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        self.reads_now.recv_from(buf).ok()
    }
}

fn advert_socket(
    listen: SocketAddr,
    interface: Option<&str>,
    freebind: bool,
) -> std::io::Result<AdvertSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(listen),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if let Some(name) = interface {
        socket.bind_device(Some(name.as_bytes()))?;
    }
    if freebind {
        // The replica's own VLAN address may come up after the process.
        socket.set_freebind(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&listen.into())?;
    // Shares the open file, and so its non-blocking flag.
    let reads_now: std::net::UdpSocket = socket.try_clone()?.into();
    Ok(AdvertSocket {
        waits: UdpSocket::from_std(socket.into())?,
        reads_now,
    })
}

pub struct Leadership {
    role: watch::Receiver<Role>,
    gate: Arc<AckGate>,
    peer_clock: PeerClock,
    in_sync: Arc<AtomicBool>,
    status: Arc<Mutex<HaStatus>>,
    task: JoinHandle<()>,
    resign: mpsc::Sender<()>,
}

impl Leadership {
    /// Binds the advert socket and starts deciding. Every replica starts as
    /// standby and releases the addresses first (a previous run of this
    /// replica may have left them behind).
    pub async fn start<A: Addresses, W: Witness>(
        settings: HaSettings,
        addresses: Arc<A>,
        witness: Option<Arc<W>>,
        metrics: HaMetrics,
    ) -> std::io::Result<Leadership> {
        let socket = advert_socket(settings.listen, settings.listen_interface.as_deref(), false)?;
        let vlan_socket = match &settings.vlan_path {
            Some(path) => Some(
                advert_socket(path.listen, Some(&path.interface), true).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "the VLAN advert socket at {} on {}: {e}",
                            path.listen, path.interface
                        ),
                    )
                })?,
            ),
            None => None,
        };
        if let Err(e) = addresses.release().await {
            metrics.address_errors.with_label_values(&["release"]).inc();
            tracing::warn!(error = %e, "cannot clear the service addresses at start");
        }
        let (role_tx, role) = watch::channel(Role::Standby);
        // A replica with a lease log to follow says it is complete only once
        // it is: not at start, before it has heard anything.
        let in_sync = Arc::new(AtomicBool::new(!settings.replicates_leases));
        let status = Arc::new(Mutex::new(HaStatus {
            node: settings.name.clone(),
            role: Role::Standby.label().into(),
            peer: settings.peer_name.clone(),
            ..HaStatus::default()
        }));
        metrics.show_role(Role::Standby);
        let (resign, resign_rx) = mpsc::channel(1);
        let gate = Arc::new(AckGate::new(settings.timers.dead_after * 2));
        let boot = rand::random();
        let mut election = Election::new(
            settings.mode,
            settings.timers.clone(),
            &settings.name,
            &settings.peer_name,
            settings.priority,
            settings.preempt,
            Instant::now(),
        );
        election.set_boot(boot);
        let mut persisted_term = 0;
        if let Some(path) = &settings.term_file {
            match read_term(path) {
                Ok(term) => {
                    persisted_term = term;
                    election.set_term_floor(term);
                }
                // Refusing to start would keep the pair at one replica; a
                // term that starts low only loses ties it should have won.
                Err(e) => {
                    tracing::error!(error = %e, "the persisted HA term is unreadable; counting from the peer's")
                }
            }
        }
        let peer_clock: PeerClock = Arc::default();
        let driver = Driver {
            peer_clock: peer_clock.clone(),
            clock_warned: false,
            persisted_term,
            election,
            key: AdvertKey::new(&settings.key),
            boot,
            seq: 0,
            heard: None,
            gate: gate.clone(),
            guard: ReplayGuard::default(),
            settings,
            socket,
            vlan_socket,
            heard_on: [None, None],
            leg_up: None,
            peer: None,
            resolved_at: None,
            addresses,
            witness,
            metrics,
            role_tx,
            in_sync: in_sync.clone(),
            status: status.clone(),
        };
        driver.publish();
        let task = tokio::spawn(driver.run(resign_rx));
        Ok(Leadership {
            role,
            gate,
            peer_clock,
            in_sync,
            status,
            task,
            resign,
        })
    }

    pub fn role(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Set by DHCP replication: false while this replica's lease log is
    /// behind the active's.
    pub fn in_sync(&self) -> Arc<AtomicBool> {
        self.in_sync.clone()
    }

    /// Whether the lease writer may ACK on this replica's word alone.
    pub fn ack_gate(&self) -> Arc<AckGate> {
        self.gate.clone()
    }

    /// The peer's wall clock now, in unix seconds, as its last advert said
    /// it (advanced by the time since); `None` before any was heard.
    pub fn peer_wall_source(&self) -> impl Fn() -> Option<u64> + Send + Sync + 'static {
        let clock = self.peer_clock.clone();
        move || {
            let (ms, at) = (*clock.lock().unwrap_or_else(|p| p.into_inner()))?;
            let now_ms = ms.saturating_add(u64::try_from(at.elapsed().as_millis()).unwrap_or(0));
            Some(now_ms / 1000)
        }
    }

    pub fn status(&self) -> HaStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn status_source(&self) -> impl Fn() -> HaStatus + Send + Sync + 'static {
        let status = self.status.clone();
        move || status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Gives the addresses up and tells the peer, then stops. Called after
    /// the services stopped, so the peer takes over at once rather than
    /// after the dead interval.
    pub async fn stop(self) {
        let _ = self.resign.send(()).await;
        let _ = self.task.await;
    }
}

/// A peer clock this far off is logged (once).
const PEER_CLOCK_WARN: Duration = Duration::from_secs(5);

/// The peer's wall clock as last heard: (unix milliseconds, when heard).
pub type PeerClock = Arc<Mutex<Option<(u64, Instant)>>>;

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

struct Driver<A, W> {
    election: Election,
    peer_clock: PeerClock,
    clock_warned: bool,
    /// The highest term written to the term file.
    persisted_term: u64,
    settings: HaSettings,
    key: AdvertKey,
    boot: u64,
    seq: u64,
    /// The newest advert accepted from the peer: (boot, seq), echoed back.
    heard: Option<(u64, u64)>,
    gate: Arc<AckGate>,
    guard: ReplayGuard,
    socket: AdvertSocket,
    vlan_socket: Option<AdvertSocket>,
    /// When an advert (new, or the newest again) last arrived by each path.
    heard_on: [Option<Instant>; 2],
    /// The VLAN leg's carrier at the last look (`None` before the first).
    leg_up: Option<bool>,
    peer: Option<SocketAddr>,
    resolved_at: Option<Instant>,
    addresses: Arc<A>,
    witness: Option<Arc<W>>,
    metrics: HaMetrics,
    role_tx: watch::Sender<Role>,
    in_sync: Arc<AtomicBool>,
    status: Arc<Mutex<HaStatus>>,
}

/// The peer's name is resolved again this often: a pod comes back with a
/// new address.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);

impl<A: Addresses, W: Witness> Driver<A, W> {
    async fn run(mut self, mut resign: mpsc::Receiver<()>) {
        let tick_every = self.settings.timers.advert / 4;
        let mut tick = tokio::time::interval(tick_every.max(Duration::from_millis(5)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_advert = Instant::now();
        let (witness_tx, mut witness_rx) = mpsc::channel::<WitnessResult>(4);
        let mut buf = vec![0u8; MAX_ADVERT + 1];
        let mut vlan_buf = vec![0u8; MAX_ADVERT + 1];
        loop {
            let actions = tokio::select! {
                _ = resign.recv() => break,
                _ = tick.tick() => {
                    // Whatever the peer said while this process did not run
                    // (a stall, a VM stun) is read before time is: a tick
                    // alone would find the peer silent and allow ACKs that
                    // its takeover forbids.
                    let mut actions = Vec::new();
                    while let Some((n, from)) = self.socket.read_queued(&mut buf) {
                        actions.extend(self.on_datagram(&buf[..n], from, AdvertPath::PeerLink));
                        self.close_gate_on_release(&actions);
                    }
                    while let Some((n, from)) =
                        self.vlan_socket.as_ref().and_then(|s| s.read_queued(&mut vlan_buf))
                    {
                        actions.extend(self.on_datagram(&vlan_buf[..n], from, AdvertPath::Vlan));
                        self.close_gate_on_release(&actions);
                    }
                    self.track_leg();
                    let now = Instant::now();
                    if now >= next_advert {
                        self.send_advert().await;
                        next_advert = now + self.settings.timers.advert;
                    }
                    self.election.set_in_sync_at(self.in_sync.load(Ordering::Relaxed), now);
                    actions.extend(self.election.on_tick(now));
                    actions
                }
                got = self.socket.waits.recv_from(&mut buf) => match got {
                    Ok((n, from)) => self.on_datagram(&buf[..n], from, AdvertPath::PeerLink),
                    Err(e) => {
                        tracing::debug!(error = %e, "advert socket error");
                        Vec::new()
                    }
                },
                got = async {
                    match &self.vlan_socket {
                        Some(s) => s.waits.recv_from(&mut vlan_buf).await,
                        None => std::future::pending().await,
                    }
                } => match got {
                    Ok((n, from)) => self.on_datagram(&vlan_buf[..n], from, AdvertPath::Vlan),
                    Err(e) => {
                        tracing::debug!(error = %e, "VLAN advert socket error");
                        Vec::new()
                    }
                },
                Some(result) = witness_rx.recv() => {
                    self.election.on_witness(Instant::now(), result)
                }
            };
            self.close_gate_on_release(&actions);
            self.carry_out(actions, &witness_tx).await;
            self.announce_once_the_peer_concedes().await;
            self.publish();
        }
        let actions = self.election.resign();
        self.close_gate_on_release(&actions);
        self.carry_out(actions, &witness_tx).await;
        self.publish();
        // Said twice: one lost datagram should not cost the peer the dead
        // interval.
        self.send_advert().await;
        self.send_advert().await;
    }

    /// Reads the VLAN leg's carrier and tells the election; says so when
    /// it changes.
    fn track_leg(&mut self) {
        let Some(interface) = &self.settings.track_interface else {
            return;
        };
        let up = has_carrier(interface);
        if self.leg_up != Some(up) {
            if up {
                tracing::info!(%interface, "the VLAN leg has carrier");
            } else {
                tracing::warn!(%interface, "the VLAN leg has no carrier: the role goes to the peer if its leg has it");
            }
            self.leg_up = Some(up);
            self.metrics.leg_up.set(i64::from(up));
        }
        self.election.set_leg_up_at(up, Instant::now());
    }

    fn on_datagram(&mut self, bytes: &[u8], from: SocketAddr, path: AdvertPath) -> Vec<Action> {
        let advert = match self.key.open(bytes) {
            Ok(a) => a,
            Err(e) => {
                let reason = match e {
                    advert::AdvertError::Size(_) => "size",
                    advert::AdvertError::Tag => "tag",
                    advert::AdvertError::Body(_) => "body",
                };
                self.metrics
                    .adverts_refused
                    .with_label_values(&[reason])
                    .inc();
                tracing::debug!(%from, error = %e, "advert refused");
                return Vec::new();
            }
        };
        if advert.node != self.settings.peer_name {
            self.metrics
                .adverts_refused
                .with_label_values(&["self"])
                .inc();
            return Vec::new();
        }
        let now = Instant::now();
        let other_boot = advert::OtherBoot {
            last_quiet: !self.election.hears_peer(now),
            echoes_an_earlier_process: self.election.echo_is_of_an_earlier_process(advert.echo),
        };
        match self.guard.see(advert.boot, advert.seq, other_boot) {
            advert::Seen::New => {}
            advert::Seen::Copy => {
                self.heard_on[path as usize] = Some(now);
                return Vec::new();
            }
            advert::Seen::Replay => {
                self.metrics
                    .adverts_refused
                    .with_label_values(&["replay"])
                    .inc();
                return Vec::new();
            }
        }
        self.heard_on[path as usize] = Some(now);
        self.heard = Some((advert.boot, advert.seq));
        if advert.wall_ms > 0 {
            *self.peer_clock.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((advert.wall_ms, now));
            let offset = (advert.wall_ms as i64 - wall_ms() as i64) as f64 / 1000.0;
            self.metrics.peer_clock_offset.set(offset);
            if offset.abs() > PEER_CLOCK_WARN.as_secs_f64() && !self.clock_warned {
                self.clock_warned = true;
                tracing::warn!(
                    peer = %self.settings.peer_name,
                    offset_seconds = offset,
                    "the peer's wall clock differs from this one's; lease times count from the earlier clock after a takeover, but keep the replicas' clocks in step (NTP)"
                );
            }
        }
        self.election
            .set_in_sync_at(self.in_sync.load(Ordering::Relaxed), now);
        self.election.on_advert(
            now,
            PeerState {
                active: advert.active,
                hears_peer: advert.hears_peer,
                in_sync: advert.in_sync,
                priority: advert.priority,
                term: advert.term,
                echo: advert.echo,
                preempt: advert.preempt,
                leg_up: advert.leg_up,
            },
        )
    }

    async fn announce_once_the_peer_concedes(&mut self) {
        if self.election.owes_announcement(Instant::now()) {
            tracing::info!(peer = %self.settings.peer_name, "the peer stands by again: announcing the service addresses again");
            self.addresses.announce().await;
        }
    }

    /// A role given up stops ACKs before the addresses go or anything else
    /// is awaited.
    fn close_gate_on_release(&self, actions: &[Action]) {
        if actions.contains(&Action::Release) {
            self.gate.publish(false, None, 0);
            // Until the follower says otherwise: the flag was the active's.
            self.in_sync.store(false, Ordering::Relaxed);
        }
    }

    async fn peer_addr(&mut self) -> Option<SocketAddr> {
        let stale = self
            .resolved_at
            .is_none_or(|t| t.elapsed() >= RESOLVE_EVERY);
        if stale {
            self.resolved_at = Some(Instant::now());
            match tokio::net::lookup_host(self.settings.peer_address.as_str()).await {
                Ok(mut addrs) => {
                    if let Some(a) = addrs.find(|a| a.is_ipv4()) {
                        self.peer = Some(a);
                    }
                }
                Err(e) => {
                    tracing::debug!(peer = %self.settings.peer_address, error = %e, "peer not resolved");
                }
            }
        }
        self.peer
    }

    async fn send_advert(&mut self) {
        let Some(to) = self.peer_addr().await else {
            return;
        };
        self.seq += 1;
        let now = Instant::now();
        let advert = Advert {
            node: self.settings.name.clone(),
            boot: self.boot,
            seq: self.seq,
            priority: self.settings.priority,
            active: self.election.role() == Role::Active,
            hears_peer: self.election.hears_peer(now),
            in_sync: self.in_sync.load(Ordering::Relaxed),
            term: self.election.term(),
            echo: self.heard,
            preempt: self.settings.preempt,
            wall_ms: wall_ms(),
            leg_up: self.election.leg_up(),
        };
        let sealed = self.key.seal(&advert);
        let mut sent = match self.socket.waits.send_to(&sealed, to).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(%to, error = %e, "advert not sent");
                false
            }
        };
        // The same advert by the VLAN too: a cut peer link is then not a
        // partition, and the peer's copy tells it the VLAN path works.
        if let (Some(socket), Some(path)) = (&self.vlan_socket, &self.settings.vlan_path) {
            match socket.waits.send_to(&sealed, path.peer).await {
                Ok(_) => sent = true,
                Err(e) => {
                    tracing::debug!(to = %path.peer, error = %e, "advert not sent on the VLAN")
                }
            }
        }
        if sent {
            self.election.on_sent(self.seq, now);
        }
    }

    /// Keeps the highest term across restarts, before a takeover under it
    /// is carried out.
    fn persist_term(&mut self) {
        let term = self.election.highest_term();
        if term <= self.persisted_term {
            return;
        }
        let Some(path) = &self.settings.term_file else {
            return;
        };
        match write_term(path, term) {
            Ok(()) => self.persisted_term = term,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "the HA term could not be persisted")
            }
        }
    }

    async fn carry_out(&mut self, actions: Vec<Action>, results: &mpsc::Sender<WitnessResult>) {
        self.persist_term();
        for action in actions {
            match action {
                Action::Take => {
                    if let Err(e) = self.addresses.take().await {
                        self.metrics
                            .address_errors
                            .with_label_values(&["add"])
                            .inc();
                        tracing::error!(error = %e, "service addresses not added; this replica is active but unreachable");
                    }
                    // Say it at once: the peer learns it holds nothing.
                    self.send_advert().await;
                }
                Action::Release => {
                    if let Err(e) = self.addresses.release().await {
                        self.metrics
                            .address_errors
                            .with_label_values(&["remove"])
                            .inc();
                        tracing::error!(error = %e, "service addresses not removed");
                    }
                    self.send_advert().await;
                }
                Action::Witness(request) => self.ask_witness(request, results.clone()),
            }
        }
        if let Some((role, reason)) = self.election.take_change() {
            self.metrics
                .changes
                .with_label_values(&[role.label(), reason.label()])
                .inc();
            self.metrics.show_role(role);
            tracing::warn!(
                role = role.label(),
                reason = reason.label(),
                peer = %self.settings.peer_name,
                "high availability: this replica is now {}",
                role.label()
            );
            let _ = self.role_tx.send(role);
        }
    }

    fn ask_witness(&self, request: WitnessRequest, results: mpsc::Sender<WitnessResult>) {
        let Some(witness) = self.witness.clone() else {
            return;
        };
        let timeout = self.settings.timers.api_timeout;
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let (label, result) = match request {
                WitnessRequest::Read => (
                    "read",
                    match tokio::time::timeout(timeout, witness.read()).await {
                        Ok(Ok(view)) => WitnessResult::Read(view),
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "witness read failed");
                            WitnessResult::Failed
                        }
                        Err(_) => WitnessResult::Failed,
                    },
                ),
                WitnessRequest::Claim { version } => (
                    "claim",
                    held(tokio::time::timeout(timeout, witness.claim(version)).await),
                ),
                WitnessRequest::Renew => (
                    "renew",
                    held(tokio::time::timeout(timeout, witness.renew()).await),
                ),
            };
            let shown = match &result {
                WitnessResult::Read(_) => "read",
                WitnessResult::Held => "held",
                WitnessResult::Lost => "lost",
                WitnessResult::Failed => "failed",
            };
            metrics.witness.with_label_values(&[label, shown]).inc();
            let _ = results.send(result).await;
        });
    }

    fn publish(&self) {
        let now = Instant::now();
        self.gate.publish(
            self.election.role() == Role::Active,
            self.election.alone_until(now),
            self.election.term(),
        );
        let heard = self.election.hears_peer(now);
        let peer = self.election.peer().filter(|_| heard);
        self.metrics.peer_heard.set(i64::from(heard));
        let dead_after = self.settings.timers.dead_after;
        let heard_on = |path: AdvertPath| {
            self.heard_on[path as usize]
                .is_some_and(|t| now.saturating_duration_since(t) < dead_after)
        };
        let (on_link, on_vlan) = (heard_on(AdvertPath::PeerLink), heard_on(AdvertPath::Vlan));
        for (path, on) in [(AdvertPath::PeerLink, on_link), (AdvertPath::Vlan, on_vlan)] {
            self.metrics
                .peer_heard_on
                .with_label_values(&[path.label()])
                .set(i64::from(on));
        }
        self.metrics
            .peer_active
            .set(i64::from(peer.is_some_and(|p| p.active)));
        let in_sync = self.in_sync.load(Ordering::Relaxed);
        self.metrics.in_sync.set(i64::from(in_sync));
        let degraded = self.election.role() == Role::Active
            && !peer.is_some_and(|p| p.in_sync && p.hears_peer);
        self.metrics.degraded.set(i64::from(degraded));
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.degraded = degraded;
        s.role = self.election.role().label().into();
        s.peer_heard = heard;
        s.peer_active = peer.is_some_and(|p| p.active);
        s.peer_in_sync = peer.is_some_and(|p| p.in_sync);
        s.in_sync = in_sync;
        s.peer_heard_on_peer_link = on_link;
        s.peer_heard_on_vlan = on_vlan;
        s.vlan_leg_up = self.election.leg_up();
    }
}

fn held(result: Result<Result<bool, String>, tokio::time::error::Elapsed>) -> WitnessResult {
    match result {
        Ok(Ok(true)) => WitnessResult::Held,
        Ok(Ok(false)) => WitnessResult::Lost,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "witness write failed");
            WitnessResult::Failed
        }
        Err(_) => {
            tracing::warn!("witness request timed out");
            WitnessResult::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoAddresses;

    impl Addresses for NoAddresses {
        async fn take(&self) -> Result<(), String> {
            Ok(())
        }
        async fn release(&self) -> Result<(), String> {
            Ok(())
        }
    }

    #[derive(Default)]
    struct Announced(std::sync::atomic::AtomicUsize);

    impl Addresses for Announced {
        async fn take(&self) -> Result<(), String> {
            Ok(())
        }
        async fn release(&self) -> Result<(), String> {
            Ok(())
        }
        async fn announce(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn settings(name: &str, peer: &str, listen: u16, peer_port: u16) -> HaSettings {
        HaSettings {
            mode: Mode::Peer,
            name: name.into(),
            peer_name: peer.into(),
            peer_address: format!("127.0.0.1:{peer_port}"),
            listen: format!("127.0.0.1:{listen}").parse().unwrap(),
            listen_interface: None,
            priority: if name == "a" { 200 } else { 100 },
            preempt: false,
            timers: Timers {
                advert: Duration::from_millis(50),
                dead_after: Duration::from_millis(150),
                api_timeout: Duration::from_secs(1),
                renew_interval: Duration::from_secs(60),
                degraded_renew: Duration::from_secs(5),
            },
            key: b"0123456789abcdef".to_vec(),
            term_file: None,
            replicates_leases: false,
            vlan_path: None,
            track_interface: None,
        }
    }

    /// A replica killed while active may have answered ARP for the address
    /// until it was gone; hosts that asked then hold its MAC. When it comes
    /// back (as the standby), the active announces the address again.
    #[tokio::test]
    async fn the_active_announces_the_addresses_again_when_its_peer_comes_back() {
        let free = || std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (sa, sb) = (free(), free());
        let (pa, pb) = (
            sa.local_addr().unwrap().port(),
            sb.local_addr().unwrap().port(),
        );
        drop((sa, sb));
        let announced = Arc::new(Announced::default());
        let registry = Registry::new();
        let a = Leadership::start(
            settings("a", "b", pa, pb),
            announced.clone(),
            None::<Arc<NoWitness>>,
            HaMetrics::new(&registry).unwrap(),
        )
        .await
        .unwrap();
        let mut role = a.role();
        tokio::time::timeout(
            Duration::from_secs(5),
            role.wait_for(|r| *r == Role::Active),
        )
        .await
        .expect("a alone became active")
        .unwrap();
        let before = announced.0.load(Ordering::Relaxed);
        let registry_b = Registry::new();
        let b = Leadership::start(
            settings("b", "a", pb, pa),
            Arc::new(NoAddresses),
            None::<Arc<NoWitness>>,
            HaMetrics::new(&registry_b).unwrap(),
        )
        .await
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while announced.0.load(Ordering::Relaxed) == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let after = announced.0.load(Ordering::Relaxed);
        b.stop().await;
        a.stop().await;
        assert!(
            after > before,
            "the active did not announce the addresses when its peer came back"
        );
    }

    /// A tick reads what the kernel has queued even when the runtime has
    /// not polled the socket since it arrived (a process resumed from a
    /// stall): the runtime's own non-blocking read answers "nothing" then,
    /// and the tick would act on a peer it thinks silent.
    #[tokio::test]
    async fn a_tick_reads_queued_adverts_the_runtime_has_not_yet_seen() {
        let socket = advert_socket("127.0.0.1:0".parse().unwrap(), None, false).unwrap();
        let to = socket.waits.local_addr().unwrap();
        let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // The runtime sees one datagram arrive, and then the queue empty.
        peer.send_to(b"first", to).unwrap();
        let mut buf = [0u8; 64];
        socket.waits.recv_from(&mut buf).await.unwrap();
        assert!(socket.waits.try_recv_from(&mut buf).is_err());
        // From here on nothing yields to the runtime.
        peer.send_to(b"queued", to).unwrap();
        // What the tick read before: nothing, whatever the kernel holds.
        assert!(
            socket.waits.try_recv_from(&mut buf).is_err(),
            "the runtime's own read saw the datagram: this test no longer shows the stale view"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut read = None;
        while read.is_none() && std::time::Instant::now() < deadline {
            read = socket.read_queued(&mut buf);
            if read.is_none() {
                // The loopback delivery is the kernel's; this thread
                // must not yield to the runtime while it waits.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let (n, from) = read.expect("the queued datagram was not read");
        assert_eq!(&buf[..n], b"queued");
        assert_eq!(from, peer.local_addr().unwrap());
        assert!(socket.read_queued(&mut buf).is_none(), "the queue is empty");
    }

    /// A replica that just started has heard no peer and received no
    /// snapshot: it must not say its lease log is complete.
    #[tokio::test]
    async fn a_restarted_replica_is_not_in_sync_before_it_has_followed_anything() {
        let settings = HaSettings {
            mode: Mode::Peer,
            name: "b".into(),
            peer_name: "a".into(),
            // Nothing listens there: the peer is never heard.
            peer_address: "127.0.0.1:9".into(),
            listen: "127.0.0.1:0".parse().unwrap(),
            listen_interface: None,
            priority: 100,
            preempt: false,
            timers: Timers {
                advert: Duration::from_millis(50),
                dead_after: Duration::from_secs(30),
                api_timeout: Duration::from_secs(1),
                renew_interval: Duration::from_secs(60),
                degraded_renew: Duration::from_secs(5),
            },
            key: b"0123456789abcdef".to_vec(),
            term_file: None,
            replicates_leases: true,
            vlan_path: None,
            track_interface: None,
        };
        let registry = Registry::new();
        let metrics = HaMetrics::new(&registry).unwrap();
        let leadership = Leadership::start(
            settings,
            Arc::new(NoAddresses),
            None::<Arc<NoWitness>>,
            metrics,
        )
        .await
        .unwrap();
        let at_start = leadership.status();
        // A few ticks and adverts later, still standing by.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let later = leadership.status();
        leadership.stop().await;
        assert!(
            !at_start.in_sync && !later.in_sync,
            "a replica that followed nothing says inSync: at start {}, 200 ms later {}",
            at_start.in_sync,
            later.in_sync
        );
        assert_eq!(later.role, "standby");
    }
}
