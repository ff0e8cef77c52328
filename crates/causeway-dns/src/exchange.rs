//! One forwarded query's exchange with the upstream resolvers, as a state
//! machine that does no I/O. Its driver puts in what happened (a datagram,
//! an answer read from a stream, an error, the time) and takes out what to
//! do: a [`Transmit`] to send, when to wake it ([`Exchange::poll_timeout`]),
//! what each upstream did ([`Event`]) and, in the end, the outcome.
//!
//! Two drivers share it, so the rules live in one place: a UDP serving
//! thread drives the queries it read on its own epoll descriptor
//! (`outbound`), and an async task drives queries that came over TCP, and
//! any query whose answer must be fetched again over TCP (`forward`).
//!
//! The rules: upstreams are asked one at a time in the order given, each
//! for its share of the time; an answer counts only with the attempt's own
//! random ID and the question as asked (RFC 5452 §9.1); a truncated answer
//! is asked again over TCP of the same upstream; SERVFAIL, REFUSED, a
//! malformed answer, a silent upstream or an error of the upstream's moves
//! on to the next one; an error of our own (out of descriptors, ports,
//! buffers) ends the query at once, blaming no upstream, since no other
//! would fare better. The fresh port each attempt needs (§9.2) is the
//! driver's part: every transmit goes out on a socket of its own.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use rand::Rng;

use crate::cache::shape;

/// The DNS header's length: the question starts after it.
const HEADER: usize = 12;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("no resource of our own to ask upstream: {0}")]
    Local(io::Error),
    #[error("malformed response")]
    Malformed,
    #[error("upstream answered {0}")]
    Failed(ResponseCode),
    #[error("too many upstream queries in flight")]
    Overloaded,
}

impl FetchError {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            FetchError::Timeout => "timeout",
            FetchError::Io(_) => "io",
            FetchError::Local(_) => "local",
            FetchError::Malformed => "malformed",
            FetchError::Failed(_) => "servfail",
            FetchError::Overloaded => "overloaded",
        }
    }
}

/// An upstream to try: its index among the configured ones (which health
/// and metrics go by) and its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub index: usize,
    pub addr: SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    /// One query on a connection of its own, with the two-byte length
    /// before it (RFC 1035 §4.2.2), which is the driver's to add.
    Tcp,
}

/// Send [`Exchange::payload`] to `to` over `transport`, on a socket of its
/// own, and report what comes of it under `attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transmit {
    pub attempt: u32,
    pub upstream: usize,
    pub to: SocketAddr,
    pub transport: Transport,
}

/// What an upstream did, for its health and the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Answered {
        upstream: usize,
        took: Duration,
    },
    Failed {
        upstream: usize,
        reason: &'static str,
    },
    /// A datagram on the attempt's socket that was not its answer (another
    /// ID or question): dropped, and the wait goes on.
    Unexpected,
}

#[derive(Debug, Clone, Copy)]
struct Attempt {
    number: u32,
    route: Route,
    transport: Transport,
    started: Instant,
    expires: Instant,
}

pub(crate) struct Exchange {
    /// The query as the client sent it, but for the ID, which is the
    /// current attempt's.
    packet: Vec<u8>,
    question_end: usize,
    routes: Vec<Route>,
    /// The next of `routes` to ask.
    next: usize,
    per_try: Duration,
    /// When the query stops trying upstreams.
    deadline: Instant,
    attempts: u32,
    current: Option<Attempt>,
    transmit: Option<Transmit>,
    /// The latest failure, the outcome if no upstream answers.
    last: FetchError,
    outcome: Option<Result<Vec<u8>, FetchError>>,
    finished: bool,
    events: VecDeque<Event>,
}

impl Exchange {
    /// Starts asking for `request` (whose question ends at `question_end`),
    /// the upstreams in `routes` in that order, over `total` at most and
    /// `per_try` at most for each. The first transmit is ready at once.
    pub(crate) fn new(
        request: &[u8],
        question_end: usize,
        routes: Vec<Route>,
        total: Duration,
        per_try: Duration,
        now: Instant,
    ) -> Self {
        let mut exchange = Exchange {
            packet: request.to_vec(),
            question_end,
            routes,
            next: 0,
            per_try,
            deadline: now + total,
            attempts: 0,
            current: None,
            transmit: None,
            last: FetchError::Timeout,
            outcome: None,
            finished: false,
            events: VecDeque::new(),
        };
        if question_end <= HEADER || question_end > request.len() {
            exchange.finish(Err(FetchError::Malformed));
        } else {
            exchange.ask_next(now);
        }
        exchange
    }

