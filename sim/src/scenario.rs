//! Scenarios: what to simulate, as TOML files shipped in `sim/scenarios/` (or given by path).
//!
//! A scenario names its topology (`single`: one core device behind one cache; `cluster`: Ceph
//! OSDs on HDDs, each cached by a partition of a shared flash drive, with objects placed by
//! hash and writes replicated), the cache configuration, a list of *configs* to compare
//! (`baseline` without a cache, `cached`, or variants overriding the cache device or the
//! cleaning policy) and the workloads. Every scenario states its working set and duration.

use serde::Deserialize;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::ioclass::{IoClassTable, IoInfo};
use tiercache_core::policy::{
    AcpParams, AlruParams, CleaningPolicy, CutoffParams, Named, RateParams,
};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos};
use tiercache_core::{Cache, Config};

use crate::device::{self, Device, DeviceSpec};
use crate::engine::{
    CacheSetup, Direct, ExtraIo, Load, Region, Router, RunResult, ServerModel, Sim, Target, Window,
};
use crate::workload::{ClientIo, Generator, TraceEntry, WorkloadSpec};

/// Shipped scenarios: (name, TOML text).
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "ceph-opencas-2020",
        include_str!("../scenarios/ceph-opencas-2020.toml"),
    ),
    ("dirty-ratio", include_str!("../scenarios/dirty-ratio.toml")),
    ("ram-vs-nvme", include_str!("../scenarios/ram-vs-nvme.toml")),
];

const GIB: u64 = 1 << 30;
const BLOCKS_PER_GIB: u64 = GIB / 512;

/// A scenario file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name.
    pub name: String,
    /// One-line title.
    pub title: String,
    /// What it models, its working set and duration, where its numbers come from.
    pub about: String,
    /// Default seed.
    #[serde(default = "one")]
    pub seed: u64,
    /// Simulated warm-up before each measurement, seconds.
    #[serde(default)]
    pub warmup_s: f64,
    /// Time-series sampling interval, seconds.
    #[serde(default = "one_f")]
    pub sample_s: f64,
    /// Print the time series on the terminal (it is always in the JSON and CSV).
    #[serde(default)]
    pub show_series: bool,
    /// Topology: exactly one of `single` and `cluster`.
    pub single: Option<SingleSpec>,
    /// Topology: exactly one of `single` and `cluster`.
    pub cluster: Option<ClusterSpec>,
    /// The cache configuration (for every config that has a cache).
    pub cache: CacheSpec,
    /// Configurations compared, in order.
    pub config: Vec<ConfigSpec>,
    /// Workloads run under each configuration.
    pub workload: Vec<WorkloadSpec>,
    /// Published figures to compare with: workload name → expected cached/baseline IOPS ratio.
    #[serde(default)]
    pub published: Vec<Published>,
}

fn one() -> u64 {
    1
}
fn one_f() -> f64 {
    1.0
}

/// A published figure.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// Workload name.
    pub workload: String,
    /// What was published (e.g. "IOPS x119.5").
    pub figure: String,
    /// The published value of `cached IOPS / baseline IOPS` (or bandwidth ratio).
    pub ratio: f64,
    /// Where it comes from.
    pub source: String,
    /// Why the simulated figure may differ.
    #[serde(default)]
    pub why_different: String,
}

/// One core device behind one cache.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SingleSpec {
    /// Core device preset.
    pub core_dev: String,
    /// Core device size, GiB (also the span workloads spread over unless `working_set_gib`).
    pub core_gib: f64,
    /// Region of the core the workloads use, GiB.
    pub working_set_gib: f64,
    /// Cache device preset.
    pub cache_dev: String,
    /// Cache size, GiB.
    pub cache_gib: f64,
    /// Server model in front of the cache (default: none).
    #[serde(default)]
    pub server: Option<ServerSpec>,
}

