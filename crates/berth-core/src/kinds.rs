//! Where a workspace's kind enters the reconcile (before everything else): the record of what
//! the kind and options gave the workspace at its start is kept in force until the workspace
//! next starts from stopped, and the spec the core and the builders read is the author's spec
//! with that record applied. So a kind's change never restarts a pod; it is said instead
//! (`pendingRestart`, `UpdateAvailable`). Pure: the workspace and its kind in, the shaped
//! workspace and what the kind says of it out.

use std::{collections::BTreeMap, sync::Arc};

use berth_api::{
    ConditionStatus, KindError, KindResolution, Phase, Workspace, WorkspaceKind,
    condition::{HasReason, Reason, types},
    kind::{KindUsage, OptionUse, WorkspaceKindStatus},
    resolution,
};
use serde_json::{Map, Value};

use crate::shard::Shard;

/// What the kind says of a workspace, for the core's conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KindUpdate {
    /// The workspace names no kind.
    NoKind,
    /// The record in force is what the kind gives now.
    UpToDate { kind: String },
    /// The kind gives something else now: what differs, field by field.
    Changed {
        kind: String,
        differences: Vec<String>,
    },
    /// The kind, or the option picked, is gone. `blocks_start`: the workspace cannot start
    /// from it (no record, or a start from stopped); else it keeps running as recorded.
    Gone {
        error: KindError,
        blocks_start: bool,
    },
}

/// What an observation of a workspace without a kind says.
pub static NO_KIND: KindUpdate = KindUpdate::NoKind;

/// The workspace as the core and the builders read it, and what its kind says.
#[derive(Clone, Debug)]
pub struct Shaped {
    /// The spec with the record in force applied, and `status.resolved` the record.
    pub workspace: Workspace,
    pub update: KindUpdate,
}

/// Shapes `workspace` by its kind (`kind`: the cached WorkspaceKind its `spec.kind` names,
/// `None` when there is none). `has_own_pod`: the workspace's own pod exists. The record is
/// taken anew when the workspace starts from stopped (created, resumed: no pod of its own
/// and a phase of Pending or Stopped), while it is paused (so a resume starts from the kind
/// as it is), and when the author picks another kind or option; a pod replaced after a
/// rejection or a lost node is built from the same record.
pub fn shape(workspace: &Workspace, kind: Option<&WorkspaceKind>, has_own_pod: bool) -> Shaped {
    let mut shaped = workspace.clone();
    let spec = &workspace.spec;
    let Some(name) = spec.kind.as_deref() else {
        if let Some(status) = shaped.status.as_mut() {
            status.resolved = None;
        }
        return Shaped {
            workspace: shaped,
            update: KindUpdate::NoKind,
        };
    };
    let status = workspace.status.clone().unwrap_or_default();
    // A start the kind held up (Stalled: KindNotFound, OptionNotFound) is still a start from
    // stopped: the record of the run before it does not come back by itself.
    let held_up = status.conditions.iter().any(|c| {
        c.type_ == types::STALLED.as_str()
            && c.status == ConditionStatus::True.as_str()
            && [Reason::KindNotFound, Reason::OptionNotFound].contains(&c.reason())
    });
    let starts_from_stopped = !has_own_pod
        && (held_up || matches!(status.phase, None | Some(Phase::Pending | Phase::Stopped)));
    let fresh = spec.paused || starts_from_stopped;
    let now = resolution::resolve(name, kind.map(|k| &k.spec), spec.options.as_deref());
    let recorded = status.resolved.filter(|r| r.answers(spec));
    let (record, update): (Option<Arc<KindResolution>>, KindUpdate) = match (recorded, now) {
        (Some(record), Ok(now)) if !fresh => {
            let kind = kind.map(|k| &k.spec).expect("a kind resolved");
            let differences = record.differences(&now, kind);
            let update = if differences.is_empty() {
                KindUpdate::UpToDate {
                    kind: name.to_owned(),
                }
            } else {
                KindUpdate::Changed {
                    kind: name.to_owned(),
                    differences,
                }
            };
            (Some(record), update)
        }
        (_, Ok(now)) => (
            Some(Arc::new(now)),
            KindUpdate::UpToDate {
                kind: name.to_owned(),
            },
        ),
        (recorded, Err(error)) => {
            let blocks_start = recorded.is_none() || (fresh && !spec.paused);
            (
                recorded,
                KindUpdate::Gone {
                    error,
                    blocks_start,
                },
            )
        }
    };
    if let Some(record) = &record {
        shaped.spec = record.apply(spec);
    }
    shaped.status.get_or_insert_with(Default::default).resolved = record;
    Shaped {
        workspace: shaped,
        update,
    }
}

