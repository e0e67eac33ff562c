//! berth-sim: a Kubernetes API server in one process, with real HTTP(S), real watch semantics,
//! CRDs, RBAC and the controllers that make deletion work, for tests and the no-cluster demo.

mod apply;
mod auth;
mod builtin;
mod cluster;
mod discovery;
mod error;
mod events;
mod faults;
mod gc;
mod kubelet;
pub mod manifests;
mod nodes;
mod openapi;
mod patch;
mod protobuf;
mod quantity;
mod recorder;
mod requests;
mod resources;
mod runtime;
mod scheduler;
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
pub use faults::{ApiFault, Faults, Frequency, RequestMatch};
pub use nodes::{Backoff, NodeConfig, Timings};
pub use requests::{RequestCount, RequestKey};
pub use runtime::{
    BoxFuture, ContainerContext, ContainerRuntime, IdleRuntime, RunningContainer, SharedRuntime,
};
pub use sim::{PodTermination, SimConfig};
pub use tls::{Authority, TlsError};
