//! From a [`Plan`] to the Kubernetes objects that run it: per component a
//! ConfigMap with its appliance config (the schema the standalone
//! appliance reads) and a workload, plus one ServiceAccount. Pure.
//!
//! A static VLAN address must never be held by two pods at once, so no
//! rollout may start a new pod while the old one runs: DHCP is a
//! StatefulSet of one (its rolling update deletes the pod before creating
//! the next, and the lease volume follows it), DNS and the proxy are
//! Deployments with the Recreate strategy.
//!
//! A component with two replicas is a StatefulSet of two on separate nodes
//! (stable names, which the `ha` section of its config lists), whose pods
//! get no static address: the active one adds the serverIP itself. With it
//! come the peers Service that resolves those names, a disruption budget,
//! the Lease that settles which replica is active, the key the two share,
//! and the one identity allowed to touch that Lease ([`HaObjects`]).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretVolumeSource, SecurityContext, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::ByteString;

use super::plan::{
    names, Component, Owner, Plan, Settings, ADMIN_PORT, CONFIG_DIR, HA_DIR, HA_KEY, HA_NODE_ENV,
    HA_PORT, LEASE_DIR, NETWORKS_ANNOTATION, VLAN_INTERFACE,
};

/// One component's objects.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentObjects {
    pub component: Component,
    pub config: ConfigMap,
    pub workload: Workload,
    /// DNS only: a ClusterIP Service, so the pod network reaches the
    /// default view.
    pub service: Option<Service>,
    /// With two replicas: what they need beyond the workload.
    pub ha: Option<HaObjects>,
}

/// What two replicas of one component need besides their StatefulSet. The
/// Secret with their shared key is not here: it is random, so not a
/// rendering ([`ha_key`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HaObjects {
    /// Headless, publishing pods before they are ready: the StatefulSet's
    /// governing Service, through which each replica finds the other
    /// (`<pod>.<workload>-peers.<namespace>.svc`).
    pub peers: Service,
    /// At most one of the two replicas voluntarily evicted at a time
    /// (policy/v1; the controller applies it as policy/v1beta1 where the
    /// API server has no v1, as 1.20 does).
    pub disruption_budget: PodDisruptionBudget,
    /// Made by the operator with metadata only: the replicas write its
    /// spec (holder, renewals), which the operator never sets.
    pub lease: Lease,
    /// The replicas' own identity, whose token they mount.
    pub service_account: ServiceAccount,
    /// That identity may read, watch and write this one Lease, nothing else.
    pub role: Role,
    pub role_binding: RoleBinding,
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
    /// In the Infra's namespace: the admin port only from the operator and
    /// monitoring, the service ports from anywhere.
    pub admin_policy: NetworkPolicy,
    /// In the control-plane namespace (so not owned: owner references do
    /// not cross namespaces; the Infra's finalizer removes it): lets the
    /// proxy pods through HyperShift's default-deny policies.
    pub control_plane_policies: Vec<NetworkPolicy>,
    /// The Infra's external LoadBalancer for the proxy's 443 routes.
    pub external_service: Option<Service>,
}

/// Namespaces whose pods may scrape the admin port: OpenShift's cluster
/// monitoring and user-workload monitoring label their namespaces so.
pub const MONITORING_NAMESPACE_LABEL: (&str, &str) = ("openshift.io/cluster-monitoring", "true");
/// The label every namespace carries with its own name (Kubernetes 1.21+).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// Labels on the control-plane NetworkPolicy naming its Infra, since it
/// cannot carry an owner reference.
pub const INFRA_NAME_LABEL: &str = "causeway.io/infra-name";
pub const INFRA_NAMESPACE_LABEL: &str = "causeway.io/infra-namespace";

pub fn object_name(owner: &Owner, component: Component) -> String {
    names::workload(&owner.name, component)
}

pub fn config_map_name(owner: &Owner, component: Component) -> String {
    format!("{}-{}-config", owner.name, component.name())
}

pub fn admin_policy_name(owner: &Owner) -> String {
    format!("{}-causeway-admin", owner.name)
}

/// Unique per Infra in the control-plane namespace, which several Infras'
/// proxies may reach.
pub fn control_plane_policy_name(owner: &Owner) -> String {
    format!("causeway-proxy-{}-{}", owner.namespace, owner.name)
}

