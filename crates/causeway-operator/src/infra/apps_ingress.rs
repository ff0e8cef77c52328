//! `*.apps` on an isolated VLAN: the hosted cluster's default router gets a
//! LoadBalancer Service whose address MetalLB (in the hosted cluster)
//! takes from a pool on the VLAN; DNS answers `*.apps` with it on the VLAN
//! and the proxy routes `*.apps` to it for everyone else.
//!
//! The objects and the status are pure ([`plan`], [`objects`],
//! [`endpoint`]); [`reconcile`] reaches the hosted cluster under an
//! identity of its own (made once with HyperShift's admin kubeconfig, then
//! a short-lived token of it), watches its Nodes and the router Service
//! rather than polling them, and [`cleanup`] removes what it made.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use futures::StreamExt;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use serde_json::{json, Value};

use super::attachment::{
    AppliedApps, AppsEndpoint, AppsIngressSpec, AppsIngressStatus, InfraClusterAttachment, Lineage,
};
use crate::error::Error;
use crate::hosted::{admin_client, HostedEndpoint, HostedIdentity, Unavailable};
use crate::k8s::apply::{apply_params_as, installed, not_found};
use crate::k8s::resources::{ip_address_pool_resource, l2_advertisement_resource, resource};
use crate::k8s::watch::touched;

/// The field manager of what is made in the hosted cluster.
pub const MANAGER: &str = "causeway-apps-ingress";
/// Its identity there.
pub const HOSTED_NAMESPACE: &str = "kube-system";
pub const HOSTED_ACCOUNT: &str = "causeway-apps-ingress";
pub const HOSTED_ROLE: &str = "causeway:apps-ingress";
/// Its token's life; the client is made again before it ends.
const TOKEN_SECONDS: i64 = 3600;
const CLIENT_LIFE: Duration = Duration::from_secs(50 * 60);
/// The selector of OpenShift's default router pods.
const ROUTER_SELECTOR: (&str, &str) = (
    "ingresscontroller.operator.openshift.io/deployment-ingresscontroller",
    "default",
);
pub const POOL_ANNOTATION: &str = "metallb.universe.tf/address-pool";
/// Where OLM installs operators that watch every namespace: MetalLB, when
/// causeway (or the Go operator) installs it, runs here and reads its
/// pools from here.
pub const OLM_GLOBAL_NAMESPACE: &str = "openshift-operators";
/// Where MetalLB's own manifests install it.
pub const METALLB_NAMESPACE: &str = "metallb-system";
/// The router Service's name by default, and the Go operator's.
pub const SERVICE_NAME: &str = "causeway-apps";
pub const GO_SERVICE_NAME: &str = "oooi-ingress";

pub const PENDING: &str = "Pending";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";

/// Apps ingress of one attachment, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppsPlan {
    pub pool: String,
    pub range: String,
    pub l2_advertisement: String,
    pub metallb_namespace: String,
    pub install: bool,
    pub service: String,
    pub service_namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub http: u16,
    pub https: u16,
}

impl AppsPlan {
    pub fn applied(&self, installed_metallb: bool) -> AppliedApps {
        AppliedApps {
            service_name: self.service.clone(),
            service_namespace: self.service_namespace.clone(),
            address_pool_name: self.pool.clone(),
            l2_advertisement_name: self.l2_advertisement.clone(),
            metallb_namespace: self.metallb_namespace.clone(),
            installed_metallb,
        }
    }
}

