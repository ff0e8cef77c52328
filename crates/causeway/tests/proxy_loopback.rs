//! The L4 proxy on loopback with real TLS peers: `openssl s_server`
//! upstreams, each with its own rcgen certificate, and `curl` and
//! `openssl s_client` as clients. Needs no privileges.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(15);

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `openssl s_server` on loopback answering HTTP with its own
/// certificate, so a client through the proxy sees which upstream it got.
fn tls_upstream(dir: &Path, name: &str) -> (Guard, u16, PathBuf) {
    let port = support::reserved_port();
    let (guard, pem) = tls_upstream_at(dir, name, "127.0.0.1", port);
    (guard, port, pem)
}

/// The same, on a given loopback address and port.
fn tls_upstream_at(dir: &Path, name: &str, ip: &str, port: u16) -> (Guard, PathBuf) {
    let (pem, key) = support::tls_cert(dir, name, &[name]);
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        })
        .arg("-cert")
        .arg(&pem)
        .arg("-key")
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("s_server", || TcpStream::connect((ip, port)).is_ok());
    (Guard(child), pem)
}

struct Proxy {
    child: Guard,
    admin: u16,
}

fn start_proxy(dir: &Path, body: &str) -> Proxy {
    let admin = support::reserved_port();
    let cfg = dir.join("proxy.yaml");
    std::fs::write(
        &cfg,
        format!("log: {{format: json}}\nadmin: {{listen: \"127.0.0.1:{admin}\"}}\ncluster: {{name: hc1, baseDomain: example.com}}\nproxy:\n  listenAddress: 127.0.0.1\n{body}"),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["proxy", "--config"])
        .arg(&cfg)
        // The config's level (info) decides, so the access log is written.
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
        .spawn()
        .unwrap();
    let proxy = Proxy {
        child: Guard(child),
        admin,
    };
    wait_for("/readyz", || {
        http_get(admin, "/readyz")
            .is_some_and(|b| b.lines().next().is_some_and(|l| l.contains(" 200 ")))
    });
    proxy
}

/// The sum of every sample of `name` whose labels contain `labels`, from
/// the admin server on `admin` (0 when it does not answer).
fn metric_total(admin: u16, name: &str, labels: &str) -> f64 {
    http_get(admin, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The proxy's log lines so far (it logs JSON), with `field` equal to `value`.
fn log_lines(dir: &Path, field: &str, value: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("proxy.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v[field] == value)
        .collect()
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The subject a TLS client sees through the proxy.
fn subject_through(port: u16, sni: Option<&str>) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"));
    match sni {
        Some(n) => cmd.args(["-servername", n]),
        None => cmd.arg("-noservername"),
    };
    support::s_client_subject(&mut cmd)
}

#[test]
fn sni_routes_the_wildcard_the_default_and_plain_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (_oauth, oauth_port, oauth_pem) = tls_upstream(dir.path(), "oauth.hc1.example.com");
    let (_apps, apps_port, _) = tls_upstream(dir.path(), "ingress.apps.hc1.example.com");
    let (_ign, ign_port, _) = tls_upstream(dir.path(), "ignition.hc1.example.com");
    let (sni_port, api_port) = (support::reserved_port(), support::reserved_port());
    let proxy = start_proxy(
        dir.path(),
        &format!(
            "  listeners:\n    - {{port: {api_port}, upstream: \"127.0.0.1:{oauth_port}\"}}\n    - port: {sni_port}\n      routes:\n        - {{sni: oauth.hc1.example.com, upstream: \"127.0.0.1:{oauth_port}\"}}\n        - {{sni: \"*.apps.hc1.example.com\", upstream: \"127.0.0.1:{apps_port}\"}}\n      default: \"127.0.0.1:{ign_port}\"\n"
        ),
    );
    assert!(
        subject_through(sni_port, Some("oauth.hc1.example.com")).contains("oauth.hc1.example.com")
    );
    assert!(subject_through(sni_port, Some("a.b.apps.hc1.example.com")).contains("ingress.apps"));
    assert!(subject_through(sni_port, None).contains("ignition"));
    assert!(subject_through(sni_port, Some("unknown.example.org")).contains("ignition"));
    assert!(subject_through(api_port, Some("anything")).contains("oauth"));

    // curl verifies the upstream's certificate for the name it asked for.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&oauth_pem)
        .arg("--resolve")
        .arg(format!("oauth.hc1.example.com:{sni_port}:127.0.0.1"))
        .arg(format!("https://oauth.hc1.example.com:{sni_port}/"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("s_server"),
        "not the upstream's page"
    );

    let metrics = http_get(proxy.admin, "/metrics").unwrap();
    assert!(
        metrics.contains(&format!(
            "causeway_proxy_connections_total{{listener=\"{sni_port}\"}} 5"
        )),
        "{metrics}"
    );
    // Per route, labelled with the configured pattern, never the name sent.
    let route = |kind: &str, port: u16, route: &str| {
        metric(
            proxy.admin,
            &format!(
                "causeway_proxy_route_connections_{kind}{{listener=\"{port}\",route=\"{route}\"}}"
            ),
        )
    };
    assert_eq!(route("total", sni_port, "oauth.hc1.example.com"), Some(2.0));
    assert_eq!(
        route("total", sni_port, "*.apps.hc1.example.com"),
        Some(1.0)
    );
    assert_eq!(route("total", sni_port, "default"), Some(2.0));
    let plain = format!("127.0.0.1:{oauth_port}");
    assert_eq!(route("total", api_port, &plain), Some(1.0));
    let held = TcpStream::connect(("127.0.0.1", api_port)).unwrap();
    wait_for("the held connection counted on its route", || {
        route("active", api_port, &plain) == Some(1.0)
    });
    drop(held);
    wait_for("every routed connection to be closed", || {
        [
            (sni_port, "oauth.hc1.example.com"),
            (sni_port, "*.apps.hc1.example.com"),
            (sni_port, "default"),
            (api_port, plain.as_str()),
        ]
        .iter()
        .all(|(port, r)| route("active", *port, r) == Some(0.0))
    });
}

#[test]
fn half_close_is_relayed_so_an_upstream_can_answer_after_eof() {
    let dir = tempfile::tempdir().unwrap();
    // An upstream that reads to EOF, then answers with how much it read.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_port = upstream.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        write!(s, "read {} bytes", all.len()).unwrap();
    });
    let port = support::reserved_port();
    let _proxy = start_proxy(
        dir.path(),
        &format!("  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{up_port}\"}}\n"),
    );
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(&[7u8; 100_000]).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "read 100000 bytes");
    server.join().unwrap();

    // One access line at close, with what crossed each way.
    let client = c.local_addr().unwrap().to_string();
    drop(c);
    wait_for("the connection's access line", || {
        !log_lines(dir.path(), "target", "causeway::access").is_empty()
    });
    let lines = log_lines(dir.path(), "target", "causeway::access");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    let upstream = format!("127.0.0.1:{up_port}");
    assert_eq!(line["client"], client.as_str(), "{line}");
    assert_eq!(
        line["listener"],
        format!("127.0.0.1:{port}").as_str(),
        "{line}"
    );
    assert_eq!(line["route"], upstream.as_str(), "{line}");
    assert_eq!(line["upstream"], upstream.as_str(), "{line}");
    assert_eq!(line["bytes_up"], 100_000, "{line}");
    assert_eq!(line["bytes_down"], "read 100000 bytes".len(), "{line}");
    assert_eq!(line["reason"], "closed", "{line}");
    assert!(line["duration_ms"].is_u64(), "{line}");
}

