//! certificates.k8s.io/v1 CertificateSigningRequests as the API server and the controller
//! manager keep them: the requester's identity written by the server, the request validated
//! (a PEM `CERTIFICATE REQUEST` whose signature holds, a signer, usages, a duration), approval
//! through `/approval` only for those allowed to `approve` for the signer, and the signer of
//! the controller manager issuing approved `kubernetes.io/kube-apiserver-client` and kubelet
//! requests from the cluster's CA, whose certificates the API server then accepts.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use crate::{
    auth::{self, Attributes, Identity},
    error::{ApiError, Cause},
    meta::now_rfc3339,
    sim::{Sim, WriteContext},
    store::{Change, ChangeKind, Store},
};

pub const CSRS: &str = "certificates.k8s.io/certificatesigningrequests";
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
const LEGACY_SIGNER: &str = "kubernetes.io/legacy-unknown";
/// The controller manager's `--cluster-signing-duration` default: a year.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The usages the API accepts (`certificates.KeyUsage`).
const USAGES: [&str; 23] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

fn cause(reason: &str, field: &str, message: String) -> Cause {
    Cause {
        reason: reason.to_owned(),
        message,
        field: field.to_owned(),
    }
}

/// Go's `%#v` of a byte slice, as field errors print an invalid `[]byte` value.
fn go_bytes(bytes: &[u8]) -> String {
    let each: Vec<String> = bytes.iter().map(|b| format!("0x{b:x}")).collect();
    format!("[]byte{{{}}}", each.join(", "))
}

/// The request's bytes (the JSON form is base64).
fn request_bytes(csr: &Value) -> Vec<u8> {
    use base64::Engine;
    csr["spec"]["request"]
        .as_str()
        .and_then(|r| base64::engine::general_purpose::STANDARD.decode(r).ok())
        .unwrap_or_default()
}

/// The first PEM block of `bytes`, parsed as a certificate request whose signature holds, as
/// the API server's `ParseCSR` does.
fn parse_request(bytes: &[u8]) -> Result<rcgen::CertificateSigningRequestParams, String> {
    use rustls::pki_types::pem::{PemObject, SectionKind};
    let der = match <(SectionKind, Vec<u8>)>::from_pem_slice(bytes) {
        Ok((SectionKind::Csr, der)) => der,
        _ => return Err("PEM block type must be CERTIFICATE REQUEST".to_owned()),
    };
    let der = rustls::pki_types::CertificateSigningRequestDer::from(der);
    rcgen::CertificateSigningRequestParams::from_der(&der).map_err(|error| match error {
        rcgen::Error::InvalidCertificationRequestSignature => {
            "x509: signature verification failed".to_owned()
        }
        other => format!("asn1: structure error: {other}"),
    })
}

/// What the server writes on create, whatever the client sent: who asked, and no status
/// ("users cannot create pre-approved certificate requests").
pub fn on_create(csr: &mut Value, user: &Identity) {
    let spec = &mut csr["spec"];
    if let Some(map) = spec.as_object_mut() {
        for field in ["username", "uid", "groups", "extra"] {
            map.remove(field);
        }
    }
    spec["username"] = json!(user.username);
    if !user.uid.is_empty() {
        spec["uid"] = json!(user.uid);
    }
    spec["groups"] = json!(user.groups);
    if let Some(map) = csr.as_object_mut() {
        map.remove("status");
    }
}

