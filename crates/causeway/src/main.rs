//! `causeway`: one binary, one subcommand per job (`appliance`, `dns`,
//! `proxy`, `route`, `check`, `leases`, `operator`, `crd`).
//!
//! It is wiring only, not a home for logic: parsing the command line,
//! loading config and handing each library crate its part. Protocols,
//! validation and reconcilers live in the library crates.

mod appliance;
mod ha;
mod leases;
mod operator;
mod out;
mod route;
mod witness;

use std::path::PathBuf;
use std::process::ExitCode;

use causeway_operator::dpf::approver::ApproverOptions;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "causeway",
    version,
    about = "DHCP, DNS, proxy and policy routing for hosted-cluster nodes on isolated VLANs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the operator's many flags cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run every service the config enables, with one admin server.
    /// Without --config, runs the embedded loopback example (examples/local.yaml).
    Appliance {
        /// The appliance config (YAML). SIGHUP or a change to the file reloads it.
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run only the DNS server of a config (with the admin server).
    Dns {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run only the L4 proxy of a config (with the admin server).
    Proxy {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The Kubernetes operator: Infra objects become causeway pods on the
    /// VLAN, and the DPF bridge. `causeway operator crd` prints a CRD.
    Operator {
        #[command(subcommand)]
        what: Option<OperatorCommand>,
        /// The admin server: /metrics, /healthz, /readyz.
        #[arg(long, default_value = "0.0.0.0:8080")]
        admin_listen: std::net::SocketAddr,
        /// Serve the admin port over TLS with `tls.crt` and `tls.key` from
        /// this directory (read again when they change); plain HTTP without.
        #[arg(long, env = "CAUSEWAY_ADMIN_TLS_DIR")]
        admin_tls_dir: Option<std::path::PathBuf>,
        /// Answer /metrics only to a bearer token whose user may `get` the
        /// non-resource URL /metrics (TokenReview, SubjectAccessReview);
        /// /healthz and /readyz stay open for the kubelet.
        #[arg(long, env = "CAUSEWAY_ADMIN_METRICS_AUTH", default_value_t = false, action = clap::ArgAction::Set)]
        admin_metrics_auth: bool,
        /// Take a coordination.k8s.io Lease before reconciling, so several
        /// replicas are safe (env CAUSEWAY_LEADER_ELECTION=false turns it off).
        #[arg(long, env = "CAUSEWAY_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
        leader_election: bool,
        #[arg(long, env = "CAUSEWAY_LOG_LEVEL", default_value = "info")]
        log_level: String,
        /// Watch only these namespaces (comma-separated); all when empty.
        #[arg(
            long,
            env = "CAUSEWAY_WATCH_NAMESPACES",
            value_delimiter = ',',
            default_value = ""
        )]
        namespaces: Vec<String>,
        /// Make an Infra for each HostedCluster annotated causeway.io/infra.
        /// Off by default: anyone who may annotate a HostedCluster would get
        /// NET_ADMIN pods.
        #[arg(long, env = "CAUSEWAY_INFRA_FOR_HOSTED_CLUSTERS", default_value_t = false, action = clap::ArgAction::Set)]
        infra_for_hosted_clusters: bool,
        /// Render a PodMonitor (monitoring.coreos.com/v1) per Infra, so
        /// Prometheus scrapes its pods, where the API server serves the kind.
        #[arg(long, env = "CAUSEWAY_POD_MONITORS", default_value_t = true, action = clap::ArgAction::Set)]
        pod_monitors: bool,
        /// Run the DPF bridge: DPFHCPProvisioner objects become HyperShift
        /// hosted clusters for DPF DPUClusters.
        #[arg(long, env = "CAUSEWAY_DPF", default_value_t = true, action = clap::ArgAction::Set)]
        dpf: bool,
        /// The only registries the BlueField image lookup may ask
        /// (comma-separated `host[:port]`, as image references write them);
        /// any registry at a public address when empty.
        #[arg(
            long,
            env = "CAUSEWAY_BLUEFIELD_ALLOWED_REGISTRIES",
            value_delimiter = ',',
            default_value = ""
        )]
        bluefield_allowed_registries: Vec<String>,
        /// Lets the BlueField lookup ask registries on loopback addresses.
        /// For tests with a registry on loopback only: in a pod it would let
        /// whoever creates a provisioner reach the pod's own ports.
        #[arg(long, hide = true, env = "CAUSEWAY_BLUEFIELD_ALLOW_LOOPBACK_REGISTRIES", default_value_t = false, action = clap::ArgAction::Set)]
        bluefield_allow_loopback_registries: bool,
        /// With the DPF bridge: approve the kubelet CSRs of DPUs in their
        /// hosted clusters (docs/operator.md has the rules).
        #[arg(long, env = "CAUSEWAY_CSR_APPROVER", default_value_t = true, action = clap::ArgAction::Set)]
        csr_approver: bool,
        /// How the approver reaches a hosted API server: `service` (the
        /// control plane's kube-apiserver Service) or `kubeconfig` (the
        /// server the admin kubeconfig names).
        #[arg(
            long,
            env = "CAUSEWAY_HOSTED_APISERVER",
            value_enum,
            default_value = "service"
        )]
        hosted_apiserver: operator::HostedApiserver,
        /// How long a deleted InfraClusterAttachment waits for its hosted
        /// cluster to be reachable, to remove the apps ingress objects made
        /// there, before it goes and leaves them behind (with a warning
        /// naming them).
        #[arg(
            long,
            env = "CAUSEWAY_HOSTED_CLEANUP_TIMEOUT_SECONDS",
            default_value_t = 600
        )]
        hosted_cleanup_timeout_seconds: u64,
        /// CSRs asking for a longer certificate lifetime are denied.
        #[arg(long, env = "CAUSEWAY_CSR_MAX_EXPIRATION_SECONDS", default_value_t = 367 * 24 * 3600)]
        csr_max_expiration_seconds: i32,
        /// The pending-CSR cap is the number of DPUs (or Nodes) plus this.
        #[arg(long, env = "CAUSEWAY_CSR_PENDING_SLACK", default_value_t = 20)]
        csr_pending_slack: usize,
        /// A bootstrap CSR made more than this many seconds before the
        /// approver saw its DPU begin joining is denied as staged.
        #[arg(long, env = "CAUSEWAY_CSR_CREATION_SKEW_SECONDS", default_value_t = 10)]
        csr_creation_skew_seconds: u32,
        /// A bootstrap CSR is approved only once this many seconds old; a
        /// second request for the same node meanwhile gets both denied.
        #[arg(
            long,
            env = "CAUSEWAY_CSR_BOOTSTRAP_HOLD_SECONDS",
            default_value_t = 15
        )]
        csr_bootstrap_hold_seconds: u32,
        /// The hosted cluster's ConfigMap (`namespace/name`) whose
        /// `ca-bundle.crt` verifies kubelet serving certificates: a serving
        /// renewal is held to the kubelet's live certificate where it can
        /// be read. Empty: held to the recorded SANs only.
        #[arg(
            long,
            env = "CAUSEWAY_CSR_KUBELET_SERVING_CA",
            default_value = "openshift-config-managed/kubelet-serving-ca",
            value_parser = parse_configmap_ref
        )]
        csr_kubelet_serving_ca: ConfigMapRef,
        /// Serve the validating admission webhook (HTTPS, path /validate)
        /// on this address; off when not given.
        #[arg(long, env = "CAUSEWAY_WEBHOOK_LISTEN")]
        webhook_listen: Option<std::net::SocketAddr>,
        /// The webhook's certificate: tls.crt and tls.key in this
        /// directory, read again whenever they change.
        #[arg(
            long,
            env = "CAUSEWAY_WEBHOOK_CERT_DIR",
            default_value = "/etc/causeway/webhook"
        )]
        webhook_cert_dir: std::path::PathBuf,
        /// Make the webhook's CA and certificate (kept in this Secret of the
        /// operator's namespace) instead of reading a mounted pair.
        #[arg(long, env = "CAUSEWAY_WEBHOOK_SELF_SIGNED_SECRET")]
        webhook_self_signed_secret: Option<String>,
        /// With a self-signed certificate: the webhook's Service (the
        /// certificate's names) ...
        #[arg(
            long,
            env = "CAUSEWAY_WEBHOOK_SERVICE",
            default_value = "causeway-webhook"
        )]
        webhook_service: String,
        /// ... and the ValidatingWebhookConfiguration given the CA.
        #[arg(
            long,
            env = "CAUSEWAY_WEBHOOK_CONFIGURATION",
            default_value = "causeway"
        )]
        webhook_configuration: String,
        /// Seconds between checks of the self-signed pair. For tests that
        /// rotate the CA in seconds; a CA staged at one check signs at the
        /// next.
        #[arg(long, hide = true, env = "CAUSEWAY_WEBHOOK_SELF_SIGNED_CHECK_SECONDS", default_value_t = causeway_operator::webhook::selfsigned::CHECK_EVERY.as_secs())]
        webhook_self_signed_check_seconds: u64,
        /// More names or addresses for the self-signed certificate. For
        /// tests that register the webhook by URL on loopback.
        #[arg(
            long,
            hide = true,
            env = "CAUSEWAY_WEBHOOK_SELF_SIGNED_EXTRA_SANS",
            value_delimiter = ','
        )]
        webhook_self_signed_extra_sans: Vec<String>,
    },
    /// Policy routing for the config's VLAN interfaces (needs CAP_NET_ADMIN
    /// for apply and flush).
    Route {
        #[arg(value_enum)]
        action: route::Action,
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config: print every error with its path; exit 1 if any.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Remove the HA service addresses (`ha.addresses`) from this host's
    /// interface. For the service manager once the appliance has stopped,
    /// however it stopped (systemd's ExecStopPost): a killed replica must
    /// not stay a second holder of the address.
    HaRelease {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// List the leases in the DHCP lease store. Safe while the server runs.
    Leases {
        #[arg(long, short)]
        config: PathBuf,
        /// Print JSON (an array of lease records) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum OperatorCommand {
    /// Print a CustomResourceDefinition (YAML), as the chart holds it.
    Crd {
        #[arg(value_enum, default_value = "infra")]
        kind: operator::CrdKind,
    },
    /// Write a support tarball (tar.gz): causeway's objects, the
    /// namespaces they are in (Secrets redacted), pod logs and the data
    /// plane's /readyz, /ha and /leases. Connects like the operator
    /// (in-cluster, or KUBECONFIG).
    MustGather {
        /// Where the tarball goes.
        #[arg(long, short, default_value = "causeway-must-gather.tar.gz")]
        output: PathBuf,
        /// The operator's namespace (the chart's release namespace).
        #[arg(long, default_value = "causeway-system")]
        namespace: String,
    },
}

/// A ConfigMap named as `namespace/name`; empty for none.
#[derive(Debug, Clone)]
struct ConfigMapRef(Option<(String, String)>);

fn parse_configmap_ref(text: &str) -> Result<ConfigMapRef, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(ConfigMapRef(None));
    }
    match text.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(ConfigMapRef(Some((
                namespace.to_string(),
                name.to_string(),
            ))))
        }
        _ => Err(format!(
            "{text:?} is not namespace/name (or empty, for none)"
        )),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Appliance { config } => appliance::run(config, appliance::Only::All),
        Command::Dns { config } => appliance::run(Some(config), appliance::Only::Dns),
        Command::Proxy { config } => appliance::run(Some(config), appliance::Only::Proxy),
        Command::Route { action, config } => route::run(action, &config),
        Command::Operator {
            what: Some(OperatorCommand::Crd { kind }),
            ..
        } => operator::print_crd(kind),
        Command::Operator {
            what: Some(OperatorCommand::MustGather { output, namespace }),
            ..
        } => operator::must_gather(&output, &namespace),
        Command::Operator {
            what: None,
            admin_listen,
            admin_tls_dir,
            admin_metrics_auth,
            leader_election,
            log_level,
            namespaces,
            infra_for_hosted_clusters,
            pod_monitors,
            dpf,
            bluefield_allowed_registries,
            bluefield_allow_loopback_registries,
            csr_approver,
            hosted_apiserver,
            hosted_cleanup_timeout_seconds,
            csr_max_expiration_seconds,
            csr_pending_slack,
            csr_creation_skew_seconds,
            csr_bootstrap_hold_seconds,
            csr_kubelet_serving_ca,
            webhook_listen,
            webhook_cert_dir,
            webhook_self_signed_secret,
            webhook_service,
            webhook_configuration,
            webhook_self_signed_check_seconds,
            webhook_self_signed_extra_sans,
        } => operator::run(operator::Options {
            admin_listen,
            admin_tls_dir,
            admin_metrics_auth,
            leader_election,
            log_level,
            namespaces: namespaces.into_iter().filter(|n| !n.is_empty()).collect(),
            infra_for_hosted_clusters,
            pod_monitors,
            dpf,
            bluefield_allowed_registries: bluefield_allowed_registries
                .into_iter()
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty())
                .collect(),
            bluefield_allow_loopback_registries,
            hosted_endpoint: hosted_apiserver.into(),
            hosted_cleanup_timeout: std::time::Duration::from_secs(hosted_cleanup_timeout_seconds),
            csr_approver: csr_approver.then_some(ApproverOptions {
                endpoint: hosted_apiserver.into(),
                max_expiration_seconds: csr_max_expiration_seconds,
                pending_slack: csr_pending_slack,
                creation_skew_seconds: csr_creation_skew_seconds.into(),
                bootstrap_hold_seconds: csr_bootstrap_hold_seconds.into(),
                kubelet_serving_ca: csr_kubelet_serving_ca.0,
            }),
            webhook: webhook_listen.map(|listen| operator::WebhookOptions {
                listen,
                cert_dir: webhook_cert_dir,
                self_signed_secret: webhook_self_signed_secret,
                service: webhook_service,
                configuration: webhook_configuration,
                self_signed_check_every: std::time::Duration::from_secs(
                    webhook_self_signed_check_seconds.max(1),
                ),
                self_signed_extra_sans: webhook_self_signed_extra_sans
                    .into_iter()
                    .filter(|s| !s.trim().is_empty())
                    .collect(),
            }),
        }),
        Command::Check { config } => return check(&config),
        Command::Leases { config, json } => leases::run(&config, json),
        Command::HaRelease { config } => ha::release_now(&config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if out::reader_gone(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("causeway: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match causeway_config::Config::load(path) {
        Ok(cfg) => {
            let services: Vec<&str> = [
                cfg.dhcp.as_ref().map(|_| "dhcp"),
                cfg.dns.as_ref().map(|_| "dns"),
                cfg.proxy.as_ref().map(|_| "proxy"),
                cfg.routing.as_ref().map(|_| "routing"),
                cfg.ha.as_ref().map(|_| "ha"),
                cfg.router_advertisements
                    .as_ref()
                    .map(|_| "routerAdvertisements"),
                cfg.dhcp6.as_ref().map(|d| {
                    if d.stateful.is_some() {
                        "dhcp6 (leasing)"
                    } else {
                        "dhcp6"
                    }
                }),
            ]
            .into_iter()
            .flatten()
            .collect();
            // A reader gone before the verdict is no failure of the check.
            let _ = out::outln!(
                "{}: valid; services: {}",
                path.display(),
                if services.is_empty() {
                    "none".to_string()
                } else {
                    services.join(", ")
                }
            );
            // The key is read at start; a file not there yet (copied to the
            // VM later) is said, not refused.
            if let Some(ha) = &cfg.ha {
                if let Err(e) = ha::read_key(ha) {
                    let _ = out::outln!("{}: warning: {e:#}", path.display());
                }
            }
            // Valid, and still serving nobody somewhere: said, not refused.
            for note in cfg
                .dhcp
                .as_ref()
                .map(|d| d.unreachable_subnets())
                .unwrap_or_default()
            {
                let _ = out::outln!("{}: warning: {note}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(causeway_config::LoadError::Invalid(errors)) => {
            for e in &errors.0 {
                eprintln!("{}: {e}", path.display());
            }
            eprintln!("{}: {} error(s)", path.display(), errors.0.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("causeway: {e}");
            ExitCode::FAILURE
        }
    }
}
