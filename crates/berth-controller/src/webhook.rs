//! `berth webhook`: the validating admission webhook that keeps a Workspace from granting its
//! author what they do not already have. The API server tells it who is creating or changing
//! a Workspace's spec (`userInfo`, which nobody can write); for every object the pod would use
//! on their behalf ([`berth_api::WorkspaceSpec::references`]: the service account it runs as,
//! secrets and config maps it reads, claims it mounts) it asks SubjectAccessReview whether
//! that user may do it directly, and refuses the request, naming the user, the verb, the
//! object and the field, when they may not. It also refuses what the operator's pod policy
//! would ([`crate::pod_policy`]: tolerations, node selection, reserved or unlisted label and
//! annotation prefixes), so the user hears it from `kubectl` at once rather than from the
//! workspace's status. A spec that did not change (status, labels, finalizers) is not checked
//! again; a review API that fails refuses (fail closed).

use std::{net::SocketAddr, sync::Arc};

use axum::{Json, Router, extract::State, routing::post};
use berth_api::{Reference, Workspace};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{
    Api, Client,
    api::PostParams,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
    },
};
use tracing::{info, warn};

/// The path the API server posts AdmissionReviews to.
pub const PATH: &str = "/validate-workspaces";

/// What the webhook checks with: a client for SubjectAccessReview, and the pod policy.
#[derive(Clone)]
pub struct Checker {
    pub client: Client,
    pub policy: crate::pod_policy::PodPolicy,
}

/// The decision on one request: `None` allows it, `Some(message)` refuses it.
pub async fn decide(checker: &Checker, request: &AdmissionRequest<Workspace>) -> Option<String> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let workspace = request.object.as_ref()?;
    if request.old_object.as_ref().map(|old| &old.spec) == Some(&workspace.spec) {
        return None;
    }
    if let Some(violation) = crate::pod_policy::violation(&workspace.spec, &checker.policy) {
        return Some(format!("{violation}; ask the platform team to allow it"));
    }
    let namespace = request.namespace.clone().unwrap_or_default();
    let user = &request.user_info;
    let username = user.username.clone().unwrap_or_default();
    let reviews: Api<SubjectAccessReview> = Api::all(checker.client.clone());
    for reference in workspace.spec.references() {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.clone()),
                    verb: Some(reference.verb.to_owned()),
                    group: Some(String::new()),
                    resource: Some(reference.resource.to_owned()),
                    subresource: (!reference.subresource.is_empty())
                        .then(|| reference.subresource.to_owned()),
                    name: Some(reference.name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => return Some(refusal(&username, &namespace, &reference)),
            Err(error) => {
                return Some(format!(
                    "cannot check whether user {username:?} may {} {} in the namespace {namespace:?} (SubjectAccessReview: {error}); try again",
                    reference.verb,
                    object(&reference)
                ));
            }
        }
    }
    None
}

fn object(reference: &Reference) -> String {
    match reference.subresource {
        "" => format!("{} {:?}", reference.resource, reference.name),
        sub => format!("{}/{sub} {:?}", reference.resource, reference.name),
    }
}

fn refusal(username: &str, namespace: &str, reference: &Reference) -> String {
    format!(
        "User {username:?} cannot {} {} in the namespace {namespace:?}, which {} names; a workspace may use only what its author may use directly",
        reference.verb,
        object(reference),
        reference.field
    )
}

async fn review(
    State(checker): State<Checker>,
    Json(review): Json<AdmissionReview<Workspace>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Workspace> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            warn!(%error, "an AdmissionReview without a request");
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let response = match decide(&checker, &request).await {
        None => response,
        Some(message) => {
            info!(
                user = request.user_info.username.as_deref().unwrap_or_default(),
                namespace = request.namespace.as_deref().unwrap_or_default(),
                workspace = %request.name,
                %message,
                "refused a workspace spec"
            );
            let mut denied = response.deny(message);
            denied.result.code = 403;
            denied.result.reason = "Forbidden".to_owned();
            denied
        }
    };
    Json(response.into_review())
}

/// Serves the webhook over TLS on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    checker: Checker,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let router = Router::new().route(PATH, post(review)).with_state(checker);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let accept = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown => {}
    }
}

/// The rustls configuration for a PEM certificate chain and key.
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot read the certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("cannot read the private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("bad certificate or key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Where `berth webhook` listens by default.
pub fn default_address() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8443))
}
