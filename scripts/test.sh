#!/usr/bin/env bash
# The whole test suite: what `.ci/run` runs and what a new user runs (README, "Run the tests").
# Installs what it needs if missing, runs lint, unit/property/model tests, and checks that every
# planted-bug canary is caught. Prints a closing "N passed, N failed" line.
set -euo pipefail
cd "$(dirname "$0")/.."

section() { printf '\n=== %s ===\n' "$*"; }
passed=0
failed=0
step() {
    local name=$1
    shift
    local t0=$SECONDS
    if "$@"; then
        passed=$((passed + 1))
        printf -- '--- ok: %s (%ds)\n' "$name" $((SECONDS - t0))
    else
        failed=$((failed + 1))
        printf -- '--- FAILED: %s (%ds)\n' "$name" $((SECONDS - t0))
    fi
}

section "toolchain"
cargo --version
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "cargo-nextest not found; installing it from crates.io (one-time, a few minutes)"
    cargo install --locked cargo-nextest
fi

section "packages"
# Real servers and clients the tests talk to: nbdkit and qemu-nbd (NBD backend conformance),
# nbdinfo/nbdcopy/nbdsh (libnbd), qemu-img and fio (NBD server interoperability, benchmarks).
need=()
command -v nbdkit >/dev/null 2>&1 || need+=(nbdkit)
command -v qemu-nbd >/dev/null 2>&1 || need+=(qemu-utils)
# libnbd-bin also brings nbdfuse: an export as a file where the kernel has no nbd module (the
# ceph-osd study's OSDs and the daemon-kill test under a live OSD need it).
command -v nbdinfo >/dev/null 2>&1 && command -v nbdfuse >/dev/null 2>&1 || need+=(libnbd-bin)
python3 -c 'import nbd' >/dev/null 2>&1 || need+=(python3-libnbd)
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# GnuTLS's certtool: the TLS key test's keys as GnuTLS users make them (cli/tests/tls.rs).
command -v certtool >/dev/null 2>&1 || need+=(gnutls-bin)
# A real single-node Ceph for the RBD core tests (scripts/ceph-cluster.sh, docs/CEPH.md): mon,
# OSD, mgr, the ceph/rbd CLIs, librbd/librados (opened at run time by tiercache; the -dev
# packages carry the headers its declarations follow) and python3-rbd (a second client).
command -v ceph-mon >/dev/null 2>&1 || need+=(ceph ceph-mon)
command -v ceph-osd >/dev/null 2>&1 || need+=(ceph-osd)
command -v ceph-mgr >/dev/null 2>&1 || need+=(ceph-mgr)
librbd_present() {
    local f
    for f in /usr/lib/*/librbd.so.1 /usr/lib64/librbd.so.1 /usr/lib/librbd.so.1; do
        [ -e "$f" ] && return 0
    done
    return 1
}
if [ ! -e /usr/include/rbd/librbd.h ] || ! librbd_present; then
    need+=(librbd-dev librados-dev)
fi
/usr/bin/python3 -c 'import rbd' >/dev/null 2>&1 || need+=(python3-rbd)
# prometheus_client's parser reads the daemon's whole /metrics exposition (cli/tests/metrics.rs).
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need+=(python3-prometheus-client)
# Debian's nbd-client: the block-device recipe's negotiation (cli/tests/nbd_client.rs).
command -v nbd-client >/dev/null 2>&1 || [ -x /usr/sbin/nbd-client ] || need+=(nbd-client)
# The aarch64 CRC32C path (format/src/crc.rs), cross-built and run under qemu-user.
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]} (Debian packages)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
        echo "could not install ${need[*]}: the tests that need them will say they skipped"
fi
command -v nbdkit qemu-nbd nbdinfo nbdcopy nbdsh qemu-img fio ceph-mon ceph-osd rbd || true

section "format and lint"
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy -D warnings" cargo clippy --workspace --all-targets -- -D warnings

section "build"
step "release build" cargo build --workspace --release

section "unit, property, model and semantics tests"
step "cargo nextest (workspace, strict asserts)" \
    cargo nextest run --workspace --cargo-profile test --features tiercache-core/strict-asserts --no-fail-fast

# nextest keeps a passing test's output to itself: the IO path each file backend chose (O_DIRECT
# or buffered, io_uring or pread/pwrite) is shown here, from the conformance suite run again.
io_paths() {
    local log=target/io-paths.log
    mkdir -p target
    cargo test -q -p tiercache-io --test conformance file_conformance_in -- --nocapture --test-threads 1 >"$log" 2>&1 ||
        { tail -30 "$log"; return 1; }
    grep -oE "IO path.*" "$log"
}
step "IO paths in use (file backend conformance, output shown)" io_paths

# The checksum code has a hardware path per CPU family: the aarch64 one (CRC extension) is
# cross-built and run under qemu-user against the table, as the x86-64 one runs natively above.
crc_aarch64() {
    local t=aarch64-unknown-linux-gnu
    if ! rustup target list --installed 2>/dev/null | grep -qx "$t"; then
        rustup target add "$t" >/dev/null 2>&1 || {
            echo "SKIPPED: could not add the $t target (rustup target add $t)"
            return 0
        }
    fi
    if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
        echo "SKIPPED: qemu-aarch64 or aarch64-linux-gnu-gcc missing"
        return 0
    fi
    local out
    out=$(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
        cargo test -q -p tiercache-format --target "$t" --lib crc -- --nocapture 2>&1) ||
        { echo "$out" | tail -30; return 1; }
    echo "$out" | grep -E "hardware CRC32C|test result"
    # The hardware path must be the one tested (qemu's CPU has the CRC extension).
    echo "$out" | grep -q "hardware CRC32C: true"
}
step "CRC32C hardware path on aarch64 (qemu-user)" crc_aarch64

section "canaries: each planted bug must be caught by its harness"
canary() {
    # $3: what the failure must show (default: one of the oracles' messages).
    local feature=$1 test=$2 want=${3:-'STALE READ|DURABILITY|EMPTY LINE|CRASH \([A-Za-z]+\)'}
    local log
    log=$(mktemp)
    # shellcheck disable=SC2086 # CANARY_ARGS is a list of cargo flags
    if cargo test -q ${CANARY_ARGS:-} -p tiercache-core --features "$feature" --test "$test" >"$log" 2>&1; then
        echo "canary $feature was NOT caught by test '$test'"
        tail -5 "$log"
        rm -f "$log"
        return 1
    fi
    local found
    found=$(grep -m1 -oE "$want" "$log" || true)
    if [ -z "$found" ]; then
        echo "canary $feature made '$test' fail, but not through the oracle:"
        grep -m3 -E 'panicked|error' "$log" || tail -5 "$log"
        rm -f "$log"
        return 1
    fi
    echo "canary $feature caught by '$test' ($found)"
    rm -f "$log"
}
step "canary: clean before the core write is durable" canary canary-clean-before-durable model
step "canary: flush acknowledged before what it covers" canary canary-early-flush-ack model
step "canary: stale read after a partial-line write" canary canary-stale-partial model
step "canary: eviction policy that evicts dirty lines" canary canary-broken-eviction model
step "canary: a failed cache write leaves its new lines mapped and empty" canary canary-empty-line model
step "canary: early flush ack, caught by a crash at a device write" canary canary-early-flush-ack crash
# A journal record that may become durable before the data it points at: caught only when a
# crash reorders the two on a reused slot, so this one runs 600 seeds (release build).
TIERCACHE_CRASH_SEEDS=600 CANARY_ARGS=--release \
    step "canary: journal commit without the flush before it, caught by a crash" canary canary-no-preflush crash
# The crash sweep cuts scripted lifecycles at every device write: it catches the same bug in
# a test build within seconds (about 140 failing crash points in its first variant).
TIERCACHE_SWEEP_VARIANTS=1 \
    step "canary: journal commit without the flush before it, caught by the crash sweep" canary canary-no-preflush crash_sweep
# No write intent before a change to a line a checkpoint proved clean: a crash brings back a
# clean copy that differs from the core (the sweep's CLEAN COPY DIFFERS check, in seconds).
TIERCACHE_SWEEP_VARIANTS=1 \
    step "canary: no write intent before changing a proven clean line, caught by the crash sweep" canary canary-skip-intent crash_sweep

# A client flush that does not wait for the journal records of writes answered before them:
# a crash after the flush loses them (the sweep's flushed-data check).
TIERCACHE_SWEEP_VARIANTS=1 \
    step "canary: flush not waiting for the records of answered writes, caught by the crash sweep" canary canary-flush-skips-journal crash_sweep

# Mode wl: a flush that does not wait for earlier log entries loses flushed writes at a crash.
step "canary: wl flush before earlier log entries are written, caught by the wl crash check" \
    canary canary-wl-flush-early wl

# Mode wl: retiring an entry without taking it out of the log index. The write log's own
# invariant checker (WriteLog::check_invariants, on with strict-asserts) must catch it.
step "canary: wl index keeps retired entries, caught by the wl invariant checker" \
    canary canary-wl-index-keeps-retired wl 'WL INVARIANT'

# The engine's power-cut test (SPEC R2 in process) must catch device flushes that are not done.
canary_engine() {
    local log
    log=$(mktemp)
    if cargo test -q -p tiercache-engine --features canary-skip-flush --test engine power_cut >"$log" 2>&1; then
        echo "canary canary-skip-flush was NOT caught by the engine's power-cut test"
        rm -f "$log"
        return 1
    fi
    if ! grep -m1 -oE 'POWER CUT|recovery failed' "$log"; then
        echo "canary canary-skip-flush made the test fail, but not through its checks:"
        grep -m3 -E 'panicked|error' "$log" || tail -5 "$log"
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}
step "canary: device flushes skipped, caught by the engine's power-cut test" canary_engine

# SPEC R2 on the real daemon (cli/tests/sigkill.rs): the same canary, built into the tiercache
# binary, must be caught by the SIGKILL test through its oracle or its recovery check.
canary_sigkill() {
    local log
    log=$(mktemp)
    # (Not the RBD loops: Ceph's own flushes are real, and its restarts are slow.)
    if TIERCACHE_KILLS=20 cargo test -q -p tiercache --features tiercache-engine/canary-skip-flush \
        --test sigkill -- --skip kill_loops_on_an_rbd_core >"$log" 2>&1; then
        echo "canary canary-skip-flush was NOT caught by the daemon SIGKILL test"
        rm -f "$log"
        return 1
    fi
    if ! grep -m1 -oE 'CRASH \([a-z ]+\)|RECOVERY FAILED|FLIP-FLOP|STALE READ' "$log"; then
        echo "canary canary-skip-flush made the SIGKILL test fail, but not through its checks:"
        grep -m3 -E 'panicked|error' "$log" || tail -5 "$log"
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}
step "canary: device flushes skipped, caught by the daemon SIGKILL test" canary_sigkill

section "benchmarks and the study scenario (numbers printed, not asserted)"
TC="${CARGO_TARGET_DIR:-target}/release/tiercache"
step "tiercache bench core (small)" "$TC" bench core --lines 65536 --ops 20000
step "tiercache bench load (1M lines; 16M on demand: bench load --lines 16m)" \
    "$TC" bench load --lines 1m --writes 5000
step "tiercache bench --quick (the README's main job)" "$TC" bench --quick --out target/bench-quick
step "tiercache bench peers --quick (SPEC P1/P2 vs nbdkit and fio; full run: bench peers)" \
    "$TC" bench peers --quick --out target/bench-peers-quick
step "tiercache sim ceph-opencas-2020 (the simulated study)" "$TC" sim ceph-opencas-2020
# SPEC P8 (issue 7): wl in front of a real RBD image vs plain librbd and librbd's writeback
# cache. The bench starts its own single-node cluster (scripts/ceph-cluster.sh, stopped at its
# end and if it dies) and its own daemon; about 2.5 minutes.
bench_wl_quick() {
    if ! command -v ceph-mon >/dev/null 2>&1; then
        echo "skipped: ceph-mon is not installed"
        return 0
    fi
    "$TC" bench wl --quick --out target/bench-wl-quick
}
step "tiercache bench wl --quick (SPEC P8 on a real Ceph image; full run: bench wl)" bench_wl_quick

section "summary"
echo "suite: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
