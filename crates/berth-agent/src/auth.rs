//! Who is calling, and may they: the bearer token goes to TokenReview (audience
//! `berth-agent/<namespace>`, so a token for one namespace's agents opens no other), the user
//! it names to SubjectAccessReview (`use` on `workspaces/agent` of this workspace; `shell`
//! for the `Shell` RPC, which the gateway has and the operator does not need).
//!
//! Before any review, the token must look like what the operator sends: a service-account
//! JWT whose (unverified) claims name this agent's audience and have not expired; anything
//! else is refused without asking the API server. Answers are cached briefly (allow 5 min,
//! deny 5 s, so a fix takes effect quickly), keyed by a hash of the token, never the token,
//! in a cache of bounded size; reviews of tokens not in it run a few at a time. The review
//! APIs get bounded retries within the caller's deadline, then the caller hears
//! `Unavailable` in the agent's words. Tokens are never logged.

use std::{
    num::NonZeroUsize,
    sync::{
        Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine;
use lru::LruCache;

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

/// What a caller may be allowed to do with the agent (the verb on `workspaces/agent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// Every call but `Shell`: the operator's.
    Use,
    /// `Shell`: the gateway's, for people it authorized.
    Shell,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Use => "use",
            Verb::Shell => "shell",
        }
    }
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
    /// TokenReview and SubjectAccessReview through this client (the pod's service account);
    /// made by [`Mode::kube`].
    Kube(kube::Client),
    /// Everyone is allowed: for local debugging only.
    None,
}

impl Mode {
    /// Reviews through a client with `config`, without kube's own retries: those go on for
    /// minutes, where the authenticator retries within the caller's deadline.
    pub fn kube(mut config: kube::Config) -> Result<Self, kube::Error> {
        config.default_retry = false;
        Ok(Mode::Kube(kube::Client::try_from(config)?))
    }
}

/// A remembered answer and when it was given, by the SHA-256 of the token.
type Answers = LruCache<[u8; 32], (Result<Caller, Status>, Instant)>;

/// What the authenticator may spend on callers it does not know.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Answers remembered; the least recently used goes first.
    pub cached: NonZeroUsize,
    /// Reviews of tokens not remembered that run at once; others wait within their budget.
    pub concurrent_reviews: usize,
    /// The most one check spends on reviews, retries and waiting included, when the caller
    /// set no shorter deadline (a caller's `grpc-timeout` counts three quarters). The default
    /// leaves the operator's WhoAmI (5 s) its three quarters: an API server that answers in
    /// three seconds under a burst is slow, not down, and an answer the operator would still
    /// have waited for is worth more than a failed check and its retry.
    pub budget: Duration,
    /// How long a refused caller is remembered ([`DENY_TTL`]).
    pub deny_ttl: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cached: NonZeroUsize::new(4096).expect("non-zero"),
            concurrent_reviews: 8,
            budget: Duration::from_secs(4),
            deny_ttl: DENY_TTL,
        }
    }
}

/// What the authenticator has done, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Answers in the cache now.
    pub cached: usize,
    /// TokenReviews sent (retries included).
    pub token_reviews: u64,
    /// The most reviews that ever ran at once.
    pub peak_concurrent_reviews: usize,
}

/// The authenticator with its cache.
pub struct Authenticator {
    mode: Mode,
    scope: Scope,
    limits: Limits,
    cache: Mutex<Answers>,
    reviews: tokio::sync::Semaphore,
    peak_in_flight: AtomicUsize,
    token_reviews: AtomicU64,
    /// Whether the API's refusal of a review was logged (once, until a review works again).
    refusal_logged: std::sync::atomic::AtomicBool,
}

/// The claims the agent reads from a token before reviewing it (unverified: they only spare
/// the API server tokens that cannot be the operator's).
#[derive(serde::Deserialize)]
struct Claims {
    #[serde(default)]
    aud: Audiences,
    exp: Option<i64>,
}

