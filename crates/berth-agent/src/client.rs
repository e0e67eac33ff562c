//! The client the operator and the gateway use: `WhoAmI`, `GetActivity` and `GetContent` with
//! a bearer token (and `Heartbeat`, which IDEs and tests call), `Shell` (the gateway's), and
//! [`AgentTokens`], the caller's own tokens for agents from the TokenRequest API.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{Api, api::PostParams};

use tonic::{
    Request, Status,
    metadata::MetadataValue,
    transport::{Certificate, Channel, ClientTlsConfig},
};

use crate::proto::{
    GetActivityRequest, GetActivityResponse, GetContentRequest, GetContentResponse,
    HeartbeatRequest, ShellInput, ShellOutput, SshInput, SshOutput, WhoAmIRequest, WhoAmIResponse,
    agent_client::AgentClient,
};

/// Why a WhoAmI call failed, as the operator reports it.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The agent could not be reached (connection refused, timeout, bad address).
    #[error("the agent at {address} cannot be reached: {message}")]
    Unreachable { address: String, message: String },
    /// The agent answered with an error status.
    #[error("{}: {}", .0.code(), .0.message())]
    Refused(Status),
}

/// How the operator verifies an agent that serves TLS: the CA bundle its certificate chains
/// to; the certificate must name [`crate::TLS_SERVER_NAME`] (pod IPs change, names do not).
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub ca_pem: Vec<u8>,
}

/// Whether the agent rejected the token itself (so a new token may be accepted).
pub fn token_rejected(status: &Status) -> bool {
    status.metadata().contains_key(crate::TOKEN_REJECTED)
}

/// Calls `WhoAmI` on the agent at `address` (`host:port`) as the bearer of `token`, over TLS
/// when `tls` is given.
pub async fn who_am_i(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
) -> Result<WhoAmIResponse, CallError> {
    let mut client = connect(address, timeout, tls).await?;
    let request = authorized(WhoAmIRequest {}, address, token, timeout)?;
    answer(address, client.who_am_i(request).await)
}

/// Asks the agent at `address` when the workspace was last used (`GetActivity`).
pub async fn get_activity(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
) -> Result<GetActivityResponse, CallError> {
    let mut client = connect(address, timeout, tls).await?;
    let request = authorized(GetActivityRequest {}, address, token, timeout)?;
    answer(address, client.get_activity(request).await)
}

/// Asks the agent at `address` where the workspace's content stands (`GetContent`).
pub async fn get_content(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
) -> Result<GetContentResponse, CallError> {
    let mut client = connect(address, timeout, tls).await?;
    let request = authorized(GetContentRequest {}, address, token, timeout)?;
    answer(address, client.get_content(request).await)
}

/// Tells the agent at `address` that `source` uses the workspace (`Heartbeat`).
pub async fn heartbeat(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
    source: &str,
) -> Result<(), CallError> {
    let mut client = connect(address, timeout, tls).await?;
    let message = HeartbeatRequest {
        source: source.to_owned(),
    };
    let request = authorized(message, address, token, timeout)?;
    answer(address, client.heartbeat(request).await).map(|_| ())
}

/// Opens a shell on the agent at `address` as the bearer of `token`: `inputs` go to it (its
/// start first), its outputs come back until its exit code. `timeout` bounds connecting and
/// the agent's checks, not the shell.
pub async fn shell(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
    inputs: impl tokio_stream::Stream<Item = ShellInput> + Send + 'static,
) -> Result<tonic::Streaming<ShellOutput>, CallError> {
    let mut client = connect_for(address, timeout, None, tls).await?;
    // No deadline: it would bound the shell.
    let request = bearer(Request::new(inputs), address, token)?;
    let opened = tokio::time::timeout(timeout, client.shell(request))
        .await
        .map_err(|_| unreachable(address, format!("no answer within {timeout:?}")))?;
    answer(address, opened)
}

/// Opens an SSH connection on the agent at `address` as the bearer of `token`: `inputs` go to
/// it (its start first), its host key and then the server's bytes come back. `timeout` bounds
/// connecting and the agent's checks, not the connection.
pub async fn ssh(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
    inputs: impl tokio_stream::Stream<Item = SshInput> + Send + 'static,
) -> Result<tonic::Streaming<SshOutput>, CallError> {
    let mut client = connect_for(address, timeout, None, tls).await?;
    let request = bearer(Request::new(inputs), address, token)?;
    let opened = tokio::time::timeout(timeout, client.ssh(request))
        .await
        .map_err(|_| unreachable(address, format!("no answer within {timeout:?}")))?;
    answer(address, opened)
}

/// A caller's tokens for agents, one per namespace (audience `berth-agent/<namespace>`), from
/// the TokenRequest API for its own service account, each used until 80% of its lifetime.
pub struct AgentTokens {
    client: kube::Client,
    /// Whose they are, in messages: "the operator's".
    whose: &'static str,
    /// The service account's namespace and name.
    namespace: String,
    name: String,
    lifetime: Duration,
    tokens: tokio::sync::Mutex<HashMap<String, CachedToken>>,
}

struct CachedToken {
    token: String,
    renew_at: Instant,
}

