//! Who a request is (bearer tokens, impersonation) and whether RBAC allows it. Service-account
//! tokens carry audiences and an expiry, as TokenRequest issues them; the kubeconfig's token
//! is a superuser (`system:masters`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use jiff::Timestamp;
use rand::RngCore;
use serde_json::{Value, json};

use crate::{error::ApiError, resources::StorageKey, store::Store};

/// The audience of tokens the API server itself accepts.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The superuser's name in the kubeconfig.
pub const SUPERUSER: &str = "kubernetes-admin";

/// An authenticated user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl Identity {
    pub fn superuser() -> Self {
        Identity {
            username: SUPERUSER.to_owned(),
            uid: String::new(),
            groups: vec![
                "system:masters".to_owned(),
                "system:authenticated".to_owned(),
            ],
        }
    }

    pub fn anonymous() -> Self {
        Identity {
            username: "system:anonymous".to_owned(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".to_owned()],
        }
    }

    /// The identity of a service account, with the groups Kubernetes gives it.
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> Self {
        Identity {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: uid.to_owned(),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_owned(),
            ],
        }
    }

    /// A user named by impersonation headers; service-account names get their groups.
    pub fn impersonated(username: &str, groups: Vec<String>) -> Self {
        if let Some(rest) = username.strip_prefix("system:serviceaccount:")
            && let Some((namespace, name)) = rest.split_once(':')
        {
            let mut identity = Identity::service_account(namespace, name, "");
            for g in groups {
                if !identity.groups.contains(&g) {
                    identity.groups.push(g);
                }
            }
            return identity;
        }
        let mut groups = groups;
        if username != "system:anonymous" && !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_owned());
        }
        Identity {
            username: username.to_owned(),
            uid: String::new(),
            groups,
        }
    }

    pub fn is_superuser(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What a token was issued for.
#[derive(Clone, Debug)]
pub struct TokenInfo {
    pub identity: Identity,
    pub audiences: Vec<String>,
    pub expires: Option<Timestamp>,
}

/// Why a token was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("invalid bearer token")]
    Unknown,
    #[error("token has expired")]
    Expired,
    #[error("token audiences {token:?} is invalid for the target audiences {wanted:?}")]
    WrongAudience {
        token: Vec<String>,
        wanted: Vec<String>,
    },
    /// Its service account was deleted (or deleted and created again, with a new UID).
    #[error("service account token has been invalidated")]
    Invalidated,
}

/// Tokens the sim issued.
#[derive(Default)]
pub struct Tokens {
    issued: Mutex<HashMap<String, TokenInfo>>,
}

