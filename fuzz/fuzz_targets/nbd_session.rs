#![no_main]
//! cargo-fuzz target `nbd_session`: see `tiercache_fuzzing::nbd_session`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::nbd_session(data);
});
