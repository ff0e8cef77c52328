//! Lease log replication from the active replica to the standby.
//!
//! The stream carries the lease file's own lines. On the active, the store's
//! writer hands each batch to the [`Replicator`] before its own write and
//! sync, and runs the batch's completions (which send the ACKs) only once
//! the standby has confirmed the batch as durable too; the two syncs
//! overlap, and a batch holds every record that arrived meanwhile (group
//! commit on both sides). A standby that joins first receives the whole
//! file as it stands between two batches (the snapshot), then every batch
//! after it; until it confirms the snapshot the active does not wait for it.
//! A standby that does not confirm a batch within the timeout is dropped:
//! the active serves alone (degraded) and the standby joins again with a
//! new snapshot.
//!
//! A standby that joins sends its own log first; the active adopts the
//! leases it lacks (see [`crate::merge`]) before it takes the snapshot, so
//! what one replica acknowledged while the two were apart is not lost.
//!
//! Wire, after an authenticated handshake (each side proves the shared key
//! over the other's random challenge): frames of `kind (1) | seq (8) | len
//! (4) | bytes`, answered by `seq (8)` once durable. Kinds: 1 snapshot (the
//! whole file), 2 batch (lines to append), 3 merge (the standby's whole
//! file, sent once after the handshake, not answered), 4 heartbeat (empty,
//! sent after a second with nothing else, answered with seq 0). Either side
//! drops a stream silent for three seconds.

