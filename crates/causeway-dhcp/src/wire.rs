//! Bytes to messages and back, with the checks dhcproto leaves to us.

use dhcproto::v4::Message;
use dhcproto::{Decodable, Decoder, Encodable};

/// Fixed BOOTP header (236 bytes) plus the magic cookie.
const HEADER_LEN: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];

/// Why a packet could not be read; each is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Malformed {
    #[error("shorter than the 240-byte DHCP header")]
    Truncated,
    #[error("no DHCP magic cookie")]
    BadMagic,
    #[error("hardware address length over 16")]
    BadHardwareLength,
    #[error("an option runs past the end of the packet")]
    OptionOverrun,
    #[error("an option value is invalid")]
    BadOption,
}

impl Malformed {
    pub fn label(self) -> &'static str {
        match self {
            Malformed::Truncated => "truncated",
            Malformed::BadMagic => "bad_magic",
            Malformed::BadHardwareLength => "bad_hardware_length",
            Malformed::OptionOverrun => "option_overrun",
            Malformed::BadOption => "bad_option",
        }
    }
}

pub fn decode(bytes: &[u8]) -> Result<Message, Malformed> {
    if bytes.len() < HEADER_LEN {
        return Err(Malformed::Truncated);
    }
    if bytes[236..240] != MAGIC {
        return Err(Malformed::BadMagic);
    }
    // dhcproto slices chaddr by hlen, so a larger hlen would panic later.
    if bytes[2] > 16 {
        return Err(Malformed::BadHardwareLength);
    }
    check_options(&bytes[HEADER_LEN..])?;
    Message::decode(&mut Decoder::new(bytes)).map_err(|e| match e {
        dhcproto::error::DecodeError::NotEnoughBytes => Malformed::OptionOverrun,
        _ => Malformed::BadOption,
    })
}

/// Walks the options as dhcproto will (RFC 3396: consecutive options with
/// the same code are one option) and refuses the lengths its decoder
/// asserts on, so that no packet can reach a panic there.
fn check_options(mut rest: &[u8]) -> Result<(), Malformed> {
    let mut run: Option<(u8, usize)> = None;
    while let Some((&code, tail)) = rest.split_first() {
        if code == 0 || code == 255 {
            if let Some((c, len)) = run.take() {
                check_length(c, len)?;
            }
            if code == 255 {
                break;
            }
            rest = tail;
            continue;
        }
        let Some((&len, value)) = tail.split_first() else {
            return Err(Malformed::OptionOverrun);
        };
        let len = usize::from(len);
        if value.len() < len {
            return Err(Malformed::OptionOverrun);
        }
        run = match run {
            Some((c, total)) if c == code => Some((c, total + len)),
            Some((c, total)) => {
                check_length(c, total)?;
                Some((code, len))
            }
            None => Some((code, len)),
        };
        rest = &value[len..];
    }
    if let Some((c, len)) = run {
        check_length(c, len)?;
    }
    Ok(())
}

fn check_length(code: u8, len: usize) -> Result<(), Malformed> {
    let ok = match code {
        80 => len == 0,
        81 => len >= 3,
        94 => len == 3,
        151 => len >= 1,
        152..=155 => len == 4,
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Malformed::BadOption)
    }
}

pub fn encode(msg: &mut Message) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    // dhcproto writes an absent sname or file as 64 and 128 zero bytes, a
    // function call for each: about a twentieth of the server's CPU under a
    // flood. Given as zero bytes they are copied in one go, the same bytes
    // on the wire; the message is left as it was.
    let (pad_sname, pad_fname) = (msg.sname().is_none(), msg.fname().is_none());
    if pad_sname {
        msg.set_sname(&[0; 64]);
    }
    if pad_fname {
        msg.set_fname(&[0; 128]);
    }
    let encoded = msg.to_vec();
    if pad_sname {
        msg.clear_sname();
    }
    if pad_fname {
        msg.clear_fname();
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::{DhcpOption, MessageType};

    fn discover() -> Vec<u8> {
        let mut m = Message::default();
        m.set_chaddr(&[0x52, 0x54, 0, 1, 2, 3]);
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Discover));
        m.opts_mut().insert(DhcpOption::Hostname("vm1".into()));
        encode(&mut m).unwrap()
    }

    #[test]
    fn the_padding_shortcut_encodes_the_bytes_dhcproto_does() {
        for text_len in [10usize, 200, 255] {
            for options in [1usize, 5, 7, 12] {
                let mut m = Message::default();
                m.set_chaddr(&[0x52, 0x54, 0, 1, 2, 3]);
                m.opts_mut()
                    .insert(DhcpOption::MessageType(MessageType::Offer));
                for i in 0..options {
                    // Distinct codes, so none replaces another.
                    m.opts_mut()
                        .insert(DhcpOption::Unknown(dhcproto::v4::UnknownOption::new(
                            dhcproto::v4::OptionCode::from(224 + i as u8),
                            vec![b'x'; text_len],
                        )));
                }
                let plain = m.to_vec().unwrap();
                let ours = encode(&mut m).unwrap();
                assert_eq!(ours, plain, "{options} options of {text_len} bytes");
                assert_eq!(
                    (m.sname(), m.fname()),
                    (None, None),
                    "the message was changed"
                );
            }
        }
    }

    #[test]
    fn truncated_packets_are_refused() {
        let bytes = discover();
        for len in [0, 1, 100, 239] {
            assert_eq!(decode(&bytes[..len]).unwrap_err(), Malformed::Truncated);
        }
    }

    #[test]
    fn an_option_overrunning_the_packet_is_refused() {
        let mut bytes = discover();
        // Cut inside the hostname option's value, keeping its length byte.
        let at = bytes.windows(2).position(|w| w == [12, 3]).unwrap();
        bytes.truncate(at + 3);
        assert_eq!(decode(&bytes).unwrap_err(), Malformed::OptionOverrun);
    }

    #[test]
    fn oversized_hardware_length_is_refused_not_a_panic() {
        let mut bytes = discover();
        bytes[2] = 200;
        assert_eq!(decode(&bytes).unwrap_err(), Malformed::BadHardwareLength);
    }

    #[test]
    fn option_lengths_the_decoder_cannot_take_are_refused() {
        let mut bytes = discover();
        let end = bytes.len() - 1;
        // Client FQDN (81) needs at least 3 bytes of flags and rcodes.
        bytes.splice(end..end, [81, 1, 0]);
        assert_eq!(decode(&bytes).unwrap_err(), Malformed::BadOption);
    }

    #[test]
    fn missing_magic_is_refused() {
        let mut bytes = discover();
        bytes[236] = 0;
        assert_eq!(decode(&bytes).unwrap_err(), Malformed::BadMagic);
    }
}
