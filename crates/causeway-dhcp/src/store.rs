//! The durable lease store: an append-only log of JSON lines, one record per
//! lease change, with group commit and compaction.
//!
//! One writer thread owns the file. It takes every record waiting in its
//! queue, writes them with one `write`, makes them durable with one
//! `fdatasync`, and only then runs each record's completion (which sends the
//! ACK). Many concurrent leases therefore share one fsync. When the log holds
//! far more lines than live addresses, a second thread rewrites the part
//! written so far with only the newest record per address, while the writer
//! keeps appending; the writer then adds the lines written meanwhile and
//! swaps the new file in with an atomic rename, so a reader
//! (`causeway leases`) always sees a whole file and an ACK waits on a
//! compaction only for that short tail copy.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use causeway_runtime::fds::{FdBudget, FdReservation, Holder};

use crate::lease::LeaseRecord;
use crate::metrics::DhcpMetrics;
use crate::replica::Replicator;

/// Compaction never runs below this many lines, so small stores never pay
/// it, and a growing store does not compact over and over while it grows.
const MIN_COMPACT_LINES: u64 = 100_000;
/// The most records one fsync covers; bounds the latency of the first.
const MAX_BATCH: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("lease store {path}: {source}")]
    Io { path: String, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs once the record is durable (`Ok`) or could not be made so (`Err`).
pub type Completion = Box<dyn FnOnce(Result<(), io::ErrorKind>) + Send>;

/// What a completion is told of a record that is durable here but whose
/// reply must not be sent (under high availability, the standby did not
/// confirm it and this replica may not be the only active): the lease
/// stands, as the log says, and the client asks again.
pub const WITHHELD: io::ErrorKind = io::ErrorKind::Interrupted;

/// Told, on the writer thread, each time the store turns bad (a write, sync
/// or repair failed, so nothing can be acknowledged) or good again.
pub type HealthObserver = Box<dyn Fn(bool) + Send>;

/// While the store is bad and no records arrive, the writer probes the disk
/// this often, so it turns good again by itself once space returns.
const PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// The probe writes this many blank-line bytes (one page, so a half-used last
/// page cannot pass for free space) and cuts them away again; blank lines are
/// skipped by recovery, so a probe cut short by a crash is harmless.
const PROBE_BYTES: usize = 4096;

struct Job {
    record: Option<LeaseRecord>,
    done: Completion,
    /// Under high availability: the engine chose this record's address
    /// from the whole pool, counting on the standby to confirm it. If the
    /// standby does not, it is acknowledged alone only when its address is
    /// in this replica's share.
    full_pool: bool,
}

/// What recovery found in the log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub records: Vec<LeaseRecord>,
    /// Lines that did not parse and were skipped.
    pub corrupt_lines: usize,
    /// Bytes of a final line cut short by a crash mid-write (never acknowledged).
    pub torn_tail_bytes: usize,
    /// Skipped lines whose address could still be read, each with the
    /// number of records read before it.
    pub unreadable: Vec<(usize, IpAddr)>,
}

impl Recovery {
    /// Addresses whose newest line could not be read. What that line said
    /// is lost, and the older record that would otherwise stand for the
    /// address may give it back to a client that no longer holds it while
    /// another does; so these are held back (see [`crate::Engine::hold_unreadable`]).
    pub fn unreadable_newest(&self) -> Vec<IpAddr> {
        let mut out: Vec<IpAddr> = self
            .unreadable
            .iter()
            .filter(|(after, ip)| !self.records[*after..].iter().any(|r| r.ip == *ip))
            .map(|(_, ip)| *ip)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// The address of a line that does not parse as a record, if it can still
/// be read: the text after its `"ip":"`.
fn salvage_address(line: &[u8]) -> Option<IpAddr> {
    const KEY: &[u8] = b"\"ip\":\"";
    let start = line.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = line.get(start..)?;
    let end = rest.iter().position(|b| *b == b'"')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Reads every record in the log without changing it. Safe while a server
/// appends to or compacts the same file.
pub fn read_log(path: &Path) -> Result<Recovery, StoreError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes).map_err(io_err(path))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Recovery::default()),
        Err(e) => return Err(io_err(path)(e)),
    }
    Ok(parse_log(&bytes))
}

/// Reads a lease log's bytes: its whole lines as records (skipping and
/// counting those that do not parse) and the length of a torn last line.
pub fn parse_log(bytes: &[u8]) -> Recovery {
    let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut out = Recovery {
        torn_tail_bytes: bytes.len() - whole,
        ..Recovery::default()
    };
    for line in bytes[..whole].split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<LeaseRecord>(line) {
            Ok(r) if causeway_config::parse_hex(&r.client).is_some() => out.records.push(r),
            Ok(r) => {
                out.corrupt_lines += 1;
                out.unreadable.push((out.records.len(), r.ip));
            }
            Err(_) => {
                out.corrupt_lines += 1;
                if let Some(ip) = salvage_address(line) {
                    out.unreadable.push((out.records.len(), ip));
                }
            }
        }
    }
    out
}

pub struct LeaseStore {
    tx: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
    replica: Option<Arc<Replicator>>,
}

