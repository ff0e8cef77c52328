//! The DPU's ignition as DPF reads it: the bfcfg template ConfigMap, what
//! it was made from, and HyperShift's ignition with the OS image replaced
//! (which [`super::bfcfg`] builds the template around). Pure but for
//! [`fetch`]: the controller fetches and applies.
//!
//! HyperShift's ignition carries the node's MachineConfig as the file
//! `/etc/ignition-machine-config-encapsulated.json`, a `data:` URL. Its
//! `spec.osImageURL` is what the node boots into; a BlueField DPU needs
//! the BlueField build of that OS, so it is set to `machineOSURL` or the
//! image the BlueField lookup found.

use std::collections::BTreeMap;

use base64::Engine;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::{json, Value};

pub const ENCAPSULATED: &str = "/etc/ignition-machine-config-encapsulated.json";
/// The key DPF reads the template from.
pub const TEMPLATE_KEY: &str = "BF_CFG_TEMPLATE";
pub const TEMPLATE_LABEL: &str = "provisioning.dpu.nvidia.com/bfcfg-template";
const DPF_PREFIX: &str = "provisioning.dpu.nvidia.com/bfcfg-template-";
const OURS_PREFIX: &str = "dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-";
/// The annotations that say what a published template was made from.
pub const MACHINE_OS_ANNOTATION: &str =
    "dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-machine-os-url";
pub const RELEASE_ANNOTATION: &str =
    "dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-ocp-release-image";
/// The digest of the DPUFlavor's spec and the high-speed MTU the template
/// was made from (`bfcfg::content_digest`): causeway's own, so an edit to
/// the flavor's content makes the template again.
/// The digest of the pull secret and SSH key the template was made with.
pub const SECRETS_DIGEST_ANNOTATION: &str =
    "dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-secrets-digest";
const BFB_NAME_ANNOTATION: &str = "provisioning.dpu.nvidia.com/bfcfg-template-bfb-name";
const BFB_NAMESPACE_ANNOTATION: &str = "provisioning.dpu.nvidia.com/bfcfg-template-bfb-namespace";
pub const CONTENT_DIGEST_ANNOTATION: &str =
    "dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-dpuflavor-digest";

/// Characters kept as they are in a `data:,` URL: RFC 3986 unreserved.
pub(crate) const DATA_URL: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IgnitionError {
    #[error("the ignition is not JSON: {0}")]
    NotJson(String),
    #[error("the ignition has no file {ENCAPSULATED}")]
    NoMachineConfig,
    #[error("{ENCAPSULATED}: {0}")]
    BadMachineConfig(String),
}

/// The name of the ConfigMap DPF reads for a DPUCluster.
pub fn configmap_name(dpu_cluster: &str) -> String {
    format!("bfcfg-{dpu_cluster}.cfg")
}

fn decode_data_url(source: &str) -> Result<Vec<u8>, IgnitionError> {
    data_url_bytes(source, false).map_err(IgnitionError::BadMachineConfig)
}

/// The bytes of a `data:` URL. `form` also reads `+` as a space in a
/// non-base64 URL, as HTML form decoding does (the DPU boot template's
/// compression step decodes that way: see `bfcfg::encode`).
pub(crate) fn data_url_bytes(source: &str, form: bool) -> Result<Vec<u8>, String> {
    let rest = source
        .strip_prefix("data:")
        .ok_or_else(|| "not a data: URL".to_string())?;
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| "a data: URL without a comma".to_string())?;
    if meta.split(';').any(|p| p == "base64") {
        base64::engine::general_purpose::STANDARD
            .decode(percent_decode_str(data).collect::<Vec<u8>>())
            .map_err(|e| format!("base64: {e}"))
    } else if form {
        Ok(percent_decode_str(&data.replace('+', " ")).collect())
    } else {
        Ok(percent_decode_str(data).collect())
    }
}

