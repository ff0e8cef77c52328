//! A CA and serving certificate made by the operator (rcgen) for clusters
//! with neither OpenShift's service CA nor cert-manager. Everything lives in
//! one Secret, so every replica serves a certificate of the same CA and
//! publishes the same `caBundle` in each webhook of the configuration.
//!
//! The CA's key is kept (`ca.key`): a leaf renewal (under 30 days left) is
//! signed by the same CA, so the bundle does not change and a replica still
//! serving the previous leaf stays trusted until its next check. The CA is
//! replaced only when it has under a year left, or when the Secret has no
//! usable CA key (a Secret written before the key was kept). Replacing it
//! goes in two steps, trust before use:
//! 1. a new CA is *staged* (`next-ca.*`): it joins the bundle, nothing is
//!    signed with it yet;
//! 2. at a check at least one check interval later, and only once every
//!    webhook of the configuration carries it, it is *promoted*: the leaf
//!    is issued by it. The previous CA stays in the bundle until it
//!    expires, so replicas that still serve its leaf are trusted until
//!    they read the new pair.
//!
//! A one-step swap (new CA, new leaf, new bundle at once) would serve the
//! new leaf before the API server has the bundle that trusts it.
//!
//! [`plan`] decides all of this from the Secret's data and the time, with
//! no I/O; [`ensure`] reads, writes and publishes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

/// A CA's life, and how long before its end a successor is staged.
pub const CA_DAYS: i64 = 3650;
const CA_RENEW_BEFORE_SECONDS: i64 = 365 * 24 * 3600;
const CERT_DAYS: i64 = 365;
const RENEW_BEFORE_SECONDS: i64 = 30 * 24 * 3600;
/// How often the pair's age and the configuration's caBundle are checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(3600);

/// The Secret's keys. `ca.crt`, `tls.crt` and `tls.key` are what earlier
/// versions wrote; the others are read as absent in such a Secret.
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
/// The CAs to trust: what every webhook's caBundle is set to.
pub const CA_BUNDLE: &str = "ca-bundle.crt";
/// A staged CA, its key, and when it was staged (Unix seconds).
pub const NEXT_CA_CRT: &str = "next-ca.crt";
pub const NEXT_CA_KEY: &str = "next-ca.key";
pub const NEXT_CA_SINCE: &str = "next-ca.since";

pub type Data = BTreeMap<String, ByteString>;

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
    /// More names (or IP addresses) for the certificate. Tests only: they
    /// register the webhook by URL on 127.0.0.1.
    pub extra_sans: Vec<String>,
}

/// When the leaf and the CA are renewed, and how long a staged CA waits
/// before it signs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub leaf_renew_before: i64,
    pub ca_renew_before: i64,
    /// Seconds a staged CA spends in the bundle before it signs the leaf:
    /// one check interval, so the API server has long had the bundle.
    pub promote_after: i64,
}

impl Timing {
    pub fn checked_every(every: Duration) -> Timing {
        Timing {
            leaf_renew_before: RENEW_BEFORE_SECONDS,
            ca_renew_before: CA_RENEW_BEFORE_SECONDS,
            promote_after: i64::try_from(every.as_secs()).unwrap_or(i64::MAX),
        }
    }
}

impl Default for Timing {
    fn default() -> Timing {
        Timing::checked_every(CHECK_EVERY)
    }
}

/// A certificate as read from PEM: its block of text and what the plan
/// looks at.
#[derive(Clone, Debug)]
struct Cert {
    pem: String,
    der: Vec<u8>,
    not_after: i64,
    is_ca: bool,
    spki: Vec<u8>,
    cn: String,
}