fn given(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn port(path: &str, p: Option<i32>, default: u16, errors: &mut Vec<String>) -> u16 {
    match p {
        None => default,
        Some(n) => u16::try_from(n).ok().filter(|n| *n > 0).unwrap_or_else(|| {
            errors.push(format!(
                "appsIngress.ports.{path}: {n} is not a port from 1 to 65535"
            ));
            default
        }),
    }
}

/// The plan of an enabled spec; `Err` lists what is missing or wrong.
/// `lineage` decides the defaults: an attachment the Go operator made keeps
/// its objects' names and its MetalLB install, so they are taken over
/// rather than made a second time beside it.
pub fn plan(spec: &AppsIngressSpec, lineage: Lineage) -> Result<AppsPlan, Vec<String>> {
    let mut errors = Vec::new();
    let go = lineage == Lineage::GoOperator;
    let pool = given(&spec.metallb.address_pool_name);
    if pool.is_none() {
        errors.push("appsIngress.metallb.addressPoolName: required when enabled".to_string());
    }
    let range = given(&spec.metallb.ip_address_pool_range);
    if range.is_none() {
        errors.push("appsIngress.metallb.ipAddressPoolRange: required when enabled".to_string());
    }
    let http = port("http", spec.ports.http, 80, &mut errors);
    let https = port("https", spec.ports.https, 443, &mut errors);
    // One namespace for the install, the MetalLB resource, the pool and the
    // advertisement: MetalLB reads pools only from the namespace it runs in.
    let install = spec.metallb.install || go;
    let metallb_namespace = match given(&spec.metallb.namespace) {
        Some(ns) if install && ns != OLM_GLOBAL_NAMESPACE => {
            errors.push(format!(
                "appsIngress.metallb.namespace: {ns:?} cannot hold the pool of a MetalLB installed into {OLM_GLOBAL_NAMESPACE} (OLM's namespace for operators of every namespace), where MetalLB reads its pools: leave it unset or set {OLM_GLOBAL_NAMESPACE:?}"
            ));
            ns
        }
        Some(ns) => ns,
        None if install => OLM_GLOBAL_NAMESPACE.into(),
        None => METALLB_NAMESPACE.into(),
    };
    let (Some(pool), Some(range)) = (pool, range) else {
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let default_service = if go { GO_SERVICE_NAME } else { SERVICE_NAME };
    Ok(AppsPlan {
        l2_advertisement: given(&spec.metallb.l2_advertisement_name)
            .unwrap_or_else(|| format!("advertise-{pool}")),
        metallb_namespace,
        install,
        service: given(&spec.service.name).unwrap_or_else(|| default_service.into()),
        service_namespace: given(&spec.service.namespace)
            .unwrap_or_else(|| "openshift-ingress".into()),
        labels: spec.service.labels.clone(),
        annotations: spec.service.annotations.clone(),
        pool,
        range,
        http,
        https,
    })
}

/// The IPAddressPool, the L2Advertisement and the router's Service.
pub fn objects(p: &AppsPlan) -> (Value, Value, Value) {
    let pool = json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": p.pool, "namespace": p.metallb_namespace},
        "spec": {"addresses": [p.range], "autoAssign": true},
    });
    let l2 = json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
        "metadata": {"name": p.l2_advertisement, "namespace": p.metallb_namespace},
        "spec": {"ipAddressPools": [p.pool]},
    });
    let mut annotations = p.annotations.clone();
    // Set last: the pool is the one this attachment made.
    annotations.insert(POOL_ANNOTATION.into(), p.pool.clone());
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": p.service, "namespace": p.service_namespace,
            "labels": p.labels, "annotations": annotations},
        "spec": {"type": "LoadBalancer",
            "selector": {ROUTER_SELECTOR.0: ROUTER_SELECTOR.1},
            "ports": [
                {"name": "http", "port": p.http, "targetPort": p.http, "protocol": "TCP"},
                {"name": "https", "port": p.https, "targetPort": p.https, "protocol": "TCP"},
            ]},
    });
    (pool, l2, service)
}

/// What the router Service's load balancer says: an address, or a host
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Address(Ipv4Addr),
    Hostname(String),
}

pub fn endpoint(service: &Service) -> Option<Endpoint> {
    let first = service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .clone();
    if let Some(ip) = first.ip.as_deref().and_then(|i| i.parse().ok()) {
        return Some(Endpoint::Address(ip));
    }
    first
        .hostname
        .filter(|h| !h.is_empty())
        .map(Endpoint::Hostname)
}

/// The endpoint the Infra renders, from a Ready status.
pub fn ready_endpoint(
    spec: Option<&AppsIngressSpec>,
    status: Option<&AppsIngressStatus>,
) -> Option<AppsEndpoint> {
    let spec = spec.filter(|s| s.enabled)?;
    let status = status.filter(|s| {
        s.phase == READY || (s.phase == DEGRADED && UNREACHABLE.contains(&s.reason.as_str()))
    })?;
    let address = status.external_ip.as_deref()?.parse().ok()?;
    let mut errors = Vec::new();
    let http = port("http", spec.ports.http, 80, &mut errors);
    let https = port("https", spec.ports.https, 443, &mut errors);
    errors.is_empty().then_some(AppsEndpoint {
        address,
        http,
        https,
    })
}

pub fn status(
    phase: &str,
    reason: &str,
    message: impl Into<String>,
    applied: Option<AppliedApps>,
) -> AppsIngressStatus {
    AppsIngressStatus {
        phase: phase.into(),
        reason: reason.into(),
        message: message.into(),
        external_ip: None,
        external_hostname: None,
        applied,
    }
}

