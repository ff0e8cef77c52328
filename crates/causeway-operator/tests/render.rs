//! Render and validation tables: for a set of Infra specs (the Go
//! operator's reference example first), the objects are exactly what is
//! expected, every rendered config passes the appliance's own validation,
//! and every bad spec gets its precise message.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use causeway_operator::infra::crd::Infra;
use causeway_operator::infra::plan::{Component, Owner, Plan, Settings};
use causeway_operator::infra::render::{render, ComponentObjects, Rendered, Workload};
use causeway_operator::infra::validate::{validate, HostedClusterFacts, ServiceAddress};

const REFERENCE: &str = include_str!("fixtures/reference-infra.yaml");
const IMAGE: &str = "registry.example/causeway:0.1.0";

fn reference() -> Infra {
    serde_saphyr::from_str(REFERENCE).unwrap()
}

fn owner() -> Owner {
    Owner {
        name: "example-infra".into(),
        namespace: "clusters".into(),
        uid: "0b9e5f7a-1111-2222-3333-444455556666".into(),
    }
}

/// One component's config, loaded as its pod loads it.
fn plan_config(plan: &Plan, component: Component) -> causeway_config::Config {
    causeway_config::Config::from_yaml(&plan.component(component).unwrap().config_text).unwrap()
}

fn no_services(_: &str, _: &str) -> ServiceAddress {
    ServiceAddress::Missing
}

fn settings() -> Settings {
    Settings {
        image: IMAGE.into(),
        operator_namespace: "causeway-system".into(),
        resources: None,
        pod_monitors: true,
    }
}

fn plan_of(infra: &Infra) -> Plan {
    validate(
        &infra.spec,
        "example-infra",
        "clusters",
        None,
        &no_services,
        &[],
    )
    .unwrap()
}

fn rendered(infra: &Infra) -> Rendered {
    render(&plan_of(infra), &owner(), &settings())
}

fn config_text(r: &Rendered, component: &str) -> String {
    let c = r
        .components
        .iter()
        .find(|c| c.component.name() == component)
        .unwrap();
    c.config.data.as_ref().unwrap()["config.yaml"].clone()
}

#[test]
fn the_reference_example_is_accepted_as_written() {
    let infra = reference();
    let plan = plan_of(&infra);
    assert_eq!(plan.cidr.to_string(), "192.168.100.0/24");
    assert_eq!(plan.nad_name, "vlan100");
    assert_eq!(plan.nad_namespace, "default");
    let dns = plan_config(&plan, Component::Dns);
    assert_eq!(dns.cluster.unwrap().name, "my-cluster");
    assert_eq!(
        plan.control_plane_namespaces,
        vec!["clusters-my-cluster".to_string()]
    );
    assert!(plan.warnings.is_empty());
}

#[test]
fn the_reference_example_renders_three_components() {
    let r = rendered(&reference());
    let names: Vec<(String, String, &str)> = r
        .components
        .iter()
        .map(|c| {
            let (name, kind) = match &c.workload {
                Workload::StatefulSet(s) => (s.metadata.name.clone().unwrap(), "StatefulSet"),
                Workload::Deployment(d) => (d.metadata.name.clone().unwrap(), "Deployment"),
            };
            (c.config.metadata.name.clone().unwrap(), name, kind)
        })
        .collect();
    assert_eq!(
        names,
        vec![
            (
                "example-infra-dhcp-config".to_string(),
                "example-infra-dhcp".to_string(),
                "StatefulSet"
            ),
            (
                "example-infra-dns-config".into(),
                "example-infra-dns".into(),
                "Deployment"
            ),
            (
                "example-infra-proxy-config".into(),
                "example-infra-proxy".into(),
                "Deployment"
            ),
        ]
    );
    assert_eq!(
        r.service_account.metadata.name.as_deref(),
        Some("example-infra-causeway")
    );
}

#[test]
fn every_object_is_owned_by_the_infra_and_labelled() {
    let r = rendered(&reference());
    let mut metas = vec![&r.service_account.metadata];
    for c in &r.components {
        metas.push(&c.config.metadata);
        metas.push(match &c.workload {
            Workload::StatefulSet(s) => &s.metadata,
            Workload::Deployment(d) => &d.metadata,
        });
    }
    for m in metas {
        let refs = m.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1, "{:?}", m.name);
        assert_eq!(refs[0].kind, "Infra");
        assert_eq!(refs[0].name, "example-infra");
        assert_eq!(refs[0].uid, owner().uid);
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(m.namespace.as_deref(), Some("clusters"));
        let labels = m.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/instance"], "example-infra");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "causeway-operator");
    }
}

#[test]
fn pods_carry_the_multus_annotation_capabilities_and_probes() {
    let r = rendered(&reference());
    let expect = [
        (
            "dhcp",
            "192.168.100.2/24",
            vec!["NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW"],
        ),
        (
            "dns",
            "192.168.100.3/24",
            vec!["NET_ADMIN", "NET_BIND_SERVICE"],
        ),
        (
            "proxy",
            "192.168.100.10/24",
            vec!["NET_ADMIN", "NET_BIND_SERVICE"],
        ),
    ];
    for (c, (component, ip, caps)) in r.components.iter().zip(expect) {
        assert_eq!(c.component.name(), component);
        let template = match &c.workload {
            Workload::StatefulSet(s) => &s.spec.as_ref().unwrap().template,
            Workload::Deployment(d) => {
                let spec = d.spec.as_ref().unwrap();
                assert_eq!(
                    spec.strategy.as_ref().unwrap().type_.as_deref(),
                    Some("Recreate"),
                    "a rolling update would hold {ip} twice"
                );
                &spec.template
            }
        };
        let annotations = template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(
            annotations["k8s.v1.cni.cncf.io/networks"],
            format!(
                r#"[{{"interface":"net1","ips":["{ip}"],"name":"vlan100","namespace":"default"}}]"#
            )
        );
        let pod = template.spec.as_ref().unwrap();
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("example-infra-causeway")
        );
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some(IMAGE));
        let sc = container.security_context.as_ref().unwrap();
        let got = sc.capabilities.as_ref().unwrap();
        assert_eq!(
            got.add.as_deref(),
            Some(&caps.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..])
        );
        assert_eq!(got.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        for (probe, path) in [
            (&container.readiness_probe, "/readyz"),
            (&container.liveness_probe, "/healthz"),
        ] {
            let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
            assert_eq!(get.path.as_deref(), Some(path));
        }
    }
}

#[test]
fn the_dhcp_statefulset_keeps_its_leases_on_a_volume() {
    let r = rendered(&reference());
    let Workload::StatefulSet(s) = &r.components[0].workload else {
        panic!("DHCP is not a StatefulSet");
    };
    let spec = s.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    let claims = spec.volume_claim_templates.as_ref().unwrap();
    assert_eq!(claims[0].metadata.name.as_deref(), Some("leases"));
    let mounts = spec.template.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .as_ref()
        .unwrap();
    assert!(mounts
        .iter()
        .any(|m| m.name == "leases" && m.mount_path == "/var/lib/causeway"));
}