/// Every CERTIFICATE block of `text`, each read; unreadable ones dropped.
fn pem_certs(text: &[u8]) -> Vec<Cert> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let Ok(mut rest) = std::str::from_utf8(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let block = &rest[start..start + len + END.len()];
        rest = &rest[start + len + END.len()..];
        let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(block.as_bytes()) else {
            continue;
        };
        let Ok(cert) = pem.parse_x509() else {
            continue;
        };
        out.push(Cert {
            pem: format!("{block}\n"),
            der: pem.contents.clone(),
            not_after: cert.validity().not_after.timestamp(),
            is_ca: cert.is_ca(),
            spki: cert.public_key().raw.to_vec(),
            cn: cert
                .subject()
                .iter_common_name()
                .next()
                .and_then(|c| c.as_str().ok())
                .unwrap_or_default()
                .to_string(),
        });
    }
    out
}

/// Whether `key_pem` is the private key of `cert`.
fn key_matches(cert: &Cert, key_pem: &[u8]) -> bool {
    std::str::from_utf8(key_pem)
        .ok()
        .and_then(|k| rcgen::KeyPair::from_pem(k).ok())
        .is_some_and(|k| k.public_key_der() == cert.spki)
}

/// Whether `leaf` carries a signature of `ca`'s key.
fn signed_by(leaf: &Cert, ca: &Cert) -> bool {
    let parse = |der| {
        x509_parser::parse_x509_certificate(der)
            .ok()
            .map(|(_, c)| c)
    };
    match (parse(&leaf.der), parse(&ca.der)) {
        (Some(l), Some(c)) => l.verify_signature(Some(c.public_key())).is_ok(),
        _ => false,
    }
}

/// A CA with its key, unexpired.
#[derive(Clone, Debug)]
struct Ca {
    cert: Cert,
    key_pem: String,
}

fn read_ca(cert: Option<&[u8]>, key: Option<&[u8]>, now: i64) -> Option<Ca> {
    let cert = pem_certs(cert?).into_iter().next()?;
    let key = key?;
    (cert.is_ca && cert.not_after > now && key_matches(&cert, key)).then(|| Ca {
        cert,
        key_pem: String::from_utf8_lossy(key).into_owned(),
    })
}

/// The served pair, unexpired and matching.
#[derive(Clone, Debug)]
struct Leaf {
    cert: Cert,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

fn read_leaf(cert: Option<&[u8]>, key: Option<&[u8]>, now: i64) -> Option<Leaf> {
    let (cert_pem, key_pem) = (cert?, key?);
    let cert = pem_certs(cert_pem).into_iter().next()?;
    (cert.not_after > now && key_matches(&cert, key_pem)).then(|| Leaf {
        cert,
        cert_pem: cert_pem.to_vec(),
        key_pem: key_pem.to_vec(),
    })
}

fn ca_params(cn: &str, now: Timestamp, days: i64) -> rcgen::CertificateParams {
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, cn.to_string());
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    valid_for(&mut ca, now, days);
    ca
}

/// A new CA valid for `days`. Its name carries the day and a piece of its
/// key, so two CAs in one bundle are told apart by people too.
fn new_ca(now: Timestamp, days: i64) -> Result<Ca, rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let spki = key.public_key_der();
    let tag: String = spki
        .iter()
        .rev()
        .take(4)
        .map(|b| format!("{b:02x}"))
        .collect();
    let (y, m, d) = ymd(now, 0);
    let cn = format!("causeway webhook CA {y:04}-{m:02}-{d:02} {tag}");
    let cert = ca_params(&cn, now, days).self_signed(&key)?;
    let cert = pem_certs(cert.pem().as_bytes())
        .into_iter()
        .next()
        .ok_or(rcgen::Error::CouldNotParseCertificate)?;
    Ok(Ca {
        cert,
        key_pem: key.serialize_pem(),
    })
}

