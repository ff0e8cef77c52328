//! The common query, read without allocating: one question with an
//! uncompressed name, no answer or authority records, at most an OPT record.
//! Anything else is left to the full parser in [`crate::message`].
//!
//! What it yields is a byte key (type, class, EDNS flags, lowercased name)
//! under which prepared local answers and cached upstream answers are
//! found, so a repeated query is served with one hash lookup and a copy.

use crate::wire::{self, Edns};

/// Longest name on the wire.
pub const MAX_NAME: usize = 255;
/// Bytes of key ahead of the name.
pub const KEY_PREFIX: usize = 5;

const FLAG_EDNS: u8 = 1;
const FLAG_DO: u8 = 2;
const FLAG_CD: u8 = 4;

/// What the fast path needs of a query. The name itself stays in the
/// caller's key buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    pub recursion_desired: bool,
    pub qtype: u16,
    /// End of the question in the request: the span `12..question_end` is
    /// copied into a prepared answer to give it the asker's letter case.
    pub question_end: usize,
    pub edns: Option<Edns>,
}

impl Question {
    /// The largest UDP response this client takes.
    pub fn udp_limit(&self) -> usize {
        wire::udp_limit(self.edns)
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Reads `request` if it is a plain query, writing its cache key (type,
/// class, flags, lowercased wire name) into `key`. `None` sends the query
/// down the full parser.
pub fn read(request: &[u8], key: &mut Vec<u8>) -> Option<Question> {
    if request.len() < 12 {
        return None;
    }
    let flags = u16_at(request, 2)?;
    // QR clear, opcode QUERY; the rest of the flags do not matter here.
    if flags & 0xF800 != 0 {
        return None;
    }
    let counts = (
        u16_at(request, 4)?,
        u16_at(request, 6)?,
        u16_at(request, 8)?,
        u16_at(request, 10)?,
    );
    if counts.0 != 1 || counts.1 != 0 || counts.2 != 0 || counts.3 > 1 {
        return None;
    }
    key.clear();
    key.extend_from_slice(&[0; KEY_PREFIX]);
    let mut at = 12;
    loop {
        let len = usize::from(*request.get(at)?);
        if len == 0 {
            key.push(0);
            at += 1;
            // The root label counts: a name is at most 255 bytes in all.
            if key.len() - KEY_PREFIX > MAX_NAME {
                return None;
            }
            break;
        }
        // A compression pointer or extended label: not the common case.
        if len > 63 {
            return None;
        }
        let label = request.get(at + 1..at + 1 + len)?;
        key.push(len as u8);
        key.extend(label.iter().map(u8::to_ascii_lowercase));
        at += 1 + len;
        if key.len() - KEY_PREFIX > MAX_NAME {
            return None;
        }
    }
    let qtype = u16_at(request, at)?;
    let qclass = u16_at(request, at + 2)?;
    let question_end = at + 4;
    let mut edns = None;
    if counts.3 == 1 {
        // OPT: root name, type 41, class = payload size, TTL = extended
        // rcode, version, flags (DO is the top bit), then its data.
        let opt = request.get(question_end..)?;
        if opt.len() < 11 || opt[0] != 0 || u16_at(opt, 1)? != 41 {
            return None;
        }
        let rdlen = usize::from(u16_at(opt, 9)?);
        // Version 0 only (another is answered BADVERS by the full path),
        // and options that exactly fill the data, none of them Client
        // Subnet: a malformed OPT is the full parser's to answer FORMERR
        // (each found by the dns_fastpath fuzz target, which holds the two
        // paths to one verdict).
        if opt.len() != 11 + rdlen || opt[6] != 0 || !options_fit(&opt[11..]) {
            return None;
        }
        edns = Some(Edns {
            max_payload: u16_at(opt, 3)?,
            dnssec_ok: opt[7] & 0x80 != 0,
        });
    } else if request.len() != question_end {
        return None;
    }
    let checking_disabled = flags & 0x0010 != 0;
    let mut bits = 0;
    if edns.is_some() {
        bits |= FLAG_EDNS;
    }
    if edns.is_some_and(|e| e.dnssec_ok) {
        bits |= FLAG_DO;
    }
    if checking_disabled {
        bits |= FLAG_CD;
    }
    key[..KEY_PREFIX].copy_from_slice(&[
        (qtype >> 8) as u8,
        qtype as u8,
        (qclass >> 8) as u8,
        qclass as u8,
        bits,
    ]);
    Some(Question {
        id: u16_at(request, 0)?,
        recursion_desired: flags & 0x0100 != 0,
        qtype,
        question_end,
        edns,
    })
}

/// EDNS Client Subnet (RFC 7871): its value is parsed and checked by the
/// full parser, and a query carrying it asks for an answer shaped to a
/// subnet, so it is never served from a shared key.
const OPTION_CLIENT_SUBNET: u16 = 8;

/// Whether EDNS option data is a run of whole options (code, length,
/// value), ending exactly at its end, none of them Client Subnet.
fn options_fit(mut data: &[u8]) -> bool {
    while !data.is_empty() {
        let (Some(code), Some(len)) = (u16_at(data, 0), u16_at(data, 2)) else {
            return false;
        };
        if code == OPTION_CLIENT_SUBNET {
            return false;
        }
        let Some(rest) = data.get(4 + usize::from(len)..) else {
            return false;
        };
        data = rest;
    }
    true
}

/// The same key for a query the full parser read, so both paths share
/// cache entries.
pub fn key_of(q: &crate::message::ParsedQuery) -> Vec<u8> {
    use hickory_proto::serialize::binary::BinEncodable;
    let mut key = Vec::with_capacity(KEY_PREFIX + 32);
    let qtype = u16::from(q.qtype());
    let qclass = u16::from(q.query.query_class());
    let mut bits = 0;
    if q.edns.is_some() {
        bits |= FLAG_EDNS;
    }
    if q.edns.is_some_and(|e| e.dnssec_ok) {
        bits |= FLAG_DO;
    }
    if q.checking_disabled {
        bits |= FLAG_CD;
    }
    key.extend_from_slice(&[
        (qtype >> 8) as u8,
        qtype as u8,
        (qclass >> 8) as u8,
        qclass as u8,
        bits,
    ]);
    let name: hickory_proto::rr::Name = (&q.lower).into();
    match name.to_bytes() {
        Ok(wire) => key.extend(wire.iter().map(u8::to_ascii_lowercase)),
        Err(_) => key.push(0),
    }
    key
}

/// Gives a prepared response the asker's ID, RD bit and question case.
pub fn patch(response: &mut [u8], q: &Question, request: &[u8]) -> bool {
    wire::patch_raw(response, q.id, q.recursion_desired, q.question_end, request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns as HEdns, Message, Query};
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str, edns: bool, dnssec: bool) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x4242).set_recursion_desired(true);
        m.add_query(Query::query(
            Name::from_ascii(name).unwrap(),
            RecordType::AAAA,
        ));
        if edns {
            let mut e = HEdns::new();
            e.set_max_payload(1400);
            e.set_dnssec_ok(dnssec);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn both_paths_make_the_same_key() {
        for (edns, dnssec) in [(false, false), (true, false), (true, true)] {
            let bytes = query("Api.HC1.Example.COM.", edns, dnssec);
            let mut key = Vec::new();
            let fast = read(&bytes, &mut key).unwrap();
            let parsed = crate::message::parse(&bytes).unwrap();
            assert_eq!(key, key_of(&parsed), "edns {edns} do {dnssec}");
            assert_eq!(fast.id, 0x4242);
            assert!(fast.recursion_desired);
            assert_eq!(fast.qtype, 28);
            assert_eq!(fast.question_end, parsed.question_end);
            assert_eq!(fast.udp_limit(), parsed.udp_limit());
        }
    }

    #[test]
    fn unusual_queries_go_to_the_full_parser() {
        let mut key = Vec::new();
        let mut response = query("a.b.", false, false);
        response[2] |= 0x80;
        assert!(read(&response, &mut key).is_none());
        let mut two = query("a.b.", false, false);
        two[5] = 2;
        assert!(read(&two, &mut key).is_none());
        let mut trailing = query("a.b.", false, false);
        trailing.push(0);
        assert!(read(&trailing, &mut key).is_none());
        for cut in 0..query("a.b.", true, true).len() {
            let _ = read(&query("a.b.", true, true)[..cut], &mut key);
        }
    }

    /// Found by the dns_fastpath fuzz target: queries the full parser
    /// answers FORMERR (or BADVERS) must not be answered by the fast path.
    #[test]
    fn what_the_full_parser_refuses_the_fast_path_leaves_to_it() {
        let question = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x01\x01x\x04apps\x03com\x00\x00\x1c\x00\x01";
        let with_opt = |version: u8, data: &[u8]| {
            let mut q = question.to_vec();
            q.extend_from_slice(&[0, 0, 41, 4, 0xd3, 0, version, 0, 0]);
            q.extend_from_slice(&(data.len() as u16).to_be_bytes());
            q.extend_from_slice(data);
            q
        };
        let mut key = Vec::new();
        // One byte of option data: no room for an option's header.
        let cut = with_opt(0, &[2]);
        assert!(read(&cut, &mut key).is_none());
        assert!(crate::message::parse(&cut).is_err());
        // An option whose length runs past the data.
        assert!(read(&with_opt(0, &[0, 10, 0, 8, 1, 2]), &mut key).is_none());
        // EDNS version 1.
        assert!(read(&with_opt(1, &[]), &mut key).is_none());
        // Client Subnet, even well-formed, is the full parser's (it checks
        // the value; this one is empty, which it refuses).
        let ecs = with_opt(0, &[0, 6, 0, 0, 0, 8, 0, 0]);
        assert!(read(&ecs, &mut key).is_none());
        assert!(crate::message::parse(&ecs).is_err());
        // Well-formed options are still read here.
        assert!(read(&with_opt(0, &[0, 10, 0, 2, 1, 2]), &mut key).is_some());
        assert!(read(&with_opt(0, &[]), &mut key).is_some());

        // A name of 256 bytes with its root label: one too many (the
        // labels alone are 255, so only the count after the root catches it).
        let mut long = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00".to_vec();
        for _ in 0..3 {
            long.push(63);
            long.extend_from_slice(&[b'a'; 63]);
        }
        long.push(62);
        long.extend_from_slice(&[b'a'; 62]);
        long.push(0);
        long.extend_from_slice(&[0, 1, 0, 1]);
        assert_eq!(long.len() - 12 - 4, 256);
        assert!(read(&long, &mut key).is_none());
        // 255 in all is the longest name there is, and is read.
        let mut longest = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00".to_vec();
        for _ in 0..3 {
            longest.push(63);
            longest.extend_from_slice(&[b'a'; 63]);
        }
        longest.push(61);
        longest.extend_from_slice(&[b'a'; 61]);
        longest.push(0);
        longest.extend_from_slice(&[0, 1, 0, 1]);
        assert!(read(&longest, &mut key).is_some());
        assert_eq!(key.len() - KEY_PREFIX, 255);
        assert!(crate::message::parse(&longest).is_ok());
    }
}