impl LeaseStore {
    /// Opens (or creates) the log, recovers its records, and starts the writer.
    pub fn open(
        path: &Path,
        metrics: Option<DhcpMetrics>,
        health: Option<HealthObserver>,
    ) -> Result<(LeaseStore, Recovery), StoreError> {
        LeaseStore::open_replicated(path, metrics, health, None)
    }

    /// As [`LeaseStore::open`], and every batch is also sent to the standby
    /// `replica` follows; a batch's completions wait for the standby's
    /// confirmation (see [`crate::replica`]).
    pub fn open_replicated(
        path: &Path,
        metrics: Option<DhcpMetrics>,
        health: Option<HealthObserver>,
        replica: Option<Arc<Replicator>>,
    ) -> Result<(LeaseStore, Recovery), StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        // A compaction cut short by a crash leaves its output behind; the log
        // itself was never replaced, so the output is only wasted space.
        match fs::remove_file(compaction_output(path)) {
            Ok(()) => tracing::info!(path = %path.display(), "removed an unfinished compaction"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path)(e)),
        }
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io_err(path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_err(path))?;
        let recovery = parse_log(&bytes);
        if recovery.torn_tail_bytes > 0 {
            // A crash cut the last write short; it was never fsynced, so
            // never acknowledged. Drop it so new lines start clean.
            let keep = (bytes.len() - recovery.torn_tail_bytes) as u64;
            file.set_len(keep).map_err(io_err(path))?;
            file.sync_all().map_err(io_err(path))?;
        }
        if !existed {
            sync_dir(path).map_err(io_err(path))?;
        }
        drop(bytes);
        let len = file.seek(SeekFrom::End(0)).map_err(io_err(path))?;
        let lines = recovery.records.len() as u64 + recovery.corrupt_lines as u64;
        let live = distinct_addresses(&recovery.records);
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer {
            path: path.to_path_buf(),
            file,
            len,
            lines,
            compact_at: compact_threshold(live),
            metrics,
            compaction: None,
            repair: Repair::default(),
            healthy: true,
            health,
            replica: replica.clone(),
        };
        if let Some(m) = &writer.metrics {
            m.store_healthy.set(1);
        }
        let handle = std::thread::Builder::new()
            .name("lease-store".into())
            .spawn(move || writer.run(rx))
            .map_err(io_err(path))?;
        if let Some(r) = &replica {
            // An empty job wakes the writer, which sends a joining standby
            // its snapshot between two batches.
            let wake = std::sync::Mutex::new(tx.clone());
            r.set_wake(Some(Box::new(move || {
                let tx = wake.lock().unwrap_or_else(|p| p.into_inner());
                let _ = tx.send(Job {
                    record: None,
                    done: Box::new(|_| {}),
                    full_pool: false,
                });
            })));
            // A standby may have joined before this store opened (while
            // this replica still stood by): its snapshot goes out now.
            r.poke();
        }
        Ok((
            LeaseStore {
                tx: Some(tx),
                writer: Some(handle),
                replica,
            },
            recovery,
        ))
    }

    /// Queues a record; `done` runs on the writer thread once it is durable.
    ///
    /// `done` never runs on the caller's thread, so a caller may hold a lock
    /// that `done` takes (the server queues under the engine lock, and its
    /// completions settle the engine). A store whose writer is gone fails
    /// the record from a thread of its own.
    pub fn append(&self, record: LeaseRecord, done: Completion) {
        self.append_chosen(record, done, false);
    }

    /// As [`LeaseStore::append`]; `full_pool` says the engine chose the
    /// address from the whole pool (a standby was confirming).
    pub fn append_chosen(&self, record: LeaseRecord, done: Completion, full_pool: bool) {
        let job = Job {
            record: Some(record),
            done,
            full_pool,
        };
        let sent = match &self.tx {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        };
        if let Err(job) = sent {
            let failed = std::thread::Builder::new()
                .name("lease-store-closed".into())
                .spawn(move || (job.done)(Err(io::ErrorKind::BrokenPipe)));
            if let Err(e) = failed {
                // No thread for it either: the record is dropped unanswered,
                // which only leaves its reply unsent.
                tracing::error!(error = %e, "a lease record could not be failed back to its sender");
            }
        }
    }

    /// Returns once every record queued before the call is durable.
    pub fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        let done: Completion = Box::new(move |_| {
            let _ = tx.send(());
        });
        if let Some(q) = &self.tx {
            let job = Job {
                record: None,
                done,
                full_pool: false,
            };
            if q.send(job).is_ok() {
                let _ = rx.recv();
            }
        }
    }

    /// The half of the pool new addresses must come from now: none while a
    /// standby confirms (or without high availability).
    pub fn share(&self) -> Option<crate::merge::Share> {
        self.replica.as_ref().and_then(|r| r.share_now())
    }

    /// Lets the writer finish everything queued, then stops it.
    pub fn close(&mut self) {
        // The replicator's wake holds a sender too; the writer ends only
        // once every sender is gone.
        if let Some(r) = self.replica.take() {
            r.set_wake(None);
        }
        self.tx.take();
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
    }
}

impl Drop for LeaseStore {
    fn drop(&mut self) {
        self.close();
    }
}

