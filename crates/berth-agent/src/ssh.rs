//! SSH into the workspace for the `Ssh` RPC: an SSH server (russh) that speaks over the bytes of
//! one gRPC stream, so plain OpenSSH, `scp`, `sftp`, `rsync`, `ssh -L` and editors' remote
//! modes work through the gateway (`berth ssh`). The gateway has already authenticated and
//! authorized the person (`create workspaces/connect`) and the agent the gateway (`shell` on
//! `workspaces/agent`), so the SSH layer asks for no credential of its own (`none`); its host
//! key, kept in the workspace's home volume, lets the client verify it reached this
//! workspace. Sessions run commands as `Shell` does ([`crate::shell::Spawn`]): in the
//! workspace container, as its user; `sftp` is the image's `sftp-server`, as sshd runs it;
//! `ssh -L` connects from the pod. Remote forwarding (`-R`) and agent and X11 forwarding are
//! refused.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
    time::Duration,
};

use russh::{
    Channel, ChannelId, ChannelMsg,
    keys::{PrivateKey, ssh_key::LineEnding},
    server::{Auth, ChannelOpenHandle, Msg, Session},
};
use tokio::io::{AsyncWriteExt, DuplexStream};

use crate::{
    activity::{Activity, ShellOpen},
    shell::{LOGIN_SHELL, Request, Shells},
};

/// Where a workspace's host key is kept, under its home volume (so a new pod of the same
/// workspace answers with the same key).
pub const HOST_KEY_FILE: &str = ".berth/ssh_host_ed25519_key";

/// How long `ssh -L` may take to connect to its target from the pod.
pub const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The command that serves SFTP on its stdin and stdout: the image's `sftp-server`, where
/// Debian, Alpine, Fedora or Arch put it, else a message saying what to install.
pub const SFTP_SERVER: &[&str] = &[
    "/bin/sh",
    "-c",
    "for p in /usr/lib/openssh/sftp-server /usr/lib/ssh/sftp-server /usr/libexec/openssh/sftp-server /usr/libexec/sftp-server; do [ -x \"$p\" ] && exec \"$p\"; done; echo \"berth agent: the workspace's image has no sftp-server (install OpenSSH's sftp server, e.g. the Debian package openssh-sftp-server), so sftp and scp cannot copy files; ssh HOST cat, or rsync over ssh, still can\" >&2; exit 127",
];

/// The SSH side of an agent: its host key (made when first asked for) and how commands start.
pub struct Ssh {
    home: Option<PathBuf>,
    key: OnceLock<Result<Arc<russh::server::Config>, String>>,
    shells: Shells,
}

impl Ssh {
    /// SSH whose host key is kept in `home` (the workspace's home volume), or only in memory
    /// without one; sessions start commands as `shells` does.
    pub fn new(home: Option<PathBuf>, shells: Shells) -> Self {
        Ssh {
            home,
            key: OnceLock::new(),
            shells,
        }
    }

    /// The server's configuration with its host key, loaded or made on first use.
    pub fn config(&self) -> Result<Arc<russh::server::Config>, String> {
        self.key
            .get_or_init(|| {
                let key = host_key(self.home.as_deref())?;
                Ok(Arc::new(russh::server::Config {
                    server_id: russh::SshId::Standard(
                        concat!("SSH-2.0-berth-agent_", env!("CARGO_PKG_VERSION")).into(),
                    ),
                    methods: russh::MethodSet::from(&[russh::MethodKind::None][..]),
                    auth_rejection_time: Duration::from_millis(100),
                    auth_rejection_time_initial: Some(Duration::ZERO),
                    keys: vec![key],
                    // The gateway ends a connection whose person lost their access; an editor
                    // left open overnight is not ended here.
                    inactivity_timeout: None,
                    nodelay: true,
                    ..Default::default()
                }))
            })
            .clone()
    }

    /// The host key as an OpenSSH public key line (`ssh-ed25519 AAAA...`).
    pub fn host_key_line(&self) -> Result<String, String> {
        let config = self.config()?;
        let key = config.keys.first().ok_or("no host key")?;
        key.public_key()
            .to_openssh()
            .map_err(|e| format!("cannot write the host key: {e}"))
    }

    /// Serves one SSH connection over `stream` until it ends, for `on_behalf_of`.
    pub async fn serve(
        &self,
        stream: DuplexStream,
        activity: Arc<Activity>,
        on_behalf_of: &str,
    ) -> Result<(), String> {
        let config = self.config()?;
        let open = Arc::new(activity.shell_opened(on_behalf_of));
        let handler = Connection {
            shells: self.shells.clone(),
            channels: HashMap::new(),
            activity,
            open,
        };
        let session = russh::server::run_stream(config, stream, handler)
            .await
            .map_err(|e| format!("the SSH connection failed: {e}"))?;
        session
            .await
            .map_err(|e| format!("the SSH connection failed: {e}"))
    }
}

