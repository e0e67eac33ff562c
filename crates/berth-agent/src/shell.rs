//! Shells for the `Shell` RPC: a command in the workspace container, on a terminal when asked,
//! its output streamed back and its exit code last. In a pod the agent starts it itself
//! ([`local`]: the agent is the workspace container's first process, so the command runs in
//! that container, as its user, with its environment); berth-sim's agent has the simulated
//! runtime exec it in the container instead. A caller that goes away hangs the command up.

use std::{
    future::Future,
    io,
    os::fd::{AsRawFd, OwnedFd},
    pin::Pin,
    process::Stdio,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf, unix::AsyncFd},
    sync::{mpsc, oneshot},
};
use tonic::{Status, Streaming};

use crate::{
    activity::{Activity, ShellOpen},
    proto::{ShellInput, ShellOutput, shell_input::Input, shell_output::Output},
};

pub type Reader = Pin<Box<dyn AsyncRead + Send>>;
pub type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// What to run, and on what terminal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Never empty: [`command_line`] made it.
    pub command: Vec<String>,
    pub tty: bool,
    pub columns: u16,
    pub rows: u16,
    /// `TERM` for a terminal.
    pub term: String,
}

/// A started command: its streams, its terminal and its exit.
pub struct Session {
    pub stdin: Option<Writer>,
    pub stdout: Reader,
    /// None with a terminal: its output all comes on stdout.
    pub stderr: Option<Reader>,
    /// Sets the terminal's size (columns, rows).
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
    /// The exit code (128 + the signal for a killed command).
    pub exited: oneshot::Receiver<i32>,
    /// Ends the command when its caller went away before it exited.
    pub hang_up: Option<Box<dyn FnOnce() + Send>>,
}

/// Starts commands.
pub type Spawn = Arc<
    dyn Fn(Request) -> Pin<Box<dyn Future<Output = Result<Session, String>> + Send>> + Send + Sync,
>;

/// Whether this agent can open shells, and how.
#[derive(Clone)]
pub enum Shells {
    /// It cannot: why, in words for the person asking.
    Unavailable(String),
    Available(Spawn),
}

/// Why an agent beside the image's entrypoint opens no shell.
pub const BESIDE_ENTRYPOINT: &str = "this workspace has no command: Berth's agent runs in a container of its own beside the image's entrypoint and cannot start a shell in the workspace container; give the workspace (or its kind) a command, so the agent runs it and can open shells";

/// The command when the caller names none: the container's login shell (`$SHELL`, else bash,
/// else sh).
pub const LOGIN_SHELL: &[&str] = &[
    "/bin/sh",
    "-c",
    "exec \"${SHELL:-$(command -v bash || echo /bin/sh)}\" -l",
];

/// The command to run for `asked`: it, or the login shell.
pub fn command_line(asked: &[String]) -> Vec<String> {
    match asked.is_empty() {
        true => LOGIN_SHELL.iter().map(|s| (*s).to_owned()).collect(),
        false => asked.to_vec(),
    }
}

/// The terminal size to use: the caller's, else 80x24.
pub fn size(columns: u32, rows: u32) -> (u16, u16) {
    let fit = |v: u32, default: u16| match u16::try_from(v) {
        Ok(0) | Err(_) => default,
        Ok(v) => v,
    };
    (fit(columns, 80), fit(rows, 24))
}

/// Starts commands as children of this process (the agent in the workspace container).
pub fn local() -> Spawn {
    Arc::new(|request| Box::pin(async move { start_local(&request) }))
}

fn start_error(command: &[String], e: &dyn std::fmt::Display) -> String {
    format!("cannot start {command:?} in the workspace container: {e}")
}

