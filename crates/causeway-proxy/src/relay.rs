//! The byte relay between a client and its upstream: both directions at
//! once, each ending with a half-close (shutdown of the other side's write)
//! at EOF, the whole connection ended after an idle timeout. A reset (or
//! any failure) on either side ends both directions at once and resets the
//! other side too.
//!
//! On Linux each direction moves bytes with splice(2) through a pipe, so
//! they never enter user space; where splice is refused it falls back to
//! a buffered copy.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use causeway_runtime::fds::{FdBudget, Holder};
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// The default pipe capacity, and so what one splice call moves at first.
const CHUNK: usize = 64 * 1024;

/// A direction that has moved this much is a bulk transfer, and its pipe
/// is grown to [`BULK_PIPE`]: a larger pipe halves the system calls per
/// byte, and one stream through the proxy went from about 0.55 to about
/// 0.62 of direct loopback throughput (iperf3, 2 cores). 256 KB to 1 MB
/// measured alike, 2 MB worse.
const GROW_AFTER: u64 = 1 << 20;
const BULK_PIPE: usize = 256 * 1024;
/// Grown pipes at once, process-wide. The kernel counts pipe pages per
/// user (`fs.pipe-user-pages-soft`, 16384 by default) and gives every new
/// pipe two pages once a user is past it, so big pipes must not starve
/// new connections: 64 of them are 4096 pages, a quarter of the default.
const MAX_BULK_PIPES: usize = 64;
static BULK_PIPES: AtomicUsize = AtomicUsize::new(0);

/// A pipe grown for a bulk transfer; the slot is given back on drop.
struct BulkSlot;

impl BulkSlot {
    fn take() -> Option<Self> {
        BULK_PIPES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_BULK_PIPES).then_some(n + 1)
            })
            .ok()
            .map(|_| BulkSlot)
    }
}

impl Drop for BulkSlot {
    fn drop(&mut self) {
        BULK_PIPES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Grows the pipe when a slot is free and the kernel agrees; returns the
/// slot and the capacity now in force.
fn grow(pipe_w: &OwnedFd) -> Option<(BulkSlot, usize)> {
    let slot = BulkSlot::take()?;
    let size = i32::try_from(BULK_PIPE).ok()?;
    match nix::fcntl::fcntl(pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(size)) {
        Ok(got) => Some((slot, usize::try_from(got).ok()?.max(CHUNK))),
        // Over the user's pipe budget (EPERM): keep the default pipe.
        Err(_) => None,
    }
}

/// TCP keepalive: 60 s idle, then a probe every 10 s. Set on each
/// listening socket, whose accepted sockets inherit it on Linux, and on an
/// upstream socket once its connection outlives the relay's first watchdog
/// tick: the three system calls would be a sixth of what a short
/// connection costs the proxy, and no probe could go out before the tick
/// anyway.
pub(crate) fn keepalive(sock: socket2::SockRef<'_>) -> io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    sock.set_tcp_keepalive(&ka)
}

/// Why a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Both sides finished (EOF each way).
    Closed,
    IdleTimeout,
    /// A read or write failed (a reset, most often); both sides are reset.
    Error,
}

impl Ended {
    pub fn label(self) -> &'static str {
        match self {
            Ended::Closed => "closed",
            Ended::IdleTimeout => "idle_timeout",
            Ended::Error => "reset",
        }
    }
}

pub struct Relayed {
    pub up: u64,
    pub down: u64,
    pub ended: Ended,
}

/// Counts bytes each way and remembers when any last moved.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    /// Directions that have ended.
    ended: AtomicU8,
}

impl Activity {
    fn counter(&self, up: bool) -> &AtomicU64 {
        if up {
            &self.up
        } else {
            &self.down
        }
    }

    /// Bytes moved so far in one direction.
    fn moved(&self, up: bool) -> u64 {
        self.counter(up).load(Ordering::Relaxed)
    }

