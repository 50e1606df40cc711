#![no_main]
//! cargo-fuzz target `daemon_config`: see `tiercache_fuzzing::daemon_config`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::daemon_config(data);
});
