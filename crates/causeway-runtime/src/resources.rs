//! Telling our own exhaustion from a peer's fault.

use std::io;

/// Whether `e` says this process ran out of something of its own (file
/// descriptors, the system's file table, buffer memory, memory, local
/// ports, room in a kernel table such as an epoll set's) rather than that
/// the peer or the path failed. Such a failure must
/// never count against an upstream, and retrying at once only spins.
pub fn local_resources_exhausted(e: &io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL, EADDRINUSE (no free
    // port for a bind to port 0), ENOSPC (epoll's max_user_watches)
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12 | 99 | 98 | 28))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_and_port_exhaustion_are_ours_a_refusal_is_not() {
        for errno in [24, 23, 105, 12, 99, 98, 28] {
            assert!(local_resources_exhausted(&io::Error::from_raw_os_error(
                errno
            )));
        }
        // ECONNREFUSED, ECONNABORTED, ETIMEDOUT
        for errno in [111, 103, 110] {
            assert!(!local_resources_exhausted(&io::Error::from_raw_os_error(
                errno
            )));
        }
    }
}
