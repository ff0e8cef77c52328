//! What the operator remembers of the objects it owns: per object, a hash
//! of its content, the desired-state hash it was last applied from, and for
//! workloads the few status fields readiness needs. Fed by the watches, so
//! a reconcile reads it instead of the API server; it holds no object,
//! which keeps the operator's memory flat in the number of Infras.
//!
//! Drift is decided in two steps. An object whose content hash is the one
//! the operator last verified, and whose desired hash is current, is as it
//! should be: nothing is read or written. Any other state is read once from
//! the API server and compared field by field ([`crate::drift`]); only a
//! real difference is applied. The verified hash is recorded after an apply
//! and after a comparison that found nothing to do.
//!
//! A watch event that leaves what the index holds unchanged (a status
//! field readiness does not read, a Lease renewed by its holder) triggers
//! no reconcile: nothing a reconcile reads has moved.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::Resource;
use serde::Serialize;
use serde_json::Value;

use super::drift::DESIRED_HASH_ANNOTATION;

/// The status fields readiness is decided from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkloadFacts {
    pub generation: i64,
    pub observed_generation: i64,
    pub ready_replicas: i32,
    /// Every replica runs the latest template.
    pub updated: bool,
}

/// One object as last seen by the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub content: u64,
    pub desired: Option<String>,
    pub workload: Option<WorkloadFacts>,
    /// A Lease's holder.
    pub holder: Option<String>,
    /// What a workload cannot change in place (see [`Owned::shape`]).
    pub shape: Option<String>,
    /// Deletion has begun (foreground: its dependents go first).
    pub deleting: bool,
}

/// A kind the operator owns: how to read its readiness, if it has any.
pub trait Owned: Resource + Serialize {
    fn workload(&self) -> Option<WorkloadFacts> {
        None
    }

    /// Who holds it, for a Lease.
    fn holder(&self) -> Option<String> {
        None
    }

    /// The fields the API server refuses to change once the object exists
    /// (a StatefulSet's serviceName and podManagementPolicy), as one
    /// string: when the rendering's differs, the object must be replaced.
    fn shape(&self) -> Option<String> {
        None
    }

    /// The hash of what the operator sets or could see changed; see
    /// [`content_hash`].
    fn hashed(&self) -> u64 {
        content_hash(self)
    }
}

impl Owned for ConfigMap {}
impl Owned for ServiceAccount {}
impl Owned for Service {}
impl Owned for NetworkPolicy {}
impl Owned for Role {}
impl Owned for RoleBinding {}
/// A PodDisruptionBudget, in whichever `policy` version the API server
/// serves.
impl Owned for DynamicObject {}

impl Owned for Lease {
    fn holder(&self) -> Option<String> {
        self.spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty())
    }

    // The spec is the replicas' to write (renewals every minute); the
    // operator sets only metadata, and reads the holder on its own.
    fn hashed(&self) -> u64 {
        let mut meta_only = self.clone();
        meta_only.spec = None;
        content_hash(&meta_only)
    }
}

impl Owned for Deployment {
    fn workload(&self) -> Option<WorkloadFacts> {
        let st = self.status.as_ref();
        Some(WorkloadFacts {
            generation: self.metadata.generation.unwrap_or(0),
            observed_generation: st.and_then(|s| s.observed_generation).unwrap_or(0),
            ready_replicas: st.and_then(|s| s.ready_replicas).unwrap_or(0),
            // Recreate: once the new ReplicaSet has a replica, the old one
            // has none.
            updated: st.and_then(|s| s.updated_replicas).unwrap_or(0) >= 1,
        })
    }
}

impl Owned for StatefulSet {
    fn workload(&self) -> Option<WorkloadFacts> {
        let st = self.status.as_ref();
        Some(WorkloadFacts {
            generation: self.metadata.generation.unwrap_or(0),
            observed_generation: st.and_then(|s| s.observed_generation).unwrap_or(0),
            ready_replicas: st.and_then(|s| s.ready_replicas).unwrap_or(0),
            updated: st.is_some_and(|s| {
                s.update_revision.is_none() || s.update_revision == s.current_revision
            }),
        })
    }

