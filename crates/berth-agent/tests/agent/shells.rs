//! `Shell`: a command run by the agent for a caller with `shell` on `workspaces/agent` (the
//! gateway), its output by stream and its exit code last; on a terminal of the caller's size
//! that follows resizes; hung up when the caller leaves; counted as activity while open.

use std::time::{Duration, Instant};

use berth_agent::{
    auth::Limits,
    client::{CallError, get_activity, shell},
    proto::{
        ShellInput, ShellOutput, ShellStart, TerminalSize, shell_input::Input, shell_output::Output,
    },
    shell::{BESIDE_ENTRYPOINT, Shells},
};
use tokio::sync::mpsc;
use tonic::Code;

use super::{AUDIENCE, Setup};

const HOUR: Duration = Duration::from_secs(3600);
const WAIT: Duration = Duration::from_secs(10);

fn start(command: &[&str], tty: bool) -> ShellInput {
    ShellInput {
        input: Some(Input::Start(ShellStart {
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            tty,
            size: Some(TerminalSize {
                columns: 100,
                rows: 30,
            }),
            on_behalf_of: "alice".to_owned(),
            term: String::new(),
        })),
    }
}

fn input(input: Input) -> ShellInput {
    ShellInput { input: Some(input) }
}

/// Opens a shell on `agent` as `account` with `first` sent; the sender of further inputs and
/// the outputs, or the refusal.
async fn open(
    s: &Setup,
    agent: &str,
    account: &str,
    first: ShellInput,
) -> Result<(mpsc::Sender<ShellInput>, tonic::Streaming<ShellOutput>), CallError> {
    let (inputs, queued) = mpsc::channel(16);
    inputs.send(first).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(queued);
    let token = s.token(account, AUDIENCE, HOUR);
    let outputs = shell(agent, &token, WAIT, None, stream).await?;
    Ok((inputs, outputs))
}

/// Everything the shell says until its exit: (stdout, stderr, exit code).
async fn until_exit(outputs: &mut tonic::Streaming<ShellOutput>) -> (String, String, i32) {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let next = tokio::time::timeout(WAIT, outputs.message()).await;
        match next.expect("the shell ends").unwrap().unwrap().output {
            Some(Output::Stdout(bytes)) => stdout.extend(bytes),
            Some(Output::Stderr(bytes)) => stderr.extend(bytes),
            Some(Output::ExitCode(code)) => {
                let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                return (text(stdout), text(stderr), code);
            }
            None => {}
        }
    }
}

/// Reads stdout until it has shown `wanted`; all of it so far.
async fn until_shown(outputs: &mut tonic::Streaming<ShellOutput>, wanted: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(wanted) {
        let next = tokio::time::timeout(WAIT, outputs.message()).await;
        let Ok(Ok(Some(output))) = next else {
            panic!("{wanted:?} never came; the shell said {seen:?}");
        };
        if let Some(Output::Stdout(bytes)) = output.output {
            seen.push_str(&String::from_utf8_lossy(&bytes));
        }
    }
    seen
}

#[tokio::test]
async fn a_shell_runs_for_its_verbs_holder_with_its_streams_apart_and_its_exit_code_last() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let script = "echo out; echo err >&2; read line; echo got $line; exit 3";

    // The operator's `use` opens no shell.
    let refused = open(&s, &agent, "caller", start(&["sh", "-c", script], false)).await;
    let Err(CallError::Refused(status)) = refused else {
        panic!("a caller with only `use` was let in");
    };
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "User \"system:serviceaccount:default:caller\" cannot shell workspaces/agent \"w\" in API group \"berth.dev\" in the namespace \"default\""
    );

    let (inputs, mut outputs) = open(&s, &agent, "gateway", start(&["sh", "-c", script], false))
        .await
        .unwrap();
    // Open, it is the workspace's latest activity, for the person it was opened for.
    let seen = get_activity(&agent, &s.token("caller", AUDIENCE, HOUR), WAIT, None)
        .await
        .unwrap();
    assert_eq!(
        (seen.signal.as_str(), seen.detail.as_str()),
        ("Shell", "a shell for alice")
    );
    inputs
        .send(input(Input::Stdin(b"hello\n".to_vec())))
        .await
        .unwrap();
    inputs.send(input(Input::CloseStdin(true))).await.unwrap();
    assert_eq!(
        until_exit(&mut outputs).await,
        ("out\ngot hello\n".to_owned(), "err\n".to_owned(), 3)
    );
}

