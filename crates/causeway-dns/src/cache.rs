//! The forwarding cache: upstream responses kept as wire bytes, with the
//! position of every TTL, so a hit is a copy and a few patches rather than
//! a parse and a re-encode.
//!
//! Pure: the caller passes the time in seconds.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use causeway_config::CacheConfig;
// Keys are names clients chose: the hasher is seeded per process.
use foldhash::HashMap;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::message::ParsedQuery;

/// TTL of a stale answer (RFC 8767 §4 recommends 30 seconds).
pub const STALE_TTL: u32 = 30;
/// How long past expiry an entry may still be served stale.
pub const STALE_WINDOW: u64 = 3600;

/// A query's identity for caching: type, class, EDNS flags and lowercased
/// name, as bytes (see [`crate::fastpath`]).
pub type CacheKey = Vec<u8>;

/// The cache key of a query read by the full parser.
pub fn key_of(q: &ParsedQuery) -> CacheKey {
    crate::fastpath::key_of(q)
}

struct Entry {
    wire: Box<[u8]>,
    ttl_offsets: Box<[u32]>,
    ttls: Box<[u32]>,
    stored: u64,
    expires: u64,
    /// Its place in [`Entries::by_expiry`], with `expires`.
    seq: u64,
}

pub enum Hit {
    Fresh(Vec<u8>),
    Stale(Vec<u8>),
    Miss,
}

/// What a response on the wire says about caching it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub rcode: ResponseCode,
    pub truncated: bool,
    /// (offset, ttl) of every record's TTL, OPT excluded.
    pub ttls: Vec<(u32, u32)>,
    pub answers: u16,
    /// The SOA's own TTL and minimum, from the authority section.
    pub soa: Option<(u32, u32)>,
}

fn skip_name(wire: &[u8], mut at: usize) -> Option<usize> {
    // At most 128 labels fit in 255 bytes; bound the walk regardless.
    for _ in 0..128 {
        let len = *wire.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xC0 == 0xC0 => return (at + 2 <= wire.len()).then_some(at + 2),
            l if l & 0xC0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
    None
}

fn u16_at(wire: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*wire.get(at)?, *wire.get(at + 1)?]))
}

fn u32_at(wire: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes([
        *wire.get(at)?,
        *wire.get(at + 1)?,
        *wire.get(at + 2)?,
        *wire.get(at + 3)?,
    ]))
}

/// Walks a response without decoding it. `None` when it is malformed.
pub fn shape(wire: &[u8]) -> Option<Shape> {
    let flags = u16_at(wire, 2)?;
    let counts: Vec<u16> = (0..4)
        .map(|i| u16_at(wire, 4 + 2 * i))
        .collect::<Option<_>>()?;
    let mut at = 12;
    for _ in 0..counts[0] {
        at = skip_name(wire, at)? + 4;
    }
    let mut ttls = Vec::new();
    let mut soa = None;
    let (answers, authority) = (counts[1], counts[2]);
    let total = u32::from(counts[1]) + u32::from(counts[2]) + u32::from(counts[3]);
    for i in 0..total {
        at = skip_name(wire, at)?;
        let rtype = u16_at(wire, at)?;
        let ttl = u32_at(wire, at + 4)?;
        let rdlen = usize::from(u16_at(wire, at + 8)?);
        let rdata_end = at + 10 + rdlen;
        if rdata_end > wire.len() {
            return None;
        }
        if rtype != u16::from(RecordType::OPT) {
            ttls.push((u32::try_from(at + 4).ok()?, ttl));
        }
        let in_authority = i >= u32::from(answers) && i < u32::from(answers) + u32::from(authority);
        if in_authority && rtype == u16::from(RecordType::SOA) && rdlen >= 20 {
            // The SOA minimum is the last field of its data.
            soa = Some((ttl, u32_at(wire, rdata_end - 4)?));
        }
        at = rdata_end;
    }
    Some(Shape {
        rcode: ResponseCode::from(0, (flags & 0x0f) as u8),
        truncated: flags & 0x0200 != 0,
        ttls,
        answers,
        soa,
    })
}

