//! The CSR approver against a real API server and controller-manager
//! (tests/kube/cluster.sh): the real `causeway operator` under the chart's
//! ServiceAccount approves, denies or leaves alone CSRs that the test
//! creates through the API as the node bootstrapper (a real ServiceAccount
//! token) and as nodes (impersonated), and the controller-manager's signer,
//! whose signing key is the cluster's CA, signs what was approved.
//!
//! The hosted cluster is a second API server of its own (its own CA,
//! whose key its own controller-manager signs with): the provisioner's
//! admin kubeconfig points at it, and the operator runs with
//! `--hosted-apiserver=kubeconfig`. DPF is not running: its DPU CRD comes
//! from tests/kube/crds and the test sets each DPU's phase.
//!
//! Needs root (see operator_kube.rs); without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;
use crate::monitored;
use crate::support;

use std::time::Duration;

use causeway_operator::dpf::approver::{dpu_resource, HOSTED_ROLE};
use causeway_operator::dpf::crd::DPFHCPProvisioner;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use kube_cluster::{
    admin, admin_get, apply_yaml, client_with_token, ensure_namespace, eventually, metric,
    token_for, write_kubeconfig, Operator, SharedCluster,
};
use rcgen::{CertificateParams, CustomExtension, DnType, KeyPair, SanType};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
const DPU_CRD: &str = include_str!("../../../tests/kube/crds/dpu.yaml");
const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "csr-hosted";
const DPU_NS: &str = "csr-fleet";
const NAME: &str = "csr-dpus";
const MCO_NS: &str = "openshift-machine-config-operator";
const BOOTSTRAP: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING: &str = "kubernetes.io/kubelet-serving";
/// The pending cap is max(DPUs, Nodes) + this.
const SLACK: usize = 3;

struct Request {
    cn: String,
    sans: Vec<SanType>,
    ca: bool,
    /// An RSA key, with `key encipherment` among the usages: the only
    /// kubelet requests the 1.20 signer signs. Others are ECDSA P-256.
    rsa: bool,
    /// Bytes of an extension of no meaning, to make the request large.
    pad: usize,
}

fn request(cn: &str) -> Request {
    Request {
        cn: cn.into(),
        sans: Vec::new(),
        ca: false,
        rsa: false,
        pad: 0,
    }
}

/// What a kubelet of the test server's era asks for: RSA 2048.
fn legacy(cn: &str) -> Request {
    Request {
        rsa: true,
        ..request(cn)
    }
}

fn rsa_key() -> KeyPair {
    // ring signs with RSA keys but does not make them.
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl genpkey");
    assert!(out.status.success(), "openssl genpkey failed");
    KeyPair::from_pem(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn pem(r: &Request) -> Vec<u8> {
    pem_and_key(r).0
}

/// The request and its private key (PEM), for a test that then serves the
/// certificate signed for it.
fn pem_and_key(r: &Request) -> (Vec<u8>, String) {
    let key = if r.rsa {
        rsa_key()
    } else {
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap()
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, r.cn.clone());
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params.subject_alt_names = r.sans.clone();
    if r.ca {
        // BasicConstraints { cA TRUE }.
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(
                &[2, 5, 29, 19],
                vec![0x30, 0x03, 0x01, 0x01, 0xff],
            ));
    }
    if r.pad > 0 {
        params
            .custom_extensions
            .push(CustomExtension::from_oid_content(
                &[1, 3, 6, 1, 4, 1, 55555, 1],
                vec![0x41; r.pad],
            ));
    }
    let request = params
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap()
        .into_bytes();
    (request, key.serialize_pem())
}

/// A serving request for dpu-b as no library writes one: keyUsage in a
/// first extensionRequest attribute, and in a second the SANs a node may
/// never have (the API's name, another DPU's address, the API VIP). The
/// signer merges both attributes; an approver reading the first alone
/// sees no SANs at all.
fn hidden_sans_request() -> Vec<u8> {
    use causeway_operator::dpf::forged_csr::{
        extension_request, key_usage, request, subject_alt_name, Key,
    };
    let key = rsa_key();
    let sans = subject_alt_name(
        &["dpu-b", "kubernetes.default.svc"],
        &[&[10, 0, 0, 11], &[192, 168, 1, 100]],
    );
    request(
        "system:node:dpu-b",
        &key.public_key_der(),
        &[
            extension_request(&[&[key_usage()]]),
            extension_request(&[&[sans]]),
        ],
        &Key::Rsa(key.serialize_der()),
    )
}

async fn created_second(client: &Client, name: &str) -> i64 {
    Api::<CertificateSigningRequest>::all(client.clone())
        .get(name)
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .unwrap()
        .0
        .as_second()
}

fn dns(s: &str) -> SanType {
    SanType::DnsName(s.try_into().unwrap())
}

fn ip(s: &str) -> SanType {
    SanType::IpAddress(s.parse().unwrap())
}

/// Creates a CSR as `client`'s user; returns its name.
async fn create_csr(client: &Client, name: &str, signer: &str, r: &Request) -> String {
    create_raw_csr(client, name, signer, pem(r), r.rsa).await
}

/// Creates a CSR of the PEM request `request` (from an RSA key when
/// `rsa`, which adds `key encipherment` to the usages).
async fn create_raw_csr(
    client: &Client,
    name: &str,
    signer: &str,
    request: Vec<u8>,
    rsa: bool,
) -> String {
    let last = if signer == BOOTSTRAP {
        "client auth"
    } else {
        "server auth"
    };
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": k8s_openapi::ByteString(request),
            "signerName": signer,
            "usages": if rsa {
                json!(["digital signature", "key encipherment", last])
            } else {
                json!(["digital signature", last])
            },
        },
    }))
    .unwrap();
    Api::<CertificateSigningRequest>::all(client.clone())
        .create(&PostParams::default(), &csr)
        .await
        .unwrap_or_else(|e| panic!("creating CSR {name}: {e}"));
    name.to_string()
}

