//! The client the operator uses: `WhoAmI` and `GetActivity` with a bearer token (and
//! `Heartbeat`, which IDEs and tests call).

use tonic::{
    Request, Status,
    metadata::MetadataValue,
    transport::{Certificate, Channel, ClientTlsConfig},
};

use crate::proto::{
    GetActivityRequest, GetActivityResponse, GetContentRequest, GetContentResponse,
    HeartbeatRequest, WhoAmIRequest, WhoAmIResponse, agent_client::AgentClient,
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

fn unreachable(address: &str, message: String) -> CallError {
    CallError::Unreachable {
        address: address.to_owned(),
        message,
    }
}

/// A client of the agent at `address`, connected.
async fn connect(
    address: &str,
    timeout: std::time::Duration,
    tls: Option<&ClientTls>,
) -> Result<AgentClient<Channel>, CallError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{address}"))
        .map_err(|e| unreachable(address, e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
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
