//! TLS for the client: verifying the server against a CA file or a pinned certificate
//! fingerprint, and an optional client certificate for mutual TLS.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;

/// How to trust the server, and who we are.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// Verify the server's certificate chain against these CA certificates (PEM).
    pub ca: Option<PathBuf>,
    /// Accept exactly the certificate with this SHA-256 (of its DER).
    pub fingerprint: Option<[u8; 32]>,
    /// Client certificate (PEM), for servers that require one.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

/// A ready client TLS configuration.
#[derive(Clone)]
pub struct TlsClient {
    pub(crate) config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsClient")
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &PathBuf, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let v: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what} {}: not a PEM certificate file: {e}", path.display()))?;
    if v.is_empty() {
        return Err(format!(
            "{what} {}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(v)
}

impl TlsClient {
    /// Builds the configuration.
    ///
    /// # Errors
    /// Neither a CA nor a fingerprint; unreadable files; a key that does not match.
    pub fn new(opts: &TlsOptions) -> Result<TlsClient, String> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match (&opts.ca, opts.fingerprint) {
            (Some(ca), None) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca, "--ca")? {
                    roots.add(c).map_err(|e| {
                        format!("--ca {}: not a usable CA certificate: {e}", ca.display())
                    })?;
                }
                builder.with_root_certificates(roots)
            }
            (None, Some(pin)) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned {
                    pin,
                    provider: provider(),
                })),
            (Some(_), Some(_)) => {
                return Err("give either --ca or --tls-fingerprint, not both".into())
            }
            (None, None) => {
                return Err(
                    "--tls needs a way to check the server: --ca FILE (its CA) or --tls-fingerprint SHA256:… (as `ferryd gen-cert` printed)"
                        .into(),
                )
            }
        };
        let config = match (&opts.cert, &opts.key) {
            (Some(cert), Some(key)) => {
                let chain = certs(cert, "--cert")?;
                let k = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("--key {}: no usable private key: {e}", key.display()))?;
                builder.with_client_auth_cert(chain, k).map_err(|e| {
                    format!(
                        "--key {} does not go with --cert {}: {e}",
                        key.display(),
                        cert.display()
                    )
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("--cert and --key go together".into()),
        };
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }
}

/// Accepts exactly one certificate, by the SHA-256 of its DER (like an SSH host key); the
/// handshake's signatures are still verified against it.
#[derive(Debug)]
struct Pinned {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = ferry_proto::auth::sha256(end_entity);
        if ferry_proto::auth::same(&got, &self.pin) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!(
                "the server's certificate is {}, not the one pinned with --tls-fingerprint",
                ferry_proto::auth::fingerprint(end_entity)
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One line for a failed TLS handshake.
pub(crate) fn explain(e: &std::io::Error) -> String {
    use rustls::CertificateError as C;
    let Some(r) = e.get_ref().and_then(|x| x.downcast_ref::<rustls::Error>()) else {
        return format!("TLS handshake failed: {e}");
    };
    match r {
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the server's certificate has expired: renew it on the server".into()
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "the server's certificate is not valid yet (check both clocks)".into()
        }
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "the server's certificate is not signed by the --ca given: check --ca, or pin it with --tls-fingerprint".into()
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => "the server's certificate is not for this host name: connect by a name it lists, or pin it with --tls-fingerprint".into(),
        rustls::Error::General(m) => m.clone(),
        rustls::Error::AlertReceived(a) => format!(
            "the server refused the TLS handshake ({a:?}): does it require a client certificate (--cert/--key)?"
        ),
        other => format!("TLS handshake failed: {other}"),
    }
}

pub use ferry_proto::auth::Token;
