//! The operator's lifecycle: wait for leadership (when elected), run the
//! controllers over the watched namespaces, and stop them all the moment
//! leadership is lost or shutdown is asked for. The binary only wires this
//! to signals and the admin server.

use std::time::Duration;

use std::collections::HashMap;

use futures::FutureExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use crate::infra::controller;
use crate::infra::plan::Settings;
use crate::k8s::leader::LeaderElector;
use crate::k8s::metrics::OperatorMetrics;
use crate::k8s::watch::scopes;
use crate::k8s::MANAGER;

/// The Lease the replicas compete for, in the operator's namespace.
pub const LEASE_NAME: &str = "causeway-operator";
/// How long the controllers get to finish their reconciles once shutdown
/// is asked for; then they are aborted. A reconcile stuck on an API server
/// that does not answer must not keep the process (and its pod) alive.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// How long the Lease hand-back may take; an API server that does not
/// answer by then is not waited for (the Lease then runs out by itself).
pub const RELEASE_DEADLINE: Duration = Duration::from_secs(3);

pub struct Options {
    /// The namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Make Infras for HostedClusters annotated to ask for one.
    pub infra_for_hosted_clusters: bool,
    /// Run the DPF bridge (DPFHCPProvisioner objects).
    pub dpf: bool,
    /// How hosted clusters' API servers are reached (apps ingress, and the
    /// CSR approver's own setting).
    pub hosted_endpoint: crate::hosted::HostedEndpoint,
    /// How long a deleted InfraClusterAttachment waits for an unreachable
    /// hosted cluster before leaving its apps ingress objects behind.
    pub hosted_cleanup_timeout: std::time::Duration,
    /// With the DPF bridge: approve DPU kubelet CSRs in hosted clusters.
    pub csr_approver: Option<crate::dpf::approver::ApproverOptions>,
    /// `Some(identity)`: elect a leader through the Lease in
    /// `settings.operator_namespace`.
    pub leader_identity: Option<String>,
    pub settings: Settings,
}

/// Why [`run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    Shutdown,
    /// The process must exit, so a restart competes again.
    LostLeadership,
}

/// The controllers' tasks, by name for the log of those that would not stop.
#[derive(Default)]
struct Tasks {
    set: tokio::task::JoinSet<()>,
    names: HashMap<tokio::task::Id, &'static str>,
}

fn spawn(
    tasks: &mut Tasks,
    name: &'static str,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let handle = tasks.set.spawn(task);
    tasks.names.insert(handle.id(), name);
}

pub async fn run(
    client: Client,
    options: Options,
    metrics: OperatorMetrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Stopped {
    let shutdown = shutdown.boxed().shared();
    let elector = options.leader_identity.as_ref().map(|me| {
        LeaderElector::new(
            client.clone(),
            &options.settings.operator_namespace,
            LEASE_NAME,
            me,
        )
    });
    if let Some(e) = &elector {
        tokio::select! {
            _ = e.acquire() => {}
            _ = shutdown.clone() => return Stopped::Shutdown,
        }
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: MANAGER.into(),
            instance: options.leader_identity.clone(),
        },
    );
    let mut tasks = Tasks::default();
    metrics.set_leader(true);
    let status = crate::status_metrics::run(
        client.clone(),
        scopes(&options.namespaces),
        options.dpf,
        metrics.clone(),
        stopped(),
    );
    spawn(&mut tasks, "status metrics", status);
    if options.dpf {
        // One for every scope: a namespace's templates are kept or pruned
        // on what all the provisioners say.
        tracing::info!("DPUServiceTemplate controller starting");
        let templates = crate::dpf::service_templates::run(
            client.clone(),
            scopes(&options.namespaces),
            options.settings.operator_namespace.clone(),
            Some(metrics.clone()),
            stopped(),
        );
        spawn(&mut tasks, "DPUServiceTemplate controller", templates);
    }
    for scope in scopes(&options.namespaces) {
        tracing::info!(?scope, "Infra controller starting");
        let infra = controller::run(
            client.clone(),
            scope.clone(),
            scopes(&options.namespaces),
            options.settings.clone(),
            Some(recorder.clone()),
            Some(metrics.clone()),
            stopped(),
        );
        spawn(&mut tasks, "Infra controller", infra);
        tracing::info!(?scope, "InfraClusterAttachment controller starting");
        let attachments = crate::infra::attachments::run(
            client.clone(),
            scope.clone(),
            scopes(&options.namespaces),
            crate::infra::attachments::HostedAccess {
                endpoint: options.hosted_endpoint,
                cleanup_timeout: options.hosted_cleanup_timeout,
            },
            Some(recorder.clone()),
            Some(metrics.clone()),
            stopped(),
        );
        spawn(&mut tasks, "InfraClusterAttachment controller", attachments);
        if options.dpf {
            tracing::info!(?scope, "DPF bridge starting");
            let bridge = crate::dpf::controller::run(
                client.clone(),
                scope.clone(),
                options.settings.operator_namespace.clone(),
                Some(recorder.clone()),
                Some(metrics.clone()),
                stopped(),
            );
            spawn(&mut tasks, "DPF bridge", bridge);
        }
        if let (true, Some(approver)) = (options.dpf, &options.csr_approver) {
            tracing::info!(?scope, "CSR approver starting");
            let approver = crate::dpf::approver::run(
                client.clone(),
                scope.clone(),
                approver.clone(),
                Some(recorder.clone()),
                Some(metrics.clone()),
                stopped(),
            );
            spawn(&mut tasks, "CSR approver", approver);
        }
        if options.infra_for_hosted_clusters {
            let hosted =
                crate::infra::hosted::run(client.clone(), scope, Some(metrics.clone()), stopped());
            spawn(&mut tasks, "HostedCluster watch", hosted);
        }
    }
    let lost = async {
        match &elector {
            Some(e) => e.keep().await,
            None => std::future::pending().await,
        }
    };
    let why = tokio::select! {
        _ = shutdown => Stopped::Shutdown,
        _ = lost => Stopped::LostLeadership,
    };
    let _ = stop_tx.send(true);
    metrics.set_leader(false);
    if why == Stopped::LostLeadership {
        // Another replica may take over once the lease expires: no
        // reconcile of ours may still be running by then, so the tasks are
        // aborted rather than drained.
        tasks.set.abort_all();
    }
    let drained = tokio::time::timeout(DRAIN_DEADLINE, async {
        while let Some(done) = tasks.set.join_next_with_id().await {
            let id = match done {
                Ok((id, ())) => id,
                Err(e) => e.id(),
            };
            tasks.names.remove(&id);
        }
    })
    .await;
    if drained.is_err() {
        let running: Vec<&str> = tasks.names.values().copied().collect();
        tracing::warn!(
            deadline_seconds = DRAIN_DEADLINE.as_secs(),
            ?running,
            "controllers did not stop in time; aborted"
        );
        tasks.set.shutdown().await;
    }
    if let (Stopped::Shutdown, Some(e)) = (why, &elector) {
        match tokio::time::timeout(RELEASE_DEADLINE, e.release()).await {
            Ok(Ok(true)) => tracing::info!(lease = LEASE_NAME, "leadership handed back"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not hand the lease back; it runs out by itself")
            }
            Err(_) => tracing::warn!(
                deadline_seconds = RELEASE_DEADLINE.as_secs(),
                "the API server did not answer the lease hand-back in time; it runs out by itself"
            ),
        }
    }
    why
}
