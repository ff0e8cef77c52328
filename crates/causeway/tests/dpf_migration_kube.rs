//! Migrating from the Go dpf-hcp-provisioner-operator, by the steps of
//! docs/dpf.md, against the real API server of tests/kube/cluster.sh with
//! `helm install` and `helm uninstall` themselves.
//!
//! The Go operator's release is played by a chart of the same name and
//! shape (its CRDs as templates with `helm.sh/resource-policy: keep`, its
//! Deployment, the settings object as a post-install hook), installed with
//! helm; the objects its operator made are written as it writes them: its
//! finalizer, its field manager (`manager`), controller owner references,
//! its labels on the MetalLB objects and the kubeconfig copy, and no labels
//! on the HostedCluster and NodePool. The test plays HyperShift as
//! dpf_kube.rs does.
//!
//! Asserted: without the CRD hand-over helm refuses to install (and
//! changes nothing); with it, causeway's release takes the CRDs over, the
//! provisioner reaches Ready under causeway, no HostedCluster or NodePool
//! is deleted, re-created or changed in spec, no owned Secret is
//! re-created, and uninstalling the Go release deletes no CRD and no CR.
//!
//! Needs root (see operator_kube.rs); without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::path::{Path, PathBuf};
use std::time::Duration;

use causeway_operator::dpf::crd::{DPFHCPProvisioner, DPFHCPProvisionerConfig};
use causeway_operator::k8s::resources::{
    dpu_cluster_resource, hosted_cluster_resource, ip_address_pool_resource,
    l2_advertisement_resource, node_pool_resource,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use kube_cluster::helm::{chart_for_1_20, Tools};
use kube_cluster::{
    admin, apply_yaml, ensure_namespace, eventually, wait_established, write_kubeconfig, Operator,
};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
const WAIT: Duration = Duration::from_secs(90);
const GO_NS: &str = "dpf-hcp-provisioner-system";
const GO_RELEASE: &str = "dpf-hcp-provisioner-operator";
/// controller-runtime's field manager: the Go operator's binary name.
const GO_MANAGER: &str = "manager";
const NS: &str = "my-dpu-clusters";
const DPU_NS: &str = "dpu-clusters";
const NAME: &str = "prod-dpu-cluster";
const RELEASE_IMAGE: &str = "quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64";
const INFRA_ID: &str = "prod-dpu-cluster-x7k2q";
const FINALIZER: &str = "dpfhcpprovisioner.provisioning.dpu.hcp.io/finalizer";
const SSH_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb3J3yRzq0k1Jq8F6c1bq6Xq0v4cX1mZq1k2l3m4n5o dpu@example\n";
const PULL_SECRET: &[u8] = br#"{"auths":{"quay.io":{"auth":"dXNlcjpwYXNz"}}}"#;
const CRDS: [&str; 2] = [
    "dpfhcpprovisioners.provisioning.dpu.hcp.io",
    "dpfhcpprovisionerconfigs.provisioning.dpu.hcp.io",
];

fn go_params() -> PostParams {
    PostParams {
        field_manager: Some(GO_MANAGER.into()),
        ..Default::default()
    }
}

fn dynamic(client: &Client, ns: &str, r: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, r)
}

fn object(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

/// The Go operator's shipped CRDs, reduced to their fields' facts
/// (tests/dpf/go-operator-schema.py, from its release-4.22 config/crd).
const GO_SCHEMA: &str =
    include_str!("../../causeway-operator/tests/fixtures/go-operator-schema.json");

/// A schema node for `path` under `root`, made on the way.
fn schema_at<'a>(root: &'a mut Value, path: &str) -> &'a mut Value {
    let mut node = root;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("[]") {
            node = node
                .as_object_mut()
                .unwrap()
                .entry("items")
                .or_insert_with(|| json!({}));
            rest = r;
        } else if let Some(r) = rest.strip_prefix("{}") {
            node = node
                .as_object_mut()
                .unwrap()
                .entry("additionalProperties")
                .or_insert_with(|| json!({}));
            rest = r;
        } else {
            let r = rest.strip_prefix('.').unwrap();
            let end = r.find(['.', '[', '{']).unwrap_or(r.len());
            let (name, after) = r.split_at(end);
            node = node
                .as_object_mut()
                .unwrap()
                .entry("properties")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .unwrap()
                .entry(name.to_string())
                .or_insert_with(|| json!({}));
            rest = after;
        }
    }
    node
}

