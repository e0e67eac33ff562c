//! Berth's derived names, labels and pods checked against the real API server's rules, as the
//! sim enforces them: here rather than in `berth-core`, whose tests need no simulator (they
//! run for every mutant of the core).

use berth_api::{Workspace, labels};
use berth_sim::validation::*;
use kube::ResourceExt;
use serde_json::json;

use crate::config::AgentConfig;
use crate::pod::{build_claim, build_pod, build_service, claim_name, pod_name, service_name};

/// A workspace as the API server would return it.
fn workspace(name: &str, spec: serde_json::Value) -> Workspace {
    serde_json::from_value(json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}"), "generation": 1},
        "spec": spec
    }))
    .expect("a valid workspace")
}

/// Each name Berth derives from a workspace name, per kind.
fn derived_names(workspace: &str) -> [(&'static str, String); 4] {
    [
        ("pod", pod_name(workspace)),
        ("claim", claim_name(workspace)),
        ("service", service_name(workspace)),
        ("label", labels::workspace_label_value(workspace)),
    ]
}

/// A workspace name as the API server accepts one (a DNS-1123 subdomain of at most 253
/// characters), reaching the lengths where derived names are cut.
fn workspace_names() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let label = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?";
    (
        proptest::collection::vec(label, 1..6),
        proptest::sample::select(vec![
            1usize, 60, 61, 62, 63, 64, 200, 247, 248, 249, 250, 251, 253,
        ]),
    )
        .prop_map(|(labels, want)| {
            let mut name = labels.join(".");
            // Grow to about `want` characters with letters, keeping the name valid.
            while name.len() < want {
                name.push('x');
            }
            name.truncate(253);
            name.trim_end_matches(['-', '.']).to_owned()
        })
        .prop_filter("a valid workspace name", |n| {
            !n.is_empty() && check_subdomain("name", n).is_none()
        })
}

proptest::proptest! {
    /// Two workspace names of a namespace never derive the same name of any kind: a name
    /// used as it is is shorter than the kind's limit, a cut or mapped one is exactly that
    /// long and carries a hash of the full name. The second name is also the hardest one
    /// an attacker could pick: the first's derived name spelled as a workspace name.
    #[test]
    fn derived_names_never_collide(a in workspace_names(), b in workspace_names()) {
        let attacks: Vec<String> = derived_names(&a)
            .into_iter()
            .map(|(_, n)| n.trim_end_matches("-ws").trim_end_matches("-home").to_owned())
            .filter(|n| check_subdomain("name", n).is_none())
            .collect();
        for other in attacks.iter().chain([&b]).filter(|o| **o != a) {
            for ((kind, mine), (_, theirs)) in derived_names(&a).into_iter().zip(derived_names(other)) {
                proptest::prop_assert_ne!(&mine, &theirs, "{} names of {:?} and {:?}", kind, a, other);
            }
        }
    }
}

/// Every rule a real API server applies to what Berth derives from `ws`: object names per
/// kind, label keys and values, the service selector, container, volume and port names, and
/// environment variable names. The rules are the sim's, which enforces them too.
fn derived_violations(ws: &Workspace) -> Vec<String> {
    let mut causes = vec![];
    let pod = serde_json::to_value(build_pod(ws, &AgentConfig::default())).unwrap();
    let name = ws.name_any();
    causes.extend(check_subdomain("pod", &pod_name(&name)));
    causes.extend(check_subdomain("claim", &claim_name(&name)));
    causes.extend(check_dns1035_label("service", &service_name(&name)));
    let mut labelled = vec![pod["metadata"]["labels"].clone()];
    if let Some(claim) = build_claim(ws) {
        labelled.push(serde_json::to_value(claim).unwrap()["metadata"]["labels"].clone());
    }
    if let Some(service) = build_service(ws) {
        let service = serde_json::to_value(service).unwrap();
        labelled.push(service["metadata"]["labels"].clone());
        labelled.push(service["spec"]["selector"].clone());
    }
    for labels in labelled {
        for (key, value) in labels.as_object().unwrap() {
            causes.extend(check_qualified_name("label", key));
            causes.extend(check_label_value("label", value.as_str().unwrap()));
        }
    }
    for volume in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        causes.extend(check_dns1123_label(
            "volume",
            volume["name"].as_str().unwrap(),
        ));
    }
    for list in ["initContainers", "containers"] {
        for container in pod["spec"][list].as_array().into_iter().flatten() {
            causes.extend(check_dns1123_label(
                "container",
                container["name"].as_str().unwrap(),
            ));
            for port in container["ports"].as_array().into_iter().flatten() {
                causes.extend(check_port_name("port", port["name"].as_str().unwrap()));
            }
            for env in container["env"].as_array().into_iter().flatten() {
                causes.extend(check_env_var_name("env", env["name"].as_str().unwrap()));
            }
        }
    }
    causes
        .into_iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect()
}

#[test]
fn a_253_character_name_and_a_leading_digit_derive_valid_names_and_labels() {
    let long = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    for name in [long.as_str(), "1abc", "9.dots.in.name", "x"] {
        let ws = workspace(
            name,
            json!({"image": "x:1", "ports": [{"name": "http", "port": 80}],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"}}}}),
        );
        assert_eq!(derived_violations(&ws), Vec::<String>::new(), "{name}");
    }
    // The label names the workspace when it can, and the ownerReference always does.
    let ws = workspace(&long, json!({"image": "x:1"}));
    let pod = build_pod(&ws, &AgentConfig::default());
    assert_eq!(pod.labels()[labels::WORKSPACE].len(), 63);
    assert_eq!(pod.owner_references()[0].name, long);
}

proptest::proptest! {
    #[test]
    fn every_derived_name_and_label_is_valid_for_its_kind(
        name in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?){0,3}",
        port_name in "[a-z]{1,3}(-?[a-z0-9]){0,6}",
        env_name in "[-._a-zA-Z][-._a-zA-Z0-9]{0,20}",
    ) {
        let ws = workspace(&name, json!({"image": "x:1", "command": ["sleep", "1"],
            "env": [{"name": env_name, "value": "v"}],
            "ports": [{"name": port_name, "port": 8080}],
            "podTemplate": {"volumes": {"home": {"size": "1Gi", "mountPath": "/h"},
                "secrets": [{"secretName": "s", "mountPath": "/s"}], "data": [{"claimName": "d", "mountPath": "/d"}]}}}));
        proptest::prop_assert_eq!(derived_violations(&ws), Vec::<String>::new());
    }

}