    fn touch(&self, up: bool, n: usize) {
        self.counter(up).fetch_add(n as u64, Ordering::Relaxed);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Relays until both directions end, either fails, or nothing moves for
/// `idle`. After a failure both sockets are set to reset when the caller
/// closes them.
pub async fn relay(client: &TcpStream, upstream: &TcpStream, idle: Duration) -> Relayed {
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
        up: AtomicU64::new(0),
        down: AtomicU64::new(0),
        ended: AtomicU8::new(0),
    };
    let both = async {
        // The first failure ends both directions: the other one may be
        // waiting on a peer that will never send again, holding the
        // connection's permits until the idle timeout.
        match tokio::try_join!(
            one_way(client, upstream, &activity, true),
            one_way(upstream, client, &activity, false)
        ) {
            Ok(_) => Ended::Closed,
            Err(_) => {
                reset_on_close(client);
                reset_on_close(upstream);
                Ended::Error
            }
        }
    };
    let watchdog = async {
        let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        tokio::time::sleep(tick).await;
        // Best effort, as for any socket option: the relay works without it.
        let _ = keepalive(socket2::SockRef::from(upstream));
        loop {
            if activity.idle_for() >= idle {
                return Ended::IdleTimeout;
            }
            tokio::time::sleep(tick).await;
        }
    };
    let ended = tokio::select! {
        e = both => e,
        e = watchdog => e,
    };
    Relayed {
        up: activity.up.load(Ordering::Relaxed),
        down: activity.down.load(Ordering::Relaxed),
        ended,
    }
}

fn shutdown_write(s: &TcpStream) {
    let _ = socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write);
}

/// Makes closing `s` send a reset instead of a FIN (SO_LINGER of zero).
/// When one side of a connection failed, a FIN would tell the other that
/// the stream ended whole; a reset tells it the truth, that it was cut
/// short. Bytes not yet sent to `s` are dropped, which is what a reset
/// means.
pub(crate) fn reset_on_close(s: &TcpStream) {
    // Best effort: if it fails, the close sends a FIN as before.
    let _ = socket2::SockRef::from(s).set_linger(Some(Duration::ZERO));
}

/// One direction: until EOF on `from`, then a half-close of `to`.
async fn one_way(
    from: &TcpStream,
    to: &TcpStream,
    activity: &Activity,
    up: bool,
) -> io::Result<()> {
    // The first bytes go through a small buffer: a short exchange (and an
    // idle connection) never pays for a pipe. Past that, splice.
    let result = match copied(from, to, activity, up, Some(SPLICE_AFTER)).await {
        Ok(Copy::Eof) => Ok(()),
        // A pipe is two more descriptors: taken from the process's budget
        // first, so bulk transfers can never use up what DNS and the lease
        // store need. Without one, the bytes are copied as before.
        Ok(Copy::Limit) => match FdBudget::global().try_reserve(Holder::ProxyPipe, 2) {
            Some(reserved) => match nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) {
                Ok(pipe) => {
                    let result = spliced(from, to, pipe, activity, up).await;
                    drop(reserved);
                    result
                }
                Err(_) => copied(from, to, activity, up, None).await.map(|_| ()),
            },
            None => copied(from, to, activity, up, None).await.map(|_| ()),
        },
        Err(e) => Err(e),
    };
    // The first direction to reach EOF half-closes the other side. When the
    // second ends, the relay is over and closing both sockets sends the
    // FIN: a shutdown then would be a system call for nothing. A failure
    // sends no FIN: the relay resets both sides instead.
    if result.is_ok() && activity.ended.fetch_add(1, Ordering::AcqRel) == 0 {
        shutdown_write(to);
    }
    result
}

fn splice_flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE
}

