// `causeway-bench dns-floor`: the least work a UDP DNS server can do per
// query, to measure what the kernel's UDP path costs on this host before
// any server logic runs. Each query gets the answer `wire::floor_answer`
// builds (an A record for every A question, NODATA for the rest), with no
// lookup, no views, no cache and no metrics.
//
// Its sockets are served the way causeway's UDP sockets are: a
// SO_REUSEPORT group with one blocking thread per socket, each socket
// steered to a CPU (SO_INCOMING_CPU), 32 datagrams per recvmmsg and
// replies sent with sendmmsg. A server's queries per CPU-second measured
// against this floor's, in the same run, tell how much of its cost is its
// own code; the floor's against another server's tell how far any server
// built on these system calls could go on this kernel.

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use causeway_runtime::cpus;
use nix::errno::Errno;
use nix::sys::socket::{recvmmsg, sendmmsg, MsgFlags, MultiHeaders, SockaddrStorage};
use serde::Serialize;
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use super::wire;

/// Datagrams read (and replies sent) per system call at most: the same
/// batch causeway's UDP threads use.
const BATCH: usize = 32;
/// More threads than this would measure the scheduler, not the floor.
const MAX_SOCKETS: usize = 256;
/// Room for any query a UDP client sends without EDNS, and most with it.
const QUERY_BUF: usize = 4096;

#[derive(clap::Args, Debug, Clone)]
pub struct FloorArgs {
    /// Address:port to answer on (UDP; IPv4 only)
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.16:53")]
    pub listen: SocketAddr,

    /// Sockets in the SO_REUSEPORT group, one thread each, steered to the
    /// usable CPUs in turn (default: one per usable CPU)
    #[arg(long, value_name = "N")]
    pub sockets: Option<usize>,

    /// The address every A question is answered with
    #[arg(long, value_name = "IPV4", default_value = "192.0.2.1")]
    pub answer: Ipv4Addr,

