//! The Infra reconcile's decisions against an API server the test plays
//! request by request ([`crate::k8s::mock_api`]): what it reads and writes
//! around its finalizer, in order, and that it writes nothing before its
//! watches have listed. Each runs in milliseconds; `operator_kube` keeps
//! what only a real API server shows.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::Client;
use serde_json::{json, Value};

use super::super::attachment::InfraClusterAttachment;
use super::super::context::{Context, Indexes};
use super::super::crd::Infra;
use super::super::plan::Settings;
use super::super::pod_monitors::PodMonitors;
use super::{reconcile, FINALIZER};
use crate::k8s::apply::{Applier, Noise};
use crate::k8s::mock_api::{self, MockApi};
use crate::k8s::resources::machine_resource;
use crate::k8s::watch::{cached_optional, owned, owned_dynamic, Everywhere, OptionalKind, Scope};

const NS: &str = "clusters";
const NAME: &str = "example-infra";

/// The Context `run` builds, on `client`, its watches never started: the
/// indexes have listed nothing, as right after a start.
async fn context(client: Client) -> Arc<Context> {
    let scope = Scope::All;
    let disruption_budget =
        kube::core::ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&());
    let (machines, _) = Everywhere::watch(
        &client,
        std::slice::from_ref(&scope),
        &machine_resource(),
        "",
    );
    let (attachments, _) = cached_optional(
        &client,
        scope.api::<InfraClusterAttachment>(&client),
        OptionalKind::of(
            &kube::core::ApiResource::erase::<InfraClusterAttachment>(&()),
            "",
        ),
        watcher::Config::default(),
    );
    Arc::new(Context {
        client: client.clone(),
        applier: Applier::new(client.clone(), None, Noise::Debug),
        settings: Settings {
            image: "registry.example/causeway:test".into(),
            operator_namespace: "causeway-system".into(),
            resources: None,
            // Not wanted: no discovery request at the start.
            pod_monitors: false,
        },
        indexes: Indexes {
            config_maps: owned(scope.api::<ConfigMap>(&client)).0,
            deployments: owned(scope.api::<Deployment>(&client)).0,
            stateful_sets: owned(scope.api::<StatefulSet>(&client)).0,
            service_accounts: owned(scope.api::<ServiceAccount>(&client)).0,
            services: owned(scope.api::<Service>(&client)).0,
            network_policies: owned(scope.api::<NetworkPolicy>(&client)).0,
            leases: owned(scope.api::<Lease>(&client)).0,
            disruption_budgets: owned_dynamic(
                scope.api_with::<DynamicObject>(&client, &disruption_budget),
                disruption_budget.clone(),
            )
            .0,
            roles: owned(scope.api::<Role>(&client)).0,
            role_bindings: owned(scope.api::<RoleBinding>(&client)).0,
        },
        recorder: None,
        metrics: None,
        disruption_budget,
        pod_monitors: PodMonitors::at_start(&client, false).await,
        ha_keys: Mutex::new(HashSet::new()),
        attachments,
        machines,
    })
}

/// The reference Infra as a user applies it, with `metadata` merged in.
fn infra(metadata: Value) -> Infra {
    let mut doc: Value =
        serde_saphyr::from_str(include_str!("../../tests/fixtures/reference-infra.yaml"))
            .expect("the reference Infra parses");
    let mut meta = json!({"name": NAME, "namespace": NS, "uid": "u-1", "resourceVersion": "7"});
    for (k, v) in metadata.as_object().cloned().unwrap_or_default() {
        meta[k] = v;
    }
    doc["metadata"] = meta;
    serde_json::from_value(doc).expect("an Infra")
}

/// The reference Infra being deleted, holding `finalizers`.
fn deleted_with(finalizers: Value) -> Infra {
    infra(json!({"finalizers": finalizers, "deletionTimestamp": "2026-11-29T10:00:00Z"}))
}

fn policy(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": {"podSelector": {}}})
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "9"}, "items": items})
}

/// Runs one reconcile of `infra` against the API the test plays with
/// `play`, and returns its result once both are done.
async fn reconcile_with<F, Fut>(infra: Infra, play: F) -> Result<Action, crate::error::Error>
where
    F: FnOnce(MockApi) -> Fut,
    Fut: std::future::Future<Output = MockApi>,
{
    let (client, api) = mock_api::client();
    let ctx = context(client).await;
    let run = tokio::spawn(reconcile(Arc::new(infra), ctx));
    // Kept until the reconcile ends: a request the test did not expect
    // stays unanswered, and the reconcile does not end.
    let _api = play(api).await;
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the reconcile ends within 5 s once the requests the test expects are answered")
        .expect("the reconcile does not panic")
}

