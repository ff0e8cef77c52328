//! The hosted cluster as both controllers see it, beneath `infra/` and
//! `dpf/`: [`access`] reaches its API server (the admin client from
//! HyperShift's admin kubeconfig, an identity of causeway's own with a
//! short-lived token), [`facts`] reads what a HostedCluster object says.
//! It imports only `k8s/`.

pub mod access;
pub mod facts;

pub use access::HostedEndpoint;
pub(crate) use access::{admin_client, HostedIdentity, Unavailable};
