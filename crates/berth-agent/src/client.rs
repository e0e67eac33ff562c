//! The client the operator uses: `WhoAmI` with a bearer token.

use tonic::{Request, Status, metadata::MetadataValue, transport::Channel};

use crate::proto::{WhoAmIRequest, WhoAmIResponse, agent_client::AgentClient};

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

/// Calls `WhoAmI` on the agent at `address` (`host:port`) as the bearer of `token`.
pub async fn who_am_i(
    address: &str,
    token: &str,
    timeout: std::time::Duration,
) -> Result<WhoAmIResponse, CallError> {
    let unreachable = |message: String| CallError::Unreachable {
        address: address.to_owned(),
        message,
    };
    let endpoint = Channel::from_shared(format!("http://{address}"))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut client = AgentClient::new(channel);
    let mut request = Request::new(WhoAmIRequest {});
    let value: MetadataValue<_> = format!("Bearer {token}")
        .parse()
        .map_err(|_| unreachable("the token is not a valid header value".into()))?;
    request.metadata_mut().insert("authorization", value);
    match client.who_am_i(request).await {
        Ok(response) => Ok(response.into_inner()),
        // The transport failed (the status wraps its error, e.g. the connection closed
        // mid-call), or the agent is not there: nothing answered.
        Err(status)
            if status.code() == tonic::Code::Unavailable
                || std::error::Error::source(&status).is_some() =>
        {
            Err(unreachable(status.message().to_owned()))
        }
        Err(status) => Err(CallError::Refused(status)),
    }
}