/// The hosted-cluster role: read Nodes, manage the one Service's
/// namespace's Services and MetalLB's pools there, and (only to install
/// MetalLB) OLM Subscriptions and the MetalLB resource.
fn hosted_role(install: bool) -> Value {
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]}),
        json!({"apiGroups": ["metallb.io"], "resources": ["ipaddresspools", "l2advertisements"], "verbs": ["get", "list", "create", "patch", "delete"]}),
    ];
    if install {
        rules.push(json!({"apiGroups": ["operators.coreos.com"], "resources": ["subscriptions"], "verbs": ["get", "list", "create", "patch", "delete"]}));
        rules.push(json!({"apiGroups": ["metallb.io"], "resources": ["metallbs"], "verbs": ["get", "list", "create", "patch", "delete"]}));
        // To wake when OLM has made MetalLB's kinds served.
        rules.push(json!({"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]}));
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": HOSTED_ROLE}, "rules": rules,
    })
}

/// A client of the hosted cluster under its own identity.
async fn least_privilege(
    admin: &Client,
    config: &Config,
    install: bool,
) -> Result<Client, kube::Error> {
    let identity = HostedIdentity {
        manager: MANAGER,
        namespace: HOSTED_NAMESPACE,
        account: HOSTED_ACCOUNT,
        role: HOSTED_ROLE,
    };
    identity
        .client(admin, config, hosted_role(install), TOKEN_SECONDS)
        .await
}

/// One attachment's hosted client, when it was made, and the watch that
/// wakes the attachment on the hosted cluster's changes.
type HostedClient = (Client, Instant, tokio::task::AbortHandle);

/// Hosted clients by attachment (namespace, name), and the status each
/// attachment's last pass here gave.
#[derive(Default)]
pub struct HostedClients {
    inner: std::sync::Mutex<BTreeMap<(String, String), HostedClient>>,
    last: std::sync::Mutex<BTreeMap<(String, String), AppsIngressStatus>>,
}

impl HostedClients {
    fn get(&self, key: &(String, String)) -> Option<Client> {
        let inner = self.inner.lock().ok()?;
        inner
            .get(key)
            .filter(|(_, made, _)| made.elapsed() < CLIENT_LIFE)
            .map(|(c, _, _)| c.clone())
    }

    fn put(&self, key: (String, String), client: Client, watch: tokio::task::AbortHandle) {
        if let Ok(mut inner) = self.inner.lock() {
            if let Some((_, _, old)) = inner.insert(key, (client, Instant::now(), watch)) {
                old.abort();
            }
        }
    }

    /// Forgets an attachment's client and stops its watch.
    pub fn forget(&self, key: &(String, String)) {
        if let Ok(mut inner) = self.inner.lock() {
            if let Some((_, _, watch)) = inner.remove(key) {
                watch.abort();
            }
        }
        if let Ok(mut last) = self.last.lock() {
            last.remove(key);
        }
    }

    fn last_status(&self, key: &(String, String)) -> Option<AppsIngressStatus> {
        self.last.lock().ok()?.get(key).cloned()
    }

    fn remember(&self, key: (String, String), status: &AppsIngressStatus) {
        if let Ok(mut last) = self.last.lock() {
            last.insert(key, status.clone());
        }
    }
}

/// What [`reconcile`] needs from the controller.
pub struct Hosted<'a> {
    pub management: &'a Client,
    pub endpoint: HostedEndpoint,
    pub clients: &'a HostedClients,
    /// Wakes an attachment when its hosted objects change.
    pub wake: futures::channel::mpsc::UnboundedSender<ObjectRef<InfraClusterAttachment>>,
}

fn key(att: &InfraClusterAttachment) -> (String, String) {
    (att.namespace().unwrap_or_default(), att.name_any())
}

/// The hosted client, made (with its watch) when there is none.
async fn client(
    h: &Hosted<'_>,
    att: &InfraClusterAttachment,
    p: &AppsPlan,
) -> Result<Client, AppsIngressStatus> {
    let k = key(att);
    if let Some(c) = h.clients.get(&k) {
        return Ok(c);
    }
    let hc = &att.spec.hosted_cluster_ref;
    let (config, admin) = admin_client(h.management, h.endpoint, &hc.namespace, &hc.name)
        .await
        .map_err(|u| {
            let why = match u {
                Unavailable::NoKubeconfig(w) | Unavailable::Unreachable(w) => w,
            };
            status(DEGRADED, "HostedClusterAccessFailed", why, None)
        })?;
    let c = least_privilege(&admin, &config, p.install)
        .await
        .map_err(|e| {
            status(
                DEGRADED,
                "HostedClusterAccessFailed",
                format!("making causeway's identity in the hosted cluster: {e}"),
                None,
            )
        })?;
    let watch = spawn_watch(c.clone(), p, ObjectRef::from_obj(att), h.wake.clone());
    h.clients.put(k, c.clone(), watch);
    Ok(c)
}

