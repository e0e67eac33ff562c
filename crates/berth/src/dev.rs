//! `berth dev`: the one-command start with no cluster. A simulated cluster, the Workspace CRD,
//! the operator, the examples applied, and a live table of workspaces; kubectl works against
//! `./berth-dev.kubeconfig` meanwhile.

use std::{
    collections::BTreeMap,
    io::{IsTerminal, Write},
    path::PathBuf,
    time::Duration,
};

use berth_api::Workspace;
use berth_controller::rbac;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, reflector, watcher},
};

/// Options of `berth dev`.
#[derive(clap::Args, Debug)]
pub struct DevArgs {
    /// Stop after this long (e.g. 30s). Default: run until Ctrl-C.
    #[arg(long = "for", env = "BERTH_DEV_FOR", value_parser = |s: &str| berth_api::parse_duration(s).map_err(|e| e.to_string()))]
    pub duration: Option<Duration>,
    /// Where the kubeconfig for kubectl is written.
    #[arg(
        long,
        env = "BERTH_DEV_KUBECONFIG",
        default_value = "berth-dev.kubeconfig"
    )]
    pub kubeconfig: PathBuf,
    /// A folder of manifests to apply at start instead of the built-in examples. Default: the
    /// built-in examples (the files of the repository's `examples/`).
    #[arg(long, env = "BERTH_DEV_EXAMPLES")]
    pub examples: Option<PathBuf>,
    /// How many simulated nodes.
    #[arg(long, env = "BERTH_DEV_NODES", default_value_t = 3)]
    pub nodes: usize,
    /// Port of the gateway into workspaces (`berth gateway`) on 127.0.0.1; 0 picks a free one.
    #[arg(long, env = "BERTH_DEV_GATEWAY_PORT", default_value_t = 0)]
    pub gateway_port: u16,
}

/// The repository's `examples/`, built into the binary so an installed `berth dev` has them.
/// A test checks that this list is the folder's.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("basic.yaml", include_str!("../../../examples/basic.yaml")),
    (
        "content.yaml",
        include_str!("../../../examples/content.yaml"),
    ),
    ("idle.yaml", include_str!("../../../examples/idle.yaml")),
    ("kinds.yaml", include_str!("../../../examples/kinds.yaml")),
    (
        "missing-secret.yaml",
        include_str!("../../../examples/missing-secret.yaml"),
    ),
    (
        "no-auth-delegator.yaml",
        include_str!("../../../examples/no-auth-delegator.yaml"),
    ),
    (
        "notebook.yaml",
        include_str!("../../../examples/notebook.yaml"),
    ),
    (
        "pinned-to-node-1.yaml",
        include_str!("../../../examples/pinned-to-node-1.yaml"),
    ),
    (
        "secret-volume.yaml",
        include_str!("../../../examples/secret-volume.yaml"),
    ),
    (
        "unpullable-image.yaml",
        include_str!("../../../examples/unpullable-image.yaml"),
    ),
    (
        "unschedulable.yaml",
        include_str!("../../../examples/unschedulable.yaml"),
    ),
    ("web.yaml", include_str!("../../../examples/web.yaml")),
    (
        "workspace-author.yaml",
        include_str!("../../../examples/workspace-author.yaml"),
    ),
];

/// The manifests of `folder` (`.yaml`, `.yml`), by file name in order; the built-in examples
/// without one.
fn examples(folder: Option<&PathBuf>) -> Result<Vec<(String, String)>, String> {
    let Some(folder) = folder else {
        return Ok(EXAMPLES
            .iter()
            .map(|(name, text)| (name.to_string(), text.to_string()))
            .collect());
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| format!("cannot read {}: {e}", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            Ok((file.display().to_string(), text))
        })
        .collect()
}

/// The host the content examples name for `berth dev`'s own git server.
pub const DEV_GIT_HOST: &str = "git://berth-dev-git/";

