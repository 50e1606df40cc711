//! # tiercache-fuzzing: fuzz targets and their seeded loops (SPEC R5)
//!
//! One `pub fn NAME(data: &[u8]) -> bool` per target: what a cargo-fuzz target
//! (`fuzz/fuzz_targets/NAME.rs`, nightly) calls, and what the seeded loops of
//! `tests/seeded.rs` call on stable Rust in the test command. Each returns whether the input
//! decoded (was accepted), never panics on any input, and panics — the finding — when a
//! property it checks fails:
//!
//! - **decoders**: anything that decodes re-encodes with the crate's own encoder and decodes
//!   again to the same value (byte-exact where the encoding is canonical);
//! - **state machines** (the NBD server, the cache core): the protocol's or the core's
//!   invariants after every step.
//!
//! Each target also has a **generator** ([`Target::generate`]): a *valid* input built from a
//! seeded RNG with the crates' encoders, with decode(encode(x)) == x checked for the value it
//! encodes, plus what the [`mutate`] module needs to damage it meaningfully (length and code
//! fields, a checksum seal, text tokens). [`run_seeded`] mixes valid, mutated, spliced and
//! random inputs and reports how many decoded.
//!
//! | target | what | module |
//! |---|---|---|
//! | `superblock` | `Superblock::decode` (4 KiB block, checksum sealed after mutation) | [`format`] |
//! | `record` | the record frame, then its payload by kind | [`format`] |
//! | `checkpoint_chunk` | `checkpoint::decode_chunk` | [`format`] |
//! | `journal_entry` | `journal::Entry::decode` | [`format`] |
//! | `core_table` | `tables::decode_cores` | [`format`] |
//! | `config_record` | `tables::decode_config` | [`format`] |
//! | `log_header` | `wlog::LogHeader::decode` (write-log entry header block) | [`format`] |
//! | `log_super` | `wlog::LogSuper::decode` and `pick` (write-log superblock) | [`format`] |
//! | `nbd_options` | the server's fixed newstyle handshake (option haggling), in memory | [`nbd`] |
//! | `nbd_requests` | transmission: request headers, their checks, payload framing | [`nbd`] |
//! | `nbd_session` | the real server over a unix socket pair: handshake + transmission | [`nbd`] |
//! | `ioclass_csv` | `IoClassTable::parse_csv` | [`text`] |
//! | `daemon_config` | the daemon's TOML config (`ConfigFile::parse`) | [`text`] |
//! | `core_ops` | bytes as events applied to a `Cache`, invariants after each | [`core_ops`] |

#![warn(missing_docs)]

pub mod core_ops;
pub mod format;
pub mod mutate;
pub mod nbd;
pub mod text;

use mutate::{Kind, Rng, Sample};
use std::cell::Cell;
use std::time::{Duration, Instant};

pub use core_ops::core_ops;
pub use format::{
    checkpoint_chunk, config_record, core_table, journal_entry, log_header, log_super, record,
    superblock,
};
pub use nbd::{nbd_options, nbd_requests, nbd_session};
pub use text::{daemon_config, ioclass_csv};

thread_local! {
    static ROUND_TRIPS: Cell<u64> = const { Cell::new(0) };
}

/// Counts one round trip checked (decode → encode → decode, or encode → decode).
pub(crate) fn round_trip_checked() {
    ROUND_TRIPS.with(|c| c.set(c.get() + 1));
}

/// Round trips checked on this thread so far.
pub fn round_trips() -> u64 {
    ROUND_TRIPS.with(|c| c.get())
}

