//! Router advertisements without I/O: reading a Router Solicitation,
//! writing a Router Advertisement, and deciding when to send one.
//!
//! Messages are the ICMPv6 body only: a raw ICMPv6 socket receives them
//! without the IPv6 header (the hop limit comes as ancillary data) and the
//! kernel fills in the checksum of what it sends.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use causeway_config::RouterAdvertConfig;

pub const ROUTER_SOLICITATION: u8 = 133;
pub const ROUTER_ADVERTISEMENT: u8 = 134;

const OPTION_SOURCE_LINK_LAYER: u8 = 1;
const OPTION_PREFIX_INFORMATION: u8 = 3;
const OPTION_MTU: u8 = 5;
const OPTION_RDNSS: u8 = 25;
const OPTION_DNSSL: u8 = 31;

/// RFC 4861 section 10: the first advertisements after the interface
/// starts come faster, so hosts that missed the first still learn soon.
pub const MAX_INITIAL_ADVERTISEMENTS: u32 = 3;
pub const MAX_INITIAL_INTERVAL: Duration = Duration::from_secs(16);
/// Solicited multicast advertisements are at least this far apart.
pub const MIN_DELAY_BETWEEN_RAS: Duration = Duration::from_secs(3);
/// A solicited advertisement waits a random time up to this, so that the
/// routers of a link do not all answer at once.
pub const MAX_RA_DELAY: Duration = Duration::from_millis(500);
/// Unicast answers queued at once; beyond this a solicitation is answered
/// by the next multicast one. Bounds what a flood of solicitations from
/// forged sources can hold.
pub const MAX_PENDING_UNICAST: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SolicitationError {
    #[error("hop limit {0} is not 255: the solicitation did not come from this link")]
    HopLimit(u8),
    #[error("no hop limit came with the packet")]
    NoHopLimit,
    #[error("{0} bytes is shorter than a router solicitation (8)")]
    Short(usize),
    #[error("ICMPv6 type {0} is not a router solicitation")]
    NotSolicitation(u8),
    #[error("ICMPv6 code {0} is not 0")]
    Code(u8),
    #[error("an option has length zero")]
    ZeroLengthOption,
    #[error("an option runs past the end of the message")]
    TruncatedOption,
    #[error("a solicitation from the unspecified address carries a link-layer address")]
    UnspecifiedWithLinkLayer,
}

/// A valid Router Solicitation (RFC 4861 section 6.1.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solicitation {
    /// `None` for a host that has no address yet (it sent from `::`): it
    /// can be answered only by multicast.
    pub source: Option<Ipv6Addr>,
    pub link_layer: Option<Vec<u8>>,
}

/// Reads a Router Solicitation, checking what RFC 4861 requires a router
/// to check before it answers.
pub fn parse_solicitation(
    icmp: &[u8],
    source: Ipv6Addr,
    hop_limit: Option<u8>,
) -> Result<Solicitation, SolicitationError> {
    match hop_limit {
        Some(255) => {}
        Some(h) => return Err(SolicitationError::HopLimit(h)),
        None => return Err(SolicitationError::NoHopLimit),
    }
    if icmp.len() < 8 {
        return Err(SolicitationError::Short(icmp.len()));
    }
    if icmp[0] != ROUTER_SOLICITATION {
        return Err(SolicitationError::NotSolicitation(icmp[0]));
    }
    if icmp[1] != 0 {
        return Err(SolicitationError::Code(icmp[1]));
    }
    let mut link_layer = None;
    let mut rest = &icmp[8..];
    while !rest.is_empty() {
        if rest.len() < 2 {
            return Err(SolicitationError::TruncatedOption);
        }
        let length = usize::from(rest[1]) * 8;
        if length == 0 {
            return Err(SolicitationError::ZeroLengthOption);
        }
        let option = rest
            .get(..length)
            .ok_or(SolicitationError::TruncatedOption)?;
        if option[0] == OPTION_SOURCE_LINK_LAYER {
            link_layer = Some(option[2..].to_vec());
        }
        rest = &rest[length..];
    }
    if source.is_unspecified() && link_layer.is_some() {
        return Err(SolicitationError::UnspecifiedWithLinkLayer);
    }
    Ok(Solicitation {
        source: (!source.is_unspecified()).then_some(source),
        link_layer,
    })
}

