//! Stateless DHCPv6 without I/O (RFC 8415 section 6.1): an
//! Information-Request, direct or inside Relay-Forward messages, is
//! answered with the DNS servers, the search domains and the refresh time.
//! Bytes in, bytes out, so tests and fuzzing drive it without sockets.
//!
//! The relay wrapper is read here rather than by dhcproto, which decodes
//! the Relay Message option's contents as another relay header: the
//! innermost one is a client's message, whose header is 4 bytes, not 34.

use std::net::Ipv6Addr;

use causeway_config::Dhcp6Config;
use dhcproto::v6::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder, Name};

const RELAY_FORW: u8 = 12;
const RELAY_REPL: u8 = 13;
const OPTION_RELAY_MSG: u16 = 9;
const OPTION_INTERFACE_ID: u16 = 18;
/// RFC 6939.
const OPTION_CLIENT_LINKLAYER_ADDR: u16 = 79;
/// RFC 8415 section 7.6: relays nest at most this deep.
const HOP_COUNT_LIMIT: u8 = 8;
/// The relay header: type, hop count, link address, peer address.
const RELAY_HEADER: usize = 34;

/// Why a message got no reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Ignored6 {
    #[error("not a DHCPv6 message")]
    Malformed,
    #[error("a relay header or its options are cut short")]
    MalformedRelay,
    #[error("relayed through more than 8 relays")]
    TooManyRelays,
    #[error("a Relay-Forward without a Relay Message option")]
    NoRelayMessage,
    #[error("addressed to another server (Server Identifier)")]
    OtherServer,
    #[error("an Information-Request with an IA option (RFC 8415 section 16.12)")]
    InformationRequestWithIa,
    #[error("a message type this server does not answer (or stateful without pools)")]
    NotServed,
    #[error("no Client Identifier")]
    NoClientId,
    #[error("a Solicit, Rebind or Confirm that names a server (RFC 8415 section 16)")]
    ServerIdNotAllowed,
    #[error("a Confirm without addresses (RFC 8415 section 18.3.3)")]
    NothingToConfirm,
    #[error("no server here holds the leases (a standby, or no dhcp section)")]
    NoLeaseStore,
    #[error("relayed from another link: the relay's link address is outside dhcp6.prefix")]
    OtherLink,
}

impl Ignored6 {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Ignored6::Malformed => "malformed",
            Ignored6::MalformedRelay => "malformed_relay",
            Ignored6::TooManyRelays => "too_many_relays",
            Ignored6::NoRelayMessage => "no_relay_message",
            Ignored6::OtherServer => "other_server",
            Ignored6::InformationRequestWithIa => "information_request_with_ia",
            Ignored6::NotServed => "not_served",
            Ignored6::NoClientId => "no_client_id",
            Ignored6::ServerIdNotAllowed => "server_id_not_allowed",
            Ignored6::NothingToConfirm => "nothing_to_confirm",
            Ignored6::NoLeaseStore => "no_lease_store",
            Ignored6::OtherLink => "other_link",
        }
    }

    pub const ALL: [Ignored6; 12] = [
        Ignored6::Malformed,
        Ignored6::MalformedRelay,
        Ignored6::TooManyRelays,
        Ignored6::NoRelayMessage,
        Ignored6::OtherServer,
        Ignored6::InformationRequestWithIa,
        Ignored6::NotServed,
        Ignored6::NoClientId,
        Ignored6::ServerIdNotAllowed,
        Ignored6::NothingToConfirm,
        Ignored6::NoLeaseStore,
        Ignored6::OtherLink,
    ];
}

/// DUID-LL (RFC 8415 section 11.4) of an Ethernet address.
pub fn duid_ll(mac: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0, 3, 0, 1];
    d.extend_from_slice(&mac);
    d
}

/// What the server answers: built once from the config.
#[derive(Debug, Clone)]
pub struct Stateless {
    duid: Vec<u8>,
    dns_servers: Vec<Ipv6Addr>,
    domain_search: Vec<Name>,
    refresh: Option<u32>,
}

/// The reply to send and the kind of message it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub bytes: Vec<u8>,
    /// How many relays the request came through (0: direct).
    pub relays: u8,
}

