// `causeway-bench operator`: the operator at scale against a real API
// server. It installs the chart's objects (from a `helm template`
// rendering), starts the `causeway operator` binary under the chart's
// ServiceAccount, creates N Infras, and measures:
// - the time until every Infra has its status for its generation and every
//   child object exists;
// - over a steady window: the operator's reconciles, its API writes (its
//   own counter), and the objects whose resourceVersion moved (what the API
//   server saw, whoever wrote);
// - the operator's RSS (now and peak).
//
// The cluster itself is started by bench/operator-scale.sh.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use causeway_operator::infra::crd::Infra;
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, PartialObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;

const NAD_CRD: &str = include_str!("../../tests/kube/crds/network-attachment-definition.yaml");
const RELEASE_NAMESPACE: &str = "causeway-system";
const OPERATOR_SA: &str = "causeway";
const MANAGER: &str = "causeway-bench";
const OURS: &str = "app.kubernetes.io/managed-by=causeway-operator";

#[derive(clap::Args, Debug)]
pub struct OperatorArgs {
    /// An admin kubeconfig of the cluster (system:masters)
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// The chart rendered by `helm template` (the operator's Deployment in it
    /// is skipped: the bench runs the binary)
    #[arg(long)]
    chart: PathBuf,
    /// The `causeway` binary to run as the operator
    #[arg(long)]
    causeway: PathBuf,
    /// How many Infras to create
    #[arg(long, default_value_t = 1000)]
    infras: usize,
    /// Creates in flight at once
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Length of the steady-state window, in seconds
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Give up converging after this many seconds
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// The namespace the Infras go to (made if missing)
    #[arg(long, default_value = "bench")]
    namespace: String,
    /// Print the result as JSON too
    #[arg(long)]
    json: bool,
}

async fn client_from(path: &Path) -> anyhow::Result<Client> {
    causeway_operator::k8s::client::install_tls_provider();
    let kc = Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A kubeconfig like `admin`'s, with the ServiceAccount token instead.
fn operator_kubeconfig(admin: &Path, token: &str, out: &Path) -> anyhow::Result<()> {
    let kc = Kubeconfig::read_from(admin)?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the admin kubeconfig has no cluster")?;
    let server = cluster.server.context("the cluster has no server")?;
    let ca = cluster
        .certificate_authority
        .context("the cluster names no certificate-authority file")?;
    let text = causeway_operator::k8s::manifest::token_kubeconfig(&server, Path::new(&ca), token);
    std::fs::write(out, text)?;
    Ok(())
}

async fn setup(client: &Client, args: &OperatorArgs) -> anyhow::Result<String> {
    for ns in [RELEASE_NAMESPACE, args.namespace.as_str()] {
        let doc = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
        causeway_operator::k8s::manifest::apply(client, &doc, ns, MANAGER).await?;
    }
    let chart = std::fs::read_to_string(&args.chart)
        .with_context(|| format!("reading {}", args.chart.display()))?;
    // The bench runs the operator's binary itself, without the webhook, so
    // neither the Deployment nor the webhook configuration (whose Service
    // nothing here serves, and which would refuse every Infra) is
    // installed; and the 1.20 API server refuses the DPF CRDs' CEL rules in
    // an apply.
    use causeway_operator::k8s::manifest::{without_cel, without_kind};
    let chart = without_kind(&chart, "Deployment");
    let chart = without_cel(&without_kind(&chart, "ValidatingWebhookConfiguration"))
        .context("reading the chart")?;
    causeway_operator::k8s::manifest::apply(client, &chart, RELEASE_NAMESPACE, MANAGER)
        .await
        .context("installing the chart")?;
    causeway_operator::k8s::manifest::apply(client, NAD_CRD, "default", MANAGER).await?;
    let nad = format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: vlan100, namespace: {}}}\nspec: {{config: '{{}}'}}\n",
        args.namespace
    );
    causeway_operator::k8s::manifest::apply(client, &nad, &args.namespace, MANAGER).await?;
    Ok(causeway_operator::k8s::manifest::service_account_token(
        client,
        RELEASE_NAMESPACE,
        OPERATOR_SA,
        "https://kubernetes.default.svc",
        Duration::from_secs(4 * 3600),
    )
    .await?)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    (out.split_whitespace().nth(1) == Some("200")).then_some(out)
}

