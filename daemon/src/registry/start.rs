//! `start-cache`: a new cache, or one loaded from its device, and the cores it records.

use super::*;
use tiercache_core::units::BLOCK_BYTES;

impl Registry {
    /// `start-cache`.
    pub fn start_cache(&self, p: NewCache<'_>) -> Result<Value, String> {
        self.start_cache_with(p, &IoTimeouts::default())
    }

    /// `start-cache` with IO timeouts for the cache device and the recorded cores.
    pub fn start_cache_with(&self, p: NewCache<'_>, io: &IoTimeouts) -> Result<Value, String> {
        let spec = DeviceSpec::parse(p.device)?;
        let attach = lock_markers(&self.attach);
        if matches!(spec, DeviceSpec::Nbd(_) | DeviceSpec::Rbd(_)) {
            return Err(format!(
                "{}: nbd: and rbd: devices can be cores, not cache devices",
                p.device
            ));
        }
        if p.load && p.force {
            return Err("--load and --force contradict each other: pick one".into());
        }
        if p.load && p.dry_run {
            return Err(
                "--dry-run shows what a new cache would use; a loaded cache keeps its own (tiercache inspect shows it)".into(),
            );
        }
        // Mode names in any case (`WB`, `Wl`).
        let wl = p.mode.is_some_and(|m| mode_word(m) == "wl");
        let mode = match p.mode {
            _ if wl => None,
            Some(m) => Some(CacheMode::parse(m).ok_or_else(|| {
                format!("unknown mode '{m}' (want wt, wb, wa, wi, pt, wo or wl)")
            })?),
            None => None,
        };
        if wl && spec.volatile() {
            return Err(format!(
                "{}: mode wl keeps acknowledged writes in its log, which a ram: device loses at a crash; use a file or block device",
                p.device
            ));
        }
        if p.load && (mode.is_some() || wl || p.line_size.is_some()) {
            return Err(
                "--load takes mode and line size from the device; drop --mode/--line-size".into(),
            );
        }
        let ls = match p.line_size {
            Some(s) => LineSize::parse(s)
                .ok_or_else(|| format!("unknown line size '{s}' (want 4k, 8k, 16k, 32k or 64k)"))?,
            None => LineSize::K4,
        };
        {
            let caches = self.lock();
            if let Some(id) = p.id {
                if id == 0 || id > CACHE_ID_MAX {
                    return Err(format!("cache id {id} is out of range (1-{CACHE_ID_MAX})"));
                }
                if caches.contains_key(&id) {
                    return Err(format!("cache {id} already exists"));
                }
            }
            // A detached cache's device, back: `start-cache --load` it under its own id.
            if let Some(c) = caches
                .values()
                .find(|c| c.held.is_none() && !spec.volatile() && c.device == p.device)
            {
                return Err(format!("{} is already cache {}", p.device, c.id));
            }
        }
        if !spec.present() {
            return Err(format!("{}: no such file or device", p.device));
        }
        // Before anything opens it (opening locks it; creating a cache preallocates and
        // formats it).
        let held = self.claimable(&spec, p.device, None)?;
        if other_user(&spec) {
            return Err(format!(
                "{} is mounted or opened exclusively by another program; refusing to use it as a cache device (--force does not override this)",
                p.device
            ));
        }
        if spec.volatile() && p.load {
            return Err(format!(
                "{}: a ram: device holds no cache to load",
                p.device
            ));
        }
        let dev = with_timeout(spec.open(p.device)?, io.cache);
        let (run, volatile, line_size, report) = if p.load {
            let d = dev.clone();
            let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
                d.read(off / BLOCK_BYTES, buf)
                    .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
            };
            let (cache, report) = tiercache_core::cache::open(&base_config(), &mut read)?;
            let ls = cache.config().line_size;
            drop(cache);
            let rep = load_summary(&report);
            let run = if report.cores.is_empty() {
                let (e, _) = Engine::open(&base_config(), dev.clone(), vec![], engine_config())?;
                CacheRun::Running(Arc::new(e))
            } else {
                CacheRun::Incomplete(Box::new(base_config()), Box::new(report), dev.clone())
            };
            (run, false, ls, rep)
        } else {
            if !spec.volatile() && !p.force {
                match holds(&dev) {
                    Holds::Cache(uuid) => {
                        return Err(format!(
                            "{} holds tiercache cache {uuid}; --load to load it, or --force to format it (its data is lost)",
                            p.device
                        ));
                    }
                    Holds::Data => {
                        return Err(format!(
                            "{} holds data (a file system or another program's); --force to format it (the data is lost)",
                            p.device
                        ));
                    }
                    Holds::Nothing => {}
                }
            }
            if p.dry_run {
                let bytes = dev.blocks() * BLOCK_BYTES;
                let space = if wl {
                    plan_wl_cache(bytes, ls)?.1
                } else {
                    let mode = mode.unwrap_or(CacheMode::Wt);
                    plan_cache(bytes, ls, mode, spec.volatile())?.1
                };
                return Ok(
                    json!({"dry_run": true, "cache_device": p.device, "would_create": space}),
                );
            }
            if let Some(path) = spec.path() {
                preallocate(path)?;
            }
            let e = if wl {
                let (cfg, space) = plan_wl_cache(dev.blocks() * BLOCK_BYTES, ls)?;
                let e = Engine::create_wl(cfg, dev.clone(), vec![], engine_config())?;
                (e, space)
            } else {
                let mode = mode.unwrap_or(CacheMode::Wt);
                let (cfg, space) =
                    plan_cache(dev.blocks() * BLOCK_BYTES, ls, mode, spec.volatile())?;
                (
                    Engine::create(cfg, dev.clone(), vec![], engine_config())?,
                    space,
                )
            };
            (CacheRun::Running(Arc::new(e.0)), spec.volatile(), ls, e.1)
        };
        let mut caches = self.lock();
        let id = match p.id {
            Some(id) if !caches.contains_key(&id) => id,
            Some(id) => return Err(format!("cache {id} already exists")),
            None => (1..=CACHE_ID_MAX)
                .find(|i| !caches.contains_key(i))
                .ok_or("no free cache id")?,
        };
        let mut entry = CacheEntry {
            id,
            device: p.device.to_string(),
            run,
            cores: BTreeMap::new(),
            line_size,
            volatile,
            wb_sample: (Instant::now(), 0),
            io_timeout: io.cache,
            held: Some(held),
        };
        if let CacheRun::Incomplete(_, r, _) = &entry.run {
            for e in &r.cores {
                entry.cores.insert(
                    e.id as u16,
                    CoreEntry {
                        device: String::new(),
                        dev: None,
                        export: e.export_name.clone(),
                        size_blocks: e.size_blocks,
                        bare: false,
                        rbd: None,
                        io_timeout: None,
                        timer: None,
                        error: None,
                        held: None,
                    },
                );
            }
        }
        let recorded: Vec<(u16, String)> = match &entry.run {
            CacheRun::Incomplete(_, r, _) => r
                .cores
                .iter()
                .filter(|e| !e.device.is_empty())
                .map(|e| (e.id as u16, e.device.clone()))
                .collect(),
            _ => vec![],
        };
        caches.insert(id, entry);
        drop(caches);
        drop(attach);
        // `--load` brings the cores back by the device strings they were attached with (each
        // checked against its recorded identity and size), with the IO timeouts given, or else
        // those they had (config file, last stop); a core not found stays detached until
        // `add-core` attaches it.
        let known = self.known_core_timeouts(p.device);
        let mut problems = Vec::new();
        for (core, dev) in recorded {
            let t = io.cores.get(&core).or(known.get(&core)).copied();
            if let Err(e) = self.add_core_with(id, &dev, Some(core), None, t) {
                crate::log!(
                    warn,
                    "recorded core not attached",
                    cache = id,
                    core = core,
                    device = dev,
                    reason = e
                );
                problems.push(format!("core {core} ({dev}): {e}"));
            }
        }
        let state = self.state(id).unwrap_or("detached");
        crate::log!(
            info,
            "cache started",
            cache = id,
            device = p.device,
            state = state,
            io_timeout = io.cache.map_or("none".into(), crate::device::show_timeout)
        );
        Ok(
            json!({"cache_id": id, "state": state, if p.load {"loaded"} else {"created"}: report,
            "cores_not_attached": problems}),
        )
    }
}
