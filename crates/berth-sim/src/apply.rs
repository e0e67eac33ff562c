//! Server-side apply and managed fields: which manager owns which field, conflicts between
//! managers (409 unless `force`), removal of fields a manager stopped applying, and the
//! `metadata.managedFields` entries in the real `FieldsV1` format.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::{
    error::{ApiError, Cause},
    patch::merge_key,
};

/// One step of a field path: a map key or an associative-list element.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    Field(String),
    /// A list element identified by its merge key, e.g. `{"name":"app"}` (by all of its
    /// keys, for a list with several).
    Key(String, String),
    /// An element of a list that is a set, by its value (JSON), e.g. `3` or `"a"`.
    Value(String),
}

/// How a list merges under server-side apply.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ListShape {
    /// Replaced whole, owned as one field.
    Atomic,
    /// Elements by the values of these keys.
    Keys(Vec<String>),
    /// Elements by value.
    Set,
}

/// Where in a type's shape a value is: a custom resource's schema node (its
/// `x-kubernetes-list-type` says how lists merge), or a built-in type's (merge keys by field
/// name, as the sim knows them).
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    schema: Option<&'a Value>,
    custom: bool,
}

impl<'a> Shape<'a> {
    /// The shape of a built-in type's objects.
    pub const BUILTIN: Shape<'static> = Shape {
        schema: None,
        custom: false,
    };

    /// The shape of a custom resource with this (root) schema.
    pub fn custom(schema: &'a Value) -> Self {
        Shape {
            schema: Some(schema),
            custom: true,
        }
    }

    /// The shape of field `field` of an object of this shape (`metadata` is every kind's).
    fn field(self, field: &str, top: bool) -> Shape<'a> {
        if top && field == "metadata" {
            return Shape::BUILTIN;
        }
        let schema = self.schema.and_then(|s| {
            s["properties"]
                .get(field)
                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
        });
        Shape {
            schema,
            custom: self.custom,
        }
    }

    /// The shape of an element of a list of this shape.
    fn items(self) -> Shape<'a> {
        Shape {
            schema: self.schema.and_then(|s| s.get("items")),
            custom: self.custom,
        }
    }

    /// How the list `field` of this shape merges.
    fn list(self, field: &str, first: Option<&Value>) -> ListShape {
        if let Some(schema) = self.schema {
            return match schema["x-kubernetes-list-type"].as_str() {
                Some("set") => ListShape::Set,
                Some("map") => ListShape::Keys(
                    schema["x-kubernetes-list-map-keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|k| k.as_str().map(str::to_owned))
                        .collect(),
                ),
                _ => ListShape::Atomic,
            };
        }
        if self.custom {
            return ListShape::Atomic;
        }
        match merge_key(field, first) {
            Some(key) => ListShape::Keys(vec![key.to_owned()]),
            None if field == "finalizers" => ListShape::Set,
            None => ListShape::Atomic,
        }
    }
}

/// Whether `path` ends at one of the keys of the list element it is in.
fn is_key_field(path: &Path) -> bool {
    match path.as_slice() {
        [.., Step::Key(_, id), Step::Field(field)] => serde_json::from_str::<Value>(id)
            .ok()
            .is_some_and(|id| id.get(field).is_some()),
        _ => false,
    }
}

/// Whether list element `element` is the one `id` (a JSON object of its keys) names.
fn is_element(element: &Value, id: &Value) -> bool {
    id.as_object()
        .is_some_and(|keys| !keys.is_empty() && keys.iter().all(|(k, v)| element.get(k) == Some(v)))
}

/// A field path.
pub type Path = Vec<Step>;

/// A set of owned leaf fields.
pub type FieldSet = BTreeSet<Path>;

/// Top-level metadata fields that are tracked; the rest are the server's.
const TRACKED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// The fields set in `object`, as server-side apply tracks them. `status` is tracked only for
/// the status subresource; for the main resource it is left out, and vice versa.
pub fn fields_of(object: &Value, status_only: bool, shape: Shape<'_>) -> FieldSet {
    let mut set = FieldSet::new();
    if let Value::Object(map) = object {
        for (key, value) in map {
            match key.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    if let Value::Object(meta) = value {
                        for field in TRACKED_METADATA {
                            if let Some(v) = meta.get(*field) {
                                walk(
                                    v,
                                    vec![
                                        Step::Field("metadata".into()),
                                        Step::Field((*field).into()),
                                    ],
                                    &mut set,
                                    Shape::BUILTIN,
                                );
                            }
                        }
                    }
                }
                "status" if !status_only => {}
                _ if status_only && key != "status" => {}
                _ => walk(
                    value,
                    vec![Step::Field(key.clone())],
                    &mut set,
                    shape.field(key, true),
                ),
            }
        }
    }
    set
}

