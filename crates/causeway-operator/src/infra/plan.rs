//! What a valid Infra becomes before it is rendered: the [`Plan`], the
//! [`Component`]s, the [`Owner`] and the settings and constants both the
//! validation and the rendering use. Validation makes a plan, rendering
//! reads one; neither imports the other.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::ResourceRequirements;

pub use crate::k8s::Owner;

/// The admin port inside each pod, bound to the pod network (`eth0`) only.
pub const ADMIN_PORT: i32 = 9090;
pub const CONFIG_DIR: &str = "/etc/causeway";
pub const LEASE_DIR: &str = "/var/lib/causeway";
/// The VLAN interface Multus adds to each pod.
pub const VLAN_INTERFACE: &str = "net1";
pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";

/// Where the two replicas of a component send each other adverts (UDP)
/// and the DHCP lease stream (TCP), on the pod network.
pub const HA_PORT: i32 = 7946;
/// The shared key of two replicas, from their Secret.
pub const HA_DIR: &str = "/etc/causeway/ha";
pub const HA_KEY: &str = "key";
/// The proxy's port on the pod network taking port 443's routes, where an
/// attachment's external LoadBalancer Service sends 443.
pub const EXTERNAL_PROXY_PORT: i32 = 8443;
/// The pod's own name, which is its replica name in the `ha` section.
pub const HA_NODE_ENV: &str = "CAUSEWAY_HA_NODE";
/// The most replicas a component runs: one active, one standing by.
pub const MAX_REPLICAS: i32 = 2;

/// The names of one component's objects, from the Infra's name. Shared by
/// validation (the `ha` section names the pods, their peers Service and
/// the Lease) and rendering.
pub mod names {
    use super::Component;

    /// The workload: a StatefulSet, or a Deployment for DNS and the proxy
    /// at one replica.
    pub fn workload(infra: &str, component: Component) -> String {
        format!("{infra}-{}", component.name())
    }

    /// The headless Service that gives two replicas stable names.
    pub fn peers(infra: &str, component: Component) -> String {
        format!("{}-peers", workload(infra, component))
    }

    /// The Lease that settles which replica is active.
    pub fn lease(infra: &str, component: Component) -> String {
        workload(infra, component)
    }

    /// The ServiceAccount, Role and RoleBinding of two replicas: their
    /// token may touch their own Lease and nothing else.
    pub fn ha_identity(infra: &str, component: Component) -> String {
        format!("{}-ha", workload(infra, component))
    }

    /// The Secret holding the replicas' shared key.
    pub fn ha_key(infra: &str, component: Component) -> String {
        format!("{}-ha-key", workload(infra, component))
    }

    /// Replica `ordinal`'s pod, as its StatefulSet names it.
    pub fn replica(infra: &str, component: Component, ordinal: u8) -> String {
        format!("{}-{ordinal}", workload(infra, component))
    }

    /// Where a replica's peer reaches it: its name under the peers Service.
    pub fn replica_address(
        infra: &str,
        namespace: &str,
        component: Component,
        ordinal: u8,
    ) -> String {
        format!(
            "{}.{}.{namespace}.svc:{}",
            replica(infra, component, ordinal),
            peers(infra, component),
            super::HA_PORT
        )
    }
}

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

/// What the rendering needs beyond the plan.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The image the data-plane pods run.
    pub image: String,
    /// Where the operator runs: its pods may reach the admin port.
    pub operator_namespace: String,
    /// Resources for every data-plane container.
    pub resources: Option<ResourceRequirements>,
    /// Render a PodMonitor per Infra where the API server serves the kind.
    pub pod_monitors: bool,
}

/// One component's pod: its VLAN address and the config it runs.
#[derive(Debug, Clone)]
pub struct ComponentPlan {
    pub component: Component,
    pub server_ip: Ipv4Addr,
    /// Its static v6 address on a dual-stack VLAN.
    pub server_ipv6: Option<std::net::Ipv6Addr>,
    /// 1, or 2 for an active and a standby replica.
    pub replicas: i32,
    /// The config as the ConfigMap holds it (YAML), already validated.
    pub config_text: String,
}

/// A valid Infra, ready to render.
#[derive(Debug, Clone)]
pub struct Plan {
    pub cidr: Ipv4Net,
    /// The VLAN's v6 prefix, on a dual-stack VLAN.
    pub cidr_v6: Option<ipnet::Ipv6Net>,
    pub nad_name: String,
    pub nad_namespace: String,
    pub components: Vec<ComponentPlan>,
    /// Where the proxy's upstreams live, when the proxy runs: one
    /// namespace per served cluster.
    pub control_plane_namespaces: Vec<String>,
    /// Enabled components that cannot run yet, with why: the proxy with no
    /// cluster to route to. What runs of them is left as it is.
    pub waiting: Vec<(Component, String)>,
    /// Accepted but ignored fields, for a warning condition.
    pub warnings: Vec<String>,
    /// The proxy also listens on the pod network ([`EXTERNAL_PROXY_PORT`]).
    pub external_proxy: bool,
    /// The Infra's own external Service for the proxy, when enabled.
    pub external_service: Option<ExternalServicePlan>,
}

/// The Infra's external LoadBalancer Service: its labels and annotations,
/// the pool and the published names already in them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalServicePlan {
    pub labels: std::collections::BTreeMap<String, String>,
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl Plan {
    pub fn component(&self, c: Component) -> Option<&ComponentPlan> {
        self.components.iter().find(|p| p.component == c)
    }

    /// Whether `c` runs as two replicas.
    pub fn replicated(&self, c: Component) -> bool {
        self.component(c).is_some_and(|p| p.replicas > 1)
    }
}