fn distinct_addresses(records: &[LeaseRecord]) -> u64 {
    let mut seen = std::collections::HashSet::new();
    for r in records {
        seen.insert(r.ip);
    }
    seen.len() as u64
}

/// Compact when the log holds four lines per live address: a compaction
/// rewrites and syncs the whole file, which slows the ACKs' own syncs
/// while it runs, so it should be rare.
fn compact_threshold(live: u64) -> u64 {
    (live * 4).max(MIN_COMPACT_LINES)
}

fn compaction_output(path: &Path) -> PathBuf {
    path.with_extension("compacting")
}

fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    File::open(dir)?.sync_all()
}

struct Writer {
    path: PathBuf,
    file: File,
    len: u64,
    lines: u64,
    compact_at: u64,
    metrics: Option<DhcpMetrics>,
    compaction: Option<Compaction>,
    repair: Repair,
    /// False from a failed write, sync or repair until a commit or probe
    /// succeeds; every record in between is refused (never acknowledged).
    healthy: bool,
    health: Option<HealthObserver>,
    replica: Option<Arc<Replicator>>,
}

/// What must be put right before anything more may be appended.
#[derive(Debug, Default)]
struct Repair {
    /// A failed write left bytes past `len` that could not be cut away; the
    /// next record would be glued to them.
    truncate: bool,
    /// A compaction's rename is not yet known to be durable: until the
    /// directory syncs, a crash could bring the old file back and lose what
    /// was appended to the new one.
    sync_dir: bool,
}

/// A compaction running on its own thread over the first `covers` bytes of
/// the log, while the writer keeps appending after them.
struct Compaction {
    covers: u64,
    lines_after: u64,
    worker: JoinHandle<io::Result<Compacted>>,
    _descriptors: FdReservation,
}

