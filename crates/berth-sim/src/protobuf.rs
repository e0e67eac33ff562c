//! Request bodies in Kubernetes' protobuf encoding, as kubectl's typed commands send them
//! (`create deployment|job|cronjob|service|quota|pdb|secret|configmap|namespace|serviceaccount|role|
//! rolebinding|clusterrole|clusterrolebinding|token`, `auth can-i`, `auth whoami`,
//! `certificate approve|deny`, `debug --copy-to`, `debug node/`): decoded by
//! prost into k8s-pb's types, then written as the JSON the sim stores. The sim reads the
//! fields those commands set; a body that sets anything more is refused (415, "send it as
//! JSON"), never stored in part. The sim answers in JSON, which those clients accept.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_pb::{
    api::{
        apps::v1 as apps, authentication::v1 as authn, authorization::v1 as authz,
        batch::v1 as batch, core::v1 as core, policy::v1 as policy, rbac::v1 as rbac,
    },
    apimachinery::pkg::{apis::meta::v1 as meta, runtime::Unknown, util::intstr::IntOrString},
};
use prost::Message;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};

const MAGIC: &[u8] = b"k8s\x00";

/// A body held more than the sim reads: the type that held it.
struct Leftover(&'static str);

type Converted = Result<Value, Leftover>;

/// Go's zero `metav1.Time` as the real encoder writes it (seconds since year 1).
const ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// Whether an encoded message says nothing: every field zero, empty, or a message that says
/// nothing (the real encoder writes the zero value of every non-pointer field).
fn says_nothing(bytes: &[u8]) -> bool {
    fn varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *bytes.get(*pos)?;
            *pos += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    let zero_time = meta::Time {
        seconds: Some(ZERO_TIME_SECONDS),
        nanos: Some(0),
    }
    .encode_to_vec();
    let mut pos = 0;
    while pos < bytes.len() {
        let Some(key) = varint(bytes, &mut pos) else {
            return false;
        };
        let zero = match key & 7 {
            0 => varint(bytes, &mut pos) == Some(0),
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                let end = pos + width;
                let zero = bytes
                    .get(pos..end)
                    .is_some_and(|b| b.iter().all(|x| *x == 0));
                pos = end;
                zero
            }
            2 => {
                let Some(len) = varint(bytes, &mut pos) else {
                    return false;
                };
                let end = pos + len as usize;
                let Some(payload) = bytes.get(pos..end) else {
                    return false;
                };
                pos = end;
                payload.is_empty() || payload == zero_time.as_slice() || says_nothing(payload)
            }
            _ => false,
        };
        if !zero {
            return false;
        }
    }
    true
}

/// Nothing is left in `rest` once its read fields were taken out.
fn nothing_left<T: Message>(what: &'static str, rest: T) -> Result<(), Leftover> {
    if says_nothing(&rest.encode_to_vec()) {
        Ok(())
    } else {
        Err(Leftover(what))
    }
}

fn is_zero(value: &Value) -> bool {
    matches!(value, Value::Bool(false)) || value == &json!(0) || value == &json!("")
}

/// A JSON object under construction: absent and empty values are left out, as in the
/// real server's JSON.
#[derive(Default)]
struct Out(Map<String, Value>);

impl Out {
    /// A field that is a value in Go: its zero value is what was not set.
    fn put(&mut self, key: &str, value: Option<impl serde::Serialize>) -> &mut Self {
        if let Some(value) = value.map(|v| json!(v)).filter(|v| !is_zero(v)) {
            self.0.insert(key.to_owned(), value);
        }
        self
    }

    /// A field that is a pointer in Go: a zero value was set.
    fn keep(&mut self, key: &str, value: Option<impl serde::Serialize>) -> &mut Self {
        if let Some(value) = value {
            self.0.insert(key.to_owned(), json!(value));
        }
        self
    }

    fn list(&mut self, key: &str, values: Vec<impl serde::Serialize>) -> &mut Self {
        if !values.is_empty() {
            self.0.insert(key.to_owned(), json!(values));
        }
        self
    }

    fn map(&mut self, key: &str, values: BTreeMap<String, String>) -> &mut Self {
        if !values.is_empty() {
            self.0.insert(key.to_owned(), json!(values));
        }
        self
    }

    fn value(&mut self, key: &str, value: Option<Value>) -> &mut Self {
        if let Some(value) = value {
            self.0.insert(key.to_owned(), value);
        }
        self
    }

    fn done(&mut self) -> Value {
        Value::Object(std::mem::take(&mut self.0))
    }
}

/// Converts an optional message with `convert`.
fn opt<T>(
    value: Option<T>,
    convert: impl FnOnce(T) -> Converted,
) -> Result<Option<Value>, Leftover> {
    value.map(convert).transpose()
}

/// Converts each message of a list with `convert`.
fn each<T>(values: Vec<T>, convert: impl Fn(T) -> Converted) -> Result<Vec<Value>, Leftover> {
    values.into_iter().map(convert).collect()
}

fn object_meta(mut m: meta::ObjectMeta) -> Converted {
    // `create job --from=cronjob/NAME` names the CronJob as the Job's owner.
    let owners = each(std::mem::take(&mut m.owner_references), |mut r| {
        let out = Out::default()
            .put("apiVersion", r.api_version.take())
            .put("kind", r.kind.take())
            .put("name", r.name.take())
            .put("uid", r.uid.take())
            .put("controller", r.controller.take())
            .put("blockOwnerDeletion", r.block_owner_deletion.take())
            .done();
        nothing_left("OwnerReference", r)?;
        Ok(out)
    })?;
    // An update sends the object as it was read: what the server keeps itself (uid, times,
    // managed fields) is read and then replaced by the server's own; the resource version
    // makes the write conditional.
    let managed = each(std::mem::take(&mut m.managed_fields), |mut f| {
        let fields = f
            .fields_v1
            .take()
            .and_then(|v| v.raw)
            .and_then(|raw| serde_json::from_slice::<Value>(&raw).ok());
        let out = Out::default()
            .put("manager", f.manager.take())
            .put("operation", f.operation.take())
            .put("apiVersion", f.api_version.take())
            .put("time", f.time.take().and_then(time))
            .put("fieldsType", f.fields_type.take())
            .value("fieldsV1", fields)
            .put("subresource", f.subresource.take())
            .done();
        nothing_left("ManagedFieldsEntry", f)?;
        Ok(out)
    })?;
    let out = Out::default()
        .list("ownerReferences", owners)
        .put("name", m.name.take())
        .put("generateName", m.generate_name.take())
        .put("namespace", m.namespace.take())
        .put("uid", m.uid.take())
        .put("resourceVersion", m.resource_version.take())
        .put("generation", m.generation.take())
        .put(
            "creationTimestamp",
            m.creation_timestamp.take().and_then(time),
        )
        .put(
            "deletionTimestamp",
            m.deletion_timestamp.take().and_then(time),
        )
        .put(
            "deletionGracePeriodSeconds",
            m.deletion_grace_period_seconds.take(),
        )
        .map("labels", std::mem::take(&mut m.labels))
        .map("annotations", std::mem::take(&mut m.annotations))
        .list("finalizers", std::mem::take(&mut m.finalizers))
        .list("managedFields", managed)
        .done();
    nothing_left("ObjectMeta", m)?;
    Ok(out)
}

