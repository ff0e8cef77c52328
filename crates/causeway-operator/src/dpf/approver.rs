//! The CSR approver: one session per provisioner whose hosted cluster has
//! an admin kubeconfig. A session watches the hosted cluster's kubelet CSRs
//! and Nodes and the management cluster's DPUs, runs [`csr::decide`] over
//! every undecided CSR whenever any of them changes, and acts on the
//! verdict through the `/approval` subresource.
//!
//! Least privilege: the admin kubeconfig is used only to give the approver
//! its own ServiceAccount in the hosted cluster (CSRs read, approval
//! update, `approve` on the two kubelet signers only, Nodes read) and a
//! short-lived token for it; everything else runs under that token.
//!
//! The manager starts this only while it holds the leader lease, so only
//! one replica ever approves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ApiResource;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config, Resource, ResourceExt};
use serde_json::json;

use super::crd::{BootstrapApproval, CsrApprovalStatus, DPFHCPProvisioner, ServingApproval};
use super::csr::{self, Csr, Decision, History, Inventory, Kind, Policy, Verdict};
use super::spec;
use crate::controller::{cached, publish_related_event, resource, OperatorMetrics, Scope};

/// The field manager of the approver's part of the provisioner status and
/// of its objects in the hosted cluster.
pub const APPROVER_MANAGER: &str = "causeway-csr-approver";
/// The approver's identity in the hosted cluster.
pub const HOSTED_NAMESPACE: &str = "kube-system";
pub const HOSTED_ACCOUNT: &str = "causeway-csr-approver";
pub const HOSTED_ROLE: &str = "causeway:csr-approver";
/// The hosted cluster's DNS domain: names under it are never signed.
const CLUSTER_DOMAIN: &str = "cluster.local";
/// CSRs older than this do not count against the pending cap (the
/// controller-manager removes unapproved ones after a day).
const PENDING_WINDOW_SECONDS: i64 = 3600;
/// A session ends before its token does, and starts again with a new one.
const TOKEN_SECONDS: i64 = 3600;
const SESSION: Duration = Duration::from_secs(45 * 60);
/// Decisions are re-run this often even when nothing changed, so the
/// pending window moves and a missed event cannot strand a CSR.
const RESYNC: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A DPU in this phase is being provisioned again: its earlier approvals
/// belong to the previous cycle.
const REPROVISIONING_PHASE: &str = "OS Installing";

/// How the hosted cluster's API server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostedEndpoint {
    /// `https://kube-apiserver.<ns>-<name>.svc.cluster.local:6443`, the
    /// control plane's Service on the management cluster.
    Service,
    /// The server the admin kubeconfig names.
    Kubeconfig,
}

#[derive(Debug, Clone)]
pub struct ApproverOptions {
    pub endpoint: HostedEndpoint,
    /// Requests asking for a longer `expirationSeconds` are denied.
    pub max_expiration_seconds: i32,
    /// The pending cap is the number of DPUs (or Nodes, if more) plus this.
    pub pending_slack: usize,
}

impl Default for ApproverOptions {
    fn default() -> Self {
        ApproverOptions {
            endpoint: HostedEndpoint::Service,
            // A year and two days, as kubelet-csr-approver allows.
            max_expiration_seconds: 367 * 24 * 3600,
            pending_slack: 20,
        }
    }
}

pub fn dpu_resource() -> ApiResource {
    resource("provisioning.dpu.nvidia.com", "v1alpha1", "DPU", "dpus")
}

struct Context {
    client: Client,
    provisioners: Store<DPFHCPProvisioner>,
    options: ApproverOptions,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
}

/// Why a session ended.
enum Ended {
    /// The token is due for renewal: start again at once.
    Renew,
    /// The provisioner is gone.
    Gone,
    NoKubeconfig(String),
    Unreachable(String),
}

