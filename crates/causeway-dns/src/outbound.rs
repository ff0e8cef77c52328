//! Forwarding from a UDP serving thread. Each thread asks upstream itself
//! and waits for the answers in the same poll as for new queries: the
//! thread that read a query reads its answer and sends the reply. Handing
//! forwarded queries to the async runtime instead woke two more threads per
//! query, and on a VM each wake-up of an idle vCPU can cost milliseconds of
//! latency.
//!
//! The cache, the coalescing of identical queries, the bound on queries in
//! flight and upstream health stay shared ([`Forwarder`]); how each query
//! goes upstream is its [`Exchange`]'s to say. What is this thread's is
//! the I/O: every transmit goes out on a socket of its own, bound to a port
//! the kernel picks at random and connected to the upstream asked (RFC 5452
//! §9.2), so a forger must guess the port as well as the 16-bit ID and the
//! kernel drops datagrams from any other address before we see them. The
//! thread waits on all of them through one epoll descriptor.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use foldhash::{HashMap, HashMapExt};

use crate::cache::{key_of, CacheKey};
use crate::exchange::{Exchange, Transmit, Transport};
use crate::forward::{
    self, Answer, Client, FetchError, Forwarder, InFlight, Join, Reserved, Waiter,
};
use crate::responder::{unix_now, Responder};

/// Upstream answers read per wake-up at most, so a flood of them cannot
/// keep the thread from its clients.
const ANSWERS_PER_READ: usize = 64;

/// A query on its way upstream.
struct Flight {
    key: CacheKey,
    client: Box<Client>,
    exchange: Exchange,
    /// The socket of the attempt waiting for a datagram, and its number.
    /// Replaced by the next attempt's, which closes it and so takes it out
    /// of the epoll set.
    socket: Option<(u32, Reserved<UdpSocket>)>,
    _slot: InFlight,
}

pub(crate) struct Outbound {
    fwd: Arc<Forwarder>,
    /// Readable when any flight's socket is.
    epoll: Epoll,
    events: Vec<EpollEvent>,
    /// By token, which is also their sockets' epoll data.
    flights: HashMap<u64, Flight>,
    /// When flights are next due to wake. An entry whose flight has since
    /// moved on, or ended, stays until its time and is then passed over.
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    tokens: u64,
    buf: Vec<u8>,
    runtime: tokio::runtime::Handle,
}

