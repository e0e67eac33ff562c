//! The agent's clone (`content::fill` with gix) against git's own smart HTTP server on
//! loopback: a branch, a tag and a commit; each failure with its reason and git's words; a
//! server down then up; a clone interrupted mid-way; and what is in place never touched.

use std::{
    path::Path,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use berth_agent::{
    content::{Content, ContentSpec, Credentials, Report, fill},
    git_server::{self, GitServer},
};

/// A server with the repository `demo` (branch `main`, tag `v1`, a later commit on main),
/// and its commits: (first, second).
async fn server(
    credentials: Option<(&str, &str)>,
) -> (GitServer, tempfile::TempDir, String, String) {
    let root = tempfile::tempdir().unwrap();
    let first = git_server::create_repository(
        root.path(),
        "demo",
        &[("README.md", "# demo\n"), ("src/main.rs", "fn main() {}\n")],
    )
    .unwrap();
    git_server::git(&root.path().join("demo.git"), &["tag", "v1", &first]).unwrap();
    let second =
        git_server::commit(root.path(), "demo", &[("NEWS", "second\n")], "second").unwrap();
    let server = GitServer::start(root.path(), credentials).await.unwrap();
    (server, root, first, second)
}

fn spec(url: &str, reference: Option<&str>) -> ContentSpec {
    ContentSpec {
        url: url.to_owned(),
        reference: reference.map(str::to_owned),
        path: "src/demo".to_owned(),
        depth: Some(1),
        home: "/home/dev".to_owned(),
        auth: false,
    }
}

struct Run {
    content: Arc<Content>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<bool>,
}

fn start(spec: ContentSpec, home: &Path, credentials: Credentials) -> Run {
    let content = Content::new(Some(spec));
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(fill(
        content.clone(),
        home.to_owned(),
        Arc::new(move || credentials.clone()),
        Arc::new(berth_agent::git::clone),
        stop.clone(),
    ));
    Run {
        content,
        stop,
        task,
    }
}

/// Waits (without a time limit of its own: the test's) for a report that `pred` accepts.
async fn report(content: &Content, pred: impl Fn(&Report) -> bool) -> Report {
    loop {
        let now = content.report();
        if pred(&now) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn failed(report: &Report) -> Option<(&'static str, String, Option<Duration>)> {
    match report {
        Report::Failed { failure, retry_in } => {
            Some((failure.kind.as_str(), failure.message.clone(), *retry_in))
        }
        _ => None,
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn head(checkout: &Path) -> String {
    git_server::git(checkout, &["rev-parse", "HEAD"]).unwrap()
}

#[tokio::test]
async fn a_branch_a_tag_and_a_commit_are_cloned_and_recorded() {
    let (server, _root, first, second) = server(None).await;
    for (reference, commit) in [
        (None, &second),
        (Some("main"), &second),
        (Some("v1"), &first),
        (Some(first.as_str()), &first),
    ] {
        let home = tempfile::tempdir().unwrap();
        let run = start(
            spec(&server.url("demo"), reference),
            home.path(),
            Credentials::None,
        );
        assert!(run.task.await.unwrap(), "{reference:?}");
        let checkout = home.path().join("src/demo");
        assert_eq!(&head(&checkout), commit, "{reference:?}");
        assert!(checkout.join("README.md").exists());
        // The record says what was cloned; nothing partial is left beside it.
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(checkout.join(".git/berth-content.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(record["commit"], commit.as_str());
        assert_eq!(entries(&home.path().join("src")), ["demo"]);
        match run.content.report() {
            Report::Ready { found, note, .. } => {
                assert!(!found);
                assert!(
                    note.starts_with(&format!("Cloned {}", server.url("demo"))),
                    "{note}"
                );
                assert!(note.contains(commit.as_str()), "{note}");
            }
            other => panic!("{other:?}"),
        }
        let answer = run.content.answer();
        assert_eq!(
            (answer.state.as_str(), answer.reason.as_str()),
            ("Ready", "Cloned")
        );
    }
}

#[tokio::test]
async fn a_checkout_in_place_is_never_touched_whatever_the_spec_says_now() {
    let (server, _root, _, second) = server(None).await;
    let home = tempfile::tempdir().unwrap();
    let run = start(
        spec(&server.url("demo"), None),
        home.path(),
        Credentials::None,
    );
    assert!(run.task.await.unwrap());
    let checkout = home.path().join("src/demo");
    // The user's work: an edit, an untracked file, a branch.
    std::fs::write(checkout.join("README.md"), "mine\n").unwrap();
    std::fs::write(checkout.join("notes.txt"), "untracked\n").unwrap();
    git_server::git(&checkout, &["branch", "wip"]).unwrap();
    let packs = server.packs();
    // A later pod, with the spec changed meanwhile: nothing is fetched or changed.
    let again = start(
        spec(&server.url("demo"), Some("v1")),
        home.path(),
        Credentials::None,
    );
    assert!(again.task.await.unwrap());
    assert_eq!(server.packs(), packs, "never cloned twice");
    assert_eq!(
        std::fs::read_to_string(checkout.join("README.md")).unwrap(),
        "mine\n"
    );
    assert!(checkout.join("notes.txt").exists());
    assert_eq!(head(&checkout), second);
    match again.content.report() {
        Report::Ready {
            found,
            note,
            record,
        } => {
            assert!(found);
            assert_eq!(record.commit, second);
            assert!(
                note.contains("Berth never clones over a checkout, so nothing on disk changed"),
                "{note}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A directory the user made is theirs.
    let mine = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(mine.path().join("src/demo")).unwrap();
    let run = start(
        spec(&server.url("demo"), None),
        mine.path(),
        Credentials::None,
    );
    assert!(run.task.await.unwrap());
    assert!(
        matches!(run.content.report(), Report::Ready { found: true, ref note, .. } if note.contains("not cloned by Berth"))
    );
    assert_eq!(entries(&mine.path().join("src/demo")), Vec::<String>::new());
}

#[tokio::test]
async fn each_failure_has_its_reason_and_gits_words_and_no_secret() {
    let (server, _root, _, _) = server(Some(("dev", "s3cret-token"))).await;
    let home = tempfile::tempdir().unwrap();
    // Wrong password: permanent, not retried until the credentials change.
    let wrong = Credentials::Basic {
        username: "dev".into(),
        password: "not-the-token".into(),
    };
    let run = start(spec(&server.url("demo"), None), home.path(), wrong);
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "AuthenticationFailed", "{message}");
    assert_eq!(retry, None, "a permanent failure waits for new credentials");
    assert!(!message.contains("not-the-token"), "{message}");
    assert!(server.refused() >= 1);
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!run.task.await.unwrap());
    // None given where some are needed.
    let run = start(
        spec(&server.url("demo"), None),
        home.path(),
        Credentials::None,
    );
    let (reason, ..) = failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "AuthenticationFailed");
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let right = || Credentials::Basic {
        username: "dev".into(),
        password: "s3cret-token".into(),
    };
    // A repository that does not exist.
    let run = start(spec(&server.url("nothing"), None), home.path(), right());
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "RepositoryNotFound", "{message}");
    assert_eq!(retry, None);
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    // A ref the repository does not have: no fallback to the default branch.
    let run = start(
        spec(&server.url("demo"), Some("no-such-branch")),
        home.path(),
        right(),
    );
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "RefNotFound", "{message}");
    assert!(message.contains("no-such-branch"), "{message}");
    assert_eq!(retry, None);
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        !home.path().join("src/demo").exists(),
        "nothing in place after failures"
    );
    // The right credentials clone, and the answer never carries them.
    let run = start(spec(&server.url("demo"), None), home.path(), right());
    assert!(run.task.await.unwrap());
    let answer = format!("{:?}", run.content.answer());
    assert!(!answer.contains("s3cret-token"), "{answer}");
    assert_eq!(entries(&home.path().join("src")), ["demo"]);
}

#[tokio::test]
async fn a_permanent_failure_is_tried_again_once_the_credentials_change() {
    let (server, _root, _, _) = server(Some(("dev", "right"))).await;
    let home = tempfile::tempdir().unwrap();
    let secret = Arc::new(std::sync::Mutex::new("wrong".to_owned()));
    let content = Content::new(Some(spec(&server.url("demo"), None)));
    let read = secret.clone();
    let task = tokio::spawn(fill(
        content.clone(),
        home.path().to_owned(),
        Arc::new(move || Credentials::Basic {
            username: "dev".into(),
            password: read.lock().unwrap().clone(),
        }),
        Arc::new(berth_agent::git::clone),
        Arc::new(AtomicBool::new(false)),
    ));
    report(&content, |r| failed(r).is_some()).await;
    *secret.lock().unwrap() = "right".to_owned();
    assert!(task.await.unwrap());
    assert!(home.path().join("src/demo/README.md").exists());
}

#[tokio::test]
async fn a_server_down_is_retried_with_backoff_and_then_cloned() {
    let (server, _root, _, second) = server(None).await;
    server.down();
    let home = tempfile::tempdir().unwrap();
    let run = start(
        spec(&server.url("demo"), None),
        home.path(),
        Credentials::None,
    );
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "Unreachable", "{message}");
    assert!(retry.is_some(), "a transient failure is retried by itself");
    server.up().await.unwrap();
    assert!(run.task.await.unwrap());
    assert_eq!(head(&home.path().join("src/demo")), second);
}

#[tokio::test]
async fn a_clone_interrupted_midway_leaves_nothing_in_place_and_the_next_starts_again() {
    let (server, _root, _, second) = server(None).await;
    let home = tempfile::tempdir().unwrap();
    // What a process killed mid-clone left (it could not clean up after itself).
    let killed = home.path().join("src/.demo.berth-partial.1-1");
    std::fs::create_dir_all(killed.join(".git/objects")).unwrap();
    std::fs::write(killed.join("README.md"), "half\n").unwrap();
    server.hold(true);
    let first = start(
        spec(&server.url("demo"), None),
        home.path(),
        Credentials::None,
    );
    // The pack is asked for and held: the clone is in its middle, in a partial directory.
    while server.packs() == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(first.content.report(), Report::Cloning { .. }));
    let partials = entries(&home.path().join("src"));
    assert_eq!(
        partials.len(),
        1,
        "the killed clone's leftover is gone: {partials:?}"
    );
    assert!(!killed.exists());
    assert!(
        partials[0].starts_with(".demo.berth-partial."),
        "{partials:?}"
    );
    // The pod goes (its agent stops); the next pod's agent starts over.
    first.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let next = start(
        spec(&server.url("demo"), None),
        home.path(),
        Credentials::None,
    );
    while server.packs() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.hold(false);
    assert!(next.task.await.unwrap());
    assert!(
        !first.task.await.unwrap(),
        "the stopped clone puts nothing in place"
    );
    // Exactly one clean checkout, whatever order the two ended in.
    assert_eq!(entries(&home.path().join("src")), ["demo"]);
    assert_eq!(head(&home.path().join("src/demo")), second);
}

#[tokio::test]
async fn a_clone_reports_gits_progress_and_holds_the_command_until_it_is_done() {
    let (server, _root) = big_repository().await;
    server.trickle(Duration::from_millis(20));
    let home = tempfile::tempdir().unwrap();
    let run = start(
        spec(&server.url("big"), None),
        home.path(),
        Credentials::None,
    );
    let mut seen = vec![];
    while !run.task.is_finished() {
        if let Report::Cloning { progress } = run.content.report()
            && !seen.contains(&progress)
        {
            // The workspace's command waits meanwhile.
            assert!(
                futures::FutureExt::now_or_never(run.content.ready()).is_none(),
                "ready while {progress}"
            );
            seen.push(progress);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(run.task.await.unwrap());
    let url = server.url("big");
    let counted = seen.iter().find(|p| {
        p.strip_prefix(&format!("Cloning {url}: receiving objects "))
            .is_some_and(|rest| rest.contains(" % (") && rest.ends_with(')'))
    });
    assert!(counted.is_some(), "git's progress in words: {seen:#?}");
    assert!(futures::FutureExt::now_or_never(run.content.ready()).is_some());
}

/// A server of the repository `big`: 300 files that do not compress away (a few hundred KiB).
async fn big_repository() -> (GitServer, tempfile::TempDir) {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let files: Vec<(String, String)> = (0..300)
        .map(|i| {
            let text: String = (0..256)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    format!("{seed:016x}")
                })
                .collect();
            (format!("data/{i}.txt"), text)
        })
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let root = tempfile::tempdir().unwrap();
    git_server::create_repository(root.path(), "big", &files).unwrap();
    let server = GitServer::start(root.path(), None).await.unwrap();
    (server, root)
}

#[tokio::test]
async fn a_full_home_is_no_space_in_its_own_words_and_retried() {
    // A home of 64 KiB, as the sim bounds a claim (a tmpfs of its size: root only).
    let data = tempfile::tempdir().unwrap();
    let runtime = berth_sim::ProcessRuntime::new(data.path());
    if !runtime.bounds_claims() {
        assert_ne!(
            std::env::var("BERTH_REQUIRE_PROCESSES").as_deref(),
            Ok("1"),
            "claims must be bounded here (root): a full home is tested only then"
        );
        eprintln!("skipped: bounding a home to its size needs root");
        return;
    }
    let home = runtime.claim_folder("tiny", Some(64 * 1024)).unwrap();
    let (server, _root) = big_repository().await;
    let run = start(spec(&server.url("big"), None), &home, Credentials::None);
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "NoSpace", "{message}");
    assert!(message.contains("No space left on device"), "{message}");
    assert!(retry.is_some(), "a volume may be grown: retried");
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!run.task.await.unwrap());
    assert!(!home.join("src/demo").exists());
}

