//! Address pools as occupancy bitmaps, so finding a free address is a scan
//! of words, not of addresses, even in a nearly full /16.

use std::net::Ipv4Addr;

use causeway_config::AddressRange;

#[derive(Debug, Clone)]
pub struct Pool {
    pub range: AddressRange,
    /// One bit per address: set when the address cannot be handed out
    /// (leased, offered, declined, reserved or excluded).
    occupied: Vec<u64>,
    /// Where the next scan starts: next-fit spreads addresses out and keeps
    /// a recently freed address with its old client for longer.
    cursor: u32,
}

impl Pool {
    pub fn new(range: AddressRange) -> Self {
        let len = range.len();
        let words = len.div_ceil(64) as usize;
        let mut occupied = vec![0u64; words];
        // Bits past the end of the range are never free.
        let tail = (len % 64) as u32;
        if tail != 0 {
            if let Some(last) = occupied.last_mut() {
                *last = !0u64 << tail;
            }
        }
        Pool {
            range,
            occupied,
            cursor: 0,
        }
    }

    fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        self.range
            .contains(ip)
            .then(|| u32::from(ip) - u32::from(self.range.start))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.range.contains(ip)
    }

    pub fn set(&mut self, ip: Ipv4Addr, occupied: bool) {
        if let Some(off) = self.offset(ip) {
            let (w, b) = ((off / 64) as usize, off % 64);
            if let Some(word) = self.occupied.get_mut(w) {
                if occupied {
                    *word |= 1 << b;
                } else {
                    *word &= !(1 << b);
                }
            }
        }
    }

    pub fn is_occupied(&self, ip: Ipv4Addr) -> bool {
        self.offset(ip)
            .and_then(|off| {
                self.occupied
                    .get((off / 64) as usize)
                    .map(|w| w >> (off % 64) & 1 == 1)
            })
            .unwrap_or(true)
    }

    /// The next address whose bit is clear, starting at the cursor and
    /// wrapping once. Does not mark it: the caller decides.
    pub fn next_free(&mut self) -> Option<Ipv4Addr> {
        let words = self.occupied.len();
        if words == 0 {
            return None;
        }
        let start_word = (self.cursor / 64) as usize % words;
        for step in 0..=words {
            let w = (start_word + step) % words;
            let mut free = !self.occupied[w];
            if step == 0 {
                // Skip bits before the cursor in the first word; they are
                // visited again at the end of the wrap.
                free &= !0u64 << (self.cursor % 64);
            }
            if free != 0 {
                let off = (w as u32) * 64 + free.trailing_zeros();
                self.cursor = off.wrapping_add(1);
                return Some(Ipv4Addr::from(u32::from(self.range.start) + off));
            }
        }
        None
    }

    /// How many addresses the bitmap has room for.
    pub fn capacity(&self) -> usize {
        self.occupied.len() * 64
    }

    pub fn occupied_count(&self) -> u64 {
        let raw: u64 = self
            .occupied
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        let padding = self.occupied.len() as u64 * 64 - self.range.len();
        raw - padding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(start: [u8; 4], end: [u8; 4]) -> Pool {
        Pool::new(AddressRange {
            start: start.into(),
            end: end.into(),
        })
    }

    #[test]
    fn hands_out_every_address_once_then_none() {
        let mut p = pool([10, 0, 0, 1], [10, 0, 0, 70]);
        let mut seen = std::collections::HashSet::new();
        while let Some(ip) = p.next_free() {
            assert!(p.contains(ip));
            assert!(seen.insert(ip), "{ip} twice");
            p.set(ip, true);
        }
        assert_eq!(seen.len(), 70);
        assert_eq!(p.occupied_count(), 70);
        p.set(Ipv4Addr::new(10, 0, 0, 5), false);
        assert_eq!(p.next_free(), Some(Ipv4Addr::new(10, 0, 0, 5)));
    }

    #[test]
    fn out_of_range_addresses_are_never_free() {
        let p = pool([10, 0, 0, 1], [10, 0, 0, 1]);
        assert!(p.is_occupied(Ipv4Addr::new(10, 0, 0, 2)));
        assert!(!p.is_occupied(Ipv4Addr::new(10, 0, 0, 1)));
    }
}
