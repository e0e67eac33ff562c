//! The `berth` binary as a person runs it.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

#[test]
fn crd_prints_the_committed_crd() {
    let output = Command::new(BERTH).arg("crd").output().unwrap();
    assert!(output.status.success());
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/crds/workspaces.berth.dev.yaml"
    ))
    .unwrap();
    assert_eq!(String::from_utf8(output.stdout).unwrap(), committed);
}

#[test]
fn unbuilt_subcommands_say_so_and_fail() {
    for subcommand in ["dev", "controller", "agent"] {
        let output = Command::new(BERTH).arg(subcommand).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{subcommand}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            stderr.trim(),
            format!("berth {subcommand}: not built yet (see the open issues)")
        );
    }
}

#[test]
fn help_explains_each_subcommand() {
    let output = Command::new(BERTH).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for subcommand in ["dev", "controller", "agent", "crd", "sim"] {
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
    if !present && std::env::var("BERTH_REQUIRE_KUBECTL").as_deref() == Ok("1") {
        panic!("kubectl is required (BERTH_REQUIRE_KUBECTL=1) but not found on PATH");
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
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
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