use std::io::{self, Read, Write};
use std::net::{Shutdown as NetShutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use causeway_runtime::ha::advert::AdvertKey;
use causeway_runtime::ha::{AckGate, Alone};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub(crate) const SNAPSHOT: u8 = 1;
pub(crate) const BATCH: u8 = 2;
/// The standby's own log, sent once after the handshake for the active to
/// merge before it sends its snapshot.
pub(crate) const MERGE: u8 = 3;
/// How long the standby's log may take to arrive.
pub(crate) const MERGE_TIMEOUT: Duration = Duration::from_secs(10);
/// A frame with nothing in it, sent by the active when it has sent nothing
/// for [`KEEPALIVE`]; the standby answers it like a batch (with seq 0).
pub(crate) const HEARTBEAT: u8 = 4;
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(1);
/// Either side drops a stream it has heard nothing on for this long (a
/// partition the kernel has not noticed: no FIN or RST got through), and
/// the standby joins again.
pub(crate) const STREAM_SILENCE: Duration = Duration::from_secs(3);
pub(crate) const HEADER: usize = 13;
/// A frame longer than this is refused: a snapshot of a million leases is
/// about 200 MB, far above any pool causeway serves.
const MAX_FRAME: u32 = 256 * 1024 * 1024;
const CHALLENGE: usize = 32;
// Version 2 adds the standby's log (MERGE): a replica of the first
// version fails the handshake rather than skip the merge.
const TO_ACTIVE: &[u8] = b"causeway-lease-stream/2/standby:";
const TO_STANDBY: &[u8] = b"causeway-lease-stream/2/active:";
/// How long a handshake or a connect may take.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections proving themselves at once; more are dropped.
const MAX_JOINING: usize = 4;
/// A standby retries a refused or broken stream this often.
pub(crate) const RETRY: Duration = Duration::from_millis(200);

#[derive(Clone)]
pub struct ReplicationMetrics {
    /// 0 no standby, 1 receiving its snapshot, 2 in sync.
    pub standby: IntGauge,
    pub lag_records: IntGauge,
    pub lag_bytes: IntGauge,
    pub batches: IntCounterVec,
    pub wait_seconds: Histogram,
    pub snapshots_sent: IntCounter,
    pub received_records: IntCounter,
    pub snapshots_received: IntCounter,
    /// Batches this standby's own disk refused: not confirmed.
    pub refused_frames: IntCounter,
    pub handshakes_refused: IntCounter,
    /// Records durable here whose ACKs were not sent (see [`Verdict`]).
    pub withheld_records: IntCounter,
    pub merged_records: IntCounter,
    pub merge_conflicts: IntCounter,
}

impl ReplicationMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<ReplicationMetrics> {
        let m = ReplicationMetrics {
            standby: IntGauge::new(
                "causeway_dhcp_replication_standby",
                "The standby as the active sees it: 0 none, 1 receiving its snapshot, 2 in sync (ACKs wait for it)",
            )?,
            lag_records: IntGauge::new(
                "causeway_dhcp_replication_lag_records",
                "Lease records sent to the standby and not yet confirmed durable there",
            )?,
            lag_bytes: IntGauge::new(
                "causeway_dhcp_replication_lag_bytes",
                "Bytes of the lease stream sent to the standby and not yet confirmed",
            )?,
            batches: IntCounterVec::new(
                Opts::new(
                    "causeway_dhcp_replication_batches_total",
                    "Batches sent to the standby, by result: confirmed, timeout (the standby was dropped), lost (the stream broke); and batches whose ACKs were withheld, unconfirmed, because the role was lost (withheld_role_lost) or not established in time (withheld_unknown)",
                ),
                &["result"],
            )?,
            wait_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "causeway_dhcp_replication_wait_seconds",
                    "How long ACKs waited for the standby after the active's own sync",
                )
                .buckets(vec![
                    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
                ]),
            )?,
            snapshots_sent: IntCounter::new(
                "causeway_dhcp_replication_snapshots_sent_total",
                "Snapshots of the lease file sent to a joining standby",
            )?,
            received_records: IntCounter::new(
                "causeway_dhcp_replica_received_records_total",
                "Lease records this standby received and made durable",
            )?,
            snapshots_received: IntCounter::new(
                "causeway_dhcp_replica_snapshots_received_total",
                "Snapshots this standby received from the active",
            )?,
            refused_frames: IntCounter::new(
                "causeway_dhcp_replica_refused_batches_total",
                "Replicated batches this standby's lease file refused: not confirmed, and the standby left the stream until its disk takes a snapshot",
            )?,
            handshakes_refused: IntCounter::new(
                "causeway_dhcp_replication_handshakes_refused_total",
                "Lease stream connections refused: the other side did not prove the shared key",
            )?,
            withheld_records: IntCounter::new(
                "causeway_dhcp_replication_withheld_records_total",
                "Lease records written on the active whose ACKs were not sent: the role may have passed to the peer, or the address was outside this replica's share with no standby confirming",
            )?,
            merged_records: IntCounter::new(
                "causeway_dhcp_replication_merged_records_total",
                "Lease records the active adopted from a rejoining standby's log (leases one replica acknowledged while the two were apart)",
            )?,
            merge_conflicts: IntCounter::new(
                "causeway_dhcp_replication_merge_conflicts_total",
                "Addresses a rejoining standby's log gave to another client than the active's, where the active's record stood (it was from the same or a later takeover)",
            )?,
        };
        registry.register(Box::new(m.standby.clone()))?;
        registry.register(Box::new(m.lag_records.clone()))?;
        registry.register(Box::new(m.lag_bytes.clone()))?;
        registry.register(Box::new(m.batches.clone()))?;
        registry.register(Box::new(m.wait_seconds.clone()))?;
        registry.register(Box::new(m.snapshots_sent.clone()))?;
        registry.register(Box::new(m.received_records.clone()))?;
        registry.register(Box::new(m.snapshots_received.clone()))?;
        registry.register(Box::new(m.refused_frames.clone()))?;
        registry.register(Box::new(m.handshakes_refused.clone()))?;
        registry.register(Box::new(m.withheld_records.clone()))?;
        registry.register(Box::new(m.merged_records.clone()))?;
        registry.register(Box::new(m.merge_conflicts.clone()))?;
        Ok(m)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("lease stream: {0}")]
    Io(#[from] io::Error),
    #[error("lease stream: the other side did not prove the shared key")]
    Refused,
    #[error("lease stream: frame of kind {kind} and {len} bytes is not a frame")]
    Frame { kind: u8, len: u32 },
}

pub(crate) fn frame_header(kind: u8, seq: u64, len: usize) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = kind;
    h[1..9].copy_from_slice(&seq.to_be_bytes());
    h[9..13].copy_from_slice(&(len as u32).to_be_bytes());
    h
}

