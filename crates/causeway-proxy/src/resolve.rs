//! Upstream names resolved by configured DNS servers, cached for their TTL
//! and re-resolved when it runs out. When every server fails the lookup
//! fails; what happens then (the last good answer, held for a while) is the
//! caller's, the same whichever resolver it uses.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::net::UdpSocket;

/// Bounds on how long an answer is kept, whatever its TTL says.
const MIN_TTL: Duration = Duration::from_secs(1);
const MAX_TTL: Duration = Duration::from_secs(300);
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

struct Entry {
    addrs: Vec<IpAddr>,
    expires: Instant,
}

pub struct DnsResolver {
    servers: Vec<SocketAddr>,
    cache: Mutex<HashMap<String, Entry>>,
}

impl DnsResolver {
    pub fn new(servers: Vec<SocketAddr>) -> Self {
        DnsResolver {
            servers,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The addresses of `host`: cached while fresh, else asked anew; an
    /// error when every server fails.
    pub async fn lookup(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = cache.get(host).filter(|e| Instant::now() < e.expires) {
                return Ok(e.addrs.clone());
            }
        }
        let mut last_err = io::Error::new(
            io::ErrorKind::NotFound,
            format!("{host}: no resolver answered"),
        );
        for server in &self.servers {
            match ask(*server, host).await {
                Ok((addrs, ttl)) if !addrs.is_empty() => {
                    let keep = ttl.clamp(MIN_TTL, MAX_TTL);
                    self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
                        host.to_string(),
                        Entry {
                            addrs: addrs.clone(),
                            expires: Instant::now() + keep,
                        },
                    );
                    return Ok(addrs);
                }
                Ok(_) => {
                    last_err =
                        io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
                }
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }
}

/// One A query to one server: the addresses and the smallest TTL.
async fn ask(server: SocketAddr, host: &str) -> io::Result<(Vec<IpAddr>, Duration)> {
    let name =
        Name::from_ascii(format!("{}.", host.trim_end_matches('.'))).map_err(io::Error::other)?;
    let id: u16 = rand::random();
    let mut m = Message::new();
    m.set_id(id)
        .set_message_type(MessageType::Query)
        .set_recursion_desired(true);
    m.add_query(Query::query(name, RecordType::A));
    let bytes = m.to_vec().map_err(io::Error::other)?;
    let bind: SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let socket = UdpSocket::bind(bind).await?;
    socket.connect(server).await?;
    socket.send(&bytes).await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(QUERY_TIMEOUT, socket.recv(&mut buf))
        .await
        .map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, format!("{server} did not answer"))
        })??;
    let reply = Message::from_vec(&buf[..n]).map_err(io::Error::other)?;
    if reply.id() != id {
        return Err(io::Error::other("answer to another query"));
    }
    let mut ttl = MAX_TTL;
    let addrs = reply
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => {
                ttl = ttl.min(Duration::from_secs(u64::from(r.ttl())));
                Some(IpAddr::V4(a.0))
            }
            _ => None,
        })
        .collect();
    Ok((addrs, ttl))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// An empty answer where a good one had been is a failure, not an
    /// empty address list, so the caller falls back and says so.
    #[tokio::test]
    async fn a_lookup_that_finds_no_address_fails_even_with_an_expired_answer() {
        let server = stand_in_resolver();
        let resolver = DnsResolver::new(vec![server.local_addr().unwrap()]);
        // An answer whose TTL has just run out.
        resolver.cache.lock().unwrap().insert(
            "api.test".into(),
            Entry {
                addrs: vec![IpAddr::from([10, 0, 0, 1])],
                expires: Instant::now(),
            },
        );
        let answering = std::thread::spawn(move || answer_with_no_address(&server));
        assert!(
            resolver.lookup("api.test").await.is_err(),
            "a failed lookup must fail, so the caller says it uses the last good answer"
        );
        answering.join().unwrap();
    }

    /// A UDP socket on loopback for a test to answer queries on itself; a
    /// read gives up after 5 s, so a test whose query never comes fails
    /// instead of hanging (test helper, also used by the proxy server's
    /// resolver tests).
    pub(crate) fn stand_in_resolver() -> std::net::UdpSocket {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        server
    }

    /// Answers one query on `server` with no address (test helper, also used
    /// by the proxy server's resolver tests).
    pub(crate) fn answer_with_no_address(server: &std::net::UdpSocket) {
        let mut buf = [0u8; 512];
        let (n, from) = server.recv_from(&mut buf).unwrap();
        let query = Message::from_vec(&buf[..n]).unwrap();
        let mut reply = Message::new();
        reply
            .set_id(query.id())
            .set_message_type(MessageType::Response);
        reply.add_queries(query.queries().to_vec());
        server.send_to(&reply.to_vec().unwrap(), from).unwrap();
    }
}