/// An update as the strategies take it: the object itself keeps its spec and status; `status`
/// keeps the spec and the approval; `approval` takes only the conditions.
pub fn merge(current: &Value, body: &Value, subresource: &str) -> Value {
    match subresource {
        "approval" => {
            let mut new = current.clone();
            new["status"]["conditions"] = stamped(&body["status"]["conditions"], current);
            new
        }
        "status" => {
            let mut new = current.clone();
            new["status"] = body["status"].clone();
            let decided: Vec<Value> = conditions(current)
                .into_iter()
                .filter(|c| matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .collect();
            let mut kept: Vec<Value> = conditions(&new)
                .into_iter()
                .filter(|c| !matches!(c["type"].as_str(), Some("Approved" | "Denied")))
                .collect();
            kept.extend(decided);
            new["status"]["conditions"] = stamped(&Value::Array(kept), current);
            drop_empty_status(&mut new);
            new
        }
        _ => {
            let mut new = body.clone();
            new["spec"] = current["spec"].clone();
            crate::meta::carry(&mut new, "status", current.get("status"));
            new
        }
    }
}

fn drop_empty_status(csr: &mut Value) {
    if csr["status"]["conditions"]
        .as_array()
        .is_some_and(Vec::is_empty)
        && let Some(status) = csr["status"].as_object_mut()
    {
        status.remove("conditions");
    }
    if csr["status"].as_object().is_some_and(|s| s.is_empty())
        && let Some(map) = csr.as_object_mut()
    {
        map.remove("status");
    }
}

fn conditions(csr: &Value) -> Vec<Value> {
    csr["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Conditions with their times filled in where the client left them out; a condition that
/// was there before keeps its transition time.
fn stamped(list: &Value, current: &Value) -> Value {
    let now = now_rfc3339();
    let before = conditions(current);
    let mut out = list.as_array().cloned().unwrap_or_default();
    for condition in &mut out {
        if condition["lastUpdateTime"].is_null() {
            condition["lastUpdateTime"] = json!(now);
        }
        if condition["lastTransitionTime"].is_null() {
            let kept = before
                .iter()
                .find(|c| c["type"] == condition["type"] && c["status"] == condition["status"])
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map(str::to_owned);
            condition["lastTransitionTime"] = json!(kept.unwrap_or_else(|| now.clone()));
        }
    }
    Value::Array(out)
}

/// What the real validation refuses in any CSR (`ValidateCertificateSigningRequestCreate`).
pub fn validate(csr: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let spec = &csr["spec"];
    let request = request_bytes(csr);
    if let Err(error) = parse_request(&request) {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.request",
            format!("Invalid value: {}: {error}", go_bytes(&request)),
        ));
    }
    let usages: Vec<&str> = spec["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if usages.is_empty() {
        causes.push(cause(
            "FieldValueRequired",
            "spec.usages",
            "Required value".to_owned(),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, usage) in usages.iter().enumerate() {
        let field = format!("spec.usages[{i}]");
        if !USAGES.contains(usage) {
            let supported: Vec<String> = USAGES.iter().map(|u| format!("\"{u}\"")).collect();
            causes.push(cause(
                "FieldValueNotSupported",
                &field,
                format!(
                    "Unsupported value: \"{usage}\": supported values: {}",
                    supported.join(", ")
                ),
            ));
        } else if !seen.insert(*usage) {
            causes.push(cause(
                "FieldValueDuplicate",
                &field,
                format!("Duplicate value: \"{usage}\""),
            ));
        }
    }
    match spec["signerName"].as_str().unwrap_or_default() {
        "" => causes.push(cause(
            "FieldValueRequired",
            "spec.signerName",
            "Required value".to_owned(),
        )),
        LEGACY_SIGNER => causes.push(cause(
            "FieldValueInvalid",
            "spec.signerName",
            format!(
                "Invalid value: \"{LEGACY_SIGNER}\": the legacy signerName is not allowed via this API version"
            ),
        )),
        signer if signer.split('/').count() != 2 || signer.split('/').any(str::is_empty) => {
            causes.push(cause(
                "FieldValueInvalid",
                "spec.signerName",
                format!(
                    "Invalid value: \"{signer}\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
                ),
            ))
        }
        _ => {}
    }
    if let Some(seconds) = spec["expirationSeconds"].as_i64()
        && seconds < 600
    {
        causes.push(cause(
            "FieldValueInvalid",
            "spec.expirationSeconds",
            format!(
                "Invalid value: {seconds}: may not specify a duration less than 600 seconds (10 minutes)"
            ),
        ));
    }
    causes.extend(validate_conditions(csr));
    causes
}

fn validate_conditions(csr: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    let mut seen = BTreeSet::new();
    let list = conditions(csr);
    for (i, condition) in list.iter().enumerate() {
        let type_ = condition["type"].as_str().unwrap_or_default();
        let status = condition["status"].as_str().unwrap_or_default();
        let path = format!("status.conditions[{i}]");
        if type_.is_empty() {
            causes.push(cause(
                "FieldValueRequired",
                &format!("{path}.type"),
                "Required value".to_owned(),
            ));
        }
        let known = matches!(type_, "Approved" | "Denied" | "Failed");
        if known && status != "True" {
            causes.push(cause(
                "FieldValueNotSupported",
                &format!("{path}.status"),
                format!("Unsupported value: \"{status}\": supported values: \"True\""),
            ));
        } else if !known && !matches!(status, "True" | "False" | "Unknown") {
            causes.push(cause(
                "FieldValueNotSupported",
                &format!("{path}.status"),
                format!(
                    "Unsupported value: \"{status}\": supported values: \"False\", \"True\", \"Unknown\""
                ),
            ));
        }
        if known && !seen.insert(type_) {
            causes.push(cause(
                "FieldValueDuplicate",
                &format!("{path}.type"),
                format!("Duplicate value: \"{type_}\""),
            ));
        }
    }
    if seen.contains("Approved") && seen.contains("Denied") {
        let at = list
            .iter()
            .position(|c| c["type"] == "Denied")
            .unwrap_or_default();
        causes.push(cause(
            "FieldValueInvalid",
            &format!("status.conditions[{at}].type"),
            "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
                .to_owned(),
        ));
    }
    causes
}

/// What an update may not do, besides what any CSR may not be
/// (`ValidateCertificateSigningRequest{Status,Approval,}Update`).
pub fn validate_update(current: &Value, new: &Value, subresource: &str) -> Vec<Cause> {
    let mut causes = vec![];
    let before = conditions(current);
    let after = conditions(new);
    for type_ in ["Approved", "Denied", "Failed"] {
        let had = before.iter().find(|c| c["type"] == type_);
        let has = after.iter().find(|c| c["type"] == type_);
        match (had, has) {
            (Some(_), None) => causes.push(cause(
                "FieldValueForbidden",
                "status.conditions",
                format!("Forbidden: updates may not remove a condition of type \"{type_}\""),
            )),
            (None, Some(_)) if subresource.is_empty() => causes.push(cause(
                "FieldValueForbidden",
                "status.conditions",
                format!("Forbidden: updates may not add a condition of type \"{type_}\""),
            )),
            _ => {}
        }
    }
    let certificate = |csr: &Value| csr["status"]["certificate"].as_str().map(str::to_owned);
    let (had, has) = (certificate(current), certificate(new));
    if had != has {
        let message = match (subresource, &had) {
            ("status", Some(_)) => "Forbidden: updates may not modify existing certificate content",
            ("status", None) => "",
            _ => "Forbidden: updates may not set certificate content",
        };
        if !message.is_empty() {
            causes.push(cause(
                "FieldValueForbidden",
                "status.certificate",
                message.to_owned(),
            ));
        }
    }
    causes
}

/// The CertificateApproval admission plugin: an update of `/approval` needs `approve` on the
/// signer (`signers`, named for the signer or its domain with `/*`).
pub fn check_approval(store: &Store, user: &Identity, current: &Value) -> Result<(), ApiError> {
    let signer = current["spec"]["signerName"].as_str().unwrap_or_default();
    let domain = signer.split('/').next().unwrap_or_default();
    let allowed = [signer.to_owned(), format!("{domain}/*")]
        .into_iter()
        .any(|name| {
            let attrs = Attributes {
                verb: "approve".to_owned(),
                group: "certificates.k8s.io".to_owned(),
                resource: "signers".to_owned(),
                name,
                ..Attributes::default()
            };
            auth::authorize(store, user, &attrs).allowed
        });
    if allowed {
        return Ok(());
    }
    let name = current["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::Forbidden {
        message: format!(
            "certificatesigningrequests.certificates.k8s.io \"{name}\" is forbidden: user not permitted to approve requests with signerName \"{signer}\""
        ),
        kind: "certificatesigningrequests".to_owned(),
        name: Some(name.to_owned()),
        group: "certificates.k8s.io".to_owned(),
    })
}

/// The CONDITION column: Denied before Approved before Pending, then Failed and Issued.
pub fn condition_cell(csr: &Value) -> String {
    let list = conditions(csr);
    let has = |t: &str| list.iter().any(|c| c["type"] == t);
    let mut cell = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_owned();
    if has("Failed") {
        cell.push_str(",Failed");
    }
    if csr["status"]["certificate"].is_string() {
        cell.push_str(",Issued");
    }
    cell
}

/// Why the controller manager's signer refuses to issue `csr`, in its words, or nothing.
fn signer_refusal(csr: &Value, request: &rcgen::CertificateSigningRequestParams) -> Option<String> {
    let usages: BTreeSet<&str> = csr["spec"]["usages"]
        .as_array()
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let organizations: Vec<String> = request
        .params
        .distinguished_name
        .iter()
        .filter(|(t, _)| **t == rcgen::DnType::OrganizationName)
        .map(|(_, v)| dn_text(v))
        .collect();
    let common_name = request
        .params
        .distinguished_name
        .get(&rcgen::DnType::CommonName)
        .map(dn_text)
        .unwrap_or_default();
    match csr["spec"]["signerName"].as_str().unwrap_or_default() {
        CLIENT_SIGNER => {
            if let Some(bad) = usages.iter().find(|u| {
                !matches!(
                    **u,
                    "client auth" | "digital signature" | "key encipherment"
                )
            }) {
                return Some(format!("invalid usage for client certificate: {bad}"));
            }
            (!usages.contains("client auth"))
                .then(|| "missing required usage for client certificate: client auth".to_owned())
        }
        KUBELET_CLIENT_SIGNER | KUBELET_SERVING_SIGNER => {
            if organizations != ["system:nodes"] {
                return Some("subject organization is not system:nodes".to_owned());
            }
            if !common_name.starts_with("system:node:") {
                return Some("subject common name does not begin with system:node:".to_owned());
            }
            let wanted: BTreeSet<&str> = if csr["spec"]["signerName"] == KUBELET_SERVING_SIGNER {
                if request.params.subject_alt_names.is_empty() {
                    return Some("DNS or IP subjectAltName is required".to_owned());
                }
                ["server auth", "digital signature", "key encipherment"].into()
            } else {
                ["client auth", "digital signature", "key encipherment"].into()
            };
            let required = if csr["spec"]["signerName"] == KUBELET_SERVING_SIGNER {
                "server auth"
            } else {
                "client auth"
            };
            (!usages.is_subset(&wanted) || !usages.contains(required)).then(|| {
                let listed: Vec<&str> = wanted.iter().copied().collect();
                format!("usages did not match [{}]", listed.join(" "))
            })
        }
        _ => None,
    }
}

fn dn_text(value: &rcgen::DnValue) -> String {
    match value {
        rcgen::DnValue::Utf8String(s) => s.clone(),
        rcgen::DnValue::PrintableString(s) => s.as_str().to_owned(),
        rcgen::DnValue::Ia5String(s) => s.as_str().to_owned(),
        _ => String::new(),
    }
}

/// The key usages and extended key usages a certificate gets for the CSR's `usages`.
fn apply_usages(params: &mut rcgen::CertificateParams, usages: &[&str]) {
    use rcgen::{ExtendedKeyUsagePurpose as Ext, KeyUsagePurpose as Key};
    params.key_usages.clear();
    params.extended_key_usages.clear();
    for usage in usages {
        match *usage {
            "digital signature" | "signing" => params.key_usages.push(Key::DigitalSignature),
            "content commitment" => params.key_usages.push(Key::ContentCommitment),
            "key encipherment" => params.key_usages.push(Key::KeyEncipherment),
            "key agreement" => params.key_usages.push(Key::KeyAgreement),
            "data encipherment" => params.key_usages.push(Key::DataEncipherment),
            "cert sign" => params.key_usages.push(Key::KeyCertSign),
            "crl sign" => params.key_usages.push(Key::CrlSign),
            "encipher only" => params.key_usages.push(Key::EncipherOnly),
            "decipher only" => params.key_usages.push(Key::DecipherOnly),
            "any" => params.extended_key_usages.push(Ext::Any),
            "server auth" => params.extended_key_usages.push(Ext::ServerAuth),
            "client auth" => params.extended_key_usages.push(Ext::ClientAuth),
            "code signing" => params.extended_key_usages.push(Ext::CodeSigning),
            "email protection" => params.extended_key_usages.push(Ext::EmailProtection),
            "timestamping" => params.extended_key_usages.push(Ext::TimeStamping),
            "ocsp signing" => params.extended_key_usages.push(Ext::OcspSigning),
            _ => {}
        }
    }
}

/// The controller manager's signer: each approved, not yet issued or failed request of a
/// signer it serves gets a certificate from the cluster's CA (or `Failed`,
/// `SignerValidationFailure`, in the signer's words).
struct Signer {
    sim: Arc<Sim>,
}

impl Signer {
    fn sync(&self, name: &str) {
        let Some(csr) = self.sim.store.get(CSRS, "", name) else {
            return;
        };
        let signer = csr["spec"]["signerName"].as_str().unwrap_or_default();
        let list = conditions(&csr);
        let has = |t: &str| list.iter().any(|c| c["type"] == t);
        if ![CLIENT_SIGNER, KUBELET_CLIENT_SIGNER, KUBELET_SERVING_SIGNER].contains(&signer)
            || !has("Approved")
            || has("Denied")
            || has("Failed")
            || csr["status"]["certificate"].is_string()
        {
            return;
        }
        let Some(authority) = self.sim.authority.get() else {
            return;
        };
        let mut status = csr["status"].clone();
        let request = match parse_request(&request_bytes(&csr)) {
            Ok(request) => request,
            Err(error) => return self.fail(&csr, status, &error),
        };
        if let Some(refusal) = signer_refusal(&csr, &request) {
            return self.fail(&csr, status, &refusal);
        }
        let usages: Vec<&str> = csr["spec"]["usages"]
            .as_array()
            .map(|u| u.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let ttl = csr["spec"]["expirationSeconds"]
            .as_u64()
            .map(Duration::from_secs)
            .unwrap_or(MAX_DURATION)
            .clamp(Duration::from_secs(600), MAX_DURATION);
        match authority.sign_request(request, ttl, |params| apply_usages(params, &usages)) {
            Ok(pem) => {
                use base64::Engine;
                status["certificate"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(pem));
                self.write_status(&csr, status);
            }
            Err(error) => self.fail(&csr, status, &error.to_string()),
        }
    }

    fn fail(&self, csr: &Value, mut status: Value, message: &str) {
        let now = now_rfc3339();
        let mut list = status["conditions"].as_array().cloned().unwrap_or_default();
        list.push(json!({"type": "Failed", "status": "True", "reason": "SignerValidationFailure", "message": message, "lastUpdateTime": now, "lastTransitionTime": now}));
        status["conditions"] = Value::Array(list);
        self.write_status(csr, status);
    }

    fn write_status(&self, csr: &Value, status: Value) {
        let Some(rt) =
            self.sim
                .resource_type("certificates.k8s.io", "v1", "certificatesigningrequests")
        else {
            return;
        };
        let mut body = csr.clone();
        body["status"] = status;
        let name = csr["metadata"]["name"].as_str().unwrap_or_default();
        let _ = self.sim.update(
            &rt,
            "",
            name,
            "status",
            body,
            &WriteContext::system("certificatesigningrequest-signing-controller"),
        );
    }
}

/// Runs the signer until the store closes.
pub async fn run(sim: Arc<Sim>) {
    let mut changes = sim.store.subscribe_to(CSRS);
    let signer = Signer { sim };
    let all = |signer: &Signer| -> Vec<String> {
        let (csrs, _) = signer.sim.store.list(CSRS, None);
        csrs.iter()
            .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let mut pending: BTreeSet<String> = all(&signer).into_iter().collect();
    let of = |change: &Change| -> Option<String> {
        (&*change.storage == CSRS && change.kind != ChangeKind::Deleted)
            .then(|| {
                change.object["metadata"]["name"]
                    .as_str()
                    .map(str::to_owned)
            })
            .flatten()
    };
    loop {
        for name in std::mem::take(&mut pending) {
            signer.sync(&name);
        }
        match changes.recv().await {
            Err(RecvError::Closed) => return,
            Err(RecvError::Lagged(_)) => pending.extend(all(&signer)),
            Ok(change) => {
                pending.extend(of(&change));
                while let Ok(change) = changes.try_recv() {
                    pending.extend(of(&change));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_condition_column_reads_as_kubectl_prints_it() {
        let pending = json!({"spec": {}});
        assert_eq!(condition_cell(&pending), "Pending");
        let issued = json!({"status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "eA=="}});
        assert_eq!(condition_cell(&issued), "Approved,Issued");
        let failed = json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Failed", "status": "True"}]}});
        assert_eq!(condition_cell(&failed), "Approved,Failed");
        let denied = json!({"status": {"conditions": [{"type": "Denied", "status": "True"}]}});
        assert_eq!(condition_cell(&denied), "Denied");
    }

    #[test]
    fn a_request_that_is_not_a_certificate_request_is_refused_in_the_servers_words() {
        use base64::Engine;
        let csr = json!({"spec": {"request": base64::engine::general_purpose::STANDARD.encode("hi"), "signerName": "example.com/x", "usages": ["client auth"]}});
        let causes = validate(&csr);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.request");
        assert_eq!(
            causes[0].message,
            "Invalid value: []byte{0x68, 0x69}: PEM block type must be CERTIFICATE REQUEST"
        );
    }
}
