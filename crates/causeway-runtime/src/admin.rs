//! The admin HTTP server: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz`, and JSON endpoints that services add (such as `/leases`).
//!
//! It binds only to the address it is given; the appliance defaults that to
//! loopback and never to the VLAN interface.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};

use crate::readiness::Readiness;
use crate::shutdown::Shutdown;

/// Produces the body of a JSON endpoint on each request.
pub type JsonSource = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
}

pub struct Admin {
    router: Router<()>,
}

impl Admin {
    pub fn new(registry: Registry, readiness: Readiness) -> Self {
        // Every process shows its descriptor budget. A registry that has
        // it already (a second admin on one registry) keeps the first.
        let _ = crate::fds::FdBudget::global().register(&registry);
        let state = AdminState {
            registry,
            readiness,
        };
        let router = Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(ready))
            .with_state(state);
        Admin { router }
    }

    /// Adds a JSON endpoint, such as `/leases`.
    pub fn json(mut self, path: &str, source: JsonSource) -> Self {
        self.router = self.router.route(
            path,
            get(move || {
                let source = source.clone();
                async move { axum::Json(source()) }
            }),
        );
        self
    }

    /// Binds now (so a bad address fails start-up) and serves until shutdown.
    pub async fn bind(
        self,
        addr: SocketAddr,
        interface: Option<&str>,
        shutdown: Shutdown,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        if let Some(name) = interface {
            socket.bind_device(Some(name.as_bytes()))?;
        }
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(128)?;
        let listener = tokio::net::TcpListener::from_std(socket.into())?;
        let local = listener.local_addr()?;
        let router = self.router;
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
}

async fn metrics(State(s): State<AdminState>) -> Response {
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
