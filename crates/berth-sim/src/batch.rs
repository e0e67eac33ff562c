//! batch/v1 at the API and in the controller manager: Jobs and CronJobs defaulted and
//! validated as the real server does, the Job controller (pods up to `parallelism` until
//! `completions` succeed, or `backoffLimit` failures fail the Job) and the CronJob controller
//! (a Job per scheduled time, named after it, its history pruned).

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{
    error::Cause,
    meta::now_rfc3339,
    recorder::Source,
    resources::ResourceType,
    sim::{DeleteOptions, Sim, WriteContext},
    store::{Change, ChangeKind},
};

pub const JOBS: &str = "batch/jobs";
pub const CRON_JOBS: &str = "batch/cronjobs";
/// The labels the server puts on a Job's pod template and selector.
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
/// What the CronJob controller writes on a Job: the time it was scheduled for.
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// How often every Job and CronJob is looked at again (a schedule comes due, a refused pod).
const RESYNC: Duration = Duration::from_secs(1);

fn set_default(object: &mut Value, key: &str, value: Value) {
    if object[key].is_null() {
        object[key] = value;
    }
}

/// Fills in what the real server defaults in a Job's spec (its pod template's spec is
/// defaulted by the caller), and, on create, the selector and labels that tie its pods to it.
pub fn default_job(job: &mut Value, create: bool) {
    let uid = job["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let name = job["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let spec = &mut job["spec"];
    match (spec["completions"].is_null(), spec["parallelism"].is_null()) {
        (true, true) => {
            spec["completions"] = json!(1);
            spec["parallelism"] = json!(1);
        }
        (_, true) => spec["parallelism"] = json!(1),
        _ => {}
    }
    set_default(spec, "backoffLimit", json!(6));
    set_default(spec, "manualSelector", json!(false));
    set_default(spec, "completionMode", json!("NonIndexed"));
    set_default(spec, "suspend", json!(false));
    set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    if create && spec["manualSelector"] != json!(true) && !uid.is_empty() {
        let labels = &mut spec["template"]["metadata"]["labels"];
        for (key, value) in [
            (CONTROLLER_UID, &uid),
            (JOB_NAME, &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            labels[key] = json!(value);
        }
        spec["selector"] = json!({"matchLabels": {CONTROLLER_UID: uid}});
    }
    if job["metadata"]["labels"].is_null()
        && let Some(labels) = job["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .filter(|l| !l.is_empty())
    {
        job["metadata"]["labels"] = Value::Object(labels.clone());
    }
}

/// Fills in what the real server defaults in a CronJob's spec.
pub fn default_cron_job(cron_job: &mut Value) {
    let spec = &mut cron_job["spec"];
    set_default(spec, "concurrencyPolicy", json!("Allow"));
    set_default(spec, "suspend", json!(false));
    set_default(spec, "successfulJobsHistoryLimit", json!(3));
    set_default(spec, "failedJobsHistoryLimit", json!(1));
    // The Job template's own fields are defaulted when its Job is created, not here (the
    // real `SetObjectDefaults_CronJob` defaults only the pod template).
}

/// The pod template of a Job or a CronJob, whose spec the caller defaults as a pod's.
pub fn template_spec<'a>(resource: &str, object: &'a mut Value) -> &'a mut Value {
    match resource {
        "cronjobs" => &mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &mut object["spec"]["template"]["spec"],
    }
}

/// What the real server refuses in a Job or a CronJob, in its words.
pub fn validate(resource: &str, object: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let (template, prefix) = match resource {
        "cronjobs" => (
            &object["spec"]["jobTemplate"]["spec"]["template"],
            "spec.jobTemplate.spec.template",
        ),
        _ => (&object["spec"]["template"], "spec.template"),
    };
    match template["spec"]["restartPolicy"].as_str() {
        Some("OnFailure" | "Never") => {}
        // `Always` (a pod's default) is "required" to be another, as the real check words it.
        None | Some("Always") => causes.push(Cause {
            reason: "FieldValueRequired".to_owned(),
            message: "Required value: valid values: \"OnFailure\", \"Never\"".to_owned(),
            field: format!("{prefix}.spec.restartPolicy"),
        }),
        Some(other) => causes.push(Cause {
            reason: "FieldValueNotSupported".to_owned(),
            message: format!(
                "Unsupported value: \"{other}\": supported values: \"OnFailure\", \"Never\""
            ),
            field: format!("{prefix}.spec.restartPolicy"),
        }),
    }
    if template["spec"]["containers"]
        .as_array()
        .is_none_or(|c| c.is_empty())
    {
        causes.push(Cause {
            reason: "FieldValueRequired".to_owned(),
            message: "Required value".to_owned(),
            field: format!("{prefix}.spec.containers"),
        });
    }
    if resource == "cronjobs" {
        let schedule = object["spec"]["schedule"].as_str().unwrap_or_default();
        if schedule.is_empty() {
            causes.push(Cause {
                reason: "FieldValueRequired".to_owned(),
                message: "Required value".to_owned(),
                field: "spec.schedule".to_owned(),
            });
        } else if let Err(e) = parse_schedule(schedule) {
            causes.push(Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: format!("Invalid value: \"{schedule}\": {e}"),
                field: "spec.schedule".to_owned(),
            });
        }
    }
    causes
}

