//! Arbitrary bytes through DHCP decode, the engine and reply encoding.
//! One engine lives across inputs so lease state builds up between them.
#![no_main]

use std::cell::RefCell;

use causeway_config::Config;
use causeway_dhcp::Engine;
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
network: {interface: net1, cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}
dhcp:
  rapidCommit: true
  subnets:
    - pools: [{start: 192.168.100.10, end: 192.168.100.40}]
      domainSearch: [example.com]
      classlessRoutes: [{destination: 10.0.0.0/8, gateway: 192.168.100.1}]
      options: [{code: 150, ipv4: [192.168.100.5]}]
      reservations: [{mac: "52:54:00:00:00:01", ip: 192.168.100.50, hostname: r1}]
"#;

thread_local! {
    static ENGINE: RefCell<(Engine, u64)> = RefCell::new((
        Engine::new(&Config::from_yaml(CONFIG).expect("fuzz config is valid").dhcp.expect("dhcp enabled")),
        1_700_000_000,
    ));
}

fuzz_target!(|data: &[u8]| {
    ENGINE.with(|cell| {
        let (engine, now) = &mut *cell.borrow_mut();
        // Time moves forward so offers, leases and probation expire.
        *now += u64::from(data.first().copied().unwrap_or(0));
        engine.reclaim(*now);
        causeway_dhcp::drive_bytes(engine, *now, data);
    });
});
