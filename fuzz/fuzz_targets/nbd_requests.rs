#![no_main]
//! cargo-fuzz target `nbd_requests`: see `tiercache_fuzzing::nbd_requests`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::nbd_requests(data);
});
