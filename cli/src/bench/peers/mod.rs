//! `tiercache bench peers`: SPEC P1 and P2 against the peers, measured as SPEC's "How to
//! measure" says — one run on one machine, the servers pinned to one CPU and fio to another,
//! the median of at least 5 alternating rounds with the spread, CPU-µs per IO beside IOPS,
//! unix sockets, one connection unless said otherwise.
//!
//! - **P1** (4K random read, QD 16, 100% hits): tiercache with a `ram:` cache over a file core,
//!   tiercache with a file cache device (O_DIRECT) over a file core, `nbdkit memory` holding
//!   the same data, and fio `io_uring` direct on the cache file itself (the device ceiling).
//!   Targets (SPEC P1): ram / nbdkit memory ≥ 1.5 at ≤ 0.6× its server CPU-µs per IO; file /
//!   min(nbdkit memory, device) ≥ 0.9 at ≤ 1.5× fio's CPU-µs per IO on the device; a target
//!   is met when both its ratio and its CPU bound are.
//! - **P2** (4K 70/30, Zipf 0.9 over a working set of 2× the cache, QD 16): tiercache with a
//!   file cache of size S over `nbd:` to `nbdkit --filter=delay memory`, against nbdkit's own
//!   cache filter (writeback, 4K blocks, cache-on-read, at most S) over the same kind of
//!   delayed core. Target: tiercache / nbdkit cache ≥ 1.5. Hit ratios: tiercache's from its
//!   counters; nbdkit's from a log filter under its cache (reads that reached the core).
//! - **Connections**: 4K random read hits with 1..4 connections (fio `numjobs`, each job its
//!   own NBD connection: fio's nbd engine opens one libnbd handle per job), tiercache `ram:`
//!   beside `nbdkit memory`.
//!
//! Every server is a child process started under `taskset` (tiercache as a `tiercache daemon`
//! child, driven through its admin socket) in its own process group, so Ctrl-C reaches only
//! this process, which stops between runs, prints what it measured and stops every child it
//! started (also on errors; the children die with this process if it is killed).
//!
//! Server CPU per IO: the server process's utime+stime (`/proc/PID/stat`) over a window inside
//! the measured part of the run, divided by the IOs of that window (IOPS × seconds). fio's:
//! (usr_cpu + sys_cpu) × job runtime / IOs, from its JSON.

use super::kit::daemon::Daemon;
use super::kit::fill_file;
use super::kit::fio::{fio_version, warm_own};
use super::kit::host::tool_version;
use super::kit::procs::{
    Procs, STOP, deleted_file_bytes, install_stop_signals, opened_direct, stopped_by,
};
use super::kit::report::{Bar, report_header, write_results};
use measure::{measure, print_run};
use serde_json::{Value, json};
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use summary::summarize;
use tiercache_daemon::device::parse_size;

mod measure;
mod summary;

const NBDKIT: &str = "nbdkit";
/// The pass-through cache P1 measures as the structure's floor (1 and 2 are P1's caches, 3
/// is P2's).
const PT_CACHE: u16 = 4;

/// Arguments of `tiercache bench peers`.
#[derive(clap::Args)]
pub struct Args {
    /// A smoke run: 2 rounds of 1 s runs (1 round for the connection sweep), small working
    /// sets; about 40 seconds. Not a measurement.
    #[arg(long)]
    pub quick: bool,
    /// Alternating rounds per comparison; the median is reported (at least 5 for a number to
    /// publish).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Seconds per measured run (default 5; 1 with --quick).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Queue depth per connection.
    #[arg(long, default_value_t = 16)]
    pub iodepth: u32,
    /// Working set of the 4K random-read comparison (k/m/g), all of it cached (default 256m;
    /// 64m with --quick).
    #[arg(long)]
    pub working_set: Option<String>,
    /// Cache size S of the 70/30 comparison with nbdkit's cache filter (k/m/g); its working
    /// set is 2×S (default 128m; 32m with --quick).
    #[arg(long, value_name = "SIZE")]
    pub p2_cache_size: Option<String>,
    /// Core delay per read and per write of the 70/30 comparison (nbdkit delay filter's
    /// rdelay/wdelay).
    #[arg(long, default_value = "5ms")]
    pub delay: String,
    /// Seconds of the 70/30 workload each of its configurations runs before the rounds
    /// (default 30; 2 with --quick).
    #[arg(long, value_name = "SECONDS")]
    pub p2_warmup: Option<u64>,
    /// Connections of the sweep: 1 to this.
    #[arg(long, default_value_t = 4)]
    pub max_conns: u32,
    /// CPU the servers run on.
    #[arg(long, default_value_t = 0)]
    pub server_cpu: usize,
    /// CPU fio runs on.
    #[arg(long, default_value_t = 1)]
    pub client_cpu: usize,
    /// Only these parts, comma separated: p1, p2, conns.
    #[arg(long)]
    pub only: Option<String>,
    /// Write every raw number (each run's IOPS, latency percentiles, CPU) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write results.json and report.md (the printed tables) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for device files and sockets (default: the system's temporary
    /// directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
}

