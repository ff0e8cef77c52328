//! Arbitrary text through config parsing and validation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = causeway_config::Config::from_yaml(text);
    }
});