/// Wakes the attachment on any change to the hosted cluster's Nodes or to
/// the router Service, and, while causeway installs MetalLB, to MetalLB's
/// CustomResourceDefinitions (so the MetalLB resource is made as soon as
/// its kind is served).
fn spawn_watch(
    client: Client,
    p: &AppsPlan,
    who: ObjectRef<InfraClusterAttachment>,
    wake: futures::channel::mpsc::UnboundedSender<ObjectRef<InfraClusterAttachment>>,
) -> tokio::task::AbortHandle {
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), &p.service_namespace);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={}", p.service));
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let node_events = touched(nodes, watcher::Config::default()).map(|_| ());
    let service_events = touched(services, by_name).map(|_| ());
    let metallb_kinds = if p.install {
        touched(crds, watcher::Config::default())
            .filter(|crd| {
                std::future::ready(matches!(crd, Ok(crd) if crd.spec.group == "metallb.io"))
            })
            .map(|_| ())
            .boxed()
    } else {
        futures::stream::pending().boxed()
    };
    let task = tokio::spawn(async move {
        let mut all = std::pin::pin!(futures::stream::select(
            futures::stream::select(node_events, service_events),
            metallb_kinds
        ));
        while all.next().await.is_some() {
            if wake.unbounded_send(who.clone()).is_err() {
                return;
            }
        }
    });
    task.abort_handle()
}

fn ready_node(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn apply(
    client: &Client,
    resource: &kube::core::ApiResource,
    ns: &str,
    obj: &Value,
) -> Result<(), kube::Error> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
    api.patch(name, &apply_params_as(MANAGER).force(), &Patch::Apply(obj))
        .await
        .map(|_| ())
}

/// One pass of apps ingress for `att`, whose spec enables it: the status
/// to report (with what was applied).
pub async fn reconcile(
    h: &Hosted<'_>,
    att: &InfraClusterAttachment,
    spec: &AppsIngressSpec,
) -> AppsIngressStatus {
    // What this process's last pass gave first: the watch-fed copy of
    // the attachment can lag the status this controller just wrote, and an
    // outage right after a Ready pass must still find that address.
    let k = key(att);
    let remembered = h.clients.last_status(&k);
    let last = remembered.as_ref().or(att
        .status
        .as_ref()
        .and_then(|s| s.apps_ingress_status.as_ref()));
    let next = keep_address_while_unreachable(last, pass(h, att, spec).await);
    tracing::debug!(
        attachment = %k.1,
        namespace = %k.0,
        phase = %next.phase,
        reason = %next.reason,
        external_ip = ?next.external_ip,
        last = ?last.map(|l| (&l.phase, &l.reason, &l.external_ip)),
        "apps ingress pass"
    );
    h.clients.remember(k, &next);
    next
}

/// The reasons that say the hosted cluster's API could not be reached or
/// read: nothing about its router, whose address stays served.
pub const UNREACHABLE: [&str; 2] = ["HostedClusterAccessFailed", "HostedClusterNodeListFailed"];

/// While the hosted API is unreachable, the router's last address (from a
/// Ready pass, or kept since one) stays in the status, so `*.apps` stays
/// in DNS and the proxy: an outage of the control plane is not one of the
/// router's.
pub fn keep_address_while_unreachable(
    last: Option<&AppsIngressStatus>,
    mut next: AppsIngressStatus,
) -> AppsIngressStatus {
    let unreachable =
        |s: &AppsIngressStatus| s.phase == DEGRADED && UNREACHABLE.contains(&s.reason.as_str());
    if !unreachable(&next) {
        return next;
    }
    let Some(last) = last.filter(|l| l.phase == READY || unreachable(l)) else {
        return next;
    };
    if let Some(kept) = last
        .external_ip
        .as_ref()
        .or(last.external_hostname.as_ref())
    {
        next.message = format!(
            "{} (the router's last address, {kept}, is still served)",
            next.message
        );
        next.external_ip = last.external_ip.clone();
        next.external_hostname = last.external_hostname.clone();
    }
    next
}

