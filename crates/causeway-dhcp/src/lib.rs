//! DHCPv4 for causeway (RFC 2131/2132): a sans-IO engine, the allocator
//! behind it, a durable lease store with group commit, and the socket I/O
//! that ties them together.
//!
//! The engine ([`Engine`]) turns a decoded request, the time and the lease
//! state into a reply and a lease change; it opens no sockets or files and
//! reads no clock, so tests, fuzzing and benches drive it directly. The
//! server ([`DhcpServer`]) sends a reply only after its lease change is on
//! stable storage.
//!
//! It is not a general DHCP server: of DHCPv6 it serves the stateless
//! part only ([`v6`], [`server6`]; no addresses from pools), and it sends
//! no DNS updates of its own (whoever runs it is told of each lease through
//! a [`LeaseObserver`]). It does not parse config files; it takes
//! [`causeway_config::DhcpConfig`].

pub mod client;
pub mod clock;
pub mod engine;
pub mod follower;
pub mod ha;
mod index;
pub mod lease;
pub mod lease6;
pub mod limits;
pub mod merge;
pub mod metrics;
pub mod pool;
pub mod replica;
pub mod reply;
pub mod server;
pub mod server6;
#[cfg(test)]
mod sim;
pub mod store;
pub mod v6;
pub mod wire;

pub use client::ClientKey;
pub use engine::{Destination, Engine, Ignored, Ingress, Outcome, PoolStats, Reply};
pub use lease::{Lease, LeaseObserver, LeaseRecord, LeaseState};
pub use metrics::DhcpMetrics;
pub use server::{unix_now, DhcpError, DhcpServer, SendReply, V6Port};
pub use server6::{Dhcp6Error, Dhcp6Metrics, Dhcp6Server};
pub use store::{parse_log, read_log, LeaseStore, Recovery, StoreError};

/// Feeds arbitrary bytes through decode and the engine, as a fuzz target and
/// the stable-toolchain property test both do. Must never panic.
pub fn drive_bytes(engine: &mut Engine, now: u64, bytes: &[u8]) {
    if let Ok(msg) = wire::decode(bytes) {
        let source = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(127, 0, 0, 1), 67);
        for ingress in [Ingress::Address, Ingress::Interface("net1".into())] {
            if let Outcome::Reply { mut reply, .. } = engine.handle(now, &msg, source, &ingress) {
                let _ = wire::encode(&mut reply.message);
            }
        }
    }
}