/// `ignition` with the embedded MachineConfig's `spec.osImageURL` set to
/// `os_image`; everything else as it was.
pub fn override_os_image(ignition: &[u8], os_image: &str) -> Result<Vec<u8>, IgnitionError> {
    let mut doc: Value =
        serde_json::from_slice(ignition).map_err(|e| IgnitionError::NotJson(e.to_string()))?;
    let files = doc
        .pointer_mut("/storage/files")
        .and_then(Value::as_array_mut)
        .ok_or(IgnitionError::NoMachineConfig)?;
    let file = files
        .iter_mut()
        .find(|f| f["path"] == ENCAPSULATED)
        .ok_or(IgnitionError::NoMachineConfig)?;
    if file
        .pointer("/contents/compression")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        return Err(IgnitionError::BadMachineConfig(
            "compressed contents are not supported".into(),
        ));
    }
    let source = file
        .pointer("/contents/source")
        .and_then(Value::as_str)
        .ok_or_else(|| IgnitionError::BadMachineConfig("no contents.source".into()))?;
    let mut mc: Value = serde_json::from_slice(&decode_data_url(source)?)
        .map_err(|e| IgnitionError::BadMachineConfig(format!("not JSON: {e}")))?;
    let spec = mc
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| IgnitionError::BadMachineConfig("no spec".into()))?;
    spec.insert("osImageURL".into(), Value::from(os_image));
    let text =
        serde_json::to_string(&mc).map_err(|e| IgnitionError::BadMachineConfig(e.to_string()))?;
    file["contents"]["source"] =
        Value::from(format!("data:,{}", utf8_percent_encode(&text, DATA_URL)));
    // A hash of the old contents would fail the new ones.
    if let Some(contents) = file["contents"].as_object_mut() {
        contents.remove("verification");
    }
    serde_json::to_vec(&doc).map_err(|e| IgnitionError::NotJson(e.to_string()))
}

/// The MachineConfig's `spec.osImageURL` in an ignition, if there is one.
pub fn os_image(ignition: &[u8]) -> Option<String> {
    let doc: Value = serde_json::from_slice(ignition).ok()?;
    let file = doc
        .pointer("/storage/files")?
        .as_array()?
        .iter()
        .find(|f| f["path"] == ENCAPSULATED)?;
    let mc: Value =
        serde_json::from_slice(&decode_data_url(file.pointer("/contents/source")?.as_str()?).ok()?)
            .ok()?;
    mc.pointer("/spec/osImageURL")?.as_str().map(str::to_string)
}

/// What a template was made from: a change to any of it regenerates it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inputs {
    pub dpu_cluster: String,
    pub dpu_cluster_namespace: String,
    pub release_image: String,
    pub os_image: String,
    /// The DPUDeployment's BFB and DPUFlavor, when one is named.
    pub bfb: Option<(String, String)>,
    pub flavor: Option<(String, String)>,
    /// What the template takes from the DPUFlavor and DPFOperatorConfig.
    pub content_digest: Option<String>,
    /// A digest of the pull secret and SSH key, which HyperShift's
    /// ignition carries: a rotation makes the template again.
    pub secrets_digest: Option<String>,
}

impl Inputs {
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::new();
        a.insert(
            format!("{DPF_PREFIX}cluster-name"),
            self.dpu_cluster.clone(),
        );
        a.insert(
            format!("{DPF_PREFIX}cluster-namespace"),
            self.dpu_cluster_namespace.clone(),
        );
        if let Some((name, ns)) = &self.bfb {
            a.insert(BFB_NAME_ANNOTATION.into(), name.clone());
            a.insert(BFB_NAMESPACE_ANNOTATION.into(), ns.clone());
        }
        if let Some((name, ns)) = &self.flavor {
            a.insert(format!("{DPF_PREFIX}dpuflavor-name"), name.clone());
            a.insert(format!("{DPF_PREFIX}dpuflavor-namespace"), ns.clone());
        }
        a.insert(
            format!("{OURS_PREFIX}machine-os-url"),
            self.os_image.clone(),
        );
        a.insert(
            format!("{OURS_PREFIX}ocp-release-image"),
            self.release_image.clone(),
        );
        if let Some(digest) = &self.content_digest {
            a.insert(CONTENT_DIGEST_ANNOTATION.into(), digest.clone());
        }
        if let Some(digest) = &self.secrets_digest {
            a.insert(SECRETS_DIGEST_ANNOTATION.into(), digest.clone());
        }
        a
    }

    /// The BFB annotations only: DPF matches a template to the BFB by them,
    /// and nothing in the template's content depends on them.
    pub fn bfb_annotations(&self) -> BTreeMap<String, Option<String>> {
        let (name, ns) = self
            .bfb
            .clone()
            .map_or((None, None), |(n, ns)| (Some(n), Some(ns)));
        [
            (BFB_NAME_ANNOTATION.to_string(), name),
            (BFB_NAMESPACE_ANNOTATION.to_string(), ns),
        ]
        .into()
    }
}

