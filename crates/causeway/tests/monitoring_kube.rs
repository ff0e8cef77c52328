//! The operator's side of monitoring, against a real API server: the
//! PodMonitor it renders per Infra where the kind is served, the metrics
//! the alerts read (leadership, each object's conditions, a deletion held
//! by a finalizer, the webhook certificate's expiry), and every operator
//! metric the chart's alerts and dashboards name, found in a live scrape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;
use crate::monitored;

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

use causeway_operator::infra::crd::Infra;
use kube_cluster::{
    admin_get, apply_yaml, eventually, install_fixture_crds, install_release, own_cluster,
    test_namespace, token_for, Operator, NAD_CRD, POD_MONITOR_CRD, RELEASE,
};

const WAIT: Duration = Duration::from_secs(60);
/// The webhook certificate's notAfter: 2030-01-01T00:00:00Z.
const NOT_AFTER: i64 = 1_893_456_000;
const HOLD: &str = "test.causeway.io/hold";

/// The value of the sample of `name` that has every label of `labels`.
fn sample(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, v)| v.parse().ok())
}

fn write_certificate(dir: &std::path::Path) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2030, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
}

#[test]
fn names_are_read_from_text_and_scrapes() {
    let names = monitored::names_in(
        "expr: rate(causeway_dhcp_reply_seconds_bucket[5m]) > 0 and causeway_x{a=\"b\"}; not my_causeway_y",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["causeway_dhcp_reply_seconds_bucket", "causeway_x"]
    );
    let exported = monitored::exported(
        "# HELP causeway_a_seconds x\n# TYPE causeway_a_seconds histogram\ncauseway_a_seconds_bucket{le=\"1\"} 0\n# TYPE causeway_b_total counter\n",
    );
    for n in [
        "causeway_a_seconds",
        "causeway_a_seconds_bucket",
        "causeway_a_seconds_count",
        "causeway_b_total",
    ] {
        assert!(exported.contains(n), "{n}");
    }
    assert!(!exported.contains("causeway_b_total_count"));
}

/// Every name an alert or a dashboard reads falls to one of the tests that
/// scrape, and each of those has names to find.
#[test]
fn every_monitored_name_has_a_test_that_scrapes_it() {
    let names = monitored::monitored_names();
    for source in monitored::ALL_SOURCES {
        assert!(
            names.iter().any(|(n, _)| monitored::source_of(n) == source),
            "{source:?}: nothing read"
        );
    }
}

