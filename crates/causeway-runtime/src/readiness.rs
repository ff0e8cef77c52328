//! Readiness: the process is ready only when every registered service is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Readiness {
    components: Arc<Mutex<BTreeMap<String, bool>>>,
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
