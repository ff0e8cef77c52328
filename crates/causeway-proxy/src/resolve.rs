//! Upstream names resolved by configured DNS servers, cached for their TTL
//! and re-resolved when it runs out; the last good answer is kept for when
//! every server fails.

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
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(host) {
            Some(e) => Ok(e.addrs.clone()),
            None => Err(last_err),
        }
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