/// `berth dev`'s git server for the content examples: `git daemon` on a free loopback port,
/// serving `hello.git` (made here, under `data`); the URL prefix that replaces
/// [`DEV_GIT_HOST`], or why there is none (no git on this machine).
fn content_server(data: &std::path::Path) -> Result<(GitDaemon, String), String> {
    let root = data.join("git");
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot make {}: {e}", root.display()))?;
    berth_agent::git_server::create_repository(
        &root,
        "hello",
        &[
            (
                "README.md",
                "# hello\n\nCloned into the workspace by its agent before the command started.\n",
            ),
            (
                "hello.sh",
                "#!/bin/sh\necho hello from the workspace's own code\n",
            ),
        ],
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free port: {e}"))?
        .port();
    let child = tokio::process::Command::new("git")
        .arg("daemon")
        .arg("--reuseaddr")
        .arg("--export-all")
        .arg("--informative-errors")
        .arg(format!("--base-path={}", root.display()))
        .arg("--listen=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(&root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // `git daemon` runs `git-daemon` as a child of its own: a group of their own, so
        // both go when berth dev does.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run git daemon: {e}"))?;
    Ok((GitDaemon(child), format!("git://127.0.0.1:{port}/")))
}

/// The git daemon's process group, killed when dropped.
struct GitDaemon(tokio::process::Child);

impl Drop for GitDaemon {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: a signal to the group this process made; at worst it is gone (ESRCH).
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// Removes berth dev's folder of volumes once the cluster is down. Its runtime's tasks may
/// still be finishing (a container killed a moment ago, a clone cut short), so it tries
/// again for a few seconds; a folder it cannot remove is said, never left silently.
async fn remove_data(data: tempfile::TempDir) {
    let path = data.keep();
    let mut last = None;
    for _ in 0..50 {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(e) = last {
        eprintln!("berth dev: cannot remove {}: {e}", path.display());
    }
}

/// Creates every object of every manifest, in order.
async fn apply_examples(
    client: &Client,
    manifests: &[(String, String)],
) -> Result<Vec<String>, String> {
    let mut applied = vec![];
    for (name, text) in manifests {
        let created = berth_sim::manifests::create_all(client, text, "default")
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        applied.extend(created);
    }
    Ok(applied)
}

/// Refuses a kubeconfig that another live cluster wrote (a second `berth dev` in the same
/// folder would take it over and delete it on exit); a stale one is overwritten.
fn check_kubeconfig_free(path: &std::path::Path) -> Result<(), String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let server = serde_saphyr::from_str::<kube::config::Kubeconfig>(&text)
        .ok()
        .and_then(|k| k.clusters.into_iter().next()?.cluster?.server);
    let Some(server) = server else {
        return Err(format!(
            "{} exists and is not a kubeconfig berth dev wrote; move it away or pass --kubeconfig OTHER",
            path.display()
        ));
    };
    let address = server
        .strip_prefix("https://")
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok());
    let live = address.is_some_and(|a| {
        std::net::TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok()
    });
    match live {
        true => Err(format!(
            "{} belongs to a cluster that is still running at {server} (another berth dev or berth sim?); stop it, or pass --kubeconfig OTHER",
            path.display()
        )),
        false => Ok(()),
    }
}

/// The kubeconfig this run wrote; removed when the run ends, however it ends, unless another
/// run has replaced it meanwhile.
struct OwnKubeconfig {
    path: PathBuf,
    text: String,
}

impl Drop for OwnKubeconfig {
    fn drop(&mut self) {
        if std::fs::read_to_string(&self.path).is_ok_and(|t| t == self.text) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes into the kubeconfig at `path` that its cluster's gateway is at `url` (the cluster
/// extension `berth.dev/gateway`, `{url: ...}`); the new text.
fn name_gateway(path: &std::path::Path, url: &str) -> Result<String, String> {
    let fail =
        |e: &dyn std::fmt::Display| format!("cannot name the gateway in {}: {e}", path.display());
    let mut kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| fail(&e))?;
    for cluster in kubeconfig
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        let extensions = cluster.extensions.get_or_insert_with(Vec::new);
        extensions.retain(|e| e.name != crate::workspaces::GATEWAY_EXTENSION);
        extensions.push(kube::config::NamedExtension {
            name: crate::workspaces::GATEWAY_EXTENSION.to_owned(),
            extension: serde_json::json!({"url": url}),
        });
    }
    let text = serde_saphyr::to_string(&kubeconfig).map_err(|e| fail(&e))?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, &text).map_err(|e| fail(&e))?;
    std::fs::rename(&partial, path).map_err(|e| fail(&e))?;
    Ok(text)
}

/// The table's columns.
const COLUMNS: [&str; 6] = [
    "NAMESPACE",
    "NAME",
    "PHASE",
    "READY",
    "RECREATIONS",
    "MESSAGE",
];

/// One row of the table: namespace, name, phase, ready, recreations, message.
fn row(ws: &Workspace) -> [String; 6] {
    let status = ws.status.clone().unwrap_or_default();
    let ready = berth_api::condition::find_condition(
        &status.conditions,
        berth_api::condition::ConditionType::Ready,
    )
    .map(|c| c.status.clone())
    .unwrap_or_default();
    [
        ws.namespace().unwrap_or_default(),
        ws.name_any(),
        status.phase.map(|p| p.to_string()).unwrap_or_default(),
        ready,
        status.pod_recreations.unwrap_or(0).to_string(),
        status.message.unwrap_or_default(),
    ]
}

/// The narrowest each column is, so plain lines (one per change) line up with their header;
/// a longer cell widens its column rather than being cut.
const MIN_WIDTHS: [usize; 6] = [10, 20, 11, 5, 11, 0];

/// The header and rows as aligned lines, every column as wide as its widest cell (the message
/// last, as it is).
fn render_table(rows: &[&[String; 6]]) -> String {
    let header = COLUMNS.map(str::to_owned);
    let mut widths = MIN_WIDTHS;
    for r in rows.iter().copied().chain([&header]) {
        for (width, cell) in widths.iter_mut().zip(r.iter()) {
            *width = (*width).max(cell.chars().count());
        }
    }
    std::iter::once(&header)
        .chain(rows.iter().copied())
        .map(|r| {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                match i + 1 == COLUMNS.len() {
                    true => line.push_str(cell),
                    false => line.push_str(&format!("{cell:<width$}  ", width = widths[i])),
                }
            }
            line.trim_end().to_owned() + "\n"
        })
        .collect()
}

