//! The DHCPv4 engine: a request plus the lease state in, a reply and the
//! lease change to make durable out.
//!
//! It knows nothing of sockets, files or clocks: the caller passes the time
//! in, sends the reply, and must make `commit` durable before it does.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use causeway_config::{valid_label, ClientMatch, DhcpConfig, NameRules, Reservation, Subnet};
use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};

use crate::client::ClientKey;
use crate::index::ClientIndex;
use crate::lease::{Lease, LeaseRecord, LeaseState};
use crate::limits::{Admission, RateLimits};
use crate::merge::Share;
use crate::pool::Pool;
use crate::reply;

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;

/// How a request reached the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingress {
    /// A socket on a directly attached segment, by interface name.
    Interface(String),
    /// A UDP address socket: relayed requests and unicast renewals.
    Address,
}

/// Where a reply goes. `Broadcast` means 255.255.255.255:68 out of the
/// interface the request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    Unicast(SocketAddrV4),
    Broadcast,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub message: Message,
    pub destination: Destination,
}

impl Reply {
    pub fn message_type(&self) -> Option<MessageType> {
        self.message.opts().msg_type()
    }
}

/// What the engine decided. When both `reply` and `commit` are present the
/// reply must not leave before the commit is on stable storage. Every
/// record handed out must be passed back to [`Engine::settle`] once the
/// store has said whether it is durable.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Reply {
        reply: Reply,
        commit: Option<LeaseRecord>,
        /// The release of the address the client moved from, to be logged
        /// before `commit`: without it the log holds two active leases for
        /// one client, and a compaction that reorders them can hand the
        /// old address back after a restart.
        vacated: Option<Box<LeaseRecord>>,
    },
    /// A lease change with nothing to send (RELEASE, DECLINE).
    Commit(LeaseRecord),
    /// Nothing to send and nothing to store.
    Ignore(Ignored),
}

/// Why a request got no answer; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ignored {
    NotBootRequest,
    /// A BOOTP request (no message type): we serve DHCP only.
    Bootp,
    UnexpectedMessageType,
    NoSubnet,
    /// Over `rateLimitPerClient`.
    RateLimited,
    /// Over `rateLimitPerRelay`.
    RateLimitedRelay,
    /// Over `rateLimitPerSubnet`.
    RateLimitedSubnet,
    /// Over `rateLimitGlobal`.
    RateLimitedGlobal,
    PoolExhausted,
    /// A REQUEST or DECLINE naming another server.
    OtherServer,
    /// INIT-REBOOT from a client we have no record of, when not authoritative.
    NoRecord,
    /// A RELEASE or DECLINE for a lease the client does not hold.
    NotHeld,
    MissingAddress,
    /// A relayed packet (giaddr set) on an interface listener from a source
    /// that is no configured relay: a VLAN client posing as a relay.
    UnknownRelay,
    /// A DECLINE from a client that already has as many addresses in
    /// quarantine as one client may.
    DeclineLimited,
}

impl Ignored {
    pub fn label(self) -> &'static str {
        match self {
            Ignored::NotBootRequest => "not_boot_request",
            Ignored::Bootp => "bootp",
            Ignored::UnexpectedMessageType => "unexpected_message_type",
            Ignored::NoSubnet => "no_subnet",
            Ignored::RateLimited => "rate_limited",
            Ignored::RateLimitedRelay => "rate_limited_relay",
            Ignored::RateLimitedSubnet => "rate_limited_subnet",
            Ignored::RateLimitedGlobal => "rate_limited_global",
            Ignored::PoolExhausted => "pool_exhausted",
            Ignored::OtherServer => "other_server",
            Ignored::NoRecord => "no_record",
            Ignored::NotHeld => "not_held",
            Ignored::MissingAddress => "missing_address",
            Ignored::UnknownRelay => "unknown_relay",
            Ignored::DeclineLimited => "decline_limited",
        }
    }
}

/// Address accounting for one pool, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    pub subnet: String,
    pub pool: String,
    pub total: u64,
    pub leased: u64,
    pub offered: u64,
    pub declined: u64,
    /// Excluded and reserved addresses inside the pool.
    pub unavailable: u64,
    pub free: u64,
}

struct SubnetState {
    cfg: Subnet,
    pools: Vec<Pool>,
    /// Per pool, beside it: what its leases hold, kept as leases change so
    /// the statistics never walk the lease table.
    counts: Vec<PoolCounts>,
    by_mac: HashMap<[u8; 6], usize>,
    by_client_id: HashMap<Vec<u8>, usize>,
    by_reserved_ip: HashMap<Ipv4Addr, usize>,
}

impl SubnetState {
    fn new(cfg: Subnet) -> Self {
        let mut pools: Vec<Pool> = cfg.pools.iter().map(|r| Pool::new(*r)).collect();
        let mut by_mac = HashMap::new();
        let mut by_client_id = HashMap::new();
        let mut by_reserved_ip = HashMap::new();
        for (i, r) in cfg.reservations.iter().enumerate() {
            match &r.client {
                ClientMatch::Mac(mac) => by_mac.insert(*mac, i),
                ClientMatch::ClientId(id) => by_client_id.insert(id.clone(), i),
            };
            by_reserved_ip.insert(r.ip, i);
        }
        for pool in &mut pools {
            for ex in &cfg.exclude {
                let start = u32::from(ex.start).max(u32::from(pool.range.start));
                let end = u32::from(ex.end).min(u32::from(pool.range.end));
                for a in start..=end {
                    pool.set(a.into(), true);
                }
            }
            for ip in by_reserved_ip.keys() {
                pool.set(*ip, true);
            }
        }
        let counts = pools
            .iter()
            .map(|p| PoolCounts {
                unavailable: unavailable_in(&cfg, &by_reserved_ip, &p.range),
                ..PoolCounts::default()
            })
            .collect();
        SubnetState {
            cfg,
            pools,
            counts,
            by_mac,
            by_client_id,
            by_reserved_ip,
        }
    }

