//! CustomResourceDefinitions: serving, schema validation with the API server's messages, CEL
//! rules, defaulting, pruning, strict field validation, status subresource and generation.

use berth_api::Workspace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use crate::support::{api_error, cluster, install_workspace_crd};

fn workspace(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace", "metadata": {"name": name}, "spec": spec})
}

async fn raw_create(client: &kube::Client, body: Value, query: &str) -> Result<Value, kube::Error> {
    let path = format!("/apis/berth.dev/v1alpha1/namespaces/default/workspaces{query}");
    crate::support::post_json(client, &path, &body).await
}

#[tokio::test]
async fn a_crd_is_established_and_served() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("workspaces.berth.dev").await.unwrap();
    let conditions = crd.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );

    let workspaces: Api<Workspace> = Api::namespaced(client.clone(), "default");
    let created = workspaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(workspace("w", json!({"image": "devbox:1"}))).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(!created.spec.paused, "defaulted");
    let raw = raw_create(&client, workspace("w2", json!({"image": "devbox:1"})), "")
        .await
        .unwrap();
    assert_eq!(
        raw["spec"]["paused"],
        json!(false),
        "the schema default is stored"
    );

    // Deleting the CRD removes its objects, then stops serving it (as the real server, it
    // is Terminating meanwhile: see below).
    crds.delete("workspaces.berth.dev", &Default::default())
        .await
        .unwrap();
    crate::support::eventually(
        std::time::Duration::from_secs(10),
        "the CRD to stop being served",
        || async {
            matches!(
                workspaces.list(&Default::default()).await,
                Err(kube::Error::Api(s)) if s.code == 404
            )
            .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn invalid_workspaces_are_refused_with_the_field_named() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let rows: &[(Value, &str)] = &[
        (
            json!({"image": ""}),
            "spec.image: Invalid value: \"\": spec.image in body should be at least 1 chars long",
        ),
        (
            json!({"image": "x", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "secrets/s"}]}}}),
            "spec.podTemplate.volumes.secrets[0].mountPath: Invalid value: \"string\": mountPath must be an absolute path (start with '/')",
        ),
        (
            json!({"image": "x", "podTemplate": {"volumes": {"data": [{"claimName": "a", "mountPath": "/d"}], "secrets": [{"secretName": "s", "mountPath": "/d"}]}}}),
            "spec.podTemplate.volumes: Invalid value: \"object\": two data or secret volumes share a mountPath; each mountPath must be unique",
        ),
        (
            json!({"image": "x", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/s", "defaultMode": 1000}]}}}),
            "spec.podTemplate.volumes.secrets[0].defaultMode: Invalid value: 1000: spec.podTemplate.volumes.secrets[0].defaultMode in body should be less than or equal to 511",
        ),
        (
            json!({"image": "x", "lifecycle": {"startTimeout": "soon"}}),
            "spec.lifecycle.startTimeout: Invalid value: \"soon\": spec.lifecycle.startTimeout in body should match '^([0-9]+(\\.[0-9]+)?(ms|s|m|h))+$'",
        ),
        (
            json!({"image": "x", "ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]}),
            "spec.ports: Invalid value: \"array\": each port name must be unique",
        ),
        (
            json!({}),
            "spec.image: Required value: set it, or name a WorkspaceKind in spec.kind",
        ),
        // A rule's fieldPath and reason word the cause, as the real validator does.
        (
            json!({"kind": "python", "image": "x:1"}),
            "spec.image: Forbidden: a workspace of a kind gets its image from the kind's image option (spec.options.image); leave spec.image out",
        ),
        (
            json!({"image": "x:1", "options": {"pod": "large"}}),
            "spec.options: Forbidden: spec.options picks options of a WorkspaceKind: set spec.kind too",
        ),
        (
            json!({"image": "x", "podTemplate": {"volumes": {"home": {"size": "abc", "mountPath": "/home/dev"}}}}),
            "spec.podTemplate.volumes.home: Invalid value: \"object\": home.size must be a quantity greater than zero, such as 10Gi",
        ),
        (
            json!({"image": "x", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}),
            "spec.resources: Invalid value: \"object\": resources.limits[cpu] must be at least resources.requests[cpu]",
        ),
        (
            json!({"image": "x", "resources": {"requests": {"memory": "-1Gi"}}}),
            "spec.resources.requests[memory]: Invalid value: \"\": must not be negative",
        ),
        (
            json!({"image": "x", "resources": {"limits": {"example.com/gpu": "1", "cpu": "lots"}}}),
            "spec.resources.limits[cpu]: Invalid value: \"\": must be a quantity, such as 500m, 2 or 2Gi",
        ),
        (
            json!({"image": "x", "resources": {"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}}),
            "spec.resources: Invalid value: \"object\": resources.limits[example.com/gpu] must be equal to resources.requests[example.com/gpu]: it cannot be overcommitted",
        ),
        (
            json!({"image": "x", "resources": {"requests": {"a": "1", "b": "1", "c": "1", "d": "1", "e": "1", "f": "1", "g": "1", "h": "1", "i": "1"}}}),
            "spec.resources.requests: Too many: 9: must have at most 8 items",
        ),
        (
            json!({"image": "x", "ports": [{"name": "grpc", "port": 50051}]}),
            "spec.ports: Invalid value: \"array\": ports: 50051 is the Berth agent's port in every workspace pod; pick another port",
        ),
        (
            json!({"image": "x", "podTemplate": {"volumes": {"secrets": [{"secretName": "s", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}}}),
            "spec.podTemplate.volumes.secrets[0].mountPath: Invalid value: \"string\": mountPath must not be /var/run/secrets/kubernetes.io/serviceaccount or below it (the service-account token Kubernetes mounts)",
        ),
    ];
    for (spec, cause) in rows {
        let (code, reason, message) =
            api_error(raw_create(&client, workspace("bad", spec.clone()), "").await);
        assert_eq!((code, reason.as_str()), (422, "Invalid"), "{spec}");
        assert!(
            message.starts_with("Workspace.berth.dev \"bad\" is invalid: "),
            "{message}"
        );
        assert!(
            message.contains(cause),
            "{spec}\n  wanted: {cause}\n  got:    {message}"
        );
    }
    let workspaces: Api<Workspace> = Api::namespaced(client, "default");
    assert!(
        workspaces
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was stored"
    );
}

#[tokio::test]
async fn unknown_fields_are_pruned_or_refused_when_strict() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let stored = raw_create(
        &client,
        workspace("w", json!({"image": "x", "colour": "red"})),
        "",
    )
    .await
    .unwrap();
    assert!(stored["spec"].get("colour").is_none(), "pruned");
    let (code, reason, message) = api_error(
        raw_create(
            &client,
            workspace("w2", json!({"image": "x", "colour": "red"})),
            "?fieldValidation=Strict",
        )
        .await,
    );
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        message,
        "Workspace in version \"v1alpha1\" cannot be handled as a Workspace: strict decoding error: unknown field \"spec.colour\""
    );
}

#[tokio::test]
async fn status_writes_leave_spec_and_generation_alone() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let workspaces: Api<Workspace> = Api::namespaced(client.clone(), "default");
    raw_create(&client, workspace("w", json!({"image": "a:1"})), "")
        .await
        .unwrap();

    let status = workspaces
        .patch_status("w", &PatchParams::default(), &Patch::Merge(json!({"spec": {"image": "evil:1"}, "status": {"phase": "Starting", "message": "Pod is starting"}})))
        .await
        .unwrap();
    assert_eq!(status.spec.image, "a:1");
    assert_eq!(status.metadata.generation, Some(1));
    assert_eq!(
        status.status.as_ref().unwrap().message.as_deref(),
        Some("Pod is starting")
    );

    let spec = workspaces
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"image": "a:2"}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap();
    assert_eq!(spec.metadata.generation, Some(2));
    assert_eq!(
        spec.status.unwrap().phase,
        Some(berth_api::Phase::Starting),
        "status ignored on the main resource"
    );

    let labelled = workspaces
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(2),
        "metadata changes do not bump generation"
    );

    // Custom resources need a resourceVersion to be replaced.
    let mut replacement = labelled.clone();
    replacement.metadata.resource_version = None;
    let (code, _, message) = api_error(
        workspaces
            .replace("w", &PostParams::default(), &replacement)
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(
            "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
        ),
        "{message}"
    );

    // Strategic merge patch is for built-in types only.
    let (code, reason, _) = api_error(
        workspaces
            .patch(
                "w",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"image": "b"}})),
            )
            .await,
    );
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
}

