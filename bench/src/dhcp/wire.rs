// DHCPv4 wire format for the load generator: pure functions that build the
// client's messages and parse server replies, kept apart from the socket
// loop so they can be unit-tested without a network.

use std::fmt;
use std::net::Ipv4Addr;

use dhcproto::error::EncodeError;
use dhcproto::v4::{self, DhcpOption, MessageType, OptionCode};
use dhcproto::Encodable;

pub type Mac = [u8; 6];

/// Fixed BOOTP header (236 bytes) plus the magic cookie.
const HEADER_LEN: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// RFC 1542 asks for at least 300 octets; some relays and old servers drop
/// anything shorter, and a bench should never be the odd one out.
const MIN_LEN: usize = 300;

/// Parameters shared by every message a run sends.
#[derive(Debug, Clone, Copy)]
pub struct WireConfig {
    /// `Some` in relay mode: written to giaddr (with hops=1) so the server
    /// picks the subnet from it and answers the relay, not a broadcast.
    pub giaddr: Option<Ipv4Addr>,
    /// Direct mode clients have no address yet, so they ask for broadcast
    /// replies.
    pub broadcast: bool,
    pub rapid_commit: bool,
}

/// Deterministic per-client MAC: locally administered unicast (0x02 prefix)
/// so it never collides with real hardware, then the 16-bit seed, then 24
/// bits of client index. Different seeds give disjoint MAC sets.
pub fn client_mac(index: u32, seed: u16) -> Mac {
    let [_, a, b, c] = index.to_be_bytes();
    let [s0, s1] = seed.to_be_bytes();
    [0x02, s0, s1, a, b, c]
}

pub fn fmt_mac(mac: &Mac) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

fn base_message(mac: &Mac, xid: u32, cfg: &WireConfig, mt: MessageType) -> v4::Message {
    let mut msg = v4::Message::default();
    msg.set_opcode(v4::Opcode::BootRequest)
        .set_xid(xid)
        .set_chaddr(mac);
    if let Some(gi) = cfg.giaddr {
        msg.set_giaddr(gi).set_hops(1);
    }
    if cfg.broadcast {
        msg.set_flags(v4::Flags::default().set_broadcast());
    }
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(mt));
    // Client-id 0x01+MAC is what real clients send; servers that key leases
    // on client-id (Kea by default) then behave as they would in production.
    let mut cid = Vec::with_capacity(7);
    cid.push(1);
    cid.extend_from_slice(mac);
    opts.insert(DhcpOption::ClientIdentifier(cid));
    msg
}

fn finish(msg: &v4::Message) -> Result<Vec<u8>, EncodeError> {
    let mut buf = msg.to_vec()?;
    if buf.len() < MIN_LEN {
        buf.resize(MIN_LEN, 0); // 0 is the PAD option
    }
    Ok(buf)
}

fn param_request_list() -> DhcpOption {
    DhcpOption::ParameterRequestList(
        [1u8, 3, 6, 15, 26, 51, 54]
            .into_iter()
            .map(OptionCode::from)
            .collect(),
    )
}

/// Option 12, when the client names itself.
fn insert_hostname(msg: &mut v4::Message, hostname: Option<&str>) {
    if let Some(name) = hostname {
        msg.opts_mut().insert(DhcpOption::Hostname(name.to_owned()));
    }
}

pub fn build_discover(
    mac: &Mac,
    xid: u32,
    hostname: Option<&str>,
    cfg: &WireConfig,
) -> Result<Vec<u8>, EncodeError> {
    let mut msg = base_message(mac, xid, cfg, MessageType::Discover);
    msg.opts_mut().insert(param_request_list());
    insert_hostname(&mut msg, hostname);
    if cfg.rapid_commit {
        msg.opts_mut().insert(DhcpOption::RapidCommit);
    }
    finish(&msg)
}

