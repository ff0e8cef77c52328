//! A listening port: its address and label, its routing (swapped whole by
//! a reload), whether upstreams get a PROXY protocol header, its
//! `maxConnections` limit and its metric series. The server builds one per
//! listener; the accept loops and the connections read it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use causeway_config::{Listener, ListenerKind, Upstream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ProxyError;
use crate::hello::NotTls;
use crate::metrics::ProxyMetrics;
use crate::route::SniRoutes;
use crate::upstream::ConnectFailure;

/// Where a listener sends a connection.
pub(crate) enum Routing {
    Plain(Target),
    Sni(SniRoutes<Target>),
}

impl Routing {
    /// The route labels its series carry.
    pub(crate) fn labels(&self) -> Vec<&str> {
        match self {
            Routing::Plain(t) => vec![t.route.as_str()],
            Routing::Sni(routes) => routes.targets().map(|t| t.route.as_str()).collect(),
        }
    }
}

/// A route's upstream, with the route's metric series, looked up when the
/// routes are built rather than per connection. The route label comes from
/// the config (an SNI pattern, `default`, or a plain listener's upstream),
/// never from what a client sent, so the series stay as few as the routes.
pub(crate) struct Target {
    pub(crate) upstream: Upstream,
    /// The route label of its series.
    pub(crate) route: String,
    pub(crate) accepted: prometheus::IntCounter,
    pub(crate) active: prometheus::IntGauge,
}

impl Target {
    pub(crate) fn new(
        metrics: &ProxyMetrics,
        listener: &str,
        route: &str,
        upstream: &Upstream,
    ) -> Self {
        Target {
            upstream: upstream.clone(),
            route: route.to_string(),
            accepted: metrics.route_accepted.with_label_values(&[listener, route]),
            active: metrics.route_active.with_label_values(&[listener, route]),
        }
    }
}

/// A listening port as its connections see it.
pub(crate) struct Port {
    pub(crate) listen: SocketAddr,
    pub(crate) label: String,
    /// Swapped whole by a reload; a connection keeps the routing it began with.
    pub(crate) routing: RwLock<Arc<Routing>>,
    pub(crate) proxy_protocol: bool,
    /// The listener's clients speak first (see
    /// [`causeway_config::Listener::client_speaks_first`]).
    pub(crate) client_speaks_first: bool,
    pub(crate) limit: Arc<ConnectionLimit>,
    pub(crate) counters: ListenerCounters,
}

/// This listener's metric series, looked up once rather than per
/// connection.
pub(crate) struct ListenerCounters {
    pub(crate) accepted: prometheus::IntCounter,
    pub(crate) active: prometheus::IntGauge,
    pub(crate) bytes_up: prometheus::IntCounter,
    pub(crate) bytes_down: prometheus::IntCounter,
    pub(crate) connect_seconds: prometheus::Histogram,
}

impl ListenerCounters {
    /// `sni`: the listener routes by TLS server name. (Its refusal series
    /// are made where admission is known: `server`.)
    pub(crate) fn new(m: &ProxyMetrics, label: &str, sni: bool) -> Self {
        // The failure series exist at zero from the start: the first
        // failure then shows as an increase, which alerts and dashboards
        // read, and an absent series is not mistaken for health.
        m.ejections.with_label_values(&[label]);
        let failures = [
            ConnectFailure::LocalResources,
            ConnectFailure::Refused,
            ConnectFailure::AddressUnavailable,
            ConnectFailure::Other,
        ];
        for reason in ["accept", "resolve", "timeout"]
            .into_iter()
            .chain(failures.map(ConnectFailure::label))
        {
            m.connect_errors.with_label_values(&[label, reason]);
        }
        if sni {
            let not_tls = [
                NotTls::NotHandshake,
                NotTls::NotClientHello,
                NotTls::Malformed,
                NotTls::TooLarge,
                NotTls::BadName,
            ];
            for reason in ["hello_timeout"]
                .into_iter()
                .chain(not_tls.map(NotTls::label))
            {
                m.sni_failures.with_label_values(&[label, reason]);
            }
        }
        ListenerCounters {
            accepted: m.accepted.with_label_values(&[label]),
            active: m.active.with_label_values(&[label]),
            bytes_up: m.bytes.with_label_values(&[label, "up"]),
            bytes_down: m.bytes.with_label_values(&[label, "down"]),
            connect_seconds: m.connect_seconds.with_label_values(&[label]),
        }
    }
}

