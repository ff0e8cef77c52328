//! Taking over a running Go Infra operator install (its G3 generation: the
//! Infra with `proxy.externalService`, attachments with apps ingress and
//! its finalizer), by docs/operator.md's migration steps, on a real API
//! server. The Go operator's objects are made here as it makes them,
//! field by field, from its source (cldmnky/oooi `appsingress.go` and
//! `infraclusterattachment_controller.go` @d29411d, `infra_types.go`
//! @d29411d): created (not applied) under its own field manager, with no
//! label of causeway's, MetalLB installed by OLM in `openshift-operators`
//! with its pool and advertisement beside it, and the router Service
//! `oooi-ingress` holding its address from MetalLB.
//!
//! Afterwards: no second router Service, pool or advertisement anywhere
//! (the same objects, by UID, taken over), the apps address held by one
//! Service from one announced pool at every sampled instant, nothing of
//! the Infra's spec pruned, the external Service taken over with the OAuth
//! names published, and a migrated attachment's deletion completing with
//! the cleanup the Go finalizer stood for.
//!
//! The hosted cluster is a second API server of its own, reached through
//! HyperShift's admin kubeconfig Secret.
//!
//! Needs root (the API server binaries are built into /var/cache by
//! tests/run.sh); without them the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use causeway_operator::infra::attachment::InfraClusterAttachment;
use causeway_operator::infra::crd::Infra;
use causeway_operator::k8s::resources::resource;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use kube_cluster::{
    admin_kubeconfig_secret, eventually, install_fixture_crds, metallb, network_attachment,
    ready_node, Operator, HOSTED_CLUSTER_CRD, METALLB_CRDS, METALLB_OPERATOR_CRD, NAD_CRD,
    OLM_SUBSCRIPTION_CRD,
};
const WAIT: Duration = Duration::from_secs(60);
/// The Go operator's field manager (its binary's name).
const GO_MANAGER: &str = "oooi";
const NS: &str = "clusters";
const CONTROL_PLANE: &str = "clusters-hc9";
const OLM_NS: &str = "openshift-operators";
const ROUTER_NS: &str = "openshift-ingress";
const POOL_RANGE: &str = "192.168.100.220-192.168.100.229";

/// A G3 Infra as its users wrote it, `proxy.externalService` included.
fn go_infra() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
        "metadata": {"name": "vlan100", "namespace": NS},
        "spec": {
            "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1",
                "networkAttachmentDefinition": "vlan100", "dnsServers": ["192.0.2.53"]},
            "infraComponents": {
                "dhcp": {"enabled": true, "serverIP": "192.168.100.2", "rangeStart": "192.168.100.100",
                    "rangeEnd": "192.168.100.199", "leaseTime": "1h"},
                "dns": {"enabled": true, "serverIP": "192.168.100.3"},
                "proxy": {"enabled": true, "serverIP": "192.168.100.4",
                    "proxyImage": "envoyproxy/envoy:v1.36.4", "managerImage": "quay.io/cldmnky/oooi:latest",
                    "externalService": {"enabled": true, "addressPoolName": "public",
                        "labels": {"external-dns.example.com/publish": "yes"},
                        "annotations": {"external-dns.alpha.kubernetes.io/hostname": "api.hc9.example.net"},
                        "publishAttachmentOAuths": true}}}}})
}

fn pools_resource() -> ApiResource {
    causeway_operator::k8s::resources::ip_address_pool_resource()
}

fn l2_resource() -> ApiResource {
    causeway_operator::k8s::resources::l2_advertisement_resource()
}

/// Made as the Go operator makes its objects: created, under its manager.
async fn go_create(client: &Client, r: &ApiResource, ns: &str, obj: serde_json::Value) -> String {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, r);
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    let made = api
        .create(
            &PostParams {
                field_manager: Some(GO_MANAGER.into()),
                ..PostParams::default()
            },
            &obj,
        )
        .await
        .unwrap();
    made.uid().unwrap()
}

