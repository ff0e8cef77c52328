//! The one way the operator connects to the Kubernetes API. The client
//! speaks TLS through rustls, which needs a process-level crypto provider;
//! rustls picks one by itself only when exactly one provider feature is
//! compiled in, so it is installed here, explicitly, before any client is
//! built. Without it the first request panics.

use kube::Client;

/// Installs ring as the process's rustls provider. Idempotent: a provider
/// already installed (by an earlier call or by a test) is kept.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client from the in-cluster config or `KUBECONFIG`, with the TLS
/// provider in place.
pub async fn connect() -> Result<Client, kube::Error> {
    install_tls_provider();
    Client::try_default().await
}
