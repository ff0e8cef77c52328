// What the DHCP and DNS load generators share: the arguments that pace and
// bound a run (flattened into each command's), and their event loop,
// [`drive`]: the pacing, the timers, Ctrl-C and when a stopped run is over.
// Each generator plugs in what is its own through [`LoadGenerator`].

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::time::{Interval, MissedTickBehavior};

use crate::stats;

/// How fast a run starts exchanges (a DORA, a query and its response), how
/// many it keeps in flight, and when it stops.
#[derive(clap::Args, Debug, Clone)]
pub struct RunLimits {
    /// Exchanges started per second; 0 = as fast as --max-outstanding
    /// allows
    #[arg(long, value_name = "PER_SEC", default_value_t = 0)]
    pub rate: u32,

    /// Exchanges in flight at once
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_outstanding: u32,

    /// Stop starting exchanges after this long (500ms, 10s, 2m, or seconds)
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = stats::duration_arg)]
    pub duration: Duration,

    /// Also stop after starting this many exchanges (whichever comes first)
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,

    /// An exchange with no reply this long after it started counts as lost
    #[arg(long, value_name = "DURATION", default_value = "1s",
          value_parser = stats::duration_arg)]
    pub timeout: Duration,
}

impl RunLimits {
    /// The limits for the start line: "1000/s, max 256 in flight, 10s or
    /// 500 queries, timeout 1s", with `what` naming the exchanges.
    pub fn describe(&self, what: &str) -> String {
        let rate = match self.rate {
            0 => "unpaced".to_string(),
            r => format!("{r}/s"),
        };
        format!(
            "{rate}, max {} in flight, {:?}{}, timeout {:?}",
            self.max_outstanding,
            self.duration,
            self.count
                .map(|n| format!(" or {n} {what}"))
                .unwrap_or_default(),
            self.timeout,
        )
    }

    /// Whether a run stopped at `stopped_at` is over: nothing is in flight,
    /// or everything started before the stop has expired (stop + timeout,
    /// with a margin for the sweep's granularity).
    pub fn drained(&self, stopped_at: Option<Instant>, idle: bool) -> bool {
        stopped_at.is_some_and(|stopped| {
            idle || Instant::now() >= stopped + self.timeout + Duration::from_millis(100)
        })
    }
}

/// An event loop's timers: a 1 ms pacing tick (each tick starts however
/// many exchanges are due, so high rates need no per-packet sleeps), a
/// 20 ms sweep for expiries, and a progress line each second from 1 s on.
pub struct Ticks {
    pub pace: Interval,
    pub sweep: Interval,
    pub progress: Interval,
}

impl Ticks {
    pub fn new() -> Self {
        let skipping = |mut iv: Interval| {
            iv.set_missed_tick_behavior(MissedTickBehavior::Skip);
            iv
        };
        Ticks {
            pace: skipping(tokio::time::interval(Duration::from_millis(1))),
            sweep: skipping(tokio::time::interval(Duration::from_millis(20))),
            progress: skipping(tokio::time::interval_at(
                tokio::time::Instant::now() + Duration::from_secs(1),
                Duration::from_secs(1),
            )),
        }
    }
}

/// Ctrl-C, once: [`Interrupt::once`] resolves the first time it arrives
/// and never again. If no handler can be installed it never resolves; the
/// run is bounded anyway.
pub struct Interrupt {
    ctrl_c: Pin<Box<dyn Future<Output = std::io::Result<()>>>>,
    seen: bool,
}

impl Interrupt {
    pub fn new() -> Self {
        Interrupt {
            ctrl_c: Box::pin(tokio::signal::ctrl_c()),
            seen: false,
        }
    }

