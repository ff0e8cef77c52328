//! Readiness: the process is ready only when every registered service is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A detail shown beside the services in `/readyz`, which does not decide
/// readiness (the HA role and whether the standby is in sync).
pub type Detail = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

#[derive(Clone, Default)]
pub struct Readiness {
    components: Arc<Mutex<BTreeMap<String, bool>>>,
    details: Arc<Mutex<BTreeMap<String, Detail>>>,
}

/// A service's own switch in the readiness board.
#[derive(Clone)]
pub struct ReadyHandle {
    name: String,
    board: Readiness,
}

impl Readiness {
    pub fn register(&self, name: &str) -> ReadyHandle {
        self.lock().insert(name.to_string(), false);
        ReadyHandle {
            name: name.to_string(),
            board: self.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, bool>> {
        // A panic elsewhere must not take readiness reporting down with it.
        self.components.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ready when at least one service is registered and all are ready.
    pub fn is_ready(&self) -> bool {
        let c = self.lock();
        !c.is_empty() && c.values().all(|r| *r)
    }

    pub fn snapshot(&self) -> BTreeMap<String, bool> {
        self.lock().clone()
    }

    pub fn detail(&self, name: &str, detail: Detail) {
        self.details
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), detail);
    }

    /// `/readyz`'s body: each service's readiness, and each detail under
    /// its own name.
    pub fn report(&self) -> serde_json::Value {
        let mut out: serde_json::Map<String, serde_json::Value> = self
            .snapshot()
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::Bool(v)))
            .collect();
        let details: Vec<(String, Detail)> = self
            .details
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, detail) in details {
            out.insert(name, detail());
        }
        serde_json::Value::Object(out)
    }
}

impl ReadyHandle {
    pub fn set(&self, ready: bool) {
        self.board.lock().insert(self.name.clone(), ready);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_service_is() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        let dhcp = r.register("dhcp");
        let dns = r.register("dns");
        dhcp.set(true);
        assert!(!r.is_ready());
        dns.set(true);
        assert!(r.is_ready());
        dhcp.set(false);
        assert!(!r.is_ready());
    }
}
