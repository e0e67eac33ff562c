//! The sim's certificate authority and serving certificate. kubectl (client-go) sends bearer
//! tokens only over TLS, so the API server is HTTPS; the CA goes into the kubeconfig and into
//! pods as `ca.crt`.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why TLS material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A CA that signs serving certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
}

impl Authority {
    pub fn generate() -> Result<Self, TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "berth-sim-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Authority {
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A certificate for `names` (DNS names or IP addresses), as (chain, key).
    pub fn issue(
        &self,
        names: &[&str],
    ) -> Result<
        (
            Vec<CertificateDer<'static>>,
            PrivateKeyDer<'static>,
            String,
            String,
        ),
        TlsError,
    > {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("berth-sim"),
        );
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((
            vec![cert.der().clone(), self.ca_der.clone()],
            key_der,
            cert.pem(),
            key.serialize_pem(),
        ))
    }

    /// A client certificate for user `name` in the groups `organizations`, as (certificate,
    /// key), PEM.
    pub fn issue_client(
        &self,
        name: &str,
        organizations: &[&str],
    ) -> Result<(String, String), TlsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        for organization in organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *organization);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A certificate for a certificate signing request, valid for `ttl` (backdated five
    /// minutes when that is 8 hours or more, as the controller manager's signer does), with
    /// the usages `usages` sets; PEM.
    pub fn sign_request(
        &self,
        mut request: rcgen::CertificateSigningRequestParams,
        ttl: std::time::Duration,
        usages: impl FnOnce(&mut CertificateParams),
    ) -> Result<String, TlsError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        let backdate = if ttl >= std::time::Duration::from_secs(8 * 3600) {
            300
        } else {
            0
        };
        let at = |seconds: i64| {
            time::OffsetDateTime::from_unix_timestamp(seconds)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        };
        let params = &mut request.params;
        params.not_before = at(now - backdate);
        params.not_after = at(now + ttl.as_secs() as i64 - backdate);
        params.is_ca = IsCa::ExplicitNoCa;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&rand::random::<[u8; 16]>()));
        params.use_authority_key_identifier_extension = true;
        usages(params);
        Ok(request.signed_by(&self.issuer)?.pem())
    }

    /// A rustls server configuration serving a certificate for `names`, speaking HTTP/2 and
    /// HTTP/1.1. A client may present a certificate of this CA (it is then that user, as with
    /// the API server's `--client-ca-file`) or none.
    pub fn server_config(&self, names: &[&str]) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let (chain, key, _, _) = self.issue(names)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The user a verified client certificate names: its common name, and its organizations as
/// groups, as the API server's x509 authenticator reads them.
pub fn client_identity(certificate: &CertificateDer<'_>) -> Option<crate::auth::Identity> {
    use x509_parser::prelude::FromDer;
    let (_, parsed) = x509_parser::certificate::X509Certificate::from_der(certificate).ok()?;
    let subject = parsed.subject();
    let username = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    groups.push("system:authenticated".to_owned());
    Some(crate::auth::Identity {
        username,
        uid: String::new(),
        groups,
    })
}

/// A client configuration that trusts the certificates of `bundle` (PEM) as Go's TLS client
/// does, which is how kube-apiserver calls webhooks: a chain to one of them, or a serving
/// certificate that is itself one of them (a self-signed certificate made with `openssl req
/// -x509` is its own CA, which webpki alone refuses as `CaUsedAsEndEntity`). The name and the
/// validity period are checked either way.
pub fn go_client_config(bundle: &[u8]) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let mut trusted = vec![];
    for cert in CertificateDer::pem_slice_iter(bundle).flatten() {
        roots.add(cert.clone()).map_err(|e| e.to_string())?;
        trusted.push(cert);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| e.to_string())?;
    let verifier = Arc::new(GoVerifier { inner, trusted });
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

#[derive(Debug)]
struct GoVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    trusted: Vec<CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let refused = match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(refused) => refused,
        };
        // Go accepts a leaf that is itself in the trusted pool (a chain of one).
        if !self
            .trusted
            .iter()
            .any(|t| t.as_ref() == end_entity.as_ref())
        {
            return Err(refused);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        cert.verify_is_valid_for_subject_name(server_name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        let (_, parsed) = x509_parser::parse_x509_certificate(end_entity.as_ref())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let seconds = now.as_secs() as i64;
        let validity = parsed.validity();
        if seconds < validity.not_before.timestamp() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidYet,
            ));
        }
        if seconds > validity.not_after.timestamp() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Expired,
            ));
        }
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `names` that is its own CA, as `openssl req -x509` makes.
    fn self_signed_ca(names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), der, cert.pem())
    }

    /// Serves one TLS handshake with `cert` and returns whether a client trusting `bundle`
    /// and asking for `name` completed it.
    async fn handshake(
        cert: &CertificateDer<'static>,
        key: &PrivateKeyDer<'static>,
        bundle: &str,
        name: &str,
    ) -> bool {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key.clone_key())
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let serving = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(stream).await;
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(
            go_client_config(bundle.as_bytes()).unwrap(),
        ));
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
        let done = connector.connect(name, stream).await.is_ok();
        serving.abort();
        done
    }

    #[tokio::test]
    async fn a_self_signed_serving_certificate_that_is_its_own_ca_is_trusted_as_go_trusts_it() {
        let (cert, key, pem) = self_signed_ca(&["hook.default.svc"]);
        assert!(handshake(&cert, &key, &pem, "hook.default.svc").await);
        // The name is still checked, and only the bundle is trusted.
        assert!(!handshake(&cert, &key, &pem, "other.default.svc").await);
        let (_, _, stranger) = self_signed_ca(&["hook.default.svc"]);
        assert!(!handshake(&cert, &key, &stranger, "hook.default.svc").await);
        // A certificate the bundle's CA signed is trusted as before.
        let authority = Authority::generate().unwrap();
        let (chain, key, _, _) = authority.issue(&["hook.default.svc"]).unwrap();
        assert!(handshake(&chain[0], &key, authority.ca_pem(), "hook.default.svc").await);
    }
}
