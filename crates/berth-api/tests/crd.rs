//! The Workspace CRD as the API server will see it: the committed YAML is what the code
//! generates, it parses as a CustomResourceDefinition, and it carries every constraint and
//! CEL rule of the design, which refuse bad specs with messages a person can act on.

use berth_api::crd::{WORKSPACE_CRD_PATH, workspace_crd, workspace_crd_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

fn committed_crd_text() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(WORKSPACE_CRD_PATH);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {WORKSPACE_CRD_PATH}: {e}"))
}

/// The openAPIV3Schema of the served version, as JSON.
fn schema() -> Value {
    let crd = serde_json::to_value(workspace_crd()).unwrap();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Walks `properties` (and `items` for `[]`) down a dotted path such as
/// `spec.podTemplate.volumes.secrets[].mountPath`.
fn at(schema: &Value, path: &str) -> Value {
    let mut node = schema.clone();
    for part in path.split('.') {
        let (name, is_list) = match part.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (part, false),
        };
        node = node["properties"][name].clone();
        assert!(
            !node.is_null(),
            "schema has no field {path} (stuck at {part})"
        );
        if is_list {
            node = node["items"].clone();
        }
    }
    node
}

fn rules(node: &Value) -> Vec<(String, String)> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_owned(),
                        r["message"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn committed_crd_matches_the_code() {
    let generated = workspace_crd_yaml().unwrap();
    assert!(
        committed_crd_text() == generated,
        "{WORKSPACE_CRD_PATH} is out of date with the Rust types; regenerate it with:\n    cargo run -- crd > {WORKSPACE_CRD_PATH}"
    );
}

#[test]
fn committed_crd_parses_as_a_custom_resource_definition() {
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&committed_crd_text()).unwrap();
    assert_eq!(crd.metadata.name.as_deref(), Some("workspaces.berth.dev"));
    assert_eq!(crd.spec.group, "berth.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "Workspace");
    assert_eq!(crd.spec.names.plural, "workspaces");
    assert_eq!(crd.spec.names.singular.as_deref(), Some("workspace"));
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["ws".to_owned()][..])
    );
    assert_eq!(crd.spec.versions.len(), 1);
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.served);
    assert!(version.storage);
    let subresources = version.subresources.as_ref().expect("subresources");
    assert!(subresources.status.is_some(), "status subresource");
    assert!(subresources.scale.is_none());
}

#[test]
fn printer_columns_are_phase_ready_message_update_age_and_wide_kind_pod_node_recreations_last_active()
 {
    let crd = workspace_crd();
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap();
    let summary: Vec<(String, String, i32)> = columns
        .iter()
        .map(|c| (c.name.clone(), c.json_path.clone(), c.priority.unwrap_or(0)))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("Phase".into(), ".status.phase".into(), 0),
            (
                "Ready".into(),
                r#".status.conditions[?(@.type=="Ready")].status"#.into(),
                0
            ),
            ("Message".into(), ".status.summary".into(), 0),
            ("Update".into(), ".status.pendingRestart".into(), 0),
            ("Age".into(), ".metadata.creationTimestamp".into(), 0),
            ("Kind".into(), ".spec.kind".into(), 1),
            ("Pod".into(), ".status.pod.name".into(), 1),
            ("Node".into(), ".status.pod.nodeName".into(), 1),
            ("Recreations".into(), ".status.podRecreations".into(), 1),
            ("Last-Active".into(), ".status.lastActivity".into(), 1),
        ]
    );
}

#[test]
fn every_field_has_a_description_for_kubectl_explain() {
    fn walk(node: &Value, path: &str, missing: &mut Vec<String>) {
        if let Some(props) = node["properties"].as_object() {
            for (name, child) in props {
                let child_path = format!("{path}.{name}");
                if child["description"].as_str().unwrap_or("").is_empty()
                    && !path.ends_with("metadata")
                {
                    missing.push(child_path.clone());
                }
                walk(child, &child_path, missing);
            }
        }
        if node["items"].is_object() {
            walk(&node["items"], &format!("{path}[]"), missing);
        }
    }
    let mut missing = vec![];
    let kind = serde_json::to_value(berth_api::crd::workspace_kind_crd()).unwrap();
    let kind = &kind["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for (root, name) in [(&schema(), "Workspace"), (kind, "WorkspaceKind")] {
        walk(
            &root["properties"]["spec"],
            &format!("{name} spec"),
            &mut missing,
        );
        walk(
            &root["properties"]["status"],
            &format!("{name} status"),
            &mut missing,
        );
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:?}"
    );
}

