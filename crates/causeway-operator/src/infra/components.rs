//! One component of an Infra: its objects applied (config first, and
//! with two replicas what they need beside their workload) or removed
//! when it is disabled, and its state as its workload's status shows it.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::Client;

use super::context::Context;
use super::crd::ReplicaStatus;
use super::plan::{Component, Owner, MAX_REPLICAS};
use super::render::{self, ComponentObjects, HaObjects, Workload};
use super::status::ComponentState;
use crate::error::Error;
use crate::k8s::index::{Owned, WorkloadFacts};
use crate::k8s::resources::resource;

pub(super) fn workload_state(w: Option<WorkloadFacts>, component: Component) -> ComponentState {
    let pods = component.name();
    // One message for every way of not being ready (no workload yet, a
    // workload controller that has not caught up, a pod starting), so
    // status is not rewritten for each step of a rollout.
    match w {
        Some(f) if f.observed_generation >= f.generation && f.updated && f.ready_replicas >= 1 => {
            ComponentState::Ready
        }
        _ => ComponentState::NotReady(format!("0 of 1 {pods} pods ready and up to date")),
    }
}

/// Two replicas: ready when both are ready on the latest template; while
/// one is, the component serves without a standby (degraded, not down),
/// whatever the workload controller is doing.
pub fn replicated_state(w: Option<WorkloadFacts>, component: Component) -> ComponentState {
    let pods = component.name();
    match w {
        Some(f)
            if f.observed_generation >= f.generation
                && f.updated
                && f.ready_replicas >= MAX_REPLICAS =>
        {
            ComponentState::Ready
        }
        Some(f) if f.ready_replicas >= 1 => ComponentState::Degraded(format!(
            "{pods} serves from one replica: the other is not ready or not up to date, so there is no standby"
        )),
        _ => ComponentState::NotReady(format!(
            "0 of {MAX_REPLICAS} {pods} pods ready and up to date"
        )),
    }
}

/// One component's objects applied, config first, or removed when it is
/// disabled; its state as the workload's status shows it.
pub(super) async fn component_state(
    ctx: &Context,
    owner: &Owner,
    component: Component,
    objects: Option<ComponentObjects>,
) -> Result<(ComponentState, Option<ReplicaStatus>), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let name = render::object_name(owner, component);
    let Some(objects) = objects else {
        ctx.applier
            .remove::<ConfigMap>(
                &s.config_maps,
                ns,
                &render::config_map_name(owner, component),
            )
            .await?;
        // Either kind: DNS and the proxy are StatefulSets with two replicas.
        ctx.applier
            .remove::<StatefulSet>(&s.stateful_sets, ns, &name)
            .await?;
        ctx.applier
            .remove::<Deployment>(&s.deployments, ns, &name)
            .await?;
        if component == Component::Dns {
            ctx.applier
                .remove::<Service>(&s.services, ns, &name)
                .await?;
        }
        Box::pin(remove_ha(ctx, owner, component)).await?;
        return Ok((ComponentState::Disabled, None));
    };

    // A workload of another kind or shape goes first, with its pods;
    // until it has, nothing of the component changes.
    let replacing = match &objects.workload {
        Workload::StatefulSet(set) => {
            let stale_shape = s
                .stateful_sets
                .get(ns, &name)
                .is_some_and(|seen| seen.shape != set.shape());
            if stale_shape {
                ctx.applier
                    .remove_foreground::<StatefulSet>(&s.stateful_sets, ns, &name)
                    .await?;
            }
            ctx.applier
                .remove_foreground::<Deployment>(&s.deployments, ns, &name)
                .await?;
            stale_shape || s.deployments.get(ns, &name).is_some()
        }
        Workload::Deployment(_) => {
            ctx.applier
                .remove_foreground::<StatefulSet>(&s.stateful_sets, ns, &name)
                .await?;
            s.stateful_sets.get(ns, &name).is_some()
        }
    };
    if replacing {
        return Ok((
            ComponentState::NotReady(format!(
                "replacing the {} workload: its old pods go before the new ones start",
                component.name()
            )),
            None,
        ));
    }

    ctx.applier
        .ensure_indexed(&s.config_maps, objects.config)
        .await?;
    if let Some(service) = objects.service {
        ctx.applier.ensure_indexed(&s.services, service).await?;
    }
    let replicated = objects.ha.is_some();
    match objects.ha {
        Some(ha) => Box::pin(ensure_ha(ctx, owner, component, ha)).await?,
        None => Box::pin(remove_ha(ctx, owner, component)).await?,
    }
    let facts = match objects.workload {
        Workload::StatefulSet(set) => {
            ctx.applier.ensure_indexed(&s.stateful_sets, set).await?;
            s.stateful_sets.get(ns, &name).and_then(|w| w.workload)
        }
        Workload::Deployment(d) => {
            ctx.applier.ensure_indexed(&s.deployments, d).await?;
            s.deployments.get(ns, &name).and_then(|w| w.workload)
        }
    };
    if !replicated {
        return Ok((workload_state(facts, component), None));
    }
    let replicas = ReplicaStatus {
        replicas: MAX_REPLICAS,
        ready_replicas: facts.map_or(0, |f| f.ready_replicas),
        active_replica: s
            .leases
            .get(ns, &render::lease_name(owner, component))
            .and_then(|l| l.holder),
    };
    Ok((replicated_state(facts, component), Some(replicas)))
}

