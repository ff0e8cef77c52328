//! The appliance's side of high availability: starts the leadership module
//! with this replica's settings, and runs DHCP as the role says (the server
//! while active, the lease stream's follower while standing by).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use causeway_config::{DhcpConfig, HaConfig, HaMode};
use causeway_dhcp::follower::LeaseReceiver;
use causeway_dhcp::replica::{ReplicationMetrics, Replicator};
use causeway_dhcp::{DhcpError, DhcpMetrics, DhcpServer, LeaseObserver, LeaseRecord};
use causeway_route::FloatingAddresses;
use causeway_runtime::ha::advert::AdvertKey;
use causeway_runtime::ha::{
    HaMetrics, HaSettings, Leadership, Mode, NoWitness, Role, Timers, VlanPath,
};
use causeway_runtime::{ReadyHandle, Shutdown};
use tokio::sync::watch;

/// The shortest shared key accepted.
const MIN_KEY: usize = 16;

pub struct HaRuntime {
    pub leadership: Leadership,
    pub key: Arc<AdvertKey>,
    /// The peer's `host:port`: adverts (UDP) and the lease stream (TCP).
    pub peer_address: String,
    pub listen: SocketAddr,
    pub listen_interface: Option<String>,
    pub replication_timeout: Duration,
    /// This replica's half of the DHCP pool while no standby confirms.
    pub share: causeway_dhcp::merge::Share,
}

/// This replica's name: the config's, else `CAUSEWAY_HA_NODE`, else the
/// host name (a StatefulSet pod's name).
fn node_name(cfg: &HaConfig) -> anyhow::Result<String> {
    if let Some(n) = &cfg.node {
        return Ok(n.clone());
    }
    if let Ok(n) = std::env::var("CAUSEWAY_HA_NODE") {
        if !n.is_empty() {
            return Ok(n);
        }
    }
    Ok(nix::unistd::gethostname()
        .context("reading the host name (for ha.node)")?
        .to_string_lossy()
        .into_owned())
}

pub fn read_key(cfg: &HaConfig) -> anyhow::Result<Vec<u8>> {
    let raw = std::fs::read(&cfg.key_file)
        .with_context(|| format!("ha.keyFile {}", cfg.key_file.display()))?;
    let key = raw.trim_ascii().to_vec();
    if key.len() < MIN_KEY {
        anyhow::bail!(
            "ha.keyFile {}: {} bytes; the shared key needs at least {MIN_KEY}",
            cfg.key_file.display(),
            key.len()
        );
    }
    Ok(key)
}

