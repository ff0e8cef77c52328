// `causeway-bench proxy latency`: request/response round trips at a fixed
// rate on a few persistent connections to an echo upstream, for the
// latency a proxy adds when it is not saturated. Requests are open-loop:
// request i is due at start + i/rate whatever happened before, spread
// round-robin over --connections. A request that finds its connection
// still busy with the previous one is measured from when it was due, not
// from when it could leave, so a stall shows up in the percentiles instead
// of silently lowering the rate (coordinated omission).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::harness::{
    connect, fmt_cpu, note_if_bench_bound, parse_len, print_table, supervise, within, Clock,
    CpuSpan, Failed, Failure, Failures,
};
use crate::stats::{self, round3, LatencyMs, LatencyRecorder, RateMeter};

#[derive(clap::Args, Debug, Clone)]
pub struct LatencyArgs {
    /// Address:port to connect to: the proxy's listener, or the echo
    /// upstream itself for the baseline
    #[arg(long, value_name = "ADDR:PORT")]
    pub target: SocketAddr,

    /// Requests per second over all connections
    #[arg(long, value_name = "PER_SEC", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,

    /// Stop sending after this long
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = stats::duration_arg)]
    pub duration: Duration,

    /// Bytes per request (echoed back as the response)
    #[arg(long, value_name = "BYTES", default_value = "64", value_parser = parse_len)]
    pub payload: usize,

    /// Persistent connections the requests are spread over
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub connections: u32,

    /// A round trip (or connect) taking longer fails; the connection is
    /// then replaced
    #[arg(long, value_name = "DURATION", default_value = "1s",
          value_parser = stats::duration_arg)]
    pub timeout: Duration,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Default)]
struct Shared {
    sent: u64,
    ok: u64,
    /// Requests whose connection was still busy when they were due.
    late: u64,
    reconnects: u64,
    failures: Failures,
    lat: LatencyRecorder,
}

pub async fn run(args: LatencyArgs) -> anyhow::Result<()> {
    if args.timeout.is_zero() {
        anyhow::bail!("--timeout must be greater than zero");
    }
    if args.payload < 8 {
        anyhow::bail!("--payload must be at least 8 bytes (each carries its sequence number)");
    }
    eprintln!(
        "proxy latency: {} at {}/s over {} connection{}, {} byte requests, {:?}, timeout {:?}",
        args.target,
        args.rate,
        args.connections,
        if args.connections == 1 { "" } else { "s" },
        args.payload,
        args.duration,
        args.timeout,
    );
    let shared = Rc::new(RefCell::new(Shared::default()));
    // Connect first, so the schedule starts with every connection ready
    // and no round trip waits behind a handshake.
    let mut streams = Vec::with_capacity(args.connections as usize);
    for _ in 0..args.connections {
        match connect(args.target, args.timeout, true).await {
            Ok(s) => streams.push(Some(s)),
            Err(f) => {
                shared.borrow_mut().failures.add(f.kind, &f);
                streams.push(None);
            }
        }
    }
    let clock = Rc::new(Clock::new(args.duration));
    let cpu = CpuSpan::start();
    let mut tasks = tokio::task::JoinSet::new();
    for (k, stream) in (0..args.connections).zip(streams) {
        tasks.spawn_local(connection(
            args.clone(),
            k,
            stream,
            clock.clone(),
            shared.clone(),
        ));
    }

    let mut meter = RateMeter::new(clock.start);
    supervise(
        &mut tasks,
        &clock,
        args.duration + args.timeout * 2 + Duration::from_secs(1),
        "finishing the requests in flight",
        "requests still in flight",
        || {
            let s = shared.borrow();
            eprintln!(
                "[{:6.1}s] ok {:>9}  req/s {:>8.0}  failed {:>6}  late {:>6}  p50 {}  p99 {}",
                clock.elapsed_s(),
                s.ok,
                meter.tick(s.ok, Instant::now()),
                s.failures.total(),
                s.late,
                stats::fmt_ms(s.lat.percentile_ms(50.0)),
                stats::fmt_ms(s.lat.percentile_ms(99.0)),
            );
        },
    )
    .await?;
    let s = shared.borrow();
    report(&args, &clock, &s, cpu)
}

/// When global request `i` is due, as an offset from the start.
fn due_offset(i: u64, rate: u32) -> Duration {
    Duration::from_secs_f64(i as f64 / f64::from(rate))
}

/// Where a request's latency is measured from. `ready` is when its
/// connection was free to send it. Sleeping until `due` wakes on tokio's
/// 1 ms timer tick, and that lateness is the bench's, so it is measured
/// from the actual send; but if the connection was still busy at `due`,
/// the wait was the path's, so it counts from `due`.
fn measure_from(due: Instant, ready: Instant, sent: Instant) -> Instant {
    if ready > due {
        due
    } else {
        sent
    }
}

