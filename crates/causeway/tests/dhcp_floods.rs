//! DHCP floods from hostile clients on the VLAN, with the real appliance
//! and causeway-bench as the attacker, on 127.0.0.1 high ports (relay mode,
//! no privileges):
//!
//! - random MACs that DISCOVER and never REQUEST, each offer holding an
//!   address for the offer timeout (offer exhaustion);
//! - random MACs that take a lease and DECLINE it at once, each DECLINE
//!   quarantining an address (the quarantine attack; the per-client
//!   DECLINE cap cannot see fresh MACs).
//!
//! - and, on a VLAN the test builds in network namespaces (root), random
//!   MACs that set `giaddr` to another subnet's relay address, posing as a
//!   relay to draw from that subnet's pool.
//!
//! The first two run twice against the same pool: once with the rate limits set,
//! where the pool keeps free addresses, another subnet's relay is served
//! during the flood and the drops show in the metrics; and once with no
//! shared limits, as the control, where the same flood takes the pool.
//! causeway-bench must be built first: `cargo build -p causeway-bench`.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use support::{
    bench_bin, metric, poll_until, root_or_skip_for, wait_for, AdminAt, Appliance, DhcpLab, Netns,
    Proc, Relay,
};

/// The attacker's relay (subnet A) and a legitimate relay (subnet B).
const RELAY_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const RELAY_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Addresses in each subnet's pool.
const POOL: f64 = 50.0;

/// Two subnets of 50 addresses, each behind its relay; `limits` is added
/// to the dhcp section.
fn two_subnet_lab(limits: &str) -> DhcpLab {
    DhcpLab::new("causeway-floods-", |dir, admin, dhcp| {
        format!(
            r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {lease}
  offerTimeout: 5s
{limits}
  subnets:
    - {{cidr: 10.1.0.0/24, relayAddresses: [{RELAY_A}], serverId: 127.0.0.1, pools: [{{start: 10.1.0.10, end: 10.1.0.59}}]}}
    - {{cidr: 10.2.0.0/24, relayAddresses: [{RELAY_B}], serverId: 127.0.0.1, pools: [{{start: 10.2.0.10, end: 10.2.0.59}}]}}
"#,
            lease = dir.join("leases.jsonl").display(),
        )
    })
}

/// causeway-bench as the attacker through relay A: fresh MACs at 3,000
/// exchanges a second for `seconds`, in `mode`.
fn start_flood(lab: &DhcpLab, mode: &str, seconds: u32) -> Proc {
    let mut cmd = Command::new(bench_bin());
    cmd.args(["dhcp", "--server", &lab.dhcp.to_string()])
        .args(["--bind", &format!("{RELAY_A}:0"), "--clients", "1000000"])
        .args(["--rate", "3000", "--max-outstanding", "512"])
        .args(["--duration", &format!("{seconds}s"), "--timeout", "200ms"])
        .args(["--json", mode]);
    Proc::spawn("causeway-bench", lab.dir.path(), &mut cmd)
}

/// Pool A now, from the live lease table (`/leases`: offers, leases and
/// quarantined addresses whose time has not run out; the pool gauges are
/// refreshed only every 5 s): free addresses, and those in quarantine.
fn pool_a(server: &Appliance) -> (f64, f64) {
    let Some((200, body)) = server.admin.get("/leases") else {
        panic!("/leases did not answer\n{}", server.proc.describe());
    };
    let leases: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let held: Vec<&str> = leases
        .iter()
        .filter(|l| l["ip"].as_str().is_some_and(|ip| ip.starts_with("10.1.0.")))
        .filter(|l| l["expires"].as_u64().is_some_and(|e| e > now))
        .filter_map(|l| l["state"].as_str())
        .filter(|s| matches!(*s, "offered" | "active" | "declined"))
        .collect();
    let declined = held.iter().filter(|s| **s == "declined").count();
    (POOL - held.len() as f64, declined as f64)
}

