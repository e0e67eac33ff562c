//! Admission: the refusals a real API server makes after validation — the ServiceAccount
//! plugin and ResourceQuota — with its words.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, ResourceQuota, Service};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

use crate::support::{api_error, cluster, pod, post_json};

fn pod_with(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

#[tokio::test]
async fn a_pod_whose_service_account_does_not_exist_is_refused() {
    let sim = cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.client().await.unwrap(), "default");
    let refused = pods
        .create(
            &PostParams::default(),
            &pod_with(
                "p",
                json!({"serviceAccountName": "nope", "containers": [{"name": "c", "image": "x:1"}]}),
            ),
        )
        .await;
    assert_eq!(
        api_error(refused),
        (
            403,
            "Forbidden".into(),
            "pods \"p\" is forbidden: error looking up service account default/nope: serviceaccount \"nope\" not found".into()
        )
    );
}

#[tokio::test]
async fn a_resource_quota_refuses_pods_past_its_hard_limits() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "compute"},
                "spec": {"hard": {"count/pods": "2", "requests.cpu": "1", "requests.memory": "1Gi"}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let sized = |name: &str, cpu: &str| {
        pod_with(
            name,
            json!({"containers": [{"name": "c", "image": "x:1", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]}),
        )
    };
    // A pod that does not say what it requests cannot be counted.
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &pod("bare", "web")).await),
        (
            403,
            "Forbidden".into(),
            "pods \"bare\" is forbidden: failed quota: compute: must specify requests.cpu for: main; requests.memory for: main".into()
        )
    );
    pods.create(&PostParams::default(), &sized("a", "600m"))
        .await
        .unwrap();
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &sized("b", "500m")).await),
        (
            403,
            "Forbidden".into(),
            "pods \"b\" is forbidden: exceeded quota: compute, requested: requests.cpu=500m, used: requests.cpu=600m, limited: requests.cpu=1".into()
        )
    );
    pods.create(&PostParams::default(), &sized("b", "400m"))
        .await
        .unwrap();
    assert_eq!(
        api_error(pods.create(&PostParams::default(), &sized("c", "0")).await).2,
        "pods \"c\" is forbidden: exceeded quota: compute, requested: count/pods=1, used: count/pods=2, limited: count/pods=2"
    );
    // Room again once a pod is gone.
    pods.delete(
        "a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    pods.create(&PostParams::default(), &sized("c", "100m"))
        .await
        .unwrap();
}

#[tokio::test]
async fn names_labels_annotations_env_names_port_names_and_quantities_follow_the_real_rules() {
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let container = json!({"name": "c", "image": "x:1"});
    let labelled = |labels: serde_json::Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels}, "spec": {"containers": [container.clone()]}})).unwrap()
    };
    let long = "a".repeat(64);
    let (code, _, message) = api_error(
        pods.create(
            &PostParams::default(),
            &labelled(json!({"berth.dev/workspace": long})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains(&format!(
            "metadata.labels: Invalid value: \"{long}\": must be no more than 63 characters"
        )),
        "{message}"
    );
    let (_, _, message) = api_error(
        pods.create(&PostParams::default(), &labelled(json!({"bad key!": "x"})))
            .await,
    );
    assert!(
        message.contains("name part must consist of alphanumeric characters"),
        "{message}"
    );

    let huge = "x".repeat(256 * 1024);
    let annotated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "big", "annotations": {"a": huge}}}))
            .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (code, _, message) = api_error(configmaps.create(&PostParams::default(), &annotated).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.annotations: Too long: may not be more than 262144 bytes"),
        "{message}"
    );

    let with = |container: serde_json::Value| -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": [container]}}),
        )
        .unwrap()
    };
    let (code, _, message) = api_error(
        pods.create(
            &PostParams::default(),
            &with(json!({"name": "c", "image": "x:1", "env": [{"name": "1BAD", "value": "x"}]})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.containers[0].env[0].name: Invalid value: \"1BAD\": a valid environment variable name"),
        "{message}"
    );
    let (_, _, message) = api_error(
        pods.create(
            &PostParams::default(),
            &with(json!({"name": "c", "image": "x:1", "ports": [{"name": "a-very-long-port-name", "containerPort": 80}]})),
        )
        .await,
    );
    assert!(
        message.contains("spec.containers[0].ports[0].name: Invalid value: \"a-very-long-port-name\": must be no more than 15 characters"),
        "{message}"
    );
    let (code, _, message) = api_error(
        pods.create(
            &PostParams::default(),
            &with(json!({"name": "c", "image": "x:1", "resources": {"requests": {"cpu": "lots"}}})),
        )
        .await,
    );
    assert_eq!(code, 400);
    assert!(
        message.contains("quantities must match the regular expression"),
        "{message}"
    );

    // Service names are DNS-1035 labels; selectors are label values.
    let services: Api<Service> = Api::namespaced(client, "default");
    let service = |name: &str, selector: &str| -> Service {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selector": {"app": selector}, "ports": [{"port": 80}]}})).unwrap()
    };
    let (code, _, message) = api_error(
        services
            .create(&PostParams::default(), &service("1abc", "x"))
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("a DNS-1035 label must consist of"),
        "{message}"
    );
    let (_, _, message) = api_error(
        services
            .create(&PostParams::default(), &service("ok", &long))
            .await,
    );
    assert!(
        message.contains("spec.selector: Invalid value"),
        "{message}"
    );
}

