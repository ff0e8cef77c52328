//! `causeway operator must-gather`: what a support case starts with, in
//! one tarball. Collected through the API server the operator uses:
//! - causeway's custom resources (Infras, InfraClusterAttachments,
//!   DPFHCPProvisioners, the settings object) and the HostedClusters and
//!   NodePools they lead to;
//! - in the operator's namespace and every namespace an Infra or a
//!   provisioner is in: Deployments, StatefulSets, Pods, Services,
//!   ConfigMaps (the rendered configs), Leases, Events, and Secrets with
//!   every value replaced by its length;
//! - the logs of every container of the operator's and the data plane's
//!   pods, and the data plane's `/readyz`, `/ha` and `/leases` answers
//!   through the API server's pod proxy.
//!
//! What cannot be read (a kind not served, a pod without a node, a proxy
//! the API server cannot reach) is listed in `errors.txt`, never a reason
//! to stop: a must-gather is run when things are broken.

use std::collections::BTreeSet;
use std::io::Write;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret, Service};
use kube::api::{Api, DynamicObject, ListParams, LogParams};
use kube::core::ApiResource;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::dpf::crd::{DPFHCPProvisioner, DPFHCPProvisionerConfig};
use crate::infra::attachment::InfraClusterAttachment;
use crate::infra::crd::Infra;
use crate::infra::plan::ADMIN_PORT;
use crate::k8s::resources::{hosted_cluster_resource, node_pool_resource};
use crate::k8s::MANAGED_BY;

/// The most of one container's log taken: the end of it.
const LOG_LINES: i64 = 5000;
/// The data plane's admin answers a support case reads first.
const ADMIN_PATHS: [&str; 3] = ["readyz", "ha", "leases"];

#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    #[error("writing the tarball: {0}")]
    Write(#[from] std::io::Error),
}

/// The tarball being written, and what could not be read.
struct Bundle<W: Write> {
    tar: tar::Builder<W>,
    errors: Vec<String>,
    files: usize,
}

impl<W: Write> Bundle<W> {
    fn add(&mut self, path: &str, bytes: &[u8]) -> Result<(), GatherError> {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        self.tar
            .append_data(&mut header, format!("must-gather/{path}"), bytes)?;
        self.files += 1;
        Ok(())
    }

    fn failed(&mut self, what: String) {
        self.errors.push(what);
    }
}

/// What a Secret says without its values: its metadata (the
/// last-applied annotation dropped, which holds them), type and keys, each
/// value as its length.
pub fn redact(secret: &Secret) -> Value {
    let mut meta = secret.metadata.clone();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    let mut data = serde_json::Map::new();
    for (k, v) in secret.data.iter().flatten() {
        data.insert(
            k.clone(),
            Value::from(format!("REDACTED ({} bytes)", v.0.len())),
        );
    }
    for (k, v) in secret.string_data.iter().flatten() {
        data.insert(
            k.clone(),
            Value::from(format!("REDACTED ({} bytes)", v.len())),
        );
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": secret.type_,
        "data": data,
    })
}

fn yaml(v: &impl Serialize) -> Vec<u8> {
    serde_saphyr::to_string(v).unwrap_or_default().into_bytes()
}

/// An object as written out: without managedFields, which only add noise.
fn cleaned<K: Serialize>(v: &K) -> Value {
    let mut v = serde_json::to_value(v).unwrap_or(Value::Null);
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    v
}

/// Every object `api` lists, one file each under `dir`, in a directory
/// per namespace when `api` spans them.
async fn objects<K, W>(
    bundle: &mut Bundle<W>,
    api: Api<K>,
    dir: &str,
) -> Result<Vec<K>, GatherError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    W: Write,
{
    written_as(bundle, api, dir, cleaned).await
}

/// [`objects`], each written as `render` makes it.
async fn written_as<K, W, V>(
    bundle: &mut Bundle<W>,
    api: Api<K>,
    dir: &str,
    render: impl Fn(&K) -> V,
) -> Result<Vec<K>, GatherError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    W: Write,
    V: Serialize,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            let spans_namespaces = !dir.starts_with("namespaces/");
            for o in &list.items {
                let path = match (spans_namespaces, o.namespace()) {
                    (true, Some(ns)) => format!("{dir}/{ns}/{}.yaml", o.name_any()),
                    _ => format!("{dir}/{}.yaml", o.name_any()),
                };
                bundle.add(&path, &yaml(&render(o)))?;
            }
            Ok(list.items)
        }
        Err(e) => {
            bundle.failed(format!("{dir}: {e}"));
            Ok(Vec::new())
        }
    }
}

async fn dynamic_objects<W: Write>(
    bundle: &mut Bundle<W>,
    client: &Client,
    resource: &ApiResource,
    dir: &str,
) -> Result<(), GatherError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    objects(bundle, api, dir).await.map(drop)
}

