//! What `list`, `stats` and the metrics read: states of caches and cores (SPEC C19), geometry,
//! timeouts, the writeback rate.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

/// The state word and reason of every core of a cache (one health walk for all of them).
pub(super) fn core_states(c: &CacheEntry) -> BTreeMap<u16, (&'static str, String)> {
    let degraded = match &c.run {
        CacheRun::Running(e) => crate::health::states(e).1,
        _ => BTreeMap::new(),
    };
    c.cores
        .iter()
        .map(|(i, k)| {
            let st = match degraded.get(i) {
                Some(why) => ("degraded", why.clone()),
                None => core_state(c, k),
            };
            (*i, st)
        })
        .collect()
}

pub(super) fn core_state(c: &CacheEntry, k: &CoreEntry) -> (&'static str, String) {
    let why = k.error.as_deref().unwrap_or("not attached");
    match &c.run {
        CacheRun::Running(_) if k.dev.is_none() => (
            "detached",
            format!(
                "not attached at start: {why}; `tiercache add-core --cache-id {} --core-device {}` attaches it once fixed",
                c.id, k.device
            ),
        ),
        CacheRun::Running(_) => ("running", String::new()),
        CacheRun::Incomplete(..) if k.dev.is_none() => match &k.error {
            Some(e) => (
                "detached",
                format!("core device not attached: {e}; add-core it"),
            ),
            None => (
                "detached",
                "core device not attached yet (add-core it)".into(),
            ),
        },
        CacheRun::Incomplete(..) => ("incomplete", "waiting for the cache's other cores".into()),
        CacheRun::Detached(_) if k.error.is_some() => ("detached", format!("{why}: not served")),
        CacheRun::Detached(why) if k.bare => (
            "degraded",
            format!(
                "{why}; serving the bare core (forced: dirty data on the missing cache device is not in it)"
            ),
        ),
        CacheRun::Detached(why) => (
            "detached",
            format!(
                "{why}; the bare core is not served because it may lack dirty data (force_bare_core = true in the config to serve it anyway)"
            ),
        ),
    }
}

pub(super) fn load_summary(r: &LoadReport) -> Value {
    json!({"clean_stop": r.clean, "lines": r.lines, "dirty_lines": r.dirty_lines,
        "dropped_clean_lines": r.dropped_clean_lines, "journal_records": r.journal_records,
        "cores": r.cores.iter().map(|e| json!({"core_id": e.id, "export": e.export_name,
            "size_bytes": e.size_blocks * BLOCK_BYTES})).collect::<Vec<_>>()})
}

impl Registry {
    /// Cache ids.
    pub fn ids(&self) -> Vec<u16> {
        self.lock().keys().copied().collect()
    }

