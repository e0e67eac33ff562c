//! berth-sim's API server, driven by real clients: kube-rs (`kube::Client`, `watcher`,
//! `reflector`) and the machine's `kubectl`. Each test asserts what the real API server returns.

mod support;

mod admission;
mod admission_policies;
mod api;
mod apps;
mod auth;
mod certificates;
mod conformance;
mod crd;
mod deletion;
mod in_cluster;
mod kubectl;
mod nodes;
mod openapi;
mod pod_security;
mod processes;
mod scale;
mod validation;
mod watch;
