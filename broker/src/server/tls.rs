//! TLS for the client listener and the links between brokers (issue 42).
//!
//! `strand serve --tls-cert FILE --tls-key FILE` turns it on for both:
//! every connection the listener accepts is a TLS 1.3 (1.2 allowed)
//! server session presenting this broker's certificate, and every link
//! this broker opens to another (`peer::link`: replication, the
//! controller, forwarded calls) is a client session that verifies the
//! other broker's certificate against `--tls-ca` (default:
//! `--tls-client-ca`) for the address it dials, and presents this
//! broker's own certificate (so a cluster that requires client
//! certificates takes its brokers' links). `--tls-client-ca FILE`
//! requires and verifies client certificates on the listener (mTLS).
//!
//! Runs on: the main thread loads and checks the files at start (one line
//! naming the file and the reason: unreadable, no certificate or key, a
//! key that is not the certificate's, a certificate not yet or no longer
//! valid) and on SIGHUP re-reads the certificate and key
//! ([`ServerTls::reload`]; a bad pair is logged and the old one kept);
//! the shards' sessions take the current pair at each handshake
//! ([`Identity`], shared by every shard behind a lock read once per
//! handshake).

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use strand_client::tls::{load_certs, load_key, provider, roots};

use crate::config::TlsFiles;

/// This broker's certificate and key, swapped whole on a reload.
#[derive(Debug)]
pub struct Identity {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Identity {
    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

impl rustls::server::ResolvesServerCert for Identity {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for Identity {
    fn resolve(&self, _issuers: &[&[u8]], _schemes: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The listener's and the peer links' configurations.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: futures_rustls::TlsAcceptor,
    pub connector: crate::frame_io::PeerTls,
    identity: Arc<Identity>,
}

impl ServerTls {
    /// Loads and checks `files`; `Err` is one line naming the file and the
    /// problem.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, String> {
        let identity = Arc::new(Identity {
            current: RwLock::new(Arc::new(certified_key(&files.cert, &files.key)?)),
            files: files.clone(),
        });
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let server = match &files.client_ca {
            Some(ca) => {
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                        .build()
                        .map_err(|e| format!("{}: {e}", ca.display()))?;
                server.with_client_cert_verifier(verifier)
            }
            None => server.with_no_client_auth(),
        };
        let server = server.with_cert_resolver(identity.clone());
        let peer_ca = files
            .peer_ca
            .as_ref()
            .or(files.client_ca.as_ref())
            .ok_or("no CA for the other brokers' certificates (give --tls-ca or --tls-client-ca)")?;
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(peer_ca)?)
            .with_client_cert_resolver(identity.clone());
        Ok(ServerTls {
            acceptor: futures_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: crate::frame_io::PeerTls(futures_rustls::TlsConnector::from(Arc::new(client))),
            identity,
        })
    }

    /// Re-reads the certificate and key (SIGHUP): new handshakes use them;
    /// sessions already open go on. `Err`: the old pair stays.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = certified_key(&self.identity.files.cert, &self.identity.files.key)?;
        match self.identity.current.write() {
            Ok(mut c) => *c = Arc::new(fresh),
            Err(p) => *p.into_inner() = Arc::new(fresh),
        }
        Ok(())
    }
}

/// The certificate chain of `cert` with the key of `key`, checked: the key
/// is the leaf's, and the leaf is valid now.
fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = load_certs(cert)?;
    check_validity(cert, &chain[0])?;
    let key_der = load_key(key)?;
    let signing = provider()
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| format!("{}: not a usable private key: {e}", key.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| format!("{} is not the key of {} ({e})", key.display(), cert.display()))?;
    Ok(certified)
}

/// `Err` naming `path` if the certificate is not valid at this moment.
fn check_validity(path: &Path, leaf: &CertificateDer<'_>) -> Result<(), String> {
    use x509_parser::prelude::*;
    let (_, parsed) =
        X509Certificate::from_der(leaf).map_err(|e| format!("{}: not a readable certificate: {e}", path.display()))?;
    let validity = parsed.validity();
    let now = ASN1Time::now();
    if now < validity.not_before {
        return Err(format!("{}: not valid before {}", path.display(), validity.not_before));
    }
    if now > validity.not_after {
        return Err(format!("{}: expired on {}", path.display(), validity.not_after));
    }
    Ok(())
}