#[tokio::test]
async fn a_bound_claim_may_only_grow_and_grows_through_resizing() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::{Patch, PatchParams};
    let sim = crate::support::cluster_with_nodes().await;
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(sim.client().await.unwrap(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "home"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let capacity = |c: &PersistentVolumeClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.clone())
    };
    crate::support::eventually(std::time::Duration::from_secs(10), "bound", || async {
        capacity(&claims.get("home").await.unwrap()).filter(|c| c == "1Gi")
    })
    .await;
    let patch = |body: serde_json::Value| {
        let claims = claims.clone();
        async move {
            claims
                .patch("home", &PatchParams::default(), &Patch::Merge(&body))
                .await
        }
    };
    let (code, _, message) =
        api_error(patch(json!({"spec": {"resources": {"requests": {"storage": "500Mi"}}}})).await);
    assert_eq!(code, 422);
    assert!(
        message.contains(
            "spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
        ),
        "{message}"
    );
    let (_, _, message) = api_error(patch(json!({"spec": {"storageClassName": "other"}})).await);
    assert!(
        message.contains("spec is immutable after creation"),
        "{message}"
    );

    let grown = patch(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}))
        .await
        .unwrap();
    assert_eq!(capacity(&grown).as_deref(), Some("1Gi"));
    crate::support::eventually(std::time::Duration::from_secs(10), "grown", || async {
        capacity(&claims.get("home").await.unwrap()).filter(|c| c == "2Gi")
    })
    .await;
}

