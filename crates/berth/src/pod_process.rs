//! The container runtime of `berth sim`: a container of Berth's own image that runs the
//! operator (`berth controller ...`) becomes a real `berth`
//! process of this binary, with the container's environment and nothing of ours, and the
//! files of its volumes mounted below `/var/run` (the service-account token, `ca.crt` and
//! `namespace` at `/var/run/secrets/kubernetes.io/serviceaccount`) in a mount namespace of
//! its own, so it takes the in-cluster path a pod takes. An agent container runs the agent
//! in-process; with a `ProcessRuntime`, its workspace command and every other container run as
//! processes of the host, Berth's init container with this binary where the image has it.

use std::{
    ffi::CString,
    os::unix::{ffi::OsStrExt, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use berth_agent::sim_runtime::{AgentRuntime, runs_agent, start_agent, workspace_command};
use berth_sim::{
    BoxFuture, ContainerContext, ContainerRuntime, ExecRequest, ExecSession, ProcessRuntime,
    RunningContainer,
};
use serde_json::Value;

type OutputPipe = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// What the container's own `/var/run` holds: the service-account volume, where in-cluster
/// clients read the token, `ca.crt` and `namespace`, and any volume mounted below it.
const RUN_DIR: &str = "/var/run/";
/// Where Berth's image has the `berth` binary.
const BINARY_IN_IMAGE: &str = "/usr/local/bin/berth";
/// The subcommands that run as processes: the ones the install's Deployments run.
const PROCESS_SUBCOMMANDS: &[&str] = &["controller"];

/// Runs Berth's operator containers as processes of `binary`, its agents in-process, and,
/// with `processes`, every other container (and a workspace's own command beside its agent)
/// as processes of the host.
#[derive(Clone)]
pub struct PodProcessRuntime {
    binary: PathBuf,
    agents: AgentRuntime,
    processes: Option<ProcessRuntime>,
}

impl PodProcessRuntime {
    pub fn new(binary: PathBuf) -> Self {
        PodProcessRuntime {
            binary,
            agents: AgentRuntime,
            processes: None,
        }
    }

    /// Runs the containers that are not Berth's as processes of `processes`, and Berth's init
    /// container too: this binary is where Berth's image has it, so the container's
    /// `berth install` really puts the agent in the pod's volume for the workspace to run.
    pub fn with_processes(self, processes: ProcessRuntime) -> Self {
        let processes = processes.with_image_file(is_berth_image, BINARY_IN_IMAGE, &self.binary);
        PodProcessRuntime {
            processes: Some(processes),
            ..self
        }
    }
}

/// One container of two parts: the in-process agent and the workspace's command, which ends
/// the container when it exits (as the real agent exits with its command's code).
fn agent_and_command(agent: RunningContainer, command: RunningContainer) -> RunningContainer {
    let (exit_tx, exited) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<Duration>();
    tokio::spawn(async move {
        let (agent_exited, agent_stop) = (agent.exited, agent.stop);
        let (command_exited, command_stop) = (command.exited, command.stop);
        let code = tokio::select! {
            code = command_exited => code.unwrap_or(137),
            code = agent_exited => {
                let _ = command_stop.send(Duration::ZERO);
                code.unwrap_or(137)
            }
            grace = stop_rx => {
                let grace = grace.unwrap_or_default();
                let _ = command_stop.send(grace);
                let _ = agent_stop.send(grace);
                return exit_tx.send(143).unwrap_or_default();
            }
        };
        let _ = exit_tx.send(code);
    });
    RunningContainer { exited, stop }
}

/// Whether an image is Berth's: its repository's last part is `berth`.
fn is_berth_image(image: &str) -> bool {
    let without_digest = image.split('@').next().unwrap_or_default();
    let repository = match without_digest.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => without_digest,
    };
    repository.rsplit('/').next() == Some("berth")
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The arguments after the program, when the container runs one of `PROCESS_SUBCOMMANDS` of
/// Berth's image: its command (whose program is `berth`) or the image's entrypoint, then args.
pub fn berth_arguments(container: &Value) -> Option<Vec<String>> {
    if !is_berth_image(container["image"].as_str().unwrap_or_default()) {
        return None;
    }
    let command = strings(&container["command"]);
    let mut arguments = match command.split_first() {
        None => vec![],
        Some((program, rest)) if program.rsplit('/').next() == Some("berth") => rest.to_vec(),
        Some(_) => return None,
    };
    arguments.extend(strings(&container["args"]));
    PROCESS_SUBCOMMANDS
        .contains(&arguments.first()?.as_str())
        .then_some(arguments)
}

/// Lays out the root of what the process sees at `/var/run`: the container's mounted files
/// under it (the service-account volume at `secrets/kubernetes.io/serviceaccount`, and any
/// other volume mounted below `/var/run`), and an empty home.
fn lay_out(root: &Path, context: &ContainerContext) -> std::io::Result<()> {
    let run = root.join("run");
    std::fs::create_dir_all(run.join("secrets/kubernetes.io/serviceaccount"))?;
    for (path, bytes) in &context.files {
        let Some(relative) = path
            .strip_prefix(RUN_DIR)
            .or_else(|| path.strip_prefix("/run/"))
            .filter(|p| !p.split('/').any(|part| part == ".."))
        else {
            continue;
        };
        let file = run.join(relative);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(file, bytes)?;
    }
    std::fs::create_dir_all(root.join("home"))?;
    Ok(())
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Writes `text` to an open-able file; for the user namespace maps, between fork and exec
/// (no allocation: both are prepared before the fork).
fn write_file(path: &CString, text: &[u8]) -> std::io::Result<()> {
    // SAFETY: `path` is a valid C string; the descriptor is closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, text.as_ptr().cast(), text.len());
        libc::close(fd);
        if written < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Everything the child does between fork and exec, prepared beforehand.
struct Namespace {
    /// Our `run` folder, bound over the real `/var/run` (resolved), in the child only.
    source: CString,
    target: CString,
    /// For an unprivileged run: a user namespace with our own uid and gid mapped.
    maps: Option<(Vec<u8>, Vec<u8>)>,
    setgroups: CString,
    uid_map: CString,
    gid_map: CString,
}

impl Namespace {
    fn new(root: &Path) -> std::io::Result<Self> {
        let target = std::fs::canonicalize("/var/run")?;
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(Namespace {
            source: c_path(&root.join("run"))?,
            target: c_path(&target)?,
            maps: (uid != 0).then(|| {
                (
                    format!("{uid} {uid} 1").into_bytes(),
                    format!("{gid} {gid} 1").into_bytes(),
                )
            }),
            setgroups: c_path(Path::new("/proc/self/setgroups"))?,
            uid_map: c_path(Path::new("/proc/self/uid_map"))?,
            gid_map: c_path(Path::new("/proc/self/gid_map"))?,
        })
    }

    /// In the child: a private mount namespace (in a user namespace when not root) where our
    /// folder is `/var/run`.
    fn enter(&self) -> std::io::Result<()> {
        let flags = if self.maps.is_some() {
            libc::CLONE_NEWUSER | libc::CLONE_NEWNS
        } else {
            libc::CLONE_NEWNS
        };
        // SAFETY: plain system calls on prepared C strings; no allocation after the fork.
        unsafe {
            // The container goes with the simulator, however it ends.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid_map, gid_map)) = &self.maps {
                write_file(&self.setgroups, b"deny")?;
                write_file(&self.uid_map, uid_map)?;
                write_file(&self.gid_map, gid_map)?;
            }
            let root = c"/";
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                self.source.as_ptr(),
                self.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

impl PodProcessRuntime {
    /// Whether this machine lets a container's process have its own mount namespace (as
    /// root, or in a user namespace): runs `berth --version` as a container would run.
    pub async fn check_isolation(&self) -> Result<(), String> {
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::create_dir_all(root.path().join("run")).map_err(|e| e.to_string())?;
        let namespace = Namespace::new(root.path()).map_err(|e| e.to_string())?;
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: `enter` makes only system calls on values prepared before the fork.
        unsafe {
            command.pre_exec(move || namespace.enter());
        }
        command.kill_on_drop(true);
        match tokio::time::timeout(Duration::from_secs(10), command.status()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(format!("a namespaced berth --version exited with {status}")),
            Ok(Err(e)) => Err(format!(
                "this machine allows no mount namespace for a pod's process: {e}"
            )),
            Err(_) => Err("a namespaced berth --version did not exit within 10 s".to_owned()),
        }
    }

    async fn start_process(
        &self,
        context: ContainerContext,
        arguments: Vec<String>,
    ) -> Result<RunningContainer, String> {
        let root = tempfile::Builder::new()
            .prefix(&format!("berth-pod-{}-", context.pod_name))
            .tempdir()
            .map_err(|e| format!("cannot make the container's folder: {e}"))?;
        lay_out(root.path(), &context)
            .map_err(|e| format!("cannot write the container's files: {e}"))?;
        let namespace = Namespace::new(root.path())
            .map_err(|e| format!("cannot prepare the container's mounts: {e}"))?;
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .args(&arguments)
            .env_clear()
            .envs(context.env.iter().map(|(k, v)| (k, v)))
            .env("HOME", root.path().join("home"))
            .env("HOSTNAME", &context.pod_name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: `enter` makes only system calls on values prepared before the fork.
        unsafe {
            command.pre_exec(move || namespace.enter());
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.binary.display()))?;
        // Its output is its log, as `kubectl logs` reads it.
        for output in [
            child.stdout.take().map(|o| Box::pin(o) as OutputPipe),
            child.stderr.take().map(|o| Box::pin(o) as OutputPipe),
        ]
        .into_iter()
        .flatten()
        {
            let log = context.log.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut output = output;
                let mut chunk = [0u8; 8192];
                while let Ok(n) = output.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    log.write(&chunk[..n]);
                }
            });
        }
        let (exit_tx, exited) = tokio::sync::oneshot::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<std::time::Duration>();
        let pid = child.id();
        tokio::spawn(async move {
            let _root = root;
            let status = tokio::select! {
                status = child.wait() => status,
                grace = stop_rx => {
                    // As a kubelet: SIGTERM, then SIGKILL once the grace period is over.
                    let grace = grace.unwrap_or_default();
                    if let Some(pid) = pid {
                        // SAFETY: signalling our own child, which has not been reaped yet.
                        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                    }
                    match tokio::time::timeout(grace, child.wait()).await {
                        Ok(status) => status,
                        Err(_) => {
                            let _ = child.start_kill();
                            child.wait().await
                        }
                    }
                }
            };
            let code = match status {
                Ok(status) => status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(9)),
                Err(_) => 137,
            };
            let _ = exit_tx.send(code);
        });
        Ok(RunningContainer { exited, stop })
    }
}

impl ContainerRuntime for PodProcessRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        if let Some(arguments) = berth_arguments(&context.container).filter(|_| !context.init) {
            let this = self.clone();
            return Box::pin(async move { this.start_process(context, arguments).await });
        }
        let Some(processes) = self.processes.clone() else {
            return self.agents.start(context);
        };
        if !context.init && runs_agent(&context.container) {
            return Box::pin(async move {
                let command = workspace_command(&context.container);
                let agent = start_agent(context.clone(), false).await?;
                let command = processes.run(context, command).await?;
                Ok(agent_and_command(agent, command))
            });
        }
        processes.start(context)
    }

    fn exec(
        &self,
        context: &ContainerContext,
        request: ExecRequest,
    ) -> BoxFuture<Result<ExecSession, String>> {
        match &self.processes {
            Some(processes) => processes.exec(context, request),
            None => self.agents.exec(context, request),
        }
    }

    fn attach(&self, context: &ContainerContext) -> Option<berth_sim::AttachedInput> {
        self.processes.as_ref()?.attach(context)
    }

    fn exit_reason(&self, context: &ContainerContext) -> Option<String> {
        self.processes.as_ref()?.exit_reason(context)
    }

    fn termination_message(&self, context: &ContainerContext) -> Option<Vec<u8>> {
        self.processes.as_ref()?.termination_message(context)
    }

    fn forget_pod(&self, pod_uid: &str) {
        if let Some(processes) = &self.processes {
            processes.forget_pod(pod_uid);
        }
    }

    fn forget_claim(&self, claim_uid: &str) {
        if let Some(processes) = &self.processes {
            processes.forget_claim(claim_uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A process that ignores SIGTERM is killed once its grace period is over, and
    /// reports 137, as under a kubelet.
    #[tokio::test]
    async fn a_process_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("berth");
        std::fs::write(
            &script,
            "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\ntrap '' TERM\necho started\nwhile true; do sleep 0.1; done\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runtime = PodProcessRuntime::new(script);
        if let Err(why) = runtime.check_isolation().await {
            eprintln!("skipped: {why}");
            return;
        }
        let context = ContainerContext {
            namespace: "default".into(),
            pod_name: "stubborn".into(),
            pod_uid: "uid".into(),
            pod: json!({"spec": {"terminationGracePeriodSeconds": 1}}),
            container: json!({"name": "c", "image": "ghcr.io/berth-dev/berth:0.1.0", "args": ["controller"]}),
            init: false,
            pod_ip: std::net::Ipv4Addr::LOCALHOST,
            token: String::new(),
            api_server: String::new(),
            ca_pem: String::new(),
            files: Default::default(),
            mounts: vec![],
            env: vec![],
            log: Default::default(),
        };
        let log = context.log.clone();
        let RunningContainer { exited, stop } = runtime.start(context).await.unwrap();
        for _ in 0..100 {
            if log.read().1 > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(log.read().0, b"started\n");
        let asked = std::time::Instant::now();
        let _ = stop.send(Duration::from_secs(1));
        let code = tokio::time::timeout(Duration::from_secs(20), exited)
            .await
            .expect("killed after its grace")
            .unwrap();
        assert_eq!(code, 137);
        assert!(
            asked.elapsed() >= Duration::from_secs(1),
            "not before the grace period"
        );
    }

    #[test]
    fn only_berths_own_image_running_the_operator_is_a_process() {
        let operator = json!({"image": "ghcr.io/berth-dev/berth:0.1.0", "args": ["controller", "--leader-election"]});
        assert_eq!(
            berth_arguments(&operator),
            Some(vec!["controller".into(), "--leader-election".into()])
        );
        let with_command = json!({"image": "registry:5000/berth", "command": ["/usr/local/bin/berth", "controller"], "args": ["--namespace", "a"]});
        assert_eq!(
            berth_arguments(&with_command),
            Some(vec!["controller".into(), "--namespace".into(), "a".into()])
        );
        for other in [
            json!({"image": "ghcr.io/berth-dev/berth:0.1.0", "command": ["/opt/berth/berth", "agent", "--", "sleep"]}),
            json!({"image": "ghcr.io/berth-dev/berth:0.1.0", "args": ["install", "/opt/berth/berth"]}),
            json!({"image": "ghcr.io/someone/berthing:1", "args": ["controller"]}),
            json!({"image": "ghcr.io/berth-dev/berth:0.1.0", "command": ["sh", "-c", "berth controller"]}),
        ] {
            assert_eq!(berth_arguments(&other), None, "{other}");
        }
        assert!(is_berth_image("localhost:5000/berth"));
        assert!(is_berth_image("berth@sha256:abc"));
    }
}
