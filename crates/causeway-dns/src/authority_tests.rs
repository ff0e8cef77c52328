use super::*;
use causeway_config::Config;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

const NOW: u64 = 1_700_000_000;

fn authority(dns: &str) -> (Authority, Arc<DynamicNames>) {
    let yaml = format!(
        "cluster: {{name: hc1, baseDomain: example.com}}\nnetwork: {{interface: net1, cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}}\ndns:\n{dns}"
    );
    let cfg = Config::from_yaml(&yaml).unwrap().dns.unwrap();
    let dynamic = Arc::new(DynamicNames::for_zone(cfg.zone.as_deref()));
    (Authority::new(&cfg, dynamic.clone(), 1).unwrap(), dynamic)
}

fn q(name: &str) -> LowerName {
    LowerName::from(Name::from_str(name).unwrap())
}

fn answer(a: &Authority, view: usize, name: &str, t: RecordType) -> LocalAnswer {
    match a.lookup(view, &q(name), t, NOW) {
        Lookup::Answer(x) => x,
        Lookup::NotOurs => panic!("{name} {t} not ours"),
    }
}

fn addrs(ans: &LocalAnswer) -> Vec<String> {
    ans.answers.iter().map(|r| r.data().to_string()).collect()
}

#[test]
fn cluster_names_resolve_to_the_proxy() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n");
    for n in ["api", "api-int", "oauth", "ignition", "konnectivity"] {
        let ans = answer(&a, 0, &format!("{n}.hc1.example.com."), RecordType::A);
        assert_eq!(addrs(&ans), vec!["192.168.100.2"], "{n}");
        assert!(!ans.nxdomain);
    }
}

#[test]
fn the_apps_wildcard_matches_any_depth_and_keeps_the_query_name() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n  ingressAddress: 192.168.100.7\n");
    for n in [
        "console.apps.hc1.example.com.",
        "a.b.c.apps.hc1.example.com.",
    ] {
        let ans = answer(&a, 0, n, RecordType::A);
        assert_eq!(addrs(&ans), vec!["192.168.100.7"], "{n}");
        assert_eq!(ans.answers[0].name().to_string(), n);
    }
    // apps itself exists (an empty non-terminal): NODATA, not NXDOMAIN.
    let ans = answer(&a, 0, "apps.hc1.example.com.", RecordType::A);
    assert!(!ans.nxdomain && ans.answers.is_empty());
    assert_eq!(ans.authority[0].record_type(), RecordType::SOA);
}

#[test]
fn nxdomain_and_nodata_are_told_apart_with_the_soa() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n");
    let nx = answer(&a, 0, "nope.hc1.example.com.", RecordType::A);
    assert!(nx.nxdomain);
    assert!(nx.answers.is_empty());
    assert_eq!(nx.authority[0].record_type(), RecordType::SOA);
    assert_eq!(nx.authority[0].name().to_string(), "hc1.example.com.");

    let nodata = answer(&a, 0, "api.hc1.example.com.", RecordType::AAAA);
    assert!(!nodata.nxdomain);
    assert!(nodata.answers.is_empty());
    assert_eq!(nodata.authority[0].record_type(), RecordType::SOA);
}

#[test]
fn names_outside_our_zones_are_not_ours_unless_listed() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n  records: [{name: 'registry.corp.', type: A, value: 10.1.1.1}]\n");
    assert_eq!(
        a.lookup(0, &q("www.example.net."), RecordType::A, NOW),
        Lookup::NotOurs
    );
    assert_eq!(
        addrs(&answer(&a, 0, "registry.corp.", RecordType::A)),
        vec!["10.1.1.1"]
    );
    // Only the exact name: its children are still forwarded.
    assert_eq!(
        a.lookup(0, &q("x.registry.corp."), RecordType::A, NOW),
        Lookup::NotOurs
    );
}