impl AgentTokens {
    /// Tokens of `whose` ("the operator's") service account `namespace/name`, asked for
    /// `lifetime` (at least 10 minutes, as the API server requires).
    pub fn new(
        client: kube::Client,
        whose: &'static str,
        namespace: &str,
        name: &str,
        lifetime: Duration,
    ) -> Self {
        AgentTokens {
            client,
            whose,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            lifetime,
            tokens: Default::default(),
        }
    }

    /// Drops the cached token for `namespace` if it is still `token` (an agent rejected it:
    /// its service account was re-created, say).
    pub async fn forget(&self, namespace: &str, token: &str) {
        let mut tokens = self.tokens.lock().await;
        if tokens.get(namespace).is_some_and(|c| c.token == token) {
            tracing::info!(%namespace, "an agent rejected our token; requesting a new one");
            tokens.remove(namespace);
        }
    }

    /// The token for the agents in `namespace`, and whether it was just requested.
    pub async fn token(&self, namespace: &str) -> Result<(String, bool), String> {
        let mut tokens = self.tokens.lock().await;
        let now = Instant::now();
        if let Some(token) = tokens.get(namespace).filter(|t| now < t.renew_at) {
            return Ok((token.token.clone(), false));
        }
        // Namespaces come and go: a token due for renewal is requested again when needed.
        tokens.retain(|_, t| now < t.renew_at);
        let account = format!("{}/{}", self.namespace, self.name);
        let audience = crate::audience(namespace);
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.clone()],
                expiration_seconds: Some(self.lifetime.as_secs().max(600) as i64),
                bound_object_ref: None,
            },
            ..Default::default()
        };
        let requested = Instant::now();
        let answer = accounts
            .create_token_request(&self.name, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                format!(
                    "cannot get a token for {} service account {account} (TokenRequest): {e}",
                    self.whose
                )
            })?;
        let status = answer
            .status
            .ok_or_else(|| format!("the TokenRequest for {account} returned no token"))?;
        let lifetime = Duration::try_from(
            status
                .expiration_timestamp
                .0
                .duration_since(jiff::Timestamp::now()),
        )
        .unwrap_or_default();
        tokens.insert(
            namespace.to_owned(),
            CachedToken {
                token: status.token.clone(),
                renew_at: requested + lifetime.mul_f64(0.8),
            },
        );
        tracing::info!(service_account = %account, %audience, lifetime_seconds = lifetime.as_secs(), "requested a token for agents");
        Ok((status.token, true))
    }
}

fn unreachable(address: &str, message: String) -> CallError {
    CallError::Unreachable {
        address: address.to_owned(),
        message,
    }
}

/// A client of the agent at `address`, connected; each call ends after `timeout`.
async fn connect(
    address: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
) -> Result<AgentClient<Channel>, CallError> {
    connect_for(address, timeout, Some(timeout), tls).await
}

/// A client of the agent at `address`, connected within `timeout`; its calls end after
/// `calls`, if given.
async fn connect_for(
    address: &str,
    timeout: std::time::Duration,
    calls: Option<std::time::Duration>,
    tls: Option<&ClientTls>,
) -> Result<AgentClient<Channel>, CallError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| unreachable(address, e.to_string()))?
        .connect_timeout(timeout);
    if let Some(calls) = calls {
        endpoint = endpoint.timeout(calls);
    }
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                    .domain_name(crate::TLS_SERVER_NAME),
            )
            .map_err(|e| unreachable(address, format!("bad TLS settings: {e}")))?;
    }
    let channel = endpoint.connect().await.map_err(|e| {
        // The transport error's own text is terse ("transport error"); its causes say why.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        unreachable(address, message)
    })?;
    Ok(AgentClient::new(channel))
}

/// `message` as a request with the bearer token and the deadline.
fn authorized<T>(
    message: T,
    address: &str,
    token: &str,
    timeout: std::time::Duration,
) -> Result<Request<T>, CallError> {
    let mut request = Request::new(message);
    // Sent as `grpc-timeout`: the agent fits its reviews inside it.
    request.set_timeout(timeout);
    bearer(request, address, token)
}

/// `request` with the bearer token.
fn bearer<T>(mut request: Request<T>, address: &str, token: &str) -> Result<Request<T>, CallError> {
    let value: MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| unreachable(address, "the token is not a valid header value".into()))?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

/// The agent's answer, or why there is none: its refusal, or nothing answered.
fn answer<T>(address: &str, result: Result<tonic::Response<T>, Status>) -> Result<T, CallError> {
    match result {
        Ok(response) => Ok(response.into_inner()),
        // The agent answered: the API it checks callers with did not.
        Err(status) if status.metadata().contains_key(crate::REVIEW_UNAVAILABLE) => {
            Err(CallError::Refused(status))
        }
        // The transport failed (the status wraps its error, e.g. the connection closed
        // mid-call), or the agent is not there: nothing answered.
        Err(status)
            if status.code() == tonic::Code::Unavailable
                || std::error::Error::source(&status).is_some() =>
        {
            Err(unreachable(address, status.message().to_owned()))
        }
        Err(status) => Err(CallError::Refused(status)),
    }
}
