//! Forwarding from a UDP serving thread. Each thread asks upstream on a
//! socket of its own and waits for the answers in the same poll as for new
//! queries: the thread that read a query reads its answer and sends the
//! reply. Handing forwarded queries to the async runtime instead woke two
//! more threads per query, and on a VM each wake-up of an idle vCPU can
//! cost milliseconds of latency.
//!
//! The cache, the coalescing of identical queries, the bound on queries in
//! flight and upstream health stay shared ([`Forwarder`]); what is per
//! thread is the queries it has sent.
//!
//! Every query sent upstream goes out on a socket of its own, bound to a
//! port the kernel picks at random and connected to the upstream asked
//! (RFC 5452 §9.2): a forger must guess the port as well as the 16-bit ID,
//! and the kernel drops datagrams from any other address before we see
//! them. The thread waits on all of them through one epoll descriptor.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use foldhash::{HashMap, HashMapExt};
use rand::Rng;

use crate::cache::{key_of, shape, CacheKey};
use crate::forward::{self, Answer, Client, FetchError, Forwarder, InFlight, Join, Waiter};
use crate::shared::{unix_now, Shared};

/// Upstream answers read per wake-up at most, so a flood of them cannot
/// keep the thread from its clients.
const ANSWERS_PER_READ: usize = 64;

/// A query on its way upstream.
struct Flight {
    key: CacheKey,
    client: Box<Client>,
    /// Upstream indices in the order to try them; `next` is the one after
    /// `upstream`, the one asked now.
    order: Vec<usize>,
    next: usize,
    upstream: usize,
    /// The socket of this send alone: a random port, connected to the
    /// upstream asked. Replaced when the next upstream is asked.
    socket: Option<UdpSocket>,
    /// The random ID this send carries.
    id: u16,
    sent: Instant,
    /// When the query stops trying upstreams.
    deadline: Instant,
    _slot: InFlight,
}

pub(crate) struct Outbound {
    fwd: Arc<Forwarder>,
    /// Readable when any flight's socket is.
    epoll: Epoll,
    events: Vec<EpollEvent>,
    /// By the token of their latest send, which is also their epoll data.
    flights: HashMap<u64, Flight>,
    /// When each send gives up on its upstream. Entries of sends already
    /// answered, or followed by another, stay until their time and are then
    /// skipped.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    sends: u64,
    packet: Vec<u8>,
    buf: Vec<u8>,
    runtime: tokio::runtime::Handle,
}

/// A socket for one upstream query: bound to any address on a port the
/// kernel picks at random, connected to `upstream`.
fn query_socket(bind: SocketAddr, upstream: SocketAddr) -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind(bind)?;
    socket.connect(upstream)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

impl Outbound {
    pub fn new(fwd: Arc<Forwarder>, runtime: tokio::runtime::Handle) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io::Error::from)?;
        Ok(Outbound {
            fwd,
            epoll,
            events: vec![EpollEvent::empty(); ANSWERS_PER_READ],
            flights: HashMap::new(),
            timers: BinaryHeap::new(),
            sends: 0,
            packet: Vec::with_capacity(512),
            buf: vec![0u8; 65535],
            runtime,
        })
    }

    /// What the serving thread polls beside its clients' socket.
    pub fn readiness(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    /// True when no query waits upstream, so the thread may block on its
    /// clients alone.
    pub fn is_idle(&self) -> bool {
        self.flights.is_empty()
    }

    /// When the next send gives up, if any is waiting.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
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
            socket: None,
            id: 0,
            sent: now,
            deadline: now + total,
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
            let Some(addr) = self.fwd.upstream_addr(index) else {
                last = FetchError::Overloaded;
                break;
            };
            // The previous send's socket closes here, which also takes it
            // out of the epoll set.
            flight.socket = None;
            let socket = match query_socket(forward::any_port_for(addr), addr) {
                Ok(socket) => socket,
                // Out of descriptors or ports: our fault, not the
                // upstream's, and no other upstream would fare better.
                Err(e) => {
                    tracing::debug!(error = %e, "no socket for an upstream query");
                    last = FetchError::Overloaded;
                    break;
                }
            };
            let id: u16 = rand::rng().random();
            self.packet.clear();
            self.packet.extend_from_slice(&id.to_be_bytes());
            self.packet
                .extend_from_slice(flight.client.request.get(2..).unwrap_or_default());
            match socket.send(&self.packet) {
                Ok(_) => {
                    self.sends += 1;
                    let token = self.sends;
                    if let Err(e) = self
                        .epoll
                        .add(&socket, EpollEvent::new(EpollFlags::EPOLLIN, token))
                    {
                        tracing::debug!(error = %e, "cannot watch an upstream query's socket");
                        last = FetchError::Overloaded;
                        break;
                    }
                    if self.flights.is_empty() {
                        // Every timer left belongs to a send that is over.
                        self.timers.clear();
                    }
                    flight.upstream = index;
                    flight.sent = now;
                    flight.id = id;
                    flight.socket = Some(socket);
                    self.timers
                        .push(Reverse((now + per_try.min(remaining), token)));
                    self.flights.insert(token, flight);
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

    /// Reads the upstream answers waiting on the flights' sockets. An
    /// answer counts only with the ID and the question asked (the kernel has
    /// already dropped whatever did not come from the upstream asked).
    pub fn receive(&mut self, shared: &Arc<Shared>) {
        let ready = match self.epoll.wait(&mut self.events, EpollTimeout::ZERO) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "DNS upstream wait failed");
                return;
            }
        };
        for i in 0..ready {
            let token = self.events[i].data();
            self.read_flight(shared, token);
        }
    }

    fn read_flight(&mut self, shared: &Arc<Shared>, token: u64) {
        // A few datagrams per socket at most: a forger flooding one port
        // cannot keep the thread from its clients.
        for _ in 0..ANSWERS_PER_READ {
            let Some(flight) = self.flights.get(&token) else {
                return;
            };
            let Some(socket) = &flight.socket else {
                return;
            };
            let n = match socket.recv(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP unreachable, and the like: this upstream failed.
                Err(e) => {
                    if let Some(flight) = self.flights.remove(&token) {
                        let e = FetchError::Io(e);
                        self.fwd.failed(flight.upstream, &e);
                        self.send_next(shared, flight, e);
                    }
                    return;
                }
            };
            let wire = &self.buf[..n];
            let question = flight.client.request.get(12..flight.client.q.question_end);
            let expected = forward::answer_id(wire) == Some(flight.id)
                && question.is_some_and(|question| forward::same_question(wire, question));
            if !expected {
                shared
                    .metrics
                    .dropped
                    .with_label_values(&["unexpected_upstream_response"])
                    .inc();
                continue;
            }
            let wire = wire.to_vec();
            let Some(mut flight) = self.flights.remove(&token) else {
                return;
            };
            flight.socket = None;
            if shape(&wire).is_some_and(|s| s.truncated) {
                self.over_tcp(shared, flight);
                return;
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
            return;
        }
    }

    /// Moves the upstream whose send ran out of time on to the next one.
    pub fn expire(&mut self, shared: &Shared) {
        let now = Instant::now();
        while let Some(Reverse((at, token))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            // Answered, or sent again since (under a new token): over.
            if let Some(flight) = self.flights.remove(&token) {
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
