//! The kubelet's live serving certificate: what a DPU's kubelet serves now,
//! read over TLS from the address the management side assigned to the DPU
//! and judged against the hosted cluster's kubelet serving CA. A serving
//! renewal is held to it where it can be read, and to the SANs the approver
//! recorded where it cannot.
//!
//! Reading and judging are apart: [`fetch_leaf`] only does the handshake
//! (proving the server holds the key of the certificate it shows), and
//! [`judge`] is pure, so every way a certificate can be refused is tested
//! without a socket.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::csr::canonical_name;

/// A kubelet on the DPU's VLAN answers a handshake in milliseconds; one
/// that does not answer within this is taken as out of reach, so a pass
/// never waits long on it.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// The ConfigMap key of a CA bundle, as OpenShift writes them.
pub const CA_BUNDLE_KEY: &str = "ca-bundle.crt";
/// A bundle larger than this is not a CA bundle (one CA is about 1 KiB,
/// a rotation keeps a few).
const MAX_BUNDLE_BYTES: usize = 256 * 1024;

/// Why a live certificate is not taken as the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the certificate cannot be read: {0}")]
    Malformed(String),
    #[error("the certificate is not signed by the kubelet serving CA")]
    NotSigned,
    #[error("the certificate is outside its validity period")]
    NotValidNow,
    #[error("the certificate names {found:?}, not system:node:{host}")]
    Subject { found: Vec<String>, host: String },
    #[error("the certificate is not for server authentication")]
    Usage,
}

impl Refused {
    /// The metric label of the refusal.
    pub fn label(&self) -> &'static str {
        match self {
            Refused::Malformed(_) => "malformed",
            Refused::NotSigned => "not_signed",
            Refused::NotValidNow => "expired",
            Refused::Subject { .. } => "subject",
            Refused::Usage => "usage",
        }
    }
}

/// Why a CA bundle cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBundle {
    #[error("the CA bundle is {0} bytes, over the {MAX_BUNDLE_BYTES} a bundle may be")]
    TooLarge(usize),
    #[error("the CA bundle holds no certificate")]
    Empty,
    #[error("the CA bundle cannot be read: {0}")]
    Malformed(String),
}

/// The certificates of a CA bundle, as DER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorities(Vec<Vec<u8>>);

impl Authorities {
    /// The CERTIFICATE blocks of a PEM bundle; each must parse.
    pub fn from_pem(bundle: &[u8]) -> Result<Authorities, BadBundle> {
        if bundle.len() > MAX_BUNDLE_BYTES {
            return Err(BadBundle::TooLarge(bundle.len()));
        }
        let mut certs = Vec::new();
        for block in x509_parser::pem::Pem::iter_from_buffer(bundle) {
            let block = block.map_err(|e| BadBundle::Malformed(e.to_string()))?;
            if block.label != "CERTIFICATE" {
                continue;
            }
            X509Certificate::from_der(&block.contents)
                .map_err(|e| BadBundle::Malformed(e.to_string()))?;
            certs.push(block.contents);
        }
        if certs.is_empty() {
            return Err(BadBundle::Empty);
        }
        Ok(Authorities(certs))
    }
}

