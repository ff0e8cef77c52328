//! Router solicitations as a raw ICMPv6 socket delivers them: any bytes,
//! any hop limit, from a host or from the unspecified address. Reading one
//! never panics, a valid one is only ever answered within the schedule's
//! bounds, and the advertisement it is answered with is whole options.
#![no_main]

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use causeway_config::Config;
use causeway_route::ra::{self, Schedule};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
cluster: {name: hosted, baseDomain: example.com}
routerAdvertisements:
  interface: v0
  prefixes: [{prefix: 'fd42:10::/64'}, {prefix: 'fd42:11::/64', autonomous: false}]
  mtu: 1400
  dnsServers: ['fd42:10::53', 'fd42:10::54']
  searchDomains: [hosted.example.com, example.com]
"#;

fuzz_target!(|data: &[u8]| {
    let [hop_limit, from, body @ ..] = data else {
        return;
    };
    let source = if from & 1 == 0 {
        Ipv6Addr::UNSPECIFIED
    } else {
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, u16::from(*from))
    };
    let hop = (from & 2 == 0).then_some(*hop_limit);
    let Ok(rs) = ra::parse_solicitation(body, source, hop) else {
        return;
    };
    assert_eq!(hop, Some(255));
    assert!(rs.source.is_none() || rs.link_layer.is_none() || !source.is_unspecified());
    let cfg = Config::from_yaml(CONFIG)
        .ok()
        .and_then(|c| c.router_advertisements)
        .expect("the fuzz config is valid");
    let t0 = Instant::now();
    let mut schedule = Schedule::new(t0, cfg.min_interval, cfg.max_interval, u64::from(*from));
    schedule.take_due(t0);
    schedule.on_solicitation(t0, &rs);
    assert!(schedule.next_deadline() <= t0 + ra::MIN_DELAY_BETWEEN_RAS + ra::MAX_RA_DELAY);
    let advert = ra::advertisement(&cfg, Some([2, 0, 0, 0, 0, 1]), Duration::ZERO);
    let mut rest = &advert[16..];
    while !rest.is_empty() {
        let length = usize::from(rest[1]) * 8;
        assert!(length > 0 && length <= rest.len());
        rest = &rest[length..];
    }
});