/// The CSR's decision: (type, reason, message), and whether it was signed.
async fn decision(client: &Client, name: &str) -> (Option<(String, String, String)>, bool) {
    let csr = Api::<CertificateSigningRequest>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    let status = csr.status.unwrap_or_default();
    let cond = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Approved" || c.type_ == "Denied")
        .map(|c| {
            (
                c.type_,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        });
    (cond, status.certificate.is_some())
}

/// Waits for the approver's verdict on `name`; returns the message.
async fn wait_verdict(
    client: &Client,
    op: &Operator,
    name: &str,
    type_: &str,
    reason: &str,
) -> String {
    let (t, r, m) = eventually(
        &format!("CSR {name}: {type_}/{reason}"),
        WAIT,
        Some(op),
        || async { decision(client, name).await.0 },
    )
    .await;
    assert_eq!((t.as_str(), r.as_str()), (type_, reason), "CSR {name}: {m}");
    m
}

/// Creates an attacker's CSR as `creator`'s user, adds it to `attacks`
/// (checked at the end never to have been approved or signed) and waits
/// until the approver denies it with `reason`; returns the message.
#[allow(clippy::too_many_arguments)]
async fn denied(
    client: &Client,
    op: &Operator,
    attacks: &mut Vec<String>,
    creator: &Client,
    name: &str,
    signer: &str,
    r: &Request,
    reason: &str,
) -> String {
    attacks.push(create_csr(creator, name, signer, r).await);
    wait_verdict(client, op, name, "Denied", reason).await
}

/// The operator killed and started again as `name`, once its admin port
/// answers.
async fn restarted(mut op: Operator, c: &SharedCluster, args: &[&str], name: &str) -> Operator {
    op.kill9();
    let op = Operator::start(c, &[NS], args, name);
    eventually("the admin port", WAIT, Some(&op), || async {
        std::net::TcpStream::connect(op.admin).ok().map(|_| ())
    })
    .await;
    op
}

/// Waits until the controller-manager has signed `name`.
async fn wait_signed(client: &Client, op: &Operator, name: &str) {
    eventually(&format!("CSR {name} signed"), WAIT, Some(op), || async {
        decision(client, name).await.1.then_some(())
    })
    .await;
}

/// Waits until the approver has counted `verdict`/`reason` for a CSR of
/// `kind` at least `n` times: a CSR it leaves alone has no other trace.
async fn wait_counted(op: &Operator, kind: &str, verdict: &str, reason: &str, n: f64) {
    let series = format!(
        "causeway_operator_csr_decisions_total{{kind=\"{kind}\",reason=\"{reason}\",verdict=\"{verdict}\"}}"
    );
    eventually(&format!("{series} >= {n}"), WAIT, Some(op), || async {
        (metric(&admin_get(op, "/metrics"), &series) >= n).then_some(())
    })
    .await;
}

/// A client that acts as `user` in `groups` (the API server adds
/// system:authenticated), by the admin's impersonation right.
async fn impersonating(c: &SharedCluster, user: &str, groups: &[&str]) -> Client {
    causeway_operator::k8s::client::install_tls_provider();
    let path = c
        .dir
        .join(format!("kubeconfig-as-{}", user.replace(':', "-")));
    write_kubeconfig(c, &path, &c.admin_token);
    let kc = Kubeconfig::read_from(&path).unwrap();
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(config).unwrap()
}

async fn dpu(client: &Client, name: &str, phase: &str) {
    dpu_of(client, name, phase, "fleet").await
}

/// A DPU of the DPUCluster `cluster` in DPU_NS, as DPF writes it: its
/// `spec.cluster` names the DPUCluster.
async fn dpu_of(client: &Client, name: &str, phase: &str, cluster: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), DPU_NS, &dpu_resource());
    let pp = PatchParams::apply("dpf").force();
    api.patch(
        name,
        &pp,
        &Patch::Apply(
            json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPU",
            "metadata": {"name": name, "namespace": DPU_NS},
            "spec": {"cluster": {"name": cluster, "namespace": DPU_NS}}}),
        ),
    )
    .await
    .unwrap();
    api.patch_status(
        name,
        &pp,
        &Patch::Apply(
            json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPU",
            "status": {"phase": phase}}),
        ),
    )
    .await
    .unwrap();
}

/// The hosted cluster's Node for a joined DPU, with its addresses.
async fn node(client: &Client, name: &str, addresses: &[(&str, &str)]) {
    node_at(client, name, addresses, None).await
}

/// As [`node`], with the kubelet's port in `status.daemonEndpoints`.
async fn node_at(
    client: &Client,
    name: &str,
    addresses: &[(&str, &str)],
    kubelet_port: Option<u16>,
) {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply("kubelet").force();
    api.patch(
        name,
        &pp,
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})),
    )
    .await
    .unwrap();
    let addresses: Vec<Value> = addresses
        .iter()
        .map(|(t, a)| json!({"type": t, "address": a}))
        .collect();
    let mut status = json!({"addresses": addresses});
    if let Some(port) = kubelet_port {
        status["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": port}});
    }
    api.patch_status(
        name,
        &pp,
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": status})),
    )
    .await
    .unwrap();
}

