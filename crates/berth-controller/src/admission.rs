//! Whether the admission policy of `deploy/admission/` is installed and enforcing: what makes
//! it safe to run a workspace that names another object (a service account, a secret, a
//! config map, a claim), since only admission knows who set the spec. Pure: the stored
//! policies and bindings in, what is missing out.

use k8s_openapi::{
    api::admissionregistration::v1::{
        MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
        ValidatingAdmissionPolicyBinding,
    },
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};

/// The policy's (and its binding's) name.
pub const POLICY: &str = "workspaces.berth.dev";

/// The policy that keeps a workspace's kind record (`status.resolved`) the operator's: a
/// workspace of a kind needs it too.
pub const RECORD_POLICY: &str = "workspace-records.berth.dev";

/// `None` when the policy is installed, fails closed and a binding of it denies in
/// `namespace`; else what is missing, in words for the workspace's status.
pub fn missing<'a>(
    policies: impl IntoIterator<Item = &'a ValidatingAdmissionPolicy>,
    bindings: impl IntoIterator<Item = &'a ValidatingAdmissionPolicyBinding>,
    namespace: &str,
) -> Option<String> {
    enforcement(POLICY, policies, bindings, namespace).err()
}

/// Whether the policy `name` enforces for workspaces of `namespace`: installed, failing
/// closed, selecting them, and bound with `validationActions` Deny by a binding that selects
/// them too. Ok: the highest resourceVersion of the policy and that binding (what the
/// enforcement stands on); Err: what is missing. A selector the operator cannot evaluate
/// (namespace labels other than `kubernetes.io/metadata.name`, a workspace's own labels,
/// excluded resources) counts as not selecting them: it fails closed.
pub fn enforcement<'a>(
    name: &str,
    policies: impl IntoIterator<Item = &'a ValidatingAdmissionPolicy>,
    bindings: impl IntoIterator<Item = &'a ValidatingAdmissionPolicyBinding>,
    namespace: &str,
) -> Result<u64, String> {
    let Some(policy) = policies
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
    else {
        return Err(format!(
            "the ValidatingAdmissionPolicy {name} is not installed"
        ));
    };
    let spec = policy.spec.as_ref();
    if spec.and_then(|s| s.failure_policy.as_deref()) == Some("Ignore") {
        return Err(format!(
            "the ValidatingAdmissionPolicy {name} has failurePolicy Ignore, so it does not fail closed"
        ));
    }
    let constraints = spec.and_then(|s| s.match_constraints.as_ref());
    if let Some(why) = constraints.and_then(|m| not_selecting(m, namespace)) {
        return Err(format!("the ValidatingAdmissionPolicy {name} {why}"));
    }
    let mut first_gap = None;
    for binding in bindings {
        let Some(spec) = binding.spec.as_ref() else {
            continue;
        };
        if spec.policy_name.as_deref() != Some(name)
            || !spec
                .validation_actions
                .iter()
                .flatten()
                .any(|a| a == "Deny")
        {
            continue;
        }
        match spec
            .match_resources
            .as_ref()
            .and_then(|m| not_selecting(m, namespace))
        {
            Some(why) => {
                first_gap.get_or_insert_with(|| {
                    format!(
                        "the ValidatingAdmissionPolicyBinding {} {why}",
                        binding.metadata.name.as_deref().unwrap_or_default()
                    )
                });
            }
            None => {
                return Ok(version(&policy.metadata).max(version(&binding.metadata)));
            }
        }
    }
    Err(first_gap.unwrap_or_else(|| {
        format!("no ValidatingAdmissionPolicyBinding of {name} has validationActions Deny")
    }))
}

fn version(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// Why `resources` may leave the workspaces of `namespace` out, if it may.
fn not_selecting(resources: &MatchResources, namespace: &str) -> Option<String> {
    if resources
        .object_selector
        .as_ref()
        .is_some_and(|s| !is_empty(s))
    {
        return Some(
            "selects by object labels (matchResources objectSelector), which a workspace's author sets"
                .to_owned(),
        );
    }
    let names_workspaces = |rule: &NamedRuleWithOperations| {
        let any = |list: &Option<Vec<String>>, value: &str| {
            list.iter().flatten().any(|v| v == "*" || v == value)
        };
        // `workspaces`, a subresource of it (the records' policy checks `workspaces/status`),
        // or every resource.
        let workspaces =
            rule.resources.iter().flatten().any(|r| {
                r == "*" || r == "*/*" || r == "workspaces" || r.starts_with("workspaces/")
            });
        any(&rule.api_groups, "berth.dev")
            && workspaces
            && rule
                .resource_names
                .as_ref()
                .is_none_or(|names| names.is_empty())
    };
    if resources
        .exclude_resource_rules
        .iter()
        .flatten()
        .any(&names_workspaces)
    {
        return Some("excludes workspaces (matchResources excludeResourceRules)".to_owned());
    }
    if let Some(rules) = resources.resource_rules.as_ref().filter(|r| !r.is_empty())
        && !rules.iter().any(&names_workspaces)
    {
        return Some("does not select workspaces (matchResources resourceRules)".to_owned());
    }
    let selector = resources.namespace_selector.as_ref()?;
    match selects_namespace(selector, namespace) {
        Some(true) => None,
        Some(false) => Some(format!(
            "does not select namespace {namespace} (its namespaceSelector)"
        )),
        None => Some(format!(
            "selects namespaces by labels the operator does not read, so it may leave namespace {namespace} out (its namespaceSelector; select by kubernetes.io/metadata.name, or not at all)"
        )),
    }
}

fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
}

