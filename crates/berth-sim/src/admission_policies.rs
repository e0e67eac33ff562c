//! ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) as the real API server runs it
//! (1.30-1.33): each binding of a policy whose match constraints (and the binding's match
//! resources) take a create or update is evaluated with its params, variables, match
//! conditions and validations in CEL (`kube-cel`), with the `authorizer` library answered by
//! the sim's RBAC for the requesting user. A failed validation denies (`ValidatingAdmissionPolicy
//! 'P' with binding 'B' denied request: MESSAGE`), warns or is dropped (audit: the sim keeps no
//! audit log), as the binding's `validationActions` say; an error follows `failurePolicy`.
//! A DELETE is evaluated with `object` null and `oldObject` the object being deleted.
//! Not simulated: CONNECT, `matchPolicy: Equivalent` conversions, `auditAnnotations`,
//! the cost budget beyond the two authorizer checks an expression may make.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

use kube_cel::KubeCelExt;
use kube_cel::cel::{
    Context, ExecutionError, Program, ResolveResult, Value as Cel,
    extractors::This,
    objects::{Key, Map, Opaque},
};
use serde_json::{Value, json};

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, ApiResult, PolicyDenial, qualified},
    resources::ResourceType,
    sim::Sim,
};

/// What a policy sees of a request (what a webhook is sent).
pub use crate::webhooks::Admission as Request;

/// The policies and bindings the sim stores.
fn stored(sim: &Sim, resource: &str) -> Vec<Arc<Value>> {
    match sim.resource_type("admissionregistration.k8s.io", "v1", resource) {
        Some(rt) => sim.store.list(&rt.storage, None).0,
        None => vec![],
    }
}

/// Whether any bound policy could take a request on `rt` (its `subresource`, `""` for the
/// main resource), so the request is previewed and evaluated.
pub fn watched(sim: &Sim, rt: &ResourceType, subresource: &str, operations: &[&str]) -> bool {
    let bound: Vec<String> = stored(sim, "validatingadmissionpolicybindings")
        .iter()
        .filter_map(|b| b["spec"]["policyName"].as_str().map(str::to_owned))
        .collect();
    stored(sim, "validatingadmissionpolicies")
        .iter()
        .filter(|p| bound.iter().any(|b| p["metadata"]["name"] == b.as_str()))
        .any(|p| {
            operations.iter().any(|op| {
                rules_match(
                    &p["spec"]["matchConstraints"]["resourceRules"],
                    rt,
                    subresource,
                    op,
                    true,
                )
            })
        })
}

fn listed(list: &Value, wanted: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|x| x == "*" || x == wanted))
}

/// Whether one of `rules` takes an operation on `rt`'s `subresource` (`""`: the main
/// resource). As the real server: `pods` is the main resource only, `pods/status` its status,
/// `pods/*` every subresource of pods, `*/status` every status, `*` every main resource. An
/// empty list takes everything when `empty_matches` (a binding's match resources), nothing
/// otherwise.
fn rules_match(
    rules: &Value,
    rt: &ResourceType,
    subresource: &str,
    operation: &str,
    empty_matches: bool,
) -> bool {
    let Some(rules) = rules.as_array().filter(|r| !r.is_empty()) else {
        return empty_matches;
    };
    rules.iter().any(|rule| {
        let resource = rule["resources"].as_array().is_some_and(|list| {
            list.iter().filter_map(Value::as_str).any(|r| {
                let (res, sub) = r.split_once('/').unwrap_or((r, ""));
                (res == "*" || res == rt.resource)
                    && (sub == subresource || (sub == "*" && !subresource.is_empty()))
            })
        });
        let scope = match rule["scope"].as_str().unwrap_or("*") {
            "Namespaced" => rt.namespaced,
            "Cluster" => !rt.namespaced,
            _ => true,
        };
        listed(&rule["operations"], operation)
            && listed(&rule["apiGroups"], &rt.group)
            && listed(&rule["apiVersions"], &rt.version)
            && resource
            && scope
    })
}