#[test]
fn every_rendered_config_passes_the_appliance_validation() {
    let r = rendered(&reference());
    for c in &r.components {
        let text = config_text(&r, c.component.name());
        let cfg = causeway_config::Config::from_yaml(&text)
            .unwrap_or_else(|e| panic!("{} config rejected:\n{e}\n{text}", c.component.name()));
        assert!(cfg.routing.is_some(), "no policy routing in {text}");
        assert_eq!(cfg.admin.interface.as_deref(), Some("eth0"));
    }
    let dhcp = causeway_config::Config::from_yaml(&config_text(&r, "dhcp")).unwrap();
    let d = dhcp.dhcp.unwrap();
    let subnet = &d.subnets[0];
    assert_eq!(
        subnet.options.dns_servers,
        vec!["192.168.100.3".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    assert_eq!(
        subnet.options.router,
        vec!["192.168.100.1".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    assert!(dhcp.dns.is_none() && dhcp.proxy.is_none());

    let dns = causeway_config::Config::from_yaml(&config_text(&r, "dns")).unwrap();
    assert_eq!(
        dns.dns.as_ref().unwrap().zone.as_deref(),
        Some("my-cluster.example.com.")
    );
    let proxy = causeway_config::Config::from_yaml(&config_text(&r, "proxy")).unwrap();
    let listeners = &proxy.proxy.as_ref().unwrap().listeners;
    assert_eq!(listeners[0].listen.to_string(), "192.168.100.10:6443");
}

#[test]
fn a_disabled_component_renders_nothing() {
    let mut infra = reference();
    infra.spec.infra_components.dns.as_mut().unwrap().enabled = false;
    let r = rendered(&infra);
    let names: Vec<&str> = r.components.iter().map(|c| c.component.name()).collect();
    assert_eq!(names, vec!["dhcp", "proxy"]);
    // Without causeway DNS, clients get the upstreams.
    let dhcp = causeway_config::Config::from_yaml(&config_text(&r, "dhcp")).unwrap();
    assert_eq!(
        dhcp.dhcp.unwrap().subnets[0].options.dns_servers,
        vec![
            "8.8.8.8".parse::<std::net::Ipv4Addr>().unwrap(),
            "8.8.4.4".parse().unwrap()
        ]
    );
}

#[test]
fn the_prefix_comes_from_the_cidr() {
    let mut infra = reference();
    let net = &mut infra.spec.network_config;
    net.cidr = "10.20.30.64/26".into();
    net.gateway = "10.20.30.65".into();
    let c = &mut infra.spec.infra_components;
    c.dhcp.as_mut().unwrap().server_ip = Some("10.20.30.66".into());
    c.dhcp.as_mut().unwrap().range_start = Some("10.20.30.80".into());
    c.dhcp.as_mut().unwrap().range_end = Some("10.20.30.120".into());
    c.dns.as_mut().unwrap().server_ip = Some("10.20.30.67".into());
    c.proxy.as_mut().unwrap().server_ip = Some("10.20.30.68".into());
    let r = rendered(&infra);
    let Workload::Deployment(d) = &r.components[2].workload else {
        panic!()
    };
    let a = &d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()["k8s.v1.cni.cncf.io/networks"];
    assert!(a.contains(r#""ips":["10.20.30.68/26"]"#), "{a}");
}

#[test]
fn an_internal_proxy_address_makes_a_second_view() {
    let mut infra = reference();
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .internal_proxy_service = Some("172.30.0.10".into());
    let r = rendered(&infra);
    let dns = causeway_config::Config::from_yaml(&config_text(&r, "dns")).unwrap();
    let views = &dns.dns.unwrap().views;
    let names: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(&names[..2], ["vlan", "internal"]);
}

#[test]
fn a_hosted_cluster_ref_fills_name_domain_and_namespace() {
    let mut infra = reference();
    let dns = infra.spec.infra_components.dns.as_mut().unwrap();
    dns.cluster_name = None;
    dns.base_domain = None;
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .control_plane_namespace = None;
    infra.spec.hosted_cluster_ref = Some(causeway_operator::infra::crd::HostedClusterRef {
        name: "hc7".into(),
        namespace: None,
    });
    let hc = HostedClusterFacts {
        name: "hc7".into(),
        namespace: "clusters".into(),
        base_domain: Some("corp.example".into()),
        ..HostedClusterFacts::default()
    };
    let plan = validate(
        &infra.spec,
        "example-infra",
        "clusters",
        Some(&hc),
        &no_services,
        &[],
    )
    .unwrap();
    let dns = plan_config(&plan, Component::Dns);
    let cluster = dns.cluster.unwrap();
    assert_eq!(
        (cluster.name.as_str(), cluster.base_domain.as_str()),
        ("hc7", "corp.example")
    );
    assert_eq!(
        plan.control_plane_namespaces,
        vec!["clusters-hc7".to_string()]
    );
}

#[test]
fn ignored_image_fields_are_reported_as_warnings() {
    let mut infra = reference();
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .manager_image = Some("quay.io/x/y:1".into());
    let plan = plan_of(&infra);
    assert_eq!(
        plan.warnings,
        vec!["infraComponents.proxy.managerImage is ignored: every component runs the operator's causeway image"]
    );
}

/// Each bad spec, made from the reference by one change, and the exact
/// messages it must produce.
#[test]
fn every_bad_spec_gets_its_precise_message() {
    type Change = fn(&mut Infra);
    let table: Vec<(&str, Change, Vec<&str>)> = vec![
        (
            "bad cidr",
            |i| i.spec.network_config.cidr = "192.168.100.0/33".into(),
            vec![r#"networkConfig.cidr: "192.168.100.0/33" is not an IPv4 CIDR such as 192.168.100.0/24"#],
        ),
        (
            "a VLAN inside OVN's join subnets",
            |i| *i = serde_saphyr::from_str(&REFERENCE.replace("192.168.100.", "100.65.100.")).unwrap(),
            vec!["networkConfig.cidr: 100.65.100.0/24 overlaps 100.65.0.0/16, inside 100.64.0.0/16–100.66.0.0/16: the join subnets OVN-Kubernetes routes inside a hosted cluster's nodes (100.64.0.0/16 by default, 100.66.0.0/16 for KubeVirt guests); nodes with addresses there would send this network's traffic into OVN instead of onto the VLAN. Choose a prefix outside that range"],
        ),
        (
            "gateway outside",
            |i| i.spec.network_config.gateway = "10.0.0.1".into(),
            vec!["networkConfig.gateway: 10.0.0.1 is outside networkConfig.cidr 192.168.100.0/24"],
        ),
        (
            "server ip not an address",
            |i| i.spec.infra_components.dns.as_mut().unwrap().server_ip = Some("dns-pod".into()),
            vec![r#"infraComponents.dns.serverIP: "dns-pod" is not an IPv4 address"#],
        ),
        (
            "server ip missing",
            |i| i.spec.infra_components.proxy.as_mut().unwrap().server_ip = None,
            vec!["infraComponents.proxy.serverIP: required when the component is enabled"],
        ),
        (
            "two pods on one address",
            |i| i.spec.infra_components.proxy.as_mut().unwrap().server_ip = Some("192.168.100.3".into()),
            vec![
                "infraComponents.proxy.serverIP: 192.168.100.3 is also infraComponents.dns.serverIP",
                "infraComponents.dns.serverIP: 192.168.100.3 is also infraComponents.proxy.serverIP",
            ],
        ),
        (
            "a pod on the gateway",
            |i| i.spec.infra_components.dns.as_mut().unwrap().server_ip = Some("192.168.100.1".into()),
            vec!["infraComponents.dns.serverIP: 192.168.100.1 is also the gateway"],
        ),
        (
            "range reversed",
            |i| i.spec.infra_components.dhcp.as_mut().unwrap().range_end = Some("192.168.100.50".into()),
            vec!["infraComponents.dhcp.rangeStart: start 192.168.100.100 is after end 192.168.100.50"],
        ),
        (
            "range outside",
            |i| i.spec.infra_components.dhcp.as_mut().unwrap().range_end = Some("192.168.101.20".into()),
            vec!["infraComponents.dhcp.rangeEnd: 192.168.101.20 is outside subnet 192.168.100.0/24"],
        ),
        (
            "broadcast",
            |i| i.spec.infra_components.dns.as_mut().unwrap().server_ip = Some("192.168.100.255".into()),
            vec!["infraComponents.dns.serverIP: 192.168.100.255 is the network or broadcast address of 192.168.100.0/24"],
        ),
        (
            "lease time",
            |i| i.spec.infra_components.dhcp.as_mut().unwrap().lease_time = Some("one hour".into()),
            vec!["infraComponents.dhcp.leaseTime: one hour is not a duration such as 90, 90s, 15m, 1h or 2d"],
        ),
        (
            "no cluster name",
            |i| i.spec.infra_components.dns.as_mut().unwrap().cluster_name = None,
            vec!["infraComponents.dns.clusterName: required for DNS and the proxy (or set hostedClusterRef)"],
        ),
        (
            "no NAD",
            |i| i.spec.network_config.network_attachment_definition = " ".into(),
            vec![
                "networkConfig.networkAttachmentNamespace: only with networkAttachmentDefinition",
                "networkConfig: set attachment (with topology, role, exposure and ipam) or networkAttachmentDefinition",
            ],
        ),
        (
            "bad upstream",
            |i| i.spec.network_config.dns_servers = vec!["dns.google".into()],
            vec!["networkConfig.dnsServers[0]: dns.google is not an address or address:port"],
        ),
        (
            "200 upstreams",
            |i| {
                i.spec.network_config.dns_servers =
                    (0..200).map(|n| format!("10.0.{}.{}", n / 250, n % 250 + 1)).collect()
            },
            vec!["networkConfig.dnsServers: 200 listed; at most 15 (each is tried in turn within one client's timeout)"],
        ),
        (
            "resolv.conf without DNS",
            |i| {
                i.spec.network_config.dns_servers = vec!["resolv.conf".into()];
                i.spec.infra_components.dns.as_mut().unwrap().enabled = false;
                i.spec.infra_components.proxy = None;
            },
            vec!["networkConfig.dnsServers: \"resolv.conf\" means the DNS pod's own resolvers; with DNS disabled, DHCP hands these servers to clients and needs addresses"],
        ),
        (
            "three replicas",
            |i| i.spec.infra_components.dns.as_mut().unwrap().replicas = Some(3),
            vec!["infraComponents.dns.replicas: 3 is not 1 or 2 (two replicas are one active and one standing by)"],
        ),
        (
            "no replicas",
            |i| i.spec.infra_components.dhcp.as_mut().unwrap().replicas = Some(0),
            vec!["infraComponents.dhcp.replicas: 0 is not 1 or 2 (two replicas are one active and one standing by)"],
        ),
    ];
    for (what, change, want) in table {
        let mut infra = reference();
        change(&mut infra);
        let got = validate(
            &infra.spec,
            "example-infra",
            "clusters",
            None,
            &no_services,
            &[],
        )
        .expect_err(what);
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn the_api_service_and_extra_routes_reach_the_proxy_config() {
    let mut infra = reference();
    let p = infra.spec.infra_components.proxy.as_mut().unwrap();
    p.api_server_service = Some("kas".into());
    p.extra_routes = vec![causeway_operator::infra::crd::ProxyRouteSpec {
        port: 22623,
        upstream: "machine-config.clusters-my-cluster.svc:22623".into(),
    }];
    let r = rendered(&infra);
    let proxy = causeway_config::Config::from_yaml(&config_text(&r, "proxy")).unwrap();
    let listeners = proxy.proxy.unwrap().listeners;
    let ports: Vec<u16> = listeners.iter().map(|l| l.listen.port()).collect();
    assert_eq!(ports, vec![6443, 443, 22623]);
    assert_eq!(
        listeners[0].kind,
        causeway_config::ListenerKind::Plain(causeway_config::Upstream::named(
            "kas.clusters-my-cluster.svc",
            6443
        ))
    );
}

/// The appliance's rule, which the operator now shares: a pool that spans
/// the gateway or a pod's address is fine, as those are never handed out.
#[test]
fn static_addresses_inside_the_pool_are_left_out_of_it() {
    let mut infra = reference();
    infra
        .spec
        .infra_components
        .dhcp
        .as_mut()
        .unwrap()
        .range_start = Some("192.168.100.1".into());
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .server_ip = Some("192.168.100.150".into());
    let plan = plan_of(&infra);
    let dhcp = plan_config(&plan, Component::Dhcp).dhcp.unwrap();
    let excluded = &dhcp.subnets[0].exclude;
    for ip in [
        "192.168.100.1",
        "192.168.100.2",
        "192.168.100.3",
        "192.168.100.150",
    ] {
        let ip: std::net::Ipv4Addr = ip.parse().unwrap();
        assert!(
            excluded.iter().any(|r| r.contains(ip)),
            "{ip} not excluded: {excluded:?}"
        );
    }
}

/// `*.apps` resolves to the proxy on the VLAN only when the proxy has an
/// ingress to send it to.
#[test]
fn apps_resolve_to_the_proxy_only_with_an_ingress_target() {
    let apps = "*.apps.my-cluster.example.com.";
    let dns_of = |infra: &Infra| plan_config(&plan_of(infra), Component::Dns).dns.unwrap();
    let without = dns_of(&reference());
    assert!(without
        .views
        .iter()
        .all(|v| v.records.iter().all(|r| r.name != apps)));
    let mut infra = reference();
    infra
        .spec
        .infra_components
        .proxy
        .as_mut()
        .unwrap()
        .ingress_https = Some("router-default.openshift-ingress.svc:443".into());
    let with = dns_of(&infra);
    let records: Vec<_> = with
        .views
        .last()
        .unwrap()
        .records
        .iter()
        .filter(|r| r.name == apps)
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0].data,
        causeway_config::RecordData::A("192.168.100.10".parse().unwrap())
    );
}

/// Every object the reference sample renders, as JSON, in a fixed order.
fn rendered_json(r: &Rendered) -> serde_json::Value {
    let mut objects = vec![serde_json::to_value(&r.service_account).unwrap()];
    for c in &r.components {
        objects.push(serde_json::to_value(&c.config).unwrap());
        objects.push(match &c.workload {
            Workload::StatefulSet(s) => serde_json::to_value(s).unwrap(),
            Workload::Deployment(d) => serde_json::to_value(d).unwrap(),
        });
        if let Some(s) = &c.service {
            objects.push(serde_json::to_value(s).unwrap());
        }
    }
    objects.push(serde_json::to_value(&r.admin_policy).unwrap());
    for p in &r.control_plane_policies {
        objects.push(serde_json::to_value(p).unwrap());
    }
    serde_json::Value::Array(objects)
}

/// A manifest written for the Go operator renders exactly the objects it
/// rendered before causeway's additions (two replicas and what comes with
/// them): the fixture was taken from the rendering before they existed.
/// Regenerate only for a deliberate change, with
/// `UPDATE_RENDER_FIXTURES=1 cargo test -p causeway-operator --test offline render::`.
#[test]
fn the_reference_sample_renders_exactly_the_objects_it_always_did() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/reference-rendered.json"
    );
    let got = rendered_json(&rendered(&reference()));
    if std::env::var_os("UPDATE_RENDER_FIXTURES").is_some() {
        std::fs::write(path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
    }
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        got == want,
        "the reference sample renders differently from {path}:\n{}",
        serde_json::to_string_pretty(&got).unwrap()
    );
}

/// The reference sample with two replicas of `component`.
fn two_of(component: Component) -> Infra {
    let mut infra = reference();
    let c = &mut infra.spec.infra_components;
    match component {
        Component::Dhcp => c.dhcp.as_mut().unwrap().replicas = Some(2),
        Component::Dns => c.dns.as_mut().unwrap().replicas = Some(2),
        Component::Proxy => c.proxy.as_mut().unwrap().replicas = Some(2),
    }
    infra
}

fn objects_of(r: &Rendered, component: Component) -> &ComponentObjects {
    r.components
        .iter()
        .find(|c| c.component == component)
        .unwrap()
}

#[test]
fn two_replicas_are_a_statefulset_of_two_apart_without_a_static_address() {
    for component in Component::ALL {
        let r = rendered(&two_of(component));
        let name = format!("example-infra-{}", component.name());
        let Workload::StatefulSet(set) = &objects_of(&r, component).workload else {
            panic!("{name}: two replicas need a StatefulSet for their stable names");
        };
        assert_eq!(set.metadata.name.as_deref(), Some(name.as_str()));
        let spec = set.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(
            spec.service_name.as_deref(),
            Some(format!("{name}-peers").as_str())
        );
        // DHCP keeps a lease log per replica; the others have no volume.
        assert_eq!(
            spec.volume_claim_templates.is_some(),
            component == Component::Dhcp,
            "{name}"
        );
        let pod = spec.template.spec.as_ref().unwrap();
        let term = &pod
            .affinity
            .as_ref()
            .unwrap()
            .pod_anti_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()[0];
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        assert_eq!(
            term.label_selector.as_ref().unwrap().match_labels,
            spec.selector.match_labels,
            "{name}: apart from each other, by the component's own selector"
        );
        // Every replica may take the address and announce it: NET_ADMIN
        // to add it, NET_RAW for the gratuitous ARP.
        let caps = pod.containers[0]
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .as_ref()
            .unwrap()
            .add
            .clone()
            .unwrap();
        for cap in ["NET_ADMIN", "NET_RAW"] {
            assert!(caps.contains(&cap.to_string()), "{name}: {caps:?}");
        }
        // No static address: the active replica adds it.
        let annotations = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap();
        assert_eq!(
            annotations["k8s.v1.cni.cncf.io/networks"],
            r#"[{"interface":"net1","name":"vlan100","namespace":"default"}]"#
        );
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some(format!("{name}-ha").as_str())
        );
        assert_eq!(pod.automount_service_account_token, Some(true));
        let container = &pod.containers[0];
        let env = container.env.as_ref().unwrap();
        assert_eq!(env[0].name, "CAUSEWAY_HA_NODE");
        assert_eq!(
            env[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.name"
        );
        let mount = container
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "ha-key")
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            ("/etc/causeway/ha", Some(true))
        );
        let volume = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == "ha-key")
            .unwrap();
        assert_eq!(
            volume.secret.as_ref().unwrap().secret_name.as_deref(),
            Some(format!("{name}-ha-key").as_str())
        );
        let ports: Vec<(i32, &str)> = container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .filter(|p| p.name.as_deref().is_some_and(|n| n.starts_with("ha-")))
            .map(|p| (p.container_port, p.protocol.as_deref().unwrap()))
            .collect();
        assert_eq!(ports, [(7946, "UDP"), (7946, "TCP")]);
    }
}

#[test]
fn two_replicas_come_with_peers_a_budget_a_lease_and_a_role_for_that_lease_only() {
    let r = rendered(&two_of(Component::Dns));
    let ha = objects_of(&r, Component::Dns).ha.as_ref().unwrap();
    let selector = causeway_operator::infra::render::selector_labels(&owner(), Component::Dns);

    let peers = ha.peers.spec.as_ref().unwrap();
    assert_eq!(
        ha.peers.metadata.name.as_deref(),
        Some("example-infra-dns-peers")
    );
    assert_eq!(peers.cluster_ip.as_deref(), Some("None"));
    assert_eq!(peers.publish_not_ready_addresses, Some(true));
    assert_eq!(peers.selector.as_ref(), Some(&selector));
    let ports: Vec<(&str, i32, &str)> = peers
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p.name.as_deref().unwrap(),
                p.port,
                p.protocol.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [("ha-advert", 7946, "UDP"), ("ha-stream", 7946, "TCP")]
    );

    let budget = ha.disruption_budget.spec.as_ref().unwrap();
    assert_eq!(
        budget.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
    assert_eq!(
        budget.selector.as_ref().unwrap().match_labels.as_ref(),
        Some(&selector)
    );

    // The Lease is made with metadata only: its spec is the replicas'.
    assert_eq!(ha.lease.metadata.name.as_deref(), Some("example-infra-dns"));
    assert!(ha.lease.spec.is_none());

    let rules = ha.role.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["coordination.k8s.io".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["leases".to_string()][..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["example-infra-dns".to_string()][..])
    );
    assert_eq!(rules[0].verbs, ["get", "list", "watch", "update", "patch"]);
    assert_eq!(ha.role_binding.role_ref.kind, "Role");
    assert_eq!(ha.role_binding.role_ref.name, "example-infra-dns-ha");
    let subjects = ha.role_binding.subjects.as_ref().unwrap();
    assert_eq!(
        (
            subjects[0].kind.as_str(),
            subjects[0].name.as_str(),
            subjects[0].namespace.as_deref()
        ),
        ("ServiceAccount", "example-infra-dns-ha", Some("clusters"))
    );
    assert_eq!(
        ha.service_account.metadata.name.as_deref(),
        Some("example-infra-dns-ha")
    );
    // Owned by the Infra, like everything else.
    for meta in [
        &ha.peers.metadata,
        &ha.disruption_budget.metadata,
        &ha.lease.metadata,
        &ha.service_account.metadata,
        &ha.role.metadata,
        &ha.role_binding.metadata,
    ] {
        let refs = meta.owner_references.as_ref().unwrap();
        assert_eq!(
            (refs[0].kind.as_str(), refs[0].uid.as_str()),
            ("Infra", owner().uid.as_str())
        );
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"],
            "causeway-operator"
        );
    }

    // The key: 32 bytes as given, never rewritten.
    let key = causeway_operator::infra::render::ha_key(&owner(), Component::Dns, [7; 32]);
    assert_eq!(
        key.metadata.name.as_deref(),
        Some("example-infra-dns-ha-key")
    );
    assert_eq!(key.immutable, Some(true));
    assert_eq!(key.data.as_ref().unwrap()["key"].0, vec![7u8; 32]);
}

#[test]
fn the_config_of_two_replicas_has_an_ha_section_the_appliance_accepts() {
    let plan = plan_of(&two_of(Component::Dhcp));
    let text = &plan.component(Component::Dhcp).unwrap().config_text;
    let cfg = causeway_config::Config::from_yaml(text)
        .unwrap_or_else(|e| panic!("rejected:\n{e}\n{text}"));
    let ha = cfg.ha.unwrap();
    assert_eq!(ha.mode, causeway_config::HaMode::Lease);
    assert_eq!(
        ha.node, None,
        "each pod names itself through CAUSEWAY_HA_NODE"
    );
    let replicas: Vec<(&str, &str)> = ha
        .replicas
        .iter()
        .map(|r| (r.name.as_str(), r.address.as_str()))
        .collect();
    assert_eq!(
        replicas,
        [
            (
                "example-infra-dhcp-0",
                "example-infra-dhcp-0.example-infra-dhcp-peers.clusters.svc:7946"
            ),
            (
                "example-infra-dhcp-1",
                "example-infra-dhcp-1.example-infra-dhcp-peers.clusters.svc:7946"
            ),
        ]
    );
    assert_eq!(ha.key_file, std::path::Path::new("/etc/causeway/ha/key"));
    assert_eq!(ha.interface, "net1");
    assert_eq!(
        ha.addresses,
        ["192.168.100.2/24".parse::<ipnet::Ipv4Net>().unwrap()]
    );
    let lease = ha.lease.unwrap();
    assert_eq!(lease.name, "example-infra-dhcp");
    assert_eq!(lease.namespace, None, "the pod's own namespace");
    // The other components run as before: no ha section.
    for other in [Component::Dns, Component::Proxy] {
        assert!(plan_config(&plan, other).ha.is_none());
    }
}

#[test]
fn one_component_with_two_replicas_leaves_the_others_as_they_were() {
    let one = rendered(&reference());
    let two = rendered(&two_of(Component::Proxy));
    for component in [Component::Dhcp, Component::Dns] {
        assert_eq!(
            objects_of(&one, component),
            objects_of(&two, component),
            "{}",
            component.name()
        );
    }
    assert_eq!(one.service_account, two.service_account);
    // The pods of the Infra admit each other on the HA port, and only then.
    let rules = |r: &Rendered| {
        r.admin_policy
            .spec
            .as_ref()
            .unwrap()
            .ingress
            .clone()
            .unwrap()
    };
    assert_eq!(rules(&one).len(), 2);
    let two_rules = rules(&two);
    assert_eq!(two_rules[..2], rules(&one)[..]);
    let ha_rule = serde_json::to_value(&two_rules[2]).unwrap();
    assert_eq!(
        ha_rule,
        serde_json::json!({
            "from": [{"podSelector": {"matchLabels": {
                "app.kubernetes.io/instance": "example-infra",
                "app.kubernetes.io/name": "causeway"}}}],
            "ports": [{"port": 7946, "protocol": "UDP"}, {"port": 7946, "protocol": "TCP"}]
        })
    );
}

#[test]
fn an_infra_name_too_long_for_two_replicas_is_refused() {
    let infra = two_of(Component::Dns);
    // 48 + "-dns" is 52: the longest that fits.
    validate(
        &infra.spec,
        &"a".repeat(48),
        "clusters",
        None,
        &no_services,
        &[],
    )
    .unwrap();
    let long = "a".repeat(49);
    let got = validate(&infra.spec, &long, "clusters", None, &no_services, &[]).unwrap_err();
    assert_eq!(
        got,
        [format!(
            "metadata.name: \"{long}\" is too long for two dns replicas: their StatefulSet {long}-dns would be over 52 characters, the most its pods' labels allow"
        )]
    );
    // The same name with one replica is as fine as it always was.
    validate(
        &reference().spec,
        &long,
        "clusters",
        None,
        &no_services,
        &[],
    )
    .unwrap();
}

/// `dnsServers: ["resolv.conf"]`, as the Go operator's users write it: the
/// DNS pod forwards to its own resolvers (its cluster's DNS).
#[test]
fn resolv_conf_forwards_to_the_pods_own_resolvers() {
    let mut infra = reference();
    infra.spec.network_config.dns_servers = vec!["resolv.conf".into(), "192.0.2.53".into()];
    let plan = plan_of(&infra);
    let dns = plan_config(&plan, Component::Dns).dns.unwrap();
    assert!(dns.system_upstreams);
    assert_eq!(dns.upstreams, vec!["192.0.2.53:53".parse().unwrap()]);
}

/// Fifteen upstreams are the most, and all fifteen are rendered.
#[test]
fn fifteen_upstreams_are_all_rendered() {
    let mut infra = reference();
    infra.spec.network_config.dns_servers = (1..=15).map(|n| format!("192.0.2.{n}")).collect();
    let dns = plan_config(&plan_of(&infra), Component::Dns).dns.unwrap();
    assert_eq!(dns.upstreams.len(), 15);
}

#[test]
fn the_pod_monitor_selects_every_component_pod_and_its_admin_port() {
    let r = rendered(&reference());
    let monitor = causeway_operator::infra::render::pod_monitor(&owner());
    assert_eq!(monitor["kind"], "PodMonitor");
    assert_eq!(monitor["metadata"]["namespace"], "clusters");
    assert_eq!(
        monitor["metadata"]["ownerReferences"][0]["kind"], "Infra",
        "owned, so it goes with the Infra"
    );
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "admin");
    assert_eq!(endpoint["path"], "/metrics");
    assert_eq!(r.components.len(), 3);
    for c in &r.components {
        let template = match &c.workload {
            Workload::StatefulSet(s) => &s.spec.as_ref().unwrap().template,
            Workload::Deployment(d) => &d.spec.as_ref().unwrap().template,
        };
        let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        for (k, v) in selector {
            assert_eq!(
                labels.get(k).map(String::as_str),
                v.as_str(),
                "{}: pod label {k}",
                c.component.name()
            );
        }
        // The relabeling reads the component from this pod label.
        assert_eq!(
            labels
                .get("app.kubernetes.io/component")
                .map(String::as_str),
            Some(c.component.name())
        );
        let ports = template.spec.as_ref().unwrap().containers[0]
            .ports
            .as_ref()
            .unwrap();
        assert!(ports.iter().any(|p| p.name.as_deref() == Some("admin")));
    }
    let relabel = endpoint["relabelings"].as_array().unwrap();
    assert!(relabel
        .iter()
        .any(|r| r["targetLabel"] == "infra" && r["replacement"] == "example-infra"));
    assert!(relabel.iter().any(|r| r["targetLabel"] == "component"
        && r["sourceLabels"][0] == "__meta_kubernetes_pod_label_app_kubernetes_io_component"));
}

/// An attachment as the Infra controller reads it: served, and `ready` as
/// its status says.
fn attached(
    name: &str,
    cluster: &str,
    ready: bool,
) -> causeway_operator::infra::attachment::Candidate {
    let spec: causeway_operator::infra::attachment::InfraClusterAttachmentSpec =
        serde_json::from_value(serde_json::json!({
            "infraRef": {"name": "example-infra"},
            "hostedClusterRef": {"name": cluster, "namespace": "clusters"},
            "dns": {"clusterName": cluster, "baseDomain": "example.com"},
        }))
        .unwrap();
    let mut c = causeway_operator::infra::attachment::candidate(name, &spec, None).unwrap();
    c.ready = ready;
    c
}

/// The Go operator's G2–G4 `proxy.externalService` on the Infra: a
/// LoadBalancer `<infra>-proxy-external` exposing only 443 (the proxy takes
/// 443's routes on 8443 for it, and the admin policy lets 8443 in), its
/// pool and labels, and with `publishAttachmentOAuths` the OAuth name of
/// every Ready attachment after the user's names, as that operator wrote
/// them: user names first as written (blanks and repeats dropped), then
/// the added ones sorted, one matching a user's name whatever its case and
/// trailing dot left out.
#[test]
fn the_infras_external_service_publishes_ready_attachments_oauth_names() {
    let mut infra = reference();
    let proxy = infra.spec.infra_components.proxy.as_mut().unwrap();
    proxy.external_service = Some(
        serde_json::from_value(serde_json::json!({
            "enabled": true,
            "addressPoolName": "public",
            "labels": {"external-dns.example.com/publish": "yes"},
            "annotations": {
                "external-dns.alpha.kubernetes.io/hostname": " api.example.com , ,OAUTH.HC-B.example.com.,api.example.com",
                "metallb.universe.tf/address-pool": "overridden",
            },
            "publishAttachmentOAuths": true,
        }))
        .unwrap(),
    );
    let attachments = [
        attached("c", "hc-c", true),
        attached("a", "hc-a", true),
        attached("b", "hc-b", true),
        attached("d", "hc-d", false),
    ];
    let plan = validate(
        &infra.spec,
        "example-infra",
        "clusters",
        None,
        &no_services,
        &attachments,
    )
    .unwrap();
    assert!(plan.external_proxy);
    // 8443 on every address, with 443's routes.
    let proxy_config = plan_config(&plan, Component::Proxy).proxy.unwrap();
    assert!(
        proxy_config
            .listeners
            .iter()
            .any(|l| l.listen.to_string() == "0.0.0.0:8443"),
        "{:?}",
        proxy_config.listeners
    );
    let r = render(&plan, &owner(), &settings());
    let svc = serde_json::to_value(r.external_service.as_ref().unwrap()).unwrap();
    assert_eq!(svc["metadata"]["name"], "example-infra-proxy-external");
    assert_eq!(svc["metadata"]["namespace"], "clusters");
    assert_eq!(svc["metadata"]["ownerReferences"][0]["kind"], "Infra");
    assert_eq!(
        svc["metadata"]["labels"]["external-dns.example.com/publish"],
        "yes"
    );
    assert_eq!(
        svc["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"],
        "api.example.com,OAUTH.HC-B.example.com.,oauth.hc-a.example.com,oauth.hc-c.example.com"
    );
    assert_eq!(
        svc["metadata"]["annotations"]["metallb.universe.tf/address-pool"],
        "public"
    );
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/component"],
        "proxy"
    );
    assert_eq!(
        svc["spec"]["ports"],
        serde_json::json!([{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}])
    );
    let policy = serde_json::to_value(&r.admin_policy).unwrap().to_string();
    assert!(policy.contains("8443"), "{policy}");

    // No Ready attachment: the user's annotation as written.
    let none_ready = [attached("d", "hc-d", false)];
    let plan = validate(
        &infra.spec,
        "example-infra",
        "clusters",
        None,
        &no_services,
        &none_ready,
    )
    .unwrap();
    assert_eq!(
        plan.external_service.unwrap().annotations["external-dns.alpha.kubernetes.io/hostname"],
        " api.example.com , ,OAUTH.HC-B.example.com.,api.example.com"
    );

    // Turned off, or without a proxy: no Service, and no 8443.
    let proxy = infra.spec.infra_components.proxy.as_mut().unwrap();
    proxy.external_service.as_mut().unwrap().service.enabled = false;
    let r = render(&plan_of(&infra), &owner(), &settings());
    assert!(r.external_service.is_none());
    assert!(!serde_json::to_value(&r.admin_policy)
        .unwrap()
        .to_string()
        .contains("8443"));
}

