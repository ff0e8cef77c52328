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
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::ApiResource;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::task::{AbortHandle, JoinSet};

use super::crd::{
    BlockedJoin, BootstrapApproval, CsrApprovalStatus, DPFHCPProvisioner, JoiningDpu,
    ServingApproval,
};
use super::csr::{self, Csr, Decision, History, Inventory, Kind, Policy, Verdict};
use super::hosted_access::{admin_client, least_privilege, Unavailable};
pub use super::hosted_access::{APPROVER_MANAGER, HOSTED_ACCOUNT, HOSTED_NAMESPACE, HOSTED_ROLE};
use super::kubelet_cert;
use super::spec;
pub use crate::hosted::HostedEndpoint;
use crate::k8s::apply::{Applier, Noise};
use crate::k8s::events::{publish_event, publish_related_event};
use crate::k8s::metrics::OperatorMetrics;
use crate::k8s::resources::resource;
use crate::k8s::watch::{reflected_events, Scope};

/// The hosted cluster's DNS domain: names under it are never signed.
const CLUSTER_DOMAIN: &str = "cluster.local";
/// CSRs older than this do not count against the pending cap (the
/// controller-manager removes unapproved ones after a day).
const PENDING_WINDOW_SECONDS: i64 = 3600;
/// A session ends before its token (`hosted_access::TOKEN_SECONDS`) does,
/// and starts again with a new one.
const SESSION: Duration = Duration::from_secs(45 * 60);
/// Decisions are re-run this often even when nothing changed, so the
/// pending window moves and a missed event cannot strand a CSR.
const RESYNC: Duration = Duration::from_secs(30);
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A DPU in this phase is being provisioned again: its earlier approvals
/// belong to the previous cycle.
const REPROVISIONING_PHASE: &str = "OS Installing";
/// Writes of the approval record retried on a conflict before the pass
/// gives up (and approves nothing).
const RECORD_ATTEMPTS: usize = 5;
/// Annotations the approver puts on its cached copy of a CSR whose request
/// was too large to keep (never written to the API server).
const OVERSIZED_BYTES: &str = "causeway.internal/oversized-request-bytes";
const OVERSIZED_CLAIM: &str = "causeway.internal/oversized-request-node";
/// The bootstrap hold-down: a DPU's kubelet waits this much longer to
/// join, and a requester racing it for its identity must be this much
/// ahead of it to be more than denied.
pub const BOOTSTRAP_HOLD_SECONDS: i64 = 15;
/// CSRs a page of the first list (and every re-list) holds: at most about
/// 8 MiB of JSON of the largest the API server stores, where the watcher's
/// default of 500 would be 900 MiB. Measured by csr_kube: a session start
/// with 48 CSRs of 1.4 MiB pending raised the operator's peak memory by
/// 43 MiB at 4 a page, 65 MiB at 10 and 215 MiB at 500.
const CSR_PAGE: u32 = 4;
/// Kubelets whose live serving certificate a pass reads at once: each read
/// is bounded by `kubelet_cert::FETCH_TIMEOUT`, so a pass of many renewals
/// at unreachable kubelets waits seconds, not minutes.
const LIVE_READS_AT_ONCE: usize = 16;
/// Events that arrive within this of the one that started a pass join it:
/// a burst of Node or CSR changes costs one pass, not one each.
const DEBOUNCE: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct ApproverOptions {
    pub endpoint: HostedEndpoint,
    /// Requests asking for a longer `expirationSeconds` are denied.
    pub max_expiration_seconds: i32,
    /// The pending cap is the number of DPUs (or Nodes, if more) plus this.
    pub pending_slack: usize,
    /// How much earlier than the DPU was seen joining its bootstrap CSR may
    /// have been made: the hosted API server's clock is not ours.
    pub creation_skew_seconds: i64,
    /// How old a bootstrap CSR must be before it is approved; a second
    /// requester for the same identity meanwhile gets both denied.
    pub bootstrap_hold_seconds: i64,
    /// The hosted cluster's ConfigMap (namespace, name) whose
    /// `ca-bundle.crt` verifies kubelet serving certificates: with it, a
    /// serving renewal is held to the kubelet's live certificate where it
    /// can be read. `None`: renewals are held to the recorded SANs only.
    pub kubelet_serving_ca: Option<(String, String)>,
}

/// Where HyperShift's hosted cluster keeps the CA of its kubelets' serving
/// certificates (written by its hosted-cluster-config-operator).
pub const KUBELET_SERVING_CA: (&str, &str) = ("openshift-config-managed", "kubelet-serving-ca");

impl Default for ApproverOptions {
    fn default() -> Self {
        ApproverOptions {
            endpoint: HostedEndpoint::Service,
            // A year and two days, as kubelet-csr-approver allows.
            max_expiration_seconds: 367 * 24 * 3600,
            pending_slack: 20,
            creation_skew_seconds: 10,
            bootstrap_hold_seconds: BOOTSTRAP_HOLD_SECONDS,
            kubelet_serving_ca: Some((
                KUBELET_SERVING_CA.0.to_string(),
                KUBELET_SERVING_CA.1.to_string(),
            )),
        }
    }
}

pub fn dpu_resource() -> ApiResource {
    resource("provisioning.dpu.nvidia.com", "v1alpha1", "DPU", "dpus")
}

