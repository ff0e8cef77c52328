//! `causeway operator`: the Kubernetes operator, with its admin server.
//! Leader election and the controllers' lifecycle live in the operator
//! crate (`causeway_operator::manager`); this wires them to the process.
//! `causeway operator crd [infra|dpfhcpprovisioner|dpfhcpprovisionerconfig]`
//! prints a CRD.

use std::net::SocketAddr;

use anyhow::Context;
use causeway_operator::dpf::approver::ApproverOptions;
use causeway_operator::hosted::HostedEndpoint;
use causeway_operator::infra::plan::Settings;
use causeway_operator::k8s::metrics::OperatorMetrics;
use causeway_operator::k8s::metrics_auth::MetricsAuth;
use causeway_operator::manager::{self, Stopped};
use causeway_operator::webhook::tls::ReloadingCert;
use causeway_runtime::admin::Admin;
use causeway_runtime::{readiness::Readiness, signals, telemetry, Shutdown};

pub struct Options {
    pub admin_listen: SocketAddr,
    /// Serve the admin port over TLS with `tls.crt` and `tls.key` from here.
    pub admin_tls_dir: Option<std::path::PathBuf>,
    /// Answer `/metrics` only to a bearer token whose user may `get` it.
    pub admin_metrics_auth: bool,
    pub leader_election: bool,
    pub log_level: String,
    pub namespaces: Vec<String>,
    pub infra_for_hosted_clusters: bool,
    pub pod_monitors: bool,
    pub dpf: bool,
    /// The BlueField lookup's registry allowlist; empty: any public one.
    pub bluefield_allowed_registries: Vec<String>,
    /// Tests only: a registry on loopback may be asked.
    pub bluefield_allow_loopback_registries: bool,
    pub csr_approver: Option<ApproverOptions>,
    /// How hosted clusters' API servers are reached.
    pub hosted_endpoint: HostedEndpoint,
    /// How long a deleted attachment waits for an unreachable hosted
    /// cluster.
    pub hosted_cleanup_timeout: std::time::Duration,
    pub webhook: Option<WebhookOptions>,
}

pub struct WebhookOptions {
    pub listen: SocketAddr,
    pub cert_dir: std::path::PathBuf,
    pub self_signed_secret: Option<String>,
    pub service: String,
    pub configuration: String,
    /// Tests only: how often the self-signed pair is checked (and so how
    /// long a staged CA waits before it signs).
    pub self_signed_check_every: std::time::Duration,
    /// Tests only: more names for the self-signed certificate.
    pub self_signed_extra_sans: Vec<String>,
}

/// How the CSR approver reaches a hosted cluster's API server.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum HostedApiserver {
    Service,
    Kubeconfig,
}

impl From<HostedApiserver> for HostedEndpoint {
    fn from(h: HostedApiserver) -> Self {
        match h {
            HostedApiserver::Service => HostedEndpoint::Service,
            HostedApiserver::Kubeconfig => HostedEndpoint::Kubeconfig,
        }
    }
}

/// Which CRD `causeway operator crd` prints.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CrdKind {
    Infra,
    Infraclusterattachment,
    Dpfhcpprovisioner,
    Dpfhcpprovisionerconfig,
}

pub fn print_crd(kind: CrdKind) -> anyhow::Result<()> {
    let (provisioner, config) = causeway_operator::dpf::crd::crd_yaml()?;
    let text = match kind {
        CrdKind::Infra => causeway_operator::infra::crd::crd_yaml()?,
        CrdKind::Infraclusterattachment => causeway_operator::infra::attachment::crd_yaml()?,
        CrdKind::Dpfhcpprovisioner => provisioner,
        CrdKind::Dpfhcpprovisionerconfig => config,
    };
    crate::out::text(&text)?;
    Ok(())
}

/// Writes the support tarball to `output`; says what it holds and what
/// could not be read.
pub fn must_gather(output: &std::path::Path, namespace: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = causeway_operator::k8s::client::connect()
            .await
            .context("connecting to the Kubernetes API (in-cluster, or KUBECONFIG)")?;
        let file = std::fs::File::create(output)
            .with_context(|| format!("creating {}", output.display()))?;
        let (files, failed) = causeway_operator::must_gather::gather(&client, namespace, file)
            .await
            .with_context(|| format!("writing {}", output.display()))?;
        crate::out::text(&format!(
            "{}: {files} files; {} things could not be read (errors.txt)\n",
            output.display(),
            failed.len()
        ))?;
        Ok(())
    })
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    telemetry::init(&opts.log_level, telemetry::Format::Json)?;
    let image = std::env::var("CAUSEWAY_IMAGE").context(
        "CAUSEWAY_IMAGE must name the image the data-plane pods run (the chart sets it)",
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("causeway-operator")
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve(opts, image));
    // Tasks still running (a request to an API server that does not
    // answer, a blocking name lookup) must not hold the exit: the manager
    // has drained and handed the Lease back, or given up on both in time.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The pod's identity for the Lease: POD_NAME, else the host name.
