//! The operator against a real API server: kube-apiserver 1.20 and
//! kube-controller-manager on loopback (tests/kube/cluster.sh), the chart's
//! CRDs and RBAC from `helm template`, and the real `causeway operator`
//! binary under the chart's ServiceAccount. The test plays only what the
//! cluster would have beyond that: the scheduler and the kubelets (binding
//! pods and reporting them ready), and users.
//!
//! Needs root (the binaries are built into /var/cache as root by
//! tests/run.sh); without them every test prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::kube_cluster;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use causeway_operator::infra::crd::Infra;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kube_cluster::{
    admin, admin_get, apply_yaml, eventually, metric, wait_established, Operator, SharedCluster,
};
use serde_json::json;

const REFERENCE: &str = include_str!("../../causeway-operator/tests/fixtures/reference-infra.yaml");
const NAD_CRD: &str = include_str!("../../../tests/kube/crds/network-attachment-definition.yaml");
const HC_CRD: &str = include_str!("../../../tests/kube/crds/hostedcluster.yaml");
const WAIT: Duration = Duration::from_secs(60);

/// A reconcile with nothing to change writes nothing. A resync is forced by
/// a change to an object that is not the Infra's (an annotation on its
/// ServiceAccount `sa`, which we do not own), and no write series may move
/// while the reconciles counter does. A reconcile already under way when
/// the counters are read (pods and Leases settling just before) may still
/// write once; one that writes on every pass writes in each of three
/// tries. Returns the annotation's last value.
async fn assert_steady(op: &Operator, sas: &Api<ServiceAccount>, sa: &str) -> String {
    let mut changed = Vec::new();
    for attempt in 0..3 {
        let metrics_before = admin_get(op, "/metrics");
        let writes_before = write_series(&metrics_before);
        let reconciles_before = metric(&metrics_before, "causeway_operator_reconciles_total");
        let team = format!("net-{attempt}");
        sas.patch(
            sa,
            &PatchParams::apply("someone-else"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": sa, "annotations": {"team": team}}})),
        )
        .await
        .unwrap();
        eventually(
            "a reconcile after the foreign annotation",
            WAIT,
            Some(op),
            || async {
                let m = admin_get(op, "/metrics");
                (metric(&m, "causeway_operator_reconciles_total") > reconciles_before).then_some(())
            },
        )
        .await;
        let writes_after = write_series(&admin_get(op, "/metrics"));
        changed = writes_after
            .iter()
            .filter(|(k, v)| writes_before.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: {:?} -> {v}", writes_before.get(k)))
            .collect();
        if changed.is_empty() {
            return team;
        }
        println!("attempt {attempt}: a reconcile wrote: {changed:?}");
    }
    panic!("a reconcile with nothing to change wrote to the API: {changed:?}");
}

/// Each series of `causeway_operator_api_writes_total` (by kind and verb).
fn write_series(scrape: &str) -> std::collections::BTreeMap<String, f64> {
    scrape
        .lines()
        .filter(|l| l.starts_with("causeway_operator_api_writes_total"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The NAD CRD, and the NAD the reference sample names (default/vlan100).
async fn network_attachments(client: &Client, namespaces: &[&str]) {
    apply_yaml(client, NAD_CRD, "default").await.unwrap();
    wait_established(client, "network-attachment-definitions.k8s.cni.cncf.io").await;
    for ns in namespaces {
        kube_cluster::network_attachment(client, ns, "vlan100").await;
    }
}

/// The reference sample, moved to `ns` (or as written when `ns` is its own).
fn reference_in(ns: &str) -> Infra {
    let mut infra: Infra = serde_saphyr::from_str(REFERENCE).unwrap();
    infra.metadata.namespace = Some(ns.into());
    infra
}

async fn create_infra(client: &Client, infra: &Infra) -> Infra {
    let ns = infra.namespace().unwrap();
    let api: Api<Infra> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), infra).await.unwrap()
}

fn condition(infra: &Infra, type_: &str) -> Option<(String, String, String)> {
    infra
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits until the Infra's condition has `status`, for its current
/// generation, and returns the Infra.
async fn wait_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    op: &Operator,
) -> Infra {
    let api: Api<Infra> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("Infra {ns}/{name}: {type_}={status}"),
        WAIT,
        Some(op),
        || async {
            let i = api.get(name).await.ok()?;
            let current = i.status.as_ref()?.observed_generation == i.metadata.generation;
            let (s, _, _) = condition(&i, type_)?;
            (current && s == status).then_some(i)
        },
    )
    .await
}

/// Plays the scheduler and the kubelets: binds every pod of the Infra to a
/// node and reports it running and ready, and finishes the deletion of
/// pods being deleted (as a kubelet does once their containers stopped).
/// Returns how many pods it saw.
async fn make_pods_ready(client: &Client, ns: &str, instance: &str) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={instance}")))
        .await
        .unwrap();
    for pod in &list.items {
        let name = pod.name_any();
        if pod.metadata.deletion_timestamp.is_some() {
            let _ = pods
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
            continue;
        }
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            let binding = json!({"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "node-1"}});
            let _: Result<serde_json::Value, _> = pods
                .create_subresource("binding", &name, &PostParams::default(), &binding)
                .await;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}});
        let _ = pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await;
    }
    list.items.len()
}

/// Keeps playing the kubelet until the Infra is Ready.
async fn drive_to_ready(client: &Client, ns: &str, name: &str, op: &Operator) -> Infra {
    let api: Api<Infra> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("Infra {ns}/{name} Ready=True once its pods are"),
        WAIT,
        Some(op),
        || async {
            make_pods_ready(client, ns, name).await;
            let i = api.get(name).await.ok()?;
            let current = i.status.as_ref()?.observed_generation == i.metadata.generation;
            (current && condition(&i, "Ready")?.0 == "True").then_some(i)
        },
    )
    .await
}

fn managed_by_us_with_apply(meta: &kube::api::ObjectMeta) -> bool {
    meta.managed_fields.as_ref().is_some_and(|fields| {
        fields.iter().any(|f| {
            f.manager.as_deref() == Some("causeway-operator")
                && f.operation.as_deref() == Some("Apply")
        })
    })
}

fn owned_by(meta: &kube::api::ObjectMeta, infra: &Infra) -> bool {
    meta.owner_references.as_ref().is_some_and(|refs| {
        refs.len() == 1
            && refs[0].kind == "Infra"
            && Some(&refs[0].uid) == infra.metadata.uid.as_ref()
            && refs[0].controller == Some(true)
    })
}

fn pod_uids(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .map(|p| (p.name_any(), p.metadata.uid.clone().unwrap_or_default()))
        .collect()
}

async fn component_pods(client: &Client, ns: &str, instance: &str, component: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!(
        "app.kubernetes.io/instance={instance},app.kubernetes.io/component={component}"
    )))
    .await
    .unwrap()
    .items
    .into_iter()
    .filter(|p| p.metadata.deletion_timestamp.is_none())
    .collect()
}

fn config_text(cm: &ConfigMap) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .cloned()
        .unwrap_or_default()
}

/// How many objects of a kind `lp` selects in `ns`.
async fn count<K>(client: &Client, ns: &str, lp: &ListParams) -> Option<usize>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    Some(api.list_metadata(lp).await.ok()?.items.len())
}

