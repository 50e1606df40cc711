//! The steps of one `tiercache bench` run ([`super::run_in`]): the core devices ([`Cores`]),
//! what serves them ([`Servers`]), the warm-up, and the matrix, one measured run at a time.

use super::{CACHED_RAM, LIBRBD, LIBRBD_WB, NBDKIT_CACHE, Plan, RunResult, counters, seq_cutoff};
use crate::bench::kit::fio::{
    STUCK, Workload, parse_fio, run_fio, run_fio_size, run_own, warm_own,
};
use crate::bench::kit::procs::{Procs, STOP};
use crate::bench::kit::report::Bar;
use crate::bench::kit::stats::pct;
use crate::bench_ceph::{ClientConfs, Cluster, FioTarget};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiercache_core::units::CoreId;
use tiercache_daemon::registry::{NewCache, Registry};
use tiercache_engine::Engine;
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server};

/// A sparse file of `bytes` in the scratch directory; its path.
pub(super) fn scratch_file(scratch: &Path, name: &str, bytes: u64) -> Result<String, String> {
    let p = scratch.join(name);
    let f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    f.set_len(bytes)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(p.display().to_string())
}

/// The core devices of the baseline and the cached configuration, what the peers run on,
/// and (rbd) the cluster, dropped last: it is stopped, or its images removed, on drop.
pub(super) struct Cores {
    pub(super) base_dev: String,
    pub(super) cached_dev: String,
    /// What the report calls the core.
    pub(super) desc: String,
    /// The librbd peers' client configurations and image.
    pub(super) rbd_peer: Option<(ClientConfs, String)>,
    /// How the cluster was set up (the report's `ceph`).
    pub(super) setup: Value,
    pub(super) cluster: Option<Cluster>,
}

impl Cores {
    /// Emulated cores (files in the scratch directory), or with `--core rbd` images on a
    /// cluster the bench starts, each written end to end.
    pub(super) fn make(p: &Plan, bar: &Bar) -> Result<Cores, String> {
        let a = p.a;
        let core_bytes = p.core_bytes;
        if a.core != "rbd" {
            let file = |n: &str| scratch_file(p.scratch, n, core_bytes);
            return Ok(Cores {
                base_dev: format!("emu:{}:{}", a.core_preset, file("core-baseline.img")?),
                cached_dev: format!("emu:{}:{}", a.core_preset, file("core-cached.img")?),
                desc: format!("emu:{} (emulated)", a.core_preset),
                rbd_peer: None,
                setup: json!({}),
                cluster: None,
            });
        }
        let mut setup = json!({});
        let librbd_peers = p.peers.iter().any(|x| [LIBRBD, LIBRBD_WB].contains(x));
        let images = 2 + u64::from(librbd_peers);
        // Sparse: a generous size costs nothing. BlueStore needs room beyond the images (its
        // metadata, and overwrites before space is freed); a full OSD blocks writes.
        let osd_bytes = (core_bytes * images * 2 + (4 << 30)).max(10 << 30);
        let mut c = a.ceph.cluster(p.scratch, osd_bytes, &mut setup)?;
        let confs = ClientConfs::write(&c, p.scratch, &mut setup)?;
        let img = |c: &str| format!("tc-bench-{}-{c}", std::process::id());
        let mut names = vec![img("baseline"), img("cached")];
        if librbd_peers {
            names.push(img("peer"));
        }
        for n in &names {
            let label = format!("image {}/{n}: writing {} MiB", c.pool, core_bytes >> 20);
            bar.show(&label, 0.0);
            let secs = c.image(n, core_bytes)?;
            bar.end();
            println!(
                "image {}/{n}: {} MiB, written end to end in {secs:.1} s",
                c.pool,
                core_bytes >> 20
            );
        }
        let desc = format!(
            "rbd:{}/tc-bench-{}-* (Ceph, {} MiB images, opened with rbd_cache=false)",
            c.pool,
            std::process::id(),
            core_bytes >> 20
        );
        let base_dev = confs.core_device(&c, &names[0]);
        let cached_dev = confs.core_device(&c, &names[1]);
        let rbd_peer = librbd_peers.then(|| (confs, names[2].clone()));
        Ok(Cores {
            base_dev,
            cached_dev,
            desc,
            rbd_peer,
            setup,
            cluster: Some(c),
        })
    }
}