fn seconds_u32(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

fn seconds_u16(d: Duration) -> u16 {
    u16::try_from(d.as_secs()).unwrap_or(u16::MAX)
}

/// Pads an option to whole 8-byte units and writes its length.
fn finish_option(out: &mut Vec<u8>, start: usize) {
    while !(out.len() - start).is_multiple_of(8) {
        out.push(0);
    }
    // Every option this module writes is far under 255 units (2040 bytes):
    // DNS servers and domains are bounded by the config.
    out[start + 1] = u8::try_from((out.len() - start) / 8).unwrap_or(u8::MAX);
}

/// The Router Advertisement for `cfg`, from an interface with `mac`.
/// `router_lifetime` overrides the config's: a final advertisement (the
/// router stopping) carries 0.
pub fn advertisement(
    cfg: &RouterAdvertConfig,
    mac: Option<[u8; 6]>,
    router_lifetime: Duration,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&[ROUTER_ADVERTISEMENT, 0, 0, 0, cfg.hop_limit]);
    out.push(u8::from(cfg.managed) << 7 | u8::from(cfg.other_config) << 6);
    out.extend_from_slice(&seconds_u16(router_lifetime).to_be_bytes());
    // Reachable time and retransmission timer: 0, unspecified, so hosts
    // keep their own.
    out.extend_from_slice(&[0; 8]);
    if let Some(mac) = mac {
        let start = out.len();
        out.extend_from_slice(&[OPTION_SOURCE_LINK_LAYER, 0]);
        out.extend_from_slice(&mac);
        finish_option(&mut out, start);
    }
    if let Some(mtu) = cfg.mtu {
        let start = out.len();
        out.extend_from_slice(&[OPTION_MTU, 0, 0, 0]);
        out.extend_from_slice(&mtu.to_be_bytes());
        finish_option(&mut out, start);
    }
    for p in &cfg.prefixes {
        let start = out.len();
        out.extend_from_slice(&[OPTION_PREFIX_INFORMATION, 0, p.prefix.prefix_len()]);
        out.push(u8::from(p.on_link) << 7 | u8::from(p.autonomous) << 6);
        out.extend_from_slice(&seconds_u32(p.valid_lifetime).to_be_bytes());
        out.extend_from_slice(&seconds_u32(p.preferred_lifetime).to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&p.prefix.network().octets());
        finish_option(&mut out, start);
    }
    // An option's length is one byte of 8-byte units: at most 127 servers
    // fit one RDNSS option, far more than any host reads (Linux keeps 3).
    for servers in cfg.dns_servers.chunks(127) {
        let start = out.len();
        out.extend_from_slice(&[OPTION_RDNSS, 0, 0, 0]);
        out.extend_from_slice(&seconds_u32(cfg.dns_lifetime).to_be_bytes());
        for s in servers {
            out.extend_from_slice(&s.octets());
        }
        finish_option(&mut out, start);
    }
    if !cfg.search_domains.is_empty() {
        let start = out.len();
        out.extend_from_slice(&[OPTION_DNSSL, 0, 0, 0]);
        out.extend_from_slice(&seconds_u32(cfg.dns_lifetime).to_be_bytes());
        for domain in &cfg.search_domains {
            for label in domain.split('.').filter(|l| !l.is_empty()) {
                out.push(u8::try_from(label.len()).unwrap_or(63).min(63));
                out.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
            }
            out.push(0);
        }
        finish_option(&mut out, start);
    }
    out
}

/// One advertisement to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// To all nodes (ff02::1): periodic, or a solicited one.
    Multicast,
    /// To the one host that solicited it.
    Unicast(Ipv6Addr),
}

/// When to advertise (RFC 4861 section 6.2.4 and 6.2.6): periodically at a
/// random interval between the configured bounds, faster for the first
/// few, and in answer to solicitations after a random delay. It takes the
/// time as an argument and draws from its own seeded generator, so a test
/// replays it exactly.
#[derive(Debug, Clone)]
pub struct Schedule {
    min: Duration,
    max: Duration,
    initial_left: u32,
    next_multicast: Instant,
    last_multicast: Option<Instant>,
    pending_unicast: Vec<(Instant, Ipv6Addr)>,
    random: u64,
}

impl Schedule {
    /// The first advertisement is due at `now`.
    pub fn new(now: Instant, min: Duration, max: Duration, seed: u64) -> Schedule {
        Schedule {
            min,
            max: max.max(min),
            initial_left: MAX_INITIAL_ADVERTISEMENTS,
            next_multicast: now,
            last_multicast: None,
            pending_unicast: Vec::new(),
            random: seed | 1,
        }
    }

    /// Starts over as a newly advertising interface: after a config change
    /// (RFC 4861 section 6.2.4 lets a router advertise the change at once)
    /// or when this replica starts holding the router address.
    pub fn restart(&mut self, now: Instant, min: Duration, max: Duration) {
        self.min = min;
        self.max = max.max(min);
        self.initial_left = MAX_INITIAL_ADVERTISEMENTS;
        self.next_multicast = now;
    }

