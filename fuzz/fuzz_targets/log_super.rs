#![no_main]
//! cargo-fuzz target `log_super`: see `tiercache_fuzzing::log_super`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::log_super(data);
});