/// A standard five-field schedule (or `@hourly` and its kin).
fn parse_schedule(text: &str) -> Result<croner::Cron, String> {
    text.parse::<croner::Cron>().map_err(|e| e.to_string())
}

/// A Job's state for `kubectl get jobs`' STATUS column.
pub fn job_status(job: &Value) -> &'static str {
    let has = |type_: &str| {
        job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == type_ && c["status"] == "True")
    };
    // In the order of 1.33's printer.
    if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if job["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else if has("Suspended") {
        "Suspended"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else {
        "Running"
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

fn count(object: &Value, field: &str) -> i64 {
    object["spec"][field].as_i64().unwrap_or(0)
}

fn controller_uid(object: &Value) -> Option<&str> {
    object["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
        .and_then(|r| r["uid"].as_str())
}

fn owner_reference(kind: &str, owner: &Value) -> Value {
    json!([{
        "apiVersion": "batch/v1", "kind": kind, "name": name(owner), "uid": uid(owner),
        "controller": true, "blockOwnerDeletion": true
    }])
}

fn finished(job: &Value) -> bool {
    matches!(job_status(job), "Complete" | "Failed")
}

type Key = (&'static str, String, String);

struct Controllers {
    sim: Arc<Sim>,
    jobs: Arc<ResourceType>,
    cron_jobs: Arc<ResourceType>,
    pods: Arc<ResourceType>,
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
        let owner = |o: &Value, storage: &'static str| -> Option<Key> {
            let owner_uid = controller_uid(o)?;
            let (candidates, _) = self.sim.store.list(storage, Some(namespace(o)));
            candidates
                .iter()
                .find(|c| uid(c) == owner_uid)
                .map(|c| key(storage, c))
        };
        match &*change.storage {
            CRON_JOBS if change.kind != ChangeKind::Deleted => vec![key(CRON_JOBS, object)],
            JOBS => {
                let mut keys: Vec<Key> = owner(object, CRON_JOBS).into_iter().collect();
                if change.kind != ChangeKind::Deleted {
                    keys.push(key(JOBS, object));
                }
                keys
            }
            "/pods" => owner(object, JOBS).into_iter().collect(),
            _ => vec![],
        }
    }

    fn all(&self) -> BTreeSet<Key> {
        let mut keys = BTreeSet::new();
        for storage in [CRON_JOBS, JOBS] {
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
        if *storage == JOBS {
            self.sync_job(&object);
        } else {
            self.sync_cron_job(&object);
        }
    }

    /// The Job controller: pods up to `parallelism` while fewer than `completions` succeeded;
    /// Complete once they have, Failed once more than `backoffLimit` failed.
    fn sync_job(&self, job: &Value) {
        if finished(job) {
            return;
        }
        let ctx = WriteContext::system("job-controller");
        let (pods, _) = self.sim.store.list("/pods", Some(namespace(job)));
        let owned: Vec<&Arc<Value>> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid(job)))
            .collect();
        let phase = |p: &Value| p["status"]["phase"].as_str().unwrap_or_default().to_owned();
        let deleting = |p: &Value| !p["metadata"]["deletionTimestamp"].is_null();
        let succeeded = owned.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
        let failed = owned.iter().filter(|p| phase(p) == "Failed").count() as i64;
        let active: Vec<&&Arc<Value>> = owned
            .iter()
            .filter(|p| !deleting(p) && !matches!(phase(p).as_str(), "Succeeded" | "Failed"))
            .collect();
        let ready = active
            .iter()
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count() as i64;
        let completions = job["spec"]["completions"].as_i64();
        let parallelism = count(job, "parallelism");
        let backoff_limit = job["spec"]["backoffLimit"].as_i64().unwrap_or(6);
        let now = now_rfc3339();
        let start_time = job["status"]["startTime"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| now.clone());
        let condition = |type_: &str, reason: &str, message: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": message,
                   "lastProbeTime": now, "lastTransitionTime": now})
        };
        let mut status =
            json!({"startTime": start_time, "uncountedTerminatedPods": {}, "terminating": 0});
        let mut conditions: Vec<Value> = job["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut active_count = active.len() as i64;
        let suspended = job["spec"]["suspend"] == json!(true);
        let was_suspended = conditions
            .iter()
            .any(|c| c["type"] == "Suspended" && c["status"] == "True");
        // The Job controller's own pod deletions, each said by an event.
        let delete_active = |active: &[&&Arc<Value>]| {
            for pod in active {
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
                        job,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted pod: {}", name(pod)),
                        "job-controller",
                    );
                }
            }
        };
        if suspended != was_suspended {
            let (state, reason, message, event) = if suspended {
                ("True", "JobSuspended", "Job suspended", "Suspended")
            } else {
                ("False", "JobResumed", "Job resumed", "Resumed")
            };
            conditions.retain(|c| c["type"] != "Suspended");
            let mut changed = condition("Suspended", reason, message);
            changed["status"] = json!(state);
            conditions.push(changed);
            self.event(job, "Normal", event, message, "job-controller");
            if !suspended {
                // A resumed Job's time counts from its resumption.
                status["startTime"] = json!(now);
            }
        }
        if suspended {
            // A suspended Job runs nothing, and its time does not run.
            delete_active(&active);
            active_count = 0;
            if let Some(map) = status.as_object_mut() {
                map.remove("startTime");
            }
        } else if failed > backoff_limit {
            delete_active(&active);
            active_count = 0;
            let message = "Job has reached the specified backoff limit";
            conditions.push(condition("FailureTarget", "BackoffLimitExceeded", message));
            conditions.push(condition("Failed", "BackoffLimitExceeded", message));
            self.event(
                job,
                "Warning",
                "BackoffLimitExceeded",
                message,
                "job-controller",
            );
        } else if (completions.is_some_and(|c| succeeded >= c) && active.is_empty())
            || (completions.is_none() && succeeded > 0 && active.is_empty())
        {
            conditions.push(condition(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            conditions.push(condition(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            status["completionTime"] = json!(now);
            self.event(
                job,
                "Normal",
                "Completed",
                "Job completed",
                "job-controller",
            );
        } else {
            let remaining = completions.map_or(parallelism, |c| (c - succeeded).min(parallelism));
            let template = &job["spec"]["template"];
            while active_count < remaining {
                let mut metadata = template["metadata"].clone();
                if !metadata.is_object() {
                    metadata = json!({});
                }
                metadata["generateName"] = json!(format!("{}-", name(job)));
                metadata["ownerReferences"] = owner_reference("Job", job);
                let pod = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": metadata, "spec": template["spec"].clone()
                });
                match self.sim.create(&self.pods, namespace(job), pod, &ctx) {
                    Ok(written) => {
                        active_count += 1;
                        self.event(
                            job,
                            "Normal",
                            "SuccessfulCreate",
                            &format!("Created pod: {}", name(&written.object)),
                            "job-controller",
                        );
                    }
                    Err(error) => {
                        self.event(
                            job,
                            "Warning",
                            "FailedCreate",
                            &format!("Error creating: {error}"),
                            "job-controller",
                        );
                        break;
                    }
                }
            }
        }
        for (field, value) in [
            ("active", active_count),
            ("ready", ready),
            ("succeeded", succeeded),
            ("failed", failed),
        ] {
            if value > 0 || field == "ready" {
                status[field] = json!(value);
            }
        }
        if !conditions.is_empty() {
            status["conditions"] = Value::Array(conditions);
        }
        self.write_status(&self.jobs, job, status, "job-controller");
    }

    /// Writes `status` unless it equals the stored one but for its condition times.
    fn write_status(&self, rt: &ResourceType, object: &Value, status: Value, manager: &str) {
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
            &WriteContext::system(manager),
        );
    }

    /// The CronJob controller: the Job of the latest scheduled time that came due and has none
    /// (as `concurrencyPolicy` allows), the status, and the history kept to its limits.
    fn sync_cron_job(&self, cron_job: &Value) {
        let ctx = WriteContext::system("cronjob-controller");
        let (jobs, _) = self.sim.store.list(JOBS, Some(namespace(cron_job)));
        let mut owned: Vec<Arc<Value>> = jobs
            .into_iter()
            .filter(|j| controller_uid(j) == Some(uid(cron_job)))
            .collect();
        owned.sort_by_key(|j| {
            j["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        });
        let mut status = cron_job["status"].clone();
        if !status.is_object() {
            status = json!({});
        }
        // Each Job that finished since it was listed active is seen, whatever its end; the
        // last success is the latest completion of any.
        let was_active: Vec<String> = status["active"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["uid"].as_str().map(str::to_owned))
            .collect();
        for job in owned
            .iter()
            .filter(|j| finished(j) && was_active.iter().any(|u| u == uid(j)))
        {
            self.event(
                cron_job,
                "Normal",
                "SawCompletedJob",
                &format!(
                    "Saw completed job: {}, condition: {}",
                    name(job),
                    job_status(job)
                ),
                "cronjob-controller",
            );
        }
        if let Some(latest) = owned
            .iter()
            .filter(|j| job_status(j) == "Complete")
            .filter_map(|j| j["status"]["completionTime"].as_str())
            .max()
            && status["lastSuccessfulTime"]
                .as_str()
                .is_none_or(|known| known < latest)
        {
            status["lastSuccessfulTime"] = json!(latest);
        }
        // The history pruned to its limits, oldest start first.
        owned.sort_by_key(|j| {
            (
                j["status"]["startTime"].is_null(),
                j["status"]["startTime"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name(j).to_owned(),
            )
        });
        for (state, limit) in [
            ("Complete", count(cron_job, "successfulJobsHistoryLimit")),
            ("Failed", count(cron_job, "failedJobsHistoryLimit")),
        ] {
            let done: Vec<&Arc<Value>> = owned.iter().filter(|j| job_status(j) == state).collect();
            let extra = done.len().saturating_sub(limit.max(0) as usize);
            for old in done.iter().take(extra) {
                let options = DeleteOptions {
                    propagation: Some("Background".to_owned()),
                    ..DeleteOptions::default()
                };
                if self
                    .sim
                    .delete(&self.jobs, namespace(old), name(old), &options, &ctx)
                    .is_ok()
                {
                    self.event(
                        cron_job,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted job {}", name(old)),
                        "cronjob-controller",
                    );
                }
            }
        }
        let running: Vec<&Arc<Value>> = owned.iter().filter(|j| !finished(j)).collect();
        if cron_job["spec"]["suspend"] != json!(true)
            && let Ok(schedule) =
                parse_schedule(cron_job["spec"]["schedule"].as_str().unwrap_or_default())
            && let Some(due) = self.due(cron_job, &schedule)
            && !owned.iter().any(|j| {
                j["metadata"]["annotations"][SCHEDULED_TIMESTAMP].as_str()
                    == Some(
                        due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                            .as_str(),
                    )
            })
        {
            let policy = cron_job["spec"]["concurrencyPolicy"]
                .as_str()
                .unwrap_or("Allow");
            let go = match policy {
                "Forbid" if !running.is_empty() => {
                    self.event(
                        cron_job,
                        "Normal",
                        "JobAlreadyActive",
                        "Not starting job because prior execution is running and concurrency policy is Forbid",
                        "cronjob-controller",
                    );
                    false
                }
                "Replace" => {
                    for old in &running {
                        let deleted = self.sim.delete(
                            &self.jobs,
                            namespace(old),
                            name(old),
                            &DeleteOptions {
                                propagation: Some("Background".to_owned()),
                                ..DeleteOptions::default()
                            },
                            &ctx,
                        );
                        match deleted {
                            Ok(_) => self.event(
                                cron_job,
                                "Normal",
                                "SuccessfulDelete",
                                &format!("Deleted job {}", name(old)),
                                "cronjob-controller",
                            ),
                            Err(error) => self.event(
                                cron_job,
                                "Warning",
                                "FailedDelete",
                                &format!("Deleted job: {error}"),
                                "cronjob-controller",
                            ),
                        }
                    }
                    true
                }
                _ => true,
            };
            if go {
                let minutes = due.timestamp() / 60;
                let template = &cron_job["spec"]["jobTemplate"];
                let mut metadata = template["metadata"].clone();
                if !metadata.is_object() {
                    metadata = json!({});
                }
                metadata["name"] = json!(format!("{}-{minutes}", name(cron_job)));
                metadata["ownerReferences"] = owner_reference("CronJob", cron_job);
                metadata["annotations"][SCHEDULED_TIMESTAMP] =
                    json!(due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                let job = json!({
                    "apiVersion": "batch/v1", "kind": "Job",
                    "metadata": metadata, "spec": template["spec"].clone()
                });
                match self.sim.create(&self.jobs, namespace(cron_job), job, &ctx) {
                    Ok(written) => {
                        self.event(
                            cron_job,
                            "Normal",
                            "SuccessfulCreate",
                            &format!("Created job {}", name(&written.object)),
                            "cronjob-controller",
                        );
                        status["lastScheduleTime"] =
                            json!(due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
                    }
                    Err(error) => self.event(
                        cron_job,
                        "Warning",
                        "FailedCreate",
                        &format!("Error creating job: {error}"),
                        "cronjob-controller",
                    ),
                }
            }
        }
        let (jobs, _) = self.sim.store.list(JOBS, Some(namespace(cron_job)));
        let active: Vec<Value> = jobs
            .iter()
            .filter(|j| controller_uid(j) == Some(uid(cron_job)) && !finished(j))
            .map(|j| {
                json!({"kind": "Job", "namespace": namespace(j), "name": name(j), "uid": uid(j),
                       "apiVersion": "batch/v1", "resourceVersion": j["metadata"]["resourceVersion"]})
            })
            .collect();
        match active.is_empty() {
            true => status.as_object_mut().map(|s| s.remove("active")),
            false => {
                status["active"] = Value::Array(active);
                None
            }
        };
        self.write_status(&self.cron_jobs, cron_job, status, "cronjob-controller");
    }

    /// The latest time `schedule` names that is due now and after the CronJob last ran (or
    /// was created).
    fn due(
        &self,
        cron_job: &Value,
        schedule: &croner::Cron,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let since = cron_job["status"]["lastScheduleTime"]
            .as_str()
            .or(cron_job["metadata"]["creationTimestamp"].as_str())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())?
            .with_timezone(&chrono::Utc);
        let now = chrono::Utc::now();
        let mut due = None;
        let mut at = since;
        // At most a day of missed times is looked through, as a real controller gives up on
        // more than 100 missed starts.
        for _ in 0..1440 {
            match schedule.find_next_occurrence(&at, false) {
                Ok(next) if next <= now => {
                    due = Some(next);
                    at = next;
                }
                _ => break,
            }
        }
        due
    }
}

/// Runs the Job and CronJob controllers until the sim stops.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim.store.subscribe_to_any(&[CRON_JOBS, JOBS, "/pods"]);
    let (Some(jobs), Some(cron_jobs), Some(pods)) = (
        sim.resource_type("batch", "v1", "jobs"),
        sim.resource_type("batch", "v1", "cronjobs"),
        sim.resource_type("", "v1", "pods"),
    ) else {
        return;
    };
    let controllers = Controllers {
        sim,
        jobs,
        cron_jobs,
        pods,
    };
    let mut pending = controllers.all();
    loop {
        let work: Vec<Key> = std::mem::take(&mut pending).into_iter().collect();
        for key in work.iter().filter(|k| k.0 == CRON_JOBS) {
            controllers.sync(key);
        }
        for key in work.iter().filter(|k| k.0 == JOBS) {
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

    #[test]
    fn a_job_is_defaulted_and_tied_to_its_pods_as_the_server_does() {
        let mut job = json!({"metadata": {"name": "pi", "uid": "u-1"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}});
        default_job(&mut job, true);
        assert_eq!(job["spec"]["completions"], 1);
        assert_eq!(job["spec"]["parallelism"], 1);
        assert_eq!(job["spec"]["backoffLimit"], 6);
        assert_eq!(
            job["spec"]["selector"],
            json!({"matchLabels": {CONTROLLER_UID: "u-1"}})
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"][JOB_NAME],
            "pi"
        );
        assert_eq!(job["metadata"]["labels"]["job-name"], "pi");
    }

    #[test]
    fn a_job_must_not_restart_its_pods_always() {
        let job = json!({"spec": {"template": {"spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "i"}]}}}});
        let causes = validate("jobs", &job);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec.template.spec.restartPolicy");
        assert_eq!(
            causes[0].message,
            "Required value: valid values: \"OnFailure\", \"Never\""
        );
    }

    #[test]
    fn a_schedule_is_five_fields() {
        assert!(parse_schedule("*/5 * * * *").is_ok());
        assert!(parse_schedule("@hourly").is_ok());
        assert!(parse_schedule("every minute").is_err());
    }
}
