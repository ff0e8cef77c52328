// DNS wire format for the load generator: pure functions that encode query
// names and packets, parse just enough of a response (header and question)
// to match it to its query, and build the floor responder's answers. Hand-written rather than through a
// DNS library because the send loop reuses one buffer per packet and never
// allocates, and parsing stops after the question.

use std::fmt;
use std::net::Ipv4Addr;

pub const HEADER_LEN: usize = 12;
/// Largest encoded name (RFC 1035 2.3.4).
pub const MAX_NAME_LEN: usize = 255;
const MAX_LABEL_LEN: usize = 63;
/// Our queries are at most header + name + qtype/qclass + OPT.
pub const MAX_QUERY_LEN: usize = HEADER_LEN + MAX_NAME_LEN + 4 + 11;

const FLAG_QR: u16 = 0x8000;
const FLAG_TC: u16 = 0x0200;
const FLAG_RD: u16 = 0x0100;
const FLAG_AA: u16 = 0x0400;
const OPCODE_MASK: u16 = 0x7800;
const TYPE_A: u16 = 1;
/// TTL of the floor responder's A records.
const FLOOR_TTL: u32 = 30;
const CLASS_IN: u16 = 1;
const TYPE_OPT: u16 = 41;
/// The EDNS buffer size the DNS flag day 2020 settled on.
pub const EDNS_UDP_SIZE: u16 = 1232;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    EmptyLabel,
    LabelTooLong(usize),
    NameTooLong,
    BadChar(char),
    UnknownType(String),
    Short,
    NotAResponse,
    NotAQuery,
    QuestionCount(u16),
    CompressedQuestion,
    BadLabel(u8),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::EmptyLabel => write!(f, "empty label (two dots in a row?)"),
            WireError::LabelTooLong(n) => write!(f, "label of {n} bytes (max 63)"),
            WireError::NameTooLong => write!(f, "name longer than 255 bytes"),
            WireError::BadChar(c) => write!(
                f,
                "character {c:?} not supported in names (no escapes, no spaces)"
            ),
            WireError::UnknownType(t) => write!(
                f,
                "unknown query type {t:?} (use A, AAAA, MX, ... or TYPE<number>)"
            ),
            WireError::Short => write!(f, "message truncated"),
            WireError::NotAResponse => write!(f, "QR bit clear: not a response"),
            WireError::NotAQuery => write!(f, "QR bit set: not a query"),
            WireError::QuestionCount(n) => write!(f, "{n} questions (a query has one)"),
            WireError::CompressedQuestion => write!(f, "compression pointer in the question"),
            WireError::BadLabel(b) => write!(f, "invalid label length byte {b:#04x}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Appends the wire form of a presentation-format name ("api.example.com",
/// trailing dot optional, "." for the root). Escapes are not supported: the
/// bench only sends host names.
pub fn encode_name(name: &str, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    let name = name.strip_suffix('.').unwrap_or(name);
    if !name.is_empty() {
        for label in name.split('.') {
            if label.is_empty() {
                out.truncate(start);
                return Err(WireError::EmptyLabel);
            }
            if label.len() > MAX_LABEL_LEN {
                out.truncate(start);
                return Err(WireError::LabelTooLong(label.len()));
            }
            if let Some(c) = label.chars().find(|c| !c.is_ascii_graphic() || *c == '\\') {
                out.truncate(start);
                return Err(WireError::BadChar(c));
            }
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
    }
    out.push(0);
    if out.len() - start > MAX_NAME_LEN {
        out.truncate(start);
        return Err(WireError::NameTooLong);
    }
    Ok(())
}

/// Query type from its mnemonic ("A", "aaaa") or RFC 3597 form ("TYPE65").
pub fn parse_qtype(s: &str) -> Result<u16, WireError> {
    let up = s.to_ascii_uppercase();
    let t = match up.as_str() {
        "A" => 1,
        "NS" => 2,
        "CNAME" => 5,
        "SOA" => 6,
        "PTR" => 12,
        "HINFO" => 13,
        "MX" => 15,
        "TXT" => 16,
        "AAAA" => 28,
        "SRV" => 33,
        "NAPTR" => 35,
        "DS" => 43,
        "RRSIG" => 46,
        "NSEC" => 47,
        "DNSKEY" => 48,
        "SVCB" => 64,
        "HTTPS" => 65,
        "ANY" => 255,
        "CAA" => 257,
        _ => up
            .strip_prefix("TYPE")
            .and_then(|n| n.parse::<u16>().ok())
            .ok_or_else(|| WireError::UnknownType(s.to_string()))?,
    };
    Ok(t)
}

/// Options shared by every query of a run.
#[derive(Debug, Clone, Copy)]
pub struct QueryFlags {
    /// Recursion desired; resolvers refuse or answer differently without it.
    pub rd: bool,
    /// Add an EDNS0 OPT record advertising [`EDNS_UDP_SIZE`].
    pub edns: bool,
}

/// Builds a complete query for an already-encoded name. The ID is written
/// later by [`set_id`], so the send loop can copy a prepared packet and
/// patch two bytes.
pub fn build_query(qname_wire: &[u8], qtype: u16, flags: QueryFlags) -> Vec<u8> {
    let mut p = Vec::with_capacity(HEADER_LEN + qname_wire.len() + 4 + 11);
    let hflags = if flags.rd { FLAG_RD } else { 0 };
    p.extend_from_slice(&0u16.to_be_bytes()); // id
    p.extend_from_slice(&hflags.to_be_bytes());
    p.extend_from_slice(&1u16.to_be_bytes()); // qdcount
    p.extend_from_slice(&0u16.to_be_bytes()); // ancount
    p.extend_from_slice(&0u16.to_be_bytes()); // nscount
    p.extend_from_slice(&u16::from(flags.edns).to_be_bytes()); // arcount
    p.extend_from_slice(qname_wire);
    p.extend_from_slice(&qtype.to_be_bytes());
    p.extend_from_slice(&CLASS_IN.to_be_bytes());
    if flags.edns {
        p.push(0); // root owner
        p.extend_from_slice(&TYPE_OPT.to_be_bytes());
        p.extend_from_slice(&EDNS_UDP_SIZE.to_be_bytes());
        p.extend_from_slice(&0u32.to_be_bytes()); // ext rcode, version, flags
        p.extend_from_slice(&0u16.to_be_bytes()); // rdlen
    }
    p
}

pub fn set_id(packet: &mut [u8], id: u16) {
    packet[..2].copy_from_slice(&id.to_be_bytes());
}

/// Identity of a question for matching a response to its query without
/// keeping the name: FNV-1a over the case-folded wire name, then the type.
/// Case-insensitive because servers may echo 0x20-randomised case back.
/// (Length bytes are < 64, below 'A', so folding the whole wire form only
/// touches label characters.)
pub fn question_hash(qname_wire: &[u8], qtype: u16) -> u64 {
    let mut h = Fnv::new();
    for &b in qname_wire {
        h.byte(b.to_ascii_lowercase());
    }
    h.bytes(&qtype.to_be_bytes());
    h.0
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn bytes(&mut self, bs: &[u8]) {
        for &b in bs {
            self.byte(b);
        }
    }
}

/// Rcode classes the report distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    NoError,
    ServFail,
    NxDomain,
    Refused,
    Other(u8),
}

impl Rcode {
    fn from_bits(b: u8) -> Self {
        match b {
            0 => Rcode::NoError,
            2 => Rcode::ServFail,
            3 => Rcode::NxDomain,
            5 => Rcode::Refused,
            other => Rcode::Other(other),
        }
    }
}

/// What the bench needs from a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseInfo {
    pub id: u16,
    pub rcode: Rcode,
    pub truncated: bool,
    pub ancount: u16,
    /// [`question_hash`] of the echoed question; `None` when the response
    /// carries no question (some servers omit it in error responses).
    pub question: Option<u64>,
}