/// A CRD as the Go chart renders it, with the Go operator's own schema
/// (every field, type, enum and default it ships; the CEL rules left out,
/// as the 1.20 server predates them): a template of the release, kept by
/// Helm on uninstall.
fn go_crd(kind: &str) -> String {
    let schema: Value = serde_json::from_str(GO_SCHEMA).unwrap();
    let k = &schema["kinds"][kind];
    let mut root = json!({"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}});
    for (path, facts) in k["paths"].as_object().unwrap() {
        let node = schema_at(&mut root, path);
        for (fact, value) in facts.as_object().unwrap() {
            // An empty-string default (a reference's name) does not survive
            // the test's apply path, which reads empty strings as absent.
            if fact == "default" && value == "" {
                continue;
            }
            node[fact] = value.clone();
        }
    }
    let names = &k["names"];
    let group = k["group"].as_str().unwrap();
    let mut version = json!({"name": k["version"], "served": true, "storage": true,
        "schema": {"openAPIV3Schema": root}});
    if k["statusSubresource"] == true {
        version["subresources"] = json!({"status": {}});
    }
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{}.{group}", names["plural"].as_str().unwrap()),
            "annotations": {"helm.sh/resource-policy": "keep"}},
        "spec": {"group": group, "scope": k["scope"],
            "names": {"kind": kind, "plural": names["plural"], "singular": names["singular"],
                "listKind": names["listKind"], "shortNames": names["shortNames"]},
            "versions": [version]},
    });
    serde_json::to_string(&crd).unwrap()
}

/// The Go chart's values file: every key with its default, from its source
/// (tests/dpf/go-chart-values.py).
const GO_VALUES: &str = include_str!("../../../tests/dpf/fixtures/go-chart-values.yaml");

/// The Go operator's chart, as far as ownership goes: its values file, the
/// two CRDs as templates with the keep policy, the operator's Deployment
/// from its image and namespace values, and the settings object made once
/// by a post-install hook from `provisionerConfig` with the Go chart's
/// defaults (its repository default, `disableMetalLB` only when given,
/// `manageDPUServiceTemplates` false), also kept.
fn go_chart(dir: &Path) -> PathBuf {
    let chart = dir.join("dpf-hcp-provisioner-operator");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: dpf-hcp-provisioner-operator\nversion: 0.1.0\nappVersion: v0.1.0\n",
    )
    .unwrap();
    std::fs::write(chart.join("values.yaml"), GO_VALUES).unwrap();
    assert!(
        GO_VALUES.contains(&format!("namespace: {GO_NS}\n")),
        "the Go chart's namespace default is not {GO_NS}"
    );
    std::fs::write(
        chart.join("templates/crds.yaml"),
        format!(
            "{}\n---\n{}\n",
            go_crd("DPFHCPProvisioner"),
            go_crd("DPFHCPProvisionerConfig")
        ),
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/deployment.yaml"),
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Values.namespace }}
spec:
  replicas: {{ .Values.replicaCount }}
  selector:
    matchLabels: {app.kubernetes.io/name: dpf-hcp-provisioner-operator, app.kubernetes.io/instance: {{ .Release.Name }}}
  template:
    metadata:
      labels: {app.kubernetes.io/name: dpf-hcp-provisioner-operator, app.kubernetes.io/instance: {{ .Release.Name }}, control-plane: controller-manager}
    spec:
      containers:
      - name: manager
        image: {{ .Values.image.repository }}:{{ .Values.image.tag }}
        command: [/manager]
