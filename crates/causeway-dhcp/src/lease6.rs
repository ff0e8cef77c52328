//! Stateful DHCPv6 without I/O (RFC 8415 section 18.3): addresses (IA_NA)
//! leased from the configured pools or reservations, by Solicit/Advertise/
//! Request/Reply (or Rapid Commit), kept by Renew and Rebind, given back by
//! Release and Decline, and checked by Confirm.
//!
//! A lease change is a [`LeaseRecord`] whose address is v6 and whose client
//! is the IAID followed by the DUID, so it goes to the same log, through the
//! same group commit and the same HA stream as a v4 lease. Like the v4
//! engine, this one returns the reply and the records; the server sends the
//! reply only once the records are durable.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

use causeway_config::{Dhcp6Config, Stateful6};
use dhcproto::v6::{
    DhcpOption, DhcpOptions, IAAddr, Message, MessageType, OptionCode, Status, StatusCode, IANA,
};

use crate::client::hex;
use crate::lease::{LeaseRecord, LeaseState};
use crate::merge::Share;
use crate::v6::{encode, requested, Ignored6, Relayed, Stateless};

/// The most addresses one allocation looks at before giving up: a pool
/// of many millions is never scanned whole under the engine's lock. A
/// pool this small is searched entirely, so "exhausted" is then exact.
const MAX_PROBES: u128 = 65_536;

/// One address's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease6 {
    /// The IAID (4 bytes) followed by the client's DUID.
    pub binding: Box<[u8]>,
    pub hw: Option<[u8; 6]>,
    pub state: LeaseState,
    /// Unix seconds: the end of the valid lifetime.
    pub expires: u64,
    pub hostname: Option<Box<str>>,
}

impl Lease6 {
    fn holds(&self, now: u64) -> bool {
        match self.state {
            LeaseState::Offered | LeaseState::Active | LeaseState::Declined => self.expires > now,
            LeaseState::Released => false,
        }
    }

    fn record(&self, ip: Ipv6Addr) -> LeaseRecord {
        LeaseRecord {
            ip: IpAddr::V6(ip),
            client: hex(&self.binding),
            hw: self.hw.map(|m| hex(&m)).unwrap_or_default(),
            state: self.state,
            expires: self.expires,
            hostname: self.hostname.as_deref().map(str::to_string),
            term: 0,
        }
    }

    fn from_record(r: &LeaseRecord) -> Option<(Ipv6Addr, Lease6)> {
        let IpAddr::V6(ip) = r.ip else { return None };
        let binding = causeway_config::parse_hex(&r.client)?;
        if binding.len() < 5 {
            return None;
        }
        Some((
            ip,
            Lease6 {
                binding: binding.into(),
                hw: causeway_config::parse_mac(&r.hw),
                state: r.state,
                expires: r.expires,
                hostname: r.hostname.as_deref().map(Into::into),
            },
        ))
    }
}

/// What the server does with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome6 {
    /// The client's message to send (before the relays' wrappers).
    pub reply: Vec<u8>,
    /// What the reply answered, for the metrics.
    pub kind: MessageType,
    /// Lease changes that must be durable before the reply is sent.
    pub commit: Vec<LeaseRecord>,
}

/// An address change on its way to the store, and the lease it replaced.
struct Unsettled6 {
    durable: Option<Lease6>,
    /// The newest change handed to the store for the address.
    latest: Lease6,
    in_flight: u32,
}

/// Lease counts by state, for the pool gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats6 {
    pub size: u128,
    pub active: u64,
    pub declined: u64,
}

/// The stateful DHCPv6 engine.
pub struct Leases6 {
    cfg: Stateful6,
    answers: Stateless,
    leases: HashMap<Ipv6Addr, Lease6>,
    /// Each binding's newest address.
    by_binding: HashMap<Box<[u8]>, Ipv6Addr>,
    reserved: HashMap<Ipv6Addr, usize>,
    by_duid: HashMap<Vec<u8>, usize>,
    by_mac: HashMap<[u8; 6], usize>,
    pool_size: u128,
    cursor: u128,
    unsettled: HashMap<Ipv6Addr, Unsettled6>,
    /// Which address each name was last written with (checked against
    /// the lease there before use): at most one entry per lease.
    names: HashMap<Box<str>, Ipv6Addr>,
}

/// The link-layer address in a DUID-LLT (type 1) or DUID-LL (type 3) of
/// an Ethernet interface (hardware type 1).
pub fn duid_mac(duid: &[u8]) -> Option<[u8; 6]> {
    let mac = match duid {
        [0, 1, 0, 1, _, _, _, _, mac @ ..] | [0, 3, 0, 1, mac @ ..] => mac,
        _ => return None,
    };
    <[u8; 6]>::try_from(mac).ok()
}

fn secs(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX - 1)
}

/// Who is asking, as the engine needs it.
struct Asker<'a> {
    duid: &'a [u8],
    hw: Option<[u8; 6]>,
}

impl Leases6 {
    /// `None` when the config leases no addresses.
    pub fn new(cfg: &Dhcp6Config, server_duid: Vec<u8>) -> Option<Leases6> {
        let stateful = cfg.stateful.clone()?;
        let mut l = Leases6 {
            answers: Stateless::new(cfg, server_duid),
            pool_size: 0,
            cfg: stateful,
            leases: HashMap::new(),
            by_binding: HashMap::new(),
            reserved: HashMap::new(),
            by_duid: HashMap::new(),
            by_mac: HashMap::new(),
            cursor: 0,
            unsettled: HashMap::new(),
            names: HashMap::new(),
        };
        l.index_config();
        Some(l)
    }

    fn index_config(&mut self) {
        self.reserved.clear();
        self.by_duid.clear();
        self.by_mac.clear();
        for (i, r) in self.cfg.reservations.iter().enumerate() {
            self.reserved.insert(r.ip, i);
            if let Some(d) = &r.duid {
                self.by_duid.insert(d.clone(), i);
            }
            if let Some(m) = r.mac {
                self.by_mac.insert(m, i);
            }
        }
        self.pool_size = self
            .cfg
            .pools
            .iter()
            .map(|p| u128::from(p.end) - u128::from(p.start) + 1)
            .sum();
        if self.pool_size > 0 {
            self.cursor %= self.pool_size;
        }
    }

    /// Takes a new config; leases are kept. `None` when it leases nothing.
    pub fn reconfigure(&mut self, cfg: &Dhcp6Config, server_duid: Vec<u8>) -> bool {
        let Some(stateful) = cfg.stateful.clone() else {
            return false;
        };
        self.cfg = stateful;
        self.answers = Stateless::new(cfg, server_duid);
        self.index_config();
        true
    }

    pub fn server_duid(&self) -> &[u8] {
        self.answers.duid()
    }