#[test]
fn a_slow_hello_is_cut_at_the_timeout_and_the_limit_refuses_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, up_port, _) = tls_upstream(dir.path(), "oauth.hc1.example.com");
    // The limit is checked on a plain listener: connections held there wait
    // on no ClientHello, so the 1 s hello timeout cannot close them before the
    // third arrives, however slow the machine. The kernel's backlog accepts
    // the relayed connections without this listener ever calling accept.
    let held_upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held_upstream.local_addr().unwrap().port();
    let port = support::reserved_port();
    let plain_port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!(
            "  helloTimeout: 1s\n  maxConnections: 2\n  listeners:\n    - port: {port}\n      routes: [{{sni: oauth.hc1.example.com, upstream: \"127.0.0.1:{up_port}\"}}]\n    - port: {plain_port}\n      upstream: \"127.0.0.1:{held_port}\"\n"
        ),
    );
    // Slowloris: a TLS record header and nothing more.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(&[22, 3, 1, 2, 0]).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the proxy must close, not answer");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut after {:?}",
        started.elapsed()
    );
    wait_for("the hello timeout counted once", || {
        http_get(proxy.admin, "/metrics").is_some_and(|m| {
            m.contains(&format!(
                "causeway_proxy_sni_failures_total{{listener=\"{port}\",reason=\"hello_timeout\"}} 1"
            ))
        })
    });

    // Two held connections fill the limit; a third is closed at once.
    let _a = TcpStream::connect(("127.0.0.1", plain_port)).unwrap();
    let _b = TcpStream::connect(("127.0.0.1", plain_port)).unwrap();
    wait_for("two active connections", || {
        http_get(proxy.admin, "/metrics").is_some_and(|m| {
            m.contains(&format!(
                "causeway_proxy_connections_active{{listener=\"{plain_port}\"}} 2"
            ))
        })
    });
    let mut third = TcpStream::connect(("127.0.0.1", plain_port)).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // A timed-out read would mean the proxy kept the third connection open.
    match third.read(&mut buf) {
        Ok(0) => {}
        other => panic!("the third connection must be closed at once: {other:?}"),
    }
    let metrics = http_get(proxy.admin, "/metrics").unwrap();
    assert!(
        metrics.contains(&format!(
            "causeway_proxy_refused_total{{limit=\"listener\",listener=\"{plain_port}\"}} 1"
        )),
        "{metrics}"
    );
}

