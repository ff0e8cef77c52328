//! The L4 proxy: TCP listeners by port, forwarding each connection to one
//! upstream or choosing it by the TLS server name, which it reads from the
//! ClientHello without terminating TLS.
//!
//! [`hello`], [`route`] and the ordering in [`balance`] are pure; [`server`] owns the sockets.

pub mod balance;
pub mod hello;
pub mod metrics;
pub mod proxy_protocol;
pub mod relay;
pub mod resolve;
pub mod route;
pub mod server;

pub use metrics::ProxyMetrics;
pub use server::{ProxyError, ProxyServer};
