//! Pods as the API server and kubelets finish them: binding to a node (the binding
//! subresource), the end of a graceful deletion, and pod IPs.

use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

use crate::{
    error::{ApiError, ApiResult},
    meta::{finalizers, meta_str, now_rfc3339},
    sim::Sim,
    store::{WriteError, resource_version},
};

impl Sim {
    /// Completes a pod's graceful deletion (what the kubelet does once containers stopped).
    pub fn finish_pod_termination(&self, namespace: &str, name: &str, uid: &str) {
        let Some(pods) = self.resource_type("", "v1", "pods") else {
            return;
        };
        let Some(current) = self.store.get(&pods.storage, namespace, name) else {
            return;
        };
        if meta_str(&current, "uid") != Some(uid)
            || current["metadata"]["deletionTimestamp"].is_null()
        {
            return;
        }
        if finalizers(&current).is_empty() {
            let _ = self.store.remove(
                &pods.storage,
                namespace,
                name,
                resource_version(&current).unwrap_or_default(),
            );
        } else {
            // Finalizers still hold it: it waits for them with no grace left.
            let mut new = (*current).clone();
            new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            let _ = self.store.replace(
                &pods.storage,
                new,
                resource_version(&current).unwrap_or_default(),
            );
        }
    }

    /// Binds a pending pod to a node, as the binding subresource does.
    pub fn bind(&self, namespace: &str, name: &str, node: &str) -> ApiResult<()> {
        for _ in 0..8 {
            let current = self
                .store
                .get("/pods", namespace, name)
                .ok_or_else(|| ApiError::not_found("pods", "", name))?;
            if let Some(existing) = current["spec"]["nodeName"]
                .as_str()
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict(
                    "pods",
                    "",
                    name,
                    &format!("pod {name} is already assigned to node \"{existing}\""),
                    vec![],
                ));
            }
            let mut bound = (*current).clone();
            bound["spec"]["nodeName"] = json!(node);
            let mut conditions = bound["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            conditions.retain(|c| c["type"] != "PodScheduled");
            conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}));
            bound["status"]["conditions"] = json!(conditions);
            match self.store.replace(
                &"/pods".into(),
                bound,
                resource_version(&current).unwrap_or_default(),
            ) {
                Ok(_) => return Ok(()),
                Err(WriteError::Stale) => continue,
                Err(_) => return Err(ApiError::not_found("pods", "", name)),
            }
        }
        Err(ApiError::conflict_modified("pods", "", name))
    }

    /// A fresh pod IP: a loopback address outside 127.0.0.0/16, unique across every sim in
    /// this process (servers in pods bind it) and starting at a random point, so sims in
    /// different processes rarely meet.
    pub fn next_pod_ip(&self) -> std::net::Ipv4Addr {
        static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
        let next = NEXT.get_or_init(|| AtomicU32::new(rand::random_range(1..1 << 22)));
        let n = next.fetch_add(1, Ordering::Relaxed) % (1 << 23);
        std::net::Ipv4Addr::new(
            127,
            1 + ((n >> 16) & 0x7f) as u8,
            ((n >> 8) & 0xff) as u8,
            (n & 0xff) as u8,
        )
    }
}

/// The container a request for a pod's logs, exec, attach names, or the pod's only one, as
/// the API server checks it.
pub fn container_named(pod: &Value, name: &str, wanted: Option<&str>) -> ApiResult<String> {
    let names = |key: &str| -> Vec<String> {
        pod["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (containers, init) = (names("containers"), names("initContainers"));
    let ephemeral = names("ephemeralContainers");
    match wanted.filter(|w| !w.is_empty()) {
        Some(wanted)
            if containers
                .iter()
                .chain(&init)
                .chain(&ephemeral)
                .any(|c| c == wanted) =>
        {
            Ok(wanted.to_owned())
        }
        Some(wanted) => Err(ApiError::bad_request(format!(
            "container {wanted} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_is_the_named_one_or_the_only_one() {
        let pod = json!({"spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "init"}]
        }});
        assert_eq!(container_named(&pod, "p", Some("b")).unwrap(), "b");
        assert_eq!(container_named(&pod, "p", Some("init")).unwrap(), "init");
        let message = |r: ApiResult<String>| r.unwrap_err().to_string();
        assert_eq!(
            message(container_named(&pod, "p", Some("c"))),
            "container c is not valid for pod p"
        );
        assert_eq!(
            message(container_named(&pod, "p", None)),
            "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [init]"
        );
        let one = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(container_named(&one, "p", None).unwrap(), "only");
    }
}
