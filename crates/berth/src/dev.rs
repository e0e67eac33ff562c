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
use berth_controller::{Config, config::AgentConfig, rbac};
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
    /// Stop after this long (e.g. 30s) instead of waiting for Ctrl-C.
    #[arg(long = "for", value_parser = |s: &str| berth_api::parse_duration(s).map_err(|e| e.to_string()))]
    pub duration: Option<Duration>,
    /// Where the kubeconfig for kubectl is written.
    #[arg(long, default_value = "berth-dev.kubeconfig")]
    pub kubeconfig: PathBuf,
    /// The folder of example manifests applied at start.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"))]
    pub examples: PathBuf,
    /// How many simulated nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
}

/// Creates every object of every manifest in `folder`, in file order.
async fn apply_examples(client: &Client, folder: &PathBuf) -> Result<Vec<String>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .map_err(|e| format!("cannot read {}: {e}", folder.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut applied = vec![];
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let created = berth_sim::manifests::create_all(client, &text, "default")
            .await
            .map_err(|e| format!("{}: {e}", file.display()))?;
        applied.extend(created);
    }
    Ok(applied)
}

/// One row of the table: name, phase, ready, recreations, message.
fn row(ws: &Workspace) -> [String; 5] {
    let status = ws.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
        .unwrap_or_default();
    [
        ws.name_any(),
        status.phase.map(|p| p.to_string()).unwrap_or_default(),
        ready,
        status.pod_recreations.unwrap_or(0).to_string(),
        status.message.unwrap_or_default(),
    ]
}

fn render_table(rows: &BTreeMap<String, [String; 5]>) -> String {
    let mut text = format!(
        "{:<20} {:<12} {:<7} {:<12} {}\n",
        "NAME", "PHASE", "READY", "RECREATIONS", "MESSAGE"
    );
    for r in rows.values() {
        text.push_str(&format!(
            "{:<20} {:<12} {:<7} {:<12} {}\n",
            r[0], r[1], r[2], r[3], r[4]
        ));
    }
    text
}

/// Runs the dev environment until Ctrl-C, SIGTERM or `--for` runs out.
pub async fn run(args: DevArgs) -> Result<(), String> {
    let cluster = berth_sim::SimCluster::start(berth_sim::SimConfig {
        nodes: berth_sim::NodeConfig::several(args.nodes),
        runtime: std::sync::Arc::new(berth_agent::sim_runtime::AgentRuntime),
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    cluster
        .write_kubeconfig(&args.kubeconfig)
        .map_err(|e| format!("cannot write {}: {e}", args.kubeconfig.display()))?;
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &berth_api::crd::workspace_crd())
        .await
        .map_err(|e| format!("cannot install the CRD: {e}"))?;

    // The operator runs as its own service account with the RBAC of deploy/rbac/, as the
    // chart installs it; the `default` service account may delegate auth for its agents.
    for manifest in [rbac::OPERATOR, rbac::WORKSPACE_SERVICE_ACCOUNT] {
        berth_sim::manifests::create_all(&client, manifest, "default")
            .await
            .map_err(|e| format!("cannot create the RBAC of deploy/rbac: {e}"))?;
    }
    let config = Config {
        metrics_address: None,
        health_address: None,
        // As `berth controller --allowed-node-labels kubernetes.io/hostname`: the pinned
        // example selects its node; nothing else beyond the containers is allowed.
        policy: berth_controller::Policy {
            pod: berth_controller::pod_policy::PodPolicy {
                node_labels: vec!["kubernetes.io/hostname".to_owned()],
                ..Default::default()
            },
            ..Default::default()
        },
        agent: AgentConfig {
            // Retry failed agent checks sooner than in production, so a fix shows quickly.
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(20),
            ..AgentConfig::default()
        },
        ..Config::default()
    };
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
    let operator =
        tokio::spawn(async move { berth_controller::run(operator_client, config).await });

    let applied = apply_examples(&client, &args.examples).await?;
    let interactive = std::io::stdout().is_terminal();
    println!(
        "berth dev: a simulated cluster at {} with the Berth operator",
        cluster.url()
    );
    println!("berth dev: applied {}", applied.join(", "));
    println!(
        "berth dev: in another terminal:  kubectl --kubeconfig {} get ws -o wide",
        args.kubeconfig.display()
    );
    println!(
        "berth dev: make node-1 reject its next pod:  kubectl --kubeconfig {} annotate node node-1 sim.berth.dev/reject-next=1:OutOfcpu",
        args.kubeconfig.display()
    );
    println!(
        "berth dev: let no-delegator's agent authenticate:  kubectl --kubeconfig {} create clusterrolebinding berth-agent-default-no-delegator --clusterrole=system:auth-delegator --serviceaccount=default:no-delegator",
        args.kubeconfig.display()
    );
    println!(
        "berth dev: {}",
        if args.duration.is_some() {
            "stops by itself (--for)"
        } else {
            "Ctrl-C stops everything"
        }
    );

    let workspaces: Api<Workspace> = Api::all(client.clone());
    let (reader, writer) = reflector::store::<Workspace>();
    let mut changes = Box::pin(
        reflector(writer, watcher(workspaces, watcher::Config::default())).applied_objects(),
    );
    let mut rows: BTreeMap<String, [String; 5]> = BTreeMap::new();
    let stop = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => crate::wait_for_shutdown_signal().await,
        }
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            change = changes.next() => {
                let Some(Ok(ws)) = change else { continue };
                let line = row(&ws);
                // Until the operator has written a status there is nothing to say.
                if line[1].is_empty() || rows.get(&line[0]) == Some(&line) {
                    continue;
                }
                rows.insert(line[0].clone(), line.clone());
                if interactive {
                    // Redraw the table in place.
                    let all: BTreeMap<String, [String; 5]> = reader.state().iter().map(|w| { let r = row(w); (r[0].clone(), r) }).collect();
                    print!("\x1b[2J\x1b[H{}", render_table(&all));
                } else {
                    println!("{:<20} {:<12} {:<7} {:<3} {}", line[0], line[1], line[2], line[3], line[4]);
                }
                let _ = std::io::stdout().flush();
            }
        }
    }
    operator.abort();
    cluster.shutdown();
    let _ = std::fs::remove_file(&args.kubeconfig);
    println!("berth dev: stopped");
    Ok(())
}
