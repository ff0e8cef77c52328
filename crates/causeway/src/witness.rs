//! The Kubernetes Lease as the witness of an HA pair (lease mode): read,
//! claimed and renewed with the resourceVersion read, so two replicas
//! writing at once cannot both win.

use causeway_config::HaLease;
use causeway_runtime::ha::{Witness, WitnessView};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

pub struct LeaseWitness {
    api: Api<Lease>,
    name: String,
    me: String,
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
            api: Api::namespaced(client, &namespace),
            name: cfg.name.clone(),
            me: me.to_string(),
            last_read: std::sync::Mutex::new(None),
            duration_seconds: i32::try_from(cfg.renew_interval.as_secs() * 2).unwrap_or(i32::MAX),
        })
    }

    fn spec_for_me(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let mine = previous.and_then(|s| s.holder_identity.as_deref()) == Some(self.me.as_str());
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.duration_seconds),
            renew_time: Some(now.clone()),
            acquire_time: if mine {
                previous.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now)
            },
            lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
            ..LeaseSpec::default()
        }
    }

    async fn write(&self, mut lease: Lease) -> Result<bool, String> {
        lease.spec = Some(self.spec_for_me(lease.spec.as_ref()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Witness for LeaseWitness {
    async fn read(&self) -> Result<WitnessView, String> {
        match self.api.get_opt(&self.name).await {
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
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec_for_me(None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.to_string()),
            };
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
            Some(lease) => self.write(lease).await,
            None => Ok(false),
        }
    }

    async fn renew(&self) -> Result<bool, String> {
        let lease = match self.api.get_opt(&self.name).await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(false),
            Err(e) => return Err(e.to_string()),
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(self.me.as_str()) {
            return Ok(false);
        }
        self.write(lease).await
    }
}