#[test]
fn scratch_print_two_attachment_configs() {
    let infra: Infra = serde_saphyr::from_str(
        r#"
apiVersion: hostedcluster.densityops.com/v1alpha1
kind: Infra
metadata: {name: vlan100, namespace: tenants}
spec:
  networkConfig:
    cidr: 192.168.100.0/24
    gateway: 192.168.100.1
    networkAttachmentDefinition: vlan100
    dnsServers: [10.0.0.1]
  infraComponents:
    dns: {serverIP: 192.168.100.3}
    proxy: {serverIP: 192.168.100.4}
"#,
    )
    .unwrap();
    let a = attached("a", "hc1", true);
    let b = attached("b", "hc2", true);
    let plan = validate(
        &infra.spec,
        "vlan100",
        "tenants",
        None,
        &no_services,
        &[a, b],
    )
    .unwrap();
    for c in [Component::Dns, Component::Proxy] {
        println!("=== {c:?}\n{}", plan.component(c).unwrap().config_text);
    }
}

/// The Go operator's first generations (G0–G2) put apps ingress on the
/// Infra, with a hosted-cluster reference and a second domain of its own:
/// the Infra keeps every field (nothing for the API server to prune, as the
/// CRD's schema has them), and its `IgnoredFields` gives the attachment that
/// runs it, for the cluster the Infra names, which the attachment's own
/// apps ingress plan accepts.
#[test]
fn apps_ingress_on_the_infra_is_kept_and_its_attachment_given() {
    let mut doc: serde_json::Value = serde_saphyr::from_str(REFERENCE).unwrap();
    doc["spec"]["appsIngress"] = serde_json::json!({
        "enabled": true,
        "baseDomain": "apps-alias.example.org",
        "hostedClusterRef": {"name": "my-cluster"},
        "metallb": {"addressPoolName": "apps-pool", "ipAddressPoolRange": "192.168.100.220-192.168.100.229"},
        "service": {"name": "oooi-ingress", "namespace": "openshift-ingress"},
        "ports": {"http": 80, "https": 443},
    });
    let infra: Infra = serde_json::from_value(doc.clone()).unwrap();
    // Every field written is read back as written (the defaults the
    // Infra adds, such as metallb.install, aside).
    let read_back = serde_json::to_value(&infra.spec).unwrap()["appsIngress"].clone();
    fn within(written: &serde_json::Value, read: &serde_json::Value) -> bool {
        match (written, read) {
            (serde_json::Value::Object(w), serde_json::Value::Object(r)) => w
                .iter()
                .all(|(k, v)| r.get(k).is_some_and(|rv| within(v, rv))),
            _ => written == read,
        }
    }
    assert!(
        within(&doc["spec"]["appsIngress"], &read_back),
        "{read_back}"
    );
    let schema = serde_json::to_value(<Infra as kube::CustomResourceExt>::crd()).unwrap();
    let apps = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["appsIngress"]["properties"];
    for field in [
        "enabled",
        "baseDomain",
        "hostedClusterRef",
        "metallb",
        "service",
        "ports",
    ] {
        assert!(
            apps.get(field).is_some(),
            "the CRD's schema keeps appsIngress.{field}"
        );
    }

    let plan = plan_of(&infra);
    let warning = plan
        .warnings
        .iter()
        .find(|w| w.starts_with("spec.appsIngress"))
        .expect("IgnoredFields names spec.appsIngress");
    let (_, json) = warning
        .split_once("apply this InfraClusterAttachment to run it: ")
        .expect("the attachment to apply");
    let json = json.split("; its second domain").next().unwrap();
    let attachment: causeway_operator::infra::attachment::InfraClusterAttachment =
        serde_json::from_str(json).unwrap();
    assert_eq!(attachment.metadata.name.as_deref(), Some("my-cluster"));
    assert_eq!(attachment.metadata.namespace.as_deref(), Some("clusters"));
    let s = &attachment.spec;
    assert_eq!(s.infra_ref.name, "example-infra");
    assert_eq!(
        (
            s.hosted_cluster_ref.name.as_str(),
            s.hosted_cluster_ref.namespace.as_str()
        ),
        ("my-cluster", "clusters")
    );
    assert_eq!(
        (s.dns.cluster_name.as_str(), s.dns.base_domain.as_str()),
        ("my-cluster", "example.com")
    );
    assert_eq!(
        s.control_plane_namespace.as_deref(),
        Some("clusters-my-cluster")
    );
    let apps = s.apps_ingress.as_ref().unwrap();
    assert_eq!(apps, &infra.spec.apps_ingress.as_ref().unwrap().apps);
    assert!(causeway_operator::infra::apps_ingress::plan(
        apps,
        causeway_operator::infra::attachment::Lineage::Causeway
    )
    .is_ok());
    assert!(
        warning.ends_with("its second domain *.apps.apps-alias.example.org has no attachment field and is not served"),
        "{warning}"
    );

    // Named by its HostedCluster alone, the Infra's attachment is named so
    // too.
    doc["spec"]["infraComponents"]["dns"]["baseDomain"] = serde_json::Value::Null;
    doc["spec"]["infraComponents"]["dns"]["clusterName"] = serde_json::Value::Null;
    doc["spec"]["hostedClusterRef"] = serde_json::json!({"name": "hc2", "namespace": "clusters"});
    doc["spec"]["appsIngress"]["hostedClusterRef"] = serde_json::Value::Null;
    let infra: Infra = serde_json::from_value(doc).unwrap();
    let facts = HostedClusterFacts {
        name: "hc2".into(),
        namespace: "clusters".into(),
        base_domain: Some("example.net".into()),
        ..Default::default()
    };
    let converted = causeway_operator::infra::validate::attachment_for_infra_apps_ingress(
        &infra.spec,
        "example-infra",
        "clusters",
        Some(&facts),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (
            converted.spec.hosted_cluster_ref.name.as_str(),
            converted.spec.dns.cluster_name.as_str(),
            converted.spec.dns.base_domain.as_str()
        ),
        ("hc2", "hc2", "example.net")
    );
}

