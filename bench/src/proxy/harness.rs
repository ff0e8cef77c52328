//! What the proxy clients (and the built-in upstream) call back into:
//! connecting with a bound, from chosen sources; failure classes and their
//! counts; the run's clock and the supervisor that ends it on time or on a
//! stop signal; the open-files check; CPU and byte formatting and tables.

use std::cell::Cell;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::net::{TcpSocket, TcpStream};

use crate::stats::{self, round3};

/// Value parser for payload and buffer sizes: 1 byte to 16 MiB, which
/// keeps a typo from allocating gigabytes per connection.
pub(super) fn parse_len(s: &str) -> Result<usize, String> {
    let n = stats::parse_size(s)?;
    if !(1..=16 << 20).contains(&n) {
        return Err(format!("{s:?}: must be between 1 byte and 16MiB"));
    }
    usize::try_from(n).map_err(|_| format!("{s:?} out of range"))
}

/// Why one connection or exchange failed. Kept coarse on purpose: the
/// table should say whether the proxy refused, stalled, cut or garbled,
/// not list every errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failure {
    /// Connect refused (nothing listening, or a full accept queue with
    /// tcp_abort_on_overflow).
    Refused,
    /// Connect did not complete within --timeout.
    ConnectTimeout,
    /// Any other connect error (EMFILE, EADDRNOTAVAIL, ...).
    ConnectOther,
    /// Connected, but the exchange did not complete within --timeout.
    Timeout,
    /// Reset or broken pipe mid-exchange.
    Reset,
    /// The peer closed before the whole reply arrived.
    Closed,
    /// The reply did not match what was sent.
    Mismatch,
    /// Any other I/O error after connecting.
    Other,
}

impl Failure {
    /// Class of an error from connect().
    pub(super) fn of_connect(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionRefused => Failure::Refused,
            io::ErrorKind::TimedOut => Failure::ConnectTimeout,
            _ => Failure::ConnectOther,
        }
    }

    /// Class of an error once connected.
    pub(super) fn of_io(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => Failure::Reset,
            io::ErrorKind::UnexpectedEof => Failure::Closed,
            io::ErrorKind::TimedOut => Failure::Timeout,
            _ => Failure::Other,
        }
    }
}

/// Failure counts by class, as the table rows and the JSON object.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Failures {
    pub(super) refused: u64,
    pub(super) connect_timeout: u64,
    pub(super) connect_other: u64,
    pub(super) timeout: u64,
    pub(super) reset: u64,
    pub(super) closed: u64,
    pub(super) mismatch: u64,
    pub(super) other: u64,
    /// The first error's text, so "connect_other" can be told apart
    /// (EMFILE and EADDRNOTAVAIL have different fixes).
    pub(super) first_error: Option<String>,
}

impl Failures {
    pub(super) fn add(&mut self, f: Failure, detail: &dyn fmt::Display) {
        let slot = match f {
            Failure::Refused => &mut self.refused,
            Failure::ConnectTimeout => &mut self.connect_timeout,
            Failure::ConnectOther => &mut self.connect_other,
            Failure::Timeout => &mut self.timeout,
            Failure::Reset => &mut self.reset,
            Failure::Closed => &mut self.closed,
            Failure::Mismatch => &mut self.mismatch,
            Failure::Other => &mut self.other,
        };
        *slot += 1;
        if self.first_error.is_none() {
            let msg = detail.to_string();
            eprintln!("warning: first failure: {msg} (all failures are counted)");
            if msg.contains("Too many open files") {
                eprintln!("hint: raise the open-files limit (ulimit -n) of this shell");
            }
            self.first_error = Some(msg);
        }
    }

    pub(super) fn total(&self) -> u64 {
        self.refused
            + self.connect_timeout
            + self.connect_other
            + self.timeout
            + self.reset
            + self.closed
            + self.mismatch
            + self.other
    }

