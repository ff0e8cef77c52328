//! The DPF bridge against a real API server (tests/kube/cluster.sh), with
//! the chart's CRDs, RBAC and settings object from `helm template` and the
//! real `causeway operator` binary under the chart's ServiceAccount.
//!
//! HyperShift, DPF and MetalLB are not running: their CRDs are installed
//! from tests/kube/crds (typed where the bridge reads or writes), and the
//! test plays HyperShift's part, writing what it would write (HostedCluster
//! status, the admin kubeconfig Secret, a finalizer). One test walks the
//! scenarios in order because some change cluster-wide state (MetalLB's
//! CRDs arrive part way through).
//!
//! Needs root (see operator_kube.rs); without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::boot_lab;
use crate::kube_cluster;

use std::time::Duration;

use causeway_operator::dpf::bfcfg;
use causeway_operator::dpf::crd::{DPFHCPProvisioner, DPFHCPProvisionerConfig};
use causeway_operator::dpf::ignition::ENCAPSULATED;
use causeway_operator::k8s::resources::{
    dpf_operator_config_resource, dpu_cluster_resource, dpu_flavor_resource,
    hosted_cluster_resource, ip_address_pool_resource, l2_advertisement_resource,
    node_pool_resource,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use kube::Client;
use kube_cluster::{admin, apply_yaml, ensure_namespace, eventually, Operator};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
/// The DPUFlavor's OVS script, as first made and after an edit.
const OVS_SCRIPT: &str = "ovs-vsctl set Open_vSwitch . other_config:doca-init=true\n";
const OVS_SCRIPT_EDITED: &str = "ovs-vsctl set Open_vSwitch . other_config:hw-offload=true\n";
const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "my-dpu-clusters";
const DPU_NS: &str = "dpu-clusters";
const NAME: &str = "prod-dpu-cluster";
const OLD: &str = "quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64";
const NEW: &str = "quay.io/openshift-release-dev/ocp-release:4.19.1-x86_64";
const SSH_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb3J3yRzq0k1Jq8F6c1bq6Xq0v4cX1mZq1k2l3m4n5o dpu@example\n";

fn dynamic(client: &Client, ns: &str, r: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, r)
}

async fn get_dyn(client: &Client, ns: &str, r: &ApiResource, name: &str) -> Option<DynamicObject> {
    dynamic(client, ns, r).get_opt(name).await.unwrap()
}

async fn provisioner(client: &Client, name: &str) -> Option<DPFHCPProvisioner> {
    Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .unwrap()
}

/// A condition of a provisioner: (status, reason, message).
async fn condition(client: &Client, name: &str, type_: &str) -> Option<(String, String, String)> {
    let p = provisioner(client, name).await?;
    p.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

/// Waits until `type_` has `status` and `reason`; returns its message.
async fn wait_condition(
    client: &Client,
    op: &Operator,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    eventually(
        &format!("{name}: {type_}={status}/{reason}"),
        WAIT,
        Some(op),
        || async {
            condition(client, name, type_)
                .await
                .filter(|(s, r, _)| s == status && r == reason)
                .map(|(_, _, m)| m)
        },
    )
    .await
}

async fn secret(client: &Client, ns: &str, name: &str, key: &str, value: &[u8]) {
    let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
        "data": {key: k8s_openapi::ByteString(value.to_vec())}});
    apply_yaml(client, &serde_json::to_string(&body).unwrap(), ns)
        .await
        .unwrap();
}

async fn dpu_cluster(client: &Client, name: &str) {
    let body = json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUCluster",
        "metadata": {"name": name, "namespace": DPU_NS}, "spec": {"type": "static", "maxNodes": 10}});
    apply_yaml(client, &serde_json::to_string(&body).unwrap(), DPU_NS)
        .await
        .unwrap();
}

/// A provisioner from the sample with `name` and spec changes.
async fn create_variant(client: &Client, name: &str, spec: Value) {
    let mut doc: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    doc["metadata"]["name"] = json!(name);
    for (k, v) in spec.as_object().unwrap() {
        doc["spec"][k] = v.clone();
    }
    apply_yaml(client, &serde_json::to_string(&doc).unwrap(), NS)
        .await
        .unwrap();
}

async fn delete_provisioner(client: &Client, op: &Operator, name: &str) {
    Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(&format!("{name} gone"), WAIT, Some(op), || async {
        provisioner(client, name).await.is_none().then_some(())
    })
    .await;
}

/// The port of the test's ignition server, reported by the HostedCluster.
static IGNITION_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// HyperShift's part: the HostedCluster's status.
async fn hypershift_status(client: &Client, available: bool, history: Value) {
    hypershift_status_with(client, available, history, false).await;
}

/// As [`hypershift_status`], with HyperShift's ClusterVersionProgressing:
/// the hosted cluster's version still rolling out after the control plane.
async fn hypershift_status_with(
    client: &Client,
    available: bool,
    history: Value,
    version_progressing: bool,
) {
    let api = dynamic(client, NS, &hosted_cluster_resource());
    let now = "2026-11-24T10:00:00Z";
    let cond = |t: &str, s: bool, r: &str| json!({"type": t, "status": if s {"True"} else {"False"}, "reason": r, "message": format!("{t} as HyperShift says"), "lastTransitionTime": now});
    let status = json!({"status": {
        "conditions": [
            cond("Available", available, "AsExpected"),
            cond("Progressing", !available, "AsExpected"),
            cond("Degraded", false, "AsExpected"),
            cond("EtcdAvailable", true, "QuorumAvailable"),
            cond("KubeAPIServerAvailable", available, "AsExpected"),
            cond("ValidReleaseImage", true, "AsExpected"),
            cond("ClusterVersionProgressing", version_progressing, "AsExpected"),
        ],
        "controlPlaneVersion": {"history": history},
        "controlPlaneEndpoint": {"host": "192.168.1.100", "port": 6443},
        "ignitionEndpoint": format!("127.0.0.1:{}", IGNITION_PORT.load(std::sync::atomic::Ordering::SeqCst)),
    }});
    api.patch_status(NAME, &PatchParams::apply("hypershift").force(), &Patch::Apply(&json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "status": status["status"],
    })))
    .await
    .unwrap();
}

