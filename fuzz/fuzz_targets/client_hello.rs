//! Arbitrary bytes through the proxy's ClientHello/SNI reader, whole and
//! cut at every length a peek could see; fed a byte at a time, the
//! incremental reader must answer as a read of all the bytes at once does.
#![no_main]

use causeway_proxy::hello::{peek, HelloReader, Peek};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peek(data);
    if data.len() < 512 {
        let mut reader = HelloReader::default();
        let mut answered = false;
        for cut in 0..data.len() {
            let whole = peek(&data[..cut]);
            if !answered {
                let fed = reader.feed(&data[..cut]);
                assert_eq!(fed, whole, "at {cut}");
                answered = fed != Peek::NeedMore;
            }
        }
    }
});
