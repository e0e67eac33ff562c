//! What a workspace starts with in its home volume (`spec.content`): a git repository the
//! in-pod agent clones before it starts the workspace's command, and the record of what it
//! found there (`status.content`).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The URL schemes a workspace's content may come from unless the operator allows more
/// (`--allowed-content-schemes`): `https`, `ssh` (also `user@host:path`) and `git`.
pub const DEFAULT_SCHEMES: [&str; 3] = ["https", "ssh", "git"];

/// What the workspace's home volume is filled with before its command starts, once: a later
/// start finds it there and leaves it alone.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceContent {
    /// A git repository cloned into the home volume.
    pub git: GitContent,
}

/// A git repository to clone into the home volume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.url.matches('^[a-z][a-z0-9+.-]*://.') || self.url.matches('^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/]')").field_path(".url").reason(kube::core::Reason::FieldValueInvalid).message("a repository URL, such as https://github.com/org/repo.git, ssh://git@host/org/repo.git, git@host:org/repo.git or git://host/repo.git"),
    validation = Rule::new("!self.url.matches('^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@')").field_path(".url").reason(kube::core::Reason::FieldValueForbidden).message("a password or token in the URL would be in the pod's spec for anyone who can read it: put it in a Secret and name it in spec.content.git.auth.secretName"),
    validation = Rule::new("!self.url.matches('^(https?|git)://[^/@:]*@')").field_path(".url").reason(kube::core::Reason::FieldValueForbidden).message("a user name or token in the URL would be stored in the Workspace for anyone who can read it, and shown in its status: put the credentials in a kubernetes.io/basic-auth Secret and name it in spec.content.git.auth.secretName"),
    validation = Rule::new("!has(self.path) || (!self.path.startsWith('/') && !self.path.split('/').exists(s, s == '..' || s == '.' || s == ''))").field_path(".path").reason(kube::core::Reason::FieldValueInvalid).message("a relative path under the home volume, such as src/app, without ., .. or empty segments")
)]
pub struct GitContent {
    /// The repository: `https://host/org/repo.git`, `ssh://git@host/org/repo.git`,
    /// `git@host:org/repo.git` or `git://host/repo.git`. Other schemes (`http`, `file`) only
    /// where the operator allows them (`--allowed-content-schemes`).
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^\S+$"))]
    pub url: String,
    /// A branch, a tag or a commit (40 hexadecimal digits). The remote's default branch when
    /// absent; a ref the remote does not have is an error, never a fallback.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255), regex(pattern = r"^[^\s~^:?*\[\\]+$"))]
    pub reference: Option<String>,
    /// Where the checkout goes, relative to the home volume's mount path. Default: the
    /// repository's name (`repo` for `https://host/org/repo.git`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
    /// How many commits of history to fetch: 1 (the default) is a shallow clone, 0 the whole
    /// history. A commit `ref` always fetches the whole history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub depth: Option<u32>,
    /// Credentials for the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<GitAuth>,
}

/// Credentials for a repository, from a Secret in the workspace's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitAuth {
    /// A `kubernetes.io/basic-auth` Secret (`username`, and `password` or a token in it) for
    /// `https`, or a `kubernetes.io/ssh-auth` Secret (`ssh-privatekey`, and optionally
    /// `known_hosts`) for `ssh`. Its author must be allowed to get it.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub secret_name: String,
}

impl GitContent {
    /// The URL's scheme: `ssh` for the scp-like `user@host:path`.
    pub fn scheme(&self) -> &str {
        match self.url.split_once("://") {
            Some((scheme, _)) => scheme,
            None => "ssh",
        }
    }

    /// Where the checkout goes, relative to the home volume.
    pub fn directory(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| repository_name(&self.url))
    }

    /// The history to fetch: None for all of it.
    pub fn depth(&self) -> Option<u32> {
        match self.depth.unwrap_or(1) {
            0 => None,
            _ if self.reference.as_deref().is_some_and(is_commit) => None,
            n => Some(n),
        }
    }
}

/// `url` as Berth shows it (status, events, messages): without the credentials an old object
/// may still carry in it (the API refuses them now), `https://***@host/org/repo.git`; an ssh
/// user name (`ssh://git@host/...`, `git@host:...`) is kept, a password never.
pub fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let user = &rest[..at];
    let ssh = scheme.contains("ssh");
    let kept = match user.split_once(':') {
        Some((name, _)) if ssh => format!("{name}:***"),
        None if ssh => user.to_owned(),
        _ => "***".to_owned(),
    };
    format!("{scheme}://{kept}@{}", &rest[at + 1..])
}