fn start_local(request: &Request) -> Result<Session, String> {
    let (program, args) = request
        .command
        .split_first()
        .ok_or_else(|| "no command to run".to_owned())?;
    let mut command = std::process::Command::new(program);
    command.args(args);
    // A shell starts in the home, as sshd starts one.
    if let Some((home, given)) = home(
        std::env::var_os("HOME"),
        std::env::var_os(berth_api::agent::HOME_ENV),
    ) {
        command.current_dir(&home);
        if !given {
            command.env("HOME", &home);
        }
    }
    let fail = |e: &dyn std::fmt::Display| start_error(&request.command, e);
    if !request.tty {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: setsid is async-signal-safe; it makes the command the leader of a group the
        // hang-up can signal whole.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                nix::unistd::setsid().map(drop).map_err(io::Error::from)
            });
        }
        let (mut child, exited) = crate::supervisor::spawn(&mut command).map_err(|e| fail(&e))?;
        let pid = child.id() as i32;
        let stdin = child.stdin.take().map(tokio::process::ChildStdin::from_std);
        let stdout = child
            .stdout
            .take()
            .map(tokio::process::ChildStdout::from_std);
        let stderr = child
            .stderr
            .take()
            .map(tokio::process::ChildStderr::from_std);
        let (Some(Ok(stdin)), Some(Ok(stdout)), Some(Ok(stderr))) = (stdin, stdout, stderr) else {
            hang_up(pid);
            return Err(fail(&"its pipes cannot be read"));
        };
        return Ok(Session {
            stdin: Some(Box::pin(stdin)),
            stdout: Box::pin(stdout),
            stderr: Some(Box::pin(stderr)),
            resize: None,
            exited,
            hang_up: Some(Box::new(move || hang_up(pid))),
        });
    }
    let size = winsize(request.columns, request.rows);
    let pty = nix::pty::openpty(&size, None).map_err(|e| fail(&format!("no terminal: {e}")))?;
    use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
    fcntl(&pty.master, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .and_then(|_| fcntl(&pty.master, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)))
        .map_err(|e| fail(&format!("no terminal: {e}")))?;
    let terminal = |fd: &OwnedFd| fd.try_clone().map(Stdio::from).map_err(|e| fail(&e));
    command
        .stdin(terminal(&pty.slave)?)
        .stdout(terminal(&pty.slave)?)
        .stderr(terminal(&pty.slave)?)
        .env("TERM", &request.term);
    // SAFETY: setsid and ioctl are async-signal-safe; the command leads a session of its own
    // whose controlling terminal is the new one (its stdin), as a terminal login's shell.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (child, exited) = crate::supervisor::spawn(&mut command).map_err(|e| fail(&e))?;
    let pid = child.id() as i32;
    // Only the command holds the terminal now: when it (and what it started) ends, reading
    // the controller ends.
    drop(command);
    drop(pty.slave);
    // SAFETY: the controller is an OwnedFd the AsyncFd owns from now on; nothing else closes
    // or replaces it.
    let controller = Arc::new(unsafe { AsyncFd::register(pty.master) }.map_err(|e| fail(&e))?);
    let resizer = controller.clone();
    Ok(Session {
        stdin: Some(Box::pin(Terminal(controller.clone()))),
        stdout: Box::pin(Terminal(controller)),
        stderr: None,
        resize: Some(Box::new(move |columns, rows| {
            set_size(resizer.get_ref(), columns, rows)
        })),
        exited,
        hang_up: Some(Box::new(move || hang_up(pid))),
    })
}

/// The home a shell starts in, and whether it is `HOME` itself: `HOME`, unless it is unset or
/// `/` (an image's user without a home), then the workspace's home volume (`BERTH_HOME`),
/// which also becomes its `HOME`; None: the container's working directory.
fn home(
    home: Option<std::ffi::OsString>,
    volume: Option<std::ffi::OsString>,
) -> Option<(std::path::PathBuf, bool)> {
    let is_dir = |p: &std::ffi::OsString| std::path::Path::new(p).is_dir();
    match home.filter(|h| h != "/" && is_dir(h)) {
        Some(home) => Some((home.into(), true)),
        None => volume.filter(is_dir).map(|v| (v.into(), false)),
    }
}

fn winsize(columns: u16, rows: u16) -> nix::pty::Winsize {
    nix::pty::Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Sets the size of the terminal whose controller is `fd` (its processes get SIGWINCH).
fn set_size(fd: &OwnedFd, columns: u16, rows: u16) {
    let size = winsize(columns, rows);
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::TIOCSWINSZ, &size) };
}

/// SIGHUP to the command's process group, as a terminal that went away sends it.
fn hang_up(pid: i32) {
    use nix::{sys::signal, unistd::Pid};
    let _ = signal::killpg(Pid::from_raw(pid), signal::Signal::SIGHUP);
}

