//! Finalizers. The DPF bridge edits the list itself with a merge patch
//! guarded by the resourceVersion; the Infra controller goes through
//! kube's `finalizer()` helper (a JSON patch with a test), whose errors
//! are mapped here. The two differ on purpose: each keeps the behaviour its
//! tests and users rely on.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::apply::not_found;
use crate::error::Error;

/// How many times an edit is tried when the object changes between the
/// read and the write. Conflicts here are ordinary: right after a
/// provisioner is created, its CSR approver writes its part of status.
const EDIT_ATTEMPTS: usize = 5;

/// Changes the finalizer list of the latest `name`, guarded by its
/// resourceVersion: a concurrent change is a conflict, read again and
/// retried, never a lost write. Read afresh, because the reconcile may
/// itself have written status since the object was read. An object gone
/// is no error.
pub async fn edit<K>(api: &Api<K>, name: &str, edit: impl Fn(&mut Vec<String>)) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut attempt = 1;
    loop {
        let Some(latest) = api.get_opt(name).await? else {
            return Ok(());
        };
        let mut list = latest.finalizers().to_vec();
        let before = list.clone();
        edit(&mut list);
        if list == before {
            return Ok(());
        }
        let patch =
            json!({"metadata": {"finalizers": list, "resourceVersion": latest.resource_version()}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if not_found(&e) => return Ok(()),
            Err(e) if conflict(&e) && attempt < EDIT_ATTEMPTS => attempt += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Adds `finalizer` to `obj` unless it already carries it.
pub async fn add<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if obj.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    edit(api, &obj.name_any(), |list| {
        if !list.iter().any(|f| f == finalizer) {
            list.push(finalizer.into());
        }
    })
    .await
}

/// Removes `finalizer` from `obj`.
pub async fn remove<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    edit(api, &obj.name_any(), |list| list.retain(|f| f != finalizer)).await
}

/// An error of kube's `finalizer()` helper as ours: the reconcile's own
/// error passes through; a failed finalizer write is an API error.
pub fn from_kube(e: kube::runtime::finalizer::Error<Error>) -> Error {
    use kube::runtime::finalizer::Error as Finalizer;
    match e {
        Finalizer::ApplyFailed(e) | Finalizer::CleanupFailed(e) => e,
        Finalizer::AddFinalizer(e) | Finalizer::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Finalizer(other.to_string()),
    }
}