#[tokio::test]
async fn the_operator_exports_what_the_alerts_read_and_renders_pod_monitors() {
    let Some(c) = own_cluster(
        "monitoring_kube",
        "the_operator_exports_what_the_alerts_read_and_renders_pod_monitors",
    ) else {
        return;
    };
    let client = kube_cluster::admin(c).await;
    install_fixture_crds(&client, &[POD_MONITOR_CRD, NAD_CRD]).await;
    let ns = test_namespace(&client, "monitoring").await;
    kube_cluster::network_attachment(&client, "default", "vlan100").await;
    let dir = tempfile::tempdir().unwrap();
    write_certificate(dir.path());
    let webhook_port = crate::support::reserved_port();
    let op = Operator::start(
        c,
        &[&ns],
        &[
            "--webhook-listen",
            &format!("127.0.0.1:{webhook_port}"),
            "--webhook-cert-dir",
            dir.path().to_str().unwrap(),
        ],
        "monitoring",
    );
    let scrape = || admin_get(&op, "/metrics");
    // The admin server is up before the operator reads anything.
    eventually("the operator's admin server", WAIT, Some(&op), || async {
        std::net::TcpStream::connect(op.admin).ok().map(|_| ())
    })
    .await;

    // Leadership (election is on: the Lease was taken) and the served
    // certificate's expiry.
    eventually("causeway_operator_leader 1", WAIT, Some(&op), || async {
        (sample(&scrape(), "causeway_operator_leader", &[]) == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(
        sample(
            &scrape(),
            "causeway_operator_webhook_certificate_expiry_timestamp_seconds",
            &[]
        ),
        Some(NOT_AFTER as f64)
    );

    // An Infra, held by a finalizer of the test's own once deleted.
    let doc = format!(
        r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {{name: watched, namespace: {ns}, finalizers: ["{HOLD}"]}}
spec:
  networkConfig:
    cidr: 192.168.100.0/24
    gateway: 192.168.100.1
    networkAttachmentDefinition: vlan100
    networkAttachmentNamespace: default
  infraComponents:
    dhcp: {{enabled: true, serverIP: 192.168.100.2, rangeStart: 192.168.100.100, rangeEnd: 192.168.100.200}}
    dns: {{enabled: true, serverIP: 192.168.100.3, baseDomain: example.com, clusterName: my-cluster}}
    proxy: {{enabled: true, serverIP: 192.168.100.10, controlPlaneNamespace: clusters-my-cluster}}
"#
    );
    apply_yaml(&client, &doc, &ns).await.unwrap();

    // Its PodMonitor, owned by it, scraping its pods' admin port.
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PodMonitor"),
        "podmonitors",
    );
    let monitors: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let monitor = eventually("the Infra's PodMonitor", WAIT, Some(&op), || async {
        monitors.get_opt("watched-causeway").await.ok().flatten()
    })
    .await;
    let spec = &monitor.data["spec"];
    assert_eq!(
        spec["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "watched"
    );
    assert_eq!(spec["podMetricsEndpoints"][0]["port"], "admin");
    assert_eq!(
        spec["podMetricsEndpoints"][0]["relabelings"][0]["replacement"],
        "watched"
    );
    let owners = monitor.metadata.owner_references.unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "Infra" && o.name == "watched"),
        "{owners:?}"
    );

    // Its Ready condition, as the API server has it.
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    let labels = [
        ("kind", "Infra"),
        ("object_namespace", ns.as_str()),
        ("name", "watched"),
        ("type", "Ready"),
    ];
    eventually(
        "the Ready condition as a metric",
        WAIT,
        Some(&op),
        || async {
            let infra = infras.get("watched").await.ok()?;
            let ready = infra
                .status?
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")?
                .status
                .clone();
            let want = if ready == "True" { 1.0 } else { 0.0 };
            (sample(&scrape(), "causeway_operator_condition", &labels) == Some(want)).then_some(())
        },
    )
    .await;

    // Deleted: the operator's finalizer goes, the test's holds it, and the
    // metric carries the deletionTimestamp.
    infras
        .delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let deleted_at = infras
        .get("watched")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .expect("a deletionTimestamp")
        .0
        .as_second();
    let held = [
        ("kind", "Infra"),
        ("object_namespace", ns.as_str()),
        ("name", "watched"),
    ];
    eventually("the deletion as a metric", WAIT, Some(&op), || async {
        (sample(
            &scrape(),
            "causeway_operator_deletion_timestamp_seconds",
            &held,
        ) == Some(deleted_at as f64))
        .then_some(())
    })
    .await;

    monitored::assert_exported(monitored::Source::Operator, &[&scrape()]);

    // Let go: the object, and then its series, are gone.
    infras
        .patch(
            "watched",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually(
        "the series of a deleted Infra gone",
        WAIT,
        Some(&op),
        || async {
            let text = scrape();
            (sample(&text, "causeway_operator_deletion_timestamp_seconds", &held).is_none()
                && sample(&text, "causeway_operator_condition", &labels).is_none())
            .then_some(())
        },
    )
    .await;
}

/// `curl` of `https://<admin>/<path>` trusting `ca`, with `token` as the
/// bearer: the HTTP status, or 0 when no HTTP answer came.
fn curl_status(
    admin: std::net::SocketAddr,
    path: &str,
    ca: &std::path::Path,
    token: Option<&str>,
) -> u16 {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
        "--cacert",
    ])
    .arg(ca)
    .arg(format!("https://{admin}{path}"));
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    let out = cmd.output().expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// metrics.tls and metrics.authorization: the admin port over TLS, the
/// probes open, and /metrics only for a token whose user the chart's
/// reader role (or any role granting get on /metrics) lets in, checked by
/// the operator through the API server under the chart's RBAC.
#[tokio::test]
async fn the_admin_port_over_tls_lets_only_an_authorized_token_read_the_metrics() {
    let Some(c) = own_cluster(
        "monitoring_kube",
        "the_admin_port_over_tls_lets_only_an_authorized_token_read_the_metrics",
    ) else {
        return;
    };
    let client = kube_cluster::admin(c).await;
    // The chart's RBAC with metrics.authorization on: the operator may ask
    // TokenReviews and SubjectAccessReviews, and the reader role exists.
    install_release(
        &client,
        &c.helm,
        RELEASE,
        &["metrics.authorization.enabled=true"],
    )
    .await
    .unwrap();
    let ns = test_namespace(&client, "metrics-auth").await;
    let reader_role = format!("{RELEASE}-metrics-reader");
    for sa in ["scraper", "nobody"] {
        apply_yaml(
            &client,
            &format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n"
            ),
            &ns,
        )
        .await
        .unwrap();
    }
    apply_yaml(
        &client,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {ns}-scraper}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {reader_role}}}\nsubjects: [{{kind: ServiceAccount, name: scraper, namespace: {ns}}}]\n"
        ),
        &ns,
    )
    .await
    .unwrap();
    let scraper = token_for(&client, &ns, "scraper").await;
    let nobody = token_for(&client, &ns, "nobody").await;

    let dir = tempfile::tempdir().unwrap();
    write_certificate(dir.path());
    let ca = dir.path().join("tls.crt");
    let op = Operator::start(
        c,
        &[&ns],
        &[
            "--leader-election=false",
            "--admin-tls-dir",
            dir.path().to_str().unwrap(),
            "--admin-metrics-auth=true",
        ],
        "metrics-auth",
    );
    eventually("the admin port over TLS", WAIT, Some(&op), || async {
        (curl_status(op.admin, "/healthz", &ca, None) == 200).then_some(())
    })
    .await;
    // The kubelet's probes send no token.
    assert_eq!(curl_status(op.admin, "/readyz", &ca, None), 200);
    assert_eq!(
        curl_status(op.admin, "/metrics", &ca, None),
        401,
        "no token"
    );
    assert_eq!(
        curl_status(op.admin, "/metrics", &ca, Some("not-a-token")),
        401,
        "a token that does not authenticate"
    );
    assert_eq!(
        curl_status(op.admin, "/metrics", &ca, Some(&nobody)),
        403,
        "a user without get on /metrics"
    );
    assert_eq!(
        curl_status(op.admin, "/metrics", &ca, Some(&scraper)),
        200,
        "the reader role's user"
    );
    // And the body is the metrics, over TLS only: plain HTTP gets nothing.
    let body = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "--cacert"])
        .arg(&ca)
        .arg("-H")
        .arg(format!("Authorization: Bearer {scraper}"))
        .arg(format!("https://{}/metrics", op.admin))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&body.stdout).contains("causeway_operator_leader 1"));
    let plain = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg(format!("http://{}/metrics", op.admin))
        .output()
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&plain.stdout).trim(), "200");
}
