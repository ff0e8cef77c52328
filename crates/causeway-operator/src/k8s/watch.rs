//! What a controller watches: a scope of namespaces, reflectors that keep
//! no managedFields, and the watches of our own objects that feed an
//! [`Index`].

use futures::{Stream, StreamExt, TryStreamExt};
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

/// Every change to the objects `api` and `config` select, as the objects
/// touched, retrying with backoff: the trigger stream every controller
/// here watches foreign and secondary kinds with.
pub fn touched<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(api, config).default_backoff().touched_objects()
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
    (
        reader,
        reflected_events(api, config, writer).touched_objects(),
    )
}

/// Every event of the watch of `api`, with the store behind `writer` kept
/// up to date (objects without their managedFields), retrying with
/// backoff: the one watcher chain here, for a consumer that needs the end
/// of the first list as well as the objects.
pub fn reflected_events<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    watcher(api, config)
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .reflect(writer)
        .default_backoff()
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
    (
        reader,
        reflected_events(api, config, writer).touched_objects(),
    )
}

/// One foreign kind watched in every scope the operator works in, whichever
/// scope's controller reads it: an Infra's attachments put their control
/// planes in namespaces other than the Infra's.
#[derive(Clone, Default)]
pub struct Everywhere {
    stores: Vec<Store<DynamicObject>>,
}

impl Everywhere {
    /// The stores and one stream of every change, for `scopes`; the
    /// watches start once the kind is served (see [`once_served`]).
    pub fn watch(
        client: &Client,
        scopes: &[Scope],
        resource: &ApiResource,
        meanwhile: &'static str,
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
        let all = futures::stream::select_all(streams);
        let gated = once_served(
            client.clone(),
            OptionalKind::of(resource, meanwhile),
            Served::default(),
            move || all,
        );
        (Everywhere { stores }, gated)
    }

    /// Every object held, in any scope.
    pub fn state(&self) -> Vec<std::sync::Arc<DynamicObject>> {
        self.stores.iter().flat_map(Store::state).collect()
    }
}

/// How long after a first "not served" the kind is asked for again
/// before the controllers go on without it.
const NOT_SERVED_CONFIRM: std::time::Duration = std::time::Duration::from_secs(2);

/// How often a kind that is not served is looked for again.
pub const OPTIONAL_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// A kind the API server may not serve (a CRD not installed, or installed
/// later): named for discovery and for the log.
#[derive(Debug, Clone)]
pub struct OptionalKind {
    pub group_version: String,
    pub plural: String,
    /// What the controller goes without while the kind is not served.
    pub meanwhile: &'static str,
}

impl OptionalKind {
    pub fn of(resource: &ApiResource, meanwhile: &'static str) -> OptionalKind {
        OptionalKind {
            group_version: resource.api_version.clone(),
            plural: resource.plural.clone(),
            meanwhile,
        }
    }
}

const SERVED_NO: u8 = 1;
const SERVED_YES: u8 = 2;

/// Whether an optional kind is served, as last seen: shared by the watch
/// that finds out and the reconciles that read its store. Zero, the
/// default, is not known yet.
#[derive(Debug, Clone, Default)]
pub struct Served(std::sync::Arc<std::sync::atomic::AtomicU8>);

impl Served {
    fn set(&self, v: u8) {
        self.0.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    fn get(&self) -> u8 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `None` until discovery first answered.
    pub fn served(&self) -> Option<bool> {
        match self.get() {
            SERVED_NO => Some(false),
            SERVED_YES => Some(true),
            _ => None,
        }
    }
}

/// Whether the API server serves `plural` in `group_version`; a group it
/// does not serve at all answers 404, which is a no.
pub async fn is_served(
    client: &Client,
    group_version: &str,
    plural: &str,
) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(e) if super::apply::not_found(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the API server serves `plural` in `group_version`: asked until
/// it answers (a group it does not serve at all answers 404).
pub async fn served_eventually(client: &Client, group_version: &str, plural: &str) -> bool {
    loop {
        match is_served(client, group_version, plural).await {
            Ok(served) => return served,
            Err(e) => {
                tracing::warn!(error = %e, group_version, plural, "asking whether the API server serves a kind; again in 5 s");
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    }
}

/// `make()`'s stream, started only once `kind` is served: until then the
/// kind is looked for every [`OPTIONAL_RECHECK`], `served` says no (so the
/// reconciles go on without it) and the log says so once at INFO. A watch
/// started on a kind that is not served would fail its initial list over
/// and over, and a controller waiting for its store would never
/// reconcile.
pub fn once_served<S, F>(
    client: Client,
    kind: OptionalKind,
    served: Served,
    make: F,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
    F: FnOnce() -> S + Send + 'static,
{
    let ready = async move {
        let mut said = false;
        let mut unconfirmed = false;
        loop {
            match is_served(&client, &kind.group_version, &kind.plural).await {
                Ok(true) => {
                    if said {
                        tracing::info!(group_version = %kind.group_version, kind = %kind.plural, "now served: watched from here on");
                    }
                    served.set(SERVED_YES);
                    break;
                }
                // Discovery can answer 404 for a moment (an API server
                // whose CRD handlers are still syncing); reconciling as if
                // the kind did not exist would drop what its objects
                // render. A no is believed when asked again says the same.
                Ok(false) if served.served().is_none() && !unconfirmed => {
                    unconfirmed = true;
                    tokio::time::sleep(NOT_SERVED_CONFIRM).await;
                    continue;
                }
                Ok(false) => {
                    served.set(SERVED_NO);
                    if !said {
                        said = true;
                        tracing::info!(group_version = %kind.group_version, kind = %kind.plural, meanwhile = kind.meanwhile, "not served; looked for every 10 s and watched once installed");
                    }
                }
                Err(e) => {
                    tracing::warn!(group_version = %kind.group_version, kind = %kind.plural, error = %e, "asking whether the API server serves a kind; again in 10 s");
                }
            }
            tokio::time::sleep(OPTIONAL_RECHECK).await;
        }
        make()
    };
    futures::stream::once(ready).flatten()
}

/// A reflector over a kind that may not be served: empty, and ready to
/// read, while it is not; the watch starts once it is.
#[derive(Clone)]
pub struct OptionalStore<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    served: Served,
}

impl<K> OptionalStore<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Known not to be served (nothing to read), or served and listed.
    pub fn ready(&self) -> bool {
        match self.served.served() {
            Some(false) => true,
            Some(true) => matches!(
                futures::FutureExt::now_or_never(self.store.wait_until_ready()),
                Some(Ok(()))
            ),
            None => false,
        }
    }

    pub fn served(&self) -> Option<bool> {
        self.served.served()
    }
}

/// [`cached`] for a kind that may not be served; see [`once_served`].
pub fn cached_optional<K>(
    client: &Client,
    api: Api<K>,
    kind: OptionalKind,
    config: watcher::Config,
) -> (
    OptionalStore<K>,
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
    let served = Served::default();
    let (store, stream) = cached(api, config);
    let stream = once_served(client.clone(), kind, served.clone(), move || stream);
    (OptionalStore { store, served }, stream)
}
