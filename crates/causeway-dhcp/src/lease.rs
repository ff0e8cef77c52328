//! A lease as the engine holds it, and the record form the store keeps.

use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use crate::client::{hex, ClientKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseState {
    /// Offered, held for the offer timeout; never written to disk.
    Offered,
    Active,
    /// Released by the client: free, but remembered so the client gets it back.
    Released,
    /// Declined by a client (address conflict): quarantined until it expires.
    Declined,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub ip: Ipv4Addr,
    pub client: ClientKey,
    pub hw: [u8; 6],
    pub state: LeaseState,
    /// Unix seconds.
    pub expires: u64,
    pub hostname: Option<Box<str>>,
}

impl Lease {
    /// Whether the address is still held by this lease at `now`.
    pub fn holds(&self, now: u64) -> bool {
        match self.state {
            LeaseState::Offered | LeaseState::Active | LeaseState::Declined => self.expires > now,
            LeaseState::Released => false,
        }
    }

    pub fn to_record(&self) -> LeaseRecord {
        LeaseRecord {
            ip: IpAddr::V4(self.ip),
            client: self.client.to_hex(),
            hw: hex(&self.hw),
            state: self.state,
            expires: self.expires,
            hostname: self.hostname.as_deref().map(str::to_string),
            term: 0,
        }
    }

    /// `None` for a record that is not a v4 lease (a DHCPv6 one, which
    /// [`crate::lease6`] keeps) or whose client id is not hex.
    pub fn from_record(r: &LeaseRecord) -> Option<Lease> {
        let IpAddr::V4(ip) = r.ip else { return None };
        let client = causeway_config::parse_hex(&r.client)?;
        let hw = causeway_config::parse_mac(&r.hw).unwrap_or([0; 6]);
        Some(Lease {
            ip,
            client: ClientKey::new(&client),
            hw,
            state: r.state,
            expires: r.expires,
            hostname: r.hostname.as_deref().map(Into::into),
        })
    }
}

/// One line of the lease log, and one entry of `causeway leases --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// A v4 lease's address, or a DHCPv6 lease's (a record kind of its
    /// own in the same log: its client is the IAID and DUID).
    pub ip: IpAddr,
    pub client: String,
    pub hw: String,
    pub state: LeaseState,
    pub expires: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Under high availability, the takeover (election term) of the active
    /// that wrote it: when two replicas' logs disagree about an address,
    /// the later takeover's record is the newer. 0 when written alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Told of every lease change once it is durable (the server), or as the
/// lease stream delivers it (a standby): how DNS learns DHCP names.
pub type LeaseObserver = std::sync::Arc<dyn Fn(&LeaseRecord) + Send + Sync>;