/// HyperShift's part: the finalizers it keeps on the HostedCluster.
async fn hypershift_finalizers(client: &Client, finalizers: Value) {
    dynamic(client, NS, &hosted_cluster_resource())
        .patch(
            NAME,
            &PatchParams::apply("hypershift").force(),
            &Patch::Apply(&json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "metadata": {"finalizers": finalizers},
            })),
        )
        .await
        .unwrap();
}

/// The bfcfg template: its labels, annotations, the osImageURL in the
/// target it carries, and that target.
async fn bfcfg(client: &Client) -> Option<(Value, Value, Option<String>, Value)> {
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), DPU_NS)
        .get_opt("bfcfg-my-dpucluster.cfg")
        .await
        .unwrap()?;
    let template = cm.data.as_ref()?.get("BF_CFG_TEMPLATE")?.clone();
    let target = bfcfg::carried_target(template.as_bytes()).unwrap();
    let mc: Value = serde_json::from_slice(
        &bfcfg::file_contents(&target, ENCAPSULATED)
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    Some((
        serde_json::to_value(cm.metadata.labels).unwrap(),
        serde_json::to_value(cm.metadata.annotations).unwrap(),
        mc["spec"]["osImageURL"].as_str().map(str::to_string),
        target,
    ))
}

/// A file of the target ignition, as text.
fn target_file(target: &Value, path: &str) -> Option<String> {
    bfcfg::file_contents(target, path)
        .unwrap()
        .map(|b| String::from_utf8(b).unwrap())
}

/// The events about `name`, as `kubectl get events --field-selector
/// involvedObject.name=<name>` lists them: (type, reason, count), ordered
/// by when each was last seen. An event repeated is one object whose count
/// grows, so the order is that of the latest occurrences.
async fn events_about(client: &Client, name: &str) -> Vec<(String, String, i32)> {
    use k8s_openapi::api::core::v1::Event;
    let mut events = Api::<Event>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items;
    let last_seen = |e: &Event| {
        e.series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .or(e.event_time.as_ref())
            .map(|t| t.0)
            .or(e.last_timestamp.as_ref().map(|t| t.0))
    };
    events.sort_by_key(|e| last_seen(e));
    events
        .into_iter()
        .map(|e| {
            let count = e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1);
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                count,
            )
        })
        .collect()
}

/// Waits until every (type, reason) of `wanted` is among the events about
/// `name`; returns them all.
async fn wait_events(
    client: &Client,
    op: &Operator,
    name: &str,
    wanted: &[(&str, &str)],
) -> Vec<(String, String, i32)> {
    eventually(
        &format!("events about {name}: {wanted:?}"),
        WAIT,
        Some(op),
        || async {
            let seen = events_about(client, name).await;
            wanted
                .iter()
                .all(|(t, r)| seen.iter().any(|(st, sr, _)| st == t && sr == r))
                .then_some(seen)
        },
    )
    .await
}

/// Every event reason is one the Go operator emits, or one of causeway's
/// own that docs/dpf.md lists: a typo in a reason would break whoever
/// filters on it.
fn assert_known_reasons(seen: &[(String, String, i32)]) {
    const GO: &[&str] = &[
        "DPUClusterFound",
        "DPUClusterNotFound",
        "DPUClusterDeleted",
        "DPUClusterAccessDenied",
        "ClusterTypeValid",
        "ClusterTypeUnsupported",
        "DPUClusterAvailable",
        "DPUClusterInUse",
        "SecretsValid",
        "SSHKeySecretMissing",
        "PullSecretMissing",
        "SSHKeySecretInvalid",
        "PullSecretInvalid",
        "SecretsAccessDenied",
        "ImageFound",
        "InvalidImageFormat",
        "VersionNotFound",
        "RegistryAuthError",
        "InvalidBlueFieldOCPLayerImageURL",
        "RegistryAccessError",
        "MetalLBConfigured",
        "MetalLBConfigurationFailed",
        "MetalLBDriftCorrected",
        "Injected",
        "KubeconfigPending",
        "InjectionFailed",
        "KubeConfigInjected",
        "DPUClusterUpdated",
        "DriftCorrected",
        "IgnitionConfigured",
        "IgnitionGenerationFailed",
        "IgnitionConfigMapDeleted",
        "IgnitionRegeneration",
        "DPUDeploymentChanged",
        "BFBAnnotationUpdated",
        "DependencyDeleted",
        "UpgradeInProgress",
        "UpgradeComplete",
        "KubeconfigCleanupSucceeded",
        "HostedClusterCleanupSucceeded",
        "MetalLBCleanupComplete",
        "CleanupSucceeded",
        "CleanupHandlerFailed",
        "CSRApproved",
        "HostedClusterUnreachable",
        "Active",
        "KubeconfigNotAvailable",
        "HostedClusterNotReachable",
    ];
    const OURS: &[&str] = &[
        // Phase changes.
        "Pending",
        "WaitingForControlPlane",
        "GeneratingIgnition",
        "ClusterVersionProgressing",
        "Ready",
        "Failed",
        "Error",
        "Deleting",
        // The approver and the checks causeway adds.
        "CSRDenied",
        "LeastPrivilegeUnavailable",
        "TooManyPendingCSRs",
        "ClusterTypeMismatch",
        "StaleNode",
        "StaleNodeCleared",
        "SecretsChanged",
        "DPUFlavorChanged",
    ];
    for (_, reason, _) in seen {
        assert!(
            GO.contains(&reason.as_str()) || OURS.contains(&reason.as_str()),
            "event reason {reason:?} is neither the Go operator's nor documented: {seen:?}"
        );
    }
}

