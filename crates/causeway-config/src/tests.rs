use super::*;
use std::net::Ipv4Addr;

fn errors(yaml: &str) -> Vec<String> {
    match Config::from_yaml(yaml) {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const VLAN: &str = r#"
cluster: {name: hc1, baseDomain: example.com}
network:
  interface: net1
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: 192.168.100.2
  staticAddresses: [192.168.100.3, 192.168.100.4]
dhcp: {}
"#;

#[test]
fn embedded_default_is_valid() {
    let cfg = Config::from_yaml(EMBEDDED_DEFAULT).unwrap();
    let dhcp = cfg.dhcp.unwrap();
    assert_eq!(
        dhcp.listen,
        vec![DhcpListen::Address("127.0.0.1:6767".parse().unwrap())]
    );
    assert_eq!(cfg.admin.listen.to_string(), "127.0.0.1:9090");
}

#[test]
fn vlan_subnet_is_derived_from_the_network() {
    let cfg = Config::from_yaml(VLAN).unwrap();
    let dhcp = cfg.dhcp.unwrap();
    assert_eq!(dhcp.listen, vec![DhcpListen::Interface("net1".into())]);
    let s = &dhcp.subnets[0];
    assert_eq!(s.cidr.to_string(), "192.168.100.0/24");
    assert_eq!(
        s.pools,
        vec![AddressRange {
            start: Ipv4Addr::new(192, 168, 100, 1),
            end: Ipv4Addr::new(192, 168, 100, 254)
        }]
    );
    for a in [1, 2, 3, 4] {
        let addr = Ipv4Addr::new(192, 168, 100, a);
        assert!(
            s.exclude.iter().any(|e| e.contains(addr)),
            "{addr} not excluded"
        );
    }
    assert_eq!(s.server_id, Ipv4Addr::new(192, 168, 100, 2));
    assert_eq!(s.options.router, vec![Ipv4Addr::new(192, 168, 100, 1)]);
    assert_eq!(s.options.dns_servers, vec![Ipv4Addr::new(192, 168, 100, 2)]);
    assert_eq!(s.options.domain_name.as_deref(), Some("hc1.example.com"));
    assert_eq!(s.interface.as_deref(), Some("net1"));
    assert_eq!(dhcp.lease_time, std::time::Duration::from_secs(3600));
}

#[test]
fn every_error_is_reported_with_its_path() {
    let e = errors(
        r#"
network: {cidr: 192.168.1.0/24, gateway: 192.168.2.1, address: 192.168.1.2}
dhcp:
  listen: [{interface: net1}]
  leaseTime: soon
  subnets:
    - interface: net1
      pools: [{start: 192.168.1.10, end: 192.168.1.300}]
      reservations:
        - {mac: "zz:00", ip: 10.0.0.1}
"#,
    );
    assert!(
        e.contains(
            &"network.gateway: 192.168.2.1 is outside network.cidr 192.168.1.0/24".to_string()
        ),
        "{e:#?}"
    );
    assert!(
        e.contains(
            &"dhcp.leaseTime: soon is not a duration such as 90, 90s, 15m, 1h or 2d".to_string()
        ),
        "{e:#?}"
    );
    assert!(
        e.contains(
            &"dhcp.subnets[0].pools[0].end: 192.168.1.300 is not an IPv4 address".to_string()
        ),
        "{e:#?}"
    );
    assert!(e.contains(&"dhcp.subnets[0].reservations[0].mac: zz:00 is not a MAC address such as 52:54:00:12:34:56".to_string()), "{e:#?}");
    assert!(
        e.contains(
            &"dhcp.subnets[0].reservations[0].ip: 10.0.0.1 is outside subnet 192.168.1.0/24"
                .to_string()
        ),
        "{e:#?}"
    );
    assert_eq!(e.len(), 5, "{e:#?}");
}

#[test]
fn address_outside_the_cidr_is_refused() {
    let e = errors(
        "dhcp:\n  listen: [{address: '127.0.0.1:6767'}]\n  subnets:\n    - {cidr: 10.0.0.0/24, serverId: 10.0.0.1, pools: [{start: 10.0.0.10, end: 10.0.1.5}]}\n",
    );
    assert_eq!(
        e,
        vec!["dhcp.subnets[0].pools[0].end: 10.0.1.5 is outside subnet 10.0.0.0/24"]
    );
}

#[test]
fn unknown_fields_and_wrong_types_name_their_path() {
    let e = errors("dhcp:\n  subnets:\n    - cidr: 10.0.0.0/24\n      poolz: []\n");
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("dhcp.subnets[0].poolz: unknown field `poolz`"),
        "{e:?}"
    );
    let e = errors("dhcp:\n  maxInFlight: lots\n");
    assert!(e[0].starts_with("dhcp.maxInFlight: invalid"), "{e:?}");
    assert!(e[0].contains("line 2"), "the position is given: {e:?}");
}

#[test]
fn host_bits_in_a_cidr_are_refused_with_the_network_named() {
    let e = errors("network: {cidr: 10.1.2.3/24}\n");
    assert_eq!(
        e,
        vec!["network.cidr: 10.1.2.3/24 has host bits set; the network is 10.1.2.0/24"]
    );
}

#[test]
fn overlapping_pools_subnets_and_reservations_are_refused() {
    let e = errors(
        r#"
dhcp:
  listen: [{address: "127.0.0.1:6767"}]
  subnets:
    - cidr: 10.0.0.0/24
      serverId: 10.0.0.1
      pools: [{start: 10.0.0.10, end: 10.0.0.20}, {start: 10.0.0.15, end: 10.0.0.30}]
      reservations:
        - {mac: "52:54:00:00:00:01", ip: 10.0.0.50}
        - {mac: "52:54:00:00:00:02", ip: 10.0.0.50}
        - {mac: "52:54:00:00:00:01", ip: 10.0.0.51}
    - {cidr: 10.0.0.0/16, serverId: 10.0.0.1}
"#,
    );
    assert_eq!(
        e,
        vec![
            "dhcp.subnets[0].pools[1]: 10.0.0.15-10.0.0.30 overlaps pool 10.0.0.10-10.0.0.20",
            "dhcp.subnets[0].reservations[1].ip: 10.0.0.50 is also reserved by dhcp.subnets[0].reservations[0]",
            "dhcp.subnets[0].reservations[2]: this client already has a reservation in this subnet",
            "dhcp.subnets[1].cidr: 10.0.0.0/16 overlaps subnet 10.0.0.0/24",
        ]
    );
}

#[test]
fn custom_options_are_typed_and_encoded() {
    let cfg = Config::from_yaml(
        r#"
dhcp:
  listen: [{address: "127.0.0.1:6767"}]
  subnets:
    - cidr: 10.0.0.0/24
      serverId: 10.0.0.1
      options:
        - {code: 150, ipv4: [10.0.0.5, 10.0.0.6]}
        - {code: 66, string: tftp.example}
        - {code: 224, hex: "01:02:ff"}
        - {code: 225, u16: 513}
"#,
    )
    .unwrap();
    let custom = &cfg.dhcp.unwrap().subnets[0].options.custom;
    assert_eq!(
        custom[0],
        CustomOption {
            code: 150,
            value: vec![10, 0, 0, 5, 10, 0, 0, 6]
        }
    );
    assert_eq!(custom[1].value, b"tftp.example");
    assert_eq!(custom[2].value, vec![1, 2, 255]);
    assert_eq!(custom[3].value, vec![2, 1]);

    let e = errors("dhcp:\n  listen: [{address: '127.0.0.1:1'}]\n  subnets:\n    - {cidr: 10.0.0.0/24, serverId: 10.0.0.1, options: [{code: 53, u8: 1}, {code: 70, u8: 1, u16: 2}]}\n");
    assert_eq!(
        e,
        vec![
            "dhcp.subnets[0].options[0].code: option 53 is managed by the server and cannot be set",
            "dhcp.subnets[0].options[1]: give exactly one value: ipv4, string, u8, u16, u32, bool or hex",
        ]
    );
}

#[test]
fn durations_accept_units() {
    assert_eq!(
        parse_duration("90"),
        Some(std::time::Duration::from_secs(90))
    );
    assert_eq!(
        parse_duration("15m"),
        Some(std::time::Duration::from_secs(900))
    );
    assert_eq!(
        parse_duration("2d"),
        Some(std::time::Duration::from_secs(172800))
    );
    assert_eq!(
        parse_duration("250ms"),
        Some(std::time::Duration::from_millis(250))
    );
    assert_eq!(
        parse_duration("1h 30m"),
        Some(std::time::Duration::from_secs(5400))
    );
    assert_eq!(parse_duration("1 fortnight"), None);
    assert_eq!(parse_duration("-5s"), None);
    assert_eq!(parse_duration(""), None);
    assert_eq!(parse_duration("99999999999999999999d"), None);
}

#[test]
fn garbage_yaml_is_an_error_not_a_panic() {
    for text in [
        "{",
        "- a\n- b",
        "dhcp: [1, 2]",
        "\u{0}",
        "dhcp:\n  subnets: {",
    ] {
        assert!(Config::from_yaml(text).is_err(), "{text:?}");
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,200}") {
        let _ = Config::from_yaml(&text);
    }
}

