//! Arbitrary bytes through DNS query parsing and the local answer logic.
#![no_main]

use std::sync::Arc;

use causeway_config::Config;
use causeway_dns::handler::drive_bytes;
use causeway_dns::{Authority, DynamicNames};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
cluster: {name: hc1, baseDomain: example.com}
network: {cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}
dns:
  listen: ["127.0.0.1:5353"]
  records:
    - {name: c, type: CNAME, value: x.apps}
    - {name: _s._tcp, type: SRV, value: "0 1 80 api"}
    - {name: t, type: TXT, value: "hello"}
  views:
    - {name: vlan, clients: [192.168.100.0/24], proxyAddress: 192.168.100.9}
"#;

thread_local! {
    static AUTHORITY: Authority = {
        let cfg = Config::from_yaml(CONFIG).expect("fuzz config is valid").dns.expect("dns enabled");
        let names = Arc::new(DynamicNames::for_zone(cfg.zone.as_deref()));
        names.register("vm1", "192.168.100.77".parse::<std::net::Ipv4Addr>().expect("address"), u64::MAX);
        Authority::new(&cfg, names, 1).expect("records build")
    };
}

fuzz_target!(|data: &[u8]| {
    AUTHORITY.with(|auth| {
        let client = if data.first().is_some_and(|b| b & 1 == 1) {
            "192.168.100.5"
        } else {
            "127.0.0.1"
        };
        let _ = drive_bytes(auth, data, client.parse().expect("address"), 1_700_000_000);
    });
});
