// `causeway-bench dns`: a DNS query load generator in the spirit of
// dnsperf, for causeway or any other resolver. It keeps up to
// --max-outstanding queries in flight over one or more connected UDP
// sockets, matches responses by (socket, ID) and the echoed question, and
// reports throughput, losses, latency and the rcode mix. Packets are built
// in `wire`, the query names come from `workload`; this file owns the CLI,
// the sockets and the event loop.

pub mod floor;
mod wire;
mod workload;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::task::Poll;
use std::time::Instant;

use anyhow::{bail, Context as _};
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use crate::load::{self, LoadGenerator, RunLimits};
use crate::stats::{self, round3, LatencyMs, LatencyRecorder, RateMeter};
use wire::{QueryFlags, Rcode, MAX_QUERY_LEN};
use workload::{Mix, Rng, Workload};

/// IDs in flight per socket are kept well below 2^16 so a random pick
/// finds a free one in a couple of tries.
const MAX_PER_SOCKET: u32 = 32_768;

#[derive(clap::Args, Debug, Clone)]
// The shared run limits with the DNS bench's own defaults.
#[command(
    mut_arg("max_outstanding", |a| a.default_value("200").help(
        "Queries in flight at once, over all sockets (dnsperf's -q; its default is 100)")),
    mut_arg("timeout", |a| a.default_value("2s").help(
        "A query with no response this long after it was sent is lost")),
)]
#[command(after_help = "\
Transport: UDP only (no TCP, DoT or DoH yet).

Query sources:
  --queries FILE   dnsperf format, one \"name TYPE\" per line (\"api.hc1.example.com A\"),
                   replayed in order and cycled until --duration / --count.
  (default)        a generated mix, see --mix: `local` asks the cluster names under --zone
                   (api, api-int, oauth, ignition, konnectivity and x<hex>.apps, half each);
                   `cached` cycles h0..h<N-1>.<forward-domain> (N = --cached-names), so after
                   the first round every one is a cache hit; `miss` asks a unique
                   m<16 hex>.<forward-domain> each time, never cached. The upstream of the
                   server under test should answer h<N> and a wildcard under the domain.

Examples:
  # saturate a resolver with local answers
  causeway-bench dns --server 127.0.0.11:53 --mix local=100 --duration 10s

  # cached forwarded answers (warm the cache first with a short run)
  causeway-bench dns --server 127.0.0.12:53 --mix cached=100 --count 200 --json >/dev/null
  causeway-bench dns --server 127.0.0.12:53 --mix cached=100

  # latency at a fixed 5000 queries/s from a dnsperf query file
  causeway-bench dns --server 127.0.0.1:53 --queries queries.txt --rate 5000 --json")]
pub struct DnsArgs {
    /// Server address:port to query
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:53")]
    pub server: SocketAddr,

    /// dnsperf-format query file ("name TYPE" per line), cycled; replaces
    /// the generated --mix
    #[arg(long, value_name = "FILE")]
    pub queries: Option<PathBuf>,

    /// Generated query mix when there is no --queries: weights of the
    /// local, cached and miss classes (see below)
    #[arg(
        long,
        value_name = "CLASS=WEIGHT,...",
        default_value = "local=70,cached=20,miss=10",
        conflicts_with = "queries"
    )]
    pub mix: Mix,

    /// Local zone of the server under test (the cluster's <name>.<baseDomain>)
    #[arg(long, value_name = "DOMAIN", default_value = "hc1.example.com")]
    pub zone: String,

    /// Domain the server forwards upstream, for the cached and miss classes
    #[arg(long, value_name = "DOMAIN", default_value = "example.net")]
    pub forward_domain: String,

    /// How many distinct names the cached class cycles through
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub cached_names: u32,

    #[command(flatten)]
    pub limits: RunLimits,

    /// UDP sockets (source ports) to spread the queries over, each with
    /// its own 16-bit ID space (dnsperf's -c)
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub sockets: u16,

    /// Add an EDNS0 OPT record (UDP size 1232) to every query
    #[arg(long)]
    pub edns: bool,

    /// Clear the RD (recursion desired) bit; resolvers may then refuse
    /// forwarded names
    #[arg(long)]
    pub no_rd: bool,

    /// Local address to send from (e.g. 127.0.0.5 to test a client ACL)
    #[arg(long, value_name = "IP")]
    pub bind: Option<IpAddr>,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    inflight: bool,
    /// Question hash of the query in flight in this slot.
    qhash: u64,
    /// Question hash of the last query that expired in this slot, so its
    /// response can be told apart ("late") from a stray one.
    late_hash: u64,
    sent: Instant,
    seq: u64,
}

