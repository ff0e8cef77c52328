//! Queries in, responses out, on the wire: parsing a query once, building
//! responses, and the small byte patches that let a prepared response serve
//! a new query (its ID, its RD bit, the case of its question).

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{LowerName, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use crate::authority::LocalAnswer;
use crate::wire::{self, EDNS_PAYLOAD};

/// A query, read once.
#[derive(Debug, Clone)]
pub struct ParsedQuery {
    pub id: u16,
    pub recursion_desired: bool,
    pub checking_disabled: bool,
    pub query: Query,
    pub lower: LowerName,
    pub edns: Option<wire::Edns>,
    /// Where the question ends in the request's bytes.
    pub question_end: usize,
}

impl ParsedQuery {
    pub fn qtype(&self) -> RecordType {
        self.query.query_type()
    }

    /// The largest UDP response this client takes.
    pub fn udp_limit(&self) -> usize {
        wire::udp_limit(self.edns)
    }
}

/// Why a packet is not a query we answer normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Too short to hold a header, or itself a response: dropped silently,
    /// so we never answer (or amplify) garbage.
    Drop(&'static str),
    /// Answered with this rcode and the ID we could read.
    Reply {
        id: u16,
        rcode: ResponseCode,
        reason: &'static str,
    },
}

pub fn parse(bytes: &[u8]) -> Result<ParsedQuery, Rejected> {
    if bytes.len() < 12 {
        return Err(Rejected::Drop("short"));
    }
    let mut d = BinDecoder::new(bytes);
    let header = Header::read(&mut d).map_err(|_| Rejected::Drop("short"))?;
    let id = header.id();
    if header.message_type() == MessageType::Response {
        return Err(Rejected::Drop("not_a_query"));
    }
    if header.op_code() != OpCode::Query {
        return Err(Rejected::Reply {
            id,
            rcode: ResponseCode::NotImp,
            reason: "opcode",
        });
    }
    let formerr = |reason| Rejected::Reply {
        id,
        rcode: ResponseCode::FormErr,
        reason,
    };
    if header.query_count() != 1 {
        return Err(formerr("question_count"));
    }
    let query = Query::read(&mut d).map_err(|_| formerr("bad_question"))?;
    let question_end = d.index();
    let mut edns = None;
    let records = usize::from(header.answer_count())
        + usize::from(header.name_server_count())
        + usize::from(header.additional_count());
    for _ in 0..records {
        let record = Record::read(&mut d).map_err(|_| formerr("bad_record"))?;
        if record.record_type() == RecordType::OPT {
            let e = Edns::from(&record);
            edns = Some(wire::Edns {
                max_payload: e.max_payload(),
                dnssec_ok: e.flags().dnssec_ok,
            });
        }
    }
    Ok(ParsedQuery {
        id,
        recursion_desired: header.recursion_desired(),
        checking_disabled: header.checking_disabled(),
        lower: LowerName::from(query.name()),
        query,
        edns,
        question_end,
    })
}

fn base(
    q: &ParsedQuery,
    rcode: ResponseCode,
    authoritative: bool,
    recursion_available: bool,
) -> Message {
    let mut m = Message::new();
    m.set_id(q.id)
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(authoritative)
        .set_recursion_desired(q.recursion_desired)
        .set_recursion_available(recursion_available)
        .set_checking_disabled(q.checking_disabled)
        .set_response_code(rcode);
    m.add_query(q.query.clone());
    if let Some(e) = q.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        edns.set_dnssec_ok(e.dnssec_ok);
        m.set_edns(edns);
    }
    m
}

/// Encodes `m`, truncating to the header and question (with TC set) when it
/// does not fit in `limit` bytes.
fn encode(m: &Message, limit: usize) -> Vec<u8> {
    match m.to_vec() {
        Ok(bytes) if bytes.len() <= limit => bytes,
        Ok(_) => {
            let mut t = m.truncate();
            t.set_truncated(true);
            t.to_vec().unwrap_or_default()
        }
        Err(_) => Vec::new(),
    }
}

