//! WorkspaceKinds end to end: a workspace of a kind is shaped by it at its start, keeps that
//! shape through every change of the kind (no pod restarted, the differences listed), takes
//! the new shape at its next start from stopped; picking a kind needs RBAC `use`, options are
//! checked at the API, and a missing kind is said.

use std::time::Duration;

use berth_api::{Phase, Workspace, WorkspaceKind};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    core::v1::{Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::support::{Harness, condition, message_of, phase_of};

/// Kind `python`: image options py311 (`devbox:1.4`) and py312 (`devbox:1.5`), pod options
/// small and large, a home, an env variable, the service account `python-dev`.
fn python_kind() -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
        "metadata": {"name": "python"},
        "spec": {
            "spawner": {"displayName": "Python", "description": "Python with a home"},
            "options": {
                "image": {"default": "py311", "values": [
                    {"id": "py311", "displayName": "Python 3.11", "spec": {"image": "devbox:1.4", "ports": [{"name": "http", "port": 8080}]}},
                    {"id": "py312", "displayName": "Python 3.12", "spec": {"image": "devbox:1.5", "ports": [{"name": "http", "port": 8080}]}}
                ]},
                "pod": {"default": "small", "values": [
                    {"id": "small", "displayName": "Small", "spec": {"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}},
                    {"id": "large", "displayName": "Large", "spec": {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "4"}}}}
                ]}
            },
            "home": {"mountPath": "/home/dev", "size": "1Gi"},
            "env": [{"name": "EDITOR", "value": "vi"}],
            "serviceAccountName": "python-dev",
            "lifecycle": {"startTimeout": "10m"}
        }
    })
}

fn kinds(h: &Harness) -> Api<WorkspaceKind> {
    Api::all(h.client.clone())
}

async fn create_kind(h: &Harness, body: Value) {
    kinds(h)
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
}

async fn patch_kind(h: &Harness, patch: Value) {
    kinds(h)
        .patch(
            "python",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(patch).unwrap()),
        )
        .await
        .unwrap();
}

/// Service accounts a kind's pods run as, with what the agent needs.
async fn service_accounts(h: &Harness, names: &[&str]) {
    let accounts: Api<ServiceAccount> = Api::namespaced(h.client.clone(), "default");
    for name in names {
        accounts
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        h.grant_auth_delegator("default", name).await;
    }
}

fn pod_api(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.client.clone(), "default")
}

