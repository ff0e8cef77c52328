//! The engine's specification, message by message.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use causeway_config::Config;
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode};

use crate::engine::*;
use crate::lease::LeaseState;

const NOW: u64 = 1_700_000_000;
const SERVER: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 2);
const RELAY: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

fn config(extra: &str) -> causeway_config::DhcpConfig {
    let yaml = format!(
        r#"
cluster: {{name: hc1, baseDomain: example.com}}
network:
  interface: net1
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: 192.168.100.2
dhcp:
  declineProbation: 10m
{extra}
"#
    );
    Config::from_yaml(&yaml).unwrap().dhcp.unwrap()
}

fn vlan_config(subnet_extra: &str, dhcp_extra: &str) -> causeway_config::DhcpConfig {
    config(&format!(
        "{dhcp_extra}\n  subnets:\n    - mtu: 1450\n      ntpServers: [192.168.100.5]\n      domainSearch: [hc1.example.com, example.com]\n      classlessRoutes: [{{destination: 10.128.0.0/14, gateway: 192.168.100.1}}]\n      pools: [{{start: 192.168.100.10, end: 192.168.100.20}}]\n{subnet_extra}"
    ))
}

struct Client {
    mac: [u8; 6],
    client_id: Option<Vec<u8>>,
    xid: u32,
}

impl Client {
    fn new(n: u8) -> Self {
        Client {
            mac: [0x52, 0x54, 0, 0, 0, n],
            client_id: None,
            xid: u32::from(n) << 8,
        }
    }

    fn msg(&mut self, kind: MessageType) -> Message {
        self.xid += 1;
        let mut m = Message::default();
        m.set_opcode(Opcode::BootRequest)
            .set_xid(self.xid)
            .set_chaddr(&self.mac);
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        if let Some(id) = &self.client_id {
            m.opts_mut()
                .insert(DhcpOption::ClientIdentifier(id.clone()));
        }
        m
    }

    fn discover(&mut self) -> Message {
        self.msg(MessageType::Discover)
    }

    fn select(&mut self, offered: Ipv4Addr, server: Ipv4Addr) -> Message {
        let mut m = self.msg(MessageType::Request);
        m.opts_mut().insert(DhcpOption::ServerIdentifier(server));
        m.opts_mut().insert(DhcpOption::RequestedIpAddress(offered));
        m
    }

    fn reboot(&mut self, ip: Ipv4Addr) -> Message {
        let mut m = self.msg(MessageType::Request);
        m.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        m
    }

    fn renew(&mut self, ip: Ipv4Addr) -> Message {
        let mut m = self.msg(MessageType::Request);
        m.set_ciaddr(ip);
        m
    }

    fn release(&mut self, ip: Ipv4Addr) -> Message {
        let mut m = self.msg(MessageType::Release);
        m.set_ciaddr(ip);
        m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        m
    }

    fn decline(&mut self, ip: Ipv4Addr) -> Message {
        let mut m = self.msg(MessageType::Decline);
        m.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        m.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
        m
    }
}

fn direct() -> Ingress {
    Ingress::Interface("net1".into())
}

fn from_client() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)
}

fn reply(outcome: Outcome) -> (Message, Destination, Option<crate::LeaseRecord>) {
    match outcome {
        Outcome::Reply { reply, commit, .. } => (reply.message, reply.destination, commit),
        other => panic!("expected a reply, got {other:?}"),
    }
}

fn kind(m: &Message) -> MessageType {
    m.opts().msg_type().unwrap()
}

/// Runs DISCOVER then REQUEST; returns the ACKed address.
fn dora(e: &mut Engine, c: &mut Client, now: u64) -> Ipv4Addr {
    let (offer, _, commit) = reply(e.handle(now, &c.discover(), from_client(), &direct()));
    assert_eq!(kind(&offer), MessageType::Offer);
    assert!(commit.is_none(), "an offer is never written to disk");
    let ip = offer.yiaddr();
    let (ack, _, commit) = reply(e.handle(now, &c.select(ip, SERVER), from_client(), &direct()));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(ack.yiaddr(), ip);
    let commit = commit.expect("an ACK carries the lease to make durable");
    assert_eq!(commit.ip, ip);
    assert_eq!(commit.state, LeaseState::Active);
    ip
}

#[test]
fn discover_offers_a_pool_address_with_the_subnet_options() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let (offer, dest, _) = reply(e.handle(NOW, &c.discover(), from_client(), &direct()));
    assert_eq!(kind(&offer), MessageType::Offer);
    assert_eq!(offer.opcode(), Opcode::BootReply);
    assert_eq!(offer.chaddr(), &c.mac);
    let ip = offer.yiaddr();
    assert!((Ipv4Addr::new(192, 168, 100, 10)..=Ipv4Addr::new(192, 168, 100, 20)).contains(&ip));
    assert_eq!(dest, Destination::Broadcast);
    let o = offer.opts();
    assert_eq!(
        o.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER))
    );
    assert_eq!(
        o.get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(3600))
    );
    assert_eq!(o.get(OptionCode::Renewal), Some(&DhcpOption::Renewal(1800)));
    assert_eq!(
        o.get(OptionCode::Rebinding),
        Some(&DhcpOption::Rebinding(3150))
    );
    assert_eq!(
        o.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
    );
    assert_eq!(
        o.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![Ipv4Addr::new(192, 168, 100, 1)]))
    );
    assert_eq!(
        o.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![SERVER]))
    );
    assert_eq!(
        o.get(OptionCode::DomainName),
        Some(&DhcpOption::DomainName("hc1.example.com".into()))
    );
    assert_eq!(
        o.get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1450))
    );
    assert_eq!(
        o.get(OptionCode::BroadcastAddr),
        Some(&DhcpOption::BroadcastAddr(Ipv4Addr::new(
            192, 168, 100, 255
        )))
    );
    assert_eq!(
        o.get(OptionCode::NtpServers),
        Some(&DhcpOption::NtpServers(vec![Ipv4Addr::new(
            192, 168, 100, 5
        )]))
    );
    assert!(
        matches!(o.get(OptionCode::DomainSearch), Some(DhcpOption::DomainSearch(l)) if l.len() == 2)
    );
    assert!(
        matches!(o.get(OptionCode::ClasslessStaticRoute), Some(DhcpOption::ClasslessStaticRoute(r)) if r.len() == 1)
    );
}

#[test]
fn the_parameter_request_list_limits_optional_options() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let mut d = c.discover();
    d.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::Router,
        OptionCode::InterfaceMtu,
    ]));
    let (offer, _, _) = reply(e.handle(NOW, &d, from_client(), &direct()));
    let o = offer.opts();
    assert!(o.get(OptionCode::Router).is_some());
    assert!(o.get(OptionCode::InterfaceMtu).is_some());
    assert!(o.get(OptionCode::SubnetMask).is_some(), "always sent");
    assert!(o.get(OptionCode::AddressLeaseTime).is_some(), "always sent");
    assert!(
        o.get(OptionCode::DomainNameServer).is_none(),
        "not requested"
    );
    assert!(o.get(OptionCode::NtpServers).is_none(), "not requested");
}