#[test]
fn a_cname_inside_the_zone_is_chased() {
    let (a, _) = authority(
        "  listen: ['127.0.0.1:5353']\n  records:\n    - {name: console, type: CNAME, value: api}\n    - {name: far, type: CNAME, value: www.example.net.}\n",
    );
    let ans = answer(&a, 0, "console.hc1.example.com.", RecordType::A);
    assert_eq!(ans.answers.len(), 2);
    assert_eq!(ans.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(addrs(&ans)[1], "192.168.100.2");
    // A target outside our zones ends the chain with the CNAME alone.
    let ans = answer(&a, 0, "far.hc1.example.com.", RecordType::A);
    assert_eq!(ans.answers.len(), 1);
    // Asking for the CNAME itself returns it without chasing.
    assert_eq!(
        answer(&a, 0, "console.hc1.example.com.", RecordType::CNAME)
            .answers
            .len(),
        1
    );
}

#[test]
fn srv_txt_and_aaaa_records_are_served() {
    let (a, _) = authority(
        "  listen: ['127.0.0.1:5353']\n  proxyAddressV6: 'fd00::2'\n  records:\n    - {name: _etcd._tcp, type: SRV, value: '0 10 2379 etcd-0'}\n    - {name: info, type: TXT, value: 'hello world'}\n",
    );
    assert_eq!(
        addrs(&answer(
            &a,
            0,
            "_etcd._tcp.hc1.example.com.",
            RecordType::SRV
        )),
        vec!["0 10 2379 etcd-0.hc1.example.com."]
    );
    assert_eq!(
        answer(&a, 0, "info.hc1.example.com.", RecordType::TXT)
            .answers
            .len(),
        1
    );
    assert_eq!(
        addrs(&answer(&a, 0, "api.hc1.example.com.", RecordType::AAAA)),
        vec!["fd00::2"]
    );
}

#[test]
fn reverse_names_of_the_vlan_are_answered() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n");
    let ans = answer(&a, 0, "2.100.168.192.in-addr.arpa.", RecordType::PTR);
    assert_eq!(addrs(&ans), vec!["causeway.hc1.example.com."]);
    let nx = answer(&a, 0, "77.100.168.192.in-addr.arpa.", RecordType::PTR);
    assert!(nx.nxdomain);
    assert_eq!(
        nx.authority[0].name().to_string(),
        "100.168.192.in-addr.arpa."
    );
    assert_eq!(
        a.lookup(0, &q("1.1.168.192.in-addr.arpa."), RecordType::PTR, NOW),
        Lookup::NotOurs
    );
}

#[test]
fn views_select_by_client_and_answer_differently() {
    let (a, _) = authority(
        "  listen: ['127.0.0.1:5353']\n  views:\n    - {name: vlan, clients: [192.168.100.0/24]}\n    - {name: mgmt, clients: ['10.0.0.0/8'], proxyAddress: 172.30.0.10}\n",
    );
    let vlan = a.view_for("192.168.100.50".parse().unwrap());
    let mgmt = a.view_for("10.1.2.3".parse().unwrap());
    let other = a.view_for("172.16.0.1".parse().unwrap());
    assert_eq!(
        (a.view_name(vlan), a.view_name(mgmt), a.view_name(other)),
        ("vlan", "mgmt", "default")
    );
    assert_eq!(
        addrs(&answer(&a, vlan, "api.hc1.example.com.", RecordType::A)),
        vec!["192.168.100.2"]
    );
    assert_eq!(
        addrs(&answer(&a, mgmt, "api.hc1.example.com.", RecordType::A)),
        vec!["172.30.0.10"]
    );
    assert_eq!(a.view_for("::ffff:10.9.9.9".parse().unwrap()), mgmt);
}

#[test]
fn recursion_is_allowed_only_for_configured_clients() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n");
    assert!(a.may_recurse("127.0.0.1".parse().unwrap()));
    assert!(a.may_recurse("192.168.100.77".parse().unwrap()));
    assert!(!a.may_recurse("8.8.8.8".parse().unwrap()));
}

#[test]
fn any_is_answered_minimally() {
    let (a, _) = authority("  listen: ['127.0.0.1:5353']\n  proxyAddressV6: 'fd00::2'\n");
    let ans = answer(&a, 0, "api.hc1.example.com.", RecordType::ANY);
    assert_eq!(ans.answers.len(), 1);
}