/// Reads one frame's header; `None` at a clean end of stream.
pub(crate) fn read_header(r: &mut impl Read) -> Result<Option<(u8, u64, u32)>, StreamError> {
    let mut h = [0u8; HEADER];
    match r.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let kind = h[0];
    let seq = u64::from_be_bytes(h[1..9].try_into().unwrap_or_default());
    let len = u32::from_be_bytes(h[9..13].try_into().unwrap_or_default());
    let known = matches!(kind, SNAPSHOT | BATCH | MERGE) || (kind == HEARTBEAT && len == 0);
    if !known || len > MAX_FRAME {
        return Err(StreamError::Frame { kind, len });
    }
    Ok(Some((kind, seq, len)))
}

/// The standby's log, the first frame after the handshake.
fn read_merge(s: &mut TcpStream) -> Result<Vec<u8>, StreamError> {
    match read_header(s)? {
        Some((MERGE, _, len)) => {
            let mut bytes = vec![0u8; len as usize];
            s.read_exact(&mut bytes)?;
            Ok(bytes)
        }
        Some((kind, _, len)) => Err(StreamError::Frame { kind, len }),
        None => Err(StreamError::Io(io::ErrorKind::UnexpectedEof.into())),
    }
}

fn proof_input(context: &[u8], challenge: &[u8]) -> Vec<u8> {
    let mut v = context.to_vec();
    v.extend_from_slice(challenge);
    v
}

/// The active's half of the handshake.
fn accept_handshake(s: &mut TcpStream, key: &AdvertKey) -> Result<(), StreamError> {
    let mine: [u8; CHALLENGE] = rand::random();
    s.write_all(&mine)?;
    let mut theirs = [0u8; CHALLENGE];
    let mut proof = [0u8; 32];
    s.read_exact(&mut theirs)?;
    s.read_exact(&mut proof)?;
    if !key.check(&proof_input(TO_ACTIVE, &mine), &proof) {
        return Err(StreamError::Refused);
    }
    s.write_all(&key.prove(&proof_input(TO_STANDBY, &theirs)))?;
    Ok(())
}

/// The standby's half of the handshake.
pub(crate) fn connect_handshake(s: &mut TcpStream, key: &AdvertKey) -> Result<(), StreamError> {
    let mut theirs = [0u8; CHALLENGE];
    s.read_exact(&mut theirs)?;
    let mine: [u8; CHALLENGE] = rand::random();
    s.write_all(&mine)?;
    s.write_all(&key.prove(&proof_input(TO_ACTIVE, &theirs)))?;
    let mut proof = [0u8; 32];
    s.read_exact(&mut proof)?;
    if !key.check(&proof_input(TO_STANDBY, &mine), &proof) {
        return Err(StreamError::Refused);
    }
    Ok(())
}

enum Link {
    None,
    /// Authenticated, with the standby's own log, waiting for the writer
    /// to merge it and send its snapshot.
    Pending(TcpStream, Vec<u8>),
    Open {
        id: u64,
        frames: mpsc::Sender<Frame>,
        socket: TcpStream,
        snapshot_seq: u64,
        in_sync: bool,
    },
}

struct Frame {
    kind: u8,
    seq: u64,
    bytes: Vec<u8>,
}

struct State {
    link: Link,
    next_seq: u64,
    next_id: u64,
    acked: u64,
    /// Sent and not yet confirmed: (seq, records, bytes).
    outstanding: std::collections::VecDeque<(u64, u64, u64)>,
    /// Standbys dropped for not confirming in time, since a batch was last
    /// confirmed in time; from the second, a join waits (see [`join_hold`]).
    timeouts_in_a_row: u32,
    joins_held_until: Option<Instant>,
}

/// How long a join waits after `timeouts` standbys in a row were dropped
/// for not confirming in time: nothing after the first, then 2 s doubling
/// to a minute. A standby that is slow every time otherwise stalls one
/// batch of ACKs for the whole timeout on every rejoin, a few times a
/// second; held back, the active serves alone between its attempts.
pub(crate) fn join_hold(timeouts: u32) -> Duration {
    match timeouts {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(2u64 << (n - 2).min(5)).min(Duration::from_secs(60)),
    }
}

