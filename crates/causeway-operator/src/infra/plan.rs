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
}

/// One component's pod: its VLAN address and the config it runs.
#[derive(Debug, Clone)]
pub struct ComponentPlan {
    pub component: Component,
    pub server_ip: Ipv4Addr,
    /// The config as the ConfigMap holds it (YAML), already validated.
    pub config_text: String,
}

/// A valid Infra, ready to render.
#[derive(Debug, Clone)]
pub struct Plan {
    pub cidr: Ipv4Net,
    pub nad_name: String,
    pub nad_namespace: String,
    pub components: Vec<ComponentPlan>,
    /// Where the proxy's upstreams live, when the proxy runs.
    pub control_plane_namespace: Option<String>,
    /// Accepted but ignored fields, for a warning condition.
    pub warnings: Vec<String>,
}

impl Plan {
    pub fn component(&self, c: Component) -> Option<&ComponentPlan> {
        self.components.iter().find(|p| p.component == c)
    }
}