fn uid_of(o: &DynamicObject) -> String {
    o.metadata.uid.clone().unwrap_or_default()
}

/// Every object of `r` in every namespace, as `namespace/name`.
async fn everywhere(client: &Client, r: &ApiResource) -> Vec<(String, String)> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), r);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| {
            (
                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                uid_of(o),
            )
        })
        .collect()
}

/// What holds the apps address right now: the LoadBalancer Services
/// showing it, and whether one pool in MetalLB's namespace, announced by an
/// L2Advertisement there, covers it. `None` when it is held once and
/// announced.
async fn apps_address_trouble(client: &Client, address: &str) -> Option<String> {
    let services: Api<Service> = Api::all(client.clone());
    let holders: Vec<String> = services
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .is_some_and(|i| i.iter().any(|e| e.ip.as_deref() == Some(address)))
        })
        .map(|s| format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    if holders.len() != 1 {
        return Some(format!("{address} held by {holders:?}"));
    }
    let pools = everywhere(client, &pools_resource()).await;
    if pools.len() != 1 {
        return Some(format!("pools {pools:?}"));
    }
    let l2: Api<DynamicObject> = Api::namespaced_with(client.clone(), OLM_NS, &l2_resource());
    let announcing = l2
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .iter()
        .filter(|a| a.data["spec"]["ipAddressPools"] == serde_json::json!(["hc9-apps"]))
        .count();
    (announcing != 1).then(|| format!("{announcing} advertisements announce hc9-apps"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_operator_install_is_taken_over_without_a_duplicate_or_a_lost_field() {
    const TEST: &str = "a_go_operator_install_is_taken_over_without_a_duplicate_or_a_lost_field";
    let Some((c, client)) = kube_cluster::with_apps_ingress(TEST, &[NS, CONTROL_PLANE]).await
    else {
        return;
    };
    // The hosted cluster, an API server of its own: MetalLB, its pool and
    // the router live there.
    let Some(h) =
        kube_cluster::hosted_cluster("oooi_migration_kube", TEST, "DNS:api.hc9.example.net")
    else {
        return;
    };
    let hosted = kube_cluster::admin(h).await;
    for n in [ROUTER_NS, OLM_NS] {
        kube_cluster::ensure_namespace(&hosted, n).await;
    }
    install_fixture_crds(&client, &[NAD_CRD, HOSTED_CLUSTER_CRD]).await;
    install_fixture_crds(
        &hosted,
        &[OLM_SUBSCRIPTION_CRD, METALLB_CRDS, METALLB_OPERATOR_CRD],
    )
    .await;
    network_attachment(&client, NS, "vlan100").await;
    let kubeconfig =
        causeway_operator::k8s::manifest::token_kubeconfig(&h.server, &h.ca, &h.admin_token);
    admin_kubeconfig_secret(&client, NS, "hc9", kubeconfig).await;
    ready_node(&hosted, "hc9-worker-0").await;

    // What the Go operator left: the Infra and an attachment carrying its
    // finalizer, as its users and it wrote them.
    let infras: Api<Infra> = Api::namespaced(client.clone(), NS);
    let infra_written = go_infra();
    go_create(
        &client,
        &resource(
            "hostedcluster.densityops.com",
            "v1alpha1",
            "Infra",
            "infras",
        ),
        NS,
        infra_written.clone(),
    )
    .await;
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), NS);
    go_create(
        &client,
        &resource(
            "hostedcluster.densityops.com",
            "v1alpha1",
            "InfraClusterAttachment",
            "infraclusterattachments",
        ),
        NS,
        serde_json::json!({
            "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "InfraClusterAttachment",
            "metadata": {"name": "hc9", "namespace": NS,
                "finalizers": ["hostedcluster.densityops.com/apps-ingress-cleanup"]},
            "spec": {"infraRef": {"name": "vlan100"},
                "hostedClusterRef": {"name": "hc9", "namespace": NS},
                "dns": {"clusterName": "hc9", "baseDomain": "example.net"},
                "appsIngress": {"enabled": true,
                    "metallb": {"addressPoolName": "hc9-apps", "ipAddressPoolRange": POOL_RANGE},
                    "service": {"annotations": {"external-dns.alpha.kubernetes.io/hostname": "*.apps.hc9.example.net."}}}}}),
    )
    .await;
    // In the hosted cluster, in the Go operator's order: MetalLB's
    // Subscription and the MetalLB resource (no spec at all), the pool and
    // its advertisement, all in openshift-operators; the router Service
    // with the pool's annotation then the user's.
    let subscription = resource(
        "operators.coreos.com",
        "v1alpha1",
        "Subscription",
        "subscriptions",
    );
    let metallb_kind = resource("metallb.io", "v1beta1", "MetalLB", "metallbs");
    let go_uids = [
        go_create(
            &hosted,
            &subscription,
            OLM_NS,
            serde_json::json!({
            "apiVersion": "operators.coreos.com/v1alpha1", "kind": "Subscription",
            "metadata": {"name": "metallb-operator", "namespace": OLM_NS},
            "spec": {"channel": "stable", "name": "metallb-operator", "source": "redhat-operators",
                "sourceNamespace": "openshift-marketplace", "installPlanApproval": "Automatic"}}),
        )
        .await,
        go_create(
            &hosted,
            &metallb_kind,
            OLM_NS,
            serde_json::json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "MetalLB",
            "metadata": {"name": "metallb", "namespace": OLM_NS}}),
        )
        .await,
        go_create(
            &hosted,
            &pools_resource(),
            OLM_NS,
            serde_json::json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "hc9-apps", "namespace": OLM_NS},
            "spec": {"autoAssign": true, "addresses": [POOL_RANGE]}}),
        )
        .await,
        go_create(
            &hosted,
            &l2_resource(),
            OLM_NS,
            serde_json::json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "L2Advertisement",
            "metadata": {"name": "advertise-hc9-apps", "namespace": OLM_NS},
            "spec": {"ipAddressPools": ["hc9-apps"]}}),
        )
        .await,
    ];
    let router_service = ApiResource::erase::<Service>(&());
    let router_uid = go_create(&hosted, &router_service, ROUTER_NS, serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "oooi-ingress", "namespace": ROUTER_NS,
            "annotations": {"metallb.universe.tf/address-pool": "hc9-apps",
                "external-dns.alpha.kubernetes.io/hostname": "*.apps.hc9.example.net."}},
        "spec": {"type": "LoadBalancer",
            "selector": {"ingresscontroller.operator.openshift.io/deployment-ingresscontroller": "default"},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80},
                      {"name": "https", "protocol": "TCP", "port": 443, "targetPort": 443}]}})).await;
    let given = metallb::allocate(
        &hosted,
        metallb::Installed::Operator,
        OLM_NS,
        ROUTER_NS,
        "oooi-ingress",
    )
    .await
    .unwrap();
    assert_eq!(
        (given.address.to_string().as_str(), given.announced),
        ("192.168.100.220", true)
    );
    let apps_address = given.address.to_string();
    // The Go operator's policy in the control-plane namespace (no owner,
    // no label), and its external Service for the Infra: its name, type,
    // port and pool as the Go operator documents them; its selector (the
    // Go proxy pods' label) inferred.
    let go_policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "allow-infrastructure", "namespace": CONTROL_PLANE},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels":
                {"hostedcluster.densityops.com/network-policy-group": "infrastructure"}}}]}]}}))
    .unwrap();
    Api::<NetworkPolicy>::namespaced(client.clone(), CONTROL_PLANE)
        .create(
            &PostParams {
                field_manager: Some(GO_MANAGER.into()),
                ..PostParams::default()
            },
            &go_policy,
        )
        .await
        .unwrap();
    let external_uid = go_create(
        &client,
        &router_service,
        NS,
        serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "vlan100-proxy-external", "namespace": NS,
            "labels": {"external-dns.example.com/publish": "yes"},
            "annotations": {"metallb.universe.tf/address-pool": "public",
                "external-dns.alpha.kubernetes.io/hostname": "api.hc9.example.net"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "proxy-server"},
            "ports": [{"name": "proxy", "protocol": "TCP", "port": 443, "targetPort": 443}]}}),
    )
    .await;
    let services_here: Api<Service> = Api::namespaced(client.clone(), NS);
    services_here
        .patch_status(
            "vlan100-proxy-external",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}})),
        )
        .await
        .unwrap();
    assert!(apps_address_trouble(&hosted, &apps_address).await.is_none());

    // The apps address is sampled from before causeway starts until the
    // end of the takeover: at every instant one Service holds it and one
    // advertisement announces its pool.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let client = hosted.clone();
        let sampling = sampling.clone();
        let address = apps_address.clone();
        tokio::spawn(async move {
            let mut samples = 0u32;
            let mut trouble = Vec::new();
            while sampling.load(Ordering::Relaxed) && samples < 2000 {
                if let Some(t) = apps_address_trouble(&client, &address).await {
                    trouble.push(t);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (samples, trouble)
        })
    };

    // causeway's operator takes over (the Go operator is gone, as the
    // migration steps have it).
    let op = Operator::start(
        c,
        &[NS, CONTROL_PLANE],
        &["--leader-election=false", "--hosted-apiserver=kubeconfig"],
        "takeover",
    );
    let s = eventually("apps ingress Ready", WAIT, Some(&op), || async {
        let a = attachments.get("hc9").await.ok()?;
        let s = a.status?.apps_ingress_status?;
        (s.reason == "ReconciliationSucceeded").then_some(s)
    })
    .await;
    assert_eq!(s.external_ip.as_deref(), Some(apps_address.as_str()));
    let applied = s.applied.clone().unwrap();
    assert_eq!(
        (
            applied.service_name.as_str(),
            applied.metallb_namespace.as_str(),
            applied.installed_metallb
        ),
        ("oooi-ingress", OLM_NS, true)
    );

    // The same objects, taken over: nothing made beside them.
    let router: Api<Service> = Api::namespaced(hosted.clone(), ROUTER_NS);
    let svc = router.get("oooi-ingress").await.unwrap();
    assert_eq!(svc.uid().unwrap(), router_uid);
    let managers: Vec<String> = svc
        .managed_fields()
        .iter()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(
        managers.contains(&"causeway-apps-ingress".to_string()),
        "{managers:?}"
    );
    assert!(router.get_opt("causeway-apps").await.unwrap().is_none());
    assert_eq!(
        everywhere(&hosted, &pools_resource()).await,
        vec![(format!("{OLM_NS}/hc9-apps"), go_uids[2].clone())]
    );
    assert_eq!(
        everywhere(&hosted, &l2_resource()).await,
        vec![(format!("{OLM_NS}/advertise-hc9-apps"), go_uids[3].clone())]
    );
    assert_eq!(
        everywhere(&hosted, &metallb_kind).await,
        vec![(format!("{OLM_NS}/metallb"), go_uids[1].clone())]
    );
    assert_eq!(
        everywhere(&hosted, &subscription).await,
        vec![(format!("{OLM_NS}/metallb-operator"), go_uids[0].clone())]
    );

    // Nothing of the Infra's spec pruned: read back as written.
    let stored = serde_json::to_value(infras.get("vlan100").await.unwrap()).unwrap();
    assert_eq!(
        stored["spec"]["infraComponents"]["proxy"]["externalService"],
        infra_written["spec"]["infraComponents"]["proxy"]["externalService"]
    );
    for path in [
        "/spec/networkConfig",
        "/spec/infraComponents/dhcp",
        "/spec/infraComponents/dns",
    ] {
        assert_eq!(
            stored.pointer(path),
            infra_written.pointer(path),
            "{path} changed in storage"
        );
    }

    // The Infra's external Service: the Go operator's, taken over (same
    // object, its load balancer address kept), now selecting causeway's
    // proxy pods on the port carrying 443's routes, and publishing the
    // Ready attachment's OAuth name after the user's.
    let external = eventually(
        "the external Service taken over, with the OAuth name",
        WAIT,
        Some(&op),
        || async {
            let svc = services_here.get("vlan100-proxy-external").await.ok()?;
            let names = svc
                .annotations()
                .get("external-dns.alpha.kubernetes.io/hostname")?;
            (names == "api.hc9.example.net,oauth.hc9.example.net").then_some(svc)
        },
    )
    .await;
    assert_eq!(external.uid().unwrap(), external_uid);
    assert_eq!(
        external.annotations()["metallb.universe.tf/address-pool"],
        "public"
    );
    let spec = external.spec.clone().unwrap();
    assert_eq!(
        spec.selector
            .unwrap()
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some("proxy")
    );
    let ports = spec.ports.unwrap();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(
        (ports[0].port, ports[0].target_port.clone()),
        (
            443,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443))
        )
    );
    assert_eq!(
        external
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .and_then(|i| i.first().and_then(|e| e.ip.clone()))
            .as_deref(),
        Some("198.51.100.7")
    );

    // Two seconds more of the settled state (an observation window: a
    // second owner or a re-announce would show up in it), then the verdict.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sampling.store(false, Ordering::Relaxed);
    let (samples, trouble) = sampler.await.unwrap();
    assert!(samples >= 10, "only {samples} samples");
    println!("the apps address sampled {samples} times over the takeover");
    assert!(trouble.is_empty(), "over {samples} samples: {trouble:?}");

    // The migrated attachment deleted: the cleanup its Go finalizer stood
    // for (the hosted objects, in the Go operator's namespaces, and its
    // policy), causeway's own, then it goes.
    let finalizers = attachments.get("hc9").await.unwrap().finalizers().to_vec();
    assert!(
        finalizers.contains(&"hostedcluster.densityops.com/apps-ingress-cleanup".to_string())
            && finalizers.contains(&"causeway.io/attachment-cleanup".to_string()),
        "{finalizers:?}"
    );
    attachments
        .delete("hc9", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the migrated attachment gone", WAIT, Some(&op), || async {
        attachments
            .get_opt("hc9")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(router.get_opt("oooi-ingress").await.unwrap().is_none());
    for r in [
        &pools_resource(),
        &l2_resource(),
        &metallb_kind,
        &subscription,
    ] {
        assert_eq!(everywhere(&hosted, r).await, vec![], "{} left", r.kind);
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), CONTROL_PLANE);
    assert!(policies
        .get_opt("allow-infrastructure")
        .await
        .unwrap()
        .is_none());
    assert!(policies
        .get_opt("causeway-proxy-clusters-vlan100")
        .await
        .unwrap()
        .is_none());
    let log = op.log_text();
    assert!(
        log.contains("released the Go operator's finalizer"),
        "{log}"
    );
}

