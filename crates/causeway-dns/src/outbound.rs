//! Forwarding from a UDP serving thread. Each thread asks upstream on a
//! socket of its own and waits for the answers in the same poll as for new
//! queries: the thread that read a query reads its answer and sends the
//! reply. Handing forwarded queries to the async runtime instead woke two
//! more threads per query, and on a VM each wake-up of an idle vCPU can
//! cost milliseconds of latency.
//!
//! The cache, the coalescing of identical queries, the bound on queries in
//! flight and upstream health stay shared ([`Forwarder`]); what is per
//! thread is the socket and the queries it has sent.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Instant;

use foldhash::{HashMap, HashMapExt};
use rand::Rng;

use crate::cache::{key_of, shape, CacheKey};
use crate::endpoint::Endpoint;
use crate::forward::{self, Answer, FetchError, Forwarder, InFlight, Join, Waiter};
use crate::message::ParsedQuery;
use crate::server::{unix_now, Shared};

/// Upstream answers read per wake-up at most, so a flood of them cannot
/// keep the thread from its clients.
const ANSWERS_PER_READ: usize = 64;

/// A UDP client waiting for a forwarded answer: where its reply goes, from
/// which socket, and the query it must answer.
pub(crate) struct Client {
    pub endpoint: Arc<Endpoint>,
    pub q: ParsedQuery,
    pub view: usize,
    pub request: Vec<u8>,
    pub to: SocketAddr,
    pub local: Option<Ipv4Addr>,
}

/// A query on its way upstream.
struct Flight {
    key: CacheKey,
    client: Box<Client>,
    /// Upstream indices in the order to try them; `next` is the one after
    /// `upstream`, the one asked now.
    order: Vec<usize>,
    next: usize,
    upstream: usize,
    sent: Instant,
    /// When the query stops trying upstreams.
    deadline: Instant,
    /// Which send this is: a timer set for an earlier send is ignored.
    attempt: u64,
    _slot: InFlight,
}

pub(crate) struct Outbound {
    fwd: Arc<Forwarder>,
    socket: UdpSocket,
    /// By the ID of the query sent upstream.
    flights: HashMap<u16, Flight>,
    /// When each send gives up on its upstream. Entries of flights already
    /// answered stay until their time and are then skipped.
    timers: BinaryHeap<Reverse<(Instant, u16, u64)>>,
    attempts: u64,
    packet: Vec<u8>,
    buf: Vec<u8>,
    runtime: tokio::runtime::Handle,
}

impl Outbound {
    /// Binds this thread's upstream socket.
    pub fn new(fwd: Arc<Forwarder>, runtime: tokio::runtime::Handle) -> io::Result<Self> {
        let socket = UdpSocket::bind(fwd.local_bind())?;
        socket.set_nonblocking(true)?;
        Ok(Outbound {
            fwd,
            socket,
            flights: HashMap::new(),
            timers: BinaryHeap::new(),
            attempts: 0,
            packet: Vec::with_capacity(512),
            buf: vec![0u8; 65535],
            runtime,
        })
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// True when no query waits upstream, so the thread may block on its
    /// clients alone.
    pub fn is_idle(&self) -> bool {
        self.flights.is_empty()
    }

    /// When the next send gives up, if any is waiting.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Answers `client` from the cache, or joins it to the identical query
    /// already upstream, or asks upstream.
    pub fn forward(&mut self, shared: &Shared, client: Client) {
        let key = key_of(&client.q);
        if let Some(wire) = self.fwd.cached(&key, unix_now()) {
            shared.deliver(
                &Answer::Response(wire),
                vec![Waiter::Datagram(Box::new(client))],
            );
            return;
        }
        let client = match self.fwd.join(&key, Box::new(client)) {
            Join::Lead(client) => client,
            // Whoever asked first answers this client too.
            Join::Joined => return,
            Join::Full(client) => {
                return shared.deliver(&Answer::ServFail, vec![Waiter::Datagram(client)])
            }
        };
        let Some(slot) = self.fwd.in_flight() else {
            let (answer, mut waiters) =
                self.fwd
                    .settle(&key, &client.q, Err(FetchError::Overloaded), unix_now());
            waiters.push(Waiter::Datagram(client));
            shared.deliver(&answer, waiters);
            return;
        };
        let (total, _) = self.fwd.timeouts();
        let now = Instant::now();
        let flight = Flight {
            key,
            client,
            order: self.fwd.order(),
            next: 0,
            upstream: 0,
            sent: now,
            deadline: now + total,
            attempt: 0,
            _slot: slot,
        };
        self.send_next(shared, flight, FetchError::Timeout);
    }

    /// Asks the next upstream in the flight's order. With none left, or no
    /// time, the flight ends with `last`, the latest failure.
    fn send_next(&mut self, shared: &Shared, mut flight: Flight, mut last: FetchError) {
        let (_, per_try) = self.fwd.timeouts();
        while let Some(&index) = flight.order.get(flight.next) {
            flight.next += 1;
            let now = Instant::now();
            let remaining = flight.deadline.saturating_duration_since(now);
            if remaining.is_zero() {
                break;
            }
            let (Some(addr), Some(id)) = (self.fwd.upstream_addr(index), self.fresh_id()) else {
                last = FetchError::Overloaded;
                break;
            };
            self.packet.clear();
            self.packet.extend_from_slice(&id.to_be_bytes());
            self.packet
                .extend_from_slice(flight.client.request.get(2..).unwrap_or_default());
            match self.socket.send_to(&self.packet, addr) {
                Ok(_) => {
                    if self.flights.is_empty() {
                        // Every timer left belongs to a flight that is over.
                        self.timers.clear();
                    }
                    self.attempts += 1;
                    flight.upstream = index;
                    flight.sent = now;
                    flight.attempt = self.attempts;
                    self.timers
                        .push(Reverse((now + per_try.min(remaining), id, self.attempts)));
                    self.flights.insert(id, flight);
                    return;
                }
                // Our own send buffer is full: no fault of the upstream's,
                // and no other upstream would fare better now.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    last = FetchError::Overloaded;
                    break;
                }
                Err(e) => {
                    let e = FetchError::Io(e);
                    self.fwd.failed(index, &e);
                    last = e;
                }
            }
        }
        finish(shared, &self.fwd, flight, Err(last));
    }

