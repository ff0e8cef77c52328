//! The causeway operator: an `Infra` object becomes causeway pods on the
//! hosted cluster's VLAN. It observes, renders as a pure function
//! ([`validate`], then [`render`]), and applies with server-side apply
//! ([`controller`]).

pub mod client;
pub mod controller;
pub mod crd;
pub mod dpf;
pub mod drift;
pub mod error;
pub mod hosted;
pub mod index;
pub mod leader;
pub mod manager;
pub mod manifest;
pub mod render;
pub mod status;
pub mod validate;
pub mod webhook;
