//! Least privilege: every rule of `deploy/rbac/berth-controller.yaml` is one the operator
//! uses, measured from the sim's request log over a run that does everything the operator
//! does (issue: "A test compares deploy/rbac/ with the verbs the operator actually used").

use std::collections::BTreeSet;

use berth_api::Phase;
use berth_sim::{NodeConfig, SimConfig};
use k8s_openapi::api::{
    core::v1::{PersistentVolumeClaim, Pod, Service},
    rbac::v1::{ClusterRole, PolicyRule, Role},
};
use kube::{Api, api::PostParams};
use serde_json::json;

use crate::support::{Harness, OPERATOR, WAIT, eventually};

/// (API group, resource or resource/subresource, verb).
type Permission = (String, String, String);

/// Rules the API server checks on the operator's behalf rather than through a request of its
/// own: no request in the log can show them used, so each is named with who checks it.
const CHECKED_FOR_THE_OPERATOR: &[(&str, &str, &str, &str)] = &[
    (
        "berth.dev",
        "workspaces/agent",
        "use",
        "each agent's SubjectAccessReview asks exactly this about the operator",
    ),
    (
        "",
        "services",
        "create",
        "the Service is made by server-side apply, which the API server also authorizes as create when it creates",
    ),
    (
        "berth.dev",
        "workspaces/finalizers",
        "update",
        "the OwnerReferencesPermissionEnforcement admission plugin requires it to set blockOwnerDeletion on what a workspace owns",
    ),
];

fn expand(rules: &[PolicyRule]) -> BTreeSet<Permission> {
    let mut permissions = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    permissions.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    permissions
}

