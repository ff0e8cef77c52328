//! The validating admission webhook for DPFHCPProvisioner and Infra
//! objects, served over TLS (rustls) by every operator replica, leader or
//! not: admission must be answered by whichever pod the Service picks.
//!
//! [`admit`] decides, purely; [`server`] is the HTTPS endpoint and the
//! BlueField lookup it does for new provisioners; [`tls`] reloads the
//! serving certificate when its files change; [`selfsigned`] makes and
//! keeps a CA and certificate when neither OpenShift's service CA nor
//! cert-manager provides one.

pub mod admit;
pub mod selfsigned;
pub mod server;
pub mod tls;
