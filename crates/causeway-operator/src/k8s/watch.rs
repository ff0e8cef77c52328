//! What a controller watches: a scope of namespaces, reflectors that keep
//! no managedFields, and the watches of our own objects that feed an
//! [`Index`].

use futures::{Stream, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, DynamicResourceScope, NamespaceResourceScope};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::index::{Index, Owned};
use super::MANAGED_BY;

/// Which namespaces one controller watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        match self {
            Scope::All => Api::all(client.clone()),
            Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
        }
    }

    /// The same for a kind known only at run time.
    pub fn api_with<K>(&self, client: &Client, resource: &K::DynamicType) -> Api<K>
    where
        K: Resource<Scope = DynamicResourceScope>,
    {
        match self {
            Scope::All => Api::all_with(client.clone(), resource),
            Scope::Namespace(ns) => Api::namespaced_with(client.clone(), ns, resource),
        }
    }
}

/// The scopes for a list of namespaces: empty means all.
pub fn scopes(namespaces: &[String]) -> Vec<Scope> {
    if namespaces.is_empty() {
        vec![Scope::All]
    } else {
        namespaces
            .iter()
            .map(|ns| Scope::Namespace(ns.clone()))
            .collect()
    }
}

/// A watch over our objects of one kind: the index it feeds, and the
/// stream of slimmed objects (names and owners only) that triggers the
/// owners' reconciles, for the events that changed what the index holds.
pub fn owned<K>(
    api: Api<K>,
) -> (
    Index,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Owned + Clone + Default + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    indexed(api, K::default)
}

/// The same for a kind chosen at run time (the `policy` version of
/// PodDisruptionBudgets).
pub fn owned_dynamic(
    api: Api<DynamicObject>,
    resource: ApiResource,
) -> (
    Index,
    impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
) {
    indexed(api, move || DynamicObject::new("", &resource))
}

fn indexed<K>(
    api: Api<K>,
    empty: impl Fn() -> K + Send + 'static,
) -> (
    Index,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Owned + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let config = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let index = Index::default();
    let feed = index.clone();
    let stream = watcher(api, config)
        .try_filter_map(move |event| {
            let changed = feed.observe(&event);
            let event = changed.then(|| event.modify(|obj| *obj = slim(obj, empty())));
            futures::future::ready(Ok(event))
        })
        .default_backoff()
        .touched_objects();
    (index, stream)
}

/// Only what the controller needs to map an object to its owner.
fn slim<K: Resource>(obj: &K, mut out: K) -> K {
    let meta = out.meta_mut();
    meta.name = obj.meta().name.clone();
    meta.namespace = obj.meta().namespace.clone();
    meta.owner_references = obj.meta().owner_references.clone();
    out
}

/// A reflector whose store keeps objects without their managedFields,
/// which nothing here reads and which are often the larger part of an
/// object applied by several managers.
pub fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .reflect(writer)
        .default_backoff()
        .touched_objects();
    (reader, stream)
}

/// [`cached`] for a kind known only at run time (a foreign CRD that may
/// not be installed: the watch retries with backoff until it is, and the
/// store stays empty meanwhile).
pub fn cached_dynamic(
    api: Api<DynamicObject>,
    resource: ApiResource,
    config: watcher::Config,
) -> (
    Store<DynamicObject>,
    impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
) {
    let writer = reflector::store::Writer::new(resource);
    let reader = writer.as_reader();
    let stream = watcher(api, config)
        .modify(|obj: &mut DynamicObject| obj.metadata.managed_fields = None)
        .reflect(writer)
        .default_backoff()
        .touched_objects();
    (reader, stream)
}

/// One foreign kind watched in every scope the operator works in, whichever
/// scope's controller reads it: an Infra's attachments put their control
/// planes in namespaces other than the Infra's.
#[derive(Clone, Default)]
pub struct Everywhere {
    stores: Vec<Store<DynamicObject>>,
}

impl Everywhere {
    /// The stores and one stream of every change, for `scopes`.
    pub fn watch(
        client: &Client,
        scopes: &[Scope],
        resource: &ApiResource,
    ) -> (
        Everywhere,
        impl Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static,
    ) {
        let mut stores = Vec::new();
        let mut streams = Vec::new();
        for scope in scopes {
            let (store, stream) = cached_dynamic(
                scope.api_with::<DynamicObject>(client, resource),
                resource.clone(),
                watcher::Config::default(),
            );
            stores.push(store);
            streams.push(Box::pin(stream));
        }
        (Everywhere { stores }, futures::stream::select_all(streams))
    }

    /// Every object held, in any scope.
    pub fn state(&self) -> Vec<std::sync::Arc<DynamicObject>> {
        self.stores.iter().flat_map(Store::state).collect()
    }
}
