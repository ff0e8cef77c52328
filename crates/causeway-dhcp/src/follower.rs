//! The standby's side of the lease stream: connects to the active, takes
//! its snapshot and stream into the local lease file, and confirms each
//! frame once it is durable (see [`crate::replica`] for the wire).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Shutdown as NetShutdown, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use causeway_runtime::ha::advert::AdvertKey;

use crate::lease::LeaseObserver;
use crate::replica::{
    connect_handshake, frame_header, read_header, ReplicationMetrics, StreamError,
    HANDSHAKE_TIMEOUT, HEARTBEAT, MERGE, MERGE_TIMEOUT, RETRY, SNAPSHOT, STREAM_SILENCE,
};

/// The longest a standby waits between attempts to join.
const MAX_RETRY: std::time::Duration = std::time::Duration::from_secs(3);
/// A connection attempt lasts this long before the stop flag is read
/// again (and a new attempt made, until the handshake timeout).
const CONNECT_SLICE: std::time::Duration = std::time::Duration::from_millis(250);
use crate::store::{parse_log, LeaseStore};

/// The standby's side: connects to the active, takes its snapshot and
/// stream into the local lease file, and confirms each frame once durable.
pub struct LeaseReceiver {
    stop: Arc<AtomicBool>,
    socket: Arc<Mutex<Option<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseReceiver {
    pub fn start(
        path: PathBuf,
        active: String,
        key: Arc<AdvertKey>,
        metrics: Option<ReplicationMetrics>,
        in_sync: Arc<AtomicBool>,
        observer: Option<LeaseObserver>,
    ) -> io::Result<LeaseReceiver> {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, socket) = (stop.clone(), socket.clone());
            std::thread::Builder::new()
                .name("lease-stream-recv".into())
                .spawn(move || {
                    let mut store: Option<LeaseStore> = None;
                    let received = AtomicU64::new(0);
                    let mut retry = RETRY;
                    while !stop.load(Ordering::Relaxed) {
                        let started = std::time::Instant::now();
                        in_sync.store(false, Ordering::Relaxed);
                        let follower = Follower {
                            path: &path,
                            active: &active,
                            key: &key,
                            slot: &socket,
                            metrics: &metrics,
                            in_sync: &in_sync,
                            received: &received,
                            observer: observer.as_ref(),
                            stop: &stop,
                        };
                        match follower.follow(&mut store) {
                            Ok(()) => tracing::info!(active = %active, "the active closed the lease stream"),
                            Err(e) if !stop.load(Ordering::Relaxed) => {
                                tracing::debug!(active = %active, error = %e, "lease stream not followed; retrying")
                            }
                            Err(_) => {}
                        }
                        // A stream that held for a while was healthy: retry
                        // soon. One that keeps failing at once (the active
                        // holds joins back, or refuses) is retried less
                        // often, up to every few seconds, so the standby's
                        // log is not resent many times a second.
                        retry = if started.elapsed() > STREAM_SILENCE * 2 {
                            RETRY
                        } else {
                            (retry * 2).min(MAX_RETRY)
                        };
                        // Woken by a stop: a standby that takes over must
                        // not wait out its backoff before DHCP can start.
                        let until = std::time::Instant::now() + retry;
                        while !stop.load(Ordering::Relaxed) {
                            let left = until.saturating_duration_since(std::time::Instant::now());
                            if left.is_zero() {
                                break;
                            }
                            std::thread::park_timeout(left);
                        }
                    }
                    in_sync.store(false, Ordering::Relaxed);
                    if let Some(mut s) = store.take() {
                        s.close();
                    }
                })?
        };
        Ok(LeaseReceiver {
            stop,
            socket,
            thread: Some(thread),
        })
    }

    /// Stops following and closes the lease file (everything confirmed is
    /// durable in it), so the server may open it.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = s.shutdown(NetShutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for LeaseReceiver {
    fn drop(&mut self) {
        self.halt();
    }
}

