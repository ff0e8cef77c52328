//! Apps ingress installing MetalLB in the hosted cluster (`install: true`),
//! the hosted cluster being a second API server of its own (its own etcd,
//! CA, admin token and controller-manager, reached through the admin
//! kubeconfig Secret as HyperShift publishes it), where neither OLM's nor
//! MetalLB's kinds are served at first. The test plays OLM (it serves
//! MetalLB's kinds once the Subscription is there, as the operator's
//! bundle would) and MetalLB ([`kube_cluster::metallb`], which runs only
//! once the `MetalLB` resource exists and reads pools only from its own
//! namespace). Then the hosted API server stopped while the management
//! side runs, and started again; and a deletion that gives up, after a
//! shortened timeout, on a hosted cluster it cannot reach.
//!
//! Needs root (the API server binaries are built into /var/cache by
//! tests/run.sh); without them the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::time::{Duration, Instant};

use causeway_operator::infra::attachment::{AppsIngressStatus, InfraClusterAttachment};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, DynamicObject};
use kube::ResourceExt;
use kube_cluster::{
    admin, admin_kubeconfig_secret, apply_yaml, eventually, install_fixture_crds, metallb,
    network_attachment, ready_node, Operator, HOSTED_CLUSTER_CRD, METALLB_CRDS,
    METALLB_OPERATOR_CRD, NAD_CRD, OLM_SUBSCRIPTION_CRD,
};
const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "apps-install";
const OLM_NS: &str = "openshift-operators";

const INFRA: &str = r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {name: vlan100, namespace: apps-install}
spec:
  networkConfig:
    cidr: 192.168.100.0/24
    gateway: 192.168.100.1
    networkAttachmentDefinition: vlan100
    dnsServers: [192.0.2.53]
  infraComponents:
    dhcp: {serverIP: 192.168.100.2, rangeStart: 192.168.100.100, rangeEnd: 192.168.100.199}
    dns: {serverIP: 192.168.100.3}
    proxy: {serverIP: 192.168.100.4}
"#;

async fn wait_apps(
    attachments: &Api<InfraClusterAttachment>,
    op: &Operator,
    name: &str,
    want: &str,
) -> AppsIngressStatus {
    eventually(
        &format!("apps ingress of {name}: {want}"),
        WAIT,
        Some(op),
        || async {
            let a = attachments.get(name).await.ok()?;
            let s = a.status?.apps_ingress_status?;
            (s.reason == want).then_some(s)
        },
    )
    .await
}