/// The active's side: accepts a standby, sends it the snapshot and every
/// batch, and tells the writer when a batch is confirmed.
pub struct Replicator {
    state: Mutex<State>,
    confirmed: Condvar,
    timeout: Duration,
    key: Arc<AdvertKey>,
    metrics: Option<ReplicationMetrics>,
    wake: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// The election's word on ACKs the standby did not confirm; without
    /// one (no election), the active's own durability is enough.
    gate: std::sync::OnceLock<Arc<AckGate>>,
    /// This replica's half of the pool, for new addresses while no
    /// standby confirms.
    share: std::sync::OnceLock<crate::merge::Share>,
    adopter: Mutex<Option<Adopter>>,
    /// The peer's wall clock now (unix seconds), from the election.
    peer_clock: std::sync::OnceLock<PeerWall>,
}

/// The peer's wall clock now, in unix seconds, if heard.
pub type PeerWall = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Takes the records adopted from a rejoining standby's log (the server's
/// engine).
pub type Adopter = Box<dyn Fn(&[crate::lease::LeaseRecord]) + Send + Sync>;

/// What the writer may do with a batch's ACKs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send them; `confirmed` says whether the standby confirmed the batch
    /// (if not, this replica is the only one that can be active).
    Ack { confirmed: bool },
    /// The role may be another replica's: discard them.
    Withhold,
}

/// What the writer must do for one batch: the frame the standby must
/// confirm (none when no standby is in sync), and the takeover the batch
/// was written in.
pub struct Ticket {
    seq: Option<u64>,
    takeover: Option<u64>,
}

impl Replicator {
    pub fn new(
        key: Arc<AdvertKey>,
        timeout: Duration,
        metrics: Option<ReplicationMetrics>,
    ) -> Arc<Replicator> {
        Arc::new(Replicator {
            state: Mutex::new(State {
                link: Link::None,
                next_seq: 1,
                next_id: 1,
                acked: 0,
                outstanding: Default::default(),
                timeouts_in_a_row: 0,
                joins_held_until: None,
            }),
            confirmed: Condvar::new(),
            timeout,
            key,
            metrics,
            wake: Mutex::new(None),
            gate: std::sync::OnceLock::new(),
            share: std::sync::OnceLock::new(),
            adopter: Mutex::new(None),
            peer_clock: std::sync::OnceLock::new(),
        })
    }

    /// This replica's share of the pool (see [`crate::merge`]); one set
    /// first stays.
    pub fn set_share(&self, share: crate::merge::Share) {
        let _ = self.share.set(share);
    }

    pub(crate) fn share_side(&self) -> Option<crate::merge::Share> {
        self.share.get().copied()
    }

    /// Where the peer's wall clock is read; one set first stays.
    pub fn set_peer_clock(&self, source: PeerWall) {
        let _ = self.peer_clock.set(source);
    }

    /// The peer's wall clock now (unix seconds), if it was heard.
    pub fn peer_wall_now(&self) -> Option<u64> {
        self.peer_clock.get().and_then(|read| read())
    }

    /// The share new addresses must come from now: none while a standby in
    /// sync confirms every batch.
    pub fn share_now(&self) -> Option<crate::merge::Share> {
        let side = self.share_side()?;
        (!self.standby_in_sync()).then_some(side)
    }

    /// The election term this replica's records are written in (0 while
    /// no election runs or it stands by).
    pub(crate) fn term(&self) -> u64 {
        self.gate.get().map_or(0, |g| g.term())
    }

    /// From now on records adopted from a rejoining standby's log are
    /// handed to `adopt` (the server's engine) once durable here.
    pub fn set_adopter(&self, adopt: Option<Adopter>) {
        *self.adopter.lock().unwrap_or_else(|p| p.into_inner()) = adopt;
    }

