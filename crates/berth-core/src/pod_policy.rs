//! What a workspace's pod may ask for beyond its own containers: tolerations, node selection,
//! and labels and annotations that other controllers act on. A Workspace grants nothing its
//! creator does not already have, so these are allowed only from the operator's allow-lists
//! (default: none), and keys that Berth and Kubernetes reserve never. Pure: the spec and the
//! allow-lists in, the first violation out.

use berth_api::{PodTemplate, WorkspaceSpec};
use k8s_openapi::api::core::v1::{Affinity, NodeSelectorTerm, PodAffinityTerm};

/// The operator's allow-lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodPolicy {
    /// Toleration keys a workspace may use; `*` allows any, including a toleration of every
    /// taint (`operator: Exists` without a key).
    pub tolerations: Vec<String>,
    /// Node label keys a workspace may select nodes by (node selector, node affinity, and the
    /// topology keys of pod affinity); `*` allows any.
    pub node_labels: Vec<String>,
    /// Namespaces other than its own whose pods a workspace's pod (anti-)affinity may select
    /// (`namespaces`); `*` allows any, and a `namespaceSelector` (which reaches any).
    pub affinity_namespaces: Vec<String>,
    /// Prefixes (`sidecar.istio.io`) of the pod labels and annotations a workspace may set.
    /// Keys without a prefix are always allowed; reserved keys never.
    pub metadata_prefixes: Vec<String>,
    /// The port the agent serves on in every workspace pod (`--agent-port`): a workspace may
    /// not declare it (the CRD refuses only the default, 50051). 0: not checked.
    pub agent_port: u16,
    /// The URL schemes `spec.content.git.url` may use (`--allowed-content-schemes`); empty:
    /// `berth_api::content::DEFAULT_SCHEMES`.
    pub content_schemes: Vec<String>,
}

/// Whether Berth or Kubernetes reserves a label or annotation key: `app` (the selector of
/// most Services), `berth.dev/*`, `app.kubernetes.io/*`, and any `kubernetes.io` or `k8s.io`
/// prefix (AppArmor, seccomp, and other security annotations live there).
pub fn is_reserved(key: &str) -> bool {
    if key == "app" {
        return true;
    }
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    ["berth.dev", "kubernetes.io", "k8s.io"]
        .iter()
        .any(|domain| prefix == *domain || prefix.ends_with(&format!(".{domain}")))
}

fn listed(list: &[String]) -> String {
    if list.is_empty() {
        "none".to_owned()
    } else {
        list.join(", ")
    }
}

fn allows(list: &[String], key: &str) -> bool {
    list.iter().any(|k| k == "*" || k == key)
}

/// The first thing in `spec` that the policy does not allow, as a message that names the
/// field, the value, and the operator setting that would allow it.
/// A workspace of a kind is scheduled as its kind says (the admin's choice, which the API
/// refuses the author to add to): only its metadata is the author's to check.
pub fn violation(spec: &WorkspaceSpec, policy: &PodPolicy) -> Option<String> {
    violation_in("", spec, policy)
}

