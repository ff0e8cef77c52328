// `causeway-bench proxy conn`: the short-connection rate of a TCP path.
// --concurrency workers each loop: connect, send --payload bytes, read
// them back from an echo upstream, close. Through a proxy that is an
// accept, an upstream connect, two relayed payloads and two teardowns per
// exchange, which is what API clients that do not pool connections cost it.
// Reports exchanges per second, failures by class and the latency of the
// whole exchange (connect included).

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::harness::{
    connect_from, fmt_cpu, note_if_bench_bound, parse_len, parse_sources, print_table, supervise,
    within, Clock, CpuSpan, Failed, Failure, Failures, Sources,
};
use crate::stats::{self, round3, LatencyMs, LatencyRecorder, RateMeter};

#[derive(clap::Args, Debug, Clone)]
pub struct ConnArgs {
    /// Address:port to connect to: the proxy's listener, or the echo
    /// upstream itself for the baseline
    #[arg(long, value_name = "ADDR:PORT")]
    pub target: SocketAddr,

    /// Stop starting exchanges after this long
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = stats::duration_arg)]
    pub duration: Duration,

    /// Exchanges in flight at once (one connection each)
    #[arg(long, value_name = "N", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// Bytes sent and expected back on each connection (64, 1k, ...)
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_len)]
    pub payload: usize,

    /// After the echo, wait for the server to close first (an upstream
    /// run with --close-after PAYLOAD), then close. TIME_WAIT then lands on
    /// the server side of each leg instead of on the connecting side,
    /// where on loopback it costs an ephemeral-port search per connect
    /// and, at tens of thousands of connections a second, runs the
    /// connector (client or proxy) out of ports
    #[arg(long)]
    pub expect_close: bool,

    /// Source addresses to spread connections over, round-robin: one
    /// address or a range like 127.0.1.1-127.0.1.32. On loopback a single
    /// source spends most of the bench's CPU in the kernel's ephemeral-port
    /// search past the TIME_WAIT sockets of earlier connections; each more
    /// source address adds a fresh port space
    #[arg(long, value_name = "IP|FIRST-LAST", value_parser = parse_sources)]
    pub sources: Option<Sources>,

    /// Exchanges started per second across all workers; 0 = as fast as
    /// --concurrency allows. For a steady background load (a soak test)
    /// rather than a measurement of the most a proxy can take
    #[arg(long, value_name = "PER_SEC", default_value_t = 0)]
    pub rate: u32,

    /// Bound on the connect, and separately on the exchange after it
    #[arg(long, value_name = "DURATION", default_value = "2s",
          value_parser = stats::duration_arg)]
    pub timeout: Duration,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Default)]
struct Shared {
    /// Round-robin position in --sources.
    next_source: usize,
    ok: u64,
    inflight: u64,
    failures: Failures,
    /// Connect start to the last echoed byte.
    exchange: LatencyRecorder,
    /// Connect alone: through a proxy that is the accept, not the upstream.
    connect: LatencyRecorder,
    last_done: Option<Instant>,
    /// With --rate: when the next exchange may start.
    next_start: Option<Instant>,
}

pub async fn run(args: ConnArgs) -> anyhow::Result<()> {
    if args.timeout.is_zero() {
        anyhow::bail!("--timeout must be greater than zero");
    }
    // One descriptor per worker, plus closing ones not yet reaped.
    super::harness::check_nofile(u64::from(args.concurrency) * 2 + 64);
    eprintln!(
        "proxy conn: {} with {} in flight, {} byte payload, {:?}, timeout {:?}{}{}",
        args.target,
        args.concurrency,
        args.payload,
        args.duration,
        args.timeout,
        if args.expect_close {
            ", server closes first"
        } else {
            ""
        },
        match args.sources.as_ref().map(|s| s.0.as_slice()) {
            Some([one]) => format!(", from {one}"),
            Some(v) => format!(", from {} source addresses", v.len()),
            None => String::new(),
        }
    );
    let clock = Rc::new(Clock::new(args.duration));
    let shared = Rc::new(RefCell::new(Shared::default()));
    let payload: Rc<[u8]> = super::upstream::pattern(args.payload).into();
    let cpu = CpuSpan::start();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        workers.spawn_local(worker(
            args.clone(),
            clock.clone(),
            shared.clone(),
            payload.clone(),
        ));
    }

    let mut meter = RateMeter::new(clock.start);
    // Workers finish their exchange in progress, each bounded by two
    // timeouts; past that (plus a margin) they are abandoned.
    supervise(
        &mut workers,
        &clock,
        args.duration + args.timeout * 2 + Duration::from_secs(1),
        "finishing the exchanges in flight",
        "exchanges still in flight",
        || {
            let s = shared.borrow();
            let now = Instant::now();
            eprintln!(
                "[{:6.1}s] ok {:>9}  conn/s {:>8.0}  failed {:>6}  inflight {:>5}  p99 {}",
                clock.elapsed_s(),
                s.ok,
                meter.tick(s.ok, now),
                s.failures.total(),
                s.inflight,
                stats::fmt_ms(s.exchange.percentile_ms(99.0)),
            );
            // Only on the first tick, so it prints once.
            if s.ok == 0 && s.failures.total() > 0 && clock.elapsed_s() < 1.5 {
                eprintln!(
                    "hint: nothing succeeded yet; is an echo upstream (causeway-bench proxy \
                         upstream --mode echo) behind {}?",
                    args.target
                );
            }
        },
    )
    .await?;
    let s = shared.borrow();
    report(&args, &clock, &s, cpu)
}