/// What serves a run, dropped in this order (before the [`Cores`]): the children (nbdkit),
/// the NBD server, the engine, the registry.
pub(super) struct Servers {
    procs: Procs,
    server: Server,
    pub(super) engine: Arc<Engine>,
    reg: Arc<Registry>,
    sock: PathBuf,
    peer_sock: PathBuf,
}

impl Servers {
    /// The registry with cache 1 (`cached`; cache 2 for `cached-ram`), the NBD server on a
    /// unix socket exporting `baseline`, `cached` (and the peers' cores), and nbdkit's cache
    /// filter for `nbdkit-cache`.
    pub(super) fn start(p: &Plan, cache: &str, cores: &Cores) -> Result<Servers, String> {
        let a = p.a;
        let rbd = a.core == "rbd";
        let reg = Arc::new(Registry::new());
        reg.start_cache(NewCache {
            device: cache,
            id: Some(1),
            mode: Some(&a.mode),
            line_size: None,
            load: false,
            force: false,
            dry_run: false,
        })?;
        reg.add_core(1, &cores.cached_dev, Some(0), Some("cached"))?;
        let engine = reg.engine(1)?;
        let exports = Arc::new(ExportMap::new());
        let bare = tiercache_daemon::device::DeviceSpec::parse(&cores.base_dev)?
            .open("the baseline core")?;
        exports.insert(
            "baseline",
            if rbd {
                "the bare RBD image"
            } else {
                "the bare emulated core"
            },
            Arc::new(BackendExport::new(bare)),
        );
        exports.insert(
            "cached",
            if rbd {
                "the RBD image through the cache"
            } else {
                "the emulated core through the cache"
            },
            Arc::new(EngineExport::new(engine.clone(), CoreId(0))),
        );
        if p.peers.contains(&CACHED_RAM) {
            Self::add_cached_ram(p, &reg, &exports)?;
        }
        let nbdkit_peer = p.peers.contains(&NBDKIT_CACHE);
        if nbdkit_peer {
            let peer_core = scratch_file(p.scratch, "core-peer.img", p.core_bytes)?;
            let bare = tiercache_io::open_emu(&format!("emu:{}:{peer_core}", a.core_preset))?;
            exports.insert(
                "peer-core",
                "the bare emulated core under nbdkit's cache filter",
                Arc::new(BackendExport::new(Arc::new(bare))),
            );
        }
        let sock = p.scratch.join("nbd.sock");
        let server = Server::new(exports, Default::default());
        server.listen(&ListenAddr::Unix(sock.clone()))?;
        // Every child this run starts; dropping it stops them (errors and Ctrl-C included).
        let mut procs = Procs::default();
        let peer_sock = p.scratch.join("nbdkit-cache.sock");
        if nbdkit_peer {
            start_nbdkit_cache(p, &mut procs, &sock, &peer_sock)?;
        }
        Ok(Servers {
            procs,
            server,
            engine,
            reg,
            sock,
            peer_sock,
        })
    }

