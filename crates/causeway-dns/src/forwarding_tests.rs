//! Forwarding, from the UDP threads and for TCP clients, through a running
//! server, against upstreams on loopback that each test drives by hand:
//! when they answer, what, from where, and whether over TCP.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use causeway_config::Config;
use causeway_runtime::Shutdown;
use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::authority::DynamicNames;
use crate::metrics::DnsMetrics;
use crate::server::DnsServer;

struct Lab {
    addr: SocketAddr,
    metrics: DnsMetrics,
    server: DnsServer,
    trigger: Shutdown,
}

/// A server on a free loopback port with two UDP threads (steered to the
/// first two usable CPUs), forwarding to `upstreams`.
async fn serve(upstreams: &[SocketAddr], extra: &str) -> Lab {
    let addr = crate::server::tests::reserved_address();
    let upstreams: Vec<String> = upstreams.iter().map(|u| format!("\"{u}\"")).collect();
    let yaml = format!(
        "cluster: {{name: hc1, baseDomain: example.com}}\n\
         dns:\n  listen: [\"{addr}\"]\n  proxyAddress: 192.168.100.2\n  udpSockets: 2\n  upstreams: [{}]\n{extra}",
        upstreams.join(", ")
    );
    let cfg = Config::from_yaml(&yaml).unwrap().dns.unwrap();
    let metrics = DnsMetrics::new(&prometheus::Registry::new()).unwrap();
    let shutdown = Shutdown::new();
    let trigger = shutdown.clone();
    let server = DnsServer::start(
        &cfg,
        Arc::new(DynamicNames::for_zone(None)),
        metrics.clone(),
        shutdown,
    )
    .await
    .unwrap();
    Lab {
        addr,
        metrics,
        server,
        trigger,
    }
}

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

/// An upstream's answer to `request`: one A record, or, truncated, none.
fn answer(request: &[u8], ip: Ipv4Addr, truncated: bool) -> Vec<u8> {
    let q = Message::from_vec(request).unwrap();
    let mut m = Message::new();
    m.set_id(q.id())
        .set_message_type(MessageType::Response)
        .set_recursion_desired(true)
        .set_recursion_available(true)
        .set_truncated(truncated);
    m.add_queries(q.queries().to_vec());
    if !truncated {
        let name = q.queries()[0].name().clone();
        m.add_answer(Record::from_rdata(name, 300, RData::A(A(ip))));
    }
    m.to_vec().unwrap()
}

fn socket() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// The reply `client` gets: its ID and its A records.
fn reply(client: &UdpSocket) -> (u16, Vec<Ipv4Addr>) {
    let mut buf = [0u8; 1500];
    let (n, _) = client.recv_from(&mut buf).expect("a reply within 5 s");
    id_and_addresses(&buf[..n])
}

fn id_and_addresses(wire: &[u8]) -> (u16, Vec<Ipv4Addr>) {
    let m = Message::from_vec(wire).unwrap();
    let ips = m
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    (m.id(), ips)
}

/// Reads one query on `upstream` and answers it with `ip` (or, truncated,
/// with nothing).
fn answer_next(upstream: &UdpSocket, ip: Ipv4Addr, truncated: bool) {
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    upstream
        .send_to(&answer(&buf[..n], ip, truncated), from)
        .unwrap();
}

/// `upstream_errors_total` for one upstream and reason.
fn upstream_errors(lab: &Lab, upstream: SocketAddr, reason: &str) -> u64 {
    lab.metrics
        .upstream_errors
        .with_label_values(&[upstream.to_string().as_str(), reason])
        .get()
}

