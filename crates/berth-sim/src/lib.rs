//! berth-sim: a Kubernetes API server in one process, with real HTTP(S), real watch semantics,
//! CRDs, RBAC and the controllers that make deletion work, for tests and the no-cluster demo.

mod admission_policies;
mod apply;
mod apps;
mod auth;
mod batch;
mod builtin;
mod cel_optional;
mod certificates;
mod cluster;
mod config;
mod containers;
mod crd;
mod discovery;
mod endpoints;
mod error;
mod events;
mod faults;
mod gc;
mod json;
mod kubelet;
mod logs;
pub mod manifests;
mod meta;
mod network_policies;
mod node_ports;
mod node_proxy;
mod nodes;
mod openapi;
mod openapi_proto;
mod patch;
mod pod_security;
mod pods;
mod ports;
mod process;
mod protobuf;
mod proxy;
mod quantity;
mod quota;
mod recorder;
mod requests;
mod resources;
mod runtime;
mod scale;
mod scheduler;
mod schema;
mod selector;
mod server;
mod service_account;
mod sim;
mod store;
mod streams;
mod table;
mod tls;
mod typed;
mod volumes;
mod watch;
mod webhooks;
mod workloads;

pub use cluster::{ClientError, SimCluster, StartError};
pub use error::{ApiError, Cause};

/// The real API server's rules for names, labels, annotations, environment variable names and
/// port names, as the sim enforces them (so what an operator derives can be checked against
/// them in its own tests).
pub mod validation {
    pub use crate::builtin::{
        TOTAL_ANNOTATION_SIZE_LIMIT, check_env_var_name, check_label as check_dns1123_label,
        check_label_value, check_port_name, check_qualified_name, check_subdomain,
    };

    /// A DNS-1035 label (Service names).
    pub fn check_dns1035_label(field: &str, value: &str) -> Option<crate::Cause> {
        crate::builtin::check_dns1035(field, value)
    }
}
pub use config::{Backoff, NodeConfig, PodTermination, SimConfig, Timings};
pub use faults::{ApiFault, Faults, Frequency, RequestMatch};
pub use ports::free_port;
pub use process::ProcessRuntime;
pub use requests::{RequestCount, RequestKey};
pub use runtime::{
    AttachedInput, BoxFuture, ContainerContext, ContainerLog, ContainerRuntime, ExecRequest,
    ExecSession, IdleRuntime, LogLine, Reader, RunningContainer, SharedRuntime, VolumeMount,
    VolumeSource, Writer,
};
pub use tls::{Authority, TlsError};