/// Whether a DPU in the DPUCluster's namespace belongs to that DPUCluster:
/// its `spec.cluster` names it. A DPU that names no cluster (DPF releases
/// without the field) is taken as the namespace's.
fn of_cluster(dpu: &DynamicObject, cluster: &super::crd::ObjectRef) -> bool {
    let named = |field: &str| {
        dpu.data
            .pointer(&format!("/spec/cluster/{field}"))
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    named("name").is_none_or(|n| n == cluster.name)
        && named("namespace").is_none_or(|n| n == cluster.namespace)
}

fn infra_resource() -> ApiResource {
    resource(
        "hostedcluster.densityops.com",
        "v1alpha1",
        "Infra",
        "infras",
    )
}

/// Which host each reserved address was given to, from the Infras' DHCP
/// reservations that name a hostname. An address reserved for two hosts
/// is nobody's (an empty name), so neither gets it signed.
fn assigned_addresses(infras: &[Arc<DynamicObject>]) -> BTreeMap<std::net::IpAddr, String> {
    let mut assigned: BTreeMap<std::net::IpAddr, String> = BTreeMap::new();
    for infra in infras {
        let Some(reservations) = infra
            .data
            .pointer("/spec/infraComponents/dhcp/reservations")
            .and_then(|r| r.as_array())
        else {
            continue;
        };
        for r in reservations {
            let (Some(ip), Some(host)) = (
                r.get("ip")
                    .and_then(|v| v.as_str())
                    .and_then(|v| v.trim().parse::<std::net::IpAddr>().ok()),
                r.get("hostname").and_then(|v| v.as_str()),
            ) else {
                continue;
            };
            let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
            match assigned.get(&ip.to_canonical()) {
                Some(other) if *other != host => {
                    assigned.insert(ip.to_canonical(), String::new());
                }
                Some(_) => {}
                None => {
                    assigned.insert(ip.to_canonical(), host);
                }
            }
        }
    }
    assigned
}

struct Context {
    client: Client,
    /// Writes the provisioners' approval records.
    applier: Applier,
    provisioners: Store<DPFHCPProvisioner>,
    /// The Infras (read as plain objects: the DPF bridge does not import
    /// the Infra controller's types), whose DHCP reservations say which
    /// address the management side gave which host.
    infras: Store<DynamicObject>,
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
    /// The approver's own identity could not be set up in the hosted
    /// cluster: it does not fall back to the admin kubeconfig.
    NoLeastPrivilege(String),
}

pub async fn run(
    client: Client,
    scope: Scope,
    options: ApproverOptions,
    recorder: Option<Recorder>,
    metrics: Option<OperatorMetrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    // Every watch event counts, the end of the first list included: the
    // store shows the listed objects only from then, so a trigger on the
    // objects alone could leave an unchanging provisioner without a
    // session after a restart.
    let (provisioners, writer) = reflector::store();
    let events = reflected_events(
        scope.api::<DPFHCPProvisioner>(&client),
        watcher::Config::default(),
        writer,
    );
    let infra_writer = reflector::store::Writer::<DynamicObject>::new(infra_resource());
    let infras = infra_writer.as_reader();
    let infra_api = match &scope {
        Scope::All => Api::<DynamicObject>::all_with(client.clone(), &infra_resource()),
        Scope::Namespace(ns) => {
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &infra_resource())
        }
    };
    // Where the Infra kind is not served, the store stays empty and no IP
    // SAN is approved: retried with backoff, never an error of the pass.
    let infra_watch = tokio::spawn(
        reflected_events(infra_api, watcher::Config::default(), infra_writer).for_each(
            |e| async move {
                if let Err(e) = e {
                    tracing::debug!(error = %e, "CSR approver: watching Infras");
                }
            },
        ),
    );
    let ctx = Arc::new(Context {
        applier: Applier::new(client.clone(), metrics.clone(), Noise::Debug),
        client,
        provisioners: provisioners.clone(),
        infras,
        options,
        recorder,
        metrics,
    });
    let mut sessions = Sessions::default();
    let mut events = pin!(events);
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            next = events.next() => if next.is_none() { break },
        }
        let live: HashMap<_, _> = provisioners
            .state()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| (ObjectRef::from_obj(&*p), p.uid().unwrap_or_default()))
            .collect();
        sessions.follow(
            live,
            |key| {
                tracing::info!(provisioner = %key.name, namespace = ?key.namespace, "CSR approver starting");
                supervise(ctx.clone(), key.clone())
            },
            |key| {
                if let (Some(m), Some(ns)) = (&ctx.metrics, &key.namespace) {
                    m.csr_pending(ns, &key.name, None);
                }
                tracing::info!(provisioner = %key.name, namespace = ?key.namespace, "CSR approver stopped");
            },
        );
    }
    sessions.tasks.shutdown().await;
    infra_watch.abort();
}

/// One session task per live provisioner. Every task lives in the
/// JoinSet, so dropping this (the approver returning, or its task aborted
/// when the replica loses leadership) aborts them all: no session of a
/// replica without the lease goes on approving.
#[derive(Default)]
struct Sessions {
    tasks: JoinSet<()>,
    running: HashMap<ObjectRef<DPFHCPProvisioner>, (String, AbortHandle)>,
}

impl Sessions {
    /// Starts a session for each live provisioner (by key and UID) that has
    /// none, and stops those whose provisioner is gone, was recreated
    /// under the same name (a new UID) or whose session ended.
    fn follow<F>(
        &mut self,
        live: HashMap<ObjectRef<DPFHCPProvisioner>, String>,
        mut start: impl FnMut(&ObjectRef<DPFHCPProvisioner>) -> F,
        mut stopped: impl FnMut(&ObjectRef<DPFHCPProvisioner>),
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        while self.tasks.try_join_next().is_some() {}
        self.running.retain(|key, (uid, task)| {
            let keep = live.get(key) == Some(uid) && !task.is_finished();
            if !keep {
                task.abort();
                stopped(key);
            }
            keep
        });
        for (key, uid) in live {
            if !self.running.contains_key(&key) {
                let task = self.tasks.spawn(start(&key));
                self.running.insert(key, (uid, task));
            }
        }
    }
}

