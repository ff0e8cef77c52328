//! The CPUs this process may run on, steering a socket of a SO_REUSEPORT
//! group to one of them, and pinning the thread that serves it there.
//!
//! A service that opens one socket per core (the DNS server's UDP sockets)
//! gets the most from them when each core's socket takes that core's
//! traffic. With `SO_INCOMING_CPU` set on the sockets of a group, Linux
//! (6.1 and later) hands a datagram to the socket whose CPU is the one
//! processing it, and falls back to the usual hash when no socket matches.
//! A client that sends from one core then reaches one server thread, which
//! reads it in large batches, instead of two threads that each read half as
//! much and sleep and wake twice as often. The price: traffic that one CPU
//! receives (a NIC with one queue and no RPS) all goes to one socket.
//! Older kernels accept the option and keep hashing.

use std::io;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;
use socket2::SockRef;

/// The CPUs this process may be scheduled on, in ascending order. In a
/// container these are the cpuset's CPUs, which need not start at 0. Falls
/// back to `0..available_parallelism` when the kernel will not say.
pub fn usable() -> Vec<usize> {
    let allowed: Vec<usize> = sched_getaffinity(Pid::from_raw(0))
        .map(|set| {
            (0..CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .collect()
        })
        .unwrap_or_default();
    if allowed.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        (0..n).collect()
    } else {
        allowed
    }
}

/// The CPU the socket in `slot` of a group is steered to: slots take the
/// usable CPUs in turn, so a group larger than the CPU count wraps round.
pub fn for_slot(slot: usize, usable: &[usize]) -> Option<usize> {
    if usable.is_empty() {
        None
    } else {
        usable.get(slot % usable.len()).copied()
    }
}

/// Steers `socket`, a member of a SO_REUSEPORT group, to take the traffic
/// that `cpu` processes.
pub fn steer(socket: SockRef<'_>, cpu: usize) -> io::Result<()> {
    socket.set_cpu_affinity(cpu)
}

/// Binds the calling thread to `cpu` alone, so the thread serving a
/// steered socket runs where that socket's traffic is processed.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut only = CpuSet::new();
    only.set(cpu).map_err(io::Error::from)?;
    // Pid 0 is the calling thread, not the whole process.
    sched_setaffinity(Pid::from_raw(0), &only).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::{SocketAddr, UdpSocket};
    use std::time::{Duration, Instant};

    #[test]
    fn the_current_cpu_is_usable() {
        let cpus = usable();
        assert!(!cpus.is_empty());
        let now = nix::sched::sched_getcpu().unwrap();
        assert!(cpus.contains(&now), "running on {now}, usable {cpus:?}");
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "ascending: {cpus:?}");
    }

    #[test]
    fn slots_take_the_usable_cpus_in_turn() {
        let cpus = [2, 3, 6];
        let steered: Vec<_> = (0..5).map(|s| for_slot(s, &cpus).unwrap()).collect();
        assert_eq!(steered, [2, 3, 6, 2, 3]);
        assert_eq!(for_slot(0, &[]), None);
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_alone_and_the_others_keep_theirs() {
        let cpus = usable();
        let target = *cpus.last().unwrap();
        let (allowed, ran_on) = std::thread::spawn(move || {
            pin_current_thread(target).unwrap();
            let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let allowed: Vec<usize> = (0..CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .collect();
            (allowed, nix::sched::sched_getcpu().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(allowed, [target]);
        assert_eq!(ran_on, target);
        // The caller's own set is untouched: pinning is per thread.
        assert_eq!(usable(), cpus);
    }

    #[test]
    fn pinning_to_a_cpu_past_the_set_size_is_an_error() {
        let past = CpuSet::count();
        std::thread::spawn(move || assert!(pin_current_thread(past).is_err()))
            .join()
            .unwrap();
    }

    /// (major, minor) of a kernel release string such as "6.18.44-fc".
    fn kernel_version(release: &str) -> Option<(u32, u32)> {
        let mut parts = release.trim().split(['.', '-']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    }

    #[test]
    fn kernel_versions_compare_by_major_then_minor() {
        assert_eq!(kernel_version("6.18.44-fc-v782\n"), Some((6, 18)));
        assert!(kernel_version("5.15.0-91-generic") < Some((6, 1)));
        assert!(kernel_version("6.1") >= Some((6, 1)));
        assert_eq!(kernel_version("garbage"), None);
    }

    fn reuseport_member(addr: SocketAddr) -> UdpSocket {
        let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&addr.into()).unwrap();
        s.set_nonblocking(true).unwrap();
        s.into()
    }

    /// Sends 8 datagrams from each of 8 sockets (so without steering the
    /// hash of their ports would spread them) to `to`, from a thread pinned
    /// to `cpu`.
    fn send_from_cpu(cpu: usize, to: SocketAddr) {
        std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            for _ in 0..8 {
                let client = UdpSocket::bind("127.0.0.1:0").unwrap();
                for _ in 0..8 {
                    client.send_to(b"q", to).unwrap();
                }
            }
        })
        .join()
        .unwrap();
    }

    /// Reads the group until `expected` datagrams have come in (or 5 s
    /// pass), and says how many each socket got.
    fn receive(group: &[UdpSocket], expected: usize) -> Vec<usize> {
        let mut got = vec![0; group.len()];
        let mut buf = [0u8; 16];
        let until = Instant::now() + Duration::from_secs(5);
        while got.iter().sum::<usize>() < expected && Instant::now() < until {
            for (count, socket) in got.iter_mut().zip(group) {
                while socket.recv_from(&mut buf).is_ok() {
                    *count += 1;
                }
            }
            std::thread::yield_now();
        }
        got
    }

    #[test]
    fn each_cpus_traffic_reaches_the_socket_steered_to_it() {
        let cpus = usable();
        if cpus.len() < 2 {
            eprintln!("SKIP each_cpus_traffic_reaches_the_socket_steered_to_it: needs 2 usable CPUs, have {cpus:?}");
            return;
        }
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        if kernel_version(&release) < Some((6, 1)) {
            eprintln!("SKIP each_cpus_traffic_reaches_the_socket_steered_to_it: kernel {release:?} predates steering by SO_INCOMING_CPU (6.1)");
            return;
        }
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let group: Vec<UdpSocket> = (0..2).map(|_| reuseport_member(addr)).collect();
        for (slot, socket) in group.iter().enumerate() {
            steer(SockRef::from(socket), for_slot(slot, &cpus).unwrap()).unwrap();
            assert_eq!(SockRef::from(socket).cpu_affinity().unwrap(), cpus[slot]);
        }
        // Loopback delivers on the sending CPU, so where each datagram
        // lands says which socket the kernel picked for that CPU.
        for (slot, &cpu) in cpus.iter().take(2).enumerate() {
            send_from_cpu(cpu, addr);
            let got = receive(&group, 64);
            assert_eq!(
                got[slot], 64,
                "from CPU {cpu}: {got:?} (slot {slot} is steered to it)"
            );
        }
    }
}
