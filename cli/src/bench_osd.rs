//! `tiercache bench --study ceph-osd` (issue 26, SPEC P11): real BlueStore OSDs on three data
//! devices, measured with fio's rbd engine on the same single-node cluster:
//!
//! - `hdd`: data, DB and WAL on an emulated 10k RPM HDD (`emu:hdd-10k-sas` on a file);
//! - `hdd+db`: data on the HDD, DB/WAL on a fast file (the Micron layout, and the Open CAS
//!   study's baseline);
//! - `tiercache`: data on tiercache (`wb`, 4 KiB lines, sequential cutoff `always` 16 KiB, the
//!   study's IO classes: requests up to 128 KiB cached, the rest not; cache on a fast file)
//!   over the HDD, DB/WAL on a fast file (the Open CAS study's optimized layout).
//!
//! One mon (`scripts/ceph-cluster.sh start --osds 0`) serves the whole study; the layouts run
//! one after the other, each with its own OSDs (`ceph-cluster.sh add-osd`), pool and image,
//! torn down before the next. Every OSD's data device is an NBD export of this process's NBD
//! server — the bare HDD as well as the cached one — attached as `/dev/nbdX` with `nbd-client`
//! where `/dev/nbd0` exists, else as a file with `nbdfuse`; see [`ATTACH_WHY`].
//!
//! The report ends with the simulator's prediction of the same runs, calibrated from them
//! (`bench_osd_predict.rs`, docs/CEPH.md "The simulator beside it").

use crate::bench::kit::fio::{Workload, fio_version, parse_fio, run_fio, run_fio_size};
use crate::bench::kit::host::host;
use crate::bench::kit::procs::{Procs, STOP, install_stop_signals, stopped_by};
use crate::bench::kit::report::{Bar, close_run, git_commit, open_report};
use crate::bench::kit::stats::pct;
use crate::bench::run::{Args, MATRIX, hits_dirty, seq_cutoff};
use crate::bench_ceph::{Cluster, FioTarget};
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tiercache_core::units::CoreId;
use tiercache_daemon::registry::{NewCache, Registry, set_param};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, RequestStats, Server};

#[path = "bench_osd_predict.rs"]
mod predict;

/// Shared with cli/tests/osd_kill.rs.
#[path = "nbd_attach.rs"]
pub(crate) mod nbd_attach;
use nbd_attach::{
    Attach, choose_attach, find_prog, free_nbd_dev, nbd_client_attach, nbd_client_detach,
    nbdfuse_args, unmount_fuse, wait_fuse_file,
};

/// The layouts, in the order they run.
pub(crate) const LAYOUTS: [&str; 3] = ["hdd", "hdd+db", "tiercache"];
/// The HDD every layout's data lives on.
const PRESET: &str = "hdd-10k-sas";
/// The Open CAS study's IO classes: requests up to 128 KiB are cached, the rest pass through.
const STUDY_CSV: &str = "IO class id,IO class name,Eviction priority,Allocation\n\
                         0,unclassified,22,0\n1,request_size:le:131072,1,1\n";
/// The fast file holding an OSD's RocksDB and WAL (sparse; created by `ceph-osd --mkfs`).
const DB_BYTES: u64 = 2 << 30;
/// Options of every OSD of the study: BlueStore keeps no data in its own cache, so reads
/// reach the data device in every layout (the study's working sets dwarfed OSD memory).
const OSD_OPTS: [&str; 1] = ["bluestore_default_buffered_read=false"];

/// Why every layout's data device goes through the same NBD attach (the report says it).
const ATTACH_WHY: &str = "the bare HDD of the hdd and hdd+db layouts is served by the same NBD server as the cached one (an export without a cache), so the transport (NBD over a unix socket, then the kernel's nbd device or FUSE) costs the same in all three layouts and the ratios compare the layouts only; and the emulated HDD's latency model is applied by tiercache's emu: backend, so a process of tiercache serves the bare HDD in any case";

/// The seed studies' figures: (workload, ratio, metric, value, what).
const SEEDS: [(&str, &str, &str, f64, &str); 6] = [
    (
        "randread-4k",
        "tiercache/hdd+db",
        "iops",
        119.5,
        "Open CAS study x119.5",
    ),
    (
        "randwrite-4k",
        "tiercache/hdd+db",
        "iops",
        86.8,
        "Open CAS study x86.8",
    ),
    (
        "seqread-512k",
        "tiercache/hdd+db",
        "iops",
        0.972,
        "Open CAS study -2.8%",
    ),
    (
        "seqwrite-512k",
        "tiercache/hdd+db",
        "iops",
        0.944,
        "Open CAS study -5.6%",
    ),
    ("randwrite-4k", "hdd+db/hdd", "iops", 1.71, "Micron +71%"),
    ("randwrite-4k", "hdd+db/hdd", "p99", 0.28, "Micron -72% p99"),
];

/// The ratios the report gives: (name, numerator layout, denominator layout).
const RATIOS: [(&str, &str, &str); 3] = [
    ("tiercache/hdd", "tiercache", "hdd"),
    ("tiercache/hdd+db", "tiercache", "hdd+db"),
    ("hdd+db/hdd", "hdd+db", "hdd"),
];

/// What the study runs and on what.
struct Plan {
    osds: u32,
    replicas: u32,
    layouts: Vec<&'static str>,
    workloads: Vec<&'static Workload>,
    image_bytes: u64,
    /// The image's data on each OSD.
    per_osd: u64,
    hdd_bytes: u64,
    cache_bytes: u64,
    runtime: u64,
    /// Free space the scratch directory needs.
    need_bytes: u64,
}

const GIB: u64 = 1 << 30;

