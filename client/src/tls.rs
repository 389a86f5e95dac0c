//! TLS for the client (issue 42): loading PEM files, the rustls client
//! configuration, and the process's default one.
//!
//! A [`Connection`](crate::Connection) made while a configuration is set
//! ([`set_default`]; the `strand` CLI sets it from `--tls-ca`,
//! `--tls-cert`, `--tls-key`) speaks TLS 1.3 (1.2 allowed) with the
//! broker, verifying the broker's certificate against the given CA for
//! the host or IP address it connects to, and presenting a client
//! certificate when one is given (mTLS). rustls with the ring provider: no
//! OpenSSL.
//!
//! Runs on: the thread that connects (the handshake, synchronously) and
//! then the connection's reader thread and writers, which share the
//! rustls state under a mutex held only to encrypt or decrypt, never
//! across a socket call (`connection.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The certificates of a PEM file, in order; an error naming the file and
/// what is wrong with it.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&text)
        .map_err(|e| format!("{}: holds no usable PEM private key: {e}", path.display()))
}

/// The crypto provider every configuration uses: *ring*, which builds
/// with no C or C++ toolchain beyond a C compiler. rustls 0.23.48 marks it
/// deprecated because it has no post-quantum key exchange (aws-lc-rs
/// has); moving to that provider is a choice for later, with its build.
#[allow(deprecated)]
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The trust roots of the CA file at `ca`.
pub fn roots(ca: &Path) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
    }
    Ok(roots)
}

/// What a client needs for TLS: the CA that signed the brokers'
/// certificates, and for mTLS its own certificate and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// These files, the CA from `$STRAND_TLS_CA` when none is given.
    pub fn or_env(mut self) -> TlsFiles {
        if self.ca.is_none() {
            self.ca = std::env::var_os("STRAND_TLS_CA").map(PathBuf::from);
        }
        self
    }

    /// Makes the configuration of these files the default of every
    /// connection made from now on ([`set_default`]; plaintext without a
    /// CA), or says which file is wrong and how.
    pub fn install(&self) -> Result<(), String> {
        set_default(self.client_config()?);
        Ok(())
    }

    /// The client configuration, `None` without a CA (plaintext); an error
    /// naming the file and the problem.
    pub fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>, String> {
        let Some(ca) = &self.ca else {
            if self.cert.is_some() || self.key.is_some() {
                return Err(
                    "a client certificate and key (--tls-cert, --tls-key) need the CA of the brokers' certificates \
                     (--tls-ca or $STRAND_TLS_CA)"
                        .into(),
                );
            }
            return Ok(None);
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots(ca)?);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
                .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?,
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("a client certificate and its key (--tls-cert, --tls-key) go together".into()),
        };
        Ok(Some(Arc::new(config)))
    }
}

static DEFAULT: RwLock<Option<Arc<rustls::ClientConfig>>> = RwLock::new(None);

/// Sets the configuration every connection made from now on uses (`None`:
/// plaintext).
pub fn set_default(config: Option<Arc<rustls::ClientConfig>>) {
    if let Ok(mut d) = DEFAULT.write() {
        *d = config;
    }
}

/// The configuration new connections use, if any.
pub fn default_config() -> Option<Arc<rustls::ClientConfig>> {
    DEFAULT.read().ok().and_then(|d| d.clone())
}

/// The name a broker's certificate must hold for `addr` (`host:port`):
/// its IP address, or its host name.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
        None => addr,
    };
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is no name a certificate can hold: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_address() {
        assert!(matches!(
            server_name("127.0.0.1:9400").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(server_name("[::1]:9400").unwrap(), ServerName::IpAddress(_)));
        assert!(matches!(
            server_name("broker-1.example:9400").unwrap(),
            ServerName::DnsName(_)
        ));
    }

    #[test]
    fn bad_files_are_named_with_their_problem() {
        let dir = std::env::temp_dir().join(format!("strand-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = load_certs(&missing).unwrap_err();
        assert!(e.contains("missing.pem"), "{e}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = load_certs(&empty).unwrap_err();
        assert!(e.contains("empty.pem") && e.contains("no PEM certificate"), "{e}");
        let e = load_key(&empty).unwrap_err();
        assert!(e.contains("empty.pem"), "{e}");
        let only_cert = TlsFiles {
            cert: Some(empty.clone()),
            ..TlsFiles::default()
        };
        assert!(only_cert.client_config().unwrap_err().contains("--tls-ca"));
        assert!(TlsFiles::default().client_config().unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
