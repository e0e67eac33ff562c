//! The Berth operator: the reconcile loop (`reconcile.rs`), which reads the cluster and
//! carries out what the pure core (`berth-core`: status and actions, the objects a workspace
//! needs) decides; the handshake with workspace agents (`agent.rs`), events, configuration and
//! metrics.

pub mod admission;
pub mod agent;
pub mod caches;
pub mod config;
pub mod error;
pub mod event_index;
pub mod lanes;
pub mod leader;
pub mod metrics;
pub mod rbac;
pub mod reconcile;
pub mod recorder;
pub mod sharder;
pub mod written;

// The pure core, under the paths the operator has always used.
pub use berth_core::{
    action, cached_pod, content, idle, kinds, ownership, pod, pod_policy, refusal, rejection,
    shard, state, trim,
};
pub use config::{Config, Policy, WarningPolicy};

#[cfg(test)]
mod pod_names_tests;
pub use error::{Error, Result};
pub use reconcile::{run, run_until, run_with_metrics};
