//! Applies the wanted policy routing and keeps it applied: at start, on
//! every link or address change, after a reload, and on a slow timer in
//! case someone removed a route by hand.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use causeway_config::{RoutedInterface, RoutingConfig};
use causeway_runtime::Shutdown;
use futures::StreamExt;
use ipnet::Ipv4Net;
use tokio::sync::Mutex;

use crate::metrics::RouteMetrics;
use crate::netlink::{events, Kernel, NetlinkError};
use crate::plan::{diff, wanted, wanted_v6, Changes, Route, Rule};

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("open a netlink socket: {0}")]
    Connect(std::io::Error),
    #[error("interface {0} does not exist")]
    InterfaceMissing(String),
    #[error("{address} is not an address of {interface} (it has: {has})")]
    AddressMissing {
        interface: String,
        address: std::net::Ipv4Addr,
        has: String,
    },
    #[error("set rp_filter on {interface} to loose: {reason}")]
    RpFilter { interface: String, reason: String },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// How one interface stands after a reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Rule and routes installed.
    Routed,
    /// Rule installed; routes wait for the link to come up (the kernel
    /// drops routes through a link that goes down).
    LinkDown,
    LinkMissing,
    AddressMissing,
    /// The v4 side routed; the v6 address is not on the link yet (or is
    /// still tentative: the kernel takes no route from it until DAD ends).
    V6AddressMissing,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Routed => "routed",
            Status::LinkDown => "link down",
            Status::LinkMissing => "interface missing",
            Status::AddressMissing => "address missing",
            Status::V6AddressMissing => "v6 address missing",
        }
    }
}

/// What one reconcile found and did.
#[derive(Debug, Clone)]
pub struct Report {
    pub interfaces: Vec<(String, Status)>,
    /// Rules and routes added or removed.
    pub changed: usize,
}

/// What the kernel should hold, and what it holds of ours.
struct Survey {
    statuses: Vec<(String, Status)>,
    want_rules: Vec<Rule>,
    want_routes: Vec<Route>,
    have_rules: Vec<(Rule, netlink_packet_route::rule::RuleMessage)>,
    have_routes: Vec<(Route, netlink_packet_route::route::RouteMessage)>,
    names: HashMap<u32, String>,
}

impl Survey {
    fn changes(&self) -> Changes {
        let rules: Vec<Rule> = self.have_rules.iter().map(|(r, _)| r.clone()).collect();
        let routes: Vec<Route> = self.have_routes.iter().map(|(r, _)| r.clone()).collect();
        diff(&self.want_rules, &self.want_routes, &rules, &routes)
    }

    fn name(&self, index: u32) -> String {
        self.names
            .get(&index)
            .cloned()
            .unwrap_or_else(|| format!("if{index}"))
    }
}

pub struct Reconciler {
    cfg: RwLock<RoutingConfig>,
    kernel: Kernel,
    metrics: Option<RouteMetrics>,
    /// One reconcile at a time: events, reloads and the timer all ask.
    busy: Mutex<()>,
}

/// How often the routing is checked when nothing has changed.
const RESYNC_EVERY: Duration = Duration::from_secs(30);
/// Events arriving within this window are handled by one reconcile.
const SETTLE: Duration = Duration::from_millis(50);

impl Reconciler {
    pub fn new(cfg: RoutingConfig, metrics: Option<RouteMetrics>) -> Result<Self, RouteError> {
        Ok(Reconciler {
            cfg: RwLock::new(cfg),
            kernel: Kernel::connect().map_err(RouteError::Connect)?,
            metrics,
            busy: Mutex::new(()),
        })
    }

