//! Two replicas with leader election: only the lease holder reconciles; when it goes, the
//! other takes over.

use std::time::Duration;

use berth_api::Phase;
use berth_controller::config::LeaderElection;
use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::ClusterRoleBinding};
use kube::{Api, api::PostParams};
use serde_json::json;

use crate::support::{Harness, WAIT, test_config};

pub(crate) async fn replica_client(h: &Harness, name: &str) -> kube::Client {
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client.clone(), "kube-system");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(h.client.clone());
    let binding = json!({"metadata": {"name": name}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}]});
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .unwrap();
    let token = h
        .sim
        .issue_token("kube-system", name, &[], Duration::from_secs(3600))
        .unwrap();
    h.sim.client_with_token(&token).await.unwrap()
}

fn elected(identity: &str) -> berth_controller::Config {
    let election = LeaderElection {
        lease: "berth-controller".into(),
        namespace: "kube-system".into(),
        identity: identity.into(),
        duration_seconds: 2,
        grace_seconds: 1,
    };
    berth_controller::Config {
        leader_election: Some(election),
        ..test_config()
    }
}

fn writes_by(h: &Harness, account: &str) -> u64 {
    let user = format!("system:serviceaccount:kube-system:{account}");
    h.sim
        .count_requests(|k| k.user == user && k.resource == "workspaces" && k.verb == "patch")
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over() {
    let mut h = Harness::start().await;
    h.stop_operator().await;
    let first = tokio::spawn(berth_controller::run(
        replica_client(&h, "replica-a").await,
        elected("replica-a"),
    ));
    // The first replica holds the lease before the second starts.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(h.client.clone(), "kube-system");
    crate::support::eventually(
        crate::support::WAIT,
        "replica-a to hold the lease",
        || async {
            let lease = leases.get_opt("berth-controller").await.ok()??;
            (lease.spec?.holder_identity.as_deref() == Some("replica-a")).then_some(())
        },
    )
    .await;
    let second = tokio::spawn(berth_controller::run(
        replica_client(&h, "replica-b").await,
        elected("replica-b"),
    ));

    h.create("led", json!({"image": "devbox:1"})).await;
    h.until_phase("led", Phase::Running).await;
    assert!(writes_by(&h, "replica-a") > 0, "the leader reconciled");
    assert_eq!(writes_by(&h, "replica-b"), 0, "the standby did not");
    // The standby's log says that it stands by, and for whom.
    crate::support::eventually(WAIT, "the standby saying it stands by", || async {
        h.logs
            .text()
            .contains("standing by: replica-a holds the lease; this replica takes over when it is released or expires")
            .then_some(())
    })
    .await;

    first.abort();
    h.create("after", json!({"image": "devbox:1"})).await;
    h.until_phase("after", Phase::Running).await;
    assert!(
        writes_by(&h, "replica-b") > 0,
        "the standby took over once the lease expired"
    );
    second.abort();
}

/// A replica whose first read of the Lease fails (a 500 that lasts) does not exit: it says
/// why it is not ready on `/readyz` and retries with backoff, and leads once the API server
/// answers again.
#[tokio::test]
async fn a_failing_first_lease_read_is_retried_until_it_answers() {
    use berth_sim::{ApiFault, Frequency, RequestMatch};
    let config = crate::support::leading_config();
    let mut h = Harness::start_with(crate::support::sim_config(), config).await;
    h.stop_operator().await;
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("get", "leases"),
        code: 500,
        frequency: Frequency::Next(u32::MAX),
    });
    h.start_operator();
    let why =
        crate::support::eventually(WAIT, "the replica to say why it is not ready", || async {
            h.metrics.waiting().filter(|why| why.contains("500"))
        })
        .await;
    assert!(
        why.starts_with("reading the Lease berth-system/berth-controller failed"),
        "{why}"
    );
    assert!(!ready(&h));
    let failed = h
        .sim
        .count_requests(|k| k.resource == "leases" && k.code == 500);
    h.sim.faults().clear_api_faults();
    until_ready(&h).await;
    assert!(failed >= 1);
    assert_eq!(h.metrics.waiting(), None);
    h.create("after", json!({"image": "devbox:1"})).await;
    h.until_phase("after", Phase::Running).await;
}

/// Every request a replica makes at startup may fail for a while (its first list of each
/// cache, of Workspaces): the replica stays not ready, saying what it waits for on `/readyz`,
/// and becomes ready by itself once the API server answers again (#34 item 1). Before, the
/// controller's own backoff over all its watches froze them all for up to 30 s per failed
/// list, and such a replica was still not ready 50 s after the API answered.
#[tokio::test]
async fn a_replica_whose_first_lists_fail_becomes_ready_once_they_answer() {
    use berth_sim::{ApiFault, Frequency, RequestMatch};
    let mut h = Harness::start_with(crate::support::sim_config(), test_config()).await;
    h.stop_operator().await;
    let resources = [
        "workspaces",
        "pods",
        "persistentvolumeclaims",
        "services",
        "events",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ];
    for resource in resources {
        h.sim.faults().api_error(ApiFault {
            matching: RequestMatch::new("list", resource),
            code: 500,
            frequency: Frequency::Next(u32::MAX),
        });
    }
    h.start_operator();
    for resource in resources {
        crate::support::eventually(WAIT, &format!("a failed list of {resource}"), || async {
            (h.sim
                .count_requests(|k| k.resource == resource && k.code == 500)
                > 1)
            .then_some(())
        })
        .await;
    }
    assert!(!ready(&h));
    let why = h.metrics.waiting();
    assert!(
        why.as_deref()
            .is_some_and(|w| w.starts_with("the first lists")),
        "{why:?}"
    );
    h.sim.faults().clear_api_faults();
    until_ready(&h).await;
    assert_eq!(h.metrics.waiting(), None);
    h.create("after-lists", json!({"image": "devbox:1"})).await;
    h.until_phase("after-lists", Phase::Running).await;
}

/// Whether the replica's `/readyz` answers 200.
fn ready(h: &Harness) -> bool {
    h.metrics.ready.load(std::sync::atomic::Ordering::Relaxed)
}

/// Waits until the replica is ready.
async fn until_ready(h: &Harness) {
    crate::support::eventually(WAIT, "the replica to be ready", || async {
        ready(h).then_some(())
    })
    .await;
}

/// The holder renews its Lease once per renewal period (the duration less the grace: 1 s
/// here), whatever else the Lease's watch delivers. Before, each watch event (its own
/// renewal's too) cut a renewal short before it read the Lease back, and the holder renewed
/// about fifteen times in a row each period: a write storm that grew with every shard.
#[tokio::test]
async fn the_holder_renews_its_lease_once_per_period() {
    let config = crate::support::leading_config();
    let h = Harness::start_with(crate::support::sim_config(), config).await;
    let renewals = || {
        h.sim.count_requests(|k| {
            k.user == crate::support::OPERATOR && k.resource == "leases" && k.verb == "patch"
        })
    };
    crate::support::eventually(WAIT, "the lease taken", || async {
        (renewals() > 0).then_some(())
    })
    .await;
    let (from, started) = (renewals(), std::time::Instant::now());
    // Three renewal periods at least (a slower machine renews less often, never more).
    crate::support::eventually(WAIT, "three renewals", || async {
        (renewals() >= from + 3).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let periods = started.elapsed().as_secs_f64();
    let renewed = renewals() - from;
    assert!(
        (renewed as f64) <= periods + 2.0,
        "{renewed} renewals in {periods:.1} s of 1 s periods"
    );
}
