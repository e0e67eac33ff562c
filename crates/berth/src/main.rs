//! `berth`: the one binary. Each subcommand is one of Berth's jobs: the operator, the in-pod
//! agent, the simulated cluster, the CRD printer, and the no-cluster dev environment.

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
    /// table of workspaces; use kubectl with ./berth-dev.kubeconfig in another terminal.
    Dev,
    /// Run the operator against the current kubeconfig or the in-cluster config.
    Controller,
    /// Run the in-pod agent (gRPC on :50051), supervising `-- CMD ARGS...` if given.
    Agent {
        /// The workspace's command, run and supervised by the agent.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Print the Workspace CustomResourceDefinition as YAML (what `deploy/crds/` holds).
    Crd,
    /// Run only the simulated Kubernetes cluster and write a kubeconfig for it.
    Sim,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match berth_api::crd::workspace_crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("berth crd: {err}");
                ExitCode::FAILURE
            }
        },
        Command::Dev => not_built_yet("dev"),
        Command::Controller => not_built_yet("controller"),
        Command::Agent { .. } => not_built_yet("agent"),
        Command::Sim => not_built_yet("sim"),
    }
}

fn not_built_yet(subcommand: &str) -> ExitCode {
    eprintln!("berth {subcommand}: not built yet (see the open issues)");
    ExitCode::from(2)
}