/// The sum of every sample of a metric family.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// VmRSS and VmHWM of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct OperatorProcess {
    child: Child,
    admin: std::net::SocketAddr,
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn infra(name: &str, ns: &str) -> anyhow::Result<Infra> {
    let doc = serde_json::json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1",
        "kind": "Infra",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1",
                "networkAttachmentDefinition": "vlan100", "dnsServers": ["192.0.2.53"]},
            "infraComponents": {
                "dhcp": {"serverIP": "192.168.100.2", "rangeStart": "192.168.100.100",
                    "rangeEnd": "192.168.100.200", "leaseTime": "1h"},
                "dns": {"serverIP": "192.168.100.3", "baseDomain": "example.com",
                    "clusterName": name},
                "proxy": {"serverIP": "192.168.100.10"}
            }
        }
    });
    Ok(serde_json::from_value(doc)?)
}

/// The metadata of the objects of one kind in `ns` (those `selector`
/// picks, when given).
async fn metadata<K>(
    client: &Client,
    ns: &str,
    selector: Option<&str>,
) -> anyhow::Result<Vec<PartialObjectMeta<K>>>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let mut lp = ListParams::default();
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    Ok(api.list_metadata(&lp).await?.items)
}

async fn count<K>(client: &Client, ns: &str) -> anyhow::Result<usize>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Ok(metadata::<K>(client, ns, Some(OURS)).await?.len())
}

/// resourceVersion of every Infra and every object of ours.
async fn versions(client: &Client, ns: &str) -> anyhow::Result<BTreeMap<String, String>> {
    fn add<K: Resource<DynamicType = ()>>(
        out: &mut BTreeMap<String, String>,
        items: Vec<PartialObjectMeta<K>>,
    ) {
        for m in items {
            out.insert(
                format!("{}/{}", K::kind(&()), m.name_any()),
                m.resource_version().unwrap_or_default(),
            );
        }
    }
    let mut out = BTreeMap::new();
    add(&mut out, metadata::<Infra>(client, ns, None).await?);
    add(
        &mut out,
        metadata::<ConfigMap>(client, ns, Some(OURS)).await?,
    );
    add(
        &mut out,
        metadata::<Deployment>(client, ns, Some(OURS)).await?,
    );
    add(
        &mut out,
        metadata::<StatefulSet>(client, ns, Some(OURS)).await?,
    );
    add(
        &mut out,
        metadata::<ServiceAccount>(client, ns, Some(OURS)).await?,
    );
    add(&mut out, metadata::<Service>(client, ns, Some(OURS)).await?);
    add(
        &mut out,
        metadata::<NetworkPolicy>(client, ns, Some(OURS)).await?,
    );
    Ok(out)
}