/// The host key kept at [`HOST_KEY_FILE`] under `home`, made (and kept) when there is none;
/// without a home, or when it cannot be written, one only in memory (it changes with the pod:
/// `berth ssh-config` shows the new one).
pub fn host_key(home: Option<&Path>) -> Result<PrivateKey, String> {
    let Some(home) = home else {
        return Ok(new_key());
    };
    let path = home.join(HOST_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            return PrivateKey::from_openssh(&text).map_err(|e| {
                format!("the host key {} is not an OpenSSH key: {e}", path.display())
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read the host key {}: {e}", path.display())),
    }
    let key = new_key();
    if let Err(e) = keep(&path, &key) {
        tracing::warn!(path = %path.display(), error = %e, "cannot keep the SSH host key in the home; this pod's key is in memory only");
    }
    Ok(key)
}

fn new_key() -> PrivateKey {
    let seed: [u8; 32] = rand::random();
    PrivateKey::from(russh::keys::ssh_key::private::Ed25519Keypair::from_seed(
        &seed,
    ))
}

/// Writes `key` to `path` readable by its owner only, never over one written meanwhile.
fn keep(path: &Path, key: &PrivateKey) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let text = key
        .to_openssh(LineEnding::LF)
        .map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    std::io::Write::write_all(&mut file, text.as_bytes())
}

/// The command for an `exec` request: the request run by the login shell of the container's
/// user (`$SHELL -c`, else sh), as sshd runs it.
pub fn exec_command(request: &[u8]) -> Vec<String> {
    vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        "exec \"${SHELL:-/bin/sh}\" -c \"$1\"".to_owned(),
        "sh".to_owned(),
        String::from_utf8_lossy(request).into_owned(),
    ]
}

/// One SSH connection's state.
struct Connection {
    shells: Shells,
    /// Session channels opened and not yet running a command, with their terminal if asked.
    channels: HashMap<ChannelId, Opened>,
    activity: Arc<Activity>,
    open: Arc<ShellOpen>,
}

struct Opened {
    channel: Channel<Msg>,
    /// (TERM, columns, rows) of a `pty-req`.
    terminal: Option<(String, u16, u16)>,
}

impl Connection {
    /// Starts `command` on `id`'s channel; the client is told the request succeeded once it
    /// runs, else why not (on stderr) and exit status 1.
    async fn start(
        &mut self,
        id: ChannelId,
        command: Vec<String>,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let Some(opened) = self.channels.remove(&id) else {
            return session.channel_failure(id);
        };
        let started = match &self.shells {
            Shells::Unavailable(why) => Err(why.clone()),
            Shells::Available(spawn) => {
                let (term, columns, rows) = opened
                    .terminal
                    .clone()
                    .unwrap_or_else(|| (String::new(), 80, 24));
                spawn(Request {
                    command,
                    tty: opened.terminal.is_some(),
                    columns,
                    rows,
                    term: match term.is_empty() {
                        true => "xterm-256color".to_owned(),
                        false => term,
                    },
                })
                .await
            }
        };
        match started {
            Ok(running) => {
                session.channel_success(id)?;
                tokio::spawn(run(
                    opened.channel,
                    running,
                    opened.terminal.is_some(),
                    self.activity.clone(),
                    self.open.clone(),
                ));
            }
            // As a shell that cannot run the command: the client shows why, and exits 1.
            Err(why) => {
                session.channel_success(id)?;
                session.extended_data(id, 1, format!("berth agent: {why}\r\n").into_bytes())?;
                session.exit_status_request(id, 1)?;
                session.eof(id)?;
                session.close(id)?;
            }
        }
        Ok(())
    }
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        // The gateway authenticated and authorized the person; this stream is theirs.
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.insert(
            channel.id(),
            Opened {
                channel,
                terminal: None,
            },
        );
        reply.accept().await;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        id: ChannelId,
        term: &str,
        columns: u32,
        rows: u32,
        _: u32,
        _: u32,
        _: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(opened) = self.channels.get_mut(&id) else {
            return session.channel_failure(id);
        };
        let (columns, rows) = crate::shell::size(columns, rows);
        let term: String = term
            .chars()
            .filter(|c| c.is_ascii_graphic())
            .take(64)
            .collect();
        opened.terminal = Some((term, columns, rows));
        session.channel_success(id)
    }

    async fn shell_request(
        &mut self,
        id: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let login = LOGIN_SHELL.iter().map(|s| (*s).to_owned()).collect();
        self.start(id, login, session).await
    }

    async fn exec_request(
        &mut self,
        id: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start(id, exec_command(data), session).await
    }

    async fn subsystem_request(
        &mut self,
        id: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match name {
            "sftp" => {
                let command = SFTP_SERVER.iter().map(|s| (*s).to_owned()).collect();
                self.start(id, command, session).await
            }
            _ => session.channel_failure(id),
        }
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _: &str,
        _: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Ok(port) = u16::try_from(port) else {
            reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
            return Ok(());
        };
        let connected = tokio::time::timeout(
            FORWARD_CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host, port)),
        )
        .await;
        match connected {
            Ok(Ok(mut connection)) => {
                let _ = connection.set_nodelay(true);
                reply.accept().await;
                tokio::spawn(async move {
                    let mut stream = channel.into_stream();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut connection).await;
                });
            }
            _ => reply.reject(russh::ChannelOpenFailure::ConnectFailed).await,
        }
        Ok(())
    }
}