/// What each kind's status says (by kind name): how many workspaces name it, and how many use
/// each of its options: the option in force (the record's) and the one the workspace picks,
/// when it picks one (removing either would hold its next start).
pub fn usage<'a>(
    workspaces: impl IntoIterator<Item = &'a Workspace>,
) -> BTreeMap<String, KindUsage> {
    // Counted by borrowed names, and owned once per kind and id at the end: this runs over
    // every cached workspace, and copying each one's names made it 7.5 % of the operator's
    // CPU at 10 000 of a kind.
    #[derive(Default)]
    struct Counts<'a> {
        workspaces: u32,
        image: BTreeMap<&'a str, u32>,
        pod: BTreeMap<&'a str, u32>,
    }
    let mut counted: BTreeMap<&'a str, Counts<'a>> = BTreeMap::new();
    for workspace in workspaces {
        let Some(kind) = workspace.spec.kind.as_deref() else {
            continue;
        };
        let counts = counted.entry(kind).or_default();
        counts.workspaces += 1;
        let record = workspace
            .status
            .as_ref()
            .and_then(|s| s.resolved.as_ref())
            .filter(|r| r.kind == kind);
        let picked = workspace.spec.options.as_ref();
        for (counts, in_force, asked) in [
            (
                &mut counts.image,
                record.map(|r| r.image.id.as_str()),
                picked.and_then(|p| p.image.as_deref()),
            ),
            (
                &mut counts.pod,
                record.map(|r| r.pod.id.as_str()),
                picked.and_then(|p| p.pod.as_deref()),
            ),
        ] {
            // Each option the workspace holds counts once, even when it is both.
            for id in in_force
                .into_iter()
                .chain(asked.filter(|a| Some(*a) != in_force))
            {
                *counts.entry(id).or_default() += 1;
            }
        }
    }
    let owned = |ids: BTreeMap<&str, u32>| -> BTreeMap<String, u32> {
        ids.into_iter().map(|(id, n)| (id.to_owned(), n)).collect()
    };
    counted
        .into_iter()
        .map(|(kind, counts)| {
            let options = OptionUse {
                image: owned(counts.image),
                pod: owned(counts.pod),
            };
            let usage = KindUsage {
                workspaces: counts.workspaces,
                options: (options != OptionUse::default()).then_some(options),
            };
            (kind.to_owned(), usage)
        })
        .collect()
}

/// The JSON merge patch of a kind's `status` (`None`: nothing to write) that makes it say what
/// `shard` counted of its workspaces of the kind (`counted`, from [`usage`]).
///
/// Unsharded, that is the whole status (and no per-shard entries left from a sharded run).
/// Sharded, a shard sees only its own namespaces: it writes its own entry of `shards`, and
/// shard 0 also writes their sum as `workspaces` and `options` once every shard of this count
/// has an entry (a partial sum would let the admission policy delete a kind still in use),
/// and removes the entries of another shard count. Merge patches of disjoint keys, so the
/// shards' writes never undo each other's.
pub fn usage_patch(
    current: Option<&WorkspaceKindStatus>,
    counted: KindUsage,
    shard: Shard,
) -> Option<Value> {
    let mut wanted = current.cloned().unwrap_or_default();
    // Whether this write says the total (the whole kind's use).
    let mut total_said = shard.count() == 1;
    if shard.count() == 1 {
        wanted = status_of(counted);
    } else {
        wanted.shards.insert(shard.name(), counted);
        if shard.index() == 0 {
            let names: Vec<String> = (0..shard.count())
                .filter_map(|i| Shard::new(i, shard.count()))
                .map(Shard::name)
                .collect();
            wanted.shards.retain(|name, _| names.contains(name));
            let entries: Option<Vec<&KindUsage>> =
                names.iter().map(|name| wanted.shards.get(name)).collect();
            if let Some(entries) = entries {
                let total = status_of(sum(entries));
                (wanted.workspaces, wanted.options) = (total.workspaces, total.options);
                total_said = true;
            }
        }
    }
    let to_json = |status: &WorkspaceKindStatus| {
        serde_json::to_value(status).expect("a status always serializes")
    };
    // A kind without a status gets its total even when it is 0 (`kubectl get` shows it); a
    // shard's own entry alone says no total.
    let current = match current {
        Some(current) => to_json(current),
        None if total_said => Value::Null,
        None => to_json(&WorkspaceKindStatus::default()),
    };
    merge_patch(&current, &to_json(&wanted))
}

