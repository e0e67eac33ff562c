//! The `berth` binary as a person runs it.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use berth_sim::free_port;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

#[test]
fn crd_prints_the_committed_crds() {
    for (args, file) in [
        (&["crd"][..], "workspaces.berth.dev.yaml"),
        (
            &["crd", "workspacekinds"][..],
            "workspacekinds.berth.dev.yaml",
        ),
    ] {
        let output = Command::new(BERTH).args(args).output().unwrap();
        assert!(output.status.success());
        let committed = std::fs::read_to_string(format!(
            "{}/../../deploy/crds/{file}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert_eq!(
            String::from_utf8(output.stdout).unwrap(),
            committed,
            "{file}"
        );
    }
}

/// The init container's step: `berth install PATH` leaves a working, executable copy.
#[test]
fn install_copies_an_executable_berth() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("berth");
    let output = Command::new(BERTH)
        .args(["install", target.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(
        std::fs::read(&target).unwrap(),
        std::fs::read(BERTH).unwrap()
    );
    let copy = Command::new(&target).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&copy.stdout).starts_with("berth "));
    assert!(!dir.path().join("berth.partial").exists());
    // A folder that does not exist: a clear error, no partial file.
    let output = Command::new(BERTH)
        .args([
            "install",
            dir.path().join("no/such/berth").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("berth install: cannot copy"));
}

/// Sends `child` SIGTERM, as a person stops a process; whether it was sent.
fn sigterm(child: &std::process::Child) -> bool {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// A process of the test's, stopped as a person stops it (SIGTERM, then its exit awaited) when
/// the test ends, also when it fails: a failed test leaves no `berth dev` (nor its git daemon,
/// mounts and folders, which it removes as it stops) behind.
struct Stopped(std::process::Child);

impl std::ops::Deref for Stopped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Stopped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            sigterm(&self.0);
            let deadline = Instant::now() + Duration::from_secs(30);
            while let Ok(None) = self.0.try_wait() {
                if Instant::now() > deadline {
                    let _ = self.0.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.0.wait();
    }
}

/// `berth agent` letting everyone in, serving on 127.0.0.1:`port`; its other flags and
/// command follow.
fn agent_at(port: u16) -> Command {
    let mut command = Command::new(BERTH);
    command.args([
        "agent",
        "--auth",
        "none",
        "--address",
        "127.0.0.1",
        "--port",
    ]);
    command.arg(port.to_string());
    command
}

/// `berth agent` letting everyone in, on any free port, supervising `sh -c script`.
fn agent(script: &str) -> Command {
    let mut command = agent_at(0);
    command.args(["--", "sh", "-c", script]);
    command
}

#[test]
fn the_agent_exits_with_its_commands_code() {
    let status = agent("exit 3").status().unwrap();
    assert_eq!(status.code(), Some(3));
    let status = agent("true").status().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// `--auth none` lets everyone in, so it says so at start.
#[test]
fn auth_mode_none_warns_at_start() {
    let output = agent("true").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("auth mode none: every caller is allowed; use it for local debugging only"),
        "{stderr}"
    );
    assert!(stderr.contains("WARN"), "{stderr}");
}

/// Logs are JSON when stderr is not a terminal, plain text without colour codes with
/// `BERTH_LOG_FORMAT=text`, and any other value is refused before anything runs.
#[test]
fn log_formats_are_json_or_plain_text_and_nothing_else() {
    let json = agent("true").output().unwrap();
    let stderr = String::from_utf8_lossy(&json.stderr);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "WARN"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("auth mode none"))),
        "{stderr}"
    );
    let text = agent("true")
        .env("BERTH_LOG_FORMAT", "text")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(stderr.contains("auth mode none"), "{stderr}");
    assert!(
        !stderr.contains('\x1b'),
        "no colour codes off a terminal: {stderr:?}"
    );
    assert!(!stderr.trim_start().starts_with('{'), "{stderr}");
    let refused = agent("true")
        .env("BERTH_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "berth: BERTH_LOG_FORMAT must be text or json, not \"yaml\""
    );
}

/// A workspace's spec sets environment variables, so no variable turns authentication off:
/// with `BERTH_AGENT_AUTH=none` the agent still authenticates with the API server (and here,
/// with none to reach, says so and exits).
#[test]
fn no_environment_variable_turns_authentication_off() {
    let output = Command::new(BERTH)
        .args([
            "agent",
            "--address",
            "127.0.0.1",
            "--port",
            "0",
            "--",
            "true",
        ])
        .env("BERTH_AGENT_AUTH", "none")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(!stderr.contains("auth mode none"), "{stderr}");
    assert!(
        stderr.contains("cannot reach the API server for TokenReview"),
        "{stderr}"
    );
}

/// The agent process measures its command: once the command burns CPU, `GetActivity` says
/// `Cpu` (the supervised tree is the command's, not the agent's own serving).
#[test]
fn the_agent_reports_its_commands_cpu_as_activity() {
    let port = free_port();
    let mut child = agent_at(port)
        .args([
            "--activity-interval",
            "200ms",
            "--",
            "sh",
            "-c",
            // Bounded, so nothing is left spinning if the test fails.
            "sleep 0.5; timeout 5 sh -c 'while :; do :; done'; sleep 30",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let address = format!("127.0.0.1:{port}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let seen = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer =
                berth_agent::client::get_activity(&address, "any", Duration::from_secs(2), None)
                    .await;
            if let Ok(answer) = &answer
                && answer.signal == "Cpu"
            {
                return answer.clone();
            }
            assert!(Instant::now() < deadline, "no CPU activity: {answer:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // SIGTERM, which the agent forwards to its command: nothing is left behind.
    sigterm(&child);
    let _ = child.wait();
    assert!(seen.detail.ends_with("% of a core"), "{}", seen.detail);
}

#[test]
fn sigterm_reaches_the_supervised_command() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo got-term; exit 7' TERM; touch {}; while true; do sleep 0.05; done",
        ready.display()
    );
    let child = agent(&script).stdout(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sigterm(&child));
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(7),
        "the child's own exit code after it handled SIGTERM"
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("got-term"));
}

/// The agent in a pod reaps every child (it is PID 1): a shell's exit code comes from its
/// reaper, so each shell still gets its own, however fast it exits, and none is left a zombie.
#[test]
fn a_supervising_agents_shells_get_their_own_exit_codes() {
    use berth_agent::proto::{ShellInput, ShellStart, shell_input::Input, shell_output::Output};
    let port = free_port();
    // The agent's log, for the failure's message when it never answers.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = agent_at(port)
        .args(["--", "sh", "-c", "sleep 60"])
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let address = format!("127.0.0.1:{port}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let codes = runtime.block_on(async {
        let mut codes = vec![];
        for (code, tty) in [(0, false), (9, false), (3, true), (42, false), (7, true)] {
            let start = ShellInput {
                input: Some(Input::Start(ShellStart {
                    command: vec!["sh".into(), "-c".into(), format!("exit {code}")],
                    tty,
                    ..Default::default()
                })),
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut outputs = loop {
                let inputs = futures::stream::iter(vec![start.clone()]);
                let opened = berth_agent::client::shell(
                    &address,
                    "any",
                    Duration::from_secs(2),
                    None,
                    inputs,
                )
                .await;
                match opened {
                    Ok(outputs) => break outputs,
                    Err(e) => {
                        let ended = child.try_wait().unwrap();
                        assert!(
                            Instant::now() < deadline && ended.is_none(),
                            "no shell: {e}; the agent {}; its log: {}",
                            ended.map_or("still runs".to_owned(), |s| format!("ended ({s})")),
                            std::fs::read_to_string(log.path()).unwrap_or_default()
                        );
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            loop {
                let output = outputs.message().await;
                match output.map(|o| o.and_then(|o| o.output)) {
                    Ok(Some(Output::ExitCode(code))) => {
                        codes.push(code);
                        break;
                    }
                    Ok(Some(_)) => {}
                    other => panic!("the shell ended without its exit code: {other:?}"),
                }
            }
        }
        codes
    });
    let zombies: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            let after = stat.rsplit(')').next().unwrap_or_default();
            let mut fields = after.split_whitespace();
            fields.next() == Some("Z") && fields.next() == Some(child.id().to_string().as_str())
        })
        .collect();
    sigterm(&child);
    let _ = child.wait();
    assert_eq!(codes, vec![0, 9, 3, 42, 7]);
    assert!(zombies.is_empty(), "left as zombies: {zombies:?}");
}

#[test]
fn orphaned_grandchildren_are_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild");
    // A subshell starts a short-lived process and exits, orphaning it to the agent; the main
    // command lives on, so the agent is still there when the orphan exits.
    let script = format!(
        "(sh -c 'sleep 1' & echo $! > {}); sleep 3",
        pidfile.display()
    );
    let mut child = agent(&script).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Ok(text) = std::fs::read_to_string(&pidfile)
            && let Ok(pid) = text.trim().parse::<u32>()
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "no grandchild pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stat = format!("/proc/{pid}/stat");
    let field = |text: &str, n: usize| {
        text.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(n))
            .unwrap_or("")
            .to_owned()
    };
    // The orphan is adopted by the agent (not by the machine's init)...
    let adopted = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        std::fs::read_to_string(&stat).is_ok_and(|text| field(&text, 1) == child.id().to_string())
    });
    assert!(adopted, "the orphan was not re-parented to the agent");
    // ...and once it exits, the agent reaps it: it must not linger as a zombie.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(&stat) {
            Err(_) => break,
            Ok(text) => {
                let state = text
                    .rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or("");
                assert!(
                    Instant::now() < deadline,
                    "the grandchild {pid} is still there in state {state}"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn help_explains_each_subcommand() {
    let output = Command::new(BERTH).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for subcommand in [
        "dev",
        "controller",
        "agent",
        "crd",
        "sim",
        "serve",
        "gateway",
        "ls",
        "start",
        "stop",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(subcommand)),
            "{subcommand} missing from:\n{help}"
        );
    }
}

fn kubectl_present() -> bool {
    let present = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !present && std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() != Ok("0") {
        panic!(
            "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
        );
    }
    present
}

#[test]
fn sim_serves_nodes_to_kubectl_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("sim.kubeconfig");
    let mut child = Command::new(BERTH)
        .args(["sim", "--nodes", "2", "--kubeconfig"])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        assert!(Instant::now() < deadline, "berth sim wrote no kubeconfig");
        std::thread::sleep(Duration::from_millis(50));
    }
    if kubectl_present() {
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "nodes", "-o", "name"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .collect::<Vec<_>>(),
            ["node/node-1", "node/node-2"]
        );
    } else {
        eprintln!("skipping the kubectl part: kubectl is not installed");
    }
    assert!(sigterm(&child));
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "berth sim did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(status.success(), "exit {status:?}; {stdout}");
    assert!(
        stdout.contains("berth sim: API server at https://127.0.0.1:"),
        "{stdout}"
    );
    assert!(
        stdout.trim_end().ends_with("berth sim: stopped"),
        "{stdout}"
    );
    assert!(!kubeconfig.exists(), "the kubeconfig is removed on exit");
}

