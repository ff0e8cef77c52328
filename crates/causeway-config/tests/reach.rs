//! Which subnets a valid DHCP config leaves no client a way to reach.

#![allow(clippy::unwrap_used)]

use causeway_config::Config;

fn dhcp(yaml: &str) -> causeway_config::DhcpConfig {
    Config::from_yaml(yaml).unwrap().dhcp.unwrap()
}

#[test]
fn a_subnet_reached_only_through_an_unlisted_relay_is_named() {
    // The lab's earlier config: the VLAN's own subnet on net1, a second
    // one behind a relay, no relayAddresses.
    let relayed = dhcp(
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.20.0.0/24, serverId: 192.168.100.2}\n",
    );
    let notes = relayed.unreachable_subnets();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("dhcp.subnets[1] (10.20.0.0/24): no client can reach it")
            && notes[0].contains("relayAddresses"),
        "{}",
        notes[0]
    );
    // Listing the relay, or an address listener, reaches it.
    let listed = dhcp(
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.20.0.0/24, serverId: 192.168.100.2, relayAddresses: [192.168.100.1]}\n",
    );
    assert!(listed.unreachable_subnets().is_empty());
    let address = dhcp(
        "dhcp:\n  listen: [{interface: net1}, {address: '0.0.0.0:67'}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.20.0.0/24, serverId: 192.168.100.2}\n",
    );
    assert!(address.unreachable_subnets().is_empty());
    // An interface no listener is on.
    let elsewhere = dhcp(
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.30.0.0/24, interface: net2, serverId: 10.30.0.2}\n",
    );
    let notes = elsewhere.unreachable_subnets();
    assert!(
        notes.len() == 1 && notes[0].contains("no listener is on its interface net2"),
        "{notes:?}"
    );
}

#[test]
fn each_relayed_subnet_needs_a_relay_of_its_own() {
    // Two subnets behind relays; only the first lists its relay. A relay
    // listed for one subnet is not served for another, so the second is
    // unreachable even though some relay is listed.
    let one_listed = dhcp(
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.20.0.0/24, serverId: 192.168.100.2, relayAddresses: [10.20.0.1]}\n    - {cidr: 10.21.0.0/24, serverId: 192.168.100.2}\n",
    );
    let notes = one_listed.unreachable_subnets();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("dhcp.subnets[2] (10.21.0.0/24): no client can reach it")
            && notes[0].contains("relaySources"),
        "{}",
        notes[0]
    );
    // A relay sending from its address on the server's segment, listed by
    // that source alone, reaches its subnet.
    let by_source = dhcp(
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.21.0.0/24, serverId: 192.168.100.2, relaySources: [192.168.100.3]}\n",
    );
    assert!(by_source.unreachable_subnets().is_empty());
}

#[test]
fn relay_sources_must_be_addresses() {
    let err = Config::from_yaml(
        "dhcp:\n  subnets:\n    - {cidr: 10.21.0.0/24, serverId: 10.21.0.2, relaySources: [relay.example]}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("dhcp.subnets[0].relaySources[0]"), "{err}");
}

#[test]
fn a_vlan_or_worker_prefix_inside_ovns_join_subnets_is_refused() {
    let vlan = |cidr: &str, gateway: &str| {
        Config::from_yaml(&format!(
            "network: {{interface: net1, cidr: {cidr}, gateway: {gateway}}}\n"
        ))
    };
    for (cidr, gateway, join) in [
        ("100.64.10.0/24", "100.64.10.1", "100.64.0.0/16"),
        ("100.65.0.0/16", "100.65.0.1", "100.65.0.0/16"),
        ("100.66.200.0/22", "100.66.200.1", "100.66.0.0/16"),
        // A prefix holding a join subnet overlaps it too.
        ("100.0.0.0/8", "100.0.0.1", "100.64.0.0/16"),
    ] {
        let err = vlan(cidr, gateway).unwrap_err().to_string();
        assert!(
            err.contains("network.cidr")
                && err.contains(&format!("{cidr} overlaps {join}"))
                && err.contains("OVN-Kubernetes"),
            "{cidr}: {err}"
        );
    }
    // Next to the range, and the usual private ranges, are fine.
    for (cidr, gateway) in [
        ("100.63.255.0/24", "100.63.255.1"),
        ("100.67.0.0/24", "100.67.0.1"),
        ("192.168.100.0/24", "192.168.100.1"),
    ] {
        assert!(vlan(cidr, gateway).is_ok(), "{cidr} was refused");
    }
    // A relayed workers' subnet is held to the same rule.
    let err = Config::from_yaml(
        "network: {interface: net1, cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}\ndhcp:\n  subnets:\n    - {}\n    - {cidr: 100.66.1.0/24, serverId: 192.168.100.2, relayAddresses: [100.66.1.1]}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("dhcp.subnets[1].cidr")
            && err.contains("100.66.1.0/24 overlaps 100.66.0.0/16"),
        "{err}"
    );
}