    fn reservation_for(&self, hw: &[u8; 6], client_id: Option<&[u8]>) -> Option<&Reservation> {
        let i = client_id
            .and_then(|id| self.by_client_id.get(id))
            .or_else(|| self.by_mac.get(hw))?;
        self.cfg.reservations.get(*i)
    }

    fn pool_index(&self, ip: Ipv4Addr) -> Option<usize> {
        self.pools.iter().position(|p| p.contains(ip))
    }

    fn in_pool(&self, ip: Ipv4Addr) -> bool {
        self.pools.iter().any(|p| p.contains(ip))
    }

    fn excluded(&self, ip: Ipv4Addr) -> bool {
        self.cfg.exclude.iter().any(|e| e.contains(ip))
    }
}

/// A pool's addresses by what holds them, counting leases that have not
/// been released (an expired one counts until reclaimed; the statistics
/// take those off by the expiry index).
#[derive(Debug, Clone, Copy, Default)]
struct PoolCounts {
    leased: u64,
    offered: u64,
    declined: u64,
    /// Leases on addresses that are not reserved: what comes off `free`.
    held_unreserved: u64,
    /// Excluded and reserved addresses inside the pool: fixed by the config.
    unavailable: u64,
}

impl PoolCounts {
    fn count(&mut self, state: LeaseState, reserved: bool, up: bool) {
        let field = match state {
            LeaseState::Active => &mut self.leased,
            LeaseState::Offered => &mut self.offered,
            LeaseState::Declined => &mut self.declined,
            LeaseState::Released => return,
        };
        let step = |n: &mut u64| *n = if up { *n + 1 } else { n.saturating_sub(1) };
        step(field);
        if !reserved {
            step(&mut self.held_unreserved);
        }
    }
}

/// Excluded addresses in `range`, and reserved ones not also excluded.
fn unavailable_in(
    cfg: &Subnet,
    reserved: &HashMap<Ipv4Addr, usize>,
    range: &causeway_config::AddressRange,
) -> u64 {
    let mut n = 0;
    for ex in &cfg.exclude {
        if ex.overlaps(range) {
            let start = u32::from(ex.start).max(u32::from(range.start));
            let end = u32::from(ex.end).min(u32::from(range.end));
            n += u64::from(end - start) + 1;
        }
    }
    n + reserved
        .keys()
        .filter(|ip| range.contains(**ip) && !cfg.exclude.iter().any(|e| e.contains(**ip)))
        .count() as u64
}

/// What the pool counts and the expiry index hold for an address: its
/// lease as last marked, while not released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counted {
    state: LeaseState,
    expires: u64,
}

/// Protocol timing and policy, from the config.
#[derive(Debug, Clone)]
struct Policy {
    lease_secs: u32,
    renew_secs: Option<u32>,
    rebind_secs: Option<u32>,
    offer_secs: u32,
    decline_secs: u32,
    rapid_commit: bool,
    authoritative: bool,
    limits: RateLimits,
}

fn secs(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

impl Policy {
    fn from_config(cfg: &DhcpConfig) -> Self {
        Policy {
            lease_secs: secs(cfg.lease_time),
            renew_secs: cfg.renew_time.map(secs),
            rebind_secs: cfg.rebind_time.map(secs),
            offer_secs: secs(cfg.offer_timeout),
            decline_secs: secs(cfg.decline_probation),
            rapid_commit: cfg.rapid_commit,
            authoritative: cfg.authoritative,
            limits: RateLimits::from_config(cfg),
        }
    }
}

/// The facts of one request the engine acts on, pulled out once.
struct Facts<'a> {
    msg: &'a Message,
    key: ClientKey,
    hw: [u8; 6],
    client_id: Option<&'a [u8]>,
    source: SocketAddrV4,
}

impl Facts<'_> {
    fn lease(
        &self,
        ip: Ipv4Addr,
        state: LeaseState,
        expires: u64,
        hostname: Option<Box<str>>,
    ) -> Lease {
        Lease {
            ip,
            client: self.key.clone(),
            hw: self.hw,
            state,
            expires,
            hostname,
        }
    }
}

pub struct Engine {
    policy: Policy,
    subnets: Vec<SubnetState>,
    leases: HashMap<Ipv4Addr, Lease>,
    /// The address each client last held or was offered.
    by_client: ClientIndex,
    admission: Admission,
    /// Which address last took each client-chosen hostname. Checked
    /// against the lease on use, so an entry gone stale is harmless.
    by_hostname: HashMap<Box<str>, Ipv4Addr>,
    /// Every reservation's hostname, lowercase: no other client gets one.
    reserved_names: HashSet<Box<str>>,
    /// Offers that move a client off an address it holds, by the offered
    /// address: the client keeps the old one until it takes the new, and
    /// the old one's release is logged with that ACK.
    moving_from: HashMap<Ipv4Addr, Ipv4Addr>,
    /// Addresses each client has in quarantine, so a DECLINE counts them
    /// without walking every lease. Pruned as quarantines end.
    quarantined: HashMap<ClientKey, Vec<Ipv4Addr>>,
    /// Lease changes handed to the store and not yet settled, by address.
    unsettled: HashMap<Ipv4Addr, Unsettled>,
    /// No allocation reclaims before this second: a full pool under a
    /// flood of new clients answers "exhausted" from the bitmap instead of
    /// scanning every lease for each of them, under the engine lock that
    /// renewals wait on. The server's tick reclaims on its own besides.
    reclaim_not_before: u64,
    /// Reclaim scans run, for the tests that hold the flood to one a second.
    reclaims: u64,
    /// Leases looked at by reclaims and pool statistics, for the tests
    /// that hold their cost to what changed rather than to the table.
    lease_visits: std::cell::Cell<u64>,
    /// Every lease not released, as the pool counts have it: `mark` is
    /// the one place leases are counted, so it needs what it counted last.
    counted: HashMap<Ipv4Addr, Counted>,
    /// The same leases by when they end: a reclaim takes what has ended
    /// from the front instead of walking every lease.
    expiring: BTreeSet<(u64, Ipv4Addr)>,
    /// `by_hostname`'s size after its last sweep for stale entries: the
    /// next sweep waits until it has doubled, so sweeps cost O(1) a name.
    hostnames_after_sweep: usize,
    /// Under high availability while no standby confirms: the half of the
    /// pool new addresses come from (see [`crate::merge`]).
    share: Option<Share>,
}

