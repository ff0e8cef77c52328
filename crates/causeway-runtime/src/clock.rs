//! Unix seconds that do not jump: the wall clock read once per process,
//! advanced by the monotonic clock from then on.
//!
//! Expiry inside a process (DNS cache entries, names learned from DHCP)
//! must follow elapsed time, not the wall clock: a step back would keep an
//! answer fresh long past its TTL, a step forward would drop every name at
//! once. Times that outlive the process (lease expiries on disk) are
//! unix seconds, so the clock still reads as one.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

static ANCHOR: OnceLock<(std::time::Duration, Instant)> = OnceLock::new();

/// The process's unix seconds: the wall clock at the first call, plus the
/// monotonic time since (both to the nanosecond, so the reading is never a
/// second behind the wall clock for the fractions it dropped).
pub fn unix_now() -> u64 {
    let (wall, at) = ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (wall, Instant::now())
    });
    (*wall + at.elapsed()).as_secs()
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_reads_as_the_wall_clock_at_first_and_never_goes_back() {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let first = super::unix_now();
        assert!(first.abs_diff(wall) <= 1, "{first} vs {wall}");
        assert!(super::unix_now() >= first);
    }
}
