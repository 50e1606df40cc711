//! `tiercache bench`: the Ceph caching studies' workload matrix, baseline vs cached, over NBD
//! (SPEC C15, issue 6).
//!
//! Everything runs in this process except the load generator (and, with `--core rbd`, Ceph): a
//! cache file and one core per configuration (so the baseline never sees cached writes) — two
//! emulated HDDs (`emu:PRESET:FILE`) in a scratch directory by default, or with `--core rbd`
//! two RBD images on a single-node cluster the bench starts (`scripts/ceph-cluster.sh`, or
//! `--ceph-conf`'s), each written end to end first — the daemon's registry holding the cache,
//! and an NBD server on a unix socket exporting `baseline` (the bare core) and `cached` (the
//! other core through the cache). fio's `nbd` engine drives each workload. Peers run on a
//! third core of the same kind: nbdkit's cache filter (emu), plain librbd and librbd's
//! in-memory writeback cache through fio's `rbd` engine (rbd). The cached export is warmed
//! first with a sequential read pass over the random working set (sequential cutoff off, then
//! back to `--seq-cutoff`). Hit ratio and dirty % come from the server's own counters, reset
//! before each cached run; during cached runs a sampler records IOPS and dirty % per second.
//! Results: a table on stdout, and in `--out`: `results.json`, `report.md`, `report.html`
//! (self-contained, with plots) and the plots as `.svg`.

use super::kit::fio::{
    STUCK, Workload, fio_version, parse_fio, run_fio, run_fio_size, run_own, warm_own,
};
use super::kit::host::tool_version;
use super::kit::procs::{Procs, STOP, install_sigint};
use super::kit::report::{Bar, close_run, git_commit, open_report, report_header, verdict};
use super::kit::stats::pct;
use crate::bench_ceph::{CephArgs, ClientConfs, Cluster, FioTarget};
use crate::svg;
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_core::units::CoreId;
use tiercache_daemon::registry::{NewCache, Registry, set_param};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server};

/// Arguments of `tiercache bench` (the matrix).
#[derive(clap::Args, Default)]
pub struct Args {
    /// The embedded default: file cache, emulated 10k RPM HDD cores, short runs (about 5 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Directory for the report (results.json, report.md, report.html, plots) and the
    /// in-process daemon's log (daemon.log). Default: a new `tiercache-bench-report-*`
    /// directory under the temporary directory ($TMPDIR, else /tmp), printed at the start and
    /// the end.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seconds per run (default 8 with --quick, 30 otherwise).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Queue depth.
    #[arg(long, default_value_t = 16)]
    pub iodepth: u32,
    /// Cache mode of the cached configuration.
    #[arg(long, default_value = "wb", value_parser = crate::choices::words::<crate::choices::Mode>())]
    pub mode: String,
    /// Core devices: `emu` (emulated HDDs on files, `--core-preset`) or `rbd` (RBD images on a
    /// Ceph cluster: a single-node one the bench starts with scripts/ceph-cluster.sh, or
    /// `--ceph-conf`'s). Each configuration gets its own image, written end to end first.
    #[arg(long, default_value = "emu", value_parser = crate::choices::words::<crate::choices::CoreKind>())]
    pub core: String,
    /// Emulated core device preset (see `tiercache sim` presets), with `--core emu`.
    #[arg(long, default_value = "hdd-10k-sas")]
    pub core_preset: String,
    /// With `--core rbd`: the cluster.
    #[command(flatten)]
    pub ceph: CephArgs,
    /// Cache size (k/m/g).
    #[arg(long, default_value = "1g")]
    pub cache_size: String,
    /// Working set of the random workloads (k/m/g); must fit the cache to measure hits.
    #[arg(long, default_value = "256m")]
    pub working_set: String,
    /// Only workloads whose name contains this text.
    #[arg(long)]
    pub only: Option<String>,
    /// Scratch directory for the device files (default: the system's temporary directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// Load generator: fio (its nbd engine), own (tiercache-loadgen), or auto (fio when
    /// installed).
    #[arg(long, default_value = "auto", value_parser = crate::choices::words::<crate::choices::LoadGenerator>())]
    pub load_generator: String,
    /// The full procedures: the dirty-full run for 5 minutes per queue depth.
    #[arg(long)]
    pub full: bool,
    /// Skip the sequential-cutoff and dirty-full procedures after the matrix (they are
    /// skipped with --only too).
    #[arg(long)]
    pub no_studies: bool,
    /// Peers measured beside tiercache, each over its own copy of the same core, comma
    /// separated: `cached-ram` (emu cores: tiercache `wt` on a `ram:` cache of the same size,
    /// 4K random workloads only), `nbdkit-cache` (emu cores: nbdkit's cache filter), `librbd`
    /// and `librbd-wb` (rbd cores: fio's rbd engine without and with librbd's in-memory
    /// writeback cache); `auto` (those whose tools are installed) or `none`.
    #[arg(long, default_value = "auto")]
    pub peers: String,
    /// Sequential cutoff policy of the cached configuration during the runs and beside the
    /// cutoff procedure's reader: always, full or never (the warm-up runs with it off).
    #[arg(long, default_value = "always", value_parser = crate::choices::words::<crate::choices::CutoffPolicy>())]
    pub seq_cutoff: String,
    /// Run a study instead of the matrix: `ceph-osd` (BlueStore OSDs whose data device is a
    /// bare emulated HDD, the same with DB/WAL on a fast file, or tiercache over the HDD;
    /// docs/CEPH.md "tiercache under an OSD").
    #[arg(long, value_parser = ["ceph-osd"])]
    pub study: Option<String>,
    /// With --study ceph-osd: OSDs per layout, 1-3 (replica min(OSDs, 2)).
    #[arg(long, default_value_t = 2)]
    pub osds: u32,
    /// With --study ceph-osd: the layouts, comma separated, from hdd, hdd+db, tiercache.
    #[arg(long, default_value = "hdd,hdd+db,tiercache")]
    pub layouts: String,
    /// With --study ceph-osd: the RBD image fio runs on (k/m/g; default: half of --cache-size
    /// per OSD's share of the data, as in the study, where the working set fits the cache).
    #[arg(long)]
    pub image_size: Option<String>,
}