/// The DHCP lease time of a rendered config, read as the pod reads it.
fn lease_time(cm: &ConfigMap) -> Option<Duration> {
    causeway_config::Config::from_yaml(&config_text(cm))
        .ok()?
        .dhcp
        .map(|d| d.lease_time)
}

fn start_operator(c: &SharedCluster, ns: &str) -> Operator {
    Operator::start(c, &[ns], &["--leader-election=false"], "solo")
}

/// Who holds the operator's Lease; `None` when nobody does (no Lease, or
/// one handed back).
async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("causeway-operator")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// The PodDisruptionBudgets in `ns`, read in whichever `policy` version the
/// API server serves (v1beta1 only, on 1.20).
async fn disruption_budgets(client: &Client, ns: &str) -> Vec<DynamicObject> {
    for version in ["v1", "v1beta1"] {
        let resource = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("policy", version, "PodDisruptionBudget"),
            "poddisruptionbudgets",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => return list.items,
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => panic!("listing PodDisruptionBudgets: {e}"),
        }
    }
    panic!("no policy API serves PodDisruptionBudgets")
}

/// Whether the ServiceAccount `ns/sa` may `verb` the Lease `name` (or every
/// Lease, with `None`), as the API server's authorizer answers for it.
async fn service_account_may(
    client: &Client,
    ns: &str,
    sa: &str,
    verb: &str,
    name: Option<&str>,
) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:{sa}")),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.into()),
                verb: Some(verb.into()),
                group: Some("coordination.k8s.io".into()),
                resource: Some("leases".into()),
                name: name.map(str::to_string),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

