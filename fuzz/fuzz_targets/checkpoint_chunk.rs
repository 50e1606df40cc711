#![no_main]
//! cargo-fuzz target `checkpoint_chunk`: see `tiercache_fuzzing::checkpoint_chunk`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::checkpoint_chunk(data);
});
