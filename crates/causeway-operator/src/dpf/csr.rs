//! Whether a DPU's kubelet CSR is approved: one pure decision over the
//! CSR, what the management cluster knows of the DPU, the hosted cluster's
//! Node, the policy and what was approved before. Every path returns a
//! verdict with a reason; there is no default branch that approves.
//!
//! Order: triage (not ours: ignore), the claimed DPU (unknown: ignore, some
//! other approver owns it), the flood guard, the request's form and the
//! addresses it may never carry (deny), identity (deny), lifecycle (deny or
//! wait), then approve.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::{FromDer, X509CertificationRequest};
use x509_parser::public_key::PublicKey;

pub const BOOTSTRAP_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
pub const BOOTSTRAPPER: &str =
    "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper";
const NODE_PREFIX: &str = "system:node:";
/// The DPU phase in which it joins its cluster.
pub const JOINING_PHASE: &str = "DPU Cluster Config";
/// Phases in which a joined DPU's kubelet may get serving certificates.
pub const SERVING_PHASES: [&str; 3] = ["DPU Cluster Config", "Ready", "Node Effect Removal"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Bootstrap,
    Serving,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Approve,
    /// Left pending: not ours, or not yet.
    Ignore,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// A metric label and event reason.
    pub reason: &'static str,
    pub message: String,
}

fn ignore(reason: &'static str, message: impl Into<String>) -> Decision {
    Decision {
        verdict: Verdict::Ignore,
        reason,
        message: message.into(),
    }
}

fn deny(reason: &'static str, message: impl Into<String>) -> Decision {
    Decision {
        verdict: Verdict::Deny,
        reason,
        message: message.into(),
    }
}

/// What the CertificateSigningRequest object says.
#[derive(Debug, Clone, Default)]
pub struct Csr {
    pub uid: String,
    pub signer: String,
    pub username: String,
    pub groups: Vec<String>,
    pub usages: Vec<String>,
    pub request: Vec<u8>,
    pub expiration_seconds: Option<i32>,
    /// It has an Approved, Denied or Failed condition, or a certificate.
    pub decided: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Dpu {
    pub phase: String,
    /// The DPU's management networks (the hosted cluster's machine
    /// networks): IP SANs inside them are allowed.
    pub management_networks: Vec<IpNet>,
}

#[derive(Debug, Clone, Default)]
pub struct Node {
    /// `status.addresses` as (type, address).
    pub addresses: Vec<(String, String)>,
}

/// The DPUs of the provisioner (management cluster) and the Nodes of the
/// hosted cluster, by name.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub dpus: BTreeMap<String, Dpu>,
    pub nodes: BTreeMap<String, Node>,
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub max_expiration_seconds: i32,
    pub service_networks: Vec<IpNet>,
    /// The API and ingress VIPs.
    pub vips: Vec<IpAddr>,
    pub cluster_domain: String,
    pub max_pending: usize,
}

/// What earlier decisions left.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Per host: the UID of the bootstrap CSR approved in this provisioning
    /// cycle (kept in the provisioner's status).
    pub approved_bootstrap: BTreeMap<String, String>,
    /// Per host: the UIDs of bootstrap CSRs pending now.
    pub pending_bootstrap: BTreeMap<String, BTreeSet<String>>,
    /// Pending CSRs of the two kubelet signers, all hosts.
    pub pending: usize,
    /// Per host: the SANs of its current serving certificate.
    pub serving_sans: BTreeMap<String, BTreeSet<String>>,
}

/// The parts of the request the decision reads.
struct Parsed {
    common_names: Vec<String>,
    organizations: Vec<String>,
    other_subject_attributes: usize,
    dns_sans: Vec<String>,
    ip_sans: Vec<IpAddr>,
    other_sans: usize,
    any_sans: bool,
    ca: bool,
    unexpected_extensions: Vec<String>,
    key: Result<&'static str, String>,
}

