//! The lab tier: root, network namespaces and veth pairs the tests create,
//! real DHCP clients, the real kernel's policy routing. Without root each
//! test SKIPs loudly.
//!
//! One test binary for every suite of the tier: each suite is a module
//! under its old binary's name, so `cargo test --test lab ha_lab::` runs
//! what the `ha_lab` binary used to.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod boot_lab;
mod kube_cluster;
mod monitored;
mod support;

mod clusters_lab;
mod dhcp6_lab;
mod dhcp_e2e;
mod dhcp_faults;
mod dhcp_floods;
mod dpu_boot_lab;
mod ha_lab;
mod mission_lab;
mod ra_lab;
mod relay_lab;
mod route_netns;
mod vlan_lab;