fn dns(yaml: &str) -> DnsConfig {
    Config::from_yaml(yaml).unwrap().dns.unwrap()
}

fn a_records<'a>(view: &'a DnsView, name: &str) -> Vec<&'a RecordData> {
    view.records
        .iter()
        .filter(|r| r.name == name)
        .map(|r| &r.data)
        .collect()
}

#[test]
fn dns_derives_the_cluster_names_from_the_network_and_cluster() {
    let d = dns(&format!("{VLAN}dns: {{}}\n"));
    assert_eq!(d.zone.as_deref(), Some("hc1.example.com."));
    assert_eq!(
        d.listen,
        vec![
            "192.168.100.2:53".parse().unwrap(),
            "127.0.0.1:53".parse().unwrap()
        ]
    );
    let view = d.views.last().unwrap();
    assert_eq!(view.name, "default");
    let proxy = RecordData::A(Ipv4Addr::new(192, 168, 100, 2));
    for name in ["api", "api-int", "oauth", "ignition", "konnectivity"] {
        assert_eq!(
            a_records(view, &format!("{name}.hc1.example.com.")),
            vec![&proxy],
            "{name}"
        );
    }
    // No proxy here routes *.apps, so it is not answered locally.
    assert!(a_records(view, "*.apps.hc1.example.com.").is_empty());
    assert_eq!(
        a_records(view, "2.100.168.192.in-addr.arpa."),
        vec![&RecordData::Ptr("causeway.hc1.example.com.".into())]
    );
    assert!(d
        .recursion_clients
        .contains(&"192.168.100.0/24".parse().unwrap()));
}

#[test]
fn apps_resolve_to_the_proxy_only_when_it_has_an_ingress_or_to_the_ingress_address() {
    let apps = "*.apps.hc1.example.com.";
    let proxy = RecordData::A(Ipv4Addr::new(192, 168, 100, 2));
    let with_ingress = Config::from_yaml(&format!(
        "{VLAN}dns: {{}}\nproxy: {{ingressHttps: \"router.example.internal:443\"}}\n"
    ))
    .unwrap()
    .dns
    .unwrap();
    assert_eq!(
        a_records(with_ingress.views.last().unwrap(), apps),
        vec![&proxy]
    );
    let without = Config::from_yaml(&format!("{VLAN}dns: {{}}\nproxy: {{}}\n"))
        .unwrap()
        .dns
        .unwrap();
    assert!(a_records(without.views.last().unwrap(), apps).is_empty());
    let direct = dns(&format!("{VLAN}dns: {{ingressAddress: 192.168.100.50}}\n"));
    assert_eq!(
        a_records(direct.views.last().unwrap(), apps),
        vec![&RecordData::A(Ipv4Addr::new(192, 168, 100, 50))]
    );
}

#[test]
fn dns_views_point_the_same_name_elsewhere_and_records_override() {
    let d = dns(&format!(
        "{VLAN}dns:\n  proxyAddress: 192.168.100.3\n  records:\n    - {{name: registry, type: A, value: 10.1.1.1}}\n    - {{name: oauth, type: A, value: 192.168.100.9}}\n  views:\n    - name: vlan\n      clients: [192.168.100.0/24]\n    - name: mgmt\n      clients: [10.0.0.0/8]\n      proxyAddress: 172.30.0.10\n      records:\n        - {{name: registry, type: CNAME, value: mirror.corp.}}\n"
    ));
    assert_eq!(
        d.views.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        vec!["vlan", "mgmt", "default"]
    );
    let (vlan, mgmt) = (&d.views[0], &d.views[1]);
    assert_eq!(
        a_records(vlan, "api.hc1.example.com."),
        vec![&RecordData::A(Ipv4Addr::new(192, 168, 100, 3))]
    );
    assert_eq!(
        a_records(mgmt, "api.hc1.example.com."),
        vec![&RecordData::A(Ipv4Addr::new(172, 30, 0, 10))]
    );
    // An explicit record replaces the derived one of the same name and type.
    assert_eq!(
        a_records(vlan, "oauth.hc1.example.com."),
        vec![&RecordData::A(Ipv4Addr::new(192, 168, 100, 9))]
    );
    // A view adds its own records to the shared ones.
    assert_eq!(
        a_records(mgmt, "registry.hc1.example.com."),
        vec![
            &RecordData::A(Ipv4Addr::new(10, 1, 1, 1)),
            &RecordData::Cname("mirror.corp.".into())
        ]
    );
}

