//! A real Kubernetes control plane for the operator suites: etcd,
//! kube-apiserver 1.20 and kube-controller-manager, started once per test
//! process by `tests/kube/cluster.sh` on loopback, with the chart's CRDs and
//! RBAC installed from `helm template`. The operator under test runs as the
//! real `causeway` binary with the chart's ServiceAccount token, never as
//! system:masters.
//!
//! The cluster outlives single tests (each test works in its own
//! namespace) and is stopped by the script's watchdog when the test process
//! exits, however it exits.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};

pub mod helm;
pub mod metallb;

/// The chart's release, as the tests install it.
pub const RELEASE_NAMESPACE: &str = "causeway-system";
pub const RELEASE: &str = "causeway";
/// The ServiceAccount the chart makes for the operator.
pub const OPERATOR_SA: &str = "causeway";
/// The field manager of everything the tests write as a user or as
/// kube's own controllers would.
pub const TEST_MANAGER: &str = "causeway-test";

pub struct SharedCluster {
    pub dir: PathBuf,
    pub server: String,
    /// The loopback address the API server (and its etcd) listen on: the
    /// cluster's own.
    pub address: std::net::Ipv4Addr,
    pub ca: PathBuf,
    pub admin_token: String,
    /// A kubeconfig with the operator ServiceAccount's token.
    pub operator_kubeconfig: PathBuf,
    pub helm: PathBuf,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .is_some_and(|euid| euid == "0")
}

/// helm: `CAUSEWAY_HELM`, else what `charts/test.sh --print-helm` fetches.
fn helm() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CAUSEWAY_HELM") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let out = Command::new("bash")
        .arg(repo_root().join("charts/test.sh"))
        .arg("--print-helm")
        .stderr(Stdio::inherit())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.is_file().then_some(path)
}

/// The clusters this process has started, by what they are for: each is
/// started by the first test that asks for it and lives until the process
/// exits.
static CLUSTERS: Mutex<BTreeMap<String, &'static OnceLock<Result<SharedCluster, String>>>> =
    Mutex::new(BTreeMap::new());

fn keyed(test: &str, key: String, kind: Kind) -> Option<&'static SharedCluster> {
    let cell = *CLUSTERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_insert_with(|| Box::leak(Box::new(OnceLock::new())));
    started(test, cell, kind)
}

/// The management cluster the suites of this process share, with the
/// chart installed: started on first use; `None` after a loud SKIP when
/// this machine cannot run one (not root, or no cached binaries). Each test
/// works in namespaces of its own.
pub fn cluster(test: &str) -> Option<&'static SharedCluster> {
    keyed(test, "management".into(), Kind::Management(String::new()))
}

/// A management cluster with the chart for `suite` alone: for a suite that
/// changes what every namespace sees (cluster-wide admission webhooks,
/// CRDs it deletes, a second release of the chart), which would change
/// the ground under the suites sharing [`cluster`].
pub fn own_cluster(suite: &str, test: &str) -> Option<&'static SharedCluster> {
    keyed(
        test,
        format!("own:{suite}"),
        Kind::Management(String::new()),
    )
}

/// A management cluster whose API server certificate also names `sans`
/// (openssl's `DNS:a,IP:b` form: a hosted cluster's `api` and `api-int`),
/// one per set of names.
pub fn cluster_with_sans(test: &str, sans: &str) -> Option<&'static SharedCluster> {
    keyed(
        test,
        format!("sans:{sans}"),
        Kind::Management(sans.to_string()),
    )
}

/// A cluster without the chart, for `suite` alone: a suite that installs
/// the chart with helm itself, or needs kinds absent. The admin kubeconfig
/// is `dir/kubeconfig`.
pub fn bare_cluster(suite: &str, test: &str) -> Option<&'static SharedCluster> {
    keyed(test, format!("bare:{suite}"), Kind::Bare)
}

/// A second API server (its own etcd, CA and admin token, no chart, a
/// controller-manager of its own): `suite`'s hosted cluster, on an
/// address of its own ([`SharedCluster::address`]) at port 6443, as a
/// hosted control plane's kube-apiserver Service, with `sans`
/// (`DNS:a,...`) in its certificate: the names a hosted cluster's API is
/// reached by. One per suite, so an outage one suite causes is nobody
/// else's.
pub fn hosted_cluster(suite: &str, test: &str, sans: &str) -> Option<&'static SharedCluster> {
    keyed(
        test,
        format!("hosted:{suite}"),
        Kind::Hosted(sans.to_string()),
    )
}

