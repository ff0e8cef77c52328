//! Router advertisements on the wire: a raw ICMPv6 socket on the VLAN
//! interface that multicasts advertisements on [`crate::ra::Schedule`]'s
//! timing and answers router solicitations.
//!
//! With a configured `source` the advertisements leave from that
//! link-local address. A replica that does not hold it (an HA standby: the
//! address floats with the service addresses) cannot send from it, and
//! stays quiet, trying again each second; the first send that succeeds
//! starts the fast initial advertisements, so hosts hear the same router
//! within about a second of a takeover.
#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::net::Ipv6Addr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use causeway_config::RouterAdvertConfig;
use causeway_runtime::Shutdown;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn6,
};
use prometheus::{IntCounterVec, Opts, Registry};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ra::{self, Due, Schedule};

const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// How often a replica without the router address tries again.
const QUIET_RETRY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum AdvertError {
    #[error("interface {0} not found")]
    NoInterface(String),
    #[error("opening the ICMPv6 socket on {interface}: {source}")]
    Socket {
        interface: String,
        source: io::Error,
    },
    #[error("the interface cannot change on reload ({running} to {next}); restart to move")]
    InterfaceChanged { running: String, next: String },
}

#[derive(Clone)]
pub struct AdvertMetrics {
    /// Advertisements sent, by kind (`multicast`, `unicast`, `final`).
    sent: IntCounterVec,
    /// Solicitations received, by result (`answered`, `invalid`).
    solicitations: IntCounterVec,
    /// Sends that failed, by reason (`no_source`, `error`).
    send_failures: IntCounterVec,
}

impl AdvertMetrics {
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = AdvertMetrics {
            sent: IntCounterVec::new(
                Opts::new(
                    "causeway_ra_sent_total",
                    "Router advertisements sent, by kind (multicast: periodic or to a host without an address; unicast: to a soliciting host; final)",
                ),
                &["kind"],
            )?,
            solicitations: IntCounterVec::new(
                Opts::new(
                    "causeway_ra_solicitations_total",
                    "Router solicitations received, by result (answered, invalid)",
                ),
                &["result"],
            )?,
            send_failures: IntCounterVec::new(
                Opts::new(
                    "causeway_ra_send_failures_total",
                    "Advertisements not sent, by reason (no_source: this replica does not hold the router address; error)",
                ),
                &["reason"],
            )?,
        };
        registry.register(Box::new(m.sent.clone()))?;
        registry.register(Box::new(m.solicitations.clone()))?;
        registry.register(Box::new(m.send_failures.clone()))?;
        for kind in ["multicast", "unicast", "final"] {
            m.sent.with_label_values(&[kind]);
        }
        for result in ["answered", "invalid"] {
            m.solicitations.with_label_values(&[result]);
        }
        for reason in ["no_source", "error"] {
            m.send_failures.with_label_values(&[reason]);
        }
        Ok(m)
    }
}

pub struct RouterAdvertiser {
    config: watch::Sender<RouterAdvertConfig>,
    task: JoinHandle<()>,
}

struct Link {
    socket: AsyncFd<Socket>,
    index: u32,
    mac: Option<[u8; 6]>,
}

/// Lets only router solicitations through to the socket: a raw ICMPv6
/// socket otherwise gets a copy of every neighbour discovery message and
/// echo on the link.
fn only_solicitations(socket: &Socket) -> io::Result<()> {
    // Linux's ICMP6_FILTER at level IPPROTO_ICMPV6: 256 bits, a set bit
    // blocks that type.
    const ICMP6_FILTER: libc::c_int = 1;
    let mut blocked = [u32::MAX; 8];
    let t = usize::from(ra::ROUTER_SOLICITATION);
    blocked[t >> 5] &= !(1u32 << (t & 31));
    // SAFETY: a setsockopt on a descriptor the socket owns, with a
    // pointer to a fully initialised array and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_ICMPV6,
            ICMP6_FILTER,
            blocked.as_ptr().cast(),
            std::mem::size_of_val(&blocked) as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn open(interface: &str) -> Result<Link, AdvertError> {
    let index = nix::net::if_::if_nametoindex(interface)
        .map_err(|_| AdvertError::NoInterface(interface.to_string()))?;
    let fail = |source: io::Error| AdvertError::Socket {
        interface: interface.to_string(),
        source,
    };
    let socket = Socket::new(
        Domain::IPV6,
        Type::RAW.nonblocking().cloexec(),
        Some(Protocol::ICMPV6),
    )
    .map_err(fail)?;
    socket
        .bind_device(Some(interface.as_bytes()))
        .map_err(fail)?;
    // RFC 4861: hosts drop neighbour discovery with any other hop limit,
    // which is what proves a message came from the link.
    socket.set_multicast_hops_v6(255).map_err(fail)?;
    socket.set_unicast_hops_v6(255).map_err(fail)?;
    socket.set_multicast_loop_v6(false).map_err(fail)?;
    socket.set_multicast_if_v6(index).map_err(fail)?;
    socket
        .join_multicast_v6(&ALL_ROUTERS, index)
        .map_err(fail)?;
    setsockopt(&socket.as_fd(), sockopt::Ipv6RecvHopLimit, &true)
        .map_err(|e| fail(io::Error::from(e)))?;
    only_solicitations(&socket).map_err(fail)?;
    // SAFETY: the socket owns its descriptor, keeps it open until the
    // AsyncFd drops it, and always returns the same one.
    let socket = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }
        .map_err(|e| fail(io::Error::from(e)))?;
    Ok(Link {
        socket,
        index,
        mac: causeway_runtime::link::interface_mac(interface),
    })
}

