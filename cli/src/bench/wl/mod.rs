//! `tiercache bench wl`: SPEC P8 — mode `wl` in front of a real Ceph RBD image, against plain
//! librbd and librbd's in-memory writeback cache, on the same cluster and image size.
//!
//! What runs (fio 4K randwrite, one job, one connection, `--output-format=json`):
//!
//! - **librbd**: fio's `rbd` engine with `rbd_cache = false` (the reference of every ratio);
//! - **librbd-wb**: fio's `rbd` engine with `rbd_cache = true`, `rbd_cache_policy = writeback`
//!   and `rbd_cache_writethrough_until_flush = false` (fio sends no flush, so with the default
//!   `true` the cache would never leave writethrough); librbd's default sizes (32 MiB, 24 MiB
//!   dirty);
//! - **wl**: fio's `nbd` engine against a `tiercache daemon` this command starts, a `wl` cache
//!   on a file (half of it the log) in front of `rbd:POOL/IMAGE` opened with the same
//!   `rbd_cache = false` config as the reference.
//!
//! each at every queue depth, in two phases:
//!
//! - **not full**: librbd and librbd-wb with a 1 s ramp; wl starting from an empty log (the log
//!   is written back before each run) on a cache whose log holds a whole run — checked after
//!   each run: if a write had to wait for log space, the row is marked. The wl cache's
//!   writeback is paced as by default (`wl::pace`): it holds while fio writes until the log is
//!   half full (`--wl-background-fill` changes that; 0 writes back at once);
//! - **full**: every configuration with a 2 s ramp (librbd's 24 MiB of dirty data fill in well
//!   under a second at any queue depth); wl on a second, smaller cache whose log is first
//!   filled by fio at QD 64 until a write waits for log space, then measured at once — writeback
//!   to Ceph is what limits. Plain librbd has no cache: its full-phase runs are the same
//!   workload, measured again beside the others.
//!
//! Each of the three uses its own image (same size), written once end to end with `rbd bench`
//! before any run so no run pays for creating RADOS objects. The librbd runs never overlap wl
//! writeback: the wl log is written back before them. Runs alternate by round (the order of the
//! configurations is reversed every other round); the table holds medians over rounds, the
//! 1-second buckets of all rounds pooled. fio is pinned to one CPU and the daemon to another
//! (SPEC "How to measure"); the Ceph daemons are not pinned. CPU per IO: fio's process (with
//! `--thread`, so librbd's threads are in it) and the daemon's, utime+stime from `/proc` over
//! a window inside the measured part of the run, divided by IOPS × window.
//!
//! The cluster: by default a single-node one started with `scripts/ceph-cluster.sh` in the
//! scratch directory (BlueStore on a sparse file, loopback) and stopped at the end, also if
//! this process dies (the script's `--watch-pid`); or `--ceph-conf FILE` for an existing one,
//! where this command creates its images in `--pool` and removes them at the end.

use super::kit::fill_file;
use super::kit::fio::fio_version;
use super::kit::procs::{STOP, install_stop_signals, proc_cpu_secs, stopped_by};
use super::kit::report::{report_header, write_results};
use crate::bench_ceph::{CephArgs, ClientConfs, Cluster, FioTarget};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tiercache_daemon::admin::Request;
use tiercache_daemon::device::parse_size;
use tiercache_daemon::registry::WL_WRITEBACK;

mod daemon;
mod summary;
use daemon::Daemon;
use summary::summarize;

/// Arguments of `tiercache bench wl`.
#[derive(clap::Args)]
pub struct Args {
    /// CI mode: QD 1, 16, 64, 3 s runs, one round, 1 GiB images, a 512 MiB log (not full) and
    /// a 64 MiB log (full); about 2-3 minutes including the cluster. Not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// Queue depths, comma separated (default 1,4,8,16,32,64; 1,16,64 with --quick).
    #[arg(long)]
    pub qd: Option<String>,
    /// Seconds per measured run, after the ramp (default 10; 3 with --quick).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Rounds; the table holds medians (default 5; 1 with --quick).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Size of each image (k/m/g; default 2g, 1g with --quick).
    #[arg(long)]
    pub image_size: Option<String>,
    /// Cache device of the not-full wl runs; half of it is the log (default 2g; 1g with
    /// --quick).
    #[arg(long)]
    pub cache_size: Option<String>,
    /// Cache device of the full wl runs; half of it is the log, filled before each run
    /// (default 512m; 128m with --quick).
    #[arg(long)]
    pub full_cache_size: Option<String>,
    /// Phases, comma separated: not-full, full (default both).
    #[arg(long)]
    pub phases: Option<String>,
    /// Configurations, comma separated: librbd, librbd-wb, wl (default all three).
    #[arg(long)]
    pub configs: Option<String>,
    /// The wl caches' `wl-writeback --background-fill` (percent of the log under which their
    /// writeback holds while fio writes; 0: writeback at once, always; default: the daemon's,
    /// 50).
    #[arg(long)]
    pub wl_background_fill: Option<u8>,
    /// The wl caches' `wl-writeback --depth` (writes to the image in flight during writeback;
    /// default: the daemon's, 48).
    #[arg(long)]
    pub wl_depth: Option<u32>,
    /// CPU the tiercache daemon runs on.
    #[arg(long, default_value_t = 0)]
    pub server_cpu: usize,
    /// CPU fio runs on.
    #[arg(long, default_value_t = 1)]
    pub client_cpu: usize,
    /// The cluster.
    #[command(flatten)]
    pub ceph: CephArgs,
    /// Write every raw number as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write results.json and report.md (the printed tables) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for the cluster, cache files and sockets (default: the system's
    /// temporary directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cfg {
    Librbd,
    LibrbdWb,
    Wl,
}

