//! The `scale` subresource of custom resources and apps/v1 workloads: an autoscaling/v1 `Scale` whose replicas are
//! read from and written to the paths the CRD names (`specReplicasPath`,
//! `statusReplicasPath`, `labelSelectorPath`), as `kubectl scale` and autoscalers use it.

use serde_json::{Value, json};

use crate::{
    crd::CRD_STORAGE,
    error::{ApiError, ApiResult},
    patch::{self, PatchType},
    resources::ResourceType,
    sim::{Sim, WriteContext, Written},
};

/// The paths of a version's scale subresource, as JSON pointers.
struct Paths {
    spec_replicas: String,
    status_replicas: String,
    selector: Option<String>,
    /// apps/v1 workloads report their `spec.selector` in its string form.
    workload: bool,
}

/// `.spec.replicas` as `/spec/replicas`.
fn pointer(path: &str) -> String {
    path.trim_start_matches('.')
        .split('.')
        .fold(String::new(), |p, part| format!("{p}/{part}"))
}

fn paths(sim: &Sim, rt: &ResourceType) -> ApiResult<Paths> {
    if rt.group == "apps" {
        return Ok(Paths {
            spec_replicas: "/spec/replicas".into(),
            status_replicas: "/status/replicas".into(),
            selector: None,
            workload: true,
        });
    }
    let crd = sim
        .store
        .get(CRD_STORAGE, "", &format!("{}.{}", rt.resource, rt.group))
        .ok_or_else(ApiError::no_such_path)?;
    let scale = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == rt.version.as_str())
        .map(|v| v["subresources"]["scale"].clone())
        .filter(Value::is_object)
        .ok_or_else(ApiError::no_such_path)?;
    let text = |key: &str| scale[key].as_str().map(pointer);
    Ok(Paths {
        spec_replicas: text("specReplicasPath").unwrap_or_else(|| "/spec/replicas".into()),
        status_replicas: text("statusReplicasPath").unwrap_or_else(|| "/status/replicas".into()),
        selector: text("labelSelectorPath"),
        workload: false,
    })
}

/// The object's `Scale`.
fn to_scale(object: &Value, paths: &Paths) -> Value {
    let metadata = &object["metadata"];
    let mut status = json!({
        "replicas": object.pointer(&paths.status_replicas).and_then(Value::as_i64).unwrap_or(0)
    });
    if let Some(selector) = paths
        .selector
        .as_ref()
        .and_then(|p| object.pointer(p))
        .and_then(Value::as_str)
    {
        status["selector"] = json!(selector);
    }
    if paths.workload {
        status["selector"] = json!(crate::apps::selector_string(&object["spec"]["selector"]));
    }
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {
            "name": metadata["name"], "namespace": metadata["namespace"], "uid": metadata["uid"],
            "resourceVersion": metadata["resourceVersion"], "creationTimestamp": metadata["creationTimestamp"]
        },
        "spec": {"replicas": object.pointer(&paths.spec_replicas).and_then(Value::as_i64).unwrap_or(0)},
        "status": status
    })
}

/// Sets `pointer` in `object`, creating the objects on the way.
fn set(object: &mut Value, pointer: &str, value: Value) {
    let mut node = object;
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        if !node.is_object() {
            *node = json!({});
        }
        if i + 1 == parts.len() {
            node[*part] = value;
            return;
        }
        node = &mut node[*part];
    }
}

/// A request on `<resource>/<name>/scale`: `get`, `update` (a `Scale`) or `patch` (of the
/// `Scale`); a write sets the replicas in the object itself, with its validation.
#[allow(clippy::too_many_arguments)]
pub fn serve(
    sim: &Sim,
    rt: &ResourceType,
    verb: &str,
    namespace: &str,
    name: &str,
    body: Option<(&Value, Option<PatchType>)>,
    ctx: &WriteContext,
) -> ApiResult<Value> {
    let paths = paths(sim, rt)?;
    let current = sim.get(rt, namespace, name)?;
    let scale = to_scale(&current, &paths);
    let wanted = match (verb, body) {
        ("get", _) => return Ok(scale),
        ("update", Some((body, None))) => body.clone(),
        ("patch", Some((body, Some(PatchType::Merge)))) => {
            let mut patched = scale.clone();
            patch::merge(&mut patched, body)?;
            patched
        }
        ("patch", Some((body, Some(PatchType::Json)))) => {
            let mut patched = scale.clone();
            patch::json(&mut patched, body)?;
            patched
        }
        _ => {
            return Err(ApiError::MethodNotAllowed {
                message: format!("{verb} is not supported on {}/scale", rt.resource),
            });
        }
    };
    let replicas = wanted["spec"]["replicas"].as_i64().unwrap_or(0);
    let mut object = current;
    if let Some(rv) = wanted["metadata"]["resourceVersion"]
        .as_str()
        .filter(|r| !r.is_empty())
    {
        object["metadata"]["resourceVersion"] = json!(rv);
    }
    set(&mut object, &paths.spec_replicas, json!(replicas));
    let Written { object, .. } = sim.update(rt, namespace, name, "", object, ctx)?;
    Ok(to_scale(&object, &paths))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths_become_pointers_and_set_creates_the_way() {
        assert_eq!(pointer(".spec.replicas"), "/spec/replicas");
        let mut object = json!({"spec": {}});
        set(&mut object, "/spec/scaling/count", json!(3));
        assert_eq!(object, json!({"spec": {"scaling": {"count": 3}}}));
    }
}
