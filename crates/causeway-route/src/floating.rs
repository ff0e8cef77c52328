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
}

impl FloatingAddresses {
    /// Must run inside a tokio runtime (the netlink connection is a task).
    pub fn new(interface: &str, addresses: Vec<Ipv4Net>) -> Result<Self, FloatingError> {
        Ok(FloatingAddresses {
            kernel: Kernel::connect().map_err(FloatingError::Connect)?,
            interface: interface.to_string(),
            addresses,
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
            tokio::spawn(async move {
                let mut waited = Duration::ZERO;
                for at in REANNOUNCE {
                    tokio::time::sleep(at - waited).await;
                    waited = at;
                    announce_all(index, mac, &ips);
                }
            });
        }
        Ok(())
    }

    /// Removes every address; those not there are gone already.
    pub async fn release(&self) -> Result<(), FloatingError> {
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
}
