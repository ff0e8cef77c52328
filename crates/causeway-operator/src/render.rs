//! From a [`Plan`] to the Kubernetes objects that run it: per component a
//! ConfigMap with its appliance config (the schema the standalone
//! appliance reads) and a workload, plus one ServiceAccount. Pure.
//!
//! A static VLAN address must never be held by two pods at once, so no
//! rollout may start a new pod while the old one runs: DHCP is a
//! StatefulSet of one (its rolling update deletes the pod before creating
//! the next, and the lease volume follows it), DNS and the proxy are
//! Deployments with the Recreate strategy.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, HTTPGetAction,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, ServiceAccount, Volume, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::validate::Plan;

/// The admin port inside each pod, bound to the pod network (`eth0`) only.
pub const ADMIN_PORT: i32 = 9090;
pub const CONFIG_DIR: &str = "/etc/causeway";
pub const LEASE_DIR: &str = "/var/lib/causeway";
/// The VLAN interface Multus adds to each pod.
pub const VLAN_INTERFACE: &str = "net1";
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    Dhcp,
    Dns,
    Proxy,
}

impl Component {
    pub const ALL: [Component; 3] = [Component::Dhcp, Component::Dns, Component::Proxy];

    pub fn name(self) -> &'static str {
        match self {
            Component::Dhcp => "dhcp",
            Component::Dns => "dns",
            Component::Proxy => "proxy",
        }
    }
}

/// The Infra an object belongs to.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// One component's objects.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentObjects {
    pub component: Component,
    pub config: ConfigMap,
    pub workload: Workload,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    StatefulSet(StatefulSet),
    Deployment(Deployment),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub service_account: ServiceAccount,
    pub components: Vec<ComponentObjects>,
}

pub fn object_name(owner: &Owner, component: Component) -> String {
    format!("{}-{}", owner.name, component.name())
}

pub fn config_map_name(owner: &Owner, component: Component) -> String {
    format!("{}-{}-config", owner.name, component.name())
}

pub fn service_account_name(owner: &Owner) -> String {
    format!("{}-causeway", owner.name)
}

/// Labels that select one component's pods.
pub fn selector_labels(owner: &Owner, component: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "causeway".into()),
        ("app.kubernetes.io/instance".into(), owner.name.clone()),
        (
            "app.kubernetes.io/component".into(),
            component.name().into(),
        ),
    ])
}

fn labels(owner: &Owner, component: Option<Component>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "causeway".to_string()),
        ("app.kubernetes.io/instance".into(), owner.name.clone()),
        (
            "app.kubernetes.io/managed-by".into(),
            "causeway-operator".into(),
        ),
    ]);
    if let Some(c) = component {
        l.insert("app.kubernetes.io/component".into(), c.name().into());
    }
    l
}