/// A `metav1.Time` as the JSON form writes it (RFC 3339, seconds); Go's zero time is absent.
fn time(t: meta::Time) -> Option<String> {
    let seconds = t.seconds.unwrap_or(ZERO_TIME_SECONDS);
    if seconds == ZERO_TIME_SECONDS {
        return None;
    }
    jiff::Timestamp::from_second(seconds)
        .ok()
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

fn certificate_signing_request(
    mut c: k8s_pb::api::certificates::v1::CertificateSigningRequest,
) -> Converted {
    let spec = opt(c.spec.take(), |mut s| {
        let extra: BTreeMap<String, Vec<String>> = std::mem::take(&mut s.extra)
            .into_iter()
            .map(|(k, v)| (k, v.items))
            .collect();
        let out = Out::default()
            .put(
                "request",
                s.request
                    .take()
                    .map(|r| base64::engine::general_purpose::STANDARD.encode(r)),
            )
            .put("signerName", s.signer_name.take())
            .put("expirationSeconds", s.expiration_seconds.take())
            .list("usages", std::mem::take(&mut s.usages))
            .put("username", s.username.take())
            .put("uid", s.uid.take())
            .list("groups", std::mem::take(&mut s.groups))
            .put("extra", (!extra.is_empty()).then_some(extra))
            .done();
        nothing_left("CertificateSigningRequestSpec", s)?;
        Ok(out)
    })?;
    let status = opt(c.status.take(), |mut s| {
        let conditions = each(std::mem::take(&mut s.conditions), |mut k| {
            let out = Out::default()
                .put("type", k.r#type.take())
                .put("status", k.status.take())
                .put("reason", k.reason.take())
                .put("message", k.message.take())
                .put("lastUpdateTime", k.last_update_time.take().and_then(time))
                .put(
                    "lastTransitionTime",
                    k.last_transition_time.take().and_then(time),
                )
                .done();
            nothing_left("CertificateSigningRequestCondition", k)?;
            Ok(out)
        })?;
        let out = Out::default()
            .list("conditions", conditions)
            .put(
                "certificate",
                s.certificate
                    .take()
                    .filter(|c| !c.is_empty())
                    .map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
            )
            .done();
        nothing_left("CertificateSigningRequestStatus", s)?;
        Ok(out)
    })?;
    let metadata = c.metadata.take();
    let mut out = object("CertificateSigningRequest", metadata, spec, c)?;
    if let Some(status) = status.filter(|s| s.as_object().is_some_and(|m| !m.is_empty())) {
        out["status"] = status;
    }
    Ok(out)
}

fn label_selector(mut s: meta::LabelSelector) -> Converted {
    let expressions = each(std::mem::take(&mut s.match_expressions), |mut r| {
        let out = Out::default()
            .put("key", r.key.take())
            .put("operator", r.operator.take())
            .list("values", std::mem::take(&mut r.values))
            .done();
        nothing_left("LabelSelectorRequirement", r)?;
        Ok(out)
    })?;
    let out = Out::default()
        .map("matchLabels", std::mem::take(&mut s.match_labels))
        .list("matchExpressions", expressions)
        .done();
    nothing_left("LabelSelector", s)?;
    Ok(out)
}

/// An int-or-string; its zero value (in a field that is a value in Go) is absent.
fn int_or_string(value: IntOrString) -> Option<Value> {
    match value {
        IntOrString {
            r#type: Some(1),
            str_val: Some(s),
            ..
        } => Some(json!(s)),
        IntOrString { int_val, .. } => int_val.filter(|i| *i != 0).map(|i| json!(i)),
    }
}

fn quantities(
    values: BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
) -> BTreeMap<String, String> {
    values
        .into_iter()
        .map(|(k, q)| (k, q.string.unwrap_or_default()))
        .collect()
}

fn service(mut s: core::Service) -> Converted {
    // What a client sends as status is not kept on create.
    s.status.take();
    let spec = opt(s.spec.take(), |mut spec| {
        let ports = each(std::mem::take(&mut spec.ports), |mut p| {
            let out = Out::default()
                .put("name", p.name.take())
                .put("protocol", p.protocol.take())
                .put("appProtocol", p.app_protocol.take())
                .put("port", p.port.take())
                .value("targetPort", p.target_port.take().and_then(int_or_string))
                .put("nodePort", p.node_port.take())
                .done();
            nothing_left("ServicePort", p)?;
            Ok(out)
        })?;
        let out = Out::default()
            .list("ports", ports)
            .map("selector", std::mem::take(&mut spec.selector))
            .put("clusterIP", spec.cluster_ip.take())
            .list("clusterIPs", std::mem::take(&mut spec.cluster_ips))
            .put("type", spec.r#type.take())
            .put("externalName", spec.external_name.take())
            .put("sessionAffinity", spec.session_affinity.take())
            .done();
        nothing_left("ServiceSpec", spec)?;
        Ok(out)
    })?;
    let metadata = s.metadata.take();
    object("Service", metadata, spec, s)
}

fn container(mut c: core::Container) -> Converted {
    let ports = each(std::mem::take(&mut c.ports), |mut p| {
        let out = Out::default()
            .put("name", p.name.take())
            .put("containerPort", p.container_port.take())
            .put("protocol", p.protocol.take())
            .done();
        nothing_left("ContainerPort", p)?;
        Ok(out)
    })?;
    let env = each(std::mem::take(&mut c.env), |mut e| {
        let from = opt(e.value_from.take(), env_source)?;
        let out = Out::default()
            .put("name", e.name.take())
            .put("value", e.value.take())
            .value("valueFrom", from)
            .done();
        nothing_left("EnvVar", e)?;
        Ok(out)
    })?;
    let env_from = each(std::mem::take(&mut c.env_from), |mut e| {
        let reference = |name: Option<String>, optional: Option<bool>| {
            Out::default()
                .put("name", name)
                .keep("optional", optional)
                .done()
        };
        let config_map = e.config_map_ref.take().map(|mut r| {
            let name = r.local_object_reference.take().and_then(|l| l.name);
            reference(name, r.optional.take())
        });
        let secret = e.secret_ref.take().map(|mut r| {
            let name = r.local_object_reference.take().and_then(|l| l.name);
            reference(name, r.optional.take())
        });
        let out = Out::default()
            .put("prefix", e.prefix.take())
            .value("configMapRef", config_map)
            .value("secretRef", secret)
            .done();
        nothing_left("EnvFromSource", e)?;
        Ok(out)
    })?;
    let mounts = each(std::mem::take(&mut c.volume_mounts), |mut m| {
        let out = Out::default()
            .put("name", m.name.take())
            .put("readOnly", m.read_only.take())
            .put("mountPath", m.mount_path.take())
            .put("subPath", m.sub_path.take())
            .put("mountPropagation", m.mount_propagation.take())
            .put("subPathExpr", m.sub_path_expr.take())
            .done();
        nothing_left("VolumeMount", m)?;
        Ok(out)
    })?;
    let probes = [
        ("livenessProbe", opt(c.liveness_probe.take(), probe)?),
        ("readinessProbe", opt(c.readiness_probe.take(), probe)?),
        ("startupProbe", opt(c.startup_probe.take(), probe)?),
    ];
    let security = opt(c.security_context.take(), |mut s| {
        let capabilities = s.capabilities.take().map(|mut k| {
            Out::default()
                .list("add", std::mem::take(&mut k.add))
                .list("drop", std::mem::take(&mut k.drop))
                .done()
        });
        let out = Out::default()
            .value("capabilities", capabilities)
            .keep("privileged", s.privileged.take())
            .keep("runAsUser", s.run_as_user.take())
            .keep("runAsGroup", s.run_as_group.take())
            .keep("runAsNonRoot", s.run_as_non_root.take())
            .keep("readOnlyRootFilesystem", s.read_only_root_filesystem.take())
            .keep(
                "allowPrivilegeEscalation",
                s.allow_privilege_escalation.take(),
            )
            .value("seccompProfile", opt(s.seccomp_profile.take(), seccomp)?)
            .done();
        nothing_left("SecurityContext", s)?;
        Ok(out)
    })?;
    let resources = opt(c.resources.take(), |mut r| {
        let out = Out::default()
            .map("limits", quantities(std::mem::take(&mut r.limits)))
            .map("requests", quantities(std::mem::take(&mut r.requests)))
            .done();
        nothing_left("ResourceRequirements", r)?;
        Ok(out)
    })?;
    let out = Out::default()
        .put("name", c.name.take())
        .put("image", c.image.take())
        .list("command", std::mem::take(&mut c.command))
        .list("args", std::mem::take(&mut c.args))
        .put("workingDir", c.working_dir.take())
        .list("ports", ports)
        .list("envFrom", env_from)
        .list("env", env)
        .value("resources", resources)
        .list("volumeMounts", mounts)
        .put("imagePullPolicy", c.image_pull_policy.take())
        .put("terminationMessagePath", c.termination_message_path.take())
        .put(
            "terminationMessagePolicy",
            c.termination_message_policy.take(),
        )
        .value("securityContext", security)
        .put("stdin", c.stdin.take())
        .put("stdinOnce", c.stdin_once.take())
        .put("tty", c.tty.take())
        .done();
    let mut out = out;
    for (key, value) in probes {
        if let Some(value) = value {
            out[key] = value;
        }
    }
    nothing_left("Container", c)?;
    Ok(out)
}

fn seccomp(mut p: core::SeccompProfile) -> Converted {
    let out = Out::default()
        .put("type", p.r#type.take())
        .put("localhostProfile", p.localhost_profile.take())
        .done();
    nothing_left("SeccompProfile", p)?;
    Ok(out)
}

fn field_selector(mut f: core::ObjectFieldSelector) -> Converted {
    let out = Out::default()
        .put("apiVersion", f.api_version.take())
        .put("fieldPath", f.field_path.take())
        .done();
    nothing_left("ObjectFieldSelector", f)?;
    Ok(out)
}

fn resource_selector(mut r: core::ResourceFieldSelector) -> Converted {
    let out = Out::default()
        .put("containerName", r.container_name.take())
        .put("resource", r.resource.take())
        .put("divisor", r.divisor.take().and_then(|q| q.string))
        .done();
    nothing_left("ResourceFieldSelector", r)?;
    Ok(out)
}

fn env_source(mut v: core::EnvVarSource) -> Converted {
    let key_ref = |name: Option<String>, key: Option<String>, optional: Option<bool>| {
        Out::default()
            .put("name", name)
            .put("key", key)
            .keep("optional", optional)
            .done()
    };
    let config_map = v.config_map_key_ref.take().map(|mut r| {
        let name = r.local_object_reference.take().and_then(|l| l.name);
        key_ref(name, r.key.take(), r.optional.take())
    });
    let secret = v.secret_key_ref.take().map(|mut r| {
        let name = r.local_object_reference.take().and_then(|l| l.name);
        key_ref(name, r.key.take(), r.optional.take())
    });
    let out = Out::default()
        .value("fieldRef", opt(v.field_ref.take(), field_selector)?)
        .value(
            "resourceFieldRef",
            opt(v.resource_field_ref.take(), resource_selector)?,
        )
        .value("configMapKeyRef", config_map)
        .value("secretKeyRef", secret)
        .done();
    nothing_left("EnvVarSource", v)?;
    Ok(out)
}

fn probe(mut p: core::Probe) -> Converted {
    let handler = p.handler.take().unwrap_or_default();
    let mut handler = handler;
    let exec = handler
        .exec
        .take()
        .map(|mut e| json!({"command": std::mem::take(&mut e.command)}));
    let http_get = opt(handler.http_get.take(), |mut h| {
        if !h.http_headers.is_empty() {
            return Err(Leftover("HTTPGetAction"));
        }
        let out = Out::default()
            .put("path", h.path.take())
            .value("port", h.port.take().and_then(int_or_string))
            .put("host", h.host.take())
            .put("scheme", h.scheme.take())
            .done();
        nothing_left("HTTPGetAction", h)?;
        Ok(out)
    })?;
    let tcp = opt(handler.tcp_socket.take(), |mut t| {
        let out = Out::default()
            .value("port", t.port.take().and_then(int_or_string))
            .put("host", t.host.take())
            .done();
        nothing_left("TCPSocketAction", t)?;
        Ok(out)
    })?;
    nothing_left("ProbeHandler", handler)?;
    let out = Out::default()
        .value("exec", exec)
        .value("httpGet", http_get)
        .value("tcpSocket", tcp)
        .put("initialDelaySeconds", p.initial_delay_seconds.take())
        .put("timeoutSeconds", p.timeout_seconds.take())
        .put("periodSeconds", p.period_seconds.take())
        .put("successThreshold", p.success_threshold.take())
        .put("failureThreshold", p.failure_threshold.take())
        .keep(
            "terminationGracePeriodSeconds",
            p.termination_grace_period_seconds.take(),
        )
        .done();
    nothing_left("Probe", p)?;
    Ok(out)
}

fn key_to_path(mut k: core::KeyToPath) -> Converted {
    let out = Out::default()
        .put("key", k.key.take())
        .put("path", k.path.take())
        .keep("mode", k.mode.take())
        .done();
    nothing_left("KeyToPath", k)?;
    Ok(out)
}

fn downward_files(files: Vec<core::DownwardAPIVolumeFile>) -> Result<Vec<Value>, Leftover> {
    each(files, |mut f| {
        let out = Out::default()
            .put("path", f.path.take())
            .value("fieldRef", opt(f.field_ref.take(), field_selector)?)
            .value(
                "resourceFieldRef",
                opt(f.resource_field_ref.take(), resource_selector)?,
            )
            .keep("mode", f.mode.take())
            .done();
        nothing_left("DownwardAPIVolumeFile", f)?;
        Ok(out)
    })
}

fn volume(mut v: core::Volume) -> Converted {
    let mut source = v.volume_source.take().unwrap_or_default();
    let host_path = opt(source.host_path.take(), |mut h| {
        let out = Out::default()
            .put("path", h.path.take())
            .keep("type", h.r#type.take())
            .done();
        nothing_left("HostPathVolumeSource", h)?;
        Ok(out)
    })?;
    let empty_dir = opt(source.empty_dir.take(), |mut e| {
        let out = Out::default()
            .put("medium", e.medium.take())
            .put("sizeLimit", e.size_limit.take().and_then(|q| q.string))
            .done();
        nothing_left("EmptyDirVolumeSource", e)?;
        Ok(out)
    })?;
    let config_map = opt(source.config_map.take(), |mut c| {
        let out = Out::default()
            .put("name", c.local_object_reference.take().and_then(|l| l.name))
            .list("items", each(std::mem::take(&mut c.items), key_to_path)?)
            .keep("defaultMode", c.default_mode.take())
            .keep("optional", c.optional.take())
            .done();
        nothing_left("ConfigMapVolumeSource", c)?;
        Ok(out)
    })?;
    let secret = opt(source.secret.take(), |mut c| {
        let out = Out::default()
            .put("secretName", c.secret_name.take())
            .list("items", each(std::mem::take(&mut c.items), key_to_path)?)
            .keep("defaultMode", c.default_mode.take())
            .keep("optional", c.optional.take())
            .done();
        nothing_left("SecretVolumeSource", c)?;
        Ok(out)
    })?;
    let claim = opt(source.persistent_volume_claim.take(), |mut c| {
        let out = Out::default()
            .put("claimName", c.claim_name.take())
            .put("readOnly", c.read_only.take())
            .done();
        nothing_left("PersistentVolumeClaimVolumeSource", c)?;
        Ok(out)
    })?;
    let downward = opt(source.downward_api.take(), |mut d| {
        let out = Out::default()
            .list("items", downward_files(std::mem::take(&mut d.items))?)
            .keep("defaultMode", d.default_mode.take())
            .done();
        nothing_left("DownwardAPIVolumeSource", d)?;
        Ok(out)
    })?;
    let projected = opt(source.projected.take(), |mut p| {
        let sources = each(std::mem::take(&mut p.sources), |mut s| {
            let token = opt(s.service_account_token.take(), |mut t| {
                let out = Out::default()
                    .put("audience", t.audience.take())
                    .keep("expirationSeconds", t.expiration_seconds.take())
                    .put("path", t.path.take())
                    .done();
                nothing_left("ServiceAccountTokenProjection", t)?;
                Ok(out)
            })?;
            // A config map's and a secret's projections have the same fields.
            macro_rules! keys_projection {
                ($source:expr, $what:literal) => {
                    opt($source, |mut c| {
                        let out = Out::default()
                            .put("name", c.local_object_reference.take().and_then(|l| l.name))
                            .list("items", each(std::mem::take(&mut c.items), key_to_path)?)
                            .keep("optional", c.optional.take())
                            .done();
                        nothing_left($what, c)?;
                        Ok(out)
                    })?
                };
            }
            let config_map = keys_projection!(s.config_map.take(), "ConfigMapProjection");
            let secret = keys_projection!(s.secret.take(), "SecretProjection");
            let downward = opt(s.downward_api.take(), |mut d| {
                let out = Out::default()
                    .list("items", downward_files(std::mem::take(&mut d.items))?)
                    .done();
                nothing_left("DownwardAPIProjection", d)?;
                Ok(out)
            })?;
            let out = Out::default()
                .value("serviceAccountToken", token)
                .value("configMap", config_map)
                .value("secret", secret)
                .value("downwardAPI", downward)
                .done();
            nothing_left("VolumeProjection", s)?;
            Ok(out)
        })?;
        let out = Out::default()
            .list("sources", sources)
            .keep("defaultMode", p.default_mode.take())
            .done();
        nothing_left("ProjectedVolumeSource", p)?;
        Ok(out)
    })?;
    nothing_left("VolumeSource", source)?;
    let out = Out::default()
        .put("name", v.name.take())
        .value("hostPath", host_path)
        .value("emptyDir", empty_dir)
        .value("configMap", config_map)
        .value("secret", secret)
        .value("persistentVolumeClaim", claim)
        .value("downwardAPI", downward)
        .value("projected", projected)
        .done();
    nothing_left("Volume", v)?;
    Ok(out)
}

/// A pod's spec as `kubectl debug` sends it (a copy of a pod's, or a node debugger's).
fn pod_spec(mut spec: core::PodSpec) -> Converted {
    let security = opt(spec.security_context.take(), |mut s| {
        let out = Out::default()
            .keep("runAsUser", s.run_as_user.take())
            .keep("runAsGroup", s.run_as_group.take())
            .keep("runAsNonRoot", s.run_as_non_root.take())
            .list(
                "supplementalGroups",
                std::mem::take(&mut s.supplemental_groups),
            )
            .keep("fsGroup", s.fs_group.take())
            .value("seccompProfile", opt(s.seccomp_profile.take(), seccomp)?)
            .done();
        nothing_left("PodSecurityContext", s)?;
        Ok(out)
    })?;
    let tolerations = each(std::mem::take(&mut spec.tolerations), |mut t| {
        let out = Out::default()
            .put("key", t.key.take())
            .put("operator", t.operator.take())
            .put("value", t.value.take())
            .put("effect", t.effect.take())
            .keep("tolerationSeconds", t.toleration_seconds.take())
            .done();
        nothing_left("Toleration", t)?;
        Ok(out)
    })?;
    let pull_secrets: Vec<Value> = std::mem::take(&mut spec.image_pull_secrets)
        .into_iter()
        .map(|l| json!({"name": l.name.unwrap_or_default()}))
        .collect();
    let out = Out::default()
        .list("volumes", each(std::mem::take(&mut spec.volumes), volume)?)
        .list(
            "initContainers",
            each(std::mem::take(&mut spec.init_containers), container)?,
        )
        .list(
            "containers",
            each(std::mem::take(&mut spec.containers), container)?,
        )
        .put("restartPolicy", spec.restart_policy.take())
        .keep(
            "terminationGracePeriodSeconds",
            spec.termination_grace_period_seconds.take(),
        )
        .keep("activeDeadlineSeconds", spec.active_deadline_seconds.take())
        .put("dnsPolicy", spec.dns_policy.take())
        .map("nodeSelector", std::mem::take(&mut spec.node_selector))
        .put("serviceAccountName", spec.service_account_name.take())
        .put("serviceAccount", spec.service_account.take())
        .keep(
            "automountServiceAccountToken",
            spec.automount_service_account_token.take(),
        )
        .put("nodeName", spec.node_name.take())
        .put("hostNetwork", spec.host_network.take())
        .put("hostPID", spec.host_pid.take())
        .put("hostIPC", spec.host_ipc.take())
        .keep("shareProcessNamespace", spec.share_process_namespace.take())
        .value("securityContext", security)
        .list("imagePullSecrets", pull_secrets)
        .put("hostname", spec.hostname.take())
        .put("subdomain", spec.subdomain.take())
        .put("schedulerName", spec.scheduler_name.take())
        .list("tolerations", tolerations)
        .put("priorityClassName", spec.priority_class_name.take())
        .keep("priority", spec.priority.take())
        .keep("enableServiceLinks", spec.enable_service_links.take())
        .put("preemptionPolicy", spec.preemption_policy.take())
        .done();
    nothing_left("PodSpec", spec)?;
    Ok(out)
}

fn pod(mut p: core::Pod) -> Converted {
    // What a client sends as status is not kept on create.
    p.status.take();
    let spec = opt(p.spec.take(), pod_spec)?;
    let metadata = p.metadata.take();
    object("Pod", metadata, spec, p)
}

fn pod_template(mut t: core::PodTemplateSpec) -> Converted {
    let spec = opt(t.spec.take(), |mut spec| {
        let security = opt(spec.security_context.take(), |s| {
            nothing_left("PodSecurityContext", s)?;
            Ok(json!({}))
        })?;
        let out = Out::default()
            .list(
                "containers",
                each(std::mem::take(&mut spec.containers), container)?,
            )
            .put("restartPolicy", spec.restart_policy.take())
            .keep(
                "terminationGracePeriodSeconds",
                spec.termination_grace_period_seconds.take(),
            )
            .put("dnsPolicy", spec.dns_policy.take())
            .put("serviceAccountName", spec.service_account_name.take())
            .put("schedulerName", spec.scheduler_name.take())
            .put("enableServiceLinks", spec.enable_service_links.take())
            .map("nodeSelector", std::mem::take(&mut spec.node_selector))
            .value("securityContext", security)
            .done();
        nothing_left("PodSpec", spec)?;
        Ok(out)
    })?;
    let metadata = t.metadata.take();
    object("PodTemplateSpec", metadata, spec, t)
}

fn deployment(mut d: apps::Deployment) -> Converted {
    d.status.take();
    let spec = opt(d.spec.take(), |mut spec| {
        let strategy = opt(spec.strategy.take(), |mut s| {
            let out = Out::default().put("type", s.r#type.take()).done();
            nothing_left("DeploymentStrategy", s)?;
            Ok(out)
        })?;
        let out = Out::default()
            .keep("replicas", spec.replicas.take())
            .value("selector", opt(spec.selector.take(), label_selector)?)
            .value("template", opt(spec.template.take(), pod_template)?)
            .value("strategy", strategy)
            .done();
        nothing_left("DeploymentSpec", spec)?;
        Ok(out)
    })?;
    let metadata = d.metadata.take();
    object("Deployment", metadata, spec, d)
}

fn job_spec(mut spec: batch::JobSpec) -> Converted {
    let out = Out::default()
        .put("parallelism", spec.parallelism.take())
        .put("completions", spec.completions.take())
        .put("activeDeadlineSeconds", spec.active_deadline_seconds.take())
        .put("backoffLimit", spec.backoff_limit.take())
        .put("backoffLimitPerIndex", spec.backoff_limit_per_index.take())
        .put("maxFailedIndexes", spec.max_failed_indexes.take())
        .value("selector", opt(spec.selector.take(), label_selector)?)
        .put("manualSelector", spec.manual_selector.take())
        .value("template", opt(spec.template.take(), pod_template)?)
        .put(
            "ttlSecondsAfterFinished",
            spec.ttl_seconds_after_finished.take(),
        )
        .put("completionMode", spec.completion_mode.take())
        .put("suspend", spec.suspend.take())
        .put("podReplacementPolicy", spec.pod_replacement_policy.take())
        .done();
    nothing_left("JobSpec", spec)?;
    Ok(out)
}

fn job(mut j: batch::Job) -> Converted {
    j.status.take();
    let spec = opt(j.spec.take(), job_spec)?;
    let metadata = j.metadata.take();
    object("Job", metadata, spec, j)
}

fn cron_job(mut c: batch::CronJob) -> Converted {
    c.status.take();
    let spec = opt(c.spec.take(), |mut spec| {
        let template = opt(spec.job_template.take(), |mut t| {
            let metadata = opt(t.metadata.take(), object_meta)?;
            let out = Out::default()
                .value("metadata", metadata)
                .value("spec", opt(t.spec.take(), job_spec)?)
                .done();
            nothing_left("JobTemplateSpec", t)?;
            Ok(out)
        })?;
        let out = Out::default()
            .put("schedule", spec.schedule.take())
            .put("timeZone", spec.time_zone.take())
            .put(
                "startingDeadlineSeconds",
                spec.starting_deadline_seconds.take(),
            )
            .put("concurrencyPolicy", spec.concurrency_policy.take())
            .put("suspend", spec.suspend.take())
            .value("jobTemplate", template)
            .put(
                "successfulJobsHistoryLimit",
                spec.successful_jobs_history_limit.take(),
            )
            .put(
                "failedJobsHistoryLimit",
                spec.failed_jobs_history_limit.take(),
            )
            .done();
        nothing_left("CronJobSpec", spec)?;
        Ok(out)
    })?;
    let metadata = c.metadata.take();
    object("CronJob", metadata, spec, c)
}

fn pod_disruption_budget(mut p: policy::PodDisruptionBudget) -> Converted {
    p.status.take();
    let spec = opt(p.spec.take(), |mut spec| {
        let out = Out::default()
            .value(
                "minAvailable",
                spec.min_available
                    .take()
                    .map(|v| int_or_string(v).unwrap_or(json!(0))),
            )
            .value(
                "maxUnavailable",
                spec.max_unavailable
                    .take()
                    .map(|v| int_or_string(v).unwrap_or(json!(0))),
            )
            .value("selector", opt(spec.selector.take(), label_selector)?)
            .done();
        nothing_left("PodDisruptionBudgetSpec", spec)?;
        Ok(out)
    })?;
    let metadata = p.metadata.take();
    object("PodDisruptionBudget", metadata, spec, p)
}

fn resource_quota(mut q: core::ResourceQuota) -> Converted {
    q.status.take();
    let spec = opt(q.spec.take(), |mut spec| {
        let out = Out::default()
            .map("hard", quantities(std::mem::take(&mut spec.hard)))
            .list("scopes", std::mem::take(&mut spec.scopes))
            .done();
        nothing_left("ResourceQuotaSpec", spec)?;
        Ok(out)
    })?;
    let metadata = q.metadata.take();
    object("ResourceQuota", metadata, spec, q)
}

fn base64_map(values: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, String> {
    values
        .into_iter()
        .map(|(k, v)| (k, base64::engine::general_purpose::STANDARD.encode(v)))
        .collect()
}

fn secret(mut s: core::Secret) -> Converted {
    let out = Out::default()
        .value("metadata", opt(s.metadata.take(), object_meta)?)
        .map("data", base64_map(std::mem::take(&mut s.data)))
        .map("stringData", std::mem::take(&mut s.string_data))
        .put("type", s.r#type.take())
        .keep("immutable", s.immutable.take())
        .done();
    nothing_left("Secret", s)?;
    Ok(out)
}

fn config_map(mut c: core::ConfigMap) -> Converted {
    let out = Out::default()
        .value("metadata", opt(c.metadata.take(), object_meta)?)
        .map("data", std::mem::take(&mut c.data))
        .map("binaryData", base64_map(std::mem::take(&mut c.binary_data)))
        .keep("immutable", c.immutable.take())
        .done();
    nothing_left("ConfigMap", c)?;
    Ok(out)
}

/// An object of metadata and a spec (converted already); `rest` must hold nothing else.
fn object(
    what: &'static str,
    metadata: Option<meta::ObjectMeta>,
    spec: Option<Value>,
    rest: impl Message,
) -> Converted {
    let out = Out::default()
        .value("metadata", opt(metadata, object_meta)?)
        .value("spec", spec)
        .done();
    nothing_left(what, rest)?;
    Ok(out)
}

fn policy_rule(mut r: rbac::PolicyRule) -> Converted {
    let out = Out::default()
        .list("verbs", std::mem::take(&mut r.verbs))
        .list("apiGroups", std::mem::take(&mut r.api_groups))
        .list("resources", std::mem::take(&mut r.resources))
        .list("resourceNames", std::mem::take(&mut r.resource_names))
        .list("nonResourceURLs", std::mem::take(&mut r.non_resource_ur_ls))
        .done();
    nothing_left("PolicyRule", r)?;
    Ok(out)
}

fn role(metadata: Option<meta::ObjectMeta>, rules: Vec<rbac::PolicyRule>) -> Converted {
    Ok(Out::default()
        .value("metadata", opt(metadata, object_meta)?)
        .list("rules", each(rules, policy_rule)?)
        .done())
}

fn binding(
    metadata: Option<meta::ObjectMeta>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> Converted {
    let subjects = each(subjects, |mut s| {
        let out = Out::default()
            .put("kind", s.kind.take())
            .put("apiGroup", s.api_group.take())
            .put("name", s.name.take())
            .put("namespace", s.namespace.take())
            .done();
        nothing_left("Subject", s)?;
        Ok(out)
    })?;
    let role_ref = opt(role_ref, |mut r| {
        let out = Out::default()
            .put("apiGroup", r.api_group.take())
            .put("kind", r.kind.take())
            .put("name", r.name.take())
            .done();
        nothing_left("RoleRef", r)?;
        Ok(out)
    })?;
    Ok(Out::default()
        .value("metadata", opt(metadata, object_meta)?)
        .list("subjects", subjects)
        .value("roleRef", role_ref)
        .done())
}

fn token_request(mut t: authn::TokenRequest) -> Converted {
    t.status.take();
    let spec = opt(t.spec.take(), |mut spec| {
        let bound = opt(spec.bound_object_ref.take(), |mut b| {
            let out = Out::default()
                .put("kind", b.kind.take())
                .put("apiVersion", b.api_version.take())
                .put("name", b.name.take())
                .put("uid", b.u_id.take())
                .done();
            nothing_left("BoundObjectReference", b)?;
            Ok(out)
        })?;
        let out = Out::default()
            .list("audiences", std::mem::take(&mut spec.audiences))
            .keep("expirationSeconds", spec.expiration_seconds.take())
            .value("boundObjectRef", bound)
            .done();
        nothing_left("TokenRequestSpec", spec)?;
        Ok(out)
    })?;
    let metadata = t.metadata.take();
    object("TokenRequest", metadata, spec, t)
}

/// The attributes of an access review's spec.
fn access_attributes(
    resource: Option<authz::ResourceAttributes>,
    non_resource: Option<authz::NonResourceAttributes>,
    out: &mut Out,
) -> Result<(), Leftover> {
    let resource = opt(resource, |mut r| {
        let out = Out::default()
            .put("namespace", r.namespace.take())
            .put("verb", r.verb.take())
            .put("group", r.group.take())
            .put("version", r.version.take())
            .put("resource", r.resource.take())
            .put("subresource", r.subresource.take())
            .put("name", r.name.take())
            .done();
        nothing_left("ResourceAttributes", r)?;
        Ok(out)
    })?;
    let non_resource = opt(non_resource, |mut n| {
        let out = Out::default()
            .put("path", n.path.take())
            .put("verb", n.verb.take())
            .done();
        nothing_left("NonResourceAttributes", n)?;
        Ok(out)
    })?;
    out.value("resourceAttributes", resource)
        .value("nonResourceAttributes", non_resource);
    Ok(())
}

fn self_subject_access_review(mut r: authz::SelfSubjectAccessReview) -> Converted {
    r.status.take();
    let spec = opt(r.spec.take(), |mut spec| {
        let mut out = Out::default();
        access_attributes(
            spec.resource_attributes.take(),
            spec.non_resource_attributes.take(),
            &mut out,
        )?;
        nothing_left("SelfSubjectAccessReviewSpec", spec)?;
        Ok(out.done())
    })?;
    let metadata = r.metadata.take();
    object("SelfSubjectAccessReview", metadata, spec, r)
}

fn subject_access_review_spec(mut spec: authz::SubjectAccessReviewSpec) -> Converted {
    let mut out = Out::default();
    access_attributes(
        spec.resource_attributes.take(),
        spec.non_resource_attributes.take(),
        &mut out,
    )?;
    out.put("user", spec.user.take())
        .list("groups", std::mem::take(&mut spec.groups))
        .put("uid", spec.uid.take());
    nothing_left("SubjectAccessReviewSpec", spec)?;
    Ok(out.done())
}

fn self_subject_rules_review(mut r: authz::SelfSubjectRulesReview) -> Converted {
    r.status.take();
    let spec = opt(r.spec.take(), |mut spec| {
        let out = Out::default()
            .put("namespace", spec.namespace.take())
            .done();
        nothing_left("SelfSubjectRulesReviewSpec", spec)?;
        Ok(out)
    })?;
    let metadata = r.metadata.take();
    object("SelfSubjectRulesReview", metadata, spec, r)
}

fn malformed(error: prost::DecodeError) -> ApiError {
    ApiError::bad_request(format!(
        "the protobuf body is truncated or malformed: {error}"
    ))
}

/// Decodes `raw` as `T` with prost, then converts it.
fn read<T: Message + Default>(
    raw: &[u8],
    convert: impl FnOnce(T) -> Converted,
) -> ApiResult<Result<Value, Leftover>> {
    Ok(convert(T::decode(raw).map_err(malformed)?))
}

/// Decodes a protobuf request body into the JSON form of its object.
pub fn decode(body: &[u8]) -> ApiResult<Value> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::bad_request("the protobuf body lacks the k8s magic prefix"))?;
    let unknown = Unknown::decode(envelope).map_err(malformed)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let raw = raw.as_slice();
    let converted = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => read(raw, service)?,
        ("v1", "Pod") => read(raw, pod)?,
        ("apps/v1", "Deployment") => read(raw, deployment)?,
        ("batch/v1", "Job") => read(raw, job)?,
        ("batch/v1", "CronJob") => read(raw, cron_job)?,
        ("policy/v1", "PodDisruptionBudget") => read(raw, pod_disruption_budget)?,
        ("v1", "ResourceQuota") => read(raw, resource_quota)?,
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => {
            read(raw, certificate_signing_request)?
        }
        ("v1", "Secret") => read(raw, secret)?,
        ("v1", "ConfigMap") => read(raw, config_map)?,
        ("v1", "Namespace") => read(raw, |mut n: core::Namespace| {
            n.status.take();
            let metadata = n.metadata.take();
            object("Namespace", metadata, None, n)
        })?,
        ("v1", "ServiceAccount") => read(raw, |mut s: core::ServiceAccount| {
            let metadata = s.metadata.take();
            object("ServiceAccount", metadata, None, s)
        })?,
        ("rbac.authorization.k8s.io/v1", "Role") => {
            read(raw, |r: rbac::Role| role(r.metadata, r.rules))?
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => read(raw, |r: rbac::ClusterRole| {
            if r.aggregation_rule.is_some() {
                return Err(Leftover("ClusterRole"));
            }
            role(r.metadata, r.rules)
        })?,
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => read(raw, |b: rbac::RoleBinding| {
            binding(b.metadata, b.subjects, b.role_ref)
        })?,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            read(raw, |b: rbac::ClusterRoleBinding| {
                binding(b.metadata, b.subjects, b.role_ref)
            })?
        }
        ("authentication.k8s.io/v1", "TokenRequest") => read(raw, token_request)?,
        ("authentication.k8s.io/v1", "SelfSubjectReview") => {
            read(raw, |mut r: authn::SelfSubjectReview| {
                r.status.take();
                let metadata = r.metadata.take();
                object("SelfSubjectReview", metadata, None, r)
            })?
        }
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview") => {
            read(raw, self_subject_access_review)?
        }
        ("authorization.k8s.io/v1", "SubjectAccessReview") => {
            read(raw, |mut r: authz::SubjectAccessReview| {
                r.status.take();
                let metadata = r.metadata.take();
                let spec = opt(r.spec.take(), subject_access_review_spec)?;
                object("SubjectAccessReview", metadata, spec, r)
            })?
        }
        ("authorization.k8s.io/v1", "LocalSubjectAccessReview") => {
            read(raw, |mut r: authz::LocalSubjectAccessReview| {
                r.status.take();
                let metadata = r.metadata.take();
                let spec = opt(r.spec.take(), subject_access_review_spec)?;
                object("LocalSubjectAccessReview", metadata, spec, r)
            })?
        }
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => {
            read(raw, self_subject_rules_review)?
        }
        _ => {
            return Err(ApiError::UnsupportedMediaType {
                message: format!(
                    "the sim does not decode {api_version} {kind} from protobuf; send it as JSON"
                ),
            });
        }
    };
    match converted {
        Ok(mut object) => {
            object["apiVersion"] = json!(api_version);
            object["kind"] = json!(kind);
            Ok(object)
        }
        Err(Leftover(what)) => Err(ApiError::UnsupportedMediaType {
            message: format!(
                "the sim reads from protobuf the fields kubectl's create commands set; this {kind} sets other fields of its {what}: send it as JSON"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.to_owned()),
                kind: Some(kind.to_owned()),
            }),
            raw: Some(raw),
            ..Default::default()
        };
        [MAGIC.to_vec(), unknown.encode_to_vec()].concat()
    }

    fn named(name: &str) -> Option<meta::ObjectMeta> {
        Some(meta::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        })
    }

    #[test]
    fn a_deployment_as_kubectl_create_deployment_sends_it() {
        let labels: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        let deployment = apps::Deployment {
            metadata: Some(meta::ObjectMeta {
                labels: labels.clone(),
                ..named("web").unwrap()
            }),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(2),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(core::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(core::PodSpec {
                        containers: vec![core::Container {
                            name: Some("nginx".into()),
                            image: Some("nginx".into()),
                            resources: Some(Default::default()),
                            ports: vec![core::ContainerPort {
                                container_port: Some(80),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                strategy: Some(Default::default()),
                ..Default::default()
            }),
            status: Some(Default::default()),
        };
        let object = decode(&envelope(
            "apps/v1",
            "Deployment",
            deployment.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(
            object,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "strategy": {},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                        {"name": "nginx", "image": "nginx", "resources": {}, "ports": [{"containerPort": 80}]}]}}}})
        );
    }

    #[test]
    fn a_service_port_targets_a_number_or_a_name() {
        let service = core::Service {
            metadata: named("web"),
            spec: Some(core::ServiceSpec {
                r#type: Some("ClusterIP".into()),
                ports: vec![
                    core::ServicePort {
                        name: Some("http".into()),
                        port: Some(80),
                        target_port: Some(IntOrString {
                            r#type: Some(0),
                            int_val: Some(8080),
                            str_val: None,
                        }),
                        ..Default::default()
                    },
                    core::ServicePort {
                        name: Some("admin".into()),
                        port: Some(81),
                        target_port: Some(IntOrString {
                            r#type: Some(1),
                            int_val: None,
                            str_val: Some("admin".into()),
                        }),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            status: None,
        };
        let object = decode(&envelope("v1", "Service", service.encode_to_vec())).unwrap();
        assert_eq!(object["spec"]["ports"][0]["targetPort"], 8080);
        assert_eq!(object["spec"]["ports"][1]["targetPort"], "admin");
        assert_eq!(object["spec"]["type"], "ClusterIP");
    }

    #[test]
    fn a_field_the_sim_does_not_read_refuses_the_body_rather_than_dropping_it() {
        let pod_with_affinity = apps::Deployment {
            metadata: named("web"),
            spec: Some(apps::DeploymentSpec {
                template: Some(core::PodTemplateSpec {
                    metadata: None,
                    spec: Some(core::PodSpec {
                        hostname: Some("pinned".into()),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        };
        let error = decode(&envelope(
            "apps/v1",
            "Deployment",
            pod_with_affinity.encode_to_vec(),
        ))
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("this Deployment sets other fields of its PodSpec: send it as JSON"),
            "{error}"
        );
    }

    #[test]
    fn a_self_subject_access_review_and_secrets_decode() {
        let review = authz::SelfSubjectAccessReview {
            spec: Some(authz::SelfSubjectAccessReviewSpec {
                resource_attributes: Some(authz::ResourceAttributes {
                    namespace: Some("default".into()),
                    verb: Some("list".into()),
                    resource: Some("pods".into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
            ..Default::default()
        };
        let object = decode(&envelope(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            review.encode_to_vec(),
        ))
        .unwrap();
        assert_eq!(
            object["spec"]["resourceAttributes"],
            json!({"namespace": "default", "verb": "list", "resource": "pods"})
        );
        let secret = core::Secret {
            metadata: named("s"),
            data: [("k".to_owned(), b"v".to_vec())].into(),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let object = decode(&envelope("v1", "Secret", secret.encode_to_vec())).unwrap();
        assert_eq!(object["data"]["k"], "dg==");
    }
}