#[test]
fn full_dora_then_renew_keeps_the_same_address() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let ip = dora(&mut e, &mut c, NOW);
    let (ack, dest, commit) = reply(e.handle(
        NOW + 1800,
        &c.renew(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(ack.yiaddr(), ip);
    assert_eq!(dest, Destination::Unicast(SocketAddrV4::new(ip, 68)));
    assert_eq!(commit.unwrap().expires, NOW + 1800 + 3600);
}

#[test]
fn init_reboot_with_the_leased_address_is_acked() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let ip = dora(&mut e, &mut c, NOW);
    let (ack, _, _) = reply(e.handle(NOW + 10, &c.reboot(ip), from_client(), &direct()));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(ack.yiaddr(), ip);
}

#[test]
fn init_reboot_with_a_foreign_subnet_address_is_naked() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    dora(&mut e, &mut c, NOW);
    let (nak, dest, commit) = reply(e.handle(
        NOW,
        &c.reboot(Ipv4Addr::new(172, 16, 0, 9)),
        from_client(),
        &direct(),
    ));
    assert_eq!(kind(&nak), MessageType::Nak);
    assert_eq!(nak.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(dest, Destination::Broadcast);
    assert!(commit.is_none());
}

#[test]
fn a_request_for_another_clients_address_is_naked() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut a = Client::new(1);
    let mut b = Client::new(2);
    let ip = dora(&mut e, &mut a, NOW);
    let (nak, _, _) = reply(e.handle(NOW, &b.select(ip, SERVER), from_client(), &direct()));
    assert_eq!(kind(&nak), MessageType::Nak);
    let (nak, _, _) = reply(e.handle(NOW, &b.reboot(ip), from_client(), &direct()));
    assert_eq!(kind(&nak), MessageType::Nak);
}

#[test]
fn non_authoritative_server_stays_silent_for_unknown_rebooting_clients() {
    let mut e = Engine::new(&vlan_config("", "  authoritative: false"));
    let mut c = Client::new(1);
    let out = e.handle(
        NOW,
        &c.reboot(Ipv4Addr::new(192, 168, 100, 15)),
        from_client(),
        &direct(),
    );
    assert_eq!(out, Outcome::Ignore(Ignored::NoRecord));
}

#[test]
fn authoritative_server_grants_a_free_address_to_a_rebooting_stranger() {
    // After a lost lease file, clients must keep their addresses.
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let ip = Ipv4Addr::new(192, 168, 100, 15);
    let (ack, _, commit) = reply(e.handle(NOW, &c.reboot(ip), from_client(), &direct()));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(commit.unwrap().ip, ip);
}

#[test]
fn selecting_another_server_withdraws_our_offer() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let (offer, _, _) = reply(e.handle(NOW, &c.discover(), from_client(), &direct()));
    let out = e.handle(
        NOW,
        &c.select(offer.yiaddr(), Ipv4Addr::new(192, 168, 100, 99)),
        from_client(),
        &direct(),
    );
    assert_eq!(out, Outcome::Ignore(Ignored::OtherServer));
    let stats = e.pool_stats(NOW);
    assert_eq!(stats[0].offered, 0);
}

#[test]
fn release_frees_the_address_and_the_client_gets_it_back() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let ip = dora(&mut e, &mut c, NOW);
    match e.handle(
        NOW + 5,
        &c.release(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ) {
        Outcome::Commit(r) => {
            assert_eq!(r.ip, ip);
            assert_eq!(r.state, LeaseState::Released);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(e.pool_stats(NOW + 5)[0].leased, 0);
    // Sticky: the same client gets the same address again.
    assert_eq!(dora(&mut e, &mut c, NOW + 10), ip);
}

#[test]
fn release_by_a_stranger_changes_nothing() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut a = Client::new(1);
    let mut b = Client::new(2);
    let ip = dora(&mut e, &mut a, NOW);
    assert_eq!(
        e.handle(NOW, &b.release(ip), from_client(), &Ingress::Address),
        Outcome::Ignore(Ignored::NotHeld)
    );
    assert_eq!(e.pool_stats(NOW)[0].leased, 1);
}

#[test]
fn decline_quarantines_the_address_for_the_probation_time() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let ip = dora(&mut e, &mut c, NOW);
    match e.handle(NOW, &c.decline(ip), from_client(), &direct()) {
        Outcome::Commit(r) => {
            assert_eq!(r.state, LeaseState::Declined);
            assert_eq!(r.expires, NOW + 600);
        }
        other => panic!("{other:?}"),
    }
    // The decliner gets a different address.
    let again = dora(&mut e, &mut c, NOW + 1);
    assert_ne!(again, ip);
    assert_eq!(e.pool_stats(NOW + 1)[0].declined, 1);
    // After probation the address is back in the pool.
    e.reclaim(NOW + 601);
    assert_eq!(e.pool_stats(NOW + 601)[0].declined, 0);
}

#[test]
fn inform_gets_options_without_a_lease() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(1);
    let mut m = c.msg(MessageType::Inform);
    let ip = Ipv4Addr::new(192, 168, 100, 77);
    m.set_ciaddr(ip);
    let (ack, dest, commit) = reply(e.handle(NOW, &m, SocketAddrV4::new(ip, 68), &direct()));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(ack.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(ack.ciaddr(), ip);
    assert!(ack.opts().get(OptionCode::AddressLeaseTime).is_none());
    assert!(ack.opts().get(OptionCode::Router).is_some());
    assert_eq!(dest, Destination::Unicast(SocketAddrV4::new(ip, 68)));
    assert!(commit.is_none());
}

#[test]
fn rapid_commit_acks_a_discover_when_enabled() {
    let mut e = Engine::new(&vlan_config("", "  rapidCommit: true"));
    let mut c = Client::new(1);
    let mut d = c.discover();
    d.opts_mut().insert(DhcpOption::RapidCommit);
    let (ack, _, commit) = reply(e.handle(NOW, &d, from_client(), &direct()));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert!(ack.opts().get(OptionCode::RapidCommit).is_some());
    assert_eq!(commit.unwrap().state, LeaseState::Active);

    // Disabled: the same DISCOVER gets a plain OFFER.
    let mut e = Engine::new(&vlan_config("", ""));
    let (offer, _, _) = reply(e.handle(NOW, &d, from_client(), &direct()));
    assert_eq!(kind(&offer), MessageType::Offer);
    assert!(offer.opts().get(OptionCode::RapidCommit).is_none());
}

#[test]
fn bootp_requests_are_ignored() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_chaddr(&[1, 2, 3, 4, 5, 6]);
    assert_eq!(
        e.handle(NOW, &m, from_client(), &direct()),
        Outcome::Ignore(Ignored::Bootp)
    );
}

#[test]
fn replies_from_clients_are_ignored() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut m = Client::new(1).discover();
    m.set_opcode(Opcode::BootReply);
    assert_eq!(
        e.handle(NOW, &m, from_client(), &direct()),
        Outcome::Ignore(Ignored::NotBootRequest)
    );
}

#[test]
fn the_client_identifier_takes_precedence_over_chaddr() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut a = Client::new(1);
    a.client_id = Some(vec![0xff, 1, 2, 3, 4]);
    let ip = dora(&mut e, &mut a, NOW);
    // Same client-id from another NIC: same lease.
    let mut moved = Client::new(9);
    moved.client_id = Some(vec![0xff, 1, 2, 3, 4]);
    assert_eq!(dora(&mut e, &mut moved, NOW + 1), ip);
    // Same MAC without the client-id: a different client.
    let mut same_mac = Client::new(1);
    assert_ne!(dora(&mut e, &mut same_mac, NOW + 2), ip);
}