/// A user would see: nothing (this is for the cluster admin reviewing what Berth may do).
/// The run covers start, storage growth, a port change and removal, a pod name already taken,
/// a kubelet rejection and replacement, pause, deletion, events, the agent token, and leader
/// election; the operator is refused nothing, and every rule granted to it was used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_granted_to_the_operator_is_used_and_nothing_is_refused() {
    let config = crate::support::leading_config();
    let sim = SimConfig {
        nodes: vec![NodeConfig::new("node-1")],
        ..crate::support::sim_config()
    };
    let mut h = Harness::start_with(sim, config).await;

    // A workspace is rejected once by the kubelet and replaced (first, so that no other
    // pod is admitted meanwhile).
    h.sim.faults().reject_next("node-1", 1, "OutOfcpu");
    h.create("rejected", json!({"image": "devbox:1"})).await;
    h.until("rejected", "Running after a replacement", |ws| {
        ws.status.as_ref().and_then(|s| s.pod_recreations) == Some(1)
            && crate::support::phase_of(ws) == Some(Phase::Running)
    })
    .await;

    h.create(
        "full",
        json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    h.until_phase("full", Phase::Running).await;

    // A kind: the operator counts its workspaces into its status.
    let kinds: Api<berth_api::WorkspaceKind> = Api::all(h.client.clone());
    kinds
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind", "metadata": {"name": "plain"},
            "spec": {"spawner": {"displayName": "Plain"}, "options": {
                "image": {"default": "a", "values": [{"id": "a", "displayName": "A", "spec": {"image": "devbox:1"}}]},
                "pod": {"default": "p", "values": [{"id": "p", "displayName": "P", "spec": {}}]}}}
        })).unwrap())
        .await
        .unwrap();
    eventually(WAIT, "the kind's status", || async {
        kinds.get("plain").await.ok()?.status.map(|_| ())
    })
    .await;

    // Storage grows; the port changes, then goes.
    h.patch_spec(
        "full",
        json!({"podTemplate": {"volumes": {"home": {"size": "2Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(h.client.clone(), "default");
    eventually(WAIT, "the claim to grow", || async {
        let claim = claims.get("full-home").await.ok()?;
        let size = claim.spec?.resources?.requests?.get("storage")?.0.clone();
        (size == "2Gi").then_some(())
    })
    .await;
    h.patch_spec("full", json!({"ports": [{"name": "http", "port": 9090}]}))
        .await;
    let services: Api<Service> = Api::namespaced(h.client.clone(), "default");
    eventually(WAIT, "the service to follow the port", || async {
        let service = services.get("full").await.ok()?;
        (service.spec?.ports?[0].port == 9090).then_some(())
    })
    .await;
    h.patch_spec("full", json!({"ports": null})).await;
    eventually(WAIT, "the service to go", || async {
        services.get("full").await.is_err().then_some(())
    })
    .await;

    // A pod of the same name that is not ours: the operator looks at it and leaves it.
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "squatted-ws"},
            "spec": {"containers": [{"name": "c", "image": "x:1"}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    h.create("squatted", json!({"image": "devbox:1"})).await;
    h.until_phase("squatted", Phase::Error).await;
    // So are a claim and a service of the names it derives.
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "grabbed-home"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "grabbed"},
                "spec": {"ports": [{"port": 80}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    h.create(
        "grabbed",
        json!({"image": "devbox:1", "ports": [{"name": "http", "port": 8080}],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}}),
    )
    .await;
    h.until_not_ready("grabbed", "NameTaken").await;
    eventually(WAIT, "both names looked at", || async {
        let looked = |resource: &str| {
            h.sim.count_requests(|k| {
                k.user == crate::support::OPERATOR && k.verb == "get" && k.resource == resource
            }) > 0
        };
        (looked("persistentvolumeclaims") && looked("services")).then_some(())
    })
    .await;

    // Pause, resume, then a restart of the operator (it releases and takes the Lease again).
    h.patch_spec("full", json!({"paused": true})).await;
    h.until_phase("full", Phase::Stopped).await;
    h.patch_spec("full", json!({"paused": false})).await;
    h.until_phase("full", Phase::Running).await;
    h.stop_operator().await;
    h.start_operator();

    // Sharding turned on (two shards, this one replica holding both once the second's
    // patience is over), over a pod from before shard labels (its label taken off by hand):
    // the sharder labels the pod, then the workspace.
    let unlabel = json!({"metadata": {"labels": {"berth.dev/shard": null}}});
    pods.patch(
        "full-ws",
        &Default::default(),
        &kube::api::Patch::Merge(&unlabel),
    )
    .await
    .unwrap();
    h.stop_operator().await;
    h.configure(|config| {
        config.sharding = berth_controller::config::Sharding {
            count: 2,
            preferred: 0,
        }
    });
    h.start_operator();
    eventually(WAIT, "the pod and its workspace labelled", || async {
        let labelled = |labels: Option<std::collections::BTreeMap<String, String>>| {
            labels.is_some_and(|l| l.contains_key("berth.dev/shard"))
        };
        let pod = pods.get("full-ws").await.ok()?;
        let workspace = h.workspaces().get("full").await.ok()?;
        (labelled(pod.metadata.labels) && labelled(workspace.metadata.labels)).then_some(())
    })
    .await;

    // Deletion: the finalizer comes off once what the workspace owns is gone.
    for name in ["full", "rejected", "squatted", "grabbed"] {
        h.workspaces()
            .delete(name, &Default::default())
            .await
            .unwrap();
    }
    eventually(WAIT, "every workspace gone", || async {
        h.workspaces()
            .list(&Default::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    h.stop_operator().await;

    let log = h.sim.requests();
    let refused: Vec<_> = log
        .iter()
        .filter(|r| r.key.user == OPERATOR && r.key.code == 403)
        .collect();
    assert!(refused.is_empty(), "the operator was refused: {refused:#?}");
    let used: BTreeSet<Permission> = log
        .iter()
        .filter(|r| r.key.user == OPERATOR && !r.key.resource.starts_with('/'))
        .map(|r| {
            let resource = match r.key.subresource.as_str() {
                "" => r.key.resource.clone(),
                sub => format!("{}/{sub}", r.key.resource),
            };
            (r.key.group.clone(), resource, r.key.verb.clone())
        })
        .collect();

    let cluster_role = Api::<ClusterRole>::all(h.client.clone())
        .get("berth-controller")
        .await
        .unwrap();
    let role = Api::<Role>::namespaced(h.client.clone(), "berth-system")
        .get("berth-controller")
        .await
        .unwrap();
    let granted: BTreeSet<Permission> = expand(cluster_role.rules.as_deref().unwrap_or_default())
        .into_iter()
        .chain(expand(role.rules.as_deref().unwrap_or_default()))
        .collect();
    let checked_for_it: BTreeSet<Permission> = CHECKED_FOR_THE_OPERATOR
        .iter()
        .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let unused: Vec<_> = granted
        .difference(&used)
        .filter(|p| !checked_for_it.contains(*p))
        .collect();
    assert!(
        unused.is_empty(),
        "granted in deploy/rbac/ but never used (drop them, or name who checks them): {unused:#?}\nused: {used:#?}"
    );
    assert!(
        checked_for_it.is_subset(&granted),
        "a rule checked on the operator's behalf is missing"
    );
}
