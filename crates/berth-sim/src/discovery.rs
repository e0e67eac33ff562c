//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`,
//! and the aggregated form of `/api` and `/apis` (`apidiscovery.k8s.io/v2`, or `v2beta1`) for
//! clients that ask for it in `Accept`.

use serde_json::{Value, json};

use crate::resources::{Registry, ResourceType};

/// The version the sim reports; kubectl warns about skew beyond one minor version.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-berth-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn core_versions(address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
    })
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .into_iter()
        .map(|(name, versions)| {
            let listed: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            let preferred = listed[0].clone();
            json!({"name": name, "versions": listed, "preferredVersion": preferred})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// One group's entry, for `/apis/<group>`.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let list = group_list(registry);
    list["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == name)
        .map(|g| {
            let mut g = g.clone();
            g["kind"] = json!("APIGroup");
            g["apiVersion"] = json!("v1");
            g
        })
}

fn subresource_entry(t: &ResourceType, sub: &str) -> Value {
    let (kind, verbs, group, version): (&str, Vec<&str>, Option<&str>, Option<&str>) = match sub {
        "status" => (&t.kind, vec!["get", "patch", "update"], None, None),
        "binding" => ("Binding", vec!["create"], None, None),
        "token" => (
            "TokenRequest",
            vec!["create"],
            Some("authentication.k8s.io"),
            Some("v1"),
        ),
        "log" => ("Pod", vec!["get"], None, None),
        "eviction" => ("Eviction", vec!["create"], Some("policy"), Some("v1")),
        "finalize" => (&t.kind, vec!["update"], None, None),
        "scale" => (
            "Scale",
            vec!["get", "patch", "update"],
            Some("autoscaling"),
            Some("v1"),
        ),
        "exec" => ("PodExecOptions", vec!["create", "get"], None, None),
        "attach" => ("PodAttachOptions", vec!["create", "get"], None, None),
        "portforward" => ("PodPortForwardOptions", vec!["create", "get"], None, None),
        "proxy" => {
            let kind = match t.resource.as_str() {
                "pods" => "PodProxyOptions",
                "services" => "ServiceProxyOptions",
                _ => "NodeProxyOptions",
            };
            (
                kind,
                vec!["create", "delete", "get", "patch", "update"],
                None,
                None,
            )
        }
        _ => (&t.kind, vec!["get"], None, None),
    };
    let mut entry = json!({
        "name": format!("{}/{sub}", t.resource),
        "singularName": "",
        "namespaced": t.namespaced,
        "kind": kind,
        "verbs": verbs,
    });
    if let Some(group) = group {
        entry["group"] = json!(group);
    }
    if let Some(version) = version {
        entry["version"] = json!(version);
    }
    entry
}

/// The resources of one group/version.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types: Vec<_> = registry
        .all()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut resources = vec![];
    for t in types {
        let mut entry = json!({
            "name": t.resource,
            "singularName": t.singular,
            "namespaced": t.namespaced,
            "kind": t.kind,
            "verbs": t.verbs(),
        });
        if !t.short_names.is_empty() {
            entry["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            entry["categories"] = json!(t.categories);
        }
        resources.push(entry);
        for sub in &t.subresources {
            resources.push(subresource_entry(t, sub));
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
    )
}

/// Which aggregated discovery document `accept` asks for, if any: its apiVersion and the
/// Content-Type to answer with (v2 preferred).
pub fn aggregated_wanted(accept: &str) -> Option<(&'static str, &'static str)> {
    let asks = |version: &str| {
        accept.split(',').any(|part| {
            let params: Vec<&str> = part.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io")
                && params.contains(&format!("v={version}").as_str())
                && params.contains(&"as=APIGroupDiscoveryList")
        })
    };
    if asks("v2") {
        Some((
            "apidiscovery.k8s.io/v2",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ))
    } else if asks("v2beta1") {
        Some((
            "apidiscovery.k8s.io/v2beta1",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        ))
    } else {
        None
    }
}

/// Every group's versions and resources in one document: the core group for `/api`, the
/// others for `/apis`.
pub fn aggregated(registry: &Registry, core: bool, api_version: &str) -> Value {
    let groups: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_owned()])]
    } else {
        registry.groups().into_iter().collect()
    };
    let items: Vec<Value> = groups
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|version| {
                    let resources: Vec<Value> = registry
                        .all()
                        .filter(|t| t.group == name && &t.version == version)
                        .map(|t| aggregated_resource(t))
                        .collect();
                    json!({"version": version, "resources": resources, "freshness": "Current"})
                })
                .collect();
            json!({"metadata": {"name": name, "creationTimestamp": null}, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": items})
}

fn aggregated_resource(t: &ResourceType) -> Value {
    let subresources: Vec<Value> = t
        .subresources
        .iter()
        .map(|sub| {
            let legacy = subresource_entry(t, sub);
            json!({
                "subresource": sub,
                "responseKind": {
                    "group": legacy.get("group").cloned().unwrap_or_else(|| json!(t.group)),
                    "version": legacy.get("version").cloned().unwrap_or_else(|| json!(t.version)),
                    "kind": legacy["kind"],
                },
                "verbs": legacy["verbs"],
            })
        })
        .collect();
    let mut entry = json!({
        "resource": t.resource,
        "responseKind": {"group": t.group, "version": t.version, "kind": t.kind},
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.singular,
        "verbs": t.verbs(),
    });
    if !t.short_names.is_empty() {
        entry["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        entry["categories"] = json!(t.categories);
    }
    if !subresources.is_empty() {
        entry["subresources"] = json!(subresources);
    }
    entry
}