fn entry(state: &str, image: &str, version: &str) -> Value {
    json!({"state": state, "image": image, "version": version, "startedTime": "2026-11-24T09:00:00Z"})
}

async fn hc_field(client: &Client, pointer: &str) -> Option<Value> {
    get_dyn(client, NS, &hosted_cluster_resource(), NAME)
        .await
        .and_then(|hc| serde_json::to_value(hc).unwrap().pointer(pointer).cloned())
}

async fn np_image(client: &Client) -> Option<String> {
    let np = get_dyn(client, NS, &node_pool_resource(), NAME).await?;
    np.data
        .pointer("/spec/release/image")
        .and_then(Value::as_str)
        .map(str::to_string)
}

async fn phase(client: &Client, name: &str) -> Option<String> {
    let p = provisioner(client, name).await?;
    serde_json::to_value(p.status?.phase?)
        .ok()?
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bridge_from_the_readme_sample_through_upgrade_to_deletion() {
    // An operator over every namespace: a cluster of its own, so it
    // meets no other suite's objects.
    let Some(c) = kube_cluster::own_cluster(
        "dpf_kube",
        "the_bridge_from_the_readme_sample_through_upgrade_to_deletion",
    ) else {
        return;
    };
    let client = admin(c).await;
    // MetalLB's CRDs arrive part way through (a scenario of their own).
    kube_cluster::dpf_management_cluster(&client, &[NS, DPU_NS], false).await;
    dpu_cluster(&client, "my-dpucluster").await;
    dpu_cluster(&client, "spare-dpucluster").await;
    kube_cluster::dpf_template_objects(&client, DPU_NS, OVS_SCRIPT).await;
    secret(
        &client,
        NS,
        "my-pull-secret",
        ".dockerconfigjson",
        br#"{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz"}}}"#,
    )
    .await;
    secret(&client, NS, "my-ssh-key", "id_rsa.pub", SSH_KEY.as_bytes()).await;
    secret(
        &client,
        NS,
        "wrong-key",
        "id_ed25519.pub",
        SSH_KEY.as_bytes(),
    )
    .await;
    // The chart's hook made the settings object; a short deletion timeout
    // for the stuck-deletion scenario.
    let configs: Api<DPFHCPProvisionerConfig> = Api::all(client.clone());
    let config = configs
        .get("default")
        .await
        .expect("the chart's hook made DPFHCPProvisionerConfig default");
    assert_eq!(
        config.spec.metal_lb_namespace.as_deref(),
        Some("openshift-operators")
    );
    configs
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"hostedClusterDeletionTimeoutSeconds": 5}})),
        )
        .await
        .unwrap();
    kube_cluster::blue_field_images(
        &client,
        &[
            ("4.19.0-ec.5", "quay.io/example/rhcos-bfb:4.19.0-ec.5"),
            ("4.19.1", "quay.io/example/rhcos-bfb:4.19.1"),
        ],
    )
    .await;
    let op = Operator::start(c, &[], &["--leader-election=false"], "dpf");

    // Bad input: file paths instead of Secret refs. A condition names the
    // field and points to the Secret refs; nothing is made.
    println!("scenario: a CR with the seed's file-path sshKey and pullSecret");
    create_variant(&client, "file-paths", json!({"sshKey": "/root/.ssh/id_rsa.pub", "pullSecret": "/root/pull.json", "sshKeySecretRef": null, "dpuClusterRef": {"name": "spare-dpucluster", "namespace": DPU_NS}})).await;
    let why = wait_condition(
        &client,
        &op,
        "file-paths",
        "SpecValid",
        "False",
        "FilePathNotSupported",
    )
    .await;
    assert!(
        why.contains("spec.sshKey")
            && why.contains("sshKeySecretRef")
            && why.contains("pullSecretRef"),
        "{why}"
    );
    assert_eq!(
        phase(&client, "file-paths").await.as_deref(),
        Some("Failed")
    );
    assert!(
        get_dyn(&client, NS, &hosted_cluster_resource(), "file-paths")
            .await
            .is_none()
    );

    println!("scenario: a Secret without the key the spec needs");
    create_variant(&client, "missing-key", json!({"sshKeySecretRef": {"name": "wrong-key"}, "dpuClusterRef": {"name": "spare-dpucluster", "namespace": DPU_NS}})).await;
    let why = wait_condition(
        &client,
        &op,
        "missing-key",
        "SecretsValid",
        "False",
        "SSHKeySecretInvalid",
    )
    .await;
    assert!(why.contains("id_rsa.pub"), "{why}");
    assert!(
        get_dyn(&client, NS, &hosted_cluster_resource(), "missing-key")
            .await
            .is_none()
    );
    assert!(get_dyn(&client, NS, &node_pool_resource(), "missing-key")
        .await
        .is_none());
    delete_provisioner(&client, &op, "file-paths").await;
    delete_provisioner(&client, &op, "missing-key").await;

    println!("scenario: a HostedCluster of the same name that is not the provisioner's");
    apply_yaml(
        &client,
        r#"{"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "metadata": {"name": "foreign", "namespace": "my-dpu-clusters"}, "spec": {"release": {"image": "quay.io/someone/else:1"}}}"#,
        NS,
    )
    .await
    .unwrap();
    create_variant(
        &client,
        "foreign",
        json!({"dpuClusterRef": {"name": "spare-dpucluster", "namespace": DPU_NS}}),
    )
    .await;
    let why = wait_condition(&client, &op, "foreign", "Applied", "False", "Conflict").await;
    assert!(why.contains("not this provisioner's"), "{why}");
    let foreign = get_dyn(&client, NS, &hosted_cluster_resource(), "foreign")
        .await
        .unwrap();
    assert_eq!(
        foreign.data["spec"]["release"]["image"], "quay.io/someone/else:1",
        "never taken over"
    );
    assert!(foreign.metadata.owner_references.is_none());
    delete_provisioner(&client, &op, "foreign").await;
    assert!(
        get_dyn(&client, NS, &hosted_cluster_resource(), "foreign")
            .await
            .is_some(),
        "not deleted either"
    );

    println!("scenario: the README sample, with MetalLB's CRDs absent");
    // The sample plus the DPUDeployment the boot template's flavor comes
    // from (the product documentation's example names one; it is
    // immutable, so it is there from the start).
    create_variant(
        &client,
        NAME,
        json!({"dpuDeploymentRef": {"name": "dpudeployment", "namespace": DPU_NS}}),
    )
    .await;
    let why = wait_condition(
        &client,
        &op,
        NAME,
        "MetalLBConfigured",
        "False",
        "MetalLBNotInstalled",
    )
    .await;
    assert!(why.contains("metallb.io"), "{why}");
    wait_condition(
        &client,
        &op,
        NAME,
        "Applied",
        "True",
        "HostedClusterApplied",
    )
    .await;
    let p = provisioner(&client, NAME).await.unwrap();
    let hc = get_dyn(&client, NS, &hosted_cluster_resource(), NAME)
        .await
        .unwrap();
    let owner = &hc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        (p.metadata.uid.as_deref().unwrap(), Some(true))
    );
    let spec = &hc.data["spec"];
    assert_eq!(spec["release"]["image"], OLD);
    assert_eq!(spec["platform"]["type"], "None");
    assert_eq!(spec["networking"]["networkType"], "Other");
    assert_eq!(spec["networking"]["allocateNodeCIDRs"], "Enabled");
    assert_eq!(
        spec["etcd"]["managed"]["storage"]["persistentVolume"]["storageClassName"],
        "ocs-storagecluster-ceph-rbd"
    );
    assert_eq!(
        spec["secretEncryption"]["aescbc"]["activeKey"]["name"],
        "prod-dpu-cluster-etcd-encryption-key"
    );
    assert_eq!(
        spec["services"][0],
        json!({"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer"}})
    );
    let np = get_dyn(&client, NS, &node_pool_resource(), NAME)
        .await
        .unwrap();
    assert_eq!(np.data["spec"]["replicas"], 0);
    assert_eq!(np.data["spec"]["management"]["upgradeType"], "Replace");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let key = secrets
        .get("prod-dpu-cluster-etcd-encryption-key")
        .await
        .unwrap();
    assert_eq!(key.data.unwrap()["key"].0.len(), 32);
    let ssh_copy = secrets.get("prod-dpu-cluster-ssh-key").await.unwrap();
    assert_eq!(ssh_copy.data.unwrap()["id_rsa.pub"].0, SSH_KEY.as_bytes());
    assert_eq!(
        secrets
            .get("prod-dpu-cluster-pull-secret")
            .await
            .unwrap()
            .type_
            .as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );

    println!("scenario: MetalLB installed later");
    apply_yaml(&client, kube_cluster::METALLB_CRDS.0, "default")
        .await
        .unwrap();
    wait_condition(
        &client,
        &op,
        NAME,
        "MetalLBConfigured",
        "True",
        "MetalLBReady",
    )
    .await;
    let pool = get_dyn(
        &client,
        "openshift-operators",
        &ip_address_pool_resource(),
        NAME,
    )
    .await
    .unwrap();
    assert_eq!(pool.data["spec"]["addresses"], json!(["192.168.1.100/32"]));
    assert_eq!(
        pool.data["spec"]["serviceAllocation"]["namespaces"],
        json!(["my-dpu-clusters-prod-dpu-cluster"])
    );
    let l2 = get_dyn(
        &client,
        "openshift-operators",
        &l2_advertisement_resource(),
        "advertise-prod-dpu-cluster",
    )
    .await
    .unwrap();
    assert_eq!(l2.data["spec"]["ipAddressPools"], json!([NAME]));

    println!("scenario: a second provisioner on the same DPUCluster");
    create_variant(&client, "second", json!({})).await;
    let why = wait_condition(
        &client,
        &op,
        "second",
        "DPUClusterInUse",
        "True",
        "DPUClusterInUse",
    )
    .await;
    assert!(why.contains(NAME), "{why}");
    assert_eq!(phase(&client, "second").await.as_deref(), Some("Failed"));
    assert!(get_dyn(&client, NS, &hosted_cluster_resource(), "second")
        .await
        .is_none());
    delete_provisioner(&client, &op, "second").await;
    // The first keeps the DPUCluster.
    wait_condition(
        &client,
        &op,
        NAME,
        "DPUClusterInUse",
        "False",
        "DPUClusterAvailable",
    )
    .await;

    println!(
        "scenario: five provisioners created so far, none counted a conflict on its own object"
    );
    // A create used to race the CSR approver's first status write and fail
    // the finalizer's guarded write with 409, paging whoever alerts on it.
    let metrics = kube_cluster::admin_get(&op, "/metrics");
    assert_eq!(
        kube_cluster::metric(
            &metrics,
            r#"causeway_operator_reconcile_errors_total{controller="dpfhcp",error="conflict"}"#
        ),
        0.0,
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("reconcile_errors"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    println!("scenario: the settings object deleted; its settings lapse after the grace");
    let kept = configs.get("default").await.unwrap();
    configs
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    // Nothing the bridge watches changes when the grace ends: before the
    // fix the old settings held until the 5-minute resync.
    let why = wait_condition(
        &client,
        &op,
        NAME,
        "ProvisionerConfig",
        "True",
        "DefaultsUsed",
    )
    .await;
    assert!(why.contains("no DPFHCPProvisionerConfig"), "{why}");
    configs
        .create(
            &Default::default(),
            &DPFHCPProvisionerConfig::new("default", kept.spec.clone()),
        )
        .await
        .unwrap();
    wait_condition(&client, &op, NAME, "ProvisionerConfig", "True", "Found").await;

    println!("scenario: HyperShift brings the control plane up; the sample reaches Ready");
    // HyperShift's ignition server, its CA and the token for it in the
    // control plane's namespace.
    let scratch = tempfile::tempdir().unwrap();
    let ignition = kube_cluster::ignition_server(
        scratch.path(),
        "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:release-os",
    )
    .await;
    IGNITION_PORT.store(ignition.port, std::sync::atomic::Ordering::SeqCst);
    let cp_ns = format!("{NS}-{NAME}");
    ensure_namespace(&client, &cp_ns).await;
    secret(
        &client,
        &cp_ns,
        "ignition-server-ca-cert",
        "tls.crt",
        ignition.ca_pem.as_bytes(),
    )
    .await;
    secret(
        &client,
        &cp_ns,
        &format!("token-{NAME}-5f2a1"),
        "token",
        &ignition.token,
    )
    .await;
    secret(
        &client,
        NS,
        "prod-dpu-cluster-admin-kubeconfig",
        "kubeconfig",
        b"apiVersion: v1\nkind: Config\n# hosted admin\n",
    )
    .await;
    hypershift_status(
        &client,
        true,
        json!([entry("Completed", OLD, "4.19.0-ec.5")]),
    )
    .await;
    wait_condition(
        &client,
        &op,
        NAME,
        "Ready",
        "True",
        "AllComponentsOperational",
    )
    .await;
    assert_eq!(phase(&client, NAME).await.as_deref(), Some("Ready"));
    let p = provisioner(&client, NAME).await.unwrap();
    let st = p.status.clone().unwrap();
    // The BlueField image for 4.19.0-ec.5, from the chart's table.
    assert_eq!(
        st.blue_field_ocp_layer_image.as_deref(),
        Some("quay.io/example/rhcos-bfb:4.19.0-ec.5")
    );
    assert_eq!(st.blue_field_container_image, st.blue_field_ocp_layer_image);
    let found = condition(&client, NAME, "BlueFieldContainerImageAvailable")
        .await
        .unwrap();
    assert_eq!((found.0.as_str(), found.1.as_str()), ("True", "ImageFound"));
    assert!(
        found
            .2
            .contains("ConfigMap causeway-system/ocp-bluefield-images"),
        "{}",
        found.2
    );
    // The DPU ignition: HyperShift's, fetched with the token, the OS image
    // replaced by the BlueField one, published for DPF.
    let template = bfcfg(&client).await.expect("the bfcfg ConfigMap");
    assert_eq!(
        template.0["provisioning.dpu.nvidia.com/bfcfg-template"],
        "true"
    );
    assert_eq!(
        template.1["dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-ocp-release-image"],
        OLD
    );
    assert_eq!(
        template.1["provisioning.dpu.nvidia.com/bfcfg-template-cluster-name"],
        "my-dpucluster"
    );
    assert_eq!(
        template.2.as_deref(),
        Some("quay.io/example/rhcos-bfb:4.19.0-ec.5")
    );
    // What the operator published boots a DPU: DPF fills it in for one
    // DPU, and its units run against the host agent's stand-in.
    let published =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), DPU_NS)
            .get("bfcfg-my-dpucluster.cfg")
            .await
            .unwrap()
            .data
            .and_then(|d| d.get("BF_CFG_TEMPLATE").cloned())
            .unwrap();
    assert!(boot_lab::ready(
        "the_bridge_from_the_readme_sample_through_upgrade_to_deletion"
    ));
    boot_lab::installs_reports_and_joins(
        &boot_lab::as_dpf_fills_it(&published),
        &boot_lab::Expected {
            os_image: "quay.io/example/rhcos-bfb:4.19.0-ec.5",
            kernel_arguments: &[],
        },
    );
    println!("scenario: the published template boots a DPU through the host agent's stand-in");
    // The template is the live ignition carrying the target, which holds
    // the flavor's OVS script and override, and the MTU profiles.
    let annotations = &template.1;
    assert_eq!(
        annotations["provisioning.dpu.nvidia.com/bfcfg-template-dpuflavor-name"],
        "hbn-ovn"
    );
    assert_eq!(
        annotations["provisioning.dpu.nvidia.com/bfcfg-template-bfb-name"],
        "bf-bundle"
    );
    let digest = annotations["dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-dpuflavor-digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(digest.len(), 64);
    let target = &template.3;
    assert_eq!(
        target_file(target, "/usr/local/bin/dpf-ovs-script.sh").as_deref(),
        Some(OVS_SCRIPT)
    );
    assert_eq!(
        target_file(target, "/etc/mellanox/mlnx-bf.conf").as_deref(),
        Some("ALLOW_SHARED_RQ=\"no\"\n")
    );
    assert!(target_file(
        target,
        "/etc/NetworkManager/system-connections/p0.nmconnection"
    )
    .unwrap()
    .contains("mtu=9000"));
    assert!(target_file(target, "/etc/dpf/dpuflavor.yaml")
        .unwrap()
        .contains("hbn-ovn"));
    assert!(ignition.served.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert_eq!(
        ignition.refused.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(
        condition(&client, NAME, "IgnitionConfigured")
            .await
            .map(|c| c.1),
        Some("IgnitionGenerated".to_string())
    );
    println!("scenario: the provisioning's events, as `kubectl get events --field-selector involvedObject.name=prod-dpu-cluster` lists them");
    let provisioning = [
        ("Normal", "DPUClusterFound"),
        ("Normal", "ClusterTypeValid"),
        ("Normal", "DPUClusterAvailable"),
        ("Normal", "SecretsValid"),
        ("Normal", "ImageFound"),
        ("Warning", "MetalLBConfigurationFailed"),
        ("Normal", "MetalLBConfigured"),
        ("Warning", "KubeconfigPending"),
        ("Normal", "KubeConfigInjected"),
        ("Normal", "DPUClusterUpdated"),
        ("Normal", "Injected"),
        ("Normal", "IgnitionConfigured"),
    ];
    let seen = wait_events(&client, &op, NAME, &provisioning).await;
    let at = |reason: &str| seen.iter().position(|(_, r, _)| r == reason).unwrap();
    assert!(
        at("DPUClusterFound") < at("MetalLBConfigurationFailed")
            && at("MetalLBConfigurationFailed") < at("MetalLBConfigured")
            && at("KubeconfigPending") < at("KubeConfigInjected")
            && at("KubeConfigInjected") < at("IgnitionConfigured"),
        "in the order things happened: {seen:?}"
    );
    assert_eq!(
        seen.iter()
            .find(|(_, r, _)| r == "DPUClusterFound")
            .map(|e| e.2),
        Some(1),
        "a condition that holds is announced once: {seen:?}"
    );
    assert_known_reasons(&seen);
    println!("scenario: the bfcfg ConfigMap deleted is made again");
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), DPU_NS);
    let old_uid = cms
        .get("bfcfg-my-dpucluster.cfg")
        .await
        .unwrap()
        .metadata
        .uid;
    cms.delete("bfcfg-my-dpucluster.cfg", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the bfcfg ConfigMap made again",
        WAIT,
        Some(&op),
        || async {
            let cm = cms.get_opt("bfcfg-my-dpucluster.cfg").await.ok()??;
            (cm.metadata.uid != old_uid).then_some(())
        },
    )
    .await;
    println!("scenario: the DPUFlavor's content edited makes the template again");
    kube_cluster::dpf_template_objects(&client, DPU_NS, OVS_SCRIPT_EDITED).await;
    eventually(
        "the bfcfg template made from the edited flavor",
        WAIT,
        Some(&op),
        || async {
            let (_, annotations, _, target) = bfcfg(&client).await?;
            (target_file(&target, "/usr/local/bin/dpf-ovs-script.sh").as_deref()
                == Some(OVS_SCRIPT_EDITED))
            .then_some(annotations)
        },
    )
    .await;
    let (_, annotations, _, _) = bfcfg(&client).await.unwrap();
    assert_ne!(
        annotations["dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-dpuflavor-digest"],
        digest.as_str()
    );
    // Made again for that reason, which the event names.
    let seen = wait_events(&client, &op, NAME, &[("Normal", "DPUFlavorChanged")]).await;
    assert_known_reasons(&seen);
    wait_condition(
        &client,
        &op,
        NAME,
        "IgnitionConfigured",
        "True",
        "IgnitionGenerated",
    )
    .await;
    assert_eq!(st.hosted_cluster_ref.unwrap().name, NAME);
    assert_eq!(
        st.kube_config_secret_ref.unwrap().name,
        "prod-dpu-cluster-admin-kubeconfig"
    );
    assert_eq!(
        st.control_plane_endpoint.as_deref(),
        Some("https://192.168.1.100:6443")
    );
    assert_eq!(st.version.as_deref(), Some("4.19.0-ec.5"));
    for (t, s) in [
        ("HostedClusterAvailable", "True"),
        ("EtcdAvailable", "True"),
        ("KubeAPIServerAvailable", "True"),
        ("Available", "True"),
        ("Health", "True"),
        ("Applied", "True"),
        ("KubeConfigInjected", "True"),
        ("HostedClusterUpgrading", "False"),
    ] {
        let got = condition(&client, NAME, t).await;
        assert_eq!(got.as_ref().map(|c| c.0.as_str()), Some(s), "{t}: {got:?}");
    }
    let dpu = get_dyn(&client, DPU_NS, &dpu_cluster_resource(), "my-dpucluster")
        .await
        .unwrap();
    assert_eq!(
        dpu.data["spec"]["kubeconfig"],
        "prod-dpu-cluster-admin-kubeconfig"
    );
    let injected = Api::<Secret>::namespaced(client.clone(), DPU_NS)
        .get("prod-dpu-cluster-admin-kubeconfig")
        .await
        .unwrap();
    assert_eq!(
        injected.data.unwrap()["super-admin.conf"].0,
        b"apiVersion: v1\nkind: Config\n# hosted admin\n"
    );

    println!("scenario: a zero-trust flavor: the template made again boots a DPU without a word to the host");
    // DPF's registry for zero-trust DPUs, where the lab's stand-in serves
    // the dpu-agent package.
    let registry = "http://[fe80::1%25tmfifo_net0]:11029";
    let operator_configs = dynamic(&client, DPU_NS, &dpf_operator_config_resource());
    let flavors = dynamic(&client, DPU_NS, &dpu_flavor_resource());
    operator_configs
        .patch(
            "dpfoperatorconfig",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"provisioningController": {"registry": {"loadBalancerAddress": registry}}}})),
        )
        .await
        .unwrap();
    flavors
        .patch(
            "hbn-ovn",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"dpuMode": "zero-trust"}})),
        )
        .await
        .unwrap();
    let zero_trust = eventually(
        "the bfcfg template made again for the zero-trust flavor",
        WAIT,
        Some(&op),
        || async {
            let (_, _, _, target) = bfcfg(&client).await?;
            target_file(&target, "/etc/dpf/bfb-registry")?;
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), DPU_NS)
                .get("bfcfg-my-dpucluster.cfg")
                .await
                .ok()?
                .data?
                .get("BF_CFG_TEMPLATE")
                .cloned()
        },
    )
    .await;
    boot_lab::installs_without_a_word_to_the_host(
        &boot_lab::as_dpf_fills_it(&zero_trust),
        registry,
    );
    // Back to the trusted flavor, and its template.
    flavors
        .patch(
            "hbn-ovn",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"dpuMode": "dpu"}})),
        )
        .await
        .unwrap();
    operator_configs
        .patch(
            "dpfoperatorconfig",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"provisioningController": null}})),
        )
        .await
        .unwrap();
    eventually(
        "the bfcfg template made again for the trusted flavor",
        WAIT,
        Some(&op),
        || async {
            let (_, _, _, target) = bfcfg(&client).await?;
            target_file(&target, "/etc/dpf/bfb-registry")
                .is_none()
                .then_some(())
        },
    )
    .await;

    println!("scenario: drift on the HostedCluster is reverted");
    dynamic(&client, NS, &hosted_cluster_resource())
        .patch(NAME, &PatchParams::apply("intruder").force(), &Patch::Apply(&json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "spec": {"controllerAvailabilityPolicy": "SingleReplica", "release": {"image": "quay.io/evil/release:1"}},
        })))
        .await
        .unwrap();
    eventually(
        "the HostedCluster's policy and release back",
        WAIT,
        Some(&op),
        || async {
            let policy = hc_field(&client, "/spec/controllerAvailabilityPolicy").await?;
            let image = hc_field(&client, "/spec/release/image").await?;
            (policy == "HighlyAvailable" && image == OLD).then_some(())
        },
    )
    .await;

    println!(
        "scenario: an immutable field changed (the 1.20 server has no CEL: the operator refuses)"
    );
    let provisioners = Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS);
    provisioners
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"baseDomain": "elsewhere.example.com"}})),
        )
        .await
        .unwrap();
    let why = wait_condition(
        &client,
        &op,
        NAME,
        "SpecValid",
        "False",
        "ImmutableFieldChanged",
    )
    .await;
    assert!(
        why.contains("spec.baseDomain") && why.contains("clusters.example.com"),
        "{why}"
    );
    assert_eq!(
        hc_field(&client, "/spec/dns/baseDomain").await,
        Some(json!("clusters.example.com")),
        "left untouched"
    );
    provisioners
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"baseDomain": "clusters.example.com"}})),
        )
        .await
        .unwrap();
    wait_condition(
        &client,
        &op,
        NAME,
        "Ready",
        "True",
        "AllComponentsOperational",
    )
    .await;

    println!("scenario: an upgrade, as DPF's upgrade-hosted.sh drives and polls it");
    Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ocpReleaseImage": NEW}})),
        )
        .await
        .unwrap();
    eventually(
        "the HostedCluster on the new release",
        WAIT,
        Some(&op),
        || async { (hc_field(&client, "/spec/release/image").await? == NEW).then_some(()) },
    )
    .await;
    hypershift_status(
        &client,
        true,
        json!([
            entry("Partial", NEW, "4.19.1"),
            entry("Completed", OLD, "4.19.0-ec.5")
        ]),
    )
    .await;
    // The script: the phase leaves Ready (Failed would be fatal), then the
    // template goes within 30 s.
    let left = eventually("the phase leaves Ready", WAIT, Some(&op), || async {
        phase(&client, NAME).await.filter(|p| p != "Ready")
    })
    .await;
    assert_eq!(left, "WaitingForControlPlane");
    eventually(
        "the bfcfg ConfigMap withdrawn",
        Duration::from_secs(30),
        Some(&op),
        || async {
            cms.get_opt("bfcfg-my-dpucluster.cfg")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    wait_condition(
        &client,
        &op,
        NAME,
        "HostedClusterUpgrading",
        "True",
        "UpgradeInProgress",
    )
    .await;
    wait_condition(
        &client,
        &op,
        NAME,
        "IgnitionConfigured",
        "False",
        "ReleaseImageUpdated",
    )
    .await;
    assert_eq!(
        condition(&client, NAME, "Ready").await.map(|c| (c.0, c.1)),
        Some(("False".to_string(), "IgnitionNotConfigured".to_string()))
    );
    assert_eq!(
        np_image(&client).await.as_deref(),
        Some(OLD),
        "the NodePool waits for the control plane"
    );
    // HyperShift's conditions are mirrored while the upgrade runs (the Go
    // operator freezes them until it ends).
    hypershift_status(
        &client,
        false,
        json!([
            entry("Partial", NEW, "4.19.1"),
            entry("Completed", OLD, "4.19.0-ec.5")
        ]),
    )
    .await;
    wait_condition(
        &client,
        &op,
        NAME,
        "KubeAPIServerAvailable",
        "False",
        "AsExpected",
    )
    .await;
    assert_eq!(
        condition(&client, NAME, "HostedClusterUpgrading")
            .await
            .map(|c| c.0),
        Some("True".to_string())
    );
    // The control plane completes; the hosted cluster's version is still
    // progressing: the upgrade is not over, and no template is served yet.
    hypershift_status_with(
        &client,
        true,
        json!([
            entry("Completed", NEW, "4.19.1"),
            entry("Completed", OLD, "4.19.0-ec.5")
        ]),
        true,
    )
    .await;
    eventually(
        "the NodePool on the new release",
        WAIT,
        Some(&op),
        || async { (np_image(&client).await? == NEW).then_some(()) },
    )
    .await;
    assert_eq!(
        condition(&client, NAME, "HostedClusterUpgrading")
            .await
            .map(|c| c.0),
        Some("True".to_string()),
        "the version still progresses"
    );
    assert_ne!(phase(&client, NAME).await.as_deref(), Some("Ready"));
    assert!(cms
        .get_opt("bfcfg-my-dpucluster.cfg")
        .await
        .unwrap()
        .is_none());
    hypershift_status_with(
        &client,
        true,
        json!([
            entry("Completed", NEW, "4.19.1"),
            entry("Completed", OLD, "4.19.0-ec.5")
        ]),
        false,
    )
    .await;
    // What the script polls for at the end: phase Ready, Ready=True,
    // HostedClusterUpgrading not True, and the template for the new release.
    eventually("the upgrade over", WAIT, Some(&op), || async {
        let ready = condition(&client, NAME, "Ready").await?;
        let upgrading = condition(&client, NAME, "HostedClusterUpgrading").await?;
        (phase(&client, NAME).await? == "Ready" && ready.0 == "True" && upgrading.0 != "True")
            .then_some(())
    })
    .await;
    assert_eq!(
        condition(&client, NAME, "HostedClusterUpgrading")
            .await
            .map(|c| (c.1, c.2)),
        Some((
            "UpgradeComplete".to_string(),
            format!("HostedCluster upgrade to {NEW} completed")
        ))
    );
    assert_eq!(
        provisioner(&client, NAME)
            .await
            .unwrap()
            .status
            .unwrap()
            .version
            .as_deref(),
        Some("4.19.1")
    );
    let template = bfcfg(&client).await.expect("the template made again");
    assert_eq!(
        template.1["dpfhcpprovisioner.dpu.hcp.io/bfcfg-template-ocp-release-image"],
        NEW
    );
    assert_eq!(
        template.2.as_deref(),
        Some("quay.io/example/rhcos-bfb:4.19.1")
    );
    let seen = wait_events(
        &client,
        &op,
        NAME,
        &[
            ("Normal", "UpgradeInProgress"),
            ("Normal", "UpgradeComplete"),
        ],
    )
    .await;
    let last = |reason: &str| seen.iter().position(|(_, r, _)| r == reason).unwrap();
    assert!(
        last("UpgradeInProgress") < last("UpgradeComplete")
            && last("UpgradeInProgress") < last("IgnitionConfigured"),
        "started, then completed with the template published again: {seen:?}"
    );
    assert_known_reasons(&seen);

    println!("scenario: the DPUCluster deleted under a live provisioner, then re-created");
    dynamic(&client, DPU_NS, &dpu_cluster_resource())
        .delete("my-dpucluster", &DeleteParams::default())
        .await
        .unwrap();
    wait_condition(
        &client,
        &op,
        NAME,
        "DPUClusterMissing",
        "True",
        "DPUClusterDeleted",
    )
    .await;
    wait_condition(&client, &op, NAME, "Ready", "False", "ValidationFailed").await;
    assert!(
        get_dyn(&client, NS, &hosted_cluster_resource(), NAME)
            .await
            .is_some(),
        "the hosted cluster is kept"
    );
    dpu_cluster(&client, "my-dpucluster").await;
    wait_condition(
        &client,
        &op,
        NAME,
        "Ready",
        "True",
        "AllComponentsOperational",
    )
    .await;
    let dpu = get_dyn(&client, DPU_NS, &dpu_cluster_resource(), "my-dpucluster")
        .await
        .unwrap();
    assert_eq!(
        dpu.data["spec"]["kubeconfig"], "prod-dpu-cluster-admin-kubeconfig",
        "injected again"
    );

    println!("scenario: deletion with a HostedCluster that never goes away");
    hypershift_finalizers(&client, json!(["hypershift.openshift.io/finalizer"])).await;
    Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    let why = wait_condition(&client, &op, NAME, "Health", "False", "DeletionStuck").await;
    assert!(
        why.contains("HostedCluster my-dpu-clusters/prod-dpu-cluster")
            && why.contains("finalizers"),
        "{why}"
    );
    wait_condition(
        &client,
        &op,
        NAME,
        "HostedClusterCleanup",
        "False",
        "Failed",
    )
    .await;
    assert_eq!(phase(&client, NAME).await.as_deref(), Some("Deleting"));
    assert!(
        get_dyn(&client, NS, &node_pool_resource(), NAME)
            .await
            .is_none(),
        "the NodePool went first"
    );
    let dpu = get_dyn(&client, DPU_NS, &dpu_cluster_resource(), "my-dpucluster")
        .await
        .unwrap();
    assert!(
        dpu.data["spec"].get("kubeconfig").is_none(),
        "the DPUCluster's reference is removed: {:?}",
        dpu.data["spec"]
    );
    assert!(Api::<Secret>::namespaced(client.clone(), DPU_NS)
        .get_opt("prod-dpu-cluster-admin-kubeconfig")
        .await
        .unwrap()
        .is_none());
    // HyperShift finishes.
    hypershift_finalizers(&client, json!([])).await;
    eventually("the provisioner gone", WAIT, Some(&op), || async {
        provisioner(&client, NAME).await.is_none().then_some(())
    })
    .await;
    for name in [
        "prod-dpu-cluster-pull-secret",
        "prod-dpu-cluster-ssh-key",
        "prod-dpu-cluster-etcd-encryption-key",
    ] {
        assert!(
            secrets.get_opt(name).await.unwrap().is_none(),
            "{name} deleted"
        );
    }
    assert!(get_dyn(
        &client,
        "openshift-operators",
        &ip_address_pool_resource(),
        NAME
    )
    .await
    .is_none());
    assert!(get_dyn(
        &client,
        "openshift-operators",
        &l2_advertisement_resource(),
        "advertise-prod-dpu-cluster"
    )
    .await
    .is_none());
    // The user's Secrets are not the provisioner's.
    assert!(secrets.get_opt("my-ssh-key").await.unwrap().is_some());
}