/// A leaf for the Service's names (and `extra_sans`), signed by `ca`.
fn issue(ca: &Ca, names: &Names, now: Timestamp) -> Result<Leaf, rcgen::Error> {
    let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem)?;
    // Signing needs the issuer's name and key only: the name rebuilt as
    // `new_ca` wrote it gives the same bytes as the stored certificate's.
    let issuer = ca_params(&ca.cert.cn, now, 1).self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let svc = format!("{}.{}.svc", names.service, names.namespace);
    let mut sans = vec![svc.clone(), format!("{svc}.cluster.local")];
    sans.extend(names.extra_sans.iter().cloned());
    let mut leaf = rcgen::CertificateParams::new(sans)?;
    leaf.distinguished_name.push(rcgen::DnType::CommonName, svc);
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    valid_for(&mut leaf, now, CERT_DAYS);
    let cert_pem = leaf.signed_by(&key, &issuer, &ca_key)?.pem();
    let cert = pem_certs(cert_pem.as_bytes())
        .into_iter()
        .next()
        .ok_or(rcgen::Error::CouldNotParseCertificate)?;
    Ok(Leaf {
        cert,
        cert_pem: cert_pem.into_bytes(),
        key_pem: key.serialize_pem().into_bytes(),
    })
}

/// A new CA valid for `ca_days` from `now`, a certificate it signed, and a
/// bundle of that CA: the Secret's data as [`plan`] writes it for a new
/// install. Public so tests can make a CA near its end.
pub fn generate_with(names: &Names, now: Timestamp, ca_days: i64) -> Result<Data, rcgen::Error> {
    let ca = new_ca(now, ca_days)?;
    let leaf = issue(&ca, names, now)?;
    Ok(render(Some(&ca), None, &leaf, None, &ca.cert.pem))
}

/// A new CA and a certificate it signed for the Service's names.
pub fn generate(names: &Names) -> Result<Data, rcgen::Error> {
    generate_with(names, Timestamp::now(), CA_DAYS)
}

fn render(
    active: Option<&Ca>,
    legacy_ca: Option<&[u8]>,
    leaf: &Leaf,
    next: Option<&(Ca, i64)>,
    bundle: &str,
) -> Data {
    let mut out = Data::new();
    let mut put = |k: &str, v: Vec<u8>| {
        out.insert(k.to_string(), ByteString(v));
    };
    match (active, legacy_ca) {
        (Some(a), _) => {
            put(CA_CRT, a.cert.pem.clone().into_bytes());
            put(CA_KEY, a.key_pem.clone().into_bytes());
        }
        // The CA of a pair written before the key was kept: still the one
        // the served leaf chains to.
        (None, Some(ca)) => put(CA_CRT, ca.to_vec()),
        (None, None) => {}
    }
    put(TLS_CRT, leaf.cert_pem.clone());
    put(TLS_KEY, leaf.key_pem.clone());
    put(CA_BUNDLE, bundle.as_bytes().to_vec());
    if let Some((n, since)) = next {
        put(NEXT_CA_CRT, n.cert.pem.clone().into_bytes());
        put(NEXT_CA_KEY, n.key_pem.clone().into_bytes());
        put(NEXT_CA_SINCE, since.to_string().into_bytes());
    }
    out
}

