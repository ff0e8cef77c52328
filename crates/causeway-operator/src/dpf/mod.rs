//! The DPF to HyperShift bridge: a `DPFHCPProvisioner` becomes a HyperShift
//! HostedCluster and NodePool for a DPF DPUCluster, with MetalLB in front
//! of its API server and its kubeconfig handed to the DPUCluster.
//!
//! Same shape as the Infra controller: [`spec`] checks the object, [`render`]
//! and [`status`] are pure, and [`controller`] observes, applies by
//! server-side apply under one field manager, and writes status by apply.

pub mod approver;
pub mod bfcfg;
pub mod bluefield;
mod context;
pub mod controller;
pub mod crd;
pub mod csr;
pub mod events;
mod execute;
#[cfg(any(test, feature = "test-support"))]
pub mod forged_csr;
pub(crate) mod hosted_access;
pub mod ignition;
pub mod kubelet_cert;
mod observe;
mod plan;
pub mod render;
pub mod service_templates;
pub mod spec;
pub mod status;
mod teardown;