fn field_name(path: &Path) -> &str {
    match path.last() {
        Some(Step::Field(f)) => f,
        _ => "",
    }
}

/// The id of a list element: a JSON object of its keys' values.
fn key_string(element: &Value, keys: &[String]) -> Option<String> {
    let mut id = Map::new();
    for key in keys {
        id.insert(key.clone(), element.get(key)?.clone());
    }
    Some(Value::Object(id).to_string())
}

fn walk(value: &Value, path: Path, set: &mut FieldSet, shape: Shape<'_>) {
    match value {
        Value::Object(map) if !map.is_empty() && field_name(&path) != "ownerReferences" => {
            for (k, v) in map {
                let mut child = path.clone();
                child.push(Step::Field(k.clone()));
                walk(v, child, set, shape.field(k, false));
            }
        }
        Value::Array(items) => {
            let field = field_name(&path).to_owned();
            match shape.list(&field, items.first()) {
                ListShape::Keys(keys)
                    if !keys.is_empty()
                        && items
                            .iter()
                            .all(|e| keys.iter().all(|k| e.get(k).is_some())) =>
                {
                    for element in items {
                        let mut child = path.clone();
                        child.push(Step::Key(
                            keys[0].clone(),
                            key_string(element, &keys).unwrap_or_default(),
                        ));
                        match element {
                            Value::Object(m) if m.len() > keys.len() => {
                                for (k, v) in m {
                                    let mut grandchild = child.clone();
                                    grandchild.push(Step::Field(k.clone()));
                                    walk(v, grandchild, set, shape.items().field(k, false));
                                }
                            }
                            _ => {
                                set.insert(child);
                            }
                        }
                    }
                }
                ListShape::Set if !items.is_empty() => {
                    for element in items {
                        let mut child = path.clone();
                        child.push(Step::Value(element.to_string()));
                        set.insert(child);
                    }
                }
                _ => {
                    set.insert(path);
                }
            }
        }
        _ => {
            set.insert(path);
        }
    }
}

/// The value at `path`, if present.
pub fn get<'a>(object: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut node = object;
    for step in path {
        node = match step {
            Step::Field(f) => node.get(f)?,
            Step::Key(_, id) => {
                let wanted: Value = serde_json::from_str(id).ok()?;
                node.as_array()?.iter().find(|e| is_element(e, &wanted))?
            }
            Step::Value(value) => {
                let wanted: Value = serde_json::from_str(value).ok()?;
                node.as_array()?.iter().find(|e| **e == wanted)?
            }
        };
    }
    Some(node)
}

/// Removes the value at `path` (a map key or a list element); empty parents stay.
pub fn remove(object: &mut Value, path: &Path) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for step in parent_path {
        node = match step {
            Step::Field(f) => match node.get_mut(f) {
                Some(n) => n,
                None => return,
            },
            Step::Key(_, id) => {
                let Ok(wanted) = serde_json::from_str::<Value>(id) else {
                    return;
                };
                match node
                    .as_array_mut()
                    .and_then(|a| a.iter_mut().find(|e| is_element(e, &wanted)))
                {
                    Some(n) => n,
                    None => return,
                }
            }
            // A set's element holds nothing further.
            Step::Value(_) => return,
        };
    }
    match last {
        Step::Field(f) => {
            if let Value::Object(map) = node {
                map.remove(f);
            }
        }
        Step::Key(_, id) => {
            if let (Value::Array(items), Ok(wanted)) = (node, serde_json::from_str::<Value>(id)) {
                items.retain(|e| !is_element(e, &wanted));
            }
        }
        Step::Value(value) => {
            if let (Value::Array(items), Ok(wanted)) = (node, serde_json::from_str::<Value>(value))
            {
                items.retain(|e| *e != wanted);
            }
        }
    }
}

