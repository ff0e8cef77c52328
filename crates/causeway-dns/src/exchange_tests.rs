use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use proptest::prelude::*;

use super::*;
use nix::libc;

const PER_TRY: Duration = Duration::from_millis(300);
const TOTAL: Duration = Duration::from_secs(2);

fn routes(n: usize) -> Vec<Route> {
    (0..n)
        .map(|i| Route {
            index: i,
            addr: SocketAddr::from(([192, 0, 2, 1 + i as u8], 53)),
        })
        .collect()
}

fn request(name: &str) -> (Vec<u8>, usize) {
    let mut m = Message::new();
    m.set_id(0x4242);
    m.set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let wire = m.to_vec().unwrap();
    let q = crate::message::parse(&wire).unwrap();
    (wire, q.question_end)
}

fn start(upstreams: usize, now: Instant) -> Exchange {
    let (wire, end) = request("a.example.net.");
    Exchange::new(&wire, end, routes(upstreams), TOTAL, PER_TRY, now)
}

/// The upstream's answer to what the exchange sends now: the payload with
/// the response bit, `rcode` and, if asked, the truncation bit set.
fn response_to(exchange: &Exchange, rcode: u8, truncated: bool) -> Vec<u8> {
    let mut wire = exchange.payload().to_vec();
    wire[2] |= 0x80 | if truncated { 0x02 } else { 0 };
    wire[3] = (wire[3] & 0xf0) | rcode;
    wire
}

fn events(exchange: &mut Exchange) -> Vec<Event> {
    std::iter::from_fn(|| exchange.poll_event()).collect()
}

fn failed(upstream: usize, reason: &'static str) -> Event {
    Event::Failed { upstream, reason }
}

fn id(wire: &[u8]) -> u16 {
    u16::from_be_bytes([wire[0], wire[1]])
}

#[test]
fn the_first_upstream_is_asked_over_udp_with_only_the_id_changed() {
    let now = Instant::now();
    let (wire, end) = request("a.example.net.");
    let mut ex = Exchange::new(&wire, end, routes(2), TOTAL, PER_TRY, now);
    let t = ex.poll_transmit().expect("a transmit at once");
    assert_eq!(t.upstream, 0);
    assert_eq!(t.to, routes(2)[0].addr);
    assert_eq!(t.transport, Transport::Udp);
    assert_eq!(&ex.payload()[2..], &wire[2..]);
    assert_eq!(ex.poll_timeout(), Some(now + PER_TRY));
    assert!(ex.waits_on(t.attempt));
    assert_eq!(ex.poll_transmit(), None, "one transmit per attempt");
}

#[test]
fn each_attempt_carries_an_id_of_its_own() {
    // Sixteen random IDs all equal to the client's by chance: 2^-256.
    let now = Instant::now();
    let ids: Vec<u16> = (0..16).map(|_| id(start(1, now).payload())).collect();
    assert!(ids.iter().any(|&i| i != 0x4242), "{ids:?}");
}

#[test]
fn the_answer_with_the_id_and_question_ends_the_exchange() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let t = ex.poll_transmit().unwrap();
    let answer = response_to(&ex, 3, false);
    ex.handle_datagram(now + Duration::from_millis(7), t.attempt, &answer);
    assert_eq!(
        events(&mut ex),
        vec![Event::Answered {
            upstream: 0,
            took: Duration::from_millis(7)
        }]
    );
    assert_eq!(
        ex.poll_outcome().unwrap().unwrap(),
        answer,
        "NXDOMAIN is an answer"
    );
    assert!(ex.poll_outcome().is_none(), "the outcome comes once");
    assert_eq!(ex.poll_timeout(), None);
    assert!(!ex.waits_on(t.attempt));
}