#[test]
fn reservations_by_mac_and_client_id_are_honoured_with_their_hostname_and_options() {
    let cfg = vlan_config(
        "      reservations:\n        - {mac: '52:54:00:00:00:07', ip: 192.168.100.50, hostname: worker-0, options: [{code: 66, string: boot.example}]}\n        - {clientId: 'ff:00:01', ip: 192.168.100.51}\n",
        "",
    );
    let mut e = Engine::new(&cfg);
    let mut c = Client::new(7);
    let mut d = c.discover();
    d.opts_mut().insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::Hostname,
        OptionCode::TFTPServerName,
    ]));
    let (offer, _, _) = reply(e.handle(NOW, &d, from_client(), &direct()));
    assert_eq!(offer.yiaddr(), Ipv4Addr::new(192, 168, 100, 50));
    assert_eq!(
        offer.opts().get(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("worker-0".into()))
    );
    assert!(offer.opts().get(OptionCode::TFTPServerName).is_some());
    let (ack, _, commit) = reply(e.handle(
        NOW,
        &c.select(offer.yiaddr(), SERVER),
        from_client(),
        &direct(),
    ));
    assert_eq!(kind(&ack), MessageType::Ack);
    assert_eq!(commit.unwrap().hostname.as_deref(), Some("worker-0"));

    let mut by_id = Client::new(8);
    by_id.client_id = Some(vec![0xff, 0, 1]);
    assert_eq!(
        dora(&mut e, &mut by_id, NOW),
        Ipv4Addr::new(192, 168, 100, 51)
    );

    // A reserved address is never handed to anyone else, and a client with a
    // reservation cannot take another address.
    let mut other = Client::new(9);
    let nak = reply(e.handle(
        NOW,
        &other.select(Ipv4Addr::new(192, 168, 100, 50), SERVER),
        from_client(),
        &direct(),
    ))
    .0;
    assert_eq!(kind(&nak), MessageType::Nak);
    let nak = reply(e.handle(
        NOW,
        &c.reboot(Ipv4Addr::new(192, 168, 100, 12)),
        from_client(),
        &direct(),
    ))
    .0;
    assert_eq!(kind(&nak), MessageType::Nak);
}

#[test]
fn the_appliance_static_addresses_are_never_offered() {
    let cfg = config("  subnets:\n    - pools: [{start: 192.168.100.1, end: 192.168.100.4}]\n");
    let mut e = Engine::new(&cfg);
    let mut offered = Vec::new();
    for n in 0..4 {
        match e.handle(NOW, &Client::new(n).discover(), from_client(), &direct()) {
            Outcome::Reply { reply, .. } => offered.push(reply.message.yiaddr()),
            Outcome::Ignore(Ignored::PoolExhausted) => {}
            other => panic!("{other:?}"),
        }
    }
    // .1 is the gateway and .2 the appliance.
    assert_eq!(
        offered,
        vec![
            Ipv4Addr::new(192, 168, 100, 3),
            Ipv4Addr::new(192, 168, 100, 4)
        ]
    );
}

#[test]
fn pool_exhaustion_sends_no_offer() {
    let cfg = config("  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.11}]\n");
    let mut e = Engine::new(&cfg);
    dora(&mut e, &mut Client::new(1), NOW);
    dora(&mut e, &mut Client::new(2), NOW);
    assert_eq!(
        e.handle(NOW, &Client::new(3).discover(), from_client(), &direct()),
        Outcome::Ignore(Ignored::PoolExhausted)
    );
    let s = &e.pool_stats(NOW)[0];
    assert_eq!((s.total, s.leased, s.free), (2, 2, 0));
}

/// A full pool under a flood of new clients: the lease table is scanned for
/// expiries at most once a second, not once a DISCOVER (on a /16 each scan
/// holds the engine lock long enough to stall the renewals behind it).
#[test]
fn a_discover_flood_on_a_full_pool_scans_the_leases_once_a_second() {
    let cfg = config("  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.11}]\n");
    let mut e = Engine::new(&cfg);
    dora(&mut e, &mut Client::new(1), NOW);
    dora(&mut e, &mut Client::new(2), NOW);
    let before = e.reclaims();
    for n in 0..1000u32 {
        let mut c = Client::new(3);
        c.mac = [0x02, 0, 0, (n >> 16) as u8, (n >> 8) as u8, n as u8];
        let second = NOW + u64::from(n / 500);
        assert_eq!(
            e.handle(second, &c.discover(), from_client(), &direct()),
            Outcome::Ignore(Ignored::PoolExhausted)
        );
    }
    assert_eq!(
        e.reclaims() - before,
        2,
        "1,000 DISCOVERs over two seconds scanned the leases this many times"
    );
    // A known client renews all the while.
    let mut one = Client::new(1);
    let ip = dora(&mut e, &mut one, NOW + 2);
    assert!(matches!(
        e.handle(NOW + 2, &one.renew(ip), from_client(), &direct()),
        Outcome::Reply { .. }
    ));
}

#[test]
fn expired_leases_are_reclaimed_for_new_clients() {
    let cfg = config("  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.10}]\n");
    let mut e = Engine::new(&cfg);
    let ip = dora(&mut e, &mut Client::new(1), NOW);
    assert_eq!(
        e.handle(
            NOW + 10,
            &Client::new(2).discover(),
            from_client(),
            &direct()
        ),
        Outcome::Ignore(Ignored::PoolExhausted)
    );
    assert_eq!(dora(&mut e, &mut Client::new(2), NOW + 3601), ip);
}

#[test]
fn unanswered_offers_expire() {
    let cfg = config("  offerTimeout: 30s\n  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.10}]\n");
    let mut e = Engine::new(&cfg);
    reply(e.handle(NOW, &Client::new(1).discover(), from_client(), &direct()));
    assert_eq!(
        e.handle(
            NOW + 5,
            &Client::new(2).discover(),
            from_client(),
            &direct()
        ),
        Outcome::Ignore(Ignored::PoolExhausted)
    );
    let (offer, _, _) = reply(e.handle(
        NOW + 31,
        &Client::new(2).discover(),
        from_client(),
        &direct(),
    ));
    assert_eq!(offer.yiaddr(), Ipv4Addr::new(192, 168, 100, 10));
}

#[test]
fn a_flooding_client_is_rate_limited() {
    let mut e = Engine::new(&vlan_config("", "  rateLimitPerClient: 3"));
    let mut c = Client::new(1);
    let outcomes: Vec<bool> = (0..5)
        .map(|_| {
            matches!(
                e.handle(NOW, &c.discover(), from_client(), &direct()),
                Outcome::Reply { .. }
            )
        })
        .collect();
    assert_eq!(outcomes, vec![true, true, true, false, false]);
    // Another client is unaffected, and the next second starts afresh.
    assert!(matches!(
        e.handle(NOW, &Client::new(2).discover(), from_client(), &direct()),
        Outcome::Reply { .. }
    ));
    assert!(matches!(
        e.handle(NOW + 1, &c.discover(), from_client(), &direct()),
        Outcome::Reply { .. }
    ));
}

fn relay_config() -> causeway_config::DhcpConfig {
    Config::from_yaml(
        r#"
dhcp:
  listen: [{address: "127.0.0.1:6767"}]
  subnets:
    - {cidr: 10.0.0.0/24, serverId: 127.0.0.1, router: [10.0.0.1], pools: [{start: 10.0.0.10, end: 10.0.0.100}]}
    - {cidr: 10.0.1.0/24, serverId: 127.0.0.1, relayAddresses: [127.0.0.9], pools: [{start: 10.0.1.10, end: 10.0.1.100}]}
"#,
    )
    .unwrap()
    .dhcp
    .unwrap()
}

