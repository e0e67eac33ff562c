//! `berth`: the one binary. Each subcommand is one of Berth's jobs: the operator, the in-pod
//! agent, the gateway into workspaces, the simulated cluster, the CRD printer, and the
//! no-cluster dev environment.

mod agent;
mod controller;
#[cfg(feature = "sim")]
mod dev;
mod gateway;
#[cfg(feature = "sim")]
mod pod_process;
mod serve;
mod shell;
mod ssh;
mod workspaces;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Berth runs developer workspaces on Kubernetes: each Workspace becomes a pod that Berth
/// keeps alive, explains and repairs.
#[derive(Parser, Debug)]
#[command(name = "berth", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start a simulated cluster, the operator and the example workspaces, and show a live
    /// table of workspaces; use kubectl with ./berth-dev.kubeconfig in another terminal. Needs
    /// no cluster; the operator's pods need a mount namespace each (root or unprivileged user
    /// namespaces), else the operator runs inside `berth dev`.
    #[cfg(feature = "sim")]
    Dev(dev::DevArgs),
    /// Run the operator against the current kubeconfig or the in-cluster config. Needs the
    /// Workspace CRD (`berth crd`, `deploy/crds/`) and the RBAC of `deploy/rbac/`; each
    /// workspace's service account needs `system:auth-delegator` for its agent.
    Controller(Box<controller::ControllerArgs>),
    /// Run the in-pod agent (gRPC on :50051), supervising `-- CMD ARGS...` if given. Needs
    /// its pod's service account to create TokenReviews and SubjectAccessReviews
    /// (`system:auth-delegator`).
    Agent(Box<agent::AgentArgs>),
    /// List your workspaces with their phase and message (kubectl's kubeconfig, context and
    /// namespace; -A for every namespace).
    Ls(workspaces::LsArgs),
    /// Start a stopped workspace (spec.paused: false) and wait until it is Running, saying
    /// each phase and message on the way.
    Start(workspaces::SwitchArgs),
    /// Stop a workspace (spec.paused: true: its pod goes, its home stays) and wait until it
    /// is Stopped.
    Stop(workspaces::SwitchArgs),
    /// Print (and open in a browser) a one-time login link to a workspace's port through the
    /// gateway, for you (your kubeconfig's user, who must be allowed to connect to it).
    Open(workspaces::OpenArgs),
    /// Print (and open in a browser) a one-time login link to the gateway's dashboard: your
    /// workspaces, live, with start, stop and delete, and a spawner of kinds you may use.
    Dashboard(workspaces::DashboardArgs),
    /// Forward a local port to a workspace's port through the gateway (a WebSocket per
    /// connection, with your credential): `berth port-forward NAME [LOCAL:]PORT`.
    PortForward(workspaces::PortForwardArgs),
    /// Run a command (default: a login shell) in a workspace's container, on a terminal when
    /// stdin is one, through the gateway with your credential; its exit code is berth's:
    /// `berth shell NAME [-- CMD ARGS...]`.
    Shell(shell::ShellArgs),
    /// SSH into a workspace through the gateway with your credential (OpenSSH with the
    /// workspace's host key): `berth ssh NAME [-- CMD ARGS...]`. With --stdio, the connection
    /// itself on stdin and stdout, as OpenSSH's ProxyCommand.
    Ssh(ssh::SshArgs),
    /// Print OpenSSH `Host berth--NAME` entries for workspaces (for ssh, scp, sftp, rsync,
    /// ssh -L, VS Code Remote-SSH, JetBrains Gateway) and write their host keys to
    /// ~/.ssh/berth_known_hosts, so the first connection is verified.
    SshConfig(ssh::SshConfigArgs),
    /// Serve workspaces' ports to the people allowed into them: HTTP and WebSocket at
    /// /w/<namespace>/<workspace>/<port>/, for a caller whose bearer token the API server
    /// accepts (TokenReview), or whose browser session a `berth open` link began, and who may
    /// `create` `workspaces/connect` on that workspace (SubjectAccessReview); a port marked
    /// public to anyone. Also opens `berth shell`s, through the workspace's agent. Needs the
    /// RBAC of `deploy/gateway/`.
    Gateway(gateway::GatewayArgs),
    /// Copy this binary to PATH (executable): how the init container puts the agent into a
    /// workspace pod, since the image has no shell or `cp`.
    Install {
        /// Where the copy goes, e.g. /opt/berth/berth.
        path: std::path::PathBuf,
    },
    /// Print a CustomResourceDefinition of Berth as YAML (what `deploy/crds/` holds): the
    /// Workspace's, or with `workspacekinds` the WorkspaceKind's.
    Crd {
        /// Which CRD, by its plural name.
        #[arg(default_value = "workspaces", value_parser = ["workspaces", "workspacekinds"])]
        which: String,
    },
    /// Serve a folder's files over HTTP: a real server for a workspace's port with nothing in
    /// its image but Berth (the agent's copy at /opt/berth/berth), as `berth dev`'s `web`
    /// example runs it.
    Serve(serve::ServeArgs),
    /// Run only the simulated Kubernetes cluster and write a kubeconfig for it. Needs nothing
    /// from a cluster: it is one. A container's command runs as a process of this machine (an
    /// image names nothing here: the machine's /usr, /bin, /lib and /etc stand in for it,
    /// read-only), with its volumes at their mount paths, in a mount namespace of its own
    /// (root or unprivileged user namespaces; else such containers run nothing). Berth's image
    /// has this binary at /usr/local/bin/berth (its entrypoint); its agents run inside the sim.
    #[cfg(feature = "sim")]
    Sim(SimArgs),
}