fn plan(a: &Args) -> Result<Plan, String> {
    if !(1..=3).contains(&a.osds) {
        return Err(format!("--osds {}: want 1, 2 or 3", a.osds));
    }
    let mut layouts = Vec::new();
    for l in a.layouts.split(',').map(str::trim) {
        let Some(&known) = LAYOUTS.iter().find(|k| **k == l) else {
            return Err(format!(
                "--layouts {}: unknown layout '{l}' (want a comma-separated list of hdd, hdd+db, tiercache)",
                a.layouts
            ));
        };
        if !layouts.contains(&known) {
            layouts.push(known);
        }
    }
    // Run in the study's order whatever the order given.
    layouts.sort_by_key(|l| LAYOUTS.iter().position(|k| k == l));
    let workloads: Vec<&Workload> = MATRIX
        .iter()
        .filter(|w| !a.quick || w.name == "randread-4k" || w.name == "randwrite-4k")
        .filter(|w| a.only.as_deref().is_none_or(|o| w.name.contains(o)))
        .collect();
    if workloads.is_empty() {
        return Err(format!(
            "--only {:?} matches no workload of the study",
            a.only.clone().unwrap_or_default()
        ));
    }
    let runtime = a.runtime.unwrap_or(if a.quick { 10 } else { 30 });
    if runtime == 0 || a.iodepth == 0 || a.iodepth > 1024 {
        return Err("--runtime must be at least 1 and --iodepth 1-1024".into());
    }
    let cache_bytes = tiercache_daemon::device::parse_size(&a.cache_size)?;
    if cache_bytes < 256 << 20 {
        return Err("--cache-size must be at least 256m for --study ceph-osd".into());
    }
    let replicas = a.osds.min(2);
    let image_bytes = match &a.image_size {
        Some(s) => tiercache_daemon::device::parse_size(s)?,
        None => cache_bytes / 2 * u64::from(a.osds) / u64::from(replicas),
    } >> 20
        << 20;
    if image_bytes < 64 << 20 {
        return Err("--image-size must be at least 64m".into());
    }
    let per_osd = image_bytes * u64::from(replicas) / u64::from(a.osds);
    let hdd_bytes = (per_osd.saturating_mul(3)).max(4 * GIB) >> 20 << 20;
    // Layouts run one at a time; the largest holds, per OSD, the preallocated cache, the
    // data written to the HDD file (the image's share, BlueStore's metadata and RocksDB) and
    // the DB file; plus what the cluster itself needs (ceph-cluster.sh checks 2 GiB).
    let need_bytes = u64::from(a.osds)
        .saturating_mul(cache_bytes.saturating_add(per_osd.saturating_mul(2)) + 2 * GIB)
        .saturating_add(2 * GIB);
    Ok(Plan {
        osds: a.osds,
        replicas,
        layouts,
        workloads,
        image_bytes,
        per_osd,
        hdd_bytes,
        cache_bytes,
        runtime,
        need_bytes,
    })
}

/// Free bytes on the file system of `dir`.
fn free_bytes(dir: &Path) -> Result<u64, String> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{}: a path with a NUL byte", dir.display()))?;
    // SAFETY: statvfs is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated string and `st` a struct we own, which statvfs
    // only writes into.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(format!(
            "{}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `tiercache bench --study ceph-osd`.
pub fn run(a: Args) -> Result<(), String> {
    // Everything that can be refused is refused before anything is created.
    let plan = plan(&a)?;
    let attach = choose_attach(Path::new("/dev/nbd0").exists())?;
    for (prog, pkg) in [
        ("ceph-osd", "ceph-osd"),
        ("ceph-mon", "ceph-mon"),
        ("rbd", "ceph-common"),
    ] {
        if find_prog(prog).is_none() {
            return Err(format!(
                "--study ceph-osd: {prog} is not installed (apt-get install {pkg})"
            ));
        }
    }
    let fio =
        fio_version().ok_or("--study ceph-osd: fio is not installed (apt-get install fio)")?;
    let base = a.scratch.clone().unwrap_or_else(std::env::temp_dir);
    let free = free_bytes(&base)?;
    if free < plan.need_bytes {
        return Err(format!(
            "--study ceph-osd: too little disk: {} has {} MiB free, the study needs {} MiB ({} OSD(s) x ({} MiB cache + 2 x {} MiB data + 2 GiB) + 2 GiB for the cluster); use --scratch elsewhere or a smaller --cache-size / --image-size",
            base.display(),
            free >> 20,
            plan.need_bytes >> 20,
            plan.osds,
            plan.cache_bytes >> 20,
            plan.per_osd >> 20
        ));
    }
    let out = open_report(a.out.as_deref())?;
    let scratch = base.join(format!("tiercache-osd-study-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    install_stop_signals();
    let res = study(&a, &plan, &attach, &fio, &scratch, &out);
    close_run(&scratch);
    res
}

/// One measured run.
struct Measured {
    layout: &'static str,
    workload: &'static str,
    iops: f64,
    mbps: f64,
    mean_us: f64,
    p99_us: f64,
    /// tiercache layout: hit ratio and dirty % (its own counters, all its caches).
    hits: Option<f64>,
    dirty_pct: Option<f64>,
    /// The caches' view each second (as the Open CAS study's figures 8-11), and the data
    /// devices' requests each second (every layout).
    per_second: Vec<Sample>,
    /// The run's length (fio's runtime), s.
    seconds: f64,
    /// Requests the data devices (NBD exports) served during the run, all OSDs.
    dev_requests: f64,
    /// Requests in flight at the data devices on average (their summed service time over
    /// the run's length), all OSDs.
    dev_inflight: f64,
    /// The host's CPUs busy during the run, 0..1 of all of them.
    host_busy: f64,
    /// CPU seconds of the layout's ceph-osd processes during the run.
    osd_cpu_s: f64,
    /// tiercache layout, randread-4k: mean latency of a QD 1 run (calibrates the simulator).
    qd1_mean_us: Option<f64>,
}

/// One second of the caches under the OSDs (sums over them; dirty % their mean).
#[derive(Clone, Copy, Default)]
struct Sample {
    t: f64,
    /// Requests the data devices served this second (all layouts).
    dev_requests: f64,
    requests: f64,
    hits: f64,
    pass_through: f64,
    writeback_mbps: f64,
    dirty_pct: f64,
}

/// Cumulative (requests, hits, pass-through, written-back bytes) and the mean dirty %.
fn snapshot(reg: &Registry, caches: &[u16]) -> (u64, u64, u64, u64, f64) {
    let mut v = (0, 0, 0, 0, 0.0);
    for &c in caches {
        let Ok(s) = tiercache_daemon::stats::cache_stats(reg, c, None, None) else {
            continue;
        };
        let r = &s["requests"];
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        v.0 += n("total");
        v.1 += n("read_full_hits")
            + n("read_partial_hits")
            + n("write_full_hits")
            + n("write_partial_hits");
        v.2 += n("read_pass_through") + n("write_pass_through");
        v.3 += s["writeback"]["bytes"].as_u64().unwrap_or(0);
        v.4 += s["usage"]["dirty_pct"].as_f64().unwrap_or(0.0) / caches.len() as f64;
    }
    v
}

/// Requests served so far by the exports counted in `stats`.
fn dev_count(stats: &[Arc<RequestStats>]) -> u64 {
    dev_counts(stats).0
}

/// Requests served so far by the exports counted in `stats`, and the seconds they took in
/// all (from receipt to reply).
fn dev_counts(stats: &[Arc<RequestStats>]) -> (u64, f64) {
    stats
        .iter()
        .flat_map(|s| s.snapshot())
        .fold((0, 0.0), |(n, t), o| (n + o.count, t + o.sum_seconds))
}

/// Samples the caches and the data devices once a second until `stop`.
fn sample(
    reg: &Registry,
    caches: &[u16],
    stats: &[Arc<RequestStats>],
    stop: &AtomicBool,
) -> Vec<Sample> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    let mut last = snapshot(reg, caches);
    let mut last_dev = dev_count(stats);
    let mut next = 1.0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        let el = t0.elapsed().as_secs_f64();
        if el < next {
            continue;
        }
        let now = snapshot(reg, caches);
        let dev = dev_count(stats);
        out.push(Sample {
            t: next,
            dev_requests: dev.saturating_sub(last_dev) as f64,
            requests: now.0.saturating_sub(last.0) as f64,
            hits: now.1.saturating_sub(last.1) as f64,
            pass_through: now.2.saturating_sub(last.2) as f64,
            writeback_mbps: now.3.saturating_sub(last.3) as f64 / 1e6,
            dirty_pct: now.4,
        });
        last = now;
        last_dev = dev;
        next += 1.0;
    }
    out
}

