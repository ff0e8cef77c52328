//! API scenarios against a mocked API server (tower-test, the pattern
//! kube-rs documents): what the reconciler sends, request by request, for
//! a new Infra, a config-only change, pod readiness, a disabled component
//! and a NetworkAttachmentDefinition that appears late.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use causeway_operator::controller::{reconcile, Context};
use causeway_operator::crd::Infra;
use http::{Request, Response, StatusCode};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

const REFERENCE: &str = include_str!("fixtures/reference-infra.yaml");

/// One request as the API server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    content_type: String,
    body: Value,
}

impl Seen {
    fn line(&self) -> String {
        let path = self.uri.split('?').next().unwrap_or_default();
        format!("{} {path}", self.method)
    }
}

/// How the fake API server answers.
#[derive(Clone, Copy)]
struct World {
    nad_exists: bool,
    ready_replicas: i32,
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
           "status": if code < 300 { "Success" } else { "Failure" },
           "reason": reason, "code": code, "message": reason})
}

fn answer(world: World, seen: &Seen, infra: &Value) -> (StatusCode, Value) {
    let path = seen.uri.split('?').next().unwrap_or_default();
    match seen.method.as_str() {
        "GET" if path.contains("network-attachment-definitions") => {
            if world.nad_exists {
                (
                    StatusCode::OK,
                    json!({"apiVersion": "k8s.cni.cncf.io/v1",
                    "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": "vlan100", "namespace": "default"}}),
                )
            } else {
                (StatusCode::NOT_FOUND, status(404, "NotFound"))
            }
        }
        "PATCH" if path.ends_with("/status") => {
            let mut obj = infra.clone();
            obj["status"] = seen.body["status"].clone();
            (StatusCode::OK, obj)
        }
        "PATCH" => {
            // Server-side apply answers with the object as applied, with
            // the workload's current status.
            let mut obj = seen.body.clone();
            if path.contains("/deployments/") || path.contains("/statefulsets/") {
                obj["status"] = json!({"readyReplicas": world.ready_replicas, "replicas": 1});
            }
            (StatusCode::OK, obj)
        }
        "DELETE" => (StatusCode::NOT_FOUND, status(404, "NotFound")),
        _ => (StatusCode::NOT_FOUND, status(404, "NotFound")),
    }
}

/// Runs one reconcile of `infra` against the fake API server and returns
/// every request it made, in order.
async fn reconcile_once(infra: &Infra, world: World) -> Vec<Seen> {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let infra_json = serde_json::to_value(infra).unwrap();
    let recorded = seen.clone();
    let server = tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let s = Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                content_type: parts
                    .headers
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, reply) = answer(world, &s, &infra_json);
            recorded.lock().unwrap().push(s);
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        }
    });
    let ctx = Arc::new(Context {
        client,
        image: "registry.example/causeway:0.1.0".into(),
        recorder: None,
        metrics: None,
    });
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        reconcile(Arc::new(infra.clone()), ctx),
    )
    .await
    .expect("the reconcile hung")
    .expect("the reconcile failed");
    server.abort();
    let out = seen.lock().unwrap().clone();
    out
}

fn infra() -> Infra {
    let mut i: Infra = serde_yaml::from_str(REFERENCE).unwrap();
    i.metadata.uid = Some("0b9e5f7a-1111-2222-3333-444455556666".into());
    i.metadata.generation = Some(1);
    i
}

const WORLD: World = World {
    nad_exists: true,
    ready_replicas: 0,
};

fn condition<'a>(status_patch: &'a Seen, t: &str) -> &'a Value {
    status_patch.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .unwrap_or_else(|| panic!("no {t} condition in {}", status_patch.body))
}

#[tokio::test]
async fn a_new_infra_is_applied_object_by_object_then_its_status_written() {
    let seen = reconcile_once(&infra(), WORLD).await;
    let lines: Vec<String> = seen.iter().map(Seen::line).collect();
    let ns = "/namespaces/clusters";
    assert_eq!(
        lines,
        vec![
            "GET /apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions/vlan100".to_string(),
            format!("PATCH /api/v1{ns}/serviceaccounts/example-infra-causeway"),
            format!("PATCH /api/v1{ns}/configmaps/example-infra-dhcp-config"),
            format!("PATCH /apis/apps/v1{ns}/statefulsets/example-infra-dhcp"),
            format!("PATCH /api/v1{ns}/configmaps/example-infra-dns-config"),
            format!("PATCH /apis/apps/v1{ns}/deployments/example-infra-dns"),
            format!("PATCH /api/v1{ns}/configmaps/example-infra-proxy-config"),
            format!("PATCH /apis/apps/v1{ns}/deployments/example-infra-proxy"),
            format!("PATCH /apis/hostedcluster.densityops.com/v1alpha1{ns}/infras/example-infra/status"),
        ]
    );
    for s in &seen[1..8] {
        assert_eq!(
            s.content_type,
            "application/apply-patch+yaml",
            "{}",
            s.line()
        );
        assert!(
            s.uri.contains("fieldManager=causeway-operator"),
            "{}",
            s.uri
        );
        assert!(s.uri.contains("force=true"), "{}", s.uri);
        assert_eq!(s.body["metadata"]["ownerReferences"][0]["kind"], "Infra");
        assert!(s.body["apiVersion"].is_string() && s.body["kind"].is_string());
    }
    let status = seen.last().unwrap();
    assert_eq!(status.content_type, "application/merge-patch+json");
    assert_eq!(condition(status, "Valid")["status"], "True");
    assert_eq!(condition(status, "Ready")["status"], "False");
    assert_eq!(
        condition(status, "Ready")["message"],
        "not ready: dhcp, dns, proxy"
    );
    assert_eq!(
        condition(status, "DHCPReady")["message"],
        "0 of 1 dhcp pods ready"
    );
    assert_eq!(status.body["status"]["observedGeneration"], 1);
}

