//! The workspace's content: the agent clones `spec.content.git` into the home volume before it
//! starts the workspace's command, reporting each step (`GetContent`).
//!
//! The on-disk protocol, which makes a clone happen once and never lose anything:
//! - The checkout's place is `<home>/<path>`. If anything is there, it is left alone: the
//!   record `<path>/.git/berth-content.json` (url, ref, commit) says Berth cloned it, and
//!   without one it is the user's. Nothing is ever cloned over it.
//! - A clone goes into `<home>/<parent>/.<name>.berth-partial.<attempt>` (the same volume),
//!   gets its record, and only then is renamed to `<path>`: a checkout in place is always
//!   whole.
//! - Partial directories found at the start are what interrupted clones left (the pod
//!   deleted, its node lost, the kubelet rejecting it): they are removed and the clone starts
//!   again.
//!
//! Failures are classified (`AuthenticationFailed`, `RepositoryNotFound`, `RefNotFound`,
//! `Unreachable`, `NoSpace`, `Failed`) with git's own words; transient ones are retried with
//! backoff, permanent ones once the credentials change (a changed spec is a new pod). The
//! credentials never leave this module: not in a report, a log line, an argument or the URL.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::proto::GetContentResponse;

pub use berth_api::agent::{CONTENT_ENV, CREDENTIALS_DIR, ContentSpec};

/// The record of a clone, inside its `.git` directory.
pub const RECORD: &str = "berth-content.json";

/// The record a clone leaves in its `.git` directory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    pub url: String,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    pub commit: String,
}

/// Credentials for the repository, read from the mounted secret's files.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    #[default]
    None,
    /// `kubernetes.io/basic-auth`: a username and a password or token.
    Basic { username: String, password: String },
    /// `kubernetes.io/ssh-auth`: a private key, and the hosts it may trust.
    Ssh {
        key: Vec<u8>,
        known_hosts: Option<Vec<u8>>,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "Credentials::None",
            Credentials::Basic { .. } => "Credentials::Basic(..)",
            Credentials::Ssh { .. } => "Credentials::Ssh(..)",
        })
    }
}

impl Credentials {
    /// The credentials in a secret's files (key -> content), as the kubelet lays them out.
    pub fn from_files(file: impl Fn(&str) -> Option<Vec<u8>>) -> Credentials {
        let text = |key: &str| file(key).map(|b| String::from_utf8_lossy(&b).trim().to_owned());
        if let Some(key) = file("ssh-privatekey") {
            return Credentials::Ssh {
                key,
                known_hosts: file("known_hosts"),
            };
        }
        match (text("username"), text("password").or_else(|| text("token"))) {
            (username, Some(password)) => Credentials::Basic {
                username: username.unwrap_or_else(|| "git".to_owned()),
                password,
            },
            _ => Credentials::None,
        }
    }

    /// The credentials in the files of `dir` (the mounted secret).
    pub fn from_dir(dir: &Path) -> Credentials {
        Credentials::from_files(|key| std::fs::read(dir.join(key)).ok())
    }
}

/// Why a clone failed: the condition reason, and whether trying again may help by itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    AuthenticationFailed,
    RepositoryNotFound,
    RefNotFound,
    Unreachable,
    NoSpace,
    Failed,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::AuthenticationFailed => "AuthenticationFailed",
            FailureKind::RepositoryNotFound => "RepositoryNotFound",
            FailureKind::RefNotFound => "RefNotFound",
            FailureKind::Unreachable => "Unreachable",
            FailureKind::NoSpace => "NoSpace",
            FailureKind::Failed => "Failed",
        }
    }

    /// Transient failures (the network, a server error, a full volume that may be grown) are
    /// retried with backoff; the others wait for the credentials (or the spec) to change.
    pub fn transient(self) -> bool {
        matches!(
            self,
            FailureKind::Unreachable | FailureKind::NoSpace | FailureKind::Failed
        )
    }
}