/// The Go operator's two CRDs as its `make deploy` leaves them, from its
/// `config/crd/bases` (read at cldmnky/oooi 04f64c1): generated by
/// controller-gen v0.18.0, whose version annotation is their only
/// metadata, applied with `kubectl apply`, so no Helm label or annotation.
/// That metadata is what Helm's ownership check reads; the schema is
/// causeway's, which `operator_kube go_operator_manifests_mean_what_they_meant`
/// holds to the Go operator's manifests.
fn go_crd_file(dir: &std::path::Path) -> std::path::PathBuf {
    use kube::CustomResourceExt;
    let mut docs = Vec::new();
    for mut crd in [
        serde_json::to_value(Infra::crd()).unwrap(),
        serde_json::to_value(InfraClusterAttachment::crd()).unwrap(),
    ] {
        crd["metadata"]["annotations"] =
            serde_json::json!({"controller-gen.kubebuilder.io/version": "v0.18.0"});
        docs.push(serde_json::to_string(&crd).unwrap());
    }
    let path = dir.join("go-crds.json");
    std::fs::write(
        &path,
        format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [{}]}}",
            docs.join(",")
        ),
    )
    .unwrap();
    path
}

const GO_CRDS: [&str; 2] = [
    "infras.hostedcluster.densityops.com",
    "infraclusterattachments.hostedcluster.densityops.com",
];

