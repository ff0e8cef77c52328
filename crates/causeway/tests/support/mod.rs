//! Shared helpers for the end-to-end suites: network namespaces that clean
//! up after themselves, child processes that die with the test, bounded
//! waits, and the appliance's admin endpoints.
//!
//! Hygiene rules every suite relies on:
//! - namespaces are named `cwe2e-<pid>-<n>-<role>`, are created by the test
//!   and deleted on drop (also when the test panics); a later run deletes
//!   any left behind by a test process that no longer exists;
//! - veth pairs are created directly inside those namespaces, so nothing
//!   ever appears in, or is changed in, the host's network namespace;
//! - every wait has a deadline and waits for a condition, never a fixed time.

// Each suite uses a different subset of these helpers, and helpers report a
// broken precondition by panicking, as tests do.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Decodable, Decoder, Encodable};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, Once};
use std::time::{Duration, Instant};

/// How often bounded waits re-check their condition.
const POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------- privileges

/// Whether this process runs with effective uid 0 (read from /proc, as the
/// tests may not link libc).
pub fn is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .is_some_and(|euid| euid == "0")
}

/// `true` when the test may go on; otherwise prints the SKIP line.
#[must_use]
pub fn root_or_skip(test: &str) -> bool {
    root_or_skip_for(test, "network namespaces")
}

/// [`root_or_skip`], naming what root is needed for.
#[must_use]
pub fn root_or_skip_for(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    // Straight to the stderr stream: libtest captures eprintln!, and a skip
    // must be seen without --nocapture.
    let _ = writeln!(std::io::stderr(), "SKIP {test}: needs root ({why})");
    false
}

/// The appliance config of a DHCP server in relay mode on loopback: subnet
/// 10.200.0.0/16, relay 127.0.0.1, leases for an hour in `lease_file`.
pub fn loopback_dhcp_config(admin: SocketAddr, dhcp: SocketAddr, lease_file: &Path) -> String {
    format!(
        r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {}
  leaseTime: 1h
  subnets:
    - cidr: 10.200.0.0/16
      relayAddresses: [127.0.0.1]
      serverId: 127.0.0.1
      router: [10.200.0.1]
      dnsServers: [10.200.0.2]
"#,
        lease_file.display()
    )
}

/// The appliance serving DHCP on a 127.0.0.1 relay port from a config of
/// the test's own, in a temp dir that holds the config, the lease file and
/// every process log.
pub struct DhcpLab {
    pub dir: tempfile::TempDir,
    pub dhcp: SocketAddr,
    pub admin: SocketAddr,
    pub config: PathBuf,
}

impl DhcpLab {
    /// `config` writes the config text from the temp dir, the admin
    /// address and the DHCP address.
    pub fn new(
        prefix: &str,
        config: impl FnOnce(&Path, SocketAddr, SocketAddr) -> String,
    ) -> DhcpLab {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
        let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
        let path = dir.path().join("causeway.yaml");
        fs::write(&path, config(dir.path(), admin, dhcp)).unwrap();
        DhcpLab {
            dir,
            dhcp,
            admin,
            config: path,
        }
    }

    pub fn start(&self, name: &str) -> Appliance {
        Appliance::start(
            name,
            self.dir.path(),
            None,
            &self.config,
            AdminAt::Host(self.admin),
        )
    }
}

/// The absolute path of a tool the test needs. A missing tool fails the
/// test: CI installs them, so their absence is a broken environment.
pub fn tool(name: &str, debian_package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path
        .split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"]);
    for dir in dirs.filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("required tool `{name}` not found: install the Debian package `{debian_package}`");
}

/// The `causeway` binary under test.
pub fn causeway_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_causeway"))
}

