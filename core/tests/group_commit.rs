//! The journal's group commit and the write intents' hysteresis (issue 29, item 3), on a
//! persistent `wb` cache driven through the test harness (every read checked by its oracle):
//! - writes that need no durability are answered when their data is in the cache, and their
//!   line states wait for one commit: none starts before [`COMMIT_DELAY_NS`], one record then
//!   holds them all;
//! - a FUA write, a client flush, and a write to a line a parked write still holds each start
//!   the commit at once;
//! - a rewrite of blocks already dirty in a line whose record is written changes no record:
//!   it starts no commit and is not parked, and a crash at any point after it leaves every
//!   block legal;
//! - a region written since the last checkpoint is recorded unproven by the next one and needs
//!   no new write intent; a region left alone for a whole checkpoint interval is proven again
//!   and its next write waits for an intent.

mod harness;

use harness::workload::persistent;
use harness::{CrashPattern, Env, Knobs, ReqOp, Rng};
use tiercache_core::Config;
use tiercache_core::cache::COMMIT_DELAY_NS;
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{LineSize, Nanos};

const LINES: u32 = 2048;
const BPL: u64 = 8;

fn wb_env(seed: u64) -> Env {
    let mut cfg = Config::new(LINES, LineSize::K4);
    cfg.mode = CacheMode::Wb;
    let cfg = persistent(cfg, &mut Rng::new(seed));
    let mut env = Env::new(
        cfg,
        seed,
        Knobs {
            p_io_error: 0.0,
            ..Knobs::default()
        },
    );
    env.add_core(0, LINES as u64 * BPL * 2);
    env.results = Some(Default::default());
    env
}

/// Completes every IO in flight without moving time.
fn run_ios(env: &mut Env) {
    while env.complete_one() {}
}

/// Moves time by `ns` and ticks, then completes what that started.
fn later(env: &mut Env, ns: u64) {
    env.now = env.now.plus(Nanos(ns));
    env.tick();
    run_ios(env);
}

fn write(env: &mut Env, line: u64, fua: bool) {
    env.submit(ReqOp::Write { fua }, 0, line * BPL, BPL as u32);
}

/// Core lines apart from each other (and from the lines `checkpoint` writes).
fn spread(i: u64) -> u64 {
    i * 64 + 3
}

#[test]
fn lazy_writes_are_answered_at_once_and_committed_together_at_the_deadline() {
    let mut env = wb_env(11);
    let before = env.cache.meta_counters();
    for i in 0..20 {
        write(&mut env, i, false);
        run_ios(&mut env);
    }
    assert_eq!(
        env.in_flight(),
        0,
        "every lazy write answered without a commit"
    );
    let mid = env.cache.meta_counters();
    assert_eq!(mid.commits, before.commits, "no commit before the deadline");
    assert!(env.cache.next_deadline().is_some(), "the commit is timed");
    later(&mut env, COMMIT_DELAY_NS);
    let after = env.cache.meta_counters();
    assert_eq!(
        after.commits,
        before.commits + 1,
        "one record for the group"
    );
    assert_eq!(after.commit_lines - before.commit_lines, 20);
    env.verify_all();
}

#[test]
fn fua_flush_and_a_conflicting_write_commit_at_once() {
    for case in 0..3 {
        let mut env = wb_env(12 + case);
        for i in 0..8 {
            write(&mut env, i, false);
        }
        run_ios(&mut env);
        let c0 = env.cache.meta_counters().commits;
        match case {
            0 => write(&mut env, 100, true),
            1 => {
                env.submit(ReqOp::Flush, 0, 0, 0);
            }
            // Line 3 is held by a parked write: this one waits for its lock, so the commit
            // that releases it must not wait for the deadline.
            _ => write(&mut env, 3, false),
        }
        run_ios(&mut env);
        assert_eq!(
            env.in_flight(),
            0,
            "case {case}: answered without time moving"
        );
        assert!(
            env.cache.meta_counters().commits > c0,
            "case {case}: the commit started at once"
        );
        env.verify_all();
    }
}

