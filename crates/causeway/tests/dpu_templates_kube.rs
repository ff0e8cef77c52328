//! The DPUServiceTemplate controller against a real API server and
//! controller manager (tests/kube/cluster.sh), with the chart's RBAC and
//! settings object and the real `causeway operator` binary under the
//! chart's ServiceAccount.
//!
//! DPF and OpenShift are not running: the DPUServiceTemplate,
//! DPFOperatorConfig and ClusterVersion CRDs come from tests/kube/crds, and
//! the test plays their part (DPF's version, the cluster's desired
//! release). The host OVN DaemonSet is a real DaemonSet, its status kept by
//! the real DaemonSet controller: a Node object without a kubelet makes its
//! rollout incomplete, deleting the Node completes it. The release payloads
//! sit in a real `docker-registry` on loopback with htpasswd, built here,
//! and the operator reads them with the credentials of
//! `openshift-config/pull-secret`.
//!
//! Needs root (see operator_kube.rs) and docker-registry; without them the
//! test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;
use crate::monitored;
#[path = "../../causeway-operator/tests/registry/mod.rs"]
mod registry;

use std::time::Duration;

use causeway_operator::dpf::crd::DPFHCPProvisionerConfig;
use causeway_operator::k8s::resources::{
    cluster_version_resource, dpf_operator_config_resource, dpu_service_template_resource,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use kube_cluster::{
    admin, admin_get, apply_yaml, ensure_namespace, eventually, wait_established, Operator,
};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
const TEMPLATE_CRD: &str = include_str!("../../../tests/kube/crds/dpuservicetemplate.yaml");
const DPF_CONFIG_CRD: &str = include_str!("../../../tests/kube/crds/dpfoperatorconfig.yaml");
const CV_CRD: &str = include_str!("../../../tests/kube/crds/clusterversion.yaml");
const WAIT: Duration = Duration::from_secs(90);
/// Provisioners live here; their DPUClusters in the two namespaces below.
const NS: &str = "my-dpu-clusters";
const DPU_NS: &str = "dpf-operator-system";
/// Holds an unlabelled `hbn` template of someone else's.
const SECOND_NS: &str = "dpu-second";
const OVN_NS: &str = "openshift-ovn-kubernetes";
const X86_OLD: &str = "quay.io/ocp/ovn-kubernetes@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const X86_NEW: &str = "quay.io/ocp/ovn-kubernetes@sha256:2222222222222222222222222222222222222222222222222222222222222222";
const DPU_OVN_1: &str =
    "quay.io/ocp/ovn-dpu@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const DPU_OVN_2: &str =
    "quay.io/ocp/ovn-dpu@sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const MANAGED: &str = "dpfhcpprovisioner.dpu.hcp.io/managed";
const SOURCE: &str = "dpfhcpprovisioner.dpu.hcp.io/source-x86-ovn-image";

fn templates(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &dpu_service_template_resource())
}

async fn template(client: &Client, ns: &str, name: &str) -> Option<Value> {
    templates(client, ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|t| serde_json::to_value(t).unwrap())
}

async fn wait_template(
    client: &Client,
    op: &Operator,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    eventually(&format!("{ns}/{name}: {what}"), WAIT, Some(op), || async {
        template(client, ns, name).await.filter(|t| check(t))
    })
    .await
}

fn image_references(ovn: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
        "spec": {"tags": [
            {"name": "cli", "from": {"kind": "DockerImage", "name": "quay.io/ocp/cli@sha256:01"}},
            {"name": "ovn-kubernetes", "from": {"kind": "DockerImage", "name": ovn}},
        ]}
    }))
    .unwrap()
}

/// Pushes the aarch64 payload of `version`, naming `ovn` for the DPU.
fn push_payload(port: u16, version: &str, ovn: &str) {
    let references = image_references(ovn);
    registry::push_image(
        port,
        "ocp/release",
        &format!("{version}-aarch64"),
        "arm64",
        json!({"io.openshift.release": version}),
        &[
            registry::layer(&[("etc/os-release", b"ID=rhel\n")]),
            registry::layer(&[("release-manifests/image-references", &references)]),
        ],
    );
}

async fn cluster_version(client: &Client, port: u16, version: &str) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &cluster_version_resource());
    let image = format!(
        "127.0.0.1:{port}/ocp/release@sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
    );
    api.patch_status(
        "version",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"desired": {"version": version, "image": image}}})),
    )
    .await
    .unwrap();
}