impl Cfg {
    fn name(self) -> &'static str {
        match self {
            Cfg::Librbd => "librbd",
            Cfg::LibrbdWb => "librbd-wb",
            Cfg::Wl => "wl",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    NotFull,
    Full,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::NotFull => "not-full",
            Phase::Full => "full",
        }
    }
    /// The wl cache (and its export) of this phase.
    fn cache_id(self) -> u16 {
        match self {
            Phase::NotFull => 1,
            Phase::Full => 2,
        }
    }
}

struct Plan {
    quick: bool,
    qds: Vec<u32>,
    runtime: u64,
    rounds: u32,
    image_bytes: u64,
    cache_nf: u64,
    cache_full: u64,
    phases: Vec<Phase>,
    cfgs: Vec<Cfg>,
    server_cpu: usize,
    client_cpu: usize,
    wl_background_fill: Option<u8>,
    wl_depth: Option<u32>,
    fill_qd: u32,
    fill_timeout: Duration,
}

impl Plan {
    fn ramp(&self, p: Phase) -> u64 {
        match p {
            Phase::NotFull => 1,
            Phase::Full => 2,
        }
    }
    fn has(&self, c: Cfg) -> bool {
        self.cfgs.contains(&c)
    }
}

fn list<T: Copy>(s: &str, what: &str, all: &[(&str, T)]) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    for x in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let Some((_, t)) = all.iter().find(|(n, _)| *n == x) else {
            let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
            return Err(format!("{what} {x}: want {}", names.join(", ")));
        };
        v.push(*t);
    }
    if v.is_empty() {
        return Err(format!("{what}: nothing selected"));
    }
    Ok(v)
}

