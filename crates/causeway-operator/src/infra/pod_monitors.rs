//! Whether the Infras get PodMonitors: the kind is the Prometheus
//! Operator's, served on OpenShift and wherever that operator runs, and
//! may be installed after causeway.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::core::ApiResource;
use kube::Client;

use crate::k8s::resources::resource;
use crate::k8s::watch::served_eventually;

/// A poisoned lock still holds a coherent value: each writer sets whole
/// fields.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How long the operator believes the API server does not serve
/// PodMonitors before it asks again, at the next reconcile.
const POD_MONITOR_RECHECK: Duration = Duration::from_secs(30);

fn pod_monitor_kind() -> ApiResource {
    resource("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
}

/// Whether PodMonitors (the Prometheus Operator's CRDs, as OpenShift's
/// monitoring has) are served. Asked at start; while they are not, asked
/// again at a reconcile at most every [`POD_MONITOR_RECHECK`], so CRDs
/// installed after the operator are used without a restart.
pub struct PodMonitors {
    wanted: bool,
    known: Mutex<PodMonitorsSeen>,
}

struct PodMonitorsSeen {
    served: bool,
    asked: Instant,
}

impl PodMonitors {
    pub async fn at_start(client: &Client, wanted: bool) -> PodMonitors {
        let served =
            wanted && served_eventually(client, "monitoring.coreos.com/v1", "podmonitors").await;
        if served {
            tracing::info!("PodMonitors are served: one per Infra scrapes its pods");
        } else if wanted {
            tracing::info!("no monitoring.coreos.com/v1 PodMonitors yet: the Infras' pods get none until they are served");
        }
        PodMonitors {
            wanted,
            known: Mutex::new(PodMonitorsSeen {
                served,
                asked: Instant::now(),
            }),
        }
    }

    /// The kind, if it is asked for and served.
    pub async fn resource(&self, client: &Client) -> Option<ApiResource> {
        if !self.wanted {
            return None;
        }
        {
            let seen = lock(&self.known);
            if seen.served {
                return Some(pod_monitor_kind());
            }
            if seen.asked.elapsed() < POD_MONITOR_RECHECK {
                return None;
            }
        }
        // One question: an error counts as not served, asked again later.
        let served = client
            .list_api_group_resources("monitoring.coreos.com/v1")
            .await
            .is_ok_and(|list| list.resources.iter().any(|r| r.name == "podmonitors"));
        let mut seen = lock(&self.known);
        seen.asked = Instant::now();
        if served && !seen.served {
            tracing::info!("PodMonitors are served now: one per Infra scrapes its pods");
        }
        seen.served = served;
        served.then(pod_monitor_kind)
    }

    /// The kind went away (its CRD deleted): asked again later.
    pub fn gone(&self) {
        let mut seen = lock(&self.known);
        if seen.served {
            tracing::warn!(
                "PodMonitors are no longer served: the Infras' pods get none until they are again"
            );
        }
        seen.served = false;
        seen.asked = Instant::now();
    }
}
