//! Structural-schema handling of custom resources, as the API server does it: pruning of
//! unknown fields, defaulting, OpenAPI v3 validation, and CEL `x-kubernetes-validations`
//! evaluated with `kube-cel`.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use serde_json::{Map, Value};

use crate::error::Cause;

/// The schema of one served version of a CRD, with its CEL rules compiled once.
pub struct CrdSchema {
    pub root: Value,
    /// Where the rules are, compiled (`None`: no rule).
    compiled: Option<Arc<Rules>>,
    /// Rules rewritten for the optional types (`cel_optional`), each with the rule as written.
    rewritten: Vec<(String, String)>,
    /// The schema as evaluated (rules rewritten), from which the ratcheted forms are compiled.
    evaluated: Value,
    /// The fields under which validation ratcheting may skip a rule.
    ratchetable: Ratchetable,
    /// Compiled without the rules that do not read `oldSelf` under the named fields, for an
    /// update that leaves those fields as they were (each form compiled once, when first
    /// needed; at most `RATCHETED_FORMS`).
    ratcheted: Mutex<HashMap<Unchanged, Option<Arc<Rules>>>>,
}

impl std::fmt::Debug for CrdSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrdSchema").finish_non_exhaustive()
    }
}

impl CrdSchema {
    pub fn new(root: Value) -> Self {
        let mut evaluated = root.clone();
        let rewritten = crate::cel_optional::rewrite_schema(&mut evaluated);
        let compiled = Rules::of(&evaluated).map(Arc::new);
        CrdSchema {
            root,
            compiled,
            rewritten,
            ratchetable: Ratchetable::of(&evaluated, true),
            evaluated,
            ratcheted: Mutex::default(),
        }
    }

    /// The compiled rules to evaluate on `object` (`None`: none to run): on an update, without
    /// the rules that do not read `oldSelf` under each field the update left as it was.
    /// Validation ratcheting (API servers since 1.30, KEP-4008) ignores such a rule's errors on
    /// an unchanged value, so it need not run; transition rules always run. Fields are followed
    /// through objects' declared properties; a list or a map is one value (changed anywhere,
    /// all its rules run).
    fn rules_for(&self, object: &Value, old: Option<&Value>) -> Option<Arc<Rules>> {
        let Some(old) = old else {
            return self.compiled.clone();
        };
        let mut unchanged = vec![];
        self.ratchetable
            .unchanged(object, old, &mut vec![], &mut unchanged);
        if unchanged.is_empty() {
            return self.compiled.clone();
        }
        let mut forms = self.ratcheted.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(form) = forms.get(&unchanged) {
            return form.clone();
        }
        // An object of many shapes: past the bound, every rule runs (stricter, never looser).
        if forms.len() >= RATCHETED_FORMS {
            return self.compiled.clone();
        }
        let mut schema = self.evaluated.clone();
        for path in &unchanged {
            let mut node = &mut schema;
            for key in path {
                node = &mut node["properties"][key.as_str()];
            }
            strip_ratcheted_rules(node);
        }
        let form = Rules::of(&schema).map(Arc::new);
        forms.insert(unchanged, form.clone());
        form
    }

    /// `text` with each rewritten rule in it named as it was written.
    fn as_written(&self, text: &str) -> String {
        self.rewritten
            .iter()
            .fold(text.to_owned(), |text, (new, old)| text.replace(new, old))
    }

    /// Removes fields the schema does not declare; returns their paths (for strict field
    /// validation and warnings).
    pub fn prune(&self, object: &mut Value) -> Vec<String> {
        prune_unknown(&self.root, object)
    }

    /// Sets schema defaults on absent fields.
    pub fn apply_defaults(&self, object: &mut Value) {
        default_value(&self.root, object);
    }

