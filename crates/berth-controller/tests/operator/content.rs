//! Content from git, end to end: the operator asks the pod's agent where the clone stands and
//! says it (`ContentReady`, the phase, events), the agent clones from git's own smart HTTP
//! server on loopback into the home claim's folder, a failure explains itself in git's words
//! and heals once the spec is fixed, the checkout (and the user's edits in it) outlives pauses
//! and replaced pods, and no secret shows anywhere.

use std::{path::PathBuf, time::Duration};

use berth_agent::git_server::{self, GitServer};
use berth_api::{Phase, Workspace};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::support::{
    Harness, condition, events_about, message_of, phase_of, sim_config, test_config,
};

const PASSWORD: &str = "s3cret-token-for-git";

struct Setup {
    h: Harness,
    server: GitServer,
    claims: tempfile::TempDir,
    _repos: tempfile::TempDir,
    first: String,
    second: String,
}

/// The operator (allowing `http` URLs, as an admin of a plain-text server would), agents that
/// clone into claim folders, a git server asking for `dev`/[`PASSWORD`] with `demo` (main at
/// `second`, tag v1 at `first`), and the basic-auth Secret `git-creds`.
async fn setup() -> Setup {
    let claims = tempfile::tempdir().unwrap();
    let mut config = test_config();
    // A rejected pod is replaced quickly.
    config.policy.recreation = berth_api::PodRecreationPolicy {
        max: 3,
        delay: Duration::from_millis(200),
    };
    config.policy.pod.content_schemes = vec!["https".into(), "http".into()];
    config.policy.progress_interval = Duration::from_millis(200);
    let sim = berth_sim::SimConfig {
        runtime: std::sync::Arc::new(berth_agent::sim_runtime::AgentRuntime::with_claims(
            claims.path().join("claims"),
        )),
        ..sim_config()
    };
    let h = Harness::start_with(sim, config).await;
    let maps: Api<ConfigMap> = Api::namespaced(h.client.clone(), "berth-system");
    maps.patch(
        "berth-admission",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"allowed-content-schemes": "https,http"}})),
    )
    .await
    .unwrap();
    let repos = tempfile::tempdir().unwrap();
    let first = git_server::create_repository(
        repos.path(),
        "demo",
        &[("README.md", "# demo\n"), ("src/main.rs", "fn main() {}\n")],
    )
    .unwrap();
    git_server::git(&repos.path().join("demo.git"), &["tag", "v1", &first]).unwrap();
    let second = git_server::commit(repos.path(), "demo", &[("NEWS", "two\n")], "two").unwrap();
    let server = GitServer::start(repos.path(), Some(("dev", PASSWORD)))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(h.client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "git-creds"},
                "type": "kubernetes.io/basic-auth",
                "stringData": {"username": "dev", "password": PASSWORD}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Setup {
        h,
        server,
        claims,
        _repos: repos,
        first,
        second,
    }
}

fn spec(url: &str, reference: Option<&str>) -> Value {
    let mut git = json!({"url": url, "auth": {"secretName": "git-creds"}});
    if let Some(reference) = reference {
        git["ref"] = json!(reference);
    }
    json!({
        "image": "devbox:1",
        "command": ["sleep", "infinity"],
        "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}},
        "content": {"git": git}
    })
}

impl Setup {
    /// The folder of the workspace's home claim.
    async fn home(&self, name: &str) -> PathBuf {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.h.client.clone(), "default");
        let claim = claims.get(&format!("{name}-home")).await.unwrap();
        self.claims.path().join("claims").join(claim.uid().unwrap())
    }

    async fn pod_uid(&self, name: &str) -> Option<String> {
        let pods: Api<Pod> = Api::namespaced(self.h.client.clone(), "default");
        pods.get_opt(&format!("{name}-ws"))
            .await
            .unwrap()
            .and_then(|p| p.uid())
    }
}

