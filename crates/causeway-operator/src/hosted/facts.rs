//! What a HostedCluster says, read once for every controller: its name
//! and domain (the Infra side renders names from them), its conditions,
//! rollout history and endpoints (the DPF bridge reports and waits on
//! them). Pure: read from the object's JSON, nothing fetched here.

use serde_json::Value;

/// A HostedCluster condition as HyperShift writes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcCondition {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HistoryEntry {
    pub state: String,
    pub image: String,
    pub version: String,
}

/// What the live HostedCluster says, as both controllers read it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostedClusterFacts {
    pub name: String,
    pub namespace: String,
    /// `spec.dns.baseDomain`.
    pub base_domain: Option<String>,
    pub conditions: Vec<HcCondition>,
    /// Newest first, as HyperShift keeps it.
    pub history: Vec<HistoryEntry>,
    pub endpoint: Option<String>,
    pub release_image: Option<String>,
    /// `host[:port]` of HyperShift's ignition server.
    pub ignition_endpoint: Option<String>,
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

impl HostedClusterFacts {
    /// Read from a HostedCluster object; anything missing or malformed is
    /// left out rather than failing.
    pub fn from_object(hc: &Value) -> Self {
        let conditions = hc
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|c| HcCondition {
                        type_: text(c, "/type"),
                        status: text(c, "/status"),
                        reason: text(c, "/reason"),
                        message: text(c, "/message"),
                    })
                    .filter(|c| !c.type_.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let history = [
            "/status/controlPlaneVersion/history",
            "/status/version/history",
        ]
        .iter()
        .find_map(|p| hc.pointer(p).and_then(Value::as_array))
        .map(|list| {
            list.iter()
                .map(|h| HistoryEntry {
                    state: text(h, "/state"),
                    image: text(h, "/image"),
                    version: text(h, "/version"),
                })
                .collect()
        })
        .unwrap_or_default();
        let ignition = text(hc, "/status/ignitionEndpoint");
        let host = text(hc, "/status/controlPlaneEndpoint/host");
        let endpoint = (!host.is_empty()).then(|| {
            match hc
                .pointer("/status/controlPlaneEndpoint/port")
                .and_then(Value::as_i64)
            {
                Some(port) if host.contains(':') => format!("https://[{host}]:{port}"),
                Some(port) => format!("https://{host}:{port}"),
                None => format!("https://{host}"),
            }
        });
        let release_image = hc
            .pointer("/spec/release/image")
            .and_then(Value::as_str)
            .map(str::to_string);
        let base_domain = hc
            .pointer("/spec/dns/baseDomain")
            .and_then(Value::as_str)
            .map(str::to_string);
        HostedClusterFacts {
            name: text(hc, "/metadata/name"),
            namespace: text(hc, "/metadata/namespace"),
            base_domain,
            conditions,
            history,
            endpoint,
            release_image,
            ignition_endpoint: (!ignition.is_empty()).then_some(ignition),
        }
    }

    pub fn condition(&self, type_: &str) -> Option<&HcCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    pub fn is(&self, type_: &str, status: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == status)
    }

    /// The version of the newest completed rollout.
    pub fn version(&self) -> Option<String> {
        self.history
            .iter()
            .find(|h| h.state == "Completed" && !h.version.is_empty())
            .map(|h| h.version.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one reading serves both controllers: the Infra side's name and
    /// domain, the bridge's conditions and endpoint, from the same object.
    #[test]
    fn one_reading_gives_each_controller_what_it_uses() {
        let hc = serde_json::json!({
            "metadata": {"name": "hc1", "namespace": "clusters"},
            "spec": {"dns": {"baseDomain": "example.com"}, "release": {"image": "quay.io/r:1"}},
            "status": {
                "conditions": [{"type": "Available", "status": "True", "reason": "AsExpected", "message": ""}],
                "controlPlaneEndpoint": {"host": "10.0.0.5", "port": 6443},
                "version": {"history": [{"state": "Completed", "image": "quay.io/r:1", "version": "4.19.0"}]}
            }
        });
        let facts = HostedClusterFacts::from_object(&hc);
        assert_eq!(facts.name, "hc1");
        assert_eq!(facts.namespace, "clusters");
        assert_eq!(facts.base_domain.as_deref(), Some("example.com"));
        assert!(facts.is("Available", "True"));
        assert_eq!(facts.endpoint.as_deref(), Some("https://10.0.0.5:6443"));
        assert_eq!(facts.version().as_deref(), Some("4.19.0"));
        // A malformed object gives empty facts, not a failure.
        let empty = HostedClusterFacts::from_object(
            &serde_json::json!({"spec": {"dns": {"baseDomain": 42}}}),
        );
        assert_eq!(empty, HostedClusterFacts::default());
    }
}
