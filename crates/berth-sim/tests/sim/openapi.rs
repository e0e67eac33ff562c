//! The OpenAPI documents, as a client that parses them would check them: every built-in type
//! the sim serves has its full schema, every reference resolves, roots carry their
//! group/version/kind, and `/openapi/v2` answers in JSON or, when asked, in gnostic's protobuf
//! (what kubectl 1.27 and 1.28 read for apply, diff, replace and explain).

use serde_json::Value;

use crate::support::{cluster, get_raw, install_workspace_crd};

async fn get(client: &kube::Client, path: &str, accept: &str) -> (String, Vec<u8>) {
    let (code, content_type, body) = get_raw(client, path, accept).await;
    assert_eq!(code, 200, "{path}");
    (content_type, body)
}

/// Every `$ref` under `value`.
fn references<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r);
            }
            map.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
        _ => {}
    }
}

fn gvks(definition: &Value) -> Vec<(String, String, String)> {
    definition["x-kubernetes-group-version-kind"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_owned(),
                g["version"].as_str().unwrap().to_owned(),
                g["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn openapi_v2_has_every_type_with_resolvable_references() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let (content_type, body) = get(&client, "/openapi/v2", "application/json").await;
    assert_eq!(content_type, "application/json");
    let document: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(document["swagger"], "2.0");
    let definitions = document["definitions"].as_object().unwrap();
    let mut refs = vec![];
    references(&document, &mut refs);
    assert!(refs.len() > 100, "{} references", refs.len());
    for r in refs {
        let name = r.strip_prefix("#/definitions/").expect("a v2 reference");
        assert!(definitions.contains_key(name), "{r} resolves to nothing");
    }
    // kube-openapi's parser: one type per schema, one schema per array's items.
    for (name, definition) in definitions {
        let mut stack = vec![definition];
        while let Some(schema) = stack.pop() {
            if let Some(types) = schema["type"].as_array() {
                panic!("{name}: several types {types:?}");
            }
            if schema["type"] == "array" {
                assert!(
                    schema["items"].is_object(),
                    "{name}: an array without items"
                );
            }
            for key in ["properties"] {
                if let Some(properties) = schema[key].as_object() {
                    stack.extend(properties.values());
                }
            }
            if schema["items"].is_object() {
                stack.push(&schema["items"]);
            }
        }
    }
    let pod = &definitions["io.k8s.api.core.v1.Pod"];
    assert_eq!(gvks(pod), [("".into(), "v1".into(), "Pod".into())]);
    assert_eq!(
        pod["properties"]["spec"]["$ref"],
        "#/definitions/io.k8s.api.core.v1.PodSpec"
    );
    let spec = &definitions["io.k8s.api.core.v1.PodSpec"];
    assert!(
        spec["properties"]["restartPolicy"]["description"]
            .as_str()
            .unwrap()
            .starts_with("Restart policy for all containers within the pod.")
    );
    assert_eq!(
        spec["properties"]["containers"]["x-kubernetes-patch-merge-key"],
        "name"
    );
    assert_eq!(
        gvks(&definitions["io.k8s.api.apps.v1.Deployment"]),
        [("apps".into(), "v1".into(), "Deployment".into())]
    );
    assert_eq!(
        gvks(&definitions["dev.berth.v1alpha1.Workspace"]),
        [("berth.dev".into(), "v1alpha1".into(), "Workspace".into())]
    );
}

#[tokio::test]
async fn openapi_v2_in_protobuf_is_what_kubectl_asks_for() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let accept = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let (content_type, body) = get(&client, "/openapi/v2", accept).await;
    // What the real server answers: a media type may not hold `@`.
    assert_eq!(
        content_type,
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
    );
    // Document.swagger (field 1) is "2.0"; Document.definitions (field 9) follows.
    assert_eq!(&body[..5], b"\x0a\x032.0");
    assert!(body.len() > 100_000, "{} bytes", body.len());
    assert!(
        body.windows(b"io.k8s.api.core.v1.PodSpec".len())
            .any(|w| w == b"io.k8s.api.core.v1.PodSpec")
    );
}

#[tokio::test]
async fn openapi_v3_has_the_full_schemas_of_built_in_types() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let (_, body) = get(&client, "/openapi/v3/apis/apps/v1", "application/json").await;
    let document: Value = serde_json::from_slice(&body).unwrap();
    let schemas = document["components"]["schemas"].as_object().unwrap();
    let deployment = &schemas["io.k8s.api.apps.v1.Deployment"];
    assert_eq!(
        gvks(deployment),
        [("apps".into(), "v1".into(), "Deployment".into())]
    );
    assert_eq!(
        deployment["properties"]["spec"]["$ref"],
        "#/components/schemas/io.k8s.api.apps.v1.DeploymentSpec"
    );
    let mut refs = vec![];
    references(&document, &mut refs);
    for r in refs {
        let name = r
            .strip_prefix("#/components/schemas/")
            .expect("a v3 reference");
        assert!(schemas.contains_key(name), "{r} resolves to nothing");
    }
}
