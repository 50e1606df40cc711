#![no_main]
//! cargo-fuzz target `ioclass_csv`: see `tiercache_fuzzing::ioclass_csv`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = tiercache_fuzzing::ioclass_csv(data);
});