/// Ceph OSDs on HDDs with flash cache partitions.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Storage nodes.
    pub nodes: u32,
    /// OSDs per node (one HDD each).
    pub osds_per_node: u32,
    /// Copies of each object (replicas go to other nodes).
    pub replicas: u32,
    /// Object size, MiB.
    pub object_mib: u64,
    /// Data per OSD the workloads touch, GiB (objects are spread over the whole HDD, or over
    /// its first `span_gib`).
    pub working_set_gib_per_osd: f64,
    /// Objects lie in the first this many GiB of each HDD (default: all of it).
    #[serde(default)]
    pub span_gib: Option<f64>,
    /// HDD preset.
    pub hdd: String,
    /// HDD size, GiB.
    pub hdd_gib: f64,
    /// Cache flash preset.
    pub cache_dev: String,
    /// OSDs sharing one cache drive (one partition each).
    pub osds_per_cache_dev: u32,
    /// Simulated cache size per OSD, GiB (only the working set matters; see the scenario text).
    pub cache_gib_per_osd: f64,
    /// The OSD software model.
    pub server: ServerSpec,
}

/// Server model parameters.
#[derive(Copy, Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Ops processed at once.
    pub threads: u32,
    /// CPU per op, µs.
    pub cpu_us: f64,
    /// Fixed added latency per op (network round trip, stack), µs.
    pub latency_us: f64,
}

/// Cache configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// Mode (`wt`, `wb`, `wa`, `wi`, `pt`, `wo`).
    pub mode: String,
    /// Line size, KiB.
    pub line_kib: u32,
    /// Sequential cutoff.
    #[serde(default)]
    pub cutoff: Option<CutoffSpec>,
    /// IO class CSV (Open CAS format).
    #[serde(default)]
    pub ioclass_csv: Option<String>,
    /// Cleaning policy (`alru`, `acp`, `nop`).
    #[serde(default = "alru")]
    pub cleaning: String,
    /// ALRU activity threshold, ms.
    #[serde(default)]
    pub alru_activity_threshold_ms: Option<u32>,
    /// ALRU staleness time, s.
    #[serde(default)]
    pub alru_staleness_time_s: Option<u32>,
    /// ALRU wake-up, s.
    #[serde(default)]
    pub alru_wake_up_s: Option<u32>,
    /// Writeback-rate controller target, percent dirty (absent: controller off).
    #[serde(default)]
    pub rate_target_pct: Option<u32>,
    /// Pre-load the working set into the cache (clean) before running.
    #[serde(default)]
    pub warm: bool,
}

fn alru() -> String {
    "alru".into()
}

/// Sequential cutoff settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CutoffSpec {
    /// `always`, `full` or `never`.
    pub policy: String,
    /// Threshold, KiB.
    pub threshold_kib: u64,
}

/// A configuration to compare.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSpec {
    /// Name in tables and JSON (`baseline`, `cached`, or a variant name).
    pub name: String,
    /// Whether this configuration has a cache.
    #[serde(default = "yes")]
    pub cache: bool,
    /// Override: cache device preset.
    #[serde(default)]
    pub cache_dev: Option<String>,
    /// Override: cleaning policy.
    #[serde(default)]
    pub cleaning: Option<String>,
    /// Override: rate controller target (0: off).
    #[serde(default)]
    pub rate_target_pct: Option<u32>,
    /// A cluster without a cache: device IOs each OSD makes on its HDD besides each op's own
    /// (BlueStore's RocksDB and WAL on the data disk). Absent: none.
    #[serde(default)]
    pub hdd_extra: Option<ExtraSpec>,
}

/// Extra HDD IOs per op of a bare OSD ([`crate::engine::ExtraIo`]).
#[derive(Copy, Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraSpec {
    /// Per read op (may be fractional).
    pub per_read: f64,
    /// Per write op (may be fractional).
    pub per_write: f64,
    /// Where they go: the first this many GiB of the HDD.
    pub gib: f64,
}

fn yes() -> bool {
    true
}