    fn shape(&self) -> Option<String> {
        let spec = self.spec.as_ref()?;
        Some(format!(
            "{}/{}",
            spec.service_name.as_deref().unwrap_or_default(),
            // The API server's default, so a rendering that leaves it out
            // matches what it stored.
            spec.pod_management_policy
                .as_deref()
                .unwrap_or("OrderedReady")
        ))
    }
}

/// A hash of what another writer could change in `obj`: all of it but its
/// status and the metadata the API server maintains.
pub fn content_hash<K: Serialize + ?Sized>(obj: &K) -> u64 {
    let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for volatile in [
                "resourceVersion",
                "managedFields",
                "generation",
                "creationTimestamp",
                "uid",
                "selfLink",
            ] {
                meta.remove(volatile);
            }
        }
    }
    let mut hasher = std::hash::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    hasher.finish()
}

pub fn seen<K: Owned>(obj: &K) -> Seen {
    Seen {
        content: obj.hashed(),
        desired: obj
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
            .cloned(),
        workload: obj.workload(),
        holder: obj.holder(),
        shape: obj.shape(),
        deleting: obj.meta().deletion_timestamp.is_some(),
    }
}

type Key = (String, String);

#[derive(Default)]
struct Inner {
    live: HashMap<Key, Seen>,
    /// Filled during a relist, swapped in when it ends (as kube's own
    /// reflector does), so a relist never shows a half-empty index.
    relisting: Option<HashMap<Key, Seen>>,
    ready: bool,
    /// The content hash each object had when last found or made right,
    /// with the desired hash it was right for.
    verified: HashMap<Key, (u64, String)>,
}

/// The index of one owned kind.
#[derive(Clone, Default)]
pub struct Index {
    inner: Arc<RwLock<Inner>>,
}

