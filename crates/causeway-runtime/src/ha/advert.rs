//! The adverts two replicas send each other: who they are, whether they
//! hold the addresses, whether they hear the other, and whether their lease
//! log is complete. Each is authenticated with HMAC-SHA256 under the key
//! both share, and carries the sender's boot number and a sequence number so
//! a copy replayed later is refused.

use ring::hmac;
use serde::{Deserialize, Serialize};

/// Bytes of the tag after the JSON body.
const TAG: usize = 32;
/// No honest advert comes near this; anything longer is refused unread.
pub const MAX_ADVERT: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Advert {
    pub node: String,
    /// Random per process start: a new boot restarts `seq`.
    pub boot: u64,
    pub seq: u64,
    pub priority: u8,
    pub active: bool,
    pub hears_peer: bool,
    pub in_sync: bool,
    /// The takeover the sender holds (or last held) the addresses by.
    pub term: u64,
    /// The boot and number of the newest advert heard from the peer, so
    /// the peer knows when it was last heard (absent from older builds).
    #[serde(default)]
    pub echo: Option<(u64, u64)>,
    /// Whether the sender preempts a lower-priority active.
    #[serde(default)]
    pub preempt: bool,
    /// The sender's wall clock, unix milliseconds: a replica that takes
    /// over reads lease times its peer wrote by the peer's clock.
    #[serde(default)]
    pub wall_ms: u64,
    /// The sender's leg on the clients' VLAN has carrier (builds that do
    /// not say are taken as up).
    #[serde(default = "carrier_unknown_is_up")]
    pub leg_up: bool,
}

fn carrier_unknown_is_up() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertError {
    #[error("advert of {0} bytes: too short for its tag or longer than {MAX_ADVERT}")]
    Size(usize),
    #[error("advert tag does not match: a different key, or forged")]
    Tag,
    #[error("advert body is not an advert: {0}")]
    Body(String),
}

pub struct AdvertKey(hmac::Key);

impl AdvertKey {
    pub fn new(secret: &[u8]) -> AdvertKey {
        AdvertKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    pub fn seal(&self, advert: &Advert) -> Vec<u8> {
        // A struct of plain fields always serializes.
        let mut out = serde_json::to_vec(advert).unwrap_or_default();
        let tag = hmac::sign(&self.0, &out);
        out.extend_from_slice(tag.as_ref());
        out
    }

    pub fn open(&self, bytes: &[u8]) -> Result<Advert, AdvertError> {
        if bytes.len() <= TAG || bytes.len() > MAX_ADVERT {
            return Err(AdvertError::Size(bytes.len()));
        }
        let (body, tag) = bytes.split_at(bytes.len() - TAG);
        hmac::verify(&self.0, body, tag).map_err(|_| AdvertError::Tag)?;
        serde_json::from_slice(body).map_err(|e| AdvertError::Body(e.to_string()))
    }

    /// A tag over `challenge`, proving the key without sending it (the
    /// lease stream's handshake).
    pub fn prove(&self, challenge: &[u8]) -> [u8; TAG] {
        let mut out = [0u8; TAG];
        out.copy_from_slice(hmac::sign(&self.0, challenge).as_ref());
        out
    }

    pub fn check(&self, challenge: &[u8], proof: &[u8]) -> bool {
        hmac::verify(&self.0, challenge, proof).is_ok()
    }
}

/// Refuses replays: within one boot of the peer, sequence numbers only
/// grow; another boot is believed once the boot heard last has gone quiet
/// for the dead interval, unless it is one this replica heard before and
/// saw replaced (a recording of it), or its advert echoes an advert of an
/// earlier process of this replica (a recording made before this process
/// started). A new boot that has not heard this replica at all (no echo:
/// the link this way may be down) is believed, so a restarted peer is
/// never shut out.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    last: Option<(u64, u64)>,
    /// Boots heard before and replaced by a newer one, newest last.
    retired: std::collections::VecDeque<u64>,
}

/// How many replaced boots the guard remembers: restarts of the peer over
/// this process's life, far more than a pair sees between upgrades.
const RETIRED_KEPT: usize = 64;

/// What the guard makes of an advert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Newer than any accepted: believe it.
    New,
    /// The advert accepted last, arriving again by the other path (each is
    /// sent on the peer link and on the VLAN): it says that path works, and
    /// nothing new.
    Copy,
    /// Older, or of another boot that may be a recording.
    Replay,
}

/// What the driver knows about an advert of a boot other than the one
/// heard last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtherBoot {
    /// The boot heard last has been silent for the dead interval.
    pub last_quiet: bool,
    /// The advert echoes an advert of another process of this replica:
    /// it was made before this process started.
    pub echoes_an_earlier_process: bool,
}

impl ReplayGuard {
    /// [`ReplayGuard::accept`], telling a second copy of the newest advert
    /// from a replay.
    pub fn see(&mut self, boot: u64, seq: u64, other: OtherBoot) -> Seen {
        if self.last == Some((boot, seq)) {
            return Seen::Copy;
        }
        if self.accept(boot, seq, other) {
            Seen::New
        } else {
            Seen::Replay
        }
    }