/// Merges an applied configuration into the live object: maps recursively, keyed lists by
/// key, sets by value, everything else replaced.
fn merge_applied(live: &mut Value, applied: &Value, field: &str, shape: Shape<'_>, top: bool) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, v) in a {
                match l.get_mut(k) {
                    Some(existing) if (k != "ownerReferences") => {
                        merge_applied(existing, v, k, shape.field(k, top), false)
                    }
                    _ => {
                        l.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) => match shape.list(field, a.first()) {
            ListShape::Keys(keys)
                if !keys.is_empty()
                    && a.iter()
                        .chain(l.iter())
                        .all(|e| keys.iter().all(|k| e.get(k).is_some())) =>
            {
                for element in a {
                    let id: Value = key_string(element, &keys)
                        .and_then(|id| serde_json::from_str(&id).ok())
                        .unwrap_or_default();
                    match l.iter_mut().find(|e| is_element(e, &id)) {
                        Some(existing) => {
                            merge_applied(existing, element, "", shape.items(), false)
                        }
                        None => l.push(element.clone()),
                    }
                }
            }
            ListShape::Set => {
                for element in a {
                    if !l.contains(element) {
                        l.push(element.clone());
                    }
                }
            }
            _ => *l = a.clone(),
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// Renders a field set in the `FieldsV1` format (`{"f:spec":{"f:image":{}}}`).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for step in path {
            let (name, is_element) = match step {
                Step::Field(f) => (format!("f:{f}"), false),
                Step::Key(_, id) => (format!("k:{id}"), true),
                Step::Value(value) => (format!("v:{value}"), false),
            };
            let entry = node
                .entry(name)
                .or_insert_with(|| Value::Object(Map::new()));
            if is_element && let Value::Object(m) = entry {
                m.entry(".").or_insert_with(|| Value::Object(Map::new()));
            }
            node = match entry {
                Value::Object(m) => m,
                _ => unreachable!("entries are created as objects"),
            };
        }
    }
    Value::Object(root)
}

/// Reads a `FieldsV1` tree back into a set of leaf paths.
pub fn from_fields_v1(tree: &Value) -> FieldSet {
    fn go(node: &Value, path: Path, set: &mut FieldSet) {
        let Some(map) = node.as_object() else { return };
        let children: Vec<(&String, &Value)> =
            map.iter().filter(|(k, _)| k.as_str() != ".").collect();
        if children.is_empty() {
            if !path.is_empty() {
                set.insert(path);
            }
            return;
        }
        for (k, v) in children {
            let step = if let Some(f) = k.strip_prefix("f:") {
                Step::Field(f.to_owned())
            } else if let Some(id) = k.strip_prefix("k:") {
                let key = serde_json::from_str::<Map<String, Value>>(id)
                    .ok()
                    .and_then(|m| m.keys().next().cloned())
                    .unwrap_or_default();
                Step::Key(key, id.to_owned())
            } else if let Some(value) = k.strip_prefix("v:") {
                Step::Value(value.to_owned())
            } else {
                continue;
            };
            let mut child = path.clone();
            child.push(step);
            go(v, child, set);
        }
    }
    let mut set = FieldSet::new();
    go(tree, vec![], &mut set);
    set
}

/// Renders a path as the API server does in conflict messages: `.spec.containers[name="app"].image`.
pub fn display(path: &Path) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Step::Key(key, id) => {
                let value: Value = serde_json::from_str(id).unwrap_or_default();
                out.push_str(&format!("[{key}={}]", value[key.as_str()]));
            }
            Step::Value(value) => out.push_str(&format!("[{value}]")),
        }
    }
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub subresource: String,
    pub time: String,
    pub fields: FieldSet,
}

