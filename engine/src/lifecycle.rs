//! An engine's life: start (threads, pools), create, load or recover a cache, attach and
//! detach cores, management under the lock, the ticker, stop and kill.

use super::*;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_io::BLOCK;

impl Shared {
    /// The ticker: `Tick` at the core's deadline, at least every 50 ms. It sleeps parked: a
    /// drive that moved the deadline earlier (a group commit armed) unparks it.
    pub(crate) fn ticker(&self) {
        while !self.quit.load(Ordering::Acquire) {
            let wait = {
                let mut g = self.lock();
                if !g.dead {
                    self.drive(&mut g, Event::Tick);
                }
                let now = self.now();
                g.m.next_deadline()
                    .map(|d| Duration::from_nanos(d.0.saturating_sub(now.0)))
                    .unwrap_or(Duration::from_millis(50))
                    .min(Duration::from_millis(50))
                    .max(Duration::from_micros(200))
            };
            std::thread::park_timeout(wait);
        }
    }
}

/// The regions a load reads whole, in the order it reads them: the journal, then the current
/// checkpoint (none when the superblock cannot be read: the load then says why).
pub(crate) fn load_plan(dev: &dyn Backend) -> Vec<(u64, u64)> {
    let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        dev.read(off / BLOCK_BYTES, buf).map_err(|e| e.to_string())
    };
    let Ok((sb, _, other)) = tiercache_core::cache::read_superblock(&mut read) else {
        return Vec::new();
    };
    let mut plan = Vec::new();
    if tiercache_core::cache::journal_needed(&sb, other.is_none()) {
        plan.push((sb.layout.journal.offset, sb.layout.journal.bytes));
    }
    if sb.has_checkpoint {
        let region = sb.layout.checkpoint[sb.checkpoint as usize & 1];
        let bytes =
            tiercache_format::superblock::checkpoint_region_bytes(sb.lines as u64, sb.line_size)
                .unwrap_or(0)
                .min(region.bytes);
        plan.push((region.offset, bytes));
    }
    plan.retain(|&(off, bytes)| {
        bytes > 0 && off.is_multiple_of(BLOCK_BYTES) && bytes.is_multiple_of(BLOCK_BYTES)
    });
    plan
}

