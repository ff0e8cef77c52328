//! Who a client is: option 61 when it sends one, else its hardware address.

use std::fmt;
use std::hash::{Hash, Hasher};

/// Longest key kept inline; covers MACs and the DUID-based client-ids that
/// common clients send, so most keys cost no allocation.
const INLINE: usize = 22;

/// The identity a lease is bound to (RFC 2131 §4.2: client-id if present,
/// else `htype` followed by `chaddr`).
#[derive(Clone)]
pub enum ClientKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl ClientKey {
    pub fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE {
            let mut inline = [0u8; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            ClientKey::Inline {
                len: bytes.len() as u8,
                bytes: inline,
            }
        } else {
            ClientKey::Heap(bytes.into())
        }
    }

    /// The key of a client that sends no option 61.
    pub fn from_hardware(htype: u8, chaddr: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(chaddr.len() + 1);
        bytes.push(htype);
        bytes.extend_from_slice(chaddr);
        Self::new(&bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ClientKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            ClientKey::Heap(b) => b,
        }
    }

    pub fn to_hex(&self) -> String {
        hex(self.as_bytes())
    }
}

impl PartialEq for ClientKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ClientKey {}

impl Hash for ClientKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientKey({})", self.to_hex())
    }
}

/// Colon-separated lowercase hex, the form operators know from MACs.
pub fn hex(bytes: &[u8]) -> String {
    // Written for every lease record, twice: digits by table, not through
    // the formatter, which costs an allocation per byte.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_and_short_keys_compare_by_bytes() {
        let short = ClientKey::new(&[1, 2, 3]);
        assert_eq!(short, ClientKey::new(&[1, 2, 3]));
        assert_ne!(short, ClientKey::new(&[1, 2, 3, 0]));
        let long: Vec<u8> = (0..40).collect();
        assert_eq!(ClientKey::new(&long).as_bytes(), &long[..]);
        assert_eq!(
            ClientKey::from_hardware(1, &[0xaa, 0xbb]).to_hex(),
            "01:aa:bb"
        );
        assert_eq!(hex(&[0x00, 0x0f, 0xf0, 0xff, 0x5a]), "00:0f:f0:ff:5a");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn keys_stay_small() {
        assert!(std::mem::size_of::<ClientKey>() <= 24);
    }
}