#[tokio::test]
async fn status_follows_the_pods_readiness() {
    let seen = reconcile_once(
        &infra(),
        World {
            ready_replicas: 1,
            ..WORLD
        },
    )
    .await;
    let status = seen.last().unwrap();
    for t in ["Ready", "DHCPReady", "DNSReady", "ProxyReady"] {
        assert_eq!(condition(status, t)["status"], "True", "{t}");
    }
    assert_eq!(
        status.body["status"]["componentStatus"],
        json!({"dhcpReady": true, "dnsReady": true, "proxyReady": true})
    );
}

fn body_of<'a>(seen: &'a [Seen], path_part: &str) -> &'a Value {
    &seen
        .iter()
        .find(|s| s.method == "PATCH" && s.uri.contains(path_part))
        .unwrap_or_else(|| panic!("no PATCH of {path_part}"))
        .body
}

#[tokio::test]
async fn a_config_only_change_reaches_the_configmap_and_leaves_the_pods_alone() {
    let before = reconcile_once(&infra(), WORLD).await;
    let mut changed = infra();
    changed.spec.infra_components.dhcp.lease_time = Some("2h".into());
    changed.metadata.generation = Some(2);
    let after = reconcile_once(&changed, WORLD).await;
    let config = body_of(&after, "configmaps/example-infra-dhcp-config")["data"]["config.yaml"]
        .as_str()
        .unwrap();
    assert!(config.contains("leaseTime: \"2h\""), "{config}");
    // The pod template is untouched: no rollout; the pod reloads the file.
    assert_eq!(
        body_of(&before, "statefulsets/example-infra-dhcp")["spec"]["template"],
        body_of(&after, "statefulsets/example-infra-dhcp")["spec"]["template"]
    );

    // A new address, though, changes the template: the pod is replaced.
    let mut moved = infra();
    moved.spec.infra_components.dhcp.server_ip = Some("192.168.100.4".into());
    let rolled = reconcile_once(&moved, WORLD).await;
    assert_ne!(
        body_of(&before, "statefulsets/example-infra-dhcp")["spec"]["template"],
        body_of(&rolled, "statefulsets/example-infra-dhcp")["spec"]["template"]
    );
}

#[tokio::test]
async fn a_disabled_component_has_its_objects_deleted() {
    let mut i = infra();
    i.spec.infra_components.dns.enabled = false;
    let seen = reconcile_once(&i, WORLD).await;
    let lines: Vec<String> = seen.iter().map(Seen::line).collect();
    assert!(
        lines.contains(
            &"DELETE /api/v1/namespaces/clusters/configmaps/example-infra-dns-config".to_string()
        ),
        "{lines:#?}"
    );
    assert!(
        lines.contains(
            &"DELETE /apis/apps/v1/namespaces/clusters/deployments/example-infra-dns".to_string()
        ),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("PATCH") && l.contains("-dns")),
        "{lines:#?}"
    );
    let status = seen.last().unwrap();
    assert_eq!(condition(status, "DNSReady")["reason"], "Disabled");
}

#[tokio::test]
async fn a_missing_nad_is_reported_and_nothing_applied_until_it_appears() {
    let seen = reconcile_once(
        &infra(),
        World {
            nad_exists: false,
            ..WORLD
        },
    )
    .await;
    let lines: Vec<String> = seen.iter().map(Seen::line).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].ends_with("/infras/example-infra/status"));
    let status = &seen[1];
    assert_eq!(condition(status, "Valid")["status"], "False");
    assert_eq!(
        condition(status, "Valid")["message"],
        "networkConfig.networkAttachmentDefinition: NetworkAttachmentDefinition default/vlan100 not found"
    );
    assert_eq!(condition(status, "Ready")["reason"], "Invalid");

    let seen = reconcile_once(&infra(), WORLD).await;
    assert_eq!(seen.len(), 9, "the NAD appeared, so everything is applied");
}
