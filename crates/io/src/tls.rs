//! HTTPS on the event loop: rustls as a pure state machine between the
//! socket operations the loop already does.
//!
//! rustls needs no socket of its own: ciphertext the loop received is fed to
//! it, plaintext comes out into the request's head or body buffer, and what
//! it wants to send is written into a buffer the loop sends. So TLS costs
//! the encryption and one copy of the plaintext, nothing else — the paper's
//! point that HTTPS inside a trusted network is optional, but affordable.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// Ciphertext received per operation.
pub(crate) const TLS_RECV: usize = 256 << 10;
/// Plaintext handed to rustls per send.
pub(crate) const TLS_SEND: usize = 256 << 10;

/// A client configuration trusting the system's roots and, if given, the
/// certificates of a PEM file (a private store's own CA).
pub fn client_config(extra_ca_pem: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    // Missing or unreadable system roots leave only the extra ones.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = extra_ca_pem {
        let certs = CertificateDer::pem_file_iter(path).map_err(|e| format!("cannot read CA certificates from {}: {e}", path.display()))?;
        let mut n = 0;
        for cert in certs {
            let cert = cert.map_err(|e| format!("bad certificate in {}: {e}", path.display()))?;
            roots.add(cert).map_err(|e| format!("unusable certificate in {}: {e}", path.display()))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("{} holds no certificates", path.display()));
        }
    }
    let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A new client session for `host` (a name or an IP address, no port).
pub(crate) fn connect(config: &Arc<ClientConfig>, host: &str) -> Result<Box<ClientConnection>, String> {
    let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string()).map_err(|e| format!("'{host}' is not a valid TLS server name: {e}"))?;
    ClientConnection::new(config.clone(), name).map(Box::new).map_err(|e| e.to_string())
}

/// The TLS side of one attempt.
pub(crate) struct TlsState {
    pub conn: Box<ClientConnection>,
    /// Ciphertext: received (recv) or to send (send).
    pub buf: Vec<u8>,
    /// Bytes of `buf` sent so far.
    pub sent: usize,
    /// The operation in the ring is a send of `buf` (else a recv into it).
    pub sending: bool,
}

impl TlsState {
    pub fn new(conn: Box<ClientConnection>) -> Self {
        TlsState { conn, buf: Vec::new(), sent: 0, sending: false }
    }

    /// Moves what rustls wants to send into `buf`; true if there is any.
    pub fn fill_outgoing(&mut self) -> bool {
        self.buf.clear();
        self.sent = 0;
        while self.conn.wants_write() {
            if self.conn.write_tls(&mut self.buf).is_err() {
                break;
            }
        }
        !self.buf.is_empty()
    }
}