/// A relayed DISCOVER from a fresh random-looking MAC via `relay` for
/// `subnet` (its giaddr).
fn relayed_discover(n: u32, giaddr: Ipv4Addr) -> Message {
    let b = n.to_be_bytes();
    let mut c = Client::new(0);
    c.mac = [0x02, 0xfe, b[0], b[1], b[2], b[3]];
    let mut d = c.discover();
    d.set_giaddr(giaddr).set_hops(1);
    d
}

#[test]
fn a_random_mac_flood_through_one_relay_is_held_at_its_limits() {
    let mut cfg = relay_config();
    cfg.rate_limit_per_relay = Some(50);
    cfg.rate_limit_per_subnet = Some(30);
    cfg.rate_limit_global = Some(40);
    let mut e = Engine::new(&cfg);
    let flood_relay = SocketAddrV4::new(RELAY, 67);
    let mut ignored: HashMap<Ignored, usize> = HashMap::new();
    let mut offers = 0;
    // 1,000 clients a second via one relay into subnet 10.0.0.0/24: the
    // per-client limit never bites, the subnet's does.
    for n in 0..1000 {
        match e.handle(
            NOW,
            &relayed_discover(n, RELAY),
            flood_relay,
            &Ingress::Address,
        ) {
            Outcome::Reply { .. } => offers += 1,
            Outcome::Ignore(why) => *ignored.entry(why).or_default() += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(offers, 30, "the subnet's limit");
    assert_eq!(ignored[&Ignored::RateLimitedSubnet], 20);
    assert_eq!(ignored[&Ignored::RateLimitedRelay], 950);
    // The other subnet, through another relay, is still served this
    // second: the flood spent only its own subnet's and relay's budget.
    let other = Ipv4Addr::new(127, 0, 0, 9);
    let (offer, _, _) = reply(e.handle(
        NOW,
        &relayed_discover(5000, other),
        SocketAddrV4::new(other, 67),
        &Ingress::Address,
    ));
    assert!(Ipv4Net24(10, 0, 1).contains(offer.yiaddr()));
    // The next second refills every budget.
    assert!(matches!(
        e.handle(
            NOW + 1,
            &relayed_discover(6000, RELAY),
            flood_relay,
            &Ingress::Address
        ),
        Outcome::Reply { .. }
    ));
}

#[test]
fn the_global_limit_holds_when_every_scope_is_spread_thin() {
    let mut cfg = relay_config();
    cfg.rate_limit_global = Some(25);
    let mut e = Engine::new(&cfg);
    let other = Ipv4Addr::new(127, 0, 0, 9);
    let served = (0..100u32)
        .filter(|&n| {
            let (giaddr, src) = if n % 2 == 0 {
                (RELAY, RELAY)
            } else {
                (other, other)
            };
            matches!(
                e.handle(
                    NOW,
                    &relayed_discover(n, giaddr),
                    SocketAddrV4::new(src, 67),
                    &Ingress::Address
                ),
                Outcome::Reply { .. }
            )
        })
        .count();
    assert_eq!(served, 25);
    assert_eq!(
        e.handle(
            NOW,
            &relayed_discover(999, RELAY),
            SocketAddrV4::new(RELAY, 67),
            &Ingress::Address
        ),
        Outcome::Ignore(Ignored::RateLimitedGlobal)
    );
}

#[test]
fn a_client_over_its_own_limit_spends_none_of_the_shared_budget() {
    let cfg = vlan_config("", "  rateLimitPerClient: 2\n  rateLimitPerSubnet: 5");
    let mut e = Engine::new(&cfg);
    let mut flooder = Client::new(1);
    for _ in 0..100 {
        let _ = e.handle(NOW, &flooder.discover(), from_client(), &direct());
    }
    // Two of the flooder's went through; three of the subnet's five are
    // left for everyone else.
    let served = (2..10u8)
        .filter(|&n| {
            matches!(
                e.handle(NOW, &Client::new(n).discover(), from_client(), &direct()),
                Outcome::Reply { .. }
            )
        })
        .count();
    assert_eq!(served, 3);
}

#[test]
fn giaddr_selects_the_subnet_and_the_reply_goes_to_the_relay() {
    let mut e = Engine::new(&relay_config());
    let mut c = Client::new(1);
    let mut d = c.discover();
    d.set_giaddr(RELAY).set_hops(1);
    let (offer, dest, _) =
        reply(e.handle(NOW, &d, SocketAddrV4::new(RELAY, 67), &Ingress::Address));
    assert!(Ipv4Net24(10, 0, 0).contains(offer.yiaddr()));
    assert_eq!(offer.giaddr(), RELAY);
    assert_eq!(dest, Destination::Unicast(SocketAddrV4::new(RELAY, 67)));

    // A relay listed in relayAddresses selects its subnet even off-subnet,
    // and a relay sending from its own port gets the reply there.
    let mut d = c.discover();
    let relay = Ipv4Addr::new(127, 0, 0, 9);
    d.set_giaddr(relay);
    let (offer, dest, _) =
        reply(e.handle(NOW, &d, SocketAddrV4::new(relay, 40000), &Ingress::Address));
    assert!(Ipv4Net24(10, 0, 1).contains(offer.yiaddr()));
    assert_eq!(dest, Destination::Unicast(SocketAddrV4::new(relay, 40000)));

    // An unknown relay gets nothing.
    let mut d = c.discover();
    d.set_giaddr(Ipv4Addr::new(172, 16, 0, 1));
    assert_eq!(
        e.handle(NOW, &d, SocketAddrV4::new(RELAY, 67), &Ingress::Address),
        Outcome::Ignore(Ignored::NoSubnet)
    );
}

#[test]
fn relay_agent_information_is_echoed() {
    use dhcproto::v4::relay::{RelayAgentInformation, RelayInfo};
    let mut e = Engine::new(&relay_config());
    let mut d = Client::new(1).discover();
    d.set_giaddr(RELAY);
    let mut info = RelayAgentInformation::default();
    info.insert(RelayInfo::AgentCircuitId(b"vlan100".to_vec()));
    d.opts_mut()
        .insert(DhcpOption::RelayAgentInformation(info.clone()));
    let (offer, _, _) = reply(e.handle(NOW, &d, SocketAddrV4::new(RELAY, 67), &Ingress::Address));
    assert_eq!(
        offer.opts().get(OptionCode::RelayAgentInformation),
        Some(&DhcpOption::RelayAgentInformation(info))
    );
}

#[test]
fn a_relayed_nak_asks_the_relay_to_broadcast() {
    let mut e = Engine::new(&relay_config());
    let mut c = Client::new(1);
    let mut r = c.reboot(Ipv4Addr::new(192, 168, 5, 5));
    r.set_giaddr(RELAY);
    let (nak, dest, _) = reply(e.handle(NOW, &r, SocketAddrV4::new(RELAY, 67), &Ingress::Address));
    assert_eq!(kind(&nak), MessageType::Nak);
    assert!(nak.flags().broadcast());
    assert_eq!(dest, Destination::Unicast(SocketAddrV4::new(RELAY, 67)));
}

#[test]
fn a_client_asking_for_broadcast_gets_broadcast() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut d = Client::new(1).discover();
    d.set_flags(Flags::default().set_broadcast());
    let (offer, dest, _) = reply(e.handle(NOW, &d, from_client(), &direct()));
    assert!(offer.flags().broadcast());
    assert_eq!(dest, Destination::Broadcast);
}

#[test]
fn restored_leases_survive_a_restart() {
    let cfg = vlan_config("", "");
    let mut e = Engine::new(&cfg);
    let mut records = Vec::new();
    let mut ips = HashMap::new();
    for n in 1..=5 {
        let mut c = Client::new(n);
        let (offer, _, _) = reply(e.handle(NOW, &c.discover(), from_client(), &direct()));
        let (_, _, commit) = reply(e.handle(
            NOW,
            &c.select(offer.yiaddr(), SERVER),
            from_client(),
            &direct(),
        ));
        records.push(commit.unwrap());
        ips.insert(n, offer.yiaddr());
    }
    let mut restarted = Engine::new(&cfg);
    assert_eq!(restarted.restore(&records), 0);
    assert_eq!(restarted.pool_stats(NOW)[0].leased, 5);
    for n in 1..=5 {
        let mut c = Client::new(n);
        let ip = ips[&n];
        let (ack, _, _) = reply(restarted.handle(
            NOW + 60,
            &c.renew(ip),
            SocketAddrV4::new(ip, 68),
            &Ingress::Address,
        ));
        assert_eq!(kind(&ack), MessageType::Ack);
        assert_eq!(ack.yiaddr(), ip);
    }
    // A new client does not get any of them.
    let fresh = dora(&mut restarted, &mut Client::new(50), NOW + 60);
    assert!(!ips.values().any(|ip| *ip == fresh));
}

#[test]
fn reconfigure_keeps_leases() {
    let mut e = Engine::new(&vlan_config("", ""));
    let ip = dora(&mut e, &mut Client::new(1), NOW);
    e.reconfigure(&vlan_config("      leaseTime: 2h\n", ""));
    assert_eq!(e.pool_stats(NOW)[0].leased, 1);
    let (ack, _, _) = reply(e.handle(
        NOW,
        &Client::new(1).renew(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ));
    assert_eq!(ack.yiaddr(), ip);
    assert_eq!(
        ack.opts().get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(7200))
    );
}

struct Ipv4Net24(u8, u8, u8);

impl Ipv4Net24 {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        let o = ip.octets();
        (o[0], o[1], o[2]) == (self.0, self.1, self.2)
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Discover(u8),
        Select(u8),
        Renew(u8),
        Reboot(u8, u8),
        Release(u8),
        Decline(u8),
        Advance(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..24).prop_map(Op::Discover),
            (0u8..24).prop_map(Op::Select),
            (0u8..24).prop_map(Op::Renew),
            ((0u8..24), (0u8..40)).prop_map(|(c, a)| Op::Reboot(c, a)),
            (0u8..24).prop_map(Op::Release),
            (0u8..24).prop_map(Op::Decline),
            (0u16..2000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Over any sequence of client operations, no address is ever held
        /// by two clients, and pool accounting adds up.
        #[test]
        fn no_address_is_ever_held_by_two_clients(ops in proptest::collection::vec(op(), 1..200)) {
            // 16 addresses for 24 clients keeps the pool under pressure.
            let cfg = config("  leaseTime: 10m\n  offerTimeout: 30s\n  rateLimitPerClient: 1000\n  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.25}]\n      reservations: [{mac: '52:54:00:00:00:03', ip: 192.168.100.40}]\n");
            let mut e = Engine::new(&cfg);
            let mut now = NOW;
            let mut clients: Vec<Client> = (0..24).map(Client::new).collect();
            let mut offered: HashMap<u8, Ipv4Addr> = HashMap::new();
            let mut acked: HashMap<u8, Ipv4Addr> = HashMap::new();
            for op in ops {
                match op {
                    Op::Advance(s) => { now += u64::from(s); e.reclaim(now); }
                    Op::Discover(c) => if let Outcome::Reply { reply, .. } = e.handle(now, &clients[c as usize].discover(), from_client(), &direct()) {
                        offered.insert(c, reply.message.yiaddr());
                    },
                    Op::Select(c) => if let Some(ip) = offered.get(&c).copied() {
                        let m = clients[c as usize].select(ip, SERVER);
                        if let Outcome::Reply { reply, .. } = e.handle(now, &m, from_client(), &direct()) {
                            if reply.message_type() == Some(MessageType::Ack) { acked.insert(c, ip); }
                        }
                    },
                    Op::Renew(c) => if let Some(ip) = acked.get(&c).copied() {
                        let m = clients[c as usize].renew(ip);
                        let _ = e.handle(now, &m, SocketAddrV4::new(ip, 68), &Ingress::Address);
                    },
                    Op::Reboot(c, a) => {
                        let m = clients[c as usize].reboot(Ipv4Addr::new(192, 168, 100, a));
                        let _ = e.handle(now, &m, from_client(), &direct());
                    }
                    Op::Release(c) => if let Some(ip) = acked.get(&c).copied() {
                        let m = clients[c as usize].release(ip);
                        let _ = e.handle(now, &m, SocketAddrV4::new(ip, 68), &Ingress::Address);
                    },
                    Op::Decline(c) => if let Some(ip) = acked.get(&c).copied() {
                        let m = clients[c as usize].decline(ip);
                        let _ = e.handle(now, &m, from_client(), &direct());
                    },
                }
                // Invariant 1: every held address has exactly one holder,
                // and each client holds at most one active lease.
                let mut holders: HashMap<Ipv4Addr, usize> = HashMap::new();
                let mut active_per_client: HashMap<Vec<u8>, usize> = HashMap::new();
                for l in e.leases().filter(|l| l.holds(now)) {
                    *holders.entry(l.ip).or_default() += 1;
                    if l.state == LeaseState::Active {
                        *active_per_client.entry(l.client.as_bytes().to_vec()).or_default() += 1;
                    }
                }
                prop_assert!(holders.values().all(|n| *n == 1));
                prop_assert!(active_per_client.values().all(|n| *n == 1), "{active_per_client:?}");
                // Invariant 2: pool accounting adds up.
                for s in e.pool_stats(now) {
                    prop_assert_eq!(s.leased + s.offered + s.declined + s.unavailable + s.free, s.total, "{:?}", s);
                    // The counts kept as leases change are what a walk
                    // of every lease finds.
                    let (start, end) = s.pool.split_once('-').unwrap_or((&s.pool, &s.pool));
                    let (start, end): (Ipv4Addr, Ipv4Addr) = (start.parse().unwrap(), end.parse().unwrap());
                    let in_pool = |l: &&crate::lease::Lease| l.ip >= start && l.ip <= end && l.holds(now);
                    let walked = |state| e.leases().filter(in_pool).filter(|l| l.state == state).count() as u64;
                    prop_assert_eq!(s.leased, walked(LeaseState::Active), "{:?}", s);
                    prop_assert_eq!(s.offered, walked(LeaseState::Offered), "{:?}", s);
                    prop_assert_eq!(s.declined, walked(LeaseState::Declined), "{:?}", s);
                }
                // Invariant 3: nothing outside the pool or reservation is held.
                for l in e.leases().filter(|l| l.holds(now)) {
                    let o = l.ip.octets()[3];
                    prop_assert!((10..=25).contains(&o) || o == 40, "{}", l.ip);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut e = Engine::new(&vlan_config("", ""));
            crate::drive_bytes(&mut e, NOW, &bytes);
        }

        #[test]
        fn mutated_valid_packets_never_panic(flips in proptest::collection::vec((0usize..400, any::<u8>()), 1..16)) {
            let mut e = Engine::new(&vlan_config("", ""));
            let mut c = Client::new(1);
            let mut d = c.discover();
            d.opts_mut().insert(DhcpOption::ParameterRequestList(vec![OptionCode::Router]));
            d.opts_mut().insert(DhcpOption::Hostname("vm".into()));
            let mut bytes = crate::wire::encode(&mut d).unwrap();
            for (at, v) in flips {
                if let Some(b) = bytes.get_mut(at) { *b = v; }
            }
            crate::drive_bytes(&mut e, NOW, &bytes);
        }
    }
}

#[test]
fn decline_is_refused_for_an_offer_a_released_lease_or_past_the_per_client_cap() {
    let mut e = Engine::new(&vlan_config("", "  rateLimitPerClient: 1000"));
    let mut c = Client::new(1);
    // Only offered.
    let (offer, _, _) = reply(e.handle(NOW, &c.discover(), from_client(), &direct()));
    assert_eq!(
        e.handle(NOW, &c.decline(offer.yiaddr()), from_client(), &direct()),
        Outcome::Ignore(Ignored::NotHeld)
    );
    // Released.
    let ip = dora(&mut e, &mut c, NOW);
    assert!(matches!(
        e.handle(NOW, &c.release(ip), from_client(), &direct()),
        Outcome::Commit(_)
    ));
    assert_eq!(
        e.handle(NOW, &c.decline(ip), from_client(), &direct()),
        Outcome::Ignore(Ignored::NotHeld)
    );
    // Active: quarantined, up to the cap per client.
    for _ in 0..MAX_DECLINED_PER_CLIENT {
        let ip = dora(&mut e, &mut c, NOW);
        assert!(matches!(
            e.handle(NOW, &c.decline(ip), from_client(), &direct()),
            Outcome::Commit(_)
        ));
    }
    let ip = dora(&mut e, &mut c, NOW);
    assert_eq!(
        e.handle(NOW, &c.decline(ip), from_client(), &direct()),
        Outcome::Ignore(Ignored::DeclineLimited)
    );
    assert_eq!(
        e.pool_stats(NOW)[0].declined,
        MAX_DECLINED_PER_CLIENT as u64
    );
}

#[test]
fn a_relayed_packet_on_an_interface_listener_needs_a_configured_relay() {
    let mut e = Engine::new(&vlan_config("      relayAddresses: [192.168.100.9]\n", ""));
    let mut c = Client::new(1);
    let mut forged = c.discover();
    forged
        .set_giaddr(Ipv4Addr::new(192, 168, 100, 77))
        .set_hops(1);
    // A VLAN client posing as a relay.
    let from = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 77), 67);
    assert_eq!(
        e.handle(NOW, &forged, from, &direct()),
        Outcome::Ignore(Ignored::UnknownRelay)
    );
    // The configured relay is served.
    let mut relayed = c.discover();
    relayed
        .set_giaddr(Ipv4Addr::new(192, 168, 100, 9))
        .set_hops(1);
    let relay = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 9), 67);
    let (offer, dest, _) = reply(e.handle(NOW, &relayed, relay, &direct()));
    assert_eq!(kind(&offer), MessageType::Offer);
    assert_eq!(
        dest,
        Destination::Unicast(SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 9), 67))
    );
}

