//! The stateless DHCPv6 server on the wire: UDP port 547 on the VLAN
//! interface, the All_DHCP_Relay_Agents_and_Servers group (ff02::1:2)
//! joined there, each request answered by [`crate::v6::Stateless`] to the
//! address it came from (a client's link-local address and port 546, or a
//! relay's address and port 547).
//!
//! Nothing is stored: a stateless reply depends on the config alone, so
//! there is nothing to make durable before it is sent.

use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use causeway_config::Dhcp6Config;
use causeway_runtime::Shutdown;
use prometheus::{IntCounterVec, Opts, Registry};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::task::JoinHandle;

use crate::v6::{duid_ll, Ignored6, Stateless};

const SERVER_PORT: u16 = 547;
const ALL_DHCP_AGENTS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);

#[derive(Debug, thiserror::Error)]
pub enum Dhcp6Error {
    #[error("DHCPv6 on {interface}: {reason}")]
    Listen { interface: String, reason: String },
    #[error("the interface cannot change on reload ({running} to {next}); restart to move")]
    InterfaceChanged { running: String, next: String },
}

#[derive(Clone)]
pub struct Dhcp6Metrics {
    /// Replies sent, by how they came (`direct`, `relayed`).
    replies: IntCounterVec,
    /// Datagrams not answered, by reason.
    dropped: IntCounterVec,
}

impl Dhcp6Metrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Dhcp6Metrics {
            replies: IntCounterVec::new(
                Opts::new(
                    "causeway_dhcp6_replies_total",
                    "DHCPv6 replies sent, by path (direct, relayed)",
                ),
                &["path"],
            )?,
            dropped: IntCounterVec::new(
                Opts::new(
                    "causeway_dhcp6_dropped_total",
                    "DHCPv6 datagrams not answered, by reason",
                ),
                &["reason"],
            )?,
        };
        registry.register(Box::new(m.replies.clone()))?;
        registry.register(Box::new(m.dropped.clone()))?;
        for path in ["direct", "relayed"] {
            m.replies.with_label_values(&[path]);
        }
        for reason in Ignored6::ALL {
            m.dropped.with_label_values(&[reason.label()]);
        }
        m.dropped.with_label_values(&["send_failed"]);
        Ok(m)
    }
}

pub struct Dhcp6Server {
    answers: Arc<RwLock<(Dhcp6Config, Stateless)>>,
    mac_duid: Vec<u8>,
    task: JoinHandle<()>,
}

fn interface_mac(interface: &str) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{interface}/address")).ok()?;
    causeway_config::parse_mac(text.trim()).filter(|m| *m != [0; 6])
}

fn open(interface: &str) -> io::Result<tokio::net::UdpSocket> {
    let index = nix::net::if_::if_nametoindex(interface).map_err(io::Error::from)?;
    let socket = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_only_v6(true)?;
    socket.set_reuse_address(true)?;
    socket.bind_device(Some(interface.as_bytes()))?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, SERVER_PORT)).into())?;
    socket.join_multicast_v6(&ALL_DHCP_AGENTS, index)?;
    tokio::net::UdpSocket::from_std(socket.into())
}

impl Dhcp6Server {
    /// Must run inside a tokio runtime.
    pub fn start(
        cfg: &Dhcp6Config,
        metrics: Dhcp6Metrics,
        stop: Shutdown,
    ) -> Result<Dhcp6Server, Dhcp6Error> {
        let fail = |reason: String| Dhcp6Error::Listen {
            interface: cfg.interface.clone(),
            reason,
        };
        let mac = interface_mac(&cfg.interface);
        // Without a MAC (a tunnel, a test's dummy link) the DUID is still
        // stable: DUID-LL of zeros would be shared by every such server,
        // so a config's serverDuid is then the way to tell them apart.
        let mac_duid = duid_ll(mac.unwrap_or_default());
        let socket = open(&cfg.interface).map_err(|e| fail(e.to_string()))?;
        let stateless = Stateless::new(cfg, mac_duid.clone());
        tracing::info!(
            interface = %cfg.interface,
            dns_servers = cfg.dns_servers.len(),
            domains = cfg.domain_search.len(),
            "stateless DHCPv6 listening on [::]:547"
        );
        let answers = Arc::new(RwLock::new((cfg.clone(), stateless)));
        let task = tokio::spawn(serve(socket, answers.clone(), metrics, stop));
        Ok(Dhcp6Server {
            answers,
            mac_duid,
            task,
        })
    }
}

async fn serve(
    socket: tokio::net::UdpSocket,
    answers: Arc<RwLock<(Dhcp6Config, Stateless)>>,
    metrics: Dhcp6Metrics,
    stop: Shutdown,
) {
    let mut buf = vec![0u8; 65536];
    loop {
        let (len, from) = tokio::select! {
            _ = stop.cancelled() => return,
            got = socket.recv_from(&mut buf) => match got {
                Ok(got) => got,
                Err(e) => {
                    tracing::warn!(error = %e, "DHCPv6 receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let answer = {
            let guard = answers.read().unwrap_or_else(|p| p.into_inner());
            guard.1.handle(&buf[..len])
        };
        match answer {
            Ok(answer) => {
                let to = match from {
                    SocketAddr::V6(a) => {
                        SocketAddr::V6(SocketAddrV6::new(*a.ip(), a.port(), 0, a.scope_id()))
                    }
                    other => other,
                };
                match socket.send_to(&answer.bytes, to).await {
                    Ok(_) => {
                        let path = if answer.relays > 0 {
                            "relayed"
                        } else {
                            "direct"
                        };
                        metrics.replies.with_label_values(&[path]).inc();
                    }
                    Err(e) => {
                        metrics.dropped.with_label_values(&["send_failed"]).inc();
                        tracing::debug!(%to, error = %e, "DHCPv6 reply not sent");
                    }
                }
            }
            Err(reason) => {
                metrics.dropped.with_label_values(&[reason.label()]).inc();
                tracing::debug!(%from, %reason, "DHCPv6 datagram not answered");
            }
        }
    }
}

impl causeway_runtime::Service for Dhcp6Server {
    type Config = Dhcp6Config;
    type Error = Dhcp6Error;
    const NAME: &'static str = "DHCPv6";

    async fn reload(&self, cfg: &Dhcp6Config) -> Result<(), Dhcp6Error> {
        let mut guard = self.answers.write().unwrap_or_else(|p| p.into_inner());
        if guard.0.interface != cfg.interface {
            return Err(Dhcp6Error::InterfaceChanged {
                running: guard.0.interface.clone(),
                next: cfg.interface.clone(),
            });
        }
        *guard = (cfg.clone(), Stateless::new(cfg, self.mac_duid.clone()));
        Ok(())
    }

    async fn stop(self, _deadline: Duration) {
        let _ = self.task.await;
    }
}