impl Tokens {
    /// Registers a fixed token (the kubeconfig's).
    pub fn insert(&self, token: &str, info: TokenInfo) {
        self.issued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.to_owned(), info);
    }

    /// Every token known, for tests that prove no token leaks into logs.
    pub fn all(&self) -> Vec<String> {
        self.issued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Issues a new token for `identity`.
    pub fn issue(
        &self,
        identity: Identity,
        audiences: Vec<String>,
        ttl: Duration,
    ) -> (String, Timestamp) {
        let expires = Timestamp::now()
            .checked_add(
                jiff::SignedDuration::try_from(ttl).unwrap_or(jiff::SignedDuration::from_hours(1)),
            )
            .unwrap_or(Timestamp::MAX);
        // Shaped like a real service-account token, a JWT whose claims a client may read;
        // the signature is random and the sim knows its tokens by heart.
        let mut signature = [0u8; 32];
        rand::rng().fill_bytes(&mut signature);
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let claims = serde_json::json!({
            "iss": "https://kubernetes.default.svc.cluster.local",
            "sub": identity.username,
            "aud": audiences,
            "iat": Timestamp::now().as_second(),
            "nbf": Timestamp::now().as_second(),
            "exp": expires.as_second(),
        });
        let token = format!(
            "{}.{}.{}",
            b64(br#"{"alg":"RS256","kid":"berth-sim"}"#),
            b64(claims.to_string().as_bytes()),
            b64(&signature)
        );
        self.insert(
            &token,
            TokenInfo {
                identity,
                audiences,
                expires: Some(expires),
            },
        );
        (token, expires)
    }

    /// Checks a token for `wanted` audiences (any overlap), as TokenReview does. Returns the
    /// identity and the audiences that matched.
    pub fn review(
        &self,
        token: &str,
        wanted: &[String],
    ) -> Result<(Identity, Vec<String>), TokenError> {
        let issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        let info = issued.get(token).ok_or(TokenError::Unknown)?;
        if info.expires.is_some_and(|e| e <= Timestamp::now()) {
            return Err(TokenError::Expired);
        }
        let matched: Vec<String> = if info.audiences.is_empty() {
            wanted.to_vec()
        } else {
            wanted
                .iter()
                .filter(|w| info.audiences.contains(w))
                .cloned()
                .collect()
        };
        if matched.is_empty() && !wanted.is_empty() {
            return Err(TokenError::WrongAudience {
                token: info.audiences.clone(),
                wanted: wanted.to_vec(),
            });
        }
        Ok((info.identity.clone(), matched))
    }

    /// Checks a bearer token for `wanted` audiences, as the API server's authenticator does: a
    /// service account's token holds only while that very account (same UID) exists in
    /// `store`.
    pub fn review_current(
        &self,
        store: &Store,
        token: &str,
        wanted: &[String],
    ) -> Result<(Identity, Vec<String>), TokenError> {
        let (identity, audiences) = self.review(token, wanted)?;
        if let Some(account) = identity.username.strip_prefix("system:serviceaccount:")
            && !identity.uid.is_empty()
        {
            let (namespace, name) = account.split_once(':').unwrap_or_default();
            let current = store.get("/serviceaccounts", namespace, name);
            if current
                .as_ref()
                .and_then(|sa| crate::meta::meta_str(sa, "uid"))
                != Some(identity.uid.as_str())
            {
                return Err(TokenError::Invalidated);
            }
        }
        Ok((identity, audiences))
    }

    /// Issues a token for a service account in `store`, as TokenRequest does (any lifetime,
    /// for tests).
    pub fn issue_for_account(
        &self,
        store: &Store,
        namespace: &str,
        service_account: &str,
        audiences: Vec<String>,
        ttl: Duration,
    ) -> Result<(String, Timestamp), ApiError> {
        let sa = store
            .get("/serviceaccounts", namespace, service_account)
            .ok_or_else(|| ApiError::not_found("serviceaccounts", "", service_account))?;
        let identity = Identity::service_account(
            namespace,
            service_account,
            crate::meta::meta_str(&sa, "uid").unwrap_or_default(),
        );
        let audiences = if audiences.is_empty() {
            vec![API_AUDIENCE.to_owned()]
        } else {
            audiences
        };
        Ok(self.issue(identity, audiences, ttl))
    }
}

/// What a request wants to do, for RBAC.
#[derive(Clone, Debug, Default)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// Set for non-resource requests such as `/version`.
    pub path: Option<String>,
}

/// An RBAC decision with the reason RBAC gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn subject_matches(subject: &Value, user: &Identity, binding_namespace: &str) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str().unwrap_or_default() {
        "User" => name == user.username,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = subject["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            user.username == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    let verbs = strings(&rule["verbs"]);
    if !verbs.iter().any(|v| *v == "*" || *v == attrs.verb) {
        return false;
    }
    if let Some(path) = &attrs.path {
        return strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        });
    }
    if !strings(&rule["apiGroups"])
        .iter()
        .any(|g| *g == "*" || *g == attrs.group)
    {
        return false;
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resource_ok = strings(&rule["resources"]).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = strings(&rule["resourceNames"]);
    names.is_empty() || (!attrs.name.is_empty() && names.contains(&attrs.name.as_str()))
}