impl Port {
    pub(crate) fn routing(&self) -> Arc<Routing> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

pub(crate) fn routing_of(l: &Listener, metrics: &ProxyMetrics) -> Result<Routing, ProxyError> {
    let listener = l.listen.port().to_string();
    let target = |route: &str, u: &Upstream| Target::new(metrics, &listener, route, u);
    Ok(match &l.kind {
        ListenerKind::Plain(u) => Routing::Plain(target(&u.to_string(), u)),
        ListenerKind::Sni { routes, default } => Routing::Sni(
            SniRoutes::new(
                routes.iter().map(|r| {
                    (
                        r.sni.clone(),
                        r.sources.clone(),
                        target(&r.label, &r.upstream),
                    )
                }),
                default.as_ref().map(|u| target("default", u)),
            )
            .map_err(|source| ProxyError::Routes {
                addr: l.listen,
                source,
            })?,
        ),
    })
}

/// A listener's `maxConnections`: a semaphore whose size a reload can
/// change while connections hold its permits. Growing adds permits;
/// shrinking forgets those free now and owes the rest, and each permit
/// given back while anything is owed is forgotten instead of returned. So
/// the connections already open stay, and new ones are refused until fewer
/// than the new size are open.
pub(crate) struct ConnectionLimit {
    permits: Arc<Semaphore>,
    /// The size last set; under the lock so two resizes cannot interleave.
    size: Mutex<usize>,
    /// Permits still to be taken out of circulation as connections end.
    owed: AtomicUsize,
}

/// One connection's place under a [`ConnectionLimit`].
pub(crate) struct LimitPermit {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<ConnectionLimit>,
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        let paid = self
            .limit
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                owed.checked_sub(1)
            })
            .is_ok();
        if let (true, Some(permit)) = (paid, self.permit.take()) {
            permit.forget();
        }
    }
}

impl ConnectionLimit {
    pub(crate) fn new(size: usize) -> Arc<Self> {
        let size = size.min(Semaphore::MAX_PERMITS);
        Arc::new(ConnectionLimit {
            permits: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
            owed: AtomicUsize::new(0),
        })
    }

    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<LimitPermit> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(LimitPermit {
            permit: Some(permit),
            limit: self.clone(),
        })
    }

    pub(crate) fn resize(&self, size: usize) {
        let size = size.min(Semaphore::MAX_PERMITS);
        let mut current = self.size.lock().unwrap_or_else(|p| p.into_inner());
        if size > *current {
            // What is still owed is cancelled first; only the rest is new.
            let grow = size - *current;
            let owed_before = self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                    Some(owed - owed.min(grow))
                })
                .unwrap_or(0);
            self.permits.add_permits(grow - owed_before.min(grow));
        } else {
            let shrink = *current - size;
            let forgotten = self.permits.forget_permits(shrink);
            self.owed.fetch_add(shrink - forgotten, Ordering::AcqRel);
        }
        *current = size;
    }

    /// Connections that may open now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_resized_limit_keeps_open_connections_and_admits_to_the_new_size() {
        let limit = ConnectionLimit::new(4);
        let mut open: Vec<LimitPermit> = (0..3).map(|_| limit.try_acquire().unwrap()).collect();
        // Down to 1 with 3 open: the free one goes now, two are owed.
        limit.resize(1);
        assert_eq!(limit.available(), 0);
        assert!(limit.try_acquire().is_none());
        open.pop();
        open.pop();
        assert!(
            limit.try_acquire().is_none(),
            "still one open, the new size"
        );
        open.pop();
        let only = limit.try_acquire().expect("below the new size");
        assert!(limit.try_acquire().is_none());
        drop(only);
        // Up to 3, then down to 2 and up to 5 while 2 are open and 1 is owed
        // (the owed one is cancelled rather than added on top).
        limit.resize(3);
        assert_eq!(limit.available(), 3);
        let held: Vec<LimitPermit> = (0..3).map(|_| limit.try_acquire().unwrap()).collect();
        limit.resize(2);
        limit.resize(5);
        assert_eq!(limit.available(), 2);
        drop(held);
        assert_eq!(limit.available(), 5, "every permit back, none twice");
    }
}
