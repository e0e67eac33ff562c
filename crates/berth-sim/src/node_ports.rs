//! NodePort allocation, as the API server's service storage does it: each port of a
//! `NodePort` or `LoadBalancer` service gets a free port of 30000-32767 unless it names one,
//! which must be in that range and not another service's; an update that omits a port's
//! `nodePort` keeps the allocated one; a `ClusterIP` service may not name any.

use std::{collections::HashSet, ops::RangeInclusive};

use serde_json::{Value, json};

use crate::{error::Cause, store::Store};

/// The default `--service-node-port-range`.
pub const RANGE: RangeInclusive<u64> = 30000..=32767;

fn needs_node_ports(service: &Value) -> bool {
    matches!(
        service["spec"]["type"].as_str(),
        Some("NodePort" | "LoadBalancer")
    )
}

/// The node ports every other service holds.
fn taken(store: &Store, service: &Value) -> HashSet<u64> {
    let me = (
        service["metadata"]["namespace"].as_str(),
        service["metadata"]["name"].as_str(),
    );
    store
        .list("/services", None)
        .0
        .iter()
        .filter(|s| {
            (
                s["metadata"]["namespace"].as_str(),
                s["metadata"]["name"].as_str(),
            ) != me
        })
        .flat_map(|s| {
            s["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["nodePort"].as_u64())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn invalid(field: String, port: u64, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: {port}: {message}"),
        field,
    }
}

/// Checks the node ports a service names and allocates the ones it needs (keeping those of
/// `old`, the service before an update); the causes of a refusal otherwise.
pub fn allocate(store: &Store, service: &mut Value, old: Option<&Value>) -> Vec<Cause> {
    let needs = needs_node_ports(service);
    let mut taken = taken(store, service);
    let mut causes = vec![];
    let old_ports: Vec<Value> = old
        .filter(|o| needs_node_ports(o))
        .and_then(|o| o["spec"]["ports"].as_array().cloned())
        .unwrap_or_default();
    let Some(ports) = service["spec"]["ports"].as_array_mut() else {
        return causes;
    };
    for (i, port) in ports.iter_mut().enumerate() {
        let field = format!("spec.ports[{i}].nodePort");
        match port["nodePort"].as_u64().filter(|p| *p != 0) {
            Some(_) if !needs => causes.push(Cause {
                reason: "FieldValueForbidden".to_owned(),
                message: "Forbidden: may not be used when `type` is 'ClusterIP'".to_owned(),
                field,
            }),
            Some(wanted) if !RANGE.contains(&wanted) => causes.push(invalid(
                field,
                wanted,
                &format!(
                    "provided port is not in the valid range. The range of valid ports is {}-{}",
                    RANGE.start(),
                    RANGE.end()
                ),
            )),
            Some(wanted) if !taken.insert(wanted) => {
                causes.push(invalid(field, wanted, "provided port is already allocated"))
            }
            Some(_) => {}
            None if needs => {
                let kept = old_ports
                    .iter()
                    .find(|o| o["port"] == port["port"] && o["protocol"] == port["protocol"])
                    .and_then(|o| o["nodePort"].as_u64())
                    .filter(|p| !taken.contains(p));
                let Some(free) = kept.or_else(|| RANGE.clone().find(|p| !taken.contains(p))) else {
                    causes.push(Cause {
                        reason: "FieldValueInvalid".to_owned(),
                        message: "Internal error: range is full".to_owned(),
                        field,
                    });
                    continue;
                };
                taken.insert(free);
                port["nodePort"] = json!(free);
            }
            None => {}
        }
    }
    causes
}
