//! Verbs on a running cache: `set-mode`, `io-class load`/`list`, `invalidate`, `reset-counters`.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

impl Registry {
    /// Runs `f` on a cache's core (parameters, modes, counters).
    pub fn with_cache<R>(
        &self,
        cache_id: u16,
        f: impl FnOnce(&mut Cache) -> Result<R, String>,
    ) -> Result<R, String> {
        self.engine(cache_id)?.with_cache(f)
    }

    /// `set-mode`.
    pub fn set_mode(&self, cache_id: u16, mode: &str) -> Result<Value, String> {
        let wl_refusal = "a cache cannot switch to or from mode wl (the log and the read cache have their own layout): stop the cache (it writes back first) and start-cache --force --mode ... on the device";
        if mode_word(mode) == "wl" {
            return Err(wl_refusal.into());
        }
        let m = CacheMode::parse(mode)
            .ok_or_else(|| format!("unknown mode '{mode}' (want wt, wb, wa, wi, pt or wo)"))?;
        let e = self.engine(cache_id)?;
        if e.is_wl() {
            return Err(wl_refusal.into());
        }
        {
            // A lazy mode may dirty any core at once: mark RBD cores first. A non-lazy one
            // lets their markers go when nothing is dirty any more.
            let _m = lock_markers(&self.markers);
            let rbds = self.rbd_cores(cache_id);
            if m.is_lazy() {
                let uuid = engine_uuid(&e);
                for (i, r, wait) in &rbds {
                    r.set_dirty_marker_within(Some(&uuid), *wait)
                        .map_err(|err| {
                            format!(
                                "core {i}: cannot set the dirty marker, mode not changed: {err}"
                            )
                        })?;
                }
            }
            e.with_cache(|c| c.set_mode(m).map_err(|e| e.to_string()))?;
            if !m.is_lazy() && !rbds.is_empty() {
                sync_markers(&e, &rbds, false)?;
            }
        }
        e.wait(|c| c.tables_durable());
        let (now, target) = e.with_cache(|c| (c.mode(), c.target_mode()));
        Ok(json!({"cache_id": cache_id, "mode": now.to_string(),
            "switching_to": target.map(|t| t.to_string())}))
    }

    /// `io-class load`.
    pub fn io_class_load(&self, cache_id: u16, csv: &str) -> Result<Value, String> {
        let t = IoClassTable::parse_csv(csv).map_err(|e| e.to_string())?;
        let n = t.classes().count();
        let e = self.engine(cache_id)?;
        e.with_cache(|c| c.load_io_classes(t));
        e.wait(|c| c.tables_durable());
        Ok(json!({"cache_id": cache_id, "classes": n}))
    }

    /// `io-class list`.
    pub fn io_class_list(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        Ok(e.with_cache(|c| {
            let classes: Vec<Value> = c
                .io_classes()
                .classes()
                .map(|k| {
                    json!({"id": k.id, "name": k.name,
                        "eviction_priority": k.priority.map_or("pinned".to_string(), |p| p.to_string()),
                        "allocation": k.allocation_pct as f64 / 100.0,
                        "lines": c.class_lines(k.id)})
                })
                .collect();
            json!({"cache_id": cache_id, "csv": c.io_classes().to_csv(), "classes": classes})
        }))
    }

    /// `invalidate`.
    pub fn invalidate(&self, cache_id: u16, core_id: u16) -> Result<Value, String> {
        let e = self.check_core(cache_id, core_id)?;
        if e.is_wl() {
            let dropped =
                e.with_machine(|m| m.wl_mut().expect("a write log").invalidate(CoreId(core_id)))?;
            e.wait(|m| m.wl().is_some_and(|w| w.invalidate_done().0));
            let lines = e
                .with_cache(|c| c.invalidate_core(CoreId(core_id)))
                .map(|x| x.0)
                .unwrap_or(0);
            crate::log!(
                warn,
                "core invalidated",
                cache = cache_id,
                core = core_id,
                log_blocks_dropped = dropped
            );
            return Ok(
                json!({"cache_id": cache_id, "core_id": core_id, "lines_dropped": lines,
                "dirty_bytes_dropped": dropped * BLOCK_BYTES}),
            );
        }
        let mut tries = 0;
        let (lines, dirty) = loop {
            match e.with_cache(|c| c.invalidate_core(CoreId(core_id))) {
                Ok(x) => break x,
                Err(m) if m.to_string().contains("in flight") && tries < 500 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(m) => return Err(m.to_string()),
            }
        };
        e.wait(|c| c.tables_durable());
        crate::log!(
            warn,
            "core invalidated",
            cache = cache_id,
            core = core_id,
            lines = lines,
            dirty_blocks_dropped = dirty
        );
        Ok(
            json!({"cache_id": cache_id, "core_id": core_id, "lines_dropped": lines,
            "dirty_bytes_dropped": dirty * BLOCK_BYTES}),
        )
    }

    /// `reset-counters`.
    pub fn reset_counters(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        e.with_cache(|c| c.reset_counters());
        if let Some(c) = self.lock().get_mut(&cache_id) {
            c.wb_sample = (Instant::now(), 0);
        }
        Ok(json!({"cache_id": cache_id, "reset": true}))
    }
}
