// `causeway-bench dhcp6`: a DHCPv6 load generator that runs full
// Solicit/Advertise/Request/Reply exchanges (or Solicit/Reply with
// --rapid-commit) against any server, posing as a relay: each client's
// message goes inside a Relay-Forward whose link address is in the served
// prefix, so every server (causeway, Kea) answers across a routed hop
// without a multicast-capable link. Reports throughput, losses and latency
// as `dhcp` does.

use std::collections::{HashMap, VecDeque};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Instant;

use anyhow::Context as _;
use dhcproto::v6::{DhcpOption, DhcpOptions, Message, MessageType, OptionCode, Status, IANA};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use serde::Serialize;
use tokio::net::UdpSocket;

use crate::load::{self, LoadGenerator, RunLimits};
use crate::stats::{self, round3, LatencyMs, LatencyRecorder, RateMeter};

const RELAY_FORW: u8 = 12;
const RELAY_REPL: u8 = 13;
const OPTION_RELAY_MSG: u16 = 9;

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  # causeway or kea-dhcp6 on fd00:250::1, this host as the relay on port 547 (root)
  causeway-bench dhcp6 --server '[fd00:250::1]:547' --bind '[fd00:250::2]:547' \\
      --link-address fd00:250::2 --clients 1000 --duration 10s")]
pub struct Dhcp6Args {
    /// The server's address:port
    #[arg(long, value_name = "[ADDR]:PORT")]
    pub server: SocketAddrV6,

    /// Local address:port of the relay socket; servers answer a relay on
    /// port 547, so bind it there (root)
    #[arg(long, value_name = "[ADDR]:PORT", default_value = "[::]:547")]
    pub bind: SocketAddrV6,

    /// The relay's link address: an address in the prefix served, by
    /// which the server chooses the subnet
    #[arg(long, value_name = "IP")]
    pub link_address: Ipv6Addr,

    /// Number of simulated clients, each with its own DUID-LL, reused
    /// round-robin with at most one exchange in flight per client
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=(1 << 24)))]
    pub clients: u32,

    /// Seed mixed into the clients' MACs (02:SS:ii:ii:ii:ii); runs with
    /// different seeds use disjoint DUIDs
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub mac_seed: u8,

    #[command(flatten)]
    pub limits: RunLimits,

    /// Send Rapid Commit in the Solicit and count a Reply to it as done
    #[arg(long)]
    pub rapid_commit: bool,

    /// Hostile: stop at the Advertise and never Request, so the server is
    /// asked for addresses it never leases (with many clients, a flood of
    /// fresh DUIDs). An Advertise with an address completes the exchange
    #[arg(long, conflicts_with = "rapid_commit")]
    pub solicit_only: bool,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,

    /// Append "<duid> <ip>" (the DUID in hex) for every completed exchange,
    /// flushed at once: lets a crash test know which leases the server
    /// acknowledged
    #[arg(long, value_name = "FILE")]
    pub acked_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Soliciting,
    Requesting,
}

struct Exchange {
    client: u32,
    phase: Phase,
    started: Instant,
    deadline: Instant,
}

#[derive(Debug, Default, Serialize)]
struct Counts {
    started: u64,
    /// Exchanges that ended in a Reply with an address.
    completed: u64,
    /// Distinct clients with at least one such exchange.
    clients_completed: u64,
    advertises: u64,
    /// Replies or Advertises saying NoAddrsAvail (or no address at all).
    no_address: u64,
    lost: u64,
    garbled: u64,
    unexpected: u64,
    late: u64,
    send_errors: u64,
    recv_errors: u64,
}

struct Bench {
    args: Dhcp6Args,
    socket: UdpSocket,
    inflight: HashMap<[u8; 3], Exchange>,
    expiries: VecDeque<(Instant, [u8; 3])>,
    /// Recently expired transaction ids, to tell a late reply from a stray.
    expired: std::collections::HashSet<[u8; 3]>,
    idle: VecDeque<u32>,
    /// Which clients have completed an exchange.
    served: Vec<bool>,
    next_xid: u32,
    c: Counts,
    lat: LatencyRecorder,
    meter: RateMeter,
    last_reply_at: Option<Instant>,
    acked: Option<std::fs::File>,
}

/// What a server's reply says, as far as a measurement needs.
struct Parsed {
    kind: MessageType,
    xid: [u8; 3],
    client_id: Option<Vec<u8>>,
    server_id: Option<Vec<u8>>,
    address: Option<Ipv6Addr>,
    iaid: Option<u32>,
}