/// `berth sim --image` (and `--images FILE`) gives an image the entrypoint a real image would
/// have: a pod of `nginx:1.27` with no command serves HTTP on its port, as kubectl's pod proxy
/// shows; a bad entrypoint is refused before anything starts.
#[test]
fn sim_gives_images_their_entrypoints() {
    if !kubectl_present() {
        eprintln!("skipped: needs kubectl");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("images.yaml"),
        "- image: ghcr.io/example/echo\n  entrypoint: [/bin/sh, -c, \"echo from-the-image; exec sleep 600\"]\n",
    )
    .unwrap();
    let refused = Command::new(BERTH)
        .args(["sim", "--image", "nginx='python3"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not shell words"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let kubeconfig = dir.path().join("sim.kubeconfig");
    let mut child = Stopped(
        Command::new(BERTH)
            .args([
                "sim",
                "--image",
                "nginx=python3 -m http.server --bind {podIP} 8080",
                "--images-file",
            ])
            .arg(dir.path().join("images.yaml"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("sim.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let stop = |child: &mut std::process::Child| {
        sigterm(child);
        let _ = child.wait();
    };
    poll(Duration::from_secs(30), "the kubeconfig", || {
        kubeconfig.exists().then_some(())
    });
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .unwrap()
    };
    let said = std::fs::read_to_string(dir.path().join("sim.err")).unwrap_or_default();
    if said.contains("run nothing") {
        stop(&mut child);
        if std::env::var("BERTH_REQUIRE_PROCESSES").as_deref() == Ok("1") {
            panic!("containers must run as processes here (BERTH_REQUIRE_PROCESSES=1): {said}");
        }
        eprintln!("skipped: {said}");
        return;
    }
    let created = kubectl(&[
        "run",
        "web",
        "--image=docker.io/library/nginx:1.27",
        "--port=8080",
    ]);
    assert!(created.status.success(), "{created:?}");
    let created = kubectl(&["run", "echo", "--image=ghcr.io/example/echo:3"]);
    assert!(created.status.success(), "{created:?}");
    let body = poll(Duration::from_secs(60), "nginx's server", || {
        let out = kubectl(&[
            "get",
            "--raw",
            "/api/v1/namespaces/default/pods/web:8080/proxy/",
        ]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    });
    assert!(body.contains("Directory listing for /"), "{body}");
    let logs = poll(Duration::from_secs(60), "echo's log", || {
        let out = kubectl(&["logs", "echo"]);
        Some(String::from_utf8_lossy(&out.stdout).into_owned()).filter(|l| !l.is_empty())
    });
    assert_eq!(logs, "from-the-image\n");
    stop(&mut child);
}

#[test]
fn controller_refuses_bad_flags_with_a_clear_message() {
    // What `berth` says on its standard error when it refuses to start.
    let refused = |command: &mut Command| {
        let output = command.output().unwrap();
        assert!(!output.status.success(), "{command:?} started");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let controller = |args: &[&str]| {
        let mut command = Command::new(BERTH);
        command.arg("controller").args(args);
        command
    };
    let stderr = refused(&mut controller(&["--start-timeout", "soon"]));
    assert!(stderr.contains("invalid duration \"soon\""), "{stderr}");
    let stderr = refused(&mut controller(&["--warning-reasons", "FailedMount=fatal"]));
    assert!(stderr.contains("unknown class \"fatal\""), "{stderr}");
    let stderr = refused(&mut controller(&["--service-account", "berth-controller"]));
    assert!(
        stderr.contains("\"berth-controller\" is not a service account: expected NAMESPACE/NAME"),
        "{stderr}"
    );
    // The shards share the reconciles in flight: none at all would reconcile nothing.
    let stderr = refused(&mut controller(&["--reconciles-in-flight", "0"]));
    assert!(
        stderr.contains("--reconciles-in-flight") && stderr.contains("0 is not in 1..=65535"),
        "{stderr}"
    );
    // TLS settings come in pairs, and the CA must be a certificate.
    let stderr = refused(&mut controller(&["--agent-tls-secret", "agent-cert"]));
    assert!(stderr.contains("--agent-tls-ca"), "{stderr}");
    let stderr =
        refused(Command::new(BERTH).args(["agent", "--tls-cert", "/etc/berth/agent-tls/tls.crt"]));
    assert!(stderr.contains("--tls-key"), "{stderr}");
    let not_a_ca = tempfile::NamedTempFile::new().unwrap();
    let stderr = refused(
        controller(&[
            "--service-account",
            "berth-system/berth-controller",
            "--agent-tls-secret",
            "agent-cert",
            "--agent-tls-ca",
        ])
        .arg(not_a_ca.path()),
    );
    assert!(
        stderr.contains("holds no PEM certificate (--agent-tls-ca)"),
        "{stderr}"
    );
    // Outside a pod, the operator's identity for agents must be given.
    let stderr = refused(controller(&[]).env_remove("BERTH_SERVICE_ACCOUNT"));
    assert!(
        stderr.contains("pass --service-account NAMESPACE/NAME (or set BERTH_SERVICE_ACCOUNT)"),
        "{stderr}"
    );
}

/// A kubeconfig in `dir` whose API server never answers.
fn unreachable_kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    kubeconfig
}

/// `berth controller` against an API server that does not answer (its kubeconfig in `dir`),
/// its output discarded.
#[cfg(target_os = "linux")]
fn quiet_operator(dir: &std::path::Path) -> Command {
    let mut operator = Command::new(BERTH);
    operator
        .args([
            "controller",
            "--service-account",
            "berth-system/berth-controller",
            "--metrics-address",
            "127.0.0.1:0",
            "--health-address",
            "127.0.0.1:0",
        ])
        .env("KUBECONFIG", unreachable_kubeconfig(dir))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    operator
}

/// The operator runs without transparent huge pages from its first allocation, and its
/// allocator gives freed memory back at once: mimalloc asks for huge pages, and the kernel
/// then backs each of its segments whole (two thirds of the operator's memory at 1 000
/// workspaces); the settings are mimalloc's environment, so the operator executes itself
/// again with them, in the same process. It keeps running while its API server does not
/// answer.
#[cfg(target_os = "linux")]
#[test]
fn the_operator_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = quiet_operator(dir.path())
        .env_remove("MIMALLOC_ALLOW_THP")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .spawn()
        .unwrap();
    let proc = |file: &str| std::fs::read_to_string(format!("/proc/{}/{file}", child.id()));
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (thp, environment) = loop {
        let thp = proc("status").ok().and_then(|s| field(&s, "THP_enabled:"));
        let environment = std::fs::read(format!("/proc/{}/environ", child.id()))
            .map(|e| String::from_utf8_lossy(&e).into_owned())
            .unwrap_or_default();
        let executed_again = environment.split('\0').any(|v| v == "MIMALLOC_ALLOW_THP=0");
        if (thp.as_deref() == Some("0") && executed_again) || Instant::now() > deadline {
            break (thp, environment);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Whatever it allocated until now: none of it in huge pages, where the machine has them.
    std::thread::sleep(Duration::from_millis(300));
    let huge = proc("smaps_rollup")
        .ok()
        .and_then(|s| field(&s, "AnonHugePages:"));
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(running, "the operator keeps running");
    let variables: Vec<&str> = environment.split('\0').collect();
    assert!(
        variables.contains(&"MIMALLOC_ALLOW_THP=0")
            && variables.contains(&"MIMALLOC_PURGE_DELAY=0"),
        "the operator runs with its allocator's settings: {variables:?}"
    );
    // A kernel that does not report the flag (before 6.x) cannot be checked.
    if let Some(thp) = thp {
        assert_eq!(
            thp, "0",
            "transparent huge pages are off in berth controller"
        );
    }
    let machine =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if let Some(huge) = huge
        && !machine.contains("[never]")
    {
        assert_eq!(huge, "0 kB", "no huge page in berth controller");
    }
}

/// An admin's own allocator setting wins: the operator does not execute itself again over it.
#[cfg(target_os = "linux")]
#[test]
fn the_operators_allocator_settings_yield_to_an_admins() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = quiet_operator(dir.path())
        .env("MIMALLOC_ALLOW_THP", "1")
        .env_remove("MIMALLOC_PURGE_DELAY")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let environment = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap_or_default();
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(running, "the operator keeps running");
    let environment = String::from_utf8_lossy(&environment);
    let variables: Vec<&str> = environment.split('\0').collect();
    assert!(variables.contains(&"MIMALLOC_ALLOW_THP=1"), "{variables:?}");
    assert!(
        !variables
            .iter()
            .any(|v| v.starts_with("MIMALLOC_PURGE_DELAY")),
        "not executed again: {variables:?}"
    );
}

#[test]
fn controller_exits_naming_an_address_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = unreachable_kubeconfig(dir.path());
    for (flag, other) in [
        ("--metrics-address", "--health-address"),
        ("--health-address", "--metrics-address"),
    ] {
        let mut child = Command::new(BERTH)
            .args([
                "controller",
                "--service-account",
                "berth-system/berth-controller",
            ])
            .args([flag, address.as_str(), other, "127.0.0.1:0"])
            .env("KUBECONFIG", &kubeconfig)
            .env("BERTH_LOG_FORMAT", "text")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("berth controller kept running with {flag} {address} in use");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let output = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        assert!(!status.success());
        assert!(said.contains(&format!("on {address}: ")), "{said}");
        if flag == "--health-address" {
            // Metrics are bound first, and the log names the address they are served at.
            assert!(said.contains("serving metrics"), "{said}");
        }
        assert!(
            said.to_lowercase().contains("address already in use"),
            "{said}"
        );
    }
}

/// What a person sees in the first seconds of `berth dev`: every example reaches the phase
/// its file promises, with the message that explains it.
#[test]
fn dev_shows_the_examples_reaching_their_phases() {
    let stdout = dev_examples(Command::new(BERTH));
    // Where a pod's process may have its own mount namespace (as root here), the operator
    // is the install's Deployment.
    if is_root() {
        assert!(
            stdout.lines().next().is_some_and(|l| l.ends_with(
                "with the Berth operator installed from deploy/ (kubectl -n berth-system get deploy,pods)"
            )),
            "{stdout}"
        );
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Where no mount namespace is allowed (root without CAP_SYS_ADMIN, by `setpriv`), the
/// operator runs inside `berth dev`, says why, and the examples reach the same phases.
#[test]
fn dev_runs_the_operator_inside_itself_where_pods_cannot_have_their_files() {
    let setpriv = Command::new("setpriv").arg("--version").output();
    if !is_root() || setpriv.is_err() {
        eprintln!("skipped: needs root and setpriv to take CAP_SYS_ADMIN away");
        return;
    }
    let mut command = Command::new("setpriv");
    command.args(["--bounding-set=-sys_admin", BERTH]);
    let stdout = dev_examples(command);
    assert!(
        stdout.lines().next().is_some_and(|l| l.contains(
            "with the Berth operator running inside berth dev (this machine allows no mount namespace for a container's process: "
        )),
        "{stdout}"
    );
}

/// Runs `berth dev` through `command` (berth, or a wrapper whose last argument is berth)
/// until every example has shown what its file promises, then stops it as a person does
/// (SIGTERM) and checks it stopped cleanly; its output. However slow the machine, the test
/// waits for the examples, not for a fixed time (`--for` is only a backstop).
fn dev_examples(mut command: Command) -> String {
    use std::io::{BufRead, Read};
    use std::sync::{Arc, Mutex};
    const LIMIT: Duration = Duration::from_secs(240);
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Stopped(
        command
            .args(["dev", "--for", "600s"])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let printed = Arc::new(Mutex::new(String::new()));
    let out = std::io::BufReader::new(dev.stdout.take().unwrap());
    let reader = {
        let printed = printed.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let mut printed = printed.lock().unwrap();
                printed.push_str(&line);
                printed.push('\n');
            }
        })
    };
    let mut err = dev.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut stderr = String::new();
        let _ = err.read_to_string(&mut stderr);
        stderr
    });
    let start = Instant::now();
    loop {
        let stdout = printed.lock().unwrap().clone();
        let Err(missing) = examples_shown(&stdout) else {
            eprintln!(
                "the examples showed their phases after {:?}",
                start.elapsed()
            );
            break;
        };
        let ended = dev.try_wait().unwrap();
        if ended.is_some() || start.elapsed() > LIMIT {
            sigterm(&dev);
            let _ = dev.wait();
            let _ = reader.join();
            let stdout = printed.lock().unwrap().clone();
            let stderr = errors.join().unwrap();
            panic!(
                "{missing} (berth dev {}): {stdout}\n{stderr}",
                match ended {
                    Some(status) => format!("ended early, {status}"),
                    None => format!("still waiting after {LIMIT:?}"),
                }
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    sigterm(&dev);
    let status = dev.wait().unwrap();
    reader.join().unwrap();
    let stdout = printed.lock().unwrap().clone();
    let stderr = errors.join().unwrap();
    assert!(status.success(), "{status}: {stdout}\n{stderr}");
    assert!(
        stdout.trim_end().ends_with("berth dev: stopped"),
        "{stdout}"
    );
    assert!(
        !dir.path().join("berth-dev.kubeconfig").exists(),
        "the kubeconfig is removed on exit"
    );
    // A clean stop says nothing is wrong (the gateway stops before the API server it watches).
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("\"level\":\"ERROR\""))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    stdout
}

/// Whether `berth dev`'s plain lines so far show every example in the phase its file
/// promises, with the message that explains it; if not, the first that is missing.
fn examples_shown(stdout: &str) -> Result<(), String> {
    let header = stdout
        .lines()
        .find(|l| l.starts_with("NAMESPACE"))
        .ok_or("a header in plain-line mode")?;
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "NAMESPACE",
            "NAME",
            "PHASE",
            "READY",
            "RECREATIONS",
            "MESSAGE"
        ]
    );
    let last = |name: &str, phase: &str| -> Option<&str> {
        stdout.lines().rfind(|l| {
            let mut cells = l.split_whitespace();
            cells.next() == Some("default")
                && cells.next() == Some(name)
                && cells.next() == Some(phase)
        })
    };
    let shows = |name: &str, phase: &str, says: &[&str]| {
        last(name, phase).is_some_and(|l| says.iter().all(|s| l.contains(s)))
    };
    // Whether it ever showed `says` (in `phase`, where one is given).
    let ever = |name: &str, phase: Option<&str>, says: &str| {
        stdout.lines().any(|l| {
            let mut cells = l.split_whitespace();
            cells.next() == Some("default")
                && cells.next() == Some(name)
                && phase.is_none_or(|p| cells.next() == Some(p))
                && l.contains(says)
        })
    };
    let expected = [
        (
            "basic Running, RECREATIONS 0",
            last("basic", "Running").is_some_and(|l| l.split_whitespace().nth(4) == Some("0")),
        ),
        ("with-secret Running", shows("with-secret", "Running", &[])),
        ("web Running", shows("web", "Running", &[])),
        ("notebook Running", shows("notebook", "Running", &[])),
        // Workspaces of the example kinds.
        ("shell Running", shows("shell", "Running", &[])),
        ("python Running", shows("python", "Running", &[])),
        // A workspace that starts with its code, cloned from berth dev's own git server, and
        // one whose ref does not exist, in git's words.
        ("hello-code Running", shows("hello-code", "Running", &[])),
        (
            "wrong-ref Error (RefNotFound)",
            shows("wrong-ref", "Error", &["(RefNotFound)"]),
        ),
        // Stopped only after its minute.
        ("idle Running", shows("idle", "Running", &[])),
        (
            "missing-secret Error: secret \"workspace-secret\" not found",
            shows(
                "missing-secret",
                "Error",
                &["secret \"workspace-secret\" not found"],
            ),
        ),
        (
            "unpullable-image Error: ImagePullBackOff",
            ever("unpullable-image", Some("Error"), "ImagePullBackOff"),
        ),
        (
            "unschedulable: 0/3 nodes are available: 3 Insufficient cpu.",
            ever(
                "unschedulable",
                None,
                "0/3 nodes are available: 3 Insufficient cpu.",
            ),
        ),
        (
            "no-delegator Error: its agent refused the operator, saying what to grant",
            shows(
                "no-delegator",
                "Error",
                &[
                    "The agent of pod no-delegator-ws refused the operator (Unauthenticated); it was called at ",
                    ": TokenReview API is unavailable: grant system:auth-delegator to system:serviceaccount:default:no-delegator",
                ],
            ),
        ),
    ];
    match expected.iter().find(|(_, shown)| !shown) {
        Some((what, _)) => Err(format!("{what} not shown")),
        None => Ok(()),
    }
}

/// kubectl against `berth dev`'s kubeconfig in `dir`.
fn dev_kubectl(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.join("berth-dev.kubeconfig"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap()
}

/// Polls `check` every 200 ms for at most `limit`.
fn poll<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// GET `/` of 127.0.0.1:`port`: the body.
fn get(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or(response)
}

/// `berth SUBCOMMAND` through berth dev's `gateway` as its `kubeconfig`'s user; the
/// subcommand's arguments follow.
fn via(subcommand: &str, gateway: &str, kubeconfig: &std::path::Path) -> Command {
    let mut command = Command::new(BERTH);
    command
        .arg(subcommand)
        .arg("--gateway")
        .arg(format!("http://{gateway}/"))
        .arg("--kubeconfig")
        .arg(kubeconfig);
    command
}

/// The first line `child` prints (empty if none).
fn first_line(child: &mut std::process::Child) -> String {
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .next()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// `berth shell web` as a person at a terminal runs it: the workspace's login shell on a
/// terminal of the window's size that follows a resize (SIGWINCH), keys passed as typed (^C
/// interrupts the workspace's command, not berth), the shell's exit code berth's, and the
/// terminal as it was afterwards.
fn interactive_shell(mut shell: Command) {
    use std::io::{Read, Write};
    let size = |columns: u16, rows: u16| nix::pty::Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(&size(100, 30), None).unwrap();
    let before = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    let mut child = shell
        .arg("web")
        .env("TERM", "xterm")
        .stdin(pty.slave.try_clone().unwrap())
        .stdout(pty.slave.try_clone().unwrap())
        .stderr(pty.slave.try_clone().unwrap())
        .spawn()
        .unwrap();
    let mut terminal = std::fs::File::from(pty.master);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut reader = terminal.try_clone().unwrap();
    let shown = seen.clone();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut buffer) {
            shown
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    });
    let until = |what: &str| {
        poll(Duration::from_secs(20), what, || {
            seen.lock().unwrap().contains(what).then_some(())
        })
    };
    terminal.write_all(b"stty size; echo $TERM\r").unwrap();
    until("30 100");
    until("xterm\r\n");
    // The window grows: the terminal's size follows it.
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    let grown = size(132, 50);
    unsafe {
        nix::libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&terminal),
            nix::libc::TIOCSWINSZ,
            &grown,
        )
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    terminal.write_all(b"stty size\r").unwrap();
    until("50 132");
    // ^C reaches the workspace's `sleep`, not berth.
    terminal.write_all(b"sleep 60\r").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    terminal.write_all(b"\x03").unwrap();
    terminal.write_all(b"echo still-$((40 + 2))\r").unwrap();
    until("still-42");
    terminal.write_all(b"exit 7\r").unwrap();
    let code = poll(Duration::from_secs(20), "berth shell to exit", || {
        child.try_wait().unwrap().map(|s| s.code())
    });
    assert_eq!(code, Some(7), "{}", seen.lock().unwrap());
    let after = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    assert_eq!(
        (after.local_flags, after.input_flags, after.output_flags),
        (before.local_flags, before.input_flags, before.output_flags),
        "the terminal is as it was"
    );
}

/// Whether OpenSSH's client is here; without it the SSH part is skipped, unless
/// `BERTH_REQUIRE_SSHD=1` (CI installs OpenSSH).
fn openssh_present() -> bool {
    let present = Command::new("ssh")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present && std::env::var("BERTH_REQUIRE_SSHD").as_deref() == Ok("1") {
        panic!("OpenSSH is required (BERTH_REQUIRE_SSHD=1) but `ssh` is not on PATH");
    }
    present
}

/// What a developer's own SSH tools do with berth dev's `web`: `berth ssh-config` writes its
/// host key and prints its entry; plain OpenSSH with it runs a command there (its exit code
/// kept), `scp` copies both ways (SFTP: the image's sftp-server), `ssh -L` forwards a local
/// port to web's server, and `berth ssh web -- CMD` needs no config. Someone not allowed into
/// the workspace is refused in the gateway's words; a host key that is not the workspace's is
/// refused by OpenSSH.
fn openssh_reaches_web(dir: &std::path::Path, gateway: &str, kubeconfig: &std::path::Path) {
    if !openssh_present() {
        eprintln!("skipped the SSH part: no ssh");
        return;
    }
    let known_hosts = dir.join("known_hosts");
    let configured = via("ssh-config", gateway, kubeconfig)
        .args(["web", "--known-hosts"])
        .arg(&known_hosts)
        .output()
        .unwrap();
    assert!(
        configured.status.success(),
        "{}",
        String::from_utf8_lossy(&configured.stderr)
    );
    let config = dir.join("ssh_config");
    std::fs::write(&config, &configured.stdout).unwrap();
    let known = std::fs::read_to_string(&known_hosts).unwrap();
    assert!(
        known.starts_with("berth--web--default ssh-ed25519 ") && known.lines().count() == 1,
        "{known}"
    );
    let ssh = |args: &[&str]| {
        Command::new("ssh")
            .arg("-F")
            .arg(&config)
            .args(["-o", "BatchMode=yes"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let ran = ssh(&[
        "berth--web",
        "cat /home/dev/index.html; echo to-stderr >&2; exit 5",
    ]);
    assert_eq!(
        (text(&ran.stdout), text(&ran.stderr), ran.status.code()),
        ("hello from home\n".into(), "to-stderr\n".into(), Some(5))
    );
    // scp both ways, with bytes of every value.
    let sent: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (up, down) = (dir.join("up.bin"), dir.join("down.bin"));
    std::fs::write(&up, &sent).unwrap();
    let scp = |from: &str, to: &str| {
        let copied = Command::new("scp")
            .arg("-F")
            .arg(&config)
            .args(["-o", "BatchMode=yes", from, to])
            .output()
            .unwrap();
        assert!(
            copied.status.success(),
            "scp {from} {to}: {}",
            text(&copied.stderr)
        );
    };
    scp(up.to_str().unwrap(), "berth--web:/home/dev/copied.bin");
    let size = ssh(&["berth--web", "wc -c < /home/dev/copied.bin"]);
    assert_eq!(text(&size.stdout).trim(), "300000");
    scp("berth--web:/home/dev/copied.bin", down.to_str().unwrap());
    assert!(
        std::fs::read(&down).unwrap() == sent,
        "the copy came back whole"
    );
    // rsync over ssh (the image's rsync at the other end), where this machine has it.
    let rsync_here = Command::new("rsync")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !rsync_here && std::env::var("BERTH_REQUIRE_SSHD").as_deref() == Ok("1") {
        panic!("rsync is required (BERTH_REQUIRE_SSHD=1) but not on PATH");
    }
    if rsync_here {
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("src")).unwrap();
        std::fs::write(tree.join("src/lib.rs"), "pub fn answer() -> u8 { 42 }\n").unwrap();
        let synced = Command::new("rsync")
            .arg("-a")
            .arg("-e")
            .arg(format!("ssh -F {} -o BatchMode=yes", config.display()))
            .arg(format!("{}/", tree.display()))
            .arg("berth--web:/home/dev/tree/")
            .output()
            .unwrap();
        assert!(synced.status.success(), "rsync: {}", text(&synced.stderr));
        let there = ssh(&["berth--web", "cat /home/dev/tree/src/lib.rs"]);
        assert_eq!(text(&there.stdout), "pub fn answer() -> u8 { 42 }\n");
    }
    // ssh -L: a local port to web's server, as the pod reaches it (berth dev's pods share the
    // machine's network, so web listens on its pod IP).
    let pod_ip = text(&ssh(&["berth--web", "echo $POD_IP"]).stdout)
        .trim()
        .to_owned();
    let local = free_port();
    let mut forward = Command::new("ssh")
        .arg("-F")
        .arg(&config)
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-N",
            "-L",
        ])
        .arg(format!("127.0.0.1:{local}:{pod_ip}:8080"))
        .arg("berth--web")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let body = poll(Duration::from_secs(20), "ssh -L to forward", || {
        std::net::TcpStream::connect(("127.0.0.1", local))
            .is_ok()
            .then(|| get(local))
            .filter(|body| !body.is_empty())
    });
    // As a person ends it (^C): ssh ends its ProxyCommand too.
    sigterm(&forward);
    let _ = forward.wait();
    assert_eq!(body, "hello from home\n");
    // berth ssh: no config needed.
    let direct = via("ssh", gateway, kubeconfig)
        .args(["web", "--", "echo $HOME; exit 2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        (text(&direct.stdout), direct.status.code()),
        ("/home/dev\n".into(), Some(2)),
        "{}",
        text(&direct.stderr)
    );
    // A workspace that runs its image's entrypoint (notebook): its port through `ssh -L`, and
    // a command refused saying why.
    let notebook = via("ssh-config", gateway, kubeconfig)
        .args(["notebook", "--known-hosts"])
        .arg(dir.join("notebook_known_hosts"))
        .output()
        .unwrap();
    assert!(notebook.status.success(), "{}", text(&notebook.stderr));
    let notebook_config = dir.join("notebook_ssh_config");
    std::fs::write(&notebook_config, &notebook.stdout).unwrap();
    let refused = Command::new("ssh")
        .arg("-F")
        .arg(&notebook_config)
        .args(["-o", "BatchMode=yes", "berth--notebook", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        (refused.status.code(), text(&refused.stderr)),
        (
            Some(1),
            format!("berth agent: {}\r\n", berth_agent::shell::BESIDE_ENTRYPOINT)
        )
    );
    let notebook_ip = dev_kubectl(
        dir,
        &[
            "get",
            "pod",
            "notebook-ws",
            "-o",
            "jsonpath={.status.podIP}",
        ],
    );
    let notebook_ip = text(&notebook_ip.stdout);
    let local = free_port();
    let mut forward = Command::new("ssh")
        .arg("-F")
        .arg(&notebook_config)
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-N",
            "-L",
        ])
        .arg(format!("127.0.0.1:{local}:{notebook_ip}:8888"))
        .arg("berth--notebook")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let page = poll(Duration::from_secs(20), "ssh -L to the notebook", || {
        std::net::TcpStream::connect(("127.0.0.1", local))
            .is_ok()
            .then(|| get(local))
            .filter(|body| !body.is_empty())
    });
    sigterm(&forward);
    let _ = forward.wait();
    assert!(page.contains("<title>Berth editor</title>"), "{page}");
    // A key that is not the workspace's: OpenSSH refuses the connection.
    let other = "berth--web--default ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMWuf8xx5YHbmGw2n/hN5d4EBZ0QbcUQnPX1etvYQ/AK\n";
    std::fs::write(&known_hosts, other).unwrap();
    let spoofed = ssh(&["berth--web", "true"]);
    assert_eq!(spoofed.status.code(), Some(255));
    assert!(
        text(&spoofed.stderr).contains("REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "{}",
        text(&spoofed.stderr)
    );
    std::fs::write(&known_hosts, &known).unwrap();
    // Someone with a credential but no right to connect: refused, in the gateway's words.
    assert!(
        dev_kubectl(dir, &["create", "serviceaccount", "stranger"])
            .status
            .success()
    );
    let token = dev_kubectl(dir, &["create", "token", "stranger"]);
    let token = text(&token.stdout).trim().to_owned();
    let mine = dev_kubectl(
        dir,
        &[
            "config",
            "view",
            "--raw",
            "-o",
            "jsonpath={.users[0].user.token}",
        ],
    );
    let stranger = dir.join("stranger.kubeconfig");
    std::fs::write(
        &stranger,
        std::fs::read_to_string(kubeconfig)
            .unwrap()
            .replace(&text(&mine.stdout), &token),
    )
    .unwrap();
    let refused = via("ssh-config", gateway, &stranger)
        .args(["web", "--known-hosts"])
        .arg(dir.join("stranger_known_hosts"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let said = text(&refused.stderr);
    assert!(
        said.starts_with(
            "berth ssh-config: workspace default/web: the gateway refused (403 Forbidden)"
        ) && said.contains("workspaces/connect"),
        "{said}"
    );
    let stranger_config = dir.join("stranger_ssh_config");
    std::fs::write(
        &stranger_config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace(kubeconfig.to_str().unwrap(), stranger.to_str().unwrap()),
    )
    .unwrap();
    let refused = Command::new("ssh")
        .arg("-F")
        .arg(&stranger_config)
        .args(["-o", "BatchMode=yes", "berth--web", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(255));
    let said = text(&refused.stderr);
    assert!(
        said.contains("berth ssh: the gateway refused (403 Forbidden)")
            && said.contains("workspaces/connect"),
        "{said}"
    );
}

/// What README promises of `berth dev`'s `web` example: enter it with `kubectl exec`, reach
/// its server with `kubectl port-forward` and the pod proxy, and find a file written in its
/// home again after a pause and a resume.
#[test]
fn dev_is_a_place_to_use_a_workspace() {
    if !kubectl_present() {
        eprintln!("skipped: needs kubectl");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // berth dev's folder of volumes and its git server's repositories go here.
    let scratch = dir.path().join("tmp");
    std::fs::create_dir(&scratch).unwrap();
    let mut dev = Stopped(
        Command::new(BERTH)
            .args(["dev", "--for", "240s"])
            .current_dir(dir.path())
            .env("TMPDIR", &scratch)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(dev.stdout.take().unwrap()));
    let first = lines.next().unwrap().unwrap();
    // The gateway's address, from its hint line (none when berth dev says it cannot run pods).
    let mut gateway = None;
    if !first.contains("allows no mount namespace") {
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(at) = line
                .strip_prefix("berth dev: the gateway into workspaces:")
                .and_then(|rest| rest.split("http://").nth(1))
            {
                gateway = at.split('/').next().map(str::to_owned);
                break;
            }
        }
    }
    // Keep reading, so berth dev never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let stop = |dev: &mut std::process::Child| {
        sigterm(dev);
        let _ = dev.wait();
    };
    if first.contains("allows no mount namespace") {
        stop(&mut dev);
        if std::env::var("BERTH_REQUIRE_PROCESSES").as_deref() == Ok("1") {
            panic!("containers must run as processes here (BERTH_REQUIRE_PROCESSES=1): {first}");
        }
        eprintln!("skipped: {first}");
        return;
    }
    let phase = |dir: &std::path::Path| {
        let output = dev_kubectl(dir, &["get", "ws", "web", "-o", "jsonpath={.status.phase}"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    poll(Duration::from_secs(90), "web Running", || {
        (phase(dir.path()) == "Running").then_some(())
    });
    // examples/workspace-author.yaml's authors: alice's workspace is hers (the owner
    // policy berth dev installs); bob, with the same Role, may stop it but not change it.
    let manifest = dir.path().join("alices.json");
    std::fs::write(
        &manifest,
        r#"{"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "alices", "annotations": {"berth.dev/owner": "alice"}},
            "spec": {"image": "ghcr.io/example/devbox:1.4", "command": ["sleep", "1d"], "paused": true}}"#,
    )
    .unwrap();
    let created = dev_kubectl(
        dir.path(),
        &["--as=alice", "create", "-f", manifest.to_str().unwrap()],
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let bob_patches = |patch: &str| {
        dev_kubectl(
            dir.path(),
            &[
                "--as=bob",
                "patch",
                "ws",
                "alices",
                "--type=merge",
                "-p",
                patch,
            ],
        )
    };
    let changed = bob_patches(r#"{"spec":{"command":["sh"]}}"#);
    let said = String::from_utf8_lossy(&changed.stderr);
    assert!(
        !changed.status.success()
            && said.contains("denied request: User \"bob\" cannot change workspace alices: it is owned by \"alice\""),
        "{said}"
    );
    let resumed = bob_patches(r#"{"spec":{"paused":false}}"#);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let output = dev_kubectl(
        dir.path(),
        &[
            "exec",
            "web-ws",
            "--",
            "sh",
            "-c",
            "echo hello from home > /home/dev/index.html",
        ],
    );
    assert!(output.status.success(), "{output:?}");

    let mut forward = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(dir.path().join("berth-dev.kubeconfig"))
        .args(["port-forward", "pod/web-ws", ":8080"])
        .env_remove("KUBECONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut said = std::io::BufRead::lines(std::io::BufReader::new(forward.stdout.take().unwrap()));
    let first_said = said.next().unwrap().unwrap();
    // kubectl dies of a closed stdout when it says `Handling connection for ...`.
    std::thread::spawn(move || for _ in said {});
    let said = first_said;
    let port: u16 = said
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("kubectl port-forward said: {said}"));
    assert_eq!(get(port), "hello from home\n");
    let _ = forward.kill();
    let _ = forward.wait();

    // The developer's subcommands, with berth dev's kubeconfig as kubectl takes it.
    let berth = |args: &[&str]| {
        let output = Command::new(BERTH)
            .args(args)
            .arg("--kubeconfig")
            .arg(dir.path().join("berth-dev.kubeconfig"))
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "berth {args:?}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };
    let listed = berth(&["ls"]);
    assert!(listed.starts_with("NAME "), "{listed}");
    assert!(
        listed
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["web", "Running"])),
        "{listed}"
    );
    // The same binary as a kubectl plugin: `kubectl berth ...` runs `kubectl-berth` on the PATH.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(BERTH, plugins.path().join("kubectl-berth")).unwrap();
    let plugin = Command::new("kubectl")
        .args(["berth", "ls", "--kubeconfig"])
        .arg(dir.path().join("berth-dev.kubeconfig"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                plugins.path().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let plugin_listed = String::from_utf8_lossy(&plugin.stdout);
    assert!(plugin.status.success(), "{plugin:?}");
    assert!(
        plugin_listed.starts_with("NAME ")
            && plugin_listed
                .lines()
                .any(|l| l.split_whitespace().take(2).eq(["web", "Running"])),
        "{plugin_listed}"
    );
    let stopped = berth(&["stop", "web"]);
    assert!(
        stopped
            .trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("workspace default/web: Stopped")),
        "berth stop waits until Stopped: {stopped}"
    );
    assert_eq!(phase(dir.path()), "Stopped");
    let started = berth(&["start", "web"]);
    assert!(
        started
            .trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("workspace default/web: Running")),
        "berth start waits until Running: {started}"
    );
    assert_eq!(phase(dir.path()), "Running");
    let refused = Command::new(BERTH)
        .args(["start", "no-such-workspace", "--kubeconfig"])
        .arg(dir.path().join("berth-dev.kubeconfig"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim_end(),
        "berth start: cannot start workspace no-such-workspace: workspaces.berth.dev \"no-such-workspace\" not found"
    );
    // A new pod, the same home: the file is served again, here through the pod proxy.
    let body = poll(Duration::from_secs(30), "the server back", || {
        let output = dev_kubectl(
            dir.path(),
            &[
                "get",
                "--raw",
                "/api/v1/namespaces/default/pods/web-ws:8080/proxy/",
            ],
        );
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    });
    assert_eq!(body, "hello from home\n");
    // And through the gateway, with the kubeconfig's own credential.
    let gateway = gateway.expect("berth dev names its gateway");
    let token = dev_kubectl(
        dir.path(),
        &[
            "config",
            "view",
            "--raw",
            "-o",
            "jsonpath={.users[0].user.token}",
        ],
    );
    let token = String::from_utf8_lossy(&token.stdout).into_owned();
    let through = request(
        &gateway,
        &format!(
            "GET /w/default/web/http/ HTTP/1.0\r\nHost: {gateway}\r\nAuthorization: Bearer {token}\r\n\r\n"
        ),
    );
    assert!(
        through.starts_with("HTTP/1.0 200") || through.starts_with("HTTP/1.1 200"),
        "{through}"
    );
    assert!(through.ends_with("\r\n\r\nhello from home\n"), "{through}");
    let anonymous = request(&gateway, "GET /w/default/web/http/ HTTP/1.0\r\n\r\n");
    assert!(
        anonymous.starts_with("HTTP/1.0 401") || anonymous.starts_with("HTTP/1.1 401"),
        "{anonymous}"
    );
    // berth open: a one-time login link for the kubeconfig's user (web's first port), which
    // a browser exchanges for a session cookie, once.
    // A developer's subcommand through berth dev's gateway, as its kubeconfig's user.
    let kubeconfig = dir.path().join("berth-dev.kubeconfig");
    let via_gateway = |args: &[&str]| {
        via(args[0], &gateway, &kubeconfig)
            .args(&args[1..])
            .output()
            .unwrap()
    };
    let opened = via_gateway(&["open", "web", "--print"]);
    assert!(
        opened.status.success(),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    let link = String::from_utf8_lossy(&opened.stdout)
        .trim_end()
        .to_owned();
    let path = link
        .strip_prefix(&format!("http://{gateway}"))
        .unwrap_or_else(|| panic!("a link on the gateway: {link}"));
    assert!(
        path.starts_with("/w/default/web/.berth/login?ticket="),
        "{link}"
    );
    assert!(
        String::from_utf8_lossy(&opened.stderr).contains("the link works once"),
        "{}",
        String::from_utf8_lossy(&opened.stderr)
    );
    // berth dev's gateway has a domain (localhost, which browsers resolve): the link goes on
    // to the port's own host, an origin of its own, where the session lives.
    let onward = request(
        &gateway,
        &format!("GET {path} HTTP/1.0\r\nHost: {gateway}\r\n\r\n"),
    );
    let port = gateway.rsplit(':').next().unwrap();
    let host = format!("http--web--default.localhost:{port}");
    let on_host = onward
        .lines()
        .find_map(|l| l.strip_prefix("location: "))
        .and_then(|l| l.strip_prefix(&format!("http://{host}")))
        .unwrap_or_else(|| panic!("a redirect to web's host: {onward}"))
        .to_owned();
    let login = request(
        &gateway,
        &format!("GET {on_host} HTTP/1.0\r\nHost: {host}\r\n\r\n"),
    );
    assert!(
        login.starts_with("HTTP/1.0 303") || login.starts_with("HTTP/1.1 303"),
        "{login}"
    );
    let cookie = login
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("a session cookie: {login}"))
        .to_owned();
    let with_session = request(
        &gateway,
        &format!("GET / HTTP/1.0\r\nHost: {host}\r\nCookie: {cookie}\r\n\r\n"),
    );
    assert!(
        with_session.ends_with("\r\n\r\nhello from home\n"),
        "{with_session}"
    );
    let again = request(
        &gateway,
        &format!("GET {on_host} HTTP/1.0\r\nHost: {host}\r\n\r\n"),
    );
    assert!(again.contains("it was used before"), "{again}");
    // berth dashboard: a link to the dashboard at berth dev's domain, where the kubeconfig's
    // user sees the examples.
    let opened = via_gateway(&["dashboard", "--print"]);
    let link = String::from_utf8_lossy(&opened.stdout)
        .trim_end()
        .to_owned();
    let dashboard = format!("localhost:{port}");
    let path = link
        .strip_prefix(&format!("http://{dashboard}"))
        .unwrap_or_else(|| {
            panic!(
                "a link to the dashboard: {link} {}",
                String::from_utf8_lossy(&opened.stderr)
            )
        });
    let signed_in = request(
        &gateway,
        &format!("GET {path} HTTP/1.0\r\nHost: {dashboard}\r\n\r\n"),
    );
    let cookie = signed_in
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("the dashboard's cookie: {signed_in}"))
        .to_owned();
    let listed = request(
        &gateway,
        &format!("GET / HTTP/1.0\r\nHost: {dashboard}\r\nCookie: {cookie}\r\n\r\n"),
    );
    assert!(
        listed.contains(r#"<tr data-workspace="default/web">"#),
        "{listed}"
    );
    // The dashboard's spawner makes a workspace of the `ide` kind, whose image option runs
    // Berth's editor on its port: through the gateway it lists, saves and opens a file of the
    // home, and the file is there for a shell.
    let csrf = listed
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the page's CSRF token: {listed}"))
        .to_owned();
    let form = format!("csrf={csrf}&kind=ide&image=editor&namespace=default&name=notes");
    let spawned = request(
        &gateway,
        &format!(
            "POST /new HTTP/1.0\r\nHost: {dashboard}\r\nOrigin: http://{dashboard}\r\nCookie: {cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    );
    assert!(
        spawned.starts_with("HTTP/1.0 303") || spawned.starts_with("HTTP/1.1 303"),
        "{spawned}"
    );
    poll(Duration::from_secs(90), "notes Running", || {
        let output = dev_kubectl(
            dir.path(),
            &["get", "ws", "notes", "-o", "jsonpath={.status.phase}"],
        );
        (String::from_utf8_lossy(&output.stdout) == "Running").then_some(())
    });
    let ide = |method: &str, path: &str, body: &str| {
        request(
            &gateway,
            &format!(
                "{method} /w/default/notes/ide/{path} HTTP/1.0\r\nHost: {gateway}\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let page = poll(Duration::from_secs(30), "the editor's page", || {
        Some(ide("GET", "", "")).filter(|page| page.contains("<title>Berth editor</title>"))
    });
    assert!(page.contains("api/list"), "{page}");
    let saved = ide("PUT", "api/file?path=notes/todo.txt", "write the docs\n");
    let status = |answer: &str| answer.split(' ').nth(1).unwrap_or_default().to_owned();
    assert_eq!(status(&saved), "204", "{saved}");
    let listed_files = ide("GET", "api/list?path=notes", "");
    assert!(
        listed_files.ends_with(r#"[{"dir":false,"name":"todo.txt"}]"#),
        "{listed_files}"
    );
    let outside = ide("GET", "api/file?path=../../etc/passwd", "");
    assert_eq!(status(&outside), "403", "{outside}");
    let in_shell = via("shell", &gateway, &kubeconfig)
        .args(["notes", "--", "cat", "/home/dev/notes/todo.txt"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&in_shell.stdout),
        "write the docs\n"
    );
    // berth port-forward: a local port whose connections reach web's port through the
    // gateway, with the kubeconfig's credential.
    let mut forward = via("port-forward", &gateway, &kubeconfig)
        .args(["web", "0:http"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = first_line(&mut forward);
    let local = said
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| {
            let _ = forward.kill();
            panic!("berth port-forward says where it listens: {said:?}")
        })
        .to_owned();
    assert!(
        said.ends_with("-> workspace default/web port http (8080)"),
        "{said}"
    );
    for _ in 0..2 {
        let through = request(&local, "GET / HTTP/1.0\r\nHost: web\r\n\r\n");
        assert!(through.ends_with("\r\n\r\nhello from home\n"), "{through}");
    }
    let _ = forward.kill();
    let _ = forward.wait();
    let unknown = via_gateway(&["port-forward", "web", "9999"]);
    assert_eq!(
        String::from_utf8_lossy(&unknown.stderr).trim_end(),
        "berth port-forward: workspace default/web has no port 9999; its ports: http (8080)"
    );
    let no_port = via_gateway(&["open", "web", "nope", "--print"]);
    assert_eq!(
        String::from_utf8_lossy(&no_port.stderr).trim_end(),
        "berth open: workspace default/web has no port nope; its ports: http (8080)"
    );
    // berth shell: a command in web's container (its home is there), its streams apart, its
    // exit code berth's own; stdin piped in; a terminal when asked; a workspace running its
    // image's entrypoint says why it has no shell.
    // Its flags before the workspace: what follows `--` is the command's.
    let shell = |args: &[&str]| {
        via("shell", &gateway, &kubeconfig)
            .args(args)
            .output()
            .unwrap()
    };
    let ran = shell(&[
        "web",
        "--",
        "sh",
        "-c",
        "cat /home/dev/index.html; echo to-stderr >&2; exit 3",
    ]);
    assert_eq!(
        (
            String::from_utf8_lossy(&ran.stdout).as_ref(),
            String::from_utf8_lossy(&ran.stderr).as_ref(),
            ran.status.code()
        ),
        ("hello from home\n", "to-stderr\n", Some(3))
    );
    let mut piped = via("shell", &gateway, &kubeconfig)
        .args(["web", "--", "sh"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut piped.stdin.take().unwrap(), b"echo piped $((6 * 7))\n")
        .unwrap();
    let piped = piped.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&piped.stdout), "piped 42\n");
    assert!(piped.status.success());
    let on_terminal = shell(&["web", "-t", "--", "sh", "-c", "tty; stty size"]);
    let said = String::from_utf8_lossy(&on_terminal.stdout);
    assert!(
        said.starts_with("/dev/pts/") && said.ends_with("\r\n24 80\r\n"),
        "{said:?}"
    );
    let beside = shell(&["with-secret", "--", "true"]);
    assert_eq!(beside.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&beside.stderr).trim_end(),
        format!(
            "berth shell: the agent said: {}",
            berth_agent::shell::BESIDE_ENTRYPOINT
        )
    );
    interactive_shell(via("shell", &gateway, &kubeconfig));
    openssh_reaches_web(dir.path(), &gateway, &kubeconfig);
    // A caller who goes away (berth shell killed) leaves nothing running in the workspace.
    let mut left = via("shell", &gateway, &kubeconfig)
        .args(["web", "--", "sh", "-c", "echo $$; exec sleep 300"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let said = first_line(&mut left);
    let pid: u32 = said
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the command's pid: {said:?}"));
    let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
    assert!(proc.exists());
    let _ = left.kill();
    let _ = left.wait();
    poll(Duration::from_secs(20), "the left command hung up", || {
        (!proc.exists()).then_some(())
    });
    // Without --gateway: berth dev's kubeconfig names its gateway.
    let found = Command::new(BERTH)
        .args(["open", "web", "--print", "--kubeconfig"])
        .arg(dir.path().join("berth-dev.kubeconfig"))
        .env_remove("BERTH_GATEWAY")
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    assert!(
        String::from_utf8_lossy(&found.stdout).starts_with(&format!(
            "http://{gateway}/w/default/web/.berth/login?ticket="
        )),
        "{}",
        String::from_utf8_lossy(&found.stdout)
    );
    stop(&mut dev);
    // Stopped, berth dev leaves nothing behind: not its folder of volumes (pods' files, a copy
    // of berth per pod), nor a process of its own (`git daemon` forks `git-daemon`).
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let needle = scratch.to_string_lossy().into_owned();
    let still_running: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect();
    assert!(still_running.is_empty(), "still running: {still_running:?}");
}

/// Sends `text` to `address` and reads the whole answer.
fn request(address: &str, text: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(text.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Two `berth controller` processes with leader election against one cluster, as two replicas
/// of the Deployment would run.
mod failover {
    use std::{path::Path, process::Child, time::Duration};

    use berth_sim::{SimCluster, SimConfig};
    use k8s_openapi::{
        api::coordination::v1::Lease,
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    };
    use kube::{Api, api::PostParams};

    use super::{BERTH, Command, Stdio};

    /// A replica: the same host name for both, as two pods whose names collide would have.
    fn replica(kubeconfig: &Path, leader_election: bool) -> Child {
        let mut command = Command::new(BERTH);
        command
            .args(["controller", "--service-account", "default/default"])
            .args([
                "--metrics-address",
                "127.0.0.1:0",
                "--health-address",
                "127.0.0.1:0",
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("HOSTNAME", "berth-controller")
            .env("BERTH_LOG_FORMAT", "text")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if leader_election {
            command.args(["--leader-election", "--lease-namespace", "default"]);
        }
        command.spawn().unwrap()
    }

    fn terminate(child: &Child) {
        assert!(super::sigterm(child));
    }

    /// Waits for the process to exit, within `limit`.
    async fn exits_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the operator did not exit within {limit:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn holder(leases: &Api<Lease>) -> Option<String> {
        leases
            .get_opt("berth-controller")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    }

    async fn until<T, F: std::future::Future<Output = Option<T>>>(
        limit: Duration,
        what: &str,
        mut check: impl FnMut() -> F,
    ) -> T {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(found) = check().await {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn cluster() -> (SimCluster, tempfile::TempDir) {
        let sim = SimCluster::start(SimConfig::api_only()).await.unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(sim.client().await.unwrap());
        for crd in berth_api::crd::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        sim.write_kubeconfig(dir.path().join("kubeconfig")).unwrap();
        (sim, dir)
    }

    async fn create_workspace(sim: &SimCluster, name: &str) -> Api<berth_api::Workspace> {
        let workspaces: Api<berth_api::Workspace> =
            Api::namespaced(sim.client().await.unwrap(), "default");
        let body = serde_json::json!({"apiVersion": "berth.dev/v1alpha1", "kind": "Workspace",
            "metadata": {"name": name}, "spec": {"image": "devbox:1"}});
        workspaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
        workspaces
    }

    /// Someone reconciles `name`: its status gets a phase.
    async fn reconciled(workspaces: &Api<berth_api::Workspace>, name: &str) {
        until(
            Duration::from_secs(20),
            &format!("{name} to be reconciled"),
            || async {
                let ws = workspaces.get(name).await.ok()?;
                ws.status.and_then(|s| s.phase)
            },
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_leader_releases_the_lease_and_the_standby_takes_over_at_once() {
        let (sim, dir) = cluster().await;
        let kubeconfig = dir.path().join("kubeconfig");
        let leases: Api<Lease> = Api::namespaced(sim.client().await.unwrap(), "default");

        let mut first = replica(&kubeconfig, true);
        let leader = until(Duration::from_secs(20), "a leader", || holder(&leases)).await;
        let mut second = replica(&kubeconfig, true);
        let workspaces = create_workspace(&sim, "before").await;
        reconciled(&workspaces, "before").await;
        // Same host name, yet the standby does not think it leads.
        assert!(leader.starts_with("berth-controller-"), "{leader}");
        assert_eq!(holder(&leases).await.as_deref(), Some(leader.as_str()));

        terminate(&first);
        let status = exits_within(&mut first, Duration::from_secs(15)).await;
        assert!(
            status.success(),
            "the leader exits 0 on SIGTERM: {status:?}"
        );
        // The lease lasts 15 s; a released one is taken over well before it would expire.
        let released = tokio::time::Instant::now();
        let next = until(
            Duration::from_secs(5),
            "the standby to take over",
            || async { holder(&leases).await.filter(|h| *h != leader) },
        )
        .await;
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "took {:?}",
            released.elapsed()
        );
        assert!(next.starts_with("berth-controller-"), "{next}");
        create_workspace(&sim, "after").await;
        reconciled(&workspaces, "after").await;

        terminate(&second);
        let status = exits_within(&mut second, Duration::from_secs(15)).await;
        assert!(status.success(), "{status:?}");
        assert_eq!(holder(&leases).await, None, "released on the way out");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_leader_election_and_as_a_standby_sigterm_exits_promptly() {
        let (sim, dir) = cluster().await;
        let kubeconfig = dir.path().join("kubeconfig");
        let mut single = replica(&kubeconfig, false);
        let workspaces = create_workspace(&sim, "solo").await;
        reconciled(&workspaces, "solo").await;
        terminate(&single);
        assert!(
            exits_within(&mut single, Duration::from_secs(15))
                .await
                .success()
        );

        let leases: Api<Lease> = Api::namespaced(sim.client().await.unwrap(), "default");
        let mut leader = replica(&kubeconfig, true);
        let holding = until(Duration::from_secs(20), "a leader", || holder(&leases)).await;
        let mut standby = replica(&kubeconfig, true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        terminate(&standby);
        assert!(
            exits_within(&mut standby, Duration::from_secs(15))
                .await
                .success()
        );
        assert_eq!(
            holder(&leases).await,
            Some(holding),
            "a standby leaves the lease alone"
        );
        terminate(&leader);
        assert!(
            exits_within(&mut leader, Duration::from_secs(15))
                .await
                .success()
        );
    }
}

/// The machine's kubectl, or None (then the test is skipped, only with `BERTH_REQUIRE_KUBECTL=0`).
fn kubectl() -> Option<&'static str> {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() != Ok("0") {
        panic!(
            "kubectl is needed for this test and is not on PATH: install it (any version from 1.27; README, \"What the tests need\"), or set BERTH_REQUIRE_KUBECTL=0 to skip what needs it"
        );
    }
    found.then_some("kubectl")
}

/// `kubectl kustomize DIR`, as objects.
fn kustomize(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let output = Command::new(kubectl().unwrap())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(output.stdout).unwrap()).unwrap()
}

fn object<'a>(objects: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy");

/// What `kubectl apply -k deploy/` installs, as a cluster admin would check it.
#[test]
fn the_install_renders_with_kubectl_kustomize() {
    if kubectl().is_none() {
        return;
    }
    let objects = kustomize(std::path::Path::new(DEPLOY));
    let kinds: std::collections::BTreeSet<String> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(kind), "{kind} missing: {kinds:?}");
    }
    let deployment = object(&objects, "Deployment", "berth-controller");
    assert_eq!(deployment["metadata"]["namespace"], "berth-system");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "berth-controller");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/berth-dev/berth:{}", env!("CARGO_PKG_VERSION"))
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["controller", "--leader-election"]);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["requests"]["memory"].is_string());
    assert!(container["resources"]["limits"]["memory"].is_string());
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    // The flags the Deployment passes are ones `berth controller` takes.
    let help = Command::new(BERTH)
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(arg),
            "{arg} is not a flag of berth controller"
        );
    }
    let env = container["env"].as_array().unwrap();
    for var in env {
        let name = var["name"].as_str().unwrap();
        // POD_NAME finds the operator's own pod; BERTH_LOG_FORMAT is every subcommand's;
        // another variable may be read by the ones after it, as `$(NAME)`.
        let referenced = env.iter().any(|v| {
            v["value"]
                .as_str()
                .is_some_and(|t| t.contains(&format!("$({name})")))
        });
        assert!(
            help.contains(name) || ["POD_NAME", "BERTH_LOG_FORMAT"].contains(&name) || referenced,
            "{name} is read by nothing"
        );
    }
    let metrics = object(&objects, "Service", "berth-controller-metrics");
    assert_eq!(metrics["spec"]["ports"][0]["port"], 8080);
    assert_eq!(
        metrics["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let budget = object(&objects, "PodDisruptionBudget", "berth-controller");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );

    // What a namespace with workspaces gets: only the operator reaches the agent port.
    let policy = kustomize(&std::path::Path::new(DEPLOY).join("workspace-namespace"));
    let policy = object(&policy, "NetworkPolicy", "berth-agent");
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"],
        "berth"
    );
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    let agent_rule = ingress
        .iter()
        .find(|r| r["ports"][0]["port"] == 50051)
        .expect("a rule for the agent port");
    assert_eq!(
        agent_rule["from"][0]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let open: Vec<(u64, u64)> = ingress
        .iter()
        .filter(|r| r.get("from").is_none())
        .flat_map(|r| r["ports"].as_array().unwrap().iter())
        .filter(|p| p["protocol"] == "TCP")
        .map(|p| (p["port"].as_u64().unwrap(), p["endPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        open,
        [(1, 50050), (50052, 65535)],
        "every other TCP port stays open"
    );

    // The stricter choice: the same policy, every rule with a source, the gateway's for all
    // ports, the operator's for the agent's only.
    let strict = kustomize(&std::path::Path::new(DEPLOY).join("workspace-namespace-gateway-only"));
    let strict = object(&strict, "NetworkPolicy", "berth-agent");
    assert_eq!(strict["spec"]["podSelector"], policy["spec"]["podSelector"]);
    let rules = strict["spec"]["ingress"].as_array().unwrap();
    assert!(rules.iter().all(|r| r.get("from").is_some()), "{rules:?}");
    let gateway = rules
        .iter()
        .find(|r| {
            r["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "berth-gateway"
        })
        .expect("a rule for the gateway");
    assert!(
        gateway.get("ports").is_none(),
        "every port from the gateway"
    );
    let operator = rules
        .iter()
        .find(|r| r["from"][0]["podSelector"] == agent_rule["from"][0]["podSelector"])
        .expect("a rule for the operator");
    assert_eq!(
        operator["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 50051}])
    );
}

/// The path of `to` relative to the folder `from` (both absolute), as kustomize wants.
fn relative(from: &std::path::Path, to: &std::path::Path) -> std::path::PathBuf {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut path = std::path::PathBuf::new();
    for _ in from.components().skip(common) {
        path.push("..");
    }
    to.components().skip(common).for_each(|c| path.push(c));
    path
}

/// The README's overlay: a platform's own registry and tag, set in one place.
#[test]
fn an_overlay_sets_the_image_in_one_place() {
    if kubectl().is_none() {
        return;
    }
    let overlay = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let base = relative(overlay.path(), std::path::Path::new(DEPLOY));
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources:\n  - {}\nimages:\n  - name: ghcr.io/berth-dev/berth\n    newName: registry.example.com/platform/berth\n    newTag: \"9.9\"\n",
            base.display()
        ),
    )
    .unwrap();
    let objects = kustomize(overlay.path());
    let deployment = object(&objects, "Deployment", "berth-controller");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example.com/platform/berth:9.9"
    );
}

/// The image's Dockerfile builds what the manifests and the operator expect: the binary
/// without the simulator, where `--agent-binary` looks for it, as a non-root user on a base
/// with no shell. (`.ci/run` runs its build line; the image build itself needs Docker.)
#[test]
fn the_dockerfile_builds_the_slim_binary_where_the_operator_expects_it() {
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Dockerfile")).unwrap();
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build line");
    for flag in [
        "--profile dist",
        "--locked",
        "-p berth",
        "--no-default-features",
    ] {
        assert!(build.contains(flag), "{flag} missing from {build}");
    }
    assert!(
        dockerfile.contains(r#"cp "target/$TARGET/dist/berth" /berth"#),
        "the image takes the dist build"
    );
    // `dist` is release (symbols stripped) optimised across crates, and the benchmark measures
    // the operator built so.
    let manifest: toml_edit::DocumentMut =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
            .unwrap()
            .parse()
            .expect("the workspace's Cargo.toml parses");
    let profile = |name: &str| {
        manifest["profile"][name]
            .as_table()
            .unwrap_or_else(|| panic!("no [profile.{name}]"))
    };
    // A setting's value as written, without its whitespace or comments.
    let value = |item: &toml_edit::Item| {
        let mut value = item.as_value().expect("a value").clone();
        value.decor_mut().clear();
        value.to_string()
    };
    assert_eq!(
        profile("release").get("strip").map(value).as_deref(),
        Some(r#""symbols""#)
    );
    let dist = profile("dist");
    for (key, expected) in [
        ("inherits", r#""release""#),
        ("lto", r#""fat""#),
        ("codegen-units", "1"),
    ] {
        assert_eq!(
            dist.get(key).map(value).as_deref(),
            Some(expected),
            "{key} of [profile.dist]"
        );
    }
    let bench = profile("bench");
    for (key, item) in dist.iter().filter(|(key, _)| *key != "inherits") {
        assert_eq!(
            bench.get(key).map(value),
            Some(value(item)),
            "[profile.bench] does not have [profile.dist]'s {key}"
        );
    }
    let final_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(
        final_stage.starts_with("gcr.io/distroless/static-debian12:nonroot"),
        "{final_stage}"
    );
    assert!(final_stage.contains("USER 65532:65532"));
    let help = Command::new(BERTH)
        .args(["controller", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("[default: /usr/local/bin/berth]"),
        "the agent binary's default path: {help}"
    );
    assert!(final_stage.contains("COPY --from=build /berth /usr/local/bin/berth"));
    assert!(final_stage.contains(r#"ENTRYPOINT ["/usr/local/bin/berth"]"#));
}

/// `berth dev` from an installed binary: the examples are built in (no path of the build
/// machine in `--help`), a second one in the same folder is refused while the first runs
/// (its kubeconfig kept), and one that fails leaves no kubeconfig to a dead cluster.
#[test]
fn dev_works_from_an_installed_binary_and_guards_its_kubeconfig() {
    let help = Command::new(BERTH)
        .args(["dev", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(!help.contains("examples]"), "{help}");

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("berth-dev.kubeconfig");
    let mut first = Stopped(
        Command::new(BERTH)
            .args(["dev", "--for", "600s"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Stopped below by SIGTERM (`--for` is only a backstop), however slow the machine.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !kubeconfig.exists() {
        assert!(
            Instant::now() < deadline,
            "the first berth dev wrote no kubeconfig"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Written in one go, then read: wait until it parses.
    std::thread::sleep(Duration::from_millis(200));
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    let second = Command::new(BERTH)
        .args(["dev", "--for", "1s"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "berth-dev.kubeconfig belongs to a cluster that is still running at https://127.0.0.1:"
        ),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).unwrap(),
        written,
        "kept"
    );
    sigterm(&first);
    assert!(first.wait().unwrap().success());
    assert!(!kubeconfig.exists(), "removed by the run that wrote it");

    // A kubeconfig left by a cluster that is gone is taken over; a run that fails after
    // writing its own removes it.
    std::fs::write(&kubeconfig, written).unwrap();
    let broken = dir.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::write(broken.join("bad.yaml"), "kind: Nonsense\napiVersion: v9\n").unwrap();
    let failed = Command::new(BERTH)
        .args(["dev", "--for", "5s", "--examples"])
        .arg(&broken)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(stderr.contains("bad.yaml"), "{stderr}");
    assert!(!kubeconfig.exists(), "no kubeconfig to a dead cluster");
}

/// The install proven by running it: `kubectl apply -k deploy/` into `berth sim`, whose
/// kubelets run the operator's containers as real `berth controller` processes on the
/// in-cluster path (the pod's service-account token, CA and namespace, the service
/// variables). What a platform team would check after installing, and after losing a node.
mod installed {
    use super::*;
    use serde_json::Value;
    use std::path::{Path, PathBuf};

    /// `berth sim` as a child, stopped (SIGTERM) when dropped, with the operator processes.
    struct Sim {
        child: std::process::Child,
        kubeconfig: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl Drop for Sim {
        fn drop(&mut self) {
            sigterm(&self.child);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if self.child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
    }

    fn start() -> Sim {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("sim.kubeconfig");
        let child = Command::new(BERTH)
            .args(["sim", "--nodes", "3", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.exists() {
            assert!(Instant::now() < deadline, "berth sim wrote no kubeconfig");
            std::thread::sleep(Duration::from_millis(50));
        }
        Sim {
            child,
            kubeconfig,
            _dir: dir,
        }
    }

    fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
        let output = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .unwrap();
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    fn get(kubeconfig: &Path, args: &[&str]) -> Option<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        kubectl(kubeconfig, &all)
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
    }

    /// Polls `check` every 200 ms until it returns Some; on timeout, panics with `what`
    /// and what `explain` shows of the cluster then.
    fn until<T>(
        limit: Duration,
        what: &str,
        explain: impl Fn() -> String,
        mut check: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(value) = check() {
                return value;
            }
            if Instant::now() > deadline {
                panic!(
                    "timed out after {limit:?} waiting for {what}\n{}",
                    explain()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn is_ready(pod: &Value) -> bool {
        pod["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    }

    /// The operator's live pods, when both are Ready.
    fn ready_operators(kubeconfig: &Path) -> Option<Vec<Value>> {
        let pods = get(
            kubeconfig,
            &[
                "get",
                "pods",
                "-n",
                "berth-system",
                "-l",
                "app.kubernetes.io/name=berth-controller",
            ],
        )?;
        let live: Vec<Value> = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .cloned()
            .collect();
        (live.len() == 2 && live.iter().all(is_ready)).then_some(live)
    }

    fn holder(kubeconfig: &Path) -> Option<String> {
        let lease = get(
            kubeconfig,
            &["get", "lease", "-n", "berth-system", "berth-controller"],
        )?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
    }

    fn running(kubeconfig: &Path, workspace: &str) -> Option<()> {
        let ws = get(kubeconfig, &["get", "workspace", workspace])?;
        (ws["status"]["phase"] == "Running").then_some(())
    }

    /// A plain HTTP GET to the pod's own address, as the kubelet's probe and a scraper do.
    fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(address).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, response))
    }

    fn workspace(name: &str) -> String {
        format!(
            "apiVersion: berth.dev/v1alpha1\nkind: Workspace\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  image: ghcr.io/example/devbox:1.4\n  command: [\"sleep\", \"infinity\"]\n"
        )
    }

    fn apply(kubeconfig: &Path, yaml: &str) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), yaml).unwrap();
        kubectl(kubeconfig, &["apply", "-f", file.path().to_str().unwrap()])
            .unwrap_or_else(|e| panic!("kubectl apply: {e}"));
    }

    #[test]
    fn kubectl_apply_k_runs_the_operator_and_a_standby_takes_over_from_a_deleted_leader() {
        if !kubectl_present() {
            return;
        }
        let sim = start();
        let k = sim.kubeconfig.as_path();
        let explain = || {
            format!(
                "{}\n{}",
                kubectl(
                    k,
                    &[
                        "get",
                        "deploy,rs,pods,lease",
                        "-n",
                        "berth-system",
                        "-o",
                        "wide"
                    ]
                )
                .unwrap_or_else(|e| e),
                kubectl(k, &["get", "events", "-A"]).unwrap_or_else(|e| e)
            )
        };
        let applied = kubectl(k, &["apply", "-k", DEPLOY]).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            applied.contains("deployment.apps/berth-controller created"),
            "{applied}"
        );

        // Both replicas Ready through their probes: the kubelet GETs /readyz on each pod's
        // own address, where the real process answers.
        let operators = until(
            Duration::from_secs(60),
            "two Ready operator pods",
            explain,
            || ready_operators(k),
        );
        for pod in &operators {
            let probe = &pod["spec"]["containers"][0]["readinessProbe"]["httpGet"];
            assert_eq!(probe["path"], "/readyz");
            let ip = pod["status"]["podIP"].as_str().unwrap();
            let (code, _) =
                http_get(&format!("{ip}:8081"), "/readyz").expect("the pod serves health");
            assert_eq!(code, 200);
            let (_, metrics) = http_get(&format!("{ip}:8080"), "/metrics").expect("metrics");
            assert!(metrics.contains("berth_build_info"), "{metrics}");
            // The service-account volume the process read its token from.
            let mounts = pod["spec"]["containers"][0]["volumeMounts"].to_string();
            assert!(
                mounts.contains("/var/run/secrets/kubernetes.io/serviceaccount"),
                "{mounts}"
            );
        }
        let names: Vec<String> = operators
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        let leader = until(Duration::from_secs(30), "a Lease holder", explain, || {
            holder(k).filter(|h| names.iter().any(|n| h.starts_with(&format!("{n}-"))))
        });
        let leader_pod = names
            .iter()
            .find(|n| leader.starts_with(&format!("{n}-")))
            .unwrap()
            .clone();

        // The process's own output, as the team reads it.
        until(
            Duration::from_secs(30),
            "the leader saying so in its log",
            || kubectl(k, &["logs", "-n", "berth-system", &leader_pod]).unwrap_or_else(|e| e),
            || {
                kubectl(k, &["logs", "-n", "berth-system", &leader_pod])
                    .ok()
                    .filter(|logs| logs.contains("\"message\":\"leading: reconciling\""))
            },
        );

        // Both replicas' logs, as README says to read them: the standby says it stands by,
        // and for whom.
        let both = [
            "logs",
            "-n",
            "berth-system",
            "-l",
            "app.kubernetes.io/name=berth-controller",
            "--prefix",
        ];
        until(
            Duration::from_secs(30),
            "the standby saying it stands by",
            || kubectl(k, &both).unwrap_or_else(|e| e),
            || {
                kubectl(k, &both)
                    .ok()
                    .filter(|logs| logs.contains("standing by: ") && logs.contains(&leader))
            },
        );

        // A workspace runs: its agent authenticated the operator, whose token came from the
        // operator pod's own service account; its namespace got the per-namespace install and
        // enforces Pod Security "restricted", as platforms commonly do.
        kubectl(
            k,
            &[
                "apply",
                "-f",
                &format!("{DEPLOY}/rbac/workspace-service-account.yaml"),
            ],
        )
        .unwrap();
        kubectl(
            k,
            &[
                "apply",
                "-n",
                "default",
                "-k",
                &format!("{DEPLOY}/workspace-namespace"),
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        kubectl(
            k,
            &[
                "label",
                "namespace",
                "default",
                "pod-security.kubernetes.io/enforce=restricted",
            ],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        apply(k, &workspace("before"));
        until(
            Duration::from_secs(60),
            "workspace before Running",
            explain,
            || running(k, "before"),
        );
        let agent =
            get(k, &["get", "workspace", "before"]).unwrap()["status"]["agent"]["identity"].clone();
        assert_eq!(agent, "system:serviceaccount:berth-system:berth-controller");

        // The leader's pod is deleted: it releases the Lease on SIGTERM, the standby takes
        // it (before the leader's last renewal would have expired: released, not lost), and
        // the ReplicaSet brings a new standby.
        let before = get(
            k,
            &["get", "lease", "-n", "berth-system", "berth-controller"],
        )
        .unwrap();
        kubectl(
            k,
            &[
                "delete",
                "pod",
                "-n",
                "berth-system",
                &leader_pod,
                "--wait=false",
            ],
        )
        .unwrap();
        let standby = names.iter().find(|n| **n != leader_pod).unwrap().clone();
        until(
            Duration::from_secs(30),
            "the standby holding the Lease",
            explain,
            || holder(k).filter(|h| h.starts_with(&format!("{standby}-"))),
        );
        let after = get(
            k,
            &["get", "lease", "-n", "berth-system", "berth-controller"],
        )
        .unwrap();
        let time = |lease: &Value, field: &str| {
            lease["spec"][field]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .unwrap_or_else(|| panic!("{field} in {lease}"))
        };
        let expiry = time(&before, "renewTime")
            + jiff::SignedDuration::from_secs(
                before["spec"]["leaseDurationSeconds"].as_i64().unwrap(),
            );
        assert!(
            time(&after, "acquireTime") < expiry,
            "the standby took the Lease only once it expired: {before} then {after}"
        );
        let replaced = until(
            Duration::from_secs(60),
            "a new second replica Ready",
            explain,
            || {
                ready_operators(k).filter(|pods| {
                    pods.iter()
                        .all(|p| p["metadata"]["name"] != leader_pod.as_str())
                })
            },
        );
        assert!(
            replaced
                .iter()
                .any(|p| p["metadata"]["name"] == standby.as_str())
        );

        // The admission policy `kubectl apply -k deploy/` installed: a user who may create
        // workspaces but not read a secret is refused one that names it, in the policy's words.
        let author = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: workspace-author, namespace: default}\nrules: [{apiGroups: [berth.dev], resources: [workspaces], verbs: [get, create]}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: mallory, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: workspace-author}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: mallory}]\n";
        apply(k, author);
        let grab = format!(
            "{}  podTemplate:\n    volumes:\n      secrets: [{{secretName: payments-db, mountPath: /s}}]\n",
            workspace("grab")
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), grab).unwrap();
        let denied = kubectl(
            k,
            &[
                "create",
                "--as=mallory",
                "-f",
                file.path().to_str().unwrap(),
            ],
        )
        .expect_err("the admission policy refuses a secret its author may not read");
        assert!(
            denied.contains("workspaces.berth.dev \"grab\" is forbidden: ValidatingAdmissionPolicy 'workspaces.berth.dev' with binding 'workspaces.berth.dev' denied request: User \"mallory\" cannot get secrets \"payments-db\" in the namespace \"default\", which spec.podTemplate.volumes.secrets[mountPath=/s] names"),
            "{denied}"
        );

        // A workspace created after the takeover runs.
        apply(k, &workspace("after"));
        until(
            Duration::from_secs(60),
            "workspace after Running",
            explain,
            || running(k, "after"),
        );
        let deployment = get(
            k,
            &[
                "get",
                "deployment",
                "-n",
                "berth-system",
                "berth-controller",
            ],
        )
        .unwrap();
        assert_eq!(deployment["status"]["availableReplicas"], 2, "{deployment}");
    }
}

/// Every flag of every subcommand says, in `--help`, its environment variable and its default
/// (or that it is required, or that there is none), and each subcommand says what it needs
/// from the cluster: what a person reads before running it.
#[test]
fn every_flag_has_its_default_and_environment_variable_in_help() {
    let mut missing = vec![];
    for sub in ["controller", "dev", "sim", "agent"] {
        let output = std::process::Command::new(BERTH)
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{sub} --help");
        let help = String::from_utf8(output.stdout).unwrap();
        let about = help.split("Usage:").next().unwrap_or_default();
        if !about.to_lowercase().contains("needs") {
            missing.push(format!("{sub}: the description does not say what it needs"));
        }
        let options = help.split("Options:").nth(1).unwrap_or_default();
        // One block per flag: its line and the indented lines under it.
        let mut blocks: Vec<String> = vec![];
        for line in options.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("--")
                || trimmed.starts_with("-h,")
                || (trimmed.starts_with('-')
                    && trimmed.len() > 1
                    && trimmed.as_bytes()[1] != b'-'
                    && trimmed.as_bytes()[2] == b',')
            {
                blocks.push(String::new());
            }
            if let Some(block) = blocks.last_mut() {
                block.push_str(line);
                block.push('\n');
            }
        }
        for block in blocks
            .iter()
            .filter(|b| !b.trim_start().starts_with("-h, --help"))
        {
            let flag = block
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            let text = block.to_lowercase();
            // Only `berth agent --auth` is never read from the environment, on purpose.
            if !block.contains("[env: ") && !text.contains("never the environment") {
                missing.push(format!("{sub} {flag}: no environment variable"));
            }
            if !(text.contains("default") || text.contains("required")) {
                missing.push(format!("{sub} {flag}: no default"));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

/// `berth serve` serves a folder's files, never to be kept by a browser: once the workspace
/// stops, the same address shows the gateway's page (and its start button), not a copy.
/// The developer's subcommands say, in `--help`, the environment variable of each flag that
/// picks the cluster, the namespace and the gateway, and that variable is read.
#[test]
fn client_flags_show_and_read_their_environment_variables() {
    for sub in [
        "ls",
        "start",
        "stop",
        "open",
        "dashboard",
        "port-forward",
        "shell",
        "ssh",
        "ssh-config",
    ] {
        let help = Command::new(BERTH).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        for variable in ["BERTH_KUBECONFIG", "BERTH_CONTEXT", "BERTH_NAMESPACE"] {
            assert!(
                help.contains(&format!("[env: {variable}=")),
                "{sub}: {variable}\n{help}"
            );
        }
        if sub != "ls" && sub != "start" && sub != "stop" {
            assert!(help.contains("[env: BERTH_GATEWAY="), "{sub}\n{help}");
        }
    }
    let read = Command::new(BERTH)
        .arg("ls")
        .env("BERTH_KUBECONFIG", "/no/such/kubeconfig")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&read.stderr);
    assert!(said.contains("/no/such/kubeconfig"), "{said}");
}

#[test]
fn serve_serves_files_a_browser_does_not_keep() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    let port = free_port();
    let mut serve = Command::new(BERTH)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let response = poll(Duration::from_secs(20), "berth serve to answer", || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream
            .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        Some(response)
    });
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(
        response
            .lines()
            .any(|l| l.eq_ignore_ascii_case("cache-control: no-store")),
        "{response}"
    );
    assert!(response.ends_with("hello\n"), "{response}");
}