    /// Validates the object against the schema and its CEL rules; `old` enables transition
    /// rules on update.
    pub fn validate(&self, object: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut causes = vec![];
        if let Value::Object(map) = object
            && let Some(props) = self.root["properties"].as_object()
        {
            for (key, child_schema) in props {
                if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match map.get(key) {
                    Some(child) => validate_value(child_schema, child, key, &mut causes),
                    None if required(&self.root).contains(key) => causes.push(required_cause(key)),
                    None => {}
                }
            }
        }
        let type_errors = causes.iter().any(|c| c.reason == "FieldValueTypeInvalid");
        if type_errors && self.compiled.is_some() {
            causes.push(Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".to_owned(),
                field: "<nil>".to_owned(),
            });
        } else {
            // CEL runs unless a value has the wrong type, as in the API server.
            let mut errors = vec![];
            if let Some(rules) = self.rules_for(object, old) {
                rules.run(object, old, "", &mut errors);
            }
            for error in &errors {
                // The real validator names the schema's type at the field (`object`,
                // `string`; nothing for an int-or-string).
                let (field, schema) = key_path(&self.root, &error.field_path);
                let value_type = schema["type"].as_str().unwrap_or_default();
                let rule = self.as_written(&error.rule);
                let message = self.as_written(&error.message);
                let detail = match error.kind {
                    kube_cel::ErrorKind::EvaluationError => self.evaluation_error(&rule, &message),
                    _ => message,
                };
                // A rule's `reason` words the cause as the real validator does.
                let (reason, message) = match error.reason.as_deref() {
                    Some("FieldValueRequired") => {
                        ("FieldValueRequired", format!("Required value: {detail}"))
                    }
                    Some("FieldValueForbidden") => {
                        ("FieldValueForbidden", format!("Forbidden: {detail}"))
                    }
                    Some("FieldValueDuplicate") => (
                        "FieldValueDuplicate",
                        format!("Duplicate value: \"{value_type}\": {detail}"),
                    ),
                    _ => (
                        "FieldValueInvalid",
                        format!("Invalid value: \"{value_type}\": {detail}"),
                    ),
                };
                causes.push(Cause {
                    reason: reason.to_owned(),
                    message,
                    field,
                });
            }
        }
        causes
    }
}

impl CrdSchema {
    /// A rule that failed to evaluate refuses the request, in the words of the real API
    /// server's CEL validator (`schema/cel/validation.go`): the error, then the rule's message
    /// (or the rule, without one).
    fn evaluation_error(&self, rule: &str, message: &str) -> String {
        let error = message
            .strip_prefix("rule evaluation error: ")
            .unwrap_or(message);
        let said = rule_message(&self.root, rule).unwrap_or_else(|| rule.to_owned());
        if error.to_ascii_lowercase().starts_with("no such overload") {
            format!(
                "'{error}': call arguments did not match a supported operator, function or macro signature for rule: {said}"
            )
        } else {
            format!("{error} evaluating rule: {said}")
        }
    }
}

/// A field path as the real API server writes it: a map's key in brackets
/// (`spec.resources.requests[example.com/gpu]`), where kube-cel joins it with a dot. The
/// schema tells a map (`additionalProperties`) from an object's properties; the key of a map
/// of scalars is the rest of the path, dots and all.
fn key_path<'s>(root: &'s Value, path: &str) -> (String, &'s Value) {
    let mut node = root;
    let mut out = String::new();
    let mut rest = path;
    while !rest.is_empty() {
        let is_map = node["properties"].as_object().is_none_or(|p| p.is_empty())
            && node["additionalProperties"].is_object();
        if is_map {
            let value = &node["additionalProperties"];
            let scalar = value["properties"].is_null() && value["additionalProperties"].is_null();
            let (key, tail) = match (scalar, rest.split_once('.')) {
                (false, Some((key, tail))) => (key, tail),
                _ => (rest, ""),
            };
            out.push_str(&format!("[{key}]"));
            node = value;
            rest = tail;
            continue;
        }
        let (segment, tail) = rest.split_once('.').unwrap_or((rest, ""));
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(segment);
        let name = segment.split('[').next().unwrap_or(segment);
        node = &node["properties"][name];
        for _ in segment.matches('[') {
            node = &node["items"];
        }
        rest = tail;
    }
    (out, node)
}

