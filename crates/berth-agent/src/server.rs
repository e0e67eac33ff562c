//! The agent's gRPC server: `berth.agent.v1.Agent` behind the auth layer, and the standard
//! health service (unauthenticated) for the pod's readiness probe.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::Sleep,
};
use tonic::{
    Request, Response, Status,
    transport::{
        Identity, Server, ServerTlsConfig,
        server::{Connected, TcpConnectInfo},
    },
};

use crate::{
    activity::Activity,
    auth::{Authenticator, Verb},
    content::Content,
    proto::{
        GetActivityRequest, GetActivityResponse, GetContentRequest, GetContentResponse,
        HeartbeatRequest, HeartbeatResponse, ShellInput, ShellOutput, SshInput, SshOutput,
        WhoAmIRequest, WhoAmIResponse,
        agent_server::{Agent, AgentServer},
        shell_input::Input,
        ssh_input, ssh_output,
    },
    shell::Shells,
    ssh::Ssh,
};

/// What the agent opens in the workspace: shells (and SSH sessions) as `shells` says, with
/// SSH's host key kept in `home` (the workspace's home volume; None: in memory only).
#[derive(Clone)]
pub struct Inside {
    pub shells: Shells,
    pub home: Option<std::path::PathBuf>,
}

impl Inside {
    /// Opens nothing, saying `why`.
    pub fn nothing(why: &str) -> Self {
        Inside {
            shells: Shells::Unavailable(why.to_owned()),
            home: None,
        }
    }
}

/// The service.
pub struct AgentService {
    auth: Arc<Authenticator>,
    activity: Arc<Activity>,
    content: Arc<Content>,
    shells: Shells,
    ssh: Arc<Ssh>,
}

impl AgentService {
    pub fn new(
        auth: Arc<Authenticator>,
        activity: Arc<Activity>,
        content: Arc<Content>,
        inside: Inside,
    ) -> Self {
        AgentService {
            auth,
            activity,
            content,
            ssh: Arc::new(Ssh::new(inside.home, inside.shells.clone())),
            shells: inside.shells,
        }
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<crate::auth::Caller, Status> {
        self.caller_for(request, Verb::Use).await
    }

    async fn caller_for<T>(
        &self,
        request: &Request<T>,
        verb: Verb,
    ) -> Result<crate::auth::Caller, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.auth
            .check_verb(header, grpc_timeout(request), verb)
            .await
    }
}

/// The output of an SSH connection, as the agent streams it.
pub type SshStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<SshOutput, Status>> + Send + 'static>>;

/// The output of a shell, as the agent streams it.
pub type ShellStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ShellOutput, Status>> + Send + 'static>>;