#[test]
fn a_rewrite_of_recorded_dirty_blocks_needs_no_commit() {
    for pattern in [
        CrashPattern::Kept,
        CrashPattern::Dropped,
        CrashPattern::Torn,
        CrashPattern::Reordered,
    ] {
        let mut env = wb_env(31);
        for i in 0..8 {
            write(&mut env, spread(i), false);
            run_ios(&mut env);
        }
        later(&mut env, COMMIT_DELAY_NS);
        let c0 = env.cache.meta_counters().commits;
        for _ in 0..3 {
            for i in 0..8 {
                write(&mut env, spread(i), false);
                run_ios(&mut env);
            }
        }
        // Half a line: the blocks are dirty already, so no state changes either.
        env.submit(ReqOp::Write { fua: false }, 0, spread(2) * BPL + 2, 3);
        run_ios(&mut env);
        assert_eq!(env.in_flight(), 0, "every rewrite answered");
        later(&mut env, COMMIT_DELAY_NS);
        assert_eq!(
            env.cache.meta_counters().commits,
            c0,
            "rewrites of recorded dirty blocks changed no record"
        );
        // A write that dirties a new line still commits.
        write(&mut env, spread(9), false);
        run_ios(&mut env);
        later(&mut env, COMMIT_DELAY_NS);
        assert_eq!(env.cache.meta_counters().commits, c0 + 1);
        for i in 0..8 {
            write(&mut env, spread(i), false);
            run_ios(&mut env);
        }
        env.verify_all();
        env.crash_check(pattern);
    }
}

/// Writes, then checkpoints until the journal moved on, with time enough for each commit.
fn checkpoint(env: &mut Env) {
    let c0 = env.cache.meta_counters().checkpoints;
    // Lines written and committed fill the journal until a checkpoint starts; those writes go
    // to lines far from the regions the test watches.
    let mut i = 0;
    while env.cache.meta_counters().checkpoints < c0 + 1 {
        write(env, 1000 + (i % 512), false);
        run_ios(env);
        later(env, COMMIT_DELAY_NS);
        i += 1;
        assert!(i < 100_000, "no checkpoint came");
    }
}

/// Writes four lines and commits them; returns the intents that took.
fn write_regions(env: &mut Env) -> u64 {
    let i0 = env.cache.intent_counters().intents;
    for r in 0..4 {
        write(env, spread(r), false);
        run_ios(env);
    }
    later(env, COMMIT_DELAY_NS);
    env.cache.intent_counters().intents - i0
}

#[test]
fn a_region_written_in_every_interval_needs_no_new_intent() {
    let mut env = wb_env(21);
    // A new cache's regions are open: the first writes need no intent.
    assert_eq!(write_regions(&mut env), 0);
    // Checkpoints with those regions quiet (written back, untouched) prove them: the first
    // records them unproven (written in its interval), a later one proves them. (Three: the
    // first may have been running already.)
    env.writeback_all();
    for _ in 0..3 {
        checkpoint(&mut env);
    }
    // (The core lines map to cache lines taken in order from the free list, so the regions
    // they fall in are counted, not assumed.)
    let proven = write_regions(&mut env);
    assert!(
        proven > 0,
        "the first write to a proven region waits for its intent"
    );
    // A checkpoint leaves the regions written in its interval open: writes in the next
    // interval need no intent.
    checkpoint(&mut env);
    assert_eq!(
        write_regions(&mut env),
        0,
        "regions written in the last interval stay open"
    );
    checkpoint(&mut env);
    assert_eq!(write_regions(&mut env), 0, "and in the one after");
    // Left alone for an interval, they are proven again.
    env.writeback_all();
    for _ in 0..3 {
        checkpoint(&mut env);
    }
    assert_eq!(
        write_regions(&mut env),
        proven,
        "quiet regions are proven again"
    );
    env.verify_all();
}
