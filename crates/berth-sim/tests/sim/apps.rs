//! apps/v1 Deployments and ReplicaSets through kube-rs: what `kubectl rollout status`,
//! `kubectl scale` and `kubectl get deploy,rs,pods` would see on a real cluster.

use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Event, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::support::{api_error, cluster_with_nodes, eventually};

const WAIT: Duration = Duration::from_secs(20);

fn deployment(name: &str, replicas: i32, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": image, "ports": [{"containerPort": 80}]}]}
            }
        }
    }))
    .expect("a valid deployment")
}

/// The deployment once it reports every replica of its current generation updated and
/// available (what `kubectl rollout status` waits for).
async fn rolled_out(deployments: &Api<Deployment>, name: &str, replicas: i32) -> Deployment {
    eventually(
        WAIT,
        &format!("{name} rolled out with {replicas}"),
        || async {
            let d = deployments.get(name).await.ok()?;
            let status = d.status.clone()?;
            let done = status.observed_generation == d.metadata.generation
                && status.updated_replicas.unwrap_or(0) == replicas
                && status.replicas.unwrap_or(0) == replicas
                && status.available_replicas.unwrap_or(0) == replicas;
            done.then_some(d)
        },
    )
    .await
}

async fn live_pods(pods: &Api<Pod>, app: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

#[tokio::test]
async fn a_deployment_runs_its_pods_through_a_replica_set_and_reports_them_available() {
    let cluster = cluster_with_nodes().await;
    let client = cluster.client().await.unwrap();
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let created = deployments
        .create(&PostParams::default(), &deployment("web", 2, "nginx:1.27"))
        .await
        .unwrap();
    // Defaults a real server fills in.
    let spec = created.spec.clone().unwrap();
    let strategy = spec.strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(spec.revision_history_limit, Some(10));
    assert_eq!(spec.progress_deadline_seconds, Some(600));

    let d = rolled_out(&deployments, "web", 2).await;
    let conditions = d.status.unwrap().conditions.unwrap();
    let available = conditions.iter().find(|c| c.type_ == "Available").unwrap();
    assert_eq!(
        (available.status.as_str(), available.reason.as_deref()),
        ("True", Some("MinimumReplicasAvailable"))
    );
    let progressing = conditions
        .iter()
        .find(|c| c.type_ == "Progressing")
        .unwrap();
    assert_eq!(
        progressing.reason.as_deref(),
        Some("NewReplicaSetAvailable")
    );

    let rs_list = sets.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rs_list.len(), 1);
    let rs = &rs_list[0];
    let hash = rs.labels()["pod-template-hash"].clone();
    assert_eq!(rs.name_any(), format!("web-{hash}"));
    let owner = &rs.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Deployment", Some(true))
    );
    assert_eq!(rs.annotations()["deployment.kubernetes.io/revision"], "1");
    let running = live_pods(&pods, "web").await;
    assert_eq!(running.len(), 2);
    for pod in &running {
        assert!(pod.name_any().starts_with(&format!("web-{hash}-")));
        assert_eq!(pod.labels()["pod-template-hash"], hash);
        assert_eq!(pod.owner_references()[0].uid, rs.uid().unwrap());
    }

    // A pod that goes is replaced.
    pods.delete(&running[0].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "the deleted pod replaced", || async {
        let now = live_pods(&pods, "web").await;
        (now.len() == 2 && now.iter().all(|p| p.name_any() != running[0].name_any())).then_some(())
    })
    .await;

    let events: Api<Event> = Api::default_namespaced(client.clone());
    let scaled = events
        .list(
            &ListParams::default()
                .fields(&format!("involvedObject.uid={}", d.metadata.uid.unwrap())),
        )
        .await
        .unwrap()
        .items;
    assert!(
        scaled
            .iter()
            .any(|e| e.reason.as_deref() == Some("ScalingReplicaSet")
                && e.message.as_deref()
                    == Some(&format!("Scaled up replica set web-{hash} from 0 to 2"))),
        "{scaled:?}"
    );
}

