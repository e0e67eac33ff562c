//! `berth shell NAME [-- CMD ARGS...]`: a command (the container's login shell by default) in
//! a workspace's container, run by Berth's agent there, through the gateway with the user's
//! bearer token: on a terminal when stdin is one (raw mode, the window's size followed), with
//! the command's exit code as berth's own.

use std::io::{IsTerminal, Write};

use berth_gateway::shell::{Control, Ended, STDERR, STDOUT, Start};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::workspaces::{Target, bearer_token, discover_gateway, load, own_websocket, tunnel};

/// Options of `berth shell`.
#[derive(clap::Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace.
    pub name: String,
    /// The command and its arguments, after `--` (default: the container's login shell:
    /// $SHELL, else bash, else sh).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// The gateway's address (as for `berth open`).
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// Run the command on a terminal even when stdin is not one.
    #[arg(short = 't', long, conflicts_with = "no_tty")]
    pub tty: bool,
    /// Never a terminal: the command's output and errors stay apart (for scripts).
    #[arg(short = 'T', long)]
    pub no_tty: bool,
}

/// Runs the shell; its exit code, or why there is none.
pub async fn run(args: ShellArgs) -> Result<i32, String> {
    let (config, namespace) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    let token = bearer_token(&config).await?;
    let url = own_websocket(&gateway, &namespace, &args.name, "shell");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let interactive = std::io::stdin().is_terminal();
    let tty = args.tty || (interactive && !args.no_tty);
    let (columns, rows) = window_size().unwrap_or((0, 0));
    let start = Start {
        command: args.command.clone(),
        tty,
        columns,
        rows,
        term: std::env::var("TERM").unwrap_or_default(),
    };
    let socket = tunnel(&url, &token).await?;
    let (mut to_gateway, mut from_gateway) = socket.split();
    to_gateway
        .send(text(&start))
        .await
        .map_err(|e| format!("the gateway closed the shell: {e}"))?;
    // Keys go to the workspace as typed (^C included) while the shell runs.
    let _raw = match tty && interactive {
        true => Some(RawMode::enter()?),
        false => None,
    };
    let (controls, mut queued) = tokio::sync::mpsc::channel::<Message>(16);
    let typing = tokio::spawn(type_into(controls.clone()));
    let resizing = tokio::spawn(follow_window(controls, tty && interactive));
    let sending = tokio::spawn(async move {
        while let Some(message) = queued.recv().await {
            if to_gateway.send(message).await.is_err() {
                return;
            }
        }
    });
    let ended = loop {
        match from_gateway.next().await {
            Some(Ok(Message::Binary(bytes))) => {
                let (stream, data) = bytes.split_first().unwrap_or((&0, &[]));
                let written = match *stream {
                    STDERR => std::io::stderr()
                        .write_all(data)
                        .and(std::io::stderr().flush()),
                    STDOUT => std::io::stdout()
                        .write_all(data)
                        .and(std::io::stdout().flush()),
                    _ => Ok(()),
                };
                if written.is_err() {
                    break None;
                }
            }
            Some(Ok(Message::Text(text))) => break serde_json::from_str::<Ended>(&text).ok(),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
            Some(Ok(_)) => {}
        }
    };
    typing.abort();
    resizing.abort();
    // The closing handshake: the gateway's close, answered as it is read.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while let Some(Ok(message)) = from_gateway.next().await {
            if let Message::Close(_) = message {
                break;
            }
        }
    })
    .await;
    sending.abort();
    match ended {
        Some(Ended::Exit { code }) => Ok(code),
        Some(Ended::Error { message }) => Err(message),
        None => Err("the gateway closed the shell without the command's exit code".to_owned()),
    }
}

/// A message of the protocol, as JSON text.
fn text(value: &impl serde::Serialize) -> Message {
    Message::Text(serde_json::to_string(value).unwrap_or_default().into())
}

/// Sends what is typed (or piped) in as binary messages, then that input ended.
async fn type_into(out: tokio::sync::mpsc::Sender<Message>) {
    use tokio::io::AsyncReadExt;
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        match stdin.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = bytes::Bytes::copy_from_slice(&buffer[..n]);
                if out.send(Message::Binary(chunk)).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = out.send(text(&Control::CloseStdin)).await;
}

/// Sends the window's size each time it changes (SIGWINCH), on a terminal.
async fn follow_window(out: tokio::sync::mpsc::Sender<Message>, terminal: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    if !terminal {
        return;
    }
    let Ok(mut changes) = signal(SignalKind::window_change()) else {
        return;
    };
    while changes.recv().await.is_some() {
        if let Some((columns, rows)) = window_size() {
            let resize = Control::Resize { columns, rows };
            if out.send(text(&resize)).await.is_err() {
                return;
            }
        }
    }
}

/// The terminal's size (columns, rows), from stdout, else stdin; None without a terminal.
fn window_size() -> Option<(u16, u16)> {
    [nix::libc::STDOUT_FILENO, nix::libc::STDIN_FILENO]
        .into_iter()
        .find_map(|fd| {
            let mut size = nix::libc::winsize {
                ws_row: 0,
                ws_col: 0,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            // SAFETY: TIOCGWINSZ writes a winsize to a valid pointer.
            let done = unsafe { nix::libc::ioctl(fd, nix::libc::TIOCGWINSZ, &mut size) } == 0;
            (done && size.ws_col > 0).then_some((size.ws_col, size.ws_row))
        })
}

/// The terminal in raw mode (keys as typed, no echo: the workspace's terminal does that) until
/// dropped, when it is as it was.
struct RawMode(nix::sys::termios::Termios);

impl RawMode {
    fn enter() -> Result<Self, String> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let saved =
            tcgetattr(&stdin).map_err(|e| format!("cannot read the terminal's mode: {e}"))?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw)
            .map_err(|e| format!("cannot put the terminal in raw mode: {e}"))?;
        Ok(RawMode(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use nix::sys::termios::{SetArg, tcsetattr};
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.0);
    }
}