const CLUSTER_ROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const CLUSTER_ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const ROLE_BINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";

fn role_rules(store: &Store, role_ref: &Value, binding_namespace: &str) -> Option<Arc<Value>> {
    let name = role_ref["name"].as_str()?;
    match role_ref["kind"].as_str()? {
        "ClusterRole" => store.get(CLUSTER_ROLES, "", name),
        "Role" => store.get(ROLES, binding_namespace, name),
        _ => None,
    }
}

/// Evaluates RBAC for `user` doing `attrs`, as the real RBAC authorizer does.
pub fn authorize(store: &Store, user: &Identity, attrs: &Attributes) -> Decision {
    if user.is_superuser() {
        return Decision {
            allowed: true,
            reason: String::new(),
        };
    }
    let describe_subject = |subject: &Value| -> String {
        match subject["kind"].as_str() {
            Some("ServiceAccount") => format!(
                "ServiceAccount \"{}/{}\"",
                subject["name"].as_str().unwrap_or_default(),
                subject["namespace"].as_str().unwrap_or_default()
            ),
            Some(kind) => format!(
                "{kind} \"{}\"",
                subject["name"].as_str().unwrap_or_default()
            ),
            None => String::new(),
        }
    };
    let (cluster_bindings, _) = store.list(CLUSTER_ROLE_BINDINGS, None);
    for binding in cluster_bindings {
        let Some(subject) = binding["subjects"]
            .as_array()
            .and_then(|s| s.iter().find(|s| subject_matches(s, user, "")))
        else {
            continue;
        };
        if let Some(role) = role_rules(store, &binding["roleRef"], "")
            && role["rules"]
                .as_array()
                .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, attrs)))
        {
            return Decision {
                allowed: true,
                reason: format!(
                    "RBAC: allowed by ClusterRoleBinding \"{}\" of ClusterRole \"{}\" to {}",
                    binding["metadata"]["name"].as_str().unwrap_or_default(),
                    binding["roleRef"]["name"].as_str().unwrap_or_default(),
                    describe_subject(subject)
                ),
            };
        }
    }
    if !attrs.namespace.is_empty() && attrs.path.is_none() {
        let (bindings, _) = store.list(ROLE_BINDINGS, Some(&attrs.namespace));
        for binding in bindings {
            let Some(subject) = binding["subjects"].as_array().and_then(|s| {
                s.iter()
                    .find(|s| subject_matches(s, user, &attrs.namespace))
            }) else {
                continue;
            };
            if let Some(role) = role_rules(store, &binding["roleRef"], &attrs.namespace)
                && role["rules"]
                    .as_array()
                    .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, attrs)))
            {
                return Decision {
                    allowed: true,
                    reason: format!(
                        "RBAC: allowed by RoleBinding \"{}/{}\" of {} \"{}\" to {}",
                        binding["metadata"]["name"].as_str().unwrap_or_default(),
                        attrs.namespace,
                        binding["roleRef"]["kind"].as_str().unwrap_or_default(),
                        binding["roleRef"]["name"].as_str().unwrap_or_default(),
                        describe_subject(subject)
                    ),
                };
            }
        }
    }
    Decision {
        allowed: false,
        reason: String::new(),
    }
}