/// Runs the dev environment until Ctrl-C, SIGTERM or `--for` runs out.
/// What `kubectl apply -k deploy/` installs, built in: the kustomization's resources in its
/// order (a test checks this list against `deploy/kustomization.yaml`).
pub const INSTALL: &[(&str, &str)] = &[
    (
        "crds/workspaces.berth.dev.yaml",
        include_str!("../../../deploy/crds/workspaces.berth.dev.yaml"),
    ),
    (
        "crds/workspacekinds.berth.dev.yaml",
        include_str!("../../../deploy/crds/workspacekinds.berth.dev.yaml"),
    ),
    ("rbac/berth-controller.yaml", rbac::OPERATOR),
    ("admission/workspaces-policy.yaml", rbac::ADMISSION_POLICY),
    (
        "operator/deployment.yaml",
        include_str!("../../../deploy/operator/deployment.yaml"),
    ),
    (
        "operator/service.yaml",
        include_str!("../../../deploy/operator/service.yaml"),
    ),
    (
        "operator/pdb.yaml",
        include_str!("../../../deploy/operator/pdb.yaml"),
    ),
];
const KUSTOMIZATION: &str = include_str!("../../../deploy/kustomization.yaml");

/// The operator's settings in `berth dev`, as `berth controller` flags (added to its
/// Deployment's arguments, or parsed for the in-process operator): failed agent
/// checks are retried sooner than in production, so a fix shows quickly, and the pinned
/// example may select its node.
const DEV_FLAGS: &[&str] = &[
    "--agent-backoff-base=2s",
    "--agent-backoff-max=20s",
    concat!("--allowed-node-labels=", "kubernetes.io/hostname"),
];

/// The node labels `berth dev` lets a workspace select nodes by (the pinned example), in the
/// operator's flags and in the admission policy's allow-lists alike.
const DEV_NODE_LABELS: &str = "kubernetes.io/hostname";

