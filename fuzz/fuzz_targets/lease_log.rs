//! Lease-log replay: any bytes left in the lease file (a torn write, a
//! disk error, an edit by hand) are read back, restored into an engine
//! that then serves, without a panic and with every line accounted for.
#![no_main]

use std::collections::HashSet;

use causeway_config::Config;
use causeway_dhcp::{parse_log, Engine};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
network: {interface: net1, cidr: 192.168.100.0/24, gateway: 192.168.100.1, address: 192.168.100.2}
dhcp:
  subnets:
    - pools: [{start: 192.168.100.10, end: 192.168.100.40}]
      reservations: [{mac: "52:54:00:00:00:01", ip: 192.168.100.50, hostname: r1}]
"#;

/// A DISCOVER from 52:54:00:00:00:02, as a client sends it.
const DISCOVER: &[u8] = &[
    1, 1, 6, 0, 0, 0, 0, 1, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x52,
    0x54, 0, 0, 0, 2,
];

fuzz_target!(|data: &[u8]| {
    let recovery = parse_log(data);
    let whole = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    assert_eq!(recovery.torn_tail_bytes, data.len() - whole);
    let lines = data[..whole]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(recovery.records.len() + recovery.corrupt_lines, lines);

    let cfg = Config::from_yaml(CONFIG)
        .expect("fuzz config is valid")
        .dhcp
        .expect("dhcp enabled");
    let mut engine = Engine::new(&cfg);
    engine.restore(&recovery.records);
    let mut seen = HashSet::new();
    for lease in engine.leases() {
        assert!(seen.insert(lease.ip), "two leases for {}", lease.ip);
    }
    for stats in engine.pool_stats(1_700_000_000) {
        assert!(stats.free <= stats.total);
    }
    let mut packet = DISCOVER.to_vec();
    packet.resize(236, 0);
    packet.extend_from_slice(&[99, 130, 83, 99, 53, 1, 1, 255]);
    causeway_dhcp::drive_bytes(&mut engine, 1_700_000_000, &packet);
});