/// One pass over the hosted cluster.
async fn pass(
    h: &Hosted<'_>,
    att: &InfraClusterAttachment,
    spec: &AppsIngressSpec,
) -> AppsIngressStatus {
    let previous = att
        .status
        .as_ref()
        .and_then(|s| s.apps_ingress_status.as_ref())
        .and_then(|s| s.applied.clone());
    let p = match plan(spec, Lineage::of(att)) {
        Ok(p) => p,
        Err(errors) => {
            return status(
                DEGRADED,
                "InvalidConfiguration",
                errors.join("; "),
                previous,
            )
        }
    };
    let c = match client(h, att, &p).await {
        Ok(c) => c,
        Err(mut s) => {
            s.applied = previous;
            return s;
        }
    };
    let nodes: Api<Node> = Api::all(c.clone());
    match nodes.list(&Default::default()).await {
        Ok(list) if list.items.iter().any(ready_node) => {}
        Ok(_) => {
            return status(
                PENDING,
                "WaitingForHostedClusterNodes",
                "no Ready Node in the hosted cluster yet",
                previous,
            )
        }
        Err(e) => {
            return status(
                DEGRADED,
                "HostedClusterNodeListFailed",
                e.to_string(),
                previous,
            )
        }
    }
    let pool_res = ip_address_pool_resource();
    let l2_res = l2_advertisement_resource();
    let installed_metallb = p.install || previous.as_ref().is_some_and(|a| a.installed_metallb);
    // Recorded before anything is made, so a deletion removes what a pass
    // that stopped half way made.
    let recorded = |previous: &Option<AppliedApps>| {
        let mut a = previous
            .clone()
            .unwrap_or_else(|| p.applied(installed_metallb));
        a.installed_metallb |= installed_metallb;
        Some(a)
    };
    // The install is applied on every pass: the MetalLB resource can only
    // be made once OLM serves its kind, which is after the Subscription.
    let metallb_resource = if p.install {
        match install_metallb(&c, &p.metallb_namespace).await {
            Ok(made) => made,
            Err(e) => return step_failed("MetalLBInstallFailed", e, recorded(&previous)),
        }
    } else {
        true
    };
    let served = async {
        Ok::<bool, Error>(
            installed(&c, &p.metallb_namespace, &pool_res).await?
                && installed(&c, &p.metallb_namespace, &l2_res).await?,
        )
    };
    match served.await {
        Ok(true) if metallb_resource => {}
        Ok(_) if p.install => {
            return status(
                PENDING,
                "WaitingForMetalLBCRDs",
                format!("MetalLB is being installed in the hosted cluster (Subscription {}/metallb-operator); waiting for OLM to serve its kinds, then the MetalLB resource is made", p.metallb_namespace),
                recorded(&previous),
            )
        }
        Ok(_) => return status(PENDING, "WaitingForMetalLBCRDs", "MetalLB's IPAddressPool and L2Advertisement kinds are not served in the hosted cluster: install MetalLB there, or set appsIngress.metallb.install", previous),
        Err(e) => return step_failed("MetalLBInstallFailed", StepFailed::of_error(e), previous),
    }
    // What an earlier pass made under other names goes first.
    if let Some(old) = previous
        .as_ref()
        .filter(|a| **a != p.applied(a.installed_metallb))
    {
        if let Err(e) = remove(&c, old, false).await {
            return step_failed(
                "MetalLBInstallFailed",
                StepFailed::of("removing what was renamed".into(), &e),
                previous,
            );
        }
    }
    let applied = Some(p.applied(installed_metallb));
    let (pool, l2, service) = objects(&p);
    for (res, obj) in [(&pool_res, &pool), (&l2_res, &l2)] {
        if let Err(e) = apply(&c, res, &p.metallb_namespace, obj).await {
            let what = format!(
                "{} {}/{}",
                res.kind, p.metallb_namespace, obj["metadata"]["name"]
            );
            return step_failed("MetalLBInstallFailed", StepFailed::of(what, &e), applied);
        }
    }
    let services: Api<Service> = Api::namespaced(c.clone(), &p.service_namespace);
    if let Err(e) = services
        .patch(
            &p.service,
            &apply_params_as(MANAGER).force(),
            &Patch::Apply(&service),
        )
        .await
    {
        let what = format!("Service {}/{}", p.service_namespace, p.service);
        return step_failed("IngressServiceFailed", StepFailed::of(what, &e), applied);
    }
    let live = match services.get(&p.service).await {
        Ok(s) => s,
        Err(e) => {
            let what = format!("Service {}/{}", p.service_namespace, p.service);
            return step_failed(
                "ExternalIPDiscoveryFailed",
                StepFailed::of(what, &e),
                applied,
            );
        }
    };
    match endpoint(&live) {
        None => status(PENDING, "WaitingForExternalIP", format!("Service {}/{} has no load balancer address yet", p.service_namespace, p.service), applied),
        Some(Endpoint::Address(ip)) => AppsIngressStatus {
            external_ip: Some(ip.to_string()),
            ..status(READY, "ReconciliationSucceeded", format!("Apps ingress ready at endpoint {ip}"), applied)
        },
        Some(Endpoint::Hostname(name)) => AppsIngressStatus {
            external_hostname: Some(name.clone()),
            ..status(READY, "ReconciliationSucceeded", format!("Apps ingress ready at endpoint {name} (a host name: no A record on the VLAN, the proxy routes by it)"), applied)
        },
    }
}