/// Reads `metadata.managedFields`.
pub fn entries(object: &Value) -> Vec<Entry> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or_default().to_owned(),
                    operation: e["operation"].as_str().unwrap_or_default().to_owned(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
                    subresource: e["subresource"].as_str().unwrap_or_default().to_owned(),
                    time: e["time"].as_str().unwrap_or_default().to_owned(),
                    fields: from_fields_v1(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `metadata.managedFields`, dropping entries that own nothing.
pub fn set_entries(object: &mut Value, list: &[Entry]) {
    let rendered: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if rendered.is_empty() {
        if let Some(meta) = object["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
    } else {
        object["metadata"]["managedFields"] = Value::Array(rendered);
    }
}

/// Who is writing.
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub subresource: &'a str,
    pub now: &'a str,
    /// The shape of the written type's objects (how its lists merge).
    pub shape: Shape<'a>,
}

/// Records an Update-operation write: the writer owns the fields it changed; other managers
/// lose them; removed fields are forgotten.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer<'_>) {
    let status_only = writer.subresource == "status";
    let shape = writer.shape;
    let old_fields = old
        .map(|o| fields_of(o, status_only, shape))
        .unwrap_or_default();
    let new_fields = fields_of(new, status_only, shape);
    let changed: FieldSet = new_fields
        .iter()
        .filter(|p| old.and_then(|o| get(o, p)) != get(new, p) || !old_fields.contains(*p))
        .cloned()
        .collect();
    let mut list = old.map(entries).unwrap_or_default();
    let all_new = fields_of(new, false, shape)
        .union(&fields_of(new, true, shape))
        .cloned()
        .collect::<FieldSet>();
    for entry in &mut list {
        entry
            .fields
            .retain(|p| all_new.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        upsert(&mut list, writer, "Update", changed, false);
    }
    set_entries(new, &list);
}

fn upsert(
    list: &mut Vec<Entry>,
    writer: &Writer<'_>,
    operation: &str,
    fields: FieldSet,
    replace: bool,
) {
    match list.iter_mut().find(|e| {
        e.manager == writer.manager
            && e.operation == operation
            && e.subresource == writer.subresource
    }) {
        Some(entry) => {
            if replace {
                entry.fields = fields;
            } else {
                entry.fields.extend(fields);
            }
            entry.time = writer.now.to_owned();
            entry.api_version = writer.api_version.to_owned();
        }
        None => list.push(Entry {
            manager: writer.manager.to_owned(),
            operation: operation.to_owned(),
            api_version: writer.api_version.to_owned(),
            subresource: writer.subresource.to_owned(),
            time: writer.now.to_owned(),
            fields,
        }),
    }
}

/// Server-side apply of `applied` onto `live` (an empty object when creating). Returns the
/// new object with managed fields, or a 409 listing the conflicts.
pub fn apply(
    live: &Value,
    applied: &Value,
    writer: &Writer<'_>,
    force: bool,
    resource: &str,
    group: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let status_only = writer.subresource == "status";
    let applied_fields = fields_of(applied, status_only, writer.shape);
    let mut list = entries(live);

    let mut conflicts: BTreeMap<Path, Vec<String>> = BTreeMap::new();
    for entry in &list {
        let same_manager = entry.manager == writer.manager
            && entry.operation == "Apply"
            && entry.subresource == writer.subresource;
        if same_manager {
            continue;
        }
        for path in applied_fields.intersection(&entry.fields) {
            if get(live, path) != get(applied, path) {
                let who = if entry.operation == "Update" {
                    format!("\"{}\" using {}", entry.manager, entry.api_version)
                } else {
                    format!("\"{}\"", entry.manager)
                };
                conflicts.entry(path.clone()).or_default().push(who);
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let causes: Vec<Cause> = conflicts
            .iter()
            .flat_map(|(path, whos)| {
                whos.iter().map(move |who| Cause {
                    reason: "FieldManagerConflict".to_owned(),
                    message: format!("conflict with {who}"),
                    field: display(path),
                })
            })
            .collect();
        let count = causes.len();
        let lines: Vec<String> = causes
            .iter()
            .map(|c| format!("- {}: {}", c.message, c.field))
            .collect();
        let summary = if count == 1 {
            format!(
                "Apply failed with 1 conflict: {}: {}",
                causes[0].message, causes[0].field
            )
        } else {
            format!("Apply failed with {count} conflicts: {}", lines.join("\n"))
        };
        return Err(ApiError::Conflict {
            message: summary,
            kind: resource.to_owned(),
            name: name.to_owned(),
            group: group.to_owned(),
            causes,
        });
    }

    let previously_applied = list
        .iter()
        .find(|e| {
            e.manager == writer.manager
                && e.operation == "Apply"
                && e.subresource == writer.subresource
        })
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    // With force, the applier takes the conflicting fields.
    for entry in &mut list {
        entry.fields.retain(|p| {
            !(applied_fields.contains(p) && get(live, p) != get(applied, p))
                || (entry.manager == writer.manager && entry.operation == "Apply")
        });
    }
    let mut result = live.clone();
    // A list element is found by its keys: those go after its other fields.
    let mut stopped: Vec<&Path> = previously_applied.difference(&applied_fields).collect();
    stopped.sort_by_key(|path| (is_key_field(path), path.len()));
    for path in stopped {
        let owned_elsewhere = list.iter().any(|e| {
            !(e.manager == writer.manager && e.operation == "Apply") && e.fields.contains(path)
        });
        if !owned_elsewhere {
            if is_key_field(path) {
                // A key goes with its element, once nothing but keys is left of it.
                let element: Path = path[..path.len() - 1].to_vec();
                let only_keys = match (element.last(), get(&result, &element)) {
                    (Some(Step::Key(_, id)), Some(Value::Object(fields))) => {
                        serde_json::from_str::<Value>(id)
                            .is_ok_and(|id| fields.keys().all(|k| id.get(k).is_some()))
                    }
                    _ => false,
                };
                if !only_keys || get(applied, &element).is_some() {
                    continue;
                }
                remove(&mut result, &element);
            } else {
                remove(&mut result, path);
            }
            // A map or list the manager no longer applies at all goes with its last field.
            for depth in (1..path.len()).rev() {
                let parent: Path = path[..depth].to_vec();
                let emptied = get(&result, &parent).is_some_and(|v| {
                    v.as_object().is_some_and(|m| m.is_empty())
                        || v.as_array().is_some_and(|a| a.is_empty())
                });
                if emptied && get(applied, &parent).is_none() {
                    remove(&mut result, &parent);
                } else {
                    break;
                }
            }
        }
    }
    let mut applied_body = applied.clone();
    if let Some(map) = applied_body.as_object_mut() {
        if !status_only {
            map.remove("status");
        }
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.retain(|k, _| TRACKED_METADATA.contains(&k.as_str()));
        }
    }
    merge_applied(&mut result, &applied_body, "", writer.shape, true);
    upsert(&mut list, writer, "Apply", applied_fields, true);
    set_entries(&mut result, &list);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(manager: &'static str) -> Writer<'static> {
        Writer {
            manager,
            api_version: "v1",
            subresource: "",
            now: "2026-01-01T00:00:00Z",
            shape: Shape::BUILTIN,
        }
    }

    #[test]
    fn fields_v1_round_trips() {
        let obj = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "app", "image": "x"}], "replicas": 2}});
        let set = fields_of(&obj, false, Shape::BUILTIN);
        let tree = to_fields_v1(&set);
        assert_eq!(
            tree,
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}, "f:replicas": {}}
            })
        );
        assert_eq!(from_fields_v1(&tree), set);
    }

    #[test]
    fn a_second_manager_conflicts_unless_forced() {
        let first = apply(
            &json!({"metadata": {"name": "x"}}),
            &json!({"spec": {"replicas": 1, "image": "a"}}),
            &writer("alpha"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        let err = apply(
            &first,
            &json!({"spec": {"replicas": 2}}),
            &writer("beta"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"alpha\": .spec.replicas"
        );
        // Same value: shared ownership, no conflict.
        apply(
            &first,
            &json!({"spec": {"replicas": 1}}),
            &writer("beta"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        let forced = apply(
            &first,
            &json!({"spec": {"replicas": 2}}),
            &writer("beta"),
            true,
            "things",
            "",
            "x",
        )
        .unwrap();
        assert_eq!(forced["spec"]["replicas"], 2);
        let owners = entries(&forced);
        let alpha = owners.iter().find(|e| e.manager == "alpha").unwrap();
        assert!(!alpha.fields.iter().any(|p| display(p) == ".spec.replicas"));
    }

    #[test]
    fn a_map_no_longer_applied_goes_entirely() {
        let first = apply(
            &json!({"metadata": {"name": "x"}}),
            &json!({"status": {"pod": {"name": "p", "uid": "u"}, "phase": "Running"}}),
            &Writer {
                subresource: "status",
                ..writer("op")
            },
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        let second = apply(
            &first,
            &json!({"status": {"phase": "Stopped"}}),
            &Writer {
                subresource: "status",
                ..writer("op")
            },
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        assert_eq!(second["status"], json!({"phase": "Stopped"}));
    }

    #[test]
    fn fields_a_manager_stops_applying_are_removed() {
        let first = apply(
            &json!({"metadata": {"name": "x"}}),
            &json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            &writer("alpha"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        let second = apply(
            &first,
            &json!({"metadata": {"labels": {"a": "1"}}}),
            &writer("alpha"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        assert_eq!(second["metadata"]["labels"], json!({"a": "1"}));
    }

    #[test]
    fn updates_take_ownership_from_appliers() {
        let applied = apply(
            &json!({"metadata": {"name": "x"}}),
            &json!({"spec": {"replicas": 1}}),
            &writer("alpha"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap();
        let mut updated = applied.clone();
        updated["spec"]["replicas"] = json!(5);
        record_update(Some(&applied), &mut updated, &writer("kubectl-edit"));
        let err = apply(
            &updated,
            &json!({"spec": {"replicas": 1}}),
            &writer("alpha"),
            false,
            "things",
            "",
            "x",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1: .spec.replicas"
        );
    }
}
