//! Errors of the simulated API server, each rendered as the `Status` object the real API
//! server returns: same `code`, `reason`, message wording and `details`.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

/// One field-level cause of an `Invalid` error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// e.g. `FieldValueInvalid`, `FieldValueRequired`.
    pub reason: String,
    /// The human message, e.g. `Invalid value: "x": must be ...`.
    pub message: String,
    /// The field path, e.g. `spec.image`.
    pub field: String,
}

/// An API error. `kind` and `name` feed the message and `details`, as the real server does.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest { message: String },
    #[error("Unauthorized")]
    Unauthorized,
    #[error("{message}")]
    Forbidden {
        message: String,
        kind: String,
        name: Option<String>,
        group: String,
    },
    #[error("{message}")]
    NotFound {
        message: String,
        kind: String,
        name: Option<String>,
        group: String,
    },
    #[error("{message}")]
    AlreadyExists {
        message: String,
        kind: String,
        name: String,
        group: String,
    },
    #[error("{message}")]
    Conflict {
        message: String,
        kind: String,
        name: String,
        group: String,
        causes: Vec<Cause>,
    },
    #[error("{message}")]
    Gone { message: String },
    #[error("{message}")]
    Invalid {
        message: String,
        kind: String,
        name: String,
        group: String,
        causes: Vec<Cause>,
    },
    #[error("{message}")]
    MethodNotAllowed { message: String },
    #[error("{message}")]
    UnsupportedMediaType { message: String },
    #[error("{message}")]
    NotAcceptable { message: String },
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after_seconds: u64,
    },
    #[error("{message}")]
    Internal { message: String },
    #[error("{message}")]
    ServiceUnavailable { message: String },
    #[error("{message}")]
    Timeout { message: String },
    /// A list or watch from a resourceVersion the store has not reached (after a wait).
    #[error("Timeout: Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion {
        requested: u64,
        current: u64,
        retry_after_seconds: u64,
    },
    /// An admission webhook's denial, with the code it gave (400 at least).
    #[error("{message}")]
    Denied { code: u16, message: String },
    /// A ValidatingAdmissionPolicy's denial.
    #[error("{}", .0.message)]
    Policy(Box<PolicyDenial>),
}

/// A ValidatingAdmissionPolicy's denial: the validation's reason and its code, and the denial
/// (without the object's name) as the one cause.
#[derive(Clone, Debug)]
pub struct PolicyDenial {
    pub message: String,
    pub reason: String,
    pub code: u16,
    pub kind: String,
    pub group: String,
    pub name: String,
    pub cause: String,
}

/// `Result` with [`ApiError`].
pub type ApiResult<T> = Result<T, ApiError>;