/// The peer: nbdkit's cache filter (writeback, 4K blocks, cache-on-read, as big as our cache)
/// over the nbd plugin, connected to a bare emulated core exported by the bench's server.
const NBDKIT_CACHE: &str = "nbdkit-cache";
/// tiercache on a `ram:` cache (`wt`: a volatile cache holds no dirty data) over its own copy
/// of the emulated core: the same class of storage as nbdkit's page-cache-backed filter.
const CACHED_RAM: &str = "cached-ram";
/// The peers on an RBD core: fio's rbd engine with `rbd_cache = false` (plain librbd) and with
/// librbd's in-memory writeback cache (`crate::bench_ceph::ClientConfs`).
const LIBRBD: &str = "librbd";
const LIBRBD_WB: &str = "librbd-wb";

/// The peers to run: `--peers` for this core kind (`rbd`: an RBD core), given which tools are
/// installed. `auto` leaves out (and says so) what cannot run; naming one that cannot run is
/// an error.
fn choose_peers(
    want: &str,
    rbd: bool,
    nbdkit: bool,
    fio: bool,
) -> Result<(Vec<&'static str>, Vec<String>), String> {
    let mut notes = Vec::new();
    let possible: &[&'static str] = if rbd {
        &[LIBRBD, LIBRBD_WB]
    } else {
        &[CACHED_RAM, NBDKIT_CACHE]
    };
    let missing = |p: &str| -> Option<&'static str> {
        match p {
            NBDKIT_CACHE if !nbdkit => Some("nbdkit is not installed (apt-get install nbdkit)"),
            LIBRBD | LIBRBD_WB if !fio => Some(
                "it runs with fio's rbd engine and fio is not used (apt-get install fio; not with --load-generator own)",
            ),
            _ => None,
        }
    };
    match want {
        "none" => Ok((vec![], notes)),
        "auto" => {
            let mut v = Vec::new();
            for &p in possible {
                match missing(p) {
                    Some(why) => notes.push(format!("peers: no {p} runs: {why}")),
                    None => v.push(p),
                }
            }
            Ok((v, notes))
        }
        list => {
            let mut v: Vec<&'static str> = Vec::new();
            for p in list.split(',').map(str::trim) {
                let Some(&known) = [CACHED_RAM, NBDKIT_CACHE, LIBRBD, LIBRBD_WB]
                    .iter()
                    .find(|k| **k == p)
                else {
                    return Err(format!(
                        "--peers {list}: unknown peer '{p}' (want auto, none, or a list of cached-ram, nbdkit-cache, librbd, librbd-wb)"
                    ));
                };
                if !possible.contains(&known) {
                    return Err(format!(
                        "--peers {p}: a peer of {} cores only (this run's core is {})",
                        if rbd { "emu" } else { "rbd" },
                        if rbd { "rbd" } else { "emu" }
                    ));
                }
                if let Some(why) = missing(known) {
                    return Err(format!("--peers {p}: {why}"));
                }
                if !v.contains(&known) {
                    v.push(known);
                }
            }
            Ok((v, notes))
        }
    }
}

pub(crate) const MATRIX: [Workload; 5] = [
    Workload {
        name: "randread-4k",
        rw: "randread",
        bs: "4k",
        mix: None,
        random: true,
    },
    Workload {
        name: "randwrite-4k",
        rw: "randwrite",
        bs: "4k",
        mix: None,
        random: true,
    },
    Workload {
        name: "randrw70-4k",
        rw: "randrw",
        bs: "4k",
        mix: Some(70),
        random: true,
    },
    Workload {
        name: "seqread-512k",
        rw: "read",
        bs: "512k",
        mix: None,
        random: false,
    },
    Workload {
        name: "seqwrite-512k",
        rw: "write",
        bs: "512k",
        mix: None,
        random: false,
    },
];

/// One measured run.
#[derive(Clone, Debug)]
struct RunResult {
    workload: String,
    config: String,
    iops: f64,
    bw_mbps: f64,
    lat_mean_us: f64,
    lat_p99_us: f64,
    lat_p999_us: f64,
    hit_ratio: Option<f64>,
    dirty_pct: Option<f64>,
    /// (percentile, latency µs) for the CDF.
    cdf: Vec<(f64, f64)>,
    /// Per second: (t, IOPS, dirty %), cached runs only.
    series: Vec<(f64, f64, f64)>,
    cut_short: bool,
}

/// Sets cache `id`'s sequential cutoff policy (the warm-ups run with it off).
pub(crate) fn seq_cutoff(reg: &Registry, id: u16, policy: &str) -> Result<(), String> {
    set_param(
        reg,
        id,
        None,
        "seq-cutoff",
        &[("policy".into(), policy.into())],
    )
    .map(|_| ())
}

/// Server counters for the cached configuration: (requests, hits, dirty %).
pub(crate) fn counters(reg: &Registry, cache: u16) -> (u64, u64, f64) {
    match tiercache_daemon::stats::cache_stats(reg, cache, None, None) {
        Ok(s) => {
            let r = &s["requests"];
            let hits = [
                "read_full_hits",
                "read_partial_hits",
                "write_full_hits",
                "write_partial_hits",
            ]
            .iter()
            .map(|k| r[*k].as_u64().unwrap_or(0))
            .sum();
            (
                r["total"].as_u64().unwrap_or(0),
                hits,
                s["usage"]["dirty_pct"].as_f64().unwrap_or(0.0),
            )
        }
        Err(_) => (0, 0, 0.0),
    }
}