    /// Cache 2: a `ram:` cache (wt) of the same size over its own emulated core, exported as
    /// `cached-ram`.
    fn add_cached_ram(p: &Plan, reg: &Registry, exports: &ExportMap) -> Result<(), String> {
        reg.start_cache(NewCache {
            device: &format!("ram:{}", p.cache_bytes),
            id: Some(2),
            mode: Some("wt"),
            line_size: None,
            load: false,
            force: false,
            dry_run: false,
        })?;
        let core = scratch_file(p.scratch, "core-ram.img", p.core_bytes)?;
        reg.add_core(
            2,
            &format!("emu:{}:{core}", p.a.core_preset),
            Some(0),
            Some(CACHED_RAM),
        )?;
        // It runs the random workloads only: no cutoff, also during the warm-up.
        seq_cutoff(reg, 2, "never")?;
        exports.insert(
            CACHED_RAM,
            "the emulated core through a ram: cache (wt)",
            Arc::new(EngineExport::new(reg.engine(2)?, CoreId(0))),
        );
        Ok(())
    }

    /// The NBD URI of configuration `name`.
    fn uri(&self, name: &str) -> String {
        if name == NBDKIT_CACHE {
            format!("nbd+unix:///?socket={}", self.peer_sock.display())
        } else {
            format!("nbd+unix:///{name}?socket={}", self.sock.display())
        }
    }

    /// Stops what serves the run: the children, the NBD server, the engine, the caches.
    pub(super) fn stop(self, peers: &[&str]) {
        let Servers {
            mut procs,
            server,
            engine,
            reg,
            ..
        } = self;
        procs.stop_all();
        server.shutdown();
        drop(engine);
        let _ = reg.stop_cache(1, true, |_, _, _| {});
        if peers.contains(&CACHED_RAM) {
            let _ = reg.stop_cache(2, true, |_, _, _| {});
        }
    }
}

/// nbdkit's cache filter (writeback, 4K blocks, cache-on-read, at most the cache size) over
/// the `peer-core` export, on `peer_sock`.
fn start_nbdkit_cache(
    p: &Plan,
    procs: &mut Procs,
    sock: &Path,
    peer_sock: &Path,
) -> Result<(), String> {
    let tmp = p.scratch.join("nbdkit-tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let args = vec![
        "-f".to_string(),
        "--exit-with-parent".into(),
        "-U".into(),
        peer_sock.display().to_string(),
        "--filter=cache".into(),
        "nbd".into(),
        format!("socket={}", sock.display()),
        "export=peer-core".into(),
        "cache=writeback".into(),
        "cache-min-block-size=4K".into(),
        "cache-on-read=true".into(),
        format!("cache-max-size={}", p.cache_bytes),
    ];
    let pid = procs.spawn(
        "nbdkit cache",
        None,
        Path::new("nbdkit"),
        &args,
        &[("TMPDIR", &tmp)],
        p.scratch.join("nbdkit-cache.log"),
    )?;
    procs.wait_socket(pid, peer_sock)
}

/// Everything a run measures against; dropped in field order: the servers, then the cores
/// (the cluster last).
pub(super) struct Bed {
    pub(super) servers: Servers,
    pub(super) cores: Cores,
}

impl Bed {
    /// What fio runs against: the librbd peers through its rbd engine, the rest over NBD.
    fn target(&self, name: &str) -> FioTarget {
        match (&self.cores.rbd_peer, &self.cores.cluster) {
            (Some((confs, image)), Some(c)) if name == LIBRBD || name == LIBRBD_WB => {
                FioTarget::Rbd {
                    conf: if name == LIBRBD {
                        confs.plain.clone()
                    } else {
                        confs.wb.clone()
                    },
                    id: c.id.clone(),
                    pool: c.pool.clone(),
                    image: image.clone(),
                }
            }
            _ => FioTarget::Nbd {
                uri: self.servers.uri(name),
            },
        }
    }

    /// The line that says what this run measures.
    pub(super) fn announce(&self, p: &Plan) {
        let a = p.a;
        println!(
            "tiercache bench{}: {} workloads x (baseline, cached {}, seq-cutoff {}{}), QD {}, {} s each; core {}, cache {} file ({}); {}",
            if a.quick { " --quick" } else { "" },
            p.selected.len(),
            a.mode,
            a.seq_cutoff,
            p.peers.iter().map(|x| format!(", {x}")).collect::<String>(),
            a.iodepth,
            p.runtime,
            self.cores.desc,
            a.cache_size,
            self.servers
                .engine
                .with_cache(|c| format!("{} lines", c.config().lines)),
            if p.fio.is_empty() {
                "tiercache-loadgen"
            } else {
                p.fio
            }
        );
    }