/// An authoritative answer from local data.
pub fn local_response(
    q: &ParsedQuery,
    a: &LocalAnswer,
    recursion_available: bool,
    limit: usize,
) -> Vec<u8> {
    let rcode = if a.nxdomain {
        ResponseCode::NXDomain
    } else {
        ResponseCode::NoError
    };
    let mut m = base(q, rcode, true, recursion_available);
    m.add_answers(a.answers.iter().cloned());
    m.add_name_servers(a.authority.iter().cloned());
    encode(&m, limit)
}

/// REFUSED, SERVFAIL and the like, echoing the question.
pub fn error_response(q: &ParsedQuery, rcode: ResponseCode, recursion_available: bool) -> Vec<u8> {
    encode(&base(q, rcode, false, recursion_available), usize::MAX)
}

/// An empty response with TC set: the client should retry over TCP.
pub fn truncated_response(q: &ParsedQuery) -> Vec<u8> {
    let mut m = base(q, ResponseCode::NoError, false, true);
    m.set_truncated(true);
    m.to_vec().unwrap_or_default()
}

/// An error for a packet whose question could not be read: header only.
pub fn bare_error(id: u16, rcode: ResponseCode) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_response_code(rcode);
    m.to_vec().unwrap_or_default()
}

/// Makes a prepared response answer `q` (see [`wire::patch_raw`]).
pub fn patch_for(response: &mut [u8], q: &ParsedQuery, request: &[u8]) -> bool {
    wire::patch_raw(response, q.id, q.recursion_desired, q.question_end, request)
}

/// What goes upstream for `q`, read from `request`: the client's header
/// and question with recursion desired set, and, if the client sent EDNS,
/// an OPT record of our own with the client's DO bit and no options. The
/// answer is cached for every client, so it must be one every client may
/// have: not the cache-only answer an RD=0 query gets, nor one scoped by a
/// client's EDNS Client Subnet. Anything after the question (other
/// records, the client's options) stays behind.
pub fn upstream_query(q: &ParsedQuery, request: &[u8]) -> Vec<u8> {
    let Some(head) = request.get(..q.question_end).filter(|h| h.len() > 12) else {
        return request.to_vec();
    };
    let mut out = Vec::with_capacity(head.len() + 11);
    out.extend_from_slice(head);
    out[2] |= 0x01;
    // One question, nothing else but our OPT.
    out[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(q.edns.is_some())]);
    if let Some(e) = q.edns {
        let do_bit: u8 = if e.dnssec_ok { 0x80 } else { 0 };
        let payload = wire::EDNS_PAYLOAD.to_be_bytes();
        // Root name, type OPT (41), class = UDP payload, TTL = extended
        // rcode 0, version 0, flags (DO), no data.
        out.extend_from_slice(&[0, 0, 41, payload[0], payload[1], 0, 0, do_bit, 0, 0, 0]);
    }
    out
}

/// Flags for an answer we relayed: not authoritative (we are not the
/// source, whatever the upstream said), recursion available.
pub fn mark_forwarded(response: &mut [u8]) {
    if response.len() >= 4 {
        response[2] &= !0x04;
        response[3] |= 0x80;
    }
}