fn parse(request: &[u8]) -> Result<Parsed, Decision> {
    let blocks: Vec<_> = x509_parser::pem::Pem::iter_from_buffer(request).collect();
    let [Ok(pem)] = blocks.as_slice() else {
        return Err(deny(
            "Malformed",
            "the request is not exactly one PEM block",
        ));
    };
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(deny(
            "Malformed",
            format!("the PEM block is {:?}, not CERTIFICATE REQUEST", pem.label),
        ));
    }
    let (rest, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| deny("Malformed", format!("not a PKCS#10 request: {e}")))?;
    if !rest.is_empty() {
        return Err(deny("Malformed", "trailing data after the request"));
    }
    csr.verify_signature().map_err(|e| {
        deny(
            "BadSignature",
            format!("the request's signature does not verify: {e}"),
        )
    })?;
    let info = &csr.certification_request_info;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| {
        a.as_str().map(str::to_string).unwrap_or_default()
    };
    let common_names: Vec<String> = info.subject.iter_common_name().map(text).collect();
    let organizations: Vec<String> = info.subject.iter_organization().map(text).collect();
    let other_subject_attributes =
        info.subject.iter_attributes().count() - common_names.len() - organizations.len();
    let mut parsed = Parsed {
        common_names,
        organizations,
        other_subject_attributes,
        dns_sans: Vec::new(),
        ip_sans: Vec::new(),
        other_sans: 0,
        any_sans: false,
        ca: false,
        unexpected_extensions: Vec::new(),
        key: Err(String::new()),
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        match ext {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    parsed.any_sans = true;
                    match name {
                        GeneralName::DNSName(d) => parsed.dns_sans.push(d.to_string()),
                        GeneralName::IPAddress(bytes) => match bytes.len() {
                            4 => parsed.ip_sans.push(IpAddr::from(
                                <[u8; 4]>::try_from(*bytes).unwrap_or_default(),
                            )),
                            16 => parsed.ip_sans.push(IpAddr::from(
                                <[u8; 16]>::try_from(*bytes).unwrap_or_default(),
                            )),
                            _ => parsed.other_sans += 1,
                        },
                        _ => parsed.other_sans += 1,
                    }
                }
            }
            ParsedExtension::BasicConstraints(bc) => parsed.ca |= bc.ca,
            ParsedExtension::KeyUsage(_) | ParsedExtension::ExtendedKeyUsage(_) => {}
            other => parsed
                .unexpected_extensions
                .push(format!("{other:?}").chars().take(60).collect()),
        }
    }
    let algorithm = info.subject_pki.algorithm.algorithm.to_id_string();
    let curve = info
        .subject_pki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string());
    parsed.key = match (
        info.subject_pki.parsed(),
        algorithm.as_str(),
        curve.as_deref(),
    ) {
        (Ok(PublicKey::RSA(rsa)), _, _) if rsa.key_size() >= 2048 => Ok("RSA"),
        (Ok(PublicKey::RSA(rsa)), _, _) => {
            Err(format!("RSA key of {} bits, under 2048", rsa.key_size()))
        }
        (Ok(PublicKey::EC(_)), "1.2.840.10045.2.1", Some("1.2.840.10045.3.1.7")) => {
            Ok("ECDSA P-256")
        }
        (Ok(PublicKey::EC(_)), "1.2.840.10045.2.1", Some("1.3.132.0.34")) => Ok("ECDSA P-384"),
        (_, alg, curve) => Err(format!(
            "key algorithm {alg} {} is not RSA 2048+, P-256 or P-384",
            curve.unwrap_or("")
        )),
    };
    Ok(parsed)
}

/// A DNS-1123 subdomain, as Kubernetes checks Node names.
fn dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn forbidden_ip(ip: IpAddr, policy: &Policy) -> Option<&'static str> {
    let special = match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
        }
    };
    if special {
        Some("loopback, link-local, unspecified or multicast")
    } else if policy.service_networks.iter().any(|n| n.contains(&ip)) {
        Some("in the Service network")
    } else if policy.vips.contains(&ip) {
        Some("a VIP")
    } else {
        None
    }
}

