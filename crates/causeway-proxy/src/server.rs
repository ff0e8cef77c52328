//! The proxy as a service: its threads, start, reload and drain. What the
//! threads share is in [`crate::state`], each listening port in
//! [`crate::port`], admission in [`crate::admission`], accepting in
//! [`crate::listener`], a connection's life in [`crate::connection`],
//! upstream choice and connects in [`crate::upstream`], and active checks
//! in [`crate::health`].

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use causeway_config::ProxyConfig;
use causeway_runtime::Shutdown;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, Refusal};
use crate::balance::{Health, OpenCounts};
use crate::error::ProxyError;
use crate::health::{availability_loop, health_loop};
use crate::listener::accept_loop;
use crate::metrics::ProxyMetrics;
use crate::port::{routing_of, ConnectionLimit, ListenerCounters, Port};
use crate::state::ProxyState;
use crate::upstream::{Outliers, Resolver, Upstreams};
use causeway_runtime::fds::FdBudget;

/// The proxy runs on threads of its own, one per core, each with a
/// single-threaded runtime, its own SO_REUSEPORT listener per port, and
/// every connection it accepted: a connection's wake-ups never cross
/// threads.
pub struct ProxyServer {
    shared: Arc<ProxyState>,
    listeners: Vec<Arc<Port>>,
    health: JoinHandle<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Set when draining is over: the workers drop what is left.
    release_workers: watch::Sender<bool>,
}

pub(crate) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ProxyError> {
    let fail = |e: io::Error| ProxyError::Bind {
        addr,
        reason: match e.kind() {
            io::ErrorKind::PermissionDenied => {
                format!("port {} needs CAP_NET_BIND_SERVICE", addr.port())
            }
            io::ErrorKind::AddrInUse => format!("{addr} is already in use by another process"),
            io::ErrorKind::AddrNotAvailable => {
                format!("{} is not an address of this host", addr.ip())
            }
            _ => e.to_string(),
        },
    };
    let s =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(fail)?;
    s.set_reuse_address(true).map_err(fail)?;
    // One listener per core on the same port; the kernel spreads accepts.
    s.set_reuse_port(true).map_err(fail)?;
    s.set_nonblocking(true).map_err(fail)?;
    crate::relay::keepalive(socket2::SockRef::from(&s)).map_err(fail)?;
    s.set_nodelay(true).map_err(fail)?;
    // A service address that moves between HA replicas is bound before this
    // replica holds it; connections arrive once it does.
    if causeway_runtime::ha::is_floating(addr.ip()) {
        if addr.is_ipv6() {
            s.set_freebind_ipv6(true).map_err(fail)?;
        } else {
            s.set_freebind(true).map_err(fail)?;
        }
    }
    if addr.is_ipv6() {
        // `[::]:port` beside `0.0.0.0:port` (the external port) binds v6
        // alone instead of failing on the v4 one.
        s.set_only_v6(true).map_err(fail)?;
    }
    s.bind(&addr.into()).map_err(fail)?;
    s.listen(1024).map_err(fail)?;
    Ok(s.into())
}

/// Logs the proxy's share of the process's descriptor budget (sized from
/// the open-files limit in force when the first service starts; the
/// appliance raises the limit before that) and what it means in
/// connections.
fn log_descriptor_share(cfg: &ProxyConfig, budget: &FdBudget) {
    let cap = usize::try_from(budget.proxy_share() / 2).unwrap_or(usize::MAX);
    let listeners_allow = cfg.max_connections.saturating_mul(cfg.listeners.len());
    tracing::info!(
        cap,
        open_files_limit = causeway_runtime::fds::open_files_limit(),
        descriptor_budget = budget.lendable(),
        proxy_share = budget.proxy_share(),
        per_listener = cfg.max_connections,
        per_source = cfg.max_connections_per_source,
        "proxy connection cap across all listeners: its share of the process's descriptor budget, two descriptors a connection and two more per direction that moves bulk data (a splice pipe, taken only while the share allows; else bytes are copied)"
    );
    if listeners_allow > cap {
        tracing::info!(
            listeners_allow,
            cap,
            "the listeners' maxConnections add up to more than the cap; past it connections are refused (causeway_proxy_refused_total{{limit=\"total\"}})"
        );
    }
}

