//! `writeback` and its cancellation: waiting while writeback makes progress, failing with one line
//! when it stalls (module docs of `registry`); the `wl` drain.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

impl Registry {
    /// Writes every dirty line back; `only` waits for one core's lines only. Calls `progress`
    /// with (lines written back, lines that were dirty) about every 200 ms. Retries failing
    /// writeback at once, then fails with one line when it keeps failing (see the module
    /// docs).
    pub fn writeback(
        &self,
        cache_id: u16,
        only: Option<u16>,
        progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        self.writeback_for(cache_id, only, WbFor::Writeback, progress)
    }

    /// `writeback --cancel` (or a `writeback` whose client went away): every `writeback`
    /// command waiting on the cache stops and answers with what it wrote and what is still
    /// dirty; the lines are no longer written back regardless of the cleaning policy (the
    /// writeback jobs already running finish, and the policy cleans as it would have).
    /// `stop-cache` and `remove-core` are not cancelled by it.
    pub fn cancel_writeback(&self, cache_id: u16) -> Result<Value, String> {
        let e = self.engine(cache_id)?;
        let was = e.with_cache(|c| c.cancel_writeback());
        *self.wb_cancels.lock().unwrap().entry(cache_id).or_default() += 1;
        let (lines, blocks) = e.with_cache(|c| (c.dirty_lines() as u64, c.dirty_blocks()));
        crate::log!(
            info,
            "writeback cancelled",
            cache = cache_id,
            running = was,
            dirty_lines = lines
        );
        Ok(json!({"cache_id": cache_id, "was_running": was,
            "dirty_lines": lines, "dirty_bytes": blocks * BLOCK_BYTES}))
    }

    pub(super) fn wb_cancel_count(&self, cache_id: u16) -> u64 {
        self.wb_cancels
            .lock()
            .unwrap()
            .get(&cache_id)
            .copied()
            .unwrap_or(0)
    }

    /// The one line a cancelled `writeback` answers with.
    pub(super) fn wb_cancelled(
        cache_id: u16,
        written: u64,
        left: u64,
        unit: &str,
        unit_bytes: u64,
        t0: Instant,
    ) -> String {
        format!(
            "writeback of cache {cache_id} cancelled after {:.1} s: {} ({written} {unit}) written back, {} ({left} {unit}) still dirty",
            t0.elapsed().as_secs_f64(),
            human(written * unit_bytes),
            human(left * unit_bytes),
        )
    }