async fn spliced(
    from: &TcpStream,
    to: &TcpStream,
    (pipe_r, pipe_w): (OwnedFd, OwnedFd),
    activity: &Activity,
    up: bool,
) -> io::Result<()> {
    let mut chunk = CHUNK;
    // Growing is tried once per direction; the slot lives as long as it.
    let mut growth_tried = false;
    let mut _bulk: Option<BulkSlot> = None;
    loop {
        if !growth_tried && activity.moved(up) >= GROW_AFTER {
            growth_tried = true;
            if let Some((slot, size)) = grow(&pipe_w) {
                _bulk = Some(slot);
                chunk = size;
            }
        }
        from.readable().await?;
        let n = match from.try_io(Interest::READABLE, || {
            splice(from, None, &pipe_w, None, chunk, splice_flags()).map_err(io::Error::from)
        }) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            // Sockets that cannot splice (never on Linux TCP, but be sure).
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                return copied(from, to, activity, up, None).await.map(|_| ())
            }
            Err(e) => return Err(e),
        };
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(&pipe_r, None, to, None, left, splice_flags()).map_err(io::Error::from)
            }) {
                Ok(m) => left -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        activity.touch(up, n);
    }
}

/// How a buffered copy stopped.
enum Copy {
    Eof,
    /// It moved `limit` bytes; the rest is for splice.
    Limit,
}

/// Bytes moved by buffered copy before a direction switches to splice.
const SPLICE_AFTER: u64 = 64 * 1024;

/// Bytes read at once by a buffered copy.
const COPY_CHUNK: usize = 16 * 1024;

/// What one read-then-write step did.
enum Step {
    Eof,
    /// `n` bytes read; `rest` holds those the destination did not take.
    Moved {
        n: usize,
        rest: Option<Vec<u8>>,
    },
}

thread_local! {
    /// One copy buffer per runtime thread. It is only used between awaits
    /// (a non-blocking read, then a non-blocking write), so no connection
    /// holds it while waiting, and none needs a buffer of its own.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; COPY_CHUNK].into_boxed_slice());
}

/// Runs `f` on this thread's scratch buffer; `f` must not await.
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| f(&mut cell.borrow_mut()))
}

/// Reads what is ready and writes it straight on; only bytes the
/// destination cannot take yet are kept, in a buffer of their own.
fn read_then_write(from: &TcpStream, to: &TcpStream) -> io::Result<Step> {
    with_scratch(|buf| {
        let n = match from.try_read(buf) {
            Ok(0) => return Ok(Step::Eof),
            Ok(n) => n,
            Err(e) => return Err(e),
        };
        let written = match to.try_write(&buf[..n]) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        Ok(Step::Moved {
            n,
            rest: (written < n).then(|| buf[written..n].to_vec()),
        })
    })
}

