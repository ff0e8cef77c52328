//! The local decision for one query: answer it from our data, refuse it,
//! or forward it. Pure: no cache, no socket, no clock.

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;

use crate::authority::{Authority, Lookup};
use crate::message::{self, ParsedQuery};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A response to send. `reusable` when it may serve later identical
    /// queries (an authoritative answer that was not truncated).
    Reply { wire: Vec<u8>, reusable: bool },
    /// Not ours, and the client may recurse: ask upstream.
    Forward,
}

/// Decides `q` from `view` for `client` at `now`, fitting the reply in
/// `limit` bytes. `can_forward` is false when no upstream exists.
pub fn decide(
    auth: &Authority,
    view: usize,
    q: &ParsedQuery,
    client: IpAddr,
    now: u64,
    limit: usize,
    can_forward: bool,
) -> Decision {
    let recurse = auth.may_recurse(client);
    match auth.lookup(view, &q.lower, q.qtype(), now) {
        Lookup::Answer(answer) => {
            let wire = message::local_response(q, &answer, recurse, limit);
            let truncated = wire.get(2).is_some_and(|b| b & 0x02 != 0);
            Decision::Reply {
                wire,
                reusable: !truncated,
            }
        }
        // Never an open resolver: strangers get only our zones.
        Lookup::NotOurs if !recurse => Decision::Reply {
            wire: message::error_response(q, ResponseCode::Refused, false),
            reusable: false,
        },
        Lookup::NotOurs if !can_forward => Decision::Reply {
            wire: message::error_response(q, ResponseCode::ServFail, true),
            reusable: false,
        },
        Lookup::NotOurs => Decision::Forward,
    }
}

/// Arbitrary bytes through parsing and the local decision, as the fuzz
/// target and the stable-toolchain property test both drive it. Must never
/// panic.
pub fn drive_bytes(auth: &Authority, request: &[u8], client: IpAddr, now: u64) -> Option<Vec<u8>> {
    let q = match message::parse(request) {
        Ok(q) => q,
        Err(message::Rejected::Reply { id, rcode, .. }) => {
            return Some(message::bare_error(id, rcode))
        }
        Err(message::Rejected::Drop(_)) => return None,
    };
    let view = auth.view_for(client);
    match decide(auth, view, &q, client, now, q.udp_limit(), true) {
        Decision::Reply { wire, .. } => Some(wire),
        Decision::Forward => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::DynamicNames;
    use causeway_config::Config;
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    use proptest::prelude::*;
    use std::sync::Arc;

    fn authority() -> Authority {
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\nnetwork: {cidr: 192.168.100.0/24, address: 192.168.100.2}\ndns:\n  listen: ['127.0.0.1:5353']\n  records: [{name: c, type: CNAME, value: api}]\n",
        )
        .unwrap()
        .dns
        .unwrap();
        Authority::new(
            &cfg,
            Arc::new(DynamicNames::for_zone(cfg.zone.as_deref())),
            1,
        )
        .unwrap()
    }

    fn query(name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(9).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    #[test]
    fn strangers_are_refused_names_outside_our_zones() {
        let auth = authority();
        let stranger: IpAddr = "203.0.113.9".parse().unwrap();
        let wire = drive_bytes(&auth, &query("www.example.net."), stranger, 0).unwrap();
        assert_eq!(
            Message::from_vec(&wire).unwrap().response_code(),
            ResponseCode::Refused
        );
        // Our own zone is still answered for them.
        let wire = drive_bytes(&auth, &query("api.hc1.example.com."), stranger, 0).unwrap();
        let m = Message::from_vec(&wire).unwrap();
        assert_eq!(m.response_code(), ResponseCode::NoError);
        assert!(m.authoritative());
        assert!(!m.recursion_available());
        // A VLAN client is forwarded.
        let vlan: IpAddr = "192.168.100.50".parse().unwrap();
        let q = message::parse(&query("www.example.net.")).unwrap();
        assert_eq!(decide(&auth, 0, &q, vlan, 0, 512, true), Decision::Forward);
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let auth = authority();
            let _ = drive_bytes(&auth, &bytes, "127.0.0.1".parse().unwrap(), 0);
        }

        #[test]
        fn mutated_queries_never_panic(flips in proptest::collection::vec((0usize..64, any::<u8>()), 1..12)) {
            let auth = authority();
            let mut bytes = query("c.hc1.example.com.");
            for (at, v) in flips {
                if let Some(b) = bytes.get_mut(at) { *b = v; }
            }
            let _ = drive_bytes(&auth, &bytes, "192.168.100.7".parse().unwrap(), 0);
        }
    }
}