/// An Infra on the DPUs' VLAN with these DHCP reservations: what the
/// management side assigned, and to which host.
async fn reserving_infra(client: &Client, name: &str, reservations: Value) {
    apply_yaml(
        client,
        &serde_json::to_string(&json!({
            "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "networkConfig": {"cidr": "10.0.0.0/24", "gateway": "10.0.0.1", "networkAttachmentDefinition": "dpu-vlan"},
                "infraComponents": {
                    "dhcp": {"enabled": true, "serverIP": "10.0.0.2", "rangeStart": "10.0.0.100", "rangeEnd": "10.0.0.200",
                        "reservations": reservations},
                    "dns": {"enabled": false},
                    "proxy": {"enabled": false},
                },
            },
        }))
        .unwrap(),
        NS,
    )
    .await
    .unwrap();
}

async fn approval_condition(client: &Client) -> Option<(String, String, String)> {
    provisioner_condition(client, "CSRAutoApprovalActive").await
}

/// A condition of the provisioner: (status, reason, message).
async fn provisioner_condition(client: &Client, type_: &str) -> Option<(String, String, String)> {
    let p = Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .get_opt(NAME)
        .await
        .unwrap()?;
    p.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

async fn wait_approval_condition(
    client: &Client,
    op: &Operator,
    status: &str,
    reason: &str,
) -> String {
    eventually(
        &format!("CSRAutoApprovalActive={status}/{reason}"),
        WAIT,
        Some(op),
        || async {
            approval_condition(client)
                .await
                .filter(|(s, r, _)| s == status && r == reason)
                .map(|(_, _, m)| m)
        },
    )
    .await
}

async fn kubeconfig_secret(client: &Client, text: &str) {
    let body = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{NAME}-admin-kubeconfig"), "namespace": NS},
        "data": {"kubeconfig": k8s_openapi::ByteString(text.as_bytes().to_vec())}});
    apply_yaml(client, &serde_json::to_string(&body).unwrap(), NS)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dpu_kubelet_csrs_are_approved_end_to_end_and_every_attack_is_refused_or_left_alone() {
    let test = "dpu_kubelet_csrs_are_approved_end_to_end_and_every_attack_is_refused_or_left_alone";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    // The hosted cluster: a second API server of its own, with its own
    // controller-manager, whose signer signs with its own CA. CSRs, Nodes,
    // the node bootstrapper and the approver's identity live there; the
    // provisioner, DPUs and Infras on the management side.
    let Some(h) = kube_cluster::hosted_cluster("csr_kube", test, "DNS:api.csr-dpus.example.com")
    else {
        return;
    };
    let hosted = admin(h).await;
    kube_cluster::install_fixture_crds(
        &client,
        &[
            kube_cluster::HOSTED_CLUSTER_CRD,
            kube_cluster::NODE_POOL_CRD,
            kube_cluster::DPU_CLUSTER_CRD,
            (DPU_CRD, "dpus.provisioning.dpu.nvidia.com"),
        ],
    )
    .await;
    for ns in [NS, DPU_NS] {
        ensure_namespace(&client, ns).await;
    }
    for ns in [NS, MCO_NS] {
        ensure_namespace(&hosted, ns).await;
    }
    // The node bootstrapper as OpenShift has it: a ServiceAccount that may
    // create CSRs; and nodes may create CSRs (the Node authorizer's part,
    // by RBAC here).
    apply_yaml(
        &hosted,
        &format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: node-bootstrapper, namespace: {MCO_NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: csr-test-bootstrapper}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-bootstrapper"}}
subjects:
- {{kind: ServiceAccount, name: node-bootstrapper, namespace: {MCO_NS}}}
- {{kind: Group, name: "system:nodes", apiGroup: rbac.authorization.k8s.io}}
"#
        ),
        "default",
    )
    .await
    .unwrap();
    let bootstrapper =
        client_with_token(h, &token_for(&hosted, MCO_NS, "node-bootstrapper").await).await;
    let node_b = impersonating(h, "system:node:dpu-b", &["system:nodes"]).await;

    // The provisioner: its DPUCluster's namespace holds the DPUs, its
    // machine network is the DPUs' management network.
    let mut doc: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    doc["metadata"] = json!({"name": NAME, "namespace": NS});
    doc["spec"]["dpuClusterRef"] = json!({"name": "fleet", "namespace": DPU_NS});
    doc["spec"]["networking"] = json!({"machineNetwork": [{"cidr": "10.0.0.0/24"}]});
    apply_yaml(&client, &serde_json::to_string(&doc).unwrap(), NS)
        .await
        .unwrap();
    dpu(&client, "dpu-a", "DPU Cluster Config").await;
    dpu(&client, "dpu-b", "Ready").await;
    dpu(&client, "dpu-c", "DPU Cluster Config").await;
    node(
        &hosted,
        "dpu-b",
        &[("InternalIP", "10.0.0.12"), ("Hostname", "dpu-b")],
    )
    .await;
    // What the management side assigned: the DPUs' VLAN Infra reserves
    // each DPU's address under its name.
    reserving_infra(
        &client,
        "dpu-vlan",
        json!([
            {"mac": "02:00:00:00:00:12", "ip": "10.0.0.12", "hostname": "dpu-b"},
            {"mac": "02:00:00:00:00:14", "ip": "10.0.0.14", "hostname": "dpu-b"},
            {"mac": "02:00:00:00:00:13", "ip": "10.0.0.13", "hostname": "dpu-c"},
        ]),
    )
    .await;

    kube_cluster::blue_field_images(
        &client,
        &[("4.19.0-ec.5", "quay.io/example/rhcos-bfb:4.19.0-ec.5")],
    )
    .await;
    let slack = format!("--csr-pending-slack={SLACK}");
    // No clock skew between the API server and the operator here: the
    // creation window is exact (to the second the API server records).
    let args = [
        "--leader-election=false",
        "--hosted-apiserver=kubeconfig",
        &slack,
        "--csr-creation-skew-seconds=0",
    ];
    let mut op = Operator::start(c, &[NS], &args, "csr");

    println!("scenario: no admin kubeconfig yet, then one whose server does not answer");
    let why = wait_approval_condition(&client, &op, "False", "KubeconfigNotAvailable").await;
    assert!(why.contains(&format!("{NAME}-admin-kubeconfig")), "{why}");
    // A port of the test's own where nothing listens.
    let dead = format!("https://127.0.0.1:{}", crate::support::reserved_port());
    kubeconfig_secret(
        &client,
        &causeway_operator::k8s::manifest::token_kubeconfig(&dead, &h.ca, &h.admin_token),
    )
    .await;
    wait_approval_condition(&client, &op, "False", "HostedClusterNotReachable").await;

    println!("scenario: the admin kubeconfig cannot set up the approver's own identity: it approves nothing");
    // An identity that may approve kubelet CSRs but make no RBAC: were
    // the approver to fall back to the kubeconfig it was given, it could
    // approve with it.
    apply_yaml(
        &hosted,
        &format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: approve-only, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: csr-test-approve-only}}
