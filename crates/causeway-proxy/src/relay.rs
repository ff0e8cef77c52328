//! The byte relay between a client and its upstream: both directions at
//! once, each ending with a half-close (shutdown of the other side's write)
//! at EOF, the whole connection ended after an idle timeout. A reset (or
//! any failure) on either side ends both directions at once and resets the
//! other side too.
//!
//! Each direction copies through a per-thread buffer while its reads are
//! small and, on Linux, moves bulk with splice(2) through a pipe, so big
//! transfers never enter user space (see [`Pace`]); where splice is
//! refused it keeps copying.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
    /// Stretches of either direction moved by splice.
    pub splice_stretches: u32,
}

/// Counts bytes each way and remembers when any last moved.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    /// Directions that have ended.
    ended: AtomicU8,
    splice_stretches: AtomicU32,
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
        splice_stretches: AtomicU32::new(0),
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
        splice_stretches: activity.splice_stretches.load(Ordering::Relaxed),
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
    // Bytes go through a small buffer until the direction turns bulk (see
    // [`Pace`]): a short exchange, an idle connection and a stream of small
    // messages never pay for a pipe. Bulk goes by splice, and back to the
    // buffer when it turns small again.
    let result = loop {
        match copied(from, to, activity, up, true).await {
            Ok(Copy::Eof) => break Ok(()),
            Ok(Copy::Bulk) => {}
            Err(e) => break Err(e),
        }
        // A pipe is two more descriptors: taken from the process's budget
        // first, so bulk transfers can never use up what DNS and the lease
        // store need. Without one, the bytes are copied as before.
        let Some(reserved) = FdBudget::global().try_reserve(Holder::ProxyPipe, 2) else {
            break copied(from, to, activity, up, false).await.map(|_| ());
        };
        let Ok(pipe) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) else {
            break copied(from, to, activity, up, false).await.map(|_| ());
        };
        activity.splice_stretches.fetch_add(1, Ordering::Relaxed);
        let spliced = spliced(from, to, pipe, activity, up).await;
        drop(reserved);
        match spliced {
            Ok(Splice::Eof) => break Ok(()),
            Ok(Splice::Small) => {}
            Err(e) => break Err(e),
        }
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

/// When one direction moves from the buffered copy to splice and back.
///
/// splice(2) costs two calls a read (socket to pipe, pipe to socket) and,
/// with edge-triggered readiness, often a third that finds nothing; a
/// buffered copy costs a read and a write. Splice only pays when reads are
/// big, so a direction splices once its reads have filled the copy buffer
/// [`SPLICE_AFTER`] bytes' worth (the sender is ahead of the proxy), and
/// goes back to copying after [`SMALL_SPLICES`] splices in a row that
/// moved less than the copy buffer holds. Keep-alive requests of a few
/// kilobytes (a kubelet's, a watch's events) used to cross into splice
/// after their first 64 KB in all and pay for it for the connection's
/// life.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Pace {
    /// Bytes of reads that filled the copy buffer, since the last splice.
    full_reads: u64,
    /// Splices in a row that moved less than [`COPY_CHUNK`].
    small_splices: u32,
}

impl Pace {
    /// After a buffered read of `n` bytes: whether to splice from now on.
    fn copied(&mut self, n: usize) -> bool {
        if n >= COPY_CHUNK {
            self.full_reads += n as u64;
        }
        if self.full_reads >= SPLICE_AFTER {
            *self = Pace::default();
            return true;
        }
        false
    }

    /// After a splice that moved `n` bytes: whether to copy from now on.
    fn spliced(&mut self, n: usize) -> bool {
        if n >= COPY_CHUNK {
            self.small_splices = 0;
            return false;
        }
        self.small_splices += 1;
        if self.small_splices >= SMALL_SPLICES {
            *self = Pace::default();
            return true;
        }
        false
    }
}

/// Bytes of full buffered reads after which a direction splices.
const SPLICE_AFTER: u64 = 64 * 1024;

/// Small splices in a row after which a direction copies again.
const SMALL_SPLICES: u32 = 16;

/// How a splicing stretch of a direction stopped.
enum Splice {
    Eof,
    /// Its reads turned small; the pipe is empty and the copy takes over.
    Small,
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
) -> io::Result<Splice> {
    let mut chunk = CHUNK;
    let mut pace = Pace::default();
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
            Ok(0) => return Ok(Splice::Eof),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            // Sockets that cannot splice (never on Linux TCP, but be sure).
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                return copied(from, to, activity, up, false)
                    .await
                    .map(|_| Splice::Eof)
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
        // The pipe is empty here: what was read has all been written.
        if pace.spliced(n) {
            return Ok(Splice::Small);
        }
    }
}

