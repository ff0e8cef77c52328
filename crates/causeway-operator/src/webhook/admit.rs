//! What the validating webhook answers, as pure functions of the
//! AdmissionReview (and, for a new provisioner, the BlueField lookup's
//! outcome, fetched by the server before it asks).
//!
//! DPFHCPProvisioner: the spec's own checks, the immutable fields against
//! the old object (the CRD's CEL rules, for servers that lack CEL), and on
//! create the BlueField image. Infra: the fields and address rules the
//! controller's validation applies, those that need no other object.

use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::GroupVersionKind;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::dpf::bluefield::LookupError;
use crate::dpf::crd::DPFHCPProvisionerSpec;
use crate::dpf::spec;
use crate::infra::crd::InfraSpec;
use crate::infra::validate::{self, HostedClusterFacts, ServiceAddress};

/// The BlueField lookup's outcome for a provisioner being created.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageCheck {
    /// Not a create of a provisioner that needs one.
    NotAsked,
    /// Neither the ConfigMap nor an earlier lookup of the controller's
    /// knows; the controller looks once the object is stored.
    Unknown,
    Found(String),
    Failed(LookupError),
}

/// The parts of an AdmissionReview this webhook reads. Read in one pass
/// straight from the body: kube's `AdmissionReview` and `DynamicObject`
/// flatten, which makes serde buffer the whole document before building
/// it, and everything else here (status, managedFields, annotations,
/// userInfo) is skipped by the parser without being kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    #[serde(default)]
    api_version: String,
    request: Option<Request>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub object: Option<Object>,
    #[serde(default)]
    pub old_object: Option<Object>,
}

#[derive(Debug, Deserialize)]
pub struct Object {
    #[serde(default)]
    pub metadata: Meta,
    /// Kept as JSON: whether an update changes it is decided on what the
    /// API server stored, even if that no longer reads as today's type.
    #[serde(default)]
    pub spec: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub namespace: Option<String>,
    /// An Infra's objects and pods are named after it.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub generate_name: Option<String>,
}

impl Request {
    fn allowed(&self) -> AdmissionResponse {
        let mut r = AdmissionResponse::invalid("");
        r.uid = self.uid.clone();
        r.allowed = true;
        r.result = Default::default();
        r
    }
}

/// A parsed request, or the response that says why it could not be read.
pub fn parse(body: &[u8]) -> Result<Request, Box<AdmissionResponse>> {
    let invalid = |why: String| Box::new(AdmissionResponse::invalid(why));
    let wrong_version = |version: &str| {
        invalid(format!(
            "AdmissionReview apiVersion {version:?} is not admission.k8s.io/v1, the only version this webhook speaks"
        ))
    };
    let mut reader = serde_json::Deserializer::from_slice(body);
    let review: Review = match serde_path_to_error::deserialize(&mut reader) {
        Ok(r) => r,
        Err(e) => {
            // Only on the way out: say so if the version is the cause.
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Version {
                api_version: String,
            }
            if let Ok(v) = serde_json::from_slice::<Version>(body) {
                if v.api_version != "admission.k8s.io/v1" {
                    return Err(wrong_version(&v.api_version));
                }
            }
            let path = e.path().to_string();
            return Err(invalid(format!(
                "malformed AdmissionReview: {path}: {}",
                e.into_inner()
            )));
        }
    };
    if review.api_version != "admission.k8s.io/v1" {
        return Err(wrong_version(&review.api_version));
    }
    review
        .request
        .ok_or_else(|| invalid("malformed AdmissionReview: no request".into()))
}

/// For a provisioner being created without `machineOSURL`: its spec, so
/// the server can look the image up before [`decide`].
pub fn wants_image(req: &Request) -> Option<DPFHCPProvisionerSpec> {
    if req.kind.kind != "DPFHCPProvisioner" || req.operation != Operation::Create {
        return None;
    }
    let p: DPFHCPProvisionerSpec = typed(req.object.as_ref()?).ok()?;
    let set = p.machine_os_url.as_deref().is_some_and(|u| !u.is_empty());
    (!set && spec::check(&p).is_ok()).then_some(p)
}

