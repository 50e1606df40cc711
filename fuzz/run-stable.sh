#!/usr/bin/env bash
# Runs one fuzz target under libFuzzer on *stable* Rust, without cargo-fuzz and without
# sanitizers (coverage instrumentation only; panics and overflow checks are the findings).
# With nightly Rust and cargo-fuzz, prefer `cargo fuzz run TARGET` (adds AddressSanitizer).
#
#   fuzz/run-stable.sh TARGET [SECONDS] [libFuzzer options...]
#
# Seeds fuzz/corpus/TARGET from the target's generator on first use; crashes go to
# fuzz/artifacts/TARGET/. Builds into ${CARGO_TARGET_DIR:-fuzz/target}/libfuzzer.
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run-stable.sh TARGET [SECONDS] [libFuzzer options...]}
secs=${2:-60}
shift $(($# < 2 ? $# : 2))
triple=$(rustc -vV | sed -n 's/^host: //p')
out=${CARGO_TARGET_DIR:-$PWD/target}/libfuzzer
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
    CARGO_TARGET_DIR=$out cargo build --release --target "$triple" --bin "$target"
if [ ! -d "corpus/$target" ]; then
    (cd .. && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo run -q -p tiercache-fuzzing \
        --example corpus -- fuzz/corpus 200 >/dev/null)
fi
mkdir -p "artifacts/$target"
exec "$out/$triple/release/$target" "corpus/$target" -max_total_time="$secs" \
    -artifact_prefix="artifacts/$target/" -print_final_stats=1 "$@"