/// What a run does, after the defaults are applied.
struct Plan {
    quick: bool,
    rounds: u32,
    conn_rounds: u32,
    runtime_ms: u64,
    ramp_ms: u64,
    qd: u32,
    ws: u64,
    s2: u64,
    delay: String,
    warm2_ms: u64,
    max_conns: u32,
    server_cpu: usize,
    client_cpu: usize,
    p1: bool,
    p2: bool,
    conns: bool,
}

/// Runs `tiercache bench peers`.
pub fn run(a: Args) -> Result<(), String> {
    let quick = a.quick;
    let rounds = a.rounds.unwrap_or(if quick { 2 } else { 5 });
    let runtime = a.runtime.unwrap_or(if quick { 1 } else { 5 });
    if rounds == 0 || runtime == 0 || a.iodepth == 0 || a.iodepth > 1024 {
        return Err("--rounds and --runtime must be at least 1, --iodepth 1-1024".into());
    }
    if a.max_conns == 0 || a.max_conns > 64 {
        return Err("--max-conns must be 1-64".into());
    }
    let ws = parse_size(
        a.working_set
            .as_deref()
            .unwrap_or(if quick { "64m" } else { "256m" }),
    )?;
    let s2 = parse_size(
        a.p2_cache_size
            .as_deref()
            .unwrap_or(if quick { "32m" } else { "128m" }),
    )?;
    if ws < 16 << 20 || s2 < 16 << 20 || ws % (1 << 20) != 0 || s2 % (1 << 20) != 0 {
        return Err(
            "--working-set and --p2-cache-size must be whole MiB, at least 16m each".into(),
        );
    }
    let delay_ok = a
        .delay
        .strip_suffix("ms")
        .or(a.delay.strip_suffix('s'))
        .is_some_and(|n| n.parse::<f64>().is_ok_and(|x| x >= 0.0));
    if !delay_ok {
        return Err(format!(
            "--delay {}: want milliseconds or seconds, e.g. 5ms",
            a.delay
        ));
    }
    let (p1, p2, conns) = parts(a.only.as_deref())?;
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    if a.server_cpu >= cpus || a.client_cpu >= cpus {
        return Err(format!(
            "--server-cpu/--client-cpu: this machine has CPUs 0-{}",
            cpus - 1
        ));
    }
    let fio = fio_version().ok_or("fio is not installed (apt-get install fio)")?;
    let nbdkit =
        tool_version("nbdkit").ok_or("nbdkit is not installed (apt-get install nbdkit)")?;
    tool_version("taskset").ok_or("taskset is not installed (util-linux)")?;
    let plan = Plan {
        quick,
        rounds,
        conn_rounds: if quick { 1 } else { rounds.min(3) },
        runtime_ms: runtime * 1000,
        ramp_ms: if quick { 500 } else { 1000 },
        qd: a.iodepth,
        ws,
        s2,
        delay: a.delay.clone(),
        warm2_ms: a.p2_warmup.unwrap_or(if quick { 2 } else { 30 }) * 1000,
        max_conns: a.max_conns,
        server_cpu: a.server_cpu,
        client_cpu: a.client_cpu,
        p1,
        p2,
        conns,
    };
    if let Some(d) = &a.out {
        std::fs::create_dir_all(d).map_err(|e| format!("--out {}: {e}", d.display()))?;
    }
    let scratch = a
        .scratch
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("tiercache-peers-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    install_stop_signals();
    let mut procs = Procs::default();
    let mut rep = Report::default();
    let res = run_in(&plan, &scratch, &mut procs, &mut rep);
    procs.stop_all();
    let _ = std::fs::remove_dir_all(&scratch);
    let stopped = STOP.load(Ordering::Relaxed);
    if rep.runs.is_empty() {
        return res.map(|_| ());
    }
    let (text, targets) = summarize(&plan, &rep);
    println!("\n{text}");
    if cpus < 2 || plan.server_cpu == plan.client_cpu {
        println!("note: servers and fio share a CPU here; the targets want them pinned apart");
    }
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
        "tiercache bench peers",
        json!({
        "fio": fio,
        "nbdkit": nbdkit,
        "config": {
            "quick": plan.quick, "rounds": plan.rounds, "connection_rounds": plan.conn_rounds,
            "runtime_s": plan.runtime_ms as f64 / 1000.0, "ramp_s": plan.ramp_ms as f64 / 1000.0,
            "iodepth": plan.qd, "p1_working_set_bytes": plan.ws, "p2_cache_bytes": plan.s2,
            "p2_working_set_bytes": 2 * plan.s2, "p2_core_delay": plan.delay,
            "p2_warmup_s": plan.warm2_ms as f64 / 1000.0, "max_connections": plan.max_conns,
            "server_cpu": plan.server_cpu, "client_cpu": plan.client_cpu,
            "parts": {"p1": plan.p1, "p2": plan.p2, "connections": plan.conns},
        },
        "setup": rep.setup,
        "runs": rep.runs.iter().map(Run::to_json).collect::<Vec<_>>(),
        "summary": targets,
        "stopped_early": stopped,
        "error": res.as_ref().err(),
        }),
    );
    write_results(
        a.json.as_deref(),
        a.out.as_deref(),
        "tiercache bench peers",
        &doc,
        &text,
    )?;
    res.map(|_| ())
}

