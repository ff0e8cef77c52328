//! How two replicas' lease logs come together again, and which free
//! addresses each may give out while they may be apart.
//!
//! A replica that acknowledges leases without a standby that confirms them
//! (its peer is gone, behind, or cut off) may be serving at the same time
//! as its peer: a stalled active that has not yet heard the takeover, a
//! restarted standby that cannot hear a live active, a partition. So that
//! two such replicas never give one address to two clients, each gives
//! *new* addresses only from its own share of the pool: the replica whose
//! name sorts first the even addresses, the other the odd ones. A client
//! keeps the address it already holds, whichever share it is in.
//!
//! When the two hear each other again, the standby sends the active its
//! whole log before it takes the active's snapshot, and the active adopts
//! what it lacks: so a lease one of them acknowledged alone is not lost
//! when the other's log becomes the pair's.

use std::net::IpAddr;

use crate::lease::{LeaseRecord, LeaseState};

/// Which half of the pool a replica gives new addresses from while alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// This replica's name sorts before its peer's: the even addresses.
    pub first: bool,
}

impl Share {
    pub fn of(name: &str, peer: &str) -> Share {
        Share { first: name < peer }
    }

    /// The halves are the even and the odd addresses, of either family.
    pub fn holds(self, ip: impl Into<IpAddr>) -> bool {
        let last = match ip.into() {
            IpAddr::V4(a) => a.octets()[3],
            IpAddr::V6(a) => a.octets()[15],
        };
        (last & 1 == 0) == self.first
    }
}

/// What the active does with one address of the standby's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// The active's own record stands (the same, newer, or the standby's
    /// holds nothing).
    Keep,
    /// The standby's record is the one that holds the address: written to
    /// the active's log and taken into its table.
    Adopt,
    /// Both hold the address for different clients and the active's record
    /// is from the same or a later takeover: it stands. Counted and logged.
    Conflict,
}

/// What the active holds for an address, as far as the rule needs it.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub client: &'a str,
    pub holds: bool,
    pub expires: u64,
    /// The takeover its record was written in.
    pub term: u64,
}

/// Whether a record holds its address at `now`.
pub fn record_holds(r: &LeaseRecord, now: u64) -> bool {
    matches!(r.state, LeaseState::Active | LeaseState::Declined) && r.expires > now
}

/// The rule for one address: `theirs` is the standby's newest record for
/// it, `ours` what the active holds.
///
/// Two replicas that served apart gave new addresses from different shares,
/// so they disagree about an address only where one of them wrote a record
/// outside its share (counting on a standby that did not confirm it, so it
/// was never acknowledged), or a stale active wrote one before it heard the
/// takeover (the older term). A record's term says which replica wrote it:
/// the replica whose name sorts first takes even terms.
pub fn judge(ours: Option<Held<'_>>, theirs: &LeaseRecord, now: u64) -> Judgement {
    if !record_holds(theirs, now) {
        return Judgement::Keep;
    }
    match ours {
        None => Judgement::Adopt,
        Some(o) if !o.holds => Judgement::Adopt,
        Some(o) if o.client == theirs.client => {
            if theirs.expires > o.expires {
                // Renewed on the other side while apart.
                Judgement::Adopt
            } else {
                Judgement::Keep
            }
        }
        Some(o) => {
            // The replica whose share holds the address wrote one of them:
            // the other replica could have given it out only counting on a
            // standby's confirmation, which it evidently did not get.
            let owner = Share { first: true }.holds(theirs.ip);
            let by_owner = |term: u64| term != 0 && term.is_multiple_of(2) == owner;
            match (by_owner(theirs.term), by_owner(o.term)) {
                (true, false) => Judgement::Adopt,
                (false, true) => Judgement::Conflict,
                // Otherwise the later takeover's: the other is one a stale
                // active wrote (and never acknowledged, its role being gone).
                _ if theirs.term > o.term => Judgement::Adopt,
                _ => Judgement::Conflict,
            }
        }
    }
}