impl Bench {
    fn duid(&self, client: u32) -> Vec<u8> {
        let b = client.to_be_bytes();
        vec![0, 3, 0, 1, 2, self.args.mac_seed, b[0], b[1], b[2], b[3]]
    }

    fn peer(client: u32) -> Ipv6Addr {
        Ipv6Addr::from(0xfe80_0000_0000_0000_0000_0000_0000_0000u128 | (u128::from(client) + 1))
    }

    fn relay_forward(&self, client: u32, inner: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(38 + inner.len());
        out.push(RELAY_FORW);
        out.push(0);
        out.extend_from_slice(&self.args.link_address.octets());
        out.extend_from_slice(&Self::peer(client).octets());
        out.extend_from_slice(&OPTION_RELAY_MSG.to_be_bytes());
        out.extend_from_slice(&u16::try_from(inner.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(inner);
        out
    }

    fn message(
        &self,
        kind: MessageType,
        xid: [u8; 3],
        client: u32,
        server_id: Option<&[u8]>,
        address: Option<Ipv6Addr>,
    ) -> anyhow::Result<Vec<u8>> {
        let mut m = Message::new_with_id(kind, xid);
        let o = m.opts_mut();
        o.insert(DhcpOption::ClientId(self.duid(client)));
        o.insert(DhcpOption::ElapsedTime(0));
        if let Some(id) = server_id {
            o.insert(DhcpOption::ServerId(id.to_vec()));
        }
        if kind == MessageType::Solicit && self.args.rapid_commit {
            o.insert(DhcpOption::RapidCommit);
        }
        let mut ia_opts = DhcpOptions::new();
        if let Some(addr) = address {
            ia_opts.insert(DhcpOption::IAAddr(dhcproto::v6::IAAddr {
                addr,
                preferred_life: 0,
                valid_life: 0,
                opts: DhcpOptions::new(),
            }));
        }
        o.insert(DhcpOption::IANA(IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: ia_opts,
        }));
        let mut buf = Vec::with_capacity(96);
        m.encode(&mut Encoder::new(&mut buf))
            .context("encoding a DHCPv6 message")?;
        Ok(self.relay_forward(client, &buf))
    }

    fn new_xid(&mut self) -> [u8; 3] {
        loop {
            self.next_xid = self.next_xid.wrapping_add(0x9e37_79b1) & 0x00ff_ffff;
            let b = self.next_xid.to_be_bytes();
            let xid = [b[1], b[2], b[3]];
            if !self.inflight.contains_key(&xid) {
                return xid;
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> bool {
        match self
            .socket
            .send_to(bytes, SocketAddr::V6(self.args.server))
            .await
        {
            Ok(_) => true,
            Err(e) => {
                if self.c.send_errors == 0 {
                    eprintln!("warning: send error: {e}");
                }
                self.c.send_errors += 1;
                false
            }
        }
    }

    async fn start_exchange(&mut self, client: u32, now: Instant) {
        let xid = self.new_xid();
        let Ok(bytes) = self.message(MessageType::Solicit, xid, client, None, None) else {
            self.idle.push_back(client);
            return;
        };
        self.c.started += 1;
        let deadline = now + self.args.limits.timeout;
        self.inflight.insert(
            xid,
            Exchange {
                client,
                phase: Phase::Soliciting,
                started: now,
                deadline,
            },
        );
        self.expiries.push_back((deadline, xid));
        if !self.send(&bytes).await {
            // Counted as lost when it expires; the client is reused then.
        }
    }

    fn finish(&mut self, xid: [u8; 3], now: Instant, address: Option<Ipv6Addr>) {
        if let Some(ex) = self.inflight.remove(&xid) {
            // An Advertise (with --solicit-only) leases nothing.
            let leased = address.filter(|_| !self.args.solicit_only);
            if let (Some(addr), true) = (leased, self.acked.is_some()) {
                use std::io::Write as _;
                let duid: String = self
                    .duid(ex.client)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                // Written unbuffered: a line is on its way to the file
                // before the next reply is read.
                if let Some(file) = self.acked.as_mut() {
                    let _ = writeln!(file, "{duid} {addr}");
                }
            }
            if address.is_some() {
                self.c.completed += 1;
                if let Some(seen) = self.served.get_mut(ex.client as usize) {
                    if !*seen {
                        *seen = true;
                        self.c.clients_completed += 1;
                    }
                }
                self.lat.record(now.saturating_duration_since(ex.started));
            } else {
                self.c.no_address += 1;
            }
            self.last_reply_at = Some(now);
            self.idle.push_back(ex.client);
        }
    }
}

/// Reads a Relay-Reply (or a bare reply) down to the client's message.
fn parse(bytes: &[u8]) -> Option<Parsed> {
    let mut inner = bytes;
    for _ in 0..8 {
        if inner.first() != Some(&RELAY_REPL) {
            break;
        }
        let mut rest = inner.get(34..)?;
        let mut found = None;
        while rest.len() >= 4 {
            let code = u16::from_be_bytes([rest[0], rest[1]]);
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            let value = rest.get(4..4 + len)?;
            if code == OPTION_RELAY_MSG {
                found = Some(value);
            }
            rest = &rest[4 + len..];
        }
        inner = found?;
    }
    let msg = Message::decode(&mut Decoder::new(inner)).ok()?;
    let opts = msg.opts();
    let id = |code| match opts.get(code) {
        Some(DhcpOption::ClientId(d) | DhcpOption::ServerId(d)) => Some(d.clone()),
        _ => None,
    };
    let (mut address, mut iaid) = (None, None);
    if let Some(DhcpOption::IANA(ia)) = opts.get(OptionCode::IANA) {
        iaid = Some(ia.id);
        let refused = matches!(ia.opts.get(OptionCode::StatusCode),
            Some(DhcpOption::StatusCode(s)) if s.status != Status::Success);
        if !refused {
            if let Some(DhcpOption::IAAddr(a)) = ia.opts.get(OptionCode::IAAddr) {
                address = (a.valid_life > 0).then_some(a.addr);
            }
        }
    }
    Some(Parsed {
        kind: msg.msg_type(),
        xid: msg.xid(),
        client_id: id(OptionCode::ClientId),
        server_id: id(OptionCode::ServerId),
        address,
        iaid,
    })
}

impl LoadGenerator for Bench {
    type Ready = ();
    type Source = SocketAddr;
    const RECV_BUF_LEN: usize = 4096;
    const ON_INTERRUPT: &'static str = "no new exchanges, draining in-flight ones";

    fn started(&self) -> u64 {
        self.c.started
    }

    fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    fn replies_seen(&self) -> u64 {
        self.c.completed
            + self.c.advertises
            + self.c.no_address
            + self.c.garbled
            + self.c.unexpected
            + self.c.late
    }

    async fn start_one(&mut self, now: Instant) -> bool {
        let Some(client) = self.idle.pop_front() else {
            return false;
        };
        self.start_exchange(client, now).await;
        true
    }

    async fn readable(&self) {
        let _ = self.socket.readable().await;
    }

    fn try_recv(&mut self, _: &(), buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        self.socket.try_recv_from(buf)
    }

    async fn on_datagram(&mut self, bytes: &[u8], _from: SocketAddr) -> anyhow::Result<()> {
        let Some(reply) = parse(bytes) else {
            self.c.garbled += 1;
            return Ok(());
        };
        let now = Instant::now();
        let Some(ex) = self.inflight.get(&reply.xid) else {
            if self.expired.contains(&reply.xid) {
                self.c.late += 1;
            } else {
                self.c.unexpected += 1;
            }
            return Ok(());
        };
        let (client, phase) = (ex.client, ex.phase);
        if reply.client_id.as_deref() != Some(self.duid(client).as_slice())
            || reply.iaid.is_some_and(|i| i != 1)
        {
            self.c.unexpected += 1;
            return Ok(());
        }
        match (phase, reply.kind) {
            (Phase::Soliciting, MessageType::Advertise) if self.args.solicit_only => {
                self.c.advertises += 1;
                self.finish(reply.xid, now, reply.address);
            }
            (Phase::Soliciting, MessageType::Advertise) => {
                self.c.advertises += 1;
                let (Some(addr), Some(server_id)) = (reply.address, reply.server_id) else {
                    self.finish(reply.xid, now, None);
                    return Ok(());
                };
                let bytes = self.message(
                    MessageType::Request,
                    reply.xid,
                    client,
                    Some(&server_id),
                    Some(addr),
                )?;
                if let Some(ex) = self.inflight.get_mut(&reply.xid) {
                    ex.phase = Phase::Requesting;
                }
                self.send(&bytes).await;
            }
            (Phase::Requesting, MessageType::Reply) | (Phase::Soliciting, MessageType::Reply) => {
                self.finish(reply.xid, now, reply.address);
            }
            _ => self.c.unexpected += 1,
        }
        Ok(())
    }

    fn recv_errors(&mut self) -> &mut u64 {
        &mut self.c.recv_errors
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, xid)) = self.expiries.front() {
            if deadline > now {
                break;
            }
            self.expiries.pop_front();
            // The deadline queued may be stale: only an exchange still in
            // flight with that deadline is lost.
            if self
                .inflight
                .get(&xid)
                .is_some_and(|ex| ex.deadline == deadline)
            {
                if let Some(ex) = self.inflight.remove(&xid) {
                    self.c.lost += 1;
                    if self.expired.len() > 100_000 {
                        self.expired.clear();
                    }
                    self.expired.insert(xid);
                    self.idle.push_back(ex.client);
                }
            }
        }
    }

    fn print_progress(&mut self, now: Instant) {
        let rate = self.meter.tick(self.c.completed, now);
        eprintln!(
            "exchanges/s {rate:>9.0}  completed {:>9}  lost {:>7}  in flight {:>5}",
            self.c.completed,
            self.c.lost,
            self.inflight.len()
        );
    }

    fn hint_no_replies(&self) {
        eprintln!(
            "hint: no replies yet: is the server on {} answering relayed messages for the link {} (a subnet containing it), and is {} bound to port 547?",
            self.args.server, self.args.link_address, self.args.bind
        );
    }
}

#[derive(Serialize)]
struct Summary {
    server: String,
    mode: &'static str,
    clients: u32,
    elapsed_s: f64,
    exchanges_per_s: f64,
    #[serde(flatten)]
    counts: Counts,
    latency_ms: LatencyMs,
    bench_cpu_s: Option<f64>,
}

pub async fn run(args: Dhcp6Args) -> anyhow::Result<()> {
    let socket = UdpSocket::bind(SocketAddr::V6(args.bind))
        .await
        .with_context(|| format!("binding {} (port 547 needs root)", args.bind))?;
    let now = Instant::now();
    let mut bench = Bench {
        socket,
        inflight: HashMap::new(),
        expiries: VecDeque::new(),
        expired: Default::default(),
        idle: (0..args.clients).collect(),
        served: vec![false; args.clients as usize],
        next_xid: u32::from(args.mac_seed) << 16,
        c: Counts::default(),
        lat: LatencyRecorder::new(),
        meter: RateMeter::new(now),
        last_reply_at: None,
        acked: match &args.acked_file {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?,
            ),
            None => None,
        },
        args: args.clone(),
    };
    eprintln!(
        "dhcp6 -> {} as relay {} (link {}), {} clients, {}{}",
        args.server,
        args.bind,
        args.link_address,
        args.clients,
        args.limits.describe("exchanges"),
        if args.rapid_commit {
            ", rapid commit"
        } else {
            ""
        }
    );
    let cpu_before = stats::self_cpu_seconds();
    let start = Instant::now();
    let stopped_at = load::drive(&mut bench, &args.limits, start).await?;
    let (elapsed, rate) =
        load::measured_rate(start, stopped_at, bench.last_reply_at, bench.c.completed);
    let bench_cpu_s = match (cpu_before, stats::self_cpu_seconds()) {
        (Some(a), Some(b)) => Some(round3(b - a)),
        _ => None,
    };
    let summary = Summary {
        server: args.server.to_string(),
        mode: if args.rapid_commit {
            "rapid-commit"
        } else {
            "sarr"
        },
        clients: args.clients,
        elapsed_s: round3(elapsed),
        exchanges_per_s: round3(rate),
        latency_ms: LatencyMs::of(&bench.lat),
        counts: std::mem::take(&mut bench.c),
        bench_cpu_s,
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    let c = &summary.counts;
    let mut rows: Vec<(&str, String)> = vec![
        ("server", summary.server.clone()),
        ("mode", summary.mode.to_string()),
        ("exchanges/s", format!("{:.0}", summary.exchanges_per_s)),
        ("started", c.started.to_string()),
        ("completed", c.completed.to_string()),
        ("no address", c.no_address.to_string()),
        ("lost", c.lost.to_string()),
    ];
    let lat_rows = summary.latency_ms.rows("latency ");
    for (k, v) in &lat_rows {
        rows.push((k.as_str(), v.clone()));
    }
    load::push_error_rows(&mut rows, c.send_errors, c.recv_errors);
    print!("{}", stats::render_table("DHCPv6", &rows));
    Ok(())
}
