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

mod bed;
mod report;

use super::kit::fio::{Workload, fio_version};
use super::kit::host::tool_version;
use super::kit::procs::{STOP, install_stop_signals, stopped_by};
use super::kit::report::{Bar, close_run, open_report};
use crate::bench_ceph::CephArgs;
use bed::{Bed, Cores, Servers};
use report::ReportInfo;
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use tiercache_daemon::registry::{Registry, set_param};

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
    // An RBD image holds just the regions the workloads touch (each is written end to end
    // first, so that no run pays for creating RADOS objects).
    let seq_region_emu = (cache_bytes * 2).min((ws * 8).max(4 << 30));
    let core_bytes = if rbd {
        seq_region_emu.max(ws).div_ceil(1 << 20) << 20
    } else {
        (ws * 8).max(4 << 30)
    };
    let res = run_in(&Plan {
        a: &a,
        scratch: &scratch,
        runtime,
        cache_bytes,
        ws,
        fio,
        selected: &selected,
        peers: &peers,
        core_bytes,
        seq_region: (cache_bytes * 2).min(core_bytes),
    });
    close_run(&scratch);
    res
}

impl Args {
    /// The report directory (set by [`run`] before anything runs).
    fn out_dir(&self) -> &Path {
        self.out.as_deref().unwrap_or(Path::new("."))
    }
}

/// What [`run`] decided: what every step of [`run_in`] reads.
struct Plan<'a> {
    a: &'a Args,
    scratch: &'a Path,
    runtime: u64,
    cache_bytes: u64,
    /// The random workloads' working set.
    ws: u64,
    /// fio's version, empty for tiercache's own load generator.
    fio: &'a str,
    selected: &'a [&'a Workload],
    peers: &'a [&'a str],
    /// Bytes of each core device (emulated file or RBD image).
    core_bytes: u64,
    /// The sequential workloads' region: twice the cache, at most the core.
    seq_region: u64,
}

/// Runs the matrix in `p.scratch`: the cores, the servers, the warm-up, every run, then the
/// targets and the report.
fn run_in(p: &Plan) -> Result<(), String> {
    install_stop_signals();
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    let cache = bed::scratch_file(p.scratch, "cache.img", p.cache_bytes)?;
    let cores = Cores::make(p, &bar)?;
    let servers = Servers::start(p, &cache, &cores)?;
    let mut bed = Bed { servers, cores };
    bed.announce(p);
    bed.warm_up(p, &bar)?;
    let results = bed.measure_all(p, &bar)?;
    let Bed { servers, cores } = bed;
    servers.stop(p.peers);
    conclude(p, &cores, &results, &bar)
}

/// After the runs: the table, the targets (with the cache device's ceiling and the P4/P5
/// studies) and the report.
fn conclude(p: &Plan, cores: &Cores, results: &[RunResult], bar: &Bar) -> Result<(), String> {
    let a = p.a;
    let table = report::table(results) + &report::legend(a, &cores.desc, p.peers);
    println!("\n{table}");
    let targets = targets(p, results, bar);
    let stopped = STOP.load(Ordering::Relaxed);
    let generator = if p.fio.is_empty() {
        "tiercache-loadgen".to_string()
    } else {
        format!("{} (nbd engine)", p.fio)
    };
    let generator = if cores.rbd_peer.is_some() {
        format!("{generator}; the librbd peers with its rbd engine")
    } else {
        generator
    };
    report::write_report(&ReportInfo {
        a,
        runtime: p.runtime,
        generator: &generator,
        core: &cores.desc,
        setup: &cores.setup,
        peers: p.peers,
        results,
        table: &table,
        targets: &targets,
        stopped,
    })?;
    println!("report: {}", a.out_dir().join("report.html").display());
    if stopped {
        println!(
            "(stopped by {}: the report holds what was measured)",
            stopped_by()
        );
    }
    Ok(())
}

/// The targets the runs check, printed: P3/P4 with the cache device's own ceiling (emu) or
/// the comparison on Ceph (rbd), then the P4/P5 procedures: (JSON, text).
fn targets(p: &Plan, results: &[RunResult], bar: &Bar) -> (Value, Option<String>) {
    let a = p.a;
    let rbd = a.core == "rbd";
    // The cache device's own ceiling for P3's rows, measured now on the same file system
    // (a target above it cannot be met on this machine by any cache; both are reported).
    let ceiling = if !rbd && !p.fio.is_empty() && !STOP.load(Ordering::Relaxed) {
        report::device_ceiling(p.scratch, p.selected, p.ws, a.iodepth, p.runtime, bar)
    } else {
        Vec::new()
    };
    let mut targets = if rbd {
        report::ceph_summary(results)
    } else {
        report::p3_summary(results, &ceiling)
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
        match super::studies::run(&plan, p.scratch, &ui) {
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
    targets
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
