//! The appliance on loopback, as an operator drives it: start, serve DHCP,
//! answer on the admin endpoints, reload (good and bad), stop on SIGTERM.
//! Needs no privileges.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dhcproto::v4::{DhcpOption, Message, OptionCode};

const DEADLINE: Duration = Duration::from_secs(15);

struct Appliance {
    child: Child,
    log: PathBuf,
}

impl Drop for Appliance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Appliance {
    fn start(config: &Path, log: PathBuf) -> Appliance {
        let child = Command::new(env!("CARGO_BIN_EXE_causeway"))
            .args(["appliance", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Appliance { child, log }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} failed");
    }

    fn log_contains(&self, needle: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .contains(needle)
    }
}

/// Waits for `cond` with a deadline; the condition is the synchronisation.
fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    poll(what, Duration::from_millis(20), cond)
}

/// Polls a DHCP condition gently: the server rate-limits each client to
/// 20 messages a second, and a DORA is two.
fn wait_for_dhcp(what: &str, cond: impl FnMut() -> bool) {
    poll(what, Duration::from_millis(200), cond)
}

fn poll(what: &str, every: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(every);
    }
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let status = body.split_whitespace().nth(1)?.parse().ok()?;
    let body = body.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

fn config(dir: &Path, dhcp_port: u16, admin_port: u16, mtu: u16) -> String {
    format!(
        r#"
admin: {{listen: "127.0.0.1:{admin_port}"}}
dhcp:
  listen: [{{address: "127.0.0.1:{dhcp_port}"}}]
  leaseFile: {}/leases.jsonl
  subnets:
    - cidr: 10.9.0.0/24
      relayAddresses: [127.0.0.1]
      serverId: 127.0.0.1
      router: [10.9.0.1]
      mtu: {mtu}
"#,
        dir.display()
    )
}

fn mtu_of(m: &Message) -> Option<u16> {
    match m.opts().get(OptionCode::InterfaceMtu) {
        Some(DhcpOption::InterfaceMtu(v)) => Some(*v),
        _ => None,
    }
}

#[test]
fn appliance_serves_reloads_and_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let (dhcp_port, admin_port) = (support::reserved_port(), support::reserved_port());
    let cfg_path = dir.path().join("causeway.yaml");
    std::fs::write(&cfg_path, config(dir.path(), dhcp_port, admin_port, 1400)).unwrap();
    let app = Appliance::start(&cfg_path, dir.path().join("stderr.log"));

    wait_for("/readyz to answer 200", || {
        http_get(admin_port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    let (status, body) = http_get(admin_port, "/healthz").unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));

    let mut relay = support::Relay::new(SocketAddr::from(([127, 0, 0, 1], dhcp_port)));
    let mac = [0x52, 0x54, 0, 0, 0, 1];
    let ack = relay.dora(mac, &[]);
    let ip = ack.yiaddr();
    assert!(ip.octets()[..3] == [10, 9, 0]);
    assert_eq!(mtu_of(&ack), Some(1400));

    let (_, leases) = http_get(admin_port, "/leases").unwrap();
    let leases: serde_json::Value = serde_json::from_str(&leases).unwrap();
    assert_eq!(leases[0]["ip"], ip.to_string());
    assert_eq!(leases[0]["state"], "active");
    // The ACK is counted just after it is sent, so the client can see it
    // before the counter moves.
    wait_for("the ACK counted", || {
        http_get(admin_port, "/metrics")
            .is_some_and(|(_, m)| m.contains("causeway_dhcp_sent_total{type=\"ack\"} 1"))
    });
    let (_, metrics) = http_get(admin_port, "/metrics").unwrap();
    assert!(metrics.contains("process_resident_memory_bytes"));

    // A valid change is applied without a restart.
    std::fs::write(&cfg_path, config(dir.path(), dhcp_port, admin_port, 1300)).unwrap();
    app.signal("-HUP");
    wait_for_dhcp("the new MTU", || {
        mtu_of(&relay.dora(mac, &[])) == Some(1300)
    });
    assert_eq!(relay.dora(mac, &[]).yiaddr(), ip, "a reload keeps leases");

    // An invalid change is rejected and the running config stays.
    std::fs::write(&cfg_path, "dhcp:\n  leaseTime: forever\n").unwrap();
    app.signal("-HUP");
    wait_for("the rejection in the log", || {
        app.log_contains("reload rejected")
    });
    assert!(app.log_contains("dhcp.leaseTime: forever is not a duration"));
    assert_eq!(mtu_of(&relay.dora(mac, &[])), Some(1300));

    let mut app = app;
    app.signal("-TERM");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = app.child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");

    // The lease is on disk for the next start.
    std::fs::write(&cfg_path, config(dir.path(), dhcp_port, admin_port, 1300)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["leases", "--json", "--config"])
        .arg(&cfg_path)
        .output()
        .unwrap();
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(leases[0]["ip"], ip.to_string());
    assert_eq!(leases[0]["state"], "active");
}