    /// Loads the v6 records recovered from the store, in the order they
    /// were written (v4 records are passed over). Returns how many v6
    /// records could not be read.
    pub fn restore<'a>(&mut self, records: impl IntoIterator<Item = &'a LeaseRecord>) -> usize {
        let mut skipped = 0;
        for r in records.into_iter().filter(|r| r.ip.is_ipv6()) {
            match Lease6::from_record(r) {
                Some((ip, lease)) => self.take(ip, lease),
                None => skipped += 1,
            }
        }
        // A binding that moved left its old lease active on disk; only its
        // newest address is its own.
        for (ip, l) in self.leases.iter_mut() {
            if l.state == LeaseState::Active && self.by_binding.get(&l.binding) != Some(ip) {
                l.state = LeaseState::Released;
            }
        }
        skipped
    }

    /// Records adopted from a rejoining standby's log (already durable here).
    pub fn adopt(&mut self, records: &[LeaseRecord]) {
        for r in records {
            if let Some((ip, lease)) = Lease6::from_record(r) {
                self.take(ip, lease);
            }
        }
    }

    /// A lease takes its address: the binding it displaces loses it.
    fn take(&mut self, ip: Ipv6Addr, lease: Lease6) {
        if let Some(old) = self.leases.get(&ip) {
            if old.binding != lease.binding && self.by_binding.get(&old.binding) == Some(&ip) {
                self.by_binding.remove(&old.binding);
            }
            if let Some(name) = &old.hostname {
                if self.names.get(name) == Some(&ip) && old.hostname != lease.hostname {
                    self.names.remove(name);
                }
            }
        }
        if let Some(name) = &lease.hostname {
            self.names.insert(name.clone(), ip);
        }
        if lease.state == LeaseState::Declined {
            if self.by_binding.get(&lease.binding) == Some(&ip) {
                self.by_binding.remove(&lease.binding);
            }
        } else {
            self.by_binding.insert(lease.binding.clone(), ip);
        }
        self.leases.insert(ip, lease);
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Every lease as its record, in address order.
    pub fn records(&self) -> Vec<LeaseRecord> {
        let mut out: Vec<LeaseRecord> = self.leases.iter().map(|(ip, l)| l.record(*ip)).collect();
        out.sort_unstable_by_key(|r| r.ip);
        out
    }

    pub fn stats(&self, now: u64) -> Stats6 {
        let mut s = Stats6 {
            size: self.pool_size + self.reserved.len() as u128,
            ..Stats6::default()
        };
        for l in self.leases.values().filter(|l| l.holds(now)) {
            match l.state {
                LeaseState::Active => s.active += 1,
                LeaseState::Declined => s.declined += 1,
                _ => {}
            }
        }
        s
    }

    fn in_pool(&self, ip: Ipv6Addr) -> bool {
        let n = u128::from(ip);
        self.cfg
            .pools
            .iter()
            .any(|p| (u128::from(p.start)..=u128::from(p.end)).contains(&n))
    }

    fn pool_address(&self, mut offset: u128) -> Option<Ipv6Addr> {
        for p in &self.cfg.pools {
            let size = u128::from(p.end) - u128::from(p.start) + 1;
            if offset < size {
                return Some(Ipv6Addr::from(u128::from(p.start) + offset));
            }
            offset -= size;
        }
        None
    }

    fn reservation_of(&self, who: &Asker) -> Option<usize> {
        self.by_duid
            .get(who.duid)
            .or_else(|| who.hw.and_then(|m| self.by_mac.get(&m)))
            .copied()
    }

    /// Whether `binding` may hold `ip` now.
    fn available_to(&self, now: u64, ip: Ipv6Addr, binding: &[u8], who: &Asker) -> bool {
        match self.reserved.get(&ip) {
            Some(&r) if Some(r) != self.reservation_of(who) => return false,
            Some(&r) => {
                // The reserved machine may come back with a new DUID (a
                // DUID-LLT's time changes with a reinstall): a lease its
                // old DUID holds is its own, not another client's. Under
                // the same DUID another IA is another use at the same
                // time, and does not share the address.
                let res = &self.cfg.reservations[r];
                let same_machine = |l: &Lease6| {
                    l.binding.get(4..) != Some(who.duid)
                        && ((res.mac.is_some() && l.hw == res.mac)
                            || res
                                .duid
                                .as_deref()
                                .is_some_and(|d| l.binding.get(4..) == Some(d)))
                };
                if let Some(l) = self.leases.get(&ip) {
                    if l.state != LeaseState::Declined && same_machine(l) {
                        return true;
                    }
                }
            }
            None if !self.in_pool(ip) => return false,
            None => {}
        }
        match self.leases.get(&ip) {
            None => true,
            Some(l) if l.state == LeaseState::Declined => !l.holds(now),
            Some(l) => &*l.binding == binding || !l.holds(now),
        }
    }

    fn choose(
        &mut self,
        now: u64,
        binding: &[u8],
        who: &Asker,
        hints: &[Ipv6Addr],
        share: Option<Share>,
    ) -> Option<Ipv6Addr> {
        if let Some(r) = self.reservation_of(who) {
            let ip = self.cfg.reservations[r].ip;
            // A reserved client gets its reserved address or nothing new:
            // a pool address would hide that the reservation is taken.
            return self.available_to(now, ip, binding, who).then_some(ip);
        }
        if let Some(&ip) = self.by_binding.get(binding) {
            if self.available_to(now, ip, binding, who) {
                return Some(ip);
            }
        }
        let mine = |ip: Ipv6Addr| share.is_none_or(|s| s.holds(ip));
        for &ip in hints {
            if self.in_pool(ip) && mine(ip) && self.available_to(now, ip, binding, who) {
                return Some(ip);
            }
        }
        let probes = self.pool_size.min(MAX_PROBES);
        for _ in 0..probes {
            let offset = self.cursor;
            self.cursor = (self.cursor + 1) % self.pool_size;
            let Some(ip) = self.pool_address(offset) else {
                continue;
            };
            if !self.reserved.contains_key(&ip)
                && mine(ip)
                && self.available_to(now, ip, binding, who)
            {
                return Some(ip);
            }
        }
        None
    }

    /// The name the lease at `ip` is registered under: the reservation's,
    /// else the first label of the client's FQDN option (RFC 4704) when
    /// no other client's lease or reservation holds it. A request without
    /// the option carries no name, as a v4 renewal without option 12.
    fn hostname_for(&self, now: u64, msg: &Message, who: &Asker, ip: Ipv6Addr) -> Option<Box<str>> {
        let reservation = self.reservation_of(who);
        if let Some(name) = reservation.and_then(|r| self.cfg.reservations[r].hostname.as_deref()) {
            return Some(name.into());
        }
        let wanted = client_fqdn(msg)?;
        let reserved_for_another =
            self.cfg.reservations.iter().enumerate().any(|(i, r)| {
                Some(i) != reservation && r.hostname.as_deref() == Some(wanted.as_str())
            });
        let held_by_another = self.names.get(wanted.as_str()).is_some_and(|&other| {
            other != ip
                && self.leases.get(&other).is_some_and(|l| {
                    l.holds(now)
                        && l.hostname.as_deref() == Some(wanted.as_str())
                        && l.binding.get(4..) != Some(who.duid)
                })
        });
        (!reserved_for_another && !held_by_another).then(|| wanted.into())
    }

    fn set(&mut self, ip: Ipv6Addr, lease: Lease6, commit: &mut Vec<LeaseRecord>) {
        let record = lease.record(ip);
        match self.unsettled.get_mut(&ip) {
            Some(entry) => {
                entry.in_flight += 1;
                entry.latest = lease.clone();
            }
            None => {
                let before = self.leases.get(&ip).cloned();
                self.unsettled.insert(
                    ip,
                    Unsettled6 {
                        durable: before,
                        latest: lease.clone(),
                        in_flight: 1,
                    },
                );
            }
        }
        self.take(ip, lease);
        commit.push(record);
    }

    /// Told by the store whether `record` became durable; a change that
    /// never reached the disk is undone once nothing else for its address
    /// is in flight. Returns whether a change was undone.
    pub fn settle(&mut self, record: &LeaseRecord, durable: bool) -> bool {
        let IpAddr::V6(ip) = record.ip else {
            return false;
        };
        let Some(entry) = self.unsettled.get_mut(&ip) else {
            return false;
        };
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if entry.in_flight > 0 {
            if durable {
                entry.durable = Lease6::from_record(record).map(|(_, l)| l);
            }
            return false;
        }
        let Some(entry) = self.unsettled.remove(&ip) else {
            return false;
        };
        // The last change is the one settling; whether the engine still
        // holds it, or has moved on in memory (an offer), decides the undo.
        let unchanged = self.leases.get(&ip) == Some(&entry.latest);
        if durable || !unchanged {
            return false;
        }
        match entry.durable {
            Some(lease) => self.take(ip, lease),
            None => {
                if let Some(l) = self.leases.remove(&ip) {
                    if self.by_binding.get(&l.binding) == Some(&ip) {
                        self.by_binding.remove(&l.binding);
                    }
                }
            }
        }
        true
    }

    fn times(&self) -> (u32, u32, u32, u32) {
        let preferred = secs(self.cfg.preferred_lifetime);
        let valid = secs(self.cfg.valid_lifetime);
        // RFC 8415 section 21.4's recommendation: 0.5 and 0.8 of the
        // shortest preferred lifetime.
        (preferred / 2, preferred / 5 * 4, preferred, valid)
    }

    fn ia(&self, id: u32, addrs: &[(Ipv6Addr, bool)], status: Option<(Status, &str)>) -> IANA {
        let (t1, t2, preferred, valid) = self.times();
        let mut opts = DhcpOptions::new();
        for &(addr, keep) in addrs {
            // An address the client may no longer use goes back with
            // lifetimes 0 (RFC 8415 section 18.3.4).
            let (p, v) = if keep { (preferred, valid) } else { (0, 0) };
            opts.insert(DhcpOption::IAAddr(IAAddr {
                addr,
                preferred_life: p,
                valid_life: v,
                opts: DhcpOptions::new(),
            }));
        }
        if let Some((status, msg)) = status {
            opts.insert(DhcpOption::StatusCode(StatusCode {
                status,
                msg: msg.to_string(),
            }));
        }
        let any_kept = addrs.iter().any(|a| a.1);
        IANA {
            id,
            t1: if any_kept { t1 } else { 0 },
            t2: if any_kept { t2 } else { 0 },
            opts,
        }
    }

    /// The reply to a client's message. `msg` was decoded by
    /// [`crate::v6::decode_client`]; `relayed` says how it came.
    pub fn handle(
        &mut self,
        now: u64,
        relayed: &Relayed,
        msg: &Message,
        share: Option<Share>,
    ) -> Result<Outcome6, Ignored6> {
        let opts = msg.opts();
        let kind = msg.msg_type();
        if kind == MessageType::InformationRequest {
            return Ok(Outcome6 {
                reply: self.answers.information_reply(msg)?,
                kind: MessageType::Reply,
                commit: Vec::new(),
            });
        }
        let Some(DhcpOption::ClientId(duid)) = opts.get(OptionCode::ClientId) else {
            return Err(Ignored6::NoClientId);
        };
        let server_id = match opts.get(OptionCode::ServerId) {
            Some(DhcpOption::ServerId(id)) => Some(id.as_slice()),
            _ => None,
        };
        // RFC 8415 section 16: which messages must, and which must not,
        // name a server.
        match kind {
            MessageType::Solicit | MessageType::Rebind | MessageType::Confirm => {
                if server_id.is_some() {
                    return Err(Ignored6::ServerIdNotAllowed);
                }
            }
            MessageType::Request
            | MessageType::Renew
            | MessageType::Release
            | MessageType::Decline => {
                if server_id != Some(self.server_duid()) {
                    return Err(Ignored6::OtherServer);
                }
            }
            _ => return Err(Ignored6::NotServed),
        }
        // RFC 8415 section 13.1: the relay's link address names the
        // client's link; one outside the prefix is a link this server
        // has no addresses for (unspecified: the relay left it to the
        // Interface-Id, and the one prefix is the answer).
        if let Some(link) = relayed.link_address {
            let on_link = link.is_unspecified()
                || link.segments()[0] & 0xffc0 == 0xfe80
                || self.cfg.prefix.contains(&link);
            if !on_link && kind != MessageType::Confirm {
                return Err(Ignored6::OtherLink);
            }
        }
        let who = Asker {
            duid,
            hw: relayed.client_link_layer.or_else(|| duid_mac(duid)),
        };
        let ias: Vec<&IANA> = opts
            .get_all(OptionCode::IANA)
            .unwrap_or_default()
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IANA(ia) => Some(ia),
                _ => None,
            })
            .collect();
        let rapid = kind == MessageType::Solicit
            && self.cfg.rapid_commit
            && opts.get(OptionCode::RapidCommit).is_some();
        let reply_kind = match kind {
            MessageType::Solicit if !rapid => MessageType::Advertise,
            _ => MessageType::Reply,
        };
        let mut reply = Message::new_with_id(reply_kind, msg.xid());
        let mut commit = Vec::new();
        let mut out = DhcpOptions::new();
        out.insert(DhcpOption::ServerId(self.server_duid().to_vec()));
        out.insert(DhcpOption::ClientId(duid.clone()));
        match kind {
            MessageType::Solicit | MessageType::Request => {
                let bind = kind == MessageType::Request || rapid;
                let mut any = false;
                let mut answered = Vec::with_capacity(ias.len());
                for ia in &ias {
                    let binding = binding_key(ia.id, duid);
                    let hints = addresses_of(ia);
                    match self.choose(now, &binding, &who, &hints, share) {
                        Some(ip) => {
                            any = true;
                            // An Advertise holds nothing: the address is
                            // chosen again (the client's hint first) when
                            // the Request comes, so Solicits that are never
                            // followed up cost no memory, however many
                            // DUIDs they come from.
                            if bind {
                                let hostname = self.hostname_for(now, msg, &who, ip);
                                let lease = Lease6 {
                                    binding: binding.clone(),
                                    hw: who.hw,
                                    state: LeaseState::Active,
                                    expires: now + u64::from(self.times().3),
                                    hostname,
                                };
                                self.set(ip, lease, &mut commit);
                            }
                            answered.push(self.ia(ia.id, &[(ip, true)], None));
                        }
                        None => answered.push(self.ia(
                            ia.id,
                            &[],
                            Some((Status::NoAddrsAvail, "no address available")),
                        )),
                    }
                }
                if !any && kind == MessageType::Solicit {
                    // RFC 8415 section 18.3.9: an Advertise with no IA and
                    // the status alone, so the client tries other servers.
                    out.insert(DhcpOption::StatusCode(StatusCode {
                        status: Status::NoAddrsAvail,
                        msg: "no address available".into(),
                    }));
                } else {
                    for ia in answered {
                        out.insert(DhcpOption::IANA(ia));
                    }
                }
                if rapid {
                    out.insert(DhcpOption::RapidCommit);
                }
            }
            MessageType::Renew | MessageType::Rebind => {
                for ia in &ias {
                    let binding = binding_key(ia.id, duid);
                    let listed = addresses_of(ia);
                    let current = self.by_binding.get(&binding).copied().filter(|ip| {
                        self.leases
                            .get(ip)
                            .is_some_and(|l| l.state != LeaseState::Declined)
                            && self.available_to(now, *ip, &binding, &who)
                    });
                    // A client whose binding this server lost (or never
                    // had) keeps a listed address that is still free here.
                    let kept = current.or_else(|| {
                        listed
                            .iter()
                            .copied()
                            .find(|ip| self.available_to(now, *ip, &binding, &who))
                    });
                    let mut addrs: Vec<(Ipv6Addr, bool)> = listed
                        .iter()
                        .filter(|ip| Some(**ip) != kept)
                        .map(|ip| (*ip, false))
                        .collect();
                    match kept {
                        Some(ip) => {
                            let hostname = self.hostname_for(now, msg, &who, ip);
                            self.set(
                                ip,
                                Lease6 {
                                    binding: binding.clone(),
                                    hw: who.hw,
                                    state: LeaseState::Active,
                                    expires: now + u64::from(self.times().3),
                                    hostname,
                                },
                                &mut commit,
                            );
                            addrs.push((ip, true));
                            out.insert(DhcpOption::IANA(self.ia(ia.id, &addrs, None)));
                        }
                        None if kind == MessageType::Rebind && !addrs.is_empty() => {
                            // Addresses not for this link, or taken: the
                            // client is told to stop using them.
                            out.insert(DhcpOption::IANA(self.ia(ia.id, &addrs, None)));
                        }
                        None => out.insert(DhcpOption::IANA(self.ia(
                            ia.id,
                            &[],
                            Some((Status::NoBinding, "no binding for this IA")),
                        ))),
                    }
                }
            }
            MessageType::Release | MessageType::Decline => {
                let declined = kind == MessageType::Decline;
                for ia in &ias {
                    let binding = binding_key(ia.id, duid);
                    let mut missing = false;
                    for ip in addresses_of(ia) {
                        let Some(l) = self.leases.get(&ip).filter(|l| l.binding == binding) else {
                            missing = true;
                            continue;
                        };
                        let mut lease = l.clone();
                        if declined {
                            // Quarantined for a valid lifetime: someone
                            // else on the link uses it.
                            lease.state = LeaseState::Declined;
                            lease.expires = now + u64::from(self.times().3);
                        } else {
                            lease.state = LeaseState::Released;
                        }
                        self.set(ip, lease, &mut commit);
                    }
                    if missing {
                        out.insert(DhcpOption::IANA(self.ia(
                            ia.id,
                            &[],
                            Some((Status::NoBinding, "no binding for this address")),
                        )));
                    }
                }
                out.insert(DhcpOption::StatusCode(StatusCode {
                    status: Status::Success,
                    msg: String::new(),
                }));
            }
            MessageType::Confirm => {
                let all: Vec<Ipv6Addr> = ias.iter().flat_map(|ia| addresses_of(ia)).collect();
                if all.is_empty() {
                    // RFC 8415 section 18.3.3: nothing to confirm, no reply.
                    return Err(Ignored6::NothingToConfirm);
                }
                let on_link = all.iter().all(|ip| self.cfg.prefix.contains(ip));
                out.insert(DhcpOption::StatusCode(if on_link {
                    StatusCode {
                        status: Status::Success,
                        msg: String::new(),
                    }
                } else {
                    StatusCode {
                        status: Status::NotOnLink,
                        msg: "not on this link".into(),
                    }
                }));
            }
            _ => return Err(Ignored6::NotServed),
        }
        let wanted = |code: OptionCode| requested(msg, code);
        self.answers.add_configuration(msg, &mut out, &wanted);
        *reply.opts_mut() = out;
        Ok(Outcome6 {
            reply: encode(&reply)?,
            kind: reply_kind,
            commit,
        })
    }
}