enum Sent {
    Yes,
    /// The configured source is not on this interface (yet).
    NoSource,
    Failed(io::Error),
}

fn send(link: &Link, message: &[u8], to: Ipv6Addr, source: Option<Ipv6Addr>) -> Sent {
    let destination = SockaddrIn6::from(std::net::SocketAddrV6::new(to, 0, 0, link.index));
    let iov = [IoSlice::new(message)];
    let info = source.map(|s| libc::in6_pktinfo {
        ipi6_addr: libc::in6_addr {
            s6_addr: s.octets(),
        },
        ipi6_ifindex: link.index,
    });
    let control: Vec<ControlMessage> = info.iter().map(ControlMessage::Ipv6PacketInfo).collect();
    match sendmsg(
        link.socket.get_ref().as_raw_fd(),
        &iov,
        &control,
        MsgFlags::MSG_DONTWAIT,
        Some(&destination),
    ) {
        Ok(_) => Sent::Yes,
        Err(nix::errno::Errno::EADDRNOTAVAIL | nix::errno::Errno::EINVAL) if source.is_some() => {
            Sent::NoSource
        }
        Err(e) => Sent::Failed(e.into()),
    }
}

/// Reads every waiting solicitation into the schedule.
fn receive(link: &Link, schedule: &mut Schedule, metrics: Option<&AdvertMetrics>) {
    let mut buf = [0u8; 1500];
    loop {
        let mut cmsg = nix::cmsg_space!(libc::c_int);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let received = recvmsg::<SockaddrIn6>(
            link.socket.get_ref().as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_DONTWAIT,
        );
        let (from, hop_limit, length) = match received {
            Ok(msg) => {
                let hop_limit = msg.cmsgs().ok().and_then(|mut c| {
                    c.find_map(|m| match m {
                        ControlMessageOwned::Ipv6HopLimit(h) => u8::try_from(h).ok(),
                        _ => None,
                    })
                });
                (msg.address.map(|a| a.ip()), hop_limit, msg.bytes)
            }
            Err(nix::errno::Errno::EAGAIN) => return,
            Err(e) => {
                tracing::debug!("reading a router solicitation: {e}");
                return;
            }
        };
        let Some(from) = from else {
            continue;
        };
        let body = &buf[..length.min(buf.len())];
        match ra::parse_solicitation(body, from, hop_limit) {
            Ok(rs) => {
                if let Some(m) = metrics {
                    m.solicitations.with_label_values(&["answered"]).inc();
                }
                schedule.on_solicitation(Instant::now().into_std(), &rs);
            }
            Err(e) => {
                if let Some(m) = metrics {
                    m.solicitations.with_label_values(&["invalid"]).inc();
                }
                tracing::debug!(%from, "router solicitation ignored: {e}");
            }
        }
    }
}

fn seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::from(now.subsec_nanos()) ^ now.as_secs() ^ u64::from(std::process::id()) << 32
}

