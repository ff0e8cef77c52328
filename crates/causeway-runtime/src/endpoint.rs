//! A UDP socket served by a thread of its own, answering from the address
//! each query arrived on.
//!
//! The socket is blocking and never registered with an event loop. A
//! registered socket costs the kernel a readiness callback for every
//! datagram received and every reply freed after sending; a thread parked
//! in recvmmsg costs nothing until a query arrives, and under load never
//! parks. While the thread has queries upstream it polls this socket and
//! its upstream socket together ([`Endpoint::poll_with`]).
//!
//! A socket bound to a specific address always answers from it. One bound
//! to 0.0.0.0 would let the kernel pick the source by the main routing
//! table, which on a dual-homed host may be the wrong interface's address;
//! policy routing (one table per source address) then sends the reply the
//! wrong way. So such a socket asks for IP_PKTINFO, learns each query's
//! destination, and sends the reply with that as its source.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(test)]
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::libc;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    recvmmsg, sendmmsg, sendmsg, setsockopt, shutdown, sockopt, ControlMessage,
    ControlMessageOwned, MsgFlags, MultiHeaders, Shutdown, SockaddrStorage,
};

pub struct Endpoint {
    socket: UdpSocket,
    pktinfo: bool,
    /// Set by [`Endpoint::wake`]. The kernel's answer to a read on a shut
    /// socket (empty messages, their sender fields left as the last call
    /// wrote them) cannot be told from datagrams by itself.
    shut: AtomicBool,
}

/// One datagram read by [`Endpoint::recv_batch`].
#[derive(Debug, Clone, Copy)]
pub struct Datagram {
    /// The buffer it was read into: a datagram whose sender cannot be read
    /// is skipped, so a datagram's place in the batch need not be its buffer's.
    pub buf: usize,
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

/// The message headers recvmmsg and sendmmsg fill in, kept by the serving
/// thread from one batch to the next.
pub struct BatchHeaders {
    recv: MultiHeaders<SockaddrStorage>,
    send: MultiHeaders<SockaddrStorage>,
    addrs: Vec<Option<SockaddrStorage>>,
}

impl BatchHeaders {
    pub fn new(endpoint: &Endpoint, batch: usize) -> Self {
        let space = endpoint.pktinfo.then(|| nix::cmsg_space!(libc::in_pktinfo));
        BatchHeaders {
            recv: MultiHeaders::preallocate(batch, space),
            send: MultiHeaders::preallocate(batch, None),
            addrs: Vec::with_capacity(batch),
        }
    }
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
    /// Takes a bound socket; `wait` bounds how long [`Self::recv_batch`]
    /// blocks, so the serving thread gets to its housekeeping when idle.
    pub fn new(socket: UdpSocket, wait: Duration) -> io::Result<Self> {
        let wildcard = matches!(socket.local_addr()?, SocketAddr::V4(a) if a.ip().is_unspecified());
        if wildcard {
            setsockopt(&socket, sockopt::Ipv4PacketInfo, &true).map_err(io::Error::from)?;
        }
        socket.set_nonblocking(false)?;
        socket.set_read_timeout(Some(wait))?;
        Ok(Endpoint {
            socket,
            pktinfo: wildcard,
            shut: AtomicBool::new(false),
        })
    }

    #[cfg(test)]
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Blocks until a datagram arrives (or the wait runs out, or
    /// [`Self::wake`]), then reads every queued one up to one per buffer
    /// with a single recvmmsg: under load one system call serves many
    /// queries. Returns false once the socket has been shut by
    /// [`Self::wake`]; true otherwise, with nothing read if the wait ran out.
    /// With `block` false it does not wait at all (the caller has polled).
    pub fn recv_batch(
        &self,
        headers: &mut BatchHeaders,
        bufs: &mut [Vec<u8>],
        got: &mut Vec<Datagram>,
        block: bool,
    ) -> io::Result<bool> {
        got.clear();
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs
            .iter_mut()
            .map(|b| [IoSliceMut::new(&mut b[..])])
            .collect();
        let received = recvmmsg(
            self.socket.as_raw_fd(),
            &mut headers.recv,
            iovs.iter_mut(),
            if block {
                MsgFlags::MSG_WAITFORONE
            } else {
                MsgFlags::MSG_DONTWAIT
            },
            None,
        );
        if self.shut.load(Ordering::Acquire) {
            return Ok(false);
        }
        let results = match received {
            Ok(r) => r,
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(true),
            Err(e) => return Err(e.into()),
        };
        for (buf, msg) in results.enumerate() {
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
                buf,
                len: msg.bytes,
                from,
                local,
            });
        }
        Ok(true)
    }