    /// Whether to accept advert `seq` of `boot`.
    pub fn accept(&mut self, boot: u64, seq: u64, other: OtherBoot) -> bool {
        let fresh = match self.last {
            None => true,
            Some((last_boot, last_seq)) if last_boot == boot => seq > last_seq,
            Some(_) => {
                other.last_quiet
                    && !other.echoes_an_earlier_process
                    && !self.retired.contains(&boot)
            }
        };
        if fresh {
            if let Some((last_boot, _)) = self.last.filter(|(b, _)| *b != boot) {
                if self.retired.len() == RETIRED_KEPT {
                    self.retired.pop_front();
                }
                self.retired.push_back(last_boot);
            }
            self.last = Some((boot, seq));
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(seq: u64) -> Advert {
        Advert {
            node: "a".into(),
            boot: 7,
            seq,
            priority: 100,
            active: true,
            hears_peer: true,
            in_sync: true,
            term: 1,
            echo: Some((3, 9)),
            preempt: false,
            wall_ms: 1_700_000_000_000,
            leg_up: true,
        }
    }

    #[test]
    fn a_sealed_advert_opens_under_the_same_key_only() {
        let key = AdvertKey::new(b"0123456789abcdef");
        let sealed = key.seal(&advert(1));
        assert_eq!(key.open(&sealed), Ok(advert(1)));
        let other = AdvertKey::new(b"0123456789abcdeX");
        assert_eq!(other.open(&sealed), Err(AdvertError::Tag));
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert_eq!(key.open(&flipped), Err(AdvertError::Tag));
        assert!(matches!(
            key.open(&sealed[..10]),
            Err(AdvertError::Size(10))
        ));
        assert!(matches!(
            key.open(&vec![b'x'; MAX_ADVERT + 1]),
            Err(AdvertError::Size(_))
        ));
    }

    const LIVE: OtherBoot = OtherBoot {
        last_quiet: true,
        echoes_an_earlier_process: false,
    };

    #[test]
    fn replays_and_a_stale_boot_are_refused() {
        let mut g = ReplayGuard::default();
        let speaking = OtherBoot {
            last_quiet: false,
            ..LIVE
        };
        assert!(g.accept(7, 5, speaking));
        assert!(!g.accept(7, 5, LIVE));
        assert!(!g.accept(7, 4, LIVE));
        assert!(g.accept(7, 6, speaking));
        // A new boot while the old one still speaks: refused.
        assert!(!g.accept(8, 1, speaking));
        assert!(g.accept(8, 1, LIVE));
    }

    /// A recorded advert of an earlier boot, replayed once the live boot
    /// fell silent: refused, where it used to pass as soon as the peer
    /// was quiet.
    #[test]
    fn an_old_boots_advert_replayed_while_the_peer_is_silent_is_refused() {
        let mut g = ReplayGuard::default();
        assert!(g.accept(7, 40, LIVE));
        assert!(g.accept(8, 1, LIVE));
        assert_eq!(g.see(7, 41, LIVE), Seen::Replay);
        assert_eq!(g.see(7, 99, LIVE), Seen::Replay);
        // A recording from before this process started echoes that
        // process's adverts: refused too.
        let recorded = OtherBoot {
            echoes_an_earlier_process: true,
            ..LIVE
        };
        assert_eq!(g.see(5, 3, recorded), Seen::Replay);
        // The live boot, heard again, is still believed.
        assert_eq!(g.see(8, 2, LIVE), Seen::New);
    }

    /// A peer that restarts while it cannot hear this replica echoes
    /// nothing; it is believed once its old boot is quiet, so the pair
    /// sees one active rather than two.
    #[test]
    fn a_restarted_peer_that_cannot_hear_us_is_believed() {
        let mut g = ReplayGuard::default();
        assert!(g.accept(7, 40, LIVE));
        assert_eq!(g.see(9, 1, LIVE), Seen::New);
        // And a third restart after that, as often as it happens.
        assert_eq!(g.see(10, 1, LIVE), Seen::New);
        assert_eq!(g.see(9, 2, LIVE), Seen::Replay);
    }

    #[test]
    fn the_copy_by_the_other_path_is_told_from_a_replay() {
        let mut g = ReplayGuard::default();
        assert_eq!(g.see(7, 5, LIVE), Seen::New);
        assert_eq!(g.see(7, 5, LIVE), Seen::Copy);
        assert_eq!(g.see(7, 4, LIVE), Seen::Replay);
        assert_eq!(g.see(7, 6, LIVE), Seen::New);
        assert_eq!(g.see(7, 5, LIVE), Seen::Replay);
    }

    #[test]
    fn an_advert_of_an_older_build_is_taken_as_having_carrier() {
        let key = AdvertKey::new(b"0123456789abcdef");
        let mut body = serde_json::to_value(advert(1)).unwrap();
        body.as_object_mut().unwrap().remove("legUp");
        let mut bytes = serde_json::to_vec(&body).unwrap();
        bytes.extend_from_slice(hmac::sign(&key.0, &bytes).as_ref());
        assert!(key.open(&bytes).unwrap().leg_up);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_open_or_panic(bytes in proptest::collection::vec(0u8..=255, 0..2048)) {
            let key = AdvertKey::new(b"0123456789abcdef");
            proptest::prop_assert!(key.open(&bytes).is_err());
        }
    }
}