/// docs/operator.md's migration, from the CRDs' side, with helm itself:
/// the chart cannot be installed over the Go operator's CRDs until they
/// are handed to its release, and once they are, the CRDs and the Infras
/// are the same objects afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_operators_crds_are_handed_to_the_chart_and_its_infras_kept() {
    const TEST: &str = "the_go_operators_crds_are_handed_to_the_chart_and_its_infras_kept";
    let Some(c) = kube_cluster::bare_cluster("oooi_migration_kube", TEST) else {
        return;
    };
    let client = kube_cluster::admin(c).await;
    let tools = kube_cluster::helm::Tools::new(c);
    let dir = tempfile::tempdir().unwrap();
    let kubectl = |args: &[&str]| {
        let out = tools.kubectl(args).unwrap_or_else(|| {
            panic!("{TEST}: no kubectl (tests/run.sh installs kubernetes-client)")
        });
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // The Go operator's install: its CRDs, and an Infra its user applied.
    let crd_file = go_crd_file(dir.path());
    kubectl(&["apply", "-f", crd_file.to_str().unwrap()]);
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let mut crd_uids = Vec::new();
    for crd in GO_CRDS {
        let served = eventually("the Go CRD established", WAIT, None, || async {
            crds.get(crd).await.ok().filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
            })
        })
        .await;
        crd_uids.push(served.metadata.uid.clone().unwrap());
    }
    kube_cluster::ensure_namespace(&client, NS).await;
    let infra_file = dir.path().join("infra.json");
    std::fs::write(&infra_file, go_infra().to_string()).unwrap();
    kubectl(&["apply", "-f", infra_file.to_str().unwrap()]);
    let infras: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<Infra>(&()));
    let before = infras.get("vlan100").await.unwrap();

    let chart_copy = kube_cluster::helm::chart_for_1_20(dir.path());
    let install = [
        "install",
        "causeway",
        chart_copy.to_str().unwrap(),
        "--namespace",
        "causeway-system",
        "--create-namespace",
        "--force-conflicts",
        // Nothing here serves the webhook (no kubelet runs the pod).
        "--set",
        "webhook.enabled=false",
    ];
    // Without the hand-over helm refuses, and nothing changes.
    let refused = tools.helm(&install);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "helm installed over the Go CRDs");
    assert!(
        stderr.contains("invalid ownership metadata")
            && stderr.contains("hostedcluster.densityops.com"),
        "{stderr}"
    );
    for (crd, uid) in GO_CRDS.iter().zip(&crd_uids) {
        assert_eq!(
            crds.get(crd).await.unwrap().metadata.uid.as_ref(),
            Some(uid)
        );
    }

    // docs/operator.md's hand-over, its commands as written there.
    for crd in GO_CRDS {
        kubectl(&[
            "annotate",
            "crd",
            crd,
            "--overwrite",
            "meta.helm.sh/release-name=causeway",
            "meta.helm.sh/release-namespace=causeway-system",
        ]);
        kubectl(&[
            "label",
            "crd",
            crd,
            "--overwrite",
            "app.kubernetes.io/managed-by=Helm",
        ]);
    }
    tools.helm_ok(&install);
    for (crd, uid) in GO_CRDS.iter().zip(&crd_uids) {
        let live = crds.get(crd).await.unwrap();
        assert_eq!(live.metadata.uid.as_ref(), Some(uid), "{crd} re-created");
        assert_eq!(live.annotations()["meta.helm.sh/release-name"], "causeway");
    }
    let after = infras.get("vlan100").await.unwrap();
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "the Infra was re-created"
    );
    assert_eq!(
        after.data["spec"], before.data["spec"],
        "the Infra's spec changed"
    );
    assert_eq!(
        after.data["spec"]["infraComponents"]["proxy"]["externalService"]
            ["publishAttachmentOAuths"],
        serde_json::json!(true)
    );
}
