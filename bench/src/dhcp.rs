// `causeway-bench dhcp`: a DHCPv4 load generator (in the spirit of Kea's
// perfdhcp) that runs full DORA exchanges against any server and reports
// throughput, drops and latency. Message encoding lives in `wire`; this
// file owns the CLI, the socket and the event loop.

mod wire;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio::time::MissedTickBehavior;

use crate::load::{self, LoadGenerator, RunLimits};
use crate::stats::{self, round3, LatencyRecorder, LatencySummary, RateMeter};
use wire::{Mac, ReplyKind, WireConfig};

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  # causeway on a high port, relay mode from loopback
  causeway-bench dhcp --server 127.0.0.1:6767 --clients 1000 --duration 10s

  # Kea / ISC dhcpd answer the relay on giaddr:67, so bind port 67 (root)
  causeway-bench dhcp --server 127.0.0.1:67 --bind 127.0.0.2:67 --rate 1000

  # direct mode inside a network namespace (root)
  causeway-bench dhcp --interface veth0 --clients 200 --duration 30s")]
pub struct DhcpArgs {
    /// Server address:port to send to [default: 127.0.0.1:67, or
    /// 255.255.255.255:67 with --interface]
    #[arg(long, value_name = "ADDR:PORT")]
    pub server: Option<SocketAddrV4>,

    /// Local address:port for the relay socket. Kea and ISC dhcpd send
    /// relayed replies to giaddr:67, so bind port 67 (as root) unless the
    /// server answers the source port
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "127.0.0.1:0",
        conflicts_with = "interface"
    )]
    pub bind: SocketAddrV4,

    /// Relay address written into giaddr [default: the --bind IP, or the
    /// route's source address if --bind is 0.0.0.0]. With --interface, a
    /// forged giaddr: a client on the segment posing as a relay (hostile)
    #[arg(long, value_name = "IP")]
    pub giaddr: Option<Ipv4Addr>,

    /// Direct mode instead of relay mode: bind 0.0.0.0:68 on this interface
    /// (SO_BINDTODEVICE) and broadcast with the broadcast flag set. Needs
    /// root; meant for use inside a network namespace
    #[arg(long, value_name = "NAME")]
    pub interface: Option<String>,

    /// Number of simulated clients, each with its own MAC, reused
    /// round-robin with at most one exchange in flight per client
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=(1 << 24)))]
    pub clients: u32,

    /// Seed mixed into the MACs (02:SS:SS:ii:ii:ii); runs with different
    /// seeds use disjoint MACs
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub mac_seed: u16,

    #[command(flatten)]
    pub limits: RunLimits,

    /// Send Rapid Commit (option 80) and accept an ACK in reply to DISCOVER
    #[arg(long)]
    pub rapid_commit: bool,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,

    /// Append "<mac> <ip>" for every ACK, flushed immediately (lets a crash
    /// test know which leases the server acknowledged)
    #[arg(long, value_name = "FILE")]
    pub acked_file: Option<PathBuf>,

    /// Append one line per ACK, "ack <unix_ms> <mac> <ip> <lease_secs>
    /// <hostname or ->", and per RELEASE sent, "release <unix_ms> <mac>
    /// <ip>", each flushed at once: enough to tell, for every ACK, who held
    /// which address until when
    #[arg(long, value_name = "FILE")]
    pub ack_log: Option<PathBuf>,

    /// A client that holds a lease renews it (REQUEST with ciaddr, relayed
    /// as in REBINDING) instead of starting over with DISCOVER; a NAK sends
    /// it back to DISCOVER
    #[arg(long, conflicts_with_all = ["discover_only", "decline", "rapid_commit"])]
    pub renew: bool,

    /// Send option 12 with a new name on every exchange,
    /// "<PREFIX><client>-<exchange>": a fleet of hosts that rename
    /// themselves each time they renew
    #[arg(long, value_name = "PREFIX")]
    pub hostname: Option<String>,

    /// At the end, send RELEASE for every lease acquired
    #[arg(long)]
    pub release: bool,

    /// Hostile: stop at the OFFER and never REQUEST, so each exchange only
    /// holds an address for the server's offer timeout (with fresh MACs,
    /// the offer-exhaustion flood). An OFFER completes the exchange
    #[arg(long, conflicts_with_all = ["rapid_commit", "decline"])]
    pub discover_only: bool,

    /// Hostile: DECLINE every address as soon as it is ACKed (with fresh
    /// MACs, the quarantine flood)
    #[arg(long)]
    pub decline: bool,
}

