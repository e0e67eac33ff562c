//! Who is calling, and may they: the bearer token goes to TokenReview (audience
//! `berth-agent`), the user it names to SubjectAccessReview (`use` on `workspaces/agent` of
//! this workspace). Answers are cached briefly (allow 5 min, deny 5 s, so a fix takes effect
//! quickly), keyed by a hash of the token, never the token. Tokens are never logged.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{authentication::v1::TokenReview, authorization::v1::SubjectAccessReview};
use kube::{Api, api::PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};
use tonic::{Code, Status, metadata::MetadataValue};

/// How long an allowed caller is remembered.
pub const ALLOW_TTL: Duration = Duration::from_secs(300);
/// How long a refused caller is remembered.
pub const DENY_TTL: Duration = Duration::from_secs(5);

/// The workspace this agent serves, and who the agent itself runs as.
#[derive(Clone, Debug)]
pub struct Scope {
    pub namespace: String,
    pub workspace: String,
    pub pod: String,
    /// The agent's own identity, e.g. `system:serviceaccount:team-a:default`: what must be
    /// bound to `system:auth-delegator`.
    pub service_account: String,
}

/// An authenticated, authorized caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub username: String,
    pub groups: Vec<String>,
}

/// How the agent authenticates callers.
#[derive(Clone)]
pub enum Mode {
    /// TokenReview and SubjectAccessReview through this client (the pod's service account).
    Kube(kube::Client),
    /// Everyone is allowed: for local debugging only.
    None,
}

/// A remembered answer and when it was given, by the SHA-256 of the token.
type Answers = HashMap<[u8; 32], (Result<Caller, Status>, Instant)>;

/// The authenticator with its cache.
pub struct Authenticator {
    mode: Mode,
    scope: Scope,
    cache: Mutex<Answers>,
    /// Whether the API's refusal of a review was logged (once, until a review works again).
    refusal_logged: std::sync::atomic::AtomicBool,
}

fn api_refusal(api: &str, error: &kube::Error, scope: &Scope) -> Status {
    match error {
        kube::Error::Api(status) if status.code == 403 => {
            // A command that pastes into a shell as it is: real names, no placeholders.
            let account = scope
                .service_account
                .strip_prefix("system:serviceaccount:")
                .unwrap_or(&scope.service_account);
            let binding = format!("berth-agent-{}", account.replace(':', "-"));
            Status::unauthenticated(format!(
                "{api} API is unavailable: grant system:auth-delegator to {} (kubectl create clusterrolebinding {binding} --clusterrole=system:auth-delegator --serviceaccount={account})",
                scope.service_account,
            ))
        }
        other => Status::unauthenticated(format!("{api} API is unavailable: {other}")),
    }
}

impl Authenticator {
    pub fn new(mode: Mode, scope: Scope) -> Self {
        if matches!(mode, Mode::None) {
            tracing::warn!(
                "auth mode none: every caller is allowed; use it for local debugging only"
            );
        }
        Authenticator {
            mode,
            scope,
            cache: Mutex::new(HashMap::new()),
            refusal_logged: Default::default(),
        }
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Logs what to fix the first time the API refuses a review (the caller gets it every time).
    fn refused(&self, status: Status) -> Status {
        if !self
            .refusal_logged
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(detail = status.message(), "the API server refused a review");
        }
        status
    }

    /// Authenticates and authorizes the bearer token from `authorization` metadata.
    pub async fn check(&self, authorization: Option<&str>) -> Result<Caller, Status> {
        let client = match &self.mode {
            Mode::None => {
                return Ok(Caller {
                    username: "system:anonymous".into(),
                    groups: vec![],
                });
            }
            Mode::Kube(client) => client.clone(),
        };
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Status::unauthenticated("request has no bearer token"))?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((answer, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            let ttl = if answer.is_ok() { ALLOW_TTL } else { DENY_TTL };
            if at.elapsed() < ttl {
                return answer.clone();
            }
        }
        let answer = self.review(client, token).await;
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (answer.clone(), Instant::now()));
        answer
    }

    async fn review(&self, client: kube::Client, token: &str) -> Result<Caller, Status> {
        let reviews: Api<TokenReview> = Api::all(client.clone());
        let request: TokenReview = serde_json::from_value(
            json!({"spec": {"token": token, "audiences": [crate::AUDIENCE]}}),
        )
        .map_err(|e| Status::internal(e.to_string()))?;
        let reviewed = reviews
            .create(&PostParams::default(), &request)
            .await
            .map_err(|e| self.refused(api_refusal("TokenReview", &e, &self.scope)))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let mut refusal = Status::unauthenticated(format!(
                "the token is not valid for audience {}: {}",
                crate::AUDIENCE,
                status.error.unwrap_or_else(|| "not authenticated".into())
            ));
            // Tells the caller that a new token may help (it may not, when the review API
            // itself is refused).
            refusal
                .metadata_mut()
                .insert(crate::TOKEN_REJECTED, MetadataValue::from_static("true"));
            return Err(refusal);
        }
        let user = status.user.unwrap_or_default();
        let caller = Caller {
            username: user.username.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
        };

        let sars: Api<SubjectAccessReview> = Api::all(client);
        let request: SubjectAccessReview = serde_json::from_value(json!({"spec": {
            "user": caller.username,
            "groups": caller.groups,
            "uid": user.uid,
            "resourceAttributes": {"namespace": self.scope.namespace, "verb": "use", "group": "berth.dev", "resource": "workspaces", "subresource": "agent", "name": self.scope.workspace}
        }}))
        .map_err(|e| Status::internal(e.to_string()))?;
        let decided = sars
            .create(&PostParams::default(), &request)
            .await
            .map_err(|e| self.refused(api_refusal("SubjectAccessReview", &e, &self.scope)))?;
        self.refusal_logged
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let decision = decided.status.unwrap_or_default();
        if !decision.allowed {
            let why = decision
                .reason
                .filter(|r| !r.is_empty())
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            return Err(Status::new(
                Code::PermissionDenied,
                format!(
                    "User \"{}\" cannot use workspaces/agent \"{}\" in API group \"berth.dev\" in the namespace \"{}\"{why}",
                    caller.username, self.scope.workspace, self.scope.namespace
                ),
            ));
        }
        Ok(caller)
    }
}
