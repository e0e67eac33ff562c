//! The endpoints and endpoint-slice controllers, as kube-controller-manager runs them: every
//! Service with a selector gets an Endpoints object of its name and an EndpointSlice
//! (`kubernetes.io/service-name`, owned by the Service) listing the selected pods that have an
//! IP, ready or not, with the Service's ports resolved to each pod's.

use std::{collections::BTreeSet, sync::Arc};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{
    apps::selects,
    sim::{DeleteOptions, Sim, WriteContext},
};

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";

/// Keeps every selecting Service's endpoints; runs until aborted.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim.store.subscribe_to_any(&["/services", "/pods"]);
    let all = |sim: &Sim| -> BTreeSet<String> {
        let (services, _) = sim.store.list("/services", None);
        services
            .iter()
            .filter_map(|s| s["metadata"]["namespace"].as_str().map(str::to_owned))
            .collect()
    };
    for namespace in all(&sim) {
        sync_namespace(&sim, &namespace);
    }
    loop {
        let namespaces = match changes.recv().await {
            Ok(change) if matches!(&*change.storage, "/services" | "/pods") => {
                let namespace = change.object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if &*change.storage == "/services"
                    && change.kind == crate::store::ChangeKind::Deleted
                {
                    remove_endpoints(&sim, &change.object);
                }
                BTreeSet::from([namespace])
            }
            Ok(_) => continue,
            Err(RecvError::Lagged(_)) => all(&sim),
            Err(RecvError::Closed) => return,
        };
        for namespace in namespaces {
            sync_namespace(&sim, &namespace);
        }
    }
}

fn context() -> WriteContext {
    WriteContext::system("endpoint-controller")
}

