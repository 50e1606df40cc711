//! The fuzz targets as seeded loops on stable Rust (SPEC R5): one test per target, 100,000
//! cases each by default — valid inputs from the structure-aware generators, mutated ones
//! (bit flips, byte sets, truncation, extension, splices, length-field edits, checksums sealed
//! again), and random bytes. Each prints cases, the share that decoded, round trips checked and
//! the time taken.
//!
//! - `TIERCACHE_FUZZ_CASES=N`: N cases per target (longer local runs).
//! - `TIERCACHE_FUZZ_SEED=S`: another seed (default below).
//! - `TIERCACHE_FUZZ_CASE=I`: replay case I alone (a failure prints seed and case).

use tiercache_fuzzing::{Report, run_seeded, target};

const DEFAULT_SEED: u64 = 0x7469_6572_6361_6368; // "tiercach"
const DEFAULT_CASES: u64 = 100_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn run(name: &str) -> Report {
    let t = target(name).expect("a target of that name");
    let seed = env_u64("TIERCACHE_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let (first, n) = match env_u64("TIERCACHE_FUZZ_CASE") {
        Some(i) => (i, 1),
        None => (0, env_u64("TIERCACHE_FUZZ_CASES").unwrap_or(DEFAULT_CASES)),
    };
    let r = run_seeded(t, seed, first, n);
    println!("fuzz {name} (seed {seed:#x}): {r}");
    assert_eq!(r.cases, n);
    if n >= 1000 {
        // A generator that stopped producing decodable input, or a mutator that stopped
        // producing undecodable input, would make the loop meaningless.
        assert!(r.accepted > 0, "{name}: nothing decoded");
        assert!(r.round_trips > 0, "{name}: no round trip checked");
    }
    r
}

/// For the decoders every valid input decodes, and mutation makes some fail.
fn run_decoder(name: &str) {
    let r = run(name);
    assert_eq!(r.valid.0, r.valid.1, "{name}: a valid input was refused");
    if r.cases >= 1000 {
        assert!(
            r.mutated.1 < r.mutated.0,
            "{name}: every mutated input decoded"
        );
    }
}

#[test]
fn superblock() {
    run_decoder("superblock");
}

#[test]
fn record() {
    run_decoder("record");
}

#[test]
fn checkpoint_chunk() {
    run_decoder("checkpoint_chunk");
}

#[test]
fn journal_entry() {
    run_decoder("journal_entry");
}

#[test]
fn core_table() {
    run_decoder("core_table");
}

#[test]
fn config_record() {
    run_decoder("config_record");
}

#[test]
fn log_header() {
    run_decoder("log_header");
}

#[test]
fn log_super() {
    run_decoder("log_super");
}

#[test]
fn nbd_options() {
    run("nbd_options");
}

#[test]
fn nbd_requests() {
    run("nbd_requests");
}

#[test]
fn nbd_session() {
    run("nbd_session");
}

#[test]
fn ioclass_csv() {
    run("ioclass_csv");
}

#[test]
fn daemon_config() {
    run_decoder("daemon_config");
}

#[test]
fn core_ops() {
    run("core_ops");
}
