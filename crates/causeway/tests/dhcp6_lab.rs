//! Stateful DHCPv6 against real clients: ISC `dhclient -6` and `dhcpcd`,
//! each in a host namespace across a veth from causeway, each running a
//! hook of this test's (never touching the machine's resolv.conf or
//! routes). What they are given is read back from their own hooks, and
//! every lease they were given is read back from causeway's lease log.
//!
//! ```text
//!  host (dhclient -6 | dhcpcd) ── veth ── causeway (dhcp + dhcp6 pools, RA with the M flag)
//! ```
//!
//! Needs root (it prints a SKIP line otherwise).

use crate::support;

use std::fs;
use std::path::Path;
use std::time::Duration;

use support::{metric, poll_until, root_or_skip, tool, AdminAt, Appliance, Netns};

const RTR_IF: &str = "cw-d60";
const HOST_IF: &str = "cw-d6h0";
const ADMIN_PORT: u16 = 9090;

fn sysctl(ns: &Netns, setting: &str) {
    support::run(ns.command("sysctl").args(["-q", "-w", setting]));
}

fn link() -> (Netns, Netns) {
    let rtr = Netns::new("d6");
    let host = Netns::new("d6h");
    sysctl(&rtr, "net.ipv6.conf.default.accept_dad=0");
    sysctl(&host, "net.ipv6.conf.default.accept_dad=0");
    rtr.veth_to(
        RTR_IF,
        Some("02:00:00:00:0b:01"),
        &host,
        HOST_IF,
        Some("02:00:00:00:0b:09"),
    );
    rtr.ip(&["addr", "add", "192.168.77.1/24", "dev", RTR_IF]);
    (rtr, host)
}

/// The lease log's path inside `dir`.
fn lease_file(dir: &Path) -> std::path::PathBuf {
    dir.join("leases.jsonl")
}

fn start(dir: &Path, rtr: &Netns, dhcp6: &str) -> Appliance {
    let config = dir.join("causeway.yaml");
    fs::write(
        &config,
        format!(
            "log: {{level: debug}}\nadmin: {{listen: \"127.0.0.1:{ADMIN_PORT}\"}}\n\
             cluster: {{name: hosted, baseDomain: example.com}}\n\
             network: {{interface: {RTR_IF}, cidr: 192.168.77.0/24, gateway: 192.168.77.254, address: 192.168.77.1}}\n\
             dhcp:\n  leaseFile: {}\n  subnets: [{{pools: [{{start: 192.168.77.100, end: 192.168.77.150}}]}}]\n\
             routerAdvertisements:\n  interface: {RTR_IF}\n  prefixes: [{{prefix: 'fd42:10::/64', autonomous: false}}]\n  managed: true\n  otherConfig: true\n\
             dhcp6:\n  interface: {RTR_IF}\n  dnsServers: ['fd42:10::53']\n  domainSearch: [hosted.example.com]\n  prefix: fd42:10::/64\n  pools: [{{start: 'fd42:10::100', end: 'fd42:10::1ff'}}]\n  preferredLifetime: 10m\n  validLifetime: 20m\n{dhcp6}",
            lease_file(dir).display()
        ),
    )
    .unwrap();
    Appliance::start(
        "causeway",
        dir,
        Some(rtr),
        &config,
        AdminAt::Netns {
            ns: rtr.name().to_owned(),
            port: ADMIN_PORT,
        },
    )
}

/// A hook that records every variable the client passes it, one line per
/// run, and changes nothing on the machine.
fn recording_hook(hook: &Path, log: &Path) {
    fs::write(
        hook,
        format!(
            "#!/bin/sh\n# causeway test hook: records what the client was given; never resolv.conf, routes or addresses.\necho \"reason=$reason $(env | grep -E '^(new_|old_)' | sort | tr '\\n' ' ')\" >> '{}'\nexit 0\n",
            log.display()
        ),
    )
    .unwrap();
    let executable = <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    fs::set_permissions(hook, executable).unwrap();
}

fn link_local_ready(ns: &Netns, dev: &str) {
    poll_until(Duration::from_secs(5), || {
        let ll = ns.ip(&["-6", "-o", "addr", "show", "dev", dev, "scope", "link"]);
        (!ll.is_empty() && !ll.contains("tentative")).then_some(())
    })
    .expect("the link-local address left DAD");
}

