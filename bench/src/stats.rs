// Measurement helpers shared by every bench subcommand (DHCP now, DNS and
// proxy later): a latency histogram with percentiles, a per-interval rate
// meter, duration parsing for the CLI, and plain-text table rendering.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// Sub-buckets per power of two. 64 keeps every reported percentile within
/// ~1.6% of the true value while the whole histogram stays a few KiB, so the
/// progress line can ask for p99 every second at any sample count without
/// sorting anything.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Values up to 2^40 us (~12 days) are representable; larger ones clamp.
const MAX_BITS: u32 = 40;
const BUCKETS: usize = ((MAX_BITS - SUB_BITS + 1) as usize + 1) * SUB as usize;

/// Log-linear latency histogram in microseconds. Exact below 128 us, then
/// 64 linear buckets per octave.
#[derive(Clone)]
pub struct LatencyRecorder {
    counts: Vec<u64>,
    total: u64,
    sum_us: u128,
    min_us: u64,
    max_us: u64,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyRecorder {
    pub fn new() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            total: 0,
            sum_us: 0,
            min_us: u64::MAX,
            max_us: 0,
        }
    }

    pub fn record(&mut self, d: Duration) {
        self.record_us(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }

    pub fn record_us(&mut self, us: u64) {
        let idx = bucket_index(us).min(BUCKETS - 1);
        self.counts[idx] += 1;
        self.total += 1;
        self.sum_us += u128::from(us);
        self.min_us = self.min_us.min(us);
        self.max_us = self.max_us.max(us);
    }

    pub fn max_us(&self) -> Option<u64> {
        (self.total > 0).then_some(self.max_us)
    }

    pub fn mean_us(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum_us as f64 / self.total as f64)
    }

    /// Value at percentile `p` (0..=100), using the nearest-rank definition.
    /// Returns the midpoint of the bucket holding that rank, clamped to the
    /// observed min/max; p0 and p100 are exact.
    pub fn percentile_us(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let p = p.clamp(0.0, 100.0);
        let rank = ((p / 100.0) * self.total as f64).ceil().max(1.0) as u64;
        // The extremes are tracked exactly; no need to approximate them.
        if rank >= self.total {
            return Some(self.max_us);
        }
        if rank == 1 {
            return Some(self.min_us);
        }
        let mut seen = 0u64;
        for (idx, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bucket_bounds(idx);
                let mid = lo + (hi - lo) / 2;
                return Some(mid.clamp(self.min_us, self.max_us));
            }
        }
        Some(self.max_us)
    }

    /// Percentile in milliseconds, the unit every summary reports.
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        self.percentile_us(p).map(us_to_ms)
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            p50: self.percentile_ms(50.0),
            p90: self.percentile_ms(90.0),
            p99: self.percentile_ms(99.0),
            max: self.max_us().map(us_to_ms),
        }
    }
}

fn bucket_index(us: u64) -> usize {
    if us < 2 * SUB {
        return us as usize;
    }
    let msb = 63 - us.leading_zeros();
    let shift = msb - SUB_BITS;
    let top = us >> shift; // in [SUB, 2*SUB)
    shift as usize * SUB as usize + top as usize
}

/// Inclusive value range covered by bucket `idx`.
fn bucket_bounds(idx: usize) -> (u64, u64) {
    let idx = idx as u64;
    if idx < 2 * SUB {
        return (idx, idx);
    }
    let shift = idx / SUB - 1;
    let top = idx % SUB + SUB;
    let lo = top << shift;
    (lo, lo + (1u64 << shift) - 1)
}

fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Latency percentiles in milliseconds; `None` (JSON null) when nothing was
/// measured, so a run with zero successes cannot be mistaken for a fast one.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct LatencySummary {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

/// Turns a monotonically increasing counter into "per second over the last
/// interval" for progress lines.
pub struct RateMeter {
    last_count: u64,
    last_at: std::time::Instant,
}

impl RateMeter {
    pub fn new(now: std::time::Instant) -> Self {
        Self {
            last_count: 0,
            last_at: now,
        }
    }

    pub fn tick(&mut self, count: u64, now: std::time::Instant) -> f64 {
        let dt = now.saturating_duration_since(self.last_at).as_secs_f64();
        let delta = count.saturating_sub(self.last_count);
        self.last_count = count;
        self.last_at = now;
        if dt > 0.0 {
            delta as f64 / dt
        } else {
            0.0
        }
    }
}

/// A duration on the command line: a number of seconds, fractions too
/// ("2.5"), or what the config reads ([`causeway_config::parse_duration`]:
/// "500ms", "10s", "2m", "1h"). Used as a clap value parser by every
/// subcommand. Only the fractions are the command line's own: the config
/// refuses them, so no lease time is rounded down to nothing.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| d.as_secs() <= 1_000_000_000)
            .ok_or_else(|| format!("duration {s:?} out of range"));
    }
    causeway_config::parse_duration(s)
        .ok_or_else(|| format!("invalid duration {s:?}: expected e.g. 500ms, 10s, 2m or 30"))
}

/// Rounds to three decimals, for figures in the JSON summaries.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Latency percentiles in ms, as the benches' JSON and tables give them.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencyMs {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
}

impl LatencyMs {
    pub fn of(r: &LatencyRecorder) -> Self {
        Self {
            p50: r.percentile_ms(50.0),
            p90: r.percentile_ms(90.0),
            p99: r.percentile_ms(99.0),
            p999: r.percentile_ms(99.9),
            max: r.max_us().map(|us| us as f64 / 1000.0),
            mean: r.mean_us().map(|us| round3(us / 1000.0)),
        }
    }