/// Runs the matrix.
pub fn run(mut a: Args) -> Result<(), String> {
    if a.study.is_some() {
        return crate::bench_osd::run(a);
    }
    let runtime = a.runtime.unwrap_or(if a.quick { 8 } else { 30 });
    if runtime == 0 || a.iodepth == 0 || a.iodepth > 1024 {
        return Err("--runtime must be at least 1 and --iodepth 1-1024".into());
    }
    let cache_bytes = tiercache_daemon::device::parse_size(&a.cache_size)?;
    let ws = tiercache_daemon::device::parse_size(&a.working_set)?;
    if cache_bytes < 64 << 20 || ws < 16 << 20 {
        return Err("--cache-size must be at least 64m and --working-set at least 16m".into());
    }
    let fio = match a.load_generator.as_str() {
        "auto" => fio_version(),
        "fio" => Some(
            fio_version()
                .ok_or("fio is not installed (apt-get install fio); or use --load-generator own")?,
        ),
        "own" => None,
        g => return Err(format!("--load-generator {g}: want fio, own or auto")),
    };
    let fio = fio.as_deref().unwrap_or("");
    let selected: Vec<&Workload> = MATRIX
        .iter()
        .filter(|w| a.only.as_deref().is_none_or(|o| w.name.contains(o)))
        .collect();
    if selected.is_empty() {
        return Err(format!(
            "--only {:?} matches no workload (randread-4k, randwrite-4k, randrw70-4k, seqread-512k, seqwrite-512k)",
            a.only.unwrap_or_default()
        ));
    }
    let rbd = match a.core.as_str() {
        "emu" => false,
        "rbd" => true,
        c => return Err(format!("--core {c}: want emu or rbd")),
    };
    if !rbd && a.ceph.ceph_conf.is_some() {
        return Err("--ceph-conf applies to --core rbd only".into());
    }
    tiercache_io::parse_emu(&format!("emu:{}:/x", a.core_preset))?;
    if !["always", "full", "never"].contains(&a.seq_cutoff.as_str()) {
        return Err(format!(
            "--seq-cutoff {}: want always, full or never",
            a.seq_cutoff
        ));
    }
    let nbdkit = !rbd && a.peers != "none" && tool_version("nbdkit").is_some();
    let (peers, notes) = choose_peers(&a.peers, rbd, nbdkit, !fio.is_empty())?;
    for n in notes {
        println!("{n}");
    }
    let out = open_report(a.out.as_deref())?;
    a.out = Some(out.clone());
    let scratch = a
        .scratch
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("tiercache-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let res = run_in(
        &a,
        &scratch,
        runtime,
        cache_bytes,
        ws,
        fio,
        &selected,
        &peers,
    );
    close_run(&scratch);
    res
}

impl Args {
    /// The report directory (set by [`run`] before anything runs).
    fn out_dir(&self) -> &Path {
        self.out.as_deref().unwrap_or(Path::new("."))
    }
}