/// Built-in types decode like the real server: with `fieldValidation=Strict` (what kubectl
/// sends) an unknown field at any depth is a 400 naming it; with `Warn` the object is
/// created with a warning; without, the field is dropped; never is it stored.
#[tokio::test]
async fn unknown_fields_of_built_in_types_are_refused_when_strict_and_never_stored() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pod_with_typos = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"bogus": true, "containers": [{"name": "c", "image": "x:1", "ports": [{"containerPort": 80, "protocl": "TCP"}]}]}})
    };
    assert_eq!(
        api_error(
            post_json(
                &client,
                "/api/v1/namespaces/default/pods?fieldValidation=Strict",
                &pod_with_typos("strict")
            )
            .await
        ),
        (
            400,
            "BadRequest".into(),
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.bogus\", unknown field \"spec.containers[0].ports[0].protocl\"".into()
        )
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert!(pods.get_opt("strict").await.unwrap().is_none());
    for (name, query, warned) in [
        ("warned", "?fieldValidation=Warn", true),
        ("ignored", "?fieldValidation=Ignore", false),
        ("default", "", true),
    ] {
        let body = serde_json::to_vec(&pod_with_typos(name)).unwrap();
        let request = http::Request::post(format!("/api/v1/namespaces/default/pods{query}"))
            .header("content-type", "application/json")
            .body(kube::client::Body::from(body))
            .unwrap();
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 201, "{name}");
        let warnings: Vec<&str> = response
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        assert_eq!(
            warnings
                .iter()
                .any(|w| w.contains(r#"unknown field \"spec.bogus\""#)),
            warned,
            "{name}: {warnings:?}"
        );
        let stored: serde_json::Value = client
            .request(
                http::Request::get(format!("/api/v1/namespaces/default/pods/{name}"))
                    .body(vec![])
                    .unwrap(),
            )
            .await
            .unwrap();
        assert!(stored["spec"].get("bogus").is_none(), "{name}: {stored}");
        let port = &stored["spec"]["containers"][0]["ports"][0];
        assert!(port.get("protocl").is_none(), "{name}");
        assert_eq!(port["containerPort"], 80);
    }
}

/// `null` and absent are the same for built-in types: nothing is stored as null, so a client
/// that drops nulls and writes the object back changes nothing.
#[tokio::test]
async fn nulls_in_built_in_objects_are_absent() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "nully", "labels": null, "annotations": {"a": "1"}},
        "spec": {"volumes": null, "initContainers": null, "nodeSelector": null,
            "containers": [{"name": "c", "image": "x:1", "ports": null, "env": null, "command": null}]}});
    let created = post_json(&client, "/api/v1/namespaces/default/pods", &body)
        .await
        .unwrap();
    fn nulls(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Null => found.push(path.to_owned()),
            serde_json::Value::Object(map) => map
                .iter()
                .for_each(|(k, v)| nulls(v, &format!("{path}.{k}"), found)),
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, v)| nulls(v, &format!("{path}[{i}]"), found)),
            _ => {}
        }
    }
    let mut found = vec![];
    nulls(&created, "", &mut found);
    assert!(found.is_empty(), "stored nulls: {found:?}");
    // A typed client's round trip is accepted as it is.
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pod = pods.get("nully").await.unwrap();
    pods.replace("nully", &PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Enumerations are checked with the real message and the supported values as the real server
/// lists them.
#[tokio::test]
async fn enumerated_fields_refuse_unsupported_values_in_the_real_words() {
    use k8s_openapi::api::core::v1::Service;

    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let container = |extra: serde_json::Value| {
        let mut c = json!({"name": "c", "image": "x:1"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    for (spec, field, value, supported) in [
        (
            json!({"restartPolicy": "Sometimes", "containers": [container(json!({}))]}),
            "spec.restartPolicy",
            "Sometimes",
            "\"Always\", \"Never\", \"OnFailure\"",
        ),
        (
            json!({"containers": [container(json!({"imagePullPolicy": "Sometimes"}))]}),
            "spec.containers[0].imagePullPolicy",
            "Sometimes",
            "\"Always\", \"IfNotPresent\", \"Never\"",
        ),
        (
            json!({"containers": [container(json!({"ports": [{"containerPort": 80, "protocol": "HTTP"}]}))]}),
            "spec.containers[0].ports[0].protocol",
            "HTTP",
            "\"SCTP\", \"TCP\", \"UDP\"",
        ),
        (
            json!({"containers": [container(json!({}))], "tolerations": [{"operator": "Maybe"}]}),
            "spec.tolerations[0].operator",
            "Maybe",
            "\"Equal\", \"Exists\"",
        ),
    ] {
        assert_eq!(
            api_error(
                pods.create(&PostParams::default(), &pod_with("e", spec))
                    .await
            ),
            (
                422,
                "Invalid".into(),
                format!(
                    "Pod \"e\" is invalid: {field}: Unsupported value: \"{value}\": supported values: {supported}"
                )
            )
        );
    }
    let services: Api<Service> = Api::namespaced(client, "default");
    let service: Service = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "spec": {"type": "Internal", "ports": [{"port": 80}]}}),
    )
    .unwrap();
    assert_eq!(
        api_error(services.create(&PostParams::default(), &service).await),
        (
            422,
            "Invalid".into(),
            "Service \"s\" is invalid: spec.type: Unsupported value: \"Internal\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"".into()
        )
    );
}

/// Immutable config maps and secrets, a service's cluster IP and ports, secret data and TLS
/// secrets' keys, with the real server's answers.
#[tokio::test]
async fn immutability_and_the_shape_of_secrets_and_services_are_enforced() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};

    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let post = PostParams::default();

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let frozen: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"a": "1"}}),
    )
    .unwrap();
    maps.create(&post, &frozen).await.unwrap();
    let mut changed = maps.get("frozen").await.unwrap();
    changed.data = Some([("a".to_owned(), "2".to_owned())].into());
    assert_eq!(
        api_error(maps.replace("frozen", &post, &changed).await),
        (422, "Invalid".into(), "ConfigMap \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set".into())
    );
    let mut thawed = maps.get("frozen").await.unwrap();
    thawed.immutable = Some(false);
    assert_eq!(
        api_error(maps.replace("frozen", &post, &thawed).await),
        (422, "Invalid".into(), "ConfigMap \"frozen\" is invalid: immutable: Forbidden: field is immutable when `immutable` is set".into())
    );

    let raw_secret = |body: serde_json::Value| {
        let client = client.clone();
        async move { post_json(&client, "/api/v1/namespaces/default/secrets", &body).await }
    };
    assert_eq!(
        api_error(raw_secret(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "plain"}, "data": {"k": "not base64!"}})).await),
        (400, "BadRequest".into(), "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at input byte 3".into())
    );
    assert_eq!(
        api_error(raw_secret(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}})).await),
        (422, "Invalid".into(), "Secret \"tls\" is invalid: data[tls.key]: Required value".into())
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    assert!(secrets.get_opt("plain").await.unwrap().is_none());

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let portless: Service = serde_json::from_value(
        json!({"metadata": {"name": "portless"}, "spec": {"selector": {"a": "b"}}}),
    )
    .unwrap();
    assert_eq!(
        api_error(services.create(&post, &portless).await),
        (
            422,
            "Invalid".into(),
            "Service \"portless\" is invalid: spec.ports: Required value".into()
        )
    );
    let headless: Service = serde_json::from_value(
        json!({"metadata": {"name": "headless"}, "spec": {"clusterIP": "None", "selector": {"a": "b"}}}),
    )
    .unwrap();
    services.create(&post, &headless).await.unwrap();
    let web: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .unwrap();
    let created = services.create(&post, &web).await.unwrap();
    let allocated = created.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
    // A replace without the cluster IP keeps it; one with another IP is refused.
    let mut without = created.clone();
    without.spec.as_mut().unwrap().cluster_ip = None;
    without.spec.as_mut().unwrap().cluster_ips = None;
    let kept = services.replace("web", &post, &without).await.unwrap();
    assert_eq!(
        kept.spec.unwrap().cluster_ip.as_deref(),
        Some(allocated.as_str())
    );
    let mut moved = services.get("web").await.unwrap();
    moved.spec.as_mut().unwrap().cluster_ip = Some("10.96.200.200".into());
    assert_eq!(
        api_error(services.replace("web", &post, &moved).await),
        (422, "Invalid".into(), "Service \"web\" is invalid: spec.clusterIP: Invalid value: \"10.96.200.200\": field is immutable".into())
    );
}

