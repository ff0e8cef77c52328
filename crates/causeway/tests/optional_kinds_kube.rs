//! The operator on an API server that serves only some of the kinds it can
//! use: a user who applied just the Infra CRD (the README's first
//! command), or a management cluster where neither HyperShift nor DPF is
//! installed yet. Each controller must reconcile what it can at once, say
//! what it goes without, and pick the missing kind up once its CRD is
//! installed, without a restart.
//!
//! One test on its own API server (no chart, so no CRD is there unless the
//! test applies it), since the point is which CRDs exist cluster-wide.
//! Needs root, like every kube suite; without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::time::{Duration, Instant};

use causeway_operator::dpf::crd::DPFHCPProvisioner;
use causeway_operator::infra::attachment::InfraClusterAttachment;
use causeway_operator::infra::crd::Infra;
use kube::api::{Api, PostParams};
use kube::Client;
use kube_cluster::{admin, apply_yaml, eventually, wait_established, Operator};

const REFERENCE: &str = include_str!("../../causeway-operator/tests/fixtures/reference-infra.yaml");
const NAD_CRD: &str = include_str!("../../../tests/kube/crds/network-attachment-definition.yaml");
const PROVISIONER: &str = include_str!("fixtures/dpfhcp-sample.yaml");
/// The foreign kinds the controllers watch once served, each with the CRD
/// the kube suites install for it (written from its project's API).
const FOREIGN_CRDS: [(&str, &str, &str); 6] = [
    (
        "machines",
        "machines.cluster.x-k8s.io",
        include_str!("../../../tests/kube/crds/capi-machine.yaml"),
    ),
    (
        "hostedclusters",
        "hostedclusters.hypershift.openshift.io",
        include_str!("../../../tests/kube/crds/hostedcluster.yaml"),
    ),
    (
        "nodepools",
        "nodepools.hypershift.openshift.io",
        include_str!("../../../tests/kube/crds/nodepool.yaml"),
    ),
    (
        "dpuclusters",
        "dpuclusters.provisioning.dpu.nvidia.com",
        include_str!("../../../tests/kube/crds/dpucluster.yaml"),
    ),
    (
        "dpuflavors",
        "dpuflavors.provisioning.dpu.nvidia.com",
        include_str!("../../../tests/kube/crds/dpuflavor.yaml"),
    ),
    (
        "dpfoperatorconfigs",
        "dpfoperatorconfigs.operator.dpu.nvidia.com",
        include_str!("../../../tests/kube/crds/dpfoperatorconfig.yaml"),
    ),
];
/// What "at once" means here: a few reconciles, far below the minute the
/// old wait took (or forever).
const PROMPT: Duration = Duration::from_secs(20);
/// A kind installed later is looked for every 10 s; then it is listed and
/// the objects reconciled.
const PICKED_UP: Duration = Duration::from_secs(45);