#[allow(clippy::too_many_arguments)]
fn run_in(
    a: &Args,
    scratch: &Path,
    runtime: u64,
    cache_bytes: u64,
    ws: u64,
    fio: &str,
    selected: &[&Workload],
    peers: &[&str],
) -> Result<(), String> {
    install_sigint();
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    let rbd = a.core == "rbd";
    let seq_region_emu = (cache_bytes * 2).min((ws * 8).max(4 << 30));
    // An RBD image holds just the regions the workloads touch (each is written end to end
    // first, so that no run pays for creating RADOS objects).
    let core_bytes = if rbd {
        seq_region_emu.max(ws).div_ceil(1 << 20) << 20
    } else {
        (ws * 8).max(4 << 30)
    };
    let seq_region = (cache_bytes * 2).min(core_bytes);
    let file = |n: &str, b: u64| -> Result<String, String> {
        let p = scratch.join(n);
        let f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        f.set_len(b).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p.display().to_string())
    };
    let cache = file("cache.img", cache_bytes)?;
    // The core devices of the baseline and the cached configuration, what the peers run on,
    // and (rbd) the cluster, dropped last: it is stopped, or its images removed, on drop.
    let mut setup = json!({});
    let mut cluster: Option<Cluster> = None;
    let mut rbd_peer: Option<(ClientConfs, String)> = None;
    let (base_dev, cached_dev, core_desc) = if rbd {
        let librbd_peers = peers.iter().any(|p| [LIBRBD, LIBRBD_WB].contains(p));
        let images = 2 + u64::from(librbd_peers);
        // Sparse: a generous size costs nothing. BlueStore needs room beyond the images (its
        // metadata, and overwrites before space is freed); a full OSD blocks writes.
        let osd_bytes = (core_bytes * images * 2 + (4 << 30)).max(10 << 30);
        let mut c = a.ceph.cluster(scratch, osd_bytes, &mut setup)?;
        let confs = ClientConfs::write(&c, scratch, &mut setup)?;
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
        let devs = (
            confs.core_device(&c, &names[0]),
            confs.core_device(&c, &names[1]),
            desc,
        );
        if librbd_peers {
            rbd_peer = Some((confs, names[2].clone()));
        }
        cluster = Some(c);
        devs
    } else {
        (
            format!(
                "emu:{}:{}",
                a.core_preset,
                file("core-baseline.img", core_bytes)?
            ),
            format!(
                "emu:{}:{}",
                a.core_preset,
                file("core-cached.img", core_bytes)?
            ),
            format!("emu:{} (emulated)", a.core_preset),
        )
    };
    let reg = Arc::new(Registry::new());
    reg.start_cache(NewCache {
        device: &cache,
        id: Some(1),
        mode: Some(&a.mode),
        line_size: None,
        load: false,
        force: false,
        dry_run: false,
    })?;
    reg.add_core(1, &cached_dev, Some(0), Some("cached"))?;
    let engine = reg.engine(1)?;
    let exports = Arc::new(ExportMap::new());
    let bare = tiercache_daemon::device::DeviceSpec::parse(&base_dev)?.open("the baseline core")?;
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
    if peers.contains(&CACHED_RAM) {
        reg.start_cache(NewCache {
            device: &format!("ram:{cache_bytes}"),
            id: Some(2),
            mode: Some("wt"),
            line_size: None,
            load: false,
            force: false,
            dry_run: false,
        })?;
        let core = file("core-ram.img", core_bytes)?;
        reg.add_core(
            2,
            &format!("emu:{}:{core}", a.core_preset),
            Some(0),
            Some(CACHED_RAM),
        )?;
        // It runs the random workloads only: no cutoff, also during the warm-up.
        seq_cutoff(&reg, 2, "never")?;
        exports.insert(
            CACHED_RAM,
            "the emulated core through a ram: cache (wt)",
            Arc::new(EngineExport::new(reg.engine(2)?, CoreId(0))),
        );
    }
    let nbdkit_peer = peers.contains(&NBDKIT_CACHE);
    if nbdkit_peer {
        let peer_core = file("core-peer.img", core_bytes)?;
        let bare = tiercache_io::open_emu(&format!("emu:{}:{peer_core}", a.core_preset))?;
        exports.insert(
            "peer-core",
            "the bare emulated core under nbdkit's cache filter",
            Arc::new(BackendExport::new(Arc::new(bare))),
        );
    }
    let sock = scratch.join("nbd.sock");
    let server = Server::new(exports, Default::default());
    server.listen(&ListenAddr::Unix(sock.clone()))?;
    // Every child this run starts; dropping it stops them (errors and Ctrl-C included).
    let mut procs = Procs::default();
    let peer_sock = scratch.join("nbdkit-cache.sock");
    if nbdkit_peer {
        let tmp = scratch.join("nbdkit-tmp");
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
            format!("cache-max-size={cache_bytes}"),
        ];
        let pid = procs.spawn(
            "nbdkit cache",
            None,
            Path::new("nbdkit"),
            &args,
            &[("TMPDIR", &tmp)],
            scratch.join("nbdkit-cache.log"),
        )?;
        procs.wait_socket(pid, &peer_sock)?;
    }
    let uri = |name: &str| {
        if name == NBDKIT_CACHE {
            format!("nbd+unix:///?socket={}", peer_sock.display())
        } else {
            format!("nbd+unix:///{name}?socket={}", sock.display())
        }
    };
    // What fio runs against: the librbd peers through its rbd engine, the rest over NBD.
    let target = |name: &str| -> FioTarget {
        match (&rbd_peer, &cluster) {
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
            _ => FioTarget::Nbd { uri: uri(name) },
        }
    };
    println!(
        "tiercache bench{}: {} workloads x (baseline, cached {}, seq-cutoff {}{}), QD {}, {} s each; core {}, cache {} file ({}); {}",
        if a.quick { " --quick" } else { "" },
        selected.len(),
        a.mode,
        a.seq_cutoff,
        peers.iter().map(|p| format!(", {p}")).collect::<String>(),
        a.iodepth,
        runtime,
        core_desc,
        a.cache_size,
        engine.with_cache(|c| format!("{} lines", c.config().lines)),
        if fio.is_empty() {
            "tiercache-loadgen"
        } else {
            fio
        }
    );

    // Warm the cached export: a sequential read pass over the random working set with the
    // cutoff off, so every line is promoted.
    let t = Instant::now();
    seq_cutoff(&reg, 1, "never")?;
    let warm = Workload {
        name: "warm-up",
        rw: "read",
        bs: "1m",
        mix: None,
        random: false,
    };
    let warm_secs = 600;
    let mut cmd_ok = true;
    // nbdkit's cache filter is warmed the same way (it caches what it reads). librbd's cache
    // lives in the fio process of each run: there is nothing to warm.
    for config in std::iter::once("cached").chain(
        peers
            .iter()
            .copied()
            .filter(|p| [NBDKIT_CACHE, CACHED_RAM].contains(p)),
    ) {
        let label = format!("warm-up {config}");
        let v = if fio.is_empty() {
            warm_own(&uri(config), ws).map(|_| Value::Null)
        } else {
            run_fio_size(&target(config), &warm, ws, warm_secs, &|f| {
                bar.show(&label, f)
            })
        };
        bar.end();
        if let Err(e) = v {
            cmd_ok = false;
            eprintln!("{label} failed: {e}");
        }
    }
    seq_cutoff(&reg, 1, &a.seq_cutoff)?;
    let warmed = engine.with_cache(|c| c.occupancy() as u64 * c.config().line_size.bytes());
    println!(
        "warm-up: {} MiB of the {} MiB working set cached in {:.1} s",
        warmed >> 20,
        ws >> 20,
        t.elapsed().as_secs_f64()
    );
    if !cmd_ok {
        return Err("the warm-up failed; see above".into());
    }

    let mut results: Vec<RunResult> = Vec::new();
    let configs: Vec<&str> = ["baseline", "cached"]
        .into_iter()
        .chain(peers.iter().copied())
        .collect();
    // The `ram:` cache runs the 4K random rows (the class of storage is the point there).
    let applies = |w: &Workload, c: &str| c != CACHED_RAM || (w.random && w.bs == "4k");
    let total: usize = selected
        .iter()
        .map(|w| configs.iter().filter(|c| applies(w, c)).count())
        .sum();
    let mut k = 0;
    'outer: for w in selected {
        for &config in &configs {
            if STOP.load(Ordering::Relaxed) {
                break 'outer;
            }
            if !applies(w, config) {
                continue;
            }
            k += 1;
            let label = format!("[{k}/{total}] {} {config}", w.name);
            let region = if w.random { ws } else { seq_region };
            // The tiercache cache this run measures (hit ratio, dirty, the series).
            let ours = match config {
                "cached" => Some(1),
                CACHED_RAM => Some(2),
                _ => None,
            };
            let before = if let Some(id) = ours {
                reg.reset_counters(id)?;
                Some(counters(&reg, id))
            } else {
                None
            };
            let series = Arc::new(Mutex::new(Vec::new()));
            let sampling = Arc::new(AtomicBool::new(ours.is_some()));
            let id = ours.unwrap_or(1);
            let sampler = {
                let reg = reg.clone();
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
            let v = if fio.is_empty() {
                run_own(&uri(config), w, region, a.iodepth, runtime, &|f| {
                    bar.show(&label, f)
                })
            } else {
                run_fio(&target(config), w, region, a.iodepth, runtime, &|f| {
                    bar.show(&label, f)
                })
                .and_then(|v| parse_fio(&v))
            };
            sampling.store(false, Ordering::Relaxed);
            let _ = sampler.join();
            bar.end();
            let v = match v {
                Ok(v) => v,
                Err(e) if STOP.load(Ordering::Relaxed) => {
                    eprintln!("{label}: stopped ({e})");
                    break 'outer;
                }
                Err(e) if e.starts_with(STUCK) => {
                    // Stopping the server or the cache would wait for that IO too: say so,
                    // stop what this run started and exit.
                    eprintln!("tiercache: {label}: {e}; stopping");
                    procs.stop_all();
                    if let Some(c) = cluster.as_mut() {
                        c.stop();
                    }
                    let _ = std::fs::remove_dir_all(scratch);
                    std::process::exit(1);
                }
                Err(e) => return Err(format!("{label}: {e}")),
            };
            let (iops, bw, mean, p99, p999, cdf) = v;
            let (hit_ratio, dirty) = match before {
                Some(_) => {
                    let (n, h, d) = counters(&reg, id);
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
                series: series.lock().map(|s| s.clone()).unwrap_or_default(),
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
                hits_dirty(r.hit_ratio, r.dirty_pct)
            );
            results.push(r);
        }
    }
    procs.stop_all();
    server.shutdown();
    drop(engine);
    let _ = reg.stop_cache(1, true, |_, _, _| {});
    if peers.contains(&CACHED_RAM) {
        let _ = reg.stop_cache(2, true, |_, _, _| {});
    }
    let table = table(&results) + &legend(a, &core_desc, peers);
    println!("\n{table}");
    // The cache device's own ceiling for P3's rows, measured now on the same file system
    // (a target above it cannot be met on this machine by any cache; both are reported).
    let ceiling = if !rbd && !fio.is_empty() && !STOP.load(Ordering::Relaxed) {
        device_ceiling(scratch, selected, ws, a.iodepth, runtime, &bar)
    } else {
        Vec::new()
    };
    let mut targets = if rbd {
        ceph_summary(&results)
    } else {
        p3_summary(&results, &ceiling)
    };
    if let Some(t) = &targets.1 {
        print!("{t}");
    }
    if rbd && !a.no_studies {
        println!(
            "(targets P3-P5 are defined on the emulated HDD: run without --core rbd for their procedures)"
        );
    }
    if !rbd && a.only.is_none() && !a.no_studies && !STOP.load(Ordering::Relaxed) {
        let plan =
            super::studies::Plan::new(a.quick, a.full, a.iodepth, &a.core_preset, &a.seq_cutoff);
        let show = |l: &str, f: f64| bar.show(l, f);
        let end = || bar.end();
        let ui = super::studies::Ui {
            show: &show,
            end: &end,
            stop: &STOP,
        };
        match super::studies::run(&plan, scratch, &ui) {
            Ok((v, t)) => {
                targets.0["p4_p5"] = v;
                targets.1 = Some(targets.1.unwrap_or_default() + &t);
            }
            Err(e) => {
                eprintln!("the P4/P5 procedures failed: {e}");
                targets.0["p4_p5_error"] = json!(e);
            }
        }
    }
    let stopped = STOP.load(Ordering::Relaxed);
    let generator = if fio.is_empty() {
        "tiercache-loadgen".to_string()
    } else {
        format!("{fio} (nbd engine)")
    };
    let generator = if rbd_peer.is_some() {
        format!("{generator}; the librbd peers with its rbd engine")
    } else {
        generator
    };
    let info = ReportInfo {
        generator: &generator,
        core: &core_desc,
        setup: &setup,
        peers,
    };
    write_report(&info, a, runtime, &results, &table, &targets, stopped)?;
    println!("report: {}", a.out_dir().join("report.html").display());
    if stopped {
        println!("(stopped by Ctrl-C: the report holds what was measured)");
    }
    Ok(())
}

