//! Policy routing for the VLAN interfaces: one routing table per interface
//! with its on-link and default routes, and a rule sending traffic from the
//! interface's address to that table, so a reply leaves through the
//! interface its request came in on.
//!
//! [`plan`] decides, without I/O; [`netlink`] reads and writes the kernel;
//! [`reconcile`] applies a plan and keeps it true as links change.

pub mod netlink;
pub mod plan;
pub mod reconcile;

pub use reconcile::{PolicyRouting, Reconciler, Report, RouteError, RouteMetrics, Status};
