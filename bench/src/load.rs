// What the DHCP and DNS load generators share: the arguments that pace and
// bound a run (flattened into each command's), and the pieces of their
// event loops: the timers, Ctrl-C, and when a stopped run is over.

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
