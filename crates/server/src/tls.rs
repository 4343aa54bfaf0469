//! TLS for the endpoints, through rustls. It fails closed: a certificate or
//! key that cannot be loaded stops the server from starting, and nothing
//! ever falls back to plaintext.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;

use crate::ServerError;

/// A certificate chain and its private key, PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The acceptor for `files`, or an error that names the file and what is
/// wrong with it.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, ServerError> {
    let bad = |path: &Path, message: String| ServerError::Tls { path: path.to_path_buf(), message };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| bad(&files.cert, format!("cannot read a PEM certificate chain: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&files.cert, format!("not a PEM certificate chain: {e}")))?;
    if certs.is_empty() {
        return Err(bad(&files.cert, "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad(&files.key, format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}")))?;
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&files.cert, format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad(&files.cert, format!("the certificate and the key {} do not make a TLS identity: {e}", files.key.display())))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
