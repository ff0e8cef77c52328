//! Building replies: which options go in, honouring the client's parameter
//! request list (option 55).

use std::net::Ipv4Addr;

use causeway_config::{Reservation, Subnet};
use dhcproto::v4::{DhcpOption, Flags, Message, MessageType, Opcode, OptionCode, UnknownOption};
use dhcproto::{Decodable, Decoder, Name};

/// Lease timers, in seconds.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    pub lease: u32,
    pub renew: u32,
    pub rebind: u32,
}

/// Options a reply always carries when they apply, requested or not.
const ALWAYS: &[OptionCode] = &[
    OptionCode::MessageType,
    OptionCode::ServerIdentifier,
    OptionCode::AddressLeaseTime,
    OptionCode::Renewal,
    OptionCode::Rebinding,
    OptionCode::SubnetMask,
    OptionCode::RapidCommit,
    OptionCode::RelayAgentInformation,
];

fn base(req: &Message, kind: MessageType, server_id: Ipv4Addr) -> Message {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_htype(req.htype())
        .set_xid(req.xid())
        .set_flags(req.flags())
        .set_giaddr(req.giaddr())
        .set_chaddr(req.chaddr());
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    m.opts_mut().insert(DhcpOption::ServerIdentifier(server_id));
    // RFC 3046: a relay's agent information comes back unchanged.
    if let Some(info) = req.opts().get(OptionCode::RelayAgentInformation) {
        m.opts_mut().insert(info.clone());
    }
    m
}

/// An OFFER or ACK. `yiaddr` is unspecified and `times` absent for an ACK
/// to INFORM.
pub fn build(
    req: &Message,
    subnet: &Subnet,
    reservation: Option<&Reservation>,
    kind: MessageType,
    yiaddr: Ipv4Addr,
    times: Option<Times>,
    rapid_commit: bool,
) -> Message {
    let mut m = base(req, kind, subnet.server_id);
    m.set_yiaddr(yiaddr);
    if kind == MessageType::Ack && times.is_none() {
        m.set_ciaddr(req.ciaddr());
    }
    let mut candidates: Vec<DhcpOption> = Vec::with_capacity(16);
    if let Some(t) = times {
        candidates.push(DhcpOption::AddressLeaseTime(t.lease));
        candidates.push(DhcpOption::Renewal(t.renew));
        candidates.push(DhcpOption::Rebinding(t.rebind));
    }
    if rapid_commit {
        candidates.push(DhcpOption::RapidCommit);
    }
    let o = &subnet.options;
    candidates.push(DhcpOption::SubnetMask(subnet.cidr.netmask()));
    candidates.push(DhcpOption::BroadcastAddr(subnet.cidr.broadcast()));
    if !o.router.is_empty() {
        candidates.push(DhcpOption::Router(o.router.clone()));
    }
    if !o.dns_servers.is_empty() {
        candidates.push(DhcpOption::DomainNameServer(o.dns_servers.clone()));
    }
    if let Some(domain) = &o.domain_name {
        candidates.push(DhcpOption::DomainName(domain.clone()));
    }
    if let Some(mtu) = o.mtu {
        candidates.push(DhcpOption::InterfaceMtu(mtu));
    }
    if !o.ntp_servers.is_empty() {
        candidates.push(DhcpOption::NtpServers(o.ntp_servers.clone()));
    }
    let search: Vec<Name> = o
        .domain_search
        .iter()
        .filter_map(|d| Name::from_ascii(d).ok())
        .collect();
    if !search.is_empty() {
        candidates.push(DhcpOption::DomainSearch(search));
    }
    if !o.classless_routes.is_empty() {
        candidates.push(DhcpOption::ClasslessStaticRoute(o.classless_routes.clone()));
    }
    if let Some(h) = reservation.and_then(|r| r.hostname.as_ref()) {
        candidates.push(DhcpOption::Hostname(h.clone()));
    }
    // Reservation options override the subnet's for the same code.
    let custom = o
        .custom
        .iter()
        .filter(|c| !reservation.is_some_and(|r| r.options.iter().any(|ro| ro.code == c.code)));
    for c in custom.chain(reservation.iter().flat_map(|r| r.options.iter())) {
        candidates.push(typed_option(c.code, &c.value));
    }

    let requested = match req.opts().get(OptionCode::ParameterRequestList) {
        Some(DhcpOption::ParameterRequestList(list)) => Some(list.as_slice()),
        _ => None,
    };
    for opt in candidates {
        let code = u8::from(OptionCode::from(&opt));
        let wanted = ALWAYS.iter().any(|a| u8::from(*a) == code)
            || requested.is_none_or(|list| list.iter().any(|r| u8::from(*r) == code));
        if wanted {
            m.opts_mut().insert(opt);
        }
    }
    m
}

/// A configured option as dhcproto's typed variant when it knows the code,
/// so the reply holds one entry per code whatever the source.
fn typed_option(code: u8, value: &[u8]) -> DhcpOption {
    let mut wire = Vec::with_capacity(value.len() + 2);
    wire.push(code);
    wire.push(value.len() as u8);
    wire.extend_from_slice(value);
    match DhcpOption::decode(&mut Decoder::new(&wire)) {
        Ok(DhcpOption::Unknown(_)) | Err(_) => {
            DhcpOption::Unknown(UnknownOption::new(OptionCode::from(code), value.to_vec()))
        }
        Ok(typed) => typed,
    }
}

pub fn nak(req: &Message, server_id: Ipv4Addr) -> Message {
    let mut m = base(req, MessageType::Nak, server_id);
    if !req.giaddr().is_unspecified() {
        // RFC 2131 §4.3.2: a relay must broadcast a NAK to the client.
        m.set_flags(Flags::default().set_broadcast());
    }
    m
}