struct Compacted {
    tmp: PathBuf,
    kept: u64,
    bytes: u64,
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut batch: Vec<Job> = Vec::with_capacity(256);
        loop {
            // While a compaction runs, wake now and then to finish it even
            // when no records arrive; while the store is bad, to probe it.
            let wake = if self.compaction.is_some() {
                Some(std::time::Duration::from_millis(50))
            } else if !self.healthy {
                Some(PROBE_INTERVAL)
            } else {
                None
            };
            let first = if let Some(wake) = wake {
                match rx.recv_timeout(wake) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(job) => Some(job),
                    Err(_) => break,
                }
            };
            if let Some(first) = first {
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                self.write_batch(&mut batch, &mut buf);
            } else if !self.healthy {
                self.probe();
            }
            self.step_compaction();
        }
        // Finish a running compaction rather than leave its work (and its
        // temporary file) behind.
        if let Some(c) = self.compaction.take() {
            self.finish(c);
        }
        let _ = self.file.sync_data();
    }

    fn write_batch(&mut self, batch: &mut Vec<Job>, buf: &mut Vec<u8>) {
        if let Some(r) = self.replica.clone() {
            // Between batches the file is exactly what every completed batch
            // made it: the snapshot a joining standby starts from, once what
            // the standby's own log holds and this one lacks is adopted.
            r.start_pending(|theirs| self.merge_standby(&r, theirs));
        }
        buf.clear();
        let mut records = 0usize;
        let term = self.replica.as_ref().map_or(0, |r| r.term());
        for record in batch.iter_mut().filter_map(|j| j.record.as_mut()) {
            // Adopted records keep the term they were written in.
            if record.term == 0 {
                record.term = term;
            }
        }
        for record in batch.iter().filter_map(|j| j.record.as_ref()) {
            // A record of plain fields always serializes.
            if serde_json::to_writer(&mut *buf, record).is_ok() {
                buf.push(b'\n');
                records += 1;
            }
        }
        let started = Instant::now();
        // Sent before the local write, so the two syncs overlap.
        let ticket = match &self.replica {
            Some(r) if records > 0 => Some(r.send(buf, records as u64)),
            _ => None,
        };
        let result = self.commit(buf);
        let verdict = match (&self.replica, ticket) {
            (Some(r), Some(ticket)) => r.wait(ticket),
            _ => crate::replica::Verdict::Ack { confirmed: true },
        };
        let share = self.replica.as_ref().and_then(|r| r.share_side());
        if let Some(m) = &self.metrics {
            m.commit_seconds.observe(started.elapsed().as_secs_f64());
            m.batch_size.observe(records as f64);
            if result.is_err() {
                m.store_errors.inc_by(records as u64);
            }
        }
        match &result {
            Err(e) => {
                if self.healthy {
                    tracing::error!(path = %self.path.display(), error = %e, records,
                        "lease store write failed; no reply is sent until the store works again");
                } else {
                    tracing::debug!(path = %self.path.display(), error = %e, records,
                        "lease store still failing");
                }
                self.set_healthy(false, Some(e));
            }
            Ok(()) => {
                self.lines += records as u64;
                self.set_healthy(true, None);
            }
        }
        // Durable here but not known to be durable wherever the next active
        // may be: the records stand in the log, and no reply goes out.
        let outcome = result.map_err(|e| e.kind());
        let mut withheld = 0u64;
        for job in batch.drain(..) {
            let ack = match verdict {
                crate::replica::Verdict::Withhold => false,
                crate::replica::Verdict::Ack { confirmed: true } => true,
                // Alone: an address from the whole pool only if it is in
                // this replica's share (the peer may give out the rest).
                crate::replica::Verdict::Ack { confirmed: false } => {
                    !job.full_pool
                        || job
                            .record
                            .as_ref()
                            .is_none_or(|r| share.is_none_or(|s| s.holds(r.ip)))
                }
            };
            if !ack && outcome.is_ok() && job.record.is_some() {
                withheld += 1;
            }
            let outcome = match outcome {
                Ok(()) if !ack => Err(WITHHELD),
                other => other,
            };
            (job.done)(outcome);
        }
        if withheld > 0 {
            if let Some(r) = &self.replica {
                r.count_withheld(withheld);
            }
        }
    }

    /// Adopts from a joining standby's log (`theirs`) what this log lacks,
    /// durably, and returns this file's bytes with it for the snapshot.
    fn merge_standby(&mut self, replica: &Replicator, theirs: &[u8]) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut ours = vec![0u8; usize::try_from(self.len).unwrap_or(usize::MAX)];
        self.file.read_exact_at(&mut ours, 0)?;
        if theirs.is_empty() {
            return Ok(ours);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let our_log = parse_log(&ours);
        let their_log = parse_log(theirs);
        let held: std::collections::HashMap<IpAddr, &LeaseRecord> =
            crate::merge::newest(&our_log.records)
                .into_iter()
                .map(|r| (r.ip, r))
                .collect();
        let mut adopt = Vec::new();
        let mut conflicts = 0u64;
        for t in crate::merge::newest(&their_log.records) {
            let ours = held.get(&t.ip).map(|o| crate::merge::Held {
                client: &o.client,
                holds: crate::merge::record_holds(o, now),
                expires: o.expires,
                term: o.term,
            });
            match crate::merge::judge(ours, t, now) {
                crate::merge::Judgement::Adopt => adopt.push(t.clone()),
                crate::merge::Judgement::Conflict => {
                    conflicts += 1;
                    tracing::warn!(ip = %t.ip, standby_client = %t.client, "a rejoining standby's log gives this address to another client; the active's lease stands");
                }
                crate::merge::Judgement::Keep => {}
            }
        }
        if adopt.is_empty() {
            replica.adopted(&[], conflicts);
            return Ok(ours);
        }
        let mut lines = Vec::new();
        for record in &adopt {
            if serde_json::to_writer(&mut lines, record).is_ok() {
                lines.push(b'\n');
            }
        }
        self.commit(&lines)?;
        self.lines += adopt.len() as u64;
        ours.extend_from_slice(&lines);
        tracing::info!(
            adopted = adopt.len(),
            conflicts,
            "merged a rejoining standby's log: leases it acknowledged while the replicas were apart"
        );
        replica.adopted(&adopt, conflicts);
        Ok(ours)
    }

    fn commit(&mut self, buf: &[u8]) -> io::Result<()> {
        self.repair()?;
        let result = self.write_durably(buf);
        match result {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.roll_back();
                Err(e)
            }
        }
    }

    fn write_durably(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Err(e) = fault(&self.path, Fault::Write) {
            // What a full disk does: part of the batch lands, then ENOSPC.
            self.file.write_all(&buf[..buf.len() / 2])?;
            return Err(e);
        }
        self.file.write_all(buf)?;
        self.file.sync_data()
    }

    fn sync_dir(&self) -> io::Result<()> {
        fault(&self.path, Fault::SyncDir)?;
        sync_dir(&self.path)
    }

    fn truncate(&mut self) -> io::Result<()> {
        fault(&self.path, Fault::Truncate)?;
        self.file.set_len(self.len)?;
        self.file.sync_data()
    }

    /// Cuts away whatever a failed write left past the last durable byte,
    /// so the next record starts on a line boundary; if even that fails,
    /// nothing is appended until it succeeds.
    fn roll_back(&mut self) {
        if let Err(e) = self.truncate() {
            tracing::warn!(path = %self.path.display(), error = %e,
                "cannot cut a failed write back; appends wait until it can be");
            self.repair.truncate = true;
        }
    }

    fn repair(&mut self) -> io::Result<()> {
        if self.repair.truncate {
            self.truncate()?;
            self.repair.truncate = false;
        }
        if self.repair.sync_dir {
            self.sync_dir()?;
            self.repair.sync_dir = false;
        }
        Ok(())
    }

    /// Checks, with no record at stake, that the store can write and sync
    /// again, so readiness returns without waiting for a client.
    fn probe(&mut self) {
        let result = self.repair().and_then(|_| {
            let written = self.write_durably(&[b'\n'; PROBE_BYTES]);
            // Cut the probe away whether or not it was written whole.
            self.truncate()?;
            written
        });
        match result {
            Ok(()) => self.set_healthy(true, None),
            Err(e) => {
                // A failed cut leaves blank lines (harmless to recovery) but
                // a line boundary must be restored before the next record.
                self.repair.truncate = true;
                tracing::debug!(path = %self.path.display(), error = %e, "lease store probe failed");
            }
        }
    }

    fn set_healthy(&mut self, healthy: bool, cause: Option<&io::Error>) {
        if let (false, Some(m), Some(e)) = (healthy, &self.metrics, cause) {
            m.store_failures.with_label_values(&[error_label(e)]).inc();
        }
        if healthy == self.healthy {
            return;
        }
        self.healthy = healthy;
        if healthy {
            tracing::info!(path = %self.path.display(), "lease store writable again; replies resume");
        }
        if let Some(m) = &self.metrics {
            m.store_healthy.set(i64::from(healthy));
        }
        if let Some(observe) = &self.health {
            observe(healthy);
        }
    }

    /// Starts a compaction when the log has grown enough, and finishes one
    /// whose worker is done.
    fn step_compaction(&mut self) {
        match &self.compaction {
            None if self.lines >= self.compact_at => {
                // The log read twice, the output, the directory: taken from
                // the process's descriptor budget first, so a compaction
                // never meets EMFILE halfway. Refused, it waits for the
                // next batch.
                let Some(descriptors) = FdBudget::global().try_reserve(Holder::LeaseStore, 3)
                else {
                    return;
                };
                let (path, covers) = (self.path.clone(), self.len);
                let worker = std::thread::Builder::new()
                    .name("lease-compact".into())
                    .spawn(move || compact_prefix(&path, covers));
                match worker {
                    Ok(worker) => {
                        self.compaction = Some(Compaction {
                            covers,
                            lines_after: self.lines,
                            worker,
                            _descriptors: descriptors,
                        })
                    }
                    Err(e) => self.compaction_failed(&e),
                }
            }
            Some(c) if c.worker.is_finished() => {
                if let Some(c) = self.compaction.take() {
                    self.finish(c);
                }
            }
            _ => {}
        }
    }

    /// Waits for a compaction's worker and installs its output.
    fn finish(&mut self, c: Compaction) {
        let lines_since = self.lines - c.lines_after;
        let result = match c.worker.join() {
            Ok(r) => r.and_then(|done| self.install(done, c.covers, lines_since)),
            Err(_) => Err(io::Error::other("compaction thread panicked")),
        };
        match result {
            Ok(kept) => {
                tracing::info!(path = %self.path.display(), kept, "lease log compacted");
                if let Some(m) = &self.metrics {
                    m.compactions.inc();
                }
            }
            Err(e) => self.compaction_failed(&e),
        }
    }

    fn compaction_failed(&mut self, e: &io::Error) {
        // The log stays valid; try again after as many lines again.
        self.compact_at = self.lines * 2;
        tracing::warn!(path = %self.path.display(), error = %e, "lease log compaction failed");
        if let Some(m) = &self.metrics {
            m.compaction_failures.inc();
        }
        if self.repair.sync_dir {
            // The swap happened but is not durable: stop acknowledging
            // until it is.
            self.set_healthy(false, Some(e));
        }
    }

    /// Appends what was written since the compaction began to its output,
    /// then swaps the output in. The writer pauses only for this tail.
    ///
    /// Everything that can fail for want of a file descriptor or space
    /// happens before the rename, on a handle that becomes the writer's own
    /// file: after the rename nothing is opened, so the writer can never be
    /// left appending to the replaced (unlinked) log.
    fn install(&mut self, done: Compacted, covers: u64, lines_since: u64) -> io::Result<u64> {
        let tail = self.len - covers;
        let prepared = (|| {
            let mut out = OpenOptions::new().append(true).open(&done.tmp)?;
            let mut log = File::open(&self.path)?;
            log.seek(SeekFrom::Start(covers))?;
            let copied = io::copy(&mut log.take(tail), &mut out)?;
            if copied != tail {
                return Err(io::Error::other(format!(
                    "copied {copied} of the log's last {tail} bytes"
                )));
            }
            out.sync_all()?;
            fault(&self.path, Fault::Rename)?;
            fs::rename(&done.tmp, &self.path)?;
            Ok(out)
        })();
        let out = match prepared {
            Ok(out) => out,
            Err(e) => {
                let _ = fs::remove_file(&done.tmp);
                return Err(e);
            }
        };
        self.file = out;
        self.len = done.bytes + tail;
        self.lines = done.kept + lines_since;
        self.compact_at = compact_threshold(self.lines);
        self.repair.sync_dir = true;
        self.sync_dir()?;
        self.repair.sync_dir = false;
        Ok(self.lines)
    }
}

