//! The L4 proxy: TCP listeners by port, forwarding each connection to one
//! upstream or choosing it by the TLS server name, which it reads from the
//! ClientHello without terminating TLS.
//!
//! [`hello`], [`route`] and the ordering in [`balance`] are pure; [`server`] owns the sockets.

pub mod balance;
mod connection;
mod health;
pub mod hello;
mod listener;
pub mod metrics;
pub mod proxy_protocol;
pub mod relay;
pub mod resolve;
pub mod route;
pub mod server;
mod upstream;

pub use listener::connection_cap;
pub use metrics::ProxyMetrics;
pub use server::{ProxyError, ProxyServer};
