//! The operator's configuration: what the `berth controller` flags set. The parts the pure
//! core needs (`Policy`, `AgentConfig`) are `berth_core::config`, re-exported here.

use std::net::SocketAddr;

pub use berth_core::config::*;

/// The operator's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch one namespace, or all.
    pub namespace: Option<String>,
    pub policy: Policy,
    /// Where `/metrics` is served; None: nowhere.
    pub metrics_address: Option<SocketAddr>,
    /// Where `/healthz` and `/readyz` are served; None: nowhere.
    pub health_address: Option<SocketAddr>,
    /// The field manager and event reporter name.
    pub manager: String,
    /// Only the holder of this Lease reconciles; None: always reconcile (one replica).
    pub leader_election: Option<LeaderElection>,
    pub agent: AgentConfig,
    /// How an event the API server failed to take is tried again before it is dropped.
    pub event_retry: crate::recorder::Retry,
}

/// Leader election on a `coordination.k8s.io/v1` Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    pub lease: String,
    pub namespace: String,
    /// This replica's identity, e.g. its pod name.
    pub identity: String,
    /// How long a lease lasts without renewal, in seconds.
    pub duration_seconds: u64,
    /// How long before expiry the holder renews, in seconds (less than the duration).
    pub grace_seconds: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: None,
            policy: Policy::default(),
            metrics_address: None,
            health_address: None,
            manager: "berth-controller".to_owned(),
            leader_election: None,
            agent: AgentConfig::default(),
            event_retry: crate::recorder::Retry::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_accounts_parse() {
        let sa: ServiceAccountRef = "berth-system/berth-controller".parse().unwrap();
        assert_eq!(
            sa.username(),
            "system:serviceaccount:berth-system:berth-controller"
        );
        assert_eq!(
            "system:serviceaccount:berth-system:berth-controller"
                .parse::<ServiceAccountRef>()
                .unwrap(),
            sa
        );
        for bad in ["berth-controller", "/x", "x/", "a/b/c", ""] {
            assert_eq!(
                bad.parse::<ServiceAccountRef>().unwrap_err(),
                format!("{bad:?} is not a service account: expected NAMESPACE/NAME")
            );
        }
    }

    #[test]
    fn warning_reasons_parse_and_classify() {
        let policy = WarningPolicy::default();
        assert_eq!(
            policy.classify("FailedMount", 1),
            WarningClass::Transient,
            "one FailedMount may be a race"
        );
        assert_eq!(policy.classify("FailedMount", 2), WarningClass::Error);
        assert_eq!(
            policy.classify("FailedScheduling", 9),
            WarningClass::Transient
        );
        assert_eq!(policy.classify("DNSConfigForming", 1), WarningClass::Ignore);
        assert_eq!(policy.classify("SomethingNew", 1), WarningClass::Transient);
        let custom: WarningPolicy = "FailedScheduling=error,Unhealthy=ignore".parse().unwrap();
        assert_eq!(custom.classify("FailedScheduling", 1), WarningClass::Error);
        assert!("FailedMount".parse::<WarningPolicy>().is_err());
        assert_eq!(
            "FailedMount=fatal".parse::<WarningPolicy>().unwrap_err(),
            "\"FailedMount=fatal\": unknown class \"fatal\"; use error, transient or ignore"
        );
    }
}
