//! Who of two replicas holds the service addresses: a pure state machine
//! over adverts heard, time, and (in lease mode) what the witness said.
//! The driver feeds it events and carries out the [`Action`]s it returns;
//! nothing here touches a socket, a clock or the API server.
//!
//! Peer mode is VRRP's rule: the standby takes over once the peer has been
//! silent for `dead_after`; when both are active (a partition healed), the
//! higher priority (then the lower name) keeps the addresses.
//!
//! Lease mode adds a witness, a compare-and-swap object (a Kubernetes
//! Lease) that only one replica can win:
//! - An active that cannot hear its peer (or whose peer says it cannot hear
//!   it) renews the witness at once and then often (every advert interval
//!   for the first seconds); a renewal that fails or times out means another
//!   replica may be taking over, so it gives the addresses up at once
//!   (self-fencing).
//! - A standby that stops hearing the active reads the witness, waits
//!   [`Timers::claim_wait`], then claims it at the version it read. A live
//!   active has by then either renewed (the version moved, the claim fails)
//!   or failed to and let go; a dead one did neither, and the claim wins.
//!
//! While both replicas hear each other the witness is written only every
//! `renew_interval`, so a healthy pair costs the API server almost nothing.

use std::time::{Duration, Instant};

/// What this replica does with the service addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Standby,
    Active,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Standby => "standby",
            Role::Active => "active",
        }
    }
}

/// What an advert from the peer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerState {
    pub active: bool,
    /// The peer hears this replica's adverts.
    pub hears_peer: bool,
    /// The peer's DHCP lease log is complete (or it runs no DHCP).
    pub in_sync: bool,
    pub priority: u8,
    /// When the peer took the addresses: unix milliseconds at its takeover,
    /// or one more than the highest term it had seen if that is later.
    pub term: u64,
    /// The newest of this replica's adverts the peer had received when it
    /// sent this one: this replica's boot and the advert's number.
    pub echo: Option<(u64, u64)>,
    /// The peer preempts a lower-priority active once it is in sync.
    pub preempt: bool,
    /// The peer's leg on the clients' VLAN (the interface the service
    /// addresses live on) has carrier.
    pub leg_up: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Peer,
    Lease,
}

#[derive(Debug, Clone)]
pub struct Timers {
    pub advert: Duration,
    pub dead_after: Duration,
    /// Lease mode: the longest a witness request may take.
    pub api_timeout: Duration,
    /// Lease mode: how often a healthy active renews the witness.
    pub renew_interval: Duration,
    /// Lease mode: how often an active that cannot hear its peer renews,
    /// once [`Timers::DEGRADED_FAST_FOR`] has passed (before that, every
    /// [`Timers::degraded_fast`]).
    pub degraded_renew: Duration,
}

impl Timers {
    /// For this long after it stops hearing its peer, an active renews the
    /// witness every [`Timers::degraded_fast`]: the window in which a
    /// standby decides whether it is alive.
    pub const DEGRADED_FAST_FOR: Duration = Duration::from_secs(5);

    pub fn degraded_fast(&self) -> Duration {
        self.advert
    }

    /// How long a standby waits between reading the witness and claiming
    /// it at the version read. A live active that cannot hear its peer
    /// starts a renewal within one advert of the standby's read and then
    /// every [`Timers::degraded_fast`]; each succeeds (the version moves, the
    /// claim fails) or fails within the API timeout (and the active lets
    /// go at once). So by the claim, a live active either moved the version
    /// or has let go.
    pub fn claim_wait(&self, first: bool) -> Duration {
        let every = if first {
            self.degraded_fast()
        } else {
            self.degraded_renew
        };
        every + self.api_timeout + self.advert
    }

    /// After winning the witness, before taking the addresses: margin for
    /// the loser's release to reach the kernel.
    pub fn fence_delay(&self) -> Duration {
        self.advert
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessView {
    pub holder: Option<String>,
    /// Changes on every write; a claim names the version it read.
    pub version: String,
}

/// A request for the driver to send to the witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessRequest {
    Read,
    /// Make this replica the holder, only if the witness is still at
    /// `version`.
    Claim {
        version: String,
    },
    /// Read, and if this replica holds the witness, write it again (which
    /// changes its version). Fails when another replica holds it.
    Renew,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessResult {
    Read(WitnessView),
    /// The claim or renewal was written: this replica holds the witness.
    Held,
    /// Another replica holds it, or it changed since it was read.
    Lost,
    /// Timed out or failed: nothing is known.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Add the service addresses and announce them.
    Take,
    /// Remove the service addresses.
    Release,
    Witness(WitnessRequest),
}

/// Why the role changed, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    PeerSilent,
    PeerYielded,
    Preempted,
    HigherPeerActive,
    /// Lease mode: a renewal failed while the peer could not be heard.
    Fenced,
    /// Peer mode: this replica's VLAN leg lost carrier while the peer's
    /// has it: the clients cannot reach this replica, the peer can serve.
    LegDown,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::PeerSilent => "peer_silent",
            Reason::PeerYielded => "peer_not_active",
            Reason::Preempted => "preempted",
            Reason::HigherPeerActive => "higher_peer_active",
            Reason::Fenced => "fenced",
            Reason::LegDown => "vlan_leg_down",
        }
    }
}

/// A standby's way to the witness.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Claim {
    /// Nothing asked yet (or the last attempt ended).
    Idle {
        next: Instant,
    },
    Reading,
    /// Read at `version`; claim it at `at` unless the peer is heard first.
    Waiting {
        version: String,
        at: Instant,
    },
    Claiming,
    /// Won; take the addresses at `at`.
    Won {
        at: Instant,
    },
}

pub struct Election {
    mode: Mode,
    timers: Timers,
    name: String,
    peer_name: String,
    priority: u8,
    preempt: bool,
    role: Role,
    started: Instant,
    last_heard: Option<Instant>,
    peer: Option<PeerState>,
    in_sync: bool,
    claim: Claim,
    /// Lease mode, active: a renewal in flight, the last that succeeded, and
    /// whether the peer could vouch for this replica at the last look (a
    /// change to "cannot" renews at once).
    renewing: bool,
    renewed: Instant,
    was_degraded: bool,
    degraded_since: Option<Instant>,
    /// Lease mode, standby: claims tried since the peer fell silent; after
    /// the first, a claim waits out the holder's slow renewal period.
    attempts: u32,
    last_change: Option<(Role, Reason)>,
    term: u64,
    /// The highest term this replica has held or heard, over its restarts
    /// (the driver persists it), and in this process.
    term_floor: u64,
    /// This process's boot number and when each recent advert was sent, so
    /// that the peer's echo says when it last heard this replica.
    boot: u64,
    sent: std::collections::VecDeque<(u64, Instant)>,
    /// When the peer's newest echo was sent by this replica, while the
    /// peer was a standby that could not preempt.
    vouched_from: Option<Instant>,
    in_sync_since: Option<Instant>,
    /// Lease mode: when the last renewal that succeeded was asked for.
    renew_asked: Instant,
    renewed_from: Option<Instant>,
    /// This replica's VLAN leg has carrier.
    leg_up: bool,
    /// When the leg last came back.
    leg_back: Option<Instant>,
    /// Whether, at the last look, the peer had freshly conceded the role
    /// to this active (see [`Election::owes_announcement`]).
    peer_conceded: bool,
}