/// An sshd on a loopback port letting the current user in with `client_key` only; its
/// `known_hosts` line. None (the test says so) where sshd is not installed.
struct Sshd {
    _child: tokio::process::Child,
    port: u16,
    known_hosts: String,
    key: Vec<u8>,
    other_key: Vec<u8>,
    _dir: tempfile::TempDir,
}

fn keygen(path: &Path) -> Vec<u8> {
    let done = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap();
    assert!(done.success());
    std::fs::read(path).unwrap()
}

async fn sshd() -> Option<Sshd> {
    let sshd = Path::new("/usr/sbin/sshd");
    if !sshd.exists() {
        assert_ne!(
            std::env::var("BERTH_REQUIRE_SSHD").as_deref(),
            Ok("1"),
            "CI installs openssh-server for the ssh clone test"
        );
        eprintln!("skipped: no sshd (Debian's openssh-server)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    keygen(&d.join("host_key"));
    let key = keygen(&d.join("client_key"));
    let other_key = keygen(&d.join("other_key"));
    std::fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).unwrap();
    let port = berth_sim::free_port();
    let _ = std::fs::create_dir_all("/run/sshd");
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\nLogLevel ERROR\n",
        d = d.display()
    );
    std::fs::write(d.join("sshd_config"), config).unwrap();
    let child = tokio::process::Command::new(sshd)
        .arg("-D")
        .arg("-f")
        .arg(d.join("sshd_config"))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let host = std::fs::read_to_string(d.join("host_key.pub")).unwrap();
    let known_hosts = format!("[127.0.0.1]:{port} {}", host.trim());
    // Listening once a connection is taken.
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(Sshd {
        _child: child,
        port,
        known_hosts,
        key,
        other_key,
        _dir: dir,
    })
}

