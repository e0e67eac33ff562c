//! The kubelets: for every pod bound to a node, a worker drives what a real kubelet does, with
//! its event reasons and messages: admission (resource accounting and injected rejections),
//! volume setup (missing secrets and config maps give `FailedMount` with a growing count until
//! they appear), image pulls (`ErrImagePull` then `ImagePullBackOff` for unpullable images),
//! init containers, containers through the `ContainerRuntime`, readiness, restarts with
//! `CrashLoopBackOff`, and graceful termination with `Killing`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::Ipv4Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{
    auth::API_AUDIENCE,
    faults::REJECT_NEXT_ANNOTATION,
    meta::now_rfc3339,
    recorder::Source,
    runtime::{ContainerContext, ContainerLog, RunningContainer, VolumeMount, VolumeSource},
    scheduler,
    sim::Sim,
    store::ChangeKind,
};

/// Images each node has pulled, so a second pull says "already present".
#[derive(Default)]
pub struct ImageCache {
    pulled: Mutex<HashSet<(String, String)>>,
}

fn glob_matches(pattern: &str, text: &str) -> bool {
    let escaped: Vec<String> = pattern.split('*').map(regex::escape).collect();
    regex::Regex::new(&format!("^{}$", escaped.join(".*"))).is_ok_and(|re| re.is_match(text))
}

/// Why the worker stopped what it was doing.
enum Interrupt {
    /// The pod is being deleted (or is gone).
    Deleting,
}

struct Worker {
    sim: Arc<Sim>,
    node: String,
    namespace: String,
    name: String,
    uid: String,
    updates: watch::Receiver<Option<Arc<Value>>>,
    images: Arc<ImageCache>,
    pod_ip: Option<Ipv4Addr>,
    /// Stop handles of running containers, by name.
    running: HashMap<String, tokio::sync::oneshot::Sender<Duration>>,
    /// Container exits, (name, exit code), reported by one task per started container.
    exit_tx: tokio::sync::mpsc::UnboundedSender<(String, i32)>,
    exit_rx: tokio::sync::mpsc::UnboundedReceiver<(String, i32)>,
    /// Containers stopped to be replaced (their spec changed): their exit is not a crash.
    replaced: std::collections::HashSet<String>,
    /// Ephemeral containers started (`kubectl debug`): each runs once, is never restarted, and
    /// its exit changes nothing else of the pod.
    ephemeral: std::collections::HashSet<String>,
    /// Readiness probes failed in a row, by container: a ready container turns unready only
    /// after its probe's `failureThreshold` of them (3 by default), as with a real kubelet.
    probe_failures: HashMap<String, u32>,
    /// The readiness last written (ready containers, all ready) and the pod's revision after
    /// that write: a probe that finds the same on an unchanged pod writes nothing, without
    /// copying the pod to find out (that copy, each probe period of each pod, was a quarter
    /// of the sim's CPU with thousands of pods).
    readiness_written: Option<(u64, Vec<String>, bool)>,
}

fn source(node: &str) -> Source<'_> {
    Source {
        component: "kubelet",
        host: node,
    }
}

fn field_path(container: &str, init: bool) -> String {
    if init {
        format!("spec.initContainers{{{container}}}")
    } else {
        format!("spec.containers{{{container}}}")
    }
}

/// The lifetime the ServiceAccount admission asks for, which the API server extends.
const EXTENDED_TOKEN_REQUEST: u64 = 3607;