/// The reference Infra on a dual-stack VLAN: the additive fields only.
fn dual_stack() -> Infra {
    let mut infra = reference();
    infra.spec.network_config.ipv6 = Some(causeway_operator::infra::crd::NetworkV6 {
        cidr: "fd42:100::/64".into(),
        gateway: "fe80::1".into(),
        router_advertisements: false,
        dhcp_range: None,
    });
    let comps = &mut infra.spec.infra_components;
    comps.dhcp.as_mut().unwrap().server_ipv6 = Some("fd42:100::2".into());
    comps.dns.as_mut().unwrap().server_ipv6 = Some("fd42:100::3/64".into());
    comps.proxy.as_mut().unwrap().server_ipv6 = Some("fd42:100::10".into());
    infra
}

#[test]
fn a_dual_stack_infra_serves_dns_and_the_proxy_over_v6_and_routes_v6_replies() {
    let infra = dual_stack();
    let plan = plan_of(&infra);
    let dns = plan_config(&plan, Component::Dns).dns.unwrap();
    assert_eq!(
        dns.listen
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["192.168.100.3:53", "[fd42:100::3]:53"]
    );
    let proxy = plan_config(&plan, Component::Proxy).proxy.unwrap();
    assert!(
        proxy
            .listeners
            .iter()
            .any(|l| l.listen.to_string() == "[fd42:100::10]:6443"),
        "{:?}",
        proxy.listeners
    );
    // AAAA for the proxied names: the proxy's v6 address.
    let text = &plan.component(Component::Dns).unwrap().config_text;
    assert!(text.contains("proxyAddressV6: fd42:100::10"), "{text}");
    for component in [Component::Dhcp, Component::Dns, Component::Proxy] {
        let routing = plan_config(&plan, component).routing.unwrap();
        let v6 = routing.interfaces[0].ipv6.as_ref().unwrap();
        assert_eq!(v6.cidr.to_string(), "fd42:100::/64");
        assert_eq!(v6.gateway.to_string(), "fe80::1");
    }
    // Both addresses on the VLAN attachment.
    let r = render(&plan, &owner(), &settings());
    let dns_pod = r
        .components
        .iter()
        .find(|c| c.component.name() == "dns")
        .unwrap();
    let Workload::Deployment(d) = &dns_pod.workload else {
        panic!("one DNS replica runs as a Deployment")
    };
    let annotations = d
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert_eq!(
        annotations["k8s.v1.cni.cncf.io/networks"],
        r#"[{"interface":"net1","ips":["192.168.100.3/24","fd42:100::3/64"],"name":"vlan100","namespace":"default"}]"#
    );
    // Without the v6 fields nothing changes: the Go operator's manifest
    // means what it meant.
    let v4 = plan_of(&reference());
    let text = &v4.component(Component::Dns).unwrap().config_text;
    assert!(!text.contains("V6") && !text.contains("ipv6"), "{text}");
}

