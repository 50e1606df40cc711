//! Open CAS semantics, table-driven: for each mode, a read or a write that is a full hit, a
//! partial hit or a miss on one 4 KiB line → which devices are read and written, and what the
//! line holds afterwards (valid and dirty blocks). The table is the specification; see
//! `core/src/mode/*.rs` and `../shared/research/opencas.md` §1.

mod harness;

use harness::{Content, Env, Knobs, ReqOp};
use tiercache_core::Config;
use tiercache_core::event::{Action, Dev};
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, LineSize};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Hit,
    Partial,
    Miss,
}

/// What the devices saw, in blocks: (cache read, cache written, core read, core written).
type Io = (u32, u32, u32, u32);

/// Line state afterwards: None = unmapped, Some((valid, dirty)) as 8-bit masks.
type After = Option<(u8, u8)>;

const FULL: u8 = 0xff;

/// Expected behaviour: (mode, is_write, state) → (IO blocks, line afterwards).
/// Partial state: blocks 0..4 valid (clean). Every request covers the whole line (8 blocks).
fn expect(mode: CacheMode, write: bool, st: St) -> (Io, After) {
    use CacheMode::*;
    use St::*;
    match (write, mode, st) {
        // ---- reads ----
        (false, Pt, Hit) => ((0, 0, 8, 0), Some((FULL, 0))),
        (false, Pt, Partial) => ((0, 0, 8, 0), Some((0x0f, 0))),
        (false, Pt, Miss) => ((0, 0, 8, 0), None),
        (false, Wo, Hit) => ((8, 0, 0, 0), Some((FULL, 0))),
        (false, Wo, Partial) => ((4, 0, 4, 0), Some((0x0f, 0))),
        (false, Wo, Miss) => ((0, 0, 8, 0), None),
        (false, _, Hit) => ((8, 0, 0, 0), Some((FULL, 0))),
        (false, _, Partial) => ((4, 4, 4, 0), Some((FULL, 0))),
        (false, _, Miss) => ((0, 8, 8, 0), Some((FULL, 0))),
        // ---- writes ----
        (true, Wt, _) => ((0, 8, 0, 8), Some((FULL, 0))),
        (true, Wb | Wo, _) => ((0, 8, 0, 0), Some((FULL, FULL))),
        (true, Wa, Hit | Partial) => ((0, 8, 0, 8), Some((FULL, 0))),
        (true, Wa, Miss) => ((0, 0, 0, 8), None),
        (true, Wi | Pt, _) => ((0, 0, 0, 8), None),
    }
}

fn run_case(mode: CacheMode, write: bool, st: St) {
    let mut cfg = Config::new(16, LineSize::K4);
    cfg.mode = CacheMode::Wt;
    let mut env = Env::new(
        cfg,
        7,
        Knobs {
            p_io_error: 0.0,
            ..Knobs::default()
        },
    );
    env.add_core(0, 1024);
    // Prepare line 1 (blocks 8..16) in write-through, so it is clean.
    match st {
        St::Hit => env.submit(ReqOp::Write { fua: false }, 0, 8, 8),
        St::Partial => env.submit(ReqOp::Write { fua: false }, 0, 8, 4),
        St::Miss => env.submit(ReqOp::Read, 0, 100, 1), // something unrelated
    };
    env.drain();
    env.cache.set_mode(mode).unwrap();
    env.tick();
    env.record = Some(Vec::new());
    let op = if write {
        ReqOp::Write { fua: false }
    } else {
        ReqOp::Read
    };
    env.submit(op, 0, 8, 8);
    env.drain();
    let mut io: Io = (0, 0, 0, 0);
    for a in env.record.take().unwrap() {
        match a {
            Action::Read {
                dev: Dev::Cache,
                blocks,
                ..
            } => io.0 += blocks,
            Action::Write {
                dev: Dev::Cache,
                blocks,
                ..
            } => io.1 += blocks,
            Action::Read {
                dev: Dev::Core(_),
                blocks,
                ..
            } => io.2 += blocks,
            Action::Write {
                dev: Dev::Core(_),
                blocks,
                ..
            } => io.3 += blocks,
            Action::Flush { .. } => {}
            other => panic!("unexpected action {other:?}"),
        }
    }
    let after: After = env
        .cache
        .line_state(CoreId(0), 1)
        .map(|(_, v, d)| (v as u8, d as u8));
    let (want_io, want_after) = expect(mode, write, st);
    let what = if write { "write" } else { "read" };
    assert_eq!(
        io, want_io,
        "{mode} {what} {st:?}: device IO (cache rd, cache wr, core rd, core wr)"
    );
    assert_eq!(
        after, want_after,
        "{mode} {what} {st:?}: line afterwards (valid, dirty)"
    );
    // And the data is right.
    env.verify_all();
    if write {
        assert!(matches!(env.newest(0, 8), Content::Write(_)));
    }
}

#[test]
fn open_cas_semantics_table() {
    let mut n = 0;
    for mode in CacheMode::ALL {
        for write in [false, true] {
            for st in [St::Hit, St::Partial, St::Miss] {
                run_case(mode, write, st);
                n += 1;
            }
        }
    }
    assert_eq!(n, 36);
}

#[test]
fn lazy_modes_refused_on_volatile_cache() {
    let mut cfg = Config::new(16, LineSize::K4);
    cfg.volatile = true;
    let mut c = tiercache_core::Cache::new(cfg.clone()).unwrap();
    assert!(c.set_mode(CacheMode::Wb).is_err());
    assert!(c.set_mode(CacheMode::Wo).is_err());
    assert!(c.set_mode(CacheMode::Wa).is_ok());
    cfg.mode = CacheMode::Wb;
    assert!(tiercache_core::Cache::new(cfg).is_err());
}

#[test]
fn leaving_write_back_writes_back_first() {
    let mut cfg = Config::new(16, LineSize::K4);
    cfg.mode = CacheMode::Wb;
    cfg.cleaning = tiercache_core::policy::CleaningPolicy::Nop;
    let mut env = Env::new(
        cfg,
        3,
        Knobs {
            p_io_error: 0.0,
            ..Knobs::default()
        },
    );
    env.add_core(0, 1024);
    env.submit(ReqOp::Write { fua: false }, 0, 0, 24);
    env.drain();
    assert_eq!(env.cache.dirty_lines(), 3);
    env.cache.set_mode(CacheMode::Wt).unwrap();
    assert_eq!(
        env.cache.mode(),
        CacheMode::Wb,
        "switch completes only after writeback"
    );
    assert_eq!(env.cache.target_mode(), Some(CacheMode::Wt));
    env.tick();
    env.drain();
    assert_eq!(env.cache.dirty_lines(), 0);
    assert_eq!(env.cache.mode(), CacheMode::Wt);
    env.verify_all();
}
