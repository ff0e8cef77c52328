//! What an Infra reconcile reads beside its own objects: the
//! HostedCluster it names, its NetworkAttachmentDefinition, the Service
//! its internal proxy targets (each live, as none is the operator's), and
//! its attachments with their Machines' addresses (from the watch-fed
//! stores).

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::attachment::{self, Aggregate, InfraClusterAttachment};
use super::crd::Infra;
use super::validate::{HostedClusterFacts, ServiceAddress};
use crate::error::Error;
use crate::k8s::apply::api_message;
use crate::k8s::resources::{hosted_cluster_resource, nad_resource};
use crate::k8s::watch::Everywhere;

/// Every address of every Machine in `ns`.
pub fn machine_addresses(machines: &Everywhere, ns: &str) -> Vec<String> {
    machines
        .state()
        .iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(ns))
        .filter_map(|m| m.data.pointer("/status/addresses")?.as_array().cloned())
        .flatten()
        .filter_map(|a| a.get("address")?.as_str().map(str::to_string))
        .collect()
}

/// The attachments naming `infra`, not being deleted, decided over; each
/// with the worker addresses its cluster's Machines report.
pub fn attachments_of(
    store: &Store<InfraClusterAttachment>,
    machines: &Everywhere,
    infra: &Infra,
) -> Aggregate {
    let ns = infra.namespace().unwrap_or_default();
    let name = infra.name_any();
    let cidr = infra
        .spec
        .network_config
        .cidr
        .trim()
        .parse::<ipnet::Ipv4Net>()
        .ok()
        .map(|n| n.trunc());
    let mine = store
        .state()
        .into_iter()
        .filter(|a| {
            a.namespace().as_deref() == Some(ns.as_str())
                && a.spec.infra_ref.name == name
                && a.metadata.deletion_timestamp.is_none()
        })
        .map(|a| {
            let n = a.name_any();
            let c = attachment::candidate(&n, &a.spec, cidr).map(|mut c| {
                let found = machine_addresses(machines, &c.control_plane_namespace);
                attachment::add_discovered(&mut c, found.iter().map(String::as_str), cidr);
                c.apps = super::apps_ingress::ready_endpoint(
                    a.spec.apps_ingress.as_ref(),
                    a.status
                        .as_ref()
                        .and_then(|s| s.apps_ingress_status.as_ref()),
                );
                c.ready = a.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|k| k.type_ == "Ready" && k.status == "True")
                });
                c
            });
            (n, c)
        })
        .collect();
    attachment::aggregate(mine)
}

/// What a referenced HostedCluster says, or why it could not be read. A
/// HostedCluster that is there but malformed gives what could be read.
pub(super) async fn hosted_cluster(
    client: &Client,
    infra: &Infra,
    ns: &str,
) -> Result<Option<HostedClusterFacts>, String> {
    let Some(r) = &infra.spec.hosted_cluster_ref else {
        return Ok(None);
    };
    let hc_ns = r.namespace.clone().unwrap_or_else(|| ns.to_string());
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &hc_ns, &hosted_cluster_resource());
    match api.get_opt(&r.name).await {
        Ok(Some(hc)) => {
            let object = serde_json::to_value(&hc).unwrap_or_default();
            Ok(Some(HostedClusterFacts {
                name: r.name.clone(),
                namespace: hc_ns,
                ..HostedClusterFacts::from_object(&object)
            }))
        }
        Ok(None) => Err(format!(
            "hostedClusterRef: HostedCluster {hc_ns}/{} not found",
            r.name
        )),
        Err(e) => Err(format!(
            "hostedClusterRef: reading HostedCluster {hc_ns}/{}: {}",
            r.name,
            api_message(&e)
        )),
    }
}

/// Whether the NetworkAttachmentDefinition is there: `Err` says why not.
pub(super) async fn network_attachment(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<(), String> {
    let nads: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &nad_resource());
    match nads.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!("NetworkAttachmentDefinition {ns}/{name} not found")),
        Err(e) => Err(format!(
            "NetworkAttachmentDefinition {ns}/{name}: {}",
            api_message(&e)
        )),
    }
}

/// The Service `internalProxyService` names, read live (it is not ours,
/// so not in a store; its changes still trigger a reconcile).
pub(super) async fn service_address(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<ServiceAddress, Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    Ok(match api.get_opt(name).await? {
        None => ServiceAddress::Missing,
        Some(svc) => svc
            .spec
            .and_then(|s| s.cluster_ip)
            .and_then(|ip| ip.parse().ok())
            .map_or(ServiceAddress::NoClusterIp, ServiceAddress::ClusterIp),
    })
}