fn key_of<K: Resource>(obj: &K) -> Key {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

impl Index {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; go on.
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one watch event in; `false` when it changed nothing the
    /// index holds (an object seen again as it was).
    pub fn observe<K: Owned>(&self, event: &watcher::Event<K>) -> bool {
        let mut inner = self.write();
        match event {
            watcher::Event::Apply(obj) => {
                let entry = seen(obj);
                let before = inner.live.insert(key_of(obj), entry.clone());
                return before.as_ref() != Some(&entry);
            }
            watcher::Event::Delete(obj) => {
                let key = key_of(obj);
                inner.live.remove(&key);
                inner.verified.remove(&key);
            }
            watcher::Event::Init => inner.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(obj) => {
                let entry = seen(obj);
                inner
                    .relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(key_of(obj), entry);
            }
            watcher::Event::InitDone => {
                if let Some(fresh) = inner.relisting.take() {
                    inner.live = fresh;
                }
                inner.ready = true;
            }
        }
        true
    }

    /// Whether the first list has been taken in.
    pub fn ready(&self) -> bool {
        self.read().ready
    }

    pub fn get(&self, ns: &str, name: &str) -> Option<Seen> {
        self.read()
            .live
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Whether the object is there and known to be right for `desired`.
    pub fn is_current(&self, ns: &str, name: &str, desired: &str) -> bool {
        let inner = self.read();
        let key = (ns.to_string(), name.to_string());
        match (inner.live.get(&key), inner.verified.get(&key)) {
            (Some(seen), Some((content, verified_for))) => {
                seen.desired.as_deref() == Some(desired)
                    && seen.content == *content
                    && verified_for == desired
            }
            _ => false,
        }
    }

    /// Records that `obj`, as the API server returned or showed it, is
    /// right for `desired`.
    pub fn verified<K: Owned>(&self, obj: &K, desired: &str) {
        let mut inner = self.write();
        inner
            .verified
            .insert(key_of(obj), (obj.hashed(), desired.to_string()));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cm(name: &str, data: &str, rv: &str, desired: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.resource_version = Some(rv.into());
        c.metadata.annotations =
            Some([(DESIRED_HASH_ANNOTATION.to_string(), desired.to_string())].into());
        c.data = Some([("k".to_string(), data.to_string())].into());
        c
    }

    #[test]
    fn server_bookkeeping_does_not_change_the_content_hash() {
        let a = cm("x", "v", "1", "d");
        let mut b = cm("x", "v", "2", "d");
        b.metadata.uid = Some("u".into());
        assert_eq!(content_hash(&a), content_hash(&b));
        assert_ne!(content_hash(&a), content_hash(&cm("x", "w", "1", "d")));
    }

    #[test]
    fn current_only_while_the_verified_content_is_what_the_watch_shows() {
        let index = Index::default();
        let obj = cm("x", "v", "1", "d1");
        index.observe(&watcher::Event::Apply(obj.clone()));
        assert!(!index.is_current("ns", "x", "d1"), "never verified");
        index.verified(&obj, "d1");
        assert!(index.is_current("ns", "x", "d1"));
        assert!(!index.is_current("ns", "x", "d2"), "a new desired state");
        // Someone else changes the data: no longer current.
        index.observe(&watcher::Event::Apply(cm("x", "hijacked", "2", "d1")));
        assert!(!index.is_current("ns", "x", "d1"));
        index.observe(&watcher::Event::Delete(obj));
        assert!(index.get("ns", "x").is_none());
    }

    #[test]
    fn an_event_that_changes_nothing_held_is_told_apart() {
        let index = Index::default();
        assert!(index.observe(&watcher::Event::Apply(cm("x", "v", "1", "d"))));
        // The same content at a later resourceVersion: nothing to do.
        assert!(!index.observe(&watcher::Event::Apply(cm("x", "v", "2", "d"))));
        assert!(index.observe(&watcher::Event::Apply(cm("x", "w", "3", "d"))));
    }

    #[test]
    fn a_lease_renewal_is_no_change_and_a_new_holder_is() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let lease = |holder: &str, renewed: &str| {
            let mut l = Lease::default();
            l.metadata.name = Some("infra-dhcp".into());
            l.metadata.namespace = Some("ns".into());
            l.spec = Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                ..LeaseSpec::default()
            });
            l
        };
        let index = Index::default();
        assert!(index.observe(&watcher::Event::Apply(lease("a-0", "2026-11-27T10:00:00Z"))));
        assert!(!index.observe(&watcher::Event::Apply(lease("a-0", "2026-11-27T10:01:00Z"))));
        assert!(index.observe(&watcher::Event::Apply(lease("a-1", "2026-11-27T10:01:03Z"))));
        assert_eq!(
            index.get("ns", "infra-dhcp").unwrap().holder.as_deref(),
            Some("a-1")
        );
        // Verified once, a renewal keeps it current: no read, no write.
        index.verified(&lease("a-1", "2026-11-27T10:01:03Z"), "d");
        let mut stamped = lease("a-1", "2026-11-27T10:02:03Z");
        stamped.metadata.annotations =
            Some([(DESIRED_HASH_ANNOTATION.to_string(), "d".to_string())].into());
        index.observe(&watcher::Event::Apply(stamped.clone()));
        index.verified(&stamped, "d");
        stamped.spec.as_mut().unwrap().renew_time =
            Some(MicroTime("2026-11-27T10:03:03Z".parse().unwrap()));
        index.observe(&watcher::Event::Apply(stamped));
        assert!(index.is_current("ns", "infra-dhcp", "d"));
    }

    #[test]
    fn a_statefulsets_shape_names_what_cannot_change_in_place() {
        use k8s_openapi::api::apps::v1::StatefulSetSpec;
        let mut set = StatefulSet {
            spec: Some(StatefulSetSpec {
                service_name: Some("infra-dhcp".into()),
                ..StatefulSetSpec::default()
            }),
            ..StatefulSet::default()
        };
        assert_eq!(set.shape().as_deref(), Some("infra-dhcp/OrderedReady"));
        set.spec.as_mut().unwrap().pod_management_policy = Some("Parallel".into());
        set.spec.as_mut().unwrap().service_name = Some("infra-dhcp-peers".into());
        assert_eq!(set.shape().as_deref(), Some("infra-dhcp-peers/Parallel"));
    }

    #[test]
    fn a_relist_replaces_the_index_only_when_complete() {
        let index = Index::default();
        index.observe(&watcher::Event::Apply(cm("old", "v", "1", "d")));
        index.observe(&watcher::Event::<ConfigMap>::Init);
        index.observe(&watcher::Event::InitApply(cm("new", "v", "1", "d")));
        assert!(index.get("ns", "old").is_some(), "swapped before InitDone");
        assert!(!index.ready());
        index.observe(&watcher::Event::<ConfigMap>::InitDone);
        assert!(index.ready());
        assert!(index.get("ns", "old").is_none());
        assert!(index.get("ns", "new").is_some());
    }
}