/// What each configuration of the table is, and where its cache lives.
fn legend(a: &Args, core: &str, peers: &[&str]) -> String {
    let mut t = format!(
        "baseline: the bare core, {core}\ncached: tiercache {} on a {} file cache (O_DIRECT: the device a deployment uses), sequential cutoff {}\n",
        a.mode, a.cache_size, a.seq_cutoff
    );
    for p in peers {
        t += match *p {
            CACHED_RAM => {
                "cached-ram: tiercache wt on a ram: cache of the same size (process memory, like nbdkit's page-cache-backed filter; wt: a write reaches the core before its reply, as a volatile cache must); 4K random rows only\n"
            }
            NBDKIT_CACHE => {
                "nbdkit-cache: nbdkit's cache filter (writeback, 4K blocks, cache-on-read) over its own copy of the core; its cache is a deleted temp file, i.e. the page cache, lost with the process\n"
            }
            LIBRBD => "librbd: fio's rbd engine on its own image, rbd_cache = false\n",
            LIBRBD_WB => "librbd-wb: fio's rbd engine with librbd's in-memory writeback cache\n",
            _ => "",
        };
    }
    t
}

fn table(results: &[RunResult]) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "{:<14} {:<12} {:>10} {:>9} {:>10} {:>10} {:>11} {:>9} {:>6} {:>7}\n",
        "workload",
        "config",
        "IOPS",
        "MB/s",
        "mean us",
        "p99 us",
        "p99.9 us",
        "speedup",
        "hits",
        "dirty"
    ));
    for r in results {
        let base = results
            .iter()
            .find(|b| b.workload == r.workload && b.config == "baseline")
            .map(|b| b.iops)
            .unwrap_or(0.0);
        t.push_str(&format!(
            "{:<14} {:<12} {:>10.0} {:>9.1} {:>10.1} {:>10.1} {:>11.1} {:>8.2}x {:>6} {:>7}\n",
            r.workload,
            r.config,
            r.iops,
            r.bw_mbps,
            r.lat_mean_us,
            r.lat_p99_us,
            r.lat_p999_us,
            if base > 0.0 { r.iops / base } else { 0.0 },
            r.hit_ratio
                .map(|h| format!("{:.1}%", h * 100.0))
                .unwrap_or_else(|| "-".into()),
            r.dirty_pct
                .map(|d| format!("{d:.1}%"))
                .unwrap_or_else(|| "-".into()),
        ));
    }
    t
}