#[derive(Debug, Clone)]
enum Mode {
    Relay {
        bind: SocketAddrV4,
        giaddr: Ipv4Addr,
    },
    Interface {
        name: String,
    },
}

impl Mode {
    fn name(&self) -> &'static str {
        match self {
            Mode::Relay { .. } => "relay",
            Mode::Interface { .. } => "interface",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Discovering,
    Requesting { server_id: Ipv4Addr },
}

#[derive(Debug)]
struct Exchange {
    client: u32,
    seq: u64,
    started: Instant,
    phase: Phase,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    ip: Ipv4Addr,
    server_id: Ipv4Addr,
}

/// Invariant once drained: started == acked + offered_only + naks + drops.
#[derive(Debug, Default)]
struct Counters {
    started: u64,
    acked: u64,
    naks: u64,
    drops: u64,
    offers: u64,
    garbled: u64,
    /// Parsed fine but matched nothing: unknown xid, wrong chaddr, or a
    /// message type that makes no sense for the exchange's phase.
    unexpected: u64,
    /// Replies for exchanges already counted as drops.
    late: u64,
    send_errors: u64,
    recv_errors: u64,
    released: u64,
    /// --discover-only: exchanges that ended at their OFFER.
    offered_only: u64,
    /// --decline: DECLINEs sent.
    declined: u64,
    /// --renew: exchanges that renewed a lease held (REQUEST with ciaddr).
    renewals: u64,
}

/// xorshift64*: xids only need to be unpredictable enough not to collide
/// with another run, not cryptographic, and this avoids a rand dependency.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self((t ^ (u64::from(std::process::id()) << 32)) | 1)
    }

    fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

/// Bound on remembered expired xids, used only to tell "late" from
/// "unexpected" replies.
const EXPIRED_MEMORY: usize = 65_536;

struct Bench {
    args: DhcpArgs,
    mode: Mode,
    server: SocketAddr,
    wire: WireConfig,
    socket: UdpSocket,
    /// Actual bound address (the kernel picks the port for --bind x:0).
    local: SocketAddr,
    macs: Vec<Mac>,
    leases: Vec<Option<Lease>>,
    idle: VecDeque<u32>,
    inflight: HashMap<u32, Exchange>,
    /// Start order == deadline order because the timeout is fixed, so
    /// expiry is a pop from the front instead of a scan of the map.
    deadlines: VecDeque<(Instant, u32, u64)>,
    expired: HashSet<u32>,
    expired_order: VecDeque<u32>,
    next_seq: u64,
    rng: Rng,
    c: Counters,
    lat: LatencyRecorder,
    /// The ACK rate between progress lines.
    meter: RateMeter,
    acked_file: Option<File>,
    ack_log: Option<File>,
    start: Instant,
    /// This process's CPU time when the run started, for the bench's own
    /// share: a flood that keeps the bench on a whole core measures the
    /// bench, not the server.
    cpu_at_start: Option<f64>,
    last_ack_at: Option<Instant>,
    first_send_error: Option<String>,
}