/// A fuzz target.
#[derive(Clone, Copy)]
pub struct Target {
    /// Its name (the cargo-fuzz target's too).
    pub name: &'static str,
    /// The function a cargo-fuzz target calls: whether the input decoded (was accepted).
    pub run: fn(&[u8]) -> bool,
    /// A valid input from the seeded RNG (the value it encodes round-trip checked).
    pub generate: fn(&mut Rng) -> Sample,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "superblock",
        run: superblock,
        generate: format::gen_superblock,
    },
    Target {
        name: "record",
        run: record,
        generate: format::gen_record,
    },
    Target {
        name: "checkpoint_chunk",
        run: checkpoint_chunk,
        generate: format::gen_checkpoint_chunk,
    },
    Target {
        name: "journal_entry",
        run: journal_entry,
        generate: format::gen_journal_entry,
    },
    Target {
        name: "core_table",
        run: core_table,
        generate: format::gen_core_table,
    },
    Target {
        name: "config_record",
        run: config_record,
        generate: format::gen_config_record,
    },
    Target {
        name: "log_header",
        run: log_header,
        generate: format::gen_log_header,
    },
    Target {
        name: "log_super",
        run: log_super,
        generate: format::gen_log_super,
    },
    Target {
        name: "nbd_options",
        run: nbd_options,
        generate: nbd::gen_options,
    },
    Target {
        name: "nbd_requests",
        run: nbd_requests,
        generate: nbd::gen_requests,
    },
    Target {
        name: "nbd_session",
        run: nbd_session,
        generate: nbd::gen_session,
    },
    Target {
        name: "ioclass_csv",
        run: ioclass_csv,
        generate: text::gen_ioclass_csv,
    },
    Target {
        name: "daemon_config",
        run: daemon_config,
        generate: text::gen_daemon_config,
    },
    Target {
        name: "core_ops",
        run: core_ops,
        generate: core_ops::gen_core_ops,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The input of case `index` of a seeded run: a pure function of (target, seed, index), so a
/// failing case replays alone.
pub fn case_input(t: &Target, seed: u64, index: u64) -> (Vec<u8>, Kind) {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0xd605_bbb5_8c8a_bd49) ^ name_hash(t.name));
    mutate::make_input(&mut rng, t.generate)
}

fn name_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a seeded run did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Cases run.
    pub cases: u64,
    /// Cases whose input decoded (was accepted).
    pub accepted: u64,
    /// Of the valid (unmutated) inputs: how many, and how many were accepted.
    pub valid: (u64, u64),
    /// Of the mutated and spliced inputs: how many, and how many were accepted.
    pub mutated: (u64, u64),
    /// Round trips checked.
    pub round_trips: u64,
    /// Wall-clock time.
    pub elapsed: Duration,
    /// CPU time of the calling thread (the figure to compare on a busy machine; the NBD server's
    /// own threads are not in it).
    pub cpu: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pct = |a: u64, n: u64| 100.0 * a as f64 / n.max(1) as f64;
        write!(
            f,
            "{} cases, {:.1}% decoded (valid inputs {:.1}% of {}, mutated {:.1}% of {}), {} round trips checked, {:.2} s ({:.2} s CPU)",
            self.cases,
            pct(self.accepted, self.cases),
            pct(self.valid.1, self.valid.0),
            self.valid.0,
            pct(self.mutated.1, self.mutated.0),
            self.mutated.0,
            self.round_trips,
            self.elapsed.as_secs_f64(),
            self.cpu.as_secs_f64()
        )
    }
}

/// Runs cases `first..first + cases` of target `t` with `seed`. A panicking case is reported
/// on stderr with its seed, index and input (hex, and written to `$TMPDIR`), then the panic goes
/// on: the caller fails.
pub fn run_seeded(t: &Target, seed: u64, first: u64, cases: u64) -> Report {
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let rt0 = round_trips();
    let mut rep = Report::default();
    for index in first..first + cases {
        let (input, kind) = case_input(t, seed, index);
        let r = std::panic::catch_unwind(|| (t.run)(&input));
        let ok = match r {
            Ok(ok) => ok,
            Err(e) => {
                let path = std::env::temp_dir().join(format!(
                    "tiercache-fuzz-{}-seed{seed}-case{index}.bin",
                    t.name
                ));
                let _ = std::fs::write(&path, &input);
                let hex: String = input.iter().take(512).map(|b| format!("{b:02x}")).collect();
                eprintln!(
                    "FUZZ FAILURE in target {} at seed {seed} case {index} ({kind:?} input, {} bytes)\n\
                     replay: TIERCACHE_FUZZ_SEED={seed} TIERCACHE_FUZZ_CASE={index} cargo test -p tiercache-fuzzing --test seeded {} -- --nocapture\n\
                     input written to {} (feed it to `cargo fuzz run {} FILE`); first 512 bytes: {hex}",
                    t.name,
                    input.len(),
                    t.name,
                    path.display(),
                    t.name,
                );
                std::panic::resume_unwind(e);
            }
        };
        rep.cases += 1;
        rep.accepted += ok as u64;
        let bucket = match kind {
            Kind::Valid => &mut rep.valid,
            Kind::Mutated | Kind::Spliced => &mut rep.mutated,
            Kind::Random => &mut rep.mutated,
        };
        bucket.0 += 1;
        bucket.1 += ok as u64;
    }
    rep.round_trips = round_trips() - rt0;
    rep.elapsed = start.elapsed();
    rep.cpu = thread_cpu().saturating_sub(cpu0);
    rep
}

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