#[tokio::test]
async fn over_ssh_the_secrets_key_is_used_and_a_wrong_one_refused() {
    let Some(sshd) = sshd().await else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let commit =
        git_server::create_repository(root.path(), "demo", &[("README.md", "ssh\n")]).unwrap();
    let user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap();
    let url = format!(
        "ssh://{user}@127.0.0.1:{}{}/demo.git",
        sshd.port,
        root.path().display()
    );
    let home = tempfile::tempdir().unwrap();
    let wrong = Credentials::Ssh {
        key: sshd.other_key.clone(),
        known_hosts: Some(sshd.known_hosts.clone().into_bytes()),
    };
    let run = start(spec(&url, None), home.path(), wrong);
    let (reason, message, retry) =
        failed(&report(&run.content, |r| failed(r).is_some()).await).unwrap();
    assert_eq!(reason, "AuthenticationFailed", "{message}");
    assert_eq!(retry, None);
    run.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(!run.task.await.unwrap());
    let right = Credentials::Ssh {
        key: sshd.key.clone(),
        known_hosts: Some(sshd.known_hosts.clone().into_bytes()),
    };
    let run = start(spec(&url, None), home.path(), right);
    assert!(run.task.await.unwrap(), "{:?}", run.content.report());
    assert_eq!(head(&home.path().join("src/demo")), commit);
    // The key was only beside the clone while it ran.
    assert_eq!(entries(&home.path().join("src")), ["demo"]);
}
