//! The DHCPv6 server on the wire: UDP port 547 on the VLAN interface, the
//! All_DHCP_Relay_Agents_and_Servers group (ff02::1:2) joined there, each
//! request answered to the address it came from (a client's link-local
//! address and port 546, or a relay's address and port 547).
//!
//! An Information-Request is answered here from the config alone
//! ([`crate::v6::Stateless`]): nothing to make durable. Every message that
//! leases addresses goes through a [`V6Port`] to the DHCP server whose
//! store keeps the leases ([`crate::lease6`]), and its reply leaves only
//! once the lease is on disk.

use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use causeway_config::Dhcp6Config;
use causeway_runtime::Shutdown;
use prometheus::{IntCounterVec, Opts, Registry};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::task::JoinHandle;

use crate::server::V6Port;
use crate::v6::{decode_client, duid_ll, unwrap_relays, Ignored6, Stateless};
use dhcproto::v6::MessageType;

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
    /// Replies sent, by type (advertise, reply).
    sent: IntCounterVec,
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
            sent: IntCounterVec::new(
                Opts::new(
                    "causeway_dhcp6_sent_total",
                    "DHCPv6 replies sent, by message type (advertise, reply)",
                ),
                &["type"],
            )?,
        };
        registry.register(Box::new(m.sent.clone()))?;
        for kind in ["advertise", "reply"] {
            m.sent.with_label_values(&[kind]);
        }
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
    port: Option<V6Port>,
    task: JoinHandle<()>,
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
    /// `port` leads to the DHCP server that keeps the leases; required
    /// when the config leases addresses (`dhcp6.pools`/`reservations`).
    pub fn start(
        cfg: &Dhcp6Config,
        metrics: Dhcp6Metrics,
        stop: Shutdown,
        port: Option<V6Port>,
    ) -> Result<Dhcp6Server, Dhcp6Error> {
        let fail = |reason: String| Dhcp6Error::Listen {
            interface: cfg.interface.clone(),
            reason,
        };
        let mac = causeway_runtime::link::interface_mac(&cfg.interface);
        // Without a MAC (a tunnel, a test's dummy link) the DUID is still
        // stable: DUID-LL of zeros would be shared by every such server,
        // so a config's serverDuid is then the way to tell them apart.
        let mac_duid = duid_ll(mac.unwrap_or_default());
        let socket = open(&cfg.interface).map_err(|e| fail(e.to_string()))?;
        let stateless = Stateless::new(cfg, mac_duid.clone());
        if cfg.stateful.is_some() && port.is_none() {
            return Err(fail(
                "leasing addresses needs the dhcp section's lease store".into(),
            ));
        }
        if let Some(port) = &port {
            port.configure(cfg, mac_duid.clone());
        }
        tracing::info!(
            interface = %cfg.interface,
            dns_servers = cfg.dns_servers.len(),
            domains = cfg.domain_search.len(),
            stateful = cfg.stateful.is_some(),
            "DHCPv6 listening on [::]:547"
        );
        let answers = Arc::new(RwLock::new((cfg.clone(), stateless)));
        let task = tokio::spawn(serve(
            Arc::new(socket),
            answers.clone(),
            port.clone(),
            metrics,
            stop,
        ));
        Ok(Dhcp6Server {
            answers,
            mac_duid,
            port,
            task,
        })
    }
}

async fn serve(
    socket: Arc<tokio::net::UdpSocket>,
    answers: Arc<RwLock<(Dhcp6Config, Stateless)>>,
    port: Option<V6Port>,
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
        let to = match from {
            SocketAddr::V6(a) => {
                SocketAddr::V6(SocketAddrV6::new(*a.ip(), a.port(), 0, a.scope_id()))
            }
            other => other,
        };
        if let Err(reason) = answer(&buf[..len], to, &socket, &answers, port.as_ref(), &metrics) {
            metrics.dropped.with_label_values(&[reason.label()]).inc();
            tracing::debug!(%from, %reason, "DHCPv6 datagram not answered");
        }
    }
}

fn answer(
    bytes: &[u8],
    to: SocketAddr,
    socket: &Arc<tokio::net::UdpSocket>,
    answers: &RwLock<(Dhcp6Config, Stateless)>,
    port: Option<&V6Port>,
    metrics: &Dhcp6Metrics,
) -> Result<(), Ignored6> {
    let relayed = unwrap_relays(bytes)?;
    let msg = decode_client(relayed.client)?;
    let path = relayed.path.clone();
    let sender = {
        let (socket, metrics) = (socket.clone(), metrics.clone());
        move |kind: &'static str, reply: Vec<u8>| {
            let bytes = match path.wrap(&reply) {
                Ok(b) => b,
                Err(reason) => {
                    metrics.dropped.with_label_values(&[reason.label()]).inc();
                    return;
                }
            };
            // A datagram socket's send does not wait for anything but
            // buffer space; when that is short, the client retransmits.
            match socket.try_send_to(&bytes, to) {
                Ok(_) => {
                    let how = if path.depth() > 0 {
                        "relayed"
                    } else {
                        "direct"
                    };
                    metrics.replies.with_label_values(&[how]).inc();
                    metrics.sent.with_label_values(&[kind]).inc();
                }
                Err(e) => {
                    metrics.dropped.with_label_values(&["send_failed"]).inc();
                    tracing::debug!(%to, error = %e, "DHCPv6 reply not sent");
                }
            }
        }
    };
    if msg.msg_type() == MessageType::InformationRequest {
        let reply = {
            let guard = answers.read().unwrap_or_else(|p| p.into_inner());
            guard.1.information_reply(&msg)?
        };
        sender("reply", reply);
        return Ok(());
    }
    let Some(port) = port else {
        return Err(Ignored6::NotServed);
    };
    port.handle(
        &relayed,
        &msg,
        Box::new(move |reply, kind| {
            // A Solicit is answered by an Advertise, or by a Reply with
            // Rapid Commit.
            let label = match kind {
                MessageType::Advertise => "advertise",
                _ => "reply",
            };
            sender(label, reply);
        }),
    )
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
        if cfg.stateful.is_some() && self.port.is_none() {
            return Err(Dhcp6Error::Listen {
                interface: cfg.interface.clone(),
                reason: "leasing addresses needs the dhcp section's lease store; restart with it"
                    .into(),
            });
        }
        *guard = (cfg.clone(), Stateless::new(cfg, self.mac_duid.clone()));
        if let Some(port) = &self.port {
            port.configure(cfg, self.mac_duid.clone());
        }
        Ok(())
    }

    async fn stop(self, _deadline: Duration) {
        let _ = self.task.await;
    }
}
