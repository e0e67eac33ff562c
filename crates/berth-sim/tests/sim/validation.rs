//! What the real API server refuses of pods and claims beyond names and types (resources and
//! their limits, volume mounts, environment sources, downward API paths, claim sizes), and a
//! custom resource whose validation rule fails to evaluate, through kube-rs and kubectl. The
//! messages are the real server's (`pkg/apis/core/validation/validation.go`).

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};

use crate::{kubectl::Kubectl, support::cluster};

/// The message of the API server's answer to creating `object`, which must be a 422.
async fn refusal<K>(api: &Api<K>, object: Value) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api
        .create(
            &PostParams::default(),
            &serde_json::from_value(object.clone()).unwrap(),
        )
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{object}: {status:?}");
            status.message
        }
        other => panic!("{object} was not refused: {other:?}"),
    }
}

fn pod(container: Value) -> Value {
    let mut container = container;
    container["name"] = json!("main");
    container["image"] = json!("devbox:1");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": {"containers": [container]}})
}

#[tokio::test]
async fn a_pod_the_real_server_refuses_is_refused_in_its_words() {
    let sim = cluster().await;
    let pods: Api<Pod> = Api::default_namespaced(sim.client().await.unwrap());
    let rows = [
        (
            pod(json!({"resources": {"requests": {"cpu": "-1"}}})),
            "Pod \"bad\" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0",
        ),
        (
            // The limit becomes the request too (SetDefaults_Pod), so both are said.
            pod(json!({"resources": {"limits": {"memory": "-1Gi"}}})),
            "Pod \"bad\" is invalid: [spec.containers[0].resources.limits[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0, spec.containers[0].resources.requests[memory]: Invalid value: \"-1Gi\": must be greater than or equal to 0]",
        ),
        (
            pod(json!({"resources": {"requests": {"cpu": "200m"}, "limits": {"cpu": "100m"}}})),
            "Pod \"bad\" is invalid: spec.containers[0].resources.requests: Invalid value: \"200m\": must be less than or equal to cpu limit of 100m",
        ),
        (
            pod(json!({"resources": {"requests": {"example.com/gpu": "1"}}})),
            "Pod \"bad\" is invalid: spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
        ),
        (
            pod(
                json!({"volumeMounts": [{"name": "a", "mountPath": "/data"}, {"name": "a", "mountPath": "/data"}]}),
            ),
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/data\": must be unique",
        ),
        (
            pod(
                json!({"env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            ),
            "Pod \"bad\" is invalid: spec.containers[0].env[0].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty",
        ),
        (
            pod(
                json!({"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]}),
            ),
            "Pod \"bad\" is invalid: spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Invalid value: \"spec.bogus\": error converting fieldPath: field label not supported: spec.bogus",
        ),
        (
            pod(
                json!({"env": [{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "bogus"}}}]}),
            ),
            "Pod \"bad\" is invalid: spec.containers[0].env[0].valueFrom.resourceFieldRef.resource: Unsupported value: \"bogus\": supported values: \"limits.cpu\", \"limits.ephemeral-storage\", \"limits.memory\", \"requests.cpu\", \"requests.ephemeral-storage\", \"requests.memory\"",
        ),
    ];
    for (object, message) in rows {
        let mut object = object;
        if object["spec"]["containers"][0]["volumeMounts"].is_array() {
            object["spec"]["volumes"] = json!([{"name": "a", "emptyDir": {}}]);
        }
        let said = refusal(&pods, object).await;
        assert!(said.ends_with(message), "{said}\nwanted: {message}");
    }
    // What the real server accepts still goes through, with its defaults.
    let fine = pod(json!({"resources": {"limits": {"cpu": "1"}},
        "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, {"name": "E", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}));
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(fine).unwrap(),
        )
        .await
        .unwrap();
    let container = &created.spec.unwrap().containers[0];
    assert_eq!(
        container
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["cpu"]
            .0,
        "1"
    );
    let selector = container.env.as_ref().unwrap()[0]
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(selector.api_version.as_deref(), Some("v1"));
}

#[tokio::test]
async fn a_claim_of_no_storage_is_refused_in_the_real_servers_words() {
    let sim = cluster().await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client().await.unwrap());
    let claim = |storage: Value| {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}})
    };
    for size in ["0", "-1Gi"] {
        assert_eq!(
            refusal(&claims, claim(json!(size))).await,
            format!(
                "PersistentVolumeClaim \"c\" is invalid: spec.resources[storage]: Invalid value: \"{size}\": must be greater than zero"
            )
        );
    }
    let bare = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"}, "spec": {}});
    assert_eq!(
        refusal(&claims, bare).await,
        "PersistentVolumeClaim \"c\" is invalid: [spec.accessModes: Required value: at least 1 access mode is required, spec.resources[storage]: Required value]"
    );
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(claim(json!("1Gi"))).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn kubectl_is_told_what_the_real_server_tells_it() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let stderr = kubectl
        .fails_with_input(
            &["create", "-f", "-"],
            "apiVersion: v1\nkind: Pod\nmetadata: {name: greedy}\nspec:\n  containers:\n  - {name: c, image: x:1, resources: {requests: {cpu: 200m}, limits: {cpu: 100m}}}\n",
        )
        .await;
    assert!(
        stderr.contains("The Pod \"greedy\" is invalid: spec.containers[0].resources.requests: Invalid value: \"200m\": must be less than or equal to cpu limit of 100m"),
        "{stderr}"
    );
    let stderr = kubectl
        .fails_with_input(
            &["create", "-f", "-"],
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: empty}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: \"0\"}}}\n",
        )
        .await;
    assert!(
        stderr.contains("The PersistentVolumeClaim \"empty\" is invalid: spec.resources[storage]: Invalid value: \"0\": must be greater than zero"),
        "{stderr}"
    );
}