fn content_ready(ws: &Workspace) -> Option<(String, String, String)> {
    condition(ws, "ContentReady").map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn a_workspace_starts_with_its_code_says_each_step_and_keeps_the_users_work() {
    let s = setup().await;
    let h = &s.h;
    let url = s.server.url("demo");
    // The pack is held: the clone is caught in its middle.
    s.server.hold(true);
    h.create("app", spec(&url, None)).await;
    let cloning = h
        .until("app", "ContentReady False (Cloning)", |ws| {
            content_ready(ws).is_some_and(|(s, r, _)| s == "False" && r == "Cloning")
        })
        .await;
    // What a user sees while it clones: Starting, cloning, not Ready.
    assert_eq!(phase_of(&cloning), Some(Phase::Starting));
    assert!(
        message_of(&cloning).starts_with(&format!("Cloning {url}")),
        "{}",
        message_of(&cloning)
    );
    assert_eq!(condition(&cloning, "Ready").unwrap().status, "False");
    s.server.hold(false);
    let running = h.until_phase("app", Phase::Running).await;
    let (status, reason, message) = content_ready(&running).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Cloned"));
    assert!(message.contains(&s.second), "{message}");
    let recorded = running.status.as_ref().unwrap().content.clone().unwrap();
    assert_eq!(
        (recorded.path.as_str(), recorded.commit.as_str()),
        ("demo", s.second.as_str())
    );
    let events = events_about(h, &running.uid().unwrap()).await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "ContentReady" && m.contains(&s.second)),
        "{events:?}"
    );
    let home = s.home("app").await;
    let checkout = home.join("demo");
    assert_eq!(
        git_server::git(&checkout, &["rev-parse", "HEAD"]).unwrap(),
        s.second
    );
    assert_eq!(entries(&home), ["demo"]);

    // The user works: an edit and an untracked file.
    std::fs::write(checkout.join("README.md"), "mine\n").unwrap();
    std::fs::write(checkout.join("notes.txt"), "draft\n").unwrap();
    let packs = s.server.packs();
    // Pause and resume: a new pod finds the checkout and leaves it alone.
    h.patch_spec("app", json!({"paused": true})).await;
    h.until_phase("app", Phase::Stopped).await;
    let before = s.pod_uid("app").await;
    h.patch_spec("app", json!({"paused": false})).await;
    let resumed = h
        .until("app", "Running in a new pod", |ws| {
            phase_of(ws) == Some(Phase::Running)
                && ws
                    .status
                    .as_ref()
                    .and_then(|s| s.content.as_ref())
                    .is_some_and(|c| Some(c.pod_uid.clone()) != before)
        })
        .await;
    let (_, reason, message) = content_ready(&resumed).unwrap();
    assert_eq!(reason, "ContentFound", "{message}");
    // A replaced pod (deleted by someone) does the same.
    let uid = s.pod_uid("app").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.delete("app-ws", &DeleteParams::default())
        .await
        .unwrap();
    h.until("app", "Running in a replaced pod", |ws| {
        phase_of(ws) == Some(Phase::Running)
            && ws
                .status
                .as_ref()
                .and_then(|s| s.content.as_ref())
                .is_some_and(|c| c.pod_uid != uid)
    })
    .await;
    assert_eq!(s.server.packs(), packs, "never cloned twice");
    assert_eq!(
        std::fs::read_to_string(checkout.join("README.md")).unwrap(),
        "mine\n"
    );
    assert!(checkout.join("notes.txt").exists());

    // Another ref asked for later changes nothing on disk, restarts nothing, and says so.
    let uid = s.pod_uid("app").await.unwrap();
    h.patch_spec("app", json!({"content": {"git": {"ref": "v1"}}}))
        .await;
    let said = h
        .until("app", "ContentReady to say nothing changed", |ws| {
            content_ready(ws).is_some_and(|(_, _, m)| m.contains("nothing on disk changed"))
        })
        .await;
    assert_eq!(phase_of(&said), Some(Phase::Running));
    assert_eq!(s.pod_uid("app").await.unwrap(), uid);
    assert_eq!(
        git_server::git(&checkout, &["rev-parse", "HEAD"]).unwrap(),
        s.second
    );

    // The password is nowhere: status, events, the pod, the logs.
    let pod = pods.get("app-ws").await.unwrap();
    let ws = h.workspaces().get("app").await.unwrap();
    let events = events_about(h, &ws.uid().unwrap()).await;
    for (what, text) in [
        ("the pod", serde_json::to_string(&pod).unwrap()),
        ("the status", serde_json::to_string(&ws.status).unwrap()),
        ("the events", format!("{events:?}")),
        ("the logs", h.logs.text()),
    ] {
        assert!(!text.contains(PASSWORD), "the password is in {what}");
    }
}