/// The host name in a Client FQDN option (RFC 4704 section 4: a flags
/// byte, then a name in DNS wire format, whole or partial): its first
/// label, when it is a valid host name.
fn client_fqdn(msg: &Message) -> Option<String> {
    let Some(DhcpOption::Unknown(opt)) = msg.opts().get(OptionCode::ClientFqdn) else {
        return None;
    };
    let data = opt.data();
    let len = usize::from(*data.get(1)?);
    let label = data.get(2..2 + len)?;
    crate::engine::sanitize_hostname(std::str::from_utf8(label).ok()?)
}

fn binding_key(iaid: u32, duid: &[u8]) -> Box<[u8]> {
    let mut key = Vec::with_capacity(4 + duid.len());
    key.extend_from_slice(&iaid.to_be_bytes());
    key.extend_from_slice(duid);
    key.into()
}

fn addresses_of(ia: &IANA) -> Vec<Ipv6Addr> {
    ia.opts
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IAAddr(a) => Some(a.addr),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v6::{decode_client, unwrap_relays};
    use causeway_config::Config;
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};

    const NOW: u64 = 1_000_000;
    const SERVER: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn engine(extra: &str) -> Leases6 {
        let cfg = Config::from_yaml(&format!(
            "network: {{interface: net1, cidr: 10.0.0.0/24, gateway: 10.0.0.1, address: 10.0.0.2}}\ndhcp: {{}}\n\
             dhcp6:\n  interface: net1\n  dnsServers: ['fd42:10::53']\n  prefix: fd42:10::/64\n  preferredLifetime: 1h\n{extra}"
        ))
        .unwrap()
        .dhcp6
        .unwrap();
        Leases6::new(&cfg, crate::v6::duid_ll(SERVER)).unwrap()
    }

    fn pool(start: &str, end: &str) -> String {
        format!("  pools: [{{start: '{start}', end: '{end}'}}]\n")
    }

    fn duid_llt(mac: [u8; 6], time: u32) -> Vec<u8> {
        let mut d = vec![0, 1, 0, 1];
        d.extend_from_slice(&time.to_be_bytes());
        d.extend_from_slice(&mac);
        d
    }

    fn message(
        kind: MessageType,
        duid: &[u8],
        server: bool,
        ias: &[(u32, &[Ipv6Addr])],
    ) -> Vec<u8> {
        let mut m = Message::new_with_id(kind, [7, 7, 7]);
        m.opts_mut().insert(DhcpOption::ClientId(duid.to_vec()));
        if server {
            m.opts_mut()
                .insert(DhcpOption::ServerId(crate::v6::duid_ll(SERVER)));
        }
        for (id, addrs) in ias {
            let mut opts = DhcpOptions::new();
            for a in *addrs {
                opts.insert(DhcpOption::IAAddr(IAAddr {
                    addr: *a,
                    preferred_life: 0,
                    valid_life: 0,
                    opts: DhcpOptions::new(),
                }));
            }
            m.opts_mut().insert(DhcpOption::IANA(IANA {
                id: *id,
                t1: 0,
                t2: 0,
                opts,
            }));
        }
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        buf
    }

    fn send(
        e: &mut Leases6,
        now: u64,
        bytes: &[u8],
    ) -> Result<(Message, Vec<LeaseRecord>), Ignored6> {
        let relayed = unwrap_relays(bytes)?;
        let msg = decode_client(relayed.client)?;
        let out = e.handle(now, &relayed, &msg, None)?;
        for r in &out.commit {
            e.settle(r, true);
        }
        Ok((
            Message::decode(&mut Decoder::new(&out.reply)).unwrap(),
            out.commit,
        ))
    }

    /// The addresses (with valid lifetime) of each IA_NA in a reply.
    fn leased(m: &Message) -> Vec<(Ipv6Addr, u32)> {
        m.opts()
            .get_all(OptionCode::IANA)
            .unwrap_or_default()
            .iter()
            .flat_map(|o| match o {
                DhcpOption::IANA(ia) => ia
                    .opts
                    .iter()
                    .filter_map(|o| match o {
                        DhcpOption::IAAddr(a) => Some((a.addr, a.valid_life)),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn status(m: &Message) -> Option<Status> {
        match m.opts().get(OptionCode::StatusCode) {
            Some(DhcpOption::StatusCode(s)) => Some(s.status),
            _ => None,
        }
    }

    fn ia_status(m: &Message) -> Vec<Status> {
        m.opts()
            .get_all(OptionCode::IANA)
            .unwrap_or_default()
            .iter()
            .filter_map(|o| match o {
                DhcpOption::IANA(ia) => match ia.opts.get(OptionCode::StatusCode) {
                    Some(DhcpOption::StatusCode(s)) => Some(s.status),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    fn a(t: &str) -> Ipv6Addr {
        t.parse().unwrap()
    }

    #[test]
    fn solicit_advertises_without_writing_and_request_binds_what_was_advertised() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (adv, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Solicit, &duid, false, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(adv.msg_type(), MessageType::Advertise);
        assert!(written.is_empty(), "an Advertise is not a lease");
        let offered = leased(&adv);
        assert_eq!(offered.len(), 1);
        assert_eq!(
            offered[0].1, 7200,
            "valid lifetime defaults to twice the preferred"
        );
        let (reply, written) = send(
            &mut e,
            NOW + 1,
            &message(MessageType::Request, &duid, true, &[(1, &[offered[0].0])]),
        )
        .unwrap();
        assert_eq!(reply.msg_type(), MessageType::Reply);
        assert_eq!(leased(&reply), offered);
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].ip, IpAddr::V6(offered[0].0));
        assert_eq!(written[0].state, LeaseState::Active);
        assert_eq!(written[0].expires, NOW + 1 + 7200);
        assert_eq!(
            written[0].hw, "02:00:00:00:00:09",
            "the MAC of the DUID-LLT"
        );
        assert!(written[0].client.ends_with(&hex(&duid)[2..]));
        // DNS goes with the lease.
        assert!(reply.opts().get(OptionCode::DomainNameServers).is_some());
        // Another client is given another address.
        let (other, _) = send(
            &mut e,
            NOW + 2,
            &message(
                MessageType::Solicit,
                &duid_llt([2, 0, 0, 0, 0, 8], 1),
                false,
                &[(1, &[])],
            ),
        )
        .unwrap();
        assert_ne!(leased(&other)[0].0, offered[0].0);
    }

    /// Hostile: Solicits from ever new DUIDs, never followed by a Request,
    /// leave nothing behind, however large the pool: an Advertise holds
    /// no state.
    #[test]
    fn a_solicit_flood_from_fresh_duids_leaves_no_entry_behind() {
        let mut e = engine(&pool("fd42:10::1:0:0", "fd42:10::1:ffff:ffff"));
        for i in 0..50_000u32 {
            let b = i.to_be_bytes();
            let duid = duid_llt([2, 9, b[0], b[1], b[2], b[3]], 1);
            let (adv, _) = send(
                &mut e,
                NOW,
                &message(MessageType::Solicit, &duid, false, &[(1, &[])]),
            )
            .unwrap();
            assert_eq!(leased(&adv).len(), 1);
        }
        assert_eq!(e.lease_count(), 0, "entries left by unanswered Advertises");
        assert_eq!(e.by_binding.len(), 0);
    }

    /// A request looks at no more than 65,536 addresses: a pool whose
    /// first 65,536 are leased answers NoAddrsAvail once, and the next
    /// request, the cursor moved on, finds the free ones beyond.
    #[test]
    fn a_request_looks_at_a_bounded_window_and_the_next_goes_on_from_it() {
        let mut e = engine(&pool("fd42:10::1:0", "fd42:10::2:ffff"));
        let taken: Vec<LeaseRecord> = (0..65_536u128)
            .map(|i| LeaseRecord {
                ip: IpAddr::V6(Ipv6Addr::from(u128::from(a("fd42:10::1:0")) + i)),
                client: hex(&binding_key(
                    1,
                    &duid_llt([2, 8, 0, 0, (i >> 8) as u8, i as u8], 1),
                )),
                hw: String::new(),
                state: LeaseState::Active,
                expires: NOW + 3600,
                hostname: None,
                term: 0,
            })
            .collect();
        assert_eq!(e.restore(&taken), 0);
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (first, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(ia_status(&first), vec![Status::NoAddrsAvail]);
        let (second, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(leased(&second)[0].0, a("fd42:10::2:0"));
    }

    /// A reload keeps every lease, even one whose pool it removes.
    #[test]
    fn a_reload_keeps_the_leases() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        let before = e.records();
        let cfg = Config::from_yaml(
            "network: {interface: net1, cidr: 10.0.0.0/24, gateway: 10.0.0.1, address: 10.0.0.2}\ndhcp: {}\n\
             dhcp6:\n  interface: net1\n  prefix: fd42:10::/64\n  pools: [{start: 'fd42:10::200', end: 'fd42:10::2ff'}]\n",
        )
        .unwrap()
        .dhcp6
        .unwrap();
        assert!(e.reconfigure(&cfg, crate::v6::duid_ll(SERVER)));
        assert_eq!(e.records(), before);
    }

    #[test]
    fn rapid_commit_binds_at_once_only_when_configured() {
        let mut off = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let mut solicit = Message::new_with_id(MessageType::Solicit, [1, 1, 1]);
        solicit
            .opts_mut()
            .insert(DhcpOption::ClientId(duid_llt([2, 0, 0, 0, 0, 9], 1)));
        solicit.opts_mut().insert(DhcpOption::RapidCommit);
        solicit.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 5,
            t1: 0,
            t2: 0,
            opts: DhcpOptions::new(),
        }));
        let mut bytes = Vec::new();
        solicit.encode(&mut Encoder::new(&mut bytes)).unwrap();
        let (adv, written) = send(&mut off, NOW, &bytes).unwrap();
        assert_eq!(adv.msg_type(), MessageType::Advertise);
        assert!(written.is_empty());
        let mut on = engine(&format!(
            "{}  rapidCommit: true\n",
            pool("fd42:10::100", "fd42:10::1ff")
        ));
        let (reply, written) = send(&mut on, NOW, &bytes).unwrap();
        assert_eq!(reply.msg_type(), MessageType::Reply);
        assert!(reply.opts().get(OptionCode::RapidCommit).is_some());
        assert_eq!(written.len(), 1);
        assert_eq!(written[0].state, LeaseState::Active);
    }

    #[test]
    fn renew_extends_release_frees_and_the_client_gets_its_address_back() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (reply, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        let ip = leased(&reply)[0].0;
        let (renewed, written) = send(
            &mut e,
            NOW + 1800,
            &message(MessageType::Renew, &duid, true, &[(1, &[ip])]),
        )
        .unwrap();
        assert_eq!(leased(&renewed), vec![(ip, 7200)]);
        assert_eq!(written[0].expires, NOW + 1800 + 7200);
        // Rebind (no server id) is answered the same way.
        let (rebound, _) = send(
            &mut e,
            NOW + 3000,
            &message(MessageType::Rebind, &duid, false, &[(1, &[ip])]),
        )
        .unwrap();
        assert_eq!(leased(&rebound), vec![(ip, 7200)]);
        let (released, written) = send(
            &mut e,
            NOW + 3001,
            &message(MessageType::Release, &duid, true, &[(1, &[ip])]),
        )
        .unwrap();
        assert_eq!(status(&released), Some(Status::Success));
        assert_eq!(written[0].state, LeaseState::Released);
        let (again, _) = send(
            &mut e,
            NOW + 3002,
            &message(MessageType::Solicit, &duid, false, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(leased(&again)[0].0, ip);
    }

    #[test]
    fn renew_of_an_address_another_client_holds_gets_no_binding_and_rebind_gets_lifetimes_zero() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let holder = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (reply, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &holder, true, &[(1, &[])]),
        )
        .unwrap();
        let ip = leased(&reply)[0].0;
        let thief = duid_llt([2, 0, 0, 0, 0, 7], 1);
        let (renew, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Renew, &thief, true, &[(1, &[ip])]),
        )
        .unwrap();
        assert!(written.is_empty());
        assert_eq!(ia_status(&renew), vec![Status::NoBinding]);
        let (rebind, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Rebind, &thief, false, &[(1, &[ip])]),
        )
        .unwrap();
        assert!(written.is_empty());
        assert_eq!(leased(&rebind), vec![(ip, 0)]);
        // Off-link addresses are likewise zeroed.
        let (off, _) = send(
            &mut e,
            NOW,
            &message(
                MessageType::Rebind,
                &thief,
                false,
                &[(1, &[a("2001:db8::1")])],
            ),
        )
        .unwrap();
        assert_eq!(leased(&off), vec![(a("2001:db8::1"), 0)]);
    }

    #[test]
    fn a_declined_address_is_quarantined_for_a_valid_lifetime() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::100"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (reply, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        let ip = leased(&reply)[0].0;
        let (declined, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Decline, &duid, true, &[(1, &[ip])]),
        )
        .unwrap();
        assert_eq!(status(&declined), Some(Status::Success));
        assert_eq!(written[0].state, LeaseState::Declined);
        // The one-address pool is empty now: the Advertise says so alone.
        let (adv, _) = send(
            &mut e,
            NOW + 1,
            &message(MessageType::Solicit, &duid, false, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(status(&adv), Some(Status::NoAddrsAvail));
        assert!(leased(&adv).is_empty());
        let (adv, _) = send(
            &mut e,
            NOW + 7201,
            &message(MessageType::Solicit, &duid, false, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(leased(&adv)[0].0, ip);
    }

    #[test]
    fn confirm_says_whether_the_addresses_are_on_this_link() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let on = message(
            MessageType::Confirm,
            &duid,
            false,
            &[(1, &[a("fd42:10::5")])],
        );
        assert_eq!(
            status(&send(&mut e, NOW, &on).unwrap().0),
            Some(Status::Success)
        );
        let off = message(
            MessageType::Confirm,
            &duid,
            false,
            &[(1, &[a("fd42:11::5")])],
        );
        assert_eq!(
            status(&send(&mut e, NOW, &off).unwrap().0),
            Some(Status::NotOnLink)
        );
        let empty = message(MessageType::Confirm, &duid, false, &[(1, &[])]);
        assert_eq!(
            send(&mut e, NOW, &empty).err(),
            Some(Ignored6::NothingToConfirm)
        );
    }

    #[test]
    fn messages_that_name_the_wrong_server_or_none_are_discarded() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        for (kind, server, why) in [
            (MessageType::Solicit, true, Ignored6::ServerIdNotAllowed),
            (MessageType::Rebind, true, Ignored6::ServerIdNotAllowed),
            (MessageType::Request, false, Ignored6::OtherServer),
            (MessageType::Renew, false, Ignored6::OtherServer),
            (MessageType::Release, false, Ignored6::OtherServer),
        ] {
            let m = message(kind, &duid, server, &[(1, &[])]);
            assert_eq!(send(&mut e, NOW, &m).err(), Some(why), "{kind:?}");
        }
        let mut m = Message::new_with_id(MessageType::Solicit, [1, 1, 1]);
        m.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 1,
            t1: 0,
            t2: 0,
            opts: DhcpOptions::new(),
        }));
        let mut bytes = Vec::new();
        m.encode(&mut Encoder::new(&mut bytes)).unwrap();
        assert_eq!(send(&mut e, NOW, &bytes).err(), Some(Ignored6::NoClientId));
        assert_eq!(e.lease_count(), 0);
    }

    #[test]
    fn a_reservation_by_mac_holds_when_the_duid_llt_changes_and_by_duid_and_relay_link_layer() {
        let mac = [2, 0, 0, 0, 0, 9];
        let mut e = engine(&format!(
            "{}  reservations:\n    - {{mac: '02:00:00:00:00:09', ip: 'fd42:10::50', hostname: worker-0}}\n    - {{duid: '000300010200000000aa', ip: 'fd42:10::51'}}\n    - {{mac: '02:00:00:00:00:bb', ip: 'fd42:10::52'}}\n",
            pool("fd42:10::100", "fd42:10::1ff")
        ));
        for time in [1, 99] {
            let (reply, written) = send(
                &mut e,
                NOW + u64::from(time),
                &message(
                    MessageType::Request,
                    &duid_llt(mac, time),
                    true,
                    &[(1, &[])],
                ),
            )
            .unwrap();
            assert_eq!(
                leased(&reply)[0].0,
                a("fd42:10::50"),
                "DUID-LLT time {time}"
            );
            assert_eq!(written[0].hostname.as_deref(), Some("worker-0"));
        }
        let by_duid = crate::v6::duid_ll([2, 0, 0, 0, 0, 0xaa]);
        let (reply, _) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &by_duid, true, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(leased(&reply)[0].0, a("fd42:10::51"));
        // A DUID-EN carries no MAC; the relay's RFC 6939 option does.
        let en = vec![0, 2, 0, 0, 0, 9, 1, 2, 3];
        let inner = message(MessageType::Request, &en, true, &[(1, &[])]);
        let mut relay = vec![12, 0];
        relay.extend_from_slice(&a("fd42:10::1").octets());
        relay.extend_from_slice(&a("fe80::99").octets());
        relay.extend_from_slice(&[0, 79, 0, 8, 0, 1, 2, 0, 0, 0, 0, 0xbb]);
        relay.extend_from_slice(&9u16.to_be_bytes());
        relay.extend_from_slice(&(inner.len() as u16).to_be_bytes());
        relay.extend_from_slice(&inner);
        let relayed = unwrap_relays(&relay).unwrap();
        assert_eq!(relayed.client_link_layer, Some([2, 0, 0, 0, 0, 0xbb]));
        let msg = decode_client(relayed.client).unwrap();
        let out = e.handle(NOW, &relayed, &msg, None).unwrap();
        assert_eq!(out.commit[0].ip, IpAddr::V6(a("fd42:10::52")));
        // Nobody else is given a reserved address from the pool.
        let (other, _) = send(
            &mut e,
            NOW,
            &message(
                MessageType::Request,
                &duid_llt([2, 0, 0, 0, 0, 1], 1),
                true,
                &[(1, &[a("fd42:10::50")])],
            ),
        )
        .unwrap();
        assert_ne!(leased(&other)[0].0, a("fd42:10::50"));
    }

    fn with_fqdn(bytes: Vec<u8>, name: &str) -> Vec<u8> {
        let mut m = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        let mut data = vec![0, name.len() as u8];
        data.extend_from_slice(name.as_bytes());
        m.opts_mut()
            .insert(DhcpOption::Unknown(dhcproto::v6::UnknownOption::new(
                OptionCode::ClientFqdn,
                data,
            )));
        let mut buf = Vec::new();
        m.encode(&mut Encoder::new(&mut buf)).unwrap();
        buf
    }

    #[test]
    fn the_client_fqdn_names_the_lease_unless_another_client_holds_the_name() {
        let mut e = engine(&format!(
            "{}  reservations: [{{mac: '02:00:00:00:00:07', ip: 'fd42:10::50', hostname: infra-0}}]\n",
            pool("fd42:10::100", "fd42:10::1ff")
        ));
        let first = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let req = |duid: &[u8], name: &str| {
            with_fqdn(message(MessageType::Request, duid, true, &[(1, &[])]), name)
        };
        let (_, w) = send(&mut e, NOW, &req(&first, "Worker-6")).unwrap();
        assert_eq!(w[0].hostname.as_deref(), Some("worker-6"));
        // Another client asking for the same name gets the lease, not it.
        let second = duid_llt([2, 0, 0, 0, 0, 8], 1);
        let (_, w) = send(&mut e, NOW, &req(&second, "worker-6")).unwrap();
        assert_eq!(w[0].hostname, None);
        // Nor a reserved client's name.
        let (_, w) = send(&mut e, NOW, &req(&second, "infra-0")).unwrap();
        assert_eq!(w[0].hostname, None);
        // The reserved client is named by its reservation, whatever it asks.
        let (_, w) = send(&mut e, NOW, &req(&duid_llt([2, 0, 0, 0, 0, 7], 1), "other")).unwrap();
        assert_eq!(w[0].hostname.as_deref(), Some("infra-0"));
        // A renewal without the option carries no name; the name is free
        // for another client then.
        let (_, w) = send(
            &mut e,
            NOW + 10,
            &message(MessageType::Renew, &first, true, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(w[0].hostname, None);
        let (_, w) = send(&mut e, NOW + 10, &req(&second, "worker-6")).unwrap();
        assert_eq!(w[0].hostname.as_deref(), Some("worker-6"));
        // An invalid name is no name.
        let (_, w) = send(&mut e, NOW + 10, &req(&first, "bad_name")).unwrap();
        assert_eq!(w[0].hostname, None);
    }

    #[test]
    fn a_relay_on_another_link_is_not_given_this_links_addresses() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let inner = message(
            MessageType::Solicit,
            &duid_llt([2, 0, 0, 0, 0, 9], 1),
            false,
            &[(1, &[])],
        );
        let relay = |link: &str| {
            let mut r = vec![12, 0];
            r.extend_from_slice(&a(link).octets());
            r.extend_from_slice(&a("fe80::99").octets());
            r.extend_from_slice(&9u16.to_be_bytes());
            r.extend_from_slice(&(inner.len() as u16).to_be_bytes());
            r.extend_from_slice(&inner);
            r
        };
        assert_eq!(
            send(&mut e, NOW, &relay("fd42:99::1")).err(),
            Some(Ignored6::OtherLink)
        );
        for link in ["fd42:10::1", "::"] {
            assert!(send(&mut e, NOW, &relay(link)).is_ok(), "{link}");
        }
    }

    #[test]
    fn leases_come_back_from_their_records_and_a_change_that_failed_to_reach_disk_is_undone() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let duid = duid_llt([2, 0, 0, 0, 0, 9], 1);
        let (_, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        let mut restarted = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        let v4 = LeaseRecord {
            ip: IpAddr::from([10, 0, 0, 10]),
            ..written[0].clone()
        };
        assert_eq!(restarted.restore(written.iter().chain([&v4])), 0);
        assert_eq!(restarted.records(), written);
        let (renewed, _) = send(
            &mut restarted,
            NOW + 10,
            &message(MessageType::Renew, &duid, true, &[(1, &[])]),
        )
        .unwrap();
        assert_eq!(IpAddr::V6(leased(&renewed)[0].0), written[0].ip);
        // A new client's lease that the disk refused is gone again.
        let other = duid_llt([2, 0, 0, 0, 0, 8], 1);
        let bytes = message(MessageType::Request, &other, true, &[(1, &[])]);
        let relayed = unwrap_relays(&bytes).unwrap();
        let msg = decode_client(relayed.client).unwrap();
        let out = restarted.handle(NOW, &relayed, &msg, None).unwrap();
        assert_eq!(restarted.lease_count(), 2);
        assert!(restarted.settle(&out.commit[0], false));
        assert_eq!(restarted.lease_count(), 1);
    }

    #[test]
    fn under_ha_without_a_standby_new_addresses_come_from_this_replicas_share() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::1ff"));
        for i in 0..20u8 {
            let bytes = message(
                MessageType::Request,
                &duid_llt([2, 0, 0, 0, 1, i], 1),
                true,
                &[(1, &[])],
            );
            let relayed = unwrap_relays(&bytes).unwrap();
            let msg = decode_client(relayed.client).unwrap();
            let out = e
                .handle(NOW, &relayed, &msg, Some(Share { first: false }))
                .unwrap();
            let IpAddr::V6(ip) = out.commit[0].ip else {
                panic!()
            };
            assert_eq!(ip.octets()[15] & 1, 1, "{ip} is not in the odd share");
        }
    }

    #[test]
    fn a_pool_runs_out_with_no_addrs_avail_and_expired_leases_are_reused() {
        let mut e = engine(&pool("fd42:10::100", "fd42:10::103"));
        let mut got = Vec::new();
        for i in 0..4u8 {
            let (reply, _) = send(
                &mut e,
                NOW,
                &message(
                    MessageType::Request,
                    &duid_llt([2, 0, 0, 0, 2, i], 1),
                    true,
                    &[(1, &[])],
                ),
            )
            .unwrap();
            got.push(leased(&reply)[0].0);
        }
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 4);
        let late = duid_llt([2, 0, 0, 0, 3, 0], 1);
        let (full, written) = send(
            &mut e,
            NOW,
            &message(MessageType::Request, &late, true, &[(1, &[])]),
        )
        .unwrap();
        assert!(written.is_empty());
        assert_eq!(ia_status(&full), vec![Status::NoAddrsAvail]);
        let (later, _) = send(
            &mut e,
            NOW + 7201,
            &message(MessageType::Request, &late, true, &[(1, &[])]),
        )
        .unwrap();
        assert!(got.contains(&leased(&later)[0].0));
        assert_eq!(e.stats(NOW + 7201).active, 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any sequence of messages from a few clients over a small pool:
        /// every answer decodes, no address is given with a lifetime to a
        /// second client while the first's lease on it runs (unless that
        /// client gave it back), and a restart from the records written
        /// holds every lease the engine had written.
        #[test]
        fn no_address_is_leased_to_two_clients_and_the_records_rebuild_the_leases(
            steps in proptest::collection::vec(
                (0u8..4, 0u8..7, 1u32..3, proptest::option::of(0usize..6), 0u64..2000),
                1..60,
            ),
        ) {
            let mut e = engine(&format!(
                "{}  reservations: [{{mac: '02:00:00:00:00:03', ip: 'fd42:10::50'}}]\n  rapidCommit: true\n",
                pool("fd42:10::100", "fd42:10::103")
            ));
            let addrs = ["fd42:10::100", "fd42:10::101", "fd42:10::102", "fd42:10::103", "fd42:10::50", "fd42:11::1"].map(a);
            let kinds = [
                MessageType::Solicit, MessageType::Request, MessageType::Renew, MessageType::Rebind,
                MessageType::Release, MessageType::Decline, MessageType::Confirm,
            ];
            let mut now = NOW;
            // Address -> (client, IAID, valid until), from the replies.
            let mut given: HashMap<Ipv6Addr, (u8, u32, u64)> = HashMap::new();
            let mut written: Vec<LeaseRecord> = Vec::new();
            for (client, kind, iaid, addr, advance) in steps {
                now += advance;
                let kind = kinds[usize::from(kind)];
                let with_server = matches!(kind, MessageType::Request | MessageType::Renew | MessageType::Release | MessageType::Decline);
                let listed: Vec<Ipv6Addr> = addr.map(|i| addrs[i]).into_iter().collect();
                let bytes = message(kind, &duid_llt([2, 0, 0, 0, 0, client], 1), with_server, &[(iaid, &listed)]);
                let Ok((reply, records)) = send(&mut e, now, &bytes) else { continue };
                written.extend(records);
                if matches!(kind, MessageType::Release | MessageType::Decline) {
                    for ip in &listed {
                        if given.get(ip).is_some_and(|g| g.0 == client && g.1 == iaid) {
                            given.remove(ip);
                        }
                    }
                }
                if reply.msg_type() != MessageType::Reply {
                    continue;
                }
                for (ip, valid) in leased(&reply).into_iter().filter(|l| l.1 > 0) {
                    if let Some(&(other, other_iaid, until)) = given.get(&ip) {
                        proptest::prop_assert!(
                            (other, other_iaid) == (client, iaid) || until <= now,
                            "{ip} given to client {client}/{iaid} while client {other}/{other_iaid} holds it until {until} (now {now})"
                        );
                    }
                    given.insert(ip, (client, iaid, now + u64::from(valid)));
                }
            }
            let mut restarted = engine(&format!(
                "{}  reservations: [{{mac: '02:00:00:00:00:03', ip: 'fd42:10::50'}}]\n  rapidCommit: true\n",
                pool("fd42:10::100", "fd42:10::103")
            ));
            proptest::prop_assert_eq!(restarted.restore(&written), 0);
            let on_disk: HashMap<IpAddr, LeaseRecord> = restarted.records().into_iter().map(|r| (r.ip, r)).collect();
            for r in e.records().into_iter().filter(|r| r.state != LeaseState::Offered) {
                let back = on_disk.get(&r.ip);
                proptest::prop_assert!(
                    back.is_some_and(|b| b.client == r.client && b.expires == r.expires && (b.state == r.state || b.state == LeaseState::Released)),
                    "{:?} came back as {:?}", r, back
                );
            }
        }
    }
}
