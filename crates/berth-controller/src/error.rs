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
        if let Some(e) = self.request() {
            return kube_reason(e);
        }
        match self {
            Error::Kube(e) => kube_reason(e),
            Error::Finalizer(_) => "Finalizer",
            Error::LeaderElection(_) => "LeaderElection",
            Error::Serve(_) => "Serve",
            Error::Serialization(_) => "Serialization",
        }
    }

    /// The API server refused a write made on a stale copy (409): the watch brings the newer
    /// object at once, so this is no failure to back off from.
    pub fn is_conflict(&self) -> bool {
        matches!(self.request(), Some(kube::Error::Api(s)) if s.code == 409)
    }

    /// The failed request to the API server, also one that added or removed the finalizer.
    fn request(&self) -> Option<&kube::Error> {
        use kube::runtime::finalizer::Error as FinalizerError;
        match self {
            Error::Kube(e) => Some(e),
            Error::Finalizer(e) => match &**e {
                FinalizerError::AddFinalizer(e) | FinalizerError::RemoveFinalizer(e) => Some(e),
                _ => None,
            },
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::finalizer::Error as FinalizerError;

    fn refused(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", "")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_refused_finalizer_write_has_the_api_servers_reason() {
        let conflict = Error::Finalizer(Box::new(FinalizerError::AddFinalizer(refused(409))));
        assert_eq!(conflict.reason(), "Conflict");
        assert!(conflict.is_conflict(), "a stale copy is no failure");
        let forbidden = Error::Finalizer(Box::new(FinalizerError::RemoveFinalizer(refused(403))));
        assert_eq!(forbidden.reason(), "Forbidden");
        assert!(!forbidden.is_conflict());
        assert_eq!(Error::from(refused(503)).reason(), "ApiUnavailable");
        assert!(Error::from(refused(409)).is_conflict());
    }
}
