#![no_main]
//! cargo-fuzz target `nbd_options`: see `tiercache_fuzzing::nbd_options`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::nbd_options(data);
});