/// Polls `done`, a millisecond apart, for at most 5 s.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < until, "not within 5 s: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Sends `wire` from `client` on a thread pinned to `cpu`: the server's
/// UDP sockets are steered one per CPU, so this picks the thread that
/// reads it.
fn send_from_cpu(cpu: usize, client: &UdpSocket, wire: &[u8], to: SocketAddr) {
    std::thread::scope(|s| {
        s.spawn(|| {
            causeway_runtime::cpus::pin_current_thread(cpu).unwrap();
            client.send_to(wire, to).unwrap();
        });
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_queries_in_flight_share_one_upstream_query() {
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let clients: Vec<UdpSocket> = (0..5).map(|_| socket()).collect();
    // From alternate CPUs, so both UDP threads join the one upstream query
    // (with one usable CPU, one thread takes them all).
    let cpus = causeway_runtime::cpus::usable();
    for (i, c) in clients.iter().enumerate() {
        let wire = query(100 + i as u16, "www.example.net.");
        send_from_cpu(cpus[i % cpus.len()], c, &wire, lab.addr);
    }
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    // The answer is held until the four later queries have joined the first.
    eventually("four queries coalesced", || {
        lab.metrics.coalesced.get() == 4
    });
    let ip = Ipv4Addr::new(192, 0, 2, 7);
    upstream
        .send_to(&answer(&buf[..n], ip, false), from)
        .unwrap();
    for (i, c) in clients.iter().enumerate() {
        assert_eq!(reply(c), (100 + i as u16, vec![ip]));
    }
    upstream.set_nonblocking(true).unwrap();
    assert!(
        upstream.recv_from(&mut buf).is_err(),
        "a second upstream query was sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_upstream_is_passed_over_for_the_next() {
    let (silent, answering) = (socket(), socket());
    let silent_addr = silent.local_addr().unwrap();
    // Two upstreams in 2 s: each gets 1 s before the next is asked.
    let lab = serve(
        &[silent_addr, answering.local_addr().unwrap()],
        "  upstreamTimeout: 2s\n",
    )
    .await;
    let ip = Ipv4Addr::new(192, 0, 2, 8);
    let answerer = std::thread::spawn(move || answer_next(&answering, ip, false));
    let client = socket();
    client
        .send_to(&query(7, "failover.example.net."), lab.addr)
        .unwrap();
    assert_eq!(reply(&client), (7, vec![ip]));
    answerer.join().unwrap();
    let mut buf = [0u8; 1500];
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv_from(&mut buf).is_ok(),
        "the first upstream was not asked first"
    );
    let timeouts = upstream_errors(&lab, silent_addr, "timeout");
    assert_eq!(timeouts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_upstream_answer_is_asked_again_over_tcp() {
    // One upstream port for both: a UDP socket that always truncates, and
    // a TCP listener with the whole answer.
    let (udp, tcp) = loop {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()) {
            break (udp, tcp);
        }
    };
    let lab = serve(&[udp.local_addr().unwrap()], "").await;
    let ip = Ipv4Addr::new(192, 0, 2, 9);
    let upstream = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let (n, from) = udp.recv_from(&mut buf).unwrap();
        udp.send_to(&answer(&buf[..n], ip, true), from).unwrap();
        let (mut stream, _) = tcp.accept().unwrap();
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).unwrap();
        let mut request = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut request).unwrap();
        let whole = answer(&request, ip, false);
        let mut framed = u16::try_from(whole.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&whole);
        stream.write_all(&framed).unwrap();
    });
    let client = socket();
    client
        .send_to(&query(9, "big.example.net."), lab.addr)
        .unwrap();
    assert_eq!(reply(&client), (9, vec![ip]));
    upstream.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_another_address_is_not_taken() {
    let (upstream, forger) = (socket(), socket());
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    client
        .send_to(&query(10, "forged.example.net."), lab.addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    // Right ID, right question, right port, wrong source port: the query's
    // socket is connected to the upstream, so the kernel drops it.
    forger
        .send_to(
            &answer(&buf[..n], Ipv4Addr::new(203, 0, 113, 66), false),
            from,
        )
        .unwrap();
    let ip = Ipv4Addr::new(192, 0, 2, 10);
    upstream
        .send_to(&answer(&buf[..n], ip, false), from)
        .unwrap();
    assert_eq!(reply(&client), (10, vec![ip]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_another_question_is_not_taken() {
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    client
        .send_to(&query(12, "asked.example.net."), lab.addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    let id = u16::from_be_bytes([buf[0], buf[1]]);
    // The right source, port and ID, answering a name that was not asked.
    let mut other = query(id, "other.example.net.");
    other = answer(&other, Ipv4Addr::new(203, 0, 113, 67), false);
    upstream.send_to(&other, from).unwrap();
    let dropped = || {
        lab.metrics
            .dropped
            .with_label_values(&["unexpected_upstream_response"])
            .get()
    };
    eventually("the answer to another question dropped", || dropped() == 1);
    let ip = Ipv4Addr::new(192, 0, 2, 12);
    upstream
        .send_to(&answer(&buf[..n], ip, false), from)
        .unwrap();
    assert_eq!(reply(&client), (12, vec![ip]));
}

/// What comes back must be a response to exactly the one question asked:
/// the query itself reflected (QR clear), or a packet that carries the
/// question and another, is not an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reflected_query_or_a_second_question_is_not_an_answer() {
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    client
        .send_to(&query(14, "reflected.example.net."), lab.addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    let dropped = || {
        lab.metrics
            .dropped
            .with_label_values(&["unexpected_upstream_response"])
            .get()
    };
    // Sent back as it came: same ID, same question, not a response.
    upstream.send_to(&buf[..n], from).unwrap();
    eventually("the reflected query dropped", || dropped() == 1);
    // A response with the question asked and a second one after it.
    let mut two =
        Message::from_vec(&answer(&buf[..n], Ipv4Addr::new(203, 0, 113, 14), false)).unwrap();
    two.add_query(Query::query(
        Name::from_ascii("extra.example.net.").unwrap(),
        RecordType::A,
    ));
    upstream.send_to(&two.to_vec().unwrap(), from).unwrap();
    eventually("the two-question answer dropped", || dropped() == 2);
    let ip = Ipv4Addr::new(192, 0, 2, 14);
    upstream
        .send_to(&answer(&buf[..n], ip, false), from)
        .unwrap();
    assert_eq!(reply(&client), (14, vec![ip]));
}

/// RFC 5452: the port is half of what keeps a forged answer out. An
/// attacker learns the port of each upstream query it can see (its own
/// name's, and every victim's once answered), is even granted each next
/// query's ID and question, and sends the forged answer from the
/// upstream's own address to every port it has learned, ahead of the
/// genuine answer. None is taken: each query leaves from a port of its own.
///
/// The kernel picks each port at random from the ephemeral range (28,232
/// ports by default), so two of these four queries share one by chance
/// about once in 5,000 runs; then the forgery lands, as it would for a
/// real attacker with those odds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_answer_to_the_port_of_an_earlier_query_is_not_taken() {
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    let cpu = causeway_runtime::cpus::usable()[0];
    let mut buf = [0u8; 1500];
    // The attacker's own name: its query shows the port used.
    send_from_cpu(cpu, &client, &query(20, "attacker.example.org."), lab.addr);
    let (n, learned) = upstream.recv_from(&mut buf).unwrap();
    upstream
        .send_to(
            &answer(&buf[..n], Ipv4Addr::new(198, 51, 100, 1), false),
            learned,
        )
        .unwrap();
    assert_eq!(reply(&client).0, 20);
    let mut ports = vec![learned.port()];
    let forged_ip = Ipv4Addr::new(203, 0, 113, 66);
    for (id, name, last) in [
        (21, "victim.example.net.", 21),
        (22, "victim2.example.net.", 22),
        (23, "victim3.example.net.", 23),
    ] {
        // From the same CPU, so the same serving thread sends it.
        send_from_cpu(cpu, &client, &query(id, name), lab.addr);
        let (n, asked) = upstream.recv_from(&mut buf).unwrap();
        // The ID and question are granted to the attacker; the port is
        // each one it learned.
        let forged = answer(&buf[..n], forged_ip, false);
        for &port in &ports {
            upstream
                .send_to(&forged, SocketAddr::new(asked.ip(), port))
                .unwrap();
        }
        ports.push(asked.port());
        let genuine = Ipv4Addr::new(192, 0, 2, last);
        upstream
            .send_to(&answer(&buf[..n], genuine, false), asked)
            .unwrap();
        assert_eq!(
            reply(&client),
            (id, vec![genuine]),
            "the forged answer sent to the ports of earlier queries {:?} was taken (this query's port: {})",
            &ports[..ports.len() - 1],
            asked.port()
        );
    }
    let mut distinct = ports.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        ports.len(),
        "upstream queries shared a source port: {ports:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_upstream_at_shutdown_gets_servfail_not_silence() {
    let silent = socket();
    let lab = serve(&[silent.local_addr().unwrap()], "  upstreamTimeout: 30s\n").await;
    let client = socket();
    client
        .send_to(&query(11, "late.example.net."), lab.addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    silent
        .recv_from(&mut buf)
        .expect("the query reached the upstream");
    let stopped = Instant::now();
    lab.trigger.cancel();
    tokio::time::timeout(Duration::from_secs(5), lab.server.wait())
        .await
        .expect("the server stopped");
    let (n, _) = client.recv_from(&mut buf).expect("an answer at shutdown");
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!((m.id(), m.response_code()), (11, ResponseCode::ServFail));
    // Far inside the 30 s upstream timeout: the shutdown answered it.
    assert!(stopped.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edns_and_the_do_bit_go_upstream_and_come_back() {
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    let mut asked = Message::from_vec(&query(12, "signed.example.net.")).unwrap();
    let mut edns = Edns::new();
    edns.set_max_payload(1232).set_dnssec_ok(true);
    asked.set_edns(edns.clone());
    client.send_to(&asked.to_vec().unwrap(), lab.addr).unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    let forwarded = Message::from_vec(&buf[..n]).unwrap();
    let sent_on = forwarded.extensions().as_ref();
    assert!(sent_on.is_some(), "the query went upstream without EDNS");
    assert!(
        sent_on.is_some_and(|e| e.flags().dnssec_ok),
        "the DO bit was cleared on the way upstream"
    );
    // The upstream answers with an OPT of its own, DO set, as a server
    // that returns DNSSEC records does.
    let ip = Ipv4Addr::new(192, 0, 2, 12);
    let mut answered = Message::from_vec(&answer(&buf[..n], ip, false)).unwrap();
    answered.set_edns(edns);
    upstream.send_to(&answered.to_vec().unwrap(), from).unwrap();
    let (n, _) = client.recv_from(&mut buf).expect("a reply within 5 s");
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.id(), 12);
    assert!(
        m.extensions().as_ref().is_some_and(|e| e.flags().dnssec_ok),
        "the reply lost the upstream's EDNS or its DO bit"
    );
    assert_eq!(m.answers().len(), 1);
}

/// An answer is cached for every client, so what goes upstream must ask for
/// one every client may have: recursion desired whatever the client set,
/// and no Client Subnet (an answer scoped to one client's subnet would be
/// served to all). The next client, asking normally, gets the cached answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rd0_and_client_subnet_queries_go_upstream_as_every_client_would_ask() {
    use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption};
    let upstream = socket();
    let lab = serve(&[upstream.local_addr().unwrap()], "").await;
    let client = socket();
    let mut asked = Message::from_vec(&query(31, "scoped.example.net.")).unwrap();
    asked.set_recursion_desired(false);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    edns.options_mut()
        .insert(EdnsOption::Subnet(ClientSubnet::new(
            std::net::IpAddr::V4(Ipv4Addr::new(198, 51, 100, 0)),
            24,
            0,
        )));
    asked.set_edns(edns);
    client.send_to(&asked.to_vec().unwrap(), lab.addr).unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = upstream.recv_from(&mut buf).unwrap();
    let forwarded = Message::from_vec(&buf[..n]).unwrap();
    assert!(
        forwarded.recursion_desired(),
        "a client's RD=0 went upstream: a cache-only answer would be cached for everyone"
    );
    let opt = forwarded.extensions().as_ref().expect("EDNS kept");
    assert!(
        opt.options().as_ref().is_empty(),
        "the client's EDNS options went upstream: {:?}",
        opt.options()
    );
    assert_eq!(forwarded.queries().len(), 1);
    let ip = Ipv4Addr::new(192, 0, 2, 31);
    upstream
        .send_to(&answer(&buf[..n], ip, false), from)
        .unwrap();
    let first = {
        let (n, _) = client.recv_from(&mut buf).expect("a reply within 5 s");
        Message::from_vec(&buf[..n]).unwrap()
    };
    assert_eq!(first.id(), 31);
    assert!(!first.recursion_desired(), "the client's own RD comes back");
    // Another client, asking as clients do (EDNS, no Client Subnet: the
    // same cache entry), is answered from the cache: with the answer to a
    // full, unscoped question.
    let other = socket();
    let mut plain = Message::from_vec(&query(32, "scoped.example.net.")).unwrap();
    plain.set_edns(Edns::new());
    other.send_to(&plain.to_vec().unwrap(), lab.addr).unwrap();
    assert_eq!(reply(&other), (32, vec![ip]));
    upstream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(
        upstream.recv_from(&mut buf).is_err(),
        "the second client's query went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_in_flight_bound_a_new_name_gets_servfail_at_once() {
    let silent = socket();
    let lab = serve(
        &[silent.local_addr().unwrap()],
        "  upstreamTimeout: 30s\n  maxUpstreamInFlight: 2\n",
    )
    .await;
    let client = socket();
    client
        .send_to(&query(21, "one.example.net."), lab.addr)
        .unwrap();
    client
        .send_to(&query(22, "two.example.net."), lab.addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    for _ in 0..2 {
        silent
            .recv_from(&mut buf)
            .expect("both queries went upstream");
    }
    eventually("two upstream queries in flight", || {
        lab.metrics.upstream_in_flight.get() == 2
    });
    let asked = Instant::now();
    client
        .send_to(&query(23, "three.example.net."), lab.addr)
        .unwrap();
    let (n, _) = client.recv_from(&mut buf).expect("an answer to the third");
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!((m.id(), m.response_code()), (23, ResponseCode::ServFail));
    // Far inside the 30 s upstream timeout: refused at the bound, not timed out.
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert_eq!(
        lab.metrics
            .forward_failures
            .with_label_values(&["overloaded", "servfail"])
            .get(),
        1
    );
    silent.set_nonblocking(true).unwrap();
    assert!(
        silent.recv_from(&mut buf).is_err(),
        "a third query went upstream past the bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_random_policy_spreads_queries_over_the_upstreams() {
    let upstreams = [socket(), socket()];
    let addrs: Vec<SocketAddr> = upstreams.iter().map(|u| u.local_addr().unwrap()).collect();
    let lab = serve(&addrs, "  upstreamPolicy: random\n").await;
    for u in &upstreams {
        u.set_nonblocking(true).unwrap();
    }
    let client = socket();
    let ip = Ipv4Addr::new(192, 0, 2, 13);
    let mut asked = [0usize; 2];
    // 40 names: all on one upstream by chance is 2 in 2^40.
    for i in 0..40u16 {
        client
            .send_to(&query(200 + i, &format!("r{i}.example.net.")), lab.addr)
            .unwrap();
        let mut buf = [0u8; 1500];
        let mut got = None;
        eventually("the query upstream", || {
            got = upstreams
                .iter()
                .enumerate()
                .find_map(|(k, u)| u.recv_from(&mut buf).ok().map(|(n, from)| (k, n, from)));
            got.is_some()
        });
        let Some((k, n, from)) = got else {
            unreachable!("eventually returned")
        };
        asked[k] += 1;
        upstreams[k]
            .send_to(&answer(&buf[..n], ip, false), from)
            .unwrap();
        assert_eq!(reply(&client), (200 + i, vec![ip]));
    }
    assert!(
        asked.iter().all(|&n| n > 0),
        "every query went to one upstream: {asked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_tcp_fails_after_truncation_the_next_upstream_is_asked() {
    // The first upstream truncates over UDP and has nothing listening on
    // TCP; the query, handed from the UDP thread to the runtime for TCP,
    // goes on there to the second upstream over UDP.
    let (truncating, answering) = (socket(), socket());
    let truncating_addr = truncating.local_addr().unwrap();
    let lab = serve(
        &[truncating_addr, answering.local_addr().unwrap()],
        "  upstreamTimeout: 4s\n",
    )
    .await;
    let ip = Ipv4Addr::new(192, 0, 2, 12);
    let upstreams = std::thread::spawn(move || {
        answer_next(&truncating, ip, true);
        answer_next(&answering, ip, false);
    });
    let client = socket();
    client
        .send_to(&query(12, "no-tcp.example.net."), lab.addr)
        .unwrap();
    assert_eq!(reply(&client), (12, vec![ip]));
    upstreams.join().unwrap();
    let refused = upstream_errors(&lab, truncating_addr, "io");
    assert_eq!(refused, 1, "the refused connection counts against it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_clients_query_passes_a_silent_upstream_and_a_wrong_id_by() {
    // Queries that come over TCP run the same exchange, driven on the
    // runtime: the silent first upstream times out, and the second's
    // datagram with another ID is dropped before its answer is taken.
    let (silent, answering) = (socket(), socket());
    let silent_addr = silent.local_addr().unwrap();
    let lab = serve(
        &[silent_addr, answering.local_addr().unwrap()],
        "  upstreamTimeout: 2s\n",
    )
    .await;
    let ip = Ipv4Addr::new(192, 0, 2, 13);
    let answerer = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let (n, from) = answering.recv_from(&mut buf).unwrap();
        let mut wrong = answer(&buf[..n], Ipv4Addr::new(203, 0, 113, 13), false);
        wrong[0] ^= 0xff;
        answering.send_to(&wrong, from).unwrap();
        answering
            .send_to(&answer(&buf[..n], ip, false), from)
            .unwrap();
    });
    let mut stream = std::net::TcpStream::connect(lab.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let wire = query(13, "over-tcp.example.net.");
    let mut framed = u16::try_from(wire.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(&wire);
    stream.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).expect("a reply within 5 s");
    let mut got = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut got).unwrap();
    assert_eq!(id_and_addresses(&got), (13, vec![ip]));
    answerer.join().unwrap();
    let timeouts = upstream_errors(&lab, silent_addr, "timeout");
    assert_eq!(timeouts, 1);
    let dropped = lab
        .metrics
        .dropped
        .with_label_values(&["unexpected_upstream_response"])
        .get();
    assert_eq!(dropped, 1);
}