/// The VLAN on `net1` and two subnets behind relays on other segments,
/// each relay sending to the server from its address on the server's
/// segment (192.168.100.31 and .32) while its `giaddr` is its address on
/// the clients' segment (10.0.1.1 and 10.0.2.1), as a relay agent routed
/// onto the VLAN does.
fn two_relayed_subnets() -> Engine {
    Engine::new(&config(
        r#"  subnets:
    - pools: [{start: 192.168.100.10, end: 192.168.100.20}]
    - {cidr: 10.0.1.0/24, serverId: 192.168.100.2, relayAddresses: [10.0.1.1], relaySources: [192.168.100.31], pools: [{start: 10.0.1.10, end: 10.0.1.20}]}
    - {cidr: 10.0.2.0/24, serverId: 192.168.100.2, relaySources: [192.168.100.32], pools: [{start: 10.0.2.10, end: 10.0.2.20}]}"#,
    ))
}

fn discover_through(c: &mut Client, giaddr: Ipv4Addr) -> Message {
    let mut m = c.discover();
    m.set_giaddr(giaddr).set_hops(1);
    m
}

#[test]
fn a_relay_sending_from_another_address_than_its_giaddr_is_served_when_listed_in_relay_sources() {
    let mut e = two_relayed_subnets();
    let mut c = Client::new(1);
    let relay = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 31), 67);
    let discover = discover_through(&mut c, Ipv4Addr::new(10, 0, 1, 1));
    let (offer, dest, _) = reply(e.handle(NOW, &discover, relay, &direct()));
    assert_eq!(kind(&offer), MessageType::Offer);
    assert!(Ipv4Net24(10, 0, 1).contains(offer.yiaddr()));
    // Replies go to the giaddr, as RFC 2131 has a server answer a relay.
    assert_eq!(
        dest,
        Destination::Unicast(SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 67))
    );
    // A subnet chosen by its cidr (no relayAddresses) takes its relay's
    // source the same way.
    let mut d = Client::new(2);
    let discover = discover_through(&mut d, Ipv4Addr::new(10, 0, 2, 1));
    let relay = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 32), 67);
    let (offer, _, _) = reply(e.handle(NOW, &discover, relay, &direct()));
    assert!(Ipv4Net24(10, 0, 2).contains(offer.yiaddr()));
}