/// `$(NAME)` replaced by a variable defined before it, as the kubelet expands env values;
/// `$$` is a literal `$`, and an unknown reference stays as written.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after
            .strip_prefix('(')
            .and_then(|inner| inner.split_once(')'))
        {
            match env.iter().rfind(|(n, _)| n == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A pod field the downward API can name (`metadata.namespace`, `status.podIP`, ...).
fn pod_field(pod: &Value, path: &str) -> Option<String> {
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .or_else(|| path.strip_prefix("metadata.annotations['"))
        .and_then(|rest| rest.strip_suffix("']"))
    {
        let map = if path.starts_with("metadata.labels") {
            "labels"
        } else {
            "annotations"
        };
        return pod["metadata"][map][key].as_str().map(str::to_owned);
    }
    let value = path.split('.').fold(pod, |v, part| &v[part]);
    value.as_str().map(str::to_owned)
}

/// Which list of a pod's container statuses a container is reported in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Statuses {
    Init,
    Containers,
    Ephemeral,
}

/// The resources a container runs with (its spec's requests and limits), as its status
/// reports them.
fn running_resources(container: &Value) -> Value {
    let mut resources = serde_json::Map::new();
    for kind in ["requests", "limits"] {
        if let Some(map) = container["resources"][kind]
            .as_object()
            .filter(|m| !m.is_empty())
        {
            resources.insert(kind.to_owned(), Value::Object(map.clone()));
        }
    }
    Value::Object(resources)
}

/// A container status's `resources` and `allocatedResources` (its requests).
fn set_resources(status: &mut Value, resources: &Value) {
    status["resources"] = resources.clone();
    crate::meta::carry(status, "allocatedResources", resources.get("requests"));
}

fn container_id() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "containerd://{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

impl Worker {
    fn pod(&self) -> Option<Arc<Value>> {
        self.updates.borrow().clone()
    }

    fn deleting(&self) -> bool {
        self.pod().is_none_or(|p| {
            p["metadata"]["deletionTimestamp"].is_string()
                || p["metadata"]["uid"] != self.uid.as_str()
        })
    }

    /// Node faults freeze the kubelet: no status writes while unreachable.
    fn reachable(&self) -> bool {
        !self.sim.faults.is_unreachable(&self.node)
            && self
                .sim
                .store
                .get("/nodes", "", &self.node)
                .is_some_and(|n| {
                    n["metadata"]["annotations"][crate::faults::UNREACHABLE_ANNOTATION] != "true"
                })
    }

    /// Sleeps, waking early (with an interrupt) if the pod starts terminating.
    async fn wait(&mut self, duration: Duration) -> Result<(), Interrupt> {
        let deadline = tokio::time::sleep(duration);
        tokio::pin!(deadline);
        loop {
            if self.deleting() {
                return Err(Interrupt::Deleting);
            }
            tokio::select! {
                _ = &mut deadline => return if self.deleting() { Err(Interrupt::Deleting) } else { Ok(()) },
                changed = self.updates.changed() => if changed.is_err() { return Err(Interrupt::Deleting) },
            }
        }
    }

    fn event(&self, field: Option<&str>, type_: &str, reason: &str, message: &str) {
        if let Some(pod) = self.pod()
            && self.reachable()
        {
            self.sim
                .record(&pod, field, type_, reason, message, source(&self.node));
        }
    }

    /// Writes the pod's status through `change`, if the pod is still this one; the pod's
    /// revision after (unchanged or written).
    fn status(&self, change: impl Fn(&mut Value)) -> Option<u64> {
        if !self.reachable() {
            return None;
        }
        let uid = self.uid.clone();
        let after = self
            .sim
            .store
            .modify("/pods", &self.namespace, &self.name, |pod| {
                if pod["metadata"]["uid"] != uid.as_str() {
                    return false;
                }
                let before = pod["status"].clone();
                change(pod);
                pod["status"] != before
            })?;
        self.revision_of(&after)
    }

    /// The pod's stored revision, if it is still this worker's.
    fn stored_revision(&self) -> Option<u64> {
        let pod = self.sim.store.get("/pods", &self.namespace, &self.name)?;
        self.revision_of(&pod)
    }

    /// `pod`'s revision, if it is this worker's pod (not a later one of the same name).
    fn revision_of(&self, pod: &Value) -> Option<u64> {
        (pod["metadata"]["uid"] == self.uid.as_str())
            .then(|| crate::store::resource_version(pod))
            .flatten()
    }

    fn set_condition(
        pod: &mut Value,
        type_: &str,
        status: bool,
        reason: Option<&str>,
        message: Option<&str>,
    ) {
        let mut conditions = pod["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let wanted = if status { "True" } else { "False" };
        let now = now_rfc3339();
        match conditions.iter_mut().find(|c| c["type"] == type_) {
            Some(c) => {
                if c["status"] != wanted {
                    c["lastTransitionTime"] = json!(now);
                }
                c["status"] = json!(wanted);
                match reason {
                    Some(r) => c["reason"] = json!(r),
                    None => {
                        if let Some(m) = c.as_object_mut() {
                            m.remove("reason");
                        }
                    }
                }
                match message {
                    Some(m) => c["message"] = json!(m),
                    None => {
                        if let Some(m) = c.as_object_mut() {
                            m.remove("message");
                        }
                    }
                }
            }
            None => {
                let mut c = json!({"type": type_, "status": wanted, "lastProbeTime": null, "lastTransitionTime": now});
                if let Some(r) = reason {
                    c["reason"] = json!(r);
                }
                if let Some(m) = message {
                    c["message"] = json!(m);
                }
                conditions.push(c);
            }
        }
        let order = [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ];
        conditions.sort_by_key(|c| {
            order
                .iter()
                .position(|o| c["type"] == *o)
                .unwrap_or(order.len())
        });
        pod["status"]["conditions"] = json!(conditions);
    }

    /// Sets one container's status entry.
    fn container_status(pod: &mut Value, init: bool, name: &str, update: impl Fn(&mut Value)) {
        let list = if init {
            "initContainerStatuses"
        } else {
            "containerStatuses"
        };
        let specs = if init { "initContainers" } else { "containers" };
        let mut statuses = pod["status"][list].as_array().cloned().unwrap_or_default();
        let image = pod["spec"][specs]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .map(|c| c["image"].clone())
            .unwrap_or(Value::Null);
        let index = match statuses.iter().position(|s| s["name"] == name) {
            Some(i) => i,
            None => {
                statuses.push(json!({"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0, "started": false, "state": {"waiting": {"reason": if init { "PodInitializing" } else { "ContainerCreating" }}}}));
                statuses.len() - 1
            }
        };
        // The image stays the one the container was started with: a changed spec shows in
        // the status only once the container is restarted for it (`restart_changed`).
        update(&mut statuses[index]);
        pod["status"][list] = json!(statuses);
    }

    fn containers(&self, init: bool) -> Vec<Value> {
        let key = if init { "initContainers" } else { "containers" };
        self.pod()
            .and_then(|p| p["spec"][key].as_array().cloned())
            .unwrap_or_default()
    }

    fn reject(&self, reason: &str, message: &str) {
        self.event(None, "Warning", reason, message);
        let full = format!("Pod was rejected: {message}");
        self.status(|pod| {
            pod["status"]["phase"] = json!("Failed");
            pod["status"]["reason"] = json!(reason);
            pod["status"]["message"] = json!(full);
            if pod["status"]["startTime"].is_null() {
                pod["status"]["startTime"] = json!(now_rfc3339());
            }
        });
    }

    /// The kubelet's admission: injected rejections first, then node affinity and resources.
    fn admit(&self, pod: &Value) -> Result<(), (String, String)> {
        let node = self
            .sim
            .store
            .get("/nodes", "", &self.node)
            .ok_or_else(|| {
                (
                    "UnexpectedAdmissionError".to_owned(),
                    format!("node \"{}\" not found", self.node),
                )
            })?;
        let annotation = node["metadata"]["annotations"][REJECT_NEXT_ANNOTATION]
            .as_str()
            .map(str::to_owned);
        let injected = self
            .sim
            .faults
            .admission(&self.node)
            .map(|r| r.reason)
            .or_else(|| {
                let (count, reason) = annotation.as_deref()?.split_once(':')?;
                let count: u32 = count.trim().parse().ok().filter(|c| *c > 0)?;
                let reason = reason.trim().to_owned();
                self.sim.store.modify("/nodes", "", &self.node, |n| {
                    if count > 1 {
                        n["metadata"]["annotations"][REJECT_NEXT_ANNOTATION] =
                            json!(format!("{}:{reason}", count - 1));
                    } else if let Some(a) = n["metadata"]["annotations"].as_object_mut() {
                        a.remove(REJECT_NEXT_ANNOTATION);
                    }
                    true
                });
                Some(reason)
            });
        let wanted = scheduler::requests(pod);
        let room = scheduler::allocatable(&node);
        let mut used = scheduler::Requests::default();
        let mut count = 0;
        for other in self.sim.store.pods_on(&self.node) {
            if other["metadata"]["uid"] == self.uid.as_str()
                || !scheduler::is_active(&other)
                || other["status"]["phase"].is_null()
            {
                continue;
            }
            let r = scheduler::requests(&other);
            used.cpu_millis += r.cpu_millis;
            used.memory += r.memory;
            count += 1;
        }
        let resource = |name: &str, requested: i64, used: i64, capacity: i64| {
            (
                format!("OutOf{name}"),
                format!(
                    "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            )
        };
        if let Some(reason) = injected {
            return Err(match reason.as_str() {
                "OutOfcpu" => resource(
                    "cpu",
                    wanted.cpu_millis.max(1),
                    room.cpu_millis,
                    room.cpu_millis,
                ),
                "OutOfmemory" => resource("memory", wanted.memory.max(1), room.memory, room.memory),
                "OutOfpods" => resource("pods", 1, room.pods, room.pods),
                "NodeAffinity" | "NodeSelectorMismatching" => (
                    reason.clone(),
                    format!(
                        "Predicate {reason} failed: node(s) didn't match Pod's node affinity/selector"
                    ),
                ),
                "UnexpectedAdmissionError" => (
                    reason.clone(),
                    "Allocate failed due to can't allocate unhealthy devices, which is unexpected"
                        .to_owned(),
                ),
                other => (other.to_owned(), format!("Predicate {other} failed")),
            });
        }
        if !scheduler::selector_matches(pod, &node) {
            return Err((
                "NodeAffinity".to_owned(),
                "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
                    .to_owned(),
            ));
        }
        if wanted.cpu_millis > 0 && used.cpu_millis + wanted.cpu_millis > room.cpu_millis {
            return Err(resource(
                "cpu",
                wanted.cpu_millis,
                used.cpu_millis,
                room.cpu_millis,
            ));
        }
        if wanted.memory > 0 && used.memory + wanted.memory > room.memory {
            return Err(resource("memory", wanted.memory, used.memory, room.memory));
        }
        if count + 1 > room.pods {
            return Err(resource("pods", 1, count, room.pods));
        }
        Ok(())
    }

    /// The first volume that cannot be set up, as (volume, message).
    fn missing_volume(&self, pod: &Value) -> Option<(String, String)> {
        for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().unwrap_or_default();
            let check = |kind: &str,
                         storage: &str,
                         object: &str,
                         optional: bool|
             -> Option<(String, String)> {
                (!optional && self.sim.store.get(storage, &self.namespace, object).is_none())
                    .then(|| (name.to_owned(), format!("MountVolume.SetUp failed for volume \"{name}\" : {kind} \"{object}\" not found")))
            };
            let found = if let Some(secret) = volume["secret"].as_object() {
                check(
                    "secret",
                    "/secrets",
                    secret
                        .get("secretName")
                        .and_then(Value::as_str)
                        .unwrap_or_default(),
                    secret
                        .get("optional")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                )
            } else if let Some(cm) = volume["configMap"].as_object() {
                check(
                    "configmap",
                    "/configmaps",
                    cm.get("name").and_then(Value::as_str).unwrap_or_default(),
                    cm.get("optional").and_then(Value::as_bool).unwrap_or(false),
                )
            } else if let Some(claim) = volume["persistentVolumeClaim"].as_object() {
                let claim_name = claim
                    .get("claimName")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match self
                    .sim
                    .store
                    .get("/persistentvolumeclaims", &self.namespace, claim_name)
                {
                    None => Some((
                        name.to_owned(),
                        format!(
                            "MountVolume.SetUp failed for volume \"{name}\" : persistentvolumeclaim \"{claim_name}\" not found"
                        ),
                    )),
                    Some(c) if c["status"]["phase"] != "Bound" => Some((
                        name.to_owned(),
                        format!(
                            "MountVolume.SetUp failed for volume \"{name}\" : persistentvolumeclaim \"{claim_name}\" is not bound"
                        ),
                    )),
                    Some(_) => None,
                }
            } else {
                None
            };
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// What keeps a container from being created: a secret or config map key its env needs.
    fn config_error(&self, container: &Value) -> Option<String> {
        for env in container["env"].as_array().into_iter().flatten() {
            let from = &env["valueFrom"];
            for (kind, field, storage) in [
                ("secret", "secretKeyRef", "/secrets"),
                ("configmap", "configMapKeyRef", "/configmaps"),
            ] {
                let reference = &from[field];
                if reference.is_null() || reference["optional"] == true {
                    continue;
                }
                let object = reference["name"].as_str().unwrap_or_default();
                let key = reference["key"].as_str().unwrap_or_default();
                match self.sim.store.get(storage, &self.namespace, object) {
                    None => return Some(format!("{kind} \"{object}\" not found")),
                    Some(o) if o["data"][key].is_null() && o["stringData"][key].is_null() => {
                        return Some(format!(
                            "couldn't find key {key} in {} {}/{object}",
                            if kind == "secret" {
                                "Secret"
                            } else {
                                "ConfigMap"
                            },
                            self.namespace
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        None
    }

    /// Pulls a container's image until it succeeds (following spec changes).
    async fn pull(&mut self, init: bool, name: &str) -> Result<(), Interrupt> {
        let mut attempt = 0;
        loop {
            let container = self
                .containers(init)
                .into_iter()
                .find(|c| c["name"] == name)
                .unwrap_or_default();
            let image = container["image"].as_str().unwrap_or_default().to_owned();
            let path = field_path(name, init);
            let policy = container["imagePullPolicy"]
                .as_str()
                .unwrap_or("IfNotPresent");
            let cached = self
                .images
                .pulled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(self.node.clone(), image.clone()));
            let unpullable = self
                .sim
                .config
                .unpullable_images
                .iter()
                .any(|p| glob_matches(p, &image));
            if cached && policy != "Always" && !unpullable {
                self.event(
                    Some(&path),
                    "Normal",
                    "Pulled",
                    &format!("Container image \"{image}\" already present on machine"),
                );
                return Ok(());
            }
            self.event(
                Some(&path),
                "Normal",
                "Pulling",
                &format!("Pulling image \"{image}\""),
            );
            self.wait(self.sim.config.timings.pull).await?;
            if !unpullable {
                let took = self.sim.config.timings.pull.as_secs_f64();
                self.event(Some(&path), "Normal", "Pulled", &format!("Successfully pulled image \"{image}\" in {took:.3}s ({took:.3}s including waiting). Image size: 0 bytes."));
                self.images
                    .pulled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((self.node.clone(), image));
                return Ok(());
            }
            let detail = format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
            );
            self.event(
                Some(&path),
                "Warning",
                "Failed",
                &format!("Failed to pull image \"{image}\": {detail}"),
            );
            self.event(Some(&path), "Warning", "Failed", "Error: ErrImagePull");
            let failed_pull = detail.clone();
            self.status(|pod| {
                Self::container_status(pod, init, name, |s| {
                    s["state"] =
                        json!({"waiting": {"reason": "ErrImagePull", "message": failed_pull}})
                })
            });
            self.wait(
                self.sim
                    .config
                    .timings
                    .pull_backoff
                    .initial
                    .min(Duration::from_millis(500)),
            )
            .await?;
            let backoff = format!("Back-off pulling image \"{image}\"");
            self.event(Some(&path), "Normal", "BackOff", &backoff);
            self.event(Some(&path), "Warning", "Failed", "Error: ImagePullBackOff");
            self.status(|pod| {
                Self::container_status(pod, init, name, |s| {
                    s["state"] =
                        json!({"waiting": {"reason": "ImagePullBackOff", "message": backoff}})
                })
            });
            // A changed image is tried at once; otherwise after the backoff.
            let until = self.sim.config.timings.pull_backoff.after(attempt);
            attempt += 1;
            let deadline = tokio::time::Instant::now() + until;
            loop {
                let now_image = self
                    .containers(init)
                    .into_iter()
                    .find(|c| c["name"] == name)
                    .and_then(|c| c["image"].as_str().map(str::to_owned));
                if now_image.as_deref() != Some(image.as_str())
                    || tokio::time::Instant::now() >= deadline
                {
                    break;
                }
                self.wait(Duration::from_millis(20).min(until)).await?;
            }
        }
    }

    /// The files of a secret or config map, by key, as its volume would hold them
    /// (`items` pick and rename keys).
    fn object_files(&self, source: &Value, secret: bool) -> BTreeMap<String, Vec<u8>> {
        use base64::Engine;
        let (storage, name) = if secret {
            (
                "/secrets",
                source["secretName"].as_str().or(source["name"].as_str()),
            )
        } else {
            ("/configmaps", source["name"].as_str())
        };
        let Some(object) = self
            .sim
            .store
            .get(storage, &self.namespace, name.unwrap_or_default())
        else {
            return BTreeMap::new();
        };
        let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for (key, value) in object["data"].as_object().into_iter().flatten() {
            let text = value.as_str().unwrap_or_default();
            let bytes = if secret {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .unwrap_or_default()
            } else {
                text.as_bytes().to_vec()
            };
            data.insert(key.clone(), bytes);
        }
        match source["items"].as_array() {
            Some(items) => items
                .iter()
                .filter_map(|item| {
                    let key = item["key"].as_str().unwrap_or_default();
                    let path = item["path"].as_str().unwrap_or(key);
                    data.get(key).map(|bytes| (path.to_owned(), bytes.clone()))
                })
                .collect(),
            None => data,
        }
    }

    /// The files of a downward API source: the pod's own fields.
    fn downward_files(pod: &Value, source: &Value) -> BTreeMap<String, Vec<u8>> {
        source["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| {
                let field = item["fieldRef"]["fieldPath"].as_str()?;
                let value = pod_field(pod, field)?;
                Some((item["path"].as_str()?.to_owned(), value.into_bytes()))
            })
            .collect()
    }

    /// A projected service-account token, bound to the pod's account.
    fn token_file(&self, pod: &Value, source: &Value) -> BTreeMap<String, Vec<u8>> {
        let account = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default");
        let audiences = source["audience"]
            .as_str()
            .map(|a| vec![a.to_owned()])
            .unwrap_or_default();
        let seconds = source["expirationSeconds"].as_u64().unwrap_or(3600);
        // As kube-apiserver's --service-account-extend-token-expiration (on by default): the
        // admission plugin's 3607 s token is valid for a year, so a pod whose kubelet has not
        // refreshed the file (this one never does) keeps working.
        let seconds = if seconds == EXTENDED_TOKEN_REQUEST {
            365 * 24 * 3600
        } else {
            seconds
        };
        self.sim
            .tokens
            .issue_for_account(
                &self.sim.store,
                &self.namespace,
                account,
                audiences,
                Duration::from_secs(seconds),
            )
            .map(|(token, _)| {
                let path = source["path"].as_str().unwrap_or("token").to_owned();
                BTreeMap::from([(path, token.into_bytes())])
            })
            .unwrap_or_default()
    }

    /// The files of the secret, config map, downward API and projected volumes mounted into
    /// `container`, by path, as the kubelet would write them.
    fn mounted_files(&self, pod: &Value, container: &Value) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let Some(volume) = volumes.iter().find(|v| v["name"] == mount["name"]) else {
                continue;
            };
            let data = if volume["secret"].is_object() {
                self.object_files(&volume["secret"], true)
            } else if volume["configMap"].is_object() {
                self.object_files(&volume["configMap"], false)
            } else if volume["downwardAPI"].is_object() {
                Self::downward_files(pod, &volume["downwardAPI"])
            } else if let Some(sources) = volume["projected"]["sources"].as_array() {
                let mut data = BTreeMap::new();
                for source in sources {
                    data.extend(if source["secret"].is_object() {
                        self.object_files(&source["secret"], true)
                    } else if source["configMap"].is_object() {
                        self.object_files(&source["configMap"], false)
                    } else if source["downwardAPI"].is_object() {
                        Self::downward_files(pod, &source["downwardAPI"])
                    } else if source["serviceAccountToken"].is_object() {
                        self.token_file(pod, &source["serviceAccountToken"])
                    } else {
                        BTreeMap::new()
                    });
                }
                data
            } else {
                continue;
            };
            let base = mount["mountPath"]
                .as_str()
                .unwrap_or_default()
                .trim_end_matches('/');
            for (path, bytes) in data {
                files.insert(format!("{base}/{path}"), bytes);
            }
        }
        files
    }

    /// The container's volume mounts with where each volume's files come from: a claim's
    /// folder, the pod's `emptyDir`, or the files of a secret, config map, downward API or
    /// projected volume.
    fn volume_mounts(&self, pod: &Value, container: &Value) -> Vec<VolumeMount> {
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut mounts = vec![];
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = mount["name"].as_str().unwrap_or_default();
            let Some(volume) = volumes.iter().find(|v| v["name"] == name) else {
                continue;
            };
            let source = if let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str()
            {
                let Some(found) =
                    self.sim
                        .store
                        .get("/persistentvolumeclaims", &self.namespace, claim)
                else {
                    continue;
                };
                let size = found["status"]["capacity"]["storage"]
                    .as_str()
                    .or_else(|| found["spec"]["resources"]["requests"]["storage"].as_str());
                VolumeSource::Claim {
                    uid: found["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    capacity: size
                        .and_then(crate::quantity::units)
                        .and_then(|b| u64::try_from(b).ok()),
                }
            } else if volume["emptyDir"].is_object() {
                VolumeSource::EmptyDir {
                    volume: name.to_owned(),
                }
            } else {
                let only = json!({"volumeMounts": [{"name": name, "mountPath": ""}]});
                let files = self
                    .mounted_files(pod, &only)
                    .into_iter()
                    .map(|(path, bytes)| (path.trim_start_matches('/').to_owned(), bytes))
                    .collect();
                VolumeSource::Files {
                    volume: name.to_owned(),
                    files,
                }
            };
            mounts.push(VolumeMount {
                path: mount["mountPath"].as_str().unwrap_or_default().to_owned(),
                sub_path: mount["subPath"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
                read_only: mount["readOnly"].as_bool().unwrap_or(false),
                source,
            });
        }
        mounts
    }

    /// The container's environment as the kubelet gives it: its `env` with references
    /// resolved (a later duplicate wins), then the API server's service variables.
    fn environment(&self, pod: &Value, container: &Value) -> Vec<(String, String)> {
        use base64::Engine;
        let mut env: Vec<(String, String)> = vec![];
        let set = |env: &mut Vec<(String, String)>, name: &str, value: String| {
            env.retain(|(n, _)| n != name);
            env.push((name.to_owned(), value));
        };
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().unwrap_or_default();
            let from = &var["valueFrom"];
            let value = if let Some(value) = var["value"].as_str() {
                Some(value.to_owned())
            } else if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
                pod_field(pod, field)
            } else if from["secretKeyRef"].is_object() {
                let r = &from["secretKeyRef"];
                self.sim
                    .store
                    .get(
                        "/secrets",
                        &self.namespace,
                        r["name"].as_str().unwrap_or_default(),
                    )
                    .and_then(|s| {
                        s["data"][r["key"].as_str().unwrap_or_default()]
                            .as_str()
                            .map(str::to_owned)
                    })
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
            } else if from["configMapKeyRef"].is_object() {
                let r = &from["configMapKeyRef"];
                self.sim
                    .store
                    .get(
                        "/configmaps",
                        &self.namespace,
                        r["name"].as_str().unwrap_or_default(),
                    )
                    .and_then(|c| {
                        c["data"][r["key"].as_str().unwrap_or_default()]
                            .as_str()
                            .map(str::to_owned)
                    })
            } else {
                None
            };
            let value = value.unwrap_or_default();
            let expanded = expand(&value, &env);
            set(&mut env, name, expanded);
        }
        if let Some((host, port)) = self.sim.address.get().and_then(|a| a.rsplit_once(':')) {
            set(&mut env, "KUBERNETES_SERVICE_HOST", host.to_owned());
            set(&mut env, "KUBERNETES_SERVICE_PORT", port.to_owned());
            set(&mut env, "KUBERNETES_SERVICE_PORT_HTTPS", port.to_owned());
        }
        env
    }

    fn context(&self, container: &Value, init: bool) -> ContainerContext {
        let pod = self.pod().map(|p| (*p).clone()).unwrap_or_default();
        let account = pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let token = self
            .sim
            .tokens
            .issue_for_account(
                &self.sim.store,
                &self.namespace,
                &account,
                vec![API_AUDIENCE.to_owned()],
                Duration::from_secs(3600),
            )
            .map(|(t, _)| t)
            .unwrap_or_default();
        let env = self.environment(&pod, container);
        // The kubelet expands `$(VAR)` in command and args from the container's env.
        let mut expanded = container.clone();
        for key in ["command", "args"] {
            if let Some(words) = expanded[key].as_array_mut() {
                for word in words {
                    if let Some(text) = word.as_str() {
                        *word = Value::String(expand(text, &env));
                    }
                }
            }
        }
        ContainerContext {
            namespace: self.namespace.clone(),
            pod_name: self.name.clone(),
            pod_uid: self.uid.clone(),
            files: self.mounted_files(&pod, container),
            mounts: self.volume_mounts(&pod, container),
            env,
            log: {
                // A started container writes a new log, as `kubectl logs` shows the current one.
                let log = ContainerLog::default();
                let name = container["name"].as_str().unwrap_or_default().to_owned();
                let key = (self.uid.clone(), name);
                let previous = self
                    .sim
                    .logs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), log.clone());
                if let Some(previous) = previous {
                    self.sim
                        .previous_logs
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, previous);
                }
                log
            },
            pod,
            container: expanded,
            init,
            pod_ip: self.pod_ip.unwrap_or(Ipv4Addr::LOCALHOST),
            token,
            api_server: format!(
                "https://{}",
                self.sim
                    .address
                    .get()
                    .map(String::as_str)
                    .unwrap_or("127.0.0.1:443")
            ),
            ca_pem: self.sim.ca_pem.get().cloned().unwrap_or_default(),
        }
    }

    /// Creates and starts one container (pull, config check, runtime start).
    async fn start_container(&mut self, container: &Value, init: bool) -> Result<(), Interrupt> {
        let name = container["name"].as_str().unwrap_or_default().to_owned();
        let path = field_path(&name, init);
        self.pull(init, &name).await?;
        let mut attempt = 0;
        while let Some(problem) = self.config_error(container) {
            self.event(
                Some(&path),
                "Warning",
                "Failed",
                &format!("Error: {problem}"),
            );
            self.status(|pod| Self::container_status(pod, init, &name, |s| s["state"] = json!({"waiting": {"reason": "CreateContainerConfigError", "message": problem}})));
            self.wait(self.sim.config.timings.mount_retry.after(attempt))
                .await?;
            attempt += 1;
        }
        self.wait(self.sim.config.timings.container_start).await?;
        let current = self
            .containers(init)
            .into_iter()
            .find(|c| c["name"] == name.as_str())
            .unwrap_or_else(|| container.clone());
        self.event(
            Some(&path),
            "Normal",
            "Created",
            &format!("Created container: {name}"),
        );
        let context = self.context(&current, init);
        let kept = context.clone();
        match self.sim.config.runtime.start(context).await {
            Ok(running) => {
                let list = match init {
                    true => Statuses::Init,
                    false => Statuses::Containers,
                };
                self.started(&name, &path, kept, running, list);
                Ok(())
            }
            Err(error) => {
                self.event(
                    Some(&path),
                    "Warning",
                    "Failed",
                    &format!("Error: failed to create containerd task: {error}"),
                );
                self.status(|pod| {
                    Self::container_status(pod, init, &name, |s| {
                        s["state"] =
                            json!({"waiting": {"reason": "RunContainerError", "message": error}})
                    })
                });
                Ok(())
            }
        }
    }

    fn restart_policy(&self) -> String {
        self.pod()
            .and_then(|p| p["spec"]["restartPolicy"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "Always".to_owned())
    }

    /// Whether the container is ready: its readiness probe succeeds, or it has none. An
    /// `httpGet` probe is a real HTTP GET of its path (2xx and 3xx pass, as the kubelet's); a
    /// TCP or gRPC probe is a TCP connect to the pod IP. Ports may be named.
    async fn probe(&self, container: &Value) -> bool {
        let probe = &container["readinessProbe"];
        let port_of = |port: &Value| {
            port.as_u64().or_else(|| {
                let name = port.as_str()?;
                container["ports"]
                    .as_array()?
                    .iter()
                    .find(|p| p["name"] == name)?["containerPort"]
                    .as_u64()
            })
        };
        let http = &probe["httpGet"];
        let port = port_of(&probe["tcpSocket"]["port"])
            .or_else(|| port_of(&probe["grpc"]["port"]))
            .or_else(|| port_of(&http["port"]));
        let (Some(port), Some(ip)) = (port, self.pod_ip) else {
            return true;
        };
        let timeout = Duration::from_secs(probe["timeoutSeconds"].as_u64().unwrap_or(1))
            .max(Duration::from_millis(500));
        let address = std::net::SocketAddr::from((ip, port as u16));
        let plain_http = http.is_object() && http["scheme"].as_str().is_none_or(|s| s == "HTTP");
        let check = async {
            let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
            if !plain_http {
                return Some(true);
            }
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let path = http["path"].as_str().unwrap_or("/");
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = [0u8; 64];
            let mut read = 0;
            while read < 12 {
                let n = stream.read(&mut head[read..]).await.ok()?;
                if n == 0 {
                    break;
                }
                read += n;
            }
            let line = String::from_utf8_lossy(&head[..read]);
            let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some((200..400).contains(&code))
        };
        matches!(tokio::time::timeout(timeout, check).await, Ok(Some(true)))
    }

    async fn run(mut self) {
        let Some(pod) = self.pod() else { return };
        if pod["status"]["phase"]
            .as_str()
            .is_some_and(|p| p != "Pending")
        {
            // A pod this kubelet already started before (e.g. the sim restarted its workers).
            return;
        }
        if let Err((reason, message)) = self.admit(&pod) {
            self.reject(&reason, &message);
            return;
        }
        match self.start().await {
            Ok(()) => self.supervise().await,
            Err(Interrupt::Deleting) => {}
        }
        self.terminate().await;
    }

    /// From admission to running containers.
    async fn start(&mut self) -> Result<(), Interrupt> {
        let host_ip = self
            .sim
            .store
            .get("/nodes", "", &self.node)
            .and_then(|n| {
                n["status"]["addresses"][0]["address"]
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        let containers = self.containers(false);
        let inits = self.containers(true);
        let names: Vec<String> = containers
            .iter()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect();
        let unready = format!("containers with unready status: [{}]", names.join(" "));
        self.status(|pod| {
            pod["status"]["phase"] = json!("Pending");
            pod["status"]["hostIP"] = json!(host_ip);
            pod["status"]["hostIPs"] = json!([{"ip": host_ip}]);
            pod["status"]["startTime"] = json!(now_rfc3339());
            Self::set_condition(pod, "PodReadyToStartContainers", false, None, None);
            Self::set_condition(
                pod,
                "Initialized",
                inits.is_empty(),
                (!inits.is_empty()).then_some("ContainersNotInitialized"),
                None,
            );
            Self::set_condition(
                pod,
                "Ready",
                false,
                Some("ContainersNotReady"),
                Some(&unready),
            );
            Self::set_condition(
                pod,
                "ContainersReady",
                false,
                Some("ContainersNotReady"),
                Some(&unready),
            );
            for c in &inits {
                Self::container_status(pod, true, c["name"].as_str().unwrap_or_default(), |_| {});
            }
            for c in &containers {
                Self::container_status(pod, false, c["name"].as_str().unwrap_or_default(), |_| {});
            }
        });

        let mut attempt = 0;
        loop {
            let Some(pod) = self.pod() else {
                return Err(Interrupt::Deleting);
            };
            match self.missing_volume(&pod) {
                None => break,
                Some((_, message)) => {
                    self.event(None, "Warning", "FailedMount", &message);
                    self.wait(self.sim.config.timings.mount_retry.after(attempt))
                        .await?;
                    attempt += 1;
                }
            }
        }

        self.wait(self.sim.config.timings.sandbox).await?;
        let ip = self.sim.next_pod_ip();
        self.pod_ip = Some(ip);
        self.status(|pod| {
            pod["status"]["podIP"] = json!(ip.to_string());
            pod["status"]["podIPs"] = json!([{"ip": ip.to_string()}]);
            Self::set_condition(pod, "PodReadyToStartContainers", true, None, None);
        });

        for init in &inits {
            let name = init["name"].as_str().unwrap_or_default().to_owned();
            let mut attempt = 0;
            loop {
                self.start_container(init, true).await?;
                let code = if self.running.contains_key(&name) {
                    loop {
                        if self.deleting() {
                            return Err(Interrupt::Deleting);
                        }
                        tokio::select! {
                            exit = self.exit_rx.recv() => match exit {
                                Some((exited, code)) if exited == name => break code,
                                Some(_) => {}
                                None => return Err(Interrupt::Deleting),
                            },
                            changed = self.updates.changed() => if changed.is_err() { return Err(Interrupt::Deleting) },
                        }
                    }
                } else {
                    1
                };
                self.running.remove(&name);
                let terminated = self.exited(&name, code);
                self.status(|pod| {
                    Self::container_status(pod, true, &name, |s| {
                        s["state"] = json!({"terminated": terminated});
                        s["ready"] = json!(code == 0);
                        s["started"] = json!(false);
                    })
                });
                if code == 0 {
                    break;
                }
                if self.restart_policy() == "Never" {
                    self.status(|pod| pod["status"]["phase"] = json!("Failed"));
                    loop {
                        self.wait(Duration::from_secs(3600)).await?;
                    }
                }
                let delay = self.sim.config.timings.crash_backoff.after(attempt);
                attempt += 1;
                self.event(
                    Some(&field_path(&name, true)),
                    "Warning",
                    "BackOff",
                    &format!(
                        "Back-off restarting failed container {name} in pod {}_{}({})",
                        self.name, self.namespace, self.uid
                    ),
                );
                // `Init:Error` for a moment, then `Init:CrashLoopBackOff` until it runs again.
                self.wait(self.sim.config.timings.container_start).await?;
                let waiting = self.back_off_message(&name, delay);
                self.status(|pod| {
                    Self::container_status(pod, true, &name, |s| {
                        s["lastState"] = json!({"terminated": s["state"]["terminated"].clone()});
                        s["state"] =
                            json!({"waiting": {"reason": "CrashLoopBackOff", "message": waiting}});
                        s["restartCount"] = json!(s["restartCount"].as_i64().unwrap_or(0) + 1);
                    })
                });
                self.wait(delay).await?;
            }
        }
        if !inits.is_empty() {
            self.status(|pod| Self::set_condition(pod, "Initialized", true, None, None));
        }

        for container in &containers {
            self.start_container(container, false).await?;
        }
        self.wait(self.sim.config.timings.readiness).await?;
        self.update_readiness().await;
        Ok(())
    }

    /// Recomputes container readiness and the pod's Ready conditions and phase.
    /// Whether the pod's status says container `name` is ready.
    fn was_ready(&self, name: &str) -> bool {
        self.pod().is_some_and(|pod| {
            pod["status"]["containerStatuses"]
                .as_array()
                .and_then(|s| s.iter().find(|c| c["name"] == name))
                .is_some_and(|c| c["ready"] == true)
        })
    }

    async fn update_readiness(&mut self) {
        let containers = self.containers(false);
        let mut ready_names = HashSet::new();
        for c in &containers {
            let name = c["name"].as_str().unwrap_or_default().to_owned();
            if !self.running.contains_key(&name) {
                self.probe_failures.remove(&name);
                continue;
            }
            if self.probe(c).await {
                self.probe_failures.remove(&name);
                ready_names.insert(name);
                continue;
            }
            let threshold = c["readinessProbe"]["failureThreshold"]
                .as_u64()
                .unwrap_or(3)
                .max(1);
            let failures = self.probe_failures.entry(name.clone()).or_default();
            *failures += 1;
            if u64::from(*failures) < threshold && self.was_ready(&name) {
                ready_names.insert(name);
            }
        }
        let all = !containers.is_empty() && ready_names.len() == containers.len();
        let unready: Vec<String> = containers
            .iter()
            .filter_map(|c| c["name"].as_str())
            .filter(|n| !ready_names.contains(*n))
            .map(str::to_owned)
            .collect();
        let mut ready_list: Vec<String> = ready_names.iter().cloned().collect();
        ready_list.sort();
        if let Some((revision, ready, was_all)) = &self.readiness_written
            && (ready, *was_all) == (&ready_list, all)
            && self.stored_revision() == Some(*revision)
        {
            return;
        }
        let message = format!("containers with unready status: [{}]", unready.join(" "));
        let written = self.status(|pod| {
            for c in &containers {
                let name = c["name"].as_str().unwrap_or_default();
                let ready = ready_names.contains(name);
                Self::container_status(pod, false, name, |s| s["ready"] = json!(ready));
            }
            let any_running = pod["status"]["containerStatuses"]
                .as_array()
                .is_some_and(|s| s.iter().any(|c| c["state"]["running"].is_object()));
            if any_running {
                pod["status"]["phase"] = json!("Running");
            }
            if all {
                Self::set_condition(pod, "ContainersReady", true, None, None);
                Self::set_condition(pod, "Ready", true, None, None);
            } else {
                Self::set_condition(
                    pod,
                    "ContainersReady",
                    false,
                    Some("ContainersNotReady"),
                    Some(&message),
                );
                Self::set_condition(
                    pod,
                    "Ready",
                    false,
                    Some("ContainersNotReady"),
                    Some(&message),
                );
            }
        });
        self.readiness_written = written.map(|revision| (revision, ready_list, all));
    }

    /// Running: restarts exited containers with backoff, re-probes readiness, until deletion.
    async fn supervise(&mut self) {
        let mut attempts: HashMap<String, u32> = HashMap::new();
        // Readiness probes run every `periodSeconds` (10 by default), as a real kubelet's do;
        // containers without a probe change readiness only when they start or exit.
        let period = self
            .containers(false)
            .iter()
            .map(|c| &c["readinessProbe"])
            .filter(|p| p.is_object())
            .map(|p| Duration::from_secs(p["periodSeconds"].as_u64().unwrap_or(10).max(1)))
            .min()
            .unwrap_or(Duration::from_secs(10));
        let mut probe_tick = tokio::time::interval(period.max(self.sim.config.timings.readiness));
        // A change made while the pod was starting (its waits saw the update) is acted on now.
        if self.restart_changed().await.is_err() || self.start_ephemeral().await.is_err() {
            return;
        }
        self.report_resources();
        loop {
            if self.deleting() {
                return;
            }
            let exited = tokio::select! {
                changed = self.updates.changed() => {
                    if changed.is_err()
                        || self.restart_changed().await.is_err()
                        || self.start_ephemeral().await.is_err()
                    {
                        return;
                    }
                    self.report_resources();
                    None
                }
                exit = self.exit_rx.recv() => exit,
                _ = probe_tick.tick() => { self.update_readiness().await; None }
            };
            let Some((name, code)) = exited else { continue };
            if self.ephemeral.contains(&name) {
                self.running.remove(&name);
                let terminated = self.exited(&name, code);
                self.status(|pod| {
                    Self::ephemeral_status(pod, &name, |s| {
                        s["state"] = json!({"terminated": terminated});
                    });
                });
                continue;
            }
            if self.replaced.remove(&name) {
                // The old container of one restarted for a new definition.
                continue;
            }
            self.running.remove(&name);
            let terminated = self.exited(&name, code);
            let policy = self.restart_policy();
            let restart = policy == "Always" || (policy == "OnFailure" && code != 0);
            self.status(|pod| {
                Self::container_status(pod, false, &name, |s| {
                    s["lastState"] = json!({"terminated": terminated});
                    s["state"] = json!({"terminated": terminated});
                    s["ready"] = json!(false);
                    s["started"] = json!(false);
                });
            });
            self.update_readiness().await;
            if !restart {
                if self.running.is_empty() {
                    let phase = if code == 0 { "Succeeded" } else { "Failed" };
                    self.status(|pod| pod["status"]["phase"] = json!(phase));
                }
                continue;
            }
            let attempt = attempts.entry(name.clone()).or_default();
            let delay = self.sim.config.timings.crash_backoff.after(*attempt);
            *attempt += 1;
            let path = field_path(&name, false);
            self.event(
                Some(&path),
                "Warning",
                "BackOff",
                &format!(
                    "Back-off restarting failed container {name} in pod {}_{}({})",
                    self.name, self.namespace, self.uid
                ),
            );
            let waiting = self.back_off_message(&name, delay);
            self.status(|pod| {
                Self::container_status(pod, false, &name, |s| {
                    s["state"] =
                        json!({"waiting": {"reason": "CrashLoopBackOff", "message": waiting}});
                    s["restartCount"] = json!(s["restartCount"].as_i64().unwrap_or(0) + 1);
                });
            });
            if self.wait(delay).await.is_err() {
                return;
            }
            let container = self
                .containers(false)
                .into_iter()
                .find(|c| c["name"] == name.as_str())
                .unwrap_or_default();
            if self.start_container(&container, false).await.is_err() {
                return;
            }
            self.update_readiness().await;
        }
    }

    /// A container the runtime started: kept for exec and attach, `Started`, its status
    /// running, its exit reported to the worker.
    fn started(
        &mut self,
        name: &str,
        path: &str,
        context: ContainerContext,
        running: RunningContainer,
        list: Statuses,
    ) {
        self.sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((self.uid.clone(), name.to_owned()), context);
        self.event(
            Some(path),
            "Normal",
            "Started",
            &format!("Started container {name}"),
        );
        let started_at = now_rfc3339();
        let id = container_id();
        let spec = self
            .containers(list == Statuses::Init)
            .into_iter()
            .find(|c| c["name"] == name);
        let resources = spec.as_ref().map(running_resources).unwrap_or_default();
        // A container started now runs the image its spec names now.
        let image = spec.map(|c| c["image"].clone()).unwrap_or(Value::Null);
        let running_now = |s: &mut Value| {
            if list != Statuses::Ephemeral && !image.is_null() {
                s["image"] = image.clone();
            }
            s["state"] = json!({"running": {"startedAt": started_at}});
            if list != Statuses::Ephemeral {
                s["started"] = json!(true);
            }
            s["containerID"] = json!(id);
            s["imageID"] = json!(format!(
                "{}@sha256:{}",
                s["image"].as_str().unwrap_or_default(),
                "0".repeat(64)
            ));
        };
        // A pod is Running from the update that says its first container runs, as the
        // kubelet computes the phase from the statuses it writes.
        self.status(|pod| match list {
            Statuses::Ephemeral => Self::ephemeral_status(pod, name, running_now),
            Statuses::Init => Self::container_status(pod, true, name, running_now),
            Statuses::Containers => {
                Self::container_status(pod, false, name, running_now);
                Self::container_status(pod, false, name, |s| set_resources(s, &resources));
                pod["status"]["phase"] = json!("Running");
            }
        });

        let RunningContainer { exited, stop } = running;
        let exits = self.exit_tx.clone();
        let reported = name.to_owned();
        tokio::spawn(async move {
            let code = exited.await.unwrap_or(137);
            let _ = exits.send((reported, code));
        });
        self.running.insert(name.to_owned(), stop);
    }

    /// The resources each container runs with, in its status (`resources`,
    /// `allocatedResources`): a resize (`pods/resize`) is applied in place at once, as a
    /// process's limits need no restart.
    fn report_resources(&self) {
        let Some(pod) = self.pod() else { return };
        let wanted: Vec<(String, Value)> = self
            .containers(false)
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default().to_owned(),
                    running_resources(c),
                )
            })
            .collect();
        let statuses = pod["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let stale = wanted.iter().any(|(name, resources)| {
            statuses
                .iter()
                .find(|s| s["name"] == name.as_str())
                .is_some_and(|s| &s["resources"] != resources)
        });
        if stale {
            self.status(|pod| {
                for (name, resources) in &wanted {
                    Self::container_status(pod, false, name, |s| set_resources(s, resources));
                }
            });
        }
    }

    /// Sets one ephemeral container's status entry.
    fn ephemeral_status(pod: &mut Value, name: &str, update: impl Fn(&mut Value)) {
        let mut statuses = pod["status"]["ephemeralContainerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let image = pod["spec"]["ephemeralContainers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .map(|c| c["image"].clone())
            .unwrap_or(Value::Null);
        let index = match statuses.iter().position(|s| s["name"] == name) {
            Some(i) => i,
            None => {
                statuses.push(json!({"name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}));
                statuses.len() - 1
            }
        };
        update(&mut statuses[index]);
        pod["status"]["ephemeralContainerStatuses"] = json!(statuses);
    }

    /// Starts the ephemeral containers `kubectl debug` added to the pod's spec (through
    /// `pods/ephemeralcontainers`), once each, as the kubelet does: pulled, created and started
    /// beside the pod's containers, with the pod's volumes it mounts and its environment.
    async fn start_ephemeral(&mut self) -> Result<(), Interrupt> {
        let Some(pod) = self.pod() else {
            return Ok(());
        };
        let added: Vec<Value> = pod["spec"]["ephemeralContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| {
                !self
                    .ephemeral
                    .contains(c["name"].as_str().unwrap_or_default())
            })
            .collect();
        for container in added {
            let name = container["name"].as_str().unwrap_or_default().to_owned();
            self.ephemeral.insert(name.clone());
            let path = format!("spec.ephemeralContainers{{{name}}}");
            let image = container["image"].as_str().unwrap_or_default().to_owned();
            self.status(|pod| Self::ephemeral_status(pod, &name, |_| {}));
            self.event(
                Some(&path),
                "Normal",
                "Pulled",
                &format!("Container image \"{image}\" already present on machine"),
            );
            self.wait(self.sim.config.timings.container_start).await?;
            self.event(
                Some(&path),
                "Normal",
                "Created",
                &format!("Created container: {name}"),
            );
            let context = self.context(&container, false);
            let kept = context.clone();
            match self.sim.config.runtime.start(context).await {
                Ok(running) => self.started(&name, &path, kept, running, Statuses::Ephemeral),
                Err(error) => {
                    self.event(
                        Some(&path),
                        "Warning",
                        "Failed",
                        &format!("Error: failed to create containerd task: {error}"),
                    );
                    self.status(|pod| {
                        Self::ephemeral_status(pod, &name, |s| {
                            s["state"] = json!({"waiting": {"reason": "RunContainerError", "message": error}})
                        })
                    });
                }
            }
        }
        Ok(())
    }

    /// A running container whose image changed in the pod's spec is killed and started again
    /// with the new image, as a real kubelet does: `Killing` ("definition changed"), then pull,
    /// create and start, with `restartCount` one higher.
    async fn restart_changed(&mut self) -> Result<(), Interrupt> {
        let Some(pod) = self.pod() else {
            return Ok(());
        };
        let statuses = pod["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for container in self.containers(false) {
            let name = container["name"].as_str().unwrap_or_default().to_owned();
            let wanted = container["image"].as_str().unwrap_or_default();
            let running_image = statuses
                .iter()
                .find(|s| s["name"] == name.as_str())
                .and_then(|s| s["image"].as_str());
            if running_image.is_none_or(|image| image == wanted)
                || !self.running.contains_key(&name)
            {
                continue;
            }
            let path = field_path(&name, false);
            self.event(
                Some(&path),
                "Normal",
                "Killing",
                &format!("Container {name} definition changed, will be restarted"),
            );
            if let Some(stop) = self.running.remove(&name) {
                self.replaced.insert(name.clone());
                let _ = stop.send(self.spec_grace());
            }
            let finished = now_rfc3339();
            let image = wanted.to_owned();
            self.status(|pod| {
                Self::container_status(pod, false, &name, |s| {
                    s["lastState"] = json!({"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": finished}});
                    s["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
                    s["ready"] = json!(false);
                    s["started"] = json!(false);
                    s["image"] = json!(image);
                    s["restartCount"] = json!(s["restartCount"].as_i64().unwrap_or(0) + 1);
                });
            });
            self.update_readiness().await;
            self.start_container(&container, false).await?;
            self.update_readiness().await;
        }
        Ok(())
    }

    /// Graceful termination: `Killing`, stop the containers, then finish the deletion.
    async fn terminate(&mut self) {
        let Some(pod) = self.pod() else { return };
        if pod["metadata"]["uid"] != self.uid.as_str() {
            return;
        }
        while !self.reachable() {
            // A kubelet that cannot reach the API server finishes nothing.
            if self.updates.changed().await.is_err() {
                return;
            }
        }
        let grace = pod["metadata"]["deletionGracePeriodSeconds"]
            .as_u64()
            .map(Duration::from_secs)
            .unwrap_or_default()
            .min(self.sim.config.max_pod_grace);
        let stopping: Vec<(String, tokio::sync::oneshot::Sender<Duration>)> =
            self.running.drain().collect();
        let mut stopped: HashSet<String> = stopping.iter().map(|(n, _)| n.clone()).collect();
        for (name, stop) in stopping {
            if self
                .sim
                .store
                .get("/pods", &self.namespace, &self.name)
                .is_some()
            {
                self.sim.record(
                    &pod,
                    Some(&field_path(&name, false)),
                    "Normal",
                    "Killing",
                    &format!("Stopping container {name}"),
                    source(&self.node),
                );
            }
            let _ = stop.send(grace);
        }
        // The pod is gone only once its containers are: the runtime kills what outlives its
        // grace period.
        let exits = async {
            while !stopped.is_empty() {
                match self.exit_rx.recv().await {
                    Some((name, _)) => stopped.remove(&name),
                    None => break,
                };
            }
        };
        let _ = tokio::join!(
            tokio::time::timeout(grace + Duration::from_secs(2), exits),
            tokio::time::sleep(self.sim.config.timings.stop.min(grace)),
        );
        self.sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(uid, _), _| *uid != self.uid);
        self.sim.config.runtime.forget_pod(&self.uid);
        self.sim
            .finish_pod_termination(&self.namespace, &self.name, &self.uid);
        for logs in [&self.sim.logs, &self.sim.previous_logs] {
            logs.lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(uid, _), _| *uid != self.uid);
        }
    }

    /// A container has exited: it can no longer be entered, and its terminated state says
    /// its termination message, or with `FallbackToLogsOnError` and a failure, the end of
    /// its log (80 lines, 2 KiB at most), as the kubelet reads them.
    fn exited(&self, name: &str, code: i32) -> Value {
        let key = (self.uid.clone(), name.to_owned());
        let context = self
            .sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        let reason = context
            .as_ref()
            .and_then(|c| self.sim.config.runtime.exit_reason(c))
            .unwrap_or_else(|| if code == 0 { "Completed" } else { "Error" }.to_owned());
        let mut terminated =
            json!({"exitCode": code, "reason": reason, "finishedAt": now_rfc3339()});
        if let Some(message) = context.and_then(|c| self.termination_message(&c, code)) {
            terminated["message"] = json!(message);
        }
        terminated
    }

    fn termination_message(&self, context: &ContainerContext, code: i32) -> Option<String> {
        let written = self
            .sim
            .config
            .runtime
            .termination_message(context)
            .unwrap_or_default();
        if !written.is_empty() {
            return Some(String::from_utf8_lossy(&written).into_owned());
        }
        let fallback = context.container["terminationMessagePolicy"] == "FallbackToLogsOnError";
        if !fallback || code == 0 {
            return None;
        }
        let (log, _) = context.log.read();
        let end = &log[log.len().saturating_sub(2048)..];
        let text = String::from_utf8_lossy(end);
        let lines: Vec<&str> = text.lines().collect();
        let kept = lines[lines.len().saturating_sub(80)..].join("\n");
        (!kept.is_empty()).then_some(kept)
    }

    /// Why a container waits to be restarted, in the kubelet's words.
    fn back_off_message(&self, name: &str, delay: Duration) -> String {
        format!(
            "back-off {} restarting failed container={name} pod={}_{}({})",
            crate::table::human_duration(delay.as_secs() as i64),
            self.name,
            self.namespace,
            self.uid
        )
    }

    /// The pod's own grace period (`terminationGracePeriodSeconds`), capped as deletions are.
    fn spec_grace(&self) -> Duration {
        self.pod()
            .and_then(|p| p["spec"]["terminationGracePeriodSeconds"].as_u64())
            .map(Duration::from_secs)
            .unwrap_or(Duration::from_secs(30))
            .min(self.sim.config.max_pod_grace)
    }
}

/// Runs every node's kubelet: one worker per pod bound to a node.
pub async fn run(sim: Arc<Sim>) {
    let images = Arc::new(ImageCache::default());
    let mut workers: HashMap<String, watch::Sender<Option<Arc<Value>>>> = HashMap::new();
    // A follower: a lagging receiver would have to hand every pod to its worker again.
    let mut changes = sim.store.follow();
    let (pods, _) = sim.store.list("/pods", None);
    let dispatch =
        |sim: &Arc<Sim>,
         pod: &Arc<Value>,
         gone: bool,
         workers: &mut HashMap<String, watch::Sender<Option<Arc<Value>>>>| {
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if gone {
                if let Some(tx) = workers.remove(&uid) {
                    let _ = tx.send(None);
                }
                return;
            }
            if let Some(tx) = workers.get(&uid) {
                let _ = tx.send(Some(pod.clone()));
                return;
            }
            let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
                return;
            };
            if sim.store.get("/nodes", "", node).is_none() {
                // Pod GC: a pod bound to a node that does not exist cannot be stopped by anyone.
                if pod["metadata"]["deletionTimestamp"].is_string() {
                    let (ns, name) = (
                        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                        pod["metadata"]["name"].as_str().unwrap_or_default(),
                    );
                    sim.finish_pod_termination(ns, name, &uid);
                }
                return;
            }
            let (tx, rx) = watch::channel(Some(pod.clone()));
            workers.insert(uid.clone(), tx);
            let (exit_tx, exit_rx) = tokio::sync::mpsc::unbounded_channel();
            let worker = Worker {
                sim: sim.clone(),
                node: node.to_owned(),
                namespace: pod["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                uid,
                updates: rx,
                images: images.clone(),
                pod_ip: None,
                running: HashMap::new(),
                exit_tx,
                exit_rx,
                replaced: Default::default(),
                ephemeral: Default::default(),
                probe_failures: Default::default(),
                readiness_written: None,
            };
            tokio::spawn(worker.run());
        };
    for pod in pods {
        dispatch(&sim, &pod, false, &mut workers);
    }
    while let Some(change) = changes.recv().await {
        if &*change.storage == "/pods" {
            dispatch(
                &sim,
                &change.object,
                change.kind == ChangeKind::Deleted,
                &mut workers,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_references_expand_as_the_kubelet_expands_them() {
        let env = vec![("POD_IP".to_owned(), "10.0.0.7".to_owned())];
        assert_eq!(expand("$(POD_IP):8081", &env), "10.0.0.7:8081");
        assert_eq!(expand("$$(POD_IP)", &env), "$(POD_IP)");
        assert_eq!(expand("$(MISSING)-x", &env), "$(MISSING)-x");
        assert_eq!(expand("cost $5", &env), "cost $5");
    }
}
