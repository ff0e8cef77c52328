//! The whole mission in one test: a DPU-like worker on an isolated VLAN
//! boots, joins and talks to its hosted cluster's real API server through
//! data-plane pods the operator rendered, run as a kubelet would run them.
//!
//! ```text
//!  host namespace: etcd, kube-apiserver, kube-controller-manager on
//!  127.0.0.1 (tests/kube/cluster.sh), the operator, this test
//!        ▲ Service forwards (the test, as kube-proxy)
//!  podnet ── br0 10.128.0.1/24: the pod network; Service addresses
//!        │   10.96.0.1:443 (kubernetes), 10.96.0.20:6443
//!        │   (kube-apiserver.clusters-e2e.svc), 10.96.0.21:443 (ignition
//!        │   stand-in); upstream resolvers 10.128.0.53 and .54 (dnsmasq)
//!        ├── eth0 of each pod (10.128.0.11, .12, ...)
//!  pod namespaces: the operator's pods, eth0 + net1, run by the test's
//!        │   kubelet from their Pod objects
//!        ├── net1 of each pod (the Multus annotation's address)
//!  vlan ──── br0: the isolated VLAN (192.168.60.0/24)
//!        └── eth0 of the worker: dhclient, dig, curl, openssl
//! ```
//!
//! Nothing of the data plane's config is written by the test: every pod
//! runs what its Pod object says (the image's entrypoint, the container's
//! arguments and environment, its ConfigMap, Secret, claim and token
//! volumes at their mount paths, a read-only root, only the capabilities
//! the spec adds), and a changed ConfigMap reaches the running pod's files
//! as the kubelet's sync would bring it. The hosted cluster is a second API
//! server of its own (its certificate names `api` and `api-int` of the
//! zone, and its controller-manager signs with its own CA); HyperShift and
//! DPF are played by the test, as in csr_kube.rs.
//!
//! Needs root and the suite's cached control plane; without them it prints
//! SKIP. tests/lab/README.md runs it as a demo.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;
use crate::support;

use std::collections::BTreeMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use causeway_operator::infra::crd::Infra;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_cluster::{admin, apply_yaml, ensure_namespace, eventually, token_for, Operator};
use serde_json::{json, Value};
use support::{causeway_bin, poll_until, tool, Forward, Netns, Proc};

const TEST: &str =
    "a_worker_on_the_vlan_boots_joins_and_uses_its_cluster_through_the_rendered_pods";
const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
const DPU_CRD: &str = include_str!("../../../tests/kube/crds/dpu.yaml");
const CONTAINERFILE: &str = include_str!("../../../images/Containerfile");
const WAIT: Duration = Duration::from_secs(90);

/// The Infra and its pods.
const INFRA_NS: &str = "mission";
const INFRA: &str = "mission";
/// The hosted cluster: `api.e2e.example.test`.
const ZONE: &str = "e2e.example.test";
const CP_NS: &str = "clusters-e2e";
/// The DPF side: the provisioner, its DPUs, and the node bootstrapper.
const PROVISIONER_NS: &str = "mission-dpf";
const PROVISIONER: &str = "mission-dpus";
const DPU_NS: &str = "mission-fleet";
const MCO_NS: &str = "openshift-machine-config-operator";
/// The worker: a DPU whose kubelet joins as `system:node:<WORKER>`.
const WORKER: &str = "dpu-mission-0";
const WORKER_MAC: &str = "02:00:00:60:00:01";

const VLAN_CIDR: &str = "192.168.60.0/24";
const DHCP_IP: &str = "192.168.60.2";
const DNS_IP: &str = "192.168.60.3";
const PROXY_IP: &str = "192.168.60.10";
/// The VLAN is dual-stack: each pod has a v6 address beside its v4 one.
const VLAN_CIDR_V6: &str = "fd42:60::/64";
const DNS_IP_V6: &str = "fd42:60::3";
const PROXY_IP_V6: &str = "fd42:60::10";
const POD_GATEWAY: &str = "10.128.0.1";
const KUBERNETES_VIP: &str = "10.96.0.1";
const API_VIP: &str = "10.96.0.20";
const IGNITION_VIP: &str = "10.96.0.21";
const UPSTREAM_A: &str = "10.128.0.53";
const UPSTREAM_B: &str = "10.128.0.54";
/// What each upstream resolver answers for every name under example.net.
const ANSWER_A: &str = "198.51.100.1";
const ANSWER_B: &str = "198.51.100.2";
const BOOTSTRAP_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const ADMIN_PORT: u16 = 9090;

/// The hosted API server's names: the zone's `api` and `api-int`, and its
/// Service in the control-plane namespace.
fn hosted_sans() -> String {
    format!(
        "DNS:api.{ZONE},DNS:api-int.{ZONE},DNS:kube-apiserver.{CP_NS}.svc,DNS:{},IP:{API_VIP}",
        hosted_service_name()
    )
}

/// The name the operator reaches the hosted API server by, as the chart's
/// default `--hosted-apiserver=service` has it: the control plane's
/// kube-apiserver Service of the provisioner's HostedCluster.
fn hosted_service_name() -> String {
    format!("kube-apiserver.{PROVISIONER_NS}-{PROVISIONER}.svc.cluster.local")
}

/// The management API server's: the `kubernetes` Service the pods reach
/// it by.
fn management_sans() -> String {
    format!("IP:{KUBERNETES_VIP}")
}

/// Fails the test naming the step, with what the command printed.
fn step_failed(step: &str, detail: impl std::fmt::Display) -> ! {
    panic!("step `{step}` failed: {detail}")
}

// ------------------------------------------------------------------ kubelet

/// What the test needs to know of a running pod.
#[derive(Debug, Clone)]
struct PodView {
    uid: String,
    component: String,
    /// The pod's network namespace.
    ns: String,
    ip: Ipv4Addr,
    /// The container's process while it runs.
    pid: Option<u32>,
    /// Container starts: 1 until it was restarted.
    starts: u32,
    ready: bool,
}

/// One pod the stand-in kubelet runs.
struct Running {
    name: String,
    uid: String,
    component: String,
    net: Netns,
    dir: PathBuf,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    caps: String,
    config_maps: Vec<(String, PathBuf)>,
    proc: Option<Proc>,
    /// Whether `proc` had not exited at the last look.
    alive: bool,
    starts: u32,
    ready: bool,
    reported: Option<(bool, u32)>,
    ip: Ipv4Addr,
    node: String,
    /// A StatefulSet pod's name under its governing Service, which the
    /// cluster's DNS would resolve: `<hostname>.<subdomain>.<ns>.svc`.
    peer_name: Option<String>,
}

const NODES: [&str; 2] = ["mgmt-0", "mgmt-1"];

