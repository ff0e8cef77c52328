//! HostedClusters that ask for one get an Infra: a HostedCluster
//! (hypershift.openshift.io/v1beta1) annotated with [`ANNOTATION`] gets an
//! Infra of the same name and namespace, whose spec is the annotation's
//! value (JSON or YAML, the Infra's spec fields) with `hostedClusterRef`
//! pointing back. The Infra is owned by the HostedCluster, so it goes when
//! the cluster does.
//!
//! Off unless the operator is started with it: whoever may annotate a
//! HostedCluster would otherwise get NET_ADMIN pods made for them. The
//! HostedCluster API may be installed after the operator starts; it is
//! looked for every [`API_POLL`] until it is there.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::crd::{HostedClusterRef, Infra, InfraSpec};
use crate::error::Error;
use crate::k8s::apply::{Applier, Noise};
use crate::k8s::metrics::{OperatorMetrics, ReconcileTimer};
use crate::k8s::resources::hosted_cluster_resource;
use crate::k8s::watch::Scope;
use crate::k8s::MANAGER;

/// The annotation whose value is the Infra spec to create.
pub const ANNOTATION: &str = "causeway.io/infra";

/// How often the operator looks for the HostedCluster API while it is not
/// installed.
pub const API_POLL: Duration = Duration::from_secs(10);

/// The Infra a HostedCluster asks for, if it asks: `None` without the
/// annotation, `Err` with a message when its value is not an Infra spec.
pub fn infra_for(hc: &DynamicObject) -> Option<Result<Infra, String>> {
    let text = hc.annotations().get(ANNOTATION)?;
    let mut spec: InfraSpec = match serde_saphyr::from_str(text) {
        Ok(s) => s,
        Err(e) => {
            return Some(Err(format!(
                "annotation {ANNOTATION}: not an Infra spec: {e}"
            )))
        }
    };
    let name = hc.name_any();
    let namespace = hc.namespace().unwrap_or_default();
    spec.hosted_cluster_ref = Some(HostedClusterRef {
        name: name.clone(),
        namespace: Some(namespace.clone()),
    });
    let mut infra = Infra::new(&name, spec);
    infra.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace),
        labels: Some(
            [(
                "app.kubernetes.io/managed-by".to_string(),
                MANAGER.to_string(),
            )]
            .into(),
        ),
        owner_references: Some(vec![OwnerReference {
            api_version: "hypershift.openshift.io/v1beta1".into(),
            kind: "HostedCluster".into(),
            name,
            uid: hc.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    };
    Some(Ok(infra))
}

pub struct HostedContext {
    pub client: Client,
    pub applier: Applier,
    pub metrics: Option<OperatorMetrics>,
}

const CONTROLLER: &str = "hostedcluster";

pub async fn reconcile(hc: Arc<DynamicObject>, ctx: Arc<HostedContext>) -> Result<Action, Error> {
    let timer = ReconcileTimer::start(ctx.metrics.as_ref(), CONTROLLER);
    let result = make_infra(&hc, &ctx).await;
    timer.finish(&result, true);
    result
}

async fn make_infra(hc: &DynamicObject, ctx: &HostedContext) -> Result<Action, Error> {
    match infra_for(hc) {
        None => {}
        Some(Err(message)) => {
            tracing::warn!(hosted_cluster = %hc.name_any(), %message, "no Infra made");
        }
        Some(Ok(infra)) => {
            let ns = infra.namespace().unwrap_or_default();
            let api: Api<Infra> = Api::namespaced(ctx.client.clone(), &ns);
            ctx.applier
                .apply_as(&api, "Infra", &infra.name_any(), &infra)
                .await?;
        }
    }
    Ok(Action::requeue(Duration::from_secs(600)))
}

fn error_policy(hc: Arc<DynamicObject>, error: &Error, _: Arc<HostedContext>) -> Action {
    tracing::warn!(hosted_cluster = %hc.name_any(), %error, "retrying in 30 s");
    Action::requeue(Duration::from_secs(30))
}

/// Runs until `shutdown` resolves. While the HostedCluster API is not
/// installed, it waits for it.
pub async fn run(
    client: Client,
    scope: Scope,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    if let Some(m) = &metrics {
        m.controller_started(CONTROLLER);
    }
    let ar = hosted_cluster_resource();
    let api: Api<DynamicObject> = scope.api_with(&client, &ar);
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let mut said = false;
    loop {
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => break,
            Err(e) => {
                if !said {
                    tracing::info!(error = %e, every_seconds = API_POLL.as_secs(), "no HostedCluster API yet: looking again until it is installed");
                    said = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.clone() => return,
            _ = tokio::time::sleep(API_POLL) => {}
        }
    }
    tracing::info!("HostedCluster API found: annotated HostedClusters get Infras");
    let ctx = Arc::new(HostedContext {
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Info),
        metrics,
        client: client.clone(),
    });
    let infras: Api<Infra> = scope.api(&client);
    Controller::new_with(api, watcher::Config::default(), ar)
        .owns(infras, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(error = %e, "hostedcluster controller");
            }
        })
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hc(annotation: Option<&str>) -> DynamicObject {
        let mut o = DynamicObject::new("hc1", &hosted_cluster_resource()).within("clusters");
        o.metadata.uid = Some("uid-1".into());
        if let Some(a) = annotation {
            o.metadata.annotations = Some([(ANNOTATION.to_string(), a.to_string())].into());
        }
        o
    }

    #[test]
    fn no_annotation_no_infra() {
        assert!(infra_for(&hc(None)).is_none());
    }

    #[test]
    fn the_annotation_becomes_an_owned_infra_pointing_back() {
        let spec = r#"{"networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1",
            "networkAttachmentDefinition": "vlan100"},
            "infraComponents": {"dhcp": {"serverIP": "192.168.100.2",
                "rangeStart": "192.168.100.100", "rangeEnd": "192.168.100.200"}}}"#;
        let infra = infra_for(&hc(Some(spec))).unwrap().unwrap();
        assert_eq!(infra.name_any(), "hc1");
        assert_eq!(infra.namespace().as_deref(), Some("clusters"));
        let owner = &infra.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("HostedCluster", "uid-1")
        );
        assert_eq!(
            infra.spec.hosted_cluster_ref,
            Some(HostedClusterRef {
                name: "hc1".into(),
                namespace: Some("clusters".into())
            })
        );
        assert_eq!(
            infra.spec.network_config.network_attachment_definition,
            "vlan100"
        );
    }

    #[test]
    fn a_bad_annotation_says_why() {
        let err = infra_for(&hc(Some("networkConfig: 7")))
            .unwrap()
            .unwrap_err();
        assert!(
            err.starts_with("annotation causeway.io/infra: not an Infra spec"),
            "{err}"
        );
    }
}
