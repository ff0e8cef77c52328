//! DHCP names in DNS under hostname churn: the real appliance with DHCP on
//! a loopback relay port and DNS on loopback, twenty hosts that keep their
//! names, and a fleet of hosts that renew (REQUEST with ciaddr) under a new
//! name every time, for a bounded time.
//!
//! Asserts that the learned-name table stays within the leases held, that
//! a renamed host's old name stops resolving and its new one resolves to
//! its address, and that no other host's PTR disappears. causeway-bench
//! must be built first: `cargo build -p causeway-bench`.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dhcproto::v4::DhcpOption;
use support::{
    ack_log, bench_bin, leases, metric, reserved_port, reserved_port_on, tool, unix_ms, AdminAt,
    Appliance, Proc, Relay,
};

const ZONE: &str = "hc1.example.test";
/// Hosts that never rename: their PTRs must outlive the churn.
const STABLE: u8 = 20;
/// The churn fleet: this many clients, renewing at this rate for this
/// long, each renewal under a new name.
const FLEET: u32 = 400;
const FLEET_RATE: u32 = 200;
const FLEET_SECONDS: u64 = 15;
/// Renamed hosts whose old and new names are asked for.
const SAMPLE: usize = 25;

/// A dig answer: its status and its answer records' data by type.
struct Dug {
    status: String,
    answers: Vec<(String, String)>,
    raw: String,
}

/// `dig @dns <args>`, one try of at most 2 s; `None` if nothing answered.
fn dig(dns: SocketAddr, args: &[&str]) -> Option<Dug> {
    let out = Command::new(tool("dig", "bind9-dnsutils"))
        .arg(format!("@{}", dns.ip()))
        .args(["-p", &dns.port().to_string()])
        .args(["+time=2", "+tries=1", "+noall", "+comments", "+answer"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = raw
        .split_once("status: ")?
        .1
        .split(',')
        .next()?
        .trim()
        .to_owned();
    let answers = raw
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5).then(|| (f[3].to_owned(), f[4].to_owned()))
        })
        .collect();
    Some(Dug {
        status,
        answers,
        raw,
    })
}

fn dig_ok(dns: SocketAddr, args: &[&str]) -> Dug {
    dig(dns, args).unwrap_or_else(|| panic!("dig {args:?} got no answer"))
}

fn names_held(app: &Appliance) -> f64 {
    metric(&app.metrics(), "causeway_dns_dhcp_names").expect("causeway_dns_dhcp_names exposed")
}

#[test]
fn renaming_hosts_leave_no_stale_names_and_take_no_other_hosts_ptr() {
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp-names-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port_on(Ipv4Addr::LOCALHOST)));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    // Nothing is forwarded (every name asked is the zone's or the VLAN's
    // reverse); a bound socket that never answers stands in as upstream.
    let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
    let config = d.join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: warn}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.test}}
# Never configured on this host: it gives DNS its reverse zone.
network:
  cidr: 10.9.0.0/20
  gateway: 10.9.0.1
  address: 10.9.0.2
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {leases}
  leaseTime: 1h
  subnets:
    - cidr: 10.9.0.0/20
      relayAddresses: [127.0.0.1]
      serverId: 127.0.0.1
      pools: [{{start: 10.9.0.10, end: 10.9.15.250}}]
dns:
  listen: ["{dns}"]
  upstreams: ["{up}"]
  upstreamTimeout: 1s
