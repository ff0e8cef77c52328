//! The validating admission webhook against a real API server: the chart's
//! ValidatingWebhookConfiguration, registered by `clientConfig.url` on
//! loopback (1.20 cannot reach Services here) with the test's CA, and the
//! real `causeway operator` serving it from a certificate directory. The
//! BlueField lookup asks a real registry (Debian's docker-registry) on
//! loopback; without it that case prints SKIP.
//!
//! Needs root (see operator_kube.rs); without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use causeway_operator::dpf::crd::DPFHCPProvisioner;
use causeway_operator::infra::crd::Infra;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use kube_cluster::{
    admin, apply_yaml, ensure_namespace, eventually, helm_template, Operator, RELEASE,
};
use serde_json::{json, Value};

const SAMPLE: &str = include_str!("fixtures/dpfhcp-sample.yaml");
const NS: &str = "webhook-test";
const WAIT: Duration = Duration::from_secs(60);
const SSH_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGb3J3yRzq0k1Jq8F6c1bq6Xq0v4cX1mZq1k2l3m4n5o dpu@example\n";

struct Pki {
    ca_pem: String,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "webhook test CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = params.self_signed(&ca_key).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        ca_cert,
        ca_key,
    }
}

/// A serving certificate for 127.0.0.1, valid or long expired, written as
/// the webhook reads it: tls.crt and tls.key, each replaced by a rename.
fn write_cert(pki: &Pki, dir: &Path, expired: bool) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let cert = params.signed_by(&key, &pki.ca_cert, &pki.ca_key).unwrap();
    for (name, text) in [("tls.key", key.serialize_pem()), ("tls.crt", cert.pem())] {
        let tmp = dir.join(format!(".{name}"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }
}

/// A registry with no authentication on loopback, or `None` (SKIP).
struct Registry {
    child: Child,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry(dir: &Path) -> Option<Registry> {
    let bin = Path::new("/usr/bin/docker-registry");
    if !bin.exists() {
        eprintln!("SKIP webhook_kube (BlueField case): no {} (apt-get install docker-registry; tests/run.sh does)", bin.display());
        return None;
    }
    let port = crate::support::reserved_port();
    std::fs::write(
        dir.join("registry.yml"),
        format!(
            "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("registry").display()
        ),
    )
    .unwrap();
    let child = Command::new(bin)
        .arg("serve")
        .arg(dir.join("registry.yml"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the registry did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Registry { child, port })
}

/// The chart's ValidatingWebhookConfiguration, pointed at `url` with `ca`.
fn chart_configuration(helm: &Path, url: &str, ca: &str) -> Value {
    let rendered = helm_template(helm, RELEASE, &[]);
    let mut vwc: Value = rendered
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("the chart renders a ValidatingWebhookConfiguration");
    for hook in vwc["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"] =
            json!({"url": url, "caBundle": k8s_openapi::ByteString(ca.as_bytes().to_vec())});
    }
    vwc
}

fn provisioner(name: &str, spec: Value) -> String {
    let mut doc: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    doc["metadata"] = json!({"name": name, "namespace": NS});
    for (k, v) in spec.as_object().unwrap() {
        doc["spec"][k] = v.clone();
    }
    serde_json::to_string(&doc).unwrap()
}

async fn create(client: &Client, doc: &str) -> Result<(), String> {
    apply_yaml(client, doc, NS).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_webhook_admits_good_objects_and_denies_bad_ones_with_a_reloaded_certificate() {
    let test =
        "the_charts_webhook_admits_good_objects_and_denies_bad_ones_with_a_reloaded_certificate";
    let Some(c) = kube_cluster::own_cluster("webhook_kube", test) else {
        return;
    };
    let client = admin(c).await;
    ensure_namespace(&client, NS).await;
    // The kinds the DPF controller reads before it looks a release up.
    kube_cluster::dpf_management_cluster(&client, &[NS], false).await;
    for (name, key, value) in [
        ("pull", ".dockerconfigjson", br#"{"auths":{}}"#.as_slice()),
        ("ssh", "id_rsa.pub", SSH_KEY.as_bytes()),
    ] {
        let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": {key: k8s_openapi::ByteString(value.to_vec())}});
        apply_yaml(&client, &serde_json::to_string(&body).unwrap(), NS)
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    kube_cluster::blue_field_images(
        &client,
        &[("4.19.0-ec.5", "quay.io/example/rhcos-bfb:4.19.0-ec.5")],
    )
    .await;
    if let Some(r) = &reg {
        Api::<causeway_operator::dpf::crd::DPFHCPProvisionerConfig>::all(client.clone())
            .patch(
                "default",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"blueFieldOCPLayerRepo": format!("127.0.0.1:{}/org/rhcos-bfb", r.port)}})),
            )
            .await
            .unwrap();
    }

    let pki = pki();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    write_cert(&pki, &certs, true);
    let port = crate::support::reserved_port();
    let mut op = Operator::start(
        c,
        &[NS],
        &[
            "--leader-election=false",
            "--webhook-listen",
            &format!("127.0.0.1:{port}"),
            "--webhook-cert-dir",
            certs.to_str().unwrap(),
            // The test's registry is on loopback.
            "--bluefield-allow-loopback-registries=true",
        ],
        "webhook",
    );
    eventually("the webhook listening", WAIT, Some(&op), || async {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    })
    .await;
    // Stored before the webhook is asked, as by a release without one or
    // before a check was tightened: a VIP that no longer passes, and a
    // finalizer that keeps it while being deleted.
    let provisioners: Api<DPFHCPProvisioner> = Api::namespaced(client.clone(), NS);
    let _ = provisioners.delete("stale", &Default::default()).await;
    let mut stale: Value = serde_json::from_str(&provisioner(
        "stale",
        json!({"pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}, "virtualIP": "300.0.0.1"}),
    ))
    .unwrap();
    stale["metadata"]["finalizers"] = json!(["test.causeway.io/hold"]);
    let stale = serde_json::to_string(&stale).unwrap();
    eventually("the stale provisioner stored", WAIT, Some(&op), || async {
        create(&client, &stale).await.ok()
    })
    .await;
    let vwc = chart_configuration(
        &c.helm,
        &format!("https://127.0.0.1:{port}/validate"),
        &pki.ca_pem,
    );
    apply_yaml(&client, &serde_json::to_string(&vwc).unwrap(), "default")
        .await
        .unwrap();

    println!("scenario: the webhook serves an expired certificate: nothing is admitted (failurePolicy Fail)");
    let spec = json!({"pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}});
    let good = provisioner("good", spec.clone());
    // The API server takes a moment to put a new webhook configuration in
    // force; until then a create is admitted without asking. A probe
    // object finds that moment (and is removed if it got in first), so
    // the object under test is only sent once the webhook is asked.
    let probe = provisioner("probe", spec);
    let refused = eventually(
        "a create refused for the expired certificate",
        WAIT,
        Some(&op),
        || async {
            match create(&client, &probe).await {
                Ok(()) => {
                    let _ = provisioners.delete("probe", &Default::default()).await;
                    None
                }
                Err(e) => Some(e).filter(|e| e.contains("x509") || e.contains("certificate")),
            }
        },
    )
    .await;
    assert!(refused.contains("failed calling webhook"), "{refused}");
    let err = create(&client, &good).await.unwrap_err();
    assert!(err.contains("failed calling webhook"), "{err}");
    assert!(provisioners.get_opt("good").await.unwrap().is_none());

    println!("scenario: a valid certificate replaces it on disk; no restart");
    write_cert(&pki, &certs, false);
    eventually("the good provisioner admitted", WAIT, Some(&op), || async {
        create(&client, &good).await.ok()
    })
    .await;
    assert!(op.log_text().contains("serving certificate reloaded"));

    println!("scenario: an immutable field changed (1.20 has no CEL: the webhook holds it)");
    let changed = provisioner(
        "good",
        json!({"pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}, "baseDomain": "elsewhere.example.com"}),
    );
    let e = create(&client, &changed).await.unwrap_err();
    assert!(e.contains("baseDomain") && e.contains("denied"), "{e}");
    assert_eq!(
        provisioners.get("good").await.unwrap().spec.base_domain,
        "clusters.example.com"
    );
    // A mutable field still changes.
    let mutable = provisioner(
        "good",
        json!({"pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}, "ocpReleaseImage": "quay.io/openshift-release-dev/ocp-release:4.19.0-ec.5-multi"}),
    );
    create(&client, &mutable).await.unwrap();

    println!("scenario: required fields and spec rules");
    let e = create(
        &client,
        &provisioner("bad-vip", json!({"virtualIP": "300.0.0.1"})),
    )
    .await
    .unwrap_err();
    assert!(e.contains("spec.virtualIP"), "{e}");

    println!("scenario: a bad Infra address");
    let infra = json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
        "metadata": {"name": "vlan", "namespace": NS},
        "spec": {
            "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"},
            "infraComponents": {"dhcp": {"enabled": true, "serverIP": "192.168.100.2", "rangeStart": "10.0.0.10", "rangeEnd": "192.168.100.200"}},
        },
    });
    let e = create(&client, &serde_json::to_string(&infra).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("rangeStart"), "{e}");
    assert!(Api::<Infra>::namespaced(client.clone(), NS)
        .get_opt("vlan")
        .await
        .unwrap()
        .is_none());

    println!("scenario: a malformed AdmissionReview gets a clear answer");
    std::fs::write(dir.path().join("ca.pem"), &pki.ca_pem).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(dir.path().join("ca.pem"))
        .args(["-H", "Content-Type: application/json", "-d", "{not json"])
        .arg(format!("https://127.0.0.1:{port}/validate"))
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(answer["response"]["allowed"], json!(false));
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed AdmissionReview"),
        "{answer}"
    );

    println!("scenario: a fabricated review naming another namespace's Secret and a registry inside the cluster causes no Secret read and no connection, and echoes nothing");
    // Where the review says the registry is: a listener of the test's that
    // counts who connects (loopback registries are allowed in this test).
    let inside = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let inside_port = inside.local_addr().unwrap().port();
    inside.set_nonblocking(true).unwrap();
    let mut forged: Value = serde_saphyr::from_str(SAMPLE).unwrap();
    forged["metadata"] = json!({"name": "forged", "namespace": "kube-system"});
    forged["spec"]["ocpReleaseImage"] = json!(format!(
        "127.0.0.1:{inside_port}/ocp/release@sha256:{}",
        "ab".repeat(32)
    ));
    forged["spec"]["pullSecretRef"] = json!({"name": "bootstrap-token-abcdef"});
    forged["spec"]
        .as_object_mut()
        .unwrap()
        .remove("machineOSURL");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1", "operation": "CREATE",
            "kind": {"group": "provisioning.dpu.hcp.io", "version": "v1alpha1", "kind": "DPFHCPProvisioner"},
            "resource": {"group": "provisioning.dpu.hcp.io", "version": "v1alpha1", "resource": "dpfhcpprovisioners"},
            "name": "forged", "namespace": "kube-system",
            "userInfo": {"username": "system:admin"},
            "object": forged,
        },
    });
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(dir.path().join("ca.pem"))
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(review.to_string())
        .arg(format!("https://127.0.0.1:{port}/validate"))
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    let mut connected = 0;
    while inside.accept().is_ok() {
        connected += 1;
    }
    println!("forged review answered {answer}; connections to the named registry: {connected}");
    assert_eq!(
        connected, 0,
        "the webhook connected to the registry a forged review named: {answer}"
    );
    let said = answer.to_string();
    for leak in [
        "bootstrap-token",
        "connect",
        "refused",
        "timed out",
        "within",
    ] {
        assert!(!said.contains(leak), "the answer echoes {leak:?}: {said}");
    }

    println!(
        "scenario: forty clients send 3 MiB bodies at once: the operator's memory stays bounded"
    );
    // Below the 4 MiB body cap, so each is read; together far over the
    // 16 MiB allowed in flight, so most wait for room (or time out).
    let big = dir.path().join("big.json");
    let pad = "A".repeat(3 << 20);
    std::fs::write(
        &big,
        format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"big","pad":"{pad}"}}}}"#),
    )
    .unwrap();
    let pid = op.child.id();
    let rss_kib = || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let before = rss_kib();
    let mut senders: Vec<Child> = (0..40)
        .map(|_| {
            Command::new("curl")
                .args([
                    "-sS",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}\n",
                    "--max-time",
                    "30",
                ])
                .args(["--limit-rate", "1M", "--cacert"])
                .arg(dir.path().join("ca.pem"))
                .args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", big.display()))
                .arg(format!("https://127.0.0.1:{port}/validate"))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // Sampled while the bodies arrive, until every sender is done (each
    // is bounded by --max-time).
    let mut peak = before;
    let deadline = Instant::now() + Duration::from_secs(40);
    while senders.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        assert!(
            Instant::now() < deadline,
            "curl senders still running after 40 s"
        );
        peak = peak.max(rss_kib());
        std::thread::sleep(Duration::from_millis(20));
    }
    let codes: Vec<String> = senders
        .into_iter()
        .map(|c| {
            String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout)
                .trim()
                .to_string()
        })
        .collect();
    let answered = codes.iter().filter(|c| *c == "200").count();
    println!(
        "webhook VmRSS {before} KiB before, {peak} KiB at most under 40 concurrent 3 MiB bodies (+{} KiB); {answered} answered, others {:?}",
        peak - before,
        codes.iter().filter(|c| *c != "200").collect::<Vec<_>>()
    );
    assert!(answered > 0, "no body was answered: {codes:?}");
    // 16 MiB of bodies in flight, parsed in place, plus TLS and HTTP
    // buffers per connection: 40 bodies held at once would be 120 MiB.
    assert!(
        peak - before < 48 << 10,
        "VmRSS rose {} KiB under 40 concurrent 3 MiB bodies",
        peak - before
    );
    assert!(op.child.try_wait().unwrap().is_none(), "the operator died");

    if let Some(_reg) = reg {
        println!("scenario: a release not looked up yet is admitted with a warning; once the controller has looked it up and found no BlueField image, a create of it is denied, naming the release and the sources");
        let release = "quay.io/openshift-release-dev/ocp-release:4.20.3-x86_64";
        create(
            &client,
            &provisioner("no-image", json!({"ocpReleaseImage": release, "pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}})),
        )
        .await
        .expect("a release the webhook cannot know yet is admitted");
        // The controller looks the release up as it reconciles the stored
        // object; a dry-run create of the same release (nothing is
        // stored) is denied once the webhook knows the answer.
        let again: DPFHCPProvisioner = serde_json::from_str(&provisioner(
            "no-image-2",
            json!({"ocpReleaseImage": release, "pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}}),
        ))
        .unwrap();
        let dry_run = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        let e = eventually(
            "a create of the looked-up release denied",
            WAIT,
            Some(&op),
            || async {
                match provisioners.create(&dry_run, &again).await {
                    Err(kube::Error::Api(s)) => Some(s.message),
                    _ => None,
                }
            },
        )
        .await;
        for part in [
            "ocp-release:4.20.3-x86_64",
            "ocp-bluefield-images",
            "org/rhcos-bfb:4.20.3",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        assert!(provisioners.get_opt("no-image-2").await.unwrap().is_none());
        provisioners
            .patch(
                "no-image",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap();
        provisioners
            .delete("no-image", &Default::default())
            .await
            .unwrap();
    }

    println!("scenario: a provisioner stored with a spec the webhook now refuses loses its finalizer and is deleted");
    let e = create(
        &client,
        &provisioner(
            "stale",
            json!({"pullSecretRef": {"name": "pull"}, "sshKeySecretRef": {"name": "ssh"}, "virtualIP": "300.0.0.2"}),
        ),
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("spec.virtualIP"),
        "a spec change is still checked: {e}"
    );
    provisioners
        .delete("stale", &Default::default())
        .await
        .unwrap();
    let deleting = provisioners.get("stale").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    provisioners
        .patch(
            "stale",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("the stale provisioner gone", WAIT, Some(&op), || async {
        provisioners
            .get_opt("stale")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;

    println!("scenario: the self-signed certificate source keeps its Secret and the configuration's caBundle");
    use causeway_operator::webhook::selfsigned;
    let names = selfsigned::Names {
        namespace: kube_cluster::RELEASE_NAMESPACE.into(),
        secret: "causeway-webhook-ca".into(),
        service: "causeway-webhook".into(),
        configuration: "causeway".into(),
        extra_sans: Vec::new(),
    };
    let timing = selfsigned::Timing::default();
    let out = dir.path().join("self-signed");
    std::fs::create_dir(&out).unwrap();
    selfsigned::ensure(&client, &names, &out, &timing)
        .await
        .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), kube_cluster::RELEASE_NAMESPACE);
    let made = secrets.get("causeway-webhook-ca").await.unwrap();
    let ca = made.data.as_ref().unwrap()["ca.crt"].0.clone();
    let vwc =
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
            client.clone(),
        )
        .get("causeway")
        .await
        .unwrap();
    for hook in vwc.webhooks.unwrap() {
        assert_eq!(
            hook.client_config.ca_bundle.map(|b| b.0),
            Some(ca.clone()),
            "{}",
            hook.name
        );
    }
    assert_eq!(
        std::fs::read(out.join("tls.crt")).unwrap(),
        made.data.as_ref().unwrap()["tls.crt"].0
    );
    // Still good: nothing is made again.
    selfsigned::ensure(&client, &names, &out, &timing)
        .await
        .unwrap();
    assert_eq!(
        secrets
            .get("causeway-webhook-ca")
            .await
            .unwrap()
            .metadata
            .resource_version,
        made.metadata.resource_version
    );
}
