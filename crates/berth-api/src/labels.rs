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
/// The bucket of an object's namespace (`berth_core::shard`): which operator shard
/// reconciles it, selected by the API server.
pub const SHARD: &str = "berth.dev/shard";
/// Pod annotation: hash of the pod-affecting part of the workspace spec (rule C5).
pub const SPEC_HASH: &str = "berth.dev/spec-hash";
/// Pod annotation: hash of the content its agent was given to clone (`spec.content`).
pub const CONTENT_HASH: &str = "berth.dev/content-hash";
/// The finalizer that lets the operator stop the pod before the workspace goes (rule C18).
pub const FINALIZER: &str = "berth.dev/cleanup";
/// The annotation of a Workspace that asks the admission policy to check its spec again
/// (any new value): how a spec written while the policy was not enforcing gets checked,
/// as whoever sets it.
pub const CHECK: &str = "berth.dev/check";
/// The annotation that names a workspace's owner, the user who created it (what
/// `deploy/admission-owners/` checks; the dashboard sets it to the person creating one).
pub const OWNER: &str = "berth.dev/owner";

/// The fewest hex digits of the hash a shortened or mapped name carries (40 bits).
pub const MIN_HASH_DIGITS: usize = 10;

/// `name` followed by `suffix` when that is shorter than `limit`; otherwise exactly `limit`
/// characters: the start of the name, a hash of the whole name, the suffix (see [`hashed`]).
/// What Berth derives from a workspace name (object names, label values) thereby stays within
/// the limits of its kind, however long the workspace name, and two names never derive the
/// same result: a name used as it is is always shorter than one that carries a hash.
pub fn bounded(name: &str, suffix: &str, limit: usize) -> String {
    if name.len() + suffix.len() < limit {
        return format!("{name}{suffix}");
    }
    hashed(name, name, suffix, limit)
}

/// Exactly `limit` characters: `readable` (a form of `name` valid for the kind), cut to fit,
/// then `-`, a hash of `name` filling the rest (at least [`MIN_HASH_DIGITS`] hex digits), then
/// `suffix`. Every derived name that is not the plain name takes this form, so it can never
/// equal a plain one (those are shorter than `limit`), and two of them differ by the hash of
/// the names they came from.
pub fn hashed(readable: &str, name: &str, suffix: &str, limit: usize) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let room = limit - suffix.len() - 1;
    let keep = readable.len().min(room - MIN_HASH_DIGITS);
    let mut head = readable[..keep].to_owned();
    // A cut may end the head with '.', which cannot stand before '-' in a DNS name; the
    // character before it is alphanumeric (a valid name has no ".-" or "..").
    if head.ends_with('.') {
        head.pop();
        head.push('-');
    }
    let hash: String = hex.chars().cycle().take(room - keep).collect();
    format!("{head}-{hash}{suffix}")
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
        // Cut at a dot: the start is mended so the value stays well formed.
        let dotted = format!("{}.{}", "a".repeat(52), "b".repeat(20));
        assert!(!workspace_label_value(&dotted).contains(".-"));
    }

    #[test]
    fn a_name_that_spells_another_names_hash_derives_something_else() {
        // 63 characters is one too many for a plain label value: it is hashed too, so a
        // workspace named like another's shortened label value never shares its label.
        let long = "c".repeat(80);
        let victim = workspace_label_value(&long);
        assert_eq!(victim.len(), 63);
        assert_ne!(workspace_label_value(&victim), victim);
        assert_eq!(workspace_label_value(&"d".repeat(62)), "d".repeat(62));
        assert_eq!(workspace_label_value(&"d".repeat(63)).len(), 63);
    }

    #[test]
    fn a_short_readable_form_is_filled_with_the_hash() {
        let name = hashed("ws-2a-b", "2a.b", "", 63);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with("ws-2a-b-"), "{name}");
        assert!(name[8..].chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    }
}