    pub(crate) fn adopted(&self, records: &[crate::lease::LeaseRecord], conflicts: u64) {
        if let Some(adopt) = self
            .adopter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            adopt(records);
        }
        if let Some(m) = &self.metrics {
            m.merged_records.inc_by(records.len() as u64);
            m.merge_conflicts.inc_by(conflicts);
        }
    }

    pub(crate) fn count_withheld(&self, records: u64) {
        if let Some(m) = &self.metrics {
            m.withheld_records.inc_by(records);
        }
    }

    /// From now on a batch the standby did not confirm is acknowledged only
    /// when `gate` allows it; one set first stays.
    pub fn set_gate(&self, gate: Arc<AckGate>) {
        let _ = self.gate.set(gate);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Accepts standbys on `listen` for as long as the process runs; the
    /// newest authenticated one replaces any other.
    pub fn listen(
        self: &Arc<Self>,
        listen: SocketAddr,
        interface: Option<&str>,
    ) -> io::Result<SocketAddr> {
        let listener = causeway_runtime::listen::tcp(listen, interface, 16)?;
        let bound = listener.local_addr()?;
        let me = Arc::downgrade(self);
        let joining = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("lease-stream-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Some(me) = me.upgrade() else { return };
                    let Ok(s) = conn else { continue };
                    // Each connection proves itself on a thread of its own,
                    // so one that is slow to (or never does) cannot hold a
                    // standby back; a few at once at most.
                    if joining.fetch_add(1, Ordering::AcqRel) >= MAX_JOINING {
                        joining.fetch_sub(1, Ordering::AcqRel);
                        tracing::debug!(from = ?s.peer_addr().ok(), "lease stream connection dropped: too many joining at once");
                        continue;
                    }
                    let done = joining.clone();
                    let spawned = std::thread::Builder::new()
                        .name("lease-stream-join".into())
                        .spawn(move || {
                            me.join(s);
                            done.fetch_sub(1, Ordering::AcqRel);
                        });
                    if spawned.is_err() {
                        joining.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            })?;
        Ok(bound)
    }

    /// One connection's handshake and log, then it waits for its snapshot.
    fn join(&self, mut s: TcpStream) {
        let peer = s.peer_addr().ok();
        let _ = s.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
        let _ = s.set_write_timeout(Some(HANDSHAKE_TIMEOUT));
        let joined = accept_handshake(&mut s, &self.key).and_then(|()| {
            let _ = s.set_read_timeout(Some(MERGE_TIMEOUT));
            read_merge(&mut s)
        });
        match joined {
            Ok(theirs) => {
                let _ = s.set_read_timeout(None);
                let _ = s.set_nodelay(true);
                tracing::info!(standby = ?peer, log_bytes = theirs.len(), "standby joined the lease stream");
                self.replace(Link::Pending(s, theirs));
                self.poke();
            }
            Err(e) => {
                if let Some(m) = &self.metrics {
                    m.handshakes_refused.inc();
                }
                tracing::warn!(from = ?peer, error = %e, "lease stream connection refused");
            }
        }
    }

    /// The store's writer: an empty job wakes it to send a snapshot.
    pub(crate) fn set_wake(&self, wake: Option<Box<dyn Fn() + Send>>) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = wake;
    }

    pub(crate) fn poke(&self) {
        if let Some(wake) = self.wake.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            wake();
        }
    }

    fn replace(&self, link: Link) {
        let mut st = self.lock();
        if let Link::Open { socket, .. } = &st.link {
            let _ = socket.shutdown(NetShutdown::Both);
        }
        st.link = link;
        st.outstanding.clear();
        self.show(&st);
        self.confirmed.notify_all();
    }

    fn show(&self, st: &State) {
        if let Some(m) = &self.metrics {
            m.standby.set(match &st.link {
                Link::None | Link::Pending(..) => 0,
                Link::Open { in_sync: false, .. } => 1,
                Link::Open { in_sync: true, .. } => 2,
            });
            let (records, bytes) = st
                .outstanding
                .iter()
                .fold((0, 0), |(r, b), (_, nr, nb)| (r + nr, b + nb));
            m.lag_records.set(records as i64);
            m.lag_bytes.set(bytes as i64);
        }
    }

    /// Whether a standby is in sync (ACKs wait for it).
    pub fn standby_in_sync(&self) -> bool {
        matches!(self.lock().link, Link::Open { in_sync: true, .. })
    }

    /// Called by the writer between batches: a standby waiting for its
    /// snapshot gets the file as it stands now. `merge` is given the
    /// standby's own log, adopts what the active lacks, and returns the
    /// active's file with it.
    pub(crate) fn start_pending(
        self: &Arc<Self>,
        merge: impl FnOnce(&[u8]) -> io::Result<Vec<u8>>,
    ) {
        let mut st = self.lock();
        if st
            .joins_held_until
            .is_some_and(|until| Instant::now() < until)
        {
            return;
        }
        let (socket, theirs) = match std::mem::replace(&mut st.link, Link::None) {
            Link::Pending(socket, theirs) => (socket, theirs),
            other => {
                st.link = other;
                return;
            }
        };
        // The merge writes to the log and tells the engine: not under the
        // lock the ACK path takes.
        drop(st);
        let merged = merge(&theirs);
        drop(theirs);
        let mut st = self.lock();
        if !matches!(st.link, Link::None) {
            // A newer standby connection arrived meanwhile: it wins.
            let _ = socket.shutdown(NetShutdown::Both);
            return;
        }
        let bytes = match merged {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the lease file for a standby's snapshot");
                let _ = socket.shutdown(NetShutdown::Both);
                return;
            }
        };
        let (Ok(writer), Ok(reader)) = (socket.try_clone(), socket.try_clone()) else {
            let _ = socket.shutdown(NetShutdown::Both);
            return;
        };
        let id = st.next_id;
        st.next_id += 1;
        let seq = st.next_seq;
        st.next_seq += 1;
        let (tx, rx) = mpsc::channel::<Frame>();
        let size = bytes.len() as u64;
        let _ = tx.send(Frame {
            kind: SNAPSHOT,
            seq,
            bytes,
        });
        st.outstanding.push_back((seq, 0, size));
        st.link = Link::Open {
            id,
            frames: tx,
            socket,
            snapshot_seq: seq,
            in_sync: false,
        };
        if let Some(m) = &self.metrics {
            m.snapshots_sent.inc();
        }
        self.show(&st);
        drop(st);
        let timeout = self.timeout;
        let _ = std::thread::Builder::new()
            .name("lease-stream-send".into())
            .spawn(move || send_frames(writer, rx, timeout));
        let me = self.clone();
        let _ = std::thread::Builder::new()
            .name("lease-stream-acks".into())
            .spawn(move || me.read_acks(id, reader));
    }

    fn read_acks(self: Arc<Self>, id: u64, mut socket: TcpStream) {
        let mut buf = [0u8; 8];
        // The standby answers every heartbeat: silence this long means it
        // is gone, whatever the kernel thinks of the connection.
        let _ = socket.set_read_timeout(Some(STREAM_SILENCE));
        loop {
            if socket.read_exact(&mut buf).is_err() {
                break;
            }
            let seq = u64::from_be_bytes(buf);
            let mut st = self.lock();
            match &mut st.link {
                Link::Open {
                    id: open,
                    snapshot_seq,
                    in_sync,
                    ..
                } if *open == id => {
                    if seq >= *snapshot_seq && !*in_sync {
                        *in_sync = true;
                        tracing::info!("standby in sync: ACKs now wait for it");
                    }
                }
                _ => return,
            }
            st.acked = st.acked.max(seq);
            while st.outstanding.front().is_some_and(|(s, _, _)| *s <= seq) {
                st.outstanding.pop_front();
            }
            self.show(&st);
            self.confirmed.notify_all();
        }
        let mut st = self.lock();
        if matches!(&st.link, Link::Open { id: open, .. } if *open == id) {
            tracing::warn!("standby left the lease stream; serving alone until it returns");
            if let Some(m) = &self.metrics {
                m.batches.with_label_values(&["lost"]).inc();
            }
            st.link = Link::None;
            st.outstanding.clear();
            self.show(&st);
        }
        self.confirmed.notify_all();
    }

    /// Sends a batch; the ticket says whether its ACKs must wait.
    pub(crate) fn send(&self, lines: &[u8], records: u64) -> Ticket {
        let takeover = self.gate.get().and_then(|g| g.takeover());
        let alone = Ticket {
            seq: None,
            takeover,
        };
        let mut st = self.lock();
        let seq = st.next_seq;
        let (sent, in_sync) = match &st.link {
            Link::Open {
                frames, in_sync, ..
            } => (
                frames
                    .send(Frame {
                        kind: BATCH,
                        seq,
                        bytes: lines.to_vec(),
                    })
                    .is_ok(),
                *in_sync,
            ),
            _ => return alone,
        };
        if !sent {
            return alone;
        }
        st.next_seq += 1;
        st.outstanding.push_back((seq, records, lines.len() as u64));
        self.show(&st);
        Ticket {
            seq: in_sync.then_some(seq),
            takeover,
        }
    }

    /// Whether the ticket's batch may be acknowledged: the standby confirmed
    /// it and this replica still holds the role it was written in, or the
    /// election says no other replica can be active.
    pub(crate) fn wait(&self, ticket: Ticket) -> Verdict {
        let confirmed = ticket.seq.is_some_and(|seq| self.wait_confirmed(seq));
        let Some(gate) = self.gate.get() else {
            return Verdict::Ack { confirmed };
        };
        let verdict = gate.wait(ticket.takeover, confirmed);
        if verdict == Alone::Allowed {
            return Verdict::Ack { confirmed };
        }
        if let Some(m) = &self.metrics {
            let label = match verdict {
                Alone::RoleLost => "withheld_role_lost",
                _ => "withheld_unknown",
            };
            m.batches.with_label_values(&[label]).inc();
        }
        tracing::debug!(
            ?verdict,
            "a lease batch's ACKs are withheld: this replica may no longer be the only active"
        );
        Verdict::Withhold
    }

    /// Waits until the standby confirmed frame `seq` (true), the stream
    /// broke, or the timeout passed (then the standby is dropped).
    fn wait_confirmed(&self, seq: u64) -> bool {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let mut st = self.lock();
        loop {
            let still_open = matches!(st.link, Link::Open { .. });
            if st.acked >= seq {
                if let Some(m) = &self.metrics {
                    m.batches.with_label_values(&["confirmed"]).inc();
                    m.wait_seconds.observe(started.elapsed().as_secs_f64());
                }
                st.timeouts_in_a_row = 0;
                return true;
            }
            if !still_open {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                st.timeouts_in_a_row = st.timeouts_in_a_row.saturating_add(1);
                let hold = join_hold(st.timeouts_in_a_row);
                st.joins_held_until = Some(now + hold);
                tracing::warn!(
                    timeout_ms = self.timeout.as_millis() as u64,
                    in_a_row = st.timeouts_in_a_row,
                    next_join_in_ms = hold.as_millis() as u64,
                    "the standby did not confirm a lease batch in time; serving alone until it joins again"
                );
                if let Some(m) = &self.metrics {
                    m.batches.with_label_values(&["timeout"]).inc();
                }
                if let Link::Open { socket, .. } = &st.link {
                    let _ = socket.shutdown(NetShutdown::Both);
                }
                st.link = Link::None;
                st.outstanding.clear();
                self.show(&st);
                return false;
            }
            st = self
                .confirmed
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

fn send_frames(mut socket: TcpStream, frames: mpsc::Receiver<Frame>, timeout: Duration) {
    let _ = socket.set_write_timeout(Some(timeout.max(Duration::from_secs(1))));
    let mut out = Vec::with_capacity(64 * 1024);
    loop {
        let first = match frames.recv_timeout(KEEPALIVE) {
            Ok(f) => f,
            Err(mpsc::RecvTimeoutError::Timeout) => Frame {
                kind: HEARTBEAT,
                seq: 0,
                bytes: Vec::new(),
            },
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        out.clear();
        let mut next = Some(first);
        // Everything queued goes in one write.
        while let Some(f) = next {
            out.extend_from_slice(&frame_header(f.kind, f.seq, f.bytes.len()));
            out.extend_from_slice(&f.bytes);
            next = frames.try_recv().ok();
        }
        if socket.write_all(&out).is_err() {
            let _ = socket.shutdown(NetShutdown::Both);
            return;
        }
    }
}
