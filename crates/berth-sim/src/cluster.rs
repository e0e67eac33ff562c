//! `SimCluster`: starts the simulated API server on a loopback port over TLS and hands out
//! clients and kubeconfigs for it. Dropping it (or `shutdown`) stops everything.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use base64::Engine;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use tokio::{net::TcpListener, task::JoinSet};

use crate::{
    auth::{Identity, TokenInfo},
    config::SimConfig,
    requests::RequestCount,
    sim::Sim,
    tls::{Authority, TlsError},
};

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on 127.0.0.1: {0}")]
    Listen(#[from] std::io::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("client: {0}")]
    Client(#[from] kube::Error),
}

/// A running simulated cluster.
pub struct SimCluster {
    sim: Arc<Sim>,
    address: SocketAddr,
    token: String,
    /// The superuser's client certificate and key (PEM), as kubeadm writes `admin.conf`.
    admin_certificate: (String, String),
    /// The API server's TLS configuration, which a node's kubelet endpoint serves too.
    tls: Arc<rustls::ServerConfig>,
    tasks: JoinSet<()>,
}

/// Serves `router` over TLS on `listener`: each connection's verified client certificate
/// names its user (`ClientCertificate` on every request); a client that never completes its
/// handshake holds no descriptor for long, and a failing accept pauses instead of spinning.
async fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, router: axum::Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut connections = JoinSet::new();
    let mut failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) if crate::server::one_connection_failed(&error) => continue,
            // Out of descriptors or memory: accepting again at once fails again, and
            // would spin while the connections waiting to be accepted are never taken.
            Err(error) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(%error, "the API server cannot accept connections; pausing 1 s");
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        failing = false;
        let acceptor = acceptor.clone();
        let router = router.clone();
        connections.spawn(async move {
            // As the kube-apiserver's ReadHeaderTimeout bounds it.
            let handshake =
                tokio::time::timeout(std::time::Duration::from_secs(32), acceptor.accept(stream));
            let Ok(Ok(tls_stream)) = handshake.await else {
                return;
            };
            let client = tls_stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(<[_]>::first)
                .and_then(crate::tls::client_identity);
            let service = TowerToHyperService::new(
                router.layer(axum::Extension(crate::server::ClientCertificate(client))),
            );
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls_stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

impl SimCluster {
    /// Serves node `node`'s kubelet API on 127.0.0.1:`port` (0: a free one), as a real
    /// kubelet serves its port 10250: `/exec`, `/attach`, `/portForward` and `/containerLogs`
    /// of the node's pods, and `/pods`, `/stats/summary` and the rest of what the node proxy
    /// reaches; authenticated as the API server does, authorized on `nodes/proxy`. The node's
    /// `daemonEndpoints` name the port. Returns the address.
    pub async fn serve_kubelet(&mut self, node: &str, port: u16) -> std::io::Result<SocketAddr> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let address = listener.local_addr()?;
        self.sim.set_kubelet_port(node, address.port());
        let router = axum::Router::new()
            .fallback(crate::node_proxy::kubelet)
            .with_state((self.sim.clone(), Arc::<str>::from(node)));
        self.tasks
            .spawn(serve_tls(listener, self.tls.clone(), router));
        Ok(address)
    }

    /// Starts a cluster on a free loopback port (or `config.port`).
    pub async fn start(config: SimConfig) -> Result<Self, StartError> {
        let authority = Arc::new(Authority::generate()?);
        let tls = authority.server_config(&["127.0.0.1", "localhost", "kubernetes.default.svc"])?;
        let listener = TcpListener::bind(("127.0.0.1", config.port)).await?;
        let address = listener.local_addr()?;

        let (terminations_tx, terminations_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut config = config;
        let with_nodes = !config.nodes.is_empty();
        if with_nodes {
            // Kubelets finish graceful deletions.
            config.pod_termination = crate::config::PodTermination::External;
        }
        let nodes = config.nodes.clone();
        let sim = Arc::new(Sim::new(config, terminations_tx));
        let _ = sim.address.set(address.to_string());
        let _ = sim.ca_pem.set(authority.ca_pem().to_owned());
        let _ = sim.authority.set(authority.clone());

        let mut tasks = JoinSet::new();
        // The controllers subscribe before anything is written, so they see every object.
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let controllers_sim = sim.clone();
        tasks.spawn(async move {
            let run = crate::gc::run(controllers_sim, terminations_rx);
            let _ = ready_tx.send(());
            run.await;
        });
        let _ = ready_rx.await;
        tokio::task::yield_now().await;
        sim.bootstrap();
        tasks.spawn(crate::nodes::run(sim.clone()));
        tasks.spawn(crate::volumes::run(sim.clone()));
        let faults_sim = sim.clone();
        tasks.spawn(async move { faults_sim.faults.follow_config_map(&faults_sim.store).await });
        if with_nodes {
            crate::nodes::register(&sim, &nodes);
            tasks.spawn(crate::scheduler::run(sim.clone()));
            tasks.spawn(crate::kubelet::run(sim.clone()));
        }
        tasks.spawn(crate::workloads::run(sim.clone()));
        tasks.spawn(crate::batch::run(sim.clone()));
        tasks.spawn(crate::certificates::run(sim.clone()));
        tasks.spawn(crate::endpoints::run(sim.clone()));
        let closer_sim = sim.clone();
        tasks.spawn(async move {
            // Periodic watch cuts, when a fault asks for them.
            loop {
                match closer_sim.faults.watch_close_period() {
                    Some(period) => {
                        tokio::time::sleep(period).await;
                        if closer_sim.faults.watch_close_period().is_some() {
                            closer_sim.watch_closer.send_modify(|n| *n += 1);
                        }
                    }
                    None => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
                }
            }
        });

        let mut token_bytes = [0u8; 24];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut token_bytes);
        let token = format!(
            "admin.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token_bytes)
        );
        sim.tokens.insert(
            &token,
            TokenInfo {
                identity: Identity::superuser(),
                audiences: vec![],
                expires: None,
            },
        );

        let router = axum::Router::new()
            .fallback(crate::server::handle)
            .with_state(sim.clone());
        tasks.spawn(serve_tls(listener, tls.clone(), router));
        let admin_certificate =
            authority.issue_client(crate::auth::SUPERUSER, &["system:masters"])?;
        Ok(SimCluster {
            sim,
            address,
            token,
            admin_certificate,
            tls,
            tasks,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The CA certificate (PEM) clients must trust.
    pub fn ca_pem(&self) -> &str {
        self.sim
            .ca_pem
            .get()
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The superuser's bearer token.
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig for the superuser (context `berth-sim`).
    pub fn kubeconfig(&self) -> Kubeconfig {
        self.kubeconfig_with_token("admin", &self.token)
    }

    /// A kubeconfig that authenticates with `token` (e.g. a service account's).
    pub fn kubeconfig_with_token(&self, user: &str, token: &str) -> Kubeconfig {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem());
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: "berth-sim".into(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    certificate_authority_data: Some(ca),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            auth_infos: vec![NamedAuthInfo {
                name: user.into(),
                auth_info: Some(AuthInfo {
                    token: Some(token.to_owned().into()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            contexts: vec![NamedContext {
                name: "berth-sim".into(),
                context: Some(Context {
                    cluster: "berth-sim".into(),
                    user: Some(user.into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            current_context: Some("berth-sim".into()),
            ..Default::default()
        }
    }

    /// Writes the superuser kubeconfig as YAML: its token and, as a kubeadm cluster's
    /// `admin.conf`, a client certificate of the cluster's CA (for clients that bring their own
    /// TLS stack and no token).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        let mut kubeconfig = self.kubeconfig();
        if let Some(user) = kubeconfig
            .auth_infos
            .first_mut()
            .and_then(|u| u.auth_info.as_mut())
        {
            let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
            user.client_certificate_data = Some(encode(&self.admin_certificate.0));
            user.client_key_data = Some(encode(&self.admin_certificate.1).into());
        }
        let yaml = serde_saphyr::to_string(&kubeconfig).map_err(std::io::Error::other)?;
        // Written beside it and renamed over it, so a reader that sees the file sees it whole.
        let path = path.as_ref();
        let mut partial = path.as_os_str().to_owned();
        partial.push(".partial");
        std::fs::write(&partial, yaml)?;
        std::fs::rename(&partial, path)
    }

    /// A superuser client.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        Self::client_for(self.kubeconfig()).await
    }

    /// A client authenticating with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client, ClientError> {
        Self::client_for(self.kubeconfig_with_token("token-user", token)).await
    }

    /// The client settings for authenticating with `token` (to tune before building one).
    pub async fn config_with_token(&self, token: &str) -> Result<kube::Config, ClientError> {
        let kubeconfig = self.kubeconfig_with_token("token-user", token);
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    async fn client_for(kubeconfig: Kubeconfig) -> Result<kube::Client, ClientError> {
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Issues a service-account token with any lifetime (TokenRequest insists on 10 minutes).
    pub fn issue_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[&str],
        ttl: Duration,
    ) -> Result<String, crate::error::ApiError> {
        self.sim
            .tokens
            .issue_for_account(
                &self.sim.store,
                namespace,
                service_account,
                audiences.iter().map(|s| s.to_string()).collect(),
                ttl,
            )
            .map(|(token, _)| token)
    }

    /// Every bearer token this cluster knows (issued, or the kubeconfig's): tests assert none
    /// of them appears in log output.
    pub fn issued_tokens(&self) -> Vec<String> {
        self.sim.tokens.all()
    }

    /// The request log.
    pub fn requests(&self) -> Vec<RequestCount> {
        self.sim.requests.snapshot()
    }

    /// Sum of logged requests matching `filter`.
    pub fn count_requests(&self, filter: impl Fn(&crate::requests::RequestKey) -> bool) -> u64 {
        self.sim.requests.count(filter)
    }

    /// Clears the request log.
    pub fn reset_requests(&self) {
        self.sim.requests.reset();
    }

    /// Ends every open watch stream now.
    pub fn close_watches(&self) {
        self.sim.watch_closer.send_modify(|n| *n += 1);
    }

    /// The next watch that resumes from a revision gets `410 Gone`, and so must relist.
    pub fn expire_next_watch(&self) {
        self.sim
            .expire_next_watch
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops the change history: every watch resuming from an earlier revision gets `410 Gone`.
    pub fn compact(&self) {
        self.sim.store.compact();
    }

    /// Faults to inject: rejections, node loss, API errors, latency, review outages.
    pub fn faults(&self) -> &crate::faults::Faults {
        &self.sim.faults
    }

    /// Registers another node (its kubelet serves it at once).
    pub fn add_node(&self, node: crate::config::NodeConfig) {
        let index = self.sim.store.list("/nodes", None).0.len();
        let Some(rt) = self.sim.resource_type("", "v1", "nodes") else {
            return;
        };
        let _ = self.sim.create(
            &rt,
            "",
            node.object(index),
            &crate::sim::WriteContext::system("kubelet"),
        );
    }

    /// Deletes a node, as `kubectl delete node` does; its pods are garbage-collected.
    pub fn delete_node(&self, name: &str) -> Result<(), crate::error::ApiError> {
        let rt = self
            .sim
            .resource_type("", "v1", "nodes")
            .ok_or_else(crate::error::ApiError::no_such_path)?;
        self.sim
            .delete(
                &rt,
                "",
                name,
                &Default::default(),
                &crate::sim::WriteContext::system("kubectl"),
            )
            .map(|_| ())
    }

    /// The current global revision.
    pub fn revision(&self) -> u64 {
        self.sim.store.revision()
    }

    /// Stops the server and the controllers.
    pub fn shutdown(mut self) {
        self.tasks.abort_all();
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}
