//! `remove-core`, `stop-cache` and the daemon's shutdown.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

/// A stop step's core flush result: the first failure is logged (one warning) and kept for
/// the answer's `core_flush_failed`; later ones of the same stop add nothing.
pub(super) fn note_flush_failure(
    cache_id: u16,
    r: Result<(), String>,
    failed: &mut Option<String>,
) {
    if let Err(why) = r
        && failed.is_none()
    {
        crate::log!(
            warn,
            "core flush failed at stop (writes no client flushed may not be durable on it)",
            cache = cache_id,
            reason = why
        );
        *failed = Some(why);
    }
}

impl Registry {
    /// `remove-core`.
    pub fn remove_core(
        &self,
        cache_id: u16,
        core_id: u16,
        no_writeback: bool,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        {
            // A core of the config file that never attached: nothing of it is in the cache.
            let mut caches = self.lock();
            if let Some(c) = caches.get_mut(&cache_id)
                && c.cores.get(&core_id).is_some_and(|k| k.unattached(c))
            {
                c.cores.remove(&core_id);
                crate::log!(info, "core removed", cache = cache_id, core = core_id);
                return Ok(json!({"cache_id": cache_id, "core_id": core_id, "removed": true}));
            }
        }
        let e = self.check_core(cache_id, core_id)?;
        if !no_writeback {
            self.writeback_for(cache_id, Some(core_id), WbFor::Remove, progress)?;
        } else if core_has_dirty(&e, core_id) {
            let blocks = match e
                .with_machine(|m| m.wl().map(|w| w.pending(Some(CoreId(core_id))).1))
            {
                Some(b) => b,
                None => e.with_cache(|c| {
                    c.core_lines(CoreId(core_id)).1 as u64 * c.config().line_size.blocks() as u64
                }),
            };
            return Err(format!(
                "core {core_id} of cache {cache_id} has dirty data (up to {}) and --no-writeback removes a core only when it has none: write it back with `tiercache writeback --cache-id {cache_id} --core-id {core_id}`, keep it on the cache device with `tiercache stop-cache --cache-id {cache_id} --no-writeback`, or drop it with `tiercache invalidate --cache-id {cache_id} --core-id {core_id} --force` (lost)",
                human(blocks * BLOCK_BYTES)
            ));
        }
        let mut tries = 0;
        loop {
            match e.remove_core(CoreId(core_id)) {
                Ok(()) => break,
                Err(m) if m.contains("in flight") && tries < 500 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(m) => return Err(m),
            }
        }
        let removed = {
            let mut caches = self.lock();
            caches
                .get_mut(&cache_id)
                .and_then(|c| c.cores.remove(&core_id))
        };
        // The cache holds nothing of it any more.
        if let Some(r) = removed.and_then(|k| k.rbd) {
            let _m = lock_markers(&self.markers);
            if let Err(e) = r.set_dirty_marker(None) {
                crate::log!(
                    warn,
                    "dirty marker not removed",
                    cache = cache_id,
                    core = core_id,
                    reason = e
                );
            }
        }
        crate::log!(info, "core removed", cache = cache_id, core = core_id);
        Ok(json!({"cache_id": cache_id, "core_id": core_id, "removed": true}))
    }

    /// `stop-cache`: writeback (unless `no_writeback`), final checkpoint, devices flushed.
    pub fn stop_cache(
        &self,
        cache_id: u16,
        no_writeback: bool,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let running = {
            let caches = self.lock();
            let c = caches
                .get(&cache_id)
                .ok_or_else(|| format!("no cache {cache_id}"))?;
            matches!(c.run, CacheRun::Running(_))
        };
        let mut dirty = 0;
        let mut dirty_b = 0;
        if running && !no_writeback {
            self.writeback_for(cache_id, None, WbFor::Stop, progress)?;
        }
        // Problems that ended (the writeback above) are logged as ended before the cache
        // leaves the watcher's view (between two polls they would go without a line).
        self.poll_health();
        let entry = self.lock().remove(&cache_id);
        let Some(entry) = entry else {
            return Err(format!("no cache {cache_id}"));
        };
        // For a later `start-cache --load`: the cores' IO timeouts as they were.
        if matches!(entry.run, CacheRun::Running(_)) {
            let mut t = self.known_core_timeouts(&entry.device);
            t.extend(
                entry
                    .cores
                    .iter()
                    .filter_map(|(i, k)| Some((*i, k.io_timeout?))),
            );
            self.remember_core_timeouts(&entry.device, t);
        }
        let mut flush_failed = None;
        if let CacheRun::Running(e) = entry.run {
            // NBD connections may still hold the engine: stop it in place (final checkpoint,
            // core flushes; their later requests fail), then let it go. A core whose flush
            // fails does not keep the cache from stopping (its checkpoint is written): said
            // in the log and the answer.
            note_flush_failure(cache_id, e.stop_shared(), &mut flush_failed);
            // What stays dirty, counted once stopped: writeback runs until the stop (it kept
            // going after an earlier count, and the answer said more than the device held).
            dirty = e.with_cache(|c| c.dirty_lines());
            // For a write log: what stays in the log on the device (what `inspect` and the
            // next load find), including entries written back in a generation the stop
            // left unretired.
            dirty_b = e.with_machine(|m| match m.wl() {
                Some(w) => w.logged_blocks() * BLOCK_BYTES,
                None => m.cache().dirty_blocks() * BLOCK_BYTES,
            });
            // Stopped: nothing can become dirty any more; an RBD core keeps its marker only if
            // dirty lines of it stay on the cache device.
            let rbds = rbd_markers(&entry.cores);
            if !rbds.is_empty() {
                let _m = lock_markers(&self.markers);
                if let Err(why) = sync_markers(&e, &rbds, true) {
                    crate::log!(
                        warn,
                        "dirty marker not updated",
                        cache = cache_id,
                        reason = why
                    );
                }
            }
            let mut e = e;
            for _ in 0..50 {
                match Arc::try_unwrap(e) {
                    Ok(x) => {
                        note_flush_failure(cache_id, x.stop(), &mut flush_failed);
                        break;
                    }
                    Err(a) => {
                        e = a;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
        crate::log!(
            info,
            "cache stopped",
            cache = cache_id,
            dirty_lines = dirty,
            dirty_bytes = dirty_b
        );
        Ok(
            json!({"cache_id": cache_id, "stopped": true, "dirty_lines_kept": dirty,
            "dirty_bytes_kept": dirty_b, "core_flush_failed": flush_failed}),
        )
    }

    /// Stops every cache (daemon shutdown): dirty data stays persisted, nothing is written back.
    pub fn stop_all(&self) {
        for id in self.ids() {
            if let Err(e) = self.stop_cache(id, true, |_, _, _| {}) {
                crate::log!(error, "stopping a cache failed", cache = id, error = e);
            }
        }
    }
}