    /// Non-zero classes as "refused 3, timeout 1", or "0".
    pub(super) fn breakdown(&self) -> String {
        let parts: Vec<String> = [
            ("refused", self.refused),
            ("connect timeout", self.connect_timeout),
            ("connect error", self.connect_other),
            ("timeout", self.timeout),
            ("reset", self.reset),
            ("closed early", self.closed),
            ("mismatch", self.mismatch),
            ("other", self.other),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
        if parts.is_empty() {
            "0".into()
        } else {
            format!("{} ({})", self.total(), parts.join(", "))
        }
    }
}

/// An error with the class it counts under.
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) kind: Failure,
    pub(super) error: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

impl Failed {
    pub(super) fn io(e: &io::Error, what: &str) -> Self {
        Failed {
            kind: Failure::of_io(e),
            error: format!("{what}: {e}"),
        }
    }

    pub(super) fn new(kind: Failure, error: String) -> Self {
        Failed { kind, error }
    }
}

/// Client source addresses (a newtype, so clap takes the list as one
/// value rather than as repeated flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources(pub(super) Vec<IpAddr>);

/// Value parser for --sources: one address, or an IPv4 range
/// "127.0.1.1-127.0.1.32" (at most 4096 addresses).
pub(super) fn parse_sources(s: &str) -> Result<Sources, String> {
    let bad = |why: &str| format!("invalid --sources {s:?}: {why}");
    let Some((a, b)) = s.split_once('-') else {
        let ip: IpAddr = s.trim().parse().map_err(|_| bad("not an address"))?;
        return Ok(Sources(vec![ip]));
    };
    let a: Ipv4Addr = a.trim().parse().map_err(|_| bad("ranges are IPv4"))?;
    let b: Ipv4Addr = b.trim().parse().map_err(|_| bad("ranges are IPv4"))?;
    let (a, b) = (u32::from(a), u32::from(b));
    if b < a {
        return Err(bad("the range runs backwards"));
    }
    if b - a >= 4096 {
        return Err(bad("more than 4096 addresses"));
    }
    Ok(Sources(
        (a..=b).map(|n| IpAddr::V4(Ipv4Addr::from(n))).collect(),
    ))
}

/// Connects within `timeout`, from `source` if given (port chosen by the
/// kernel), with Nagle off when asked (small request/response exchanges
/// would otherwise wait on delayed ACKs).
pub(super) async fn connect_from(
    target: SocketAddr,
    source: Option<IpAddr>,
    timeout: Duration,
    nodelay: bool,
) -> Result<TcpStream, Failed> {
    let Some(ip) = source else {
        return connect(target, timeout, nodelay).await;
    };
    let sock = if ip.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .and_then(|s| s.bind(SocketAddr::new(ip, 0)).map(|()| s))
    .map_err(|e| Failed::new(Failure::ConnectOther, format!("binding {ip}: {e}")))?;
    finish_connect(target, timeout, nodelay, sock.connect(target)).await
}

/// Connects within `timeout`, with Nagle off when asked (small request/
/// response exchanges would otherwise wait on delayed ACKs).
pub(super) async fn connect(
    target: SocketAddr,
    timeout: Duration,
    nodelay: bool,
) -> Result<TcpStream, Failed> {
    finish_connect(target, timeout, nodelay, TcpStream::connect(target)).await
}

pub(super) async fn finish_connect(
    target: SocketAddr,
    timeout: Duration,
    nodelay: bool,
    fut: impl std::future::Future<Output = io::Result<TcpStream>>,
) -> Result<TcpStream, Failed> {
    let stream = match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(Failed {
                kind: Failure::of_connect(&e),
                error: format!("connect to {target}: {e}"),
            })
        }
        Err(_) => {
            return Err(Failed::new(
                Failure::ConnectTimeout,
                format!("connect to {target}: no answer within {timeout:?}"),
            ))
        }
    };
    if nodelay {
        let _ = stream.set_nodelay(true);
    }
    Ok(stream)
}