/// Stops the API server of `c` only (etcd and the rest keep running): an
/// outage of that cluster's API.
pub fn stop_apiserver(c: &SharedCluster) {
    let status = Command::new("bash")
        .arg(repo_root().join("tests/kube/cluster.sh"))
        .arg("stop-apiserver")
        .arg(&c.dir)
        .status()
        .unwrap();
    assert!(status.success(), "cluster.sh stop-apiserver: {status}");
}

/// Starts the API server of `c` again after [`stop_apiserver`], once
/// ready.
pub fn start_apiserver(c: &SharedCluster) {
    let status = Command::new("bash")
        .arg(repo_root().join("tests/kube/cluster.sh"))
        .arg("start-apiserver")
        .arg(&c.dir)
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    assert!(status.success(), "cluster.sh start-apiserver: {status}");
}

/// Which cluster a test process starts.
#[derive(Clone)]
enum Kind {
    /// With the chart's CRDs and RBAC, and these extra names in the
    /// serving certificate.
    Management(String),
    /// Nothing installed.
    Bare,
    /// Nothing installed, on port 6443, with these names.
    Hosted(String),
}

fn started(
    test: &str,
    cell: &'static OnceLock<Result<SharedCluster, String>>,
    kind: Kind,
) -> Option<&'static SharedCluster> {
    if !is_root() {
        skip(
            test,
            "needs root (tests/kube/cluster.sh build fills the binary cache as root)",
        );
        return None;
    }
    let script = repo_root().join("tests/kube/cluster.sh");
    let have = Command::new("bash")
        .arg(&script)
        .arg("check")
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        skip(
            test,
            "no kube-apiserver binaries: run `sudo tests/kube/cluster.sh build` (tests/run.sh does)",
        );
        return None;
    }
    let Some(helm) = helm() else {
        skip(
            test,
            "no helm to render the chart (charts/test.sh --print-helm found none: npm missing?)",
        );
        return None;
    };
    // Started on a thread of its own: the caller is inside a test's runtime,
    // and the chart is installed from a runtime of its own.
    let shared = cell.get_or_init(|| {
        std::thread::spawn(move || start(&script, helm, kind))
            .join()
            .unwrap_or_else(|_| Err("starting the cluster panicked".into()))
    });
    match shared {
        Ok(c) => Some(c),
        // A cluster that was there to start and did not is a failure.
        Err(e) => panic!("{test}: the test cluster did not start: {e}"),
    }
}

fn start(script: &Path, helm: PathBuf, kind: Kind) -> Result<SharedCluster, String> {
    let dir = tempfile::Builder::new()
        .prefix("causeway-kube-")
        .tempdir()
        .map_err(|e| e.to_string())?
        .keep();
    let mut cmd = Command::new("bash");
    cmd.arg(script)
        .arg("start")
        .arg(&dir)
        .arg(std::process::id().to_string());
    // Every cluster listens on a loopback address of its own, so its
    // ports are nobody else's (tests/kube/cluster.sh).
    let address = crate::support::unique_loopback();
    cmd.env("CAUSEWAY_KUBE_ADDRESS", address.to_string());
    match &kind {
        Kind::Hosted(sans) => cmd
            .env("CAUSEWAY_KUBE_SANS", sans)
            .env("CAUSEWAY_KUBE_PORT", "6443"),
        Kind::Management(sans) => cmd.env("CAUSEWAY_KUBE_SANS", sans),
        Kind::Bare => cmd.env("CAUSEWAY_KUBE_SANS", ""),
    };
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cluster.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("cluster.sh start exited {}", out.status));
    }
    let vars: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| {
        vars.get(k)
            .cloned()
            .ok_or_else(|| format!("cluster.sh printed no {k}"))
    };
    let cluster = SharedCluster {
        helm: helm.clone(),
        dir: dir.clone(),
        server: get("SERVER")?,
        address,
        ca: PathBuf::from(get("CA")?),
        admin_token: get("TOKEN")?,
        operator_kubeconfig: dir.join("operator.kubeconfig"),
    };
    if !matches!(kind, Kind::Management(_)) {
        return Ok(cluster);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let token = rt.block_on(install_chart(&cluster, &helm))?;
    write_kubeconfig(&cluster, &cluster.operator_kubeconfig, &token);
    Ok(cluster)
}