/// `--only`'s parts: (p1, p2, conns); all without it.
fn parts(only: Option<&str>) -> Result<(bool, bool, bool), String> {
    let (mut p1, mut p2, mut conns) = (true, true, true);
    if let Some(o) = only {
        (p1, p2, conns) = (false, false, false);
        for part in o.split(',').map(str::trim) {
            match part {
                "p1" => p1 = true,
                "p2" => p2 = true,
                "conns" => conns = true,
                x => {
                    return Err(format!(
                        "--only {x}: want p1, p2 or conns (comma separated)"
                    ));
                }
            }
        }
    }
    Ok((p1, p2, conns))
}

// ---------------------------------------------------------------------------------------------
// The tiercache daemon's counters.

/// Server counters of one run: (read hit ratio, hit ratio over reads and writes, reads).
fn tc_hits(stats: &Value) -> (f64, f64, u64) {
    let r = &stats["requests"];
    let g = |k: &str| r[k].as_u64().unwrap_or(0);
    let read_hits = g("read_full_hits") + g("read_partial_hits");
    let reads = read_hits + g("read_misses") + g("read_pass_through");
    let hits = read_hits + g("write_full_hits") + g("write_partial_hits");
    let total = g("total");
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    (ratio(read_hits, reads), ratio(hits, total), reads)
}

// ---------------------------------------------------------------------------------------------
// Data.

