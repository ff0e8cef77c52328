//! DHCPv6 datagrams as port 547 receives them, direct or relayed: any
//! bytes are answered or refused with a reason, never a panic, and every
//! answer to a direct request is a Reply that decodes. The same bytes go
//! to the stateful engine, whose answers decode too and whose records
//! are the v6 leases it now holds.
#![no_main]

use causeway_config::Config;
use causeway_dhcp::lease6::Leases6;
use causeway_dhcp::v6::{decode_client, duid_ll, unwrap_relays, Stateless};
use dhcproto::v6::{Message, MessageType};
use dhcproto::{Decodable, Decoder};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = "cluster: {name: hc1, baseDomain: example.com}\ndhcp6:\n  interface: net1\n  dnsServers: ['fd42:10::53']\n  informationRefreshTime: 1h\n";
const STATEFUL: &str = "network: {interface: net1, cidr: 10.0.0.0/24, gateway: 10.0.0.1, address: 10.0.0.2}\ndhcp: {}\ndhcp6:\n  dnsServers: ['fd42:10::53']\n  prefix: fd42:10::/64\n  pools: [{start: 'fd42:10::100', end: 'fd42:10::103'}]\n  reservations: [{mac: '02:00:00:00:00:09', ip: 'fd42:10::50'}]\n  rapidCommit: true\n";

fuzz_target!(|data: &[u8]| {
    let cfg = Config::from_yaml(CONFIG)
        .ok()
        .and_then(|c| c.dhcp6)
        .expect("the fuzz config is valid");
    let server = Stateless::new(&cfg, duid_ll([2, 0, 0, 0, 0, 1]));
    if let Ok(answer) = server.handle(data) {
        if answer.relays == 0 {
            let reply = Message::decode(&mut Decoder::new(&answer.bytes)).expect("a reply decodes");
            assert_eq!(reply.msg_type(), MessageType::Reply);
        } else {
            assert_eq!(answer.bytes[0], 13, "a relayed answer is a Relay-Reply");
        }
    }
    let cfg = Config::from_yaml(STATEFUL)
        .ok()
        .and_then(|c| c.dhcp6)
        .expect("the stateful fuzz config is valid");
    let mut leases = Leases6::new(&cfg, duid_ll([2, 0, 0, 0, 0, 1])).expect("it leases");
    let Ok(relayed) = unwrap_relays(data) else {
        return;
    };
    let Ok(msg) = decode_client(relayed.client) else {
        return;
    };
    // Twice, a second apart: the second meets the first's leases.
    for now in [1_000_000, 1_000_001] {
        if let Ok(out) = leases.handle(now, &relayed, &msg, None) {
            Message::decode(&mut Decoder::new(&out.reply)).expect("a stateful reply decodes");
            relayed.wrap(&out.reply).expect("a reply fits its relays");
            let held = leases.records();
            for r in &out.commit {
                assert!(
                    held.contains(r),
                    "a committed record is what the engine holds"
                );
                leases.settle(r, true);
            }
        }
    }
});
