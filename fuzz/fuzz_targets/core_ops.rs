#![no_main]
//! cargo-fuzz target `core_ops`: see `tiercache_fuzzing::core_ops`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::core_ops(data);
});