/// At most one reclaim scan a second on the allocation path.
const RECLAIM_EVERY: u64 = 1;

/// What the engine knows of an address whose change is not yet durable.
#[derive(Debug)]
struct Unsettled {
    /// The lease as the disk last had it (as far as this process knows):
    /// what the address goes back to if the changes in flight all fail.
    durable: Option<Lease>,
    in_flight: u32,
}

/// Whether `lease` is what `record` wrote: a later change in memory (a new
/// offer, another client) is not undone by an older record's failure.
fn same_change(lease: &Lease, record: &LeaseRecord) -> bool {
    lease.state == record.state
        && lease.expires == record.expires
        && lease.client.to_hex() == record.client
}

fn reserved_names(cfg: &DhcpConfig) -> HashSet<Box<str>> {
    cfg.subnets
        .iter()
        .flat_map(|s| &s.reservations)
        .filter_map(|r| r.hostname.as_deref())
        .map(|h| h.to_ascii_lowercase().into())
        .collect()
}

/// Addresses one client may hold in quarantine at once: a real client
/// declines an address only when it finds it in use, and a second conflict
/// in a row is already rare.
pub const MAX_DECLINED_PER_CLIENT: usize = 2;

impl Engine {
    pub fn new(cfg: &DhcpConfig) -> Self {
        Engine {
            policy: Policy::from_config(cfg),
            subnets: cfg.subnets.iter().cloned().map(SubnetState::new).collect(),
            leases: HashMap::new(),
            by_client: ClientIndex::default(),
            admission: Admission::default(),
            by_hostname: HashMap::new(),
            reserved_names: reserved_names(cfg),
            moving_from: HashMap::new(),
            quarantined: HashMap::new(),
            unsettled: HashMap::new(),
            reclaim_not_before: 0,
            reclaims: 0,
            lease_visits: std::cell::Cell::new(0),
            counted: HashMap::new(),
            expiring: BTreeSet::new(),
            hostnames_after_sweep: 0,
            share: None,
        }
    }

    /// Restricts new addresses to `share` (a replica serving without a
    /// standby that confirms), or lifts the restriction. A client keeps an
    /// active lease and a reserved address whatever the share.
    pub fn set_share(&mut self, share: Option<Share>) {
        self.share = share;
    }

    /// Adopts records of a rejoining standby's log that the merge rule
    /// chose (see [`crate::merge::judge`]): each takes its address, as if
    /// read from this replica's own log.
    pub fn adopt(&mut self, records: &[LeaseRecord]) {
        for r in records {
            let Some(lease) = Lease::from_record(r) else {
                continue;
            };
            let ip = lease.ip;
            if let (LeaseState::Active, Some(name)) = (lease.state, &lease.hostname) {
                self.by_hostname.insert(name.clone(), ip);
            }
            self.take_record(lease);
            self.mark(ip);
        }
    }

    /// A record read from a log takes its address: the client it displaces
    /// no longer holds it, and the record's client does (unless it declined
    /// the address).
    fn take_record(&mut self, lease: Lease) {
        let ip = lease.ip;
        if let Some(old) = self.leases.get(&ip) {
            if old.client != lease.client && self.by_client.get(&old.client) == Some(ip) {
                let displaced = old.client.clone();
                self.by_client.remove(&displaced);
            }
        }
        if lease.state == LeaseState::Declined {
            self.by_client.remove(&lease.client);
        } else {
            self.by_client.insert(&lease.client, ip);
        }
        self.leases.insert(ip, lease);
    }

    /// How many reclaim scans have run.
    pub fn reclaims(&self) -> u64 {
        self.reclaims
    }

    /// How many leases reclaims and pool statistics have looked at.
    pub fn lease_visits(&self) -> u64 {
        self.lease_visits.get()
    }

    fn visited(&self, leases: usize) {
        self.lease_visits
            .set(self.lease_visits.get() + leases as u64);
    }

    /// Applies a new config, keeping every lease.
    pub fn reconfigure(&mut self, cfg: &DhcpConfig) {
        self.policy = Policy::from_config(cfg);
        self.subnets = cfg.subnets.iter().cloned().map(SubnetState::new).collect();
        self.reserved_names = reserved_names(cfg);
        // New pools count from nothing: every lease is counted again below.
        self.counted.clear();
        self.expiring.clear();
        let leases: Vec<Ipv4Addr> = self.leases.keys().copied().collect();
        for ip in leases {
            self.mark(ip);
        }
    }

