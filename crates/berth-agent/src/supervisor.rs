//! `berth agent -- CMD ARGS...`: the agent supervises the workspace's command. It starts it as
//! a child, forwards SIGTERM and SIGINT to it, reaps every process orphaned below it (it is a
//! child subreaper, and PID 1 in a pod), and exits with the child's code.

use std::process::Command;

use nix::{
    errno::Errno,
    sys::{
        signal::{Signal, kill},
        wait::{WaitStatus, waitpid},
    },
    unistd::Pid,
};

/// Why the command could not be supervised.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error("no command to run")]
    Empty,
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// The exit code a shell would report for `status`.
fn code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}

/// Runs `command`, forwarding signals and reaping orphans, and returns its exit code;
/// `started` is told the command's process ID.
pub async fn supervise(
    command: &[String],
    started: impl FnOnce(i32),
) -> Result<i32, SuperviseError> {
    let (program, args) = command.split_first().ok_or(SuperviseError::Empty)?;
    // Orphans below us are re-parented to us, so we can reap them (as PID 1 would).
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let child =
        Command::new(program)
            .args(args)
            .spawn()
            .map_err(|source| SuperviseError::Spawn {
                command: command.join(" "),
                source,
            })?;
    let pid = Pid::from_raw(child.id() as i32);
    started(pid.as_raw());

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(SuperviseError::Signals)?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(SuperviseError::Signals)?;
    // waitpid(-1) blocks, so it runs on its own thread; it reaps orphans until the child exits.
    let mut reaper = tokio::task::spawn_blocking(move || {
        loop {
            match waitpid(Pid::from_raw(-1), None) {
                Ok(status) if status.pid() == Some(pid) => {
                    if let Some(code) = code(status) {
                        return code;
                    }
                }
                Ok(_) => {} // an orphaned grandchild, reaped
                Err(Errno::EINTR) => {}
                Err(_) => return 1,
            }
        }
    });
    loop {
        tokio::select! {
            code = &mut reaper => return Ok(code.unwrap_or(1)),
            _ = term.recv() => { let _ = kill(pid, Signal::SIGTERM); }
            _ = interrupt.recv() => { let _ = kill(pid, Signal::SIGINT); }
        }
    }
}
