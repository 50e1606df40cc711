//! Faults as the daemon shows them (SPEC R3, R4, C19; docs/SAFETY.md, "Faults"): the core's
//! `Cache::health()` turned into the `degraded` state word and its reason for `list`, the
//! `health` blocks of `stats`, and one log line when a problem starts and one when it ends
//! ([`Watch`]).
//!
//! Times: the core's clock is the engine's ([`Engine::now`]); `since` is shown as UTC wall
//! time and as seconds ago.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tiercache_core::Machine;
use tiercache_core::cache::{DeviceErrors, HealthState, Problem};
use tiercache_core::event::IoError;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_core::units::{CoreId, Nanos};
use tiercache_engine::Engine;

/// The error as one word group, as the logs and `stats` show it.
pub fn err_name(e: IoError) -> &'static str {
    match e {
        IoError::Io => "IO error",
        IoError::NoSpace => "no space (ENOSPC)",
        IoError::TimedOut => "timed out",
    }
}

/// Seconds between two times of the core's clock (`later` before `earlier` gives 0).
fn secs(later: Nanos, earlier: Nanos) -> f64 {
    later.0.saturating_sub(earlier.0) as f64 / 1e9
}

/// Rounded to milliseconds.
fn ms3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The wall time of `t` on the core's clock, whose time now is `now`.
pub fn wall(t: Nanos, now: Nanos) -> SystemTime {
    SystemTime::now() - Duration::from_nanos(now.0.saturating_sub(t.0))
}

/// `2025-06-01 12:00:03 UTC`.
pub fn utc(t: SystemTime) -> String {
    let (y, m, d, h, min, s) = tiercache_io::log::civil(t);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02}:{s:02} UTC")
}

/// Bytes for people: `48.0 KiB`.
pub fn human(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift {
            return format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{bytes} bytes")
}

/// A short name of the problem's kind.
pub fn kind(p: &Problem) -> &'static str {
    match p {
        Problem::CacheDevice { .. } => "cache_device",
        Problem::CoreDevice { .. } => "core_device",
        Problem::Writeback { .. } => "writeback",
        Problem::WritebackRead { .. } => "writeback_read",
        Problem::LogDevice { .. } => "log_device",
    }
}

fn since_of(p: &Problem) -> Nanos {
    match *p {
        Problem::CacheDevice { since, .. }
        | Problem::CoreDevice { since, .. }
        | Problem::Writeback { since, .. }
        | Problem::WritebackRead { since, .. }
        | Problem::LogDevice { since, .. } => since,
    }
}

fn error_of(p: &Problem) -> IoError {
    match *p {
        Problem::CacheDevice { last_error, .. }
        | Problem::CoreDevice { last_error, .. }
        | Problem::Writeback { last_error, .. }
        | Problem::WritebackRead { last_error, .. }
        | Problem::LogDevice { last_error, .. } => last_error,
    }
}

/// One problem as `stats` shows it.
pub fn problem_json(p: &Problem, now: Nanos) -> Value {
    let since = since_of(p);
    let mut v = json!({
        "kind": kind(p),
        "core_id": p.core().map(|c| c.0),
        "since": utc(wall(since, now)),
        "since_unix": ms3(wall(since, now).duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64()),
        "for_s": ms3(secs(now, since)),
        "error": err_name(error_of(p)),
        "description": p.describe(now),
    });
    match *p {
        Problem::CacheDevice {
            errors, next_probe, ..
        } => {
            v["errors"] = json!(errors);
            v["next_probe_in_s"] = json!(ms3(secs(next_probe, now)));
        }
        Problem::LogDevice { errors, .. } => v["errors"] = json!(errors),
        Problem::CoreDevice { .. } => {}
        Problem::Writeback {
            failures,
            retries,
            next_retry,
            dirty_blocks,
            ..
        } => {
            v["failures"] = json!(failures);
            v["retries"] = json!(retries);
            v["next_retry_in_s"] = json!(ms3(secs(next_retry, now)));
            v["dirty_bytes"] = json!(dirty_blocks * BLOCK_BYTES);
        }
        Problem::WritebackRead {
            failures,
            next_retry,
            ..
        } => {
            v["failures"] = json!(failures);
            v["next_retry_in_s"] = json!(ms3(secs(next_retry, now)));
        }
    }
    v
}

