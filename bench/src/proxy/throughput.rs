// `causeway-bench proxy throughput`: bulk transfer over N parallel TCP
// streams for a fixed time, up to a sink upstream or down from a source
// upstream, in Gbit/s in total and per stream. Up is measured at the
// sender over the send phase (as iperf3's sender line is); after it the
// client half-closes and the sink's byte count proves that everything
// arrived, which through a proxy also proves it relays the half-close.
// Down is measured at the receiver.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::harness::{
    connect, fmt_bytes, fmt_cpu, note_if_bench_bound, parse_len, print_table, supervise, within,
    Clock, CpuSpan, Failed, Failure,
};
use crate::stats::{self, round3, RateMeter};

#[derive(clap::Args, Debug, Clone)]
pub struct ThroughputArgs {
    /// Address:port to connect to: the proxy's listener, or the sink or
    /// source upstream itself for the baseline
    #[arg(long, value_name = "ADDR:PORT")]
    pub target: SocketAddr,

    /// Parallel TCP streams
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub streams: u16,

    /// How long to transfer
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = stats::duration_arg)]
    pub duration: Duration,

    /// up: write to a sink upstream; down: read from a source upstream
    #[arg(long, value_enum, default_value_t = Direction::Up)]
    pub direction: Direction,

    /// Bytes per write (up) or read buffer (down)
    #[arg(long, value_name = "BYTES", default_value = "128k", value_parser = parse_len)]
    pub buffer: usize,

    /// Bound on the connect, on any single write or read making no
    /// progress, and on the wait for the sink's count
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = stats::duration_arg)]
    pub timeout: Duration,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
}

#[derive(Default)]
struct Stream {
    bytes: Cell<u64>,
    started: Cell<Option<Instant>>,
    finished: Cell<Option<Instant>>,
    /// Up only: what the sink says it received.
    upstream_count: Cell<Option<u64>>,
    error: RefCell<Option<String>>,
}

impl Stream {
    fn active_s(&self) -> f64 {
        match (self.started.get(), self.finished.get()) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            _ => 0.0,
        }
    }
}

pub async fn run(args: ThroughputArgs) -> anyhow::Result<()> {
    if args.timeout.is_zero() {
        anyhow::bail!("--timeout must be greater than zero");
    }
    eprintln!(
        "proxy throughput: {} {} {} stream{}, {:?}, {} byte buffers, timeout {:?}",
        match args.direction {
            Direction::Up => "to",
            Direction::Down => "from",
        },
        args.target,
        args.streams,
        if args.streams == 1 { "" } else { "s" },
        args.duration,
        args.buffer,
        args.timeout,
    );
    let clock = Rc::new(Clock::new(args.duration));
    let streams: Vec<Rc<Stream>> = (0..args.streams).map(|_| Rc::default()).collect();
    let buf: Rc<[u8]> = super::upstream::pattern(args.buffer).into();
    let cpu = CpuSpan::start();
    let mut tasks = tokio::task::JoinSet::new();
    for st in &streams {
        let (a, c, s, b) = (args.clone(), clock.clone(), st.clone(), buf.clone());
        tasks.spawn_local(async move {
            let res = match a.direction {
                Direction::Up => upload(&a, &c, &s, &b).await,
                Direction::Down => download(&a, &c, &s).await,
            };
            if s.finished.get().is_none() {
                s.finished.set(Some(Instant::now()));
            }
            if let Err(f) = res {
                eprintln!("warning: stream failed: {f}");
                *s.error.borrow_mut() = Some(f.error);
            }
        });
    }

    let mut meter = RateMeter::new(clock.start);
    // Connect, the transfer, then the half-close and the count, each
    // bounded by --timeout; past this the streams are abandoned.
    supervise(
        &mut tasks,
        &clock,
        args.duration + args.timeout * 3 + Duration::from_secs(1),
        "ending the transfer",
        "streams still busy",
        || {
            let total: u64 = streams.iter().map(|s| s.bytes.get()).sum();
            let running = streams
                .iter()
                .filter(|s| s.started.get().is_some() && s.finished.get().is_none())
                .count();
            eprintln!(
                "[{:6.1}s] {:>7.2} Gbit/s  total {:>10}  streams running {}/{}",
                clock.elapsed_s(),
                meter.tick(total, Instant::now()) * 8.0 / 1e9,
                fmt_bytes(total),
                running,
                streams.len(),
            );
        },
    )
    .await?;
    report(&args, &clock, &streams, cpu)
}