/// Options of `berth sim`.
#[cfg(feature = "sim")]
#[derive(clap::Args, Debug)]
struct SimArgs {
    /// Where to write the kubeconfig for the simulated cluster.
    #[arg(
        long,
        default_value = "berth-sim.kubeconfig",
        env = "BERTH_SIM_KUBECONFIG"
    )]
    kubeconfig: std::path::PathBuf,
    /// Port of the API server on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0, env = "BERTH_SIM_PORT")]
    port: u16,
    /// How many nodes (node-1 ... node-N, 4 cpu and 16Gi each).
    #[arg(long, default_value_t = 3, env = "BERTH_SIM_NODES")]
    nodes: usize,
    /// Seed of the simulator's random faults, to reproduce a run.
    #[arg(long, default_value_t = 1, env = "BERTH_SIM_SEED")]
    seed: u64,
    /// Millisecond timings (image pulls, starts, heartbeats), as the tests use, instead of
    /// ones close to a real cluster's: for benchmarks. Default: off.
    #[arg(long, env = "BERTH_SIM_FAST")]
    fast: bool,
    /// How often each node renews its Lease (default: 10s, or 100ms with --fast). A real
    /// kubelet renews every 10s; a scale run with many nodes wants that rather than --fast's.
    #[arg(long, env = "BERTH_SIM_NODE_HEARTBEAT", value_parser = controller::duration)]
    node_heartbeat: Option<std::time::Duration>,
    /// What containers other than Berth's do: `processes` runs their commands on this machine,
    /// each in a mount namespace of its own (where the machine allows none, they run nothing
    /// and the first line says why); `nothing` runs none, as a benchmark of the operator at
    /// thousands of pods wants.
    #[arg(
        long,
        value_enum,
        default_value = "processes",
        env = "BERTH_SIM_CONTAINERS"
    )]
    containers: Containers,
    /// Give an image an entrypoint, as if the image had it: `IMAGE=ENTRYPOINT` (shell words;
    /// `{podIP}` is the pod's address, which a server listens on since pods share this
    /// machine's network; the image also finds this binary at /usr/local/bin/berth), e.g.
    /// `nginx='python3 -m http.server --bind {podIP} 8080'`. Repeat it for more images (in the
    /// environment variable, separate them with `;`). The image is matched by repository,
    /// whatever its tag. Default: none (an image's entrypoint is not on this machine, so a
    /// container without a command runs nothing, but can be entered).
    #[arg(long = "image", value_name = "IMAGE=ENTRYPOINT", env = "BERTH_SIM_IMAGE", value_delimiter = ';', value_parser = pod_process::ImageEntrypoint::parse)]
    images: Vec<pod_process::ImageEntrypoint>,
    /// A YAML file of image entrypoints, as --image gives them: a list of
    /// `{image: nginx, entrypoint: [python3, -m, http.server, --bind, "{podIP}", "8080"]}`.
    /// Default: none.
    #[arg(long, env = "BERTH_SIM_IMAGES")]
    images_file: Option<std::path::PathBuf>,
    /// Serve node-1's kubelet API on this port of 127.0.0.1 (`/exec`, `/pods`,
    /// `/stats/summary`, ... as a kubelet serves 10250; authorized on `nodes/proxy`), for
    /// clients that talk to a kubelet directly. Default: none (the node proxy reaches it).
    #[arg(long, env = "BERTH_SIM_KUBELET_PORT")]
    kubelet_port: Option<u16>,
}