pub fn write_kubeconfig(c: &SharedCluster, path: &Path, token: &str) {
    let text = causeway_operator::k8s::manifest::token_kubeconfig(&c.server, &c.ca, token);
    std::fs::write(path, text).unwrap();
}

pub async fn client_with_token(c: &SharedCluster, token: &str) -> Client {
    causeway_operator::k8s::client::install_tls_provider();
    let path = c.dir.join(format!("kubeconfig-{}", next_id()));
    write_kubeconfig(c, &path, token);
    let kc = Kubeconfig::read_from(&path).unwrap();
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// A client with system:masters rights: the test playing the cluster's
/// admin, its scheduler and its kubelets.
pub async fn admin(c: &SharedCluster) -> Client {
    client_with_token(c, &c.admin_token).await
}

fn next_id() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Applies every document of `yaml` by server-side apply, as `kubectl apply
/// --server-side` would.
pub async fn apply_yaml(client: &Client, yaml: &str, default_ns: &str) -> Result<(), String> {
    causeway_operator::k8s::manifest::apply(client, yaml, default_ns, TEST_MANAGER)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `helm template` of the chart as release `release`, with the given extra
/// `--set`s.
pub fn helm_template(helm: &Path, release: &str, sets: &[&str]) -> String {
    let mut cmd = Command::new(helm);
    cmd.args(["template", release])
        .arg(repo_root().join("charts/causeway"))
        .args(["--namespace", RELEASE_NAMESPACE]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Installs the chart's objects as release `release` (all but the
/// operator's Deployment: the tests run the binary instead).
pub async fn install_release(
    client: &Client,
    helm: &Path,
    release: &str,
    sets: &[&str],
) -> Result<(), String> {
    let rendered = helm_template(helm, release, sets);
    // The webhook configuration names a Service that 1.20 cannot reach here
    // (no kube-proxy): the webhook test registers it by URL itself.
    let rendered = without_cel(&causeway_operator::k8s::manifest::without_kind(
        &causeway_operator::k8s::manifest::without_kind(&rendered, "Deployment"),
        "ValidatingWebhookConfiguration",
    ));
    apply_yaml(client, &rendered, RELEASE_NAMESPACE).await
}

/// The rendering without CEL rules, which the 1.20 test server refuses in
/// a server-side apply.
/// The DPF kinds the DPU boot template is made from, as fixture CRDs.
pub const DPF_TEMPLATE_CRDS: [&str; 3] = [
    include_str!("../../../../tests/kube/crds/dpudeployment.yaml"),
    include_str!("../../../../tests/kube/crds/dpuflavor.yaml"),
    include_str!("../../../../tests/kube/crds/dpfoperatorconfig.yaml"),
];
pub const DPF_TEMPLATE_CRD_NAMES: [&str; 3] = [
    "dpudeployments.svc.dpu.nvidia.com",
    "dpuflavors.provisioning.dpu.nvidia.com",
    "dpfoperatorconfigs.operator.dpu.nvidia.com",
];

/// A fixture CRD (tests/kube/crds) and the name it is established under.
pub type FixtureCrd = (&'static str, &'static str);
/// Multus's NetworkAttachmentDefinition.
pub const NAD_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/network-attachment-definition.yaml"),
    "network-attachment-definitions.k8s.cni.cncf.io",
);
/// The Prometheus Operator's PodMonitor.
pub const POD_MONITOR_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/podmonitor.yaml"),
    "podmonitors.monitoring.coreos.com",
);

/// A NetworkAttachmentDefinition `ns/name`, as an Infra names one (a
/// macvlan with static IPAM; no test runs its CNI config).
pub async fn network_attachment(client: &Client, ns: &str, name: &str) {
    let doc = format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  config: '{{\"cniVersion\":\"0.3.1\",\"type\":\"macvlan\",\"master\":\"eth1\",\"ipam\":{{\"type\":\"static\"}}}}'\n"
    );
    apply_yaml(client, &doc, ns).await.unwrap();
}
pub const HOSTED_CLUSTER_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/hostedcluster.yaml"),
    "hostedclusters.hypershift.openshift.io",
);
pub const NODE_POOL_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/nodepool.yaml"),
    "nodepools.hypershift.openshift.io",
);
pub const DPU_CLUSTER_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/dpucluster.yaml"),
    "dpuclusters.provisioning.dpu.nvidia.com",
);
/// MetalLB's IPAddressPool and L2Advertisement, in one file.
pub const METALLB_CRDS: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/metallb.yaml"),
    "ipaddresspools.metallb.io",
);