/// A query string with its %XX escapes undone.
fn decoded(query: &str) -> String {
    let bytes = query.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_new_infra_gets_the_finalizer_and_nothing_else_first() {
    let result = reconcile_with(infra(json!({})), |mut api| async move {
        let e = api
            .expect(
                Method::PATCH,
                "/apis/hostedcluster.densityops.com/v1alpha1/namespaces/clusters/infras/example-infra",
            )
            .await;
        assert_eq!(e.content_type, "application/json-patch+json");
        // Added only where there were no finalizers: a concurrent writer's
        // list is never overwritten.
        assert_eq!(
            e.body,
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        );
        e.ok(serde_json::to_value(infra(json!({"finalizers": [FINALIZER]}))).unwrap());
        api
    })
    .await;
    assert_eq!(result.expect("finalizer added"), Action::await_change());
}

#[tokio::test]
async fn before_its_watches_have_listed_a_reconcile_reads_and_writes_nothing() {
    let result = reconcile_with(
        infra(json!({"finalizers": [FINALIZER]})),
        |api| async move { api },
    )
    .await;
    assert_eq!(
        result.expect("a requeue"),
        Action::requeue(Duration::from_secs(1))
    );
}

#[tokio::test]
async fn a_deleted_infra_loses_its_control_plane_policy_then_its_finalizer() {
    let deleted = deleted_with(json!(["other.example/keep", FINALIZER]));
    let result = reconcile_with(deleted, |mut api| async move {
        let e = api
            .expect(Method::GET, "/apis/networking.k8s.io/v1/networkpolicies")
            .await;
        let selector = format!(
            "labelSelector={}={NAME},{}={NS}",
            super::render::INFRA_NAME_LABEL,
            super::render::INFRA_NAMESPACE_LABEL
        );
        assert!(
            decoded(&e.query).contains(&selector),
            "found by the Infra's labels across namespaces: {}",
            e.query
        );
        e.ok(list(
            "NetworkPolicyList",
            vec![policy("clusters-hc1", "causeway-example-infra")],
        ));
        api.expect(
            Method::DELETE,
            "/apis/networking.k8s.io/v1/namespaces/clusters-hc1/networkpolicies/causeway-example-infra",
        )
        .await
        .ok(policy("clusters-hc1", "causeway-example-infra"));
        let e = api
            .expect(
                Method::PATCH,
                "/apis/hostedcluster.densityops.com/v1alpha1/namespaces/clusters/infras/example-infra",
            )
            .await;
        // Ours alone is removed, checked in place first.
        assert_eq!(
            e.body,
            json!([{"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                   {"op": "remove", "path": "/metadata/finalizers/1"}])
        );
        e.ok(serde_json::to_value(infra(json!({"finalizers": ["other.example/keep"]}))).unwrap());
        api
    })
    .await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
}

#[tokio::test]
async fn an_operator_that_may_not_list_across_namespaces_looks_where_the_spec_points() {
    let deleted = deleted_with(json!([FINALIZER]));
    let control_plane = super::validate::control_plane_namespace(&deleted.spec, NS)
        .expect("the reference names one");
    let result = reconcile_with(deleted, |mut api| async move {
        api.expect(Method::GET, "/apis/networking.k8s.io/v1/networkpolicies")
            .await
            .status(StatusCode::FORBIDDEN, "Forbidden");
        let path = format!("/apis/networking.k8s.io/v1/namespaces/{control_plane}/networkpolicies");
        api.expect(Method::GET, &path)
            .await
            .ok(list("NetworkPolicyList", vec![]));
        api.expect(
            Method::PATCH,
            "/apis/hostedcluster.densityops.com/v1alpha1/namespaces/clusters/infras/example-infra",
        )
        .await
        .ok(serde_json::to_value(infra(json!({"finalizers": []}))).unwrap());
        api
    })
    .await;
    assert_eq!(result.expect("cleaned up"), Action::await_change());
}

#[tokio::test]
async fn a_failed_cleanup_keeps_the_finalizer_and_says_why() {
    let deleted = deleted_with(json!([FINALIZER]));
    let result = reconcile_with(deleted, |mut api| async move {
        api.expect(Method::GET, "/apis/networking.k8s.io/v1/networkpolicies")
            .await
            .ok(list(
                "NetworkPolicyList",
                vec![policy("clusters-hc1", "causeway-example-infra")],
            ));
        api.expect(
            Method::DELETE,
            "/apis/networking.k8s.io/v1/namespaces/clusters-hc1/networkpolicies/causeway-example-infra",
        )
        .await
        .status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
        // No finalizer patch follows: the next request would be one.
        api
    })
    .await;
    let error = result.expect_err("the cleanup failed");
    assert!(
        error.to_string().contains("InternalError"),
        "the error names the API server's answer: {error}"
    );
}
