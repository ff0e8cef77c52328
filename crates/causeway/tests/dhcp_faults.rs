//! DHCP under a failing disk and under kill -9: the real appliance, loaded
//! by causeway-bench on 127.0.0.1 high ports, with its lease file on a
//! filesystem the test controls.
//!
//! What every test here proves in the end is the store's promise: every
//! lease the bench saw acknowledged is active in the store afterwards, and
//! no address has two holders.
//!
//! Mounting a tmpfs needs root; without it the tests print
//! `SKIP <test>: needs root (...)` and pass. Tools: util-linux (mount,
//! umount). causeway-bench must be built first: `cargo build -p
//! causeway-bench`.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, MessageType};
use support::{
    bench_bin, complete_lines, leases, metric, poll_until, root_or_skip_for, run, wait_for,
    Appliance, DhcpLab, Proc,
};

/// A tmpfs of a fixed size, unmounted on drop (also when the test panics).
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("causeway-test")
            .arg(dir));
        Tmpfs {
            dir: dir.to_owned(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// causeway in relay mode on 127.0.0.1 with its lease file at `lease_file`.
fn relay_lab(lease_file: impl Fn(&Path) -> PathBuf) -> DhcpLab {
    DhcpLab::new("causeway-faults-", |dir, admin, dhcp| {
        support::loopback_dhcp_config(admin, dhcp, &lease_file(dir))
    })
}

/// DORA load from fresh MACs (`seed` keeps runs disjoint), every ACK
/// appended to `acked`; bounded by `duration`.
fn dora_load(lab: &DhcpLab, name: &str, seed: u16, acked: &Path, duration: &str) -> Proc {
    let mut cmd = Command::new(bench_bin());
    cmd.args(["dhcp", "--server", &lab.dhcp.to_string()])
        .args(["--bind", "127.0.0.1:0", "--clients", "200000"])
        .args(["--rate", "2000", "--duration", duration, "--json"])
        .args(["--mac-seed", &seed.to_string()])
        .arg("--acked-file")
        .arg(acked);
    Proc::spawn(name, lab.dir.path(), &mut cmd)
}

/// Every `<mac> <ip>` the bench saw acknowledged, the newest per MAC.
fn acked_leases(files: &[PathBuf]) -> HashMap<String, String> {
    let mut acked = HashMap::new();
    for file in files {
        for line in complete_lines(file) {
            let (mac, ip) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("bad --acked-file line {line:?}"));
            acked.insert(mac.to_ascii_lowercase(), ip.to_owned());
        }
    }
    acked
}

/// The store's promise, checked against what the bench was told: every
/// acknowledged lease is active, and no address went to two clients.
fn assert_every_ack_is_stored(config: &Path, acked: &HashMap<String, String>) {
    let mut holder: HashMap<&str, &str> = HashMap::new();
    for (mac, ip) in acked {
        if let Some(other) = holder.insert(ip, mac) {
            panic!("{ip} was acknowledged to both {other} and {mac}");
        }
    }
    let store = leases(config);
    let mut active: HashMap<String, String> = HashMap::new();
    for l in store.iter().filter(|l| l.state == "active") {
        if let Some(other) = active.insert(l.ip.clone(), l.hw.to_ascii_lowercase()) {
            panic!("{} is active for both {other} and {}", l.ip, l.hw);
        }
    }
    let missing: Vec<_> = acked
        .iter()
        .filter(|(mac, ip)| active.get(*ip) != Some(*mac))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged leases are not active in the store, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
}

fn sample(server: &Appliance, name: &str) -> f64 {
    metric(&server.metrics(), name).unwrap_or_default()
}

#[test]
fn a_full_lease_disk_stops_acks_drops_readiness_and_recovers_without_loss() {
    let test = "a_full_lease_disk_stops_acks_drops_readiness_and_recovers_without_loss";
    if !root_or_skip_for(test, "mounting a tmpfs") {
        return;
    }
    let lab = relay_lab(|dir| dir.join("disk/leases.jsonl"));
    let lease_file = lab.dir.path().join("disk/leases.jsonl");
    let compacting = lab.dir.path().join("disk/leases.compacting");
    // The log is padded past the compaction threshold, so the first lease
    // written after start begins a compaction, whose output (the newest of
    // the padding's 4,000 addresses, about 600 KB) cannot fit in what is
    // left: the compaction meets ENOSPC on the full disk.
    let disk = Tmpfs::mount(&lab.dir.path().join("disk"), "40m");
    support::pad_lease_log(&lease_file, 200_000);
    // Most of what is left goes to a file the test removes to give space
    // back; the log gets about 2,000 leases before it is full.
    let filler = disk.dir.join("filler");
    let free = free_bytes(&disk.dir);
    let left = 256 * 1024;
    assert!(
        free > left + 1024 * 1024,
        "the padding left only {free} bytes of the tmpfs free"
    );
    fs::write(&filler, vec![0u8; (free - left) as usize]).unwrap();
    assert!(free_bytes(&disk.dir) <= left);

    let server = lab.start("causeway");
    let acked = lab.dir.path().join("acked.txt");
    let mut load = dora_load(&lab, "causeway-bench", 1, &acked, "120s");

    // Full: readiness drops, the failure is counted by cause.
    wait_store_failed(&server, &load, "no_space", Duration::from_secs(60));
    let first_failure = complete_lines(&acked).len();
    // The compaction failed for want of space and left nothing behind.
    wait_for(
        "the compaction to fail on the full disk",
        Duration::from_secs(60),
        || (sample(&server, "causeway_dhcp_store_compaction_failures_total") >= 1.0).then_some(()),
        || debug(&server, &load),
    );
    assert!(
        server
            .proc
            .output()
            .lines()
            .any(|l| l.contains("lease log compaction failed") && l.contains("No space left")),
        "the compaction did not fail with ENOSPC\n{}",
        debug(&server, &load)
    );
    assert!(
        !compacting.exists(),
        "the failed compaction left {} on the full disk",
        compacting.display()
    );
    assert_eq!(
        sample(&server, "causeway_dhcp_store_compactions_total"),
        0.0,
        "a compaction finished on the full disk"
    );

    // A failed batch may have been larger than the room left in the log's
    // last page, which a smaller one can still use: the disk is full for
    // good once no page is free and that room is less than any record.
    wait_for(
        "the lease disk to be full to the last page",
        Duration::from_secs(30),
        || {
            let room = last_page_room(&lease_file);
            (lab_readyz(&server) == Some(503)
                && free_bytes(&disk.dir) == 0
                && room < shortest_new_record(&lease_file))
            .then_some(())
        },
        || debug(&server, &load),
    );
    let full = complete_lines(&acked).len();
    // From then until space is given back, REQUESTs keep coming and no ACK
    // leaves (the server's count, and the bench's record, both unchanged).
    let window = no_acks_while(&server, &load, &acked, Duration::from_secs(3));
    assert!(sample(&server, "causeway_dhcp_store_errors_total") >= 1.0);

    // Space returns: the store turns good by itself and ACKs resume.
    let before = complete_lines(&acked).len();
    fs::remove_file(&filler).unwrap();
    wait_for(
        "/readyz and ACKs to come back once space is free",
        Duration::from_secs(30),
        || {
            (lab_readyz(&server) == Some(200) && complete_lines(&acked).len() >= before + 500)
                .then_some(())
        },
        || debug(&server, &load),
    );
    load.signal("INT");
    load.wait_exit(Duration::from_secs(15));
    server.stop();
    assert!(!compacting.exists(), "a compaction output was left behind");

    let acked = acked_leases(&[acked]);
    assert!(acked.len() >= before + 500, "{} ACKs", acked.len());
    assert_every_ack_is_stored(&lab.config, &acked);
    eprintln!(
        "{test}: {} acknowledged leases, all stored; {} before the first failed write, \
         {} more before the last page filled; while full: {window}",
        acked.len(),
        first_failure,
        full - first_failure,
    );
    drop(disk);
}

/// Free bytes of the filesystem at `dir`, as `stat -f` reports them.
fn free_bytes(dir: &Path) -> u64 {
    let out = run(Command::new("stat").args(["-f", "-c", "%a %S"]).arg(dir));
    let (blocks, size) = out.trim().split_once(' ').unwrap();
    blocks.parse::<u64>().unwrap() * size.parse::<u64>().unwrap()
}

/// What can still be appended to `file` without a new page.
fn last_page_room(file: &Path) -> u64 {
    let len = fs::metadata(file).unwrap().len();
    (4096 - len % 4096) % 4096
}

/// The shortest lease line the server wrote (the padding excluded).
fn shortest_new_record(file: &Path) -> u64 {
    complete_lines(file)
        .iter()
        .filter(|l| l.contains("\"10.200."))
        .map(|l| l.len() as u64 + 1)
        .min()
        .unwrap_or(0)
}

/// From now, for at least `least` and until over 500 REQUESTs have
/// arrived (60 s at most), no ACK may leave: the server's ACK count and
/// the bench's record of ACKs must not move. Samples every 50 ms so that
/// a single ACK is reported with its time; returns what was seen.
fn no_acks_while(server: &Appliance, load: &Proc, acked: &Path, least: Duration) -> String {
    let start = Instant::now();
    let (acks, bench_acks, requests) = (
        ack_count(server),
        complete_lines(acked).len(),
        request_count(server),
    );
    let mut seen = requests;
    while start.elapsed() < least || seen < requests + 500.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} REQUESTs arrived in 60 s with the store failing\n{}",
            seen - requests,
            debug(server, load)
        );
        let (now_acks, now_bench) = (ack_count(server), complete_lines(acked).len());
        assert!(
            now_acks == acks && now_bench == bench_acks,
            "an ACK left {:?} into the failure: the server counted {} more, the bench {} more\n{}",
            start.elapsed(),
            now_acks - acks,
            now_bench - bench_acks,
            debug(server, load)
        );
        seen = request_count(server);
        // A sampling interval, not a wait for anything.
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ack_count(server), acks);
    assert_eq!(complete_lines(acked).len(), bench_acks);
    format!(
        "0 ACKs in {:.1} s while {} REQUESTs arrived",
        start.elapsed().as_secs_f64(),
        request_count(server) - requests
    )
}

