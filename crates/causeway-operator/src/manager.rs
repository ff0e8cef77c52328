//! The operator's lifecycle: wait for leadership (when elected), run the
//! controllers over the watched namespaces, and stop them all the moment
//! leadership is lost or shutdown is asked for. The binary only wires this
//! to signals and the admin server.

use futures::future::join_all;
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

pub struct Options {
    /// The namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Make Infras for HostedClusters annotated to ask for one.
    pub infra_for_hosted_clusters: bool,
    /// Run the DPF bridge (DPFHCPProvisioner objects).
    pub dpf: bool,
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
    let mut tasks = Vec::new();
    for scope in scopes(&options.namespaces) {
        tracing::info!(?scope, "Infra controller starting");
        tasks.push(tokio::spawn(controller::run(
            client.clone(),
            scope.clone(),
            options.settings.clone(),
            Some(recorder.clone()),
            Some(metrics.clone()),
            stopped(),
        )));
        if options.dpf {
            tracing::info!(?scope, "DPF bridge starting");
            tasks.push(tokio::spawn(crate::dpf::controller::run(
                client.clone(),
                scope.clone(),
                options.settings.operator_namespace.clone(),
                Some(recorder.clone()),
                Some(metrics.clone()),
                stopped(),
            )));
        }
        if let (true, Some(approver)) = (options.dpf, &options.csr_approver) {
            tracing::info!(?scope, "CSR approver starting");
            tasks.push(tokio::spawn(crate::dpf::approver::run(
                client.clone(),
                scope.clone(),
                approver.clone(),
                Some(recorder.clone()),
                Some(metrics.clone()),
                stopped(),
            )));
        }
        if options.infra_for_hosted_clusters {
            tasks.push(tokio::spawn(crate::infra::hosted::run(
                client.clone(),
                scope,
                stopped(),
            )));
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
    if why == Stopped::LostLeadership {
        // Another replica may take over once the lease expires: no
        // reconcile of ours may still be running by then, so the tasks are
        // aborted rather than drained.
        for t in &tasks {
            t.abort();
        }
    }
    join_all(tasks).await;
    why
}
