//! Two operator replicas sharing the workspaces by namespace (`bench/sharding.md`): each
//! reconciles the namespaces of the shard whose Lease it holds, the first labels what is
//! unlabelled, and when one replica goes, the other takes its shard over.

use std::time::Duration;

use berth_api::{Phase, Workspace};
use berth_controller::{
    config::{LeaderElection, Sharding},
    shard::{self, Shard},
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, Pod},
};
use kube::{Api, ResourceExt, api::PostParams};
use serde_json::json;

use crate::support::{Harness, WAIT, eventually, phase_of, test_config};

/// A replica preferring shard `preferred` of two, writing as field manager `manager`.
fn sharded(identity: &str, preferred: u32) -> berth_controller::Config {
    berth_controller::Config {
        manager: format!("berth-{identity}"),
        leader_election: Some(LeaderElection {
            lease: "berth-controller".into(),
            namespace: "kube-system".into(),
            identity: identity.into(),
            // Long enough that each replica takes its preferred shard before the other's
            // patience (one duration) runs out, however loaded the machine.
            duration_seconds: 4,
            grace_seconds: 1,
        }),
        sharding: Sharding {
            count: 2,
            preferred,
        },
        ..test_config()
    }
}

/// The first `team-<n>` namespace in `shard`, created with its service account bound.
async fn namespace_in(h: &Harness, shard: Shard) -> String {
    let name = (0..)
        .map(|n| format!("team-{n}"))
        .find(|ns| shard.owns(ns))
        .expect("some namespace is in every shard");
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
        )
        .await
        .unwrap();
    h.grant_auth_delegator(&name, "default").await;
    name
}

async fn create_in(h: &Harness, namespace: &str, name: &str, labels: serde_json::Value) {
    let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), namespace);
    workspaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
                "metadata": {"name": name, "labels": labels}, "spec": {"image": "devbox:1"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
}

/// The workspace once Running, with the field manager that wrote its status.
async fn running(h: &Harness, namespace: &str, name: &str) -> (Workspace, String) {
    let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), namespace);
    let workspace = eventually(WAIT, &format!("{namespace}/{name} Running"), || async {
        let ws = workspaces.get(name).await.ok()?;
        (phase_of(&ws) == Some(Phase::Running)).then_some(ws)
    })
    .await;
    let writer = workspace
        .managed_fields()
        .iter()
        .find(|f| f.subresource.as_deref() == Some("status"))
        .and_then(|f| f.manager.clone())
        .unwrap_or_default();
    (workspace, writer)
}

/// One operator of two shards, preferring (and so holding) the shard of `default`, where the
/// harness creates its workspaces.
async fn holding_defaults_shard() -> Harness {
    let config = berth_controller::Config {
        sharding: Sharding {
            count: 2,
            preferred: shard::bucket("default") % 2,
        },
        ..crate::support::leading_config()
    };
    Harness::start_with(crate::support::sim_config(), config).await
}

/// The operator's patches of workspaces (not of their status) answered with `code`.
fn workspace_patches(h: &Harness, code: u16) -> u64 {
    h.sim.count_requests(|r| {
        r.user == crate::support::OPERATOR
            && (
                r.verb.as_str(),
                r.resource.as_str(),
                r.subresource.as_str(),
                r.code,
            ) == ("patch", "workspaces", "", code)
    })
}

async fn until_held(leases: &Api<Lease>, lease: &str, holder: &str) {
    eventually(WAIT, &format!("{holder} to hold {lease}"), || async {
        let lease = leases.get_opt(lease).await.ok()??;
        (lease.spec?.holder_identity.as_deref() == Some(holder)).then_some(())
    })
    .await;
}