/// A socket for one transmit: bound to any address on a port the kernel
/// picks at random, connected to `upstream`.
fn query_socket(upstream: SocketAddr) -> io::Result<Reserved<UdpSocket>> {
    let reserved = forward::reserve_upstream_descriptor()?;
    let socket = UdpSocket::bind(forward::any_port_for(upstream))?;
    socket.connect(upstream)?;
    socket.set_nonblocking(true)?;
    Ok(Reserved::new(socket, reserved))
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
            tokens: 0,
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

    /// When the next flight is due to wake, if any is waiting.
    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Answers `client` from the cache, or joins it to the identical query
    /// already upstream, or asks upstream.
    pub fn forward(&mut self, responder: &Arc<Responder>, client: Client) {
        let key = key_of(&client.q);
        if let Some(wire) = self.fwd.cached(&key, unix_now()) {
            responder.deliver(
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
                return responder.deliver(&Answer::ServFail, vec![Waiter::Datagram(client)])
            }
        };
        let Some(slot) = self.fwd.in_flight() else {
            let (answer, mut waiters) =
                self.fwd
                    .settle(&key, &client.q, Err(FetchError::Overloaded), unix_now());
            waiters.push(Waiter::Datagram(client));
            responder.deliver(&answer, waiters);
            return;
        };
        let exchange = self
            .fwd
            .exchange(&client.q, &client.request, Instant::now());
        self.tokens += 1;
        let flight = Flight {
            key,
            client,
            exchange,
            socket: None,
            _slot: slot,
        };
        self.advance(responder, self.tokens, flight);
    }

    /// Does what the flight's exchange asks until it waits: sends its
    /// transmits, passes on what it says of the upstreams, and ends the
    /// flight with its outcome. A flight left waiting goes (back) into
    /// `flights` with a timer.
    fn advance(&mut self, responder: &Arc<Responder>, token: u64, mut flight: Flight) {
        loop {
            while let Some(event) = flight.exchange.poll_event() {
                self.fwd.observe(event);
            }
            if let Some(outcome) = flight.exchange.poll_outcome() {
                return finish(responder, &self.fwd, flight, outcome);
            }
            let Some(transmit) = flight.exchange.poll_transmit() else {
                break;
            };
            flight.socket = None;
            match transmit.transport {
                Transport::Tcp => return self.over_tcp(responder, flight, transmit),
                Transport::Udp => match self.send(token, transmit.to, flight.exchange.payload()) {
                    Ok(socket) => flight.socket = Some((transmit.attempt, socket)),
                    Err(e) => flight
                        .exchange
                        .handle_error(Instant::now(), transmit.attempt, e),
                },
            }
        }
        if self.flights.is_empty() {
            // Every timer left belongs to a flight that has moved on.
            self.timers.clear();
        }
        if let Some(at) = flight.exchange.poll_timeout() {
            self.timers.push(Reverse((at, token)));
        }
        self.flights.insert(token, flight);
    }

    /// Sends `payload` on a new socket, watched under `token`.
    fn send(&self, token: u64, to: SocketAddr, payload: &[u8]) -> io::Result<Reserved<UdpSocket>> {
        let socket = query_socket(to)?;
        socket.send(payload)?;
        self.epoll
            .add(&socket.socket, EpollEvent::new(EpollFlags::EPOLLIN, token))
            .map_err(io::Error::from)?;
        Ok(socket)
    }

    /// Reads the upstream answers waiting on the flights' sockets.
    pub fn receive(&mut self, responder: &Arc<Responder>) {
        let ready = match self.epoll.wait(&mut self.events, EpollTimeout::ZERO) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "DNS upstream wait failed");
                return;
            }
        };
        for i in 0..ready {
            let token = self.events[i].data();
            self.read_flight(responder, token);
        }
    }

    fn read_flight(&mut self, responder: &Arc<Responder>, token: u64) {
        // A few datagrams per socket at most: a forger flooding one port
        // cannot keep the thread from its clients.
        for _ in 0..ANSWERS_PER_READ {
            let Some(flight) = self.flights.get_mut(&token) else {
                return;
            };
            let Some((attempt, socket)) = &flight.socket else {
                return;
            };
            let attempt = *attempt;
            let got = socket.recv(&mut self.buf);
            let now = Instant::now();
            match got {
                Ok(n) => flight
                    .exchange
                    .handle_datagram(now, attempt, &self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP unreachable, and the like.
                Err(e) => flight.exchange.handle_error(now, attempt, e),
            }
            if flight.exchange.waits_on(attempt) {
                // Not the answer; what it was is counted.
                while let Some(event) = flight.exchange.poll_event() {
                    self.fwd.observe(event);
                }
                continue;
            }
            if let Some(flight) = self.flights.remove(&token) {
                self.advance(responder, token, flight);
            }
            return;
        }
    }

    /// Wakes the flights whose time has come.
    pub fn expire(&mut self, responder: &Arc<Responder>) {
        let now = Instant::now();
        while let Some(Reverse((at, token))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let due = self
                .flights
                .get(&token)
                .and_then(|f| f.exchange.poll_timeout())
                .is_some_and(|due| due <= now);
            if !due {
                continue;
            }
            if let Some(mut flight) = self.flights.remove(&token) {
                flight.exchange.handle_timeout(now);
                self.advance(responder, token, flight);
            }
        }
    }

    /// A query to be asked again over TCP goes to the runtime, with its
    /// exchange, so this thread goes on serving while the stream is open.
    fn over_tcp(&self, responder: &Arc<Responder>, mut flight: Flight, transmit: Transmit) {
        let (responder, fwd) = (responder.clone(), self.fwd.clone());
        self.runtime.spawn(async move {
            let outcome = forward::drive(&fwd, &mut flight.exchange, Some(transmit)).await;
            finish(&responder, &fwd, flight, outcome);
        });
    }

    /// Ends every query still upstream, when the thread stops: those who
    /// wait for them, on other threads too, get a stale answer or SERVFAIL
    /// rather than nothing.
    pub fn abandon(&mut self, responder: &Responder) {
        for (_, flight) in self.flights.drain() {
            finish(responder, &self.fwd, flight, Err(FetchError::Timeout));
        }
        self.timers.clear();
    }
}

/// Caches the answer (or finds a stale one) and replies to the client and
/// to everyone who joined its query.
fn finish(
    responder: &Responder,
    fwd: &Forwarder,
    flight: Flight,
    result: Result<Vec<u8>, FetchError>,
) {
    let Flight { key, client, .. } = flight;
    let (answer, mut waiters) = fwd.settle(&key, &client.q, result, unix_now());
    waiters.push(Waiter::Datagram(client));
    responder.deliver(&answer, waiters);
}
