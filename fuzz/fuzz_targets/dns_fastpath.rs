//! The DNS fast-path reader against the full parser: whatever the fast
//! path reads, the full parser must read too and file under the same cache
//! key, or the two paths would serve different answers for one query.
#![no_main]

use causeway_dns::{fastpath, message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut key = Vec::new();
    let Some(q) = fastpath::read(data, &mut key) else {
        return;
    };
    assert!((12..=data.len()).contains(&q.question_end));
    assert!(key.len() > fastpath::KEY_PREFIX);
    assert!(key.len() <= fastpath::KEY_PREFIX + fastpath::MAX_NAME);
    let parsed = match message::parse(data) {
        Ok(p) => p,
        Err(e) => panic!("the fast path read a query the full parser refuses: {e:?}"),
    };
    assert_eq!(
        fastpath::key_of(&parsed),
        key,
        "the two paths file one query under two keys"
    );
    let mut response = data.to_vec();
    assert!(fastpath::patch(&mut response, &q, data));
});