async fn run(
    link: Link,
    mut config: watch::Receiver<RouterAdvertConfig>,
    metrics: Option<AdvertMetrics>,
    stop: Shutdown,
    final_on_stop: bool,
) {
    let mut cfg = config.borrow_and_update().clone();
    let mut message = ra::advertisement(&cfg, link.mac, cfg.router_lifetime);
    let mut schedule = Schedule::new(
        Instant::now().into_std(),
        cfg.min_interval,
        cfg.max_interval,
        seed(),
    );
    // Whether the last send found the source address missing: a quiet
    // replica retries each second and starts over once it can send.
    let mut quiet = false;
    loop {
        let deadline = Instant::from_std(schedule.next_deadline());
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = config.changed() => {
                if changed.is_err() { break }
                cfg = config.borrow_and_update().clone();
                message = ra::advertisement(&cfg, link.mac, cfg.router_lifetime);
                schedule.restart(Instant::now().into_std(), cfg.min_interval, cfg.max_interval);
            }
            ready = link.socket.readable() => {
                match ready {
                    Ok(mut guard) => {
                        receive(&link, &mut schedule, metrics.as_ref());
                        guard.clear_ready();
                    }
                    Err(e) => {
                        tracing::error!("router advertisement socket failed: {e}");
                        break;
                    }
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                for due in schedule.take_due(Instant::now().into_std()) {
                    let (to, kind) = match due {
                        Due::Multicast => (ALL_NODES, "multicast"),
                        Due::Unicast(host) => (host, "unicast"),
                    };
                    match send(&link, &message, to, cfg.source) {
                        Sent::Yes => {
                            if let Some(m) = &metrics {
                                m.sent.with_label_values(&[kind]).inc();
                            }
                            if quiet {
                                quiet = false;
                                tracing::info!(interface = %cfg.interface, "router address held: advertising");
                                schedule.restart(Instant::now().into_std(), cfg.min_interval, cfg.max_interval);
                            }
                        }
                        Sent::NoSource => {
                            if let Some(m) = &metrics {
                                m.send_failures.with_label_values(&["no_source"]).inc();
                            }
                            if !quiet {
                                quiet = true;
                                tracing::info!(interface = %cfg.interface, source = ?cfg.source, "the router address is not on the interface: quiet until it is");
                            }
                        }
                        Sent::Failed(e) => {
                            if let Some(m) = &metrics {
                                m.send_failures.with_label_values(&["error"]).inc();
                            }
                            // A link without carrier refuses every send
                            // until it comes up: not worth a warning each.
                            let down = matches!(e.raw_os_error(), Some(libc::ENETDOWN | libc::ENOBUFS));
                            if down {
                                tracing::debug!(interface = %cfg.interface, %to, "router advertisement not sent, the link is down: {e}");
                            } else {
                                tracing::warn!(interface = %cfg.interface, %to, "router advertisement not sent: {e}");
                            }
                        }
                    }
                }
                if quiet {
                    schedule.restart(Instant::now().into_std() + QUIET_RETRY, cfg.min_interval, cfg.max_interval);
                }
            }
        }
    }
    if final_on_stop && !quiet {
        // RFC 4861 section 6.2.5: hosts stop using this router at once
        // instead of when its lifetime runs out.
        let last = ra::advertisement(&cfg, link.mac, Duration::ZERO);
        if let Sent::Yes = send(&link, &last, ALL_NODES, cfg.source) {
            if let Some(m) = &metrics {
                m.sent.with_label_values(&["final"]).inc();
            }
            tracing::info!(interface = %cfg.interface, "final router advertisement sent (router lifetime 0)");
        }
    }
}

impl RouterAdvertiser {
    /// Opens the socket and starts advertising. `final_on_stop`: whether
    /// stopping withdraws the router; not under HA, where the peer goes on
    /// as the same router.
    pub fn start(
        cfg: RouterAdvertConfig,
        metrics: Option<AdvertMetrics>,
        stop: Shutdown,
        final_on_stop: bool,
    ) -> Result<Self, AdvertError> {
        let link = open(&cfg.interface)?;
        tracing::info!(
            interface = %cfg.interface,
            prefixes = cfg.prefixes.len(),
            dns_servers = cfg.dns_servers.len(),
            router_lifetime_s = cfg.router_lifetime.as_secs(),
            "router advertisements on"
        );
        let (config, receiver) = watch::channel(cfg);
        let task = tokio::spawn(run(link, receiver, metrics, stop, final_on_stop));
        Ok(RouterAdvertiser { config, task })
    }
}

impl causeway_runtime::Service for RouterAdvertiser {
    type Config = RouterAdvertConfig;
    type Error = AdvertError;
    const NAME: &'static str = "router advertisements";

    async fn reload(&self, cfg: &RouterAdvertConfig) -> Result<(), AdvertError> {
        let running = self.config.borrow().interface.clone();
        if running != cfg.interface {
            return Err(AdvertError::InterfaceChanged {
                running,
                next: cfg.interface.clone(),
            });
        }
        self.config.send_if_modified(|c| {
            let changed = c != cfg;
            *c = cfg.clone();
            changed
        });
        Ok(())
    }

    async fn stop(self, _deadline: Duration) {
        let _ = self.task.await;
    }
}