/// The kubelet's part, for the Infra's namespace: binds the pods the
/// controllers made to a node, wires their network namespaces as Multus
/// would, runs their container, restarts it when it exits, probes its
/// readiness, reports status, keeps ConfigMap volumes current and stops
/// pods that are deleted. Runs on a thread of its own.
struct Kubelet {
    views: Arc<Mutex<BTreeMap<String, PodView>>>,
    /// Pods whose container is not restarted when it exits (a node that
    /// went away with it), until released.
    held: Arc<Mutex<std::collections::BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The container runtime's part, run in the pod's network namespace as
/// `sh <this> <pod dir> <bounding set> <program> <args...>`: the volumes
/// at their mount paths (a missing mount point is made in an overlay of
/// its nearest existing parent, inside the pod's own mount namespace),
/// the kubelet's hosts and resolv.conf, a read-only root, then the program
/// with only the granted capabilities.
const RUNTIME_SH: &str = r#"set -eu
pod=$1; caps=$2; shift 2
ensure() {
  [ -d "$1" ] && return 0
  a=$1
  while [ ! -d "$a" ]; do a=$(dirname "$a"); done
  o="$pod/overlay$(printf %s "$a" | tr / _)"
  mkdir -p "$o/up" "$o/work"
  mount -t overlay overlay -o "lowerdir=$a,upperdir=$o/up,workdir=$o/work" "$a"
  mkdir -p "$1"
}
while read -r src dst mode; do
  ensure "$dst"
  mount --bind "$src" "$dst"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$dst"; fi
done < "$pod/mounts"
mount --bind "$pod/hosts" /etc/hosts
mount --bind "$pod/resolv.conf" /etc/resolv.conf
mount -o remount,bind,ro /
exec setpriv --no-new-privs --inh-caps=-all --bounding-set="$caps" -- "$@"
"#;

impl Kubelet {
    fn start(
        c: &'static kube_cluster::SharedCluster,
        podnet: Arc<Netns>,
        vlan: Arc<Netns>,
        dir: PathBuf,
    ) -> Kubelet {
        let views: Arc<Mutex<BTreeMap<String, PodView>>> = Arc::default();
        let held: Arc<Mutex<std::collections::BTreeSet<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (views, stop, held) = (views.clone(), stop.clone(), held.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let client = admin(c).await;
                    let mut state = KubeletState {
                        client,
                        cluster: c,
                        podnet,
                        vlan,
                        dir,
                        pods: BTreeMap::new(),
                        next: 11,
                        heartbeat: None,
                        held,
                    };
                    while !stop.load(Ordering::Relaxed) {
                        state.sync().await;
                        *views.lock().unwrap() = state.views();
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    // Pods stop with the kubelet: processes, then namespaces.
                    state.pods.clear();
                });
            })
        };
        Kubelet {
            views,
            held,
            stop,
            thread: Some(thread),
        }
    }

    fn hold(&self, pod: &str) {
        self.held.lock().unwrap().insert(pod.to_string());
    }

    fn release(&self, pod: &str) {
        self.held.lock().unwrap().remove(pod);
    }

    /// Every pod of `component`, by name.
    fn pods_of(&self, component: &str) -> BTreeMap<String, PodView> {
        self.pods()
            .into_iter()
            .filter(|(_, v)| v.component == component)
            .collect()
    }

    fn pods(&self) -> BTreeMap<String, PodView> {
        self.views.lock().unwrap().clone()
    }

    /// The one running pod of `component`, once it is ready.
    fn ready_pod(&self, component: &str) -> Option<(String, PodView)> {
        let pods: Vec<(String, PodView)> = self
            .pods()
            .into_iter()
            .filter(|(_, v)| v.component == component)
            .collect();
        match pods.as_slice() {
            [(name, v)] if v.ready => Some((name.clone(), v.clone())),
            _ => None,
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct KubeletState {
    client: Client,
    cluster: &'static kube_cluster::SharedCluster,
    podnet: Arc<Netns>,
    vlan: Arc<Netns>,
    dir: PathBuf,
    pods: BTreeMap<String, Running>,
    next: u8,
    heartbeat: Option<Instant>,
    held: Arc<Mutex<std::collections::BTreeSet<String>>>,
}

impl KubeletState {
    fn views(&self) -> BTreeMap<String, PodView> {
        self.pods
            .iter()
            .map(|(name, r)| {
                (
                    name.clone(),
                    PodView {
                        uid: r.uid.clone(),
                        component: r.component.clone(),
                        ns: r.net.name().to_string(),
                        ip: r.ip,
                        pid: r.proc.as_ref().filter(|_| r.alive).map(Proc::pid),
                        starts: r.starts,
                        ready: r.ready,
                    },
                )
            })
            .collect()
    }

    /// The Nodes the pods are bound to, Ready, their heartbeat renewed as
    /// a kubelet's is (else the node controller would taint them and
    /// evict the pods).
    async fn heartbeat(&mut self) {
        if self
            .heartbeat
            .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
        {
            return;
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pp = PatchParams::apply("causeway-test-kubelet").force();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        for node in NODES {
            let _ = nodes
                .patch(
                    node,
                    &pp,
                    &Patch::Apply(
                        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
                    ),
                )
                .await;
            let _ = nodes
                .patch_status(
                    node,
                    &pp,
                    &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": {
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]}})),
                )
                .await;
        }
        self.heartbeat = Some(Instant::now());
    }

    async fn sync(&mut self) {
        self.heartbeat().await;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), INFRA_NS);
        let Ok(list) = api
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={INFRA}")))
            .await
        else {
            return;
        };
        let listed: BTreeMap<String, Pod> =
            list.items.into_iter().map(|p| (p.name_any(), p)).collect();
        // Gone from the API, or deleted: stopped, and their namespace with them.
        let gone: Vec<String> = self
            .pods
            .iter()
            .filter(|(name, r)| {
                listed.get(*name).is_none_or(|p| {
                    p.metadata.deletion_timestamp.is_some()
                        || p.metadata.uid.as_deref() != Some(r.uid.as_str())
                })
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(mut r) = self.pods.remove(&name) {
                if let Some(p) = r.proc.as_mut() {
                    p.signal("TERM");
                    let _ = poll_until(Duration::from_secs(10), || p.try_status());
                }
            }
            let _ = api
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
        }
        for (name, pod) in &listed {
            if pod.metadata.deletion_timestamp.is_some() {
                let _ = api
                    .delete(name, &DeleteParams::default().grace_period(0))
                    .await;
                continue;
            }
            if !self.pods.contains_key(name) {
                match self.admit(pod).await {
                    Ok(r) => {
                        self.pods.insert(name.clone(), r);
                    }
                    Err(e) => eprintln!("kubelet: pod {name} not started yet: {e}"),
                }
            }
        }
        self.write_hosts();
        let names: Vec<String> = self.pods.keys().cloned().collect();
        for name in names {
            self.keep_running(&name).await;
        }
    }

    /// Each pod's /etc/hosts: the Services it dials, and every StatefulSet
    /// pod under its governing Service (the cluster DNS's part). Written in
    /// place: the pod holds a bind mount of the file itself.
    fn write_hosts(&self) {
        let mut text = format!(
            "127.0.0.1 localhost\n{API_VIP} kube-apiserver.{CP_NS}.svc kube-apiserver.{CP_NS}.svc.cluster.local\n{IGNITION_VIP} ignition-server-proxy.{CP_NS}.svc ignition-server-proxy.{CP_NS}.svc.cluster.local\n"
        );
        for r in self.pods.values() {
            if let Some(peer) = &r.peer_name {
                text.push_str(&format!("{} {peer} {peer}.cluster.local\n", r.ip));
            }
        }
        for r in self.pods.values() {
            let path = r.dir.join("hosts");
            if fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                fs::write(&path, &text).unwrap();
            }
        }
    }

    /// Binds, wires and prepares one pod; its container starts in
    /// `keep_running`.
    async fn admit(&mut self, pod: &Pod) -> Result<Running, String> {
        let name = pod.name_any();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let labels = pod.labels();
        let component = labels
            .get("app.kubernetes.io/component")
            .cloned()
            .unwrap_or_default();
        let spec = pod.spec.clone().ok_or("no spec")?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), INFRA_NS);
        // Scheduling: a node that runs no other pod of this component
        // (the replicas' required anti-affinity).
        let node = match &spec.node_name {
            Some(n) => n.clone(),
            None => {
                let taken: Vec<&str> = self
                    .pods
                    .values()
                    .filter(|r| r.component == component)
                    .map(|r| r.node.as_str())
                    .collect();
                let node = NODES
                    .iter()
                    .find(|n| !taken.contains(n))
                    .ok_or("no node free of this component")?
                    .to_string();
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": INFRA_NS},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                api.create_subresource::<_, Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &binding,
                )
                .await
                .map_err(|e| format!("binding: {e}"))?;
                node
            }
        };
        let container = spec.containers.first().ok_or("no container")?.clone();
        // The image's entrypoint (checked by the test) is the causeway
        // binary; the container gives only arguments.
        if container.command.is_some() {
            return Err(format!(
                "the container names a command ({:?}); the stand-in runs the image's entrypoint",
                container.command
            ));
        }
        let program = causeway_bin();
        let args = container.args.clone().unwrap_or_default();

        let dir = self.dir.join(format!("pod-{name}"));
        fs::create_dir_all(&dir).unwrap();
        let mut mounts: Vec<(String, String, bool)> = Vec::new();
        let mut config_maps = Vec::new();
        let volumes = spec.volumes.clone().unwrap_or_default();
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), INFRA_NS);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), INFRA_NS);
        for m in container.volume_mounts.clone().unwrap_or_default() {
            let v = volumes
                .iter()
                .find(|v| v.name == m.name)
                .ok_or(format!("no volume {}", m.name))?;
            let src = if let Some(cm) = &v.config_map {
                let d = dir.join(format!("vol-{}", v.name));
                fs::create_dir_all(&d).unwrap();
                let data = cms
                    .get(&cm.name)
                    .await
                    .map_err(|e| format!("ConfigMap {}: {e}", cm.name))?
                    .data
                    .unwrap_or_default();
                write_volume(&d, &data);
                config_maps.push((cm.name.clone(), d.clone()));
                d
            } else if let Some(s) = &v.secret {
                let d = dir.join(format!("vol-{}", v.name));
                fs::create_dir_all(&d).unwrap();
                let secret_name = s.secret_name.clone().unwrap_or_default();
                let data = secrets
                    .get(&secret_name)
                    .await
                    .map_err(|e| format!("Secret {secret_name}: {e}"))?
                    .data
                    .unwrap_or_default();
                for (k, val) in data {
                    let f = d.join(&k);
                    fs::write(&f, &val.0).unwrap();
                    let mode = s.default_mode.unwrap_or(0o644) as u32;
                    fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
                }
                d
            } else if let Some(claim) = &v.persistent_volume_claim {
                // A claim outlives the pod: kept in the lab's directory.
                let d = self.dir.join(format!("claim-{}", claim.claim_name));
                fs::create_dir_all(&d).unwrap();
                d
            } else if v.empty_dir.is_some() {
                let d = dir.join(format!("vol-{}", v.name));
                fs::create_dir_all(&d).unwrap();
                d
            } else {
                return Err(format!("volume {} of an unknown kind", v.name));
            };
            mounts.push((
                src.display().to_string(),
                m.mount_path.clone(),
                m.read_only == Some(true),
            ));
        }
        if spec.automount_service_account_token == Some(true) {
            let sa = spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into());
            let d = dir.join("serviceaccount");
            fs::create_dir_all(&d).unwrap();
            fs::write(
                d.join("token"),
                token_for(&self.client, INFRA_NS, &sa).await,
            )
            .unwrap();
            fs::copy(&self.cluster.ca, d.join("ca.crt")).unwrap();
            fs::write(d.join("namespace"), INFRA_NS).unwrap();
            mounts.push((
                d.display().to_string(),
                "/var/run/secrets/kubernetes.io/serviceaccount".into(),
                true,
            ));
        }
        // Parents before children; a child's mount point is made inside
        // the parent's source, as the kubelet makes it.
        mounts.sort_by_key(|(_, dst, _)| dst.len());
        for (i, (_, dst, _)) in mounts.iter().enumerate() {
            if let Some((src, parent, _)) = mounts[..i]
                .iter()
                .rev()
                .find(|(_, p, _)| dst.starts_with(&format!("{p}/")))
            {
                fs::create_dir_all(Path::new(src).join(&dst[parent.len() + 1..])).unwrap();
            }
        }
        let lines: Vec<String> = mounts
            .iter()
            .map(|(s, d, ro)| format!("{s} {d} {}\n", if *ro { "ro" } else { "rw" }))
            .collect();
        fs::write(dir.join("mounts"), lines.concat()).unwrap();
        // Filled by write_hosts before the container starts.
        fs::write(dir.join("hosts"), "").unwrap();
        fs::write(
            dir.join("resolv.conf"),
            format!("search {INFRA_NS}.svc.cluster.local svc.cluster.local cluster.local\nnameserver {UPSTREAM_A}\noptions ndots:5\n"),
        )
        .unwrap();
        fs::write(dir.join("runtime.sh"), RUNTIME_SH).unwrap();

        let sc = container.security_context.clone().unwrap_or_default();
        if sc.read_only_root_filesystem != Some(true) {
            return Err("the container's root file system is not read-only".into());
        }
        let added = sc
            .capabilities
            .and_then(|c| c.add)
            .unwrap_or_default()
            .iter()
            .map(|c| format!("+{}", c.to_ascii_lowercase()))
            .collect::<Vec<_>>();
        let caps = format!("-all,{}", added.join(","));

        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOSTNAME".into(), name.clone()),
            ("KUBERNETES_SERVICE_HOST".into(), KUBERNETES_VIP.into()),
            ("KUBERNETES_SERVICE_PORT".into(), "443".into()),
        ];
        for e in container.env.clone().unwrap_or_default() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.name") => name.clone(),
                        Some("metadata.namespace") => INFRA_NS.into(),
                        other => return Err(format!("env {} from {other:?}", e.name)),
                    }
                }
                (None, None) => String::new(),
            };
            env.push((e.name.clone(), value));
        }

        // The network: eth0 on the pod network, net1 on the VLAN at the
        // address the Multus annotation names.
        let n = self.next;
        self.next += 1;
        let ip = Ipv4Addr::new(10, 128, 0, n);
        let net = Netns::new(&format!("pod{n}"));
        // The VLAN's v6 addresses are usable at once, as a CNI that has
        // checked them for duplicates leaves them.
        support::run(net.command("sysctl").args([
            "-q",
            "-w",
            "net.ipv6.conf.default.accept_dad=0",
        ]));
        net.veth_to("eth0", None, &self.podnet, &format!("p{n}"), None);
        self.podnet
            .ip(&["link", "set", &format!("p{n}"), "master", "br0"]);
        net.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        net.ip(&["route", "add", "default", "via", POD_GATEWAY]);
        let networks: Value = pod
            .annotations()
            .get("k8s.v1.cni.cncf.io/networks")
            .and_then(|a| serde_json::from_str(a).ok())
            .ok_or("no Multus annotation")?;
        let attachment = &networks[0];
        let inside = attachment["interface"]
            .as_str()
            .unwrap_or("net1")
            .to_string();
        net.veth_to(&inside, None, &self.vlan, &format!("v{n}"), None);
        self.vlan
            .ip(&["link", "set", &format!("v{n}"), "master", "br0"]);
        for a in attachment["ips"].as_array().into_iter().flatten() {
            net.ip(&[
                "addr",
                "add",
                a.as_str().unwrap_or_default(),
                "dev",
                &inside,
            ]);
        }
        let peer_name = spec
            .hostname
            .as_ref()
            .zip(spec.subdomain.as_ref())
            .map(|(h, d)| format!("{h}.{d}.{INFRA_NS}.svc"));
        Ok(Running {
            peer_name,
            name,
            uid,
            component,
            net,
            dir,
            program,
            args,
            env,
            caps,
            config_maps,
            proc: None,
            alive: false,
            starts: 0,
            ready: false,
            reported: None,
            ip,
            node,
        })
    }

    async fn keep_running(&mut self, name: &str) {
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), INFRA_NS);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), INFRA_NS);
        let Some(r) = self.pods.get_mut(name) else {
            return;
        };
        // The kubelet's ConfigMap sync: the new data, swapped in whole.
        for (cm, d) in &r.config_maps {
            if let Ok(c) = cms.get(cm).await {
                write_volume(d, &c.data.unwrap_or_default());
            }
        }
        let exited = r.proc.as_mut().is_some_and(|p| p.try_status().is_some());
        let held = self.held.lock().unwrap().contains(name);
        r.alive = r.proc.is_some() && !exited;
        if r.proc.is_none() || (exited && !held) {
            if let Some(p) = r.proc.take() {
                eprintln!("kubelet: {name} exited; restarting\n{}", p.describe());
            }
            r.starts += 1;
            r.ready = false;
            let mut cmd = r.net.command("sh");
            cmd.arg(r.dir.join("runtime.sh"))
                .arg(&r.dir)
                .arg(&r.caps)
                .arg(&r.program)
                .args(&r.args)
                .env_clear()
                .envs(r.env.iter().map(|(k, v)| (k, v)));
            r.proc = Some(Proc::spawn(
                &format!("{}-{}", r.name, r.starts),
                &self.dir,
                &mut cmd,
            ));
            r.alive = true;
        }
        // Probed as the kubelet probes: at the pod's address, from outside.
        r.ready = pod_get(&self.podnet, r.ip, "/readyz").is_some_and(|(code, _)| code == 200);
        let state = (r.ready, r.starts);
        if r.reported == Some(state) {
            return;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let ready = if r.ready { "True" } else { "False" };
        let status = json!({"status": {
            "phase": "Running", "podIP": r.ip.to_string(), "podIPs": [{"ip": r.ip.to_string()}],
            "hostIP": POD_GATEWAY, "startTime": now,
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now}],
            "containerStatuses": [{"name": "causeway", "ready": r.ready,
                "restartCount": r.starts - 1, "image": "registry.test/causeway:test", "imageID": "",
                "started": true, "state": {"running": {"startedAt": now}}}]}});
        if api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .is_ok()
        {
            r.reported = Some(state);
        }
    }
}