/// What `berth sim` does with containers that are not Berth's.
#[cfg(feature = "sim")]
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Containers {
    Processes,
    Nothing,
}

/// mimalloc, for every process of the binary. The image is built for musl, whose allocator is
/// slow with several threads, and glibc's per-thread arenas fragment: measured with the scale
/// benchmark, the allocator alone moved the operator's CPU per workspace start by a third.
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives the operator its allocator's settings from its first allocation: no transparent
/// huge pages, and memory freed given back at once. mimalloc marks its segments for huge
/// pages (`MADV_HUGEPAGE`), and the kernel then backs each 2 MiB of a segment whole however
/// little of it is used: measured with the scale benchmark at 1 000 workspaces, 36 of the
/// operator's 50 MiB were huge pages. Turned off from `main` (as before), the pages faulted
/// before it stay huge (6 MiB); and mimalloc's default delay before it returns freed pages
/// kept the restart's burst of list pages resident: with both set from the start, 3 000
/// workspaces of a kind took 37 MiB of anonymous memory after their start instead of 43, and
/// the restart's peak was 61 MiB instead of 83, at the same CPU. mimalloc reads its settings
/// from the environment when the process starts, so the operator executes itself once more
/// with them (same process, same arguments), unless they are set already (an admin's own
/// setting wins). Not for the agent: the prctl that mimalloc makes for it is inherited by
/// the command it supervises (the user's tools, which may want huge pages); nor for the
/// simulated cluster, which holds gigabytes and is faster with them (at 10 000 workspaces
/// without them it took 40 % more CPU).
#[cfg(all(target_os = "linux", not(feature = "dhat-heap")))]
fn operator_allocator() {
    use std::os::unix::process::CommandExt;
    const THP: &str = "MIMALLOC_ALLOW_THP";
    const PURGE: &str = "MIMALLOC_PURGE_DELAY";
    if std::env::var_os(THP).is_some() {
        return;
    }
    let mut args = std::env::args_os();
    let mut again = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = args.next() {
        again.arg0(arg0);
    }
    again.args(args).env(THP, "0");
    if std::env::var_os(PURGE).is_none() {
        again.env(PURGE, "0");
    }
    let err = again.exec();
    eprintln!(
        "berth: cannot execute itself again with its allocator's settings ({THP}=0, {PURGE}=0), so it runs with the pages faulted so far huge: {err}"
    );
    if let Err(err) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("berth: cannot turn transparent huge pages off: {err}");
    }
}

