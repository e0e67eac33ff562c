//! The in-pod Berth agent: the `berth.agent.v1.Agent` gRPC service (`server.rs`), its
//! authentication and authorization through TokenReview and SubjectAccessReview (`auth.rs`),
//! and the client the operator uses (`client.rs`).

pub mod auth;
pub mod client;
pub mod server;
pub mod sim_runtime;
pub mod supervisor;

/// The generated protobuf and gRPC code.
pub mod proto {
    tonic::include_proto!("berth.agent.v1");
}

/// The audience the operator's tokens carry for the agent.
pub const AUDIENCE: &str = "berth-agent";
/// The port the agent serves on.
pub const DEFAULT_PORT: u16 = 50051;