#[test]
fn spec_constraints_are_in_the_schema() {
    let s = schema();
    // The image is required unless a kind gives it (a rule: the two are exclusive).
    assert!(s["properties"]["spec"]["required"].is_null());
    let rules = s["properties"]["spec"]["x-kubernetes-validations"].to_string();
    assert!(
        rules.contains("has(self.kind) || has(self.image)"),
        "{rules}"
    );

    let image = at(&s, "spec.image");
    assert_eq!(image["minLength"], json!(1));

    let port = at(&s, "spec.ports[].port");
    assert_eq!(
        (port["minimum"].as_f64(), port["maximum"].as_f64()),
        (Some(1.0), Some(65535.0))
    );
    // A container port name: at most 15 characters, no double hyphen (an IANA service name).
    let port_name = at(&s, "spec.ports[].name");
    assert_eq!(port_name["pattern"], json!("^[a-z0-9](-?[a-z0-9])*$"));
    assert_eq!(port_name["maxLength"], json!(15));

    let env_name = at(&s, "spec.env[].name");
    assert_eq!(env_name["pattern"], json!("^[-._a-zA-Z][-._a-zA-Z0-9]*$"));
    assert_eq!(at(&s, "spec.env")["maxItems"], json!(256));

    for path in [
        "spec.podTemplate.volumes.secrets[].secretName",
        "spec.podTemplate.volumes.data[].claimName",
        "spec.serviceAccountName",
    ] {
        let node = at(&s, path);
        assert_eq!(
            node["pattern"],
            json!(berth_api::workspace::DNS1123_SUBDOMAIN_PATTERN),
            "{path}"
        );
        assert_eq!(node["maxLength"], json!(253), "{path}");
    }

    let mode = at(&s, "spec.podTemplate.volumes.secrets[].defaultMode");
    assert_eq!(
        (mode["minimum"].as_f64(), mode["maximum"].as_f64()),
        (Some(0.0), Some(511.0))
    );

    for path in [
        "spec.lifecycle.startTimeout",
        "spec.lifecycle.podRecreation.delay",
    ] {
        assert_eq!(
            at(&s, path)["pattern"],
            json!(berth_api::duration::DURATION_PATTERN),
            "{path}"
        );
    }

    let max = at(&s, "spec.lifecycle.podRecreation.maxRecreations");
    assert_eq!(
        (max["minimum"].as_f64(), max["maximum"].as_f64()),
        (Some(0.0), Some(20.0))
    );

    for path in [
        "spec.ports",
        "spec.podTemplate.volumes.data",
        "spec.podTemplate.volumes.secrets",
    ] {
        assert!(
            at(&s, path)["maxItems"].as_u64().is_some(),
            "{path} needs maxItems to bound CEL cost"
        );
    }
}

#[test]
fn cel_rules_are_in_the_schema_with_messages() {
    let s = schema();
    for path in [
        "spec.podTemplate.volumes.home.mountPath",
        "spec.podTemplate.volumes.data[].mountPath",
        "spec.podTemplate.volumes.secrets[].mountPath",
    ] {
        let found = rules(&at(&s, path));
        assert_eq!(found.len(), 8, "{path}: {found:?}");
        assert_eq!(
            found[..2],
            [
                (
                    "self.startsWith('/')".to_owned(),
                    "mountPath must be an absolute path (start with '/')".to_owned()
                ),
                (
                    "!self.matches('(^|/)[.][.](/|$)')".to_owned(),
                    "mountPath must not contain a '..' segment".to_owned()
                ),
            ],
            "{path}"
        );
    }
    let volume_rules = rules(&at(&s, "spec.podTemplate.volumes"));
    assert_eq!(volume_rules.len(), 3);
    assert!(
        volume_rules
            .iter()
            .all(|(_, message)| message.contains("each mountPath must be unique"))
    );

    let port_rules = rules(&at(&s, "spec.ports"));
    let messages: Vec<&str> = port_rules.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(
        messages,
        [
            "ports: 50051 is the Berth agent's port in every workspace pod; pick another port",
            "each port name must be unique",
            "each port number must be unique",
            "each port name must contain at least one letter (a-z), as Kubernetes requires of container port names"
        ]
    );
}