/// Copies the file `src` into the NBD export at `uri` (1 MiB writes), then flushes.
fn copy_to_nbd(src: &Path, uri: &str) -> Result<(), String> {
    use tiercache_loadgen::{Connection, Target};
    let target = Target::parse(uri).map_err(|e| e.to_string())?;
    let mut c = Connection::connect(&target).map_err(|e| e.to_string())?;
    let mut f = std::fs::File::open(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    loop {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        c.write_at(off, &buf[..n], false)
            .map_err(|e| e.to_string())?;
        off += n as u64;
    }
    c.flush().map_err(|e| e.to_string())?;
    c.close();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// fio runs (measured in `measure`).

enum Target {
    Nbd(String),
    File(PathBuf, u64),
}

struct Job {
    target: Target,
    rw: &'static str,
    mix: Option<u32>,
    zipf: Option<f64>,
    size: u64,
    qd: u32,
    jobs: u32,
    runtime_ms: u64,
    ramp_ms: u64,
}

/// Latency percentiles of one direction (µs).
#[derive(Clone, Debug, Default)]
struct Lat {
    p50: f64,
    p99: f64,
    p999: f64,
    mean: f64,
}

/// One measured run.
#[derive(Clone, Debug, Default)]
struct Run {
    part: &'static str,
    phase: &'static str,
    config: String,
    round: u32,
    conns: u32,
    iops: f64,
    read_iops: f64,
    write_iops: f64,
    read_ios: u64,
    write_ios: u64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    lat_p999_us: f64,
    lat_mean_us: f64,
    read_lat: Option<Lat>,
    write_lat: Option<Lat>,
    fio_usr_pct: f64,
    fio_sys_pct: f64,
    fio_cpu_us_per_io: f64,
    server_cpu_util: Option<f64>,
    server_cpu_us_per_io: Option<f64>,
    read_hit_ratio: Option<f64>,
    hit_ratio: Option<f64>,
    hit_source: &'static str,
    core_reads: Option<u64>,
    core_writes: Option<u64>,
    cut_short: bool,
}

// ---------------------------------------------------------------------------------------------
// The procedure.

#[derive(Default)]
struct Report {
    runs: Vec<Run>,
    setup: Value,
}

/// One configuration of a comparison: a name, what fio drives, the server processes whose CPU
/// it is charged (for tiercache over an nbdkit core, both).
struct Cfg {
    name: String,
    target: String,
    file: Option<(PathBuf, u64)>,
    server: Vec<u32>,
    tc_cache: Option<u16>,
    nbdkit_log: Option<PathBuf>,
}

/// Reads the lines added to `log` since `*off`: (reads, writes) that reached the core.
fn count_core_ops(log: &Path, off: &mut u64) -> (u64, u64) {
    let Ok(mut f) = std::fs::File::open(log) else {
        return (0, 0);
    };
    if f.seek(SeekFrom::Start(*off)).is_err() {
        return (0, 0);
    }
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let Some(end) = s.rfind('\n') else {
        return (0, 0);
    };
    *off += end as u64 + 1;
    let mut r = 0;
    let mut w = 0;
    for l in s[..end].lines() {
        // Each request is logged when it starts ("Read id=") and ends ("...Read id=").
        if l.contains(" Read id=") {
            r += 1;
        } else if l.contains(" Write id=") {
            w += 1;
        }
    }
    (r, w)
}

/// What every run needs: the plan, the daemon, the progress bar.
struct Ctx<'a> {
    plan: &'a Plan,
    d: &'a Daemon,
    bar: &'a Bar,
}

/// Where a run belongs.
struct Step {
    part: &'static str,
    phase: &'static str,
    round: u32,
    conns: u32,
}

/// One run of `c`: counters reset before, hit ratios after.
fn one(
    cx: &Ctx,
    c: &Cfg,
    st: Step,
    job: Job,
    label: &str,
    log_off: &mut u64,
) -> Result<Run, String> {
    let d = cx.d;
    if let Some(id) = c.tc_cache {
        d.reset(id)?;
    }
    if let Some(l) = &c.nbdkit_log {
        count_core_ops(l, log_off);
    }
    let mut r = measure(cx.plan, &job, &c.server, label, cx.bar)?;
    r.part = st.part;
    r.phase = st.phase;
    r.config = c.name.clone();
    r.round = st.round;
    r.conns = st.conns;
    if let Some(id) = c.tc_cache {
        let s = d.stats(id)?;
        let (rh, h, _) = tc_hits(&s);
        r.read_hit_ratio = Some(rh);
        r.hit_ratio = Some(h);
        r.hit_source = "tiercache counters";
        r.core_reads = s["blocks"]["core_bytes_read"].as_u64().map(|b| b / 4096);
        r.core_writes = s["blocks"]["core_bytes_written"].as_u64().map(|b| b / 4096);
    }
    if let Some(l) = &c.nbdkit_log {
        let (cr, cw) = count_core_ops(l, log_off);
        r.core_reads = Some(cr);
        r.core_writes = Some(cw);
        if r.read_ios > 0 {
            r.read_hit_ratio = Some((1.0 - cr as f64 / r.read_ios as f64).max(0.0));
            r.hit_source = "nbdkit log filter under the cache: 1 - core reads / client reads";
        }
    }
    print_run(&r);
    Ok(r)
}

fn run_in(plan: &Plan, scratch: &Path, procs: &mut Procs, rep: &mut Report) -> Result<(), String> {
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    println!(
        "tiercache bench peers{}: servers on CPU {}, fio on CPU {}; {} rounds of {} s (ramp {} s), QD {}{}",
        if plan.quick { " --quick" } else { "" },
        plan.server_cpu,
        plan.client_cpu,
        plan.rounds,
        plan.runtime_ms as f64 / 1000.0,
        plan.ramp_ms as f64 / 1000.0,
        plan.qd,
        if plan.quick {
            " (a smoke run, not a measurement)"
        } else {
            ""
        }
    );
    let mut setup = json!({});
    let d = Daemon::start(procs, Some(plan.server_cpu), &[], scratch)?;
    let cx = Ctx {
        plan,
        d: &d,
        bar: &bar,
    };
    let mut wb_caches: Vec<u16> = Vec::new();
    let res = (|| -> Result<(), String> {
        if plan.p1 || plan.conns {
            p1_and_conns(&cx, scratch, procs, rep, &mut setup)?;
        }
        if plan.p2 && !STOP.load(Ordering::Relaxed) {
            wb_caches.push(3);
            p2(&cx, scratch, procs, rep, &mut setup)?;
        }
        Ok(())
    })();
    rep.setup = setup;
    d.stop(procs, &wb_caches);
    res
}

/// P1 and the connection sweep, on the same servers.
fn p1_and_conns(
    cx: &Ctx,
    scratch: &Path,
    procs: &mut Procs,
    rep: &mut Report,
    setup: &mut Value,
) -> Result<(), String> {
    let plan = cx.plan;
    let (cfgs, mem_pid) = p1_setup(cx, scratch, procs, setup)?;
    let mut off = 0;
    if plan.p1 {
        p1_rounds(cx, &cfgs, &mut off, rep)?;
    }
    if plan.conns && !STOP.load(Ordering::Relaxed) {
        conn_rounds(cx, &cfgs, &mut off, rep)?;
    }
    procs.stop(mem_pid, Duration::from_secs(3));
    // The P1 caches stay (idle) until the daemon stops; their files go with the scratch dir.
    Ok(())
}

/// P1's servers: caches 1 (ram:, wt), 2 (a file, wt) and the pass-through floor in the
/// daemon, `nbdkit memory` with the same bytes; all warmed. Its configurations, and the pid of
/// `nbdkit memory`.
fn p1_setup(
    cx: &Ctx,
    scratch: &Path,
    procs: &mut Procs,
    setup: &mut Value,
) -> Result<([Cfg; 5], u32), String> {
    let (plan, d) = (cx.plan, cx.d);
    let nbdkit = Path::new(NBDKIT);
    let ws = plan.ws;
    let t = Instant::now();
    let core_ram = scratch.join("p1-core-ram.img");
    let core_file = scratch.join("p1-core-file.img");
    let core_pt = scratch.join("p1-core-pt.img");
    let cache_file = scratch.join("p1-cache.img");
    let cache_file_bytes = ws + ws / 2;
    fill_file(&core_ram, ws, Some(0x9e37_79b9_7f4a_7c15))?;
    fill_file(&core_file, ws, Some(0x9e37_79b9_7f4a_7c15))?;
    fill_file(&core_pt, ws, Some(0x9e37_79b9_7f4a_7c15))?;
    fill_file(&cache_file, cache_file_bytes, None)?;
    let ram_dev = format!("ram:{}m", (ws + ws / 4) >> 20);
    let c1 = d.start_cache(1, &ram_dev, "wt")?;
    d.add_core(1, &core_ram.display().to_string(), "p1-ram")?;
    let c2 = d.start_cache(2, &cache_file.display().to_string(), "wt")?;
    d.add_core(2, &core_file.display().to_string(), "p1-file")?;
    // The structure's floor: a pass-through cache over a file of the same data on the same
    // disk. Every read goes to the device through the same reactor, engine and ring, with no
    // lookup, lock or copy of a hit: what this server costs with the cache logic taken away.
    d.start_cache(PT_CACHE, "ram:16m", "pt")?;
    d.add_core(PT_CACHE, &core_pt.display().to_string(), "p1-pt")?;
    let direct = opened_direct(d.pid, &cache_file);
    // nbdkit memory with the same bytes.
    let mem_sock = scratch.join("nbdkit-memory.sock");
    let mem_args = vec![
        "-f".to_string(),
        "--exit-with-parent".into(),
        "-U".into(),
        mem_sock.display().to_string(),
        "memory".into(),
        format!("{ws}"),
    ];
    let mem_pid = procs.spawn(
        "nbdkit memory",
        Some(plan.server_cpu),
        nbdkit,
        &mem_args,
        &[],
        scratch.join("nbdkit-memory.log"),
    )?;
    procs.wait_socket(mem_pid, &mem_sock)?;
    let mem_uri = format!("nbd+unix:///?socket={}", mem_sock.display());
    copy_to_nbd(&core_ram, &mem_uri)?;
    let occupancy = p1_warm(d, ws)?;
    println!(
        "P1 setup: {} MiB working set (pseudo-random data) in tiercache {ram_dev} (wt), in a {} MiB file cache (wt, O_DIRECT: {}), and in nbdkit memory; warmed in {:.1} s",
        ws >> 20,
        cache_file_bytes >> 20,
        direct
            .map(|b| if b { "yes" } else { "NO" })
            .unwrap_or("unknown"),
        t.elapsed().as_secs_f64()
    );
    setup["p1"] = json!({
        "working_set_bytes": ws, "ram_cache_device": ram_dev, "ram_cache": c1,
        "file_cache_bytes": cache_file_bytes, "file_cache": c2,
        "file_cache_o_direct": direct, "warm_up": occupancy,
        "nbdkit": format!("nbdkit memory {ws}"), "core": "a file (pseudo-random data)",
        "warm_up_method": "NBD_CMD_CACHE over the working set, sequential cutoff off",
    });
    let cfgs = p1_cfgs(d, &mem_uri, mem_pid, &cache_file, cache_file_bytes);
    Ok((cfgs, mem_pid))
}

/// Warms P1's caches 1 and 2: NBD_CMD_CACHE over the working set, cutoff off; their
/// occupancy after (JSON). Fails if one holds less than the working set.
fn p1_warm(d: &Daemon, ws: u64) -> Result<Vec<Value>, String> {
    let mut occupancy = Vec::new();
    for (id, export) in [(1u16, "p1-ram"), (2, "p1-file")] {
        d.cutoff_never(id)?;
        warm_own(&d.uri(export), ws)?;
        let s = d.stats(id)?;
        let occ = s["usage"]["occupancy_lines"].as_u64().unwrap_or(0);
        let line = s["line_size"].as_u64().unwrap_or(4096).max(1);
        if occ * line < ws {
            return Err(format!(
                "cache {id} holds {} MiB after the warm-up, less than the {} MiB working set",
                (occ * line) >> 20,
                ws >> 20
            ));
        }
        occupancy.push(
            json!({"cache_id": id, "export": export, "occupancy_lines": occ,
            "lines": s["usage"]["lines"], "device": s["device"]}),
        );
    }
    Ok(occupancy)
}

/// P1's configurations: tiercache ram:, file and pass-through, nbdkit memory, and fio on the
/// cache file itself (the device).
fn p1_cfgs(
    d: &Daemon,
    mem_uri: &str,
    mem_pid: u32,
    cache_file: &Path,
    cache_file_bytes: u64,
) -> [Cfg; 5] {
    [
        Cfg {
            name: "tiercache-ram".into(),
            target: d.uri("p1-ram"),
            file: None,
            server: vec![d.pid],
            tc_cache: Some(1),
            nbdkit_log: None,
        },
        Cfg {
            name: "tiercache-file".into(),
            target: d.uri("p1-file"),
            file: None,
            server: vec![d.pid],
            tc_cache: Some(2),
            nbdkit_log: None,
        },
        Cfg {
            name: "tiercache-pt-file".into(),
            target: d.uri("p1-pt"),
            file: None,
            server: vec![d.pid],
            tc_cache: None,
            nbdkit_log: None,
        },
        Cfg {
            name: "nbdkit-memory".into(),
            target: mem_uri.to_string(),
            file: None,
            server: vec![mem_pid],
            tc_cache: None,
            nbdkit_log: None,
        },
        Cfg {
            name: "fio-io_uring-device".into(),
            target: String::new(),
            file: Some((cache_file.to_path_buf(), cache_file_bytes)),
            server: Vec::new(),
            tc_cache: None,
            nbdkit_log: None,
        },
    ]
}

/// A 4K random-read job of P1 or the connection sweep on `c` with `jobs` connections.
fn p1_job(plan: &Plan, c: &Cfg, jobs: u32) -> Job {
    let ws = plan.ws;
    Job {
        target: match &c.file {
            Some((p, s)) => Target::File(p.clone(), *s),
            None => Target::Nbd(c.target.clone()),
        },
        rw: "randread",
        mix: None,
        zipf: None,
        size: ws,
        qd: plan.qd,
        jobs,
        runtime_ms: plan.runtime_ms,
        ramp_ms: plan.ramp_ms,
    }
}

/// P1's alternating rounds.
fn p1_rounds(cx: &Ctx, cfgs: &[Cfg; 5], off: &mut u64, rep: &mut Report) -> Result<(), String> {
    let plan = cx.plan;
    let n = cfgs.len() as u32 * plan.rounds;
    let job = |c: &Cfg| p1_job(plan, c, 1);
    let check = |c: &Cfg, round: u32, r: &Run| {
        if let Some(h) = r.read_hit_ratio
            && h < 0.99
        {
            eprintln!(
                "warning: {} read hit ratio {:.2}% in round {round}: not a 100%-hit run",
                c.name,
                h * 100.0
            );
        }
    };
    alternate(cx, "P1", cfgs, job, (&mut 0, n), off, rep, check)
}

/// Alternating rounds of `cfgs` as part `part` (who goes first rotates each round), until
/// Ctrl-C: each run's label counts on from `k` of `n`, and `check` sees it before it is kept.
#[allow(clippy::too_many_arguments)]
fn alternate(
    cx: &Ctx,
    part: &'static str,
    cfgs: &[Cfg],
    job: impl Fn(&Cfg) -> Job,
    (k, n): (&mut u32, u32),
    off: &mut u64,
    rep: &mut Report,
    check: impl Fn(&Cfg, u32, &Run),
) -> Result<(), String> {
    'rounds: for round in 1..=cx.plan.rounds {
        for i in 0..cfgs.len() {
            // Alternate, and rotate who goes first each round.
            let c = &cfgs[(i + round as usize - 1) % cfgs.len()];
            if STOP.load(Ordering::Relaxed) {
                break 'rounds;
            }
            *k += 1;
            let label = format!("[{k}/{n}] {part} {}", c.name);
            let st = Step {
                part,
                phase: "measure",
                round,
                conns: 1,
            };
            let r = one(cx, c, st, job(c), &label, off)?;
            check(c, round, &r);
            rep.runs.push(r);
        }
    }
    Ok(())
}

