//! The causeway operator: the Kubernetes controllers that put causeway on a
//! hosted cluster's VLAN and bridge DPF DPU clusters to HyperShift.
//!
//! - [`infra`]: an `Infra` object becomes the DHCP, DNS and proxy pods.
//! - [`dpf`]: a `DPFHCPProvisioner` becomes a HostedCluster for a DPF
//!   DPUCluster, with MetalLB, the kubeconfig hand-off and the CSR approver.
//! - [`hosted`]: reaching a hosted cluster's API server, for both.
//! - [`webhook`]: the validating admission webhook for both kinds.
//! - [`k8s`]: the Kubernetes plumbing they share, which knows none of them.
//! - [`manager`]: leader election and the controllers' lifecycle.
//! - [`status_metrics`]: the reconciled objects' conditions as metrics.
//! - [`must_gather`]: the support tarball.
//!
//! Each controller observes, renders with pure functions, and applies by
//! server-side apply. Not here: the data plane itself (the DHCP, DNS,
//! proxy and routing crates), the process wiring (the `causeway` binary)
//! and the chart.

#[cfg(test)]
mod child_process;
pub mod dpf;
pub mod error;
pub mod hosted;
pub mod infra;
pub mod k8s;
pub mod manager;
pub mod must_gather;
pub mod registry;
pub mod status_metrics;
pub mod webhook;
