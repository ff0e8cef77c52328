// `causeway-bench proxy upstream`: the far end of the path under test. A
// built-in server rather than socat or iperf3 so that every proxy is
// measured against the same cheap, known peer, and so the sink can confirm
// that every byte of an upload arrived (its count at EOF also proves the
// proxy relays a half-close). One task per connection on the bench's single
// thread; a progress line every second and a summary at the end.

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::harness::{fmt_bytes, print_table, progress_interval};
use crate::stats::{self, round3, RateMeter};

#[derive(clap::Args, Debug, Clone)]
pub struct UpstreamArgs {
    /// Address:port to listen on
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,

    /// echo: send back what arrives; sink: read and discard, and at EOF
    /// reply with the byte count (decimal, newline) and close; source:
    /// stream bytes until the client closes
    #[arg(long, value_enum, default_value_t = Mode::Echo)]
    pub mode: Mode,

    /// Echo only: close each connection once this many bytes have been
    /// echoed on it. The server then closes first, so TIME_WAIT stays on
    /// its side instead of taking the ephemeral ports of whatever connects
    /// to it (a proxy's upstream side included); pair with `conn
    /// --expect-close`
    #[arg(long, value_name = "BYTES", value_parser = stats::parse_size)]
    pub close_after: Option<u64>,

    /// Stop after this long (default: run until Ctrl-C or SIGTERM)
    #[arg(long, value_name = "DURATION", value_parser = stats::duration_arg)]
    pub duration: Option<Duration>,

    /// Print the final summary as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Echo,
    Sink,
    Source,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Echo => "echo",
            Mode::Sink => "sink",
            Mode::Source => "source",
        }
    }
}

/// Echo replies are small (request/response) or bounded by what the client
/// sends, and an idle run holds 10000 of these, so 16 KiB; bulk modes get
/// bigger buffers for fewer syscalls.
const ECHO_BUF: usize = 16 * 1024;
const BULK_BUF: usize = 256 * 1024;

#[derive(Default)]
struct Counters {
    accepted: Cell<u64>,
    active: Cell<u64>,
    peak_active: Cell<u64>,
    bytes_in: Cell<u64>,
    bytes_out: Cell<u64>,
    /// Connections that ended with a reset or broken pipe: expected for
    /// source (clients close mid-stream), suspicious otherwise.
    resets: Cell<u64>,
    errors: Cell<u64>,
    accept_errors: Cell<u64>,
}

fn add(c: &Cell<u64>, n: usize) {
    c.set(c.get() + n as u64);
}

pub async fn run(args: UpstreamArgs) -> anyhow::Result<()> {
    if args.close_after.is_some() && args.mode != Mode::Echo {
        anyhow::bail!("--close-after only applies to --mode echo");
    }
    if args.close_after == Some(0) {
        anyhow::bail!("--close-after must be at least 1 byte");
    }
    let listener = listen(args.listen)?;
    let c = Rc::new(Counters::default());
    let start = Instant::now();
    eprintln!(
        "proxy upstream: {}{} on {}{}",
        match args.mode {
            Mode::Echo => "echo",
            Mode::Sink => "sink (count at EOF)",
            Mode::Source => "source (until the client closes)",
        },
        args.close_after
            .map(|n| format!(", closing after {n} bytes"))
            .unwrap_or_default(),
        args.listen,
        args.duration
            .map(|d| format!(", for {d:?}"))
            .unwrap_or_else(|| ", until Ctrl-C".into())
    );
    super::harness::check_nofile(1024);

    // Without --duration, a deadline a year out: tokio clamps it anyway.
    let deadline = tokio::time::sleep(
        args.duration
            .unwrap_or(Duration::from_secs(365 * 24 * 3600)),
    );
    tokio::pin!(deadline);
    let mut stops = causeway_runtime::signals()?;
    let mut progress = progress_interval();
    let mut meter_in = RateMeter::new(start);
    let mut meter_out = RateMeter::new(start);
    let mut meter_conn = RateMeter::new(start);
    let mut warned = false;
    let ended_by = loop {
        tokio::select! {
            biased;
            why = stops.recv() => break crate::stop_word(why),
            _ = &mut deadline => break "duration reached",
            _ = progress.tick() => {
                let now = Instant::now();
                let bin = meter_in.tick(c.bytes_in.get(), now);
                let bout = meter_out.tick(c.bytes_out.get(), now);
                eprintln!(
                    "[{:6.1}s] accepted {:>9}  conn/s {:>7.0}  active {:>6}  in {:>6.2} Gbit/s  out {:>6.2} Gbit/s",
                    now.saturating_duration_since(start).as_secs_f64(),
                    c.accepted.get(),
                    meter_conn.tick(c.accepted.get(), now),
                    c.active.get(),
                    bin * 8.0 / 1e9,
                    bout * 8.0 / 1e9,
                );
            }
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    add(&c.accepted, 1);
                    add(&c.active, 1);
                    c.peak_active.set(c.peak_active.get().max(c.active.get()));
                    tokio::task::spawn_local(serve(stream, args.mode, args.close_after, c.clone()));
                }
                Err(e) => {
                    add(&c.accept_errors, 1);
                    if !warned {
                        warned = true;
                        eprintln!("warning: accept: {e} (counted; raise ulimit -n if it is EMFILE)");
                    }
                    // EMFILE and friends persist until a connection closes;
                    // a short pause keeps this from becoming a busy loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    eprintln!("proxy upstream: stopping ({ended_by})");
    report(&args, &c, elapsed)
}

/// A listener with a deep backlog (the conn and idle clients open
/// connections in bursts) and SO_REUSEADDR, so the compare script can
/// restart it in another mode on the same port while old connections sit
/// in TIME_WAIT.
fn listen(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())
        .with_context(|| format!("binding {addr}"))?;
    sock.listen(4096)
        .with_context(|| format!("listening on {addr}"))?;
    Ok(TcpListener::from_std(sock.into())?)
}

async fn serve(mut stream: TcpStream, mode: Mode, close_after: Option<u64>, c: Rc<Counters>) {
    let _ = stream.set_nodelay(true);
    let res = match mode {
        Mode::Echo => echo(&mut stream, close_after, &c).await,
        Mode::Sink => sink(&mut stream, &c).await,
        Mode::Source => source(&mut stream, &c).await,
    };
    if let Err(e) = res {
        match e.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => add(&c.resets, 1),
            _ => add(&c.errors, 1),
        }
    }
    c.active.set(c.active.get().saturating_sub(1));
}