#[test]
fn a_dual_stack_pair_moves_the_v6_address_too() {
    let mut infra = dual_stack();
    infra.spec.infra_components.dns.as_mut().unwrap().replicas = Some(2);
    let plan = plan_of(&infra);
    let ha = plan_config(&plan, Component::Dns).ha.unwrap();
    assert_eq!(
        ha.addresses_v6
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["fd42:100::3/64"]
    );
}

#[test]
fn bad_v6_fields_get_their_precise_messages() {
    type Change = fn(&mut Infra);
    let table: Vec<(&str, Change, &str)> = vec![
        (
            "v6 address without a v6 network",
            |i| i.spec.network_config.ipv6 = None,
            "infraComponents.dhcp.serverIPv6: needs networkConfig.ipv6 (the VLAN's IPv6 prefix)",
        ),
        (
            "bad v6 cidr",
            |i| i.spec.network_config.ipv6.as_mut().unwrap().cidr = "fd42::/129".into(),
            r#"networkConfig.ipv6.cidr: "fd42::/129" is not an IPv6 CIDR such as fd42:10::/64"#,
        ),
        (
            "v6 address outside",
            |i| {
                i.spec.infra_components.dns.as_mut().unwrap().server_ipv6 =
                    Some("fd43::3".into())
            },
            "infraComponents.dns.serverIPv6: fd43::3 is outside networkConfig.ipv6.cidr fd42:100::/64",
        ),
        (
            "v6 address twice",
            |i| {
                i.spec.infra_components.proxy.as_mut().unwrap().server_ipv6 =
                    Some("fd42:100::3".into())
            },
            "infraComponents.proxy.serverIPv6: fd42:100::3 is also infraComponents.dns.serverIPv6",
        ),
        (
            "v6 prefix length differs",
            |i| {
                i.spec.infra_components.dns.as_mut().unwrap().server_ipv6 =
                    Some("fd42:100::3/80".into())
            },
            "infraComponents.dns.serverIPv6: prefix /80 differs from networkConfig.ipv6.cidr fd42:100::/64",
        ),
        (
            "a v6 VLAN inside OVN's join subnets",
            |i| {
                i.spec.network_config.ipv6.as_mut().unwrap().cidr = "fd99::/64".into();
                let c = &mut i.spec.infra_components;
                c.dhcp.as_mut().unwrap().server_ipv6 = Some("fd99::2".into());
                c.dns.as_mut().unwrap().server_ipv6 = Some("fd99::3".into());
                c.proxy.as_mut().unwrap().server_ipv6 = Some("fd99::10".into());
            },
            "networkConfig.ipv6.cidr: fd99::/64 overlaps fd99::/64, inside fd97::/64–fd99::/64",
        ),
    ];
    for (what, change, want) in table {
        let mut infra = dual_stack();
        change(&mut infra);
        let errors = validate(
            &infra.spec,
            "example-infra",
            "clusters",
            None,
            &no_services,
            &[],
        )
        .err()
        .unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{what}: no error starting {want:?} in {errors:#?}"
        );
    }
}