/// An ext4 filesystem on a loop device over a file in the test's
/// directory; unmounted and detached on drop (also when the test panics).
struct LoopExt4 {
    dir: PathBuf,
    device: String,
}

impl LoopExt4 {
    fn make(backing: &Path, dir: &Path) -> LoopExt4 {
        fs::File::create(backing)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(backing)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
        run(Command::new("mkfs.ext4").args(["-q", "-F", &device]));
        let fs = LoopExt4 {
            dir: dir.to_owned(),
            device,
        };
        fs.mount();
        fs
    }

    fn mount(&self) {
        fs::create_dir_all(&self.dir).unwrap();
        run(Command::new("mount").arg(&self.device).arg(&self.dir));
    }

    fn unmount(&self) {
        run(Command::new("umount").arg(&self.dir));
    }

    /// EXT4_IOC_SHUTDOWN with EXT4_GOING_FLAGS_DEFAULT: from here on every
    /// write, sync, truncate and open on the filesystem fails with EIO, as
    /// on a disk that has died; what was synced before stays.
    ///
    /// DEFAULT freezes the filesystem (in-flight writes and syncs finish
    /// and commit), marks it shut down and thaws it, leaving the journal
    /// intact. NOLOGFLUSH instead aborts the journal under a running
    /// fdatasync, and as we read jbd2 that fdatasync can then return 0 for
    /// a transaction the abort discarded (a transaction no longer running
    /// or committing is reported done, without asking whether the journal
    /// was aborted). CI once lost exactly one acknowledged lease that way,
    /// the last one, whose sync raced the shutdown: a success reported for
    /// data never written, which no store can guard against and which a
    /// disk that really fails does not produce (its write or flush errors
    /// reach the fdatasync).
    fn fail_with_eio(&self) {
        // The ioctl from python3 (already a test dependency), since the
        // test crate has no unsafe code: _IOR('X', 125, u32), flag 0.
        run(Command::new("python3")
            .args([
                "-c",
                "import fcntl, os, struct, sys; \
                 fd = os.open(sys.argv[1], os.O_RDONLY); \
                 fcntl.ioctl(fd, 0x8004587D, struct.pack('I', 0))",
            ])
            .arg(&self.dir));
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// A real EIO from the kernel. Device-mapper's `error` and `flakey`
/// targets are the usual way, but the kernels this runs on (CI's
/// included) are built without device-mapper (no /dev/mapper/control), so
/// the test stops an ext4 filesystem on a loop device with
/// EXT4_IOC_SHUTDOWN instead: the same EIO, from the same syscalls, for
/// every write, fdatasync and truncate the store makes.
#[test]
fn a_lease_disk_that_fails_with_eio_stops_acks_drops_readiness_and_loses_nothing() {
    let test = "a_lease_disk_that_fails_with_eio_stops_acks_drops_readiness_and_loses_nothing";
    if !root_or_skip_for(test, "a loop device and an ext4 mount") {
        return;
    }
    let lab = relay_lab(|dir| dir.join("disk/leases.jsonl"));
    let disk = LoopExt4::make(
        &lab.dir.path().join("disk.img"),
        &lab.dir.path().join("disk"),
    );
    let server = lab.start("causeway");
    // The bench's record of ACKs is on the test's own disk, not the one
    // that fails.
    let acked = lab.dir.path().join("acked.txt");
    let mut load = dora_load(&lab, "causeway-bench", 3, &acked, "120s");
    wait_for(
        "500 ACKs before the disk fails",
        Duration::from_secs(30),
        || (complete_lines(&acked).len() >= 500).then_some(()),
        || debug(&server, &load),
    );

    disk.fail_with_eio();
    let before = complete_lines(&acked).len();
    wait_store_failed(&server, &load, "io", Duration::from_secs(30));
    // From /readyz 503 until the kill, requests keep coming and no ACK
    // leaves.
    let window = no_acks_while(&server, &load, &acked, Duration::from_secs(3));
    let during = complete_lines(&acked).len();
    // The disk is replaced, as an operator would: stop the server, mount
    // the filesystem again (its journal replays), start on the same file.
    let mut server = server;
    server.proc.kill9();
    load.signal("INT");
    load.wait_exit(Duration::from_secs(15));
    assert_eq!(
        complete_lines(&acked).len(),
        during,
        "an ACK arrived after the window, from a killed server"
    );
    disk.unmount();
    disk.mount();
    let restarted = lab.start("causeway-restarted");
    let acked = acked_leases(&[acked]);
    assert!(acked.len() >= 500, "{} ACKs", acked.len());
    let renewed = assert_every_ack_is_held_by(&restarted, lab.dhcp, &acked);
    restarted.stop();
    assert_every_ack_is_stored(&lab.config, &acked);
    eprintln!(
        "{test}: {} acknowledged leases, {before} when it failed; while failing: {window}; \
         after the remount and restart all {} held by their clients in /leases, {renewed} renewed \
         with the same address, no address with two holders",
        acked.len(),
        acked.len(),
    );
    drop(disk);
}

/// The restarted server's own view: every acknowledged lease is active for
/// its client in `/leases`, no address has two holders, and each client's
/// renewal (REQUEST with ciaddr, through the relay) is ACKed with the same
/// address. Returns how many renewed.
fn assert_every_ack_is_held_by(
    server: &Appliance,
    dhcp: std::net::SocketAddr,
    acked: &HashMap<String, String>,
) -> usize {
    let Some((200, body)) = server.admin.get("/leases") else {
        panic!("/leases did not answer\n{}", server.proc.describe());
    };
    let served: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let mut holder: HashMap<String, String> = HashMap::new();
    for l in served.iter().filter(|l| l["state"] == "active") {
        let (ip, hw) = (
            l["ip"].as_str().unwrap_or_default().to_owned(),
            l["hw"].as_str().unwrap_or_default().to_ascii_lowercase(),
        );
        if let Some(other) = holder.insert(ip.clone(), hw.clone()) {
            panic!("the restarted server holds {ip} for both {other} and {hw}");
        }
    }
    let missing: Vec<_> = acked
        .iter()
        .filter(|(mac, ip)| holder.get(*ip) != Some(*mac))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged leases are not held by their clients in the restarted server, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    let mut relay = support::Relay::new(dhcp);
    let deadline = Instant::now() + Duration::from_secs(60);
    for (mac, ip) in acked {
        assert!(Instant::now() < deadline, "renewals took over 60 s");
        let hw = parse_mac(mac);
        let ip: std::net::Ipv4Addr = ip.parse().unwrap();
        let mut cid = vec![1u8];
        cid.extend_from_slice(&hw);
        let reply = relay.try_renew(hw, ip, &[DhcpOption::ClientIdentifier(cid)]);
        let got = reply.as_ref().map(|r| (r.opts().msg_type(), r.yiaddr()));
        assert_eq!(
            got,
            Some((Some(MessageType::Ack), ip)),
            "{mac} renewing {ip} after the restart\n{}",
            server.proc.describe()
        );
    }
    acked.len()
}

fn parse_mac(mac: &str) -> [u8; 6] {
    let mut hw = [0u8; 6];
    for (b, part) in hw.iter_mut().zip(mac.split(':')) {
        *b = u8::from_str_radix(part, 16).unwrap();
    }
    hw
}

fn debug(server: &Appliance, load: &Proc) -> String {
    format!("{}\n{}", load.describe(), server.proc.describe())
}

/// Waits for the store to go bad: `/readyz` 503 and
/// `causeway_dhcp_store_healthy 0`, with the failure counted as `error`.
fn wait_store_failed(server: &Appliance, load: &Proc, error: &str, timeout: Duration) {
    wait_for(
        "/readyz to fail with the lease store",
        timeout,
        || {
            matches!(lab_readyz(server), Some(503))
                .then_some(())
                .filter(|_| sample(server, "causeway_dhcp_store_healthy") == 0.0)
        },
        || debug(server, load),
    );
    assert!(
        sample(
            server,
            &format!(r#"causeway_dhcp_store_failures_total{{error="{error}"}}"#)
        ) >= 1.0,
        "the failure is counted as {error}\n{}",
        debug(server, load)
    );
}

fn lab_readyz(server: &Appliance) -> Option<u16> {
    server.admin.get("/readyz").map(|(code, _)| code)
}

fn ack_count(server: &Appliance) -> f64 {
    sample(server, r#"causeway_dhcp_sent_total{type="ack"}"#)
}

fn request_count(server: &Appliance) -> f64 {
    sample(server, r#"causeway_dhcp_received_total{type="request"}"#)
}

#[test]
fn acknowledged_leases_survive_kill_9_during_compaction() {
    let lab = relay_lab(|dir| dir.join("leases.jsonl"));
    let lease_file = lab.dir.path().join("leases.jsonl");
    let compacting = lab.dir.path().join("leases.compacting");
    let rounds = 4;
    let mut during = 0;
    let mut files = Vec::new();
    for round in 0..rounds {
        support::pad_lease_log(&lease_file, 200_000);
        let mut server = lab.start(&format!("causeway-{round}"));
        let acked = lab.dir.path().join(format!("acked-{round}.txt"));
        let mut load = dora_load(&lab, &format!("bench-{round}"), 100 + round, &acked, "60s");
        wait_for(
            "a compaction to begin under load",
            Duration::from_secs(60),
            || compacting.exists().then_some(()),
            || format!("{}\n{}", load.describe(), server.proc.describe()),
        );
        // Let ACKs flow while it runs, then kill it mid-way if it still is.
        let base = complete_lines(&acked).len();
        poll_until(Duration::from_secs(10), || {
            (!compacting.exists() || complete_lines(&acked).len() >= base + 200).then_some(())
        });
        let still = compacting.exists();
        server.proc.kill9();
        during += usize::from(still);
        load.signal("INT");
        load.wait_exit(Duration::from_secs(15));
        files.push(acked);
    }
    assert!(
        during >= rounds as usize / 2,
        "only {during} of {rounds} kills landed during a compaction"
    );
    let server = lab.start("causeway-final");
    assert!(!compacting.exists(), "the unfinished compaction is removed");
    let acked = acked_leases(&files);
    assert!(acked.len() >= 200 * rounds as usize, "{} ACKs", acked.len());
    assert_every_ack_is_stored(&lab.config, &acked);
    server.stop();
    eprintln!(
        "acknowledged_leases_survive_kill_9_during_compaction: {} acknowledged leases over \
         {rounds} kill -9s ({during} during a compaction), all stored, none shared",
        acked.len()
    );
}

#[test]
fn corrupt_lease_lines_are_skipped_with_a_warning_and_a_metric() {
    let lab = relay_lab(|dir| dir.join("leases.jsonl"));
    let lease_file = lab.dir.path().join("leases.jsonl");
    fs::write(
        &lease_file,
        concat!(
            r#"{"ip":"10.200.0.10","client":"01:02:00:00:00:00:0a","hw":"02:00:00:00:00:0a","state":"active","expires":4000000000}"#,
            "\nnot a lease\n",
            r#"{"ip":"10.200.0.11","client":"zz","hw":"02:00:00:00:00:0b","state":"active","expires":4000000000}"#,
            "\n",
        ),
    )
    .unwrap();
    let server = lab.start("causeway");
    assert_eq!(
        sample(&server, "causeway_dhcp_store_corrupt_lines_total"),
        2.0
    );
    let warned = server
        .proc
        .output()
        .lines()
        .any(|l| l.contains("WARN") && l.contains("lease log lines skipped"));
    assert!(warned, "no warning\n{}", server.proc.describe());
    let served = server
        .admin
        .get("/leases")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(served.contains("10.200.0.10"), "{served}");
    server.stop();
}

/// A filesystem frozen with `fsfreeze -f`: every write and sync on it
/// blocks until it is thawed, as on a disk that has stopped answering.
/// Thawed on drop, so a failing test leaves no process stuck on it.
struct Frozen<'a>(&'a Path);

impl<'a> Frozen<'a> {
    fn freeze(dir: &'a Path) -> Frozen<'a> {
        run(Command::new(support::tool("fsfreeze", "util-linux"))
            .arg("-f")
            .arg(dir));
        Frozen(dir)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(self.0).status();
    }
}

const MAX_IN_FLIGHT: f64 = 64.0;

#[test]
fn a_stalled_lease_disk_holds_at_most_max_in_flight_and_drops_the_rest_as_overloaded() {
    let test = "a_stalled_lease_disk_holds_at_most_max_in_flight_and_drops_the_rest_as_overloaded";
    if !root_or_skip_for(test, "a loop device, an ext4 mount and fsfreeze") {
        return;
    }
    let lab = DhcpLab::new("causeway-faults-", |dir, admin, dhcp| {
        let config = support::loopback_dhcp_config(admin, dhcp, &dir.join("disk/leases.jsonl"));
        let limited = config.replace(
            "  leaseTime: 1h\n",
            &format!("  leaseTime: 1h\n  maxInFlight: {MAX_IN_FLIGHT}\n"),
        );
        assert_ne!(limited, config);
        limited
    });
    let disk = LoopExt4::make(
        &lab.dir.path().join("disk.img"),
        &lab.dir.path().join("disk"),
    );
    let server = lab.start("causeway");
    let acked = lab.dir.path().join("acked.txt");
    let mut load = dora_load(&lab, "causeway-bench", 5, &acked, "120s");
    wait_for(
        "200 ACKs before the disk stalls",
        Duration::from_secs(30),
        || (complete_lines(&acked).len() >= 200).then_some(()),
        || debug(&server, &load),
    );

    let frozen = Frozen::freeze(&disk.dir);
    // Replies wait for the stalled store until maxInFlight of them do;
    // every request past that is dropped as overloaded.
    let overloaded = r#"causeway_dhcp_dropped_total{reason="overloaded"}"#;
    let mut most_in_flight = 0.0f64;
    wait_for(
        "maxInFlight replies waiting and 500 requests dropped as overloaded",
        Duration::from_secs(30),
        || {
            let text = server.metrics();
            let in_flight = metric(&text, "causeway_dhcp_in_flight").unwrap_or_default();
            most_in_flight = most_in_flight.max(in_flight);
            (in_flight == MAX_IN_FLIGHT && metric(&text, overloaded).unwrap_or_default() >= 500.0)
                .then_some(())
        },
        || debug(&server, &load),
    );
    // Held there: for three seconds of samples no more wait, no ACK leaves
    // and the drops go on.
    let acks_held = ack_count(&server);
    let dropped_held = sample(&server, overloaded);
    let until = Instant::now() + Duration::from_secs(3);
    let mut samples = 0;
    while Instant::now() < until {
        let text = server.metrics();
        let in_flight = metric(&text, "causeway_dhcp_in_flight").unwrap_or_default();
        most_in_flight = most_in_flight.max(in_flight);
        samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let acks_after = ack_count(&server);
    let dropped_after = sample(&server, overloaded);
    assert!(
        most_in_flight <= MAX_IN_FLIGHT,
        "{most_in_flight} replies waited for the store, past maxInFlight {MAX_IN_FLIGHT}"
    );
    assert_eq!(
        acks_after, acks_held,
        "ACKs left while the disk was stalled"
    );
    // The bench's clients wait out their timeouts for replies that never
    // come, so fewer than its 2,000/s arrive; those that do are dropped.
    assert!(
        dropped_after >= dropped_held + 100.0,
        "requests were not dropped as overloaded while the disk stalled: {dropped_held} then {dropped_after}"
    );

    // The disk answers again: what waited is written and answered, and
    // new requests are served.
    let before = complete_lines(&acked).len();
    drop(frozen);
    wait_for(
        "ACKs to resume once the disk answers",
        Duration::from_secs(30),
        || (complete_lines(&acked).len() >= before + 500).then_some(()),
        || debug(&server, &load),
    );
    load.signal("INT");
    load.wait_exit(Duration::from_secs(15));
    server.stop();
    let acked = acked_leases(&[acked]);
    assert_every_ack_is_stored(&lab.config, &acked);
    eprintln!(
        "{test}: at most {most_in_flight} replies waited in {samples} samples over 3 s of stall; \
         {} dropped as overloaded in them; {} acknowledged leases, all stored",
        dropped_after - dropped_held,
        acked.len()
    );
    drop(disk);
}
