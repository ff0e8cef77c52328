//! The operator's one error type. Every variant has a metric label, so
//! failures are counted by kind.

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the object has no namespace")]
    NoNamespace,
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// A rendered object that is not a Kubernetes object: a defect of the
    /// rendering, counted apart from API failures.
    #[error("rendering: {0}")]
    Render(String),
}

impl Error {
    /// The `error` label of `causeway_operator_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NoNamespace => "no_namespace",
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "invalid",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Finalizer(_) => "finalizer",
            Error::Render(_) => "render",
        }
    }
}
