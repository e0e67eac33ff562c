//! The developer's subcommands (`berth ls`, `start`, `stop`), also `kubectl berth ...` when
//! the binary is installed as `kubectl-berth`: they act with the user's own kubeconfig and
//! credentials, so they can do exactly what the user's RBAC allows.

use std::time::{Duration, Instant};

use berth_api::{Phase, Workspace};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

/// Which cluster, context and namespace: as kubectl takes them.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// The kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace (default: the context's, else `default`).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
}

/// Options of `berth ls`.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Workspaces of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// Options of `berth start` and `berth stop`.
#[derive(clap::Args, Debug)]
pub struct SwitchArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace.
    pub name: String,
    /// Return at once instead of waiting for the workspace to be Running (start) or
    /// Stopped (stop).
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait.
    #[arg(long, default_value = "5m", value_parser = crate::controller::duration)]
    pub timeout: Duration,
}

/// A client and the namespace to use, as kubectl would pick them.
async fn connect(target: &Target) -> Result<(Client, String), String> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..Default::default()
    };
    let config = match &target.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot load the kubeconfig: {e}"))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| e.to_string())
        }
        None if target.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| e.to_string()),
        None => kube::Config::infer().await.map_err(|e| e.to_string()),
    }
    .map_err(|e| format!("cannot load the kubeconfig: {e}"))?;
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| format!("cannot build a client: {e}"))?;
    Ok((client, namespace))
}

/// One row of `berth ls`.
fn row(ws: &Workspace) -> [String; 4] {
    let status = ws.status.clone().unwrap_or_default();
    [
        ws.namespace().unwrap_or_default(),
        ws.name_any(),
        status.phase.unwrap_or_default().to_string(),
        status.message.unwrap_or_default(),
    ]
}

/// The rows as a table whose columns are as wide as their widest cell.
pub fn table(header: [&str; 4], rows: &[[String; 4]], namespaces: bool) -> String {
    let skip = usize::from(!namespaces);
    let mut width = [0usize; 4];
    for cells in std::iter::once(header.map(str::to_owned)).chain(rows.iter().cloned()) {
        for (w, c) in width.iter_mut().zip(cells.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String; 4]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate().skip(skip) {
            if i == 3 {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<w$}   ", w = width[i]));
            }
        }
        text.trim_end().to_owned()
    };
    let mut out = line(&header.map(str::to_owned));
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out.push('\n');
    out
}

/// `berth ls`: the workspaces the user may list, with phase and message.
pub async fn ls(args: LsArgs) -> Result<(), String> {
    let (client, namespace) = connect(&args.target).await?;
    let api: Api<Workspace> = match args.all_namespaces {
        true => Api::all(client),
        false => Api::namespaced(client, &namespace),
    };
    let mut list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list workspaces: {}", api_words(&e)))?
        .items;
    list.sort_by_key(|ws| (ws.namespace(), ws.name_any()));
    if list.is_empty() {
        match args.all_namespaces {
            true => println!("No workspaces."),
            false => println!("No workspaces in namespace {namespace}."),
        }
        return Ok(());
    }
    let rows: Vec<[String; 4]> = list.iter().map(row).collect();
    print!(
        "{}",
        table(
            ["NAMESPACE", "NAME", "PHASE", "MESSAGE"],
            &rows,
            args.all_namespaces
        )
    );
    Ok(())
}

/// `berth start` (`paused: false`) and `berth stop` (`paused: true`): the spec change, then,
/// unless `--no-wait`, each phase and message until the workspace gets there.
pub async fn switch(args: SwitchArgs, start: bool) -> Result<(), String> {
    let (client, namespace) = connect(&args.target).await?;
    let api: Api<Workspace> = Api::namespaced(client, &namespace);
    let verb = if start { "start" } else { "stop" };
    api.patch(
        &args.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"paused": !start}})),
    )
    .await
    .map_err(|e| format!("cannot {verb} workspace {}: {}", args.name, api_words(&e)))?;
    let goal = if start {
        Phase::Running
    } else {
        Phase::Stopped
    };
    if args.no_wait {
        println!("workspace {}/{}: asked to {verb}", namespace, args.name);
        return Ok(());
    }
    let deadline = Instant::now() + args.timeout;
    let mut said = String::new();
    loop {
        let ws = api
            .get(&args.name)
            .await
            .map_err(|e| format!("cannot read workspace {}: {}", args.name, api_words(&e)))?;
        let status = ws.status.clone().unwrap_or_default();
        let current = status.observed_generation >= ws.metadata.generation;
        let phase = status.phase.unwrap_or_default();
        let line = format!(
            "workspace {}/{}: {phase}{}",
            namespace,
            args.name,
            status
                .message
                .as_deref()
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
        if line != said {
            println!("{line}");
            said = line;
        }
        if current && phase == goal {
            return Ok(());
        }
        if current && phase == Phase::Failed {
            return Err(format!("workspace {} failed", args.name));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "workspace {} is not {goal} after {}",
                args.name,
                berth_controller::state::human(args.timeout)
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The API server's own words for a refusal.
fn api_words(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_aligns_its_columns_and_shows_the_namespace_only_when_asked() {
        let rows = [
            [
                "team-a".into(),
                "web".into(),
                "Running".into(),
                "Workspace is running".into(),
            ],
            [
                "team-b".into(),
                "a-long-name".into(),
                "Error".into(),
                "secret \"x\" not found".into(),
            ],
        ];
        assert_eq!(
            table(["NAMESPACE", "NAME", "PHASE", "MESSAGE"], &rows, false),
            "NAME          PHASE     MESSAGE\nweb           Running   Workspace is running\na-long-name   Error     secret \"x\" not found\n"
        );
        assert!(
            table(["NAMESPACE", "NAME", "PHASE", "MESSAGE"], &rows, true)
                .starts_with("NAMESPACE   NAME")
        );
    }
}