/// `name=value` from a hook line.
fn var<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// The v6 records of the lease log that hold `ip` for a client, as the
/// server wrote them.
fn logged(dir: &Path, ip: &str) -> Vec<serde_json::Value> {
    fs::read_to_string(lease_file(dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["ip"] == ip)
        .collect()
}

/// Runs `dhclient -6` once (stateful, `-1`: one attempt, bounded by
/// `timeout`) with its own lease file and DUID type, and returns the
/// address it was bound to and the DUID it used.
fn dhclient_once(host: &Netns, dir: &Path, lease_db: &str, duid_type: &str) -> (String, String) {
    dhclient_with(host, dir, lease_db, duid_type, "")
}

fn dhclient_with(
    host: &Netns,
    dir: &Path,
    lease_db: &str,
    duid_type: &str,
    conf_text: &str,
) -> (String, String) {
    let (hook, log) = (dir.join("hook6.sh"), dir.join(format!("{lease_db}.log")));
    recording_hook(&hook, &log);
    let conf = dir.join("dhclient6.conf");
    fs::write(&conf, conf_text).unwrap();
    let dhclient = tool("dhclient", "isc-dhcp-client");
    let pid = dir.join(format!("{lease_db}.pid"));
    let out = support::run(
        host.command("timeout")
            .arg("25")
            .arg(&dhclient)
            .args(["-6", "-1", "-v", "-D", duid_type, "-cf"])
            .arg(&conf)
            .arg("-sf")
            .arg(&hook)
            .arg("-lf")
            .arg(dir.join(lease_db))
            .arg("-pf")
            .arg(&pid)
            .arg(HOST_IF),
    );
    // dhclient daemonises once bound; it is stopped here, with -x, which
    // releases nothing (unlike -r).
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("kill $(cat '{}') 2>/dev/null", pid.display()))
        .status();
    let recorded = fs::read_to_string(&log).unwrap_or_default();
    let bound = recorded
        .lines()
        .find(|l| l.starts_with("reason=BOUND6"))
        .unwrap_or_else(|| panic!("dhclient was not bound:\n{recorded}\n{out}"))
        .to_owned();
    let ip = var(&bound, "new_ip6_address")
        .unwrap_or_else(|| panic!("no address in {bound}"))
        .to_owned();
    assert_eq!(
        var(&bound, "new_dhcp6_name_servers"),
        Some("fd42:10::53"),
        "{bound}"
    );
    assert!(bound.contains("hosted.example.com"), "{bound}");
    let leases = fs::read_to_string(dir.join(lease_db)).unwrap_or_default();
    let duid = leases
        .lines()
        .find_map(|l| l.trim().strip_prefix("default-duid "))
        .unwrap_or_else(|| panic!("no default-duid in dhclient's lease file:\n{leases}"))
        .trim_end_matches(';')
        .to_owned();
    (ip, duid)
}

#[test]
fn dhclient_is_given_a_pool_address_whose_lease_is_on_disk_and_renews_it() {
    if !root_or_skip("dhclient_is_given_a_pool_address_whose_lease_is_on_disk_and_renews_it") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link();
    let appliance = start(dir.path(), &rtr, "");
    link_local_ready(&host, HOST_IF);
    let (ip, _) = dhclient_once(&host, dir.path(), "first.leases", "LLT");
    let addr: std::net::Ipv6Addr = ip.parse().unwrap();
    let n = u128::from(addr);
    assert!(
        (0xfd42_0010_0000_0000_0000_0000_0000_0100..=0xfd42_0010_0000_0000_0000_0000_0000_01ff)
            .contains(&n),
        "{ip} is outside the pool"
    );
    // The Reply left after its lease was durable: the record is in the log.
    let records = logged(dir.path(), &ip);
    assert!(
        records.iter().any(|r| r["state"] == "active"),
        "no active record for {ip} in the log: {records:?}"
    );
    assert_eq!(records.last().unwrap()["hw"], "02:00:00:00:0b:09");
    // The same client (its DUID kept in its lease file) asks again and is
    // given the same address.
    let (again, _) = dhclient_once(&host, dir.path(), "first.leases", "LLT");
    assert_eq!(again, ip);
    let metrics = appliance.metrics();
    assert!(
        metric(&metrics, "causeway_dhcp6_sent_total{type=\"reply\"}").unwrap_or(0.0) >= 2.0,
        "{metrics}"
    );
    // The pool gauges, refreshed every 5 s: 256 addresses, one leased.
    let gauges = poll_until(Duration::from_secs(8), || {
        let m = appliance.metrics();
        (metric(&m, "causeway_dhcp6_addresses{state=\"leased\"}") == Some(1.0)).then_some(m)
    })
    .unwrap_or_else(|| appliance.metrics());
    assert_eq!(
        metric(&gauges, "causeway_dhcp6_addresses{state=\"leased\"}"),
        Some(1.0),
        "{gauges}"
    );
    assert_eq!(
        metric(&gauges, "causeway_dhcp6_addresses{state=\"total\"}"),
        Some(256.0)
    );
    appliance.stop();
}