// ----------------------------------------------------------------- scenarios

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_sample_is_applied_owned_and_ready_only_when_its_pods_are() {
    let Some(c) = kube_cluster::cluster(
        "the_reference_sample_is_applied_owned_and_ready_only_when_its_pods_are",
    ) else {
        return;
    };
    let client = admin(c).await;
    // The sample as written: namespace `clusters`, NAD default/vlan100, the
    // control plane in clusters-my-cluster.
    kube_cluster::ensure_namespace(&client, "clusters").await;
    kube_cluster::ensure_namespace(&client, "clusters-my-cluster").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, "clusters");
    let infra: Infra = serde_saphyr::from_str(REFERENCE).unwrap();
    let infra = create_infra(&client, &infra).await;
    let ns = "clusters";
    let name = "example-infra";

    // Not ready while no pod is: observed, not assumed.
    let seen = wait_condition(&client, ns, name, "Valid", "True", &op).await;
    let (ready, reason, message) = condition(&seen, "Ready").unwrap();
    assert_eq!(
        (ready.as_str(), reason.as_str()),
        ("False", "ComponentsNotReady"),
        "{message}"
    );
    assert_eq!(condition(&seen, "NetworkAttachment").unwrap().0, "True");

    // Every object: applied by the operator's field manager, owned by the
    // Infra.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    let nps: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let mut metas = Vec::new();
    for c in ["dhcp", "dns", "proxy"] {
        metas.push(
            cms.get(&format!("{name}-{c}-config"))
                .await
                .unwrap()
                .metadata,
        );
    }
    metas.push(sets.get("example-infra-dhcp").await.unwrap().metadata);
    metas.push(deploys.get("example-infra-dns").await.unwrap().metadata);
    metas.push(deploys.get("example-infra-proxy").await.unwrap().metadata);
    metas.push(sas.get("example-infra-causeway").await.unwrap().metadata);
    metas.push(svcs.get("example-infra-dns").await.unwrap().metadata);
    metas.push(
        nps.get("example-infra-causeway-admin")
            .await
            .unwrap()
            .metadata,
    );
    for m in &metas {
        assert!(
            managed_by_us_with_apply(m),
            "{:?} not applied by causeway-operator",
            m.name
        );
        assert!(owned_by(m, &infra), "{:?} not owned by the Infra", m.name);
    }
    // The DNS Service got a ClusterIP from the API server.
    let dns_svc = svcs.get("example-infra-dns").await.unwrap();
    assert!(dns_svc
        .spec
        .unwrap()
        .cluster_ip
        .is_some_and(|ip| ip.starts_with("10.96.")));
    // The policy in the control-plane namespace admits the proxy pods.
    let cp_policy = Api::<NetworkPolicy>::namespaced(client.clone(), "clusters-my-cluster")
        .get("causeway-proxy-clusters-example-infra")
        .await
        .unwrap();
    assert!(managed_by_us_with_apply(&cp_policy.metadata));
    let peer = serde_json::to_value(&cp_policy.spec.unwrap().ingress.unwrap()[0]).unwrap();
    assert_eq!(
        peer["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "proxy"
    );
    // The rendered configs carry the sample's values.
    let dhcp = config_text(&cms.get("example-infra-dhcp-config").await.unwrap());
    assert!(
        dhcp.contains("192.168.100.100") && dhcp.contains("leaseTime"),
        "{dhcp}"
    );

    // The test plays scheduler and kubelet; the real controllers roll the
    // pod readiness up into the workloads, and the operator into the Infra.
    let ready = drive_to_ready(&client, ns, name, &op).await;
    let cs = ready.status.unwrap().component_status.unwrap();
    assert!(cs.dhcp_ready && cs.dns_ready && cs.proxy_ready);

    // Steady state: a reconcile writes nothing. A resync is forced by a
    // change to an object that is not the Infra's (an annotation on the
    // ServiceAccount, which we do not own), and the write counter must not
    // move while the reconciles counter does.
    let team = assert_steady(&op, &sas, "example-infra-causeway").await;
    let sa = sas.get("example-infra-causeway").await.unwrap();
    assert_eq!(
        sa.annotations().get("team"),
        Some(&team),
        "a field we do not own was removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_time_change_reloads_in_place_and_a_server_ip_change_rolls_the_pod() {
    let test = "a_lease_time_change_reloads_in_place_and_a_server_ip_change_rolls_the_pod";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "reload").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);
    let infra = create_infra(&client, &reference_in(&ns)).await;
    let name = infra.name_any();
    drive_to_ready(&client, &ns, &name, &op).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    let dhcp_generation = sets
        .get(&format!("{name}-dhcp"))
        .await
        .unwrap()
        .metadata
        .generation;
    let dhcp_pods = pod_uids(&component_pods(&client, &ns, &name, "dhcp").await);
    let dns_pods = pod_uids(&component_pods(&client, &ns, &name, "dns").await);
    assert_eq!((dhcp_pods.len(), dns_pods.len()), (1, 1));

    // leaseTime: the ConfigMap changes (the pod's appliance reloads it);
    // the StatefulSet and its pod stay as they are.
    infras
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"infraComponents": {"dhcp": {"leaseTime": "2h"}}}})),
        )
        .await
        .unwrap();
    eventually(
        "the DHCP ConfigMap has leaseTime 2h",
        WAIT,
        Some(&op),
        || async {
            let cm = cms.get(&format!("{name}-dhcp-config")).await.ok()?;
            (lease_time(&cm) == Some(Duration::from_secs(2 * 3600))).then_some(())
        },
    )
    .await;
    // The reconcile that wrote the ConfigMap has finished once the status
    // shows the new generation.
    wait_condition(&client, &ns, &name, "Ready", "True", &op).await;
    assert_eq!(
        sets.get(&format!("{name}-dhcp"))
            .await
            .unwrap()
            .metadata
            .generation,
        dhcp_generation
    );
    assert_eq!(
        pod_uids(&component_pods(&client, &ns, &name, "dhcp").await),
        dhcp_pods
    );

    // serverIP of DNS: the pod template's Multus annotation changes, and
    // the Deployment replaces the pod (Recreate) with one on the new address.
    infras
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"infraComponents": {"dns": {"serverIP": "192.168.100.4"}}}}),
            ),
        )
        .await
        .unwrap();
    let new_pod = eventually(
        "a new DNS pod on 192.168.100.4",
        WAIT,
        Some(&op),
        || async {
            make_pods_ready(&client, &ns, &name).await;
            let pods = component_pods(&client, &ns, &name, "dns").await;
            pods.into_iter().find(|p| {
                !dns_pods.contains_key(&p.name_any())
                    && p.annotations()
                        .get("k8s.v1.cni.cncf.io/networks")
                        .is_some_and(|a| a.contains("192.168.100.4/24"))
            })
        },
    )
    .await;
    let old_left = component_pods(&client, &ns, &name, "dns")
        .await
        .iter()
        .filter(|p| dns_pods.contains_key(&p.name_any()))
        .count();
    assert_eq!(
        old_left,
        0,
        "the old DNS pod still runs beside {}",
        new_pod.name_any()
    );
    let dns = deploys.get(&format!("{name}-dns")).await.unwrap();
    assert_eq!(
        dns.spec.unwrap().strategy.unwrap().type_.as_deref(),
        Some("Recreate")
    );
    // The other components learn the new address through their configs.
    let dhcp = config_text(&cms.get(&format!("{name}-dhcp-config")).await.unwrap());
    assert!(
        dhcp.contains("192.168.100.4"),
        "DHCP still hands out the old DNS server:\n{dhcp}"
    );
    drive_to_ready(&client, &ns, &name, &op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_undone_and_foreign_fields_are_kept() {
    let Some(c) = kube_cluster::cluster("drift_is_undone_and_foreign_fields_are_kept") else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "drift").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);
    let infra = create_infra(&client, &reference_in(&ns)).await;
    let name = infra.name_any();
    wait_condition(&client, &ns, &name, "Valid", "True", &op).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let cm_name = format!("{name}-dns-config");
    let original = config_text(&cms.get(&cm_name).await.unwrap());

    // A deleted child comes back.
    let old_uid = cms.get(&cm_name).await.unwrap().metadata.uid;
    cms.delete(&cm_name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the deleted ConfigMap is recreated",
        WAIT,
        Some(&op),
        || async {
            let cm = cms.get(&cm_name).await.ok()?;
            (cm.metadata.uid != old_uid && config_text(&cm) == original).then_some(())
        },
    )
    .await;

    // Another manager takes a field we own (forcing the conflict) and adds
    // one we do not: ours is put back, theirs stays.
    cms.patch(
        &cm_name,
        &PatchParams::apply("intruder").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": cm_name, "labels": {"owner-team": "dns"}},
            "data": {"config.yaml": "# hijacked\n"}})),
    )
    .await
    .unwrap();
    eventually(
        "the hijacked ConfigMap data is reverted",
        WAIT,
        Some(&op),
        || async {
            let cm = cms.get(&cm_name).await.ok()?;
            (config_text(&cm) == original).then_some(cm)
        },
    )
    .await;
    let cm = cms.get(&cm_name).await.unwrap();
    assert_eq!(
        cm.labels().get("owner-team").map(String::as_str),
        Some("dns"),
        "a foreign label was removed"
    );

    // A foreign change to a Deployment field we own (replicas) is undone.
    let deploy = format!("{name}-proxy");
    deploys
        .patch(
            &deploy,
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": deploy}, "spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    eventually(
        "the proxy Deployment is back to one replica",
        WAIT,
        Some(&op),
        || async {
            let d = deploys.get(&deploy).await.ok()?;
            (d.spec?.replicas == Some(1)).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_infra_removes_every_child() {
    let Some(c) = kube_cluster::cluster("deleting_the_infra_removes_every_child") else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "delete").await;
    let cp_ns = kube_cluster::test_namespace(&client, "delete-cp").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);
    let mut infra = reference_in(&ns);
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .control_plane_namespace = Some(cp_ns.clone());
    let infra = create_infra(&client, &infra).await;
    let name = infra.name_any();
    drive_to_ready(&client, &ns, &name, &op).await;
    let cp_policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &cp_ns);
    let policy = format!("causeway-proxy-{ns}-{name}");
    assert!(cp_policies.get_opt(&policy).await.unwrap().is_some());

    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    infras
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the Infra is gone (its finalizer done)",
        WAIT,
        Some(&op),
        || async { infras.get_opt(&name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    assert!(
        cp_policies.get_opt(&policy).await.unwrap().is_none(),
        "the control-plane policy outlived its Infra"
    );
    // The garbage collector of the controller-manager removes the owned.
    let selector = format!("app.kubernetes.io/instance={name}");
    eventually(
        "every owned object garbage-collected",
        Duration::from_secs(90),
        Some(&op),
        || async {
            let lp = ListParams::default().labels(&selector);
            let left = count::<ConfigMap>(&client, &ns, &lp).await?
                + count::<Deployment>(&client, &ns, &lp).await?
                + count::<StatefulSet>(&client, &ns, &lp).await?
                + count::<ServiceAccount>(&client, &ns, &lp).await?
                + count::<Service>(&client, &ns, &lp).await?
                + count::<NetworkPolicy>(&client, &ns, &lp).await?
                + count::<Pod>(&client, &ns, &lp).await?;
            (left == 0).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_and_missing_references_are_reported_and_change_nothing() {
    let Some(c) =
        kube_cluster::cluster("bad_specs_and_missing_references_are_reported_and_change_nothing")
    else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "bad").await;
    network_attachments(&client, &[]).await;
    let mut op = start_operator(c, &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // Every namespace has the API server's kube-root-ca.crt: only ours count.
    let ours = ListParams::default().labels("app.kubernetes.io/managed-by=causeway-operator");

    // Invalid values: Valid=False naming each field, and no object made.
    let mut bad = reference_in(&ns);
    bad.metadata.name = Some("bad".into());
    bad.spec.network_config.network_attachment_namespace = Some(ns.clone());
    let dhcp = bad.spec.infra_components.dhcp.as_mut().unwrap();
    dhcp.range_end = Some("192.168.100.50".into());
    bad.spec.infra_components.dns.as_mut().unwrap().server_ip = Some("192.168.100.300".into());
    bad.spec.infra_components.proxy.as_mut().unwrap().server_ip = Some("192.168.100.10/16".into());
    create_infra(&client, &bad).await;
    let seen = wait_condition(&client, &ns, "bad", "Valid", "False", &op).await;
    let (_, reason, message) = condition(&seen, "Valid").unwrap();
    assert_eq!(reason, "Invalid");
    for path in [
        "infraComponents.dhcp.rangeStart: start 192.168.100.100 is after end 192.168.100.50",
        "infraComponents.dns.serverIP: \"192.168.100.300\" is not an IPv4 address",
        "infraComponents.proxy.serverIP: prefix /16 differs from networkConfig.cidr 192.168.100.0/24",
    ] {
        assert!(message.contains(path), "{path} missing from: {message}");
    }
    assert_eq!(
        cms.list(&ours).await.unwrap().items.len(),
        0,
        "an invalid Infra made objects"
    );

    // A NAD that is not there: its own condition, nothing made; when it
    // appears, the Infra goes ahead.
    let mut nadless = reference_in(&ns);
    nadless.metadata.name = Some("nadless".into());
    nadless.spec.network_config.network_attachment_namespace = Some(ns.clone());
    nadless.spec.network_config.network_attachment_definition = "vlan-later".into();
    create_infra(&client, &nadless).await;
    let seen = wait_condition(&client, &ns, "nadless", "NetworkAttachment", "False", &op).await;
    assert!(condition(&seen, "NetworkAttachment")
        .unwrap()
        .2
        .contains("vlan-later"));
    assert_eq!(condition(&seen, "Valid").unwrap().0, "True");
    assert_eq!(
        cms.list(&ours).await.unwrap().items.len(),
        0,
        "an Infra without its NAD made objects"
    );
    kube_cluster::network_attachment(&client, &ns, "vlan-later").await;
    // The NAD is not watched: the Infra is retried on its own schedule (30 s).
    wait_condition(&client, &ns, "nadless", "NetworkAttachment", "True", &op).await;
    eventually(
        "the nadless Infra's ConfigMaps",
        WAIT,
        Some(&op),
        || async {
            let n = cms
                .list(&ListParams::default().labels("app.kubernetes.io/instance=nadless"))
                .await
                .ok()?
                .items
                .len();
            (n == 3).then_some(())
        },
    )
    .await;

    assert!(op.alive(), "{}", op.log_text());
}

/// An Infra of the Go operator's first generations, apps ingress on the
/// Infra itself: the API server keeps every field of it (the CRD's schema
/// has them, so nothing is pruned), the Infra's `IgnoredFields` says it is
/// not run from there and gives the InfraClusterAttachment that runs it,
/// and that attachment, applied as given, is accepted by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_generation_infras_apps_ingress_is_kept_and_its_attachment_given() {
    let test = "a_first_generation_infras_apps_ingress_is_kept_and_its_attachment_given";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "g1-apps").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);
    let apps = json!({
        "enabled": true,
        "baseDomain": "example.com",
        "hostedClusterRef": {"name": "my-cluster", "namespace": "clusters"},
        "metallb": {"addressPoolName": "apps-pool", "ipAddressPoolRange": "192.168.100.220-192.168.100.229",
                    "l2AdvertisementName": "apps-l2"},
        "service": {"name": "oooi-ingress", "namespace": "openshift-ingress",
                    "labels": {"team": "apps"}, "annotations": {"note": "kept"}},
        "ports": {"http": 80, "https": 443},
    });
    let mut doc: serde_json::Value = serde_saphyr::from_str(REFERENCE).unwrap();
    doc["metadata"] = json!({"name": "g1", "namespace": ns});
    doc["spec"]["appsIngress"] = apps.clone();
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::core::ApiResource::erase::<Infra>(&()),
    );
    raw.patch(
        "g1",
        &PatchParams::apply(kube_cluster::TEST_MANAGER),
        &Patch::Apply(&doc),
    )
    .await
    .unwrap();
    let stored = raw.get("g1").await.unwrap();
    // Every field as written (the schema's defaults, such as
    // metallb.install, added beside them).
    fn within(written: &serde_json::Value, stored: &serde_json::Value) -> bool {
        match written {
            serde_json::Value::Object(w) => w
                .iter()
                .all(|(k, v)| stored.get(k).is_some_and(|s| within(v, s))),
            _ => written == stored,
        }
    }
    let stored_apps = &stored.data["spec"]["appsIngress"];
    assert!(within(&apps, stored_apps), "{stored_apps}");

    let seen = wait_condition(&client, &ns, "g1", "IgnoredFields", "True", &op).await;
    let (_, _, message) = condition(&seen, "IgnoredFields").unwrap();
    let (_, rest) = message
        .split_once("apply this InfraClusterAttachment to run it: ")
        .unwrap_or_else(|| panic!("{message}"));
    let given: serde_json::Value = serde_json::Deserializer::from_str(rest)
        .into_iter::<serde_json::Value>()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(given["spec"]["infraRef"]["name"], "g1");
    assert_eq!(
        given["spec"]["dns"],
        json!({"clusterName": "my-cluster", "baseDomain": "example.com"})
    );
    let attachments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::core::ApiResource::erase::<
            causeway_operator::infra::attachment::InfraClusterAttachment,
        >(&()),
    );
    attachments
        .create(
            &PostParams::default(),
            &serde_json::from_value(given).unwrap(),
        )
        .await
        .expect("the API server accepts the attachment as given");
    let made = attachments.get("my-cluster").await.unwrap();
    let made_apps = &made.data["spec"]["appsIngress"];
    for k in ["enabled", "metallb", "service", "ports"] {
        assert!(
            within(&apps[k], &made_apps[k]),
            "appsIngress.{k}: {made_apps}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_operator_manifests_mean_what_they_meant() {
    let Some(c) = kube_cluster::cluster("go_operator_manifests_mean_what_they_meant") else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "compat").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);

    // internalProxyService names a Service: its ClusterIP is the internal
    // view's proxy address, and a replaced Service is followed.
    let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
    let svc = |ip: &str| {
        serde_json::from_value::<Service>(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "internal-proxy"},
            "spec": {"clusterIP": ip, "ports": [{"port": 443}]}}))
        .unwrap()
    };
    svcs.create(&PostParams::default(), &svc("10.96.200.10"))
        .await
        .unwrap();

    // The dhcp object left out: DHCP is disabled, as it was for the Go
    // operator. serverIP carries the prefix, as its users write it.
    let doc = format!(
        r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {{name: compat, namespace: {ns}}}
spec:
  networkConfig:
    cidr: 192.168.100.0/24
    gateway: 192.168.100.1
    networkAttachmentDefinition: vlan100
    networkAttachmentNamespace: default
  infraComponents:
    dns: {{serverIP: 192.168.100.3/24, baseDomain: example.com, clusterName: my-cluster}}
    proxy: {{serverIP: 192.168.100.10/24, internalProxyService: internal-proxy}}
"#
    );
    apply_yaml(&client, &doc, &ns).await.unwrap();
    let seen = wait_condition(&client, &ns, "compat", "Valid", "True", &op).await;
    assert_eq!(condition(&seen, "DHCPReady").unwrap().1, "Disabled");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(sets.get_opt("compat-dhcp").await.unwrap().is_none());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let dns = config_text(&cms.get("compat-dns-config").await.unwrap());
    assert!(dns.contains("10.96.200.10"), "{dns}");
    // No replicas field: one pod per component, as before, and nothing of
    // two replicas (no StatefulSet, budget, Lease, peers, key or Role).
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for component in ["dns", "proxy"] {
        let name = format!("compat-{component}");
        let d = deploys.get(&name).await.unwrap();
        assert_eq!(d.spec.unwrap().replicas, Some(1), "{name}");
        assert!(sets.get_opt(&name).await.unwrap().is_none(), "{name}");
    }
    assert!(!dns.contains("ha:"), "{dns}");
    let ours = ListParams::default().labels("app.kubernetes.io/instance=compat");
    assert_eq!(disruption_budgets(&client, &ns).await.len(), 0);
    assert_eq!(count::<Lease>(&client, &ns, &ours).await, Some(0));
    assert_eq!(count::<Role>(&client, &ns, &ours).await, Some(0));
    assert_eq!(count::<RoleBinding>(&client, &ns, &ours).await, Some(0));
    assert_eq!(count::<Secret>(&client, &ns, &ours).await, Some(0));
    let services: Vec<String> = svcs
        .list(&ours)
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(services, ["compat-dns"]);
    let accounts: Vec<String> = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .list(&ours)
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(accounts, ["compat-causeway"]);

    svcs.delete("internal-proxy", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the old Service gone", WAIT, Some(&op), || async {
        svcs.get_opt("internal-proxy")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    svcs.create(&PostParams::default(), &svc("10.96.200.20"))
        .await
        .unwrap();
    eventually(
        "the DNS config follows the new ClusterIP",
        WAIT,
        Some(&op),
        || async {
            let text = config_text(&cms.get("compat-dns-config").await.ok()?);
            (text.contains("10.96.200.20") && !text.contains("10.96.200.10")).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_without_the_charts_rbac_makes_nothing() {
    let Some(c) = kube_cluster::cluster("an_operator_without_the_charts_rbac_makes_nothing") else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "norbac").await;
    network_attachments(&client, &["default"]).await;
    // A ServiceAccount with no rights at all, and a token for it.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "powerless"}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let token = kube_cluster::token_for(&client, &ns, "powerless").await;
    let kubeconfig = c.dir.join(format!("{ns}.kubeconfig"));
    kube_cluster::write_kubeconfig(c, &kubeconfig, &token);
    let op = Operator::start_with_kubeconfig(
        c,
        &kubeconfig,
        &[&ns],
        &["--leader-election=false"],
        "powerless",
    );
    create_infra(&client, &reference_in(&ns)).await;
    eventually(
        "the operator reports it may not list Infras",
        WAIT,
        Some(&op),
        || async { op.log_text().contains("forbidden").then_some(()) },
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    assert!(cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=causeway-operator"))
        .await
        .unwrap()
        .items
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosted_clusters_are_picked_up_once_their_api_is_installed() {
    let test = "hosted_clusters_are_picked_up_once_their_api_is_installed";
    // The HostedCluster CRD must be absent at the start, which other
    // suites' clusters cannot promise.
    let Some(c) = kube_cluster::own_cluster("operator_kube::hosted_api_later", test) else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "hosted").await;
    network_attachments(&client, &["default"]).await;
    let mut op = Operator::start(
        c,
        &[&ns],
        &[
            "--leader-election=false",
            "--infra-for-hosted-clusters=true",
        ],
        "hosted",
    );
    eventually(
        "the operator notes there is no HostedCluster API",
        WAIT,
        Some(&op),
        || async {
            op.log_text()
                .contains("no HostedCluster API yet")
                .then_some(())
        },
    )
    .await;
    // A HostedCluster reference where HyperShift is not installed: a 404 for
    // the whole API, reported, not a crash.
    let mut orphan = reference_in(&ns);
    orphan.metadata.name = Some("orphan".into());
    orphan.spec.hosted_cluster_ref = Some(causeway_operator::infra::crd::HostedClusterRef {
        name: "nowhere".into(),
        namespace: None,
    });
    create_infra(&client, &orphan).await;
    let seen = wait_condition(&client, &ns, "orphan", "Valid", "False", &op).await;
    let msg = condition(&seen, "Valid").unwrap().2;
    assert!(
        msg.contains("hostedClusterRef") && msg.contains("not installed"),
        "{msg}"
    );
    assert!(op.alive(), "the operator died on a 404:\n{}", op.log_text());
    assert!(!op.log_text().contains("panicked"), "{}", op.log_text());

    // HyperShift is installed after the operator started.
    apply_yaml(&client, HC_CRD, &ns).await.unwrap();
    wait_established(&client, "hostedclusters.hypershift.openshift.io").await;
    let spec = r#"{"networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1",
        "networkAttachmentDefinition": "vlan100", "networkAttachmentNamespace": "default"},
        "infraComponents": {"dns": {"serverIP": "192.168.100.3"}, "proxy": {"serverIP": "192.168.100.10"}}}"#;
    let hc = json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": "hc1", "namespace": ns, "annotations": {"causeway.io/infra": spec}},
        "spec": {"dns": {"baseDomain": "example.com"}}});
    apply_yaml(&client, &serde_json::to_string(&hc).unwrap(), &ns)
        .await
        .unwrap();
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    eventually(
        "an Infra for the annotated HostedCluster, without a restart",
        Duration::from_secs(90),
        Some(&op),
        || async { infras.get_opt("hc1").await.ok()? },
    )
    .await;
    // Names come from the HostedCluster: the Infra is valid and rendered.
    let seen = wait_condition(&client, &ns, "hc1", "Valid", "True", &op).await;
    assert!(seen.spec.hosted_cluster_ref.is_some());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let dns = config_text(&cms.get("hc1-dns-config").await.unwrap());
    assert!(dns.contains("example.com") && dns.contains("hc1"), "{dns}");

    // A malformed HostedCluster (baseDomain a number) gives a message, not
    // a crash.
    let broken = json!({"apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
        "metadata": {"name": "hc2", "namespace": ns, "annotations": {"causeway.io/infra": spec}},
        "spec": {"dns": {"baseDomain": 42}}});
    apply_yaml(&client, &serde_json::to_string(&broken).unwrap(), &ns)
        .await
        .unwrap();
    let seen = eventually(
        "the Infra of the malformed HostedCluster reports",
        WAIT,
        Some(&op),
        || async {
            let i = infras.get_opt("hc2").await.ok()??;
            condition(&i, "Valid")
                .filter(|c| c.0 == "False")
                .map(|c| c.2)
        },
    )
    .await;
    assert!(seen.contains("baseDomain"), "{seen}");
    assert!(op.alive(), "{}", op.log_text());
    // The watch is measured like the other controllers: its reconciles
    // under its own label, its Infra applies among the API writes.
    let metrics = kube_cluster::admin_get(&op, "/metrics");
    assert!(
        kube_cluster::metric(
            &metrics,
            "causeway_operator_reconciles_total{controller=\"hostedcluster\""
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        kube_cluster::metric(
            &metrics,
            "causeway_operator_api_writes_total{kind=\"Infra\",verb=\"apply\"}"
        ) >= 2.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_within_the_lease_and_never_overlaps() {
    let test = "a_killed_leader_is_replaced_within_the_lease_and_never_overlaps";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "leader").await;
    network_attachments(&client, &["default"]).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), kube_cluster::RELEASE_NAMESPACE);
    let holder = || lease_holder(&leases);
    let mut first = Operator::start(c, &[&ns], &[], "replica-a");
    eventually("replica-a leads", WAIT, Some(&first), || async {
        (holder().await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let mut second = Operator::start(c, &[&ns], &[], "replica-b");
    create_infra(&client, &reference_in(&ns)).await;
    wait_condition(&client, &ns, "example-infra", "Valid", "True", &first).await;
    assert!(second.alive());
    assert!(
        !second.log_text().contains("leader election won"),
        "two leaders:\n{}",
        second.log_text()
    );

    let killed = Instant::now();
    first.kill9();
    eventually(
        "replica-b takes over",
        Duration::from_secs(40),
        Some(&second),
        || async { (holder().await.as_deref() == Some("replica-b")).then_some(()) },
    )
    .await;
    let took = killed.elapsed();
    // The lease lasts 15 s from its last renewal (at most 2 s before the
    // kill), and the standby retries every 2 s.
    assert!(
        took <= Duration::from_secs(15 + 2 + 2),
        "takeover took {took:?}"
    );
    // The new leader does the work: a change after the takeover is applied.
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);
    infras
        .patch(
            "example-infra",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"infraComponents": {"dhcp": {"leaseTime": "3h"}}}})),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    eventually(
        "replica-b applies the change",
        WAIT,
        Some(&second),
        || async {
            let cm = cms.get("example-infra-dhcp-config").await.ok()?;
            (lease_time(&cm) == Some(Duration::from_secs(3 * 3600))).then_some(())
        },
    )
    .await;
    eprintln!("leader takeover after kill -9: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_limited_to_listed_namespaces_works_there_and_nowhere_else() {
    let test = "an_operator_limited_to_listed_namespaces_works_there_and_nowhere_else";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    let watched = kube_cluster::test_namespace(&client, "limited").await;
    let other = kube_cluster::test_namespace(&client, "unwatched").await;
    let cp = kube_cluster::test_namespace(&client, "limited-cp").await;
    network_attachments(&client, &["default"]).await;
    // A second release of the chart, limited to one namespace: RoleBindings
    // there and in the referenced ones, no ClusterRoleBinding.
    let release = "limited";
    kube_cluster::install_release(
        &client,
        &c.helm,
        release,
        &[
            &format!("watch.namespaces={{{watched}}}"),
            &format!("watch.referencedNamespaces={{default,{cp}}}"),
            "leaderElection.enabled=false",
        ],
    )
    .await
    .unwrap();
    let token =
        kube_cluster::token_for(&client, kube_cluster::RELEASE_NAMESPACE, "limited-causeway").await;
    let kubeconfig = c.dir.join("limited.kubeconfig");
    kube_cluster::write_kubeconfig(c, &kubeconfig, &token);
    let op = Operator::start_with_kubeconfig(
        c,
        &kubeconfig,
        &[&watched],
        &["--leader-election=false"],
        "limited",
    );

    let mut infra = reference_in(&watched);
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .control_plane_namespace = Some(cp.clone());
    create_infra(&client, &infra).await;
    let mut stray = reference_in(&other);
    stray.metadata.name = Some("stray".into());
    create_infra(&client, &stray).await;
    drive_to_ready(&client, &watched, "example-infra", &op).await;
    let policy = format!("causeway-proxy-{watched}-example-infra");
    let cp_policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &cp);
    assert!(cp_policies.get_opt(&policy).await.unwrap().is_some());
    // The unwatched namespace's Infra is not touched.
    let strays: Api<Infra> = Api::namespaced(client.clone(), &other);
    assert!(strays.get("stray").await.unwrap().status.is_none());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &other);
    assert!(cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=causeway-operator"))
        .await
        .unwrap()
        .items
        .is_empty());

    // Cleanup cannot list NetworkPolicies across the cluster here; it finds
    // the control-plane one where the spec points.
    let infras: Api<Infra> = Api::namespaced(client.clone(), &watched);
    infras
        .delete("example-infra", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the limited operator's Infra is gone",
        WAIT,
        Some(&op),
        || async {
            infras
                .get_opt("example-infra")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert!(cp_policies.get_opt(&policy).await.unwrap().is_none());
    assert!(!op.log_text().contains("panicked"));
}

/// SIGTERM ends the operator within a bound whether or not its API server
/// answers: with the API server there it hands its Lease back first (so a
/// standby takes over at once, not after the lease runs out); with the API
/// server gone (every connection hanging) it exits anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_operator_in_time_with_or_without_its_api_server() {
    let test = "sigterm_ends_the_operator_in_time_with_or_without_its_api_server";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    // The operator's own bound is 10 s (drain, then the Lease hand-back);
    // the rest is process start-up and teardown on a busy machine.
    const BOUND: Duration = Duration::from_secs(15);
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "sigterm").await;
    let relay = kube_cluster::ApiRelay::start(c).await;
    let kubeconfig = c.dir.join(format!("{ns}.kubeconfig"));
    std::fs::write(
        &kubeconfig,
        causeway_operator::k8s::manifest::token_kubeconfig(&relay.server, &c.ca, &c.admin_token),
    )
    .unwrap();
    // Its Lease in a namespace of its own, apart from the other tests'.
    let env = [("POD_NAMESPACE", ns.as_str())];
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = || lease_holder(&leases);

    // The API server answers: the Lease is handed back, then the exit.
    let mut first = Operator::start_with_env(c, &kubeconfig, &[&ns], &[], "term-a", &env);
    eventually("term-a leads", WAIT, Some(&first), || async {
        (holder().await.as_deref() == Some("term-a")).then_some(())
    })
    .await;
    let asked = Instant::now();
    first.terminate();
    let status = first.exited_within(BOUND).await;
    let took = asked.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "with its API server there, SIGTERM did not end the operator cleanly within {BOUND:?} ({status:?}):\n{}",
        first.log_text()
    );
    assert_eq!(holder().await, None, "the Lease was not handed back");
    eprintln!("SIGTERM with the API server answering: exit after {took:?}, Lease released");

    // The API server stops answering, then SIGTERM.
    let mut second = Operator::start_with_env(c, &kubeconfig, &[&ns], &[], "term-b", &env);
    eventually("term-b leads", WAIT, Some(&second), || async {
        (holder().await.as_deref() == Some("term-b")).then_some(())
    })
    .await;
    relay.cut();
    let asked = Instant::now();
    second.terminate();
    let status = second.exited_within(BOUND).await;
    let took = asked.elapsed();
    assert!(
        status.is_some(),
        "with its API server gone, SIGTERM did not end the operator within {BOUND:?}:\n{}",
        second.log_text()
    );
    eprintln!("SIGTERM with the API server gone: exit after {took:?} ({status:?})");
}