pub async fn run(args: DhcpArgs) -> anyhow::Result<()> {
    let mode = match &args.interface {
        Some(name) => Mode::Interface { name: name.clone() },
        None => {
            let giaddr = match args.giaddr {
                Some(g) => g,
                None if !args.bind.ip().is_unspecified() => *args.bind.ip(),
                None => route_source(args.server.unwrap_or(default_relay_server()))
                    .context("--bind is 0.0.0.0 and no route to the server; pass --giaddr")?,
            };
            Mode::Relay {
                bind: args.bind,
                giaddr,
            }
        }
    };
    let server = SocketAddr::V4(args.server.unwrap_or(match mode {
        Mode::Relay { .. } => default_relay_server(),
        Mode::Interface { .. } => SocketAddrV4::new(Ipv4Addr::BROADCAST, 67),
    }));
    if args.limits.timeout.is_zero() {
        bail!("--timeout must be greater than zero");
    }
    let socket = open_socket(&mode)?;
    let local = socket.local_addr()?;
    let acked_file = match &args.acked_file {
        Some(p) => Some(
            File::options()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening --acked-file {}", p.display()))?,
        ),
        None => None,
    };
    let ack_log = match &args.ack_log {
        Some(p) => Some(
            File::options()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening --ack-log {}", p.display()))?,
        ),
        None => None,
    };
    let wire = WireConfig {
        giaddr: match mode {
            Mode::Relay { giaddr, .. } => Some(giaddr),
            Mode::Interface { .. } => args.giaddr,
        },
        broadcast: matches!(mode, Mode::Interface { .. }),
        rapid_commit: args.rapid_commit,
    };
    let now = Instant::now();
    let mut bench = Bench {
        macs: (0..args.clients)
            .map(|i| wire::client_mac(i, args.mac_seed))
            .collect(),
        leases: vec![None; args.clients as usize],
        idle: (0..args.clients).collect(),
        inflight: HashMap::with_capacity(args.limits.max_outstanding as usize * 2),
        deadlines: VecDeque::with_capacity(args.limits.max_outstanding as usize),
        expired: HashSet::new(),
        expired_order: VecDeque::new(),
        next_seq: 0,
        rng: Rng::seeded(),
        c: Counters::default(),
        lat: LatencyRecorder::new(),
        meter: RateMeter::new(now),
        acked_file,
        ack_log,
        start: now,
        cpu_at_start: stats::self_cpu_seconds(),
        last_ack_at: None,
        first_send_error: None,
        args,
        mode,
        server,
        wire,
        socket,
        local,
    };
    bench.describe_start();
    let limits = bench.args.limits.clone();
    let stopped_at = load::drive(&mut bench, &limits, now).await?;
    if bench.args.release {
        bench.release_all().await;
    }
    bench.report(stopped_at)
}

/// The wall clock in milliseconds since the epoch, as --ack-log records it
/// (to be compared with the lease file's expiry times).
fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn default_relay_server() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::LOCALHOST, 67)
}

/// The source address the kernel would use towards `server`; connecting a
/// UDP socket sends nothing.
fn route_source(server: SocketAddrV4) -> Option<Ipv4Addr> {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    probe.connect(server).ok()?;
    match probe.local_addr().ok()? {
        SocketAddr::V4(a) if !a.ip().is_unspecified() => Some(*a.ip()),
        _ => None,
    }
}

fn open_socket(mode: &Mode) -> anyhow::Result<UdpSocket> {
    let sock = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // Lets us share port 67 with a local server bound to another address
    // (e.g. Kea on 127.0.0.1:67 while we relay from 127.0.0.2:67).
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    // Best effort: bursts of replies at high rates overflow the default
    // buffer and would show up as drops that are the bench's fault.
    let _ = sock.set_recv_buffer_size(8 << 20);
    let _ = sock.set_send_buffer_size(4 << 20);
    match mode {
        Mode::Relay { bind, .. } => {
            sock.bind(&SocketAddr::V4(*bind).into()).with_context(|| {
                format!(
                    "binding {bind}{}",
                    if bind.port() < 1024 {
                        " (ports below 1024 need root, and the port must not be held by \
                         a server bound to 0.0.0.0)"
                    } else {
                        ""
                    }
                )
            })?;
        }
        Mode::Interface { name } => {
            sock.bind_device(Some(name.as_bytes()))
                .with_context(|| format!("SO_BINDTODEVICE {name} (needs root)"))?;
            let any68 = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68);
            sock.bind(&SocketAddr::V4(any68).into())
                .with_context(|| format!("binding {any68} on {name}"))?;
        }
    }
    sock.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(sock.into())?)
}

impl Bench {
    fn describe_start(&self) {
        let how = match &self.mode {
            Mode::Relay { giaddr, .. } => format!("relay from {}, giaddr {giaddr}", self.local),
            Mode::Interface { name } => format!("direct on {name} from {}", self.local),
        };
        eprintln!(
            "dhcp bench: {} ({how}), {} clients, {}",
            self.server,
            self.args.clients,
            self.args.limits.describe("exchanges"),
        );
    }