fn dropped(server: &Appliance, reason: &str) -> f64 {
    metric(
        &server.metrics(),
        &format!(r#"causeway_dhcp_dropped_total{{reason="{reason}"}}"#),
    )
    .unwrap_or(0.0)
}

/// What one flood did to subnet A, watched while it ran.
struct Outcome {
    /// The fewest free addresses pool A had at any sample.
    least_free: f64,
    /// The most addresses of pool A in quarantine at any sample.
    most_declined: f64,
    /// Whether a client behind relay B got a lease while the flood ran.
    other_subnet_served_during: bool,
    /// Whether a fresh client behind relay A got a lease once it was over.
    flooded_subnet_served_after: bool,
}

impl Outcome {
    /// What the limits promise: at most `rateLimitPerSubnet` x
    /// `offerTimeout` addresses (30 of 50 here) held by the flood, the other
    /// relay served while it runs, the flooded subnet serving once it ends.
    fn assert_contained(&self) {
        assert!(
            self.least_free >= 15.0,
            "the pool fell to {} free under the limits",
            self.least_free
        );
        assert!(self.other_subnet_served_during);
        assert!(self.flooded_subnet_served_after);
    }
}

fn run_flood(lab: &DhcpLab, mode: &str) -> Outcome {
    let server = lab.start("causeway");
    let mut flood = start_flood(lab, mode, 6);
    let debug = || server.proc.describe();
    // Under way: the server has seen the flood.
    wait_for(
        "the flood to reach the server",
        Duration::from_secs(10),
        || {
            (metric(
                &server.metrics(),
                r#"causeway_dhcp_received_total{type="discover"}"#,
            )
            .unwrap_or(0.0)
                > 100.0)
                .then_some(())
        },
        debug,
    );
    let (mut least_free, mut most_declined) = pool_a(&server);
    let sample = |least_free: &mut f64, most_declined: &mut f64| {
        let (free, declined) = pool_a(&server);
        *least_free = least_free.min(free);
        *most_declined = most_declined.max(declined);
    };
    let mut relay_b = Relay::at(RELAY_B, lab.dhcp);
    let mut other_subnet_served_during = false;
    let mut n = 0u8;
    // Sample the pool and serve relay B's clients until the flood ends
    // (bounded by the flood's own duration).
    while flood.try_status().is_none() {
        sample(&mut least_free, &mut most_declined);
        n = n.wrapping_add(1);
        if let Some(ack) = relay_b.try_dora([0x52, 0x54, 0, 0, 0xb0, n]) {
            assert_eq!(ack.yiaddr().octets()[..3], [10, 2, 0]);
            other_subnet_served_during |= flood.try_status().is_none();
        }
    }
    let status = flood.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{}", flood.describe());
    sample(&mut least_free, &mut most_declined);
    // Once the flood is over (and its second's budget spent), a new client
    // behind the flooded relay gets an address, or the pool is gone.
    let mut relay_a = Relay::at(RELAY_A, lab.dhcp);
    let flooded_subnet_served_after = poll_until(Duration::from_secs(4), || {
        relay_a.try_dora([0x52, 0x54, 0, 0, 0xa0, 1])
    })
    .is_some();
    eprintln!(
        "{mode}: pool A least free {least_free} of {POOL}, most in quarantine {most_declined}; relay B served during: {other_subnet_served_during}; relay A served after: {flooded_subnet_served_after}; drops: relay {} subnet {} pool_exhausted {}\n{}",
        dropped(&server, "rate_limited_relay"),
        dropped(&server, "rate_limited_subnet"),
        dropped(&server, "pool_exhausted"),
        flood.output().lines().last().unwrap_or_default()
    );
    Outcome {
        least_free,
        most_declined,
        other_subnet_served_during,
        flooded_subnet_served_after,
    }
}

#[test]
fn a_random_mac_discover_flood_leaves_the_pool_and_other_relays_served() {
    // 5 DISCOVERs a second into the subnet, each holding an address for
    // the 5 s offer timeout: at most about 25 held at once, of 50.
    let lab = two_subnet_lab("  rateLimitPerRelay: 40\n  rateLimitPerSubnet: 5");
    let limited = run_flood(&lab, "--discover-only");
    limited.assert_contained();

    // Control: the same flood with only the per-client limit, which fresh
    // MACs never meet, takes every address in the pool.
    let open = two_subnet_lab("");
    let unlimited = run_flood(&open, "--discover-only");
    assert_eq!(
        unlimited.least_free, 0.0,
        "the control flood left addresses free"
    );
}

#[test]
fn a_random_mac_decline_flood_quarantines_only_what_the_limit_lets_through() {
    // Each lease taken and declined costs three messages of the subnet's
    // 6 a second (at most two addresses quarantined a second), and the
    // flood's own DISCOVERs crowd out most of its REQUESTs; offers hold
    // at most 6 x 5 s = 30 addresses.
    let lab = two_subnet_lab("  rateLimitPerRelay: 40\n  rateLimitPerSubnet: 6");
    let limited = run_flood(&lab, "--decline");
    assert!(
        limited.most_declined <= 14.0,
        "{} addresses quarantined under the limits",
        limited.most_declined
    );
    limited.assert_contained();

    // Control: with only the per-client limit every address is declined,
    // for the 24 h quarantine, and no new client is served.
    let open = two_subnet_lab("");
    let unlimited = run_flood(&open, "--decline");
    assert_eq!(
        unlimited.most_declined, POOL,
        "the control flood quarantined less than the pool"
    );
    assert!(
        !unlimited.flooded_subnet_served_after,
        "with every address quarantined no new client can be served"
    );
}

/// The VLAN: a server namespace and a client namespace on a veth pair,
/// causeway serving 10.77.0.0/24 on its end, and a second subnet
/// (10.88.0.0/24) that only a relay at 10.88.0.1 may draw from.
#[test]
fn a_forged_giaddr_flood_on_the_vlan_draws_nothing_from_another_subnet() {
    let test = "a_forged_giaddr_flood_on_the_vlan_draws_nothing_from_another_subnet";
    if !root_or_skip_for(test, "network namespaces and a veth pair") {
        return;
    }
    const SRV_IF: &str = "cw-gsrv0";
    const CLI_IF: &str = "cw-gcli0";
    const ADMIN_PORT: u16 = 9090;
    let dir = tempfile::Builder::new()
        .prefix("causeway-giaddr-")
        .tempdir()
        .unwrap();
    let srv = Netns::new("gsrv");
    let cli = Netns::new("gcli");
    srv.veth_to(SRV_IF, None, &cli, CLI_IF, None);
    srv.ip(&["addr", "add", "10.77.0.2/24", "dev", SRV_IF]);
    let config = dir.path().join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: info}}