fn study(
    a: &Args,
    plan: &Plan,
    attach: &Attach,
    fio: &str,
    scratch: &Path,
    out: &Path,
) -> Result<(), String> {
    let t0 = Instant::now();
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    let mut setup = json!({});
    let cluster = Cluster::start_with(
        scratch,
        &["--osds", "0", "--set", "mon_allow_pool_delete=true"],
        &mut setup,
    )?;
    let what = describe(plan, a.iodepth, fio, attach);
    println!(
        "ceph-osd study{}: {what}",
        if a.quick { " --quick" } else { "" }
    );
    let mut runs = Vec::new();
    let mut layouts_doc = Vec::new();
    for &layout in &plan.layouts {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let (doc, mut r) = run_layout(&cluster, plan, a.iodepth, attach, layout, scratch, &bar)
            .map_err(|e| format!("layout {layout}: {e}"))?;
        layouts_doc.push(doc);
        runs.append(&mut r);
    }
    drop(cluster);
    let stopped = STOP.load(Ordering::Relaxed);
    let (table, ratios_text, mut ratios) = tables(&runs);
    println!("\n{table}\n{ratios_text}");
    let attach_text = format!(
        "Each OSD's data device is an NBD export of this process's tiercache NBD server (unix socket), attached with {} ({}) and given to BlueStore as bluestore_block_path (not created by it). All three layouts go through the same attach: {ATTACH_WHY}.",
        attach.name(),
        match attach {
            Attach::NbdClient(_) => "as /dev/nbdX, what a production host does",
            Attach::Nbdfuse(_) =>
                "as a file in a FUSE mount, because this host has no /dev/nbd0 (no kernel nbd module)",
        }
    );
    println!("{attach_text}");
    // The simulator beside reality.
    let (pred_text, pred_doc, beside) = prediction(plan, a.iodepth, &runs);
    // Each IOPS ratio's row also carries the predicted ratios.
    if let (Some(b), Some(rows)) = (&beside, ratios.as_array_mut()) {
        for row in rows.iter_mut().filter(|r| r["metric"] == "iops") {
            let mut p = json!({});
            for q in b.ratios.iter().filter(|q| q["workload"] == row["workload"]) {
                if let Some(name) = q["ratio"].as_str() {
                    p[name] = q["predicted"].clone();
                }
            }
            row["predicted"] = p;
        }
    }
    println!("\n{pred_text}");
    let doc = json!({
        "tool": "tiercache bench --study ceph-osd",
        "version": env!("CARGO_PKG_VERSION"),
        "commit": git_commit(),
        "host": host(),
        "config": {
            "quick": a.quick, "osds": plan.osds, "replicas": plan.replicas,
            "layouts": plan.layouts, "image_bytes": plan.image_bytes,
            "data_per_osd_bytes": plan.per_osd, "hdd_preset": PRESET,
            "hdd_file_bytes": plan.hdd_bytes, "cache_bytes_per_osd": plan.cache_bytes,
            "db_file_bytes": DB_BYTES, "runtime_s": plan.runtime, "iodepth": a.iodepth,
            "jobs": 1, "load_generator": fio, "fio_engine": "rbd",
            "tiercache": {"mode": "wb", "line_size": "4k", "seq_cutoff": "always 16 KiB",
                "io_classes": STUDY_CSV, "cleaning": "alru (activity threshold 1 s)",
                "warm_up": "fio 64K sequential reads over the image (at most 6 x the runtime, at least 30 s), cutoff off"},
            "osd_options": OSD_OPTS, "attach": attach.name(), "attach_statement": attach_text,
            "cluster": setup,
        },
        "stopped_early": stopped,
        "layouts": layouts_doc,
        "runs": runs.iter().enumerate().map(|(i, r)| json!({
            "layout": r.layout, "workload": r.workload, "iops": r.iops, "bw_mbps": r.mbps,
            "lat_mean_us": r.mean_us, "lat_p99_us": r.p99_us, "hit_ratio": r.hits,
            "dirty_pct": r.dirty_pct,
            "host_cpu_busy": r.host_busy, "osd_cpu_s": r.osd_cpu_s,
            "data_device_requests": r.dev_requests,
            "data_device_in_flight": r.dev_inflight, "qd1_mean_us": r.qd1_mean_us,
            "predicted": beside.as_ref().and_then(|b| b.runs_pred[i].as_ref()).map(|p| json!({
                "iops": p.iops, "lat_mean_us": p.mean_us, "lat_p99_us": p.p99_us,
            })),
            "cache_per_second": r.per_second.iter().map(|p| json!({
                "t": p.t, "data_device_requests": p.dev_requests,
                "requests": p.requests, "hits": p.hits,
                "pass_through": p.pass_through, "writeback_mbps": p.writeback_mbps,
                "dirty_pct": p.dirty_pct,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "ratios": ratios,
        "predicted": pred_doc,
        "wall_s": t0.elapsed().as_secs_f64(),
    });
    let w = |name: &str, body: &str| -> Result<(), String> {
        let p = out.join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))
    };
    w(
        "results.json",
        &serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )?;
    let md = format!(
        "# tiercache bench --study ceph-osd\n\ncommit {}{}: {what}.{}\n\n{attach_text}\n\n```\n{table}```\n\n## Ratios (IOPS, and p99 latency where named), with the seed studies' figures\n\n```\n{ratios_text}```\n\nThe seed figures: Open CAS study (tiercache's role; baseline = hdd+db), 12 OSDs on 2 nodes, replica 2, 20 jobs x QD 16; Micron (DB/WAL on NVMe vs all on HDD). Raw numbers: results.json.\n\n## The simulator beside reality\n\n```\n{pred_text}```\n",
        git_commit(),
        if a.quick { ", --quick" } else { "" },
        if stopped {
            format!(" Stopped early ({}): partial results.", stopped_by())
        } else {
            String::new()
        }
    );
    let mut plots = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.layout == "tiercache" && !r.per_second.is_empty())
    {
        let pts = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
            r.per_second.iter().map(|p| (p.t, f(p))).collect()
        };
        let svg = crate::svg::lines(
            &format!(
                "{} on the tiercache layout: the caches under the OSDs, per second",
                r.workload
            ),
            "seconds",
            "requests/s, MB/s x100, dirty % x100",
            &[
                ("requests/s", pts(&|p| p.requests)),
                ("hits/s", pts(&|p| p.hits)),
                ("pass-through/s", pts(&|p| p.pass_through)),
                ("writeback MB/s x100", pts(&|p| p.writeback_mbps * 100.0)),
                ("dirty % x100", pts(&|p| p.dirty_pct * 100.0)),
            ],
            false,
        );
        let name = format!("tiercache-{}-over-time.svg", r.workload);
        w(&name, &svg)?;
        plots.push(name);
    }
    let md = if plots.is_empty() {
        md
    } else {
        format!(
            "{md}\nThe caches under the OSDs over each tiercache run (requests, hits, pass-through by the cutoff or the IO classes, writeback, dirty %; `cache_per_second` in results.json): {}.\n",
            plots.join(", ")
        )
    };
    w("report.md", &md)?;
    println!(
        "study done in {:.0} s; report: {}",
        t0.elapsed().as_secs_f64(),
        out.join("report.md").display()
    );
    Ok(())
}

/// The simulator's prediction of the runs (issue 26 item 3): its text for the terminal and
/// report, its JSON (`predicted` in results.json), and the per-run and per-ratio comparison.
fn prediction(
    plan: &Plan,
    iodepth: u32,
    runs: &[Measured],
) -> (String, Value, Option<predict::Beside>) {
    let Some((cost, cal)) = predict::calibrate(plan, runs) else {
        let why = "no prediction: the simulator is calibrated by the tiercache layout's randread-4k run (and its QD 1 run), which did not run";
        return (format!("{why}\n"), json!({"error": why}), None);
    };
    let study = predict::study_of(plan, iodepth, "ram");
    let run = || -> Result<(String, Value, predict::Beside), String> {
        let p = study.predict(&cost, &plan.layouts)?;
        let b = predict::beside(plan, iodepth, runs, &p);
        let (seed_text, seed_doc) = predict::seed_cluster(&study, &cost)?;
        let text = format!(
            "{}\nThe same topology simulated (tiercache's simulator: {} OSD(s), replica {}, {PRESET} HDD models of the HDD files' size with the data in their first {:.2} GiB, the real cache core with the study's settings over a ram-speed cache device, {} s simulated per run):\n\n{}\n{seed_text}",
            predict::calibration_text(&cost, &cal),
            plan.osds,
            plan.replicas,
            study.span_gib,
            study.duration_s,
            b.text
        );
        let doc = json!({
            "calibration": cal,
            "differs_above": predict::DIFFERS,
            "ratios": b.ratios,
            "seed_cluster": seed_doc,
        });
        Ok((text, doc, b))
    };
    match run() {
        Ok((t, d, b)) => (t, d, Some(b)),
        Err(e) => (
            format!("no prediction: {e}\n"),
            json!({"error": e, "calibration": cal}),
            None,
        ),
    }
}

/// What the study runs on, in one sentence (the banner and the report's first line).
fn describe(plan: &Plan, iodepth: u32, fio: &str, attach: &Attach) -> String {
    format!(
        "layouts {}, {} OSD(s) each (replica {}), RBD image {} MiB ({} MiB per OSD), {PRESET} HDD on {} MiB files, tiercache wb cache of {} MiB per OSD (4 KiB lines, cutoff always 16 KiB, requests up to 128 KiB cached), DB/WAL files of {} MiB; {} x {} s, QD {iodepth}, 1 job (fio rbd engine, {fio}); data devices attached with {}",
        plan.layouts.join(", "),
        plan.osds,
        plan.replicas,
        plan.image_bytes >> 20,
        plan.per_osd >> 20,
        plan.hdd_bytes >> 20,
        plan.cache_bytes >> 20,
        DB_BYTES >> 20,
        plan.workloads
            .iter()
            .map(|w| w.name)
            .collect::<Vec<_>>()
            .join(", "),
        plan.runtime,
        attach.name()
    )
}

/// The text table of the runs, the ratios' text and their JSON.
fn tables(runs: &[Measured]) -> (String, String, Value) {
    let mut t = format!(
        "{:<14} {:<10} {:>9} {:>8} {:>10} {:>10} {:>6} {:>6}\n",
        "workload", "layout", "IOPS", "MB/s", "mean us", "p99 us", "hits", "dirty"
    );
    let opt = |v: Option<f64>, k: f64| v.map_or("-".to_string(), |x| format!("{:.1}%", x * k));
    for r in runs {
        t += &format!(
            "{:<14} {:<10} {:>9.0} {:>8.1} {:>10.1} {:>10.1} {:>6} {:>6}\n",
            r.workload,
            r.layout,
            r.iops,
            r.mbps,
            r.mean_us,
            r.p99_us,
            opt(r.hits, 100.0),
            opt(r.dirty_pct, 1.0)
        );
    }
    let get = |w: &str, l: &str| runs.iter().find(|r| r.workload == w && r.layout == l);
    let mut workloads: Vec<&str> = Vec::new();
    for r in runs {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    let mut text = format!(
        "{:<14} {:<5} {:>14} {:>17} {:>11}  seed figure\n",
        "workload", "of", "tiercache/hdd", "tiercache/hdd+db", "hdd+db/hdd"
    );
    let mut doc = Vec::new();
    for w in workloads {
        for metric in ["iops", "p99"] {
            let mut cells = Vec::new();
            let mut row = json!({"workload": w, "metric": metric});
            for (name, num, den) in RATIOS {
                let v = match (get(w, num), get(w, den)) {
                    (Some(n), Some(d)) => Some(if metric == "iops" {
                        n.iops / d.iops.max(1e-9)
                    } else {
                        n.p99_us / d.p99_us.max(1e-9)
                    }),
                    _ => None,
                };
                row[name] = json!(v);
                cells.push(v.map_or("-".to_string(), |x| format!("x{x:.2}")));
            }
            let seeds: Vec<String> = SEEDS
                .iter()
                .filter(|s| s.0 == w && s.2 == metric)
                .map(|s| {
                    let ours = row[s.1].as_f64();
                    format!(
                        "{}: {} {}",
                        s.1,
                        s.4,
                        ours.map_or(String::new(), |x| format!("(here x{x:.2})"))
                    )
                })
                .collect();
            row["seed"] = json!(
                SEEDS
                    .iter()
                    .filter(|s| s.0 == w && s.2 == metric)
                    .map(|s| json!({"ratio": s.1, "value": s.3, "source": s.4}))
                    .collect::<Vec<_>>()
            );
            text += &format!(
                "{:<14} {:<5} {:>14} {:>17} {:>11}  {}\n",
                w,
                metric,
                cells[0],
                cells[1],
                cells[2],
                seeds.join("; ")
            );
            doc.push(row);
        }
    }
    (t, text, json!(doc))
}

/// What one layout set up; dropping it tears everything down, in order: the pool, the OSDs
/// (stopped and removed from the cluster), the attachments (nbdfuse processes, which unmount
/// at SIGTERM, or nbd-client devices), the NBD server, the caches, the files.
struct Rig<'a> {
    cluster: &'a Cluster,
    pool: Option<String>,
    osd_ids: Vec<u32>,
    procs: Procs,
    mounts: Vec<PathBuf>,
    nbd_devs: Vec<(PathBuf, PathBuf)>,
    server: Option<Server>,
    reg: Arc<Registry>,
    caches: Vec<u16>,
    files: Vec<PathBuf>,
}

impl Drop for Rig<'_> {
    fn drop(&mut self) {
        let t = Instant::now();
        if let Some(p) = self.pool.take()
            && let Err(e) = self.cluster.ceph(&[
                "osd",
                "pool",
                "delete",
                &p,
                &p,
                "--yes-i-really-really-mean-it",
            ])
        {
            eprintln!("could not delete pool {p}: {e}");
        }
        for id in std::mem::take(&mut self.osd_ids) {
            if let Err(e) = self.cluster.remove_osd(id) {
                eprintln!("could not remove osd.{id}: {e}");
            }
        }
        self.procs.stop_all();
        for (prog, dev) in std::mem::take(&mut self.nbd_devs) {
            nbd_client_detach(&prog, &dev);
        }
        for m in std::mem::take(&mut self.mounts) {
            unmount_fuse(&m);
        }
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        for id in std::mem::take(&mut self.caches) {
            let _ = self.reg.stop_cache(id, true, |_, _, _| {});
        }
        for f in std::mem::take(&mut self.files) {
            let _ = std::fs::remove_file(&f);
        }
        println!("  torn down in {:.1} s", t.elapsed().as_secs_f64());
    }
}

fn file(path: &Path, bytes: u64) -> Result<String, String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

fn param(reg: &Registry, id: u16, group: &str, kv: &[(&str, &str)]) -> Result<(), String> {
    let v: Vec<(String, String)> = kv
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    set_param(reg, id, None, group, &v).map(|_| ())
}

#[allow(clippy::too_many_arguments)]
fn run_layout(
    cluster: &Cluster,
    plan: &Plan,
    iodepth: u32,
    attach: &Attach,
    layout: &'static str,
    scratch: &Path,
    bar: &Bar,
) -> Result<(Value, Vec<Measured>), String> {
    let t0 = Instant::now();
    let tag = layout.replace('+', "-");
    println!("\nlayout {layout}:");
    let reg = Arc::new(Registry::new());
    let mut rig = Rig {
        cluster,
        pool: None,
        osd_ids: Vec::new(),
        procs: Procs::default(),
        mounts: Vec::new(),
        nbd_devs: Vec::new(),
        server: None,
        reg: reg.clone(),
        caches: Vec::new(),
        files: Vec::new(),
    };
    let cached = layout == "tiercache";
    let (exports, stats) = export_devices(&mut rig, plan, &tag, cached, scratch)?;
    let sock = scratch.join(format!("{tag}.sock"));
    let server = Server::new(exports, Default::default());
    server.listen(&ListenAddr::Unix(sock.clone()))?;
    rig.server = Some(server);
    // Attach each export, then put an OSD on it.
    let devices = attach_exports(&mut rig, plan, attach, &tag, scratch, &sock)?;
    let t_osd = Instant::now();
    add_osds(&mut rig, &devices, layout, &tag, scratch)?;
    let osd_up_s = t_osd.elapsed().as_secs_f64();
    let (pool, image, spec) = create_image(&mut rig, plan, &tag)?;
    let meta = osd_metadata(cluster, &rig.osd_ids);
    println!(
        "  {} OSD(s) up in {osd_up_s:.1} s (ids {:?}) on {}; pool {pool} (size {}); writing the {} MiB image",
        plan.osds,
        rig.osd_ids,
        devices
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        plan.replicas,
        plan.image_bytes >> 20
    );
    bar.show(&format!("{layout}: writing the image"), 0.0);
    let write_s = cluster.write_image(&spec, plan.image_bytes)?;
    bar.end();
    let target = FioTarget::Rbd {
        conf: cluster.conf.clone(),
        id: cluster.id.clone(),
        pool: pool.clone(),
        image: image.into(),
    };
    let (warm_s, warm_cap) = warm_up(&rig, plan, &target, layout, bar)?;
    println!(
        "  image written in {write_s:.1} s, read (warm-up, at most {warm_cap} s) in {warm_s:.1} s"
    );
    let mut out = Vec::new();
    for w in &plan.workloads {
        if STOP.load(Ordering::Relaxed) {
            break;
        }
        let Some(m) = measure(
            &rig, plan, &stats, &target, w, iodepth, layout, scratch, bar,
        )?
        else {
            break;
        };
        out.push(m);
    }
    let doc = json!({
        "layout": layout, "osds": meta, "devices": devices,
        "osd_up_s": osd_up_s, "image_write_s": write_s, "warm_up_s": warm_s,
        "warm_up_cap_s": warm_cap,
        "setup_s": t0.elapsed().as_secs_f64(),
    });
    drop(rig);
    Ok((doc, out))
}

/// Creates each OSD's emulated HDD and exports it: through a cache of its own (`cached`) or
/// bare; the exports' request counters come back beside them.
fn export_devices(
    rig: &mut Rig,
    plan: &Plan,
    tag: &str,
    cached: bool,
    scratch: &Path,
) -> Result<(Arc<ExportMap>, Vec<Arc<RequestStats>>), String> {
    let reg = rig.reg.clone();
    let exports = Arc::new(ExportMap::new());
    let mut stats = Vec::new();
    for i in 0..plan.osds {
        let counted = Arc::new(RequestStats::default());
        stats.push(counted.clone());
        let hdd = scratch.join(format!("{tag}-osd{i}.hdd"));
        let dev = format!("emu:{PRESET}:{}", file(&hdd, plan.hdd_bytes)?);
        rig.files.push(hdd);
        let export = format!("osd{i}");
        if cached {
            let id = i as u16 + 1;
            let cache = scratch.join(format!("{tag}-osd{i}.cache"));
            let cache_s = file(&cache, plan.cache_bytes)?;
            rig.files.push(cache);
            reg.start_cache(NewCache {
                device: &cache_s,
                id: Some(id),
                mode: Some("wb"),
                line_size: Some("4k"),
                load: false,
                force: false,
                dry_run: false,
            })?;
            rig.caches.push(id);
            reg.add_core(id, &dev, Some(0), Some(&export))?;
            param(
                &reg,
                id,
                "seq-cutoff",
                &[("policy", "always"), ("threshold", "16k")],
            )?;
            param(&reg, id, "cleaning", &[("policy", "alru")])?;
            param(&reg, id, "cleaning-alru", &[("activity-threshold", "1000")])?;
            reg.io_class_load(id, STUDY_CSV)?;
            exports.insert(
                &export,
                "an emulated HDD through tiercache",
                Arc::new(EngineExport::new(reg.engine(id)?, CoreId(0)).with_request_stats(counted)),
            );
        } else {
            let bare = tiercache_daemon::device::DeviceSpec::parse(&dev)?.open("the bare HDD")?;
            exports.insert(
                &export,
                "a bare emulated HDD",
                Arc::new(BackendExport::new(bare).with_request_stats(counted)),
            );
        }
    }
    Ok((exports, stats))
}

/// Attaches each OSD's export (`sock`) as a device: a file in an nbdfuse mount, or an NBD
/// device.
fn attach_exports(
    rig: &mut Rig,
    plan: &Plan,
    attach: &Attach,
    tag: &str,
    scratch: &Path,
    sock: &Path,
) -> Result<Vec<PathBuf>, String> {
    let mut devices = Vec::new();
    for i in 0..plan.osds {
        let export = format!("osd{i}");
        let dev = match attach {
            Attach::Nbdfuse(prog) => {
                let mnt = scratch.join(format!("mnt-{tag}-osd{i}"));
                std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
                rig.mounts.push(mnt.clone());
                let data = mnt.join("data");
                let pid = rig.procs.spawn(
                    &format!("nbdfuse {export}"),
                    None,
                    prog,
                    &nbdfuse_args(&data, &export, sock),
                    &[],
                    scratch.join(format!("nbdfuse-{tag}-osd{i}.log")),
                )?;
                wait_fuse_file(&data, plan.hdd_bytes, &mut || rig.procs.check(pid))?;
                data
            }
            Attach::NbdClient(prog) => {
                let dev = free_nbd_dev(&rig.nbd_devs)?;
                nbd_client_attach(prog, &export, sock, &dev)?;
                rig.nbd_devs.push((prog.clone(), dev.clone()));
                dev
            }
        };
        devices.push(dev);
    }
    Ok(devices)
}

/// Puts an OSD on each device (its DB and WAL on a file of their own, except in the `hdd`
/// layout).
fn add_osds(
    rig: &mut Rig,
    devices: &[PathBuf],
    layout: &str,
    tag: &str,
    scratch: &Path,
) -> Result<(), String> {
    let cluster = rig.cluster;
    for (i, dev) in devices.iter().enumerate() {
        let dev_s = dev.display().to_string();
        let db = scratch.join(format!("{tag}-osd{i}.db"));
        let db_s = db.display().to_string();
        let db_size = format!("{}M", DB_BYTES >> 20);
        let mut args = vec!["--block", &dev_s];
        if layout != "hdd" {
            args.extend(["--db", &db_s, "--db-size", &db_size]);
            rig.files.push(db);
        }
        for o in OSD_OPTS {
            args.extend(["--opt", o]);
        }
        let id = cluster.add_osd(&args)?;
        rig.osd_ids.push(id);
    }
    Ok(())
}

/// Creates the layout's pool and its image: (pool, image, `pool/image`).
fn create_image(
    rig: &mut Rig,
    plan: &Plan,
    tag: &str,
) -> Result<(String, &'static str, String), String> {
    let cluster = rig.cluster;
    let pool = format!("study-{tag}");
    cluster.ceph(&["osd", "pool", "create", &pool, "8", "8"])?;
    rig.pool = Some(pool.clone());
    if plan.replicas > 1 {
        cluster.ceph(&[
            "osd",
            "pool",
            "set",
            &pool,
            "size",
            &plan.replicas.to_string(),
        ])?;
    }
    cluster.rbd(&["pool", "init", &pool])?;
    let image = "study";
    let spec = format!("{pool}/{image}");
    cluster.rbd(&[
        "create",
        "--size",
        &format!("{}M", plan.image_bytes >> 20),
        &spec,
    ])?;
    Ok((pool, image, spec))
}

/// What each OSD reports of its devices (rotational, dedicated DB, size).
fn osd_metadata(cluster: &Cluster, osd_ids: &[u32]) -> Vec<Value> {
    let mut meta = Vec::new();
    for &id in osd_ids {
        let m: Value = cluster
            .ceph(&["osd", "metadata", &id.to_string(), "-f", "json"])
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        meta.push(json!({
            "id": id,
            "bluestore_bdev_rotational": m["bluestore_bdev_rotational"],
            "bluefs_dedicated_db": m["bluefs_dedicated_db"],
            "bluefs_db_rotational": m["bluefs_db_rotational"],
            "bluestore_bdev_size": m["bluestore_bdev_size"],
        }));
    }
    meta
}

/// The warm-up, the same in every layout: 64K sequential reads over the image (the cutoff off,
/// so tiercache caches what it reads; 64K is in the cached IO class). Returns its seconds
/// and its cap.
fn warm_up(
    rig: &Rig,
    plan: &Plan,
    target: &FioTarget,
    layout: &str,
    bar: &Bar,
) -> Result<(f64, u64), String> {
    let reg = &rig.reg;
    for &c in &rig.caches {
        seq_cutoff(reg, c, "never")?;
    }
    let t = Instant::now();
    let warm = Workload {
        name: "warm-up",
        rw: "read",
        bs: "64k",
        mix: None,
        random: false,
    };
    // Bounded, so that a slow build (the tests' strict asserts) does not spend minutes here.
    let warm_cap = (plan.runtime * 6).max(30);
    run_fio_size(target, &warm, plan.image_bytes, warm_cap, &|f| {
        bar.show(&format!("{layout}: warm-up"), f)
    })
    .map_err(|e| format!("warm-up: {e}"))?;
    bar.end();
    let warm_s = t.elapsed().as_secs_f64();
    for &c in &rig.caches {
        param(
            reg,
            c,
            "seq-cutoff",
            &[("policy", "always"), ("threshold", "16k")],
        )?;
    }
    Ok((warm_s, warm_cap))
}

/// Runs workload `w` on the layout and says what it measured; `None` when Ctrl-C stopped it.
#[allow(clippy::too_many_arguments)]
fn measure(
    rig: &Rig,
    plan: &Plan,
    stats: &[Arc<RequestStats>],
    target: &FioTarget,
    w: &'static Workload,
    iodepth: u32,
    layout: &'static str,
    scratch: &Path,
    bar: &Bar,
) -> Result<Option<Measured>, String> {
    let reg = &rig.reg;
    let cached = layout == "tiercache";
    for &c in &rig.caches {
        reg.reset_counters(c)?;
    }
    let label = format!("{layout} {}", w.name);
    let region = plan.image_bytes;
    let stop = AtomicBool::new(false);
    let (cpu0, dev0) = (predict::cpu_now(scratch), dev_counts(stats));
    let (v, per_second) = std::thread::scope(|s| {
        let sampler = s.spawn(|| sample(reg, &rig.caches, stats, &stop));
        let v = run_fio(target, w, region, iodepth, plan.runtime, &|f| {
            bar.show(&label, f)
        })
        .and_then(|v| parse_fio(&v));
        stop.store(true, Ordering::Relaxed);
        (v, sampler.join().unwrap_or_default())
    });
    bar.end();
    let (host_busy, osd_cpu_s) = predict::cpu_between(cpu0, predict::cpu_now(scratch));
    let dev1 = dev_counts(stats);
    let dev_requests = dev1.0.saturating_sub(dev0.0) as f64;
    let dev_inflight = (dev1.1 - dev0.1).max(0.0) / plan.runtime as f64;
    let (iops, mbps, mean_us, p99_us, _, _) = match v {
        Ok(v) => v,
        Err(e) if STOP.load(Ordering::Relaxed) => {
            eprintln!("{label}: stopped ({e})");
            return Ok(None);
        }
        Err(e) => return Err(format!("{label}: {e}")),
    };
    let (hits, dirty_pct) = if cached {
        let (n, h, _, _, d) = snapshot(reg, &rig.caches);
        (Some(pct(h, n)), Some(d))
    } else {
        (None, None)
    };
    // The simulator's calibration: the same reads at QD 1, every one a hit.
    let qd1_mean_us = if cached && w.name == "randread-4k" && !STOP.load(Ordering::Relaxed) {
        let secs = plan.runtime.min(5);
        let v = run_fio(target, w, region, 1, secs, &|f| {
            bar.show(&format!("{label} QD 1"), f)
        })
        .and_then(|v| parse_fio(&v));
        bar.end();
        match v {
            Ok(v) => {
                println!(
                    "  {:<14} {:>9.0} IOPS at QD 1, mean {:>9.1} us (calibrates the simulator)",
                    w.name, v.0, v.2
                );
                Some(v.2)
            }
            Err(e) => {
                eprintln!("{label} at QD 1: {e}");
                None
            }
        }
    } else {
        None
    };
    let m = Measured {
        layout,
        workload: w.name,
        iops,
        mbps,
        mean_us,
        p99_us,
        hits,
        dirty_pct,
        per_second,
        seconds: plan.runtime as f64,
        dev_requests,
        dev_inflight,
        host_busy,
        osd_cpu_s,
        qd1_mean_us,
    };
    println!(
        "  {:<14} {:>9.0} IOPS {:>8.1} MB/s  mean {:>9.1} us  p99 {:>9.1} us{}; host CPUs {:.0}% busy, ceph-osd {:.2} CPU-s, {:.0} data-device requests",
        m.workload,
        m.iops,
        m.mbps,
        m.mean_us,
        m.p99_us,
        hits_dirty(m.hits, m.dirty_pct),
        m.host_busy * 100.0,
        m.osd_cpu_s,
        m.dev_requests
    );
    println!(
        "  {:<14} data devices: {:.1} requests in flight on average",
        "", m.dev_inflight
    );
    Ok(Some(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn args(v: &[&str]) -> Args {
        T::parse_from(std::iter::once("t").chain(v.iter().copied())).a
    }

    #[test]
    fn plan_refuses_bad_layouts_and_sizes_in_one_line() {
        for (v, says) in [
            (&["--layouts", "hdd,ssd"][..], "unknown layout 'ssd'"),
            (&["--osds", "4"][..], "--osds 4"),
            (&["--image-size", "1m"][..], "at least 64m"),
            (&["--cache-size", "64m"][..], "at least 256m"),
        ] {
            let e = plan(&args(v)).err().expect("refused");
            assert!(e.contains(says) && !e.contains('\n'), "{v:?}: {e}");
        }
        let p = plan(&args(&[
            "--quick",
            "--osds",
            "1",
            "--layouts",
            "tiercache,hdd",
        ]))
        .unwrap();
        assert_eq!(p.layouts, ["hdd", "tiercache"]);
        assert_eq!(p.workloads.len(), 2);
        assert_eq!(
            (p.replicas, p.per_osd, p.image_bytes),
            (1, 512 << 20, 512 << 20)
        );
        let p = plan(&args(&["--osds", "3"])).unwrap();
        assert_eq!(p.replicas, 2);
        assert_eq!(p.workloads.len(), 5);
    }

    #[test]
    fn the_simulated_study_has_the_studys_topology() {
        let p = plan(&args(&["--quick", "--osds", "2", "--cache-size", "512m"])).unwrap();
        let st = predict::study_of(&p, 16, "ram");
        let cost = tiercache_sim::osd_study::Cost {
            threads: 2,
            cpu_us: 100.0,
            latency_us: 400.0,
            hdd_extra_per_read: 0.3,
            hdd_extra_per_write: 1.0,
        };
        let s = st.scenario(&cost, &p.layouts).unwrap();
        let cl = s.cluster.as_ref().unwrap();
        // Two OSDs, each its own failure domain, replica 2; the HDD files' size and preset;
        // the cache per OSD; the image's share per OSD.
        assert_eq!((cl.nodes * cl.osds_per_node, cl.replicas), (2, 2));
        assert_eq!((cl.hdd.as_str(), cl.hdd_gib), (PRESET, 4.0));
        assert_eq!(cl.cache_gib_per_osd, 0.5);
        assert_eq!(cl.working_set_gib_per_osd, p.per_osd as f64 / GIB as f64);
        assert_eq!(
            (
                s.cache.mode.as_str(),
                s.cache.line_kib,
                s.cache.cutoff.as_ref().unwrap().threshold_kib
            ),
            ("wb", 4, 16)
        );
        assert_eq!(s.cache.ioclass_csv.as_deref(), Some(STUDY_CSV));
        let w: Vec<(&str, u32, u32, u32)> = s
            .workload
            .iter()
            .map(|w| (w.name.as_str(), w.read_pct, w.block_kib, w.qd))
            .collect();
        assert_eq!(w, [("randread-4k", 100, 4, 16), ("randwrite-4k", 0, 4, 16)]);
        let c: Vec<&str> = s.config.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(c, LAYOUTS);
    }
}