rules:
- {{apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests], verbs: [get, list, watch]}}
- {{apiGroups: [certificates.k8s.io], resources: [certificatesigningrequests/approval], verbs: [patch, update]}}
- {{apiGroups: [certificates.k8s.io], resources: [signers], verbs: [approve], resourceNames: ["{BOOTSTRAP}", "{SERVING}"]}}
- {{apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: csr-test-approve-only}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-test-approve-only}}
subjects:
- {{kind: ServiceAccount, name: approve-only, namespace: {NS}}}
"#
        ),
        "default",
    )
    .await
    .unwrap();
    let approve_only = token_for(&hosted, NS, "approve-only").await;
    let early = create_csr(
        &bootstrapper,
        "dpu-a-early",
        BOOTSTRAP,
        &legacy("system:node:dpu-a"),
    )
    .await;
    kubeconfig_secret(
        &client,
        &causeway_operator::k8s::manifest::token_kubeconfig(&h.server, &h.ca, &approve_only),
    )
    .await;
    let why = wait_approval_condition(&client, &op, "False", "LeastPrivilegeUnavailable").await;
    assert!(why.contains("own ServiceAccount"), "{why}");
    let series = format!(
        "causeway_operator_csr_approver_not_running_total{{namespace=\"{NS}\",provisioner=\"{NAME}\",reason=\"LeastPrivilegeUnavailable\"}}"
    );
    eventually(&format!("{series} counted"), WAIT, Some(&op), || async {
        (metric(&admin_get(&op, "/metrics"), &series) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(decision(&hosted, &early).await, (None, false));
    Api::<CertificateSigningRequest>::all(hosted.clone())
        .delete(&early, &DeleteParams::default())
        .await
        .unwrap();

    println!("scenario: the hosted cluster answers; the approver takes its own narrow identity");
    kubeconfig_secret(
        &client,
        &causeway_operator::k8s::manifest::token_kubeconfig(&h.server, &h.ca, &h.admin_token),
    )
    .await;
    let why = wait_approval_condition(&client, &op, "True", "Active").await;
    assert!(why.contains("own ServiceAccount"), "{why}");
    let role = Api::<ClusterRole>::all(hosted.clone())
        .get(HOSTED_ROLE)
        .await
        .unwrap();
    let approve: Vec<_> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.verbs.iter().any(|v| v == "approve"))
        .collect();
    assert_eq!(approve.len(), 1);
    assert_eq!(
        approve[0].resource_names.as_deref(),
        Some(&[BOOTSTRAP.to_string(), SERVING.to_string()][..])
    );

    let mut attacks = Vec::new();

    println!("scenario: a joining DPU's bootstrap CSR is approved and signed, once it is as old as the hold-down");
    let asked = std::time::Instant::now();
    let first = create_csr(
        &bootstrapper,
        "dpu-a-bootstrap",
        BOOTSTRAP,
        &legacy("system:node:dpu-a"),
    )
    .await;
    let msg = wait_verdict(&hosted, &op, &first, "Approved", "AutoApproved").await;
    assert_eq!(msg, "Auto-approved bootstrap CSR for DPU worker node dpu-a");
    // Held down for 15 s (the API server records creation to the second),
    // then approved when the hold-down ends, not at the next 30 s resync.
    let took = asked.elapsed();
    println!("the bootstrap CSR was approved {took:?} after it was made");
    assert!(
        (std::time::Duration::from_secs(13)..std::time::Duration::from_secs(25)).contains(&took),
        "approved {took:?} after it was made; the hold-down is 15 s"
    );
    wait_signed(&hosted, &op, &first).await;
    let uid = Api::<CertificateSigningRequest>::all(hosted.clone())
        .get(&first)
        .await
        .unwrap()
        .uid()
        .unwrap();
    let recorded = eventually(
        "the approval recorded in status",
        WAIT,
        Some(&op),
        || async {
            let p = Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
                .get(NAME)
                .await
                .ok()?;
            p.status?
                .csr_approval?
                .bootstrap
                .into_iter()
                .find(|b| b.node == "dpu-a")
        },
    )
    .await;
    assert_eq!(recorded.csr_uid, uid);

    println!("scenario: a second bootstrap CSR for the same DPU in the same cycle");
    let msg = denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-a-again",
        BOOTSTRAP,
        &request("system:node:dpu-a"),
        "AlreadyApproved",
    )
    .await;
    assert!(msg.contains(&uid), "{msg}");

    println!("scenario: a bootstrap CSR for a DPU whose Node already exists");
    denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-b-bootstrap",
        BOOTSTRAP,
        &request("system:node:dpu-b"),
        "NodeExists",
    )
    .await;

    println!("scenario: the DPU kept from joining by its old Node is named, with the remedy");
    let stale = eventually(
        "DPUJoinBlocked=True/StaleNode naming dpu-b",
        WAIT,
        Some(&op),
        || async {
            provisioner_condition(&client, "DPUJoinBlocked")
                .await
                .filter(|(s, r, m)| s == "True" && r == "StaleNode" && m.contains("dpu-b"))
                .map(|c| c.2)
        },
    )
    .await;
    assert!(stale.contains("delete node dpu-b"), "{stale}");
    // A second one, whose old Node then goes: it leaves the condition.
    dpu(&client, "dpu-s", "DPU Cluster Config").await;
    node(&hosted, "dpu-s", &[("InternalIP", "10.0.0.19")]).await;
    denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-s-bootstrap",
        BOOTSTRAP,
        &request("system:node:dpu-s"),
        "NodeExists",
    )
    .await;
    eventually(
        "DPUJoinBlocked naming dpu-s too",
        WAIT,
        Some(&op),
        || async {
            provisioner_condition(&client, "DPUJoinBlocked")
                .await
                .filter(|(_, _, m)| m.contains("dpu-s") && m.contains("dpu-b"))
        },
    )
    .await;
    Api::<Node>::all(hosted.clone())
        .delete("dpu-s", &Default::default())
        .await
        .unwrap();
    eventually("dpu-s no longer blocked", WAIT, Some(&op), || async {
        provisioner_condition(&client, "DPUJoinBlocked")
            .await
            .filter(|(s, _, m)| s == "True" && !m.contains("dpu-s") && m.contains("dpu-b"))
    })
    .await;
    Api::<DynamicObject>::namespaced_with(client.clone(), DPU_NS, &dpu_resource())
        .delete("dpu-s", &Default::default())
        .await
        .unwrap();

    println!("scenario: a bootstrap CSR asking for a CA certificate");
    denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-c-ca",
        BOOTSTRAP,
        &Request {
            ca: true,
            ..request("system:node:dpu-c")
        },
        "Extension",
    )
    .await;

    println!(
        "scenario: a joined DPU's serving CSR with its own name and address is approved and signed"
    );
    let serving = create_csr(
        &node_b,
        "dpu-b-serving",
        SERVING,
        &Request {
            sans: vec![dns("dpu-b"), ip("10.0.0.12")],
            ..legacy("system:node:dpu-b")
        },
    )
    .await;
    let msg = wait_verdict(&hosted, &op, &serving, "Approved", "AutoApproved").await;
    assert_eq!(msg, "Auto-approved serving CSR for DPU worker node dpu-b");
    wait_signed(&hosted, &op, &serving).await;

    println!("scenario: a node impersonating another DPU (CN of dpu-a, identity of dpu-b)");
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-as-a",
        SERVING,
        &Request {
            sans: vec![dns("dpu-a")],
            ..request("system:node:dpu-a")
        },
        "CommonName",
    )
    .await;

    println!("scenario: serving CSRs with SANs a node may never have");
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-kubernetes",
        SERVING,
        &Request {
            sans: vec![dns("dpu-b"), dns("kubernetes.default.svc")],
            ..request("system:node:dpu-b")
        },
        "ForbiddenSAN",
    )
    .await;
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-vip",
        SERVING,
        &Request {
            sans: vec![ip("192.168.1.100")],
            ..request("system:node:dpu-b")
        },
        "ForbiddenSAN",
    )
    .await;
    println!("scenario: prefix confusion: a name that starts with the node's");
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-prefix",
        SERVING,
        &Request {
            sans: vec![dns("dpu-b.attacker.example")],
            ..request("system:node:dpu-b")
        },
        "SANNotHost",
    )
    .await;
    println!("scenario: SANs hidden in a second extensionRequest attribute");
    attacks.push(
        create_raw_csr(
            &node_b,
            "dpu-b-hidden-sans",
            SERVING,
            hidden_sans_request(),
            true,
        )
        .await,
    );
    wait_verdict(
        &hosted,
        &op,
        attacks.last().unwrap(),
        "Denied",
        "Attributes",
    )
    .await;
    println!("scenario: a renewal that adds an address, even one the Node now reports");
    node(
        &hosted,
        "dpu-b",
        &[
            ("InternalIP", "10.0.0.12"),
            ("ExternalIP", "10.0.0.14"),
            ("Hostname", "dpu-b"),
        ],
    )
    .await;
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-renewal-wider",
        SERVING,
        &Request {
            sans: vec![dns("dpu-b"), ip("10.0.0.12"), ip("10.0.0.14")],
            ..request("system:node:dpu-b")
        },
        "RenewalAddsSANs",
    )
    .await;

    println!(
        "scenario: a node that adds a sibling's address to its own Node gets no certificate for it"
    );
    node(
        &hosted,
        "dpu-b",
        &[
            ("InternalIP", "10.0.0.12"),
            ("ExternalIP", "10.0.0.13"),
            ("Hostname", "dpu-b"),
        ],
    )
    .await;
    denied(
        &hosted,
        &op,
        &mut attacks,
        &node_b,
        "dpu-b-sibling-address",
        SERVING,
        &Request {
            sans: vec![dns("dpu-b"), ip("10.0.0.13")],
            ..request("system:node:dpu-b")
        },
        "SANAssignedToAnother",
    )
    .await;

    println!("scenario: a CSR for a host that is no DPU of this cluster is someone else's");
    attacks.push(
        create_csr(
            &bootstrapper,
            "worker-7",
            BOOTSTRAP,
            &request("system:node:worker-7"),
        )
        .await,
    );
    wait_counted(&op, "bootstrap", "ignore", "UnknownDPU", 1.0).await;
    assert_eq!(
        decision(&hosted, attacks.last().unwrap()).await,
        (None, false)
    );
    // A joining DPU of another DPUCluster in the same namespace is not one
    // of this provisioner's either.
    dpu_of(&client, "dpu-z", "DPU Cluster Config", "other-fleet").await;
    attacks.push(
        create_csr(
            &bootstrapper,
            "dpu-z-bootstrap",
            BOOTSTRAP,
            &request("system:node:dpu-z"),
        )
        .await,
    );
    wait_counted(&op, "bootstrap", "ignore", "UnknownDPU", 2.0).await;
    assert_eq!(
        decision(&hosted, attacks.last().unwrap()).await,
        (None, false)
    );

    println!("scenario: a flood of pending CSRs that could be ours stops all approval until it is cleared; CSRs for names that are no DPU's do not count");
    // Three DPUs of this cluster, one Node: the cap is 3 + SLACK. worker-7
    // and dpu-z name no DPU of it and do not count; nor do 3 + SLACK more
    // like them.
    for i in 0..(3 + SLACK) {
        attacks.push(
            create_csr(
                &bootstrapper,
                &format!("no-dpu-{i}"),
                BOOTSTRAP,
                &request(&format!("system:node:no-dpu-{i}")),
            )
            .await,
        );
    }
    wait_counted(&op, "bootstrap", "ignore", "UnknownDPU", (5 + SLACK) as f64).await;
    let (active, reason, _) = approval_condition(&client).await.unwrap();
    assert_eq!(
        (active.as_str(), reason.as_str()),
        ("True", "Active"),
        "requests for names that are no DPU's counted as a flood"
    );
    // Serving CSRs in the name of dpu-c, which has no Node yet: left
    // pending, and each could be approved once it has one. 3 + SLACK + 1
    // go over the cap.
    let node_c = impersonating(h, "system:node:dpu-c", &["system:nodes"]).await;
    let mut flood = Vec::new();
    for i in 0..(4 + SLACK) {
        flood.push(
            create_csr(
                &node_c,
                &format!("flood-{i}"),
                SERVING,
                &Request {
                    sans: vec![dns("dpu-c")],
                    ..request("system:node:dpu-c")
                },
            )
            .await,
        );
    }
    let why = wait_approval_condition(&client, &op, "False", "TooManyPendingCSRs").await;
    assert!(
        why.contains(&format!("over the cap of {}", 3 + SLACK)),
        "{why}"
    );
    // A node squatting on dpu-c's join with its own credentials on the
    // bootstrap signer: left alone, and not counted as a duplicate.
    attacks.push(
        create_csr(
            &node_b,
            "dpu-b-squats-c",
            BOOTSTRAP,
            &request("system:node:dpu-c"),
        )
        .await,
    );
    let joining = create_csr(
        &bootstrapper,
        "dpu-c-bootstrap",
        BOOTSTRAP,
        &legacy("system:node:dpu-c"),
    )
    .await;
    wait_counted(&op, "bootstrap", "ignore", "TooManyPending", 1.0).await;
    assert_eq!(decision(&hosted, &joining).await, (None, false));
    let csrs: Api<CertificateSigningRequest> = Api::all(hosted.clone());
    for f in &flood {
        csrs.delete(f, &DeleteParams::default()).await.unwrap();
    }
    wait_approval_condition(&client, &op, "True", "Active").await;
    wait_verdict(&hosted, &op, &joining, "Approved", "AutoApproved").await;
    wait_signed(&hosted, &op, &joining).await;

    println!("every CSR metric the chart's alerts and dashboards read is exported");
    monitored::assert_exported(
        monitored::Source::CsrApprover,
        &[&admin_get(&op, "/metrics")],
    );

    println!("the signer was never asked to sign an attacker's CSR");
    for name in &attacks {
        let (cond, signed) = decision(&hosted, name).await;
        assert!(!signed, "{name} was signed");
        assert!(
            cond.as_ref().is_none_or(|(t, _, _)| t != "Approved"),
            "{name} was approved: {cond:?}"
        );
    }

    println!("scenario: a bootstrap CSR staged while the approver was down is denied once its DPU joins; the DPU's own is approved");
    dpu(&client, "dpu-e", "OS Installing").await;
    op.kill9();
    let staged = create_csr(
        &bootstrapper,
        "dpu-e-staged",
        BOOTSTRAP,
        &legacy("system:node:dpu-e"),
    )
    .await;
    attacks.push(staged.clone());
    // The API server records creation to the second: the approver must
    // see the DPU join in a later second than the CSR was made.
    let made = created_second(&hosted, &staged).await;
    eventually(
        "the clock past the staged CSR's second",
        WAIT,
        None,
        || async { (k8s_openapi::jiff::Timestamp::now().as_second() > made).then_some(()) },
    )
    .await;
    dpu(&client, "dpu-e", "DPU Cluster Config").await;
    op = Operator::start(c, &[NS], &args, "csr-restarted");
    wait_verdict(&hosted, &op, &staged, "Denied", "CreatedBeforeJoining").await;
    let real = create_csr(
        &bootstrapper,
        "dpu-e-bootstrap",
        BOOTSTRAP,
        &legacy("system:node:dpu-e"),
    )
    .await;
    wait_verdict(&hosted, &op, &real, "Approved", "AutoApproved").await;
    wait_signed(&hosted, &op, &real).await;
    let real_uid = Api::<CertificateSigningRequest>::all(hosted.clone())
        .get(&real)
        .await
        .unwrap()
        .uid()
        .unwrap();

    println!("scenario: a restart between two bootstrap CSRs keeps the record");
    op.kill9();
    op = Operator::start(c, &[NS], &args, "csr-restarted-again");
    let msg = denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-e-again",
        BOOTSTRAP,
        &request("system:node:dpu-e"),
        "AlreadyApproved",
    )
    .await;
    assert!(msg.contains(&real_uid), "{msg}");

    println!("scenario: a known DPU that is not joining does not ask to join");
    dpu(&client, "dpu-f", "OS Installing").await;
    denied(
        &hosted,
        &op,
        &mut attacks,
        &bootstrapper,
        "dpu-f-early",
        BOOTSTRAP,
        &request("system:node:dpu-f"),
        "DPUNotJoining",
    )
    .await;

    println!("events say what was approved and denied");
    let events: Vec<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let count = |reason: &str| {
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .count()
    };
    assert!(
        count("CSRApproved") >= 3,
        "approved events: {}",
        count("CSRApproved")
    );
    assert!(
        count("CSRDenied") >= 7,
        "denied events: {}",
        count("CSRDenied")
    );

    println!("scenario: a session that starts with 48 CSRs of 1.4 MiB pending lists them without holding them all at once");
    let vm_hwm_kib = |op: &Operator| -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", op.child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let pending_series =
        format!("causeway_operator_csr_pending{{namespace=\"{NS}\",provisioner=\"{NAME}\"}}");
    op = restarted(op, c, &args, "csr-baseline").await;
    eventually(
        "the new process's first approval pass",
        WAIT,
        Some(&op),
        || async {
            admin_get(&op, "/metrics")
                .contains(&pending_series)
                .then_some(())
        },
    )
    .await;
    let baseline = vm_hwm_kib(&op);
    let big_count = 48;
    let mut big = Vec::new();
    for i in 0..big_count {
        big.push(
            create_csr(
                &bootstrapper,
                &format!("big-{i}"),
                BOOTSTRAP,
                &Request {
                    pad: 1 << 20,
                    ..request(&format!("system:node:big-{i}"))
                },
            )
            .await,
        );
    }
    op = restarted(op, c, &args, "csr-big-list").await;
    let unknown = "causeway_operator_csr_decisions_total{kind=\"bootstrap\",reason=\"UnknownDPU\",verdict=\"ignore\"}";
    eventually(
        "every large CSR decided by the new process",
        WAIT,
        Some(&op),
        || async {
            (metric(&admin_get(&op, "/metrics"), unknown) >= big_count as f64).then_some(())
        },
    )
    .await;
    let peak = vm_hwm_kib(&op);
    let rise = peak.saturating_sub(baseline);
    println!("operator VmHWM {baseline} KiB after a session start with no large CSRs, {peak} KiB after one with {big_count} CSRs of 1.4 MiB pending (+{rise} KiB)");
    assert!(
        rise < 80 << 10,
        "a session start with {big_count} large CSRs pending raised the operator's peak memory by {} MiB (bound 80 MiB)",
        rise >> 10
    );
    let csrs: Api<CertificateSigningRequest> = Api::all(hosted.clone());
    for name in &big {
        csrs.delete(name, &DeleteParams::default()).await.unwrap();
    }

    live_certificate_scenario(c, h, (&client, &hosted), &op, &mut attacks).await;

    println!("scenario: a burst of Node changes costs a few approval passes, not one each");
    let passes = || {
        metric(
            &admin_get(&op, "/metrics"),
            "causeway_operator_csr_approval_passes_total",
        )
    };
    let before = passes();
    let started = std::time::Instant::now();
    for i in 0..60 {
        node(
            &hosted,
            "burst",
            &[("InternalIP", &format!("10.0.0.{}", 100 + i % 50))],
        )
        .await;
    }
    let took = started.elapsed();
    // Time for any pass the burst still owes to run: waiting longer only
    // lets more passes in, so the bound below holds the tighter.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ran = passes() - before;
    // Every pass is preceded by a whole 250 ms window, so over the span
    // from the first write to this read there is at most one pass per
    // window, plus one already under way. A bound from the burst alone
    // was wrong under load: the watch delivers events after the writes
    // return, and a pass that started late in the burst runs after it.
    let span = started.elapsed();
    let bound = span.as_millis().div_ceil(250) as f64 + 1.0;
    eprintln!("120 Node events in {took:?} cost {ran} passes over {span:?} (bound {bound})");
    assert!(
        ran >= 1.0 && ran <= bound,
        "120 Node events in {took:?} cost {ran} approval passes over {span:?}; the debounce allows {bound}"
    );
    Api::<Node>::all(hosted.clone())
        .delete("burst", &DeleteParams::default())
        .await
        .unwrap();

    println!("scenario: the provisioner goes away and its approver stops");
    Api::<DPFHCPProvisioner>::namespaced(client.clone(), NS)
        .delete(NAME, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the approver stopped", WAIT, Some(&op), || async {
        (!admin_get(&op, "/metrics").contains(&format!(
            "causeway_operator_csr_pending{{namespace=\"{NS}\""
        )) && op.log_text().contains("CSR approver stopped"))
        .then_some(())
    })
    .await;
}

