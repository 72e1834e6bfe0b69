//! TLS for the client: verifying the server against a CA file or a pinned certificate
//! fingerprint, and an optional client certificate for mutual TLS.
//!
//! [`TlsClient::new`] turns the options into a rustls configuration, failing with a
//! [`TlsConfigError`] that names the option at fault. At connect time a [`TlsError`]
//! explains a failed TLS handshake in one line (an expired certificate, an unknown CA, a
//! pin that does not match, a client certificate the server wants).

use std::path::{Path, PathBuf};
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

/// Why the TLS options cannot make a configuration; each names the option at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The crypto provider offers no usable protocol versions.
    #[error("{0}")]
    Provider(#[source] rustls::Error),
    /// A certificate file cannot be read.
    #[error("{flag} {}: cannot read it: {source}", path.display())]
    Unreadable {
        /// The option (`--ca`, `--cert`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A certificate file is not PEM.
    #[error("{flag} {}: not a PEM certificate file: {source}", path.display())]
    NotPem {
        /// The option (`--ca`, `--cert`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A certificate file holds no certificate.
    #[error("{flag} {}: no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate {
        /// The option (`--ca`, `--cert`).
        flag: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A `--ca` certificate cannot serve as a trust anchor.
    #[error("--ca {}: not a usable CA certificate: {source}", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// Both `--ca` and `--tls-fingerprint`.
    #[error("give either --ca or --tls-fingerprint, not both")]
    CaAndFingerprint,
    /// Neither `--ca` nor `--tls-fingerprint`: nothing to check the server against.
    #[error("--tls needs a way to check the server: --ca FILE (its CA) or --tls-fingerprint SHA256:… (as `ferryd gen-cert` printed)")]
    NoVerifier,
    /// The `--key` file holds no usable key.
    #[error("--key {}: no usable private key: {source}", path.display())]
    BadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The key is not the certificate's.
    #[error("--key {} does not go with --cert {}: {source}", key.display(), cert.display())]
    KeyMismatch {
        /// The `--cert` file.
        cert: PathBuf,
        /// The `--key` file.
        key: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// Only one of `--cert` and `--key`.
    #[error("--cert and --key go together")]
    CertWithoutKey,
}

/// Why TLS with the server failed, in one line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    /// The address's host cannot be matched against a certificate.
    #[error("{host} cannot be checked against a certificate: {source}")]
    ServerName {
        /// The host part of the address.
        host: String,
        /// rustls's reason.
        #[source]
        source: Arc<rustls::pki_types::InvalidDnsNameError>,
    },
    /// The TLS handshake failed, or the server ended it with an alert (TLS 1.3 reports a
    /// refused client certificate only when the first frame is read).
    #[error("{}", explain(.0))]
    Handshake(#[source] Arc<std::io::Error>),
}

fn certs(path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let v: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsConfigError::Unreadable {
            flag,
            path: path.to_path_buf(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| TlsConfigError::NotPem {
            flag,
            path: path.to_path_buf(),
            source,
        })?;
    if v.is_empty() {
        return Err(TlsConfigError::NoCertificate {
            flag,
            path: path.to_path_buf(),
        });
    }
    Ok(v)
}

/// The host part of `host:port` (`[v6]:port` too), as a TLS server name.
pub(crate) fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, TlsError> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => addr,
    };
    rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| TlsError::ServerName {
        host: host.to_string(),
        source: Arc::new(e),
    })
}

impl TlsClient {
    /// Builds the configuration.
    ///
    /// # Errors
    /// Neither a CA nor a fingerprint; unreadable files; a key that does not match.
    pub fn new(opts: &TlsOptions) -> Result<TlsClient, TlsConfigError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsConfigError::Provider)?;
        let builder = match (&opts.ca, opts.fingerprint) {
            (Some(ca), None) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca, "--ca")? {
                    roots.add(c).map_err(|source| TlsConfigError::BadCa {
                        path: ca.clone(),
                        source,
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
            (Some(_), Some(_)) => return Err(TlsConfigError::CaAndFingerprint),
            (None, None) => return Err(TlsConfigError::NoVerifier),
        };
        let config = match (&opts.cert, &opts.key) {
            (Some(cert), Some(key)) => {
                let chain = certs(cert, "--cert")?;
                let k =
                    PrivateKeyDer::from_pem_file(key).map_err(|source| TlsConfigError::BadKey {
                        path: key.clone(),
                        source,
                    })?;
                builder.with_client_auth_cert(chain, k).map_err(|source| {
                    TlsConfigError::KeyMismatch {
                        cert: cert.clone(),
                        key: key.clone(),
                        source,
                    }
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) | (None, Some(_)) => return Err(TlsConfigError::CertWithoutKey),
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
fn explain(e: &std::io::Error) -> String {
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