/// OLM's Subscription (operators.coreos.com/v1alpha1).
pub const OLM_SUBSCRIPTION_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/olm-subscription.yaml"),
    "subscriptions.operators.coreos.com",
);
/// MetalLB's operator's MetalLB resource.
pub const METALLB_OPERATOR_CRD: FixtureCrd = (
    include_str!("../../../../tests/kube/crds/metallb-operator.yaml"),
    "metallbs.metallb.io",
);

/// The shared cluster with the chart released for apps ingress (so the
/// operator may read HyperShift's admin kubeconfig Secrets) and
/// `namespaces` made; with the admin client. `None` after a loud SKIP.
pub async fn with_apps_ingress(
    test: &str,
    namespaces: &[&str],
) -> Option<(&'static SharedCluster, Client)> {
    // The suites that enable apps ingress in the chart share a cluster of
    // their own: the release they upgrade is no other suite's ground.
    let c = own_cluster("apps-ingress", test)?;
    let client = admin(c).await;
    install_release(&client, &c.helm, RELEASE, &["appsIngress.enabled=true"])
        .await
        .unwrap();
    for n in namespaces {
        ensure_namespace(&client, n).await;
    }
    Some((c, client))
}

/// A Node `name` whose kubelet reports it Ready.
pub async fn ready_node(client: &Client, name: &str) {
    apply_yaml(
        client,
        &format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"),
        "default",
    )
    .await
    .unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now,
                 "reason": "KubeletReady", "message": "ready"}]}})),
        )
        .await
        .unwrap();
}

/// HyperShift's admin kubeconfig Secret of HostedCluster `ns/hc`, holding
/// `kubeconfig`.
pub async fn admin_kubeconfig_secret(client: &Client, ns: &str, hc: &str, kubeconfig: String) {
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{hc}-admin-kubeconfig"), "namespace": ns},
        "data": {"kubeconfig": k8s_openapi::ByteString(kubeconfig.into_bytes())}});
    apply_yaml(client, &serde_json::to_string(&secret).unwrap(), ns)
        .await
        .unwrap();
}

/// Applies fixture CRDs (their CEL rules cut, for the 1.20 server) and
/// waits until each is established.
pub async fn install_fixture_crds(client: &Client, crds: &[FixtureCrd]) {
    for (yaml, _) in crds {
        apply_yaml(client, &without_cel(yaml), "default")
            .await
            .unwrap();
    }
    for (_, name) in crds {
        wait_established(client, name).await;
    }
}

/// The management cluster the DPF bridge expects: HyperShift's and DPF's
/// CRDs (MetalLB's too when `metallb`), the provisioners' and DPUClusters'
/// namespaces and the MetalLB one, and the StorageClass the sample names.
pub async fn dpf_management_cluster(client: &Client, namespaces: &[&str], metallb: bool) {
    let mut crds = vec![HOSTED_CLUSTER_CRD, NODE_POOL_CRD, DPU_CLUSTER_CRD];
    crds.extend(DPF_TEMPLATE_CRDS.into_iter().zip(DPF_TEMPLATE_CRD_NAMES));
    if metallb {
        crds.push(METALLB_CRDS);
    }
    install_fixture_crds(client, &crds).await;
    for ns in namespaces.iter().chain(&["openshift-operators"]) {
        ensure_namespace(client, ns).await;
    }
    apply_yaml(client, "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: ocs-storagecluster-ceph-rbd}\nprovisioner: openshift-storage.rbd.csi.ceph.com\n", "default").await.unwrap();
}

