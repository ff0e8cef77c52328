//! One shutdown signal for every task, and the signals that raise it.
//!
//! The signal is tokio-util's [`CancellationToken`]: the binary holds one,
//! every service gets a clone, and a task selects on
//! [`CancellationToken::cancelled`] (threads outside the runtime poll
//! [`CancellationToken::is_cancelled`]). Cancelling it is the whole of
//! "stop accepting new work"; each service then finishes what it has in
//! flight in its [`crate::Service::stop`].

use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};
pub use tokio_util::sync::CancellationToken as Shutdown;

/// SIGTERM and SIGINT, installed once at start, so neither kills the
/// process outright while it drains.
pub struct StopSignals {
    term: Signal,
    int: Signal,
}

/// Installs the handlers for the signals that stop a causeway process.
pub fn signals() -> io::Result<StopSignals> {
    Ok(StopSignals {
        term: signal(SignalKind::terminate())?,
        int: signal(SignalKind::interrupt())?,
    })
}

impl StopSignals {
    /// Resolves at the next SIGTERM or SIGINT, with its name for the log.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_wakes_when_it_is_cancelled() {
        let stop = Shutdown::new();
        let waiter = stop.clone();
        let woken = tokio::spawn(async move { waiter.cancelled().await });
        assert!(!stop.is_cancelled());
        stop.cancel();
        woken.await.unwrap();
        assert!(stop.clone().is_cancelled());
    }

    #[tokio::test]
    async fn sigterm_is_received_and_named() {
        let mut stops = signals().unwrap();
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
        assert_eq!(stops.recv().await, "SIGTERM");
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGINT).unwrap();
        assert_eq!(stops.recv().await, "SIGINT");
    }
}