fn error_label(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        // ENOSPC, EIO, EMFILE/ENFILE, EDQUOT
        Some(28) => "no_space",
        Some(5) => "io",
        Some(24) | Some(23) => "too_many_files",
        Some(122) => "quota",
        _ => "other",
    }
}

/// Failure points the store's own tests can trip, to prove what a failing
/// disk or an exhausted descriptor table at that point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The batch's write stops half way with ENOSPC.
    Write,
    /// Cutting a failed write back fails with EIO.
    Truncate,
    /// The compaction's rename is refused with EMFILE.
    Rename,
    /// The directory sync after the rename fails with EMFILE.
    SyncDir,
}

#[cfg(not(test))]
pub(crate) fn fault(_: &Path, _: Fault) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
pub(crate) fn fault(path: &Path, at: Fault) -> io::Result<()> {
    match tests::armed(path, at) {
        false => Ok(()),
        true => Err(io::Error::from_raw_os_error(match at {
            Fault::Write => 28,
            Fault::Truncate => 5,
            Fault::Rename | Fault::SyncDir => 24,
        })),
    }
}

/// Calls `f` with every whole, readable record among the first `covers`
/// bytes of the log, its line and its offset.
fn each_record(
    path: &Path,
    covers: u64,
    mut f: impl FnMut(&LeaseRecord, &[u8], u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut reader = BufReader::new(File::open(path)?.take(covers));
    let mut line = Vec::new();
    let mut offset = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok(());
        }
        if let Ok(record) = serde_json::from_slice::<LeaseRecord>(&line) {
            f(&record, &line, offset)?;
        }
        offset += n as u64;
    }
}

