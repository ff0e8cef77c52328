//! The operator library's integration suites that need no API server: the
//! CRDs it prints, the objects it renders for Infra specs, and its OCI
//! registry client against a real registry (`docker-registry`) on
//! loopback.
//!
//! One test binary for every suite: each suite is a module under its old
//! binary's name, so `cargo test -p causeway-operator --test offline render::`
//! runs what the `render` binary used to.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod registry;

mod bluefield_registry;
mod crd;
mod release_payload_registry;
mod render;