    /// Loads leases recovered from the store, in the order they were
    /// written. DHCPv6 records are not this engine's and are passed over;
    /// the count returned is of v4 records that could not be read.
    pub fn restore<'a>(&mut self, records: impl IntoIterator<Item = &'a LeaseRecord>) -> usize {
        let mut skipped = 0;
        for r in records.into_iter().filter(|r| r.ip.is_ipv4()) {
            let Some(lease) = Lease::from_record(r) else {
                skipped += 1;
                continue;
            };
            self.take_record(lease);
        }
        // A client that moved left its old lease active on disk; only its
        // newest address is its own.
        for l in self.leases.values_mut() {
            if l.state != LeaseState::Declined && self.by_client.get(&l.client) != Some(l.ip) {
                l.state = LeaseState::Released;
            }
        }
        for l in self.leases.values() {
            if let (LeaseState::Active, Some(name)) = (l.state, &l.hostname) {
                self.by_hostname.entry(name.clone()).or_insert(l.ip);
            }
            if l.state == LeaseState::Declined {
                self.quarantined
                    .entry(l.client.clone())
                    .or_default()
                    .push(l.ip);
            }
        }
        let ips: Vec<Ipv4Addr> = self.leases.keys().copied().collect();
        for ip in ips {
            self.mark(ip);
        }
        skipped
    }

    /// Holds back addresses whose newest log line could not be read (see
    /// [`crate::Recovery::unreadable_newest`]): each is quarantined as
    /// declined for the longest lease time, so nobody is given it while a
    /// client the lost line named may still use it. Returns the records
    /// that make the hold durable: the compaction drops the unreadable
    /// line, and without them the older record would stand after it.
    pub fn hold_unreadable(&mut self, now: u64, ips: &[Ipv4Addr]) -> Vec<LeaseRecord> {
        let longest = self
            .subnets
            .iter()
            .filter_map(|s| s.cfg.lease_time.map(secs))
            .fold(self.policy.lease_secs, u32::max);
        let mut records = Vec::with_capacity(ips.len());
        for &ip in ips {
            let before = self.leases.get(&ip).cloned();
            let client = match &before {
                Some(l) => {
                    if self.by_client.get(&l.client) == Some(ip) {
                        self.by_client.remove(&l.client);
                    }
                    l.client.clone()
                }
                None => ClientKey::new(&[]),
            };
            let lease = Lease {
                ip,
                client,
                hw: [0; 6],
                state: LeaseState::Declined,
                expires: now + u64::from(longest),
                hostname: None,
            };
            let record = lease.to_record();
            self.leases.insert(ip, lease);
            self.mark(ip);
            self.track(&record, before);
            records.push(record);
        }
        records
    }

    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values()
    }

    pub fn lease_count(&self) -> usize {
        self.leases.len()
    }

    /// Brings the occupancy bitmap in line with the lease at `ip`.
    /// Brings the pool bitmaps, the pool counts and the expiry index in
    /// line with `ip`'s lease. Called after every change to a lease.
    fn mark(&mut self, ip: Ipv4Addr) {
        let now_counted = self
            .leases
            .get(&ip)
            .filter(|l| l.state != LeaseState::Released)
            .map(|l| Counted {
                state: l.state,
                expires: l.expires,
            });
        let before = match now_counted {
            Some(c) => self.counted.insert(ip, c),
            None => self.counted.remove(&ip),
        };
        if before != now_counted {
            if let Some(b) = before {
                self.expiring.remove(&(b.expires, ip));
            }
            if let Some(c) = now_counted {
                self.expiring.insert((c.expires, ip));
            }
        }
        let held = now_counted.is_some();
        for s in &mut self.subnets {
            let reserved = s.by_reserved_ip.contains_key(&ip);
            let permanent = reserved || s.excluded(ip);
            let Some(pi) = s.pool_index(ip) else {
                continue;
            };
            s.pools[pi].set(ip, held || permanent);
            if before != now_counted {
                if let Some(b) = before {
                    s.counts[pi].count(b.state, reserved, false);
                }
                if let Some(c) = now_counted {
                    s.counts[pi].count(c.state, reserved, true);
                }
            }
        }
    }

    /// Frees addresses whose offer, lease or probation has run out. Returns
    /// how many were freed. Expired leases stay remembered for stickiness.
    pub fn reclaim(&mut self, now: u64) -> usize {
        self.reclaims += 1;
        let expired: Vec<Ipv4Addr> = self
            .expiring
            .range(..=(now, Ipv4Addr::BROADCAST))
            .map(|(_, ip)| *ip)
            .collect();
        self.visited(expired.len());
        for ip in &expired {
            if let Some(l) = self.leases.get_mut(ip) {
                if let Some(name) = &l.hostname {
                    if self.by_hostname.get(name) == Some(ip) {
                        self.by_hostname.remove(name);
                    }
                }
                if l.state == LeaseState::Declined {
                    // Quarantine over: forget the decliner entirely.
                    let client = l.client.clone();
                    self.leases.remove(ip);
                    if self.by_client.get(&client) == Some(*ip) {
                        self.by_client.remove(&client);
                    }
                } else {
                    l.state = LeaseState::Released;
                }
            }
            self.mark(*ip);
        }
        let leases = &self.leases;
        // Names of leases that ended went above; an entry goes stale in
        // other ways too (a renamed or moved client), and those are swept
        // once the map has doubled since the last sweep.
        if self.by_hostname.len() > 2 * self.hostnames_after_sweep.max(512) {
            self.visited(self.by_hostname.len());
            self.by_hostname.retain(|name, ip| {
                leases
                    .get(ip)
                    .is_some_and(|l| l.holds(now) && l.hostname.as_deref() == Some(&**name))
            });
            self.hostnames_after_sweep = self.by_hostname.len();
        }
        self.moving_from.retain(|offered, _| {
            leases
                .get(offered)
                .is_some_and(|l| l.state == LeaseState::Offered && l.holds(now))
        });
        self.quarantined.retain(|client, ips| {
            ips.retain(|ip| {
                leases
                    .get(ip)
                    .is_some_and(|l| l.state == LeaseState::Declined && &l.client == client)
            });
            !ips.is_empty()
        });
        expired.len()
    }

    /// Notes that `record` is on its way to the store; `before` is the
    /// lease at its address before the engine changed it.
    fn track(&mut self, record: &LeaseRecord, before: Option<Lease>) {
        let IpAddr::V4(ip) = record.ip else { return };
        let entry = self.unsettled.entry(ip).or_insert(Unsettled {
            durable: before,
            in_flight: 0,
        });
        entry.in_flight += 1;
    }

    /// Told by the store whether `record` became durable. A change that
    /// never reached the disk is undone once nothing else for its address
    /// is in flight, so a failing disk does not use addresses up: a new
    /// client's address goes back to its offer (which runs out), a renewal
    /// back to the lease it renewed. Returns whether a change was undone.
    pub fn settle(&mut self, record: &LeaseRecord, durable: bool) -> bool {
        let IpAddr::V4(ip) = record.ip else {
            return false;
        };
        let Some(entry) = self.unsettled.get_mut(&ip) else {
            return false;
        };
        entry.in_flight = entry.in_flight.saturating_sub(1);
        if entry.in_flight > 0 {
            // Only a later failure needs to know what the disk has now;
            // with nothing else in flight (the usual case) the entry goes.
            if durable {
                entry.durable = Lease::from_record(record);
            }
            return false;
        }
        let Some(entry) = self.unsettled.remove(&ip) else {
            return false;
        };
        if durable || !self.leases.get(&ip).is_some_and(|l| same_change(l, record)) {
            return false;
        }
        match entry.durable {
            Some(lease) => {
                if lease.state != LeaseState::Declined && lease.state != LeaseState::Released {
                    self.by_client.insert(&lease.client, lease.ip);
                }
                self.leases.insert(ip, lease);
            }
            None => {
                self.leases.remove(&ip);
            }
        }
        self.mark(ip);
        true
    }

    /// Lease changes handed out and not yet settled.
    pub fn unsettled(&self) -> usize {
        self.unsettled.values().map(|u| u.in_flight as usize).sum()
    }

    /// Each pool's addresses by what holds them at `now`: from the counts
    /// kept as leases change, less the leases that have ended and are not
    /// yet reclaimed (the front of the expiry index).
    pub fn pool_stats(&self, now: u64) -> Vec<PoolStats> {
        let mut counts: Vec<Vec<PoolCounts>> =
            self.subnets.iter().map(|s| s.counts.clone()).collect();
        for (_, ip) in self.expiring.range(..=(now, Ipv4Addr::BROADCAST)) {
            self.visited(1);
            let Some(c) = self.counted.get(ip) else {
                continue;
            };
            for (s, counts) in self.subnets.iter().zip(&mut counts) {
                if let Some(pi) = s.pool_index(*ip) {
                    counts[pi].count(c.state, s.by_reserved_ip.contains_key(ip), false);
                }
            }
        }
        self.subnets
            .iter()
            .zip(counts)
            .flat_map(|(s, counts)| {
                s.pools.iter().zip(counts).map(move |(p, c)| PoolStats {
                    subnet: s.cfg.cidr.to_string(),
                    pool: p.range.to_string(),
                    total: p.range.len(),
                    leased: c.leased,
                    offered: c.offered,
                    declined: c.declined,
                    unavailable: c.unavailable,
                    free: p
                        .range
                        .len()
                        .saturating_sub(c.unavailable + c.held_unreserved),
                })
            })
            .collect()
    }

    /// Handles one decoded request at `now` (unix seconds).
    pub fn handle(
        &mut self,
        now: u64,
        msg: &Message,
        source: SocketAddrV4,
        ingress: &Ingress,
    ) -> Outcome {
        if msg.opcode() != Opcode::BootRequest {
            return Outcome::Ignore(Ignored::NotBootRequest);
        }
        let Some(kind) = msg.opts().msg_type() else {
            return Outcome::Ignore(Ignored::Bootp);
        };
        let client_id = match msg.opts().get(OptionCode::ClientIdentifier) {
            Some(DhcpOption::ClientIdentifier(id)) if !id.is_empty() => Some(id.as_slice()),
            _ => None,
        };
        let chaddr = msg.chaddr();
        let key = match client_id {
            Some(id) => ClientKey::new(id),
            None => ClientKey::from_hardware(u8::from(msg.htype()), chaddr),
        };
        let mut hw = [0u8; 6];
        let n = chaddr.len().min(6);
        hw[..n].copy_from_slice(&chaddr[..n]);

        let limits = self.policy.limits;
        if !self.admission.client(&limits, now, &key) {
            return Outcome::Ignore(Ignored::RateLimited);
        }
        let relayed = !msg.giaddr().is_unspecified();
        let subnet = self.select_subnet(msg, ingress);
        // On the clients' own segment anyone can set giaddr, so a relayed
        // packet there is served only from a relay of the subnet its giaddr
        // chooses: a forged giaddr cannot draw from another subnet's pool,
        // and a listed relay of one subnet cannot draw from another's.
        if relayed
            && matches!(ingress, Ingress::Interface(_))
            && !subnet.is_some_and(|si| self.subnets[si].cfg.relays_from(*source.ip()))
        {
            return Outcome::Ignore(Ignored::UnknownRelay);
        }
        if relayed && !self.admission.relay(&limits, now, *source.ip()) {
            return Outcome::Ignore(Ignored::RateLimitedRelay);
        }
        let Some(si) = subnet else {
            return Outcome::Ignore(Ignored::NoSubnet);
        };
        if !self.admission.subnet(&limits, now, si) {
            return Outcome::Ignore(Ignored::RateLimitedSubnet);
        }
        if !self.admission.global(&limits, now) {
            return Outcome::Ignore(Ignored::RateLimitedGlobal);
        }
        let facts = Facts {
            msg,
            key,
            hw,
            client_id,
            source,
        };
        match kind {
            MessageType::Discover => self.discover(now, si, &facts),
            MessageType::Request => self.request(now, si, &facts),
            MessageType::Decline => self.decline(now, si, &facts),
            MessageType::Release => self.release(now, &facts),
            MessageType::Inform => self.inform(si, &facts),
            _ => Outcome::Ignore(Ignored::UnexpectedMessageType),
        }
    }

    fn select_subnet(&self, msg: &Message, ingress: &Ingress) -> Option<usize> {
        let giaddr = msg.giaddr();
        if !giaddr.is_unspecified() {
            return self
                .subnets
                .iter()
                .position(|s| s.cfg.relay_addresses.contains(&giaddr))
                .or_else(|| {
                    self.subnets
                        .iter()
                        .position(|s| s.cfg.cidr.contains(&giaddr))
                });
        }
        if let Ingress::Interface(name) = ingress {
            return self
                .subnets
                .iter()
                .position(|s| s.cfg.interface.as_deref() == Some(name.as_str()));
        }
        let ciaddr = msg.ciaddr();
        if !ciaddr.is_unspecified() {
            return self
                .subnets
                .iter()
                .position(|s| s.cfg.cidr.contains(&ciaddr));
        }
        None
    }

    fn lease_secs(&self, si: usize) -> u32 {
        self.subnets[si]
            .cfg
            .lease_time
            .map(secs)
            .unwrap_or(self.policy.lease_secs)
    }

    /// Whether `ip` may go to this client now: nobody else holds it, it is
    /// not excluded, and it is not reserved for someone else.
    fn available_to(&self, now: u64, si: usize, ip: Ipv4Addr, f: &Facts) -> bool {
        let s = &self.subnets[si];
        if s.excluded(ip) || !s.cfg.cidr.contains(&ip) {
            return false;
        }
        if self.share.is_some_and(|share| !share.holds(ip)) {
            let keeps = self.leases.get(&ip).is_some_and(|l| {
                l.client == f.key && l.state == LeaseState::Active && l.holds(now)
            });
            let reserved = s
                .reservation_for(&f.hw, f.client_id)
                .is_some_and(|r| r.ip == ip);
            if !keeps && !reserved {
                return false;
            }
        }
        if let Some(i) = s.by_reserved_ip.get(&ip) {
            let reserved_for_client = s
                .reservation_for(&f.hw, f.client_id)
                .is_some_and(|r| std::ptr::eq(r, &s.cfg.reservations[*i]));
            if !reserved_for_client {
                return false;
            }
        } else if !s.in_pool(ip) {
            return false;
        }
        match self.leases.get(&ip) {
            None => true,
            Some(l) if l.client == f.key => l.state != LeaseState::Declined,
            Some(l) => !l.holds(now),
        }
    }

    /// Picks the address to offer: reservation, then the client's previous
    /// address, then the one it asks for, then the next free one.
    fn choose(&mut self, now: u64, si: usize, f: &Facts) -> Option<Ipv4Addr> {
        if let Some(r) = self.subnets[si].reservation_for(&f.hw, f.client_id) {
            let ip = r.ip;
            return self.available_to(now, si, ip, f).then_some(ip);
        }
        if let Some(ip) = self.by_client.get(&f.key) {
            if self.available_to(now, si, ip, f) {
                return Some(ip);
            }
        }
        if let Some(DhcpOption::RequestedIpAddress(ip)) =
            f.msg.opts().get(OptionCode::RequestedIpAddress)
        {
            if self.available_to(now, si, *ip, f) {
                return Some(*ip);
            }
        }
        for attempt in 0..2 {
            let npools = self.subnets[si].pools.len();
            for p in 0..npools {
                // The bitmap can lag behind expiries; the lease table is the
                // truth, so skip stale bits rather than trusting them.
                let mut tries = 0;
                let mut other_share = 0usize;
                let size = self.subnets[si].pools[p].capacity();
                while let Some(ip) = self.subnets[si].pools[p].next_free() {
                    if self.available_to(now, si, ip, f) {
                        return Some(ip);
                    }
                    if self.share.is_some_and(|share| !share.holds(ip)) {
                        // The peer's half: free, and not ours to give. Once
                        // round the pool at most.
                        other_share += 1;
                        if other_share > size {
                            break;
                        }
                        continue;
                    }
                    self.subnets[si].pools[p].set(ip, true);
                    tries += 1;
                    if tries > 64 {
                        break;
                    }
                }
            }
            // Once a second at most: between scans a full pool is full.
            if attempt > 0 || now < self.reclaim_not_before {
                break;
            }
            self.reclaim_not_before = now + RECLAIM_EVERY;
            if self.reclaim(now) == 0 {
                break;
            }
        }
        None
    }

    /// Records that `ip` now belongs to this client in `state` until
    /// `expires`. Returns the release record of an address the client held
    /// and has now left, when the disk had it as the client's.
    ///
    /// An offer does not move the client: it keeps the address it holds
    /// until it takes the new one (it may take another server's offer
    /// instead), so that address is released only by the ACK.
    fn bind(&mut self, now: u64, f: &Facts, lease: Lease) -> Option<LeaseRecord> {
        let (ip, state) = (lease.ip, lease.state);
        let prev = self.by_client.insert(&f.key, ip).filter(|prev| *prev != ip);
        let left = match state {
            LeaseState::Offered => {
                if let Some(prev) = prev {
                    let holds = self
                        .leases
                        .get(&prev)
                        .is_some_and(|l| l.client == f.key && l.state == LeaseState::Active);
                    if holds {
                        self.moving_from.insert(ip, prev);
                    }
                }
                None
            }
            _ => prev.or_else(|| self.moving_from.remove(&ip)),
        };
        let mut vacated = None;
        if let Some(left) = left.filter(|left| *left != ip) {
            let before = self.leases.get(&left).cloned();
            if let Some(old) = self.leases.get_mut(&left) {
                if old.client == f.key && old.state != LeaseState::Declined {
                    let was_on_disk = old.state == LeaseState::Active;
                    old.state = LeaseState::Released;
                    if was_on_disk {
                        old.expires = now;
                        vacated = Some(old.to_record());
                    }
                }
            }
            if let Some(record) = &vacated {
                self.track(record, before);
            }
            self.mark(left);
        }
        if let Some(old) = self.leases.get(&ip) {
            if old.client != f.key && self.by_client.get(&old.client) == Some(ip) {
                let other = old.client.clone();
                self.by_client.remove(&other);
            }
        }
        self.leases.insert(ip, lease);
        self.mark(ip);
        vacated
    }

    /// Binds `ip` as a change for the disk: returns its record and that of
    /// the address the client left, both tracked until settled.
    fn bind_durable(
        &mut self,
        now: u64,
        ip: Ipv4Addr,
        f: &Facts,
        state: LeaseState,
        expires: u64,
        hostname: Option<Box<str>>,
    ) -> (LeaseRecord, Option<LeaseRecord>) {
        let before = self.leases.get(&ip).cloned();
        let lease = f.lease(ip, state, expires, hostname);
        let record = lease.to_record();
        let vacated = self.bind(now, f, lease);
        self.track(&record, before);
        (record, vacated)
    }

    /// The name a lease carries into DNS: the reservation's, always; else
    /// the one the client asks for (option 12), unless a reservation names
    /// it or another client holds it now (the first holder keeps a name).
    fn hostname_for(&self, now: u64, si: usize, f: &Facts) -> Option<Box<str>> {
        if let Some(h) = self.subnets[si]
            .reservation_for(&f.hw, f.client_id)
            .and_then(|r| r.hostname.as_deref())
        {
            return Some(h.into());
        }
        let Some(DhcpOption::Hostname(h)) = f.msg.opts().get(OptionCode::Hostname) else {
            return None;
        };
        let name = sanitize_hostname(h)?;
        // `name` is lowercase already, as the set is.
        let reserved = self.reserved_names.contains(name.as_str());
        let held_by_another = self
            .by_hostname
            .get(name.as_str())
            .and_then(|ip| self.leases.get(ip))
            .is_some_and(|l| {
                l.client != f.key
                    && l.holds(now)
                    && l.hostname
                        .as_deref()
                        .is_some_and(|h| h.eq_ignore_ascii_case(&name))
            });
        (!reserved && !held_by_another).then(|| name.into())
    }

    /// Records who took a client-chosen name, for [`Self::hostname_for`].
    fn claim_hostname(&mut self, ip: Ipv4Addr) {
        if let Some(name) = self.leases.get(&ip).and_then(|l| l.hostname.clone()) {
            self.by_hostname.insert(name, ip);
        }
    }

    fn discover(&mut self, now: u64, si: usize, f: &Facts) -> Outcome {
        let Some(ip) = self.choose(now, si, f) else {
            return Outcome::Ignore(Ignored::PoolExhausted);
        };
        let rapid = self.policy.rapid_commit && f.msg.opts().get(OptionCode::RapidCommit).is_some();
        if rapid {
            return self.ack(now, si, f, ip, true);
        }
        let already_active = self
            .leases
            .get(&ip)
            .is_some_and(|l| l.client == f.key && l.state == LeaseState::Active && l.holds(now));
        if !already_active {
            let hostname = self.hostname_for(now, si, f);
            let offer = f.lease(
                ip,
                LeaseState::Offered,
                now + u64::from(self.policy.offer_secs),
                hostname,
            );
            self.bind(now, f, offer);
        }
        let lease = self.lease_secs(si);
        let reply = reply::build(
            f.msg,
            &self.subnets[si].cfg,
            self.subnets[si].reservation_for(&f.hw, f.client_id),
            MessageType::Offer,
            ip,
            Some(self.times(lease)),
            false,
        );
        Outcome::Reply {
            reply: Reply {
                destination: destination(f.msg, f.source, MessageType::Offer),
                message: reply,
            },
            commit: None,
            vacated: None,
        }
    }

    fn times(&self, lease: u32) -> reply::Times {
        reply::Times {
            lease,
            renew: self.policy.renew_secs.unwrap_or(lease / 2).min(lease),
            rebind: self
                .policy
                .rebind_secs
                .unwrap_or((u64::from(lease) * 7 / 8) as u32)
                .min(lease),
        }
    }

    fn ack(&mut self, now: u64, si: usize, f: &Facts, ip: Ipv4Addr, rapid: bool) -> Outcome {
        let lease = self.lease_secs(si);
        let hostname = self.hostname_for(now, si, f);
        let (record, vacated) = self.bind_durable(
            now,
            ip,
            f,
            LeaseState::Active,
            now + u64::from(lease),
            hostname,
        );
        self.claim_hostname(ip);
        let reply = reply::build(
            f.msg,
            &self.subnets[si].cfg,
            self.subnets[si].reservation_for(&f.hw, f.client_id),
            MessageType::Ack,
            ip,
            Some(self.times(lease)),
            rapid,
        );
        Outcome::Reply {
            reply: Reply {
                destination: destination(f.msg, f.source, MessageType::Ack),
                message: reply,
            },
            commit: Some(record),
            vacated: vacated.map(Box::new),
        }
    }

    fn nak(&self, si: usize, f: &Facts) -> Outcome {
        Outcome::Reply {
            reply: Reply {
                message: reply::nak(f.msg, self.subnets[si].cfg.server_id),
                destination: destination(f.msg, f.source, MessageType::Nak),
            },
            commit: None,
            vacated: None,
        }
    }

    fn request(&mut self, now: u64, si: usize, f: &Facts) -> Outcome {
        let opts = f.msg.opts();
        let server_id = match opts.get(OptionCode::ServerIdentifier) {
            Some(DhcpOption::ServerIdentifier(id)) => Some(*id),
            _ => None,
        };
        let requested = match opts.get(OptionCode::RequestedIpAddress) {
            Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
            _ => None,
        };
        let ciaddr = f.msg.ciaddr();
        let our_id = self.subnets[si].cfg.server_id;

        if let Some(id) = server_id {
            // SELECTING.
            if id != our_id {
                self.withdraw_offer(f);
                return Outcome::Ignore(Ignored::OtherServer);
            }
            let ip = match requested.or((!ciaddr.is_unspecified()).then_some(ciaddr)) {
                Some(ip) => ip,
                None => return Outcome::Ignore(Ignored::MissingAddress),
            };
            return if self.may_bind(now, si, ip, f) {
                self.ack(now, si, f, ip, false)
            } else {
                self.nak(si, f)
            };
        }

        // INIT-REBOOT names the address in option 50; RENEWING and
        // REBINDING in ciaddr.
        let (ip, rebooting) = match (requested, ciaddr.is_unspecified()) {
            (Some(ip), true) => (ip, true),
            (_, false) => (ciaddr, false),
            (None, true) => return Outcome::Ignore(Ignored::MissingAddress),
        };
        if !self.subnets[si].cfg.cidr.contains(&ip) {
            return self.nak(si, f);
        }
        let held_by_client = self.leases.get(&ip).is_some_and(|l| {
            l.client == f.key && matches!(l.state, LeaseState::Active | LeaseState::Offered)
        });
        if held_by_client && self.may_bind(now, si, ip, f) {
            return self.ack(now, si, f, ip, false);
        }
        let known = self.by_client.get(&f.key).is_some();
        if rebooting && !known && !self.policy.authoritative {
            return Outcome::Ignore(Ignored::NoRecord);
        }
        if self.policy.authoritative
            && self.may_bind(now, si, ip, f)
            && self.by_client.get(&f.key).is_none_or(|prev| prev == ip)
        {
            return self.ack(now, si, f, ip, false);
        }
        if self.policy.authoritative || known {
            self.nak(si, f)
        } else {
            Outcome::Ignore(Ignored::NoRecord)
        }
    }

    /// Whether the client may hold `ip`: it must be available to it, and a
    /// client with a reservation may hold only its reserved address.
    fn may_bind(&self, now: u64, si: usize, ip: Ipv4Addr, f: &Facts) -> bool {
        if let Some(r) = self.subnets[si].reservation_for(&f.hw, f.client_id) {
            if r.ip != ip {
                return false;
            }
        }
        self.available_to(now, si, ip, f)
    }

    /// The client took another server's offer: free ours at once.
    fn withdraw_offer(&mut self, f: &Facts) {
        if let Some(ip) = self.by_client.get(&f.key) {
            if let Some(l) = self.leases.get_mut(&ip) {
                if l.client == f.key && l.state == LeaseState::Offered {
                    l.state = LeaseState::Released;
                    self.mark(ip);
                }
            }
        }
    }

    fn decline(&mut self, now: u64, si: usize, f: &Facts) -> Outcome {
        let opts = f.msg.opts();
        if let Some(DhcpOption::ServerIdentifier(id)) = opts.get(OptionCode::ServerIdentifier) {
            if *id != self.subnets[si].cfg.server_id {
                return Outcome::Ignore(Ignored::OtherServer);
            }
        }
        let Some(DhcpOption::RequestedIpAddress(ip)) = opts.get(OptionCode::RequestedIpAddress)
        else {
            return Outcome::Ignore(Ignored::MissingAddress);
        };
        let ip = *ip;
        // Only an address the client was given and still holds: an offer
        // or a released lease is not the client's to quarantine.
        let active = self
            .leases
            .get(&ip)
            .is_some_and(|l| l.client == f.key && l.state == LeaseState::Active && l.holds(now));
        if !active {
            return Outcome::Ignore(Ignored::NotHeld);
        }
        let leases = &self.leases;
        let quarantined = self.quarantined.get(&f.key).map_or(0, |ips| {
            ips.iter()
                .filter(|ip| {
                    leases.get(ip).is_some_and(|l| {
                        l.client == f.key && l.state == LeaseState::Declined && l.holds(now)
                    })
                })
                .count()
        });
        if quarantined >= MAX_DECLINED_PER_CLIENT {
            return Outcome::Ignore(Ignored::DeclineLimited);
        }
        let (record, _) = self.bind_durable(
            now,
            ip,
            f,
            LeaseState::Declined,
            now + u64::from(self.policy.decline_secs),
            None,
        );
        let ips = self.quarantined.entry(f.key.clone()).or_default();
        ips.retain(|held| *held != ip);
        ips.push(ip);
        // A quarantined address must not stick to the client that declined it.
        self.by_client.remove(&f.key);
        Outcome::Commit(record)
    }

    fn release(&mut self, now: u64, f: &Facts) -> Outcome {
        let ip = f.msg.ciaddr();
        let Some(lease) = self.leases.get_mut(&ip) else {
            return Outcome::Ignore(Ignored::NotHeld);
        };
        if lease.client != f.key || lease.state != LeaseState::Active {
            return Outcome::Ignore(Ignored::NotHeld);
        }
        let before = lease.clone();
        lease.state = LeaseState::Released;
        lease.expires = now;
        let record = lease.to_record();
        self.track(&record, Some(before));
        self.mark(ip);
        Outcome::Commit(record)
    }

    fn inform(&self, si: usize, f: &Facts) -> Outcome {
        let ciaddr = f.msg.ciaddr();
        if ciaddr.is_unspecified() {
            return Outcome::Ignore(Ignored::MissingAddress);
        }
        let message = reply::build(
            f.msg,
            &self.subnets[si].cfg,
            self.subnets[si].reservation_for(&f.hw, f.client_id),
            MessageType::Ack,
            Ipv4Addr::UNSPECIFIED,
            None,
            false,
        );
        Outcome::Reply {
            reply: Reply {
                message,
                destination: destination(f.msg, f.source, MessageType::Ack),
            },
            commit: None,
            vacated: None,
        }
    }
}

/// RFC 2131 §4.1: where a server reply goes.
fn destination(req: &Message, source: SocketAddrV4, kind: MessageType) -> Destination {
    let giaddr = req.giaddr();
    if !giaddr.is_unspecified() {
        // A relay that sent from a port of its own (RFC 8357 relays, or a
        // relay on loopback sharing the host with us) gets the reply there.
        let port = if *source.ip() == giaddr {
            source.port()
        } else {
            SERVER_PORT
        };
        return Destination::Unicast(SocketAddrV4::new(giaddr, port));
    }
    if kind == MessageType::Nak {
        return Destination::Broadcast;
    }
    let ciaddr = req.ciaddr();
    if !ciaddr.is_unspecified() {
        return Destination::Unicast(SocketAddrV4::new(ciaddr, CLIENT_PORT));
    }
    // Unicast to an address the client does not have yet needs an ARP entry
    // we cannot add without CAP_NET_ADMIN; RFC 2131 allows broadcast instead.
    Destination::Broadcast
}

pub(crate) fn sanitize_hostname(name: &str) -> Option<String> {
    let label = name.split('.').next()?.to_ascii_lowercase();
    valid_label(&label, NameRules::HOST).then_some(label)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