async fn upload(
    args: &ThroughputArgs,
    clock: &Clock,
    st: &Stream,
    buf: &[u8],
) -> Result<(), Failed> {
    let mut stream = connect(args.target, args.timeout, false).await?;
    st.started.set(Some(Instant::now()));
    while !clock.over() {
        within(args.timeout, "write", stream.write_all(buf)).await?;
        st.bytes.set(st.bytes.get() + buf.len() as u64);
    }
    st.finished.set(Some(Instant::now()));
    within(args.timeout, "half-close", stream.shutdown()).await?;
    let count = read_count(&mut stream, args.timeout).await?;
    st.upstream_count.set(Some(count));
    Ok(())
}

/// Reads the sink's "<count>\n" reply up to EOF.
async fn read_count(stream: &mut TcpStream, timeout: Duration) -> Result<u64, Failed> {
    let mut reply = Vec::with_capacity(24);
    within(
        timeout,
        "waiting for the sink's count",
        (&mut *stream).take(64).read_to_end(&mut reply),
    )
    .await?;
    parse_count(&reply).ok_or_else(|| {
        Failed::new(
            Failure::Mismatch,
            format!(
                "the upstream's reply {:?} is not a byte count: is it in --mode sink?",
                String::from_utf8_lossy(&reply[..reply.len().min(16)])
            ),
        )
    })
}