#[test]
fn dns_errors_name_their_paths() {
    let e = errors(&format!(
        "{VLAN}dns:\n  upstreams: [10.0.0.300]\n  records:\n    - {{name: x, type: MX, value: mail}}\n    - {{name: y, type: SRV, value: \"0 10\"}}\n    - {{name: z, type: A, value: 1.2.3}}\n  views:\n    - {{name: v, clients: [10.0.0.0/33]}}\n"
    ));
    assert_eq!(
        e,
        vec![
            "dns.records[0].type: MX is not one of: A, AAAA, CNAME, SRV, TXT, PTR",
            "dns.records[1].value: 0 10 is not \"priority weight port target\", such as \"0 10 2379 etcd-0\"",
            "dns.records[2].value: 1.2.3 is not an IPv4 address",
            "dns.views[0].clients[0]: 10.0.0.0/33 is not a CIDR or address",
            "dns.upstreams[0]: 10.0.0.300 is not an address or address:port",
        ]
    );
}

#[test]
fn proxy_routes_are_derived_from_the_cluster() {
    let p = Config::from_yaml(&format!(
        "{VLAN}proxy:\n  ingressHttps: 'router.apps-ingress.svc:443'\n"
    ))
    .unwrap()
    .proxy
    .unwrap();
    assert_eq!(p.listeners.len(), 2);
    assert_eq!(p.listeners[0].listen.to_string(), "192.168.100.2:6443");
    assert_eq!(
        p.listeners[0].kind,
        ListenerKind::Plain(Upstream::named("kube-apiserver.clusters-hc1.svc", 6443))
    );
    let ListenerKind::Sni { routes, default } = &p.listeners[1].kind else {
        panic!("443 routes by SNI")
    };
    assert_eq!(default, &None);
    let names: Vec<&str> = routes.iter().filter_map(|r| r.sni.as_deref()).collect();
    assert_eq!(
        names,
        vec![
            "oauth.hc1.example.com",
            "ignition.hc1.example.com",
            "konnectivity.hc1.example.com",
            "*.apps.hc1.example.com"
        ]
    );
    assert_eq!(
        routes[0].upstream.to_string(),
        "oauth-openshift.clusters-hc1.svc:6443"
    );
}

#[test]
fn proxy_listener_errors_name_their_paths() {
    let e = errors(&format!(
        "{VLAN}proxy:\n  listeners:\n    - {{port: 6443, upstream: 'nohost'}}\n    - {{port: 6443, upstream: '10.0.0.1:6443'}}\n    - {{port: 443}}\n"
    ));
    assert_eq!(
        e,
        vec![
            "proxy.listeners[0].upstream: nohost is not host:port, such as kube-apiserver.clusters-hc1.svc:6443",
            "proxy.listeners[1].port: port 6443 is listed twice",
            "proxy.listeners[2]: give either upstream, or routes (with an optional default)",
        ]
    );
}

#[test]
fn proxy_balance_and_health_check_default_and_parse() {
    let p = Config::from_yaml(&format!("{VLAN}proxy: {{}}\n"))
        .unwrap()
        .proxy
        .unwrap();
    assert_eq!(p.balance, crate::Balance::RoundRobin);
    assert_eq!(p.health_check, None);
    let p = Config::from_yaml(&format!(
        "{VLAN}proxy:\n  balance: leastConnections\n  healthCheck: {{interval: 2s, unhealthyThreshold: 3}}\n"
    ))
    .unwrap()
    .proxy
    .unwrap();
    assert_eq!(p.balance, crate::Balance::LeastConnections);
    assert_eq!(
        p.health_check,
        Some(crate::HealthCheck {
            interval: std::time::Duration::from_secs(2),
            timeout: std::time::Duration::from_secs(1),
            unhealthy_threshold: 3,
            healthy_threshold: 1,
        })
    );
}

#[test]
fn proxy_balance_and_health_check_errors_name_their_paths() {
    let e = errors(&format!(
        "{VLAN}proxy:\n  balance: random\n  healthCheck: {{interval: 1s, timeout: 2s, healthyThreshold: 0}}\n"
    ));
    assert_eq!(
        e,
        vec![
            "proxy.balance: random is not roundRobin or leastConnections",
            "proxy.healthCheck.timeout: must not be longer than the interval",
            "proxy.healthCheck.healthyThreshold: must be at least 1",
        ]
    );
}

#[test]
fn routing_derives_from_the_network() {
    let r = Config::from_yaml(&format!("{VLAN}routing: {{extraRoutes: [10.20.0.0/16]}}\n"))
        .unwrap()
        .routing
        .unwrap();
    assert!(r.loose_rp_filter);
    assert_eq!(
        r.interfaces,
        vec![crate::RoutedInterface {
            interface: "net1".into(),
            cidr: "192.168.100.0/24".parse().unwrap(),
            address: Ipv4Addr::new(192, 168, 100, 2),
            gateway: Ipv4Addr::new(192, 168, 100, 1),
            table: 100,
            priority: 1000,
            extra_routes: vec!["10.20.0.0/16".parse().unwrap()],
            ipv6: None,
        }]
    );
}

