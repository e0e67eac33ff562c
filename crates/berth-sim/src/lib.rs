//! berth-sim: a Kubernetes API server in one process, with real HTTP(S), real watch semantics,
//! CRDs, RBAC and the controllers that make deletion work, for tests and the no-cluster demo.

mod apply;
mod auth;
mod builtin;
mod cluster;
mod discovery;
mod error;
mod events;
mod gc;
mod openapi;
mod patch;
mod protobuf;
mod requests;
mod resources;
mod schema;
mod selector;
mod server;
mod sim;
mod store;
mod table;
mod tls;
mod watch;

pub use cluster::{ClientError, SimCluster, StartError};
pub use error::ApiError;
pub use requests::{RequestCount, RequestKey};
pub use sim::{PodTermination, SimConfig};