#[tokio::test]
async fn a_clone_that_fails_explains_itself_once_keeps_its_pod_and_heals_when_fixed() {
    let s = setup().await;
    let h = &s.h;
    let url = s.server.url("demo");
    h.create("wrong", spec(&url, Some("no-such-branch"))).await;
    let failed = h.until_phase("wrong", Phase::Error).await;
    let (status, reason, message) = content_ready(&failed).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RefNotFound"));
    assert!(
        message.contains("The remote didn't have any ref that matched 'no-such-branch'"),
        "{message}"
    );
    assert!(message.contains("fix spec.content.git.ref"), "{message}");
    assert_eq!(condition(&failed, "Ready").unwrap().reason, "RefNotFound");
    let uid = s.pod_uid("wrong").await.unwrap();
    // Asked again and again, it says it once, and the pod is kept.
    h.poke("wrong").await;
    h.poke("wrong").await;
    let warnings: Vec<_> = events_about(h, &failed.uid().unwrap())
        .await
        .into_iter()
        .filter(|(r, _)| r == "ContentFailed")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(s.pod_uid("wrong").await.unwrap(), uid);
    assert!(!s.home("wrong").await.join("demo").exists());
    // Fixed: the pod that could not clone is replaced and the right ref cloned.
    h.patch_spec("wrong", json!({"content": {"git": {"ref": "v1"}}}))
        .await;
    let fixed = h.until_phase("wrong", Phase::Running).await;
    assert_eq!(content_ready(&fixed).unwrap().1, "Cloned");
    let checkout = s.home("wrong").await.join("demo");
    assert_eq!(
        git_server::git(&checkout, &["rev-parse", "HEAD"]).unwrap(),
        s.first
    );

    // A clone failing without progress for the start timeout ends the start (rule C9): the
    // pod goes, the workspace is Failed until its spec changes or it is restarted.
    // The short timeout is set once the clone has failed, so how long scheduling takes on a
    // busy machine cannot end the start first (the lifecycle is not in the pod's hash).
    h.create("brief", spec(&url, Some("no-such-branch"))).await;
    h.until("brief", "the clone to fail", |ws| {
        condition(ws, "ContentReady").is_some_and(|c| c.reason == "RefNotFound")
    })
    .await;
    h.patch_spec("brief", json!({"lifecycle": {"startTimeout": "1s"}}))
        .await;
    let gave_up = h.until_phase("brief", Phase::Failed).await;
    let stalled = condition(&gave_up, "Stalled").unwrap();
    assert_eq!(
        (stalled.status.as_str(), stalled.reason.as_str()),
        ("True", "StartTimeout")
    );
    assert!(
        message_of(&gave_up).starts_with("No progress for 1s while cloning: Cannot clone"),
        "{}",
        message_of(&gave_up)
    );
    crate::support::eventually(crate::support::WAIT, "the pod gone", || async {
        s.pod_uid("brief").await.is_none().then_some(())
    })
    .await;

    // The server down: Unreachable, retried by the agent, cloned once it is back.
    s.server.down();
    h.create("later", spec(&url, None)).await;
    let down = h.until_not_ready("later", "Unreachable").await;
    assert_eq!(phase_of(&down), Some(Phase::Error));
    assert!(
        message_of(&down).contains("the agent tries again in"),
        "{}",
        message_of(&down)
    );
    s.server.up().await.unwrap();
    h.until_phase("later", Phase::Running).await;
}

