//! Pod Security admission by namespace labels, through kube-rs and kubectl: what a real API
//! server refuses, warns about and lets through, in its words.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};

use crate::{kubectl::Kubectl, support::cluster};

const BARE: &str = "allowPrivilegeEscalation != false (container \"main\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"main\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"main\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"main\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")";

fn pod(name: &str, restricted: bool) -> Pod {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "devbox:1"}]}});
    if restricted {
        pod["spec"]["securityContext"] =
            json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
        pod["spec"]["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    }
    serde_json::from_value(pod).unwrap()
}

async fn namespace(
    client: &kube::Client,
    name: &str,
    labels: Value,
) -> Result<Namespace, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
        )
        .await
}

#[tokio::test]
async fn a_namespace_enforcing_restricted_refuses_a_pod_that_breaks_it() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    namespace(
        &client,
        "locked",
        json!({"pod-security.kubernetes.io/enforce": "restricted"}),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "locked");
    match pods
        .create(&PostParams::default(), &pod("bare", false))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
            assert_eq!(
                status.message,
                format!(
                    "pods \"bare\" is forbidden: violates PodSecurity \"restricted:latest\": {BARE}"
                )
            );
        }
        other => panic!("not refused: {other:?}"),
    }
    pods.create(&PostParams::default(), &pod("hardened", true))
        .await
        .unwrap();
    // Elsewhere nothing is enforced.
    let open: Api<Pod> = Api::namespaced(client, "default");
    open.create(&PostParams::default(), &pod("bare", false))
        .await
        .unwrap();
}

#[tokio::test]
async fn bad_pod_security_labels_are_refused_on_the_namespace() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    match namespace(
        &client,
        "typo",
        json!({"pod-security.kubernetes.io/enforce": "restricte"}),
    )
    .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422);
            assert_eq!(
                status.message,
                "Namespace \"typo\" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"restricte\": must be one of privileged, baseline, restricted"
            );
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[tokio::test]
async fn kubectl_shows_the_warning_of_a_warn_level_and_the_refusal_of_an_enforce_level() {
    let sim = cluster().await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    kubectl.ok(&["create", "namespace", "watched"]).await;
    kubectl
        .ok(&[
            "label",
            "namespace",
            "watched",
            "pod-security.kubernetes.io/warn=restricted",
        ])
        .await;
    let output = kubectl
        .run_with_input(
            &["-n", "watched", "create", "-f", "-"],
            "apiVersion: v1\nkind: Pod\nmetadata: {name: bare}\nspec:\n  containers: [{name: main, image: devbox:1}]\n",
        )
        .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "Warning: would violate PodSecurity \"restricted:latest\": {BARE}"
        )),
        "{stderr}"
    );
    kubectl.ok(&["create", "namespace", "locked"]).await;
    kubectl
        .ok(&[
            "label",
            "namespace",
            "locked",
            "pod-security.kubernetes.io/enforce=baseline",
            "pod-security.kubernetes.io/enforce-version=v1.30",
        ])
        .await;
    let stderr = kubectl
        .fails_with_input(
            &["-n", "locked", "create", "-f", "-"],
            "apiVersion: v1\nkind: Pod\nmetadata: {name: host}\nspec:\n  hostNetwork: true\n  containers: [{name: main, image: devbox:1, securityContext: {privileged: true}}]\n",
        )
        .await;
    assert!(
        stderr.contains("pods \"host\" is forbidden: violates PodSecurity \"baseline:v1.30\": host namespaces (hostNetwork=true), privileged (container \"main\" must not set securityContext.privileged=true)"),
        "{stderr}"
    );
}