#[derive(Debug, Default)]
struct Counters {
    /// Invariant once drained: sent == responses + lost.
    sent: u64,
    responses: u64,
    lost: u64,
    noerror: u64,
    nodata: u64,
    nxdomain: u64,
    servfail: u64,
    refused: u64,
    other_rcode: u64,
    truncated: u64,
    /// Parsed, but no query in flight on that socket with that ID and
    /// question.
    unexpected: u64,
    /// Did not parse as a DNS response.
    garbled: u64,
    /// Matched a query that had already been counted as lost.
    late: u64,
    send_errors: u64,
    recv_errors: u64,
}

struct Bench {
    args: DnsArgs,
    workload: Workload,
    flags: QueryFlags,
    sockets: Vec<UdpSocket>,
    /// Per socket, indexed by query ID.
    slots: Vec<Vec<Slot>>,
    inflight: usize,
    /// Send order == deadline order (fixed timeout), so expiry pops from
    /// the front.
    deadlines: VecDeque<(Instant, u16, u16, u64)>,
    next_socket: usize,
    poll_from: usize,
    next_seq: u64,
    rng: Rng,
    c: Counters,
    lat: LatencyRecorder,
    /// The response rate between progress lines.
    meter: RateMeter,
    /// When the last progress line was printed, with the bench's CPU
    /// seconds then, for the CPU share since.
    last_cpu: (Instant, Option<f64>),
    start: Instant,
    last_response_at: Option<Instant>,
    first_send_error: Option<String>,
    cpu_at_start: Option<f64>,
    sendbuf: [u8; MAX_QUERY_LEN],
    /// (length, question hash) of an unsent query left in `sendbuf`.
    pending: Option<(usize, u64)>,
}

pub async fn run(args: DnsArgs) -> anyhow::Result<()> {
    if args.limits.timeout.is_zero() {
        bail!("--timeout must be greater than zero");
    }
    if args.limits.max_outstanding > u32::from(args.sockets) * MAX_PER_SOCKET {
        bail!(
            "--max-outstanding {} needs more sockets: at most {MAX_PER_SOCKET} per socket \
             (16-bit IDs); add --sockets",
            args.limits.max_outstanding
        );
    }
    let flags = QueryFlags {
        rd: !args.no_rd,
        edns: args.edns,
    };
    let workload = match &args.queries {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --queries {}", path.display()))?;
            Workload::from_queries(&text, flags)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => Workload::generated(
            &args.mix,
            &args.zone,
            &args.forward_domain,
            args.cached_names,
            flags,
        )
        .map_err(|e| anyhow::anyhow!("--zone/--forward-domain: {e}"))?,
    };
    let sockets = (0..args.sockets)
        .map(|_| open_socket(args.server, args.bind))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let now = Instant::now();
    let cpu_at_start = stats::self_cpu_seconds();
    let empty = Slot {
        inflight: false,
        qhash: 0,
        late_hash: 0,
        sent: now,
        seq: 0,
    };
    let mut bench = Bench {
        slots: vec![vec![empty; 1 << 16]; sockets.len()],
        sockets,
        workload,
        flags,
        inflight: 0,
        deadlines: VecDeque::with_capacity(args.limits.max_outstanding as usize),
        next_socket: 0,
        poll_from: 0,
        next_seq: 0,
        rng: Rng::seeded(),
        c: Counters::default(),
        lat: LatencyRecorder::new(),
        meter: RateMeter::new(now),
        last_cpu: (now, cpu_at_start),
        start: now,
        last_response_at: None,
        first_send_error: None,
        cpu_at_start,
        sendbuf: [0; MAX_QUERY_LEN],
        pending: None,
        args,
    };
    bench.describe_start();
    let limits = bench.args.limits.clone();
    let stopped_at = load::drive(&mut bench, &limits, now).await?;
    bench.report(stopped_at)
}