/// The digest [`Inputs::secrets_digest`] records.
pub fn secrets_digest(pull_secret: &[u8], ssh_key: &[u8]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [pull_secret, ssh_key] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    ctx.finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token of the newest `token-<name>-*` Secret: HyperShift keeps the
/// old release's token beside the new one for a while after an upgrade,
/// and the old one fetches the old release's ignition.
pub fn newest_token(
    secrets: &[k8s_openapi::api::core::v1::Secret],
    prefix: &str,
) -> Option<Vec<u8>> {
    secrets
        .iter()
        .filter(|s| {
            s.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(prefix))
        })
        .filter_map(|s| {
            let token = s.data.as_ref()?.get("token")?.0.clone();
            Some((
                s.metadata.creation_timestamp.clone().map(|t| t.0),
                s.metadata.name.clone(),
                token,
            ))
        })
        .max_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
        .map(|(_, _, token)| token)
}

/// Why a published template must be made again, as the IgnitionConfigured
/// reason; `None` when it is current.
pub fn stale(published: Option<&BTreeMap<String, String>>, want: &Inputs) -> Option<&'static str> {
    let Some(have) = published else {
        return Some("ConfigMapDeleted");
    };
    let want = want.annotations();
    let differs = |key: &str| have.get(key) != want.get(key);
    let dpf_differs = |bfb: bool| {
        want.keys()
            .chain(have.keys())
            .filter(|k| k.starts_with(DPF_PREFIX))
            .filter(|k| bfb == (*k == BFB_NAME_ANNOTATION || *k == BFB_NAMESPACE_ANNOTATION))
            .any(|k| differs(k))
    };
    if differs(RELEASE_ANNOTATION) {
        Some("ReleaseImageUpdated")
    } else if differs(MACHINE_OS_ANNOTATION) {
        Some("MachineOSURLChanged")
    } else if dpf_differs(false) {
        Some("DPUDeploymentChanged")
    } else if differs(CONTENT_DIGEST_ANNOTATION) {
        Some("DPUFlavorChanged")
    } else if differs(SECRETS_DIGEST_ANNOTATION) {
        Some("SecretsChanged")
    } else if dpf_differs(true) {
        // Only the BFB: the template is the same, its annotation is not.
        Some("BFBAnnotationUpdated")
    } else {
        None
    }
}

/// The bfcfg template ConfigMap, as applied.
pub fn configmap(inputs: &Inputs, ignition: &[u8], labels: &BTreeMap<String, String>) -> Value {
    let mut labels = labels.clone();
    labels.insert(TEMPLATE_LABEL.into(), "true".into());
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(&inputs.dpu_cluster),
            "namespace": inputs.dpu_cluster_namespace,
            "labels": labels,
            "annotations": inputs.annotations(),
        },
        "data": {TEMPLATE_KEY: String::from_utf8_lossy(ignition)},
    })
}

/// How long HyperShift's ignition server may take.
const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// An ignition is tens of KiB; this bounds a misbehaving server.
const MAX_IGNITION: usize = 16 << 20;