async fn create_ns(client: &Client, ns: &str) {
    kube_cluster::ensure_namespace(client, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_controller_works_without_the_optional_kinds_and_picks_them_up_once_installed() {
    let test = "optional_kinds_kube";
    let Some(c) = kube_cluster::bare_cluster("optional_kinds_kube", test) else {
        return;
    };
    let client = admin(c).await;
    let ns = "infras";
    create_ns(&client, ns).await;
    // The Infra CRD alone, as the README applies it; the network
    // attachment kind the Infra's pods use, as a cluster with Multus has.
    apply_yaml(&client, &kube_cluster::printed_crd("infra"), "default")
        .await
        .unwrap();
    wait_established(&client, "infras.hostedcluster.densityops.com").await;
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    kube_cluster::network_attachment(&client, ns, "vlan100").await;

    let kubeconfig = c.dir.join("admin-operator.kubeconfig");
    kube_cluster::write_kubeconfig(c, &kubeconfig, &c.admin_token);
    let op = Operator::start_with_kubeconfig(
        c,
        &kubeconfig,
        &[],
        &["--leader-election=false"],
        "optional",
    );

    // The Infra is reconciled at once: status and its rendered ConfigMap.
    let mut infra: Infra = serde_saphyr::from_str(REFERENCE).unwrap();
    infra.metadata.namespace = Some(ns.into());
    let name = infra.metadata.name.clone().unwrap();
    let infras: Api<Infra> = Api::namespaced(client.clone(), ns);
    let created = Instant::now();
    infras.create(&PostParams::default(), &infra).await.unwrap();
    eventually(
        "the Infra's status, with InfraClusterAttachments not served",
        PROMPT,
        Some(&op),
        || async {
            let i = infras.get(&name).await.ok()?;
            let s = i.status?;
            (s.observed_generation == i.metadata.generation && !s.conditions.is_empty())
                .then_some(())
        },
    )
    .await;
    println!(
        "Infra reconciled {:?} after it was created, InfraClusterAttachments not served",
        created.elapsed()
    );
    // A kind not served is looked for every 10 s, never listed in a loop
    // of 404s by any controller.
    let relisted: Vec<String> = op
        .log_text()
        .lines()
        .filter(|l| l.contains("initial object list") && l.contains("404"))
        .map(str::to_string)
        .collect();
    assert!(
        relisted.is_empty(),
        "{} watches failed their initial list with 404, the first: {}",
        relisted.len(),
        relisted.first().map_or("", String::as_str)
    );
    eventually(
        "the operator says which kind it goes without",
        PROMPT,
        Some(&op),
        || async {
            let log = op.log_text();
            (log.contains("infraclusterattachments") && log.contains("not served")).then_some(())
        },
    )
    .await;

    // The attachment kind arrives: both controllers pick it up.
    apply_yaml(
        &client,
        &kube_cluster::printed_crd("infraclusterattachment"),
        "default",
    )
    .await
    .unwrap();
    wait_established(
        &client,
        "infraclusterattachments.hostedcluster.densityops.com",
    )
    .await;
    let attachment = format!(
        "apiVersion: hostedcluster.densityops.com/v1alpha1\nkind: InfraClusterAttachment\nmetadata: {{name: late, namespace: {ns}}}\nspec:\n  infraRef: {{name: {name}}}\n  hostedClusterRef: {{name: hc-late, namespace: clusters}}\n  dns: {{clusterName: late, baseDomain: example.com}}\n  workers: [\"192.168.100.50\"]\n"
    );
    let installed = Instant::now();
    apply_yaml(&client, &attachment, ns).await.unwrap();
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), ns);
    eventually(
        "the attachment reconciled once its kind is served, without a restart",
        PICKED_UP,
        Some(&op),
        || async {
            let a = attachments.get("late").await.ok()?;
            (!a.status?.conditions.is_empty()).then_some(())
        },
    )
    .await;
    eventually(
        "the Infra counts the attachment",
        PICKED_UP,
        Some(&op),
        || async {
            let i = infras.get(&name).await.ok()?;
            (i.status?.attachments?.total == 1).then_some(())
        },
    )
    .await;
    println!(
        "attachment picked up {:?} after its CRD was installed",
        installed.elapsed()
    );

    // The DPF bridge with neither HyperShift nor DPF installed: a new
    // provisioner gets a status at once, saying what is missing.
    // The 1.20 test server predates CEL rules: they are left out.
    apply_yaml(
        &client,
        &kube_cluster::without_cel(&kube_cluster::printed_crd("dpfhcpprovisioner")),
        "default",
    )
    .await
    .unwrap();
    apply_yaml(
        &client,
        &kube_cluster::without_cel(&kube_cluster::printed_crd("dpfhcpprovisionerconfig")),
        "default",
    )
    .await
    .unwrap();
    wait_established(&client, "dpfhcpprovisioners.provisioning.dpu.hcp.io").await;
    wait_established(&client, "dpfhcpprovisionerconfigs.provisioning.dpu.hcp.io").await;
    let dpu_ns = "my-dpu-clusters";
    create_ns(&client, dpu_ns).await;
    // The operator started before these CRDs: the bridge picks its own
    // kind up as it did the attachments.
    eventually(
        "the bridge watches provisioners once their kind is served",
        PICKED_UP,
        Some(&op),
        || async {
            op.log_text()
                .lines()
                .any(|l| l.contains("now served") && l.contains("dpfhcpprovisioners"))
                .then_some(())
        },
    )
    .await;
    let provisioner: DPFHCPProvisioner = serde_saphyr::from_str(PROVISIONER).unwrap();
    let provisioners: Api<DPFHCPProvisioner> = Api::namespaced(client.clone(), dpu_ns);
    let created = Instant::now();
    provisioners
        .create(&PostParams::default(), &provisioner)
        .await
        .unwrap();
    let message = eventually(
        "the provisioner's status, with HyperShift's and DPF's kinds not served",
        PROMPT,
        Some(&op),
        || async {
            let p = provisioners.get("prod-dpu-cluster").await.ok()?;
            let s = p.status?;
            let text: Vec<String> = s
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            (!text.is_empty()).then(|| text.join("\n"))
        },
    )
    .await;
    println!(
        "provisioner reported {:?} after it was created:\n{message}",
        created.elapsed()
    );
    assert!(op.log_text().contains("not served"), "{}", op.log_text());

    // The foreign kinds installed (together: each is looked for every
    // 10 s, so one at a time would only add waits): every watch starts
    // without a restart.
    let watched = |plural: &str| {
        op.log_text()
            .lines()
            .any(|l| l.contains("now served") && l.contains(plural))
    };
    for (plural, _, _) in FOREIGN_CRDS {
        assert!(
            !watched(plural),
            "{plural} watched before its CRD was installed"
        );
    }
    let installed = Instant::now();
    for (_, crd_name, crd) in FOREIGN_CRDS {
        apply_yaml(&client, &kube_cluster::without_cel(crd), "default")
            .await
            .unwrap();
        wait_established(&client, crd_name).await;
    }
    for (plural, _, _) in FOREIGN_CRDS {
        eventually(
            &format!("the watch of {plural} starts once its CRD is installed"),
            PICKED_UP,
            Some(&op),
            || async { watched(plural).then_some(()) },
        )
        .await;
        println!(
            "{plural} watched {:?} after the CRDs were installed",
            installed.elapsed()
        );
    }
    // The DPUCluster watch is live: one appearing wakes the provisioner
    // naming it at once, long before its one-minute recheck.
    create_ns(&client, "dpu-clusters").await;
    let created = Instant::now();
    apply_yaml(
        &client,
        "apiVersion: provisioning.dpu.nvidia.com/v1alpha1\nkind: DPUCluster\nmetadata: {name: my-dpucluster, namespace: dpu-clusters}\nspec: {type: static, maxNodes: 10, version: v1.31.0}\n",
        "dpu-clusters",
    )
    .await
    .unwrap();
    eventually(
        "the provisioner sees its DPUCluster through the watch started late",
        PROMPT,
        Some(&op),
        || async {
            let p = provisioners.get("prod-dpu-cluster").await.ok()?;
            p.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "DPUClusterMissing" && c.status == "False")
                .then_some(())
        },
    )
    .await;
    println!(
        "provisioner found its DPUCluster {:?} after it was created",
        created.elapsed()
    );
    assert!(!op.log_text().contains("panicked"), "{}", op.log_text());
}