"#,
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/config.yaml"),
        r#"apiVersion: provisioning.dpu.hcp.io/v1alpha1
kind: DPFHCPProvisionerConfig
metadata:
  name: default
  annotations:
    helm.sh/hook: post-install
    helm.sh/resource-policy: keep
{{- $given := .Values.provisionerConfig }}
spec:
  blueFieldOCPLayerRepo: {{ quote (get $given "blueFieldOCPLayerRepo" | default "quay.io/eelgaev/rhcos-bfb") }}
  {{- if hasKey $given "disableMetalLB" }}
  disableMetalLB: {{ get $given "disableMetalLB" }}
  {{- end }}
  manageDPUServiceTemplates: {{ get $given "manageDPUServiceTemplates" | default false }}
"#,
    )
    .unwrap();
    chart
}

/// HyperShift's part: the HostedCluster's status, the control plane up.
async fn hypershift_status(client: &Client, ignition_port: u16) {
    let now = "2026-11-24T10:00:00Z";
    let cond = |t: &str, s: bool| json!({"type": t, "status": if s {"True"} else {"False"}, "reason": "AsExpected", "message": t, "lastTransitionTime": now});
    dynamic(client, NS, &hosted_cluster_resource())
        .patch_status(
            NAME,
            &PatchParams::apply("hypershift").force(),
            &Patch::Apply(&json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "status": {
                    "conditions": [cond("Available", true), cond("Progressing", false), cond("Degraded", false), cond("ClusterVersionProgressing", false)],
                    "controlPlaneVersion": {"history": [{"state": "Completed", "image": RELEASE_IMAGE, "version": "4.19.0-ec.5", "startedTime": now}]},
                    "controlPlaneEndpoint": {"host": "192.168.1.100", "port": 6443},
                    "ignitionEndpoint": format!("127.0.0.1:{ignition_port}"),
                },
            })),
        )
        .await
        .unwrap();
}

/// The HostedCluster as the Go operator creates it for the README sample
/// (LoadBalancer publishing, the default networks).
fn go_hosted_cluster(owner: &Value) -> Value {
    json!({
        "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": NAME, "namespace": NS, "ownerReferences": [owner]},
        "spec": {
            "release": {"image": RELEASE_IMAGE},
            "pullSecret": {"name": format!("{NAME}-pull-secret")},
            "sshKey": {"name": format!("{NAME}-ssh-key")},
            "dns": {"baseDomain": "clusters.example.com"},
            "etcd": {"managementType": "Managed", "managed": {"storage": {"type": "PersistentVolume", "persistentVolume": {"size": "8Gi", "storageClassName": "ocs-storagecluster-ceph-rbd"}}}},
            "networking": {
                "networkType": "Other",
                "serviceNetwork": [{"cidr": "172.31.0.0/16"}],
                "clusterNetwork": [{"cidr": "10.132.0.0/14"}],
                "allocateNodeCIDRs": "Enabled",
            },
            "platform": {"type": "None"},
            "controllerAvailabilityPolicy": "HighlyAvailable",
            "infraID": INFRA_ID,
            "secretEncryption": {"type": "aescbc", "aescbc": {"activeKey": {"name": format!("{NAME}-etcd-encryption-key")}}},
            "capabilities": {"disabled": ["ImageRegistry", "Insights", "Console", "openshift-samples", "Ingress", "NodeTuning"]},
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "services": [
                {"service": "APIServer", "servicePublishingStrategy": {"type": "LoadBalancer"}},
                {"service": "OAuthServer", "servicePublishingStrategy": {"type": "Route"}},
                {"service": "Konnectivity", "servicePublishingStrategy": {"type": "Route"}},
                {"service": "Ignition", "servicePublishingStrategy": {"type": "Route"}},
            ],
        },
    })
}

