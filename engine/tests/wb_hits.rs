//! Hits are not held behind writeback: with every core write of a writeback hanging (an HDD
//! that does not answer), a client read whose data the cache holds in several places (so it
//! needs more than its own thread: IO threads run its other IOs) still completes. Writeback
//! may occupy only part of the IO threads, and client IOs go before its queued ones
//! (`engine/src/work.rs`). With one shared FIFO queue the read waited until the core answered.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_io::{Backend, FaultBackend, FaultConfig, OpKind, RamBackend};

mod common;
use common::*;

const BS: usize = 512;

#[test]
fn a_hit_needing_io_threads_completes_while_writeback_hangs_on_the_core() {
    // The cache device is not inline (a wrapper around RAM): its IOs run on threads.
    let cache_dev = Arc::new(FaultBackend::new(
        RamBackend::new(16 << 11),
        FaultConfig::default(),
    ));
    let core = Arc::new(FaultBackend::new(
        RamBackend::new(64 << 11),
        FaultConfig::default(),
    ));
    assert!(!cache_dev.inline());
    let threads = 4;
    let e = Engine::create(
        persistent(16 << 20, LineSize::K4, CacheMode::Wb, 1),
        cache_dev.clone() as Device,
        vec![CoreSpec {
            id: CoreId(0),
            dev: core.clone() as Device,
            record: record(0),
        }],
        EngineConfig::threads(threads),
    )
    .expect("create");
    let mut buf = vec![0u8; 8 * BS];
    // Core lines 0 and 1 in cache lines that are not neighbours (line 500 is written
    // between them): a read of both is two cache IOs.
    for (i, cl) in [0u64, 500, 1].into_iter().enumerate() {
        fill(&mut buf, cl * 8, i as u64 + 1);
        e.write(CoreId(0), cl * 8, &buf, false).expect("write");
    }
    // Dirty lines all over the core, for writeback to work on.
    for cl in (1000..1400u64).step_by(3) {
        fill(&mut buf, cl * 8, 7);
        e.write(CoreId(0), cl * 8, &buf, false).expect("write");
    }
    core.hang(&[OpKind::Write, OpKind::Flush]);
    e.with_cache(|c| c.start_writeback());
    // Wait until writeback's core writes hang on as many IO threads as they may take.
    let t = Instant::now();
    while core.hung() < threads - threads / 4 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "writeback started {} core writes",
            core.hung()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    // Lines 0..2 are dirty (never written back: the core hangs) and valid in the cache.
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut two = vec![0u8; 16 * BS];
            let r = e.read(CoreId(0), 0, &mut two);
            tx.send((r, two)).unwrap();
        });
        // A bound on a liveness check, not a timing: the hit takes microseconds; before the
        // split it waited for the core, i.e. for ever here.
        let got = rx.recv_timeout(Duration::from_secs(20));
        core.release();
        let (r, two) = got.expect("the hit completed while writeback hung on the core");
        r.expect("the hit read");
        let mut want = vec![0u8; 8 * BS];
        fill(&mut want, 0, 1);
        assert!(two[..8 * BS] == want[..], "core line 0");
        fill(&mut want, 8, 3);
        assert!(two[8 * BS..] == want[..], "core line 1");
    });
    assert!(e.stats().thread_ios > 0, "the cache IOs ran on IO threads");
    e.stop().expect("stop");
}
