//! Where the tests' servers listen on loopback, without finding a port by
//! binding port 0, releasing it and hoping nobody takes it before the
//! server binds: a client's ephemeral port could, and a test process
//! running beside could be handed the same one.
//!
//! - [`reserved_port_on`] gives a port below the kernel's ephemeral range,
//!   held by this process until it exits (a lock on the port's file), so
//!   neither a client nor another test process gets it.
//! - [`unique_loopback`] gives an address of this process's own, where a
//!   server can take its usual ports (a control plane's etcd and API
//!   server do).

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

/// Below the kernel's ephemeral range (32768 and up by default): no
/// client's ephemeral port and no socket bound to port 0 is given one.
pub const RESERVED_PORTS: std::ops::Range<u16> = 20000..32768;

/// The reservations this process holds, released by the kernel when it
/// exits, however it exits.
static RESERVATIONS: Mutex<Vec<Flock<File>>> = Mutex::new(Vec::new());

/// A port in [`RESERVED_PORTS`] that is this process's until it exits: no
/// other test process is given it (each holds a lock on the port's file
/// under the temp dir, and skips ports others hold), no earlier call
/// returned it, and it was free for TCP and UDP on `ip` when reserved.
///
/// # Panics
/// When the temp dir cannot be written or every port is taken: a broken
/// test machine.
pub fn reserved_port_on(ip: Ipv4Addr) -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join("causeway-test-ports");
    if let Err(e) = std::fs::create_dir_all(&dir) {
        panic!("{}: {e}", dir.display());
    }
    let span = usize::from(RESERVED_PORTS.end - RESERVED_PORTS.start);
    // Processes start at different places, so they seldom meet.
    let start = std::process::id() as usize * 97;
    for _ in 0..span {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let Ok(offset) = u16::try_from(offset) else {
            continue;
        };
        let port = RESERVED_PORTS.start + offset;
        let Ok(file) = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        // A daemon of the machine's own may listen there.
        if TcpListener::bind((ip, port)).is_ok() && UdpSocket::bind((ip, port)).is_ok() {
            RESERVATIONS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(lock);
            return port;
        }
    }
    panic!("no port left in {RESERVED_PORTS:?} on {ip}");
}

/// [`reserved_port_on`] 127.0.0.1.
pub fn reserved_port() -> u16 {
    reserved_port_on(Ipv4Addr::LOCALHOST)
}

/// A loopback address no other test process uses and no earlier call of
/// this one returned: 127.(128+n).(pid>>8).(pid), n counting calls.
/// Process IDs above 65535 wrap, which only matters when two test
/// processes whose IDs differ by a multiple of 65536 run at once.
///
/// # Panics
/// After 128 calls in one process.
pub fn unique_loopback() -> Ipv4Addr {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let Some(n) = u8::try_from(n).ok().filter(|n| *n < 128) else {
        panic!("a test process uses at most 128 addresses of its own");
    };
    let pid = std::process::id();
    Ipv4Addr::new(127, 128 + n, (pid >> 8) as u8, pid as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_is_never_given_twice_and_lies_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| reserved_port()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|p| RESERVED_PORTS.contains(p)));
    }

    #[test]
    fn a_reserved_port_is_skipped_by_another_process() {
        let port = reserved_port();
        let file = std::env::temp_dir()
            .join("causeway-test-ports")
            .join(port.to_string());
        // flock(1) stands for another test process.
        let other = std::process::Command::new("flock")
            .args(["--nonblock", "--exclusive"])
            .arg(&file)
            .arg("true")
            .status()
            .map(|s| s.success());
        assert_eq!(other.ok(), Some(false), "the lock on {}", file.display());
    }

    #[test]
    fn unique_addresses_differ() {
        let a = unique_loopback();
        let b = unique_loopback();
        assert_ne!(a, b);
        assert!(a.is_loopback() && b.is_loopback());
    }
}