/// The SANs of `leaf` (DNS names canonical, addresses canonical), when it
/// is a serving certificate of `system:node:<host>` that one of
/// `authorities` signed and that is valid at `now` (Unix seconds).
pub fn judge(
    leaf: &[u8],
    authorities: &Authorities,
    host: &str,
    now: i64,
) -> Result<BTreeSet<String>, Refused> {
    let cert = match X509Certificate::from_der(leaf) {
        Ok((rest, _)) if !rest.is_empty() => {
            return Err(Refused::Malformed("trailing data".into()))
        }
        Ok((_, cert)) => cert,
        Err(e) => return Err(Refused::Malformed(e.to_string())),
    };
    let signed = authorities.0.iter().any(|der| {
        X509Certificate::from_der(der).is_ok_and(|(_, ca)| {
            ca.subject() == cert.issuer()
                && cert.verify_signature(Some(ca.public_key())).is_ok()
                && ca.validity().not_before.timestamp() <= now
                && now <= ca.validity().not_after.timestamp()
        })
    });
    if !signed {
        return Err(Refused::NotSigned);
    }
    let validity = cert.validity();
    if now < validity.not_before.timestamp() || validity.not_after.timestamp() < now {
        return Err(Refused::NotValidNow);
    }
    let names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().map(str::to_string).unwrap_or_default())
        .collect();
    if names != [format!("system:node:{host}")] {
        return Err(Refused::Subject {
            found: names,
            host: host.to_string(),
        });
    }
    match cert.extended_key_usage() {
        Ok(Some(eku)) if eku.value.server_auth => {}
        Ok(_) => return Err(Refused::Usage),
        Err(e) => return Err(Refused::Malformed(e.to_string())),
    }
    let mut sans = BTreeSet::new();
    match cert.subject_alternative_name() {
        Ok(Some(san)) => {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => {
                        sans.insert(canonical_name(d));
                    }
                    GeneralName::IPAddress(bytes) => {
                        let ip = match bytes.len() {
                            4 => <[u8; 4]>::try_from(*bytes).map(std::net::IpAddr::from).ok(),
                            16 => <[u8; 16]>::try_from(*bytes)
                                .map(std::net::IpAddr::from)
                                .ok(),
                            _ => None,
                        };
                        match ip {
                            Some(ip) => {
                                sans.insert(ip.to_canonical().to_string());
                            }
                            None => {
                                return Err(Refused::Malformed(
                                    "an IP SAN of neither 4 nor 16 octets".into(),
                                ))
                            }
                        }
                    }
                    // Other kinds are never signed for a kubelet; carried
                    // here, they would only widen what a renewal may ask.
                    _ => {}
                }
            }
        }
        Ok(None) => {}
        Err(e) => return Err(Refused::Malformed(e.to_string())),
    }
    Ok(sans)
}

