//! How the CSR approver reaches a hosted cluster: as its admin through
//! HyperShift's admin kubeconfig, only to give itself a least-privilege
//! identity (a ServiceAccount, a ClusterRole allowing CSR approval for the
//! two kubelet signers, a binding) and a short-lived token of it, under
//! which it then works.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use super::csr::{self};
use crate::k8s::apply::apply_params_as;

/// The field manager of the approver's part of the provisioner status and
/// of its objects in the hosted cluster.
pub const APPROVER_MANAGER: &str = "causeway-csr-approver";
/// The approver's identity in the hosted cluster.
pub const HOSTED_NAMESPACE: &str = "kube-system";
pub const HOSTED_ACCOUNT: &str = "causeway-csr-approver";
pub const HOSTED_ROLE: &str = "causeway:csr-approver";
/// How long the approver's token in the hosted cluster lasts; a session
/// ends before it does.
pub(super) const TOKEN_SECONDS: i64 = 3600;

/// How the hosted cluster's API server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostedEndpoint {
    /// `https://kube-apiserver.<ns>-<name>.svc.cluster.local:6443`, the
    /// control plane's Service on the management cluster.
    Service,
    /// The server the admin kubeconfig names.
    Kubeconfig,
}

/// Why the hosted cluster cannot be reached as its admin.
pub(crate) enum Unavailable {
    /// HyperShift's admin kubeconfig is missing or unreadable.
    NoKubeconfig(String),
    /// A client could not be built from it.
    Unreachable(String),
}

/// The hosted cluster's admin client, from HyperShift's admin kubeconfig.
pub(crate) async fn admin_client(
    client: &Client,
    endpoint: HostedEndpoint,
    namespace: &str,
    name: &str,
) -> Result<(Config, Client), Unavailable> {
    let secret_name = format!("{name}-admin-kubeconfig");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = match secrets.get_opt(&secret_name).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(Unavailable::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name} does not exist yet"
            )))
        }
        Err(e) => {
            return Err(Unavailable::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name}: {e}"
            )))
        }
    };
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| {
            Unavailable::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name} has no key kubeconfig"
            ))
        })?;
    let mut kubeconfig = Kubeconfig::from_yaml(&text)
        .map_err(|e| Unavailable::NoKubeconfig(format!("Secret {namespace}/{secret_name}: {e}")))?;
    if endpoint == HostedEndpoint::Service {
        let server = format!("https://kube-apiserver.{namespace}-{name}.svc.cluster.local:6443");
        for c in &mut kubeconfig.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(server.clone());
            }
        }
    }
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Unavailable::NoKubeconfig(format!("Secret {namespace}/{secret_name}: {e}")))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    let client = Client::try_from(config.clone())
        .map_err(|e| Unavailable::Unreachable(format!("building a client: {e}")))?;
    Ok((config, client))
}

/// The approver's own ClusterRole in the hosted cluster; with the name of
/// the kubelet serving CA's ConfigMap, read access to ConfigMaps of that
/// name only.
fn hosted_role(serving_ca: Option<&str>) -> serde_json::Value {
    let mut role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": HOSTED_ROLE},
        "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["patch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "verbs": ["approve"],
             "resourceNames": [csr::BOOTSTRAP_SIGNER, csr::SERVING_SIGNER]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        ],
    });
    if let (Some(name), Some(rules)) = (serving_ca, role["rules"].as_array_mut()) {
        rules.push(json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [name]}));
    }
    role
}

/// Gives the approver its own identity in the hosted cluster and returns a
/// client under a short-lived token of it.
pub(super) async fn least_privilege(
    admin: &Client,
    config: &Config,
    serving_ca: Option<&str>,
) -> Result<Client, kube::Error> {
    let identity = HostedIdentity {
        manager: APPROVER_MANAGER,
        namespace: HOSTED_NAMESPACE,
        account: HOSTED_ACCOUNT,
        role: HOSTED_ROLE,
    };
    identity
        .client(admin, config, hosted_role(serving_ca), TOKEN_SECONDS)
        .await
}

/// An identity of causeway's own in a hosted cluster: a ServiceAccount
/// bound to a ClusterRole of the same purpose, all applied by `manager`.
pub(crate) struct HostedIdentity {
    pub manager: &'static str,
    pub namespace: &'static str,
    pub account: &'static str,
    pub role: &'static str,
}

impl HostedIdentity {
    /// Applies the account, `role` (the ClusterRole, named `self.role`) and
    /// their binding with the admin client, then returns a client of
    /// `config`'s cluster under a token of the account valid `seconds`.
    pub(crate) async fn client(
        &self,
        admin: &Client,
        config: &Config,
        role: serde_json::Value,
        seconds: i64,
    ) -> Result<Client, kube::Error> {
        let pp = apply_params_as(self.manager);
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), self.namespace);
        accounts
            .patch(
                self.account,
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": self.account, "namespace": self.namespace},
                })),
            )
            .await?;
        Api::<ClusterRole>::all(admin.clone())
            .patch(self.role, &pp, &Patch::Apply(role))
            .await?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(
                self.role,
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": self.role},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": self.role},
                    "subjects": [{"kind": "ServiceAccount", "name": self.account, "namespace": self.namespace}],
                })),
            )
            .await?;
        client_as(&accounts, self.account, config, seconds).await
    }
}

/// A client of `config`'s cluster under a short-lived token of the
/// ServiceAccount `account` (of `accounts`' namespace).
async fn client_as(
    accounts: &Api<ServiceAccount>,
    account: &str,
    config: &Config,
    seconds: i64,
) -> Result<Client, kube::Error> {
    let token = accounts
        .create_token_request(
            account,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(seconds),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    if token.is_empty() {
        return Err(kube::Error::Service(Box::new(std::io::Error::other(
            "the TokenRequest returned no token",
        ))));
    }
    let mut config = config.clone();
    config.auth_info = serde_json::from_value(json!({ "token": token }))
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Client::try_from(config)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_hosted_role_approves_for_the_two_kubelet_signers_only() {
        let role = hosted_role(None);
        let rules = role["rules"].as_array().unwrap();
        let approve: Vec<_> = rules
            .iter()
            .filter(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v == "approve")
            })
            .collect();
        assert_eq!(approve.len(), 1);
        assert_eq!(approve[0]["resources"], json!(["signers"]));
        assert_eq!(
            approve[0]["resourceNames"],
            json!([csr::BOOTSTRAP_SIGNER, csr::SERVING_SIGNER])
        );
        // Nothing may be created, deleted or written but the approval.
        for r in rules {
            for v in r["verbs"].as_array().unwrap() {
                assert!(
                    ["get", "list", "watch", "approve"].contains(&v.as_str().unwrap())
                        || (v == "patch"
                            && r["resources"] == json!(["certificatesigningrequests/approval"])),
                    "{r}"
                );
            }
        }
        // The CA's ConfigMap, by name only, and nothing else of ConfigMaps.
        assert!(!rules
            .iter()
            .any(|r| r["resources"] == json!(["configmaps"])));
        let role = hosted_role(Some("kubelet-serving-ca"));
        let maps: Vec<_> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["resources"] == json!(["configmaps"]))
            .collect();
        assert_eq!(
            maps,
            vec![
                &json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["kubelet-serving-ca"]})
            ]
        );
    }
}