/// What the Secret should hold at `now`, given what it holds (`None`: no
/// Secret) and the caBundle of each webhook of the configuration
/// (`published`; empty when there is no configuration). `None` when it is
/// right as it is.
pub fn plan(
    current: Option<&Data>,
    published: &[Vec<u8>],
    names: &Names,
    now: Timestamp,
    timing: &Timing,
) -> Result<Option<Data>, rcgen::Error> {
    let t = now.as_second();
    let empty = Data::new();
    let data = current.unwrap_or(&empty);
    let get = |k: &str| data.get(k).map(|b| b.0.as_slice());
    let mut active = read_ca(get(CA_CRT), get(CA_KEY), t);
    let mut next = read_ca(get(NEXT_CA_CRT), get(NEXT_CA_KEY), t).zip(
        get(NEXT_CA_SINCE)
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.trim().parse::<i64>().ok()),
    );
    let mut leaf = read_leaf(get(TLS_CRT), get(TLS_KEY), t);
    // A Secret from before the bundle was kept: its CA was the bundle.
    let previous = get(CA_BUNDLE)
        .or(get(CA_CRT))
        .map(pem_certs)
        .unwrap_or_default();
    let mut changed = false;

    // Promote the staged CA once it has been trusted long enough, or at
    // once when there is nothing else to serve.
    if let Some((n, since)) = &next {
        let in_force = published
            .iter()
            .all(|b| pem_certs(b).iter().any(|c| c.der == n.cert.der));
        let due = in_force && t.saturating_sub(*since) >= timing.promote_after;
        let nothing_served = active.is_none() && leaf.is_none();
        if due || nothing_served {
            active = next.take().map(|(n, _)| n);
            changed = true;
        }
    }
    // No CA key and no pair to keep serving: start over.
    if active.is_none() && leaf.is_none() {
        active = Some(new_ca(now, CA_DAYS)?);
        changed = true;
    }
    // Stage a successor for a CA near its end, or for a pair whose CA key
    // was not kept.
    if next.is_none()
        && active
            .as_ref()
            .is_none_or(|a| a.cert.not_after - t < timing.ca_renew_before)
    {
        next = Some((new_ca(now, CA_DAYS)?, t));
        changed = true;
    }
    if let Some(a) = &active {
        let keep = leaf.as_ref().is_some_and(|l| {
            l.cert.not_after - t >= timing.leaf_renew_before && signed_by(&l.cert, &a.cert)
        });
        if !keep {
            leaf = Some(issue(a, names, now)?);
            changed = true;
        }
    }
    // The CA in use, the staged one, then every earlier CA until it
    // expires: replicas may still serve a leaf of any of them.
    let mut bundle: Vec<&Cert> = Vec::new();
    for c in active
        .iter()
        .map(|a| &a.cert)
        .chain(next.iter().map(|(n, _)| &n.cert))
        .chain(previous.iter())
    {
        if c.not_after > t && !bundle.iter().any(|b| b.der == c.der) {
            bundle.push(c);
        }
    }
    let bundle: String = bundle.iter().map(|c| c.pem.as_str()).collect();
    if get(CA_BUNDLE) != Some(bundle.as_bytes()) {
        changed = true;
    }
    let Some(leaf) = leaf.filter(|_| changed) else {
        return Ok(None);
    };
    Ok(Some(render(
        active.as_ref(),
        get(CA_CRT),
        &leaf,
        next.as_ref(),
        &bundle,
    )))
}

/// The calendar day (UTC) `days` after `now`: certificates start at the
/// beginning of today, which leaves room for clocks a little behind.
fn ymd(now: Timestamp, days: i64) -> (i32, u8, u8) {
    let then = now
        .checked_add(SignedDuration::from_hours(24 * days))
        .unwrap_or(now)
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .date();
    (
        i32::from(then.year()),
        u8::try_from(then.month()).unwrap_or(1),
        u8::try_from(then.day()).unwrap_or(1),
    )
}

/// From the start of today to `days` later.
fn valid_for(p: &mut rcgen::CertificateParams, now: Timestamp, days: i64) {
    let (y, m, d) = ymd(now, 0);
    p.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(now, days);
    p.not_after = rcgen::date_time_ymd(y, m, d);
}

/// Makes sure the Secret holds what [`plan`] wants, puts its bundle in
/// every webhook of the configuration, then writes the certificate and key
/// to `dir`: the bundle first, so a replica never serves a leaf the
/// configuration does not yet trust.
pub async fn ensure(
    client: &Client,
    names: &Names,
    dir: &Path,
    timing: &Timing,
) -> Result<(), SelfSignedError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &names.namespace);
    let secret_err =
        |e| SelfSignedError::Secret(format!("{}/{}", names.namespace, names.secret), e);
    let existing = secrets.get_opt(&names.secret).await.map_err(secret_err)?;
    let published = published_bundles(client, &names.configuration).await?;
    let current = existing.as_ref().and_then(|s| s.data.as_ref());
    let data = match plan(current, &published, names, Timestamp::now(), timing)? {
        None => current.cloned().unwrap_or_default(),
        Some(data) => {
            let mut secret: Secret = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": names.secret, "namespace": names.namespace},
            }))
            .map_err(|e| secret_err(kube::Error::SerdeError(e)))?;
            secret.data = Some(data.clone());
            let written = match &existing {
                // Only over the version read, so two replicas changing it
                // at once end with one state.
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
                    log_change(current, &data, &names.secret);
                    data
                }
                // Another replica was first: use what it wrote.
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
    let bundle = data
        .get(CA_BUNDLE)
        .or(data.get(CA_CRT))
        .map(|b| b.0.clone())
        .unwrap_or_default();
    patch_ca_bundle(client, &names.configuration, &bundle).await?;
    for file in [TLS_CRT, TLS_KEY] {
        let bytes = data.get(file).map(|b| b.0.clone()).unwrap_or_default();
        // Written beside and renamed, so a handshake never reads half a file.
        let tmp = dir.join(format!(".{file}.new"));
        std::fs::write(&tmp, &bytes)
            .map_err(|e| SelfSignedError::Write(tmp.display().to_string(), e))?;
        std::fs::rename(&tmp, dir.join(file))
            .map_err(|e| SelfSignedError::Write(dir.join(file).display().to_string(), e))?;
    }
    Ok(())
}

