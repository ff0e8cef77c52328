//! What the kernel says about a network interface, read from sysfs.

/// The interface's Ethernet address, as `/sys/class/net/<name>/address`
/// gives it; `None` for an interface without one (a tunnel, a dummy link
/// whose address is all zeros) or one that does not exist.
pub fn interface_mac(interface: &str) -> Option<[u8; 6]> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{interface}/address")).ok()?;
    parse_sysfs_mac(text.trim()).filter(|m| *m != [0; 6])
}

/// Six two-digit hex bytes separated by colons, sysfs's only form.
fn parse_sysfs_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next().filter(|p| p.len() == 2)?;
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_addresses_parse_and_anything_else_is_none() {
        assert_eq!(
            parse_sysfs_mac("02:00:00:00:0a:ff"),
            Some([2, 0, 0, 0, 0x0a, 0xff])
        );
        for bad in [
            "",
            "02:00:00:00:0a",
            "02:00:00:00:0a:ff:01",
            "2:0:0:0:a:f",
            "zz:00:00:00:00:00",
        ] {
            assert_eq!(parse_sysfs_mac(bad), None, "{bad:?}");
        }
        assert_eq!(interface_mac("lo"), None, "loopback's address is all zeros");
    }
}