    /// Print the final summary as one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// What each serving thread has done, read once at the end. Each thread's
/// counts have a cache line of their own, so counting costs no line moving
/// between CPUs.
#[derive(Default)]
#[repr(align(128))]
struct Counts {
    answered: AtomicU64,
    malformed: AtomicU64,
    system_calls: AtomicU64,
}

#[derive(Serialize)]
struct Summary {
    listen: SocketAddr,
    sockets: usize,
    answered: u64,
    malformed: u64,
    /// recvmmsg and sendmmsg calls together.
    system_calls: u64,
    stopped_by: &'static str,
}

pub async fn run(args: FloorArgs) -> anyhow::Result<()> {
    if !args.listen.is_ipv4() {
        bail!(
            "--listen {}: the floor responder answers on IPv4 only",
            args.listen
        );
    }
    let usable = cpus::usable();
    let sockets = args.sockets.unwrap_or(usable.len().min(MAX_SOCKETS));
    if !(1..=MAX_SOCKETS).contains(&sockets) {
        bail!("--sockets {sockets}: the group takes 1 to {MAX_SOCKETS} sockets");
    }
    // Installed before anything is served, so a stop is never missed.
    let mut stops = causeway_runtime::signals()?;
    // Every socket is bound before any thread starts, so a bad address or
    // a port in use fails the command instead of leaving half a group.
    let group = (0..sockets)
        .map(|slot| bind(args.listen, cpus::for_slot(slot, &usable)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let counts: Arc<Vec<Counts>> = Arc::new((0..sockets).map(|_| Counts::default()).collect());
    for (slot, socket) in group.into_iter().enumerate() {
        let counts = counts.clone();
        let answer = args.answer;
        std::thread::Builder::new()
            .name(format!("dns-floor-{slot}"))
            .spawn(move || serve(&socket, answer, &counts[slot]))
            .context("cannot start a serving thread")?;
    }
    eprintln!(
        "dns-floor: answering on {} with {sockets} socket(s); A questions get {}",
        args.listen, args.answer
    );
    let stopped_by = crate::stop_word(stops.recv().await);
    let sum = |f: fn(&Counts) -> &AtomicU64| -> u64 {
        counts.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
    };
    let summary = Summary {
        listen: args.listen,
        sockets,
        answered: sum(|c| &c.answered),
        malformed: sum(|c| &c.malformed),
        system_calls: sum(|c| &c.system_calls),
        stopped_by,
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "dns-floor {}: answered {}, malformed {}, {} system calls ({:.1} queries each)",
            summary.stopped_by,
            summary.answered,
            summary.malformed,
            summary.system_calls,
            summary.answered as f64 / summary.system_calls.max(1) as f64
        );
    }
    // The serving threads are parked in recvmmsg; returning ends them.
    Ok(())
}

fn bind(addr: SocketAddr, cpu: Option<usize>) -> anyhow::Result<UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
        .context("cannot open a UDP socket")?;
    socket
        .set_reuse_port(true)
        .context("cannot set SO_REUSEPORT")?;
    if let Some(cpu) = cpu {
        // Older kernels take the option and keep hashing; so does the floor.
        let _ = cpus::steer(SockRef::from(&socket), cpu);
    }
    let _ = socket.set_recv_buffer_size(4 << 20);
    socket
        .bind(&addr.into())
        .with_context(|| format!("cannot bind {addr}"))?;
    Ok(socket.into())
}

fn serve(socket: &UdpSocket, answer: Ipv4Addr, counts: &Counts) {
    let fd = socket.as_raw_fd();
    let mut recv_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut send_headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; QUERY_BUF]).collect();
    // (buffer, length, sender) of each datagram read.
    let mut got: Vec<(usize, usize, SockaddrStorage)> = Vec::with_capacity(BATCH);
    let mut replies: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(512)).collect();
    let mut to: Vec<Option<SockaddrStorage>> = Vec::with_capacity(BATCH);
    loop {
        got.clear();
        {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs
                .iter_mut()
                .map(|b| [IoSliceMut::new(&mut b[..])])
                .collect();
            counts.system_calls.fetch_add(1, Ordering::Relaxed);
            match recvmmsg(
                fd,
                &mut recv_headers,
                iovs.iter_mut(),
                MsgFlags::MSG_WAITFORONE,
                None,
            ) {
                Ok(results) => got.extend(
                    results
                        .enumerate()
                        .filter_map(|(i, m)| Some((i, m.bytes, m.address?))),
                ),
                Err(Errno::EINTR | Errno::EAGAIN) => continue,
                Err(e) => {
                    eprintln!("dns-floor: receive failed, thread stops: {e}");
                    return;
                }
            }
        }
        to.clear();
        let mut malformed = 0;
        for &(i, len, ref from) in &got {
            let reply = &mut replies[to.len()];
            if wire::floor_answer(&bufs[i][..len], answer, reply).is_ok() {
                to.push(Some(*from));
            } else {
                malformed += 1;
            }
        }
        counts.malformed.fetch_add(malformed, Ordering::Relaxed);
        let mut sent = 0;
        while sent < to.len() {
            let iovs: Vec<[IoSlice<'_>; 1]> = replies[sent..to.len()]
                .iter()
                .map(|r| [IoSlice::new(r)])
                .collect();
            counts.system_calls.fetch_add(1, Ordering::Relaxed);
            match sendmmsg(
                fd,
                &mut send_headers,
                &iovs,
                &to[sent..],
                [],
                MsgFlags::empty(),
            ) {
                Ok(results) => sent += results.count().max(1),
                Err(Errno::EINTR) => {}
                // A reply that cannot be sent is lost, as a UDP reply may be.
                Err(_) => sent += 1,
            }
        }
        counts
            .answered
            .fetch_add(to.len() as u64, Ordering::Relaxed);
    }
}