#[test]
fn a_datagram_with_another_id_or_question_is_dropped_and_the_wait_goes_on() {
    let now = Instant::now();
    let mut ex = start(1, now);
    let t = ex.poll_transmit().unwrap();
    let mut wrong_id = response_to(&ex, 0, false);
    wrong_id[0] ^= 0xff;
    ex.handle_datagram(now, t.attempt, &wrong_id);
    let mut wrong_question = response_to(&ex, 0, false);
    let last = wrong_question.len() - 6; // a letter of the name
    wrong_question[last] ^= 0x01;
    ex.handle_datagram(now, t.attempt, &wrong_question);
    ex.handle_datagram(now, t.attempt, &[]);
    assert_eq!(events(&mut ex), vec![Event::Unexpected; 3]);
    assert!(ex.waits_on(t.attempt));
    assert!(ex.poll_outcome().is_none());
    // The letter case of the question may differ (0x20 encoding).
    let mut upper = response_to(&ex, 0, false);
    upper[13..14].make_ascii_uppercase();
    ex.handle_datagram(now, t.attempt, &upper);
    assert!(ex.poll_outcome().unwrap().is_ok());
}

#[test]
fn a_datagram_for_an_earlier_attempt_is_ignored() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let first = ex.poll_transmit().unwrap();
    let late = response_to(&ex, 0, false);
    ex.handle_timeout(now + PER_TRY);
    let second = ex.poll_transmit().unwrap();
    assert_ne!(first.attempt, second.attempt);
    ex.handle_datagram(now + PER_TRY, first.attempt, &late);
    assert!(events(&mut ex)
        .iter()
        .all(|e| !matches!(e, Event::Answered { .. })));
    assert!(ex.poll_outcome().is_none());
    assert!(ex.waits_on(second.attempt));
}

#[test]
fn a_silent_upstream_is_passed_over_when_its_share_of_time_is_up() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let first = ex.poll_transmit().unwrap();
    ex.handle_timeout(now + PER_TRY - Duration::from_millis(1));
    assert!(ex.poll_transmit().is_none(), "not due yet");
    ex.handle_timeout(now + PER_TRY);
    assert_eq!(events(&mut ex), vec![failed(0, "timeout")]);
    let second = ex.poll_transmit().unwrap();
    assert_eq!((second.upstream, second.transport), (1, Transport::Udp));
    assert!(second.attempt > first.attempt);
    assert_eq!(ex.poll_timeout(), Some(now + PER_TRY + PER_TRY));
}

#[test]
fn servfail_and_refused_move_on_and_the_last_failure_is_the_outcome() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let t = ex.poll_transmit().unwrap();
    ex.handle_datagram(now, t.attempt, &response_to(&ex, 2, false));
    let t = ex.poll_transmit().unwrap();
    assert_eq!(t.upstream, 1);
    ex.handle_datagram(now, t.attempt, &response_to(&ex, 5, false));
    assert_eq!(
        events(&mut ex),
        vec![failed(0, "servfail"), failed(1, "servfail")]
    );
    assert!(matches!(
        ex.poll_outcome(),
        Some(Err(FetchError::Failed(ResponseCode::Refused)))
    ));
    assert_eq!(ex.poll_transmit(), None);
}

#[test]
fn a_truncated_answer_is_asked_again_over_tcp_of_the_same_upstream() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let t = ex.poll_transmit().unwrap();
    ex.handle_datagram(now, t.attempt, &response_to(&ex, 0, true));
    let tcp = ex.poll_transmit().expect("asked again");
    assert_eq!((tcp.upstream, tcp.transport), (0, Transport::Tcp));
    assert!(!ex.waits_on(tcp.attempt), "no datagram is waited for");
    // The TCP attempt has all the time the query has left.
    assert_eq!(ex.poll_timeout(), Some(now + TOTAL));
    // A datagram now, even a right one for the UDP attempt, changes nothing.
    ex.handle_datagram(now, tcp.attempt, &response_to(&ex, 0, false));
    assert!(ex.poll_outcome().is_none());
    let whole = response_to(&ex, 0, false);
    ex.handle_stream(now, tcp.attempt, &whole);
    assert_eq!(ex.poll_outcome().unwrap().unwrap(), whole);
}

#[test]
fn a_stream_answer_to_another_question_fails_that_upstream() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let t = ex.poll_transmit().unwrap();
    ex.handle_datagram(now, t.attempt, &response_to(&ex, 0, true));
    let tcp = ex.poll_transmit().unwrap();
    let mut other = response_to(&ex, 0, false);
    other[0] ^= 0x55;
    ex.handle_stream(now, tcp.attempt, &other);
    assert_eq!(events(&mut ex), vec![failed(0, "malformed")]);
    let next = ex.poll_transmit().unwrap();
    assert_eq!((next.upstream, next.transport), (1, Transport::Udp));
}