/// Takes whatever chain the server shows, but only from a server that
/// proves it holds the key: the chain is judged afterwards against the
/// kubelet serving CA, because the name to check it for is the node's, not
/// the address dialled.
#[derive(Debug)]
struct AnyChainWithProof(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyChainWithProof {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why no certificate was read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("no handshake within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("the server showed no certificate")]
    NoCertificate,
}

/// The leaf certificate (DER) the TLS server at `addr` shows, once it has
/// proved it holds its key. Nothing is sent after the handshake.
pub async fn fetch_leaf(addr: SocketAddr, timeout: Duration) -> Result<Vec<u8>, FetchError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyChainWithProof(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let tls = connector
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await?;
        let (_, connection) = tls.get_ref();
        connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| leaf.to_vec())
            .ok_or(FetchError::NoCertificate)
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| FetchError::Timeout(timeout))?
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
        KeyPair, SanType,
    };

    struct Ca {
        pem: String,
        cert: Certificate,
        key: KeyPair,
    }

    fn ca(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            cert,
            key,
        }
    }

    fn leaf(
        ca: &Ca,
        cn: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) -> (Vec<u8>, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca.cert, &ca.key).unwrap();
        (cert.der().to_vec(), key)
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn serving_sans() -> Vec<SanType> {
        vec![
            SanType::DnsName("DPU-B.".try_into().unwrap()),
            SanType::IpAddress("10.0.0.12".parse().unwrap()),
        ]
    }

    #[test]
    fn a_kubelet_serving_certificate_of_the_ca_gives_its_sans() {
        let ca = ca("kubelet-signer");
        let authorities = Authorities::from_pem(ca.pem.as_bytes()).unwrap();
        let (der, _) = leaf(
            &ca,
            "system:node:dpu-b",
            serving_sans(),
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let sans = judge(&der, &authorities, "dpu-b", now()).unwrap();
        assert_eq!(sans, ["dpu-b".to_string(), "10.0.0.12".to_string()].into());
    }

    #[test]
    fn every_certificate_that_is_not_the_nodes_serving_one_is_refused() {
        let ca_here = ca("kubelet-signer");
        let other = ca("some-other-signer");
        let authorities = Authorities::from_pem(ca_here.pem.as_bytes()).unwrap();
        let server = ExtendedKeyUsagePurpose::ServerAuth;
        // Signed by another CA (a node's own self-signed one, say).
        let (der, _) = leaf(&other, "system:node:dpu-b", serving_sans(), server.clone());
        assert_eq!(
            judge(&der, &authorities, "dpu-b", now()),
            Err(Refused::NotSigned)
        );
        // A sibling's certificate, shown by a node that points its Node's
        // address at the sibling.
        let (der, _) = leaf(
            &ca_here,
            "system:node:dpu-c",
            serving_sans(),
            server.clone(),
        );
        assert!(matches!(
            judge(&der, &authorities, "dpu-b", now()),
            Err(Refused::Subject { .. })
        ));
        // A client certificate of the node.
        let (der, _) = leaf(
            &ca_here,
            "system:node:dpu-b",
            serving_sans(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        assert_eq!(
            judge(&der, &authorities, "dpu-b", now()),
            Err(Refused::Usage)
        );
        // Judged at a time the CA does not cover (rcgen's default validity
        // is 1975 to 4096).
        let (der, _) = leaf(&ca_here, "system:node:dpu-b", serving_sans(), server);
        assert_eq!(
            judge(&der, &authorities, "dpu-b", 0),
            Err(Refused::NotSigned),
            "the CA itself is not valid in 1970"
        );
        assert_eq!(
            judge(&der, &authorities, "dpu-b", i64::MAX / 2),
            Err(Refused::NotSigned)
        );
        // Signed by the CA, but expired.
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "system:node:dpu-b");
        params.subject_alt_names = serving_sans();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let expired = params.signed_by(&key, &ca_here.cert, &ca_here.key).unwrap();
        assert_eq!(
            judge(expired.der(), &authorities, "dpu-b", now()),
            Err(Refused::NotValidNow)
        );
        // Bytes that are no certificate, or a certificate with more after.
        assert!(matches!(
            judge(b"not a certificate", &authorities, "dpu-b", now()),
            Err(Refused::Malformed(_))
        ));
        let mut trailing = der.clone();
        trailing.push(0);
        assert!(matches!(
            judge(&trailing, &authorities, "dpu-b", now()),
            Err(Refused::Malformed(_))
        ));
    }

    #[test]
    fn a_bundle_must_hold_certificates_and_stay_small() {
        assert_eq!(Authorities::from_pem(b""), Err(BadBundle::Empty));
        assert!(matches!(
            Authorities::from_pem(&vec![b'a'; MAX_BUNDLE_BYTES + 1]),
            Err(BadBundle::TooLarge(_))
        ));
        let a = ca("one");
        let b = ca("two");
        let both = Authorities::from_pem(format!("{}{}", a.pem, b.pem).as_bytes()).unwrap();
        let (der, _) = leaf(
            &b,
            "system:node:dpu-b",
            serving_sans(),
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        assert!(
            judge(&der, &both, "dpu-b", now()).is_ok(),
            "a bundle kept over a rotation verifies with either CA"
        );
    }

    #[tokio::test]
    async fn the_leaf_is_read_in_a_handshake_and_a_silent_server_costs_only_the_timeout() {
        let ca = ca("kubelet-signer");
        let (der, key) = leaf(
            &ca,
            "system:node:dpu-b",
            serving_sans(),
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let serve = |der: Vec<u8>, key: &KeyPair| {
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(der)],
                rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = serve(der.clone(), &key);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = acceptor.accept(tcp).await;
            }
        });
        assert_eq!(fetch_leaf(addr, FETCH_TIMEOUT).await.unwrap(), der);

        // Nothing listening: an error, at once.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert!(matches!(
            fetch_leaf(closed, FETCH_TIMEOUT).await,
            Err(FetchError::Io(_))
        ));

        // A server that accepts and never speaks: the timeout, not a hang.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((tcp, _)) = silent.accept().await {
                open.push(tcp);
            }
        });
        assert!(matches!(
            fetch_leaf(silent_addr, Duration::from_millis(300)).await,
            Err(FetchError::Timeout(_))
        ));
        held.abort();
    }
}