    /// Cancel-safe: a select may drop it and call it again.
    pub async fn once(&mut self) {
        if !self.seen {
            let installed = (&mut self.ctrl_c).await.is_ok();
            self.seen = true;
            if installed {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

/// How many exchanges a run may start now: what --max-outstanding,
/// --count and --rate leave, the rate kept by a token bucket.
pub struct Pacer {
    start: Instant,
    tokens: f64,
    last_refill: Instant,
}

impl Pacer {
    pub fn new(start: Instant) -> Self {
        Pacer {
            start,
            tokens: 1.0,
            last_refill: start,
        }
    }

    /// `None` once the run is over (--duration passed or --count started);
    /// else how many may start now, with `started` so far and `inflight`.
    pub fn budget(
        &mut self,
        limits: &RunLimits,
        now: Instant,
        started: u64,
        inflight: usize,
    ) -> Option<usize> {
        let limit_hit = limits.count.is_some_and(|n| started >= n);
        if now.saturating_duration_since(self.start) >= limits.duration || limit_hit {
            return None;
        }
        let mut budget = (limits.max_outstanding as usize).saturating_sub(inflight);
        if let Some(n) = limits.count {
            budget = budget.min(usize::try_from(n - started).unwrap_or(usize::MAX));
        }
        if limits.rate > 0 {
            let rate = f64::from(limits.rate);
            let dt = now
                .saturating_duration_since(self.last_refill)
                .as_secs_f64();
            self.last_refill = now;
            // Cap at 20ms of credit: after a stall (server slow, outstanding
            // full) we resume at the target rate rather than bursting to
            // "catch up", which would distort latency.
            self.tokens = (self.tokens + dt * rate).min((rate * 0.02).max(1.0));
            budget = budget.min(self.tokens as usize);
        }
        Some(budget)
    }

    /// One exchange started: its token is spent (when paced).
    pub fn started(&mut self, limits: &RunLimits) {
        if limits.rate > 0 {
            self.tokens -= 1.0;
        }
    }
}

/// A load generator's side of [`drive`]: how it starts an exchange, reads
/// replies, expires what timed out and reports progress. The loop itself
/// (pacing, timers, Ctrl-C, the end) is the same for every generator.
pub trait LoadGenerator {
    /// What [`LoadGenerator::readable`] found ready to read (which
    /// socket, where there are several).
    type Ready;

    /// Where a datagram came from, as [`LoadGenerator::on_datagram`]
    /// needs it to match the reply.
    type Source;

    /// Size of the receive buffer the loop lends to the generator.
    const RECV_BUF_LEN: usize;

    /// Said after "interrupted: " when Ctrl-C stops the run.
    const ON_INTERRUPT: &'static str;

    /// Exchanges started so far.
    fn started(&self) -> u64;

    /// Exchanges in flight.
    fn in_flight(&self) -> usize;

    /// Every datagram received so far, whatever it was: none at all after
    /// the first second earns the user a hint.
    fn replies_seen(&self) -> u64;

    /// Starts one exchange at `now`; false when none can start right now
    /// (no idle client, socket full), which ends this round of starts.
    async fn start_one(&mut self, now: Instant) -> bool;

    /// Waits until replies can be read. Must be cancel-safe: the loop
    /// drops it whenever another event comes first.
    async fn readable(&self) -> Self::Ready;

    /// Reads one datagram from what `readable` found, without waiting:
    /// its length in `buf` and its source.
    fn try_recv(
        &mut self,
        ready: &Self::Ready,
        buf: &mut [u8],
    ) -> std::io::Result<(usize, Self::Source)>;

    /// Matches one datagram against the exchanges in flight.
    async fn on_datagram(&mut self, bytes: &[u8], source: Self::Source) -> anyhow::Result<()>;

    /// The count of receive errors, for [`recv_failed`].
    fn recv_errors(&mut self) -> &mut u64;

    /// Counts as lost every exchange whose deadline is at or before `now`.
    fn expire(&mut self, now: Instant);

    /// The progress line, once a second.
    fn print_progress(&mut self, now: Instant);

    /// Printed once if nothing at all has come back after the first second.
    fn hint_no_replies(&self);
}

/// Runs `generator` from `start` until `limits` stop it (or Ctrl-C) and
/// what it started has come back or expired; returns when it stopped
/// starting exchanges.
pub async fn drive<G: LoadGenerator>(
    generator: &mut G,
    limits: &RunLimits,
    start: Instant,
) -> anyhow::Result<Instant> {
    let mut buf = vec![0u8; G::RECV_BUF_LEN];
    let Ticks {
        mut pace,
        mut sweep,
        mut progress,
    } = Ticks::new();
    let mut starts = Starts {
        pacer: Pacer::new(start),
        stopped_at: None,
    };
    let mut hinted = false;
    let mut interrupt = Interrupt::new();

    starts.fill(generator, limits).await;
    loop {
        if limits.drained(starts.stopped_at, generator.in_flight() == 0) {
            break;
        }
        // Biased, rare events first: a steady stream of replies must not
        // starve the progress line or Ctrl-C. The receive branch starts
        // new exchanges itself, so pacing last loses nothing.
        tokio::select! {
            biased;
            () = interrupt.once() => {
                eprintln!("interrupted: {}", G::ON_INTERRUPT);
                starts.stop(Instant::now());
            }
            _ = progress.tick() => {
                generator.print_progress(Instant::now());
                if !hinted && generator.started() > 0 && generator.replies_seen() == 0 {
                    hinted = true;
                    generator.hint_no_replies();
                }
            }
            _ = sweep.tick() => {
                generator.expire(Instant::now());
                starts.fill(generator, limits).await;
            }
            ready = generator.readable() => {
                read_queued(generator, &ready, &mut buf).await?;
                generator.expire(Instant::now());
                starts.fill(generator, limits).await;
            }
            _ = pace.tick() => starts.fill(generator, limits).await,
        }
    }
    // Whatever is left past the hard end is lost too.
    let now = Instant::now();
    generator.expire(now + limits.timeout + Duration::from_secs(1));
    Ok(starts.stopped_at.unwrap_or(now))
}

/// Reads what is queued where `ready` points, bounded so the timers still
/// get a turn.
async fn read_queued<G: LoadGenerator>(
    generator: &mut G,
    ready: &G::Ready,
    buf: &mut [u8],
) -> anyhow::Result<()> {
    for _ in 0..1024 {
        match generator.try_recv(ready, buf) {
            Ok((n, source)) => generator.on_datagram(&buf[..n], source).await?,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => {
                recv_failed(generator.recv_errors(), &e);
                break;
            }
        }
    }
    Ok(())
}

/// Starting exchanges: the pacing, and whether the run has stopped.
struct Starts {
    pacer: Pacer,
    stopped_at: Option<Instant>,
}

impl Starts {
    fn stop(&mut self, now: Instant) {
        self.stopped_at.get_or_insert(now);
    }

    /// Starts every exchange that is due: bounded by the token bucket (with
    /// --rate), --max-outstanding, --count and what the generator can take.
    async fn fill<G: LoadGenerator>(&mut self, generator: &mut G, limits: &RunLimits) {
        if self.stopped_at.is_some() {
            return;
        }
        let now = Instant::now();
        let budget = self
            .pacer
            .budget(limits, now, generator.started(), generator.in_flight());
        let Some(budget) = budget else {
            self.stop(now);
            return;
        };
        for _ in 0..budget {
            if !generator.start_one(now).await {
                break;
            }
            self.pacer.started(limits);
        }
    }
}

/// Transient receive errors (ICMP port unreachable turns into
/// ECONNREFUSED) must not end a run; the exchanges affected simply time
/// out. Reported once, counted always in `count`.
pub fn recv_failed(count: &mut u64, e: &std::io::Error) {
    if *count == 0 {
        eprintln!("warning: recv error: {e}");
    }
    *count += 1;
}

/// Seconds a run was measured over and its rate of `completed` exchanges
/// per second. The span runs to the last reply (or the stop, if later) so
/// waiting out the final timeouts does not dilute the rate.
pub fn measured_rate(
    start: Instant,
    stopped_at: Instant,
    last_reply_at: Option<Instant>,
    completed: u64,
) -> (f64, f64) {
    let end = last_reply_at.map_or(stopped_at, |a| a.max(stopped_at));
    let elapsed = end.saturating_duration_since(start).as_secs_f64();
    let rate = if elapsed > 0.0 {
        completed as f64 / elapsed
    } else {
        0.0
    };
    (elapsed, rate)
}

/// The summary table's error rows, shown only when there were errors.
pub fn push_error_rows(rows: &mut Vec<(&str, String)>, send_errors: u64, recv_errors: u64) {
    if send_errors > 0 {
        rows.push(("send errors", send_errors.to_string()));
    }
    if recv_errors > 0 {
        rows.push(("recv errors", recv_errors.to_string()));
    }
}