"#,
            leases = d.join("leases.jsonl").display(),
            up = upstream.local_addr().unwrap(),
        ),
    )
    .unwrap();
    let app = Appliance::start("causeway", d, None, &config, AdminAt::Host(admin));

    // The stable hosts, named once.
    let mut relay = Relay::new(dhcp);
    let stable: Vec<(String, Ipv4Addr)> = (0..STABLE)
        .map(|i| {
            let name = format!("stable-{i}");
            let mac = [0x52, 0x54, 0x00, 0x5a, 0x00, i];
            let ip = relay
                .dora(mac, &[DhcpOption::Hostname(name.clone())])
                .yiaddr();
            (name, ip)
        })
        .collect();

    // The churn fleet: every exchange after a client's first renews its
    // lease under a new name.
    let acks = d.join("acks.log");
    let mut fleet = Proc::spawn(
        "churn-fleet",
        d,
        Command::new(bench_bin())
            .args([
                "dhcp",
                "--server",
                &dhcp.to_string(),
                "--bind",
                "127.0.0.1:0",
            ])
            .args(["--clients", &FLEET.to_string(), "--mac-seed", "7"])
            .args(["--rate", &FLEET_RATE.to_string(), "--timeout", "1s"])
            .args(["--duration", &format!("{FLEET_SECONDS}s")])
            .args(["--renew", "--hostname", "churn-", "--json", "--ack-log"])
            .arg(&acks),
    );
    // While it runs, the table never holds more names than there are
    // leases: the stable hosts' and one per fleet client ACKed so far, or
    // about to be
    // (read after the metric, so it counts at least what the metric saw).
    let deadline = Instant::now() + Duration::from_secs(FLEET_SECONDS + 30);
    let mut samples = 0;
    let mut most = 0.0f64;
    while fleet.try_status().is_none() {
        assert!(
            Instant::now() < deadline,
            "the fleet did not finish\n{}",
            fleet.describe()
        );
        let held = names_held(&app);
        let log = ack_log(&acks);
        let leased: HashSet<&str> = log.acks.iter().map(|a| a.mac.as_str()).collect();
        // The server registers a name once its lease is durable, before
        // the bench has the ACK in its log: allow a second of ACKs in
        // between (CI once saw 70 names for 69 logged leases), never more
        // than the fleet has hosts. A rename that left its old name behind
        // goes past this once every host holds a lease.
        let in_between = FLEET_RATE as usize;
        let bound = f64::from(STABLE) + (leased.len() + in_between).min(FLEET as usize) as f64;
        assert!(
            held <= bound,
            "causeway_dns_dhcp_names {held} while {bound} leases carry names ({} ACKs so far)",
            log.acks.len()
        );
        most = most.max(held);
        samples += 1;
        // Pacing the samples, not waiting for an event.
        std::thread::sleep(Duration::from_millis(250));
    }
    let status = fleet.wait_exit(Duration::from_secs(5));
    assert!(status.success(), "{}", fleet.describe());
    let summary = fleet.json_summary();

    let log = ack_log(&acks);
    let store = leases(&config);
    let active = store.iter().filter(|l| l.state == "active").count();
    let held = names_held(&app);
    assert!(
        log.overlapping_holders().is_empty(),
        "{:?}",
        log.overlapping_holders()
    );
    let missing = log.missing_from(&store, unix_ms());
    assert!(
        missing.is_empty(),
        "leases lost: {:?}",
        &missing[..missing.len().min(5)]
    );
    assert!(
        held <= active as f64,
        "causeway_dns_dhcp_names {held} with {active} active leases"
    );

    // Per fleet client: its first and newest ACK.
    let mut first: HashMap<&str, &support::Ack> = HashMap::new();
    let mut newest: HashMap<&str, &support::Ack> = HashMap::new();
    for a in &log.acks {
        first.entry(&a.mac).or_insert(a);
        newest.insert(&a.mac, a);
    }
    let renamed: Vec<&str> = newest
        .iter()
        .filter(|(mac, a)| first[*mac].hostname != a.hostname)
        .map(|(mac, _)| *mac)
        .take(SAMPLE)
        .collect();
    assert_eq!(
        renamed.len(),
        SAMPLE,
        "too few clients renamed themselves: {summary}"
    );
    for mac in &renamed {
        let (old, new) = (first[mac], newest[mac]);
        let old_name = format!("{}.{ZONE}", old.hostname.as_deref().unwrap());
        let new_name = format!("{}.{ZONE}", new.hostname.as_deref().unwrap());
        let stale = dig_ok(dns, &[&old_name, "A"]);
        assert_eq!(
            stale.status, "NXDOMAIN",
            "{mac}'s old name {old_name} still resolves after it renamed itself {new_name}:\n{}",
            stale.raw
        );
        let current = dig_ok(dns, &[&new_name, "A"]);
        assert_eq!(
            current.answers,
            [("A".to_owned(), new.ip.clone())],
            "{mac}'s current name {new_name}:\n{}",
            current.raw
        );
        let ptr = dig_ok(dns, &["-x", &new.ip]);
        assert_eq!(
            ptr.answers,
            [("PTR".to_owned(), format!("{new_name}."))],
            "{mac}'s address {}:\n{}",
            new.ip,
            ptr.raw
        );
    }
    // No stable host lost its PTR (or its name) to the churn.
    for (name, ip) in &stable {
        let ptr = dig_ok(dns, &["-x", &ip.to_string()]);
        assert_eq!(
            ptr.answers,
            [("PTR".to_owned(), format!("{name}.{ZONE}."))],
            "the PTR of {ip}, a host that never renamed, after the churn:\n{}",
            ptr.raw
        );
    }
    eprintln!(
        "hostname churn: {FLEET} clients, {FLEET_SECONDS} s at {FLEET_RATE}/s: {} exchanges, {} ACKed ({} renewals); \
         causeway_dns_dhcp_names at most {most} over {samples} samples, {held} at the end with {active} active leases; \
         {SAMPLE} renamed hosts' old names NXDOMAIN, new ones and their PTRs answer; {STABLE} stable PTRs kept",
        summary["started"], summary["acked"], summary["renewals"],
    );
    app.stop();
}
