//! Router advertisements read by the other side: the Linux kernel of a
//! host namespace (SLAAC with `accept_ra=2`, default routes from the router
//! lifetime) and `rdisc6` from ndisc6, an independent decoder of every
//! option (RDNSS and DNSSL included, which the kernel leaves to user
//! space).
//!
//! ```text
//!  host (kernel SLAAC, rdisc6) ── veth ── causeway (routerAdvertisements)
//! ```
//!
//! Needs root (it prints a SKIP line otherwise).

use crate::support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{metric, poll_until, root_or_skip, tool, AdminAt, Appliance, Netns};

const RTR_IF: &str = "cw-ra0";
const HOST_IF: &str = "cw-rah0";
const ADMIN_PORT: u16 = 9090;
const PREFIX: &str = "fd42:10::";

fn sysctl(ns: &Netns, setting: &str) {
    support::run(ns.command("sysctl").args(["-q", "-w", setting]));
}

/// A router namespace whose interfaces skip duplicate address detection,
/// so its link-local address is usable at once, and a host namespace that
/// takes router advertisements, its link down until the test raises it.
fn link(host_dad: bool) -> (Netns, Netns) {
    let rtr = Netns::new("ra");
    let host = Netns::new("rah");
    sysctl(&rtr, "net.ipv6.conf.default.accept_dad=0");
    if !host_dad {
        sysctl(&host, "net.ipv6.conf.default.accept_dad=0");
    }
    rtr.veth_to(RTR_IF, Some("02:00:00:00:0a:01"), &host, HOST_IF, None);
    host.ip(&["link", "set", HOST_IF, "down"]);
    sysctl(&host, &format!("net.ipv6.conf.{HOST_IF}.accept_ra=2"));
    (rtr, host)
}

fn start(dir: &Path, rtr: &Netns, section: &str) -> Appliance {
    let config = dir.join("causeway.yaml");
    fs::write(
        &config,
        format!(
            "log: {{level: debug}}\nadmin: {{listen: \"127.0.0.1:{ADMIN_PORT}\"}}\ncluster: {{name: hosted, baseDomain: example.com}}\nrouterAdvertisements:\n  interface: {RTR_IF}\n{section}"
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

/// The host's global addresses in the prefix, with their flags.
fn slaac_addresses(host: &Netns) -> Vec<String> {
    host.ip(&[
        "-6", "-o", "addr", "show", "dev", HOST_IF, "scope", "global",
    ])
    .lines()
    .filter(|l| l.contains(PREFIX))
    .map(str::to_owned)
    .collect()
}

fn default_routes(host: &Netns) -> String {
    host.ip(&["-6", "route", "show", "default", "dev", HOST_IF])
}

fn rdisc6(host: &Netns) -> String {
    let rdisc6 = tool("rdisc6", "ndisc6");
    // -1: the first advertisement; -r 3 -w 2000: three solicitations two
    // seconds apart at most, so the call is bounded.
    support::run(
        host.command(rdisc6)
            .args(["-1", "-r", "3", "-w", "2000", HOST_IF]),
    )
}

fn field<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim())
        })
        .collect()
}