pub fn pod_monitor_name(owner: &Owner) -> String {
    format!("{}-causeway", owner.name)
}

/// The PodMonitor (monitoring.coreos.com/v1) that has Prometheus scrape
/// every data-plane pod of the Infra on its admin port, from the pod
/// network (the admin port is never on the VLAN). Each series gains the
/// labels `infra` (the Infra's name) and `component` (dhcp, dns, proxy),
/// which the alerts name; the target's namespace and pod come from
/// discovery.
pub fn pod_monitor(owner: &Owner) -> serde_json::Value {
    let selector = labels(owner, None);
    let component_label = format!(
        "__meta_kubernetes_pod_label_{}",
        "app.kubernetes.io/component".replace(['.', '/'], "_")
    );
    serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(owner, pod_monitor_name(owner), None),
        "spec": {
            "selector": {"matchLabels": selector},
            "podMetricsEndpoints": [{
                "port": "admin",
                "path": "/metrics",
                "relabelings": [
                    {"action": "replace", "targetLabel": "infra", "replacement": owner.name},
                    {"action": "replace", "sourceLabels": [component_label], "targetLabel": "component"},
                ],
            }],
        },
    })
}

pub fn service_account_name(owner: &Owner) -> String {
    format!("{}-causeway", owner.name)
}

/// The names of what only two replicas have: the controller finds them by
/// these to remove them when the component goes back to one.
pub fn peers_name(owner: &Owner, component: Component) -> String {
    names::peers(&owner.name, component)
}

pub fn lease_name(owner: &Owner, component: Component) -> String {
    names::lease(&owner.name, component)
}

pub fn ha_identity_name(owner: &Owner, component: Component) -> String {
    names::ha_identity(&owner.name, component)
}

pub fn ha_key_name(owner: &Owner, component: Component) -> String {
    names::ha_key(&owner.name, component)
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
        owner_references: Some(vec![
            owner.controller_reference("hostedcluster.densityops.com/v1alpha1", "Infra")
        ]),
        ..ObjectMeta::default()
    }
}

fn server_ip(plan: &Plan, component: Component) -> Option<std::net::Ipv4Addr> {
    plan.component(component).map(|c| c.server_ip)
}

/// The appliance config one component's pod runs (validated when the plan
/// was made).
pub fn appliance_config(plan: &Plan, component: Component) -> String {
    plan.component(component)
        .map(|c| c.config_text.clone())
        .unwrap_or_default()
}

/// The Multus annotation: the VLAN attachment with this pod's static
/// address and the VLAN's prefix length.
pub fn networks_annotation(
    plan: &Plan,
    address: std::net::Ipv4Addr,
    address_v6: Option<std::net::Ipv6Addr>,
) -> String {
    let v6 = address_v6
        .zip(plan.cidr_v6)
        .map(|(a, net)| format!("{a}/{}", net.prefix_len()));
    let ips: Vec<String> = std::iter::once(format!("{address}/{}", plan.cidr.prefix_len()))
        .chain(v6)
        .collect();
    serde_json::json!([{
        "name": plan.nad_name,
        "namespace": plan.nad_namespace,
        "interface": VLAN_INTERFACE,
        "ips": ips,
    }])
    .to_string()
}

/// The Multus annotation of a replica: the VLAN attachment without a
/// static address. Static IPAM cannot give one address to two pods; the
/// active replica adds the serverIP to `net1` itself.
pub fn replica_networks_annotation(plan: &Plan) -> String {
    serde_json::json!([{
        "name": plan.nad_name,
        "namespace": plan.nad_namespace,
        "interface": VLAN_INTERFACE,
    }])
    .to_string()
}

/// What each component may do beyond an unprivileged process: its ports
/// below 1024, routing rules and routes (and, for two replicas, adding the
/// service address), and raw packets for DHCP's replies and for the
/// gratuitous ARP a replica sends when it takes the service address.
pub fn capabilities(component: Component, replicated: bool) -> Vec<String> {
    let mut caps = vec!["NET_ADMIN".to_string(), "NET_BIND_SERVICE".to_string()];
    if component == Component::Dhcp || replicated {
        caps.push("NET_RAW".into());
    }
    caps
}

/// The ports between two replicas: adverts over UDP, the DHCP lease stream
/// over TCP, on one number.
const HA_PORTS: [(&str, &str); 2] = [("ha-advert", "UDP"), ("ha-stream", "TCP")];