/// The object's spec as `T`, borrowed from the parsed JSON (no copy); the
/// error names the field by its path.
fn typed<T: DeserializeOwned>(o: &Object) -> Result<T, String> {
    serde_path_to_error::deserialize(&o.spec).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        format!("{at}: {}", e.into_inner())
    })
}

pub fn decide(req: &Request, image: &ImageCheck) -> AdmissionResponse {
    let allowed = req.allowed();
    // Deletes and connects carry nothing to check.
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return allowed;
    }
    let Some(object) = req.object.as_ref() else {
        return allowed.deny("the request carries no object");
    };
    // The API server names the object's own namespace in the request; a
    // review that says otherwise was not written by it.
    if let (Some(said), Some(own)) = (
        req.namespace.as_deref(),
        object.metadata.namespace.as_deref(),
    ) {
        if !said.is_empty() && !own.is_empty() && said != own {
            return allowed.deny(format!(
                "the request's namespace {said:?} is not the object's {own:?}"
            ));
        }
    }
    // An update that leaves the spec as stored (metadata, finalizers,
    // labels, status) has nothing for the spec checks to say: refusing it
    // would keep an object stored before a check was tightened from ever
    // losing its finalizer, stuck deleting. That covers every update of a
    // deleting object except one that edits its spec, which is checked in
    // full, immutable fields included.
    if req.operation == Operation::Update
        && req
            .old_object
            .as_ref()
            .is_some_and(|old| old.spec == object.spec)
    {
        return allowed;
    }
    match req.kind.kind.as_str() {
        "DPFHCPProvisioner" => provisioner(req, object, image, allowed),
        "Infra" => infra(req, object, allowed),
        other => allowed.deny(format!("this webhook does not check {other} objects")),
    }
}

fn provisioner(
    req: &Request,
    object: &Object,
    image: &ImageCheck,
    allowed: AdmissionResponse,
) -> AdmissionResponse {
    let p: DPFHCPProvisionerSpec = match typed(object) {
        Ok(p) => p,
        Err(e) => return allowed.deny(format!("DPFHCPProvisioner: {e}")),
    };
    let mut errors: Vec<String> = match spec::check(&p) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    if req.operation == Operation::Update {
        // An old object that no longer parses cannot hold the new one back.
        if let Some(old) = req
            .old_object
            .as_ref()
            .and_then(|o| typed::<DPFHCPProvisionerSpec>(o).ok())
        {
            let was = spec::immutable_part(&old);
            errors.extend(
                spec::changed_immutable(&was, &p)
                    .iter()
                    .map(ToString::to_string),
            );
        }
    }
    if !errors.is_empty() {
        return allowed.deny(errors.join("; "));
    }
    match image {
        ImageCheck::Failed(e) if !e.transient() => allowed.deny(format!(
            "BlueField image for release {}: {}. Add the version to the ConfigMap ocp-bluefield-images (chart value dpf.blueFieldImages), push the image, or set spec.machineOSURL",
            p.ocp_release_image,
            e.public_message()
        )),
        ImageCheck::Failed(e) => {
            let mut r = allowed;
            r.warnings = Some(vec![format!(
                "the BlueField image could not be checked now ({}); the operator keeps trying and reports BlueFieldContainerImageAvailable",
                e.public_message()
            )]);
            r
        }
        ImageCheck::Unknown => {
            let mut r = allowed;
            r.warnings = Some(vec![
                "the BlueField image of this release is not known yet; the operator looks it up and reports BlueFieldContainerImageAvailable".into(),
            ]);
            r
        }
        ImageCheck::Found(_) | ImageCheck::NotAsked => allowed,
    }
}