impl Engine {
    pub(crate) fn start(
        m: Machine,
        cache_dev: Device,
        cores: &[(CoreId, Device)],
        ec: EngineConfig,
    ) -> Engine {
        let (slots, slot_blocks) = m.pool();
        let wl = m.wl().is_some();
        let pool = (0..slots)
            .map(|_| AlignedBuf::new(slot_blocks as usize * BLOCK))
            .collect();
        let mut devs: Vec<Option<Device>> = Vec::new();
        for (id, d) in cores {
            let i = id.0 as usize;
            if devs.len() <= i {
                devs.resize(i + 1, None);
            }
            devs[i] = Some(d.clone());
        }
        let sh = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            inner: Mutex::new(Inner {
                m,
                cache_dev,
                cores: devs,
                reqs: Default::default(),
                done: Default::default(),
                reads: Default::default(),
                pool,
                bufs: BufPool::new(ec.io_buffer_bytes),
                starved: VecDeque::new(),
                handoff: None,
                next_req: 1,
                stats: EngineStats::default(),
                dead: false,
                waiting: 0,
                events: VecDeque::new(),
                actions: Vec::new(),
                capture: Capture::Off,
                captured: Vec::new(),
                waiters: Default::default(),
                driving: None,
                own_done: None,
                last_drive: 0,
            }),
            done_cv: Condvar::new(),
            work: Mutex::new(work::WorkQueue::new(ec.io_threads.max(1))),
            work_cv: Condvar::new(),
            quit: AtomicBool::new(false),
            epoch: Instant::now(),
            last_now: AtomicU64::new(0),
            wl,
            ticker: std::sync::OnceLock::new(),
        });
        let mut threads = Vec::new();
        for i in 0..ec.io_threads.max(1) {
            let s = sh.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("tc-io-{i}"))
                    .spawn(move || s.io_thread())
                    .expect("spawn an IO thread"),
            );
        }
        let s = sh.clone();
        let ticker = std::thread::Builder::new()
            .name("tc-tick".into())
            .spawn(move || s.ticker())
            .expect("spawn the ticker");
        let _ = sh.ticker.set(ticker.thread().clone());
        threads.push(ticker);
        Engine { sh, threads }
    }

    /// Creates a cache on `cache_dev` with `cfg` (persistent if `cfg.persist` is set: the
    /// journal is zeroed and the first superblock written) and attaches `cores`. Returns once
    /// the cache serves and its tables are durable.
    pub fn create(
        cfg: Config,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<Engine, String> {
        let mut cache = Cache::new(cfg)?;
        for c in &cores {
            cache
                .add_core(c.id, c.dev.blocks())
                .map_err(|e| e.to_string())?;
            cache.set_core_record(c.id, c.record.clone())?;
        }
        let devs: Vec<(CoreId, Device)> = cores.iter().map(|c| (c.id, c.dev.clone())).collect();
        let e = Engine::start(Machine::Cache(Box::new(cache)), cache_dev, &devs, ec);
        e.wait(|c| c.is_ready() && c.tables_durable());
        Ok(e)
    }

    /// Creates a write log (mode `wl`) on `cache_dev` with `cfg` (its read cache persistent
    /// when `cfg.read_cache.persist` is set) and attaches `cores`. Returns once the log serves
    /// and its tables are durable.
    pub fn create_wl(
        cfg: WlConfig,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<Engine, String> {
        let mut wl = tiercache_core::wl::WriteLog::create(cfg)?;
        for c in &cores {
            wl.add_core(c.id, c.dev.blocks())?;
            wl.set_core_record(c.id, c.record.clone())?;
        }
        let devs: Vec<(CoreId, Device)> = cores.iter().map(|c| (c.id, c.dev.clone())).collect();
        let e = Engine::start(Machine::Wl(Box::new(wl)), cache_dev, &devs, ec);
        e.wait(|c| c.is_ready() && c.tables_durable());
        Ok(e)
    }

    /// Loads the cache on `cache_dev` (clean load or crash recovery) with the given core
    /// devices, which must be every core the cache has, by id, of the recorded size. `base`
    /// gives what the device does not store (pool sizes). Returns once the cache serves.
    pub fn open(
        base: &Config,
        cache_dev: Device,
        cores: Vec<(CoreId, Device)>,
        ec: EngineConfig,
    ) -> Result<(Engine, LoadReport), String> {
        Engine::open_inner(base, cache_dev, cores, ec, false)
    }

    pub(crate) fn open_inner(
        base: &Config,
        cache_dev: Device,
        cores: Vec<(CoreId, Device)>,
        ec: EngineConfig,
        allow_growth: bool,
    ) -> Result<(Engine, LoadReport), String> {
        // The journal and the checkpoint are read ahead of the core (readahead.rs).
        let mut ra = readahead::ReadAhead::start(cache_dev.clone(), &load_plan(&*cache_dev));
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            ra.read(off, buf)
                .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
        };
        let (cache, report) = tiercache_core::wl::device::open_device(base, &mut read)?;
        drop(ra);
        for e in &report.cores {
            let id = CoreId(e.id as u16);
            let Some((_, d)) = cores.iter().find(|(c, _)| *c == id) else {
                return Err(format!(
                    "core {} (export {:?}) of this cache was not given; attach its device",
                    e.id, e.export_name
                ));
            };
            if d.blocks() < e.size_blocks || (d.blocks() > e.size_blocks && !allow_growth) {
                return Err(format!(
                    "core {} is {} blocks, the cache recorded {}: not the same device{}",
                    e.id,
                    d.blocks(),
                    e.size_blocks,
                    if d.blocks() < e.size_blocks {
                        ", or it shrank (grow it back)"
                    } else {
                        ""
                    }
                ));
            }
        }
        let e = Engine::start(cache, cache_dev, &cores, ec);
        e.wait(|c| c.is_ready());
        // A core that grew while the cache was down (its identity matched): take the new size.
        for (id, d) in &cores {
            let recorded = e.with_cache(|c| c.core(*id).map(|s| s.size_blocks));
            if recorded.is_some_and(|r| d.blocks() > r) {
                e.resize_core(*id, d.clone())?;
            }
        }
        Ok((e, report))
    }

    /// The engine's clock: the time the core's [`Nanos`] are on (for example the `since` and
    /// `next_retry` of `Cache::health`).
    pub fn now(&self) -> Nanos {
        self.sh.now()
    }

    /// Waits until `pred` holds for the core (checked whenever something happens, and every
    /// 10 ms).
    pub fn wait(&self, pred: impl Fn(&Machine) -> bool) {
        let mut g = self.sh.lock();
        while !pred(&g.m) {
            g = self.sh.wait_done(g, Duration::from_millis(10));
        }
    }

    /// Runs `f` on the core under the engine's lock (management, statistics), then lets the
    /// core act on what changed.
    ///
    /// In mode `wl` this is the write log's read cache (statistics, policies, core records);
    /// what concerns the log goes through [`Engine::with_machine`].
    pub fn with_cache<R>(&self, f: impl FnOnce(&mut Cache) -> R) -> R {
        let mut g = self.sh.lock();
        let r = f(g.m.cache_mut());
        self.sh.drive(&mut g, Event::Tick);
        r
    }

    /// Runs `f` on the state machine under the engine's lock, then lets it act on what
    /// changed.
    pub fn with_machine<R>(&self, f: impl FnOnce(&mut Machine) -> R) -> R {
        let mut g = self.sh.lock();
        let r = f(&mut g.m);
        self.sh.drive(&mut g, Event::Tick);
        r
    }

    /// Whether this is a write log (mode `wl`).
    pub fn is_wl(&self) -> bool {
        self.sh.lock().m.wl().is_some()
    }

    /// Attaches a core at run time (the cache shares its lines with every core) and returns
    /// once the core table naming it is durable (persistent caches).
    pub fn add_core(&self, spec: CoreSpec) -> Result<(), String> {
        {
            let mut g = self.sh.lock();
            g.m.add_core(spec.id, spec.dev.blocks())?;
            g.m.set_core_record(spec.id, spec.record)?;
            let i = spec.id.0 as usize;
            if g.cores.len() <= i {
                g.cores.resize(i + 1, None);
            }
            g.cores[i] = Some(spec.dev);
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Lets requests of core `id` that were answered before their record (group commit) go:
    /// the commit is started now, and this returns once it released them. Management that
    /// refuses a busy core calls it first, so a core quiet since its last write is not busy.
    fn release_parked(&self, id: CoreId) {
        {
            let mut g = self.sh.lock();
            if !g.m.cache().parked_on(id) {
                return;
            }
            g.m.cache_mut().commit_soon();
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|m| !m.cache().parked_on(id));
    }

    /// Detaches core `id` (refused while it has dirty data or IO in flight: write it back
    /// first) and returns once the core table without it is durable.
    pub fn remove_core(&self, id: CoreId) -> Result<(), String> {
        self.release_parked(id);
        {
            let mut g = self.sh.lock();
            g.m.remove_core(id)?;
            if let Some(d) = g.cores.get_mut(id.0 as usize) {
                *d = None;
            }
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Replaces core `id`'s device by `dev` (the same device reopened at a new size) and
    /// records the new size (see `Cache::resize_core`: a shrink below cached data is refused,
    /// and nothing changes). Returns once the core table is durable.
    pub fn resize_core(&self, id: CoreId, dev: Device) -> Result<(), String> {
        self.release_parked(id);
        {
            let mut g = self.sh.lock();
            g.m.resize_core(id, dev.blocks())?;
            if let Some(d) = g.cores.get_mut(id.0 as usize) {
                *d = Some(dev);
            }
            self.sh.drive(&mut g, Event::Tick);
        }
        self.wait(|c| c.tables_durable());
        Ok(())
    }

    /// Serves core `id` from `dev` from now on: the same device behind another handle (e.g.
    /// wrapped in an IO timeout). IOs already running finish on the old handle. Refused when
    /// the core is not attached or `dev` has another size.
    pub fn replace_core_device(&self, id: CoreId, dev: Device) -> Result<(), String> {
        let mut g = self.sh.lock();
        let slot = g
            .cores
            .get_mut(id.0 as usize)
            .and_then(|d| d.as_mut())
            .ok_or_else(|| format!("core {} is not attached", id.0))?;
        if slot.blocks() != dev.blocks() {
            return Err(format!(
                "core {}: the new handle has {} blocks, the device {}",
                id.0,
                dev.blocks(),
                slot.blocks()
            ));
        }
        *slot = dev;
        Ok(())
    }

    /// The device of core `id`, if attached.
    pub fn core_device(&self, id: CoreId) -> Option<Device> {
        self.sh.lock().cores.get(id.0 as usize).cloned().flatten()
    }

    /// Engine counters.
    pub fn stats(&self) -> EngineStats {
        let g = self.sh.lock();
        let b = g.bufs.stats();
        EngineStats {
            buffer_bytes: b.bytes,
            buffer_in_use: b.in_use,
            buffer_peak: b.peak,
            ..g.stats
        }
    }

    /// Stops cleanly: waits for requests in flight, writes the final checkpoint (persistent
    /// caches; dirty data stays dirty and persisted unless writeback ran first), flushes the
    /// core devices, stops the threads.
    pub fn stop(mut self) -> Result<(), String> {
        self.stop_shared()?;
        self.shutdown();
        Ok(())
    }

    /// Does what [`Engine::stop`] does to the devices — waits for requests in flight, writes
    /// the final checkpoint, flushes the core devices — for an engine other threads still hold
    /// (NBD connections): requests after this fail with `NotRunning`, and the threads end
    /// when the last holder drops the engine. Every core device is flushed even when one
    /// fails; the error names each core whose flush failed (the cache itself is stopped then:
    /// its final checkpoint is written).
    pub fn stop_shared(&self) -> Result<(), String> {
        self.with_machine(|c| c.stop());
        self.wait(|c| c.is_stopped());
        let devs: Vec<(usize, Device)> = {
            let g = self.sh.lock();
            g.cores
                .iter()
                .enumerate()
                .filter_map(|(i, d)| Some((i, d.clone()?)))
                .collect()
        };
        let failed: Vec<String> = devs
            .iter()
            .filter_map(|(i, d)| d.flush().err().map(|e| format!("core {i}: {e}")))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "flushing core devices failed: {}",
                failed.join("; ")
            ))
        }
    }

    /// Stops dead, as a crash would: no IO is started after this, completions are dropped, and
    /// nothing is flushed or written. The devices hold what they hold.
    pub fn kill(mut self) {
        self.sh.lock().dead = true;
        self.shutdown();
    }

    pub(crate) fn shutdown(&mut self) {
        self.sh.quit.store(true, Ordering::Release);
        self.sh.work_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.sh.lock().dead = true;
            self.shutdown();
        }
    }
}