fn status_of(usage: KindUsage) -> WorkspaceKindStatus {
    WorkspaceKindStatus {
        workspaces: usage.workspaces,
        options: usage
            .options
            .filter(|options| *options != OptionUse::default()),
        shards: BTreeMap::new(),
    }
}

fn sum<'a>(entries: impl IntoIterator<Item = &'a KindUsage>) -> KindUsage {
    let mut total = KindUsage::default();
    for entry in entries {
        total.workspaces += entry.workspaces;
        let Some(options) = &entry.options else {
            continue;
        };
        let into = total.options.get_or_insert_with(OptionUse::default);
        for (counts, add) in [
            (&mut into.image, &options.image),
            (&mut into.pod, &options.pod),
        ] {
            for (id, n) in add {
                *counts.entry(id.clone()).or_default() += n;
            }
        }
    }
    total
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`: changed and new keys, `null`
/// for the removed ones; `None` when they are equal.
fn merge_patch(from: &Value, to: &Value) -> Option<Value> {
    if from == to {
        return None;
    }
    let (Value::Object(from), Value::Object(to)) = (from, to) else {
        return Some(to.clone());
    };
    let mut patch = Map::new();
    for (key, old) in from {
        match to.get(key) {
            None => {
                patch.insert(key.clone(), Value::Null);
            }
            Some(new) => {
                if let Some(change) = merge_patch(old, new) {
                    patch.insert(key.clone(), change);
                }
            }
        }
    }
    for (key, new) in to {
        if !from.contains_key(key) {
            patch.insert(key.clone(), new.clone());
        }
    }
    Some(Value::Object(patch))
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// Kind `python`: image options py311 (`image`, maybe redirecting to py312) and py312
    /// (`devbox:1.5`), pod option small, a home, an env variable and a service account.
    pub(crate) fn kind(image: &str, redirect: bool) -> WorkspaceKind {
        let mut py311 = json!({"id": "py311", "displayName": "3.11", "spec": {"image": image, "ports": [{"name": "http", "port": 8080}]}});
        if redirect {
            py311["redirect"] = json!({"to": "py312", "message": "3.11 is end of life"});
        }
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
            "metadata": {"name": "python"},
            "spec": {
                "spawner": {"displayName": "Python"},
                "options": {
                    "image": {"default": "py311", "values": [py311, {"id": "py312", "displayName": "3.12", "spec": {"image": "devbox:1.5"}}]},
                    "pod": {"default": "small", "values": [{"id": "small", "displayName": "Small", "spec": {"resources": {"limits": {"cpu": "1"}}}}]}
                },
                "home": {"mountPath": "/home/dev", "size": "1Gi"},
                "env": [{"name": "EDITOR", "value": "vi"}],
                "serviceAccountName": "python-dev"
            }
        }))
        .unwrap()
    }

    fn workspace(status: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({
            "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "w", "namespace": "n", "uid": "u-1"},
            "spec": {"kind": "python", "env": [{"name": "EDITOR", "value": "emacs"}], "command": ["sleep", "1d"]},
            "status": status
        }))
        .unwrap()
    }

    /// A workspace that started on the kind as `kind("devbox:1.4", false)` gives, now Running.
    fn running_on_devbox_1_4() -> Workspace {
        let started = shape(
            &workspace(json!({})),
            Some(&kind("devbox:1.4", false)),
            false,
        );
        let mut status = started.workspace.status.unwrap();
        status.phase = Some(Phase::Running);
        workspace(serde_json::to_value(&status).unwrap())
    }

    #[test]
    fn a_start_records_the_kind_and_the_spec_reads_it() {
        let shaped = shape(
            &workspace(json!({})),
            Some(&kind("devbox:1.4", false)),
            false,
        );
        assert_eq!(
            shaped.update,
            KindUpdate::UpToDate {
                kind: "python".into()
            }
        );
        let spec = &shaped.workspace.spec;
        assert_eq!(spec.image, "devbox:1.4");
        assert_eq!(spec.service_account_name.as_deref(), Some("python-dev"));
        assert_eq!(spec.ports[0].port, 8080);
        // The author's variable wins over the kind's of the same name.
        assert_eq!(spec.env.len(), 1);
        assert_eq!(spec.env[0].value.as_deref(), Some("emacs"));
        let home = spec
            .pod_template
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap();
        assert_eq!(home.home.as_ref().unwrap().mount_path.as_str(), "/home/dev");
        let record = shaped.workspace.status.unwrap().resolved.unwrap();
        assert_eq!(record.image.id, "py311");
        assert_eq!(record.pod.id, "small");
    }

    #[test]
    fn a_running_workspace_keeps_its_record_and_lists_what_changed() {
        let running = running_on_devbox_1_4();
        let shaped = shape(&running, Some(&kind("devbox:1.4", true)), true);
        assert_eq!(
            shaped.workspace.spec.image, "devbox:1.4",
            "no surprise upgrade"
        );
        assert_eq!(
            shaped.update,
            KindUpdate::Changed {
                kind: "python".into(),
                differences: vec![
                    r#"image: devbox:1.4 -> devbox:1.5 (option py311 redirects to py312: "3.11 is end of life")"#.into(),
                    r#"ports: [{"name":"http","port":8080}] -> none (option py311 redirects to py312: "3.11 is end of life")"#.into(),
                ]
            }
        );
        // A replacement pod (rejected, node lost: no pod, phase not Stopped) is the same shape.
        let mut lost = running.clone();
        lost.status.as_mut().unwrap().phase = Some(Phase::Starting);
        let replaced = shape(&lost, Some(&kind("devbox:1.4", true)), false);
        assert_eq!(replaced.workspace.spec.image, "devbox:1.4");
        // A resume takes the kind as it is.
        let mut stopped = running.clone();
        stopped.status.as_mut().unwrap().phase = Some(Phase::Stopped);
        let resumed = shape(&stopped, Some(&kind("devbox:1.4", true)), false);
        assert_eq!(resumed.workspace.spec.image, "devbox:1.5");
        let record = resumed.workspace.status.unwrap().resolved.unwrap();
        assert_eq!(
            (
                record.image.id.as_str(),
                record.image.redirected_from.as_deref()
            ),
            ("py312", Some("py311"))
        );
    }

    #[test]
    fn a_deleted_kind_leaves_a_running_workspace_running_and_blocks_a_start() {
        let running = running_on_devbox_1_4();
        let shaped = shape(&running, None, true);
        assert_eq!(shaped.workspace.spec.image, "devbox:1.4");
        assert!(matches!(
            shaped.update,
            KindUpdate::Gone {
                blocks_start: false,
                ..
            }
        ));
        // Held up at its start, it stays held up (the record of its last run does not start).
        let mut held = running.clone();
        let status = held.status.as_mut().unwrap();
        status.phase = Some(Phase::Error);
        status.conditions = vec![serde_json::from_value(json!({"type": "Stalled", "status": "True", "reason": "KindNotFound", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})).unwrap()];
        assert!(matches!(
            shape(&held, None, false).update,
            KindUpdate::Gone {
                blocks_start: true,
                ..
            }
        ));
        let new = shape(&workspace(json!({})), None, false);
        match new.update {
            KindUpdate::Gone {
                error,
                blocks_start: true,
            } => assert_eq!(error.reason(), "KindNotFound"),
            other => panic!("{other:?}"),
        }
    }

    /// A kind of arbitrary options and common fields, from generated values.
    fn generated_kind(
        images: &[String],
        cpus: &[u32],
        default_image: usize,
        redirect: bool,
        env: &[(String, String)],
        account: Option<String>,
        home: Option<String>,
    ) -> WorkspaceKind {
        let image_values: Vec<serde_json::Value> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                let mut option = json!({"id": format!("i{i}"), "displayName": image, "spec": {"image": image, "imagePullPolicy": "IfNotPresent", "ports": [{"name": "http", "port": 8000 + i}]}});
                if redirect && i == 0 && images.len() > 1 {
                    option["redirect"] = json!({"to": "i1", "message": "moved"});
                }
                option
            })
            .collect();
        let pod_values: Vec<serde_json::Value> = cpus
            .iter()
            .enumerate()
            .map(|(i, cpu)| json!({"id": format!("p{i}"), "displayName": "p", "spec": {"resources": {"limits": {"cpu": cpu.to_string()}}, "nodeSelector": {"pool": format!("p{i}")}}}))
            .collect();
        let mut spec = json!({
            "spawner": {"displayName": "generated"},
            "options": {
                "image": {"default": format!("i{}", default_image % images.len()), "values": image_values},
                "pod": {"default": "p0", "values": pod_values}
            },
            "env": env.iter().map(|(n, v)| json!({"name": n, "value": v})).collect::<Vec<_>>(),
            "probes": {"liveness": {"tcpSocket": {"port": 8000}}},
            "securityContext": {"pod": {"fsGroup": 1000}, "container": {"runAsUser": 1000}},
            "lifecycle": {"idleTimeout": "2h", "maxIdleTimeout": "8h"}
        });
        if let Some(account) = account {
            spec["serviceAccountName"] = json!(account);
        }
        if let Some(path) = home {
            spec["home"] = json!({"mountPath": path, "size": "1Gi"});
        }
        serde_json::from_value(json!({"apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind", "metadata": {"name": "gen"}, "spec": spec})).unwrap()
    }

    fn kinds() -> impl proptest::strategy::Strategy<Value = WorkspaceKind> {
        use proptest::prelude::*;
        (
            proptest::collection::vec("[a-z]{1,6}:[0-9]", 1..4),
            proptest::collection::vec(1u32..8, 1..3),
            0usize..4,
            any::<bool>(),
            proptest::collection::vec(("[A-Z]{1,4}", "[a-z]{0,4}"), 0..3),
            proptest::option::of("[a-z]{1,8}"),
            proptest::option::of("/home/[a-z]{1,6}"),
        )
            .prop_map(|(images, cpus, default, redirect, env, account, home)| {
                generated_kind(&images, &cpus, default, redirect, &env, account, home)
            })
    }

    proptest::proptest! {
        /// The pod a workspace of a kind gets at its start is the pod built again from its
        /// record (after the record went through the API as JSON), whatever the kind has
        /// become since: a replaced pod is the same shape, and a kind's edit restarts nothing.
        #[test]
        fn a_pod_from_the_kind_and_options_is_the_pod_from_the_record(
            at_start in kinds(),
            later in kinds(),
            pick_image in proptest::option::of(0usize..4),
            pick_pod in proptest::option::of(0usize..3),
        ) {
            let agent = crate::config::AgentConfig::default();
            let mut options = json!({});
            if let Some(i) = pick_image.filter(|i| *i < at_start.spec.options.image.values.len()) {
                options["image"] = json!(format!("i{i}"));
            }
            if let Some(i) = pick_pod.filter(|i| *i < at_start.spec.options.pod.values.len()) {
                options["pod"] = json!(format!("p{i}"));
            }
            let mut ws = workspace(json!({}));
            ws.spec.kind = Some("gen".into());
            ws.spec.options = serde_json::from_value(options).unwrap();
            let started = shape(&ws, Some(&at_start), false);
            let first = crate::pod::build_pod(&started.workspace, &agent);

            let mut running = ws.clone();
            let mut status = started.workspace.status.clone().unwrap();
            status.phase = Some(Phase::Running);
            let through_the_api = serde_json::to_string(&status).unwrap();
            running.status = Some(serde_json::from_str(&through_the_api).unwrap());
            let again = shape(&running, Some(&later), true);
            let rebuilt = crate::pod::build_pod(&again.workspace, &agent);
            proptest::prop_assert_eq!(&first, &rebuilt);
            proptest::prop_assert!(crate::pod::built_from(&crate::cached_pod::CachedPod::from(&first), &again.workspace));
            // And the record says whether the kind changed: it did exactly when a start now
            // would build another pod.
            let mut stopped = running.clone();
            stopped.status.as_mut().unwrap().phase = Some(Phase::Stopped);
            let fresh = shape(&stopped, Some(&later), false);
            let differs = crate::pod::build_pod(&fresh.workspace, &agent) != first;
            let pending = matches!(again.update, KindUpdate::Changed { .. });
            proptest::prop_assert!(!differs || pending, "{:?}", again.update);
        }
    }

    #[test]
    fn a_kinds_use_counts_workspaces_and_the_options_they_run_and_pick() {
        let started = shape(
            &workspace(json!({})),
            Some(&kind("devbox:1.4", true)),
            false,
        );
        let mut redirected = started.workspace.clone();
        redirected.spec = workspace(json!({})).spec;
        redirected.spec.options = Some(Box::new(berth_api::WorkspaceOptions {
            image: Some("py311".into()),
            pod: None,
        }));
        let mut other = workspace(json!({}));
        other.spec.kind = Some("other".into());
        // Picks by name the option it runs: that option counts once for it.
        let mut named = started.workspace.clone();
        named.spec.options = Some(Box::new(berth_api::WorkspaceOptions {
            image: Some("py312".into()),
            pod: Some("small".into()),
        }));
        let plain = crate::pod::tests::workspace("p", json!({"image": "x:1"}));
        let usage = usage([&started.workspace, &redirected, &other, &plain, &named]);
        assert_eq!(usage.len(), 2);
        let python = &usage["python"];
        assert_eq!(python.workspaces, 3);
        let options = python.options.as_ref().unwrap();
        // All run py312 (py311 redirects); one picks py311 by name.
        assert_eq!(
            options.image,
            [("py311".to_owned(), 1), ("py312".to_owned(), 3)].into()
        );
        assert_eq!(options.pod, [("small".to_owned(), 3)].into());
        assert_eq!(usage["other"].workspaces, 1);
        assert_eq!(usage["other"].options, None);
    }

    fn counted(workspaces: u32, image: &[(&str, u32)]) -> KindUsage {
        KindUsage {
            workspaces,
            options: (!image.is_empty()).then(|| OptionUse {
                image: image.iter().map(|(id, n)| (id.to_string(), *n)).collect(),
                pod: BTreeMap::new(),
            }),
        }
    }

    fn status(value: serde_json::Value) -> WorkspaceKindStatus {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn unsharded_the_count_is_the_whole_status_and_an_unchanged_one_is_not_written() {
        let all = Shard::ALL;
        assert_eq!(
            usage_patch(None, counted(0, &[]), all),
            Some(json!({"workspaces": 0}))
        );
        assert_eq!(
            usage_patch(None, counted(2, &[("py311", 2)]), all),
            Some(json!({"workspaces": 2, "options": {"image": {"py311": 2}}}))
        );
        let written = status(json!({"workspaces": 2, "options": {"image": {"py311": 2}}}));
        assert_eq!(
            usage_patch(Some(&written), counted(2, &[("py311", 2)]), all),
            None
        );
        // An option no longer used, and the entries of a sharded run before, are removed.
        let before = status(
            json!({"workspaces": 3, "options": {"image": {"py311": 2, "py312": 1}},
            "shards": {"0-of-2": {"workspaces": 1}, "1-of-2": {"workspaces": 2}}}),
        );
        assert_eq!(
            usage_patch(Some(&before), counted(2, &[("py311", 2)]), all),
            Some(json!({"workspaces": 2, "options": {"image": {"py312": null}}, "shards": null}))
        );
        assert_eq!(
            usage_patch(Some(&written), counted(0, &[]), all),
            Some(json!({"workspaces": 0, "options": null}))
        );
    }

    #[test]
    fn sharded_each_shard_writes_its_entry_and_shard_0_the_sum_once_every_shard_counted() {
        let (zero, one) = (Shard::new(0, 2).unwrap(), Shard::new(1, 2).unwrap());
        // Shard 1 writes only its own entry, even when the total is wrong.
        assert_eq!(
            usage_patch(None, counted(2, &[("py311", 2)]), one),
            Some(
                json!({"shards": {"1-of-2": {"workspaces": 2, "options": {"image": {"py311": 2}}}}})
            )
        );
        // Shard 0 before shard 1 counted: its entry, no partial sum.
        let unsharded = status(json!({"workspaces": 7}));
        assert_eq!(
            usage_patch(Some(&unsharded), counted(1, &[]), zero),
            Some(json!({"shards": {"0-of-2": {"workspaces": 1}}}))
        );
        // Once shard 1 has counted: the sum, and the entries of another shard count removed.
        let both = status(json!({"workspaces": 7, "shards": {
            "0-of-2": {"workspaces": 1},
            "1-of-2": {"workspaces": 2, "options": {"image": {"py311": 2}}},
            "2-of-3": {"workspaces": 5}}}));
        assert_eq!(
            usage_patch(Some(&both), counted(1, &[("py311", 1), ("py312", 1)]), zero),
            Some(json!({
                "workspaces": 3,
                "options": {"image": {"py311": 3, "py312": 1}},
                "shards": {
                    "0-of-2": {"options": {"image": {"py311": 1, "py312": 1}}},
                    "2-of-3": null,
                },
            }))
        );
        let settled = status(json!({"workspaces": 3, "shards": {
            "0-of-2": {"workspaces": 1}, "1-of-2": {"workspaces": 2}}}));
        assert_eq!(usage_patch(Some(&settled), counted(1, &[]), zero), None);
        assert_eq!(usage_patch(Some(&settled), counted(2, &[]), one), None);
    }
}