#[test]
fn dhcp_names_appear_on_grant_and_vanish_on_release_or_expiry() {
    let (a, dynamic) = authority("  listen: ['127.0.0.1:5353']\n");
    let ip = Ipv4Addr::new(192, 168, 100, 120);
    assert!(answer(&a, 0, "worker-1.hc1.example.com.", RecordType::A).nxdomain);
    let g0 = dynamic.generation();
    dynamic.register("worker-1", ip, NOW + 60);
    assert!(dynamic.generation() > g0);
    assert_eq!(
        addrs(&answer(&a, 0, "worker-1.hc1.example.com.", RecordType::A)),
        vec!["192.168.100.120"]
    );
    assert_eq!(
        addrs(&answer(
            &a,
            0,
            "120.100.168.192.in-addr.arpa.",
            RecordType::PTR
        )),
        vec!["worker-1.hc1.example.com."]
    );
    // Expired: gone without any event.
    match a.lookup(0, &q("worker-1.hc1.example.com."), RecordType::A, NOW + 61) {
        Lookup::Answer(x) => assert!(x.nxdomain),
        other => panic!("{other:?}"),
    }
    dynamic.unregister(ip);
    assert!(answer(&a, 0, "worker-1.hc1.example.com.", RecordType::A).nxdomain);
    assert!(answer(&a, 0, "120.100.168.192.in-addr.arpa.", RecordType::PTR).nxdomain);
}

/// Names follow their leases: an address given to another host takes its
/// name away from the old one, a renamed host loses its old name, and
/// re-registering a host never removes the PTR of an address that is now
/// someone else's.
#[test]
fn dhcp_names_follow_their_leases_through_churn() {
    let (a, dynamic) = authority("  listen: ['127.0.0.1:5353']\n");
    let ip1 = Ipv4Addr::new(192, 168, 100, 121);
    let ip2 = Ipv4Addr::new(192, 168, 100, 122);
    let a_of = |name: &str| addrs(&answer(&a, 0, name, RecordType::A));
    let ptr_of = |rev: &str| addrs(&answer(&a, 0, rev, RecordType::PTR));
    // old-host held ip1; its lease ran out and ip1 went to new-host.
    dynamic.register("old-host", ip1, NOW + 60);
    dynamic.register("new-host", ip1, NOW + 60);
    assert_eq!(a_of("new-host.hc1.example.com."), vec!["192.168.100.121"]);
    assert!(
        a_of("old-host.hc1.example.com.").is_empty(),
        "the old name still resolves to an address given to another host"
    );
    // old-host comes back elsewhere: new-host's PTR stays.
    dynamic.register("old-host", ip2, NOW + 60);
    assert_eq!(
        ptr_of("121.100.168.192.in-addr.arpa."),
        vec!["new-host.hc1.example.com."],
        "re-registering a stale name deleted another host's PTR"
    );
    assert_eq!(
        ptr_of("122.100.168.192.in-addr.arpa."),
        vec!["old-host.hc1.example.com."]
    );
    // A host renamed on its own address loses the old name.
    dynamic.register("renamed-host", ip2, NOW + 60);
    assert!(a_of("old-host.hc1.example.com.").is_empty());
    assert_eq!(
        a_of("renamed-host.hc1.example.com."),
        vec!["192.168.100.122"]
    );
}

/// Names whose leases ran out are forgotten, not only hidden: a fleet that
/// renews under a new name each time does not grow the table for ever.
#[test]
fn expired_dhcp_names_are_dropped_as_new_ones_come() {
    let (_a, dynamic) = authority("  listen: ['127.0.0.1:5353']\n");
    for i in 0..20_000u32 {
        let ip = Ipv4Addr::from(0x0a00_0000 + i + 1);
        // Each name lives a second; the clock moves a second per name.
        dynamic.register(&format!("host-{i}"), ip, NOW + u64::from(i) + 1);
        dynamic.forget_expired_if_due(NOW + u64::from(i));
    }
    assert!(
        dynamic.len() <= 1_000,
        "{} names held after 20,000 short-lived registrations",
        dynamic.len()
    );
}

#[test]
fn static_names_win_over_dhcp_names() {
    let (a, dynamic) = authority("  listen: ['127.0.0.1:5353']\n");
    dynamic.register("api", Ipv4Addr::new(192, 168, 100, 99), NOW + 60);
    assert_eq!(
        addrs(&answer(&a, 0, "api.hc1.example.com.", RecordType::A)),
        vec!["192.168.100.2"]
    );
}

#[test]
fn reverse_zones_cover_whole_octets() {
    let names = |n: &str| -> Vec<String> {
        reverse_zones(n.parse().unwrap())
            .iter()
            .map(|z| z.to_string())
            .collect()
    };
    assert_eq!(names("192.168.100.0/24"), vec!["100.168.192.in-addr.arpa."]);
    assert_eq!(names("10.20.0.0/16"), vec!["20.10.in-addr.arpa."]);
    assert_eq!(
        names("192.168.100.64/26"),
        vec!["100.168.192.in-addr.arpa."]
    );
    assert_eq!(names("192.168.4.0/22").len(), 4);
}

