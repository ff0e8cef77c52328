//! Which upstream address a new connection tries first, and the bookkeeping
//! that decision reads: connections open per address and health from
//! active checks. The ordering is a pure function so it is tested without
//! sockets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use causeway_config::{Balance, HealthCheck};
use prometheus::IntGauge;

/// The order in which to try `addrs`. `turn` rotates the start so equal
/// candidates share the load; `avoid` (ejected or failing health checks)
/// sends an address to the back, where it is still tried when nothing
/// else answers; least-connections then prefers the address with the
/// fewest open connections.
pub fn order(
    policy: Balance,
    mut addrs: Vec<SocketAddr>,
    turn: usize,
    open: impl Fn(&SocketAddr) -> usize,
    avoid: impl Fn(&SocketAddr) -> bool,
) -> Vec<SocketAddr> {
    if addrs.is_empty() {
        return addrs;
    }
    let n = turn % addrs.len();
    addrs.rotate_left(n);
    // Stable sorts, so the rotation stays the tie-breaker.
    match policy {
        Balance::RoundRobin => addrs.sort_by_key(|a| avoid(a)),
        Balance::LeastConnections => addrs.sort_by_key(|a| (avoid(a), open(a))),
    }
    addrs
}

/// Connections open to each upstream address, with the address's gauge so
/// its label is formatted once per address rather than per connection.
#[derive(Default)]
pub struct OpenCounts {
    counts: Mutex<HashMap<SocketAddr, (usize, IntGauge)>>,
}

impl OpenCounts {
    pub fn get(&self, addr: &SocketAddr) -> usize {
        self.lock().get(addr).map_or(0, |(n, _)| *n)
    }

    /// Counts one more; returns the address's gauge, made by `gauge` the
    /// first time.
    pub fn opened(&self, addr: SocketAddr, gauge: impl FnOnce() -> IntGauge) -> IntGauge {
        let mut counts = self.lock();
        let entry = counts.entry(addr).or_insert_with(|| (0, gauge()));
        entry.0 += 1;
        entry.1.clone()
    }

    pub fn closed(&self, addr: &SocketAddr) {
        let mut counts = self.lock();
        if let Some((n, _)) = counts.get_mut(addr) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(addr);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, (usize, IntGauge)>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A change of an address's health, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Down,
    Up,
}

#[derive(Debug, Default, Clone, Copy)]
struct Streak {
    down: bool,
    failures: u32,
    successes: u32,
}

/// Results of active health checks, with thresholds so one lost connect
/// does not flap an address.
#[derive(Default)]
pub struct Health {
    state: Mutex<HashMap<SocketAddr, Streak>>,
}

impl Health {
    pub fn is_down(&self, addr: &SocketAddr) -> bool {
        self.lock().get(addr).is_some_and(|s| s.down)
    }

    /// Records one check; returns the transition it caused, if any.
    pub fn record(&self, addr: SocketAddr, ok: bool, rule: &HealthCheck) -> Option<Transition> {
        let mut state = self.lock();
        let s = state.entry(addr).or_default();
        if ok {
            s.failures = 0;
            s.successes = s.successes.saturating_add(1);
            if s.down && s.successes >= rule.healthy_threshold {
                s.down = false;
                return Some(Transition::Up);
            }
        } else {
            s.successes = 0;
            s.failures = s.failures.saturating_add(1);
            if !s.down && s.failures >= rule.unhealthy_threshold {
                s.down = true;
                return Some(Transition::Down);
            }
        }
        None
    }

    /// Forgets addresses no longer checked (gone from DNS or the config),
    /// and everything when checks are turned off.
    pub fn retain(&self, keep: impl Fn(&SocketAddr) -> bool) {
        self.lock().retain(|a, _| keep(a));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Streak>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn a(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 6443))
    }

    #[test]
    fn round_robin_rotates_the_start() {
        let addrs = vec![a(1), a(2), a(3)];
        let firsts: Vec<_> = (0..4)
            .map(|turn| order(Balance::RoundRobin, addrs.clone(), turn, |_| 0, |_| false)[0])
            .collect();
        assert_eq!(firsts, vec![a(1), a(2), a(3), a(1)]);
    }

    #[test]
    fn avoided_addresses_go_last_but_stay() {
        let got = order(
            Balance::RoundRobin,
            vec![a(1), a(2), a(3)],
            0,
            |_| 0,
            |x| *x == a(1),
        );
        assert_eq!(got, vec![a(2), a(3), a(1)]);
    }

    #[test]
    fn least_connections_prefers_the_idlest_and_rotates_ties() {
        let open = |x: &SocketAddr| match x.ip().to_string().as_str() {
            "10.0.0.1" => 5,
            "10.0.0.2" => 1,
            _ => 1,
        };
        let first = |turn| {
            order(
                Balance::LeastConnections,
                vec![a(1), a(2), a(3)],
                turn,
                open,
                |_| false,
            )[0]
        };
        assert_eq!(first(0), a(2));
        assert_eq!(first(2), a(3));
        let all = order(
            Balance::LeastConnections,
            vec![a(1), a(2), a(3)],
            0,
            open,
            |_| false,
        );
        assert_eq!(all[2], a(1));
    }

    #[test]
    fn least_connections_still_avoids_before_counting() {
        let got = order(
            Balance::LeastConnections,
            vec![a(1), a(2)],
            0,
            |x| if *x == a(1) { 0 } else { 9 },
            |x| *x == a(1),
        );
        assert_eq!(got, vec![a(2), a(1)]);
    }

    #[test]
    fn empty_stays_empty() {
        assert!(order(Balance::LeastConnections, vec![], 7, |_| 0, |_| false).is_empty());
    }

    #[test]
    fn open_counts_go_up_and_down() {
        let c = OpenCounts::default();
        let gauge = || IntGauge::new("open", "open").unwrap();
        c.opened(a(1), gauge);
        c.opened(a(1), gauge);
        c.closed(&a(1));
        assert_eq!(c.get(&a(1)), 1);
        c.closed(&a(1));
        c.closed(&a(1));
        assert_eq!(c.get(&a(1)), 0);
    }

    #[test]
    fn health_needs_the_threshold_each_way() {
        let rule = HealthCheck {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            unhealthy_threshold: 2,
            healthy_threshold: 2,
        };
        let h = Health::default();
        assert_eq!(h.record(a(1), false, &rule), None);
        assert!(!h.is_down(&a(1)));
        assert_eq!(h.record(a(1), true, &rule), None);
        assert_eq!(h.record(a(1), false, &rule), None);
        assert_eq!(h.record(a(1), false, &rule), Some(Transition::Down));
        assert!(h.is_down(&a(1)));
        assert_eq!(h.record(a(1), false, &rule), None);
        assert_eq!(h.record(a(1), true, &rule), None);
        assert_eq!(h.record(a(1), true, &rule), Some(Transition::Up));
        assert!(!h.is_down(&a(1)));
        h.record(a(2), false, &rule);
        h.record(a(2), false, &rule);
        h.retain(|x| *x != a(2));
        assert!(!h.is_down(&a(2)));
    }
}
