//! The workspace's content as the operator sees it (pure): what an agent's `GetContent`
//! answer means, and when to ask again. The agent clones (`berth_agent::content`); the
//! operator asks the pod's agent where it stands until it says the content is in place,
//! at most once per `--status-progress-interval`, and says it in `ContentReady`.

use std::time::Duration;

use crate::cached_pod::CachedPod;
use berth_api::{Workspace, condition::Reason};
use jiff::Timestamp;
use kube::ResourceExt;

/// What the operator's last `GetContent` to a pod's agent found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContentCheck {
    pub pod_uid: String,
    /// When the agent was asked.
    pub asked_at: Timestamp,
    pub outcome: ContentOutcome,
    /// First handed to a reconcile now.
    pub fresh: bool,
}

/// The answer of a `GetContent`, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentOutcome {
    /// The agent has not started cloning yet (or has no content: an agent older than the spec).
    Waiting,
    /// Cloning: git's progress in words.
    Cloning { progress: String },
    /// In place: `Cloned` now, or `ContentFound` from earlier; what is on disk (url, ref and
    /// commit of Berth's clone, empty for the user's own directory) and the agent's words.
    Ready {
        reason: Reason,
        url: String,
        reference: Option<String>,
        commit: String,
        message: String,
    },
    /// The last attempt failed, in git's words; the agent tries again after `retry_in`
    /// (None: once the credentials change). Attempts have failed for `failing_for` without
    /// progress in between.
    Failed {
        reason: Reason,
        message: String,
        retry_in: Option<Duration>,
        failing_for: Duration,
    },
    /// The agent could not be asked.
    Unasked { reason: Reason, message: String },
}

/// Whether the workspace's pod is to be asked about its content: the workspace has content,
/// the pod is its own and current, runs, and has not said its content is in place.
pub fn wanted(workspace: &Workspace, pod: Option<&CachedPod>) -> bool {
    let Some(pod) = pod else {
        return false;
    };
    let confirmed = workspace
        .status
        .as_ref()
        .and_then(|s| s.content.as_ref())
        .is_some_and(|c| Some(c.pod_uid.as_str()) == pod.metadata.uid.as_deref());
    let running = agent_running(pod);
    let has_ip = pod
        .status
        .as_ref()
        .is_some_and(|s| s.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty()));
    workspace.spec.content.is_some()
        && !workspace.spec.paused
        && workspace.metadata.deletion_timestamp.is_none()
        && pod.metadata.deletion_timestamp.is_none()
        && crate::pod::is_owned_by(&pod.metadata, workspace)
        && crate::pod::built_from(pod, workspace)
        && running
        && has_ip
        && !confirmed
        && !pod.uid().unwrap_or_default().is_empty()
}

/// Whether an agent of the pod may be running: a container runs, or the content's init
/// container does (for a workspace that runs its image's entrypoint).
pub fn agent_running(pod: &CachedPod) -> bool {
    let status = pod.status.as_ref();
    let runs = |statuses: Option<&Vec<crate::cached_pod::CachedContainerStatus>>, init: bool| {
        statuses.is_some_and(|cs| {
            cs.iter().any(|c| {
                (!init || c.name == crate::pod::CONTENT_CONTAINER)
                    && c.state.as_ref().is_some_and(|s| s.running.is_some())
            })
        })
    };
    runs(status.and_then(|s| s.container_statuses.as_ref()), false)
        || runs(
            status.and_then(|s| s.init_container_statuses.as_ref()),
            true,
        )
}

/// Whether the last answer is old enough to ask again (at most once per `interval`).
pub fn ask_due(
    last: Option<&ContentCheck>,
    pod_uid: &str,
    now: Timestamp,
    interval: Duration,
) -> bool {
    match last.filter(|c| c.pod_uid == pod_uid) {
        None => true,
        Some(check) => {
            let since = Duration::try_from(now.duration_since(check.asked_at)).unwrap_or_default();
            since >= interval
        }
    }
}