/// `pods "x"` or just `pods` — how the API names an object in messages.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::Internal {
            message: message.into(),
        }
    }

    /// `pods "x" not found`.
    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        ApiError::NotFound {
            message: format!("{} \"{name}\" not found", qualified(resource, group)),
            kind: resource.to_owned(),
            name: Some(name.to_owned()),
            group: group.to_owned(),
        }
    }

    /// 404 for a path that serves nothing.
    pub fn no_such_path() -> Self {
        ApiError::NotFound {
            message: "the server could not find the requested resource".to_owned(),
            kind: String::new(),
            name: None,
            group: String::new(),
        }
    }

    /// `pods "x" already exists`.
    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        ApiError::AlreadyExists {
            message: format!("{} \"{name}\" already exists", qualified(resource, group)),
            kind: resource.to_owned(),
            name: name.to_owned(),
            group: group.to_owned(),
        }
    }

    /// The optimistic-concurrency conflict.
    pub fn conflict_modified(resource: &str, group: &str, name: &str) -> Self {
        ApiError::Conflict {
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(resource, group)
            ),
            kind: resource.to_owned(),
            name: name.to_owned(),
            group: group.to_owned(),
            causes: vec![],
        }
    }

    /// A conflict with a custom sentence after the object name.
    pub fn conflict(
        resource: &str,
        group: &str,
        name: &str,
        reason: &str,
        causes: Vec<Cause>,
    ) -> Self {
        ApiError::Conflict {
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": {reason}",
                qualified(resource, group)
            ),
            kind: resource.to_owned(),
            name: name.to_owned(),
            group: group.to_owned(),
            causes,
        }
    }

    /// `Workspace.berth.dev "x" is invalid: <cause>, <cause>`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified_kind = qualified(kind, group);
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        ApiError::Invalid {
            message: format!("{qualified_kind} \"{name}\" is invalid: {joined}"),
            kind: kind.to_owned(),
            name: name.to_owned(),
            group: group.to_owned(),
            causes,
        }
    }

    pub fn code(&self) -> u16 {
        match self {
            ApiError::BadRequest { .. } => 400,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::NotFound { .. } => 404,
            ApiError::MethodNotAllowed { .. } => 405,
            ApiError::NotAcceptable { .. } => 406,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::Gone { .. } => 410,
            ApiError::UnsupportedMediaType { .. } => 415,
            ApiError::Invalid { .. } => 422,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::Internal { .. } => 500,
            ApiError::ServiceUnavailable { .. } => 503,
            ApiError::Timeout { .. } | ApiError::TooLargeResourceVersion { .. } => 504,
            ApiError::Denied { code, .. } => *code,
            ApiError::Policy(denial) => denial.code,
        }
    }

    /// The `reason` field of the Status.
    pub fn reason(&self) -> &str {
        match self {
            ApiError::BadRequest { .. } => "BadRequest",
            ApiError::Unauthorized => "Unauthorized",
            ApiError::Forbidden { .. } => "Forbidden",
            ApiError::NotFound { .. } => "NotFound",
            ApiError::MethodNotAllowed { .. } => "MethodNotAllowed",
            ApiError::NotAcceptable { .. } => "NotAcceptable",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } => "Conflict",
            ApiError::Gone { .. } => "Expired",
            ApiError::UnsupportedMediaType { .. } => "UnsupportedMediaType",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::TooManyRequests { .. } => "TooManyRequests",
            ApiError::Internal { .. } => "InternalError",
            ApiError::ServiceUnavailable { .. } => "ServiceUnavailable",
            ApiError::Timeout { .. } | ApiError::TooLargeResourceVersion { .. } => "Timeout",
            ApiError::Policy(denial) => denial.reason.as_str(),
            ApiError::Denied { code, .. } => match code {
                401 => "Unauthorized",
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                422 => "Invalid",
                429 => "TooManyRequests",
                500.. => "InternalError",
                _ => "BadRequest",
            },
        }
    }

    /// The error as a `Status` object.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            ApiError::NotFound {
                kind, name, group, ..
            }
            | ApiError::Forbidden {
                kind, name, group, ..
            } => {
                // The real server's NotFound and Forbidden always carry details, empty for a
                // path it does not serve (kubectl debug reads `details.name` of one).
                if kind.is_empty() {
                    Some(json!({}))
                } else {
                    let mut d = json!({"kind": kind});
                    if let Some(name) = name {
                        d["name"] = json!(name);
                    }
                    if !group.is_empty() {
                        d["group"] = json!(group);
                    }
                    Some(d)
                }
            }
            ApiError::AlreadyExists {
                kind, name, group, ..
            } => {
                let mut d = json!({"name": name, "kind": kind});
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                Some(d)
            }
            ApiError::Conflict {
                kind,
                name,
                group,
                causes,
                ..
            }
            | ApiError::Invalid {
                kind,
                name,
                group,
                causes,
                ..
            } => {
                let mut d = json!({"name": name, "kind": kind});
                if !group.is_empty() {
                    d["group"] = json!(group);
                }
                if !causes.is_empty() {
                    d["causes"] = causes
                        .iter()
                        .map(
                            |c| json!({"reason": c.reason, "message": c.message, "field": c.field}),
                        )
                        .collect();
                }
                Some(d)
            }
            ApiError::Policy(denial) => {
                let mut d = json!({"name": denial.name, "kind": denial.kind});
                if !denial.group.is_empty() {
                    d["group"] = json!(denial.group);
                }
                d["causes"] = json!([{"message": denial.cause}]);
                Some(d)
            }
            ApiError::TooManyRequests {
                retry_after_seconds,
                ..
            } => Some(json!({"retryAfterSeconds": retry_after_seconds})),
            ApiError::TooLargeResourceVersion {
                retry_after_seconds,
                ..
            } => Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": retry_after_seconds
            })),
            _ => None,
        };
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            crate::json::to_string(&self.status()),
        )
            .into_response();
        if let ApiError::TooManyRequests {
            retry_after_seconds,
            ..
        } = &self
            && let Ok(value) = HeaderValue::from_str(&retry_after_seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// `Invalid value` of a field, in the real server's words.
pub(crate) fn invalid(field: &str, value: &str, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".to_owned(),
        message: format!("Invalid value: \"{value}\": {message}"),
        field: field.to_owned(),
    }
}

/// `Unsupported value` with the supported values, sorted as the real server lists them.
pub(crate) fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    Cause {
        reason: "FieldValueNotSupported".to_owned(),
        message: format!(
            "Unsupported value: \"{value}\": supported values: {}",
            list.join(", ")
        ),
        field: field.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_requests_carries_retry_after() {
        let response = ApiError::TooManyRequests {
            message: "slow down".into(),
            retry_after_seconds: 3,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "3");
    }

    /// kubectl debug reads `details.name` of a NotFound: a path the server does not serve
    /// has empty details, as the real server's.
    #[test]
    fn a_not_found_always_has_details() {
        let status = ApiError::no_such_path().status();
        assert_eq!(status["code"], 404);
        assert_eq!(status["details"], json!({}));
    }

    #[test]
    fn invalid_lists_every_cause() {
        let causes = vec![
            Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "spec.image".into(),
            },
            Cause {
                reason: "FieldValueInvalid".into(),
                message: "Invalid value: 1000: too big".into(),
                field: "spec.mode".into(),
            },
        ];
        let err = ApiError::invalid("Workspace", "berth.dev", "w", causes);
        assert_eq!(
            err.to_string(),
            "Workspace.berth.dev \"w\" is invalid: [spec.image: Required value, spec.mode: Invalid value: 1000: too big]"
        );
        let status = err.status();
        assert_eq!(status["code"], 422);
        assert_eq!(status["details"]["causes"][1]["field"], "spec.mode");
    }
}