fn ports(component: Component, replicated: bool) -> Vec<ContainerPort> {
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
    let ha: Vec<(&str, i32, &str)> = HA_PORTS
        .iter()
        .filter(|_| replicated)
        .map(|(name, proto)| (*name, HA_PORT, *proto))
        .collect();
    for (name, port, proto) in service.iter().chain(ha.iter()) {
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
    let replicated = plan.replicated(component);
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
    let mut volumes = vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(owner, component),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }];
    if replicated {
        // Beneath the config volume: the kubelet makes the mount point
        // inside a read-only API-data volume itself (since 1.10).
        mounts.push(VolumeMount {
            name: "ha-key".into(),
            mount_path: HA_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name: "ha-key".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(ha_key_name(owner, component)),
                // Read by the container's root user only.
                default_mode: Some(0o400),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let env = replicated.then(|| {
        vec![EnvVar {
            name: HA_NODE_ENV.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]
    });
    let container = Container {
        name: "causeway".into(),
        image: Some(image.into()),
        args: Some(vec![
            "appliance".into(),
            "--config".into(),
            format!("{CONFIG_DIR}/config.yaml"),
        ]),
        ports: Some(ports(component, replicated)),
        env,
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
                add: Some(capabilities(component, replicated)),
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
    let networks = if replicated {
        replica_networks_annotation(plan)
    } else {
        networks_annotation(
            plan,
            address,
            plan.component(component).and_then(|c| c.server_ipv6),
        )
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                NETWORKS_ANNOTATION.to_string(),
                networks,
            )])),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(if replicated {
                ha_identity_name(owner, component)
            } else {
                service_account_name(owner)
            }),
            // Only replicas talk to the API server, and only about their
            // Lease.
            automount_service_account_token: Some(replicated),
            containers: vec![container],
            volumes: Some(volumes),
            affinity: replicated.then(|| apart(owner, component)),
            termination_grace_period_seconds: Some(45),
            ..PodSpec::default()
        }),
    }
}

