//! A CA and serving certificate made by the operator (rcgen) for clusters
//! with neither OpenShift's service CA nor cert-manager. The pair lives in
//! one Secret, so every replica serves a certificate of the same CA; the
//! CA goes into each webhook's `caBundle` of the configuration. Renewed
//! when the certificate has under 30 days left.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

const CA_DAYS: i64 = 3650;
const CERT_DAYS: i64 = 365;
const RENEW_BEFORE_SECONDS: i64 = 30 * 24 * 3600;
/// How often the pair's age and the configuration's caBundle are checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("making the certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("Secret {0}: {1}")]
    Secret(String, kube::Error),
    #[error("ValidatingWebhookConfiguration {0}: {1}")]
    Configuration(String, kube::Error),
    #[error("writing {0}: {1}")]
    Write(String, std::io::Error),
}

pub struct Names {
    pub namespace: String,
    pub secret: String,
    /// The webhook Service: the certificate is for its in-cluster names.
    pub service: String,
    pub configuration: String,
}

/// Seconds until `pem`'s first certificate expires; `None` if unreadable.
fn seconds_left(pem: &[u8]) -> Option<i64> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = block.parse_x509().ok()?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    Some(cert.validity().not_after.timestamp() - now)
}

/// A new CA and a certificate it signed for the Service's names.
pub fn generate(names: &Names) -> Result<BTreeMap<String, ByteString>, rcgen::Error> {
    let now = time_now();
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "causeway webhook CA");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    ca.not_before = {
        let (y, m, d) = ymd(now, 0);
        rcgen::date_time_ymd(y, m, d)
    };
    ca.not_after = {
        let (y, m, d) = ymd(now, CA_DAYS);
        rcgen::date_time_ymd(y, m, d)
    };
    let ca_cert = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let svc = format!("{}.{}.svc", names.service, names.namespace);
    let mut leaf =
        rcgen::CertificateParams::new(vec![svc.clone(), format!("{svc}.cluster.local")])?;
    leaf.distinguished_name.push(rcgen::DnType::CommonName, svc);
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = {
        let (y, m, d) = ymd(now, 0);
        rcgen::date_time_ymd(y, m, d)
    };
    leaf.not_after = {
        let (y, m, d) = ymd(now, CERT_DAYS);
        rcgen::date_time_ymd(y, m, d)
    };
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key)?;
    Ok([
        ("ca.crt".to_string(), ByteString(ca_cert.pem().into_bytes())),
        ("tls.crt".to_string(), ByteString(cert.pem().into_bytes())),
        (
            "tls.key".to_string(),
            ByteString(key.serialize_pem().into_bytes()),
        ),
    ]
    .into())
}

fn time_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// The calendar day (UTC) `days` after `now`: certificates start at the
/// beginning of today, which leaves room for clocks a little behind.
fn ymd(now: k8s_openapi::jiff::Timestamp, days: i64) -> (i32, u8, u8) {
    let then = now
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(24 * days))
        .unwrap_or(now)
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .date();
    (
        i32::from(then.year()),
        u8::try_from(then.month()).unwrap_or(1),
        u8::try_from(then.day()).unwrap_or(1),
    )
}