#[derive(serde::Deserialize, Default)]
#[serde(untagged)]
enum Audiences {
    One(String),
    Many(Vec<String>),
    #[default]
    None,
}

impl Audiences {
    fn list(&self) -> Vec<&str> {
        match self {
            Audiences::One(a) => vec![a.as_str()],
            Audiences::Many(list) => list.iter().map(String::as_str).collect(),
            Audiences::None => vec![],
        }
    }
}

/// A refusal of the token itself: a new token may be accepted.
fn token_refused(message: String) -> Status {
    let mut refusal = Status::unauthenticated(message);
    refusal
        .metadata_mut()
        .insert(crate::TOKEN_REJECTED, MetadataValue::from_static("true"));
    refusal
}

/// Refuses a token that cannot be one the operator sends for `audience`, without a review.
fn screen(token: &str, audience: &str, now: jiff::Timestamp) -> Result<(), Status> {
    let not_valid = |why: &str| {
        token_refused(format!(
            "the token is not valid for audience {audience}: {why}"
        ))
    };
    let mut parts = token.split('.');
    let payload = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(payload), Some(_), None) => payload,
        _ => return Err(not_valid("it is not a service-account token (a JWT)")),
    };
    let claims: Claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| not_valid("its claims cannot be read"))?;
    let audiences = claims.aud.list();
    if !audiences.contains(&audience) {
        return Err(not_valid(&format!("it is for {audiences:?}")));
    }
    if claims.exp.is_some_and(|exp| exp <= now.as_second()) {
        return Err(not_valid("it has expired"));
    }
    Ok(())
}