/// Per target: the core lines to pre-load when the scenario warms its caches.
type WarmSet = Vec<(usize, Vec<u64>)>;

/// One (workload, config) result.
#[derive(Clone, Debug)]
pub struct Run {
    /// Workload name.
    pub workload: String,
    /// Config name.
    pub config: String,
    /// What the clients saw.
    pub result: RunResult,
}

/// The policy `name` (the core's names, `policy::Named`), or "WHERE: unknown WHAT policy
/// 'NAME' (one of ...)".
fn named<T: Named>(place: &str, what: &str, name: &str) -> Result<T, String> {
    T::parse(name).ok_or_else(|| {
        format!(
            "{place}: unknown {what} policy '{name}' (one of {})",
            T::one_of()
        )
    })
}

impl Scenario {
    /// A shipped scenario by name, or a file by path.
    pub fn load(name_or_path: &str) -> Result<Scenario, String> {
        let text = match SHIPPED.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, t)) => t.to_string(),
            None if std::path::Path::new(name_or_path).exists() => {
                std::fs::read_to_string(name_or_path)
                    .map_err(|e| format!("cannot read scenario {name_or_path}: {e}"))?
            }
            None => {
                let names: Vec<&str> = SHIPPED.iter().map(|s| s.0).collect();
                return Err(format!(
                    "unknown scenario '{name_or_path}' (shipped: {}; or give a path to a .toml file)",
                    names.join(", ")
                ));
            }
        };
        Scenario::parse(&text)
    }

    /// Parses and checks a scenario.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| format!("scenario: {e}"))?;
        Scenario::parse_checks(&s)?;
        Ok(s)
    }

    /// The checks [`Scenario::parse`] makes, for a scenario built in memory.
    pub fn parse_checks(s: &Scenario) -> Result<(), String> {
        if s.single.is_some() == s.cluster.is_some() {
            return Err("scenario: give exactly one of [single] and [cluster]".into());
        }
        if s.config.is_empty() || s.workload.is_empty() {
            return Err("scenario: needs at least one [[config]] and one [[workload]]".into());
        }
        for w in &s.workload {
            w.validate()?;
        }
        if s.sample_s.is_nan() || s.sample_s <= 0.0 || s.warmup_s < 0.0 {
            return Err("scenario: sample_s must be > 0 and warmup_s >= 0".into());
        }
        // The cache's default cleaning policy, even where every config names its own.
        named::<CleaningPolicy>("cache", "cleaning", &s.cache.cleaning)?;
        // Build every config once (small) to surface errors before running.
        for c in &s.config {
            s.cache_config(c, 1024)?;
        }
        Ok(())
    }

    /// The core cache config for `c`, with `lines` lines.
    fn cache_config(
        &self,
        c: &ConfigSpec,
        lines: u32,
    ) -> Result<(Config, Option<CutoffParams>, IoClassTable), String> {
        let cs = &self.cache;
        let ls = LineSize::parse(&format!("{}k", cs.line_kib))
            .ok_or_else(|| format!("cache: line_kib {} is not 4, 8, 16, 32 or 64", cs.line_kib))?;
        let mut cfg = Config::new(lines, ls);
        cfg.mode = CacheMode::parse(&cs.mode)
            .ok_or_else(|| format!("cache: unknown mode '{}'", cs.mode))?;
        let cleaning = c.cleaning.as_deref().unwrap_or(&cs.cleaning);
        cfg.cleaning = named(&format!("config {}", c.name), "cleaning", cleaning)?;
        let d = AlruParams::default();
        cfg.alru = AlruParams {
            activity_threshold_ms: cs
                .alru_activity_threshold_ms
                .unwrap_or(d.activity_threshold_ms),
            staleness_time_s: cs.alru_staleness_time_s.unwrap_or(d.staleness_time_s),
            wake_up_s: cs.alru_wake_up_s.unwrap_or(d.wake_up_s),
            ..d
        };
        cfg.acp = AcpParams::default();
        let rate = c.rate_target_pct.or(cs.rate_target_pct).unwrap_or(0);
        cfg.rate = RateParams {
            enabled: rate > 0,
            dirty_target_pct: rate.clamp(1, 99),
            ..RateParams::default()
        };
        cfg.validate()?;
        let cutoff = match &cs.cutoff {
            None => None,
            Some(x) => Some(CutoffParams {
                policy: named("cache", "cutoff", &x.policy)?,
                threshold_bytes: x.threshold_kib * 1024,
                ..CutoffParams::default()
            }),
        };
        let classes = match &cs.ioclass_csv {
            None => IoClassTable::default_table(),
            Some(t) => {
                IoClassTable::parse_csv(t).map_err(|e| format!("cache: ioclass_csv: {e}"))?
            }
        };
        Ok((cfg, cutoff, classes))
    }

    fn build_cache(
        &self,
        c: &ConfigSpec,
        cache_gib: f64,
        core_blocks: u64,
    ) -> Result<Cache, String> {
        let line_bytes = self.cache.line_kib as u64 * 1024;
        let lines =
            ((cache_gib * GIB as f64) as u64 / line_bytes).clamp(16, u32::MAX as u64 / 2) as u32;
        let (cfg, cutoff, classes) = self.cache_config(c, lines)?;
        let mut cache = Cache::new(cfg)?;
        // In builds with invariant checks (the test suite), keep them at about 64 line
        // checks per event: O(lines) after every event would make big caches crawl.
        cache.set_invariant_check_every((lines as u64 / 64).max(1));
        cache
            .add_core(CoreId(0), core_blocks)
            .map_err(|e| e.to_string())?;
        if let Some(p) = cutoff {
            cache.set_cutoff(CoreId(0), p).map_err(|e| e.to_string())?;
        }
        cache.load_io_classes(classes);
        Ok(cache)
    }

    fn spec(name: &str) -> Result<DeviceSpec, String> {
        device::preset(name)
    }

    /// Builds the simulation for config `c`: devices, targets, router, and the warm-up set.
    fn build(&self, c: &ConfigSpec) -> Result<(Sim, WarmSet), String> {
        let mut devices: Vec<Box<dyn Device>> = Vec::new();
        let mut targets = Vec::new();
        let cache_dev_name = c.cache_dev.clone();
        if let Some(s) = &self.single {
            let core_blocks = (s.core_gib * BLOCKS_PER_GIB as f64) as u64;
            devices.push(Self::spec(&s.core_dev)?.build(core_blocks));
            let server = s.server.map_or(ServerModel::NONE, |x| ServerModel {
                threads: x.threads,
                cpu_us: x.cpu_us,
                latency_us: x.latency_us,
            });
            let core = Region {
                dev: 0,
                offset: 0,
                blocks: core_blocks,
            };
            let ws = (s.working_set_gib * BLOCKS_PER_GIB as f64) as u64;
            if c.cache {
                let cache_blocks = (s.cache_gib * BLOCKS_PER_GIB as f64) as u64;
                let name = cache_dev_name.as_deref().unwrap_or(&s.cache_dev);
                devices.push(Self::spec(name)?.build(cache_blocks.max(1 << 20)));
                let cache = self.build_cache(c, s.cache_gib, core_blocks)?;
                let region = Region {
                    dev: 1,
                    offset: 0,
                    blocks: cache_blocks,
                };
                targets.push(Target::cached(
                    "volume".into(),
                    server,
                    core,
                    CacheSetup { cache, region },
                ));
            } else {
                targets.push(Target::bare("volume".into(), server, core));
            }
            let line_blocks = self.cache.line_kib as u64 * 2;
            let warm = (0..ws / line_blocks).collect();
            let sim = Sim::new(devices, targets, Box::new(Direct { blocks: ws }));
            return Ok((sim, vec![(0, warm)]));
        }
        let cl = self.cluster.as_ref().expect("validated: one topology");
        let osds = (cl.nodes * cl.osds_per_node) as usize;
        if osds == 0 || cl.replicas == 0 || cl.replicas > cl.nodes || cl.osds_per_cache_dev == 0 {
            return Err(
                "cluster: need nodes, OSDs, 1 <= replicas <= nodes, osds_per_cache_dev >= 1".into(),
            );
        }
        let hdd_blocks = (cl.hdd_gib * BLOCKS_PER_GIB as f64) as u64;
        let obj_blocks = cl.object_mib * 2048;
        let cache_blocks = (cl.cache_gib_per_osd * BLOCKS_PER_GIB as f64) as u64;
        let server = ServerModel {
            threads: cl.server.threads,
            cpu_us: cl.server.cpu_us,
            latency_us: cl.server.latency_us,
        };
        let hdd = Self::spec(&cl.hdd)?;
        for _ in 0..osds {
            devices.push(hdd.build(hdd_blocks));
        }
        let flash_name = cache_dev_name.as_deref().unwrap_or(&cl.cache_dev);
        let flash = Self::spec(flash_name)?;
        let per = cl.osds_per_cache_dev as usize;
        if c.cache {
            for _ in 0..osds.div_ceil(per) {
                devices.push(flash.build(cache_blocks * per as u64));
            }
        }
        for o in 0..osds {
            let core = Region {
                dev: o,
                offset: 0,
                blocks: hdd_blocks,
            };
            let name = format!("osd.{o}");
            if c.cache {
                let region = Region {
                    dev: osds + o / per,
                    offset: (o % per) as u64 * cache_blocks,
                    blocks: cache_blocks,
                };
                let cache = self.build_cache(c, cl.cache_gib_per_osd, hdd_blocks)?;
                targets.push(Target::cached(
                    name,
                    server,
                    core,
                    CacheSetup { cache, region },
                ));
            } else {
                let mut t = Target::bare(name, server, core);
                t.extra = c.hdd_extra.map(|x| ExtraIo {
                    region: Region {
                        dev: o,
                        offset: 0,
                        blocks: ((x.gib * BLOCKS_PER_GIB as f64) as u64).clamp(8, hdd_blocks),
                    },
                    per_read: x.per_read,
                    per_write: x.per_write,
                });
                targets.push(t);
            }
        }
        let router = Cluster::new(cl, osds, hdd_blocks, obj_blocks);
        let line_blocks = self.cache.line_kib as u64 * 2;
        let mut warm: Vec<(usize, Vec<u64>)> = (0..osds).map(|o| (o, Vec::new())).collect();
        for (obj, places) in router.placement.iter().enumerate() {
            let _ = obj;
            for &(osd, slot) in places {
                let first = slot * obj_blocks / line_blocks;
                warm[osd].1.extend(first..first + obj_blocks / line_blocks);
            }
        }
        Ok((Sim::new(devices, targets, Box::new(router)), warm))
    }

    /// Pre-loads each target's warm lines (clean, the first as many as its cache holds, in
    /// order: the last is the most recent).
    fn warm(&self, sim: &mut Sim, warm: WarmSet) -> Result<(), String> {
        let line_blocks = self.cache.line_kib as u64 * 2;
        let full = if line_blocks == 128 {
            u128::MAX
        } else {
            (1u128 << line_blocks) - 1
        };
        for (t, lines) in warm {
            let Some(setup) = sim.targets[t].cache.as_mut() else {
                continue;
            };
            let cap = setup.cache.config().lines as usize;
            for &cl in lines.iter().take(cap) {
                // The class a line-sized read of this line gets, so IO-class caps hold.
                let class = setup.cache.io_classes().classify(&IoInfo {
                    core: CoreId(0),
                    is_write: false,
                    lba: Lba(cl * line_blocks),
                    bytes: line_blocks * 512,
                });
                setup.cache.restore_line(CoreId(0), cl, full, 0, class)?;
            }
        }
        Ok(())
    }

    /// Runs workload `w` under config `c` with `seed`.
    pub fn run_one(
        &self,
        w: &WorkloadSpec,
        c: &ConfigSpec,
        seed: u64,
    ) -> Result<RunResult, String> {
        let (mut sim, warm) = self.build(c)?;
        if c.cache && self.cache.warm && !w.cold {
            self.warm(&mut sim, warm)?;
        }
        let ws = sim_volume(&sim);
        let mut source = Generator::new(w, ws, seed ^ hash_str(&w.name));
        let window = Window {
            warmup: Nanos((self.warmup_s * 1e9) as u64),
            duration: Nanos((w.duration_s * 1e9) as u64),
            sample: Nanos((self.sample_s * 1e9) as u64),
        };
        let r = sim.run(
            Load::Closed {
                source: &mut source,
                jobs: w.jobs,
                qd: w.qd,
            },
            window,
        );
        if std::env::var_os("TIERCACHE_SIM_DEBUG").is_some() {
            for t in &sim.targets {
                if let Some(c) = &t.cache {
                    eprintln!(
                        "{}: {:?}\n{:?}",
                        t.name,
                        c.cache.core_counters(CoreId(0)),
                        c.cache.counters()
                    );
                }
            }
        }
        Ok(r)
    }

    /// Grows a `single` scenario's core and working set to hold `end_bytes` (a trace's
    /// highest byte), in whole GiB; returns the new size when it grew. A cluster's volume is
    /// left as it is.
    pub fn fit_volume(&mut self, end_bytes: u64) -> Option<f64> {
        let s = self.single.as_mut()?;
        let gib = end_bytes.div_ceil(BLOCKS_PER_GIB * 512) as f64;
        if gib <= s.working_set_gib {
            return None;
        }
        s.working_set_gib = gib;
        s.core_gib = s.core_gib.max(gib);
        Some(gib)
    }

    /// Replays a trace (open loop: each request at its time) under config `c`. The window is
    /// the trace's span plus one second for the last requests to complete. The result carries
    /// the cache's hit counts ([`RunResult::hits`]).
    pub fn run_trace(&self, entries: &[TraceEntry], c: &ConfigSpec) -> Result<RunResult, String> {
        let (mut sim, warm) = self.build(c)?;
        let vol = sim.volume_blocks();
        if let Some(e) = entries.iter().find(|e| e.io.lba + e.io.blocks as u64 > vol) {
            return Err(format!(
                "trace request at {} us ends past the scenario's volume ({} bytes)",
                e.time_us,
                vol * 512
            ));
        }
        if c.cache && self.cache.warm {
            // A single volume starts as if the trace had run once before: the lines it
            // touches, the most recently touched that fit, oldest first. A cluster's placement
            // warms as for its workloads.
            let warm = match (&self.single, sim.targets[0].cache.as_ref()) {
                (Some(_), Some(setup)) => {
                    let cap = setup.cache.config().lines as usize;
                    vec![(0, trace_lines(entries, self.cache.line_kib as u64 * 2, cap))]
                }
                _ => warm,
            };
            self.warm(&mut sim, warm)?;
        }
        let span_us = entries.last().map_or(0, |e| e.time_us);
        let window = Window {
            warmup: Nanos(0),
            duration: Nanos((span_us + 1_000_000) * 1000),
            sample: Nanos((self.sample_s * 1e9) as u64),
        };
        let mut r = sim.run(Load::Trace(entries), window);
        let mut hits: Option<crate::mrc::Point> = None;
        for t in &sim.targets {
            let Some(c) = t
                .cache
                .as_ref()
                .and_then(|c| c.cache.core_counters(CoreId(0)))
            else {
                continue;
            };
            let h = hits.get_or_insert_with(Default::default);
            h.reads += c.read.total();
            h.writes += c.write.total();
            h.read_hits += c.read.full_hit;
            h.write_hits += c.write.full_hit;
            h.partial_hits += c.read.partial_hit + c.write.partial_hit;
        }
        r.hits = hits;
        Ok(r)
    }

    /// Runs every workload under every config.
    pub fn run_all(
        &self,
        seed: u64,
        mut progress: impl FnMut(&str, &str, &RunResult),
    ) -> Result<Vec<Run>, String> {
        let mut out = Vec::new();
        for w in &self.workload {
            for c in &self.config {
                let r = self.run_one(w, c, seed)?;
                progress(&w.name, &c.name, &r);
                out.push(Run {
                    workload: w.name.clone(),
                    config: c.name.clone(),
                    result: r,
                });
            }
        }
        Ok(out)
    }
}