/// Whether match constraints (or a binding's match resources) take the request: the
/// namespace and object selectors, the excluded rules, then the rules.
fn matches(sim: &Sim, constraints: &Value, request: &Request<'_>, binding: bool) -> bool {
    if constraints.is_null() {
        return binding;
    }
    let labels = |object: &Value| object["metadata"]["labels"].clone();
    let namespace_selector = &constraints["namespaceSelector"];
    if request.rt.namespaced && !namespace_selector.is_null() {
        let namespace = sim
            .store
            .get("/namespaces", "", request.namespace)
            .map(|ns| labels(&ns))
            .unwrap_or(Value::Null);
        if !crate::apps::selects(namespace_selector, &namespace) {
            return false;
        }
    }
    let object_selector = &constraints["objectSelector"];
    if !object_selector.is_null()
        && (request.object.is_null()
            || !crate::apps::selects(object_selector, &labels(request.object)))
        && !request
            .old
            .is_some_and(|old| crate::apps::selects(object_selector, &labels(old)))
    {
        return false;
    }
    if rules_match(
        &constraints["excludeResourceRules"],
        request.rt,
        request.subresource,
        request.operation,
        false,
    ) {
        return false;
    }
    rules_match(
        &constraints["resourceRules"],
        request.rt,
        request.subresource,
        request.operation,
        binding,
    )
}

// The CEL `authorizer` library: builders are immutable values; `check` asks RBAC.

/// Who is asking (the requesting user, or a service account).
#[derive(Clone, Debug, PartialEq, Eq)]
struct AuthorizerValue {
    user: Identity,
}

/// A resource (or path) check being built.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Check {
    user: Identity,
    group: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
    path: Option<String>,
}

/// What RBAC said.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Decision {
    allowed: bool,
    reason: String,
}

impl Opaque for AuthorizerValue {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Authorizer"
    }
}
impl Opaque for Check {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.ResourceCheck"
    }
}
impl Opaque for Decision {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.authorization.Decision"
    }
}

fn opaque<T: Opaque + Clone>(value: &Cel, function: &str) -> Result<T, ExecutionError> {
    match value {
        Cel::Opaque(o) => o
            .downcast_ref::<T>()
            .cloned()
            .ok_or_else(|| ExecutionError::function_error(function, "unexpected receiver")),
        Cel::Map(map) => match map.map.get(&Key::String(Arc::new("__authorizer".into()))) {
            Some(Cel::Opaque(o)) => o
                .downcast_ref::<T>()
                .cloned()
                .ok_or_else(|| ExecutionError::function_error(function, "unexpected receiver")),
            _ => Err(ExecutionError::function_error(
                function,
                "unexpected receiver",
            )),
        },
        _ => Err(ExecutionError::function_error(
            function,
            "unexpected receiver",
        )),
    }
}

/// The `authorizer` variable: a map holding the authorizer and its `requestResource` check.
fn authorizer_value(user: &Identity, request: &Request<'_>, name: &str) -> Cel {
    let request_resource = Check {
        user: user.clone(),
        group: request.rt.group.clone(),
        resource: request.rt.resource.clone(),
        subresource: String::new(),
        namespace: request.namespace.to_owned(),
        name: name.to_owned(),
        path: None,
    };
    let mut map: HashMap<Key, Cel> = HashMap::new();
    map.insert(
        Key::String(Arc::new("__authorizer".into())),
        Cel::Opaque(Arc::new(AuthorizerValue { user: user.clone() })),
    );
    map.insert(
        Key::String(Arc::new("requestResource".into())),
        Cel::Opaque(Arc::new(request_resource)),
    );
    Cel::Map(Map { map: Arc::new(map) })
}

/// How many authorizer checks an expression may make: each costs 350 000 against a limit of
/// 1 000 000 per expression (the real server's strict cost, on from 1.32).
const CHECKS_PER_EXPRESSION: u32 = 2;