pub async fn run(
    client: Client,
    scope: Scope,
    options: ApproverOptions,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (provisioners, events) = cached(
        scope.api::<DPFHCPProvisioner>(&client),
        watcher::Config::default(),
    );
    let ctx = Arc::new(Context {
        client,
        provisioners: provisioners.clone(),
        options,
        recorder,
        metrics,
    });
    let mut sessions: HashMap<ObjectRef<DPFHCPProvisioner>, (String, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    let mut events = pin!(events);
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            next = events.next() => if next.is_none() { break },
        }
        // One session per live provisioner, a new one when the object is
        // recreated under the same name.
        let live: HashMap<_, _> = provisioners
            .state()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (ObjectRef::from_obj(&*p), p.uid().unwrap_or_default()))
            .collect();
        sessions.retain(|key, (uid, task)| {
            let keep = live.get(key) == Some(uid) && !task.is_finished();
            if !keep {
                task.abort();
                if let (Some(m), Some(ns)) = (&ctx.metrics, &key.namespace) {
                    m.csr_pending(ns, &key.name, None);
                }
                tracing::info!(provisioner = %key.name, namespace = ?key.namespace, "CSR approver stopped");
            }
            keep
        });
        for (key, uid) in live {
            if sessions.contains_key(&key) {
                continue;
            }
            tracing::info!(provisioner = %key.name, namespace = ?key.namespace, "CSR approver starting");
            let task = tokio::spawn(supervise(ctx.clone(), key.clone()));
            sessions.insert(key, (uid, task));
        }
    }
    for (_, (_, task)) in sessions.drain() {
        task.abort();
        let _ = task.await;
    }
}

/// Runs sessions for one provisioner until it is gone, backing off while
/// its hosted cluster cannot be reached.
async fn supervise(ctx: Arc<Context>, key: ObjectRef<DPFHCPProvisioner>) {
    let Some(namespace) = key.namespace.clone() else {
        return;
    };
    let mut delay = BACKOFF_MIN;
    loop {
        let ended = session(&ctx, &namespace, &key.name).await;
        let (reason, message) = match ended {
            Ended::Gone => return,
            Ended::Renew => {
                delay = BACKOFF_MIN;
                continue;
            }
            Ended::NoKubeconfig(m) => ("KubeconfigNotAvailable", m),
            Ended::Unreachable(m) => ("HostedClusterNotReachable", m),
        };
        tracing::info!(provisioner = %key.name, %namespace, reason, %message, retry_in = ?delay, "CSR approver not running");
        let record = current_record(&ctx, &key);
        let next = CsrApprovalStatus {
            active: false,
            reason: reason.into(),
            message,
            ..record.clone().unwrap_or_default()
        };
        if record.as_ref() != Some(&next) {
            if let Err(e) = write_record(&ctx.client, &namespace, &key.name, &next).await {
                tracing::warn!(provisioner = %key.name, %namespace, error = %e, "could not write the approver's status");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

fn current_record(ctx: &Context, key: &ObjectRef<DPFHCPProvisioner>) -> Option<CsrApprovalStatus> {
    ctx.provisioners
        .get(key)
        .and_then(|p| p.status.as_ref().and_then(|s| s.csr_approval.clone()))
}

async fn write_record(
    client: &Client,
    namespace: &str,
    name: &str,
    record: &CsrApprovalStatus,
) -> Result<(), kube::Error> {
    let api: Api<DPFHCPProvisioner> = Api::namespaced(client.clone(), namespace);
    let body = json!({
        "apiVersion": DPFHCPProvisioner::api_version(&()),
        "kind": DPFHCPProvisioner::kind(&()),
        "status": {"csrApproval": record},
    });
    api.patch_status(
        name,
        &PatchParams::apply(APPROVER_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
}

/// The hosted cluster's admin client, from HyperShift's admin kubeconfig.
async fn admin_client(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<(Config, Client), Ended> {
    let secret_name = format!("{name}-admin-kubeconfig");
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = match secrets.get_opt(&secret_name).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(Ended::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name} does not exist yet"
            )))
        }
        Err(e) => {
            return Err(Ended::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name}: {e}"
            )))
        }
    };
    let text = secret
        .data
        .as_ref()
        .and_then(|d| d.get("kubeconfig"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .ok_or_else(|| {
            Ended::NoKubeconfig(format!(
                "Secret {namespace}/{secret_name} has no key kubeconfig"
            ))
        })?;
    let mut kubeconfig = Kubeconfig::from_yaml(&text)
        .map_err(|e| Ended::NoKubeconfig(format!("Secret {namespace}/{secret_name}: {e}")))?;
    if ctx.options.endpoint == HostedEndpoint::Service {
        let server = format!("https://kube-apiserver.{namespace}-{name}.svc.cluster.local:6443");
        for c in &mut kubeconfig.clusters {
            if let Some(cluster) = c.cluster.as_mut() {
                cluster.server = Some(server.clone());
            }
        }
    }
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Ended::NoKubeconfig(format!("Secret {namespace}/{secret_name}: {e}")))?;
    config.connect_timeout = Some(Duration::from_secs(10));
    let client = Client::try_from(config.clone())
        .map_err(|e| Ended::Unreachable(format!("building a client: {e}")))?;
    Ok((config, client))
}