impl Stateless {
    pub fn new(cfg: &Dhcp6Config, duid: Vec<u8>) -> Stateless {
        Stateless {
            duid: cfg.server_duid.clone().unwrap_or(duid),
            dns_servers: cfg.dns_servers.clone(),
            // Names the config accepted are valid DNS names; one that
            // still does not parse is left out rather than sent wrong.
            domain_search: cfg
                .domain_search
                .iter()
                .filter_map(|d| Name::from_ascii(format!("{d}.")).ok())
                .collect(),
            refresh: cfg
                .information_refresh_time
                .map(|t| u32::try_from(t.as_secs()).unwrap_or(u32::MAX)),
        }
    }

    pub fn duid(&self) -> &[u8] {
        &self.duid
    }

    /// The reply to a datagram received on port 547, or why there is none.
    pub fn handle(&self, bytes: &[u8]) -> Result<Answer, Ignored6> {
        let relayed = unwrap_relays(bytes)?;
        let reply = self.client(relayed.client)?;
        Ok(Answer {
            relays: relayed.depth(),
            bytes: relayed.wrap(&reply)?,
        })
    }

    fn client(&self, bytes: &[u8]) -> Result<Vec<u8>, Ignored6> {
        let msg = decode_client(bytes)?;
        if msg.msg_type() != MessageType::InformationRequest {
            return Err(Ignored6::NotServed);
        }
        self.information_reply(&msg)
    }

    /// The Reply to an Information-Request, or why RFC 8415 section
    /// 16.12 says to send none.
    pub fn information_reply(&self, msg: &Message) -> Result<Vec<u8>, Ignored6> {
        let opts = msg.opts();
        if opts.get(OptionCode::IANA).is_some()
            || opts.get(OptionCode::IATA).is_some()
            || opts.get(OptionCode::IAPD).is_some()
        {
            return Err(Ignored6::InformationRequestWithIa);
        }
        if let Some(DhcpOption::ServerId(id)) = opts.get(OptionCode::ServerId) {
            if *id != self.duid {
                return Err(Ignored6::OtherServer);
            }
        }
        // RFC 8415 requires an Option Request option here; a client that
        // sends none is given everything this server has.
        let wanted = |code: OptionCode| match opts.get(OptionCode::ORO) {
            Some(DhcpOption::ORO(oro)) => oro.opts.contains(&code),
            _ => true,
        };
        let mut reply = Message::new_with_id(MessageType::Reply, msg.xid());
        let out = reply.opts_mut();
        out.insert(DhcpOption::ServerId(self.duid.clone()));
        if let Some(DhcpOption::ClientId(id)) = opts.get(OptionCode::ClientId) {
            out.insert(DhcpOption::ClientId(id.clone()));
        }
        self.add_configuration(msg, out, &wanted);
        if let Some(t) = self.refresh {
            out.insert(DhcpOption::InformationRefreshTime(t));
        }
        encode(&reply)
    }

    /// The DNS servers and search domains the client asked for (all of
    /// them when it sent no Option Request option).
    pub fn add_configuration(
        &self,
        _msg: &Message,
        out: &mut dhcproto::v6::DhcpOptions,
        wanted: &dyn Fn(OptionCode) -> bool,
    ) {
        if !self.dns_servers.is_empty() && wanted(OptionCode::DomainNameServers) {
            out.insert(DhcpOption::DomainNameServers(self.dns_servers.clone()));
        }
        if !self.domain_search.is_empty() && wanted(OptionCode::DomainSearchList) {
            out.insert(DhcpOption::DomainSearchList(self.domain_search.clone()));
        }
    }
}

/// Whether the client's Option Request option names `code` (true when it
/// sent none: such a client is given everything).
pub fn requested(msg: &Message, code: OptionCode) -> bool {
    match msg.opts().get(OptionCode::ORO) {
        Some(DhcpOption::ORO(oro)) => oro.opts.contains(&code),
        _ => true,
    }
}

pub(crate) fn encode(msg: &Message) -> Result<Vec<u8>, Ignored6> {
    let mut buf = Vec::with_capacity(160);
    msg.encode(&mut Encoder::new(&mut buf))
        .map_err(|_| Ignored6::Malformed)?;
    Ok(buf)
}

