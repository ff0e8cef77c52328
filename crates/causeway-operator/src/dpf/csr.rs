//! Whether a DPU's kubelet CSR is approved: one pure decision over the
//! CSR, what the management cluster knows of the DPU, the hosted cluster's
//! Node, the policy and what was approved before. Every path returns a
//! verdict with a reason; there is no default branch that approves.
//!
//! Order: triage (not ours: ignore), the flood guard (before any parsing),
//! the claimed DPU (unknown: ignore, some other approver owns it), then,
//! only for a CSR that is provably ours, the request's size and form, the
//! addresses it may never carry, identity (deny), lifecycle (deny or wait),
//! then approve.
//!
//! The request is read as the API server and the controller-manager's
//! signer read it, or refused: the signer merges the extensions of every
//! `extensionRequest` attribute, so a request with two of them, an
//! attribute of another kind, an attribute with several values or an
//! extension asked for twice is denied rather than read one way here and
//! another way by the signer.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use causeway_config::{valid_name, NameRules};
use ipnet::IpNet;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::der_parser::asn1_rs::{Header, Length};
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
/// A kubelet's request is about 1 KiB (an RSA 4096 key with a few SANs
/// stays under 3 KiB); anything larger is not a kubelet's, and is not
/// kept in memory.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Where a kubelet listens when its Node does not say.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;

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
    /// The PEM request; empty when it was too large to keep (`oversized`).
    pub request: Vec<u8>,
    pub expiration_seconds: Option<i32>,
    /// It has an Approved, Denied or Failed condition, or a certificate.
    pub decided: bool,
    /// When the API server stored it, in Unix seconds.
    pub created: Option<i64>,
    /// The request was over [`MAX_REQUEST_BYTES`] and was dropped.
    pub oversized: Option<Oversized>,
}

/// What is kept of a request too large to keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Oversized {
    pub bytes: usize,
    /// The node its subject names, read once before the bytes were
    /// dropped: who the request claims to be decides whether it is ours.
    pub claimed_node: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Dpu {
    pub phase: String,
    /// The DPU's management networks (the hosted cluster's machine
    /// networks): every IP SAN must be inside one.
    pub management_networks: Vec<IpNet>,
    /// When the approver first saw the DPU in its joining phase, this
    /// provisioning cycle (Unix seconds): a bootstrap CSR made before then
    /// was staged by someone other than the DPU.
    pub joining_since: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct Node {
    /// `status.addresses` as (type, address).
    pub addresses: Vec<(String, String)>,
    /// `status.daemonEndpoints.kubeletEndpoint.Port`, when set.
    pub kubelet_port: Option<u16>,
}

/// The DPUs of the provisioner (management cluster) and the Nodes of the
/// hosted cluster, by name.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub dpus: BTreeMap<String, Dpu>,
    pub nodes: BTreeMap<String, Node>,
    /// Addresses the management side assigned, and to which host: the
    /// DHCP reservations of the Infras whose `hostname` names one. A
    /// serving certificate's IP SANs must be among its own host's.
    pub assigned: BTreeMap<IpAddr, String>,
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub max_expiration_seconds: i32,
    pub service_networks: Vec<IpNet>,
    /// The API and ingress VIPs.
    pub vips: Vec<IpAddr>,
    pub cluster_domain: String,
    pub max_pending: usize,
    /// How much earlier than the joining phase was seen a bootstrap CSR
    /// may have been created: the two times come from different clocks.
    pub creation_skew_seconds: i64,
    /// How old a bootstrap CSR must be before it is approved: a second
    /// requester for the same DPU's identity within this window gets both
    /// denied instead of the first one served.
    pub bootstrap_hold_seconds: i64,
}

/// What earlier decisions left.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Per host: the UID of the bootstrap CSR approved in this provisioning
    /// cycle (kept in the provisioner's status).
    pub approved_bootstrap: BTreeMap<String, String>,
    /// Per host: the UIDs of pending bootstrap CSRs that would be approved
    /// but for each other ([`approvable_bootstrap`]).
    pub pending_bootstrap: BTreeMap<String, BTreeSet<String>>,
    /// Pending CSRs of the two kubelet signers, all hosts.
    pub pending: usize,
    /// Per host: the SANs of its current serving certificate, as the
    /// approvals recorded them.
    pub serving_sans: BTreeMap<String, BTreeSet<String>>,
    /// Per host: the SANs of the serving certificate its kubelet serves
    /// now, read at its assigned address and verified against the kubelet
    /// serving CA. Where known, a renewal is held to it instead of to
    /// `serving_sans`: it is what the signer issued and the node uses,
    /// whoever approved it.
    pub live_serving: BTreeMap<String, BTreeSet<String>>,
    /// When the pass runs (Unix seconds, the hosted API server's clock as
    /// far as CSR creation times go): with it, the bootstrap hold-down
    /// applies.
    pub now: Option<i64>,
}

/// The parts of the request the decision reads.
struct Parsed {
    common_names: Vec<String>,
    organizations: Vec<String>,
    other_subject_attributes: usize,
    /// Lowercased, without a trailing dot.
    dns_sans: Vec<String>,
    /// As written in the request; IPv4-mapped IPv6 addresses are kept as
    /// such so they can be refused.
    ip_sans: Vec<IpAddr>,
    other_sans: usize,
    any_sans: bool,
    ca: bool,
    unexpected_extensions: Vec<String>,
    key: Result<&'static str, String>,
}

/// The one DER request in `request`, or why there is not exactly one.
fn der_of(request: &[u8]) -> Result<Vec<u8>, Decision> {
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
    Ok(pem.contents.clone())
}

/// Whether an attribute's raw value (x509-parser keeps the SET's header
/// and its first value) is a SET of exactly that one value.
fn single_valued(raw: &[u8]) -> bool {
    match Header::from_der(raw) {
        Ok((first, header)) => header.length() == Length::Definite(first.len()),
        Err(_) => false,
    }
}

