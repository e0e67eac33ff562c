//! One clone with gitoxide (`gix`): no `git` binary in the workspace's image for `https`,
//! `http` and `git` URLs (`ssh` runs the image's `ssh`, `file` its `git-upload-pack`). The
//! clone reads no git configuration of the machine or the environment (isolated), never
//! prompts, takes credentials only from the mounted secret, and says why it failed in git's
//! own words, classified for the `ContentReady` condition.

use std::{
    num::NonZeroU32,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gix::{
    credentials::{helper::Action, protocol::Outcome},
    progress::tree::Root,
    sec::identity::Account,
};

use crate::content::{ContentSpec, Credentials, Failure, FailureKind};

/// How often the clone's progress is put into words.
const PROGRESS_SAMPLE: Duration = Duration::from_millis(250);

/// Clones `spec` into `into` (an empty or missing directory), calling `progress` with git's
/// progress in words; the commit checked out, or why not.
pub fn clone(
    spec: &ContentSpec,
    credentials: &Credentials,
    into: &Path,
    progress: &(dyn Fn(String) + Sync),
    stop: &AtomicBool,
) -> Result<String, Failure> {
    // gix's HTTP client (reqwest) takes the process's TLS provider: ring, as everywhere else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = Root::new();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut last = String::new();
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(PROGRESS_SAMPLE);
                if let Some(words) = words(&root)
                    && words != last
                {
                    progress(words.clone());
                    last = words;
                }
            }
        });
        let result = clone_with(spec, credentials, into, &root, stop);
        let _ = std::fs::remove_dir_all(ssh_dir(into));
        done.store(true, Ordering::SeqCst);
        let _ = sampler.join();
        result
    })
}

fn clone_with(
    spec: &ContentSpec,
    credentials: &Credentials,
    into: &Path,
    root: &Arc<Root>,
    stop: &AtomicBool,
) -> Result<String, Failure> {
    let failed = |e: gix::Error| classify(&e);
    let mut prepare = gix::clone::PrepareFetch::new(
        spec.url.as_str(),
        into,
        gix::create::Kind::WithWorktree,
        gix::create::Options::default(),
        gix::open::Options::isolated(),
    )
    .map_err(failed)?;
    let reference = spec.reference.as_deref();
    prepare = match reference {
        Some(commit) if is_commit(commit) => prepare.with_revision(Some(commit)),
        Some(name) => prepare.with_ref_name(Some(name)),
        None => Ok(prepare),
    }
    .map_err(failed)?;
    if let Some(depth) = spec.depth.and_then(NonZeroU32::new) {
        prepare = prepare.with_shallow(gix::remote::fetch::Shallow::DepthAtRemote(depth));
    }
    let mut overrides = vec![];
    let mut basic = None;
    match credentials {
        Credentials::None => {}
        Credentials::Basic { username, password } => {
            basic = Some((username.clone(), password.clone()));
        }
        Credentials::Ssh { key, known_hosts } => {
            overrides = ssh_overrides(into, key, known_hosts.as_deref())?;
        }
    }
    prepare = prepare.with_in_memory_config_overrides(overrides);
    prepare = prepare.configure_connection(move |connection| {
        let basic = basic.clone();
        connection.set_credentials(move |action| {
            Ok(match action {
                Action::Get(context) => basic.clone().map(|(username, password)| Outcome {
                    identity: Account {
                        username,
                        password,
                        oauth_refresh_token: None,
                    },
                    next: context.into(),
                }),
                _ => None,
            })
        });
        Ok(())
    });
    let (mut checkout, _) = prepare
        .fetch_then_checkout(root.add_child("clone"), stop)
        .map_err(failed)?;
    let (repository, _) = checkout
        .main_worktree(root.add_child("checkout"), stop)
        .map_err(failed)?;
    if stop.load(Ordering::SeqCst) {
        return Err(Failure {
            kind: FailureKind::Failed,
            message: "the clone was interrupted".to_owned(),
        });
    }
    let commit = repository.head_id().map_err(|e| Failure {
        kind: FailureKind::Failed,
        message: format!("the clone has no HEAD: {e}"),
    })?;
    Ok(commit.to_string())
}

