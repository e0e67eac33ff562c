//! ValidatingAdmissionPolicy and its binding, through kube-rs and kubectl: matching, params,
//! variables, match conditions, validations with their messages and reasons, the validation
//! actions, the failure policy and the `authorizer` library answered by RBAC, in the real
//! server's words.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

use crate::{
    kubectl::Kubectl,
    support::{api_error, cluster},
};

async fn create_cluster_object(client: &kube::Client, kind: &str, object: Value) {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        kind,
    ));
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap();
}

/// A policy over config maps in the default namespace, bound with `actions`.
async fn policy(client: &kube::Client, name: &str, spec: Value, binding: Value) {
    let mut spec = spec;
    // Only the default namespace: a policy over every config map would also judge its own
    // params' (a real server would refuse those too).
    spec["matchConstraints"] = json!({
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]}]
    });
    create_cluster_object(
        client,
        "ValidatingAdmissionPolicy",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": spec}),
    )
    .await;
    let mut binding = binding;
    binding["policyName"] = json!(name);
    create_cluster_object(
        client,
        "ValidatingAdmissionPolicyBinding",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": format!("{name}-binding")}, "spec": binding}),
    )
    .await;
}

fn map(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "labels": {"team": "a"}}, "data": data})).unwrap()
}

#[tokio::test]
async fn a_failed_validation_denies_in_the_policys_words() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    policy(
        &client,
        "limits",
        json!({"validations": [
            {"expression": "!has(object.data) || !('forbidden' in object.data)"},
            {"expression": "!has(object.data) || size(object.data) <= 2", "messageExpression": "'at most 2 keys, not ' + string(size(object.data))", "reason": "Forbidden"},
            {"expression": "object.metadata.name != 'named'", "message": "  that name is taken  "}
        ]}),
        json!({"validationActions": ["Deny"]}),
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (code, reason, message) = api_error(
        maps.create(&PostParams::default(), &map("a", json!({"forbidden": "x"})))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "configmaps \"a\" is forbidden: ValidatingAdmissionPolicy 'limits' with binding 'limits-binding' denied request: failed expression: !has(object.data) || !('forbidden' in object.data)"
    );
    let (code, reason, message) = api_error(
        maps.create(
            &PostParams::default(),
            &map("b", json!({"x": "1", "y": "2", "z": "3"})),
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert!(
        message.ends_with("denied request: at most 2 keys, not 3"),
        "{message}"
    );
    let (_, _, message) = api_error(
        maps.create(&PostParams::default(), &map("named", json!({})))
            .await,
    );
    assert!(
        message.ends_with("denied request: that name is taken"),
        "{message}"
    );
    maps.create(&PostParams::default(), &map("fine", json!({"x": "1"})))
        .await
        .unwrap();
    assert!(
        maps.get_opt("a").await.unwrap().is_none(),
        "nothing denied was stored"
    );
}

#[tokio::test]
async fn params_variables_and_match_conditions_shape_what_is_checked() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let settings: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    policy(
        &client,
        "allowed-keys",
        json!({
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConditions": [{"name": "not-exempt", "expression": "!('exempt' in object.metadata.labels)"}],
            "variables": [
                {"name": "allowed", "expression": "params.data.allowed.split(',')"},
                {"name": "extra", "expression": "has(object.data) ? object.data.filter(k, !(k in variables.allowed)) : []"}
            ],
            "validations": [{"expression": "size(variables.extra) == 0", "messageExpression": "'keys not allowed: ' + variables.extra.join(', ')"}]
        }),
        json!({"validationActions": ["Deny"], "paramRef": {"name": "allowed-keys", "namespace": "kube-system", "parameterNotFoundAction": "Deny"}}),
    )
    .await;
    // No params yet: the binding cannot work, and says so.
    let (code, _, message) = api_error(
        maps.create(&PostParams::default(), &map("early", json!({"a": "1"})))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.ends_with("denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"),
        "{message}"
    );
    settings
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "allowed-keys"}, "data": {"allowed": "a,b"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    maps.create(
        &PostParams::default(),
        &map("ok", json!({"a": "1", "b": "2"})),
    )
    .await
    .unwrap();
    let (_, _, message) = api_error(
        maps.create(
            &PostParams::default(),
            &map("bad", json!({"a": "1", "c": "3"})),
        )
        .await,
    );
    assert!(
        message.ends_with("denied request: keys not allowed: c"),
        "{message}"
    );
    // A label the match condition looks for: not checked at all.
    let mut exempt = map("exempt", json!({"z": "1"}));
    exempt.metadata.labels = Some([("exempt".to_owned(), "yes".to_owned())].into());
    maps.create(&PostParams::default(), &exempt).await.unwrap();
    // A match condition that errors fails closed (failurePolicy Fail).
    let mut unlabelled = map("unlabelled", json!({"a": "1"}));
    unlabelled.metadata.labels = None;
    let (_, _, message) = api_error(maps.create(&PostParams::default(), &unlabelled).await);
    assert!(
        message.ends_with("denied request: expression '!('exempt' in object.metadata.labels)' resulted in error: no such key: labels"),
        "{message}"
    );
}

#[tokio::test]
async fn the_authorizer_asks_rbac_about_the_requesting_user() {
    let sim = cluster().await;
    let admin = sim.client().await.unwrap();
    policy(
        &admin,
        "secret-readers",
        json!({"validations": [{
            "expression": "!has(object.data) || !('secret' in object.data) || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name(object.data.secret).check('get').allowed()",
            "messageExpression": "'User \"' + request.userInfo.username + '\" cannot get secrets \"' + object.data.secret + '\"'",
            "reason": "Forbidden"
        }, {
            "expression": "!has(object.data) || !('three' in object.data) || (authorizer.group('').resource('pods').check('list').allowed() || true) && authorizer.group('').resource('pods').check('get').allowed() && authorizer.group('').resource('pods').check('watch').allowed()"
        }]}),
        json!({"validationActions": ["Deny"]}),
    )
    .await;
    // A user who may create config maps, and nothing else.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev"}})).unwrap(),
        )
        .await
        .unwrap();
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(admin.clone(), "default");
    roles
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "maps"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]})).unwrap())
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(admin.clone(), "default");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev-maps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "maps"},
            "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "default"}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let token = sim
        .issue_token("default", "dev", &[], Duration::from_secs(600))
        .unwrap();
    let as_dev: Api<ConfigMap> =
        Api::namespaced(sim.client_with_token(&token).await.unwrap(), "default");
    let (code, reason, message) = api_error(
        as_dev
            .create(
                &PostParams::default(),
                &map("peek", json!({"secret": "payments-db"})),
            )
            .await,
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "configmaps \"peek\" is forbidden: ValidatingAdmissionPolicy 'secret-readers' with binding 'secret-readers-binding' denied request: User \"system:serviceaccount:default:dev\" cannot get secrets \"payments-db\""
    );
    // The admin may read it: the same config map is admitted for them.
    let as_admin: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    as_admin
        .create(
            &PostParams::default(),
            &map("peek", json!({"secret": "payments-db"})),
        )
        .await
        .unwrap();
    // A third check in one expression is past the real server's cost limit.
    let (_, _, message) = api_error(
        as_admin
            .create(
                &PostParams::default(),
                &map("costly", json!({"three": "1"})),
            )
            .await,
    );
    assert!(
        message.contains("operation cancelled: actual cost limit exceeded"),
        "{message}"
    );
}