async fn connection(
    args: LatencyArgs,
    k: u32,
    mut stream: Option<TcpStream>,
    clock: Rc<Clock>,
    shared: Rc<RefCell<Shared>>,
) {
    let mut req = super::upstream::pattern(args.payload);
    let mut resp = vec![0u8; args.payload];
    let step = u64::from(args.connections);
    let mut i = u64::from(k);
    loop {
        let due = clock.start + due_offset(i, args.rate);
        if due >= clock.end.get() {
            break;
        }
        i += step;
        let ready = Instant::now();
        if ready < due {
            tokio::time::sleep_until(due.into()).await;
        }
        if clock.over() {
            break;
        }
        if stream.is_none() {
            match connect(args.target, args.timeout, true).await {
                Ok(s) => stream = Some(s),
                Err(f) => {
                    shared.borrow_mut().failures.add(f.kind, &f);
                    // Pause, then skip the requests that fell due
                    // meanwhile rather than hammer a dead target: they
                    // were never sent, so they count nowhere.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    while clock.start + due_offset(i, args.rate) < Instant::now() {
                        i += step;
                    }
                    continue;
                }
            }
        }
        if ready > due {
            shared.borrow_mut().late += 1;
        }
        let Some(s) = stream.as_mut() else { continue };
        req[..8].copy_from_slice(&i.to_le_bytes());
        let sent = Instant::now();
        let from = measure_from(due, ready, sent);
        shared.borrow_mut().sent += 1;
        match round_trip(s, &req, &mut resp, args.timeout).await {
            Ok(()) => {
                let done = Instant::now();
                let mut sh = shared.borrow_mut();
                sh.ok += 1;
                sh.lat.record(done.saturating_duration_since(from));
            }
            Err(f) => {
                let mut sh = shared.borrow_mut();
                sh.failures.add(f.kind, &f);
                sh.reconnects += 1;
                // The connection's state is unknown (a late echo could
                // still arrive), so it is replaced.
                stream = None;
            }
        }
    }
}

async fn round_trip(
    s: &mut TcpStream,
    req: &[u8],
    resp: &mut [u8],
    timeout: Duration,
) -> Result<(), Failed> {
    within(timeout, "round trip", async {
        s.write_all(req).await?;
        s.read_exact(resp).await?;
        Ok(())
    })
    .await?;
    if resp != req {
        return Err(Failed::new(
            Failure::Mismatch,
            "the echo differs from the request".into(),
        ));
    }
    Ok(())
}

#[derive(Serialize)]
struct JsonSummary {
    target: String,
    target_rate: u32,
    connections: u32,
    payload: usize,
    duration_s: f64,
    sent: u64,
    ok: u64,
    failed: u64,
    failures: Failures,
    late: u64,
    req_per_s: f64,
    latency_ms: LatencyMs,
    bench_cpu_s: Option<f64>,
    bench_cpu_pct: Option<f64>,
}

fn report(args: &LatencyArgs, clock: &Clock, s: &Shared, cpu: CpuSpan) -> anyhow::Result<()> {
    let elapsed = clock
        .end
        .get()
        .min(Instant::now())
        .saturating_duration_since(clock.start)
        .as_secs_f64();
    let rate = if elapsed > 0.0 {
        s.ok as f64 / elapsed
    } else {
        0.0
    };
    let lat = LatencyMs::of(&s.lat);
    let cpu = cpu.finish(clock.elapsed_s());
    if args.json {
        let j = JsonSummary {
            target: args.target.to_string(),
            target_rate: args.rate,
            connections: args.connections,
            payload: args.payload,
            duration_s: round3(elapsed),
            sent: s.sent,
            ok: s.ok,
            failed: s.failures.total(),
            failures: s.failures.clone(),
            late: s.late,
            req_per_s: round3(rate),
            latency_ms: lat,
            bench_cpu_s: cpu.0,
            bench_cpu_pct: cpu.1,
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        let mut rows = vec![
            ("duration".to_string(), format!("{elapsed:.2} s")),
            ("sent".into(), s.sent.to_string()),
            ("ok".into(), s.ok.to_string()),
            ("failed".into(), s.failures.breakdown()),
            ("late (connection busy)".into(), s.late.to_string()),
            (
                "requests/s".into(),
                format!("{rate:.0} (target {})", args.rate),
            ),
        ];
        rows.extend(lat.rows("round trip"));
        if let Some(e) = &s.failures.first_error {
            rows.push(("first error".into(), e.clone()));
        }
        rows.push(("bench cpu".into(), fmt_cpu(cpu)));
        print_table(
            &format!(
                "TCP round trips to {} ({}/s over {} connection{}, {} bytes)",
                args.target,
                args.rate,
                args.connections,
                if args.connections == 1 { "" } else { "s" },
                args.payload
            ),
            &rows,
        );
    }
    if s.sent > 0 && s.late * 100 > s.sent {
        eprintln!(
            "note: {} of {} requests found their connection still busy; for latency at this \
             rate add --connections",
            s.late, s.sent
        );
    }
    note_if_bench_bound(cpu.1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule() {
        assert_eq!(due_offset(0, 1000), Duration::ZERO);
        assert_eq!(due_offset(1, 1000), Duration::from_millis(1));
        assert_eq!(due_offset(2500, 1000), Duration::from_millis(2500));
        assert_eq!(due_offset(3, 2), Duration::from_millis(1500));
    }

    #[test]
    fn coordinated_omission() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        // Free before it was due, timer woke 0.8 ms late: from the send.
        assert_eq!(measure_from(t + ms(5), t + ms(1), t + ms(6)), t + ms(6));
        // Free exactly on time.
        assert_eq!(measure_from(t + ms(5), t + ms(5), t + ms(5)), t + ms(5));
        // Busy until after it was due: from when it was due.
        assert_eq!(measure_from(t + ms(5), t + ms(9), t + ms(9)), t + ms(5));
    }
}