/// DPF's objects the boot template is made from, in `ns`: the
/// DPFOperatorConfig (high-speed MTU 9000), DPUDeployment `dpudeployment`
/// (BFB `bf-bundle`, flavor `hbn-ovn`) and DPUFlavor `hbn-ovn` (trusted,
/// with `ovs_script` and an `mlnx-bf.conf` override). Applied again, the
/// flavor takes the new script.
pub async fn dpf_template_objects(client: &Client, ns: &str, ovs_script: &str) {
    for doc in [
        serde_json::json!({"apiVersion": "operator.dpu.nvidia.com/v1alpha1", "kind": "DPFOperatorConfig",
            "metadata": {"name": "dpfoperatorconfig", "namespace": ns},
            "spec": {"networking": {"highSpeedMTU": 9000}}}),
        serde_json::json!({"apiVersion": "svc.dpu.nvidia.com/v1alpha1", "kind": "DPUDeployment",
            "metadata": {"name": "dpudeployment", "namespace": ns},
            "spec": {"dpus": {"bfb": "bf-bundle", "flavor": "hbn-ovn"}}}),
        serde_json::json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
            "metadata": {"name": "hbn-ovn", "namespace": ns},
            "spec": {"dpuMode": "dpu", "ovs": {"rawConfigScript": ovs_script},
                "configFiles": [{"path": "/etc/mellanox/mlnx-bf.conf", "operation": "override", "raw": "ALLOW_SHARED_RQ=\"no\"\n", "permissions": "0644"}]}}),
    ] {
        apply_yaml(client, &serde_json::to_string(&doc).unwrap(), ns)
            .await
            .unwrap();
    }
}

pub fn without_cel(yaml: &str) -> String {
    causeway_operator::k8s::manifest::without_cel(yaml).unwrap()
}

async fn install_chart(c: &SharedCluster, helm: &Path) -> Result<String, String> {
    let client = admin(c).await;
    ensure_namespace(&client, RELEASE_NAMESPACE).await;
    install_release(&client, helm, RELEASE, &[]).await?;
    wait_crds_established(&client).await?;
    // The operator's credentials: a token for the chart's ServiceAccount,
    // issued by the API server as the kubelet would get one.
    Ok(token_for(&client, RELEASE_NAMESPACE, OPERATOR_SA).await)
}

/// A token for a ServiceAccount, from the TokenRequest API.
pub async fn token_for(client: &Client, ns: &str, sa: &str) -> String {
    causeway_operator::k8s::manifest::service_account_token(
        client,
        ns,
        sa,
        "https://kubernetes.default.svc",
        Duration::from_secs(24 * 3600),
    )
    .await
    .unwrap_or_else(|e| panic!("token for ServiceAccount {ns}/{sa}: {e}"))
}

async fn wait_crds_established(client: &Client) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = crds
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|crd| {
                !crd.status.as_ref().is_some_and(|s| {
                    s.conditions.as_ref().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
                })
            })
            .map(|crd| crd.name_any())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("CRDs not established: {pending:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .unwrap();
    api.patch(
        name,
        &PatchParams::apply(TEST_MANAGER).force(),
        &Patch::Apply(&ns),
    )
    .await
    .unwrap();
}

/// A namespace of the test's own, unique in this cluster.
pub async fn test_namespace(client: &Client, test: &str) -> String {
    let short: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let name = format!("{}-{}", short.trim_matches('-'), next_id());
    ensure_namespace(client, &name).await;
    name
}

/// The real `causeway operator`, under the operator ServiceAccount, limited
/// to `namespaces`; killed when dropped.
pub struct Operator {
    pub child: Child,
    pub admin: std::net::SocketAddr,
    pub log: PathBuf,
}

impl Operator {
    pub fn start(
        c: &SharedCluster,
        namespaces: &[&str],
        extra_args: &[&str],
        identity: &str,
    ) -> Operator {
        Operator::start_with_kubeconfig(c, &c.operator_kubeconfig, namespaces, extra_args, identity)
    }

    pub fn start_with_kubeconfig(
        c: &SharedCluster,
        kubeconfig: &Path,
        namespaces: &[&str],
        extra_args: &[&str],
        identity: &str,
    ) -> Operator {
        Operator::start_with_env(c, kubeconfig, namespaces, extra_args, identity, &[])
    }