/// A terminal's controller, read and written without blocking a thread (a blocked read would
/// keep it open, and a shell whose caller left would never be hung up).
struct Terminal(Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for Terminal {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut ready = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every process of the terminal has closed it: its end.
                Ok(Err(e)) if e.raw_os_error() == Some(nix::libc::EIO) => {
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Terminal {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut ready = ready!(self.0.poll_write_ready(cx))?;
            match ready.try_io(|fd| nix::unistd::write(fd.get_ref(), buf).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The end-of-file character a terminal's line discipline takes as "no more input" (^D).
pub(crate) const END_OF_FILE: u8 = 0x04;

/// How long output may still come after the command exited (from what it left running, or
/// still in the pipes) before its exit code is sent.
pub const AFTER_EXIT: Duration = Duration::from_millis(500);

/// Runs `session` for a caller: its inputs to the command, the command's output and then its
/// exit code to `out`; a caller gone (`out` closed) hangs the command up. `open` counts the
/// shell as activity while it runs, and each input too.
pub async fn run(
    session: Session,
    mut inputs: Streaming<ShellInput>,
    out: mpsc::Sender<Result<ShellOutput, Status>>,
    tty: bool,
    activity: Arc<Activity>,
    open: ShellOpen,
) {
    let Session {
        stdin,
        stdout,
        stderr,
        resize,
        exited,
        hang_up,
    } = session;
    let typing = tokio::spawn(async move {
        let mut stdin = stdin;
        while let Ok(Some(message)) = inputs.message().await {
            match message.input {
                Some(Input::Stdin(bytes)) => {
                    activity.shell_used(&open);
                    if let Some(writer) = stdin.as_mut()
                        && (writer.write_all(&bytes).await.is_err()
                            || writer.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                Some(Input::Resize(size)) => {
                    if let Some(resize) = &resize {
                        let (columns, rows) = self::size(size.columns, size.rows);
                        resize(columns, rows);
                    }
                }
                Some(Input::CloseStdin(true)) => match (tty, stdin.as_mut()) {
                    (true, Some(writer)) => {
                        let _ = writer.write_all(&[END_OF_FILE]).await;
                    }
                    (false, Some(writer)) => {
                        let _ = writer.shutdown().await;
                        stdin = None;
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        // The caller sends no more; the command goes on until it exits or the caller leaves.
        std::future::pending::<()>().await;
    });
    let _stop_typing = AbortOnDrop(typing);
    let mut pumps = vec![tokio::spawn(pump(stdout, out.clone(), Output::Stdout))];
    if let Some(stderr) = stderr {
        pumps.push(tokio::spawn(pump(stderr, out.clone(), Output::Stderr)));
    }
    // Until the command exits, this shell ending any other way (its caller gone, the agent
    // stopping) hangs it up.
    let mut hang_up = HangUp(hang_up);
    let code = tokio::select! {
        code = exited => code,
        () = out.closed() => {
            for pump in pumps {
                pump.abort();
            }
            return;
        }
    };
    hang_up.0 = None;
    let drained = tokio::time::timeout(AFTER_EXIT, async {
        for pump in &mut pumps {
            let _ = pump.await;
        }
    })
    .await;
    if drained.is_err() {
        for pump in pumps {
            pump.abort();
        }
    }
    let last = match code {
        Ok(code) => Ok(ShellOutput {
            output: Some(Output::ExitCode(code)),
        }),
        Err(_) => Err(Status::internal(
            "the agent lost track of the command's exit",
        )),
    };
    let _ = out.send(last).await;
}

/// Sends what `reader` gives, as `kind`, until its end.
async fn pump(
    mut reader: Reader,
    out: mpsc::Sender<Result<ShellOutput, Status>>,
    kind: fn(Vec<u8>) -> Output,
) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let chunk = ShellOutput {
                    output: Some(kind(buffer[..n].to_vec())),
                };
                if out.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Hangs a command up when dropped, unless it exited.
pub(crate) struct HangUp(pub(crate) Option<Box<dyn FnOnce() + Send>>);

impl Drop for HangUp {
    fn drop(&mut self) {
        if let Some(hang_up) = self.0.take() {
            hang_up();
        }
    }
}

/// Aborts a task when dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_starts_in_its_users_home_else_the_workspaces() {
        let dir = std::env::temp_dir();
        let dir_text = dir.clone().into_os_string();
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        assert_eq!(
            home(Some(dir_text.clone()), os("/nowhere")),
            Some((dir.clone(), true))
        );
        assert_eq!(
            home(os("/"), Some(dir_text.clone())),
            Some((dir.clone(), false))
        );
        assert_eq!(
            home(None, Some(dir_text.clone())),
            Some((dir.clone(), false))
        );
        assert_eq!(home(os("/"), None), None);
        assert_eq!(home(os("/no/such/home"), os("/no/such/volume")), None);
    }
}