    /// The name a client gives in exchange `seq`, with --hostname.
    fn hostname(&self, client: u32, seq: u64) -> Option<String> {
        self.args
            .hostname
            .as_ref()
            .map(|prefix| format!("{prefix}{client}-{seq}"))
    }

    /// One line of --ack-log, written with one write(2) so that it survives
    /// a crash right after.
    fn log_line(&mut self, line: &str) -> anyhow::Result<()> {
        if let Some(f) = &mut self.ack_log {
            f.write_all(line.as_bytes())
                .and_then(|()| f.flush())
                .context("writing --ack-log")?;
        }
        Ok(())
    }

    async fn start_exchange(&mut self, client: u32, now: Instant) {
        let mut xid = self.rng.next_u32();
        while self.inflight.contains_key(&xid) {
            xid = self.rng.next_u32();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.c.started += 1;
        let held = self.leases[client as usize].filter(|_| self.args.renew);
        self.inflight.insert(
            xid,
            Exchange {
                client,
                seq,
                started: now,
                phase: match held {
                    Some(lease) => Phase::Requesting {
                        server_id: lease.server_id,
                    },
                    None => Phase::Discovering,
                },
            },
        );
        self.deadlines
            .push_back((now + self.args.limits.timeout, xid, seq));
        let mac = self.macs[client as usize];
        let hostname = self.hostname(client, seq);
        let pkt = match held {
            Some(lease) => {
                self.c.renewals += 1;
                wire::build_renew(&mac, xid, lease.ip, hostname.as_deref(), &self.wire)
            }
            None => wire::build_discover(&mac, xid, hostname.as_deref(), &self.wire),
        }
        .map_err(anyhow::Error::from);
        if let Err(e) = self.send(pkt).await {
            self.send_failed(xid, e);
        }
    }

    async fn send(&self, pkt: anyhow::Result<Vec<u8>>) -> anyhow::Result<()> {
        let pkt = pkt.context("encoding")?;
        self.socket
            .send_to(&pkt, self.server)
            .await
            .with_context(|| format!("send to {}", self.server))?;
        Ok(())
    }

    /// A failed send ends the exchange as a drop, keeping the invariant
    /// started = acked + naks + drops; it is reported once so that a
    /// misconfiguration is visible straight away.
    fn send_failed(&mut self, xid: u32, e: anyhow::Error) {
        self.c.send_errors += 1;
        if self.first_send_error.is_none() {
            let msg = format!("{e:#}");
            eprintln!("warning: {msg} (counted as drops from now on)");
            self.first_send_error = Some(msg);
        }
        if let Some(ex) = self.inflight.remove(&xid) {
            self.c.drops += 1;
            self.idle.push_back(ex.client);
        }
    }

    async fn complete_ack(
        &mut self,
        xid: u32,
        reply: &wire::Reply,
        server_id: Ipv4Addr,
        now: Instant,
    ) -> anyhow::Result<()> {
        let ip = reply.yiaddr;
        let Some(ex) = self.inflight.remove(&xid) else {
            return Ok(());
        };
        self.c.acked += 1;
        self.lat.record(now.saturating_duration_since(ex.started));
        self.last_ack_at = Some(now);
        self.leases[ex.client as usize] = Some(Lease { ip, server_id });
        self.idle.push_back(ex.client);
        if self.args.decline {
            let mac = self.macs[ex.client as usize];
            let pkt = wire::build_decline(&mac, self.rng.next_u32(), ip, server_id, &self.wire)
                .map_err(anyhow::Error::from);
            match self.send(pkt).await {
                Ok(()) => self.c.declined += 1,
                Err(_) => self.c.send_errors += 1,
            }
        }
        if let Some(f) = &mut self.acked_file {
            let line = format!("{} {ip}\n", wire::fmt_mac(&self.macs[ex.client as usize]));
            // Unbuffered File: one write(2) per ACK, so the line survives
            // if we (or the machine under test) die right after.
            f.write_all(line.as_bytes())
                .and_then(|()| f.flush())
                .context("writing --acked-file")?;
        }
        if self.ack_log.is_some() {
            let line = format!(
                "ack {} {} {ip} {} {}\n",
                unix_ms(),
                wire::fmt_mac(&self.macs[ex.client as usize]),
                reply.lease_secs.unwrap_or(0),
                self.hostname(ex.client, ex.seq)
                    .unwrap_or_else(|| "-".to_owned()),
            );
            self.log_line(&line)?;
        }
        Ok(())
    }

    fn remember_expired(&mut self, xid: u32) {
        if self.expired.insert(xid) {
            self.expired_order.push_back(xid);
        }
        if self.expired_order.len() > EXPIRED_MEMORY {
            if let Some(old) = self.expired_order.pop_front() {
                self.expired.remove(&old);
            }
        }
    }

    /// RELEASE has no reply, so pacing is the only thing protecting the
    /// server's socket buffer (and thus whether the releases land).
    async fn release_all(&mut self) {
        let leases: Vec<(u32, Lease)> = self
            .leases
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.map(|l| (i as u32, l)))
            .collect();
        if leases.is_empty() {
            return;
        }
        let per_sec = if self.args.limits.rate > 0 {
            self.args.limits.rate.max(100)
        } else {
            10_000
        };
        eprintln!("releasing {} leases at {per_sec}/s", leases.len());
        let per_tick = (per_sec as usize).div_ceil(1000).max(1);
        let tick_every = Duration::from_secs_f64(per_tick as f64 / f64::from(per_sec));
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut no_signal = false;
        for chunk in leases.chunks(per_tick) {
            tokio::select! {
                _ = tick.tick() => {}
                res = &mut ctrl_c, if !no_signal => {
                    if res.is_ok() {
                        eprintln!("interrupted: remaining leases not released");
                        return;
                    }
                    no_signal = true;
                }
            }
            for &(client, lease) in chunk {
                let xid = self.rng.next_u32();
                let mac = self.macs[client as usize];
                let pkt = wire::build_release(&mac, xid, lease.ip, lease.server_id, &self.wire)
                    .map_err(anyhow::Error::from);
                match self.send(pkt).await {
                    Ok(()) => {
                        self.c.released += 1;
                        let line = format!(
                            "release {} {} {}\n",
                            unix_ms(),
                            wire::fmt_mac(&mac),
                            lease.ip
                        );
                        if let Err(e) = self.log_line(&line) {
                            eprintln!("warning: {e:#}");
                        }
                    }
                    Err(e) => {
                        self.c.send_errors += 1;
                        if self.first_send_error.is_none() {
                            eprintln!("warning: {e:#}");
                            self.first_send_error = Some(format!("{e:#}"));
                        }
                    }
                }
            }
        }
    }