impl Engine {
    /// [`Engine::open`] with the identities checked too: every core the cache recorded must be
    /// given with the recorded identity — a swapped device of the same size is refused (SPEC
    /// C18), since writing another disk's dirty data onto it would destroy it. A core with the
    /// recorded identity that grew since is accepted at its new size (SPEC C22); one that
    /// shrank is refused.
    pub fn open_checked(
        base: &Config,
        cache_dev: Device,
        cores: Vec<CoreSpec>,
        ec: EngineConfig,
    ) -> Result<(Engine, LoadReport), String> {
        let dev = cache_dev.clone();
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            dev.read(off / BLOCK_BYTES, buf)
                .map_err(|e| format!("reading the cache device at byte {off}: {e}"))
        };
        // The core table only (the read cache's records, in mode `wl` too): no log scan here.
        let (_, report) = tiercache_core::cache::open(base, &mut read)?;
        for e in &report.cores {
            if let Some(c) = cores.iter().find(|c| c.id.0 == e.id as u16)
                && !e.identity.same_device(&c.record.identity)
            {
                return Err(format!(
                    "core {} (export {:?}) was recorded as {:?}, the device given is {:?}: not the same device; refusing to load (attach the right device, or remove the core with --force)",
                    e.id, e.export_name, e.identity, c.record.identity
                ));
            }
        }
        Engine::open_inner(
            base,
            cache_dev,
            cores.into_iter().map(|c| (c.id, c.dev)).collect(),
            ec,
            true,
        )
    }
}