#[test]
fn sigterm_lets_an_inflight_transfer_finish_then_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_port = upstream.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut go = [0u8; 1];
        s.read_exact(&mut go).unwrap();
        s.write_all(&vec![1u8; 1_000_000]).unwrap();
    });
    let port = support::reserved_port();
    let mut proxy = start_proxy(
        dir.path(),
        &format!("  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{up_port}\"}}\n"),
    );
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wait_for("the connection to be proxied", || {
        http_get(proxy.admin, "/metrics").is_some_and(|m| {
            m.contains(&format!(
                "causeway_proxy_connections_active{{listener=\"{port}\"}} 1"
            ))
        })
    });
    let pid = proxy.child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // New connections are no longer accepted once the listener is gone.
    wait_for("the listener to close", || {
        TcpStream::connect(("127.0.0.1", port)).is_err()
    });
    c.write_all(&[1]).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 1_000_000, "the in-flight transfer was cut");
    // The client closes its side too; the connection is then done.
    drop(c);
    server.join().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = proxy.child.0.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < DEADLINE, "no exit after the drain");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// How long established connections get after SIGTERM (docs/proxy.md).
const DRAIN: Duration = Duration::from_secs(30);

#[test]
fn sigterm_gives_an_idle_connection_30_seconds_then_closes_it_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    // An echo upstream: whatever the client sends comes back.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_port = upstream.local_addr().unwrap().port();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let port = support::reserved_port();
    let mut proxy = start_proxy(
        dir.path(),
        &format!("  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{up_port}\"}}\n"),
    );
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(DRAIN + DEADLINE)).unwrap();
    let mut byte = [0u8; 1];
    c.write_all(b"a").unwrap();
    c.read_exact(&mut byte).unwrap();
    let pid = proxy.child.0.id().to_string();
    let signalled = Instant::now();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    wait_for("the listener to close", || {
        TcpStream::connect(("127.0.0.1", port)).is_err()
    });
    // Idle but open, it is still relayed three seconds before the end.
    std::thread::sleep((DRAIN - Duration::from_secs(3)).saturating_sub(signalled.elapsed()));
    let relayed = c.write_all(b"b").and_then(|()| c.read_exact(&mut byte));
    assert!(
        relayed.is_ok(),
        "the idle connection was closed {:?} after SIGTERM, before the drain was over: {relayed:?}",
        signalled.elapsed()
    );
    assert_eq!(
        &byte, b"b",
        "the connection was not relayed during the drain"
    );
    assert!(
        proxy.child.0.try_wait().unwrap().is_none(),
        "the proxy exited with a connection open before the drain was over"
    );
    // Then closed at the deadline, and the process exits 0.
    let closed = match c.read(&mut byte) {
        Ok(0) => signalled.elapsed(),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => signalled.elapsed(),
        other => panic!("the drained connection was not closed: {other:?}"),
    };
    let status = loop {
        if let Some(s) = proxy.child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            signalled.elapsed() < DRAIN + DEADLINE,
            "no exit {:?} after SIGTERM",
            signalled.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let exited = signalled.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        closed >= DRAIN && closed < DRAIN + Duration::from_secs(2),
        "the idle connection was closed {closed:?} after SIGTERM"
    );
    assert!(
        exited < DRAIN + Duration::from_secs(3),
        "exited {exited:?} after SIGTERM"
    );
    eprintln!("drain: connection closed {closed:?} and exit 0 {exited:?} after SIGTERM");
    drop(c);
    echo.join().unwrap();
}

#[test]
fn with_one_of_two_addresses_down_every_connection_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, up_port, _) = tls_upstream(dir.path(), "oauth.hc1.example.com");
    // A port with nothing listening: connections to it are refused.
    let dead = support::reserved_port();
    let port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!("  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{dead},127.0.0.1:{up_port}\"}}\n"),
    );
    for _ in 0..6 {
        assert!(subject_through(port, Some("oauth.hc1.example.com")).contains("oauth"));
    }
    let metrics = http_get(proxy.admin, "/metrics").unwrap();
    assert!(
        metrics.contains(&format!(
            "causeway_proxy_ejections_total{{listener=\"{port}\"}} 1"
        )),
        "{metrics}"
    );
}

