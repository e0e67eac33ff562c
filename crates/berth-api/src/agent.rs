//! The operator's words to a workspace's agent: the variables it sets on the agent's
//! container, and the content it asks the agent to clone. Both sides read them from here, so
//! the operator's pure core needs nothing of the agent.

use serde::{Deserialize, Serialize};

/// The port the agent serves on.
pub const DEFAULT_PORT: u16 = 50051;
/// The variables naming the agent's TLS certificate and key files (both, or neither).
pub const TLS_CERT_ENV: &str = "BERTH_AGENT_TLS_CERT";
pub const TLS_KEY_ENV: &str = "BERTH_AGENT_TLS_KEY";
/// The variable naming the workspace's declared ports (comma-separated), whose connections
/// are activity.
pub const ACTIVITY_PORTS_ENV: &str = "BERTH_AGENT_ACTIVITY_PORTS";
/// The variable carrying the content to clone (a [`ContentSpec`] as JSON).
pub const CONTENT_ENV: &str = "BERTH_CONTENT";
/// The variable naming where the workspace's home volume is mounted: a shell starts there when
/// the image gives its user no home of its own.
pub const HOME_ENV: &str = "BERTH_HOME";
/// Where the credentials' secret is mounted in the workspace container.
pub const CREDENTIALS_DIR: &str = "/etc/berth/content-auth";

/// What to clone, and where (no secret in it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ContentSpec {
    pub url: String,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Relative to the home volume.
    pub path: String,
    /// Commits of history; None: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Where the home volume is mounted in the container.
    pub home: String,
    /// Whether a credentials secret is mounted at [`CREDENTIALS_DIR`].
    #[serde(default)]
    pub auth: bool,
}
