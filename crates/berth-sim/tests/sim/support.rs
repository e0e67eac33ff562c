//! Helpers shared by the sim's tests.

use std::time::Duration;

use berth_sim::{SimCluster, SimConfig};

/// A fresh cluster with the fast defaults tests want.
pub async fn cluster() -> SimCluster {
    SimCluster::start(SimConfig { max_pod_grace: Duration::from_millis(200), ..SimConfig::default() })
        .await
        .expect("the sim starts")
}

/// Polls `check` until it returns `Some`, or panics after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
