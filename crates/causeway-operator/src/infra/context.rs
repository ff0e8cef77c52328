//! What every Infra reconcile works with: the client and applier, the
//! settings, the indexes of what the operator owns, and the stores of the
//! foreign kinds it follows.

use std::collections::HashSet;
use std::sync::Mutex;

use kube::core::ApiResource;
use kube::runtime::events::Recorder;
use kube::Client;

use super::attachment::InfraClusterAttachment;
use super::plan::Settings;
use super::pod_monitors::PodMonitors;
use crate::k8s::apply::Applier;
use crate::k8s::index::Index;
use crate::k8s::metrics::OperatorMetrics;
use crate::k8s::watch::{Everywhere, OptionalStore};

/// What the reconciler reads from: one index per kind it owns, all limited
/// to the watched namespace (or all) and to objects it made.
#[derive(Clone, Default)]
pub struct Indexes {
    pub config_maps: Index,
    pub deployments: Index,
    pub stateful_sets: Index,
    pub service_accounts: Index,
    pub services: Index,
    pub network_policies: Index,
    pub leases: Index,
    pub disruption_budgets: Index,
    pub roles: Index,
    pub role_bindings: Index,
}

impl Indexes {
    /// Whether every watch has delivered its first list: until then a
    /// missing entry may only be one not listed yet.
    pub fn ready(&self) -> bool {
        [
            &self.config_maps,
            &self.deployments,
            &self.stateful_sets,
            &self.service_accounts,
            &self.services,
            &self.network_policies,
            &self.leases,
            &self.disruption_budgets,
            &self.roles,
            &self.role_bindings,
        ]
        .iter()
        .all(|i| i.ready())
    }
}

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub settings: Settings,
    pub indexes: Indexes,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
    /// PodDisruptionBudgets in the version the API server serves.
    pub disruption_budget: ApiResource,
    /// PodMonitors, when they are asked for and the API server serves them.
    pub pod_monitors: PodMonitors,
    /// The replicas' key Secrets known to exist: the operator may create
    /// and delete Secrets but not read them, so it remembers.
    pub ha_keys: Mutex<HashSet<(String, String)>>,
    /// Every InfraClusterAttachment in scope.
    pub attachments: OptionalStore<InfraClusterAttachment>,
    /// Every Cluster API Machine in scope (empty while the kind is not
    /// served).
    pub machines: Everywhere,
}