/// Makes sure the Secret holds a pair good for 30 more days, writes the
/// certificate and key to `dir`, and puts the CA in the configuration.
pub async fn ensure(client: &Client, names: &Names, dir: &Path) -> Result<(), SelfSignedError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &names.namespace);
    let secret_err =
        |e| SelfSignedError::Secret(format!("{}/{}", names.namespace, names.secret), e);
    let existing = secrets.get_opt(&names.secret).await.map_err(secret_err)?;
    let good = |s: &Secret| {
        let data = s.data.clone().unwrap_or_default();
        let ok = ["ca.crt", "tls.crt", "tls.key"]
            .iter()
            .all(|k| data.contains_key(*k))
            && data
                .get("tls.crt")
                .and_then(|c| seconds_left(&c.0))
                .is_some_and(|left| left > RENEW_BEFORE_SECONDS);
        ok.then_some(data)
    };
    let data = match existing.as_ref().and_then(good) {
        Some(d) => d,
        None => {
            let data = generate(names)?;
            let mut secret: Secret = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": names.secret, "namespace": names.namespace},
            }))
            .map_err(|e| secret_err(kube::Error::SerdeError(e)))?;
            secret.data = Some(data.clone());
            let written = match &existing {
                // Renewal: only over the version read, so two replicas
                // renewing at once end with one pair.
                Some(old) => {
                    secret.metadata.resource_version = old.metadata.resource_version.clone();
                    secrets
                        .replace(&names.secret, &PostParams::default(), &secret)
                        .await
                }
                None => secrets.create(&PostParams::default(), &secret).await,
            };
            match written {
                Ok(_) => {
                    tracing::info!(secret = %names.secret, "webhook CA and certificate made");
                    data
                }
                // Another replica was first: use its pair.
                Err(kube::Error::Api(s)) if s.code == 409 => secrets
                    .get(&names.secret)
                    .await
                    .map_err(secret_err)?
                    .data
                    .unwrap_or_default(),
                Err(e) => return Err(secret_err(e)),
            }
        }
    };
    for (file, key) in [("tls.crt", "tls.crt"), ("tls.key", "tls.key")] {
        let bytes = data.get(key).map(|b| b.0.clone()).unwrap_or_default();
        // Written beside and renamed, so a handshake never reads half a file.
        let tmp = dir.join(format!(".{file}.new"));
        std::fs::write(&tmp, &bytes)
            .map_err(|e| SelfSignedError::Write(tmp.display().to_string(), e))?;
        std::fs::rename(&tmp, dir.join(file))
            .map_err(|e| SelfSignedError::Write(dir.join(file).display().to_string(), e))?;
    }
    let ca = data.get("ca.crt").map(|b| b.0.clone()).unwrap_or_default();
    patch_ca_bundle(client, &names.configuration, &ca).await
}

/// Sets every webhook's caBundle, each by a JSON patch that first tests the
/// webhook's name at that index.
async fn patch_ca_bundle(client: &Client, name: &str, ca: &[u8]) -> Result<(), SelfSignedError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let err = |e| SelfSignedError::Configuration(name.to_string(), e);
    let Some(vwc) = api.get_opt(name).await.map_err(err)? else {
        tracing::warn!(
            configuration = name,
            "no ValidatingWebhookConfiguration of that name: nothing to give the CA to"
        );
        return Ok(());
    };
    let mut ops = Vec::new();
    for (i, w) in vwc.webhooks.unwrap_or_default().iter().enumerate() {
        if w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) == Some(ca) {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": w.name}));
        ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": ByteString(ca.to_vec())}));
    }
    if ops.is_empty() {
        return Ok(());
    }
    let patch: json_patch::Patch =
        serde_json::from_value(json!(ops)).map_err(|e| err(kube::Error::SerdeError(e)))?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(err)?;
    tracing::info!(configuration = name, "webhook caBundle set");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_is_for_the_service_and_chains_to_the_ca() {
        let names = Names {
            namespace: "causeway-system".into(),
            secret: "s".into(),
            service: "causeway-webhook".into(),
            configuration: "c".into(),
        };
        let data = generate(&names).unwrap();
        let left = seconds_left(&data["tls.crt"].0).unwrap();
        assert!(left > 360 * 24 * 3600 && left <= 366 * 24 * 3600, "{left}");
        let (_, leaf) = x509_parser::pem::parse_x509_pem(&data["tls.crt"].0).unwrap();
        let leaf = leaf.parse_x509().unwrap();
        let sans: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert!(
            sans.iter()
                .any(|s| s.contains("causeway-webhook.causeway-system.svc")),
            "{sans:?}"
        );
        let (_, ca) = x509_parser::pem::parse_x509_pem(&data["ca.crt"].0).unwrap();
        let ca = ca.parse_x509().unwrap();
        assert!(leaf.verify_signature(Some(ca.public_key())).is_ok());
        assert!(ca.is_ca() && !leaf.is_ca());
    }
}
