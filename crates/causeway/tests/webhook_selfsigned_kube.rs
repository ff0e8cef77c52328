//! The webhook's self-signed CA rotating under two operator replicas,
//! against a real API server: every admission keeps working before, during
//! and after, while the replicas serve leaves of different CAs.
//!
//! A test binary of its own: its webhook configuration intercepts Infra
//! creates cluster-wide, which the tests of webhook_kube.rs (sharing one
//! cluster per binary) must not meet, nor it theirs.
//!
//! 1.20 cannot reach Services here, so the configuration names the
//! replicas by URL on 127.0.0.1 and the certificate carries that address
//! (a hidden test-only flag). One URL cannot name two replicas, so the
//! configuration has two webhooks with the chart's Infra rules, one per
//! replica: every admission goes through both.
//!
//! Needs root (see operator_kube.rs); without it the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use causeway_operator::infra::crd::Infra;
use causeway_operator::webhook::selfsigned;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_cluster::{admin, apply_yaml, eventually, helm_template, Operator, RELEASE_NAMESPACE};
use serde_json::{json, Value};

/// A release of the chart in self-signed mode: its ServiceAccount has the
/// Secret and configuration rights that mode grants, and no more.
const RELEASE: &str = "causeway-rotation";
const NS: &str = "selfsigned-rotation";
const WAIT: Duration = Duration::from_secs(90);

/// Each replica's certificate directory and port.
struct Replica {
    op: Operator,
    dir: tempfile::TempDir,
    port: u16,
}

fn start(
    c: &kube_cluster::SharedCluster,
    kubeconfig: &Path,
    name: &str,
    port: u16,
    check: u64,
) -> Replica {
    let dir = tempfile::tempdir().unwrap();
    let op = Operator::start_with_kubeconfig(
        c,
        kubeconfig,
        // Watches a namespace with nothing in it: admission is the point.
        &["selfsigned-idle"],
        &[
            "--leader-election=false",
            "--webhook-listen",
            &format!("127.0.0.1:{port}"),
            "--webhook-cert-dir",
            dir.path().to_str().unwrap(),
            "--webhook-self-signed-secret",
            &format!("{RELEASE}-webhook-ca"),
            "--webhook-service",
            &format!("{RELEASE}-webhook"),
            "--webhook-configuration",
            RELEASE,
            "--webhook-self-signed-extra-sans",
            "127.0.0.1",
            "--webhook-self-signed-check-seconds",
            &check.to_string(),
        ],
        name,
    );
    Replica { op, dir, port }
}

/// The DER of each certificate in a PEM text.
fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(Result::ok)
        .map(|p| p.contents)
        .collect()
}

/// Whether the leaf in `leaf_pem` is signed by the CA in `ca_pem`.
fn signed_by(leaf_pem: &[u8], ca_pem: &[u8]) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        x509_parser::pem::parse_x509_pem(leaf_pem),
        x509_parser::pem::parse_x509_pem(ca_pem),
    ) else {
        return false;
    };
    let (Ok(leaf), Ok(ca)) = (leaf.parse_x509(), ca.parse_x509()) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

fn infra(range_start: &str) -> Infra {
    serde_json::from_value(json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
        "metadata": {"name": "probe", "namespace": NS},
        "spec": {
            "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1", "networkAttachmentDefinition": "vlan"},
            "infraComponents": {"dhcp": {"enabled": true, "serverIP": "192.168.100.2", "rangeStart": range_start, "rangeEnd": "192.168.100.200"}},
        },
    }))
    .unwrap()
}