fn device_errors(d: &DeviceErrors) -> Value {
    json!({"total": d.total(), "reads": d.reads, "writes": d.writes, "flushes": d.flushes,
        "io": d.io, "no_space": d.no_space, "timed_out": d.timed_out})
}

/// Two counts of errors of the same device (a `wl` cache device: the read cache's and the
/// log's) as one.
fn sum_errors(a: &DeviceErrors, b: &DeviceErrors) -> DeviceErrors {
    DeviceErrors {
        reads: a.reads + b.reads,
        writes: a.writes + b.writes,
        flushes: a.flushes + b.flushes,
        io: a.io + b.io,
        no_space: a.no_space + b.no_space,
        timed_out: a.timed_out + b.timed_out,
        last: match (a.last, b.last) {
            (Some(x), Some(y)) => Some(if y.1 > x.1 { y } else { x }),
            (x, y) => x.or(y),
        },
    }
}

/// The `health` block of a cache in `stats`: state, problems, dirty data at risk, writeback
/// retries and failing cores, the cache device's errors and what the cache did about them;
/// for `wl` also the log's (`write_log`: its errors are the cache device's too).
pub fn cache_health_json(m: &Machine, now: Nanos) -> Value {
    let c = m.cache();
    let h = m.health();
    let f = c.faults();
    let mut failing = Vec::new();
    let (mut failures, mut retries) = (0, 0);
    for p in &h.problems {
        if let Problem::Writeback { core, .. } = p {
            failing.push(core.0);
        }
    }
    for i in 0..=crate::registry::CORE_ID_MAX {
        if let Some(k) = c.core_faults(CoreId(i)) {
            failures += k.writeback.failures;
            retries += k.writeback.retries;
        }
    }
    let cache_errors = match m.wl() {
        Some(w) => sum_errors(&f.cache_device, w.log_device_errors()),
        None => f.cache_device,
    };
    let mut v = json!({
        "state": h.state.as_str(),
        "problems": h.problems.iter().map(|p| problem_json(p, now)).collect::<Vec<_>>(),
        "dirty_at_risk_bytes": h.dirty_at_risk_blocks * BLOCK_BYTES,
        "writeback": {
            "failing_cores": failing,
            "failures": failures + f.writeback_reads.failures,
            "retries": retries + f.writeback_reads.retries,
            "cache_read_failures": f.writeback_reads.failures,
        },
        "cache_device": {
            "bypass": h.problems.iter().any(|p| matches!(p, Problem::CacheDevice { .. })),
            "errors": device_errors(&cache_errors),
            "episodes": f.cache_episodes,
            "probes": f.probes,
            "probes_ok": f.probes_ok,
            "bypassed_requests": f.bypassed_requests,
            "write_through_cache_failed": f.write_through_cache_failed,
            "lazy_write_fallbacks": f.lazy_write_fallbacks,
            "read_retries_from_core": f.read_retries_from_core,
            "dirty_read_errors": f.dirty_read_errors,
            "backfill_failures": f.backfill_failures,
        },
    });
    if let Some(w) = m.wl() {
        let k = w.counters();
        v["write_log"] = json!({
            "failing": w.log_problem().is_some(),
            "episodes": w.log_episodes(),
            "device_errors": device_errors(w.log_device_errors()),
            "log_errors": k.log_errors,
            "writeback_errors": k.wb_errors,
        });
    }
    v
}

/// The `health` block of a core in `stats`.
pub fn core_health_json(m: &Machine, core: CoreId, now: Nanos) -> Value {
    let Some(h) = m.core_health(core) else {
        return Value::Null;
    };
    let k = m.cache().core_faults(core).copied().unwrap_or_default();
    let w = &k.writeback;
    json!({
        "state": h.state.as_str(),
        "problems": h.problems.iter().map(|p| problem_json(p, now)).collect::<Vec<_>>(),
        "dirty_at_risk_bytes": h.dirty_at_risk_blocks * BLOCK_BYTES,
        "errors": device_errors(&k.device),
        "writeback": {
            "failing": w.since.is_some(),
            "failing_since": w.since.map(|s| utc(wall(s, now))),
            "failing_for_s": w.since.map(|s| ms3(secs(now, s))),
            "last_error": w.last_error.map(err_name),
            "failures": w.failures,
            "retries": w.retries,
            "episodes": w.episodes,
        },
    })
}

