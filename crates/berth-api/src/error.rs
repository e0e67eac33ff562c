//! The one error type of `berth-api`.

/// What can go wrong in this crate: reading a spec value or producing the CRD.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A duration string does not follow the Kubernetes form (`30s`, `10m`, `1h30m`).
    #[error("invalid duration {input:?}: {problem}")]
    InvalidDuration { input: String, problem: String },
    /// The CRD could not be rendered as YAML.
    #[error("cannot render the CRD as YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

impl Error {
    /// A stable, CamelCase reason for metrics labels and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidDuration { .. } => "InvalidDuration",
            Error::Yaml(_) => "CrdRender",
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
