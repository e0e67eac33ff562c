//! Who a caller is (TokenReview) and whether they may connect to a workspace
//! (SubjectAccessReview of `create` on `workspaces/connect` for that workspace's name), both
//! asked of the API server and remembered briefly, as the API server's own webhook
//! authenticator and authorizer do.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::ServiceAccount,
};
use kube::{Api, Client, api::PostParams};
use sha2::{Digest, Sha256};

/// The API group, resource, subresource and verb a caller needs on a workspace, by name:
/// what README tells a platform to grant.
pub const GROUP: &str = "berth.dev";
pub const RESOURCE: &str = "workspaces";
pub const SUBRESOURCE: &str = "connect";
pub const VERB: &str = "create";

/// How many callers and decisions are remembered at most; beyond, the oldest are forgotten.
const MAX_REMEMBERED: usize = 10_000;

/// A caller the API server vouched for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct User {
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// How many tokens the API server refused one client address may send within
/// [`REFUSAL_WINDOW`] before the gateway stops asking about its tokens (each costs the API
/// server a TokenReview; a refusal already remembered costs nothing and is not counted).
pub const REFUSED_TOKENS_PER_ADDRESS: u32 = 20;
pub const REFUSAL_WINDOW: Duration = Duration::from_secs(60);

/// Why a caller is not let through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The caller's address sent too many tokens the API server refused (429): how long until
    /// it may try again.
    TooMany(Duration),
    /// The token is not one the API server accepts (401); its words.
    Unauthenticated(String),
    /// The user may not connect to the workspace (403): what is missing, and the authorizer's
    /// reason if it gave one.
    Forbidden { user: String, reason: String },
    /// The API server could not be asked (503); its words.
    Unavailable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::TooMany(wait) => write!(
                f,
                "too many refused credentials from your address; try again in {} seconds",
                wait.as_secs().max(1)
            ),
            Refusal::Unauthenticated(why) => {
                write!(f, "the API server does not accept the credential: {why}")
            }
            Refusal::Forbidden { user, reason } if reason.is_empty() => {
                write!(f, "User \"{user}\" is not allowed")
            }
            Refusal::Forbidden { user, reason } => {
                write!(f, "User \"{user}\" is not allowed: {reason}")
            }
            Refusal::Unavailable(why) => write!(f, "the API server cannot be asked: {why}"),
        }
    }
}

/// Answers by key, with when they were given.
type Remembered<K, V> = Mutex<HashMap<K, (Instant, V)>>;

/// Asks the API server, and remembers its answers for `ttl`.
pub struct Access {
    client: Client,
    ttl: Duration,
    users: Remembered<[u8; 32], Result<User, String>>,
    decisions: Remembered<(String, String, String), Result<(), String>>,
    /// Per client address: when its window began, and how many of its tokens were refused.
    refused: Mutex<HashMap<std::net::IpAddr, (Instant, u32)>>,
}

impl Access {
    pub fn new(client: Client, ttl: Duration) -> Self {
        Access {
            client,
            ttl,
            users: Mutex::default(),
            decisions: Mutex::default(),
            refused: Mutex::default(),
        }
    }