fn identity() -> String {
    std::env::var("POD_NAME").unwrap_or_else(|_| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "causeway-operator".into())
    })
}

async fn serve(opts: Options, image: String) -> anyhow::Result<()> {
    // Before the controller and the webhook make their registry clients.
    causeway_operator::registry::RegistryPolicy {
        allowed: opts.bluefield_allowed_registries.clone(),
        allow_loopback: opts.bluefield_allow_loopback_registries,
    }
    .install();
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .context("registering process metrics")?;
    let metrics = OperatorMetrics::new(&registry).context("registering operator metrics")?;
    let readiness = Readiness::default();
    let ready = readiness.register("controller");
    let stop = Shutdown::new();
    let client = causeway_operator::k8s::client::connect()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let mut admin = Admin::new(registry.clone(), readiness);
    if opts.admin_metrics_auth {
        let auth = std::sync::Arc::new(MetricsAuth::new(client.clone()));
        admin = admin.guard_metrics(std::sync::Arc::new(move |token| {
            let auth = auth.clone();
            Box::pin(async move { auth.check(token).await })
        }));
    }
    let (admin_addr, admin_task) = match &opts.admin_tls_dir {
        None => admin.bind(opts.admin_listen, None, stop.clone()).await,
        Some(dir) => {
            let cert = ReloadingCert::new(dir)
                .with_context(|| format!("the admin port's certificate in {}", dir.display()))?;
            let tls = std::sync::Arc::new(std::sync::Arc::new(cert).server_config());
            admin.bind_tls(opts.admin_listen, tls, stop.clone()).await
        }
    }
    .with_context(|| format!("admin server on {}", opts.admin_listen))?;
    let operator_namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
    tracing::info!(admin = %admin_addr, admin_tls = opts.admin_tls_dir.is_some(), metrics_auth = opts.admin_metrics_auth, image, namespaces = ?opts.namespaces, "causeway operator starting");

    let mut stop_signals = signals().context("installing the SIGTERM and SIGINT handlers")?;
    let stop_signal = async move {
        let name = stop_signals.recv().await;
        tracing::info!("{name}: shutting down");
    };
    if let Some(w) = &opts.webhook {
        start_webhook(w, &client, &operator_namespace, &registry, stop.clone()).await?;
    }
    ready.set(true);
    let options = manager::Options {
        namespaces: opts.namespaces,
        infra_for_hosted_clusters: opts.infra_for_hosted_clusters,
        dpf: opts.dpf,
        csr_approver: opts.csr_approver,
        hosted_endpoint: opts.hosted_endpoint,
        hosted_cleanup_timeout: opts.hosted_cleanup_timeout,
        leader_identity: opts.leader_election.then(identity),
        settings: Settings {
            image,
            operator_namespace,
            resources: None,
            pod_monitors: opts.pod_monitors,
        },
    };
    let stopped = manager::run(client, options, metrics, stop_signal).await;
    stop.cancel();
    let _ = admin_task.await;
    if stopped == Stopped::LostLeadership {
        anyhow::bail!("leadership lost; exiting so a restart can compete again");
    }
    tracing::info!("causeway operator stopped");
    Ok(())
}

/// Starts the admission webhook: with a self-signed pair, makes or reads it
/// first and keeps it renewed.
async fn start_webhook(
    w: &WebhookOptions,
    client: &kube::Client,
    namespace: &str,
    registry: &prometheus::Registry,
    stop: Shutdown,
) -> anyhow::Result<()> {
    use causeway_operator::webhook::{selfsigned, server};
    let expiry = prometheus::IntGauge::new(
        "causeway_operator_webhook_certificate_expiry_timestamp_seconds",
        "The notAfter (Unix seconds) of the certificate the admission webhook serves",
    )
    .context("the webhook certificate's metric")?;
    registry
        .register(Box::new(expiry.clone()))
        .context("registering the webhook certificate's metric")?;
    if let Some(secret) = &w.self_signed_secret {
        std::fs::create_dir_all(&w.cert_dir)
            .with_context(|| format!("creating {}", w.cert_dir.display()))?;
        let names = selfsigned::Names {
            namespace: namespace.to_string(),
            secret: secret.clone(),
            service: w.service.clone(),
            configuration: w.configuration.clone(),
            extra_sans: w.self_signed_extra_sans.clone(),
        };
        let every = w.self_signed_check_every;
        let timing = selfsigned::Timing::checked_every(every);
        selfsigned::ensure(client, &names, &w.cert_dir, &timing)
            .await
            .context("the webhook's self-signed certificate")?;
        let (client, dir) = (client.clone(), w.cert_dir.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = selfsigned::ensure(&client, &names, &dir, &timing).await {
                    tracing::warn!(error = %e, "renewing the webhook's certificate");
                }
            }
        });
    }
    let bound = server::run(
        w.listen,
        &w.cert_dir,
        client.clone(),
        namespace.to_string(),
        Some(expiry),
        async move { stop.cancelled().await },
    )
    .await
    .context("starting the admission webhook")?;
    tracing::info!(listen = %bound, "admission webhook started");
    Ok(())
}
