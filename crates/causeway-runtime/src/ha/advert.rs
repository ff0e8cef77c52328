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
/// grow; a new boot is believed only once the old one has gone quiet (a
/// replayed advert of an old boot cannot interrupt a live one).
#[derive(Debug, Default)]
pub struct ReplayGuard {
    last: Option<(u64, u64)>,
}

/// What the guard makes of an advert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Newer than any accepted: believe it.
    New,
    /// The advert accepted last, arriving again by the other path (each is
    /// sent on the peer link and on the VLAN): it says that path works, and
    /// nothing new.
    Copy,
    /// Older, or of an older boot while that boot is heard.
    Replay,
}

impl ReplayGuard {
    /// [`ReplayGuard::accept`], telling a second copy of the newest advert
    /// from a replay.
    pub fn see(&mut self, advert: &Advert, old_boot_quiet: bool) -> Seen {
        if self.last == Some((advert.boot, advert.seq)) {
            return Seen::Copy;
        }
        if self.accept(advert, old_boot_quiet) {
            Seen::New
        } else {
            Seen::Replay
        }
    }

    /// Whether to accept `advert`; `old_boot_quiet` says the boot last heard
    /// has been silent for the dead interval.
    pub fn accept(&mut self, advert: &Advert, old_boot_quiet: bool) -> bool {
        let fresh = match self.last {
            None => true,
            Some((boot, seq)) if boot == advert.boot => advert.seq > seq,
            Some(_) => old_boot_quiet,
        };
        if fresh {
            self.last = Some((advert.boot, advert.seq));
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

    #[test]
    fn replays_and_a_stale_boot_are_refused() {
        let mut g = ReplayGuard::default();
        assert!(g.accept(&advert(5), false));
        assert!(!g.accept(&advert(5), false));
        assert!(!g.accept(&advert(4), false));
        assert!(g.accept(&advert(6), false));
        let reboot = Advert {
            boot: 8,
            seq: 1,
            ..advert(1)
        };
        assert!(!g.accept(&reboot, false));
        assert!(g.accept(&reboot, true));
    }

    #[test]
    fn the_copy_by_the_other_path_is_told_from_a_replay() {
        let mut g = ReplayGuard::default();
        assert_eq!(g.see(&advert(5), false), Seen::New);
        assert_eq!(g.see(&advert(5), false), Seen::Copy);
        assert_eq!(g.see(&advert(4), false), Seen::Replay);
        assert_eq!(g.see(&advert(6), false), Seen::New);
        assert_eq!(g.see(&advert(5), false), Seen::Replay);
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