    /// Sends every reply, with sendmmsg when they all leave from the
    /// socket's own address (a wildcard socket sets each one's source, which
    /// sendmmsg cannot do per message). Blocks while the send buffer is full.
    pub fn send_batch(&self, headers: &mut BatchHeaders, out: &[Outgoing<'_>]) {
        if self.pktinfo {
            for o in out {
                let _ = self.send(o.wire, o.to, o.local, MsgFlags::empty());
            }
            return;
        }
        let fd = self.socket.as_raw_fd();
        let mut sent = 0;
        while sent < out.len() {
            let rest = &out[sent..];
            headers.addrs.clear();
            headers
                .addrs
                .extend(rest.iter().map(|o| Some(SockaddrStorage::from(o.to))));
            let iovs: Vec<[IoSlice<'_>; 1]> = rest.iter().map(|o| [IoSlice::new(o.wire)]).collect();
            match sendmmsg(
                fd,
                &mut headers.send,
                &iovs,
                &headers.addrs,
                [],
                MsgFlags::empty(),
            ) {
                Ok(results) => sent += results.count().max(1),
                Err(Errno::EINTR) => {}
                // A reply that cannot be sent is lost, as a UDP reply may be.
                Err(_) => sent += 1,
            }
        }
    }

    /// Sends `buf` to `to`, from `local` when the socket is a wildcard one.
    fn send(
        &self,
        buf: &[u8],
        to: SocketAddr,
        local: Option<Ipv4Addr>,
        flags: MsgFlags,
    ) -> io::Result<usize> {
        // The source is set only on a wildcard socket, and only to an
        // address a reply can come from.
        let source = match (to, local, self.pktinfo) {
            (SocketAddr::V4(_), Some(l), true)
                if !(l.is_broadcast() || l.is_multicast() || l.is_unspecified()) =>
            {
                Some(libc::in_pktinfo {
                    ipi_ifindex: 0,
                    ipi_spec_dst: libc::in_addr {
                        s_addr: u32::from(l).to_be(),
                    },
                    ipi_addr: libc::in_addr { s_addr: 0 },
                })
            }
            _ => None,
        };
        let cmsg = source.as_ref().map(ControlMessage::Ipv4PacketInfo);
        let iov = [IoSlice::new(buf)];
        let dest = SockaddrStorage::from(to);
        sendmsg(
            self.socket.as_raw_fd(),
            &iov,
            cmsg.as_slice(),
            flags,
            Some(&dest),
        )
        .map_err(io::Error::from)
    }

    /// Sends one reply without blocking: a reply that finds the send buffer
    /// full is lost, as any UDP reply may be, rather than holding up the
    /// thread (or task) that has other clients to serve.
    pub fn send_now(
        &self,
        buf: &[u8],
        to: SocketAddr,
        local: Option<Ipv4Addr>,
    ) -> io::Result<usize> {
        self.send(buf, to, local, MsgFlags::MSG_DONTWAIT)
    }

    /// Waits until this socket or `upstream` has something to read, or
    /// `wait` runs out, and says which: (this one, upstream). A shut socket
    /// ([`Self::wake`]) reads as ready.
    pub fn poll_with(&self, upstream: BorrowedFd<'_>, wait: Duration) -> io::Result<(bool, bool)> {
        // Rounded up, so a timer due in under a millisecond is not polled for
        // again and again with a zero wait.
        let millis = u16::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        let mut fds = [
            PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
            PollFd::new(upstream, PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::from(millis)) {
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok((false, false)),
            Err(e) => return Err(e.into()),
        }
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        Ok((ready(&fds[0]), ready(&fds[1])))
    }

    /// Makes a thread blocked in [`Self::recv_batch`] return now, and every
    /// later call return at once. Shutting down the read side of an
    /// unconnected UDP socket reports ENOTCONN, yet marks it shut and wakes
    /// its readers, which is all this needs.
    pub fn wake(&self) {
        self.shut.store(true, Ordering::Release);
        let _ = shutdown(self.socket.as_raw_fd(), Shutdown::Read);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(addr: &str) -> Endpoint {
        Endpoint::new(UdpSocket::bind(addr).unwrap(), Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn batches_are_read_and_sent_whole() {
        let server = endpoint("127.0.0.1:0");
        let mut headers = BatchHeaders::new(&server, 8);
        let addr = server.local_addr().unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..5u8 {
            client.send_to(&[i; 3], addr).unwrap();
        }
        let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 64]).collect();
        let mut got = Vec::new();
        let mut seen = 0;
        while seen < 5 {
            assert!(server
                .recv_batch(&mut headers, &mut bufs, &mut got, true)
                .unwrap());
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
        server.send_batch(&mut headers, &out);
        let mut buf = [0u8; 8];
        for i in 0..5u8 {
            let (n, _) = client.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &[i + 100, i + 100]);
        }
    }

    #[test]
    fn an_empty_datagram_is_a_query_not_a_shutdown() {
        let server = endpoint("127.0.0.1:0");
        let mut headers = BatchHeaders::new(&server, 4);
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(&[], server.local_addr().unwrap()).unwrap();
        let mut bufs = vec![vec![0u8; 16]; 4];
        let mut got = Vec::new();
        assert!(server
            .recv_batch(&mut headers, &mut bufs, &mut got, true)
            .unwrap());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len, 0);
    }

    #[test]
    fn wake_releases_a_blocked_reader_and_every_later_read() {
        let server = Arc::new(endpoint("127.0.0.1:0"));
        // One real datagram first: the headers then hold its sender, as
        // they do in a serving thread, and a shut socket's empty messages
        // must not read as more datagrams from it.
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client.send_to(b"q", server.local_addr().unwrap()).unwrap();
        let (first_read, took_it) = std::sync::mpsc::channel();
        let reader = server.clone();
        let blocked = std::thread::spawn(move || {
            let mut headers = BatchHeaders::new(&reader, 4);
            let mut bufs = vec![vec![0u8; 16]; 4];
            let mut got = Vec::new();
            let mut read = || {
                let open = reader
                    .recv_batch(&mut headers, &mut bufs, &mut got, true)
                    .unwrap();
                (open, got.len())
            };
            first_read.send(read()).unwrap();
            // Blocks until the wake (or has it already).
            let after = [read(), read()];
            (after, std::time::Instant::now())
        });
        assert_eq!(took_it.recv().unwrap(), (true, 1));
        let woke = std::time::Instant::now();
        server.wake();
        let (after, returned) = blocked.join().unwrap();
        assert_eq!(after, [(false, 0), (false, 0)]);
        // Well inside the 5 s receive timeout: the wake did it.
        assert!(returned.duration_since(woke) < Duration::from_secs(4));
    }

    #[test]
    fn a_wildcard_socket_learns_and_replies_from_the_destination_address() {
        let server = endpoint("0.0.0.0:0");
        let mut headers = BatchHeaders::new(&server, 1);
        let port = server.local_addr().unwrap().port();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        // 127.0.0.3 is a loopback address the server was never bound to.
        client.send_to(b"ping", ("127.0.0.3", port)).unwrap();
        let mut bufs = vec![vec![0u8; 16]];
        let mut got = Vec::new();
        assert!(server
            .recv_batch(&mut headers, &mut bufs, &mut got, true)
            .unwrap());
        let d = got[0];
        assert_eq!(&bufs[0][..d.len], b"ping");
        assert_eq!(d.local, Some(Ipv4Addr::new(127, 0, 0, 3)));
        server.send_batch(
            &mut headers,
            &[Outgoing {
                wire: b"pong",
                to: d.from,
                local: d.local,
            }],
        );
        let mut buf = [0u8; 16];
        let (n, reply_from) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"pong");
        assert_eq!(reply_from, SocketAddr::from(([127, 0, 0, 3], port)));
    }

    #[test]
    fn poll_says_which_socket_has_something_to_read() {
        let server = endpoint("127.0.0.1:0");
        let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let wait = Duration::from_millis(50);
        assert_eq!(
            server.poll_with(upstream.as_fd(), wait).unwrap(),
            (false, false)
        );

        peer.send_to(b"answer", upstream.local_addr().unwrap())
            .unwrap();
        assert_eq!(
            server.poll_with(upstream.as_fd(), wait).unwrap(),
            (false, true)
        );

        server
            .send_now(b"query", peer.local_addr().unwrap(), None)
            .unwrap();
        let mut buf = [0u8; 8];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"query"[..], server.local_addr().unwrap())
        );
        peer.send_to(b"query", server.local_addr().unwrap())
            .unwrap();
        assert_eq!(
            server.poll_with(upstream.as_fd(), wait).unwrap(),
            (true, true)
        );
    }

    #[test]
    fn a_woken_socket_polls_ready_and_reads_as_shut() {
        let server = Arc::new(endpoint("127.0.0.1:0"));
        let upstream = UdpSocket::bind("127.0.0.1:0").unwrap();
        let waker = server.clone();
        // The outcome does not hang on the pause: a socket shut before the
        // poll polls ready too. It only makes a blocked poll the usual case.
        let woken = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            waker.wake();
        });
        // Far longer than the wake takes: a return before it is the wake.
        let (ready, _) = server
            .poll_with(upstream.as_fd(), Duration::from_secs(30))
            .unwrap();
        woken.join().unwrap();
        assert!(ready);
        let mut headers = BatchHeaders::new(&server, 4);
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 64]).collect();
        let mut got = Vec::new();
        assert!(!server
            .recv_batch(&mut headers, &mut bufs, &mut got, false)
            .unwrap());
    }
}
