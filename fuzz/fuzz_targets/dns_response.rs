//! Upstream responses shaped into cache entries: any bytes an upstream
//! sends must be walked without panicking, and a response the cache takes
//! must come back whole, with the budget kept.
#![no_main]

use std::time::Duration;

use causeway_config::CacheConfig;
use causeway_dns::cache::{shape, Cache, Hit};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000;
const MAX_BYTES: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let _ = shape(data);
    let cache = Cache::new(CacheConfig {
        max_entries: 16,
        max_bytes: MAX_BYTES,
        max_entry_bytes: 8 * 1024,
        max_ttl: Duration::from_secs(3600),
        max_negative_ttl: Duration::from_secs(300),
        serve_stale: true,
    });
    let Some(ttl) = cache.insert(b"\x00\x01\x00\x01\x00\x03api\x00".to_vec(), data, NOW) else {
        return;
    };
    assert!(data.len() <= 8 * 1024, "an oversized response was cached");
    assert!(cache.bytes() <= MAX_BYTES);
    if ttl > 0 {
        match cache.get(b"\x00\x01\x00\x01\x00\x03api\x00", NOW, false) {
            Hit::Fresh(wire) => assert_eq!(wire.len(), data.len()),
            _ => panic!("a response stored for {ttl} s was not there at once"),
        }
    }
});