/// `text` with every occurrence of `url` shown as [`shown_url`] (git's own messages name it).
pub fn without_credentials(text: &str, url: &str) -> String {
    let shown = shown_url(url);
    if shown == url {
        return text.to_owned();
    }
    text.replace(url, &shown)
}

/// Whether a ref names a commit (a full object id) rather than a branch or a tag.
pub fn is_commit(reference: &str) -> bool {
    reference.len() == 40 && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The repository's name in its URL, as `git clone` names the directory: the last path
/// segment without `.git` (`repo` for `https://host/org/repo.git/`); `content` when the URL
/// has none.
pub fn repository_name(url: &str) -> String {
    let path = match url.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map(|(_, p)| p).unwrap_or_default(),
        None => url.split_once(':').map(|(_, p)| p).unwrap_or(url),
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let last = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    let name = last.strip_suffix(".git").unwrap_or(last);
    match name {
        "" | "." | ".." => "content".to_owned(),
        name => name.to_owned(),
    }
}

/// What the agent found or put in the home volume, as it last reported it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContentStatus {
    /// The checkout's path, relative to the home volume.
    pub path: String,
    /// The repository it was cloned from (without credentials).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// The ref it was cloned at; absent: the remote's default branch.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The commit checked out when it was cloned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
    /// The pod whose agent reported it; a new pod reports again.
    #[serde(default, rename = "podUID", skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        for (url, shown) in [
            (
                "https://github.com/org/app.git",
                "https://github.com/org/app.git",
            ),
            (
                "https://ghp_token@github.com/org/app.git",
                "https://***@github.com/org/app.git",
            ),
            (
                "https://alice:s3cret@host/a@b.git",
                "https://***@host/a@b.git",
            ),
            ("http://u:p@host:8080/r?x=@y", "http://***@host:8080/r?x=@y"),
            ("ssh://git@host/org/app.git", "ssh://git@host/org/app.git"),
            (
                "ssh://git:pw@host/org/app.git",
                "ssh://git:***@host/org/app.git",
            ),
            ("git@host:org/app.git", "git@host:org/app.git"),
            ("git://host/repo.git", "git://host/repo.git"),
        ] {
            assert_eq!(shown_url(url), shown, "{url}");
        }
        assert_eq!(
            without_credentials(
                "fatal: could not read from https://tok@host/r.git: denied",
                "https://tok@host/r.git"
            ),
            "fatal: could not read from https://***@host/r.git: denied"
        );
    }

    #[test]
    fn a_checkout_is_named_as_git_clone_names_it() {
        for (url, name) in [
            ("https://github.com/org/repo.git", "repo"),
            ("https://github.com/org/repo", "repo"),
            ("https://github.com/org/repo.git/", "repo"),
            ("git@github.com:org/tools.git", "tools"),
            ("ssh://git@host:2222/srv/app.git", "app"),
            ("git://127.0.0.1:9418/project", "project"),
            ("file:///srv/git/demo.git", "demo"),
            ("https://host/", "content"),
            ("https://host/a/..", "content"),
        ] {
            assert_eq!(repository_name(url), name, "{url}");
        }
    }

    #[test]
    fn shallow_by_default_whole_when_asked_or_for_a_commit() {
        let git = |reference: Option<&str>, depth: Option<u32>| GitContent {
            url: "https://h/r.git".into(),
            reference: reference.map(str::to_owned),
            path: None,
            depth,
            auth: None,
        };
        assert_eq!(git(None, None).depth(), Some(1));
        assert_eq!(git(Some("main"), Some(20)).depth(), Some(20));
        assert_eq!(git(Some("main"), Some(0)).depth(), None);
        assert_eq!(git(Some(&"a".repeat(40)), None).depth(), None);
        assert_eq!(git(Some(&"a".repeat(39)), None).depth(), Some(1));
        assert_eq!(git(None, None).scheme(), "https");
        let scp = GitContent {
            url: "git@host:org/r.git".into(),
            ..git(None, None)
        };
        assert_eq!(scp.scheme(), "ssh");
        assert_eq!(scp.directory(), "r");
    }
}
