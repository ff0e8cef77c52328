//! `causeway operator`: the Kubernetes operator, with its admin server and
//! leader election. `causeway operator crd` prints the Infra CRD.

use std::net::SocketAddr;

use anyhow::Context;
use causeway_operator::controller::{self, OperatorMetrics};
use causeway_operator::leader::LeaderElector;
use causeway_runtime::admin::Admin;
use causeway_runtime::{readiness::Readiness, shutdown, telemetry};
use tokio::signal::unix::{signal, SignalKind};

pub struct Options {
    pub admin_listen: SocketAddr,
    pub leader_election: bool,
    pub log_level: String,
}

pub fn print_crd() -> anyhow::Result<()> {
    print!("{}", causeway_operator::crd::crd_yaml()?);
    Ok(())
}

pub fn run(opts: Options) -> anyhow::Result<()> {
    telemetry::init(&opts.log_level, telemetry::Format::Json)?;
    let image = std::env::var("CAUSEWAY_IMAGE").context(
        "CAUSEWAY_IMAGE must name the image the data-plane pods run (the chart sets it)",
    )?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("causeway-operator")
        .build()
        .context("starting the async runtime")?
        .block_on(serve(opts, image))
}

async fn serve(opts: Options, image: String) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .context("registering process metrics")?;
    let metrics = OperatorMetrics::new(&registry).context("registering operator metrics")?;
    let readiness = Readiness::default();
    let ready = readiness.register("controller");
    let (trigger, stop) = shutdown::channel();
    let (admin_addr, admin_task) = Admin::new(registry, readiness)
        .bind(opts.admin_listen, None, stop.clone())
        .await
        .with_context(|| format!("admin server on {}", opts.admin_listen))?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    tracing::info!(admin = %admin_addr, image, "causeway operator starting");

    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let stop_signal = async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = sigint.recv() => tracing::info!("SIGINT: shutting down"),
        }
    };
    tokio::pin!(stop_signal);

    let elector = opts.leader_election.then(|| {
        let ns = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
        let me = std::env::var("POD_NAME").unwrap_or_else(|_| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "causeway-operator".into())
        });
        LeaderElector::new(client.clone(), &ns, "causeway-operator", &me)
    });
    ready.set(true);
    if let Some(e) = &elector {
        tokio::select! {
            _ = e.acquire() => {}
            _ = &mut stop_signal => {
                trigger.trigger();
                let _ = admin_task.await;
                return Ok(());
            }
        }
    }
    let (controller_stop_tx, controller_stop_rx) = tokio::sync::watch::channel(false);
    let mut infra_stop = controller_stop_rx.clone();
    let mut hosted_stop = controller_stop_rx;
    let controller = tokio::spawn(controller::run(
        client.clone(),
        image,
        metrics,
        async move {
            let _ = infra_stop.wait_for(|stop| *stop).await;
        },
    ));
    let hosted = tokio::spawn(causeway_operator::hosted::run(client, async move {
        let _ = hosted_stop.wait_for(|stop| *stop).await;
    }));
    let lost = async {
        match &elector {
            Some(e) => e.keep().await,
            None => std::future::pending().await,
        }
    };
    let lost_leadership = tokio::select! {
        _ = &mut stop_signal => false,
        _ = lost => true,
    };
    let _ = controller_stop_tx.send(true);
    let _ = controller.await;
    let _ = hosted.await;
    trigger.trigger();
    let _ = admin_task.await;
    if lost_leadership {
        anyhow::bail!("leadership lost; exiting so a restart can compete again");
    }
    tracing::info!("causeway operator stopped");
    Ok(())
}
