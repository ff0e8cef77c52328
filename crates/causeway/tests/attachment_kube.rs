//! InfraClusterAttachments against a real API server (tests/kube), with
//! the chart's CRDs and RBAC and the real `causeway operator` binary: one
//! Infra's DHCP, DNS and proxy serving two hosted clusters, each conflict
//! kind reported on both sides and settled when one side goes, worker
//! addresses claimed twice routed for neither, and an attachment's
//! finalizer cleaning up its control-plane namespace.
//!
//! The rendered configs are read back as the pods read them
//! (`causeway_config::Config::from_yaml`), so what is asserted is what the
//! data plane would serve; the data plane itself serving two clusters is
//! `clusters_lab`'s.
//!
//! Needs root (the API server binaries are built into /var/cache by
//! tests/run.sh); without them the test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::time::Duration;

use causeway_config::{Config, ListenerKind};
use causeway_operator::infra::attachment::InfraClusterAttachment;
use causeway_operator::infra::crd::Infra;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use kube_cluster::{admin, apply_yaml, eventually, metallb, wait_established, Operator};

const NAD_CRD: &str = include_str!("../../../tests/kube/crds/network-attachment-definition.yaml");
const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "tenants";
const INFRA: &str = "vlan100";
const POLICY: &str = "causeway-proxy-tenants-vlan100";

/// An Infra of the newer form: no cluster named on it.
const SHARED_INFRA: &str = r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {name: vlan100, namespace: tenants}
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

fn attachment(name: &str, hc: &str, cluster: &str, domain: &str, workers: &[&str]) -> String {
    let workers: Vec<String> = workers.iter().map(|w| format!("\"{w}\"")).collect();
    format!(
        "apiVersion: hostedcluster.densityops.com/v1alpha1\nkind: InfraClusterAttachment\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  infraRef: {{name: {INFRA}}}\n  hostedClusterRef: {{name: {hc}, namespace: clusters}}\n  dns: {{clusterName: {cluster}, baseDomain: {domain}}}\n  workers: [{}]\n",
        workers.join(", ")
    )
}

fn config_of(cm: &ConfigMap) -> Config {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .cloned()
        .unwrap_or_default();
    Config::from_yaml(&text).unwrap_or_else(|e| panic!("rendered config invalid: {e}\n{text}"))
}

/// The proxy's routes on `port`, as "label -> upstream".
fn routes(cfg: &Config, port: u16) -> Vec<String> {
    let Some(p) = &cfg.proxy else {
        return Vec::new();
    };
    p.listeners
        .iter()
        .filter(|l| l.listen.port() == port)
        .flat_map(|l| match &l.kind {
            ListenerKind::Plain(u) => vec![format!("* -> {u}")],
            ListenerKind::Sni { routes, .. } => routes
                .iter()
                .map(|r| format!("{} -> {}", r.label, r.upstream))
                .collect(),
        })
        .collect()
}

/// Applies `spec` to attachment `name` as its owner would.
async fn set_spec(attachments: &Api<InfraClusterAttachment>, name: &str, spec: serde_json::Value) {
    attachments
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "hostedcluster.densityops.com/v1alpha1",
                "kind": "InfraClusterAttachment",
                "spec": spec,
            })),
        )
        .await
        .unwrap();
}

/// b's spec, with `external` as its externalService switch.
fn b_spec(external: bool) -> serde_json::Value {
    serde_json::json!({"infraRef": {"name": INFRA},
        "hostedClusterRef": {"name": "hc2", "namespace": "clusters"},
        "dns": {"clusterName": "hc2", "baseDomain": "example.org"},
        "workers": ["192.168.100.30"],
        "externalService": {"enabled": external, "addressPoolName": "public",
            "labels": {"external-dns.example.com/publish": "yes"},
            "annotations": {"external-dns.alpha.kubernetes.io/hostname": "oauth.hc2.example.org."}}})
}

/// Waits until the proxy's rendered config satisfies `want`.
async fn proxy_config(
    client: &Client,
    op: &Operator,
    what: &str,
    want: impl Fn(&Config) -> bool,
) -> Config {
    proxy_config_in(client, NS, op, what, want).await
}

/// The same in namespace `ns`.
async fn proxy_config_in(
    client: &Client,
    ns: &str,
    op: &Operator,
    what: &str,
    want: impl Fn(&Config) -> bool,
) -> Config {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    eventually(what, WAIT, Some(op), || async {
        let cfg = config_of(&cms.get_opt("vlan100-proxy-config").await.ok()??);
        want(&cfg).then_some(cfg)
    })
    .await
}