/// Writes a ConfigMap's data into its volume directory; a changed file is
/// replaced by rename, so the pod never reads half of it.
fn write_volume(dir: &Path, data: &BTreeMap<String, String>) {
    for (k, v) in data {
        let f = dir.join(k);
        if fs::read_to_string(&f).ok().as_deref() == Some(v.as_str()) {
            continue;
        }
        let tmp = dir.join(format!("..{k}.tmp"));
        fs::write(&tmp, v).unwrap();
        fs::rename(&tmp, &f).unwrap();
    }
}

// ------------------------------------------------------------------ worker

/// The worker on the VLAN: dhclient with a hook of the test's own that
/// sets only the leased address in the worker's namespace and records
/// each event; it never touches resolv.conf or routes.
struct Worker {
    net: Netns,
    dir: PathBuf,
    hook_log: PathBuf,
    _dhclient: Proc,
}

impl Worker {
    fn start(vlan: &Netns, dir: &Path) -> Worker {
        let net = Netns::new("worker");
        for setting in [
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.default.accept_ra=2",
        ] {
            support::run(net.command("sysctl").args(["-q", "-w", setting]));
        }
        net.veth_to("eth0", Some(WORKER_MAC), vlan, "vw", None);
        vlan.ip(&["link", "set", "vw", "master", "br0"]);
        let dir = dir.join("worker");
        fs::create_dir_all(&dir).unwrap();
        let hook_log = dir.join("hook.log");
        let hook = dir.join("hook.sh");
        support::dhclient_hook(
            &hook,
            &hook_log,
            "$reason ip=$new_ip_address dns=$new_domain_name_servers lease=$new_dhcp_lease_time",
        );
        let conf = dir.join("dhclient.conf");
        fs::write(
            &conf,
            "request subnet-mask, routers, domain-name, domain-name-servers, dhcp-lease-time;\n",
        )
        .unwrap();
        let mut cmd = net.command(tool("dhclient", "isc-dhcp-client"));
        cmd.args(["-4", "-1", "-d", "-v", "-sf"])
            .arg(&hook)
            .arg("-cf")
            .arg(&conf)
            .arg("-lf")
            .arg(dir.join("dhclient.leases"))
            .arg("-pf")
            .arg(dir.join("dhclient.pid"))
            .arg("eth0");
        let dhclient = Proc::spawn("worker-dhclient", &dir, &mut cmd);
        Worker {
            net,
            dir,
            hook_log,
            _dhclient: dhclient,
        }
    }