#[test]
fn the_dhcp_pod_advertises_the_v6_prefix_and_answers_stateless_dhcpv6_when_asked() {
    let mut infra = dual_stack();
    assert!(plan_config(&plan_of(&infra), Component::Dhcp)
        .router_advertisements
        .is_none());
    infra
        .spec
        .network_config
        .ipv6
        .as_mut()
        .unwrap()
        .router_advertisements = true;
    let dhcp = plan_config(&plan_of(&infra), Component::Dhcp);
    let ra = dhcp.router_advertisements.unwrap();
    assert_eq!(ra.interface, "net1");
    assert_eq!(ra.prefixes[0].prefix.to_string(), "fd42:100::/64");
    assert!(ra.prefixes[0].autonomous && ra.other_config && !ra.managed);
    assert!(
        ra.router_lifetime.is_zero(),
        "the VLAN's router stays the default router"
    );
    assert_eq!(
        ra.dns_servers,
        ["fd42:100::3".parse::<std::net::Ipv6Addr>().unwrap()]
    );
    assert_eq!(ra.search_domains, ["my-cluster.example.com"]);
    let d6 = dhcp.dhcp6.unwrap();
    assert_eq!(d6.dns_servers, ra.dns_servers);
    assert_eq!(d6.domain_search, ["my-cluster.example.com"]);
    // The DNS and proxy pods advertise nothing.
    for c in [Component::Dns, Component::Proxy] {
        let cfg = plan_config(&plan_of(&infra), c);
        assert!(cfg.router_advertisements.is_none() && cfg.dhcp6.is_none());
    }
    infra.spec.infra_components.dhcp = None;
    let errors = validate(
        &infra.spec,
        "example-infra",
        "clusters",
        None,
        &no_services,
        &[],
    )
    .err()
    .unwrap();
    assert!(
        errors.iter().any(|e| e
            .starts_with("networkConfig.ipv6.routerAdvertisements: needs infraComponents.dhcp")),
        "{errors:#?}"
    );
}