/// The approver's own ClusterRole in the hosted cluster.
fn hosted_role() -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": HOSTED_ROLE},
        "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"], "verbs": ["patch"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "verbs": ["approve"],
             "resourceNames": [csr::BOOTSTRAP_SIGNER, csr::SERVING_SIGNER]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        ],
    })
}

/// Gives the approver its own identity in the hosted cluster and returns a
/// client under a short-lived token of it.
async fn least_privilege(admin: &Client, config: &Config) -> Result<Client, kube::Error> {
    let pp = PatchParams::apply(APPROVER_MANAGER).force();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), HOSTED_NAMESPACE);
    accounts
        .patch(
            HOSTED_ACCOUNT,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": HOSTED_ACCOUNT, "namespace": HOSTED_NAMESPACE},
            })),
        )
        .await?;
    Api::<ClusterRole>::all(admin.clone())
        .patch(HOSTED_ROLE, &pp, &Patch::Apply(hosted_role()))
        .await?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(
            HOSTED_ROLE,
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": HOSTED_ROLE},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": HOSTED_ROLE},
                "subjects": [{"kind": "ServiceAccount", "name": HOSTED_ACCOUNT, "namespace": HOSTED_NAMESPACE}],
            })),
        )
        .await?;
    let token = accounts
        .create_token_request(
            HOSTED_ACCOUNT,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    expiration_seconds: Some(TOKEN_SECONDS),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    let mut config = config.clone();
    config.auth_info = serde_json::from_value(json!({ "token": token }))
        .map_err(|e| kube::Error::Service(Box::new(e)))?;
    Client::try_from(config)
}

/// What one of the merged watches said.
enum Seen {
    Changed,
    /// The first full list of watch `n` is in.
    Listed(usize),
    /// A hosted-cluster watch failed: the session ends.
    Failed(String),
    Tick,
}

fn watched<K, S>(index: usize, stream: S) -> BoxStream<'static, Seen>
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    stream
        .map(move |e| match e {
            Ok(watcher::Event::InitDone) => Seen::Listed(index),
            Ok(_) => Seen::Changed,
            Err(e) => Seen::Failed(e.to_string()),
        })
        .boxed()
}