    /// A random ID no query of this socket has now: the ID is half of what
    /// keeps a forged answer out, the socket's random port the other.
    fn fresh_id(&self) -> Option<u16> {
        let mut rng = rand::rng();
        (0..16)
            .map(|_| rng.random::<u16>())
            .find(|id| !self.flights.contains_key(id))
    }

    /// Reads the upstream answers waiting on the socket. An answer counts
    /// only from the upstream asked, with the ID and the question asked.
    pub fn receive(&mut self, shared: &Arc<Shared>) {
        for _ in 0..ANSWERS_PER_READ {
            let (n, from) = match self.socket.recv_from(&mut self.buf) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "DNS upstream receive failed");
                    return;
                }
            };
            let wire = &self.buf[..n];
            let expected = |f: &Flight| {
                let asked = self.fwd.upstream_addr(f.upstream);
                let question = f.client.request.get(12..f.client.q.question_end);
                asked
                    .zip(question)
                    .is_some_and(|(asked, question)| forward::answers(wire, from, asked, question))
            };
            let id =
                forward::answer_id(wire).filter(|id| self.flights.get(id).is_some_and(expected));
            let Some(flight) = id.and_then(|id| self.flights.remove(&id)) else {
                shared
                    .metrics
                    .dropped
                    .with_label_values(&["unexpected_upstream_response"])
                    .inc();
                continue;
            };
            let wire = wire.to_vec();
            if shape(&wire).is_some_and(|s| s.truncated) {
                self.over_tcp(shared, flight);
                continue;
            }
            match Forwarder::check(wire) {
                Ok(wire) => {
                    self.fwd.succeeded(flight.upstream, flight.sent.elapsed());
                    finish(shared, &self.fwd, flight, Ok(wire));
                }
                Err(e) => {
                    self.fwd.failed(flight.upstream, &e);
                    self.send_next(shared, flight, e);
                }
            }
        }
    }

    /// Moves the upstream whose send ran out of time on to the next one.
    pub fn expire(&mut self, shared: &Shared) {
        let now = Instant::now();
        while let Some(Reverse((at, id, attempt))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            // Answered, or sent again since: this timer is over.
            if self.flights.get(&id).is_none_or(|f| f.attempt != attempt) {
                continue;
            }
            if let Some(flight) = self.flights.remove(&id) {
                self.fwd.failed(flight.upstream, &FetchError::Timeout);
                self.send_next(shared, flight, FetchError::Timeout);
            }
        }
    }

    /// A truncated UDP answer: the same upstream is asked over TCP, on the
    /// runtime, so this thread goes on serving. A failure there ends the
    /// query (with a stale answer or SERVFAIL) rather than trying the next
    /// upstream: the upstream has answered, only not in one datagram.
    fn over_tcp(&self, shared: &Arc<Shared>, flight: Flight) {
        let Some(addr) = self.fwd.upstream_addr(flight.upstream) else {
            return finish(shared, &self.fwd, flight, Err(FetchError::Malformed));
        };
        let wait = flight.deadline.saturating_duration_since(Instant::now());
        let (shared, fwd) = (shared.clone(), self.fwd.clone());
        self.runtime.spawn(async move {
            let result = forward::tcp(addr, &flight.client.request, wait)
                .await
                .and_then(Forwarder::check);
            match &result {
                Ok(_) => fwd.succeeded(flight.upstream, flight.sent.elapsed()),
                Err(e) => fwd.failed(flight.upstream, e),
            }
            finish(&shared, &fwd, flight, result);
        });
    }

    /// Ends every query still upstream, when the thread stops: those who
    /// wait for them, on other threads too, get a stale answer or SERVFAIL
    /// rather than nothing.
    pub fn abandon(&mut self, shared: &Shared) {
        for (_, flight) in self.flights.drain() {
            finish(shared, &self.fwd, flight, Err(FetchError::Timeout));
        }
        self.timers.clear();
    }
}

/// Caches the answer (or finds a stale one) and replies to the client and
/// to everyone who joined its query.
fn finish(shared: &Shared, fwd: &Forwarder, flight: Flight, result: Result<Vec<u8>, FetchError>) {
    let Flight { key, client, .. } = flight;
    let (answer, mut waiters) = fwd.settle(&key, &client.q, result, unix_now());
    waiters.push(Waiter::Datagram(client));
    shared.deliver(&answer, waiters);
}

#[cfg(test)]
#[path = "outbound_tests.rs"]
mod tests;
