//! The provisioner's spec checked by the operator: the CRD's rules again
//! (servers before 1.25 drop CEL), what the CRD cannot say, and the
//! immutable fields held against what was first provisioned. Pure.

use std::net::IpAddr;

use causeway_config::{valid_label, NameRules};
use ipnet::IpNet;
use serde_json::{json, Value};

use super::crd::{AvailabilityPolicy, DPFHCPProvisionerSpec, NetworkEntry, Networking};

/// A field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: &'static str,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "spec.{}: {}", self.field, self.message)
    }
}

/// How the control plane's services are published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publishing {
    /// The API server behind a MetalLB VIP, the rest as Routes.
    LoadBalancer { vip: IpAddr },
    /// Every service on a NodePort of a management-cluster node.
    NodePort,
}

/// A spec that passed every check, with its derived choices.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    pub publishing: Publishing,
    pub networking: ResolvedNetworking,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedNetworking {
    pub service_network: Vec<NetworkEntry>,
    pub cluster_network: Vec<NetworkEntry>,
    pub machine_network: Vec<NetworkEntry>,
}

pub const DEFAULT_SERVICE_NETWORK: &str = "172.31.0.0/16";
pub const DEFAULT_CLUSTER_NETWORK: &str = "10.132.0.0/14";

const BASE_DOMAIN_MAX: usize = 253;

fn err(field: &str, reason: &'static str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason,
        message: message.into(),
    }
}

fn valid_base_domain(d: &str) -> bool {
    if d.len() < 4 || d.len() > BASE_DOMAIN_MAX {
        return false;
    }
    let labels: Vec<&str> = d.split('.').collect();
    let Some((tld, rest)) = labels.split_last() else {
        return false;
    };
    let label_ok =
        |l: &&str| !l.bytes().any(|b| b.is_ascii_uppercase()) && valid_label(l, NameRules::HOST);
    !rest.is_empty()
        && rest.iter().all(label_ok)
        && tld.len() >= 2
        && tld.bytes().all(|b| b.is_ascii_lowercase())
}

fn check_entries(
    field: &str,
    entries: &[NetworkEntry],
    host_prefix_allowed: bool,
    errors: &mut Vec<FieldError>,
) {
    if entries.len() > 1 {
        errors.push(err(field, "TooMany", "at most one entry"));
    }
    for (i, e) in entries.iter().enumerate() {
        let at = format!("{field}[{i}]");
        match e.cidr.parse::<IpNet>() {
            Ok(net) if net.trunc() == net => {}
            Ok(_) => errors.push(err(
                &format!("{at}.cidr"),
                "InvalidCIDR",
                format!("{} has host bits set", e.cidr),
            )),
            Err(_) => errors.push(err(
                &format!("{at}.cidr"),
                "InvalidCIDR",
                format!("{:?} is not a CIDR", e.cidr),
            )),
        }
        if let Some(p) = e.host_prefix {
            if !host_prefix_allowed {
                errors.push(err(
                    &format!("{at}.hostPrefix"),
                    "NotAllowed",
                    "only clusterNetwork entries have a hostPrefix",
                ));
            } else if !(1..=128).contains(&p) {
                errors.push(err(
                    &format!("{at}.hostPrefix"),
                    "OutOfRange",
                    format!("{p} is not a prefix length"),
                ));
            }
        }
    }
}

fn resolve_networking(n: Option<&Networking>) -> ResolvedNetworking {
    let n = n.cloned().unwrap_or_default();
    let or = |list: Vec<NetworkEntry>, default: &str, host_prefix: Option<i32>| {
        if list.is_empty() {
            vec![NetworkEntry {
                cidr: default.into(),
                host_prefix,
            }]
        } else {
            list
        }
    };
    ResolvedNetworking {
        service_network: or(n.service_network, DEFAULT_SERVICE_NETWORK, None),
        cluster_network: or(n.cluster_network, DEFAULT_CLUSTER_NETWORK, None),
        machine_network: n.machine_network,
    }
}

/// The virtual IP under either name.
pub fn virtual_ip(spec: &DPFHCPProvisionerSpec) -> Option<&str> {
    spec.virtual_ip.as_deref().filter(|v| !v.is_empty()).or(spec
        .metal_lb_virtual_ip
        .as_deref()
        .filter(|v| !v.is_empty()))
}