/// Whether every Infra has its status for its generation, and every child
/// is there: the number of Infras so far converged.
async fn converged(client: &Client, ns: &str, n: usize) -> anyhow::Result<(usize, bool)> {
    let api: Api<Infra> = Api::namespaced(client.clone(), ns);
    let infras = api.list(&ListParams::default()).await?.items;
    let done = infras
        .iter()
        .filter(|i| {
            i.status.as_ref().is_some_and(|s| {
                s.observed_generation.is_some() && s.observed_generation == i.metadata.generation
            })
        })
        .count();
    if done < n {
        return Ok((done, false));
    }
    let children = [
        (count::<ConfigMap>(client, ns).await?, 3 * n),
        (count::<Deployment>(client, ns).await?, 2 * n),
        (count::<StatefulSet>(client, ns).await?, n),
        (count::<ServiceAccount>(client, ns).await?, n),
        (count::<Service>(client, ns).await?, n),
        (count::<NetworkPolicy>(client, ns).await?, n),
    ];
    Ok((done, children.iter().all(|(have, want)| have >= want)))
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let admin = client_from(&args.kubeconfig).await?;
    let token = setup(&admin, &args).await?;
    let work = std::env::temp_dir().join(format!("causeway-bench-operator-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let kubeconfig = work.join("operator.kubeconfig");
    operator_kubeconfig(&args.kubeconfig, &token, &kubeconfig)?;
    let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let log = std::fs::File::create(work.join("operator.log"))?;
    let child = Command::new(&args.causeway)
        .args([
            "operator",
            "--admin-listen",
            &admin_addr.to_string(),
            "--leader-election=false",
        ])
        .args(["--namespaces", &args.namespace])
        .env("KUBECONFIG", &kubeconfig)
        .env("CAUSEWAY_IMAGE", "registry.bench/causeway:bench")
        .env("POD_NAMESPACE", RELEASE_NAMESPACE)
        .env("CAUSEWAY_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", args.causeway.display()))?;
    let mut operator = OperatorProcess {
        child,
        admin: admin_addr,
    };
    let pid = operator.child.id();
    let ready_by = Instant::now() + Duration::from_secs(30);
    while http_get(operator.admin, "/readyz").is_none() {
        if Instant::now() > ready_by || operator.child.try_wait()?.is_some() {
            bail!(
                "the operator did not become ready; see {}",
                work.join("operator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (rss_idle, _) = rss_kib(pid);

    let api: Api<Infra> = Api::namespaced(admin.clone(), &args.namespace);
    let started = Instant::now();
    let names: Vec<String> = (0..args.infras).map(|i| format!("infra-{i:05}")).collect();
    stream::iter(names.iter().map(|name| {
        let api = api.clone();
        let ns = args.namespace.clone();
        async move {
            let obj = infra(name, &ns)?;
            api.create(&PostParams::default(), &obj).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(args.concurrency.max(1))
    .try_collect::<Vec<_>>()
    .await?;
    let created = started.elapsed();
    let deadline = started + Duration::from_secs(args.timeout_seconds);
    let converge = loop {
        let (done, all) = converged(&admin, &args.namespace, args.infras).await?;
        if all {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            bail!(
                "{done} of {} Infras converged in {} s",
                args.infras,
                args.timeout_seconds
            );
        }
        if operator.child.try_wait()?.is_some() {
            bail!(
                "the operator exited; see {}",
                work.join("operator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (rss_converged, _) = rss_kib(pid);
    let writes_at_convergence = metric_sum(
        &http_get(operator.admin, "/metrics").unwrap_or_default(),
        "causeway_operator_api_writes_total",
    );

    // The cluster's own controllers go on after the operator's part is
    // done (ReplicaSets, workload status, the operator's status following
    // it): steady state starts once two looks a second apart see no object
    // change.
    let mut before = versions(&admin, &args.namespace).await?;
    let settled = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = versions(&admin, &args.namespace).await?;
        if now == before {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            bail!(
                "the objects never stopped changing within {} s",
                args.timeout_seconds
            );
        }
        before = now;
    };

    // Steady state: nothing changes, so nothing may be written.
    let metrics_before = http_get(operator.admin, "/metrics").unwrap_or_default();
    // The window is what is measured, not a wait for something to happen.
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let metrics_after = http_get(operator.admin, "/metrics").unwrap_or_default();
    let after = versions(&admin, &args.namespace).await?;
    let changed = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .count();
    let reconciles = metric_sum(&metrics_after, "causeway_operator_reconciles_total")
        - metric_sum(&metrics_before, "causeway_operator_reconciles_total");
    let writes = metric_sum(&metrics_after, "causeway_operator_api_writes_total")
        - metric_sum(&metrics_before, "causeway_operator_api_writes_total");
    let total_writes = metric_sum(&metrics_after, "causeway_operator_api_writes_total");
    let (rss_end, rss_peak) = rss_kib(pid);

    println!(
        "operator scale: {} Infras in namespace {}",
        args.infras, args.namespace
    );
    println!(
        "  created in                {:.1} s ({} in flight)",
        created.as_secs_f64(),
        args.concurrency
    );
    println!(
        "  converged in              {:.1} s (every status current, every child there)",
        converge.as_secs_f64()
    );
    println!(
        "  API writes to converge    {writes_at_convergence:.0} ({:.1} per Infra)",
        writes_at_convergence / args.infras as f64
    );
    println!("  settled in                {:.1} s (no object changed for 1 s), {total_writes:.0} writes by then", settled.as_secs_f64());
    println!("  steady window             {} s", args.steady_seconds);
    println!("    reconciles              {reconciles:.0}");
    println!("    writes (operator)       {writes:.0}");
    println!("    objects changed (API)   {changed} of {}", after.len());
    println!(
        "  RSS idle / converged / end / peak  {:.1} / {:.1} / {:.1} / {:.1} MiB",
        rss_idle as f64 / 1024.0,
        rss_converged as f64 / 1024.0,
        rss_end as f64 / 1024.0,
        rss_peak as f64 / 1024.0
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "infras": args.infras,
                "create_seconds": created.as_secs_f64(),
                "converge_seconds": converge.as_secs_f64(),
                "writes_to_converge": writes_at_convergence,
                "settle_seconds": settled.as_secs_f64(),
                "writes_to_settle": total_writes,
                "steady_seconds": args.steady_seconds,
                "steady_reconciles": reconciles,
                "steady_writes": writes,
                "steady_objects_changed": changed,
                "objects": after.len(),
                "rss_kib": {"idle": rss_idle, "converged": rss_converged, "end": rss_end, "peak": rss_peak},
            })
        );
    }
    drop(operator);
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
