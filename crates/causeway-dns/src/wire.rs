//! The bottom of the DNS wire, shared by both readers of a query (the fast
//! path, [`crate::fastpath`], and the full parser, [`crate::message`]): what
//! a query's OPT record says, the UDP size limits that follow from it, and
//! the byte patch that makes a prepared response answer a new query. It
//! imports nothing of this crate.

/// Our advertised EDNS UDP payload size (the DNS flag day 2020 value).
pub const EDNS_PAYLOAD: u16 = 1232;
/// The UDP limit for a client that sent no EDNS.
pub const CLASSIC_UDP_LIMIT: usize = 512;

/// What a query's OPT record says, as both readers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Edns {
    pub max_payload: u16,
    pub dnssec_ok: bool,
}

/// The largest UDP response a client takes, from its EDNS (if any).
pub fn udp_limit(edns: Option<Edns>) -> usize {
    edns.map_or(CLASSIC_UDP_LIMIT, |e| {
        usize::from(e.max_payload.clamp(512, EDNS_PAYLOAD))
    })
}

/// Makes a prepared response (for the same name and type, perhaps in
/// another letter case) answer a query: its ID, its RD bit and its question
/// bytes. The question sits right after the header, uncompressed, in both
/// the response and the request.
pub fn patch_raw(
    response: &mut [u8],
    id: u16,
    recursion_desired: bool,
    question_end: usize,
    request: &[u8],
) -> bool {
    if response.len() < question_end || request.len() < question_end || question_end < 12 {
        return false;
    }
    response[..2].copy_from_slice(&id.to_be_bytes());
    response[2] = (response[2] & !0x01) | u8::from(recursion_desired);
    response[12..question_end].copy_from_slice(&request[12..question_end]);
    true
}