/// Two replicas never on one node: a node lost takes one of them, not both.
/// Required, so with a single schedulable node the second waits rather
/// than share it.
fn apart(owner: &Owner, component: Component) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(selector_labels(owner, component)),
                    ..LabelSelector::default()
                }),
                topology_key: "kubernetes.io/hostname".into(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// The DHCP lease log's volume, one per pod.
fn lease_volume() -> PersistentVolumeClaim {
    PersistentVolumeClaim {
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
    }
}

/// Everything for `plan`. Disabled components are absent; the controller
/// deletes what it made for them before.
pub fn render(plan: &Plan, owner: &Owner, settings: &Settings) -> Rendered {
    let image = settings.image.as_str();
    let resources = settings.resources.as_ref();
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
        let replicated = plan.replicated(component);
        let workload = match component {
            // Two replicas need stable names, which only a StatefulSet
            // gives; they start side by side (neither waits for the other
            // to be ready, as the standby is not until it has synced).
            _ if replicated => Workload::StatefulSet(StatefulSet {
                metadata: meta(owner, name.clone(), Some(component)),
                spec: Some(StatefulSetSpec {
                    replicas: Some(2),
                    service_name: Some(peers_name(owner, component)),
                    pod_management_policy: Some("Parallel".into()),
                    selector: selector.clone(),
                    template,
                    volume_claim_templates: (component == Component::Dhcp)
                        .then(|| vec![lease_volume()]),
                    ..StatefulSetSpec::default()
                }),
                ..StatefulSet::default()
            }),
            Component::Dhcp => Workload::StatefulSet(StatefulSet {
                metadata: meta(owner, name.clone(), Some(component)),
                spec: Some(StatefulSetSpec {
                    replicas: Some(1),
                    service_name: Some(name),
                    selector,
                    template,
                    volume_claim_templates: Some(vec![lease_volume()]),
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
        let service = (component == Component::Dns).then(|| dns_service(owner));
        let ha = replicated.then(|| ha_objects(owner, component));
        components.push(ComponentObjects {
            component,
            config,
            workload,
            service,
            ha,
        });
    }
    let replicated = components.iter().any(|c| c.ha.is_some());
    Rendered {
        service_account: ServiceAccount {
            metadata: meta(owner, service_account_name(owner), None),
            automount_service_account_token: Some(false),
            ..ServiceAccount::default()
        },
        components,
        admin_policy: admin_policy(
            owner,
            &settings.operator_namespace,
            replicated,
            plan.external_proxy,
        ),
        control_plane_policies: plan
            .control_plane_namespaces
            .iter()
            .filter(|ns| !ns.is_empty())
            .map(|ns| control_plane_policy(owner, ns))
            .collect(),
        external_service: plan
            .external_service
            .as_ref()
            .filter(|_| plan.component(Component::Proxy).is_some())
            .map(|x| external_service(owner, x)),
    }
}

fn ha_objects(owner: &Owner, component: Component) -> HaObjects {
    let identity = ha_identity_name(owner, component);
    let lease = lease_name(owner, component);
    let selector = LabelSelector {
        match_labels: Some(selector_labels(owner, component)),
        ..LabelSelector::default()
    };
    HaObjects {
        peers: Service {
            metadata: meta(owner, peers_name(owner, component), Some(component)),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".into()),
                // A replica must reach its peer while neither is ready:
                // the standby is not ready before it has synced from the
                // active.
                publish_not_ready_addresses: Some(true),
                selector: Some(selector_labels(owner, component)),
                ports: Some(
                    HA_PORTS
                        .iter()
                        .map(|(name, protocol)| ServicePort {
                            name: Some((*name).into()),
                            port: HA_PORT,
                            protocol: Some((*protocol).into()),
                            target_port: Some(IntOrString::Int(HA_PORT)),
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
        disruption_budget: PodDisruptionBudget {
            metadata: meta(owner, object_name(owner, component), Some(component)),
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                selector: Some(selector),
                ..PodDisruptionBudgetSpec::default()
            }),
            ..PodDisruptionBudget::default()
        },
        lease: Lease {
            metadata: meta(owner, lease.clone(), Some(component)),
            spec: None,
        },
        service_account: ServiceAccount {
            metadata: meta(owner, identity.clone(), Some(component)),
            // The pods ask for the token themselves; nothing else using
            // this account gets one.
            automount_service_account_token: Some(false),
            ..ServiceAccount::default()
        },
        role: Role {
            metadata: meta(owner, identity.clone(), Some(component)),
            rules: Some(vec![PolicyRule {
                api_groups: Some(vec!["coordination.k8s.io".into()]),
                resources: Some(vec!["leases".into()]),
                resource_names: Some(vec![lease]),
                // The replicas read their Lease (get, and list and watch
                // with the fieldSelector metadata.name=<lease>, which the
                // API server authorizes by that name) and write it (update
                // to take it over or renew, patch). No create: the
                // operator makes it. No delete.
                verbs: ["get", "list", "watch", "update", "patch"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
                ..PolicyRule::default()
            }]),
        },
        role_binding: RoleBinding {
            metadata: meta(owner, identity.clone(), Some(component)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: identity.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: identity,
                namespace: Some(owner.namespace.clone()),
                ..Subject::default()
            }]),
        },
    }
}

/// The key two replicas of `component` share: `key` random bytes, made
/// once and never rewritten (a new key while both run would have each
/// refuse the other's adverts). Immutable, so nobody rewrites it either.
pub fn ha_key(owner: &Owner, component: Component, key: [u8; 32]) -> Secret {
    Secret {
        metadata: meta(owner, ha_key_name(owner, component), Some(component)),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            HA_KEY.to_string(),
            ByteString(key.to_vec()),
        )])),
        ..Secret::default()
    }
}

/// The name of the Infra's external Service (the Go operator's name for
/// it, so a migrated one is taken over rather than doubled).
pub fn external_service_name(owner: &Owner) -> String {
    format!("{}-proxy-external", owner.name)
}

/// The Infra's external Service: a LoadBalancer selecting its proxy pods and
/// exposing their port 443 routes (on the pod network's
/// [`EXTERNAL_PROXY_PORT`](super::plan::EXTERNAL_PROXY_PORT)) and nothing
/// else.
pub fn external_service(owner: &Owner, plan: &super::plan::ExternalServicePlan) -> Service {
    let mut metadata = meta(owner, external_service_name(owner), Some(Component::Proxy));
    // The user's labels first: the operator's own win a clash.
    let mut labels = plan.labels.clone();
    labels.extend(metadata.labels.take().unwrap_or_default());
    metadata.labels = Some(labels);
    metadata.annotations = (!plan.annotations.is_empty()).then(|| plan.annotations.clone());
    Service {
        metadata,
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(selector_labels(owner, Component::Proxy)),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: 443,
                target_port: Some(IntOrString::Int(super::plan::EXTERNAL_PROXY_PORT)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn dns_service(owner: &Owner) -> Service {
    let port = |name: &str, protocol: &str| ServicePort {
        name: Some(name.into()),
        port: 53,
        protocol: Some(protocol.into()),
        target_port: Some(IntOrString::Int(53)),
        ..ServicePort::default()
    };
    Service {
        metadata: meta(
            owner,
            object_name(owner, Component::Dns),
            Some(Component::Dns),
        ),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(selector_labels(owner, Component::Dns)),
            ports: Some(vec![port("dns", "UDP"), port("dns-tcp", "TCP")]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn tcp_port(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

fn namespace_peer(labels: BTreeMap<String, String>) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(labels),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// Every pod of the Infra admits its service ports from anywhere on the pod
/// network (the VLAN side is not subject to pod-network policy), and its
/// admin port only from the operator's namespace and monitoring. With two
/// replicas anywhere, the Infra's pods admit each other on the HA port.
fn admin_policy(
    owner: &Owner,
    operator_namespace: &str,
    replicated: bool,
    external_proxy: bool,
) -> NetworkPolicy {
    let mut service_ports = vec![
        (53, "UDP"),
        (53, "TCP"),
        (67, "UDP"),
        (80, "TCP"),
        (443, "TCP"),
        (6443, "TCP"),
    ];
    // Where an external LoadBalancer sends 443, from outside the cluster.
    if external_proxy {
        service_ports.push((super::plan::EXTERNAL_PROXY_PORT, "TCP"));
    }
    let service_ports = service_ports
        .into_iter()
        .map(|(port, protocol)| NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some(protocol.into()),
            ..NetworkPolicyPort::default()
        })
        .collect();
    let (monitoring_key, monitoring_value) = MONITORING_NAMESPACE_LABEL;
    let infra_pods = LabelSelector {
        match_labels: Some(BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "causeway".to_string()),
            ("app.kubernetes.io/instance".into(), owner.name.clone()),
        ])),
        ..LabelSelector::default()
    };
    let mut ingress = vec![
        NetworkPolicyIngressRule {
            ports: Some(service_ports),
            from: None,
        },
        NetworkPolicyIngressRule {
            ports: Some(vec![tcp_port(ADMIN_PORT)]),
            from: Some(vec![
                namespace_peer(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_string(),
                    operator_namespace.to_string(),
                )])),
                namespace_peer(BTreeMap::from([(
                    monitoring_key.to_string(),
                    monitoring_value.to_string(),
                )])),
            ]),
        },
    ];
    if replicated {
        ingress.push(NetworkPolicyIngressRule {
            ports: Some(
                HA_PORTS
                    .iter()
                    .map(|(_, protocol)| NetworkPolicyPort {
                        port: Some(IntOrString::Int(HA_PORT)),
                        protocol: Some((*protocol).into()),
                        ..NetworkPolicyPort::default()
                    })
                    .collect(),
            ),
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(infra_pods.clone()),
                ..NetworkPolicyPeer::default()
            }]),
        });
    }
    NetworkPolicy {
        metadata: meta(owner, admin_policy_name(owner), None),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(infra_pods),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    }
}

/// In the control-plane namespace: every pod there admits the Infra's proxy
/// pods, as HyperShift's own policies admit only what they know.
fn control_plane_policy(owner: &Owner, control_plane_namespace: &str) -> NetworkPolicy {
    let mut labels = labels(owner, Some(Component::Proxy));
    labels.insert(INFRA_NAME_LABEL.into(), owner.name.clone());
    labels.insert(INFRA_NAMESPACE_LABEL.into(), owner.namespace.clone());
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(control_plane_policy_name(owner)),
            namespace: Some(control_plane_namespace.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                ports: None,
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            NAMESPACE_NAME_LABEL.to_string(),
                            owner.namespace.clone(),
                        )])),
                        ..LabelSelector::default()
                    }),
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(selector_labels(owner, Component::Proxy)),
                        ..LabelSelector::default()
                    }),
                    ..NetworkPolicyPeer::default()
                }]),
            }]),
            ..NetworkPolicySpec::default()
        }),
    }
}
