//! CustomResourceDefinitions: their validation, the status the apiextensions controllers
//! set, and the resources a definition serves.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::{
    error::Cause,
    meta::now_rfc3339,
    resources::{Registry, ResourceType, View},
    schema::CrdSchema,
};

/// Where CRDs are stored.
pub const CRD_STORAGE: &str = "apiextensions.k8s.io/customresourcedefinitions";
/// The finalizer the apiextensions server puts on every CRD.
pub const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Checks a CRD as the apiextensions server does and sets the status its controllers would
/// (names accepted, established).
pub fn prepare(crd: &mut Value) -> Result<(), Vec<Cause>> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    let mut causes = vec![];
    if group.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.group".into(),
        });
    }
    if plural.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.names.plural".into(),
        });
    }
    if spec["names"]["kind"].as_str().is_none_or(str::is_empty) {
        causes.push(Cause {
            reason: "FieldValueRequired".into(),
            message: "Required value".into(),
            field: "spec.names.kind".into(),
        });
    }
    let expected = format!("{plural}.{group}");
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    if name != expected {
        causes.push(Cause {
            reason: "FieldValueInvalid".into(),
            message: format!(
                "Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"
            ),
            field: "metadata.name".into(),
        });
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage_count = versions.iter().filter(|v| v["storage"] == true).count();
    if storage_count != 1 {
        causes.push(Cause { reason: "FieldValueInvalid".into(), message: format!("Invalid value: {storage_count}: must have exactly one version marked as storage version"), field: "spec.versions".into() });
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    let now = now_rfc3339();
    let accepted = spec["names"].clone();
    let stored_versions: Vec<Value> = versions
        .iter()
        .filter(|v| v["storage"] == true)
        .map(|v| v["name"].clone())
        .collect();
    crd["status"] = json!({
        "acceptedNames": accepted,
        "storedVersions": stored_versions,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now}
        ]
    });
    Ok(())
}

/// Serves in `registry` the resources a CRD defines (or stops serving those it no longer
/// does).
pub fn serve(registry: &mut Registry, crd: &Value) {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_owned();
    let plural = spec["names"]["plural"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // A terminating definition is still served (its instances' finalizers must be
    // removable); only creates are refused, by `check_definition_open`.
    registry.remove_group_resource(&group, &plural);
    let storage: crate::resources::StorageKey = format!("{group}/{plural}").into();
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let schema_of = |version: &Value| {
        let schema = version["schema"]["openAPIV3Schema"].clone();
        (!schema.is_null()).then(|| Arc::new(CrdSchema::new(schema)))
    };
    let storage_version = (versions.len() > 1)
        .then(|| versions.iter().find(|v| v["storage"] == true))
        .flatten()
        .map(|v| crate::resources::StorageVersion {
            api_version: format!("{group}/{}", v["name"].as_str().unwrap_or_default()),
            schema: schema_of(v),
        });
    for version in versions.iter().cloned() {
        if version["served"] != true {
            continue;
        }
        let columns = version["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| crate::resources::PrinterColumn {
                        name: c["name"].as_str().unwrap_or_default().to_owned(),
                        type_: c["type"].as_str().unwrap_or("string").to_owned(),
                        format: c["format"].as_str().unwrap_or_default().to_owned(),
                        description: c["description"].as_str().unwrap_or_default().to_owned(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                        json_path: c["jsonPath"].as_str().map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let kind = spec["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut subresources = vec![];
        if version["subresources"]["status"].is_object() {
            subresources.push("status".to_owned());
        }
        if version["subresources"]["scale"].is_object() {
            subresources.push("scale".to_owned());
        }
        registry.insert(ResourceType {
            group: group.clone(),
            version: version["name"].as_str().unwrap_or_default().to_owned(),
            resource: plural.clone(),
            singular: spec["names"]["singular"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| kind.to_lowercase()),
            list_kind: spec["names"]["listKind"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("{kind}List")),
            kind,
            namespaced: spec["scope"] == "Namespaced",
            short_names: strings(&spec["names"]["shortNames"]),
            categories: strings(&spec["names"]["categories"]),
            subresources,
            storage: storage.clone(),
            view: if storage_version.is_some() {
                View::Versioned
            } else {
                View::Native
            },
            behaviour: crate::resources::Behaviour::Stored,
            tracks_generation: true,
            schema: schema_of(&version),
            storage_version: storage_version.clone(),
            printer_columns: columns,
            field_labels: version["selectableFields"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .filter_map(|s| {
                            s["jsonPath"]
                                .as_str()
                                .map(|p| p.trim_start_matches('.').to_owned())
                        })
                        .collect()
                })
                .unwrap_or_default(),
            is_custom: true,
        });
    }
}

/// The strings of a JSON array (none if it is not one).
fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|s| {
            s.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
