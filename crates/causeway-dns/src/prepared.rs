//! Prepared answers, the per-socket fast path. Each UDP task keeps the
//! answers it built lately, keyed by the query's bytes (see
//! [`crate::fastpath`]), and serves a repeat with one hash lookup and a
//! copy: no lock, no parse, no allocation. Names that are forwarded are remembered as such, so a repeat
//! goes straight to the forwarding cache. Query counts are kept locally and
//! added to the shared metrics once a second.

use std::net::IpAddr;
use std::sync::Arc;

// Keys are query bytes a client chose: the hasher is seeded per process.
use foldhash::{HashMap, HashMapExt};
use hickory_proto::rr::{LowerName, Name, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};

use crate::authority::Authority;
use crate::cache::Hit;
use crate::fastpath::{self, Question};
use crate::message;
use crate::metrics::{qtype_label, rcode_label};
use crate::responder::{Responder, Step};

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

/// An answer that serves every name under a uniform wildcard: its header
/// and everything after the question, which refers to the question only by
/// a pointer to it (so any question can be put in front).
struct Template {
    header: [u8; 12],
    tail: Vec<u8>,
    made: u64,
}

pub struct Prepared {
    /// The key of the last query the fast path read: query key, then view
    /// and recursion permission.
    key: Vec<u8>,
    query_key_len: usize,
    read: Option<Question>,
    out: Vec<u8>,
    auth: Arc<Authority>,
    generation: u64,
    entries: HashMap<Vec<u8>, Entry>,
    templates: HashMap<Vec<u8>, Template>,
    probe: Vec<u8>,
    view: usize,
    counts: HashMap<(usize, u16, u8), u64>,
    cache_hits: u64,
    uncounted: u32,
}

impl Prepared {
    pub fn new(responder: &Responder) -> Self {
        Prepared {
            key: Vec::with_capacity(fastpath::KEY_PREFIX + fastpath::MAX_NAME + 3),
            query_key_len: 0,
            read: None,
            out: Vec::with_capacity(1500),
            auth: responder.authority(),
            generation: responder.generation(),
            entries: HashMap::new(),
            templates: HashMap::new(),
            probe: Vec::with_capacity(fastpath::KEY_PREFIX + fastpath::MAX_NAME + 3),
            view: 0,
            counts: HashMap::new(),
            cache_hits: 0,
            uncounted: 0,
        }
    }

    fn refresh(&mut self, responder: &Responder) {
        let generation = responder.generation();
        if generation != self.generation {
            self.generation = generation;
            self.auth = responder.authority();
            self.entries.clear();
            self.templates.clear();
        }
    }

    /// The response to `request`, if a prepared answer, a wildcard template
    /// or a fresh forwarded answer serves it.
    pub fn answer(
        &mut self,
        responder: &Responder,
        request: &[u8],
        client: IpAddr,
        now: u64,
    ) -> Option<&[u8]> {
        self.read = fastpath::read(request, &mut self.key);
        let q = self.read?;
        self.refresh(responder);
        let view = self.auth.view_for(client);
        let recurse = self.auth.may_recurse(client);
        self.view = view;
        self.query_key_len = self.key.len();
        self.key.extend_from_slice(&(view as u16).to_be_bytes());
        self.key.push(u8::from(recurse));
        self.out.clear();
        if !(self.serve_entry(responder, &q, now) || self.serve_template(&q, request, now)) {
            return None;
        }
        if !fastpath::patch(&mut self.out, &q, request) {
            return None;
        }
        let rcode = self.out.get(3).map_or(0, |b| b & 0x0f);
        self.count(responder, view, q.qtype, rcode);
        Some(&self.out)
    }

    fn serve_entry(&mut self, responder: &Responder, q: &Question, now: u64) -> bool {
        let Some(entry) = self
            .entries
            .get(&self.key)
            .filter(|e| now < e.made + PREPARED_SECS)
        else {
            return false;
        };
        match &entry.kind {
            Kind::Local(wire) if wire.len() <= q.udp_limit() => {
                self.out.extend_from_slice(wire);
                true
            }
            Kind::Forward => {
                let Some(fwd) = responder.forwarder.as_ref() else {
                    return false;
                };
                let Hit::Fresh(wire) = fwd.cache.get(&self.key[..self.query_key_len], now, false)
                else {
                    return false;
                };
                if wire.len() > q.udp_limit() {
                    return false;
                }
                self.out.extend_from_slice(&wire);
                message::mark_forwarded(&mut self.out);
                self.cache_hits += 1;
                true
            }
            Kind::Local(_) => false,
        }
    }