fn update_message(ws: &Workspace) -> String {
    condition(ws, "UpdateAvailable")
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// What a user sees: the workspace starts as its kind says (image, resources, home, env,
/// service account). Each family of the kind's fields is edited in turn; after each the
/// workspace says `pendingRestart: true` and `UpdateAvailable` lists exactly what differs,
/// field by field (a redirect with its message), while its pod is the same pod: 0 restarts.
/// A pause and resume starts it with the new shape, and nothing is pending any more.
#[tokio::test]
async fn a_kinds_change_never_restarts_a_workspace_and_its_next_start_applies_it() {
    let h = Harness::start().await;
    service_accounts(&h, &["python-dev", "python-next"]).await;
    create_kind(&h, python_kind()).await;
    h.create(
        "kim",
        json!({"kind": "python", "command": ["sleep", "1d"], "env": [{"name": "EDITOR", "value": "emacs"}]}),
    )
    .await;
    let ws = h.until_phase("kim", Phase::Running).await;
    let status = ws.status.clone().unwrap();
    assert!(!status.pending_restart);
    assert_eq!(
        condition(&ws, "UpdateAvailable").unwrap().reason,
        "UpToDate"
    );
    let record = status.resolved.unwrap();
    assert_eq!(
        (record.image.id.as_str(), record.pod.id.as_str()),
        ("py311", "small")
    );
    let pod = pod_api(&h).get("kim-ws").await.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let spec = pod.spec.unwrap();
    let container = &spec.containers[0];
    assert_eq!(container.image.as_deref(), Some("devbox:1.4"));
    assert_eq!(spec.service_account_name.as_deref(), Some("python-dev"));
    let env = container.env.clone().unwrap();
    let editor = env.iter().find(|e| e.name == "EDITOR").unwrap();
    assert_eq!(
        editor.value.as_deref(),
        Some("emacs"),
        "the author's env wins"
    );
    assert_eq!(
        container.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/home/dev"
    );

    let redirect = r#"(option py311 redirects to py312: "3.11 is end of life")"#;
    let edits: [(Value, String); 9] = [
        (
            json!([{"op": "replace", "path": "/spec/options/image/values/0/spec/image", "value": "devbox:1.4.1"}]),
            "image: devbox:1.4 -> devbox:1.4.1".into(),
        ),
        (
            json!([{"op": "add", "path": "/spec/options/image/values/0/redirect", "value": {"to": "py312", "message": "3.11 is end of life"}}]),
            format!("image: devbox:1.4 -> devbox:1.5 {redirect}"),
        ),
        (
            json!([{"op": "replace", "path": "/spec/options/pod/values/0/spec/resources/limits/cpu", "value": "2"}]),
            r#"resources: {"limits":{"cpu":"1"},"requests":{"cpu":"100m"}} -> {"limits":{"cpu":"2"},"requests":{"cpu":"100m"}}"#.into(),
        ),
        (
            json!([{"op": "replace", "path": "/spec/home/mountPath", "value": "/home/python"}]),
            r#"home: {"mountPath":"/home/dev","size":"1Gi"} -> {"mountPath":"/home/python","size":"1Gi"}"#.into(),
        ),
        (
            json!([{"op": "add", "path": "/spec/env/-", "value": {"name": "PIP_INDEX_URL", "value": "https://pypi.example"}}]),
            r#"env: [{"name":"EDITOR","value":"vi"}] -> [{"name":"EDITOR","value":"vi"},{"name":"PIP_INDEX_URL","value":"https://pypi.example"}]"#.into(),
        ),
        (
            json!([{"op": "add", "path": "/spec/probes", "value": {"liveness": {"tcpSocket": {"port": 50051}, "initialDelaySeconds": 3600}}}]),
            r#"probes: none -> {"liveness":{"initialDelaySeconds":3600,"tcpSocket":{"port":50051}}}"#.into(),
        ),
        (
            json!([{"op": "add", "path": "/spec/securityContext", "value": {"pod": {"fsGroup": 2000}}}]),
            r#"securityContext: none -> {"pod":{"fsGroup":2000}}"#.into(),
        ),
        (
            json!([{"op": "replace", "path": "/spec/serviceAccountName", "value": "python-next"}]),
            "serviceAccountName: python-dev -> python-next".into(),
        ),
        (
            json!([{"op": "replace", "path": "/spec/lifecycle/startTimeout", "value": "20m"}]),
            r#"lifecycle: {"startTimeout":"10m"} -> {"startTimeout":"20m"}"#.into(),
        ),
    ];
    for (patch, line) in edits {
        patch_kind(&h, patch).await;
        let ws = h
            .until("kim", &format!("UpdateAvailable to list {line}"), |ws| {
                update_message(ws).contains(&line)
            })
            .await;
        let status = ws.status.clone().unwrap();
        assert!(status.pending_restart);
        assert_eq!(phase_of(&ws), Some(Phase::Running), "{}", message_of(&ws));
        assert_eq!(
            pod_api(&h)
                .get("kim-ws")
                .await
                .unwrap()
                .metadata
                .uid
                .as_deref(),
            Some(uid.as_str()),
            "a kind's change restarted the pod ({line})"
        );
    }
    let ws = h.workspaces().get("kim").await.unwrap();
    let update = condition(&ws, "UpdateAvailable").unwrap();
    assert_eq!(
        (update.status.as_str(), update.reason.as_str()),
        ("True", "KindChanged")
    );
    assert!(
        update.message.starts_with("WorkspaceKind python changed since the workspace started; its next start from stopped (pause and resume) applies it: image: devbox:1.4 -> devbox:1.5 (option py311"),
        "{}",
        update.message
    );
    // kubectl shows it, and `kubectl get wsk` shows the kind.
    if let Some(kubectl) = Kubectl::for_sim(&h) {
        let table = kubectl.run(&["get", "ws", "kim"]).await;
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            ["NAME", "PHASE", "READY", "MESSAGE", "UPDATE", "AGE"],
            "{table}"
        );
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[row.len() - 2], "true", "{table}");
        let kinds = kubectl.run(&["get", "wsk"]).await;
        assert!(
            kinds.lines().nth(1).unwrap().starts_with("python "),
            "{kinds}"
        );
    }
    // The first edit is superseded by the redirect: the record is what is compared.
    assert!(
        !update.message.contains("devbox:1.4.1"),
        "{}",
        update.message
    );
    assert_eq!(ws.status.as_ref().unwrap().pod_recreations.unwrap_or(0), 0);

    // The next start from stopped applies it.
    h.patch_spec("kim", json!({"paused": true})).await;
    h.until_phase("kim", Phase::Stopped).await;
    h.patch_spec("kim", json!({"paused": false})).await;
    let ws = h.until_phase("kim", Phase::Running).await;
    let status = ws.status.clone().unwrap();
    assert!(!status.pending_restart);
    assert_eq!(
        condition(&ws, "UpdateAvailable").unwrap().reason,
        "UpToDate"
    );
    let record = status.resolved.unwrap();
    assert_eq!(
        (
            record.image.id.as_str(),
            record.image.redirected_from.as_deref()
        ),
        ("py312", Some("py311"))
    );
    let spec = pod_api(&h).get("kim-ws").await.unwrap().spec.unwrap();
    let container = &spec.containers[0];
    assert_eq!(container.image.as_deref(), Some("devbox:1.5"));
    assert_eq!(spec.service_account_name.as_deref(), Some("python-next"));
    assert_eq!(
        container.volume_mounts.as_ref().unwrap()[0].mount_path,
        "/home/python"
    );
    assert_eq!(spec.security_context.unwrap().fs_group, Some(2000));
    assert_eq!(
        container
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["cpu"]
            .0,
        "2"
    );
    assert!(container.liveness_probe.is_some());
}