fn forbidden_name(name: &str, policy: &Policy) -> bool {
    let domain = policy.cluster_domain.trim_matches('.');
    name.contains('*')
        || name == "kubernetes"
        || name.starts_with("kubernetes.")
        || name.ends_with(".svc")
        || name.contains(".svc.")
        || (!domain.is_empty() && (name == domain || name.ends_with(&format!(".{domain}"))))
}

fn usages(csr: &Csr, kind: Kind, key: &str) -> bool {
    let got: BTreeSet<&str> = csr.usages.iter().map(String::as_str).collect();
    let last = match kind {
        Kind::Bootstrap => "client auth",
        Kind::Serving => "server auth",
    };
    let mut want: BTreeSet<&str> = ["digital signature", last].into();
    if got == want {
        return true;
    }
    // RSA keys may also be asked for key encipherment.
    want.insert("key encipherment");
    key == "RSA" && got == want && csr.usages.len() == 3
}

/// The one decision.
/// The node a bootstrap request names in its subject
/// (`CN=system:node:<name>`), for counting the pending requests per node.
/// `None` when the request does not parse or names no node.
pub fn requested_node(request: &[u8]) -> Option<String> {
    let parsed = parse(request).ok()?;
    match parsed.common_names.as_slice() {
        [cn] => cn.strip_prefix(NODE_PREFIX).map(str::to_string),
        _ => None,
    }
}