/// What two replicas need beside their workload, the identity before what
/// it is granted. The key is made once: asked for again only while the
/// replicas are not both ready, as a key Secret deleted by hand keeps new
/// pods from starting.
async fn ensure_ha(
    ctx: &Context,
    owner: &Owner,
    component: Component,
    ha: HaObjects,
) -> Result<(), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let HaObjects {
        peers,
        disruption_budget,
        lease,
        service_account,
        role,
        role_binding,
    } = ha;
    ctx.applier
        .ensure_indexed(&s.service_accounts, service_account)
        .await?;
    ctx.applier.ensure_indexed(&s.leases, lease).await?;
    ctx.applier.ensure_indexed(&s.roles, role).await?;
    ctx.applier
        .ensure_indexed(&s.role_bindings, role_binding)
        .await?;
    ctx.applier.ensure_indexed(&s.services, peers).await?;
    let budget = disruption_budget_object(&ctx.disruption_budget, &disruption_budget)?;
    ctx.applier
        .ensure_indexed_dynamic(&s.disruption_budgets, &ctx.disruption_budget, budget)
        .await?;

    let key = (ns.to_string(), render::ha_key_name(owner, component));
    let both_ready = s
        .stateful_sets
        .get(ns, &render::object_name(owner, component))
        .and_then(|w| w.workload)
        .is_some_and(|f| f.ready_replicas >= MAX_REPLICAS);
    if both_ready && known_key(ctx, &key) {
        return Ok(());
    }
    ctx.applier
        .create_absent(&render::ha_key(owner, component, rand::random()))
        .await?;
    if let Ok(mut keys) = ctx.ha_keys.lock() {
        keys.insert(key);
    }
    Ok(())
}

fn known_key(ctx: &Context, key: &(String, String)) -> bool {
    ctx.ha_keys.lock().is_ok_and(|keys| keys.contains(key))
}

/// The budget as the version the API server serves: v1 and v1beta1 have
/// the same fields for what is set here.
fn disruption_budget_object(
    resource: &ApiResource,
    budget: &k8s_openapi::api::policy::v1::PodDisruptionBudget,
) -> Result<DynamicObject, Error> {
    let mut value = serde_json::to_value(budget).map_err(|e| Error::Render(e.to_string()))?;
    value["apiVersion"] = resource.api_version.clone().into();
    value["kind"] = resource.kind.clone().into();
    serde_json::from_value(value).map_err(|e| Error::Render(e.to_string()))
}

