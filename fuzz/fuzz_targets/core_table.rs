#![no_main]
//! cargo-fuzz target `core_table`: see `tiercache_fuzzing::core_table`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::core_table(data);
});