/// The install's manifests as kustomize renders them (its `images:` applied) with the dev
/// settings added to the operator's container.
fn install_manifests() -> Result<Vec<(&'static str, String)>, String> {
    let kustomization: serde_json::Value =
        serde_saphyr::from_str(KUSTOMIZATION).map_err(|e| format!("kustomization.yaml: {e}"))?;
    INSTALL
        .iter()
        .map(|(name, text)| {
            let documents: Vec<serde_json::Value> =
                serde_saphyr::from_multiple(text).map_err(|e| format!("{name}: {e}"))?;
            let rendered: Vec<serde_json::Value> = documents
                .into_iter()
                .filter(|d| !d.is_null())
                .map(|mut d| {
                    // The admission policy's allow-lists say what the operator's flags say.
                    if d["kind"] == "ConfigMap" && d["metadata"]["name"] == "berth-admission" {
                        d["data"]["allowed-node-labels"] = serde_json::json!(DEV_NODE_LABELS);
                    }
                    if d["kind"] == "Deployment" {
                        set_images(&mut d, &kustomization["images"]);
                        for container in d["spec"]["template"]["spec"]["containers"]
                            .as_array_mut()
                            .into_iter()
                            .flatten()
                        {
                            let extra = DEV_FLAGS.iter().map(|f| serde_json::json!(f));
                            match container["args"].as_array_mut() {
                                Some(args) => args.extend(extra),
                                None => container["args"] = extra.collect(),
                            }
                        }
                    }
                    d
                })
                .collect();
            let text = rendered
                .iter()
                .map(|d| serde_json::to_string(d).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()?
                .join("\n---\n");
            Ok((*name, text))
        })
        .collect()
}

/// The image of `examples/notebook.yaml`, which runs its own entrypoint (no command): here
/// Berth's editor stands in for the notebook server it would have, on its port.
fn notebook_image() -> Vec<crate::pod_process::ImageEntrypoint> {
    vec![crate::pod_process::ImageEntrypoint {
        image: "ghcr.io/example/notebook".to_owned(),
        entrypoint: [
            crate::pod_process::BINARY_IN_IMAGE,
            "serve",
            "--edit",
            "--listen",
            "{podIP}:8888",
            "/home/dev",
        ]
        .map(str::to_owned)
        .into(),
    }]
}

/// berth dev's gateway's base domain.
pub const DOMAIN: &str = "localhost";

/// The gateway (`berth gateway`), in this process, as its own service account with the RBAC
/// of `deploy/gateway/`: its address, and what stops it.
async fn gateway(
    cluster: &berth_sim::SimCluster,
    client: &kube::Client,
    port: u16,
) -> Result<(std::net::SocketAddr, impl FnOnce()), String> {
    berth_sim::manifests::create_all(client, berth_gateway::RBAC, "default")
        .await
        .map_err(|e| format!("cannot create deploy/gateway/rbac.yaml: {e}"))?;
    berth_sim::manifests::create_all(client, berth_gateway::DASHBOARD_RBAC, "default")
        .await
        .map_err(|e| format!("cannot create deploy/gateway-dashboard/rbac.yaml: {e}"))?;
    let token = cluster
        .issue_token(
            "berth-system",
            "berth-gateway",
            &[],
            Duration::from_secs(365 * 24 * 3600),
        )
        .map_err(|e| format!("cannot issue the gateway's token: {e}"))?;
    let gateway_client = cluster
        .client_with_token(&token)
        .await
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port} for the gateway: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let config = berth_gateway::Config {
        service_account: Some(("berth-system".to_owned(), "berth-gateway".to_owned())),
        // Browsers resolve every name under localhost to this machine: the dashboard at
        // localhost, each workspace's port at <port>--<workspace>--<namespace>.localhost, each
        // an origin of its own.
        base_domain: Some(DOMAIN.to_owned()),
        ..Default::default()
    };
    let gateway = berth_gateway::Gateway::start(gateway_client, config)
        .await
        .map_err(|e| format!("cannot start the gateway: {e}"))?;
    let serving = tokio::spawn(berth_gateway::serve(
        listener,
        gateway.clone(),
        std::future::pending(),
    ));
    let stop = move || {
        serving.abort();
        gateway.stop();
    };
    Ok((address, stop))
}

/// kustomize's `images:` transformer: a container image named `name` gets `newName`,
/// `newTag` or `digest`.
fn set_images(deployment: &mut serde_json::Value, images: &serde_json::Value) {
    for container in deployment["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let Some(current) = container["image"].as_str().map(str::to_owned) else {
            continue;
        };
        let name = current.split(['@', ':']).next().unwrap_or_default();
        for image in images.as_array().into_iter().flatten() {
            if image["name"] != name {
                continue;
            }
            let repository = image["newName"].as_str().unwrap_or(name);
            container["image"] =
                serde_json::json!(match (image["digest"].as_str(), image["newTag"].as_str()) {
                    (Some(digest), _) => format!("{repository}@{digest}"),
                    (None, Some(tag)) => format!("{repository}:{tag}"),
                    (None, None) => repository.to_owned(),
                });
        }
    }
}

