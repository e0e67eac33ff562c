//! CertificateSigningRequests through clients nobody here wrote: kubectl (the oldest and the
//! newest) creates, approves and reads them, and the certificate the controller manager's
//! signer issues is a user the API server accepts; kube-rs approves through `/approval` as
//! kube's own cluster test does.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use crate::{
    kubectl::Kubectl,
    support::{api_error, cluster, eventually},
};

const WAIT: Duration = Duration::from_secs(15);

/// A new key and a certificate request for `cn` in the organization `o`, both PEM.
fn key_and_request(cn: &str, o: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, o);
    let request = params.serialize_request(&key).unwrap().pem().unwrap();
    (key.serialize_pem(), request)
}

fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn csr_yaml(name: &str, request: &str, usages: &str) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  request: {}\n  signerName: kubernetes.io/kube-apiserver-client\n  expirationSeconds: 86400\n  usages: {usages}\n  username: someone-else\n",
        b64(request)
    )
}

/// The rows of a table kubectl printed, split on whitespace.
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

#[tokio::test]
async fn a_request_approved_with_kubectl_becomes_a_client_certificate_the_server_accepts() {
    let sim = cluster().await;
    for version in ["1.27", "1.33"] {
        let Some(kubectl) = Kubectl::version(&sim, version) else {
            return;
        };
        let name = format!("alice-{}", version.replace('.', "-"));
        let (key, request) = key_and_request("alice", "developers");
        kubectl
            .apply_stdin(
                &["create", "-f", "-"],
                &csr_yaml(&name, &request, "[client auth]"),
            )
            .await;
        // The server says who asked, whatever the client wrote.
        let table = kubectl.ok(&["get", "csr", &name]).await;
        let shown = rows(&table);
        assert_eq!(
            shown[0],
            [
                "NAME",
                "AGE",
                "SIGNERNAME",
                "REQUESTOR",
                "REQUESTEDDURATION",
                "CONDITION"
            ],
            "{table}"
        );
        assert_eq!(
            shown[1][2..],
            [
                "kubernetes.io/kube-apiserver-client",
                "kubernetes-admin",
                "24h",
                "Pending"
            ],
            "{table}"
        );

        // bob may read and update approvals, but not approve for this signer.
        kubectl
            .apply_stdin(
                &["apply", "-f", "-"],
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: csr-updater}\nrules:\n- apiGroups: [certificates.k8s.io]\n  resources: [certificatesigningrequests, certificatesigningrequests/approval]\n  verbs: [get, list, update]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: bob-csr-updater}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-updater}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}]\n",
            )
            .await;
        let refused = kubectl
            .fails(&["certificate", "approve", &name, "--as=bob"])
            .await;
        assert!(
            refused.contains(&format!("certificatesigningrequests.certificates.k8s.io \"{name}\" is forbidden: user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\"")),
            "kubectl {version}: {refused}"
        );

        let approved = kubectl.ok(&["certificate", "approve", &name]).await;
        assert_eq!(
            approved.trim(),
            format!("certificatesigningrequest.certificates.k8s.io/{name} approved")
        );
        let certificate = eventually(WAIT, "the signer to issue the certificate", || async {
            let issued = kubectl
                .ok(&["get", "csr", &name, "-o", "jsonpath={.status.certificate}"])
                .await;
            (!issued.trim().is_empty()).then_some(issued)
        })
        .await;
        let table = kubectl.ok(&["get", "csr", &name]).await;
        assert_eq!(rows(&table)[1][5], "Approved,Issued", "{table}");
        let reason = kubectl
            .ok(&[
                "get",
                "csr",
                &name,
                "-o",
                "jsonpath={.status.conditions[0].reason}",
            ])
            .await;
        assert_eq!(reason, "KubectlApprove");

        // The certificate is alice, of the group developers, to the API server.
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: alice\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: alice\n  context: {{cluster: sim, user: alice, namespace: default}}\ncurrent-context: alice\n",
            sim.url(),
            b64(sim.ca_pem()),
            certificate.trim(),
            b64(&key)
        );
        let alice = kubectl.with_kubeconfig(&kubeconfig);
        let forbidden = alice.fails(&["get", "pods"]).await;
        assert!(
            forbidden.contains("pods is forbidden: User \"alice\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\""),
            "kubectl {version}: {forbidden}"
        );
        kubectl
            .ok(&[
                "create",
                "rolebinding",
                &format!("developers-{name}"),
                "--clusterrole=view",
                "--group=developers",
            ])
            .await;
        alice.ok(&["get", "pods"]).await;
        kubectl
            .ok(&["delete", "rolebinding", &format!("developers-{name}")])
            .await;

        // A client certificate may not be for serving: the signer fails it, in its words.
        let server = format!("{name}-server");
        let (_, request) = key_and_request("alice", "developers");
        kubectl
            .apply_stdin(
                &["create", "-f", "-"],
                &csr_yaml(&server, &request, "[server auth]"),
            )
            .await;
        kubectl.ok(&["certificate", "approve", &server]).await;
        let message = eventually(WAIT, "the signer to refuse", || async {
            let said = kubectl
                .ok(&[
                    "get",
                    "csr",
                    &server,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Failed\")].message}",
                ])
                .await;
            (!said.is_empty()).then_some(said)
        })
        .await;
        assert_eq!(message, "invalid usage for client certificate: server auth");
        let table = kubectl.ok(&["get", "csr", &server]).await;
        assert_eq!(rows(&table)[1][5], "Approved,Failed", "{table}");
        // Denying what is approved is refused by kubectl, and the approval cannot be taken back.
        let denied = kubectl.fails(&["certificate", "deny", &server]).await;
        assert!(
            denied.contains("is already Approved"),
            "kubectl {version}: {denied}"
        );
    }
}

