//! The local answers: per view, the records of the cluster zone, the VLAN's
//! reverse zone and any extra names, plus the names DHCP registers.
//!
//! Pure data and lookups; no sockets, no clock (expiry is checked against
//! the `now` the caller passes).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use causeway_config::{DnsConfig, DnsRecord, RecordData};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

const MAX_CNAME_CHAIN: usize = 8;

/// A zone this server is the authority for.
#[derive(Debug, Clone)]
struct Zone {
    apex: LowerName,
    soa: Record,
}

#[derive(Debug, Default, Clone)]
struct ViewData {
    name: String,
    clients: Vec<IpNet>,
    /// Every name with records, and every empty non-terminal above them
    /// (with no records), so that NODATA and NXDOMAIN can be told apart.
    nodes: HashMap<LowerName, Vec<Record>>,
    /// Wildcard records keyed by the wildcard's parent (`apps.<zone>` for
    /// `*.apps.<zone>`).
    wildcards: HashMap<LowerName, Vec<Record>>,
    /// Wildcard parents with no name of their own below them, other than
    /// the zone apex (where DHCP names live): every name under such a
    /// parent gets the wildcard's records, whatever its labels.
    clean_wildcards: std::collections::HashSet<LowerName>,
}

/// What the authority says about a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// We are authoritative: answer with these sections.
    Answer(LocalAnswer),
    /// Not ours in this view: forward it (or refuse it).
    NotOurs,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalAnswer {
    pub nxdomain: bool,
    pub answers: Vec<Record>,
    /// The zone's SOA on a negative answer.
    pub authority: Vec<Record>,
}

/// Names DHCP leases register: `<hostname>.<zone>` and its reverse, an
/// A record from a DHCPv4 lease and an AAAA record from a DHCPv6 one (a
/// dual-stack host has both under one name).
#[derive(Debug, Default)]
pub struct DynamicNames {
    zone: Option<Name>,
    inner: RwLock<DynamicInner>,
    /// Bumped on every change, so prepared local answers know to go stale.
    generation: AtomicU64,
    /// Registrations refused because the table was full.
    refused: AtomicU64,
}

#[derive(Debug, Default)]
struct DynamicInner {
    /// A records.
    forward: HashMap<LowerName, (IpAddr, u64)>,
    /// AAAA records.
    forward6: HashMap<LowerName, (IpAddr, u64)>,
    reverse: HashMap<LowerName, (Name, u64)>,
    /// Expired names are swept once the table passes this size, which then
    /// doubles past what is left: amortised, however fast names churn.
    sweep_at: usize,
}

/// Names learned from DHCP, at most, of both families together: as many
/// as a /16 has addresses. Past it a new name is not registered (and
/// counted), so no client can grow the table without bound by renaming
/// itself.
pub const MAX_DHCP_NAMES: usize = 65_536;
/// The table is swept for expired names no sooner than at this size.
const SWEEP_FLOOR: usize = 512;