    fn cfg(&self) -> RoutingConfig {
        self.cfg.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_config(&self, cfg: RoutingConfig) {
        *self.cfg.write().unwrap_or_else(|p| p.into_inner()) = cfg;
    }

    async fn survey(&self, cfg: &RoutingConfig, strict: bool) -> Result<Survey, RouteError> {
        let mut s = Survey {
            statuses: Vec::new(),
            want_rules: Vec::new(),
            want_routes: Vec::new(),
            have_rules: self.kernel.owned_rules().await?,
            have_routes: self.kernel.owned_routes().await?,
            names: HashMap::new(),
        };
        for iface in &cfg.interfaces {
            let status = self.survey_one(iface, strict, &mut s).await?;
            s.statuses.push((iface.interface.clone(), status));
        }
        Ok(s)
    }

    async fn survey_one(
        &self,
        iface: &RoutedInterface,
        strict: bool,
        s: &mut Survey,
    ) -> Result<Status, RouteError> {
        let link = self.kernel.link(&iface.interface).await?;
        let status = self.survey_v4(iface, strict, s, link.as_ref()).await?;
        let Some((rule, routes)) = wanted_v6(iface, link.as_ref().map_or(0, |l| l.index)) else {
            return Ok(status);
        };
        // The v6 side never fails a start: its address may come from the
        // HA takeover or finish DAD after the process starts, and the
        // address event then reconciles again.
        s.want_rules.push(rule);
        let Some(link) = link.filter(|l| l.up) else {
            return Ok(status);
        };
        let address = iface.ipv6.as_ref().map(|v| v.address);
        let usable = self.kernel.usable_addresses_v6(link.index).await?;
        if address.is_some_and(|a| usable.contains(&a)) {
            s.want_routes.extend(routes);
            Ok(status)
        } else if status == Status::Routed {
            Ok(Status::V6AddressMissing)
        } else {
            Ok(status)
        }
    }

    async fn survey_v4(
        &self,
        iface: &RoutedInterface,
        strict: bool,
        s: &mut Survey,
        link: Option<&crate::netlink::Link>,
    ) -> Result<Status, RouteError> {
        let Some(link) = link else {
            if strict {
                return Err(RouteError::InterfaceMissing(iface.interface.clone()));
            }
            // The rule alone: it does no harm, and is ready for the link.
            s.want_rules.push(wanted(iface, 0).0);
            return Ok(Status::LinkMissing);
        };
        s.names.insert(link.index, iface.interface.clone());
        let (rule, routes) = wanted(iface, link.index);
        s.want_rules.push(rule);
        let addresses = self.kernel.addresses(link.index).await?;
        if !addresses.iter().any(|n| n.addr() == iface.address) {
            if strict {
                return Err(RouteError::AddressMissing {
                    interface: iface.interface.clone(),
                    address: iface.address,
                    has: if addresses.is_empty() {
                        "no IPv4 address".into()
                    } else {
                        addresses
                            .iter()
                            .map(Ipv4Net::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                });
            }
            return Ok(Status::AddressMissing);
        }
        if !link.up {
            return Ok(Status::LinkDown);
        }
        s.want_routes.extend(routes);
        Ok(Status::Routed)
    }

    /// Brings the kernel to the wanted routing. `strict` (at start and for
    /// `causeway route apply`) fails on a missing interface or address;
    /// otherwise those are reported and retried at the next event.
    pub async fn reconcile(&self, strict: bool) -> Result<Report, RouteError> {
        let _one = self.busy.lock().await;
        let cfg = self.cfg();
        let result = self.reconcile_with(&cfg, strict).await;
        if let Some(m) = &self.metrics {
            m.reconciles
                .with_label_values(&[if result.is_ok() { "ok" } else { "error" }])
                .inc();
        }
        result
    }

    async fn reconcile_with(
        &self,
        cfg: &RoutingConfig,
        strict: bool,
    ) -> Result<Report, RouteError> {
        let s = self.survey(cfg, strict).await?;
        let changes = s.changes();
        let mut changed = 0;
        for (route, msg) in &s.have_routes {
            if changes.remove_routes.contains(route) {
                let name = s.name(route.interface);
                self.kernel.remove_route(route, &name, msg.clone()).await?;
                tracing::info!(route = %route.display(&name), "removed route");
                changed += 1;
            }
        }
        for (rule, msg) in &s.have_rules {
            if changes.remove_rules.contains(rule) {
                self.kernel.remove_rule(rule, msg.clone()).await?;
                tracing::info!(rule = %rule, "removed rule");
                changed += 1;
            }
        }
        for rule in &changes.add_rules {
            self.kernel.add_rule(rule).await?;
            tracing::info!(rule = %rule, "added rule");
            changed += 1;
        }
        // The on-link route first: the gateway routes need it to resolve.
        let mut adds = changes.add_routes.clone();
        adds.sort_by_key(|r| r.gateway.is_some());
        for route in &adds {
            let name = s.name(route.interface);
            self.kernel.add_route(route, &name).await?;
            tracing::info!(route = %route.display(&name), "added route");
            changed += 1;
        }
        if let Some(m) = &self.metrics {
            let removed = changes.remove_rules.len() + changes.remove_routes.len();
            let added = changes.add_rules.len() + changes.add_routes.len();
            m.changes
                .with_label_values(&["remove"])
                .inc_by(removed as u64);
            m.changes.with_label_values(&["add"]).inc_by(added as u64);
        }
        if cfg.loose_rp_filter {
            for (name, status) in &s.statuses {
                if *status != Status::LinkMissing {
                    loose_rp_filter(name)?;
                }
            }
        }
        Ok(Report {
            interfaces: s.statuses,
            changed,
        })
    }

    /// Removes every rule and route causeway owns.
    pub async fn flush(&self) -> Result<usize, RouteError> {
        let _one = self.busy.lock().await;
        let empty = RoutingConfig {
            interfaces: Vec::new(),
            loose_rp_filter: false,
        };
        Ok(self.reconcile_with(&empty, false).await?.changed)
    }

    /// What is installed against what is wanted, one line each.
    pub async fn show(&self) -> Result<String, RouteError> {
        let cfg = self.cfg();
        let s = self.survey(&cfg, false).await?;
        let mut out = String::new();
        for (name, status) in &s.statuses {
            let _ = writeln!(out, "interface {name}: {}", status.label());
        }
        let have_rules: Vec<&Rule> = s.have_rules.iter().map(|(r, _)| r).collect();
        let have_routes: Vec<&Route> = s.have_routes.iter().map(|(r, _)| r).collect();
        for r in &s.want_rules {
            let state = if have_rules.contains(&r) {
                "ok"
            } else {
                "missing"
            };
            let _ = writeln!(out, "{state:<9} rule  {r}");
        }
        for r in have_rules.iter().filter(|r| !s.want_rules.contains(r)) {
            let _ = writeln!(out, "{:<9} rule  {r}", "unwanted");
        }
        for r in &s.want_routes {
            let state = if have_routes.contains(&r) {
                "ok"
            } else {
                "missing"
            };
            let _ = writeln!(out, "{state:<9} route {}", r.display(&s.name(r.interface)));
        }
        for r in have_routes.iter().filter(|r| !s.want_routes.contains(r)) {
            let _ = writeln!(
                out,
                "{:<9} route {}",
                "unwanted",
                r.display(&s.name(r.interface))
            );
        }
        Ok(out)
    }

    /// Keeps the routing applied until shutdown: reconciles after link and
    /// address events, and every 30 s regardless.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut stream = match events() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch link events; re-checking routing every 30 s only");
                None
            }
        };
        loop {
            let event = async {
                match stream.as_mut() {
                    Some(s) => s.next().await,
                    None => std::future::pending().await,
                }
            };
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = event => match e {
                    Some(e) => Some(e),
                    None => {
                        tracing::warn!("link event stream ended; re-checking routing every 30 s only");
                        stream = None;
                        continue;
                    }
                },
                _ = tokio::time::sleep(RESYNC_EVERY) => None,
            };
            let started = Instant::now();
            if first.is_some() {
                // A flap comes as a burst: down, up, address back.
                if let Some(s) = stream.as_mut() {
                    let deadline = tokio::time::sleep(SETTLE);
                    tokio::pin!(deadline);
                    loop {
                        tokio::select! {
                            _ = &mut deadline => break,
                            e = s.next() => if e.is_none() { break },
                        }
                    }
                }
            }
            match self.reconcile(false).await {
                Ok(r) if r.changed > 0 => {
                    tracing::info!(
                        changes = r.changed,
                        after_ms = started.elapsed().as_millis() as u64,
                        trigger = if first.is_some() {
                            "link event"
                        } else {
                            "timer"
                        },
                        "policy routing restored"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "policy routing reconcile failed"),
            }
        }
    }
}