/// What following one connection to the active needs.
struct Follower<'a> {
    path: &'a Path,
    active: &'a str,
    key: &'a AdvertKey,
    slot: &'a Mutex<Option<TcpStream>>,
    metrics: &'a Option<ReplicationMetrics>,
    in_sync: &'a AtomicBool,
    received: &'a AtomicU64,
    /// Told of every record, as the server tells it of each durable lease
    /// change: the standby's DNS answers the names DHCP clients gave too.
    observer: Option<&'a LeaseObserver>,
    /// Set by [`LeaseReceiver::stop`]; checked once the socket is in the
    /// slot and after every frame, so a connection made while stopping
    /// (the stop shut the slot's older socket) does not keep the thread.
    stop: &'a AtomicBool,
}

impl Follower<'_> {
    fn follow(&self, store: &mut Option<LeaseStore>) -> Result<(), StreamError> {
        let Follower {
            path,
            active,
            key,
            slot,
            metrics,
            in_sync,
            received,
            observer,
            stop,
        } = *self;
        let addr = active
            .to_socket_addrs()?
            .find(|a| a.is_ipv4())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no IPv4 address"))?;
        // In slices, minding the stop flag: a peer that is gone without a
        // word (a dead VM answers no SYN) must not hold a takeover back
        // for the whole connect timeout.
        let deadline = std::time::Instant::now() + HANDSHAKE_TIMEOUT;
        let mut s = loop {
            if stop.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopping").into());
            }
            let slice =
                CONNECT_SLICE.min(deadline.saturating_duration_since(std::time::Instant::now()));
            if slice.is_zero() {
                return Err(
                    io::Error::new(io::ErrorKind::TimedOut, "no connection to the active").into(),
                );
            }
            match TcpStream::connect_timeout(&addr, slice) {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        };
        // In the slot from the start, so a stop's shutdown also ends the
        // handshake and the merge.
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.try_clone()?);
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        s.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        connect_handshake(&mut s, key)?;
        // This replica's own log first: what it acknowledged while the two
        // were apart is adopted by the active before this file is replaced.
        let mine = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        s.set_write_timeout(Some(MERGE_TIMEOUT))?;
        s.write_all(&frame_header(MERGE, 0, mine.len()))?;
        s.write_all(&mine)?;
        drop(mine);
        // The active sends at least a heartbeat every second: silence this
        // long is a partition the kernel has not noticed.
        s.set_read_timeout(Some(STREAM_SILENCE))?;
        s.set_nodelay(true)?;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.try_clone()?);
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        tracing::info!(active, "following the active's lease stream");
        let mut reader = io::BufReader::with_capacity(256 * 1024, s.try_clone()?);
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some((kind, seq, len)) = read_header(&mut reader)? else {
                return Ok(());
            };
            let mut bytes = vec![0u8; len as usize];
            reader.read_exact(&mut bytes)?;
            match kind {
                HEARTBEAT => {}
                SNAPSHOT => {
                    if let Some(mut old) = store.take() {
                        old.close();
                    }
                    install_snapshot(path, &bytes)?;
                    let (opened, recovery) = LeaseStore::open(path, None, None)
                        .map_err(|e| io::Error::other(e.to_string()))?;
                    *store = Some(opened);
                    if let Some(observe) = observer {
                        for record in &recovery.records {
                            observe(record);
                        }
                    }
                    in_sync.store(true, Ordering::Relaxed);
                    if let Some(m) = metrics {
                        m.snapshots_received.inc();
                    }
                    tracing::info!(
                        records = recovery.records.len(),
                        bytes = bytes.len(),
                        "standby took the active's snapshot"
                    );
                }
                _ => {
                    let Some(st) = store.as_ref() else {
                        return Err(StreamError::Frame { kind, len });
                    };
                    let parsed = parse_log(&bytes);
                    let n = parsed.records.len() as u64;
                    // What the disk said of each record: a frame is
                    // confirmed only when all of it is durable here.
                    let refused: Arc<Mutex<Option<io::ErrorKind>>> = Arc::default();
                    for record in parsed.records {
                        if let Some(observe) = observer {
                            observe(&record);
                        }
                        let refused = refused.clone();
                        st.append(
                            record,
                            Box::new(move |r| {
                                if let Err(kind) = r {
                                    *refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(kind);
                                }
                            }),
                        );
                    }
                    // One sync for the frame: the durable point the ack names.
                    st.flush();
                    let failed = *refused.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(kind) = failed {
                        // Not confirmed: the active stops counting on this
                        // standby when the stream closes, and the standby
                        // says it is not in sync until a snapshot lands.
                        in_sync.store(false, Ordering::Relaxed);
                        if let Some(m) = metrics {
                            m.refused_frames.inc();
                        }
                        tracing::error!(
                            error = ?kind,
                            seq,
                            "the standby's lease file refused a replicated batch; not confirmed, leaving the stream"
                        );
                        return Err(StreamError::Io(io::Error::from(kind)));
                    }
                    received.fetch_add(n, Ordering::Relaxed);
                    if let Some(m) = metrics {
                        m.received_records.inc_by(n);
                    }
                }
            }
            s.write_all(&seq.to_be_bytes())?;
        }
    }
}

