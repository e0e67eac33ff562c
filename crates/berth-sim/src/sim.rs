//! The simulated API server's state and its verbs, independent of HTTP: the handlers in
//! `server.rs` parse requests and call these; the sim's own controllers call them too.

use std::{
    borrow::Cow,
    sync::{
        Arc, OnceLock, RwLock, RwLockReadGuard,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    time::Duration,
};

use jiff::Timestamp;
use serde_json::{Value, json};

use crate::{
    apply::{self, Writer},
    auth::{self, Tokens},
    builtin,
    config::{PodTermination, SimConfig},
    crd::{CRD_CLEANUP_FINALIZER, CRD_STORAGE},
    error::{ApiError, ApiResult, Cause},
    events,
    meta::{finalizers, labels_of, meta_str, new_uid, now_rfc3339, random_suffix},
    patch::{self, PatchType},
    recorder::{Report, Source},
    requests::RequestLog,
    resources::{Registry, ResourceType, View},
    selector::{FieldSelector, LabelSelector},
    store::{Store, WriteError, resource_version},
};

/// What a write's unknown fields get (`fieldValidation`): dropped silently, dropped with a
/// warning (the default), or the write refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    /// The query parameter's value; anything else is the default.
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("Ignore") => FieldValidation::Ignore,
            Some("Strict") => FieldValidation::Strict,
            _ => FieldValidation::Warn,
        }
    }
}

/// Who is writing, and how.
#[derive(Clone, Debug)]
pub struct WriteContext {
    pub manager: String,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
}

impl WriteContext {
    /// The same write as a dry run: what it would store, for admission webhooks to see.
    pub fn preview(&self) -> Self {
        WriteContext {
            manager: self.manager.clone(),
            dry_run: true,
            field_validation: self.field_validation,
        }
    }

    pub fn system(manager: &str) -> Self {
        WriteContext {
            manager: manager.to_owned(),
            dry_run: false,
            field_validation: FieldValidation::Warn,
        }
    }
}

/// A write's result: the object and any warnings for the `Warning` header.
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub warnings: Vec<String>,
    /// True when the write created the object (201).
    pub created: bool,
}

/// Options of a DELETE.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

impl DeleteOptions {
    /// Reads a DeleteOptions body, if any.
    pub fn from_body(body: &Value) -> Self {
        let mut options = DeleteOptions {
            grace_period_seconds: body["gracePeriodSeconds"].as_i64(),
            propagation: body["propagationPolicy"].as_str().map(str::to_owned),
            precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_owned),
            precondition_resource_version: body["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
        };
        if options.propagation.is_none() {
            match body["orphanDependents"].as_bool() {
                Some(true) => options.propagation = Some("Orphan".to_owned()),
                Some(false) => options.propagation = Some("Background".to_owned()),
                None => {}
            }
        }
        options
    }
}

/// What a DELETE did.
#[derive(Debug)]
pub struct Deleted {
    pub object: Value,
    /// The object is gone (as opposed to marked for deletion).
    pub removed: bool,
}

/// Options of a LIST.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

/// The cluster's state.
pub struct Sim {
    pub store: Store,
    registry: RwLock<Registry>,
    pub tokens: Tokens,
    pub requests: RequestLog,
    pub config: SimConfig,
    /// Bumped to close every open watch.
    pub watch_closer: tokio::sync::watch::Sender<u64>,
    /// The next watch that names a revision gets 410 Gone.
    pub expire_next_watch: AtomicBool,
    pub address: OnceLock<String>,
    pub ca_pem: OnceLock<String>,
    /// The cluster's CA, which the controller manager's signer issues certificates from.
    pub authority: OnceLock<Arc<crate::tls::Authority>>,
    next_cluster_ip: AtomicU32,
    pub faults: crate::faults::Faults,
    pub recorder: crate::recorder::Recorder,
    /// Each running container's output, by (pod UID, container name), for `kubectl logs`.
    pub logs:
        std::sync::Mutex<std::collections::HashMap<(String, String), crate::runtime::ContainerLog>>,
    /// The log of each container's previous start, by (pod UID, container name), for
    /// `kubectl logs --previous`.
    pub previous_logs:
        std::sync::Mutex<std::collections::HashMap<(String, String), crate::runtime::ContainerLog>>,
    /// Each running container's context, by (pod UID, container name), for exec and attach.
    pub containers: std::sync::Mutex<
        std::collections::HashMap<(String, String), crate::runtime::ContainerContext>,
    >,
    terminations: tokio::sync::mpsc::UnboundedSender<(String, String, String, Duration)>,
}

pub const FOREGROUND: &str = "foregroundDeletion";
pub const ORPHAN: &str = "orphan";

/// The object without what a no-op write may differ in: its resourceVersion and when each
/// manager last wrote (a new owner of a field, though, is a change, as on a real server).
fn comparable(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(meta) = o["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        if let Some(entries) = meta.get_mut("managedFields").and_then(Value::as_array_mut) {
            for entry in entries.iter_mut() {
                entry.as_object_mut().map(|e| e.remove("time"));
            }
            entries.sort_by_key(|e| e.to_string());
        }
    }
    o
}

/// The part of an object that counts as its spec for `generation`.
fn spec_part(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(map) = o.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
        map.remove("apiVersion");
        map.remove("kind");
    }
    o
}

fn store_error(error: WriteError, rt: &ResourceType, name: &str) -> ApiError {
    match error {
        WriteError::Exists => ApiError::already_exists(&rt.resource, &rt.group, name),
        WriteError::Missing => ApiError::not_found(&rt.resource, &rt.group, name),
        WriteError::Stale => ApiError::conflict_modified(&rt.resource, &rt.group, name),
    }
}

impl Sim {
    pub fn new(
        config: SimConfig,
        terminations: tokio::sync::mpsc::UnboundedSender<(String, String, String, Duration)>,
    ) -> Self {
        let (watch_closer, _) = tokio::sync::watch::channel(0);
        let seed = config.seed;
        Sim {
            // The broadcast holds each change it carries (as Values) until 8192 later ones
            // overwrite it; a watch that falls further behind ends, and its client resumes
            // from the history, as a real API server closes a watch that cannot keep up.
            store: Store::new(config.history_limit, config.history_window, 1 << 13),
            registry: RwLock::new(Registry::builtin()),
            tokens: Tokens::default(),
            requests: RequestLog::default(),
            config,
            watch_closer,
            expire_next_watch: AtomicBool::new(false),
            address: OnceLock::new(),
            ca_pem: OnceLock::new(),
            authority: OnceLock::new(),
            next_cluster_ip: AtomicU32::new(1),
            faults: crate::faults::Faults::new(seed),
            recorder: crate::recorder::Recorder::default(),
            logs: Default::default(),
            containers: Default::default(),
            previous_logs: Default::default(),
            terminations,
        }
    }