async fn session(ctx: &Context, namespace: &str, name: &str) -> Ended {
    let key = ObjectRef::<DPFHCPProvisioner>::new(name).within(namespace);
    let Some(provisioner) = ctx.provisioners.get(&key) else {
        return Ended::Gone;
    };
    let (config, admin) = match admin_client(ctx, namespace, name).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    match tokio::time::timeout(Duration::from_secs(15), admin.apiserver_version()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Ended::Unreachable(format!("{e}")),
        Err(_) => return Ended::Unreachable("no answer within 15 s".into()),
    }
    let (hosted, identity) = match least_privilege(&admin, &config).await {
        Ok(c) => (c, "its own ServiceAccount"),
        Err(e) => {
            tracing::warn!(provisioner = name, namespace, error = %e, "could not give the approver its own identity in the hosted cluster; approving with the admin kubeconfig");
            (admin.clone(), "the admin kubeconfig")
        }
    };

    let csrs: Api<CertificateSigningRequest> = Api::all(hosted.clone());
    // Servers that cannot select on the signer get one unfiltered watch.
    let selectable = csrs
        .list(
            &ListParams::default()
                .fields(&format!("spec.signerName={}", csr::BOOTSTRAP_SIGNER))
                .limit(1),
        )
        .await;
    let signers: Vec<Option<&str>> = match selectable {
        Ok(_) => vec![Some(csr::BOOTSTRAP_SIGNER), Some(csr::SERVING_SIGNER)],
        Err(kube::Error::Api(s)) if s.code == 400 => vec![None],
        Err(e) => return Ended::Unreachable(format!("listing CSRs: {e}")),
    };
    let mut streams: Vec<BoxStream<'static, Seen>> = Vec::new();
    let mut csr_stores = Vec::new();
    for signer in &signers {
        let config = match signer {
            Some(s) => watcher::Config::default().fields(&format!("spec.signerName={s}")),
            None => watcher::Config::default(),
        };
        let (reader, writer) = reflector::store();
        let index = streams.len();
        streams.push(watched(
            index,
            watcher(csrs.clone(), config)
                .modify(|c: &mut CertificateSigningRequest| c.metadata.managed_fields = None)
                .reflect(writer),
        ));
        csr_stores.push(reader);
    }
    let (nodes, node_writer) = reflector::store();
    let index = streams.len();
    streams.push(watched(
        index,
        watcher(Api::<Node>::all(hosted.clone()), watcher::Config::default())
            .modify(|n: &mut Node| n.metadata.managed_fields = None)
            .reflect(node_writer),
    ));
    let dpu_namespace = provisioner.spec.dpu_cluster_ref.namespace.clone();
    let dpu_writer = reflector::store::Writer::<DynamicObject>::new(dpu_resource());
    let dpus = dpu_writer.as_reader();
    let index = streams.len();
    // Management-cluster trouble is not the hosted cluster's: retried.
    streams.push(
        watcher(
            Api::<DynamicObject>::namespaced_with(
                ctx.client.clone(),
                &dpu_namespace,
                &dpu_resource(),
            ),
            watcher::Config::default(),
        )
        .reflect(dpu_writer)
        .default_backoff()
        .map(move |e| match e {
            Ok(watcher::Event::InitDone) => Seen::Listed(index),
            Ok(_) => Seen::Changed,
            Err(e) => {
                tracing::warn!(error = %e, "watching DPUs");
                Seen::Tick
            }
        })
        .boxed(),
    );
    let watches = streams.len();
    streams.push(
        stream::unfold((), |()| async {
            tokio::time::sleep(RESYNC).await;
            Some((Seen::Tick, ()))
        })
        .boxed(),
    );
    let mut merged = stream::select_all(streams);
    let mut listed = vec![false; watches];
    let mut state = Approvals::from_record(current_record(ctx, &key).as_ref());
    let mut seen: HashMap<String, &'static str> = HashMap::new();
    let deadline = tokio::time::sleep(SESSION);
    let mut deadline = pin!(deadline);
    tracing::info!(
        provisioner = name,
        namespace,
        identity,
        "CSR approver watching the hosted cluster"
    );
    loop {
        let event = tokio::select! {
            _ = &mut deadline => return Ended::Renew,
            e = merged.next() => e,
        };
        match event {
            None => return Ended::Unreachable("the watches ended".into()),
            Some(Seen::Failed(e)) => return Ended::Unreachable(e),
            Some(Seen::Listed(i)) => listed[i] = true,
            Some(Seen::Changed | Seen::Tick) => {}
        }
        // Until every first list is in, a missing Node may only be one not
        // listed yet: nothing is decided.
        if !listed.iter().all(|l| *l) {
            continue;
        }
        let Some(provisioner) = ctx.provisioners.get(&key) else {
            return Ended::Gone;
        };
        let mut all: Vec<Arc<CertificateSigningRequest>> =
            csr_stores.iter().flat_map(Store::state).collect();
        all.retain(|c| csr::kind_of(&c.spec.signer_name).is_some());
        let pass = Pass {
            ctx,
            provisioner: &provisioner,
            identity,
            hosted: &hosted,
        };
        if let Err(e) = pass
            .run(&all, &nodes.state(), &dpus.state(), &mut state, &mut seen)
            .await
        {
            tracing::warn!(provisioner = name, namespace, error = %e, "CSR approval pass");
        }
    }
}