impl DynamicNames {
    /// Names registered under `zone` (`hc1.example.com.`); with no zone,
    /// registering does nothing.
    pub fn for_zone(zone: Option<&str>) -> Self {
        DynamicNames {
            zone: zone.and_then(|z| Name::from_ascii(z).ok()),
            inner: RwLock::default(),
            generation: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// How many names are held, per family (expired ones included until
    /// swept).
    pub fn len(&self) -> usize {
        let d = self.read();
        d.forward.len() + d.forward6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registrations refused because [`MAX_DHCP_NAMES`] were held.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Drops names whose leases ran out by `now`, when the table has grown
    /// enough since the last sweep for it to be worth the scan.
    pub fn forget_expired_if_due(&self, now: u64) {
        let mut d = self.write();
        let size = |d: &DynamicInner| d.forward.len() + d.forward6.len() + d.reverse.len();
        if size(&d) < d.sweep_at.max(SWEEP_FLOOR) {
            return;
        }
        d.forward.retain(|_, (_, expires)| *expires > now);
        d.forward6.retain(|_, (_, expires)| *expires > now);
        d.reverse.retain(|_, (_, expires)| *expires > now);
        d.sweep_at = 2 * size(&d);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Registers (or refreshes) `host` at `ip` until `expires` (unix
    /// seconds): an A record for a v4 address, AAAA for v6, with its
    /// reverse name. Refused past [`MAX_DHCP_NAMES`] (see [`Self::refused`]).
    pub fn register(&self, host: &str, ip: impl Into<IpAddr>, expires: u64) {
        let ip = ip.into();
        let Some(zone) = &self.zone else { return };
        let Ok(fqdn) = Name::from_ascii(host).and_then(|h| h.append_domain(zone)) else {
            return;
        };
        let Ok(rev) = Name::from_ascii(causeway_config::reverse_name(ip)) else {
            return;
        };
        let key = LowerName::from(&fqdn);
        let rev = LowerName::from(rev);
        let mut d = self.write();
        let held = d.forward.len() + d.forward6.len();
        let d = &mut *d;
        let forward = if ip.is_ipv4() {
            &mut d.forward
        } else {
            &mut d.forward6
        };
        if !forward.contains_key(&key) && held >= MAX_DHCP_NAMES {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // A host that moved must not keep its old reverse entry, but only
        // its own: the old address may be another host's by now.
        if let Some((old_ip, _)) = forward.insert(key.clone(), (ip, expires)) {
            if old_ip != ip {
                if let Ok(old_rev) = Name::from_ascii(causeway_config::reverse_name(old_ip)) {
                    let old_rev = LowerName::from(old_rev);
                    if d.reverse
                        .get(&old_rev)
                        .is_some_and(|(name, _)| LowerName::from(name) == key)
                    {
                        d.reverse.remove(&old_rev);
                    }
                }
            }
        }
        // The address's previous name, another host's or this host's
        // before a rename, no longer resolves to it.
        if let Some((previous, _)) = d.reverse.insert(rev, (fqdn, expires)) {
            let previous = LowerName::from(&previous);
            if previous != key && forward.get(&previous).is_some_and(|(a, _)| *a == ip) {
                forward.remove(&previous);
            }
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Forgets whatever name `ip` carries.
    pub fn unregister(&self, ip: impl Into<IpAddr>) {
        let ip = ip.into();
        let Ok(rev) = Name::from_ascii(causeway_config::reverse_name(ip)) else {
            return;
        };
        let mut d = self.write();
        // Most renewals carry no name and have none to forget: the answers
        // built from the table stay valid then.
        let Some((fqdn, _)) = d.reverse.remove(&LowerName::from(rev)) else {
            return;
        };
        let key = LowerName::from(&fqdn);
        let forward = if ip.is_ipv4() {
            &mut d.forward
        } else {
            &mut d.forward6
        };
        if forward.get(&key).is_some_and(|(a, _)| *a == ip) {
            forward.remove(&key);
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, DynamicInner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, DynamicInner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn lookup(&self, name: &LowerName, now: u64, ttl: u32) -> Option<Vec<Record>> {
        let d = self.read();
        let records: Vec<Record> = [d.forward.get(name), d.forward6.get(name)]
            .into_iter()
            .flatten()
            .filter(|(_, expires)| *expires > now)
            .map(|(ip, _)| {
                let data = match ip {
                    IpAddr::V4(a) => RData::A(A(*a)),
                    IpAddr::V6(a) => RData::AAAA(AAAA(*a)),
                };
                Record::from_rdata(name.into(), ttl, data)
            })
            .collect();
        if !records.is_empty() {
            return Some(records);
        }
        if let Some((target, expires)) = d.reverse.get(name) {
            if *expires > now {
                return Some(vec![Record::from_rdata(
                    name.into(),
                    ttl,
                    RData::PTR(PTR(target.clone())),
                )]);
            }
        }
        None
    }
}

pub struct Authority {
    zones: Vec<Zone>,
    views: Vec<ViewData>,
    cluster_zone: Option<Name>,
    recursion: Vec<IpNet>,
    ttl: u32,
    dynamic: Arc<DynamicNames>,
}

#[derive(Debug, thiserror::Error)]
#[error("record {name}: {reason}")]
pub struct BuildError {
    name: String,
    reason: String,
}

fn name(text: &str) -> Result<Name, BuildError> {
    Name::from_ascii(text).map_err(|e| BuildError {
        name: text.to_string(),
        reason: e.to_string(),
    })
}

fn to_record(r: &DnsRecord) -> Result<Record, BuildError> {
    let owner = name(&r.name)?;
    let rdata = match &r.data {
        RecordData::A(ip) => RData::A(A(*ip)),
        RecordData::Aaaa(ip) => RData::AAAA(AAAA(*ip)),
        RecordData::Cname(t) => RData::CNAME(CNAME(name(t)?)),
        RecordData::Ptr(t) => RData::PTR(PTR(name(t)?)),
        RecordData::Txt(t) => RData::TXT(TXT::new(vec![t.clone()])),
        RecordData::Srv {
            priority,
            weight,
            port,
            target,
        } => RData::SRV(SRV::new(*priority, *weight, *port, name(target)?)),
    };
    Ok(Record::from_rdata(owner, r.ttl, rdata))
}

/// The reverse zones covering `net`, at whole octets: a /22 is four /24
/// zones, a /24 one, a /26 the /24 around it.
fn reverse_zones(net: Ipv4Net) -> Vec<Name> {
    let prefix = (u32::from(net.prefix_len()).div_ceil(8) * 8).clamp(8, 24) as u8;
    let covering = if prefix <= net.prefix_len() {
        vec![Ipv4Net::new(net.network(), prefix)
            .map(|n| n.trunc())
            .unwrap_or(net)]
    } else {
        net.subnets(prefix).map(|s| s.collect()).unwrap_or_default()
    };
    covering
        .into_iter()
        .filter_map(|n| {
            let octets = n.network().octets();
            let labels: Vec<String> = octets[..usize::from(n.prefix_len() / 8)]
                .iter()
                .rev()
                .map(u8::to_string)
                .collect();
            Name::from_ascii(format!("{}.in-addr.arpa.", labels.join("."))).ok()
        })
        .collect()
}

/// The reverse zone of a v6 prefix, at the whole nibble at or above its
/// length: `0.1.0.0.2.4.d.f.ip6.arpa.` for fd42:10::/64 (at most /124).
fn reverse_zone_v6(net: Ipv6Net) -> Option<Name> {
    let nibbles = usize::from(net.prefix_len() / 4).min(31);
    let hex: Vec<char> = net
        .network()
        .octets()
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(nibbles)
        .filter_map(|n| char::from_digit(u32::from(n), 16))
        .collect();
    let labels: Vec<String> = hex.iter().rev().map(char::to_string).collect();
    let text = if labels.is_empty() {
        "ip6.arpa.".to_string()
    } else {
        format!("{}.ip6.arpa.", labels.join("."))
    };
    Name::from_ascii(text).ok()
}

fn soa(apex: &Name, cluster_zone: Option<&Name>, ttl: u32, serial: u32) -> Record {
    let host = cluster_zone.unwrap_or(apex);
    let mname = Name::from_ascii("causeway")
        .and_then(|n| n.append_domain(host))
        .unwrap_or_else(|_| host.clone());
    let rname = Name::from_ascii("hostmaster")
        .and_then(|n| n.append_domain(host))
        .unwrap_or_else(|_| host.clone());
    // The SOA minimum is the negative-caching TTL (RFC 2308).
    Record::from_rdata(
        apex.clone(),
        ttl,
        RData::SOA(SOA::new(mname, rname, serial, 3600, 600, 86400, ttl)),
    )
}

impl Authority {
    pub fn new(
        cfg: &DnsConfig,
        dynamic: Arc<DynamicNames>,
        serial: u32,
    ) -> Result<Self, BuildError> {
        let cluster_zone = cfg.zone.as_deref().map(name).transpose()?;
        let mut zones = Vec::new();
        if let Some(z) = &cluster_zone {
            zones.push(Zone {
                apex: LowerName::from(z),
                soa: soa(z, Some(z), cfg.ttl, serial),
            });
        }
        // The other hosted clusters sharing this server: each its own
        // zone, so names under it that no record has are NXDOMAIN here
        // rather than asked upstream.
        for text in &cfg.other_zones {
            let z = name(text)?;
            zones.push(Zone {
                apex: LowerName::from(&z),
                soa: soa(&z, Some(&z), cfg.ttl, serial),
            });
        }
        if let Some(net) = cfg.reverse {
            for apex in reverse_zones(net) {
                zones.push(Zone {
                    apex: LowerName::from(&apex),
                    soa: soa(&apex, cluster_zone.as_ref(), cfg.ttl, serial),
                });
            }
        }
        if let Some(apex) = cfg.reverse_v6.and_then(reverse_zone_v6) {
            zones.push(Zone {
                apex: LowerName::from(&apex),
                soa: soa(&apex, cluster_zone.as_ref(), cfg.ttl, serial),
            });
        }
        let mut views = Vec::new();
        for v in &cfg.views {
            let mut data = ViewData {
                name: v.name.clone(),
                clients: v.clients.clone(),
                ..ViewData::default()
            };
            for r in &v.records {
                let record = to_record(r)?;
                let owner = LowerName::from(record.name());
                let (target, node) = if owner.is_wildcard() {
                    let parent = owner.base_name();
                    (data.wildcards.entry(parent.clone()).or_default(), parent)
                } else {
                    (data.nodes.entry(owner.clone()).or_default(), owner)
                };
                target.push(record);
                // Empty non-terminals up to the zone apex (or the root for
                // names outside our zones).
                let apex = zones
                    .iter()
                    .find(|z| z.apex.zone_of(&node))
                    .map(|z| z.apex.clone());
                let mut up = node;
                while let Some(a) = &apex {
                    data.nodes.entry(up.clone()).or_default();
                    if &up == a || up.is_root() {
                        break;
                    }
                    up = up.base_name();
                }
            }
            let apexes: Vec<&LowerName> = zones.iter().map(|z| &z.apex).collect();
            data.clean_wildcards = data
                .wildcards
                .keys()
                .filter(|parent| !apexes.contains(parent))
                .filter(|parent| !data.nodes.keys().any(|n| n != *parent && parent.zone_of(n)))
                .cloned()
                .collect();
            views.push(data);
        }
        Ok(Authority {
            zones,
            views,
            cluster_zone,
            recursion: cfg.recursion_clients.clone(),
            ttl: cfg.ttl,
            dynamic,
        })
    }

    pub fn cluster_zone(&self) -> Option<&Name> {
        self.cluster_zone.as_ref()
    }

    /// The index of the first view whose clients match; the last view is
    /// the default and matches everyone.
    pub fn view_for(&self, client: IpAddr) -> usize {
        let client = canonical(client);
        self.views
            .iter()
            .position(|v| v.clients.is_empty() || v.clients.iter().any(|n| n.contains(&client)))
            .unwrap_or(self.views.len().saturating_sub(1))
    }

    pub fn view_name(&self, view: usize) -> &str {
        self.views.get(view).map_or("default", |v| v.name.as_str())
    }

    pub fn may_recurse(&self, client: IpAddr) -> bool {
        let client = canonical(client);
        self.recursion.iter().any(|n| n.contains(&client))
    }

    /// The wildcard parent every name under which gets the same answer in
    /// `view`, if `name` lies under one: its answer can serve any other
    /// name there.
    pub fn uniform_wildcard(&self, view: usize, name: &LowerName) -> Option<LowerName> {
        let v = self.views.get(view)?;
        if v.clean_wildcards.is_empty() {
            return None;
        }
        let mut up = name.base_name();
        while !up.is_root() {
            if v.clean_wildcards.contains(&up) {
                return Some(up);
            }
            up = up.base_name();
        }
        None
    }

    pub fn views(&self) -> usize {
        self.views.len()
    }

    /// Answers `qname`/`qtype` from view `view`'s data at `now`.
    pub fn lookup(&self, view: usize, qname: &LowerName, qtype: RecordType, now: u64) -> Lookup {
        let Some(v) = self.views.get(view) else {
            return Lookup::NotOurs;
        };
        let zone = self.zones.iter().find(|z| z.apex.zone_of(qname));
        if zone.is_none() {
            // Outside our zones, only an exact extra name is ours.
            return match v.nodes.get(qname).filter(|r| !r.is_empty()) {
                Some(records) => Lookup::Answer(LocalAnswer {
                    nxdomain: false,
                    answers: select(records, qtype),
                    authority: Vec::new(),
                }),
                None => Lookup::NotOurs,
            };
        }
        let mut answers: Vec<Record> = Vec::new();
        let mut current = qname.clone();
        for _ in 0..MAX_CNAME_CHAIN {
            let Some(current_zone) = self.zones.iter().find(|z| z.apex.zone_of(&current)) else {
                // The chain left our zones: the client's resolver goes on.
                break;
            };
            let Some(records) = self.node(v, current_zone, &current, now) else {
                return Lookup::Answer(LocalAnswer {
                    nxdomain: true,
                    answers,
                    authority: vec![current_zone.soa.clone()],
                });
            };
            let matching = select(&records, qtype);
            if !matching.is_empty() {
                answers.extend(matching);
                break;
            }
            let cname = records
                .iter()
                .find(|r| r.record_type() == RecordType::CNAME)
                .cloned();
            match cname {
                Some(c) if qtype != RecordType::CNAME => {
                    let target = match c.data() {
                        RData::CNAME(CNAME(t)) => LowerName::from(t),
                        _ => break,
                    };
                    answers.push(c);
                    current = target;
                }
                _ => {
                    // NODATA: the name exists without this type.
                    let authority = if answers.is_empty() {
                        vec![current_zone.soa.clone()]
                    } else {
                        Vec::new()
                    };
                    return Lookup::Answer(LocalAnswer {
                        nxdomain: false,
                        answers,
                        authority,
                    });
                }
            }
        }
        Lookup::Answer(LocalAnswer {
            nxdomain: false,
            answers,
            authority: Vec::new(),
        })
    }

    /// The records at `name`: exact, then DHCP-registered, then synthesized
    /// from the wildcard at the closest encloser (RFC 4592), which matches
    /// names of any depth below it.
    fn node(&self, v: &ViewData, zone: &Zone, name: &LowerName, now: u64) -> Option<Vec<Record>> {
        if let Some(records) = v.nodes.get(name) {
            if records.is_empty() {
                if let Some(dynamic) = self.dynamic.lookup(name, now, self.ttl) {
                    return Some(dynamic);
                }
            }
            return Some(records.clone());
        }
        if let Some(dynamic) = self.dynamic.lookup(name, now, self.ttl) {
            return Some(dynamic);
        }
        let mut up = name.base_name();
        loop {
            if v.nodes.contains_key(&up) || up == zone.apex {
                let wild = v.wildcards.get(&up)?;
                let owner: Name = name.into();
                return Some(
                    wild.iter()
                        .map(|r| Record::from_rdata(owner.clone(), r.ttl(), r.data().clone()))
                        .collect(),
                );
            }
            if up.is_root() || !zone.apex.zone_of(&up) {
                return None;
            }
            up = up.base_name();
        }
    }
}

/// IPv4-mapped IPv6 clients match IPv4 CIDRs.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The records of the asked type. ANY gets one RRset only (RFC 8482).
fn select(records: &[Record], qtype: RecordType) -> Vec<Record> {
    if qtype == RecordType::ANY {
        let Some(first) = records.first().map(Record::record_type) else {
            return Vec::new();
        };
        return records
            .iter()
            .filter(|r| r.record_type() == first)
            .cloned()
            .collect();
    }
    records
        .iter()
        .filter(|r| r.record_type() == qtype)
        .cloned()
        .collect()
}

#[cfg(test)]
#[path = "authority_tests.rs"]
mod tests;