/// Two replicas of DNS: a StatefulSet of two kept apart, its peers Service,
/// a disruption budget, the Lease (made, never written past its metadata),
/// a key made once, a Role that lets the replicas' own ServiceAccount
/// touch that Lease and no other, status naming the active replica and a
/// degraded component; back to one replica, all of it goes and the
/// Deployment comes back only once the replicas are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_render_anti_affinity_a_pdb_and_the_lease_rbac() {
    let test = "two_replicas_render_anti_affinity_a_pdb_and_the_lease_rbac";
    let Some(c) = kube_cluster::cluster(test) else {
        return;
    };
    let client = admin(c).await;
    let ns = kube_cluster::test_namespace(&client, "replicas").await;
    network_attachments(&client, &["default"]).await;
    let op = start_operator(c, &ns);
    let mut infra = reference_in(&ns);
    infra.spec.infra_components.dns.as_mut().unwrap().replicas = Some(2);
    let infra = create_infra(&client, &infra).await;
    let name = infra.name_any();
    let workload = format!("{name}-dns");
    let identity = format!("{workload}-ha");
    wait_condition(&client, &ns, &name, "Valid", "True", &op).await;

    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let roles: Api<Role> = Api::namespaced(client.clone(), &ns);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let infras: Api<Infra> = Api::namespaced(client.clone(), &ns);

    // The workload: a StatefulSet of two, started side by side, apart.
    let set = eventually("the DNS StatefulSet", WAIT, Some(&op), || async {
        sets.get_opt(&workload).await.ok()?
    })
    .await;
    assert!(deploys.get_opt(&workload).await.unwrap().is_none());
    let spec = set.spec.clone().unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(
        spec.service_name.as_deref(),
        Some(format!("{workload}-peers").as_str())
    );
    let pod = spec.template.spec.clone().unwrap();
    let anti = serde_json::to_value(pod.affinity.unwrap().pod_anti_affinity.unwrap()).unwrap();
    assert_eq!(
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"],
        serde_json::to_value(&spec.selector.match_labels).unwrap()
    );
    assert_eq!(pod.service_account_name.as_deref(), Some(identity.as_str()));
    assert_eq!(pod.automount_service_account_token, Some(true));
    let networks = &spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()["k8s.v1.cni.cncf.io/networks"];
    assert!(!networks.contains("ips"), "{networks}");
    // The other components are as they always were.
    let proxy = deploys.get(&format!("{name}-proxy")).await.unwrap();
    assert_eq!(proxy.spec.unwrap().replicas, Some(1));

    // The peers Service, the budget, the Lease, the identity and its Role.
    let peers = svcs.get(&format!("{workload}-peers")).await.unwrap();
    let peers_spec = peers.spec.clone().unwrap();
    assert_eq!(peers_spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peers_spec.publish_not_ready_addresses, Some(true));
    let budgets = disruption_budgets(&client, &ns).await;
    assert_eq!(budgets.len(), 1);
    assert_eq!(budgets[0].name_any(), workload);
    assert_eq!(budgets[0].data["spec"]["maxUnavailable"], 1);
    let lease = leases.get(&workload).await.unwrap();
    assert!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_ref())
            .is_none(),
        "the operator set a holder: {lease:?}"
    );
    let role = roles.get(&identity).await.unwrap();
    let rules = serde_json::to_value(role.rules.as_ref().unwrap()).unwrap();
    assert_eq!(
        rules,
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "resourceNames": [workload], "verbs": ["get", "list", "watch", "update", "patch"]}])
    );
    let binding = bindings.get(&identity).await.unwrap();
    assert_eq!(binding.role_ref.name, identity);
    let subjects = serde_json::to_value(binding.subjects.as_ref().unwrap()).unwrap();
    assert_eq!(
        subjects,
        json!([{"kind": "ServiceAccount", "name": identity, "namespace": ns}])
    );
    assert!(sas.get_opt(&identity).await.unwrap().is_some());
    let key = secrets.get(&format!("{workload}-ha-key")).await.unwrap();
    let key_bytes = key.data.clone().unwrap()["key"].0.clone();
    assert_eq!(key_bytes.len(), 32);
    let metas = [
        &peers.metadata,
        &lease.metadata,
        &role.metadata,
        &binding.metadata,
        &key.metadata,
        &set.metadata,
        &budgets[0].metadata,
    ];
    for m in metas {
        assert!(owned_by(m, &infra), "{:?} not owned by the Infra", m.name);
    }
    for m in [
        &peers.metadata,
        &lease.metadata,
        &role.metadata,
        &binding.metadata,
    ] {
        assert!(
            managed_by_us_with_apply(m),
            "{:?} not applied by causeway-operator",
            m.name
        );
    }

    // The config the pods run: an ha section the appliance accepts.
    let text = config_text(&cms.get(&format!("{name}-dns-config")).await.unwrap());
    let config = causeway_config::Config::from_yaml(&text)
        .unwrap_or_else(|e| panic!("the DNS config is rejected:\n{e}\n{text}"));
    let ha = config.ha.expect("an ha section");
    assert_eq!(ha.lease.unwrap().name, workload);
    assert_eq!(
        ha.replicas[1].address,
        format!("{workload}-1.{workload}-peers.{ns}.svc:7946")
    );

    // The replicas' identity may read and write its own Lease, and nothing
    // else: as the authorizer answers, and as requests with its token go.
    for verb in ["get", "list", "watch", "update", "patch"] {
        assert!(
            service_account_may(&client, &ns, &identity, verb, Some(&workload)).await,
            "{identity} may not {verb} its Lease"
        );
    }
    for verb in ["create", "delete"] {
        assert!(!service_account_may(&client, &ns, &identity, verb, Some(&workload)).await);
    }
    for verb in ["get", "update", "patch"] {
        assert!(
            !service_account_may(&client, &ns, &identity, verb, Some("causeway-operator")).await,
            "{identity} may {verb} another Lease"
        );
    }
    assert!(!service_account_may(&client, &ns, &identity, "list", None).await);
    assert!(
        !service_account_may(
            &client,
            &ns,
            "example-infra-causeway",
            "get",
            Some(&workload)
        )
        .await,
        "the one-replica pods' account may read the Lease"
    );
    let token = kube_cluster::token_for(&client, &ns, &identity).await;
    let as_replica = kube_cluster::client_with_token(c, &token).await;
    let replica_leases: Api<Lease> = Api::namespaced(as_replica.clone(), &ns);
    let by_name = ListParams::default().fields(&format!("metadata.name={workload}"));
    assert_eq!(replica_leases.list(&by_name).await.unwrap().items.len(), 1);
    assert!(
        forbidden(replica_leases.list(&ListParams::default()).await),
        "listing every Lease is allowed"
    );
    assert!(forbidden(
        replica_leases
            .list(&ListParams::default().fields("metadata.name=causeway-operator"))
            .await
    ));
    {
        use futures::StreamExt;
        let params = kube::api::WatchParams::default()
            .fields(&format!("metadata.name={workload}"))
            .timeout(1);
        let mut stream = replica_leases.watch(&params, "0").await.unwrap().boxed();
        while let Some(event) = stream.next().await {
            assert!(
                !matches!(event, Ok(kube::api::WatchEvent::Error(_)) | Err(_)),
                "{event:?}"
            );
        }
    }
    // Taking the Lease as the data plane does: its spec only.
    let holder = format!("{workload}-1");
    // A MicroTime, as the API server wants it: six decimals.
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    replica_leases
        .patch(
            &workload,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": holder,
                "leaseDurationSeconds": 15, "acquireTime": now, "renewTime": now}})),
        )
        .await
        .unwrap();
    let other: Api<Lease> = Api::namespaced(as_replica, kube_cluster::RELEASE_NAMESPACE);
    assert!(forbidden(other.get("causeway-operator").await));

    // Both pods ready: Ready, and the holder shows as the active replica.
    // Ready=True comes as soon as one replica is ready (reason Degraded),
    // and the second pod may not exist yet then: wait for DNSReady's own
    // reason to say both replicas serve.
    drive_to_ready(&client, &ns, &name, &op).await;
    let seen = eventually(
        "DNSReady=Ready with the active replica in status",
        WAIT,
        Some(&op),
        || async {
            make_pods_ready(&client, &ns, &name).await;
            let i = infras.get(&name).await.ok()?;
            let (status, reason, _) = condition(&i, "DNSReady")?;
            let both = status == "True" && reason == "Ready";
            let dns = i.status?.component_status?.dns?;
            (both && dns.active_replica.as_deref() == Some(holder.as_str())).then_some(dns)
        },
    )
    .await;
    assert_eq!((seen.replicas, seen.ready_replicas), (2, 2));

    // Steady state with two replicas: a reconcile writes nothing (the key
    // is not asked for again while both replicas are ready).
    assert_steady(&op, &sas, &format!("{name}-causeway")).await;

    // One pod not ready: the component serves, degraded, without a standby.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    pods.patch_status(
        &format!("{workload}-0"),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}})),
    )
    .await
    .unwrap();
    // The pod's readiness reaches the Infra through the controller-manager's
    // StatefulSet status, which a loaded machine can take long to write;
    // what was last seen is printed if it never comes.
    let seen = std::sync::Mutex::new(None);
    let degraded = eventually(
        "DNS degraded (pod 0 not ready); the last DNSReady seen is printed above",
        2 * WAIT,
        Some(&op),
        || async {
            let i = infras.get(&name).await.ok()?;
            let dns = condition(&i, "DNSReady");
            let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            let ready = sets
                .get(&workload)
                .await
                .ok()
                .and_then(|s| s.status)
                .and_then(|s| s.ready_replicas);
            let now = (dns.clone(), ready);
            let mut last = seen.lock().unwrap();
            if last.as_ref() != Some(&now) {
                println!(
                    "DNSReady {:?}, StatefulSet readyReplicas {:?}",
                    now.0, now.1
                );
                *last = Some(now);
            }
            (dns?.1 == "Degraded").then_some(i)
        },
    )
    .await;
    assert_eq!(condition(&degraded, "DNSReady").unwrap().0, "True");
    let (status, reason, message) = condition(&degraded, "Ready").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Degraded"),
        "{message}"
    );
    let dns_status = degraded.status.unwrap().component_status.unwrap();
    assert!(dns_status.dns_ready);
    assert_eq!(dns_status.dns.unwrap().ready_replicas, 1);

    // Another reconcile (a spec change): the key is the same Secret with
    // the same bytes, and the replicas' Lease fields are theirs still.
    infras
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"infraComponents": {"dhcp": {"leaseTime": "2h"}}}})),
        )
        .await
        .unwrap();
    eventually("the DHCP config with 2h", WAIT, Some(&op), || async {
        let cm = cms.get(&format!("{name}-dhcp-config")).await.ok()?;
        (lease_time(&cm) == Some(Duration::from_secs(2 * 3600))).then_some(())
    })
    .await;
    wait_condition(&client, &ns, &name, "Valid", "True", &op).await;
    let again = secrets.get(&format!("{workload}-ha-key")).await.unwrap();
    assert_eq!(again.metadata.uid, key.metadata.uid);
    assert_eq!(
        again.metadata.resource_version,
        key.metadata.resource_version
    );
    assert_eq!(again.data.unwrap()["key"].0, key_bytes);
    let lease = leases.get(&workload).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(holder.as_str()),
        "the operator overwrote the replicas' Lease"
    );

    // Back to one replica: the StatefulSet and its pods go first, then the
    // Deployment comes; everything of two replicas is removed.
    infras
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"infraComponents": {"dns": {"replicas": 1}}}})),
        )
        .await
        .unwrap();
    let deployment = eventually("the DNS Deployment is back", WAIT, Some(&op), || async {
        make_pods_ready(&client, &ns, &name).await;
        let d = deploys.get_opt(&workload).await.ok()??;
        // Checked as soon as it is seen: never beside the replicas.
        let replicas_left = sets.get_opt(&workload).await.ok()?.is_some();
        Some((d, replicas_left))
    })
    .await;
    assert!(
        !deployment.1,
        "the Deployment was made while the StatefulSet of two still existed"
    );
    let single = deployment.0.spec.unwrap();
    assert_eq!(single.replicas, Some(1));
    let networks = &single
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()["k8s.v1.cni.cncf.io/networks"];
    assert!(networks.contains("192.168.100.3/24"), "{networks}");
    eventually(
        "everything of two replicas removed",
        WAIT,
        Some(&op),
        || async {
            let left = [
                svcs.get_opt(&format!("{workload}-peers"))
                    .await
                    .ok()?
                    .is_some(),
                leases.get_opt(&workload).await.ok()?.is_some(),
                secrets
                    .get_opt(&format!("{workload}-ha-key"))
                    .await
                    .ok()?
                    .is_some(),
                roles.get_opt(&identity).await.ok()?.is_some(),
                bindings.get_opt(&identity).await.ok()?.is_some(),
                sas.get_opt(&identity).await.ok()?.is_some(),
                !disruption_budgets(&client, &ns).await.is_empty(),
            ];
            (!left.contains(&true)).then_some(())
        },
    )
    .await;
    let text = config_text(&cms.get(&format!("{name}-dns-config")).await.unwrap());
    assert!(!text.contains("ha:"), "{text}");
    let ready = drive_to_ready(&client, &ns, &name, &op).await;
    assert!(ready
        .status
        .unwrap()
        .component_status
        .unwrap()
        .dns
        .is_none());

    // DHCP from one replica to two: a StatefulSet whose immutable fields
    // change is replaced, pods first; the first replica keeps the lease
    // volume of the single pod.
    let dhcp = format!("{name}-dhcp");
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &ns);
    let claim = eventually("the DHCP lease volume", WAIT, Some(&op), || async {
        claims.get_opt(&format!("leases-{dhcp}-0")).await.ok()?
    })
    .await;
    let single_uid = sets.get(&dhcp).await.unwrap().metadata.uid;
    infras
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"infraComponents": {"dhcp": {"replicas": 2}}}})),
        )
        .await
        .unwrap();
    let replaced = eventually("two DHCP replicas", WAIT, Some(&op), || async {
        make_pods_ready(&client, &ns, &name).await;
        let set = sets.get_opt(&dhcp).await.ok()??;
        (set.metadata.uid != single_uid).then_some(set)
    })
    .await;
    let spec = replaced.spec.unwrap();
    assert_eq!(
        (spec.replicas, spec.pod_management_policy.as_deref()),
        (Some(2), Some("Parallel"))
    );
    assert_eq!(
        claims
            .get(&format!("leases-{dhcp}-0"))
            .await
            .unwrap()
            .metadata
            .uid,
        claim.metadata.uid,
        "the first replica lost the lease volume"
    );
    drive_to_ready(&client, &ns, &name, &op).await;
    // Ready comes with one replica ready (degraded, still serving); both
    // once the StatefulSet controller has made the second pod and the
    // test has played its kubelet.
    let infras_api: Api<Infra> = Api::namespaced(client.clone(), &ns);
    eventually("both DHCP replicas ready", WAIT, Some(&op), || async {
        make_pods_ready(&client, &ns, &name).await;
        let i = infras_api.get(&name).await.ok()?;
        let dhcp = i.status?.component_status?.dhcp?;
        (dhcp.ready_replicas == 2).then_some(())
    })
    .await;

    // Deleting the Infra: the garbage collector takes everything of the
    // two replicas too, key included.
    infras
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let selector = format!("app.kubernetes.io/instance={name}");
    eventually(
        "every object of two replicas garbage-collected",
        Duration::from_secs(90),
        Some(&op),
        || async {
            make_pods_ready(&client, &ns, &name).await;
            let lp = ListParams::default().labels(&selector);
            let left = count::<StatefulSet>(&client, &ns, &lp).await?
                + count::<Lease>(&client, &ns, &lp).await?
                + count::<Role>(&client, &ns, &lp).await?
                + count::<RoleBinding>(&client, &ns, &lp).await?
                + count::<Secret>(&client, &ns, &lp).await?
                + count::<Service>(&client, &ns, &lp).await?
                + count::<ServiceAccount>(&client, &ns, &lp).await?
                + disruption_budgets(&client, &ns).await.len();
            (left == 0).then_some(())
        },
    )
    .await;
    assert!(!op.log_text().contains("panicked"), "{}", op.log_text());
}