    /// Warms the cached export: a sequential read pass over the random working set with the
    /// cutoff off, so every line is promoted.
    pub(super) fn warm_up(&self, p: &Plan, bar: &Bar) -> Result<(), String> {
        let reg = &self.servers.reg;
        let t = Instant::now();
        seq_cutoff(reg, 1, "never")?;
        let warm = Workload {
            name: "warm-up",
            rw: "read",
            bs: "1m",
            mix: None,
            random: false,
        };
        let warm_secs = 600;
        let mut cmd_ok = true;
        // nbdkit's cache filter is warmed the same way (it caches what it reads). librbd's
        // cache lives in the fio process of each run: there is nothing to warm.
        for config in std::iter::once("cached").chain(
            p.peers
                .iter()
                .copied()
                .filter(|x| [NBDKIT_CACHE, CACHED_RAM].contains(x)),
        ) {
            let label = format!("warm-up {config}");
            let v = if p.fio.is_empty() {
                warm_own(&self.servers.uri(config), p.ws).map(|_| Value::Null)
            } else {
                run_fio_size(&self.target(config), &warm, p.ws, warm_secs, &|f| {
                    bar.show(&label, f)
                })
            };
            bar.end();
            if let Err(e) = v {
                cmd_ok = false;
                eprintln!("{label} failed: {e}");
            }
        }
        seq_cutoff(reg, 1, &p.a.seq_cutoff)?;
        let warmed = self
            .servers
            .engine
            .with_cache(|c| c.occupancy() as u64 * c.config().line_size.bytes());
        println!(
            "warm-up: {} MiB of the {} MiB working set cached in {:.1} s",
            warmed >> 20,
            p.ws >> 20,
            t.elapsed().as_secs_f64()
        );
        if !cmd_ok {
            return Err("the warm-up failed; see above".into());
        }
        Ok(())
    }