    /// The user a bearer token belongs to, per TokenReview (which also covers the
    /// exec-plugin credentials of managed clusters: they end in a bearer token).
    /// `peer` is the caller's address: one that sent too many refused tokens lately is
    /// answered without asking.
    pub async fn authenticate(
        &self,
        token: &str,
        peer: Option<std::net::IpAddr>,
    ) -> Result<User, Refusal> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = remembered(&self.users, &key, self.ttl) {
            return known.map_err(Refusal::Unauthenticated);
        }
        if let Some(wait) = peer.and_then(|p| self.over_budget(p)) {
            return Err(Refusal::TooMany(wait));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Refusal::Unavailable(format!("TokenReview failed: {}", crate::api_words(&e)))
            })?;
        let status = answer.status.unwrap_or_default();
        let outcome = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Ok(user_of(user)),
            _ => Err(status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the API server does not accept this token".to_owned())),
        };
        remember(&self.users, key, outcome.clone());
        if let (Err(_), Some(peer)) = (&outcome, peer) {
            self.charge(peer);
        }
        outcome.map_err(Refusal::Unauthenticated)
    }

    /// How long `peer` must wait, when it has used its budget of refused tokens.
    fn over_budget(&self, peer: std::net::IpAddr) -> Option<Duration> {
        let refused = self.refused.lock().unwrap();
        let (since, count) = refused.get(&peer)?;
        let left = REFUSAL_WINDOW.checked_sub(since.elapsed())?;
        (*count >= REFUSED_TOKENS_PER_ADDRESS).then_some(left)
    }

    /// Counts one refused token against `peer`.
    fn charge(&self, peer: std::net::IpAddr) {
        let mut refused = self.refused.lock().unwrap();
        if refused.len() >= MAX_REMEMBERED {
            refused.retain(|_, (since, _)| since.elapsed() < REFUSAL_WINDOW);
            if refused.len() >= MAX_REMEMBERED {
                refused.clear();
            }
        }
        let entry = refused.entry(peer).or_insert((Instant::now(), 0));
        if entry.0.elapsed() >= REFUSAL_WINDOW {
            *entry = (Instant::now(), 0);
        }
        entry.1 += 1;
    }

    /// Whether the identity a browser session (or an open connection) was made for still
    /// exists: for a service account, the account of that name with the same UID (a deleted
    /// account's RoleBindings name it still, so authorization alone would let its session on).
    /// Other users have no object to look up; their authorization is asked on every request.
    /// Remembered for the review TTL.
    pub async fn still_exists(&self, user: &User) -> Result<(), Refusal> {
        let Some((namespace, name)) = user
            .username
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
        else {
            return Ok(());
        };
        let key = (
            format!("exists\n{}", identity_key(user)),
            namespace.to_owned(),
            name.to_owned(),
        );
        if let Some(known) = remembered(&self.decisions, &key, self.ttl) {
            return known.map_err(Refusal::Unauthenticated);
        }
        let account = Api::<ServiceAccount>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| {
                Refusal::Unavailable(format!(
                    "cannot look up service account {namespace}/{name}: {}",
                    crate::api_words(&e)
                ))
            })?;
        let outcome = match account {
            None => Err(format!(
                "the service account {namespace}/{name} it was made for no longer exists"
            )),
            Some(account)
                if !user.uid.is_empty()
                    && account.metadata.uid.as_deref() != Some(user.uid.as_str()) =>
            {
                Err(format!(
                    "the service account {namespace}/{name} it was made for was deleted and made again"
                ))
            }
            Some(_) => Ok(()),
        };
        remember(&self.decisions, key, outcome.clone());
        outcome.map_err(Refusal::Unauthenticated)
    }

    /// Whether `user` may connect to workspace `namespace/name`.
    pub async fn authorize(&self, user: &User, namespace: &str, name: &str) -> Result<(), Refusal> {
        self.review(user, VERB, RESOURCE, Some(SUBRESOURCE), namespace, name)
            .await
    }

    /// Whether `user` may `verb` the `resource` (of API group berth.dev; `workspaces`,
    /// `workspacekinds`) named `name` (empty: any) in `namespace`: what the dashboard asks
    /// before it shows or offers something.
    pub async fn may(
        &self,
        user: &User,
        verb: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), Refusal> {
        self.review(user, verb, resource, None, namespace, name)
            .await
    }

    /// Whether `user` may start or stop workspace `namespace/name` (`patch` on it, as
    /// `berth start` needs).
    pub async fn may_patch(&self, user: &User, namespace: &str, name: &str) -> Result<(), Refusal> {
        self.review(user, "patch", RESOURCE, None, namespace, name)
            .await
    }

    /// SubjectAccessReview of `verb` on `resource` `namespace/name` (or its `subresource`).
    async fn review(
        &self,
        user: &User,
        verb: &str,
        resource: &str,
        subresource: Option<&str>,
        namespace: &str,
        name: &str,
    ) -> Result<(), Refusal> {
        let key = (
            format!(
                "{}\n{verb} {resource}/{}",
                identity_key(user),
                subresource.unwrap_or_default()
            ),
            namespace.to_owned(),
            name.to_owned(),
        );
        let forbidden = |reason: String| Refusal::Forbidden {
            user: user.username.clone(),
            reason,
        };
        if let Some(known) = remembered(&self.decisions, &key, self.ttl) {
            return known.map_err(forbidden);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.to_owned()),
                    resource: Some(resource.to_owned()),
                    subresource: subresource.map(str::to_owned),
                    verb: Some(verb.to_owned()),
                    namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
                    name: (!name.is_empty()).then(|| name.to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                Refusal::Unavailable(format!(
                    "SubjectAccessReview failed: {}",
                    crate::api_words(&e)
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        let outcome = if status.allowed && status.denied != Some(true) {
            Ok(())
        } else {
            Err(status.reason.unwrap_or_default())
        };
        remember(&self.decisions, key, outcome.clone());
        outcome.map_err(forbidden)
    }
}

fn user_of(info: UserInfo) -> User {
    User {
        username: info.username.unwrap_or_default(),
        uid: info.uid.unwrap_or_default(),
        groups: info.groups.unwrap_or_default(),
        extra: info.extra.unwrap_or_default(),
    }
}

/// A user's decisions are remembered under all that the authorizer sees of them.
fn identity_key(user: &User) -> String {
    format!(
        "{}\n{}\n{}\n{:?}",
        user.username,
        user.uid,
        user.groups.join(","),
        user.extra
    )
}

fn remembered<K: std::hash::Hash + Eq, V: Clone>(
    map: &Remembered<K, V>,
    key: &K,
    ttl: Duration,
) -> Option<V> {
    let map = map.lock().unwrap();
    map.get(key)
        .filter(|(at, _)| at.elapsed() < ttl)
        .map(|(_, v)| v.clone())
}

fn remember<K: std::hash::Hash + Eq, V>(map: &Remembered<K, V>, key: K, value: V) {
    let mut map = map.lock().unwrap();
    if map.len() >= MAX_REMEMBERED {
        let now = Instant::now();
        map.retain(|_, (at, _)| now.duration_since(*at) < Duration::from_secs(1));
        if map.len() >= MAX_REMEMBERED {
            map.clear();
        }
    }
    map.insert(key, (Instant::now(), value));
}

/// What a caller refused the start button needs.
pub fn missing_patch(user: &str, namespace: &str, name: &str) -> String {
    format!(
        "User \"{user}\" cannot patch resource \"{RESOURCE}\" in API group \"{GROUP}\" for workspace \"{name}\" in the namespace \"{namespace}\", so cannot start it. \
         Ask for a Role in {namespace} with apiGroups [\"{GROUP}\"], resources [\"{RESOURCE}\"], verbs [\"patch\"] (resourceNames [\"{name}\"]), or ask its owner to run berth start."
    )
}

/// What a refused caller needs, as a person with the cluster's RBAC would grant it.
pub fn missing_permission(user: &str, namespace: &str, name: &str) -> String {
    format!(
        "User \"{user}\" cannot {VERB} resource \"{RESOURCE}/{SUBRESOURCE}\" in API group \"{GROUP}\" for workspace \"{name}\" in the namespace \"{namespace}\". \
         Ask for a Role in {namespace} with apiGroups [\"{GROUP}\"], resources [\"{RESOURCE}/{SUBRESOURCE}\"], verbs [\"{VERB}\"] (resourceNames [\"{name}\"] for this workspace only), bound to {user}."
    )
}
