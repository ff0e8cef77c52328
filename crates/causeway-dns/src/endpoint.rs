//! A UDP socket that answers from the address each query arrived on.
//!
//! A socket bound to a specific address always does. One bound to 0.0.0.0
//! would let the kernel pick the source by the main routing table, which on
//! a dual-homed host may be the wrong interface's address; policy routing
//! (one table per source address) then sends the reply the wrong way. So
//! such a socket asks for IP_PKTINFO, learns each query's destination, and
//! sends the reply with that as its source.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;

use nix::libc;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn, SockaddrStorage,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

pub struct Endpoint {
    socket: UdpSocket,
    pktinfo: bool,
}

impl Endpoint {
    pub fn new(socket: UdpSocket) -> io::Result<Self> {
        let wildcard = matches!(socket.local_addr()?, SocketAddr::V4(a) if a.ip().is_unspecified());
        if wildcard {
            setsockopt(&socket, sockopt::Ipv4PacketInfo, &true).map_err(io::Error::from)?;
        }
        Ok(Endpoint {
            socket,
            pktinfo: wildcard,
        })
    }

    /// Receives one datagram: its length, its sender, and (on a wildcard
    /// socket) the local address it was sent to.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<Ipv4Addr>)> {
        if !self.pktinfo {
            let (n, from) = self.socket.recv_from(buf).await?;
            return Ok((n, from, None));
        }
        let fd = self.socket.as_raw_fd();
        self.socket
            .async_io(Interest::READABLE, || {
                let mut iov = [IoSliceMut::new(&mut *buf)];
                let mut space = nix::cmsg_space!(libc::in_pktinfo);
                let msg =
                    recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut space), MsgFlags::empty())
                        .map_err(io::Error::from)?;
                let mut local = None;
                if let Ok(cmsgs) = msg.cmsgs() {
                    for c in cmsgs {
                        if let ControlMessageOwned::Ipv4PacketInfo(info) = c {
                            local = Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
                        }
                    }
                }
                let from = msg
                    .address
                    .as_ref()
                    .and_then(|a| a.as_sockaddr_in())
                    .map(|s| SocketAddr::V4(SocketAddrV4::new(s.ip(), s.port())))
                    .ok_or_else(|| io::Error::other("datagram without an IPv4 sender"))?;
                Ok((msg.bytes, from, local))
            })
            .await
    }

    /// Sends `buf` to `to`, from `local` when the socket is a wildcard one.
    pub async fn send(
        &self,
        buf: &[u8],
        to: SocketAddr,
        local: Option<Ipv4Addr>,
    ) -> io::Result<usize> {
        let (SocketAddr::V4(to4), Some(local), true) = (to, local, self.pktinfo) else {
            return self.socket.send_to(buf, to).await;
        };
        if local.is_broadcast() || local.is_multicast() || local.is_unspecified() {
            return self.socket.send_to(buf, to).await;
        }
        let dest = SockaddrIn::from(to4);
        let info = libc::in_pktinfo {
            ipi_ifindex: 0,
            ipi_spec_dst: libc::in_addr {
                s_addr: u32::from(local).to_be(),
            },
            ipi_addr: libc::in_addr { s_addr: 0 },
        };
        let fd = self.socket.as_raw_fd();
        self.socket
            .async_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(buf)];
                let cmsgs = [ControlMessage::Ipv4PacketInfo(&info)];
                sendmsg(fd, &iov, &cmsgs, MsgFlags::empty(), Some(&dest)).map_err(io::Error::from)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wildcard_socket_learns_and_replies_from_the_destination_address() {
        let server = Endpoint::new(UdpSocket::bind("0.0.0.0:0").await.unwrap()).unwrap();
        let port = server.socket.local_addr().unwrap().port();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // 127.0.0.3 is a loopback address the server was never bound to.
        client.send_to(b"ping", ("127.0.0.3", port)).await.unwrap();
        let mut buf = [0u8; 16];
        let (n, from, local) = server.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"ping");
        assert_eq!(local, Some(Ipv4Addr::new(127, 0, 0, 3)));
        server.send(b"pong", from, local).await.unwrap();
        let (n, reply_from) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"pong");
        assert_eq!(reply_from, SocketAddr::from(([127, 0, 0, 3], port)));
    }
}