/// Runs a started command on its channel: the channel's data to its stdin (end of input as
/// its end), its terminal's size following the client's window, its stdout and stderr back,
/// then its exit status, end of file and close. A client that closes the channel (or goes
/// away) hangs the command up.
async fn run(
    channel: Channel<Msg>,
    running: crate::shell::Session,
    tty: bool,
    activity: Arc<Activity>,
    open: Arc<ShellOpen>,
) {
    let crate::shell::Session {
        stdin,
        mut stdout,
        stderr,
        resize,
        exited,
        hang_up,
    } = running;
    let (mut read, write) = channel.split();
    let mut hang_up = crate::shell::HangUp(hang_up);
    let typing = async move {
        let mut stdin = stdin;
        loop {
            match read.wait().await {
                Some(ChannelMsg::Data { data }) => {
                    activity.shell_used(&open);
                    if let Some(writer) = stdin.as_mut()
                        && (writer.write_all(&data).await.is_err() || writer.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                Some(ChannelMsg::Eof) => match (tty, stdin.as_mut()) {
                    (true, Some(writer)) => {
                        let _ = writer.write_all(&[crate::shell::END_OF_FILE]).await;
                    }
                    (false, Some(writer)) => {
                        let _ = writer.shutdown().await;
                        stdin = None;
                    }
                    _ => {}
                },
                Some(ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                }) => {
                    if let Some(resize) = &resize {
                        let (columns, rows) = crate::shell::size(col_width, row_height);
                        resize(columns, rows);
                    }
                }
                Some(ChannelMsg::Close) | None => return,
                Some(_) => {}
            }
        }
    };
    let mut out = write.make_writer();
    let mut err = write.make_writer_ext(Some(1));
    let output = async move {
        let copy_out = async {
            let _ = tokio::io::copy(&mut stdout, &mut out).await;
            let _ = out.flush().await;
        };
        let copy_err = async {
            if let Some(mut stderr) = stderr {
                let _ = tokio::io::copy(&mut stderr, &mut err).await;
                let _ = err.flush().await;
            }
        };
        tokio::join!(copy_out, copy_err);
    };
    let mut output = crate::shell::AbortOnDrop(tokio::spawn(output));
    let code = tokio::select! {
        code = exited => code,
        // The client closed the channel or went away: the command is hung up (HangUp).
        () = typing => return,
    };
    hang_up.0 = None;
    // What the command wrote before it exited (or what it left running writes) still goes.
    let _ = tokio::time::timeout(crate::shell::AFTER_EXIT, &mut output.0).await;
    let code = code.unwrap_or(255);
    let _ = write.exit_status(u32::try_from(code).unwrap_or(255)).await;
    let _ = write.eof().await;
    let _ = write.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_key_is_kept_in_the_home_and_read_back() {
        let home = tempfile::tempdir().unwrap();
        let first = host_key(Some(home.path())).unwrap();
        let again = host_key(Some(home.path())).unwrap();
        assert_eq!(first.public_key(), again.public_key());
        let path = home.path().join(HOST_KEY_FILE);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "readable by its owner only");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(
            host_key(Some(other.path())).unwrap().public_key(),
            first.public_key(),
            "each workspace has its own"
        );
    }

    #[test]
    fn a_broken_host_key_is_an_error_not_replaced() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join(HOST_KEY_FILE);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "not a key").unwrap();
        let error = host_key(Some(home.path())).unwrap_err();
        assert!(error.contains("is not an OpenSSH key"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a key");
    }

    #[test]
    fn an_exec_request_runs_in_the_users_shell() {
        assert_eq!(
            exec_command(b"echo $HOME"),
            [
                "/bin/sh",
                "-c",
                "exec \"${SHELL:-/bin/sh}\" -c \"$1\"",
                "sh",
                "echo $HOME"
            ]
        );
    }
}