/// events.k8s.io/v1 is stricter than core/v1, as on a real server: an Event must say when,
/// who reported it (controller and instance), its action and reason, and leave the
/// deprecated core fields unset. What kube's `Recorder` sends passes.
#[tokio::test]
async fn events_k8s_io_events_need_their_reporter_time_and_action() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let path = "/apis/events.k8s.io/v1/namespaces/default/events";
    let refused = post_json(
        &client,
        path,
        &json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "bare"},
            "type": "Normal", "reason": "Started", "deprecatedCount": 3,
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}),
    )
    .await;
    let (code, _, message) = api_error(refused);
    assert_eq!(code, 422);
    assert_eq!(
        message,
        "Event.events.k8s.io \"bare\" is invalid: [eventTime: Required value, reportingController: Required value, reportingInstance: Required value, action: Required value, deprecatedCount: Invalid value: \"\": needs to be unset]"
    );
    let accepted = post_json(
        &client,
        path,
        &json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "full"},
            "type": "Normal", "reason": "Started", "action": "Start", "note": "started",
            "eventTime": "2026-12-02T10:00:00.000000Z",
            "reportingController": "example.com/ctl", "reportingInstance": "ctl-0",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}),
    )
    .await;
    assert!(accepted.is_ok(), "{accepted:?}");

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "berth".into(),
            instance: None,
        },
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = pods
        .create(&PostParams::default(), &pod("p", "web"))
        .await
        .unwrap();
    recorder
        .publish(
            &Event {
                type_: EventType::Warning,
                reason: "Tested".into(),
                note: Some("kube's recorder".into()),
                action: "Test".into(),
                secondary: None,
            },
            &kube::Resource::object_ref(&pod, &()),
        )
        .await
        .expect("what kube's Recorder sends is valid");
}

