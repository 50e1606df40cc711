//! The lock-wait part of `bench core`: what a wake-up costs when many requests wait for line
//! locks behind a slow core (issue "fast path", Deliver 7). Printed and written as JSON with
//! the rest of `bench core`; never asserted.
//!
//! Method, for each queue length N: a write-through cache; N read misses of N different core
//! lines are started and their core reads left pending (each holds its line's lock, as reads
//! waiting on a slow HDD do); then N more reads of the same lines arrive and queue behind
//! them. The core reads then complete one at a time, oldest first: each completion finishes
//! its request (the backfill write to the cache completes at once), releases its line and
//! wakes the one read waiting there, which starts and completes as a cache hit. One sample is
//! the core's whole work for one completion, wake-up included. A retry that looked at the
//! whole wait list would cost O(N) per wake-up (it was O(N x blocked)); with a queue per line
//! it stays flat in N.

use std::time::Instant;
use tiercache_core::event::{Action, Dev, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, IoId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};

/// One queue length's result.
pub(crate) struct WaitRun {
    pub(crate) queued: u32,
    /// Core work per wake-up, ns (mean and p99 over the N completions).
    pub(crate) mean_ns: f64,
    pub(crate) p99_ns: f64,
}

/// Applies `ev` and everything it leads to: device IOs complete at once, except core reads
/// and writes when `pending` is given (they are appended to it). Returns the requests
/// completed and whether all of them succeeded.
pub(crate) fn drive(
    cache: &mut Cache,
    now: Nanos,
    ev: Event,
    actions: &mut Vec<Action>,
    mut pending: Option<&mut Vec<IoId>>,
) -> (u32, bool) {
    actions.clear();
    cache.apply(now, ev, actions);
    let (mut done, mut ok) = (0, true);
    let mut i = 0;
    while i < actions.len() {
        match actions[i] {
            Action::Read { io, dev, .. } | Action::Write { io, dev, .. }
                if dev != Dev::Cache && pending.is_some() =>
            {
                pending.as_mut().expect("checked").push(io);
            }
            Action::Read { io, .. }
            | Action::Write { io, .. }
            | Action::WriteZeroes { io, .. }
            | Action::Trim { io, .. }
            | Action::Flush { io, .. } => {
                cache.apply(now, Event::IoDone { io, result: Ok(()) }, actions);
            }
            Action::Complete { result, .. } => {
                done += 1;
                ok &= result.is_ok();
            }
            Action::Copy { .. } => {}
        }
        i += 1;
    }
    (done, ok)
}

/// Measures one queue length.
fn one(n: u32) -> Result<WaitRun, String> {
    let mut cfg = Config::new((2 * n).max(1024), LineSize::K4);
    cfg.mode = CacheMode::Wt;
    let mut cache = super::core::bench_cache(cfg, n as u64 * 8 * 2)?;
    let core = CoreId(0);
    let mut actions = Vec::new();
    let mut pending = Vec::new();
    let mut req = 0u64;
    let now = Nanos(1);
    let read = |req: u64, line: u32| Event::Read {
        req: ReqId(req),
        core,
        lba: Lba(line as u64 * 8),
        blocks: 8,
    };
    for round in 0..2 {
        for line in 0..n {
            req += 1;
            drive(
                &mut cache,
                now,
                read(req, line),
                &mut actions,
                Some(&mut pending),
            );
        }
        if round == 0 && pending.len() != n as usize {
            return Err(format!("{} core reads for {n} misses", pending.len()));
        }
    }
    let holders = std::mem::take(&mut pending);
    let mut samples = Vec::with_capacity(n as usize);
    let mut completed = 0;
    for io in holders {
        let t = Instant::now();
        completed += drive(
            &mut cache,
            now,
            Event::IoDone { io, result: Ok(()) },
            &mut actions,
            Some(&mut pending),
        )
        .0;
        samples.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
    }
    if completed != 2 * n || !pending.is_empty() {
        return Err(format!(
            "{completed} of {} requests completed, {} core IOs left",
            2 * n,
            pending.len()
        ));
    }
    let t = super::core::summarize(samples);
    Ok(WaitRun {
        queued: n,
        mean_ns: t.mean,
        p99_ns: t.p99,
    })
}

/// Runs the queue lengths from 100 to 100,000 that fit in `lines` cache lines (each needs
/// two lines per request: `bench core --lines` bounds it, so a small run stays small).
pub(crate) fn measure(lines: u32) -> Result<Vec<WaitRun>, String> {
    [100, 1_000, 10_000, 100_000]
        .into_iter()
        .filter(|&n| n == 100 || 2 * n <= lines)
        .map(one)
        .collect()
}
