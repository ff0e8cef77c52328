//! The PROXY protocol version 2 header (HAProxy's spec, section 2.2), sent
//! to an upstream before the client's bytes so it learns the client's
//! address through the proxy.

use std::net::SocketAddr;

const SIGNATURE: [u8; 12] = [
    0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A,
];
/// Version 2, command PROXY.
const VERSION_PROXY: u8 = 0x21;
const TCP_OVER_IPV4: u8 = 0x11;
const TCP_OVER_IPV6: u8 = 0x21;

/// The header for a connection from `client` to `local` (the proxy's
/// address the client reached). Mixed families are sent as IPv6, with the
/// IPv4 side mapped.
pub fn header_v2(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(16 + 36);
    h.extend_from_slice(&SIGNATURE);
    h.push(VERSION_PROXY);
    match (client, local) {
        (SocketAddr::V4(c), SocketAddr::V4(l)) => {
            h.push(TCP_OVER_IPV4);
            h.extend_from_slice(&12u16.to_be_bytes());
            h.extend_from_slice(&c.ip().octets());
            h.extend_from_slice(&l.ip().octets());
            h.extend_from_slice(&c.port().to_be_bytes());
            h.extend_from_slice(&l.port().to_be_bytes());
        }
        _ => {
            let v6 = |a: SocketAddr| match a {
                SocketAddr::V4(v4) => v4.ip().to_ipv6_mapped(),
                SocketAddr::V6(v6) => *v6.ip(),
            };
            h.push(TCP_OVER_IPV6);
            h.extend_from_slice(&36u16.to_be_bytes());
            h.extend_from_slice(&v6(client).octets());
            h.extend_from_slice(&v6(local).octets());
            h.extend_from_slice(&client.port().to_be_bytes());
            h.extend_from_slice(&local.port().to_be_bytes());
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_header_matches_the_spec_layout() {
        let h = header_v2(
            "192.168.100.50:40000".parse().unwrap(),
            "192.168.100.2:6443".parse().unwrap(),
        );
        assert_eq!(h.len(), 28);
        assert_eq!(&h[..12], &SIGNATURE);
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 12);
        assert_eq!(&h[16..20], &[192, 168, 100, 50]);
        assert_eq!(&h[20..24], &[192, 168, 100, 2]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 40000);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 6443);
    }

    #[test]
    fn ipv6_and_mixed_families_use_the_ipv6_form() {
        let h = header_v2(
            "[fd00::5]:1234".parse().unwrap(),
            "10.0.0.1:443".parse().unwrap(),
        );
        assert_eq!(h.len(), 52);
        assert_eq!(h[13], 0x21);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 36);
        assert_eq!(
            &h[32..48],
            &"::ffff:10.0.0.1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
    }
}