/// What `user` may do in `namespace`, as a SelfSubjectRulesReview lists it: the resource rules
/// of every ClusterRoleBinding and of the namespace's RoleBindings that name the user, and the
/// non-resource rules of the ClusterRoleBindings (in binding order, as RBAC's rule resolver).
pub fn rules_for(store: &Store, user: &Identity, namespace: &str) -> (Vec<Value>, Vec<Value>) {
    if user.is_superuser() {
        return (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
        );
    }
    let (mut resource_rules, mut non_resource_rules) = (vec![], vec![]);
    let mut collect = |binding: &Value, binding_namespace: &str, cluster: bool| {
        let named = binding["subjects"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| subject_matches(s, user, binding_namespace))
        });
        let role = named
            .then(|| role_rules(store, &binding["roleRef"], binding_namespace))
            .flatten();
        for rule in role
            .iter()
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        {
            if rule.get("nonResourceURLs").is_some() {
                if cluster {
                    non_resource_rules.push(
                        json!({"verbs": rule["verbs"], "nonResourceURLs": rule["nonResourceURLs"]}),
                    );
                }
                continue;
            }
            let mut entry = json!({"verbs": rule["verbs"], "apiGroups": rule["apiGroups"], "resources": rule["resources"]});
            if rule
                .get("resourceNames")
                .is_some_and(|n| n.as_array().is_some_and(|n| !n.is_empty()))
            {
                entry["resourceNames"] = rule["resourceNames"].clone();
            }
            resource_rules.push(entry);
        }
    };
    for binding in store.list(CLUSTER_ROLE_BINDINGS, None).0 {
        collect(&binding, "", true);
    }
    for binding in store.list(ROLE_BINDINGS, Some(namespace)).0 {
        collect(&binding, namespace, false);
    }
    (resource_rules, non_resource_rules)
}

/// Nothing when RBAC allows the request, else the API server's 403.
pub fn require(store: &Store, user: &Identity, attrs: &Attributes) -> Result<(), ApiError> {
    match authorize(store, user, attrs).allowed {
        true => Ok(()),
        false => Err(forbidden(user, attrs)),
    }
}

/// The 403 the API server returns when RBAC denies a resource request.
pub fn forbidden(user: &Identity, attrs: &Attributes) -> ApiError {
    if let Some(path) = &attrs.path {
        return ApiError::Forbidden {
            message: format!(
                "forbidden: User \"{}\" cannot {} path \"{path}\"",
                user.username, attrs.verb
            ),
            kind: String::new(),
            name: None,
            group: String::new(),
        };
    }
    let qualified = crate::error::qualified(&attrs.resource, &attrs.group);
    let object = if attrs.name.is_empty() {
        qualified
    } else {
        format!("{qualified} \"{}\"", attrs.name)
    };
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_owned()
    } else {
        format!("in the namespace \"{}\"", attrs.namespace)
    };
    ApiError::Forbidden {
        message: format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.username, attrs.verb, attrs.group
        ),
        kind: attrs.resource.clone(),
        name: (!attrs.name.is_empty()).then(|| attrs.name.clone()),
        group: attrs.group.clone(),
    }
}