/// `  hits H%  dirty D%` of a run line, empty for a run without a cache.
pub(crate) fn hits_dirty(hits: Option<f64>, dirty_pct: Option<f64>) -> String {
    hits.map(|h| {
        format!(
            "  hits {:.1}%  dirty {:.1}%",
            h * 100.0,
            dirty_pct.unwrap_or(0.0)
        )
    })
    .unwrap_or_default()
}

/// The cache device's own IOPS for P3's workloads: fio (io_uring, `O_DIRECT`) on a file of
/// the working set's size beside the cache file, written end to end first (a read of a hole
/// never reaches the device), at the matrix's queue depth and run time. A run that fails is
/// left out (said on stderr).
fn device_ceiling(
    scratch: &Path,
    selected: &[&Workload],
    ws: u64,
    qd: u32,
    runtime: u64,
    bar: &Bar,
) -> Vec<(String, f64)> {
    let path = scratch.join("device-ceiling.img");
    let target = FioTarget::File { path: path.clone() };
    let fill = Workload {
        name: "device-fill",
        rw: "write",
        bs: "1m",
        mix: None,
        random: false,
    };
    let mut out = Vec::new();
    let label = "the cache device alone: writing the file";
    let filled = run_fio_size(&target, &fill, ws, 600, &|f| bar.show(label, f));
    bar.end();
    if let Err(e) = filled {
        eprintln!("{label}: {e}");
    } else {
        for w in selected
            .iter()
            .filter(|w| ["randread-4k", "randwrite-4k"].contains(&w.name))
        {
            let label = format!("the cache device alone: {}", w.name);
            let v = run_fio(&target, w, ws, qd, runtime, &|f| bar.show(&label, f))
                .and_then(|v| parse_fio(&v));
            bar.end();
            match v {
                Ok(n) => out.push((w.name.to_string(), n.0)),
                Err(e) => eprintln!("{label}: {e}"),
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    out
}

/// SPEC P3 and the matrix's half of P4 from the matrix's runs, with the cache device's own
/// IOPS (`ceiling`) beside P3's rows: (JSON, text).
fn p3_summary(results: &[RunResult], ceiling: &[(String, f64)]) -> (Value, Option<String>) {
    let get = |w: &str, c: &str| results.iter().find(|r| r.workload == w && r.config == c);
    let mut v = json!({});
    let mut t = String::new();
    for (w, want, name) in [
        ("randread-4k", 100.0, "4K random read hits"),
        ("randwrite-4k", 80.0, "4K random writes"),
    ] {
        if let (Some(b), Some(c)) = (get(w, "baseline"), get(w, "cached")) {
            let x = c.iops / b.iops.max(1e-9);
            let lat = c.lat_p99_us / b.lat_p99_us.max(1e-9) * 100.0;
            v[format!("p3_{w}")] = json!({"speedup": x, "target_speedup": want,
                "p99_pct_of_uncached": lat, "target_p99_pct": 1.0,
                "met": x >= want && lat <= 1.0});
            t += &format!(
                "{} P3 {name}: {x:.1}x the uncached IOPS (target >= {want}x), p99 {lat:.1}% of uncached (target <= 1%)\n",
                verdict(x >= want && lat <= 1.0)
            );
            if let Some((_, d)) = ceiling.iter().find(|(n, _)| n == w) {
                let most = d / b.iops.max(1e-9);
                v[format!("p3_{w}")]["device_iops"] = json!(d);
                v[format!("p3_{w}")]["device_ceiling_speedup"] = json!(most);
                t += &format!(
                    "     the cache device alone (fio io_uring O_DIRECT, same QD): {d:.0} IOPS, so at most {most:.1}x on this machine; tiercache reaches {:.0}% of the device\n",
                    c.iops / d.max(1e-9) * 100.0
                );
            }
        }
    }
    for w in ["seqread-512k", "seqwrite-512k"] {
        if let (Some(b), Some(c)) = (get(w, "baseline"), get(w, "cached")) {
            let loss = (1.0 - c.bw_mbps / b.bw_mbps.max(1e-9)) * 100.0;
            v[format!("p4_{w}")] = json!({"bandwidth_loss_pct": loss, "target_pct": 2.0,
                "met": loss <= 2.0});
            t += &format!(
                "{} P4 {w} with the cutoff: {loss:.1}% bandwidth loss vs uncached (target <= 2%)\n",
                verdict(loss <= 2.0)
            );
        }
    }
    (
        v,
        (!t.is_empty()).then(|| format!("\nTargets (docs/TARGETS.md says what each id asks)\n{t}")),
    )
}

/// On an RBD core: how tiercache and librbd's writeback cache compare with the bare image and
/// with each other, per workload: (JSON, text).
fn ceph_summary(results: &[RunResult]) -> (Value, Option<String>) {
    let get = |w: &str, c: &str| results.iter().find(|r| r.workload == w && r.config == c);
    let mut v = json!({});
    let mut t = String::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in results {
        if !seen.contains(&r.workload.as_str()) {
            seen.push(&r.workload);
        }
    }
    for w in seen {
        let Some(b) = get(w, "baseline") else {
            continue;
        };
        let mut parts = Vec::new();
        let mut row = json!({});
        for c in ["cached", LIBRBD, LIBRBD_WB] {
            if let Some(r) = get(w, c) {
                let x = r.iops / b.iops.max(1e-9);
                let p99 = r.lat_p99_us / b.lat_p99_us.max(1e-9);
                row[c] = json!({"iops_vs_baseline": x, "p99_vs_baseline": p99});
                parts.push(format!("{c} {x:.2}x IOPS, p99 {p99:.2}x"));
            }
        }
        if let (Some(c), Some(p)) = (get(w, "cached"), get(w, LIBRBD_WB)) {
            let x = c.iops / p.iops.max(1e-9);
            row["cached_vs_librbd_wb"] = json!(x);
            parts.push(format!("tiercache {x:.2}x librbd-wb"));
        }
        v[w] = row;
        t += &format!("{w:<14} vs the bare image: {}\n", parts.join("; "));
    }
    (
        json!({ "ceph": v }),
        (!t.is_empty()).then(|| format!("\nOn Ceph\n{t}")),
    )
}

/// What a report says about the run besides its numbers.
struct ReportInfo<'a> {
    generator: &'a str,
    /// The core devices, for people.
    core: &'a str,
    /// The cluster and client configurations (rbd), else `{}`.
    setup: &'a Value,
    peers: &'a [&'a str],
}

fn write_report(
    info: &ReportInfo,
    a: &Args,
    runtime: u64,
    results: &[RunResult],
    table: &str,
    targets: &(Value, Option<String>),
    stopped: bool,
) -> Result<(), String> {
    let (generator, peers) = (info.generator, info.peers);
    let w = |name: &str, body: &str| -> Result<(), String> {
        let p = a.out_dir().join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))
    };
    let runs: Vec<Value> = results
        .iter()
        .map(|r| {
            json!({
                "workload": r.workload, "config": r.config, "iops": r.iops, "bw_mbps": r.bw_mbps,
                "lat_mean_us": r.lat_mean_us, "lat_p99_us": r.lat_p99_us, "lat_p999_us": r.lat_p999_us,
                "hit_ratio": r.hit_ratio, "dirty_pct": r.dirty_pct,
                "latency_cdf": r.cdf.iter().map(|(p, l)| json!({"percentile": p, "lat_us": l})).collect::<Vec<_>>(),
                "per_second": r.series.iter().map(|(t, i, d)| json!({"t": t, "iops": i, "dirty_pct": d})).collect::<Vec<_>>(),
                "cut_short": r.cut_short,
            })
        })
        .collect();
    let doc = report_header(
        "tiercache bench",
        json!({
        "config": {
            "quick": a.quick, "runtime_s": runtime, "iodepth": a.iodepth, "mode": a.mode,
            "core": info.core, "cache_size": a.cache_size, "ceph": info.setup,
            "working_set": a.working_set, "load_generator": generator,
            "seq_cutoff": a.seq_cutoff, "peers": peers,
        },
        "stopped_early": stopped,
        "runs": runs,
        "spec_targets": targets.0,
        }),
    );
    w(
        "results.json",
        &serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )?;

    // Plots.
    let mut cats: Vec<String> = Vec::new();
    for r in results {
        if !cats.contains(&r.workload) {
            cats.push(r.workload.clone());
        }
    }
    let val = |cfg: &str, f: &dyn Fn(&RunResult) -> f64| -> Vec<f64> {
        cats.iter()
            .map(|c| {
                results
                    .iter()
                    .find(|r| &r.workload == c && r.config == cfg)
                    .map(f)
                    .unwrap_or(0.0)
            })
            .collect()
    };
    let configs: Vec<&str> = ["baseline", "cached"]
        .into_iter()
        .chain(peers.iter().copied())
        .collect();
    let series = |f: &dyn Fn(&RunResult) -> f64| -> Vec<(&str, Vec<f64>)> {
        configs.iter().map(|c| (*c, val(c, f))).collect()
    };
    let iops = svg::bars(
        "IOPS per workload (log scale)",
        "IOPS",
        &cats,
        &series(&|r| r.iops),
        true,
    );
    let p99 = svg::bars(
        "p99 latency per workload (log scale)",
        "µs",
        &cats,
        &series(&|r| r.lat_p99_us),
        true,
    );
    let rw = results
        .iter()
        .find(|r| r.workload == "randwrite-4k" && r.config == "cached");
    let over_time = rw.map(|r| {
        svg::lines(
            "Sustained 4K random writes (cached): IOPS and dirty % per second",
            "seconds",
            "IOPS / dirty %",
            &[
                ("IOPS", r.series.iter().map(|(t, i, _)| (*t, *i)).collect()),
                (
                    "dirty % x100",
                    r.series.iter().map(|(t, _, d)| (*t, d * 100.0)).collect(),
                ),
            ],
            false,
        )
    });
    let cdf_series: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .filter(|r| r.workload == "randread-4k")
        .map(|r| {
            (
                r.config.clone(),
                r.cdf.iter().map(|(p, l)| (*l, *p)).collect(),
            )
        })
        .collect();
    let cdf_refs: Vec<(&str, Vec<(f64, f64)>)> = cdf_series
        .iter()
        .map(|(n, v)| (n.as_str(), v.clone()))
        .collect();
    let cdf = svg::lines(
        "4K random read latency CDF",
        "latency µs (log)",
        "percentile",
        &cdf_refs,
        true,
    );
    w("iops.svg", &iops)?;
    w("p99.svg", &p99)?;
    w("latency-cdf.svg", &cdf)?;
    if let Some(s) = &over_time {
        w("randwrite-over-time.svg", s)?;
    }

    let md = format!(
        "# tiercache bench\n\ncommit {}, {} s per run, QD {}, cache mode {} (sequential cutoff {}), core {}, cache {} file, working set {}.{}\n\n```\n{}```\n\nPlots: iops.svg, p99.svg, latency-cdf.svg{}; raw numbers: results.json.\n\nHit ratio and dirty % are the server's own counters, reset before each cached run. The baseline is {}, served bare by the same NBD server.{}{}\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        a.seq_cutoff,
        info.core,
        a.cache_size,
        a.working_set,
        if stopped {
            " Stopped early (Ctrl-C): partial results."
        } else {
            ""
        },
        table,
        if over_time.is_some() {
            ", randwrite-over-time.svg"
        } else {
            ""
        },
        if a.core == "rbd" {
            "another RBD image of the same size, written the same way"
        } else {
            "the same emulated device model on its own file"
        },
        if peers.contains(&NBDKIT_CACHE) {
            " `nbdkit-cache` is nbdkit's cache filter (writeback, 4K blocks, cache-on-read, as big as tiercache's cache, its cache file in the scratch directory) over its own copy of the emulated core, reached through nbdkit's nbd plugin; warmed the same way; its hit ratio is not known."
        } else {
            ""
        },
        if peers.contains(&LIBRBD) || peers.contains(&LIBRBD_WB) {
            " `librbd` and `librbd-wb` are fio's rbd engine on a third image, with `rbd_cache = false` and with librbd's in-memory writeback cache (`rbd_cache = true`, policy writeback, `rbd_cache_writethrough_until_flush = false`, librbd's default 32 MiB); their cache lives in each run's fio process, so they start cold; their hit ratio is not known."
        } else {
            ""
        }
    );
    let md = match &targets.1 {
        Some(t) => {
            // The text's first line is its heading ("SPEC targets", "On Ceph").
            let (head, body) = t
                .trim_start_matches('\n')
                .split_once('\n')
                .unwrap_or(("", t));
            format!("{md}\n## {head}\n\n```\n{body}```\n")
        }
        None => md,
    };
    w("report.md", &md)?;
    let html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tiercache bench</title>\n<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head><body>\n<h1>tiercache bench</h1>\n<p>commit {}, {} s per run, QD {}, cache mode {}, core {}, cache {} file, working set {}.{}</p>\n<pre>{}</pre>\n{}\n{}\n{}\n{}\n<p>Raw numbers: results.json. Hit ratio and dirty % are the server's own counters.</p>\n</body></html>\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        info.core,
        a.cache_size,
        a.working_set,
        if stopped {
            " <b>Stopped early (Ctrl-C): partial results.</b>"
        } else {
            ""
        },
        (table.to_string() + targets.1.as_deref().unwrap_or(""))
            .replace('&', "&amp;")
            .replace('<', "&lt;"),
        iops,
        p99,
        over_time.unwrap_or_default(),
        cdf
    );
    w("report.html", &html)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_follow_the_core_and_the_installed_tools() {
        let ok = |w, rbd, nbdkit, fio| choose_peers(w, rbd, nbdkit, fio).map(|(v, _)| v);
        assert_eq!(
            ok("auto", false, true, true),
            Ok(vec![CACHED_RAM, NBDKIT_CACHE])
        );
        assert_eq!(ok("auto", false, false, true), Ok(vec![CACHED_RAM]));
        assert_eq!(ok("cached-ram", false, false, false), Ok(vec![CACHED_RAM]));
        assert_eq!(ok("auto", true, true, true), Ok(vec![LIBRBD, LIBRBD_WB]));
        // auto leaves out what cannot run, and says why.
        let (v, notes) = choose_peers("auto", true, false, false).unwrap();
        assert!(
            v.is_empty() && notes.len() == 2 && notes[0].contains("fio"),
            "{notes:?}"
        );
        assert_eq!(ok("none", true, true, true), Ok(vec![]));
        assert_eq!(
            ok("librbd-wb, librbd,librbd-wb", true, false, true),
            Ok(vec![LIBRBD_WB, LIBRBD])
        );
        // Named peers that cannot run, or do not exist, are one-line errors.
        for (w, rbd, nbdkit, fio, says) in [
            ("librbd", false, true, true, "a peer of rbd cores only"),
            ("nbdkit-cache", true, true, true, "a peer of emu cores only"),
            (
                "nbdkit-cache",
                false,
                false,
                true,
                "nbdkit is not installed",
            ),
            ("librbd", true, true, false, "fio"),
            ("qemu", false, true, true, "unknown peer 'qemu'"),
        ] {
            let e = choose_peers(w, rbd, nbdkit, fio).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{w}: {e}");
        }
    }
}