/// A custom resource whose CRD names no printer columns is listed, as a Table, with the
/// real server's `Name` and `Age`.
#[tokio::test]
async fn a_crd_without_printer_columns_gets_name_and_age() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    crate::support::post_json(
        &client,
        "/apis/example.com/v1/namespaces/default/gadgets",
        &json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}),
    )
    .await
    .unwrap();
    let table = http::Request::get("/apis/example.com/v1/namespaces/default/gadgets")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(vec![])
        .unwrap();
    let table: Value = client.request(table).await.unwrap();
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["Name", "Age"]);
    assert_eq!(table["rows"][0]["cells"][0], "g");
}

/// Deleting a CRD deletes its instances first, as any client would (their own finalizers
/// honoured), while the CRD is `Terminating` and takes no new objects; once the last instance
/// is gone, so is the CRD. A Workspace whose operator never removes its finalizer keeps the CRD
/// terminating, as on a real cluster.
#[tokio::test]
async fn a_deleted_crd_removes_its_instances_first_and_honours_their_finalizers() {
    use crate::support::eventually;
    use std::time::Duration;
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get("workspaces.berth.dev").await.unwrap();
    assert_eq!(
        crd.metadata.finalizers.as_deref(),
        Some(&["customresourcecleanup.apiextensions.k8s.io".to_owned()][..])
    );
    raw_create(&client, workspace("plain", json!({"image": "x"})), "")
        .await
        .unwrap();
    let mut kept = workspace("kept", json!({"image": "x"}));
    kept["metadata"]["finalizers"] = json!(["berth.dev/cleanup"]);
    raw_create(&client, kept, "").await.unwrap();

    crds.delete("workspaces.berth.dev", &Default::default())
        .await
        .unwrap();
    let workspaces: Api<Workspace> = Api::namespaced(client.clone(), "default");
    eventually(
        Duration::from_secs(10),
        "the plain instance to go",
        || async {
            workspaces
                .get_opt("plain")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let terminating = crds.get("workspaces.berth.dev").await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let condition = terminating
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Terminating")
        .expect("a Terminating condition");
    assert_eq!(
        (
            condition.status.as_str(),
            condition.reason.as_deref(),
            condition.message.as_deref()
        ),
        (
            "True",
            Some("InstanceDeletionInProgress"),
            Some("CustomResource deletion is in progress")
        )
    );
    let stuck = workspaces.get("kept").await.unwrap();
    assert!(
        stuck.metadata.deletion_timestamp.is_some(),
        "deleted, waiting for its finalizer"
    );
    let (code, reason, message) =
        api_error(raw_create(&client, workspace("late", json!({"image": "x"})), "").await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (
            405,
            "MethodNotAllowed",
            "create not allowed while custom resource definition is terminating"
        )
    );

    // The operator's part: its finalizer goes, then the instance, then the definition.
    workspaces
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the CRD to go", || async {
        crds.get_opt("workspaces.berth.dev")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let gone = raw_create(&client, workspace("after", json!({"image": "x"})), "").await;
    assert_eq!(api_error(gone).0, 404, "no longer served");
}

/// A CRD's `scale` subresource is an autoscaling/v1 `Scale` over the paths it names, which
/// `kubectl scale` reads and writes; a write goes through the object's own validation.
#[tokio::test]
async fn the_scale_subresource_reads_and_writes_the_paths_the_crd_names() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool", "listKind": "PoolList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.ready", "labelSelectorPath": ".status.selector"}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "maximum": 10}}},
                    "status": {"type": "object", "properties": {"ready": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}
    });
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    crate::support::eventually(std::time::Duration::from_secs(5), "the CRD to be served", || {
        let client = client.clone();
        async move {
            crate::support::post_json(
                &client,
                "/apis/example.com/v1/namespaces/default/pools",
                &json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "p"}, "spec": {"size": 2}}),
            )
            .await
            .ok()
        }
    })
    .await;
    let path = "/apis/example.com/v1/namespaces/default/pools/p/scale";
    let get = |client: kube::Client| async move {
        client
            .request::<Value>(http::Request::get(path).body(vec![]).unwrap())
            .await
            .unwrap()
    };
    let scale = get(client.clone()).await;
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["replicas"], 0);

    let patched: Value = client
        .request(
            http::Request::patch(path)
                .header("content-type", "application/merge-patch+json")
                .body(serde_json::to_vec(&json!({"spec": {"replicas": 5}})).unwrap())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(patched["spec"]["replicas"], 5);
    let pool: Value = client
        .request(
            http::Request::get("/apis/example.com/v1/namespaces/default/pools/p")
                .body(vec![])
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(pool["spec"]["size"], 5, "written to specReplicasPath");

    let too_many = client
        .request::<Value>(
            http::Request::patch(path)
                .header("content-type", "application/merge-patch+json")
                .body(serde_json::to_vec(&json!({"spec": {"replicas": 50}})).unwrap())
                .unwrap(),
        )
        .await;
    let (code, _, message) = api_error(too_many);
    assert_eq!(code, 422);
    assert!(message.contains("spec.size"), "{message}");

    // kubectl scale, gated as the other kubectl tests.
    if let Some(kubectl) = crate::kubectl::Kubectl::for_cluster(&sim) {
        let out = kubectl.ok(&["scale", "pool/p", "--replicas=3"]).await;
        assert!(out.contains("pool.example.com/p scaled"), "{out}");
        assert_eq!(get(client.clone()).await["spec"]["replicas"], 3);
    }
}

/// A rule that fails to evaluate refuses the request (a real API server answers 422 with the
/// error and the rule's message), never stores the object.
#[tokio::test]
async fn a_rule_that_fails_to_evaluate_refuses_the_object() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "boxes.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "boxes", "singular": "box", "kind": "Box"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object",
                    "properties": {"size": {"type": "string"}},
                    "x-kubernetes-validations": [{"rule": "quantity(self.size).sign() > 0", "message": "size must be a positive quantity"}]}}
            }}}]}
    });
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    let body = json!({"apiVersion": "example.com/v1", "kind": "Box", "metadata": {"name": "b"}, "spec": {"size": "abc"}});
    let path = "/apis/example.com/v1/namespaces/default/boxes";
    let answer = crate::support::post_json(&client, path, &body).await;
    let (code, reason, message) = api_error(answer);
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert!(
        message.starts_with("Box.example.com \"b\" is invalid: spec: Invalid value: \"object\": ")
            && message.ends_with(" evaluating rule: size must be a positive quantity"),
        "{message}"
    );
}