/// Runs `tiercache bench wl`.
pub fn run(a: Args) -> Result<(), String> {
    let (plan, cpus) = plan_of(&a)?;
    let fio = check_tools(&plan)?;
    if let Some(d) = &a.out {
        std::fs::create_dir_all(d).map_err(|e| format!("--out {}: {e}", d.display()))?;
    }
    let scratch = a
        .scratch
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("tiercache-bench-wl-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    install_stop_signals();
    let t0 = Instant::now();
    let mut rep = Report::default();
    let res = run_in(&a, &plan, &scratch, &mut rep);
    let _ = std::fs::remove_dir_all(&scratch);
    let total_s = t0.elapsed().as_secs_f64();
    let stopped = STOP.load(Ordering::Relaxed);
    if rep.runs.is_empty() {
        return res;
    }
    let (text, summary, targets) = summarize(&plan, &rep, &fio);
    println!("\n{text}");
    if cpus < 2 || plan.server_cpu == plan.client_cpu {
        println!("note: the daemon and fio share a CPU here; the targets want them pinned apart");
    }
    println!("total time: {total_s:.1} s");
    if stopped {
        println!(
            "(stopped by {}: the tables hold what was measured)",
            stopped_by()
        );
    }
    if let Err(e) = &res {
        println!("(ended early: {e})");
    }
    let doc = report_header(
        "tiercache bench wl",
        json!({
        "spec": "P8",
        "fio": fio,
        "config": {
            "quick": plan.quick, "queue_depths": plan.qds, "runtime_s": plan.runtime,
            "ramp_s": {"not-full": plan.ramp(Phase::NotFull), "full": plan.ramp(Phase::Full)},
            "rounds": plan.rounds, "image_bytes": plan.image_bytes,
            "wl_cache_bytes": {"not-full": plan.cache_nf, "full": plan.cache_full},
            "phases": plan.phases.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "configs": plan.cfgs.iter().map(|c| c.name()).collect::<Vec<_>>(),
            "server_cpu": plan.server_cpu, "client_cpu": plan.client_cpu,
            "fill_qd": plan.fill_qd, "fill_timeout_s": plan.fill_timeout.as_secs(),
            "block_size": 4096, "rw": "randwrite",
        },
        "setup": rep.setup,
        "runs": rep.runs.iter().map(Run::to_json).collect::<Vec<_>>(),
        "fills": rep.fills,
        "drains": rep.drains,
        "summary": summary,
        "targets": targets,
        "total_s": total_s,
        "stopped_early": stopped,
        "error": res.as_ref().err(),
        }),
    );
    write_results(
        a.json.as_deref(),
        a.out.as_deref(),
        "tiercache bench wl (target P8)",
        &doc,
        &text,
    )?;
    res
}

/// The plan of a run from its arguments, checked; and the CPUs of this machine.
fn plan_of(a: &Args) -> Result<(Plan, usize), String> {
    let quick = a.quick;
    let qds: Vec<u32> = match &a.qd {
        Some(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|q| (1..=1024).contains(q))
                    .ok_or_else(|| format!("--qd {x}: want numbers 1-1024, comma separated"))
            })
            .collect::<Result<_, _>>()?,
        None if quick => vec![1, 16, 64],
        None => vec![1, 4, 8, 16, 32, 64],
    };
    let size = |v: &Option<String>, q: &str, f: &str| {
        parse_size(v.as_deref().unwrap_or(if quick { q } else { f }))
    };
    let plan = Plan {
        quick,
        qds,
        runtime: a.runtime.unwrap_or(if quick { 3 } else { 10 }),
        rounds: a.rounds.unwrap_or(if quick { 1 } else { 5 }),
        image_bytes: size(&a.image_size, "1g", "2g")?,
        cache_nf: size(&a.cache_size, "1g", "2g")?,
        cache_full: size(&a.full_cache_size, "128m", "512m")?,
        phases: match &a.phases {
            Some(s) => list(
                s,
                "--phases",
                &[("not-full", Phase::NotFull), ("full", Phase::Full)],
            )?,
            None => vec![Phase::NotFull, Phase::Full],
        },
        cfgs: match &a.configs {
            Some(s) => list(
                s,
                "--configs",
                &[
                    ("librbd", Cfg::Librbd),
                    ("librbd-wb", Cfg::LibrbdWb),
                    ("wl", Cfg::Wl),
                ],
            )?,
            None => vec![Cfg::Librbd, Cfg::LibrbdWb, Cfg::Wl],
        },
        server_cpu: a.server_cpu,
        client_cpu: a.client_cpu,
        wl_background_fill: a.wl_background_fill,
        wl_depth: a.wl_depth,
        fill_qd: 64,
        fill_timeout: Duration::from_secs(if quick { 60 } else { 300 }),
    };
    if plan.runtime == 0 || plan.rounds == 0 {
        return Err("--runtime and --rounds must be at least 1".into());
    }
    if plan.image_bytes < 64 << 20 || !plan.image_bytes.is_multiple_of(4 << 20) {
        return Err("--image-size must be a multiple of 4 MiB, at least 64m".into());
    }
    if plan.cache_nf < 64 << 20 || plan.cache_full < 64 << 20 {
        return Err("--cache-size and --full-cache-size must be at least 64m".into());
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if plan.server_cpu >= cpus || plan.client_cpu >= cpus {
        return Err(format!(
            "--server-cpu/--client-cpu: this machine has CPUs 0-{}",
            cpus - 1
        ));
    }
    Ok((plan, cpus))
}

/// fio with the engines the configurations need, and taskset; fio's version.
fn check_tools(plan: &Plan) -> Result<String, String> {
    let fio = fio_version().ok_or("fio is not installed (apt-get install fio)")?;
    let engines = Command::new("fio")
        .arg("--enghelp")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for (e, why) in [("rbd", Cfg::Librbd), ("nbd", Cfg::Wl)] {
        let needed = plan.has(why) || (e == "rbd" && plan.has(Cfg::LibrbdWb));
        if needed && !engines.split_whitespace().any(|w| w == e) {
            return Err(format!(
                "this fio has no {e} engine (fio --enghelp); Debian's fio package has both"
            ));
        }
    }
    Command::new("taskset")
        .arg("-V")
        .output()
        .map_err(|_| "taskset is not installed (util-linux)")?;
    Ok(fio)
}

// ---------------------------------------------------------------------------------------------
// fio.

/// One measured run.
#[derive(Default)]
struct Meas {
    iops: f64,
    ios: u64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
    mean_us: f64,
    max_us: f64,
    /// 1-second IOPS buckets (fio's iops log, averaged over 1000 ms).
    buckets: Vec<f64>,
    fio_cpu_us_per_io: Option<f64>,
    daemon_cpu_us_per_io: Option<f64>,
    runtime_ms: u64,
}

