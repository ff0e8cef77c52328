//! Kubernetes plumbing shared by every controller, knowing no type of
//! ours: the [`apply`] writer (indexed, live and dynamic ensure, removal,
//! status writes, API error classes), [`conditions`], [`events`],
//! [`finalizer`]s, [`watch`] scopes and reflectors, the foreign
//! [`resources`], [`metrics`] and who may read them ([`metrics_auth`]),
//! and the [`drift`], [`index`], [`leader`] (on the one [`lease`] writer),
//! [`client`] and [`manifest`] pieces.
//!
//! It imports only the operator's error type and external crates; the
//! Infra controller, the DPF bridge and the webhook import it.

pub mod apply;
pub mod client;
pub mod conditions;
pub mod drift;
pub mod events;
pub mod finalizer;
pub mod index;
pub mod json_limits;
pub mod leader;
pub mod lease;
pub mod manifest;
pub mod metrics;
pub mod metrics_auth;
#[cfg(test)]
pub mod mock_api;
pub mod resources;
pub mod watch;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use crate::error::Error;

/// The field manager of every server-side apply.
pub const MANAGER: &str = "causeway-operator";
/// The label every object the operator makes carries; the child watches
/// select on it, so the stores hold ours and nothing else.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", MANAGER);

/// The object (an Infra, a provisioner) that the rendered objects belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

impl Owner {
    /// The owner of what `obj` makes; an object with no namespace has none.
    pub fn of<K: Resource>(obj: &K) -> Result<Owner, Error> {
        Ok(Owner {
            name: obj.name_any(),
            namespace: obj.namespace().ok_or(Error::NoNamespace)?,
            uid: obj.meta().uid.clone().unwrap_or_default(),
        })
    }

    /// The controller reference an owned object carries.
    pub fn controller_reference(&self, api_version: &str, kind: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}