/// `kubectl` against the sim.
struct Kubectl(std::path::PathBuf);

impl Kubectl {
    /// When kubectl is on the machine (required unless `BERTH_REQUIRE_KUBECTL=0`).
    fn for_sim(h: &Harness) -> Option<Kubectl> {
        if std::process::Command::new("kubectl")
            .args(["version", "--client"])
            .output()
            .is_err()
        {
            assert_eq!(
                std::env::var("BERTH_REQUIRE_KUBECTL").as_deref(),
                Ok("0"),
                "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
            );
            return None;
        }
        let kubeconfig = tempfile::tempdir().unwrap().keep().join("kubeconfig");
        h.sim.write_kubeconfig(&kubeconfig).unwrap();
        Some(Kubectl(kubeconfig))
    }

    /// Its standard output; asynchronously, as the sim serves on this test's own thread.
    async fn run(&self, args: &[&str]) -> String {
        let output = tokio::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.0)
            .args(args)
            .output()
            .await
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    }
}

/// A user who may create workspaces but not use the kind.
async fn mallory(h: &Harness) -> Client {
    let post = PostParams::default();
    Api::<ServiceAccount>::namespaced(h.client.clone(), "default")
        .create(
            &post,
            &serde_json::from_value(json!({"metadata": {"name": "mallory"}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<Role>::namespaced(h.client.clone(), "default")
        .create(&post, &serde_json::from_value(json!({"metadata": {"name": "workspace-user"},
            "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]}]})).unwrap())
        .await
        .unwrap();
    grant(h, "mallory", "workspace-user").await;
    let token = h
        .sim
        .issue_token("default", "mallory", &[], Duration::from_secs(3600))
        .unwrap();
    h.sim.client_with_token(&token).await.unwrap()
}

async fn grant(h: &Harness, account: &str, role: &str) {
    Api::<RoleBinding>::namespaced(h.client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": format!("{account}-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}]}))
            .unwrap(),
        )
        .await
        .unwrap();
}

fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn of_kind(name: &str, spec: Value) -> Workspace {
    serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name}, "spec": spec})).unwrap()
}

