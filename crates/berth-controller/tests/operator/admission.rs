//! The admission policy of `deploy/admission/` end to end: a user who may create workspaces
//! but not read a secret, run as a service account or mount a claim cannot get them through a
//! Workspace, and what the platform's allow-lists do not allow is refused at the API; the
//! API server (the sim) evaluates the policy itself, with the CEL `authorizer`.

use std::time::Duration;

use berth_api::{Phase, Workspace};
use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

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

/// A user who may create, read and change workspaces in `default`, and nothing else.
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

/// What mallory sees: `kubectl create` fails with 403 and the policy's words naming them, the
/// verb, the object and the field. A workspace that uses only what they may use runs (the
/// operator's own writes pass); changing a spec is checked as setting it; once they may read a
/// secret, a workspace may too.
#[tokio::test]
async fn a_workspace_grants_nothing_its_author_does_not_already_have() {
    let h = Harness::start().await;
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let post = PostParams::default();
    let denied = |rest: &str| {
        format!(
            "workspaces.berth.dev \"grab\" is forbidden: ValidatingAdmissionPolicy 'workspaces.berth.dev' with binding 'workspaces.berth.dev' denied request: User \"{MALLORY}\" cannot {rest}; a workspace may use only what its author may use directly"
        )
    };
    for (spec, rest) in [
        (
            json!({"image": "devbox:1", "serviceAccountName": "deployer"}),
            "create serviceaccounts/token \"deployer\" in the namespace \"default\", which spec.serviceAccountName names",
        ),
        (
            json!({"image": "devbox:1", "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "payments-db", "key": "password"}}}]}),
            "get secrets \"payments-db\" in the namespace \"default\", which spec.env[name=DB].valueFrom.secretKeyRef names",
        ),
        (
            json!({"image": "devbox:1", "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}]}),
            "get configmaps \"settings\" in the namespace \"default\", which spec.env[name=MODE].valueFrom.configMapKeyRef names",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}),
            "get secrets \"payments-db\" in the namespace \"default\", which spec.podTemplate.volumes.secrets[mountPath=/s] names",
        ),
        (
            json!({"image": "devbox:1", "command": ["sh"], "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}, "content": {"git": {"url": "https://example.com/org/app.git", "auth": {"secretName": "payments-db"}}}}),
            "get secrets \"payments-db\" in the namespace \"default\", which spec.content.git.auth.secretName names",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"data": [{"claimName": "bob-home", "mountPath": "/data"}]}}}),
            "get persistentvolumeclaims \"bob-home\" in the namespace \"default\", which spec.podTemplate.volumes.data[mountPath=/data] names",
        ),
    ] {
        assert_eq!(
            refused(as_mallory.create(&post, &workspace("grab", spec)).await),
            (403, denied(rest))
        );
    }
    assert!(as_mallory.get_opt("grab").await.unwrap().is_none());
    // What the platform's allow-lists do not allow is refused at the API too.
    let (code, message) = refused(
        as_mallory
            .create(&post, &workspace("grab", json!({"image": "devbox:1", "podTemplate": {"tolerations": [{"operator": "Exists"}]}})))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: spec.podTemplate.tolerations: a toleration of a taint key the platform does not allow; it allows tolerations of: none (ConfigMap berth-system/berth-admission, allowed-tolerations); ask the platform team to allow it"),
        "{message}"
    );
    // Credentials in a repository URL are refused by the API server (the CRD), pointing at
    // the Secret that should hold them.
    let (code, message) = refused(
        as_mallory
            .create(&post, &workspace("grab", json!({"image": "devbox:1", "command": ["sh"], "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}, "content": {"git": {"url": "https://ghp_t0ken@github.com/org/app.git"}}})))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("spec.content.git.url: Forbidden: a user name or token in the URL would be stored in the Workspace for anyone who can read it, and shown in its status: put the credentials in a kubernetes.io/basic-auth Secret and name it in spec.content.git.auth.secretName"), "{message}");
    // Pod affinity that selects pods of other namespaces tells where they run: refused unless
    // the platform allows those namespaces; its own namespace is fine.
    let (code, message) = refused(
        as_mallory
            .create(&post, &workspace("grab", json!({"image": "devbox:1", "podTemplate": {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "namespaces": ["default", "payments"], "labelSelector": {"matchLabels": {"app": "db"}}}}]}}}})))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: spec.podTemplate.affinity: a pod affinity term selects pods of another namespace (namespaces, or a namespaceSelector); the platform allows pod affinity into: none (ConfigMap berth-system/berth-admission, allowed-affinity-namespaces; * allows a namespaceSelector too); ask the platform team to allow it"),
        "{message}"
    );
    let (code, _) = refused(
        as_mallory
            .create(&post, &workspace("grab", json!({"image": "devbox:1", "podTemplate": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}]}}}})))
            .await,
    );
    assert_eq!(code, 403);
    let (_, message) = refused(
        as_mallory
            .create(&post, &workspace("grab", json!({"image": "devbox:1", "podTemplate": {"metadata": {"labels": {"app": "payments"}}}})))
            .await,
    );
    assert!(
        message.contains("key \"app\" is reserved or its prefix is not allowed"),
        "{message}"
    );

    // What mallory may use runs, and the operator's own writes pass the policy.
    as_mallory
        .create(&post, &workspace("honest", json!({"image": "devbox:1"})))
        .await
        .unwrap();
    h.until_phase("honest", Phase::Running).await;

    // Changing the spec is checked as setting it.
    let grab = json!({"spec": {"podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}});
    let (code, message) = refused(
        as_mallory
            .patch("honest", &PatchParams::default(), &Patch::Merge(&grab))
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot get secrets \"payments-db\""),
        "{message}"
    );

    // A server-side apply that creates is admitted as a create.
    let applied = workspace(
        "applied",
        json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}),
    );
    let (code, message) = refused(
        as_mallory
            .patch(
                "applied",
                &PatchParams::apply("mallory"),
                &Patch::Apply(&applied),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot get secrets \"payments-db\""),
        "{message}"
    );

    // Starting or stopping someone's workspace names nothing new: not checked (the gateway's
    // start button and `berth start` work for a workspace naming a secret), but any other
    // change made with it is.
    h.create(
        "admins",
        json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "payments-db", "mountPath": "/s"}]}}}),
    )
    .await;
    as_mallory
        .patch(
            "admins",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    let (code, message) = refused(
        as_mallory
            .patch(
                "admins",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false, "command": ["sh"]}})),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.contains("cannot get secrets \"payments-db\""),
        "{message}"
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