    /// `list`.
    pub fn list(&self) -> Value {
        let caches = self.lock();
        let mut out = Vec::new();
        for c in caches.values() {
            let mut dirty_b = 0;
            let (mode, lines, occ, dirty, why) = match &c.run {
                CacheRun::Running(e) => {
                    dirty_b = dirty_bytes(e);
                    let mode = mode_name(e);
                    let why = crate::health::states(e).0.map_or(Value::Null, Value::from);
                    e.with_cache(|k| (mode, k.config().lines, k.occupancy(), k.dirty_lines(), why))
                }
                CacheRun::Incomplete(_, r, _) => (
                    "-".into(),
                    r.superblock.lines,
                    0,
                    r.dirty_lines,
                    json!(format!(
                        "cores not attached: {}",
                        missing_cores(c, r).join(", ")
                    )),
                ),
                CacheRun::Detached(w) => ("-".into(), 0, 0, 0, json!(w)),
            };
            let states = core_states(c);
            // Per core, where the cache runs: dirty lines and read requests (all, hits) since
            // the counters were reset (O(1) each).
            let per_core = |id: u16| -> (Value, u64, u64) {
                match &c.run {
                    CacheRun::Running(e) => e.with_cache(|k| {
                        let id = CoreId(id);
                        let r = k.core_counters(id).map(|n| n.read);
                        let (all, hits) =
                            r.map_or((0, 0), |r| (r.total(), r.full_hit + r.partial_hit));
                        (json!(k.core_dirty_lines(id)), all, hits)
                    }),
                    _ => (Value::Null, 0, 0),
                }
            };
            let ratio = |all: u64, hits: u64| -> Value {
                if all > 0 {
                    json!(hits as f64 / all as f64)
                } else {
                    Value::Null
                }
            };
            let (mut reads, mut read_hits) = (0, 0);
            let cores: Vec<Value> = c
                .cores
                .iter()
                .map(|(i, k)| {
                    let (state, why) = states.get(i).cloned().unwrap_or_default();
                    let (dirty_lines, all, hits) = per_core(*i);
                    reads += all;
                    read_hits += hits;
                    json!({"core_id": i, "device": k.device, "export": k.export,
                        "size_bytes": k.size_blocks * BLOCK_BYTES, "state": state, "reason": why,
                        "io_timeout_ms": k.io_timeout.map(|t| t.as_millis() as u64),
                        "dirty_lines": dirty_lines, "read_hit_ratio": ratio(all, hits)})
                })
                .collect();
            out.push(
                json!({"cache_id": c.id, "device": c.device, "state": c.state(),
                "io_timeout_ms": c.io_timeout.map(|t| t.as_millis() as u64),
                "mode": mode, "line_size": c.line_size.bytes(), "lines": lines,
                "occupancy_lines": occ, "dirty_lines": dirty, "dirty_bytes": dirty_b,
                "read_hit_ratio": ratio(reads, read_hits),
                "reason": why,
                "cores": cores}),
            );
        }
        Value::Array(out)
    }

    /// The writeback rate since the last sample (blocks/s), and takes a new sample.
    pub fn writeback_rate(&self, cache_id: u16, wb_blocks: u64) -> f64 {
        let mut caches = self.lock();
        let Some(c) = caches.get_mut(&cache_id) else {
            return 0.0;
        };
        let (t, n) = c.wb_sample;
        let dt = t.elapsed().as_secs_f64();
        let rate = if dt > 0.0 {
            wb_blocks.saturating_sub(n) as f64 / dt
        } else {
            0.0
        };
        if dt > 1.0 {
            c.wb_sample = (Instant::now(), wb_blocks);
        }
        rate
    }

    /// Line size and whether the cache is volatile.
    pub fn geometry(&self, cache_id: u16) -> Option<(LineSize, bool, String)> {
        self.lock()
            .get(&cache_id)
            .map(|c| (c.line_size, c.volatile, c.device.clone()))
    }

    /// Core ids and export names of a cache.
    pub fn cores(&self, cache_id: u16) -> Vec<(u16, String, String, &'static str)> {
        self.lock()
            .get(&cache_id)
            .map(|c| {
                let states = core_states(c);
                c.cores
                    .iter()
                    .map(|(i, k)| {
                        let st = states.get(i).map_or("detached", |x| x.0);
                        (*i, k.device.clone(), k.export.clone(), st)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Compares every running cache's health with what was seen last and logs the problems
    /// that started and ended ([`crate::health::Watch`]); the daemon calls it every 250 ms.
    pub fn poll_health(&self) {
        let engines = self.engines();
        self.watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll(&engines);
    }

    /// The engines of the running caches (for the health watcher).
    pub fn engines(&self) -> Vec<(u16, Arc<Engine>)> {
        self.lock()
            .values()
            .filter_map(|c| match &c.run {
                CacheRun::Running(e) => Some((c.id, e.clone())),
                _ => None,
            })
            .collect()
    }

    /// The IO timeouts in force: the cache device's and each core's (milliseconds).
    pub fn io_timeouts(&self, cache_id: u16) -> (Option<u64>, BTreeMap<u16, u64>) {
        let ms = |t: Duration| t.as_millis() as u64;
        self.lock()
            .get(&cache_id)
            .map_or_else(Default::default, |c| {
                (
                    c.io_timeout.map(ms),
                    c.cores
                        .iter()
                        .filter_map(|(i, k)| Some((*i, ms(k.io_timeout?))))
                        .collect(),
                )
            })
    }

    /// State word of a cache.
    pub fn state(&self, cache_id: u16) -> Option<&'static str> {
        self.lock().get(&cache_id).map(|c| c.state())
    }
}
