//! The kube tier: the real `causeway operator` against a real kube-apiserver
//! and controller-manager (tests/kube/cluster.sh). The suites of this one
//! process share one management cluster with the chart installed, started
//! by the first test that asks for it; a suite that changes what the whole
//! cluster serves (admission webhooks, CRDs it deletes) or needs a cluster
//! without the chart gets one of its own (see `kube_cluster`).
//!
//! One test binary for every suite of the tier: each suite is a module
//! under its old binary's name, so `cargo test --test kube csr_kube::`
//! runs what the `csr_kube` binary used to.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod boot_lab;
mod kube_cluster;
mod monitored;
mod support;

mod apps_ingress_kube;
mod attachment_kube;
mod chart_kube;
mod csr_kube;
mod dpf_kube;
mod dpf_migration_kube;
mod dpu_templates_kube;
mod monitoring_kube;
mod must_gather_kube;
mod oooi_migration_kube;
mod operator_kube;
mod optional_kinds_kube;
mod pod_monitors_kube;
mod webhook_kube;
mod webhook_selfsigned_kube;