#[tokio::test]
async fn a_pod_deleted_mid_clone_ends_with_exactly_one_clean_checkout() {
    let s = setup().await;
    let h = &s.h;
    s.server.hold(true);
    h.create("mid", spec(&s.server.url("demo"), None)).await;
    h.until("mid", "cloning", |ws| {
        content_ready(ws).is_some_and(|(_, r, _)| r == "Cloning")
    })
    .await;
    while s.server.packs() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let home = s.home("mid").await;
    assert!(
        entries(&home)
            .iter()
            .any(|e| e.starts_with(".demo.berth-partial."))
    );
    let uid = s.pod_uid("mid").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.delete("mid-ws", &DeleteParams::default())
        .await
        .unwrap();
    // The replacement's agent starts over (its pack is held too), then both are let go.
    while s.server.packs() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(s.pod_uid("mid").await.unwrap(), uid);
    s.server.hold(false);
    let running = h.until_phase("mid", Phase::Running).await;
    assert_eq!(content_ready(&running).unwrap().1, "Cloned");
    assert_eq!(entries(&home), ["demo"]);
    assert_eq!(
        git_server::git(&home.join("demo"), &["rev-parse", "HEAD"]).unwrap(),
        s.second
    );
}

#[tokio::test]
async fn content_is_refused_at_the_api_where_it_cannot_work() {
    let s = setup().await;
    let h = &s.h;
    let refused = |name: &'static str, spec: Value| async move {
        let body = json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name}, "spec": spec});
        match h
            .workspaces()
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
        {
            Err(kube::Error::Api(e)) => e.message,
            other => panic!("{name} was not refused: {other:?}"),
        }
    };
    let mut no_home = spec("https://example.com/org/repo.git", None);
    no_home["podTemplate"] = json!({});
    let message = refused("no-home", no_home).await;
    assert!(message.contains("spec.podTemplate.volumes.home: Required value: spec.content is cloned into the home volume"), "{message}");
    let message = refused(
        "in-url",
        spec("https://dev:tok@example.com/org/repo.git", None),
    )
    .await;
    assert!(
        message.contains("spec.content.git.url: Forbidden: a password or token in the URL"),
        "{message}"
    );
    let mut escape = spec("https://example.com/org/repo.git", None);
    escape["content"]["git"]["path"] = json!("../etc");
    let message = refused("escape", escape).await;
    assert!(
        message.contains("spec.content.git.path: Invalid value"),
        "{message}"
    );
    // A scheme the platform does not allow is refused by the admission policy.
    let message = refused("local", spec("file:///srv/git/repo.git", None)).await;
    assert!(
        message.contains("spec.content.git.url: Unsupported value: \"file\": supported values: \"https\", \"http\""),
        "{message}"
    );
}

#[tokio::test]
async fn a_workspace_running_its_images_entrypoint_gets_its_content_first() {
    let s = setup().await;
    let h = &s.h;
    s.server.hold(true);
    let mut entrypoint = spec(&s.server.url("demo"), Some("v1"));
    entrypoint.as_object_mut().unwrap().remove("command");
    h.create("ide", entrypoint).await;
    // The agent clones as the pod's init container: the entrypoint has not started.
    let cloning = h
        .until("ide", "cloning in the init container", |ws| {
            content_ready(ws).is_some_and(|(_, r, _)| r == "Cloning")
        })
        .await;
    assert_eq!(phase_of(&cloning), Some(Phase::Starting));
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let pod = pods.get("ide-ws").await.unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let init = spec.init_containers.as_ref().unwrap();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["berth-install", "berth-content"]);
    assert_eq!(
        init[1].image.as_deref(),
        Some("devbox:1"),
        "the workspace's image and user"
    );
    let statuses = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .clone()
        .unwrap_or_default();
    assert!(
        statuses
            .iter()
            .all(|c| c.state.as_ref().is_none_or(|s| s.running.is_none())),
        "no container runs before the content is in place: {statuses:?}"
    );
    s.server.hold(false);
    let running = h.until_phase("ide", Phase::Running).await;
    let (status, reason, message) = content_ready(&running).unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Cloned"),
        "{message}"
    );
    assert_eq!(running.status.unwrap().content.unwrap().commit, s.first);
    let checkout = s.home("ide").await.join("demo");
    assert_eq!(
        git_server::git(&checkout, &["rev-parse", "HEAD"]).unwrap(),
        s.first
    );
}