/// What one entry costs beyond its bytes: the entry, its key's and slices'
/// headers and allocations, the map's slot, its place in the expiry index
/// (a node's share included), and the allocator's rounding.
const ENTRY_OVERHEAD: usize = 224;

fn cost(key: &[u8], wire: &[u8], ttls: usize) -> usize {
    ENTRY_OVERHEAD + key.len() + wire.len() + 8 * ttls
}

#[derive(Default)]
struct Entries {
    /// The key is shared with `by_expiry`, so it is held once.
    map: HashMap<Arc<[u8]>, Entry>,
    /// Every entry by when it expires, then by when it was stored (which
    /// keeps entries of the same second apart): eviction takes from the
    /// front, and so costs what it removes rather than a walk of the whole
    /// map with the write lock held, which stalled every reader.
    by_expiry: BTreeMap<(u64, u64), Arc<[u8]>>,
    /// Entries stored so far, which numbers each.
    inserted: u64,
    /// The sum of every entry's [`cost`].
    bytes: usize,
    #[cfg(test)]
    sweep: Sweep,
}

/// What evictions have done so far: entries looked at, and removed.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sweep {
    examined: usize,
    evicted: usize,
}

impl Entries {
    fn add(&mut self, key: Arc<[u8]>, mut entry: Entry) {
        self.inserted += 1;
        entry.seq = self.inserted;
        self.bytes += cost(&key, &entry.wire, entry.ttls.len());
        self.by_expiry
            .insert((entry.expires, entry.seq), Arc::clone(&key));
        self.map.insert(key, entry);
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some((k, e)) = self.map.remove_entry(key) {
            self.by_expiry.remove(&(e.expires, e.seq));
            self.bytes -= cost(&k, &e.wire, e.ttls.len());
        }
    }

    /// When the entry that expires first does, if there is one.
    fn first_expiry(&mut self) -> Option<u64> {
        #[cfg(test)]
        {
            self.sweep.examined += 1;
        }
        self.by_expiry.first_key_value().map(|(&(at, _), _)| at)
    }

    /// Removes the entry that expires first; false when there is none.
    fn remove_first(&mut self) -> bool {
        let Some((_, key)) = self.by_expiry.pop_first() else {
            return false;
        };
        if let Some((k, e)) = self.map.remove_entry(&key) {
            self.bytes -= cost(&k, &e.wire, e.ttls.len());
        }
        #[cfg(test)]
        {
            self.sweep.examined += 1;
            self.sweep.evicted += 1;
        }
        true
    }
}

pub struct Cache {
    cfg: CacheConfig,
    entries: RwLock<Entries>,
}