#[test]
fn a_reload_changes_routes_and_keeps_established_connections() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a_port, _) = tls_upstream(dir.path(), "first.hc1.example.com");
    let (_b, b_port, _) = tls_upstream(dir.path(), "second.hc1.example.com");
    // A plain upstream that echoes, to hold a connection across the reload.
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let echo_port = echo.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = echo.accept() {
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let (sni_port, echo_listener) = (support::reserved_port(), support::reserved_port());
    let body = |target: u16| {
        format!(
            "  listeners:\n    - port: {sni_port}\n      routes: [{{sni: api.hc1.example.com, upstream: \"127.0.0.1:{target}\"}}]\n    - {{port: {echo_listener}, upstream: \"127.0.0.1:{echo_port}\"}}\n"
        )
    };
    let mut proxy = start_proxy(dir.path(), &body(a_port));
    assert!(subject_through(sni_port, Some("api.hc1.example.com")).contains("first"));
    let mut held = TcpStream::connect(("127.0.0.1", echo_listener)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    held.write_all(b"before").unwrap();
    let mut buf = [0u8; 6];
    held.read_exact(&mut buf).unwrap();

    let cfg = dir.path().join("proxy.yaml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&a_port.to_string(), &b_port.to_string());
    std::fs::write(&cfg, text).unwrap();
    assert!(Command::new("kill")
        .args(["-HUP", &proxy.child.0.id().to_string()])
        .status()
        .unwrap()
        .success());
    wait_for("the new route", || {
        subject_through(sni_port, Some("api.hc1.example.com")).contains("second")
    });

    held.write_all(b"after!").unwrap();
    held.read_exact(&mut buf).unwrap();
    assert_eq!(
        &buf, b"after!",
        "the established connection did not survive the reload"
    );
    let _ = proxy.child.0.kill();
}

#[test]
fn proxy_protocol_v2_tells_the_upstream_the_client_address() {
    let dir = tempfile::tempdir().unwrap();
    // An upstream that reads the 28-byte IPv4 header and answers with the
    // client address it carries.
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let up_port = upstream.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut s, _) = upstream.accept().unwrap();
        let mut h = [0u8; 28];
        s.read_exact(&mut h).unwrap();
        assert_eq!(&h[..12], b"\r\n\r\n\0\r\nQUIT\n");
        let ip = std::net::Ipv4Addr::new(h[16], h[17], h[18], h[19]);
        let port = u16::from_be_bytes([h[24], h[25]]);
        write!(s, "{ip}:{port}").unwrap();
    });
    let port = support::reserved_port();
    let _proxy = start_proxy(
        dir.path(),
        &format!("  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{up_port}\", proxyProtocol: true}}\n"),
    );
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut said = String::new();
    c.read_to_string(&mut said).unwrap();
    assert_eq!(said, c.local_addr().unwrap().to_string());
    server.join().unwrap();
}

#[test]
fn new_connections_follow_a_changed_upstream_address() {
    let dir = tempfile::tempdir().unwrap();
    // Two upstreams on one port, on two loopback addresses.
    let up_port = support::reserved_port();
    let mut upstreams = Vec::new();
    for (ip, name) in [("127.0.0.1", "first.test"), ("127.0.0.2", "second.test")] {
        upstreams.push(tls_upstream_at(dir.path(), name, ip, up_port).0);
    }
    // A resolver the test controls: dnsmasq answering from a hosts file,
    // with a one-second TTL.
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 api.upstream.test\n").unwrap();
    // dnsmasq binds TCP as well as UDP.
    let dns_port = support::reserved_port_on(std::net::Ipv4Addr::LOCALHOST);
    let dnsmasq = Guard(
        Command::new("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--local-ttl=1",
            ])
            .arg("--listen-address=127.0.0.1")
            .arg(format!("--port={dns_port}"))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("dnsmasq.pid").display()
            ))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let port = support::reserved_port();
    let _proxy = start_proxy(
        dir.path(),
        &format!(
            "  resolvers: [\"127.0.0.1:{dns_port}\"]\n  listeners:\n    - {{port: {port}, upstream: \"api.upstream.test:{up_port}\"}}\n"
        ),
    );
    wait_for("the first upstream", || {
        subject_through(port, Some("x")).contains("first.test")
    });
    std::fs::write(&hosts, "127.0.0.2 api.upstream.test\n").unwrap();
    assert!(Command::new("kill")
        .args(["-HUP", &dnsmasq.0.id().to_string()])
        .status()
        .unwrap()
        .success());
    // Once the cached answer's TTL runs out, new connections go to the new address.
    wait_for("the second upstream", || {
        subject_through(port, Some("x")).contains("second.test")
    });

    // With the resolver gone, the last good answer is kept.
    drop(dnsmasq);
    wait_for(
        "a failed resolution answered from the last good addresses",
        || {
            subject_through(port, Some("x")).contains("second.test")
                && !log_lines(
                    dir.path(),
                    "message",
                    "resolution failed; using the last good addresses",
                )
                .is_empty()
        },
    );
    assert!(subject_through(port, Some("x")).contains("second.test"));
}

/// The value of the first metric line that starts with `series`.
fn metric(admin: u16, series: &str) -> Option<f64> {
    http_get(admin, "/metrics")?
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn least_connections_sends_new_connections_past_a_busy_address() {
    let dir = tempfile::tempdir().unwrap();
    let (_a, a_port, _) = tls_upstream(dir.path(), "a.hc1.example.com");
    let (_b, b_port, _) = tls_upstream(dir.path(), "b.hc1.example.com");
    let port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!("  balance: leastConnections\n  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{a_port},127.0.0.1:{b_port}\"}}\n"),
    );
    // A plain listener connects upstream as soon as it accepts, so this
    // idle client holds one connection open to one of the two.
    let _held = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let open_to = |p: u16| {
        metric(
            proxy.admin,
            &format!("causeway_proxy_upstream_connections_active{{address=\"127.0.0.1:{p}\"}}"),
        )
        .unwrap_or(0.0)
    };
    wait_for("the held connection to reach an upstream", || {
        open_to(a_port) + open_to(b_port) == 1.0
    });
    let idle = if open_to(a_port) == 1.0 { "b." } else { "a." };
    // Round robin would send every other one of these to the busy address.
    for i in 0..4 {
        let subject = subject_through(port, None);
        assert!(
            subject.contains(idle),
            "connection {i} went to {subject}, not {idle}"
        );
    }
}

