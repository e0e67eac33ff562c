//! The in-pod Berth agent: the `berth.agent.v1.Agent` gRPC service (`server.rs`), its
//! authentication and authorization through TokenReview and SubjectAccessReview (`auth.rs`),
//! the client the operator uses (`client.rs`), and the workspace's activity for idle culling
//! (`activity.rs`).

pub mod activity;
pub mod auth;
pub mod client;
pub mod content;
pub mod git;
#[cfg(feature = "sim")]
pub mod git_server;
pub mod server;
pub mod shell;
#[cfg(feature = "sim")]
pub mod sim_runtime;
pub mod ssh;
pub mod supervisor;

/// The generated protobuf and gRPC code.
pub mod proto {
    tonic::include_proto!("berth.agent.v1");
}

/// The audience the operator's tokens for agents carry, followed by `/<namespace>`.
pub const AUDIENCE: &str = "berth-agent";

/// The audience of the operator's tokens for the agents in `namespace`: a token captured in
/// one namespace opens no agent in another.
pub fn audience(namespace: &str) -> String {
    format!("{AUDIENCE}/{namespace}")
}
pub use berth_api::agent::{ACTIVITY_PORTS_ENV, DEFAULT_PORT, TLS_CERT_ENV, TLS_KEY_ENV};
/// The name an agent's TLS certificate must carry; the operator verifies it, not the pod IP.
pub const TLS_SERVER_NAME: &str = "berth-agent";
/// Metadata of an `Unauthenticated` answer when the token itself was rejected (expired, wrong
/// audience, its service account deleted), so the caller knows a new token may help.
pub const TOKEN_REJECTED: &str = "berth-token-rejected";
/// Metadata of an `Unavailable` answer the agent itself gave (a review API did not answer),
/// as opposed to a transport failure, which tonic also reports as `Unavailable`.
pub const REVIEW_UNAVAILABLE: &str = "berth-review-unavailable";

/// Parses a comma-separated list of ports; empty items are skipped.
pub fn parse_ports(text: &str) -> Result<Vec<u16>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{p:?} is not a port (1 to 65535)"))
        })
        .collect()
}