/// The approvals later requests are held to, as kept in the status.
#[derive(Debug, Clone, Default, PartialEq)]
struct Approvals {
    bootstrap: BTreeMap<String, BootstrapApproval>,
    serving: BTreeMap<String, ServingApproval>,
}

impl Approvals {
    fn from_record(record: Option<&CsrApprovalStatus>) -> Self {
        let mut a = Approvals::default();
        if let Some(r) = record {
            for b in &r.bootstrap {
                a.bootstrap.insert(b.node.clone(), b.clone());
            }
            for s in &r.serving {
                a.serving.insert(s.node.clone(), s.clone());
            }
        }
        a
    }

    /// Drops what belongs to an earlier provisioning cycle: the DPU was
    /// recreated, is gone, or is being installed again.
    fn forget_old_cycles(&mut self, dpus: &BTreeMap<String, (String, String)>) {
        let current = |node: &str, uid: &str| {
            dpus.get(node)
                .is_some_and(|(u, phase)| u == uid && phase != REPROVISIONING_PHASE)
        };
        self.bootstrap.retain(|n, b| current(n, &b.dpu_uid));
        self.serving.retain(|n, s| current(n, &s.dpu_uid));
    }
}

struct Pass<'a> {
    ctx: &'a Context,
    provisioner: &'a DPFHCPProvisioner,
    identity: &'static str,
    hosted: &'a Client,
}

fn undecided(c: &CertificateSigningRequest) -> bool {
    let status = c.status.as_ref();
    status.and_then(|s| s.certificate.as_ref()).is_none()
        && !status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
            })
}

/// What the decision reads of a CSR object.
pub fn csr_of(c: &CertificateSigningRequest) -> Csr {
    Csr {
        uid: c.metadata.uid.clone().unwrap_or_default(),
        signer: c.spec.signer_name.clone(),
        username: c.spec.username.clone().unwrap_or_default(),
        groups: c.spec.groups.clone().unwrap_or_default(),
        usages: c.spec.usages.clone().unwrap_or_default(),
        request: c.spec.request.0.clone(),
        expiration_seconds: c.spec.expiration_seconds,
        decided: !undecided(c),
    }
}

/// The hosted cluster's Service and machine networks, from the spec as the
/// bridge resolves it (defaults filled in). A spec that does not check out
/// still has the default Service network, which is never signed for.
fn networks(p: &DPFHCPProvisioner) -> (Vec<IpNet>, Vec<IpNet>) {
    let parse = |entries: &[super::crd::NetworkEntry]| -> Vec<IpNet> {
        entries.iter().filter_map(|e| e.cidr.parse().ok()).collect()
    };
    match spec::check(&p.spec) {
        Ok(c) => (
            parse(&c.networking.service_network),
            parse(&c.networking.machine_network),
        ),
        Err(_) => (
            spec::DEFAULT_SERVICE_NETWORK.parse().into_iter().collect(),
            Vec::new(),
        ),
    }
}