#[test]
fn health_checks_take_a_dead_address_out_and_bring_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_up, up_port, _) = tls_upstream(dir.path(), "a.hc1.example.com");
    let dead = support::reserved_port();
    let port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!("  healthCheck: {{interval: 100ms, timeout: 100ms, unhealthyThreshold: 2, healthyThreshold: 1}}\n  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{dead},127.0.0.1:{up_port}\"}}\n"),
    );
    let down = |p: u16| {
        metric(
            proxy.admin,
            &format!("causeway_proxy_upstream_down{{address=\"127.0.0.1:{p}\"}}"),
        )
    };
    wait_for("the dead address to be marked down", || {
        down(dead) == Some(1.0)
    });
    let refused =
        format!("causeway_proxy_connect_errors_total{{listener=\"{port}\",reason=\"refused\"}}");
    let refused_before = metric(proxy.admin, &refused).unwrap_or(0.0);
    for _ in 0..6 {
        assert!(subject_through(port, None).contains("a.hc1"));
    }
    // Marked down, it is not even tried: passive ejection alone would
    // have let connections hit it (and be refused) first.
    assert_eq!(metric(proxy.admin, &refused).unwrap_or(0.0), refused_before);

    let (_revived, _) = tls_upstream_at(dir.path(), "b.hc1.example.com", "127.0.0.1", dead);
    wait_for("the revived address to be marked up", || {
        down(dead) == Some(0.0)
    });
    let mut seen_revived = false;
    for _ in 0..6 {
        seen_revived |= subject_through(port, None).contains("b.hc1");
    }
    assert!(seen_revived, "the revived address took no connection");
}

/// Bounded memory under many idle clients: 10,000 connections (fewer only
/// when this process may not open that many files) that never send a
/// ClientHello. Each must cost the proxy under 40 KB of RSS.
#[test]
fn ten_thousand_idle_clients_cost_under_40_kb_each() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    // Headroom for the other tests running in this process at once, and
    // within the proxy's own cap under the same limit (with room for the
    // one more connection made while they are held).
    let clients = 10_000usize
        .min(hard.saturating_sub(1_000) as usize)
        .min(causeway_proxy::connection_cap(hard).saturating_sub(10));
    if clients < 10_000 {
        eprintln!("NOTE: open-files hard limit {hard}: holding {clients} idle clients, not 10000");
    }
    assert!(clients >= 1_000, "open-files hard limit {hard} is too low");

    let dir = tempfile::tempdir().unwrap();
    let (_up, up_port, _) = tls_upstream(dir.path(), "oauth.hc1.example.com");
    let port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!("  helloTimeout: 5m\n  maxConnections: 20000\n  maxConnectionsPerSource: 20000\n  listeners:\n    - port: {port}\n      routes: [{{sni: oauth.hc1.example.com, upstream: \"127.0.0.1:{up_port}\"}}]\n"),
    );
    let pid = proxy.child.0.id();
    let active = format!("causeway_proxy_connections_active{{listener=\"{port}\"}}");
    let before = support::rss_kib(pid);
    let mut held = Vec::with_capacity(clients);
    for _ in 0..clients {
        held.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    wait_for("every idle client to be accepted", || {
        metric(proxy.admin, &active) == Some(clients as f64)
    });
    let during = support::rss_kib(pid);
    let per_client = (during.saturating_sub(before) * 1024) / clients as u64;
    eprintln!("proxy RSS {before} KiB -> {during} KiB with {clients} idle clients: {per_client} bytes each");
    assert!(per_client < 40 * 1024, "{per_client} bytes per idle client");

    // Still serving while they are held.
    assert!(subject_through(port, Some("oauth.hc1.example.com")).contains("oauth"));
    drop(held);
    wait_for("the idle clients to be closed", || {
        metric(proxy.admin, &active) == Some(0.0)
    });
}