struct Run {
    round: u32,
    phase: Phase,
    cfg: Cfg,
    qd: u32,
    at_s: f64,
    m: Meas,
    /// wl: the log before and after, samples during the run (s, fill %, writes that waited).
    wl_before: Option<Value>,
    wl_after: Option<Value>,
    wl_samples: Vec<(f64, f64, u64)>,
    /// wl not-full: a write waited for log space during the run (it was not "not full").
    filled: bool,
    /// wl: the lowest and highest log fill (%) sampled in the measured part.
    fill_range: Option<(f64, f64)>,
}

impl Run {
    fn to_json(&self) -> Value {
        json!({
            "round": self.round, "phase": self.phase.name(), "config": self.cfg.name(),
            "qd": self.qd, "started_at_s": self.at_s,
            "iops": self.m.iops, "ios": self.m.ios, "runtime_ms": self.m.runtime_ms,
            "lat_us": {"p50": self.m.p50_us, "p90": self.m.p90_us, "p99": self.m.p99_us,
                "p99_9": self.m.p999_us, "mean": self.m.mean_us, "max": self.m.max_us},
            "iops_buckets_1s": self.m.buckets,
            "fio_cpu_us_per_io": self.m.fio_cpu_us_per_io,
            "daemon_cpu_us_per_io": self.m.daemon_cpu_us_per_io,
            "write_log_before": self.wl_before, "write_log_after": self.wl_after,
            "write_log_samples": self.wl_samples.iter()
                .map(|(t, f, w)| json!({"t_s": t, "log_fill_pct": f, "writes_waited_for_space": w}))
                .collect::<Vec<_>>(),
            "log_filled_during_not_full_run": self.filled,
            "log_fill_pct_measured_part": self.fill_range.map(|(a, b)| json!({"min": a, "max": b})),
        })
    }
}

#[derive(Default)]
struct Report {
    setup: Value,
    runs: Vec<Run>,
    fills: Vec<Value>,
    drains: Vec<Value>,
}

fn fio_cmd(plan: &Plan, target: &FioTarget, qd: u32) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.arg("-c")
        .arg(plan.client_cpu.to_string())
        .arg("fio")
        .arg("--name=p8")
        .arg("--thread")
        .arg("--rw=randwrite")
        .arg("--bs=4k")
        .arg(format!("--iodepth={qd}"))
        .arg("--norandommap")
        .arg("--randrepeat=0")
        .arg("--time_based")
        .stdin(Stdio::null());
    target.apply(&mut cmd);
    cmd
}

/// Reads what fio reported for its one job.
fn parse_meas(v: &Value) -> Result<Meas, String> {
    let job = v["jobs"].get(0).ok_or("fio reported no job")?;
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio job error {}", job["error"]));
    }
    let w = &job["write"];
    let lat = &w["lat_ns"];
    let pct = |k: &str| lat["percentile"][k].as_f64().unwrap_or(0.0) / 1000.0;
    let m = Meas {
        iops: w["iops"].as_f64().unwrap_or(0.0),
        ios: w["total_ios"].as_u64().unwrap_or(0),
        p50_us: pct("50.000000"),
        p90_us: pct("90.000000"),
        p99_us: pct("99.000000"),
        p999_us: pct("99.900000"),
        mean_us: lat["mean"].as_f64().unwrap_or(0.0) / 1000.0,
        max_us: lat["max"].as_f64().unwrap_or(0.0) / 1000.0,
        runtime_ms: job["job_runtime"].as_u64().unwrap_or(0),
        ..Meas::default()
    };
    if m.ios == 0 {
        return Err("fio completed no write".into());
    }
    Ok(m)
}

/// The values of an fio iops log (`--log_avg_msec=1000`: one line per second).
fn read_buckets(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(',').nth(1)?.trim().parse::<f64>().ok())
        .collect()
}

/// Samples taken while fio runs: (seconds since start, fio CPU s, daemon CPU s, wl block).
type Sample = (f64, Option<f64>, Option<f64>, Option<Value>);