fn meta(owner: &Owner, name: String, component: Option<Component>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels(owner, component)),
        owner_references: Some(vec![OwnerReference {
            api_version: "hostedcluster.densityops.com/v1alpha1".into(),
            kind: "Infra".into(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..ObjectMeta::default()
    }
}

fn server_ip(plan: &Plan, component: Component) -> Option<std::net::Ipv4Addr> {
    match component {
        Component::Dhcp => plan.dhcp.as_ref().map(|d| d.server_ip),
        Component::Dns => plan.dns.as_ref().map(|d| d.server_ip),
        Component::Proxy => plan.proxy.as_ref().map(|p| p.server_ip),
    }
}

/// YAML-quotes a string for the rendered config.
fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The appliance config one component's pod runs: routing first, then its
/// one service, with the admin server on the pod network only.
pub fn appliance_config(plan: &Plan, component: Component) -> String {
    let Some(address) = server_ip(plan, component) else {
        return String::new();
    };
    let mut y = String::new();
    let _ = writeln!(y, "# Rendered by causeway-operator; edits are overwritten.");
    let _ = writeln!(
        y,
        "admin: {{listen: \"0.0.0.0:{ADMIN_PORT}\", interface: eth0}}"
    );
    let _ = writeln!(y, "log: {{format: json}}");
    if let (Some(name), Some(domain)) = (&plan.cluster_name, &plan.base_domain) {
        let _ = writeln!(
            y,
            "cluster: {{name: {}, baseDomain: {}}}",
            q(name),
            q(domain)
        );
    }
    let others: Vec<String> = plan
        .static_ips()
        .into_iter()
        .filter(|ip| *ip != address)
        .map(|ip| ip.to_string())
        .collect();
    let _ = writeln!(y, "network:");
    let _ = writeln!(y, "  interface: {VLAN_INTERFACE}");
    let _ = writeln!(y, "  cidr: {}", plan.cidr);
    let _ = writeln!(y, "  gateway: {}", plan.gateway);
    let _ = writeln!(y, "  address: {address}");
    let _ = writeln!(y, "  staticAddresses: [{}]", others.join(", "));
    let _ = writeln!(y, "routing:");
    let _ = writeln!(y, "  table: {}", plan.routing.table);
    let _ = writeln!(y, "  priority: {}", plan.routing.priority);
    let extra: Vec<String> = plan
        .routing
        .extra_routes
        .iter()
        .map(|n| n.to_string())
        .collect();
    let _ = writeln!(y, "  extraRoutes: [{}]", extra.join(", "));
    // /proc/sys is read-only in a container, and a new pod network
    // namespace starts with rp_filter off.
    let _ = writeln!(y, "  looseRpFilter: false");
    match component {
        Component::Dhcp => {
            let Some(d) = &plan.dhcp else { return y };
            let _ = writeln!(y, "dhcp:");
            let _ = writeln!(y, "  listen: [{{interface: {VLAN_INTERFACE}}}]");
            let _ = writeln!(y, "  leaseFile: {LEASE_DIR}/dhcp-leases.jsonl");
            let _ = writeln!(y, "  leaseTime: {}", q(&d.lease_time));
            let _ = writeln!(y, "  subnets:");
            let _ = writeln!(
                y,
                "    - pools: [{{start: {}, end: {}}}]",
                d.range_start, d.range_end
            );
            // Clients resolve through causeway DNS when it runs, else
            // through the configured upstreams.
            let dns: Vec<String> = match &plan.dns {
                Some(dns) => vec![dns.server_ip.to_string()],
                None => plan.upstreams.iter().map(|u| u.to_string()).collect(),
            };
            if !dns.is_empty() {
                let _ = writeln!(y, "      dnsServers: [{}]", dns.join(", "));
            }
            if !d.reservations.is_empty() {
                let _ = writeln!(y, "      reservations:");
                for r in &d.reservations {
                    let _ = write!(y, "        - {{mac: {}, ip: {}", q(&r.mac), r.ip.trim());
                    if let Some(h) = &r.hostname {
                        let _ = write!(y, ", hostname: {}", q(h));
                    }
                    let _ = writeln!(y, "}}");
                }
            }
        }
        Component::Dns => {
            let Some(dns) = &plan.dns else { return y };
            let _ = writeln!(y, "dns:");
            let _ = writeln!(y, "  listen: [\"{}:53\"]", dns.server_ip);
            if let Some(p) = &plan.proxy {
                let _ = writeln!(y, "  proxyAddress: {}", p.server_ip);
            }
            if !plan.upstreams.is_empty() {
                let ups: Vec<String> = plan.upstreams.iter().map(|u| q(&u.to_string())).collect();
                let _ = writeln!(y, "  upstreams: [{}]", ups.join(", "));
            }
            if !dns.records.is_empty() {
                let _ = writeln!(y, "  records:");
                for r in &dns.records {
                    let _ = writeln!(
                        y,
                        "    - {{name: {}, type: {}, value: {}}}",
                        q(&r.name),
                        q(&r.kind),
                        q(&r.value)
                    );
                }
            }
            // Split horizon: the VLAN gets the proxy's VLAN address, every
            // other client the internal one.
            if let Some(internal) = plan.proxy.as_ref().and_then(|p| p.internal_address) {
                let _ = writeln!(y, "  views:");
                let _ = writeln!(y, "    - {{name: vlan, clients: [{}]}}", plan.cidr);
                let _ = writeln!(
                    y,
                    "    - {{name: internal, clients: [0.0.0.0/0], proxyAddress: {internal}}}"
                );
            }
        }
        Component::Proxy => {
            let Some(p) = &plan.proxy else { return y };
            let _ = writeln!(y, "proxy:");
            let _ = writeln!(y, "  listenAddress: {}", p.server_ip);
            let _ = writeln!(
                y,
                "  controlPlaneNamespace: {}",
                q(&p.control_plane_namespace)
            );
            if let Some(i) = &p.ingress_https {
                let _ = writeln!(y, "  ingressHttps: {}", q(i));
            }
            if let Some(i) = &p.ingress_http {
                let _ = writeln!(y, "  ingressHttp: {}", q(i));
            }
            if p.api_server_service != "kube-apiserver" {
                let _ = writeln!(y, "  apiServerService: {}", q(&p.api_server_service));
            }
            if !p.extra_routes.is_empty() {
                let _ = writeln!(y, "  extraListeners:");
                for (port, upstream) in &p.extra_routes {
                    let _ = writeln!(y, "    - {{port: {port}, upstream: {}}}", q(upstream));
                }
            }
        }
    }
    y
}

/// The Multus annotation: the VLAN attachment with this pod's static
/// address and the VLAN's prefix length.
pub fn networks_annotation(plan: &Plan, address: std::net::Ipv4Addr) -> String {
    serde_json::json!([{
        "name": plan.nad_name,
        "namespace": plan.nad_namespace,
        "interface": VLAN_INTERFACE,
        "ips": [format!("{address}/{}", plan.cidr.prefix_len())],
    }])
    .to_string()
}

/// What each component may do beyond an unprivileged process: its ports
/// below 1024, routing rules and routes, and for DHCP raw replies.
pub fn capabilities(component: Component) -> Vec<String> {
    let mut caps = vec!["NET_ADMIN".to_string(), "NET_BIND_SERVICE".to_string()];
    if component == Component::Dhcp {
        caps.push("NET_RAW".into());
    }
    caps
}

fn ports(component: Component) -> Vec<ContainerPort> {
    let mut p = vec![ContainerPort {
        name: Some("admin".into()),
        container_port: ADMIN_PORT,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }];
    let service: &[(&str, i32, &str)] = match component {
        Component::Dhcp => &[("dhcp", 67, "UDP")],
        Component::Dns => &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")],
        Component::Proxy => &[("api", 6443, "TCP"), ("https", 443, "TCP")],
    };
    for (name, port, proto) in service {
        p.push(ContainerPort {
            name: Some((*name).into()),
            container_port: *port,
            protocol: Some((*proto).into()),
            ..ContainerPort::default()
        });
    }
    p
}

fn probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("admin".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

fn pod_template(
    plan: &Plan,
    owner: &Owner,
    component: Component,
    image: &str,
    resources: Option<&ResourceRequirements>,
) -> PodTemplateSpec {
    let address = server_ip(plan, component).unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
    let mut mounts = vec![VolumeMount {
        name: "config".into(),
        mount_path: CONFIG_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }];
    if component == Component::Dhcp {
        mounts.push(VolumeMount {
            name: "leases".into(),
            mount_path: LEASE_DIR.into(),
            ..VolumeMount::default()
        });
    }
    let container = Container {
        name: "causeway".into(),
        image: Some(image.into()),
        args: Some(vec![
            "appliance".into(),
            "--config".into(),
            format!("{CONFIG_DIR}/config.yaml"),
        ]),
        ports: Some(ports(component)),
        readiness_probe: Some(probe("/readyz", 5)),
        liveness_probe: Some(probe("/healthz", 10)),
        resources: resources.cloned(),
        security_context: Some(SecurityContext {
            // Capabilities only take effect for uid 0 without file
            // capabilities; everything else is dropped.
            run_as_user: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                add: Some(capabilities(component)),
                drop: Some(vec!["ALL".into()]),
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let mut labels = labels(owner, Some(component));
    labels.extend(selector_labels(owner, component));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                NETWORKS_ANNOTATION.to_string(),
                networks_annotation(plan, address),
            )])),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(service_account_name(owner)),
            automount_service_account_token: Some(false),
            containers: vec![container],
            volumes: Some(vec![Volume {
                name: "config".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: config_map_name(owner, component),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            }]),
            termination_grace_period_seconds: Some(45),
            ..PodSpec::default()
        }),
    }
}

