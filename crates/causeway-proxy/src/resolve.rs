//! Upstream names, resolved by hickory-resolver: one resolver and one
//! cache for the whole proxy, keeping each answer for its TTL (held between
//! 1 s and 5 min). The servers are the configured `resolvers`, or else the
//! system's: `/etc/resolv.conf` with its search list and `ndots` (so a pod's
//! short Service names work) and `/etc/hosts`. An answer is taken only from
//! the server asked, with the query's ID and question; anything else is
//! dropped by the resolver.
//!
//! What happens when a lookup fails (the last good answer, held for a
//! while) is the caller's, the same whichever servers answer.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    NameServerConfig, NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::TokioResolver;

/// Bounds on how long an answer is kept, whatever its TTL says.
const MIN_TTL: Duration = Duration::from_secs(1);
const MAX_TTL: Duration = Duration::from_secs(300);
/// Per server and attempt; a black-holed server costs one connection this
/// long per name, since the caller asks again only after a pause.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

pub struct NameResolver {
    resolver: TokioResolver,
    /// Lookups run on this runtime, whichever proxy thread asks, so the
    /// resolver's sockets and background tasks live on one runtime that
    /// outlives every proxy thread.
    runtime: tokio::runtime::Handle,
}

fn options(hosts: ResolveHosts) -> ResolverOpts {
    let mut o = ResolverOpts::default();
    o.timeout = QUERY_TIMEOUT;
    o.attempts = 1;
    o.positive_min_ttl = Some(MIN_TTL);
    o.positive_max_ttl = Some(MAX_TTL);
    // A failure is the caller's to hold; the resolver does not add its own.
    o.negative_max_ttl = Some(Duration::ZERO);
    o.use_hosts_file = hosts;
    o
}