#[test]
fn a_relay_of_one_subnet_cannot_draw_from_another_subnets_pool() {
    let mut e = two_relayed_subnets();
    let mut c = Client::new(3);
    // Relay .31 serves 10.0.1.0/24 only; naming 10.0.2.1 in giaddr does
    // not make it 10.0.2.0/24's relay.
    let discover = discover_through(&mut c, Ipv4Addr::new(10, 0, 2, 1));
    let relay = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 31), 67);
    assert_eq!(
        e.handle(NOW, &discover, relay, &direct()),
        Outcome::Ignore(Ignored::UnknownRelay)
    );
    // Nor can a VLAN client that sets the giaddr of a listed relay.
    let discover = discover_through(&mut c, Ipv4Addr::new(10, 0, 1, 1));
    let client = SocketAddrV4::new(Ipv4Addr::new(192, 168, 100, 77), 67);
    assert_eq!(
        e.handle(NOW, &discover, client, &direct()),
        Outcome::Ignore(Ignored::UnknownRelay)
    );
}

#[test]
fn a_relay_listed_by_giaddr_for_one_subnet_cannot_name_another_subnets_giaddr() {
    let mut e = Engine::new(&config(
        r#"  subnets:
    - pools: [{start: 192.168.100.10, end: 192.168.100.20}]
    - {cidr: 10.0.1.0/24, serverId: 192.168.100.2, relayAddresses: [10.0.1.1], pools: [{start: 10.0.1.10, end: 10.0.1.20}]}
    - {cidr: 10.0.2.0/24, serverId: 192.168.100.2, relayAddresses: [10.0.2.1], pools: [{start: 10.0.2.10, end: 10.0.2.20}]}"#,
    ));
    let mut c = Client::new(4);
    let discover = discover_through(&mut c, Ipv4Addr::new(10, 0, 2, 1));
    let relay_of_the_first = SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 1), 67);
    assert_eq!(
        e.handle(NOW, &discover, relay_of_the_first, &direct()),
        Outcome::Ignore(Ignored::UnknownRelay)
    );
    let relay_of_the_second = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 1), 67);
    let (offer, _, _) = reply(e.handle(NOW, &discover, relay_of_the_second, &direct()));
    assert!(Ipv4Net24(10, 0, 2).contains(offer.yiaddr()));
}