#[test]
fn a_host_forms_its_slaac_address_within_a_second_of_link_up_and_reads_dns_from_the_advertisement()
{
    if !root_or_skip(
        "a_host_forms_its_slaac_address_within_a_second_of_link_up_and_reads_dns_from_the_advertisement",
    ) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-ra-")
        .tempdir()
        .unwrap();
    // The host skips DAD, so the time measured is the solicitation's
    // answer and nothing of the host's own waiting.
    let (rtr, host) = link(false);
    let appliance = start(
        dir.path(),
        &rtr,
        &format!(
            "  prefixes: [{{prefix: '{PREFIX}/64'}}]\n  mtu: 1400\n  dnsServers: ['{PREFIX}53']\n"
        ),
    );

    // The goal is a second from link up. On this 2-core machine a test
    // running beside a starting kube-apiserver once took 1.49 s, with
    // causeway's timers starved of CPU; so a link-up over the goal is
    // tried again, up to three in all, with the address flushed between:
    // the fastest must meet the goal and none may take 3 s.
    let mut tries = Vec::new();
    for attempt in 0..3 {
        if attempt > 0 {
            host.ip(&["link", "set", HOST_IF, "down"]);
            host.ip(&["-6", "addr", "flush", "dev", HOST_IF, "scope", "global"]);
        }
        let up = Instant::now();
        host.ip(&["link", "set", HOST_IF, "up"]);
        let formed = poll_until(Duration::from_secs(10), || {
            (!slaac_addresses(&host).is_empty()).then(|| up.elapsed())
        })
        .unwrap_or_else(|| {
            panic!(
                "no SLAAC address in {PREFIX}/64 within 10 s:\n{}\n{}",
                host.ip(&["-6", "addr"]),
                appliance.proc.describe()
            )
        });
        eprintln!("SLAAC address formed {formed:?} after link up");
        tries.push(formed);
        if formed < Duration::from_secs(1) {
            break;
        }
    }
    assert!(
        tries.iter().min() < Some(&Duration::from_secs(1))
            && tries.iter().all(|t| *t < Duration::from_secs(3)),
        "the SLAAC address took {tries:?} after link up (goal: under 1 s)"
    );
    let routes = default_routes(&host);
    assert!(
        routes.contains("via fe80::") && routes.contains("proto ra"),
        "the kernel took causeway as its default router: {routes:?}"
    );

    let seen = rdisc6(&host);
    assert_eq!(
        field(&seen, "Router lifetime")[0].split_whitespace().next(),
        Some("1800"),
        "{seen}"
    );
    assert_eq!(field(&seen, "Prefix"), [format!("{PREFIX}/64")], "{seen}");
    assert_eq!(field(&seen, "Autonomous address conf."), ["Yes"], "{seen}");
    assert_eq!(
        field(&seen, "MTU")[0].split_whitespace().next(),
        Some("1400"),
        "{seen}"
    );
    assert_eq!(
        field(&seen, "Recursive DNS server"),
        [format!("{PREFIX}53")],
        "{seen}"
    );
    assert_eq!(
        field(&seen, "DNS search list"),
        ["hosted.example.com"],
        "{seen}"
    );
    assert_eq!(
        field(&seen, "Source link-layer address"),
        ["02:00:00:00:0A:01"],
        "{seen}"
    );
    let metrics = appliance.metrics();
    let answered = metric(
        &metrics,
        "causeway_ra_solicitations_total{result=\"answered\"}",
    );
    assert!(
        answered >= Some(2.0),
        "the kernel's and rdisc6's solicitations: {answered:?}"
    );

    // Stopping withdraws the router (lifetime 0) but not the prefix.
    appliance.stop();
    let withdrawn = poll_until(Duration::from_secs(5), || {
        default_routes(&host).trim().is_empty().then_some(())
    });
    assert!(
        withdrawn.is_some(),
        "the default route outlived the final advertisement: {}",
        default_routes(&host)
    );
    assert!(
        !slaac_addresses(&host).is_empty(),
        "the address stays for its valid lifetime"
    );
}