/// One DER element: identifier octet, minimal definite length, contents.
fn der_element(identifier: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![identifier];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(contents);
    out
}

/// The request as DER would write it from what was parsed, or `None` when
/// a parsed part has no single DER form here (a high tag number).
///
/// The envelope around the signed part (the outer SEQUENCE, the signature
/// algorithm and the signature BIT STRING) is not covered by the signature,
/// and the parser reads its tags leniently. Requiring the bytes to be the
/// one DER form of what was read means a request is judged exactly as it
/// is written, and that the signer, which reads the BIT STRING's padding
/// bits where this parser does not, sees the same signature.
fn canonical_der(csr: &X509CertificationRequest<'_>) -> Option<Vec<u8>> {
    let algorithm = &csr.signature_algorithm;
    let mut identifier = der_element(0x06, algorithm.algorithm.as_bytes());
    if let Some(parameters) = &algorithm.parameters {
        let header = &parameters.header;
        let tag = header.tag().0;
        if tag >= 0x1f {
            return None;
        }
        let octet = ((header.class() as u8) << 6)
            | if header.is_constructed() { 0x20 } else { 0 }
            | tag as u8;
        identifier.extend(der_element(octet, parameters.data));
    }
    let mut signature = vec![csr.signature_value.unused_bits];
    signature.extend_from_slice(&csr.signature_value.data);
    let mut body = csr.certification_request_info.raw.to_vec();
    body.extend(der_element(0x30, &identifier));
    body.extend(der_element(0x03, &signature));
    Some(der_element(0x30, &body))
}

