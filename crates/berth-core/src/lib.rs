//! Berth's pure core: given a workspace and what the caches show of its pod, claim, service
//! and events, what its status is and what to do next (`state.rs` and its families), and the
//! objects a workspace needs (`pod.rs`). No client and no I/O: the operator
//! (`berth-controller`) reads the cluster, calls this, and carries the actions out. Its own
//! tests are the guard mutation testing measures (README, "Contributing").

pub mod action;
pub mod cached_pod;
pub mod config;
pub mod content;
pub mod idle;
pub mod kinds;
pub mod ownership;
pub mod pod;
pub mod pod_policy;
pub mod refusal;
pub mod rejection;
pub mod shard;
pub mod state;
pub mod trim;

pub use config::{Policy, WarningPolicy};
