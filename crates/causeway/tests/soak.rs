//! Soak: the appliance with DHCP, DNS and the proxy together under steady
//! mixed load from causeway-bench, on loopback, with a kill -9 of the
//! appliance half way through and a restart on the same lease file.
//!
//! Reports what a user would ask after a crash: ACKed leases lost (must be
//! 0), addresses with two holders (must be 0), DNS queries lost and proxy
//! exchanges failed (the kill's window, and nothing else), and the
//! appliance's memory before and after.
//!
//! `CAUSEWAY_SOAK_SECONDS` sets the length (default 60, which CI runs; the
//! figures in docs/reliability.md are from 600). Every load is bounded by
//! it. causeway-bench must be built first: `cargo build -p causeway-bench`.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    bench_bin, complete_lines, free_tcp_port, free_udp_and_tcp_port, free_udp_port, leases,
    rss_kib, AdminAt, Appliance, Proc,
};

fn soak_seconds() -> u64 {
    std::env::var("CAUSEWAY_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

fn count(v: &serde_json::Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {v}"))
}

fn start(dir: &Path, config: &Path, admin: SocketAddr, name: &str) -> Appliance {
    Appliance::start(name, dir, None, config, AdminAt::Host(admin))
}

#[test]
fn mixed_load_with_a_kill_9_in_the_middle_loses_no_acknowledged_lease() {
    let seconds = soak_seconds();
    let dir = tempfile::Builder::new()
        .prefix("causeway-soak-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, free_udp_port()));
    let dns = SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        free_udp_and_tcp_port(Ipv4Addr::LOCALHOST),
    ));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp_port()));
    let proxy = SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp_port()));
    let echo = SocketAddr::from((Ipv4Addr::LOCALHOST, free_tcp_port()));
    let upstream_dns = SocketAddr::from((Ipv4Addr::LOCALHOST, free_udp_port()));

    // The far ends: an echo server behind the proxy, and a DNS responder
    // that answers every A question, as the forwarder's upstream. Both run
    // a little longer than the soak and are killed on drop.
    let run_for = format!("{}s", seconds + 60);
    let _echo = Proc::spawn(
        "echo-upstream",
        d,
        Command::new(bench_bin()).args([
            "proxy",
            "upstream",
            "--listen",
            &echo.to_string(),
            "--mode",
            "echo",
            "--duration",
            &run_for,
        ]),
    );
    let _upstream = Proc::spawn(
        "dns-upstream",
        d,
        Command::new(bench_bin()).args([
            "dns-floor",
            "--listen",
            &upstream_dns.to_string(),
            "--sockets",
            "1",
        ]),
    );
    let config = d.join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: warn}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.com}}
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {lease}
  leaseTime: 1h
  subnets:
    - {{cidr: 10.200.0.0/16, relayAddresses: [127.0.0.1], serverId: 127.0.0.1, router: [10.200.0.1]}}
dns:
  listen: ["{dns}"]
  proxyAddress: 192.0.2.10
  ingressAddress: 192.0.2.11
  upstreams: ["{upstream_dns}"]
  udpSockets: 1
proxy:
  listenAddress: 127.0.0.1
  listeners:
    - {{port: {proxy_port}, upstream: "{echo}"}}
