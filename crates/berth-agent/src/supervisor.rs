//! `berth agent -- CMD ARGS...`: the agent supervises the workspace's command. It starts it as
//! a child, forwards SIGTERM and SIGINT to it, reaps every process orphaned below it (it is a
//! child subreaper, and PID 1 in a pod), and exits with the child's code. Other children it
//! starts (shells) are spawned with [`spawn`], which hears their exit from the reaper.

use std::{
    collections::HashMap,
    process::Command,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

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

/// Whether [`supervise`]'s reaper is running: it reaps every child, so the others' exits
/// must come from it.
static REAPING: AtomicBool = AtomicBool::new(false);

/// Who waits for which child's exit, while the reaper runs. A child is spawned with this lock
/// held and its waiter put here before it is let go, so the reaper (which takes the lock after
/// reaping) always finds the waiter of a child that exited at once.
static WAITERS: Mutex<Option<HashMap<i32, tokio::sync::oneshot::Sender<i32>>>> = Mutex::new(None);

/// Has `command` start with every signal's default disposition and none blocked, whatever
/// this process inherited (an agent started under `nohup` ignores SIGHUP, and ignored signals
/// survive exec: a shell started so could not be hung up).
pub fn default_signals(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal and sigprocmask are async-signal-safe, and touch only the child.
    unsafe {
        command.pre_exec(|| {
            for signal in 1..nix::libc::SIGRTMIN() {
                if signal != nix::libc::SIGKILL && signal != nix::libc::SIGSTOP {
                    nix::libc::signal(signal, nix::libc::SIG_DFL);
                }
            }
            let mut none: nix::libc::sigset_t = std::mem::zeroed();
            nix::libc::sigemptyset(&mut none);
            nix::libc::sigprocmask(nix::libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
}

/// Starts `command` as a child and returns it and its exit code to come (128 + the signal
/// for a killed one), its signals at their defaults ([`default_signals`]). With
/// [`supervise`]'s reaper running, the reaper reports the exit; without it (the agent beside
/// an entrypoint, tests), a thread waits for that one child.
pub fn spawn(
    command: &mut Command,
) -> std::io::Result<(std::process::Child, tokio::sync::oneshot::Receiver<i32>)> {
    default_signals(command);
    let (tx, rx) = tokio::sync::oneshot::channel();
    if REAPING.load(Ordering::SeqCst) {
        let mut waiters = WAITERS.lock().unwrap_or_else(|p| p.into_inner());
        let child = command.spawn()?;
        waiters
            .get_or_insert_with(HashMap::new)
            .insert(child.id() as i32, tx);
        return Ok((child, rx));
    }
    let child = command.spawn()?;
    let pid = Pid::from_raw(child.id() as i32);
    tokio::task::spawn_blocking(move || {
        loop {
            match waitpid(pid, None) {
                Ok(status) => {
                    if let Some(code) = code(status) {
                        let _ = tx.send(code);
                        return;
                    }
                }
                Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    });
    Ok((child, rx))
}

/// Says [`supervise`] will run and reap every child: call it before children are spawned
/// (the agent serves shells before its command starts), so their waiters are where the reaper
/// looks once it runs.
pub fn will_reap() {
    REAPING.store(true, Ordering::SeqCst);
}

/// Tells the waiter of `pid`, if any, that it exited with `code`.
fn reaped(pid: Pid, code: i32) {
    let waiter = WAITERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|w| w.remove(&pid.as_raw()));
    if let Some(waiter) = waiter {
        let _ = waiter.send(code);
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
    let mut workspace = Command::new(program);
    workspace.args(args);
    default_signals(&mut workspace);
    let child = workspace.spawn().map_err(|source| SuperviseError::Spawn {
        command: command.join(" "),
        source,
    })?;
    let pid = Pid::from_raw(child.id() as i32);
    started(pid.as_raw());
    will_reap();

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
                // A shell (its waiter hears), or an orphaned grandchild: reaped.
                Ok(status) => {
                    if let (Some(other), Some(code)) = (status.pid(), code(status)) {
                        reaped(other, code);
                    }
                }
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
