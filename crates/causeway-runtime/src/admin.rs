//! The admin HTTP server: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`, and JSON endpoints that services add (such as `/leases`).
//!
//! It binds only to the address it is given; the appliance defaults that to
//! loopback and never to the VLAN interface. It serves plain HTTP, or HTTPS
//! with a certificate the caller resolves ([`Admin::bind_tls`]); `/metrics`
//! may be guarded by a check of the scraper's bearer token
//! ([`Admin::guard_metrics`]), while the probes stay open to the kubelet,
//! which sends none.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::readiness::Readiness;
use crate::shutdown::Shutdown;

/// Produces the body of a JSON endpoint on each request.
pub type JsonSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// What a guard decides of a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Allowed,
    /// No token, or one that does not authenticate: 401.
    Unauthenticated,
    /// A token whose user may not read the metrics: 403.
    Forbidden,
}

/// Decides a scrape of `/metrics` from its bearer token, if any.
pub type MetricsGuard =
    Arc<dyn Fn(Option<String>) -> Pin<Box<dyn Future<Output = Access> + Send>> + Send + Sync>;

/// How long a TLS handshake on the admin port may take: a client that
/// opens a connection and sends nothing must not hold a task for ever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once over TLS; more wait to be accepted.
const MAX_TLS_CONNECTIONS: usize = 64;

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
    guard: Option<MetricsGuard>,
}

pub struct Admin {
    state: AdminState,
    json: Vec<(String, JsonSource)>,
}

impl Admin {
    pub fn new(registry: Registry, readiness: Readiness) -> Self {
        // Every process shows its descriptor budget. A registry that has
        // it already (a second admin on one registry) keeps the first.
        let _ = crate::fds::FdBudget::global().register(&registry);
        Admin {
            state: AdminState {
                registry,
                readiness,
                guard: None,
            },
            json: Vec::new(),
        }
    }

    /// Adds a JSON endpoint, such as `/leases`.
    pub fn json(mut self, path: &str, source: JsonSource) -> Self {
        self.json.push((path.to_string(), source));
        self
    }

    /// Answers `/metrics` only as `guard` decides.
    pub fn guard_metrics(mut self, guard: MetricsGuard) -> Self {
        self.state.guard = Some(guard);
        self
    }

    fn router(self) -> Router<()> {
        let mut router = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(ready));
        for (path, source) in self.json {
            router = router.route(
                &path,
                get(move || {
                    let source = source.clone();
                    async move { axum::Json(source()) }
                }),
            );
        }
        router.with_state(self.state)
    }

    fn listen(
        addr: SocketAddr,
        interface: Option<&str>,
    ) -> std::io::Result<tokio::net::TcpListener> {
        let listener = crate::listen::tcp(addr, interface, 128)?;
        listener.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// Binds now (so a bad address fails start-up) and serves until shutdown.
    pub async fn bind(
        self,
        addr: SocketAddr,
        interface: Option<&str>,
        shutdown: Shutdown,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = Self::listen(addr, interface)?;
        let local = listener.local_addr()?;
        let router = self.router();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "admin server stopped");
            }
        });
        Ok((local, task))
    }

    /// [`Admin::bind`], over TLS with `tls` (whose certificate resolver
    /// may follow a rotated certificate). HTTP/1.1 only.
    pub async fn bind_tls(
        self,
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        shutdown: Shutdown,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = Self::listen(addr, None)?;
        let local = listener.local_addr()?;
        let service = hyper_util::service::TowerToHyperService::new(self.router());
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_TLS_CONNECTIONS));
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let accepted = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    a = listener.accept() => a,
                };
                let (tcp, _) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors or similar: wait rather than spin.
                        tracing::warn!(error = %e, "admin accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, service, stop) =
                    (acceptor.clone(), service.clone(), shutdown.clone());
                connections.spawn(async move {
                    let _slot = slot;
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                    else {
                        return;
                    };
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = stop.cancelled() => {}
                    }
                });
                // Reap the finished, so the set holds only live ones.
                while connections.try_join_next().is_some() {}
            }
            connections.shutdown().await;
        });
        Ok((local, task))
    }
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
        .then(|| token.trim().to_string())
}

async fn metrics(State(s): State<AdminState>, headers: HeaderMap) -> Response {
    if let Some(guard) = &s.guard {
        match guard(bearer(&headers)).await {
            Access::Allowed => {}
            Access::Unauthenticated => {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "a bearer token is needed\n",
                )
                    .into_response()
            }
            Access::Forbidden => {
                return (
                    StatusCode::FORBIDDEN,
                    "this token may not read the metrics\n",
                )
                    .into_response()
            }
        }
    }
    let mut body = Vec::new();
    match TextEncoder::new().encode(&s.registry.gather(), &mut body) {
        Ok(()) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn ready(State(s): State<AdminState>) -> Response {
    let status = if s.readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(s.readiness.report())).into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer(&headers("Bearer abc")).as_deref(), Some("abc"));
        assert_eq!(bearer(&headers("bearer  abc ")).as_deref(), Some("abc"));
        assert_eq!(bearer(&headers("Basic YWI6Yw==")), None);
        assert_eq!(bearer(&headers("Bearer ")), None);
        assert_eq!(bearer(&headers("Bearer")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