/// The newest record for each address in a log, in address order.
pub fn newest(records: &[LeaseRecord]) -> Vec<&LeaseRecord> {
    let mut by_ip: std::collections::BTreeMap<IpAddr, &LeaseRecord> = Default::default();
    for r in records {
        by_ip.insert(r.ip, r);
    }
    by_ip.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ip: [u8; 4], client: &str, state: LeaseState, expires: u64) -> LeaseRecord {
        LeaseRecord {
            ip: std::net::Ipv4Addr::from(ip).into(),
            client: client.into(),
            hw: "00:00:00:00:00:01".into(),
            state,
            expires,
            hostname: None,
            term: 0,
        }
    }

    #[test]
    fn the_two_shares_split_every_address_between_the_replicas() {
        let (a, b) = (Share::of("a", "b"), Share::of("b", "a"));
        assert!(a.first && !b.first);
        for n in 0..1024u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + n);
            assert!(a.holds(ip) != b.holds(ip), "{ip} in both shares or neither");
        }
    }

    #[test]
    fn the_standby_s_lease_is_adopted_unless_the_active_holds_the_address_for_another() {
        let now = 1000;
        let theirs = record([10, 0, 0, 5], "01", LeaseState::Active, 2000);
        assert_eq!(judge(None, &theirs, now), Judgement::Adopt);
        let freed = Held {
            client: "02",
            holds: false,
            expires: 900,
            term: 0,
        };
        assert_eq!(judge(Some(freed), &theirs, now), Judgement::Adopt);
        let older = Held {
            client: "01",
            holds: true,
            expires: 1500,
            term: 0,
        };
        assert_eq!(judge(Some(older), &theirs, now), Judgement::Adopt);
        let newer = Held {
            client: "01",
            holds: true,
            expires: 2500,
            term: 0,
        };
        assert_eq!(judge(Some(newer), &theirs, now), Judgement::Keep);
        let other = Held {
            client: "02",
            holds: true,
            expires: 2500,
            term: 0,
        };
        assert_eq!(judge(Some(other), &theirs, now), Judgement::Conflict);
        // 10.0.0.5 is odd: the second replica's share, odd terms.
        let stale = Held { term: 3, ..other };
        let later = LeaseRecord {
            term: 5,
            ..theirs.clone()
        };
        assert_eq!(judge(Some(stale), &later, now), Judgement::Adopt);
        let earlier = LeaseRecord {
            term: 1,
            ..theirs.clone()
        };
        assert_eq!(judge(Some(stale), &earlier, now), Judgement::Conflict);
        // The share's owner wrote theirs; the other replica wrote ours at
        // a later term, counting on a confirmation it did not get.
        let owners = LeaseRecord {
            term: 7,
            ..theirs.clone()
        };
        let not_owners = Held { term: 8, ..other };
        assert_eq!(judge(Some(not_owners), &owners, now), Judgement::Adopt);
        let owners_ours = Held { term: 7, ..other };
        let not_owners_theirs = LeaseRecord {
            term: 8,
            ..theirs.clone()
        };
        assert_eq!(
            judge(Some(owners_ours), &not_owners_theirs, now),
            Judgement::Conflict
        );
        let released = record([10, 0, 0, 5], "01", LeaseState::Released, 2000);
        assert_eq!(judge(None, &released, now), Judgement::Keep);
        let expired = record([10, 0, 0, 5], "01", LeaseState::Active, 999);
        assert_eq!(judge(None, &expired, now), Judgement::Keep);
    }

    #[test]
    fn only_the_newest_record_of_an_address_counts() {
        let log = vec![
            record([10, 0, 0, 5], "01", LeaseState::Active, 2000),
            record([10, 0, 0, 6], "02", LeaseState::Active, 2000),
            record([10, 0, 0, 5], "01", LeaseState::Released, 2000),
        ];
        let got = newest(&log);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].state, LeaseState::Released);
        assert_eq!(got[1].client, "02");
    }
}