async fn echo(stream: &mut TcpStream, close_after: Option<u64>, c: &Counters) -> io::Result<()> {
    let mut buf = vec![0u8; ECHO_BUF];
    let mut echoed = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            // Pass the client's half-close on, so its read sees EOF.
            return stream.shutdown().await;
        }
        add(&c.bytes_in, n);
        stream.write_all(&buf[..n]).await?;
        add(&c.bytes_out, n);
        echoed += n as u64;
        if close_after.is_some_and(|limit| echoed >= limit) {
            // Our FIN goes first; the caller's drop then closes.
            return stream.shutdown().await;
        }
    }
}

async fn sink(stream: &mut TcpStream, c: &Counters) -> io::Result<()> {
    let mut buf = vec![0u8; BULK_BUF];
    let mut count = 0u64;
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        count += n as u64;
        add(&c.bytes_in, n);
    }
    let reply = format!("{count}\n");
    stream.write_all(reply.as_bytes()).await?;
    add(&c.bytes_out, reply.len());
    stream.shutdown().await
}

/// Writes until the client goes away. The read side is watched at the same
/// time because a client that closes cleanly may only show up as EOF there
/// while our writes still fit in buffers.
async fn source(stream: &mut TcpStream, c: &Counters) -> io::Result<()> {
    let buf = pattern(BULK_BUF);
    let (mut rd, mut wr) = stream.split();
    let writer = async {
        loop {
            wr.write_all(&buf).await?;
            add(&c.bytes_out, buf.len());
        }
    };
    let reader = async {
        let mut scratch = [0u8; 4096];
        loop {
            let n = rd.read(&mut scratch).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            add(&c.bytes_in, n);
        }
    };
    tokio::select! {
        res = writer => res,
        res = reader => res,
    }
}

/// Bytes that are not all zero, so nothing along the path can treat the
/// stream as special.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[derive(Serialize)]
struct JsonSummary {
    listen: String,
    mode: Mode,
    duration_s: f64,
    accepted: u64,
    peak_active: u64,
    active_at_end: u64,
    bytes_in: u64,
    bytes_out: u64,
    resets: u64,
    errors: u64,
    accept_errors: u64,
}

fn report(args: &UpstreamArgs, c: &Counters, elapsed: f64) -> anyhow::Result<()> {
    if args.json {
        let s = JsonSummary {
            listen: args.listen.to_string(),
            mode: args.mode,
            duration_s: round3(elapsed),
            accepted: c.accepted.get(),
            peak_active: c.peak_active.get(),
            active_at_end: c.active.get(),
            bytes_in: c.bytes_in.get(),
            bytes_out: c.bytes_out.get(),
            resets: c.resets.get(),
            errors: c.errors.get(),
            accept_errors: c.accept_errors.get(),
        };
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    let rows = vec![
        ("duration".to_string(), format!("{elapsed:.2} s")),
        ("accepted".into(), c.accepted.get().to_string()),
        ("peak active".into(), c.peak_active.get().to_string()),
        ("active at end".into(), c.active.get().to_string()),
        ("bytes in".into(), fmt_bytes(c.bytes_in.get())),
        ("bytes out".into(), fmt_bytes(c.bytes_out.get())),
        ("resets".into(), c.resets.get().to_string()),
        ("other errors".into(), c.errors.get().to_string()),
        ("accept errors".into(), c.accept_errors.get().to_string()),
    ];
    print_table(
        &format!("proxy upstream ({}) on {}", args.mode.name(), args.listen),
        &rows,
    );
    Ok(())
}