impl Election {
    pub fn new(
        mode: Mode,
        timers: Timers,
        name: &str,
        peer_name: &str,
        priority: u8,
        preempt: bool,
        now: Instant,
    ) -> Election {
        Election {
            mode,
            timers,
            name: name.to_string(),
            peer_name: peer_name.to_string(),
            priority,
            preempt,
            role: Role::Standby,
            started: now,
            last_heard: None,
            peer: None,
            in_sync: true,
            claim: Claim::Idle { next: now },
            renewing: false,
            renewed: now,
            was_degraded: false,
            degraded_since: None,
            attempts: 0,
            last_change: None,
            term: 0,
            term_floor: 0,
            boot: 0,
            sent: Default::default(),
            vouched_from: None,
            in_sync_since: Some(now),
            renew_asked: now,
            renewed_from: None,
            leg_up: true,
            leg_back: None,
            peer_conceded: false,
        }
    }

    /// Whether this replica's VLAN leg has carrier (the driver reads it
    /// every tick). Peer mode: a replica without it hands the role to a
    /// peer that has it, and never takes the role.
    pub fn set_leg_up(&mut self, up: bool) {
        self.set_leg_up_at(up, self.started);
    }

    /// As [`Election::set_leg_up`], at `now`: a leg that comes back counts
    /// as a start, so the peer's adverts (whose links may have come back
    /// with it) get a dead interval to arrive before the peer is taken
    /// for silent.
    pub fn set_leg_up_at(&mut self, up: bool, now: Instant) {
        if up && !self.leg_up {
            self.leg_back = Some(now);
        }
        self.leg_up = up;
    }

    pub fn leg_up(&self) -> bool {
        self.leg_up
    }

    /// The peer is heard, and its VLAN leg works where this one's does not.
    fn peer_serves_better(&self, now: Instant) -> bool {
        !self.leg_up && self.peer_alive(now).is_some_and(|p| p.leg_up)
    }

    /// This process's boot number, as its adverts carry it.
    pub fn set_boot(&mut self, boot: u64) {
        self.boot = boot;
    }

    /// The driver sent advert `seq` at `now`.
    pub fn on_sent(&mut self, seq: u64, now: Instant) {
        // A few dead intervals' worth: an echo older than that allows
        // nothing anyway.
        const KEEP: usize = 64;
        if self.sent.len() == KEEP {
            self.sent.pop_front();
        }
        self.sent.push_back((seq, now));
    }

    /// Until when this replica may acknowledge a lease on its own word, its
    /// standby not having confirmed it: while no other replica can be
    /// active. `None` while standing by, or while that is not known.
    ///
    /// - The peer is heard as a standby that cannot preempt, and echoed an
    ///   advert this replica sent at `t`: the peer heard it at `t` or later,
    ///   so it cannot declare this replica silent before `t + dead_after`.
    /// - The peer is silent past the dead interval: it is gone by the
    ///   election's own rule (a partition is the pool's concern, not the
    ///   log's). Valid only while the election keeps running, so a process
    ///   that was stopped reads what arrived meanwhile before it ACKs.
    /// - Lease mode: a renewal asked for at `t` succeeded; a standby claims
    ///   the witness no sooner than [`Timers::claim_wait`] after reading it
    ///   unmoved, so not before `t + claim_wait`.
    pub fn alone_until(&self, now: Instant) -> Option<Instant> {
        if self.role != Role::Active {
            return None;
        }
        let margin = self.timers.advert / 4;
        let mut until: Option<Instant> = None;
        let mut later = |t: Instant| until = Some(until.map_or(t, |u| u.max(t)));
        if let Some(sent) = self.vouched_from.filter(|_| self.hears_peer(now)) {
            later(sent + self.timers.dead_after.saturating_sub(margin));
        }
        if !self.hears_peer(now) && self.mode == Mode::Peer {
            // Two ticks of the driver's: the next publish comes first.
            later(now + self.timers.advert / 2);
        }
        if self.mode == Mode::Lease {
            if let Some(asked) = self.renewed_from {
                later(asked + self.timers.claim_wait(true).saturating_sub(margin));
            }
        }
        until
    }

