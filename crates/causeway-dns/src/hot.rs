//! The per-socket fast path. Each UDP task keeps the answers it built
//! lately, keyed by the query's bytes (see [`crate::fastpath`]), and serves
//! a repeat with one hash lookup and a copy: no lock, no parse, no
//! allocation. Names that are forwarded are remembered as such, so a repeat
//! goes straight to the forwarding cache. Query counts are kept locally and
//! added to the shared metrics once a second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::RecordType;

use crate::authority::Authority;
use crate::cache::Hit;
use crate::fastpath::{self, Question};
use crate::message;
use crate::metrics::{qtype_label, rcode_label};
use crate::server::{Shared, Step};

/// How long a prepared answer is reused; bounds how late a DHCP name that
/// expired (rather than being released) keeps answering.
pub const PREPARED_SECS: u64 = 5;
/// Entries kept at most per socket; wildcards can name without end.
const PREPARED_MAX: usize = 16_384;
/// Counts kept locally before they are added to the shared metrics.
const FLUSH_EVERY: u32 = 4096;

enum Kind {
    Local(Vec<u8>),
    Forward,
}

struct Entry {
    kind: Kind,
    made: u64,
}

pub struct Hot {
    /// The key of the last query the fast path read: query key, then view
    /// and recursion permission.
    key: Vec<u8>,
    query_key_len: usize,
    read: Option<Question>,
    out: Vec<u8>,
    auth: Arc<Authority>,
    generation: u64,
    entries: HashMap<Vec<u8>, Entry>,
    counts: HashMap<(usize, u16, u8), u64>,
    cache_hits: u64,
    uncounted: u32,
}

impl Hot {
    pub fn new(shared: &Shared) -> Self {
        Hot {
            key: Vec::with_capacity(fastpath::KEY_PREFIX + fastpath::MAX_NAME + 3),
            query_key_len: 0,
            read: None,
            out: Vec::with_capacity(1500),
            auth: shared.authority(),
            generation: shared.generation(),
            entries: HashMap::new(),
            counts: HashMap::new(),
            cache_hits: 0,
            uncounted: 0,
        }
    }

    fn refresh(&mut self, shared: &Shared) {
        let generation = shared.generation();
        if generation != self.generation {
            self.generation = generation;
            self.auth = shared.authority();
            self.entries.clear();
        }
    }

    /// The response to `request`, if a prepared answer or a fresh forwarded
    /// one serves it.
    pub fn answer(
        &mut self,
        shared: &Shared,
        request: &[u8],
        client: IpAddr,
        now: u64,
    ) -> Option<&[u8]> {
        self.read = fastpath::read(request, &mut self.key);
        let q = self.read?;
        self.refresh(shared);
        let view = self.auth.view_for(client);
        let recurse = self.auth.may_recurse(client);
        self.query_key_len = self.key.len();
        self.key.extend_from_slice(&(view as u16).to_be_bytes());
        self.key.push(u8::from(recurse));
        let entry = self
            .entries
            .get(&self.key)
            .filter(|e| now < e.made + PREPARED_SECS)?;
        self.out.clear();
        match &entry.kind {
            Kind::Local(wire) if wire.len() <= q.udp_limit() => self.out.extend_from_slice(wire),
            Kind::Forward => {
                let fwd = shared.forwarder.as_ref()?;
                let Hit::Fresh(wire) = fwd.cache.get(&self.key[..self.query_key_len], now, false)
                else {
                    return None;
                };
                if wire.len() > q.udp_limit() {
                    return None;
                }
                self.out.extend_from_slice(&wire);
                message::mark_forwarded(&mut self.out);
                self.cache_hits += 1;
            }
            Kind::Local(_) => return None,
        }
        if !fastpath::patch(&mut self.out, &q, request) {
            return None;
        }
        let rcode = self.out.get(3).map_or(0, |b| b & 0x0f);
        self.count(shared, view, q.qtype, rcode);
        Some(&self.out)
    }

    /// Remembers what the full path decided for the query the fast path
    /// last read, so its repeats take the fast path.
    pub fn learn(&mut self, step: &Step, now: u64) {
        if self.read.is_none() {
            return;
        }
        let kind = match step {
            Step::Reply {
                wire,
                reusable: true,
            } => Kind::Local(wire.clone()),
            Step::Forward(..) => Kind::Forward,
            _ => return,
        };
        if self.entries.len() >= PREPARED_MAX {
            self.entries.clear();
        }
        self.entries
            .insert(self.key.clone(), Entry { kind, made: now });
    }

    fn count(&mut self, shared: &Shared, view: usize, qtype: u16, rcode: u8) {
        *self.counts.entry((view, qtype, rcode)).or_insert(0) += 1;
        self.uncounted += 1;
        if self.uncounted >= FLUSH_EVERY {
            self.flush(shared);
        }
    }

    /// Adds the locally kept counts to the shared metrics.
    pub fn flush(&mut self, shared: &Shared) {
        for ((view, qtype, rcode), n) in self.counts.drain() {
            let rcode = hickory_proto::op::ResponseCode::from(0, rcode);
            shared
                .metrics
                .queries
                .with_label_values(&[
                    self.auth.view_name(view),
                    qtype_label(RecordType::from(qtype)),
                    rcode_label(Some(rcode)),
                ])
                .inc_by(n);
        }
        if self.cache_hits > 0 {
            shared
                .metrics
                .cache
                .with_label_values(&["hit"])
                .inc_by(self.cache_hits);
            self.cache_hits = 0;
        }
        self.uncounted = 0;
    }
}
