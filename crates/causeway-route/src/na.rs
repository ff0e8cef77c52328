//! Unsolicited neighbour advertisements: the v6 counterpart of gratuitous
//! ARP. After a takeover, hosts still map a v6 service address to the old
//! replica's MAC until their neighbour entry goes stale and is probed
//! again (tens of seconds); an advertisement with the Override flag, from
//! the new MAC, updates it at once (RFC 4861 section 7.2.6).

use std::io::{self, IoSlice};
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn6};
use socket2::{Domain, Protocol, Socket, Type};

const NEIGHBOR_ADVERTISEMENT: u8 = 136;
const OPTION_TARGET_LINK_LAYER: u8 = 2;
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The ICMPv6 body (the kernel fills in the checksum): "`target` is at
/// `mac`", overriding what hosts have cached. `router`: whether the sender
/// is a router, which a host that uses it as one must keep seeing, or it
/// drops it from its default routers.
pub fn advertisement(target: Ipv6Addr, mac: [u8; 6], router: bool) -> [u8; 32] {
    let mut p = [0u8; 32];
    p[0] = NEIGHBOR_ADVERTISEMENT;
    // R, S (not solicited) and O: override the cached link-layer address.
    p[4] = u8::from(router) << 7 | 0x20;
    p[8..24].copy_from_slice(&target.octets());
    p[24] = OPTION_TARGET_LINK_LAYER;
    p[25] = 1;
    p[26..32].copy_from_slice(&mac);
    p
}

/// Whether an address is link-local (fe80::/10).
pub fn is_link_local(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// Multicasts one advertisement for each of `targets` to all nodes on the
/// interface `index`, each from the target itself (which must be on the
/// interface). A link-local target is advertised as a router's: it is
/// the router advertisements' source under HA.
pub fn announce(index: u32, mac: [u8; 6], targets: &[Ipv6Addr]) -> io::Result<()> {
    let socket = Socket::new(Domain::IPV6, Type::RAW.cloexec(), Some(Protocol::ICMPV6))?;
    // Hosts drop neighbour discovery with any other hop limit.
    socket.set_multicast_hops_v6(255)?;
    socket.set_multicast_if_v6(index)?;
    socket.set_multicast_loop_v6(false)?;
    let destination = SockaddrIn6::from(std::net::SocketAddrV6::new(ALL_NODES, 0, 0, index));
    let mut first_error = None;
    for target in targets {
        let message = advertisement(*target, mac, is_link_local(*target));
        let info = libc::in6_pktinfo {
            ipi6_addr: libc::in6_addr {
                s6_addr: target.octets(),
            },
            ipi6_ifindex: index,
        };
        let sent = sendmsg(
            socket.as_raw_fd(),
            &[IoSlice::new(&message)],
            &[ControlMessage::Ipv6PacketInfo(&info)],
            MsgFlags::empty(),
            Some(&destination),
        );
        if let Err(e) = sent {
            first_error.get_or_insert(io::Error::from(e));
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertisement_overrides_and_names_the_new_mac() {
        let target: Ipv6Addr = "fd42:10::2".parse().unwrap();
        let p = advertisement(target, [2, 0, 0, 0, 0, 9], false);
        assert_eq!(p[0], 136);
        assert_eq!(p[4], 0x20, "override, not solicited, not a router");
        assert_eq!(&p[8..24], &target.octets());
        assert_eq!(&p[24..32], &[2, 1, 2, 0, 0, 0, 0, 9]);
        let router = advertisement("fe80::1".parse().unwrap(), [2, 0, 0, 0, 0, 9], true);
        assert_eq!(router[4], 0xa0, "router and override");
    }
}