impl ProxyServer {
    pub async fn start(
        cfg: &ProxyConfig,
        metrics: ProxyMetrics,
        shutdown: Shutdown,
    ) -> Result<Self, ProxyError> {
        log_descriptor_share(cfg, FdBudget::global());
        let shared = Arc::new(ProxyState {
            cfg: RwLock::new(Arc::new(cfg.clone())),
            metrics,
            upstreams: Upstreams {
                resolver: Resolver::new(&cfg.resolvers),
                outliers: Outliers::default(),
                open: OpenCounts::default(),
                health: Health::default(),
            },
            admission: Admission::new(FdBudget::global(), cfg.max_connections_per_source),
            connections: TaskTracker::new(),
        });
        let mut listeners = Vec::new();
        let workers_n = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Bound here, so a port in use fails the start with its reason.
        let mut bound: Vec<Vec<(Arc<Port>, std::net::TcpListener)>> =
            (0..workers_n).map(|_| Vec::new()).collect();
        for l in &cfg.listeners {
            let routing = routing_of(l, &shared.metrics)?;
            let label = l.listen.port().to_string();
            // At zero from the start, so the first refusal shows as an
            // increase (alerts read it).
            for refusal in Refusal::ALL {
                shared
                    .metrics
                    .refused
                    .with_label_values(&[label.as_str(), refusal.label()]);
            }
            let state = Arc::new(Port {
                listen: l.listen,
                counters: ListenerCounters::new(
                    &shared.metrics,
                    &label,
                    matches!(l.kind, causeway_config::ListenerKind::Sni { .. }),
                ),
                label,
                routing: RwLock::new(Arc::new(routing)),
                proxy_protocol: l.proxy_protocol,
                client_speaks_first: l.client_speaks_first,
                limit: ConnectionLimit::new(cfg.max_connections),
            });
            listeners.push(state.clone());
            for per_worker in &mut bound {
                per_worker.push((state.clone(), bind(l.listen)?));
            }
            tracing::info!(listen = %l.listen, "proxy listening");
        }
        let (release_workers, released) = watch::channel(false);
        let mut workers = Vec::new();
        for (i, sockets) in bound.into_iter().enumerate() {
            let (shared, shutdown, released) = (shared.clone(), shutdown.clone(), released.clone());
            let worker = std::thread::Builder::new()
                .name(format!("causeway-proxy-{i}"))
                .spawn(move || worker(shared, sockets, shutdown, released))
                .map_err(|e| ProxyError::Bind {
                    addr: cfg
                        .listeners
                        .first()
                        .map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |l| l.listen),
                    reason: format!("cannot start a proxy thread: {e}"),
                })?;
            workers.push(worker);
        }
        let (checked, counted) = (shared.clone(), shared.clone());
        let health = tokio::spawn(async move {
            tokio::join!(
                health_loop(checked, shutdown.clone()),
                availability_loop(counted, shutdown)
            );
        });
        Ok(ProxyServer {
            shared,
            listeners,
            health,
            workers,
            release_workers,
        })
    }

    /// Applies new routes, timeouts and connection limits to the running
    /// listeners. Established connections keep their upstream (and stay
    /// open under a lowered limit); a change of listen addresses needs
    /// a restart and is reported.
    pub fn reload(&self, cfg: &ProxyConfig) -> Result<(), ProxyError> {
        let mut next = Vec::new();
        for l in &cfg.listeners {
            if let Some(state) = self.listeners.iter().find(|s| s.listen == l.listen) {
                next.push((state.clone(), routing_of(l, &self.shared.metrics)?));
            }
        }
        let same =
            cfg.listeners.len() == self.listeners.len() && next.len() == self.listeners.len();
        if !same {
            tracing::warn!(
                "proxy listeners changed; restart to open or close ports (routes are applied)"
            );
        }
        for (state, routing) in next {
            let routing = Arc::new(routing);
            let old = std::mem::replace(
                &mut *state.routing.write().unwrap_or_else(|p| p.into_inner()),
                routing.clone(),
            );
            // A removed route's series would otherwise be exported for ever
            // at their last values. Connections still on it keep counting
            // into the unexported series; the listener's gauge still has them.
            let kept = routing.labels();
            for route in old.labels().into_iter().filter(|r| !kept.contains(r)) {
                let series = [state.label.as_str(), route];
                let m = &self.shared.metrics;
                let _ = m.route_accepted.remove_label_values(&series);
                let _ = m.route_active.remove_label_values(&series);
            }
        }
        for state in &self.listeners {
            state.limit.resize(cfg.max_connections);
        }
        self.shared
            .admission
            .set_per_source(cfg.max_connections_per_source);
        *self.shared.cfg.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(cfg.clone());
        Ok(())
    }

    /// After shutdown: the accept loops have stopped; established
    /// connections get until `deadline` to finish on their own.
    pub async fn drain(self, deadline: Duration) {
        let _ = self.health.await;
        let connections = &self.shared.connections;
        connections.close();
        if !connections.is_empty() {
            tracing::info!(
                connections = connections.len(),
                "draining proxied connections"
            );
        }
        let _ = tokio::time::timeout(deadline, connections.wait()).await;
        let _ = self.release_workers.send(true);
        let workers = self.workers;
        let _ = tokio::task::spawn_blocking(move || {
            for w in workers {
                let _ = w.join();
            }
        })
        .await;
    }
}

