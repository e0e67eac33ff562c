//! The container runtime of `berth sim` and `berth dev`: every container is a process of the
//! `ProcessRuntime`, and Berth's image has this binary where the real image has it (at
//! `/usr/local/bin/berth`, its entrypoint). So the operator's Deployment runs real `berth
//! controller` processes that find the pod's token where a pod does and take the in-cluster
//! path, and Berth's init container really installs the agent for the workspace. An agent
//! container runs the agent in-process beside its workspace command; where other containers
//! should run nothing (`berth sim --containers nothing`), they go to the agent runtime, and
//! only the operator's containers are processes.

use std::{path::PathBuf, time::Duration};

use berth_agent::{
    shell::{BESIDE_ENTRYPOINT, Shells},
    sim_runtime::{AgentRuntime, runs_agent, start_agent, workspace_command},
};
use berth_sim::{
    BoxFuture, ContainerContext, ContainerRuntime, ExecRequest, ExecSession, ProcessRuntime,
    RunningContainer,
};

/// Where Berth's image has the `berth` binary, which is also its entrypoint.
pub const BINARY_IN_IMAGE: &str = "/usr/local/bin/berth";

/// An entrypoint this machine gives an image (`berth sim --image`), as if the image had it;
/// the image also finds this binary at [`BINARY_IN_IMAGE`], so `berth serve` can stand in for
/// its server.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct ImageEntrypoint {
    /// The image, by repository: `nginx` is also `nginx:1.27` and `docker.io/library/nginx`.
    pub image: String,
    /// The entrypoint's words; `{podIP}` is the pod's address.
    pub entrypoint: Vec<String>,
}

impl ImageEntrypoint {
    /// `IMAGE=ENTRYPOINT`, the entrypoint in shell words.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (image, words) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: write IMAGE=ENTRYPOINT, e.g. nginx='python3 -m http.server --bind {{podIP}} 80'"))?;
        let entrypoint = shlex::split(words)
            .filter(|w| !w.is_empty())
            .ok_or_else(|| {
                format!("{text:?}: the entrypoint is not shell words (an unclosed quote?)")
            })?;
        if image.trim().is_empty() {
            return Err(format!("{text:?}: which image?"));
        }
        Ok(ImageEntrypoint {
            image: image.trim().to_owned(),
            entrypoint,
        })
    }

    /// The entries of a YAML file: `- {image: nginx, entrypoint: [python3, -m, http.server]}`.
    pub fn from_file(path: &std::path::Path) -> Result<Vec<Self>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let entries: Vec<ImageEntrypoint> = serde_saphyr::from_str(&text).map_err(|e| {
            format!(
                "{}: not a list of {{image, entrypoint}}: {e}",
                path.display()
            )
        })?;
        match entries.iter().find(|e| e.entrypoint.is_empty()) {
            Some(empty) => Err(format!(
                "{}: {} has an empty entrypoint",
                path.display(),
                empty.image
            )),
            None => Ok(entries),
        }
    }
}

/// An image's repository as a registry names it: without its tag or digest, and without
/// Docker Hub's implicit `docker.io/library/`.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    // A tag is after the last colon, unless that colon is a registry's port (a slash follows).
    let image = match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => name,
        _ => image,
    };
    image
        .strip_prefix("docker.io/library/")
        .or_else(|| image.strip_prefix("docker.io/"))
        .or_else(|| image.strip_prefix("index.docker.io/library/"))
        .unwrap_or(image)
}

/// Runs Berth's containers as processes of this binary, its agents in-process, and, with
/// `others`, every other container (and a workspace's own command beside its agent) as a
/// process of the machine.
#[derive(Clone)]
pub struct PodProcessRuntime {
    agents: AgentRuntime,
    /// Err where the machine allows no mount namespace: why.
    processes: Result<ProcessRuntime, String>,
    others: bool,
}

