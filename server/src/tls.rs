//! TLS for ferryd: loading the certificate and key (and, for mutual TLS, the CA that signs
//! client certificates), replacing them while serving ([`Certificate::reload`] and
//! [`config_presenting`], on SIGHUP), and `ferryd gen-cert`'s self-signed pair.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::Current;

/// Why TLS could not be set up; one line each.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the combination.
    #[error("TLS setup: {0}")]
    Config(String),
}

fn file_err(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The certificates in a PEM file.
///
/// # Errors
/// Unreadable, or no certificate in it.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, format!("cannot read certificates: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(
            path,
            "no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The private key in a PEM file.
///
/// # Errors
/// Unreadable, or no key in it.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        file_err(
            path,
            format!("no usable private key (PEM PKCS#8, RSA or EC): {e}"),
        )
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate ferryd presents, read from its files, and read again by [`reload`]
/// (ferryd on SIGHUP): connections from then on get the new one, those open keep theirs.
///
/// [`reload`]: Certificate::reload
#[derive(Debug)]
pub struct Certificate {
    cert: PathBuf,
    key: PathBuf,
    current: Current<Arc<CertifiedKey>>,
}

impl Certificate {
    /// Reads `cert` and `key`.
    ///
    /// # Errors
    /// Unreadable files, a key that does not match the certificate.
    pub fn load(cert: &Path, key: &Path) -> Result<Certificate, TlsError> {
        Ok(Certificate {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            current: Current::new(Arc::new(certified_key(cert, key)?)),
        })
    }

    /// Reads the files again and presents what they hold from now on; returns its
    /// fingerprint (`SHA256:…`). On an error the certificate in use stays.
    ///
    /// # Errors
    /// As [`Certificate::load`].
    pub fn reload(&self) -> Result<String, TlsError> {
        let new = Arc::new(certified_key(&self.cert, &self.key)?);
        let fp = fingerprint_of(&new);
        self.current.set(new);
        Ok(fp)
    }

    /// The fingerprint of the certificate presented now (`SHA256:…`).
    pub fn fingerprint(&self) -> String {
        fingerprint_of(&self.current.get())
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.get())
    }
}

/// The fingerprint (`SHA256:…`) of `k`'s certificate.
fn fingerprint_of(k: &CertifiedKey) -> String {
    k.end_entity_cert()
        .map(|c| ferry_proto::auth::fingerprint(c.as_ref()))
        .unwrap_or_default()
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert)?;
    let key_der = load_key(key)?;
    CertifiedKey::from_der(chain, key_der, &provider())
        .map_err(|e| file_err(key, format!("does not go with {}: {e}", cert.display())))
}

/// The server's TLS configuration: `cert`/`key`, and with `client_ca` mutual TLS (clients
/// must present a certificate signed by it); and the certificate, to [`Certificate::reload`].
///
/// # Errors
/// Unreadable files, a key that does not match the certificate.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<(Arc<rustls::ServerConfig>, Arc<Certificate>), TlsError> {
    let certificate = Arc::new(Certificate::load(cert, key)?);
    let cfg = config_presenting(certificate.clone(), client_ca)?;
    Ok((cfg, certificate))
}

/// A TLS configuration presenting `certificate` (as it is when each connection starts), with
/// `client_ca`, read now, checking clients' certificates. ferryd builds one again on SIGHUP
/// to read `--client-ca` again.
///
/// # Errors
/// An unreadable CA file, or none in it.
pub fn config_presenting(
    certificate: Arc<Certificate>,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| file_err(ca, format!("not a usable CA certificate: {e}")))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_cert_resolver(certificate)))
}

/// Writes a new self-signed certificate for `names` (DNS names or IP addresses) and its key
/// (mode 0600) as PEM; returns the certificate's fingerprint (`SHA256:…`).
///
/// # Errors
/// Invalid names, files that cannot be written.
pub fn gen_cert(cert: &Path, key: &Path, names: &[String]) -> Result<String, TlsError> {
    let ck = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::Config(format!("cannot make a certificate for {names:?}: {e}")))?;
    let write = |path: &Path, text: &str, mode: u32| -> Result<(), TlsError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)
            .map_err(|e| file_err(path, format!("cannot write: {e}")))?;
        f.write_all(text.as_bytes())
            .map_err(|e| file_err(path, format!("cannot write: {e}")))
    };
    write(key, &ck.key_pair.serialize_pem(), 0o600)?;
    write(cert, &ck.cert.pem(), 0o644)?;
    Ok(ferry_proto::auth::fingerprint(ck.cert.der()))
}