/// A full object id (as `berth_api::content::is_commit` says; the agent does not depend on
/// the API crate).
fn is_commit(reference: &str) -> bool {
    reference.len() == 40 && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where the ssh key of the clone into `into` is kept while it runs: beside it, named like it
/// (so what an interrupted clone left is removed with it), never in a process argument but
/// its path.
fn ssh_dir(into: &Path) -> std::path::PathBuf {
    let mut name = into.file_name().unwrap_or_default().to_os_string();
    name.push("-ssh");
    into.with_file_name(name)
}

/// The ssh key and known hosts in files of [`ssh_dir`], and the ssh command using them.
fn ssh_overrides(
    into: &Path,
    key: &[u8],
    known_hosts: Option<&[u8]>,
) -> Result<Vec<String>, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = ssh_dir(into);
    let io = |e: std::io::Error| Failure {
        kind: FailureKind::Failed,
        message: format!("cannot write the ssh key for the clone: {e}"),
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let write = |name: &str, bytes: &[u8]| -> Result<std::path::PathBuf, Failure> {
        use std::io::Write;
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        Ok(path)
    };
    let key = write("id", key)?;
    let checking = match known_hosts {
        Some(hosts) => format!(
            "-o UserKnownHostsFile={} -o StrictHostKeyChecking=yes",
            write("known_hosts", hosts)?.display()
        ),
        None => "-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=/dev/null".to_owned(),
    };
    Ok(vec![
        format!(
            "core.sshCommand=ssh -F /dev/null -i {} -o IdentitiesOnly=yes -o BatchMode=yes {checking}",
            key.display()
        ),
        "ssh.variant=ssh".to_owned(),
    ])
}

/// The clone's progress in words, from the task that says the most: objects received, deltas
/// resolved, files checked out, or the remote's own counting.
fn words(root: &Root) -> Option<String> {
    let mut tasks = vec![];
    root.sorted_snapshot(&mut tasks);
    let named = |id: &[u8; 4]| match id {
        b"IWIO" => Some((0, "receiving objects")),
        b"IWRO" => Some((1, "resolving deltas")),
        b"CLCF" => Some((2, "checking out files")),
        b"FERP" => Some((3, "remote: counting objects")),
        _ => None,
    };
    tasks
        .iter()
        .filter_map(|(_, task)| {
            let (rank, name) = named(&task.id)?;
            let value = task.progress.as_ref()?;
            let step = value.step.load(Ordering::Relaxed);
            let words = match value.done_at.filter(|total| *total > 0) {
                Some(total) => format!("{name} {} % ({step}/{total})", step * 100 / total),
                None => format!("{name} ({step})"),
            };
            Some((rank, words))
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, words)| words)
}

/// Why a clone failed, classified, in git's own words (each cause once).
pub fn classify(error: &gix::Error) -> Failure {
    let mut causes: Vec<String> = vec![];
    let mut kind = None;
    for cause in error.iter_errors() {
        let text = cause.to_string();
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            match io.kind() {
                StorageFull | QuotaExceeded => kind = kind.or(Some(FailureKind::NoSpace)),
                ConnectionRefused | ConnectionReset | TimedOut | HostUnreachable
                | NetworkUnreachable | AddrNotAvailable => {
                    kind = kind.or(Some(FailureKind::Unreachable))
                }
                _ if io.raw_os_error() == Some(28) => kind = kind.or(Some(FailureKind::NoSpace)),
                _ => {}
            }
        }
        if let Some(web) = cause.downcast_ref::<reqwest::Error>() {
            if web.is_connect() || web.is_timeout() {
                kind = kind.or(Some(FailureKind::Unreachable));
            }
            if web.status().is_some_and(|s| s.as_u16() == 404) {
                kind = kind.or(Some(FailureKind::RepositoryNotFound));
            }
        }
        if !text.is_empty() && !causes.iter().any(|c| c.contains(&text)) {
            causes.push(text);
        }
    }
    let all = causes.join(": ");
    let says = |words: &[&str]| words.iter().any(|w| all.contains(w));
    let kind = kind.unwrap_or_else(|| {
        if says(&["No space left on device"]) {
            FailureKind::NoSpace
        } else if says(&[
            "didn't have any ref that matched",
            "didn't have the requested revision",
            "not our ref",
        ]) {
            FailureKind::RefNotFound
        } else if says(&[
            "HTTP status 404",
            "repository not exported",
            "does not appear to be a git repository",
            "Could not verify that",
            "Repository not found",
        ]) {
            FailureKind::RepositoryNotFound
        } else if error.is_unauthenticated()
            || says(&[
                "HTTP status 401",
                "HTTP status 403",
                "were not accepted by the remote",
                "No credentials were returned",
                "Permission denied (publickey",
                "Host key verification failed",
            ])
        {
            FailureKind::AuthenticationFailed
        } else if says(&[
            "Could not connect",
            "Could not resolve",
            "failed to lookup address",
            "Connection refused",
            "connect to host",
            "Connection closed by",
            "HTTP status 5",
        ]) {
            FailureKind::Unreachable
        } else {
            FailureKind::Failed
        }
    });
    Failure { kind, message: all }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ssh_key_is_a_private_file_and_only_its_path_is_in_an_argument() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let into = dir.path().join(".app.berth-partial.1-2");
        let key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END OPENSSH PRIVATE KEY-----\n";
        let overrides = ssh_overrides(&into, key, Some(b"[h]:22 ssh-ed25519 AAAA")).unwrap();
        let command = &overrides[0];
        assert!(
            command.starts_with("core.sshCommand=ssh -F /dev/null -i "),
            "{command}"
        );
        assert!(command.contains("StrictHostKeyChecking=yes"), "{command}");
        for line in &overrides {
            assert!(
                !line.contains("c2VjcmV0LWtleS1ieXRlcw"),
                "the key is in an argument: {line}"
            );
        }
        let file = ssh_dir(&into).join("id");
        assert_eq!(std::fs::read(&file).unwrap(), key);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Beside the clone and named like it: what an interrupted clone left goes with it.
        assert!(
            ssh_dir(&into)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".app.berth-partial.")
        );
    }
}