    /// xorshift64*: enough to spread routers' timing apart, and
    /// reproducible from the seed.
    fn draw(&mut self, below: Duration) -> Duration {
        self.random ^= self.random >> 12;
        self.random ^= self.random << 25;
        self.random ^= self.random >> 27;
        let r = self.random.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let span = u64::try_from(below.as_micros()).unwrap_or(u64::MAX);
        if span == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(r % span)
        }
    }

    pub fn on_solicitation(&mut self, now: Instant, from: &Solicitation) {
        let at = now + self.draw(MAX_RA_DELAY);
        match from.source {
            Some(host) => {
                if self.pending_unicast.iter().any(|(_, h)| *h == host) {
                    return;
                }
                if self.pending_unicast.len() < MAX_PENDING_UNICAST {
                    self.pending_unicast.push((at, host));
                    return;
                }
                self.solicited_multicast(at);
            }
            None => self.solicited_multicast(at),
        }
    }

    fn solicited_multicast(&mut self, at: Instant) {
        let allowed = self
            .last_multicast
            .map_or(at, |last| at.max(last + MIN_DELAY_BETWEEN_RAS));
        self.next_multicast = self.next_multicast.min(allowed);
    }

    /// When [`Schedule::take_due`] next has something.
    pub fn next_deadline(&self) -> Instant {
        self.pending_unicast
            .iter()
            .map(|(at, _)| *at)
            .fold(self.next_multicast, Instant::min)
    }

    /// What is due at `now`, with the next periodic advertisement
    /// scheduled after a multicast one.
    pub fn take_due(&mut self, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        self.pending_unicast.retain(|(at, host)| {
            if *at <= now {
                due.push(Due::Unicast(*host));
                false
            } else {
                true
            }
        });
        if self.next_multicast <= now {
            due.push(Due::Multicast);
            self.last_multicast = Some(now);
            let mut interval = self.min + self.draw(self.max - self.min);
            if self.initial_left > 0 {
                self.initial_left -= 1;
                interval = interval.min(MAX_INITIAL_INTERVAL);
            }
            self.next_multicast = now + interval;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use causeway_config::{AdvertisedPrefix, Config};

    fn config(yaml: &str) -> RouterAdvertConfig {
        match Config::from_yaml(yaml) {
            Ok(c) => c.router_advertisements.expect("an RA section"),
            Err(e) => panic!("{e}"),
        }
    }

    const BASE: &str = "routerAdvertisements:\n  interface: vlan0\n";

    #[test]
    fn a_solicitation_from_off_link_is_refused() {
        let rs = [133, 0, 0, 0, 0, 0, 0, 0];
        let host: Ipv6Addr = "fe80::2".parse().unwrap();
        assert_eq!(
            parse_solicitation(&rs, host, Some(64)),
            Err(SolicitationError::HopLimit(64))
        );
        assert_eq!(
            parse_solicitation(&rs, host, None),
            Err(SolicitationError::NoHopLimit)
        );
        assert!(parse_solicitation(&rs, host, Some(255)).is_ok());
    }

    #[test]
    fn malformed_solicitations_are_refused_with_the_reason() {
        let host: Ipv6Addr = "fe80::2".parse().unwrap();
        let cases: [(&[u8], SolicitationError); 5] = [
            (&[133, 0, 0, 0], SolicitationError::Short(4)),
            (
                &[134, 0, 0, 0, 0, 0, 0, 0],
                SolicitationError::NotSolicitation(134),
            ),
            (&[133, 1, 0, 0, 0, 0, 0, 0], SolicitationError::Code(1)),
            (
                &[133, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
                SolicitationError::ZeroLengthOption,
            ),
            (
                &[133, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0],
                SolicitationError::TruncatedOption,
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(parse_solicitation(bytes, host, Some(255)), Err(want));
        }
        let with_mac = [133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 9];
        assert_eq!(
            parse_solicitation(&with_mac, Ipv6Addr::UNSPECIFIED, Some(255)),
            Err(SolicitationError::UnspecifiedWithLinkLayer)
        );
        let rs = parse_solicitation(&with_mac, host, Some(255)).unwrap();
        assert_eq!(rs.link_layer, Some(vec![2, 0, 0, 0, 0, 9]));
        assert_eq!(rs.source, Some(host));
    }

    #[test]
    fn every_option_of_an_advertisement_is_whole_units_of_eight_bytes() {
        let cfg = config(&format!(
            "{BASE}  prefixes: [{{prefix: 'fd42:10::/64'}}]\n  mtu: 1400\n  dnsServers: ['fd42:10::53', 'fd42:10::54']\n  searchDomains: [hosted.example.com, example.com]\n"
        ));
        let ra = advertisement(&cfg, Some([2, 0, 0, 0, 0, 1]), cfg.router_lifetime);
        assert_eq!(ra[0], ROUTER_ADVERTISEMENT);
        assert_eq!(u16::from_be_bytes([ra[6], ra[7]]), 1800);
        let mut rest = &ra[16..];
        let mut kinds = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[1]) * 8;
            assert!(
                len > 0 && len <= rest.len(),
                "option {} length {len}",
                rest[0]
            );
            kinds.push(rest[0]);
            rest = &rest[len..];
        }
        assert_eq!(kinds, [1, 5, 3, 25, 31]);
    }

    #[test]
    fn the_final_advertisement_withdraws_the_router_and_keeps_the_prefixes() {
        let cfg = config(&format!("{BASE}  prefixes: [{{prefix: 'fd42:10::/64'}}]\n"));
        let ra = advertisement(&cfg, None, Duration::ZERO);
        assert_eq!(u16::from_be_bytes([ra[6], ra[7]]), 0);
        assert_eq!(ra[16], OPTION_PREFIX_INFORMATION);
        let AdvertisedPrefix { valid_lifetime, .. } = &cfg.prefixes[0];
        assert_eq!(
            u32::from_be_bytes([ra[20], ra[21], ra[22], ra[23]]),
            valid_lifetime.as_secs() as u32
        );
    }

    fn host(n: u16) -> Solicitation {
        Solicitation {
            source: Some(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, n)),
            link_layer: None,
        }
    }

    #[test]
    fn the_first_advertisements_come_within_sixteen_seconds_then_within_the_bounds() {
        let t0 = Instant::now();
        let (min, max) = (Duration::from_secs(200), Duration::from_secs(600));
        let mut s = Schedule::new(t0, min, max, 7);
        let mut now = t0;
        let mut gaps = Vec::new();
        for _ in 0..20 {
            assert_eq!(s.take_due(now), vec![Due::Multicast]);
            let next = s.next_deadline();
            gaps.push(next - now);
            now = next;
        }
        assert!(
            gaps[..3].iter().all(|g| *g <= MAX_INITIAL_INTERVAL),
            "{gaps:?}"
        );
        assert!(gaps[3..].iter().all(|g| *g >= min && *g <= max), "{gaps:?}");
        assert!(
            gaps[3..].windows(2).any(|w| w[0] != w[1]),
            "intervals are random"
        );
    }

    #[test]
    fn a_solicitation_is_answered_within_half_a_second_and_once_per_host() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, Duration::from_secs(200), Duration::from_secs(600), 3);
        s.take_due(t0);
        let asked = t0 + Duration::from_secs(5);
        s.on_solicitation(asked, &host(2));
        s.on_solicitation(asked, &host(2));
        assert!(s.next_deadline() <= asked + MAX_RA_DELAY);
        let due = s.take_due(asked + MAX_RA_DELAY);
        assert_eq!(due, vec![Due::Unicast(host(2).source.unwrap())]);
        assert!(s.take_due(asked + MAX_RA_DELAY).is_empty());
    }

    #[test]
    fn solicited_multicasts_are_three_seconds_apart_and_forged_floods_stay_bounded() {
        let t0 = Instant::now();
        let mut s = Schedule::new(t0, Duration::from_secs(200), Duration::from_secs(600), 5);
        assert_eq!(s.take_due(t0), vec![Due::Multicast]);
        let anonymous = Solicitation {
            source: None,
            link_layer: None,
        };
        s.on_solicitation(t0, &anonymous);
        assert!(s.next_deadline() >= t0 + MIN_DELAY_BETWEEN_RAS);
        for n in 0..10_000u16 {
            s.on_solicitation(t0, &host(n));
        }
        assert_eq!(s.pending_unicast.len(), MAX_PENDING_UNICAST);
        let due = s.take_due(t0 + MIN_DELAY_BETWEEN_RAS);
        assert_eq!(due.len(), MAX_PENDING_UNICAST + 1);
        assert_eq!(due.last(), Some(&Due::Multicast));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

        /// Any solicitation bytes, hop limit and source are read or refused
        /// without a panic; a valid one keeps the schedule's answer within
        /// 3.5 s and its pending answers within their bound.
        #[test]
        fn any_solicitation_is_read_or_refused(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120),
            hop in proptest::option::of(proptest::prelude::any::<u8>()),
            from in proptest::prelude::any::<u16>(),
        ) {
            let source = if from == 0 {
                Ipv6Addr::UNSPECIFIED
            } else {
                Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, from)
            };
            let mut rs = vec![ROUTER_SOLICITATION, 0, 0, 0, 0, 0, 0, 0];
            rs.extend_from_slice(&body);
            for bytes in [&rs[..], &body[..]] {
                if let Ok(s) = parse_solicitation(bytes, source, hop) {
                    let t0 = Instant::now();
                    let mut schedule =
                        Schedule::new(t0, Duration::from_secs(200), Duration::from_secs(600), 1);
                    schedule.take_due(t0);
                    schedule.on_solicitation(t0, &s);
                    proptest::prop_assert!(
                        schedule.next_deadline() <= t0 + MIN_DELAY_BETWEEN_RAS + MAX_RA_DELAY
                    );
                }
            }
        }
    }
}