#[tokio::test]
async fn a_request_that_is_not_one_is_refused_in_the_servers_words() {
    let sim = cluster().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(sim.client().await.unwrap());
    let bad: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "spec": {"request": b64("not a request"), "signerName": "example", "usages": [], "expirationSeconds": 60}
    }))
    .unwrap();
    let (code, reason, message) = api_error(csrs.create(&PostParams::default(), &bad).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    for said in [
        "spec.request: Invalid value: []byte{0x6e, 0x6f, 0x74, 0x20, 0x61, 0x20, 0x72, 0x65, 0x71, 0x75, 0x65, 0x73, 0x74}: PEM block type must be CERTIFICATE REQUEST",
        "spec.usages: Required value",
        "spec.signerName: Invalid value: \"example\": must be a fully qualified domain and path of the form 'example.com/signer-name'",
        "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)",
    ] {
        assert!(message.contains(said), "{said} in {message}");
    }
}

/// kube's own cluster test (`csr_can_be_approved`): any condition type may be added through
/// `/approval` with a merge patch, and read back through it; status cannot be created.
#[tokio::test]
async fn kube_rs_approves_through_the_approval_subresource() {
    let sim = cluster().await;
    let csrs: Api<CertificateSigningRequest> = Api::all(sim.client().await.unwrap());
    let (_, request) = key_and_request("fake", "example");
    let created = csrs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "fake"},
                "spec": {"request": b64(&request), "signerName": "kubernetes.io/kube-apiserver-client", "expirationSeconds": 86400, "usages": ["client auth"]},
                "status": {"conditions": [{"type": "Approved", "status": "True"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        created.status.is_none(),
        "no pre-approved requests: {created:?}"
    );
    assert_eq!(created.spec.username.as_deref(), Some("kubernetes-admin"));

    let patch = Patch::Merge(
        json!({"status": {"conditions": [{"type": "ApprovedFake", "status": "True", "reason": "kube-rsClient", "message": "ApprovedFake by kube-rs client"}]}}),
    );
    csrs.patch_approval("fake", &Default::default(), &patch)
        .await
        .unwrap();
    let after = csrs.get_approval("fake").await.unwrap();
    let conditions = after.status.unwrap().conditions.unwrap();
    assert_eq!(conditions[0].type_, "ApprovedFake");
    assert!(conditions[0].last_update_time.is_some());

    // Approved and Denied together are refused; an approval cannot be removed.
    let both = Patch::Merge(
        json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]}}),
    );
    let (code, _, message) = api_error(
        csrs.patch_approval("fake", &Default::default(), &both)
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("Approved and Denied conditions are mutually exclusive"),
        "{message}"
    );
    let approve = Patch::Merge(
        json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test"}]}}),
    );
    csrs.patch_approval("fake", &Default::default(), &approve)
        .await
        .unwrap();
    let remove = Patch::Merge(json!({"status": {"conditions": []}}));
    let (code, _, message) = api_error(
        csrs.patch_approval("fake", &Default::default(), &remove)
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("updates may not remove a condition of type \"Approved\""),
        "{message}"
    );
    csrs.delete("fake", &DeleteParams::default()).await.unwrap();
}