/// The CEL rules do what their messages say, evaluated by kube-cel as the API server would.
mod cel_semantics {
    use super::*;

    fn spec_schema() -> Value {
        schema()["properties"]["spec"].clone()
    }

    fn errors(spec: Value) -> Vec<String> {
        match kube_cel::validate(&spec_schema(), &spec, None) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
        }
    }

    fn with_volumes(volumes: Value) -> Value {
        json!({"image": "devbox:1", "podTemplate": {"volumes": volumes}})
    }

    #[test]
    fn a_good_spec_passes() {
        let spec = json!({
            "image": "devbox:1",
            "ports": [{"name": "http", "port": 8080}, {"name": "ssh", "port": 22}],
            "podTemplate": {"volumes": {
                "home": {"size": "10Gi", "mountPath": "/home/dev"},
                "data": [{"claimName": "shared", "mountPath": "/data"}],
                "secrets": [{"secretName": "git", "mountPath": "/secrets/git"}, {"secretName": "npm", "mountPath": "/secrets/npm"}]
            }}
        });
        assert_eq!(errors(spec), Vec::<String>::new());
    }

    #[test]
    fn a_relative_mount_path_is_refused() {
        let errs = errors(with_volumes(
            json!({"secrets": [{"secretName": "git", "mountPath": "secrets/git"}]}),
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("mountPath must be an absolute path"),
            "{errs:?}"
        );
        assert!(
            errs[0].contains("secrets[0].mountPath"),
            "names the field: {errs:?}"
        );
    }

    #[test]
    fn a_dot_dot_segment_is_refused_but_dots_in_names_are_not() {
        let errs = errors(with_volumes(
            json!({"data": [{"claimName": "x", "mountPath": "/data/../etc"}]}),
        ));
        assert!(
            errs.iter()
                .any(|e| e.contains("must not contain a '..' segment")),
            "{errs:?}"
        );
        assert!(
            errors(with_volumes(
                json!({"data": [{"claimName": "x", "mountPath": "/data/..cache/v1.2"}]})
            ))
            .is_empty()
        );
    }

    #[test]
    fn duplicate_mount_paths_are_refused_across_home_data_and_secrets() {
        let cases = [
            json!({"home": {"size": "1Gi", "mountPath": "/work"}, "data": [{"claimName": "x", "mountPath": "/work"}]}),
            json!({"home": {"size": "1Gi", "mountPath": "/work"}, "secrets": [{"secretName": "x", "mountPath": "/work"}]}),
            json!({"data": [{"claimName": "x", "mountPath": "/d"}, {"claimName": "y", "mountPath": "/d"}]}),
            json!({"data": [{"claimName": "x", "mountPath": "/d"}], "secrets": [{"secretName": "y", "mountPath": "/d"}]}),
            json!({"secrets": [{"secretName": "x", "mountPath": "/s"}, {"secretName": "y", "mountPath": "/s"}]}),
        ];
        for volumes in cases {
            let errs = errors(with_volumes(volumes.clone()));
            assert_eq!(errs.len(), 1, "{volumes}: {errs:?}");
            assert!(
                errs[0].contains("each mountPath must be unique"),
                "{errs:?}"
            );
        }
    }

    #[test]
    fn duplicate_port_names_and_numbers_are_refused() {
        let errs = errors(
            json!({"image": "x", "ports": [{"name": "http", "port": 80}, {"name": "http", "port": 81}]}),
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("each port name must be unique"));
        let errs = errors(
            json!({"image": "x", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}),
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("each port number must be unique"));
        let errs = errors(json!({"image": "x", "ports": [{"name": "8080", "port": 80}]}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("must contain at least one letter"));
    }

    /// A token or password in a repository URL would be stored for anyone who may read the
    /// Workspace: refused, pointing at the Secret; an ssh user name is no credential.
    #[test]
    fn credentials_in_a_git_url_are_refused_pointing_at_a_secret() {
        let content = |url: &str| {
            json!({"image": "x", "content": {"git": {"url": url}},
                "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/home/dev"}}}})
        };
        for url in [
            "https://ghp_abc@github.com/org/app.git",
            "https://alice:s3cret@github.com/org/app.git",
            "http://oauth2:tok@host/r.git",
            "git://me@host/r.git",
            "ssh://git:pw@host/r.git",
        ] {
            let errs = errors(content(url));
            assert_eq!(errs.len(), 1, "{url}: {errs:?}");
            assert!(
                errs[0].contains("spec.content.git.auth.secretName")
                    || errs[0].contains("auth.secretName"),
                "{url}: {errs:?}"
            );
            assert!(errs[0].contains("url"), "names the field: {errs:?}");
        }
        for url in [
            "https://github.com/org/app.git",
            "ssh://git@host/org/app.git",
            "git@github.com:org/app.git",
            "https://host/path@2/app.git",
        ] {
            assert_eq!(errors(content(url)), Vec::<String>::new(), "{url}");
        }
    }

    /// A container's resource claims name the pod's, and a workspace pod has none.
    #[test]
    fn resource_claims_are_refused() {
        let errs = errors(json!({"image": "x", "resources": {"claims": [{"name": "gpu"}]}}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("resources.claims: a workspace's pod has no resource claims"),
            "{errs:?}"
        );
        assert!(errors(json!({"image": "x", "resources": {"requests": {"cpu": "1"}}})).is_empty());
    }

    fn errors_after(old: Value, new: Value) -> Vec<String> {
        match kube_cel::validate(&spec_schema(), &new, Some(&old)) {
            Ok(()) => vec![],
            Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn the_home_claim_can_grow_but_never_shrink_or_change_class() {
        let home = |size: &str, class: Option<&str>| {
            let mut home = json!({"size": size, "mountPath": "/home/dev"});
            if let Some(class) = class {
                home["storageClassName"] = json!(class);
            }
            with_volumes(json!({"home": home}))
        };
        let old = home("10Gi", Some("fast"));
        assert_eq!(
            errors_after(old.clone(), home("20Gi", Some("fast"))),
            Vec::<String>::new()
        );
        assert_eq!(
            errors_after(old.clone(), home("10240Mi", Some("fast"))),
            Vec::<String>::new()
        );
        let shrunk = errors_after(old.clone(), home("5Gi", Some("fast")));
        assert_eq!(shrunk.len(), 1, "{shrunk:?}");
        assert!(shrunk[0].contains("home.size cannot shrink"), "{shrunk:?}");
        let moved = errors_after(old, home("10Gi", Some("slow")));
        assert!(
            moved[0].contains("home.storageClassName cannot change"),
            "{moved:?}"
        );
        // A new home volume is not a transition.
        assert_eq!(errors(home("1Gi", None)), Vec::<String>::new());
    }

    #[test]
    fn the_agents_berth_variables_are_refused_in_env() {
        let errs =
            errors(json!({"image": "x", "env": [{"name": "BERTH_AGENT_AUTH", "value": "none"}]}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains(
                "environment variables starting with BERTH_ are reserved for the Berth agent"
            ),
            "{errs:?}"
        );
        assert_eq!(
            errors(json!({"image": "x", "env": [{"name": "EDITOR", "value": "vim"}]})),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_idle_timeout_is_a_duration_longer_than_zero() {
        let idle = |timeout: &str| json!({"image": "x", "lifecycle": {"idleTimeout": timeout}});
        for good in ["30m", "2h", "1m30s", "0.5s"] {
            assert_eq!(errors(idle(good)), Vec::<String>::new(), "{good}");
        }
        for zero in ["0s", "0m0s", "00ms"] {
            let errs = errors(idle(zero));
            assert_eq!(errs.len(), 1, "{zero}: {errs:?}");
            assert!(
                errs[0].contains("idleTimeout must be longer than 0s"),
                "{errs:?}"
            );
        }
        let pattern = at(&schema(), "spec.lifecycle.idleTimeout")["pattern"].clone();
        assert_eq!(pattern, json!(berth_api::duration::DURATION_PATTERN));
    }

    /// No rule of the schema fails to evaluate on a bad value: each one is a message that
    /// names the field, never an evaluation error (which a real API server also refuses, in
    /// words nobody can act on).
    fn refused_with(spec: Value, expected: &str) {
        let errs = errors(spec.clone());
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "{spec}: {errs:?} lacks {expected:?}"
        );
        assert!(
            errs.iter().all(|e| !e.contains("evaluation error")),
            "{spec}: {errs:?}"
        );
    }

    fn resources(resources: Value) -> Value {
        json!({"image": "devbox:1", "resources": resources})
    }

    #[test]
    fn resources_are_quantities_with_limits_at_least_their_requests() {
        let good = resources(json!({
            "requests": {"cpu": "500m", "memory": "1Gi", "example.com/gpu": 1},
            "limits": {"cpu": 2, "memory": "2Gi", "example.com/gpu": "1"}
        }));
        assert_eq!(errors(good), Vec::<String>::new());
        assert_eq!(
            errors(resources(json!({"limits": {"memory": "0"}}))),
            Vec::<String>::new()
        );
        let rows = [
            (
                json!({"requests": {"cpu": "abc"}}),
                "resources.requests.cpu: must be a quantity, such as 500m, 2 or 2Gi",
            ),
            (
                json!({"limits": {"memory": "lots"}}),
                "resources.limits.memory: must be a quantity",
            ),
            (
                json!({"requests": {"cpu": "-1"}}),
                "resources.requests.cpu: must not be negative",
            ),
            (
                json!({"limits": {"memory": "-1Gi"}}),
                "resources.limits.memory: must not be negative",
            ),
            (
                json!({"limits": {"cpu": -2}}),
                "resources.limits.cpu: must not be negative",
            ),
            (
                json!({"requests": {"cpu": "200m"}, "limits": {"cpu": "100m"}}),
                "resources.limits[cpu] must be at least resources.requests[cpu]",
            ),
            (
                json!({"requests": {"memory": "2Gi"}, "limits": {"memory": "1024Mi"}}),
                "resources.limits[memory] must be at least resources.requests[memory]",
            ),
            (
                json!({"requests": {"ephemeral-storage": "2Gi"}, "limits": {"ephemeral-storage": "1Gi"}}),
                "resources.limits[ephemeral-storage] must be at least",
            ),
            (
                json!({"requests": {"example.com/gpu": "1"}}),
                "resources.limits[example.com/gpu] must be set, equal to its request: it cannot be overcommitted",
            ),
            (
                json!({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}),
                "resources.limits[example.com/gpu] must be equal to resources.requests[example.com/gpu]",
            ),
            (
                json!({"requests": {"hugepages-2Mi": "2Mi"}}),
                "resources.limits[hugepages-2Mi] must be set",
            ),
            (
                json!({"requests": {"example.com/gpu": "500m"}, "limits": {"example.com/gpu": "500m"}}),
                "resources.requests[example.com/gpu] must be a whole number, such as 1",
            ),
        ];
        for (bad, message) in rows {
            refused_with(resources(bad), message);
        }
    }

    #[test]
    fn the_home_size_is_a_quantity_greater_than_zero() {
        let home =
            |size: Value| with_volumes(json!({"home": {"size": size, "mountPath": "/home/dev"}}));
        for bad in [json!("abc"), json!("0"), json!("-1Gi"), json!(0), json!("")] {
            refused_with(
                home(bad),
                "home.size must be a quantity greater than zero, such as 10Gi",
            );
        }
        assert_eq!(errors(home(json!(1073741824))), Vec::<String>::new());
        // Growing from a size that was never a quantity is a message too, not an error.
        let errs = errors_after(home(json!("abc")), home(json!("1Gi")));
        assert_eq!(errs, Vec::<String>::new());
        let errs = errors_after(home(json!("1Gi")), home(json!("abc")));
        assert!(
            errs.iter().all(|e| !e.contains("evaluation error")),
            "{errs:?}"
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
    }

    #[test]
    fn the_agents_port_is_refused() {
        let ports = json!({"image": "x", "ports": [{"name": "grpc", "port": berth_api::workspace::AGENT_PORT}]});
        refused_with(
            ports,
            "ports: 50051 is the Berth agent's port in every workspace pod",
        );
    }

    #[test]
    fn a_mount_path_over_the_token_the_agent_or_the_root_is_refused() {
        let secret_at = |path: &str| {
            with_volumes(json!({"secrets": [{"secretName": "git", "mountPath": path}]}))
        };
        let rows = [
            (
                "/",
                "mountPath must not be / (the container's whole filesystem)",
            ),
            ("//", "mountPath must not be /"),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount",
                "mountPath must not be /var/run/secrets/kubernetes.io/serviceaccount or below it (the service-account token Kubernetes mounts)",
            ),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/",
                "or below it",
            ),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "or below it",
            ),
            (
                "/run/secrets/kubernetes.io/serviceaccount",
                "/run/secrets/kubernetes.io/serviceaccount or below it",
            ),
            (
                "/opt/berth",
                "mountPath must not be /opt/berth or below it (the Berth agent's binary)",
            ),
            ("//opt//berth/bin", "/opt/berth or below it"),
            (
                "/etc/berth/agent-tls",
                "mountPath must not be /etc/berth or below it (the Berth agent's TLS files and content credentials)",
            ),
            ("/opt/./berth", "mountPath must not contain a '.' segment"),
        ];
        for (path, message) in rows {
            refused_with(secret_at(path), message);
        }
        for fine in [
            "/opt",
            "/var/run",
            "/opt/berthold",
            "/etc",
            "/home/dev/.config",
            "/srv/a.b",
        ] {
            assert_eq!(errors(secret_at(fine)), Vec::<String>::new(), "{fine}");
        }
        for (dir, _) in berth_api::workspace::RESERVED_DIRS {
            refused_with(
                with_volumes(json!({"home": {"size": "1Gi", "mountPath": dir}})),
                "or below it",
            );
        }
    }

    #[test]
    fn an_env_var_has_a_value_or_a_value_from_not_both() {
        let var = |var: Value| json!({"image": "x", "env": [var]});
        refused_with(
            var(
                json!({"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
            ),
            "env: a variable has a value or a valueFrom, not both",
        );
        assert_eq!(
            errors(var(
                json!({"name": "A", "value": "", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})
            )),
            Vec::<String>::new()
        );
    }
}

/// Every field of the spec that names another object of the namespace is one of
/// `WorkspaceSpec::references()` (what the admission policy checks and the operator keeps
/// closed while it is absent): walked in the schema, so a field added later without being
/// listed fails here. Names that reach nothing of another's are listed with why.
#[test]
fn every_field_naming_another_object_is_a_reference() {
    fn walk(node: &Value, path: String, found: &mut Vec<String>) {
        if let Some(properties) = node["properties"].as_object() {
            for (name, child) in properties {
                let here = format!("{path}.{name}");
                let names_an_object =
                    name.ends_with("Name") || name.ends_with("Ref") || name.ends_with("Refs");
                if names_an_object {
                    found.push(here.clone());
                }
                walk(child, here, found);
            }
        }
        if node["items"].is_object() {
            walk(&node["items"], path, found);
        }
    }
    let mut named = vec![];
    walk(
        &schema()["properties"]["spec"],
        "spec".to_owned(),
        &mut named,
    );
    // Not another object: the pod's own containers and fields, classes anyone may use.
    let not_objects = [
        ".fieldRef",         // a field of the pod itself (downward API)
        ".resourceFieldRef", // a container's own resources
        ".containerName",    // a container of the pod itself
        ".storageClassName", // a cluster-wide class: anyone who may create a claim uses it
    ];
    let named: Vec<String> = named
        .into_iter()
        .filter(|p| !not_objects.iter().any(|n| p.ends_with(n)))
        .collect();
    let everything: berth_api::WorkspaceSpec = serde_json::from_value(json!({
        "image": "x:1",
        "serviceAccountName": "deployer",
        "env": [
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
        ],
        "podTemplate": {"volumes": {
            "home": {"size": "1Gi", "mountPath": "/home/dev"},
            "data": [{"claimName": "d", "mountPath": "/data"}],
            "secrets": [{"secretName": "v", "mountPath": "/keys"}]
        }},
        "content": {"git": {"url": "https://h/r.git", "auth": {"secretName": "g"}}}
    }))
    .unwrap();
    // `spec.env[1].valueFrom.secretKeyRef` is the schema's `spec.env.valueFrom.secretKeyRef`.
    let referenced: Vec<String> = everything
        .references()
        .iter()
        .map(|r| berth_api::workspace::Reference::unindexed(&r.field))
        .collect();
    for field in &named {
        let covered = referenced
            .iter()
            .any(|r| r == field || field.starts_with(&format!("{r}.")));
        assert!(
            covered,
            "{field} names another object but is not one of WorkspaceSpec::references() {referenced:?}: add it there (and to deploy/admission/workspaces-policy.yaml)"
        );
    }
    assert!(named.len() >= 6, "the walk found the fields: {named:?}");
}
