//! `networkConfig` read as one attachment, whichever form it is written in:
//! the older Multus NetworkAttachmentDefinition by name, or the structured
//! form (a NetworkAttachmentDefinition or an OVN-Kubernetes
//! ClusterUserDefinedNetwork, with its topology, role, exposure and IPAM
//! owner). Pure; every rule the Go operator's API states is checked here,
//! each with its field.
//!
//! What runs: a Secondary network, which Multus adds to each pod as its
//! VLAN interface, through the NetworkAttachmentDefinition named (for a
//! ClusterUserDefinedNetwork, the one OVN-Kubernetes generates in the
//! attachment's namespace under the network's name). A Primary network is
//! checked and then refused, as causeway's pods need static VLAN addresses
//! that OVN-Kubernetes IPAM assigns itself. IPv6 would enter at the CIDR
//! check here and at the address types of the rendered config.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::crd::{AttachmentKind, Exposure, Ipam, NetworkConfig, NetworkRole, Topology};

/// The attachment, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPlan {
    pub kind: AttachmentKind,
    /// The NetworkAttachmentDefinition pods are given.
    pub nad_name: String,
    pub nad_namespace: String,
    pub topology: Topology,
    pub role: NetworkRole,
    pub exposure: Exposure,
    pub ipam: Ipam,
}

