//! Two replicas with leader election: only the lease holder reconciles; when it goes, the
//! other takes over.

use std::time::Duration;

use berth_api::Phase;
use berth_controller::config::LeaderElection;
use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::ClusterRoleBinding};
use kube::{Api, api::PostParams};
use serde_json::json;

use crate::support::{Harness, test_config};

async fn replica_client(h: &Harness, name: &str) -> kube::Client {
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

    first.abort();
    h.create("after", json!({"image": "devbox:1"})).await;
    h.until_phase("after", Phase::Running).await;
    assert!(
        writes_by(&h, "replica-b") > 0,
        "the standby took over once the lease expired"
    );
    second.abort();
}