/// The binding of the policy, as `deploy/admission/` has it.
fn binding() -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "workspaces.berth.dev"},
        "spec": {"policyName": "workspaces.berth.dev", "validationActions": ["Deny"],
            "paramRef": {"name": "berth-admission", "namespace": "berth-system", "parameterNotFoundAction": "Deny"}}})
}

fn bindings(h: &Harness) -> Api<kube::api::DynamicObject> {
    let resource = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
    ));
    Api::all_with(h.client.clone(), &resource)
}

/// Closed when absent: while the policy is not bound to deny, a workspace that names a secret
/// gets no pod and says why and how to install it; a plain one runs. Once the binding is
/// back, a workspace admitted before the gap (stopped meanwhile) starts by itself, but the
/// one written during the gap stays without a pod until its spec is checked: mallory setting
/// `berth.dev/check` is refused (she may not read the secret), the admin's check starts it.
#[tokio::test]
async fn without_the_admission_policy_a_workspace_naming_a_secret_gets_no_pod() {
    let h = Harness::start().await;
    create::<k8s_openapi::api::core::v1::Secret>(
        &h.client,
        "default",
        json!({"metadata": {"name": "git"}, "stringData": {"token": "x"}}),
    )
    .await;
    let secret_volume = json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "git", "mountPath": "/secrets/git"}]}}});
    h.create("before", json!({"image": "devbox:1", "paused": true, "podTemplate": {"volumes": {"secrets": [{"secretName": "git", "mountPath": "/secrets/git"}]}}}))
        .await;
    h.until_phase("before", Phase::Stopped).await;
    h.without_admission_policy().await;
    let ws = h.create("named", secret_volume).await;
    h.create("plain", json!({"image": "devbox:1"})).await;
    // What a user sees: Error, AdmissionNotInstalled, what is missing and how to install it.
    let seen = h.until_not_ready("named", "AdmissionNotInstalled").await;
    assert_eq!(crate::support::phase_of(&seen), Some(Phase::Error));
    assert_eq!(
        crate::support::message_of(&seen),
        "No pod until the admission policy is installed; nothing checked that this workspace's author may use what spec.podTemplate.volumes.secrets[0] names (no ValidatingAdmissionPolicyBinding of workspaces.berth.dev has validationActions Deny). Install it with kubectl apply -k deploy/ (Kubernetes 1.30+); this spec was written meanwhile, so it is checked once its author sets a new value of the annotation berth.dev/check."
    );
    h.until_phase("plain", Phase::Running).await;
    // Resumed during the gap, the workspace admitted before waits too, and says it will start.
    h.patch_spec("before", json!({"paused": false})).await;
    let waiting = h.until_not_ready("before", "AdmissionNotInstalled").await;
    assert!(
        crate::support::message_of(&waiting).ends_with("the workspace then starts by itself."),
        "{}",
        crate::support::message_of(&waiting)
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), "default");
    assert!(pods.get_opt("named-ws").await.unwrap().is_none());
    let events = crate::support::events_about(&h, &ws.metadata.uid.clone().unwrap()).await;
    assert!(
        events
            .iter()
            .any(|(reason, _)| reason == "AdmissionNotInstalled"),
        "{events:?}"
    );

    bindings(&h)
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding()).unwrap(),
        )
        .await
        .unwrap();
    h.until_phase("before", Phase::Running).await;
    let unchecked = h.until_not_ready("named", "AdmissionUnchecked").await;
    assert_eq!(
        crate::support::message_of(&unchecked),
        "No pod: this spec (generation 1) was written while the admission policy was not enforcing, so nothing checked that its author may use what spec.podTemplate.volumes.secrets[0] names. To have it checked, its author sets a new value of the annotation berth.dev/check: kubectl annotate workspace named berth.dev/check=$(date +%s) --overwrite; it then starts, or the API server says what its author may not use."
    );
    assert!(pods.get_opt("named-ws").await.unwrap().is_none());
    // Someone who may not read the secret cannot vouch for it.
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let check = |value: &str| {
        Patch::Merge(json!({"metadata": {"annotations": {"berth.dev/check": value}}}))
    };
    let (code, message) = refused(
        as_mallory
            .patch("named", &PatchParams::default(), &check("1"))
            .await,
    );
    assert_eq!(code, 403);
    assert!(message.contains("cannot get secrets \"git\""), "{message}");
    // Its status record is the operator's.
    let forged = refused(
        as_mallory
            .patch_status(
                "named",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"admission": {"generation": 1, "checked": true}}})),
            )
            .await,
    );
    assert_eq!(forged.0, 403, "{}", forged.1);
    h.workspaces()
        .patch("named", &PatchParams::default(), &check("2"))
        .await
        .unwrap();
    h.until_phase("named", Phase::Running).await;
}