/// Runs one measured fio job; samples CPU (and the wl log through `wl`) while it runs.
fn measure(
    plan: &Plan,
    target: &FioTarget,
    qd: u32,
    ramp: u64,
    scratch: &Path,
    wl: Option<(&Daemon, u16)>,
) -> Result<(Meas, Vec<Sample>), String> {
    let prefix = scratch.join("iops");
    let log = scratch.join("iops_iops.1.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = fio_cmd(plan, target, qd);
    cmd.arg(format!("--runtime={}", plan.runtime))
        .arg(format!("--ramp_time={ramp}"))
        .arg("--lat_percentiles=1")
        .arg("--percentile_list=50:90:99:99.9")
        .arg(format!("--write_iops_log={}", prefix.display()))
        .arg("--log_avg_msec=1000")
        .arg("--iopsavgtime=1000")
        .arg("--output-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("cannot run fio: {e}"))?;
    let pid = child.id();
    let done = AtomicBool::new(false);
    let daemon_pid = wl.map(|(d, _)| d.pid);
    let (out, samples) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut v: Vec<Sample> = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if STOP.load(Ordering::Relaxed) {
                    // SAFETY: signalling our own child process (fio, exec'd by taskset) by its
                    // pid; it has not been reaped while `done` is false.
                    unsafe { libc::kill(pid as i32, libc::SIGINT) };
                }
                let w = wl.and_then(|(d, id)| d.wl(id).ok());
                v.push((
                    t0.elapsed().as_secs_f64(),
                    proc_cpu_secs(pid),
                    daemon_pid.and_then(proc_cpu_secs),
                    w,
                ));
                std::thread::sleep(Duration::from_millis(250));
            }
            v
        });
        let out = child.wait_with_output();
        done.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap_or_default())
    });
    let out = out.map_err(|e| format!("fio: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(start) = text.find('{') else {
        return Err(format!(
            "fio gave no results: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    };
    let v: Value = serde_json::from_str(&text[start..]).map_err(|e| format!("fio's JSON: {e}"))?;
    let mut m = parse_meas(&v)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stderr).trim()))?;
    m.buckets = read_buckets(&log);
    if m.buckets.is_empty()
        && let Some(x) = v["jobs"][0]["write"]["iops_min"].as_f64()
    {
        m.buckets.push(x);
    }
    let _ = std::fs::remove_file(&log);
    // CPU over a window inside the measured part: from 0.5 s after the ramp (fio's start-up
    // and connection are before it) to the last sample before the end.
    let total = t0.elapsed().as_secs_f64();
    let lo = ramp as f64 + 0.5;
    let hi = (ramp + plan.runtime) as f64;
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.0 >= lo && s.0 <= hi.min(total))
        .collect();
    if let (Some(a), Some(b)) = (inside.first(), inside.last())
        && b.0 - a.0 >= 0.5
        && m.iops > 0.0
    {
        let ios = m.iops * (b.0 - a.0);
        if let (Some(x), Some(y)) = (a.1, b.1) {
            m.fio_cpu_us_per_io = Some((y - x) * 1e6 / ios);
        }
        if let (Some(x), Some(y)) = (a.2, b.2) {
            m.daemon_cpu_us_per_io = Some((y - x) * 1e6 / ios);
        }
    }
    Ok((m, samples))
}