impl NameResolver {
    /// Asks `servers` (UDP, and TCP for truncated answers), or the system's
    /// servers when the list is empty. Must run inside a tokio runtime; its
    /// lookups run there.
    pub fn new(servers: &[SocketAddr]) -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let resolver = if servers.is_empty() {
            let mut builder = TokioResolver::builder_tokio().map_err(|e| {
                io::Error::other(format!("reading the system resolver config: {e}"))
            })?;
            let system = builder.options_mut().clone();
            let mut opts = options(ResolveHosts::Always);
            opts.ndots = system.ndots;
            *builder.options_mut() = opts;
            builder.build()
        } else {
            let group: Vec<NameServerConfig> = servers
                .iter()
                .flat_map(|s| {
                    [
                        NameServerConfig::new(*s, Protocol::Udp),
                        NameServerConfig::new(*s, Protocol::Tcp),
                    ]
                })
                .collect();
            let config =
                ResolverConfig::from_parts(None, vec![], NameServerConfigGroup::from(group));
            TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
                .with_options(options(ResolveHosts::Never))
                .build()
        };
        Ok(NameResolver { resolver, runtime })
    }

    /// The addresses of `host`: from the cache while fresh, else asked
    /// anew; an error when no server gives one.
    pub async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let (resolver, name) = (self.resolver.clone(), host.to_string());
        let answer = self
            .runtime
            .spawn(async move { resolver.lookup_ip(name).await })
            .await
            .map_err(io::Error::other)?;
        match answer {
            Ok(found) => {
                let addrs: Vec<IpAddr> = found.iter().collect();
                if addrs.is_empty() {
                    Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{host} has no address"),
                    ))
                } else {
                    Ok(addrs)
                }
            }
            Err(e) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host}: {e}"),
            )),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, Query};
    use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};

    /// A UDP socket on loopback for a test to answer queries on itself; a
    /// read gives up after 5 s, so a test whose query never comes fails
    /// instead of hanging (test helper, also used by the upstream tests).
    pub(crate) fn stand_in_resolver() -> std::net::UdpSocket {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        server
    }

    /// Answers one query on `server` with `answer`, given the query.
    fn answer_one(server: &std::net::UdpSocket, answer: impl FnOnce(&Message) -> Message) {
        let mut buf = [0u8; 512];
        let (n, from) = server.recv_from(&mut buf).unwrap();
        let query = Message::from_vec(&buf[..n]).unwrap();
        server
            .send_to(&answer(&query).to_vec().unwrap(), from)
            .unwrap();
    }

    fn reply_to(query: &Message) -> Message {
        let mut reply = Message::new();
        reply
            .set_id(query.id())
            .set_message_type(MessageType::Response)
            .set_recursion_available(true);
        reply.add_queries(query.queries().to_vec());
        reply
    }

    /// Answers one query on `server` with no address (test helper, also used
    /// by the upstream tests).
    pub(crate) fn answer_with_no_address(server: &std::net::UdpSocket) {
        answer_one(server, reply_to);
    }

    fn with_address(query: &Message, name: &Name, ip: [u8; 4]) -> Message {
        let mut reply = reply_to(query);
        if query.queries()[0].query_type() == RecordType::A {
            reply.add_answer(Record::from_rdata(
                name.clone(),
                60,
                RData::A(A::from(std::net::Ipv4Addr::from(ip))),
            ));
        }
        reply
    }

    #[tokio::test]
    async fn answers_are_cached_for_their_ttl() {
        let server = stand_in_resolver();
        let names = NameResolver::new(&[server.local_addr().unwrap()]).unwrap();
        let name = Name::from_ascii("api.test.").unwrap();
        let answering = std::thread::spawn(move || {
            answer_one(&server, |q| with_address(q, &name, [10, 0, 0, 7]));
            server
        });
        assert_eq!(
            names.lookup("api.test").await.unwrap(),
            vec![IpAddr::from([10, 0, 0, 7])]
        );
        let server = answering.join().unwrap();
        // The second lookup is answered from the cache: nothing is asked.
        assert_eq!(
            names.lookup("api.test").await.unwrap(),
            vec![IpAddr::from([10, 0, 0, 7])]
        );
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        assert!(
            server.recv_from(&mut buf).is_err(),
            "asked again within the TTL"
        );
    }

    /// An answer for another question (with the right ID, from the right
    /// server) is not taken: the lookup fails rather than return it.
    #[tokio::test]
    async fn an_answer_to_another_question_is_not_taken() {
        let server = stand_in_resolver();
        let names = NameResolver::new(&[server.local_addr().unwrap()]).unwrap();
        let answering = std::thread::spawn(move || {
            answer_one(&server, |q| {
                // The question is another name's; the record is for the
                // name asked, so only the question check can refuse it.
                let mut forged = Message::new();
                forged
                    .set_id(q.id())
                    .set_message_type(MessageType::Response);
                forged.add_query(Query::query(
                    Name::from_ascii("evil.test.").unwrap(),
                    RecordType::A,
                ));
                forged.add_answer(Record::from_rdata(
                    Name::from_ascii("api.test.").unwrap(),
                    60,
                    RData::A(A::new(6, 6, 6, 6)),
                ));
                forged
            });
        });
        let found = names.lookup("api.test").await;
        answering.join().unwrap();
        assert!(
            found.as_ref().is_err(),
            "an answer to another question was taken: {found:?}"
        );
    }

    /// An empty answer is a failure, not an empty address list, so the
    /// caller falls back to the last good answer and says so.
    #[tokio::test]
    async fn a_lookup_that_finds_no_address_fails() {
        let server = stand_in_resolver();
        let names = NameResolver::new(&[server.local_addr().unwrap()]).unwrap();
        let answering = std::thread::spawn(move || {
            // Both families may be asked; answer each with nothing.
            answer_with_no_address(&server);
            server
                .set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 512];
            if let Ok((n, from)) = server.recv_from(&mut buf) {
                let q = Message::from_vec(&buf[..n]).unwrap();
                server
                    .send_to(&reply_to(&q).to_vec().unwrap(), from)
                    .unwrap();
            }
        });
        assert!(names.lookup("api.test").await.is_err());
        answering.join().unwrap();
    }
}