#[test]
fn our_own_shortage_ends_the_query_and_blames_no_upstream() {
    for code in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS] {
        let now = Instant::now();
        let mut ex = start(3, now);
        let t = ex.poll_transmit().unwrap();
        ex.handle_error(now, t.attempt, io::Error::from_raw_os_error(code));
        assert_eq!(events(&mut ex), vec![], "errno {code}");
        assert!(matches!(ex.poll_outcome(), Some(Err(FetchError::Local(_)))));
        assert_eq!(ex.poll_transmit(), None);
    }
    let now = Instant::now();
    let mut ex = start(3, now);
    let t = ex.poll_transmit().unwrap();
    ex.handle_error(now, t.attempt, io::ErrorKind::WouldBlock.into());
    assert!(matches!(ex.poll_outcome(), Some(Err(FetchError::Local(_)))));
}

#[test]
fn an_upstream_that_refuses_the_connection_is_passed_over() {
    let now = Instant::now();
    let mut ex = start(2, now);
    let t = ex.poll_transmit().unwrap();
    ex.handle_error(now, t.attempt, io::ErrorKind::ConnectionRefused.into());
    assert_eq!(events(&mut ex), vec![failed(0, "io")]);
    assert_eq!(ex.poll_transmit().unwrap().upstream, 1);
    // An error reported late, for the attempt that is over, is ignored.
    ex.handle_error(now, t.attempt, io::ErrorKind::ConnectionRefused.into());
    assert_eq!(events(&mut ex), vec![]);
}

#[test]
fn the_query_ends_at_its_deadline_however_many_upstreams_are_left() {
    let now = Instant::now();
    let (wire, end) = request("a.example.net.");
    let total = Duration::from_millis(700);
    let mut ex = Exchange::new(&wire, end, routes(5), total, PER_TRY, now);
    let mut at = now;
    let mut asked = 0;
    while ex.poll_transmit().is_some() {
        asked += 1;
        at = ex.poll_timeout().unwrap();
        assert!(at <= now + total, "no attempt outlives the query");
        ex.handle_timeout(at);
    }
    assert_eq!(asked, 3, "300 + 300 + the 100 left");
    assert_eq!(at, now + total);
    assert!(matches!(ex.poll_outcome(), Some(Err(FetchError::Timeout))));
}

#[test]
fn a_request_without_a_question_fails_at_once() {
    let now = Instant::now();
    let (wire, _) = request("a.example.net.");
    for end in [0, HEADER, wire.len() + 1] {
        let mut ex = Exchange::new(&wire, end, routes(1), TOTAL, PER_TRY, now);
        assert_eq!(ex.poll_transmit(), None);
        assert!(matches!(
            ex.poll_outcome(),
            Some(Err(FetchError::Malformed))
        ));
    }
    let mut none = Exchange::new(&wire, wire.len(), vec![], TOTAL, PER_TRY, now);
    assert_eq!(none.poll_transmit(), None);
    assert!(matches!(
        none.poll_outcome(),
        Some(Err(FetchError::Timeout))
    ));
}

proptest! {
    /// Whatever arrives, nothing panics, and only a datagram with the
    /// attempt's ID and question ends the wait.
    #[test]
    fn arbitrary_datagrams_never_pass_for_the_answer(
        datagrams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 1..20)
    ) {
        let now = Instant::now();
        let mut ex = start(1, now);
        let t = ex.poll_transmit().unwrap();
        let asked = ex.payload().to_vec();
        for d in &datagrams {
            ex.handle_datagram(now, t.attempt, d);
            ex.handle_stream(now, t.attempt, d);
            let carries_both = d.get(..2) == asked.get(..2)
                && d.get(HEADER..asked.len()).is_some_and(|q| q.eq_ignore_ascii_case(&asked[HEADER..]));
            if !carries_both {
                prop_assert!(ex.waits_on(t.attempt));
                prop_assert!(ex.poll_outcome().is_none());
            }
            while ex.poll_event().is_some() {}
        }
    }
}