/// The DNS and IP SANs a request asks for, as text: what a serving
/// approval records, so a renewal can be held to it.
pub fn requested_sans(request: &[u8]) -> BTreeSet<String> {
    match parse(request) {
        Ok(p) => p
            .dns_sans
            .into_iter()
            .chain(p.ip_sans.iter().map(ToString::to_string))
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// Which kind of kubelet request a signer means.
pub fn kind_of(signer: &str) -> Option<Kind> {
    match signer {
        BOOTSTRAP_SIGNER => Some(Kind::Bootstrap),
        SERVING_SIGNER => Some(Kind::Serving),
        _ => None,
    }
}

pub fn decide(csr: &Csr, inventory: &Inventory, policy: &Policy, history: &History) -> Decision {
    // Triage.
    let kind = match csr.signer.as_str() {
        BOOTSTRAP_SIGNER => Kind::Bootstrap,
        SERVING_SIGNER => Kind::Serving,
        other => {
            return ignore(
                "OtherSigner",
                format!("signer {other} is not a kubelet signer"),
            )
        }
    };
    if csr.decided {
        return ignore("AlreadyDecided", "the CSR already has a decision");
    }
    if kind == Kind::Bootstrap && csr.username != BOOTSTRAPPER {
        return ignore(
            "NotBootstrapper",
            format!("{} is not the node bootstrapper", csr.username),
        );
    }
    if kind == Kind::Serving && !csr.username.starts_with(NODE_PREFIX) {
        return ignore("NotANode", format!("{} is not a node", csr.username));
    }
    let parsed = match parse(&csr.request) {
        Ok(p) => p,
        Err(d) => return d,
    };
    // The DPU claimed: by the requester's identity for serving CSRs, by the
    // subject for bootstrap ones (the bootstrapper is shared).
    let host = match kind {
        Kind::Serving => csr.username[NODE_PREFIX.len()..].to_string(),
        Kind::Bootstrap => match parsed.common_names.as_slice() {
            [cn] if cn.starts_with(NODE_PREFIX) => cn[NODE_PREFIX.len()..].to_string(),
            _ => {
                return deny(
                    "CommonName",
                    format!(
                        "the subject's CN must be one system:node:<name>, not {:?}",
                        parsed.common_names
                    ),
                )
            }
        },
    };
    let Some(dpu) = inventory.dpus.get(&host) else {
        return ignore("UnknownDPU", format!("{host} is not a DPU of this cluster"));
    };
    if history.pending > policy.max_pending {
        return ignore("TooManyPending", format!("{} kubelet CSRs pending, over the cap of {}: nothing is approved until they are cleared", history.pending, policy.max_pending));
    }

    // Form.
    if !dns_subdomain(&host) {
        return deny("InvalidName", format!("{host:?} is not a valid node name"));
    }
    let want_cn = format!("{NODE_PREFIX}{host}");
    if parsed.common_names != [want_cn.clone()] {
        return deny(
            "CommonName",
            format!(
                "the subject's CN must be {want_cn}, not {:?}",
                parsed.common_names
            ),
        );
    }
    if parsed.organizations != ["system:nodes"] || parsed.other_subject_attributes > 0 {
        return deny(
            "Subject",
            format!(
                "the subject must be O=system:nodes and the CN only (O {:?}, {} other attributes)",
                parsed.organizations, parsed.other_subject_attributes
            ),
        );
    }
    let key = match &parsed.key {
        Ok(k) => *k,
        Err(why) => return deny("KeyType", why.clone()),
    };
    if !usages(csr, kind, key) {
        return deny(
            "Usages",
            format!(
                "usages {:?} are not exactly digital signature and {}",
                csr.usages,
                if kind == Kind::Bootstrap {
                    "client auth"
                } else {
                    "server auth"
                }
            ),
        );
    }
    if parsed.ca {
        return deny(
            "Extension",
            "the request asks for a CA certificate (BasicConstraints CA=true)",
        );
    }
    if let Some(ext) = parsed.unexpected_extensions.first() {
        return deny(
            "Extension",
            format!("unexpected extension requested: {ext}"),
        );
    }
    if csr
        .expiration_seconds
        .is_some_and(|s| s > policy.max_expiration_seconds)
    {
        return deny(
            "Expiration",
            format!(
                "expirationSeconds {} is over the cap of {}",
                csr.expiration_seconds.unwrap_or_default(),
                policy.max_expiration_seconds
            ),
        );
    }
    match kind {
        Kind::Bootstrap if parsed.any_sans => {
            return deny("SANs", "a client certificate carries no SANs")
        }
        Kind::Serving if parsed.other_sans > 0 => {
            return deny("SANs", "only DNS and IP SANs are allowed")
        }
        _ => {}
    }
    for ip in &parsed.ip_sans {
        if let Some(why) = forbidden_ip(*ip, policy) {
            return deny("ForbiddenSAN", format!("IP SAN {ip} is {why}"));
        }
    }
    for name in &parsed.dns_sans {
        if forbidden_name(name, policy) {
            return deny(
                "ForbiddenSAN",
                format!("DNS SAN {name:?} names the cluster or a wildcard"),
            );
        }
    }

    // Identity.
    let groups: BTreeSet<&str> = csr.groups.iter().map(String::as_str).collect();
    match kind {
        Kind::Bootstrap => {
            let want: BTreeSet<&str> = [
                "system:serviceaccounts",
                "system:serviceaccounts:openshift-machine-config-operator",
                "system:authenticated",
            ]
            .into();
            if groups != want {
                return deny(
                    "Groups",
                    format!("the bootstrapper's groups must be exactly {want:?}, not {groups:?}"),
                );
            }
        }
        Kind::Serving => {
            if !groups.contains("system:nodes") || !groups.contains("system:authenticated") {
                return deny(
                    "Groups",
                    format!("a node is in system:nodes and system:authenticated, not {groups:?}"),
                );
            }
        }
    }

    // Lifecycle.
    let node = inventory.nodes.get(&host);
    match kind {
        Kind::Bootstrap => {
            if node.is_some() {
                return deny(
                    "NodeExists",
                    format!("Node {host} already exists: a bootstrap CSR for it is someone else's"),
                );
            }
            if let Some(uid) = history
                .approved_bootstrap
                .get(&host)
                .filter(|u| **u != csr.uid)
            {
                return deny("AlreadyApproved", format!("a bootstrap CSR for {host} was already approved in this provisioning cycle (UID {uid})"));
            }
            if history
                .pending_bootstrap
                .get(&host)
                .is_some_and(|p| p.iter().any(|u| *u != csr.uid))
            {
                return ignore("DuplicatePending", format!("more than one bootstrap CSR for {host} is pending; none is approved until one is removed"));
            }
            if dpu.phase != JOINING_PHASE {
                return ignore(
                    "DPUNotJoining",
                    format!(
                        "DPU {host} is in phase {:?}, not {JOINING_PHASE:?}",
                        dpu.phase
                    ),
                );
            }
        }
        Kind::Serving => {
            let Some(node) = node else {
                return ignore("NoNode", format!("Node {host} does not exist yet"));
            };
            if !SERVING_PHASES.contains(&dpu.phase.as_str()) {
                return ignore(
                    "DPUPhase",
                    format!("DPU {host} is in phase {:?}", dpu.phase),
                );
            }
            let has = |types: &[&str], value: &str| {
                node.addresses
                    .iter()
                    .any(|(t, a)| types.contains(&t.as_str()) && a == value)
            };
            for name in &parsed.dns_sans {
                if !has(&["Hostname", "InternalDNS", "ExternalDNS"], name) {
                    return deny(
                        "SANNotNodeAddress",
                        format!("DNS SAN {name:?} is not one of Node {host}'s addresses"),
                    );
                }
            }
            for ip in &parsed.ip_sans {
                let in_cidr = dpu.management_networks.iter().any(|n| n.contains(ip));
                if !has(&["InternalIP", "ExternalIP"], &ip.to_string()) && !in_cidr {
                    return deny("SANNotNodeAddress", format!("IP SAN {ip} is neither Node {host}'s address nor in the DPU's management network"));
                }
            }
            if let Some(current) = history.serving_sans.get(&host) {
                let asked: BTreeSet<String> = parsed
                    .dns_sans
                    .iter()
                    .cloned()
                    .chain(parsed.ip_sans.iter().map(ToString::to_string))
                    .collect();
                if let Some(extra) = asked.difference(current).next() {
                    return deny(
                        "RenewalAddsSANs",
                        format!("a renewal may not add SANs; {extra} is new"),
                    );
                }
            }
        }
    }
    Decision {
        verdict: Verdict::Approve,
        reason: "AutoApproved",
        message: format!(
            "Auto-approved {} CSR for DPU worker node {host}",
            if kind == Kind::Bootstrap {
                "bootstrap"
            } else {
                "serving"
            }
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, CustomExtension, DnType, KeyPair, SanType};

    struct Req {
        cn: String,
        o: Vec<&'static str>,
        sans: Vec<SanType>,
        alg: &'static rcgen::SignatureAlgorithm,
        ca: bool,
    }

    fn req(cn: &str) -> Req {
        Req {
            cn: cn.into(),
            o: vec!["system:nodes"],
            sans: Vec::new(),
            alg: &rcgen::PKCS_ECDSA_P256_SHA256,
            ca: false,
        }
    }

    fn pem(r: &Req) -> Vec<u8> {
        let key = KeyPair::generate_for(r.alg).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, r.cn.clone());
        for o in &r.o {
            params.distinguished_name.push(DnType::OrganizationName, *o);
        }
        params.subject_alt_names = r.sans.clone();
        if r.ca {
            // BasicConstraints, critical not needed: SEQUENCE { BOOLEAN TRUE }.
            params
                .custom_extensions
                .push(CustomExtension::from_oid_content(
                    &[2, 5, 29, 19],
                    vec![0x30, 0x03, 0x01, 0x01, 0xff],
                ));
        }
        params
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
            .into_bytes()
    }

    fn dns(s: &str) -> SanType {
        SanType::DnsName(s.try_into().unwrap())
    }
    fn ip(s: &str) -> SanType {
        SanType::IpAddress(s.parse().unwrap())
    }

    fn bootstrap(uid: &str, r: &Req) -> Csr {
        Csr {
            uid: uid.into(),
            signer: BOOTSTRAP_SIGNER.into(),
            username: BOOTSTRAPPER.into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:openshift-machine-config-operator".into(),
                "system:authenticated".into(),
            ],
            usages: vec!["digital signature".into(), "client auth".into()],
            request: pem(r),
            expiration_seconds: None,
            decided: false,
        }
    }

    fn serving(host: &str, r: &Req) -> Csr {
        Csr {
            uid: format!("serving-{host}"),
            signer: SERVING_SIGNER.into(),
            username: format!("system:node:{host}"),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
            usages: vec!["digital signature".into(), "server auth".into()],
            request: pem(r),
            expiration_seconds: Some(3600),
            decided: false,
        }
    }

    fn policy() -> Policy {
        Policy {
            max_expiration_seconds: 86_400 * 365,
            service_networks: vec!["172.31.0.0/16".parse().unwrap()],
            vips: vec!["192.168.1.100".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            max_pending: 50,
        }
    }

    /// dpu-1 is joining (no Node); dpu-2 has joined (Node with addresses).
    fn inventory() -> Inventory {
        let dpu = |phase: &str| Dpu {
            phase: phase.into(),
            management_networks: vec!["10.0.0.0/24".parse().unwrap()],
        };
        Inventory {
            dpus: [
                ("dpu-1".to_string(), dpu(JOINING_PHASE)),
                ("dpu-2".to_string(), dpu("Ready")),
                ("dpu-3".to_string(), dpu("Initializing")),
            ]
            .into(),
            nodes: [(
                "dpu-2".to_string(),
                Node {
                    addresses: vec![
                        ("Hostname".into(), "dpu-2".into()),
                        ("InternalIP".into(), "10.0.0.12".into()),
                    ],
                },
            )]
            .into(),
        }
    }

    fn check(csr: &Csr, history: &History, want: Verdict, reason: &str) {
        let d = decide(csr, &inventory(), &policy(), history);
        assert_eq!((d.verdict, d.reason), (want, reason), "{}", d.message);
    }

    #[test]
    fn a_joining_dpus_bootstrap_and_a_joined_dpus_serving_csr_are_approved() {
        let d = decide(
            &bootstrap("u1", &req("system:node:dpu-1")),
            &inventory(),
            &policy(),
            &History::default(),
        );
        assert_eq!(d.verdict, Verdict::Approve, "{}", d.message);
        assert_eq!(
            d.message,
            "Auto-approved bootstrap CSR for DPU worker node dpu-1"
        );
        let mut r = req("system:node:dpu-2");
        r.sans = vec![dns("dpu-2"), ip("10.0.0.12"), ip("10.0.0.99")];
        check(
            &serving("dpu-2", &r),
            &History::default(),
            Verdict::Approve,
            "AutoApproved",
        );
        let mut rsa_like = req("system:node:dpu-2");
        rsa_like.alg = &rcgen::PKCS_ECDSA_P384_SHA384;
        check(
            &serving("dpu-2", &rsa_like),
            &History::default(),
            Verdict::Approve,
            "AutoApproved",
        );
    }

    #[test]
    fn what_is_not_ours_is_left_alone() {
        let mut other = bootstrap("u", &req("system:node:dpu-1"));
        other.signer = "example.com/custom".into();
        check(&other, &History::default(), Verdict::Ignore, "OtherSigner");
        let mut done = bootstrap("u", &req("system:node:dpu-1"));
        done.decided = true;
        check(
            &done,
            &History::default(),
            Verdict::Ignore,
            "AlreadyDecided",
        );
        check(
            &bootstrap("u", &req("system:node:worker-7")),
            &History::default(),
            Verdict::Ignore,
            "UnknownDPU",
        );
        check(
            &serving("worker-7", &req("system:node:worker-7")),
            &History::default(),
            Verdict::Ignore,
            "UnknownDPU",
        );
        let mut user = bootstrap("u", &req("system:node:dpu-1"));
        user.username = "alice".into();
        check(
            &user,
            &History::default(),
            Verdict::Ignore,
            "NotBootstrapper",
        );
    }

    #[test]
    fn every_attack_is_refused_or_left_pending_with_its_reason() {
        let none = History::default();
        // Impersonation: node dpu-2 asks for dpu-1's serving identity; a
        // bootstrap CSR for a DPU whose Node exists.
        check(
            &serving("dpu-2", &req("system:node:dpu-1")),
            &none,
            Verdict::Deny,
            "CommonName",
        );
        check(
            &bootstrap("u", &req("system:node:dpu-2")),
            &none,
            Verdict::Deny,
            "NodeExists",
        );
        // Extra SANs: another node's IP, the VIP, the API's names, an
        // outside domain, a wildcard, loopback, the Service network.
        for (san, reason) in [
            (ip("10.1.2.3"), "SANNotNodeAddress"),
            (ip("192.168.1.100"), "ForbiddenSAN"),
            (dns("kubernetes.default.svc"), "ForbiddenSAN"),
            (dns("api.cluster.local"), "ForbiddenSAN"),
            (dns("auth.company.com"), "SANNotNodeAddress"),
            (dns("*.dpu-2"), "ForbiddenSAN"),
            (ip("127.0.0.1"), "ForbiddenSAN"),
            (ip("169.254.0.1"), "ForbiddenSAN"),
            (ip("172.31.0.1"), "ForbiddenSAN"),
            (SanType::Rfc822Name("a@b.c".try_into().unwrap()), "SANs"),
            (SanType::URI("spiffe://x".try_into().unwrap()), "SANs"),
        ] {
            let mut r = req("system:node:dpu-2");
            r.sans = vec![dns("dpu-2"), san];
            check(&serving("dpu-2", &r), &none, Verdict::Deny, reason);
        }
        // Prefix confusion: a name that starts with the node's is not it.
        let mut r = req("system:node:dpu-2");
        r.sans = vec![dns("dpu-2.attacker.example")];
        check(
            &serving("dpu-2", &r),
            &none,
            Verdict::Deny,
            "SANNotNodeAddress",
        );
        check(
            &serving("dpu-2", &req("system:node:dpu-2x")),
            &none,
            Verdict::Deny,
            "CommonName",
        );
        // A client certificate with SANs.
        let mut r = req("system:node:dpu-1");
        r.sans = vec![dns("dpu-1")];
        check(&bootstrap("u", &r), &none, Verdict::Deny, "SANs");
        // Duplicate: a second bootstrap CSR after one was approved; racing:
        // two pending at once.
        let approved = History {
            approved_bootstrap: [("dpu-1".to_string(), "first".to_string())].into(),
            ..Default::default()
        };
        check(
            &bootstrap("second", &req("system:node:dpu-1")),
            &approved,
            Verdict::Deny,
            "AlreadyApproved",
        );
        check(
            &bootstrap("first", &req("system:node:dpu-1")),
            &approved,
            Verdict::Approve,
            "AutoApproved",
        );
        let racing = History {
            pending_bootstrap: [(
                "dpu-1".to_string(),
                ["a".to_string(), "b".to_string()].into(),
            )]
            .into(),
            ..Default::default()
        };
        check(
            &bootstrap("a", &req("system:node:dpu-1")),
            &racing,
            Verdict::Ignore,
            "DuplicatePending",
        );
        // A renewal adding a SAN.
        let current = History {
            serving_sans: [("dpu-2".to_string(), ["dpu-2".to_string()].into())].into(),
            ..Default::default()
        };
        let mut r = req("system:node:dpu-2");
        r.sans = vec![dns("dpu-2"), ip("10.0.0.12")];
        check(
            &serving("dpu-2", &r),
            &current,
            Verdict::Deny,
            "RenewalAddsSANs",
        );
        // A flood.
        let flood = History {
            pending: 51,
            ..Default::default()
        };
        check(
            &bootstrap("u", &req("system:node:dpu-1")),
            &flood,
            Verdict::Ignore,
            "TooManyPending",
        );
        // Long expiry.
        let mut long = serving("dpu-2", &req("system:node:dpu-2"));
        long.expiration_seconds = Some(86_400 * 3650);
        check(&long, &none, Verdict::Deny, "Expiration");
        // A key type outside the policy.
        let mut ed = req("system:node:dpu-1");
        ed.alg = &rcgen::PKCS_ED25519;
        check(&bootstrap("u", &ed), &none, Verdict::Deny, "KeyType");
        // CA=true.
        let mut ca = req("system:node:dpu-1");
        ca.ca = true;
        check(&bootstrap("u", &ca), &none, Verdict::Deny, "Extension");
    }

    #[test]
    fn form_and_identity_are_exact() {
        let none = History::default();
        let mut extra_o = req("system:node:dpu-1");
        extra_o.o = vec!["system:nodes", "system:masters"];
        check(&bootstrap("u", &extra_o), &none, Verdict::Deny, "Subject");
        let mut usages = bootstrap("u", &req("system:node:dpu-1"));
        usages.usages.push("server auth".into());
        check(&usages, &none, Verdict::Deny, "Usages");
        let mut groups = bootstrap("u", &req("system:node:dpu-1"));
        groups.groups.push("system:masters".into());
        check(&groups, &none, Verdict::Deny, "Groups");
        let mut not_node = serving("dpu-2", &req("system:node:dpu-2"));
        not_node.groups = vec!["system:authenticated".into()];
        check(&not_node, &none, Verdict::Deny, "Groups");
        let mut two_blocks = bootstrap("u", &req("system:node:dpu-1"));
        let again = two_blocks.request.clone();
        two_blocks.request.extend(again);
        check(&two_blocks, &none, Verdict::Deny, "Malformed");
        let mut garbage = bootstrap("u", &req("system:node:dpu-1"));
        garbage.request =
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
                .to_vec();
        check(&garbage, &none, Verdict::Deny, "Malformed");
        // A request whose body was altered after signing.
        let mut tampered = bootstrap("u", &req("system:node:dpu-1"));
        let text = String::from_utf8(tampered.request.clone()).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        let mut der = pem_rfc7468_decode(&body);
        let at = der.len() / 3;
        der[at] ^= 0x01;
        tampered.request = format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            pem_rfc7468_encode(&der)
        )
        .into_bytes();
        let d = decide(&tampered, &inventory(), &policy(), &none);
        assert_eq!(d.verdict, Verdict::Deny, "{}", d.message);
        // Lifecycle waits, rather than refuses, what may become right.
        check(
            &bootstrap("u", &req("system:node:dpu-3")),
            &none,
            Verdict::Ignore,
            "DPUNotJoining",
        );
        check(
            &serving("dpu-1", &req("system:node:dpu-1")),
            &none,
            Verdict::Ignore,
            "NoNode",
        );
    }

    // Base64 through k8s-openapi's ByteString, which is what Secrets use.
    fn pem_rfc7468_decode(s: &str) -> Vec<u8> {
        serde_json::from_value::<k8s_openapi::ByteString>(serde_json::json!(s))
            .unwrap()
            .0
    }

    fn pem_rfc7468_encode(data: &[u8]) -> String {
        serde_json::to_value(k8s_openapi::ByteString(data.to_vec()))
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }
}