fn go_labels() -> Value {
    json!({"dpfhcpprovisioner.dpu.hcp.io/name": NAME, "dpfhcpprovisioner.dpu.hcp.io/namespace": NS})
}

/// What the test compares before and after: identity, generation, spec.
#[derive(Debug, PartialEq)]
struct Kept {
    uid: Option<String>,
    generation: Option<i64>,
    spec: Value,
}

async fn kept(client: &Client, ns: &str, r: &ApiResource, name: &str) -> Kept {
    let o = dynamic(client, ns, r).get(name).await.unwrap();
    Kept {
        uid: o.metadata.uid.clone(),
        generation: o.metadata.generation,
        spec: o.data["spec"].clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_operator_install_is_taken_over_with_every_hosted_cluster_kept() {
    let test = "dpf_migration_kube";
    let Some(c) = kube_cluster::bare_cluster("dpf_migration_kube", test) else {
        return;
    };
    let client = admin(c).await;
    let tools = Tools::new(c);
    let dir = tempfile::tempdir().unwrap();

    // The management cluster: HyperShift's, DPF's and MetalLB's CRDs.
    kube_cluster::dpf_management_cluster(&client, &[NS, DPU_NS], true).await;

    println!("step: the Go operator's release, installed with helm");
    // Helm creates a release's template CRDs and then runs its
    // post-install hooks without waiting for the API server to serve
    // them, so the Go chart's settings hook fails now and then on a fresh
    // cluster ("ensure CRDs are installed first"). The CRDs are made first
    // here, already marked as the release's, and helm adopts them: the
    // same end state, without the race.
    for kind in ["DPFHCPProvisioner", "DPFHCPProvisionerConfig"] {
        let mut v: Value = serde_json::from_str(&go_crd(kind)).unwrap();
        v["metadata"]["annotations"]["meta.helm.sh/release-name"] = json!(GO_RELEASE);
        v["metadata"]["annotations"]["meta.helm.sh/release-namespace"] = json!(GO_NS);
        v["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "Helm"});
        apply_yaml(&client, &serde_json::to_string(&v).unwrap(), "default")
            .await
            .unwrap();
    }
    for crd in CRDS {
        wait_established(&client, crd).await;
    }
    let go = go_chart(dir.path());
    // The Go release as a user installs it: its values file, a repository
    // of theirs (closed here: causeway must not need it) and MetalLB on.
    tools.helm_ok(&[
        "install",
        GO_RELEASE,
        go.to_str().unwrap(),
        "--namespace",
        GO_NS,
        "--create-namespace",
        "--set",
        "provisionerConfig.blueFieldOCPLayerRepo=127.0.0.1:1/closed/rhcos-bfb",
        "--set",
        "provisionerConfig.disableMetalLB=false",
    ]);
    for crd in CRDS {
        wait_established(&client, crd).await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut crd_uids = Vec::new();
    for crd in CRDS {
        let live = crds.get(crd).await.unwrap();
        assert_eq!(
            live.annotations()["meta.helm.sh/release-name"],
            GO_RELEASE,
            "{crd} belongs to the Go release"
        );
        crd_uids.push(live.metadata.uid.clone());
    }

    println!("step: the objects the Go operator made for the README sample");
    let users = [
        ("my-pull-secret", ".dockerconfigjson", PULL_SECRET),
        ("my-ssh-key", "id_rsa.pub", SSH_KEY.as_bytes()),
    ];
    for (name, key, value) in users {
        let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": {key: k8s_openapi::ByteString(value.to_vec())}});
        apply_yaml(&client, &serde_json::to_string(&body).unwrap(), NS)
            .await
            .unwrap();
    }
    let dpus = dynamic(&client, DPU_NS, &dpu_cluster_resource());
    dpus.create(
        &go_params(),
        &object(json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUCluster",
            "metadata": {"name": "my-dpucluster", "namespace": DPU_NS},
            "spec": {"type": "static", "maxNodes": 10, "kubeconfig": format!("{NAME}-admin-kubeconfig")}})),
    )
    .await
    .unwrap();
    // The DPUDeployment the Go CRD requires a provisioner to name, its
    // flavor and DPF's operator config: the DPU boot template's inputs.
    kube_cluster::dpf_template_objects(
        &client,
        DPU_NS,
        "ovs-vsctl set Open_vSwitch . other_config:doca-init=true\n",
    )
    .await;
    let mut sample: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    sample["metadata"]["finalizers"] = json!([FINALIZER]);
    sample["spec"]["dpuDeploymentRef"] = json!({"name": "dpudeployment", "namespace": DPU_NS});
    let provisioners: Api<DPFHCPProvisioner> = Api::namespaced(client.clone(), NS);
    let p = provisioners
        .create(&go_params(), &serde_json::from_value(sample).unwrap())
        .await
        .unwrap();
    let p_uid = p.metadata.uid.clone().unwrap();
    let owner = json!({"apiVersion": "provisioning.dpu.hcp.io/v1alpha1", "kind": "DPFHCPProvisioner",
        "name": NAME, "uid": p_uid, "controller": true, "blockOwnerDeletion": true});
    provisioners
        .patch_status(
            NAME,
            &PatchParams {
                field_manager: Some(GO_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&json!({"status": {"phase": "Ready",
                "hostedClusterRef": {"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster", "name": NAME, "namespace": NS},
                "kubeConfigSecretRef": {"name": format!("{NAME}-admin-kubeconfig")}}})),
        )
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for (name, type_, key, value) in [
        (
            format!("{NAME}-pull-secret"),
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            PULL_SECRET.to_vec(),
        ),
        (
            format!("{NAME}-ssh-key"),
            "Opaque",
            "id_rsa.pub",
            SSH_KEY.as_bytes().to_vec(),
        ),
        (
            format!("{NAME}-etcd-encryption-key"),
            "Opaque",
            "key",
            vec![7; 32],
        ),
    ] {
        secrets
            .create(
                &go_params(),
                &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "namespace": NS, "ownerReferences": [owner]},
                    "type": type_, "data": {key: k8s_openapi::ByteString(value)}}))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    dynamic(&client, NS, &hosted_cluster_resource())
        .create(&go_params(), &object(go_hosted_cluster(&owner)))
        .await
        .unwrap();
    dynamic(&client, NS, &node_pool_resource())
        .create(
            &go_params(),
            &object(json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool",
                "metadata": {"name": NAME, "namespace": NS, "ownerReferences": [owner]},
                "spec": {"clusterName": NAME, "replicas": 0, "management": {"upgradeType": "Replace"},
                    "platform": {"type": "None"}, "release": {"image": RELEASE_IMAGE}}})),
        )
        .await
        .unwrap();
    dynamic(&client, "openshift-operators", &ip_address_pool_resource())
        .create(
            &go_params(),
            &object(json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": NAME, "namespace": "openshift-operators", "labels": go_labels()},
                "spec": {"addresses": ["192.168.1.100/32"], "autoAssign": true,
                    "serviceAllocation": {"namespaces": [format!("{NS}-{NAME}")]}}})),
        )
        .await
        .unwrap();
    dynamic(&client, "openshift-operators", &l2_advertisement_resource())
        .create(
            &go_params(),
            &object(json!({"apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
                "metadata": {"name": format!("advertise-{NAME}"), "namespace": "openshift-operators", "labels": go_labels()},
                "spec": {"ipAddressPools": [NAME]}})),
        )
        .await
        .unwrap();
    // HyperShift's admin kubeconfig, and the Go operator's copy of it.
    let kubeconfig = b"apiVersion: v1\nkind: Config\n# hosted admin\n".to_vec();
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{NAME}-admin-kubeconfig"), "namespace": NS},
                "data": {"kubeconfig": k8s_openapi::ByteString(kubeconfig.clone())}}))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), DPU_NS)
        .create(
            &go_params(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{NAME}-admin-kubeconfig"), "namespace": DPU_NS, "labels": go_labels()},
                "type": "Opaque", "data": {"super-admin.conf": k8s_openapi::ByteString(kubeconfig)}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // HyperShift's ignition server and the control plane up.
    let ignition = kube_cluster::ignition_server(
        dir.path(),
        "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:release-os",
    )
    .await;
    let cp_ns = format!("{NS}-{NAME}");
    ensure_namespace(&client, &cp_ns).await;
    for (name, key, value) in [
        (
            "ignition-server-ca-cert".to_string(),
            "tls.crt",
            ignition.ca_pem.as_bytes().to_vec(),
        ),
        (
            format!("token-{NAME}-5f2a1"),
            "token",
            ignition.token.clone(),
        ),
    ] {
        let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": cp_ns},
            "data": {key: k8s_openapi::ByteString(value)}});
        apply_yaml(&client, &serde_json::to_string(&body).unwrap(), &cp_ns)
            .await
            .unwrap();
    }
    hypershift_status(&client, ignition.port).await;
    let metal_lb = [
        (ip_address_pool_resource(), NAME.to_string()),
        (l2_advertisement_resource(), format!("advertise-{NAME}")),
    ];
    let mut metal_lb_uids = Vec::new();
    for (r, name) in &metal_lb {
        metal_lb_uids.push(
            dynamic(&client, "openshift-operators", r)
                .get(name)
                .await
                .unwrap()
                .metadata
                .uid,
        );
    }
    let hc_before = kept(&client, NS, &hosted_cluster_resource(), NAME).await;
    let np_before = kept(&client, NS, &node_pool_resource(), NAME).await;
    let mut secret_uids = Vec::new();
    for name in [
        format!("{NAME}-pull-secret"),
        format!("{NAME}-ssh-key"),
        format!("{NAME}-etcd-encryption-key"),
    ] {
        secret_uids.push((name.clone(), secrets.get(&name).await.unwrap().metadata.uid));
    }
    let etcd_key = secrets
        .get(&format!("{NAME}-etcd-encryption-key"))
        .await
        .unwrap()
        .data
        .unwrap()["key"]
        .clone();

    println!("step 1: the Go operator scaled to zero");
    Api::<Deployment>::namespaced(client.clone(), GO_NS)
        .patch(
            GO_RELEASE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();

    let chart_copy = chart_for_1_20(dir.path());
    let chart = chart_copy.to_str().unwrap();
    // Nothing in this cluster serves the webhook (no kubelet runs the
    // operator's pod); the operator under test runs beside it.
    let install = [
        "install",
        "causeway",
        chart,
        "--namespace",
        "causeway-system",
        "--create-namespace",
        // The CRDs' schema is the Go release's manager's: helm 4's
        // server-side apply takes it over only when told to.
        "--force-conflicts",
        "--set",
        "webhook.enabled=false",
        "--set",
        // Not the Go release's: its settings object must be kept anyway.
        "dpf.config.blueFieldOCPLayerRepo=127.0.0.1:1/closed/causeway-bfb",
        "--set",
        "dpf.blueFieldImages.4\\.19\\.0-ec\\.5=quay.io/example/rhcos-bfb:4.19.0-ec.5",
    ];
    let configs = Api::<DPFHCPProvisionerConfig>::all(client.clone());
    let go_config = configs.get("default").await.unwrap();
    // Made by the Go chart's hook from its values: the repository given,
    // MetalLB on, DPUServiceTemplates not managed.
    assert_eq!(
        go_config.spec.blue_field_ocp_layer_repo.as_deref(),
        Some("127.0.0.1:1/closed/rhcos-bfb")
    );
    assert_eq!(go_config.spec.disable_metal_lb, Some(false));
    assert_eq!(go_config.spec.manage_dpu_service_templates, Some(false));

    println!("without the hand-over, helm refuses the CRDs and installs nothing");
    let refused = tools.helm(&install);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("invalid ownership metadata")
            && stderr.contains(GO_RELEASE)
            && stderr.contains("dpfhcpprovisioner"),
        "{stderr}"
    );
    for (crd, uid) in CRDS.iter().zip(&crd_uids) {
        assert_eq!(&crds.get(crd).await.unwrap().metadata.uid, uid);
    }

    println!("step 2: the CRDs handed over to causeway's release");
    for crd in CRDS {
        crds.patch(
            crd,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {
                "annotations": {"meta.helm.sh/release-name": "causeway", "meta.helm.sh/release-namespace": "causeway-system"},
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
            }})),
        )
        .await
        .unwrap();
    }

    println!("step 3: helm install causeway");
    tools.helm_ok(&install);
    // The settings object the Go release made is the user's: causeway's
    // release neither replaces nor edits it.
    let config_now = configs.get("default").await.unwrap();
    assert_eq!(
        config_now.metadata.uid, go_config.metadata.uid,
        "settings object re-created"
    );
    assert_eq!(config_now.spec, go_config.spec, "settings object rewritten");
    assert_eq!(
        config_now.spec.blue_field_ocp_layer_repo.as_deref(),
        Some("127.0.0.1:1/closed/rhcos-bfb")
    );
    for (crd, uid) in CRDS.iter().zip(&crd_uids) {
        let live = crds.get(crd).await.unwrap();
        assert_eq!(&live.metadata.uid, uid, "{crd} kept, not re-created");
        assert_eq!(live.annotations()["meta.helm.sh/release-name"], "causeway");
    }
    let token =
        kube_cluster::token_for(&client, "causeway-system", kube_cluster::OPERATOR_SA).await;
    let operator_kubeconfig = dir.path().join("operator-kubeconfig");
    write_kubeconfig(c, &operator_kubeconfig, &token);
    let op = Operator::start_with_kubeconfig(
        c,
        &operator_kubeconfig,
        &[],
        &["--leader-election=false"],
        "migration",
    );

    println!("step 4: the provisioner reaches Ready under causeway");
    eventually("Ready under causeway", WAIT, Some(&op), || async {
        let p = provisioners.get(NAME).await.ok()?;
        p.status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    let p = provisioners.get(NAME).await.unwrap();
    assert_eq!(p.metadata.uid.as_deref(), Some(p_uid.as_str()));
    assert_eq!(p.finalizers(), [FINALIZER], "the same finalizer, once");

    println!("seed 001's Monitoring commands, against the provisioner causeway now runs");
    let kubectl = |args: &[&str]| {
        let out = tools
            .kubectl(args)
            .expect("kubectl (tests/run.sh installs kubernetes-client)");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    for listing in [
        kubectl(&["get", "dpfhcpprovisioner", "-A"]),
        kubectl(&["get", "dpfhcp", "-A"]),
    ] {
        let row = listing
            .lines()
            .find(|l| l.starts_with(NS) && l.contains(NAME))
            .unwrap_or_else(|| panic!("no row for {NAME}: {listing}"));
        assert!(row.split_whitespace().any(|w| w == "Ready"), "{listing}");
    }
    let described = kubectl(&["describe", "dpfhcpprovisioner", NAME, "-n", NS]);
    assert!(
        described.contains("Phase:") && described.contains("Events:"),
        "{described}"
    );
    assert!(described.contains("IgnitionConfigured"), "{described}");
    let events = kubectl(&[
        "get",
        "events",
        "-n",
        NS,
        "--field-selector",
        &format!("involvedObject.name={NAME}"),
    ]);
    for reason in ["DPUClusterFound", "SecretsValid", "IgnitionConfigured"] {
        assert!(events.contains(reason), "{reason}: {events}");
    }
    // `-w` never ends by itself: bounded here, its first listing read.
    let watched = std::process::Command::new("timeout")
        .arg("3")
        .arg("kubectl")
        .arg("--kubeconfig")
        .arg(&tools.kubeconfig)
        .args(["get", "dpfhcpprovisioner", NAME, "-n", NS, "-w"])
        .output()
        .unwrap();
    let watched = String::from_utf8_lossy(&watched.stdout);
    assert!(
        watched
            .lines()
            .any(|l| l.starts_with(NAME) && l.contains("Ready")),
        "{watched}"
    );
    // `-o jsonpath='{.status}' | jq`: jq only pretty-prints, so the JSON is
    // read here.
    let status: Value = serde_json::from_str(&kubectl(&[
        "get",
        "dpfhcpprovisioner",
        NAME,
        "-n",
        NS,
        "-o",
        "jsonpath={.status}",
    ]))
    .unwrap();
    assert_eq!(status["phase"], "Ready");
    assert_eq!(status["hostedClusterRef"]["name"], NAME);
    assert_eq!(
        status["kubeConfigSecretRef"]["name"],
        format!("{NAME}-admin-kubeconfig")
    );
    assert_eq!(
        status["blueFieldContainerImage"],
        "quay.io/example/rhcos-bfb:4.19.0-ec.5"
    );
    for condition in [
        "Ready",
        "KubeConfigInjected",
        "SecretsValid",
        "DPUClusterMissing",
        "ClusterTypeValid",
        "DPUClusterInUse",
        "HostedClusterAvailable",
    ] {
        assert!(
            status["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == condition),
            "{condition} in {status}"
        );
    }

    println!("step 5: helm uninstall of the Go release");
    tools.helm_ok(&["uninstall", GO_RELEASE, "--namespace", GO_NS]);
    assert!(Api::<Deployment>::namespaced(client.clone(), GO_NS)
        .get_opt(GO_RELEASE)
        .await
        .unwrap()
        .is_none());
    for (crd, uid) in CRDS.iter().zip(&crd_uids) {
        assert_eq!(
            &crds.get(crd).await.unwrap().metadata.uid,
            uid,
            "{crd} not deleted"
        );
    }
    assert!(Api::<DPFHCPProvisionerConfig>::all(client.clone())
        .get_opt("default")
        .await
        .unwrap()
        .is_some());

    // What the take-over kept: the cluster's identity and spec, untouched.
    eventually(
        "the provisioner still Ready after the uninstall",
        WAIT,
        Some(&op),
        || async {
            let p = provisioners.get(NAME).await.ok()?;
            (p.metadata.uid.as_deref() == Some(p_uid.as_str())
                && p.status?
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"))
            .then_some(())
        },
    )
    .await;
    let hc_after = kept(&client, NS, &hosted_cluster_resource(), NAME).await;
    assert_eq!(
        hc_after, hc_before,
        "the HostedCluster is the same object with the same spec"
    );
    let np_after = kept(&client, NS, &node_pool_resource(), NAME).await;
    assert_eq!(np_after, np_before, "the NodePool likewise");
    for (name, uid) in secret_uids {
        assert_eq!(
            secrets.get(&name).await.unwrap().metadata.uid,
            uid,
            "{name} kept"
        );
    }
    assert_eq!(
        secrets
            .get(&format!("{NAME}-etcd-encryption-key"))
            .await
            .unwrap()
            .data
            .unwrap()["key"],
        etcd_key,
        "the etcd encryption key is never rewritten"
    );
    for ((r, name), uid) in metal_lb.iter().zip(metal_lb_uids) {
        let live = dynamic(&client, "openshift-operators", r)
            .get(name)
            .await
            .unwrap();
        assert_eq!(live.metadata.uid, uid, "{name} adopted, not re-created");
        assert_eq!(
            live.labels()["dpfhcpprovisioner.dpu.hcp.io/name"],
            NAME,
            "the Go operator's labels are causeway's too"
        );
    }
    let dpu = dpus.get("my-dpucluster").await.unwrap();
    assert_eq!(
        dpu.data["spec"]["kubeconfig"],
        format!("{NAME}-admin-kubeconfig")
    );
}
