//! Whether an active replica may acknowledge a lease its standby has not
//! confirmed.
//!
//! An ACK sent on the active's word alone is safe only while no other
//! replica can be active: otherwise the other replica, which never saw the
//! lease, gives its address to the next client. The election knows until
//! when that holds ([`crate::ha::Election::alone_until`]); the driver
//! publishes it here after every event, and the lease writer asks here
//! before it sends an ACK the standby did not confirm.
//!
//! The published bound is an instant, not a flag, so that a process that
//! was stopped (a VM stun, SIGSTOP) does not act on what it knew before:
//! when it runs again the bound has passed, and the writer waits until the
//! election has read what the peer said meanwhile.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What the writer may do with ACKs its standby did not confirm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alone {
    /// This replica still holds the role and no other can hold it yet.
    Allowed,
    /// The role was lost (or is held under a newer takeover) since the
    /// batch was written: its ACKs are discarded.
    RoleLost,
    /// Nothing established the role within the wait: discarded too.
    Unknown,
}

/// The gate's state and its rule, without the lock: the deterministic
/// simulation of the pair drives this directly.
#[derive(Debug, Default, Clone)]
pub struct GateState {
    /// Counts takeovers; a batch remembers the takeover it was written in.
    takeover: u64,
    active: bool,
    alone_until: Option<Instant>,
    /// The election term of the role held (0 while standing by).
    term: u64,
}

impl GateState {
    pub fn publish(&mut self, active: bool, alone_until: Option<Instant>, term: u64) {
        if active && !self.active {
            self.takeover += 1;
        }
        self.active = active;
        self.alone_until = if active { alone_until } else { None };
        self.term = if active { term } else { 0 };
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    /// The takeover a batch is written in; `None` while standing by.
    pub fn takeover(&self) -> Option<u64> {
        self.active.then_some(self.takeover)
    }

    /// Whether the role taken at `takeover` is still held.
    pub fn holds(&self, takeover: u64) -> bool {
        self.active && self.takeover == takeover
    }

    /// The commit rule for one batch written in `takeover` (`None`: written
    /// while standing by): whether its ACKs may go now, given whether the
    /// standby confirmed it. `None` means not yet known: wait for the next
    /// publish.
    pub fn verdict(&self, takeover: Option<u64>, confirmed: bool, now: Instant) -> Option<Alone> {
        if !takeover.is_some_and(|t| self.holds(t)) {
            return Some(Alone::RoleLost);
        }
        if confirmed || self.alone_until.is_some_and(|until| now < until) {
            return Some(Alone::Allowed);
        }
        None
    }
}

/// Shared between the election's driver and the lease writer.
#[derive(Debug)]
pub struct AckGate {
    state: Mutex<GateState>,
    changed: Condvar,
    /// The longest a batch waits for the role to be established.
    wait_for: Duration,
}

impl AckGate {
    /// `wait_for` bounds how long an unconfirmed batch waits; the election's
    /// driver uses two dead intervals, in which a silent peer is declared
    /// gone or a live one is heard.
    pub fn new(wait_for: Duration) -> AckGate {
        AckGate {
            state: Mutex::default(),
            changed: Condvar::new(),
            wait_for,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by the driver after every event, and before it carries out a
    /// release, so that a lost role stops ACKs before anything else.
    pub fn publish(&self, active: bool, alone_until: Option<Instant>, term: u64) {
        self.lock().publish(active, alone_until, term);
        self.changed.notify_all();
    }

    pub fn term(&self) -> u64 {
        self.lock().term()
    }

    pub fn takeover(&self) -> Option<u64> {
        self.lock().takeover()
    }

    pub fn holds(&self, takeover: u64) -> bool {
        self.lock().holds(takeover)
    }

    /// Waits until a batch written in `takeover` may be acknowledged (see
    /// [`GateState::verdict`]), the role is lost, or the gate's wait passes.
    pub fn wait(&self, takeover: Option<u64>, confirmed: bool) -> Alone {
        self.wait_until(takeover, confirmed, Instant::now() + self.wait_for)
    }

    fn wait_until(&self, takeover: Option<u64>, confirmed: bool, deadline: Instant) -> Alone {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            if let Some(verdict) = st.verdict(takeover, confirmed, now) {
                return verdict;
            }
            if now >= deadline {
                return Alone::Unknown;
            }
            // Wake at the deadline at the latest; a publish wakes sooner.
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_bound_in_the_past_does_not_allow_and_a_release_ends_the_wait() {
        let gate = Arc::new(AckGate::new(Duration::from_secs(10)));
        gate.publish(true, Some(Instant::now() - Duration::from_millis(1)), 1);
        let takeover = gate.takeover().expect("active");
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(gate.wait_until(Some(takeover), false, soon), Alone::Unknown);
        let releaser = {
            let gate = gate.clone();
            std::thread::spawn(move || gate.publish(false, None, 0))
        };
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            gate.wait_until(Some(takeover), false, later),
            Alone::RoleLost
        );
        releaser.join().expect("releaser");
        gate.publish(true, Some(Instant::now() + Duration::from_secs(10)), 2);
        assert_eq!(
            gate.wait_until(Some(takeover), false, later),
            Alone::RoleLost,
            "a batch of an earlier takeover stays discarded"
        );
        let again = gate.takeover().expect("active again");
        assert_ne!(again, takeover);
        assert_eq!(gate.wait(Some(again), false), Alone::Allowed);
        assert!(gate.holds(again) && !gate.holds(takeover));
    }
}