/// `causeway-bench`, which cargo builds only when asked to.
pub fn bench_bin() -> PathBuf {
    let path = causeway_bin().with_file_name("causeway-bench");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p causeway-bench` first (same profile and target dir as the tests)",
        path.display()
    );
    path
}

// ---------------------------------------------------------------- waiting

/// Polls `probe` until it returns `Some`, at most `timeout`.
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Polls `probe` until it returns `Some`, or panics after `timeout` with
/// `what` and the diagnostics `context` produces.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    probe: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    poll_until(timeout, probe).unwrap_or_else(|| {
        panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        )
    })
}

/// Count of complete (newline-terminated) lines in a file; 0 if absent.
pub fn complete_lines(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------- ports

/// Ports and addresses of this process's own on loopback: no bind,
/// release and hope.
#[allow(unused_imports)] // not every tier uses every one
pub use causeway_test_ports::{reserved_port, reserved_port_on, unique_loopback};

// ---------------------------------------------------------------- commands

/// Runs a short command to completion; panics with its output on failure.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip_tool() -> PathBuf {
    tool("ip", "iproute2")
}

/// Sends a signal by name (`TERM`, `KILL`, `INT`, `USR1`, ...) to one pid.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------- namespaces

static NEXT_NS: AtomicUsize = AtomicUsize::new(0);
static SWEEP: Once = Once::new();
const NS_PREFIX: &str = "cwe2e-";

/// Deletes namespaces left by earlier test processes that were killed
/// before their guards ran (the pid in the name no longer exists).
fn sweep_stale_namespaces() {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NS_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new(ip_tool())
                .args(["netns", "delete", &name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A network namespace owned by the test, with `lo` up. Deleted on drop,
/// which also deletes every veth end inside it.
pub struct Netns {
    name: String,
}

impl Netns {
    /// `true` once something accepts TCP connections at `addr` here.
    pub fn tcp_open(&self, addr: &str) -> bool {
        let Some((host, port)) = addr.rsplit_once(':') else {
            return false;
        };
        self.command("bash")
            .args(["-c", &format!("exec 3<>/dev/tcp/{host}/{port}")])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn new(role: &str) -> Netns {
        SWEEP.call_once(sweep_stale_namespaces);
        let n = NEXT_NS.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NS_PREFIX}{}-{n}-{role}", std::process::id());
        run(Command::new(ip_tool()).args(["netns", "add", &name]));
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> <args>`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        run(Command::new(ip_tool()).arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs `program` inside this namespace.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(ip_tool());
        cmd.args(["netns", "exec", &self.name])
            .arg(program.as_ref());
        cmd
    }

    /// A veth pair from `self` to `peer`, both ends up, created directly in
    /// the two namespaces. `None` MACs are left to the kernel.
    pub fn veth_to(
        &self,
        if_here: &str,
        mac_here: Option<&str>,
        peer: &Netns,
        if_there: &str,
        mac_there: Option<&str>,
    ) {
        let mut args: Vec<&str> = vec!["link", "add", if_here, "netns", &self.name];
        if let Some(mac) = mac_here {
            args.extend(["address", mac]);
        }
        args.extend([
            "type", "veth", "peer", "name", if_there, "netns", &peer.name,
        ]);
        if let Some(mac) = mac_there {
            args.extend(["address", mac]);
        }
        run(Command::new(ip_tool()).args(&args));
        self.ip(&["link", "set", if_here, "up"]);
        peer.ip(&["link", "set", if_there, "up"]);
    }

    /// A GET to `127.0.0.1:<port><path>` from inside the namespace (curl),
    /// as `(status, body)`; `None` if nothing answered.
    pub fn http_get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        netns_http_get(&self.name, port, path)
    }

    /// A GET to `http://<host>:<port><path>` from inside the namespace.
    pub fn http_get_at(&self, host: &str, port: u16, path: &str) -> Option<(u16, String)> {
        netns_http_get_at(&self.name, host, port, path)
    }
}

fn netns_http_get(ns: &str, port: u16, path: &str) -> Option<(u16, String)> {
    netns_http_get_at(ns, "127.0.0.1", port, path)
}

fn netns_http_get_at(ns: &str, host: &str, port: u16, path: &str) -> Option<(u16, String)> {
    let out = Command::new(ip_tool())
        .args(["netns", "exec", ns])
        .arg(tool("curl", "curl"))
        .args(["-sS", "--max-time", "3", "-o", "-", "-w", "\n%{http_code}"])
        .arg(format!("http://{host}:{port}{path}"))
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_owned()))
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = Command::new(ip_tool())
            .args(["netns", "delete", &self.name])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "warning: ip netns delete {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("warning: ip netns delete {}: {e}", self.name),
        }
    }
}