#[test]
fn a_client_that_sends_its_name_resolves_by_aaaa_and_its_address_by_ptr() {
    if !root_or_skip("a_client_that_sends_its_name_resolves_by_aaaa_and_its_address_by_ptr") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link();
    let appliance = start(
        dir.path(),
        &rtr,
        "dns: {listen: ['127.0.0.1:5353'], upstreams: ['127.0.0.1:9']}\n",
    );
    link_local_ready(&host, HOST_IF);
    let (ip, _) = dhclient_with(
        &host,
        dir.path(),
        "named.leases",
        "LL",
        "send fqdn.fqdn \"worker-6\";\n",
    );
    let dig = |args: &[&str]| {
        support::run(
            rtr.command(tool("dig", "bind9-dnsutils"))
                .args(["@127.0.0.1", "-p", "5353", "+short", "+tries=1", "+time=2"])
                .args(args),
        )
        .trim()
        .to_owned()
    };
    let name = "worker-6.hosted.example.com";
    // The observer registers the name once the lease is durable, which
    // the Reply already waited for.
    assert_eq!(dig(&[name, "AAAA"]), ip);
    assert_eq!(dig(&["-x", &ip]), format!("{name}."));
    let records = logged(dir.path(), &ip);
    assert_eq!(records.last().unwrap()["hostname"], "worker-6");
    appliance.stop();
}

#[test]
fn a_reservation_by_mac_holds_across_a_restart_with_a_new_duid() {
    if !root_or_skip("a_reservation_by_mac_holds_across_a_restart_with_a_new_duid") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link();
    let appliance = start(
        dir.path(),
        &rtr,
        "  reservations: [{mac: '02:00:00:00:0b:09', ip: 'fd42:10::50', hostname: worker-0}]\n",
    );
    link_local_ready(&host, HOST_IF);
    // First boot: a DUID-LLT. The reinstalled machine comes back with a
    // DUID-LL (RHCOS's ipv6.dhcp-duid=ll), a DUID the server never saw.
    let (first, llt) = dhclient_once(&host, dir.path(), "install.leases", "LLT");
    let (second, ll) = dhclient_once(&host, dir.path(), "firstboot.leases", "LL");
    assert_ne!(llt, ll, "the client's DUID did not change");
    assert_eq!(first, "fd42:10::50");
    assert_eq!(second, "fd42:10::50");
    let records = logged(dir.path(), "fd42:10::50");
    assert!(records.len() >= 2, "{records:?}");
    assert_ne!(
        records[0]["client"],
        records.last().unwrap()["client"],
        "both DUIDs wrote the reserved address"
    );
    assert_eq!(records.last().unwrap()["hostname"], "worker-0");
    appliance.stop();
}