#[test]
fn a_wildcard_parent_without_names_of_its_own_answers_uniformly() {
    let (a, _) = authority(
        "  listen: ['127.0.0.1:5353']\n  ingressAddress: 192.168.100.7\n  records:\n    - {name: '*.svc', type: A, value: 10.0.0.1}\n    - {name: special.svc, type: A, value: 10.0.0.2}\n",
    );
    assert_eq!(
        a.uniform_wildcard(0, &q("x.y.apps.hc1.example.com."))
            .map(|p| p.to_string()),
        Some("apps.hc1.example.com.".to_string())
    );
    // svc has a name of its own below it, so its answers are not uniform.
    assert_eq!(a.uniform_wildcard(0, &q("x.svc.hc1.example.com.")), None);
    assert_eq!(a.uniform_wildcard(0, &q("api.hc1.example.com.")), None);
}

/// A DHCPv6 lease's name: AAAA beside the same host's A, PTR under the
/// prefix's ip6.arpa zone, each family following its own lease, and the
/// bound counting both families.
#[test]
fn dhcpv6_names_answer_aaaa_beside_a_and_ptr_under_ip6_arpa() {
    let yaml = "cluster: {name: hc1, baseDomain: example.com}\nnetwork: {interface: net1, cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}\n\
                dhcp: {}\ndns: {listen: ['127.0.0.1:5353']}\n\
                dhcp6: {prefix: 'fd42:10::/64', pools: [{start: 'fd42:10::100', end: 'fd42:10::1ff'}]}\n";
    let cfg = Config::from_yaml(yaml).unwrap().dns.unwrap();
    let dynamic = Arc::new(DynamicNames::for_zone(cfg.zone.as_deref()));
    let a = Authority::new(&cfg, dynamic.clone(), 1).unwrap();
    let v4 = Ipv4Addr::new(192, 168, 100, 120);
    let v6: Ipv6Addr = "fd42:10::105".parse().unwrap();
    dynamic.register("worker-6", v4, NOW + 60);
    dynamic.register("worker-6", v6, NOW + 60);
    assert_eq!(dynamic.len(), 2);
    assert_eq!(
        addrs(&answer(
            &a,
            0,
            "worker-6.hc1.example.com.",
            RecordType::AAAA
        )),
        vec!["fd42:10::105"]
    );
    assert_eq!(
        addrs(&answer(&a, 0, "worker-6.hc1.example.com.", RecordType::A)),
        vec!["192.168.100.120"]
    );
    let rev = "5.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.2.4.d.f.ip6.arpa.";
    assert_eq!(
        addrs(&answer(&a, 0, rev, RecordType::PTR)),
        vec!["worker-6.hc1.example.com."]
    );
    // An address of the prefix without a name is ours to deny, not to
    // forward.
    let other = "6.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.2.4.d.f.ip6.arpa.";
    assert!(answer(&a, 0, other, RecordType::PTR).nxdomain);
    // The v6 lease ends: the AAAA and its PTR go, the A stays.
    dynamic.unregister(v6);
    assert!(addrs(&answer(
        &a,
        0,
        "worker-6.hc1.example.com.",
        RecordType::AAAA
    ))
    .is_empty());
    assert!(answer(&a, 0, rev, RecordType::PTR).nxdomain);
    assert_eq!(
        addrs(&answer(&a, 0, "worker-6.hc1.example.com.", RecordType::A)),
        vec!["192.168.100.120"]
    );
}

/// The bound on DHCP names counts both families: a table full of v4 names
/// takes no new v6 name.
#[test]
fn the_dhcp_name_bound_counts_both_families() {
    let (_a, dynamic) = authority("  listen: ['127.0.0.1:5353']\n");
    for i in 0..MAX_DHCP_NAMES as u32 {
        dynamic.register(&format!("h{i}"), Ipv4Addr::from(0x0a00_0000 + i), NOW + 60);
    }
    assert_eq!(dynamic.len(), MAX_DHCP_NAMES);
    dynamic.register(
        "one-more",
        "fd42:10::1".parse::<Ipv6Addr>().unwrap(),
        NOW + 60,
    );
    assert_eq!(dynamic.len(), MAX_DHCP_NAMES);
    assert_eq!(dynamic.refused(), 1);
}
