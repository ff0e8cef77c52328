//! `causeway operator must-gather` against a real API server with the
//! operator running: an Infra reconciled into its rendered config and
//! pods (which never start: the test cluster has no kubelet), a Secret in
//! the operator's namespace. The tarball must hold the objects, the
//! rendered config and the Secret's keys, never a Secret's value, and say
//! what it could not read (the pods' logs and admin answers).
//!
//! Needs root, like every kube suite; without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use causeway_operator::infra::crd::Infra;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ListParams, PostParams};
use kube_cluster::{admin, apply_yaml, eventually, wait_established, Operator};

const REFERENCE: &str = include_str!("../../causeway-operator/tests/fixtures/reference-infra.yaml");
const NAD_CRD: &str = include_str!("../../../tests/kube/crds/network-attachment-definition.yaml");
/// A value that must appear nowhere in the tarball.
const CANARY: &str = "must-gather-canary-7f3a9c";

/// The tarball's files, by path, decompressed.
fn unpack(path: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap());
    let mut archive = tar::Archive::new(gz);
    let mut files = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().to_string();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).unwrap();
        files.insert(name, bytes);
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn must_gather_collects_objects_configs_and_no_secret_value() {
    let test = "must_gather_kube";
    let Some(c) = kube_cluster::bare_cluster("must_gather_kube", test) else {
        return;
    };
    let client = admin(c).await;
    let ns = "infras";
    let operator_ns = "causeway-system";
    kube_cluster::ensure_namespace(&client, ns).await;
    kube_cluster::ensure_namespace(&client, operator_ns).await;
    apply_yaml(&client, &kube_cluster::printed_crd("infra"), "default")
        .await
        .unwrap();
    wait_established(&client, "infras.hostedcluster.densityops.com").await;
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    // Where the reference Infra names its network attachment.
    kube_cluster::network_attachment(&client, "default", "vlan100").await;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("support-canary".into()),
            ..Default::default()
        },
        data: Some([("token".to_string(), ByteString(CANARY.as_bytes().to_vec()))].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), operator_ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let kubeconfig = c.dir.join("admin-must-gather.kubeconfig");
    kube_cluster::write_kubeconfig(c, &kubeconfig, &c.admin_token);
    let op = Operator::start_with_kubeconfig(
        c,
        &kubeconfig,
        &[],
        &["--leader-election=false"],
        "must-gather",
    );
    let mut infra: Infra = serde_saphyr::from_str(REFERENCE).unwrap();
    infra.metadata.namespace = Some(ns.into());
    let name = infra.metadata.name.clone().unwrap();
    Api::<Infra>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &infra)
        .await
        .unwrap();
    let rendered = eventually(
        "the Infra's rendered config",
        Duration::from_secs(30),
        Some(&op),
        || async {
            let cms = Api::<ConfigMap>::namespaced(client.clone(), ns)
                .list(
                    &ListParams::default().labels("app.kubernetes.io/managed-by=causeway-operator"),
                )
                .await
                .ok()?;
            cms.items.first().and_then(|c| c.metadata.name.clone())
        },
    )
    .await;

    // The controller-manager makes the pods after the workloads: the
    // tarball is taken once all three exist, or it may hold fewer (a CI
    // run under load found none yet).
    eventually(
        "the DHCP, DNS and proxy pods",
        Duration::from_secs(60),
        Some(&op),
        || async {
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .ok()?;
            (pods.items.len() == 3).then_some(())
        },
    )
    .await;
    let out = c.dir.join("must-gather.tar.gz");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args([
            "operator",
            "must-gather",
            "--namespace",
            operator_ns,
            "--output",
        ])
        .arg(&out)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(said.contains("files;"), "{said}");

    let files = unpack(&out);
    let names: Vec<&String> = files.keys().collect();
    for want in [
        format!("must-gather/infras/{ns}/{name}.yaml"),
        format!("must-gather/namespaces/{ns}/configmaps/{rendered}.yaml"),
        format!("must-gather/namespaces/{operator_ns}/secrets/support-canary.yaml"),
        "must-gather/summary.txt".to_string(),
        "must-gather/errors.txt".to_string(),
    ] {
        assert!(files.contains_key(&want), "{want} not in {names:?}");
    }
    let infra_yaml =
        String::from_utf8_lossy(&files[&format!("must-gather/infras/{ns}/{name}.yaml")])
            .to_string();
    assert!(
        infra_yaml.contains("kind: Infra") && !infra_yaml.contains("managedFields"),
        "{infra_yaml}"
    );
    let secret_yaml = String::from_utf8_lossy(
        &files[&format!("must-gather/namespaces/{operator_ns}/secrets/support-canary.yaml")],
    )
    .to_string();
    assert!(
        secret_yaml.contains(&format!("REDACTED ({} bytes)", CANARY.len())),
        "{secret_yaml}"
    );
    // Neither the value nor its base64 anywhere in the tarball.
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, CANARY);
    for (path, bytes) in &files {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(CANARY) && !text.contains(&b64),
            "a Secret's value in {path}"
        );
    }
    // Every data-plane pod's log is in the tarball or listed as not
    // collected; its admin answers, which a pod that never ran cannot
    // give, are listed, not silently missing.
    let errors = String::from_utf8_lossy(&files["must-gather/errors.txt"]).to_string();
    let pods: Vec<String> = files
        .keys()
        .filter_map(|p| p.strip_prefix(&format!("must-gather/namespaces/{ns}/pods/")))
        .map(|p| p.trim_end_matches(".yaml").to_string())
        .collect();
    assert_eq!(pods.len(), 3, "the DHCP, DNS and proxy pods: {pods:?}");
    for pod in &pods {
        let log = format!("namespaces/{ns}/logs/{pod}/causeway.log");
        assert!(
            files.contains_key(&format!("must-gather/{log}")) || errors.contains(&log),
            "{pod}: neither its log nor why not\n{errors}"
        );
        for path in ["readyz", "ha", "leases"] {
            let answer = format!("namespaces/{ns}/admin/{pod}/{path}.txt");
            assert!(
                files.contains_key(&format!("must-gather/{answer}")) || errors.contains(&answer),
                "{pod}: neither its /{path} nor why not\n{errors}"
            );
        }
    }
    assert!(
        errors.contains("/admin/") && errors.contains("readyz"),
        "{errors}"
    );
    let summary = String::from_utf8_lossy(&files["must-gather/summary.txt"]).to_string();
    assert!(summary.contains("Infras: 1"), "{summary}");
    println!("must-gather: {} files; summary:\n{summary}", files.len());
}
