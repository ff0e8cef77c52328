//! What every proxy thread shares: the config in force (swapped whole by a
//! reload), the metrics, what is known of the upstreams, the process-wide
//! admission limits, and every connection task (for the drain). The
//! listeners' accept loops and the health checks use it; a connection is
//! handed only the parts it uses.

use std::sync::{Arc, RwLock};

use causeway_config::ProxyConfig;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::metrics::ProxyMetrics;
use crate::upstream::Upstreams;

pub(crate) struct ProxyState {
    /// Swapped whole by a reload; a connection reads it once.
    pub(crate) cfg: RwLock<Arc<ProxyConfig>>,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) upstreams: Upstreams,
    pub(crate) admission: Admission,
    /// Every connection task, on whichever proxy thread: the drain closes
    /// it and waits for it to empty.
    pub(crate) connections: TaskTracker,
}

impl ProxyState {
    pub(crate) fn cfg(&self) -> Arc<ProxyConfig> {
        self.cfg.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