#[tokio::test]
async fn a_terminal_has_the_callers_size_follows_resizes_and_takes_end_of_input() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let script = "tty; echo TERM=$TERM; stty size; read x; stty size; cat; echo after-cat";
    let (inputs, mut outputs) = open(&s, &agent, "gateway", start(&["sh", "-c", script], true))
        .await
        .unwrap();
    let seen = until_shown(&mut outputs, "30 100").await;
    assert!(seen.contains("/dev/pts/"), "not a terminal: {seen:?}");
    assert!(seen.contains("TERM=xterm-256color"), "{seen:?}");
    inputs
        .send(input(Input::Resize(TerminalSize {
            columns: 132,
            rows: 50,
        })))
        .await
        .unwrap();
    inputs
        .send(input(Input::Stdin(b"\n".to_vec())))
        .await
        .unwrap();
    until_shown(&mut outputs, "50 132").await;
    // End of input on a terminal is ^D: `cat` ends, and the script after it.
    inputs.send(input(Input::CloseStdin(true))).await.unwrap();
    let (stdout, stderr, code) = until_exit(&mut outputs).await;
    assert!(stdout.contains("after-cat"), "{stdout:?}");
    assert_eq!(
        (stderr.as_str(), code),
        ("", 0),
        "a terminal has one stream"
    );
}

#[tokio::test]
async fn a_caller_who_leaves_hangs_the_command_up() {
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    for tty in [false, true] {
        let command = ["sh", "-c", "echo pid=$$; exec sleep 300"];
        let (inputs, mut outputs) = open(&s, &agent, "gateway", start(&command, tty))
            .await
            .unwrap();
        let seen = until_shown(&mut outputs, "\n").await;
        let pid: i32 = seen
            .trim()
            .strip_prefix("pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {seen:?}"));
        let proc = format!("/proc/{pid}");
        assert!(std::path::Path::new(&proc).exists());
        drop((inputs, outputs));
        let asked = Instant::now();
        while std::path::Path::new(&proc).exists() {
            assert!(
                asked.elapsed() < WAIT,
                "the command (tty: {tty}) outlived its caller"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the agent starts begins in the home with every signal at its default, whatever the
/// agent inherited: an agent started under `nohup` ignores SIGHUP, and a shell it started so
/// could not be hung up.
#[tokio::test]
async fn a_command_starts_in_the_home_with_default_signals_whatever_the_agent_inherited() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: ignoring SIGHUP in this test process, as nohup does; no handler is replaced.
    unsafe { signal(Signal::SIGHUP, SigHandler::SigIgn) }.unwrap();
    let s = Setup::new().await;
    let agent = s.agent("ws").await;
    let script = "grep -E '^Sig(Ign|Blk):' /proc/self/status; pwd";
    let (_inputs, mut outputs) = open(&s, &agent, "gateway", start(&["sh", "-c", script], false))
        .await
        .unwrap();
    let (stdout, _, code) = until_exit(&mut outputs).await;
    assert_eq!(code, 0);
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(standard_signals(&lines[0]), ("SigBlk:", 0), "{stdout}");
    assert_eq!(standard_signals(&lines[1]), ("SigIgn:", 0), "{stdout}");
    if let Some(home) = std::env::var_os("HOME").filter(|h| std::path::Path::new(h).is_dir()) {
        let home = std::fs::canonicalize(home).unwrap();
        assert_eq!(lines[2], [home.to_str().unwrap()], "{stdout}");
    }
}

#[tokio::test]
async fn an_agent_beside_an_entrypoint_says_why_it_opens_no_shell_and_a_bad_command_is_named() {
    let s = Setup::new().await;
    let beside = Shells::Unavailable(BESIDE_ENTRYPOINT.to_owned());
    let (agent, _) = s
        .start_agent_with("ws", None, Limits::default(), beside)
        .await;
    let Err(CallError::Refused(status)) =
        open(&s, &agent, "gateway", start(&["true"], false)).await
    else {
        panic!("an agent beside an entrypoint opened a shell");
    };
    assert_eq!(
        (status.code(), status.message()),
        (Code::FailedPrecondition, BESIDE_ENTRYPOINT)
    );

    let agent = s.agent("ws").await;
    let Err(CallError::Refused(status)) =
        open(&s, &agent, "gateway", start(&["/no/such/program"], false)).await
    else {
        panic!("a missing program ran");
    };
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status
            .message()
            .starts_with("cannot start [\"/no/such/program\"] in the workspace container: No such file or directory"),
        "{}",
        status.message()
    );

    // The first input must be the start.
    let Err(CallError::Refused(status)) =
        open(&s, &agent, "gateway", input(Input::Stdin(b"ls\n".to_vec()))).await
    else {
        panic!("a shell without a start ran");
    };
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "a shell's first input must be its start"
        )
    );
}

/// A `Sig...:` line of /proc/PID/status: its name and the standard signals (1 to 31) in its
/// mask (the C library keeps the real-time signals below SIGRTMIN for itself).
fn standard_signals<'a>(line: &[&'a str]) -> (&'a str, u64) {
    let mask = u64::from_str_radix(line[1], 16).unwrap();
    (line[0], mask & 0x7fff_ffff)
}
