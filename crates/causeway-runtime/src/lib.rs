//! Runtime plumbing every causeway service shares: the admin HTTP server
//! (`/metrics`, `/healthz`, `/readyz` and service JSON endpoints),
//! readiness, tracing setup, graceful shutdown, config reload triggers, and
//! which CPUs the process may use (for sockets steered one per core), and
//! the blocking UDP endpoint the DNS and DHCP servers read in batches.
//!
//! It is not for protocol logic or config: it holds no protocol code and
//! no config schema; services plug into it.

pub mod admin;
pub mod clock;
pub mod cpus;
pub mod endpoint;
pub mod fds;
pub mod ha;
pub mod link;
pub mod listen;
pub mod readiness;
pub mod reload;
pub mod resources;
pub mod service;
pub mod shutdown;
pub mod telemetry;

pub use readiness::{Readiness, ReadyHandle};
pub use service::Service;
pub use shutdown::{signals, Shutdown, StopSignals};