/// (status, reason, message) of an attachment's condition.
async fn attachment_condition(
    client: &Client,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let api: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), NS);
    let a = api.get_opt(name).await.ok()??;
    let status = a.status?;
    if status.observed_generation != a.metadata.generation {
        return None;
    }
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_attachment(
    client: &Client,
    op: &Operator,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    eventually(
        &format!("attachment {name}: {type_}={status} ({reason})"),
        WAIT,
        Some(op),
        || async {
            let (s, r, m) = attachment_condition(client, name, type_).await?;
            (s == status && r == reason).then_some(m)
        },
    )
    .await
}

async fn policy_in(client: &Client, ns: &str) -> bool {
    Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .get_opt(POLICY)
        .await
        .unwrap()
        .is_some()
}

async fn wait_policy(client: &Client, op: &Operator, ns: &str, present: bool) {
    eventually(
        &format!("policy {ns}/{POLICY} present={present}"),
        WAIT,
        Some(op),
        || async { (policy_in(client, ns).await == present).then_some(()) },
    )
    .await;
}

async fn infra_condition(client: &Client, type_: &str) -> Option<(String, String, String)> {
    let api: Api<Infra> = Api::namespaced(client.clone(), NS);
    let i = api.get(INFRA).await.ok()?;
    let status = i.status?;
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_infra_serves_two_clusters_and_reports_and_settles_every_conflict() {
    let Some(c) = kube_cluster::cluster(
        "one_infra_serves_two_clusters_and_reports_and_settles_every_conflict",
    ) else {
        return;
    };
    let client = admin(c).await;
    for ns in [NS, "clusters-hc1", "clusters-hc2"] {
        kube_cluster::ensure_namespace(&client, ns).await;
    }
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    apply_yaml(
        &client,
        &format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: vlan100, namespace: {NS}}}\nspec:\n  config: '{{\"cniVersion\":\"0.3.1\",\"type\":\"macvlan\",\"master\":\"eth1\",\"ipam\":{{\"type\":\"static\"}}}}'\n"),
        NS,
    )
    .await
    .unwrap();
    // The control-plane namespaces are watched too, so a policy left in
    // one by a change of what is served is seen and removed.
    let op = Operator::start(
        c,
        &[NS, "clusters-hc1", "clusters-hc2"],
        &["--leader-election=false"],
        "attachments",
    );
    apply_yaml(&client, SHARED_INFRA, NS).await.unwrap();

    // No cluster yet: DNS forwards, the proxy waits and says why.
    let (status, _, message) = eventually("ProxyReady=False", WAIT, Some(&op), || async {
        infra_condition(&client, "ProxyReady")
            .await
            .filter(|(s, _, _)| s == "False")
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("InfraClusterAttachment"),
        "the proxy's condition does not say what it waits for: {message}"
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let dns = eventually("the DNS config", WAIT, Some(&op), || async {
        cms.get_opt("vlan100-dns-config").await.ok()?
    })
    .await;
    let dns = config_of(&dns).dns.unwrap();
    assert_eq!(dns.zone, None);
    assert_eq!(dns.upstreams, vec!["192.0.2.53:53".parse().unwrap()]);
    assert!(cms.get_opt("vlan100-proxy-config").await.unwrap().is_none());

    // Two attachments: one stack serves both, each cluster routed to its
    // own control-plane namespace, each namespace letting the proxy in.
    apply_yaml(
        &client,
        &attachment("a", "hc1", "hc1", "example.com", &["192.168.100.20"]),
        NS,
    )
    .await
    .unwrap();
    apply_yaml(
        &client,
        &attachment("b", "hc2", "hc2", "example.org", &["192.168.100.30"]),
        NS,
    )
    .await
    .unwrap();
    let cfg = proxy_config(&client, &op, "both clusters routed", |cfg| {
        cfg.clusters.len() == 2
    })
    .await;
    let api = routes(&cfg, 6443);
    for want in [
        "api.hc1.example.com -> kube-apiserver.clusters-hc1.svc:6443",
        "api-int.hc1.example.com -> kube-apiserver.clusters-hc1.svc:6443",
        "api.hc2.example.org -> kube-apiserver.clusters-hc2.svc:6443",
        "from 192.168.100.20/32 -> kube-apiserver.clusters-hc1.svc:6443",
        "from 192.168.100.30/32 -> kube-apiserver.clusters-hc2.svc:6443",
    ] {
        assert!(api.contains(&want.to_string()), "{want} not in {api:?}");
    }
    let tls = routes(&cfg, 443);
    for want in [
        "oauth.hc1.example.com -> oauth-openshift.clusters-hc1.svc:6443",
        "ignition.hc2.example.org -> ignition-server-proxy.clusters-hc2.svc:443",
        "kubernetes.default.svc from 192.168.100.30/32 -> kube-apiserver.clusters-hc2.svc:6443",
    ] {
        assert!(tls.contains(&want.to_string()), "{want} not in {tls:?}");
    }
    let dns = eventually("DNS answers both zones", WAIT, Some(&op), || async {
        let d = config_of(&cms.get_opt("vlan100-dns-config").await.ok()??).dns?;
        (d.zone.is_some() && !d.other_zones.is_empty()).then_some(d)
    })
    .await;
    assert_eq!(dns.zone.as_deref(), Some("hc1.example.com."));
    assert_eq!(dns.other_zones, vec!["hc2.example.org.".to_string()]);
    wait_policy(&client, &op, "clusters-hc1", true).await;
    wait_policy(&client, &op, "clusters-hc2", true).await;
    for name in ["a", "b"] {
        wait_attachment(
            &client,
            &op,
            name,
            "Ready",
            "True",
            "ReconciliationSucceeded",
        )
        .await;
    }
    let a: InfraClusterAttachment = Api::namespaced(client.clone(), NS).get("a").await.unwrap();
    let status = a.status.unwrap();
    assert_eq!(status.domain.as_deref(), Some("hc1.example.com"));
    assert_eq!(
        status.control_plane_namespace.as_deref(),
        Some("clusters-hc1")
    );
    assert_eq!(status.routed_workers, vec!["192.168.100.20/32".to_string()]);
    assert!(a
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&"causeway.io/attachment-cleanup".to_string()));
    let infra: Infra = Api::namespaced(client.clone(), NS)
        .get(INFRA)
        .await
        .unwrap();
    let counts = infra.status.unwrap().attachments.unwrap();
    assert_eq!((counts.total, counts.ready), (2, 2));

    // A second attachment for hc2's HostedCluster: both sides leave, both
    // named; hc1 is untouched.
    apply_yaml(
        &client,
        &attachment("c", "hc2", "other", "example.org", &[]),
        NS,
    )
    .await
    .unwrap();
    for name in ["b", "c"] {
        let m = wait_attachment(
            &client,
            &op,
            name,
            "Ready",
            "False",
            "DuplicateHostedCluster",
        )
        .await;
        assert_eq!(
            m,
            "attachments \"b\" and \"c\" declare HostedCluster clusters/hc2"
        );
    }
    let cfg = proxy_config(&client, &op, "only hc1 routed", |cfg| {
        cfg.clusters.len() == 1
    })
    .await;
    assert_eq!(cfg.clusters[0].domain(), "hc1.example.com");
    wait_policy(&client, &op, "clusters-hc2", false).await;
    // The Infra's status is written by its own reconcile, which may come
    // after the attachments' and the proxy's config (a CI run read it
    // still "True, Served" right after the config changed).
    let message = eventually(
        "the Infra's Attachments condition False (DuplicateHostedCluster)",
        WAIT,
        Some(&op),
        || async {
            let (s, reason, message) = infra_condition(&client, "Attachments").await?;
            (s == "False" && reason == "DuplicateHostedCluster").then_some(message)
        },
    )
    .await;
    assert!(
        message.starts_with("1 of 3 attachments served"),
        "{message}"
    );

    // The other side goes: b is served again.
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), NS);
    attachments
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    wait_attachment(
        &client,
        &op,
        "b",
        "Ready",
        "True",
        "ReconciliationSucceeded",
    )
    .await;
    proxy_config(&client, &op, "hc2 routed again", |cfg| {
        cfg.clusters.len() == 2
    })
    .await;
    wait_policy(&client, &op, "clusters-hc2", true).await;

    // One domain twice.
    apply_yaml(
        &client,
        &attachment("d", "hc4", "hc1", "example.com", &[]),
        NS,
    )
    .await
    .unwrap();
    let m = wait_attachment(&client, &op, "d", "Ready", "False", "DuplicateHostname").await;
    assert_eq!(
        m,
        "attachments \"a\" and \"d\" declare domain hc1.example.com"
    );
    wait_attachment(&client, &op, "a", "Ready", "False", "DuplicateHostname").await;
    attachments
        .delete("d", &DeleteParams::default())
        .await
        .unwrap();
    wait_attachment(
        &client,
        &op,
        "a",
        "Ready",
        "True",
        "ReconciliationSucceeded",
    )
    .await;

    // One worker address in both lists: routed for neither, both clusters
    // still served by name.
    set_spec(
        &attachments,
        "a",
        serde_json::json!({"infraRef": {"name": INFRA},
            "hostedClusterRef": {"name": "hc1", "namespace": "clusters"},
            "dns": {"clusterName": "hc1", "baseDomain": "example.com"},
            "workers": ["192.168.100.20", "192.168.100.30"]}),
    )
    .await;
    for (name, other) in [("a", "b"), ("b", "a")] {
        let m = wait_attachment(
            &client,
            &op,
            name,
            "WorkersRouted",
            "False",
            "DuplicateSourceIP",
        )
        .await;
        assert_eq!(
            m,
            format!("worker 192.168.100.30/32 is claimed by attachment \"{other}\" too, so routed for neither")
        );
    }
    let cfg = proxy_config(&client, &op, "the shared worker unrouted", |cfg| {
        !routes(cfg, 6443)
            .iter()
            .any(|r| r.contains("192.168.100.30"))
    })
    .await;
    assert!(routes(&cfg, 6443)
        .contains(&"from 192.168.100.20/32 -> kube-apiserver.clusters-hc1.svc:6443".to_string()));
    assert_eq!(cfg.clusters.len(), 2);

    // An external Service for b: a LoadBalancer exposing 443 alone, to the
    // port where the proxy takes 443's routes on the pod network.
    set_spec(&attachments, "b", b_spec(true)).await;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), NS);
    let svc = eventually("b's external Service", WAIT, Some(&op), || async {
        services.get_opt("b-proxy-external").await.ok()?
    })
    .await;
    let spec = svc.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let ports: Vec<(i32, String)> = spec
        .ports
        .unwrap()
        .iter()
        .map(|p| (p.port, format!("{:?}", p.target_port)))
        .collect();
    assert_eq!(ports, vec![(443, "Some(Int(8443))".to_string())]);
    assert_eq!(
        spec.selector
            .unwrap()
            .get("app.kubernetes.io/component")
            .map(String::as_str),
        Some("proxy")
    );
    let annotations = svc.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["metallb.universe.tf/address-pool"], "public");
    assert_eq!(
        annotations["external-dns.alpha.kubernetes.io/hostname"],
        "oauth.hc2.example.org."
    );
    assert_eq!(
        svc.metadata.labels.clone().unwrap()["external-dns.example.com/publish"],
        "yes"
    );
    assert_eq!(svc.metadata.owner_references.unwrap()[0].name, "b");
    let cfg = proxy_config(&client, &op, "the proxy on the pod network's 8443", |cfg| {
        cfg.proxy.as_ref().is_some_and(|p| {
            p.listeners
                .iter()
                .any(|l| l.listen.to_string() == "0.0.0.0:8443")
        })
    })
    .await;
    assert_eq!(
        routes(&cfg, 8443),
        routes(&cfg, 443),
        "8443 takes 443's routes"
    );
    // Disabled: the Service goes, and the port with it.
    set_spec(&attachments, "b", b_spec(false)).await;
    eventually("b's external Service gone", WAIT, Some(&op), || async {
        services
            .get_opt("b-proxy-external")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    proxy_config(&client, &op, "no 8443 without an external Service", |cfg| {
        routes(cfg, 8443).is_empty()
    })
    .await;

    // An attachment deleted: its finalizer removes its namespace's policy,
    // and the Infra stops routing its cluster.
    attachments
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    wait_policy(&client, &op, "clusters-hc1", false).await;
    eventually("attachment a gone", WAIT, Some(&op), || async {
        attachments
            .get_opt("a")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let cfg = proxy_config(&client, &op, "only hc2 left", |cfg| cfg.clusters.len() == 1).await;
    assert_eq!(cfg.clusters[0].domain(), "hc2.example.org");
    assert!(policy_in(&client, "clusters-hc2").await);
}

/// The structured `networkConfig` forms through the real API server (the
/// CRD's schema) and operator: a secondary ClusterUserDefinedNetwork runs,
/// its pods given the NetworkAttachmentDefinition OVN-Kubernetes generates
/// in the attachment's namespace; a rule broken is reported by field and
/// makes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_network_forms_run_or_are_refused_by_field() {
    let Some(c) = kube_cluster::cluster("structured_network_forms_run_or_are_refused_by_field")
    else {
        return;
    };
    let client = admin(c).await;
    let ns = "structured";
    for n in [ns, "vlan-ns"] {
        kube_cluster::ensure_namespace(&client, n).await;
    }
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    // What OVN-Kubernetes generates for a ClusterUserDefinedNetwork in each
    // namespace it selects: a NAD of the network's name.
    apply_yaml(
        &client,
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: tenant-vlan-200, namespace: vlan-ns}\nspec:\n  config: '{\"cniVersion\":\"0.3.1\",\"type\":\"ovn-k8s-cni-overlay\",\"topology\":\"localnet\"}'\n",
        "vlan-ns",
    )
    .await
    .unwrap();
    let op = Operator::start(c, &[ns], &["--leader-election=false"], "structured");
    let infra = |name: &str, network: &str| {
        format!(
            "apiVersion: hostedcluster.densityops.com/v1alpha1\nkind: Infra\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  networkConfig:\n    cidr: 192.168.100.0/24\n    gateway: 192.168.100.1\n{network}  infraComponents:\n    dhcp: {{serverIP: 192.168.100.2, rangeStart: 192.168.100.100, rangeEnd: 192.168.100.199}}\n"
        )
    };
    apply_yaml(
        &client,
        &infra(
            "cudn",
            "    attachment: {kind: ClusterUserDefinedNetwork, name: tenant-vlan-200, namespace: vlan-ns}\n    topology: Localnet\n    role: Secondary\n    exposure: Layer2\n    ipam: DHCP\n",
        ),
        ns,
    )
    .await
    .unwrap();
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    let set = eventually("the DHCP StatefulSet", WAIT, Some(&op), || async {
        sets.get_opt("cudn-dhcp").await.ok()?
    })
    .await;
    let networks = set
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .and_then(|a| a.get("k8s.v1.cni.cncf.io/networks").cloned())
        .unwrap_or_default();
    let networks: serde_json::Value = serde_json::from_str(&networks).unwrap();
    assert_eq!(
        (
            networks[0]["namespace"].as_str(),
            networks[0]["name"].as_str()
        ),
        (Some("vlan-ns"), Some("tenant-vlan-200")),
        "pods not given the generated NAD: {networks}"
    );

    // A rule broken: Valid=False naming the field, nothing made.
    apply_yaml(
        &client,
        &infra(
            "layer3",
            "    attachment: {kind: NetworkAttachmentDefinition, name: tenant-vlan-200, namespace: vlan-ns}\n    topology: Layer3\n    role: Secondary\n    exposure: Layer2\n    ipam: DHCP\n",
        ),
        ns,
    )
    .await
    .unwrap();
    let api: Api<Infra> = Api::namespaced(client.clone(), ns);
    let message = eventually("layer3: Valid=False", WAIT, Some(&op), || async {
        let i = api.get("layer3").await.ok()?;
        let c = i
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Valid" && c.status == "False")?;
        Some(c.message)
    })
    .await;
    assert!(
        message.contains("networkConfig.topology: Layer3 is not supported"),
        "{message}"
    );
    assert!(sets.get_opt("layer3-dhcp").await.unwrap().is_none());
    // The schema refuses what is no value of its enums before the operator
    // sees it.
    let refused = apply_yaml(
        &client,
        &infra(
            "bogus",
            "    attachment: {kind: Bridge, name: x}\n    topology: Localnet\n    role: Secondary\n    exposure: Layer2\n    ipam: DHCP\n",
        ),
        ns,
    )
    .await
    .unwrap_err();
    assert!(refused.contains("Unsupported value"), "{refused}");
}

const MACHINE_CRD: &str = include_str!("../../../tests/kube/crds/capi-machine.yaml");

/// Sets a Machine's addresses as the Cluster API provider would.
async fn machine_addresses(client: &Client, ns: &str, name: &str, addresses: &[&str]) {
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &causeway_operator::k8s::resources::machine_resource(),
    );
    let list: Vec<serde_json::Value> = addresses
        .iter()
        .map(|a| serde_json::json!({"type": "InternalIP", "address": a}))
        .collect();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"addresses": list}})),
    )
    .await
    .unwrap();
}

