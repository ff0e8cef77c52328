//! One client connection: read the ClientHello where the listener routes
//! by name, connect upstream, relay until either side is done, and write
//! the access log line.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use causeway_config::ProxyConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::hello::{HelloReader, Peek, MAX_HELLO};
use crate::metrics::ProxyMetrics;
use crate::port::{Port, Routing};
use crate::relay::relay;
use crate::upstream::{connect, OpenGuard, Upstreams};

/// Holds a connection in a gauge until dropped.
pub(crate) struct Held<'a>(&'a prometheus::IntGauge);

impl<'a> Held<'a> {
    pub(crate) fn new(gauge: &'a prometheus::IntGauge) -> Self {
        gauge.inc();
        Held(gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How one connection went, for the access log.
struct Outcome {
    route: String,
    upstream: Option<SocketAddr>,
    up_bytes: u64,
    down_bytes: u64,
    reason: &'static str,
}

/// Serves one connection accepted on `state`'s port under `cfg`, the
/// config in force when it was accepted.
pub(crate) async fn handle(
    upstreams: &Upstreams,
    metrics: &ProxyMetrics,
    cfg: &ProxyConfig,
    state: &Port,
    mut client: TcpStream,
    from: SocketAddr,
) {
    let started = Instant::now();
    let outcome = serve(upstreams, metrics, cfg, state, &mut client, from).await;
    tracing::info!(
        target: "causeway::access",
        client = %from,
        listener = %state.listen,
        route = if outcome.route.is_empty() { "-" } else { outcome.route.as_str() },
        upstream = outcome.upstream.map(|a| a.to_string()).unwrap_or_else(|| "-".into()),
        bytes_up = outcome.up_bytes,
        bytes_down = outcome.down_bytes,
        duration_ms = started.elapsed().as_millis() as u64,
        reason = outcome.reason,
        "connection closed"
    );
}

async fn serve(
    upstreams: &Upstreams,
    metrics: &ProxyMetrics,
    cfg: &ProxyConfig,
    state: &Port,
    client: &mut TcpStream,
    from: SocketAddr,
) -> Outcome {
    let mut out = Outcome {
        route: String::new(),
        upstream: None,
        up_bytes: 0,
        down_bytes: 0,
        reason: "closed",
    };
    let label = state.label.as_str();
    let routing = state.routing();
    let mut peeked = Vec::new();
    let target = match routing.as_ref() {
        Routing::Plain(u) => u,
        Routing::Sni(routes) => {
            let found =
                tokio::time::timeout(cfg.hello_timeout, read_hello(client, &mut peeked)).await;
            let p = match found {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => {
                    out.reason = "client_closed_before_hello";
                    return out;
                }
                Err(_) => {
                    metrics
                        .sni_failures
                        .with_label_values(&[label, "hello_timeout"])
                        .inc();
                    out.reason = "hello_timeout";
                    return out;
                }
            };
            match &p {
                Peek::Sni(name) => out.route = name.clone(),
                Peek::NoSni => out.route = "(no sni)".into(),
                Peek::NotTls(why) => {
                    metrics
                        .sni_failures
                        .with_label_values(&[label, why.label()])
                        .inc();
                    out.route = "(not tls)".into();
                }
                Peek::NeedMore => {}
            }
            match routes.choose(&p, from.ip()) {
                Some(u) => u,
                None => {
                    metrics
                        .connect_errors
                        .with_label_values(&[label, "no_route"])
                        .inc();
                    out.reason = "no_route";
                    return out;
                }
            }
        }
    };
    target.accepted.inc();
    let _routed = Held::new(&target.active);
    let target = &target.upstream;
    // Only the access log reads it: no formatting when that is off.
    if out.route.is_empty() && tracing::enabled!(target: "causeway::access", tracing::Level::INFO) {
        out.route = target.to_string();
    }
    // Bytes to write as soon as the connect completes: the hello read to
    // route, a PROXY header, or what a client that speaks first sends.
    let first_bytes_ready = !peeked.is_empty() || state.proxy_protocol || state.client_speaks_first;
    let connected = connect(
        upstreams,
        metrics,
        cfg,
        label,
        &state.counters.connect_seconds,
        target,
        first_bytes_ready,
    )
    .await;
    let Some((mut upstream, addr)) = connected else {
        out.reason = "connect_failed";
        return out;
    };
    out.upstream = Some(addr);
    let _counted = OpenGuard::new(&upstreams.open, metrics, addr);
    if state.proxy_protocol {
        let local = client.local_addr().unwrap_or(state.listen);
        peeked.splice(0..0, crate::proxy_protocol::header_v2(from, local));
    }
    if !peeked.is_empty() {
        if upstream.write_all(&peeked).await.is_err() {
            // The client's hello never reached the upstream: a FIN would
            // look like a server that closed on it.
            crate::relay::reset_on_close(client);
            out.reason = "upstream_write_failed";
            return out;
        }
        out.up_bytes += peeked.len() as u64;
    }
    let relayed = relay(client, &upstream, cfg.idle_timeout).await;
    out.up_bytes += relayed.up;
    out.down_bytes = relayed.down;
    out.reason = relayed.ended.label();
    state.counters.bytes_up.inc_by(out.up_bytes);
    state.counters.bytes_down.inc_by(out.down_bytes);
    out
}

/// Reads the client's first bytes until the hello's name is known.
async fn read_hello(client: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<Peek> {
    let mut reader = HelloReader::default();
    loop {
        // The reader never answers NeedMore at MAX_HELLO bytes; the length
        // check makes sure no read goes past it whatever it answers.
        let p = reader.feed(buf);
        if p != Peek::NeedMore || buf.len() >= MAX_HELLO {
            return Ok(p);
        }
        client.readable().await?;
        let n = match read_into(client, buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            // The client sent what it will send: whatever it is goes to
            // the default route.
            return Ok(match reader.feed(buf) {
                Peek::NeedMore => Peek::NotTls(crate::hello::NotTls::Malformed),
                p => p,
            });
        }
    }
}

/// Appends what is ready, never past [`MAX_HELLO`]. The read goes through
/// the thread's scratch buffer, so a client that has sent nothing yet costs
/// no buffer in its task.
fn read_into(client: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let room = MAX_HELLO.saturating_sub(buf.len()).max(1);
    crate::relay::with_scratch(|scratch| {
        let take = room.min(scratch.len());
        let n = client.try_read(&mut scratch[..take])?;
        buf.extend_from_slice(&scratch[..n]);
        Ok(n)
    })
}