fn given(s: &Option<String>) -> Option<String> {
    s.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Reads `net` for an Infra in `infra_namespace` whose DHCP is enabled or
/// not, on `cidr`. `Err` holds every rule broken.
pub fn normalize(
    net: &NetworkConfig,
    infra_namespace: &str,
    dhcp_enabled: bool,
    cidr: Ipv4Net,
) -> Result<NetworkPlan, Vec<String>> {
    let mut errors = Vec::new();
    let legacy_name = Some(net.network_attachment_definition.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let legacy_namespace = given(&net.network_attachment_namespace);
    let structured_fields: Vec<&str> = [
        ("topology", net.topology.is_some()),
        ("role", net.role.is_some()),
        ("exposure", net.exposure.is_some()),
        ("ipam", net.ipam.is_some()),
        (
            "routeAdvertisementsRef",
            net.route_advertisements_ref.is_some(),
        ),
    ]
    .into_iter()
    .filter_map(|(f, set)| set.then_some(f))
    .collect();
    if legacy_namespace.is_some() && legacy_name.is_none() {
        errors.push(
            "networkConfig.networkAttachmentNamespace: only with networkAttachmentDefinition"
                .to_string(),
        );
    }
    let plan = match (&net.attachment, &legacy_name) {
        (None, None) => {
            errors.push("networkConfig: set attachment (with topology, role, exposure and ipam) or networkAttachmentDefinition".to_string());
            None
        }
        (Some(_), Some(_)) => {
            errors.push("networkConfig.networkAttachmentDefinition: not with attachment: write the network one way".to_string());
            None
        }
        (None, Some(name)) => {
            if !structured_fields.is_empty() {
                errors.push(format!(
                    "networkConfig: {} need attachment; networkAttachmentDefinition is the older form without them",
                    structured_fields.join(", ")
                ));
            }
            Some(NetworkPlan {
                kind: AttachmentKind::NetworkAttachmentDefinition,
                nad_name: name.clone(),
                nad_namespace: legacy_namespace
                    .clone()
                    .unwrap_or_else(|| infra_namespace.to_string()),
                topology: Topology::Localnet,
                role: NetworkRole::Secondary,
                exposure: Exposure::Layer2,
                ipam: if dhcp_enabled {
                    Ipam::Dhcp
                } else {
                    Ipam::External
                },
            })
        }
        (Some(a), None) => {
            if legacy_namespace.is_some() {
                errors.push("networkConfig.networkAttachmentNamespace: not with attachment; use attachment.namespace".to_string());
            }
            let name = a.name.trim().to_string();
            if name.is_empty() {
                errors.push("networkConfig.attachment.name: required".to_string());
            }
            let namespace = match (a.kind, given(&a.namespace)) {
                (_, Some(ns)) => ns,
                (AttachmentKind::NetworkAttachmentDefinition, None) => infra_namespace.to_string(),
                (AttachmentKind::ClusterUserDefinedNetwork, None) => {
                    errors.push("networkConfig.attachment.namespace: required for a ClusterUserDefinedNetwork (the namespace of the NetworkAttachmentDefinition it generates for the pods)".to_string());
                    String::new()
                }
            };
            let missing: Vec<&str> = [
                ("topology", net.topology.is_none()),
                ("role", net.role.is_none()),
                ("exposure", net.exposure.is_none()),
                ("ipam", net.ipam.is_none()),
            ]
            .into_iter()
            .filter_map(|(f, m)| m.then_some(f))
            .collect();
            if !missing.is_empty() {
                errors.push(format!(
                    "networkConfig: {} required with attachment",
                    missing.join(", ")
                ));
            }
            match (net.topology, net.role, net.exposure, net.ipam) {
                (Some(topology), Some(role), Some(exposure), Some(ipam)) => Some(NetworkPlan {
                    kind: a.kind,
                    nad_name: name,
                    nad_namespace: namespace,
                    topology,
                    role,
                    exposure,
                    ipam,
                }),
                _ => None,
            }
        }
    };
    let Some(plan) = plan else {
        return Err(errors);
    };
    check(&plan, net, dhcp_enabled, cidr, &mut errors);
    if errors.is_empty() {
        Ok(plan)
    } else {
        Err(errors)
    }
}

fn check(
    p: &NetworkPlan,
    net: &NetworkConfig,
    dhcp_enabled: bool,
    cidr: Ipv4Net,
    errors: &mut Vec<String>,
) {
    let cudn = p.kind == AttachmentKind::ClusterUserDefinedNetwork;
    let advertised = net.route_advertisements_ref.is_some();
    if p.topology == Topology::Layer3 {
        errors.push("networkConfig.topology: Layer3 is not supported; the VLAN is one L2 segment (Localnet or Layer2)".into());
    }
    if p.role == NetworkRole::Primary && !cudn {
        errors.push(
            "networkConfig.role: Primary needs a ClusterUserDefinedNetwork attachment".into(),
        );
    }
    if p.role == NetworkRole::Primary
        && cudn
        && !(p.topology == Topology::Layer2
            && p.exposure == Exposure::Bgp
            && p.ipam == Ipam::OvnKubernetes
            && advertised)
    {
        errors.push("networkConfig: a Primary ClusterUserDefinedNetwork must be Layer2, exposed by BGP, with OVNKubernetes IPAM and a routeAdvertisementsRef".into());
    }
    if p.role == NetworkRole::Secondary
        && cudn
        && !(p.topology == Topology::Localnet && p.exposure == Exposure::Layer2)
    {
        errors.push("networkConfig: a Secondary ClusterUserDefinedNetwork must be Localnet with Layer2 exposure".into());
    }
    if !cudn && p.ipam == Ipam::OvnKubernetes {
        errors
            .push("networkConfig.ipam: OVNKubernetes only with a ClusterUserDefinedNetwork".into());
    }
    if cudn && p.exposure == Exposure::Bgp && !advertised {
        errors.push("networkConfig.routeAdvertisementsRef: required for BGP exposure".into());
    }
    if p.topology == Topology::Localnet && advertised {
        errors.push("networkConfig.routeAdvertisementsRef: not with a Localnet topology".into());
    }
    if (p.ipam == Ipam::Dhcp) != dhcp_enabled {
        errors.push(if dhcp_enabled {
            format!("networkConfig.ipam: {:?} while infraComponents.dhcp is enabled: DHCP IPAM means causeway's DHCP hands out the addresses", p.ipam)
        } else {
            "networkConfig.ipam: DHCP while infraComponents.dhcp is disabled: nothing would hand out the addresses".to_string()
        });
    }
    if p.role == NetworkRole::Secondary && matches!(p.ipam, Ipam::Dhcp | Ipam::External) {
        match net.gateway.trim() {
            "" => errors.push(
                "networkConfig.gateway: required for a Secondary network with DHCP or External IPAM"
                    .into(),
            ),
            g => {
                if let Ok(ip) = g.parse::<Ipv4Addr>() {
                    if !cidr.contains(&ip) {
                        errors.push(format!(
                            "networkConfig.gateway: {ip} is outside networkConfig.cidr {cidr}"
                        ));
                    }
                }
            }
        }
    }
    if p.role == NetworkRole::Primary && errors.is_empty() {
        errors.push("networkConfig.role: Primary is valid but not run yet: causeway's pods need static VLAN addresses, which OVN-Kubernetes IPAM assigns itself; use a Secondary network".into());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::crd::{NamedRef, NetworkAttachmentRef};
    use super::*;

    fn cidr() -> Ipv4Net {
        "192.168.100.0/24".parse().unwrap()
    }

    fn legacy() -> NetworkConfig {
        NetworkConfig {
            cidr: "192.168.100.0/24".into(),
            gateway: "192.168.100.1".into(),
            network_attachment_definition: "vlan100".into(),
            ..NetworkConfig::default()
        }
    }

    fn structured(kind: AttachmentKind, ns: Option<&str>) -> NetworkConfig {
        NetworkConfig {
            cidr: "192.168.100.0/24".into(),
            gateway: "192.168.100.1".into(),
            attachment: Some(NetworkAttachmentRef {
                kind,
                name: "tenant-vlan-200".into(),
                namespace: ns.map(str::to_string),
            }),
            topology: Some(Topology::Localnet),
            role: Some(NetworkRole::Secondary),
            exposure: Some(Exposure::Layer2),
            ipam: Some(Ipam::Dhcp),
            ..NetworkConfig::default()
        }
    }

    fn err(net: &NetworkConfig, dhcp: bool) -> Vec<String> {
        normalize(net, "clusters", dhcp, cidr()).unwrap_err()
    }

    #[test]
    fn the_older_form_is_a_secondary_localnet_attachment() {
        let p = normalize(&legacy(), "clusters", true, cidr()).unwrap();
        assert_eq!(
            (p.nad_name.as_str(), p.nad_namespace.as_str()),
            ("vlan100", "clusters")
        );
        assert_eq!(
            (p.topology, p.role, p.exposure, p.ipam),
            (
                Topology::Localnet,
                NetworkRole::Secondary,
                Exposure::Layer2,
                Ipam::Dhcp
            )
        );
        assert_eq!(
            normalize(&legacy(), "clusters", false, cidr())
                .unwrap()
                .ipam,
            Ipam::External
        );
    }

    #[test]
    fn structured_nad_and_secondary_cudn_forms_are_accepted() {
        let nad = normalize(
            &structured(AttachmentKind::NetworkAttachmentDefinition, Some("vlan-ns")),
            "clusters",
            true,
            cidr(),
        )
        .unwrap();
        assert_eq!(
            (nad.nad_name.as_str(), nad.nad_namespace.as_str()),
            ("tenant-vlan-200", "vlan-ns")
        );
        let mut n = structured(AttachmentKind::NetworkAttachmentDefinition, None);
        n.ipam = Some(Ipam::External);
        let p = normalize(&n, "clusters", false, cidr()).unwrap();
        assert_eq!(p.nad_namespace, "clusters");
        let cudn = normalize(
            &structured(AttachmentKind::ClusterUserDefinedNetwork, Some("tenants")),
            "clusters",
            true,
            cidr(),
        )
        .unwrap();
        assert_eq!(cudn.kind, AttachmentKind::ClusterUserDefinedNetwork);
        assert_eq!(cudn.nad_namespace, "tenants");
    }

    #[test]
    fn every_rule_is_refused_with_its_field() {
        let nad = AttachmentKind::NetworkAttachmentDefinition;
        let cudn = AttachmentKind::ClusterUserDefinedNetwork;
        let cases: Vec<(&str, NetworkConfig, bool, &str)> = vec![
            ("neither form", NetworkConfig { cidr: "192.168.100.0/24".into(), gateway: "192.168.100.1".into(), ..NetworkConfig::default() }, true,
             "networkConfig: set attachment (with topology, role, exposure and ipam) or networkAttachmentDefinition"),
            ("both forms", NetworkConfig { network_attachment_definition: "vlan100".into(), ..structured(nad, None) }, true,
             "networkConfig.networkAttachmentDefinition: not with attachment: write the network one way"),
            ("structured fields without attachment", NetworkConfig { topology: Some(Topology::Localnet), ..legacy() }, true,
             "networkConfig: topology need attachment; networkAttachmentDefinition is the older form without them"),
            ("namespace without NAD", NetworkConfig { network_attachment_namespace: Some("x".into()), ..structured(nad, None) }, true,
             "networkConfig.networkAttachmentNamespace: only with networkAttachmentDefinition"),
            ("incomplete", NetworkConfig { role: None, ipam: None, ..structured(nad, None) }, true,
             "networkConfig: role, ipam required with attachment"),
            ("layer3", NetworkConfig { topology: Some(Topology::Layer3), ..structured(nad, None) }, true,
             "networkConfig.topology: Layer3 is not supported; the VLAN is one L2 segment (Localnet or Layer2)"),
            ("primary NAD", NetworkConfig { role: Some(NetworkRole::Primary), ..structured(nad, None) }, true,
             "networkConfig.role: Primary needs a ClusterUserDefinedNetwork attachment"),
            ("primary CUDN not BGP", NetworkConfig { role: Some(NetworkRole::Primary), topology: Some(Topology::Layer2), ipam: Some(Ipam::OvnKubernetes), ..structured(cudn, Some("t")) }, false,
             "networkConfig: a Primary ClusterUserDefinedNetwork must be Layer2, exposed by BGP, with OVNKubernetes IPAM and a routeAdvertisementsRef"),
            ("secondary CUDN layer2", NetworkConfig { topology: Some(Topology::Layer2), ..structured(cudn, Some("t")) }, true,
             "networkConfig: a Secondary ClusterUserDefinedNetwork must be Localnet with Layer2 exposure"),
            ("NAD with OVN IPAM", NetworkConfig { ipam: Some(Ipam::OvnKubernetes), ..structured(nad, None) }, false,
             "networkConfig.ipam: OVNKubernetes only with a ClusterUserDefinedNetwork"),
            ("CUDN BGP without RA", NetworkConfig { role: Some(NetworkRole::Primary), topology: Some(Topology::Layer2), exposure: Some(Exposure::Bgp), ipam: Some(Ipam::OvnKubernetes), ..structured(cudn, Some("t")) }, false,
             "networkConfig.routeAdvertisementsRef: required for BGP exposure"),
            ("localnet with RA", NetworkConfig { route_advertisements_ref: Some(NamedRef { name: "ra".into() }), ..structured(nad, None) }, true,
             "networkConfig.routeAdvertisementsRef: not with a Localnet topology"),
            ("DHCP IPAM without DHCP", structured(nad, None), false,
             "networkConfig.ipam: DHCP while infraComponents.dhcp is disabled: nothing would hand out the addresses"),
            ("External IPAM with DHCP", NetworkConfig { ipam: Some(Ipam::External), ..structured(nad, None) }, true,
             "networkConfig.ipam: External while infraComponents.dhcp is enabled: DHCP IPAM means causeway's DHCP hands out the addresses"),
            ("no gateway", NetworkConfig { gateway: String::new(), ..structured(nad, None) }, true,
             "networkConfig.gateway: required for a Secondary network with DHCP or External IPAM"),
            ("gateway outside", NetworkConfig { gateway: "10.0.0.1".into(), ..structured(nad, None) }, true,
             "networkConfig.gateway: 10.0.0.1 is outside networkConfig.cidr 192.168.100.0/24"),
            ("CUDN without namespace", structured(cudn, None), true,
             "networkConfig.attachment.namespace: required for a ClusterUserDefinedNetwork (the namespace of the NetworkAttachmentDefinition it generates for the pods)"),
            ("valid primary", NetworkConfig { role: Some(NetworkRole::Primary), topology: Some(Topology::Layer2), exposure: Some(Exposure::Bgp), ipam: Some(Ipam::OvnKubernetes), route_advertisements_ref: Some(NamedRef { name: "ra".into() }), ..structured(cudn, Some("t")) }, false,
             "networkConfig.role: Primary is valid but not run yet: causeway's pods need static VLAN addresses, which OVN-Kubernetes IPAM assigns itself; use a Secondary network"),
        ];
        for (what, net, dhcp, want) in cases {
            let got = err(&net, dhcp);
            assert!(got.contains(&want.to_string()), "{what}: {got:?}");
        }
    }
}
