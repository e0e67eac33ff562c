//! Whether the admission policy of `deploy/admission/` is installed and enforcing: what makes
//! it safe to run a workspace that names another object (a service account, a secret, a
//! config map, a claim), since only admission knows who set the spec. Pure: the stored
//! policies and bindings in, what is missing out.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

/// The policy's (and its binding's) name.
pub const POLICY: &str = "workspaces.berth.dev";

/// The policy that keeps a workspace's kind record (`status.resolved`) the operator's: a
/// workspace of a kind needs it too.
pub const RECORD_POLICY: &str = "workspace-records.berth.dev";

/// `None` when the policy is installed, fails closed and a binding of it denies; else what is
/// missing, in words for the workspace's status.
pub fn missing<'a>(
    policies: impl IntoIterator<Item = &'a ValidatingAdmissionPolicy>,
    bindings: impl IntoIterator<Item = &'a ValidatingAdmissionPolicyBinding>,
) -> Option<String> {
    missing_policy(POLICY, policies, bindings)
}

/// [`missing`] for the policy named `name`.
pub fn missing_policy<'a>(
    name: &str,
    policies: impl IntoIterator<Item = &'a ValidatingAdmissionPolicy>,
    bindings: impl IntoIterator<Item = &'a ValidatingAdmissionPolicyBinding>,
) -> Option<String> {
    let Some(policy) = policies
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
    else {
        return Some(format!(
            "the ValidatingAdmissionPolicy {name} is not installed"
        ));
    };
    let ignores = policy
        .spec
        .as_ref()
        .and_then(|s| s.failure_policy.as_deref())
        == Some("Ignore");
    if ignores {
        return Some(format!(
            "the ValidatingAdmissionPolicy {name} has failurePolicy Ignore, so it does not fail closed"
        ));
    }
    let denies = bindings.into_iter().any(|b| {
        b.spec.as_ref().is_some_and(|s| {
            s.policy_name.as_deref() == Some(name)
                && s.validation_actions.iter().flatten().any(|a| a == "Deny")
        })
    });
    (!denies).then(|| {
        format!("no ValidatingAdmissionPolicyBinding of {name} has validationActions Deny")
    })
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
        assert_eq!(missing(&[policy("Fail")], &[binding(&["Deny"])]), None);
        assert_eq!(
            missing(&[], &[binding(&["Deny"])]).unwrap(),
            "the ValidatingAdmissionPolicy workspaces.berth.dev is not installed"
        );
        assert!(
            missing(&[policy("Fail")], &[])
                .unwrap()
                .contains("validationActions Deny")
        );
        assert!(missing(&[policy("Fail")], &[binding(&["Warn"])]).is_some());
        assert!(
            missing(&[policy("Ignore")], &[binding(&["Deny"])])
                .unwrap()
                .contains("Ignore")
        );
    }
}