/// A plain TCP upstream on loopback that accepts every connection and
/// holds it until the other side closes, or until dropped. It counts
/// what it accepted and what it still holds, so a test can tell whether
/// a client got through the proxy.
struct HoldingUpstream {
    port: u16,
    accepted: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HoldingUpstream {
    fn start() -> HoldingUpstream {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (accepted, held_now) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (stopping, counted, holding) = (stop.clone(), accepted.clone(), held_now.clone());
        let thread = std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            let mut buf = [0u8; 512];
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        s.set_nonblocking(true).unwrap();
                        held.push(s);
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    // Nonblocking: nothing waiting; look again soon.
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
                held.retain_mut(|s| match s.read(&mut buf) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                });
                holding.store(held.len(), Ordering::Relaxed);
            }
        });
        HoldingUpstream {
            port,
            accepted,
            held: held_now,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HoldingUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn running_out_of_descriptors_never_ejects_a_healthy_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HoldingUpstream::start();
    let port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!(
            "  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{}\"}}\n",
            upstream.port
        ),
    );
    let (pid, admin) = (proxy.child.0.id(), proxy.admin);
    let total = |name: &str, labels: &str| metric_total(admin, name, labels);
    // With the limit at the second-lowest free number, exactly one is left.
    let one_free_fd_limit = || support::free_descriptor(pid, 1);
    // Leave the proxy exactly one free descriptor: the accept takes it
    // and the connect to the upstream fails with EMFILE. A descriptor the
    // proxy was closing as it was looked at (the admin reply above, the
    // config watcher's read) can leave it two, and then the client gets
    // through; let that pair close and look again. Whether the
    // connection was dropped is what the client itself sees: the proxy
    // closes it when the upstream connect fails.
    // The proxy raised its soft limit to the hard one it inherited from us.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    // Three in a row: as many consecutive connect failures as would eject
    // an address that was really failing.
    let mut starved_in_a_row = 0;
    for _attempt in 0..30 {
        let mut starved = false;
        wait_for("the upstream to hold nothing", || {
            upstream.held.load(Ordering::Relaxed) == 0
        });
        support::set_open_files(pid, one_free_fd_limit());
        let through_before = upstream.accepted.load(Ordering::Relaxed);
        let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let attempt_started = Instant::now();
        let mut byte = [0u8; 1];
        while attempt_started.elapsed() < Duration::from_secs(3) {
            if upstream.accepted.load(Ordering::Relaxed) > through_before {
                break;
            }
            match client.read(&mut byte) {
                Ok(0) => {
                    starved = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    starved = true;
                    break;
                }
                _ => {}
            }
        }
        drop(client);
        support::set_open_files(pid, hard);
        starved_in_a_row = if starved { starved_in_a_row + 1 } else { 0 };
        if starved_in_a_row == 3 {
            break;
        }
    }
    assert_eq!(
        starved_in_a_row, 3,
        "the proxy never ran out of descriptors on three connects in a row"
    );
    assert_eq!(
        total("causeway_proxy_ejections_total", ""),
        0.0,
        "running out of descriptors ejected a healthy upstream"
    );
    assert!(
        total(
            "causeway_proxy_connect_errors_total",
            "reason=\"local_resources\"",
        ) >= 3.0,
        "a connect that failed for want of descriptors was not counted as ours"
    );
    // Descriptors free again: a new connection reaches the upstream.
    let through_before = upstream.accepted.load(Ordering::Relaxed);
    let _again = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for("a new connection to reach the upstream", || {
        upstream.accepted.load(Ordering::Relaxed) > through_before
    });
    assert_eq!(
        total("causeway_proxy_ejections_total", ""),
        0.0,
        "a healthy upstream was ejected"
    );
}

/// A client connection to the proxy from `source`, one of loopback's
/// 127.0.0.0/8 addresses.
fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from((source, 0)))
            .unwrap();
        socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap()
            .into_std()
            .unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Whether the proxy closed `client` on arrival (rather than relaying it).