/// The operator inside `berth dev`, as its own service account with the RBAC of deploy/rbac/
/// and the dev settings, for a machine where it cannot run as the install's pods.
async fn in_process_operator(
    cluster: &berth_sim::SimCluster,
    client: &Client,
) -> Result<tokio::task::JoinHandle<Result<(), berth_controller::Error>>, String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        berth_api::crd::workspace_crd(),
        berth_api::crd::workspace_kind_crd(),
    ] {
        crds.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| format!("cannot install the CRDs: {e}"))?;
    }
    berth_sim::manifests::create_all(client, rbac::OPERATOR, "default")
        .await
        .map_err(|e| format!("cannot create the RBAC of deploy/rbac: {e}"))?;
    let manifests = install_manifests()?;
    let policy = manifests
        .iter()
        .find(|(name, _)| *name == "admission/workspaces-policy.yaml")
        .map(|(_, text)| text.as_str())
        .unwrap_or_default();
    berth_sim::manifests::create_all(client, policy, "default")
        .await
        .map_err(|e| format!("cannot create the admission policy of deploy/admission: {e}"))?;
    // The same flags as the Deployment's, serving no metrics from inside `berth dev`.
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        controller: crate::controller::ControllerArgs,
    }
    let flags = [
        "controller",
        "--service-account=berth-system/berth-controller",
    ]
    .iter()
    .chain(DEV_FLAGS);
    let mut config = <Flags as clap::Parser>::try_parse_from(flags)
        .map_err(|e| e.to_string())?
        .controller
        .config()?;
    config.metrics_address = None;
    config.health_address = None;
    let account = &config.agent.service_account;
    let token = cluster
        .issue_token(
            &account.namespace,
            &account.name,
            &[],
            Duration::from_secs(30 * 24 * 3600),
        )
        .map_err(|e| format!("cannot issue the operator's token: {e}"))?;
    let operator_client = cluster
        .client_with_token(&token)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tokio::spawn(async move {
        berth_controller::run(operator_client, config).await
    }))
}