/// One admission round through both replicas, as dry runs (nothing is
/// stored): a good Infra admitted, a bad one denied by the webhook's own
/// check. A TLS failure fails both ("failed calling webhook").
async fn round(infras: &Api<Infra>) -> Result<(), String> {
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    infras
        .create(&dry, &infra("192.168.100.10"))
        .await
        .map_err(|e| format!("good Infra: {e}"))?;
    match infras.create(&dry, &infra("10.0.0.10")).await {
        Ok(_) => Err("bad Infra admitted: the webhooks were not asked".into()),
        Err(e) if e.to_string().contains("rangeStart") => Ok(()),
        Err(e) => Err(format!("bad Infra: {e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_rotation_with_two_replicas_keeps_every_admission_working() {
    let test = "a_self_signed_rotation_with_two_replicas_keeps_every_admission_working";
    let Some(c) = kube_cluster::own_cluster("webhook_selfsigned_kube", test) else {
        return;
    };
    let client = admin(c).await;
    kube_cluster::install_release(
        &client,
        &c.helm,
        RELEASE,
        &["webhook.certSource=self-signed"],
    )
    .await
    .unwrap();
    let token = kube_cluster::token_for(&client, RELEASE_NAMESPACE, RELEASE).await;
    let kubeconfig = c.dir.join("rotation.kubeconfig");
    kube_cluster::write_kubeconfig(c, &kubeconfig, &token);
    kube_cluster::ensure_namespace(&client, "selfsigned-idle").await;
    kube_cluster::ensure_namespace(&client, NS).await;
    // Only this namespace's objects meet these webhooks (1.20 has no
    // automatic name label).
    Api::<Namespace>::all(client.clone())
        .patch(
            NS,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"causeway-test/rotation": "true"}}})),
        )
        .await
        .unwrap();

    println!(
        "scenario: the Secret holds a CA with 100 days left, the configuration trusts it alone"
    );
    let names = selfsigned::Names {
        namespace: RELEASE_NAMESPACE.into(),
        secret: format!("{RELEASE}-webhook-ca"),
        service: format!("{RELEASE}-webhook"),
        configuration: RELEASE.into(),
        extra_sans: vec!["127.0.0.1".into()],
    };
    let old = selfsigned::generate_with(&names, k8s_openapi::jiff::Timestamp::now(), 100).unwrap();
    let old_ca = old[selfsigned::CA_CRT].0.clone();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let _ = secrets.delete(&names.secret, &Default::default()).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": names.secret, "namespace": RELEASE_NAMESPACE}, "data": old});
    apply_yaml(
        &client,
        &serde_json::to_string(&secret).unwrap(),
        RELEASE_NAMESPACE,
    )
    .await
    .unwrap();

    let (port_a, port_b) = (
        crate::support::reserved_port(),
        crate::support::reserved_port(),
    );
    let rendered = helm_template(&c.helm, RELEASE, &["webhook.certSource=self-signed"]);
    let mut vwc: Value = rendered
        .split("\n---")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("the chart renders a ValidatingWebhookConfiguration");
    let hook = vwc["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "infras.causeway.io")
        .unwrap()
        .clone();
    let per_replica = |port: u16, prefix: &str| {
        let mut h = hook.clone();
        h["name"] = json!(format!("{prefix}.infras.causeway.io"));
        h["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}/validate"),
            "caBundle": ByteString(old_ca.clone())});
        h["namespaceSelector"] = json!({"matchLabels": {"causeway-test/rotation": "true"}});
        h["failurePolicy"] = json!("Fail");
        h
    };
    vwc["webhooks"] = json!([
        per_replica(port_a, "replica-a"),
        per_replica(port_b, "replica-b")
    ]);
    apply_yaml(&client, &serde_json::to_string(&vwc).unwrap(), "default")
        .await
        .unwrap();

    // A checks every 2 s, so it stages and then promotes the successor
    // within seconds; B reads the Secret only every 40 s, so it goes on
    // serving the old CA's leaf for a good while after A has switched.
    let a = start(c, &kubeconfig, "rotation-a", port_a, 2);
    let b = start(c, &kubeconfig, "rotation-b", port_b, 40);
    for r in [&a, &b] {
        eventually("the replica listening", WAIT, Some(&r.op), || async {
            std::net::TcpStream::connect(("127.0.0.1", r.port))
                .ok()
                .map(|_| ())
        })
        .await;
    }

    // The configuration takes a moment to be in force: the bad Infra is
    // admitted until then. From the first round both webhooks answer, every
    // round must succeed.
    let infras: Api<Infra> = Api::namespaced(client.clone(), NS);
    eventually("both webhooks asked", WAIT, Some(&a.op), || async {
        round(&infras).await.ok()
    })
    .await;

    // Admissions run without a pause from here to the end; every failure
    // is kept with the moment it happened.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let admissions = {
        let (stop, ok, failures, infras) =
            (stop.clone(), ok.clone(), failures.clone(), infras.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match round(&infras).await {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
            }
        })
    };
    let bundles = || async {
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .get(RELEASE)
            .await
            .unwrap()
            .webhooks
            .unwrap()
            .into_iter()
            .map(|w| w.client_config.ca_bundle.map(|b| b.0).unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let read = |r: &Replica| std::fs::read(r.dir.path().join("tls.crt")).unwrap_or_default();
    let before = ok.load(Ordering::Relaxed);

    println!("scenario: A promotes the new CA while B still serves the old CA's leaf");
    let new_ca = eventually(
        "A serving a leaf of a new CA",
        WAIT,
        Some(&a.op),
        || async {
            let s = secrets.get(&names.secret).await.ok()?;
            let ca = s.data?.get(selfsigned::CA_CRT)?.0.clone();
            (ca != old_ca && signed_by(&read(&a), &ca)).then_some(ca)
        },
    )
    .await;
    assert!(
        signed_by(&read(&b), &old_ca),
        "B switched already: its check interval did not hold it back"
    );
    for bundle in bundles().await {
        let have = ders(&bundle);
        assert!(
            have.contains(&ders(&old_ca)[0]),
            "the old CA left the bundle too early"
        );
        assert!(
            have.contains(&ders(&new_ca)[0]),
            "the new CA is not in the bundle"
        );
    }
    // Admissions go on through both while they serve different CAs.
    let during = ok.load(Ordering::Relaxed);
    eventually(
        "admissions during the overlap",
        WAIT,
        Some(&a.op),
        || async { (ok.load(Ordering::Relaxed) >= during + 5).then_some(()) },
    )
    .await;
    assert!(
        signed_by(&read(&b), &old_ca),
        "the overlap ended before admissions were seen in it"
    );

    println!("scenario: B picks the new pair up at its own check");
    eventually(
        "B serving a leaf of the new CA",
        WAIT,
        Some(&b.op),
        || async { signed_by(&read(&b), &new_ca).then_some(()) },
    )
    .await;
    let after = ok.load(Ordering::Relaxed);
    eventually(
        "admissions after the rotation",
        WAIT,
        Some(&b.op),
        || async { (ok.load(Ordering::Relaxed) >= after + 5).then_some(()) },
    )
    .await;
    for bundle in bundles().await {
        assert!(ders(&bundle).contains(&ders(&new_ca)[0]));
    }
    stop.store(true, Ordering::Relaxed);
    admissions.await.unwrap();
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of {} admission rounds failed, first: {}",
        failures.len(),
        failures.len() + ok.load(Ordering::Relaxed),
        failures[0]
    );
    assert!(ok.load(Ordering::Relaxed) > before);
    println!(
        "{} admission rounds through both replicas, none failed",
        ok.load(Ordering::Relaxed)
    );
}