/// A `format: date-time` field holds a time: anything else is the real validator's 422.
#[tokio::test]
async fn a_date_time_field_refuses_what_is_not_a_time() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    install_workspace_crd(&client).await;
    let workspaces: Api<Workspace> = Api::namespaced(client.clone(), "default");
    raw_create(&client, workspace("w", json!({"image": "a:1"})), "")
        .await
        .unwrap();
    let patch = |time: &str| Patch::Merge(json!({"status": {"lastActivity": time}}));
    let refused = workspaces
        .patch_status("w", &PatchParams::default(), &patch("not-a-date"))
        .await;
    let (code, reason, message) = api_error(refused);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.contains(
            "status.lastActivity: Invalid value: \"not-a-date\": status.lastActivity in body must be of type date-time: \"not-a-date\""
        ),
        "{message}"
    );
    workspaces
        .patch_status("w", &PatchParams::default(), &patch("2026-12-03T10:00:00Z"))
        .await
        .unwrap();
}

/// A change to a kind under test.
type Edit<'a> = Box<dyn FnOnce(&mut Value) + 'a>;

/// A kind with one image option `py312` and one pod option `small`, changed by `edit`.
fn kind(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut kind = json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "WorkspaceKind",
        "metadata": {"name": name},
        "spec": {
            "spawner": {"displayName": "Python"},
            "options": {
                "image": {"default": "py312", "values": [
                    {"id": "py312", "displayName": "Python 3.12", "spec": {"image": "ghcr.io/example/py:3.12", "ports": [{"name": "http", "port": 8888}]}}
                ]},
                "pod": {"default": "small", "values": [
                    {"id": "small", "displayName": "Small", "spec": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}}
                ]}
            },
            "home": {"mountPath": "/home/dev", "size": "10Gi"},
            "lifecycle": {"idleTimeout": "2h", "maxIdleTimeout": "8h"}
        }
    });
    edit(&mut kind);
    kind
}

