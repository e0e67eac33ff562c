//! The in-pod Berth agent: the `berth.agent.v1.Agent` gRPC service (`server.rs`), its
//! authentication and authorization through TokenReview and SubjectAccessReview (`auth.rs`),
//! and the client the operator uses (`client.rs`).

pub mod auth;
pub mod client;
pub mod server;
#[cfg(feature = "sim")]
pub mod sim_runtime;
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
/// The port the agent serves on.
pub const DEFAULT_PORT: u16 = 50051;
/// The name an agent's TLS certificate must carry; the operator verifies it, not the pod IP.
pub const TLS_SERVER_NAME: &str = "berth-agent";
/// Metadata of an `Unauthenticated` answer when the token itself was rejected (expired, wrong
/// audience, its service account deleted), so the caller knows a new token may help.
pub const TOKEN_REJECTED: &str = "berth-token-rejected";
/// Metadata of an `Unavailable` answer the agent itself gave (a review API did not answer),
/// as opposed to a transport failure, which tonic also reports as `Unavailable`.
pub const REVIEW_UNAVAILABLE: &str = "berth-review-unavailable";
/// The variables naming the agent's TLS certificate and key files (both, or neither).
pub const TLS_CERT_ENV: &str = "BERTH_AGENT_TLS_CERT";
pub const TLS_KEY_ENV: &str = "BERTH_AGENT_TLS_KEY";