impl PodProcessRuntime {
    /// `binary` is this binary, `processes` the runtime (checked: `check_isolation`) or why
    /// there is none.
    pub fn new(
        binary: PathBuf,
        processes: Result<ProcessRuntime, String>,
        others: bool,
        images: &[ImageEntrypoint],
    ) -> Self {
        let processes = processes.map(|p| {
            let mut p = p.with_image(
                is_berth_image,
                &[(BINARY_IN_IMAGE, binary.clone())],
                &[BINARY_IN_IMAGE],
            );
            for image in images {
                let wanted = repository(&image.image).to_owned();
                let entrypoint: Vec<&str> = image.entrypoint.iter().map(String::as_str).collect();
                p = p.with_image(
                    move |name| repository(name) == wanted,
                    &[(BINARY_IN_IMAGE, binary.clone())],
                    &entrypoint,
                );
            }
            p
        });
        // Agents clone content into their home claim's folder, where the processes see it.
        let agents = match &processes {
            Ok(processes) => {
                let processes = processes.clone();
                AgentRuntime::with_claim_dirs(std::sync::Arc::new(move |uid: &str, capacity| {
                    (processes.claim_folder(uid, capacity))
                        .map_err(|e| format!("cannot prepare claim {uid}'s folder: {e}"))
                }))
            }
            Err(_) => AgentRuntime::default(),
        };
        PodProcessRuntime {
            agents,
            processes,
            others,
        }
    }
}