/// A reload that names another lease file is refused whole: the server
/// keeps writing the file it opened, so applying "the rest" would leave the
/// next start loading another file and forgetting every lease acknowledged.
#[test]
fn a_reload_that_moves_the_lease_file_is_refused_whole_and_no_lease_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (dhcp_port, admin_port) = (support::reserved_port(), support::reserved_port());
    let cfg_path = dir.path().join("causeway.yaml");
    let original = config(dir.path(), dhcp_port, admin_port, 1400);
    std::fs::write(&cfg_path, &original).unwrap();
    let mut app = Appliance::start(&cfg_path, dir.path().join("stderr.log"));
    wait_for("/readyz to answer 200", || {
        http_get(admin_port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    let mut relay = support::Relay::new(SocketAddr::from(([127, 0, 0, 1], dhcp_port)));
    let first = relay.dora([0x52, 0x54, 0, 0, 0, 1], &[]).yiaddr();

    let moved = original
        .replace("leases.jsonl", "elsewhere.jsonl")
        .replace("mtu: 1400", "mtu: 1300");
    assert_ne!(moved, original);
    std::fs::write(&cfg_path, &moved).unwrap();
    app.signal("-HUP");
    wait_for("the refusal counted", || {
        http_get(admin_port, "/metrics")
            .is_some_and(|(_, m)| m.contains("causeway_config_reloads_total{result=\"refused\"} 1"))
    });
    assert!(app.log_contains("reload refused"));
    assert!(app.log_contains("dhcp.leaseFile changed"));
    assert!(!app.log_contains("config reloaded"));
    // Nothing of it applied: the MTU is the old one.
    let second = relay.dora([0x52, 0x54, 0, 0, 0, 2], &[]);
    assert_eq!(mtu_of(&second), Some(1400), "half of the reload applied");
    let second = second.yiaddr();

    // Put back, as the log says, and restarted: every lease acknowledged
    // before and after the refused reload is there.
    std::fs::write(&cfg_path, &original).unwrap();
    app.signal("-TERM");
    let start = Instant::now();
    while app.child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < DEADLINE, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _app = Appliance::start(&cfg_path, dir.path().join("stderr-2.log"));
    wait_for("/readyz after the restart", || {
        http_get(admin_port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    let (_, leases) = http_get(admin_port, "/leases").unwrap();
    let leases: serde_json::Value = serde_json::from_str(&leases).unwrap();
    let ips: Vec<&str> = leases
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] == "active")
        .filter_map(|l| l["ip"].as_str())
        .collect();
    for ip in [first, second] {
        assert!(ips.contains(&ip.to_string().as_str()), "{ip} in {ips:?}");
    }
    assert!(!dir.path().join("elsewhere.jsonl").exists());
}

#[test]
fn a_config_file_change_is_picked_up_without_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (dhcp_port, admin_port) = (support::reserved_port(), support::reserved_port());
    let cfg_path = dir.path().join("causeway.yaml");
    std::fs::write(&cfg_path, config(dir.path(), dhcp_port, admin_port, 1400)).unwrap();
    let _app = Appliance::start(&cfg_path, dir.path().join("stderr.log"));
    wait_for("/readyz", || {
        http_get(admin_port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    let mut relay = support::Relay::new(SocketAddr::from(([127, 0, 0, 1], dhcp_port)));
    let mac = [0x52, 0x54, 0, 0, 0, 2];
    assert_eq!(mtu_of(&relay.dora(mac, &[])), Some(1400));
    std::fs::write(&cfg_path, config(dir.path(), dhcp_port, admin_port, 1280)).unwrap();
    wait_for_dhcp("the watched file's new MTU", || {
        mtu_of(&relay.dora(mac, &[])) == Some(1280)
    });
}

#[test]
fn a_port_already_in_use_fails_start_up_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg_path = dir.path().join("causeway.yaml");
    // SO_REUSEADDR lets two UDP sockets share a port on Linux only when
    // both set it; ours does, the holder here does not.
    std::fs::write(
        &cfg_path,
        config(dir.path(), port, support::reserved_port(), 1400),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["appliance", "--config"])
        .arg(&cfg_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DHCP failed to start"), "{stderr}");
    assert!(stderr.contains("already in use"), "{stderr}");
}
