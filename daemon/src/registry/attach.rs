//! Cores: `add-core` (attach, or record one whose cache is not there yet), the checks that a device
//! is free and not another user's, IO timeouts, lookups.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

/// Gives attached core `core` the IO timeout `t`: a device already behind a timeout gets the
/// new limit (IOs started afterwards use it); one without is wrapped, and `engine`, when the
/// cache runs, serves the core from the wrapped handle from now on.
pub(super) fn retime(
    cache_id: u16,
    core: u16,
    k: &mut CoreEntry,
    t: Duration,
    engine: Option<&Engine>,
) -> Result<(), String> {
    if k.io_timeout == Some(t) {
        return Ok(());
    }
    match &k.timer {
        Some(w) => w.set_timeout(t),
        None => {
            let dev = k
                .dev
                .clone()
                .ok_or_else(|| format!("core {core} of cache {cache_id} is not attached"))?;
            let (d, w) = timed(dev, Some(t));
            if let Some(e) = engine {
                e.replace_core_device(CoreId(core), d.clone())?;
            }
            k.dev = Some(d);
            k.timer = w;
        }
    }
    k.io_timeout = Some(t);
    crate::log!(
        info,
        "core io timeout set",
        cache = cache_id,
        core = core,
        io_timeout = crate::device::show_timeout(t)
    );
    Ok(())
}

/// Export names: 1–255 printable characters without spaces or `/`... as NBD allows, kept simple.
pub(super) fn check_export_name(n: &str) -> Result<(), String> {
    if n.is_empty() || n.len() > 255 || !n.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "export name '{}' must be 1-255 printable ASCII characters without spaces",
            n.escape_debug()
        ));
    }
    Ok(())
}

/// Whether a block device is mounted or opened exclusively by someone else (O_EXCL fails).
/// [`Registry::claimable`]'s check against the caches listed.
pub(super) fn check_unheld(
    caches: &BTreeMap<u16, CacheEntry>,
    device: &str,
    id: &Identity,
    except: Option<(u16, u16)>,
) -> Result<(), String> {
    for c in caches.values() {
        let cores = c
            .cores
            .iter()
            .filter(|(i, k)| k.dev.is_some() && except != Some((c.id, **i)))
            .filter_map(|(i, k)| Some((Holder::Core(c.id, *i), k.held.as_ref()?, &k.device)));
        let cache = c.held.as_ref().map(|h| (Holder::Cache(c.id), h, &c.device));
        for (holder, h, shown) in cache.into_iter().chain(cores) {
            if let Some(how) = id.overlap(h) {
                return Err(refusal(device, how, holder, shown));
            }
        }
    }
    Ok(())
}