pub async fn run(args: DevArgs) -> Result<(), String> {
    let manifests = examples(args.examples.as_ref())?;
    check_kubeconfig_free(&args.kubeconfig)?;
    // Registered before anything is written, so SIGTERM at any point stops cleanly (and the
    // kubeconfig goes), with `--for` too.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    // The operator runs as the install's Deployment (pods whose containers are real
    // `berth controller` processes), where this machine lets those processes have the
    // pod's files at the in-cluster paths; elsewhere inside this process, with the same RBAC.
    // Claims and pods' folders: they live as long as `berth dev`.
    let data = tempfile::Builder::new()
        .prefix("berth-dev-")
        .tempdir()
        .map_err(|e| format!("cannot make a folder for the cluster's volumes: {e}"))?;
    let processes = berth_sim::ProcessRuntime::new(data.path());
    let isolation = processes.check_isolation().await;
    let runtime: std::sync::Arc<dyn berth_sim::ContainerRuntime> = match &isolation {
        Ok(()) => std::sync::Arc::new(crate::pod_process::PodProcessRuntime::new(
            std::env::current_exe().map_err(|e| format!("cannot find its own binary: {e}"))?,
            Ok(processes),
            true,
            &notebook_image(),
        )),
        // Claims are plain folders: agents still clone content into them.
        Err(_) => std::sync::Arc::new(berth_agent::sim_runtime::AgentRuntime::with_claims(
            data.path().join("claims"),
        )),
    };
    let cluster = berth_sim::SimCluster::start(berth_sim::SimConfig {
        nodes: berth_sim::NodeConfig::several(args.nodes),
        runtime,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    cluster
        .write_kubeconfig(&args.kubeconfig)
        .map_err(|e| format!("cannot write {}: {e}", args.kubeconfig.display()))?;
    let mut own_kubeconfig = OwnKubeconfig {
        path: args.kubeconfig.clone(),
        text: std::fs::read_to_string(&args.kubeconfig).unwrap_or_default(),
    };
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let (operator, how) = match isolation {
        Ok(()) => {
            for (name, text) in install_manifests()? {
                berth_sim::manifests::create_all(&client, &text, "default")
                    .await
                    .map_err(|e| format!("cannot install deploy/{name}: {e}"))?;
            }
            (
                None,
                "installed from deploy/ (kubectl -n berth-system get deploy,pods)".to_owned(),
            )
        }
        Err(why) => (
            Some(in_process_operator(&cluster, &client).await?),
            format!("running inside berth dev ({why})"),
        ),
    };
    // Per-owner workspaces (deploy/admission-owners/): examples/workspace-author.yaml's
    // authors cannot change each other's.
    berth_sim::manifests::create_all(&client, rbac::OWNERS_POLICY, "default")
        .await
        .map_err(|e| format!("cannot create deploy/admission-owners/owners-policy.yaml: {e}"))?;
    // The `default` service account may delegate auth for its agents.
    berth_sim::manifests::create_all(&client, rbac::WORKSPACE_SERVICE_ACCOUNT, "default")
        .await
        .map_err(|e| format!("cannot create deploy/rbac/workspace-service-account.yaml: {e}"))?;

    let (gateway, stop_gateway) = gateway(&cluster, &client, args.gateway_port).await?;
    // The CLI finds the gateway in the kubeconfig: `berth open web` needs no --gateway.
    own_kubeconfig.text = name_gateway(&args.kubeconfig, &format!("http://{gateway}"))?;

    // The content examples clone from a git server of berth dev's own.
    let (_git_daemon, git_url, git_hint) = match content_server(data.path()) {
        Ok((daemon, url)) => {
            let hint = format!("berth dev: the content examples clone {url}hello.git (git daemon)");
            (Some(daemon), url, hint)
        }
        Err(why) => (
            None,
            DEV_GIT_HOST.to_owned(),
            format!("berth dev: the content examples cannot clone: {why}"),
        ),
    };
    let manifests: Vec<(String, String)> = manifests
        .into_iter()
        .map(|(name, text)| (name, text.replace(DEV_GIT_HOST, &git_url)))
        .collect();
    let applied = apply_examples(&client, &manifests).await?;
    let interactive = std::io::stdout().is_terminal();
    let kubeconfig = args.kubeconfig.display();
    let hints = [
        format!(
            "berth dev: a simulated cluster at {} with the Berth operator {how}",
            cluster.url()
        ),
        format!("berth dev: applied {}", applied.join(", ")),
        git_hint,
        format!("berth dev: in another terminal:  kubectl --kubeconfig {kubeconfig} get ws -o wide"),
        format!(
            "berth dev: the gateway into workspaces:  curl -H \"Authorization: Bearer $(kubectl --kubeconfig {kubeconfig} config view --raw -o jsonpath='{{.users[0].user.token}}')\" http://{gateway}/w/default/web/http/   (web serves its home: write index.html first, as README shows)"
        ),
        format!(
            "berth dev: a login link for your browser:  berth open web --kubeconfig {kubeconfig}   (the kubeconfig names the gateway, http://{gateway})"
        ),
        format!(
            "berth dev: your workspaces and a spawner in your browser:  berth dashboard --kubeconfig {kubeconfig}   (at http://{DOMAIN}:{})",
            gateway.port()
        ),
        format!(
            "berth dev: a shell in web's container:  berth shell web --kubeconfig {kubeconfig}"
        ),
        format!(
            "berth dev: SSH for your editor:  berth ssh-config web --kubeconfig {kubeconfig} >> ~/.ssh/config; ssh berth--web"
        ),
        format!(
            "berth dev: make node-1 reject its next pod:  kubectl --kubeconfig {kubeconfig} annotate node node-1 sim.berth.dev/reject-next=1:OutOfcpu"
        ),
        format!(
            "berth dev: let no-delegator's agent authenticate:  kubectl --kubeconfig {kubeconfig} create clusterrolebinding berth-agent-default-no-delegator --clusterrole=system:auth-delegator --serviceaccount=default:no-delegator"
        ),
        format!(
            "berth dev: {}",
            if args.duration.is_some() {
                "stops by itself (--for)"
            } else {
                "Ctrl-C stops everything"
            }
        ),
    ]
    .join("\n");
    println!("{hints}");
    if !interactive {
        // Plain lines: the header once, then a line per change.
        print!("{}", render_table(&[]));
    }

    let workspaces: Api<Workspace> = Api::all(client.clone());
    let (reader, writer) = reflector::store::<Workspace>();
    let mut changes = Box::pin(
        reflector(writer, watcher(workspaces, watcher::Config::default())).applied_objects(),
    );
    let mut rows: BTreeMap<(String, String), [String; 6]> = BTreeMap::new();
    let stop = async {
        let ran_out = async {
            match args.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = ran_out => {}
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            change = changes.next() => {
                let Some(Ok(ws)) = change else { continue };
                let line = row(&ws);
                let key = (line[0].clone(), line[1].clone());
                // Until the operator has written a status there is nothing to say.
                if line[2].is_empty() || rows.get(&key) == Some(&line) {
                    continue;
                }
                rows.insert(key, line.clone());
                if interactive {
                    // Redraw in place, the hints kept above the table.
                    let all: BTreeMap<(String, String), [String; 6]> = reader
                        .state()
                        .iter()
                        .map(|w| {
                            let r = row(w);
                            ((r[0].clone(), r[1].clone()), r)
                        })
                        .collect();
                    let all: Vec<&[String; 6]> = all.values().collect();
                    print!("\x1b[2J\x1b[H{hints}\n\n{}", render_table(&all));
                } else {
                    let table = render_table(&[&line]);
                    print!("{}", table.lines().nth(1).map(|l| format!("{l}\n")).unwrap_or_default());
                }
                let _ = std::io::stdout().flush();
            }
        }
    }
    if let Some(operator) = operator {
        operator.abort();
    }
    // The gateway goes before the API server it watches (it would say it lost it).
    stop_gateway();
    cluster.shutdown();
    drop(_git_daemon);
    remove_data(data).await;
    println!("berth dev: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_examples_are_the_folders() {
        let folder = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"));
        let on_disk: Vec<(String, String)> = examples(Some(&folder))
            .unwrap()
            .into_iter()
            .map(|(path, text)| {
                let name = PathBuf::from(path)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                (name, text)
            })
            .collect();
        let built_in: Vec<(String, String)> = examples(None).unwrap();
        assert_eq!(
            built_in, on_disk,
            "list every file of examples/ in EXAMPLES"
        );
    }

    #[test]
    fn the_built_in_install_is_the_kustomizations_resources() {
        let kustomization: serde_json::Value = serde_saphyr::from_str(KUSTOMIZATION).unwrap();
        let resources: Vec<&str> = kustomization["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let built_in: Vec<&str> = INSTALL.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            built_in, resources,
            "list deploy/kustomization.yaml's resources in INSTALL"
        );
        let rendered = install_manifests().unwrap();
        let deployment = &rendered
            .iter()
            .find(|(name, _)| *name == "operator/deployment.yaml")
            .unwrap()
            .1;
        let deployment: serde_json::Value = serde_json::from_str(deployment).unwrap();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let tag = kustomization["images"][0]["newTag"].as_str().unwrap();
        assert_eq!(container["image"], format!("ghcr.io/berth-dev/berth:{tag}"));
        let args = container["args"].to_string();
        assert!(
            args.contains("--allowed-node-labels=kubernetes.io/hostname"),
            "{args}"
        );
    }

    #[test]
    fn images_are_set_as_kustomize_sets_them() {
        let mut deployment = serde_json::json!({"spec": {"template": {"spec": {"containers": [
            {"image": "ghcr.io/berth-dev/berth"}, {"image": "busybox:1.36"}]}}}});
        let images = serde_json::json!([{"name": "ghcr.io/berth-dev/berth", "newName": "registry.local/berth", "newTag": "1.2.3"}]);
        set_images(&mut deployment, &images);
        let containers = &deployment["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["image"], "registry.local/berth:1.2.3");
        assert_eq!(containers[1]["image"], "busybox:1.36");
        let pinned = serde_json::json!([{"name": "busybox", "digest": "sha256:abc"}]);
        set_images(&mut deployment, &pinned);
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][1]["image"],
            "busybox@sha256:abc"
        );
    }

    #[test]
    fn long_names_widen_their_column() {
        let long = "a-workspace-name-longer-than-twenty".to_owned();
        let row = [
            "default".to_owned(),
            long.clone(),
            "Running".into(),
            "True".into(),
            "0".into(),
            "Workspace is running".into(),
        ];
        let table = render_table(&[&row]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0].find("PHASE"), lines[1].find("Running"), "{table}");
        assert!(lines[1].contains(&long));
    }
}