fn subscription_resource() -> kube::core::ApiResource {
    resource(
        "operators.coreos.com",
        "v1alpha1",
        "Subscription",
        "subscriptions",
    )
}

fn metallb_resource() -> kube::core::ApiResource {
    resource("metallb.io", "v1beta1", "MetalLB", "metallbs")
}

/// Applies MetalLB's OLM Subscription in `ns` and, once OLM serves its
/// kind, the MetalLB resource that has the operator run MetalLB; `Ok(true)`
/// once both are there.
async fn install_metallb(c: &Client, ns: &str) -> Result<bool, StepFailed> {
    let sub = subscription_resource();
    let metallb = metallb_resource();
    if !installed(c, ns, &sub).await.map_err(StepFailed::of_error)? {
        return Err(StepFailed::answered("OLM's Subscription kind is not served in the hosted cluster: MetalLB cannot be installed from here".into()));
    }
    apply(
        c,
        &sub,
        ns,
        &json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
            "metadata": {"name": "metallb-operator", "namespace": ns},
            "spec": {"channel": "stable", "name": "metallb-operator", "source": "redhat-operators",
                "sourceNamespace": "openshift-marketplace", "installPlanApproval": "Automatic"},
        }),
    )
    .await
    .map_err(|e| StepFailed::of(format!("Subscription {ns}/metallb-operator"), &e))?;
    if !installed(c, ns, &metallb)
        .await
        .map_err(StepFailed::of_error)?
    {
        return Ok(false);
    }
    apply(
        c,
        &metallb,
        ns,
        &json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "MetalLB",
            "metadata": {"name": "metallb", "namespace": ns}, "spec": {},
        }),
    )
    .await
    .map_err(|e| StepFailed::of(format!("MetalLB {ns}/metallb"), &e))?;
    Ok(true)
}

/// A step of a pass that failed: what to say, and whether the hosted API
/// gave no answer at all (the connection failed, or it said it is
/// unavailable), which is the cluster being unreachable, not the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailed {
    pub message: String,
    pub no_answer: bool,
}

impl StepFailed {
    fn answered(message: String) -> StepFailed {
        StepFailed {
            message,
            no_answer: false,
        }
    }

    fn of(what: String, e: &kube::Error) -> StepFailed {
        StepFailed {
            message: format!("{what}: {e}"),
            no_answer: no_answer(e),
        }
    }

    fn of_error(e: Error) -> StepFailed {
        StepFailed {
            no_answer: matches!(&e, Error::Kube(k) if no_answer(k)),
            message: e.to_string(),
        }
    }
}

/// Whether the API server gave no answer to a request: no connection, or
/// `503` (it is starting or stopping).
pub fn no_answer(e: &kube::Error) -> bool {
    match e {
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        kube::Error::Api(s) => s.code == 503,
        _ => false,
    }
}

/// The status of a pass stopped by `failed` at a step whose own reason is
/// `reason`: `HostedClusterAccessFailed` when the hosted API gave no
/// answer, as when the pass could not list Nodes, so an outage that begins
/// half way through a pass keeps the router's address as one that begins
/// before it does ([`keep_address_while_unreachable`]).
pub fn step_failed(
    reason: &str,
    failed: StepFailed,
    applied: Option<AppliedApps>,
) -> AppsIngressStatus {
    if failed.no_answer {
        status(
            DEGRADED,
            "HostedClusterAccessFailed",
            format!(
                "the hosted cluster's API stopped answering: {}",
                failed.message
            ),
            applied,
        )
    } else {
        status(DEGRADED, reason, failed.message, applied)
    }
}