#[tokio::test]
async fn kubectl_shows_a_warn_binding_as_a_warning() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    policy(
        &client,
        "advice",
        json!({"validations": [{"expression": "has(object.data)", "message": "a config map without data is probably a mistake"}]}),
        json!({"validationActions": ["Warn"]}),
    )
    .await;
    let Some(kubectl) = Kubectl::for_cluster(&sim) else {
        return;
    };
    let output = kubectl
        .run_with_input(
            &["create", "-f", "-"],
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: empty, namespace: default}\n",
        )
        .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'advice' with binding 'advice-binding': a config map without data is probably a mistake"),
        "{stderr}"
    );
}

/// A policy that takes DELETE sees the object being deleted as `oldObject` (and `object`
/// null): it refuses deleting a protected config map in its words, through kube-rs and
/// kubectl, and lets the others go.
#[tokio::test]
async fn a_delete_is_judged_on_the_object_it_would_delete() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    create_cluster_object(
        &client,
        "ValidatingAdmissionPolicy",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "keep"}, "spec": {
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["configmaps"]}]
            },
            "validations": [{
                "expression": "object == null && (!has(oldObject.data) || !('protected' in oldObject.data))",
                "messageExpression": "'config map ' + oldObject.metadata.name + ' is protected (' + request.operation + ')'",
                "reason": "Forbidden"
            }]
        }}),
    )
    .await;
    create_cluster_object(
        &client,
        "ValidatingAdmissionPolicyBinding",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "keep"}, "spec": {"policyName": "keep", "validationActions": ["Deny"]}}),
    )
    .await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let post = PostParams::default();
    maps.create(&post, &map("vault", json!({"protected": "yes"})))
        .await
        .unwrap();
    maps.create(&post, &map("scratch", json!({})))
        .await
        .unwrap();
    let (code, reason, message) = api_error(maps.delete("vault", &Default::default()).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "configmaps \"vault\" is forbidden: ValidatingAdmissionPolicy 'keep' with binding 'keep' denied request: config map vault is protected (DELETE)"
    );
    assert!(maps.get_opt("vault").await.unwrap().is_some());
    maps.delete("scratch", &Default::default()).await.unwrap();
    if let Some(kubectl) = Kubectl::for_cluster(&sim) {
        let refused = kubectl.fails(&["delete", "configmap", "vault"]).await;
        assert!(
            refused.contains("denied request: config map vault is protected (DELETE)"),
            "{refused}"
        );
    }
}