/// Writes the must-gather tarball (gzipped) for the operator in
/// `operator_namespace` to `out`; returns how many files it holds and
/// what could not be read.
pub async fn gather(
    client: &Client,
    operator_namespace: &str,
    out: impl Write,
) -> Result<(usize, Vec<String>), GatherError> {
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut bundle = Bundle {
        tar: tar::Builder::new(gz),
        errors: Vec::new(),
        files: 0,
    };
    // The custom resources, and the namespaces they are in.
    let mut namespaces = BTreeSet::from([operator_namespace.to_string()]);
    let infras = objects(&mut bundle, Api::<Infra>::all(client.clone()), "infras").await?;
    namespaces.extend(infras.iter().filter_map(ResourceExt::namespace));
    let attachments = objects(
        &mut bundle,
        Api::<InfraClusterAttachment>::all(client.clone()),
        "infraclusterattachments",
    )
    .await?;
    namespaces.extend(attachments.iter().filter_map(ResourceExt::namespace));
    let provisioners = objects(
        &mut bundle,
        Api::<DPFHCPProvisioner>::all(client.clone()),
        "dpfhcpprovisioners",
    )
    .await?;
    namespaces.extend(provisioners.iter().filter_map(ResourceExt::namespace));
    objects(
        &mut bundle,
        Api::<DPFHCPProvisionerConfig>::all(client.clone()),
        "dpfhcpprovisionerconfigs",
    )
    .await?;
    dynamic_objects(
        &mut bundle,
        client,
        &hosted_cluster_resource(),
        "hostedclusters",
    )
    .await?;
    dynamic_objects(&mut bundle, client, &node_pool_resource(), "nodepools").await?;

    for ns in &namespaces {
        let base = format!("namespaces/{ns}");
        objects(
            &mut bundle,
            Api::<Deployment>::namespaced(client.clone(), ns),
            &format!("{base}/deployments"),
        )
        .await?;
        objects(
            &mut bundle,
            Api::<StatefulSet>::namespaced(client.clone(), ns),
            &format!("{base}/statefulsets"),
        )
        .await?;
        objects(
            &mut bundle,
            Api::<Service>::namespaced(client.clone(), ns),
            &format!("{base}/services"),
        )
        .await?;
        objects(
            &mut bundle,
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            &format!("{base}/configmaps"),
        )
        .await?;
        objects(
            &mut bundle,
            Api::<Lease>::namespaced(client.clone(), ns),
            &format!("{base}/leases"),
        )
        .await?;
        objects(
            &mut bundle,
            Api::<Event>::namespaced(client.clone(), ns),
            &format!("{base}/events"),
        )
        .await?;
        written_as(
            &mut bundle,
            Api::<Secret>::namespaced(client.clone(), ns),
            &format!("{base}/secrets"),
            redact,
        )
        .await?;
        let pods = objects(
            &mut bundle,
            Api::<Pod>::namespaced(client.clone(), ns),
            &format!("{base}/pods"),
        )
        .await?;
        for pod in &pods {
            let ours = ns == operator_namespace
                || pod.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1);
            if ours {
                pod_logs(&mut bundle, client, ns, pod, &base).await?;
            }
            if pod.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1) {
                admin_answers(&mut bundle, client, ns, pod, &base).await?;
            }
        }
    }
    let summary = format!(
        "causeway must-gather\noperator namespace: {operator_namespace}\nnamespaces: {}\nInfras: {}, InfraClusterAttachments: {}, DPFHCPProvisioners: {}\nnot collected: {}\n",
        namespaces.iter().cloned().collect::<Vec<_>>().join(", "),
        infras.len(),
        attachments.len(),
        provisioners.len(),
        bundle.errors.len(),
    );
    bundle.add("summary.txt", summary.as_bytes())?;
    let errors = bundle.errors.join("\n") + "\n";
    bundle.add("errors.txt", errors.as_bytes())?;
    let files = bundle.files;
    let failed = std::mem::take(&mut bundle.errors);
    bundle.tar.into_inner()?.finish()?.flush()?;
    Ok((files, failed))
}

async fn pod_logs<W: Write>(
    bundle: &mut Bundle<W>,
    client: &Client,
    ns: &str,
    pod: &Pod,
    base: &str,
) -> Result<(), GatherError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = pod.name_any();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for container in containers {
        let params = LogParams {
            container: Some(container.clone()),
            tail_lines: Some(LOG_LINES),
            ..Default::default()
        };
        let path = format!("{base}/logs/{name}/{container}.log");
        match api.logs(&name, &params).await {
            Ok(text) => bundle.add(&path, text.as_bytes())?,
            Err(e) => bundle.failed(format!("{path}: {e}")),
        }
    }
    Ok(())
}

/// The data plane pod's admin answers, through the API server's proxy.
async fn admin_answers<W: Write>(
    bundle: &mut Bundle<W>,
    client: &Client,
    ns: &str,
    pod: &Pod,
    base: &str,
) -> Result<(), GatherError> {
    let name = pod.name_any();
    for path in ADMIN_PATHS {
        let uri = format!("/api/v1/namespaces/{ns}/pods/{name}:{ADMIN_PORT}/proxy/{path}");
        let file = format!("{base}/admin/{name}/{path}.txt");
        let request = match http::Request::get(&uri).body(Vec::new()) {
            Ok(r) => r,
            Err(e) => {
                bundle.failed(format!("{file}: {e}"));
                continue;
            }
        };
        match client.request_text(request).await {
            Ok(text) => bundle.add(&file, text.as_bytes())?,
            Err(e) => bundle.failed(format!("{file}: {e}")),
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn a_secret_keeps_its_keys_and_loses_its_values() {
        let mut s = Secret::default();
        s.metadata.name = Some("pull".into());
        s.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{\"data\":{\"token\":\"c2VjcmV0\"}}".to_string(),
            )]
            .into(),
        );
        s.data = Some([("token".to_string(), ByteString(b"secret".to_vec()))].into());
        s.string_data = Some([("password".to_string(), "hunter2".to_string())].into());
        let out = serde_json::to_string(&redact(&s)).unwrap();
        assert!(
            !out.contains("secret\"") && !out.contains("c2VjcmV0") && !out.contains("hunter2"),
            "{out}"
        );
        let v = redact(&s);
        assert_eq!(v["data"]["token"], "REDACTED (6 bytes)");
        assert_eq!(v["data"]["password"], "REDACTED (7 bytes)");
        assert_eq!(v["metadata"]["name"], "pull");
    }
}