/// Fills cache `id`'s log: fio at QD `plan.fill_qd` until a write waits for log space (or the
/// log is 99% used). Returns what it saw.
fn fill(plan: &Plan, d: &Daemon, id: u16, export: &str) -> Result<Value, String> {
    let w0 = d.wl(id)?;
    let waited0 = w0["writes_waited_for_space"].as_u64().unwrap_or(0);
    let mut cmd = fio_cmd(plan, &FioTarget::Nbd { uri: d.uri(export) }, plan.fill_qd);
    cmd.arg(format!("--runtime={}", plan.fill_timeout.as_secs() + 5))
        .arg("--output-format=json")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("cannot run fio: {e}"))?;
    let mut reached = false;
    let mut last = w0.clone();
    let mut err = None;
    while t.elapsed() < plan.fill_timeout && !STOP.load(Ordering::Relaxed) {
        if let Ok(Some(st)) = child.try_wait() {
            err = Some(format!("the fill run (fio) ended early: {st}"));
            break;
        }
        match d.wl(id) {
            Ok(w) => {
                let waited = w["writes_waited_for_space"].as_u64().unwrap_or(0);
                let pct = w["log_fill_pct"].as_f64().unwrap_or(0.0);
                last = w;
                if waited > waited0 || pct >= 99.0 {
                    reached = true;
                    break;
                }
            }
            Err(e) => {
                err = Some(e);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: signalling our own child (fio), not yet reaped; SIGINT makes fio end its job.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let tw = Instant::now();
    while child.try_wait().ok().flatten().is_none() {
        if tw.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(e) = err {
        return Err(e);
    }
    Ok(json!({
        "cache_id": id, "reached": reached, "seconds": t.elapsed().as_secs_f64(),
        "log_fill_pct": last["log_fill_pct"], "dirty_bytes": last["dirty_bytes"],
        "writes_waited_for_space": last["writes_waited_for_space"],
        "log_bytes": last["log_bytes"],
    }))
}

// ---------------------------------------------------------------------------------------------
// The runs.

fn run_in(a: &Args, plan: &Plan, scratch: &Path, rep: &mut Report) -> Result<(), String> {
    let t0 = Instant::now();
    let nimg = 3u64;
    let osd_bytes = (nimg * plan.image_bytes + (4 << 30)).max(10 << 30);
    let mut cluster = a.ceph.cluster(scratch, osd_bytes, &mut rep.setup)?;
    let res = run_with(plan, scratch, &mut cluster, rep, t0);
    cluster.stop();
    res
}

fn run_with(
    plan: &Plan,
    scratch: &Path,
    cluster: &mut Cluster,
    rep: &mut Report,
    t0: Instant,
) -> Result<(), String> {
    let confs = ClientConfs::write(cluster, scratch, &mut rep.setup)?;
    let (plain, wb) = (confs.plain.clone(), confs.wb.clone());
    // The images: one per configuration, same size, written end to end.
    let pid = std::process::id();
    let img = |c: &str| format!("tc-p8-{pid}-{c}");
    let (img_rbd, img_nf, img_full) = (img("librbd"), img("wl-notfull"), img("wl-full"));
    let mut made = Vec::new();
    let want_rbd = plan.has(Cfg::Librbd) || plan.has(Cfg::LibrbdWb);
    let want_wl = plan.has(Cfg::Wl);
    for (name, want) in [
        (&img_rbd, want_rbd),
        (&img_nf, want_wl && plan.phases.contains(&Phase::NotFull)),
        (&img_full, want_wl && plan.phases.contains(&Phase::Full)),
    ] {
        if want {
            let s = cluster.image(name, plan.image_bytes)?;
            println!(
                "image {}/{name}: {} MiB, written end to end in {s:.1} s",
                cluster.pool,
                plan.image_bytes >> 20
            );
            made.push(json!({"image": name, "bytes": plan.image_bytes, "prewrite_s": s}));
        }
    }
    rep.setup["images"] = json!(made);
    // The daemon and its two wl caches.
    let mut daemon = None;
    if want_wl {
        let d = Daemon::start(plan, scratch)?;
        let mut caches = Vec::new();
        for (phase, bytes, image) in [
            (Phase::NotFull, plan.cache_nf, &img_nf),
            (Phase::Full, plan.cache_full, &img_full),
        ] {
            if !plan.phases.contains(&phase) {
                continue;
            }
            let f = scratch.join(format!("cache-{}.img", phase.name()));
            let t = Instant::now();
            fill_file(&f, bytes, None)?;
            let zs = t.elapsed().as_secs_f64();
            let c = d.call(Request::StartCache {
                cache_device: f.display().to_string(),
                cache_id: Some(phase.cache_id()),
                mode: Some("wl".into()),
                line_size: None,
                load: false,
                force: true,
                io_timeout: None,
                dry_run: false,
            })?;
            let dev = confs.core_device(cluster, image);
            d.call(Request::AddCore {
                cache_id: phase.cache_id(),
                core_device: dev.clone(),
                core_id: Some(0),
                export: Some(format!("p8-{}", phase.name())),
                io_timeout: None,
            })?;
            let mut values = Vec::new();
            if let Some(f) = plan.wl_background_fill {
                values.push(("background-fill".to_string(), f.to_string()));
            }
            if let Some(n) = plan.wl_depth {
                values.push(("depth".to_string(), n.to_string()));
            }
            if !values.is_empty() {
                d.call(Request::SetParam {
                    cache_id: phase.cache_id(),
                    core_id: None,
                    name: WL_WRITEBACK.into(),
                    values,
                })?;
            }
            // When its writeback runs (`wl::pace`): in the not-full runs it holds while fio
            // writes and the log is under the background fill.
            let pacing = d.call(Request::GetParam {
                cache_id: phase.cache_id(),
                core_id: None,
                name: WL_WRITEBACK.into(),
            })?;
            let w = d.wl(phase.cache_id())?;
            let text = |k: &str| tiercache_daemon::registry::param_text(k, &pacing[k]).1;
            println!(
                "wl cache {} ({}): {} MiB file, log {} MiB, core {dev}; writeback holds while fio writes and the log is under {} full (idle {}, expire {}), then goes with up to {} writes in flight",
                phase.cache_id(),
                phase.name(),
                bytes >> 20,
                w["log_bytes"].as_u64().unwrap_or(0) >> 20,
                text("background_fill_pct"),
                text("idle_ms"),
                text("expire_s"),
                pacing["depth"]
            );
            caches.push(json!({"phase": phase.name(), "cache_id": phase.cache_id(),
                "device_bytes": bytes, "zero_fill_s": zs, "created": c["created"],
                "core_device": dev, "write_log": w, "wl_writeback": pacing}));
        }
        rep.setup["wl_caches"] = json!(caches);
        rep.setup["daemon_cpu"] = json!(plan.server_cpu);
        daemon = Some(d);
    }
    println!(
        "setup done in {:.1} s; fio on CPU {}, daemon on CPU {}",
        t0.elapsed().as_secs_f64(),
        plan.client_cpu,
        plan.server_cpu
    );
    let res = rounds(
        plan,
        scratch,
        daemon.as_ref(),
        &plain,
        &wb,
        (&cluster.id, &cluster.pool, &img_rbd),
        rep,
        t0,
    );
    if let Some(mut d) = daemon {
        let ids: Vec<u16> = plan.phases.iter().map(|p| p.cache_id()).collect();
        d.stop(&ids);
    }
    res
}

/// What every run of [`rounds`] needs, and how many have run.
struct Rounds<'a> {
    plan: &'a Plan,
    scratch: &'a Path,
    d: Option<&'a Daemon>,
    /// librbd's client configurations: plain and with its writeback cache.
    plain: &'a Path,
    wb: &'a Path,
    /// (client id, pool, image) of the librbd configurations.
    rbd: (&'a str, &'a str, &'a str),
    t0: Instant,
    n: usize,
    total_runs: usize,
}

impl Rounds<'_> {
    /// What fio runs against: librbd's image, or wl's export of `p`'s cache.
    fn target(&self, c: Cfg, p: Phase) -> FioTarget {
        let (id, pool, img_rbd) = self.rbd;
        match c {
            Cfg::Librbd => FioTarget::Rbd {
                conf: self.plain.to_path_buf(),
                id: id.into(),
                pool: pool.into(),
                image: img_rbd.into(),
            },
            Cfg::LibrbdWb => FioTarget::Rbd {
                conf: self.wb.to_path_buf(),
                id: id.into(),
                pool: pool.into(),
                image: img_rbd.into(),
            },
            Cfg::Wl => FioTarget::Nbd {
                uri: self
                    .d
                    .map(|d| d.uri(&format!("p8-{}", p.name())))
                    .unwrap_or_default(),
            },
        }
    }

    /// One measured run of `c` at `qd`, printed and kept (with the log's fill for wl).
    fn one(
        &mut self,
        round: u32,
        phase: Phase,
        c: Cfg,
        qd: u32,
        rep: &mut Report,
    ) -> Result<(), String> {
        self.n += 1;
        let (plan, d, n, total_runs) = (self.plan, self.d, self.n, self.total_runs);
        let wl = (c == Cfg::Wl).then(|| (d.expect("daemon"), phase.cache_id()));
        let before = wl.map(|(d, id)| d.wl(id)).transpose()?;
        let at = self.t0.elapsed().as_secs_f64();
        let (m, samples) = measure(
            plan,
            &self.target(c, phase),
            qd,
            plan.ramp(phase),
            self.scratch,
            wl,
        )?;
        let after = wl.map(|(d, id)| d.wl(id)).transpose()?;
        let waited = |w: &Option<Value>| {
            w.as_ref()
                .and_then(|w| w["writes_waited_for_space"].as_u64())
                .unwrap_or(0)
        };
        let filled = phase == Phase::NotFull && c == Cfg::Wl && waited(&after) > waited(&before);
        let fillpct = |w: &Option<Value>| w.as_ref().and_then(|w| w["log_fill_pct"].as_f64());
        // The log's fill while the measured part ran (samples after the ramp).
        let during: Vec<f64> = samples
            .iter()
            .filter(|s| s.0 >= plan.ramp(phase) as f64 + 0.5)
            .filter_map(|s| s.3.as_ref()?["log_fill_pct"].as_f64())
            .collect();
        let fill_range = (!during.is_empty()).then(|| {
            (
                during.iter().copied().fold(f64::INFINITY, f64::min),
                during.iter().copied().fold(0.0, f64::max),
            )
        });
        let range = fill_range
            .map(|(a, b)| format!(" (measured part {a:.0}-{b:.0}%)"))
            .unwrap_or_default();
        let extra = match (fillpct(&before), fillpct(&after)) {
            (Some(a), Some(b)) => format!(
                "  log {a:.0}%->{b:.0}%{range}, {} writes waited for space{}",
                waited(&after) - waited(&before),
                if filled { " (LOG FILLED)" } else { "" }
            ),
            _ => String::new(),
        };
        println!(
            "[{n}/{total_runs}] round {} {:<8} {:<9} QD {:>2}: {:>7.0} IOPS  p50 {:>8.1} us  p99 {:>9.1} us{extra}",
            round + 1,
            phase.name(),
            c.name(),
            qd,
            m.iops,
            m.p50_us,
            m.p99_us
        );
        rep.runs.push(Run {
            round,
            phase,
            cfg: c,
            qd,
            at_s: at,
            m,
            wl_before: before,
            wl_after: after,
            wl_samples: samples
                .iter()
                .filter_map(|s| {
                    let w = s.3.as_ref()?;
                    Some((
                        s.0,
                        w["log_fill_pct"].as_f64()?,
                        w["writes_waited_for_space"].as_u64()?,
                    ))
                })
                .collect(),
            filled,
            fill_range,
        });
        Ok(())
    }

    /// Writes `phase`'s wl log back (waits until drained), kept as a drain measurement.
    fn drain(&self, phase: Phase, why: &str, rep: &mut Report) -> Result<(), String> {
        let d = self.d;
        if let Some(d) = d {
            let (s, bytes) = d.drain(phase.cache_id())?;
            rep.drains
                .push(json!({"cache_id": phase.cache_id(), "phase": phase.name(),
                "when": why, "seconds": s, "dirty_bytes": bytes,
                "bytes_per_s": if s > 0.0 { bytes as f64 / s } else { 0.0 }}));
        }
        Ok(())
    }

    /// Phase not-full of `round`: every QD, every configuration (wl drained after each run);
    /// false when Ctrl-C stopped it.
    fn not_full(&mut self, round: u32, cfgs: &[Cfg], rep: &mut Report) -> Result<bool, String> {
        let (plan, phase) = (self.plan, Phase::NotFull);
        for &qd in &plan.qds {
            for &c in cfgs {
                if STOP.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                self.one(round, phase, c, qd, rep)?;
                if c == Cfg::Wl {
                    // Empty again for the next run (and idle while librbd runs).
                    self.drain(phase, "after a not-full run", rep)?;
                }
            }
        }
        Ok(true)
    }

    /// Phase full of `round`; false when Ctrl-C stopped it.
    fn full(&mut self, round: u32, cfgs: &[Cfg], rep: &mut Report) -> Result<bool, String> {
        let (plan, d, phase) = (self.plan, self.d, Phase::Full);
        // librbd's runs while wl is idle (drained), then wl's: its log filled
        // before each run, drained after the last.
        let wl_first = round % 2 == 1;
        let rbd: Vec<Cfg> = cfgs.iter().copied().filter(|c| *c != Cfg::Wl).collect();
        let mut blocks: Vec<bool> = vec![false, true];
        if wl_first {
            blocks.reverse();
        }
        for is_wl in blocks {
            if is_wl && !plan.has(Cfg::Wl) {
                continue;
            }
            for &qd in &plan.qds {
                if STOP.load(Ordering::Relaxed) {
                    return Ok(false);
                }
                if is_wl {
                    let dm = d.expect("daemon");
                    let f = fill(plan, dm, phase.cache_id(), &format!("p8-{}", phase.name()))?;
                    println!(
                        "  fill: log {}% in {:.1} s{}",
                        f["log_fill_pct"],
                        f["seconds"].as_f64().unwrap_or(0.0),
                        if f["reached"] == true {
                            ""
                        } else {
                            " (NOT FULL: no write waited for space)"
                        }
                    );
                    rep.fills.push(json!({"round": round, "qd": qd, "fill": f}));
                    self.one(round, phase, Cfg::Wl, qd, rep)?;
                } else {
                    for &c in &rbd {
                        self.one(round, phase, c, qd, rep)?;
                    }
                }
            }
            if is_wl {
                self.drain(phase, "after the full runs", rep)?;
            }
        }
        Ok(true)
    }
}

#[allow(clippy::too_many_arguments)]
fn rounds(
    plan: &Plan,
    scratch: &Path,
    d: Option<&Daemon>,
    plain: &Path,
    wb: &Path,
    rbd: (&str, &str, &str),
    rep: &mut Report,
    t0: Instant,
) -> Result<(), String> {
    let mut r = Rounds {
        plan,
        scratch,
        d,
        plain,
        wb,
        rbd,
        t0,
        n: 0,
        total_runs: plan.rounds as usize * plan.phases.len() * plan.qds.len() * plan.cfgs.len(),
    };
    for round in 0..plan.rounds {
        // Every other round runs the configurations in the opposite order.
        let mut cfgs = plan.cfgs.clone();
        if round % 2 == 1 {
            cfgs.reverse();
        }
        for &phase in &plan.phases {
            let went_on = match phase {
                Phase::NotFull => r.not_full(round, &cfgs, rep)?,
                Phase::Full => r.full(round, &cfgs, rep)?,
            };
            if !went_on {
                return Ok(());
            }
        }
    }
    Ok(())
}