fn closed_on_arrival(client: &mut TcpStream) -> bool {
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    match client.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn the_open_files_limit_caps_connections_across_listeners_and_each_source_has_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HoldingUpstream::start();
    let (port_a, port_b, admin) = (
        support::reserved_port(),
        support::reserved_port(),
        support::reserved_port(),
    );
    let cfg = dir.path().join("proxy.yaml");
    std::fs::write(
        &cfg,
        format!("log: {{format: json}}\nadmin: {{listen: \"127.0.0.1:{admin}\"}}\ncluster: {{name: hc1, baseDomain: example.com}}\nproxy:\n  listenAddress: 127.0.0.1\n  maxConnectionsPerSource: 12\n  listeners:\n    - {{port: {port_a}, upstream: \"127.0.0.1:{up}\"}}\n    - {{port: {port_b}, upstream: \"127.0.0.1:{up}\"}}\n", up = upstream.port),
    )
    .unwrap();
    // 252 descriptors: 64 fixed, 144 kept for DNS, the lease store and
    // health checks, so the proxy's share of 44 is 22 connections (two
    // descriptors each) across both listeners, far below the point where
    // an accept or a connect could fail.
    let log = dir.path().join("proxy.log");
    let child = Command::new("prlimit")
        .arg("--nofile=252:252")
        .arg(env!("CARGO_BIN_EXE_causeway"))
        .args(["proxy", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _proxy = Guard(child);
    wait_for("/readyz", || {
        http_get(admin, "/readyz")
            .is_some_and(|b| b.lines().next().is_some_and(|l| l.contains(" 200 ")))
    });
    let startup = std::fs::read_to_string(&log).unwrap();
    assert!(
        startup.contains("\"cap\":22") && startup.contains("\"open_files_limit\":252"),
        "the cap and the limit it came from are logged: {startup}"
    );
    let held = || upstream.held.load(Ordering::Relaxed);
    let refused = |limit: &str| {
        http_get(admin, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.starts_with("causeway_proxy_refused_total")
                    && l.contains(&format!("limit=\"{limit}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };

    // One source: its twelve are relayed, across both listeners; its
    // thirteenth is closed on arrival.
    let mut clients: Vec<TcpStream> = (0..12)
        .map(|i| connect_from([127, 0, 0, 1], if i % 2 == 0 { port_a } else { port_b }))
        .collect();
    wait_for("twelve connections held upstream", || held() == 12);
    let mut over = connect_from([127, 0, 0, 1], port_b);
    assert!(
        closed_on_arrival(&mut over),
        "a thirteenth from one source was relayed"
    );
    assert_eq!(refused("source"), 1.0);

    // Other sources fill the process-wide cap of 22; the next is closed.
    clients.extend((0..10).map(|i| connect_from([127, 0, 0, 2 + (i % 2)], port_b)));
    wait_for("22 connections held upstream", || held() == 22);
    let mut past_cap = connect_from([127, 0, 0, 4], port_a);
    assert!(
        closed_on_arrival(&mut past_cap),
        "a connection past the cap was relayed"
    );
    assert_eq!(refused("total"), 1.0);
    assert_eq!(refused("listener"), 0.0);
    let metrics = http_get(admin, "/metrics").unwrap();
    // The series exist from the start, at zero; they must stay there.
    for never in ["reason=\"accept\"", "reason=\"local_resources\""] {
        let counted: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("causeway_proxy_connect_errors_total") && l.contains(never))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(
            counted, 0.0,
            "the cap must keep the proxy from running out of descriptors: {never}"
        );
    }

    // A closed connection gives its permits back: a new source gets in.
    // The upstream counts the close as soon as it sees it; the proxy's
    // task gives its permits back a moment later, after its access line,
    // and the gauge of open connections falls with them. (A CI run
    // under load connected the next client in that moment and saw it
    // refused.)
    drop(clients.pop());
    wait_for("the closed connection released upstream", || held() == 21);
    let active = || {
        http_get(admin, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("causeway_proxy_connections_active{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    wait_for("the closed connection's permits given back", || {
        active() == 21.0
    });
    let _late = connect_from([127, 0, 0, 4], port_a);
    wait_for("a new connection relayed after one closed", || held() == 22);
}

/// A TCP address on loopback that never completes a connect: a listener
/// with a backlog of one that never accepts, filled by two connections
/// the returned guard holds, so the kernel drops every later SYN.
fn black_hole() -> (SocketAddrGuard, u16) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (listener, fillers, port) = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(1).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        // Until a connect no longer completes at once, the queue has room.
        for _ in 0..8 {
            match tokio::time::timeout(
                Duration::from_millis(300),
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(Ok(s)) => fillers.push(s.into_std().unwrap()),
                _ => break,
            }
        }
        (listener.into_std().unwrap(), fillers, addr.port())
    });
    (
        SocketAddrGuard {
            _listener: listener,
            _fillers: fillers,
        },
        port,
    )
}

struct SocketAddrGuard {
    _listener: std::net::TcpListener,
    _fillers: Vec<std::net::TcpStream>,
}

#[test]
fn a_black_holed_upstream_holds_no_more_than_its_listener_allows_and_others_keep_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (_hole, hole_port) = black_hole();
    let healthy = HoldingUpstream::start();
    let (port_dead, port_ok) = (support::reserved_port(), support::reserved_port());
    let proxy = start_proxy(
        dir.path(),
        &format!("  connectTimeout: 3s\n  maxConnections: 10\n  listeners:\n    - {{port: {port_dead}, upstream: \"127.0.0.1:{hole_port}\"}}\n    - {{port: {port_ok}, upstream: \"127.0.0.1:{}\"}}\n", healthy.port),
    );
    let (pid, admin) = (proxy.child.0.id(), proxy.admin);
    let rss_before = support::rss_kib(pid);
    let total = |name: &str, labels: &str| metric_total(admin, name, labels);
    // 200 clients on the dead route, from five sources: each waits on a
    // connect that never completes.
    let stuck: Vec<TcpStream> = (0..200)
        .map(|i| connect_from([127, 0, 1, 1 + (i % 5) as u8], port_dead))
        .collect();
    wait_for("the dead route's listener at its limit", || {
        total("causeway_proxy_refused_total", "limit=\"listener\"") >= 100.0
    });
    // The healthy route is served all the while.
    let served: Vec<TcpStream> = (0..5)
        .map(|_| connect_from([127, 0, 2, 1], port_ok))
        .collect();
    wait_for("five connections through the healthy route", || {
        healthy.held.load(Ordering::Relaxed) == 5
    });
    let dead_active = metric(
        admin,
        &format!("causeway_proxy_connections_active{{listener=\"{port_dead}\"}}"),
    )
    .unwrap_or(f64::NAN);
    assert!(dead_active <= 10.0, "{dead_active} held on the dead route");
    let rss_during = support::rss_kib(pid);
    // The stuck connects give up at connectTimeout and are counted.
    wait_for("the connects to time out", || {
        total("causeway_proxy_connect_errors_total", "reason=\"timeout\"") >= 1.0
    });
    eprintln!(
        "black hole: {dead_active} held on the dead route, {} refused there; healthy route served; RSS {rss_before} -> {rss_during} KiB",
        total("causeway_proxy_refused_total", "limit=\"listener\"")
    );
    assert!(
        rss_during < rss_before + 8 * 1024,
        "RSS grew from {rss_before} to {rss_during} KiB"
    );
    drop((stuck, served));
}

#[test]
fn a_reload_raises_and_lowers_a_listeners_limit_without_closing_connections() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HoldingUpstream::start();
    let port = support::reserved_port();
    let body = |max: usize| {
        format!(
            "  maxConnections: {max}\n  listeners:\n    - {{port: {port}, upstream: \"127.0.0.1:{}\"}}\n",
            upstream.port
        )
    };
    let mut proxy = start_proxy(dir.path(), &body(1));
    let cfg = dir.path().join("proxy.yaml");
    let reloads = std::cell::Cell::new(0);
    let reload_to = |max: usize| {
        let text = std::fs::read_to_string(&cfg).unwrap();
        let (head, _) = text.split_once("  maxConnections:").unwrap();
        std::fs::write(&cfg, format!("{head}{}", body(max))).unwrap();
        assert!(Command::new("kill")
            .args(["-HUP", &proxy.child.0.id().to_string()])
            .status()
            .unwrap()
            .success());
        reloads.set(reloads.get() + 1);
        wait_for("the reload applied", || {
            log_lines(dir.path(), "message", "config reloaded").len() >= reloads.get()
        });
    };
    let held = || upstream.held.load(Ordering::Relaxed);

    let first = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for("one connection held upstream", || held() == 1);
    let mut refused = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(
        closed_on_arrival(&mut refused),
        "a second under a limit of 1"
    );

    // Raised to 2: a second gets through, without a restart.
    reload_to(2);
    let second = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for("two connections held upstream", || held() == 2);

    // Lowered to 1 with two open: both stay, new ones are refused until
    // fewer than one is open.
    reload_to(1);
    let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(
        closed_on_arrival(&mut over),
        "admitted over the lowered limit"
    );
    assert_eq!(held(), 2, "a lowered limit closed an open connection");
    drop(first);
    wait_for("the first released upstream", || held() == 1);
    let mut still_over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(
        closed_on_arrival(&mut still_over),
        "admitted while the one open fills the lowered limit"
    );
    drop(second);
    wait_for("the second released upstream", || held() == 0);
    let _third = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_for("a connection relayed under the lowered limit", || {
        held() == 1
    });
    let _ = proxy.child.0.kill();
}

/// The subject a TLS client sees through the proxy at `host:port`.
fn subject_through_at(host: &str, port: u16, sni: Option<&str>) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect"])
        .arg(format!("{host}:{port}"));
    match sni {
        Some(n) => cmd.args(["-servername", n]),
        None => cmd.arg("-noservername"),
    };
    support::s_client_subject(&mut cmd)
}