/// Writes the newest record per address among the first `covers` bytes of
/// the log to a temporary file. Two passes keep memory to one offset per
/// address.
fn compact_prefix(path: &Path, covers: u64) -> io::Result<Compacted> {
    let mut newest: HashMap<IpAddr, u64> = HashMap::new();
    each_record(path, covers, |record, _, offset| {
        newest.insert(record.ip, offset);
        Ok(())
    })?;
    let tmp = compaction_output(path);
    let written = (|| {
        let mut out = io::BufWriter::new(File::create(&tmp)?);
        let (mut kept, mut bytes) = (0u64, 0u64);
        each_record(path, covers, |record, line, offset| {
            if newest.get(&record.ip) == Some(&offset) {
                out.write_all(line)?;
                kept += 1;
                bytes += line.len() as u64;
            }
            Ok(())
        })?;
        out.into_inner().map_err(|e| e.into_error())?;
        Ok((kept, bytes))
    })();
    match written {
        Ok((kept, bytes)) => Ok(Compacted { tmp, kept, bytes }),
        Err(e) => {
            // On a full disk the half-written output would hold the space
            // the log needs next.
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lease::LeaseState;
    use std::sync::{Arc, Mutex};

    static FAULTS: Mutex<Vec<(PathBuf, Fault)>> = Mutex::new(Vec::new());

    #[test]
    fn every_failure_cause_has_its_series_from_the_start() {
        for errno in [28, 5, 24, 23, 122, 13] {
            let cause = error_label(&io::Error::from_raw_os_error(errno));
            assert!(
                crate::metrics::STORE_FAILURE_CAUSES.contains(&cause),
                "{cause}"
            );
        }
    }

    pub(super) fn armed(path: &Path, at: Fault) -> bool {
        let faults = FAULTS.lock().unwrap_or_else(|p| p.into_inner());
        faults.iter().any(|(p, f)| p == path && *f == at)
    }

    pub(crate) fn arm(path: &Path, at: Fault) {
        FAULTS.lock().unwrap().push((path.to_path_buf(), at));
    }

    pub(crate) fn disarm(path: &Path, at: Fault) {
        FAULTS
            .lock()
            .unwrap()
            .retain(|(p, f)| !(p == path && *f == at));
    }

    /// A store whose health changes arrive on the returned channel.
    fn open_watched(path: &Path) -> (LeaseStore, mpsc::Receiver<bool>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let health: HealthObserver = Box::new(move |healthy| {
            let _ = tx.lock().unwrap().send(healthy);
        });
        let (store, _) = LeaseStore::open(path, None, Some(health)).unwrap();
        (store, rx)
    }

    fn next_health(rx: &mpsc::Receiver<bool>) -> bool {
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("no health change within 30 s")
    }

    fn append_one(store: &LeaseStore, r: LeaseRecord) -> Result<(), io::ErrorKind> {
        let (tx, rx) = mpsc::channel();
        store.append(
            r,
            Box::new(move |res| {
                let _ = tx.send(res);
            }),
        );
        rx.recv().unwrap()
    }

    /// Enough rewrites of 100 addresses to cross the compaction threshold.
    fn fill_past_compaction(store: &LeaseStore) {
        for _ in 0..11 {
            append_all(
                store,
                (0..10_000).map(|i| record(i % 100, LeaseState::Active)),
            );
        }
    }

    /// The same fill where the compaction it starts is made to fail: the
    /// store may turn bad before the fill is over, and the records after
    /// that are refused, as they must be.
    fn fill_past_a_failing_compaction(store: &LeaseStore) {
        for _ in 0..11 {
            append_results(
                store,
                (0..10_000).map(|i| record(i % 100, LeaseState::Active)),
            );
        }
    }

    fn record(i: u32, state: LeaseState) -> LeaseRecord {
        LeaseRecord {
            ip: std::net::Ipv4Addr::from(0x0a00_0000 + i).into(),
            client: format!("01:00:00:00:{:02x}:{:02x}", i >> 8 & 0xff, i & 0xff),
            hw: "00:00:00:00:00:01".into(),
            state,
            expires: 1000 + u64::from(i),
            hostname: None,
            term: 0,
        }
    }

    fn append_all(store: &LeaseStore, records: impl IntoIterator<Item = LeaseRecord>) -> usize {
        let results = append_results(store, records);
        assert!(results.iter().all(|r| r.is_ok()));
        results.len()
    }

    /// What the store said of each record, once it has said it of all.
    fn append_results(
        store: &LeaseStore,
        records: impl IntoIterator<Item = LeaseRecord>,
    ) -> Vec<Result<(), io::ErrorKind>> {
        let done = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let mut n = 0;
        for r in records {
            let done = done.clone();
            let tx = tx.clone();
            store.append(
                r,
                Box::new(move |res| {
                    done.lock().unwrap().push(res);
                    let _ = tx.send(());
                }),
            );
            n += 1;
        }
        for _ in 0..n {
            rx.recv().unwrap();
        }
        let results = std::mem::take(&mut *done.lock().unwrap());
        results
    }

    #[test]
    fn every_completed_record_is_recovered_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/leases.jsonl");
        let (store, rec) = LeaseStore::open(&path, None, None).unwrap();
        assert!(rec.records.is_empty());
        assert_eq!(
            append_all(&store, (0..500).map(|i| record(i, LeaseState::Active))),
            500
        );
        drop(store);
        let (_store, rec) = LeaseStore::open(&path, None, None).unwrap();
        assert_eq!(rec.records.len(), 500);
        assert_eq!(rec.records[499], record(499, LeaseState::Active));
    }

    #[test]
    fn a_torn_final_line_is_dropped_and_appends_continue_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let (store, _) = LeaseStore::open(&path, None, None).unwrap();
        append_all(&store, (0..3).map(|i| record(i, LeaseState::Active)));
        drop(store);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"ip\":\"10.0.0.9\",\"cli").unwrap();
        drop(f);
        let (store, rec) = LeaseStore::open(&path, None, None).unwrap();
        assert_eq!(rec.records.len(), 3);
        assert_eq!(rec.torn_tail_bytes, 21);
        append_all(&store, [record(7, LeaseState::Active)]);
        drop(store);
        let rec = read_log(&path).unwrap();
        assert_eq!(rec.records.len(), 4);
        assert_eq!(rec.corrupt_lines, 0);
    }

    #[test]
    fn a_corrupt_line_in_the_middle_is_skipped_and_counted() {
        let parsed = parse_log(b"{\"ip\":\"10.0.0.1\",\"client\":\"01\",\"hw\":\"\",\"state\":\"active\",\"expires\":5}\nnot json\n");
        assert_eq!(parsed.records.len(), 1);
        assert_eq!(parsed.corrupt_lines, 1);
    }

    /// The server queues records while it holds the engine lock, and each
    /// completion takes that lock: a completion run on the caller's thread
    /// (as a store without a writer once did) would deadlock it.
    #[test]
    fn a_closed_store_fails_a_record_off_the_callers_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = LeaseStore::open(&dir.path().join("l.jsonl"), None, None).unwrap();
        store.close();
        let engine_lock = Arc::new(Mutex::new(()));
        let (tx, rx) = mpsc::channel();
        let held = engine_lock.lock().unwrap();
        let lock = engine_lock.clone();
        let caller = std::thread::current().id();
        store.append(
            record(1, LeaseState::Active),
            Box::new(move |durable| {
                let on_caller = std::thread::current().id() == caller;
                // Would block forever on the caller's own thread.
                let _settled = (!on_caller).then(|| lock.lock().unwrap());
                let _ = tx.send((durable, on_caller));
            }),
        );
        drop(held);
        let (durable, on_caller) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the closed store never failed the record");
        assert!(!on_caller, "the completion ran on the caller's thread");
        assert_eq!(durable, Err(io::ErrorKind::BrokenPipe));
    }

    #[test]
    fn an_unreadable_line_names_its_address_unless_a_later_record_does() {
        let good = |ip: &str| {
            format!("{{\"ip\":\"{ip}\",\"client\":\"01\",\"hw\":\"\",\"state\":\"active\",\"expires\":5}}\n")
        };
        let damaged = "{\"ip\":\"10.0.0.1\",\"client\":\"0\u{0}\n";
        let bad_client = "{\"ip\":\"10.0.0.3\",\"client\":\"zz\",\"hw\":\"\",\"state\":\"active\",\"expires\":5}\n";
        let log = [
            good("10.0.0.1"),
            damaged.into(),
            good("10.0.0.2"),
            bad_client.into(),
        ]
        .concat();
        let parsed = parse_log(log.as_bytes());
        assert_eq!(parsed.corrupt_lines, 2);
        assert_eq!(
            parsed.unreadable_newest(),
            vec![IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 3])]
        );
        let superseded = [log, good("10.0.0.1"), good("10.0.0.3")].concat();
        assert!(parse_log(superseded.as_bytes())
            .unreadable_newest()
            .is_empty());
        assert_eq!(salvage_address(b"no address here"), None);
        assert_eq!(salvage_address(b"{\"ip\":\"300.1.1.1\""), None);
    }

    #[test]
    fn a_partial_write_that_cannot_be_cut_back_blocks_appends_until_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let (store, health) = open_watched(&path);
        append_all(&store, (0..3).map(|i| record(i, LeaseState::Active)));
        arm(&path, Fault::Write);
        arm(&path, Fault::Truncate);
        assert_eq!(
            append_one(&store, record(10, LeaseState::Active)),
            Err(io::ErrorKind::StorageFull)
        );
        assert!(!next_health(&health), "a failed write leaves the store bad");
        // Space is back but the half-written batch is still on the end:
        // nothing may be appended after it.
        disarm(&path, Fault::Write);
        assert!(append_one(&store, record(11, LeaseState::Active)).is_err());
        disarm(&path, Fault::Truncate);
        assert_eq!(append_one(&store, record(12, LeaseState::Active)), Ok(()));
        assert!(next_health(&health));
        drop(store);
        let rec = read_log(&path).unwrap();
        assert_eq!((rec.corrupt_lines, rec.torn_tail_bytes), (0, 0));
        let ips: Vec<_> = rec.records.iter().map(|r| r.ip).collect();
        assert_eq!(
            ips,
            [0, 1, 2, 12].map(|i| record(i, LeaseState::Active).ip),
            "exactly the acknowledged records, each whole"
        );
    }

    #[test]
    fn a_bad_store_turns_good_again_by_itself_when_the_disk_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let (store, health) = open_watched(&path);
        arm(&path, Fault::Write);
        assert!(append_one(&store, record(1, LeaseState::Active)).is_err());
        assert!(!next_health(&health));
        disarm(&path, Fault::Write);
        // No record arrives: the writer's own probe finds the disk good.
        assert!(next_health(&health));
        drop(store);
        let rec = read_log(&path).unwrap();
        assert_eq!(rec.records.len(), 0);
        assert_eq!(
            fs::metadata(&path).unwrap().len(),
            0,
            "the probe is cut away"
        );
    }

    #[test]
    fn after_a_compaction_rename_that_is_not_durable_nothing_is_acknowledged_until_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let (store, health) = open_watched(&path);
        arm(&path, Fault::SyncDir);
        // A CI run saw the compaction end, and the store turn bad, before
        // the fill was over: its last records were refused, as they must
        // be, and an assertion that every one was acknowledged failed.
        fill_past_a_failing_compaction(&store);
        assert!(
            !next_health(&health),
            "the failed directory sync turns the store bad"
        );
        assert!(
            append_one(&store, record(500, LeaseState::Active)).is_err(),
            "acknowledged while a crash could bring the old log back"
        );
        disarm(&path, Fault::SyncDir);
        assert_eq!(append_one(&store, record(501, LeaseState::Active)), Ok(()));
        drop(store);
        let rec = read_log(&path).unwrap();
        assert!(rec.records.len() < 100_000, "compacted");
        assert!(rec
            .records
            .iter()
            .any(|r| r.ip == record(501, LeaseState::Active).ip));
        assert!(!compaction_output(&path).exists());
    }

    #[test]
    fn a_failed_compaction_removes_its_output_and_keeps_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let metrics = DhcpMetrics::new(&prometheus::Registry::new()).unwrap();
        let (store, _) = LeaseStore::open(&path, Some(metrics.clone()), None).unwrap();
        arm(&path, Fault::Rename);
        fill_past_compaction(&store);
        let waited = std::time::Instant::now();
        while metrics.compaction_failures.get() == 0 && waited.elapsed().as_secs() < 30 {
            // Each flush is one pass of the writer, which finishes a
            // compaction whose worker is done.
            store.flush();
        }
        assert_eq!(metrics.compaction_failures.get(), 1);
        assert_eq!(
            metrics.store_healthy.get(),
            1,
            "a refused rename harms nothing"
        );
        assert!(
            !compaction_output(&path).exists(),
            "the output is left on disk"
        );
        assert_eq!(append_one(&store, record(7, LeaseState::Released)), Ok(()));
        disarm(&path, Fault::Rename);
        drop(store);
        let rec = read_log(&path).unwrap();
        assert_eq!(rec.records.len(), 110_001, "nothing was lost or rewritten");
    }

    #[test]
    fn an_unfinished_compaction_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        fs::write(compaction_output(&path), b"half a compaction").unwrap();
        let (_store, _) = LeaseStore::open(&path, None, None).unwrap();
        assert!(!compaction_output(&path).exists());
    }

    #[test]
    fn compaction_keeps_only_the_newest_record_per_address() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.jsonl");
        let (store, _) = LeaseStore::open(&path, None, None).unwrap();
        // 100 addresses, each written 1,100 times: 110,000 lines crosses
        // the compaction threshold.
        for round in 0..1100u32 {
            let state = if round == 1099 {
                LeaseState::Released
            } else {
                LeaseState::Active
            };
            append_all(&store, (0..100).map(|i| record(i, state)));
        }
        drop(store);
        let rec = read_log(&path).unwrap();
        assert!(
            rec.records.len() < 100_000,
            "not compacted: {} lines",
            rec.records.len()
        );
        let mut newest = HashMap::new();
        for r in &rec.records {
            newest.insert(r.ip, r.state);
        }
        assert_eq!(newest.len(), 100);
        assert!(newest.values().all(|s| *s == LeaseState::Released));
    }
}
