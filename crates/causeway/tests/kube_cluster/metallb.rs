//! MetalLB, played by the test: what its controller and speakers would do
//! for one LoadBalancer Service, as metallb v0.14.9 and metallb-operator
//! decide it (facts, not code, from their sources):
//! - pools and advertisements are read only from MetalLB's own namespace;
//! - the pool comes from `metallb.io/address-pool`, else the deprecated
//!   `metallb.universe.tf/address-pool` (the first wins when both are set);
//! - a named pool that is not there gives no address (`AllocationFailed`);
//! - the lowest address of the pool's first range or CIDR is handed out;
//! - an address is assigned whether or not an advertisement covers the
//!   pool, but announced in L2 only when an L2Advertisement names it (or
//!   names no pool and selects none: then it covers every pool);
//! - installed by its operator, MetalLB runs only once a `MetalLB` resource
//!   named `metallb` is in the operator's namespace.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::Client;

/// How MetalLB runs in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// From its own manifests: it runs as soon as it is installed.
    Manifests,
    /// By its operator (through OLM): it runs once the `MetalLB` resource is
    /// there.
    Operator,
}

/// What MetalLB did for the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub pool: String,
    pub address: Ipv4Addr,
    /// Some L2Advertisement covers the pool, so a speaker answers ARP for
    /// the address on the VLAN.
    pub announced: bool,
}

fn first_address(range: &str) -> Option<Ipv4Addr> {
    match range.split_once('-') {
        Some((start, end)) => {
            let start: Ipv4Addr = start.trim().parse().ok()?;
            let end: Ipv4Addr = end.trim().parse().ok()?;
            (start <= end).then_some(start)
        }
        // A CIDR with its host bits cleared: its network address first.
        None => {
            let (ip, len) = range.trim().split_once('/')?;
            let ip: Ipv4Addr = ip.parse().ok()?;
            let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            Some(Ipv4Addr::from(u32::from(ip) & mask))
        }
    }
}

/// MetalLB's handling of `svc_ns/svc_name`, with MetalLB running in
/// `metallb_ns`: `Err` says why it gives the Service no address (and
/// leaves its status alone); `Ok` once the address is written to the
/// Service's status.
pub async fn allocate(
    client: &Client,
    installed: Installed,
    metallb_ns: &str,
    svc_ns: &str,
    svc_name: &str,
) -> Result<Allocation, String> {
    let get = |kind: &str, plural: &str| {
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            metallb_ns,
            &causeway_operator::k8s::resources::resource("metallb.io", "v1beta1", kind, plural),
        )
    };
    if installed == Installed::Operator {
        let running = get("MetalLB", "metallbs")
            .get_opt("metallb")
            .await
            .map_err(|e| format!("reading MetalLB {metallb_ns}/metallb: {e}"))?
            .is_some();
        if !running {
            return Err(format!(
                "no MetalLB resource {metallb_ns}/metallb: the operator deploys no controller"
            ));
        }
    }
    let services: Api<Service> = Api::namespaced(client.clone(), svc_ns);
    let svc = services
        .get(svc_name)
        .await
        .map_err(|e| format!("reading Service {svc_ns}/{svc_name}: {e}"))?;
    if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer") {
        return Err(format!("Service {svc_ns}/{svc_name} is not a LoadBalancer"));
    }
    let annotations = svc.metadata.annotations.clone().unwrap_or_default();
    let pool_name = annotations
        .get("metallb.io/address-pool")
        .or_else(|| annotations.get("metallb.universe.tf/address-pool"))
        .cloned()
        .ok_or_else(|| format!("Service {svc_ns}/{svc_name} names no pool"))?;
    let pool = get("IPAddressPool", "ipaddresspools")
        .get_opt(&pool_name)
        .await
        .map_err(|e| format!("reading IPAddressPool {metallb_ns}/{pool_name}: {e}"))?
        .ok_or_else(|| {
            format!(
                "AllocationFailed: unknown pool {pool_name:?} in MetalLB's namespace {metallb_ns}"
            )
        })?;
    let address = pool.data["spec"]["addresses"]
        .as_array()
        .and_then(|a| a.first())
        .and_then(|r| r.as_str())
        .and_then(first_address)
        .ok_or_else(|| format!("IPAddressPool {pool_name} has no address MetalLB can parse"))?;
    let advertisements = get("L2Advertisement", "l2advertisements")
        .list(&Default::default())
        .await
        .map_err(|e| format!("listing L2Advertisements in {metallb_ns}: {e}"))?;
    let announced = advertisements.items.iter().any(|a| {
        let named = a.data["spec"]["ipAddressPools"].as_array();
        let selectors = a.data["spec"]["ipAddressPoolSelectors"].as_array();
        match (named, selectors) {
            (Some(n), _) if n.iter().any(|p| p.as_str() == Some(pool_name.as_str())) => true,
            (n, s) => n.is_none_or(|n| n.is_empty()) && s.is_none_or(|s| s.is_empty()),
        }
    });
    services
        .patch_status(
            svc_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": address.to_string()}]}}})),
        )
        .await
        .map_err(|e| format!("writing Service {svc_ns}/{svc_name} status: {e}"))?;
    Ok(Allocation {
        pool: pool_name,
        address,
        announced,
    })
}