/// Runs `fut` under `timeout`; a timeout counts as Failure::Timeout.
pub(super) async fn within<T>(
    timeout: Duration,
    what: &str,
    fut: impl std::future::Future<Output = io::Result<T>>,
) -> Result<T, Failed> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failed::io(&e, what)),
        Err(_) => Err(Failed::new(
            Failure::Timeout,
            format!("{what}: no progress within {timeout:?}"),
        )),
    }
}

/// When a run ends: --duration after the start, or now on Ctrl-C/SIGTERM.
/// Workers check it between operations, which --timeout bounds.
pub(super) struct Clock {
    pub(super) start: Instant,
    pub(super) end: Cell<Instant>,
}

impl Clock {
    pub(super) fn new(duration: Duration) -> Self {
        let start = Instant::now();
        Self {
            start,
            end: Cell::new(start + duration),
        }
    }

    pub(super) fn over(&self) -> bool {
        Instant::now() >= self.end.get()
    }

    pub(super) fn stop_now(&self) {
        let now = Instant::now();
        if now < self.end.get() {
            self.end.set(now);
        }
    }

    pub(super) fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// A 1 s interval whose first tick is 1 s from now, for progress lines.
/// Runs a measurement's tasks to their end: a progress line each second
/// (`progress`), Ctrl-C or SIGTERM stops the clock so the tasks finish what
/// they are doing (`finishing` says what), and past `hard_end` whatever is
/// still running is abandoned with a warning (`abandoned` says what).
pub(super) async fn supervise(
    tasks: &mut tokio::task::JoinSet<()>,
    clock: &Clock,
    hard_end: Duration,
    finishing: &str,
    abandoned: &str,
    mut progress: impl FnMut(),
) -> anyhow::Result<()> {
    let mut ticks = progress_interval();
    let mut stops = causeway_runtime::signals()?;
    let mut signalled = false;
    let hard_end = tokio::time::sleep(hard_end);
    tokio::pin!(hard_end);
    loop {
        tokio::select! {
            biased;
            why = stops.recv(), if !signalled => {
                signalled = true;
                eprintln!("{}: {finishing}", crate::stop_word(why));
                clock.stop_now();
            }
            _ = &mut hard_end => {
                eprintln!("warning: {abandoned} at the hard end were abandoned");
                tasks.abort_all();
                break;
            }
            _ = ticks.tick() => progress(),
            res = tasks.join_next() => if res.is_none() { break },
        }
    }
    Ok(())
}

pub(super) fn progress_interval() -> tokio::time::Interval {
    let mut iv = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    iv
}

/// Soft open-files limit of this process from /proc/self/limits, None if
/// unknown or unlimited.
pub(super) fn nofile_limit() -> Option<u64> {
    parse_nofile_limit(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

pub(super) fn parse_nofile_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Warns up front when `needed` descriptors will not fit, which would
/// otherwise show up as a wall of "Too many open files" failures.
pub(super) fn check_nofile(needed: u64) {
    if let Some(limit) = nofile_limit() {
        if needed > limit {
            eprintln!(
                "warning: this needs about {needed} open files but the limit is {limit}; \
                 raise it with `ulimit -n {needed}` (or more) first"
            );
        }
    }
}

/// Bench CPU over a run, for the "was the bench the bottleneck" line.
pub(super) struct CpuSpan {
    pub(super) at_start: Option<f64>,
}

impl CpuSpan {
    pub(super) fn start() -> Self {
        Self {
            at_start: stats::self_cpu_seconds(),
        }
    }

    /// CPU seconds used since start, and as a percentage of `elapsed_s`.
    pub(super) fn finish(&self, elapsed_s: f64) -> (Option<f64>, Option<f64>) {
        let (used, pct) = stats::cpu_since(self.at_start, elapsed_s);
        (used.map(round3), pct.map(round3))
    }
}

pub(super) fn fmt_cpu(cpu: (Option<f64>, Option<f64>)) -> String {
    match cpu {
        (Some(s), Some(p)) => format!("{s:.2} s ({p:.0}% of one core)"),
        _ => "-".into(),
    }
}

/// The note every client prints when it used a whole core: the figures
/// are then the bench's limit, not the path's.
pub(super) fn note_if_bench_bound(cpu_pct: Option<f64>) {
    if cpu_pct.is_some_and(|p| p > 90.0) {
        eprintln!(
            "note: the bench used a whole core; the path may be faster than measured \
             (run a second bench process alongside to check)"
        );
    }
}

/// Human byte counts in powers of 1000, as rates are given.
pub(super) fn fmt_bytes(n: u64) -> String {
    let v = n as f64;
    if v >= 1e9 {
        format!("{:.2} GB", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} MB", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} kB", v / 1e3)
    } else {
        format!("{n} B")
    }
}

/// render_table takes &str labels; the proxy tables build some labels at
/// run time.
pub(super) fn print_table(title: &str, rows: &[(String, String)]) {
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print!("{}", stats::render_table(title, &rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths() {
        assert_eq!(parse_len("64"), Ok(64));
        assert_eq!(parse_len("128k"), Ok(128 * 1024));
        assert_eq!(parse_len("16MiB"), Ok(16 << 20));
        assert!(parse_len("0").is_err());
        assert!(parse_len("17m").is_err());
        assert!(parse_len("x").is_err());
    }

    #[test]
    fn sources() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            parse_sources("127.0.0.5"),
            Ok(Sources(vec![ip("127.0.0.5")]))
        );
        assert_eq!(parse_sources("::1"), Ok(Sources(vec![ip("::1")])));
        let r = parse_sources("127.0.1.254-127.0.2.1").unwrap().0;
        assert_eq!(
            r,
            ["127.0.1.254", "127.0.1.255", "127.0.2.0", "127.0.2.1"].map(ip)
        );
        assert_eq!(parse_sources("127.0.0.1-127.0.0.1").unwrap().0.len(), 1);
        assert!(parse_sources("127.0.0.9-127.0.0.1").is_err());
        assert!(parse_sources("10.0.0.0-10.1.0.0").is_err());
        assert!(parse_sources("::1-::2").is_err());
        assert!(parse_sources("nope").is_err());
    }

    #[test]
    fn failure_classes() {
        use io::ErrorKind as K;
        let e = |k| io::Error::from(k);
        assert_eq!(
            Failure::of_connect(&e(K::ConnectionRefused)),
            Failure::Refused
        );
        assert_eq!(
            Failure::of_connect(&e(K::TimedOut)),
            Failure::ConnectTimeout
        );
        assert_eq!(
            Failure::of_connect(&e(K::AddrNotAvailable)),
            Failure::ConnectOther
        );
        assert_eq!(Failure::of_io(&e(K::ConnectionReset)), Failure::Reset);
        assert_eq!(Failure::of_io(&e(K::BrokenPipe)), Failure::Reset);
        assert_eq!(Failure::of_io(&e(K::UnexpectedEof)), Failure::Closed);
        assert_eq!(Failure::of_io(&e(K::Other)), Failure::Other);
    }

    #[test]
    fn failure_counts() {
        let mut f = Failures::default();
        assert_eq!(f.breakdown(), "0");
        f.add(Failure::Refused, &"connect: refused");
        f.add(Failure::Refused, &"connect: refused");
        f.add(Failure::Mismatch, &"bad echo");
        assert_eq!(f.total(), 3);
        assert_eq!(f.breakdown(), "3 (refused 2, mismatch 1)");
        assert_eq!(f.first_error.as_deref(), Some("connect: refused"));
    }

    #[test]
    fn nofile() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            20000                20000                files     \n";
        assert_eq!(parse_nofile_limit(limits), Some(20000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_nofile_limit(unlimited), None);
        assert_eq!(parse_nofile_limit("nothing here"), None);
    }

    #[test]
    fn bytes() {
        assert_eq!(fmt_bytes(12), "12 B");
        assert_eq!(fmt_bytes(1_500), "1.5 kB");
        assert_eq!(fmt_bytes(2_340_000), "2.34 MB");
        assert_eq!(fmt_bytes(12_500_000_000), "12.50 GB");
    }
}