#[test]
fn a_replica_without_the_router_address_is_quiet_and_advertises_within_seconds_of_taking_it() {
    if !root_or_skip(
        "a_replica_without_the_router_address_is_quiet_and_advertises_within_seconds_of_taking_it",
    ) {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-ra-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link(true);
    // Router lifetime 0: the prefix and the DNS server, but not a default
    // router; from fe80::1, the address a takeover moves.
    let appliance = start(
        dir.path(),
        &rtr,
        &format!(
            "  prefixes: [{{prefix: '{PREFIX}/64'}}]\n  routerLifetime: 0\n  source: 'fe80::1'\n  dnsServers: ['{PREFIX}53']\n  searchDomains: [example.net]\n"
        ),
    );
    host.ip(&["link", "set", HOST_IF, "up"]);
    appliance.wait_metric_at_least(
        "causeway_ra_send_failures_total{reason=\"no_source\"}",
        2.0,
        Duration::from_secs(10),
    );
    assert!(
        slaac_addresses(&host).is_empty(),
        "a replica without the router address advertised: {:?}",
        slaac_addresses(&host)
    );

    let taken = Instant::now();
    rtr.ip(&["addr", "add", "fe80::1/64", "dev", RTR_IF, "nodad"]);
    let formed = poll_until(Duration::from_secs(10), || {
        (!slaac_addresses(&host).is_empty()).then(|| taken.elapsed())
    })
    .unwrap_or_else(|| {
        panic!(
            "no SLAAC address within 10 s of the router address arriving:\n{}\n{}",
            host.ip(&["-6", "addr"]),
            appliance.proc.describe()
        )
    });
    eprintln!("SLAAC address formed {formed:?} after the router address arrived");
    // One quiet retry (1 s) and the host's DAD of its new address (1 s).
    assert!(
        formed < Duration::from_secs(3),
        "advertising began {formed:?} after the router address arrived"
    );
    assert!(
        default_routes(&host).trim().is_empty(),
        "router lifetime 0 made a default route: {}",
        default_routes(&host)
    );
    // rdisc6 solicits from the host's link-local address, usable once the
    // host's own duplicate address detection is done.
    poll_until(Duration::from_secs(5), || {
        let ll = host.ip(&["-6", "-o", "addr", "show", "dev", HOST_IF, "scope", "link"]);
        (!ll.is_empty() && !ll.contains("tentative")).then_some(())
    })
    .expect("the host's link-local address left DAD");
    let seen = rdisc6(&host);
    assert!(
        seen.contains("from fe80::1\n") || seen.trim_end().ends_with("from fe80::1"),
        "{seen}"
    );
    assert_eq!(
        field(&seen, "Router lifetime")[0].split_whitespace().next(),
        Some("0"),
        "{seen}"
    );
    assert_eq!(field(&seen, "DNS search list"), ["example.net"], "{seen}");
    appliance.stop();
}

/// A shell hook that records the DHCPv6 answer a client passes it, and
/// changes nothing on the machine.
fn dhcp6_hook(hook: &Path, log: &Path) {
    fs::write(
        hook,
        format!(
            "#!/bin/sh\n# causeway test hook: records the DHCPv6 options; never resolv.conf, routes or the hostname.\necho \"reason=$reason dns=$new_dhcp6_name_servers$new_dhcp6_domain_name_servers search=$new_dhcp6_domain_search\" >> '{}'\nexit 0\n",
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

const STATELESS: &str = "  prefixes: [{prefix: 'fd42:10::/64'}]\n  otherConfig: true\ndhcp6:\n  interface: cw-ra0\n  dnsServers: ['fd42:10::53', 'fd42:10::54']\n  domainSearch: [hosted.example.com, example.com]\n";

#[test]
fn dhclient_in_stateless_mode_gets_dns_servers_and_search_domains_from_dhcpv6() {
    if !root_or_skip("dhclient_in_stateless_mode_gets_dns_servers_and_search_domains_from_dhcpv6") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link(false);
    let appliance = start(dir.path(), &rtr, STATELESS);
    host.ip(&["link", "set", HOST_IF, "up"]);
    link_local_ready(&host, HOST_IF);
    let (hook, log) = (dir.path().join("hook6.sh"), dir.path().join("hook6.log"));
    dhcp6_hook(&hook, &log);
    fs::write(dir.path().join("dhclient6.conf"), "").unwrap();
    let dhclient = tool("dhclient", "isc-dhcp-client");
    let out = support::run(
        host.command("timeout")
            .arg("20")
            .arg(&dhclient)
            .args(["-6", "-S", "-1", "-v", "-cf"])
            .arg(dir.path().join("dhclient6.conf"))
            .arg("-sf")
            .arg(&hook)
            .arg("-lf")
            .arg(dir.path().join("dhclient6.leases"))
            .arg("-pf")
            .arg(dir.path().join("dhclient6.pid"))
            .arg(HOST_IF),
    );
    let recorded = fs::read_to_string(&log).unwrap_or_default();
    // ISC dhclient runs its hook for a stateless answer with the reason
    // RENEW6 (INFORM6 in some of its versions).
    let inform = recorded
        .lines()
        .find(|l| l.starts_with("reason=INFORM6") || l.starts_with("reason=RENEW6"))
        .unwrap_or_else(|| {
            panic!(
                "no stateless answer from dhclient:\n{recorded}\n{out}\n{}",
                appliance.proc.describe()
            )
        });
    assert!(inform.contains("dns=fd42:10::53 fd42:10::54"), "{inform}");
    assert!(
        inform.contains("search=hosted.example.com. example.com."),
        "{inform}"
    );
    let metrics = appliance.metrics();
    assert_eq!(
        metric(&metrics, "causeway_dhcp6_replies_total{path=\"direct\"}"),
        Some(1.0)
    );
    let _ = fs::remove_file(dir.path().join("dhclient6.pid"));
    appliance.stop();
}

#[test]
fn dhcpcd_follows_the_o_flag_to_stateless_dhcpv6_beside_its_slaac_address() {
    if !root_or_skip("dhcpcd_follows_the_o_flag_to_stateless_dhcpv6_beside_its_slaac_address") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("causeway-dhcp6-")
        .tempdir()
        .unwrap();
    let (rtr, host) = link(false);
    let appliance = start(dir.path(), &rtr, STATELESS);
    let (hook, log) = (dir.path().join("hook6.sh"), dir.path().join("hook6.log"));
    dhcp6_hook(&hook, &log);
    let conf = dir.path().join("dhcpcd.conf");
    // IPv6 only: dhcpcd solicits the advertisement itself, forms the
    // SLAAC address, and on the O flag asks DHCPv6 for the rest.
    fs::write(
        &conf,
        "ipv6only\noption domain_name_servers, domain_search\n",
    )
    .unwrap();
    host.ip(&["link", "set", HOST_IF, "up"]);
    let client = support::dhcpcd6(&host, dir.path(), &conf, &hook, HOST_IF);
    let found = poll_until(Duration::from_secs(20), || {
        fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("dns=fd42:10::53"))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| {
        panic!(
            "dhcpcd passed no DHCPv6 DNS servers to its hook:\n{}\n{}\n{}",
            fs::read_to_string(&log).unwrap_or_default(),
            client.describe(),
            appliance.proc.describe()
        )
    });
    assert!(found.contains("fd42:10::54"), "{found}");
    assert!(found.contains("hosted.example.com"), "{found}");
    assert!(
        !slaac_addresses(&host).is_empty(),
        "the SLAAC address beside it"
    );
    drop(client);
    appliance.stop();
}
