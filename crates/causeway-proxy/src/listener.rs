//! Accepting connections: one loop per listening socket on each proxy
//! thread. A connection is admitted (see [`crate::admission`]) and handed
//! to a task of its own with the parts of the proxy's state it uses.

use std::sync::Arc;
use std::time::Duration;

use causeway_runtime::Shutdown;
use tokio::net::TcpListener;

use crate::connection::{handle, Held};
use crate::port::Port;
use crate::state::ProxyState;

pub(crate) async fn accept_loop(
    shared: Arc<ProxyState>,
    state: Arc<Port>,
    listener: TcpListener,
    shutdown: Shutdown,
) {
    loop {
        let (client, from) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors or memory: retrying at once would
                    // spin; give connections a moment to close.
                    shared.metrics.connect_errors.with_label_values(&[state.label.as_str(), "accept"]).inc();
                    tracing::warn!(listen = %state.listen, error = %e, "accept failed; pausing");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let permit = match shared.admission.admit(&state.limit, from.ip()) {
            Ok(p) => p,
            Err(refusal) => {
                shared
                    .metrics
                    .refused
                    .with_label_values(&[state.label.as_str(), refusal.label()])
                    .inc();
                drop(client);
                continue;
            }
        };
        let (shared, state) = (shared.clone(), state.clone());
        // Tracked, so the drain waits for it; the permits go with the task.
        shared.connections.clone().spawn(async move {
            // Dropped in reverse: the permits go back before the gauge of
            // open connections falls, so a reader of the gauge never sees
            // a connection gone whose permits are still held.
            let _open = Held::new(&state.counters.active);
            let _permit = permit;
            state.counters.accepted.inc();
            let cfg = shared.cfg();
            handle(
                &shared.upstreams,
                &shared.metrics,
                &cfg,
                &state,
                client,
                from,
            )
            .await;
        });
    }
}