fn with_hostname(mut m: Message, name: &str) -> Message {
    m.opts_mut().insert(DhcpOption::Hostname(name.into()));
    m
}

/// DISCOVER and REQUEST, both with option 12; the hostname the lease got.
fn dora_named(e: &mut Engine, c: &mut Client, name: &str) -> Option<String> {
    let (offer, _, _) = reply(e.handle(
        NOW,
        &with_hostname(c.discover(), name),
        from_client(),
        &direct(),
    ));
    let request = with_hostname(c.select(offer.yiaddr(), SERVER), name);
    let (_, _, commit) = reply(e.handle(NOW, &request, from_client(), &direct()));
    commit.and_then(|r| r.hostname)
}

#[test]
fn a_hostname_goes_to_its_reservation_or_its_first_holder_only() {
    let mut e = Engine::new(&vlan_config(
        "      reservations:\n        - {mac: '52:54:00:00:00:07', ip: 192.168.100.50, hostname: worker-0}\n",
        "",
    ));
    // A client asking for the reservation's name does not get it...
    assert_eq!(dora_named(&mut e, &mut Client::new(1), "worker-0"), None);
    // ...and the reserved machine always does.
    assert_eq!(
        dora_named(&mut e, &mut Client::new(7), "anything").as_deref(),
        Some("worker-0")
    );
    // The first holder keeps a name; a second client asking gets none.
    assert_eq!(
        dora_named(&mut e, &mut Client::new(2), "db").as_deref(),
        Some("db")
    );
    assert_eq!(dora_named(&mut e, &mut Client::new(3), "DB"), None);
    // The holder renews with it.
    assert_eq!(
        dora_named(&mut e, &mut Client::new(2), "db").as_deref(),
        Some("db")
    );
    // Once the holder's lease is over, the name is free again.
    e.reclaim(NOW + 7200);
    let (offer, _, _) = reply(e.handle(
        NOW + 7200,
        &with_hostname(Client::new(3).discover(), "db"),
        from_client(),
        &direct(),
    ));
    let mut c3 = Client::new(3);
    let request = with_hostname(c3.select(offer.yiaddr(), SERVER), "db");
    let (_, _, commit) = reply(e.handle(NOW + 7200, &request, from_client(), &direct()));
    assert_eq!(commit.and_then(|r| r.hostname).as_deref(), Some("db"));
}

