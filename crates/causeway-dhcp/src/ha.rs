//! DHCP under high availability: the server on the active replica, the
//! lease stream's follower on the standby, switched as the election's role
//! changes. The election itself is `causeway_runtime::ha`; this module
//! only follows its role.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use causeway_config::DhcpConfig;
use causeway_runtime::ha::advert::AdvertKey;
use causeway_runtime::ha::{Leadership, Role};
use causeway_runtime::{ReadyHandle, Shutdown};
use tokio::sync::watch;

use crate::follower::LeaseReceiver;
use crate::merge::Share;
use crate::replica::{ReplicationMetrics, Replicator};
use crate::{DhcpError, DhcpMetrics, DhcpServer, LeaseObserver, LeaseRecord};

/// How this replica replicates its leases to the other.
pub struct HaDhcpSettings {
    pub key: Arc<AdvertKey>,
    /// The peer's `host:port`: its lease stream (TCP).
    pub peer_address: String,
    pub listen: SocketAddr,
    pub listen_interface: Option<String>,
    pub replication_timeout: Duration,
    /// This replica's half of the DHCP pool while no standby confirms.
    pub share: Share,
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
    /// Where stateful DHCPv6 finds the active's store.
    pub v6: Option<crate::V6Port>,
}

impl HaDhcp {
    pub fn start(
        cfg: &DhcpConfig,
        ha: &HaDhcpSettings,
        leadership: &Leadership,
        parts: HaDhcpParts,
        registry: &prometheus::Registry,
        shutdown: Shutdown,
    ) -> Result<HaDhcp, DhcpError> {
        let replication = ReplicationMetrics::new(registry).map_err(|e| DhcpError::Bind {
            what: "replication metrics".into(),
            reason: e.to_string(),
        })?;
        let replicator = Replicator::new(
            ha.key.clone(),
            ha.replication_timeout,
            Some(replication.clone()),
        );
        replicator.set_gate(leadership.ack_gate());
        replicator.set_share(ha.share);
        replicator.set_peer_clock(Box::new(leadership.peer_wall_source()));
        replicator
            .listen(ha.listen, ha.listen_interface.as_deref())
            .map_err(|e| DhcpError::Bind {
                what: format!("the lease stream on {}", ha.listen),
                reason: e.to_string(),
            })?;
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
            in_sync: leadership.in_sync(),
            parts,
            stop: stop.clone(),
        };
        let task = tokio::spawn(switch.run(leadership.role()));
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
        if role != Role::Active {
            // A standby leases nothing, over either family.
            if let Some(port) = &self.parts.v6 {
                port.detach();
            }
        }
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
                        if let Some(port) = &self.parts.v6 {
                            server.serve_v6(port);
                        }
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