fn parse(request: &[u8]) -> Result<Parsed, Decision> {
    let der = der_of(request)?;
    let (rest, csr) = X509CertificationRequest::from_der(&der)
        .map_err(|e| deny("Malformed", format!("not a PKCS#10 request: {e}")))?;
    if !rest.is_empty() {
        return Err(deny("Malformed", "trailing data after the request"));
    }
    if canonical_der(&csr).as_deref() != Some(der.as_slice()) {
        return Err(deny(
            "Malformed",
            "the request is not in DER: its envelope or signature is encoded another way",
        ));
    }
    // A signature or a key is a whole number of octets. Padding bits are
    // read by the signer (it shifts the octets right) and ignored by this
    // parser, so with them the two would check different signatures or
    // certify different keys.
    if csr.signature_value.unused_bits != 0 {
        return Err(deny(
            "Malformed",
            "the signature BIT STRING declares padding bits",
        ));
    }
    if csr
        .certification_request_info
        .subject_pki
        .subject_public_key
        .unused_bits
        != 0
    {
        return Err(deny(
            "Malformed",
            "the public key BIT STRING declares padding bits",
        ));
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
    let other_subject_attributes = info
        .subject
        .iter_attributes()
        .count()
        .saturating_sub(common_names.len() + organizations.len());
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
    // Every attribute, not only the first extensionRequest: what the
    // signer would read and this parser would not is refused here.
    let mut requests = 0;
    let mut asked: BTreeSet<String> = BTreeSet::new();
    let mut extensions = Vec::new();
    for attribute in info.iter_attributes() {
        let oid = attribute.oid.to_id_string();
        let ParsedCriAttribute::ExtensionRequest(request) = attribute.parsed_attribute() else {
            return Err(deny(
                "Attributes",
                format!(
                    "the request carries attribute {oid}; a kubelet's carries only its extensions"
                ),
            ));
        };
        requests += 1;
        if requests > 1 {
            return Err(deny(
                "Attributes",
                "the request carries more than one extensionRequest attribute",
            ));
        }
        if !single_valued(attribute.value) {
            return Err(deny(
                "Attributes",
                "the extensionRequest attribute must hold exactly one set of extensions",
            ));
        }
        for extension in &request.extensions {
            let id = extension.oid.to_id_string();
            if !asked.insert(id.clone()) {
                return Err(deny(
                    "Extension",
                    format!("extension {id} is asked for twice"),
                ));
            }
            extensions.push(extension.parsed_extension());
        }
    }
    for ext in extensions {
        match ext {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    parsed.any_sans = true;
                    match name {
                        GeneralName::DNSName(d) => parsed.dns_sans.push(canonical_name(d)),
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

/// A DNS name as it is compared: names match without regard to case or a
/// trailing dot.
pub(crate) fn canonical_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS-1123 subdomain, as Kubernetes checks Node names: a host name in
/// lowercase.
fn dns_subdomain(name: &str) -> bool {
    !name.bytes().any(|b| b.is_ascii_uppercase()) && valid_name(name, NameRules::HOST)
}

fn forbidden_ip(ip: IpAddr, policy: &Policy) -> Option<&'static str> {
    // The signer writes a mapped address into the certificate as the IPv4
    // address it maps, so it is judged, and refused, as that.
    if let IpAddr::V6(v6) = ip {
        if v6.to_ipv4_mapped().is_some() {
            return Some("an IPv4-mapped IPv6 address");
        }
    }
    let ip = ip.to_canonical();
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
    } else if policy.vips.iter().any(|v| v.to_canonical() == ip) {
        Some("a VIP")
    } else {
        None
    }
}

/// `name` is canonical ([`canonical_name`]).
fn forbidden_name(name: &str, policy: &Policy) -> bool {
    let domain = canonical_name(policy.cluster_domain.trim_start_matches('.'));
    name.contains('*')
        || name == "localhost"
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

/// The node a request names in its subject (`CN=system:node:<name>`),
/// read without checking anything else: who a bootstrap request claims to
/// be decides whether it is ours before its form is judged. `None` when
/// the request cannot be read or names no single node.
pub fn requested_node(request: &[u8]) -> Option<String> {
    let pem = x509_parser::pem::Pem::iter_from_buffer(request)
        .next()?
        .ok()?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents).ok()?;
    let names: Vec<&str> = csr
        .certification_request_info
        .subject
        .iter_common_name()
        .filter_map(|a| a.as_str().ok())
        .collect();
    match names.as_slice() {
        [cn] => cn.strip_prefix(NODE_PREFIX).map(str::to_string),
        _ => None,
    }
}

/// The DNS and IP SANs a request asks for, as text in their canonical
/// form: what a serving approval records, so a renewal can be held to it.
pub fn requested_sans(request: &[u8]) -> BTreeSet<String> {
    match parse(request) {
        Ok(p) => p
            .dns_sans
            .into_iter()
            .chain(p.ip_sans.iter().map(|ip| ip.to_canonical().to_string()))
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

/// Where the approver may read `host`'s live serving certificate: each of
/// its Node's InternalIP addresses that the management side assigned to it,
/// at the Node's kubelet port. A node writes its own Node's addresses and
/// port, so only its assigned addresses are dialled: a Node cannot point
/// the approver at anything but its own host.
pub fn kubelet_endpoints(host: &str, inventory: &Inventory) -> Vec<SocketAddr> {
    let Some(node) = inventory.nodes.get(host) else {
        return Vec::new();
    };
    let port = node
        .kubelet_port
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    let mut endpoints: Vec<SocketAddr> = node
        .addresses
        .iter()
        .filter(|(t, _)| t == "InternalIP")
        .filter_map(|(_, a)| a.parse::<IpAddr>().ok())
        .map(|ip| ip.to_canonical())
        .filter(|ip| {
            inventory
                .assigned
                .get(ip)
                .is_some_and(|owner| owner == host)
        })
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
    endpoints.dedup();
    endpoints
}

/// The node whose identity a CSR claims: the requester for a serving CSR,
/// the request's subject for a bootstrap one (the bootstrapper is shared).
fn claimed_host(csr: &Csr, kind: Kind) -> Result<String, Decision> {
    match kind {
        Kind::Serving => csr
            .username
            .strip_prefix(NODE_PREFIX)
            .map(str::to_string)
            .ok_or_else(|| ignore("NotANode", format!("{} is not a node", csr.username))),
        Kind::Bootstrap => {
            if csr.username != BOOTSTRAPPER {
                return Err(ignore(
                    "NotBootstrapper",
                    format!("{} is not the node bootstrapper", csr.username),
                ));
            }
            let claimed = match &csr.oversized {
                Some(o) => o.claimed_node.clone(),
                None => requested_node(&csr.request),
            };
            claimed.ok_or_else(|| {
                ignore(
                    "NoClaim",
                    "the request names no single system:node:<name> that can be read",
                )
            })
        }
    }
}

/// Whether `csr` could ever be approved here: a kubelet signer's, from a
/// requester the rules accept, naming a DPU of this cluster. Only these
/// count against the pending cap, so requests for names that are no DPU's
/// cannot halt the approvals (renewals included) of the DPUs that are.
pub fn could_be_ours(csr: &Csr, inventory: &Inventory) -> bool {
    kind_of(&csr.signer)
        .and_then(|kind| claimed_host(csr, kind).ok())
        .is_some_and(|host| inventory.dpus.contains_key(&host))
}

/// Pending bootstrap CSRs that would be approved but for each other, per
/// host: only these count as duplicates, so a CSR that fails the identity
/// or lifecycle checks (a squatter's) cannot hold a DPU's join up.
pub fn approvable_bootstrap(
    csrs: &[Csr],
    inventory: &Inventory,
    policy: &Policy,
    history: &History,
) -> BTreeMap<String, BTreeSet<String>> {
    // A CSR still held down is approvable for this count: two requesters
    // within the hold-down contest each other.
    let alone = History {
        pending_bootstrap: BTreeMap::new(),
        now: None,
        ..history.clone()
    };
    let mut approvable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for csr in csrs.iter().filter(|c| c.signer == BOOTSTRAP_SIGNER) {
        if decide(csr, inventory, policy, &alone).verdict != Verdict::Approve {
            continue;
        }
        if let Ok(host) = claimed_host(csr, Kind::Bootstrap) {
            approvable.entry(host).or_default().insert(csr.uid.clone());
        }
    }
    approvable
}

/// The one decision.
pub fn decide(csr: &Csr, inventory: &Inventory, policy: &Policy, history: &History) -> Decision {
    // Triage.
    let Some(kind) = kind_of(&csr.signer) else {
        return ignore(
            "OtherSigner",
            format!("signer {} is not a kubelet signer", csr.signer),
        );
    };
    if csr.decided {
        return ignore("AlreadyDecided", "the CSR already has a decision");
    }
    // Before any request is parsed: a flood costs a count, not a parse.
    if history.pending > policy.max_pending {
        return ignore("TooManyPending", format!("{} kubelet CSRs pending, over the cap of {}: nothing is approved until they are cleared", history.pending, policy.max_pending));
    }
    let host = match claimed_host(csr, kind) {
        Ok(h) => h,
        Err(d) => return d,
    };
    let Some(dpu) = inventory.dpus.get(&host) else {
        return ignore("UnknownDPU", format!("{host} is not a DPU of this cluster"));
    };

    // Ours from here on: what is wrong is denied.
    if let Some(o) = &csr.oversized {
        return deny(
            "TooLarge",
            format!(
                "the request is {} bytes, over the {MAX_REQUEST_BYTES} a kubelet's can be",
                o.bytes
            ),
        );
    }
    let parsed = match parse(&csr.request) {
        Ok(p) => p,
        Err(d) => return d,
    };

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
        Kind::Serving if parsed.dns_sans.is_empty() && parsed.ip_sans.is_empty() => {
            return deny("SANs", "a serving certificate names its host")
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
                format!("DNS SAN {name:?} names the cluster, localhost or a wildcard"),
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
            if dpu.phase != JOINING_PHASE {
                return deny(
                    "DPUNotJoining",
                    format!(
                        "DPU {host} is in phase {:?}, not {JOINING_PHASE:?}: only a joining DPU asks to join",
                        dpu.phase
                    ),
                );
            }
            let (Some(since), Some(created)) = (dpu.joining_since, csr.created) else {
                return ignore(
                    "JoiningNotTimed",
                    format!(
                        "when DPU {host} began joining, or when the CSR was made, is not known yet"
                    ),
                );
            };
            if created < since - policy.creation_skew_seconds {
                return deny(
                    "CreatedBeforeJoining",
                    format!(
                        "the CSR was made {}s before DPU {host} began joining: it was staged in advance",
                        since - created
                    ),
                );
            }
            if history
                .pending_bootstrap
                .get(&host)
                .is_some_and(|p| p.iter().any(|u| *u != csr.uid))
            {
                return deny("ContestedIdentity", format!("another bootstrap CSR that would be approved asks for {host}'s identity too: one of the requesters is not the DPU, so both are denied and the DPU's kubelet asks again"));
            }
            if let Some(now) = history.now {
                let age = now - created;
                if age < policy.bootstrap_hold_seconds {
                    return ignore(
                        "HoldDown",
                        format!(
                            "approved once {}s old if no other requester asks for {host} meanwhile ({age}s now)",
                            policy.bootstrap_hold_seconds
                        ),
                    );
                }
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
            let names: BTreeSet<String> = node
                .addresses
                .iter()
                .filter(|(t, _)| matches!(t.as_str(), "Hostname" | "InternalDNS" | "ExternalDNS"))
                .map(|(_, a)| canonical_name(a))
                .collect();
            let ips: BTreeSet<IpAddr> = node
                .addresses
                .iter()
                .filter(|(t, _)| matches!(t.as_str(), "InternalIP" | "ExternalIP"))
                .filter_map(|(_, a)| a.parse::<IpAddr>().ok())
                .map(|ip| ip.to_canonical())
                .collect();
            // Both the Node's own word (which a node can rewrite) and
            // what the management cluster knows must agree.
            for name in &parsed.dns_sans {
                if *name != host {
                    return deny(
                        "SANNotHost",
                        format!("DNS SAN {name:?} is not the DPU's host name {host:?}"),
                    );
                }
                if !names.contains(name) {
                    return deny(
                        "SANNotNodeAddress",
                        format!("DNS SAN {name:?} is not one of Node {host}'s addresses"),
                    );
                }
            }
            for ip in &parsed.ip_sans {
                let ip = ip.to_canonical();
                if !ips.contains(&ip) {
                    return deny(
                        "SANNotNodeAddress",
                        format!("IP SAN {ip} is not one of Node {host}'s addresses"),
                    );
                }
                if !dpu.management_networks.iter().any(|n| n.contains(&ip)) {
                    return deny(
                        "SANOutsideNetwork",
                        format!("IP SAN {ip} is outside the DPU's management network"),
                    );
                }
                // A node writes its own Node's addresses, so they alone
                // cannot say an address is its: the management side's
                // assignment must.
                match inventory.assigned.get(&ip) {
                    Some(owner) if *owner == host => {}
                    Some(owner) => {
                        return deny(
                            "SANAssignedToAnother",
                            format!("IP SAN {ip} is assigned to {owner}, not to {host}"),
                        )
                    }
                    None => {
                        return deny(
                            "SANNotAssigned",
                            format!("IP SAN {ip} is not an address the management side assigned to {host}: give {host} a DHCP reservation with hostname {host:?} in its VLAN's Infra"),
                        )
                    }
                }
            }
            let reference = match history.live_serving.get(&host) {
                Some(live) => Some((live, "the kubelet's live serving certificate")),
                None => history
                    .serving_sans
                    .get(&host)
                    .map(|recorded| (recorded, "the SANs approved before")),
            };
            if let Some((current, which)) = reference {
                let asked: BTreeSet<String> = parsed
                    .dns_sans
                    .iter()
                    .cloned()
                    .chain(
                        parsed
                            .ip_sans
                            .iter()
                            .map(|ip| ip.to_canonical().to_string()),
                    )
                    .collect();
                if let Some(extra) = asked.difference(current).next() {
                    return deny(
                        "RenewalAddsSANs",
                        format!("a renewal may not add SANs; {extra} is not among {which}"),
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
            created: Some(NOW),
            oversized: None,
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
            created: Some(NOW),
            oversized: None,
        }
    }

    /// When the tests' CSRs were made.
    const NOW: i64 = 1_800_000_000;

    fn policy() -> Policy {
        Policy {
            max_expiration_seconds: 86_400 * 365,
            service_networks: vec!["172.31.0.0/16".parse().unwrap()],
            vips: vec!["192.168.1.100".parse().unwrap()],
            cluster_domain: "cluster.local".into(),
            max_pending: 50,
            creation_skew_seconds: 10,
            bootstrap_hold_seconds: 15,
        }
    }

    /// dpu-1 is joining (no Node); dpu-2 has joined (Node with addresses).
    fn inventory() -> Inventory {
        let dpu = |phase: &str| Dpu {
            phase: phase.into(),
            management_networks: vec!["10.0.0.0/24".parse().unwrap()],
            joining_since: (phase == JOINING_PHASE).then_some(NOW - 100),
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
                    kubelet_port: None,
                },
            )]
            .into(),
            assigned: [
                ("10.0.0.12".parse().unwrap(), "dpu-2".to_string()),
                ("10.0.0.13".parse().unwrap(), "dpu-3".to_string()),
            ]
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
        r.sans = vec![dns("dpu-2"), ip("10.0.0.12")];
        check(
            &serving("dpu-2", &r),
            &History::default(),
            Verdict::Approve,
            "AutoApproved",
        );
        let mut rsa_like = req("system:node:dpu-2");
        rsa_like.alg = &rcgen::PKCS_ECDSA_P384_SHA384;
        rsa_like.sans = vec![dns("dpu-2")];
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
            (dns("auth.company.com"), "SANNotHost"),
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
        check(&serving("dpu-2", &r), &none, Verdict::Deny, "SANNotHost");
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
            Verdict::Deny,
            "ContestedIdentity",
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
        let mut named = req("system:node:dpu-2");
        named.sans = vec![dns("dpu-2")];
        let mut not_node = serving("dpu-2", &named);
        not_node.groups = vec!["system:authenticated".into()];
        check(&not_node, &none, Verdict::Deny, "Groups");
        let mut two_blocks = bootstrap("u", &req("system:node:dpu-1"));
        let again = two_blocks.request.clone();
        two_blocks.request.extend(again);
        check(&two_blocks, &none, Verdict::Deny, "Malformed");
        // Unreadable: a node's own is denied; the shared bootstrapper's
        // cannot be told to be ours, so it is left alone.
        let garbage =
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
        let mut from_node = serving("dpu-2", &req("system:node:dpu-2"));
        from_node.request = garbage.to_vec();
        check(&from_node, &none, Verdict::Deny, "Malformed");
        let mut from_bootstrapper = bootstrap("u", &req("system:node:dpu-1"));
        from_bootstrapper.request = garbage.to_vec();
        check(&from_bootstrapper, &none, Verdict::Ignore, "NoClaim");
        // A request whose body was altered after signing.
        let mut tampered = serving("dpu-2", &req("system:node:dpu-2"));
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
        // A DPU that is not joining does not ask to join.
        check(
            &bootstrap("u", &req("system:node:dpu-3")),
            &none,
            Verdict::Deny,
            "DPUNotJoining",
        );
        // Lifecycle waits, rather than refuses, what may become right.
        let mut named = req("system:node:dpu-1");
        named.sans = vec![dns("dpu-1")];
        check(&serving("dpu-1", &named), &none, Verdict::Ignore, "NoNode");
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

    /// A P-256 key for hand-built requests, and its SubjectPublicKeyInfo.
    fn forging_key() -> (super::super::forged_csr::Key, Vec<u8>) {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        (
            super::super::forged_csr::Key::EcdsaP256(key.serialize_der()),
            key.public_key_der(),
        )
    }

    #[test]
    fn sans_hidden_where_the_signer_would_read_them_are_refused() {
        use super::super::forged_csr::{
            challenge_password, extension_request, key_usage, request, subject_alt_name,
        };
        let (key, spki) = forging_key();
        let forged = |attributes: &[Vec<u8>]| {
            let mut c = serving("dpu-2", &req("system:node:dpu-2"));
            c.request = request("system:node:dpu-2", &spki, attributes, &key);
            c
        };
        let own = subject_alt_name(&["dpu-2"], &[&[10, 0, 0, 12]]);
        let wide = subject_alt_name(&["dpu-2", "kubernetes.default.svc"], &[&[192, 168, 1, 100]]);
        let none = History::default();
        // The builder's honest request passes: what follows fails for its
        // shape alone.
        check(
            &forged(&[extension_request(&[&[key_usage(), own.clone()]])]),
            &none,
            Verdict::Approve,
            "AutoApproved",
        );
        // keyUsage in the first extensionRequest, the SANs in a second:
        // the signer merges both and would sign the SANs.
        check(
            &forged(&[
                extension_request(&[&[key_usage()]]),
                extension_request(&[std::slice::from_ref(&wide)]),
            ]),
            &none,
            Verdict::Deny,
            "Attributes",
        );
        // One attribute whose SET holds two extension lists.
        check(
            &forged(&[extension_request(&[
                &[key_usage()],
                std::slice::from_ref(&wide),
            ])]),
            &none,
            Verdict::Deny,
            "Attributes",
        );
        // The same extension asked for twice.
        check(
            &forged(&[extension_request(&[&[own.clone(), wide]])]),
            &none,
            Verdict::Deny,
            "Extension",
        );
        // An attribute of another kind.
        check(
            &forged(&[
                challenge_password("x"),
                extension_request(&[&[key_usage(), own]]),
            ]),
            &none,
            Verdict::Deny,
            "Attributes",
        );
    }

    #[test]
    fn forbidden_sans_are_refused_in_every_spelling() {
        for san in [
            ip("::ffff:172.31.0.1"),
            ip("::ffff:192.168.1.100"),
            ip("::ffff:10.0.0.12"),
            dns("Kubernetes.Default.SVC"),
            dns("kubernetes.default.svc."),
            dns("API.Cluster.Local"),
            dns("LOCALHOST"),
        ] {
            let mut r = req("system:node:dpu-2");
            r.sans = vec![dns("dpu-2"), san.clone()];
            let d = decide(
                &serving("dpu-2", &r),
                &inventory(),
                &policy(),
                &History::default(),
            );
            assert_eq!(
                (d.verdict, d.reason),
                (Verdict::Deny, "ForbiddenSAN"),
                "{san:?}: {}",
                d.message
            );
        }
    }

    #[test]
    fn a_serving_san_must_be_the_hosts_the_nodes_and_in_its_network() {
        let mut inv = inventory();
        inv.nodes.insert(
            "dpu-2".into(),
            Node {
                kubelet_port: None,
                addresses: vec![
                    ("Hostname".into(), "dpu-2".into()),
                    ("InternalDNS".into(), "dpu-2.example".into()),
                    ("InternalIP".into(), "10.0.0.12".into()),
                    // A node can write its own status: this one claims an
                    // address outside its DPU's network.
                    ("ExternalIP".into(), "10.9.9.9".into()),
                ],
            },
        );
        let none = History::default();
        for (sans, want, reason) in [
            (vec![dns("dpu-2.example")], Verdict::Deny, "SANNotHost"),
            (vec![ip("10.0.0.99")], Verdict::Deny, "SANNotNodeAddress"),
            (vec![ip("10.9.9.9")], Verdict::Deny, "SANOutsideNetwork"),
            (Vec::new(), Verdict::Deny, "SANs"),
            (
                vec![dns("DPU-2."), ip("10.0.0.12")],
                Verdict::Approve,
                "AutoApproved",
            ),
        ] {
            let mut r = req("system:node:dpu-2");
            r.sans = sans.clone();
            let d = decide(&serving("dpu-2", &r), &inv, &policy(), &none);
            assert_eq!(
                (d.verdict, d.reason),
                (want, reason),
                "{sans:?}: {}",
                d.message
            );
        }
    }

    #[test]
    fn a_bootstrap_csr_made_before_its_dpu_began_joining_is_denied() {
        let none = History::default();
        // dpu-1 began joining at NOW - 100; the skew allowance is 10 s.
        let mut staged = bootstrap("staged", &req("system:node:dpu-1"));
        staged.created = Some(NOW - 111);
        check(&staged, &none, Verdict::Deny, "CreatedBeforeJoining");
        let mut skewed = bootstrap("skewed", &req("system:node:dpu-1"));
        skewed.created = Some(NOW - 105);
        check(&skewed, &none, Verdict::Approve, "AutoApproved");
        let mut inv = inventory();
        if let Some(d) = inv.dpus.get_mut("dpu-1") {
            d.joining_since = None;
        }
        let d = decide(
            &bootstrap("u", &req("system:node:dpu-1")),
            &inv,
            &policy(),
            &none,
        );
        assert_eq!((d.verdict, d.reason), (Verdict::Ignore, "JoiningNotTimed"));
    }

    #[test]
    fn only_approvable_csrs_count_as_duplicates() {
        let real = bootstrap("real", &req("system:node:dpu-1"));
        // A node's own credentials on the bootstrap signer, claiming dpu-1.
        let mut squatter = bootstrap("squatter", &req("system:node:dpu-1"));
        squatter.username = "system:node:dpu-2".into();
        squatter.groups = vec!["system:nodes".into(), "system:authenticated".into()];
        let mut staged = bootstrap("staged", &req("system:node:dpu-1"));
        staged.created = Some(NOW - 1000);
        let all = [real.clone(), squatter, staged];
        let history = History {
            pending_bootstrap: approvable_bootstrap(
                &all,
                &inventory(),
                &policy(),
                &History::default(),
            ),
            ..Default::default()
        };
        assert_eq!(
            history.pending_bootstrap,
            [("dpu-1".to_string(), ["real".to_string()].into())].into()
        );
        check(&real, &history, Verdict::Approve, "AutoApproved");
        // Two that would each be approved hold each other up.
        let twin = bootstrap("twin", &req("system:node:dpu-1"));
        let both = History {
            pending_bootstrap: approvable_bootstrap(
                &[real.clone(), twin],
                &inventory(),
                &policy(),
                &History::default(),
            ),
            ..Default::default()
        };
        check(&real, &both, Verdict::Deny, "ContestedIdentity");
    }

    /// A node writes its own Node's addresses. dpu-2
    /// adds dpu-3's address (and one nobody was given) to its Node and asks
    /// for a serving certificate with it; the management side assigned
    /// neither to dpu-2.
    #[test]
    fn a_renewal_is_held_to_the_kubelets_live_certificate_where_it_was_read() {
        let mut r = req("system:node:dpu-2");
        r.sans = vec![dns("dpu-2"), ip("10.0.0.12")];
        let csr = serving("dpu-2", &r);
        let recorded = History {
            serving_sans: [(
                "dpu-2".to_string(),
                ["dpu-2".to_string(), "10.0.0.12".to_string()].into(),
            )]
            .into(),
            ..Default::default()
        };
        check(&csr, &recorded, Verdict::Approve, "AutoApproved");
        // The kubelet serves a certificate without the address (the record
        // says more than was ever signed, or was lost): the live one wins.
        let mut live = recorded.clone();
        live.live_serving = [("dpu-2".to_string(), ["dpu-2".to_string()].into())].into();
        let d = decide(&csr, &inventory(), &policy(), &live);
        assert_eq!((d.verdict, d.reason), (Verdict::Deny, "RenewalAddsSANs"));
        assert!(
            d.message
                .contains("10.0.0.12 is not among the kubelet's live serving certificate"),
            "{}",
            d.message
        );
        // No record at all: the live certificate still bounds the renewal.
        let mut unrecorded = live.clone();
        unrecorded.serving_sans.clear();
        check(&csr, &unrecorded, Verdict::Deny, "RenewalAddsSANs");
        // A live certificate with every SAN asked for.
        unrecorded.live_serving.insert(
            "dpu-2".into(),
            ["dpu-2".to_string(), "10.0.0.12".to_string()].into(),
        );
        check(&csr, &unrecorded, Verdict::Approve, "AutoApproved");
    }

    #[test]
    fn the_kubelet_is_dialled_only_at_addresses_assigned_to_its_host() {
        let mut inv = inventory();
        inv.nodes.insert(
            "dpu-2".into(),
            Node {
                kubelet_port: Some(10443),
                addresses: vec![
                    ("Hostname".into(), "dpu-2".into()),
                    // A sibling's address and one nobody was assigned:
                    // written by the node, never dialled.
                    ("InternalIP".into(), "10.0.0.13".into()),
                    ("InternalIP".into(), "10.0.0.99".into()),
                    ("ExternalIP".into(), "10.0.0.12".into()),
                    ("InternalIP".into(), "10.0.0.12".into()),
                ],
            },
        );
        assert_eq!(
            kubelet_endpoints("dpu-2", &inv),
            vec!["10.0.0.12:10443".parse::<SocketAddr>().unwrap()]
        );
        inv.nodes.get_mut("dpu-2").unwrap().kubelet_port = Some(0);
        assert_eq!(
            kubelet_endpoints("dpu-2", &inv),
            vec!["10.0.0.12:10250".parse::<SocketAddr>().unwrap()]
        );
        assert!(kubelet_endpoints("dpu-3", &inv).is_empty(), "no Node");
    }

    #[test]
    fn a_node_cannot_get_a_serving_certificate_for_an_address_it_was_not_assigned() {
        let mut inv = inventory();
        inv.nodes.insert(
            "dpu-2".into(),
            Node {
                kubelet_port: None,
                addresses: vec![
                    ("Hostname".into(), "dpu-2".into()),
                    ("InternalIP".into(), "10.0.0.12".into()),
                    ("InternalIP".into(), "10.0.0.13".into()),
                    ("InternalIP".into(), "10.0.0.14".into()),
                ],
            },
        );
        let history = History::default();
        let ask = |san: &str| {
            let mut r = req("system:node:dpu-2");
            r.sans = vec![dns("dpu-2"), ip(san)];
            decide(&serving("dpu-2", &r), &inv, &policy(), &history)
        };
        let sibling = ask("10.0.0.13");
        assert_eq!(
            (sibling.verdict, sibling.reason),
            (Verdict::Deny, "SANAssignedToAnother"),
            "{}",
            sibling.message
        );
        let nobodys = ask("10.0.0.14");
        assert_eq!(
            (nobodys.verdict, nobodys.reason),
            (Verdict::Deny, "SANNotAssigned"),
            "{}",
            nobodys.message
        );
        let own = ask("10.0.0.12");
        assert_eq!(
            (own.verdict, own.reason),
            (Verdict::Approve, "AutoApproved"),
            "{}",
            own.message
        );
    }

    /// A compromised DPU holding the shared bootstrap
    /// credential asks for a victim's identity as soon as the victim's DPU
    /// begins joining, ahead of the victim's own request. It is held down;
    /// when the victim asks within the hold-down, both are denied; the
    /// first requester is never served on being first.
    #[test]
    fn a_thief_first_in_line_for_a_joining_dpus_identity_is_not_served() {
        let policy = policy();
        let hold = policy.bootstrap_hold_seconds;
        let mut thief = bootstrap("thief", &req("system:node:dpu-1"));
        thief.created = Some(NOW);
        let mut victim = bootstrap("victim", &req("system:node:dpu-1"));
        victim.created = Some(NOW + hold / 2);
        // The thief alone, at once: held down, not approved.
        let alone = [thief.clone()];
        let at = |now: i64, csrs: &[Csr]| History {
            pending_bootstrap: approvable_bootstrap(
                csrs,
                &inventory(),
                &policy,
                &History::default(),
            ),
            now: Some(now),
            ..Default::default()
        };
        let first = decide(&thief, &inventory(), &policy, &at(NOW + 1, &alone));
        assert_eq!(
            (first.verdict, first.reason),
            (Verdict::Ignore, "HoldDown"),
            "{}",
            first.message
        );
        // The victim asks within the hold-down: both are denied.
        let both = [thief.clone(), victim.clone()];
        for c in &both {
            let d = decide(c, &inventory(), &policy, &at(NOW + hold + 1, &both));
            assert_eq!(
                (d.verdict, d.reason),
                (Verdict::Deny, "ContestedIdentity"),
                "{}: {}",
                c.uid,
                d.message
            );
        }
        // Alone through the hold-down, a DPU's own request is approved.
        let d = decide(
            &victim,
            &inventory(),
            &policy,
            &at(NOW + hold / 2 + hold, &[victim.clone()]),
        );
        assert_eq!(
            (d.verdict, d.reason),
            (Verdict::Approve, "AutoApproved"),
            "{}",
            d.message
        );
    }

    /// An RSA-PSS request, which the parser here cannot verify, by openssl.
    fn rsa_pss(cn: &str) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args([
                "req",
                "-new",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "/dev/null",
            ])
            .args(["-subj", &format!("/O=system:nodes/CN={cn}")])
            .args(["-sha256", "-sigopt", "rsa_padding_mode:pss"])
            .output()
            .expect("openssl req");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[test]
    fn what_is_not_ours_is_left_alone_before_its_form_is_judged() {
        let none = History::default();
        let mut worker = serving("worker-7", &req("system:node:worker-7"));
        worker.request = rsa_pss("system:node:worker-7");
        check(&worker, &none, Verdict::Ignore, "UnknownDPU");
        let mut worker_bootstrap = bootstrap("u", &req("system:node:worker-7"));
        worker_bootstrap.request = worker.request.clone();
        check(&worker_bootstrap, &none, Verdict::Ignore, "UnknownDPU");
        // The same request from a DPU is ours, and refused.
        let mut dpu = serving("dpu-2", &req("system:node:dpu-2"));
        dpu.request = rsa_pss("system:node:dpu-2");
        assert_eq!(
            decide(&dpu, &inventory(), &policy(), &none).verdict,
            Verdict::Deny
        );
    }

    #[test]
    fn an_oversized_request_is_denied_when_ours_and_left_alone_when_not() {
        let none = History::default();
        let big = |c: &mut Csr, claimed: &str| {
            c.request = Vec::new();
            c.oversized = Some(Oversized {
                bytes: 1 << 20,
                claimed_node: Some(claimed.into()),
            });
        };
        let mut ours = bootstrap("u", &req("system:node:dpu-1"));
        big(&mut ours, "dpu-1");
        check(&ours, &none, Verdict::Deny, "TooLarge");
        let mut theirs = bootstrap("u", &req("system:node:worker-7"));
        big(&mut theirs, "worker-7");
        check(&theirs, &none, Verdict::Ignore, "UnknownDPU");
        let mut node = serving("dpu-2", &req("system:node:dpu-2"));
        big(&mut node, "ignored: the requester names the node");
        check(&node, &none, Verdict::Deny, "TooLarge");
    }

    #[test]
    fn a_flood_is_judged_before_any_request_is_parsed() {
        let flood = History {
            pending: 51,
            ..Default::default()
        };
        let mut unreadable = serving("dpu-2", &req("system:node:dpu-2"));
        unreadable.request = b"not a request".to_vec();
        check(&unreadable, &flood, Verdict::Ignore, "TooManyPending");
    }

    /// A request in PEM around `der`.
    fn pem_around(der: &[u8]) -> Vec<u8> {
        format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            pem_rfc7468_encode(der)
        )
        .into_bytes()
    }

    /// A valid serving request from dpu-2, and its DER.
    fn valid_serving_der() -> (Csr, Vec<u8>) {
        let mut r = req("system:node:dpu-2");
        r.sans = vec![dns("dpu-2"), ip("10.0.0.12")];
        let valid = serving("dpu-2", &r);
        let text = String::from_utf8(valid.request.clone()).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        let der = pem_rfc7468_decode(&body);
        (valid, der)
    }

    /// Every octet of a valid request, each bit flipped alone and all of
    /// them at once: nothing but the request as signed is approved. The
    /// envelope outside the signature is where this matters: its tags are
    /// read leniently by the parser, so only the DER check refuses them.
    #[test]
    fn every_octet_changed_in_a_valid_request_is_refused() {
        let (valid, der) = valid_serving_der();
        check(
            &valid,
            &History::default(),
            Verdict::Approve,
            "AutoApproved",
        );
        let mut approved = Vec::new();
        for at in 0..der.len() {
            for xor in [1u8, 2, 4, 8, 16, 32, 64, 128, 255] {
                let mut changed = der.clone();
                changed[at] ^= xor;
                let mut c = valid.clone();
                c.request = pem_around(&changed);
                let d = decide(&c, &inventory(), &policy(), &History::default());
                if d.verdict == Verdict::Approve {
                    approved.push(format!("octet {at} {:#04x} ^ {xor:#04x}", der[at]));
                }
            }
        }
        assert!(approved.is_empty(), "approved: {approved:?}");
    }

    #[test]
    fn padding_bits_in_the_key_or_the_signature_are_refused() {
        use super::super::forged_csr::{extension_request, key_usage, request, subject_alt_name};
        let none = History::default();
        // The signature's BIT STRING declares one padding bit: the signer
        // would shift the signature one bit right and check another one.
        let (valid, der) = valid_serving_der();
        let signature_padding = der.len() - valid_signature_len(&der) - 1;
        assert_eq!(der[signature_padding], 0);
        let mut padded = der.clone();
        padded[signature_padding] = 1;
        let mut c = valid.clone();
        c.request = pem_around(&padded);
        check(&c, &none, Verdict::Deny, "Malformed");
        // The key's BIT STRING declares padding bits, and the request is
        // signed as it stands: the signer would certify a shifted key.
        let (key, mut spki) = forging_key();
        let key_padding = spki.len() - 66;
        assert_eq!(&spki[key_padding..key_padding + 2], &[0, 4]);
        let attributes = [extension_request(&[&[
            key_usage(),
            subject_alt_name(&["dpu-2"], &[&[10, 0, 0, 12]]),
        ]])];
        let mut honest = serving("dpu-2", &req("system:node:dpu-2"));
        honest.request = request("system:node:dpu-2", &spki, &attributes, &key);
        check(&honest, &none, Verdict::Approve, "AutoApproved");
        spki[key_padding] = 2;
        let mut shifted = honest.clone();
        shifted.request = request("system:node:dpu-2", &spki, &attributes, &key);
        check(&shifted, &none, Verdict::Deny, "Malformed");
    }

    /// The length of the signature in a request's DER (its last element).
    fn valid_signature_len(der: &[u8]) -> usize {
        let (_, csr) = X509CertificationRequest::from_der(der).unwrap();
        csr.signature_value.data.len()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever a requester sends, the decision is a verdict, never a
        /// panic, and never an approval of bytes that are not a request.
        #[test]
        fn arbitrary_requests_are_never_approved_and_never_panic(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1024),
        ) {
            for request in [bytes.clone(), pem_around(&bytes)] {
                let mut node = serving("dpu-2", &req("system:node:dpu-2"));
                node.request = request.clone();
                let d = decide(&node, &inventory(), &policy(), &History::default());
                proptest::prop_assert_ne!(d.verdict, Verdict::Approve);
                let mut boot = bootstrap("u", &req("system:node:dpu-1"));
                boot.request = request;
                let d = decide(&boot, &inventory(), &policy(), &History::default());
                proptest::prop_assert_ne!(d.verdict, Verdict::Approve);
            }
        }

        /// A valid request with bytes changed anywhere (its signature then
        /// fails, or its structure) is never approved, and never panics.
        #[test]
        fn mutated_requests_are_never_approved_and_never_panic(
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), 1u8..), 1..4),
        ) {
            let mut r = req("system:node:dpu-2");
            r.sans = vec![dns("dpu-2"), ip("10.0.0.12")];
            let valid = serving("dpu-2", &r);
            let text = String::from_utf8(valid.request.clone()).unwrap();
            let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
            let mut der = pem_rfc7468_decode(&body);
            for (at, xor) in flips {
                let len = der.len();
                der[at % len] ^= xor;
            }
            let mut mutated = valid;
            mutated.request = pem_around(&der);
            let d = decide(&mutated, &inventory(), &policy(), &History::default());
            proptest::prop_assert_ne!(d.verdict, Verdict::Approve, "{}", d.message);
        }
    }
}