    /// Runs every selected workload on every configuration it applies to; stops early on
    /// Ctrl-C with what was measured.
    pub(super) fn measure_all(&mut self, p: &Plan, bar: &Bar) -> Result<Vec<RunResult>, String> {
        let mut results: Vec<RunResult> = Vec::new();
        let configs: Vec<&str> = ["baseline", "cached"]
            .into_iter()
            .chain(p.peers.iter().copied())
            .collect();
        // The `ram:` cache runs the 4K random rows (the class of storage is the point there).
        let applies = |w: &Workload, c: &str| c != CACHED_RAM || (w.random && w.bs == "4k");
        let total: usize = p
            .selected
            .iter()
            .map(|w| configs.iter().filter(|c| applies(w, c)).count())
            .sum();
        let mut k = 0;
        'outer: for w in p.selected {
            for &config in &configs {
                if STOP.load(Ordering::Relaxed) {
                    break 'outer;
                }
                if !applies(w, config) {
                    continue;
                }
                k += 1;
                let label = format!("[{k}/{total}] {} {config}", w.name);
                match self.measure(p, w, config, &label, bar)? {
                    Some(r) => results.push(r),
                    None => break 'outer,
                }
            }
        }
        Ok(results)
    }

    /// One measured run of workload `w` on `config`, printed; None when Ctrl-C stopped it.
    fn measure(
        &mut self,
        p: &Plan,
        w: &Workload,
        config: &str,
        label: &str,
        bar: &Bar,
    ) -> Result<Option<RunResult>, String> {
        let reg = &self.servers.reg;
        let region = if w.random { p.ws } else { p.seq_region };
        // The tiercache cache this run measures (hit ratio, dirty, the series).
        let ours = match config {
            "cached" => Some(1),
            CACHED_RAM => Some(2),
            _ => None,
        };
        let before = if let Some(id) = ours {
            reg.reset_counters(id)?;
            Some(counters(reg, id))
        } else {
            None
        };
        let id = ours.unwrap_or(1);
        let sampler = Sampler::start(reg.clone(), id, ours.is_some());
        let qd = p.a.iodepth;
        let v = if p.fio.is_empty() {
            run_own(&self.servers.uri(config), w, region, qd, p.runtime, &|f| {
                bar.show(label, f)
            })
        } else {
            run_fio(&self.target(config), w, region, qd, p.runtime, &|f| {
                bar.show(label, f)
            })
            .and_then(|v| parse_fio(&v))
        };
        let series = sampler.finish();
        bar.end();
        let v = match v {
            Ok(v) => v,
            Err(e) if STOP.load(Ordering::Relaxed) => {
                eprintln!("{label}: stopped ({e})");
                return Ok(None);
            }
            Err(e) if e.starts_with(STUCK) => {
                // Stopping the server or the cache would wait for that IO too: say so,
                // stop what this run started and exit.
                eprintln!("tiercache: {label}: {e}; stopping");
                self.servers.procs.stop_all();
                if let Some(c) = self.cores.cluster.as_mut() {
                    c.stop();
                }
                let _ = std::fs::remove_dir_all(p.scratch);
                std::process::exit(1);
            }
            Err(e) => return Err(format!("{label}: {e}")),
        };
        let (iops, bw, mean, p99, p999, cdf) = v;
        let (hit_ratio, dirty) = match before {
            Some(_) => {
                let (n, h, d) = counters(reg, id);
                (Some(pct(h, n)), Some(d))
            }
            None => (None, None),
        };
        let r = RunResult {
            workload: w.name.to_string(),
            config: config.to_string(),
            iops,
            bw_mbps: bw,
            lat_mean_us: mean,
            lat_p99_us: p99,
            lat_p999_us: p999,
            hit_ratio,
            dirty_pct: dirty,
            cdf,
            series,
            cut_short: STOP.load(Ordering::Relaxed),
        };
        println!(
            "  {:<14} {:<12} {:>9.0} IOPS {:>8.1} MB/s  mean {:>9.1} us  p99 {:>9.1} us{}",
            r.workload,
            r.config,
            r.iops,
            r.bw_mbps,
            r.lat_mean_us,
            r.lat_p99_us,
            super::hits_dirty(r.hit_ratio, r.dirty_pct)
        );
        Ok(Some(r))
    }
}

/// During a cached run: (t, IOPS, dirty %) of cache `id` once a second, from its counters.
struct Sampler {
    series: Arc<Mutex<Vec<(f64, f64, f64)>>>,
    sampling: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling (`on`: else the thread ends at once and the series stays empty).
    fn start(reg: Arc<Registry>, id: u16, on: bool) -> Sampler {
        let series = Arc::new(Mutex::new(Vec::new()));
        let sampling = Arc::new(AtomicBool::new(on));
        let thread = {
            let series = series.clone();
            let sampling = sampling.clone();
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let mut last = counters(&reg, id).0;
                let mut next = 1.0;
                while sampling.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    let el = t0.elapsed().as_secs_f64();
                    if el >= next {
                        let (n, _, d) = counters(&reg, id);
                        if let Ok(mut s) = series.lock() {
                            s.push((next, n.saturating_sub(last) as f64, d));
                        }
                        last = n;
                        next += 1.0;
                    }
                }
            })
        };
        Sampler {
            series,
            sampling,
            thread,
        }
    }

    /// Stops sampling; the series.
    fn finish(self) -> Vec<(f64, f64, f64)> {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.thread.join();
        self.series.lock().map(|s| s.clone()).unwrap_or_default()
    }
}