/// The sink's reply: decimal digits and a newline.
fn parse_count(reply: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(reply).ok()?;
    let digits = text.strip_suffix('\n')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

async fn download(args: &ThroughputArgs, clock: &Clock, st: &Stream) -> Result<(), Failed> {
    let mut stream = connect(args.target, args.timeout, false).await?;
    st.started.set(Some(Instant::now()));
    let mut buf = vec![0u8; args.buffer];
    while !clock.over() {
        let n = within(args.timeout, "read", stream.read(&mut buf)).await?;
        if n == 0 {
            return Err(Failed::new(
                Failure::Closed,
                "the upstream closed the stream early: is it in --mode source?".into(),
            ));
        }
        st.bytes.set(st.bytes.get() + n as u64);
    }
    st.finished.set(Some(Instant::now()));
    // Dropping with unread data resets the connection, which is how the
    // source (and every proxy in between) learns to stop.
    Ok(())
}

#[derive(Serialize)]
struct JsonStream {
    bytes: u64,
    seconds: f64,
    gbit_s: f64,
    /// Up: bytes the sink counted (must equal `bytes`).
    upstream_count: Option<u64>,
    error: Option<String>,
}

#[derive(Serialize)]
struct JsonSummary {
    target: String,
    direction: Direction,
    streams: usize,
    buffer: usize,
    duration_s: f64,
    bytes: u64,
    gbit_s: f64,
    gbit_s_per_stream_min: Option<f64>,
    gbit_s_per_stream_max: Option<f64>,
    /// Up: streams whose count did not match, or never came.
    unconfirmed: usize,
    failed_streams: usize,
    per_stream: Vec<JsonStream>,
    bench_cpu_s: Option<f64>,
    bench_cpu_pct: Option<f64>,
}

fn report(
    args: &ThroughputArgs,
    clock: &Clock,
    streams: &[Rc<Stream>],
    cpu: CpuSpan,
) -> anyhow::Result<()> {
    let total: u64 = streams.iter().map(|s| s.bytes.get()).sum();
    // From the first connect to the last stream's end of transfer: the
    // window in which all of `total` moved.
    let first = streams.iter().filter_map(|s| s.started.get()).min();
    let last = streams.iter().filter_map(|s| s.finished.get()).max();
    let window = match (first, last) {
        (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let gbps = stats::gbit_per_s(total, window);
    let per: Vec<JsonStream> = streams
        .iter()
        .map(|s| JsonStream {
            bytes: s.bytes.get(),
            seconds: round3(s.active_s()),
            gbit_s: round3(stats::gbit_per_s(s.bytes.get(), s.active_s())),
            upstream_count: s.upstream_count.get(),
            error: s.error.borrow().clone(),
        })
        .collect();
    let ok: Vec<&JsonStream> = per.iter().filter(|s| s.error.is_none()).collect();
    let min = ok.iter().map(|s| s.gbit_s).reduce(f64::min);
    let max = ok.iter().map(|s| s.gbit_s).reduce(f64::max);
    let failed = per.len() - ok.len();
    let unconfirmed = match args.direction {
        Direction::Up => per
            .iter()
            .filter(|s| s.upstream_count != Some(s.bytes))
            .count(),
        Direction::Down => 0,
    };
    let cpu = cpu.finish(clock.elapsed_s());
    if args.json {
        let j = JsonSummary {
            target: args.target.to_string(),
            direction: args.direction,
            streams: streams.len(),
            buffer: args.buffer,
            duration_s: round3(window),
            bytes: total,
            gbit_s: round3(gbps),
            gbit_s_per_stream_min: min,
            gbit_s_per_stream_max: max,
            unconfirmed,
            failed_streams: failed,
            per_stream: per,
            bench_cpu_s: cpu.0,
            bench_cpu_pct: cpu.1,
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        let mut rows = vec![
            ("duration".to_string(), format!("{window:.2} s")),
            ("transferred".into(), fmt_bytes(total)),
            ("throughput".into(), format!("{gbps:.2} Gbit/s")),
        ];
        if streams.len() > 1 {
            rows.push((
                "per stream min / max".into(),
                match (min, max) {
                    (Some(a), Some(b)) => format!("{a:.2} / {b:.2} Gbit/s"),
                    _ => "-".into(),
                },
            ));
        }
        for (i, s) in per.iter().enumerate() {
            let mut v = format!("{:.2} Gbit/s, {}", s.gbit_s, fmt_bytes(s.bytes));
            if args.direction == Direction::Up {
                match s.upstream_count {
                    Some(c) if c == s.bytes => v.push_str(", all counted by the sink"),
                    Some(c) => v.push_str(&format!(", SINK COUNTED {c}")),
                    None => v.push_str(", no count from the sink"),
                }
            }
            if let Some(e) = &s.error {
                v.push_str(&format!(", failed: {e}"));
            }
            rows.push((format!("stream {i}"), v));
        }
        rows.push(("bench cpu".into(), fmt_cpu(cpu)));
        print_table(
            &format!(
                "TCP throughput {} {} ({} stream{})",
                match args.direction {
                    Direction::Up => "to",
                    Direction::Down => "from",
                },
                args.target,
                streams.len(),
                if streams.len() == 1 { "" } else { "s" },
            ),
            &rows,
        );
    }
    if unconfirmed > 0 {
        eprintln!(
            "warning: {unconfirmed} stream(s) sent bytes the sink did not confirm (lost data, \
             or a path that does not pass the half-close on)"
        );
    }
    note_if_bench_bound(cpu.1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_counts() {
        assert_eq!(parse_count(b"0\n"), Some(0));
        assert_eq!(parse_count(b"1234567890\n"), Some(1_234_567_890));
        assert_eq!(parse_count(b"12"), None);
        assert_eq!(parse_count(b"\n"), None);
        assert_eq!(parse_count(b"-1\n"), None);
        assert_eq!(parse_count(b"12 34\n"), None);
        assert_eq!(parse_count(b"99999999999999999999999\n"), None);
        assert_eq!(parse_count(&[0xff, b'\n']), None);
    }
}