/// The caller's deadline from its `grpc-timeout` header (digits and a unit: H M S m u n).
fn grpc_timeout<T>(request: &Request<T>) -> Option<std::time::Duration> {
    let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(value.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(value.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(value),
        "m" => std::time::Duration::from_millis(value),
        "u" => std::time::Duration::from_micros(value),
        "n" => std::time::Duration::from_nanos(value),
        _ => return None,
    })
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn who_am_i(
        &self,
        request: Request<WhoAmIRequest>,
    ) -> Result<Response<WhoAmIResponse>, Status> {
        let caller = self.caller(&request).await?;
        let scope = self.auth.scope();
        Ok(Response::new(WhoAmIResponse {
            caller_username: caller.username,
            caller_groups: caller.groups,
            workspace_namespace: scope.namespace.clone(),
            workspace_name: scope.workspace.clone(),
            pod_name: scope.pod.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }

    async fn get_activity(
        &self,
        request: Request<GetActivityRequest>,
    ) -> Result<Response<GetActivityResponse>, Status> {
        self.caller(&request).await?;
        let seen = self.activity.latest();
        Ok(Response::new(GetActivityResponse {
            last_activity: seen.at.to_string(),
            signal: seen.signal.as_str().to_owned(),
            detail: seen.detail,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        self.caller(&request).await?;
        self.activity.heartbeat(&request.get_ref().source);
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn get_content(
        &self,
        request: Request<GetContentRequest>,
    ) -> Result<Response<GetContentResponse>, Status> {
        self.caller(&request).await?;
        Ok(Response::new(self.content.answer()))
    }

    type ShellStream = ShellStream;
    type SshStream = SshStream;

    async fn ssh(
        &self,
        request: Request<tonic::Streaming<SshInput>>,
    ) -> Result<Response<SshStream>, Status> {
        self.open_ssh(request).await
    }

    async fn shell(
        &self,
        request: Request<tonic::Streaming<ShellInput>>,
    ) -> Result<Response<ShellStream>, Status> {
        let caller = self.caller_for(&request, Verb::Shell).await?;
        let spawn = match &self.shells {
            Shells::Unavailable(why) => return Err(Status::failed_precondition(why.clone())),
            Shells::Available(spawn) => spawn.clone(),
        };
        let mut inputs = request.into_inner();
        let start = match inputs.message().await?.and_then(|m| m.input) {
            Some(Input::Start(start)) => start,
            _ => {
                return Err(Status::invalid_argument(
                    "a shell's first input must be its start",
                ));
            }
        };
        let (columns, rows) = start
            .size
            .map_or((80, 24), |s| crate::shell::size(s.columns, s.rows));
        let command = crate::shell::command_line(&start.command);
        let on_behalf_of: String = start
            .on_behalf_of
            .chars()
            .filter(|c| !c.is_control())
            .take(crate::activity::MAX_SOURCE)
            .collect();
        let asked = crate::shell::Request {
            command: command.clone(),
            tty: start.tty,
            columns,
            rows,
            term: match start.term.is_empty() {
                true => "xterm-256color".to_owned(),
                false => start
                    .term
                    .chars()
                    .filter(|c| c.is_ascii_graphic())
                    .take(64)
                    .collect(),
            },
        };
        let session = spawn(asked).await.map_err(Status::failed_precondition)?;
        tracing::info!(caller = %caller.username, %on_behalf_of, ?command, tty = start.tty, "shell started");
        let open = self.activity.shell_opened(&on_behalf_of);
        let (out, stream) = tokio::sync::mpsc::channel(16);
        tokio::spawn(crate::shell::run(
            session,
            inputs,
            out,
            start.tty,
            self.activity.clone(),
            open,
        ));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }
}

/// How many bytes of an SSH connection are buffered each way between the stream and the SSH
/// server.
const SSH_BUFFER: usize = 256 * 1024;

impl AgentService {
    /// The `Ssh` call: the host key first, then the SSH server over the stream's bytes.
    async fn open_ssh(
        &self,
        request: Request<tonic::Streaming<SshInput>>,
    ) -> Result<Response<SshStream>, Status> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let caller = self.caller_for(&request, Verb::Shell).await?;
        let mut inputs = request.into_inner();
        let start = match inputs.message().await?.and_then(|m| m.input) {
            Some(ssh_input::Input::Start(start)) => start,
            _ => {
                return Err(Status::invalid_argument(
                    "an SSH stream's first input must be its start",
                ));
            }
        };
        let host_key = self.ssh.host_key_line().map_err(Status::internal)?;
        let (out, stream) = tokio::sync::mpsc::channel(16);
        let _ = out
            .send(Ok(SshOutput {
                output: Some(ssh_output::Output::HostKey(host_key)),
            }))
            .await;
        if !start.host_key_only {
            let on_behalf_of: String = start
                .on_behalf_of
                .chars()
                .filter(|c| !c.is_control())
                .take(crate::activity::MAX_SOURCE)
                .collect();
            tracing::info!(caller = %caller.username, %on_behalf_of, "SSH connection opened");
            let (ours, theirs) = tokio::io::duplex(SSH_BUFFER);
            let (mut from_server, mut to_server) = tokio::io::split(ours);
            let (ssh, activity) = (self.ssh.clone(), self.activity.clone());
            let served = tokio::spawn(async move {
                if let Err(e) = ssh.serve(theirs, activity, &on_behalf_of).await {
                    tracing::info!(%on_behalf_of, error = %e, "SSH connection ended");
                }
            });
            // The client's bytes to the server; its end (or the caller gone) ends the server's
            // input, and the connection with it.
            tokio::spawn(async move {
                while let Ok(Some(message)) = inputs.message().await {
                    if let Some(ssh_input::Input::Data(bytes)) = message.input
                        && to_server.write_all(&bytes).await.is_err()
                    {
                        break;
                    }
                }
                let _ = to_server.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 32 * 1024];
                loop {
                    tokio::select! {
                        read = from_server.read(&mut buffer) => match read {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                let chunk = SshOutput {
                                    output: Some(ssh_output::Output::Data(buffer[..n].to_vec())),
                                };
                                if out.send(Ok(chunk)).await.is_err() {
                                    break;
                                }
                            }
                        },
                        () = out.closed() => break,
                    }
                }
                served.abort();
            });
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }
}

/// The agent's TLS certificate (it must name [`crate::TLS_SERVER_NAME`]) and key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Serves the agent and the health service on `listener` until `shutdown` resolves, over TLS
/// when given an identity, sampling `activity` meanwhile, opening shells and SSH as `inside` says.
pub async fn serve(
    listener: tokio::net::TcpListener,
    auth: Arc<Authenticator>,
    tls: Option<TlsIdentity>,
    activity: Arc<Activity>,
    content: Arc<Content>,
    inside: Inside,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let sampler = tokio::spawn(activity.clone().run());
    let _stop_sampling = AbortOnDrop(sampler);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServer<AgentService>>()
        .await;
    // A peer that vanished without closing (its node lost) is found by a ping it does not
    // answer, and its connection closed.
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(60)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(identity) = tls {
        builder = builder.tls_config(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(identity.cert_pem, identity.key_pem)),
        )?;
    }
    builder
        .add_service(health_service)
        .add_service(AgentServer::new(AgentService::new(
            auth, activity, content, inside,
        )))
        .serve_with_incoming_shutdown(Incoming::new(listener), shutdown)
        .await
}

/// How long a connection may stay silent after it is accepted: a peer that connects and never
/// speaks (a probe cut off, a port scan, a half-open connection) is closed then, so it holds no
/// descriptor longer than this.
pub const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the agent waits before accepting again after the process ran out of descriptors
/// or memory; accepting at once would fail at once, and spin.
pub const ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// The connections a listener accepts, as the server takes them. A connection that failed
/// before it was accepted (reset, aborted) is skipped; a failure of the process itself (no
/// descriptor or memory left) pauses accepting for [`ACCEPT_PAUSE`] and is logged once until
/// an accept succeeds again. (tonic's own accept stream retries such a failure at once, so a
/// process out of descriptors spins, and the connections waiting to be accepted are never
/// taken nor closed: the CLOSE-WAIT sockets of a crowded node.)
pub struct Incoming<L = TcpListener> {
    listener: L,
    pause: Option<Pin<Box<Sleep>>>,
    failing: bool,
}

/// What accepts connections: a TCP listener, or a stand-in in tests.
pub trait Accept {
    type Connection;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Connection>>;
}

impl Accept for TcpListener {
    type Connection = TcpStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(stream, _)| stream)
    }
}

impl<L: Accept> Incoming<L> {
    pub fn new(listener: L) -> Self {
        Incoming {
            listener,
            pause: None,
            failing: false,
        }
    }

    /// The next connection accepted; failures are skipped or paused on as above.
    pub async fn accept(&mut self) -> L::Connection {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<L::Connection> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok(connection) => {
                    self.failing = false;
                    return Poll::Ready(connection);
                }
                Err(error) if one_connection_failed(&error) => continue,
                Err(error) => {
                    if !self.failing {
                        tracing::warn!(%error, pause = ?ACCEPT_PAUSE, "cannot accept connections; pausing");
                    }
                    self.failing = true;
                    self.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_PAUSE)));
                }
            }
        }
    }
}

