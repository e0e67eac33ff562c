//! Identity and RBAC: TokenRequest tokens with audience and expiry, TokenReview,
//! SubjectAccessReview, RBAC evaluation with the real 403 message, impersonation, and
//! events as two views.

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenReview},
    authorization::v1::SubjectAccessReview,
    core::v1::{Pod, ServiceAccount},
    rbac::v1::{ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;

use crate::support::{api_error, cluster};

async fn service_account(client: &kube::Client, namespace: &str, name: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
    )
    .await
    .unwrap();
}

async fn token_review(
    client: &kube::Client,
    token: &str,
    audiences: &[&str],
) -> Result<TokenReview, kube::Error> {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    reviews
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"token": token, "audiences": audiences}}))
                .unwrap(),
        )
        .await
}

#[tokio::test]
async fn service_accounts_are_denied_until_rbac_allows() {
    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    service_account(&admin, "default", "dev").await;
    let token = sim
        .issue_token("default", "dev", &[], Duration::from_secs(600))
        .unwrap();
    let as_dev = sim.client_with_token(&token).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(as_dev.clone(), "default");
    assert_eq!(
        api_error(pods.list(&ListParams::default()).await),
        (403, "Forbidden".into(), "pods is forbidden: User \"system:serviceaccount:default:dev\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"".into())
    );
    assert_eq!(
        api_error(pods.get("p").await),
        (403, "Forbidden".into(), "pods \"p\" is forbidden: User \"system:serviceaccount:default:dev\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\"".into())
    );

    let roles: Api<Role> = Api::namespaced(admin.clone(), "default");
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})).unwrap())
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "default");
    bindings
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": {"name": "dev-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "default"}]
        })).unwrap())
        .await
        .unwrap();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let other: Api<Pod> = Api::namespaced(as_dev.clone(), "kube-system");
    assert_eq!(
        api_error(other.list(&ListParams::default()).await).0,
        403,
        "a RoleBinding is namespaced"
    );
    let (code, _, message) = api_error(
        pods.create(&PostParams::default(), &crate::support::pod("p", "web"))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot create resource \"pods\""),
        "{message}"
    );

    // Unknown and expired tokens are 401.
    let stranger = sim.client_with_token("sim.not-a-token").await.unwrap();
    let stranger_pods: Api<Pod> = Api::namespaced(stranger, "default");
    assert_eq!(
        api_error(stranger_pods.list(&ListParams::default()).await).0,
        401
    );
}

#[tokio::test]
async fn token_request_and_token_review() {
    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    service_account(&admin, "default", "agent").await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let request: TokenRequest = serde_json::from_value(
        json!({"spec": {"audiences": ["berth-agent"], "expirationSeconds": 600}}),
    )
    .unwrap();
    let issued: TokenRequest = sas
        .create_subresource("token", "agent", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token;

    let review = token_review(&admin, &token, &["berth-agent"])
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(review.authenticated, Some(true));
    let user = review.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:agent")
    );
    assert!(
        user.groups
            .unwrap()
            .contains(&"system:serviceaccounts:default".to_owned())
    );
    assert_eq!(review.audiences, Some(vec!["berth-agent".to_owned()]));

    let wrong = token_review(&admin, &token, &["something-else"])
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(wrong.authenticated, Some(false));
    assert!(wrong.error.unwrap().contains("audiences"));

    // A token for another audience cannot call the API server.
    let client = sim.client_with_token(&token).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    assert_eq!(api_error(pods.list(&ListParams::default()).await).0, 401);

    let expired = sim
        .issue_token("default", "agent", &["berth-agent"], Duration::ZERO)
        .unwrap();
    let review = token_review(&admin, &expired, &["berth-agent"])
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(review.authenticated, Some(false));
    assert!(review.error.unwrap().contains("token has expired"));

    let too_short: TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 60}})).unwrap();
    let (code, _, message) = api_error(
        sas.create_subresource::<_, TokenRequest>(
            "token",
            "agent",
            &PostParams::default(),
            &too_short,
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("may not specify a duration less than 10 minutes"),
        "{message}"
    );
    let (code, _, _) = api_error(
        sas.create_subresource::<_, TokenRequest>(
            "token",
            "nobody",
            &PostParams::default(),
            &request,
        )
        .await,
    );
    assert_eq!(code, 404);

    // A token outlives its service account only as garbage: deleted, or deleted and created
    // again with a new UID, the account's old tokens are invalid.
    let api_token = sim
        .issue_token("default", "agent", &[], Duration::from_secs(600))
        .unwrap();
    let as_agent = sim.client_with_token(&api_token).await.unwrap();
    sas.delete("agent", &Default::default()).await.unwrap();
    service_account(&admin, "default", "agent").await;
    let review = token_review(&admin, &token, &["berth-agent"])
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(review.authenticated, Some(false));
    assert_eq!(
        review.error.as_deref(),
        Some("[invalid bearer token, service account token has been invalidated]")
    );
    let pods: Api<Pod> = Api::namespaced(as_agent, "default");
    assert_eq!(api_error(pods.list(&ListParams::default()).await).0, 401);
}