/// Replaces the lease file with the snapshot, durably: a crash leaves the
/// old file or the new one, never a mix.
fn install_snapshot(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    // A disk that refuses the stream's writes refuses the snapshot too.
    crate::store::fault(path, crate::store::Fault::Write)?;
    let tmp = path.with_extension("snapshot");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: std::net::IpAddr) -> u32 {
        match ip {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => u32::MAX,
        }
    }
    use crate::lease::{LeaseRecord, LeaseState};
    use crate::replica::{frame_header, join_hold, Replicator, BATCH, HEADER, KEEPALIVE};
    use crate::store::read_log;
    use std::net::Ipv4Addr;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn record(i: u32) -> LeaseRecord {
        LeaseRecord {
            ip: Ipv4Addr::from(0x0a00_0000 + i).into(),
            client: format!("01:00:00:00:{:02x}:{:02x}", i >> 8 & 0xff, i & 0xff),
            hw: "00:00:00:00:00:01".into(),
            state: LeaseState::Active,
            expires: 1000 + u64::from(i),
            hostname: None,
            term: 0,
        }
    }

    /// Appends and returns once every record's completion ran (its ACK
    /// would have left).
    fn append_acked(store: &LeaseStore, from: u32, to: u32) {
        let (tx, rx) = mpsc::channel();
        for i in from..to {
            let tx = tx.clone();
            store.append(record(i), Box::new(move |r| tx.send(r).unwrap_or(())));
        }
        for _ in from..to {
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(Ok(())));
        }
    }

    /// An active replicating into `dir/active.jsonl`: its replicator, the
    /// address its lease stream listens on, and its store.
    fn active(dir: &Path, key: &Arc<AdvertKey>) -> (Arc<Replicator>, String, LeaseStore) {
        active_with(dir, key, Duration::from_secs(2))
    }

    /// As [`active`], dropping a standby that does not confirm in `timeout`.
    fn active_with(
        dir: &Path,
        key: &Arc<AdvertKey>,
        timeout: Duration,
    ) -> (Arc<Replicator>, String, LeaseStore) {
        let replicator = Replicator::new(key.clone(), timeout, None);
        let addr = replicator
            .listen("127.0.0.1:0".parse().unwrap(), None)
            .unwrap();
        let (store, _) = LeaseStore::open_replicated(
            &dir.join("active.jsonl"),
            None,
            None,
            Some(replicator.clone()),
        )
        .unwrap();
        (replicator, addr.to_string(), store)
    }

    /// A standby following `addr` into `dir/standby.jsonl`: its file, its
    /// in-sync flag, and the receiver.
    fn standby(
        dir: &Path,
        addr: &str,
        key: Arc<AdvertKey>,
    ) -> (PathBuf, Arc<AtomicBool>, LeaseReceiver) {
        let path = dir.join("standby.jsonl");
        let in_sync = Arc::new(AtomicBool::new(false));
        let receiver = LeaseReceiver::start(
            path.clone(),
            addr.to_string(),
            key,
            None,
            in_sync.clone(),
            None,
        )
        .unwrap();
        (path, in_sync, receiver)
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A standby whose active is gone backs off between attempts (up to
    /// 3 s); when it is told to take over, its stop must not wait the
    /// backoff out, or DHCP starts that much later on the new active.
    #[test]
    fn a_standby_backing_off_stops_at_once() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing listens here: every attempt is refused at once.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let (_, _, receiver) = standby(
            dir.path(),
            &closed,
            Arc::new(AdvertKey::new(b"0123456789abcdef")),
        );
        // Attempts at 0, 0.2, 0.6 and 1.4 s: by 1.5 s the receiver sleeps
        // 1.6 s before its next one.
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            std::thread::park_timeout(Duration::from_millis(1500) - started.elapsed());
        }
        let asked = std::time::Instant::now();
        receiver.stop();
        let took = asked.elapsed();
        assert!(
            took < Duration::from_millis(200),
            "the standby took {took:?} to stop while backing off"
        );
    }

    #[test]
    fn a_joining_standby_gets_the_snapshot_then_every_acknowledged_batch() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active(dir.path(), &key);
        // Before the standby: only in the active's file.
        append_acked(&store, 0, 100);
        let (standby_path, in_sync, receiver) = standby(dir.path(), &addr, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        assert!(in_sync.load(Ordering::Relaxed));
        // Every ACK from here waited for the standby.
        append_acked(&store, 100, 1100);
        receiver.stop();
        let got = read_log(&standby_path).unwrap();
        let mut ips: Vec<_> = got.records.iter().map(|r| r.ip).collect();
        ips.sort_unstable();
        ips.dedup();
        assert_eq!(
            ips.len(),
            1100,
            "the standby holds every acknowledged lease"
        );
        assert_eq!(got.corrupt_lines, 0);
    }

    /// The standby's disk refuses a replicated batch.
    /// The standby must not confirm it: it says it is not in sync, and the
    /// active stops counting it as a standby that holds its ACKs.
    #[test]
    fn a_standby_whose_disk_refuses_a_batch_does_not_confirm_it() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active(dir.path(), &key);
        let (standby_path, in_sync, receiver) = standby(dir.path(), &addr, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        append_acked(&store, 0, 10);
        crate::store::tests::arm(&standby_path, crate::store::Fault::Write);
        let (tx, rx) = mpsc::channel();
        for i in 10..30 {
            let tx = tx.clone();
            store.append(record(i), Box::new(move |r| tx.send(r).unwrap_or(())));
        }
        for _ in 10..30 {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
        let standby_says = in_sync.load(Ordering::Relaxed);
        let active_says = replicator.standby_in_sync();
        crate::store::tests::disarm(&standby_path, crate::store::Fault::Write);
        receiver.stop();
        let held = read_log(&standby_path).unwrap().records.len();
        assert!(
            !standby_says && !active_says,
            "after its disk refused a batch the standby said in sync: {standby_says}, the active said the standby was in sync: {active_says}; the standby's file holds {held} records of 30"
        );
    }

    #[test]
    fn a_standby_without_the_key_is_refused_and_the_active_serves_alone() {
        let dir = tempfile::tempdir().unwrap();
        let replicator = Replicator::new(
            Arc::new(AdvertKey::new(b"0123456789abcdef")),
            Duration::from_secs(2),
            None,
        );
        let addr = replicator
            .listen("127.0.0.1:0".parse().unwrap(), None)
            .unwrap();
        let (store, _) = LeaseStore::open_replicated(
            &dir.path().join("a.jsonl"),
            None,
            None,
            Some(replicator.clone()),
        )
        .unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        let wrong = AdvertKey::new(b"fedcba9876543210");
        assert!(matches!(
            connect_handshake(&mut s, &wrong),
            Err(StreamError::Refused) | Err(StreamError::Io(_))
        ));
        append_acked(&store, 0, 10);
        assert!(!replicator.standby_in_sync());
    }

    #[test]
    fn a_standby_that_stops_confirming_is_dropped_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active_with(dir.path(), &key, Duration::from_millis(300));
        // A standby that confirms the snapshot, then nothing.
        let (_s, _) = slow_standby(&addr, &key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        let started = Instant::now();
        append_acked(&store, 0, 5);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300),
            "the ACKs did not wait for the standby ({waited:?})"
        );
        assert!(!replicator.standby_in_sync());
        // Alone now: no more waiting.
        let started = Instant::now();
        append_acked(&store, 5, 10);
        assert!(started.elapsed() < Duration::from_millis(300));
    }

    /// The standby took over (preemption, or the active stalled past the
    /// dead interval) and closed the stream. The active must not ACK alone
    /// until the election says no other replica can be active; at a role
    /// loss the waiting ACKs are discarded, never sent.
    #[test]
    fn an_active_whose_standby_left_acks_alone_only_when_the_election_allows() {
        use causeway_runtime::ha::AckGate;
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active(dir.path(), &key);
        let gate = Arc::new(AckGate::new(Duration::from_millis(400)));
        replicator.set_gate(gate.clone());
        // Active, and the peer (heard as a standby) vouches for a while.
        gate.publish(true, Some(Instant::now() + Duration::from_secs(60)), 1);
        let (_, _, receiver) = standby(dir.path(), &addr, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        append_acked(&store, 0, 10);
        // The standby leaves to take over; what the election knew lapses.
        gate.publish(true, None, 1);
        receiver.stop();
        wait_for("the stream closed", || !replicator.standby_in_sync());
        let outcome = |i: u32| {
            let (tx, rx) = mpsc::channel();
            let started = Instant::now();
            store.append(record(i), Box::new(move |r| tx.send(r).unwrap_or(())));
            let got = rx.recv_timeout(Duration::from_secs(10));
            (got, started.elapsed())
        };
        let (unknown, waited) = outcome(10);
        assert_eq!(
            unknown,
            Ok(Err(crate::store::WITHHELD)),
            "a batch no standby confirmed was acknowledged after {waited:?} with nothing establishing that this replica alone is active"
        );
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        // The election hears the higher term while a batch waits.
        let releaser = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                gate.publish(false, None, 0);
            })
        };
        let (lost, _) = outcome(11);
        releaser.join().unwrap();
        assert_eq!(lost, Ok(Err(crate::store::WITHHELD)));
        // Taken again, with the peer declared gone: alone is allowed.
        gate.publish(true, Some(Instant::now() + Duration::from_secs(60)), 1);
        let (alone, _) = outcome(12);
        assert_eq!(alone, Ok(Ok(())));
    }

    /// A replica that acknowledged leases alone (its peer was gone, then
    /// it stalled and the peer took over) rejoins as the standby. The
    /// active must adopt those leases before its snapshot replaces the
    /// standby's file, or they are lost from both.
    #[test]
    fn a_rejoining_standby_s_leases_are_adopted_before_its_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let standby_path = dir.path().join("standby.jsonl");
        {
            let (mine, _) = LeaseStore::open(&standby_path, None, None).unwrap();
            for i in 100..110 {
                let (tx, rx) = mpsc::channel();
                let far = LeaseRecord {
                    expires: u64::MAX / 2,
                    term: 3,
                    ..record(i)
                };
                mine.append(far, Box::new(move |r| tx.send(r).unwrap_or(())));
                assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(Ok(())));
            }
        }
        let (replicator, addr, store) = active(dir.path(), &key);
        let adopted: Arc<Mutex<Vec<LeaseRecord>>> = Arc::default();
        {
            let adopted = adopted.clone();
            replicator.set_adopter(Some(Box::new(move |records: &[LeaseRecord]| {
                adopted.lock().unwrap().extend_from_slice(records)
            })));
        }
        append_acked(&store, 0, 10);
        let (_, _, receiver) = standby(dir.path(), &addr, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        receiver.stop();
        let told: Vec<u32> = adopted
            .lock()
            .unwrap()
            .iter()
            .map(|r| v4(r.ip) - 0x0a00_0000)
            .collect();
        let holds = |path: &Path| -> Vec<u32> {
            let mut ips: Vec<u32> = read_log(path)
                .unwrap()
                .records
                .iter()
                .map(|r| v4(r.ip) - 0x0a00_0000)
                .collect();
            ips.sort_unstable();
            ips.dedup();
            ips
        };
        let want: Vec<u32> = (0..10).chain(100..110).collect();
        let standby_holds = holds(&standby_path);
        assert_eq!(
            standby_holds, want,
            "after rejoining, the standby's file lacks the leases it acknowledged alone"
        );
        assert_eq!(holds(&dir.path().join("active.jsonl")), want);
        assert_eq!(told, (100..110).collect::<Vec<_>>(), "the engine is told");
        let kept_term = read_log(&dir.path().join("active.jsonl"))
            .unwrap()
            .records
            .iter()
            .filter(|r| v4(r.ip) >= 0x0a00_0000 + 100)
            .all(|r| r.term == 3);
        assert!(
            kept_term,
            "adopted records keep the term they were written in"
        );
        drop(store);
    }

    /// A relay between standby and active that can stop carrying bytes
    /// without closing anything: a partition the kernel does not see.
    fn relay(to: String, cut: Arc<AtomicBool>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(from) = conn else { return };
                let Ok(upstream) = TcpStream::connect(&to) else {
                    continue;
                };
                for (mut r, mut w) in [
                    (from.try_clone().unwrap(), upstream.try_clone().unwrap()),
                    (upstream, from),
                ] {
                    let cut = cut.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let Ok(n) = r.read(&mut buf) else { return };
                            if n == 0 {
                                return;
                            }
                            // Cut: what was read is dropped, and nothing
                            // is closed.
                            if !cut.load(Ordering::Relaxed) && w.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        addr
    }

    /// A partition that neither kernel notices (no FIN or RST gets
    /// through): both sides must drop the silent stream within a bound,
    /// the standby must stop saying it is in sync, and it must join again
    /// once the path is back.
    #[test]
    fn a_half_open_stream_is_dropped_by_both_sides_and_the_standby_joins_again() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active(dir.path(), &key);
        let cut = Arc::new(AtomicBool::new(false));
        let through = relay(addr, cut.clone());
        let (_, in_sync, receiver) = standby(dir.path(), &through, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        append_acked(&store, 0, 5);
        cut.store(true, Ordering::Relaxed);
        let cut_at = Instant::now();
        let bound = STREAM_SILENCE + KEEPALIVE + Duration::from_secs(1);
        let mut active_dropped = None;
        let mut standby_dropped = None;
        while Instant::now() < cut_at + bound * 2 {
            if active_dropped.is_none() && !replicator.standby_in_sync() {
                active_dropped = Some(cut_at.elapsed());
            }
            if standby_dropped.is_none() && !in_sync.load(Ordering::Relaxed) {
                standby_dropped = Some(cut_at.elapsed());
            }
            if active_dropped.is_some() && standby_dropped.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            active_dropped.is_some_and(|d| d <= bound) && standby_dropped.is_some_and(|d| d <= bound),
            "a half-open stream still counted as in sync {bound:?} after the cut: the active dropped it after {active_dropped:?}, the standby after {standby_dropped:?}"
        );
        cut.store(false, Ordering::Relaxed);
        wait_for("the standby in sync again", || {
            replicator.standby_in_sync() && in_sync.load(Ordering::Relaxed)
        });
        receiver.stop();
    }

    /// A standby that confirms its snapshot and then every batch too late.
    /// Returns how long the snapshot took after the handshake.
    fn slow_standby(addr: &str, key: &AdvertKey) -> (TcpStream, Duration) {
        let mut s = TcpStream::connect(addr).unwrap();
        connect_handshake(&mut s, key).unwrap();
        s.write_all(&frame_header(MERGE, 0, 0)).unwrap();
        let joined = Instant::now();
        let (kind, seq, len) = read_header(&mut s).unwrap().unwrap();
        assert_eq!(kind, crate::replica::SNAPSHOT);
        let took = joined.elapsed();
        let mut skip = vec![0u8; len as usize];
        s.read_exact(&mut skip).unwrap();
        s.write_all(&seq.to_be_bytes()).unwrap();
        (s, took)
    }

    /// A standby that is slow every time: each rejoin would stall a batch
    /// of ACKs for the whole timeout, a few times a second. From the second
    /// drop in a row, its next join waits (2 s, doubling).
    #[test]
    fn a_standby_dropped_twice_in_a_row_joins_again_only_after_a_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, store) = active_with(dir.path(), &key, Duration::from_millis(200));
        // DHCP traffic all along: the writer runs.
        let store = Arc::new(store);
        let running = Arc::new(AtomicBool::new(true));
        let traffic = {
            let (store, running) = (store.clone(), running.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while running.load(Ordering::Relaxed) && i < 100_000 {
                    store.append(record(i), Box::new(|_| {}));
                    i += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let mut took = Vec::new();
        for _ in 0..3 {
            let (s, t) = slow_standby(&addr, &key);
            took.push(t);
            wait_for("the slow standby in sync", || replicator.standby_in_sync());
            wait_for("the slow standby dropped", || !replicator.standby_in_sync());
            drop(s);
        }
        running.store(false, Ordering::Relaxed);
        traffic.join().unwrap();
        assert!(
            took[0] < Duration::from_secs(1) && took[1] < Duration::from_secs(1),
            "the first drop holds nothing back: {took:?}"
        );
        assert!(
            took[2] >= Duration::from_millis(1900),
            "after two drops in a row the standby joined again after {:?}, with no backoff",
            took[2]
        );
        assert_eq!(join_hold(2), Duration::from_secs(2));
        assert_eq!(join_hold(3), Duration::from_secs(4));
        assert_eq!(join_hold(40), Duration::from_secs(60));
    }

    /// Connections that never say anything (a slow or hostile client on
    /// the stream's port) must not hold a standby back from joining.
    #[test]
    fn connections_that_never_speak_do_not_hold_a_standby_back() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, _store) = active(dir.path(), &key);
        let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        let started = Instant::now();
        let (_, _, receiver) = standby(dir.path(), &addr, key);
        wait_for("the standby in sync", || replicator.standby_in_sync());
        let took = started.elapsed();
        receiver.stop();
        drop(silent);
        assert!(
            took < Duration::from_millis(1500),
            "the standby joined {took:?} after two silent connections (the handshake allows each 2 s)"
        );
    }

    /// A replica of the stream's first version (no merge frame) proves the
    /// key over the old context: refused, rather than followed without its
    /// log being merged.
    #[test]
    fn a_standby_of_the_first_stream_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = Arc::new(AdvertKey::new(b"0123456789abcdef"));
        let (replicator, addr, _store) = active(dir.path(), &key);
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut theirs = [0u8; 32];
        s.read_exact(&mut theirs).unwrap();
        s.write_all(&[7u8; 32]).unwrap();
        let mut old = b"causeway-lease-stream/standby:".to_vec();
        old.extend_from_slice(&theirs);
        s.write_all(&key.prove(&old)).unwrap();
        let mut proof = [0u8; 32];
        let answered = s.read_exact(&mut proof).is_ok();
        assert!(!answered, "the active answered a first-version standby");
        assert!(!replicator.standby_in_sync());
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let mut bad_kind = &frame_header(9, 1, 0)[..];
        assert!(matches!(
            read_header(&mut bad_kind),
            Err(StreamError::Frame { kind: 9, .. })
        ));
        let mut huge = [0u8; HEADER];
        huge[0] = BATCH;
        huge[9..13].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            read_header(&mut &huge[..]),
            Err(StreamError::Frame { .. })
        ));
        assert!(matches!(read_header(&mut &[][..]), Ok(None)));
    }
}