/// A user would see: each workspace Running, labelled `berth.dev/shard=<its namespace's
/// bucket>` (as is its pod), its status written by the replica holding its namespace's shard;
/// a label set wrongly by hand put right; and, when a replica is gone, its namespaces'
/// workspaces reconciled by the other once its Lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_reconciles_its_shard_and_takes_over_the_other_when_it_goes() {
    let mut h = Harness::start().await;
    h.stop_operator().await;
    let (first, second) = (Shard::new(0, 2).unwrap(), Shard::new(1, 2).unwrap());
    let (ns_a, ns_b) = (
        namespace_in(&h, first).await,
        namespace_in(&h, second).await,
    );
    let a = tokio::spawn(berth_controller::run(
        crate::leader::replica_client(&h, "replica-a").await,
        sharded("replica-a", 0),
    ));
    let b = tokio::spawn(berth_controller::run(
        crate::leader::replica_client(&h, "replica-b").await,
        sharded("replica-b", 1),
    ));
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), "kube-system");
    until_held(&leases, "berth-controller-shard-0-of-2", "replica-a").await;
    until_held(&leases, "berth-controller-shard-1-of-2", "replica-b").await;

    // Created without the label, as kubectl would: the sharder (shard 0's holder) labels them.
    create_in(&h, &ns_a, "ada", json!({})).await;
    create_in(&h, &ns_b, "bob", json!({})).await;
    // Labelled by hand with the other shard's bucket: put right, then reconciled by its own.
    create_in(
        &h,
        &ns_b,
        "misfiled",
        json!({"berth.dev/shard": shard::label_value(&ns_a)}),
    )
    .await;
    // Labelled with no bucket at all (no shard selects it): labelled by the sharder.
    create_in(&h, &ns_b, "odd", json!({"berth.dev/shard": "none"})).await;
    for (namespace, name, writer) in [
        (&ns_a, "ada", "berth-replica-a"),
        (&ns_b, "bob", "berth-replica-b"),
        (&ns_b, "misfiled", "berth-replica-b"),
        (&ns_b, "odd", "berth-replica-b"),
    ] {
        let (workspace, wrote) = running(&h, namespace, name).await;
        assert_eq!(wrote, writer, "{namespace}/{name}'s status");
        assert_eq!(
            workspace.labels().get("berth.dev/shard"),
            Some(&shard::label_value(namespace)),
            "{namespace}/{name}"
        );
        let pods: Api<Pod> = Api::namespaced(h.client.clone(), namespace);
        let pod = pods.get(&format!("{name}-ws")).await.unwrap();
        assert_eq!(
            pod.labels().get("berth.dev/shard"),
            Some(&shard::label_value(namespace)),
            "{namespace}/{name}'s pod"
        );
    }

    // Replica a goes without releasing its Lease (a crash): replica b takes shard 0 once the
    // Lease expires, and reconciles its namespaces too.
    a.abort();
    let _ = a.await;
    until_held(&leases, "berth-controller-shard-0-of-2", "replica-b").await;
    create_in(&h, &ns_a, "after", json!({})).await;
    let (_, wrote) = running(&h, &ns_a, "after").await;
    assert_eq!(wrote, "berth-replica-b");
    // Shard 1 stayed where it was.
    until_held(&leases, "berth-controller-shard-1-of-2", "replica-b").await;
    b.abort();
    let _ = tokio::time::timeout(Duration::from_secs(5), b).await;
}

/// A user would see, while the API server fails the sharder's label (a 500): a Warning
/// `ShardLabelFailed` on the workspace, in the API server's words, saying no shard reconciles
/// it yet and when it is tried again; then the label, and the workspace Running.
#[tokio::test]
async fn a_label_the_api_refuses_is_said_by_a_warning_and_retried() {
    use berth_sim::{ApiFault, Frequency, RequestMatch};
    let h = holding_defaults_shard().await;
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("patch", "workspaces"),
        code: 500,
        frequency: Frequency::Next(1),
    });
    let wes = h.create("wes", json!({"image": "devbox:1"})).await;
    h.until_phase("wes", Phase::Running).await;
    let events = crate::support::events_about(&h, wes.metadata.uid.as_deref().unwrap()).await;
    let expected = format!(
        "cannot label the workspace with its shard (berth.dev/shard={}), so no operator shard reconciles it yet; retrying in 5s: ",
        shard::label_value("default")
    );
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "ShardLabelFailed"
                && note.starts_with(&expected)
                && note.contains("injected fault (patch workspaces)")),
        "{events:?}"
    );
}

/// A new workspace of a sharded operator gets its shard's label and Berth's finalizer in one
/// write (its shard would add the finalizer in a second): the request log shows one patch of
/// the workspace besides its status, none refused, and the workspace Running with both.
#[tokio::test]
async fn a_new_workspace_gets_its_label_and_the_finalizer_in_one_write() {
    let h = holding_defaults_shard().await;
    h.create("una", json!({"image": "devbox:1"})).await;
    let una = h.until_phase("una", Phase::Running).await;
    assert_eq!(
        una.labels().get("berth.dev/shard"),
        Some(&shard::label_value("default"))
    );
    assert_eq!(una.finalizers(), ["berth.dev/cleanup"]);
    let patches = |code| workspace_patches(&h, code);
    assert_eq!((patches(200), patches(422), patches(409)), (1, 0, 0));
}

