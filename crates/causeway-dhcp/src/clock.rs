//! The time the engine is given: the wall clock read once, when serving
//! starts, and advanced by the monotonic clock from then on.
//!
//! Lease expiries are unix seconds, because they outlive the process. But a
//! wall clock that steps while the server runs (a DPU or VM without an RTC
//! that boots at its epoch and is set by NTP later, or an administrator's
//! `date -s`) must not move them: a step forward would reclaim leases whose
//! holders still use them and hand the addresses to others; a step back
//! would hold addresses long after their leases ran out. So the process
//! reads the wall clock once and counts on from there.
//!
//! A restart reads it again, and then a clock that is behind the lease file
//! cannot be told from a clock that is right: the gate refuses to serve
//! while the wall clock is behind the file's last write by more than the
//! tolerance, and serves from the first moment it is not.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Unix seconds of a system time; 0 before 1970.
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What the gate decided about the wall clock at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockCheck {
    /// Serve, counting from this unix second.
    Serve { from: u64 },
    /// The wall clock is this many seconds behind the lease file's last
    /// write, more than the tolerance: wait.
    Behind { by: u64 },
}

/// Whether a server whose lease file was last written at `last_write`
/// (unix seconds) may start serving with the wall clock at `wall`. Serving
/// starts no earlier than the last write, so the engine's time never runs
/// backwards across a restart.
pub fn check(wall: u64, last_write: Option<u64>, tolerance: Duration) -> ClockCheck {
    let Some(last_write) = last_write else {
        return ClockCheck::Serve { from: wall };
    };
    let behind = last_write.saturating_sub(wall);
    if behind > tolerance.as_secs() {
        ClockCheck::Behind { by: behind }
    } else {
        ClockCheck::Serve {
            from: wall.max(last_write),
        }
    }
}

/// Under high availability, the wall clock to count from at start, and how
/// far it is behind this machine's (to shift this machine's own file
/// times by). The new active reads expiry times the old active wrote by
/// its clock: a replica whose clock runs ahead of its peer's counts from
/// the peer's (as last heard, advanced since), so no lease the peer wrote
/// ends early here; one whose clock is behind keeps its own, and leases
/// last longer, never shorter.
pub fn pair_wall(own: u64, peer_now: Option<u64>) -> (u64, u64) {
    match peer_now {
        Some(peer) if peer < own => (peer, own - peer),
        _ => (own, 0),
    }
}

/// The engine's clock: unset until the gate lets the server serve.
#[derive(Debug, Default)]
pub struct LeaseClock {
    anchor: OnceLock<(Duration, Instant)>,
}

/// The clock's reading `elapsed` after it was anchored at `base` (since the
/// epoch). The fraction of the anchor second counts: dropping it, and then
/// the fraction of the elapsed time, would read up to two seconds behind
/// the wall clock, and a lease would end that much earlier on the server
/// than for the client it was acknowledged to.
pub fn reading(base: Duration, elapsed: Duration) -> u64 {
    (base + elapsed).as_secs()
}

impl LeaseClock {
    /// Starts counting from `unix` seconds now; a second call changes
    /// nothing. When `unix` is the wall clock's current second, its
    /// fraction is kept.
    pub fn start(&self, unix: u64) {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let base = if wall.as_secs() == unix {
            wall
        } else {
            Duration::from_secs(unix)
        };
        let _ = self.anchor.set((base, Instant::now()));
    }

    /// The engine's unix seconds, or `None` before the gate opened.
    pub fn now(&self) -> Option<u64> {
        let (base, at) = self.anchor.get()?;
        Some(reading(*base, at.elapsed()))
    }

    /// How far the wall clock has stepped away from the engine's clock
    /// since serving began, in seconds (positive: the wall clock is ahead).
    pub fn wall_offset(&self, wall: u64) -> Option<i64> {
        let now = self.now()?;
        Some(i64::try_from(wall).unwrap_or(i64::MAX) - i64::try_from(now).unwrap_or(i64::MAX))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_anchor_seconds_fraction_is_kept() {
        use std::time::Duration;
        let base = Duration::from_millis(100_900);
        // 0.2 s after 100.9 s is 101.1 s: second 101, not 100.
        assert_eq!(super::reading(base, Duration::from_millis(200)), 101);
        assert_eq!(super::reading(base, Duration::from_millis(50)), 100);
        assert_eq!(super::reading(base, Duration::from_millis(1_150)), 102);
    }

    use super::*;

    const TOLERANCE: Duration = Duration::from_secs(60);

    #[test]
    fn a_clock_behind_the_lease_file_waits() {
        let written = 1_800_000_000;
        // A DPU that booted at its epoch, before NTP set the clock.
        assert_eq!(
            check(5, Some(written), TOLERANCE),
            ClockCheck::Behind { by: written - 5 }
        );
        assert_eq!(
            check(written - 61, Some(written), TOLERANCE),
            ClockCheck::Behind { by: 61 }
        );
    }

    #[test]
    fn within_the_tolerance_it_serves_from_the_last_write() {
        let written = 1_800_000_000;
        assert_eq!(
            check(written - 60, Some(written), TOLERANCE),
            ClockCheck::Serve { from: written }
        );
        assert_eq!(
            check(written + 5, Some(written), TOLERANCE),
            ClockCheck::Serve { from: written + 5 }
        );
        assert_eq!(check(7, None, TOLERANCE), ClockCheck::Serve { from: 7 });
    }

    #[test]
    fn the_clock_is_unset_until_started_and_then_counts_on() {
        let clock = LeaseClock::default();
        assert_eq!(clock.now(), None);
        clock.start(1_000);
        clock.start(5_000);
        let now = clock.now().unwrap();
        assert!((1_000..1_010).contains(&now), "{now}");
        // The wall clock stepped a day ahead: the engine's does not follow.
        assert_eq!(clock.wall_offset(now + 86_400), Some(86_400));
    }

    #[test]
    fn a_replica_ahead_of_its_peer_counts_from_the_peer_s_clock() {
        // Two hours ahead of the peer: the peer's time, and this machine's
        // file times shifted back by the two hours.
        assert_eq!(
            pair_wall(1_000_000 + 7200, Some(1_000_000)),
            (1_000_000, 7200)
        );
        // Behind, or no peer heard: its own.
        assert_eq!(pair_wall(1_000_000, Some(1_000_060)), (1_000_000, 0));
        assert_eq!(pair_wall(1_000_000, None), (1_000_000, 0));
    }
}
