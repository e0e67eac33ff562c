//! A name is not ownership: what Berth knows of an object that has a name it derives for a
//! workspace but is not that workspace's own (its controller ownerReference, by UID).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{action::Action, pod::is_owned_by};

/// The kinds of object Berth derives a name for, per workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Derived {
    Pod,
    Claim,
    Service,
}

impl Derived {
    /// The kind as a person reads it in a message (`Claim victim-home exists ...`).
    pub fn kind(self) -> &'static str {
        match self {
            Derived::Pod => "Pod",
            Derived::Claim => "Claim",
            Derived::Service => "Service",
        }
    }

    /// The action that creates it.
    pub fn create(self) -> Action {
        match self {
            Derived::Pod => Action::CreatePod,
            Derived::Claim => Action::CreateClaim,
            Derived::Service => Action::CreateService,
        }
    }
}

/// An object of a name Berth derives for the workspace that the workspace does not own. Berth
/// never mounts, patches, adopts or deletes it; the workspace says whose it is and waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    pub kind: Derived,
    pub name: String,
    /// Who controls it (`Workspace other`, `ReplicaSet web-5d8f`); `None`: nobody.
    pub owner: Option<String>,
    /// When a create of this name last met it, and how many creates in a row did; `None` when
    /// the caches show it (they show only objects labelled as Berth's).
    pub met: Option<Met>,
}

/// Creates refused because the name was taken, in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Met {
    pub at: Timestamp,
    pub attempts: u32,
}

/// The first look again waits this long; each create that meets the object again doubles it,
/// up to the requeue cap.
pub const FIRST_LOOK: Duration = Duration::from_secs(1);

impl Foreign {
    /// The object described by `meta`, when `workspace` does not own it.
    pub fn of(
        kind: Derived,
        meta: &ObjectMeta,
        workspace: &berth_api::Workspace,
        met: Option<Met>,
    ) -> Option<Self> {
        if is_owned_by(meta, workspace) {
            return None;
        }
        let references = meta.owner_references.iter().flatten();
        let controller = references
            .clone()
            .find(|r| r.controller == Some(true))
            .or_else(|| references.clone().next());
        Some(Foreign {
            kind,
            name: meta.name.clone().unwrap_or_default(),
            owner: controller.map(|r| format!("{} {}", r.kind, r.name)),
            met,
        })
    }

    /// What the workspace says: the object, its kind, who owns it, and the two ways out.
    pub fn message(&self) -> String {
        format!(
            "{kind} {name} exists and is not owned by this workspace (owned by {owner}); rename the workspace or delete the {noun}",
            kind = self.kind.kind(),
            name = self.name,
            owner = self.owner.as_deref().unwrap_or("nobody"),
            noun = self.kind.kind().to_ascii_lowercase(),
        )
    }

    /// How long from `now` until a create of the name is tried again (zero once it may): 1 s,
    /// 2 s, 4 s ... `cap` after the last create that met it; `None` for an object the caches
    /// show (no create is tried while it is there).
    pub fn look_again_in(&self, now: Timestamp, cap: Duration) -> Option<Duration> {
        let met = self.met?;
        let backoff = FIRST_LOOK
            .saturating_mul(1 << met.attempts.saturating_sub(1).min(20))
            .min(cap.max(FIRST_LOOK));
        let since = Duration::try_from(now.duration_since(met.at)).unwrap_or_default();
        Some(backoff.saturating_sub(since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(owners: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(json!({"name": "victim-home", "ownerReferences": owners})).unwrap()
    }

    #[test]
    fn a_foreign_object_names_its_kind_and_its_owner() {
        let ws = crate::pod::tests::workspace("victim", json!({"image": "x:1"}));
        let nobody = Foreign::of(Derived::Claim, &meta(json!([])), &ws, None).unwrap();
        assert_eq!(
            nobody.message(),
            "Claim victim-home exists and is not owned by this workspace (owned by nobody); rename the workspace or delete the claim"
        );
        let other = json!([{"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "name": "other", "uid": "u-2", "controller": true}]);
        let taken = Foreign::of(Derived::Service, &meta(other), &ws, None).unwrap();
        assert!(taken.message().contains("(owned by Workspace other)"));
        assert!(taken.message().ends_with("delete the service"));
        // A reference to the workspace that is not its controller is not ownership either.
        let loose = json!([{"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "name": "victim", "uid": "uid-victim"}]);
        assert!(Foreign::of(Derived::Pod, &meta(loose), &ws, None).is_some());
        let owned = json!([{"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "name": "victim", "uid": "uid-victim", "controller": true}]);
        assert_eq!(Foreign::of(Derived::Pod, &meta(owned), &ws, None), None);
    }

    #[test]
    fn a_create_that_met_it_is_tried_again_with_a_doubling_wait() {
        let at: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let cap = Duration::from_secs(60);
        let met = |attempts| Foreign {
            kind: Derived::Pod,
            name: "foo-ws".into(),
            owner: None,
            met: Some(Met { at, attempts }),
        };
        let later = |s: i64| at + jiff::SignedDuration::from_secs(s);
        assert_eq!(met(1).look_again_in(at, cap), Some(Duration::from_secs(1)));
        assert_eq!(met(1).look_again_in(later(1), cap), Some(Duration::ZERO));
        assert_eq!(
            met(3).look_again_in(later(1), cap),
            Some(Duration::from_secs(3))
        );
        assert_eq!(met(30).look_again_in(at, cap), Some(cap));
        let cached = Foreign {
            met: None,
            ..met(1)
        };
        assert_eq!(cached.look_again_in(at, cap), None);
    }
}
