//! PodMonitors whose CRD comes and goes while the operator runs, against a
//! real API server of this test process's own (the kind must be absent
//! when the operator starts, which a cluster shared with monitoring_kube
//! cannot promise): installed after the start, the Infra's PodMonitor is
//! made without a restart; deleted, reconciles go on without errors.
//!
//! Needs root and the cached API server binaries (tests/kube/cluster.sh);
//! without them it prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

use causeway_operator::infra::crd::Infra;
use kube_cluster::{
    admin_get, apply_yaml, eventually, install_fixture_crds, metric, own_cluster, test_namespace,
    Operator, NAD_CRD, POD_MONITOR_CRD,
};

const WAIT: Duration = Duration::from_secs(90);

/// A reconcile of the Infra `name`, forced by a change to an object it
/// owns but whose annotations it does not manage (its ServiceAccount).
async fn nudge(sas: &Api<ServiceAccount>, name: &str, n: u32) {
    let _ = sas
        .patch(
            &format!("{name}-causeway"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"test.causeway.io/nudge": n.to_string()}}})),
        )
        .await;
}

#[tokio::test]
async fn a_pod_monitor_crd_installed_after_the_start_is_used_and_its_removal_is_no_error() {
    let test = "a_pod_monitor_crd_installed_after_the_start_is_used_and_its_removal_is_no_error";
    let Some(c) = own_cluster("pod_monitors_kube", test) else {
        return;
    };
    let client = kube_cluster::admin(c).await;
    install_fixture_crds(&client, &[NAD_CRD]).await;
    let ns = test_namespace(&client, "late-crds").await;
    kube_cluster::network_attachment(&client, "default", "vlan100").await;
    let operator = Operator::start(c, &[&ns], &["--leader-election=false"], "late-crds");
    let op = &operator;
    let doc = format!(
        r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {{name: late, namespace: {ns}}}
spec:
  networkConfig:
    cidr: 192.168.100.0/24
    gateway: 192.168.100.1
    networkAttachmentDefinition: vlan100
    networkAttachmentNamespace: default
  infraComponents:
    dns: {{enabled: true, serverIP: 192.168.100.3, baseDomain: example.com, clusterName: my-cluster}}
"#
    );
    apply_yaml(&client, &doc, &ns).await.unwrap();
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    eventually("the Infra reconciled", WAIT, Some(op), || async {
        let i = infras.get("late").await.ok()?;
        (i.status?.observed_generation == i.metadata.generation).then_some(())
    })
    .await;
    assert!(
        op.log_text()
            .contains("no monitoring.coreos.com/v1 PodMonitors yet"),
        "the operator started without the kind"
    );

    println!("scenario: the CRD installed while the operator runs");
    install_fixture_crds(&client, &[POD_MONITOR_CRD]).await;
    let installed = std::time::Instant::now();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PodMonitor"),
        "podmonitors",
    );
    let monitors: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let mut n = 0;
    let monitor = eventually(
        "the Infra's PodMonitor, without a restart",
        WAIT,
        Some(op),
        || {
            n += 1;
            let (sas, monitors) = (&sas, &monitors);
            let round = n;
            async move {
                nudge(sas, "late", round).await;
                monitors.get_opt("late-causeway").await.ok().flatten()
            }
        },
    )
    .await;
    // Asked again every 30 s at most while not served (docs/operations.md):
    // with reconciles this frequent, well within 45 s.
    let took = installed.elapsed();
    assert!(
        took < Duration::from_secs(45),
        "the PodMonitor came {took:?} after the CRD"
    );
    println!("the PodMonitor came {took:?} after the CRD was established");
    let owners = monitor.metadata.owner_references.unwrap_or_default();
    assert!(
        owners.iter().any(|o| o.kind == "Infra" && o.name == "late"),
        "{owners:?}"
    );
    assert!(op.log_text().contains("PodMonitors are served now"));

    println!("scenario: the CRD deleted; reconciles go on without errors");
    let errors = "causeway_operator_reconcile_errors_total{controller=\"infra\"";
    let before = metric(&admin_get(op, "/metrics"), errors);
    Api::<CustomResourceDefinition>::all(client.clone())
        .delete(POD_MONITOR_CRD.1, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the operator noticing the kind is gone",
        WAIT,
        Some(op),
        || {
            n += 1;
            let sas = &sas;
            let round = n;
            async move {
                nudge(sas, "late", round).await;
                op.log_text()
                    .contains("PodMonitors are no longer served")
                    .then_some(())
            }
        },
    )
    .await;
    let reconciles = "causeway_operator_reconciles_total{controller=\"infra\"";
    let done = metric(&admin_get(op, "/metrics"), reconciles);
    eventually("three more reconciles", WAIT, Some(op), || {
        n += 1;
        let sas = &sas;
        let round = n;
        async move {
            nudge(sas, "late", round).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (metric(&admin_get(op, "/metrics"), reconciles) >= done + 3.0).then_some(())
        }
    })
    .await;
    assert_eq!(
        metric(&admin_get(op, "/metrics"), errors),
        before,
        "a reconcile failed after the PodMonitor kind went away:\n{}",
        op.log_text()
    );
}