/// A failed attempt: why, in git's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// Where the content stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The workspace has no content.
    None,
    /// Not started yet.
    Waiting,
    /// Cloning, with git's progress in words.
    Cloning { progress: String },
    /// In place: cloned now, or found; what is on disk (the record's url, ref and commit;
    /// empty for a directory Berth did not clone).
    Ready {
        found: bool,
        record: Record,
        note: String,
    },
    /// The last attempt failed; the next one comes after `retry_in` (None: once the
    /// credentials change).
    Failed {
        failure: Failure,
        retry_in: Option<Duration>,
    },
}

/// The content's state, shared between the clone and the gRPC service.
pub struct Content {
    spec: Option<ContentSpec>,
    report: watch::Sender<Report>,
    /// Whether a `GetContent` was answered that the content is in place.
    told: watch::Sender<bool>,
    /// Since when attempts fail without progress in between.
    failing_since: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Content {
    /// The state of a workspace with `spec` as its content (None: no content).
    pub fn new(spec: Option<ContentSpec>) -> Arc<Content> {
        let first = match spec {
            Some(_) => Report::Waiting,
            None => Report::None,
        };
        Arc::new(Content {
            spec,
            report: watch::channel(first).0,
            told: watch::channel(false).0,
            failing_since: std::sync::Mutex::new(None),
        })
    }

    /// The content from the environment ([`CONTENT_ENV`]); an unreadable one is an error.
    pub fn from_env(value: Option<&str>) -> Result<Arc<Content>, String> {
        let spec = value
            .filter(|v| !v.is_empty())
            .map(serde_json::from_str::<ContentSpec>)
            .transpose()
            .map_err(|e| format!("{CONTENT_ENV} is not a content spec: {e}"))?;
        Ok(Content::new(spec))
    }

    pub fn spec(&self) -> Option<&ContentSpec> {
        self.spec.as_ref()
    }

    pub fn report(&self) -> Report {
        self.report.borrow().clone()
    }

    /// Resolves once the content is in place (at once without content).
    pub async fn ready(&self) {
        let mut rx = self.report.subscribe();
        let _ = rx
            .wait_for(|r| matches!(r, Report::None | Report::Ready { .. }))
            .await;
    }

    /// Resolves once the content is in place and the operator was told so (the init
    /// container's agent waits for it, up to `patience`, before it exits).
    pub async fn told_ready(&self, patience: Duration) {
        self.ready().await;
        let mut told = self.told.subscribe();
        let _ = tokio::time::timeout(patience, told.wait_for(|t| *t)).await;
    }

    /// Sets the report; a failure starts a failure series (unless one runs), progress or the
    /// content in place ends it.
    fn set(&self, report: Report) {
        let mut since = self.failing_since.lock().unwrap_or_else(|p| p.into_inner());
        match &report {
            Report::Failed { .. } => {
                since.get_or_insert_with(std::time::Instant::now);
            }
            Report::Ready { .. } => *since = None,
            _ => {}
        }
        drop(since);
        self.set_report(report);
    }

    /// Git's progress: the failure series, if any, is over.
    fn progressed(&self, report: Report) {
        *self.failing_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.set_report(report);
    }

    fn set_report(&self, report: Report) {
        self.report.send_replace(report);
    }

    /// The answer to `GetContent`.
    pub fn answer(&self) -> GetContentResponse {
        let mut answer = GetContentResponse::default();
        if let Some(spec) = &self.spec {
            answer.url = spec.url.clone();
            answer.r#ref = spec.reference.clone().unwrap_or_default();
            answer.path = spec.path.clone();
        }
        let (state, reason, message) = match self.report() {
            Report::None => ("None", "", String::new()),
            Report::Waiting => ("Waiting", "", "waiting to start".to_owned()),
            Report::Cloning { progress } => ("Cloning", "Cloning", progress),
            Report::Ready {
                found,
                record,
                note,
            } => {
                self.told.send_replace(true);
                answer.commit = record.commit;
                answer.url = record.url;
                answer.r#ref = record.reference.unwrap_or_default();
                let reason = if found { "ContentFound" } else { "Cloned" };
                ("Ready", reason, note)
            }
            Report::Failed { failure, retry_in } => {
                answer.retry_in_seconds = retry_in
                    .map(|d| d.as_secs().max(1) as u32)
                    .unwrap_or_default();
                answer.failing_for_seconds = self
                    .failing_since
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .map(|t| t.elapsed().as_secs())
                    .unwrap_or_default();
                ("Failed", failure.kind.as_str(), failure.message)
            }
        };
        answer.state = state.to_owned();
        answer.reason = reason.to_owned();
        answer.message = message;
        answer
    }
}

/// How long the init container's agent waits, once the content is in place, for the operator
/// to ask (so it hears `Cloned` from the pod that cloned) before it exits.
pub const TELL_PATIENCE: Duration = Duration::from_secs(10);

/// The backoff before the `attempt`th retry of a transient failure: 1 s doubling to 30 s.
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(Duration::from_secs(30))
}