/// Loose reverse-path filtering: strict mode drops packets whose reply
/// would leave by another interface, which is exactly the asymmetric
/// traffic policy routing exists for.
fn loose_rp_filter(interface: &str) -> Result<(), RouteError> {
    let path = format!("/proc/sys/net/ipv4/conf/{interface}/rp_filter");
    match std::fs::read_to_string(&path) {
        Ok(v) if v.trim() == "2" => return Ok(()),
        Ok(_) => {}
        // Gone between the link lookup and now: the next event retries.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(RouteError::RpFilter {
                interface: interface.into(),
                reason: e.to_string(),
            })
        }
    }
    std::fs::write(&path, "2").map_err(|e| RouteError::RpFilter {
        interface: interface.into(),
        reason: if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!("{e} (needs CAP_NET_ADMIN and a writable /proc/sys)")
        } else {
            e.to_string()
        },
    })?;
    tracing::info!(interface, "rp_filter set to loose (2)");
    Ok(())
}

/// Policy routing as a running service: applied once strictly at start,
/// then kept applied by [`Reconciler::run`] until shutdown.
pub struct PolicyRouting {
    reconciler: Arc<Reconciler>,
    task: tokio::task::JoinHandle<()>,
}

impl PolicyRouting {
    /// Applies `cfg` strictly (an interface that cannot be routed fails
    /// the start) and starts keeping it applied.
    pub async fn start(
        cfg: RoutingConfig,
        metrics: Option<RouteMetrics>,
        shutdown: Shutdown,
    ) -> Result<(Self, Report), RouteError> {
        PolicyRouting::start_with(cfg, metrics, shutdown, true).await
    }

    /// As [`PolicyRouting::start`]; with `strict` false, an interface
    /// without its address is reported and routed once the address comes
    /// (an HA service address, held only by the active replica).
    pub async fn start_with(
        cfg: RoutingConfig,
        metrics: Option<RouteMetrics>,
        shutdown: Shutdown,
        strict: bool,
    ) -> Result<(Self, Report), RouteError> {
        let reconciler = Arc::new(Reconciler::new(cfg, metrics)?);
        let report = reconciler.reconcile(strict).await?;
        let task = tokio::spawn(reconciler.clone().run(shutdown));
        Ok((PolicyRouting { reconciler, task }, report))
    }
}

impl causeway_runtime::Service for PolicyRouting {
    type Config = RoutingConfig;
    type Error = RouteError;
    const NAME: &'static str = "policy routing";

    async fn reload(&self, cfg: &RoutingConfig) -> Result<(), RouteError> {
        self.reconciler.set_config(cfg.clone());
        let report = self.reconciler.reconcile(false).await?;
        tracing::info!(changes = report.changed, "policy routing reconciled");
        Ok(())
    }

    /// The rules and routes stay: a restart finds them in place, and
    /// `causeway route flush` removes them.
    async fn stop(self, _deadline: Duration) {
        let _ = self.task.await;
    }
}