#[tokio::test]
async fn a_new_template_rolls_out_through_a_new_replica_set_and_the_old_one_scales_to_zero() {
    let cluster = cluster_with_nodes().await;
    let client = cluster.client().await.unwrap();
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    deployments
        .create(&PostParams::default(), &deployment("api", 3, "nginx:1.27"))
        .await
        .unwrap();
    rolled_out(&deployments, "api", 3).await;
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "nginx:1.28"}]}}}});
    deployments
        .patch("api", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let d = rolled_out(&deployments, "api", 3).await;
    assert_eq!(d.annotations()["deployment.kubernetes.io/revision"], "2");
    let all = sets.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 2, "the old ReplicaSet is kept for a rollback");
    let (new, old): (Vec<_>, Vec<_>) = all.into_iter().partition(|rs| {
        rs.spec
            .as_ref()
            .unwrap()
            .template
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .image
            .as_deref()
            == Some("nginx:1.28")
    });
    assert_eq!(new[0].spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(old[0].spec.as_ref().unwrap().replicas, Some(0));
    let running = eventually(WAIT, "only new pods left", || async {
        let now = live_pods(&pods, "api").await;
        (now.len() == 3).then_some(now)
    })
    .await;
    for pod in running {
        assert_eq!(
            pod.spec.unwrap().containers[0].image.as_deref(),
            Some("nginx:1.28")
        );
    }
}

#[tokio::test]
async fn the_scale_subresource_and_deletion_reach_the_pods() {
    let cluster = cluster_with_nodes().await;
    let client = cluster.client().await.unwrap();
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let sets: Api<ReplicaSet> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    deployments
        .create(
            &PostParams::default(),
            &deployment("batch", 1, "nginx:1.27"),
        )
        .await
        .unwrap();
    rolled_out(&deployments, "batch", 1).await;
    let scale = deployments.get_scale("batch").await.unwrap();
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=batch"));
    deployments
        .patch_scale(
            "batch",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    rolled_out(&deployments, "batch", 3).await;
    assert_eq!(live_pods(&pods, "batch").await.len(), 3);

    deployments
        .delete("batch", &DeleteParams::background())
        .await
        .unwrap();
    eventually(WAIT, "the ReplicaSet and pods collected", || async {
        let sets_left = sets.list(&ListParams::default()).await.unwrap().items;
        (sets_left.is_empty() && live_pods(&pods, "batch").await.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_workload_the_real_server_refuses_is_refused_in_its_words() {
    let cluster = cluster_with_nodes().await;
    let client = cluster.client().await.unwrap();
    let deployments: Api<Deployment> = Api::default_namespaced(client.clone());
    let mut bad = deployment("bad", 1, "nginx:1.27");
    bad.spec.as_mut().unwrap().selector.match_labels =
        Some([("app".into(), "other".into())].into());
    let (code, reason, message) = api_error(deployments.create(&PostParams::default(), &bad).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "Deployment.apps \"bad\" is invalid: spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"bad\"}: `selector` does not match template `labels`"
    );

    deployments
        .create(&PostParams::default(), &deployment("good", 1, "nginx:1.27"))
        .await
        .unwrap();
    let patch = json!({"spec": {"selector": {"matchLabels": {"app": "good", "tier": "x"}},
        "template": {"metadata": {"labels": {"tier": "x"}}}}});
    let (code, _, message) = api_error(
        deployments
            .patch("good", &PatchParams::default(), &Patch::Strategic(&patch))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.selector: Invalid value: "),
        "{message}"
    );
    assert!(message.ends_with("field is immutable"), "{message}");
}

/// The create response carries the status the strategy starts with (`{}`), as the Python
/// client and `kubectl create -o json` see it.
#[tokio::test]
async fn a_created_deployment_answers_with_an_empty_status() {
    let sim = crate::support::cluster().await;
    let deployments: Api<Deployment> = Api::default_namespaced(sim.client().await.unwrap());
    let created = deployments
        .create(&PostParams::default(), &deployment("web", 1, "nginx:1.27"))
        .await
        .unwrap();
    let raw = serde_json::to_value(&created).unwrap();
    assert_eq!(raw["status"], json!({}), "{raw}");
}
