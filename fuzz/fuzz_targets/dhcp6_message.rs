//! DHCPv6 datagrams as port 547 receives them, direct or relayed: any
//! bytes are answered or refused with a reason, never a panic, and every
//! answer to a direct request is a Reply that decodes.
#![no_main]

use causeway_config::Config;
use causeway_dhcp::v6::{duid_ll, Stateless};
use dhcproto::v6::{Message, MessageType};
use dhcproto::{Decodable, Decoder};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = "cluster: {name: hc1, baseDomain: example.com}\ndhcp6:\n  interface: net1\n  dnsServers: ['fd42:10::53']\n  informationRefreshTime: 1h\n";

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
});