/// GETs `https://<endpoint>/ignition` as a node does: the bearer is the
/// base64 of the token, the server is trusted only if it chains to `ca_pem`.
pub async fn fetch(endpoint: &str, token: &[u8], ca_pem: &[u8]) -> Result<Vec<u8>, String> {
    use http_body_util::{BodyExt, Empty, Limited};
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("the ignition server's CA: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the ignition server's CA: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the ignition server's CA has no certificate".into());
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Empty<bytes::Bytes>>(connector);
    let host = endpoint
        .trim_start_matches("https://")
        .trim_end_matches('/');
    let bearer = base64::engine::general_purpose::STANDARD.encode(token);
    let req = http::Request::get(format!("https://{host}/ignition"))
        .header(http::header::AUTHORIZATION, format!("Bearer {bearer}"))
        .header(
            http::header::ACCEPT,
            "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1",
        )
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    let work = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("GET https://{host}/ignition: {e}"))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_IGNITION)
            .collect()
            .await
            .map_err(|e| format!("reading the ignition: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "GET https://{host}/ignition: HTTP {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            ));
        }
        Ok(body.to_vec())
    };
    tokio::time::timeout(FETCH_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no ignition from https://{host} within {FETCH_TIMEOUT:?}"
            ))
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An ignition shaped as HyperShift's ignition server serves it.
    pub fn hypershift_ignition(os_image: &str) -> Vec<u8> {
        let mc = json!({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": "rendered-worker"},
            "spec": {"osImageURL": os_image, "config": {"ignition": {"version": "3.2.0"}}, "kernelArguments": ["a=b c"]},
        });
        let text = serde_json::to_string(&mc).unwrap();
        serde_json::to_vec(&json!({
            "ignition": {"version": "3.2.0"},
            "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA core"]}]},
            "storage": {"files": [
                {"path": "/etc/kubernetes/kubeconfig", "contents": {"source": "data:,apiVersion%3A%20v1"}, "mode": 384},
                {"path": ENCAPSULATED, "contents": {"source": format!("data:,{}", utf8_percent_encode(&text, DATA_URL)), "verification": {"hash": "sha512-00"}}, "mode": 420},
            ]},
        }))
        .unwrap()
    }

    /// After an upgrade HyperShift keeps the old release's token Secret
    /// beside the new one: the newest is the one that fetches the new
    /// release's ignition, whatever the list order.
    #[test]
    fn the_newest_ignition_token_is_used() {
        use k8s_openapi::api::core::v1::Secret;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::ByteString;
        let token = |name: &str, second: i64, value: &str| Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
                )),
                ..Default::default()
            },
            data: Some([("token".to_string(), ByteString(value.as_bytes().to_vec()))].into()),
            ..Default::default()
        };
        let old = token("token-prod-aaaa", 1_000, "old");
        let new = token("token-prod-zzzz", 2_000, "new");
        let other = token("token-other-bbbb", 3_000, "other");
        for list in [
            vec![old.clone(), new.clone(), other.clone()],
            vec![new.clone(), other.clone(), old.clone()],
        ] {
            assert_eq!(newest_token(&list, "token-prod-"), Some(b"new".to_vec()));
        }
        assert_eq!(newest_token(&[other], "token-prod-"), None);
    }

    #[test]
    fn the_os_image_is_replaced_and_nothing_else() {
        let original =
            hypershift_ignition("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaa");
        let out = override_os_image(&original, "quay.io/example/rhcos-bfb:4.19.0").unwrap();
        assert_eq!(
            os_image(&out).as_deref(),
            Some("quay.io/example/rhcos-bfb:4.19.0")
        );
        let (a, b): (Value, Value) = (
            serde_json::from_slice(&original).unwrap(),
            serde_json::from_slice(&out).unwrap(),
        );
        assert_eq!(a["passwd"], b["passwd"]);
        assert_eq!(a["storage"]["files"][0], b["storage"]["files"][0]);
        assert!(b["storage"]["files"][1]["contents"]
            .get("verification")
            .is_none());
        // The rest of the MachineConfig survives the round trip.
        let file = &b["storage"]["files"][1];
        let mc: Value = serde_json::from_slice(
            &decode_data_url(file["contents"]["source"].as_str().unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(mc["spec"]["kernelArguments"], json!(["a=b c"]));
        // Idempotent.
        assert_eq!(
            override_os_image(&out, "quay.io/example/rhcos-bfb:4.19.0").unwrap(),
            out
        );
    }

    #[test]
    fn base64_sources_are_read_and_bad_ignitions_refused() {
        let mc = br#"{"spec":{"osImageURL":"old"}}"#;
        let ign = serde_json::to_vec(&json!({"storage": {"files": [{"path": ENCAPSULATED, "contents": {"source": format!("data:text/plain;base64,{}", base64::engine::general_purpose::STANDARD.encode(mc))}}]}})).unwrap();
        assert_eq!(
            os_image(&override_os_image(&ign, "new").unwrap()).as_deref(),
            Some("new")
        );
        assert!(matches!(
            override_os_image(b"<html>", "x"),
            Err(IgnitionError::NotJson(_))
        ));
        assert_eq!(
            override_os_image(br#"{"storage":{"files":[]}}"#, "x"),
            Err(IgnitionError::NoMachineConfig)
        );
        let gz = serde_json::to_vec(&json!({"storage": {"files": [{"path": ENCAPSULATED, "contents": {"source": "data:;base64,H4sI", "compression": "gzip"}}]}})).unwrap();
        assert!(matches!(
            override_os_image(&gz, "x"),
            Err(IgnitionError::BadMachineConfig(_))
        ));
    }

    #[test]
    fn a_template_is_made_again_when_what_it_was_made_from_changes() {
        let inputs = Inputs {
            dpu_cluster: "dc".into(),
            dpu_cluster_namespace: "dpu".into(),
            release_image: "r:4.19.0".into(),
            os_image: "bfb:4.19.0".into(),
            bfb: Some(("bfb-a".into(), "dpu".into())),
            flavor: Some(("flavor-a".into(), "dpu".into())),
            content_digest: Some("d1".into()),
            secrets_digest: Some(secrets_digest(b"pull", b"key")),
        };
        let published = inputs.annotations();
        assert_eq!(stale(Some(&published), &inputs), None);
        assert_eq!(stale(None, &inputs), Some("ConfigMapDeleted"));
        let with = |f: &dyn Fn(&mut Inputs)| {
            let mut i = inputs.clone();
            f(&mut i);
            stale(Some(&published), &i)
        };
        assert_eq!(
            with(&|i| i.release_image = "r:4.19.1".into()),
            Some("ReleaseImageUpdated")
        );
        assert_eq!(
            with(&|i| i.os_image = "bfb:other".into()),
            Some("MachineOSURLChanged")
        );
        assert_eq!(
            with(&|i| i.flavor = Some(("flavor-b".into(), "dpu".into()))),
            Some("DPUDeploymentChanged")
        );
        // The BFB alone: the annotation follows, the content is kept.
        assert_eq!(with(&|i| i.bfb = None), Some("BFBAnnotationUpdated"));
        assert_eq!(
            with(&|i| i.bfb = Some(("bfb-new".into(), "dpu".into()))),
            Some("BFBAnnotationUpdated")
        );
        assert_eq!(
            with(&|i| {
                i.bfb = Some(("bfb-new".into(), "dpu".into()));
                i.flavor = Some(("flavor-b".into(), "dpu".into()));
            }),
            Some("DPUDeploymentChanged")
        );
        // A rotated pull secret or SSH key is in HyperShift's ignition.
        assert_eq!(
            with(&|i| i.secrets_digest = Some(secrets_digest(b"new", b"key"))),
            Some("SecretsChanged")
        );
        // The flavor's content (or the MTU) edited, under the same name.
        assert_eq!(
            with(&|i| i.content_digest = Some("d2".into())),
            Some("DPUFlavorChanged")
        );
        // A template published before the digest was recorded is made again.
        let mut older = published.clone();
        older.remove(CONTENT_DIGEST_ANNOTATION);
        assert_eq!(stale(Some(&older), &inputs), Some("DPUFlavorChanged"));
        // A renamed flavor is reported as such, not as a content change.
        assert_eq!(
            with(&|i| {
                i.flavor = Some(("flavor-b".into(), "dpu".into()));
                i.content_digest = Some("d2".into());
            }),
            Some("DPUDeploymentChanged")
        );
        let cm = configmap(&inputs, b"{}", &BTreeMap::new());
        assert_eq!(cm["metadata"]["name"], "bfcfg-dc.cfg");
        assert_eq!(cm["metadata"]["labels"][TEMPLATE_LABEL], "true");
        assert_eq!(cm["data"][TEMPLATE_KEY], "{}");
        assert_eq!(
            cm["metadata"]["annotations"]
                ["provisioning.dpu.nvidia.com/bfcfg-template-dpuflavor-name"],
            "flavor-a"
        );
    }
}