"#,
            lease = d.join("leases.jsonl").display(),
            proxy_port = proxy.port(),
        ),
    )
    .unwrap();

    let mut server = start(d, &config, admin, "causeway");
    let rss_start = rss_kib(server.proc.pid());
    let duration = format!("{seconds}s");
    let acked = d.join("acked.txt");
    // DHCP: 20,000 clients (fewer than the /16 holds) at 200 DORA/s, each
    // coming back for its lease in turn.
    let mut dhcp_load = Proc::spawn(
        "dhcp-load",
        d,
        Command::new(bench_bin())
            .args([
                "dhcp",
                "--server",
                &dhcp.to_string(),
                "--bind",
                "127.0.0.1:0",
            ])
            .args(["--clients", "20000", "--rate", "200", "--timeout", "1s"])
            .args(["--duration", &duration, "--json", "--acked-file"])
            .arg(&acked),
    );
    // DNS: 1,000 q/s, local names, cached forwarded names and misses.
    let mut dns_load = Proc::spawn(
        "dns-load",
        d,
        Command::new(bench_bin())
            .args(["dns", "--server", &dns.to_string()])
            .args([
                "--mix",
                "local=60,cached=30,miss=10",
                "--zone",
                "hc1.example.com",
            ])
            .args(["--forward-domain", "example.net", "--rate", "1000"])
            .args(["--timeout", "1s", "--duration", &duration, "--json"]),
    );
    // Proxy: 200 short connections a second, each echoing 1 KiB.
    let mut proxy_load = Proc::spawn(
        "proxy-load",
        d,
        Command::new(bench_bin())
            .args(["proxy", "conn", "--target", &proxy.to_string()])
            .args(["--rate", "200", "--concurrency", "8", "--payload", "1024"])
            .args(["--timeout", "2s", "--duration", &duration, "--json"]),
    );

    // Half way: kill -9, and a restart on the same config and lease file.
    let started = Instant::now();
    let half = Duration::from_secs(seconds / 2);
    while started.elapsed() < half {
        assert!(
            dhcp_load.try_status().is_none(),
            "the DHCP load ended early\n{}",
            dhcp_load.describe()
        );
        // Checking on the loads, not waiting for them.
        std::thread::sleep(Duration::from_millis(200));
    }
    let rss_before_kill = rss_kib(server.proc.pid());
    let acked_before_kill = complete_lines(&acked).len();
    server.proc.kill9();
    let killed_at = Instant::now();
    let server = start(d, &config, admin, "causeway-restarted");
    let down_for = killed_at.elapsed();

    for load in [&mut dhcp_load, &mut dns_load, &mut proxy_load] {
        let status = load.wait_exit(Duration::from_secs(seconds + 30));
        assert!(status.success(), "{}", load.describe());
    }
    let rss_end = rss_kib(server.proc.pid());
    server.stop();

    // Every lease the bench saw acknowledged (the newest per MAC) is active
    // in the store, and no address has two holders.
    let mut newest: HashMap<String, String> = HashMap::new();
    for line in complete_lines(&acked) {
        let (mac, ip) = line.split_once(' ').unwrap();
        newest.insert(mac.to_ascii_lowercase(), ip.to_owned());
    }
    let mut holders: HashMap<&str, &str> = HashMap::new();
    let mut duplicates = 0;
    for (mac, ip) in &newest {
        if holders.insert(ip, mac).is_some() {
            duplicates += 1;
        }
    }
    let active: HashMap<String, String> = leases(&config)
        .into_iter()
        .filter(|l| l.state == "active")
        .map(|l| (l.ip, l.hw.to_ascii_lowercase()))
        .collect();
    let lost = newest
        .iter()
        .filter(|(mac, ip)| active.get(*ip) != Some(*mac))
        .count();

    let (dhcp_s, dns_s, proxy_s) = (
        dhcp_load.json_summary(),
        dns_load.json_summary(),
        proxy_load.json_summary(),
    );
    eprintln!(
        "soak {seconds} s, kill -9 at {half:?}, ready again after {down_for:?}\n\
         DHCP: {} exchanges, {} ACKed ({} before the kill), {} distinct leases, lost {lost}, addresses with two holders {duplicates}\n\
         DNS: {} sent, {} answered, {} lost\n\
         proxy: {} exchanges ok, {} failed\n\
         RSS KiB: {rss_start} at start, {rss_before_kill} before the kill, {rss_end} at the end (restarted process)",
        count(&dhcp_s, "started"),
        count(&dhcp_s, "acked"),
        acked_before_kill,
        newest.len(),
        count(&dns_s, "sent"),
        count(&dns_s, "responses"),
        count(&dns_s, "lost"),
        count(&proxy_s, "ok"),
        count(&proxy_s, "failed"),
    );
    assert_eq!(lost, 0, "acknowledged leases lost");
    assert_eq!(duplicates, 0, "addresses acknowledged to two clients");
    assert!(
        count(&dhcp_s, "acked") > acked_before_kill as u64,
        "DHCP served again after the restart"
    );
    // Outside the kill's window nothing is lost: the losses are bounded by
    // what the load sends while the appliance is down, with a second's
    // margin each side.
    let window = down_for.as_secs_f64() + 2.0;
    assert!(
        (count(&dns_s, "lost") as f64) <= 1000.0 * window,
        "DNS lost more than the restart window explains"
    );
    assert!(
        (count(&proxy_s, "failed") as f64) <= 200.0 * window,
        "the proxy failed more than the restart window explains"
    );
}