/// Removes what only two replicas have, once they are gone: the key first
/// (the operator cannot see it; the others say whether there is anything
/// to remove) and the Lease last, so an interrupted removal is taken up
/// again.
async fn remove_ha(ctx: &Context, owner: &Owner, component: Component) -> Result<(), Error> {
    let s = &ctx.indexes;
    let ns = owner.namespace.as_str();
    let identity = render::ha_identity_name(owner, component);
    let peers = render::peers_name(owner, component);
    let workload = render::object_name(owner, component);
    let lease = render::lease_name(owner, component);
    let any = s.leases.get(ns, &lease).is_some()
        || s.roles.get(ns, &identity).is_some()
        || s.role_bindings.get(ns, &identity).is_some()
        || s.service_accounts.get(ns, &identity).is_some()
        || s.services.get(ns, &peers).is_some()
        || s.disruption_budgets.get(ns, &workload).is_some();
    if !any {
        return Ok(());
    }
    let key = render::ha_key_name(owner, component);
    ctx.applier.remove_unindexed::<Secret>(ns, &key).await?;
    if let Ok(mut keys) = ctx.ha_keys.lock() {
        keys.remove(&(ns.to_string(), key));
    }
    ctx.applier
        .remove_dynamic(&s.disruption_budgets, &ctx.disruption_budget, ns, &workload)
        .await?;
    ctx.applier
        .remove::<Service>(&s.services, ns, &peers)
        .await?;
    ctx.applier
        .remove::<RoleBinding>(&s.role_bindings, ns, &identity)
        .await?;
    ctx.applier.remove::<Role>(&s.roles, ns, &identity).await?;
    ctx.applier
        .remove::<ServiceAccount>(&s.service_accounts, ns, &identity)
        .await?;
    ctx.applier.remove::<Lease>(&s.leases, ns, &lease).await?;
    Ok(())
}

/// The PodDisruptionBudget API the server serves: policy/v1 from 1.21,
/// policy/v1beta1 before (1.20, which the operator still supports).
pub(super) async fn disruption_budget_resource(client: &Client) -> ApiResource {
    if crate::k8s::watch::served_eventually(client, "policy/v1", "poddisruptionbudgets").await {
        return resource(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        );
    }
    tracing::info!("no policy/v1 PodDisruptionBudgets: using policy/v1beta1");
    resource(
        "policy",
        "v1beta1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn facts(ready: i32, updated: bool, observed: i64) -> Option<WorkloadFacts> {
        Some(WorkloadFacts {
            generation: 3,
            observed_generation: observed,
            ready_replicas: ready,
            updated,
        })
    }

    #[test]
    fn two_replicas_are_ready_degraded_or_down() {
        let c = Component::Dhcp;
        assert_eq!(
            replicated_state(facts(2, true, 3), c),
            ComponentState::Ready
        );
        // One left, or a rollout replacing one: it still serves.
        for f in [facts(1, true, 3), facts(2, false, 3), facts(1, false, 2)] {
            assert!(
                matches!(replicated_state(f, c), ComponentState::Degraded(_)),
                "{f:?}"
            );
        }
        for f in [facts(0, true, 3), None] {
            assert_eq!(
                replicated_state(f, c),
                ComponentState::NotReady("0 of 2 dhcp pods ready and up to date".into())
            );
        }
    }

    #[test]
    fn the_budget_is_applied_in_the_version_served() {
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        let mut budget = PodDisruptionBudget::default();
        budget.metadata.name = Some("x-dns".into());
        let v1beta1 = resource(
            "policy",
            "v1beta1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
        );
        let obj = disruption_budget_object(&v1beta1, &budget).unwrap();
        let value = serde_json::to_value(&obj).unwrap();
        assert_eq!(value["apiVersion"], "policy/v1beta1");
        assert_eq!(value["kind"], "PodDisruptionBudget");
        assert_eq!(value["metadata"]["name"], "x-dns");
    }
}
