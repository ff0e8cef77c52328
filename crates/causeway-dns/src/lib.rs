//! Split-horizon DNS for causeway.
//!
//! The hosted cluster's names (api, api-int, oauth, ignition, konnectivity,
//! `*.apps`), the VLAN's reverse names, extra records and the names DHCP
//! registers are answered locally, per view (chosen by the client's
//! address). Everything else is forwarded to upstream resolvers and cached.
//!
//! [`authority`], [`handler`], [`message`], [`fastpath`] and [`wire`] are
//! pure: a query and the data in, the answer out. [`server`] owns the
//! sockets.
//!
//! It is not a general DNS server: no zone files, no zone transfers, no
//! DNSSEC signing and no recursion of its own (it forwards). It does not
//! parse config files; it takes [`causeway_config::DnsConfig`].

pub mod authority;
pub mod cache;
mod exchange;
pub mod fastpath;
pub mod forward;
pub mod handler;
pub mod message;
pub mod metrics;
mod outbound;
mod prepared;
mod responder;
pub mod server;
pub mod wire;

pub use authority::{Authority, DynamicNames};
pub use metrics::DnsMetrics;
pub use server::{DnsError, DnsServer};
