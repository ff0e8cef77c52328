//! The loopback tier: the real binaries and real clients on 127.0.0.0/8 high
//! ports and temporary directories. No network namespaces and no control
//! plane; the few tests that need root (a client in a network namespace of
//! their own) SKIP loudly without it.
//!
//! One test binary for every suite of the tier: each suite is a module
//! under its old binary's name, so `cargo test --test loopback dns_e2e::`
//! runs what the `dns_e2e` binary used to.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod appliance_loopback;
mod cli;
mod dhcp_clock;
mod dhcp_names;
mod dns_e2e;
mod fd_budget;
mod module_cycles;
mod proxy_loopback;
mod soak;