/// A client's message (not a relay's), decoded only once its options are
/// known to be safe for dhcproto to read.
pub fn decode_client(bytes: &[u8]) -> Result<Message, Ignored6> {
    if bytes.len() < 4 || !options_decodable(&bytes[4..], 0) {
        return Err(Ignored6::Malformed);
    }
    Message::decode(&mut Decoder::new(bytes)).map_err(|_| Ignored6::Malformed)
}

/// What a relay added on the way in: its header and the Interface-Id to
/// echo on the way out.
#[derive(Debug, Clone)]
struct RelayHop {
    /// Hop count, link address and peer address (bytes 1..34 of its header).
    header: Vec<u8>,
    interface_id: Option<Vec<u8>>,
}

/// The relays a request came through, outermost first: what a reply sent
/// later (once its lease is durable) needs to go back through them.
#[derive(Debug, Clone, Default)]
pub struct RelayPath {
    hops: Vec<RelayHop>,
}

impl RelayPath {
    /// How many relays the request came through (0: direct).
    pub fn depth(&self) -> u8 {
        u8::try_from(self.hops.len()).unwrap_or(u8::MAX)
    }

    /// Puts `reply` inside a Relay-Reply for each relay, innermost first
    /// (RFC 8415 section 19.3: the same header, the Interface-Id echoed).
    pub fn wrap(&self, reply: &[u8]) -> Result<Vec<u8>, Ignored6> {
        let mut out = reply.to_vec();
        for hop in self.hops.iter().rev() {
            let mut outer = Vec::with_capacity(RELAY_HEADER + 8 + out.len() + 64);
            outer.push(RELAY_REPL);
            outer.extend_from_slice(&hop.header);
            for (code, value) in hop
                .interface_id
                .as_deref()
                .map(|v| (OPTION_INTERFACE_ID, v))
                .into_iter()
                .chain([(OPTION_RELAY_MSG, out.as_slice())])
            {
                let len = u16::try_from(value.len()).map_err(|_| Ignored6::MalformedRelay)?;
                outer.extend_from_slice(&code.to_be_bytes());
                outer.extend_from_slice(&len.to_be_bytes());
                outer.extend_from_slice(value);
            }
            out = outer;
        }
        Ok(out)
    }
}

/// A datagram on port 547 with its relay wrappers taken off.
#[derive(Debug, Clone)]
pub struct Relayed<'a> {
    pub path: RelayPath,
    /// The client's own message.
    pub client: &'a [u8],
    /// The client's link-layer address as the relay nearest it saw it
    /// (RFC 6939's option, Ethernet only).
    pub client_link_layer: Option<[u8; 6]>,
    /// The link address of the relay nearest the client: which link the
    /// client is on (unspecified when that relay leaves it to the
    /// Interface-Id).
    pub link_address: Option<Ipv6Addr>,
}

impl Relayed<'_> {
    pub fn depth(&self) -> u8 {
        self.path.depth()
    }

    pub fn wrap(&self, reply: &[u8]) -> Result<Vec<u8>, Ignored6> {
        self.path.wrap(reply)
    }
}

/// Takes the Relay-Forward wrappers off a datagram (up to 8, RFC 8415
/// section 7.6), keeping what the reply needs to go back through them.
pub fn unwrap_relays(bytes: &[u8]) -> Result<Relayed<'_>, Ignored6> {
    let mut relayed = Relayed {
        path: RelayPath::default(),
        client: bytes,
        client_link_layer: None,
        link_address: None,
    };
    loop {
        match relayed.client.first() {
            Some(&RELAY_FORW) => {}
            Some(_) => return Ok(relayed),
            None => return Err(Ignored6::Malformed),
        }
        let bytes = relayed.client;
        if bytes.len() < RELAY_HEADER {
            return Err(Ignored6::MalformedRelay);
        }
        if bytes[1] >= HOP_COUNT_LIMIT || relayed.path.hops.len() >= usize::from(HOP_COUNT_LIMIT) {
            return Err(Ignored6::TooManyRelays);
        }
        let mut inner = None;
        let mut interface_id = None;
        let mut link_layer = None;
        let mut rest = &bytes[RELAY_HEADER..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(Ignored6::MalformedRelay);
            }
            let code = u16::from_be_bytes([rest[0], rest[1]]);
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            let value = rest.get(4..4 + len).ok_or(Ignored6::MalformedRelay)?;
            match code {
                OPTION_RELAY_MSG => inner = Some(value),
                OPTION_INTERFACE_ID => interface_id = Some(value),
                // Link-layer type 1 (Ethernet), then the address.
                OPTION_CLIENT_LINKLAYER_ADDR if len == 8 && value[..2] == [0, 1] => {
                    link_layer = <[u8; 6]>::try_from(&value[2..]).ok();
                }
                _ => {}
            }
            rest = &rest[4 + len..];
        }
        // Each relay nearer the client overrides what a farther one said.
        if link_layer.is_some() {
            relayed.client_link_layer = link_layer;
        }
        let mut link = [0u8; 16];
        link.copy_from_slice(&bytes[2..18]);
        relayed.link_address = Some(Ipv6Addr::from(link));
        relayed.path.hops.push(RelayHop {
            header: bytes[1..RELAY_HEADER].to_vec(),
            interface_id: interface_id.map(<[u8]>::to_vec),
        });
        relayed.client = inner.ok_or(Ignored6::NoRelayMessage)?;
    }
}