    /// Tries the templates of the name's ancestors, nearest first.
    fn serve_template(&mut self, q: &Question, request: &[u8], now: u64) -> bool {
        if self.templates.is_empty() {
            return false;
        }
        let prefix = fastpath::KEY_PREFIX;
        let name = &self.key[prefix..self.query_key_len];
        let suffix = &self.key[self.query_key_len..];
        let mut at = usize::from(name.first().copied().unwrap_or(0)) + 1;
        while at < name.len() && name[at] != 0 {
            self.probe.clear();
            self.probe.extend_from_slice(&self.key[..prefix]);
            self.probe.extend_from_slice(&name[at..]);
            self.probe.extend_from_slice(suffix);
            if let Some(t) = self
                .templates
                .get(&self.probe)
                .filter(|t| now < t.made + PREPARED_SECS)
            {
                let question = request.get(12..q.question_end).unwrap_or_default();
                if 12 + question.len() + t.tail.len() > q.udp_limit() {
                    return false;
                }
                self.out.extend_from_slice(&t.header);
                self.out.extend_from_slice(question);
                self.out.extend_from_slice(&t.tail);
                return true;
            }
            at += usize::from(name[at]) + 1;
        }
        false
    }

    /// Remembers what the full path decided for the query the fast path
    /// last read, so its repeats take the fast path.
    pub fn learn(&mut self, step: &Step, now: u64) {
        let Some(q) = self.read else { return };
        if let Step::Reply {
            wire,
            reusable: true,
        } = step
        {
            self.learn_template(wire, &q, now);
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

    /// Keeps `wire` as a template when its name lies under a uniform
    /// wildcard and nothing after its question depends on the question's
    /// length.
    fn learn_template(&mut self, wire: &[u8], q: &Question, now: u64) {
        if !template_shape(wire, q.question_end) {
            return;
        }
        let prefix = fastpath::KEY_PREFIX;
        let Ok(name) = Name::from_bytes(&self.key[prefix..self.query_key_len]) else {
            return;
        };
        let Some(parent) = self
            .auth
            .uniform_wildcard(self.view, &LowerName::from(name))
        else {
            return;
        };
        let Ok(parent_wire) = Name::from(&parent).to_bytes() else {
            return;
        };
        let mut key = Vec::with_capacity(prefix + parent_wire.len() + 3);
        key.extend_from_slice(&self.key[..prefix]);
        key.extend(parent_wire.iter().map(u8::to_ascii_lowercase));
        key.extend_from_slice(&self.key[self.query_key_len..]);
        let mut header = [0u8; 12];
        header.copy_from_slice(&wire[..12]);
        if self.templates.len() >= PREPARED_MAX {
            self.templates.clear();
        }
        self.templates.insert(
            key,
            Template {
                header,
                tail: wire[q.question_end..].to_vec(),
                made: now,
            },
        );
    }

    fn count(&mut self, responder: &Responder, view: usize, qtype: u16, rcode: u8) {
        *self.counts.entry((view, qtype, rcode)).or_insert(0) += 1;
        self.uncounted += 1;
        if self.uncounted >= FLUSH_EVERY {
            self.flush(responder);
        }
    }

    /// Adds the locally kept counts to the shared metrics.
    pub fn flush(&mut self, responder: &Responder) {
        for ((view, qtype, rcode), n) in self.counts.drain() {
            let rcode = hickory_proto::op::ResponseCode::from(0, rcode);
            responder
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
            responder
                .metrics
                .cache
                .with_label_values(&["hit"])
                .inc_by(self.cache_hits);
            self.cache_hits = 0;
        }
        self.uncounted = 0;
    }
}

/// Whether every record after the question names its owner by a pointer to
/// the question (or is the root-owned OPT) and carries no names in its
/// data: then the bytes after the question serve any question.
fn template_shape(wire: &[u8], question_end: usize) -> bool {
    let count = |at: usize| {
        wire.get(at..at + 2)
            .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    };
    if wire.len() < 12 || count(8) != 0 {
        return false;
    }
    let records = count(6) + count(10);
    let mut at = question_end;
    for _ in 0..records {
        let owner_len = match wire.get(at..at + 2) {
            Some([0xC0, 0x0C]) => 2,
            Some([0x00, _]) => 1,
            _ => return false,
        };
        at += owner_len;
        let rtype = count(at);
        if ![1, 28, 41].contains(&rtype) {
            return false;
        }
        at += 10 + count(at + 8);
    }
    at == wire.len()
}
