#![no_main]
//! cargo-fuzz target `superblock`: see `tiercache_fuzzing::superblock`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::superblock(data);
});
