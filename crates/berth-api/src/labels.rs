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

/// The labels every object Berth creates for `workspace` carries.
pub fn owned_labels(workspace: &str) -> std::collections::BTreeMap<String, String> {
    [
        (MANAGED_BY, MANAGED_BY_VALUE),
        (NAME, NAME_VALUE),
        (WORKSPACE, workspace),
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
}