/// The connection sweep: tiercache ram: and nbdkit memory with 1 to `max_conns`
/// connections.
fn conn_rounds(cx: &Ctx, cfgs: &[Cfg; 5], off: &mut u64, rep: &mut Report) -> Result<(), String> {
    let plan = cx.plan;
    let by_name = |n: &str| cfgs.iter().find(|c| c.name == n).expect("a P1 config");
    let pair = [by_name("tiercache-ram"), by_name("nbdkit-memory")];
    let n = 2 * plan.max_conns * plan.conn_rounds;
    let mut k = 0;
    'conns: for round in 1..=plan.conn_rounds {
        for conns in 1..=plan.max_conns {
            for i in 0..2 {
                let c = pair[(i + conns as usize + round as usize) % 2];
                if STOP.load(Ordering::Relaxed) {
                    break 'conns;
                }
                k += 1;
                let label = format!("[{k}/{n}] {conns} conn {}", c.name);
                let st = Step {
                    part: "conns",
                    phase: "measure",
                    round,
                    conns,
                };
                let r = one(cx, c, st, p1_job(plan, c, conns), &label, off)?;
                rep.runs.push(r);
            }
        }
    }
    Ok(())
}

/// P2: tiercache against nbdkit's cache filter over delayed cores.
fn p2(
    cx: &Ctx,
    scratch: &Path,
    procs: &mut Procs,
    rep: &mut Report,
    setup: &mut Value,
) -> Result<(), String> {
    let d = cx.d;
    let (cfgs, nc_pid) = p2_setup(cx, scratch, procs, setup)?;
    if !p2_rounds(cx, &cfgs, rep)? {
        return Ok(());
    }
    setup["p2"]["nbdkit_cache_file_allocated_bytes_after"] = json!(deleted_file_bytes(nc_pid));
    if let Ok(s3) = d.stats(3) {
        setup["p2"]["tiercache_after"] = json!({"usage": s3["usage"], "policies": s3["policies"],
            "writeback": s3["writeback"]});
    }
    procs.stop(nc_pid, Duration::from_secs(3));
    Ok(())
}