    pub(super) fn writeback_for(
        &self,
        cache_id: u16,
        only: Option<u16>,
        who: WbFor,
        mut progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let e = match only {
            Some(k) => self.check_core(cache_id, k)?,
            None => self.engine(cache_id)?,
        };
        // Only `writeback` itself can be cancelled.
        let cancels0 = (who == WbFor::Writeback).then(|| self.wb_cancel_count(cache_id));
        let cancelled = || cancels0.is_some_and(|n| self.wb_cancel_count(cache_id) != n);
        if e.is_wl() {
            return self.writeback_wl(cache_id, &e, only, who, &cancelled, progress);
        }
        let line_bytes = e.with_cache(|c| c.config().line_size.bytes());
        let dirty = |c: &Cache| match only {
            Some(k) => c.core_lines(CoreId(k)).1 as u64,
            None => c.dirty_lines() as u64,
        };
        // Failed attempts so far, per core (`None`: reading the cache device).
        let failures = |c: &Cache| -> BTreeMap<Option<u16>, u64> {
            let mut m: BTreeMap<Option<u16>, u64> = (0..=CORE_ID_MAX)
                .filter_map(|i| Some((Some(i), c.core_faults(CoreId(i))?.writeback.failures)))
                .collect();
            m.insert(None, c.faults().writeback_reads.failures);
            m
        };
        let (total, failures0) = e.with_cache(|c| {
            c.retry_writeback_now();
            c.start_writeback();
            (dirty(c), failures(c))
        });
        let t0 = Instant::now();
        let (mut least, mut moved) = (total, Instant::now());
        loop {
            let (left, running, st) =
                e.with_cache(|c| (dirty(c), c.writeback_running(), c.writeback_status()));
            progress(total.saturating_sub(left), total.max(left), "lines");
            if left == 0 {
                break;
            }
            if cancelled() {
                let written = total.saturating_sub(left);
                return Err(Self::wb_cancelled(
                    cache_id, written, left, "lines", line_bytes, t0,
                ));
            }
            if left < least {
                (least, moved) = (left, Instant::now());
            }
            // Failing, tried again since this wait began, and nothing written back lately.
            let failed = st.failing.iter().find(|f| {
                (only.is_none() || f.core.is_none() || f.core == only.map(CoreId))
                    && f.failures > failures0.get(&f.core.map(|k| k.0)).copied().unwrap_or(0)
            });
            if let Some(f) = failed
                && moved.elapsed() >= STALL_GRACE
            {
                return Err(self.writeback_failed(cache_id, &e, f, who));
            }
            if !running {
                e.with_cache(|c| c.start_writeback());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.markers_after_writeback(cache_id, &e, only)?;
        Ok(json!({"cache_id": cache_id, "lines_written_back": total,
            "seconds": t0.elapsed().as_secs_f64()}))
    }

    /// What to do when a wait for writeback gives up, for each verb.
    pub(super) fn instead(cache_id: u16, core: Option<u16>, who: WbFor) -> String {
        match (who, core) {
            (WbFor::Writeback, _) => format!(
                "repair it and run `tiercache writeback --cache-id {cache_id}` again (it retries at once), or `tiercache stop-cache --cache-id {cache_id} --no-writeback` to stop and keep the dirty data on the cache device"
            ),
            (WbFor::Stop, _) | (WbFor::Remove, None) => format!(
                "repair it and try again, or `tiercache stop-cache --cache-id {cache_id} --no-writeback` to stop now and keep the dirty data on the cache device (written back after `start-cache --load`)"
            ),
            (WbFor::Remove, Some(k)) => format!(
                "repair it and try again; or `tiercache stop-cache --cache-id {cache_id} --no-writeback` keeps the dirty data on the cache device, and `tiercache invalidate --cache-id {cache_id} --core-id {k} --force` drops it (lost)"
            ),
        }
    }

    /// The one line a wait for writeback fails with: which core, since when, the error, how
    /// much dirty data, and what to do instead.
    pub(super) fn writeback_failed(
        &self,
        cache_id: u16,
        e: &Engine,
        f: &WritebackFailure,
        who: WbFor,
    ) -> String {
        let now = e.now();
        let core = f.core.map(|k| k.0);
        let dirty_bytes = e.with_cache(|c| match f.core {
            Some(k) => c
                .core_health(k)
                .and_then(|h| {
                    h.problems.iter().find_map(|p| match p {
                        Problem::Writeback { dirty_blocks, .. } => Some(*dirty_blocks),
                        _ => None,
                    })
                })
                .unwrap_or(0),
            None => c.dirty_blocks(),
        }) * BLOCK_BYTES;
        let what = match core {
            Some(k) => {
                let dev = self
                    .lock()
                    .get(&cache_id)
                    .and_then(|c| c.cores.get(&k).map(|x| x.device.clone()))
                    .unwrap_or_default();
                format!("writeback to core {k} ({dev}) of cache {cache_id}")
            }
            None => format!(
                "writeback of cache {cache_id} (reading its dirty data from the cache device)"
            ),
        };
        format!(
            "{what} has been failing since {} ({:.0} s; {}; {} failed attempts): {} of dirty data ({} lines) stay on the cache device; {}",
            utc(wall(f.since, now)),
            now.0.saturating_sub(f.since.0) as f64 / 1e9,
            err_name(f.last_error),
            f.failures,
            human(dirty_bytes),
            f.dirty_lines,
            Self::instead(cache_id, core, who)
        )
    }

    /// `writeback` of a write log (PWL's `persistent-cache flush`): the log is written back
    /// generation by generation all the time; this waits until nothing of the core(s) is left
    /// in it, with progress in blocks.
    pub(super) fn writeback_wl(
        &self,
        cache_id: u16,
        e: &Engine,
        only: Option<u16>,
        who: WbFor,
        cancelled: &dyn Fn() -> bool,
        mut progress: impl FnMut(u64, u64, &'static str),
    ) -> Result<Value, String> {
        let left = || {
            e.with_machine(|m| {
                let w = m.wl_mut().expect("a write log");
                w.set_writeback_paused(false);
                w.drain();
                (w.pending(only.map(CoreId)), w.counters().wb_errors)
            })
        };
        let ((_, total), errors0) = left();
        let t0 = Instant::now();
        let (mut least, mut moved) = (total, Instant::now());
        loop {
            let ((entries, blocks), errors) = left();
            progress(total.saturating_sub(blocks), total.max(blocks), "blocks");
            if entries == 0 {
                break;
            }
            // The log goes on being written back: only the wait ends.
            if cancelled() {
                let written = total.saturating_sub(blocks);
                return Err(Self::wb_cancelled(
                    cache_id, written, blocks, "blocks", 512, t0,
                ));
            }
            if blocks < least {
                (least, moved) = (blocks, Instant::now());
            }
            // The log is written back in order: a failing core holds back everything after it.
            if errors > errors0 && moved.elapsed() >= STALL_GRACE {
                let now = e.now();
                let why = e.with_machine(|m| {
                    if let Some(Problem::LogDevice {
                        since, last_error, ..
                    }) = m.wl().and_then(|w| w.log_problem())
                    {
                        return format!(
                            "the log on the cache device has been failing since {} ({})",
                            utc(wall(since, now)),
                            err_name(last_error)
                        );
                    }
                    let c = m.cache();
                    let failing = (0..=CORE_ID_MAX).find_map(|i| {
                        let f = c.core_faults(CoreId(i))?;
                        let since = f.failing_since?;
                        Some((i, since, f.device.last.map_or(IoError::Io, |x| x.0)))
                    });
                    match failing {
                        Some((k, since, err)) => format!(
                            "core {k} has been failing since {} ({})",
                            utc(wall(since, now)),
                            err_name(err)
                        ),
                        None => "reading the log or writing the cores fails".to_string(),
                    }
                });
                return Err(format!(
                    "writeback of the write log of cache {cache_id} is failing: {why}; {} writeback errors since this command began; {} of logged data stay in the log on the cache device; {}",
                    errors - errors0,
                    human(blocks * BLOCK_BYTES),
                    Self::instead(cache_id, only, who)
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.markers_after_writeback(cache_id, e, only)?;
        Ok(
            json!({"cache_id": cache_id, "bytes_written_back": total * BLOCK_BYTES,
            "seconds": t0.elapsed().as_secs_f64()}),
        )
    }

    /// After a writeback (of core `only`, or of all): nothing of those cores is dirty now, so
    /// their RBD markers go unless the mode may dirty them again.
    pub(super) fn markers_after_writeback(
        &self,
        cache_id: u16,
        e: &Engine,
        only: Option<u16>,
    ) -> Result<(), String> {
        let _m = lock_markers(&self.markers);
        let rbds: Vec<_> = self
            .rbd_cores(cache_id)
            .into_iter()
            .filter(|(i, ..)| only.is_none_or(|k| k == *i))
            .collect();
        if !rbds.is_empty() {
            sync_markers(e, &rbds, false)?;
        }
        Ok(())
    }

    /// The RBD cores of a cache, with their handles and dirty-marker waits ([`rbd_markers`]).
    pub(super) fn rbd_cores(&self, cache_id: u16) -> Vec<(u16, Arc<RbdBackend>, Duration)> {
        self.lock()
            .get(&cache_id)
            .map_or(Vec::new(), |c| rbd_markers(&c.cores))
    }
}
