//! The Infra controller: an `Infra` object becomes causeway pods on the
//! hosted cluster's VLAN. It observes ([`observe`]), turns the spec into a
//! [`plan`] ([`validate`]), renders the plan as a pure function
//! ([`render`], [`status`]), and applies through [`crate::k8s::apply`]
//! ([`controller`], one component at a time in [`components`]). [`hosted`] makes Infras for annotated HostedClusters;
//! [`pod_monitors`] says whether they get PodMonitors.

pub mod apps_ingress;
pub mod attachment;
pub mod attachments;
pub mod components;
pub mod context;
pub mod controller;
pub mod crd;
pub mod hosted;
pub mod network;
pub mod observe;
pub mod plan;
pub mod pod_monitors;
pub mod render;
pub mod status;
pub mod validate;
