//! The controllers of apps/v1, as kube-controller-manager runs them: a Deployment rolls out
//! through a new ReplicaSet while its old ones scale down; a ReplicaSet keeps its number of
//! pods and reports how many are ready.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{
    apps::TEMPLATE_HASH,
    meta::now_rfc3339,
    recorder::Source,
    resources::ResourceType,
    sim::{DeleteOptions, Sim, WriteContext},
    store::{Change, ChangeKind},
};

pub const DEPLOYMENTS: &str = "apps/deployments";
pub const REPLICA_SETS: &str = "apps/replicasets";
const REVISION: &str = "deployment.kubernetes.io/revision";
/// How often every workload is looked at again, so a refused pod create is retried.
const RESYNC: Duration = Duration::from_secs(2);

/// FNV-1a over the template, written with the alphabet the real controller uses for names.
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let text = serde_json::to_string(template).unwrap_or_default();
    let hash = text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash.to_string()
        .bytes()
        .map(|digit| ALPHABET[usize::from(digit - b'0')] as char)
        .collect()
}

/// The template without its hash label: what makes a ReplicaSet belong to a template.
fn without_hash(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t["metadata"]["labels"].as_object_mut() {
        labels.remove(TEMPLATE_HASH);
        if labels.is_empty() {
            t["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }
    }
    t
}

/// `25%` of `total`, rounded up (surge) or down (unavailable), or a plain number.
fn resolve(value: &Value, total: i64, round_up: bool) -> i64 {
    match (value.as_i64(), value.as_str()) {
        (Some(n), _) => n,
        (None, Some(text)) => {
            let percent = text.trim_end_matches('%').parse::<i64>().unwrap_or(0);
            let scaled = percent * total;
            if round_up {
                (scaled + 99) / 100
            } else {
                scaled / 100
            }
        }
        _ => 0,
    }
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(object: &Value) -> &str {
    object["metadata"]["namespace"].as_str().unwrap_or_default()
}

fn uid(object: &Value) -> &str {
    object["metadata"]["uid"].as_str().unwrap_or_default()
}

fn replicas(object: &Value, part: &str, field: &str) -> i64 {
    object[part][field].as_i64().unwrap_or(0)
}

/// The UID of the object's controller, with its kind.
fn controller_of(object: &Value) -> Option<(&str, &str)> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .map(|r| {
            (
                r["kind"].as_str().unwrap_or_default(),
                r["uid"].as_str().unwrap_or_default(),
            )
        })
}

fn owner_reference(kind: &str, owner: &Value) -> Value {
    json!([{
        "apiVersion": "apps/v1", "kind": kind, "name": name(owner), "uid": uid(owner),
        "controller": true, "blockOwnerDeletion": true
    }])
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn is_active(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
}

/// The workloads one change asks to look at again: (storage, namespace, name).
type Key = (&'static str, String, String);

struct Controllers {
    sim: Arc<Sim>,
    deployments: Arc<ResourceType>,
    replica_sets: Arc<ResourceType>,
    pods: Arc<ResourceType>,
}

fn context(manager: &str) -> WriteContext {
    WriteContext::system(manager)
}

impl Controllers {
    fn event(&self, object: &Value, type_: &str, reason: &str, message: &str, component: &str) {
        self.sim.record(
            object,
            None,
            type_,
            reason,
            message,
            Source {
                component,
                host: "",
            },
        );
    }

    fn keys_of(&self, change: &Change) -> Vec<Key> {
        let object = &change.object;
        let key = |storage, o: &Value| (storage, namespace(o).to_owned(), name(o).to_owned());
        let owner = |o: &Value, kind: &str, storage: &'static str| -> Option<Key> {
            let (owner_kind, owner_uid) = controller_of(o)?;
            if owner_kind != kind {
                return None;
            }
            let (candidates, _) = self.sim.store.list(storage, Some(namespace(o)));
            candidates
                .iter()
                .find(|c| uid(c) == owner_uid)
                .map(|c| key(storage, c))
        };
        match &*change.storage {
            DEPLOYMENTS if change.kind != ChangeKind::Deleted => vec![key(DEPLOYMENTS, object)],
            REPLICA_SETS => {
                let mut keys: Vec<Key> = owner(object, "Deployment", DEPLOYMENTS)
                    .into_iter()
                    .collect();
                if change.kind != ChangeKind::Deleted {
                    keys.push(key(REPLICA_SETS, object));
                }
                keys
            }
            "/pods" => owner(object, "ReplicaSet", REPLICA_SETS)
                .into_iter()
                .collect(),
            _ => vec![],
        }
    }

    fn all(&self) -> BTreeSet<Key> {
        let mut keys = BTreeSet::new();
        for storage in [DEPLOYMENTS, REPLICA_SETS] {
            let (objects, _) = self.sim.store.list(storage, None);
            keys.extend(
                objects
                    .iter()
                    .map(|o| (storage, namespace(o).to_owned(), name(o).to_owned())),
            );
        }
        keys
    }

    fn sync(&self, (storage, ns, object_name): &Key) {
        let Some(object) = self.sim.store.get(storage, ns, object_name) else {
            return;
        };
        if !object["metadata"]["deletionTimestamp"].is_null() {
            return;
        }
        if *storage == DEPLOYMENTS {
            self.sync_deployment(&object);
        } else {
            self.sync_replica_set(&object);
        }
    }

    /// The ReplicaSet controller: as many active pods as `spec.replicas`, and the status.
    fn sync_replica_set(&self, rs: &Value) {
        let ctx = context("replicaset-controller");
        let owned = |sim: &Sim| -> Vec<Arc<Value>> {
            let (pods, _) = sim.store.list("/pods", Some(namespace(rs)));
            pods.into_iter()
                .filter(|p| controller_of(p).is_some_and(|(_, u)| u == uid(rs)) && is_active(p))
                .collect()
        };
        let mut pods = owned(&self.sim);
        let wanted = replicas(rs, "spec", "replicas");
        let mut failure = None;
        let have = pods.len() as i64;
        if have < wanted {
            let template = &rs["spec"]["template"];
            for _ in have..wanted {
                let mut metadata = template["metadata"].clone();
                if !metadata.is_object() {
                    metadata = json!({});
                }
                metadata["generateName"] = json!(format!("{}-", name(rs)));
                metadata["ownerReferences"] = owner_reference("ReplicaSet", rs);
                let pod = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": metadata, "spec": template["spec"].clone()
                });
                match self.sim.create(&self.pods, namespace(rs), pod, &ctx) {
                    Ok(written) => self.event(
                        rs,
                        "Normal",
                        "SuccessfulCreate",
                        &format!("Created pod: {}", name(&written.object)),
                        "replicaset-controller",
                    ),
                    Err(error) => {
                        let message = format!("Error creating: {error}");
                        self.event(
                            rs,
                            "Warning",
                            "FailedCreate",
                            &message,
                            "replicaset-controller",
                        );
                        failure = Some(message);
                        break;
                    }
                }
            }
        } else if have > wanted {
            // Pods that are least along go first: unscheduled, then not ready, then newest.
            pods.sort_by_key(|p| {
                (
                    !p["spec"]["nodeName"].is_null(),
                    is_ready(p),
                    std::cmp::Reverse(
                        p["metadata"]["creationTimestamp"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ),
                )
            });
            for pod in pods.iter().take((have - wanted) as usize) {
                if self
                    .sim
                    .delete(
                        &self.pods,
                        namespace(pod),
                        name(pod),
                        &DeleteOptions::default(),
                        &ctx,
                    )
                    .is_ok()
                {
                    self.event(
                        rs,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted pod: {}", name(pod)),
                        "replicaset-controller",
                    );
                }
            }
        }
        let pods = owned(&self.sim);
        let ready = pods.iter().filter(|p| is_ready(p)).count();
        let mut status = json!({
            "replicas": pods.len(),
            "fullyLabeledReplicas": pods.len(),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "observedGeneration": rs["metadata"]["generation"],
        });
        if let Some(message) = failure {
            let since = rs["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "ReplicaFailure" && c["message"] == message.as_str())
                .map(|c| c["lastTransitionTime"].clone())
                .unwrap_or_else(|| json!(now_rfc3339()));
            status["conditions"] = json!([{
                "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                "message": message, "lastTransitionTime": since
            }]);
        }
        self.write_status(
            &self.replica_sets,
            rs,
            status,
            "replicaset-controller",
            &["replicas"],
        );
    }

    /// Writes `status` unless it equals the stored one. Zero counts are left out, as the
    /// real types' `omitempty` fields are, except the `required` ones.
    fn write_status(
        &self,
        rt: &ResourceType,
        object: &Value,
        mut status: Value,
        manager: &str,
        required: &[&str],
    ) {
        if let Some(map) = status.as_object_mut() {
            map.retain(|k, v| required.contains(&k.as_str()) || !(v == &json!(0) || v.is_null()));
        }
        if object["status"] == status {
            return;
        }
        let mut updated = object.clone();
        updated["status"] = status;
        let _ = self.sim.update(
            rt,
            namespace(object),
            name(object),
            "status",
            updated,
            &context(manager),
        );
    }

    fn owned_replica_sets(&self, deployment: &Value) -> Vec<Arc<Value>> {
        let (sets, _) = self
            .sim
            .store
            .list(REPLICA_SETS, Some(namespace(deployment)));
        let mut sets: Vec<Arc<Value>> = sets
            .into_iter()
            .filter(|rs| controller_of(rs).is_some_and(|(_, u)| u == uid(deployment)))
            .collect();
        sets.sort_by_key(|rs| {
            rs["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        sets
    }

    /// Sets a ReplicaSet's `spec.replicas`, with the Deployment's event.
    fn scale(&self, deployment: &Value, rs: &Value, to: i64) -> Option<Value> {
        let from = replicas(rs, "spec", "replicas");
        if from == to {
            return Some(rs.clone());
        }
        let mut scaled = rs.clone();
        scaled["spec"]["replicas"] = json!(to);
        let written = self
            .sim
            .update(
                &self.replica_sets,
                namespace(rs),
                name(rs),
                "",
                scaled,
                &context("deployment-controller"),
            )
            .ok()?;
        let direction = if to > from { "up" } else { "down" };
        self.event(
            deployment,
            "Normal",
            "ScalingReplicaSet",
            &format!(
                "Scaled {direction} replica set {} from {from} to {to}",
                name(rs)
            ),
            "deployment-controller",
        );
        Some(written.object)
    }

    /// The ReplicaSet of the Deployment's current template, created when there is none.
    fn new_replica_set(&self, deployment: &Value, sets: &[Arc<Value>]) -> Option<Value> {
        let template = &deployment["spec"]["template"];
        if let Some(current) = sets
            .iter()
            .find(|rs| without_hash(&rs["spec"]["template"]) == without_hash(template))
        {
            return Some((**current).clone());
        }
        let hash = template_hash(template);
        let revision = sets
            .iter()
            .filter_map(|rs| {
                rs["metadata"]["annotations"][REVISION]
                    .as_str()?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .unwrap_or(0)
            + 1;
        let mut template = template.clone();
        template["metadata"]["labels"][TEMPLATE_HASH] = json!(hash);
        let mut selector = deployment["spec"]["selector"].clone();
        selector["matchLabels"][TEMPLATE_HASH] = json!(hash);
        let mut labels = template["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        let surge_start = if sets.is_empty() {
            replicas(deployment, "spec", "replicas")
        } else {
            0
        };
        let rs = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": format!("{}-{hash}", name(deployment)),
                "labels": labels,
                "annotations": {REVISION: revision.to_string()},
                "ownerReferences": owner_reference("Deployment", deployment),
            },
            "spec": {
                "replicas": surge_start,
                "selector": selector,
                "template": template,
                "minReadySeconds": deployment["spec"]["minReadySeconds"].as_i64().unwrap_or(0),
            }
        });
        match self.sim.create(
            &self.replica_sets,
            namespace(deployment),
            rs,
            &context("deployment-controller"),
        ) {
            Ok(written) => {
                if surge_start > 0 {
                    self.event(
                        deployment,
                        "Normal",
                        "ScalingReplicaSet",
                        &format!(
                            "Scaled up replica set {} from 0 to {surge_start}",
                            name(&written.object)
                        ),
                        "deployment-controller",
                    );
                }
                let mut annotated = deployment.clone();
                annotated["metadata"]["annotations"][REVISION] = json!(revision.to_string());
                let _ = self.sim.update(
                    &self.deployments,
                    namespace(deployment),
                    name(deployment),
                    "",
                    annotated,
                    &context("deployment-controller"),
                );
                Some(written.object)
            }
            Err(error) => {
                self.event(
                    deployment,
                    "Warning",
                    "FailedCreate",
                    &format!("Failed to create new replica set: {error}"),
                    "deployment-controller",
                );
                None
            }
        }
    }

    /// The Deployment controller: one rollout step (RollingUpdate within `maxSurge` and
    /// `maxUnavailable`, or Recreate), then the status.
    fn sync_deployment(&self, deployment: &Value) {
        let sets = self.owned_replica_sets(deployment);
        let Some(mut new) = self.new_replica_set(deployment, &sets) else {
            return;
        };
        let mut old: Vec<Value> = sets
            .iter()
            .filter(|rs| uid(rs) != uid(&new))
            .map(|rs| (**rs).clone())
            .collect();
        let desired = replicas(deployment, "spec", "replicas");
        let strategy = &deployment["spec"]["strategy"];
        let (surge, unavailable) = if strategy["type"] == "Recreate" {
            (0, desired)
        } else {
            let surge = resolve(&strategy["rollingUpdate"]["maxSurge"], desired, true);
            let unavailable = resolve(&strategy["rollingUpdate"]["maxUnavailable"], desired, false);
            (
                surge,
                if surge == 0 && unavailable == 0 {
                    1
                } else {
                    unavailable
                },
            )
        };
        if strategy["type"] == "Recreate" {
            for rs in old.iter_mut() {
                if let Some(scaled) = self.scale(deployment, rs, 0) {
                    *rs = scaled;
                }
            }
            let old_pods: i64 = old
                .iter()
                .map(|rs| replicas(rs, "status", "replicas"))
                .sum();
            if old_pods == 0
                && let Some(scaled) = self.scale(deployment, &new, desired)
            {
                new = scaled;
            }
        } else {
            let spec_total = |new: &Value, old: &[Value]| -> i64 {
                replicas(new, "spec", "replicas")
                    + old
                        .iter()
                        .map(|rs| replicas(rs, "spec", "replicas"))
                        .sum::<i64>()
            };
            let current = replicas(&new, "spec", "replicas");
            let target = if current < desired {
                let room = (desired + surge - spec_total(&new, &old)).max(0);
                (current + room).min(desired)
            } else {
                desired
            };
            if let Some(scaled) = self.scale(deployment, &new, target) {
                new = scaled;
            }
            let min_available = desired - unavailable;
            let new_unavailable =
                replicas(&new, "spec", "replicas") - replicas(&new, "status", "availableReplicas");
            let mut allowed = spec_total(&new, &old) - min_available - new_unavailable;
            for rs in old.iter_mut() {
                let have = replicas(rs, "spec", "replicas");
                if allowed <= 0 {
                    break;
                }
                if have == 0 {
                    continue;
                }
                let down = have.min(allowed);
                if let Some(scaled) = self.scale(deployment, rs, have - down) {
                    *rs = scaled;
                    allowed -= down;
                }
            }
        }
        self.deployment_status(deployment, &new, &old, desired, unavailable);
    }

    fn deployment_status(
        &self,
        deployment: &Value,
        new: &Value,
        old: &[Value],
        desired: i64,
        max_unavailable: i64,
    ) {
        let all: Vec<&Value> = std::iter::once(new).chain(old.iter()).collect();
        let sum =
            |part: &str, field: &str| all.iter().map(|rs| replicas(rs, part, field)).sum::<i64>();
        let available = sum("status", "availableReplicas");
        let total = sum("spec", "replicas");
        let updated = replicas(new, "status", "replicas");
        let complete = updated == desired
            && sum("status", "replicas") == desired
            && available == desired
            && replicas(new, "spec", "replicas") == desired;
        let condition = |type_: &str, status: bool, reason: &str, message: String| {
            let kept = deployment["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == type_)
                .cloned();
            let status = if status { "True" } else { "False" };
            match kept {
                Some(c)
                    if c["status"] == status
                        && c["reason"] == reason
                        && c["message"] == message.as_str() =>
                {
                    c
                }
                Some(c) if c["status"] == status => {
                    let mut c = c;
                    c["reason"] = json!(reason);
                    c["message"] = json!(message);
                    c["lastUpdateTime"] = json!(now_rfc3339());
                    c
                }
                _ => json!({
                    "type": type_, "status": status, "reason": reason, "message": message,
                    "lastUpdateTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()
                }),
            }
        };
        let minimum = available >= desired - max_unavailable;
        let conditions = vec![
            condition(
                "Available",
                minimum,
                if minimum {
                    "MinimumReplicasAvailable"
                } else {
                    "MinimumReplicasUnavailable"
                },
                if minimum {
                    "Deployment has minimum availability.".to_owned()
                } else {
                    "Deployment does not have minimum availability.".to_owned()
                },
            ),
            condition(
                "Progressing",
                true,
                if complete {
                    "NewReplicaSetAvailable"
                } else {
                    "ReplicaSetUpdated"
                },
                if complete {
                    format!("ReplicaSet \"{}\" has successfully progressed.", name(new))
                } else {
                    format!("ReplicaSet \"{}\" is progressing.", name(new))
                },
            ),
        ];
        let status = json!({
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": sum("status", "replicas"),
            "updatedReplicas": updated,
            "readyReplicas": sum("status", "readyReplicas"),
            "availableReplicas": available,
            "unavailableReplicas": (total - available).max(0),
            "conditions": conditions,
        });
        // The stored object may have moved on (the revision annotation): write on the latest.
        if let Some(latest) =
            self.sim
                .store
                .get(DEPLOYMENTS, namespace(deployment), name(deployment))
        {
            self.write_status(
                &self.deployments,
                &latest,
                status,
                "deployment-controller",
                &[],
            );
        }
    }
}

/// Runs the Deployment and ReplicaSet controllers until the sim stops.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim
        .store
        .subscribe_to_any(&[DEPLOYMENTS, REPLICA_SETS, "/pods"]);
    let (Some(deployments), Some(replica_sets), Some(pods)) = (
        sim.resource_type("apps", "v1", "deployments"),
        sim.resource_type("apps", "v1", "replicasets"),
        sim.resource_type("", "v1", "pods"),
    ) else {
        return;
    };
    let controllers = Controllers {
        sim,
        deployments,
        replica_sets,
        pods,
    };
    let mut pending = controllers.all();
    loop {
        // Deployments first: a rollout step changes ReplicaSets, which are then synced.
        let work: Vec<Key> = std::mem::take(&mut pending).into_iter().collect();
        for key in work.iter().filter(|k| k.0 == DEPLOYMENTS) {
            controllers.sync(key);
        }
        for key in work.iter().filter(|k| k.0 == REPLICA_SETS) {
            controllers.sync(key);
        }
        match tokio::time::timeout(RESYNC, changes.recv()).await {
            Err(_) => pending = controllers.all(),
            Ok(Err(RecvError::Closed)) => return,
            Ok(Err(RecvError::Lagged(_))) => pending = controllers.all(),
            Ok(Ok(change)) => {
                pending.extend(controllers.keys_of(&change));
                while let Ok(change) = changes.try_recv() {
                    pending.extend(controllers.keys_of(&change));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::{selector_string, selects, validate};

    #[test]
    fn percentages_round_as_the_real_controller_rounds_them() {
        assert_eq!(resolve(&json!("25%"), 2, true), 1);
        assert_eq!(resolve(&json!("25%"), 2, false), 0);
        assert_eq!(resolve(&json!("25%"), 4, false), 1);
        assert_eq!(resolve(&json!(3), 4, false), 3);
    }

    #[test]
    fn selectors_read_as_kubectl_writes_them_and_match_labels() {
        let selector = json!({"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]}]});
        assert_eq!(selector_string(&selector), "app=a,tier in (x,y)");
        assert!(selects(&selector, &json!({"app": "a", "tier": "x"})));
        assert!(!selects(&selector, &json!({"app": "a"})));
    }

    #[test]
    fn a_template_hash_is_stable_and_uses_the_name_alphabet() {
        let template = json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let hash = template_hash(&template);
        assert_eq!(hash, template_hash(&template));
        assert!(
            hash.chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
        let mut other = template.clone();
        other["spec"]["containers"][0]["image"] = json!("j");
        assert_ne!(hash, template_hash(&other));
    }

    #[test]
    fn a_selector_that_misses_the_template_is_refused_in_the_real_words() {
        let deployment = json!({"spec": {
            "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        }});
        let causes = validate(&deployment);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec.template.metadata.labels");
        assert_eq!(
            causes[0].message,
            "Invalid value: map[string]string{\"app\":\"b\"}: `selector` does not match template `labels`"
        );
    }
}