    /// What to send now, if anything.
    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmit.take()
    }

    /// The bytes every transmit sends: the query with its attempt's ID.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.packet
    }

    /// When [`Self::handle_timeout`] is next due, while the query waits.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.current.map(|a| a.expires)
    }

    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The answer, or why there is none, once; the exchange is then over.
    pub(crate) fn poll_outcome(&mut self) -> Option<Result<Vec<u8>, FetchError>> {
        self.outcome.take()
    }

    /// Whether `attempt` still waits for a datagram: the driver keeps
    /// reading its socket while it does.
    pub(crate) fn waits_on(&self, attempt: u32) -> bool {
        self.current_over(attempt, Transport::Udp).is_some()
    }

    /// The attempt in progress, if it is `attempt` over `transport`: what
    /// arrives for any other is late, or on the wrong path, and changes
    /// nothing.
    fn current_over(&self, attempt: u32, transport: Transport) -> Option<Attempt> {
        self.current
            .filter(|a| a.number == attempt && a.transport == transport)
    }

    /// A datagram read on `attempt`'s socket.
    pub(crate) fn handle_datagram(&mut self, now: Instant, attempt: u32, wire: &[u8]) {
        let Some(current) = self.current_over(attempt, Transport::Udp) else {
            return;
        };
        if !self.is_answer(wire) {
            self.events.push_back(Event::Unexpected);
            return;
        }
        if shape(wire).is_some_and(|s| s.truncated) {
            // The upstream has answered, only not in one datagram: it is
            // asked again over TCP with whatever time the query has left.
            let left = self.deadline.saturating_duration_since(now);
            if left.is_zero() {
                return self.upstream_failed(now, FetchError::Timeout);
            }
            return self.begin(now, current.route, Transport::Tcp, left);
        }
        self.answered(now, current, wire);
    }

    /// The answer read from `attempt`'s stream. A connection is no place
    /// for a forger to answer, so one that does not match is the upstream's
    /// fault, not something to wait past.
    pub(crate) fn handle_stream(&mut self, now: Instant, attempt: u32, wire: &[u8]) {
        let Some(current) = self.current_over(attempt, Transport::Tcp) else {
            return;
        };
        if !self.is_answer(wire) {
            return self.upstream_failed(now, FetchError::Malformed);
        }
        self.answered(now, current, wire);
    }

    /// An error sending or receiving for `attempt`, or making its socket.
    pub(crate) fn handle_error(&mut self, now: Instant, attempt: u32, error: io::Error) {
        if self.current.is_none_or(|a| a.number != attempt) {
            return;
        }
        if is_local(&error) {
            self.finish(Err(FetchError::Local(error)));
        } else {
            self.upstream_failed(now, FetchError::Io(error));
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.current.is_some_and(|a| a.expires <= now) {
            self.upstream_failed(now, FetchError::Timeout);
        }
    }

    /// A response (QR set) with our ID and exactly our one question: a
    /// reflected query or a packet with more questions is not an answer.
    fn is_answer(&self, wire: &[u8]) -> bool {
        let question = &self.packet[HEADER..self.question_end];
        wire.get(2).is_some_and(|flags| flags & 0x80 != 0)
            && wire.get(4..6) == Some(&[0, 1][..])
            && wire.get(..2) == self.packet.get(..2)
            && wire
                .get(HEADER..self.question_end)
                .is_some_and(|got| got.eq_ignore_ascii_case(question))
    }

    fn answered(&mut self, now: Instant, current: Attempt, wire: &[u8]) {
        match check(wire) {
            Ok(()) => {
                self.events.push_back(Event::Answered {
                    upstream: current.route.index,
                    took: now.saturating_duration_since(current.started),
                });
                self.finish(Ok(wire.to_vec()));
            }
            Err(e) => self.upstream_failed(now, e),
        }
    }

    fn upstream_failed(&mut self, now: Instant, error: FetchError) {
        if let Some(current) = self.current {
            self.events.push_back(Event::Failed {
                upstream: current.route.index,
                reason: error.label(),
            });
        }
        self.last = error;
        self.ask_next(now);
    }

    fn ask_next(&mut self, now: Instant) {
        let left = self.deadline.saturating_duration_since(now);
        match self.routes.get(self.next).copied() {
            Some(route) if !left.is_zero() => {
                self.next += 1;
                self.begin(now, route, Transport::Udp, self.per_try.min(left));
            }
            _ => {
                let last = std::mem::replace(&mut self.last, FetchError::Timeout);
                self.finish(Err(last));
            }
        }
    }

    fn begin(&mut self, now: Instant, route: Route, transport: Transport, wait: Duration) {
        self.attempts += 1;
        let id: u16 = rand::rng().random();
        self.packet[..2].copy_from_slice(&id.to_be_bytes());
        let attempt = Attempt {
            number: self.attempts,
            route,
            transport,
            started: now,
            expires: now + wait,
        };
        self.current = Some(attempt);
        self.transmit = Some(Transmit {
            attempt: attempt.number,
            upstream: route.index,
            to: route.addr,
            transport,
        });
    }

    fn finish(&mut self, outcome: Result<Vec<u8>, FetchError>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.current = None;
        self.transmit = None;
        self.outcome = Some(outcome);
    }
}

/// Whether an upstream's answer may be taken: it must parse and must not be
/// a failure another upstream might not have.
fn check(wire: &[u8]) -> Result<(), FetchError> {
    match shape(wire) {
        None => Err(FetchError::Malformed),
        Some(s) if matches!(s.rcode, ResponseCode::ServFail | ResponseCode::Refused) => {
            Err(FetchError::Failed(s.rcode))
        }
        Some(_) => Ok(()),
    }
}

/// Errors that say we, not the upstream, are short of something (the
/// runtime's list, shared with the proxy and the DNS accept loop, and a
/// full send buffer). Blaming the upstream for them would skip healthy
/// upstreams exactly when we are loaded.
fn is_local(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::WouldBlock
        || causeway_runtime::resources::local_resources_exhausted(error)
}

#[cfg(test)]
#[path = "exchange_tests.rs"]
mod tests;