/// [`violation`] for a workspace in `namespace` (which its pod affinity may always name).
pub fn violation_in(namespace: &str, spec: &WorkspaceSpec, policy: &PodPolicy) -> Option<String> {
    let agent = i32::from(policy.agent_port);
    if let Some(i) = spec
        .ports
        .iter()
        .position(|p| p.port == agent && agent != 0)
    {
        return Some(format!(
            "spec.ports[{i}]: port {agent} is the Berth agent's in every workspace pod (the operator's --agent-port); pick another port"
        ));
    }
    if let Some(git) = spec.content.as_ref().map(|c| &c.git) {
        let defaults = berth_api::content::DEFAULT_SCHEMES.map(str::to_owned);
        let allowed = match policy.content_schemes.is_empty() {
            true => &defaults[..],
            false => &policy.content_schemes[..],
        };
        if !allowed.iter().any(|s| s == git.scheme()) {
            return Some(format!(
                "spec.content.git.url: the scheme {:?} is not allowed; the operator allows content from (--allowed-content-schemes): {}",
                git.scheme(),
                listed(allowed)
            ));
        }
        let home = spec
            .pod_template
            .as_ref()
            .and_then(|t| t.volumes.as_ref())
            .and_then(|v| v.home.as_ref());
        if home.is_none() {
            return Some(format!(
                "spec.content: the repository is cloned into the home volume, and the workspace has none{}; set spec.podTemplate.volumes.home",
                match &spec.kind {
                    Some(kind) => format!(" (its kind {kind} gives none)"),
                    None => String::new(),
                }
            ));
        }
    }
    let template = spec.pod_template.as_ref()?;
    let authored = PodTemplate {
        metadata: template.metadata.clone(),
        ..Default::default()
    };
    let template = if spec.kind.is_some() {
        &authored
    } else {
        template
    };
    let not_allowed = |field: &str, what: String, flag: &str, list: &[String]| {
        format!(
            "spec.podTemplate.{field}: {what} is not allowed; the operator allows {flag}: {}",
            listed(list)
        )
    };
    for (i, toleration) in template.tolerations.iter().enumerate() {
        let key = toleration.key.as_deref().unwrap_or_default();
        if key.is_empty() && !allows(&policy.tolerations, "*") {
            return Some(not_allowed(
                &format!("tolerations[{i}]"),
                "a toleration of every taint (no key)".to_owned(),
                "tolerations of (--allowed-tolerations)",
                &policy.tolerations,
            ));
        }
        if !allows(&policy.tolerations, key) {
            return Some(not_allowed(
                &format!("tolerations[{i}]"),
                format!("key {key:?}"),
                "tolerations of (--allowed-tolerations)",
                &policy.tolerations,
            ));
        }
    }
    let node_label = |field: String, key: &str| {
        (!allows(&policy.node_labels, key)).then(|| {
            not_allowed(
                &field,
                format!("node label {key:?}"),
                "node selection by (--allowed-node-labels)",
                &policy.node_labels,
            )
        })
    };
    for key in template.node_selector.keys() {
        if let Some(v) = node_label("nodeSelector".to_owned(), key) {
            return Some(v);
        }
    }
    if let Some(affinity) = &template.affinity {
        for (field, key) in affinity_keys(affinity) {
            if let Some(v) = node_label(format!("affinity.{field}"), &key) {
                return Some(v);
            }
        }
        for (field, term) in pod_affinity_terms(affinity) {
            // Selecting pods of other namespaces tells the author where they run.
            let reached = match &term.namespace_selector {
                Some(_) if !allows(&policy.affinity_namespaces, "*") => {
                    Some("a namespaceSelector (pods of any namespace)".to_owned())
                }
                _ => term
                    .namespaces
                    .iter()
                    .flatten()
                    .find(|n| *n != namespace && !allows(&policy.affinity_namespaces, n))
                    .map(|n| format!("namespace {n:?}")),
            };
            if let Some(what) = reached {
                return Some(not_allowed(
                    &format!("affinity.{field}"),
                    what,
                    "pod affinity into other namespaces (--allowed-affinity-namespaces)",
                    &policy.affinity_namespaces,
                ));
            }
        }
    }
    let metadata = template.metadata.as_ref()?;
    for (field, keys) in [
        ("labels", metadata.labels.keys()),
        ("annotations", metadata.annotations.keys()),
    ] {
        for key in keys {
            if is_reserved(key) {
                return Some(format!(
                    "spec.podTemplate.metadata.{field}: {key:?} is reserved for Berth and Kubernetes (app, berth.dev/*, app.kubernetes.io/*, *kubernetes.io/*, *k8s.io/*)"
                ));
            }
            if let Some((prefix, _)) = key.split_once('/')
                && !allows(&policy.metadata_prefixes, prefix)
            {
                return Some(not_allowed(
                    &format!("metadata.{field}"),
                    format!("{key:?} (prefix {prefix})"),
                    "label and annotation prefixes (--allowed-metadata-prefixes)",
                    &policy.metadata_prefixes,
                ));
            }
        }
    }
    None
}