    /// As [`Operator::start_with_kubeconfig`], with more environment
    /// (`POD_NAMESPACE` to keep its Lease apart, say).
    pub fn start_with_env(
        c: &SharedCluster,
        kubeconfig: &Path,
        namespaces: &[&str],
        extra_args: &[&str],
        identity: &str,
        env: &[(&str, &str)],
    ) -> Operator {
        Operator::spawn(c, kubeconfig, namespaces, extra_args, identity, env, &[])
    }

    /// As [`Operator::start`], with `hosts` (address, name) resolving for
    /// the operator alone: its own mount namespace has an `/etc/hosts`
    /// with them added, as a pod's cluster DNS would answer a Service's
    /// name (`--hosted-apiserver=service`).
    pub fn start_resolving(
        c: &SharedCluster,
        namespaces: &[&str],
        extra_args: &[&str],
        identity: &str,
        hosts: &[(&str, &str)],
    ) -> Operator {
        Operator::spawn(
            c,
            &c.operator_kubeconfig,
            namespaces,
            extra_args,
            identity,
            &[],
            hosts,
        )
    }

    fn spawn(
        c: &SharedCluster,
        kubeconfig: &Path,
        namespaces: &[&str],
        extra_args: &[&str],
        identity: &str,
        env: &[(&str, &str)],
        hosts: &[(&str, &str)],
    ) -> Operator {
        let port = crate::support::reserved_port();
        let admin: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = c.dir.join(format!("operator-{identity}-{}.log", next_id()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = if hosts.is_empty() {
            Command::new(env!("CARGO_BIN_EXE_causeway"))
        } else {
            let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
            for (address, name) in hosts {
                text.push_str(&format!("{address} {name}\n"));
            }
            let file = c.dir.join(format!("hosts-{identity}-{}", next_id()));
            std::fs::write(&file, text).unwrap();
            // A private mount namespace, so the host's /etc/hosts is never
            // touched; exec keeps one process (and one PID) throughout.
            let mut wrapped = Command::new("unshare");
            wrapped
                .args(["--mount", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#)
                .arg("sh")
                .arg(&file)
                .arg(env!("CARGO_BIN_EXE_causeway"));
            wrapped
        };
        cmd.arg("operator")
            .arg("--admin-listen")
            .arg(admin.to_string())
            .args(extra_args)
            .env("KUBECONFIG", kubeconfig)
            .env("CAUSEWAY_IMAGE", "registry.test/causeway:test")
            .env("POD_NAMESPACE", RELEASE_NAMESPACE)
            .env("POD_NAME", identity)
            .env("CAUSEWAY_LOG_LEVEL", "info,causeway_operator=debug")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .stdin(Stdio::null())
            .envs(env.iter().copied());
        if !namespaces.is_empty() {
            cmd.arg("--namespaces").arg(namespaces.join(","));
        }
        let child = cmd.spawn().unwrap();
        Operator { child, admin, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as the kubelet does when it stops a pod.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {}", self.child.id());
    }

    /// Waits up to `limit` for the process to exit: its status, or `None`
    /// when it is still running.
    pub async fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` until it yields, failing the test with `what` and the
/// operator's log when `timeout` passes.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    op: Option<&Operator>,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if Instant::now() > deadline {
            let log = op.map(|o| o.log_text()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "timed out after {timeout:?} waiting for: {what}\noperator log (newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the CRD named `crd` is established.
pub async fn wait_established(client: &Client, crd: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("CRD {crd} established"),
        Duration::from_secs(60),
        None,
        || async {
            let c = api.get(crd).await.ok()?;
            c.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// The BlueField image table the DPF bridge reads (the chart's
/// `dpf.blueFieldImages`), for the releases the tests use; and the settings'
/// repository pointed at a closed loopback port, so a release missing from
/// the table never sends a lookup off the machine.
pub async fn blue_field_images(client: &Client, images: &[(&str, &str)]) {
    let data: serde_json::Map<String, serde_json::Value> = images
        .iter()
        .map(|(v, i)| (v.to_string(), serde_json::Value::from(*i)))
        .collect();
    let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "ocp-bluefield-images", "namespace": RELEASE_NAMESPACE}, "data": data});
    apply_yaml(
        client,
        &serde_json::to_string(&body).unwrap(),
        RELEASE_NAMESPACE,
    )
    .await
    .unwrap();
    let configs: Api<causeway_operator::dpf::crd::DPFHCPProvisionerConfig> =
        Api::all(client.clone());
    configs
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"blueFieldOCPLayerRepo": "127.0.0.1:1/closed/rhcos-bfb"}})),
        )
        .await
        .unwrap();
}

/// HyperShift's ignition server, as a node sees it: HTTPS with a CA of its
/// own, `GET /ignition` answered only with `Authorization: Bearer
/// base64(token)`, and an ignition whose MachineConfig is a `data:` URL.
pub struct IgnitionServer {
    pub port: u16,
    pub ca_pem: String,
    pub token: Vec<u8>,
    /// Requests that carried the right bearer, and those that did not.
    pub served: std::sync::Arc<AtomicUsize>,
    pub refused: std::sync::Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for IgnitionServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ignition the server serves: HyperShift's shape, release OS image.
pub fn hypershift_ignition(os_image: &str) -> String {
    let mc = serde_json::json!({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"name": "rendered-worker-0"},
        "spec": {"osImageURL": os_image, "config": {"ignition": {"version": "3.2.0"}}},
    });
    let encoded: String = serde_json::to_string(&mc)
        .unwrap()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    serde_json::json!({
        "ignition": {"version": "3.2.0"},
        "storage": {"files": [{"path": "/etc/ignition-machine-config-encapsulated.json",
            "contents": {"source": format!("data:,{encoded}")}, "mode": 420}]},
    })
    .to_string()
}

pub async fn ignition_server(dir: &Path, release_os_image: &str) -> IgnitionServer {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "ignition-server-ca");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    leaf.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let certs = dir.join(format!("ignition-{}", next_id()));
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(certs.join("tls.key"), key.serialize_pem()).unwrap();
    let tls =
        std::sync::Arc::new(causeway_operator::webhook::tls::ReloadingCert::new(&certs).unwrap())
            .server_config();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let token = format!("ignition-token-{}", next_id()).into_bytes();
    let want = format!(
        "bearer {}",
        base64::engine::general_purpose::STANDARD.encode(&token)
    );
    let body = hypershift_ignition(release_os_image);
    let served = std::sync::Arc::new(AtomicUsize::new(0));
    let refused = std::sync::Arc::new(AtomicUsize::new(0));
    let (s, r) = (served.clone(), refused.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, want, body, s, r) = (
                acceptor.clone(),
                want.clone(),
                body.clone(),
                s.clone(),
                r.clone(),
            );
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 65536 {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request).to_lowercase();
                let authorized = text.starts_with("get /ignition ")
                    && text
                        .lines()
                        .any(|l| l.trim() == format!("authorization: {want}").to_lowercase());
                let reply = if authorized {
                    s.fetch_add(1, Ordering::SeqCst);
                    format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                } else {
                    r.fetch_add(1, Ordering::SeqCst);
                    "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                };
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    IgnitionServer {
        port,
        ca_pem: ca_cert.pem(),
        token,
        served,
        refused,
        task,
    }
}

/// GET `path` from the operator's admin server (HTTP/1.0, whole answer).
pub fn admin_get(op: &Operator, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(op.admin).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The sum of the samples of every series starting with `prefix`.
pub fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A TCP relay in front of the API server that can be cut: once cut, it
/// forwards nothing more, and every connection, old or new, is held open
/// unanswered, as an API server behind a partition or a stopped control
/// plane looks to a client. Dropped with the test's runtime.
pub struct ApiRelay {
    /// `https://127.0.0.1:<port>`: the server to write into a kubeconfig.
    pub server: String,
    cut: tokio::sync::watch::Sender<bool>,
}

impl ApiRelay {
    pub async fn start(c: &SharedCluster) -> ApiRelay {
        let upstream = c
            .server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, cut_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    if !*cut_rx.borrow() {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                                _ = cut_rx.wait_for(|cut| *cut) => {}
                            }
                        }
                    }
                    // Cut: the client's socket stays open and unanswered
                    // until the test ends.
                    std::future::pending::<()>().await;
                    drop(client);
                });
            }
        });
        ApiRelay {
            server: format!("https://127.0.0.1:{port}"),
            cut,
        }
    }

    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

/// The CRD exactly as `causeway operator crd <kind>` prints it.
pub fn printed_crd(kind: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_causeway"))
        .args(["operator", "crd", kind])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}