/// A deleted Service's Endpoints go with it (its slices go by their owner reference).
fn remove_endpoints(sim: &Sim, service: &Value) {
    let (namespace, name) = (
        service["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        service["metadata"]["name"].as_str().unwrap_or_default(),
    );
    if let Some(rt) = sim.resource_type("", "v1", "endpoints") {
        let _ = sim.delete(&rt, namespace, name, &DeleteOptions::default(), &context());
    }
}

fn sync_namespace(sim: &Sim, namespace: &str) {
    let (services, _) = sim.store.list("/services", Some(namespace));
    let (pods, _) = sim.store.list("/pods", Some(namespace));
    for service in services.iter() {
        let selector = &service["spec"]["selector"];
        if selector.as_object().is_none_or(Map::is_empty)
            || service["metadata"]["deletionTimestamp"].is_string()
        {
            // Without a selector, the Service's endpoints are its owner's to write.
            continue;
        }
        // A Service's selector is a plain map: its `matchLabels`.
        let selector = json!({"matchLabels": selector});
        let selected: Vec<&Value> = pods
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| selects(&selector, &p["metadata"]["labels"]))
            .filter(|p| {
                p["status"]["podIP"]
                    .as_str()
                    .is_some_and(|ip| !ip.is_empty())
            })
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .collect();
        write_endpoints(sim, service, &selected);
        write_slice(sim, service, &selected);
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A Service port's target on `pod`: its `targetPort` number, or the pod's port of that name.
fn target_port(port: &Value, pod: &Value) -> Option<i64> {
    match &port["targetPort"] {
        Value::Number(n) => n.as_i64(),
        Value::String(name) => pod["spec"]["containers"]
            .as_array()?
            .iter()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .find(|p| p["name"] == name.as_str())?["containerPort"]
            .as_i64(),
        _ => port["port"].as_i64(),
    }
}

/// The Service's ports as endpoints list them, resolved on `pod`.
fn ports(service: &Value, pod: Option<&Value>) -> Vec<Value> {
    service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|port| {
            let number = match pod {
                Some(pod) => target_port(port, pod)?,
                None => port["targetPort"].as_i64().or(port["port"].as_i64())?,
            };
            let mut entry =
                json!({"port": number, "protocol": port["protocol"].as_str().unwrap_or("TCP")});
            if let Some(name) = port["name"].as_str().filter(|n| !n.is_empty()) {
                entry["name"] = json!(name);
            }
            Some(entry)
        })
        .collect()
}

fn pod_reference(pod: &Value) -> Value {
    json!({
        "kind": "Pod",
        "namespace": pod["metadata"]["namespace"],
        "name": pod["metadata"]["name"],
        "uid": pod["metadata"]["uid"],
    })
}

/// Writes `object` where `current` is, when they differ in what the controller owns.
fn store(
    sim: &Sim,
    group: &str,
    resource: &str,
    current: Option<&Value>,
    object: Value,
    owned: &[&str],
) {
    let Some(rt) = sim.resource_type(group, "v1", resource) else {
        return;
    };
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    match current {
        None => {
            let _ = sim.create(&rt, &namespace, object, &context());
        }
        Some(current) => {
            if owned.iter().all(|key| current[key] == object[key])
                && current["metadata"]["labels"] == object["metadata"]["labels"]
            {
                return;
            }
            let mut updated = current.clone();
            for key in owned {
                match object.get(*key) {
                    Some(value) => updated[*key] = value.clone(),
                    None => {
                        if let Some(map) = updated.as_object_mut() {
                            map.remove(*key);
                        }
                    }
                }
            }
            updated["metadata"]["labels"] = object["metadata"]["labels"].clone();
            let name = updated["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let _ = sim.update(&rt, &namespace, &name, "", updated, &context());
        }
    }
}

/// The Endpoints of the Service's name: one subset of its ready and not-ready addresses.
fn write_endpoints(sim: &Sim, service: &Value, pods: &[&Value]) {
    let (namespace, name) = (
        service["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        service["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let address = |pod: &&Value| {
        let mut address = json!({"ip": pod["status"]["podIP"], "targetRef": pod_reference(pod)});
        if let Some(node) = pod["spec"]["nodeName"].as_str() {
            address["nodeName"] = json!(node);
        }
        address
    };
    let (up, down): (Vec<&&Value>, Vec<&&Value>) = pods.iter().partition(|p| ready(p));
    let mut object = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": name, "namespace": namespace, "labels": service["metadata"]["labels"].clone()},
    });
    if object["metadata"]["labels"].is_null() {
        object["metadata"]["labels"] = json!({});
    }
    if let Some(first) = pods.first() {
        let mut subset = json!({"ports": ports(service, Some(first))});
        if !up.is_empty() {
            subset["addresses"] = json!(up.iter().map(|p| address(p)).collect::<Vec<_>>());
        }
        if !down.is_empty() {
            subset["notReadyAddresses"] =
                json!(down.iter().map(|p| address(p)).collect::<Vec<_>>());
        }
        object["subsets"] = json!([subset]);
    }
    let current = sim.store.get("/endpoints", namespace, name);
    store(
        sim,
        "",
        "endpoints",
        current.as_deref(),
        object,
        &["subsets"],
    );
}

/// The EndpointSlice of the Service: each selected pod with its readiness.
fn write_slice(sim: &Sim, service: &Value, pods: &[&Value]) {
    let (namespace, name) = (
        service["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        service["metadata"]["name"].as_str().unwrap_or_default(),
    );
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|pod| {
            let up = ready(pod);
            let mut endpoint = json!({
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": up, "serving": up, "terminating": false},
                "targetRef": pod_reference(pod),
            });
            if let Some(node) = pod["spec"]["nodeName"].as_str() {
                endpoint["nodeName"] = json!(node);
            }
            endpoint
        })
        .collect();
    let object = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {
            "generateName": format!("{name}-"),
            "namespace": namespace,
            "labels": {SERVICE_NAME: name, MANAGED_BY: "endpointslice-controller.k8s.io"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": name,
                "uid": service["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
            }],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports(service, pods.first().copied()),
    });
    let (slices, _) = sim
        .store
        .list("discovery.k8s.io/endpointslices", Some(namespace));
    let current = slices
        .iter()
        .find(|s| s["metadata"]["labels"][SERVICE_NAME] == name);
    store(
        sim,
        "discovery.k8s.io",
        "endpointslices",
        current.map(|c| c.as_ref()),
        object,
        &["endpoints", "ports"],
    );
}