/// A webhook behind a Service is called at a ready pod of that Service; without one, the
/// write fails closed in the API server's words.
#[tokio::test]
async fn a_service_webhook_without_a_ready_endpoint_refuses_in_the_real_words() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "hooks"},
        "webhooks": [{
            "name": "maps.example.com",
            "clientConfig": {"service": {"name": "hook", "namespace": "default", "path": "/check"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 3,
            "admissionReviewVersions": ["v1"]
        }]
    });
    post_json(
        &client,
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        &configuration,
    )
    .await
    .unwrap();
    let maps: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let map = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    };
    let failed = |why: &str| {
        format!(
            "Internal error occurred: failed calling webhook \"maps.example.com\": failed to call webhook: Post \"https://hook.default.svc:443/check?timeout=3s\": {why}"
        )
    };
    let (code, _, message) = api_error(maps.create(&PostParams::default(), &map("a")).await);
    assert_eq!((code, message), (500, failed("service \"hook\" not found")));

    let services: Api<Service> = Api::default_namespaced(client.clone());
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "hook"}, "spec": {
                "selector": {"app": "hook"}, "ports": [{"port": 443, "targetPort": 8443}]}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let (code, _, message) = api_error(maps.create(&PostParams::default(), &map("b")).await);
    assert_eq!(
        (code, message),
        (500, failed("no endpoints available for service \"hook\""))
    );
}

/// Event times are kept as the real server keeps them: MicroTime to the microsecond, Time to
/// the second, in UTC; a time that does not parse is the decoder's 400.
#[tokio::test]
async fn event_times_are_normalised_as_the_real_server_keeps_them() {
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let event = |name: &str, event_time: &str| {
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name},
            "type": "Normal", "reason": "Started", "action": "Start", "note": "started",
            "eventTime": event_time, "series": {"count": 2, "lastObservedTime": "2026-12-02T10:00:05.5+02:00"},
            "reportingController": "example.com/ctl", "reportingInstance": "ctl-0",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}})
    };
    let path = "/apis/events.k8s.io/v1/namespaces/default/events";
    let created = post_json(
        &client,
        path,
        &event("precise", "2026-12-02T10:00:00.123456789Z"),
    )
    .await
    .unwrap();
    assert_eq!(created["eventTime"], "2026-12-02T10:00:00.123456Z");
    assert_eq!(
        created["series"]["lastObservedTime"],
        "2026-12-02T08:00:05.500000Z"
    );
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(client.clone());
    let seen = serde_json::to_value(core.get("precise").await.unwrap()).unwrap();
    assert_eq!(seen["eventTime"], "2026-12-02T10:00:00.123456Z");
    let (code, _, message) =
        api_error(post_json(&client, path, &event("vague", "yesterday")).await);
    assert_eq!(code, 400);
    assert!(message.contains("parsing time \"yesterday\""), "{message}");
}