    /// Whether the active should announce the service addresses again now
    /// (gratuitous ARP): once each time the peer comes to concede the role,
    /// having been silent or active before. Until it concedes it may answer
    /// ARP for the addresses (a restarted replica, or a stalled active that
    /// has not yet read what happened meanwhile), so an announcement made
    /// earlier can be overtaken by the peer's own.
    ///
    /// The concession must be fresh: a standby's advert that echoes one this
    /// replica sent less than a dead interval ago. Adverts that queued up
    /// while this process was stopped say "standby" from before the peer
    /// took over; read first, they would otherwise look like a concession.
    pub fn owes_announcement(&mut self, now: Instant) -> bool {
        let concedes = self.role == Role::Active
            && self.hears_peer(now)
            && self
                .vouched_from
                .is_some_and(|sent| now.saturating_duration_since(sent) < self.timers.dead_after);
        let owed = concedes && !self.peer_conceded;
        self.peer_conceded = concedes;
        owed
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// The last role change and why; taken once.
    pub fn take_change(&mut self) -> Option<(Role, Reason)> {
        self.last_change.take()
    }

    /// Whether the peer's adverts arrive.
    pub fn hears_peer(&self, now: Instant) -> bool {
        self.last_heard
            .is_some_and(|t| now.saturating_duration_since(t) < self.timers.dead_after)
    }

    /// Whether `echo` names an advert of another process of this replica:
    /// whoever sent it heard this replica before this process started.
    pub fn echo_is_of_an_earlier_process(&self, echo: Option<(u64, u64)>) -> bool {
        echo.is_some_and(|(boot, _)| boot != self.boot)
    }

    pub fn peer(&self) -> Option<&PeerState> {
        self.peer.as_ref()
    }

    /// Whether this replica's DHCP lease log is complete; a standby that is
    /// behind never preempts.
    pub fn set_in_sync(&mut self, in_sync: bool) {
        self.set_in_sync_at(in_sync, self.started);
    }

    /// As [`Election::set_in_sync`], at `now`: a standby preempts only once
    /// it has said it is in sync for a dead interval, so that the active no
    /// longer counts on an advert that said it was behind.
    pub fn set_in_sync_at(&mut self, in_sync: bool, now: Instant) {
        if in_sync && !self.in_sync {
            self.in_sync_since = Some(now);
        } else if !in_sync {
            self.in_sync_since = None;
        }
        self.in_sync = in_sync;
    }

    pub fn in_sync(&self) -> bool {
        self.in_sync
    }

    /// The peer is heard and outranks this replica.
    fn peer_outranks(&self, peer: &PeerState) -> bool {
        peer.priority > self.priority
            || (peer.priority == self.priority && self.peer_name < self.name)
    }

    fn peer_alive(&self, now: Instant) -> Option<&PeerState> {
        if self.hears_peer(now) {
            self.peer.as_ref()
        } else {
            None
        }
    }

    /// Whether this standby should be active.
    fn wants_active(&self, now: Instant) -> Option<Reason> {
        // Without carrier on its VLAN leg a replica can serve nobody:
        // taking the role would only raise its term, and on the links'
        // return the replica that was cut off would win.
        if self.mode == Mode::Peer && !self.leg_up {
            return None;
        }
        // What was heard of the peer before the leg came back is stale:
        // the peer link may have gone with the leg, and the peer taken
        // over meanwhile. Until it is heard again it counts as not heard,
        // which waits a dead interval from the leg's return.
        let heard_since_back = self
            .leg_back
            .is_none_or(|back| self.last_heard.is_some_and(|heard| heard >= back));
        let peer = self.peer_alive(now).filter(|_| heard_since_back);
        match peer {
            None => {
                // At start, or when the leg comes back, give the peer's
                // adverts time to arrive first.
                let since = self.leg_back.map_or(self.started, |t| t.max(self.started));
                let waited = now.saturating_duration_since(since) >= self.timers.dead_after;
                waited.then_some(Reason::PeerSilent)
            }
            Some(p) if p.active => (self.mode == Mode::Peer
                && self.preempt
                && self.in_sync
                && self.in_sync_since.is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.timers.dead_after
                })
                && p.priority < self.priority)
                .then_some(Reason::Preempted),
            // Neither is active and the peer's leg is down: it cannot serve
            // the clients, so it gets no turn first.
            Some(p) if !p.leg_up && self.leg_up => Some(Reason::PeerYielded),
            // Neither is active: the higher one goes first, the other only
            // once the higher has had its chance.
            Some(p) => {
                let since_start = now.saturating_duration_since(self.started);
                (!self.peer_outranks(p) || since_start >= self.timers.dead_after * 2)
                    .then_some(Reason::PeerYielded)
            }
        }
    }

    /// The active should let go: the peer is active too and outranks it
    /// (both active after a partition, or a preemption).
    /// When both are active (a partition healed), the later takeover
    /// wins: the other was cut off while it served, so its lease log is the
    /// stale one (and, cut off from the clients too, it served nobody).
    /// Priority decides only between equal terms.
    fn should_yield(&self, now: Instant) -> bool {
        self.peer_alive(now).is_some_and(|p| {
            p.active && (p.term > self.term || (p.term == self.term && self.peer_outranks(p)))
        })
    }

    /// This replica's term: the takeover it holds the addresses by.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The highest term this replica held or heard before it restarted:
    /// its next takeover's term is later than any of them.
    pub fn set_term_floor(&mut self, term: u64) {
        self.term_floor = self.term_floor.max(term);
    }

    /// The highest term held or heard: what the driver persists, so that a
    /// takeover after a restart still counts as later than every earlier
    /// one. Terms count takeovers; no clock enters them, so two replicas
    /// whose clocks differ still agree which takeover came later.
    pub fn highest_term(&self) -> u64 {
        self.term_floor.max(self.term)
    }

    /// An active whose peer cannot vouch for it: it must prove to the
    /// witness that it is still the holder.
    fn degraded(&self, now: Instant) -> bool {
        match self.peer_alive(now) {
            None => true,
            Some(p) => !p.hears_peer,
        }
    }

    fn become_(&mut self, role: Role, reason: Reason, out: &mut Vec<Action>) {
        if self.role == role {
            return;
        }
        self.role = role;
        self.last_change = Some((role, reason));
        if role == Role::Standby {
            self.renewed_from = None;
            // The log it kept as the active lacks whatever the new active
            // writes from now on: it is complete again only once it has
            // followed the new active's stream (and says so), so it does
            // not preempt on the strength of its old log.
            self.in_sync = false;
            self.in_sync_since = None;
        }
        if role == Role::Active {
            // The replica whose name sorts first takes even terms, the
            // other odd ones: two takeovers never share a term, and a
            // record's term names the replica that wrote it.
            let parity = u64::from(self.name > self.peer_name);
            let next = self.highest_term() + 1;
            self.term = if next % 2 == parity { next } else { next + 1 };
        }
        out.push(match role {
            Role::Active => Action::Take,
            Role::Standby => Action::Release,
        });
    }

    #[cfg(test)]
    fn clone_for_test(&self) -> Election {
        Election {
            mode: self.mode,
            timers: self.timers.clone(),
            name: self.name.clone(),
            peer_name: self.peer_name.clone(),
            claim: self.claim.clone(),
            peer: self.peer.clone(),
            sent: self.sent.clone(),
            ..*self
        }
    }

    pub fn on_advert(&mut self, now: Instant, peer: PeerState) -> Vec<Action> {
        self.last_heard = Some(now);
        self.term_floor = self.term_floor.max(peer.term);
        let could_preempt = peer.preempt
            && peer.in_sync
            && peer.priority > self.priority
            && self.mode == Mode::Peer;
        let echoed = peer
            .echo
            .filter(|(boot, _)| *boot == self.boot)
            .and_then(|(_, seq)| self.sent.iter().find(|(s, _)| *s == seq).map(|(_, t)| *t));
        self.vouched_from = match echoed {
            Some(sent) if !peer.active && peer.hears_peer && !could_preempt => Some(sent),
            // An advert that may have been overtaken by a newer one vouches
            // for nothing newer, and withdraws nothing either: the newer
            // one said more.
            None if !peer.active && peer.hears_peer && !could_preempt => self.vouched_from,
            _ => None,
        };
        self.peer = Some(peer);
        self.on_tick(now)
    }

    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        match (self.role, self.mode) {
            (Role::Standby, Mode::Peer) => {
                if let Some(reason) = self.wants_active(now) {
                    self.become_(Role::Active, reason, &mut out);
                }
            }
            (Role::Active, Mode::Peer) => {
                if self.should_yield(now) {
                    self.become_(Role::Standby, Reason::HigherPeerActive, &mut out);
                } else if self.peer_serves_better(now) {
                    // The clients cannot reach this replica; the peer,
                    // hearing it let go, takes over at once.
                    self.become_(Role::Standby, Reason::LegDown, &mut out);
                }
            }
            (Role::Standby, Mode::Lease) => self.standby_witness(now, &mut out),
            (Role::Active, Mode::Lease) => self.active_witness(now, &mut out),
        }
        out
    }

    fn standby_witness(&mut self, now: Instant, out: &mut Vec<Action>) {
        let want = self.wants_active(now).filter(|r| *r != Reason::Preempted);
        let Some(reason) = want else {
            // The peer is back and active: whatever was under way stops.
            if !matches!(self.claim, Claim::Reading | Claim::Claiming) {
                self.claim = Claim::Idle { next: now };
            }
            self.attempts = 0;
            return;
        };
        match self.claim.clone() {
            Claim::Idle { next } if now >= next => {
                self.claim = Claim::Reading;
                out.push(Action::Witness(WitnessRequest::Read));
            }
            Claim::Waiting { version, at } if now >= at => {
                self.claim = Claim::Claiming;
                self.renew_asked = now;
                out.push(Action::Witness(WitnessRequest::Claim { version }));
            }
            Claim::Won { at } if now >= at => {
                self.claim = Claim::Idle { next: now };
                self.attempts = 0;
                // The claim was a write: the next renewal counts from it.
                self.renewed = now;
                self.was_degraded = self.degraded(now);
                self.degraded_since = self.was_degraded.then_some(now);
                self.become_(Role::Active, reason, out);
            }
            _ => {}
        }
    }

    fn active_witness(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.renewing {
            return;
        }
        let degraded = self.degraded(now);
        let newly = degraded && !self.was_degraded;
        self.was_degraded = degraded;
        if newly {
            self.degraded_since = Some(now);
        } else if !degraded {
            self.degraded_since = None;
        }
        let every = match self.degraded_since {
            Some(since) if now.saturating_duration_since(since) < Timers::DEGRADED_FAST_FOR => {
                self.timers.degraded_fast()
            }
            Some(_) => self.timers.degraded_renew,
            None => self.timers.renew_interval,
        };
        if newly || now.saturating_duration_since(self.renewed) >= every {
            self.renewing = true;
            self.renew_asked = now;
            out.push(Action::Witness(WitnessRequest::Renew));
        }
    }

    pub fn on_witness(&mut self, now: Instant, result: WitnessResult) -> Vec<Action> {
        let mut out = Vec::new();
        match self.role {
            Role::Active => {
                self.renewing = false;
                let degraded = self.degraded(now);
                match result {
                    WitnessResult::Held => {
                        self.renewed = now;
                        self.renewed_from = Some(self.renew_asked);
                    }
                    WitnessResult::Read(_) => self.renewed = now,
                    // Someone else holds it: never keep the addresses.
                    WitnessResult::Lost => {
                        self.become_(Role::Standby, Reason::Fenced, &mut out);
                        self.claim = Claim::Idle {
                            next: now + self.timers.dead_after,
                        };
                    }
                    // Unknown: harmless while the peer vouches for us, fatal
                    // when it cannot (it may be claiming right now).
                    WitnessResult::Failed if degraded => {
                        self.become_(Role::Standby, Reason::Fenced, &mut out);
                        self.claim = Claim::Idle {
                            next: now + self.timers.dead_after,
                        };
                    }
                    // Try again sooner than a healthy renewal would.
                    WitnessResult::Failed => {
                        let early = self
                            .timers
                            .renew_interval
                            .saturating_sub(self.timers.degraded_renew);
                        self.renewed = now.checked_sub(early).unwrap_or(now);
                    }
                }
            }
            Role::Standby => match (self.claim.clone(), result) {
                (Claim::Reading, WitnessResult::Read(view)) => {
                    // No holder, or this replica: the peer holds nothing to
                    // let go of, and a claim races only the peer's claim.
                    let unheld =
                        view.holder.is_none() || view.holder.as_deref() == Some(self.name.as_str());
                    let wait = if unheld {
                        Duration::ZERO
                    } else {
                        self.timers.claim_wait(self.attempts == 0)
                    };
                    self.attempts += 1;
                    self.claim = Claim::Waiting {
                        version: view.version,
                        at: now + wait,
                    };
                }
                (Claim::Claiming, WitnessResult::Held) => {
                    self.renewed_from = Some(self.renew_asked);
                    self.claim = Claim::Won {
                        at: now + self.timers.fence_delay(),
                    };
                }
                (Claim::Reading | Claim::Claiming, _) => {
                    // Lost (the holder wrote meanwhile) or failed: look again.
                    self.claim = Claim::Idle {
                        next: now + self.timers.advert,
                    };
                }
                _ => {}
            },
        }
        out.extend(self.on_tick(now));
        out
    }

    /// Before the process stops: an active gives the addresses up so the
    /// peer's takeover is not held up by a dead holder.
    pub fn resign(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        self.become_(Role::Standby, Reason::PeerYielded, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timers() -> Timers {
        Timers {
            advert: Duration::from_millis(200),
            dead_after: Duration::from_millis(600),
            api_timeout: Duration::from_millis(1000),
            renew_interval: Duration::from_secs(60),
            degraded_renew: Duration::from_secs(2),
        }
    }

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    fn advert(active: bool, priority: u8) -> PeerState {
        PeerState {
            active,
            hears_peer: true,
            in_sync: true,
            priority,
            term: 1,
            echo: None,
            preempt: false,
            leg_up: true,
        }
    }

    #[test]
    fn peer_mode_an_active_whose_vlan_leg_fails_hands_over_and_does_not_take_back() {
        let t0 = Instant::now();
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 200, false, t0);
        assert_eq!(a.on_tick(ms(t0, 600)), vec![Action::Take]);
        let _ = a.take_change();
        assert!(a.on_advert(ms(t0, 700), advert(false, 100)).is_empty());
        // Its leg loses carrier: it lets go at its next tick.
        a.set_leg_up(false);
        assert_eq!(a.on_tick(ms(t0, 750)), vec![Action::Release]);
        assert_eq!(a.take_change(), Some((Role::Standby, Reason::LegDown)));
        // The peer takes over; the outranking replica does not take back
        // while its own leg is down and the peer's is up, preempting or not.
        let mut b_active = advert(true, 100);
        b_active.term = 3;
        for t in [800, 1000, 5000] {
            assert!(a.on_advert(ms(t0, t), b_active.clone()).is_empty());
        }
        let mut idle = advert(false, 100);
        idle.term = 3;
        assert!(a.on_advert(ms(t0, 5200), idle).is_empty());
        // Nor with the peer silent: it could serve nobody.
        assert!(a.on_tick(ms(t0, 9000)).is_empty());
        assert_eq!(a.role(), Role::Standby);
        // Its leg back, it may, once the peer had a dead interval to be
        // heard again (the links may have come back together).
        a.set_leg_up_at(true, ms(t0, 9100));
        assert!(a.on_tick(ms(t0, 9100)).is_empty());
        assert!(a.on_tick(ms(t0, 9699)).is_empty());
        assert_eq!(a.on_tick(ms(t0, 9700)), vec![Action::Take]);
    }

    /// The active loses its VLAN leg and its peer link together, and gets
    /// them back within a dead interval: what it heard of the peer before
    /// (a standby) is stale, as the peer took over meanwhile. It must not
    /// claim the role on that view the moment its leg returns, but wait to
    /// hear the peer again; hearing it active with a later term, it stays
    /// standby (the cut-off replica gives way to the later takeover).
    #[test]
    fn peer_mode_a_leg_that_comes_back_waits_for_a_fresh_word_from_the_peer() {
        let t0 = Instant::now();
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 200, false, t0);
        assert_eq!(b.on_tick(ms(t0, 600)), vec![Action::Take]);
        let _ = b.take_change();
        // The peer joins as a standby; b hears it, then both links go.
        assert!(b.on_advert(ms(t0, 1000), advert(false, 100)).is_empty());
        b.set_leg_up_at(false, ms(t0, 1050));
        // Its leg gone and the peer's up, it lets go; the peer takes over.
        assert_eq!(b.on_tick(ms(t0, 1050)), vec![Action::Release]);
        assert_eq!(b.take_change(), Some((Role::Standby, Reason::LegDown)));
        // Cut off, b hears nothing more. Its leg returns 400 ms later,
        // within a dead interval of the last advert it heard.
        b.set_leg_up_at(true, ms(t0, 1450));
        assert!(
            b.on_tick(ms(t0, 1450)).is_empty(),
            "claimed on a view of the peer from before the cut"
        );
        assert!(b.on_tick(ms(t0, 1500)).is_empty());
        // The peer's next advert: active, by a later takeover.
        let mut taken = advert(true, 100);
        taken.term = 5;
        assert!(b.on_advert(ms(t0, 1550), taken.clone()).is_empty());
        for t in [1750, 1950, 3000] {
            assert!(b.on_advert(ms(t0, t), taken.clone()).is_empty());
        }
        assert_eq!(b.role(), Role::Standby);
    }

    #[test]
    fn peer_mode_the_standby_takes_over_from_an_active_that_let_go_for_its_leg() {
        let t0 = Instant::now();
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        assert!(b.on_advert(ms(t0, 100), advert(true, 200)).is_empty());
        // The active's adverts say its leg is down, then that it let go.
        let mut down = advert(true, 200);
        down.leg_up = false;
        assert!(b.on_advert(ms(t0, 300), down.clone()).is_empty());
        down.active = false;
        assert_eq!(b.on_advert(ms(t0, 350), down), vec![Action::Take]);
    }

    #[test]
    fn peer_mode_with_both_legs_down_or_the_peer_silent_the_active_keeps_the_role() {
        let t0 = Instant::now();
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 200, false, t0);
        assert_eq!(a.on_tick(ms(t0, 600)), vec![Action::Take]);
        a.set_leg_up(false);
        // No peer heard: no one to hand over to.
        assert!(a.on_tick(ms(t0, 700)).is_empty());
        // A peer whose leg is down too serves no better.
        let mut peer = advert(false, 100);
        peer.leg_up = false;
        assert!(a.on_advert(ms(t0, 800), peer).is_empty());
        assert_eq!(a.role(), Role::Active);
    }

    /// The active announces the addresses again once the peer concedes,
    /// not when it is first heard: a peer that comes back still saying it
    /// is active (a stalled active, resumed) may announce them itself
    /// until it has read that it lost, and an announcement made before
    /// that can arrive first and be overtaken.
    #[test]
    fn the_active_announces_again_once_a_returning_peer_concedes_not_before() {
        let t0 = Instant::now();
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        b.set_boot(3);
        b.on_tick(ms(t0, 600));
        assert_eq!(b.role(), Role::Active);
        assert!(
            !b.owes_announcement(ms(t0, 600)),
            "nobody heard, nobody conceded"
        );
        b.on_sent(10, ms(t0, 700));
        // The peer is back and says it is active (it cannot hear yet that
        // it lost): no announcement.
        // Its takeover was the earlier one.
        let still_active = PeerState {
            echo: Some((3, 10)),
            hears_peer: false,
            term: 0,
            ..advert(true, 100)
        };
        b.on_advert(ms(t0, 720), still_active);
        assert_eq!(b.role(), Role::Active);
        assert!(
            !b.owes_announcement(ms(t0, 720)),
            "announced while the returning peer still said it was active"
        );
        // It stands by, in reply to a fresh advert: announce, once.
        b.on_sent(11, ms(t0, 900));
        let conceded = PeerState {
            echo: Some((3, 11)),
            ..advert(false, 100)
        };
        b.on_advert(ms(t0, 910), conceded.clone());
        assert!(b.owes_announcement(ms(t0, 910)));
        b.on_sent(12, ms(t0, 1100));
        b.on_advert(
            ms(t0, 1110),
            PeerState {
                echo: Some((3, 12)),
                ..conceded
            },
        );
        assert!(!b.owes_announcement(ms(t0, 1110)), "announced twice");
        // A standby never announces.
        let mut standby = Election::new(Mode::Peer, timers(), "a", "b", 100, false, t0);
        standby.on_advert(ms(t0, 100), advert(true, 100));
        assert!(!standby.owes_announcement(ms(t0, 100)));
    }

    /// Adverts that queued while this process was stopped say "standby"
    /// from before the peer took over: read first, they are no concession.
    #[test]
    fn a_resumed_active_takes_no_queued_word_of_its_peer_for_a_concession() {
        let t0 = Instant::now();
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 100, false, t0);
        a.set_boot(5);
        a.on_tick(ms(t0, 600));
        a.on_sent(20, ms(t0, 800));
        a.on_advert(
            ms(t0, 810),
            PeerState {
                echo: Some((5, 20)),
                ..advert(false, 100)
            },
        );
        assert!(a.owes_announcement(ms(t0, 810)));
        // Stopped from 850 to 2350 ms; the first queued advert, sent at
        // 900 ms by a standby that still heard advert 20, is read at 2350.
        let stale = PeerState {
            echo: Some((5, 20)),
            ..advert(false, 100)
        };
        a.on_tick(ms(t0, 2350));
        assert!(!a.owes_announcement(ms(t0, 2350)));
        a.on_advert(ms(t0, 2350), stale);
        assert!(
            !a.owes_announcement(ms(t0, 2350)),
            "a stale word of the peer was taken for a concession"
        );
    }

    #[test]
    fn peer_mode_a_lone_replica_takes_over_after_the_dead_interval_not_before() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Peer, timers(), "a", "b", 100, false, t0);
        assert!(e.on_tick(ms(t0, 599)).is_empty());
        assert_eq!(e.on_tick(ms(t0, 600)), vec![Action::Take]);
        assert_eq!(e.take_change(), Some((Role::Active, Reason::PeerSilent)));
    }

    #[test]
    fn peer_mode_the_standby_takes_over_when_the_active_falls_silent() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        for i in 0..10 {
            assert!(e.on_advert(ms(t0, i * 200), advert(true, 200)).is_empty());
        }
        // Last heard at 1800 ms.
        assert!(e.on_tick(ms(t0, 2399)).is_empty());
        assert_eq!(e.on_tick(ms(t0, 2400)), vec![Action::Take]);
    }

    #[test]
    fn peer_mode_two_actives_leave_the_higher_priority_one() {
        let t0 = Instant::now();
        let mut low = Election::new(Mode::Peer, timers(), "a", "b", 50, false, t0);
        let mut high = Election::new(Mode::Peer, timers(), "b", "a", 150, false, t0);
        low.on_tick(ms(t0, 600));
        high.on_tick(ms(t0, 600));
        assert_eq!(low.role(), Role::Active);
        assert_eq!(high.role(), Role::Active);
        // Two replicas of this version never share a term; a peer of an
        // older one (or term 0) can: then priority decides.
        let same = |e: &Election, priority| PeerState {
            term: e.term(),
            ..advert(true, priority)
        };
        let to_low = same(&low, 150);
        assert_eq!(low.on_advert(ms(t0, 700), to_low), vec![Action::Release]);
        let to_high = same(&high, 50);
        assert!(high.on_advert(ms(t0, 700), to_high).is_empty());
        // Equal priorities: the lower name keeps it.
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 100, false, t0);
        a.on_tick(ms(t0, 600));
        let to_a = same(&a, 100);
        assert!(a.on_advert(ms(t0, 700), to_a).is_empty());
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        b.on_tick(ms(t0, 600));
        let to_b = same(&b, 100);
        assert_eq!(b.on_advert(ms(t0, 700), to_b), vec![Action::Release]);
    }

    #[test]
    fn peer_mode_preemption_waits_for_sync_and_needs_to_be_asked_for() {
        let t0 = Instant::now();
        let mut no = Election::new(Mode::Peer, timers(), "b", "a", 200, false, t0);
        assert!(no.on_advert(ms(t0, 100), advert(true, 100)).is_empty());
        let mut yes = Election::new(Mode::Peer, timers(), "b", "a", 200, true, t0);
        yes.set_in_sync(false);
        assert!(yes.on_advert(ms(t0, 100), advert(true, 100)).is_empty());
        yes.set_in_sync_at(true, ms(t0, 100));
        assert_eq!(
            yes.on_advert(ms(t0, 700), advert(true, 100)),
            vec![Action::Take]
        );
        assert_eq!(yes.take_change(), Some((Role::Active, Reason::Preempted)));
    }

    #[test]
    fn starting_together_the_higher_replica_goes_first() {
        let t0 = Instant::now();
        let mut low = Election::new(Mode::Peer, timers(), "a", "b", 50, false, t0);
        let mut high = Election::new(Mode::Peer, timers(), "b", "a", 150, false, t0);
        assert_eq!(
            high.on_advert(ms(t0, 100), advert(false, 50)),
            vec![Action::Take]
        );
        assert!(low.on_advert(ms(t0, 100), advert(false, 150)).is_empty());
        assert!(low.on_advert(ms(t0, 300), advert(true, 150)).is_empty());
    }

    /// Drives a standby in lease mode through a takeover from a dead active,
    /// returning the instant it took the addresses.
    fn lease_takeover(e: &mut Election, t0: Instant, silent_from: u64) -> u64 {
        let mut now = silent_from;
        loop {
            now += 10;
            assert!(now < silent_from + 10_000, "no takeover within 10 s");
            for action in e.on_tick(ms(t0, now)) {
                match action {
                    Action::Take => return now,
                    Action::Witness(WitnessRequest::Read) => {
                        // Held by the replica that fell silent.
                        let view = WitnessView {
                            holder: Some(e.peer_name.clone()),
                            version: "7".into(),
                        };
                        assert!(e
                            .on_witness(ms(t0, now), WitnessResult::Read(view))
                            .is_empty());
                    }
                    Action::Witness(WitnessRequest::Claim { version }) => {
                        assert_eq!(version, "7");
                        let out = e.on_witness(ms(t0, now), WitnessResult::Held);
                        assert!(out.is_empty(), "{out:?}");
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    #[test]
    fn lease_mode_a_standby_claims_the_witness_and_waits_out_the_fence_before_taking_over() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Lease, timers(), "b", "a", 100, false, t0);
        e.on_advert(ms(t0, 0), advert(true, 100));
        let took = lease_takeover(&mut e, t0, 0);
        let t = timers();
        let least = (t.dead_after + t.claim_wait(true) + t.fence_delay()).as_millis() as u64;
        assert!(took >= least, "took over at {took} ms, before {least} ms");
        assert!(
            took <= least + 30,
            "took over at {took} ms, long after {least} ms"
        );
        assert!(took < 3000, "a takeover at {took} ms misses 3 s");
    }

    #[test]
    fn lease_mode_a_claim_that_loses_to_a_renewal_leaves_the_standby_standing_by() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Lease, timers(), "b", "a", 100, false, t0);
        e.on_advert(ms(t0, 0), advert(true, 100));
        assert_eq!(
            e.on_tick(ms(t0, 600)),
            vec![Action::Witness(WitnessRequest::Read)]
        );
        let view = WitnessView {
            holder: Some("a".into()),
            version: "7".into(),
        };
        e.on_witness(ms(t0, 600), WitnessResult::Read(view.clone()));
        let cw = timers().claim_wait(true).as_millis() as u64;
        assert!(e.on_tick(ms(t0, 600 + cw - 1)).is_empty());
        let claim = e.on_tick(ms(t0, 600 + cw));
        assert_eq!(
            claim,
            vec![Action::Witness(WitnessRequest::Claim {
                version: "7".into()
            })]
        );
        assert!(e
            .on_witness(ms(t0, 610 + cw), WitnessResult::Lost)
            .is_empty());
        // The next look waits a slow renewal period, not the fast one.
        assert_eq!(
            e.on_tick(ms(t0, 810 + cw)),
            vec![Action::Witness(WitnessRequest::Read)]
        );
        e.on_witness(ms(t0, 810 + cw), WitnessResult::Read(view));
        let slow = timers().claim_wait(false).as_millis() as u64;
        assert!(e.on_tick(ms(t0, 810 + cw + slow - 1)).is_empty());
        assert_eq!(e.role(), Role::Standby);
    }

    #[test]
    fn lease_mode_an_active_that_cannot_hear_its_peer_fences_on_a_failed_renewal() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Lease, timers(), "a", "b", 100, false, t0);
        let took = lease_takeover(&mut e, t0, 0);
        assert_eq!(e.role(), Role::Active);
        // Alone, the active renews every degraded_fast at first.
        assert!(e.on_tick(ms(t0, took + 199)).is_empty());
        let now = ms(t0, took + 200);
        assert_eq!(e.on_tick(now), vec![Action::Witness(WitnessRequest::Renew)]);
        assert_eq!(
            e.on_witness(now, WitnessResult::Failed),
            vec![Action::Release]
        );
        assert_eq!(e.take_change(), Some((Role::Standby, Reason::Fenced)));
    }

    #[test]
    fn lease_mode_a_failed_renewal_is_harmless_while_the_peer_vouches_and_fatal_when_it_lost() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Lease, timers(), "a", "b", 100, false, t0);
        let took = lease_takeover(&mut e, t0, 0);
        let mut now = took;
        // The peer comes back and hears it: renewals fall to one a minute.
        while now < took + 60_000 {
            now += 200;
            let out = e.on_advert(ms(t0, now), advert(false, 100));
            if now < took + 60_000 {
                assert!(out.is_empty(), "at {now}: {out:?}");
            } else {
                assert_eq!(out, vec![Action::Witness(WitnessRequest::Renew)]);
            }
        }
        // That renewal fails: the peer vouches, so it stays.
        assert!(e.on_witness(ms(t0, now), WitnessResult::Failed).is_empty());
        assert_eq!(e.role(), Role::Active);
        // The peer says it cannot hear this replica: renew, and a lost
        // renewal means let go.
        let deaf = PeerState {
            hears_peer: false,
            ..advert(false, 100)
        };
        let later = ms(t0, now + 200);
        assert_eq!(
            e.on_advert(later, deaf),
            vec![Action::Witness(WitnessRequest::Renew)]
        );
        assert_eq!(
            e.on_witness(later, WitnessResult::Lost),
            vec![Action::Release]
        );
    }

    #[test]
    fn lease_mode_an_unheld_witness_is_claimed_at_once() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Lease, timers(), "a", "b", 100, false, t0);
        assert_eq!(
            e.on_tick(ms(t0, 600)),
            vec![Action::Witness(WitnessRequest::Read)]
        );
        let view = WitnessView {
            holder: None,
            version: "1".into(),
        };
        assert_eq!(
            e.on_witness(ms(t0, 610), WitnessResult::Read(view)),
            vec![Action::Witness(WitnessRequest::Claim {
                version: "1".into()
            })]
        );
    }

    /// The partition race: the standby reads the witness after the cut-off
    /// active's first renewal. The active keeps renewing every
    /// degraded_fast, so the version moves before the standby's claim.
    #[test]
    fn lease_mode_a_cut_off_active_renews_within_the_standbys_claim_wait() {
        let t0 = Instant::now();
        let t = timers();
        let mut active = Election::new(Mode::Lease, t.clone(), "a", "b", 100, false, t0);
        lease_takeover(&mut active, t0, 0);
        let took = 2_400;
        // The peer is heard until 10 s, then the link is cut.
        let mut now = took;
        while now < 10_000 {
            now += 200;
            active.on_advert(ms(t0, now), advert(false, 100));
        }
        let cut = now;
        let mut renewals = Vec::new();
        while now < cut + 5_000 {
            now += 10;
            for a in active.on_tick(ms(t0, now)) {
                assert_eq!(a, Action::Witness(WitnessRequest::Renew));
                renewals.push(now);
                assert!(active
                    .on_witness(ms(t0, now), WitnessResult::Held)
                    .is_empty());
            }
        }
        // The standby notices at cut + dead_after at the earliest and
        // claims claim_wait after its read: a renewal must fall between.
        let read = cut + t.dead_after.as_millis() as u64;
        let claim = read + t.claim_wait(true).as_millis() as u64;
        assert!(
            renewals
                .iter()
                .any(|r| *r > read && *r + t.api_timeout.as_millis() as u64 <= claim),
            "no renewal between the read at {read} and the claim at {claim}: {renewals:?}"
        );
    }

    #[test]
    fn after_a_partition_the_later_takeover_keeps_the_addresses_whatever_the_priorities() {
        let t0 = Instant::now();
        // "a" (priority 200) was active at term 2 (its first: even) and got
        // cut off; "b" (priority 100) took over at term 3.
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 200, false, t0);
        a.on_tick(ms(t0, 600));
        assert_eq!((a.role(), a.term()), (Role::Active, 2));
        let newer = PeerState {
            term: 3,
            ..advert(true, 100)
        };
        assert_eq!(a.on_advert(ms(t0, 5_000), newer), vec![Action::Release]);
        assert_eq!(
            a.take_change(),
            Some((Role::Standby, Reason::HigherPeerActive))
        );
        // And "b", hearing the older term, stays.
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        b.on_advert(ms(t0, 100), advert(true, 200));
        assert_eq!(b.on_tick(ms(t0, 800)), vec![Action::Take]);
        assert_eq!(
            b.term(),
            3,
            "the next of its parity after the highest term seen"
        );
        let older = PeerState {
            term: 2,
            ..advert(true, 200)
        };
        assert!(b.on_advert(ms(t0, 5_000), older).is_empty());
        assert_eq!(b.role(), Role::Active);
        // A replica that restarted and never heard its peer takes a term
        // after the highest it persisted, later than the cut-off one's.
        let mut fresh = Election::new(Mode::Peer, timers(), "a", "b", 100, false, t0);
        fresh.set_term_floor(41);
        assert_eq!(fresh.on_tick(ms(t0, 600)), vec![Action::Take]);
        assert_eq!(fresh.term(), 42);
        let cut_off = PeerState {
            term: 41,
            ..advert(true, 200)
        };
        assert!(fresh.on_advert(ms(t0, 700), cut_off).is_empty());
        assert_eq!(fresh.role(), Role::Active);
    }

    /// Terms count takeovers: each is the next of the replica's parity
    /// after the highest held or heard, whatever either clock says.
    #[test]
    fn a_takeover_s_term_is_one_more_than_any_term_held_or_heard() {
        let t0 = Instant::now();
        let mut b = Election::new(Mode::Peer, timers(), "b", "a", 100, false, t0);
        b.on_advert(
            ms(t0, 100),
            PeerState {
                term: 7,
                ..advert(true, 100)
            },
        );
        assert_eq!(b.highest_term(), 7, "heard, to be persisted");
        assert_eq!(b.on_tick(ms(t0, 800)), vec![Action::Take]);
        assert_eq!(b.term(), 9, "the next odd term: \"b\" sorts second");
        assert_eq!(b.highest_term(), 9);
    }

    /// An active that was heard by its standby at `sent` may ACK alone
    /// until the standby could first declare it silent, and no longer.
    #[test]
    fn an_active_acks_alone_only_while_no_other_replica_can_be_active() {
        let t0 = Instant::now();
        let t = timers();
        let margin = t.advert / 4;
        let mut e = Election::new(Mode::Peer, t.clone(), "a", "b", 100, false, t0);
        e.set_boot(7);
        assert_eq!(e.alone_until(t0), None, "a standby never ACKs");
        e.on_tick(ms(t0, 600));
        assert_eq!(e.role(), Role::Active);
        // Silent peer, declared gone: allowed only while the election runs.
        assert_eq!(e.alone_until(ms(t0, 600)), Some(ms(t0, 600) + t.advert / 2));
        e.on_sent(41, ms(t0, 700));
        let standby = PeerState {
            echo: Some((7, 41)),
            ..advert(false, 100)
        };
        e.on_advert(ms(t0, 750), standby.clone());
        let until = ms(t0, 700) + t.dead_after - margin;
        assert_eq!(e.alone_until(ms(t0, 750)), Some(until));
        // After a stall nothing newer was heard: the bound has passed.
        assert!(e.alone_until(ms(t0, 2200)).is_none_or(|u| u > ms(t0, 2200)));
        // An echo of another boot, or of an advert not sent, vouches for
        // nothing new.
        let mut other = e.clone_for_test();
        other.on_advert(
            ms(t0, 760),
            PeerState {
                echo: Some((8, 41)),
                ..standby.clone()
            },
        );
        assert_eq!(other.alone_until(ms(t0, 760)), Some(until));
        // A standby that can preempt, in sync, vouches for nothing.
        let mut preempting = e.clone_for_test();
        preempting.on_advert(
            ms(t0, 800),
            PeerState {
                preempt: true,
                in_sync: true,
                priority: 200,
                ..standby.clone()
            },
        );
        assert_eq!(preempting.alone_until(ms(t0, 800)), None);
        // Behind, it cannot preempt before it has said it is in sync for a
        // dead interval: the echo still counts.
        let mut behind = e.clone_for_test();
        behind.on_advert(
            ms(t0, 800),
            PeerState {
                preempt: true,
                in_sync: false,
                priority: 200,
                ..standby.clone()
            },
        );
        assert_eq!(behind.alone_until(ms(t0, 800)), Some(until));
        // A peer that says it is active vouches for nothing.
        e.on_advert(ms(t0, 800), advert(true, 50));
        assert_eq!(e.alone_until(ms(t0, 800)), None);
    }

    #[test]
    fn a_preempting_standby_waits_a_dead_interval_after_it_is_in_sync() {
        let t0 = Instant::now();
        let mut e = Election::new(Mode::Peer, timers(), "b", "a", 200, true, t0);
        e.set_in_sync_at(false, t0);
        assert!(e.on_advert(ms(t0, 100), advert(true, 100)).is_empty());
        e.set_in_sync_at(true, ms(t0, 200));
        assert!(e.on_advert(ms(t0, 300), advert(true, 100)).is_empty());
        assert!(e.on_advert(ms(t0, 799), advert(true, 100)).is_empty());
        assert_eq!(
            e.on_advert(ms(t0, 800), advert(true, 100)),
            vec![Action::Take]
        );
    }

    #[test]
    fn lease_mode_an_active_acks_alone_until_a_claim_could_follow_its_renewal() {
        let t0 = Instant::now();
        let t = timers();
        let mut e = Election::new(Mode::Lease, t.clone(), "b", "a", 100, false, t0);
        e.on_advert(ms(t0, 0), advert(true, 100));
        let took = lease_takeover(&mut e, t0, 0);
        let margin = t.advert / 4;
        let until = e.alone_until(ms(t0, took)).expect("the claim allows");
        assert!(until < ms(t0, took) + t.claim_wait(true), "{until:?}");
        assert!(until > ms(t0, took));
        let asked = took + 1000;
        let renew = e.on_tick(ms(t0, asked));
        assert!(
            renew.contains(&Action::Witness(WitnessRequest::Renew)),
            "{renew:?}"
        );
        e.on_witness(ms(t0, asked + 500), WitnessResult::Held);
        assert_eq!(
            e.alone_until(ms(t0, asked + 500)),
            Some(ms(t0, asked) + t.claim_wait(true) - margin),
            "counted from when the renewal was asked, not answered"
        );
        assert_eq!(
            e.on_witness(ms(t0, asked + 600), WitnessResult::Lost),
            vec![Action::Release]
        );
        assert_eq!(e.alone_until(ms(t0, asked + 600)), None);
    }

    /// Found by the simulation: an active with preemption that was stalled
    /// hears the takeover, yields, and must not preempt back at once on the
    /// strength of its old log (the new active wrote leases it lacks).
    #[test]
    fn a_replica_that_yields_does_not_preempt_until_it_has_followed_the_new_active() {
        let t0 = Instant::now();
        let mut a = Election::new(Mode::Peer, timers(), "a", "b", 200, true, t0);
        a.on_tick(ms(t0, 600));
        assert_eq!(a.role(), Role::Active);
        let newer = PeerState {
            term: a.term() + 1,
            ..advert(true, 100)
        };
        assert_eq!(
            a.on_advert(ms(t0, 2000), newer.clone()),
            vec![Action::Release]
        );
        assert!(
            !a.in_sync(),
            "the replica that yielded still says its log is complete"
        );
        for n in 1..10 {
            assert!(
                a.on_advert(ms(t0, 2000 + n * 200), newer.clone())
                    .is_empty(),
                "preempted back {} ms after yielding, before following the new active",
                n * 200
            );
        }
        a.set_in_sync_at(true, ms(t0, 4000));
        assert_eq!(a.on_advert(ms(t0, 4600), newer), vec![Action::Take]);
    }
}
