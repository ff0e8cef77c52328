//! What can stop the proxy from starting or a reload from applying.

use std::net::SocketAddr;

use crate::route::RouteError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy listen on {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
    #[error("proxy routes on {addr}: {source}")]
    Routes {
        addr: SocketAddr,
        source: RouteError,
    },
}
