//! A serving certificate (the webhook's, and the admin port's when it serves
//! TLS), read from `tls.crt` and `tls.key` in
//! a directory and read again whenever either file changes: checked on
//! each TLS handshake (two stats), so a rotated Secret (an atomic symlink
//! swap in the mounted volume) is served from the next connection on,
//! without a restart. A change that does not load keeps the old pair.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("{0}: {1}")]
    Read(PathBuf, String),
    #[error("{0}: no certificate")]
    NoCertificate(PathBuf),
    #[error("{0}: the key is not one rustls can sign with: {1}")]
    Key(PathBuf, String),
}

/// (modified, length, inode) of both files.
type Fingerprint = Option<[(SystemTime, u64, u64); 2]>;

#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: Mutex<(Fingerprint, Arc<CertifiedKey>)>,
    /// Set to the served certificate's notAfter (Unix seconds) at each load.
    expiry: Option<prometheus::IntGauge>,
}

/// The notAfter of a chain's first certificate, in Unix seconds.
fn not_after(pair: &CertifiedKey) -> Option<i64> {
    let leaf = pair.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    Some(cert.validity().not_after.timestamp())
}

fn fingerprint(cert: &Path, key: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &Path| {
        let m = std::fs::metadata(p).ok()?;
        Some((m.modified().ok()?, m.len(), m.ino()))
    };
    Some([one(cert)?, one(key)?])
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, CertError> {
    let read =
        |p: &Path| std::fs::read(p).map_err(|e| CertError::Read(p.to_path_buf(), e.to_string()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Read(cert.to_path_buf(), e.to_string()))?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate(cert.to_path_buf()));
    }
    let der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| CertError::Read(key.to_path_buf(), e.to_string()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|e| CertError::Key(key.to_path_buf(), e.to_string()))?;
    let pair = CertifiedKey::new(chain, signer);
    // The two files are replaced one after the other: a handshake between
    // the two renames sees a new certificate beside the old key, which
    // would fail every handshake until the next change.
    match pair.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(Arc::new(pair))
        }
        Err(e) => Err(CertError::Key(key.to_path_buf(), e.to_string())),
    }
}

impl ReloadingCert {
    /// Reads `dir/tls.crt` and `dir/tls.key`; an error if they do not load
    /// now, so a bad mount is seen at start.
    pub fn new(dir: &Path) -> Result<ReloadingCert, CertError> {
        Self::with_expiry(dir, None)
    }

    /// [`ReloadingCert::new`], keeping `expiry` at the served
    /// certificate's notAfter.
    pub fn with_expiry(
        dir: &Path,
        expiry: Option<prometheus::IntGauge>,
    ) -> Result<ReloadingCert, CertError> {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let print = fingerprint(&cert, &key);
        let loaded = load(&cert, &key)?;
        let reloading = ReloadingCert {
            cert,
            key,
            current: Mutex::new((print, loaded.clone())),
            expiry,
        };
        reloading.served(&loaded);
        Ok(reloading)
    }

    fn served(&self, pair: &CertifiedKey) {
        if let (Some(gauge), Some(at)) = (&self.expiry, not_after(pair)) {
            gauge.set(at);
        }
    }

    fn refreshed(&self) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().ok()?;
        let now = fingerprint(&self.cert, &self.key);
        if now.is_some() && now != current.0 {
            match load(&self.cert, &self.key) {
                Ok(k) => {
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded");
                    self.served(&k);
                    *current = (now, k);
                }
                // Half-written, or a bad pair: keep serving the old one,
                // and try again on the next handshake.
                Err(e) => {
                    tracing::warn!(error = %e, "serving certificate changed but does not load; serving the previous one")
                }
            }
        }
        Some(current.1.clone())
    }

    pub fn server_config(self: Arc<Self>) -> rustls::ServerConfig {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map(|b| b.with_no_client_auth().with_cert_resolver(self.clone()))
        .unwrap_or_else(|_| {
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_cert_resolver(self)
        });
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refreshed()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    #[test]
    fn a_changed_pair_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), "one.example");
        let r = ReloadingCert::new(dir.path()).unwrap();
        let first = r.refreshed().unwrap().cert[0].clone();
        assert_eq!(r.refreshed().unwrap().cert[0], first);
        write_pair(dir.path(), "two.example");
        let second = r.refreshed().unwrap().cert[0].clone();
        assert_ne!(second, first);
        std::fs::write(dir.path().join("tls.key"), "not a key").unwrap();
        assert_eq!(r.refreshed().unwrap().cert[0], second);
        // A new certificate whose key has not been written yet.
        write_pair(dir.path(), "three.example");
        let key = std::fs::read(dir.path().join("tls.key")).unwrap();
        write_pair(dir.path(), "four.example");
        let third = r.refreshed().unwrap().cert[0].clone();
        std::fs::write(dir.path().join("tls.key"), key).unwrap();
        let served = r.refreshed().unwrap();
        assert_eq!(served.cert[0], third);
        assert!(
            served.keys_match().is_ok(),
            "a certificate served beside another's key"
        );
        assert!(ReloadingCert::new(dir.path()).is_err());
        assert!(ReloadingCert::new(&dir.path().join("absent")).is_err());
    }
}