async fn dpf_version(client: &Client, version: &str) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), DPU_NS, &dpf_operator_config_resource());
    api.patch_status(
        "dpfoperatorconfig",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"version": version}})),
    )
    .await
    .unwrap();
}

async fn host_daemonset(client: &Client, image: &str) {
    let ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "ovnkube-node-dpu-host", "namespace": OVN_NS},
        "spec": {
            "selector": {"matchLabels": {"app": "ovnkube-node-dpu-host"}},
            "template": {
                "metadata": {"labels": {"app": "ovnkube-node-dpu-host"}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {"name": "ovn-controller", "image": "quay.io/ocp/ovn-kubernetes@sha256:3333333333333333333333333333333333333333333333333333333333333333"},
                        {"name": "ovnkube-controller", "image": image},
                    ],
                },
            },
        },
    });
    apply_yaml(client, &serde_json::to_string(&ds).unwrap(), OVN_NS)
        .await
        .unwrap();
}

/// desired, updated, available, and whether the controller saw the spec.
async fn rollout(client: &Client) -> (i32, i32, i32, bool) {
    let ds = Api::<DaemonSet>::namespaced(client.clone(), OVN_NS)
        .get("ovnkube-node-dpu-host")
        .await
        .unwrap();
    let s = ds.status.unwrap_or_default();
    (
        s.desired_number_scheduled,
        s.updated_number_scheduled.unwrap_or_default(),
        s.number_available.unwrap_or_default(),
        s.observed_generation.unwrap_or_default() >= ds.metadata.generation.unwrap_or_default(),
    )
}

async fn provisioner(client: &Client, name: &str, dpu_ns: &str) {
    let mut doc: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    doc["metadata"]["name"] = json!(name);
    doc["spec"]["dpuClusterRef"] =
        json!({"name": format!("{name}-dpucluster"), "namespace": dpu_ns});
    apply_yaml(client, &serde_json::to_string(&doc).unwrap(), NS)
        .await
        .unwrap();
}