/// Parses the header and the first question. Never panics: anything short
/// or malformed is an error.
pub fn parse_response(msg: &[u8]) -> Result<ResponseInfo, WireError> {
    if msg.len() < HEADER_LEN {
        return Err(WireError::Short);
    }
    let u16_at = |i: usize| u16::from_be_bytes([msg[i], msg[i + 1]]);
    let id = u16_at(0);
    let flags = u16_at(2);
    if flags & FLAG_QR == 0 {
        return Err(WireError::NotAResponse);
    }
    let qdcount = u16_at(4);
    let ancount = u16_at(6);
    let question = if qdcount == 0 {
        None
    } else {
        let name_end = first_name_end(msg)?;
        msg.get(name_end..name_end + 4).ok_or(WireError::Short)?; // qtype, qclass
        let mut h = Fnv::new();
        for &b in &msg[HEADER_LEN..name_end] {
            h.byte(b.to_ascii_lowercase());
        }
        h.bytes(&msg[name_end..name_end + 2]);
        Some(h.0)
    };
    Ok(ResponseInfo {
        id,
        rcode: Rcode::from_bits((flags & 0x000f) as u8),
        truncated: flags & FLAG_TC != 0,
        ancount,
        question,
    })
}

/// Where the first question's name ends (one past its root label). Never
/// panics: a name that runs off the message, or is not a plain sequence of
/// labels, is an error.
fn first_name_end(msg: &[u8]) -> Result<usize, WireError> {
    let mut i = HEADER_LEN;
    loop {
        let len = *msg.get(i).ok_or(WireError::Short)?;
        match len {
            0 => return Ok(i + 1),
            1..=63 => {
                i += 1 + usize::from(len);
                if i - HEADER_LEN >= MAX_NAME_LEN {
                    return Err(WireError::NameTooLong);
                }
            }
            // Nothing precedes the first question for a pointer to point
            // at, so this is a broken (or hostile) packet.
            0xc0..=0xff => return Err(WireError::CompressedQuestion),
            other => return Err(WireError::BadLabel(other)),
        }
    }
}