/// The policy of one hosted cluster, from its provisioner's spec.
fn policy_of(
    p: &DPFHCPProvisioner,
    service_networks: Vec<IpNet>,
    options: &ApproverOptions,
    max_pending: usize,
) -> Policy {
    Policy {
        max_expiration_seconds: options.max_expiration_seconds,
        service_networks,
        vips: spec::virtual_ip(&p.spec)
            .and_then(|v| v.parse().ok())
            .into_iter()
            .collect(),
        cluster_domain: CLUSTER_DOMAIN.into(),
        max_pending,
    }
}

impl Pass<'_> {
    async fn run(
        &self,
        csrs: &[Arc<CertificateSigningRequest>],
        nodes: &[Arc<Node>],
        dpus: &[Arc<DynamicObject>],
        approvals: &mut Approvals,
        seen: &mut HashMap<String, &'static str>,
    ) -> Result<(), kube::Error> {
        let p = self.provisioner;
        let namespace = p.namespace().unwrap_or_default();
        let name = p.name_any();
        let (service_networks, networks) = networks(p);
        let mut inventory = Inventory::default();
        let mut dpu_ids = BTreeMap::new();
        for d in dpus {
            let phase = d
                .data
                .pointer("/status/phase")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            dpu_ids.insert(d.name_any(), (d.uid().unwrap_or_default(), phase.clone()));
            inventory.dpus.insert(
                d.name_any(),
                csr::Dpu {
                    phase,
                    management_networks: networks.clone(),
                },
            );
        }
        for n in nodes {
            let addresses = n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| {
                    a.iter()
                        .map(|a| (a.type_.clone(), a.address.clone()))
                        .collect()
                })
                .unwrap_or_default();
            inventory
                .nodes
                .insert(n.name_any(), csr::Node { addresses });
        }
        let before = approvals.clone();
        approvals.forget_old_cycles(&dpu_ids);

        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let mut pending: Vec<&Arc<CertificateSigningRequest>> =
            csrs.iter().filter(|c| undecided(c)).collect();
        pending.sort_by_key(|c| {
            (
                c.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second()),
                c.name_any(),
            )
        });
        let recent = pending
            .iter()
            .filter(|c| {
                c.metadata
                    .creation_timestamp
                    .as_ref()
                    .is_none_or(|t| now - t.0.as_second() < PENDING_WINDOW_SECONDS)
            })
            .count();
        let max_pending =
            inventory.dpus.len().max(inventory.nodes.len()) + self.ctx.options.pending_slack;
        let policy = policy_of(p, service_networks, &self.ctx.options, max_pending);
        let mut history = History {
            approved_bootstrap: approvals
                .bootstrap
                .iter()
                .map(|(n, b)| (n.clone(), b.csr_uid.clone()))
                .collect(),
            pending: recent,
            serving_sans: approvals
                .serving
                .iter()
                .map(|(n, s)| (n.clone(), s.sans.iter().cloned().collect()))
                .collect(),
            ..History::default()
        };
        for c in &pending {
            if c.spec.signer_name == csr::BOOTSTRAP_SIGNER {
                if let Some(node) = csr::requested_node(&c.spec.request.0) {
                    history
                        .pending_bootstrap
                        .entry(node)
                        .or_default()
                        .insert(c.metadata.uid.clone().unwrap_or_default());
                }
            }
        }
        if let Some(m) = &self.ctx.metrics {
            m.csr_pending(&namespace, &name, Some((clamp(recent), clamp(max_pending))));
        }
        let flooded = recent > max_pending;
        let (reason, message) = if flooded {
            ("TooManyPendingCSRs", format!("{recent} kubelet CSRs are pending in the hosted cluster, over the cap of {max_pending}: nothing is approved until they are cleared"))
        } else {
            (
                "Active",
                format!(
                    "approving kubelet CSRs of the hosted cluster's DPUs, as {}",
                    self.identity
                ),
            )
        };
        let mut record = CsrApprovalStatus {
            active: !flooded,
            reason: reason.into(),
            message,
            bootstrap: approvals.bootstrap.values().cloned().collect(),
            serving: approvals.serving.values().cloned().collect(),
        };
        let written = p.status.as_ref().and_then(|s| s.csr_approval.as_ref());
        if written != Some(&record) || before != *approvals {
            write_record(&self.ctx.client, &namespace, &name, &record).await?;
        }
        if flooded {
            tracing::warn!(provisioner = %name, %namespace, pending = recent, cap = max_pending, "too many pending kubelet CSRs: approving nothing");
        }

        let live: BTreeSet<String> = csrs.iter().filter_map(|c| c.metadata.uid.clone()).collect();
        seen.retain(|uid, _| live.contains(uid));
        for c in pending {
            let request = csr_of(c);
            let decision = csr::decide(&request, &inventory, &policy, &history);
            let kind = match csr::kind_of(&request.signer) {
                Some(Kind::Bootstrap) => "bootstrap",
                Some(Kind::Serving) => "serving",
                None => continue,
            };
            let first = seen.insert(request.uid.clone(), decision.reason) != Some(decision.reason);
            match decision.verdict {
                Verdict::Ignore => {
                    if first {
                        self.count(kind, "ignore", decision.reason);
                        tracing::debug!(csr = %c.name_any(), reason = decision.reason, message = %decision.message, "CSR left pending");
                    }
                }
                Verdict::Deny => {
                    if self.conclude(c, &decision).await? {
                        self.count(kind, "deny", decision.reason);
                        tracing::warn!(csr = %c.name_any(), user = %request.username, reason = decision.reason, message = %decision.message, "CSR denied");
                        self.event(
                            c,
                            EventType::Warning,
                            "CSRDenied",
                            format!(
                                "{}: {} ({})",
                                c.name_any(),
                                decision.message,
                                decision.reason
                            ),
                        )
                        .await;
                    }
                }
                Verdict::Approve => {
                    // Recorded before approving: if the approval is lost
                    // the record still holds, and it names this CSR, which
                    // the next pass may approve again.
                    let node = c
                        .spec
                        .username
                        .as_deref()
                        .and_then(|u| u.strip_prefix("system:node:"))
                        .map(str::to_string)
                        .or_else(|| csr::requested_node(&request.request))
                        .unwrap_or_default();
                    let dpu_uid = dpu_ids
                        .get(&node)
                        .map(|(u, _)| u.clone())
                        .unwrap_or_default();
                    match kind {
                        "bootstrap" => {
                            approvals.bootstrap.insert(
                                node.clone(),
                                BootstrapApproval {
                                    node: node.clone(),
                                    csr_uid: request.uid.clone(),
                                    dpu_uid,
                                    approved_at: k8s_openapi::jiff::Timestamp::now().to_string(),
                                },
                            );
                            history
                                .approved_bootstrap
                                .insert(node.clone(), request.uid.clone());
                        }
                        _ => {
                            let mut sans: BTreeSet<String> = approvals
                                .serving
                                .get(&node)
                                .map(|s| s.sans.iter().cloned().collect())
                                .unwrap_or_default();
                            sans.extend(csr::requested_sans(&request.request));
                            history.serving_sans.insert(node.clone(), sans.clone());
                            approvals.serving.insert(
                                node.clone(),
                                ServingApproval {
                                    node: node.clone(),
                                    dpu_uid,
                                    sans: sans.into_iter().collect(),
                                },
                            );
                        }
                    }
                    record.bootstrap = approvals.bootstrap.values().cloned().collect();
                    record.serving = approvals.serving.values().cloned().collect();
                    write_record(&self.ctx.client, &namespace, &name, &record).await?;
                    if self.conclude(c, &decision).await? {
                        self.count(kind, "approve", decision.reason);
                        tracing::info!(csr = %c.name_any(), node = %node, kind, "CSR approved");
                        self.event(
                            c,
                            EventType::Normal,
                            "CSRApproved",
                            format!("{}: {}", c.name_any(), decision.message),
                        )
                        .await;
                    }
                }
            }
        }
        Ok(())
    }

    fn count(&self, kind: &str, verdict: &str, reason: &str) {
        if let Some(m) = &self.ctx.metrics {
            m.csr_decision(kind, verdict, reason);
        }
    }

    async fn event(
        &self,
        c: &CertificateSigningRequest,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let csr = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("certificates.k8s.io/v1".into()),
            kind: Some("CertificateSigningRequest".into()),
            name: c.metadata.name.clone(),
            uid: c.metadata.uid.clone(),
            ..Default::default()
        };
        publish_related_event(
            self.ctx.recorder.as_ref(),
            &self.provisioner.object_ref(&()),
            Some(csr),
            type_,
            reason,
            note,
        )
        .await;
    }

    /// Writes the verdict through `/approval`, guarded by the version the
    /// decision read: a CSR changed since is decided again on the next
    /// pass. `Ok(false)` when it changed or is gone.
    async fn conclude(
        &self,
        c: &CertificateSigningRequest,
        decision: &Decision,
    ) -> Result<bool, kube::Error> {
        let type_ = if decision.verdict == Verdict::Approve {
            "Approved"
        } else {
            "Denied"
        };
        let body = json!({
            "metadata": {"resourceVersion": c.metadata.resource_version},
            "status": {"conditions": [{
                "type": type_,
                "status": "True",
                "reason": decision.reason,
                "message": decision.message,
                "lastUpdateTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]},
        });
        let api: Api<CertificateSigningRequest> = Api::all(self.hosted.clone());
        match api
            .patch_approval(&c.name_any(), &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn clamp(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn approvals_of_an_earlier_cycle_are_forgotten() {
        let mut a = Approvals::default();
        for (node, uid) in [("dpu-a", "u1"), ("dpu-b", "u2"), ("dpu-c", "u3")] {
            a.bootstrap.insert(
                node.into(),
                BootstrapApproval {
                    node: node.into(),
                    csr_uid: format!("csr-{node}"),
                    dpu_uid: uid.into(),
                    approved_at: String::new(),
                },
            );
        }
        let dpus: BTreeMap<String, (String, String)> = [
            ("dpu-a", "u1", "Ready"),
            ("dpu-b", "u2-recreated", "DPU Cluster Config"),
            ("dpu-c", "u3", REPROVISIONING_PHASE),
        ]
        .into_iter()
        .map(|(n, u, p)| (n.to_string(), (u.to_string(), p.to_string())))
        .collect();
        a.forget_old_cycles(&dpus);
        assert_eq!(a.bootstrap.keys().collect::<Vec<_>>(), ["dpu-a"]);
    }

    #[test]
    fn the_hosted_role_approves_for_the_two_kubelet_signers_only() {
        let role = hosted_role();
        let rules = role["rules"].as_array().unwrap();
        let approve: Vec<_> = rules
            .iter()
            .filter(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v == "approve")
            })
            .collect();
        assert_eq!(approve.len(), 1);
        assert_eq!(approve[0]["resources"], json!(["signers"]));
        assert_eq!(
            approve[0]["resourceNames"],
            json!([csr::BOOTSTRAP_SIGNER, csr::SERVING_SIGNER])
        );
        // Nothing may be created, deleted or written but the approval.
        for r in rules {
            for v in r["verbs"].as_array().unwrap() {
                assert!(
                    ["get", "list", "watch", "approve"].contains(&v.as_str().unwrap())
                        || (v == "patch"
                            && r["resources"] == json!(["certificatesigningrequests/approval"])),
                    "{r}"
                );
            }
        }
    }
}