#[test]
fn dhcpcd_follows_the_m_flag_to_a_leased_address() {
    if !root_or_skip("dhcpcd_follows_the_m_flag_to_a_leased_address") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link();
    let appliance = start(dir.path(), &rtr, "");
    let (hook, log) = (dir.path().join("hook6.sh"), dir.path().join("hook6.log"));
    recording_hook(&hook, &log);
    let conf = dir.path().join("dhcpcd.conf");
    // The advertisement's M flag makes dhcpcd ask for an address (IA_NA);
    // the prefix is not autonomous, so no SLAAC address stands beside it.
    fs::write(
        &conf,
        "ipv6only\nnohook resolv.conf\noption domain_name_servers, domain_search\n",
    )
    .unwrap();
    let client = support::dhcpcd6(&host, dir.path(), &conf, &hook, HOST_IF);
    let bound = poll_until(Duration::from_secs(25), || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("new_dhcp6_ia_na1_ia_addr1="))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| {
        panic!(
            "dhcpcd passed no leased address to its hook:\n{}\n{}\n{}",
            fs::read_to_string(&log).unwrap_or_default(),
            client.describe(),
            appliance.proc.describe()
        )
    });
    let ip = var(&bound, "new_dhcp6_ia_na1_ia_addr1").unwrap().to_owned();
    assert!(ip.starts_with("fd42:10::1"), "{bound}");
    assert!(bound.contains("fd42:10::53"), "{bound}");
    let records = logged(dir.path(), &ip);
    assert!(
        records.iter().any(|r| r["state"] == "active"),
        "no active record for {ip}: {records:?}"
    );
    // dhcpcd puts the address on the interface.
    let on_link = poll_until(Duration::from_secs(5), || {
        host.ip(&["-6", "-o", "addr", "show", "dev", HOST_IF])
            .contains(&ip)
            .then_some(())
    });
    assert!(on_link.is_some(), "{ip} not on {HOST_IF}");
    drop(client);
    appliance.stop();
}

/// The lease log's newest record per address, as `causeway leases --json`
/// reads it (both engines' recovery): address -> (state, client, hw).
fn store_view(config: &Path) -> std::collections::HashMap<String, (String, String, String)> {
    support::leases(config)
        .into_iter()
        .map(|l| {
            (
                l.ip,
                (
                    l.state,
                    l.client.replace(':', "").to_ascii_lowercase(),
                    l.hw.to_ascii_lowercase(),
                ),
            )
        })
        .collect()
}