/// What a platform team publishes is checked by the API server: a kind's default must be one
/// of its options, ids are unique, a redirect goes one hop to an option that does not redirect
/// (so no chain and no cycle), and an option's spec is checked as a Workspace's is. `kubectl
/// get wsk` shows the spawner's name, and `kubectl explain` documents the fields.
#[tokio::test]
async fn a_workspace_kind_is_refused_unless_its_options_hold_together() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &berth_api::crd::workspace_kind_crd(),
    )
    .await
    .unwrap();
    let kinds: Api<berth_api::WorkspaceKind> = Api::all(client.clone());
    let create = |kind: Value| {
        let kinds = kinds.clone();
        async move {
            kinds
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(kind).unwrap(),
                )
                .await
        }
    };
    let redirect = json!({"id": "py311", "displayName": "Python 3.11", "redirect": {"to": "py312", "message": "3.11 is end of life"}, "spec": {"image": "ghcr.io/example/py:3.11"}});
    create(kind("python", |k| {
        k["spec"]["options"]["image"]["values"]
            .as_array_mut()
            .unwrap()
            .push(redirect.clone())
    }))
    .await
    .expect("a kind whose options hold together");

    let refused: [(&str, Edit<'_>, &str); 6] = [
        (
            "no-default",
            Box::new(|k| k["spec"]["options"]["pod"]["default"] = json!("large")),
            "spec.options.pod: Invalid value: \"object\": default must be the id of one of the options in values",
        ),
        (
            "twice",
            Box::new(|k| {
                let same = k["spec"]["options"]["image"]["values"][0].clone();
                k["spec"]["options"]["image"]["values"]
                    .as_array_mut()
                    .unwrap()
                    .push(same)
            }),
            "spec.options.image: Invalid value: \"object\": each option's id must be unique",
        ),
        (
            "nowhere",
            Box::new(|k| {
                let mut gone = redirect.clone();
                gone["redirect"]["to"] = json!("py313");
                k["spec"]["options"]["image"]["values"]
                    .as_array_mut()
                    .unwrap()
                    .push(gone)
            }),
            "spec.options.image: Invalid value: \"object\": a redirect must name another option of the list that does not redirect itself (one hop: no chains, no cycles)",
        ),
        (
            "cycle",
            Box::new(|k| {
                let mut back = k["spec"]["options"]["image"]["values"][0].clone();
                back["redirect"] = json!({"to": "py311"});
                k["spec"]["options"]["image"]["values"] = json!([back, redirect.clone()]);
            }),
            "a redirect must name another option of the list that does not redirect itself",
        ),
        (
            "agent-port",
            Box::new(|k| {
                k["spec"]["options"]["image"]["values"][0]["spec"]["ports"] =
                    json!([{"name": "grpc", "port": 50051}])
            }),
            "ports: 50051 is the Berth agent's port in every workspace pod; pick another port",
        ),
        (
            "negative",
            Box::new(|k| {
                k["spec"]["options"]["pod"]["values"][0]["spec"]["resources"]["limits"] =
                    json!({"cpu": "-1"})
            }),
            "must not be negative",
        ),
    ];
    for (name, edit, words) in refused {
        let (code, reason, message) = api_error(create(kind(name, edit)).await);
        assert_eq!(
            (code, reason.as_str()),
            (422, "Invalid"),
            "{name}: {message}"
        );
        assert!(message.contains(words), "{name}: {message}");
    }

    if let Some(kubectl) = crate::kubectl::Kubectl::for_cluster(&sim) {
        let table = kubectl.ok(&["get", "wsk"]).await;
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            ["NAME", "DISPLAY-NAME", "WORKSPACES", "DEPRECATED", "AGE"]
        );
        assert!(
            table.lines().nth(1).unwrap().starts_with("python "),
            "{table}"
        );
        let explained = kubectl
            .ok(&["explain", "wsk.spec.options.image.values.redirect"])
            .await;
        assert!(
            explained.contains("applied at their next start, never behind their back"),
            "{explained}"
        );
    }
}

