//! Policy routing for the VLAN interfaces: one routing table per interface
//! with its on-link and default routes, and a rule sending traffic from the
//! interface's address to that table, so a reply leaves through the
//! interface its request came in on.
//!
//! [`plan`] decides, without I/O; [`netlink`] reads and writes the kernel;
//! [`reconcile`] applies a plan and keeps it true as links change;
//! [`metrics`] counts what the reconciles did.
//!
//! It is not a network manager: it adds no addresses and brings no link up
//! (Multus or the host does), and it never touches a route or rule it did
//! not install (those carry its protocol number, [`plan::PROTOCOL`]).

pub mod advertiser;
pub mod floating;
mod garp;
pub mod metrics;
pub mod na;
pub mod netlink;
pub mod plan;
pub mod ra;
pub mod reconcile;

pub use advertiser::{AdvertError, AdvertMetrics, RouterAdvertiser};
pub use floating::{FloatingAddresses, FloatingError};
pub use metrics::RouteMetrics;
pub use reconcile::{PolicyRouting, Reconciler, Report, RouteError, Status};