#[tokio::test]
async fn auth_delegator_grants_reviews() {
    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    service_account(&admin, "default", "ws").await;
    let token = sim
        .issue_token("default", "ws", &[], Duration::from_secs(600))
        .unwrap();
    let as_ws = sim.client_with_token(&token).await.unwrap();
    let (code, _, message) = api_error(token_review(&as_ws, &token, &[]).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:default:ws\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
    );

    let crbs: Api<ClusterRoleBinding> = Api::all(admin.clone());
    crbs.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": {"name": "ws-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "ws", "namespace": "default"}]
    })).unwrap())
    .await
    .unwrap();
    let review = token_review(&as_ws, &token, &[]).await.unwrap();
    assert_eq!(review.status.unwrap().authenticated, Some(true));

    let sars: Api<SubjectAccessReview> = Api::all(as_ws.clone());
    let ask = |user: &str, verb: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({"spec": {"user": user, "resourceAttributes": {"namespace": "default", "verb": verb, "group": "berth.dev", "resource": "workspaces", "subresource": "agent", "name": "w"}}})).unwrap()
    };
    let denied = sars
        .create(
            &PostParams::default(),
            &ask("system:serviceaccount:berth:controller", "use"),
        )
        .await
        .unwrap();
    assert!(!denied.status.unwrap().allowed);
    let as_admin = sars
        .create(&PostParams::default(), &ask("kubernetes-admin", "use"))
        .await
        .unwrap();
    assert!(
        !as_admin.status.unwrap().allowed,
        "SubjectAccessReview checks RBAC, where the user has no binding"
    );
    let crs: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    assert!(
        crs.get("system:auth-delegator").await.is_ok(),
        "the built-in ClusterRole exists"
    );
}

#[tokio::test]
async fn impersonation_is_for_those_allowed_to() {
    let sim = cluster().await;
    let mut config = kube::Config::from_custom_kubeconfig(sim.kubeconfig(), &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some("system:serviceaccount:default:default".into());
    let impersonating = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(impersonating, "default");
    let (code, _, message) = api_error(pods.list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert!(
        message.contains("User \"system:serviceaccount:default:default\" cannot list"),
        "{message}"
    );

    let admin = sim.client().await.unwrap();
    service_account(&admin, "default", "plain").await;
    let token = sim
        .issue_token("default", "plain", &[], Duration::from_secs(600))
        .unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        sim.kubeconfig_with_token("plain", &token),
        &Default::default(),
    )
    .await
    .unwrap();
    let config_for = config.clone();
    config.auth_info.impersonate = Some("kubernetes-admin".into());
    let sneaky = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(sneaky, "default");
    let (code, _, message) = api_error(pods.list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot impersonate resource \"users\""),
        "{message}"
    );

    // Allowed to impersonate users only: a service account's name, or a group, is refused
    // as the API server refuses it.
    berth_sim::manifests::create_all(
        &admin,
        r#"{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "users-only"},
  "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}]}
---
{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "plain-users-only"},
  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "users-only"},
  "subjects": [{"kind": "ServiceAccount", "name": "plain", "namespace": "default"}]}"#,
        "default",
    )
    .await
    .unwrap();
    let as_plain = |user: &str, groups: &[&str]| {
        let mut config = config_for.clone();
        config.auth_info.impersonate = Some(user.into());
        config.auth_info.impersonate_groups =
            (!groups.is_empty()).then(|| groups.iter().map(|g| g.to_string()).collect());
        Api::<Pod>::namespaced(kube::Client::try_from(config).unwrap(), "default")
    };
    let (code, _, message) = api_error(
        as_plain("alice", &["admins"])
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "groups \"admins\" is forbidden: User \"system:serviceaccount:default:plain\" cannot impersonate resource \"groups\" in API group \"\" at the cluster scope"
    );
    let (code, _, message) = api_error(
        as_plain("system:serviceaccount:team:bot", &[])
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "serviceaccounts \"bot\" is forbidden: User \"system:serviceaccount:default:plain\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"team\""
    );
    let (code, _, message) = api_error(as_plain("alice", &[]).list(&ListParams::default()).await);
    assert_eq!(code, 403, "alice herself may not list pods");
    assert!(message.contains("User \"alice\" cannot list"), "{message}");
}