/// P2's servers: tiercache's wb cache 3 over a delayed `nbdkit memory` core, and nbdkit's
/// cache filter over the same kind of core. Its configurations, and the pid of nbdkit's.
fn p2_setup(
    cx: &Ctx,
    scratch: &Path,
    procs: &mut Procs,
    setup: &mut Value,
) -> Result<([Cfg; 2], u32), String> {
    let (plan, d) = (cx.plan, cx.d);
    let nbdkit = Path::new(NBDKIT);
    let s = plan.s2;
    let ws = 2 * s;
    let delay = [
        "--filter=delay".to_string(),
        "memory".into(),
        format!("{ws}"),
        format!("rdelay={}", plan.delay),
        format!("wdelay={}", plan.delay),
    ];
    // (a) tiercache's core: the delayed memory disk on its own socket.
    let core_sock = scratch.join("p2-core.sock");
    let mut core_args = vec![
        "-f".to_string(),
        "--exit-with-parent".into(),
        "-U".into(),
        core_sock.display().to_string(),
    ];
    core_args.extend(delay.iter().cloned());
    let core_pid = procs.spawn(
        "nbdkit delay core",
        Some(plan.server_cpu),
        nbdkit,
        &core_args,
        &[],
        scratch.join("p2-core.log"),
    )?;
    procs.wait_socket(core_pid, &core_sock)?;
    let cache_file = scratch.join("p2-cache.img");
    fill_file(&cache_file, s, None)?;
    let c3 = d.start_cache(3, &cache_file.display().to_string(), "wb")?;
    let core_dev = format!("nbd:nbd+unix:///?socket={}", core_sock.display());
    d.add_core(3, &core_dev, "p2")?;
    let direct = opened_direct(d.pid, &cache_file);
    // (b) nbdkit's cache filter over the same kind of core, in one process; a log filter under
    // the cache sees what reaches the core.
    let nc_sock = scratch.join("p2-nbdkit-cache.sock");
    let nc_log = scratch.join("p2-nbdkit-cache-core.log");
    let nc_tmp = scratch.join("nbdkit-tmp");
    std::fs::create_dir_all(&nc_tmp).map_err(|e| format!("{}: {e}", nc_tmp.display()))?;
    let mut nc_args = vec![
        "-f".to_string(),
        "--exit-with-parent".into(),
        "-U".into(),
        nc_sock.display().to_string(),
        "--filter=cache".into(),
        "--filter=log".into(),
    ];
    nc_args.extend(delay.iter().cloned());
    nc_args.extend([
        "cache=writeback".to_string(),
        "cache-min-block-size=4K".into(),
        "cache-on-read=true".into(),
        format!("cache-max-size={s}"),
        format!("logfile={}", nc_log.display()),
    ]);
    let nc_pid = procs.spawn(
        "nbdkit cache",
        Some(plan.server_cpu),
        nbdkit,
        &nc_args,
        &[("TMPDIR", nc_tmp.as_path())],
        scratch.join("p2-nbdkit-cache.log"),
    )?;
    procs.wait_socket(nc_pid, &nc_sock)?;
    println!(
        "P2 setup: S = {} MiB, working set {} MiB, cores nbdkit --filter=delay memory (rdelay=wdelay={}); tiercache wb, file cache of S (O_DIRECT: {}), core {core_dev}; nbdkit --filter=cache --filter=log --filter=delay (writeback, 4K blocks, cache-on-read, cache-max-size={s})",
        s >> 20,
        ws >> 20,
        plan.delay,
        direct
            .map(|b| if b { "yes" } else { "NO" })
            .unwrap_or("unknown"),
    );
    setup["p2"] = json!({
        "cache_bytes": s, "working_set_bytes": ws, "tiercache_cache": c3,
        "tiercache_core": core_dev, "tiercache_cache_o_direct": direct,
        "tiercache_core_server": format!("nbdkit -U SOCK {}", delay.join(" ")),
        "nbdkit_cache_server": format!("nbdkit -U SOCK {}", nc_args[4..].join(" ")),
        "workload": "fio randrw 70/30, 4K, random_distribution=zipf:0.9, QD per plan, no ramp",
        "server_cpu_note": "tiercache's server CPU includes its nbdkit core process; nbdkit's includes its in-process delay and memory layers",
    });
    let cfgs = [
        Cfg {
            name: "tiercache".into(),
            target: d.uri("p2"),
            file: None,
            server: vec![d.pid, core_pid],
            tc_cache: Some(3),
            nbdkit_log: None,
        },
        Cfg {
            name: "nbdkit-cache".into(),
            target: format!("nbd+unix:///?socket={}", nc_sock.display()),
            file: None,
            server: vec![nc_pid],
            tc_cache: None,
            nbdkit_log: Some(nc_log.clone()),
        },
    ];
    Ok((cfgs, nc_pid))
}