/// Removes the service addresses from the interface, whoever put them
/// there: a replica holds them only once the election gives it the role.
/// Failures are logged, not fatal: the election's own start tries again.
pub async fn release_left_addresses(cfg: &HaConfig) {
    let released = match FloatingAddresses::new(&cfg.interface, cfg.addresses.clone()) {
        Ok(addresses) => addresses.release().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match released {
        Ok(()) => {
            tracing::info!(interface = %cfg.interface, "service addresses cleared before start")
        }
        Err(e) => {
            tracing::warn!(interface = %cfg.interface, error = %e, "cannot clear the service addresses before start")
        }
    }
}

/// `causeway ha-release`: removes the service addresses named by the
/// config's `ha` section, and says which it removed. Without an `ha`
/// section there is nothing to remove.
pub fn release_now(config: &std::path::Path) -> anyhow::Result<()> {
    let cfg = causeway_config::Config::load(config)
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    let Some(ha) = cfg.ha else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime for netlink")?;
    runtime.block_on(async {
        let addresses = FloatingAddresses::new(&ha.interface, ha.addresses.clone())
            .with_context(|| format!("opening netlink for {}", ha.interface))?;
        let held = addresses.held().await.unwrap_or_default();
        addresses
            .release()
            .await
            .with_context(|| format!("removing the service addresses from {}", ha.interface))?;
        for net in held {
            println!("removed {net} from {}", ha.interface);
        }
        Ok(())
    })
}

/// Starts the election. The highest term held or heard is kept beside the
/// DHCP lease file (`<lease file>.ha-term`), the state a takeover is about.
pub async fn start(
    cfg: &HaConfig,
    lease_file: Option<&std::path::Path>,
    registry: &prometheus::Registry,
) -> anyhow::Result<HaRuntime> {
    let name = node_name(cfg)?;
    let Some((me, peer)) = cfg.split(&name) else {
        anyhow::bail!(
            "this replica is {name:?}, which is neither ha.replicas[0].name ({}) nor ha.replicas[1].name ({}); set ha.node or CAUSEWAY_HA_NODE",
            cfg.replicas[0].name,
            cfg.replicas[1].name
        );
    };
    let key = read_key(cfg)?;
    let listen = match cfg.listen {
        Some(l) => l,
        None => {
            let port = me
                .address
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .context("ha.replicas: this replica's address has no port")?;
            SocketAddr::from(([0, 0, 0, 0], port))
        }
    };
    causeway_runtime::ha::set_floating(
        cfg.addresses.iter().map(|n| IpAddr::V4(n.addr())).collect(),
    );
    let dead_after = cfg.dead_after();
    let (mode, api_timeout, renew_interval) = match (&cfg.mode, &cfg.lease) {
        (HaMode::Lease, Some(l)) => (Mode::Lease, l.api_timeout, l.renew_interval),
        _ => (Mode::Peer, Duration::from_secs(1), Duration::from_secs(60)),
    };
    let settings = HaSettings {
        mode,
        name: me.name.clone(),
        peer_name: peer.name.clone(),
        peer_address: peer.address.clone(),
        listen,
        listen_interface: cfg.listen_interface.clone(),
        priority: me.priority,
        preempt: cfg.preempt,
        timers: Timers {
            advert: cfg.advert_interval,
            dead_after,
            api_timeout,
            renew_interval,
            degraded_renew: Duration::from_secs(5),
        },
        key: key.clone(),
        replicates_leases: lease_file.is_some(),
        vlan_path: match (me.vlan_address, peer.vlan_address) {
            (Some(listen), Some(peer)) => Some(VlanPath {
                listen,
                peer,
                interface: cfg.interface.clone(),
            }),
            _ => None,
        },
        track_interface: Some(cfg.interface.clone()),
        term_file: lease_file.map(|f| {
            let mut name = f.as_os_str().to_owned();
            name.push(".ha-term");
            std::path::PathBuf::from(name)
        }),
    };
    let metrics = HaMetrics::new(registry).context("registering the HA metrics")?;
    let addresses = Arc::new(
        FloatingAddresses::new(&cfg.interface, cfg.addresses.clone())
            .context("opening netlink for the service addresses")?,
    );
    let leadership = match mode {
        Mode::Peer => Leadership::start(settings, addresses, None::<Arc<NoWitness>>, metrics).await,
        Mode::Lease => {
            let lease = cfg.lease.as_ref().context("ha.lease")?;
            let witness = crate::witness::LeaseWitness::connect(lease, &me.name)
                .await
                .context("the Kubernetes Lease (ha.lease)")?;
            Leadership::start(settings, addresses, Some(Arc::new(witness)), metrics).await
        }
    }
    .with_context(|| format!("binding the HA advert socket {listen}"))?;
    tracing::info!(
        node = %me.name,
        peer = %peer.name,
        peer_address = %peer.address,
        %listen,
        mode = ?cfg.mode,
        addresses = ?cfg.addresses,
        "high availability: standing by until the election decides"
    );
    Ok(HaRuntime {
        share: causeway_dhcp::merge::Share::of(&me.name, &peer.name),
        leadership,
        key: Arc::new(AdvertKey::new(&key)),
        peer_address: peer.address.clone(),
        listen,
        listen_interface: cfg.listen_interface.clone(),
        replication_timeout: cfg.replication_timeout,
    })
}

/// What runs DHCP now.
enum DhcpRole {
    Idle,
    Serving(DhcpServer, Shutdown),
    Following(LeaseReceiver),
}

type LeaseSource = Arc<dyn Fn() -> Vec<LeaseRecord> + Send + Sync>;

struct DhcpSlot {
    role: DhcpRole,
    cfg: DhcpConfig,
    source: Option<LeaseSource>,
}

/// DHCP under high availability: the server on the active, the lease
/// stream's follower on the standby, switched as the role changes.
pub struct HaDhcp {
    slot: Arc<tokio::sync::Mutex<DhcpSlot>>,
    leases: Arc<Mutex<Option<LeaseSource>>>,
    task: tokio::task::JoinHandle<()>,
    stop: Shutdown,
}

pub struct HaDhcpParts {
    pub metrics: DhcpMetrics,
    pub observer: Option<LeaseObserver>,
    pub ready: ReadyHandle,
}

impl HaDhcp {
    pub fn start(
        cfg: &DhcpConfig,
        ha: &HaRuntime,
        parts: HaDhcpParts,
        registry: &prometheus::Registry,
        shutdown: Shutdown,
    ) -> anyhow::Result<HaDhcp> {
        let replication =
            ReplicationMetrics::new(registry).context("registering the replication metrics")?;
        let replicator = Replicator::new(
            ha.key.clone(),
            ha.replication_timeout,
            Some(replication.clone()),
        );
        replicator.set_gate(ha.leadership.ack_gate());
        replicator.set_share(ha.share);
        replicator.set_peer_clock(Box::new(ha.leadership.peer_wall_source()));
        replicator
            .listen(ha.listen, ha.listen_interface.as_deref())
            .with_context(|| format!("binding the lease stream on {}", ha.listen))?;
        let slot = Arc::new(tokio::sync::Mutex::new(DhcpSlot {
            role: DhcpRole::Idle,
            cfg: cfg.clone(),
            source: None,
        }));
        let leases = Arc::new(Mutex::new(None));
        let stop = shutdown.child_token();
        let switch = Switch {
            slot: slot.clone(),
            leases: leases.clone(),
            replicator,
            replication,
            key: ha.key.clone(),
            peer: ha.peer_address.clone(),
            in_sync: ha.leadership.in_sync(),
            parts,
            stop: stop.clone(),
        };
        let task = tokio::spawn(switch.run(ha.leadership.role()));
        Ok(HaDhcp {
            slot,
            leases,
            task,
            stop,
        })
    }

    /// For the admin's `/leases`: the running server's, none while standing
    /// by.
    pub fn lease_source(&self) -> impl Fn() -> Vec<LeaseRecord> + Send + Sync + 'static {
        let leases = self.leases.clone();
        move || {
            let source = leases.lock().unwrap_or_else(|p| p.into_inner()).clone();
            source.map(|s| s()).unwrap_or_default()
        }
    }
}