    fn report(&self, stopped_at: Instant) -> anyhow::Result<()> {
        let (elapsed, rate) =
            load::measured_rate(self.start, stopped_at, self.last_ack_at, self.c.acked);
        let lat = self.lat.summary();
        let drop_pct = stats::pct(self.c.drops, self.c.started);
        let (bench_cpu_s, bench_cpu_pct) = stats::cpu_since(self.cpu_at_start, elapsed);
        if self.args.json {
            let summary = JsonSummary {
                server: self.server.to_string(),
                mode: self.mode.name(),
                clients: self.args.clients,
                duration_s: round3(elapsed),
                started: self.c.started,
                acked: self.c.acked,
                naks: self.c.naks,
                drops: self.c.drops,
                drop_pct: round3(drop_pct),
                rate_per_s: round3(rate),
                latency_ms: lat,
                offers: self.c.offers,
                garbled: self.c.garbled,
                unexpected: self.c.unexpected,
                late: self.c.late,
                send_errors: self.c.send_errors,
                recv_errors: self.c.recv_errors,
                released: self.c.released,
                offered_only: self.c.offered_only,
                declined: self.c.declined,
                renewals: self.c.renewals,
                target_rate: self.args.limits.rate,
                max_outstanding: self.args.limits.max_outstanding,
                rapid_commit: self.args.rapid_commit,
                bench_cpu_pct: bench_cpu_pct.map(round3),
            };
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            let mut rows = vec![
                ("duration", format!("{elapsed:.2} s")),
                ("started", self.c.started.to_string()),
                ("acked", self.c.acked.to_string()),
                ("naks", self.c.naks.to_string()),
                ("drops", format!("{} ({drop_pct:.2}%)", self.c.drops)),
                ("exchanges/s", format!("{rate:.0}")),
                ("latency p50", stats::fmt_ms(lat.p50)),
                ("latency p90", stats::fmt_ms(lat.p90)),
                ("latency p99", stats::fmt_ms(lat.p99)),
                ("latency max", stats::fmt_ms(lat.max)),
                (
                    "latency mean",
                    stats::fmt_ms(self.lat.mean_us().map(|us| us / 1000.0)),
                ),
                ("offers", self.c.offers.to_string()),
                ("garbled", self.c.garbled.to_string()),
                ("unexpected", self.c.unexpected.to_string()),
                ("late replies", self.c.late.to_string()),
            ];
            load::push_error_rows(&mut rows, self.c.send_errors, self.c.recv_errors);
            if self.args.release {
                rows.push(("released", self.c.released.to_string()));
            }
            if self.args.discover_only {
                rows.push(("ended at the offer", self.c.offered_only.to_string()));
            }
            if self.args.decline {
                rows.push(("declined", self.c.declined.to_string()));
            }
            if self.args.renew {
                rows.push(("renewals", self.c.renewals.to_string()));
            }
            rows.push((
                "bench cpu",
                match (bench_cpu_s, bench_cpu_pct) {
                    (Some(s), Some(p)) => format!("{s:.2} s ({p:.0}% of one core)"),
                    _ => "-".into(),
                },
            ));
            let title = format!(
                "DHCPv4 DORA against {} ({} mode, {} clients)",
                self.server,
                self.mode.name(),
                self.args.clients
            );
            print!("{}", stats::render_table(&title, &rows));
        }
        if bench_cpu_pct.is_some_and(|p| p > 90.0) && self.args.limits.rate == 0 {
            eprintln!("note: the bench used a whole core; the server may be faster than measured");
        }
        Ok(())
    }
}