/// Server-side apply merges a custom resource's lists as its schema says: a `set` by value
/// and a `map` by its keys, each element owned by whoever applied it (kube-rs's
/// `crd_derive_schema`: another manager's `[3]` joins `[2]`); an atomic list is replaced.
#[tokio::test]
async fn apply_merges_sets_and_maps_of_a_custom_resource_as_its_schema_says() {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "shelves.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "shelves", "singular": "shelf", "kind": "Shelf"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": {
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}},
                    "atomic": {"type": "array", "items": {"type": "integer"}},
                    "books": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["shelf", "slot"],
                        "items": {"type": "object", "required": ["shelf", "slot"], "properties": {
                            "shelf": {"type": "string"}, "slot": {"type": "integer"}, "title": {"type": "string"}}}}
                }}}
            }}}]}
    });
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", "v1", "Shelf"),
        "shelves",
    );
    let shelves: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let apply = |manager: &'static str, spec: Value| {
        let shelves = shelves.clone();
        async move {
            let body = json!({"apiVersion": "example.com/v1", "kind": "Shelf", "metadata": {"name": "s"}, "spec": spec});
            shelves
                .patch(
                    "s",
                    &PatchParams::apply(manager).force(),
                    &Patch::Apply(&body),
                )
                .await
                .unwrap_or_else(|e| panic!("{manager} applying {body}: {e}"))
        }
    };
    apply(
        "first",
        json!({"tags": [2], "atomic": [2], "books": [{"shelf": "a", "slot": 1, "title": "Dune"}]}),
    )
    .await;
    let merged = apply(
        "second",
        json!({"tags": [3], "atomic": [3], "books": [{"shelf": "a", "slot": 2, "title": "Emma"}]}),
    )
    .await;
    assert_eq!(merged.data["spec"]["tags"], json!([2, 3]));
    assert_eq!(merged.data["spec"]["atomic"], json!([3]));
    assert_eq!(
        merged.data["spec"]["books"],
        json!([{"shelf": "a", "slot": 1, "title": "Dune"}, {"shelf": "a", "slot": 2, "title": "Emma"}])
    );
    let second = merged
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("second"))
        .unwrap();
    let fields = serde_json::to_value(second.fields_v1.unwrap()).unwrap();
    assert_eq!(fields["f:spec"]["f:tags"]["v:3"], json!({}), "{fields}");
    assert!(
        fields["f:spec"]["f:books"]["k:{\"shelf\":\"a\",\"slot\":2}"].is_object(),
        "{fields}"
    );
    // What a manager stops applying goes; what another owns stays.
    let after = apply("second", json!({"atomic": [3]})).await;
    assert_eq!(after.data["spec"]["tags"], json!([2]));
    assert_eq!(
        after.data["spec"]["books"],
        json!([{"shelf": "a", "slot": 1, "title": "Dune"}])
    );
}