/// Runs sessions for one provisioner until it is gone, backing off while
/// its hosted cluster cannot be reached.
/// Removes a session's `causeway_operator_csr_pending` series when
/// dropped with the session's task.
struct PendingGauge {
    ctx: Arc<Context>,
    namespace: String,
    name: String,
}

impl Drop for PendingGauge {
    fn drop(&mut self) {
        if let Some(m) = &self.ctx.metrics {
            m.csr_pending(&self.namespace, &self.name, None);
        }
    }
}

async fn supervise(ctx: Arc<Context>, key: ObjectRef<DPFHCPProvisioner>) {
    let Some(namespace) = key.namespace.clone() else {
        return;
    };
    if let Some(m) = &ctx.metrics {
        m.approver_started(&namespace, &key.name);
    }
    // The session's pending-CSR gauge goes when the task does, aborted or
    // ended: the stop callback's removal can run while a pass on another
    // worker is setting it, which left the series behind once in CI.
    let _gauge = PendingGauge {
        ctx: ctx.clone(),
        namespace: namespace.clone(),
        name: key.name.clone(),
    };
    let mut delay = BACKOFF_MIN;
    let mut last_reason = "";
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
            Ended::NoLeastPrivilege(m) => ("LeastPrivilegeUnavailable", m),
        };
        // Something changed: the next try need not wait out the old backoff.
        if reason != last_reason {
            delay = BACKOFF_MIN;
            last_reason = reason;
        }
        tracing::warn!(provisioner = %key.name, %namespace, reason, %message, retry_in = ?delay, "CSR approver not running: nothing is approved");
        if reason == "HostedClusterNotReachable" {
            let about = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some(DPFHCPProvisioner::api_version(&()).into_owned()),
                kind: Some(DPFHCPProvisioner::kind(&()).into_owned()),
                name: Some(key.name.clone()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            };
            publish_event(
                ctx.recorder.as_ref(),
                &about,
                EventType::Warning,
                "HostedClusterUnreachable",
                format!("Cannot connect to hosted cluster: {message}"),
            )
            .await;
        }
        if let Some(m) = &ctx.metrics {
            m.csr_not_running(&namespace, &key.name, reason);
        }
        let written = update_record(&ctx.client, &ctx.applier, &namespace, &key.name, |record| {
            record.active = false;
            record.reason = reason.into();
            record.message = message.clone();
        })
        .await;
        if let Err(e) = written {
            tracing::warn!(provisioner = %key.name, %namespace, error = %e, "could not write the approver's status");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(BACKOFF_MAX);
    }
}