/// The answer of `causeway-bench dns-floor`, written into `out`: the
/// query's header and question with QR and AA set (opcode, ID and RD kept),
/// then one A record for `address` when the question asks for A, none
/// otherwise. Whatever followed the question (an OPT record) is left out,
/// so the answer is the same size as a plain authoritative server's.
pub fn floor_answer(query: &[u8], address: Ipv4Addr, out: &mut Vec<u8>) -> Result<(), WireError> {
    if query.len() < HEADER_LEN {
        return Err(WireError::Short);
    }
    let flags = u16::from_be_bytes([query[2], query[3]]);
    if flags & FLAG_QR != 0 {
        return Err(WireError::NotAQuery);
    }
    let qdcount = u16::from_be_bytes([query[4], query[5]]);
    if qdcount != 1 {
        return Err(WireError::QuestionCount(qdcount));
    }
    let name_end = first_name_end(query)?;
    let question = query.get(..name_end + 4).ok_or(WireError::Short)?;
    let is_a = question[name_end..name_end + 2] == TYPE_A.to_be_bytes();
    out.clear();
    out.extend_from_slice(question);
    let answer_flags = FLAG_QR | FLAG_AA | (flags & (OPCODE_MASK | FLAG_RD));
    out[2..4].copy_from_slice(&answer_flags.to_be_bytes());
    out[6..8].copy_from_slice(&u16::from(is_a).to_be_bytes()); // ancount
    out[8..12].fill(0); // nscount, arcount
    if is_a {
        // The owner is the question's name, by a pointer to offset 12.
        out.extend_from_slice(&[0xc0, HEADER_LEN as u8]);
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&FLOOR_TTL.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&address.octets());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(name: &str) -> Vec<u8> {
        let mut v = Vec::new();
        encode_name(name, &mut v).unwrap();
        v
    }

    const FLAGS: QueryFlags = QueryFlags {
        rd: true,
        edns: false,
    };

    #[test]
    fn names_encode() {
        assert_eq!(wire("api.hc1"), b"\x03api\x03hc1\x00");
        assert_eq!(wire("api.hc1."), b"\x03api\x03hc1\x00");
        assert_eq!(wire("."), b"\x00");
        let mut v = vec![9];
        assert_eq!(encode_name("a..b", &mut v), Err(WireError::EmptyLabel));
        assert_eq!(v, vec![9], "failed encode leaves the buffer as it was");
        assert_eq!(
            encode_name(&"x".repeat(64), &mut v),
            Err(WireError::LabelTooLong(64))
        );
        let long = vec!["abcdefghi"; 26].join(".");
        assert_eq!(encode_name(&long, &mut v), Err(WireError::NameTooLong));
        assert_eq!(encode_name("a b", &mut v), Err(WireError::BadChar(' ')));
        assert_eq!(encode_name("a\\.b", &mut v), Err(WireError::BadChar('\\')));
    }

    #[test]
    fn qtypes() {
        assert_eq!(parse_qtype("A"), Ok(1));
        assert_eq!(parse_qtype("aaaa"), Ok(28));
        assert_eq!(parse_qtype("TYPE65"), Ok(65));
        assert!(parse_qtype("BOGUS").is_err());
        assert!(parse_qtype("TYPE70000").is_err());
    }

    #[test]
    fn query_layout() {
        let mut q = build_query(&wire("api.hc1.example.com"), 1, FLAGS);
        set_id(&mut q, 0xbeef);
        let mut want = vec![0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(b"\x03api\x03hc1\x07example\x03com\x00\x00\x01\x00\x01");
        assert_eq!(q, want);

        let e = build_query(
            &wire("a"),
            28,
            QueryFlags {
                rd: false,
                edns: true,
            },
        );
        assert_eq!(&e[2..4], &[0, 0], "no RD");
        assert_eq!(&e[10..12], &[0, 1], "arcount 1");
        assert_eq!(
            &e[e.len() - 11..],
            &[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0]
        );
        assert!(e.len() <= MAX_QUERY_LEN);
    }

    /// A plausible server answer to `query`: flags set, one A record.
    fn answer(query: &[u8], rcode: u8, tc: bool) -> Vec<u8> {
        let mut r = query.to_vec();
        r[2] = 0x81 | if tc { 0x02 } else { 0 };
        r[3] = 0x80 | rcode;
        r[7] = 1;
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 168, 100, 2]);
        r
    }

    #[test]
    fn response_matches_its_query() {
        let name = wire("api.hc1.example.com");
        let mut q = build_query(&name, 1, FLAGS);
        set_id(&mut q, 7);
        let info = parse_response(&answer(&q, 0, false)).unwrap();
        assert_eq!(info.id, 7);
        assert_eq!(info.rcode, Rcode::NoError);
        assert!(!info.truncated);
        assert_eq!(info.ancount, 1);
        assert_eq!(info.question, Some(question_hash(&name, 1)));
        assert_ne!(info.question, Some(question_hash(&name, 28)));
        assert_ne!(
            info.question,
            Some(question_hash(&wire("api.hc1.example.org"), 1))
        );

        let nx = parse_response(&answer(&q, 3, true)).unwrap();
        assert_eq!(nx.rcode, Rcode::NxDomain);
        assert!(nx.truncated);
        assert_eq!(
            parse_response(&answer(&q, 2, false)).unwrap().rcode,
            Rcode::ServFail
        );
        assert_eq!(
            parse_response(&answer(&q, 5, false)).unwrap().rcode,
            Rcode::Refused
        );
        assert_eq!(
            parse_response(&answer(&q, 4, false)).unwrap().rcode,
            Rcode::Other(4)
        );
    }

    #[test]
    fn echoed_case_does_not_matter() {
        let name = wire("Api.HC1.example.com");
        let q = build_query(&name, 1, FLAGS);
        let info = parse_response(&answer(&q, 0, false)).unwrap();
        assert_eq!(
            info.question,
            Some(question_hash(&wire("api.hc1.EXAMPLE.com"), 1))
        );
    }

    #[test]
    fn no_question_is_allowed() {
        let r = [0, 9, 0x81, 0x85, 0, 0, 0, 0, 0, 0, 0, 0];
        let info = parse_response(&r).unwrap();
        assert_eq!(info.question, None);
        assert_eq!(info.rcode, Rcode::Refused);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let q = build_query(&wire("api.hc1.example.com"), 1, FLAGS);
        let good = answer(&q, 0, false);
        // Every prefix that cuts into the header or the question fails.
        let question_end = q.len();
        for n in 0..question_end {
            assert!(parse_response(&good[..n]).is_err(), "prefix {n} accepted");
        }
        assert!(parse_response(&good[..question_end]).is_ok());
        // A query is not a response.
        assert_eq!(parse_response(&q), Err(WireError::NotAResponse));
        // Pointers and reserved label types in the question.
        let mut p = good.clone();
        p[12] = 0xc0;
        assert_eq!(parse_response(&p), Err(WireError::CompressedQuestion));
        p[12] = 0x40;
        assert_eq!(parse_response(&p), Err(WireError::BadLabel(0x40)));
        // Labels that never end.
        let mut endless = good[..12].to_vec();
        for _ in 0..10 {
            endless.push(63);
            endless.extend_from_slice(&[b'a'; 63]);
        }
        assert_eq!(parse_response(&endless), Err(WireError::NameTooLong));
        // Deterministic pseudo-random garbage never panics.
        let mut x: u32 = 1;
        for len in 0..600 {
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = parse_response(&buf);
        }
    }

    #[test]
    fn floor_answers_a_with_one_record_and_keeps_the_question() {
        let mut q = build_query(&wire("Api.hc1.example.com"), 1, FLAGS);
        set_id(&mut q, 0x1234);
        let mut out = Vec::new();
        floor_answer(&q, Ipv4Addr::new(192, 0, 2, 7), &mut out).unwrap();
        let info = parse_response(&out).unwrap();
        assert_eq!(info.id, 0x1234);
        assert_eq!(info.rcode, Rcode::NoError);
        assert_eq!(info.ancount, 1);
        assert_eq!(
            info.question,
            Some(question_hash(&wire("api.hc1.example.com"), 1))
        );
        // QR, AA and the query's RD; no TC, no RA.
        assert_eq!(u16::from_be_bytes([out[2], out[3]]), 0x8500);
        let record = &out[q.len()..];
        assert_eq!(
            record,
            [0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 7]
        );
    }

    #[test]
    fn floor_answers_other_types_with_no_data_and_drops_edns() {
        let q = build_query(
            &wire("api.hc1.example.com"),
            28,
            QueryFlags {
                rd: false,
                edns: true,
            },
        );
        let mut out = Vec::new();
        floor_answer(&q, Ipv4Addr::new(192, 0, 2, 1), &mut out).unwrap();
        assert_eq!(out.len(), q.len() - 11, "the OPT record is left out");
        let info = parse_response(&out).unwrap();
        assert_eq!(info.ancount, 0);
        assert_eq!(info.rcode, Rcode::NoError);
        assert_eq!(&out[8..12], [0, 0, 0, 0]);
        assert_eq!(u16::from_be_bytes([out[2], out[3]]), 0x8400);
    }

    #[test]
    fn floor_refuses_what_is_not_one_plain_question() {
        let q = build_query(&wire("api.hc1.example.com"), 1, FLAGS);
        let mut out = Vec::new();
        let a = Ipv4Addr::new(192, 0, 2, 1);
        for n in 0..q.len() {
            assert!(
                floor_answer(&q[..n], a, &mut out).is_err(),
                "prefix {n} answered"
            );
        }
        let response = answer(&q, 0, false);
        assert_eq!(
            floor_answer(&response, a, &mut out),
            Err(WireError::NotAQuery)
        );
        let mut two = q.clone();
        two[5] = 2;
        assert_eq!(
            floor_answer(&two, a, &mut out),
            Err(WireError::QuestionCount(2))
        );
        let mut pointer = q.clone();
        pointer[12] = 0xc0;
        assert_eq!(
            floor_answer(&pointer, a, &mut out),
            Err(WireError::CompressedQuestion)
        );
    }
}
