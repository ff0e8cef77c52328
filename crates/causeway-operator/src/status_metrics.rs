//! The status of every object the operator reconciles, as metrics: each
//! condition (`causeway_operator_condition`) and, while a finalizer holds a
//! deletion, when it began (`causeway_operator_deletion_timestamp_seconds`).
//! Alerts read these for an Infra, attachment or provisioner that stays not
//! Ready, a CSR approver that stays inactive, or a deletion that hangs.
//!
//! Read from watches of the objects themselves, not from the controllers:
//! what the API server holds is what an administrator sees with `kubectl`,
//! whichever controller (or replica) wrote it.

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::Client;

use crate::dpf::crd::DPFHCPProvisioner;
use crate::infra::attachment::InfraClusterAttachment;
use crate::infra::crd::Infra;
use crate::k8s::metrics::{ObjectState, OperatorMetrics};
use crate::k8s::watch::{cached_dynamic, once_served, OptionalKind, Scope};

/// What the metrics say of `obj`, a `kind`.
pub fn object_state(kind: &'static str, obj: &DynamicObject) -> ObjectState {
    let conditions = obj
        .data
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .map(|list| {
            list.iter()
                .filter_map(|c| {
                    let type_ = c.get("type")?.as_str()?;
                    let status = c.get("status")?.as_str()?;
                    Some((type_.to_string(), status == "True"))
                })
                .collect()
        })
        .unwrap_or_default();
    ObjectState {
        kind,
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().unwrap_or_default(),
        conditions,
        deleting_since: obj
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
    }
}

/// Keeps the status metrics in step with the objects in `scopes` until
/// `stopped`. Provisioners are watched only with the DPF bridge on.
pub async fn run(
    client: Client,
    scopes: Vec<Scope>,
    dpf: bool,
    metrics: OperatorMetrics,
    stopped: impl std::future::Future<Output = ()>,
) {
    let mut kinds: Vec<(&'static str, ApiResource)> = vec![
        ("Infra", ApiResource::erase::<Infra>(&())),
        (
            "InfraClusterAttachment",
            ApiResource::erase::<InfraClusterAttachment>(&()),
        ),
    ];
    if dpf {
        kinds.push((
            "DPFHCPProvisioner",
            ApiResource::erase::<DPFHCPProvisioner>(&()),
        ));
    }
    let mut stores: Vec<(&'static str, Store<DynamicObject>)> = Vec::new();
    let mut streams = Vec::new();
    for (kind, resource) in &kinds {
        for scope in &scopes {
            let (store, stream) = cached_dynamic(
                scope.api_with::<DynamicObject>(&client, resource),
                resource.clone(),
                watcher::Config::default(),
            );
            stores.push((kind, store));
            // A kind not served yet (its CRD applied later) is looked
            // for, not listed in a loop of 404s.
            let stream = once_served(
                client.clone(),
                OptionalKind::of(resource, "no state metrics for its objects"),
                Default::default(),
                move || stream,
            );
            streams.push(stream.boxed());
        }
    }
    let mut changes = futures::stream::select_all(streams);
    let publish = || {
        let objects: Vec<ObjectState> = stores
            .iter()
            .flat_map(|(kind, store)| store.state().into_iter().map(|o| object_state(kind, &o)))
            .collect();
        metrics.object_states(&objects);
    };
    let mut stopped = std::pin::pin!(stopped);
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            change = changes.next() => match change {
                Some(Ok(_)) => publish(),
                // The watch's own errors, retried with backoff.
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "status metrics watch");
                    publish();
                }
                None => break,
            },
            // A deletion is no touched object: the store drops it, and
            // this publish drops its series.
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => publish(),
        }
    }
    // A replica that no longer leads says nothing of objects it no
    // longer watches.
    metrics.object_states(&[]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn object(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn conditions_and_the_deletion_time_are_read_from_the_object() {
        let o = object(serde_json::json!({
            "apiVersion": "hostedcluster.densityops.com/v1alpha1",
            "kind": "Infra",
            "metadata": {"name": "a", "namespace": "ns", "deletionTimestamp": "2026-11-27T04:00:00Z"},
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "X"},
                {"type": "Attachments", "status": "True"},
                {"type": "Odd", "status": "Unknown"},
                {"status": "True"},
                7
            ]}
        }));
        let s = object_state("Infra", &o);
        assert_eq!(s.namespace, "ns");
        assert_eq!(s.name, "a");
        assert_eq!(
            s.conditions,
            vec![
                ("Ready".to_string(), false),
                ("Attachments".to_string(), true),
                ("Odd".to_string(), false)
            ]
        );
        assert_eq!(s.deleting_since, Some(1_795_752_000));
    }

    #[test]
    fn an_object_without_status_has_no_series() {
        let o = object(serde_json::json!({
            "apiVersion": "v1", "kind": "Infra", "metadata": {"name": "a", "namespace": "ns"}
        }));
        let s = object_state("Infra", &o);
        assert!(s.conditions.is_empty());
        assert_eq!(s.deleting_since, None);
    }
}