fn log_change(before: Option<&Data>, after: &Data, secret: &str) {
    let same = |k: &str| before.and_then(|b| b.get(k)) == after.get(k);
    let what = if !same(CA_CRT) {
        "webhook CA in use changed (the previous one stays in the bundle)"
    } else if !same(NEXT_CA_CRT) && after.contains_key(NEXT_CA_CRT) {
        "webhook CA successor staged in the bundle"
    } else if !same(TLS_CRT) {
        "webhook certificate renewed by the same CA"
    } else {
        "webhook CA bundle updated"
    };
    tracing::info!(secret, "{what}");
}

/// The caBundle of each webhook of the configuration; empty if there is
/// no configuration.
async fn published_bundles(client: &Client, name: &str) -> Result<Vec<Vec<u8>>, SelfSignedError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let vwc = api
        .get_opt(name)
        .await
        .map_err(|e| SelfSignedError::Configuration(name.to_string(), e))?;
    Ok(vwc
        .and_then(|v| v.webhooks)
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
        .collect())
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

    const DAY: i64 = 24 * 3600;

    fn names() -> Names {
        Names {
            namespace: "causeway-system".into(),
            secret: "s".into(),
            service: "causeway-webhook".into(),
            configuration: "c".into(),
            extra_sans: Vec::new(),
        }
    }

    fn at(now: Timestamp, days: i64) -> Timestamp {
        now.checked_add(SignedDuration::from_hours(24 * days))
            .unwrap()
    }

    fn bytes<'a>(d: &'a Data, k: &str) -> &'a [u8] {
        &d[k].0
    }

    /// Whether the leaf PEM chains, by name and signature, to a CA of
    /// `bundle` that is valid at `now`: what the API server checks.
    fn chains(leaf: &[u8], bundle: &[u8], now: Timestamp) -> bool {
        let (_, leaf) = x509_parser::pem::parse_x509_pem(leaf).unwrap();
        let leaf = leaf.parse_x509().unwrap();
        pem_certs(bundle).iter().any(|ca| {
            let (_, ca) = x509_parser::parse_x509_certificate(&ca.der).unwrap();
            let valid = |c: &x509_parser::certificate::X509Certificate| {
                let v = c.validity();
                v.not_before.timestamp() <= now.as_second()
                    && now.as_second() < v.not_after.timestamp()
            };
            ca.is_ca()
                && leaf.issuer().as_raw() == ca.subject().as_raw()
                && leaf.verify_signature(Some(ca.public_key())).is_ok()
                && valid(&ca)
                && valid(&leaf)
        })
    }

    #[test]
    fn the_certificate_is_for_the_service_and_chains_to_the_ca() {
        let now = Timestamp::now();
        let data = generate(&names()).unwrap();
        let leaf = &pem_certs(bytes(&data, TLS_CRT))[0];
        let left = leaf.not_after - now.as_second();
        assert!(left > 360 * DAY && left <= 366 * DAY, "{left}");
        let (_, parsed) = x509_parser::parse_x509_certificate(&leaf.der).unwrap();
        let sans: Vec<String> = parsed
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
        assert!(chains(bytes(&data, TLS_CRT), bytes(&data, CA_CRT), now));
        assert_eq!(bytes(&data, CA_BUNDLE), bytes(&data, CA_CRT));
        assert!(!parsed.is_ca());
        // Freshly made: nothing to do.
        assert!(plan(Some(&data), &[], &names(), now, &Timing::default())
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_leaf_renewal_is_signed_by_the_same_ca_and_leaves_the_bundle_alone() {
        let now = Timestamp::now();
        let data = generate(&names()).unwrap();
        let timing = Timing::default();
        let published = [bytes(&data, CA_BUNDLE).to_vec()];
        assert!(
            plan(Some(&data), &published, &names(), at(now, 300), &timing)
                .unwrap()
                .is_none()
        );
        let later = at(now, 340);
        let renewed = plan(Some(&data), &published, &names(), later, &timing)
            .unwrap()
            .expect("a leaf with under 30 days left is renewed");
        assert_ne!(bytes(&renewed, TLS_CRT), bytes(&data, TLS_CRT));
        assert_ne!(bytes(&renewed, TLS_KEY), bytes(&data, TLS_KEY));
        for k in [CA_CRT, CA_KEY, CA_BUNDLE] {
            assert_eq!(bytes(&renewed, k), bytes(&data, k), "{k}");
        }
        assert!(!renewed.contains_key(NEXT_CA_CRT));
        // Both the new leaf and the one other replicas still serve are
        // trusted by the bundle already published.
        assert!(chains(bytes(&renewed, TLS_CRT), &published[0], later));
        assert!(chains(bytes(&data, TLS_CRT), &published[0], later));
    }

    /// Steps `data` as replicas would: each check plans, then publishes the
    /// Secret's bundle. Returns the new data and the published bundle.
    fn check(data: &Data, published: &[u8], now: Timestamp, timing: &Timing) -> (Data, Vec<u8>) {
        let next = plan(Some(data), &[published.to_vec()], &names(), now, timing)
            .unwrap()
            .unwrap_or_else(|| data.clone());
        let bundle = bytes(&next, CA_BUNDLE).to_vec();
        (next, bundle)
    }

    #[test]
    fn a_ca_near_its_end_is_trusted_before_it_signs_and_the_old_one_stays_trusted() {
        let now = Timestamp::now();
        let timing = Timing::default();
        let old = generate_with(&names(), now, 100).unwrap();
        let old_ca = bytes(&old, CA_CRT).to_vec();
        let old_leaf = bytes(&old, TLS_CRT).to_vec();
        let published = old_ca.clone();

        // Step 1: staged. The served pair is unchanged; the bundle gains
        // the successor.
        let (staged, published_1) = check(&old, &published, now, &timing);
        assert_eq!(bytes(&staged, TLS_CRT), old_leaf.as_slice());
        assert_eq!(bytes(&staged, CA_CRT), old_ca.as_slice());
        let next_ca = bytes(&staged, NEXT_CA_CRT).to_vec();
        assert_ne!(next_ca, old_ca);
        assert_eq!(pem_certs(&published_1).len(), 2);
        assert!(pem_certs(&published_1)
            .iter()
            .any(|c| c.der == pem_certs(&next_ca)[0].der));

        // Not promoted before a check interval has passed, nor while the
        // configuration lacks the successor.
        let later = now
            .checked_add(SignedDuration::from_secs(timing.promote_after))
            .unwrap();
        assert!(plan(
            Some(&staged),
            std::slice::from_ref(&published_1),
            &names(),
            now,
            &timing
        )
        .unwrap()
        .is_none());
        assert!(plan(
            Some(&staged),
            std::slice::from_ref(&old_ca),
            &names(),
            later,
            &timing
        )
        .unwrap()
        .is_none());

        // Step 2: promoted. The new leaf is of the successor, which the
        // configuration already trusted; the old leaf, still served by
        // replicas that have not read the Secret again, is trusted too.
        let (promoted, published_2) = check(&staged, &published_1, later, &timing);
        assert_eq!(bytes(&promoted, CA_CRT), next_ca.as_slice());
        assert!(!promoted.contains_key(NEXT_CA_CRT));
        assert!(chains(bytes(&promoted, TLS_CRT), &published_1, later));
        assert!(!chains(bytes(&promoted, TLS_CRT), &old_ca, later));
        assert!(chains(&old_leaf, &published_2, later));
        assert!(chains(bytes(&promoted, TLS_CRT), &published_2, later));
        // And it stays put.
        assert!(plan(
            Some(&promoted),
            std::slice::from_ref(&published_2),
            &names(),
            at(now, 50),
            &timing
        )
        .unwrap()
        .is_none());

        // Once the old CA has expired it leaves the bundle.
        let (pruned, published_3) = check(&promoted, &published_2, at(now, 101), &timing);
        assert_eq!(pem_certs(&published_3).len(), 1);
        assert_eq!(published_3, next_ca);
        assert_eq!(bytes(&pruned, TLS_CRT), bytes(&promoted, TLS_CRT));
    }

    #[test]
    fn a_secret_without_the_ca_key_moves_to_a_kept_ca_and_trusts_both_meanwhile() {
        let now = Timestamp::now();
        let timing = Timing::default();
        // As the previous version wrote it.
        let mut legacy = generate(&names()).unwrap();
        legacy.retain(|k, _| [CA_CRT, TLS_CRT, TLS_KEY].contains(&k.as_str()));
        let legacy_ca = bytes(&legacy, CA_CRT).to_vec();
        let legacy_leaf = bytes(&legacy, TLS_CRT).to_vec();

        let (staged, published_1) = check(&legacy, &legacy_ca, now, &timing);
        assert_eq!(bytes(&staged, TLS_CRT), legacy_leaf.as_slice());
        assert_eq!(pem_certs(&published_1).len(), 2);
        assert!(chains(&legacy_leaf, &published_1, now));

        let later = now
            .checked_add(SignedDuration::from_secs(timing.promote_after))
            .unwrap();
        let (promoted, published_2) = check(&staged, &published_1, later, &timing);
        assert!(promoted.contains_key(CA_KEY));
        assert_ne!(bytes(&promoted, CA_CRT), legacy_ca.as_slice());
        assert!(chains(bytes(&promoted, TLS_CRT), &published_1, later));
        assert!(chains(&legacy_leaf, &published_2, later));
        // From now on renewals reuse the kept CA.
        let renewed = plan(
            Some(&promoted),
            std::slice::from_ref(&published_2),
            &names(),
            at(now, 340),
            &timing,
        )
        .unwrap()
        .unwrap();
        assert_eq!(bytes(&renewed, CA_CRT), bytes(&promoted, CA_CRT));
        assert_eq!(bytes(&renewed, CA_BUNDLE), published_2.as_slice());
    }

    #[test]
    fn with_nothing_usable_a_new_pair_is_made_and_garbage_is_not_kept() {
        let now = Timestamp::now();
        let made = plan(None, &[], &names(), now, &Timing::default())
            .unwrap()
            .unwrap();
        assert!(chains(bytes(&made, TLS_CRT), bytes(&made, CA_BUNDLE), now));
        assert!(!made.contains_key(NEXT_CA_CRT));
        let garbage: Data = [CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, CA_BUNDLE]
            .iter()
            .map(|k| (k.to_string(), ByteString(b"not pem".to_vec())))
            .collect();
        let made = plan(Some(&garbage), &[], &names(), now, &Timing::default())
            .unwrap()
            .unwrap();
        assert_eq!(pem_certs(bytes(&made, CA_BUNDLE)).len(), 1);
        assert!(chains(bytes(&made, TLS_CRT), bytes(&made, CA_BUNDLE), now));
        // A CA key that is not the CA's is not used.
        let mut other = generate(&names()).unwrap();
        other.insert(CA_KEY.into(), made[CA_KEY].clone());
        let fixed = plan(Some(&other), &[], &names(), now, &Timing::default())
            .unwrap()
            .unwrap();
        assert!(fixed.contains_key(NEXT_CA_CRT), "{:?}", fixed.keys());
    }
}