async fn copied(
    from: &TcpStream,
    to: &TcpStream,
    activity: &Activity,
    up: bool,
    limit: Option<u64>,
) -> io::Result<Copy> {
    let mut moved = 0u64;
    loop {
        if limit.is_some_and(|l| moved >= l) {
            return Ok(Copy::Limit);
        }
        from.readable().await?;
        let mut step = None;
        // A short read drained the socket (a stream socket returns all it
        // holds, up to the buffer): answering WouldBlock to try_io clears
        // the readiness now, rather than with one more read that would
        // find nothing. Bytes arriving after the read raise a new readiness
        // event, which this does not clear.
        let outcome = from.try_io(Interest::READABLE, || {
            let done = read_then_write(from, to)?;
            let drained = matches!(done, Step::Moved { n, .. } if n < COPY_CHUNK);
            step = Some(done);
            if drained {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        let (n, rest) = match (step, outcome) {
            (Some(Step::Eof), _) => return Ok(Copy::Eof),
            (Some(Step::Moved { n, rest }), _) => (n, rest),
            (None, Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
            (None, Err(e)) => return Err(e),
            (None, Ok(())) => continue,
        };
        if let Some(rest) = rest {
            let mut at = 0;
            while at < rest.len() {
                to.writable().await?;
                match to.try_write(&rest[at..]) {
                    Ok(m) => at += m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
        }
        moved += n as u64;
        activity.touch(up, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A client, the proxy's two sockets, and the upstream, all connected.
    async fn sockets() -> (TcpStream, TcpStream, TcpStream, TcpStream) {
        let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let back = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (proxy_client, _) = front.accept().await.unwrap();
        let proxy_upstream = TcpStream::connect(back.local_addr().unwrap())
            .await
            .unwrap();
        let (upstream, _) = back.accept().await.unwrap();
        (client, proxy_client, proxy_upstream, upstream)
    }

    /// A client and its proxied upstream, with the relay running between
    /// the proxy's two sockets.
    async fn pair(idle: Duration) -> (TcpStream, TcpStream, tokio::task::JoinHandle<Relayed>) {
        let (client, proxy_client, proxy_upstream, upstream) = sockets().await;
        let task = tokio::spawn(async move { relay(&proxy_client, &proxy_upstream, idle).await });
        (client, upstream, task)
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_and_half_close_passes_through() {
        let (mut client, mut upstream, task) = pair(Duration::from_secs(30)).await;
        let payload = vec![5u8; 300_000];
        client.write_all(&payload).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, payload);
        // After the client's EOF the upstream can still answer.
        upstream.write_all(b"done").await.unwrap();
        upstream.shutdown().await.unwrap();
        let mut reply = Vec::new();
        client.read_to_end(&mut reply).await.unwrap();
        assert_eq!(reply, b"done");
        let r = task.await.unwrap();
        assert_eq!((r.up, r.down, r.ended), (300_000, 4, Ended::Closed));
    }

    #[tokio::test]
    async fn a_silent_connection_ends_at_the_idle_timeout() {
        let (mut client, _upstream, task) = pair(Duration::from_millis(200)).await;
        let r = task.await.unwrap();
        assert_eq!(r.ended, Ended::IdleTimeout);
        let mut buf = [0u8; 1];
        // The proxy's sockets are gone: the client sees EOF.
        assert_eq!(client.read(&mut buf).await.unwrap_or(0), 0);
    }

    #[tokio::test]
    async fn a_bulk_transfer_keeps_every_byte_in_order_across_the_pipe_growth() {
        let (mut client, mut upstream, task) = pair(Duration::from_secs(30)).await;
        // Four times the growth threshold, in a pattern that shows any
        // reordering or loss, not just a count.
        let payload: Vec<u8> = (0..4 * GROW_AFTER as usize)
            .map(|i| (i % 251) as u8)
            .collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = Vec::new();
        upstream.read_to_end(&mut got).await.unwrap();
        assert!(
            got == payload,
            "{} bytes arrived, not the {} sent in order",
            got.len(),
            payload.len()
        );
        drop(upstream);
        drop(writer.await.unwrap());
        let r = task.await.unwrap();
        assert_eq!(r.up, payload.len() as u64);
    }

    #[test]
    fn a_grown_pipe_has_the_bulk_size_and_gives_its_slot_back() {
        let (_r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let Some((slot, size)) = grow(&w) else {
            // Another test may hold every slot, or the user is over the
            // kernel's pipe budget: then there is nothing to check.
            eprintln!("SKIP: no bulk pipe slot or pipe budget left");
            return;
        };
        assert_eq!(size, BULK_PIPE);
        let in_kernel = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        assert_eq!(in_kernel as usize, BULK_PIPE);
        drop(slot);
        // The count is process-wide, so take every free slot: the cap holds.
        let held: Vec<BulkSlot> = std::iter::from_fn(BulkSlot::take)
            .take(MAX_BULK_PIPES + 1)
            .collect();
        assert!(!held.is_empty() && held.len() <= MAX_BULK_PIPES);
        assert!(BulkSlot::take().is_none());
        drop(held);
        assert!(BulkSlot::take().is_some());
    }

    #[tokio::test]
    async fn the_upstream_side_gets_keepalive_once_the_connection_outlives_a_tick() {
        let (_client, proxy_client, proxy_upstream, _upstream) = sockets().await;
        let proxy_upstream = Arc::new(proxy_upstream);
        let sock = socket2::SockRef::from(&*proxy_upstream);
        assert!(!sock.keepalive().unwrap());
        // An idle timeout of 400 ms makes the tick 100 ms.
        let relayed = proxy_upstream.clone();
        let task = tokio::spawn(async move {
            relay(&proxy_client, &relayed, Duration::from_millis(400)).await
        });
        assert_eq!(task.await.unwrap().ended, Ended::IdleTimeout);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), Duration::from_secs(60));
    }
}