/// Every check of the spec alone; all errors, not the first.
pub fn check(spec: &DPFHCPProvisionerSpec) -> Result<Checked, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.ssh_key.is_some() {
        errors.push(err("sshKey", "FilePathNotSupported", "a file path cannot be read inside a cluster: put the public key in a Secret (key id_rsa.pub) in this namespace and name it in sshKeySecretRef"));
    }
    if spec.pull_secret.is_some() {
        errors.push(err("pullSecret", "FilePathNotSupported", "a file path cannot be read inside a cluster: put it in a Secret (key .dockerconfigjson) in this namespace and name it in pullSecretRef"));
    }
    if spec
        .ssh_key_secret_ref
        .as_ref()
        .is_none_or(|r| r.name.is_empty())
    {
        errors.push(err(
            "sshKeySecretRef",
            "Required",
            "required: a Secret in this namespace with key id_rsa.pub",
        ));
    }
    if spec
        .pull_secret_ref
        .as_ref()
        .is_none_or(|r| r.name.is_empty())
    {
        errors.push(err(
            "pullSecretRef",
            "Required",
            "required: a Secret in this namespace with key .dockerconfigjson",
        ));
    }
    if spec.dpu_cluster_ref.name.is_empty() || spec.dpu_cluster_ref.namespace.is_empty() {
        errors.push(err(
            "dpuClusterRef",
            "Required",
            "name and namespace are both required",
        ));
    }
    if !valid_base_domain(&spec.base_domain) {
        errors.push(err(
            "baseDomain",
            "InvalidDomain",
            format!(
                "{:?} is not a DNS domain of lower-case labels (4 to 253 characters)",
                spec.base_domain
            ),
        ));
    }
    if spec.ocp_release_image.trim().is_empty() {
        errors.push(err(
            "ocpReleaseImage",
            "Required",
            "a release image pull spec is required",
        ));
    }
    let mut vip = None;
    for (field, value) in [
        ("virtualIP", spec.virtual_ip.as_deref()),
        ("metalLBVirtualIP", spec.metal_lb_virtual_ip.as_deref()),
    ] {
        match value {
            None | Some("") => {}
            Some(v) => match v.parse::<IpAddr>() {
                Ok(ip) => {
                    if vip.is_some_and(|seen| seen != ip) {
                        errors.push(err(
                            field,
                            "Conflict",
                            "metalLBVirtualIP is an alias of virtualIP: give one, or both equal",
                        ));
                    }
                    vip = Some(ip);
                }
                Err(_) => errors.push(err(
                    field,
                    "InvalidIP",
                    format!("{v:?} is not an IP address"),
                )),
            },
        }
    }
    let ha = spec.control_plane_availability_policy == AvailabilityPolicy::HighlyAvailable;
    if ha && virtual_ip(spec).is_none() {
        errors.push(err(
            "virtualIP",
            "Required",
            "virtualIP is required when controlPlaneAvailabilityPolicy is HighlyAvailable",
        ));
    }
    if spec.expose_through_load_balancer == Some(true) && virtual_ip(spec).is_none() {
        errors.push(err(
            "virtualIP",
            "Required",
            "exposeThroughLoadBalancer needs a virtualIP for MetalLB to announce",
        ));
    }
    if spec.node_selector.as_ref().is_some_and(|s| s.len() > 20) {
        errors.push(err("nodeSelector", "TooMany", "at most 20 entries"));
    }
    if let Some(n) = &spec.networking {
        check_entries(
            "networking.serviceNetwork",
            &n.service_network,
            false,
            &mut errors,
        );
        check_entries(
            "networking.clusterNetwork",
            &n.cluster_network,
            true,
            &mut errors,
        );
        check_entries(
            "networking.machineNetwork",
            &n.machine_network,
            false,
            &mut errors,
        );
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let lb = match spec.expose_through_load_balancer {
        Some(explicit) => explicit,
        None => ha || vip.is_some(),
    };
    let publishing = match (lb, vip) {
        (true, Some(vip)) => Publishing::LoadBalancer { vip },
        _ => Publishing::NodePort,
    };
    Ok(Checked {
        publishing,
        networking: resolve_networking(spec.networking.as_ref()),
    })
}

/// The immutable fields, as recorded in status when first provisioned.
pub fn immutable_part(spec: &DPFHCPProvisionerSpec) -> Value {
    json!({
        "dpuClusterRef": spec.dpu_cluster_ref,
        "baseDomain": spec.base_domain,
        "sshKeySecretRef": spec.ssh_key_secret_ref,
        "pullSecretRef": spec.pull_secret_ref,
        "etcdStorageClass": spec.etcd_storage_class,
        "controlPlaneAvailabilityPolicy": spec.control_plane_availability_policy,
        "virtualIP": virtual_ip(spec),
        "nodeSelector": spec.node_selector,
        "flannelEnabled": spec.flannel_enabled,
        "dpuDeploymentRef": spec.dpu_deployment_ref,
        "networking": spec.networking,
        "exposeThroughLoadBalancer": spec.expose_through_load_balancer,
    })
}