fn register_authorizer(context: &mut Context<'_>, sim: Arc<Sim>, checks: Arc<AtomicU32>) {
    context.add_function(
        "group",
        |This(this): This<Cel>, group: Arc<String>| -> ResolveResult {
            let authorizer: AuthorizerValue = opaque(&this, "group")?;
            Ok(Cel::Opaque(Arc::new(Check {
                user: authorizer.user,
                group: group.to_string(),
                resource: String::new(),
                subresource: String::new(),
                namespace: String::new(),
                name: String::new(),
                path: None,
            })))
        },
    );
    context.add_function(
        "path",
        |This(this): This<Cel>, path: Arc<String>| -> ResolveResult {
            let authorizer: AuthorizerValue = opaque(&this, "path")?;
            if path.trim().is_empty() {
                return Err(ExecutionError::function_error(
                    "path",
                    "path must not be empty",
                ));
            }
            Ok(Cel::Opaque(Arc::new(Check {
                user: authorizer.user,
                group: String::new(),
                resource: String::new(),
                subresource: String::new(),
                namespace: String::new(),
                name: String::new(),
                path: Some(path.to_string()),
            })))
        },
    );
    context.add_function(
        "serviceAccount",
        |This(this): This<Cel>, namespace: Arc<String>, name: Arc<String>| -> ResolveResult {
            let _: AuthorizerValue = opaque(&this, "serviceAccount")?;
            let user = Identity {
                username: format!("system:serviceaccount:{namespace}:{name}"),
                uid: String::new(),
                groups: vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                ],
            };
            let mut map: HashMap<Key, Cel> = HashMap::new();
            map.insert(
                Key::String(Arc::new("__authorizer".into())),
                Cel::Opaque(Arc::new(AuthorizerValue { user })),
            );
            Ok(Cel::Map(Map { map: Arc::new(map) }))
        },
    );
    let setter = |field: &'static str| {
        move |This(this): This<Cel>, value: Arc<String>| -> ResolveResult {
            let mut check: Check = opaque(&this, field)?;
            let value = value.to_string();
            match field {
                "resource" => {
                    if value.trim().is_empty() {
                        return Err(ExecutionError::function_error(
                            field,
                            "resource must not be empty",
                        ));
                    }
                    check.resource = value
                }
                "subresource" => check.subresource = value,
                "namespace" => check.namespace = value,
                _ => check.name = value,
            }
            Ok(Cel::Opaque(Arc::new(check)))
        }
    };
    context.add_function("resource", setter("resource"));
    context.add_function("subresource", setter("subresource"));
    context.add_function("namespace", setter("namespace"));
    context.add_function("name", setter("name"));
    context.add_function(
        "check",
        move |This(this): This<Cel>, verb: Arc<String>| -> ResolveResult {
            let check: Check = opaque(&this, "check")?;
            if checks.fetch_add(1, Ordering::Relaxed) >= CHECKS_PER_EXPRESSION {
                return Err(ExecutionError::function_error(
                    "check",
                    "operation cancelled: actual cost limit exceeded",
                ));
            }
            let attrs = Attributes {
                verb: verb.to_string(),
                group: check.group.clone(),
                resource: check.resource.clone(),
                subresource: check.subresource.clone(),
                namespace: check.namespace.clone(),
                name: check.name.clone(),
                path: check.path.clone(),
            };
            let decision = auth::authorize(&sim.store, &check.user, &attrs);
            Ok(Cel::Opaque(Arc::new(Decision {
                allowed: decision.allowed,
                reason: decision.reason,
            })))
        },
    );
    context.add_function("allowed", |This(this): This<Cel>| -> ResolveResult {
        Ok(Cel::Bool(opaque::<Decision>(&this, "allowed")?.allowed))
    });
    context.add_function("reason", |This(this): This<Cel>| -> ResolveResult {
        Ok(Cel::String(Arc::new(
            opaque::<Decision>(&this, "reason")?.reason,
        )))
    });
    context.add_function("errored", |This(this): This<Cel>| -> ResolveResult {
        opaque::<Decision>(&this, "errored")?;
        Ok(Cel::Bool(false))
    });
    context.add_function("error", |This(this): This<Cel>| -> ResolveResult {
        opaque::<Decision>(&this, "error")?;
        Ok(Cel::String(Arc::new(String::new())))
    });
}

/// A JSON value as the real server's CEL sees it: every integer an `int` (CEL's int64, as
/// Kubernetes types integer fields), never a `uint`.
fn to_cel(value: &Value) -> Cel {
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(f)) => Cel::Float(f),
            (None, None) => Cel::Null,
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(items) => Cel::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            let map: HashMap<Key, Cel> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Cel::Map(Map { map: Arc::new(map) })
        }
    }
}