/// REQUEST in SELECTING state: ciaddr stays zero, the offer is named by
/// option 54 + option 50 (RFC 2131 4.3.2).
pub fn build_request(
    mac: &Mac,
    xid: u32,
    server_id: Ipv4Addr,
    requested: Ipv4Addr,
    hostname: Option<&str>,
    cfg: &WireConfig,
) -> Result<Vec<u8>, EncodeError> {
    let mut msg = base_message(mac, xid, cfg, MessageType::Request);
    let opts = msg.opts_mut();
    opts.insert(param_request_list());
    opts.insert(DhcpOption::ServerIdentifier(server_id));
    opts.insert(DhcpOption::RequestedIpAddress(requested));
    insert_hostname(&mut msg, hostname);
    finish(&msg)
}

/// REQUEST extending a lease the client holds (RFC 2131 4.3.2, RENEWING or,
/// relayed, REBINDING): the address in ciaddr, no option 50 or 54. Never
/// broadcast-flagged: the client has its address.
pub fn build_renew(
    mac: &Mac,
    xid: u32,
    ip: Ipv4Addr,
    hostname: Option<&str>,
    cfg: &WireConfig,
) -> Result<Vec<u8>, EncodeError> {
    let cfg = WireConfig {
        broadcast: false,
        ..*cfg
    };
    let mut msg = base_message(mac, xid, &cfg, MessageType::Request);
    msg.set_ciaddr(ip);
    msg.opts_mut().insert(param_request_list());
    insert_hostname(&mut msg, hostname);
    finish(&msg)
}

/// A message about a lease the server gets no reply to send for, naming
/// the server in option 54; the broadcast flag is meaningless there, so it
/// is never set.
fn about_lease(
    mac: &Mac,
    xid: u32,
    kind: MessageType,
    server_id: Ipv4Addr,
    cfg: &WireConfig,
) -> v4::Message {
    let cfg = WireConfig {
        broadcast: false,
        ..*cfg
    };
    let mut msg = base_message(mac, xid, &cfg, kind);
    msg.opts_mut()
        .insert(DhcpOption::ServerIdentifier(server_id));
    msg
}

/// RELEASE names the lease by ciaddr.
pub fn build_release(
    mac: &Mac,
    xid: u32,
    ip: Ipv4Addr,
    server_id: Ipv4Addr,
    cfg: &WireConfig,
) -> Result<Vec<u8>, EncodeError> {
    let mut msg = about_lease(mac, xid, MessageType::Release, server_id, cfg);
    msg.set_ciaddr(ip);
    finish(&msg)
}

/// DECLINE of an address the client was just given (RFC 2131 4.4.4): the
/// address in option 50, ciaddr zero. A flood of these from fresh MACs is
/// the quarantine attack.
pub fn build_decline(
    mac: &Mac,
    xid: u32,
    ip: Ipv4Addr,
    server_id: Ipv4Addr,
    cfg: &WireConfig,
) -> Result<Vec<u8>, EncodeError> {
    let mut msg = about_lease(mac, xid, MessageType::Decline, server_id, cfg);
    msg.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
    finish(&msg)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    Offer,
    Ack,
    Nak,
    /// Any other DHCP message type, by its code.
    Other(u8),
}

/// The parts of a server reply the bench acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub xid: u32,
    pub kind: ReplyKind,
    pub yiaddr: Ipv4Addr,
    pub server_id: Option<Ipv4Addr>,
    /// Option 51, the lease's length in seconds.
    pub lease_secs: Option<u32>,
    pub rapid_commit: bool,
    chaddr: [u8; 16],
    hlen: u8,
}

impl Reply {
    pub fn chaddr(&self) -> &[u8] {
        &self.chaddr[..usize::from(self.hlen)]
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    Truncated { len: usize },
    NotBootReply { op: u8 },
    BadHlen { hlen: u8 },
    BadCookie,
    OptionOverrun { code: u8 },
    NoMessageType,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len } => write!(f, "truncated: {len} bytes"),
            Self::NotBootReply { op } => write!(f, "op {op} is not BOOTREPLY"),
            Self::BadHlen { hlen } => write!(f, "hlen {hlen} exceeds 16"),
            Self::BadCookie => write!(f, "missing DHCP magic cookie"),
            Self::OptionOverrun { code } => write!(f, "option {code} runs past the packet"),
            Self::NoMessageType => write!(f, "no DHCP message type option"),
        }
    }
}