/// A policy names a subresource as the real server reads it: `workspaces/status` takes status
/// writes (and `request.subResource` says so), `workspaces` takes only the main resource.
#[tokio::test]
async fn a_policy_on_a_status_subresource_takes_status_writes_only() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    crate::support::install_workspace_crd(&client).await;
    for (name, resource, expression) in [
        (
            "status-only",
            "workspaces/status",
            "!has(object.status) || !has(object.status.message) || object.status.message != 'forged' || request.subResource != 'status'",
        ),
        (
            "main-only",
            "workspaces",
            "object.metadata.name != 'frozen' || request.operation == 'CREATE'",
        ),
    ] {
        create_cluster_object(
            &client,
            "ValidatingAdmissionPolicy",
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": {
                "matchConstraints": {"resourceRules": [{"apiGroups": ["berth.dev"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [resource]}]},
                "validations": [{"expression": expression, "message": format!("{name} says no"), "reason": "Forbidden"}]
            }}),
        )
        .await;
        create_cluster_object(
            &client,
            "ValidatingAdmissionPolicyBinding",
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}),
        )
        .await;
    }
    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk("berth.dev", "v1alpha1", "Workspace"));
    let workspaces: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    workspaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": "frozen"}, "spec": {"image": "x:1"}})).unwrap())
        .await
        .unwrap();
    let status = |message: &str| kube::api::Patch::Merge(json!({"status": {"message": message}}));
    let params = kube::api::PatchParams::default();
    // The main resource's policy does not take a status write.
    workspaces
        .patch_status("frozen", &params, &status("fine"))
        .await
        .unwrap();
    let (code, _, message) = api_error(
        workspaces
            .patch_status("frozen", &params, &status("forged"))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: status-only says no"),
        "{message}"
    );
    let (code, _, message) = api_error(
        workspaces
            .patch(
                "frozen",
                &params,
                &kube::api::Patch::Merge(json!({"spec": {"image": "x:2"}})),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: main-only says no"),
        "{message}"
    );
}
