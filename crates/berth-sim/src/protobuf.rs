//! Request bodies in Kubernetes' protobuf encoding, for the few types kubectl sends that way
//! (typed clients: `auth can-i`, `auth whoami`, `create token`, `create secret|configmap|
//! namespace|serviceaccount|role|rolebinding|clusterrole|clusterrolebinding`). The sim answers
//! in JSON, which those clients accept.

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};

const MAGIC: &[u8] = b"k8s\x00";

/// One decoded field: a varint or a length-delimited payload.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(bytes: &[u8], pos: &mut usize) -> ApiResult<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*pos).ok_or_else(truncated)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(truncated())
}

fn truncated() -> ApiError {
    ApiError::bad_request("the protobuf body is truncated or malformed")
}

fn fields(bytes: &[u8]) -> ApiResult<Vec<(u64, Field<'_>)>> {
    let mut pos = 0;
    let mut out = vec![];
    while pos < bytes.len() {
        let key = varint(bytes, &mut pos)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(bytes, &mut pos)?))),
            2 => {
                let len = varint(bytes, &mut pos)? as usize;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= bytes.len())
                    .ok_or_else(truncated)?;
                out.push((number, Field::Bytes(&bytes[pos..end])));
                pos = end;
            }
            1 => pos += 8,
            5 => pos += 4,
            _ => return Err(truncated()),
        }
    }
    Ok(out)
}

