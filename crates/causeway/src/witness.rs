//! The Kubernetes Lease as the witness of an HA pair (lease mode): read,
//! claimed and renewed with the resourceVersion read, so two replicas
//! writing at once cannot both win.

use causeway_config::HaLease;
use causeway_operator::k8s::lease::{holder_is, LeaseWriter};
use causeway_runtime::ha::{Witness, WitnessView};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

pub struct LeaseWitness {
    lease: LeaseWriter,
    /// The object as last read: a claim writes it back at the version read,
    /// without a second read.
    last_read: std::sync::Mutex<Option<Lease>>,
    /// Shown in the Lease for people; takeovers never wait for it.
    duration_seconds: i32,
}

impl LeaseWitness {
    /// The in-cluster config in a pod, else `KUBECONFIG`.
    pub async fn connect(cfg: &HaLease, me: &str) -> anyhow::Result<LeaseWitness> {
        let client = causeway_operator::k8s::client::connect().await?;
        let namespace = cfg
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        Ok(LeaseWitness {
            lease: LeaseWriter::new(Api::namespaced(client, &namespace), &cfg.name, me),
            last_read: std::sync::Mutex::new(None),
            duration_seconds: i32::try_from(cfg.renew_interval.as_secs() * 2).unwrap_or(i32::MAX),
        })
    }

    async fn hold(&self, read: Option<Lease>) -> Result<bool, String> {
        self.lease
            .hold(read, self.duration_seconds)
            .await
            .map_err(|e| e.to_string())
    }
}

impl Witness for LeaseWitness {
    async fn read(&self) -> Result<WitnessView, String> {
        match self.lease.get().await {
            Ok(Some(lease)) => {
                let view = WitnessView {
                    holder: lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.holder_identity.clone())
                        .filter(|h| !h.is_empty()),
                    version: lease.metadata.resource_version.clone().unwrap_or_default(),
                };
                *self.last_read.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease);
                Ok(view)
            }
            // Not made yet: a claim creates it.
            Ok(None) => Ok(WitnessView {
                holder: None,
                version: String::new(),
            }),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn claim(&self, version: String) -> Result<bool, String> {
        if version.is_empty() {
            return self.hold(None).await;
        }
        // The object at the version read, not the newest: a write since
        // makes the replace fail with 409.
        let read = self
            .last_read
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .filter(|l| l.metadata.resource_version.as_deref() == Some(version.as_str()));
        match read {
            Some(lease) => self.hold(Some(lease)).await,
            None => Ok(false),
        }
    }

    async fn renew(&self) -> Result<bool, String> {
        let lease = match self.lease.get().await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(false),
            Err(e) => return Err(e.to_string()),
        };
        if !holder_is(&lease, self.lease.me()) {
            return Ok(false);
        }
        self.hold(Some(lease)).await
    }
}
