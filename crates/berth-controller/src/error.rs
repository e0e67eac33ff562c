//! The one error type of the operator, with a stable reason per variant for metrics labels
//! and Warning events.

/// What can go wrong while reconciling a workspace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[source] Box<kube::Error>),
    /// The finalizer helper failed to add or remove the finalizer, or cleanup failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The metrics or health endpoints cannot be served (e.g. the address is in use).
    #[error("{0}")]
    Serve(String),
    /// The leader-election lease could not be used.
    #[error("leader election: {0}")]
    LeaderElection(String),
    /// An object could not be serialized.
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
}

impl From<kube::Error> for Error {
    fn from(error: kube::Error) -> Self {
        Error::Kube(Box::new(error))
    }
}

impl Error {
    /// A stable, CamelCase reason: for a request the API server refused or failed (also while
    /// adding or removing the finalizer), what its answer means.
    pub fn reason(&self) -> &'static str {
        use kube::runtime::finalizer::Error as FinalizerError;
        match self {
            Error::Kube(e) => kube_reason(e),
            Error::Finalizer(e) => match &**e {
                FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e) => {
                    kube_reason(e)
                }
                _ => "Finalizer",
            },
            Error::LeaderElection(_) => "LeaderElection",
            Error::Serve(_) => "Serve",
            Error::Serialization(_) => "Serialization",
        }
    }
}

impl Error {
    /// The API server refused a write made on a stale copy (409): the watch brings the newer
    /// object at once, so this is no failure to back off from.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(e) if matches!(&**e, kube::Error::Api(s) if s.code == 409))
    }
}

fn kube_reason(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) if status.code == 409 => "Conflict",
        kube::Error::Api(status) if status.code == 403 => "Forbidden",
        kube::Error::Api(status) if status.code == 422 => "Invalid",
        kube::Error::Api(status) if status.code >= 500 || status.code == 429 => "ApiUnavailable",
        kube::Error::Api(_) => "ApiError",
        _ => "ApiUnreachable",
    }
}

/// `Result` with the operator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