fn ack_records(
    outcome: Outcome,
) -> (
    Message,
    Option<crate::LeaseRecord>,
    Option<crate::LeaseRecord>,
) {
    match outcome {
        Outcome::Reply {
            reply,
            commit,
            vacated,
        } => (reply.message, commit, vacated.map(|v| *v)),
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// A lease disk that fails: the ACKs it refused are undone, so the
/// addresses go back (a new client's to its offer, which runs out) rather
/// than staying leased to clients that were never answered.
#[test]
fn a_change_the_disk_refused_is_undone() {
    let cfg = config("  subnets:\n    - pools: [{start: 192.168.100.10, end: 192.168.100.11}]\n");
    let mut e = Engine::new(&cfg);
    let mut a = Client::new(1);
    let (offer, _, _) = reply(e.handle(NOW, &a.discover(), from_client(), &direct()));
    let ip = offer.yiaddr();
    let (_, commit, _) =
        ack_records(e.handle(NOW, &a.select(ip, SERVER), from_client(), &direct()));
    let refused = commit.expect("an ACK's record");
    assert_eq!(e.unsettled(), 1);
    assert!(e.settle(&refused, false), "the refused ACK is undone");
    assert_eq!(e.unsettled(), 0);
    assert_eq!(
        e.pool_stats(NOW)[0].leased,
        0,
        "never acknowledged, not leased"
    );
    // Once the offer it went back to runs out, the address is free again.
    assert_eq!(e.pool_stats(NOW + 31)[0].free, 2);
    // Many clients whose ACKs all fail use nothing up.
    for n in 10..40 {
        let mut c = Client::new(n);
        let (offer, _, _) = reply(e.handle(NOW + 100, &c.discover(), from_client(), &direct()));
        let (_, commit, _) = ack_records(e.handle(
            NOW + 100,
            &c.select(offer.yiaddr(), SERVER),
            from_client(),
            &direct(),
        ));
        e.settle(&commit.unwrap(), false);
        // What is left is an offer, held for the offer timeout only.
        assert_eq!(e.pool_stats(NOW + 100)[0].leased, 0);
        e.reclaim(NOW + 131);
    }
    assert_eq!(e.pool_stats(NOW + 131)[0].free, 2);

    // A renewal the disk refused leaves the lease as the disk has it.
    let mut b = Client::new(2);
    let ip = dora(&mut e, &mut b, NOW + 200);
    let settled: Vec<_> = e.leases().map(|l| l.to_record()).collect();
    for r in &settled {
        e.settle(r, true);
    }
    let (_, commit, _) = ack_records(e.handle(
        NOW + 300,
        &b.renew(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ));
    e.settle(&commit.unwrap(), false);
    let lease = e.leases().find(|l| l.ip == ip).unwrap();
    assert_eq!(
        (lease.state, lease.expires),
        (LeaseState::Active, NOW + 200 + 3600),
        "the renewal is undone, the lease it renewed stays"
    );
}

/// Two changes to one address in flight: the first's failure undoes
/// nothing while the second may still succeed, and a success is final.
#[test]
fn an_older_failure_does_not_undo_a_newer_durable_change() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut a = Client::new(1);
    let ip = dora(&mut e, &mut a, NOW);
    let first = e.leases().find(|l| l.ip == ip).unwrap().to_record();
    let (_, second, _) = ack_records(e.handle(
        NOW + 10,
        &a.renew(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ));
    let second = second.unwrap();
    assert!(!e.settle(&first, false));
    assert!(!e.settle(&second, true));
    let lease = e.leases().find(|l| l.ip == ip).unwrap();
    assert_eq!(
        (lease.state, lease.expires),
        (LeaseState::Active, NOW + 10 + 3600)
    );
}

/// A client moved to a new address (here by a reservation added for it)
/// keeps its old one until it takes the new; the ACK then logs the old
/// one's release, so the log never holds two active leases for it.
#[test]
fn a_move_logs_the_release_of_the_address_left() {
    let mut e = Engine::new(&vlan_config("", ""));
    let mut c = Client::new(7);
    let old = dora(&mut e, &mut c, NOW);
    let reserved = Ipv4Addr::new(192, 168, 100, 50);
    e.reconfigure(&vlan_config(
        &format!("      reservations:\n        - {{mac: '52:54:00:00:00:07', ip: {reserved}}}\n"),
        "",
    ));
    let (offer, _, _) = reply(e.handle(NOW + 10, &c.discover(), from_client(), &direct()));
    assert_eq!(offer.yiaddr(), reserved);
    let held = e.leases().find(|l| l.ip == old).unwrap();
    assert_eq!(held.state, LeaseState::Active, "an offer moves nothing yet");
    let (ack, commit, vacated) = ack_records(e.handle(
        NOW + 10,
        &c.select(reserved, SERVER),
        from_client(),
        &direct(),
    ));
    assert_eq!(kind(&ack), MessageType::Ack);
    let vacated = vacated.expect("the old address's release is logged");
    assert_eq!(
        (vacated.ip, vacated.state),
        (IpAddr::V4(old), LeaseState::Released)
    );
    assert_eq!(commit.unwrap().ip, reserved);
    // The reservation is outside the pool: the pool's one lease was the old.
    assert_eq!(
        e.pool_stats(NOW + 10)[0].leased,
        0,
        "the old address is free"
    );
}

/// The log's newest line for an address is unreadable (a bad sector, a
/// hand edit): the older record must not stand for it, since the lost line
/// may have moved the address to another client. It is held back instead.
#[test]
fn an_address_whose_newest_line_is_unreadable_goes_to_nobody() {
    let cfg = vlan_config("", "");
    let mut e = Engine::new(&cfg);
    let mut a = Client::new(1);
    let ip = dora(&mut e, &mut a, NOW);
    // What recovery hands over when the log's newest line for `ip` could
    // not be read (the store's `an_unreadable_line_names_its_address…`
    // finds the address): the older records, and the address.
    let records: Vec<_> = e.leases().map(|l| l.to_record()).collect();
    let unreadable = vec![ip];
    let mut restarted = Engine::new(&cfg);
    restarted.restore(&records);
    let held = restarted.hold_unreadable(NOW + 60, &unreadable);
    assert_eq!(held.len(), 1);
    assert_eq!(
        (held[0].ip, held[0].state),
        (IpAddr::V4(ip), LeaseState::Declined)
    );
    assert_eq!(
        held[0].expires,
        NOW + 60 + 3600,
        "held for the longest lease time"
    );
    // The client of the older record does not get it back, nor does anyone.
    let (nak, _, _) = reply(restarted.handle(
        NOW + 60,
        &a.renew(ip),
        SocketAddrV4::new(ip, 68),
        &Ingress::Address,
    ));
    assert_eq!(kind(&nak), MessageType::Nak);
    // Every other pool address (ten) goes out before it would.
    for n in 2..=11 {
        let got = dora(&mut restarted, &mut Client::new(n), NOW + 60);
        assert_ne!(got, ip);
    }
}

/// Under high availability, a replica serving with no standby to confirm
/// gives new addresses only from its half of the pool, so that a peer that
/// may be serving at the same time never gives out the same one; a client
/// that holds an address in the other half keeps it.
#[test]
fn a_replica_serving_alone_gives_new_addresses_from_its_share_only() {
    use crate::merge::Share;
    let mut e = Engine::new(&vlan_config("", ""));
    let mut before = Client::new(1);
    let held = dora(&mut e, &mut before, NOW);
    let share = Share {
        first: u32::from(held) & 1 == 1,
    };
    assert!(
        !share.holds(held),
        "the test needs a lease in the other half"
    );
    e.set_share(Some(share));
    let (ack, _, _) = reply(e.handle(
        NOW + 10,
        &before.renew(held),
        SocketAddrV4::new(held, 68),
        &Ingress::Address,
    ));
    assert_eq!(kind(&ack), MessageType::Ack, "a renewal in the peer's half");
    let mut given = Vec::new();
    // .10 is held; five of .11-.20 are in the share.
    for n in 2..7 {
        let mut c = Client::new(n);
        let (offer, _, _) = reply(e.handle(NOW + 20, &c.discover(), from_client(), &direct()));
        assert_eq!(kind(&offer), MessageType::Offer);
        given.push(offer.yiaddr());
        let (ack, _, _) = reply(e.handle(
            NOW + 20,
            &c.select(offer.yiaddr(), SERVER),
            from_client(),
            &direct(),
        ));
        assert_eq!(kind(&ack), MessageType::Ack);
    }
    assert!(
        given.iter().all(|ip| share.holds(*ip)),
        "offered outside the share: {given:?}"
    );
    // The pool is 192.168.100.10-20: this half of what is left runs out,
    // and the other half is not offered.
    let mut late = Client::new(9);
    assert!(matches!(
        e.handle(NOW + 30, &late.discover(), from_client(), &direct()),
        Outcome::Ignore(Ignored::PoolExhausted)
    ));
    // An address of the other half, asked for outright: refused.
    let other = Ipv4Addr::from(u32::from(held) + 2);
    let (nak, _, commit) = reply(e.handle(
        NOW + 30,
        &late.select(other, SERVER),
        from_client(),
        &direct(),
    ));
    assert_eq!(kind(&nak), MessageType::Nak);
    assert!(commit.is_none());
    // With a standby confirming again, the whole pool.
    e.set_share(None);
    let (offer, _, _) = reply(e.handle(NOW + 40, &late.discover(), from_client(), &direct()));
    assert!(!share.holds(offer.yiaddr()));
}

/// `n` active leases from `first` on, each its own client's, ending at
/// `expires`, as records a restart reads.
fn active_records(first: Ipv4Addr, n: u32, expires: u64) -> Vec<crate::LeaseRecord> {
    (0..n)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(first) + i);
            let [a, b, c, d] = ip.octets();
            let hw = [0x52, 0x54, a, b, c, d];
            crate::LeaseRecord {
                ip: ip.into(),
                client: ClientKey::from_hardware(1, &hw).to_hex(),
                hw: hw
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
                state: LeaseState::Active,
                expires,
                hostname: None,
                term: 0,
            }
        })
        .collect()
}

#[test]
fn pool_statistics_and_reclaims_cost_what_expired_not_the_lease_table() {
    // Four pools of a /16, 40,000 leases held in all, 10 of them expired.
    let mut e = Engine::new(&config(
        r#"  subnets:
    - {cidr: 10.40.0.0/16, interface: net1, serverId: 10.40.0.1, pools: [{start: 10.40.0.10, end: 10.40.63.255}, {start: 10.40.64.0, end: 10.40.127.255}, {start: 10.40.128.0, end: 10.40.191.255}, {start: 10.40.192.0, end: 10.40.255.250}]}"#,
    ));
    let mut records = active_records(Ipv4Addr::new(10, 40, 0, 10), 39_990, NOW + 3600);
    records.extend(active_records(Ipv4Addr::new(10, 40, 200, 0), 10, NOW - 1));
    e.restore(&records);
    let before = e.lease_visits();
    let stats = e.pool_stats(NOW);
    let held: u64 = stats.iter().map(|s| s.leased).sum();
    assert_eq!(held, 39_990, "{stats:?}");
    assert_eq!(e.reclaim(NOW), 10);
    let stats = e.pool_stats(NOW);
    assert_eq!(stats.iter().map(|s| s.leased).sum::<u64>(), 39_990);
    let total: u64 = stats.iter().map(|s| s.total).sum();
    let free: u64 = stats.iter().map(|s| s.free).sum();
    assert_eq!(free, total - 39_990, "{stats:?}");
    let visits = e.lease_visits() - before;
    // The ten that ended, once by the first statistics and once by the
    // reclaim; none by the second statistics.
    assert_eq!(
        visits, 20,
        "two pool statistics and a reclaim looked at {visits} leases for 10 that expired"
    );
}