impl causeway_runtime::Service for ProxyServer {
    type Config = ProxyConfig;
    type Error = ProxyError;
    const NAME: &'static str = "proxy";

    async fn reload(&self, cfg: &ProxyConfig) -> Result<(), ProxyError> {
        ProxyServer::reload(self, cfg)
    }

    async fn stop(self, deadline: Duration) {
        self.drain(deadline).await
    }
}

/// One proxy thread: accepts on its own listeners until shutdown, and runs
/// its connections until they end or the drain releases it.
fn worker(
    shared: Arc<ProxyState>,
    sockets: Vec<(Arc<Port>, std::net::TcpListener)>,
    shutdown: Shutdown,
    mut released: watch::Receiver<bool>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start a proxy thread's runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let mut loops = Vec::new();
        for (state, socket) in sockets {
            match TcpListener::from_std(socket) {
                Ok(listener) => loops.push(tokio::spawn(accept_loop(
                    shared.clone(),
                    state,
                    listener,
                    shutdown.clone(),
                ))),
                Err(e) => tracing::error!(listen = %state.listen, error = %e, "cannot register a proxy listener"),
            }
        }
        for l in loops {
            let _ = l.await;
        }
        // Accepting is over; the connections on this thread go on until
        // the drain is done with them (or the server is dropped).
        let _ = released.wait_for(|r| *r).await;
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::upstream::connect_one;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Set in the environment of this test binary when it runs again
    /// inside a network namespace of its own.
    const IN_NAMESPACE: &str = "CAUSEWAY_PROXY_TEST_IN_NAMESPACE";

    /// Loopback up, and one ephemeral port for the whole namespace.
    const ONE_PORT: &str = "ip link set lo up && echo '40000 40000' > /proc/sys/net/ipv4/ip_local_port_range && exec \"$@\"";

    /// Runs `args` in a new user and network namespace set up by
    /// [`ONE_PORT`]; None when this host allows no such namespace.
    fn in_one_port_namespace(args: &[&std::ffi::OsStr]) -> Option<std::process::Output> {
        let run = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("unshare")
                .args([
                    "--user",
                    "--map-root-user",
                    "--net",
                    "sh",
                    "-c",
                    ONE_PORT,
                    "sh",
                ])
                .args(args)
                .env(IN_NAMESPACE, "1")
                .output()
        };
        match run(&["true".as_ref()]) {
            Ok(out) if out.status.success() => run(args).ok(),
            Ok(out) => {
                eprintln!(
                    "SKIP: no user and network namespace: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIP: cannot run unshare: {e}");
                None
            }
        }
    }

    /// EADDRNOTAVAIL for real, from the kernel: in a namespace with one
    /// ephemeral port, the test holds a connection to the first address,
    /// so the proxy's connect to it finds no free port, while a connect to
    /// the second can still use that port. The client must reach the
    /// second address, not be closed as if the proxy were out of ports.
    #[test]
    fn an_address_with_no_free_local_port_is_passed_over_for_the_next() {
        let name = "server::tests::an_address_with_no_free_local_port_is_passed_over_for_the_next";
        if std::env::var_os(IN_NAMESPACE).is_none() {
            let exe = std::env::current_exe().unwrap();
            let args = [
                exe.as_os_str(),
                "--exact".as_ref(),
                name.as_ref(),
                "--nocapture".as_ref(),
            ];
            let Some(out) = in_one_port_namespace(&args) else {
                return;
            };
            assert!(
                out.status.success(),
                "in the namespace: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
            return;
        }
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(passed_over_in_the_namespace());
    }

    async fn passed_over_in_the_namespace() {
        use std::time::Duration;
        // Fixed ports: the namespace is new, and binding port 0 would
        // take its only ephemeral port.
        let first = std::net::TcpListener::bind("127.0.0.1:7001").unwrap();
        let second = tokio::net::TcpListener::bind("127.0.0.1:7002")
            .await
            .unwrap();
        let _holds_the_only_port = std::net::TcpStream::connect("127.0.0.1:7001").unwrap();
        let cfg = causeway_config::Config::from_yaml(
            "proxy:\n  listenAddress: 127.0.0.1\n  listeners:\n    - port: 7000\n      upstream: \"127.0.0.1:7001,127.0.0.1:7002\"\n",
        )
        .unwrap()
        .proxy
        .unwrap();
        let metrics = ProxyMetrics::new(&prometheus::Registry::new()).unwrap();
        let shutdown = causeway_runtime::Shutdown::new();
        let server = ProxyServer::start(&cfg, metrics.clone(), shutdown.clone())
            .await
            .unwrap();
        let mut client = TcpStream::connect("127.0.0.1:7000").await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let (mut upstream, _) = tokio::time::timeout(Duration::from_secs(5), second.accept())
            .await
            .expect("the client never reached the second address")
            .unwrap();
        let mut got = [0u8; 5];
        upstream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        let errors = |reason| {
            metrics
                .connect_errors
                .with_label_values(&["7000", reason])
                .get()
        };
        assert_eq!(
            errors("address_unavailable"),
            1,
            "the first address was not tried first"
        );
        assert_eq!(errors("local_resources"), 0);
        drop((client, upstream, first));
        shutdown.cancel();
        server.drain(Duration::from_secs(1)).await;
    }

    /// The route labels the registry exports, as Prometheus text.
    fn exported_routes(registry: &prometheus::Registry) -> String {
        let mut text = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&registry.gather(), &mut text)
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with("causeway_proxy_route_"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[tokio::test]
    async fn a_reload_stops_exporting_the_series_of_removed_routes() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = |pattern: &str| {
            causeway_config::Config::from_yaml(&format!(
                "proxy:\n  listenAddress: 127.0.0.1\n  listeners:\n    - port: {port}\n      routes: [{{sni: {pattern}, upstream: \"127.0.0.1:9\"}}]\n      default: \"127.0.0.1:9\"\n"
            ))
            .unwrap()
            .proxy
            .unwrap()
        };
        let registry = prometheus::Registry::new();
        let shutdown = causeway_runtime::Shutdown::new();
        let trigger = shutdown.clone();
        let server = ProxyServer::start(
            &cfg("old.test"),
            ProxyMetrics::new(&registry).unwrap(),
            shutdown,
        )
        .await
        .unwrap();
        let before = exported_routes(&registry);
        assert!(before.contains("route=\"old.test\""), "{before}");
        assert!(before.contains("route=\"default\""), "{before}");
        server.reload(&cfg("new.test")).unwrap();
        let after = exported_routes(&registry);
        assert!(after.contains("route=\"new.test\""), "{after}");
        assert!(!after.contains("route=\"old.test\""), "{after}");
        assert!(
            after.contains("route=\"default\""),
            "a route the reload kept lost its series: {after}"
        );
        trigger.cancel();
        server.drain(Duration::from_secs(1)).await;
    }

    /// A proxy with one plain listener in front of `upstream`, under an
    /// idle timeout of an hour: any connection gone within a test's
    /// seconds was ended by the proxy for a reason of its own.
    async fn proxy_in_front_of(
        upstream: SocketAddr,
    ) -> (ProxyServer, causeway_runtime::Shutdown, SocketAddr) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = causeway_config::Config::from_yaml(&format!(
            "proxy:\n  listenAddress: 127.0.0.1\n  idleTimeout: 1h\n  listeners:\n    - port: {port}\n      upstream: \"{upstream}\"\n"
        ))
        .unwrap()
        .proxy
        .unwrap();
        let shutdown = causeway_runtime::Shutdown::new();
        let registry = prometheus::Registry::new();
        let server = ProxyServer::start(
            &cfg,
            ProxyMetrics::new(&registry).unwrap(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        (server, shutdown, SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Closes `s` with a reset rather than a FIN, as a crashed peer or a
    /// firewall would.
    fn reset(s: TcpStream) {
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    }

    /// One side of a proxied connection sends `warmup` bytes to the other
    /// (past 64 KiB the direction reading it has moved to splice), then
    /// resets. The bytes arriving also show the relay has begun: a reset
    /// before the proxy's connect completed would fail the connect
    /// instead. The other side must read a reset, not an EOF, and the proxy
    /// must give back everything the connection held at once, not after
    /// its idle timeout.
    async fn a_reset_is_passed_on(upstream_resets: bool, warmup: usize) {
        let back = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (server, shutdown, front) = proxy_in_front_of(back.local_addr().unwrap()).await;
        let client = TcpStream::connect(front).await.unwrap();
        let (upstream, _) = tokio::time::timeout(Duration::from_secs(5), back.accept())
            .await
            .expect("the proxy never connected upstream")
            .unwrap();
        let (mut resetting, mut other, who, peer) = if upstream_resets {
            (upstream, client, "upstream", "client")
        } else {
            (client, upstream, "client", "upstream")
        };
        let sent = vec![7u8; warmup];
        resetting.write_all(&sent).await.unwrap();
        let mut got = vec![0u8; warmup];
        other.read_exact(&mut got).await.unwrap();
        reset(resetting);
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(2), other.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the {peer} heard nothing for 2 s after the {who} reset (after {warmup} bytes)"
                )
            });
        match read {
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!(
                "after {warmup} bytes the {who} reset, and the {peer} read {other:?}, not a reset"
            ),
        }
        let port = &server.listeners[0];
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while port.counters.active.get() != 0 || port.limit.available() != port_limit(&server) {
            assert!(
                std::time::Instant::now() < deadline,
                "2 s after the {who} reset the proxy still holds the connection: {} active, {} of {} permits free",
                port.counters.active.get(),
                port.limit.available(),
                port_limit(&server)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        server.drain(Duration::from_secs(1)).await;
    }

    fn port_limit(server: &ProxyServer) -> usize {
        server.shared.cfg().max_connections
    }

    #[tokio::test]
    async fn an_upstream_reset_reaches_the_client_as_a_reset_and_frees_the_connection() {
        // Through the buffered copy, then through splice.
        a_reset_is_passed_on(true, 1_000).await;
        a_reset_is_passed_on(true, 300_000).await;
    }

    #[tokio::test]
    async fn a_client_reset_reaches_the_upstream_as_a_reset_and_frees_the_connection() {
        a_reset_is_passed_on(false, 1_000).await;
        a_reset_is_passed_on(false, 300_000).await;
    }

    /// Keepalive and no-delay are set once on the listener: the accepted
    /// socket must have inherited them, or clients would go without.
    #[tokio::test]
    async fn accepted_sockets_inherit_keepalive_and_nodelay() {
        let listener =
            TcpListener::from_std(bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let sock = socket2::SockRef::from(&accepted);
        assert!(sock.keepalive().unwrap());
        assert!(sock.nodelay().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), Duration::from_secs(60));

        let upstream = connect_one(addr, false).await.unwrap();
        let sock = socket2::SockRef::from(&upstream);
        assert!(sock.nodelay().unwrap());
        assert!(!sock.keepalive().unwrap(), "set later, by the relay");
    }
}
