//! Which failed pods were rejected by their kubelet at admission (rule C10), as a pure
//! function of the pod and a configurable set of reasons, never of the message wording
//! (kubelets wrote "Pod was rejected: ..." and, earlier, "Pod ...").

use std::str::FromStr;

use crate::cached_pod::CachedPod;
use berth_api::condition::{ConditionStatus, HasStatus, pod_conditions};

/// The kubelet admission reasons that mean "rejected": exact names, plus every `OutOf<resource>`
/// when `OutOf*` is in the list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectionPolicy {
    pub reasons: Vec<String>,
}

/// The defaults, as the `--rejection-reasons` flag takes them.
pub const DEFAULT_REJECTION_REASONS: &str = "OutOf*,NodeAffinity,NodeSelectorMismatching,NodeLabelsMismatch,UnexpectedAdmissionError,InvalidNodeInfo,NodePorts,TopologyAffinityError,PodOSNotSupported,PodOSSelectorNodeLabelDoesNotMatch";

impl Default for RejectionPolicy {
    fn default() -> Self {
        DEFAULT_REJECTION_REASONS
            .parse()
            .expect("the default rejection reasons parse")
    }
}

impl FromStr for RejectionPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let reasons: Vec<String> = text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(bad) = reasons
            .iter()
            .find(|r| r.contains(char::is_whitespace) || (r.contains('*') && !r.ends_with('*')))
        {
            return Err(format!(
                "{bad:?}: a reason is one word, optionally ending in * for a prefix"
            ));
        }
        Ok(RejectionPolicy { reasons })
    }
}

impl RejectionPolicy {
    pub fn matches(&self, reason: &str) -> bool {
        self.reasons.iter().any(|r| match r.strip_suffix('*') {
            Some(prefix) => reason.starts_with(prefix) && reason.len() > prefix.len(),
            None => r == reason,
        })
    }
}

/// A kubelet rejection of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
    pub node: Option<String>,
}

/// Whether a container of the pod ever started, or the pod was ever ready: then a failure is a
/// crash, not a rejection.
pub fn ever_ran(pod: &CachedPod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let started = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .any(|c| {
            c.ready
                || c.started == Some(true)
                || c.restart_count > 0
                || c.state
                    .as_ref()
                    .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        });
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == pod_conditions::READY && c.is(ConditionStatus::True));
    started || ready
}

