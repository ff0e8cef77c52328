//! Upstream names resolved by configured DNS servers, cached for their TTL
//! and re-resolved when it runs out. When every server fails the lookup
//! fails, so the caller falls back to the last good answer and says so;
//! the expired answer is then held for [`RETRY_AFTER`] before the servers
//! are asked again.

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
/// After a failed lookup, how long the last good answer stands before the
/// servers are asked again: with a resolver that black-holes queries, one
/// new connection in this long waits out the query timeout, not every one.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

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

    /// The addresses of `host`: cached while fresh, else asked anew; when
    /// every server fails, the last answer however old.
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
        if let Some(e) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(host)
        {
            e.expires = Instant::now() + RETRY_AFTER;
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
mod tests {
    use super::*;

    #[tokio::test]
    async fn after_a_failed_lookup_the_last_answer_stands_before_asking_again() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let resolver = DnsResolver::new(vec![server.local_addr().unwrap()]);
        let kept = vec![IpAddr::from([10, 0, 0, 1])];
        // An answer whose TTL has just run out.
        resolver.cache.lock().unwrap().insert(
            "api.test".into(),
            Entry {
                addrs: kept.clone(),
                expires: Instant::now(),
            },
        );
        // The server answers, with no address.
        let answering = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            let query = Message::from_vec(&buf[..n]).unwrap();
            let mut reply = Message::new();
            reply
                .set_id(query.id())
                .set_message_type(MessageType::Response);
            reply.add_queries(query.queries().to_vec());
            server.send_to(&reply.to_vec().unwrap(), from).unwrap();
            server
        });
        assert!(
            resolver.lookup("api.test").await.is_err(),
            "a failed lookup must fail, so the caller says it uses the last good answer"
        );
        let server = answering.join().unwrap();
        assert_eq!(resolver.lookup("api.test").await.unwrap(), kept);
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        assert!(
            server.recv_from(&mut buf).is_err(),
            "the servers were asked again within RETRY_AFTER"
        );
    }
}