/// A connected UDP socket: the kernel then drops datagrams from any other
/// source and send/recv skip the address handling.
fn open_socket(server: SocketAddr, bind: Option<IpAddr>) -> anyhow::Result<UdpSocket> {
    let domain = if server.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    // Best effort: bursts of responses at high rates overflow the default
    // buffer and would show up as losses that are the bench's fault.
    let _ = sock.set_recv_buffer_size(8 << 20);
    let _ = sock.set_send_buffer_size(4 << 20);
    let local = bind.unwrap_or(if server.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    sock.bind(&SocketAddr::new(local, 0).into())
        .with_context(|| format!("binding {local}"))?;
    sock.connect(&server.into())
        .with_context(|| format!("connecting to {server}"))?;
    sock.set_nonblocking(true)?;
    Ok(UdpSocket::from_std(sock.into())?)
}

impl Bench {
    fn describe_start(&self) {
        eprintln!(
            "dns bench: {} over UDP ({} socket{}), {}{}{}",
            self.args.server,
            self.sockets.len(),
            if self.sockets.len() == 1 { "" } else { "s" },
            self.args.limits.describe("queries"),
            if self.flags.edns { ", EDNS" } else { "" },
            if self.flags.rd { "" } else { ", RD clear" },
        );
        eprintln!("queries: {}", self.workload.description());
    }

    /// Index of a socket with data (or an error) to read, polling from a
    /// rotating start so one busy socket cannot starve the others.
    fn ready_socket(&self) -> impl std::future::Future<Output = usize> + '_ {
        let n = self.sockets.len();
        let from = self.poll_from;
        std::future::poll_fn(move |cx| {
            for k in 0..n {
                let i = (from + k) % n;
                if self.sockets[i].poll_recv_ready(cx).is_ready() {
                    return Poll::Ready(i);
                }
            }
            Poll::Pending
        })
    }

    /// Sends one query; false when the socket cannot take more right now
    /// (or failed), so the caller stops this round.
    fn send_one(&mut self) -> bool {
        let s = self.next_socket;
        self.next_socket = (s + 1) % self.sockets.len();
        let slots = &self.slots[s];
        let mut id = self.rng.next_u16();
        while slots[usize::from(id)].inflight {
            id = self.rng.next_u16();
        }
        // A query the socket refused last time goes first, so a query file
        // is replayed without gaps.
        let (len, qhash) = match self.pending.take() {
            Some(p) => p,
            None => self.workload.next_query(&mut self.rng, &mut self.sendbuf),
        };
        wire::set_id(&mut self.sendbuf, id);
        let sent = Instant::now();
        match self.sockets[s].try_send(&self.sendbuf[..len]) {
            Ok(_) => {}
            // Send buffer full: try again on the next tick or response.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.pending = Some((len, qhash));
                return false;
            }
            Err(e) => {
                self.pending = Some((len, qhash));
                self.c.send_errors += 1;
                if self.first_send_error.is_none() {
                    let msg = format!("send to {}: {e}", self.args.server);
                    eprintln!("warning: {msg} (counted as send errors from now on)");
                    self.first_send_error = Some(msg);
                }
                return false;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.c.sent += 1;
        self.inflight += 1;
        let slot = &mut self.slots[s][usize::from(id)];
        slot.inflight = true;
        slot.qhash = qhash;
        slot.sent = sent;
        slot.seq = seq;
        self.deadlines
            .push_back((sent + self.args.limits.timeout, s as u16, id, seq));
        true
    }

    fn report(&self, stopped_at: Instant) -> anyhow::Result<()> {
        let (elapsed, qps) = load::measured_rate(
            self.start,
            stopped_at,
            self.last_response_at,
            self.c.responses,
        );
        let lost_pct = stats::pct(self.c.lost, self.c.sent);
        let (bench_cpu_s, bench_cpu_pct) = stats::cpu_since(self.cpu_at_start, elapsed);
        let lat = LatencyMs::of(&self.lat);
        if self.args.json {
            let summary = JsonSummary {
                server: self.args.server.to_string(),
                transport: "udp",
                sockets: self.sockets.len(),
                queries: self.workload.description().to_string(),
                duration_s: round3(elapsed),
                sent: self.c.sent,
                responses: self.c.responses,
                lost: self.c.lost,
                lost_pct: round3(lost_pct),
                qps: round3(qps),
                latency_ms: lat,
                rcodes: Rcodes {
                    noerror: self.c.noerror,
                    nxdomain: self.c.nxdomain,
                    servfail: self.c.servfail,
                    refused: self.c.refused,
                    other: self.c.other_rcode,
                },
                nodata: self.c.nodata,
                truncated: self.c.truncated,
                unexpected: self.c.unexpected,
                garbled: self.c.garbled,
                late: self.c.late,
                send_errors: self.c.send_errors,
                recv_errors: self.c.recv_errors,
                target_rate: self.args.limits.rate,
                max_outstanding: self.args.limits.max_outstanding,
                bench_cpu_s: bench_cpu_s.map(round3),
                bench_cpu_pct: bench_cpu_pct.map(round3),
            };
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            let share = |n: u64| format!("{n} ({:.2}%)", stats::pct(n, self.c.responses));
            let mut rows = vec![
                ("duration", format!("{elapsed:.2} s")),
                ("sent", self.c.sent.to_string()),
                ("responses", self.c.responses.to_string()),
                ("lost", format!("{} ({lost_pct:.2}%)", self.c.lost)),
                ("queries/s", format!("{qps:.0}")),
                ("latency p50", stats::fmt_ms(lat.p50)),
                ("latency p90", stats::fmt_ms(lat.p90)),
                ("latency p99", stats::fmt_ms(lat.p99)),
                ("latency p99.9", stats::fmt_ms(lat.p999)),
                ("latency max", stats::fmt_ms(lat.max)),
                ("latency mean", stats::fmt_ms(lat.mean)),
                ("NOERROR", share(self.c.noerror)),
                ("  of which no answer", self.c.nodata.to_string()),
                ("NXDOMAIN", share(self.c.nxdomain)),
                ("SERVFAIL", share(self.c.servfail)),
                ("REFUSED", share(self.c.refused)),
                ("other rcode", share(self.c.other_rcode)),
                ("truncated (TC)", self.c.truncated.to_string()),
                ("unexpected", self.c.unexpected.to_string()),
                ("garbled", self.c.garbled.to_string()),
                ("late responses", self.c.late.to_string()),
            ];
            load::push_error_rows(&mut rows, self.c.send_errors, self.c.recv_errors);
            rows.push((
                "bench cpu",
                match (bench_cpu_s, bench_cpu_pct) {
                    (Some(s), Some(p)) => format!("{s:.2} s ({p:.0}% of one core)"),
                    _ => "-".into(),
                },
            ));
            let title = format!(
                "DNS queries against {} (UDP, {} socket{}, max {} in flight)",
                self.args.server,
                self.sockets.len(),
                if self.sockets.len() == 1 { "" } else { "s" },
                self.args.limits.max_outstanding
            );
            print!("{}", stats::render_table(&title, &rows));
        }
        if bench_cpu_pct.is_some_and(|p| p > 90.0) && self.args.limits.rate == 0 {
            eprintln!(
                "note: the bench used a whole core; the server may be faster than measured \
                 (try --sockets 2, or a second bench process)"
            );
        }
        Ok(())
    }
}

impl LoadGenerator for Bench {
    /// The index of a socket with responses queued.
    type Ready = usize;
    /// The socket's index: IDs are per socket.
    type Source = usize;
    const RECV_BUF_LEN: usize = 65_535;
    const ON_INTERRUPT: &'static str = "no new queries, waiting for those in flight";

    fn started(&self) -> u64 {
        self.c.sent
    }

    fn in_flight(&self) -> usize {
        self.inflight
    }

    fn replies_seen(&self) -> u64 {
        self.c.responses + self.c.garbled + self.c.unexpected + self.c.late
    }

    /// Sends one query (stamped when the socket takes it, not at `now`).
    async fn start_one(&mut self, _now: Instant) -> bool {
        self.send_one()
    }

    async fn readable(&self) -> usize {
        self.ready_socket().await
    }

    /// Also moves the next wait's polling start past this socket.
    fn try_recv(&mut self, &idx: &usize, buf: &mut [u8]) -> std::io::Result<(usize, usize)> {
        self.poll_from = (idx + 1) % self.sockets.len();
        self.sockets[idx].try_recv(buf).map(|n| (n, idx))
    }

    async fn on_datagram(&mut self, bytes: &[u8], sock: usize) -> anyhow::Result<()> {
        let now = Instant::now();
        let Ok(info) = wire::parse_response(bytes) else {
            self.c.garbled += 1;
            return Ok(());
        };
        let slot = &mut self.slots[sock][usize::from(info.id)];
        if !slot.inflight {
            if slot.late_hash != 0 && info.question.is_none_or(|q| q == slot.late_hash) {
                slot.late_hash = 0;
                self.c.late += 1;
            } else {
                self.c.unexpected += 1;
            }
            return Ok(());
        }
        // Without a question (some error responses) the ID has to do.
        if info.question.is_some_and(|q| q != slot.qhash) {
            if info.question == Some(slot.late_hash) {
                slot.late_hash = 0;
                self.c.late += 1;
            } else {
                self.c.unexpected += 1;
            }
            return Ok(());
        }
        slot.inflight = false;
        let latency = now.saturating_duration_since(slot.sent);
        self.inflight -= 1;
        self.c.responses += 1;
        self.lat.record(latency);
        self.last_response_at = Some(now);
        match info.rcode {
            Rcode::NoError => {
                self.c.noerror += 1;
                if info.ancount == 0 {
                    self.c.nodata += 1;
                }
            }
            Rcode::NxDomain => self.c.nxdomain += 1,
            Rcode::ServFail => self.c.servfail += 1,
            Rcode::Refused => self.c.refused += 1,
            Rcode::Other(_) => self.c.other_rcode += 1,
        }
        if info.truncated {
            self.c.truncated += 1;
        }
        Ok(())
    }

    fn recv_errors(&mut self) -> &mut u64 {
        &mut self.c.recv_errors
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, s, id, seq)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            // The ID may have been answered (and even reused) since.
            let slot = &mut self.slots[usize::from(s)][usize::from(id)];
            if slot.inflight && slot.seq == seq {
                slot.inflight = false;
                slot.late_hash = slot.qhash;
                self.inflight -= 1;
                self.c.lost += 1;
            }
        }
    }

    fn print_progress(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start).as_secs_f64();
        let qps = self.meter.tick(self.c.responses, now);
        let cpu = stats::self_cpu_seconds();
        let cpu_pct = match (cpu, self.last_cpu.1) {
            (Some(b), Some(a)) => {
                let dt = now.saturating_duration_since(self.last_cpu.0).as_secs_f64();
                format!("{:.0}%", if dt > 0.0 { (b - a) * 100.0 / dt } else { 0.0 })
            }
            _ => "-".into(),
        };
        self.last_cpu = (now, cpu);
        eprintln!(
            "[{elapsed:6.1}s] sent {:>10}  resp {:>10}  qps {:>8.0}  lost {:>7} ({:.2}%)  inflight {:>5}  p99 {}  bench cpu {cpu_pct}",
            self.c.sent,
            self.c.responses,
            qps,
            self.c.lost,
            stats::pct(self.c.lost, self.c.sent),
            self.inflight,
            stats::fmt_ms(self.lat.percentile_ms(99.0)),
        );
    }

    fn hint_no_replies(&self) {
        eprintln!(
            "hint: no responses yet. Is a DNS server listening on {}, and does \
             its access control allow our address ({})?",
            self.args.server,
            self.sockets[0]
                .local_addr()
                .map(|a| a.ip().to_string())
                .unwrap_or_default()
        );
    }
}

#[derive(Serialize)]
struct Rcodes {
    noerror: u64,
    nxdomain: u64,
    servfail: u64,
    refused: u64,
    other: u64,
}

#[derive(Serialize)]
struct JsonSummary {
    server: String,
    transport: &'static str,
    sockets: usize,
    queries: String,
    duration_s: f64,
    sent: u64,
    responses: u64,
    lost: u64,
    lost_pct: f64,
    qps: f64,
    latency_ms: LatencyMs,
    rcodes: Rcodes,
    /// NOERROR responses without answer records.
    nodata: u64,
    truncated: u64,
    unexpected: u64,
    garbled: u64,
    late: u64,
    send_errors: u64,
    recv_errors: u64,
    target_rate: u32,
    max_outstanding: u32,
    bench_cpu_s: Option<f64>,
    bench_cpu_pct: Option<f64>,
}