/// A Deny binding that leaves the workspace's namespace out, or one that only warns, is no
/// check there: closed as when absent.
#[tokio::test]
async fn a_binding_that_does_not_deny_in_the_namespace_counts_as_not_installed() {
    let h = Harness::start().await;
    h.without_admission_policy().await;
    let mut elsewhere = binding();
    elsewhere["spec"]["matchResources"] =
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}}});
    bindings(&h)
        .create(
            &PostParams::default(),
            &serde_json::from_value(elsewhere).unwrap(),
        )
        .await
        .unwrap();
    h.create(
        "named",
        json!({"image": "devbox:1", "serviceAccountName": "deployer"}),
    )
    .await;
    // The binding may reach the operator's cache after the workspace (under load): the first
    // status may then say no binding denies at all, and the binding's event corrects it.
    let elsewhere = "(the ValidatingAdmissionPolicyBinding workspaces.berth.dev does not select namespace default (its namespaceSelector))";
    let seen = h
        .until(
            "named",
            "Ready=False (AdmissionNotInstalled), naming the binding",
            |ws| {
                crate::support::condition(ws, "Ready")
                    .is_some_and(|c| c.status == "False" && c.reason == "AdmissionNotInstalled")
                    && crate::support::message_of(ws).contains(elsewhere)
            },
        )
        .await;
    assert!(
        crate::support::message_of(&seen).contains(elsewhere),
        "{}",
        crate::support::message_of(&seen)
    );
    bindings(&h)
        .delete("workspaces.berth.dev", &Default::default())
        .await
        .unwrap();
    let mut warns = binding();
    warns["spec"]["validationActions"] = json!(["Warn"]);
    bindings(&h)
        .create(
            &PostParams::default(),
            &serde_json::from_value(warns).unwrap(),
        )
        .await
        .unwrap();
    eventually_says(
        &h,
        "named",
        "no ValidatingAdmissionPolicyBinding of workspaces.berth.dev has validationActions Deny",
    )
    .await;
}