/// How to read one message: field number -> (JSON name, kind).
enum Kind {
    Str,
    RepeatedStr,
    Int,
    Bool,
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`, rendered base64 as in JSON.
    MapBytes,
    Message(&'static [(u64, &'static str, Kind)]),
    RepeatedMessage(&'static [(u64, &'static str, Kind)]),
}

const OBJECT_META: &[(u64, &str, Kind)] = &[
    (1, "name", Kind::Str),
    (2, "generateName", Kind::Str),
    (3, "namespace", Kind::Str),
    (11, "labels", Kind::MapStr),
    (12, "annotations", Kind::MapStr),
];
const SUBJECT: &[(u64, &str, Kind)] = &[
    (1, "kind", Kind::Str),
    (2, "apiGroup", Kind::Str),
    (3, "name", Kind::Str),
    (4, "namespace", Kind::Str),
];
const ROLE_REF: &[(u64, &str, Kind)] = &[
    (1, "apiGroup", Kind::Str),
    (2, "kind", Kind::Str),
    (3, "name", Kind::Str),
];
const POLICY_RULE: &[(u64, &str, Kind)] = &[
    (1, "verbs", Kind::RepeatedStr),
    (2, "apiGroups", Kind::RepeatedStr),
    (3, "resources", Kind::RepeatedStr),
    (4, "resourceNames", Kind::RepeatedStr),
    (5, "nonResourceURLs", Kind::RepeatedStr),
];
const BINDING: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "subjects", Kind::RepeatedMessage(SUBJECT)),
    (3, "roleRef", Kind::Message(ROLE_REF)),
];
const ROLE: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "rules", Kind::RepeatedMessage(POLICY_RULE)),
];
const SECRET: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "data", Kind::MapBytes),
    (3, "type", Kind::Str),
    (4, "stringData", Kind::MapStr),
    (5, "immutable", Kind::Bool),
];
const CONFIG_MAP: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "data", Kind::MapStr),
    (3, "binaryData", Kind::MapBytes),
    (4, "immutable", Kind::Bool),
];
const RESOURCE_ATTRIBUTES: &[(u64, &str, Kind)] = &[
    (1, "namespace", Kind::Str),
    (2, "verb", Kind::Str),
    (3, "group", Kind::Str),
    (4, "version", Kind::Str),
    (5, "resource", Kind::Str),
    (6, "subresource", Kind::Str),
    (7, "name", Kind::Str),
];
const NON_RESOURCE_ATTRIBUTES: &[(u64, &str, Kind)] =
    &[(1, "path", Kind::Str), (2, "verb", Kind::Str)];
const SELF_SAR_SPEC: &[(u64, &str, Kind)] = &[
    (1, "resourceAttributes", Kind::Message(RESOURCE_ATTRIBUTES)),
    (
        2,
        "nonResourceAttributes",
        Kind::Message(NON_RESOURCE_ATTRIBUTES),
    ),
];
const SELF_SAR: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "spec", Kind::Message(SELF_SAR_SPEC)),
];
const SAR_SPEC: &[(u64, &str, Kind)] = &[
    (1, "resourceAttributes", Kind::Message(RESOURCE_ATTRIBUTES)),
    (
        2,
        "nonResourceAttributes",
        Kind::Message(NON_RESOURCE_ATTRIBUTES),
    ),
    (3, "user", Kind::Str),
    (4, "groups", Kind::RepeatedStr),
    (6, "uid", Kind::Str),
];
const SAR: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "spec", Kind::Message(SAR_SPEC)),
];
const BOUND_OBJECT: &[(u64, &str, Kind)] = &[
    (1, "kind", Kind::Str),
    (2, "apiVersion", Kind::Str),
    (3, "name", Kind::Str),
    (4, "uid", Kind::Str),
];
const TOKEN_REQUEST_SPEC: &[(u64, &str, Kind)] = &[
    (1, "audiences", Kind::RepeatedStr),
    (3, "boundObjectRef", Kind::Message(BOUND_OBJECT)),
    (4, "expirationSeconds", Kind::Int),
];
const TOKEN_REQUEST: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "spec", Kind::Message(TOKEN_REQUEST_SPEC)),
];
const JUST_META: &[(u64, &str, Kind)] = &[(1, "metadata", Kind::Message(OBJECT_META))];
const SELF_RULES_REVIEW_SPEC: &[(u64, &str, Kind)] = &[(1, "namespace", Kind::Str)];
const SELF_RULES_REVIEW: &[(u64, &str, Kind)] = &[
    (1, "metadata", Kind::Message(OBJECT_META)),
    (2, "spec", Kind::Message(SELF_RULES_REVIEW_SPEC)),
];

fn message(bytes: &[u8], schema: &[(u64, &str, Kind)]) -> ApiResult<Value> {
    let mut out = Map::new();
    for (number, field) in fields(bytes)? {
        let Some((_, name, kind)) = schema.iter().find(|(n, _, _)| *n == number) else {
            continue;
        };
        match (kind, field) {
            (Kind::Str, Field::Bytes(b)) => {
                out.insert((*name).to_owned(), json!(String::from_utf8_lossy(b)));
            }
            (Kind::RepeatedStr, Field::Bytes(b)) => {
                let list = out.entry((*name).to_owned()).or_insert_with(|| json!([]));
                if let Value::Array(items) = list {
                    items.push(json!(String::from_utf8_lossy(b)));
                }
            }
            (Kind::Int, Field::Varint(v)) => {
                out.insert((*name).to_owned(), json!(v as i64));
            }
            (Kind::Bool, Field::Varint(v)) => {
                out.insert((*name).to_owned(), json!(v != 0));
            }
            (Kind::MapStr | Kind::MapBytes, Field::Bytes(entry)) => {
                let (mut key, mut value) = (String::new(), Value::String(String::new()));
                for (n, f) in fields(entry)? {
                    if let Field::Bytes(b) = f {
                        match (n, kind) {
                            (1, _) => key = String::from_utf8_lossy(b).into_owned(),
                            (2, Kind::MapBytes) => {
                                value = json!(base64::engine::general_purpose::STANDARD.encode(b))
                            }
                            (2, _) => value = json!(String::from_utf8_lossy(b)),
                            _ => {}
                        }
                    }
                }
                let map = out.entry((*name).to_owned()).or_insert_with(|| json!({}));
                map[key] = value;
            }
            (Kind::Message(inner), Field::Bytes(b)) => {
                out.insert((*name).to_owned(), message(b, inner)?);
            }
            (Kind::RepeatedMessage(inner), Field::Bytes(b)) => {
                let list = out.entry((*name).to_owned()).or_insert_with(|| json!([]));
                if let Value::Array(items) = list {
                    items.push(message(b, inner)?);
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf request body into the JSON form of its object.
pub fn decode(body: &[u8]) -> ApiResult<Value> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::bad_request("the protobuf body lacks the k8s magic prefix"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (number, field) in fields(unknown)? {
        match (number, field) {
            (1, Field::Bytes(type_meta)) => {
                for (n, f) in fields(type_meta)? {
                    if let Field::Bytes(b) = f {
                        match n {
                            1 => api_version = String::from_utf8_lossy(b).into_owned(),
                            2 => kind = String::from_utf8_lossy(b).into_owned(),
                            _ => {}
                        }
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let schema = match kind.as_str() {
        "SelfSubjectAccessReview" => SELF_SAR,
        "SubjectAccessReview" | "LocalSubjectAccessReview" => SAR,
        "TokenRequest" => TOKEN_REQUEST,
        "SelfSubjectRulesReview" => SELF_RULES_REVIEW,
        "SelfSubjectReview" | "Namespace" | "ServiceAccount" => JUST_META,
        "ClusterRoleBinding" | "RoleBinding" => BINDING,
        "ClusterRole" | "Role" => ROLE,
        "Secret" => SECRET,
        "ConfigMap" => CONFIG_MAP,
        other => {
            return Err(ApiError::UnsupportedMediaType {
                message: format!("the sim does not decode {other} from protobuf; send JSON"),
            });
        }
    };
    let mut object = message(raw, schema)?;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![((number << 3) | 2) as u8, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn decodes_a_self_subject_access_review() {
        let attributes = [field(1, b"default"), field(2, b"list"), field(5, b"pods")].concat();
        let spec = field(1, &attributes);
        let raw = field(2, &spec);
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &raw)].concat();
        let object = decode(&body).unwrap();
        assert_eq!(object["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            object["spec"]["resourceAttributes"],
            json!({"namespace": "default", "verb": "list", "resource": "pods"})
        );
    }
}