/// The state word and reason of a running cache, and of each of its cores (`list`):
/// `degraded` with the problems' one-line descriptions joined by `; `, or `running`.
pub fn states(e: &Engine) -> (Option<String>, BTreeMap<u16, String>) {
    let now = e.now();
    e.with_machine(|m| {
        if !m.is_degraded() {
            return (None, BTreeMap::new());
        }
        let h = m.health();
        let c = m.cache();
        let mut cores: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        let mut all = Vec::new();
        let mut wide = Vec::new();
        for p in &h.problems {
            let d = p.describe(now);
            match p.core() {
                Some(k) => cores.entry(k.0).or_default().push(d.clone()),
                None => wide.push(d.clone()),
            }
            all.push(d);
        }
        if h.dirty_at_risk_blocks > 0 {
            all.push(format!(
                "{} of dirty data at risk",
                human(h.dirty_at_risk_blocks * BLOCK_BYTES)
            ));
        }
        let mut per_core = BTreeMap::new();
        for i in 0..=crate::registry::CORE_ID_MAX {
            if c.core(CoreId(i)).is_none() {
                continue;
            }
            let mut v = cores.remove(&i).unwrap_or_default();
            v.extend(wide.iter().cloned());
            if !v.is_empty() {
                per_core.insert(i, v.join("; "));
            }
        }
        (
            (h.state == HealthState::Degraded).then(|| all.join("; ")),
            per_core,
        )
    })
}

/// Logs one line when a problem starts (`cache degraded`, level warn) and one when it ends
/// (`problem cleared`, level info), per cache, per problem kind and core. Polled by the
/// daemon (every 250 ms); between polls nothing is logged, however many IOs fail (a problem
/// that ends and starts again between two polls is one).
#[derive(Default)]
pub struct Watch {
    /// The open problems of each cache, with when they were first seen.
    seen: BTreeMap<u16, BTreeMap<(&'static str, Option<u16>), std::time::Instant>>,
}

impl Watch {
    /// Compares the health of every running cache with what was seen last, and logs the
    /// differences. `caches`: the running caches now (a cache no longer listed was stopped:
    /// its problems are forgotten without a line).
    pub fn poll(&mut self, caches: &[(u16, std::sync::Arc<Engine>)]) {
        self.seen
            .retain(|id, _| caches.iter().any(|(c, _)| c == id));
        for (id, e) in caches {
            let seen = self.seen.entry(*id).or_default();
            let now = e.now();
            let problems = e.with_machine(|m| {
                if m.is_degraded() {
                    m.health().problems
                } else {
                    Vec::new()
                }
            });
            if problems.is_empty() && seen.is_empty() {
                continue;
            }
            let mut open = BTreeMap::new();
            for p in &problems {
                open.insert((kind(p), p.core().map(|c| c.0)), p);
            }
            let gone: Vec<_> = seen
                .keys()
                .filter(|k| !open.contains_key(*k))
                .copied()
                .collect();
            for k in gone {
                let entered = seen.remove(&k).expect("listed");
                crate::log!(
                    info,
                    "problem cleared",
                    cache = id,
                    core = k.1.map_or("-".to_string(), |c| c.to_string()),
                    problem = k.0,
                    lasted_s = format!("{:.1}", entered.elapsed().as_secs_f64())
                );
            }
            for (k, p) in open {
                if seen.contains_key(&k) {
                    continue;
                }
                crate::log!(
                    warn,
                    "cache degraded",
                    cache = id,
                    core = k.1.map_or("-".to_string(), |c| c.to_string()),
                    problem = k.0,
                    error = err_name(error_of(p)),
                    reason = p.describe(now)
                );
                seen.insert(k, std::time::Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        let t = |s: u64| utc(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(t(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(t(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(t(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(t(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(49_152), "48.0 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
