//! The service addresses that move between two replicas: added to the
//! VLAN interface by the replica that becomes active (then announced with
//! gratuitous ARP), removed by the one that stands down. Policy routing
//! follows by itself: it watches address events and adds the `from
//! <address>` rule for what appears.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

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
    addresses_v6: Vec<Ipv6Net>,
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
            addresses_v6: Vec::new(),
            reannounce: std::sync::Mutex::new(None),
        })
    }

    /// The v6 service addresses, moved with the v4 ones and announced by
    /// unsolicited neighbour advertisements.
    pub fn with_v6(mut self, addresses: Vec<Ipv6Net>) -> Self {
        self.addresses_v6 = addresses;
        self
    }

    fn targets(&self) -> Targets {
        Targets {
            v4: self.addresses.iter().map(|n| n.addr()).collect(),
            v6: self.addresses_v6.iter().map(|n| n.addr()).collect(),
        }
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
        for net in &self.addresses_v6 {
            self.kernel.add_address_v6(index, *net).await?;
        }
        if let Some(mac) = mac {
            let targets = self.targets();
            announce_all(index, mac, &targets);
            let later = spawn_reannounce(move || announce_all(index, mac, &targets));
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
        for net in &self.addresses_v6 {
            self.kernel.remove_address_v6(index, *net).await?;
        }
        Ok(())
    }

    /// Which of the service addresses the interface holds now.
    pub async fn held(&self) -> Result<Vec<IpNet>, FloatingError> {
        let (index, _) = self.index_and_mac().await?;
        let on = self.kernel.addresses(index).await?;
        let mut held: Vec<IpNet> = self
            .addresses
            .iter()
            .filter(|n| on.iter().any(|o| o.addr() == n.addr()))
            .map(|n| IpNet::V4(*n))
            .collect();
        if !self.addresses_v6.is_empty() {
            let on = self.kernel.addresses_v6(index).await?;
            held.extend(
                self.addresses_v6
                    .iter()
                    .filter(|n| on.iter().any(|o| o.addr() == n.addr()))
                    .map(|n| IpNet::V6(*n)),
            );
        }
        Ok(held)
    }
}

/// What a take announces.
#[derive(Clone)]
struct Targets {
    v4: Vec<std::net::Ipv4Addr>,
    v6: Vec<std::net::Ipv6Addr>,
}

fn announce_all(index: u32, mac: [u8; 6], targets: &Targets) {
    for ip in &targets.v4 {
        if let Err(e) = crate::garp::announce(index, mac, *ip) {
            tracing::warn!(address = %IpAddr::V4(*ip), error = %e, "gratuitous ARP not sent; hosts keep the old MAC until their ARP entry ages");
        }
    }
    if !targets.v6.is_empty() {
        if let Err(e) = crate::na::announce(index, mac, &targets.v6) {
            tracing::warn!(addresses = ?targets.v6, error = %e, "neighbour advertisement not sent; hosts keep the old MAC until their neighbour entry is probed again");
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
            Ok((index, Some(mac))) => announce_all(index, mac, &self.targets()),
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