async fn set_config(client: &Client, spec: Value) {
    Api::<DPFHCPProvisionerConfig>::all(client.clone())
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// `causeway_operator_dpu_service_templates_total` for one template and
/// outcome, whatever order the labels are written in.
fn outcome_count(metrics: &str, template: &str, outcome: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("causeway_operator_dpu_service_templates_total{"))
        .filter(|l| {
            l.contains(&format!("template=\"{template}\""))
                && l.contains(&format!("outcome=\"{outcome}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn values(t: &Value) -> &Value {
    &t["spec"]["helmChart"]["values"]
}

fn managed(t: &Value) -> bool {
    t["metadata"]["labels"][MANAGED] == "true"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpu_service_templates_follow_the_flag_dpf_the_ovn_rollout_and_the_provisioners() {
    const TEST: &str =
        "dpu_service_templates_follow_the_flag_dpf_the_ovn_rollout_and_the_provisioners";
    if !registry::installed() {
        eprintln!(
            "SKIP {TEST}: no {} (apt-get install docker-registry; tests/run.sh does)",
            registry::REGISTRY
        );
        return;
    }
    // An operator over every namespace, in DPF's fixed one: no other
    // suite's ground.
    let Some(c) = kube_cluster::own_cluster("dpu_templates_kube", TEST) else {
        return;
    };
    let client = admin(c).await;
    for crd in [TEMPLATE_CRD, DPF_CONFIG_CRD, CV_CRD] {
        apply_yaml(&client, crd, "default").await.unwrap();
    }
    for crd in [
        "dpuservicetemplates.svc.dpu.nvidia.com",
        "dpfoperatorconfigs.operator.dpu.nvidia.com",
        "clusterversions.config.openshift.io",
    ] {
        wait_established(&client, crd).await;
    }
    for ns in [NS, DPU_NS, SECOND_NS, OVN_NS, "openshift-config"] {
        ensure_namespace(&client, ns).await;
    }

    // The registry with the 4.22.1 and 4.22.2 payloads; its credentials in
    // the cluster's pull secret.
    let dir = tempfile::tempdir().unwrap();
    let reg = registry::start(dir.path());
    let port = reg.port;
    push_payload(port, "4.22.1", DPU_OVN_1);
    push_payload(port, "4.22.2", DPU_OVN_2);
    let pull = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "pull-secret", "namespace": "openshift-config"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": k8s_openapi::ByteString(registry::docker_config(port).into_bytes())}});
    apply_yaml(
        &client,
        &serde_json::to_string(&pull).unwrap(),
        "openshift-config",
    )
    .await
    .unwrap();

    // OpenShift's and DPF's parts.
    apply_yaml(
        &client,
        "apiVersion: config.openshift.io/v1\nkind: ClusterVersion\nmetadata: {name: version}\nspec: {clusterID: test}\n",
        "default",
    )
    .await
    .unwrap();
    cluster_version(&client, port, "4.22.1").await;
    apply_yaml(
        &client,
        &format!("apiVersion: operator.dpu.nvidia.com/v1alpha1\nkind: DPFOperatorConfig\nmetadata: {{name: dpfoperatorconfig, namespace: {DPU_NS}}}\nspec: {{}}\n"),
        DPU_NS,
    )
    .await
    .unwrap();
    dpf_version(&client, "v26.4.0").await;
    host_daemonset(&client, X86_OLD).await;
    eventually("the OVN DaemonSet observed", WAIT, None, || async {
        let (d, u, a, seen) = rollout(&client).await;
        (seen && d == u && d == a).then_some(())
    })
    .await;

    // Someone else's hbn in the second namespace.
    let foreign = json!({"apiVersion": "svc.dpu.nvidia.com/v1alpha1", "kind": "DPUServiceTemplate",
        "metadata": {"name": "hbn", "namespace": SECOND_NS},
        "spec": {"deploymentServiceName": "hbn", "helmChart": {"source": {"repoURL": "https://charts.example/hbn", "chart": "my-hbn", "version": "0.0.1"}}}});
    templates(&client, SECOND_NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(foreign.clone()).unwrap(),
        )
        .await
        .unwrap();

    let op = Operator::start_with_env(
        c,
        &c.operator_kubeconfig,
        &[],
        &["--leader-election=false"],
        "dpu-templates",
        &[("CAUSEWAY_BLUEFIELD_ALLOW_LOOPBACK_REGISTRIES", "true")],
    );
    provisioner(&client, "first", DPU_NS).await;
    provisioner(&client, "second", SECOND_NS).await;

    println!("scenario: manageDPUServiceTemplates false (the chart's default): nothing is made");
    tokio::time::sleep(Duration::from_secs(5)).await;
    for ns in [DPU_NS, SECOND_NS] {
        let list = templates(&client, ns)
            .list(&Default::default())
            .await
            .unwrap();
        let names: Vec<String> = list
            .items
            .iter()
            .map(|t| t.metadata.name.clone().unwrap_or_default())
            .collect();
        let expected: Vec<String> = if ns == SECOND_NS {
            vec!["hbn".into()]
        } else {
            vec![]
        };
        assert_eq!(names, expected, "{ns}");
    }

    println!(
        "scenario: the flag on: the three templates, from DPF 26.4's values and the 4.22.1 payload"
    );
    set_config(
        &client,
        json!({"manageDPUServiceTemplates": true, "dpuServicesImagePullSecret": "nvcr-pull"}),
    )
    .await;
    let dts = wait_template(
        &client,
        &op,
        DPU_NS,
        "doca-telemetry-service",
        "made",
        managed,
    )
    .await;
    assert_eq!(
        dts["spec"],
        json!({
            "deploymentServiceName": "doca-telemetry-service",
            "helmChart": {
                "source": {"repoURL": "https://helm.ngc.nvidia.com/nvidia/doca", "chart": "doca-telemetry", "version": "1.25.5"},
                "values": {
                    "configMapData": {"prometheus": {"port": 9189}},
                    "hostVolumePrefix": "/var/lib",
                    "imageDTS": "nvcr.io/nvidia/doca/doca_telemetry:1.25.5-doca3.4.0",
                    "imagePullSecrets": [{"name": "nvcr-pull"}],
                },
            },
            "resourceRequirements": {"cpu": "1", "memory": "1Gi", "storage": "1Gi"},
        })
    );
    assert!(
        dts["metadata"]["ownerReferences"].is_null(),
        "no owner references"
    );
    let hbn = wait_template(&client, &op, DPU_NS, "hbn", "made", managed).await;
    assert_eq!(
        hbn["spec"]["helmChart"]["source"],
        json!({"repoURL": "https://helm.ngc.nvidia.com/nvidia/doca", "chart": "doca-hbn", "version": "3.4.0"})
    );
    assert_eq!(
        values(&hbn),
        &json!({
            "image": {"repository": "nvcr.io/nvidia/doca/doca_hbn", "tag": "3.4.0-doca3.4.0"},
            "resources": {"memory": "6Gi", "nvidia.com/bf_sf": 3},
            "imagePullSecrets": [{"name": "nvcr-pull"}],
        })
    );
    let ovn = wait_template(&client, &op, DPU_NS, "ovn", "made", managed).await;
    assert_eq!(ovn["metadata"]["annotations"][SOURCE], X86_OLD);
    assert_eq!(
        ovn["spec"]["helmChart"]["source"],
        json!({"repoURL": "oci://ghcr.io/mellanox/charts", "chart": "ovn-kubernetes-chart", "version": "v26.4-ocp-beta3"})
    );
    let (repo1, hex1) = DPU_OVN_1.split_once(':').unwrap();
    assert_eq!(
        values(&ovn),
        &json!({
            "commonManifests": {"enabled": true},
            "dpuManifests": {
                "enabled": true,
                "image": {"repository": repo1, "tag": hex1},
                "cniBinDir": "/var/lib/cni/bin/",
                "cniConfDir": "/run/multus/cni/net.d",
            },
            "ovnDaemonsetVersion": "1.3.0",
            "leaseNamespace": "openshift-ovn-kubernetes",
            "gatewayOpts": "--gateway-interface=br-dpu",
        })
    );
    assert!(op
        .log_text()
        .contains("DPU OVN image read from the release payload"));

    println!("scenario: an unlabelled template of the same name is left alone");
    wait_template(&client, &op, SECOND_NS, "ovn", "made", managed).await;
    wait_template(
        &client,
        &op,
        SECOND_NS,
        "doca-telemetry-service",
        "made",
        managed,
    )
    .await;
    let theirs = template(&client, SECOND_NS, "hbn").await.unwrap();
    assert!(!managed(&theirs), "never adopted: {theirs}");
    assert_eq!(theirs["spec"], foreign["spec"]);
    eventually("the skip logged", WAIT, Some(&op), || async {
        op.log_text()
            .contains("exists without the managed label")
            .then_some(())
    })
    .await;
    let metrics = admin_get(&op, "/metrics");
    assert!(
        outcome_count(&metrics, "hbn", "skipped_unmanaged") >= 1.0,
        "{metrics}"
    );
    monitored::assert_exported(monitored::Source::DpuTemplates, &[&metrics]);

    println!("scenario: DPF reports a version with no values: an error, the templates untouched");
    let before: Vec<Value> = futures::future::join_all(
        ["ovn", "hbn", "doca-telemetry-service"].map(|n| template(&client, DPU_NS, n)),
    )
    .await
    .into_iter()
    .map(Option::unwrap)
    .collect();
    dpf_version(&client, "v25.10.0").await;
    eventually(
        "the unsupported version logged",
        WAIT,
        Some(&op),
        || async {
            op.log_text()
                .contains("unsupported DPF version 25.10")
                .then_some(())
        },
    )
    .await;
    // A change to the values meanwhile is not applied either.
    apply_yaml(
        &client,
        &serde_json::to_string(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "dpuservicetemplate-overrides", "namespace": kube_cluster::RELEASE_NAMESPACE},
            "data": {"overrides.json": r#"{"26.4": {"hbn": {"imageTag": "3.4.1-test"}}}"#}}))
        .unwrap(),
        kube_cluster::RELEASE_NAMESPACE,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for t in &before {
        let name = t["metadata"]["name"].as_str().unwrap();
        let now = template(&client, DPU_NS, name).await.unwrap();
        assert_eq!(
            now["metadata"]["resourceVersion"], t["metadata"]["resourceVersion"],
            "{name} untouched"
        );
    }

    println!("scenario: the host OVN DaemonSet mid-rollout: ovn waits, the others follow");
    let node: Node = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "dpu-host-1", "labels": {"kubernetes.io/hostname": "dpu-host-1"}}}))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    eventually("the rollout incomplete", WAIT, None, || async {
        let (d, _, a, seen) = rollout(&client).await;
        (seen && d == 1 && a == 0).then_some(())
    })
    .await;
    // An OpenShift upgrade to 4.22.2: the release, then the host OVN image.
    cluster_version(&client, port, "4.22.2").await;
    host_daemonset(&client, X86_NEW).await;
    dpf_version(&client, "v26.4.0").await;
    wait_template(&client, &op, DPU_NS, "hbn", "the override's tag", |t| {
        values(t)["image"]["tag"] == "3.4.1-test"
    })
    .await;
    eventually("the gate counted", WAIT, Some(&op), || async {
        let m = admin_get(&op, "/metrics");
        (outcome_count(&m, "ovn", "gated_rollout") >= 1.0).then_some(())
    })
    .await;
    let gated = template(&client, DPU_NS, "ovn").await.unwrap();
    assert_eq!(gated["metadata"]["annotations"][SOURCE], X86_OLD);
    assert_eq!(
        gated["metadata"]["resourceVersion"],
        before[0]["metadata"]["resourceVersion"]
    );

    println!(
        "scenario: the rollout completes: ovn follows the new host image and the 4.22.2 payload"
    );
    Api::<Node>::all(client.clone())
        .delete("dpu-host-1", &DeleteParams::default())
        .await
        .unwrap();
    // With no kubelet, the test removes the node's pods itself, as the pod
    // garbage collector would in time; the DaemonSet controller then counts
    // no node to run on.
    let pods: Api<Pod> = Api::namespaced(client.clone(), OVN_NS);
    eventually("the rollout complete", WAIT, Some(&op), || async {
        for p in pods.list(&Default::default()).await.unwrap().items {
            let _ = pods
                .delete(
                    &p.metadata.name.unwrap_or_default(),
                    &DeleteParams::default().grace_period(0),
                )
                .await;
        }
        let (d, u, a, seen) = rollout(&client).await;
        (seen && d == u && d == a).then_some(())
    })
    .await;
    let (repo2, hex2) = DPU_OVN_2.split_once(':').unwrap();
    let ovn = wait_template(&client, &op, DPU_NS, "ovn", "the new image", |t| {
        t["metadata"]["annotations"][SOURCE] == X86_NEW
    })
    .await;
    let v = values(&ovn);
    assert_eq!(
        v["dpuManifests"]["image"],
        json!({"repository": repo2, "tag": hex2})
    );
    assert_eq!(v["dpuManifests"]["ovnMultiNetworkEnable"], "true");
    assert_eq!(v["global"]["enableMultiNetwork"], "false");
    assert_eq!(v["global"]["egressIpHealthCheckPort"], "0");
    assert_eq!(v["ovnDaemonsetVersion"], "1.3.0");

    println!("scenario: drift of a managed template is undone");
    templates(&client, DPU_NS)
        .patch(
            "doca-telemetry-service",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&json!({"apiVersion": "svc.dpu.nvidia.com/v1alpha1", "kind": "DPUServiceTemplate",
                "spec": {"deploymentServiceName": "doca-telemetry-service", "helmChart": {"source": {"repoURL": "https://helm.ngc.nvidia.com/nvidia/doca", "chart": "doca-telemetry", "version": "9.9.9"}}}})),
        )
        .await
        .unwrap();
    wait_template(
        &client,
        &op,
        DPU_NS,
        "doca-telemetry-service",
        "its version back",
        |t| t["spec"]["helmChart"]["source"]["version"] == "1.25.5",
    )
    .await;
    // A field the operator does not set, added inside spec: the spec is
    // the operator's whole, so it goes; a label added beside ours stays.
    templates(&client, DPU_NS)
        .patch(
            "doca-telemetry-service",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &Patch::Merge(&json!({"metadata": {"labels": {"team": "dpu"}},
                "spec": {"helmChart": {"values": {"extra": "x"}}}})),
        )
        .await
        .unwrap();
    let t = wait_template(
        &client,
        &op,
        DPU_NS,
        "doca-telemetry-service",
        "the added field gone",
        |t| values(t).get("extra").is_none(),
    )
    .await;
    assert_eq!(t["metadata"]["labels"]["team"], "dpu");
    assert!(managed(&t));
    assert_eq!(
        values(&t)["imageDTS"],
        "nvcr.io/nvidia/doca/doca_telemetry:1.25.5-doca3.4.0"
    );

    println!("scenario: provisioners deleted: the managed templates go, the unlabelled one stays");
    for name in ["first", "second"] {
        Api::<causeway_operator::dpf::crd::DPFHCPProvisioner>::namespaced(client.clone(), NS)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for ns in [DPU_NS, SECOND_NS] {
        eventually(
            &format!("{ns}: managed templates gone"),
            WAIT,
            Some(&op),
            || async {
                let list = templates(&client, ns)
                    .list(&Default::default())
                    .await
                    .unwrap();
                list.items
                    .iter()
                    .all(|t| {
                        t.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(MANAGED))
                            .is_none()
                    })
                    .then_some(())
            },
        )
        .await;
    }
    let kept = template(&client, SECOND_NS, "hbn").await.unwrap();
    assert_eq!(
        kept["spec"], foreign["spec"],
        "the unlabelled template is kept"
    );
    assert!(template(&client, DPU_NS, "ovn").await.is_none());
}