#[test]
fn routing_errors_name_their_paths() {
    let e = errors(
        "routing:\n  interfaces:\n    - {interface: net1, cidr: 10.0.0.0/24, address: 10.0.1.2, gateway: 10.0.0.1, table: 254, priority: 32767}\n    - {interface: net2, cidr: 10.0.2.0/24, address: 10.0.2.2, gateway: 10.0.2.1, table: 101, extraRoutes: [nope]}\n",
    );
    assert_eq!(
        e,
        vec![
            "routing.interfaces[0].table: table 254 is reserved by the kernel (0, 253 default, 254 main, 255 local)",
            "routing.interfaces[0].priority: priority 32767 must be between 1 and 32765, before the main table's rule",
            "routing.interfaces[0].address: 10.0.1.2 is not in 10.0.0.0/24",
            "routing.interfaces[1].extraRoutes[0]: nope is not an IPv4 CIDR such as 10.20.0.0/16",
        ]
    );
    let e = errors(
        "routing:\n  interfaces:\n    - {interface: net1, cidr: 10.0.0.0/24, address: 10.0.0.2, gateway: 10.0.0.1, table: 7}\n    - {interface: net1, cidr: 10.0.2.0/24, address: 10.0.2.2, gateway: 10.0.2.1, table: 7}\n",
    );
    assert_eq!(
        e,
        vec![
            "routing: net1 and net1 both use table 7",
            "routing: interface net1 is listed twice"
        ]
    );
    let e = errors("network: {cidr: 10.0.0.0/24}\nrouting: {}\n");
    assert_eq!(
        e,
        vec!["routing: needs network.interface, network.address, network.gateway"]
    );
}

#[test]
fn proxy_extra_listeners_join_the_derived_ones_with_the_api_service_named() {
    let p = Config::from_yaml(&format!(
        "{VLAN}proxy:\n  apiServerService: kas\n  extraListeners:\n    - {{port: 22623, upstream: 'machine-config.clusters-hc1.svc:22623'}}\n"
    ))
    .unwrap()
    .proxy
    .unwrap();
    let ports: Vec<u16> = p.listeners.iter().map(|l| l.listen.port()).collect();
    assert_eq!(ports, vec![6443, 443, 22623]);
    assert_eq!(
        p.listeners[0].kind,
        crate::ListenerKind::Plain(crate::Upstream::named("kas.clusters-hc1.svc", 6443))
    );
    let e = errors(&format!(
        "{VLAN}proxy:\n  extraListeners:\n    - {{port: 443, upstream: '10.0.0.1:443'}}\n"
    ));
    assert_eq!(
        e,
        vec!["proxy.extraListeners[0].port: port 443 is already a proxy listener"]
    );
}

#[test]
fn client_speaks_first_is_off_for_a_listener_unless_it_says_so_and_on_for_derived_ones() {
    let p = Config::from_yaml(&format!(
        "{VLAN}proxy:\n  extraListeners:\n    - {{port: 22623, upstream: '10.0.0.1:22623'}}\n    - {{port: 2222, upstream: '10.0.0.1:22', clientSpeaksFirst: false}}\n    - {{port: 8080, upstream: '10.0.0.1:80', clientSpeaksFirst: true}}\n"
    ))
    .unwrap()
    .proxy
    .unwrap();
    let by_port: Vec<(u16, bool)> = p
        .listeners
        .iter()
        .map(|l| (l.listen.port(), l.client_speaks_first))
        .collect();
    // 6443 and 443 are derived for the hosted cluster: TLS, client first.
    assert_eq!(
        by_port,
        vec![
            (6443, true),
            (443, true),
            (22623, false),
            (2222, false),
            (8080, true)
        ]
    );
    let e = errors(&format!(
        "{VLAN}proxy:\n  listeners:\n    - {{port: 80, upstream: '10.0.0.1:80', clientSpeaksFirst: yes please}}\n"
    ));
    assert_eq!(e.len(), 1, "{e:?}");
}

