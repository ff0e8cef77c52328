//! Gratuitous ARP: after a replica takes a service address over, every
//! host on the VLAN still maps the address to the old replica's MAC until
//! its ARP entry ages out (tens of seconds). An unsolicited ARP request for
//! the address, from the new MAC, updates those entries at once.
//!
//! The standard library and socket2 offer no safe way to address a packet
//! socket (a `sockaddr_ll`), so this module builds one with libc; the
//! unsafe code is limited to the socket, the `sendto` and the `close`.
#![allow(unsafe_code)]

use std::io;
use std::net::Ipv4Addr;

const ETH_P_ARP: u16 = 0x0806;
const ARPHRD_ETHER: u16 = 1;
const ARP_REQUEST: u16 = 1;

/// The ARP payload (after the Ethernet header, which the kernel adds for a
/// `SOCK_DGRAM` packet socket): "who has `ip`? tell `ip`", from `mac`.
pub fn announcement(mac: [u8; 6], ip: Ipv4Addr) -> [u8; 28] {
    let mut p = [0u8; 28];
    p[0..2].copy_from_slice(&ARPHRD_ETHER.to_be_bytes());
    p[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
    p[4] = 6;
    p[5] = 4;
    p[6..8].copy_from_slice(&ARP_REQUEST.to_be_bytes());
    p[8..14].copy_from_slice(&mac);
    p[14..18].copy_from_slice(&ip.octets());
    // Target hardware address unknown (zero), target address the same:
    // that is what makes it gratuitous.
    p[24..28].copy_from_slice(&ip.octets());
    p
}

/// Broadcasts one announcement of `ip` on the interface `index`.
pub fn announce(index: u32, mac: [u8; 6], ip: Ipv4Addr) -> io::Result<()> {
    let payload = announcement(mac, ip);
    let index = i32::try_from(index).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain system calls on a descriptor this function owns; the
    // address is a fully initialised sockaddr_ll whose size is passed.
    unsafe {
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            i32::from(ETH_P_ARP.to_be()),
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETH_P_ARP.to_be();
        addr.sll_ifindex = index;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        let sent = libc::sendto(
            fd,
            payload.as_ptr().cast(),
            payload.len(),
            0,
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        );
        let result = if sent < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
        libc::close(fd);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_asks_for_its_own_address_from_the_new_mac() {
        let mac = [2, 0, 0, 0, 0, 9];
        let p = announcement(mac, Ipv4Addr::new(192, 168, 10, 2));
        assert_eq!(&p[0..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&p[8..14], &mac);
        assert_eq!(&p[14..18], &[192, 168, 10, 2]);
        assert_eq!(&p[18..24], &[0; 6]);
        assert_eq!(&p[24..28], &[192, 168, 10, 2]);
    }
}
