//! Which address each client last held or was offered.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::Ipv4Addr;

use crate::client::ClientKey;

/// Keyed by a 64-bit hash of the client's identity rather than the identity
/// itself: with 100,000 leases that halves the index. Two clients sharing a
/// hash (odds about 1 in 10^9 at that size) only cost one of them its sticky
/// address, because every use checks the lease table for who holds the
/// address.
#[derive(Default)]
pub struct ClientIndex {
    hasher: RandomState,
    map: HashMap<u64, Ipv4Addr>,
}

impl ClientIndex {
    fn hash(&self, key: &ClientKey) -> u64 {
        self.hasher.hash_one(key)
    }

    pub fn get(&self, key: &ClientKey) -> Option<Ipv4Addr> {
        self.map.get(&self.hash(key)).copied()
    }

    /// Returns the client's previous address.
    pub fn insert(&mut self, key: &ClientKey, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        let h = self.hash(key);
        self.map.insert(h, ip)
    }

    pub fn remove(&mut self, key: &ClientKey) {
        let h = self.hash(key);
        self.map.remove(&h);
    }
}