/// Everything for `plan`. Disabled components are absent; the controller
/// deletes what it made for them before.
pub fn render(
    plan: &Plan,
    owner: &Owner,
    image: &str,
    resources: Option<&ResourceRequirements>,
) -> Rendered {
    let mut components = Vec::new();
    for component in Component::ALL {
        if server_ip(plan, component).is_none() {
            continue;
        }
        let config = ConfigMap {
            metadata: meta(owner, config_map_name(owner, component), Some(component)),
            data: Some(BTreeMap::from([(
                "config.yaml".to_string(),
                appliance_config(plan, component),
            )])),
            ..ConfigMap::default()
        };
        let selector = LabelSelector {
            match_labels: Some(selector_labels(owner, component)),
            ..LabelSelector::default()
        };
        let template = pod_template(plan, owner, component, image, resources);
        let name = object_name(owner, component);
        let workload = match component {
            Component::Dhcp => Workload::StatefulSet(StatefulSet {
                metadata: meta(owner, name.clone(), Some(component)),
                spec: Some(StatefulSetSpec {
                    replicas: Some(1),
                    service_name: Some(name),
                    selector,
                    template,
                    volume_claim_templates: Some(vec![PersistentVolumeClaim {
                        metadata: ObjectMeta {
                            name: Some("leases".into()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(PersistentVolumeClaimSpec {
                            access_modes: Some(vec!["ReadWriteOnce".into()]),
                            resources: Some(VolumeResourceRequirements {
                                requests: Some(BTreeMap::from([(
                                    "storage".to_string(),
                                    Quantity("1Gi".into()),
                                )])),
                                ..VolumeResourceRequirements::default()
                            }),
                            ..PersistentVolumeClaimSpec::default()
                        }),
                        ..PersistentVolumeClaim::default()
                    }]),
                    ..StatefulSetSpec::default()
                }),
                ..StatefulSet::default()
            }),
            Component::Dns | Component::Proxy => Workload::Deployment(Deployment {
                metadata: meta(owner, name, Some(component)),
                spec: Some(DeploymentSpec {
                    replicas: Some(1),
                    selector,
                    template,
                    strategy: Some(DeploymentStrategy {
                        type_: Some("Recreate".into()),
                        ..DeploymentStrategy::default()
                    }),
                    ..DeploymentSpec::default()
                }),
                ..Deployment::default()
            }),
        };
        components.push(ComponentObjects {
            component,
            config,
            workload,
        });
    }
    Rendered {
        service_account: ServiceAccount {
            metadata: meta(owner, service_account_name(owner), None),
            automount_service_account_token: Some(false),
            ..ServiceAccount::default()
        },
        components,
    }
}
