//! The L4 proxy's pure parts: reading the server name from a TLS
//! ClientHello without terminating TLS, and choosing a route by port and
//! name. The listeners and the relay come next; this crate holds no
//! sockets yet.

pub mod hello;
pub mod route;