/// The written kubeconfig carries a client certificate of the cluster's CA, as kubeadm's
/// `admin.conf` does: a client that brings its own TLS stack and no token (kube's
/// `custom_client_openssl_tls_configuration`) is the superuser by it alone.
#[tokio::test]
async fn the_written_kubeconfig_is_the_superuser_by_its_certificate_alone() {
    let sim = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    let mut kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let user = kubeconfig.auth_infos[0].auth_info.as_mut().unwrap();
    assert!(user.client_certificate_data.is_some());
    user.token = None;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::default_namespaced(client.clone());
    pods.list(&Default::default()).await.unwrap();
    let review: k8s_openapi::api::authentication::v1::SelfSubjectReview = Api::all(client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some("kubernetes-admin"));
    assert_eq!(
        user.groups.unwrap(),
        ["system:masters", "system:authenticated"]
    );
}

/// Every served group version is a local APIService, a CRD's versions too (automanaged,
/// gone with the CRD); kube's `group_discovery_oneshot` finds and lists them.
#[tokio::test]
async fn served_group_versions_are_listed_as_local_api_services() {
    use kube::core::DynamicObject;
    let sim = cluster().await;
    let client = sim.client().await.unwrap();
    let group = kube::discovery::group(&client, "apiregistration.k8s.io")
        .await
        .unwrap();
    let (resource, _) = group.recommended_kind("APIService").unwrap();
    let services: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let names = |list: Vec<DynamicObject>| -> Vec<String> {
        list.into_iter().filter_map(|s| s.metadata.name).collect()
    };
    let listed = names(services.list(&Default::default()).await.unwrap().items);
    for name in [
        "v1.",
        "v1.apps",
        "v1.batch",
        "v1.certificates.k8s.io",
        "v1.apiregistration.k8s.io",
    ] {
        assert!(listed.iter().any(|n| n == name), "{name} in {listed:?}");
    }
    let core = services.get("v1.").await.unwrap();
    assert_eq!(core.data["status"]["conditions"][0]["reason"], "Local");

    crate::support::install_workspace_crd(&client).await;
    let crd = services.get("v1alpha1.berth.dev").await.unwrap();
    assert_eq!(
        crd.metadata.labels.unwrap()["kube-aggregator.kubernetes.io/automanaged"],
        "true"
    );
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.delete("workspaces.berth.dev", &DeleteParams::default())
        .await
        .unwrap();
    eventually(WAIT, "the CRD's APIService to go", || async {
        services
            .get_opt("v1alpha1.berth.dev")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    // Clients cannot make their own (the aggregation layer is not served).
    let (code, _, _) = api_error(
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": "v1.example.com"}, "spec": {"group": "example.com", "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15}})).unwrap(),
            )
            .await,
    );
    assert_eq!(code, 405);
}
