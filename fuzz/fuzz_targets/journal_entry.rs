#![no_main]
//! cargo-fuzz target `journal_entry`: see `tiercache_fuzzing::journal_entry`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::journal_entry(data);
});