impl Cache {
    pub fn new(cfg: CacheConfig) -> Self {
        Cache {
            cfg,
            entries: RwLock::new(Entries::default()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Entries> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.read().map.len()
    }

    /// What the entries hold, as counted against `maxBytes`.
    pub fn bytes(&self) -> usize {
        self.read().bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the cached response with its TTLs counted down, or, past
    /// expiry but within the stale window, with [`STALE_TTL`]. The caller
    /// patches in the ID and question.
    pub fn get(&self, key: &[u8], now: u64, allow_stale: bool) -> Hit {
        let entries = self.read();
        let Some(e) = entries.map.get(key) else {
            return Hit::Miss;
        };
        let fresh = now < e.expires;
        let stale_ok = allow_stale && self.cfg.serve_stale && now < e.expires + STALE_WINDOW;
        if !(fresh || stale_ok) {
            return Hit::Miss;
        }
        let elapsed = u32::try_from(now.saturating_sub(e.stored)).unwrap_or(u32::MAX);
        let mut wire = e.wire.to_vec();
        for (off, ttl) in e.ttl_offsets.iter().zip(e.ttls.iter()) {
            let value = if fresh {
                ttl.saturating_sub(elapsed)
            } else {
                STALE_TTL
            };
            let at = *off as usize;
            if let Some(slot) = wire.get_mut(at..at + 4) {
                slot.copy_from_slice(&value.to_be_bytes());
            }
        }
        if fresh {
            Hit::Fresh(wire)
        } else {
            Hit::Stale(wire)
        }
    }

    /// Stores a response if it is cacheable: NOERROR with answers (for the
    /// smallest TTL among them), or a negative answer with an SOA (for the
    /// SOA's TTL or minimum, whichever is smaller, RFC 2308), and no larger
    /// than `maxEntryBytes`. Returns the TTL it was stored for.
    pub fn insert(&self, key: CacheKey, wire: &[u8], now: u64) -> Option<u32> {
        if wire.len() > self.cfg.max_entry_bytes {
            return None;
        }
        let s = shape(wire)?;
        if s.truncated {
            return None;
        }
        let max = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        let ttl = match s.rcode {
            ResponseCode::NoError if s.answers > 0 => {
                let min = s
                    .ttls
                    .iter()
                    .take(usize::from(s.answers))
                    .map(|(_, t)| *t)
                    .min()?;
                min.min(max(self.cfg.max_ttl))
            }
            ResponseCode::NoError | ResponseCode::NXDomain => {
                let (soa_ttl, minimum) = s.soa?;
                soa_ttl.min(minimum).min(max(self.cfg.max_negative_ttl))
            }
            _ => return None,
        };
        if ttl == 0 {
            return None;
        }
        let needs = cost(&key, wire, s.ttls.len());
        let key: Arc<[u8]> = Arc::from(key);
        let mut entries = self.write();
        entries.remove(&key);
        if entries.map.len() >= self.cfg.max_entries || entries.bytes + needs > self.cfg.max_bytes {
            evict(&mut entries, now, &self.cfg, needs);
        }
        let (offsets, ttls): (Vec<u32>, Vec<u32>) = s.ttls.into_iter().unzip();
        let mut stored = wire.to_vec();
        if stored.len() >= 2 {
            stored[0] = 0;
            stored[1] = 0;
        }
        entries.add(
            key,
            Entry {
                wire: stored.into_boxed_slice(),
                ttl_offsets: offsets.into_boxed_slice(),
                ttls: ttls.into_boxed_slice(),
                stored: now,
                expires: now + u64::from(ttl),
                seq: 0,
            },
        );
        Some(ttl)
    }
}

/// Makes room for an entry of `needs` bytes: first everything past its
/// stale window, then, while the cache is still over either bound, the
/// entries that expire soonest (so those kept only to be served stale
/// first) down to fifteen sixteenths of it, so the next inserts do not
/// each pay for an eviction. It looks only at the front of the expiry
/// index: at most twice per entry it removes, and once more.
fn evict(entries: &mut Entries, now: u64, cfg: &CacheConfig, needs: usize) {
    while entries
        .first_expiry()
        .is_some_and(|at| at.saturating_add(STALE_WINDOW) <= now)
    {
        entries.remove_first();
    }
    let max_entries = cfg.max_entries - cfg.max_entries / 16;
    let max_bytes = (cfg.max_bytes - cfg.max_bytes / 16).saturating_sub(needs);
    if entries.map.len() < cfg.max_entries && entries.bytes + needs <= cfg.max_bytes {
        return;
    }
    while entries.map.len() >= max_entries.max(1) || entries.bytes > max_bytes {
        if !entries.remove_first() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, Query};
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::{Name, RData, Record};
    use std::time::Duration;

    fn cfg(max_entries: usize) -> CacheConfig {
        CacheConfig {
            max_entries,
            max_bytes: 64 << 20,
            max_entry_bytes: 8192,
            max_ttl: Duration::from_secs(3600),
            max_negative_ttl: Duration::from_secs(300),
            serve_stale: true,
        }
    }

    fn key(name: &str) -> CacheKey {
        name.to_ascii_lowercase().into_bytes()
    }

    fn response(name: &str, ttl: u32, rcode: ResponseCode) -> Vec<u8> {
        let n = Name::from_ascii(name).unwrap();
        let mut m = Message::new();
        m.set_id(7)
            .set_message_type(MessageType::Response)
            .set_response_code(rcode);
        m.add_query(Query::query(n.clone(), RecordType::A));
        if rcode == ResponseCode::NoError && ttl > 0 {
            m.add_answer(Record::from_rdata(
                n.clone(),
                ttl,
                RData::A(A::new(10, 0, 0, 1)),
            ));
            m.add_answer(Record::from_rdata(
                n,
                ttl + 100,
                RData::A(A::new(10, 0, 0, 2)),
            ));
        } else {
            let zone = Name::from_ascii("example.net.").unwrap();
            let soa = SOA::new(zone.clone(), zone.clone(), 1, 1, 1, 1, 60);
            m.add_name_server(Record::from_rdata(zone, 120, RData::SOA(soa)));
        }
        m.to_vec().unwrap()
    }

    fn ttls(wire: &[u8]) -> Vec<u32> {
        Message::from_vec(wire)
            .unwrap()
            .all_sections()
            .map(|r| r.ttl())
            .collect()
    }

    #[test]
    fn a_hit_counts_ttls_down_from_the_smallest() {
        let c = Cache::new(cfg(100));
        assert_eq!(
            c.insert(
                key("a.example.net."),
                &response("a.example.net.", 300, ResponseCode::NoError),
                1000
            ),
            Some(300)
        );
        match c.get(&key("A.example.net."), 1010, false) {
            Hit::Fresh(w) => assert_eq!(ttls(&w), vec![290, 390]),
            _ => panic!("expected a fresh hit"),
        }
        assert!(matches!(
            c.get(&key("a.example.net."), 1300, false),
            Hit::Miss
        ));
    }

    #[test]
    fn negative_answers_are_cached_for_the_soa_minimum() {
        let c = Cache::new(cfg(100));
        let nx = response("nx.example.net.", 0, ResponseCode::NXDomain);
        assert_eq!(c.insert(key("nx.example.net."), &nx, 0), Some(60));
        assert!(matches!(
            c.get(&key("nx.example.net."), 59, false),
            Hit::Fresh(_)
        ));
        assert!(matches!(
            c.get(&key("nx.example.net."), 61, false),
            Hit::Miss
        ));
        assert_eq!(
            c.insert(
                key("sf.example.net."),
                &response("sf.example.net.", 0, ResponseCode::ServFail),
                0
            ),
            None
        );
    }

    #[test]
    fn stale_answers_are_served_only_when_asked_and_within_the_window() {
        let c = Cache::new(cfg(100));
        c.insert(
            key("a.example.net."),
            &response("a.example.net.", 10, ResponseCode::NoError),
            0,
        );
        assert!(matches!(
            c.get(&key("a.example.net."), 20, false),
            Hit::Miss
        ));
        match c.get(&key("a.example.net."), 20, true) {
            Hit::Stale(w) => assert_eq!(ttls(&w), vec![STALE_TTL, STALE_TTL]),
            _ => panic!("expected a stale hit"),
        }
        assert!(matches!(
            c.get(&key("a.example.net."), 10 + STALE_WINDOW + 1, true),
            Hit::Miss
        ));
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let c = Cache::new(cfg(64));
        for i in 0..1000 {
            let n = format!("h{i}.example.net.");
            c.insert(key(&n), &response(&n, 300, ResponseCode::NoError), 0);
            assert!(c.len() <= 64);
        }
    }

    /// A NOERROR answer of `records` TXT records of 200 bytes each.
    fn large_response(name: &str, records: usize) -> Vec<u8> {
        use hickory_proto::rr::rdata::TXT;
        let n = Name::from_ascii(name).unwrap();
        let mut m = Message::new();
        m.set_id(7).set_message_type(MessageType::Response);
        m.add_query(Query::query(n.clone(), RecordType::TXT));
        for i in 0..records {
            let text = format!("{i:0>200}");
            m.add_answer(Record::from_rdata(
                n.clone(),
                300,
                RData::TXT(TXT::new(vec![text])),
            ));
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn the_cache_stays_within_its_byte_budget_whatever_the_answers_weigh() {
        let mut config = cfg(1_000_000);
        config.max_bytes = 1 << 20;
        let c = Cache::new(config);
        let mut largest = 0;
        for i in 0..2000 {
            let n = format!("big{i}.example.net.");
            let wire = large_response(&n, 35);
            largest = largest.max(wire.len());
            assert!(
                c.insert(key(&n), &wire, 0).is_some(),
                "{} bytes",
                wire.len()
            );
            assert!(c.bytes() <= 1 << 20, "{} bytes held after {i}", c.bytes());
        }
        assert!(largest > 7000);
        // Most of the budget stays in use: eviction is not wholesale.
        assert!(c.bytes() > (1 << 20) / 2, "{}", c.bytes());
        // The count follows removals and replacements exactly.
        let n = "big1999.example.net.";
        let before = c.bytes();
        c.insert(key(n), &large_response(n, 35), 1);
        assert_eq!(c.bytes(), before);
    }

    #[test]
    fn an_eviction_examines_about_as_many_entries_as_it_evicts() {
        const FULL: usize = 100_000;
        let c = Cache::new(cfg(FULL));
        // Sixteen lifetimes, from one minute to sixteen.
        let answers: Vec<Vec<u8>> = (1..=16)
            .map(|m| response("a.example.net.", 60 * m, ResponseCode::NoError))
            .collect();
        let sweep = || c.read().sweep;
        let mut evictions = 0;
        let mut insert = |i: usize, now: u64| {
            let before = sweep();
            let ttl = c.insert(format!("h{i}").into_bytes(), &answers[i % 16], now);
            assert!(ttl.is_some());
            let after = sweep();
            let (examined, evicted) = (
                after.examined - before.examined,
                after.evicted - before.evicted,
            );
            if evicted > 0 {
                evictions += 1;
                assert!(
                    examined <= 2 * evicted + 2,
                    "insert {i}: {examined} entries examined to evict {evicted}"
                );
            }
            assert!(c.len() <= FULL);
        };
        for i in 0..FULL {
            insert(i, 0);
        }
        // Full: inserts evict while everything is fresh, then once the
        // shortest-lived sixteenth is past its stale window.
        for i in FULL..FULL + FULL / 8 {
            insert(i, 0);
        }
        let later = 60 + STALE_WINDOW;
        for i in FULL + FULL / 8..FULL + FULL / 4 {
            insert(i, later);
        }
        assert!(evictions >= 3, "{evictions} evictions");
    }

    #[test]
    fn eviction_takes_the_dead_first_then_the_soonest_to_expire() {
        let c = Cache::new(cfg(16));
        let name = |i: usize| format!("h{i}.example.net.");
        let insert = |i: usize, ttl: u32, now: u64| {
            let n = name(i);
            c.insert(key(&n), &response(&n, ttl, ResponseCode::NoError), now)
        };
        let held = |i: usize, now: u64| !matches!(c.get(&key(&name(i)), now, true), Hit::Miss);
        // Entry i lives i + 1 minutes, stored in no particular order.
        for i in [7, 3, 0, 12, 15, 1, 9, 4, 14, 2, 11, 6, 13, 5, 10, 8] {
            assert!(insert(i, 60 * (i as u32 + 1), 0).is_some());
        }
        // Full, and nothing dead: the two that expire soonest make room.
        insert(16, 3600, 0);
        assert!(!held(0, 0) && !held(1, 0));
        assert!((2..=16).all(|i| held(i, 0)));
        assert_eq!(c.len(), 15);
        // Once entry 2 is past its stale window, it is all that goes: the
        // rest, entry 3 (stale but servable) too, are kept.
        let later = 180 + STALE_WINDOW;
        insert(17, 3600, later);
        insert(18, 3600, later);
        assert!(!held(2, later));
        assert!((3..=18).all(|i| held(i, later)));
        assert_eq!(c.len(), 16);
    }

    #[test]
    fn oversized_answers_are_not_cached() {
        let c = Cache::new(cfg(100));
        let huge = large_response("huge.example.net.", 60);
        assert!(huge.len() > 8192);
        assert_eq!(c.insert(key("huge.example.net."), &huge, 0), None);
        assert_eq!((c.len(), c.bytes()), (0, 0));
    }

    #[test]
    fn malformed_responses_are_not_cached_and_never_panic() {
        let c = Cache::new(cfg(10));
        let good = response("a.example.net.", 300, ResponseCode::NoError);
        for cut in 0..good.len() {
            let _ = shape(&good[..cut]);
            assert_eq!(
                c.insert(key("a.example.net."), &good[..cut], 0),
                None,
                "cut at {cut}"
            );
        }
        // A compression pointer loop is bounded.
        let mut looped = good.clone();
        looped[12] = 0xC0;
        looped[13] = 12;
        let _ = shape(&looped);
    }
}