fn infra(req: &Request, object: &Object, allowed: AdmissionResponse) -> AdmissionResponse {
    let i: InfraSpec = match typed(object) {
        Ok(i) => i,
        Err(e) => return allowed.deny(format!("Infra: {e}")),
    };
    let ns = object
        .metadata
        .namespace
        .clone()
        .or_else(|| req.namespace.clone())
        .unwrap_or_default();
    // What another object supplies is the controller's to check: a named
    // HostedCluster gives the name and domain, a named Service an address.
    let stand_in = i.hosted_cluster_ref.as_ref().map(|r| HostedClusterFacts {
        name: r.name.clone(),
        namespace: ns.clone(),
        base_domain: Some("hosted-cluster.invalid".into()),
        ..HostedClusterFacts::default()
    });
    let services =
        |_: &str, _: &str| ServiceAddress::ClusterIp(std::net::Ipv4Addr::new(192, 0, 2, 1));
    // A generated name is not known yet: its prefix and five characters,
    // as the API server makes it, are as long.
    let name = object
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| (!req.name.is_empty()).then(|| req.name.clone()))
        .or_else(|| {
            object
                .metadata
                .generate_name
                .as_ref()
                .map(|p| format!("{p}xxxxx"))
        })
        .unwrap_or_default();
    match validate::validate(&i, &name, &ns, stand_in.as_ref(), &services, &[]) {
        Ok(_) => allowed,
        Err(errors) => allowed.deny(errors.join("; ")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn review(kind: &str, op: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        let (group, resource) = if kind == "Infra" {
            ("hostedcluster.densityops.com", "infras")
        } else {
            ("provisioning.dpu.hcp.io", "dpfhcpprovisioners")
        };
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0d5c1f7e", "operation": op,
                "kind": {"group": group, "version": "v1alpha1", "kind": kind},
                "resource": {"group": group, "version": "v1alpha1", "resource": resource},
                "name": "x", "namespace": "ns",
                "userInfo": {"username": "someone"},
                "object": object, "oldObject": old, "dryRun": false,
            },
        }))
        .unwrap()
    }

    fn provisioner(spec: Value) -> Value {
        let mut base = json!({
            "dpuClusterRef": {"name": "dc", "namespace": "dpu"},
            "baseDomain": "clusters.example.com",
            "ocpReleaseImage": "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64",
            "sshKeySecretRef": {"name": "ssh"}, "pullSecretRef": {"name": "pull"},
            "virtualIP": "192.168.1.100",
            "controlPlaneAvailabilityPolicy": "HighlyAvailable",
        });
        for (k, v) in spec.as_object().unwrap() {
            base[k] = v.clone();
        }
        json!({"apiVersion": "provisioning.dpu.hcp.io/v1alpha1", "kind": "DPFHCPProvisioner",
               "metadata": {"name": "x", "namespace": "ns"}, "spec": base})
    }

    fn answer(body: &[u8], image: &ImageCheck) -> AdmissionResponse {
        let req = parse(body).unwrap();
        let r = decide(&req, image);
        assert_eq!(r.uid, "0d5c1f7e");
        r
    }

    #[test]
    fn a_good_provisioner_is_admitted_and_a_bad_one_denied_with_its_fields() {
        let ok = answer(
            &review("DPFHCPProvisioner", "CREATE", provisioner(json!({})), None),
            &ImageCheck::Found("i".into()),
        );
        assert!(ok.allowed, "{ok:?}");
        let bad = answer(
            &review(
                "DPFHCPProvisioner",
                "CREATE",
                provisioner(json!({"baseDomain": "not a domain", "virtualIP": "300.1.1.1"})),
                None,
            ),
            &ImageCheck::NotAsked,
        );
        assert!(!bad.allowed);
        assert!(
            bad.result.message.contains("spec.baseDomain")
                && bad.result.message.contains("spec.virtualIP"),
            "{}",
            bad.result.message
        );
        // A required field missing: named by its path.
        let mut missing = provisioner(json!({}));
        missing["spec"]
            .as_object_mut()
            .unwrap()
            .remove("dpuClusterRef");
        let r = answer(
            &review("DPFHCPProvisioner", "CREATE", missing, None),
            &ImageCheck::NotAsked,
        );
        assert!(
            !r.allowed && r.result.message.contains("dpuClusterRef"),
            "{}",
            r.result.message
        );
    }

    #[test]
    fn an_immutable_change_is_denied_and_a_mutable_one_admitted() {
        let old = provisioner(json!({}));
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                provisioner(json!({"baseDomain": "other.example.com"})),
                Some(old.clone()),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(
            !r.allowed && r.result.message.contains("baseDomain"),
            "{}",
            r.result.message
        );
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                provisioner(
                    json!({"ocpReleaseImage": "quay.io/openshift-release-dev/ocp-release:4.19.1-x86_64"}),
                ),
                Some(old),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(r.allowed, "{:?}", r.result);
    }

    #[test]
    fn a_missing_blue_field_image_is_denied_naming_release_and_sources() {
        let body = review("DPFHCPProvisioner", "CREATE", provisioner(json!({})), None);
        let req = parse(&body).unwrap();
        assert!(wants_image(&req).is_some());
        let missing = ImageCheck::Failed(LookupError::VersionNotFound {
            release: "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64".into(),
            version: "4.19.0".into(),
            searched: vec![
                "ConfigMap ops/ocp-bluefield-images key \"4.19.0\"".into(),
                "quay.io/x/bfb:4.19.0".into(),
            ],
        });
        let r = decide(&req, &missing);
        assert!(!r.allowed);
        for part in [
            "ocp-release:4.19.0-x86_64",
            "ocp-bluefield-images",
            "quay.io/x/bfb:4.19.0",
            "machineOSURL",
        ] {
            assert!(
                r.result.message.contains(part),
                "{part}: {}",
                r.result.message
            );
        }
        // A registry that cannot answer now does not hold the create back.
        let down = ImageCheck::Failed(LookupError::RegistryAccess {
            registry: "quay.io".into(),
            detail: "timeout".into(),
        });
        let r = decide(&req, &down);
        assert!(r.allowed && r.warnings.is_some());
        // machineOSURL: no lookup.
        let body = review(
            "DPFHCPProvisioner",
            "CREATE",
            provisioner(json!({"machineOSURL": "quay.io/x/os:1"})),
            None,
        );
        assert!(wants_image(&parse(&body).unwrap()).is_none());
    }

    #[test]
    fn infra_address_rules_are_checked() {
        let infra = |start: &str| {
            json!({
                "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
                "metadata": {"name": "x", "namespace": "ns"},
                "spec": {
                    "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"},
                    "infraComponents": {
                        "dhcp": {"enabled": true, "serverIP": "192.168.100.2", "rangeStart": start, "rangeEnd": "192.168.100.200"},
                        "dns": {"enabled": true, "serverIP": "192.168.100.3", "clusterName": "c", "baseDomain": "example.com"},
                        "proxy": {"enabled": true, "serverIP": "192.168.100.4"},
                    },
                },
            })
        };
        let ok = answer(
            &review("Infra", "CREATE", infra("192.168.100.10"), None),
            &ImageCheck::NotAsked,
        );
        assert!(ok.allowed, "{:?}", ok.result);
        let bad = answer(
            &review("Infra", "CREATE", infra("10.0.0.10"), None),
            &ImageCheck::NotAsked,
        );
        assert!(
            !bad.allowed && bad.result.message.contains("rangeStart"),
            "{}",
            bad.result.message
        );
    }

    #[test]
    fn replicas_are_checked_and_named_after_the_infra() {
        let infra = |meta: Value, replicas: i64| {
            json!({
                "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
                "metadata": meta,
                "spec": {
                    "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"},
                    "infraComponents": {"dns": {"serverIP": "192.168.100.3", "clusterName": "c", "baseDomain": "example.com", "replicas": replicas}},
                },
            })
        };
        let admit = |object: Value| {
            answer(
                &review("Infra", "CREATE", object, None),
                &ImageCheck::NotAsked,
            )
        };
        let ok = admit(infra(json!({"name": "x", "namespace": "ns"}), 2));
        assert!(ok.allowed, "{:?}", ok.result);
        let three = admit(infra(json!({"name": "x", "namespace": "ns"}), 3));
        assert!(
            !three.allowed
                && three
                    .result
                    .message
                    .contains("infraComponents.dns.replicas: 3"),
            "{}",
            three.result.message
        );
        // A generated name not made yet is judged at the length it will
        // have.
        let mut unnamed: Value = serde_json::from_slice(&review(
            "Infra",
            "CREATE",
            infra(
                json!({"generateName": format!("{}-", "g".repeat(44)), "namespace": "ns"}),
                2,
            ),
            None,
        ))
        .unwrap();
        unnamed["request"]["name"] = "".into();
        let long = answer(
            &serde_json::to_vec(&unnamed).unwrap(),
            &ImageCheck::NotAsked,
        );
        assert!(
            !long.allowed
                && long
                    .result
                    .message
                    .contains("too long for two dns replicas"),
            "{}",
            long.result.message
        );
    }

    /// `object` with `metadata` fields set: finalizers, deletionTimestamp.
    fn with_meta(mut object: Value, meta: Value) -> Value {
        for (k, v) in meta.as_object().unwrap() {
            object["metadata"][k] = v.clone();
        }
        object
    }

    #[test]
    fn updates_that_leave_the_spec_alone_are_admitted_even_when_it_no_longer_passes() {
        // Stored before a check was tightened: it would be denied today.
        let stale = provisioner(json!({"baseDomain": "not a domain"}));
        let finalizer = json!({"finalizers": ["provisioning.dpu.hcp.io/finalizer"]});
        let deleting = json!({"finalizers": [], "deletionTimestamp": "2025-01-01T00:00:00Z"});
        let old = with_meta(stale.clone(), finalizer.clone());
        // The operator's finalizer-only patch while the object is deleted.
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                with_meta(stale.clone(), deleting.clone()),
                Some(with_meta(
                    stale.clone(),
                    json!({"finalizers": ["provisioning.dpu.hcp.io/finalizer"], "deletionTimestamp": "2025-01-01T00:00:00Z"}),
                )),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(r.allowed, "{:?}", r.result);
        // A label, not being deleted: the spec is not the change.
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                with_meta(stale.clone(), json!({"labels": {"a": "b"}})),
                Some(old.clone()),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(r.allowed, "{:?}", r.result);
        // A spec change is checked in full, deleting or not: the stale
        // field and an immutable one are both named.
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                with_meta(
                    provisioner(
                        json!({"baseDomain": "not a domain", "virtualIP": "192.168.1.101"}),
                    ),
                    deleting,
                ),
                Some(old),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(
            !r.allowed && r.result.message.contains("spec.baseDomain"),
            "{:?}",
            r.result
        );
        let r = answer(
            &review(
                "DPFHCPProvisioner",
                "UPDATE",
                provisioner(json!({"dpuClusterRef": {"name": "other", "namespace": "dpu"}})),
                Some(with_meta(
                    provisioner(json!({})),
                    json!({"deletionTimestamp": "2025-01-01T00:00:00Z"}),
                )),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(
            !r.allowed && r.result.message.contains("dpuClusterRef"),
            "{:?}",
            r.result
        );
        // Infra: the same rule.
        let infra = json!({
            "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
            "metadata": {"name": "x", "namespace": "ns", "finalizers": ["f"]},
            "spec": {"networkConfig": {"cidr": "not a cidr", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"}},
        });
        let r = answer(
            &review(
                "Infra",
                "UPDATE",
                with_meta(infra.clone(), json!({"finalizers": []})),
                Some(infra),
            ),
            &ImageCheck::NotAsked,
        );
        assert!(r.allowed, "{:?}", r.result);
    }

    #[test]
    fn a_review_whose_namespace_is_not_its_objects_is_denied() {
        let mut object = provisioner(json!({}));
        object["metadata"]["namespace"] = json!("tenant-a");
        let mut body: Value =
            serde_json::from_slice(&review("DPFHCPProvisioner", "CREATE", object, None)).unwrap();
        body["request"]["namespace"] = json!("kube-system");
        let r = answer(&serde_json::to_vec(&body).unwrap(), &ImageCheck::NotAsked);
        assert!(!r.allowed);
        assert!(
            r.result.message.contains("kube-system"),
            "{}",
            r.result.message
        );
    }

    #[test]
    fn malformed_reviews_get_a_clear_error() {
        for (body, says) in [
            (b"not json".to_vec(), "malformed AdmissionReview"),
            (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), "no request"),
            (br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#.to_vec(), "admission.k8s.io/v1"),
        ] {
            let r = parse(&body).unwrap_err();
            assert!(!r.allowed && r.result.message.contains(says), "{}", r.result.message);
        }
        let r = answer(
            &review(
                "Pod",
                "CREATE",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
                None,
            ),
            &ImageCheck::NotAsked,
        );
        assert!(!r.allowed);
        let r = answer(
            &review("Infra", "DELETE", Value::Null, None),
            &ImageCheck::NotAsked,
        );
        assert!(r.allowed);
    }
}
