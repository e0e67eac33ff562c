//! The Berth operator: the reconcile loop (`reconcile.rs`), the pure core that derives status
//! and actions (`state.rs`), the objects a workspace needs (`pod.rs`), the handshake with
//! workspace agents (`agent.rs`), configuration and metrics.

pub mod action;
pub mod admission;
pub mod agent;
pub mod caches;
pub mod config;
pub mod content;
pub mod error;
pub mod event_index;
pub mod idle;
pub mod kinds;
pub mod leader;
pub mod metrics;
pub mod ownership;
pub mod pod;
pub mod pod_policy;
pub mod rbac;
pub mod reconcile;
pub mod recorder;
pub mod refusal;
pub mod rejection;
pub mod state;
pub mod trim;

pub use config::{Config, Policy, WarningPolicy};
pub use error::{Error, Result};
pub use reconcile::{run, run_until, run_with_metrics};
