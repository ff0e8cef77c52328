//! Admission by rate: messages per second per client, per relay agent, per
//! subnet and in all. Each is a fixed one-second window of counters, so
//! the state never outlives a second and costs a hash lookup per message.
//!
//! The checks run from the narrowest scope to the widest, and a message
//! dropped by one is not charged to the ones after it: a client over its
//! own limit spends none of its subnet's budget, and a flood held back by
//! its subnet's limit spends none of the global one. A flood with forged
//! MACs passes the per-client check and is held at its subnet's or relay's
//! limit, so other subnets and relays keep being served.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use causeway_config::DhcpConfig;

use crate::client::ClientKey;

/// Maps sized for a burst are dropped when quiet rather than kept.
const KEEP_CAPACITY: usize = 4096;

/// The configured limits, in messages per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    pub per_client: u32,
    pub per_relay: Option<u32>,
    pub per_subnet: Option<u32>,
    pub global: Option<u32>,
}

impl RateLimits {
    pub fn from_config(cfg: &DhcpConfig) -> Self {
        RateLimits {
            per_client: cfg.rate_limit_per_client,
            per_relay: cfg.rate_limit_per_relay,
            per_subnet: cfg.rate_limit_per_subnet,
            global: cfg.rate_limit_global,
        }
    }
}

/// Counts for the current second.
#[derive(Debug, Default)]
pub struct Admission {
    second: u64,
    clients: HashMap<ClientKey, u32>,
    relays: HashMap<Ipv4Addr, u32>,
    subnets: Vec<u32>,
    global: u32,
}

/// Adds one to `count`; true while it stays within `limit`.
fn take(count: &mut u32, limit: u32) -> bool {
    *count = count.saturating_add(1);
    *count <= limit
}

fn reset<K, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > KEEP_CAPACITY {
        *map = HashMap::new();
    } else {
        map.clear();
    }
}

impl Admission {
    fn roll(&mut self, now: u64) {
        if now != self.second {
            self.second = now;
            reset(&mut self.clients);
            reset(&mut self.relays);
            self.subnets.iter_mut().for_each(|c| *c = 0);
            self.global = 0;
        }
    }

    pub fn client(&mut self, limits: &RateLimits, now: u64, key: &ClientKey) -> bool {
        self.roll(now);
        let count = self.clients.entry(key.clone()).or_insert(0);
        take(count, limits.per_client)
    }

    /// `relay` is the source address of a relayed message: the agent
    /// itself, whatever `giaddr` it writes.
    pub fn relay(&mut self, limits: &RateLimits, now: u64, relay: Ipv4Addr) -> bool {
        let Some(limit) = limits.per_relay else {
            return true;
        };
        self.roll(now);
        take(self.relays.entry(relay).or_insert(0), limit)
    }

    /// `subnet` is the index of the subnet the message was matched to.
    pub fn subnet(&mut self, limits: &RateLimits, now: u64, subnet: usize) -> bool {
        let Some(limit) = limits.per_subnet else {
            return true;
        };
        self.roll(now);
        if self.subnets.len() <= subnet {
            self.subnets.resize(subnet + 1, 0);
        }
        take(&mut self.subnets[subnet], limit)
    }

    pub fn global(&mut self, limits: &RateLimits, now: u64) -> bool {
        let Some(limit) = limits.global else {
            return true;
        };
        self.roll(now);
        take(&mut self.global, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RateLimits {
        RateLimits {
            per_client: 2,
            per_relay: Some(3),
            per_subnet: Some(4),
            global: Some(5),
        }
    }

    #[test]
    fn each_scope_admits_its_limit_per_second_then_refills() {
        let (l, mut a) = (limits(), Admission::default());
        let key = ClientKey::new(b"client");
        assert_eq!(
            (0..4).map(|_| a.client(&l, 10, &key)).collect::<Vec<_>>(),
            [true, true, false, false]
        );
        let relay = Ipv4Addr::new(10, 0, 0, 1);
        assert_eq!((0..5).filter(|_| a.relay(&l, 10, relay)).count(), 3);
        assert_eq!((0..9).filter(|_| a.subnet(&l, 10, 1)).count(), 4);
        assert_eq!((0..9).filter(|_| a.subnet(&l, 10, 0)).count(), 4);
        assert_eq!((0..9).filter(|_| a.global(&l, 10)).count(), 5);
        // The next second starts every count again.
        assert!(a.client(&l, 11, &key));
        assert!(a.relay(&l, 11, relay));
        assert!(a.subnet(&l, 11, 1));
        assert!(a.global(&l, 11));
    }

    #[test]
    fn scopes_are_counted_apart() {
        let (l, mut a) = (limits(), Admission::default());
        for i in 0..3u8 {
            assert!(a.relay(&l, 1, Ipv4Addr::new(10, 0, 0, 1)), "{i}");
        }
        assert!(!a.relay(&l, 1, Ipv4Addr::new(10, 0, 0, 1)));
        // Another relay has its own budget.
        assert!(a.relay(&l, 1, Ipv4Addr::new(10, 0, 0, 2)));
        // Clients with different keys each get theirs.
        for i in 0..100u32 {
            assert!(a.client(&l, 1, &ClientKey::new(&i.to_be_bytes())));
        }
    }

    #[test]
    fn unset_limits_admit_everything() {
        let l = RateLimits {
            per_client: 1,
            per_relay: None,
            per_subnet: None,
            global: None,
        };
        let mut a = Admission::default();
        for _ in 0..10_000 {
            assert!(a.relay(&l, 1, Ipv4Addr::LOCALHOST));
            assert!(a.subnet(&l, 1, 3));
            assert!(a.global(&l, 1));
        }
    }
}
