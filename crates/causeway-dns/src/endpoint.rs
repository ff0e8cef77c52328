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
    recvmmsg, sendmmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned,
    MsgFlags, MultiHeaders, SockaddrIn, SockaddrStorage,
};
use tokio::io::Interest;
use tokio::net::UdpSocket;

pub struct Endpoint {
    socket: UdpSocket,
    pktinfo: bool,
}

/// One datagram read by [`Endpoint::recv_batch`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram {
    pub len: usize,
    pub from: SocketAddr,
    /// The local address it was sent to, on a wildcard socket.
    pub local: Option<Ipv4Addr>,
}

/// A reply for [`Endpoint::send_batch`].
pub struct Outgoing<'a> {
    pub wire: &'a [u8],
    pub to: SocketAddr,
    pub local: Option<Ipv4Addr>,
}

fn std_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::new(v4.ip(), v4.port())));
    }
    a.as_sockaddr_in6().map(|v6| {
        SocketAddr::V6(std::net::SocketAddrV6::new(
            v6.ip(),
            v6.port(),
            v6.flowinfo(),
            v6.scope_id(),
        ))
    })
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

    /// Waits for datagrams, then reads as many as are queued, up to one per
    /// buffer, with a single recvmmsg: under load one system call serves
    /// many queries.
    pub async fn recv_batch(
        &self,
        bufs: &mut [Vec<u8>],
        got: &mut Vec<Datagram>,
    ) -> io::Result<()> {
        got.clear();
        let fd = self.socket.as_raw_fd();
        let pktinfo = self.pktinfo;
        self.socket
            .async_io(Interest::READABLE, || {
                let space = pktinfo.then(|| nix::cmsg_space!(libc::in_pktinfo));
                let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(bufs.len(), space);
                let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs
                    .iter_mut()
                    .map(|b| [IoSliceMut::new(&mut b[..])])
                    .collect();
                let results = recvmmsg(
                    fd,
                    &mut headers,
                    iovs.iter_mut(),
                    MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(io::Error::from)?;
                for msg in results {
                    let Some(from) = msg.address.as_ref().and_then(std_addr) else {
                        continue;
                    };
                    let mut local = None;
                    if let Ok(cmsgs) = msg.cmsgs() {
                        for c in cmsgs {
                            if let ControlMessageOwned::Ipv4PacketInfo(info) = c {
                                local = Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)));
                            }
                        }
                    }
                    got.push(Datagram {
                        len: msg.bytes,
                        from,
                        local,
                    });
                }
                Ok(())
            })
            .await
    }

    /// Sends every reply, with sendmmsg when they all leave from the
    /// socket's own address (a wildcard socket sets each one's source, which
    /// sendmmsg cannot do per message).
    pub async fn send_batch(&self, out: &[Outgoing<'_>]) {
        if self.pktinfo {
            for o in out {
                let _ = self.send(o.wire, o.to, o.local).await;
            }
            return;
        }
        let mut sent = 0;
        while sent < out.len() {
            let rest = &out[sent..];
            let fd = self.socket.as_raw_fd();
            let result = self
                .socket
                .async_io(Interest::WRITABLE, || {
                    let mut headers =
                        MultiHeaders::<SockaddrStorage>::preallocate(rest.len(), None);
                    let iovs: Vec<[IoSlice<'_>; 1]> =
                        rest.iter().map(|o| [IoSlice::new(o.wire)]).collect();
                    let addrs: Vec<Option<SockaddrStorage>> = rest
                        .iter()
                        .map(|o| Some(SockaddrStorage::from(o.to)))
                        .collect();
                    let results = sendmmsg(fd, &mut headers, &iovs, &addrs, [], MsgFlags::empty())
                        .map_err(io::Error::from)?;
                    Ok(results.count())
                })
                .await;
            match result {
                Ok(n) if n > 0 => sent += n,
                // A reply that cannot be sent is lost, as a UDP reply may be.
                _ => sent += 1,
            }
        }
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
    async fn batches_are_read_and_sent_whole() {
        let server = Endpoint::new(UdpSocket::bind("127.0.0.1:0").await.unwrap()).unwrap();
        let addr = server.socket.local_addr().unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for i in 0..5u8 {
            client.send_to(&[i; 3], addr).await.unwrap();
        }
        let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 64]).collect();
        let mut got = Vec::new();
        let mut seen = 0;
        while seen < 5 {
            server.recv_batch(&mut bufs, &mut got).await.unwrap();
            for (i, d) in got.iter().enumerate() {
                assert_eq!(d.len, 3);
                assert_eq!(bufs[i][0], seen as u8);
                assert_eq!(d.from, client.local_addr().unwrap());
                seen += 1;
            }
        }
        let replies: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i + 100; 2]).collect();
        let out: Vec<Outgoing<'_>> = replies
            .iter()
            .map(|w| Outgoing {
                wire: w,
                to: client.local_addr().unwrap(),
                local: None,
            })
            .collect();
        server.send_batch(&out).await;
        let mut buf = [0u8; 8];
        for i in 0..5u8 {
            let (n, _) = client.recv_from(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], &[i + 100, i + 100]);
        }
    }

    #[tokio::test]
    async fn a_wildcard_socket_learns_and_replies_from_the_destination_address() {
        let server = Endpoint::new(UdpSocket::bind("0.0.0.0:0").await.unwrap()).unwrap();
        let port = server.socket.local_addr().unwrap().port();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        // 127.0.0.3 is a loopback address the server was never bound to.
        client.send_to(b"ping", ("127.0.0.3", port)).await.unwrap();
        let mut bufs = vec![vec![0u8; 16]];
        let mut got = Vec::new();
        server.recv_batch(&mut bufs, &mut got).await.unwrap();
        let d = got[0];
        assert_eq!(&bufs[0][..d.len], b"ping");
        assert_eq!(d.local, Some(Ipv4Addr::new(127, 0, 0, 3)));
        server.send(b"pong", d.from, d.local).await.unwrap();
        let mut buf = [0u8; 16];
        let (n, reply_from) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"pong");
        assert_eq!(reply_from, SocketAddr::from(([127, 0, 0, 3], port)));
    }
}