#[tokio::test]
async fn events_are_two_views_of_the_same_objects() {
    use k8s_openapi::api::{core::v1::Event as CoreEvent, events::v1::Event};
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = pods
        .create(&PostParams::default(), &crate::support::pod("p", "web"))
        .await
        .unwrap();
    let reference = kube::Resource::object_ref(&pod, &());

    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "berth".into(),
            instance: Some("berth-0".into()),
        },
    );
    recorder
        .publish(
            &kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: "PodRejected".into(),
                note: Some("Pod was rejected: OutOfcpu".into()),
                action: "Recreate".into(),
                secondary: None,
            },
            &reference,
        )
        .await
        .unwrap();

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let uid = pod.metadata.uid.clone().unwrap();
    let found = core
        .list(
            &ListParams::default().fields(&format!("involvedObject.uid={uid},reason=PodRejected")),
        )
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    let event = &found.items[0];
    assert_eq!(event.message.as_deref(), Some("Pod was rejected: OutOfcpu"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reporting_component.as_deref(), Some("berth"));

    let v1: Api<Event> = Api::namespaced(client.clone(), "default");
    let same = v1
        .get(event.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(same.note.as_deref(), Some("Pod was rejected: OutOfcpu"));
    assert_eq!(same.regarding.unwrap().uid.as_deref(), Some(uid.as_str()));
    let by_regarding = v1
        .list(&ListParams::default().fields(&format!("regarding.uid={uid}")))
        .await
        .unwrap();
    assert_eq!(by_regarding.items.len(), 1);
    let _ = ListParams::default();
}

/// Server-side apply that creates an object needs `create` as well as `patch`, as on a real
/// API server; applying to an object that exists needs only `patch`.
#[tokio::test]
async fn an_apply_that_creates_is_authorized_as_create() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};

    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    service_account(&admin, "default", "applier").await;
    let roles: Api<Role> = Api::namespaced(admin.clone(), "default");
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "patch-only"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "default");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "applier"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patch-only"},
                "subjects": [{"kind": "ServiceAccount", "name": "applier", "namespace": "default"}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let token = sim
        .issue_token("default", "applier", &[], Duration::from_secs(600))
        .unwrap();
    let as_applier: Api<ConfigMap> =
        Api::namespaced(sim.client_with_token(&token).await.unwrap(), "default");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "1"}});
    let params = PatchParams::apply("applier");
    assert_eq!(
        api_error(as_applier.patch("settings", &params, &Patch::Apply(&body)).await),
        (403, "Forbidden".into(), "configmaps is forbidden: User \"system:serviceaccount:default:applier\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\"".into())
    );
    Api::<ConfigMap>::namespaced(admin, "default")
        .patch(
            "settings",
            &PatchParams::apply("admin"),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"b": "2"}});
    as_applier
        .patch("settings", &params, &Patch::Apply(&changed))
        .await
        .unwrap();
}

/// What every cluster has: the API server's `default/kubernetes` Service, and the user-facing
/// ClusterRoles `view`, `edit` and `admin` to bind in a namespace.
#[tokio::test]
async fn the_kubernetes_service_and_the_user_facing_roles_exist() {
    use k8s_openapi::api::core::v1::{Secret, Service};

    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    let service = Api::<Service>::namespaced(admin.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap();
    let spec = service.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
    assert_eq!(spec.ports.unwrap()[0].port, 443);

    for (account, role) in [("viewer", "view"), ("editor", "edit"), ("owner", "admin")] {
        service_account(&admin, "default", account).await;
        Api::<RoleBinding>::namespaced(admin.clone(), "default")
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": account},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}]}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let as_account = |account: &'static str| {
        let token = sim
            .issue_token("default", account, &[], Duration::from_secs(600))
            .unwrap();
        let sim = &sim;
        async move { sim.client_with_token(&token).await.unwrap() }
    };
    let secret = |name: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))
            .unwrap()
    };
    let role = |name: &str| -> Role {
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": []})).unwrap()
    };
    let post = PostParams::default();

    let viewer = as_account("viewer").await;
    Api::<Pod>::namespaced(viewer.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(
        api_error(
            Api::<Secret>::namespaced(viewer, "default")
                .create(&post, &secret("v"))
                .await
        )
        .0,
        403
    );
    let editor = as_account("editor").await;
    Api::<Secret>::namespaced(editor.clone(), "default")
        .create(&post, &secret("e"))
        .await
        .unwrap();
    assert_eq!(
        api_error(
            Api::<Role>::namespaced(editor, "default")
                .create(&post, &role("e"))
                .await
        )
        .0,
        403
    );
    let owner = as_account("owner").await;
    Api::<Role>::namespaced(owner, "default")
        .create(&post, &role("o"))
        .await
        .unwrap();
}