/// The `request` variable (absent fields left out, as the real server's unstructured form).
fn request_value(request: &Request<'_>, name: &str) -> Value {
    let rt = request.rt;
    let mut value = json!({
        "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "resource": {"group": rt.group, "version": rt.version, "resource": rt.resource},
        "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.resource},
        "operation": request.operation,
        "userInfo": {"username": request.user.username, "groups": request.user.groups},
        "dryRun": request.dry_run,
        "uid": "",
    });
    if !request.user.uid.is_empty() {
        value["userInfo"]["uid"] = json!(request.user.uid);
    }
    if !name.is_empty() {
        value["name"] = json!(name);
    }
    if !request.subresource.is_empty() {
        value["subResource"] = json!(request.subresource);
        value["resource"]["subresource"] = json!(request.subresource);
    }
    if rt.namespaced {
        value["namespace"] = json!(request.namespace);
    }
    value
}

/// One (policy, binding, param) evaluated: what it decided.
enum Outcome {
    /// A validation failed (or an expression errored under `Fail`): its message and reason.
    Failed { message: String, reason: String },
}

/// The CEL programs of a policy evaluated with one context.
struct Evaluation<'c> {
    context: Context<'c>,
    checks: Arc<AtomicU32>,
}

impl Evaluation<'_> {
    /// The expression's value; its error in the real server's words.
    fn run(&self, expression: &str) -> Result<Cel, String> {
        let program = compiled(expression)?;
        self.checks.store(0, Ordering::Relaxed);
        program.execute(&self.context).map_err(|e| {
            format!(
                "expression '{expression}' resulted in error: {}",
                cel_error(&e)
            )
        })
    }
}

/// The expression's program, compiled once: as the real server compiles a policy when it is
/// stored, not at every request it admits (parsing took a tenth of the API server's CPU
/// while a thousand workspaces of a kind started).
fn compiled(expression: &str) -> Result<Arc<Program>, String> {
    /// Programs by expression; emptied when it holds more than this many (policies come and
    /// go; their expressions are few).
    const KEPT: usize = 4096;
    static PROGRAMS: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Arc<Program>>>> =
        std::sync::LazyLock::new(Default::default);
    let programs = || PROGRAMS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(program) = programs().get(expression) {
        return Ok(program.clone());
    }
    let program =
        Arc::new(Program::compile(expression).map_err(|e| format!("compilation error: {e}"))?);
    let mut programs = programs();
    if programs.len() >= KEPT {
        programs.clear();
    }
    programs.insert(expression.to_owned(), program.clone());
    Ok(program)
}