/// With `--features dhat-heap`, every allocation is recorded; the profile is written to
/// `$BERTH_DHAT_OUT` (default `dhat-heap.json`) when the process exits.
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() -> ExitCode {
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::builder()
        .file_name(std::env::var("BERTH_DHAT_OUT").unwrap_or_else(|_| "dhat-heap.json".into()))
        .build();
    let cli = Cli::parse();
    #[cfg(all(target_os = "linux", not(feature = "dhat-heap")))]
    if matches!(cli.command, Command::Controller(_)) {
        operator_allocator();
    }
    let logs = match cli.command {
        #[cfg(feature = "sim")]
        // The table shows what agent checks find; their warnings would repeat it.
        Command::Dev(_) => Some("warn,berth_agent::auth=error,berth_controller::agent=error"),
        Command::Controller(_) | Command::Agent(_) | Command::Gateway(_) => Some("info"),
        _ => None,
    };
    if let Some(default) = logs
        && let Err(err) = init_logging(default)
    {
        eprintln!("berth: {err}");
        return ExitCode::FAILURE;
    }
    match cli.command {
        Command::Crd { which } => match match which.as_str() {
            "workspacekinds" => berth_api::crd::workspace_kind_crd_yaml(),
            _ => berth_api::crd::workspace_crd_yaml(),
        } {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("berth crd: {err}");
                ExitCode::FAILURE
            }
        },
        #[cfg(feature = "sim")]
        Command::Dev(args) => block_on("dev", dev::run(args)),
        Command::Controller(args) => run_on(current_thread(), "controller", controller::run(*args)),
        Command::Agent(args) => exit_with("agent", agent::run(*args)),
        #[cfg(feature = "sim")]
        Command::Sim(args) => run_sim(args),
        Command::Serve(args) => block_on("serve", serve::run(args)),
        Command::Gateway(args) => block_on("gateway", gateway::run(args)),
        Command::Ls(args) => block_on("ls", workspaces::ls(args)),
        Command::Start(args) => block_on("start", workspaces::switch(args, true)),
        Command::Stop(args) => block_on("stop", workspaces::switch(args, false)),
        Command::Open(args) => block_on("open", workspaces::open(args)),
        Command::Dashboard(args) => block_on("dashboard", workspaces::open_dashboard(args)),
        Command::PortForward(args) => block_on("port-forward", workspaces::port_forward(args)),
        Command::Shell(args) => exit_with("shell", shell::run(args)),
        Command::Ssh(args) => exit_with("ssh", ssh::run(args)),
        Command::SshConfig(args) => block_on("ssh-config", ssh::config(args)),
        Command::Install { path } => match install(&path) {
            Ok(()) => {
                println!("berth install: copied to {}", path.display());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("berth install: {err}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Copies the running binary to `path` through a temporary file beside it, so the target is
/// never seen half-written.
fn install(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let partial = path.with_extension("partial");
    std::fs::copy(&me, &partial)
        .map_err(|e| format!("cannot copy {} to {}: {e}", me.display(), partial.display()))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot make {} executable: {e}", partial.display()))?;
    std::fs::rename(&partial, path)
        .map_err(|e| format!("cannot move the copy to {}: {e}", path.display()))
}

/// Logs through `tracing`: text on a terminal (colour only there), JSON otherwise;
/// `BERTH_LOG_FORMAT=text|json` decides, any other value is refused; `RUST_LOG` filters.
fn init_logging(default: &str) -> Result<(), String> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let terminal = std::io::stderr().is_terminal();
    let json = match std::env::var("BERTH_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("text") => false,
        Ok(other) => {
            return Err(format!(
                "BERTH_LOG_FORMAT must be text or json, not {other:?}"
            ));
        }
        Err(_) => !terminal,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(terminal && !json);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// Runs `job` on a fresh runtime; an error is printed as `berth <name>: <error>`.
/// Runs `job`, whose answer is the exit code (the supervised command's, the shell's); its
/// error is said and exits 1. Blocking threads left (reading stdin) are not waited for.
fn exit_with(name: &str, job: impl std::future::Future<Output = Result<i32, String>>) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("berth {name}: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(job) {
        Ok(code) => code.clamp(0, 255) as u8,
        Err(err) => {
            eprintln!("berth {name}: {err}");
            1
        }
    };
    runtime.shutdown_background();
    ExitCode::from(code)
}

fn block_on(name: &str, job: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    run_on(tokio::runtime::Runtime::new(), name, job)
}

/// The operator's runtime: one thread. Its work is small steps between API calls (decode an
/// object, decide, encode a write), and a start costs it a few milliseconds; on several
/// threads, handing those steps between them cost more than the steps (a quarter of the
/// operator's CPU in a 1 000-workspace burst was the kernel switching and waking threads).
fn current_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

fn run_on(
    runtime: std::io::Result<tokio::runtime::Runtime>,
    name: &str,
    job: impl std::future::Future<Output = Result<(), String>>,
) -> ExitCode {
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("berth {name}: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(job) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("berth {name}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit, as Go's runtime does
/// for every program: the sim holds a listener per running pod's agent, and many systems set
/// a soft limit of 1024.
#[cfg(feature = "sim")]
fn raise_open_files_limit() -> std::io::Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The runtime of `berth sim`: Berth's operator containers as processes of this binary, its
/// agents in-process, every other container as a process of this machine, in a mount
/// namespace of its own; where the machine allows none, containers other than Berth's run
/// nothing (and say why).
#[cfg(feature = "sim")]
async fn sim_runtime(
    data: &tempfile::TempDir,
    containers: Containers,
    images: &[pod_process::ImageEntrypoint],
) -> Result<berth_sim::SharedRuntime, String> {
    let binary = std::env::current_exe().map_err(|e| format!("cannot find its own binary: {e}"))?;
    let processes = berth_sim::ProcessRuntime::new(data.path());
    let processes = match processes.check_isolation().await {
        Ok(()) => Ok(processes),
        Err(why) => {
            eprintln!("berth sim: containers other than Berth's agents run nothing: {why}");
            Err(why)
        }
    };
    Ok(std::sync::Arc::new(pod_process::PodProcessRuntime::new(
        binary,
        processes,
        containers == Containers::Processes,
        images,
    )))
}

/// `berth sim`: serve the simulated cluster until Ctrl-C or SIGTERM.
#[cfg(feature = "sim")]
fn run_sim(args: SimArgs) -> ExitCode {
    if let Err(err) = raise_open_files_limit() {
        eprintln!("berth sim: cannot raise the limit of open files: {err}");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("berth sim: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let timings = if args.fast {
        berth_sim::Timings::fast()
    } else {
        berth_sim::Timings::realistic()
    };
    let data = match tempfile::Builder::new().prefix("berth-sim-").tempdir() {
        Ok(data) => data,
        Err(err) => {
            eprintln!("berth sim: cannot make a folder for the cluster's volumes: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut images = args.images.clone();
    if let Some(file) = &args.images_file {
        match pod_process::ImageEntrypoint::from_file(file) {
            Ok(more) => images.extend(more),
            Err(err) => {
                eprintln!("berth sim: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    runtime.block_on(async {
        let config = berth_sim::SimConfig {
            port: args.port,
            nodes: berth_sim::NodeConfig::several(args.nodes),
            runtime: match sim_runtime(&data, args.containers, &images).await {
                Ok(runtime) => runtime,
                Err(err) => {
                    eprintln!("berth sim: {err}");
                    return ExitCode::FAILURE;
                }
            },
            seed: args.seed,
            timings: berth_sim::Timings {
                heartbeat: args.node_heartbeat.unwrap_or(timings.heartbeat),
                ..timings
            },
            ..Default::default()
        };
        let mut cluster = match berth_sim::SimCluster::start(config).await {
            Ok(cluster) => cluster,
            Err(err) => {
                eprintln!("berth sim: {err}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(port) = args.kubelet_port {
            match cluster.serve_kubelet("node-1", port).await {
                Ok(address) => println!("berth sim: node-1's kubelet at https://{address}"),
                Err(err) => {
                    eprintln!("berth sim: cannot serve node-1's kubelet on port {port}: {err}");
                    return ExitCode::FAILURE;
                }
            }
        }
        if let Err(err) = cluster.write_kubeconfig(&args.kubeconfig) {
            eprintln!(
                "berth sim: cannot write {}: {err}",
                args.kubeconfig.display()
            );
            return ExitCode::FAILURE;
        }
        println!("berth sim: API server at {}", cluster.url());
        println!(
            "berth sim: kubeconfig written to {}",
            args.kubeconfig.display()
        );
        println!(
            "  kubectl --kubeconfig {} get nodes",
            args.kubeconfig.display()
        );
        println!(
            "  make node-1 reject its next pod: kubectl annotate node node-1 \
             sim.berth.dev/reject-next=1:OutOfcpu (more in crates/berth-sim/README.md)"
        );
        println!(
            "  install Berth as on a cluster (its pods run this binary): kubectl --kubeconfig {} apply -k deploy/",
            args.kubeconfig.display()
        );
        println!("berth sim: Ctrl-C or SIGTERM stops it");
        wait_for_shutdown_signal().await;
        cluster.shutdown();
        let _ = std::fs::remove_file(&args.kubeconfig);
        println!("berth sim: stopped");
        ExitCode::SUCCESS
    })
}

pub(crate) async fn wait_for_shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
