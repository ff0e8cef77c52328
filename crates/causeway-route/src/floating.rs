//! The service addresses that move between two replicas: added to the
//! VLAN interface by the replica that becomes active (then announced with
//! gratuitous ARP), removed by the one that stands down. Policy routing
//! follows by itself: it watches address events and adds the `from
//! <address>` rule for what appears.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::Ipv4Net;

use crate::netlink::{Kernel, NetlinkError};

/// Announcements after the first, for hosts that missed it (a frame lost,
/// a bridge port still learning).
const REANNOUNCE: [Duration; 2] = [Duration::from_millis(250), Duration::from_secs(1)];

#[derive(Debug, thiserror::Error)]
pub enum FloatingError {
    #[error("interface {0} not found")]
    NoInterface(String),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("netlink: {0}")]
    Connect(std::io::Error),
}

pub struct FloatingAddresses {
    kernel: Kernel,
    interface: String,
    addresses: Vec<Ipv4Net>,
    /// The announcements still to come after a take: a release cancels
    /// them, so a replica that gave the addresses up never announces them.
    reannounce: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

/// Announces again at each of [`REANNOUNCE`] after now, until aborted.
fn spawn_reannounce(announce: impl Fn() + Send + 'static) -> tokio::task::AbortHandle {
    tokio::spawn(async move {
        let mut waited = Duration::ZERO;
        for at in REANNOUNCE {
            tokio::time::sleep(at - waited).await;
            waited = at;
            announce();
        }
    })
    .abort_handle()
}

impl FloatingAddresses {
    /// Must run inside a tokio runtime (the netlink connection is a task).
    pub fn new(interface: &str, addresses: Vec<Ipv4Net>) -> Result<Self, FloatingError> {
        Ok(FloatingAddresses {
            kernel: Kernel::connect().map_err(FloatingError::Connect)?,
            interface: interface.to_string(),
            addresses,
            reannounce: std::sync::Mutex::new(None),
        })
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }

    async fn index_and_mac(&self) -> Result<(u32, Option<[u8; 6]>), FloatingError> {
        match self.kernel.link(&self.interface).await? {
            Some(link) => Ok((link.index, link.mac)),
            None => Err(FloatingError::NoInterface(self.interface.clone())),
        }
    }

    /// Adds every address and announces each.
    pub async fn take(&self) -> Result<(), FloatingError> {
        let (index, mac) = self.index_and_mac().await?;
        for net in &self.addresses {
            self.kernel.add_address(index, *net).await?;
        }
        if let Some(mac) = mac {
            let ips: Vec<_> = self.addresses.iter().map(|n| n.addr()).collect();
            announce_all(index, mac, &ips);
            let later = spawn_reannounce(move || announce_all(index, mac, &ips));
            let earlier = self
                .reannounce
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .replace(later);
            if let Some(earlier) = earlier {
                earlier.abort();
            }
        }
        Ok(())
    }

    fn cancel_reannounce(&self) {
        if let Some(pending) = self
            .reannounce
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            pending.abort();
        }
    }

    /// Removes every address; those not there are gone already.
    pub async fn release(&self) -> Result<(), FloatingError> {
        self.cancel_reannounce();
        let (index, _) = match self.index_and_mac().await {
            Ok(found) => found,
            // No interface, no address on it.
            Err(FloatingError::NoInterface(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        for net in &self.addresses {
            self.kernel.remove_address(index, *net).await?;
        }
        Ok(())
    }

    /// Which of the service addresses the interface holds now.
    pub async fn held(&self) -> Result<Vec<Ipv4Net>, FloatingError> {
        let (index, _) = self.index_and_mac().await?;
        let on = self.kernel.addresses(index).await?;
        Ok(self
            .addresses
            .iter()
            .filter(|n| on.iter().any(|o| o.addr() == n.addr()))
            .copied()
            .collect())
    }
}

fn announce_all(index: u32, mac: [u8; 6], ips: &[std::net::Ipv4Addr]) {
    for ip in ips {
        if let Err(e) = crate::garp::announce(index, mac, *ip) {
            tracing::warn!(address = %IpAddr::V4(*ip), error = %e, "gratuitous ARP not sent; hosts keep the old MAC until their ARP entry ages");
        }
    }
}

impl causeway_runtime::ha::Addresses for FloatingAddresses {
    async fn take(&self) -> Result<(), String> {
        FloatingAddresses::take(self)
            .await
            .map_err(|e| e.to_string())
    }

    async fn release(&self) -> Result<(), String> {
        FloatingAddresses::release(self)
            .await
            .map_err(|e| e.to_string())
    }

    async fn announce(&self) {
        match self.index_and_mac().await {
            Ok((index, Some(mac))) => {
                let ips: Vec<_> = self.addresses.iter().map(|n| n.addr()).collect();
                announce_all(index, mac, &ips);
            }
            Ok((_, None)) => {}
            Err(e) => tracing::warn!(error = %e, "service addresses not announced again"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A take then a release within a second: the replica that gave the
    /// address up must not announce it afterwards, or hosts move to it.
    #[tokio::test(start_paused = true)]
    async fn announcements_after_a_take_stop_at_the_release() {
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        let all = spawn_reannounce(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent.load(Ordering::Relaxed), REANNOUNCE.len());
        assert!(all.is_finished());
        sent.store(0, Ordering::Relaxed);
        let counter = sent.clone();
        let cut = spawn_reannounce(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        cut.abort();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            sent.load(Ordering::Relaxed),
            1,
            "announced after the release"
        );
    }
}