/// The core lines of `entries` by their last touch, oldest first, the last `cap` of them.
fn trace_lines(entries: &[TraceEntry], line_blocks: u64, cap: usize) -> Vec<u64> {
    let mut last: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut n = 0;
    for e in entries {
        let first = e.io.lba / line_blocks;
        let end = (e.io.lba + e.io.blocks.max(1) as u64).div_ceil(line_blocks);
        for l in first..end {
            last.insert(l, n);
            n += 1;
        }
    }
    let mut lines: Vec<(usize, u64)> = last.into_iter().map(|(l, t)| (t, l)).collect();
    lines.sort_unstable();
    let skip = lines.len().saturating_sub(cap);
    lines.into_iter().skip(skip).map(|(_, l)| l).collect()
}

fn sim_volume(sim: &Sim) -> u64 {
    sim.volume_blocks()
}

/// FNV-1a of a string (seeds per workload).
pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Ceph-like placement: the client volume is cut into objects; each object's primary OSD is
/// chosen by hash, its replicas are on the next nodes; on each OSD, objects are laid out at
/// scattered positions over the whole disk (BlueStore allocates where it finds space).
pub struct Cluster {
    /// Per object: (OSD, slot on that OSD's disk in objects), primary first.
    pub placement: Vec<Vec<(usize, u64)>>,
    obj_blocks: u64,
}