async fn eventually_says(h: &Harness, name: &str, words: &str) {
    crate::support::eventually(
        std::time::Duration::from_secs(30),
        "the workspace to say it",
        || async {
            let ws = h.workspaces().get(name).await.unwrap();
            crate::support::message_of(&ws)
                .contains(words)
                .then_some(())
        },
    )
    .await;
}

/// An operator run with another `--agent-port`: the platform says so in the admission
/// ConfigMap, and a workspace declaring that port is refused at the API; the operator refuses
/// to start one the API let through (it was created before the ConfigMap said so).
#[tokio::test]
async fn the_agents_port_is_refused_whatever_the_operator_set_it_to() {
    let mut config = crate::support::test_config();
    config.policy.pod.agent_port = 6000;
    let h = Harness::start_with(crate::support::sim_config(), config).await;
    h.create(
        "early",
        json!({"image": "devbox:1", "ports": [{"name": "app", "port": 6000}]}),
    )
    .await;
    let ws = h.until_phase("early", Phase::Error).await;
    assert!(
        crate::support::message_of(&ws).ends_with("spec.ports[0]: port 6000 is the Berth agent's in every workspace pod (the operator's --agent-port); pick another port"),
        "{}",
        crate::support::message_of(&ws)
    );
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(h.client.clone(), "berth-system");
    maps.patch(
        "berth-admission",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"agent-port": "6000"}})),
    )
    .await
    .unwrap();
    let (code, message) = refused(
        h.workspaces()
            .create(
                &PostParams::default(),
                &workspace(
                    "late",
                    json!({"image": "devbox:1", "ports": [{"name": "app", "port": 6000}]}),
                ),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.ends_with("denied request: spec.ports: port 6000 is where the Berth agent listens in every workspace pod (--agent-port; ConfigMap berth-system/berth-admission, agent-port); pick another port"),
        "{message}"
    );
}

/// One workspace naming each kind of object a spec can name, one per row, and the field
/// `WorkspaceSpec::references()` reports for it; `everything` names them all. The rows must
/// be exactly the references of `everything`, so a new kind of reference needs a row here.
fn each_reference() -> (Value, Vec<(Value, &'static str)>) {
    let home = json!({"home": {"size": "1Gi", "mountPath": "/home/dev"}});
    let rows = vec![
        (
            json!({"image": "devbox:1", "serviceAccountName": "deployer"}),
            "spec.serviceAccountName",
        ),
        (
            json!({"image": "devbox:1", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "sa", "key": "k"}}}]}),
            "spec.env[0].valueFrom.secretKeyRef",
        ),
        (
            json!({"image": "devbox:1", "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]}),
            "spec.env[0].valueFrom.configMapKeyRef",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"secrets": [{"secretName": "sv", "mountPath": "/s"}]}}}),
            "spec.podTemplate.volumes.secrets[0]",
        ),
        (
            json!({"image": "devbox:1", "podTemplate": {"volumes": {"data": [{"claimName": "cl", "mountPath": "/data"}]}}}),
            "spec.podTemplate.volumes.data[0]",
        ),
        (
            json!({"image": "devbox:1", "command": ["sh"], "podTemplate": {"volumes": home}, "content": {"git": {"url": "https://example.com/org/app.git", "auth": {"secretName": "sg"}}}}),
            "spec.content.git.auth.secretName",
        ),
    ];
    let everything = json!({
        "image": "devbox:1", "command": ["sh"], "serviceAccountName": "deployer",
        "env": [
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "sa", "key": "k"}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
        ],
        "podTemplate": {"volumes": {
            "home": {"size": "1Gi", "mountPath": "/home/dev"},
            "data": [{"claimName": "cl", "mountPath": "/data"}],
            "secrets": [{"secretName": "sv", "mountPath": "/s"}]
        }},
        "content": {"git": {"url": "https://example.com/org/app.git", "auth": {"secretName": "sg"}}}
    });
    let spec: berth_api::WorkspaceSpec = serde_json::from_value(everything.clone()).unwrap();
    let listed: Vec<String> = spec
        .references()
        .iter()
        .map(|r| berth_api::workspace::Reference::unindexed(&r.field))
        .collect();
    let rows_say: Vec<String> = rows
        .iter()
        .map(|(_, f)| berth_api::workspace::Reference::unindexed(f))
        .collect();
    assert_eq!(
        {
            let mut l = listed.clone();
            l.sort();
            l
        },
        {
            let mut r = rows_say.clone();
            r.sort();
            r
        },
        "each reference has its row"
    );
    (everything, rows)
}