/// Whether dhcproto can decode these options without tripping over a
/// length shorter than an option's fixed part: it subtracts that part from
/// the length unchecked, which panics in a build with overflow checks (and
/// misreads in one without). Each container's own options are walked too;
/// a Relay Message inside a client's message is never valid and is
/// refused here, as dhcproto would read it as a relay header.
fn options_decodable(mut rest: &[u8], depth: u8) -> bool {
    // IA options nest addresses, which nest status codes: three levels is
    // all a valid message has.
    if depth > 4 {
        return false;
    }
    while !rest.is_empty() {
        if rest.len() < 4 {
            return false;
        }
        let code = u16::from_be_bytes([rest[0], rest[1]]);
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
        let Some(value) = rest.get(4..4 + len) else {
            return false;
        };
        // The fixed part before any nested options, and the least length.
        let (fixed, nested) = match code {
            3 | 25 => (12, true), // IA_NA, IA_PD: IAID, T1, T2
            4 => (4, true),       // IA_TA: IAID
            5 => (24, true),      // IA Address: address, lifetimes
            26 => (25, true),     // IA Prefix: lifetimes, length, prefix
            17 => (4, true),      // Vendor-specific: enterprise number
            9 => return false,    // Relay Message: not in a client's message
            11 => (11, false),    // Authentication
            13 => (2, false),     // Status Code
            16 => (4, false),     // Vendor Class
            _ => (0, false),
        };
        // dhcproto reads these by their type's size whatever the length
        // says, and would then read the next option from the wrong byte.
        let exact = match code {
            7 | 19 => Some(1),  // Preference, Reconfigure Message
            8 => Some(2),       // Elapsed Time
            12 => Some(16),     // Server Unicast
            14 | 20 => Some(0), // Rapid Commit, Reconfigure Accept
            _ => None,
        };
        if exact.is_some_and(|n| len != n)
            || len < fixed
            || (nested && !options_decodable(&value[fixed..], depth + 1))
        {
            return false;
        }
        rest = &rest[4 + len..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_config::Config;
    use dhcproto::v6::ORO;

    fn server() -> Stateless {
        let cfg = Config::from_yaml(
            "cluster: {name: hc1, baseDomain: example.com}\ndhcp6:\n  interface: net1\n  dnsServers: ['fd42:10::53']\n  informationRefreshTime: 1h\n",
        )
        .unwrap()
        .dhcp6
        .unwrap();
        Stateless::new(&cfg, duid_ll([2, 0, 0, 0, 0, 1]))
    }

    fn information_request(extra: &[DhcpOption]) -> Vec<u8> {
        let mut m = Message::new_with_id(MessageType::InformationRequest, [1, 2, 3]);
        m.opts_mut()
            .insert(DhcpOption::ClientId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]));
        m.opts_mut().insert(DhcpOption::ORO(ORO {
            opts: vec![OptionCode::DomainNameServers, OptionCode::DomainSearchList],
        }));
        for o in extra {
            m.opts_mut().insert(o.clone());
        }
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        buf
    }

    fn decode(bytes: &[u8]) -> Message {
        Message::decode(&mut Decoder::new(bytes)).unwrap()
    }

    #[test]
    fn an_information_request_gets_dns_the_domain_and_the_refresh_time() {
        let s = server();
        let answer = s.handle(&information_request(&[])).unwrap();
        assert_eq!(answer.relays, 0);
        let reply = decode(&answer.bytes);
        assert_eq!(reply.msg_type(), MessageType::Reply);
        assert_eq!(reply.xid(), [1, 2, 3]);
        let o = reply.opts();
        assert_eq!(
            o.get(OptionCode::ServerId),
            Some(&DhcpOption::ServerId(duid_ll([2, 0, 0, 0, 0, 1])))
        );
        assert!(o.get(OptionCode::ClientId).is_some());
        assert_eq!(
            o.get(OptionCode::DomainNameServers),
            Some(&DhcpOption::DomainNameServers(vec!["fd42:10::53"
                .parse()
                .unwrap()]))
        );
        assert_eq!(
            o.get(OptionCode::DomainSearchList),
            Some(&DhcpOption::DomainSearchList(vec![Name::from_ascii(
                "hc1.example.com."
            )
            .unwrap()]))
        );
        // dhcproto writes option 32 but reads it back as unknown: the
        // bytes are what a client reads.
        match o.get(OptionCode::InformationRefreshTime) {
            Some(DhcpOption::InformationRefreshTime(t)) => assert_eq!(*t, 3600),
            Some(DhcpOption::Unknown(u)) => assert_eq!(u.data(), 3600u32.to_be_bytes()),
            other => panic!("no information refresh time: {other:?}"),
        }
    }

    #[test]
    fn what_rfc_8415_says_to_discard_gets_no_reply() {
        let s = server();
        let with_ia = information_request(&[DhcpOption::IANA(dhcproto::v6::IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: Default::default(),
        })]);
        assert_eq!(s.handle(&with_ia), Err(Ignored6::InformationRequestWithIa));
        let other =
            information_request(&[DhcpOption::ServerId(vec![0, 3, 0, 1, 9, 9, 9, 9, 9, 9])]);
        assert_eq!(s.handle(&other), Err(Ignored6::OtherServer));
        let mut solicit = Message::new_with_id(MessageType::Solicit, [1, 2, 3]);
        solicit
            .opts_mut()
            .insert(DhcpOption::ClientId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 9]));
        let mut buf = Vec::new();
        solicit.encode(&mut Encoder::new(&mut buf)).unwrap();
        assert_eq!(s.handle(&buf), Err(Ignored6::NotServed));
        assert_eq!(s.handle(&[]), Err(Ignored6::Malformed));
        assert_eq!(s.handle(&[11, 0]), Err(Ignored6::Malformed));
    }

    fn relay_forward(hops: u8, inner: &[u8], interface_id: Option<&[u8]>) -> Vec<u8> {
        let mut out = vec![RELAY_FORW, hops];
        out.extend_from_slice(&"fd42:20::1".parse::<Ipv6Addr>().unwrap().octets());
        out.extend_from_slice(&"fe80::9".parse::<Ipv6Addr>().unwrap().octets());
        if let Some(id) = interface_id {
            out.extend_from_slice(&OPTION_INTERFACE_ID.to_be_bytes());
            out.extend_from_slice(&(id.len() as u16).to_be_bytes());
            out.extend_from_slice(id);
        }
        out.extend_from_slice(&OPTION_RELAY_MSG.to_be_bytes());
        out.extend_from_slice(&(inner.len() as u16).to_be_bytes());
        out.extend_from_slice(inner);
        out
    }

    #[test]
    fn a_relayed_request_is_answered_through_the_same_relays_with_the_interface_id() {
        let s = server();
        let inner = information_request(&[]);
        let once = relay_forward(0, &inner, Some(b"port7"));
        let twice = relay_forward(1, &once, None);
        let answer = s.handle(&twice).unwrap();
        assert_eq!(answer.relays, 2);
        let outer = &answer.bytes;
        assert_eq!(outer[0], RELAY_REPL);
        assert_eq!(&outer[1..RELAY_HEADER], &twice[1..RELAY_HEADER]);
        // The outer reply holds the inner relay's reply, which holds the
        // Interface-Id and the client's Reply.
        let inner_reply = &outer[RELAY_HEADER + 4..];
        assert_eq!(inner_reply[0], RELAY_REPL);
        let opts = &inner_reply[RELAY_HEADER..];
        assert_eq!(u16::from_be_bytes([opts[0], opts[1]]), OPTION_INTERFACE_ID);
        assert_eq!(&opts[4..9], b"port7");
        let reply = decode(&opts[9 + 4..]);
        assert_eq!(reply.msg_type(), MessageType::Reply);
        let mut deep = inner;
        for hop in 0..9 {
            deep = relay_forward(hop, &deep, None);
        }
        assert_eq!(s.handle(&deep), Err(Ignored6::TooManyRelays));
        assert_eq!(s.handle(&once[..20]), Err(Ignored6::MalformedRelay));
        let cut = relay_forward(0, &[], None);
        assert_eq!(s.handle(&cut[..cut.len()]), Err(Ignored6::Malformed));
        assert_eq!(
            s.handle(&once[..RELAY_HEADER]),
            Err(Ignored6::NoRelayMessage)
        );
    }

    #[test]
    fn options_shorter_than_their_fixed_part_are_refused_before_dhcproto_reads_them() {
        let s = server();
        // Found by the dhcp6_message fuzz target: a Vendor-specific option
        // of length 0 inside a relayed message, which dhcproto reads by
        // subtracting 4 from its length.
        let mut vendor = vec![11, 1, 2, 3, 0, 17, 0, 0];
        assert_eq!(s.handle(&vendor), Err(Ignored6::Malformed));
        // Also found by it: a Preference option of length 2, which dhcproto
        // reads as one byte, so that it then finds a Status Code of length
        // 0 where the TLVs have none (it panicked subtracting 2 from 0).
        let misaligned: [u8; 64] = [
            0x0b, 0x01, 0x02, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x02, 0x00, 0x3f,
            0x04, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0xe9, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00,
            0x0d, 0x00, 0x00, 0x00, 0x00, 0x00, 0xfb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x08,
            0x00, 0x06, 0x00, 0x04, 0x00, 0x17, 0x00, 0x18,
        ];
        assert_eq!(s.handle(&misaligned), Err(Ignored6::Malformed));
        for (code, short) in [(11u8, 10u8), (13, 1), (16, 3), (3, 11), (5, 23), (26, 24)] {
            vendor = vec![11, 1, 2, 3, 0, code, 0, short];
            vendor.extend(std::iter::repeat_n(0, usize::from(short)));
            assert_eq!(s.handle(&vendor), Err(Ignored6::Malformed), "option {code}");
        }
        // Nested: an IA_NA whose address option is short.
        let nested = [
            11, 1, 2, 3, 0, 3, 0, 16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0,
        ];
        assert_eq!(s.handle(&nested), Err(Ignored6::Malformed));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// On the stable toolchain, what the fuzz target checks on nightly:
        /// any bytes after a valid header (an Information-Request's, or a
        /// Relay-Forward's around one) are answered or refused, never a
        /// panic, and a direct answer is a Reply that decodes.
        #[test]
        fn any_options_are_answered_or_refused(
            options in proptest::collection::vec(
                (
                    proptest::sample::select(vec![1u16, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 16, 17, 19, 20, 23, 24, 25, 26, 32, 39, 56]),
                    proptest::option::of(0u16..48),
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                ),
                0..8,
            ),
            relayed in proptest::prelude::any::<bool>(),
        ) {
            let s = server();
            // Options of the codes that have a structure, with a length
            // that is the value's or (Some) any other: short fixed parts,
            // wrong fixed sizes and nesting are what break decoders.
            let mut inner = vec![11, 1, 2, 3];
            for (code, declared, value) in &options {
                let len = declared.unwrap_or(u16::try_from(value.len()).unwrap_or(0));
                inner.extend_from_slice(&code.to_be_bytes());
                inner.extend_from_slice(&len.to_be_bytes());
                inner.extend_from_slice(value);
            }
            let bytes = if relayed { relay_forward(0, &inner, None) } else { inner };
            if let Ok(answer) = s.handle(&bytes) {
                if answer.relays == 0 {
                    proptest::prop_assert_eq!(decode(&answer.bytes).msg_type(), MessageType::Reply);
                } else {
                    proptest::prop_assert_eq!(answer.bytes[0], RELAY_REPL);
                }
            }
        }
    }
}