/// A workspace that changed between being queued for its label and being labelled (here a
/// user's edit while the sharder's write is held) is labelled alone: the combined write is
/// refused by its test of the resourceVersion (422), which is no failure to report; its shard
/// then adds the finalizer, and the user's edit stays.
#[tokio::test]
async fn a_workspace_changed_before_its_label_is_labelled_alone() {
    use berth_sim::RequestMatch;
    let h = holding_defaults_shard().await;
    h.sim.faults().latency(
        RequestMatch::new("patch", "workspaces"),
        Duration::from_millis(500),
    );
    h.create("vic", json!({"image": "devbox:1"})).await;
    eventually(WAIT, "the sharder's write held", || async {
        (h.sim.faults().held() >= 1).then_some(())
    })
    .await;
    // A user's edit (an update, which the fault does not hold) lands first.
    let workspaces = h.workspaces();
    let mut vic = workspaces.get("vic").await.unwrap();
    vic.annotations_mut().insert("team".into(), "blue".into());
    workspaces
        .replace("vic", &PostParams::default(), &vic)
        .await
        .unwrap();

    let vic = h.until_phase("vic", Phase::Running).await;
    assert_eq!(
        vic.labels().get("berth.dev/shard"),
        Some(&shard::label_value("default"))
    );
    assert_eq!(vic.finalizers(), ["berth.dev/cleanup"]);
    assert_eq!(
        vic.annotations().get("team").map(String::as_str),
        Some("blue")
    );
    assert_eq!(
        workspace_patches(&h, 422),
        1,
        "the combined write, refused by its test"
    );
    let events = crate::support::events_about(&h, vic.metadata.uid.as_deref().unwrap()).await;
    assert!(
        events
            .iter()
            .all(|(reason, _)| reason != "ShardLabelFailed"),
        "{events:?}"
    );
}

/// A user would see, with the operator sharded: `kubectl get workspacekinds` counting every
/// workspace of the kind whichever shard reconciles it (`status.workspaces` the sum of the
/// shards' own entries, `status.shards["0-of-2"]` and `["1-of-2"]`), an entry left by another
/// shard count removed, the sum following a deletion; and a status write the API server
/// refuses said as a Warning `FailedUpdate` on the kind, in its words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kinds_use_is_counted_by_each_shard_and_summed_by_the_first() {
    use berth_api::WorkspaceKind;
    use berth_sim::{ApiFault, Frequency, RequestMatch};
    let config = berth_controller::Config {
        sharding: Sharding {
            count: 2,
            preferred: 0,
        },
        ..crate::support::leading_config()
    };
    let h = Harness::start_with(crate::support::sim_config(), config).await;
    let kinds: Api<WorkspaceKind> = Api::all(h.client.clone());
    let kind = kinds
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
                "metadata": {"name": "shell"},
                "spec": {
                    "spawner": {"displayName": "Shell"},
                    "options": {"image": {"default": "v1", "values": [
                        {"id": "v1", "displayName": "v1", "spec": {"image": "devbox:1"}}]},
                        "pod": {"default": "small", "values": [
                        {"id": "small", "displayName": "Small", "spec": {}}]}}
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // Left by a run with three shards.
    kinds
        .patch_status(
            "shell",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"workspaces": 9,
                "shards": {"2-of-3": {"workspaces": 9}}}})),
        )
        .await
        .unwrap();
    h.sim.faults().api_error(ApiFault {
        matching: RequestMatch::new("patch", "workspacekinds"),
        code: 500,
        frequency: Frequency::Next(1),
    });
    let (ns_a, ns_b) = (
        namespace_in(&h, Shard::new(0, 2).unwrap()).await,
        namespace_in(&h, Shard::new(1, 2).unwrap()).await,
    );
    for (namespace, name) in [(&ns_a, "ada"), (&ns_b, "bob"), (&ns_b, "bea")] {
        let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), namespace);
        workspaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1",
                    "kind": "Workspace", "metadata": {"name": name},
                    "spec": {"kind": "shell"}}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let counted = |total: u32, first: u32, second: u32| {
        let kinds = kinds.clone();
        async move {
            eventually(WAIT, &format!("the kind to count {total}"), || async {
                let status = kinds.get("shell").await.ok()?.status?;
                let shards: Vec<(&str, u32)> = status
                    .shards
                    .iter()
                    .map(|(name, usage)| (name.as_str(), usage.workspaces))
                    .collect();
                let image = status.options.as_ref()?.image.get("v1").copied();
                (status.workspaces == total
                    && image == Some(total)
                    && shards == [("0-of-2", first), ("1-of-2", second)])
                .then_some(())
            })
            .await
        }
    };
    counted(3, 1, 2).await;
    Api::<Workspace>::namespaced(h.client.clone(), &ns_b)
        .delete("bea", &Default::default())
        .await
        .unwrap();
    counted(2, 1, 1).await;

    let events = crate::support::events_about(&h, kind.metadata.uid.as_deref().unwrap()).await;
    assert!(
        events.iter().any(|(reason, note)| reason == "FailedUpdate"
            && note.starts_with("cannot write how many workspaces use the kind into its status, so the admission policy may count too few; retrying in 1s: ")
            && note.contains("injected fault (patch workspacekinds)")),
        "{events:?}"
    );
}