async fn put_kubeconfig(client: &kube::Client, text: String) {
    admin_kubeconfig_secret(client, "clusters", "hc8", text).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metallb_is_installed_when_asked_and_a_lost_cluster_is_given_up_on() {
    const TEST: &str = "metallb_is_installed_when_asked_and_a_lost_cluster_is_given_up_on";
    let Some((c, client)) =
        kube_cluster::with_apps_ingress(TEST, &[NS, "clusters", "clusters-hc8"]).await
    else {
        return;
    };
    // Reached as the chart's default has it (`--hosted-apiserver=service`):
    // by the control plane's kube-apiserver Service name, which resolves
    // for the operator (as cluster DNS would) to the hosted API server.
    let service_name = "kube-apiserver.clusters-hc8.svc.cluster.local";
    let Some(h) =
        kube_cluster::hosted_cluster("apps_ingress_kube", TEST, &format!("DNS:{service_name}"))
    else {
        return;
    };
    let hosted_address = h.address.to_string();
    // The hosted cluster's own admin client: its objects are read there.
    let hosted = admin(h).await;
    for n in ["openshift-ingress", OLM_NS] {
        kube_cluster::ensure_namespace(&hosted, n).await;
    }
    install_fixture_crds(&client, &[NAD_CRD, HOSTED_CLUSTER_CRD]).await;
    network_attachment(&client, NS, "vlan100").await;
    // HyperShift's admin kubeconfig names the cluster's external API
    // endpoint, which the management side cannot reach here (nothing
    // resolves it): only the Service path works.
    put_kubeconfig(
        &client,
        causeway_operator::k8s::manifest::token_kubeconfig(
            "https://api.hc8.example.net:6443",
            &h.ca,
            &h.admin_token,
        ),
    )
    .await;
    // A Ready Node in the hosted cluster, so only MetalLB is waited for.
    ready_node(&hosted, "hc8-worker-0").await;
    let args = [
        "--leader-election=false",
        "--hosted-apiserver=service",
        "--hosted-cleanup-timeout-seconds=5",
    ];
    let op = Operator::start_resolving(
        c,
        &[NS, "clusters-hc8"],
        &args,
        "install",
        &[(hosted_address.as_str(), service_name)],
    );
    apply_yaml(&client, INFRA, NS).await.unwrap();
    let attachment = serde_json::json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "InfraClusterAttachment",
        "metadata": {"name": "i", "namespace": NS},
        "spec": {"infraRef": {"name": "vlan100"},
            "hostedClusterRef": {"name": "hc8", "namespace": "clusters"},
            "dns": {"clusterName": "hc8", "baseDomain": "example.net"},
            "appsIngress": {"enabled": true,
                "metallb": {"addressPoolName": "hc8-apps", "ipAddressPoolRange": "192.168.100.210-192.168.100.219",
                    "install": true}}}});
    apply_yaml(&client, &serde_json::to_string(&attachment).unwrap(), NS)
        .await
        .unwrap();
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), NS);

    // No OLM: nothing can install MetalLB, and the status says so.
    let s = wait_apps(&attachments, &op, "i", "MetalLBInstallFailed").await;
    assert!(
        s.message.contains("Subscription kind is not served"),
        "{}",
        s.message
    );

    // OLM serves Subscriptions: MetalLB's is made where OLM installs
    // operators for every namespace, and MetalLB's kinds are waited for.
    install_fixture_crds(&hosted, &[OLM_SUBSCRIPTION_CRD]).await;
    let s = wait_apps(&attachments, &op, "i", "WaitingForMetalLBCRDs").await;
    assert!(s.message.contains("being installed"), "{}", s.message);
    let subscriptions: Api<DynamicObject> = Api::namespaced_with(
        hosted.clone(),
        OLM_NS,
        &causeway_operator::k8s::resources::resource(
            "operators.coreos.com",
            "v1alpha1",
            "Subscription",
            "subscriptions",
        ),
    );
    let sub = subscriptions.get("metallb-operator").await.unwrap();
    assert_eq!(
        sub.data["spec"],
        serde_json::json!({"channel": "stable", "name": "metallb-operator", "source": "redhat-operators",
            "sourceNamespace": "openshift-marketplace", "installPlanApproval": "Automatic"})
    );
    let metallbs: Api<DynamicObject> = Api::namespaced_with(
        hosted.clone(),
        OLM_NS,
        &causeway_operator::k8s::resources::resource(
            "metallb.io",
            "v1beta1",
            "MetalLB",
            "metallbs",
        ),
    );

    // OLM installs the operator's bundle: MetalLB's kinds are served. The
    // MetalLB resource that has the operator run MetalLB is made then,
    // woken by the watch of the kinds (a Pending pass is otherwise looked
    // at again only every 10 s), with the pool and its advertisement in
    // the same namespace.
    let served_at = Instant::now();
    install_fixture_crds(&hosted, &[METALLB_CRDS, METALLB_OPERATOR_CRD]).await;
    eventually("the MetalLB resource", WAIT, Some(&op), || async {
        metallbs.get_opt("metallb").await.ok()?
    })
    .await;
    let took = served_at.elapsed();
    println!("the MetalLB resource made {took:?} after MetalLB's kinds were applied");
    assert!(
        took < Duration::from_secs(8),
        "the MetalLB resource took {took:?}: made by the 10 s requeue, not the watch"
    );
    wait_apps(&attachments, &op, "i", "WaitingForExternalIP").await;
    let pools: Api<DynamicObject> = Api::namespaced_with(
        hosted.clone(),
        OLM_NS,
        &causeway_operator::k8s::resources::ip_address_pool_resource(),
    );
    assert!(pools.get_opt("hc8-apps").await.unwrap().is_some());
    for ns in ["metallb-system"] {
        let elsewhere: Api<DynamicObject> = Api::namespaced_with(
            hosted.clone(),
            ns,
            &causeway_operator::k8s::resources::ip_address_pool_resource(),
        );
        assert!(
            elsewhere.get_opt("hc8-apps").await.unwrap().is_none(),
            "a pool in {ns}, where the installed MetalLB does not read it"
        );
    }

    // The installed MetalLB gives the router its address and announces it.
    let given = metallb::allocate(
        &hosted,
        metallb::Installed::Operator,
        OLM_NS,
        "openshift-ingress",
        "causeway-apps",
    )
    .await
    .unwrap();
    assert_eq!(
        (given.address.to_string().as_str(), given.announced),
        ("192.168.100.210", true),
        "{given:?}"
    );
    let s = wait_apps(&attachments, &op, "i", "ReconciliationSucceeded").await;
    assert_eq!(s.external_ip.as_deref(), Some("192.168.100.210"));
    assert!(s.applied.as_ref().unwrap().installed_metallb, "{s:?}");

    // The hosted API server stops while the management side runs: the
    // attachment says so (apps ingress Degraded, Ready False), woken by
    // its watch of the hosted cluster failing; nothing of the Infra is
    // deleted or changed, and *.apps stays served at the router's last
    // address (the router itself is not down).
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let served_apps = |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("config.yaml"))
            // The cluster's apps address, which DNS answers *.apps with.
            .is_some_and(|t| t.contains("appsAddress: \"192.168.100.210\""))
    };
    let dns_config = eventually("*.apps in the DNS config", WAIT, Some(&op), || async {
        configs
            .get_opt("vlan100-dns-config")
            .await
            .ok()?
            .filter(served_apps)
    })
    .await;
    let before = management_objects(&client).await;
    let down_at = k8s_openapi::jiff::Timestamp::now();
    kube_cluster::stop_apiserver(h);
    let s = eventually(
        "the attachment reporting the hosted API down",
        WAIT,
        Some(&op),
        || async {
            let a = attachments.get("i").await.ok()?;
            let st = a.status?;
            let apps = st.apps_ingress_status?;
            let ready_false = st
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == apps.reason);
            (apps.phase == "Degraded"
                && ["HostedClusterNodeListFailed", "HostedClusterAccessFailed"]
                    .contains(&apps.reason.as_str())
                && ready_false)
                .then_some(apps)
        },
    )
    .await;
    assert_eq!(
        s.external_ip.as_deref(),
        Some("192.168.100.210"),
        "{s:?}\n{}",
        op.log_text()
    );
    assert!(s.message.contains("still served"), "{}", s.message);
    let during = configs.get("vlan100-dns-config").await.unwrap();
    assert!(
        served_apps(&during),
        "*.apps left the DNS config while the hosted API was down"
    );
    assert_eq!(
        during.data, dns_config.data,
        "the DNS config changed during the outage"
    );
    assert_eq!(
        management_objects(&client).await,
        before,
        "management objects changed during the outage"
    );
    // The attachment's event of `reason` whose note has `says`, seen at or
    // after `since`: its note.
    let events = |reason: String, says: String, since: k8s_openapi::jiff::Timestamp| {
        let client = client.clone();
        async move {
            let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, NS);
            api.list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some(reason.as_str())
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("i")
                })
                .map(|e| {
                    // When it was last seen: a repeat updates its series.
                    let last = e
                        .series
                        .as_ref()
                        .map(|s| s.last_observed_time.0)
                        .or(e.event_time.as_ref().map(|t| t.0))
                        .unwrap_or_default();
                    (e.note.unwrap_or_default(), last)
                })
                .find(|(note, last)| note.contains(&says) && *last >= since)
                .map(|(note, _)| note)
        }
    };
    let note = eventually(
        "an event saying the hosted API is down",
        WAIT,
        Some(&op),
        || events(s.reason.clone(), "still served".to_string(), down_at),
    )
    .await;
    assert!(note.contains("192.168.100.210"), "{note}");
    // Back: Ready again, from the watch's recovery (the next look is
    // minutes away).
    let back_at = k8s_openapi::jiff::Timestamp::now();
    kube_cluster::start_apiserver(h);
    wait_apps(&attachments, &op, "i", "ReconciliationSucceeded").await;
    eventually("an event saying it is back", WAIT, Some(&op), || {
        events("AppsIngressReady".to_string(), String::new(), back_at)
    })
    .await;

    // Deleted while the hosted API server is down again: the deletion
    // waits the shortened timeout, says so, then goes, leaving the hosted
    // objects behind with a warning naming them.
    kube_cluster::stop_apiserver(h);
    attachments
        .delete("i", &DeleteParams::default())
        .await
        .unwrap();
    let message = eventually(
        "the deletion waits and says why",
        WAIT,
        Some(&op),
        || async {
            let a = attachments.get_opt("i").await.ok()??;
            a.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "HostedCleanup" && c.status == "False")
                .map(|c| c.message)
        },
    )
    .await;
    assert!(message.contains("waiting up to 5 s"), "{message}");
    eventually(
        "the attachment gone after the timeout",
        WAIT,
        Some(&op),
        || async { attachments.get_opt("i").await.ok()?.is_none().then_some(()) },
    )
    .await;
    let log = op.log_text();
    assert!(
        log.contains("left behind") && log.contains("causeway-apps") && log.contains("hc8-apps"),
        "no warning naming what was left behind:\n{log}"
    );
    kube_cluster::start_apiserver(h);
    let services: Api<Service> = Api::namespaced(hosted.clone(), "openshift-ingress");
    assert!(
        services.get_opt("causeway-apps").await.unwrap().is_some(),
        "the router Service should be left behind in the unreachable cluster"
    );
    assert!(subscriptions
        .get_opt("metallb-operator")
        .await
        .unwrap()
        .is_some());
}

/// The Infra's objects on the management side, by kind, name and UID.
async fn management_objects(client: &kube::Client) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    for o in configs.list(&Default::default()).await.unwrap().items {
        out.push((
            "ConfigMap".into(),
            o.name_any(),
            o.uid().unwrap_or_default(),
        ));
    }
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), NS);
    for o in deployments.list(&Default::default()).await.unwrap().items {
        out.push((
            "Deployment".into(),
            o.name_any(),
            o.uid().unwrap_or_default(),
        ));
    }
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), NS);
    for o in sets.list(&Default::default()).await.unwrap().items {
        out.push((
            "StatefulSet".into(),
            o.name_any(),
            o.uid().unwrap_or_default(),
        ));
    }
    out.sort();
    out
}