pub(super) fn other_user(spec: &DeviceSpec) -> bool {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let Some(p) = spec.path() else {
        return false;
    };
    let Ok(md) = std::fs::metadata(p) else {
        return false;
    };
    if !md.file_type().is_block_device() {
        return false;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(p)
        .is_err()
}

impl Registry {
    /// Remembers the IO timeouts of the cores of the cache on `device` (the config file's, or
    /// what the cores had when the cache stopped), for `start-cache --load`.
    pub fn remember_core_timeouts(&self, device: &str, t: BTreeMap<u16, Duration>) {
        self.core_timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(device.to_string(), t);
    }

    pub(super) fn known_core_timeouts(&self, device: &str) -> BTreeMap<u16, Duration> {
        self.core_timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(device)
            .cloned()
            .unwrap_or_default()
    }

    /// A core of the config file that could not be attached to cache `cache_id` (`error`):
    /// listed as `detached` with the error (a recorded core of an incomplete cache gets the
    /// error as its reason), until `add-core` attaches it. Its export name is kept unless
    /// another core has it (the error may be just that).
    pub fn note_unattached(
        &self,
        cache_id: u16,
        core_id: u16,
        device: &str,
        export: &str,
        error: &str,
    ) {
        let mut caches = self.lock();
        let taken = caches
            .values()
            .any(|c| c.cores.values().any(|k| k.export == export));
        let Some(c) = caches.get_mut(&cache_id) else {
            return;
        };
        if let Some(k) = c.cores.get_mut(&core_id) {
            if k.dev.is_none() {
                k.error = Some(error.to_string());
            }
            return;
        }
        c.cores.insert(
            core_id,
            CoreEntry {
                device: device.to_string(),
                dev: None,
                export: if taken {
                    String::new()
                } else {
                    export.to_string()
                },
                size_blocks: 0,
                bare: false,
                rbd: None,
                io_timeout: None,
                timer: None,
                error: Some(error.to_string()),
                held: None,
            },
        );
    }

    /// Registers a cache whose device is missing (reassembly from the config).
    pub fn add_detached(
        &self,
        id: u16,
        device: &str,
        why: String,
        cores: Vec<(u16, String, String, bool)>,
    ) {
        let _attach = lock_markers(&self.attach);
        let mut caches = self.lock();
        caches.insert(
            id,
            CacheEntry {
                id,
                device: device.to_string(),
                run: CacheRun::Detached(why),
                cores: BTreeMap::new(),
                line_size: LineSize::K4,
                volatile: false,
                wb_sample: (Instant::now(), 0),
                io_timeout: None,
                held: None,
            },
        );
        for (cid, dev, export, bare) in cores {
            // A bare core is opened only when no other device of this daemon is it.
            let opened = bare.then(|| {
                let spec = DeviceSpec::parse(&dev)?;
                let held = Identity::of(&spec, &dev)?;
                check_unheld(&caches, &dev, &held, None)?;
                let (d, rbd) = spec.open_core(&dev)?;
                Ok::<_, String>((d, rbd, held))
            });
            let (d, rbd, held, error) = match opened {
                Some(Ok((d, rbd, held))) => (Some(d), rbd, Some(held), None),
                Some(Err(e)) => {
                    crate::log!(
                        error,
                        "bare core not served",
                        cache = id,
                        core = cid,
                        reason = e
                    );
                    (None, None, None, Some(e))
                }
                None => (None, None, None, None),
            };
            let size_blocks = d.as_ref().map_or(0, |d| d.blocks());
            let entry = CoreEntry {
                device: dev,
                dev: d,
                export,
                size_blocks,
                bare,
                rbd,
                io_timeout: None,
                timer: None,
                error,
                held,
            };
            if let Some(c) = caches.get_mut(&id) {
                c.cores.insert(cid, entry);
            }
        }
    }

    /// `add-core`.
    pub fn add_core(
        &self,
        cache_id: u16,
        device: &str,
        core_id: Option<u16>,
        export: Option<&str>,
    ) -> Result<Value, String> {
        self.add_core_with(cache_id, device, core_id, export, None)
    }

    /// `add-core`, with the core device behind an IO timeout when one is given. A core already
    /// attached (by `--load`, or the same `add-core` again) gets the timeout when one is given
    /// and keeps its own otherwise.
    pub fn add_core_with(
        &self,
        cache_id: u16,
        device: &str,
        core_id: Option<u16>,
        export: Option<&str>,
        io_timeout: Option<Duration>,
    ) -> Result<Value, String> {
        let spec = DeviceSpec::parse(device)?;
        // Lock order: attach, markers, then the registry (then an engine). Held throughout, so
        // that no other attach takes the device between the identity check and the core being
        // listed, and a set-mode cannot switch to a lazy mode between the marker decision and
        // the core being listed.
        let _attach = lock_markers(&self.attach);
        let _markers = lock_markers(&self.markers);
        if let Some(i) = core_id
            && i > CORE_ID_MAX
        {
            return Err(format!("core id {i} is out of range (0-{CORE_ID_MAX})"));
        }
        if let Some(n) = export {
            check_export_name(n)?;
        }
        {
            let caches = self.lock();
            let c = caches
                .get(&cache_id)
                .ok_or_else(|| format!("no cache {cache_id}"))?;
            if let CacheRun::Detached(why) = &c.run {
                return Err(format!("cache {cache_id} is detached ({why})"));
            }
            // A core listed but not attached (of a detached cache, say) by its device string;
            // attached devices by their identity, below.
            for other in caches.values() {
                if let Some((i, _)) = other.cores.iter().find(|(i, x)| {
                    x.dev.is_none()
                        && x.device == device
                        && !(other.id == cache_id && (core_id == Some(**i) || x.unattached(other)))
                }) {
                    return Err(format!(
                        "{device} is already core {i} of cache {}",
                        other.id
                    ));
                }
            }
            if other_user(&spec) {
                return Err(format!(
                    "{device} is mounted or opened exclusively by another program; refusing to cache it"
                ));
            }
        }
        if !spec.present() {
            return Err(format!("{device}: no such file or device"));
        }
        // The same core added again (by id) is not another holder of it.
        let held = self.claimable(&spec, device, core_id.map(|i| (cache_id, i)))?;
        let identity = spec.identity(device, &held)?;
        // Opened only where it is attached: a core already attached keeps its one handle.
        let open = || {
            spec.open_core(device).map(|(d, rbd)| {
                let (d, timer) = timed(d, io_timeout);
                (d, timer, rbd)
            })
        };
        let mut caches = self.lock();
        let all_exports: Vec<String> = caches
            .values()
            .flat_map(|c| c.cores.values().map(|x| x.export.clone()))
            .collect();
        let c = caches
            .get_mut(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?;
        match &c.run {
            CacheRun::Incomplete(base, report, cache_dev) => {
                // Attach a recorded core: by id, else by identity.
                let e = report
                    .cores
                    .iter()
                    .find(|e| match core_id {
                        Some(i) => e.id as u16 == i,
                        None => e.identity.same_device(&identity),
                    })
                    .ok_or_else(|| {
                        format!(
                            "cache {cache_id} is incomplete and {device} is none of its recorded cores (missing: {})",
                            missing_cores(c, report).join(", ")
                        )
                    })?;
                if !e.identity.same_device(&identity) {
                    return Err(format!(
                        "core {} of cache {cache_id} was recorded as {}; {device} is {}: not the same device",
                        e.id, e.identity, identity
                    ));
                }
                if let Some(k) = c.cores.get_mut(&(e.id as u16))
                    && k.dev.is_some()
                {
                    if let Some(t) = io_timeout {
                        retime(cache_id, e.id as u16, k, t, None)?;
                    }
                    return Ok(json!({"cache_id": cache_id, "core_id": e.id,
                        "export": k.export, "already_attached": true, "state": "incomplete"}));
                }
                let (dev, timer, rbd) = open()?;
                if let Some(r) = &rbd {
                    check_marker(device, r, &hex(&report.superblock.cache_id))?;
                }
                // A core that grew is taken at its new size when the engine opens (SPEC C22).
                if e.size_blocks > dev.blocks() {
                    return Err(format!(
                        "core {} of cache {cache_id} was {} bytes, {device} is {}: it shrank, or it is not the same device",
                        e.id,
                        e.size_blocks * BLOCK_BYTES,
                        dev.blocks() * BLOCK_BYTES
                    ));
                }
                let id = e.id as u16;
                if let Some(n) = export
                    && all_exports.iter().any(|x| x == n)
                    && c.cores[&id].export != n
                {
                    return Err(format!("export name '{n}' is taken"));
                }
                let ce = c.cores.get_mut(&id).expect("recorded cores are listed");
                ce.device = device.to_string();
                ce.dev = Some(dev);
                ce.rbd = rbd;
                ce.io_timeout = io_timeout;
                ce.timer = timer;
                ce.error = None;
                ce.held = Some(held);
                if let Some(n) = export {
                    ce.export = n.to_string();
                }
                let missing = missing_cores(c, report);
                if !missing.is_empty() {
                    return Ok(
                        json!({"cache_id": cache_id, "core_id": id, "state": "incomplete",
                        "missing": missing}),
                    );
                }
                let base = (**base).clone();
                let specs: Vec<CoreSpec> = report
                    .cores
                    .iter()
                    .map(|e| CoreSpec {
                        id: CoreId(e.id as u16),
                        dev: c.cores[&(e.id as u16)].dev.clone().expect("all attached"),
                        record: CoreRecord {
                            identity: e.identity.clone(),
                            export_name: e.export_name.clone(),
                            device: e.device.clone(),
                        },
                    })
                    .collect();
                let (engine, rep) =
                    Engine::open_checked(&base, cache_dev.clone(), specs, engine_config())?;
                // Export names and device strings given now (config file, add-core) replace
                // the recorded ones.
                for e in &report.cores {
                    let k = &c.cores[&(e.id as u16)];
                    if k.export != e.export_name || k.device != e.device {
                        let rec = CoreRecord {
                            identity: e.identity.clone(),
                            export_name: k.export.clone(),
                            device: k.device.clone(),
                        };
                        engine.with_cache(|k| k.set_core_record(CoreId(e.id as u16), rec))?;
                    }
                }
                engine.wait(|k| k.tables_durable());
                // Before anything is served: the marker of every RBD core as the loaded cache
                // says (kept or set when it may have dirty data, removed when it cannot).
                let rbds = rbd_markers(&c.cores);
                if !rbds.is_empty()
                    && let Err(why) = sync_markers(&engine, &rbds, false)
                {
                    crate::log!(
                        error,
                        "dirty marker not updated",
                        cache = cache_id,
                        reason = why
                    );
                }
                c.run = CacheRun::Running(Arc::new(engine));
                crate::log!(
                    info,
                    "cache running",
                    cache = cache_id,
                    dirty_lines = rep.dirty_lines
                );
                Ok(
                    json!({"cache_id": cache_id, "core_id": id, "state": "running",
                    "loaded": load_summary(&rep)}),
                )
            }
            CacheRun::Running(engine) => {
                // Attaching a core that is already attached, by the same device (another name
                // for it is fine: the identity decides), changes nothing: reassembly after
                // `--load` attached the recorded cores by themselves.
                if let Some(i) = core_id
                    && c.cores.contains_key(&i)
                {
                    let rec = engine.with_cache(|k| k.core_record(CoreId(i)).cloned());
                    if rec
                        .as_ref()
                        .is_some_and(|r| r.identity.same_device(&identity))
                    {
                        if let Some(n) = export
                            && c.cores[&i].export != n
                        {
                            if all_exports.iter().any(|x| x == n) {
                                return Err(format!("export name '{n}' is taken"));
                            }
                            let mut r = rec.expect("checked");
                            r.export_name = n.to_string();
                            r.device = device.to_string();
                            engine.with_cache(|k| k.set_core_record(CoreId(i), r))?;
                            engine.wait(|k| k.tables_durable());
                            let ce = c.cores.get_mut(&i).expect("checked");
                            ce.export = n.to_string();
                            ce.device = device.to_string();
                        }
                        // A new IO timeout applies to the core as attached (e.g. by `--load`).
                        if let Some(t) = io_timeout {
                            let engine = engine.clone();
                            let k = c.cores.get_mut(&i).expect("checked");
                            retime(cache_id, i, k, t, Some(&engine))?;
                        }
                        return Ok(json!({"cache_id": cache_id, "core_id": i,
                            "export": c.cores[&i].export, "already_attached": true,
                            "io_timeout_ms": c.cores[&i].io_timeout.map(|t| t.as_millis() as u64)}));
                    }
                }
                // A core of the config file that did not attach at start (listed with its
                // error) is this one when the id, or else the device, is its: it takes its
                // place and, unless another is given, its export name.
                let waiting = match core_id {
                    Some(i) => c.cores.get(&i).filter(|k| k.dev.is_none()).map(|_| i),
                    None => c
                        .cores
                        .iter()
                        .find(|(_, k)| k.dev.is_none() && k.device == device)
                        .map(|(i, _)| *i),
                };
                let id = match core_id {
                    Some(i) if c.cores.contains_key(&i) && waiting != Some(i) => {
                        return Err(format!("core {i} of cache {cache_id} already exists"));
                    }
                    Some(i) => i,
                    None => match waiting {
                        Some(i) => i,
                        None => (0..=CORE_ID_MAX)
                            .find(|i| !c.cores.contains_key(i))
                            .ok_or("no free core id")?,
                    },
                };
                let own = waiting.map(|i| c.cores[&i].export.clone());
                let name = export
                    .map(str::to_string)
                    .or_else(|| own.clone().filter(|n| !n.is_empty()))
                    .unwrap_or_else(|| format!("cache{cache_id}-core{id}"));
                if all_exports.contains(&name) && own.as_ref() != Some(&name) {
                    return Err(format!("export name '{name}' is taken"));
                }
                let (dev, timer, rbd) = open()?;
                if let Some(r) = &rbd {
                    // Marked (in a lazy mode) before the core can get dirty data; set-mode
                    // waits for the marker lock, held here until the core is listed.
                    let uuid = engine_uuid(engine);
                    check_marker(device, r, &uuid)?;
                    let lazy = lazy_now(engine);
                    r.set_dirty_marker(lazy.then_some(uuid.as_str()))
                        .map_err(|e| format!("{device}: dirty marker: {e}"))?;
                }
                engine.add_core(CoreSpec {
                    id: CoreId(id),
                    dev: dev.clone(),
                    record: CoreRecord {
                        identity,
                        export_name: name.clone(),
                        device: device.to_string(),
                    },
                })?;
                c.cores.insert(
                    id,
                    CoreEntry {
                        device: device.to_string(),
                        size_blocks: dev.blocks(),
                        dev: Some(dev),
                        export: name.clone(),
                        bare: false,
                        rbd,
                        io_timeout,
                        timer,
                        error: None,
                        held: Some(held),
                    },
                );
                crate::log!(
                    info,
                    "core added",
                    cache = cache_id,
                    core = id,
                    export = name,
                    io_timeout = io_timeout.map_or("none".into(), crate::device::show_timeout)
                );
                Ok(json!({"cache_id": cache_id, "core_id": id, "export": name}))
            }
            CacheRun::Detached(why) => Err(format!("cache {cache_id} is detached ({why})")),
        }
    }

    /// Which storage `device` (`spec`) is, when no device this daemon holds — a cache device
    /// that is open, an attached core — is it or overlaps it (module `identity`); else the
    /// one-line refusal naming the holder. `except` (cache id, core id) is a core not counted
    /// (the same core added again). Nothing is opened.
    pub fn claimable(
        &self,
        spec: &DeviceSpec,
        device: &str,
        except: Option<(u16, u16)>,
    ) -> Result<Identity, String> {
        let held = Identity::of(spec, device)?;
        check_unheld(&self.lock(), device, &held, except)?;
        Ok(held)
    }

    /// The engine of a running cache.
    pub fn engine(&self, cache_id: u16) -> Result<Arc<Engine>, String> {
        self.lock()
            .get(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?
            .engine()
    }

    pub(super) fn check_core(&self, cache_id: u16, core_id: u16) -> Result<Arc<Engine>, String> {
        let caches = self.lock();
        let c = caches
            .get(&cache_id)
            .ok_or_else(|| format!("no cache {cache_id}"))?;
        match c.cores.get(&core_id) {
            None => return Err(format!("cache {cache_id} has no core {core_id}")),
            Some(k) if k.unattached(c) => {
                return Err(format!(
                    "core {core_id} of cache {cache_id} is {}",
                    core_state(c, k).1
                ));
            }
            Some(_) => {}
        }
        c.engine()
    }
}