/// One container of two parts: the in-process agent and the workspace's command, started once
/// the agent put the content in place, which ends the container when it exits (as the real
/// agent exits with its command's code).
fn agent_and_command(
    agent: RunningContainer,
    command: impl std::future::Future<Output = Result<RunningContainer, String>> + Send + 'static,
) -> RunningContainer {
    let (exit_tx, exited) = tokio::sync::oneshot::channel();
    let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<Duration>();
    tokio::spawn(async move {
        let (mut agent_exited, agent_stop) = (agent.exited, agent.stop);
        let started = tokio::select! {
            started = command => started,
            code = &mut agent_exited => return exit_tx.send(code.unwrap_or(137)).unwrap_or_default(),
            grace = &mut stop_rx => {
                let _ = agent_stop.send(grace.unwrap_or_default());
                return exit_tx.send(143).unwrap_or_default();
            }
        };
        let command = match started {
            Ok(command) => command,
            Err(why) => {
                tracing::warn!(%why, "the workspace's command did not start");
                let _ = agent_stop.send(Duration::ZERO);
                return exit_tx.send(128).unwrap_or_default();
            }
        };
        let (command_exited, command_stop) = (command.exited, command.stop);
        let code = tokio::select! {
            code = command_exited => code.unwrap_or(137),
            code = &mut agent_exited => {
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

/// Shells as the agent in the workspace container starts them: processes exec'd in
/// `context`'s container (its root, its volumes, its environment).
fn exec_in(processes: ProcessRuntime, context: ContainerContext) -> berth_agent::shell::Spawn {
    std::sync::Arc::new(move |request: berth_agent::shell::Request| {
        let (processes, context) = (processes.clone(), context.clone());
        Box::pin(async move {
            // In the home, as the agent starts a shell itself.
            let mut command: Vec<String> = [
                "/bin/sh",
                "-c",
                "if [ \"${HOME:-/}\" = / ] && [ -d \"$BERTH_HOME\" ]; then export HOME=\"$BERTH_HOME\"; fi; [ \"${HOME:-/}\" = / ] || cd \"$HOME\" 2>/dev/null; exec \"$@\"",
                "berth-shell",
            ]
            .map(str::to_owned)
            .into();
            command.extend(request.command.iter().cloned());
            if request.tty {
                // As the agent sets TERM for a shell it starts itself.
                command.splice(0..0, ["env".to_owned(), format!("TERM={}", request.term)]);
            }
            let exec = ExecRequest {
                command,
                tty: request.tty,
                stdin: true,
                // The caller's size before the command starts (a shell asks at once).
                size: Some((request.columns, request.rows)),
            };
            let session = processes.exec(&context, exec).await?;
            let resize = session.resize;
            Ok(berth_agent::shell::Session {
                stdin: session.stdin,
                stdout: session
                    .stdout
                    .ok_or_else(|| "the runtime gave the command no output".to_owned())?,
                stderr: session.stderr,
                resize,
                exited: session.exited,
                hang_up: session.hang_up,
            })
        })
    })
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

impl ContainerRuntime for PodProcessRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        // The content's init container is the agent, in-process as every agent.
        if context.init && runs_agent(&context.container) {
            return self.agents.start(context);
        }
        let agent = !context.init && runs_agent(&context.container);
        // Berth's operator: its containers run whatever the others do.
        let operator = !context.init
            && !agent
            && is_berth_image(context.container["image"].as_str().unwrap_or_default());
        let processes = match &self.processes {
            Ok(processes) if operator || self.others => processes.clone(),
            // The operator needs its pod's files where a pod has them: without a mount
            // namespace its container cannot start, as on a node that cannot mount them.
            Err(why) if operator => {
                let why = why.clone();
                return Box::pin(async move { Err(why) });
            }
            _ => return self.agents.start(context),
        };
        if agent {
            let claims = self.agents.claim_dirs().cloned();
            return Box::pin(async move {
                let command = workspace_command(&context.container);
                let shells = match command.is_empty() {
                    true => Shells::Unavailable(BESIDE_ENTRYPOINT.to_owned()),
                    false => Shells::Available(exec_in(processes.clone(), context.clone())),
                };
                let agent = start_agent(context.clone(), false, claims.as_ref(), shells).await?;
                let content = agent.content.clone();
                let command = async move {
                    content.ready().await;
                    processes.run(context, command).await
                };
                Ok(agent_and_command(agent.container, command))
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
            Ok(processes) => processes.exec(context, request),
            Err(_) => self.agents.exec(context, request),
        }
    }

    fn attach(&self, context: &ContainerContext) -> Option<berth_sim::AttachedInput> {
        self.processes.as_ref().ok()?.attach(context)
    }

    fn exit_reason(&self, context: &ContainerContext) -> Option<String> {
        self.processes.as_ref().ok()?.exit_reason(context)
    }

    fn termination_message(&self, context: &ContainerContext) -> Option<Vec<u8>> {
        self.processes.as_ref().ok()?.termination_message(context)
    }

    fn forget_pod(&self, pod_uid: &str) {
        if let Ok(processes) = &self.processes {
            processes.forget_pod(pod_uid);
        }
    }

    fn forget_claim(&self, claim_uid: &str) {
        if let Ok(processes) = &self.processes {
            processes.forget_claim(claim_uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_matched_by_its_repository_whatever_its_tag() {
        for (image, repo) in [
            ("nginx", "nginx"),
            ("nginx:1.27", "nginx"),
            ("docker.io/library/nginx:latest", "nginx"),
            ("nginx@sha256:abc", "nginx"),
            ("localhost:5000/team/app:2", "localhost:5000/team/app"),
            ("localhost:5000/team/app", "localhost:5000/team/app"),
            ("ghcr.io/example/notebook:1", "ghcr.io/example/notebook"),
        ] {
            assert_eq!(repository(image), repo, "{image}");
        }
    }

    #[test]
    fn an_image_entrypoint_is_written_as_shell_words() {
        assert_eq!(
            ImageEntrypoint::parse("nginx=python3 -m http.server --bind '{podIP}' 80").unwrap(),
            ImageEntrypoint {
                image: "nginx".into(),
                entrypoint: ["python3", "-m", "http.server", "--bind", "{podIP}", "80"]
                    .map(str::to_owned)
                    .into()
            }
        );
        assert!(
            ImageEntrypoint::parse("nginx")
                .unwrap_err()
                .contains("IMAGE=ENTRYPOINT")
        );
        assert!(
            ImageEntrypoint::parse("nginx='open")
                .unwrap_err()
                .contains("shell words")
        );
    }

    #[test]
    fn berths_image_is_known_by_its_repositorys_last_part() {
        for image in [
            "ghcr.io/berth-dev/berth:0.1.0",
            "localhost:5000/berth",
            "berth@sha256:abc",
            "registry:5000/berth",
        ] {
            assert!(is_berth_image(image), "{image}");
        }
        for image in [
            "ghcr.io/someone/berthing:1",
            "berth/other:1",
            "busybox:1.36",
        ] {
            assert!(!is_berth_image(image), "{image}");
        }
    }
}