/// Reads the provisioner's approval record fresh from the API server,
/// lets `change` edit it, and writes it back under the resourceVersion it
/// read, again from a fresh read if someone wrote in between: the record
/// is never rebuilt from a cache, so nothing another writer (an earlier
/// session, another replica) recorded is lost. `Ok(None)` when the
/// provisioner is gone.
async fn update_record<T>(
    client: &Client,
    applier: &Applier,
    namespace: &str,
    name: &str,
    mut change: impl FnMut(&mut CsrApprovalStatus) -> T,
) -> Result<Option<(CsrApprovalStatus, T)>, kube::Error> {
    let api: Api<DPFHCPProvisioner> = Api::namespaced(client.clone(), namespace);
    for _ in 0..RECORD_ATTEMPTS {
        let Some(p) = api.get_opt(name).await? else {
            return Ok(None);
        };
        let found = p.status.as_ref().and_then(|s| s.csr_approval.clone());
        let mut record = found.clone().unwrap_or_default();
        let out = change(&mut record);
        if found.as_ref() == Some(&record) {
            return Ok(Some((record, out)));
        }
        let mut value =
            serde_json::to_value(&record).map_err(|e| kube::Error::Service(Box::new(e)))?;
        // A merge patch leaves out what is absent: lists emptied are
        // written as null so they go.
        if let Some(fields) = value.as_object_mut() {
            for list in ["bootstrap", "serving", "joining", "blockedJoins"] {
                fields.entry(list).or_insert(serde_json::Value::Null);
            }
        }
        let body = json!({
            "metadata": {"resourceVersion": p.metadata.resource_version},
            "status": {"csrApproval": value},
        });
        let params = PatchParams {
            field_manager: Some(APPROVER_MANAGER.into()),
            ..Default::default()
        };
        match applier
            .patch_status(
                &api,
                "DPFHCPProvisioner",
                name,
                &params,
                &Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => return Ok(Some((record, out))),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Service(Box::new(std::io::Error::other(
        format!("the approval record of {namespace}/{name} changed under every one of {RECORD_ATTEMPTS} writes"),
    ))))
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
    let (config, admin) =
        match admin_client(&ctx.client, ctx.options.endpoint, namespace, name).await {
            Ok(c) => c,
            Err(Unavailable::NoKubeconfig(why)) => return Ended::NoKubeconfig(why),
            Err(Unavailable::Unreachable(why)) => return Ended::Unreachable(why),
        };
    match tokio::time::timeout(Duration::from_secs(15), admin.apiserver_version()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Ended::Unreachable(format!("{e}")),
        Err(_) => return Ended::Unreachable("no answer within 15 s".into()),
    }
    let serving_ca = ctx
        .options
        .kubelet_serving_ca
        .as_ref()
        .map(|(_, name)| name.as_str());
    let hosted = match least_privilege(&admin, &config, serving_ca).await {
        Ok(c) => c,
        Err(e) => {
            return Ended::NoLeastPrivilege(format!(
                "could not give the approver its own ServiceAccount in the hosted cluster: {e}"
            ))
        }
    };
    let identity = "its own ServiceAccount";

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
        // Small pages: a CSR may be 1.5 MiB, and a page is held whole,
        // parsed, before `keep_small` sees any of it.
        let config = watcher::Config::default().page_size(CSR_PAGE);
        let config = match signer {
            Some(s) => config.fields(&format!("spec.signerName={s}")),
            None => config,
        };
        let (reader, writer) = reflector::store();
        let index = streams.len();
        streams.push(watched(
            index,
            watcher(csrs.clone(), config)
                .modify(keep_small)
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
        reflected_events(
            Api::<DynamicObject>::namespaced_with(
                ctx.client.clone(),
                &dpu_namespace,
                &dpu_resource(),
            ),
            watcher::Config::default(),
            dpu_writer,
        )
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
    let mut seen: HashMap<String, &'static str> = HashMap::new();
    let deadline = tokio::time::sleep(SESSION);
    let mut deadline = pin!(deadline);
    tracing::info!(
        provisioner = name,
        namespace,
        identity,
        "CSR approver watching the hosted cluster"
    );
    let mut wake_at: Option<tokio::time::Instant> = None;
    loop {
        let held = async {
            match wake_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            _ = &mut deadline => return Ended::Renew,
            _ = held => Some(Seen::Tick),
            e = merged.next() => e,
        };
        match event {
            None => return Ended::Unreachable("the watches ended".into()),
            Some(Seen::Failed(e)) => return Ended::Unreachable(e),
            Some(Seen::Listed(i)) => listed[i] = true,
            Some(Seen::Changed | Seen::Tick) => {}
        }
        // Whatever else arrives within the window joins this pass. The
        // window does not restart, so a steady stream still gets a pass
        // every DEBOUNCE.
        if listed.iter().all(|l| *l) {
            let window = tokio::time::sleep(DEBOUNCE);
            let mut window = pin!(window);
            loop {
                let more = tokio::select! {
                    _ = &mut window => break,
                    e = merged.next() => e,
                };
                match more {
                    None => return Ended::Unreachable("the watches ended".into()),
                    Some(Seen::Failed(e)) => return Ended::Unreachable(e),
                    Some(Seen::Listed(i)) => listed[i] = true,
                    Some(Seen::Changed | Seen::Tick) => {}
                }
            }
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
        if let Some(m) = &ctx.metrics {
            m.csr_pass();
        }
        match pass
            .run(&all, &nodes.state(), &dpus.state(), &mut seen)
            .await
        {
            Ok(wake) => wake_at = wake.map(|w| tokio::time::Instant::now() + w),
            Err(e) => {
                wake_at = None;
                tracing::warn!(provisioner = name, namespace, error = %e, "CSR approval pass");
            }
        }
    }
}

/// The approvals later requests are held to, and when each DPU began
/// joining, as kept in the status.
#[derive(Debug, Clone, Default, PartialEq)]
struct Approvals {
    bootstrap: BTreeMap<String, BootstrapApproval>,
    serving: BTreeMap<String, ServingApproval>,
    joining: BTreeMap<String, JoiningDpu>,
}

/// A DPU's UID and phase, by name.
type DpuIds = BTreeMap<String, (String, String)>;

impl Approvals {
    fn from_record(record: &CsrApprovalStatus) -> Self {
        Approvals {
            bootstrap: record
                .bootstrap
                .iter()
                .map(|b| (b.node.clone(), b.clone()))
                .collect(),
            serving: record
                .serving
                .iter()
                .map(|s| (s.node.clone(), s.clone()))
                .collect(),
            joining: record
                .joining
                .iter()
                .map(|j| (j.node.clone(), j.clone()))
                .collect(),
        }
    }

    fn store(&self, record: &mut CsrApprovalStatus) {
        record.bootstrap = self.bootstrap.values().cloned().collect();
        record.serving = self.serving.values().cloned().collect();
        record.joining = self.joining.values().cloned().collect();
    }

    /// Drops what belongs to an earlier provisioning cycle: the DPU was
    /// recreated, is gone, or is being installed again. A joining time
    /// lasts only while the DPU is joining.
    fn forget_old_cycles(&mut self, dpus: &DpuIds) {
        let current = |node: &str, uid: &str| {
            dpus.get(node)
                .is_some_and(|(u, phase)| u == uid && phase != REPROVISIONING_PHASE)
        };
        self.bootstrap.retain(|n, b| current(n, &b.dpu_uid));
        self.serving.retain(|n, s| current(n, &s.dpu_uid));
        self.joining.retain(|n, j| {
            dpus.get(n)
                .is_some_and(|(u, phase)| *u == j.dpu_uid && phase == csr::JOINING_PHASE)
        });
    }

    /// Notes `now` as the time each joining DPU not noted yet began joining.
    fn observe_joining(&mut self, dpus: &DpuIds, now: &str) {
        for (node, (uid, phase)) in dpus {
            if phase == csr::JOINING_PHASE && !self.joining.contains_key(node) {
                self.joining.insert(
                    node.clone(),
                    JoiningDpu {
                        node: node.clone(),
                        dpu_uid: uid.clone(),
                        since: now.to_string(),
                    },
                );
            }
        }
    }

    /// Adds an approval unless the record already holds another bootstrap
    /// approval for the node; `false` then, and nothing may be approved.
    fn add(&mut self, kind: Kind, node: &str, csr: &Csr, dpu_uid: &str, now: &str) -> bool {
        match kind {
            Kind::Bootstrap => {
                if self
                    .bootstrap
                    .get(node)
                    .is_some_and(|b| b.csr_uid != csr.uid)
                {
                    return false;
                }
                self.bootstrap.insert(
                    node.to_string(),
                    BootstrapApproval {
                        node: node.to_string(),
                        csr_uid: csr.uid.clone(),
                        dpu_uid: dpu_uid.to_string(),
                        approved_at: now.to_string(),
                    },
                );
            }
            Kind::Serving => {
                let mut sans: BTreeSet<String> = self
                    .serving
                    .get(node)
                    .map(|s| s.sans.iter().cloned().collect())
                    .unwrap_or_default();
                sans.extend(csr::requested_sans(&csr.request));
                self.serving.insert(
                    node.to_string(),
                    ServingApproval {
                        node: node.to_string(),
                        dpu_uid: dpu_uid.to_string(),
                        sans: sans.into_iter().collect(),
                    },
                );
            }
        }
        true
    }

    fn history(&self, pending: usize) -> History {
        History {
            approved_bootstrap: self
                .bootstrap
                .iter()
                .map(|(n, b)| (n.clone(), b.csr_uid.clone()))
                .collect(),
            pending,
            serving_sans: self
                .serving
                .iter()
                .map(|(n, s)| (n.clone(), s.sans.iter().cloned().collect()))
                .collect(),
            pending_bootstrap: BTreeMap::new(),
            live_serving: BTreeMap::new(),
            now: None,
        }
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

/// The undecided CSRs that count against the pending cap: made within the
/// window (the controller-manager removes unapproved ones after a day) and
/// able to be approved here at all ([`csr::could_be_ours`]).
fn pending_count(undecided: &[Csr], inventory: &Inventory, now_seconds: i64) -> usize {
    undecided
        .iter()
        .filter(|c| {
            c.created
                .is_none_or(|t| now_seconds - t < PENDING_WINDOW_SECONDS)
                && csr::could_be_ours(c, inventory)
        })
        .count()
}

/// What the cache keeps of a CSR: a request over
/// [`csr::MAX_REQUEST_BYTES`] is dropped, keeping only its size and the
/// node it names, so a flood of large requests cannot fill memory.
fn keep_small(c: &mut CertificateSigningRequest) {
    c.metadata.managed_fields = None;
    // The markers are ours alone: a requester that sets them on its CSR
    // must not pass for an oversized request, nor name its claim.
    if let Some(notes) = c.metadata.annotations.as_mut() {
        notes.remove(OVERSIZED_BYTES);
        notes.remove(OVERSIZED_CLAIM);
    }
    let bytes = c.spec.request.0.len();
    if bytes <= csr::MAX_REQUEST_BYTES {
        return;
    }
    let claim = csr::requested_node(&c.spec.request.0);
    c.spec.request.0 = Vec::new();
    let notes = c.metadata.annotations.get_or_insert_with(Default::default);
    notes.insert(OVERSIZED_BYTES.into(), bytes.to_string());
    if let Some(node) = claim {
        notes.insert(OVERSIZED_CLAIM.into(), node);
    }
}

/// What the decision reads of a CSR object.
pub fn csr_of(c: &CertificateSigningRequest) -> Csr {
    let notes = c.metadata.annotations.as_ref();
    let oversized = notes
        .and_then(|n| n.get(OVERSIZED_BYTES))
        .map(|bytes| csr::Oversized {
            bytes: bytes.parse().unwrap_or(usize::MAX),
            claimed_node: notes.and_then(|n| n.get(OVERSIZED_CLAIM)).cloned(),
        });
    Csr {
        uid: c.metadata.uid.clone().unwrap_or_default(),
        signer: c.spec.signer_name.clone(),
        username: c.spec.username.clone().unwrap_or_default(),
        groups: c.spec.groups.clone().unwrap_or_default(),
        usages: c.spec.usages.clone().unwrap_or_default(),
        request: c.spec.request.0.clone(),
        expiration_seconds: c.spec.expiration_seconds,
        decided: !undecided(c),
        created: c
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        oversized,
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
        creation_skew_seconds: options.creation_skew_seconds,
        bootstrap_hold_seconds: options.bootstrap_hold_seconds,
    }
}

impl Pass<'_> {
    async fn run(
        &self,
        csrs: &[Arc<CertificateSigningRequest>],
        nodes: &[Arc<Node>],
        dpus: &[Arc<DynamicObject>],
        seen: &mut HashMap<String, &'static str>,
    ) -> Result<Option<Duration>, kube::Error> {
        let p = self.provisioner;
        let namespace = p.namespace().unwrap_or_default();
        let name = p.name_any();
        let (service_networks, networks) = networks(p);
        let mut inventory = Inventory {
            assigned: assigned_addresses(&self.ctx.infras.state()),
            ..Inventory::default()
        };
        let mut dpu_ids: DpuIds = BTreeMap::new();
        for d in dpus
            .iter()
            .filter(|d| of_cluster(d, &p.spec.dpu_cluster_ref))
        {
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
                    joining_since: None,
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
            let kubelet_port = n
                .status
                .as_ref()
                .and_then(|s| s.daemon_endpoints.as_ref())
                .and_then(|d| d.kubelet_endpoint.as_ref())
                .and_then(|e| u16::try_from(e.port).ok());
            inventory.nodes.insert(
                n.name_any(),
                csr::Node {
                    addresses,
                    kubelet_port,
                },
            );
        }

        let now = k8s_openapi::jiff::Timestamp::now();
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
        // Read once: the count and the decisions use the same requests.
        let requests: Vec<Csr> = pending.iter().map(|c| csr_of(c)).collect();
        let recent = pending_count(&requests, &inventory, now.as_second());
        let max_pending =
            inventory.dpus.len().max(inventory.nodes.len()) + self.ctx.options.pending_slack;
        let policy = policy_of(p, service_networks, &self.ctx.options, max_pending);
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
        let stamp = now.to_string();
        let Some((_, mut approvals)) = update_record(
            &self.ctx.client,
            &self.ctx.applier,
            &namespace,
            &name,
            |record| {
                let mut a = Approvals::from_record(record);
                a.forget_old_cycles(&dpu_ids);
                a.observe_joining(&dpu_ids, &stamp);
                a.store(record);
                // A blocked join is over once its old Node is gone.
                record
                    .blocked_joins
                    .retain(|b| inventory.nodes.contains_key(&b.node));
                record.active = !flooded;
                record.reason = reason.into();
                record.message = message.clone();
                a
            },
        )
        .await?
        else {
            return Ok(None);
        };
        if flooded {
            tracing::warn!(provisioner = %name, %namespace, pending = recent, cap = max_pending, "too many pending kubelet CSRs: approving nothing");
        }
        for (node, joining) in &approvals.joining {
            if let Some(dpu) = inventory.dpus.get_mut(node) {
                dpu.joining_since = joining
                    .since
                    .parse::<k8s_openapi::jiff::Timestamp>()
                    .ok()
                    .map(|t| t.as_second());
            }
        }
        let mut history = approvals.history(recent);
        history.now = Some(now.as_second());
        history.pending_bootstrap =
            csr::approvable_bootstrap(&requests, &inventory, &policy, &history);

        // When the first bootstrap CSR held down comes out of it: the pass
        // runs again then, not at the next event or resync.
        let mut wake: Option<Duration> = None;
        let live: BTreeSet<String> = csrs.iter().filter_map(|c| c.metadata.uid.clone()).collect();
        seen.retain(|uid, _| live.contains(uid));
        // Only a serving CSR that passed every rule before the renewal's
        // is worth a connection to its kubelet: each such host's live
        // certificate is read once a pass, a few at once.
        let live_hosts: BTreeSet<String> = requests
            .iter()
            .filter(|r| csr::kind_of(&r.signer) == Some(Kind::Serving))
            .filter(|r| {
                let d = csr::decide(r, &inventory, &policy, &history);
                d.verdict == Verdict::Approve || d.reason == "RenewalAddsSANs"
            })
            .filter_map(|r| r.username.strip_prefix("system:node:"))
            .map(str::to_string)
            .collect();
        if !live_hosts.is_empty() {
            if let Some(authorities) = self.serving_authorities().await {
                let read: Vec<(String, Option<BTreeSet<String>>)> = stream::iter(live_hosts)
                    .map(|host| {
                        let (inventory, authorities) = (&inventory, &authorities);
                        async move {
                            let sans = self.live_certificate(&host, inventory, authorities).await;
                            (host, sans)
                        }
                    })
                    .buffer_unordered(LIVE_READS_AT_ONCE)
                    .collect()
                    .await;
                for (host, sans) in read {
                    if let Some(sans) = sans {
                        history.live_serving.insert(host, sans);
                    }
                }
            }
        }
        for (c, request) in pending.into_iter().zip(&requests) {
            let decision = csr::decide(request, &inventory, &policy, &history);
            let Some(kind) = csr::kind_of(&request.signer) else {
                continue;
            };
            let kind_label = match kind {
                Kind::Bootstrap => "bootstrap",
                Kind::Serving => "serving",
            };
            if decision.reason == "HoldDown" {
                if let Some(created) = request.created {
                    let end = created + policy.bootstrap_hold_seconds - now.as_second();
                    let after = Duration::from_secs(end.max(0) as u64 + 1);
                    wake = Some(wake.map_or(after, |w: Duration| w.min(after)));
                }
            }
            let first = seen.insert(request.uid.clone(), decision.reason) != Some(decision.reason);
            match decision.verdict {
                Verdict::Ignore => {
                    if first {
                        self.count(kind_label, "ignore", decision.reason);
                        tracing::debug!(csr = %c.name_any(), reason = decision.reason, message = %decision.message, "CSR left pending");
                    }
                }
                Verdict::Deny => {
                    if self.conclude(c, &decision).await? {
                        if decision.reason == "NodeExists" {
                            if let Some(node) = csr::requested_node(&request.request) {
                                self.record_blocked_join(&namespace, &name, &node, &c.name_any())
                                    .await?;
                            }
                        }
                        self.count(kind_label, "deny", decision.reason);
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
                    let node = match kind {
                        Kind::Serving => request.username.strip_prefix("system:node:"),
                        Kind::Bootstrap => None,
                    }
                    .map(str::to_string)
                    .or_else(|| csr::requested_node(&request.request))
                    .unwrap_or_default();
                    let dpu_uid = dpu_ids
                        .get(&node)
                        .map(|(u, _)| u.clone())
                        .unwrap_or_default();
                    // Recorded before approving, on the record as it is
                    // now: if the approval is lost the record still holds
                    // and names this CSR, which the next pass may approve
                    // again; if another approval for the node got there
                    // first, this one is not made.
                    let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
                    let recorded = update_record(
                        &self.ctx.client,
                        &self.ctx.applier,
                        &namespace,
                        &name,
                        |record| {
                            let mut a = Approvals::from_record(record);
                            let added = a.add(kind, &node, request, &dpu_uid, &stamp);
                            a.store(record);
                            (a, added)
                        },
                    )
                    .await?;
                    let Some((_, (fresh, true))) = recorded else {
                        tracing::warn!(csr = %c.name_any(), node = %node, "the record already holds another approval for this node: not approved");
                        continue;
                    };
                    approvals = fresh;
                    let pending_bootstrap = std::mem::take(&mut history.pending_bootstrap);
                    let live_serving = std::mem::take(&mut history.live_serving);
                    let at = history.now;
                    history = approvals.history(recent);
                    history.pending_bootstrap = pending_bootstrap;
                    history.live_serving = live_serving;
                    history.now = at;
                    if self.conclude(c, &decision).await? {
                        self.count(kind_label, "approve", decision.reason);
                        tracing::info!(csr = %c.name_any(), node = %node, kind = kind_label, "CSR approved");
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
        Ok(wake)
    }

    /// The kubelet serving CA bundle of the hosted cluster, when the
    /// approver is set to read one and it can be read.
    async fn serving_authorities(&self) -> Option<kubelet_cert::Authorities> {
        let (ca_namespace, ca_name) = self.ctx.options.kubelet_serving_ca.as_ref()?;
        let maps: Api<ConfigMap> = Api::namespaced(self.hosted.clone(), ca_namespace);
        let read = match maps.get_opt(ca_name).await {
            Ok(Some(map)) => map
                .data
                .as_ref()
                .and_then(|d| d.get(kubelet_cert::CA_BUNDLE_KEY))
                .ok_or_else(|| format!("no key {}", kubelet_cert::CA_BUNDLE_KEY))
                .and_then(|pem| {
                    kubelet_cert::Authorities::from_pem(pem.as_bytes()).map_err(|e| e.to_string())
                }),
            Ok(None) => Err("it does not exist".to_string()),
            Err(e) => Err(e.to_string()),
        };
        match read {
            Ok(a) => Some(a),
            Err(why) => {
                self.count_live("no_ca");
                tracing::info!(configmap = %format!("{ca_namespace}/{ca_name}"), %why, "the kubelet serving CA cannot be read: renewals are held to the recorded SANs");
                None
            }
        }
    }

    /// The SANs of `host`'s live serving certificate, when its kubelet can
    /// be reached at an address assigned to it and shows a certificate of
    /// the kubelet serving CA for its node; `None` otherwise (the renewal
    /// is then held to the recorded SANs).
    async fn live_certificate(
        &self,
        host: &str,
        inventory: &Inventory,
        authorities: &kubelet_cert::Authorities,
    ) -> Option<BTreeSet<String>> {
        let endpoints = csr::kubelet_endpoints(host, inventory);
        if endpoints.is_empty() {
            self.count_live("no_address");
            return None;
        }
        for endpoint in endpoints {
            let leaf = match kubelet_cert::fetch_leaf(endpoint, kubelet_cert::FETCH_TIMEOUT).await {
                Ok(leaf) => leaf,
                Err(e) => {
                    self.count_live("unreachable");
                    tracing::info!(node = host, %endpoint, error = %e, "the kubelet's live serving certificate cannot be read: the renewal is held to the recorded SANs");
                    continue;
                }
            };
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            match kubelet_cert::judge(&leaf, authorities, host, now) {
                Ok(sans) => {
                    self.count_live("verified");
                    tracing::debug!(node = host, %endpoint, ?sans, "the kubelet's live serving certificate");
                    return Some(sans);
                }
                Err(refused) => {
                    self.count_live("refused");
                    tracing::warn!(node = host, %endpoint, reason = refused.label(), error = %refused, "the kubelet at the node's assigned address shows no serving certificate of its own: the renewal is held to the recorded SANs");
                }
            }
        }
        None
    }

    fn count_live(&self, result: &str) {
        if let Some(m) = &self.ctx.metrics {
            m.csr_live_certificate(result);
        }
    }

    fn count(&self, kind: &str, verdict: &str, reason: &str) {
        if let Some(m) = &self.ctx.metrics {
            m.csr_decision(kind, verdict, reason);
        }
    }

    /// Notes that `node`'s DPU could not join because its old Node is
    /// still there, for the provisioner's DPUJoinBlocked condition.
    async fn record_blocked_join(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        csr_name: &str,
    ) -> Result<(), kube::Error> {
        let stamp = k8s_openapi::jiff::Timestamp::now().to_string();
        update_record(
            &self.ctx.client,
            &self.ctx.applier,
            namespace,
            name,
            |record| match record.blocked_joins.iter_mut().find(|b| b.node == node) {
                Some(b) => b.csr_name = csr_name.to_string(),
                None => record.blocked_joins.push(BlockedJoin {
                    node: node.to_string(),
                    csr_name: csr_name.to_string(),
                    since: stamp.clone(),
                }),
            },
        )
        .await?;
        Ok(())
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

    fn serving_csr(node: &str) -> CertificateSigningRequest {
        serde_json::from_value(json!({
            "metadata": {"name": format!("csr-{node}"), "uid": format!("uid-{node}"),
                         "creationTimestamp": k8s_openapi::jiff::Timestamp::now().to_string()},
            "spec": {"signerName": csr::SERVING_SIGNER, "username": format!("system:node:{node}"),
                     "groups": ["system:nodes"], "usages": ["server auth"], "request": ""},
        }))
        .unwrap()
    }

    /// Pending requests for names that are no DPU's
    /// could halt every approval, renewals included. Only those that could
    /// be approved here count.
    #[test]
    fn requests_for_names_that_are_no_dpus_do_not_count_against_the_pending_cap() {
        let mut inventory = Inventory::default();
        inventory.dpus.insert("dpu-0".into(), csr::Dpu::default());
        let mut undecided: Vec<Csr> = (0..100)
            .map(|i| csr_of(&serving_csr(&format!("ghost-{i}"))))
            .collect();
        undecided.push(csr_of(&serving_csr("dpu-0")));
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        assert_eq!(pending_count(&undecided, &inventory, now), 1);
    }

    #[test]
    fn reserved_addresses_belong_to_their_hostname_and_a_doubly_reserved_one_to_nobody() {
        let infra = |reservations: serde_json::Value| {
            let mut o = DynamicObject::new("vlan", &infra_resource()).within("ns");
            o.data = json!({"spec": {"infraComponents": {"dhcp": {"reservations": reservations}}}});
            Arc::new(o)
        };
        let assigned = assigned_addresses(&[
            infra(json!([
                {"mac": "02:00:00:00:00:12", "ip": "10.0.0.12", "hostname": "DPU-B."},
                {"mac": "02:00:00:00:00:20", "ip": "10.0.0.20"},
                {"mac": "02:00:00:00:00:30", "ip": "10.0.0.30", "hostname": "dpu-c"},
            ])),
            infra(json!([
                {"mac": "02:00:00:00:00:31", "ip": "10.0.0.30", "hostname": "dpu-d"},
            ])),
        ]);
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(
            assigned.get(&ip("10.0.0.12")).map(String::as_str),
            Some("dpu-b")
        );
        assert_eq!(assigned.get(&ip("10.0.0.20")), None);
        assert_eq!(assigned.get(&ip("10.0.0.30")).map(String::as_str), Some(""));
    }

    /// A DPU of another DPUCluster in the same
    /// namespace is not one of this provisioner's.
    #[test]
    fn only_dpus_of_the_provisioners_cluster_count() {
        let cluster = super::super::crd::ObjectRef {
            name: "fleet".into(),
            namespace: "dpus".into(),
        };
        let dpu = |spec: serde_json::Value| {
            let mut o = DynamicObject::new("d", &dpu_resource()).within("dpus");
            o.data = json!({ "spec": spec });
            o
        };
        assert!(of_cluster(
            &dpu(json!({"cluster": {"name": "fleet", "namespace": "dpus"}})),
            &cluster
        ));
        assert!(of_cluster(&dpu(json!({"nodeName": "host-1"})), &cluster));
        assert!(!of_cluster(
            &dpu(json!({"cluster": {"name": "other", "namespace": "dpus"}})),
            &cluster
        ));
        assert!(!of_cluster(
            &dpu(json!({"cluster": {"name": "fleet", "namespace": "elsewhere"}})),
            &cluster
        ));
    }

    /// The oversize marker is the approver's own
    /// note; a requester that sets it on a small CSR is not believed.
    #[test]
    fn a_requester_cannot_set_the_oversize_marker() {
        let mut c = serving_csr("dpu-0");
        c.metadata.annotations = Some(
            [
                (OVERSIZED_BYTES.to_string(), "1".to_string()),
                (OVERSIZED_CLAIM.to_string(), "dpu-1".to_string()),
            ]
            .into(),
        );
        keep_small(&mut c);
        assert!(csr_of(&c).oversized.is_none(), "{:?}", csr_of(&c).oversized);
    }

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

    /// A session that holds `guard` until it is stopped.
    async fn holding(guard: tokio::sync::oneshot::Sender<()>) {
        let _held = guard;
        std::future::pending::<()>().await
    }

    #[tokio::test]
    async fn sessions_end_with_the_approver_and_with_their_provisioner() {
        let key = |n: &str| ObjectRef::<DPFHCPProvisioner>::new(n).within("ns");
        let mut sessions = Sessions::default();
        let (a_guard, a_gone) = tokio::sync::oneshot::channel();
        let (b_guard, b_gone) = tokio::sync::oneshot::channel();
        let mut guards = vec![("a", a_guard), ("b", b_guard)];
        let mut start = |k: &ObjectRef<DPFHCPProvisioner>| {
            let at = guards.iter().position(|(n, _)| *n == k.name).unwrap();
            holding(guards.remove(at).1)
        };
        let live = |names: &[(&str, &str)]| {
            names
                .iter()
                .map(|(n, uid)| (key(n), uid.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let mut stops = Vec::new();
        sessions.follow(live(&[("a", "1"), ("b", "1")]), &mut start, |k| {
            stops.push(k.name.clone())
        });
        // b recreated under the same name: its session is stopped.
        sessions.follow(
            live(&[("a", "1")]),
            |_| async {},
            |k| stops.push(k.name.clone()),
        );
        assert_eq!(stops, ["b"]);
        tokio::time::timeout(std::time::Duration::from_secs(5), b_gone)
            .await
            .expect("b's session still running after its provisioner went")
            .unwrap_err();
        // The approver itself stops (as when leadership is lost and its
        // task is aborted): a's session must not outlive it.
        drop(sessions);
        tokio::time::timeout(std::time::Duration::from_secs(5), a_gone)
            .await
            .expect("a session outlived its approver")
            .unwrap_err();
    }
}