/// What the author can do about a failure, by its reason.
pub fn remedy(reason: &Reason, workspace: &Workspace) -> String {
    let git = workspace.spec.content.as_ref().map(|c| &c.git);
    let secret = git
        .and_then(|g| g.auth.as_ref())
        .map(|a| a.secret_name.clone());
    match (reason, secret) {
        (Reason::AuthenticationFailed, Some(secret)) => format!(
            "check the credentials in Secret {secret} (spec.content.git.auth.secretName); Berth tries again when the Secret changes"
        ),
        (Reason::AuthenticationFailed, None) => "the repository asks for credentials: name a Secret in spec.content.git.auth.secretName".to_owned(),
        (Reason::RepositoryNotFound, _) => "check spec.content.git.url (a private repository may also say it does not exist to a caller without the right credentials)".to_owned(),
        (Reason::RefNotFound, _) => "fix spec.content.git.ref (a branch, a tag or a full commit id), or leave it out for the default branch".to_owned(),
        (Reason::NoSpace, _) => "grow spec.podTemplate.volumes.home.size".to_owned(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(content: bool) -> serde_json::Value {
        let mut spec = json!({
            "image": "x:1", "command": ["sh"],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}
        });
        if content {
            spec["content"] = json!({"git": {"url": "https://h/org/app.git"}});
        }
        spec
    }

    /// The workspace's own pod, its workspace container in `state`, at an IP.
    fn pod(ws: &Workspace, state: serde_json::Value) -> CachedPod {
        let mut pod = crate::pod::build_pod(ws, &Default::default());
        pod.metadata.uid = Some("pod-1".into());
        pod.status = serde_json::from_value(json!({
            "phase": "Running", "podIP": "10.0.0.7",
            "containerStatuses": [{"name": "workspace", "image": "x:1", "imageID": "", "ready": false, "restartCount": 0, "state": state}]
        }))
        .unwrap();
        CachedPod::from(&pod)
    }

    #[test]
    fn the_agent_is_asked_about_the_content_of_its_running_current_pod_until_it_is_in_place() {
        let running = json!({"running": {}});
        let ws = crate::pod::tests::workspace("w", spec(true));
        let current = pod(&ws, running.clone());
        assert!(wanted(&ws, Some(&current)));
        assert!(!wanted(&ws, None));
        let plain = crate::pod::tests::workspace("w", spec(false));
        assert!(
            !wanted(&plain, Some(&pod(&plain, running.clone()))),
            "no content"
        );
        let mut paused = ws.clone();
        paused.spec.paused = true;
        assert!(!wanted(&paused, Some(&current)), "paused");
        let mut going = ws.clone();
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert!(
            !wanted(&going, Some(&current)),
            "the workspace is being deleted"
        );
        let mut stopping = current.clone();
        stopping.metadata.deletion_timestamp = going.metadata.deletion_timestamp.clone();
        assert!(!wanted(&ws, Some(&stopping)), "the pod is being deleted");
        let mut foreign = current.clone();
        foreign.metadata.owner_references = None;
        assert!(!wanted(&ws, Some(&foreign)), "not the workspace's own pod");
        let mut other = ws.clone();
        other.spec.content.as_mut().unwrap().git.reference = Some("v2".into());
        assert!(
            !wanted(&other, Some(&current)),
            "a pod given other content is replaced, not asked"
        );
        assert!(
            !wanted(
                &ws,
                Some(&pod(
                    &ws,
                    json!({"waiting": {"reason": "ContainerCreating"}})
                ))
            ),
            "nothing runs yet"
        );
        let mut no_ip = current.clone();
        no_ip.status.as_mut().unwrap().pod_ip = None;
        assert!(!wanted(&ws, Some(&no_ip)), "no address yet");
        let mut nameless = current.clone();
        nameless.metadata.uid = None;
        assert!(!wanted(&ws, Some(&nameless)));
        // Confirmed for this pod: asked no more; for another pod: asked again.
        let mut confirmed = ws.clone();
        confirmed.status =
            serde_json::from_value(json!({"content": {"path": "app", "podUID": "pod-1"}})).unwrap();
        assert!(!wanted(&confirmed, Some(&current)));
        confirmed.status =
            serde_json::from_value(json!({"content": {"path": "app", "podUID": "pod-0"}})).unwrap();
        assert!(wanted(&confirmed, Some(&current)));
    }

    #[test]
    fn an_agent_runs_in_a_running_container_or_the_content_init_container() {
        let ws = crate::pod::tests::workspace("w", spec(true));
        let mut pod = pod(&ws, json!({"running": {}}));
        assert!(agent_running(&pod));
        let status = pod.status.as_mut().unwrap();
        status.container_statuses = Some(vec![serde_json::from_value(json!({"name": "workspace", "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0}}})).unwrap()]);
        assert!(!agent_running(&pod), "a container that ended");
        let init = |name: &str, state: serde_json::Value| {
            serde_json::from_value(json!({"name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0, "state": state})).unwrap()
        };
        pod.status.as_mut().unwrap().init_container_statuses =
            Some(vec![init("berth-install", json!({"running": {}}))]);
        assert!(!agent_running(&pod), "another init container");
        pod.status.as_mut().unwrap().init_container_statuses =
            Some(vec![init("berth-content", json!({"waiting": {}}))]);
        assert!(!agent_running(&pod), "not running yet");
        pod.status.as_mut().unwrap().init_container_statuses =
            Some(vec![init("berth-content", json!({"running": {}}))]);
        assert!(agent_running(&pod), "the content's init container");
    }

    #[test]
    fn asked_at_most_once_per_interval_and_at_once_for_a_new_pod() {
        let t0: Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        let check = ContentCheck {
            pod_uid: "a".into(),
            asked_at: t0,
            outcome: ContentOutcome::Waiting,
            fresh: false,
        };
        let second = Duration::from_secs(1);
        assert!(ask_due(None, "a", t0, second));
        assert!(!ask_due(Some(&check), "a", t0, second));
        let later = t0 + jiff::SignedDuration::from_millis(999);
        assert!(!ask_due(Some(&check), "a", later, second));
        let later = t0 + jiff::SignedDuration::from_millis(1000);
        assert!(ask_due(Some(&check), "a", later, second));
        assert!(
            ask_due(Some(&check), "b", t0, second),
            "a new pod is asked at once"
        );
    }

    #[test]
    fn each_failure_has_its_remedy() {
        let with = crate::pod::tests::workspace(
            "w",
            json!({"image": "x:1", "content": {"git": {"url": "https://h/r.git", "auth": {"secretName": "git-creds"}}}}),
        );
        let without = crate::pod::tests::workspace("w", spec(true));
        for (reason, ws, words) in [
            (
                Reason::AuthenticationFailed,
                &with,
                "check the credentials in Secret git-creds",
            ),
            (
                Reason::AuthenticationFailed,
                &without,
                "the repository asks for credentials: name a Secret",
            ),
            (
                Reason::RepositoryNotFound,
                &with,
                "check spec.content.git.url",
            ),
            (Reason::RefNotFound, &with, "fix spec.content.git.ref"),
            (
                Reason::NoSpace,
                &with,
                "grow spec.podTemplate.volumes.home.size",
            ),
        ] {
            assert!(
                remedy(&reason, ws).starts_with(words),
                "{reason}: {}",
                remedy(&reason, ws)
            );
        }
        assert_eq!(remedy(&Reason::Unreachable, &with), "");
    }
}