/// The immutable fields that differ from what was provisioned.
pub fn changed_immutable(provisioned: &Value, spec: &DPFHCPProvisionerSpec) -> Vec<FieldError> {
    let now = immutable_part(spec);
    let (Value::Object(was), Value::Object(is)) = (provisioned, &now) else {
        return Vec::new();
    };
    is.iter()
        .filter(|(k, v)| was.get(*k).unwrap_or(&Value::Null) != *v)
        .map(|(k, v)| {
            err(
                k,
                "ImmutableFieldChanged",
                format!(
                    "is immutable: provisioned with {}, now {}; restore it, or delete and re-create the provisioner",
                    was.get(k).unwrap_or(&Value::Null),
                    v
                ),
            )
        })
        .collect()
}

pub fn valid_ssh_key(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let Some(line) = lines.next() else {
        return false;
    };
    let mut words = line.split_whitespace();
    let (Some(kind), Some(body)) = (words.next(), words.next()) else {
        return false;
    };
    let known =
        kind.starts_with("ssh-") || kind.starts_with("ecdsa-sha2-") || kind.starts_with("sk-");
    let base64 = body.len() % 4 == 0
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
    known && base64 && body.len() >= 16
}

pub fn valid_pull_secret(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .is_some_and(|v| v.get("auths").is_some_and(Value::is_object))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use crate::dpf::crd::{LocalRef, ObjectRef};

    pub(crate) fn sample() -> DPFHCPProvisionerSpec {
        // The chart README's sample, field for field.
        serde_saphyr::from_str(
            r#"
baseDomain: clusters.example.com
dpuClusterRef: {name: my-dpucluster, namespace: dpu-clusters}
etcdStorageClass: ocs-storagecluster-ceph-rbd
ocpReleaseImage: quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-x86_64
pullSecretRef: {name: my-pull-secret}
sshKeySecretRef: {name: my-ssh-key}
virtualIP: 192.168.1.100
controlPlaneAvailabilityPolicy: HighlyAvailable
"#,
        )
        .unwrap()
    }

    #[test]
    fn the_readme_sample_is_valid_and_published_by_load_balancer() {
        let s = sample();
        assert!(s.flannel_enabled, "flannelEnabled defaults to true");
        let c = check(&s).unwrap();
        assert_eq!(
            c.publishing,
            Publishing::LoadBalancer {
                vip: "192.168.1.100".parse().unwrap()
            }
        );
        assert_eq!(
            c.networking.service_network[0].cidr,
            DEFAULT_SERVICE_NETWORK
        );
        assert_eq!(
            c.networking.cluster_network[0].cidr,
            DEFAULT_CLUSTER_NETWORK
        );
        assert!(c.networking.machine_network.is_empty());
    }

    #[test]
    fn publishing_follows_the_policy_the_vip_and_the_explicit_switch() {
        let mut s = sample();
        s.control_plane_availability_policy = AvailabilityPolicy::SingleReplica;
        s.virtual_ip = None;
        assert_eq!(check(&s).unwrap().publishing, Publishing::NodePort);
        s.metal_lb_virtual_ip = Some("10.0.0.9".into());
        assert!(matches!(
            check(&s).unwrap().publishing,
            Publishing::LoadBalancer { .. }
        ));
        s.expose_through_load_balancer = Some(false);
        assert_eq!(check(&s).unwrap().publishing, Publishing::NodePort);
    }

    #[test]
    fn each_bad_field_is_named_with_its_reason() {
        type Mutation = fn(&mut DPFHCPProvisionerSpec);
        let cases: Vec<(Mutation, &str, &str)> = vec![
            (
                |s| s.ssh_key = Some("/root/.ssh/id_rsa.pub".into()),
                "sshKey",
                "FilePathNotSupported",
            ),
            (
                |s| s.pull_secret = Some("/tmp/ps.json".into()),
                "pullSecret",
                "FilePathNotSupported",
            ),
            (
                |s| s.ssh_key_secret_ref = None,
                "sshKeySecretRef",
                "Required",
            ),
            (
                |s| {
                    s.pull_secret_ref = Some(LocalRef {
                        name: String::new(),
                    })
                },
                "pullSecretRef",
                "Required",
            ),
            (
                |s| s.base_domain = "Example.COM".into(),
                "baseDomain",
                "InvalidDomain",
            ),
            (
                |s| s.base_domain = "localhost".into(),
                "baseDomain",
                "InvalidDomain",
            ),
            (
                |s| s.virtual_ip = Some("192.168.1.300".into()),
                "virtualIP",
                "InvalidIP",
            ),
            (|s| s.virtual_ip = None, "virtualIP", "Required"),
            (
                |s| s.metal_lb_virtual_ip = Some("10.1.1.1".into()),
                "metalLBVirtualIP",
                "Conflict",
            ),
            (
                |s| s.ocp_release_image = " ".into(),
                "ocpReleaseImage",
                "Required",
            ),
            (
                |s| {
                    s.dpu_cluster_ref = ObjectRef {
                        name: "x".into(),
                        namespace: String::new(),
                    }
                },
                "dpuClusterRef",
                "Required",
            ),
            (
                |s| {
                    s.node_selector =
                        Some((0..21).map(|i| (format!("k{i}"), String::new())).collect())
                },
                "nodeSelector",
                "TooMany",
            ),
            (
                |s| {
                    s.networking = Some(Networking {
                        service_network: vec![NetworkEntry {
                            cidr: "10.0.0.1/8".into(),
                            host_prefix: None,
                        }],
                        ..Default::default()
                    })
                },
                "networking.serviceNetwork[0].cidr",
                "InvalidCIDR",
            ),
            (
                |s| {
                    s.networking = Some(Networking {
                        machine_network: vec![NetworkEntry {
                            cidr: "banana".into(),
                            host_prefix: None,
                        }],
                        ..Default::default()
                    })
                },
                "networking.machineNetwork[0].cidr",
                "InvalidCIDR",
            ),
            (
                |s| {
                    s.networking = Some(Networking {
                        service_network: vec![NetworkEntry {
                            cidr: "10.0.0.0/8".into(),
                            host_prefix: Some(23),
                        }],
                        ..Default::default()
                    })
                },
                "networking.serviceNetwork[0].hostPrefix",
                "NotAllowed",
            ),
            (
                |s| {
                    s.control_plane_availability_policy = AvailabilityPolicy::SingleReplica;
                    s.virtual_ip = None;
                    s.expose_through_load_balancer = Some(true)
                },
                "virtualIP",
                "Required",
            ),
        ];
        for (mutate, field, reason) in cases {
            let mut s = sample();
            mutate(&mut s);
            let errors = check(&s).unwrap_err();
            assert!(
                errors
                    .iter()
                    .any(|e| e.field == field && e.reason == reason),
                "{field}/{reason} not in {errors:?}"
            );
        }
    }

    #[test]
    fn user_networks_replace_the_defaults_one_list_at_a_time() {
        let mut s = sample();
        s.networking = Some(Networking {
            cluster_network: vec![NetworkEntry {
                cidr: "10.128.0.0/14".into(),
                host_prefix: Some(23),
            }],
            ..Default::default()
        });
        let n = check(&s).unwrap().networking;
        assert_eq!(n.cluster_network[0].cidr, "10.128.0.0/14");
        assert_eq!(n.cluster_network[0].host_prefix, Some(23));
        assert_eq!(n.service_network[0].cidr, DEFAULT_SERVICE_NETWORK);
    }

    #[test]
    fn a_changed_immutable_field_is_named_and_a_release_change_is_not() {
        let s = sample();
        let provisioned = immutable_part(&s);
        let mut upgrade = s.clone();
        upgrade.ocp_release_image = "quay.io/x/ocp-release:4.20.0-x86_64".into();
        upgrade.machine_os_url = Some("quay.io/x/os:1".into());
        assert!(changed_immutable(&provisioned, &upgrade).is_empty());
        let mut moved = s.clone();
        moved.base_domain = "other.example.com".into();
        moved.flannel_enabled = false;
        let changed = changed_immutable(&provisioned, &moved);
        let fields: Vec<&str> = changed.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["baseDomain", "flannelEnabled"]);
        assert!(changed[0].message.contains("clusters.example.com"));
        // The alias is the same field.
        let mut alias = s.clone();
        alias.virtual_ip = None;
        alias.metal_lb_virtual_ip = Some("192.168.1.100".into());
        assert!(changed_immutable(&provisioned, &alias).is_empty());
    }

    #[test]
    fn ssh_keys_and_pull_secrets_are_parsed_not_just_present() {
        assert!(valid_ssh_key(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb3J3yRzq0k1Jq8F6c1bq6Xq0v4cX1mZq1k2l3m4n5o user@host\n"));
        assert!(valid_ssh_key(
            b"# comment\necdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTY=\n"
        ));
        assert!(!valid_ssh_key(b"hello"));
        assert!(!valid_ssh_key(b"ssh-rsa not*base64"));
        assert!(!valid_ssh_key(b"-----BEGIN OPENSSH PRIVATE KEY-----"));
        assert!(!valid_ssh_key(&[0xff, 0xfe]));
        assert!(valid_pull_secret(
            br#"{"auths": {"quay.io": {"auth": "eDp5"}}}"#
        ));
        assert!(!valid_pull_secret(br#"{"auths": []}"#));
        assert!(!valid_pull_secret(b"not json"));
    }
}