/// A serving renewal is held to the certificate the kubelet serves now,
/// read at the address the management side assigned to the DPU and
/// verified against the hosted cluster's kubelet serving CA, not only to
/// what the approver recorded. dpu-l's first serving certificate was
/// approved by an administrator (the approver kept no record of it), for
/// its name alone; a renewal that adds an address is denied because the
/// live certificate lacks it, where without the live read it was approved.
///
/// The kubelet stand-in is `openssl s_server` serving the certificate the
/// controller-manager's signer issued, on a loopback address that the DPU's
/// reservation and Node name as its InternalIP (the address the approver
/// dials); the address the renewal adds is its ExternalIP, which is
/// assigned to it too and never dialled.
async fn live_certificate_scenario(
    c: &SharedCluster,
    h: &SharedCluster,
    (client, hosted): (&Client, &Client),
    op: &Operator,
    attacks: &mut Vec<String>,
) {
    println!("scenario: a serving renewal is held to the certificate the kubelet serves, read at the DPU's assigned address");
    const KUBELET_IP: &str = "127.0.7.23";
    const EXTERNAL_IP: &str = "10.0.0.15";
    let kubelet_port = support::reserved_port();
    reserving_infra(
        client,
        "dpu-l-vlan",
        json!([
            {"mac": "02:00:00:00:00:15", "ip": EXTERNAL_IP, "hostname": "dpu-l"},
            {"mac": "02:00:00:00:00:16", "ip": KUBELET_IP, "hostname": "dpu-l"},
        ]),
    )
    .await;
    // Not yet in a serving phase: the approver leaves its first serving
    // CSR alone, and the administrator approves it.
    dpu(client, "dpu-l", "Initializing").await;
    node_at(
        hosted,
        "dpu-l",
        &[
            ("InternalIP", KUBELET_IP),
            ("ExternalIP", EXTERNAL_IP),
            ("Hostname", "dpu-l"),
        ],
        Some(kubelet_port),
    )
    .await;
    let node_l = impersonating(h, "system:node:dpu-l", &["system:nodes"]).await;
    let first = "dpu-l-serving-by-admin";
    let (first_request, first_key) = pem_and_key(&Request {
        sans: vec![dns("dpu-l")],
        ..legacy("system:node:dpu-l")
    });
    create_raw_csr(&node_l, first, SERVING, first_request, true).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(hosted.clone());
    csrs.patch_approval(
        first,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "AdminApproved",
            "message": "approved by the cluster administrator",
        }]}})),
    )
    .await
    .unwrap();
    wait_signed(hosted, op, first).await;
    let certificate = csrs
        .get(first)
        .await
        .unwrap()
        .status
        .and_then(|s| s.certificate)
        .unwrap()
        .0;

    // The kubelet: a TLS server showing what the signer issued.
    let dir = c.dir.join("kubelet-dpu-l");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kubelet.crt"), &certificate).unwrap();
    std::fs::write(dir.join("kubelet.key"), &first_key).unwrap();
    let accept = format!("{KUBELET_IP}:{kubelet_port}");
    let _kubelet = support::Proc::spawn(
        "kubelet-dpu-l",
        &dir,
        std::process::Command::new(support::tool("openssl", "openssl"))
            .args(["s_server", "-www", "-accept", &accept, "-cert"])
            .arg(dir.join("kubelet.crt"))
            .arg("-key")
            .arg(dir.join("kubelet.key")),
    );
    support::poll_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(&accept).ok()
    })
    .expect("the kubelet stand-in listens");

    // The hosted cluster's kubelet serving CA, as HyperShift publishes it:
    // the signer's CA.
    ensure_namespace(hosted, "openshift-config-managed").await;
    apply_yaml(
        hosted,
        &serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubelet-serving-ca", "namespace": "openshift-config-managed"},
            "data": {"ca-bundle.crt": std::fs::read_to_string(&h.ca).unwrap()},
        }))
        .unwrap(),
        "openshift-config-managed",
    )
    .await
    .unwrap();
    dpu(client, "dpu-l", "Ready").await;

    let msg = denied(
        hosted,
        op,
        attacks,
        &node_l,
        "dpu-l-renewal-adds-address",
        SERVING,
        &Request {
            sans: vec![dns("dpu-l"), ip(EXTERNAL_IP)],
            ..legacy("system:node:dpu-l")
        },
        "RenewalAddsSANs",
    )
    .await;
    assert!(
        msg.contains("not among the kubelet's live serving certificate"),
        "{msg}"
    );
    // A renewal with what the kubelet serves is approved and signed.
    let renewal = create_csr(
        &node_l,
        "dpu-l-renewal",
        SERVING,
        &Request {
            sans: vec![dns("dpu-l")],
            ..legacy("system:node:dpu-l")
        },
    )
    .await;
    wait_verdict(hosted, op, &renewal, "Approved", "AutoApproved").await;
    wait_signed(hosted, op, &renewal).await;
    let verified = metric(
        &admin_get(op, "/metrics"),
        "causeway_operator_csr_live_certificates_total{result=\"verified\"}",
    );
    assert!(verified >= 2.0, "live certificates verified: {verified}");
    // Nothing more is dialled once the CA is gone.
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        hosted.clone(),
        "openshift-config-managed",
    )
    .delete("kubelet-serving-ca", &DeleteParams::default())
    .await
    .unwrap();
}