/// The `message` of the rule `rule` anywhere in `schema`.
fn rule_message(schema: &Value, rule: &str) -> Option<String> {
    match schema {
        Value::Object(map) => {
            let here = map
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|r| r["rule"] == rule)
                .and_then(|r| r["message"].as_str())
                .filter(|m| !m.is_empty())
                .map(str::to_owned);
            here.or_else(|| map.values().find_map(|v| rule_message(v, rule)))
        }
        Value::Array(items) => items.iter().find_map(|v| rule_message(v, rule)),
        _ => None,
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

fn required(schema: &Value) -> Vec<String> {
    schema["required"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn required_cause(path: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".to_owned(),
        message: "Required value".to_owned(),
        field: path.to_owned(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Removes from `object` the fields `root` (an object's schema) does not declare, except in
/// `metadata` (served the same for every kind); returns their paths, e.g. `spec.bogus`.
pub fn prune_unknown(root: &Value, object: &mut Value) -> Vec<String> {
    let mut unknown = vec![];
    if let Value::Object(map) = object {
        let props = root["properties"].as_object();
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match props.and_then(|p| p.get(&key)) {
                Some(child_schema) => {
                    if let Some(child) = map.get_mut(&key) {
                        prune_value(child_schema, child, &key, &mut unknown);
                    }
                }
                None if preserves_unknown(root) => {}
                None => {
                    map.remove(&key);
                    unknown.push(key);
                }
            }
        }
    }
    unknown
}

fn prune_value(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                let keys: Vec<String> = map.keys().cloned().collect();
                for key in keys {
                    match props.get(&key) {
                        Some(child_schema) => {
                            if let Some(child) = map.get_mut(&key) {
                                prune_value(child_schema, child, &join(path, &key), unknown);
                            }
                        }
                        None if preserves_unknown(schema) => {}
                        None => {
                            map.remove(&key);
                            unknown.push(join(path, &key));
                        }
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (key, child) in map.iter_mut() {
                    prune_value(additional, child, &join(path, key), unknown);
                }
            } else if !preserves_unknown(schema) && schema["type"] == "object" {
                let keys: Vec<String> = map.keys().cloned().collect();
                if schema.get("additionalProperties") != Some(&Value::Bool(true)) {
                    for key in keys {
                        map.remove(&key);
                        unknown.push(join(path, &key));
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_value(item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn default_value(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (key, child_schema) in props {
                    if !map.contains_key(key)
                        && let Some(default) = child_schema.get("default")
                    {
                        map.insert(key.clone(), default.clone());
                    }
                    if let Some(child) = map.get_mut(key) {
                        default_value(child_schema, child);
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for child in map.values_mut() {
                    default_value(additional, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    default_value(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// The JSON type name the API server prints in messages (`"string"`, `"object"`, ...).
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn quote(value: &Value) -> String {
    match value {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// Whether `s` matches `pattern`; compiled patterns are cached because every write of a custom
/// resource checks the same few. An invalid pattern matches nothing.
/// Whether a string has its schema's `format`, for the formats whose checks the real server
/// applies to CRDs (`date-time` and `date` as go-openapi's strfmt parses them); others pass.
fn format_matches(format: &str, value: &str) -> bool {
    match format {
        "date-time" => {
            value.parse::<jiff::Timestamp>().is_ok()
                || value
                    .parse::<jiff::civil::DateTime>()
                    .is_ok_and(|_| value.contains('T'))
        }
        "date" => value.len() == 10 && value.parse::<jiff::civil::Date>().is_ok(),
        _ => true,
    }
}

fn pattern_matches(pattern: &str, s: &str) -> bool {
    static CACHE: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<String, Option<regex::Regex>>>,
    > = std::sync::LazyLock::new(Default::default);
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let re = cache
        .entry(pattern.to_owned())
        .or_insert_with(|| regex::Regex::new(pattern).ok());
    re.as_ref().is_some_and(|re| re.is_match(s))
}

fn number(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key).and_then(Value::as_f64)
}

fn fmt_number(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

fn type_invalid(path: &str, actual: &str, message: String) -> Cause {
    Cause {
        reason: "FieldValueTypeInvalid".to_owned(),
        message: format!("Invalid value: \"{actual}\": {message}"),
        field: path.to_owned(),
    }
}

fn invalid(path: &str, value: &Value, message: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: {}: {message}", quote(value)),
        field: path.to_owned(),
    }
}

fn validate_value(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    if value.is_null() {
        if schema["nullable"].as_bool() == Some(true) || schema.get("type").is_none() {
            return;
        }
        let expected = schema["type"].as_str().unwrap_or("object");
        causes.push(type_invalid(
            path,
            "null",
            format!("{path} in body must be of type {expected}: \"null\""),
        ));
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            causes.push(type_invalid(
                path,
                json_type(value),
                format!(
                    "{path} in body must be of type int-or-string: \"{}\"",
                    json_type(value)
                ),
            ));
            return;
        }
    } else if let Some(expected) = schema["type"].as_str() {
        let actual = json_type(value);
        let ok = actual == expected || (expected == "number" && actual == "integer");
        if !ok {
            causes.push(type_invalid(
                path,
                actual,
                format!("{path} in body must be of type {expected}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        let supported: Vec<String> = options.iter().map(quote).collect();
        causes.push(Cause {
            reason: "FieldValueNotSupported".to_owned(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                quote(value),
                supported.join(", ")
            ),
            field: path.to_owned(),
        });
    }
    match value {
        Value::String(s) => {
            let length = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64()
                && length < min
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(max) = schema["maxLength"].as_u64()
                && length > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooLong".to_owned(),
                    message: format!("Too long: may not be more than {max} bytes"),
                    field: path.to_owned(),
                });
            }
            if let Some(format) = schema["format"].as_str()
                && !format_matches(format, s)
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body must be of type {format}: \"{s}\""),
                ));
            }
            if let Some(pattern) = schema["pattern"].as_str()
                && !pattern_matches(pattern, s)
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should match '{pattern}'"),
                ));
            }
        }
        Value::Number(n) => {
            let v = n.as_f64().unwrap_or_default();
            let exclusive_min = schema["exclusiveMinimum"].as_bool() == Some(true);
            let exclusive_max = schema["exclusiveMaximum"].as_bool() == Some(true);
            if let Some(min) = number(schema, "minimum")
                && ((exclusive_min && v <= min) || (!exclusive_min && v < min))
            {
                let relation = if exclusive_min {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be {relation} {}", fmt_number(min)),
                ));
            }
            if let Some(max) = number(schema, "maximum")
                && ((exclusive_max && v >= max) || (!exclusive_max && v > max))
            {
                let relation = if exclusive_max {
                    "less than"
                } else {
                    "less than or equal to"
                };
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be {relation} {}", fmt_number(max)),
                ));
            }
        }
        Value::Array(items) => {
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooMany".to_owned(),
                    message: format!("Too many: {}: must have at most {max} items", items.len()),
                    field: path.to_owned(),
                });
            }
            if let Some(min) = schema["minItems"].as_u64()
                && (items.len() as u64) < min
            {
                causes.push(invalid(
                    path,
                    &Value::String("array".into()),
                    format!("{path} in body should have at least {min} items"),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_value(item_schema, item, &format!("{path}[{i}]"), causes);
                }
            }
            if schema["x-kubernetes-list-type"] == "set" {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        causes.push(Cause {
                            reason: "FieldValueDuplicate".to_owned(),
                            message: format!("Duplicate value: {}", quote(item)),
                            field: format!("{path}[{i}]"),
                        });
                    }
                }
            }
            if schema["x-kubernetes-list-type"] == "map" {
                let keys: Vec<String> = schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .map(|k| {
                        k.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let key_of = |item: &Value| -> BTreeMap<String, Value> {
                    keys.iter()
                        .map(|k| (k.clone(), item[k.as_str()].clone()))
                        .collect()
                };
                for (i, item) in items.iter().enumerate() {
                    if items[..i]
                        .iter()
                        .any(|earlier| key_of(earlier) == key_of(item))
                    {
                        let shown: Map<String, Value> = key_of(item).into_iter().collect();
                        causes.push(Cause {
                            reason: "FieldValueDuplicate".to_owned(),
                            message: format!("Duplicate value: {}", Value::Object(shown)),
                            field: format!("{path}[{i}]"),
                        });
                    }
                }
            }
        }
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (key, child_schema) in props {
                    match map.get(key) {
                        Some(child) => {
                            validate_value(child_schema, child, &join(path, key), causes)
                        }
                        None if required(schema).contains(key) => {
                            causes.push(required_cause(&join(path, key)))
                        }
                        None => {}
                    }
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (key, child) in map {
                    validate_value(additional, child, &format!("{path}[{key}]"), causes);
                }
            }
            if let Some(max) = schema["maxProperties"].as_u64()
                && map.len() as u64 > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooMany".to_owned(),
                    message: format!("Too many: {}: must have at most {max} items", map.len()),
                    field: path.to_owned(),
                });
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

/// The paths of the fields an update left as they were.
type Unchanged = Vec<Vec<String>>;

/// How many ratcheted forms of a schema are kept (each is the whole schema's rules compiled).
const RATCHETED_FORMS: usize = 64;

/// The declared properties of an object's schema under which some rule does not read
/// `oldSelf` (apiVersion, kind and metadata aside at the root), each with its own.
#[derive(Default)]
struct Ratchetable {
    properties: BTreeMap<String, Ratchetable>,
}

impl Ratchetable {
    fn of(schema: &Value, root: bool) -> Ratchetable {
        let properties = schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(key, _)| {
                !(root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata"))
            })
            .filter(|(_, child)| has_ratcheted_rules(child))
            .map(|(key, child)| (key.clone(), Ratchetable::of(child, false)))
            .collect();
        Ratchetable { properties }
    }

    /// Adds to `found` the paths of those fields that are the same in `object` and `old`; a
    /// changed object is followed into its properties (a list or a map is one value).
    fn unchanged(
        &self,
        object: &Value,
        old: &Value,
        path: &mut Vec<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        for (key, child) in &self.properties {
            let (Some(now), Some(before)) = (object.get(key.as_str()), old.get(key.as_str()))
            else {
                continue;
            };
            path.push(key.clone());
            if now == before {
                found.push(path.clone());
            } else if now.is_object() {
                child.unchanged(now, before, path, found);
            }
            path.pop();
        }
    }
}

/// Where a schema's rules are. `kube-cel` converts the value at every schema it walks, whole,
/// rules or not: so it is started at the schemas that have rules (or reach them through
/// items, map values or branches), and given only the schemas a rule is in, under or above;
/// the schemas on the way there are followed here, converting nothing. The rules run as on
/// the whole schema, with the same paths.
enum Rules {
    /// `kube-cel` runs these on this schema's value.
    Here(Box<kube_cel::CompiledSchema>),
    /// No rule at this schema; some under these declared properties (each with its default).
    Under(Vec<(String, Option<Value>, Rules)>),
}

impl Rules {
    /// `schema`'s rules, `None` when it has none.
    fn of(schema: &Value) -> Option<Rules> {
        let ruled = |key: &str| schema.get(key).is_some_and(has_rules);
        if schema.get("x-kubernetes-validations").is_some()
            || branch_rules(schema)
            || ruled("items")
            || ruled("additionalProperties")
        {
            let mut kept = schema.clone();
            keep_ruled(&mut kept);
            return Some(Rules::Here(Box::new(kube_cel::compile_schema(&kept))));
        }
        let under: Vec<_> = schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, child)| {
                Rules::of(child).map(|rules| (key.clone(), child.get("default").cloned(), rules))
            })
            .collect();
        (!under.is_empty()).then_some(Rules::Under(under))
    }

    /// Runs the rules on `value` (at `path`; `old`: its value before an update), adding the
    /// rules' errors to `errors`. A field absent takes its default, as `kube-cel` would give it.
    fn run(
        &self,
        value: &Value,
        old: Option<&Value>,
        path: &str,
        errors: &mut Vec<kube_cel::ValidationError>,
    ) {
        match self {
            Rules::Here(compiled) => {
                let Err(found) = kube_cel::validate_compiled(compiled, value, old) else {
                    return;
                };
                errors.extend(found.into_vec().into_iter().map(|mut error| {
                    error.field_path = match error.field_path.chars().next() {
                        None => path.to_owned(),
                        Some(_) if path.is_empty() => error.field_path,
                        Some('[' | '.') => format!("{path}{}", error.field_path),
                        Some(_) => format!("{path}.{}", error.field_path),
                    };
                    error
                }));
            }
            Rules::Under(children) => {
                let Some(object) = value.as_object() else {
                    return;
                };
                for (key, default, rules) in children {
                    let Some(child) = object.get(key).or(default.as_ref()) else {
                        continue;
                    };
                    let before = old
                        .and_then(Value::as_object)
                        .and_then(|o| o.get(key).or(default.as_ref()));
                    let at = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    rules.run(child, before, &at, errors);
                }
            }
        }
    }
}

/// Removes from `schema` the schemas with no rule in, under or above them; returns whether a
/// rule is left.
fn keep_ruled(schema: &mut Value) -> bool {
    if schema.get("x-kubernetes-validations").is_some() || branch_rules(schema) {
        return true;
    }
    let Value::Object(map) = schema else {
        return false;
    };
    let mut kept = false;
    if let Some(Value::Object(children)) = map.get_mut("properties") {
        children.retain(|_, child| keep_ruled(child));
        kept |= !children.is_empty();
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child @ Value::Object(_)) = map.get_mut(key) {
            if keep_ruled(child) {
                kept = true;
            } else {
                map.remove(key);
            }
        }
    }
    kept
}

/// Whether `schema` or a schema under it (its properties, items, map values or branches) has
/// a rule.
fn has_rules(schema: &Value) -> bool {
    schema.get("x-kubernetes-validations").is_some()
        || branch_rules(schema)
        || schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|children| children.values().any(has_rules))
        || ["items", "additionalProperties"]
            .iter()
            .any(|key| schema.get(*key).is_some_and(has_rules))
}

/// Whether a branch of `schema` (allOf, oneOf, anyOf) has a rule in or under it; a branch is
/// kept whole where it has.
fn branch_rules(schema: &Value) -> bool {
    ["allOf", "oneOf", "anyOf"].iter().any(|key| {
        schema
            .get(*key)
            .and_then(Value::as_array)
            .is_some_and(|branches| branches.iter().any(has_rules))
    })
}

/// Whether `schema` or a schema under it has a rule that does not read `oldSelf`.
fn has_ratcheted_rules(schema: &Value) -> bool {
    strip_ratcheted_rules(&mut schema.clone()) > 0
}

/// Removes from `schema` and every schema under it the rules that do not read `oldSelf` (the
/// ones validation ratcheting skips on an unchanged value); returns how many.
fn strip_ratcheted_rules(schema: &mut Value) -> usize {
    let Value::Object(map) = schema else {
        return 0;
    };
    let mut removed = 0;
    if let Some(Value::Array(rules)) = map.get_mut("x-kubernetes-validations") {
        let before = rules.len();
        rules.retain(|r| {
            r["rule"]
                .as_str()
                .is_some_and(|rule| rule.contains("oldSelf"))
        });
        removed += before - rules.len();
        if rules.is_empty() {
            map.remove("x-kubernetes-validations");
        }
    }
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            for child in children.values_mut() {
                removed += strip_ratcheted_rules(child);
            }
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = map.get_mut(key) {
            removed += strip_ratcheted_rules(child);
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(branches)) = map.get_mut(key) {
            for branch in branches {
                removed += strip_ratcheted_rules(branch);
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> CrdSchema {
        CrdSchema::new(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "minLength": 1},
                        "mode": {"type": "integer", "minimum": 0, "maximum": 511},
                        "color": {"type": "string", "enum": ["red", "blue"]},
                        "paused": {"type": "boolean", "default": false},
                        "size": {"x-kubernetes-int-or-string": true},
                        "ports": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}}}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "path": {"type": "string", "x-kubernetes-validations": [{"rule": "self.startsWith('/')", "message": "must be absolute"}]}
                    }
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        }))
    }

    fn messages(object: Value) -> Vec<String> {
        let s = schema();
        let mut object = object;
        s.apply_defaults(&mut object);
        s.validate(&object, None)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn valid_object_passes() {
        assert!(
            messages(json!({"spec": {"image": "x", "mode": 420, "size": "1Gi", "path": "/a"}}))
                .is_empty()
        );
        assert!(messages(json!({"spec": {"image": "x", "size": 3}})).is_empty());
    }

    #[test]
    fn each_keyword_reports_like_the_api_server() {
        let rows: &[(Value, &str)] = &[
            (json!({"spec": {}}), "spec.image: Required value"),
            (
                json!({"spec": {"image": ""}}),
                "spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long",
            ),
            (
                json!({"spec": {"image": "x", "mode": 1000}}),
                "spec.mode: Invalid value: 1000: spec.mode in body should be less than or equal to 511",
            ),
            (
                json!({"spec": {"image": "x", "mode": -1}}),
                "spec.mode: Invalid value: -1: spec.mode in body should be greater than or equal to 0",
            ),
            (
                json!({"spec": {"image": "x", "mode": "rw"}}),
                "spec.mode: Invalid value: \"string\": spec.mode in body must be of type integer: \"string\"",
            ),
            (
                json!({"spec": {"image": "x", "color": "green"}}),
                "spec.color: Unsupported value: \"green\": supported values: \"red\", \"blue\"",
            ),
            (
                json!({"spec": {"image": "x", "ports": [{}, {}, {}]}}),
                "spec.ports: Too many: 3: must have at most 2 items",
            ),
            (
                json!({"spec": {"image": "x", "ports": [{"name": "A"}]}}),
                "spec.ports[0].name: Invalid value: \"A\": spec.ports[0].name in body should match '^[a-z]+$'",
            ),
            (
                json!({"spec": {"image": "x", "size": true}}),
                "spec.size: Invalid value: \"boolean\": spec.size in body must be of type int-or-string: \"boolean\"",
            ),
            (
                json!({"spec": {"image": "x", "path": "rel"}}),
                "spec.path: Invalid value: \"string\": must be absolute",
            ),
            (
                json!({"spec": {"image": "x", "labels": {"a": 1}}}),
                "spec.labels[a]: Invalid value: \"integer\": spec.labels[a] in body must be of type string: \"integer\"",
            ),
        ];
        for (object, expected) in rows {
            let found: Vec<String> = messages(object.clone())
                .into_iter()
                .filter(|m| !m.starts_with("<nil>"))
                .collect();
            assert_eq!(found, vec![expected.to_string()], "{object}");
        }
    }

    #[test]
    fn a_rule_that_fails_to_evaluate_refuses_in_the_real_servers_words() {
        let s = CrdSchema::new(json!({
            "type": "object",
            "properties": {"spec": {
                "type": "object",
                "properties": {"size": {"x-kubernetes-int-or-string": true}},
                "x-kubernetes-validations": [
                    {"rule": "quantity(string(self.size)).sign() > 0", "message": "size must be positive"},
                    {"rule": "self.missing == 1"}
                ]
            }}
        }));
        let found: Vec<String> = s
            .validate(&json!({"spec": {"size": "abc"}}), None)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("spec: Invalid value: \"object\": ")
                && found[0].ends_with(" evaluating rule: size must be positive"),
            "{found:?}"
        );
        assert!(found[0].contains("quantit"), "{found:?}");
        assert!(
            found[1].ends_with(" evaluating rule: self.missing == 1"),
            "{found:?}"
        );
        assert!(
            found.iter().all(|m| !m.contains("rule evaluation error")),
            "{found:?}"
        );
    }

    #[test]
    fn a_map_key_is_written_in_brackets() {
        let root = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "resources": {"type": "object", "properties": {"requests": {"type": "object", "additionalProperties": {"x-kubernetes-int-or-string": true}}}},
            "ports": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
        }}}});
        let path = |p: &str| key_path(&root, p).0;
        assert_eq!(
            path("spec.resources.requests.example.com/gpu"),
            "spec.resources.requests[example.com/gpu]"
        );
        assert_eq!(
            path("spec.resources.requests.cpu"),
            "spec.resources.requests[cpu]"
        );
        assert_eq!(path("spec.ports[1].name"), "spec.ports[1].name");
        assert_eq!(path("spec.resources"), "spec.resources");
        assert_eq!(key_path(&root, "spec.ports[1].name").1["type"], "string");
    }

    #[test]
    fn a_type_error_stops_cel_and_says_so() {
        let found = messages(json!({"spec": {"image": "x", "mode": "rw", "path": "relative"}}));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[1].starts_with(
                "<nil>: Invalid value: \"null\": some validation rules were not checked"
            ),
            "{found:?}"
        );
        // A schema with no rule has none left unchecked (a description naming rules is none).
        let plain = CrdSchema::new(json!({"type": "object", "properties": {"spec": {
            "type": "object",
            "description": "no x-kubernetes-validations here",
            "properties": {"mode": {"type": "integer"}}
        }}}));
        let found = plain.validate(&json!({"spec": {"mode": "rw"}}), None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].reason, "FieldValueTypeInvalid");
    }

    #[test]
    fn pruning_drops_undeclared_fields_and_keeps_preserved_ones() {
        let s = schema();
        let mut object = json!({
            "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"image": "x", "bogus": 1, "free": {"anything": [1]}, "labels": {"k": "v"}},
            "extra": true
        });
        let mut unknown = s.prune(&mut object);
        unknown.sort();
        assert_eq!(unknown, vec!["extra".to_owned(), "spec.bogus".to_owned()]);
        assert_eq!(object["spec"]["free"]["anything"], json!([1]));
        assert_eq!(object["spec"]["labels"]["k"], "v");
        assert_eq!(object["metadata"]["name"], "a");
    }

    #[test]
    fn defaults_fill_absent_fields() {
        let s = schema();
        let mut object = json!({"spec": {"image": "x"}});
        s.apply_defaults(&mut object);
        assert_eq!(object["spec"]["paused"], json!(false));
    }

    #[test]
    fn a_write_that_leaves_every_rule_ratcheted_converts_nothing_for_cel() {
        // Only spec.path has a rule: a status write leaves it as it was, so no rule runs, and
        // nothing of the object is converted for CEL (it was, at every schema of it).
        let s = schema();
        let old = json!({"spec": {"image": "x", "path": "/a"}, "status": {"phase": "Pending"}});
        let new = json!({"spec": {"image": "x", "path": "/a"}, "status": {"phase": "Running"}});
        assert!(s.rules_for(&new, Some(&old)).is_none());
        assert!(s.validate(&new, Some(&old)).is_empty());
        // A change of the field runs its rule.
        let moved = json!({"spec": {"image": "x", "path": "rel"}, "status": {"phase": "Running"}});
        assert!(s.rules_for(&moved, Some(&old)).is_some());
        assert_eq!(s.validate(&moved, Some(&old)).len(), 1);
        // A schema without rules has nothing to compile.
        let plain =
            CrdSchema::new(json!({"type": "object", "properties": {"spec": {"type": "object"}}}));
        assert!(plain.rules_for(&json!({"spec": {}}), None).is_none());
    }

    #[test]
    fn rules_see_their_values_whole_when_the_schemas_without_rules_are_left_out() {
        // A rule reads a defaulted field, a map, a date-time and a list under it; another
        // sits under a map's values and a list's items: they find what they found on the
        // whole schema, and the schemas beside them (no rule) are not kept.
        let whole = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "limits": {
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "default": "strict"},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "since": {"type": "string", "format": "date-time"},
                        "names": {"type": "array", "items": {"type": "string"}}
                    },
                    "x-kubernetes-validations": [
                        {"rule": "self.mode == 'strict'", "message": "mode"},
                        {"rule": "!has(self.labels) || !('a.b/c' in self.labels) || self.labels['a.b/c'] == 'x'", "message": "label"},
                        {"rule": "!has(self.since) || self.since < timestamp('2030-01-01T00:00:00Z')", "message": "since"},
                        {"rule": "!has(self.names) || size(self.names) < 3", "message": "names"},
                        {"rule": "!has(oldSelf.mode) || self.mode == oldSelf.mode", "message": "mode is kept"}
                    ]
                },
                "opts": {"type": "object", "default": {}, "properties": {"level": {"type": "integer", "default": 1}},
                    "x-kubernetes-validations": [{"rule": "self.level > 1", "message": "level", "fieldPath": ".level"}]},
                "ports": {"type": "array", "items": {"type": "object", "properties": {
                    "port": {"type": "integer", "x-kubernetes-validations": [{"rule": "self > 0", "message": "port"}]},
                    "note": {"type": "string"}
                }}},
                "env": {"type": "object", "additionalProperties": {"type": "string", "x-kubernetes-validations": [{"rule": "self != 'bad'", "message": "env"}]}},
                "image": {"type": "string"},
                "free": {"type": "object", "properties": {"x": {"type": "string"}}}
            }},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
        }});
        let mut kept = whole.clone();
        assert!(keep_ruled(&mut kept));
        let spec = &kept["properties"]["spec"]["properties"];
        assert_eq!(
            spec.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["env", "limits", "opts", "ports"]
        );
        assert!(kept["properties"].get("status").is_none());
        assert_eq!(
            spec["limits"],
            whole["properties"]["spec"]["properties"]["limits"]
        );
        assert!(spec["ports"]["items"]["properties"].get("note").is_none());
        let said = |errors: Vec<kube_cel::ValidationError>| -> Vec<String> {
            let mut said: Vec<String> = errors
                .iter()
                .map(|e| format!("{}: {}", e.field_path, e.message))
                .collect();
            said.sort();
            said
        };
        let all = kube_cel::compile_schema(&whole);
        let ruled = Rules::of(&whole).unwrap();
        assert!(matches!(&ruled, Rules::Under(top) if top.len() == 1));
        let objects = [
            json!({"spec": {"limits": {}, "image": "x", "free": {"x": "y"}}, "status": {"phase": "P"}}),
            json!({"spec": {"limits": {"mode": "loose", "labels": {"a.b/c": "y"}, "since": "2031-01-01T00:00:00Z", "names": ["a", "b", "c"]}}}),
            json!({"spec": {"limits": {"labels": {"a.b/c": "x"}, "since": "2029-01-01T00:00:00Z"}, "ports": [{"port": 0, "note": "n"}, {"port": 2}], "env": {"A": "bad", "B": "ok"}}}),
        ];
        // Defaulted first, as every object the sim validates is.
        let objects = objects.map(|mut object| {
            default_value(&whole, &mut object);
            object
        });
        let mut failures = 0;
        for object in &objects {
            for old in [None, Some(&objects[1])] {
                let expected = said(
                    kube_cel::validate_compiled(&all, object, old)
                        .err()
                        .map(|e| e.into_vec())
                        .unwrap_or_default(),
                );
                let mut found = vec![];
                ruled.run(object, old, "", &mut found);
                assert_eq!(said(found), expected, "{object} after {old:?}");
                failures += expected.len();
            }
        }
        // Each object fails on the default level (a default on the way to a rule): 1 + 1 on
        // the first; 4 + 4 more on the second; 2 + 2 more on the third; and, after the second,
        // the two others on their mode changed from "loose" (a transition rule): 20.
        assert_eq!(failures, 20, "every rule is made to fail");
    }
}
