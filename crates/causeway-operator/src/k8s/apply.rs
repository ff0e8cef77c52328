//! The one way the controllers write objects: server-side apply under one
//! field manager, only when the live object differs from the desired one
//! ([`drift`](super::drift)), each write counted. Also how API errors are
//! told apart (gone, not installed, refused for good).

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, NamespaceResourceScope};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::drift;
use super::index::{Index, Owned};
use super::metrics::OperatorMetrics;
use super::MANAGER;
use crate::error::Error;

/// Server-side apply as the operator's field manager, taking over fields
/// another manager set.
pub fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// The same under another field manager (the CSR approver's own).
pub fn apply_params_as(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force()
}

/// A 404: the object, or its whole API, is not there.
pub fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether an API error will come out the same however often it is
/// retried: refused, invalid, or a request the server cannot serve.
pub fn permanent(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 405 | 422))
}

/// An API error as a condition message: a 404 on the whole resource means
/// its CRD is not installed.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => "the API is not installed (no CRD)".into(),
        other => other.to_string(),
    }
}

/// The object, or `None` when it or its whole API (a CRD not installed)
/// is absent: either way there is nothing of that name.
pub async fn get_present(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<DynamicObject>, Error> {
    match api.get_opt(name).await {
        Ok(found) => Ok(found),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether a list of `resource` answers at all: a 404 means its CRD is not
/// installed.
pub async fn installed(client: &Client, ns: &str, resource: &ApiResource) -> Result<bool, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(e) if not_found(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How loudly each applied object is logged. The Infra controller applies
/// many objects per Infra and logs them at debug; the DPF bridge applies
/// a few foreign ones and logs them at info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noise {
    Debug,
    Info,
}

/// What a status write does when the object is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMissing {
    /// The object was deleted under the reconcile: nothing left to write.
    Skip,
    /// A 404 is an error, retried.
    Fail,
}

/// The writer every controller applies through.
#[derive(Clone)]
pub struct Applier {
    pub client: Client,
    pub metrics: Option<OperatorMetrics>,
    pub noise: Noise,
}

impl Applier {
    pub fn new(client: Client, metrics: Option<OperatorMetrics>, noise: Noise) -> Self {
        Applier {
            client,
            metrics,
            noise,
        }
    }

    /// Counts one write of `kind` (apply, delete, apply-status).
    fn counted(&self, kind: &str, verb: &str) {
        if let Some(m) = &self.metrics {
            m.write(kind, verb);
        }
    }

    fn log_applied(&self, kind: &str, ns: &str, name: &str) {
        match self.noise {
            Noise::Debug => tracing::debug!(%kind, namespace = %ns, %name, "applied"),
            Noise::Info => tracing::info!(%kind, namespace = %ns, %name, "applied"),
        }
    }

    /// Applies `desired` unless the index shows the object is already it;
    /// an object the index cannot vouch for is read once and compared.
    pub async fn ensure_indexed<K>(&self, index: &Index, desired: K) -> Result<(), Error>
    where
        K: Owned
            + Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        self.ensure_in(index, &api, &K::kind(&()), desired).await
    }

    /// [`Applier::ensure_indexed`] for a kind chosen at run time.
    pub async fn ensure_indexed_dynamic(
        &self,
        index: &Index,
        resource: &ApiResource,
        desired: DynamicObject,
    ) -> Result<(), Error> {
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, resource);
        self.ensure_in(index, &api, &resource.kind, desired).await
    }

    async fn ensure_in<K>(
        &self,
        index: &Index,
        api: &Api<K>,
        kind: &str,
        mut desired: K,
    ) -> Result<(), Error>
    where
        K: Owned + Clone + DeserializeOwned + std::fmt::Debug,
    {
        drift::stamp(&mut desired);
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let name = desired.meta().name.clone().unwrap_or_default();
        let wanted = drift::desired_hash(&desired);
        if index.is_current(&ns, &name, &wanted) {
            return Ok(());
        }
        let must_apply = match index.get(&ns, &name) {
            None => true,
            Some(seen) if seen.desired.as_deref() != Some(wanted.as_str()) => true,
            // Changed since last verified, by someone: look before writing.
            Some(_) => match api.get_opt(&name).await? {
                None => true,
                Some(live) if drift::needs_apply(&desired, Some(&live)) => true,
                Some(live) => {
                    index.verified(&live, &wanted);
                    false
                }
            },
        };
        if !must_apply {
            return Ok(());
        }
        let applied = api
            .patch(&name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        index.verified(&applied, &wanted);
        self.counted(kind, "apply");
        self.log_applied(kind, &ns, &name);
        Ok(())
    }

    /// Creates `obj` unless an object of its name exists, which is left
    /// exactly as it is (a key that must never change once made). Needs
    /// only `create`: an existing object answers 409, so nothing is read.
    /// `true` when it created.
    pub async fn create_absent<K>(&self, obj: &K) -> Result<bool, Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Serialize
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let ns = obj.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let params = PostParams {
            field_manager: Some(MANAGER.into()),
            ..PostParams::default()
        };
        match api.create(&params, obj).await {
            Ok(_) => {
                let kind = K::kind(&());
                self.counted(&kind, "create");
                self.log_applied(&kind, &ns, &obj.meta().name.clone().unwrap_or_default());
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Applies `desired` unless the live object, read now, already is it:
    /// for objects no watch of ours vouches for.
    pub async fn ensure_live<K>(&self, mut desired: K) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + Serialize
            + DeserializeOwned
            + std::fmt::Debug,
    {
        drift::stamp(&mut desired);
        let ns = desired.meta().namespace.clone().ok_or(Error::NoNamespace)?;
        let name = desired.meta().name.clone().unwrap_or_default();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let current = api.get_opt(&name).await?;
        if !drift::needs_apply(&desired, current.as_ref()) {
            return Ok(());
        }
        api.patch(&name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        let kind = K::kind(&());
        self.counted(&kind, "apply");
        self.log_applied(&kind, &ns, &name);
        Ok(())
    }

    /// Applies a rendered object of a foreign kind unless `live` (read by
    /// the caller) already is it. Returns the object as it now is.
    pub async fn ensure_dynamic(
        &self,
        resource: &ApiResource,
        mut desired: DynamicObject,
        live: Option<DynamicObject>,
    ) -> Result<DynamicObject, Error> {
        drift::stamp(&mut desired);
        if let Some(live) = live {
            if !drift::needs_apply(&desired, Some(&live)) {
                return Ok(live);
            }
        }
        let ns = desired.namespace().unwrap_or_default();
        let name = desired.name_any();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, resource);
        let applied = api
            .patch(&name, &apply_params(), &Patch::Apply(&desired))
            .await?;
        self.counted(&resource.kind, "apply");
        self.log_applied(&resource.kind, &ns, &name);
        Ok(applied)
    }

    /// Deletes an object of ours the index still shows, its dependents
    /// (a workload's pods) first: it stays, being deleted, until they are
    /// gone, and the index shows it until then. Asked once.
    pub async fn remove_foreground<K>(
        &self,
        index: &Index,
        ns: &str,
        name: &str,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        match index.get(ns, name) {
            Some(seen) if !seen.deleting => {}
            _ => return Ok(()),
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::foreground()).await {
            Ok(_) => {
                let kind = K::kind(&());
                self.counted(&kind, "delete");
                tracing::info!(%kind, namespace = %ns, %name, "deleting, its pods first: it is replaced");
                Ok(())
            }
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// [`Applier::remove`] for a kind chosen at run time.
    pub async fn remove_dynamic(
        &self,
        index: &Index,
        resource: &ApiResource,
        ns: &str,
        name: &str,
    ) -> Result<(), Error> {
        if index.get(ns, name).is_none() {
            return Ok(());
        }
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, resource);
        if self.gone_from(&api, &resource.kind, name).await? {
            return Ok(());
        }
        tracing::info!(kind = %resource.kind, namespace = %ns, %name, "deleted: no longer rendered");
        Ok(())
    }

    /// Deletes an object of ours whether or not an index shows it (a kind
    /// the operator may create and delete but not read).
    pub async fn remove_unindexed<K>(&self, ns: &str, name: &str) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        if !self.gone_from(&api, &K::kind(&()), name).await? {
            tracing::info!(kind = %K::kind(&()), namespace = %ns, %name, "deleted: no longer rendered");
        }
        Ok(())
    }

    /// Deletes an object of ours the index still shows.
    pub async fn remove<K>(&self, index: &Index, ns: &str, name: &str) -> Result<(), Error>
    where
        K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        if index.get(ns, name).is_none() {
            return Ok(());
        }
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        if self.gone_from(&api, &K::kind(&()), name).await? {
            return Ok(());
        }
        tracing::info!(kind = %K::kind(&()), namespace = %ns, %name, "deleted: no longer rendered");
        Ok(())
    }

    /// Deletes an object unless it is gone; `true` once it is gone.
    pub async fn gone_from<K>(&self, api: &Api<K>, kind: &str, name: &str) -> Result<bool, Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                self.counted(kind, "delete");
                Ok(false)
            }
            Err(e) if not_found(&e) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Applies `written` to the status of `name` when `next` differs from
    /// `previous`; `true` when it wrote. `written` is `next` less the parts
    /// another field manager owns.
    pub async fn apply_status<K, S>(
        &self,
        api: &Api<K>,
        name: &str,
        previous: &S,
        next: &S,
        written: &S,
        on_missing: OnMissing,
    ) -> Result<bool, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
        S: PartialEq + Serialize,
    {
        if next == previous {
            return Ok(false);
        }
        let body = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": written,
        });
        match api
            .patch_status(name, &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => {}
            Err(e) if not_found(&e) && on_missing == OnMissing::Skip => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        self.counted(&K::kind(&()), "apply-status");
        Ok(true)
    }

    /// Applies `body` as `name` without comparing first: for a write the
    /// caller has decided on (an object rendered afresh, a foreign kind's
    /// object).
    pub async fn apply_as<K, B>(
        &self,
        api: &Api<K>,
        kind: &str,
        name: &str,
        body: &B,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        B: Serialize + std::fmt::Debug,
    {
        let written = api
            .patch(name, &apply_params(), &Patch::Apply(body))
            .await?;
        self.counted(kind, "apply");
        Ok(written)
    }

    /// A patch that is not an apply: a merge patch of one field of an
    /// object another controller owns, or a JSON patch that removes
    /// fields.
    pub async fn patch<K, P>(
        &self,
        api: &Api<K>,
        kind: &str,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        P: Serialize + std::fmt::Debug,
    {
        let written = api.patch(name, params, patch).await?;
        self.counted(kind, "patch");
        Ok(written)
    }

    /// A merge patch of an object's `/status`, for the parts a server-side
    /// apply cannot express: a record merged with what another writer
    /// wrote (guarded by the resourceVersion in `patch`), or fields
    /// cleared with null.
    pub async fn patch_status<K, P>(
        &self,
        api: &Api<K>,
        kind: &str,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, kube::Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        P: Serialize + std::fmt::Debug,
    {
        let written = api.patch_status(name, params, patch).await?;
        self.counted(kind, "patch-status");
        Ok(written)
    }

    /// Creates `object` unless one of its name exists (made once, never
    /// replaced: a generated key); `true` when this call created it.
    pub async fn create_if_absent<K>(&self, api: &Api<K>, object: &K) -> Result<bool, kube::Error>
    where
        K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
    {
        match api.create(&PostParams::default(), object).await {
            Ok(_) => {
                self.counted(&K::kind(&()), "create");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_4xx_refusals_are_permanent() {
        let api =
            |code| kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed());
        assert!(permanent(&api(403)));
        assert!(permanent(&api(422)));
        assert!(!permanent(&api(409)));
        assert!(!permanent(&api(429)));
        assert!(!permanent(&api(500)));
    }
}
