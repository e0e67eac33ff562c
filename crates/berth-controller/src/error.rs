//! The one error type of the operator, with a stable reason per variant for metrics labels
//! and Warning events.

/// What can go wrong while reconciling a workspace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("Kubernetes API: {}", api_words(.0))]
    Kube(#[source] Box<kube::Error>),
    /// The finalizer helper failed to add or remove the finalizer, or cleanup failed.
    #[error("{}", finalizer_words(.0))]
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
        if self.is_conflict() {
            return "Conflict";
        }
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

    /// The API server refused a write made on a stale copy: a 409, or the failed `test` of the
    /// finalizer helper's JSON patch (a 422: it tests the finalizers the cache's copy has,
    /// and another trigger of the same workspace can run before the watch brings the
    /// finalizer just added). The watch brings the newer object at once, so this is no
    /// failure to back off from.
    pub fn is_conflict(&self) -> bool {
        match self.request() {
            Some(kube::Error::Api(s)) => {
                s.code == 409 || (s.code == 422 && matches!(self, Error::Finalizer(_)))
            }
            _ => false,
        }
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

/// What the API server said, in its own words: kube's display of a refusal adds the whole
/// `Status` as debug output, which is no sentence for a person.
fn api_words(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        kube::Error::Api(status) => format!("{} ({})", status.reason, status.code),
        other => other.to_string(),
    }
}

fn finalizer_words(error: &kube::runtime::finalizer::Error<Error>) -> String {
    use kube::runtime::finalizer::Error as FinalizerError;
    match error {
        FinalizerError::AddFinalizer(e) => format!("adding the finalizer: {}", api_words(e)),
        FinalizerError::RemoveFinalizer(e) => format!("removing the finalizer: {}", api_words(e)),
        FinalizerError::ApplyFailed(e) | FinalizerError::CleanupFailed(e) => e.to_string(),
        other => format!("finalizer: {other}"),
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

    /// kube's finalizer helper tests the finalizers of the cache's copy; when the copy is
    /// behind, the API server answers 422 for the failed test. That is a stale copy, retried
    /// at once and quietly, not a ReconcileFailed with a backoff.
    #[test]
    fn a_failed_finalizer_test_is_a_stale_copy_not_a_failure() {
        let stale = Error::Finalizer(Box::new(FinalizerError::AddFinalizer(refused(422))));
        assert!(stale.is_conflict());
        assert_eq!(stale.reason(), "Conflict");
        let stale = Error::Finalizer(Box::new(FinalizerError::RemoveFinalizer(refused(422))));
        assert!(stale.is_conflict());
        // A 422 of any other write is the API refusing what was written.
        assert!(!Error::from(refused(422)).is_conflict());
    }

    /// A person reads these in events and the status: the API server's words, not a dump.
    #[test]
    fn a_refusal_is_said_in_the_api_servers_words() {
        let refusal = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Invalid")
                    .with_code(code)
                    .boxed(),
            )
        };
        let said = Error::Finalizer(Box::new(FinalizerError::AddFinalizer(refusal(
            403,
            "workspaces.berth.dev \"a\" is forbidden: no",
        ))))
        .to_string();
        assert_eq!(
            said,
            "adding the finalizer: workspaces.berth.dev \"a\" is forbidden: no"
        );
        let said = Error::from(refusal(422, "spec.image: Required value")).to_string();
        assert_eq!(said, "Kubernetes API: spec.image: Required value");
        let said = Error::from(refusal(500, "")).to_string();
        assert_eq!(said, "Kubernetes API: Invalid (500)");
    }
}
