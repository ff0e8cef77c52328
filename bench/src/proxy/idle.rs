// `causeway-bench proxy idle`: opens --connections TCP connections, holds
// them idle for --hold, then checks how many are still open. It is the
// load half of a memory-per-connection measurement: something else (the
// compare script) reads the proxy's RSS before and while they are held,
// after the "holding N connections" line on stderr. By default each
// connection first exchanges one byte with the echo upstream, so the
// proxy has connected upstream and relayed data on it (and allocated
// whatever it allocates for that) before it counts as held.

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::harness::{
    connect, fmt_cpu, print_table, progress_interval, within, CpuSpan, Failed, Failure, Failures,
};
use crate::stats::{self, round3, RateMeter};

#[derive(clap::Args, Debug, Clone)]
pub struct IdleArgs {
    /// Address:port to connect to (the proxy's listener, in front of an
    /// echo upstream)
    #[arg(long, value_name = "ADDR:PORT")]
    pub target: SocketAddr,

    /// How many connections to open and hold
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub connections: u32,

    /// How long to hold them once open
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = stats::duration_arg)]
    pub hold: Duration,

    /// Connects (and first exchanges) in flight at once while opening
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,

    /// Bound on each connect and on each first exchange
    #[arg(long, value_name = "DURATION", default_value = "5s",
          value_parser = stats::duration_arg)]
    pub timeout: Duration,

    /// Bound on the whole opening phase; the hold starts with whatever is
    /// open by then
    #[arg(long, value_name = "DURATION", default_value = "60s",
          value_parser = stats::duration_arg)]
    pub open_within: Duration,

    /// Only connect: no first byte through the path (a proxy may then not
    /// have connected upstream yet)
    #[arg(long)]
    pub no_echo: bool,

    /// Print the final summary as one JSON object on stdout (progress stays
    /// on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Default)]
struct Shared {
    /// Connection attempts handed out so far.
    started: Cell<u32>,
    held: RefCell<Vec<TcpStream>>,
    failures: RefCell<Failures>,
}

/// What a connection looked like after the hold.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
struct Survival {
    open: u64,
    /// Orderly EOF from the far side during the hold.
    closed: u64,
    /// Reset or another error.
    reset: u64,
    /// Bytes arrived on an idle connection: open, but odd.
    unexpected_data: u64,
}

pub async fn run(args: IdleArgs) -> anyhow::Result<()> {
    if args.timeout.is_zero() {
        anyhow::bail!("--timeout must be greater than zero");
    }
    super::harness::check_nofile(u64::from(args.connections) + 64);
    eprintln!(
        "proxy idle: {} connections to {}{}, {} at a time, hold {:?}",
        args.connections,
        args.target,
        if args.no_echo {
            ""
        } else {
            " (one echoed byte each)"
        },
        args.concurrency,
        args.hold,
    );
    let start = Instant::now();
    let cpu = CpuSpan::start();
    let shared = Rc::new(Shared::default());
    let mut stops = causeway_runtime::signals()?;
    let mut interrupted: Option<&str> = None;

    // Opening: workers take attempts from a shared counter until all
    // are handed out or --open-within passes.
    let open_end = start + args.open_within;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.min(args.connections) {
        workers.spawn_local(opener(args.clone(), shared.clone(), open_end));
    }
    let mut progress = progress_interval();
    let mut meter = RateMeter::new(start);
    // Each worker's last attempt may start just before open_end.
    let open_deadline = tokio::time::sleep_until((open_end + args.timeout * 2).into());
    tokio::pin!(open_deadline);
    loop {
        tokio::select! {
            biased;
            why = stops.recv() => {
                interrupted = Some(crate::stop_word(why));
                workers.abort_all();
                break;
            }
            _ = &mut open_deadline => {
                eprintln!("warning: opening took longer than --open-within; holding what is open");
                workers.abort_all();
                break;
            }
            _ = progress.tick() => {
                let open = shared.held.borrow().len() as u64;
                eprintln!(
                    "[{:6.1}s] opening: open {:>7}  conn/s {:>7.0}  failed {:>6}",
                    start.elapsed().as_secs_f64(),
                    open,
                    meter.tick(open, Instant::now()),
                    shared.failures.borrow().total(),
                );
            }
            res = workers.join_next() => if res.is_none() { break },
        }
    }
    let opened_in = start.elapsed();
    let opened = shared.held.borrow().len() as u64;

    // Holding. The compare script waits for this exact line.
    let mut held_for = Duration::ZERO;
    if interrupted.is_none() {
        eprintln!("holding {opened} connections for {:?}", args.hold);
        let hold_start = Instant::now();
        let hold = tokio::time::sleep(args.hold);
        tokio::pin!(hold);
        loop {
            tokio::select! {
                biased;
                why = stops.recv() => {
                    interrupted = Some(crate::stop_word(why));
                    break;
                }
                _ = &mut hold => break,
                _ = progress.tick() => eprintln!(
                    "[{:6.1}s] holding {opened} connections ({:.0} s left)",
                    start.elapsed().as_secs_f64(),
                    args.hold.saturating_sub(hold_start.elapsed()).as_secs_f64(),
                ),
            }
        }
        held_for = hold_start.elapsed();
    }
    if let Some(why) = interrupted {
        eprintln!("{why}: stopping early");
    }
    let survival = survey(&shared.held.borrow());
    let failures = shared.failures.borrow().clone();
    report(
        &args,
        Outcome {
            opened,
            opened_in,
            held_for,
            survival,
            failures,
            cpu: cpu.finish(start.elapsed().as_secs_f64()),
            interrupted: interrupted.is_some(),
        },
    )
}

