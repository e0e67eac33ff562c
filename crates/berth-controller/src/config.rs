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
    /// How workspaces are split between replicas; one shard (the default): not at all.
    pub sharding: Sharding,
    /// How many workspaces are reconciled at once across all shards (see
    /// [`Config::reconciles_per_shard`]).
    pub reconciles_in_flight: u32,
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

/// Workspaces split across replicas by their namespace's bucket (`berth_core::shard`,
/// `bench/sharding.md`): each shard has a Lease (`<lease>-shard-<i>-of-<count>`), and its
/// holder reconciles the shard's workspaces alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    /// How many shards (at most `berth_core::shard::BUCKETS`); 1: every workspace is one
    /// operator's.
    pub count: u32,
    /// The shard this replica competes for at once. It competes for the others only after
    /// their Lease's duration, so the replica that prefers a shard gets it first, and a shard
    /// whose replicas are gone is still taken.
    pub preferred: u32,
}

impl Default for Sharding {
    fn default() -> Self {
        Sharding {
            count: 1,
            preferred: 0,
        }
    }
}

impl Sharding {
    /// The shard a replica named `host` prefers among `count`: a StatefulSet's ordinal (the
    /// number ending the pod name), else a hash of the name.
    pub fn preferred_by(host: &str, count: u32) -> u32 {
        let count = count.max(1);
        let ordinal = host
            .rsplit_once('-')
            .and_then(|(_, last)| last.parse::<u32>().ok());
        match ordinal {
            Some(ordinal) => ordinal % count,
            None => berth_core::shard::bucket(host) % count,
        }
    }
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
            sharding: Sharding::default(),
            reconciles_in_flight: 16,
            agent: AgentConfig::default(),
            event_retry: crate::recorder::Retry::default(),
        }
    }
}

impl Config {
    /// How many of a shard's workspaces its holder reconciles at once: its share of
    /// `reconciles_in_flight` (at least one). The shards' operators share one API server, and
    /// their reconciles are its writes: split, N replicas put as many writes in flight as one
    /// operator does, each shard's workspaces get as many per workspace, and a burst waits in
    /// the operators' queues rather than in the API server's, where it would delay every
    /// request, the agents' reviews included (`bench/sharding.md`: 3 shards at 16 each kept
    /// each shard's pod Ready -> Running p99 at 1.5-2.5 s; at 5, 0.8 s).
    pub fn reconciles_per_shard(&self) -> u16 {
        let share = (self.reconciles_in_flight / self.sharding.count.max(1)).max(1);
        u16::try_from(share).unwrap_or(u16::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_prefers_its_ordinal_else_its_names_hash() {
        assert_eq!(Sharding::preferred_by("berth-controller-0", 3), 0);
        assert_eq!(Sharding::preferred_by("berth-controller-4", 3), 1);
        let hashed = Sharding::preferred_by("berth-controller-7d9f-xk2p", 3);
        assert!(hashed < 3);
        assert_eq!(
            Sharding::preferred_by("berth-controller-7d9f-xk2p", 3),
            hashed,
            "stable"
        );
        assert_eq!(Sharding::preferred_by("anything", 1), 0);
    }

    #[test]
    fn the_shards_share_the_reconciles_in_flight() {
        let config = |reconciles_in_flight, count| Config {
            reconciles_in_flight,
            sharding: Sharding {
                count,
                preferred: 0,
            },
            ..Config::default()
        };
        assert_eq!(Config::default().reconciles_per_shard(), 16);
        assert_eq!(config(16, 3).reconciles_per_shard(), 5);
        assert_eq!(config(16, 16).reconciles_per_shard(), 1);
        assert_eq!(config(16, 256).reconciles_per_shard(), 1, "at least one");
        assert_eq!(config(0, 1).reconciles_per_shard(), 1, "at least one");
    }

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