/// Validation ratcheting (API servers since 1.30): a rule added to a CRD after an object was
/// stored does not refuse a write that leaves the part it checks as it was (a status write
/// never changes the spec; a change of one field of the spec leaves another's rule alone), and
/// refuses one that changes it; a transition rule (reading `oldSelf`) is never ratcheted.
#[tokio::test]
async fn rules_on_unchanged_fields_are_ratcheted_except_transition_rules() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // `level_rules`: none when the object is stored, the level's own rule after.
    let crd = |rules: Value, level_rules: Value| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gauges.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "gauges", "singular": "gauge", "kind": "Gauge"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {
                                "level": {"type": "integer", "x-kubernetes-validations": level_rules},
                                "label": {"type": "string"}},
                            "x-kubernetes-validations": rules},
                        "status": {"type": "object", "properties": {"note": {"type": "string"}}}
                    }}}}]}
        })
    };
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd(json!([]), json!([]))).unwrap(),
    )
    .await
    .unwrap();
    let resource = kube::api::ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Gauge".into(),
        plural: "gauges".into(),
    };
    let gauges: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &resource);
    let body = json!({"apiVersion": "example.com/v1", "kind": "Gauge", "metadata": {"name": "g"}, "spec": {"level": 10, "label": "a"}});
    gauges
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    let replace_rules = |rules: Value| {
        let crds = crds.clone();
        async move {
            let level = json!([{"rule": "self < 8", "message": "level must be under 8"}]);
            let patch = json!({"spec": crd(rules, level)["spec"].clone()});
            crds.patch(
                "gauges.example.com",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
        }
    };
    let note = |text: &str| json!({"status": {"note": text}});
    // The level's own rule (added with the CRD's first change below) leaves a change of the
    // label alone.
    let label = |text: &str| json!({"spec": {"label": text}});
    replace_rules(json!([])).await;
    let written = gauges
        .patch("g", &PatchParams::default(), &Patch::Merge(&label("b")))
        .await
        .unwrap();
    assert_eq!(written.data["spec"]["label"], "b");
    let (code, _, message) = api_error(
        gauges
            .patch(
                "g",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"level": 9}})),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("level must be under 8"), "{message}");

    let plain = json!([{"rule": "self.level < 5", "message": "level must be under 5"}]);
    replace_rules(plain.clone()).await;

    // The spec is as it was: its new rule's error is ratcheted.
    let written = gauges
        .patch_status("g", &PatchParams::default(), &Patch::Merge(&note("one")))
        .await
        .unwrap();
    assert_eq!(written.data["status"]["note"], "one");
    // A change of the spec runs it.
    let (code, reason, message) = api_error(
        gauges
            .patch("g", &PatchParams::default(), &Patch::Merge(&label("c")))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert!(message.contains("level must be under 5"), "{message}");

    // A transition rule runs on an unchanged spec too.
    let mut both = plain.as_array().unwrap().clone();
    both.push(json!({"rule": "self.label != oldSelf.label", "message": "label must change on every write"}));
    replace_rules(json!(both)).await;
    let (code, reason, message) = api_error(
        gauges
            .patch_status("g", &PatchParams::default(), &Patch::Merge(&note("two")))
            .await,
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"), "{message}");
    assert!(
        message.contains("label must change on every write")
            && !message.contains("level must be under 5"),
        "{message}"
    );
}