#[test]
fn the_dns_cache_budget_is_checked() {
    let base =
        "cluster: {name: hc1, baseDomain: example.com}\ndns:\n  listen: ['127.0.0.1:5353']\n";
    let cfg = Config::from_yaml(base).unwrap().dns.unwrap();
    assert_eq!(cfg.cache.max_bytes, 64 << 20);
    assert_eq!(cfg.cache.max_entry_bytes, 8192);
    let errs = errors(&format!(
        "{base}  cache: {{maxBytes: 1000, maxEntryBytes: 70000}}\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("dns.cache.maxBytes: 1000 is too small")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("dns.cache.maxEntryBytes: 70000 is out of range")),
        "{errs:?}"
    );
}

#[test]
fn dhcp_rate_limits_are_off_unless_set_and_never_zero() {
    let d = Config::from_yaml(VLAN).unwrap().dhcp.unwrap();
    assert_eq!(
        d.rate_limit_per_client,
        crate::DEFAULT_RATE_LIMIT_PER_CLIENT
    );
    assert_eq!(
        (
            d.rate_limit_per_relay,
            d.rate_limit_per_subnet,
            d.rate_limit_global
        ),
        (None, None, None)
    );
    let d = Config::from_yaml(&format!(
        "{}dhcp: {{rateLimitPerRelay: 500, rateLimitPerSubnet: 200, rateLimitGlobal: 2000}}\n",
        VLAN.replace("dhcp: {}\n", "")
    ))
    .unwrap()
    .dhcp
    .unwrap();
    assert_eq!(
        (
            d.rate_limit_per_relay,
            d.rate_limit_per_subnet,
            d.rate_limit_global
        ),
        (Some(500), Some(200), Some(2000))
    );
    let e = errors(&format!(
        "{}dhcp: {{rateLimitPerClient: 0, rateLimitPerRelay: 0, rateLimitPerSubnet: 0, rateLimitGlobal: 0}}\n",
        VLAN.replace("dhcp: {}\n", "")
    ));
    assert_eq!(
        e,
        vec![
            "dhcp.rateLimitPerClient: must be at least 1",
            "dhcp.rateLimitPerRelay: must be at least 1 (leave it out for no limit)",
            "dhcp.rateLimitPerSubnet: must be at least 1 (leave it out for no limit)",
            "dhcp.rateLimitGlobal: must be at least 1 (leave it out for no limit)",
        ]
    );
}

#[test]
fn proxy_per_source_limit_defaults_and_reads() {
    let p = Config::from_yaml(&format!("{VLAN}proxy: {{}}\n"))
        .unwrap()
        .proxy
        .unwrap();
    assert_eq!(
        p.max_connections_per_source,
        crate::DEFAULT_MAX_CONNECTIONS_PER_SOURCE
    );
    let p = Config::from_yaml(&format!("{VLAN}proxy: {{maxConnectionsPerSource: 7}}\n"))
        .unwrap()
        .proxy
        .unwrap();
    assert_eq!(p.max_connections_per_source, 7);
}

const HA: &str = r#"
ha:
  node: a
  replicas:
    - {name: a, address: "10.0.0.1:7946", priority: 200}
    - {name: b, address: "dns-1.dns-peers:7946"}
  keyFile: /etc/causeway/ha.key
  interface: net1
  addresses: [192.168.100.2/24]
"#;

#[test]
fn ha_takes_defaults_and_finds_the_peer_by_this_replicas_name() {
    let cfg = Config::from_yaml(HA).unwrap();
    let ha = cfg.ha.unwrap();
    assert_eq!(ha.mode, HaMode::Peer);
    assert_eq!(ha.advert_interval, DEFAULT_ADVERT_INTERVAL);
    assert_eq!(
        ha.dead_after(),
        DEFAULT_ADVERT_INTERVAL * DEFAULT_DEAD_ADVERTS
    );
    let (me, peer) = ha.split("b").unwrap();
    assert_eq!((me.name.as_str(), me.priority), ("b", 100));
    assert_eq!((peer.name.as_str(), peer.priority), ("a", 200));
    assert!(ha.split("c").is_none());
}

#[test]
fn ha_errors_name_their_paths() {
    let errs = errors(
        r#"
ha:
  mode: lease
  node: c
  replicas:
    - {name: a, address: "10.0.0.1", priority: 0}
    - {name: a, address: "10.0.0.2:7946"}
  keyFile: ""
  interface: net1
  addresses: [192.168.100.300/24]
  advertInterval: 5ms
  deadAdverts: 1
  replicationTimeout: 30s
"#,
    );
    let joined = errs.join("\n");
    for needle in [
        "ha.replicas[0].address: 10.0.0.1 is not host:port",
        "ha.replicas[0].priority: must be between 1 and 254",
        "ha.replicas[1].name: a names both replicas",
        "ha.node: c is not the name of either replica",
        "ha.keyFile: names no file",
        "ha.addresses[0]: 192.168.100.300/24 is not an address",
        "ha.advertInterval: 5ms must be between 20ms and 10s",
        "ha.deadAdverts: 1 must be between 2 and 20",
        "ha.replicationTimeout: 30s is over 4s",
        "ha.lease: mode lease needs the Lease's name",
    ] {
        assert!(joined.contains(needle), "missing {needle:?} in:\n{joined}");
    }
    let one = errors(
        r#"
ha:
  replicas: [{name: a, address: "h:1"}]
  keyFile: k
  interface: net1
  addresses: []
  lease: {name: x}
"#,
    )
    .join("\n");
    for needle in [
        "ha.replicas: needs exactly two replicas",
        "ha.addresses: needs at least one service address",
        "ha.lease: only for mode lease",
    ] {
        assert!(one.contains(needle), "missing {needle:?} in:\n{one}");
    }
}

#[test]
fn ha_listen_interface_is_never_the_vlan() {
    let cfg = Config::from_yaml(&format!("{HA}  listenInterface: peer0\n")).unwrap();
    assert_eq!(cfg.ha.unwrap().listen_interface.as_deref(), Some("peer0"));
    let errs = errors(&format!("{HA}  listenInterface: net1\n")).join("\n");
    assert!(
        errs.contains("ha.listenInterface: names no interface, or the VLAN interface"),
        "{errs}"
    );
}

const TWO_CLUSTERS: &str = r#"
clusters:
  - name: hc1
    baseDomain: example.com
    controlPlaneNamespace: clusters-hc1
    ingressHttps: 192.168.100.200:443
    appsAddress: 192.168.100.200
    workers: [192.168.100.20, 192.168.100.21]
  - name: hc2
    baseDomain: Example.org.
    workers: [192.168.100.32/30]
network:
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: 192.168.100.2
dns:
  views:
    - {name: vlan, clients: [192.168.100.0/24]}
    - {name: pods, clients: [0.0.0.0/0], proxyAddress: 172.30.0.10}
proxy: {}
"#;

fn a_lines(view: &DnsView) -> Vec<String> {
    let mut out: Vec<String> = view
        .records
        .iter()
        .filter_map(|r| match r.data {
            RecordData::A(ip) => Some(format!("{} {ip}", r.name)),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

#[test]
fn several_clusters_share_dns_each_with_its_zone_apps_and_the_workers_aliases() {
    let cfg = Config::from_yaml(TWO_CLUSTERS).unwrap();
    assert_eq!(cfg.cluster.as_ref().unwrap().domain(), "hc1.example.com");
    assert_eq!(cfg.clusters.len(), 2);
    assert_eq!(cfg.clusters[1].control_plane_namespace, "clusters-hc2");
    let dns = cfg.dns.unwrap();
    assert_eq!(dns.zone.as_deref(), Some("hc1.example.com."));
    assert_eq!(dns.other_zones, vec!["hc2.example.org.".to_string()]);
    let vlan = a_lines(&dns.views[0]);
    for name in ["api", "api-int", "oauth", "ignition", "konnectivity"] {
        assert!(vlan.contains(&format!("{name}.hc1.example.com. 192.168.100.2")));
        assert!(vlan.contains(&format!("{name}.hc2.example.org. 192.168.100.2")));
    }
    // The VLAN reaches hc1's load balancer directly; hc2 routes no apps.
    assert!(vlan.contains(&"*.apps.hc1.example.com. 192.168.100.200".to_string()));
    assert!(!vlan.iter().any(|r| r.starts_with("*.apps.hc2")));
    for alias in KUBERNETES_ALIASES {
        assert!(vlan.contains(&format!("{alias}. 192.168.100.2")), "{alias}");
    }
    // The pod network has no workers and reaches hc1's apps through its
    // own proxy address.
    let pods = a_lines(&dns.views[1]);
    assert!(pods.contains(&"*.apps.hc1.example.com. 172.30.0.10".to_string()));
    assert!(pods.contains(&"api.hc2.example.org. 172.30.0.10".to_string()));
    assert!(!pods.iter().any(|r| r.starts_with("kubernetes")));
}

#[test]
fn several_clusters_share_the_proxy_by_name_then_by_worker_address() {
    let cfg = Config::from_yaml(TWO_CLUSTERS).unwrap();
    let p = cfg.proxy.unwrap();
    let ListenerKind::Sni { routes, default } = &p.listeners[0].kind else {
        panic!("6443 routes by name when clusters share it")
    };
    assert_eq!(p.listeners[0].listen.port(), 6443);
    assert_eq!(default, &None);
    let shown: Vec<String> = routes
        .iter()
        .map(|r| format!("{} -> {}", r.label, r.upstream))
        .collect();
    assert_eq!(
        shown,
        vec![
            "api.hc1.example.com -> kube-apiserver.clusters-hc1.svc:6443",
            "api-int.hc1.example.com -> kube-apiserver.clusters-hc1.svc:6443",
            "api.hc2.example.org -> kube-apiserver.clusters-hc2.svc:6443",
            "api-int.hc2.example.org -> kube-apiserver.clusters-hc2.svc:6443",
            "from 192.168.100.20/32+1 -> kube-apiserver.clusters-hc1.svc:6443",
            "from 192.168.100.32/30 -> kube-apiserver.clusters-hc2.svc:6443",
        ]
    );
    assert_eq!(routes[4].sni, None);
    assert_eq!(routes[4].sources.len(), 2);
    let ListenerKind::Sni { routes, .. } = &p.listeners[1].kind else {
        panic!("443 routes by name")
    };
    let labels: Vec<&str> = routes.iter().map(|r| r.label.as_str()).collect();
    assert!(labels.contains(&"*.apps.hc1.example.com"));
    assert!(labels.contains(&"oauth.hc2.example.org"));
    assert!(labels.contains(&"kubernetes.default.svc from 192.168.100.32/30"));
    assert_eq!(p.listeners.len(), 2, "no cluster has an HTTP ingress");
}

#[test]
fn one_cluster_without_workers_keeps_a_plain_api_port() {
    let p = Config::from_yaml(&format!("{VLAN}proxy: {{}}\n"))
        .unwrap()
        .proxy
        .unwrap();
    assert!(matches!(p.listeners[0].kind, ListenerKind::Plain(_)));
}

#[test]
fn cluster_list_errors_name_their_paths() {
    let e = errors(
        r#"
cluster: {name: hc0, baseDomain: example.com}
clusters:
  - {name: hc1, baseDomain: example.com, workers: [192.168.100.20, 10.0.0.1, nonsense]}
  - {name: HC1, baseDomain: example.com.}
  - {name: hc3, baseDomain: example.com, workers: [192.168.100.16/28], appsAddress: x}
  - {name: "a.b", baseDomain: "-bad-", controlPlaneNamespace: "Not_A_Namespace"}
network: {cidr: 192.168.100.0/24, address: 192.168.100.2}
proxy: {controlPlaneNamespace: clusters-hc1}
"#,
    );
    assert_eq!(
        e,
        vec![
            "clusters: set either cluster (one hosted cluster) or clusters (several), not both",
            "proxy.controlPlaneNamespace: with clusters listed, set controlPlaneNamespace on each entry of clusters",
            "clusters[0].workers[1]: 10.0.0.1/32 is outside network.cidr 192.168.100.0/24",
            "clusters[0].workers[2]: nonsense is not an IPv4 address or CIDR (IPv6 workers are not routed yet)",
            "clusters[1].name: hc1.example.com is also clusters[0]'s domain",
            "clusters[2].appsAddress: x is not an IPv4 address",
            "clusters[2].workers[0]: 192.168.100.16/28 overlaps 192.168.100.20/32, a worker of clusters[0]",
            "clusters[3].name: \"a.b\" is not a DNS label",
            "clusters[3].baseDomain: \"-bad-\" is not a DNS name",
            "clusters[3].controlPlaneNamespace: \"Not_A_Namespace\" is not a namespace name",
        ]
    );
}

#[test]
fn proxy_routes_by_source_are_checked() {
    let e = errors(&format!(
        "{VLAN}proxy:\n  listeners:\n    - port: 6443\n      routes:\n        - {{upstream: '10.0.0.1:6443'}}\n        - {{sources: [bad], upstream: '10.0.0.1:6443'}}\n"
    ));
    assert_eq!(
        e,
        vec![
            "proxy.listeners[0].routes[0]: give sni, sources or both (a route for everything else is the listener's default)",
            "proxy.listeners[0].routes[1].sources[0]: bad is not an address or CIDR",
        ]
    );
}

#[test]
fn the_external_port_takes_the_routes_of_443_on_every_address() {
    let p = Config::from_yaml(&format!("{VLAN}proxy: {{externalPort: 8443}}\n"))
        .unwrap()
        .proxy
        .unwrap();
    let https = p.listeners.iter().find(|l| l.listen.port() == 443).unwrap();
    let external = p
        .listeners
        .iter()
        .find(|l| l.listen.port() == 8443)
        .unwrap();
    assert_eq!(external.listen.to_string(), "0.0.0.0:8443");
    assert_eq!(external.kind, https.kind);
    let e = errors(&format!("{VLAN}proxy: {{externalPort: 6443}}\n"));
    assert_eq!(
        e,
        vec!["proxy.externalPort: port 6443 is already a proxy listener"]
    );
    let e = errors(&format!(
        "{VLAN}proxy: {{externalPort: 8443, listeners: [{{port: 6443, upstream: '10.0.0.1:6443'}}]}}\n"
    ));
    assert_eq!(
        e,
        vec!["proxy.externalPort: there is no listener on 443 whose routes it would take"]
    );
}

#[test]
fn ha_vlan_addresses_are_both_replicas_own_and_need_the_peer_link_named() {
    let both = |a: &str, b: &str, extra: &str| {
        format!(
            "ha:\n  node: a\n  replicas:\n    - {{name: a, address: \"10.0.0.1:7946\", vlanAddress: \"{a}\"}}\n    - {{name: b, address: \"10.0.0.2:7946\", vlanAddress: \"{b}\"}}\n  keyFile: /etc/causeway/ha.key\n  interface: net1\n  addresses: [192.168.100.2/24]\n{extra}"
        )
    };
    let cfg = Config::from_yaml(&both(
        "192.168.100.5:7946",
        "192.168.100.6:7946",
        "  listenInterface: peer0\n",
    ))
    .unwrap();
    let ha = cfg.ha.unwrap();
    let (me, peer) = ha.split("a").unwrap();
    assert_eq!(me.vlan_address, Some("192.168.100.5:7946".parse().unwrap()));
    assert_eq!(
        peer.vlan_address,
        Some("192.168.100.6:7946".parse().unwrap())
    );

    for (text, needle) in [
        (
            both("192.168.100.5:7946", "192.168.100.6:7946", ""),
            "ha.listenInterface: vlanAddress needs the peer link named here",
        ),
        (
            both(
                "192.168.100.5:7946",
                "192.168.100.5:7947",
                "  listenInterface: peer0\n",
            ),
            "ha.replicas[1].vlanAddress: is the other replica's",
        ),
        (
            both(
                "192.168.100.2:7946",
                "192.168.100.6:7946",
                "  listenInterface: peer0\n",
            ),
            "ha.replicas[0].vlanAddress: is a service address",
        ),
        (
            both(
                "vlan-a:7946",
                "192.168.100.6:7946",
                "  listenInterface: peer0\n",
            ),
            "ha.replicas[0].vlanAddress: vlan-a:7946 is not this replica's own VLAN address",
        ),
        (
            format!("{HA}  listenInterface: peer0\n").replace(
                "priority: 200}",
                "priority: 200, vlanAddress: \"192.168.100.5:7946\"}",
            ),
            "ha.replicas: vlanAddress is set on one replica only",
        ),
    ] {
        let errs = errors(&text).join("\n");
        assert!(errs.contains(needle), "missing {needle:?} in:\n{errs}");
    }
}

#[test]
fn router_advertisements_take_rfc_4861_defaults_from_the_vlan_and_cluster() {
    let cfg = Config::from_yaml(&format!(
        "{VLAN}routerAdvertisements:\n  prefixes: [{{prefix: 'fd42:10::/64'}}]\n  dnsServers: ['fd42:10::53']\n"
    ))
    .unwrap();
    let ra = cfg.router_advertisements.unwrap();
    assert_eq!(ra.interface, "net1");
    assert_eq!(ra.max_interval.as_secs(), 600);
    assert_eq!(ra.min_interval.as_secs(), 198);
    assert_eq!(ra.router_lifetime.as_secs(), 1800);
    assert_eq!(ra.dns_lifetime.as_secs(), 1800);
    assert_eq!(ra.search_domains, ["hc1.example.com"]);
    let p = &ra.prefixes[0];
    assert!(p.on_link && p.autonomous);
    assert_eq!(
        (p.valid_lifetime.as_secs(), p.preferred_lifetime.as_secs()),
        (2_592_000, 604_800)
    );
    let short = Config::from_yaml(
        "routerAdvertisements: {interface: v0, maxInterval: 4s, routerLifetime: 0, managed: true}",
    )
    .unwrap()
    .router_advertisements
    .unwrap();
    assert_eq!(short.min_interval.as_secs(), 3);
    assert!(short.router_lifetime.is_zero());
}

#[test]
fn router_advertisements_refuse_what_hosts_would_ignore_with_the_rule() {
    let errs = errors(
        r#"
routerAdvertisements:
  interface: v0
  maxInterval: 2s
  minInterval: 1s
  routerLifetime: 1s
  mtu: 1000
  hopLimit: 0
  source: 'fd00::1'
  dnsServers: ['ff02::1', 'not-an-address']
  dnsLifetime: 1s
  searchDomains: ['bad domain']
  prefixes:
    - {prefix: 'fd98::/64'}
    - {prefix: 'fd42:10::/56'}
    - {prefix: 'fd42:10::/64', autonomous: false, validLifetime: 1h, preferredLifetime: 2h}
    - {prefix: 'fe80::/64'}
    - {prefix: 'fd42:20::1/64'}
"#,
    );
    let want = [
        "routerAdvertisements.maxInterval: 2s is outside 4s–1800s",
        "routerAdvertisements.minInterval: 1s is outside 3s–",
        "routerAdvertisements.routerLifetime: 1s is neither 0 nor between maxInterval",
        "routerAdvertisements.mtu: 1000 is outside 1280–65535",
        "routerAdvertisements.hopLimit: must be 1–255",
        "routerAdvertisements.source: fd00::1 is not link-local",
        "routerAdvertisements.dnsServers[0]: ff02::1 is not a unicast address",
        "routerAdvertisements.dnsServers[1]: not-an-address is not an IPv6 address",
        "routerAdvertisements.dnsLifetime: 1s is under maxInterval",
        "routerAdvertisements.searchDomains[0]: bad domain is not a DNS name",
        "routerAdvertisements.prefixes[0].prefix: fd98::/64 overlaps fd98::/64, inside fd97::/64–fd99::/64",
        "routerAdvertisements.prefixes[1].prefix: fd42:10::/56 is not a /64",
        "routerAdvertisements.prefixes[2].preferredLifetime: 2h is longer than validLifetime 1h",
        "routerAdvertisements.prefixes[2].prefix: fd42:10::/64 overlaps prefixes[1]",
        "routerAdvertisements.prefixes[3].prefix: fe80::/64 is link-local",
        "routerAdvertisements.prefixes[4].prefix: fd42:20::1/64 has host bits set",
    ];
    for w in want {
        assert!(
            errs.iter().any(|e| e.starts_with(w)),
            "no error starting {w:?} in:\n{}",
            errs.join("\n")
        );
    }
    let errs = errors("routerAdvertisements: {prefixes: []}");
    assert!(
        errs.iter()
            .any(|e| e.starts_with("routerAdvertisements.interface: is required")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("routerAdvertisements.prefixes: announces nothing")),
        "{errs:?}"
    );
}

#[test]
fn a_v6_proxy_address_binds_every_listener_in_both_families() {
    let cfg = Config::from_yaml(&format!(
        "{VLAN}proxy:\n  listenAddressV6: 'fd42:10::2'\n  ingressHttps: '10.0.0.5:443'\n"
    ))
    .unwrap();
    let listens: Vec<String> = cfg
        .proxy
        .unwrap()
        .listeners
        .iter()
        .map(|l| l.listen.to_string())
        .collect();
    assert_eq!(listens.len(), 4, "{listens:?}");
    for port in [443, 6443] {
        assert!(
            listens.contains(&format!("192.168.100.2:{port}"))
                && listens.contains(&format!("[fd42:10::2]:{port}")),
            "{port} in both families: {listens:?}"
        );
    }
    let errs = errors(&format!("{VLAN}proxy:\n  listenAddressV6: 'ff02::1'\n"));
    assert!(
        errs.iter()
            .any(|e| e == "proxy.listenAddressV6: ff02::1 is a multicast address"),
        "{errs:?}"
    );
    let errs = errors(&format!("{VLAN}proxy:\n  listenAddressV6: 10.0.0.1\n"));
    assert!(
        errs.iter()
            .any(|e| e == "proxy.listenAddressV6: 10.0.0.1 is not an IPv6 address"),
        "{errs:?}"
    );
}

#[test]
fn ha_v6_addresses_are_unicast_outside_the_ovn_join_subnets_and_distinct() {
    let cfg = Config::from_yaml(&format!(
        "{HA}  addressesV6: ['fd42:10::2/64', 'fe80::1/64']\n"
    ))
    .unwrap();
    assert_eq!(cfg.ha.unwrap().addresses_v6.len(), 2);
    let errs = errors(&format!(
        "{HA}  addressesV6: ['fd99::2/64', 'ff02::1/64', 'fd42:10::2', 'fe80::1/64', 'fe80::1/10']\n"
    ));
    let want = [
        "ha.addressesV6[0]: fd99::/64 overlaps fd99::/64, inside fd97::/64–fd99::/64",
        "ha.addressesV6[1]: ff02::1/64 is not a unicast address",
        "ha.addressesV6[2]: fd42:10::2 is not a v6 address with its prefix",
        "ha.addressesV6[4]: fe80::1 is also ha.addressesV6[3]",
    ];
    for w in want {
        assert!(
            errs.iter().any(|e| e.starts_with(w)),
            "no error starting {w:?} in:\n{}",
            errs.join("\n")
        );
    }
}

#[test]
fn routing_takes_a_v6_side_in_its_own_table_of_the_same_number() {
    let r = Config::from_yaml(&format!(
        "{VLAN}routing:\n  ipv6: {{cidr: 'fd42:10::/64', address: 'fd42:10::2', gateway: 'fe80::1', extraRoutes: ['fd43::/48']}}\n"
    ))
    .unwrap()
    .routing
    .unwrap();
    let v6 = r.interfaces[0].ipv6.as_ref().unwrap();
    assert_eq!(v6.cidr.to_string(), "fd42:10::/64");
    assert_eq!(v6.gateway.to_string(), "fe80::1");
    let errs = errors(&format!(
        "{VLAN}routing:\n  ipv6: {{cidr: 'fd98::/64', address: 'fd42:10::2', gateway: 'fd42:11::1', extraRoutes: [nope]}}\n"
    ));
    for want in [
        "routing.ipv6.cidr: fd98::/64 overlaps fd98::/64",
        "routing.ipv6.address: fd42:10::2 is not in fd98::/64",
        "routing.ipv6.gateway: fd42:11::1 is neither in fd98::/64 nor link-local",
        "routing.ipv6.extraRoutes[0]: nope is not an IPv6 CIDR",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "no error starting {want:?} in:\n{}",
            errs.join("\n")
        );
    }
}

#[test]
fn dhcp6_serves_the_clusters_domain_by_default_and_refuses_what_clients_would_not_take() {
    let d = Config::from_yaml(&format!(
        "{VLAN}dhcp6:\n  dnsServers: ['fd42:10::53']\n  informationRefreshTime: 1h\n"
    ))
    .unwrap()
    .dhcp6
    .unwrap();
    assert_eq!(d.interface, "net1");
    assert_eq!(d.domain_search, ["hc1.example.com"]);
    assert_eq!(d.information_refresh_time.map(|t| t.as_secs()), Some(3600));
    let errs = errors(
        "dhcp6:\n  dnsServers: ['ff02::1', nope]\n  domainSearch: ['bad name']\n  informationRefreshTime: 1m\n  serverDuid: '00'\n",
    );
    for want in [
        "dhcp6.interface: is required",
        "dhcp6.dnsServers[0]: ff02::1 is not a unicast address",
        "dhcp6.dnsServers[1]: nope is not an IPv6 address",
        "dhcp6.domainSearch[0]: bad name is not a DNS name",
        "dhcp6.informationRefreshTime: 1m is outside 10m",
        "dhcp6.serverDuid: 00 is not a DUID",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "no error starting {want:?} in:\n{}",
            errs.join("\n")
        );
    }
    let errs = errors("dhcp6: {interface: net1}\n");
    assert!(
        errs.iter()
            .any(|e| e.starts_with("dhcp6.dnsServers: serves nothing")),
        "{errs:?}"
    );
}

#[test]
fn dhcp6_pools_and_reservations_lease_addresses_and_bad_ones_get_their_precise_messages() {
    let d = Config::from_yaml(&format!(
        "{VLAN}dhcp6:\n  prefix: fd42:10::/64\n  pools: [{{start: 'fd42:10::100', end: 'fd42:10::1ff'}}]\n  reservations: [{{duid: '00030001020000000009', ip: 'fd42:10::50'}}, {{mac: '02:00:00:00:00:0a', ip: 'fd42:10::51', hostname: w1}}]\n  rapidCommit: true\n"
    ))
    .unwrap()
    .dhcp6
    .unwrap();
    let s = d.stateful.unwrap();
    assert_eq!(s.pools.len(), 1);
    assert_eq!(s.reservations[1].mac, Some([2, 0, 0, 0, 0, 0x0a]));
    assert_eq!(s.preferred_lifetime.as_secs(), 3600);
    assert_eq!(s.valid_lifetime.as_secs(), 7200, "twice the preferred");
    assert!(s.rapid_commit);
    let errs = errors(&format!(
        "{VLAN}dhcp6:\n  prefix: fd99::/64\n  pools: [{{start: 'fd99::9', end: 'fd99::1'}}, {{start: 'fd42:11::1', end: 'fd42:11::2'}}, {{start: '::', end: 'ffff::'}}]\n  reservations: [{{ip: 'fd99::5'}}, {{duid: zz, mac: nope, ip: 'fd99::6', hostname: 'a.b'}}]\n  preferredLifetime: 2h\n  validLifetime: 1h\n"
    ));
    for want in [
        "dhcp6.prefix: fd99::/64 overlaps fd99::/64",
        "dhcp6.pools[0]: starts after it ends",
        "dhcp6.pools[1]: fd42:11::1–fd42:11::2 is not inside the prefix fd99::/64",
        "dhcp6.pools[2]: spans more than 2^32 addresses",
        "dhcp6.reservations[0]: names no client",
        "dhcp6.reservations[1].duid: zz is not a DUID",
        "dhcp6.reservations[1].mac: nope is not a MAC address",
        "dhcp6.reservations[1].hostname: a.b is not a host name",
        "dhcp6.preferredLifetime: is longer than validLifetime",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "no error starting {want:?} in:\n{}",
            errs.join("\n")
        );
    }
    // The leases live in the dhcp section's log.
    let no_dhcp = VLAN.replace("dhcp: {}\n", "");
    let errs = errors(&format!(
        "{no_dhcp}dhcp6:\n  prefix: fd42:10::/64\n  pools: [{{start: 'fd42:10::1', end: 'fd42:10::2'}}]\n"
    ));
    assert!(
        errs.iter().any(|e| e.starts_with(
            "dhcp6.pools: leased DHCPv6 addresses are kept in the dhcp section's lease file"
        )),
        "{errs:?}"
    );
    let errs = errors(&format!(
        "{VLAN}dhcp6:\n  dnsServers: ['fd42:10::53']\n  rapidCommit: true\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("dhcp6.rapidCommit: applies to leased addresses")),
        "{errs:?}"
    );
}