/// The rejection, if the pod failed at admission with a reason in the policy.
pub fn detect(pod: &CachedPod, policy: &RejectionPolicy) -> Option<Rejection> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Failed") || ever_ran(pod) {
        return None;
    }
    let reason = status.reason.clone().filter(|r| policy.matches(r))?;
    Some(Rejection {
        reason,
        message: status.message.clone().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(status: Value) -> CachedPod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-3", "containers": []}, "status": status})).unwrap()
    }

    #[test]
    fn every_default_reason_is_a_rejection() {
        let policy = RejectionPolicy::default();
        for reason in [
            "OutOfcpu",
            "OutOfmemory",
            "OutOfpods",
            "OutOfephemeral-storage",
            "OutOfnvidia.com/gpu",
            "OutOfsomething",
            "NodeAffinity",
            "NodeSelectorMismatching",
            "UnexpectedAdmissionError",
            "InvalidNodeInfo",
            "NodeLabelsMismatch",
        ] {
            let found = detect(
                &pod(json!({"phase": "Failed", "reason": reason, "message": "whatever"})),
                &policy,
            );
            assert_eq!(found.map(|r| r.reason), Some(reason.to_owned()), "{reason}");
        }
    }

    #[test]
    fn the_message_wording_does_not_matter() {
        let policy = RejectionPolicy::default();
        for message in [
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 0, capacity: 2000",
            "Pod Node didn't have enough resource: memory, requested: 8589934592, used: 0, capacity: 4294967296",
            "",
        ] {
            let found = detect(
                &pod(json!({"phase": "Failed", "reason": "OutOfmemory", "message": message})),
                &policy,
            )
            .unwrap();
            assert_eq!(found.message, message);
            assert_eq!(found.node.as_deref(), Some("node-3"));
        }
    }

    #[test]
    fn not_rejections() {
        let policy = RejectionPolicy::default();
        let rows = [
            ("a Failed pod with no reason", json!({"phase": "Failed"})),
            (
                "an unknown reason",
                json!({"phase": "Failed", "reason": "Evicted"}),
            ),
            (
                "`OutOf` alone",
                json!({"phase": "Failed", "reason": "OutOf"}),
            ),
            (
                "a pending pod",
                json!({"phase": "Pending", "reason": "OutOfcpu"}),
            ),
            (
                "a pod that was ready",
                json!({"phase": "Failed", "reason": "OutOfcpu", "conditions": [{"type": "Ready", "status": "True"}]}),
            ),
            (
                "a pod whose container ran",
                json!({"phase": "Failed", "reason": "NodeAffinity", "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": false, "restartCount": 2, "state": {"terminated": {"exitCode": 1}}}]}),
            ),
        ];
        for (what, status) in rows {
            assert_eq!(detect(&pod(status), &policy), None, "{what}");
        }
    }

    /// Rule C10 and the lesson of the rejection work elsewhere: a pod that ever ran and then
    /// failed crashed; only one that never ran was rejected. Each sign of running on its own.
    #[test]
    fn a_pod_that_ran_in_any_way_is_a_crash_not_a_rejection() {
        let policy = RejectionPolicy::default();
        let container = |ready: bool, started: Option<bool>, restarts: i32, state: Value| json!({"name": "c", "image": "x", "imageID": "", "ready": ready, "started": started, "restartCount": restarts, "state": state});
        let waiting = json!({"waiting": {"reason": "ContainerCreating"}});
        let ran = [
            (
                "a container that is ready",
                container(true, None, 0, waiting.clone()),
            ),
            (
                "a container that started, not ready",
                container(false, Some(true), 0, waiting.clone()),
            ),
            (
                "a container that restarted once",
                container(false, Some(false), 1, waiting.clone()),
            ),
            (
                "a container running",
                container(false, None, 0, json!({"running": {}})),
            ),
            (
                "a container that terminated",
                container(false, None, 0, json!({"terminated": {"exitCode": 0}})),
            ),
        ];
        for (what, status) in &ran {
            for statuses in ["containerStatuses", "initContainerStatuses"] {
                let pod = pod(json!({"phase": "Failed", "reason": "OutOfcpu", statuses: [status]}));
                assert!(ever_ran(&pod), "{what} in {statuses}");
                assert_eq!(detect(&pod, &policy), None, "{what} in {statuses}");
            }
        }
        // One that never ran, beside another that did, still ran.
        let never = container(false, Some(false), 0, waiting.clone());
        let both = pod(
            json!({"phase": "Failed", "reason": "OutOfcpu", "containerStatuses": [never.clone(), ran[2].1.clone()]}),
        );
        assert!(ever_ran(&both));
        // Never ran: rejected. A Ready condition that is not True, or another condition that
        // is True, is no sign of running.
        let rejected = pod(json!({"phase": "Failed", "reason": "OutOfcpu",
            "containerStatuses": [never],
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}));
        assert!(!ever_ran(&rejected));
        assert!(detect(&rejected, &policy).is_some());
        assert!(!ever_ran(&pod(json!(null))));
    }

    #[test]
    fn the_set_is_configurable() {
        let policy: RejectionPolicy = "Evicted,Custom*".parse().unwrap();
        assert!(
            policy.matches("Evicted")
                && policy.matches("CustomThing")
                && !policy.matches("OutOfcpu")
        );
        assert!("Out Of".parse::<RejectionPolicy>().is_err());
        assert!("*Bad".parse::<RejectionPolicy>().is_err());
    }
}