/// Picking a kind needs `use` on it (a kind may run as a service account its user could not
/// name); an option the kind does not offer is refused naming those it does; a kind that does
/// not exist is said (`KindNotFound`) until it is created, and then the workspace starts; a
/// kind deleted under a running workspace leaves it running, and its next start says so.
#[tokio::test]
async fn a_kind_is_used_only_by_whom_rbac_allows_and_a_missing_one_is_said() {
    let h = Harness::start().await;
    service_accounts(&h, &["python-dev"]).await;
    create_kind(&h, python_kind()).await;
    let as_mallory: Api<Workspace> = Api::namespaced(mallory(&h).await, "default");
    let post = PostParams::default();
    let (code, message) = refused(
        as_mallory
            .create(
                &post,
                &of_kind("m", json!({"kind": "python", "command": ["sleep", "1d"]})),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with(r#"denied request: User "system:serviceaccount:default:mallory" cannot use workspacekinds "python", which spec.kind names: picking a kind needs the RBAC verb use on workspacekinds/python (API group berth.dev), granted per kind by a RoleBinding in the namespace or a ClusterRoleBinding"#),
        "{message}"
    );
    Api::<Role>::namespaced(h.client.clone(), "default")
        .create(&post, &serde_json::from_value(json!({"metadata": {"name": "python-user"},
            "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspacekinds"], "resourceNames": ["python"], "verbs": ["use"]}]})).unwrap())
        .await
        .unwrap();
    grant(&h, "mallory", "python-user").await;
    let (code, message) = refused(
        as_mallory
            .create(&post, &of_kind("m", json!({"kind": "python", "options": {"image": "py310"}, "command": ["sleep", "1d"]})))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.ends_with(r#"denied request: spec.options.image: WorkspaceKind "python" has no image option "py310"; its image options are: py311, py312"#),
        "{message}"
    );
    // What the kind gives is not the author's to set.
    let (code, message) = refused(
        as_mallory
            .create(
                &post,
                &of_kind("m", json!({"kind": "python", "image": "mine:1"})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(
            "spec.image: Forbidden: a workspace of a kind gets its image from the kind's image option"
        ),
        "{message}"
    );
    as_mallory
        .create(
            &post,
            &of_kind(
                "m",
                json!({"kind": "python", "options": {"pod": "large"}, "command": ["sleep", "1d"]}),
            ),
        )
        .await
        .unwrap();
    h.until_phase("m", Phase::Running).await;
    // Its pods are built from its record: even one who may write the status cannot forge it
    // (say, into another service account).
    Api::<Role>::namespaced(h.client.clone(), "default")
        .create(&post, &serde_json::from_value(json!({"metadata": {"name": "status-writer"},
            "rules": [{"apiGroups": ["berth.dev"], "resources": ["workspaces/status"], "verbs": ["patch"]}]})).unwrap())
        .await
        .unwrap();
    grant(&h, "mallory", "status-writer").await;
    let forged = Patch::Merge(json!({"status": {"resolved": {"serviceAccountName": "deployer"}}}));
    let (code, message) = refused(
        as_mallory
            .patch_status("m", &PatchParams::default(), &forged)
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: status.resolved is the operator's record of what the workspace's kind gave it, from which its pods are built; only the operator writes it"),
        "{message}"
    );

    // A kind that does not exist (yet).
    h.create(
        "early",
        json!({"kind": "later", "command": ["sleep", "1d"]}),
    )
    .await;
    let ws = h.until_phase("early", Phase::Error).await;
    assert_eq!(condition(&ws, "Stalled").unwrap().reason, "KindNotFound");
    assert_eq!(
        message_of(&ws),
        r#"Cannot start: WorkspaceKind "later" does not exist (kubectl get workspacekinds lists those that do)"#
    );
    let mut later = python_kind();
    later["metadata"]["name"] = json!("later");
    create_kind(&h, later).await;
    h.until_phase("early", Phase::Running).await;

    // In use, the kind may not go (once its status counts the workspace, at most a second
    // late); an admin who removes the policy's binding deletes it anyway. The workspace keeps
    // running from its record; its next start waits for the kind.
    crate::support::eventually(
        Duration::from_secs(10),
        "the kind counts its workspace",
        || async {
            let kind = kinds(&h).get("later").await.unwrap();
            (kind.status?.workspaces == 1).then_some(())
        },
    )
    .await;
    let (code, message) = refused(kinds(&h).delete("later", &Default::default()).await);
    assert_eq!(code, 403);
    assert!(
        message.contains("WorkspaceKind later is used by 1 workspace(s)"),
        "{message}"
    );
    Api::<ValidatingAdmissionPolicyBinding>::all(h.client.clone())
        .delete("workspacekinds.berth.dev", &Default::default())
        .await
        .unwrap();
    kinds(&h)
        .delete("later", &Default::default())
        .await
        .unwrap();
    let ws = h
        .until("early", "UpdateAvailable Unknown", |ws| {
            condition(ws, "UpdateAvailable").is_some_and(|c| c.status == "Unknown")
        })
        .await;
    assert_eq!(phase_of(&ws), Some(Phase::Running));
    h.patch_spec("early", json!({"paused": true})).await;
    h.until_phase("early", Phase::Stopped).await;
    h.patch_spec("early", json!({"paused": false})).await;
    let ws = h.until_phase("early", Phase::Error).await;
    assert_eq!(condition(&ws, "Stalled").unwrap().reason, "KindNotFound");
}

/// What a platform admin sees: `kubectl get wsk` counts the workspaces of a kind, its status
/// counts each option's use; deleting the kind, or removing an option, in use is refused
/// saying how many use it; an unused option may go, and once its workspaces are gone the kind
/// may too. However many workspaces change, the kind's status is written at most once a second.
#[tokio::test]
async fn a_kind_in_use_cannot_go_and_its_status_counts_its_workspaces() {
    let h = Harness::start().await;
    service_accounts(&h, &["python-dev"]).await;
    create_kind(&h, python_kind()).await;
    let writes_before = h.metric("berth_kind_status_writes_total");
    let started = std::time::Instant::now();
    for i in 0..12 {
        let pod = if i % 3 == 0 { "large" } else { "small" };
        h.create(
            &format!("user-{i}"),
            json!({"kind": "python", "options": {"pod": pod}, "command": ["sleep", "1d"]}),
        )
        .await;
    }
    let kind = crate::support::eventually(Duration::from_secs(20), "the kind's counts", || async {
        let kind = kinds(&h).get("python").await.unwrap();
        let status = kind.status.clone()?;
        let options = status.options.clone()?;
        (status.workspaces == 12 && options.image.get("py311") == Some(&12)).then_some(kind)
    })
    .await;
    let options = kind.status.unwrap().options.unwrap();
    assert_eq!(
        options.pod,
        [("large".to_owned(), 4), ("small".to_owned(), 8)].into()
    );
    // One write a second at most, however many workspaces changed.
    let writes = h.metric("berth_kind_status_writes_total") - writes_before;
    let seconds = started.elapsed().as_secs() + 1;
    assert!(writes <= seconds, "{writes} writes in {seconds} s");

    let denied = |result: Result<WorkspaceKind, kube::Error>| match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let (code, message) = match kinds(&h).delete("python", &Default::default()).await {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "workspacekinds.berth.dev \"python\" is forbidden: ValidatingAdmissionPolicy 'workspacekinds.berth.dev' with binding 'workspacekinds.berth.dev' denied request: WorkspaceKind python is used by 12 workspace(s); delete them or move them to another kind first (kubectl get ws -A -o wide shows the KIND of each), or set spec.spawner.deprecated so no new one picks it"
    );
    let remove_large = json!([{"op": "remove", "path": "/spec/options/pod/values/1"}]);
    let (code, message) = denied(
        kinds(&h)
            .patch(
                "python",
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(remove_large.clone()).unwrap()),
            )
            .await,
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("denied request: spec.options.pod: option large is used by 4 workspace(s); keep it (a redirect moves them at their next start) or move them first"),
        "{message}"
    );
    // An option nobody uses may go.
    patch_kind(
        &h,
        json!([{"op": "remove", "path": "/spec/options/image/values/1"}]),
    )
    .await;

    // Once the workspaces are gone, the kind may go too.
    for i in 0..12 {
        h.workspaces()
            .delete(&format!("user-{i}"), &Default::default())
            .await
            .unwrap();
    }
    crate::support::eventually(Duration::from_secs(30), "the kind unused", || async {
        let kind = kinds(&h).get("python").await.unwrap();
        (kind.status.as_ref()?.workspaces == 0).then_some(())
    })
    .await;
    kinds(&h)
        .delete("python", &Default::default())
        .await
        .unwrap();
}

/// What a platform admin relies on after the operator restarts: a kind's count of workspaces
/// stays right. The restarted operator counts only once it has listed every workspace; while
/// its list of workspaces is slow it writes nothing (it wrote 0 here, from the empty cache,
/// which would have let the kind be deleted under its workspaces).
#[tokio::test]
async fn a_restarted_operator_counts_a_kinds_workspaces_only_once_it_has_listed_them() {
    use berth_sim::RequestMatch;

    let mut h = Harness::start().await;
    service_accounts(&h, &["python-dev"]).await;
    create_kind(&h, python_kind()).await;
    for i in 0..3 {
        h.create(
            &format!("user-{i}"),
            json!({"kind": "python", "command": ["sleep", "1d"]}),
        )
        .await;
    }
    crate::support::eventually(Duration::from_secs(20), "the kind's count", || async {
        let kind = kinds(&h).get("python").await.unwrap();
        (kind.status?.workspaces == 3).then_some(())
    })
    .await;
    h.stop_operator().await;
    let kind_writes = |h: &Harness| {
        h.sim.count_requests(|k| {
            k.user == crate::support::OPERATOR
                && k.verb == "patch"
                && k.resource == "workspacekinds"
                && k.subresource == "status"
        })
    };
    let before = kind_writes(&h);
    h.sim.faults().latency(
        RequestMatch::new("list", "workspaces"),
        Duration::from_secs(3),
    );
    let reconciles = h.reconciles();
    h.start_operator();
    h.until_reconciled(reconciles, 3).await;
    h.sim.faults().clear_api_faults();
    // Two more of the operator's once-a-second looks at the kinds.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        kind_writes(&h),
        before,
        "nothing to write: the count is right"
    );
    let kind = kinds(&h).get("python").await.unwrap();
    assert_eq!(kind.status.unwrap().workspaces, 3);
}