impl LoadGenerator for Bench {
    /// One socket: readable is all there is to know.
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
        self.c.acked
            + self.c.naks
            + self.c.offers
            + self.c.garbled
            + self.c.unexpected
            + self.c.late
    }

    /// Starts an exchange for the next idle client, if any.
    async fn start_one(&mut self, now: Instant) -> bool {
        let Some(client) = self.idle.pop_front() else {
            return false;
        };
        self.start_exchange(client, now).await;
        true
    }

    async fn readable(&self) {
        // An error here comes back from the try_recv that follows, which
        // counts it.
        let _ = self.socket.readable().await;
    }

    fn try_recv(&mut self, _: &(), buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        self.socket.try_recv_from(buf)
    }

    async fn on_datagram(&mut self, bytes: &[u8], from: SocketAddr) -> anyhow::Result<()> {
        let reply = match wire::parse_reply(bytes) {
            Ok(r) => r,
            Err(_) => {
                self.c.garbled += 1;
                return Ok(());
            }
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
        let mac = self.macs[client as usize];
        if reply.chaddr() != mac {
            self.c.unexpected += 1;
            return Ok(());
        }
        let xid = reply.xid;
        match (phase, reply.kind) {
            (Phase::Discovering, ReplyKind::Offer) if self.args.discover_only => {
                self.c.offers += 1;
                if let Some(ex) = self.inflight.remove(&xid) {
                    self.c.offered_only += 1;
                    self.lat.record(now.saturating_duration_since(ex.started));
                    self.idle.push_back(ex.client);
                }
            }
            (Phase::Discovering, ReplyKind::Offer) => {
                self.c.offers += 1;
                // Servers must send option 54; falling back to the source
                // address keeps a sloppy server measurable.
                let server_id = reply.server_id.or(match from {
                    SocketAddr::V4(a) => Some(*a.ip()),
                    SocketAddr::V6(_) => None,
                });
                let (Some(server_id), false) = (server_id, reply.yiaddr.is_unspecified()) else {
                    self.c.unexpected += 1;
                    return Ok(());
                };
                if let Some(ex) = self.inflight.get_mut(&xid) {
                    ex.phase = Phase::Requesting { server_id };
                }
                let hostname = self
                    .inflight
                    .get(&xid)
                    .and_then(|ex| self.hostname(ex.client, ex.seq));
                let pkt = wire::build_request(
                    &mac,
                    xid,
                    server_id,
                    reply.yiaddr,
                    hostname.as_deref(),
                    &self.wire,
                )
                .map_err(anyhow::Error::from);
                if let Err(e) = self.send(pkt).await {
                    self.send_failed(xid, e);
                }
            }
            (Phase::Requesting { .. }, ReplyKind::Offer) => {
                // A second server's offer, or a retransmitted one.
                self.c.offers += 1;
            }
            (Phase::Discovering, ReplyKind::Ack)
                if self.args.rapid_commit && reply.rapid_commit =>
            {
                let sid = reply.server_id.unwrap_or(Ipv4Addr::UNSPECIFIED);
                self.complete_ack(xid, &reply, sid, now).await?;
            }
            (Phase::Requesting { server_id }, ReplyKind::Ack) => {
                let sid = reply.server_id.unwrap_or(server_id);
                self.complete_ack(xid, &reply, sid, now).await?;
            }
            (_, ReplyKind::Nak) => {
                if let Some(ex) = self.inflight.remove(&xid) {
                    self.c.naks += 1;
                    // The lease is gone: the client starts over.
                    self.leases[ex.client as usize] = None;
                    self.idle.push_back(ex.client);
                }
            }
            _ => self.c.unexpected += 1,
        }
        Ok(())
    }

    fn recv_errors(&mut self) -> &mut u64 {
        &mut self.c.recv_errors
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, xid, seq)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            // The xid may have completed (and even been reused) since.
            if self.inflight.get(&xid).is_some_and(|ex| ex.seq == seq) {
                if let Some(ex) = self.inflight.remove(&xid) {
                    self.c.drops += 1;
                    self.idle.push_back(ex.client);
                    self.remember_expired(xid);
                }
            }
        }
    }

    fn print_progress(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        let ack_rate = self.meter.tick(self.c.acked, now);
        eprintln!(
            "[{elapsed:6.1}s] started {:>9}  acked {:>9}  ack/s {:>8.0}  drops {:>7} ({:.2}%)  naks {:>5}  p99 {}",
            self.c.started,
            self.c.acked,
            ack_rate,
            self.c.drops,
            stats::pct(self.c.drops, self.c.started),
            self.c.naks,
            stats::fmt_ms(self.lat.percentile_ms(99.0)),
        );
    }

    fn hint_no_replies(&self) {
        let mut hint = format!(
            "no replies yet. Is a DHCP server listening on {}?",
            self.server
        );
        if let Mode::Relay { giaddr, .. } = &self.mode {
            let port = self.local.port();
            if port != 67 {
                hint.push_str(&format!(
                    " Kea and ISC dhcpd send relayed replies to giaddr:67 ({giaddr}:67), \
                     not to our port {port}; try --bind {giaddr}:67."
                ));
            }
            hint.push_str(&format!(
                " Does the server have a subnet (or relay setting) matching giaddr {giaddr}?"
            ));
        }
        eprintln!("hint: {hint}");
    }
}

#[derive(Serialize)]
struct JsonSummary {
    server: String,
    mode: &'static str,
    clients: u32,
    duration_s: f64,
    started: u64,
    acked: u64,
    naks: u64,
    drops: u64,
    drop_pct: f64,
    rate_per_s: f64,
    latency_ms: LatencySummary,
    offers: u64,
    garbled: u64,
    unexpected: u64,
    late: u64,
    send_errors: u64,
    recv_errors: u64,
    released: u64,
    offered_only: u64,
    declined: u64,
    renewals: u64,
    target_rate: u32,
    max_outstanding: u32,
    rapid_commit: bool,
    /// The bench's own CPU over the run, in percent of one core.
    bench_cpu_pct: Option<f64>,
}
