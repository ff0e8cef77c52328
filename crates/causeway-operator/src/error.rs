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
    /// Something the controller reads is missing or says what cannot be
    /// done (an unsupported version, a bad overrides ConfigMap).
    #[error("{0}")]
    Input(String),
    /// A container registry could not give what was asked of it.
    #[error("{0}")]
    Registry(String),
}

impl Error {
    /// Every value [`Error::metric_label`] gives.
    pub const METRIC_LABELS: [&'static str; 11] = [
        "conflict",
        "forbidden",
        "not_found",
        "invalid",
        "api",
        "transport",
        "finalizer",
        "render",
        "no_namespace",
        "input",
        "registry",
    ];

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
            Error::Input(_) => "input",
            Error::Registry(_) => "registry",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_documented_metric_label() {
        let api = |code| {
            Error::Kube(kube::Error::Api(
                kube::core::Status::failure("", "").with_code(code).boxed(),
            ))
        };
        let labels: Vec<&str> = [
            api(409),
            api(403),
            api(404),
            api(422),
            api(500),
            Error::Kube(kube::Error::LinesCodecMaxLineLengthExceeded),
            Error::Finalizer("x".into()),
            Error::Render("x".into()),
            Error::NoNamespace,
            Error::Input("x".into()),
            Error::Registry("x".into()),
        ]
        .iter()
        .map(Error::metric_label)
        .collect();
        assert_eq!(labels, Error::METRIC_LABELS);
    }
}