/// Whether `selector` selects `namespace`, from the one label every namespace has
/// (`kubernetes.io/metadata.name`); None when it looks at any other.
fn selects_namespace(selector: &LabelSelector, namespace: &str) -> Option<bool> {
    const NAME_LABEL: &str = "kubernetes.io/metadata.name";
    let mut selected = true;
    for (key, value) in selector.match_labels.iter().flatten() {
        if key != NAME_LABEL {
            return None;
        }
        selected &= value == namespace;
    }
    for requirement in selector.match_expressions.iter().flatten() {
        if requirement.key != NAME_LABEL {
            return None;
        }
        let values = requirement.values.iter().flatten();
        selected &= match requirement.operator.as_str() {
            "In" => values.into_iter().any(|v| v == namespace),
            "NotIn" => !values.into_iter().any(|v| v == namespace),
            "Exists" => true,
            "DoesNotExist" => false,
            _ => return None,
        };
    }
    Some(selected)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(failure: &str) -> ValidatingAdmissionPolicy {
        serde_json::from_value(
            json!({"metadata": {"name": POLICY}, "spec": {"failurePolicy": failure}}),
        )
        .unwrap()
    }

    fn binding(actions: &[&str]) -> ValidatingAdmissionPolicyBinding {
        serde_json::from_value(json!({"metadata": {"name": "b"}, "spec": {"policyName": POLICY, "validationActions": actions}})).unwrap()
    }

    #[test]
    fn the_policy_enforces_only_when_installed_failing_closed_and_bound_to_deny() {
        assert_eq!(
            missing(&[policy("Fail")], &[binding(&["Deny"])], "team-a"),
            None
        );
        assert_eq!(
            missing(&[], &[binding(&["Deny"])], "team-a").unwrap(),
            "the ValidatingAdmissionPolicy workspaces.berth.dev is not installed"
        );
        assert!(
            missing(&[policy("Fail")], &[], "team-a")
                .unwrap()
                .contains("validationActions Deny")
        );
        assert!(missing(&[policy("Fail")], &[binding(&["Warn"])], "team-a").is_some());
        assert!(
            missing(&[policy("Ignore")], &[binding(&["Deny"])], "team-a")
                .unwrap()
                .contains("Ignore")
        );
    }

    fn binding_matching(resources: serde_json::Value) -> ValidatingAdmissionPolicyBinding {
        serde_json::from_value(json!({"metadata": {"name": "b", "resourceVersion": "42"},
            "spec": {"policyName": POLICY, "validationActions": ["Deny"], "matchResources": resources}}))
        .unwrap()
    }

    /// A Deny binding that leaves the workspace's namespace out counts as not installed there;
    /// one whose selector the operator cannot evaluate fails closed.
    #[test]
    fn a_binding_enforces_only_for_the_namespaces_it_selects() {
        let by_name = binding_matching(json!({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["team-b"]}]}}));
        assert_eq!(
            missing(&[policy("Fail")], std::slice::from_ref(&by_name), "team-a"),
            None
        );
        assert_eq!(
            missing(&[policy("Fail")], &[by_name], "team-b").unwrap(),
            "the ValidatingAdmissionPolicyBinding b does not select namespace team-b (its namespaceSelector)"
        );
        let by_label =
            binding_matching(json!({"namespaceSelector": {"matchLabels": {"checked": "yes"}}}));
        assert!(
            missing(&[policy("Fail")], &[by_label], "team-a")
                .unwrap()
                .contains("selects namespaces by labels the operator does not read")
        );
        let by_object =
            binding_matching(json!({"objectSelector": {"matchLabels": {"checked": "yes"}}}));
        assert!(
            missing(&[policy("Fail")], &[by_object], "team-a")
                .unwrap()
                .contains("objectSelector")
        );
        let excluding = binding_matching(json!({"excludeResourceRules": [
            {"apiGroups": ["berth.dev"], "apiVersions": ["*"], "operations": ["*"], "resources": ["workspaces"]}]}));
        assert!(
            missing(&[policy("Fail")], &[excluding], "team-a")
                .unwrap()
                .contains("excludeResourceRules")
        );
        // What it stands on: the newer of the policy's and the binding's versions.
        let mut installed = policy("Fail");
        installed.metadata.resource_version = Some("40".into());
        let selecting = binding_matching(json!({"namespaceSelector": {}}));
        assert_eq!(
            enforcement(
                POLICY,
                &[installed.clone()],
                std::slice::from_ref(&selecting),
                "team-a"
            ),
            Ok(42)
        );
        // A policy of a subresource of workspaces (the records') selects them; one of other
        // resources does not.
        let mut status_policy = installed.clone();
        status_policy.spec.as_mut().unwrap().match_constraints = serde_json::from_value(json!({
            "resourceRules": [{"apiGroups": ["berth.dev"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["workspaces/status"]}]})).unwrap();
        assert_eq!(
            enforcement(
                POLICY,
                &[status_policy],
                std::slice::from_ref(&selecting),
                "team-a"
            ),
            Ok(42)
        );
        let mut elsewhere = installed;
        elsewhere.spec.as_mut().unwrap().match_constraints = serde_json::from_value(json!({
            "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]})).unwrap();
        assert!(
            enforcement(POLICY, &[elsewhere], &[selecting], "team-a")
                .unwrap_err()
                .contains("does not select workspaces")
        );
    }
}