#[test]
fn dual_stack_listeners_route_by_name_and_by_v6_source_to_upstreams_of_either_family() {
    let dir = tempfile::tempdir().unwrap();
    let (_oauth, oauth_port, _) = tls_upstream(dir.path(), "oauth.hc1.example.com");
    let apps_port = support::reserved_port();
    let (_apps, _) = tls_upstream_at(dir.path(), "ingress.apps.hc1.example.com", "::1", apps_port);
    let ign_port = support::reserved_port();
    let (_ign, _) = tls_upstream_at(dir.path(), "ignition.hc1.example.com", "::1", ign_port);
    let (_other, other_port, _) = tls_upstream(dir.path(), "other.hc1.example.com");
    let sni_port = support::reserved_port();
    let proxy = start_proxy(
        dir.path(),
        &format!(
            "  listenAddressV6: '::1'\n  listeners:\n    - port: {sni_port}\n      routes:\n        - {{sni: oauth.hc1.example.com, upstream: \"127.0.0.1:{oauth_port}\"}}\n        - {{sni: \"*.apps.hc1.example.com\", upstream: \"[::1]:{apps_port}\"}}\n        - {{sources: ['::1/128'], upstream: \"[::1]:{ign_port}\"}}\n      default: \"127.0.0.1:{other_port}\"\n"
        ),
    );
    let cases = [
        ("[::1]", Some("oauth.hc1.example.com"), "oauth.hc1"),
        ("[::1]", Some("x.apps.hc1.example.com"), "ingress.apps"),
        ("127.0.0.1", Some("x.apps.hc1.example.com"), "ingress.apps"),
        // The route by source takes a v6 client without a name; a v4
        // client without one gets the default.
        ("[::1]", None, "ignition"),
        ("127.0.0.1", None, "other.hc1"),
    ];
    for (host, sni, want) in cases {
        let subject = subject_through_at(host, sni_port, sni);
        assert!(
            subject.contains(want),
            "{host} with SNI {sni:?} reached {subject:?}, not {want}"
        );
    }
    // One port, both families: the listener's series count both.
    assert_eq!(
        metric(
            proxy.admin,
            &format!("causeway_proxy_connections_total{{listener=\"{sni_port}\"}}")
        ),
        Some(5.0)
    );
}
