//! What the validating webhook answers, as pure functions of the
//! AdmissionReview (and, for a new provisioner, the BlueField lookup's
//! outcome, fetched by the server before it asks).
//!
//! DPFHCPProvisioner: the spec's own checks, the immutable fields against
//! the old object (the CRD's CEL rules, for servers that lack CEL), and on
//! create the BlueField image. Infra: the fields and address rules the
//! controller's validation applies, those that need no other object.

use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::DynamicObject;
use serde::de::DeserializeOwned;

use crate::crd::Infra;
use crate::dpf::bluefield::LookupError;
use crate::dpf::crd::DPFHCPProvisioner;
use crate::dpf::spec;
use crate::validate::{self, HostedClusterFacts, ServiceAddress};

/// The BlueField lookup's outcome for a provisioner being created.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageCheck {
    /// Not a create of a provisioner that needs one.
    NotAsked,
    Found(String),
    Failed(LookupError),
}

/// A parsed request, or the response that says why it could not be read.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Box<AdmissionResponse>> {
    let invalid = |why: String| Box::new(AdmissionResponse::invalid(why));
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| invalid(format!("malformed AdmissionReview: not JSON: {e}")))?;
    let version = value["apiVersion"].as_str().unwrap_or_default();
    if version != "admission.k8s.io/v1" {
        return Err(invalid(format!(
            "AdmissionReview apiVersion {version:?} is not admission.k8s.io/v1, the only version this webhook speaks"
        )));
    }
    let review: AdmissionReview<DynamicObject> =
        serde_path_to_error::deserialize(value).map_err(|e| {
            invalid(format!(
                "malformed AdmissionReview: {}: {}",
                e.path(),
                e.inner()
            ))
        })?;
    review
        .try_into()
        .map_err(|_| invalid("malformed AdmissionReview: no request".into()))
}

/// For a provisioner being created without `machineOSURL`: its spec, so
/// the server can look the image up before [`decide`].
pub fn wants_image(req: &AdmissionRequest<DynamicObject>) -> Option<DPFHCPProvisioner> {
    if req.kind.kind != "DPFHCPProvisioner" || req.operation != Operation::Create {
        return None;
    }
    let p: DPFHCPProvisioner = typed(req.object.as_ref()?).ok()?;
    let set = p
        .spec
        .machine_os_url
        .as_deref()
        .is_some_and(|u| !u.is_empty());
    (!set && spec::check(&p.spec).is_ok()).then_some(p)
}

fn typed<T: DeserializeOwned>(o: &DynamicObject) -> Result<T, String> {
    let value = serde_json::to_value(o).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })
}

pub fn decide(req: &AdmissionRequest<DynamicObject>, image: &ImageCheck) -> AdmissionResponse {
    let allowed = AdmissionResponse::from(req);
    // Deletes and connects carry nothing to check.
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return allowed;
    }
    let Some(object) = req.object.as_ref() else {
        return allowed.deny("the request carries no object");
    };
    match req.kind.kind.as_str() {
        "DPFHCPProvisioner" => provisioner(req, object, image, allowed),
        "Infra" => infra(object, allowed),
        other => allowed.deny(format!("this webhook does not check {other} objects")),
    }
}

fn provisioner(
    req: &AdmissionRequest<DynamicObject>,
    object: &DynamicObject,
    image: &ImageCheck,
    allowed: AdmissionResponse,
) -> AdmissionResponse {
    let p: DPFHCPProvisioner = match typed(object) {
        Ok(p) => p,
        Err(e) => return allowed.deny(format!("DPFHCPProvisioner: {e}")),
    };
    let mut errors: Vec<String> = match spec::check(&p.spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    if req.operation == Operation::Update {
        // An old object that no longer parses cannot hold the new one back.
        if let Some(old) = req
            .old_object
            .as_ref()
            .and_then(|o| typed::<DPFHCPProvisioner>(o).ok())
        {
            let was = spec::immutable_part(&old.spec);
            errors.extend(
                spec::changed_immutable(&was, &p.spec)
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
            "BlueField image for release {}: {e}. Add the version to the ConfigMap ocp-bluefield-images (chart value dpf.blueFieldImages), push the image, or set spec.machineOSURL",
            p.spec.ocp_release_image
        )),
        ImageCheck::Failed(e) => {
            let mut r = allowed;
            r.warnings = Some(vec![format!(
                "the BlueField image could not be checked now ({e}); the operator keeps trying and reports BlueFieldContainerImageAvailable"
            )]);
            r
        }
        ImageCheck::Found(_) | ImageCheck::NotAsked => allowed,
    }
}

fn infra(object: &DynamicObject, allowed: AdmissionResponse) -> AdmissionResponse {
    let i: Infra = match typed(object) {
        Ok(i) => i,
        Err(e) => return allowed.deny(format!("Infra: {e}")),
    };
    let ns = object.metadata.namespace.clone().unwrap_or_default();
    // What another object supplies is the controller's to check: a named
    // HostedCluster gives the name and domain, a named Service an address.
    let stand_in = i
        .spec
        .hosted_cluster_ref
        .as_ref()
        .map(|r| HostedClusterFacts {
            name: r.name.clone(),
            namespace: ns.clone(),
            base_domain: Some("hosted-cluster.invalid".into()),
        });
    let services =
        |_: &str, _: &str| ServiceAddress::ClusterIp(std::net::Ipv4Addr::new(192, 0, 2, 1));
    match validate::validate(&i.spec, &ns, stand_in.as_ref(), &services) {
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
