#![no_main]
//! cargo-fuzz target `record`: see `tiercache_fuzzing::record`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::record(data);
});
