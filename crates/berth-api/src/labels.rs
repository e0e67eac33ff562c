//! Label and annotation keys Berth puts on the objects it creates, and the finalizer name.

/// `app.kubernetes.io/managed-by`, always [`MANAGED_BY_VALUE`].
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "berth";
/// `app.kubernetes.io/name`, always [`NAME_VALUE`].
pub const NAME: &str = "app.kubernetes.io/name";
/// The value of [`NAME`].
pub const NAME_VALUE: &str = "workspace";
/// The name of the workspace an object belongs to.
pub const WORKSPACE: &str = "berth.dev/workspace";
/// Pod annotation: hash of the pod-affecting part of the workspace spec (rule C5).
pub const SPEC_HASH: &str = "berth.dev/spec-hash";
/// The finalizer that lets the operator stop the pod before the workspace goes (rule C18).
pub const FINALIZER: &str = "berth.dev/cleanup";

/// `name` followed by `suffix`, shortened to at most `limit` characters when too long: the
/// start of the name, a hash of the whole name (so two long names never collide), the suffix.
/// What Berth derives from a workspace name (object names, label values) thereby stays within
/// the limits of its kind, however long the workspace name.
pub fn bounded(name: &str, suffix: &str, limit: usize) -> String {
    use sha2::{Digest, Sha256};
    let full = format!("{name}{suffix}");
    if full.len() <= limit {
        return full;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let keep = limit - suffix.len() - hash.len() - 1;
    format!(
        "{}-{hash}{suffix}",
        name[..keep].trim_end_matches(['-', '.'])
    )
}

/// The value of the [`WORKSPACE`] label for a workspace: its name, or (past the 63 characters
/// a label value may have) its start and a hash. The pod's ownerReference names the workspace
/// in full.
pub fn workspace_label_value(workspace: &str) -> String {
    bounded(workspace, "", 63)
}

/// The labels every object Berth creates for `workspace` carries.
pub fn owned_labels(workspace: &str) -> std::collections::BTreeMap<String, String> {
    let value = workspace_label_value(workspace);
    [
        (MANAGED_BY, MANAGED_BY_VALUE),
        (NAME, NAME_VALUE),
        (WORKSPACE, value.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_labels_name_the_workspace() {
        let labels = owned_labels("alice-dev");
        assert_eq!(labels[MANAGED_BY], "berth");
        assert_eq!(labels[NAME], "workspace");
        assert_eq!(labels[WORKSPACE], "alice-dev");
        assert_eq!(labels.len(), 3);
    }

    #[test]
    fn a_long_name_becomes_a_bounded_label_value_unique_per_name() {
        let long = format!("{}-{}", "a".repeat(100), "b".repeat(150));
        let value = workspace_label_value(&long);
        assert_eq!(value.len(), 63);
        assert!(value.starts_with("aaaa"));
        assert_ne!(value, workspace_label_value(&format!("{long}x")));
        assert_eq!(workspace_label_value("short"), "short");
        // Cut at a dash or dot: the start is trimmed so the value stays well formed.
        let dotted = format!("{}.{}", "a".repeat(53), "b".repeat(20));
        assert!(!workspace_label_value(&dotted).contains(".-"));
    }
}
