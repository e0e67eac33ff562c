//! The real operator against berth-sim: what a user would check with kubectl — phase,
//! conditions, messages, events, pod UIDs (to prove no churn), and the requests it made.

mod support;

mod admission;
mod agent;
mod content;
mod culling;
mod dashboard;
mod gateway;
mod kinds;
mod leader;
mod lifecycle;
mod observability;
mod ownership;
mod pod_security;
mod rbac;
mod refusal;
mod rejection;
mod sharding;