    pub fn rows(&self, prefix: &str) -> Vec<(String, String)> {
        [
            ("p50", self.p50),
            ("p90", self.p90),
            ("p99", self.p99),
            ("p99.9", self.p999),
            ("max", self.max),
            ("mean", self.mean),
        ]
        .iter()
        .map(|(k, v)| (format!("{prefix} {k}"), fmt_ms(*v)))
        .collect()
    }
}

/// Formats an optional millisecond figure for human output.
pub fn fmt_ms(v: Option<f64>) -> String {
    match v {
        Some(ms) => format!("{ms:.3} ms"),
        None => "-".to_string(),
    }
}

/// `part` as a percentage of `whole`, 0 when `whole` is 0.
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Parses a byte count: "64", "1500", "16k", "128KiB", "4m", "1MiB", "1g".
/// Every suffix is binary (k = 1024), which is what socket buffers and
/// payload sizes are spoken of in. Used by the proxy bench's size flags.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: u64 = num
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 64, 16k or 1MiB"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?}: use k, m or g (binary)"
            ))
        }
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("size {s:?} out of range"))
}

/// `bytes` moved in `secs` as Gbit/s (10^9 bits, as iperf3 and NICs count),
/// 0 when no time passed.
pub fn gbit_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    }
}

/// This process's user+system CPU time in seconds, from /proc/self/stat
/// (Linux only; None elsewhere). Lets a bench say when it, rather than the
/// server under test, was the bottleneck.
pub fn self_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // USER_HZ is fixed at 100 for /proc on every architecture.
    proc_stat_ticks(&text).map(|t| t as f64 / 100.0)
}

/// This process's CPU seconds since it used `at_start` (a
/// [`self_cpu_seconds`] reading), and their share of `elapsed_s` wall
/// seconds in percent of one core.
pub fn cpu_since(at_start: Option<f64>, elapsed_s: f64) -> (Option<f64>, Option<f64>) {
    let used = match (self_cpu_seconds(), at_start) {
        (Some(now), Some(start)) => Some(now - start),
        _ => None,
    };
    let pct = used
        .filter(|_| elapsed_s > 0.0)
        .map(|c| c * 100.0 / elapsed_s);
    (used, pct)
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line, counted
/// from the last ')' because the command name may contain spaces.
fn proc_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Renders label/value rows as an aligned two-column table.
pub fn render_table(title: &str, rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    for (k, v) in rows {
        let _ = writeln!(out, "  {k:<width$}  {v}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::duration_arg as parse_duration;
    use super::*;

    #[test]
    fn proc_stat_fields() {
        let line = "1234 (causeway (x) b) R 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0";
        assert_eq!(proc_stat_ticks(line), Some(281));
        assert_eq!(proc_stat_ticks("1234 (x) R 1 2"), None);
        assert_eq!(proc_stat_ticks("garbage"), None);
        if cfg!(target_os = "linux") {
            assert!(self_cpu_seconds().is_some());
        }
    }

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        let mut prev_hi = None;
        for idx in 0..BUCKETS {
            let (lo, hi) = bucket_bounds(idx);
            assert!(lo <= hi);
            if let Some(p) = prev_hi {
                assert_eq!(lo, p + 1, "gap before bucket {idx}");
            }
            assert_eq!(bucket_index(lo), idx);
            assert_eq!(bucket_index(hi), idx);
            prev_hi = Some(hi);
        }
    }

    #[test]
    fn percentiles_are_close() {
        let mut r = LatencyRecorder::new();
        for us in 1..=100_000u64 {
            r.record_us(us);
        }
        for (p, want) in [(50.0, 50_000.0), (90.0, 90_000.0), (99.0, 99_000.0)] {
            let got = r.percentile_us(p).unwrap() as f64;
            assert!((got - want).abs() / want < 0.02, "p{p}: {got} vs {want}");
        }
        assert_eq!(r.percentile_us(100.0), Some(100_000));
        assert_eq!(r.percentile_us(0.0), Some(1));
        assert_eq!(r.max_us(), Some(100_000));
    }

    #[test]
    fn empty_and_huge() {
        let mut r = LatencyRecorder::new();
        assert_eq!(r.percentile_us(50.0), None);
        assert_eq!(r.summary().p99, None);
        r.record(Duration::from_secs(u64::MAX / 4));
        assert!(r.percentile_us(50.0).is_some());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("16k"), Ok(16 * 1024));
        assert_eq!(parse_size("128KiB"), Ok(128 * 1024));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size(" 2g "), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("1.5k").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("99999999999999999999g").is_err());
        assert!(parse_size("18446744073709551615k").is_err());
    }

    #[test]
    fn gbits() {
        assert_eq!(gbit_per_s(1_250_000_000, 1.0), 10.0);
        assert_eq!(gbit_per_s(125_000_000, 2.0), 0.5);
        assert_eq!(gbit_per_s(1, 0.0), 0.0);
    }

    #[test]
    fn cpu_ticks() {
        let line = "1234 (causeway (x) b) R 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1 0";
        assert_eq!(proc_stat_ticks(line), Some(281));
        assert_eq!(proc_stat_ticks("garbage"), None);
        if cfg!(target_os = "linux") {
            assert!(self_cpu_seconds().is_some());
        }
    }
}
