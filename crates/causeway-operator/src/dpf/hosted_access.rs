//! How the CSR approver reaches a hosted cluster: as its admin through
//! HyperShift's admin kubeconfig, only to give itself a least-privilege
//! identity (a ServiceAccount, a ClusterRole allowing CSR approval for the
//! two kubelet signers, a binding) and a short-lived token of it, under
//! which it then works.

use kube::{Client, Config};
use serde_json::json;

use super::csr::{self};
pub(crate) use crate::hosted::{admin_client, HostedIdentity, Unavailable};

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
