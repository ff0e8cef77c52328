//! Soak: the appliance with DHCP, DNS and the proxy together under steady
//! mixed load from causeway-bench, on loopback, with a kill -9 of the
//! appliance half way through and a restart on the same lease file.
//!
//! Asserts what a user would ask after a crash: no ACKed lease lost (every
//! ACK the bench received, checked against the lease file), no address
//! acknowledged to two clients at overlapping times, DNS queries lost and
//! proxy exchanges failed within the kill's window, and the appliance's
//! memory at the end of each half within what its budgets allow
//! ([`rss_bound_kib`]).
//!
//! `CAUSEWAY_SOAK_SECONDS` sets the length (default 60, which CI runs; the
//! figures in docs/reliability.md are from 600). Every load is bounded by
//! it. causeway-bench must be built first: `cargo build -p causeway-bench`.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashSet;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    ack_log, bench_bin, complete_lines, leases, reserved_port, reserved_port_on, rss_kib, unix_ms,
    AdminAt, Appliance, Proc,
};

/// The DNS cache's byte budget in this test: small enough that the miss
/// class's unique names fill it within the CI run, so the memory bound
/// below holds the cache at its budget, not at wherever it got to.
const DNS_CACHE_MAX_BYTES: u64 = 1 << 20;
/// What one lease may cost the appliance: its record in the engine and its
/// indexes (by address, by client), generously. 20,000 leases: 20 MiB.
const KIB_PER_LEASE: u64 = 1;
/// Room for what is not a budget: allocator slack, per-thread arenas, the
/// proxy's buffers for its connections in flight, a burst of DNS queries.
const SLACK_KIB: u64 = 8 * 1024;

/// The appliance's resident set may grow from `start_kib` by its DNS
/// cache's budget, its lease table (`leases` held), and [`SLACK_KIB`].
fn rss_bound_kib(start_kib: u64, leases: u64) -> u64 {
    start_kib + DNS_CACHE_MAX_BYTES / 1024 + leases * KIB_PER_LEASE + SLACK_KIB
}

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
    let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port_on(Ipv4Addr::LOCALHOST)));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let proxy = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let echo = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let upstream_dns = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));

    // The far ends: an echo server behind the proxy, and a DNS responder
    // that answers every A question, as the forwarder's upstream. Both run
    // a little longer than the soak and are killed on drop.
    let run_for = format!("{}s", seconds + 60);
    let _echo = support::echo_upstream(d, echo, &run_for);
    let _upstream = support::dns_floor_upstream(d, upstream_dns);
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
  cache: {{maxBytes: {cache_bytes}}}
proxy:
  listenAddress: 127.0.0.1
  listeners:
    - {{port: {proxy_port}, upstream: "{echo}"}}
"#,
            lease = d.join("leases.jsonl").display(),
            proxy_port = proxy.port(),
            cache_bytes = DNS_CACHE_MAX_BYTES,
        ),
    )
    .unwrap();

    let mut server = start(d, &config, admin, "causeway");
    let rss_start = rss_kib(server.proc.pid());
    let duration = format!("{seconds}s");
    let acked = d.join("acks.log");
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
            .args(["--duration", &duration, "--json", "--ack-log"])
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
    let leases_before_kill = leases(&config).len() as u64;
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

    // Every ACK the bench received: no address went to a second client
    // while the first one's lease ran, and every lease that should still
    // be active (each client's newest) is active in the store, on that
    // address, until at least when its ACK said.
    let log = ack_log(&acked);
    let store = leases(&config);
    let overlaps = log.overlapping_holders();
    let missing = log.missing_from(&store, unix_ms());
    let clients: HashSet<&str> = log.acks.iter().map(|a| a.mac.as_str()).collect();
    let (lost, duplicates) = (missing.len(), overlaps.len());
    let bound_before_kill = rss_bound_kib(rss_start, leases_before_kill);
    let bound_end = rss_bound_kib(rss_start, store.len() as u64);

    let (dhcp_s, dns_s, proxy_s) = (
        dhcp_load.json_summary(),
        dns_load.json_summary(),
        proxy_load.json_summary(),
    );
    eprintln!(
        "soak {seconds} s, kill -9 at {half:?}, ready again after {down_for:?}\n\
         DHCP: {} exchanges, {} ACKed ({} before the kill) to {} clients, lost {lost}, ACKs overlapping another client's lease {duplicates}\n\
         DNS: {} sent, {} answered, {} lost\n\
         proxy: {} exchanges ok, {} failed\n\
         RSS KiB: {rss_start} at start, {rss_before_kill} before the kill (bound {bound_before_kill}, {leases_before_kill} leases), {rss_end} at the end (restarted process; bound {bound_end}, {} leases)",
        count(&dhcp_s, "started"),
        count(&dhcp_s, "acked"),
        acked_before_kill,
        clients.len(),
        count(&dns_s, "sent"),
        count(&dns_s, "responses"),
        count(&dns_s, "lost"),
        count(&proxy_s, "ok"),
        count(&proxy_s, "failed"),
        store.len(),
    );
    assert!(
        missing.is_empty(),
        "{lost} acknowledged leases lost, the first: {:?}",
        &missing[..lost.min(5)]
    );
    assert!(
        overlaps.is_empty(),
        "{duplicates} ACKs of an address another client's lease still held, the first: {:?}",
        &overlaps[..duplicates.min(5)]
    );
    assert!(
        rss_before_kill <= bound_before_kill,
        "RSS {rss_before_kill} KiB before the kill, over the bound of {bound_before_kill} KiB \
         (start {rss_start} + DNS cache {} + {leases_before_kill} leases + slack {SLACK_KIB})",
        DNS_CACHE_MAX_BYTES / 1024
    );
    assert!(
        rss_end <= bound_end,
        "RSS {rss_end} KiB at the end, over the bound of {bound_end} KiB \
         (start {rss_start} + DNS cache {} + {} leases + slack {SLACK_KIB})",
        DNS_CACHE_MAX_BYTES / 1024,
        store.len()
    );
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