#[tokio::test]
async fn a_node_lost_mid_clone_moves_the_workspace_and_ends_with_one_checkout() {
    let s = setup().await;
    let h = &s.h;
    s.server.hold(true);
    h.create("moving", spec(&s.server.url("demo"), None)).await;
    let cloning = h
        .until("moving", "cloning", |ws| {
            content_ready(ws).is_some_and(|(_, r, _)| r == "Cloning")
        })
        .await;
    while s.server.packs() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let node = cloning.status.unwrap().pod.unwrap().node_name.unwrap();
    h.sim.faults().set_unreachable(&node, true);
    // The replacement, on another node, clones again (held too); then both are let go.
    h.until("moving", "a pod on another node", |ws| {
        ws.status
            .as_ref()
            .and_then(|s| s.pod.as_ref())
            .and_then(|p| p.node_name.as_deref())
            .is_some_and(|n| n != node)
    })
    .await;
    while s.server.packs() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.server.hold(false);
    let running = h.until_phase("moving", Phase::Running).await;
    assert_eq!(content_ready(&running).unwrap().1, "Cloned");
    let home = s.home("moving").await;
    assert_eq!(entries(&home), ["demo"]);
    assert_eq!(
        git_server::git(&home.join("demo"), &["rev-parse", "HEAD"]).unwrap(),
        s.second
    );
}

#[tokio::test]
async fn a_clone_cut_short_then_a_pod_the_kubelet_rejects_still_ends_with_one_checkout() {
    // Gitpod's question: what happens to a half-done clone when a rejected pod is created
    // again? The clone's pod goes mid-clone, its replacement is rejected by its kubelet
    // (before any container runs, as a kubelet rejects), the next one cleans up and clones.
    let s = setup().await;
    let h = &s.h;
    s.server.hold(true);
    h.create("bumpy", spec(&s.server.url("demo"), None)).await;
    h.until("bumpy", "cloning", |ws| {
        content_ready(ws).is_some_and(|(_, r, _)| r == "Cloning")
    })
    .await;
    while s.server.packs() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let home = s.home("bumpy").await;
    assert!(
        entries(&home)
            .iter()
            .any(|e| e.starts_with(".demo.berth-partial."))
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.client.clone());
    for node in nodes.list(&Default::default()).await.unwrap() {
        h.sim.faults().reject_next(&node.name_any(), 1, "OutOfcpu");
    }
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.delete("bumpy-ws", &DeleteParams::default())
        .await
        .unwrap();
    let rejected = h
        .until("bumpy", "a pod rejected, and replaced", |ws| {
            ws.status.as_ref().and_then(|s| s.pod_recreations) == Some(1)
        })
        .await;
    assert!(condition(&rejected, "PodRejected").is_some());
    while s.server.packs() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.server.hold(false);
    let running = h.until_phase("bumpy", Phase::Running).await;
    assert_eq!(content_ready(&running).unwrap().1, "Cloned");
    assert_eq!(entries(&home), ["demo"]);
    assert_eq!(
        git_server::git(&home.join("demo"), &["rev-parse", "HEAD"]).unwrap(),
        s.second
    );
}