/// How a buffered copy stopped.
enum Copy {
    Eof,
    /// Its reads turned bulk; the rest is for splice.
    Bulk,
}

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
    may_splice: bool,
) -> io::Result<Copy> {
    let mut pace = Pace::default();
    loop {
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
        activity.touch(up, n);
        if may_splice && pace.copied(n) {
            return Ok(Copy::Bulk);
        }
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
    fn small_reads_never_splice_however_many_bytes_they_add_up_to() {
        // 100 MB of 1 KB keep-alive requests: before the pace, a direction
        // spliced once it had moved 64 KB in all.
        let mut pace = Pace::default();
        for _ in 0..100_000 {
            assert!(!pace.copied(1024));
        }
        // Reads just short of the buffer are small reads too.
        for _ in 0..1000 {
            assert!(!pace.copied(COPY_CHUNK - 1));
        }
    }

    #[test]
    fn full_reads_splice_after_the_threshold_and_small_splices_copy_again() {
        let mut pace = Pace::default();
        let full_reads_needed = (SPLICE_AFTER as usize).div_ceil(COPY_CHUNK);
        for i in 1..=full_reads_needed {
            // Small reads between full ones neither count nor reset.
            assert!(!pace.copied(100));
            assert_eq!(
                pace.copied(COPY_CHUNK),
                i == full_reads_needed,
                "full read {i}"
            );
        }
        let mut pace = Pace::default();
        for round in 0..3 {
            for i in 1..=SMALL_SPLICES {
                assert_eq!(
                    pace.spliced(512),
                    i == SMALL_SPLICES,
                    "round {round}, small splice {i}"
                );
            }
        }
        // A big splice between small ones starts the count again.
        for _ in 1..SMALL_SPLICES {
            assert!(!pace.spliced(512));
        }
        assert!(!pace.spliced(CHUNK));
        for _ in 1..SMALL_SPLICES {
            assert!(!pace.spliced(512));
        }
        assert!(pace.spliced(512));
    }

    #[tokio::test]
    async fn a_keep_alive_exchange_of_small_messages_never_splices() {
        let (mut client, mut upstream, task) = pair(Duration::from_secs(30)).await;
        // 400 requests and responses of 1 KB each way: 400 KB in all, far
        // past the 64 KB after which every direction used to splice.
        let request = vec![7u8; 1024];
        let mut buf = vec![0u8; 1024];
        for _ in 0..400 {
            client.write_all(&request).await.unwrap();
            upstream.read_exact(&mut buf).await.unwrap();
            upstream.write_all(&buf).await.unwrap();
            client.read_exact(&mut buf).await.unwrap();
        }
        client.shutdown().await.unwrap();
        upstream.shutdown().await.unwrap();
        let r = task.await.unwrap();
        assert_eq!((r.up, r.down), (400 * 1024, 400 * 1024));
        assert_eq!(r.splice_stretches, 0, "small messages went through splice");
    }

    #[tokio::test]
    async fn bytes_keep_their_order_as_a_direction_turns_bulk_and_small_again() {
        let (client, upstream, task) = pair(Duration::from_secs(30)).await;
        let (client_r, client_w) = client.into_split();
        let (upstream_r, upstream_w) = upstream.into_split();
        // Each direction: bulk (to splice), many small writes each waited
        // for (to copy again), bulk again; in a pattern that shows any
        // loss or reordering.
        let phases = |seed: usize| -> Vec<Vec<u8>> {
            let bulk = |n: usize, k: usize| (0..n).map(|i| ((i + k) % 251) as u8).collect();
            let mut v: Vec<Vec<u8>> = vec![bulk(2 << 20, seed)];
            v.extend((0..(SMALL_SPLICES as usize * 3)).map(|i| bulk(700, seed + i)));
            v.push(bulk(2 << 20, seed + 7));
            v
        };
        let (up_phases, down_phases) = (phases(1), phases(2));
        let expect_up: Vec<u8> = up_phases.concat();
        let expect_down: Vec<u8> = down_phases.concat();
        // The reader acknowledges each small piece, so the writer's small
        // writes arrive one by one instead of coalescing into a bulk read.
        let (ack_up_tx, ack_up_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let (ack_down_tx, ack_down_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let write_all =
            |mut w: tokio::net::tcp::OwnedWriteHalf,
             phases: Vec<Vec<u8>>,
             mut acks: tokio::sync::mpsc::UnboundedReceiver<()>| async move {
                for p in phases {
                    w.write_all(&p).await.unwrap();
                    if p.len() < COPY_CHUNK {
                        acks.recv().await.unwrap();
                    }
                }
                w.shutdown().await.unwrap();
                w
            };
        let up_writer = tokio::spawn(write_all(client_w, up_phases, ack_up_rx));
        let down_writer = tokio::spawn(write_all(upstream_w, down_phases, ack_down_rx));
        let read_all = |mut r: tokio::net::tcp::OwnedReadHalf,
                        expect: Vec<u8>,
                        ack: tokio::sync::mpsc::UnboundedSender<()>| async move {
            let mut got = Vec::with_capacity(expect.len());
            let mut buf = vec![0u8; 1 << 16];
            let (bulk_end, pieces) = (2 << 20, SMALL_SPLICES as usize * 3);
            let mut acked = 0;
            loop {
                let n = r.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
                // Each small piece is acknowledged once, when it is whole.
                while acked < pieces && got.len() >= bulk_end + (acked + 1) * 700 {
                    let _ = ack.send(());
                    acked += 1;
                }
            }
            got == expect
        };
        let up_ok = tokio::spawn(read_all(upstream_r, expect_up.clone(), ack_up_tx));
        let down_ok = tokio::spawn(read_all(client_r, expect_down.clone(), ack_down_tx));
        let both = tokio::time::timeout(Duration::from_secs(60), async {
            (up_ok.await.unwrap(), down_ok.await.unwrap())
        });
        let (up_ok, down_ok) = both.await.expect("the relay stalled");
        assert!(up_ok, "the upstream did not get every byte in order");
        assert!(down_ok, "the client did not get every byte in order");
        drop((up_writer.await.unwrap(), down_writer.await.unwrap()));
        let r = task.await.unwrap();
        assert_eq!(
            (r.up, r.down),
            (expect_up.len() as u64, expect_down.len() as u64)
        );
        assert_eq!(r.ended, Ended::Closed);
        // Both bulk phases of both directions spliced: the small pieces
        // between them took each direction back to copying.
        assert_eq!(r.splice_stretches, 4);
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