#[test]
fn every_acknowledged_v6_and_v4_lease_survives_kill_9_under_mixed_load_in_one_store() {
    let test = "every_acknowledged_v6_and_v4_lease_survives_kill_9_under_mixed_load_in_one_store";
    if !root_or_skip(test) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link();
    rtr.ip(&["-6", "addr", "add", "fd42:10::1/64", "dev", RTR_IF, "nodad"]);
    host.ip(&[
        "-6",
        "addr",
        "add",
        "fd42:10::2/64",
        "dev",
        HOST_IF,
        "nodad",
    ]);
    let config = dir.path().join("causeway.yaml");
    fs::write(
        &config,
        format!(
            "log: {{level: info}}\nadmin: {{listen: \"127.0.0.1:{ADMIN_PORT}\"}}\n\
             network: {{interface: {RTR_IF}, cidr: 192.168.77.0/24, gateway: 192.168.77.254, address: 192.168.77.1}}\n\
             dhcp:\n  listen: [{{address: \"127.0.0.1:6767\"}}]\n  leaseFile: {}\n  leaseTime: 1h\n  subnets:\n    - {{cidr: 10.200.0.0/16, relayAddresses: [127.0.0.1], serverId: 127.0.0.1}}\n\
             dhcp6:\n  interface: {RTR_IF}\n  dnsServers: ['fd42:10::53']\n  prefix: fd42:10::/64\n  pools: [{{start: 'fd42:10::1:0', end: 'fd42:10::1:ffff'}}]\n",
            lease_file(dir.path()).display()
        ),
    )
    .unwrap();
    let admin = AdminAt::Netns {
        ns: rtr.name().to_owned(),
        port: ADMIN_PORT,
    };
    let mut server = Appliance::start("causeway-1", dir.path(), Some(&rtr), &config, admin.clone());
    let (acked6, acked4) = (dir.path().join("acked6.txt"), dir.path().join("acked4.txt"));
    // DHCPv6 from the host as a relay, DHCPv4 relayed on the router's
    // loopback: both into the same log, each bounded in rate and time.
    let mut load6 = host.command(support::bench_bin());
    load6
        .args([
            "dhcp6",
            "--server",
            "[fd42:10::1]:547",
            "--bind",
            "[fd42:10::2]:547",
        ])
        .args(["--link-address", "fd42:10::2", "--clients", "20000"])
        .args([
            "--rate",
            "2000",
            "--duration",
            "30s",
            "--json",
            "--acked-file",
        ])
        .arg(&acked6);
    let mut load6 = support::Proc::spawn("bench-dhcp6", dir.path(), &mut load6);
    let mut load4 = rtr.command(support::bench_bin());
    load4
        .args([
            "dhcp",
            "--server",
            "127.0.0.1:6767",
            "--bind",
            "127.0.0.1:0",
        ])
        .args([
            "--clients",
            "20000",
            "--rate",
            "1000",
            "--duration",
            "30s",
            "--json",
        ])
        .arg("--acked-file")
        .arg(&acked4);
    let mut load4 = support::Proc::spawn("bench-dhcp4", dir.path(), &mut load4);
    support::wait_for(
        "2000 DHCPv6 and 1000 DHCPv4 acknowledged leases",
        Duration::from_secs(60),
        || {
            (support::complete_lines(&acked6).len() >= 2000
                && support::complete_lines(&acked4).len() >= 1000)
                .then_some(())
        },
        || {
            format!(
                "{}\n{}\n{}",
                load6.describe(),
                load4.describe(),
                server.proc.describe()
            )
        },
    );
    server.proc.kill9();
    for load in [&mut load6, &mut load4] {
        load.signal("INT");
        load.wait_exit(Duration::from_secs(15));
    }
    drop(server);
    let store = store_view(&config);
    // IAID 1 then the DUID: the client key of a v6 record.
    let mut missing6 = Vec::new();
    let acked: std::collections::HashMap<String, String> = support::complete_lines(&acked6)
        .iter()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(d, ip)| (d.to_owned(), ip.to_owned()))
        })
        .collect();
    assert!(
        acked.len() >= 2000,
        "only {} DUIDs acknowledged",
        acked.len()
    );
    for (duid, ip) in &acked {
        let want = format!("00000001{duid}");
        match store.get(ip) {
            Some((state, client, _)) if state == "active" && *client == want => {}
            other => missing6.push((ip.clone(), other.cloned())),
        }
    }
    assert!(
        missing6.is_empty(),
        "{} of {} acknowledged DHCPv6 leases are not active for their client after kill -9, e.g. {:?}",
        missing6.len(),
        acked.len(),
        &missing6[..missing6.len().min(5)]
    );
    let mut missing4 = Vec::new();
    let acked4_leases: std::collections::HashMap<String, String> = support::complete_lines(&acked4)
        .iter()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(m, ip)| (m.to_ascii_lowercase(), ip.to_owned()))
        })
        .collect();
    for (mac, ip) in &acked4_leases {
        match store.get(ip) {
            Some((state, _, hw)) if state == "active" && hw == mac => {}
            other => missing4.push((ip.clone(), other.cloned())),
        }
    }
    assert!(
        missing4.is_empty(),
        "{} of {} acknowledged DHCPv4 leases are not active after kill -9, e.g. {:?}",
        missing4.len(),
        acked4_leases.len(),
        &missing4[..missing4.len().min(5)]
    );
    // The restarted server's engine holds them too (its /leases lists what
    // the engines hold, not the log).
    let server = Appliance::start("causeway-2", dir.path(), Some(&rtr), &config, admin.clone());
    let (status, body) = admin
        .get("/leases")
        .expect("the admin server answered /leases");
    assert_eq!(status, 200, "{body}");
    let leases: serde_json::Value = serde_json::from_str(&body).unwrap();
    let held: std::collections::HashSet<String> = leases
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] == "active")
        .filter_map(|l| l["ip"].as_str().map(str::to_owned))
        .collect();
    let lost: Vec<&String> = acked.values().filter(|ip| !held.contains(*ip)).collect();
    assert!(
        lost.is_empty(),
        "the restarted server does not hold {} of them, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    server.stop();
}
