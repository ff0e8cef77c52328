//! Applies a multi-document YAML manifest, such as the output of
//! `helm template`, by server-side apply, each kind looked up by discovery.
//! For installs, benches and tests that stand up the chart without helm's
//! release machinery; the controllers never use it.

use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::Scope;
use kube::{Client, ResourceExt};

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("document {index}: not YAML: {source}")]
    Yaml {
        index: usize,
        source: serde_saphyr::Error,
    },
    #[error("document {index}: not a Kubernetes object: {message}")]
    Object { index: usize, message: String },
    #[error("{kind} {name}: {source}")]
    Api {
        kind: String,
        name: String,
        source: kube::Error,
    },
}

/// How long a kind may take to appear in discovery (a CRD applied just
/// before is served a moment after it is established).
const DISCOVERY_WAIT: Duration = Duration::from_secs(15);

/// Applies every document of `yaml`, in order, as `manager`. Objects
/// without a namespace that need one go to `default_namespace`.
pub async fn apply(
    client: &Client,
    yaml: &str,
    default_namespace: &str,
    manager: &str,
) -> Result<Vec<DynamicObject>, ManifestError> {
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)
        .map_err(|source| ManifestError::Yaml { index: 0, source })?;
    let mut applied = Vec::new();
    for (index, value) in docs.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject =
            serde_json::from_value(value).map_err(|e| ManifestError::Object {
                index,
                message: e.to_string(),
            })?;
        applied.push(apply_object(client, obj, default_namespace, manager, index).await?);
    }
    Ok(applied)
}

async fn apply_object(
    client: &Client,
    obj: DynamicObject,
    default_namespace: &str,
    manager: &str,
    index: usize,
) -> Result<DynamicObject, ManifestError> {
    let types = obj.types.clone().ok_or_else(|| ManifestError::Object {
        index,
        message: "no apiVersion or kind".into(),
    })?;
    let gvk = GroupVersionKind::try_from(&types).map_err(|e| ManifestError::Object {
        index,
        message: e.to_string(),
    })?;
    let api_error = |source| ManifestError::Api {
        kind: types.kind.clone(),
        name: obj.name_any(),
        source,
    };
    let deadline = Instant::now() + DISCOVERY_WAIT;
    let (resource, capabilities) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(e) if Instant::now() > deadline => return Err(api_error(e)),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj.metadata
                .namespace
                .as_deref()
                .unwrap_or(default_namespace),
            &resource,
        ),
    };
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&obj),
    )
    .await
    .map_err(api_error)
}

/// A token for a ServiceAccount from the TokenRequest API, as a kubelet
/// gets one for a pod: what runs with it has exactly that account's rights.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
    audience: &str,
    lifetime: Duration,
) -> Result<String, ManifestError> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX)),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued: TokenRequest = api
        .create_subresource(
            "token",
            service_account,
            &kube::api::PostParams::default(),
            &request,
        )
        .await
        .map_err(|source| ManifestError::Api {
            kind: "ServiceAccount".into(),
            name: format!("{namespace}/{service_account}"),
            source,
        })?;
    issued
        .status
        .map(|s| s.token)
        .ok_or_else(|| ManifestError::Object {
            index: 0,
            message: format!("no token came back for {namespace}/{service_account}"),
        })
}

/// The documents of a multi-document manifest, less those of `kind` (the
/// tests and the bench run the operator's binary themselves, so they drop
/// the chart's Deployment).
pub fn without_kind(yaml: &str, kind: &str) -> String {
    let line = format!("kind: {kind}");
    yaml.split("\n---")
        .filter(|doc| !doc.lines().any(|l| l.trim() == line))
        .collect::<Vec<_>>()
        .join("\n---")
}

/// The manifest without CEL rules (`x-kubernetes-validations`). A server
/// before 1.25 drops them from a CRD written by create or update (what
/// `helm install` does) but refuses them in a server-side apply, which is
/// how [`apply`] installs: the test server is 1.20.
pub fn without_cel(yaml: &str) -> Result<String, ManifestError> {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("x-kubernetes-validations");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(list) => list.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)
        .map_err(|source| ManifestError::Yaml { index: 0, source })?;
    let mut out = Vec::new();
    for (index, mut doc) in docs.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        strip(&mut doc);
        out.push(
            serde_json::to_string(&doc).map_err(|e| ManifestError::Object {
                index,
                message: e.to_string(),
            })?,
        );
    }
    Ok(out.join("\n---\n"))
}

/// A kubeconfig for `server` (its CA in the file `ca`) that authenticates
/// with a bearer token.
pub fn token_kubeconfig(server: &str, ca: &std::path::Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: {server}, certificate-authority: {}}}\nusers:\n- name: u\n  user: {{token: {token}}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        ca.display()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn cel_rules_are_dropped_at_every_depth_and_the_rest_is_kept() {
        let yaml = "kind: CustomResourceDefinition\nspec:\n  x-kubernetes-validations: [{rule: a}]\n  properties:\n    spec:\n      type: object\n      x-kubernetes-validations: [{rule: b}]\n---\nkind: ConfigMap\n";
        let out = super::without_cel(yaml).unwrap();
        assert!(!out.contains("x-kubernetes-validations"), "{out}");
        assert!(out.contains("\"type\":\"object\""), "{out}");
        assert_eq!(out.split("\n---\n").count(), 2);
        assert!(super::without_cel("a: [").is_err());
    }

    use super::*;

    #[test]
    fn without_kind_drops_only_documents_of_that_kind() {
        let yaml = "kind: ServiceAccount\nmetadata: {name: a}\n---\nkind: Deployment\nmetadata: {name: b}\n---\nkind: Role\n";
        let kept = without_kind(yaml, "Deployment");
        assert!(kept.contains("ServiceAccount") && kept.contains("Role"));
        assert!(!kept.contains("Deployment"));
    }
}