/// Deletes what `applied` names; a kind not served or an object gone is
/// fine. `all` also removes MetalLB when causeway installed it.
async fn remove(c: &Client, applied: &AppliedApps, all: bool) -> Result<(), kube::Error> {
    let gone = |r: Result<_, kube::Error>| match r {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    };
    let services: Api<Service> = Api::namespaced(c.clone(), &applied.service_namespace);
    gone(
        services
            .delete(&applied.service_name, &DeleteParams::default())
            .await
            .map(|_| ()),
    )?;
    for (res, name) in [
        (l2_advertisement_resource(), &applied.l2_advertisement_name),
        (ip_address_pool_resource(), &applied.address_pool_name),
    ] {
        let api: Api<DynamicObject> =
            Api::namespaced_with(c.clone(), &applied.metallb_namespace, &res);
        gone(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
    }
    if all && applied.installed_metallb {
        for (res, name) in [
            (metallb_resource(), "metallb"),
            (subscription_resource(), "metallb-operator"),
        ] {
            let api: Api<DynamicObject> =
                Api::namespaced_with(c.clone(), &applied.metallb_namespace, &res);
            gone(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
        }
    }
    Ok(())
}

/// How a cleanup of the hosted objects ended.
pub enum Cleanup {
    Done,
    /// The hosted cluster is gone (no HostedCluster or kubeconfig): there
    /// is nothing left to clean.
    ClusterGone,
    /// It could not be reached: why.
    Blocked(String),
}

/// Removes everything `applied` names from the hosted cluster.
pub async fn cleanup(
    h: &Hosted<'_>,
    att: &InfraClusterAttachment,
    applied: &AppliedApps,
) -> Cleanup {
    let k = key(att);
    let c = match h.clients.get(&k) {
        Some(c) => c,
        None => {
            let hc = &att.spec.hosted_cluster_ref;
            match admin_client(h.management, h.endpoint, &hc.namespace, &hc.name).await {
                Ok((config, admin)) => {
                    match least_privilege(&admin, &config, applied.installed_metallb).await {
                        Ok(c) => c,
                        Err(e) => {
                            return Cleanup::Blocked(format!("reaching the hosted cluster: {e}"))
                        }
                    }
                }
                Err(Unavailable::NoKubeconfig(_)) => return Cleanup::ClusterGone,
                Err(Unavailable::Unreachable(w)) => return Cleanup::Blocked(w),
            }
        }
    };
    let result = remove(&c, applied, true).await;
    h.clients.forget(&k);
    match result {
        Ok(()) => Cleanup::Done,
        Err(e) => Cleanup::Blocked(e.to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::infra::attachment::{AppsMetalLb, AppsPorts};

    fn spec() -> AppsIngressSpec {
        AppsIngressSpec {
            enabled: true,
            metallb: AppsMetalLb {
                address_pool_name: Some("hc1-apps".into()),
                ip_address_pool_range: Some("192.168.100.200-192.168.100.209".into()),
                ..AppsMetalLb::default()
            },
            ..AppsIngressSpec::default()
        }
    }

    #[test]
    fn defaults_and_objects() {
        let p = plan(&spec(), Lineage::Causeway).unwrap();
        assert_eq!(p.l2_advertisement, "advertise-hc1-apps");
        assert_eq!(
            (p.service.as_str(), p.service_namespace.as_str()),
            ("causeway-apps", "openshift-ingress")
        );
        let (pool, l2, svc) = objects(&p);
        assert_eq!(
            pool["spec"]["addresses"][0],
            "192.168.100.200-192.168.100.209"
        );
        assert_eq!(l2["spec"]["ipAddressPools"][0], "hc1-apps");
        assert_eq!(svc["metadata"]["annotations"][POOL_ANNOTATION], "hc1-apps");
        assert_eq!(svc["spec"]["selector"][ROUTER_SELECTOR.0], "default");
        assert_eq!(svc["spec"]["ports"][1]["port"], 443);
    }

    #[test]
    fn missing_and_bad_fields_are_named() {
        let mut s = spec();
        s.metallb.address_pool_name = None;
        s.ports = AppsPorts {
            http: Some(0),
            https: Some(70000),
        };
        assert_eq!(
            plan(&s, Lineage::Causeway).unwrap_err(),
            vec![
                "appsIngress.metallb.addressPoolName: required when enabled",
                "appsIngress.ports.http: 0 is not a port from 1 to 65535",
                "appsIngress.ports.https: 70000 is not a port from 1 to 65535",
            ]
        );
    }

    #[test]
    fn an_unreachable_hosted_api_keeps_the_routers_address_served() {
        let ready = AppsIngressStatus {
            external_ip: Some("192.168.100.200".into()),
            ..status(READY, "ReconciliationSucceeded", "", None)
        };
        let down = status(
            DEGRADED,
            "HostedClusterNodeListFailed",
            "connection refused",
            None,
        );
        let kept = keep_address_while_unreachable(Some(&ready), down.clone());
        assert_eq!(kept.external_ip.as_deref(), Some("192.168.100.200"));
        assert!(kept.message.contains("192.168.100.200"), "{}", kept.message);
        assert!(ready_endpoint(Some(&spec()), Some(&kept)).is_some());
        // Still down on the next pass: kept again.
        let again = keep_address_while_unreachable(Some(&kept), down.clone());
        assert_eq!(again.external_ip.as_deref(), Some("192.168.100.200"));
        // Anything else clears it: a bad spec, MetalLB, the Service.
        for reason in [
            "InvalidConfiguration",
            "MetalLBInstallFailed",
            "IngressServiceFailed",
        ] {
            let other =
                keep_address_while_unreachable(Some(&ready), status(DEGRADED, reason, "", None));
            assert_eq!(other.external_ip, None, "{reason}");
            assert!(
                ready_endpoint(Some(&spec()), Some(&other)).is_none(),
                "{reason}"
            );
        }
        // Never an address that was not Ready.
        let pending = status(PENDING, "WaitingForExternalIP", "", None);
        assert_eq!(
            keep_address_while_unreachable(Some(&pending), down).external_ip,
            None
        );
    }

    #[test]
    fn a_step_the_hosted_api_does_not_answer_keeps_the_address_as_an_unreachable_cluster_does() {
        let ready = AppsIngressStatus {
            external_ip: Some("192.168.100.200".into()),
            ..status(READY, "ReconciliationSucceeded", "", None)
        };
        let refused = kube::Error::Service("client error (Connect)".into());
        let unavailable = kube::Error::Api(Box::new(kube::core::Status {
            code: 503,
            reason: "ServiceUnavailable".into(),
            ..Default::default()
        }));
        let conflict = kube::Error::Api(Box::new(kube::core::Status {
            code: 409,
            reason: "Conflict".into(),
            ..Default::default()
        }));
        for (e, unreachable) in [(refused, true), (unavailable, true), (conflict, false)] {
            let failed = StepFailed::of("IPAddressPool openshift-operators/hc1-apps".into(), &e);
            assert_eq!(failed.no_answer, unreachable, "{e}");
            let s = step_failed("MetalLBInstallFailed", failed, None);
            let kept = keep_address_while_unreachable(Some(&ready), s);
            if unreachable {
                // The API server stopping half way through a pass (a CI
                // run met this): the same as it being down before.
                assert_eq!(kept.reason, "HostedClusterAccessFailed", "{e}");
                assert_eq!(kept.external_ip.as_deref(), Some("192.168.100.200"));
            } else {
                assert_eq!(kept.reason, "MetalLBInstallFailed", "{e}");
                assert_eq!(kept.external_ip, None);
            }
        }
    }

    #[test]
    fn one_namespace_holds_the_install_the_pool_and_the_advertisement() {
        let mut s = spec();
        let p = plan(&s, Lineage::Causeway).unwrap();
        assert_eq!(
            (p.install, p.metallb_namespace.as_str()),
            (false, "metallb-system")
        );
        s.metallb.install = true;
        let p = plan(&s, Lineage::Causeway).unwrap();
        assert_eq!(
            (p.install, p.metallb_namespace.as_str()),
            (true, "openshift-operators")
        );
        let (pool, l2, _) = objects(&p);
        assert_eq!(pool["metadata"]["namespace"], "openshift-operators");
        assert_eq!(l2["metadata"]["namespace"], "openshift-operators");
        s.metallb.namespace = Some("metallb-system".into());
        assert_eq!(
            plan(&s, Lineage::Causeway).unwrap_err(),
            vec!["appsIngress.metallb.namespace: \"metallb-system\" cannot hold the pool of a MetalLB installed into openshift-operators (OLM's namespace for operators of every namespace), where MetalLB reads its pools: leave it unset or set \"openshift-operators\""]
        );
        s.metallb.install = false;
        let p = plan(&s, Lineage::Causeway).unwrap();
        assert_eq!(p.metallb_namespace, "metallb-system");
    }

    #[test]
    fn the_go_operators_attachment_keeps_its_objects_names_and_install() {
        let p = plan(&spec(), Lineage::GoOperator).unwrap();
        assert_eq!(
            (
                p.service.as_str(),
                p.service_namespace.as_str(),
                p.metallb_namespace.as_str(),
                p.l2_advertisement.as_str(),
                p.install
            ),
            (
                "oooi-ingress",
                "openshift-ingress",
                "openshift-operators",
                "advertise-hc1-apps",
                true
            )
        );
        let mut named = spec();
        named.service.name = Some("router-lb".into());
        assert_eq!(
            plan(&named, Lineage::GoOperator).unwrap().service,
            "router-lb"
        );
    }

    #[test]
    fn only_a_ready_address_is_rendered() {
        let s = spec();
        let ready = AppsIngressStatus {
            external_ip: Some("192.168.100.200".into()),
            ..status(READY, "ReconciliationSucceeded", "", None)
        };
        assert_eq!(
            ready_endpoint(Some(&s), Some(&ready))
                .unwrap()
                .address
                .to_string(),
            "192.168.100.200"
        );
        let pending = status(PENDING, "WaitingForExternalIP", "", None);
        assert!(ready_endpoint(Some(&s), Some(&pending)).is_none());
        let off = AppsIngressSpec {
            enabled: false,
            ..spec()
        };
        assert!(ready_endpoint(Some(&off), Some(&ready)).is_none());
    }
}