admin: {{listen: "127.0.0.1:{ADMIN_PORT}"}}
network:
  interface: {SRV_IF}
  cidr: 10.77.0.0/24
  gateway: 10.77.0.1
  address: 10.77.0.2
dhcp:
  leaseFile: {lease}
  subnets:
    - pools: [{{start: 10.77.0.100, end: 10.77.0.150}}]
    - {{cidr: 10.88.0.0/24, relayAddresses: [10.88.0.1], serverId: 10.77.0.2, pools: [{{start: 10.88.0.10, end: 10.88.0.60}}]}}
"#,
            lease = dir.path().join("leases.jsonl").display()
        ),
    )
    .unwrap();
    let server = Appliance::start(
        "causeway",
        dir.path(),
        Some(&srv),
        &config,
        AdminAt::Netns {
            ns: srv.name().to_owned(),
            port: ADMIN_PORT,
        },
    );
    // The attacker: broadcast DISCOVERs and REQUESTs from fresh MACs with
    // giaddr 10.88.0.1, for 3 s at 1,000 a second.
    let mut forged = Proc::spawn(
        "forged-giaddr",
        dir.path(),
        cli.command(bench_bin())
            .args(["dhcp", "--interface", CLI_IF, "--giaddr", "10.88.0.1"])
            .args(["--clients", "100000", "--rate", "1000", "--duration", "3s"])
            .args(["--timeout", "300ms", "--json"]),
    );
    let status = forged.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", forged.describe());
    let flood = forged.json_summary();
    // A real client on the same segment is served from its own subnet.
    let mut honest = Proc::spawn(
        "honest-client",
        dir.path(),
        cli.command(bench_bin())
            .args([
                "dhcp",
                "--interface",
                CLI_IF,
                "--clients",
                "20",
                "--count",
                "20",
            ])
            .args([
                "--duration",
                "10s",
                "--timeout",
                "1s",
                "--mac-seed",
                "7",
                "--json",
            ]),
    );
    assert!(
        honest.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        honest.describe()
    );
    let honest_summary = honest.json_summary();

    let metrics = server.metrics();
    let unknown_relay = metric(
        &metrics,
        r#"causeway_dhcp_dropped_total{reason="unknown_relay"}"#,
    )
    .unwrap_or(0.0);
    let Some((200, body)) = server.admin.get("/leases") else {
        panic!("/leases did not answer\n{}", server.proc.describe());
    };
    let leases: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let in_b = leases
        .iter()
        .filter(|l| {
            l["ip"]
                .as_str()
                .is_some_and(|ip| ip.starts_with("10.88.0."))
        })
        .count();
    eprintln!(
        "{test}: {} forged DISCOVERs sent, {} offers seen, {unknown_relay} dropped as unknown_relay, {in_b} leases or offers in 10.88.0.0/24; the honest client got {} of 20",
        flood["started"], flood["offers"], honest_summary["acked"]
    );
    assert_eq!(in_b, 0, "a forged relay drew from the other subnet's pool");
    assert_eq!(
        flood["offers"].as_u64(),
        Some(0),
        "the forged relay got offers"
    );
    assert!(
        unknown_relay >= flood["started"].as_f64().unwrap() * 0.9,
        "the forged DISCOVERs were not counted as unknown_relay ({unknown_relay})"
    );
    assert_eq!(honest_summary["acked"].as_u64(), Some(20));
    // The drops are said once for the source, not once a packet.
    let warnings = server
        .proc
        .output()
        .matches("relayed DHCP packet dropped (unknown_relay)")
        .count();
    assert_eq!(
        warnings,
        1,
        "one warning for one forged relay source\n{}",
        server.proc.describe()
    );
    server.stop();
}
