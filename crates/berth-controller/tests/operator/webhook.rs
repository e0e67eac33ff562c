//! The admission webhook end to end (issue 11, item 1): a user who may create workspaces but
//! not read a secret, run as a service account or mount a claim cannot get them through a
//! Workspace. The sim calls `berth webhook`'s handler over HTTPS as a real API server does.

use std::time::Duration;

use base64::Engine;
use berth_api::{Phase, Workspace};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    core::v1::ServiceAccount,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::support::Harness;

const MALLORY: &str = "system:serviceaccount:default:mallory";

async fn create<K>(client: &Client, namespace: &str, body: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
}

/// Serves the webhook (default pod policy) on localhost with a certificate from a new CA;
/// returns the CA (PEM), the URL and what stops it.
async fn start_webhook(client: Client) -> (String, String, oneshot::Sender<()>) {
    let authority = berth_sim::Authority::generate().unwrap();
    let (_, _, cert_pem, key_pem) = authority.issue(&["localhost"]).unwrap();
    let tls =
        berth_controller::webhook::tls_config(cert_pem.as_bytes(), key_pem.as_bytes()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    let checker = berth_controller::webhook::Checker {
        client,
        policy: Default::default(),
    };
    tokio::spawn(berth_controller::webhook::serve(
        listener,
        checker,
        tls,
        async move {
            let _ = stopped.await;
        },
    ));
    (
        authority.ca_pem().to_owned(),
        format!(
            "https://localhost:{port}{}",
            berth_controller::webhook::PATH
        ),
        stop,
    )
}

async fn register(h: &Harness, ca_pem: &str, url: &str, failure_policy: &str) {
    register_for(h, ca_pem, url, failure_policy, &["CREATE", "UPDATE"]).await
}

async fn register_for(
    h: &Harness,
    ca_pem: &str,
    url: &str,
    failure_policy: &str,
    operations: &[&str],
) {
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "berth"},
        "webhooks": [{
            "name": "workspaces.berth.dev",
            "clientConfig": {"url": url, "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem)},
            "rules": [{"operations": operations, "apiGroups": ["berth.dev"], "apiVersions": ["v1alpha1"], "resources": ["workspaces"]}],
            "matchConditions": [{"name": "not-the-operator", "expression": format!("request.userInfo.username != '{}'", crate::support::OPERATOR)}],
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    });
    Api::<ValidatingWebhookConfiguration>::all(h.client.clone())
        .patch(
            "berth",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&configuration),
        )
        .await
        .unwrap();
}