#[test]
fn a_dhcp_range_makes_the_dhcp_pod_lease_v6_addresses_with_the_m_flag() {
    let mut infra = dual_stack();
    {
        let v6 = infra.spec.network_config.ipv6.as_mut().unwrap();
        v6.router_advertisements = true;
        v6.dhcp_range = Some(causeway_operator::infra::crd::RangeV6 {
            start: "fd42:100::1000".into(),
            end: "fd42:100::1fff".into(),
        });
    }
    let dhcp = plan_config(&plan_of(&infra), Component::Dhcp);
    let ra = dhcp.router_advertisements.as_ref().unwrap();
    assert!(ra.managed, "the M flag tells hosts to lease");
    let stateful = dhcp.dhcp6.as_ref().unwrap().stateful.clone().unwrap();
    assert_eq!(stateful.prefix.to_string(), "fd42:100::/64");
    assert_eq!(
        (
            stateful.pools[0].start.to_string(),
            stateful.pools[0].end.to_string()
        ),
        ("fd42:100::1000".into(), "fd42:100::1fff".into())
    );
    // The leases live in the DHCP pod's lease store, which it has.
    assert!(dhcp.dhcp.is_some());
    // Both replicas of a pair answer with one DUID, stable across renders.
    let duid = dhcp.dhcp6.as_ref().unwrap().server_duid.clone().unwrap();
    assert_eq!(&duid[..4], &[0, 3, 0, 1]);
    assert_eq!(
        plan_config(&plan_of(&infra), Component::Dhcp)
            .dhcp6
            .unwrap()
            .server_duid,
        Some(duid)
    );
    // Without advertisements the pod still leases (hosts that ask on
    // their own), and advertises nothing.
    infra
        .spec
        .network_config
        .ipv6
        .as_mut()
        .unwrap()
        .router_advertisements = false;
    let dhcp = plan_config(&plan_of(&infra), Component::Dhcp);
    assert!(dhcp.router_advertisements.is_none());
    assert!(dhcp.dhcp6.unwrap().stateful.is_some());
    for (start, end, want) in [
        (
            "fd42:200::1",
            "fd42:100::2",
            "networkConfig.ipv6.dhcpRange.start: fd42:200::1 is outside networkConfig.ipv6.cidr",
        ),
        (
            "fd42:100::9",
            "fd42:100::1",
            "networkConfig.ipv6.dhcpRange: starts after it ends",
        ),
        (
            "nope",
            "fd42:100::1",
            "networkConfig.ipv6.dhcpRange.start: \"nope\" is not an IPv6 address",
        ),
    ] {
        infra.spec.network_config.ipv6.as_mut().unwrap().dhcp_range =
            Some(causeway_operator::infra::crd::RangeV6 {
                start: start.into(),
                end: end.into(),
            });
        let errors = validate(
            &infra.spec,
            "example-infra",
            "clusters",
            None,
            &no_services,
            &[],
        )
        .err()
        .unwrap();
        assert!(
            errors.iter().any(|e| e.starts_with(want)),
            "{want}: {errors:#?}"
        );
    }
}