/// Worker addresses from the hosted cluster's Cluster API Machines: those
/// inside the Infra's CIDR are routed by source, and follow a worker whose
/// address changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_addresses_become_routed_workers_and_follow_changes() {
    let Some(c) =
        kube_cluster::cluster("machine_addresses_become_routed_workers_and_follow_changes")
    else {
        return;
    };
    let client = admin(c).await;
    let ns = "machines";
    let cp = "clusters-hc5";
    for n in [ns, cp] {
        kube_cluster::ensure_namespace(&client, n).await;
    }
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    apply_yaml(&client, MACHINE_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    wait_established(&client, "machines.cluster.x-k8s.io").await;
    apply_yaml(
        &client,
        &format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: vlan100, namespace: {ns}}}\nspec:\n  config: '{{}}'\n"),
        ns,
    )
    .await
    .unwrap();
    let op = Operator::start(c, &[ns, cp], &["--leader-election=false"], "machines");
    apply_yaml(
        &client,
        &SHARED_INFRA.replace("namespace: tenants", &format!("namespace: {ns}")),
        ns,
    )
    .await
    .unwrap();
    apply_yaml(
        &client,
        &attachment("e", "hc5", "hc5", "example.net", &[])
            .replace("namespace: tenants", &format!("namespace: {ns}")),
        ns,
    )
    .await
    .unwrap();
    for (name, address) in [
        ("hc5-worker-a", "192.168.100.50"),
        ("hc5-worker-b", "10.128.0.5"),
    ] {
        apply_yaml(
            &client,
            &format!("apiVersion: cluster.x-k8s.io/v1beta1\nkind: Machine\nmetadata: {{name: {name}, namespace: {cp}, annotations: {{hypershift.openshift.io/nodePool: clusters/hc5}}}}\nspec: {{clusterName: hc5}}\n"),
            cp,
        )
        .await
        .unwrap();
        machine_addresses(&client, cp, name, &[address, "fe80::1"]).await;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let routed = |cfg: &Config, who: &str| {
        routes(cfg, 6443).contains(&format!(
            "from {who}/32 -> kube-apiserver.clusters-hc5.svc:6443"
        ))
    };
    let watch = |want: &'static str| {
        let cms = cms.clone();
        let op = &op;
        async move {
            eventually(
                &format!("{want} routed as hc5's worker"),
                WAIT,
                Some(op),
                || async {
                    let cfg = config_of(&cms.get_opt("vlan100-proxy-config").await.ok()??);
                    routed(&cfg, want).then_some(cfg)
                },
            )
            .await
        }
    };
    let cfg = watch("192.168.100.50").await;
    // Only the address inside the VLAN: the pod-network one is not a
    // source the VLAN proxy sees.
    assert!(!routes(&cfg, 6443).iter().any(|r| r.contains("10.128.0.5")));
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), ns);
    eventually(
        "routedWorkers in the attachment's status",
        WAIT,
        Some(&op),
        || async {
            let a = attachments.get("e").await.ok()?;
            (a.status?.routed_workers == vec!["192.168.100.50/32".to_string()]).then_some(())
        },
    )
    .await;

    // The worker's address changes: the route follows.
    machine_addresses(&client, cp, "hc5-worker-a", &["192.168.100.51"]).await;
    let cfg = watch("192.168.100.51").await;
    assert!(
        !routed(&cfg, "192.168.100.50"),
        "the old address is still routed"
    );
}