/// The RBAC objects every cluster starts with (a subset of the real bootstrap policy).
pub fn bootstrap_policy() -> Vec<(StorageKey, Value)> {
    use serde_json::json;
    let role = |name: &str, rules: Value| {
        (
            StorageKey::from(CLUSTER_ROLES),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                   "rules": rules}),
        )
    };
    let binding = |name: &str, role: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
            .collect();
        (
            StorageKey::from(CLUSTER_ROLE_BINDINGS),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                   "subjects": subjects}),
        )
    };
    vec![
        role(
            "cluster-admin",
            json!([
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]}
            ]),
        ),
        role(
            "system:auth-delegator",
            json!([
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}
            ]),
        ),
        role(
            "system:basic-user",
            json!([
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}
            ]),
        ),
        role(
            "system:discovery",
            json!([
                {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}
            ]),
        ),
        role(
            "system:public-info-viewer",
            json!([
                {"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}
            ]),
        ),
        role(
            "admin",
            json!([
                {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "pods/eviction", "services", "persistentvolumeclaims", "configmaps", "secrets", "serviceaccounts", "events", "resourcequotas"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["events.k8s.io", "coordination.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]}
            ]),
        ),
        role(
            "edit",
            json!([
                {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "pods/eviction", "services", "persistentvolumeclaims", "configmaps", "secrets", "serviceaccounts", "events"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
                {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["namespaces", "resourcequotas"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["events.k8s.io", "coordination.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]}
            ]),
        ),
        role(
            "view",
            json!([
                {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status", "services", "persistentvolumeclaims", "configmaps", "events", "serviceaccounts", "namespaces"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["events.k8s.io", "coordination.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}
            ]),
        ),
        binding("cluster-admin", "cluster-admin", &["system:masters"]),
        binding(
            "system:basic-user",
            "system:basic-user",
            &["system:authenticated"],
        ),
        binding(
            "system:discovery",
            "system:discovery",
            &["system:authenticated"],
        ),
        binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: "ns".into(),
            name: name.into(),
            path: None,
        }
    }

    #[test]
    fn rules_match_like_rbac() {
        let rule =
            json!({"apiGroups": [""], "resources": ["pods", "*/status"], "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &attrs("get", "", "pods", "", "a")));
        assert!(!rule_allows(&rule, &attrs("delete", "", "pods", "", "a")));
        assert!(!rule_allows(&rule, &attrs("get", "apps", "pods", "", "a")));
        assert!(!rule_allows(&rule, &attrs("get", "", "pods", "log", "a")));
        assert!(rule_allows(
            &rule,
            &attrs("get", "", "services", "status", "a")
        ));
        let named = json!({"apiGroups": ["berth.dev"], "resources": ["workspaces/agent"], "verbs": ["use"], "resourceNames": ["w1"]});
        assert!(rule_allows(
            &named,
            &attrs("use", "berth.dev", "workspaces", "agent", "w1")
        ));
        assert!(!rule_allows(
            &named,
            &attrs("use", "berth.dev", "workspaces", "agent", "w2")
        ));
        assert!(!rule_allows(
            &named,
            &attrs("use", "berth.dev", "workspaces", "agent", "")
        ));
        let wildcard = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
        assert!(rule_allows(
            &wildcard,
            &attrs("use", "berth.dev", "workspaces", "agent", "w1")
        ));
        let urls = json!({"nonResourceURLs": ["/apis/*", "/version"], "verbs": ["get"]});
        let path = |p: &str| Attributes {
            verb: "get".into(),
            path: Some(p.into()),
            ..Default::default()
        };
        assert!(rule_allows(&urls, &path("/apis/berth.dev/v1alpha1")));
        assert!(rule_allows(&urls, &path("/version")));
        assert!(!rule_allows(&urls, &path("/metrics")));
    }

    #[test]
    fn forbidden_messages_have_the_real_form() {
        let user = Identity::service_account("team-a", "dev", "");
        let err = forbidden(&user, &attrs("get", "", "pods", "", "p1"));
        assert_eq!(
            err.to_string(),
            "pods \"p1\" is forbidden: User \"system:serviceaccount:team-a:dev\" cannot get resource \"pods\" in API group \"\" in the namespace \"ns\""
        );
        let mut cluster = attrs("create", "authentication.k8s.io", "tokenreviews", "", "");
        cluster.namespace.clear();
        assert_eq!(
            forbidden(&user, &cluster).to_string(),
            "tokenreviews.authentication.k8s.io is forbidden: User \"system:serviceaccount:team-a:dev\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"
        );
    }

    #[test]
    fn tokens_check_expiry_and_audience() {
        let tokens = Tokens::default();
        let sa = Identity::service_account("ns", "sa", "u1");
        let (token, _) = tokens.issue(
            sa.clone(),
            vec!["berth-agent".into()],
            Duration::from_secs(600),
        );
        let (who, matched) = tokens.review(&token, &["berth-agent".to_owned()]).unwrap();
        assert_eq!(who, sa);
        assert_eq!(matched, vec!["berth-agent".to_owned()]);
        assert!(matches!(
            tokens.review(&token, &[API_AUDIENCE.to_owned()]),
            Err(TokenError::WrongAudience { .. })
        ));
        assert_eq!(tokens.review("nope", &[]), Err(TokenError::Unknown));
        let (expired, _) = tokens.issue(sa, vec![], Duration::ZERO);
        assert_eq!(tokens.review(&expired, &[]), Err(TokenError::Expired));
    }
}