/// A client for `mallory`, who may create, read, change and delete workspaces in `default`,
/// and nothing else.
async fn mallory(h: &Harness) -> Client {
    create::<ServiceAccount>(
        &h.client,
        "default",
        json!({"metadata": {"name": "mallory"}}),
    )
    .await;
    create::<Role>(&h.client, "default", json!({"metadata": {"name": "workspace-user"},
        "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]}]})).await;
    create::<RoleBinding>(&h.client, "default", json!({"metadata": {"name": "mallory"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workspace-user"},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": "default"}]}))
    .await;
    let token = h
        .sim
        .issue_token("default", "mallory", &[], Duration::from_secs(3600))
        .unwrap();
    h.sim.client_with_token(&token).await.unwrap()
}

fn workspace(name: &str, spec: Value) -> Workspace {
    serde_json::from_value(
        json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
        "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn refused(result: Result<Workspace, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// What mallory sees: `kubectl create` fails with 403 and the webhook's words naming them, the
/// verb, the object and the field. A workspace that uses only what they may use runs; once
/// they may read a secret, a workspace may too; changing a spec is checked as creating one.
#[tokio::test]
async fn a_workspace_grants_nothing_its_author_does_not_already_have() {
    let h = Harness::start().await;
    let (ca, url, _stop) = start_webhook(h.client.clone()).await;
    register(&h, &ca, &url, "Fail").await;
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let post = PostParams::default();
    let denied = |rest: &str| {
        format!(
            "admission webhook \"workspaces.berth.dev\" denied the request: User \"{MALLORY}\" cannot {rest}; a workspace may use only what its author may use directly"
        )
    };

    for (spec, rest) in [
        (
            json!({"image": "devbox:1", "serviceAccountName": "deployer"}),
            "create serviceaccounts/token \"deployer\" in the namespace \"default\", which spec.serviceAccountName names",
        ),
        (
            json!({"image": "devbox:1", "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "payments-db", "key": "password"}}}]}),
            "get secrets \"payments-db\" in the namespace \"default\", which spec.env[0].valueFrom.secretKeyRef names",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}),
            "get secrets \"payments-db\" in the namespace \"default\", which spec.podTemplate.volumes.secrets[0] names",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"data": [{"claimName": "bob-home", "mountPath": "/data"}]}}}),
            "get persistentvolumeclaims \"bob-home\" in the namespace \"default\", which spec.podTemplate.volumes.data[0] names",
        ),
    ] {
        assert_eq!(
            refused(as_mallory.create(&post, &workspace("grab", spec)).await),
            (403, denied(rest))
        );
    }
    assert!(as_mallory.get_opt("grab").await.unwrap().is_none());
    // What the operator's pod policy forbids is refused at the API too.
    let (code, message) = refused(
        as_mallory
            .create(
                &post,
                &workspace(
                    "grab",
                    json!({"image": "devbox:1", "podTemplate": {"tolerations": [{"operator": "Exists"}]}}),
                ),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "admission webhook \"workspaces.berth.dev\" denied the request: spec.podTemplate.tolerations[0]: a toleration of every taint (no key) is not allowed; the operator allows tolerations of (--allowed-tolerations): none; ask the platform team to allow it"
    );

    // What mallory may use runs, and the operator's own writes pass the webhook.
    as_mallory
        .create(&post, &workspace("honest", json!({"image": "devbox:1"})))
        .await
        .unwrap();
    h.until_phase("honest", Phase::Running).await;

    // Changing the spec is checked as setting it.
    let grab = json!({"spec": {"podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}});
    assert_eq!(
        refused(
            as_mallory
                .patch("honest", &PatchParams::default(), &Patch::Merge(&grab))
                .await
        ),
        (
            403,
            denied(
                "get secrets \"payments-db\" in the namespace \"default\", which spec.podTemplate.volumes.secrets[0] names"
            )
        )
    );

    // Once mallory may read the secret, a workspace may too.
    create::<Role>(&h.client, "default", json!({"metadata": {"name": "read-payments-db"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["payments-db"], "verbs": ["get"]}]})).await;
    create::<RoleBinding>(&h.client, "default", json!({"metadata": {"name": "mallory-reads-payments-db"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-payments-db"},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": "default"}]}))
    .await;
    as_mallory
        .patch("honest", &PatchParams::default(), &Patch::Merge(&grab))
        .await
        .unwrap();
}

/// With `failurePolicy: Fail` a webhook that cannot be asked refuses every workspace write
/// (500, the API server's words) except the operator's own (its match condition), so a
/// workspace can still be deleted; with `Ignore` the write goes through.
#[tokio::test]
async fn a_webhook_that_cannot_be_asked_follows_its_failure_policy() {
    let h = Harness::start().await;
    let (ca, url, stop) = start_webhook(h.client.clone()).await;
    register(&h, &ca, &url, "Fail").await;
    let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), "default");
    let post = PostParams::default();
    workspaces
        .create(&post, &workspace("early", json!({"image": "devbox:1"})))
        .await
        .unwrap();
    h.until_phase("early", Phase::Running).await;
    drop(stop);
    let (code, message) = refused(
        workspaces
            .create(&post, &workspace("a", json!({"image": "devbox:1"})))
            .await,
    );
    assert_eq!(code, 500);
    assert!(
        message.starts_with(&format!(
            "Internal error occurred: failed calling webhook \"workspaces.berth.dev\": failed to call webhook: Post \"{url}?timeout=5s\": "
        )),
        "{message}"
    );
    // The operator removes its finalizer without the webhook: deletion completes.
    workspaces
        .delete("early", &Default::default())
        .await
        .unwrap();
    crate::support::eventually(crate::support::WAIT, "early deleted", || async {
        workspaces
            .get_opt("early")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    register(&h, &ca, &url, "Ignore").await;
    workspaces
        .create(&post, &workspace("a", json!({"image": "devbox:1"})))
        .await
        .unwrap();
}

/// `deploy/webhook/` installs as it is, and its service account may ask what the webhook
/// asks: with the webhook running as `berth-webhook`, a workspace naming a secret its author
/// may read is admitted (a webhook unable to review would refuse it, failing closed).
#[tokio::test]
async fn the_webhook_manifest_installs_and_its_account_may_review() {
    let h = Harness::start().await;
    let created =
        berth_sim::manifests::create_all(&h.client, berth_controller::rbac::WEBHOOK, "default")
            .await
            .unwrap();
    assert_eq!(
        created,
        [
            "serviceaccount/berth-webhook",
            "clusterrole/berth-webhook",
            "clusterrolebinding/berth-webhook",
            "service/berth-webhook",
            "validatingwebhookconfiguration/berth"
        ]
    );
    let token = h
        .sim
        .issue_token(
            "berth-system",
            "berth-webhook",
            &[],
            Duration::from_secs(3600),
        )
        .unwrap();
    let as_webhook = h.sim.client_with_token(&token).await.unwrap();
    let (ca, url, _stop) = start_webhook(as_webhook).await;
    // The sim has no service network: point the installed configuration at the local server.
    let configurations = Api::<ValidatingWebhookConfiguration>::all(h.client.clone());
    let mut installed = configurations.get("berth").await.unwrap();
    let webhook = &mut installed.webhooks.as_mut().unwrap()[0];
    webhook.client_config.service = None;
    webhook.client_config.url = Some(url);
    webhook.client_config.ca_bundle = Some(k8s_openapi::ByteString(ca.into_bytes()));
    configurations
        .replace("berth", &PostParams::default(), &installed)
        .await
        .unwrap();
    let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), "default");
    let (code, message) = refused(
        workspaces
            .create(
                &PostParams::default(),
                &workspace(
                    "tolerant",
                    json!({"image": "devbox:1", "podTemplate": {"tolerations": [{"operator": "Exists"}]}}),
                ),
            )
            .await,
    );
    assert_eq!(
        code, 403,
        "the installed configuration calls the webhook: {message}"
    );
    let workspaces: Api<Workspace> = Api::namespaced(h.client.clone(), "default");
    workspaces
        .create(
            &PostParams::default(),
            &workspace(
                "admin",
                json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s"}]}}}),
            ),
        )
        .await
        .unwrap();
}

/// A webhook registered for CREATE only is asked about a server-side apply that creates the
/// Workspace (an apply is a PATCH, and it creates): mallory cannot get around it that way.
#[tokio::test]
async fn an_apply_that_creates_is_admitted_as_a_create() {
    let h = Harness::start().await;
    let (ca, url, _stop) = start_webhook(h.client.clone()).await;
    register_for(&h, &ca, &url, "Fail", &["CREATE"]).await;
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let applied = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
        "metadata": {"name": "grab"}, "spec": {"image": "devbox:1", "serviceAccountName": "deployer"}});
    let (code, message) = refused(
        as_mallory
            .patch(
                "grab",
                &PatchParams::apply("mallory"),
                &Patch::Apply(&applied),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create serviceaccounts/token \"deployer\""),
        "{message}"
    );
}