impl Cluster {
    fn new(cl: &ClusterSpec, osds: usize, hdd_blocks: u64, obj_blocks: u64) -> Cluster {
        let per_osd_objects = (cl.working_set_gib_per_osd * GIB as f64) as u64 / (obj_blocks * 512);
        let objects = per_osd_objects * osds as u64 / cl.replicas as u64;
        let span = cl.span_gib.map_or(hdd_blocks, |g| {
            ((g * BLOCKS_PER_GIB as f64) as u64).min(hdd_blocks)
        });
        let disk_slots = (span / obj_blocks).max(1);
        let mut used = vec![0u64; osds];
        let mut placement = Vec::with_capacity(objects as usize);
        for obj in 0..objects {
            let h = crate::rng::Rng::new(obj ^ 0x000b_1ec7).next_u64();
            let primary = (h % osds as u64) as usize;
            let mut places = Vec::new();
            for r in 0..cl.replicas as usize {
                let osd = (primary + r * cl.osds_per_node as usize) % osds;
                // The n-th object on a disk goes to a scattered slot (a bijection over slots).
                let n = used[osd];
                used[osd] += 1;
                let slot = ((n as u128 * 2_654_435_761u128 + osd as u128 * 7919)
                    % disk_slots as u128) as u64;
                places.push((osd, slot));
            }
            placement.push(places);
        }
        Cluster {
            placement,
            obj_blocks,
        }
    }
}

impl Router for Cluster {
    fn route(&self, io: &ClientIo, out: &mut Vec<(usize, u64)>) {
        let obj = (io.lba / self.obj_blocks) as usize % self.placement.len();
        let within = io.lba % self.obj_blocks;
        let places = &self.placement[obj];
        let n = if io.read { 1 } else { places.len() };
        for &(osd, slot) in &places[..n] {
            out.push((osd, slot * self.obj_blocks + within));
        }
    }
    fn volume_blocks(&self) -> u64 {
        self.placement.len() as u64 * self.obj_blocks
    }
}