const METALLB_CRDS: &str = include_str!("../../../tests/kube/crds/metallb.yaml");
const HC_CRD: &str = include_str!("../../../tests/kube/crds/hostedcluster.yaml");

/// Waits until attachment `name` (of `attachments`' namespace) is Ready
/// `status` with `reason`, for its current generation.
async fn wait_ready_in(
    attachments: &Api<InfraClusterAttachment>,
    op: &Operator,
    name: &str,
    status: &str,
    reason: &str,
) {
    eventually(
        &format!("attachment {name}: Ready={status} ({reason})"),
        WAIT,
        Some(op),
        || async {
            let a = attachments.get(name).await.ok()?;
            let st = a.status?;
            (st.observed_generation == a.metadata.generation
                && st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == status && c.reason == reason))
            .then_some(())
        },
    )
    .await;
}

/// The apps ingress reason an attachment reports, once it is `want`.
async fn wait_apps(
    attachments: &Api<InfraClusterAttachment>,
    op: &Operator,
    name: &str,
    want: &str,
) -> causeway_operator::infra::attachment::AppsIngressStatus {
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

/// Apps ingress with the hosted cluster a second API server of its own
/// (HyperShift's admin kubeconfig Secret pointing at it): waiting for a
/// Ready Node, then for MetalLB, then for the router's load balancer
/// address, which a stand-in for MetalLB gives from the pool; `*.apps` in
/// DNS and the proxy follows it; turning it off removes what was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_ingress_follows_the_routers_load_balancer_on_the_vlan() {
    const TEST: &str = "apps_ingress_follows_the_routers_load_balancer_on_the_vlan";
    let ns = "apps";
    let Some((c, client)) =
        kube_cluster::with_apps_ingress(TEST, &[ns, "clusters", "clusters-hc7"]).await
    else {
        return;
    };
    // The hosted cluster: an API server of its own, reached here by the
    // server its admin kubeconfig names (`--hosted-apiserver=kubeconfig`;
    // apps_ingress_kube takes the Service path).
    let Some(h) = kube_cluster::hosted_cluster("attachment_kube", TEST, "DNS:api.hc7.example.net")
    else {
        return;
    };
    let hosted = admin(h).await;
    for n in ["metallb-system", "openshift-ingress"] {
        kube_cluster::ensure_namespace(&hosted, n).await;
    }
    apply_yaml(&client, NAD_CRD, "default").await.unwrap();
    apply_yaml(&client, HC_CRD, "default").await.unwrap();
    wait_established(&client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    wait_established(&client, "hostedclusters.hypershift.openshift.io").await;
    apply_yaml(
        &client,
        &format!("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: vlan100, namespace: {ns}}}\nspec:\n  config: '{{}}'\n"),
        ns,
    )
    .await
    .unwrap();
    let kubeconfig_text =
        causeway_operator::k8s::manifest::token_kubeconfig(&h.server, &h.ca, &h.admin_token);
    kube_cluster::admin_kubeconfig_secret(&client, "clusters", "hc7", kubeconfig_text.clone())
        .await;
    let op = Operator::start(
        c,
        &[ns, "clusters-hc7"],
        &["--leader-election=false", "--hosted-apiserver=kubeconfig"],
        "apps",
    );
    apply_yaml(
        &client,
        &SHARED_INFRA.replace("namespace: tenants", &format!("namespace: {ns}")),
        ns,
    )
    .await
    .unwrap();
    let attachments: Api<InfraClusterAttachment> = Api::namespaced(client.clone(), ns);
    let spec = |enabled: bool| {
        serde_json::json!({"infraRef": {"name": INFRA},
            "hostedClusterRef": {"name": "hc7", "namespace": "clusters"},
            "dns": {"clusterName": "hc7", "baseDomain": "example.net"},
            "appsIngress": {"enabled": enabled,
                "metallb": {"addressPoolName": "hc7-apps", "ipAddressPoolRange": "192.168.100.200-192.168.100.209"}}})
    };
    apply_yaml(
        &client,
        &serde_json::to_string(&serde_json::json!({
            "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "InfraClusterAttachment",
            "metadata": {"name": "g", "namespace": ns}, "spec": spec(true)}))
        .unwrap(),
        ns,
    )
    .await
    .unwrap();

    // No Ready Node: nothing is made, and the attachment says why.
    wait_apps(&attachments, &op, "g", "WaitingForHostedClusterNodes").await;
    wait_ready_in(
        &attachments,
        &op,
        "g",
        "False",
        "WaitingForHostedClusterNodes",
    )
    .await;
    kube_cluster::ready_node(&hosted, "hc7-worker-0").await;

    // A Ready Node, no MetalLB: the owner's MetalLB is waited for, not
    // installed (install is off).
    let s = wait_apps(&attachments, &op, "g", "WaitingForMetalLBCRDs").await;
    assert!(s.message.contains("install MetalLB there"), "{}", s.message);
    apply_yaml(&hosted, METALLB_CRDS, "default").await.unwrap();
    wait_established(&hosted, "ipaddresspools.metallb.io").await;
    wait_established(&hosted, "l2advertisements.metallb.io").await;

    // MetalLB there: the pool, its advertisement and the router's Service
    // are made, and the load balancer's address is waited for.
    wait_apps(&attachments, &op, "g", "WaitingForExternalIP").await;
    let pools: Api<kube::api::DynamicObject> = Api::namespaced_with(
        hosted.clone(),
        "metallb-system",
        &causeway_operator::k8s::resources::ip_address_pool_resource(),
    );
    let pool = pools.get("hc7-apps").await.unwrap();
    assert_eq!(
        pool.data["spec"]["addresses"][0],
        "192.168.100.200-192.168.100.209"
    );
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(hosted.clone(), "openshift-ingress");
    let svc = services.get("causeway-apps").await.unwrap();
    assert_eq!(
        svc.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );
    assert_eq!(
        svc.metadata.annotations.as_ref().unwrap()["metallb.universe.tf/address-pool"],
        "hc7-apps"
    );
    // Made under causeway's own identity there, not the admin's.
    let managers: Vec<String> = svc
        .metadata
        .managed_fields
        .unwrap_or_default()
        .iter()
        .filter_map(|f| f.manager.clone())
        .collect();
    assert!(
        managers.contains(&"causeway-apps-ingress".to_string()),
        "{managers:?}"
    );

    // The advertisement that has MetalLB's speakers answer for the pool's
    // addresses on the VLAN.
    let advertisements: Api<kube::api::DynamicObject> = Api::namespaced_with(
        hosted.clone(),
        "metallb-system",
        &causeway_operator::k8s::resources::l2_advertisement_resource(),
    );
    let l2 = advertisements.get("advertise-hc7-apps").await.unwrap();
    assert_eq!(
        l2.data["spec"]["ipAddressPools"],
        serde_json::json!(["hc7-apps"])
    );

    // MetalLB (played by the test, from what its controller and speakers
    // decide) gives the router an address on the VLAN and announces it:
    // *.apps follows it, woken by the hosted watch (the resync is minutes
    // away).
    let given = metallb::allocate(
        &hosted,
        metallb::Installed::Manifests,
        "metallb-system",
        "openshift-ingress",
        "causeway-apps",
    )
    .await
    .unwrap();
    assert_eq!(
        (given.address.to_string().as_str(), given.announced),
        ("192.168.100.200", true),
        "{given:?}"
    );
    let s = wait_apps(&attachments, &op, "g", "ReconciliationSucceeded").await;
    assert_eq!(s.external_ip.as_deref(), Some("192.168.100.200"));
    wait_ready_in(&attachments, &op, "g", "True", "ReconciliationSucceeded").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let dns = eventually("*.apps in the VLAN view", WAIT, Some(&op), || async {
        let d = config_of(&cms.get_opt("vlan100-dns-config").await.ok()??).dns?;
        d.views
            .first()?
            .records
            .iter()
            .any(|r| {
                r.name == "*.apps.hc7.example.net."
                    && format!("{:?}", r.data) == "A(192.168.100.200)"
            })
            .then_some(d)
    })
    .await;
    assert!(!dns.views.is_empty());
    let cfg = proxy_config_in(
        &client,
        ns,
        &op,
        "*.apps routed to the load balancer",
        |cfg| {
            routes(cfg, 443).contains(&"*.apps.hc7.example.net -> 192.168.100.200:443".to_string())
        },
    )
    .await;
    assert!(
        routes(&cfg, 80)
            .iter()
            .any(|r| r.contains("192.168.100.200:80")),
        "{:?}",
        routes(&cfg, 80)
    );

    // Turned off: what was made in the hosted cluster goes, and *.apps
    // with it.
    set_spec(&attachments, "g", spec(false)).await;
    eventually(
        "the router's Service and the pool gone",
        WAIT,
        Some(&op),
        || async {
            let svc_gone = services.get_opt("causeway-apps").await.ok()?.is_none();
            let pool_gone = pools.get_opt("hc7-apps").await.ok()?.is_none();
            (svc_gone && pool_gone).then_some(())
        },
    )
    .await;
    proxy_config_in(&client, ns, &op, "*.apps no longer routed", |cfg| {
        !routes(cfg, 443).iter().any(|r| r.starts_with("*.apps.hc7"))
    })
    .await;
    eventually("apps ingress status cleared", WAIT, Some(&op), || async {
        let a = attachments.get("g").await.ok()?;
        a.status?.apps_ingress_status.is_none().then_some(())
    })
    .await;

    // On again, then deleted while the hosted cluster cannot be reached
    // (a new operator, with no client kept, and a kubeconfig naming a dead
    // server): the deletion waits and says why, and goes through once the
    // cluster is back.
    set_spec(&attachments, "g", spec(true)).await;
    wait_apps(&attachments, &op, "g", "WaitingForExternalIP").await;
    drop(op);
    // A port of the test's own where nothing listens.
    let dead = format!("https://127.0.0.1:{}", crate::support::reserved_port());
    let unreachable =
        causeway_operator::k8s::manifest::token_kubeconfig(&dead, &h.ca, &h.admin_token);
    let put_secret = |text: String| {
        let client = client.clone();
        async move { kube_cluster::admin_kubeconfig_secret(&client, "clusters", "hc7", text).await }
    };
    put_secret(unreachable).await;
    let op = Operator::start(
        c,
        &[ns, "clusters-hc7"],
        &["--leader-election=false", "--hosted-apiserver=kubeconfig"],
        "apps-again",
    );
    attachments
        .delete("g", &DeleteParams::default())
        .await
        .unwrap();
    let message = eventually(
        "the deletion waits and says why",
        WAIT,
        Some(&op),
        || async {
            let a = attachments.get_opt("g").await.ok()??;
            a.status?
                .conditions
                .into_iter()
                .find(|c| {
                    c.type_ == "HostedCleanup"
                        && c.status == "False"
                        && c.reason == "HostedClusterUnreachable"
                })
                .map(|c| c.message)
        },
    )
    .await;
    assert!(message.contains("waiting up to 600 s"), "{message}");
    assert!(services.get_opt("causeway-apps").await.unwrap().is_some());
    put_secret(kubeconfig_text).await;
    eventually(
        "the attachment gone once the hosted cluster is back",
        WAIT,
        Some(&op),
        || async { attachments.get_opt("g").await.ok()?.is_none().then_some(()) },
    )
    .await;
    assert!(
        services.get_opt("causeway-apps").await.unwrap().is_none(),
        "the router Service outlived its attachment"
    );
}