impl std::error::Error for ParseError {}

/// Parses a server reply. Hand-rolled rather than dhcproto's full decoder:
/// only options 51, 53, 54 and 80 matter here, every index is checked (a
/// garbled packet is an `Err`, never a panic), and a server's quirk in some
/// unrelated option must not make its replies count as garbled.
pub fn parse_reply(b: &[u8]) -> Result<Reply, ParseError> {
    let truncated = ParseError::Truncated { len: b.len() };
    let header = b.get(..HEADER_LEN).ok_or(truncated)?;
    if header[0] != 2 {
        return Err(ParseError::NotBootReply { op: header[0] });
    }
    let hlen = header[2];
    if hlen > 16 {
        return Err(ParseError::BadHlen { hlen });
    }
    if header[236..240] != MAGIC {
        return Err(ParseError::BadCookie);
    }
    let be32 = |at: usize| {
        u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    let mut chaddr = [0u8; 16];
    chaddr.copy_from_slice(&header[28..44]);

    let mut found = Found::default();
    let overload = scan_options(&b[HEADER_LEN..], &mut found)?;
    // Option 52: the server moved options into file (1), sname (2) or both.
    if overload & 1 != 0 {
        scan_options(&header[108..236], &mut found)?;
    }
    if overload & 2 != 0 {
        scan_options(&header[44..108], &mut found)?;
    }
    let kind = match found.msg_type.ok_or(ParseError::NoMessageType)? {
        2 => ReplyKind::Offer,
        5 => ReplyKind::Ack,
        6 => ReplyKind::Nak,
        other => ReplyKind::Other(other),
    };
    Ok(Reply {
        xid: be32(4),
        kind,
        yiaddr: Ipv4Addr::from(be32(16)),
        server_id: found.server_id,
        lease_secs: found.lease_secs,
        rapid_commit: found.rapid_commit,
        chaddr,
        hlen,
    })
}

#[derive(Default)]
struct Found {
    msg_type: Option<u8>,
    server_id: Option<Ipv4Addr>,
    lease_secs: Option<u32>,
    rapid_commit: bool,
}

/// Walks one TLV area; returns the option-overload value if present.
fn scan_options(area: &[u8], found: &mut Found) -> Result<u8, ParseError> {
    let mut overload = 0;
    let mut i = 0;
    while let Some(&code) = area.get(i) {
        match code {
            0 => {
                i += 1;
                continue;
            }
            255 => break,
            _ => {}
        }
        let len = usize::from(*area.get(i + 1).ok_or(ParseError::OptionOverrun { code })?);
        let data = area
            .get(i + 2..i + 2 + len)
            .ok_or(ParseError::OptionOverrun { code })?;
        match (code, data) {
            (53, [t]) => found.msg_type = Some(*t),
            (54, [a, b, c, d]) => found.server_id = Some(Ipv4Addr::new(*a, *b, *c, *d)),
            (51, [a, b, c, d]) => found.lease_secs = Some(u32::from_be_bytes([*a, *b, *c, *d])),
            (80, _) => found.rapid_commit = true,
            (52, [o]) => overload = *o,
            _ => {}
        }
        i += 2 + len;
    }
    Ok(overload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::{Decodable, Decoder};

    const MAC: Mac = [0x02, 0, 7, 0, 1, 2];

    fn relay_cfg() -> WireConfig {
        WireConfig {
            giaddr: Some(Ipv4Addr::new(127, 0, 0, 2)),
            broadcast: false,
            rapid_commit: false,
        }
    }

    fn decode(bytes: &[u8]) -> v4::Message {
        v4::Message::decode(&mut Decoder::new(bytes)).unwrap()
    }

    fn offer_bytes(kind: MessageType) -> Vec<u8> {
        let mut msg = v4::Message::default();
        msg.set_opcode(v4::Opcode::BootReply)
            .set_xid(0xdead_beef)
            .set_chaddr(&MAC)
            .set_yiaddr(Ipv4Addr::new(10, 99, 0, 10))
            .set_giaddr(Ipv4Addr::new(127, 0, 0, 2));
        let o = msg.opts_mut();
        o.insert(DhcpOption::MessageType(kind));
        o.insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(127, 0, 0, 1)));
        o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 0, 0)));
        o.insert(DhcpOption::AddressLeaseTime(3600));
        o.insert(DhcpOption::DomainName("example.test".into()));
        msg.to_vec().unwrap()
    }

    #[test]
    fn discover_decodes_with_relay_fields() {
        let bytes = build_discover(&MAC, 42, None, &relay_cfg()).unwrap();
        assert!(bytes.len() >= MIN_LEN);
        let msg = decode(&bytes);
        assert_eq!(msg.opcode(), v4::Opcode::BootRequest);
        assert_eq!(msg.xid(), 42);
        assert_eq!(msg.chaddr(), &MAC);
        assert_eq!(msg.giaddr(), Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(msg.hops(), 1);
        assert!(!msg.flags().broadcast());
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Discover));
        let mut cid = vec![1];
        cid.extend_from_slice(&MAC);
        assert_eq!(
            msg.opts().get(OptionCode::ClientIdentifier),
            Some(&DhcpOption::ClientIdentifier(cid))
        );
        let Some(DhcpOption::ParameterRequestList(prl)) =
            msg.opts().get(OptionCode::ParameterRequestList)
        else {
            panic!("no PRL");
        };
        let codes: Vec<u8> = prl.iter().map(|c| u8::from(*c)).collect();
        assert_eq!(codes, vec![1, 3, 6, 15, 26, 51, 54]);
        assert!(msg.opts().get(OptionCode::RapidCommit).is_none());
    }

    #[test]
    fn discover_direct_mode_and_rapid_commit() {
        let cfg = WireConfig {
            giaddr: None,
            broadcast: true,
            rapid_commit: true,
        };
        let msg = decode(&build_discover(&MAC, 7, None, &cfg).unwrap());
        assert_eq!(msg.giaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(msg.hops(), 0);
        assert!(msg.flags().broadcast());
        assert!(msg.opts().get(OptionCode::RapidCommit).is_some());
    }

    #[test]
    fn request_names_the_offer() {
        let sid = Ipv4Addr::new(127, 0, 0, 1);
        let ip = Ipv4Addr::new(10, 99, 0, 10);
        let msg = decode(&build_request(&MAC, 9, sid, ip, None, &relay_cfg()).unwrap());
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Request));
        assert_eq!(msg.xid(), 9);
        assert_eq!(msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
        assert_eq!(
            msg.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(sid))
        );
        assert_eq!(
            msg.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(ip))
        );
    }

    #[test]
    fn renew_names_the_lease_by_ciaddr_and_carries_the_hostname() {
        let ip = Ipv4Addr::new(10, 99, 0, 10);
        let cfg = WireConfig {
            broadcast: true,
            ..relay_cfg()
        };
        let msg = decode(&build_renew(&MAC, 9, ip, Some("vm-3-7"), &cfg).unwrap());
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Request));
        assert_eq!(msg.ciaddr(), ip);
        assert_eq!(msg.giaddr(), Ipv4Addr::new(127, 0, 0, 2));
        assert!(!msg.flags().broadcast());
        assert!(msg.opts().get(OptionCode::ServerIdentifier).is_none());
        assert!(msg.opts().get(OptionCode::RequestedIpAddress).is_none());
        assert_eq!(
            msg.opts().get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("vm-3-7".into()))
        );
    }

    #[test]
    fn release_uses_ciaddr() {
        let sid = Ipv4Addr::new(127, 0, 0, 1);
        let ip = Ipv4Addr::new(10, 99, 0, 10);
        let msg = decode(&build_release(&MAC, 9, ip, sid, &relay_cfg()).unwrap());
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Release));
        assert_eq!(msg.ciaddr(), ip);
        assert_eq!(
            msg.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(sid))
        );
    }

    #[test]
    fn parses_offer_ack_nak() {
        for (mt, kind) in [
            (MessageType::Offer, ReplyKind::Offer),
            (MessageType::Ack, ReplyKind::Ack),
            (MessageType::Nak, ReplyKind::Nak),
            (MessageType::Inform, ReplyKind::Other(8)),
        ] {
            let r = parse_reply(&offer_bytes(mt)).unwrap();
            assert_eq!(r.kind, kind);
            assert_eq!(r.xid, 0xdead_beef);
            assert_eq!(r.chaddr(), &MAC);
            assert_eq!(r.yiaddr, Ipv4Addr::new(10, 99, 0, 10));
            assert_eq!(r.server_id, Some(Ipv4Addr::new(127, 0, 0, 1)));
            assert_eq!(r.lease_secs, Some(3600));
            assert!(!r.rapid_commit);
        }
    }

    #[test]
    fn truncated_prefixes_never_panic() {
        let bytes = offer_bytes(MessageType::Offer);
        for n in 0..bytes.len() {
            let _ = parse_reply(&bytes[..n]);
        }
        assert!(matches!(
            parse_reply(&bytes[..100]),
            Err(ParseError::Truncated { len: 100 })
        ));
        // Cut inside the options: either an overrun or a missing type,
        // never an Ok with the wrong contents.
        assert!(parse_reply(&bytes[..HEADER_LEN]).is_err());
        assert!(parse_reply(&bytes[..HEADER_LEN + 2]).is_err());
    }

    #[test]
    fn rejects_bad_headers() {
        let good = offer_bytes(MessageType::Offer);
        let mut b = good.clone();
        b[0] = 1;
        assert_eq!(parse_reply(&b), Err(ParseError::NotBootReply { op: 1 }));
        let mut b = good.clone();
        b[2] = 200;
        assert_eq!(parse_reply(&b), Err(ParseError::BadHlen { hlen: 200 }));
        let mut b = good;
        b[236] = 0;
        assert_eq!(parse_reply(&b), Err(ParseError::BadCookie));
    }

    #[test]
    fn mutated_replies_never_panic() {
        let good = offer_bytes(MessageType::Ack);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..(next() % 8 + 1) {
                let at = (next() as usize) % b.len();
                b[at] = next() as u8;
            }
            b.truncate((next() as usize) % (good.len() + 1));
            let _ = parse_reply(&b);
        }
    }

    #[test]
    fn option_overload_is_followed() {
        let mut b = offer_bytes(MessageType::Offer);
        // Replace the options area with: overload=1 (file), end.
        b.truncate(HEADER_LEN);
        b.extend_from_slice(&[52, 1, 1, 255]);
        // Put the message type and rapid commit into the file field.
        b[108..113].copy_from_slice(&[53, 1, 5, 80, 0]);
        b[113] = 255;
        let r = parse_reply(&b).unwrap();
        assert_eq!(r.kind, ReplyKind::Ack);
        assert!(r.rapid_commit);
        assert_eq!(r.server_id, None);
    }

    #[test]
    fn macs_are_deterministic_and_disjoint() {
        assert_eq!(client_mac(0x0102_0304, 0xabcd), [0x02, 0xab, 0xcd, 2, 3, 4]);
        assert_ne!(client_mac(5, 0), client_mac(5, 1));
        assert_eq!(fmt_mac(&client_mac(1, 0)), "02:00:00:00:00:01");
    }
}
