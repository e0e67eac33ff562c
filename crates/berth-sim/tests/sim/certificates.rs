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
