//! What "running a container" means in the sim: a trait the embedder provides. The default
//! runtime runs nothing (containers just run until stopped; init containers succeed); the
//! `berth` binary provides one that runs the Berth agent in-process.

use std::{future::Future, net::Ipv4Addr, pin::Pin, sync::Arc};

use serde_json::Value;
use tokio::sync::oneshot;

/// Everything a container gets from its pod, as a real kubelet would give it.
#[derive(Clone, Debug)]
pub struct ContainerContext {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// The pod object as the kubelet saw it when starting the container.
    pub pod: Value,
    /// The container's spec.
    pub container: Value,
    pub init: bool,
    /// The pod's IP, a unique loopback address: a server may bind it.
    pub pod_ip: Ipv4Addr,
    /// A token of the pod's service account (audience: the API server).
    pub token: String,
    /// `https://127.0.0.1:<port>`, what `KUBERNETES_SERVICE_HOST`/`PORT` point at.
    pub api_server: String,
    /// The cluster CA, what `ca.crt` holds.
    pub ca_pem: String,
    /// The files of the secret, config map, downward API and projected volumes mounted into
    /// this container, by path (the service-account token, `ca.crt` and `namespace` among
    /// them, unless the pod opted out).
    pub files: std::collections::BTreeMap<String, Vec<u8>>,
    /// The container's environment, references resolved, with `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT`, in order.
    pub env: Vec<(String, String)>,
}

/// A started container: it reports its exit code once, and stops when asked.
pub struct RunningContainer {
    /// Resolves with the exit code when the container exits by itself or after a stop.
    pub exited: oneshot::Receiver<i32>,
    /// Asks the container to stop (SIGTERM); dropping it does too.
    pub stop: oneshot::Sender<()>,
}

/// A boxed future, as the runtime trait returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs containers for the sim's kubelets.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Starts a container; an error is reported like a failed container start.
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>>;
}

/// Containers without processes: a main container runs until stopped (then exits 0), an
/// init container exits 0 at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdleRuntime;

impl ContainerRuntime for IdleRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        Box::pin(async move {
            let (exit_tx, exited) = oneshot::channel();
            let (stop, stop_rx) = oneshot::channel::<()>();
            if context.init {
                let _ = exit_tx.send(0);
            } else {
                tokio::spawn(async move {
                    let _ = stop_rx.await;
                    let _ = exit_tx.send(0);
                });
            }
            Ok(RunningContainer { exited, stop })
        })
    }
}

/// The runtime a cluster uses.
pub type SharedRuntime = Arc<dyn ContainerRuntime>;