/// The response code of a response on the wire.
pub fn rcode_of(response: &[u8]) -> Option<ResponseCode> {
    let low = response.get(3)? & 0x0f;
    Some(ResponseCode::from(0, low))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Edns as EdnsInfo;
    use hickory_proto::rr::{Name, RData};
    use std::str::FromStr;

    fn query(name: &str, t: RecordType, edns: bool) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0x1234).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            e.set_dnssec_ok(true);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn the_upstream_query_asks_for_recursion_and_carries_only_our_opt() {
        for edns in [true, false] {
            let mut m =
                Message::from_vec(&query("x.example.org.", RecordType::AAAA, edns)).unwrap();
            m.set_recursion_desired(false).set_checking_disabled(true);
            let bytes = m.to_vec().unwrap();
            let q = parse(&bytes).unwrap();
            let up = Message::from_vec(&upstream_query(&q, &bytes)).unwrap();
            assert!(up.recursion_desired());
            assert!(
                up.checking_disabled(),
                "the other flags as the client set them"
            );
            assert_eq!(up.id(), 0x1234);
            assert_eq!(up.queries(), m.queries());
            assert!(up.answers().is_empty() && up.additionals().is_empty());
            match up.extensions() {
                Some(e) => {
                    assert!(edns);
                    assert_eq!(e.max_payload(), wire::EDNS_PAYLOAD);
                    assert!(e.flags().dnssec_ok, "the client's DO bit");
                    assert!(e.options().as_ref().is_empty());
                }
                None => assert!(!edns, "EDNS lost"),
            }
        }
    }

    #[test]
    fn a_query_is_read_with_its_edns() {
        let bytes = query("Api.HC1.example.com.", RecordType::A, true);
        let q = parse(&bytes).unwrap();
        assert_eq!(q.id, 0x1234);
        assert!(q.recursion_desired);
        assert_eq!(q.lower.to_string(), "api.hc1.example.com.");
        assert_eq!(q.query.name().to_string(), "Api.HC1.example.com.");
        assert_eq!(
            q.edns,
            Some(EdnsInfo {
                max_payload: 4096,
                dnssec_ok: true
            })
        );
        assert_eq!(q.udp_limit(), 1232);
        let plain = parse(&query("a.b.", RecordType::A, false)).unwrap();
        assert_eq!(plain.udp_limit(), 512);
    }

    #[test]
    fn garbage_is_dropped_or_answered_formerr_never_a_panic() {
        assert_eq!(parse(&[1, 2, 3]).unwrap_err(), Rejected::Drop("short"));
        let mut bytes = query("a.b.", RecordType::A, false);
        bytes[2] |= 0x80;
        assert_eq!(parse(&bytes).unwrap_err(), Rejected::Drop("not_a_query"));
        let mut bytes = query("a.b.", RecordType::A, false);
        bytes.truncate(15);
        assert!(matches!(
            parse(&bytes),
            Err(Rejected::Reply {
                rcode: ResponseCode::FormErr,
                ..
            })
        ));
        let mut bytes = query("a.b.", RecordType::A, false);
        bytes[5] = 2;
        assert!(matches!(
            parse(&bytes),
            Err(Rejected::Reply {
                reason: "question_count",
                ..
            })
        ));
        let mut bytes = query("a.b.", RecordType::A, false);
        bytes[2] = (bytes[2] & 0x87) | (2 << 3);
        assert!(matches!(
            parse(&bytes),
            Err(Rejected::Reply {
                rcode: ResponseCode::NotImp,
                ..
            })
        ));
    }

    #[test]
    fn an_oversized_udp_answer_is_truncated() {
        let bytes = query("big.example.", RecordType::TXT, false);
        let q = parse(&bytes).unwrap();
        let answers = (0..20)
            .map(|i| {
                Record::from_rdata(
                    Name::from_str("big.example.").unwrap(),
                    30,
                    RData::TXT(hickory_proto::rr::rdata::TXT::new(vec![format!(
                        "{i:0>60}"
                    )])),
                )
            })
            .collect();
        let a = LocalAnswer {
            nxdomain: false,
            answers,
            authority: vec![],
        };
        let small = Message::from_vec(&local_response(&q, &a, true, 512)).unwrap();
        assert!(small.truncated());
        assert!(small.answers().is_empty());
        let full = Message::from_vec(&local_response(&q, &a, true, 65535)).unwrap();
        assert!(!full.truncated());
        assert_eq!(full.answers().len(), 20);
    }

    #[test]
    fn a_prepared_response_is_patched_to_a_new_query() {
        let first = query("api.hc1.example.com.", RecordType::A, false);
        let q1 = parse(&first).unwrap();
        let a = LocalAnswer {
            nxdomain: false,
            answers: vec![],
            authority: vec![],
        };
        let mut prepared = local_response(&q1, &a, true, 512);
        let mut second = query("API.hc1.EXAMPLE.com.", RecordType::A, false);
        second[0] = 0xbe;
        second[1] = 0xef;
        second[2] &= !0x01;
        let q2 = parse(&second).unwrap();
        assert!(patch_for(&mut prepared, &q2, &second));
        let m = Message::from_vec(&prepared).unwrap();
        assert_eq!(m.id(), 0xbeef);
        assert!(!m.recursion_desired());
        assert_eq!(m.queries()[0].name().to_string(), "API.hc1.EXAMPLE.com.");
    }
}