/// The RBAC rule that lets its holder use what `reference` names directly.
fn rule_for(reference: &berth_api::workspace::Reference) -> Value {
    let resource = match reference.subresource {
        "" => reference.resource.to_owned(),
        sub => format!("{}/{sub}", reference.resource),
    };
    json!({"apiGroups": [""], "resources": [resource], "resourceNames": [reference.name], "verbs": [reference.verb]})
}

/// The admission policy checks every reference: mallory may use all the objects of
/// `everything` but one, and the refusal names that one's field, for each in turn.
#[tokio::test]
async fn the_admission_policy_checks_every_reference_the_operator_knows() {
    let h = Harness::start().await;
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let (everything, rows) = each_reference();
    let spec: berth_api::WorkspaceSpec = serde_json::from_value(everything.clone()).unwrap();
    let references = spec.references();
    let roles: Api<Role> = Api::namespaced(h.client.clone(), "default");
    create::<RoleBinding>(
        &h.client,
        "default",
        json!({"metadata": {"name": "mallory-grants"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "grants"},
        "subjects": [{"kind": "ServiceAccount", "name": "mallory", "namespace": "default"}]}),
    )
    .await;
    assert_eq!(references.len(), rows.len());
    for (i, held_back) in references.iter().enumerate() {
        let rules: Vec<Value> = references
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, r)| rule_for(r))
            .collect();
        let _ = roles.delete("grants", &Default::default()).await;
        create::<Role>(
            &h.client,
            "default",
            json!({"metadata": {"name": "grants"}, "rules": rules}),
        )
        .await;
        let (code, message) = refused(
            as_mallory
                .create(
                    &PostParams::default(),
                    &workspace("grab", everything.clone()),
                )
                .await,
        );
        assert_eq!(code, 403, "{message}");
        let field = message
            .split(", which ")
            .nth(1)
            .and_then(|rest| rest.split(" names;").next())
            .unwrap_or_else(|| panic!("names a field: {message}"));
        assert_eq!(
            berth_api::workspace::Reference::unindexed(field),
            berth_api::workspace::Reference::unindexed(&held_back.field),
            "{held_back:?}: {message}"
        );
        assert!(
            message.contains(&format!("\"{}\"", held_back.name)),
            "{message}"
        );
    }
    // With all of them, the workspace is admitted.
    let _ = roles.delete("grants", &Default::default()).await;
    let rules: Vec<Value> = references.iter().map(rule_for).collect();
    create::<Role>(
        &h.client,
        "default",
        json!({"metadata": {"name": "grants"}, "rules": rules}),
    )
    .await;
    as_mallory
        .create(&PostParams::default(), &workspace("grab", everything))
        .await
        .unwrap();
}

/// Closed when absent, for every reference: each workspace naming one kind of object gets no
/// pod while the policy is not enforcing, and says which field; each starts once it is.
#[tokio::test]
async fn without_the_admission_policy_no_reference_escapes() {
    let h = Harness::start().await;
    h.without_admission_policy().await;
    let (_, rows) = each_reference();
    for (i, (spec, _)) in rows.iter().enumerate() {
        h.create(&format!("ref-{i}"), spec.clone()).await;
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), "default");
    for (i, (_, field)) in rows.iter().enumerate() {
        let name = format!("ref-{i}");
        let seen = h.until_not_ready(&name, "AdmissionNotInstalled").await;
        let message = crate::support::message_of(&seen);
        assert!(
            message.starts_with(&format!("No pod until the admission policy is installed; nothing checked that this workspace's author may use what {field} names")),
            "{name}: {message}"
        );
        assert!(pods.get_opt(&format!("{name}-ws")).await.unwrap().is_none());
    }
}

