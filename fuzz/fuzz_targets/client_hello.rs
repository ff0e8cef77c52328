//! Arbitrary bytes through the proxy's ClientHello/SNI reader, whole and
//! cut at every length a peek could see.
#![no_main]

use causeway_proxy::hello::peek;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peek(data);
    if data.len() < 512 {
        for cut in 0..data.len() {
            let _ = peek(&data[..cut]);
        }
    }
});