/// A CEL error as cel-go words it.
fn cel_error(error: &ExecutionError) -> String {
    match error {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// The first 5 120 bytes of one line, trimmed, or nothing (the real server's rules for a
/// `messageExpression`'s result).
fn usable_message(value: Option<Cel>) -> Option<String> {
    match value {
        Some(Cel::String(s)) => {
            let s = s.trim().to_owned();
            (!s.is_empty() && s.len() <= 5120 && !s.contains('\n')).then_some(s)
        }
        _ => None,
    }
}

/// Evaluates one binding of `policy` with `params`: the match conditions, then each validation.
fn evaluate(
    sim: &Arc<Sim>,
    policy: &Value,
    request: &Request<'_>,
    params: Option<&Value>,
    failure_policy: &str,
) -> Vec<Outcome> {
    let spec = &policy["spec"];
    let name = request.name();
    let checks = Arc::new(AtomicU32::new(0));
    let mut context = Context::default();
    context.register_all();
    register_authorizer(&mut context, sim.clone(), checks.clone());
    context.add_variable_from_value("object", to_cel(request.object));
    context.add_variable_from_value("oldObject", request.old.map_or(Cel::Null, to_cel));
    context.add_variable_from_value("request", to_cel(&request_value(request, name)));
    context.add_variable_from_value("authorizer", authorizer_value(request.user, request, name));
    if !spec["paramKind"].is_null() {
        context.add_variable_from_value("params", params.map_or(Cel::Null, to_cel));
    }
    let namespace_object = if request.rt.namespaced {
        sim.store
            .get("/namespaces", "", request.namespace)
            .map(|ns| to_cel(&ns))
            .unwrap_or(Cel::Null)
    } else {
        Cel::Null
    };
    let error = |message: String| Outcome::Failed {
        message,
        reason: "Invalid".to_owned(),
    };
    let fail = failure_policy != "Ignore";
    // Match conditions see no namespaceObject and no variables.
    let mut evaluation = Evaluation { context, checks };
    evaluation
        .context
        .add_variable_from_value("namespaceObject", Cel::Null);
    let mut errors = vec![];
    for condition in spec["matchConditions"].as_array().into_iter().flatten() {
        let expression = condition["expression"].as_str().unwrap_or("true");
        match evaluation.run(expression) {
            Ok(Cel::Bool(false)) => return vec![],
            Ok(_) => {}
            Err(e) => {
                if !errors.contains(&e) {
                    errors.push(e)
                }
            }
        }
    }
    if !errors.is_empty() {
        return match (fail, errors.len()) {
            (false, _) => vec![],
            (true, 1) => vec![error(errors.remove(0))],
            (true, _) => vec![error(format!("[{}]", errors.join(", ")))],
        };
    }
    evaluation
        .context
        .add_variable_from_value("namespaceObject", namespace_object);
    // Variables in order, each able to use those before it; a failed one fails what uses it.
    let mut variables: HashMap<Key, Cel> = HashMap::new();
    let mut broken: Vec<(String, String)> = vec![];
    for variable in spec["variables"].as_array().into_iter().flatten() {
        let var = variable["name"].as_str().unwrap_or_default().to_owned();
        evaluation.context.add_variable_from_value(
            "variables",
            Cel::Map(Map {
                map: Arc::new(variables.clone()),
            }),
        );
        match evaluation.run(variable["expression"].as_str().unwrap_or("null")) {
            Ok(value) => {
                variables.insert(Key::String(Arc::new(var)), value);
            }
            Err(e) => {
                let cause = e
                    .split_once("resulted in error: ")
                    .map_or(e.clone(), |(_, c)| c.to_owned());
                broken.push((var, cause));
            }
        }
    }
    evaluation.context.add_variable_from_value(
        "variables",
        Cel::Map(Map {
            map: Arc::new(variables),
        }),
    );
    let mut outcomes = vec![];
    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expression = validation["expression"].as_str().unwrap_or("true");
        if let Some((var, cause)) = broken
            .iter()
            .find(|(var, _)| expression.contains(&format!("variables.{var}")))
        {
            if fail {
                outcomes.push(error(format!(
                    "expression '{expression}' resulted in error: composited variable \"{var}\" fails to evaluate: {cause}"
                )));
            }
            continue;
        }
        match evaluation.run(expression) {
            Ok(Cel::Bool(true)) => {}
            Ok(_) => {
                let from_expression = validation["messageExpression"]
                    .as_str()
                    .and_then(|m| usable_message(evaluation.run(m).ok()));
                let message = from_expression
                    .or_else(|| {
                        validation["message"]
                            .as_str()
                            .map(|m| m.trim().to_owned())
                            .filter(|m| !m.is_empty())
                    })
                    .unwrap_or_else(|| format!("failed expression: {}", expression.trim()));
                let reason = validation["reason"]
                    .as_str()
                    .unwrap_or("Invalid")
                    .to_owned();
                outcomes.push(Outcome::Failed { message, reason });
            }
            Err(e) if fail => outcomes.push(error(e)),
            Err(_) => {}
        }
    }
    outcomes
}

/// The params of a binding: `None` when the policy takes none (or the binding names none),
/// else the objects its paramRef selects; Err is a configuration error in the real words.
fn params(
    sim: &Sim,
    policy: &Value,
    binding: &Value,
    request: &Request<'_>,
) -> Result<Vec<Option<Value>>, String> {
    let kind = &policy["spec"]["paramKind"];
    let reference = &binding["spec"]["paramRef"];
    if kind.is_null() || reference.is_null() {
        return Ok(vec![None]);
    }
    let api_version = kind["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind_name = kind["kind"].as_str().unwrap_or_default();
    let Some(rt) = sim.resource_type_of_kind(group, version, kind_name) else {
        return Err(format!(
            "failed to configure policy: failed to find resource referenced by paramKind: '{group}/{version}, Kind={kind_name}'"
        ));
    };
    let namespace = match (rt.namespaced, reference["namespace"].as_str()) {
        (false, Some(ns)) if !ns.is_empty() => {
            return Err("failed to configure binding: paramRef.namespace must not be provided for a cluster-scoped `paramKind`".to_owned());
        }
        (false, _) => None,
        (true, Some(ns)) if !ns.is_empty() => Some(ns.to_owned()),
        (true, _) if request.rt.namespaced => Some(request.namespace.to_owned()),
        (true, _) => {
            return Err("failed to configure binding: cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".to_owned());
        }
    };
    let found: Vec<Value> = match reference["name"].as_str().filter(|n| !n.is_empty()) {
        Some(name) => sim
            .store
            .get(&rt.storage, namespace.as_deref().unwrap_or_default(), name)
            .map(|p| (*p).clone())
            .into_iter()
            .collect(),
        None => sim
            .store
            .list(&rt.storage, namespace.as_deref())
            .0
            .iter()
            .filter(|p| crate::apps::selects(&reference["selector"], &p["metadata"]["labels"]))
            .map(|p| (**p).clone())
            .collect(),
    };
    if found.is_empty() && reference["parameterNotFoundAction"] == "Deny" {
        return Err("failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction".to_owned());
    }
    Ok(found.into_iter().map(Some).collect())
}

/// The HTTP status of a denial's reason.
fn code_of(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// Evaluates every bound policy that takes the request; the warnings to send, or the first
/// denial.
pub fn validate(sim: &Arc<Sim>, request: &Request<'_>) -> ApiResult<Vec<String>> {
    let policies = stored(sim, "validatingadmissionpolicies");
    let mut bindings = stored(sim, "validatingadmissionpolicybindings");
    bindings.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let name = request.name();
    let mut warnings = vec![];
    let mut denied: Option<(String, String)> = None;
    let mut deny = |message: String, reason: String| {
        if denied.is_none() {
            denied = Some((message, reason));
        }
    };
    let mut sorted_policies: Vec<&Arc<Value>> = policies.iter().collect();
    sorted_policies.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    for policy in sorted_policies {
        let policy_name = policy["metadata"]["name"].as_str().unwrap_or_default();
        let spec = &policy["spec"];
        if !matches(sim, &spec["matchConstraints"], request, false) {
            continue;
        }
        let failure_policy = spec["failurePolicy"].as_str().unwrap_or("Fail");
        for binding in bindings
            .iter()
            .filter(|b| b["spec"]["policyName"] == policy_name)
        {
            let binding_name = binding["metadata"]["name"].as_str().unwrap_or_default();
            if !matches(sim, &binding["spec"]["matchResources"], request, true) {
                continue;
            }
            let said = |message: &str| {
                format!(
                    "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: {message}"
                )
            };
            let params = match params(sim, policy, binding, request) {
                Ok(params) => params,
                Err(message) => {
                    if failure_policy != "Ignore" {
                        deny(said(&message), "Invalid".to_owned());
                    }
                    continue;
                }
            };
            let actions: Vec<&str> = binding["spec"]["validationActions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            for param in &params {
                for Outcome::Failed { message, reason } in
                    evaluate(sim, policy, request, param.as_ref(), failure_policy)
                {
                    for action in &actions {
                        match *action {
                            "Deny" => deny(said(&message), reason.clone()),
                            "Warn" => {
                                let warning = format!(
                                    "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}': {message}"
                                );
                                if !warnings.contains(&warning) {
                                    warnings.push(warning);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    match denied {
        None => Ok(warnings),
        Some((inner, reason)) => {
            let resource = qualified(&request.rt.resource, &request.rt.group);
            Err(ApiError::Policy(Box::new(PolicyDenial {
                message: format!("{resource} \"{name}\" is forbidden: {inner}"),
                code: code_of(&reason),
                reason,
                kind: request.rt.resource.clone(),
                group: request.rt.group.clone(),
                name: name.to_owned(),
                cause: inner,
            })))
        }
    }
}
