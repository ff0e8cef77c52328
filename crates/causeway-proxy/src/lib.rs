//! The L4 proxy: TCP listeners by port, forwarding each connection to one
//! upstream or choosing it by the TLS server name, which it reads from the
//! ClientHello without terminating TLS.
//!
//! [`hello`], [`route`] and the ordering in [`balance`] are pure; [`server`]
//! owns the sockets.
//!
//! It is not an HTTP or TLS proxy: it never terminates TLS, reads nothing
//! past the ClientHello and rewrites no bytes (beyond an optional PROXY
//! protocol header). It does not parse config files; it takes
//! [`causeway_config::ProxyConfig`].

mod admission;
pub mod balance;
mod connection;
mod error;
mod health;
pub mod hello;
mod listener;
pub mod metrics;
mod port;
pub mod proxy_protocol;
pub mod relay;
pub mod resolve;
pub mod route;
pub mod server;
mod state;
mod upstream;

pub use admission::connection_cap;
pub use error::ProxyError;
pub use metrics::ProxyMetrics;
pub use server::ProxyServer;