/// Whether an accept failed for that one connection only: the next may succeed at once.
fn one_connection_failed(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

impl tokio_stream::Stream for Incoming<TcpListener> {
    type Item = io::Result<Quiet>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let stream = ready!(self.poll_accept(cx));
        Poll::Ready(Some(Ok(Quiet::new(stream))))
    }
}

/// An accepted connection that is closed (reads fail with `TimedOut`) when its peer sends
/// nothing for [`FIRST_BYTES_TIMEOUT`] after it was accepted; once the peer spoke, no limit
/// (HTTP/2 keepalive looks after idle peers then).
pub struct Quiet {
    stream: TcpStream,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Quiet {
    fn new(stream: TcpStream) -> Self {
        Quiet {
            stream,
            deadline: Some(Box::pin(tokio::time::sleep(FIRST_BYTES_TIMEOUT))),
        }
    }
}

impl Connected for Quiet {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Quiet {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.deadline = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let expired = this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer sent nothing after connecting",
                )))
            }
        }
    }
}

impl AsyncWrite for Quiet {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Aborts a background task when dropped (the sampler ends with the server).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that fails as a process out of descriptors does (`EMFILE`), `failures`
    /// times, then accepts; it counts how often it was asked.
    struct OutOfDescriptors {
        failures: u32,
        asked: Vec<tokio::time::Instant>,
    }

    impl Accept for OutOfDescriptors {
        type Connection = ();

        fn poll_accept(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.asked.push(tokio::time::Instant::now());
            if self.asked.len() as u32 <= self.failures {
                return Poll::Ready(Err(io::Error::from_raw_os_error(24)));
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_descriptors_the_agent_pauses_accepting_instead_of_spinning() {
        let started = tokio::time::Instant::now();
        let mut incoming = Incoming::new(OutOfDescriptors {
            failures: 3,
            asked: vec![],
        });
        incoming.accept().await;
        let asked = &incoming.listener.asked;
        assert_eq!(asked.len(), 4, "asked again only after each pause");
        for (i, at) in asked.iter().enumerate() {
            assert_eq!(*at - started, ACCEPT_PAUSE * i as u32);
        }
    }

    /// A connection reset before it was taken is no reason to wait.
    struct Resets(u32);

    impl Accept for Resets {
        type Connection = ();

        fn poll_accept(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.0 += 1;
            match self.0 {
                1 => Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into())),
                _ => Poll::Ready(Ok(())),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_aborted_before_it_was_taken_is_skipped_at_once() {
        let started = tokio::time::Instant::now();
        let mut incoming = Incoming::new(Resets(0));
        incoming.accept().await;
        assert_eq!(incoming.listener.0, 2);
        assert_eq!(tokio::time::Instant::now(), started);
    }
}