    pub fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The served type at group/version/resource.
    pub fn resource_type(
        &self,
        group: &str,
        version: &str,
        resource: &str,
    ) -> Option<Arc<ResourceType>> {
        self.registry().get(group, version, resource)
    }

    /// The served type of a kind (`ConfigMap` in `v1`).
    pub fn resource_type_of_kind(
        &self,
        group: &str,
        version: &str,
        kind: &str,
    ) -> Option<Arc<ResourceType>> {
        self.registry()
            .all()
            .find(|rt| rt.group == group && rt.version == version && rt.kind == kind)
            .cloned()
    }

    /// Creates the objects every cluster starts with.
    pub fn bootstrap(&self) {
        let ctx = WriteContext::system("kube-apiserver");
        for (storage, object) in auth::bootstrap_policy() {
            let mut object = object;
            self.stamp_new(&mut object);
            // The store is empty at bootstrap; a clash is impossible.
            let _ = self.store.create(&storage, object);
        }
        let namespaces = self
            .resource_type("", "v1", "namespaces")
            .expect("namespaces are built in");
        let mut names: Vec<String> = ["default", "kube-system", "kube-public", "kube-node-lease"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.extend(self.config.namespaces.iter().cloned());
        for name in names {
            let _ = self.create(
                &namespaces,
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                &ctx,
            );
        }
        // The components the (deprecated) ComponentStatus API reports, healthy.
        if let Some(statuses) = self.resource_type("", "v1", "componentstatuses") {
            for component in ["scheduler", "controller-manager", "etcd-0"] {
                let _ = self.create(
                    &statuses,
                    "",
                    json!({"apiVersion": "v1", "kind": "ComponentStatus",
                        "metadata": {"name": component},
                        "conditions": [{"type": "Healthy", "status": "True", "message": "ok"}]}),
                    &ctx,
                );
            }
        }
        // Every served group version is a local APIService, as the aggregator lists them.
        let registry = self.registry();
        let mut local: Vec<(String, String)> = vec![(String::new(), "v1".to_owned())];
        for (group, versions) in registry.groups() {
            local.extend(versions.into_iter().map(|v| (group.clone(), v)));
        }
        drop(registry);
        for (group, version) in local {
            self.register_api_service(&group, &version, false);
        }
        // The API server's own Service, on the first address of the service range.
        if let Some(services) = self.resource_type("", "v1", "services") {
            let _ = self.create(
                &services,
                "default",
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                    "spec": {"type": "ClusterIP", "clusterIP": builtin::cluster_ip(0), "clusterIPs": [builtin::cluster_ip(0)],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}}),
                &ctx,
            );
        }
    }

    fn stamp_new(&self, object: &mut Value) {
        object["metadata"]["uid"] = json!(new_uid());
        object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    }

    /// An object as its type serves it.
    pub fn to_view(&self, rt: &ResourceType, stored: &Value) -> Value {
        match rt.view {
            View::Native => stored.clone(),
            View::EventsV1 => events::to_v1(stored),
            View::Versioned => {
                let mut view = stored.clone();
                let api_version = rt.api_version();
                if view["apiVersion"] != api_version.as_str() {
                    view["apiVersion"] = json!(api_version);
                    if let Some(schema) = &rt.schema {
                        schema.prune(&mut view);
                    }
                }
                view
            }
        }
    }

    /// [`Sim::to_view`] without a copy when the stored object is already what the
    /// resource's clients see (a native type; a custom resource stored in this version).
    pub fn view_of<'a>(&self, rt: &ResourceType, stored: &'a Value) -> Cow<'a, Value> {
        let as_stored = match rt.view {
            View::Native => true,
            View::EventsV1 => false,
            View::Versioned => match stored["apiVersion"].as_str() {
                Some(v) if rt.group.is_empty() => v == rt.version,
                Some(v) => v.split_once('/') == Some((rt.group.as_str(), rt.version.as_str())),
                None => false,
            },
        };
        match as_stored {
            true => Cow::Borrowed(stored),
            false => Cow::Owned(self.to_view(rt, stored)),
        }
    }

    fn to_storage(&self, rt: &ResourceType, body: Value) -> Value {
        match rt.view {
            View::Native | View::Versioned => body,
            View::EventsV1 => events::from_v1(&body),
        }
    }

    /// An admitted object of a custom resource with several versions, in its storage version:
    /// what that version's schema does not define is pruned.
    fn into_storage_version(rt: &ResourceType, object: &mut Value) {
        if let Some(storage) = &rt.storage_version {
            object["apiVersion"] = json!(storage.api_version);
            if let Some(schema) = &storage.schema {
                schema.prune(object);
            }
        }
    }

    /// How server-side apply merges the lists of a type's objects.
    fn shape(rt: &ResourceType) -> apply::Shape<'_> {
        match &rt.schema {
            Some(schema) => apply::Shape::custom(&schema.root),
            None => apply::Shape::BUILTIN,
        }
    }

    /// The stored api version/kind of a type's objects.
    fn storage_identity(rt: &ResourceType) -> (String, String) {
        match rt.view {
            View::Native => (rt.api_version(), rt.kind.clone()),
            View::EventsV1 => ("v1".to_owned(), "Event".to_owned()),
            View::Versioned => (
                rt.storage_version
                    .as_ref()
                    .map(|s| s.api_version.clone())
                    .unwrap_or_else(|| rt.api_version()),
                rt.kind.clone(),
            ),
        }
    }

    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> ApiResult<Value> {
        self.store
            .get(&rt.storage, namespace, name)
            .map(|o| self.to_view(rt, &o))
            .ok_or_else(|| ApiError::not_found(&rt.resource, &rt.group, name))
    }

    /// Whether a (served-view) object passes a list or watch's namespace and selectors.
    pub fn matches(
        rt: &ResourceType,
        object: &Value,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> bool {
        if let Some(ns) = namespace
            && meta_str(object, "namespace").unwrap_or_default() != ns
        {
            return false;
        }
        (labels.is_empty() || labels.matches(&labels_of(object)))
            && (fields.is_empty()
                || fields.matches(|f| match f {
                    "metadata.name" => meta_str(object, "name").unwrap_or_default().to_owned(),
                    "metadata.namespace" => {
                        meta_str(object, "namespace").unwrap_or_default().to_owned()
                    }
                    other => rt.field_value(object, other),
                }))
    }

    /// Checks a field selector against what the type supports.
    pub fn check_fields(rt: &ResourceType, fields: &FieldSelector) -> ApiResult<()> {
        for term in &fields.0 {
            if !rt.supports_field(&term.field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {}",
                    term.field
                )));
            }
        }
        Ok(())
    }

    /// LIST, returning the list object in served form.
    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> ApiResult<Value> {
        Self::check_fields(rt, &options.fields)?;
        let (mut objects, revision, start_after) = match &options.continue_token {
            Some(token) => {
                let (revision, start) = decode_continue(token)?;
                let objects = self.store.list_at(&rt.storage, namespace, revision).map_err(|_| ApiError::Gone {
                    message: "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".to_owned(),
                })?;
                (objects, revision, Some(start))
            }
            None => {
                let exact = options.resource_version_match.as_deref() == Some("Exact");
                match options
                    .resource_version
                    .as_deref()
                    .filter(|rv| exact && *rv != "0")
                {
                    Some(rv) => {
                        let revision: u64 = rv.parse().map_err(|_| {
                            ApiError::bad_request(format!("invalid resource version: {rv}"))
                        })?;
                        let objects = self
                            .store
                            .list_at(&rt.storage, namespace, revision)
                            .map_err(|c| ApiError::Gone {
                                message: format!(
                                    "too old resource version: {revision} ({})",
                                    c.oldest_available
                                ),
                            })?;
                        (objects, revision, None)
                    }
                    None => {
                        let (objects, revision) = self.store.list(&rt.storage, namespace);
                        (objects, revision, None)
                    }
                }
            }
        };
        objects.sort_by(|a, b| {
            (meta_str(a, "namespace"), meta_str(a, "name"))
                .cmp(&(meta_str(b, "namespace"), meta_str(b, "name")))
        });
        // Only the page is copied out; the rest is counted (a list in pages of 500 of 10 000
        // pods copied every remaining pod for each page).
        let limit = options.limit.filter(|l| *l > 0);
        let mut items: Vec<Value> = vec![];
        let mut remaining = 0usize;
        for stored in objects.iter().filter(|o| match &start_after {
            Some((ns, name)) => {
                (
                    meta_str(o, "namespace").unwrap_or_default(),
                    meta_str(o, "name").unwrap_or_default(),
                ) > (ns.as_str(), name.as_str())
            }
            None => true,
        }) {
            let view = match rt.view {
                View::Native => std::borrow::Cow::Borrowed(&**stored),
                _ => std::borrow::Cow::Owned(self.to_view(rt, stored)),
            };
            if !Self::matches(rt, &view, namespace, &options.labels, &options.fields) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
            } else {
                items.push(view.into_owned());
            }
        }
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if remaining > 0 {
            let last = items.last().expect("limit is positive");
            let key = (
                meta_str(last, "namespace").unwrap_or_default().to_owned(),
                meta_str(last, "name").unwrap_or_default().to_owned(),
            );
            metadata["continue"] = json!(encode_continue(revision, &key));
            // Like the API server, the count is only given when no selector filtered.
            if options.labels.is_empty() && options.fields.is_empty() {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
        Ok(
            json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": metadata, "items": items}),
        )
    }

    fn check_namespace_open(&self, rt: &ResourceType, namespace: &str) -> ApiResult<()> {
        if !rt.namespaced {
            return Ok(());
        }
        match self.store.get("/namespaces", "", namespace) {
            None => Err(ApiError::not_found("namespaces", "", namespace)),
            Some(ns) if ns["metadata"]["deletionTimestamp"].is_string() => {
                Err(ApiError::Forbidden {
                    message: format!(
                        "{} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                        crate::error::qualified(&rt.resource, &rt.group)
                    ),
                    kind: rt.resource.clone(),
                    name: None,
                    group: rt.group.clone(),
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// A custom resource whose definition is being deleted takes no new objects (its
    /// instances are being removed).
    fn check_definition_open(&self, rt: &ResourceType) -> ApiResult<()> {
        if !rt.is_custom {
            return Ok(());
        }
        let crd = format!("{}.{}", rt.resource, rt.group);
        match self
            .store
            .get(CRD_STORAGE, "", &crd)
            .filter(|d| d["metadata"]["deletionTimestamp"].is_string())
        {
            Some(_) => Err(ApiError::MethodNotAllowed {
                message: "create not allowed while custom resource definition is terminating"
                    .to_owned(),
            }),
            None => Ok(()),
        }
    }

    fn check_identity(&self, rt: &ResourceType, object: &Value) -> ApiResult<()> {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        if !api_version.is_empty() && api_version != rt.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
        if !kind.is_empty() && kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        Ok(())
    }

    /// Pruning of unknown fields (refused with `fieldValidation=Strict`, warned about
    /// otherwise) for every type, and defaulting and validation for custom resources; returns
    /// the warnings.
    fn admit_fields(
        &self,
        rt: &ResourceType,
        object: &mut Value,
        old: Option<&Value>,
        validation: FieldValidation,
        name: &str,
    ) -> ApiResult<Vec<String>> {
        let unknown = match &rt.schema {
            Some(schema) => {
                schema.apply_defaults(object);
                schema.prune(object)
            }
            None => match crate::typed::schema(&rt.group, &rt.resource) {
                // A built-in type: the fields of its k8s-openapi type; a null is absent, as
                // for the real server's Go types.
                Some(known) => {
                    crate::typed::drop_nulls(object);
                    builtin::canonical_quantities(rt, object);
                    crate::schema::prune_unknown(known, object)
                }
                None => return Ok(vec![]),
            },
        };
        if validation == FieldValidation::Strict && !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|u| format!("unknown field \"{u}\""))
                .collect();
            let _ = name;
            return Err(ApiError::bad_request(format!(
                "{kind} in version \"{}\" cannot be handled as a {kind}: strict decoding error: {}",
                rt.version,
                list.join(", "),
                kind = rt.kind
            )));
        }
        if let Some(schema) = &rt.schema {
            let causes = schema.validate(object, old);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&rt.kind, &rt.group, name, causes));
            }
        }
        if validation == FieldValidation::Ignore {
            return Ok(vec![]);
        }
        Ok(unknown
            .into_iter()
            .map(|u| format!("unknown field \"{u}\""))
            .collect())
    }

    /// A pod whose quantities, or a secret whose data, cannot be decoded is a bad request, as
    /// the real decoder says.
    /// Built-in objects' times as the real decoder reads and the server stores them.
    fn normalize_times(rt: &ResourceType, object: &mut Value) -> ApiResult<()> {
        let Some(schema) = crate::typed::schema(&rt.group, &rt.resource) else {
            return Ok(());
        };
        crate::typed::normalize_times(&rt.resource, schema, object).map_err(|message| {
            ApiError::bad_request(format!(
                "{kind} in version \"{}\" cannot be handled as a {kind}: {message}",
                rt.version,
                kind = rt.kind
            ))
        })
    }

    fn check_decodable(rt: &ResourceType, object: &Value) -> ApiResult<()> {
        if rt.group.is_empty()
            && rt.resource == "secrets"
            && let Some(message) = builtin::bad_secret_data(object)
        {
            return Err(ApiError::bad_request(format!(
                "Secret in version \"{}\" cannot be handled as a Secret: {message}",
                rt.version
            )));
        }
        if !(rt.group.is_empty() && matches!(&*rt.resource, "pods" | "persistentvolumeclaims")) {
            return Ok(());
        }
        match builtin::bad_quantity(object) {
            Some(message) => Err(ApiError::bad_request(format!(
                "{kind} in version \"{}\" cannot be handled as a {kind}: {message}",
                rt.version,
                kind = rt.kind
            ))),
            None => Ok(()),
        }
    }

    fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> ApiError {
        ApiError::invalid(&rt.kind, &rt.group, name, causes)
    }

    /// CREATE.
    pub fn create(
        &self,
        rt: &ResourceType,
        namespace: &str,
        body: Value,
        ctx: &WriteContext,
    ) -> ApiResult<Written> {
        self.create_owned(rt, namespace, body, ctx, None)
    }

    /// A create whose managed fields are `managed` (an apply's) instead of an Update entry of
    /// the writer: one write either way.
    fn create_owned(
        &self,
        rt: &ResourceType,
        namespace: &str,
        body: Value,
        ctx: &WriteContext,
        managed: Option<Value>,
    ) -> ApiResult<Written> {
        self.check_identity(rt, &body)?;
        if rt.view == View::EventsV1 {
            let causes = builtin::validate_event_v1_create(&body);
            if !causes.is_empty() {
                let name = meta_str(&body, "name").unwrap_or_default().to_owned();
                return Err(Self::invalid(rt, &name, causes));
            }
        }
        let mut object = self.to_storage(rt, body);
        let (api_version, kind) = Self::storage_identity(rt);
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        if rt.namespaced {
            match meta_str(&object, "namespace") {
                Some(ns) if !ns.is_empty() && ns != namespace => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => object["metadata"]["namespace"] = json!(namespace),
            }
        } else if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("namespace");
        }
        if meta_str(&object, "name").is_none_or(str::is_empty) {
            match meta_str(&object, "generateName").filter(|g| !g.is_empty()) {
                Some(prefix) => {
                    object["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix()))
                }
                None => {
                    return Err(Self::invalid(
                        rt,
                        "",
                        vec![Cause {
                            reason: "FieldValueRequired".to_owned(),
                            message: "Required value: name or generateName is required".to_owned(),
                            field: "metadata.name".to_owned(),
                        }],
                    ));
                }
            }
        }
        let name = meta_str(&object, "name").unwrap_or_default().to_owned();
        if let Some(cause) = builtin::check_name(rt, &name) {
            return Err(Self::invalid(rt, &name, vec![cause]));
        }
        if meta_str(&object, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.check_namespace_open(rt, namespace)?;
        self.check_definition_open(rt)?;
        if rt.group.is_empty() && rt.resource == "pods" {
            crate::service_account::admit(&self.store, namespace, &name, &mut object)?;
            crate::quota::admit_pod(&self.store, namespace, &name, &object)?;
        }
        if let Some(meta) = object["metadata"].as_object_mut() {
            for server_field in [
                "uid",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                meta.remove(server_field);
            }
        }
        self.stamp_new(&mut object);
        if rt.tracks_generation {
            object["metadata"]["generation"] = json!(1);
        }
        if rt.has_status()
            && rt.is_custom
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
        builtin::default_on_create(rt, &mut object, || {
            builtin::cluster_ip(self.next_cluster_ip.fetch_add(1, Ordering::Relaxed))
        });
        let mut warnings = self.admit_fields(rt, &mut object, None, ctx.field_validation, &name)?;
        Self::into_storage_version(rt, &mut object);
        if &*rt.storage == "/events" {
            events::normalize_times(&mut object).map_err(|message| {
                ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: {message}",
                    rt.kind, rt.version, rt.kind
                ))
            })?;
        }
        Self::normalize_times(rt, &mut object)?;
        Self::check_decodable(rt, &object)?;
        let mut causes = builtin::validate(rt, &object);
        if rt.group.is_empty() && rt.resource == "namespaces" {
            causes.extend(crate::pod_security::check_namespace(&object, None));
        }
        if causes.is_empty() && rt.group.is_empty() && rt.resource == "services" {
            causes = crate::node_ports::allocate(&self.store, &mut object, None);
        }
        if !causes.is_empty() {
            return Err(Self::invalid(rt, &name, causes));
        }
        warnings.extend(crate::pod_security::admit(
            &self.store,
            &rt.group,
            &rt.resource,
            "",
            namespace,
            &object,
            None,
        )?);
        if rt.group == "apiextensions.k8s.io" {
            crate::crd::prepare(&mut object).map_err(|causes| Self::invalid(rt, &name, causes))?;
            // The apiextensions server's own finalizer: instances go before the definition.
            let finalizers = object["metadata"]["finalizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if !finalizers.iter().any(|f| f == CRD_CLEANUP_FINALIZER) {
                let mut finalizers = finalizers;
                finalizers.push(json!(CRD_CLEANUP_FINALIZER));
                object["metadata"]["finalizers"] = Value::Array(finalizers);
            }
        }
        let now = now_rfc3339();
        match managed {
            Some(managed) => object["metadata"]["managedFields"] = managed,
            None => apply::record_update(
                None,
                &mut object,
                &Writer {
                    manager: &ctx.manager,
                    api_version: &rt.api_version(),
                    subresource: "",
                    now: &now,
                    shape: Self::shape(rt),
                },
            ),
        }
        if ctx.dry_run {
            return Ok(Written {
                object: self.to_view(rt, &object),
                warnings,
                created: true,
            });
        }
        let stored = self
            .store
            .create(&rt.storage, object)
            .map_err(|e| store_error(e, rt, &name))?;
        self.after_write(rt, &stored);
        Ok(Written {
            object: self.to_view(rt, &stored),
            warnings,
            created: true,
        })
    }

    /// Side effects of a write that controllers in a real cluster would perform at once.
    fn after_write(&self, rt: &ResourceType, stored: &Value) {
        match (rt.group.as_str(), rt.resource.as_str()) {
            ("apiextensions.k8s.io", "customresourcedefinitions") => self.register_crd(stored),
            ("", "namespaces") if stored["metadata"]["deletionTimestamp"].is_null() => {
                let ns = meta_str(stored, "name").unwrap_or_default().to_owned();
                let ctx = WriteContext::system("kube-controller-manager");
                if let Some(sa) = self.resource_type("", "v1", "serviceaccounts")
                    && self.store.get(&sa.storage, &ns, "default").is_none()
                {
                    let _ = self.create(&sa, &ns, json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}), &ctx);
                }
                if let (Some(cm), Some(ca)) = (
                    self.resource_type("", "v1", "configmaps"),
                    self.ca_pem.get(),
                ) && self
                    .store
                    .get(&cm.storage, &ns, "kube-root-ca.crt")
                    .is_none()
                {
                    let _ = self.create(&cm, &ns, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}}), &ctx);
                }
            }
            _ => {}
        }
    }

    /// Publishes (or bumps) an event about `object` from one of the sim's components, through
    /// the API as theirs go (a terminating namespace takes no new event). `field_path` names a
    /// container, e.g. `spec.containers{main}`.
    pub fn record(
        &self,
        object: &Value,
        field_path: Option<&str>,
        type_: &str,
        reason: &str,
        message: &str,
        source: Source<'_>,
    ) {
        let Some(events) = self.resource_type("", "v1", "events") else {
            return;
        };
        let report = Report {
            object,
            field_path,
            type_,
            reason,
            message,
            source,
        };
        let ctx = WriteContext::system(source.component);
        self.recorder
            .publish(&self.store, &events.storage, report, |namespace, event| {
                self.create(&events, namespace, event, &ctx).is_ok()
            });
    }

    /// Serves the resources a CRD defines (or stops serving those it no longer does), and
    /// registers each served version as an APIService, as the API server's CRD
    /// autoregistration does.
    pub fn register_crd(&self, crd: &Value) {
        let mut registry = self.registry.write().unwrap_or_else(|p| p.into_inner());
        crate::crd::serve(&mut registry, crd);
        drop(registry);
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
            if version["served"] == true
                && let Some(name) = version["name"].as_str()
            {
                self.register_api_service(group, name, true);
            }
        }
    }

    /// Says in node `node`'s status on which port its kubelet serves (`daemonEndpoints`).
    pub fn set_kubelet_port(&self, node: &str, port: u16) {
        let (Some(rt), Some(current)) = (
            self.resource_type("", "v1", "nodes"),
            self.store.get("/nodes", "", node),
        ) else {
            return;
        };
        let mut updated = (*current).clone();
        updated["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] = json!(port);
        let _ = self.update(
            &rt,
            "",
            node,
            "status",
            updated,
            &WriteContext::system("kubelet"),
        );
    }

    /// The APIService of a local group version (`v1.apps`, `v1.` for the core group), unless
    /// it exists: always available, as local ones are.
    fn register_api_service(&self, group: &str, version: &str, automanaged: bool) {
        let Some(rt) = self.resource_type("apiregistration.k8s.io", "v1", "apiservices") else {
            return;
        };
        let name = format!("{version}.{group}");
        if self.store.get(&rt.storage, "", &name).is_some() {
            return;
        }
        let (group_priority, version_priority) = match (automanaged, group) {
            (true, _) => (1000, 100),
            (false, "") => (18000, 1),
            (false, _) => (17000, 15),
        };
        let mut service = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": name},
            "spec": {"version": version, "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
            "status": {"conditions": [{"type": "Available", "status": "True", "lastTransitionTime": now_rfc3339(),
                "reason": "Local", "message": "Local APIServices are always available"}]}});
        if !group.is_empty() {
            service["spec"]["group"] = json!(group);
        }
        if automanaged {
            service["metadata"]["labels"] =
                json!({"kube-aggregator.kubernetes.io/automanaged": "true"});
        }
        let _ = self.create(&rt, "", service, &WriteContext::system("kube-apiserver"));
    }

    /// Merges an update body with the stored object as the type's strategy does.
    fn merge_for_update(
        &self,
        rt: &ResourceType,
        current: &Value,
        body: Value,
        subresource: &str,
    ) -> Value {
        let mut new = if rt.group == "certificates.k8s.io" {
            crate::certificates::merge(current, &body, subresource)
        } else if subresource == "resize" {
            builtin::merge_resize(current, &body)
        } else if subresource == "ephemeralcontainers" {
            // Only the ephemeral containers are taken from the body.
            let mut new = current.clone();
            new["spec"]["ephemeralContainers"] = body["spec"]["ephemeralContainers"].clone();
            if new["spec"]["ephemeralContainers"].is_null()
                && let Some(spec) = new["spec"].as_object_mut()
            {
                spec.remove("ephemeralContainers");
            }
            builtin::default_pod_spec(&mut new["spec"]);
            new
        } else if subresource == "status" {
            let mut new = current.clone();
            crate::meta::carry(&mut new, "status", body.get("status"));
            new
        } else {
            let mut new = body;
            if rt.has_status() {
                crate::meta::carry(&mut new, "status", current.get("status"));
            }
            new
        };
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
            "generation",
            "managedFields",
        ] {
            match current["metadata"].get(field) {
                Some(value) => new["metadata"][field] = value.clone(),
                None => {
                    if let Some(meta) = new["metadata"].as_object_mut() {
                        meta.remove(field);
                    }
                }
            }
        }
        let (api_version, kind) = Self::storage_identity(rt);
        new["apiVersion"] = json!(api_version);
        new["kind"] = json!(kind);
        if rt.resource == "secrets" && rt.group.is_empty() {
            builtin::fold_string_data(&mut new);
        }
        new
    }

    /// Admission, generation, no-op detection, managed fields and the conditional write of
    /// an update. `managed` carries managed fields an apply already computed.
    #[allow(clippy::too_many_arguments)]
    fn persist_update(
        &self,
        rt: &ResourceType,
        current: &Value,
        mut new: Value,
        ctx: &WriteContext,
        subresource: &str,
        managed: Option<Value>,
    ) -> ApiResult<Written> {
        let name = meta_str(current, "name").unwrap_or_default().to_owned();
        let expected = resource_version(current).unwrap_or_default();
        if current["metadata"]["deletionTimestamp"].is_string() {
            let old = finalizers(current);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(Self::invalid(
                    rt,
                    &name,
                    vec![Cause {
                        reason: "FieldValueForbidden".to_owned(),
                        message: format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                        field: "metadata.finalizers".to_owned(),
                    }],
                ));
            }
        }
        if subresource.is_empty() {
            builtin::keep_allocated(rt, current, &mut new);
            if rt.group == "apps" {
                builtin::default_workload(rt, &mut new);
            }
            if rt.group == "batch" {
                builtin::default_batch(rt, &mut new, false);
            }
        }
        let mut warnings =
            self.admit_fields(rt, &mut new, Some(current), ctx.field_validation, &name)?;
        Self::into_storage_version(rt, &mut new);
        if &*rt.storage == "/events" {
            events::normalize_times(&mut new).map_err(|message| {
                ApiError::bad_request(format!(
                    "{} in version \"{}\" cannot be handled as a {}: {message}",
                    rt.kind, rt.version, rt.kind
                ))
            })?;
        }
        Self::normalize_times(rt, &mut new)?;
        Self::check_decodable(rt, &new)?;
        let mut causes = builtin::validate(rt, &new);
        if rt.resource == "pods" && rt.group.is_empty() && subresource.is_empty() {
            causes.extend(builtin::pod_spec_update_forbidden(current, &new));
        }
        if rt.resource == "pods" && rt.group.is_empty() && subresource == "resize" {
            causes.extend(builtin::resize_forbidden(current, &new));
        }
        if rt.resource == "pods" && rt.group.is_empty() && subresource == "ephemeralcontainers" {
            causes.extend(builtin::ephemeral_update_forbidden(current, &new));
        }
        if rt.resource == "persistentvolumeclaims" && rt.group.is_empty() && subresource.is_empty()
        {
            causes.extend(builtin::claim_update_forbidden(current, &new));
        }
        if rt.group == "certificates.k8s.io" {
            causes.extend(crate::certificates::validate_update(
                current,
                &new,
                subresource,
            ));
        }
        if subresource.is_empty() {
            causes.extend(builtin::immutable_update_forbidden(rt, current, &new));
        }
        if rt.group.is_empty() && rt.resource == "namespaces" && subresource.is_empty() {
            causes.extend(crate::pod_security::check_namespace(&new, Some(current)));
        }
        if causes.is_empty()
            && rt.group.is_empty()
            && rt.resource == "services"
            && subresource.is_empty()
        {
            causes = crate::node_ports::allocate(&self.store, &mut new, Some(current));
        }
        if !causes.is_empty() {
            return Err(Self::invalid(rt, &name, causes));
        }
        let namespace = meta_str(current, "namespace")
            .unwrap_or_default()
            .to_owned();
        warnings.extend(crate::pod_security::admit(
            &self.store,
            &rt.group,
            &rt.resource,
            subresource,
            &namespace,
            &new,
            Some(current),
        )?);
        if rt.group == "apiextensions.k8s.io" && subresource.is_empty() {
            crate::crd::prepare(&mut new).map_err(|causes| Self::invalid(rt, &name, causes))?;
        }
        if rt.tracks_generation && spec_part(current) != spec_part(&new) {
            let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        match managed {
            Some(entries) if entries.as_array().is_some_and(|a| !a.is_empty()) => {
                new["metadata"]["managedFields"] = entries
            }
            Some(_) => {
                if let Some(meta) = new["metadata"].as_object_mut() {
                    meta.remove("managedFields");
                }
            }
            None => {
                let now = now_rfc3339();
                apply::record_update(
                    Some(current),
                    &mut new,
                    &Writer {
                        manager: &ctx.manager,
                        api_version: &rt.api_version(),
                        subresource,
                        now: &now,
                        shape: Self::shape(rt),
                    },
                );
            }
        }
        if comparable(current) == comparable(&new) {
            return Ok(Written {
                object: self.to_view(rt, current),
                warnings,
                created: false,
            });
        }
        if ctx.dry_run {
            return Ok(Written {
                object: self.to_view(rt, &new),
                warnings,
                created: false,
            });
        }
        let finishing = new["metadata"]["deletionTimestamp"].is_string()
            && finalizers(&new).is_empty()
            && new["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                == 0;
        if finishing {
            let namespace = meta_str(current, "namespace")
                .unwrap_or_default()
                .to_owned();
            let gone = self
                .store
                .remove(&rt.storage, &namespace, &name, expected)
                .map_err(|e| store_error(e, rt, &name))?;
            self.after_remove(rt, &gone);
            return Ok(Written {
                object: self.to_view(rt, &gone),
                warnings,
                created: false,
            });
        }
        let stored = self
            .store
            .replace(&rt.storage, new, expected)
            .map_err(|e| store_error(e, rt, &name))?;
        self.after_write(rt, &stored);
        Ok(Written {
            object: self.to_view(rt, &stored),
            warnings,
            created: false,
        })
    }

    fn after_remove(&self, rt: &ResourceType, gone: &Value) {
        if rt.group == "apiextensions.k8s.io" && rt.resource == "customresourcedefinitions" {
            let group = gone["spec"]["group"].as_str().unwrap_or_default();
            let plural = gone["spec"]["names"]["plural"].as_str().unwrap_or_default();
            let storage: crate::resources::StorageKey = format!("{group}/{plural}").into();
            let (instances, _) = self.store.list(&storage, None);
            for instance in instances {
                let _ = self.store.remove(
                    &storage,
                    meta_str(&instance, "namespace").unwrap_or_default(),
                    meta_str(&instance, "name").unwrap_or_default(),
                    resource_version(&instance).unwrap_or_default(),
                );
            }
            self.registry
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove_group_resource(group, plural);
            // An automanaged APIService goes with the last resource of its group version.
            let served = self.registry().groups().remove(group).unwrap_or_default();
            for version in gone["spec"]["versions"].as_array().into_iter().flatten() {
                let Some(version) = version["name"].as_str() else {
                    continue;
                };
                let name = format!("{version}.{group}");
                if !served.iter().any(|v| v == version)
                    && let Some(service) =
                        self.store
                            .get("apiregistration.k8s.io/apiservices", "", &name)
                    && service["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"]
                        == "true"
                {
                    let _ = self.store.remove(
                        &crate::resources::StorageKey::from("apiregistration.k8s.io/apiservices"),
                        "",
                        &name,
                        resource_version(&service).unwrap_or_default(),
                    );
                }
            }
        }
    }

    /// UPDATE (PUT) of the object or its status.
    pub fn update(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        subresource: &str,
        body: Value,
        ctx: &WriteContext,
    ) -> ApiResult<Written> {
        self.check_identity(rt, &body)?;
        let body = self.to_storage(rt, body);
        if meta_str(&body, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&body, "name").unwrap_or_default()
            )));
        }
        if rt.namespaced
            && meta_str(&body, "namespace").is_some_and(|n| !n.is_empty() && n != namespace)
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let current = self
            .store
            .get(&rt.storage, namespace, name)
            .ok_or_else(|| ApiError::not_found(&rt.resource, &rt.group, name))?;
        match meta_str(&body, "resourceVersion").filter(|rv| !rv.is_empty()) {
            None if rt.is_custom => {
                return Err(Self::invalid(
                    rt,
                    name,
                    vec![Cause {
                        reason: "FieldValueInvalid".to_owned(),
                        message: "Invalid value: 0x0: must be specified for an update".to_owned(),
                        field: "metadata.resourceVersion".to_owned(),
                    }],
                ));
            }
            Some(rv) if Some(rv) != meta_str(&current, "resourceVersion") => {
                return Err(ApiError::conflict_modified(&rt.resource, &rt.group, name));
            }
            _ => {}
        }
        let new = self.merge_for_update(rt, &current, body, subresource);
        self.persist_update(rt, &current, new, ctx, subresource, None)
    }

    /// PATCH of any type; retries internally on a concurrent write, as the API server does,
    /// unless the patch itself names a resourceVersion.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        subresource: &str,
        patch_type: PatchType,
        body: &Value,
        ctx: &WriteContext,
        force: bool,
    ) -> ApiResult<Written> {
        if patch_type == PatchType::Strategic && rt.is_custom {
            return Err(ApiError::UnsupportedMediaType {
                message: "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".to_owned(),
            });
        }
        if patch_type == PatchType::Apply && ctx.manager.is_empty() {
            return Err(ApiError::Invalid {
                message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".to_owned(),
                kind: "PatchOptions".to_owned(),
                name: String::new(),
                group: "meta.k8s.io".to_owned(),
                causes: vec![Cause { reason: "FieldValueRequired".to_owned(), message: "Required value: is required for apply patch".to_owned(), field: "fieldManager".to_owned() }],
            });
        }
        for _ in 0..16 {
            let Some(current) = self.store.get(&rt.storage, namespace, name) else {
                if patch_type == PatchType::Apply && subresource.is_empty() {
                    return self.apply_create(rt, namespace, name, body, ctx);
                }
                return Err(ApiError::not_found(&rt.resource, &rt.group, name));
            };
            let view = self.to_view(rt, &current);
            let mut managed = None;
            let patched = match patch_type {
                PatchType::Merge => {
                    let mut v = view.clone();
                    patch::merge(&mut v, body)?;
                    v
                }
                PatchType::Json => {
                    let mut v = view.clone();
                    patch::json(&mut v, body)?;
                    v
                }
                PatchType::Strategic => {
                    let mut v = view.clone();
                    patch::strategic(&mut v, body)?;
                    v
                }
                PatchType::Apply => {
                    self.check_identity(rt, body)?;
                    let now = now_rfc3339();
                    let writer = Writer {
                        manager: &ctx.manager,
                        api_version: &rt.api_version(),
                        subresource,
                        now: &now,
                        shape: Self::shape(rt),
                    };
                    let v =
                        apply::apply(&view, body, &writer, force, &rt.resource, &rt.group, name)?;
                    managed = Some(
                        v["metadata"]
                            .get("managedFields")
                            .cloned()
                            .unwrap_or(Value::Array(vec![])),
                    );
                    v
                }
            };
            // A resourceVersion in the patch (or in an applied configuration) is a precondition.
            let explicit_rv = if patch_type == PatchType::Apply {
                meta_str(body, "resourceVersion")
                    .is_some_and(|rv| Some(rv) != meta_str(&view, "resourceVersion"))
            } else {
                meta_str(&patched, "resourceVersion") != meta_str(&view, "resourceVersion")
            };
            if explicit_rv {
                return Err(ApiError::conflict_modified(&rt.resource, &rt.group, name));
            }
            let mut patched = self.to_storage(rt, patched);
            if patch_type != PatchType::Apply {
                // Managed fields are the server's; a patch cannot rewrite them.
                if let Some(meta) = patched["metadata"].as_object_mut() {
                    meta.remove("managedFields");
                }
            }
            let new = self.merge_for_update(rt, &current, patched, subresource);
            let result = self.persist_update(rt, &current, new, ctx, subresource, managed);
            match result {
                Err(ApiError::Conflict { .. })
                    if self
                        .store
                        .get(&rt.storage, namespace, name)
                        .map(|o| resource_version(&o))
                        != Some(resource_version(&current)) =>
                {
                    continue;
                }
                other => return other,
            }
        }
        Err(ApiError::conflict_modified(&rt.resource, &rt.group, name))
    }

    fn apply_create(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        applied: &Value,
        ctx: &WriteContext,
    ) -> ApiResult<Written> {
        self.check_identity(rt, applied)?;
        if meta_str(applied, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(applied, "name").unwrap_or_default()
            )));
        }
        let now = now_rfc3339();
        let writer = Writer {
            manager: &ctx.manager,
            api_version: &rt.api_version(),
            subresource: "",
            now: &now,
            shape: Self::shape(rt),
        };
        let mut object = apply::apply(
            &json!({"metadata": {}}),
            applied,
            &writer,
            true,
            &rt.resource,
            &rt.group,
            name,
        )?;
        object["apiVersion"] = json!(rt.api_version());
        object["kind"] = json!(rt.kind);
        object["metadata"]["name"] = json!(name);
        let managed = object["metadata"]["managedFields"].clone();
        // One write, owned by the applier as Apply: watchers see ADDED only.
        self.create_owned(rt, namespace, object, ctx, Some(managed))
    }

    /// DELETE.
    pub fn delete(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
        ctx: &WriteContext,
    ) -> ApiResult<Deleted> {
        for _ in 0..16 {
            let current = self
                .store
                .get(&rt.storage, namespace, name)
                .ok_or_else(|| ApiError::not_found(&rt.resource, &rt.group, name))?;
            if let Some(uid) = &options.precondition_uid {
                let actual = meta_str(&current, "uid").unwrap_or_default();
                if uid != actual {
                    return Err(ApiError::conflict(
                        &rt.resource,
                        &rt.group,
                        name,
                        &format!(
                            "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                        ),
                        vec![],
                    ));
                }
            }
            if let Some(rv) = &options.precondition_resource_version {
                let actual = meta_str(&current, "resourceVersion").unwrap_or_default();
                if rv != actual {
                    return Err(ApiError::conflict(
                        &rt.resource,
                        &rt.group,
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                        ),
                        vec![],
                    ));
                }
            }
            match self.delete_once(rt, namespace, name, &current, options, ctx) {
                Err(ApiError::Conflict { .. })
                    if options.precondition_resource_version.is_none() =>
                {
                    continue;
                }
                other => return other,
            }
        }
        Err(ApiError::conflict_modified(&rt.resource, &rt.group, name))
    }

    /// Writes an object that stays while it is being deleted (finalizers, grace period, a
    /// terminating namespace); a dry run only shows it.
    fn mark_deleting(
        &self,
        rt: &ResourceType,
        name: &str,
        new: Value,
        expected: u64,
        ctx: &WriteContext,
    ) -> ApiResult<Deleted> {
        if ctx.dry_run {
            return Ok(Deleted {
                object: self.to_view(rt, &new),
                removed: false,
            });
        }
        let stored = self
            .store
            .replace(&rt.storage, new, expected)
            .map_err(|e| store_error(e, rt, name))?;
        Ok(Deleted {
            object: self.to_view(rt, &stored),
            removed: false,
        })
    }

    fn delete_once(
        &self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        current: &Arc<Value>,
        options: &DeleteOptions,
        ctx: &WriteContext,
    ) -> ApiResult<Deleted> {
        let expected = resource_version(current).unwrap_or_default();
        let deleting = current["metadata"]["deletionTimestamp"].is_string();
        let is_pod = rt.group.is_empty() && rt.resource == "pods";
        let is_namespace = rt.group.is_empty() && rt.resource == "namespaces";
        let mut new = (**current).clone();
        let now = now_rfc3339();

        if is_namespace {
            if deleting {
                return Ok(Deleted {
                    object: self.to_view(rt, current),
                    removed: false,
                });
            }
            new["metadata"]["deletionTimestamp"] = json!(now);
            new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            new["status"]["phase"] = json!("Terminating");
            return self.mark_deleting(rt, name, new, expected, ctx);
        }

        let mut fins = finalizers(current);
        if !deleting {
            match options.propagation.as_deref() {
                Some("Orphan") if !fins.iter().any(|f| f == ORPHAN) => fins.push(ORPHAN.to_owned()),
                Some("Foreground") if !fins.iter().any(|f| f == FOREGROUND) => {
                    fins.push(FOREGROUND.to_owned())
                }
                _ => {}
            }
        }

        let grace = if is_pod {
            let requested = options
                .grace_period_seconds
                .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30);
            let bound = current["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
            let terminal = matches!(
                current["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            if bound && !terminal {
                requested.max(0)
            } else {
                0
            }
        } else {
            0
        };

        if grace > 0 {
            let existing = current["metadata"]["deletionGracePeriodSeconds"].as_i64();
            if deleting && existing.is_some_and(|g| g <= grace) {
                return Ok(Deleted {
                    object: self.to_view(rt, current),
                    removed: false,
                });
            }
            let deadline = Timestamp::now()
                .checked_add(jiff::SignedDuration::from_secs(grace))
                .unwrap_or_else(|_| Timestamp::now())
                .round(jiff::Unit::Second)
                .unwrap_or_else(|_| Timestamp::now());
            new["metadata"]["deletionTimestamp"] = json!(deadline.to_string());
            new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            new["metadata"]["finalizers"] = json!(fins);
            if rt.tracks_generation && !deleting {
                new["metadata"]["generation"] =
                    json!(current["metadata"]["generation"].as_i64().unwrap_or(0) + 1);
            }
            if ctx.dry_run {
                return Ok(Deleted {
                    object: self.to_view(rt, &new),
                    removed: false,
                });
            }
            let stored = self
                .store
                .replace(&rt.storage, new, expected)
                .map_err(|e| store_error(e, rt, name))?;
            if self.config.pod_termination == PodTermination::AfterGracePeriod {
                let wait = Duration::from_secs(grace as u64).min(self.config.max_pod_grace);
                let uid = meta_str(&stored, "uid").unwrap_or_default().to_owned();
                let _ = self
                    .terminations
                    .send((namespace.to_owned(), name.to_owned(), uid, wait));
            }
            return Ok(Deleted {
                object: self.to_view(rt, &stored),
                removed: false,
            });
        }

        if !fins.is_empty() {
            if deleting
                && current["metadata"]["deletionGracePeriodSeconds"]
                    .as_i64()
                    .unwrap_or(0)
                    == 0
                && fins == finalizers(current)
            {
                return Ok(Deleted {
                    object: self.to_view(rt, current),
                    removed: false,
                });
            }
            if !deleting {
                new["metadata"]["deletionTimestamp"] = json!(now);
                if rt.tracks_generation {
                    new["metadata"]["generation"] =
                        json!(current["metadata"]["generation"].as_i64().unwrap_or(0) + 1);
                }
            }
            new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            new["metadata"]["finalizers"] = json!(fins);
            return self.mark_deleting(rt, name, new, expected, ctx);
        }

        if ctx.dry_run {
            return Ok(Deleted {
                object: self.to_view(rt, current),
                removed: true,
            });
        }
        let gone = self
            .store
            .remove(&rt.storage, namespace, name, expected)
            .map_err(|e| store_error(e, rt, name))?;
        self.after_remove(rt, &gone);
        Ok(Deleted {
            object: self.to_view(rt, &gone),
            removed: true,
        })
    }
}

fn encode_continue(revision: u64, key: &(String, String)) -> String {
    use base64::Engine;
    let raw = json!({"rv": revision, "ns": key.0, "name": key.1}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> ApiResult<(u64, (String, String))> {
    use base64::Engine;
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = value["rv"].as_u64().ok_or_else(bad)?;
    Ok((
        rv,
        (
            value["ns"].as_str().unwrap_or_default().to_owned(),
            value["name"].as_str().unwrap_or_default().to_owned(),
        ),
    ))
}