async fn worker(args: ConnArgs, clock: Rc<Clock>, shared: Rc<RefCell<Shared>>, payload: Rc<[u8]>) {
    let mut buf = vec![0u8; payload.len()];
    let interval = (args.rate > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(args.rate)));
    while !clock.over() {
        if let Some(interval) = interval {
            // Claim the next start slot; a worker that falls behind starts
            // at once rather than bursting to catch up.
            let at = {
                let mut s = shared.borrow_mut();
                let now = Instant::now();
                let at = s.next_start.map_or(now, |t| t.max(now));
                s.next_start = Some(at + interval);
                at
            };
            tokio::time::sleep_until(at.into()).await;
            if clock.over() {
                break;
            }
        }
        let source = {
            let mut s = shared.borrow_mut();
            s.inflight += 1;
            let src = args
                .sources
                .as_ref()
                .map(|v| v.0[s.next_source % v.0.len()]);
            s.next_source = s.next_source.wrapping_add(1);
            src
        };
        let t0 = Instant::now();
        let res = exchange(&args, source, &payload, &mut buf).await;
        let done = Instant::now();
        let failed = {
            let mut s = shared.borrow_mut();
            s.inflight -= 1;
            match res {
                Ok(connected) => {
                    s.ok += 1;
                    s.exchange.record(done - t0);
                    s.connect.record(connected - t0);
                    s.last_done = Some(done);
                    false
                }
                Err(f) => {
                    s.failures.add(f.kind, &f);
                    true
                }
            }
        };
        if failed {
            // A refused or broken target fails in microseconds; the pause
            // keeps 64 workers from spinning on it. Failures are counted,
            // never retried faster than this.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One connection's life; returns when the connect completed.
async fn exchange(
    args: &ConnArgs,
    source: Option<IpAddr>,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<Instant, Failed> {
    let mut stream = connect_from(args.target, source, args.timeout, true).await?;
    let connected = Instant::now();
    within(args.timeout, "exchange", async {
        stream.write_all(payload).await?;
        stream.read_exact(buf).await?;
        Ok(())
    })
    .await?;
    if buf != payload {
        return Err(Failed::new(
            Failure::Mismatch,
            "echoed bytes differ from those sent".into(),
        ));
    }
    if args.expect_close {
        let mut extra = [0u8; 1];
        let n = within(
            args.timeout,
            "waiting for the server to close",
            stream.read(&mut extra),
        )
        .await
        .map_err(|mut f| {
            if f.kind == Failure::Timeout {
                f.error
                    .push_str(" (is the upstream run with --close-after?)");
            }
            f
        })?;
        if n != 0 {
            return Err(Failed::new(
                Failure::Mismatch,
                "more bytes than were sent came back".into(),
            ));
        }
    }
    // Dropping the stream closes it. Without --expect-close the client
    // closes first, as an API client would, so TIME_WAIT lands on this
    // side (loopback reuses it for new connects, tcp_tw_reuse=2, after an
    // ephemeral-port search that --sources keeps short).
    Ok(connected)
}

#[derive(Serialize)]
struct JsonSummary {
    target: String,
    concurrency: u32,
    payload: usize,
    expect_close: bool,
    duration_s: f64,
    ok: u64,
    failed: u64,
    failures: Failures,
    conn_per_s: f64,
    latency_ms: LatencyMs,
    connect_ms: LatencyMs,
    bench_cpu_s: Option<f64>,
    bench_cpu_pct: Option<f64>,
}

fn report(args: &ConnArgs, clock: &Clock, s: &Shared, cpu: CpuSpan) -> anyhow::Result<()> {
    // The rate runs to the last completed exchange (or the stop, if later),
    // so the wait for stragglers does not dilute it.
    let stop = clock.end.get().min(Instant::now());
    let end = s.last_done.map_or(stop, |d| d.max(stop));
    let elapsed = end.saturating_duration_since(clock.start).as_secs_f64();
    let rate = if elapsed > 0.0 {
        s.ok as f64 / elapsed
    } else {
        0.0
    };
    let cpu = cpu.finish(clock.elapsed_s());
    let lat = LatencyMs::of(&s.exchange);
    let con = LatencyMs::of(&s.connect);
    if args.json {
        let j = JsonSummary {
            target: args.target.to_string(),
            concurrency: args.concurrency,
            payload: args.payload,
            expect_close: args.expect_close,
            duration_s: round3(elapsed),
            ok: s.ok,
            failed: s.failures.total(),
            failures: s.failures.clone(),
            conn_per_s: round3(rate),
            latency_ms: lat,
            connect_ms: con,
            bench_cpu_s: cpu.0,
            bench_cpu_pct: cpu.1,
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        let mut rows = vec![
            ("duration".to_string(), format!("{elapsed:.2} s")),
            ("exchanges ok".into(), s.ok.to_string()),
            ("failed".into(), s.failures.breakdown()),
            ("connections/s".into(), format!("{rate:.0}")),
        ];
        rows.extend(lat.rows("exchange"));
        rows.push(("connect p50".into(), stats::fmt_ms(con.p50)));
        rows.push(("connect p99".into(), stats::fmt_ms(con.p99)));
        if let Some(e) = &s.failures.first_error {
            rows.push(("first error".into(), e.clone()));
        }
        rows.push(("bench cpu".into(), fmt_cpu(cpu)));
        print_table(
            &format!(
                "TCP connections to {} ({} in flight, {} byte echo each{})",
                args.target,
                args.concurrency,
                args.payload,
                if args.expect_close {
                    ", server closes first"
                } else {
                    ""
                }
            ),
            &rows,
        );
    }
    note_if_bench_bound(cpu.1);
    Ok(())
}