async fn opener(args: IdleArgs, shared: Rc<Shared>, open_end: Instant) {
    loop {
        let n = shared.started.get();
        if n >= args.connections || Instant::now() >= open_end {
            return;
        }
        shared.started.set(n + 1);
        match open_one(&args).await {
            Ok(s) => shared.held.borrow_mut().push(s),
            Err(f) => {
                shared.failures.borrow_mut().add(f.kind, &f);
                // Out of descriptors or ports will not get better by
                // retrying at full speed.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn open_one(args: &IdleArgs) -> Result<TcpStream, Failed> {
    let mut s = connect(args.target, args.timeout, true).await?;
    if !args.no_echo {
        let mut b = [0u8; 1];
        within(args.timeout, "first echo", async {
            s.write_all(b"i").await?;
            s.read_exact(&mut b).await?;
            Ok(())
        })
        .await?;
        if &b != b"i" {
            return Err(Failed::new(
                Failure::Mismatch,
                "the first byte did not come back as sent".into(),
            ));
        }
    }
    Ok(s)
}

/// Checks every held connection without blocking: nothing should have
/// arrived on it, so "would block" means open.
fn survey(held: &[TcpStream]) -> Survival {
    let mut s = Survival::default();
    let mut b = [0u8; 1];
    for c in held {
        s = tally(s, c.try_read(&mut b));
    }
    s
}

fn tally(mut s: Survival, res: io::Result<usize>) -> Survival {
    match res {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.open += 1,
        Ok(0) => s.closed += 1,
        Ok(_) => s.unexpected_data += 1,
        Err(_) => s.reset += 1,
    }
    s
}

struct Outcome {
    opened: u64,
    opened_in: Duration,
    held_for: Duration,
    survival: Survival,
    failures: Failures,
    cpu: (Option<f64>, Option<f64>),
    interrupted: bool,
}

#[derive(Serialize)]
struct JsonSummary {
    target: String,
    requested: u32,
    opened: u64,
    failed: u64,
    failures: Failures,
    open_s: f64,
    open_per_s: f64,
    held_s: f64,
    /// Still open after the hold.
    held_open: u64,
    after_hold: Survival,
    echo_first: bool,
    interrupted: bool,
    bench_cpu_s: Option<f64>,
}

fn report(args: &IdleArgs, o: Outcome) -> anyhow::Result<()> {
    let open_s = o.opened_in.as_secs_f64();
    let rate = if open_s > 0.0 {
        o.opened as f64 / open_s
    } else {
        0.0
    };
    if args.json {
        let j = JsonSummary {
            target: args.target.to_string(),
            requested: args.connections,
            opened: o.opened,
            failed: o.failures.total(),
            failures: o.failures,
            open_s: round3(open_s),
            open_per_s: round3(rate),
            held_s: round3(o.held_for.as_secs_f64()),
            held_open: o.survival.open,
            after_hold: o.survival,
            echo_first: !args.no_echo,
            interrupted: o.interrupted,
            bench_cpu_s: o.cpu.0,
        };
        println!("{}", serde_json::to_string(&j)?);
    } else {
        let mut rows = vec![
            ("requested".to_string(), args.connections.to_string()),
            ("opened".into(), o.opened.to_string()),
            ("failed".into(), o.failures.breakdown()),
            (
                "opening took".into(),
                format!("{open_s:.2} s ({rate:.0} conn/s)"),
            ),
            (
                "held for".into(),
                format!("{:.2} s", o.held_for.as_secs_f64()),
            ),
            ("still open after".into(), o.survival.open.to_string()),
            ("closed during hold".into(), o.survival.closed.to_string()),
            ("reset during hold".into(), o.survival.reset.to_string()),
        ];
        if o.survival.unexpected_data > 0 {
            rows.push((
                "unexpected data".into(),
                o.survival.unexpected_data.to_string(),
            ));
        }
        if let Some(e) = &o.failures.first_error {
            rows.push(("first error".into(), e.clone()));
        }
        rows.push(("bench cpu".into(), fmt_cpu(o.cpu)));
        print_table(
            &format!(
                "Idle TCP connections to {}{}",
                args.target,
                if args.no_echo {
                    ""
                } else {
                    " (one echoed byte each)"
                }
            ),
            &rows,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survival_tally() {
        let mut s = Survival::default();
        s = tally(s, Err(io::ErrorKind::WouldBlock.into()));
        s = tally(s, Err(io::ErrorKind::WouldBlock.into()));
        s = tally(s, Ok(0));
        s = tally(s, Ok(1));
        s = tally(s, Err(io::ErrorKind::ConnectionReset.into()));
        assert_eq!(
            s,
            Survival {
                open: 2,
                closed: 1,
                reset: 1,
                unexpected_data: 1
            }
        );
    }
}
