//! NBD exports: resolving an export name to its target, the export list, the server's statistics.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

/// The longest a new connection waits for an RBD image's current size (the registry is locked
/// meanwhile): the core's IO timeout, at most this, and this when it has none.
pub(super) const RBD_SIZE_WAIT: Duration = Duration::from_secs(5);

/// The size in blocks a local core device has now (files and block devices; `None` for others
/// or when it cannot be read).
pub(super) fn current_blocks(device: &str) -> Option<u64> {
    use std::os::unix::fs::FileTypeExt;
    let spec = DeviceSpec::parse(device).ok()?;
    let p = spec.path()?;
    let md = std::fs::metadata(p).ok()?;
    if md.is_file() {
        Some(md.len() / BLOCK_BYTES)
    } else if md.file_type().is_block_device() {
        spec.open(device).ok().map(|d| d.blocks())
    } else {
        None
    }
}

impl Registry {
    /// Resolves an export name.
    pub fn export(&self, name: &str) -> Result<ExportTarget, String> {
        let mut caches = self.lock();
        let found = caches.values().find_map(|c| {
            c.cores
                .iter()
                .find(|(_, k)| k.export == name && !name.is_empty())
                .map(|(i, _)| (c.id, *i))
        });
        let Some((cid, i)) = found else {
            return Err(format!("no export named '{name}'"));
        };
        let c = caches.get_mut(&cid).expect("found above");
        let engine = match &c.run {
            CacheRun::Running(_) if c.cores[&i].unattached(c) => {
                return Err(format!("not served: {}", core_state(c, &c.cores[&i]).1));
            }
            CacheRun::Running(e) => e.clone(),
            CacheRun::Detached(_) if c.cores[&i].bare => {
                let k = &c.cores[&i];
                return k
                    .dev
                    .clone()
                    .map(ExportTarget::Bare)
                    .ok_or_else(|| format!("core device {} is missing", k.device));
            }
            _ => return Err(format!("not served: {}", core_state(c, &c.cores[&i]).1)),
        };
        let line_size = c.line_size;
        let k = c.cores.get_mut(&i).expect("found above");
        // SPEC C22: a core that grew is picked up by the next connection; a shrink below cached
        // data is refused (and the export with it).
        let now = current_blocks(&k.device).or_else(|| {
            k.rbd
                .as_ref()
                .and_then(|r| r.refresh_size_within(rbd_wait(k.io_timeout, RBD_SIZE_WAIT)))
        });
        if let Some(now) = now
            && now != k.size_blocks
        {
            // An RBD image is held open (and locked) once: its handle sees the new size.
            // Reopened (not an RBD image) behind the core's IO timeout, if it has one.
            let (dev, timer) = match (&k.rbd, &k.dev) {
                (Some(_), Some(d)) => (d.clone(), k.timer.clone()),
                _ => timed(DeviceSpec::parse(&k.device)?.open(&k.device)?, k.io_timeout),
            };
            match engine.resize_core(CoreId(i), dev.clone()) {
                Ok(()) => {
                    crate::log!(
                        info,
                        "core resized",
                        cache = cid,
                        core = i,
                        from_bytes = k.size_blocks * BLOCK_BYTES,
                        to_bytes = now * BLOCK_BYTES
                    );
                    k.size_blocks = now;
                    k.dev = Some(dev);
                    k.timer = timer;
                }
                Err(why) => {
                    crate::log!(
                        error,
                        "core resize refused",
                        cache = cid,
                        core = i,
                        reason = why
                    );
                    return Err(format!("not served: {why}"));
                }
            }
        }
        Ok(ExportTarget::Cached(engine, CoreId(i), line_size))
    }

    /// Remembers the NBD server (its counters are read by `/metrics`).
    pub fn set_nbd_server(&self, s: std::sync::Weak<tiercache_nbd::Server>) {
        *self.nbd.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// The NBD server's counters, while it runs.
    pub fn nbd_stats(&self) -> Option<tiercache_nbd::ServerStats> {
        let s = self.nbd.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.and_then(|w| w.upgrade()).map(|s| s.stats())
    }

    /// The request statistics of export `name` (made at first use, then kept).
    pub fn request_stats(&self, name: &str) -> Arc<tiercache_nbd::RequestStats> {
        let mut m = self.request_stats.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(name.to_string()).or_default().clone()
    }

    /// Every export: (name, description, served).
    pub fn exports(&self) -> Vec<(String, String)> {
        let caches = self.lock();
        let mut v = Vec::new();
        for c in caches.values() {
            let states = core_states(c);
            for (i, k) in c.cores.iter().filter(|(_, k)| !k.export.is_empty()) {
                let state = states.get(i).map_or("detached", |x| x.0);
                v.push((
                    k.export.clone(),
                    format!("cache {} core {i} ({}) {state}", c.id, k.device),
                ));
            }
        }
        v
    }
}