/// P2's 70/30 Zipf job on `c`, `ms` long.
fn p2_job(plan: &Plan, c: &Cfg, ms: u64) -> Job {
    let ws = 2 * plan.s2;
    Job {
        target: Target::Nbd(c.target.clone()),
        rw: "randrw",
        mix: Some(70),
        zipf: Some(0.9),
        size: ws,
        qd: plan.qd,
        jobs: 1,
        runtime_ms: ms,
        ramp_ms: 0,
    }
}

/// P2's warm-up run of each configuration, then the alternating rounds; false when Ctrl-C
/// came during the warm-up.
fn p2_rounds(cx: &Ctx, cfgs: &[Cfg; 2], rep: &mut Report) -> Result<bool, String> {
    let plan = cx.plan;
    let mut off = 0;
    let n = 2 * (plan.rounds + 1);
    let mut k = 0;
    for c in cfgs {
        if STOP.load(Ordering::Relaxed) {
            return Ok(false);
        }
        k += 1;
        let label = format!("[{k}/{n}] P2 warm {}", c.name);
        let st = Step {
            part: "P2",
            phase: "warm-up",
            round: 0,
            conns: 1,
        };
        let r = one(cx, c, st, p2_job(plan, c, plan.warm2_ms), &label, &mut off)?;
        rep.runs.push(r);
    }
    let job = |c: &Cfg| p2_job(plan, c, plan.runtime_ms);
    alternate(
        cx,
        "P2",
        cfgs,
        job,
        (&mut k, n),
        &mut off,
        rep,
        |_, _, _| {},
    )?;
    Ok(true)
}
