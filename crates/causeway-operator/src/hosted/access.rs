//! Reaching a hosted cluster from the management cluster, for every
//! controller that works in one (the Infra side's apps ingress, the DPF
//! bridge's CSR approver): its admin client from HyperShift's admin
//! kubeconfig, and an identity of causeway's own there with a short-lived
//! token, so that the admin credential is used only to set that identity
//! up.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;

use crate::k8s::apply::apply_params_as;

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
