#![no_main]
//! cargo-fuzz target `log_header`: see `tiercache_fuzzing::log_header`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::log_header(data);
});