struct Switch {
    slot: Arc<tokio::sync::Mutex<DhcpSlot>>,
    leases: Arc<Mutex<Option<LeaseSource>>>,
    replicator: Arc<Replicator>,
    replication: ReplicationMetrics,
    key: Arc<AdvertKey>,
    peer: String,
    in_sync: Arc<std::sync::atomic::AtomicBool>,
    parts: HaDhcpParts,
    stop: Shutdown,
}

impl Switch {
    async fn run(self, mut role: watch::Receiver<Role>) {
        let mut ready_poll = tokio::time::interval(Duration::from_millis(200));
        loop {
            let now = *role.borrow_and_update();
            self.become_(now).await;
            loop {
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    changed = role.changed() => {
                        if changed.is_err() { return; }
                        break;
                    }
                    _ = ready_poll.tick() => {
                        // A standby is ready once it follows the stream; an
                        // active's readiness is its server's.
                        let slot = self.slot.lock().await;
                        if matches!(slot.role, DhcpRole::Following(_)) {
                            self.parts.ready.set(self.in_sync.load(Ordering::Relaxed));
                        }
                    }
                }
            }
        }
    }

    async fn become_(&self, role: Role) {
        let mut slot = self.slot.lock().await;
        let current = std::mem::replace(&mut slot.role, DhcpRole::Idle);
        match (role, current) {
            (Role::Active, DhcpRole::Serving(s, t)) => slot.role = DhcpRole::Serving(s, t),
            (Role::Standby, DhcpRole::Following(f)) => slot.role = DhcpRole::Following(f),
            (Role::Active, other) => {
                stop_role(other).await;
                self.in_sync.store(true, Ordering::Relaxed);
                let token = self.stop.child_token();
                let started = DhcpServer::start_replicated(
                    &slot.cfg,
                    self.parts.metrics.clone(),
                    token.clone(),
                    self.parts.observer.clone(),
                    self.parts.ready.clone(),
                    Some(self.replicator.clone()),
                )
                .await;
                match started {
                    Ok(server) => {
                        let source: LeaseSource = Arc::new(server.lease_source());
                        *self.leases.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(source.clone());
                        slot.source = Some(source);
                        tracing::info!("DHCP serving as the active replica");
                        slot.role = DhcpRole::Serving(server, token);
                    }
                    Err(e) => {
                        self.parts.ready.set(false);
                        tracing::error!(error = %e, "DHCP failed to start on the active replica");
                    }
                }
            }
            (Role::Standby, other) => {
                stop_role(other).await;
                *self.leases.lock().unwrap_or_else(|p| p.into_inner()) = None;
                slot.source = None;
                self.parts.ready.set(false);
                match LeaseReceiver::start(
                    slot.cfg.lease_file.clone(),
                    self.peer.clone(),
                    self.key.clone(),
                    Some(self.replication.clone()),
                    self.in_sync.clone(),
                    self.parts.observer.clone(),
                ) {
                    Ok(r) => {
                        tracing::info!(active = %self.peer, "DHCP standing by, following the active's lease stream");
                        slot.role = DhcpRole::Following(r);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start following the lease stream")
                    }
                }
            }
        }
    }
}

async fn stop_role(role: DhcpRole) {
    match role {
        DhcpRole::Idle => {}
        DhcpRole::Serving(server, token) => {
            token.cancel();
            server.wait().await;
            tracing::info!("DHCP server stopped: this replica stands by");
        }
        DhcpRole::Following(receiver) => {
            let _ = tokio::task::spawn_blocking(move || receiver.stop()).await;
        }
    }
}

impl causeway_runtime::Service for HaDhcp {
    type Config = DhcpConfig;
    type Error = DhcpError;
    const NAME: &'static str = "DHCP";

    async fn reload(&self, cfg: &DhcpConfig) -> Result<(), DhcpError> {
        let mut slot = self.slot.lock().await;
        slot.cfg = cfg.clone();
        if let DhcpRole::Serving(server, _) = &slot.role {
            server.reload(cfg)?;
        }
        Ok(())
    }

    async fn stop(self, _deadline: Duration) {
        self.stop.cancel();
        let _ = self.task.await;
        let mut slot = self.slot.lock().await;
        let role = std::mem::replace(&mut slot.role, DhcpRole::Idle);
        stop_role(role).await;
    }
}