/// A user of `examples/workspace-author.yaml`'s Role, as a service account of `default`.
async fn author(h: &Harness, name: &str) -> Client {
    create::<ServiceAccount>(&h.client, "default", json!({"metadata": {"name": name}})).await;
    let _ = Api::<Role>::namespaced(h.client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "workspace-author"},
                "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]}]}))
            .unwrap(),
        )
        .await;
    create::<RoleBinding>(&h.client, "default", json!({"metadata": {"name": format!("{name}-author")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workspace-author"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}))
    .await;
    let token = h
        .sim
        .issue_token("default", name, &[], Duration::from_secs(3600))
        .unwrap();
    h.sim.client_with_token(&token).await.unwrap()
}

/// Per-owner workspaces (`deploy/admission-owners/`): two authors with the same Role; each
/// workspace records its creator, who alone (or a holder of `admin`) may change its spec,
/// hand it over or delete it; the other may start and stop it. An unowned workspace is the
/// admins'.
#[tokio::test]
async fn an_author_cannot_change_another_authors_workspace() {
    let h = Harness::start().await;
    berth_sim::manifests::create_all(&h.client, berth_controller::rbac::OWNERS_POLICY, "default")
        .await
        .unwrap();
    let alice_user = "system:serviceaccount:default:alice";
    let alice: Api<Workspace> = Api::namespaced(author(&h, "alice").await, "default");
    let bob: Api<Workspace> = Api::namespaced(author(&h, "bob").await, "default");
    let post = PostParams::default();
    let owned = |owner: &str| {
        let mut ws = workspace(
            "alices",
            json!({"image": "devbox:1", "command": ["sleep", "1d"]}),
        );
        ws.metadata.annotations = Some([("berth.dev/owner".to_owned(), owner.to_owned())].into());
        ws
    };
    // The owner is whoever creates it, and says so.
    let (code, message) = refused(
        alice
            .create(&post, &workspace("alices", json!({"image": "devbox:1"})))
            .await,
    );
    assert_eq!(code, 403);
    assert!(message.ends_with(&format!("metadata.annotations[berth.dev/owner]: a workspace records who owns it; set it to your own user name, \"{alice_user}\" (only a holder of the verb admin on workspaces may create one without an owner or for someone else)")), "{message}");
    let (_, message) = refused(
        alice
            .create(&post, &owned("system:serviceaccount:default:bob"))
            .await,
    );
    assert!(
        message.contains(", not \"system:serviceaccount:default:bob\""),
        "{message}"
    );
    alice.create(&post, &owned(alice_user)).await.unwrap();

    // Bob may not change it, take it, or delete it...
    let change = Patch::Merge(json!({"spec": {"command": ["sh", "-c", "steal"]}}));
    let (code, message) = refused(bob.patch("alices", &PatchParams::default(), &change).await);
    assert_eq!(code, 403);
    assert!(message.ends_with(&format!("User \"system:serviceaccount:default:bob\" cannot change workspace alices: it is owned by \"{alice_user}\"; only its owner or a holder of the verb admin on workspaces (API group berth.dev) may, and anyone allowed to patch it may start or stop it (spec.paused)")), "{message}");
    let take = Patch::Merge(
        json!({"metadata": {"annotations": {"berth.dev/owner": "system:serviceaccount:default:bob"}}}),
    );
    assert_eq!(
        refused(bob.patch("alices", &PatchParams::default(), &take).await).0,
        403
    );
    match bob.delete("alices", &Default::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403);
            assert!(
                status.message.contains("cannot delete workspace alices"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // ...but may stop and start it.
    bob.patch(
        "alices",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": true}})),
    )
    .await
    .unwrap();
    // Alice may change her own; an admin may change anyone's.
    alice
        .patch(
            "alices",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"command": ["sleep", "2d"]}})),
        )
        .await
        .unwrap();
    h.workspaces()
        .patch("alices", &PatchParams::default(), &take)
        .await
        .unwrap();
    bob.patch("alices", &PatchParams::default(), &change)
        .await
        .unwrap();
    // An unowned workspace (an admin's) is the admins'.
    h.create("shared", json!({"image": "devbox:1"})).await;
    let (_, message) = refused(
        alice
            .patch("shared", &PatchParams::default(), &change)
            .await,
    );
    assert!(
        message.contains("it has no owner (annotation berth.dev/owner)"),
        "{message}"
    );
}