/// Whether an API error may go away by asking again.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        // Connection and protocol errors: nothing answered.
        _ => true,
    }
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
        Authenticator::with_limits(mode, scope, Limits::default())
    }

    pub fn with_limits(mode: Mode, scope: Scope, limits: Limits) -> Self {
        Authenticator {
            mode,
            scope,
            // Unbounded to the crate, bounded by `put`: `LruCache::new` allocates room for
            // every entry up front (about 300 KiB for 4096), where an agent sees a handful.
            cache: Mutex::new(LruCache::unbounded()),
            reviews: tokio::sync::Semaphore::new(limits.concurrent_reviews.max(1)),
            limits,
            peak_in_flight: AtomicUsize::new(0),
            token_reviews: AtomicU64::new(0),
            refusal_logged: Default::default(),
        }
    }

    /// The audience this agent accepts: the operator's tokens for this namespace.
    pub fn audience(&self) -> String {
        crate::audience(&self.scope.namespace)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            cached: self.cache.lock().unwrap_or_else(|p| p.into_inner()).len(),
            token_reviews: self.token_reviews.load(Ordering::Relaxed),
            peak_concurrent_reviews: self.peak_in_flight.load(Ordering::Relaxed),
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

    /// Authenticates and authorizes the bearer token from `authorization` metadata for `use`,
    /// within `deadline` (the caller's, if it sent one).
    pub async fn check(
        &self,
        authorization: Option<&str>,
        deadline: Option<Duration>,
    ) -> Result<Caller, Status> {
        self.check_verb(authorization, deadline, Verb::Use).await
    }

    /// As [`Authenticator::check`], for `verb` on `workspaces/agent`.
    pub async fn check_verb(
        &self,
        authorization: Option<&str>,
        deadline: Option<Duration>,
        verb: Verb,
    ) -> Result<Caller, Status> {
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
        let audience = self.audience();
        screen(token, &audience, jiff::Timestamp::now())?;
        let key: [u8; 32] = Sha256::new()
            .chain_update(verb.as_str())
            .chain_update([0])
            .chain_update(token.as_bytes())
            .finalize()
            .into();
        if let Some((answer, at)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            let ttl = if answer.is_ok() {
                ALLOW_TTL
            } else {
                self.limits.deny_ttl
            };
            if at.elapsed() < ttl {
                return answer.clone();
            }
        }
        let budget = deadline
            .map(|d| d * 3 / 4)
            .map_or(self.limits.budget, |d| d.min(self.limits.budget));
        let until = tokio::time::Instant::now() + budget;
        let Ok(Ok(_permit)) = tokio::time::timeout_at(until, self.reviews.acquire()).await else {
            return Err(Status::resource_exhausted(format!(
                "the agent is busy checking other callers ({} at once); try again",
                self.limits.concurrent_reviews
            )));
        };
        // Reviews running now, this one included: the permits taken.
        let running = self.limits.concurrent_reviews.max(1) - self.reviews.available_permits();
        self.peak_in_flight.fetch_max(running, Ordering::Relaxed);
        let answer = self.review(client, token, &audience, verb, until).await;
        // An outage is not an answer about this token.
        if !matches!(answer, Err(ref s) if s.code() == Code::Unavailable) {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.put(key, (answer.clone(), Instant::now()));
            while cache.len() > self.limits.cached.get() {
                cache.pop_lru();
            }
        }
        answer
    }

    /// Sends `request` to the review API `api`, again while it answers 429/5xx or not at all,
    /// until `until`; then says the API is unavailable, in its own words.
    async fn ask<K, F, Fut>(
        &self,
        api: &str,
        until: tokio::time::Instant,
        mut request: F,
    ) -> Result<K, Status>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<K, kube::Error>>,
    {
        let started = tokio::time::Instant::now();
        let mut attempts = 0u32;
        let mut pause = Duration::from_millis(50);
        let last = loop {
            attempts += 1;
            let last = match tokio::time::timeout_at(until, request()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(error)) if !transient(&error) => {
                    return Err(self.refused(api_refusal(api, &error, &self.scope)));
                }
                Ok(Err(kube::Error::Api(status))) => status.message.clone(),
                Ok(Err(error)) => error.to_string(),
                Err(_) => break "no answer".to_owned(),
            };
            if tokio::time::Instant::now() + pause >= until {
                break last;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let mut status = Status::unavailable(format!(
            "{api} API is unavailable: {last} ({attempts} attempts in {:.1}s); the agent cannot check callers until it answers",
            started.elapsed().as_secs_f32()
        ));
        status.metadata_mut().insert(
            crate::REVIEW_UNAVAILABLE,
            MetadataValue::from_static("true"),
        );
        tracing::warn!(detail = status.message(), "a review API is unavailable");
        Err(status)
    }

    async fn review(
        &self,
        client: kube::Client,
        token: &str,
        audience: &str,
        verb: Verb,
        until: tokio::time::Instant,
    ) -> Result<Caller, Status> {
        let reviews: Api<TokenReview> = Api::all(client.clone());
        let request: TokenReview =
            serde_json::from_value(json!({"spec": {"token": token, "audiences": [audience]}}))
                .map_err(|e| Status::internal(e.to_string()))?;
        let post = PostParams::default();
        let reviewed = self
            .ask("TokenReview", until, || {
                self.token_reviews.fetch_add(1, Ordering::Relaxed);
                reviews.create(&post, &request)
            })
            .await?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(token_refused(format!(
                "the token is not valid for audience {audience}: {}",
                status.error.unwrap_or_else(|| "not authenticated".into())
            )));
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
            "resourceAttributes": {"namespace": self.scope.namespace, "verb": verb.as_str(), "group": "berth.dev", "resource": "workspaces", "subresource": "agent", "name": self.scope.workspace}
        }}))
        .map_err(|e| Status::internal(e.to_string()))?;
        let decided = self
            .ask("SubjectAccessReview", until, || {
                sars.create(&post, &request)
            })
            .await?;
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
                    "User \"{}\" cannot {} workspaces/agent \"{}\" in API group \"berth.dev\" in the namespace \"{}\"{why}",
                    caller.username,
                    verb.as_str(),
                    self.scope.workspace,
                    self.scope.namespace
                ),
            ));
        }
        Ok(caller)
    }
}