    /// Runs `dhclient -6` once (stateful, bounded), with a hook that puts
    /// the leased address on eth0 of the worker's namespace and records
    /// it; returns the address.
    fn dhcp6(&self, step: &str) -> String {
        let log = self.dir.join("hook6.log");
        let hook = self.dir.join("hook6.sh");
        fs::write(
            &hook,
            format!(
                "#!/bin/sh\n# mission lab hook: the leased v6 address on the worker's eth0 only.\ncase $reason in BOUND6|RENEW6|REBIND6) ip -6 addr replace \"$new_ip6_address/128\" dev \"$interface\" ;; esac\necho \"$reason ip6=$new_ip6_address\" >> '{}'\nexit 0\n",
                log.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
        let conf = self.dir.join("dhclient6.conf");
        fs::write(&conf, "").unwrap();
        let pid = self.dir.join("dhclient6.pid");
        let out = self.try_run(
            "timeout",
            &[
                "25",
                tool("dhclient", "isc-dhcp-client").to_str().unwrap(),
                "-6",
                "-1",
                "-v",
                "-cf",
                conf.to_str().unwrap(),
                "-sf",
                hook.to_str().unwrap(),
                "-lf",
                self.dir.join("dhclient6.leases").to_str().unwrap(),
                "-pf",
                pid.to_str().unwrap(),
                "eth0",
            ],
        );
        // Bound, it went to the background: stopped here (without a
        // Release), its address left on eth0.
        if let Ok(p) = fs::read_to_string(&pid) {
            if let Ok(p) = p.trim().parse::<u32>() {
                support::signal(p, "TERM");
            }
        }
        let recorded = fs::read_to_string(&log).unwrap_or_default();
        recorded
            .lines()
            .find_map(|l| l.strip_prefix("BOUND6 ip6="))
            .map(str::to_string)
            .unwrap_or_else(|| step_failed(step, format!("no BOUND6 event: {recorded}\n{out:?}")))
    }

    fn events(&self) -> Vec<String> {
        fs::read_to_string(&self.hook_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Runs `program args` in the worker's namespace; its stdout, or the
    /// test fails naming `step`.
    fn run(&self, step: &str, program: &str, args: &[&str]) -> String {
        match self.try_run(program, args) {
            Ok(out) => out,
            Err(e) => step_failed(step, e),
        }
    }

    fn try_run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let out = self
            .net
            .command(program)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{program} {args:?} exited {}\nstdout: {}\nstderr: {}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `dig +short` at the DNS server DHCP gave: the A records.
    fn resolve(&self, step: &str, dns: &str, name: &str) -> Vec<String> {
        self.run(
            step,
            "dig",
            &[
                "+short",
                "+time=2",
                "+tries=1",
                &format!("@{dns}"),
                name,
                "A",
            ],
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// curl over TLS through the proxy to `https://<name>:<port><path>`,
    /// connecting to `address` (what DNS said), verifying the server
    /// against `ca` for `name`: (status, body).
    fn https(
        &self,
        name: &str,
        address: &str,
        port: u16,
        path: &str,
        ca: &Path,
        extra: &[&str],
    ) -> Result<(u16, String), String> {
        let resolve = format!("{name}:{port}:{address}");
        let url = format!("https://{name}:{port}{path}");
        let mut args = vec![
            "-sS",
            "--max-time",
            "10",
            "--resolve",
            &resolve,
            "--cacert",
            ca.to_str().unwrap(),
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
        ];
        args.extend_from_slice(extra);
        args.push(&url);
        let out = self.try_run("curl", &args)?;
        let (body, code) = out.rsplit_once('\n').ok_or("no status line")?;
        Ok((
            code.trim().parse().map_err(|_| out.clone())?,
            body.to_string(),
        ))
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

// ------------------------------------------------------------------ the lab

/// The pod network and the VLAN, with what lives on the pod network
/// besides the pods.
struct Nets {
    podnet: Arc<Netns>,
    vlan: Arc<Netns>,
    _forwards: Vec<Forward>,
    _standins: Vec<Proc>,
}

fn nets(c: &kube_cluster::SharedCluster, h: &kube_cluster::SharedCluster, dir: &Path) -> Nets {
    let podnet = Netns::new("podnet");
    podnet.ip(&["link", "add", "br0", "type", "bridge"]);
    podnet.ip(&["link", "set", "br0", "up"]);
    for a in [
        format!("{POD_GATEWAY}/24"),
        format!("{UPSTREAM_A}/24"),
        format!("{UPSTREAM_B}/24"),
        format!("{KUBERNETES_VIP}/32"),
        format!("{API_VIP}/32"),
        format!("{IGNITION_VIP}/32"),
    ] {
        podnet.ip(&["addr", "add", &a, "dev", "br0"]);
    }
    let vlan = Netns::new("vlan");
    vlan.ip(&["link", "add", "br0", "type", "bridge"]);
    vlan.ip(&["link", "set", "br0", "up"]);

    // The Services that lead to the API servers (kube-proxy's part): the
    // management cluster's `kubernetes`, and the hosted cluster's
    // kube-apiserver in its control-plane namespace.
    let address = |server: &str| -> SocketAddr {
        server
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .parse()
            .unwrap()
    };
    let forwards = vec![
        Forward::start_at(
            &podnet,
            format!("{KUBERNETES_VIP}:443").parse().unwrap(),
            address(&c.server),
        ),
        Forward::start_at(
            &podnet,
            format!("{API_VIP}:6443").parse().unwrap(),
            address(&h.server),
        ),
    ];
    // The resolvers outside the cluster: each answers every name under
    // example.net with its own address.
    let mut standins = Vec::new();
    for (addr, answer) in [(UPSTREAM_A, ANSWER_A), (UPSTREAM_B, ANSWER_B)] {
        standins.push(Proc::spawn(
            &format!("upstream-{addr}"),
            dir,
            podnet
                .command(tool("dnsmasq", "dnsmasq-base"))
                .args(support::DNSMASQ_ALONE)
                .arg("--user=nobody")
                .arg(format!("--listen-address={addr}"))
                .arg(format!(
                    "--pid-file={}",
                    dir.join(format!("dnsmasq-{addr}.pid")).display()
                ))
                .arg(format!("--address=/example.net/{answer}")),
        ));
    }
    Nets {
        podnet: Arc::new(podnet),
        vlan: Arc::new(vlan),
        _forwards: forwards,
        _standins: standins,
    }
}

/// HyperShift's ignition server, as the worker meets it: HTTPS with a
/// certificate of its own CA, `GET /ignition` with the bootstrap token as
/// bearer, answering an Ignition config.
const IGNITION_PY: &str = r#"import http.server, ssl, sys
token, payload, cert, key, addr, port = sys.argv[1:7]
class Ignition(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/ignition":
            self.send_error(404)
            return
        if self.headers.get("Authorization") != "Bearer " + token:
            self.send_error(401)
            return
        body = open(payload, "rb").read()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.coreos.ignition+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.ThreadingHTTPServer((addr, int(port)), Ignition)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("serving", flush=True)
server.serve_forever()
"#;

/// An Ignition v3 config carrying the kubelet's bootstrap kubeconfig.
fn ignition_payload(c: &kube_cluster::SharedCluster, token: &str) -> String {
    let ca = fs::read(&c.ca).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://api-int.{ZONE}:6443\n    certificate-authority-data: {}\nusers:\n- name: kubelet\n  user:\n    token: {token}\ncontexts:\n- name: kubelet\n  context: {{cluster: local, user: kubelet}}\ncurrent-context: kubelet\n",
        b64.encode(&ca)
    );
    json!({"ignition": {"version": "3.2.0"}, "storage": {"files": [{
        "path": "/etc/kubernetes/kubeconfig", "mode": 0o600,
        "contents": {"source": format!("data:;base64,{}", b64.encode(kubeconfig))}}]}})
    .to_string()
}

/// What the worker reads back out of the Ignition config: the bootstrap
/// kubeconfig's server, CA (written to `ca_path`) and token.
fn bootstrap_from_ignition(ignition: &str, ca_path: &Path) -> (String, String) {
    let doc: Value = serde_json::from_str(ignition)
        .unwrap_or_else(|e| step_failed("read the ignition", format!("{e}: {ignition}")));
    let file = doc["storage"]["files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"] == "/etc/kubernetes/kubeconfig"))
        .unwrap_or_else(|| step_failed("read the ignition", "no /etc/kubernetes/kubeconfig"));
    let source = file["contents"]["source"].as_str().unwrap_or_default();
    let b64 = base64::engine::general_purpose::STANDARD;
    let text = String::from_utf8(
        b64.decode(source.trim_start_matches("data:;base64,"))
            .unwrap(),
    )
    .unwrap();
    let kc: Value = serde_saphyr::from_str(&text).unwrap();
    let ca = b64
        .decode(
            kc["clusters"][0]["cluster"]["certificate-authority-data"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    fs::write(ca_path, ca).unwrap();
    (
        kc["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_string(),
        kc["users"][0]["user"]["token"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

fn infra_yaml(lease_time: &str, upstream: &str, proxy_replicas: u8) -> String {
    format!(
        r#"apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {{name: {INFRA}, namespace: {INFRA_NS}}}
spec:
  networkConfig:
    cidr: "{VLAN_CIDR}"
    gateway: "192.168.60.1"
    networkAttachmentDefinition: vlan60
    networkAttachmentNamespace: {INFRA_NS}
    dnsServers: ["{upstream}"]
    ipv6: {{cidr: "{VLAN_CIDR_V6}", routerAdvertisements: true, dhcpRange: {{start: "fd42:60::100", end: "fd42:60::1ff"}}}}
  infraComponents:
    dhcp: {{enabled: true, serverIP: "{DHCP_IP}", serverIPv6: "fd42:60::2", rangeStart: "192.168.60.100", rangeEnd: "192.168.60.120", leaseTime: "{lease_time}"}}
    dns: {{enabled: true, serverIP: "{DNS_IP}", serverIPv6: "{DNS_IP_V6}", baseDomain: example.test, clusterName: e2e}}
    proxy: {{enabled: true, serverIP: "{PROXY_IP}", serverIPv6: "{PROXY_IP_V6}", controlPlaneNamespace: {CP_NS}, replicas: {proxy_replicas}}}
"#
    )
}

async fn dpu(client: &Client, name: &str, phase: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        DPU_NS,
        &causeway_operator::dpf::approver::dpu_resource(),
    );
    let pp = PatchParams::apply("dpf").force();
    let kind = json!({"apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPU"});
    let mut obj = kind.clone();
    obj["metadata"] = json!({"name": name, "namespace": DPU_NS});
    obj["spec"] = json!({});
    api.patch(name, &pp, &Patch::Apply(obj)).await.unwrap();
    let mut status = kind;
    status["status"] = json!({"phase": phase});
    api.patch_status(name, &pp, &Patch::Apply(status))
        .await
        .unwrap();
}

/// The management cluster as DPF and HyperShift leave it for one DPU
/// joining the hosted cluster (this same API server): their CRDs, the
/// provisioner, its DPU in the joining phase, the hosted cluster's admin
/// kubeconfig, and OpenShift's node bootstrapper.
async fn dpf_side(h: &kube_cluster::SharedCluster, client: &Client, hosted: &Client) {
    kube_cluster::install_fixture_crds(
        client,
        &[
            kube_cluster::HOSTED_CLUSTER_CRD,
            kube_cluster::NODE_POOL_CRD,
            kube_cluster::DPU_CLUSTER_CRD,
            (DPU_CRD, "dpus.provisioning.dpu.nvidia.com"),
        ],
    )
    .await;
    for ns in [PROVISIONER_NS, DPU_NS] {
        ensure_namespace(client, ns).await;
    }
    // In the hosted cluster: the node bootstrapper and what nodes may do.
    ensure_namespace(hosted, MCO_NS).await;
    apply_yaml(
        hosted,
        &format!(
            r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: node-bootstrapper, namespace: {MCO_NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: mission-node-bootstrapper}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-bootstrapper"}}
subjects:
- {{kind: ServiceAccount, name: node-bootstrapper, namespace: {MCO_NS}}}
---
# What the Node authorizer grants a node on OpenShift, by RBAC here.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: mission-nodes}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node"}}
subjects:
- {{kind: Group, name: "system:nodes", apiGroup: rbac.authorization.k8s.io}}
"#
        ),
        "default",
    )
    .await
    .unwrap();
    let mut doc: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    doc["metadata"] = json!({"name": PROVISIONER, "namespace": PROVISIONER_NS});
    doc["spec"]["dpuClusterRef"] = json!({"name": "fleet", "namespace": DPU_NS});
    doc["spec"]["networking"] = json!({"machineNetwork": [{"cidr": VLAN_CIDR}]});
    apply_yaml(
        client,
        &serde_json::to_string(&doc).unwrap(),
        PROVISIONER_NS,
    )
    .await
    .unwrap();
    kube_cluster::blue_field_images(
        client,
        &[("4.19.0-ec.5", "quay.io/example/rhcos-bfb:4.19.0-ec.5")],
    )
    .await;
    dpu(client, WORKER, "DPU Cluster Config").await;
    // HyperShift's admin kubeconfig names the cluster's external endpoint,
    // which nothing resolves for the operator here: only the Service path
    // reaches the hosted API server.
    let kubeconfig = causeway_operator::k8s::manifest::token_kubeconfig(
        &format!("https://api.{ZONE}:6443"),
        &h.ca,
        &h.admin_token,
    );
    let body = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("{PROVISIONER}-admin-kubeconfig"), "namespace": PROVISIONER_NS},
        "data": {"kubeconfig": k8s_openapi::ByteString(kubeconfig.into_bytes())}});
    apply_yaml(
        client,
        &serde_json::to_string(&body).unwrap(),
        PROVISIONER_NS,
    )
    .await
    .unwrap();
}

/// A GET to a pod's admin port at its pod-network address, from the pod
/// network, as the kubelet's probes and Prometheus reach it.
fn pod_get(podnet: &Netns, ip: Ipv4Addr, path: &str) -> Option<(u16, String)> {
    podnet.http_get_at(&ip.to_string(), ADMIN_PORT, path)
}

/// The sample's value under `series` on a pod's admin port.
fn pod_metric(podnet: &Netns, view: &PodView, series: &str) -> f64 {
    let body = pod_get(podnet, view.ip, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    support::metric(&body, series).unwrap_or(0.0)
}

/// The demo: print where everything is and wait for Enter.
fn hold(
    c: &kube_cluster::SharedCluster,
    nets: &Nets,
    worker: &Worker,
    kubelet: &Kubelet,
    dir: &Path,
    api: &str,
) {
    let pods: Vec<String> = kubelet
        .pods()
        .iter()
        .map(|(name, v)| format!("  {:<40} {} ({}, eth0 {})", name, v.ns, v.component, v.ip))
        .collect();
    let w = worker.net.name();
    eprintln!(
        "\nThe mission lab is up.\n  pod network  {}\n  VLAN         {}\n  worker       {w}\npods (name, namespace):\n{}\nTry:\n  ip netns exec {w} dig @{DNS_IP} api.{ZONE}\n  cd {} && ip netns exec {w} curl --cacert cluster-ca.crt --cert kubelet.crt --key kubelet.key --resolve api.{ZONE}:6443:{api} https://api.{ZONE}:6443/api/v1/nodes/{WORKER}\n  KUBECONFIG={} kubectl -n {INFRA_NS} get infra,pods,configmaps\nFiles: {}\nPress Enter to tear it down.",
        nets.podnet.name(),
        nets.vlan.name(),
        pods.join("\n"),
        worker.dir.display(),
        c.dir.join("kubeconfig").display(),
        dir.display(),
    );
    let mut line = String::new();
    if let Ok(tty) = fs::File::open("/dev/tty") {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(tty), &mut line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_the_vlan_boots_joins_and_uses_its_cluster_through_the_rendered_pods() {
    let Some(c) = kube_cluster::cluster_with_sans(TEST, &management_sans()) else {
        return;
    };
    // The hosted cluster: a second API server of its own, which the worker
    // reaches through the proxy and the operator through its admin
    // kubeconfig.
    let Some(h) = kube_cluster::hosted_cluster("mission_lab", TEST, &hosted_sans()) else {
        return;
    };
    let began = Instant::now();
    let mut marks: Vec<(&str, Duration)> = Vec::new();
    // Kept when the test fails: every process's log is in it.
    let d = tempfile::Builder::new()
        .prefix("causeway-mission-")
        .tempdir()
        .unwrap()
        .keep();
    println!("lab directory (kept if the test fails): {}", d.display());
    let client = admin(c).await;
    let hosted = admin(h).await;

    println!("step: the management side (Infra, NetworkAttachmentDefinition, DPF and HyperShift played by the test)");
    for ns in [INFRA_NS, CP_NS] {
        ensure_namespace(&client, ns).await;
    }
    kube_cluster::install_fixture_crds(&client, &[kube_cluster::NAD_CRD]).await;
    kube_cluster::network_attachment(&client, INFRA_NS, "vlan60").await;
    dpf_side(h, &client, &hosted).await;
    let hosted_address = h.address.to_string();
    let service_name = hosted_service_name();
    let op = Operator::start_resolving(
        c,
        &[INFRA_NS, PROVISIONER_NS],
        &["--leader-election=false", "--hosted-apiserver=service"],
        "mission",
        &[(hosted_address.as_str(), service_name.as_str())],
    );
    apply_yaml(&client, &infra_yaml("20s", UPSTREAM_A, 1), INFRA_NS)
        .await
        .unwrap();

    // The kubelet stand-in runs the causeway binary as the image's
    // entrypoint.
    assert!(
        CONTAINERFILE.contains(r#"ENTRYPOINT ["/causeway"]"#),
        "the image's entrypoint changed; the kubelet stand-in maps it to the causeway binary"
    );
    let nets = nets(c, h, &d);
    let kubelet = Kubelet::start(c, nets.podnet.clone(), nets.vlan.clone(), d.clone());

    println!("step: the operator's pods run and the Infra is Ready");
    let infras: Api<Infra> = Api::namespaced(client.clone(), INFRA_NS);
    eventually(
        "the Infra Ready with its three pods running (step: the rendered pods run)",
        WAIT,
        Some(&op),
        || async {
            let i = infras.get(INFRA).await.ok()?;
            let ready = i
                .status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let running = ["dhcp", "dns", "proxy"]
                .iter()
                .all(|comp| kubelet.ready_pod(comp).is_some());
            (ready && running).then_some(())
        },
    )
    .await;
    marks.push(("pods running, Infra Ready", began.elapsed()));
    let first_pods = kubelet.pods();

    println!("step: the worker gets an address and its DNS server by DHCP");
    let worker = Worker::start(&nets.vlan, &d);
    let bound = poll_until(WAIT, || {
        worker
            .events()
            .into_iter()
            .find(|l| l.starts_with("BOUND "))
    })
    .unwrap_or_else(|| step_failed("DHCP", format!("no BOUND event: {:?}", worker.events())));
    let address: Ipv4Addr = field(&bound, "ip").parse().unwrap();
    assert!(
        (Ipv4Addr::new(192, 168, 60, 100)..=Ipv4Addr::new(192, 168, 60, 120)).contains(&address),
        "step DHCP: {bound}"
    );
    assert_eq!(field(&bound, "dns"), DNS_IP, "step DHCP: {bound}");
    assert_eq!(field(&bound, "lease"), "20", "step DHCP: {bound}");
    let dns = field(&bound, "dns").to_string();
    marks.push(("DHCP bound", began.elapsed()));

    println!("step: the worker resolves its cluster's names and an outside one");
    for name in ["api", "api-int", "ignition"] {
        let got = worker.resolve("DNS", &dns, &format!("{name}.{ZONE}"));
        assert_eq!(got, vec![PROXY_IP.to_string()], "step DNS: {name}.{ZONE}");
    }
    let outside = worker.resolve("DNS forwarding", &dns, "before.example.net");
    assert_eq!(outside, vec![ANSWER_A.to_string()], "step DNS forwarding");
    let api_addr = worker.resolve("DNS", &dns, &format!("api.{ZONE}"))[0].clone();
    let api_int_addr = worker.resolve("DNS", &dns, &format!("api-int.{ZONE}"))[0].clone();
    let ignition_addr = worker.resolve("DNS", &dns, &format!("ignition.{ZONE}"))[0].clone();

    println!("step: the worker fetches its ignition through the proxy");
    let bootstrap_token = token_for(&hosted, MCO_NS, "node-bootstrapper").await;
    let ign_dir = d.join("ignition");
    fs::create_dir_all(&ign_dir).unwrap();
    let (ign_cert, ign_key) =
        support::tls_cert(&ign_dir, "ignition", &[&format!("ignition.{ZONE}")]);
    let ign_token = "ignition-token-of-the-nodepool";
    fs::write(
        ign_dir.join("payload.json"),
        ignition_payload(h, &bootstrap_token),
    )
    .unwrap();
    fs::write(ign_dir.join("ignition.py"), IGNITION_PY).unwrap();
    let _ignition = Proc::spawn(
        "ignition-server",
        &d,
        nets.podnet
            .command("python3")
            .arg(ign_dir.join("ignition.py"))
            .arg(ign_token)
            .arg(ign_dir.join("payload.json"))
            .arg(&ign_cert)
            .arg(&ign_key)
            .args([IGNITION_VIP, "443"]),
    );
    assert!(
        poll_until(Duration::from_secs(20), || nets
            .podnet
            .tcp_open(&format!("{IGNITION_VIP}:443"))
            .then_some(()))
        .is_some(),
        "the ignition stand-in did not listen"
    );
    let (code, _) = worker
        .https(
            &format!("ignition.{ZONE}"),
            &ignition_addr,
            443,
            "/ignition",
            &ign_cert,
            &[],
        )
        .unwrap_or_else(|e| step_failed("ignition without its token", e));
    assert_eq!(code, 401, "step ignition: served without the token");
    let auth = format!("Authorization: Bearer {ign_token}");
    let (code, ignition) = worker
        .https(
            &format!("ignition.{ZONE}"),
            &ignition_addr,
            443,
            "/ignition",
            &ign_cert,
            &["-H", &auth],
        )
        .unwrap_or_else(|e| step_failed("ignition", e));
    assert_eq!(code, 200, "step ignition: {ignition}");
    let cluster_ca = worker.dir.join("cluster-ca.crt");
    let (server, token) = bootstrap_from_ignition(&ignition, &cluster_ca);
    assert_eq!(
        server,
        format!("https://api-int.{ZONE}:6443"),
        "step ignition: the bootstrap kubeconfig's server"
    );
    marks.push(("ignition fetched", began.elapsed()));

    println!("step: the worker asks to join: a bootstrap CSR through the proxy, verified against the API server's CA");
    worker.run(
        "make the kubelet's key and request",
        "openssl",
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "kubelet.key",
            "-out",
            "kubelet.csr",
            "-subj",
            &format!("/O=system:nodes/CN=system:node:{WORKER}"),
        ],
    );
    let request = base64::engine::general_purpose::STANDARD
        .encode(fs::read(worker.dir.join("kubelet.csr")).unwrap());
    let csr_name = format!("{WORKER}-bootstrap");
    let body = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": csr_name},
        "spec": {"request": request, "signerName": BOOTSTRAP_SIGNER,
            "usages": ["digital signature", "key encipherment", "client auth"]}});
    fs::write(worker.dir.join("csr.json"), body.to_string()).unwrap();
    let bearer = format!("Authorization: Bearer {token}");
    let (code, out) = worker
        .https(
            &format!("api-int.{ZONE}"),
            &api_int_addr,
            6443,
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            &cluster_ca,
            &[
                "-H",
                &bearer,
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                "@csr.json",
            ],
        )
        .unwrap_or_else(|e| step_failed("create the bootstrap CSR", e));
    assert_eq!(code, 201, "step create the bootstrap CSR: {out}");

    println!("step: the operator approves it and the controller-manager signs it");
    let csr_path = format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{csr_name}");
    let issued = eventually(
        "the bootstrap CSR approved by the operator and signed (read by the worker through the proxy)",
        WAIT,
        Some(&op),
        || async {
            let (code, body) = worker
                .https(&format!("api-int.{ZONE}"), &api_int_addr, 6443, &csr_path, &cluster_ca, &["-H", &bearer])
                .ok()?;
            let csr: Value = serde_json::from_str(&body).ok()?;
            (code == 200).then_some(())?;
            let cert = csr["status"]["certificate"].as_str()?.to_string();
            Some((csr["status"]["conditions"].clone(), cert))
        },
    )
    .await;
    let approved = issued
        .0
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Approved"))
        .cloned()
        .unwrap_or_else(|| step_failed("approval", format!("{}", issued.0)));
    assert_eq!(
        approved["reason"], "AutoApproved",
        "step approval: {approved}"
    );
    assert_eq!(
        approved["message"],
        format!("Auto-approved bootstrap CSR for DPU worker node {WORKER}"),
        "step approval"
    );
    fs::write(
        worker.dir.join("kubelet.crt"),
        base64::engine::general_purpose::STANDARD
            .decode(&issued.1)
            .unwrap(),
    )
    .unwrap();
    let subject = worker.run(
        "read the issued certificate",
        "openssl",
        &[
            "x509",
            "-in",
            "kubelet.crt",
            "-noout",
            "-subject",
            "-nameopt",
            "RFC2253",
        ],
    );
    assert!(
        subject.contains(&format!("CN=system:node:{WORKER}")),
        "step signed: the certificate's subject is {subject}"
    );
    marks.push(("CSR approved and signed", began.elapsed()));

    println!("step: as system:node:{WORKER}, through the proxy: /api, then its own Node");
    let kubelet_tls = ["--cert", "kubelet.crt", "--key", "kubelet.key"];
    let as_node = |path: &str| {
        worker.https(
            &format!("api.{ZONE}"),
            &api_addr,
            6443,
            path,
            &cluster_ca,
            &kubelet_tls,
        )
    };
    let (code, body) = as_node("/api").unwrap_or_else(|e| step_failed("GET /api as the node", e));
    assert_eq!(code, 200, "step GET /api as the node: {body}");
    assert!(
        body.contains("\"versions\""),
        "step GET /api as the node: {body}"
    );
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": WORKER}});
    fs::write(worker.dir.join("node.json"), node.to_string()).unwrap();
    let mut register = kubelet_tls.to_vec();
    register.extend([
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "@node.json",
    ]);
    let (code, body) = worker
        .https(
            &format!("api.{ZONE}"),
            &api_addr,
            6443,
            "/api/v1/nodes",
            &cluster_ca,
            &register,
        )
        .unwrap_or_else(|e| step_failed("register the Node", e));
    assert_eq!(code, 201, "step register the Node: {body}");
    let own = format!("/api/v1/nodes/{WORKER}");
    let (code, body) = as_node(&own).unwrap_or_else(|e| step_failed("read its own Node", e));
    assert_eq!(code, 200, "step read its own Node: {body}");
    let read: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(read["metadata"]["name"], WORKER, "step read its own Node");
    marks.push(("Node registered and read as the node", began.elapsed()));

    println!("step: over v6, the worker leases an address by DHCPv6, resolves api to AAAA and calls the API");
    let leased6 = worker.dhcp6("DHCPv6");
    let v6: std::net::Ipv6Addr = leased6.parse().unwrap();
    assert!(
        ("fd42:60::100".parse::<std::net::Ipv6Addr>().unwrap()
            ..="fd42:60::1ff".parse::<std::net::Ipv6Addr>().unwrap())
            .contains(&v6),
        "step DHCPv6: {leased6} is outside the Infra's dhcpRange"
    );
    let aaaa = worker.run(
        "AAAA for api",
        "dig",
        &[
            "+short",
            "+time=2",
            "+tries=1",
            &format!("@{DNS_IP_V6}"),
            &format!("api.{ZONE}"),
            "AAAA",
        ],
    );
    assert_eq!(aaaa.trim(), PROXY_IP_V6, "step AAAA for api");
    let over_v6 = worker
        .https(
            &format!("api.{ZONE}"),
            &format!("[{PROXY_IP_V6}]"),
            6443,
            &own,
            &cluster_ca,
            &kubelet_tls,
        )
        .unwrap_or_else(|e| step_failed("the API over v6", e));
    assert_eq!(over_v6.0, 200, "step the API over v6: {}", over_v6.1);
    assert!(
        over_v6.1.contains(WORKER),
        "step the API over v6: {}",
        over_v6.1
    );
    marks.push((
        "v6: DHCPv6 lease, AAAA, the API through the proxy",
        began.elapsed(),
    ));

    println!("step: fault: the proxy pod's container killed mid-session");
    let (proxy_pod, before) = kubelet.ready_pod("proxy").unwrap();
    let killed = Instant::now();
    assert!(
        support::signal(before.pid.unwrap(), "KILL"),
        "step proxy restart: kill -9"
    );
    // The kubelet restarts the container; the worker's next request
    // succeeds once the proxy is back.
    let back = eventually(
        "the worker's request through the restarted proxy (step: proxy restart)",
        WAIT,
        Some(&op),
        || async {
            let (code, _) = as_node(&own).ok()?;
            let now = kubelet.pods().get(&proxy_pod).cloned()?;
            (code == 200 && now.starts == 2).then_some(now)
        },
    )
    .await;
    let recovered = killed.elapsed();
    assert_eq!(
        back.uid, before.uid,
        "the same pod, its container restarted"
    );
    assert_ne!(back.pid, before.pid, "step proxy restart: a new process");
    println!("proxy container killed: the worker's request succeeded again after {recovered:?}");
    marks.push(("proxy restarted, request through it", began.elapsed()));

    println!("step: an Infra change (lease time, DNS upstream) reaches the running pods through their ConfigMaps");
    let changed = Instant::now();
    apply_yaml(&client, &infra_yaml("30s", UPSTREAM_B, 1), INFRA_NS)
        .await
        .unwrap();
    let renewed = poll_until(WAIT, || {
        worker
            .events()
            .into_iter()
            .find(|l| l.starts_with("RENEW ") && field(l, "lease") == "30")
    })
    .unwrap_or_else(|| {
        step_failed(
            "the new lease time at the worker's renewal",
            format!("{:?}", worker.events()),
        )
    });
    assert_eq!(
        field(&renewed, "ip"),
        address.to_string(),
        "step the new lease time: the same address renewed: {renewed}"
    );
    let mut n = 0;
    let forwarded = poll_until(WAIT, || {
        n += 1;
        let got = worker.resolve("DNS forwarding", &dns, &format!("after-{n}.example.net"));
        (got == vec![ANSWER_B.to_string()]).then_some(got)
    });
    assert!(
        forwarded.is_some(),
        "step the new DNS upstream: still answered by the old one"
    );
    println!(
        "Infra change: the new lease time and upstream in use after {:?}",
        changed.elapsed()
    );
    let now_pods = kubelet.pods();
    for comp in ["dhcp", "dns"] {
        let then = first_pods.values().find(|v| v.component == comp).unwrap();
        let now = now_pods.values().find(|v| v.component == comp).unwrap();
        assert_eq!(
            (now.uid.as_str(), now.pid, now.starts),
            (then.uid.as_str(), then.pid, 1),
            "step Infra change: {comp} must take the change running, not restarted"
        );
        let applied = pod_metric(
            &nets.podnet,
            now,
            "causeway_config_reloads_total{result=\"applied\"}",
        );
        assert!(
            applied >= 1.0,
            "step Infra change: {comp} counted {applied} applied reloads"
        );
    }
    marks.push(("Infra change in effect without a restart", began.elapsed()));

    println!("step: two proxy replicas; the active one killed and kept down, the standby serves");
    apply_yaml(&client, &infra_yaml("30s", UPSTREAM_B, 2), INFRA_NS)
        .await
        .unwrap();
    let (active, standby) = eventually(
        "two proxy replicas ready, one of them active (step: two proxy replicas)",
        WAIT,
        Some(&op),
        || async {
            let pods = kubelet.pods_of("proxy");
            if pods.len() != 2 || !pods.values().all(|v| v.ready) {
                return None;
            }
            let i = infras.get(INFRA).await.ok()?;
            let proxy = i.status?.component_status?.proxy?;
            let active = proxy.active_replica.filter(|a| pods.contains_key(a))?;
            let standby = pods.keys().find(|p| **p != active)?.clone();
            Some((active, standby))
        },
    )
    .await;
    eventually(
        "the worker's request through the active replica (step: two proxy replicas)",
        WAIT,
        Some(&op),
        || async { as_node(&own).ok().filter(|(code, _)| *code == 200) },
    )
    .await;
    let down = kubelet.pods_of("proxy")[&active].clone();
    kubelet.hold(&active);
    let killed = Instant::now();
    assert!(
        support::signal(down.pid.unwrap(), "KILL"),
        "step proxy takeover: kill -9 of the active"
    );
    let served = eventually(
        "the worker's request served by the standby while the active stays down (step: proxy takeover)",
        WAIT,
        Some(&op),
        || async {
            let (code, _) = as_node(&own).ok()?;
            (code == 200).then(|| killed.elapsed())
        },
    )
    .await;
    let killed_one = kubelet.pods_of("proxy")[&active].clone();
    assert_eq!(
        (killed_one.pid, killed_one.starts),
        (None, down.starts),
        "step proxy takeover: the killed replica must still be down, so the standby served"
    );
    println!("active proxy replica killed and kept down: the worker's next successful request after {served:?}");
    let taken = eventually(
        "the standby as the Infra's active proxy replica, the other not ready",
        WAIT,
        Some(&op),
        || async {
            let i = infras.get(INFRA).await.ok()?;
            let proxy = i.status?.component_status?.proxy?;
            // The killed one's readiness reaches the status through its
            // Pod and the StatefulSet.
            (proxy.active_replica.as_deref() == Some(standby.as_str()) && proxy.ready_replicas == 1)
                .then_some(proxy)
        },
    )
    .await;
    assert_eq!(taken.replicas, 2, "step proxy takeover: {taken:?}");
    kubelet.release(&active);
    eventually(
        "the killed replica back, as the standby",
        WAIT,
        Some(&op),
        || async {
            let pods = kubelet.pods_of("proxy");
            let back = pods.get(&active)?;
            (back.ready && back.starts == down.starts + 1).then_some(())
        },
    )
    .await;
    marks.push(("proxy takeover by the standby", began.elapsed()));

    let total = began.elapsed();
    for (what, at) in &marks {
        println!("  at {:>6.1}s: {what}", at.as_secs_f64());
    }
    println!("mission lab: every step passed in {total:?}");
    if std::env::var_os("CAUSEWAY_LAB_HOLD").is_some() {
        hold(c, &nets, &worker, &kubelet, &d, &api_addr);
    }
    drop(worker);
    drop(kubelet);
    drop(nets);
    infras
        .delete(INFRA, &DeleteParams::default())
        .await
        .unwrap();
    let _ = fs::remove_dir_all(&d);
}