/// Every pod (anti-)affinity term, with where it is.
fn pod_affinity_terms(affinity: &Affinity) -> Vec<(&'static str, &PodAffinityTerm)> {
    let mut terms = vec![];
    for (field, pod) in [
        (
            "podAffinity",
            affinity.pod_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
        (
            "podAntiAffinity",
            affinity.pod_anti_affinity.as_ref().map(|p| {
                (
                    &p.required_during_scheduling_ignored_during_execution,
                    &p.preferred_during_scheduling_ignored_during_execution,
                )
            }),
        ),
    ] {
        if let Some((required, preferred)) = pod {
            terms.extend(
                required
                    .iter()
                    .flatten()
                    .chain(preferred.iter().flatten().map(|w| &w.pod_affinity_term))
                    .map(|t| (field, t)),
            );
        }
    }
    terms
}

/// Every node label key an affinity selects by, with where it is.
fn affinity_keys(affinity: &Affinity) -> Vec<(String, String)> {
    let mut keys = vec![];
    let mut terms = |field: &str, list: Vec<&NodeSelectorTerm>| {
        for term in list {
            for requirement in term
                .match_expressions
                .iter()
                .flatten()
                .chain(term.match_fields.iter().flatten())
            {
                keys.push((field.to_owned(), requirement.key.clone()));
            }
        }
    };
    if let Some(node) = &affinity.node_affinity {
        terms(
            "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            node.required_during_scheduling_ignored_during_execution
                .iter()
                .flat_map(|s| s.node_selector_terms.iter())
                .collect(),
        );
        terms(
            "nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
            node.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .map(|p| &p.preference)
                .collect(),
        );
    }
    for (field, term) in pod_affinity_terms(affinity) {
        keys.push((field.to_owned(), term.topology_key.clone()));
    }
    keys
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(template: serde_json::Value) -> WorkspaceSpec {
        serde_json::from_value(json!({"image": "x:1", "podTemplate": template})).unwrap()
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn reserved_keys_are_berths_and_kubernetes() {
        for key in [
            "app",
            "berth.dev/workspace",
            "app.kubernetes.io/name",
            "kubernetes.io/hostname",
            "container.apparmor.security.beta.kubernetes.io/workspace",
            "seccomp.security.alpha.kubernetes.io/pod",
            "node.k8s.io/x",
        ] {
            assert!(is_reserved(key), "{key}");
        }
        for key in [
            "team",
            "application",
            "sidecar.istio.io/inject",
            "example.com/app",
        ] {
            assert!(!is_reserved(key), "{key}");
        }
    }

    #[test]
    fn by_default_nothing_beyond_the_containers_is_allowed() {
        let policy = PodPolicy::default();
        assert_eq!(violation(&spec(json!({})), &policy), None);
        assert_eq!(
            violation(
                &spec(json!({"tolerations": [{"operator": "Exists"}]})),
                &policy
            )
            .unwrap(),
            "spec.podTemplate.tolerations[0]: a toleration of every taint (no key) is not allowed; the operator allows tolerations of (--allowed-tolerations): none"
        );
        assert_eq!(
            violation(
                &spec(json!({"nodeSelector": {"kubernetes.io/hostname": "node-1"}})),
                &policy
            )
            .unwrap(),
            "spec.podTemplate.nodeSelector: node label \"kubernetes.io/hostname\" is not allowed; the operator allows node selection by (--allowed-node-labels): none"
        );
        assert_eq!(
            violation(
                &spec(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]}}}})),
                &policy
            )
            .unwrap(),
            "spec.podTemplate.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: node label \"pool\" is not allowed; the operator allows node selection by (--allowed-node-labels): none"
        );
        assert_eq!(
            violation(
                &spec(json!({"metadata": {"labels": {"app": "payments"}}})),
                &policy
            )
            .unwrap(),
            "spec.podTemplate.metadata.labels: \"app\" is reserved for Berth and Kubernetes (app, berth.dev/*, app.kubernetes.io/*, *kubernetes.io/*, *k8s.io/*)"
        );
        assert_eq!(
            violation(
                &spec(json!({"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}})),
                &policy
            )
            .unwrap(),
            "spec.podTemplate.metadata.annotations: \"sidecar.istio.io/inject\" (prefix sidecar.istio.io) is not allowed; the operator allows label and annotation prefixes (--allowed-metadata-prefixes): none"
        );
        assert_eq!(
            violation(
                &spec(json!({"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}})),
                &policy
            ),
            None,
            "keys without a prefix are the user's"
        );
    }

    #[test]
    fn the_agents_port_is_not_a_workspaces_whatever_the_operator_set_it_to() {
        let policy = PodPolicy {
            agent_port: 6000,
            ..PodPolicy::default()
        };
        let spec = |port: i32| -> WorkspaceSpec {
            serde_json::from_value(json!({"image": "x:1", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": port}]})).unwrap()
        };
        assert_eq!(
            violation(&spec(6000), &policy).as_deref(),
            Some(
                "spec.ports[1]: port 6000 is the Berth agent's in every workspace pod (the operator's --agent-port); pick another port"
            )
        );
        assert_eq!(violation(&spec(6001), &policy), None);
        assert_eq!(violation(&spec(6000), &PodPolicy::default()), None);
    }

    #[test]
    fn content_comes_only_from_allowed_schemes_into_a_home() {
        let content = |url: &str, home: bool| -> WorkspaceSpec {
            let mut spec = json!({"image": "x:1", "command": ["sleep", "1d"], "content": {"git": {"url": url}}});
            if home {
                spec["podTemplate"] =
                    json!({"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}});
            }
            serde_json::from_value(spec).unwrap()
        };
        let policy = PodPolicy::default();
        for url in [
            "https://h/r.git",
            "ssh://git@h/r.git",
            "git@h:r.git",
            "git://h/r",
        ] {
            assert_eq!(violation(&content(url, true), &policy), None, "{url}");
        }
        assert_eq!(
            violation(&content("file:///srv/r.git", true), &policy).unwrap(),
            "spec.content.git.url: the scheme \"file\" is not allowed; the operator allows content from (--allowed-content-schemes): https, ssh, git"
        );
        let with_file = PodPolicy {
            content_schemes: strings(&["https", "file"]),
            ..PodPolicy::default()
        };
        assert_eq!(
            violation(&content("file:///srv/r.git", true), &with_file),
            None
        );
        assert!(
            violation(&content("git://h/r", true), &with_file)
                .unwrap()
                .contains("allows content from (--allowed-content-schemes): https, file")
        );
        assert_eq!(
            violation(&content("https://h/r.git", false), &policy).unwrap(),
            "spec.content: the repository is cloned into the home volume, and the workspace has none; set spec.podTemplate.volumes.home"
        );
    }

    #[test]
    fn the_allow_lists_allow_exactly_what_they_name() {
        let policy = PodPolicy {
            tolerations: strings(&["nvidia.com/gpu"]),
            node_labels: strings(&["pool", "topology.kubernetes.io/zone"]),
            metadata_prefixes: strings(&["example.com"]),
            ..PodPolicy::default()
        };
        let allowed = spec(json!({
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"pool": "gpu"},
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {"topologyKey": "topology.kubernetes.io/zone"}}]}},
            "metadata": {"annotations": {"example.com/owner": "a"}}
        }));
        assert_eq!(violation(&allowed, &policy), None);
        let other_key =
            spec(json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x"}]}));
        assert!(
            violation(&other_key, &policy)
                .unwrap()
                .ends_with("key \"dedicated\" is not allowed; the operator allows tolerations of (--allowed-tolerations): nvidia.com/gpu")
        );
        let everything = spec(json!({"tolerations": [{"operator": "Exists"}]}));
        assert!(violation(&everything, &policy).is_some());
        let anything = PodPolicy {
            tolerations: strings(&["*"]),
            ..PodPolicy::default()
        };
        assert_eq!(violation(&everything, &anything), None);
        let topology = spec(
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}}}),
        );
        assert!(violation(&topology, &policy).unwrap().starts_with(
            "spec.podTemplate.affinity.podAffinity: node label \"kubernetes.io/hostname\""
        ));
        // Pod affinity reaches only the workspace's own namespace unless others are allowed.
        let own = spec(
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "pool", "namespaces": ["team-a"]}]}}}),
        );
        assert_eq!(violation_in("team-a", &own, &policy), None);
        let other = spec(
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {"topologyKey": "pool", "namespaces": ["team-a", "payments"]}}]}}}),
        );
        assert_eq!(
            violation_in("team-a", &other, &policy).unwrap(),
            "spec.podTemplate.affinity.podAntiAffinity: namespace \"payments\" is not allowed; the operator allows pod affinity into other namespaces (--allowed-affinity-namespaces): none"
        );
        let selector = spec(
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "pool", "namespaceSelector": {}}]}}}),
        );
        assert!(
            violation_in("team-a", &selector, &policy)
                .unwrap()
                .contains("a namespaceSelector (pods of any namespace) is not allowed")
        );
        let payments = PodPolicy {
            affinity_namespaces: strings(&["payments"]),
            ..policy.clone()
        };
        assert_eq!(violation_in("team-a", &other, &payments), None);
        assert!(violation_in("team-a", &selector, &payments).is_some());
        let any = PodPolicy {
            affinity_namespaces: strings(&["*"]),
            ..policy.clone()
        };
        assert_eq!(violation_in("team-a", &selector, &any), None);
        // An allowed prefix never opens a reserved key.
        let reserved = PodPolicy {
            metadata_prefixes: strings(&["*"]),
            ..PodPolicy::default()
        };
        assert!(
            violation(
                &spec(json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/workspace": "unconfined"}}})),
                &reserved
            )
            .unwrap()
            .contains("is reserved for Berth and Kubernetes")
        );
    }
}
