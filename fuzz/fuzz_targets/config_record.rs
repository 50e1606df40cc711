#![no_main]
//! cargo-fuzz target `config_record`: see `tiercache_fuzzing::config_record`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::config_record(data);
});
