//! The agent's gRPC server: `berth.agent.v1.Agent` behind the auth layer, and the standard
//! health service (unauthenticated) for the pod's readiness probe.

use std::sync::Arc;

use tonic::{
    Request, Response, Status,
    transport::{Identity, Server, ServerTlsConfig},
};

use crate::{
    activity::Activity,
    auth::Authenticator,
    proto::{
        GetActivityRequest, GetActivityResponse, HeartbeatRequest, HeartbeatResponse,
        WhoAmIRequest, WhoAmIResponse,
        agent_server::{Agent, AgentServer},
    },
};

/// The service.
pub struct AgentService {
    auth: Arc<Authenticator>,
    activity: Arc<Activity>,
}

impl AgentService {
    pub fn new(auth: Arc<Authenticator>, activity: Arc<Activity>) -> Self {
        AgentService { auth, activity }
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<crate::auth::Caller, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.auth.check(header, grpc_timeout(request)).await
    }
}

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
}

/// The agent's TLS certificate (it must name [`crate::TLS_SERVER_NAME`]) and key, PEM.
#[derive(Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Serves the agent and the health service on `listener` until `shutdown` resolves, over TLS
/// when given an identity, sampling `activity` meanwhile.
pub async fn serve(
    listener: tokio::net::TcpListener,
    auth: Arc<Authenticator>,
    tls: Option<TlsIdentity>,
    activity: Arc<Activity>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let sampler = tokio::spawn(activity.clone().run());
    let _stop_sampling = AbortOnDrop(sampler);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServer<AgentService>>()
        .await;
    let mut builder = Server::builder();
    if let Some(identity) = tls {
        builder = builder.tls_config(
            ServerTlsConfig::new()
                .identity(Identity::from_pem(identity.cert_pem, identity.key_pem)),
        )?;
    }
    builder
        .add_service(health_service)
        .add_service(AgentServer::new(AgentService::new(auth, activity)))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}

/// Aborts a background task when dropped (the sampler ends with the server).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