/// How often the credentials are read again while a permanent failure waits for them.
const CREDENTIALS_RECHECK: Duration = Duration::from_secs(2);

/// The checkout's place on disk (`home` is where the home volume's files are), and the
/// prefix of partial clones' names beside it.
pub fn places(home: &Path, path: &str) -> (PathBuf, String) {
    let target = home.join(path);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "content".to_owned());
    (target, format!(".{name}.berth-partial."))
}

/// Removes what interrupted clones left beside `target` (each attempt has a directory of its
/// own, so a clone of a pod that is going cannot meet the next pod's).
fn remove_partials(target: &Path, prefix: &str) -> std::io::Result<()> {
    let Some(parent) = target.parent() else {
        return Ok(());
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            tracing::info!(partial = %entry.path().display(), "removing what an interrupted clone left");
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

/// What is in place already, if anything: the record of Berth's clone, or the user's own.
fn found(spec: &ContentSpec, target: &Path) -> Option<Report> {
    std::fs::symlink_metadata(target).ok()?;
    let record = std::fs::read(target.join(".git").join(RECORD))
        .ok()
        .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
    let path = &spec.path;
    let Some(record) = record else {
        return Some(Report::Ready {
            found: true,
            record: Record::default(),
            note: format!(
                "{path} was already in the home volume, not cloned by Berth; it is left as it is"
            ),
        });
    };
    let at = |r: &Option<String>| r.clone().unwrap_or_else(|| "its default branch".to_owned());
    let note = if record.url == spec.url && record.reference == spec.reference {
        format!(
            "{path} holds {} at {} (commit {}), cloned before; it is left as it is",
            record.url,
            at(&record.reference),
            record.commit
        )
    } else {
        format!(
            "spec.content.git now asks for {} at {}, but {path} holds {} at {} (commit {}), cloned earlier: Berth never clones over a checkout, so nothing on disk changed. Move {path} away and restart the workspace to clone again",
            spec.url,
            at(&spec.reference),
            record.url,
            at(&record.reference),
            record.commit
        )
    };
    Some(Report::Ready {
        found: true,
        record,
        note,
    })
}

/// One clone attempt into `partial`: the commit checked out, or why not. `progress` is set
/// to git's progress in words while it runs; `stop` interrupts it.
pub type Cloner = dyn Fn(
        &ContentSpec,
        &Credentials,
        &Path,
        &(dyn Fn(String) + Sync),
        &AtomicBool,
    ) -> Result<String, Failure>
    + Send
    + Sync;

/// Puts the content in place (see the module's protocol), retrying until it is or `stop` is
/// set; returns whether it is. `home` is where the home volume's files are on this machine
/// (the mount path in a pod), `credentials` reads the mounted secret.
pub async fn fill(
    content: Arc<Content>,
    home: PathBuf,
    credentials: Arc<dyn Fn() -> Credentials + Send + Sync>,
    clone: Arc<Cloner>,
    stop: Arc<AtomicBool>,
) -> bool {
    let Some(spec) = content.spec.clone() else {
        return true;
    };
    let (target, prefix) = places(&home, &spec.path);
    let mut failures = 0u32;
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if let Some(report) = found(&spec, &target) {
            content.set(report);
            return true;
        }
        let used = credentials();
        let attempt = {
            let (content, spec, used, clone, stop) = (
                content.clone(),
                spec.clone(),
                used.clone(),
                clone.clone(),
                stop.clone(),
            );
            let (target, prefix) = (target.clone(), prefix.clone());
            let retrying = failures > 0;
            tokio::task::spawn_blocking(move || {
                clone_once(
                    &content, &spec, &used, &target, &prefix, &*clone, &stop, retrying,
                )
            })
        };
        let failure = match attempt.await {
            Ok(Ok(report)) => {
                content.set(report);
                return true;
            }
            Ok(Err(failure)) => failure,
            Err(e) => Failure {
                kind: FailureKind::Failed,
                message: format!("the clone stopped: {e}"),
            },
        };
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        failures += 1;
        let retry_in = failure.kind.transient().then(|| backoff(failures - 1));
        tracing::warn!(url = %spec.url, reason = failure.kind.as_str(), detail = %failure.message, "cannot clone the workspace's content");
        content.set(Report::Failed {
            failure: failure.clone(),
            retry_in,
        });
        match retry_in {
            Some(wait) => tokio::time::sleep(wait).await,
            // A permanent failure: tried again once the credentials change.
            None => loop {
                tokio::time::sleep(CREDENTIALS_RECHECK).await;
                if stop.load(Ordering::SeqCst) || credentials() != used {
                    break;
                }
            },
        }
    }
}

/// One attempt: removes what an interrupted clone left, clones into the partial directory,
/// records it there and renames it into place.
#[allow(clippy::too_many_arguments)]
fn clone_once(
    content: &Content,
    spec: &ContentSpec,
    credentials: &Credentials,
    target: &Path,
    prefix: &str,
    clone: &Cloner,
    stop: &AtomicBool,
    retrying: bool,
) -> Result<Report, Failure> {
    let io = |what: &str, e: std::io::Error| Failure {
        kind: match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                FailureKind::NoSpace
            }
            _ => FailureKind::Failed,
        },
        message: format!("cannot {what}: {e}"),
    };
    remove_partials(target, prefix).map_err(|e| io("remove an interrupted clone", e))?;
    let attempt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let partial = target.with_file_name(format!("{prefix}{}-{attempt}", std::process::id()));
    let partial = partial.as_path();
    if let Some(parent) = partial.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("create the checkout's parent", e))?;
    }
    if !retrying {
        content.set(Report::Cloning {
            progress: format!("Cloning {}", spec.url),
        });
    }
    let url = spec.url.clone();
    let progress = |words: String| {
        content.progressed(Report::Cloning {
            progress: format!("Cloning {url}: {words}"),
        })
    };
    let commit = clone(spec, credentials, partial, &progress, stop)?;
    let record = Record {
        url: spec.url.clone(),
        reference: spec.reference.clone(),
        commit: commit.clone(),
    };
    let json = serde_json::to_vec_pretty(&record).unwrap_or_default();
    std::fs::write(partial.join(".git").join(RECORD), json)
        .map_err(|e| io("record the clone", e))?;
    // A pod stopped meanwhile puts nothing in place: the next one starts again.
    if stop.load(Ordering::SeqCst) {
        return Err(Failure {
            kind: FailureKind::Failed,
            message: "the clone was interrupted".to_owned(),
        });
    }
    std::fs::rename(partial, target).map_err(|e| io("move the clone into place", e))?;
    let reference = spec
        .reference
        .clone()
        .unwrap_or_else(|| "its default branch".to_owned());
    Ok(Report::Ready {
        found: false,
        note: format!(
            "Cloned {} at {reference} (commit {commit}) into {}",
            spec.url, spec.path
        ),
        record,
    })
}