/// A TCP service of the test's own namespace (the suite's API server),
/// reached from inside a namespace the test made: the test accepts there
/// and connects to the real server from its own namespace, as kube-proxy
/// carries a Service address to its endpoint. `cut` closes every
/// connection and refuses new ones, as a lost route would.
pub struct Forward {
    pub port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Forward {
    /// On an unused port of `127.0.0.1` inside `ns`.
    pub fn start(ns: &Netns, upstream: SocketAddr) -> Forward {
        Forward::start_at(ns, "127.0.0.1:0".parse().unwrap(), upstream)
    }

    /// On `listen` inside `ns` (an address the namespace holds).
    pub fn start_at(ns: &Netns, listen: SocketAddr, upstream: SocketAddr) -> Forward {
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (conn_tx, conn_rx) = mpsc::channel::<TcpStream>();
        // Connects to the API server from the test's own namespace: a
        // thread started here, before any thread enters the replica's.
        {
            let (cut, open) = (cut.clone(), open.clone());
            std::thread::spawn(move || {
                for inbound in conn_rx {
                    if cut.load(Ordering::Relaxed) {
                        continue;
                    }
                    let Ok(outbound) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    {
                        let mut o = open.lock().unwrap();
                        o.push(inbound.try_clone().unwrap());
                        o.push(outbound.try_clone().unwrap());
                    }
                    for (mut from, mut to) in [
                        (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                        (outbound, inbound),
                    ] {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            });
        }
        let (port_tx, port_rx) = mpsc::channel();
        let ns_path = format!("/run/netns/{}", ns.name());
        {
            let (cut, stop) = (cut.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = fs::File::open(&ns_path).unwrap();
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let listener = TcpListener::bind(listen).unwrap();
                listener.set_nonblocking(true).unwrap();
                port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(false).unwrap();
                            if !cut.load(Ordering::Relaxed) {
                                let _ = conn_tx.send(s);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        Forward {
            port: port_rx.recv_timeout(Duration::from_secs(5)).unwrap(),
            cut,
            open,
            stop,
        }
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

/// dnsmasq reading no file, no resolv.conf and no hosts file, in the
/// foreground, logging to its output: it serves only what its further
/// arguments say (listen address, records).
pub const DNSMASQ_ALONE: [&str; 7] = [
    "--keep-in-foreground",
    "--conf-file=/dev/null",
    "--no-resolv",
    "--no-hosts",
    "--no-poll",
    "--bind-interfaces",
    "--log-facility=-",
];

/// Sets the soft open-files limit of a running process (its hard limit,
/// and so the way back up, is left alone).
pub fn set_open_files(pid: u32, soft: u64) {
    run(Command::new(tool("prlimit", "util-linux"))
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={soft}:")));
}

/// The `n`th lowest descriptor number `pid` has free (0 for the lowest):
/// the one its next open would get after `n` more. The soft open-files
/// limit caps descriptor numbers, not their count, so a limit at the
/// lowest free number leaves none, and at the next one, exactly one.
pub fn free_descriptor(pid: u32, n: usize) -> u64 {
    let used: std::collections::BTreeSet<u64> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..).filter(|d| !used.contains(d)).nth(n).unwrap()
}

/// A dhclient hook script (`-sf`) at `hook`: it sets only the leased
/// address, on the interface dhclient runs on (in the namespace it runs
/// in), and appends `record` (a shell word list such as
/// `$reason ip=$new_ip_address`) to `log` for each event. It never touches
/// resolv.conf, routes or the hostname.
pub fn dhclient_hook(hook: &Path, log: &Path, record: &str) {
    fs::write(
        hook,
        format!(
            "#!/bin/sh\n# causeway test hook: only the leased address, in the client's own namespace; never resolv.conf, routes or the hostname.\ncase \"$reason\" in\n  BOUND|RENEW|REBIND|REBOOT) '{ip}' addr replace \"$new_ip_address/$new_subnet_mask\" dev \"$interface\" ;;\nesac\necho \"{record}\" >> '{log}'\nexit 0\n",
            ip = tool("ip", "iproute2").display(),
            log = log.display()
        ),
    )
    .unwrap();
    let executable = <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    fs::set_permissions(hook, executable).unwrap();
}

// ---------------------------------------------------------------- processes

/// A child process with its stdout and stderr in one log file. Dropping it
/// stops the process: SIGTERM, then SIGKILL if it has not exited within
/// two seconds. When the test is panicking, the log's tail is printed.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `cmd` with its output in `<dir>/<name>.log`. The program must
    /// keep the pid it was started with (`ip netns exec`, `unshare` without
    /// `--fork` and `sh -c 'exec ...'` all do), so that signals reach it.
    pub fn spawn(name: &str, dir: &Path, cmd: &mut Command) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).expect("creating a process log");
        let err = out.try_clone().expect("cloning a log handle");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name: name.to_owned(),
            child,
            log,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `--json` summary a causeway-bench command printed last: the
    /// last line of its log that is a JSON object.
    pub fn json_summary(&self) -> serde_json::Value {
        let out = self.output();
        let line = out
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or_else(|| panic!("no JSON summary\n{}", self.describe()));
        serde_json::from_str(line).unwrap()
    }

    pub fn signal(&self, sig: &str) {
        assert!(
            self.status.is_some() || signal(self.pid(), sig),
            "could not send SIG{sig} to {} (pid {})",
            self.name,
            self.pid()
        );
    }

    /// The exit status if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits for the process to exit, at most `timeout`; panics otherwise.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let name = self.name.clone();
        let log = self.log.clone();
        wait_for(
            &format!("{name} to exit"),
            timeout,
            || self.try_status(),
            || format!("{name} log:\n{}", tail(&log, 40)),
        )
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub fn describe(&self) -> String {
        format!(
            "--- {} (pid {}) log tail:\n{}",
            self.name,
            self.pid(),
            tail(&self.log, 40)
        )
    }

    /// As [`Proc::describe`], leaving out the lines that contain `noise`.
    pub fn describe_without(&self, noise: &str) -> String {
        let bytes = fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let kept: Vec<&str> = text.lines().filter(|l| !l.contains(noise)).collect();
        format!(
            "--- {} (pid {}) log tail, without {noise}:\n{}",
            self.name,
            self.pid(),
            kept[kept.len().saturating_sub(40)..].join("\n")
        )
    }

    /// Stops the process now (SIGKILL) and reaps it.
    pub fn kill9(&mut self) {
        if self.try_status().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            signal(self.pid(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.try_status().is_none() && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
            self.kill9();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.describe());
        }
    }
}

pub fn tail(path: &Path, lines: usize) -> String {
    // Lossy: one byte that is not UTF-8 (a client's hostname, logged)
    // must not hide the whole log.
    let bytes = fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------- admin

/// Where an appliance's admin server listens.
#[derive(Clone)]
pub enum AdminAt {
    /// On 127.0.0.1 of the test's own network namespace.
    Host(SocketAddr),
    /// On 127.0.0.1:<port> inside a namespace, reached with curl.
    Netns { ns: String, port: u16 },
    /// On `host:port` inside a namespace (an admin port bound to one
    /// interface, as a pod's is), reached with curl.
    NetnsAt { ns: String, host: String, port: u16 },
}

impl AdminAt {
    /// A GET as `(status, body)`; `None` if nothing answered.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        match self {
            AdminAt::Host(addr) => http_get(*addr, path),
            AdminAt::Netns { ns, port } => netns_http_get(ns, *port, path),
            AdminAt::NetnsAt { ns, host, port } => netns_http_get_at(ns, host, *port, path),
        }
    }
}

/// A minimal HTTP/1.0 GET (no chunking, the server closes the connection).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// The value of one sample in Prometheus text format, by its exact name and
/// label set as exposed (`causeway_dhcp_sent_total{type="ack"}`).
pub fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(key, _)| *key == sample)
        .and_then(|(_, v)| v.parse().ok())
}

// ---------------------------------------------------------------- appliance

/// A running `causeway appliance`, stopped on drop.
pub struct Appliance {
    pub proc: Proc,
    pub config: PathBuf,
    pub admin: AdminAt,
}

/// How long the appliance gets to become ready. A bound, not a figure: a
/// ready appliance is seen at once. A restart on a lease log padded to
/// 800k lines takes 8 s in a debug build on two busy cores and was seen
/// past 20 s with builds running beside the suite, so the bound leaves room.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

impl Appliance {
    /// Starts the appliance (inside `ns` when given) and waits for /readyz.
    pub fn start(
        name: &str,
        dir: &Path,
        ns: Option<&Netns>,
        config: &Path,
        admin: AdminAt,
    ) -> Appliance {
        let mut cmd = match ns {
            Some(ns) => ns.command(causeway_bin()),
            None => Command::new(causeway_bin()),
        };
        cmd.args(["appliance", "--config"]).arg(config);
        let proc = Proc::spawn(name, dir, &mut cmd);
        let mut a = Appliance {
            proc,
            config: config.to_owned(),
            admin,
        };
        a.wait_ready();
        a
    }

    pub fn wait_ready(&mut self) {
        let admin = self.admin.clone();
        let proc = &mut self.proc;
        // Some(Err(status)): the appliance exited instead.
        let outcome = poll_until(READY_TIMEOUT, || {
            if let Some(status) = proc.try_status() {
                return Some(Err(status));
            }
            admin
                .get("/readyz")
                .filter(|(code, _)| *code == 200)
                .map(|_| Ok(()))
        });
        match outcome {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "the appliance exited ({status}) before it was ready\n{}",
                self.proc.describe()
            ),
            None => panic!(
                "the appliance was not ready on /readyz within {READY_TIMEOUT:?}\n{}",
                self.proc.describe()
            ),
        }
    }

    pub fn metrics(&self) -> String {
        match self.admin.get("/metrics") {
            Some((200, body)) => body,
            other => panic!(
                "/metrics did not answer 200: {other:?}\n{}",
                self.proc.describe()
            ),
        }
    }

    /// Waits until `sample` reaches at least `min`; returns its value.
    pub fn wait_metric_at_least(&self, sample: &str, min: f64, timeout: Duration) -> f64 {
        let mut last = String::new();
        let found = poll_until(timeout, || {
            last = self
                .admin
                .get("/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default();
            metric(&last, sample).filter(|v| *v >= min)
        });
        found.unwrap_or_else(|| {
            let dhcp: Vec<&str> = last
                .lines()
                .filter(|l| l.starts_with("causeway_dhcp_") && !l.contains("_bucket"))
                .collect();
            panic!(
                "timed out after {timeout:?} waiting for {sample} >= {min}; last DHCP metrics:\n{}\n{}",
                dhcp.join("\n"),
                self.proc.describe()
            )
        })
    }

    /// SIGTERM, and the graceful exit (status 0) it must lead to.
    pub fn stop(mut self) {
        self.proc.signal("TERM");
        let status = self.proc.wait_exit(Duration::from_secs(15));
        assert!(
            status.success(),
            "the appliance did not stop cleanly on SIGTERM: {status}\n{}",
            self.proc.describe()
        );
    }
}

/// One record of `causeway leases --json`.
#[derive(Debug, Clone)]
pub struct LeaseView {
    pub ip: String,
    pub hw: String,
    pub client: String,
    pub state: String,
    pub expires: u64,
    pub hostname: Option<String>,
}

/// The lease store as `causeway leases --config <config> --json` reads it.
pub fn leases(config: &Path) -> Vec<LeaseView> {
    let out = run(Command::new(causeway_bin())
        .args(["leases", "--json", "--config"])
        .arg(config));
    let v: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("causeway leases --json printed invalid JSON ({e}):\n{out}"));
    let s = |l: &serde_json::Value, k: &str| l[k].as_str().unwrap_or_default().to_owned();
    v.as_array()
        .unwrap_or_else(|| panic!("causeway leases --json did not print an array:\n{out}"))
        .iter()
        .map(|l| LeaseView {
            ip: s(l, "ip"),
            hw: s(l, "hw"),
            client: s(l, "client"),
            state: s(l, "state"),
            expires: l["expires"].as_u64().unwrap_or_default(),
            hostname: l["hostname"].as_str().map(str::to_owned),
        })
        .collect()
}

// ---------------------------------------------------------------- TLS

/// A self-signed certificate from rcgen with `names` as its SANs and the
/// first as its CN, written as `<dir>/<file>.pem` and `<dir>/<file>.key`.
pub fn tls_cert(dir: &Path, file: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    let (pem, key) = (
        dir.join(format!("{file}.pem")),
        dir.join(format!("{file}.key")),
    );
    let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = rcgen::CertificateParams::new(sans).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names[0]);
    let key_pair = rcgen::KeyPair::generate().unwrap();
    let issued = params.self_signed(&key_pair).unwrap();
    fs::write(&pem, issued.pem()).unwrap();
    fs::write(&key, key_pair.serialize_pem()).unwrap();
    (pem, key)
}

/// The certificate subject line (`subject=CN=...`) that `openssl s_client`
/// prints, run as `s_client` (already given its connect and name
/// arguments); empty when the handshake failed.
pub fn s_client_subject(s_client: &mut Command) -> String {
    let out = s_client
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or("")
        .to_string()
}

/// A process's resident set (VmRSS), in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

// ---------------------------------------------------------------- DHCP

/// A DHCP relay agent on loopback (giaddr 127.0.0.1) talking to a server's
/// relay port: whole exchanges without privileges.
pub struct Relay {
    socket: UdpSocket,
    server: SocketAddr,
    xid: u32,
    giaddr: Ipv4Addr,
}

impl Relay {
    pub fn new(server: SocketAddr) -> Relay {
        Relay::at(Ipv4Addr::LOCALHOST, server)
    }

    /// A relay sending from `address` (one of loopback's 127.0.0.0/8),
    /// which it also writes into giaddr.
    pub fn at(address: Ipv4Addr, server: SocketAddr) -> Relay {
        let socket = UdpSocket::bind((address, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        Relay {
            socket,
            server,
            xid: 0x0cau32 << 16,
            giaddr: address,
        }
    }

    fn message(&mut self, kind: MessageType, mac: [u8; 6], extra: &[DhcpOption]) -> Message {
        self.xid += 1;
        let mut m = Message::default();
        m.set_opcode(Opcode::BootRequest)
            .set_xid(self.xid)
            .set_chaddr(&mac);
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        for o in extra {
            m.opts_mut().insert(o.clone());
        }
        m
    }

    fn send(&self, m: &Message) {
        self.socket
            .send_to(&m.to_vec().unwrap(), self.server)
            .unwrap();
    }

    pub fn exchange(&mut self, kind: MessageType, mac: [u8; 6], extra: &[DhcpOption]) -> Message {
        self.try_exchange(kind, mac, extra)
            .expect("no DHCP reply within 2 s")
    }

    /// The reply to one message, or `None` when none came within 2 s.
    pub fn try_exchange(
        &mut self,
        kind: MessageType,
        mac: [u8; 6],
        extra: &[DhcpOption],
    ) -> Option<Message> {
        let mut m = self.message(kind, mac, extra);
        m.set_giaddr(self.giaddr).set_hops(1);
        self.send(&m);
        let mut buf = [0u8; 1500];
        loop {
            let (n, _) = self.socket.recv_from(&mut buf).ok()?;
            let reply = Message::decode(&mut Decoder::new(&buf[..n])).unwrap();
            if reply.xid() == self.xid {
                return Some(reply);
            }
        }
    }

    /// DISCOVER then REQUEST; the ACK, or `None` when either got no reply
    /// or the reply was not the one a served client gets.
    pub fn try_dora(&mut self, mac: [u8; 6]) -> Option<Message> {
        let offer = self.try_exchange(MessageType::Discover, mac, &[])?;
        if offer.opts().msg_type() != Some(MessageType::Offer) {
            return None;
        }
        let request = [
            DhcpOption::ServerIdentifier(Ipv4Addr::LOCALHOST),
            DhcpOption::RequestedIpAddress(offer.yiaddr()),
        ];
        let ack = self.try_exchange(MessageType::Request, mac, &request)?;
        (ack.opts().msg_type() == Some(MessageType::Ack)).then_some(ack)
    }

    /// DISCOVER then REQUEST, both carrying `extra`; returns the ACK.
    pub fn dora(&mut self, mac: [u8; 6], extra: &[DhcpOption]) -> Message {
        let offer = self.exchange(MessageType::Discover, mac, extra);
        assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
        let mut request = extra.to_vec();
        request.push(DhcpOption::ServerIdentifier(Ipv4Addr::LOCALHOST));
        request.push(DhcpOption::RequestedIpAddress(offer.yiaddr()));
        let ack = self.exchange(MessageType::Request, mac, &request);
        assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
        ack
    }

    /// A client's renewal (RENEWING): a REQUEST with `ip` in ciaddr and
    /// neither a server id nor a requested address, carrying `extra`
    /// (a client id, for one). The reply, or `None` after 2 s.
    pub fn try_renew(
        &mut self,
        mac: [u8; 6],
        ip: Ipv4Addr,
        extra: &[DhcpOption],
    ) -> Option<Message> {
        let mut m = self.message(MessageType::Request, mac, extra);
        m.set_ciaddr(ip).set_giaddr(self.giaddr).set_hops(1);
        self.send(&m);
        let mut buf = [0u8; 1500];
        loop {
            let (n, _) = self.socket.recv_from(&mut buf).ok()?;
            let reply = Message::decode(&mut Decoder::new(&buf[..n])).unwrap();
            if reply.xid() == self.xid {
                return Some(reply);
            }
        }
    }

    /// A client's RELEASE: unicast to the server id, ciaddr set, no reply.
    pub fn release(&mut self, mac: [u8; 6], ip: Ipv4Addr) {
        let mut m = self.message(
            MessageType::Release,
            mac,
            &[DhcpOption::ServerIdentifier(Ipv4Addr::LOCALHOST)],
        );
        m.set_ciaddr(ip);
        self.send(&m);
    }
}

/// libfaketime's preload library (Debian's `libfaketime`, which
/// tests/run.sh installs); its absence is a broken environment.
pub fn libfaketime() -> PathBuf {
    let found = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|dir| Path::new(dir).join("faketime/libfaketimeMT.so.1"))
    .find(|p| p.exists());
    found.expect(
        "libfaketime is not installed (Debian package libfaketime); tests/run.sh installs it",
    )
}

/// Runs `cmd` with its wall clock at the offset written in `offset_file`
/// ("+0", "+2d", "-1h"), read again on every clock call, so the test can
/// step it while the process runs. The monotonic clock is left alone, as a
/// real step (NTP, `date -s`) leaves it, and file times are the kernel's.
pub fn with_faked_wall_clock(cmd: &mut Command, offset_file: &Path) {
    cmd.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", offset_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("NO_FAKE_STAT", "1");
}

/// Sets the offset a [`with_faked_wall_clock`] process reads.
pub fn set_clock_offset(offset_file: &Path, offset: &str) {
    fs::write(offset_file, format!("{offset}\n")).unwrap();
}

/// Appends `lines` records of addresses outside every subnet (the server
/// skips them at start, but they count as log lines), so the first lease
/// written after start begins a compaction (long enough,
/// with 200,000 lines, to be killed in).
pub fn pad_lease_log(lease_file: &Path, lines: u32) {
    let mut out = std::io::BufWriter::new(
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(lease_file)
            .unwrap(),
    );
    for i in 0..lines {
        let host = i % 4000;
        writeln!(
            out,
            r#"{{"ip":"10.99.{}.{}","client":"01:02:99:00:00:{:02x}","hw":"02:99:00:00:00:{:02x}","state":"released","expires":1}}"#,
            host >> 8,
            host & 0xff,
            host & 0xff,
            host & 0xff
        )
        .unwrap();
    }
    out.into_inner().unwrap().sync_all().unwrap();
}

// ---------------------------------------------------------------- ACK log

/// One ACK that causeway-bench recorded in its `--ack-log`.
#[derive(Debug, Clone)]
pub struct Ack {
    /// When the bench received it, unix milliseconds.
    pub at_ms: u64,
    pub mac: String,
    pub ip: String,
    pub lease_secs: u64,
    /// The name the client sent (option 12), if any.
    pub hostname: Option<String>,
}

impl Ack {
    /// When the lease it granted ends, by the bench's clock.
    pub fn ends_ms(&self) -> u64 {
        self.at_ms + self.lease_secs * 1000
    }
}

/// A RELEASE causeway-bench sent: `(unix ms, mac, ip)`.
pub type Release = (u64, String, String);

/// A `--ack-log`, in the order written (the order received).
pub struct AckLog {
    pub acks: Vec<Ack>,
    pub releases: Vec<Release>,
}

/// How far the bench's clock and the server's may disagree about when a
/// lease began: the bench stamps an ACK when it arrives, after the server
/// stamped the lease.
pub const ACK_CLOCK_SLACK_MS: u64 = 2_000;

/// Reads a `--ack-log` (complete lines only: the last may be cut by a kill).
pub fn ack_log(path: &Path) -> AckLog {
    let mut log = AckLog {
        acks: Vec::new(),
        releases: Vec::new(),
    };
    for line in complete_lines(path) {
        let f: Vec<&str> = line.split(' ').collect();
        let ms = |s: &str| -> u64 {
            s.parse()
                .unwrap_or_else(|_| panic!("bad --ack-log line {line:?}"))
        };
        match f.as_slice() {
            ["ack", at, mac, ip, lease, host] => log.acks.push(Ack {
                at_ms: ms(at),
                mac: mac.to_ascii_lowercase(),
                ip: (*ip).to_owned(),
                lease_secs: ms(lease),
                hostname: (*host != "-").then(|| (*host).to_owned()),
            }),
            ["release", at, mac, ip] => {
                log.releases
                    .push((ms(at), mac.to_ascii_lowercase(), (*ip).to_owned()))
            }
            _ => panic!("bad --ack-log line {line:?}"),
        }
    }
    log
}

impl AckLog {
    /// Every ACK of an address to one client while another client's lease
    /// on it had not ended (nor been released), as descriptions. An address
    /// may move only once its holder's lease is over.
    pub fn overlapping_holders(&self) -> Vec<String> {
        // Per address, its ACKs and RELEASEs (no ACK, the MAC) in time
        // order.
        type Event<'a> = (u64, Option<&'a Ack>, &'a str);
        let mut events: std::collections::HashMap<&str, Vec<Event>> =
            std::collections::HashMap::new();
        for a in &self.acks {
            events
                .entry(&a.ip)
                .or_default()
                .push((a.at_ms, Some(a), &a.mac));
        }
        for (at, mac, ip) in &self.releases {
            events.entry(ip).or_default().push((*at, None, mac));
        }
        let mut overlaps = Vec::new();
        for (ip, mut list) in events {
            list.sort_by_key(|(at, _, _)| *at);
            let mut holder: Option<&Ack> = None;
            for (at, ack, mac) in list {
                match ack {
                    None => {
                        if holder.is_some_and(|h| h.mac == mac) {
                            holder = None;
                        }
                    }
                    Some(a) => {
                        if let Some(h) = holder {
                            if h.mac != a.mac && a.at_ms + ACK_CLOCK_SLACK_MS < h.ends_ms() {
                                overlaps.push(format!(
                                    "{ip}: ACKed to {} at {at} while {}'s lease (ACKed at {}) ran until {}",
                                    a.mac, h.mac, h.at_ms, h.ends_ms()
                                ));
                            }
                        }
                        holder = Some(a);
                    }
                }
            }
        }
        overlaps
    }

    /// The newest ACK of each client whose lease should still be active
    /// at `now_ms` (not over, not released) but is not active in `store`
    /// for that client, on that address, until at least its end.
    pub fn missing_from(&self, store: &[LeaseView], now_ms: u64) -> Vec<String> {
        let mut newest: std::collections::HashMap<&str, &Ack> = std::collections::HashMap::new();
        for a in &self.acks {
            newest
                .entry(&a.mac)
                .and_modify(|n| {
                    if a.at_ms >= n.at_ms {
                        *n = a;
                    }
                })
                .or_insert(a);
        }
        let active: std::collections::HashMap<&str, &LeaseView> = store
            .iter()
            .filter(|l| l.state == "active")
            .map(|l| (l.ip.as_str(), l))
            .collect();
        let mut missing = Vec::new();
        for (mac, a) in newest {
            let released = self
                .releases
                .iter()
                .any(|(at, m, ip)| m == mac && *ip == a.ip && *at >= a.at_ms);
            if released || a.ends_ms() <= now_ms + ACK_CLOCK_SLACK_MS {
                continue;
            }
            match active.get(a.ip.as_str()) {
                Some(l)
                    if l.hw.eq_ignore_ascii_case(mac)
                        && l.expires * 1000 + ACK_CLOCK_SLACK_MS >= a.ends_ms() => {}
                other => missing.push(format!(
                    "{mac} was ACKed {} at {} until {}; the store has {other:?}",
                    a.ip,
                    a.at_ms,
                    a.ends_ms()
                )),
            }
        }
        missing
    }
}

/// The wall clock, unix milliseconds.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// causeway-bench's echo server on `addr` for `duration` ("300s"), as the
/// proxy's upstream; killed on drop.
pub fn echo_upstream(dir: &Path, addr: SocketAddr, duration: &str) -> Proc {
    Proc::spawn(
        "echo-upstream",
        dir,
        Command::new(bench_bin()).args([
            "proxy",
            "upstream",
            "--listen",
            &addr.to_string(),
            "--mode",
            "echo",
            "--duration",
            duration,
        ]),
    )
}

/// causeway-bench's DNS responder on `addr`, answering every A question,
/// as the forwarder's upstream; killed on drop.
pub fn dns_floor_upstream(dir: &Path, addr: SocketAddr) -> Proc {
    Proc::spawn(
        "dns-upstream",
        dir,
        Command::new(bench_bin()).args([
            "dns-floor",
            "--listen",
            &addr.to_string(),
            "--sockets",
            "1",
        ]),
    )
}

/// `dhcpcd -6` in the foreground on `interface` inside `ns`, with `conf`
/// and the test's own `hook`. dhcpcd keeps its state under /run/dhcpcd and
/// /var/lib/dhcpcd, fixed at build time: a private mount namespace puts
/// both in `dir`, so the machine's are never touched.
pub fn dhcpcd6(ns: &Netns, dir: &Path, conf: &Path, hook: &Path, interface: &str) -> Proc {
    let (run_dir, lib_dir) = (dir.join("run"), dir.join("lib"));
    fs::create_dir_all(&run_dir).unwrap();
    fs::create_dir_all(lib_dir.join("dhcpcd")).unwrap();
    let dhcpcd = tool("dhcpcd", "dhcpcd-base");
    let mut cmd = ns.command(tool("unshare", "util-linux"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"]);
    cmd.arg(r#"mount --bind "$1" /run && mount --bind "$2" /var/lib && exec "$3" -6 -B -d -f "$4" -c "$5" "$6""#)
        .arg("sh")
        .arg(&run_dir)
        .arg(&lib_dir)
        .arg(&dhcpcd)
        .arg(conf)
        .arg(hook)
        .arg(interface);
    Proc::spawn("dhcpcd", dir, &mut cmd)
}
