//! `tiercache bench`: the Ceph caching studies' workload matrix, baseline vs cached, over NBD
//! (SPEC C15, issue 6).
//!
//! Everything runs in this process except the load generator: a cache file and two emulated
//! HDD cores (`emu:PRESET:FILE`, one per configuration so the baseline never sees cached
//! writes) in a scratch directory, the daemon's registry holding the cache, and an NBD server
//! on a unix socket exporting `baseline` (the bare emulated core) and `cached` (the other
//! core through the cache). fio's `nbd` engine drives each workload. The cached export is
//! warmed first with a sequential read pass over the random working set (sequential cutoff
//! off, then back to its default). Hit ratio and dirty % come from the server's own counters,
//! reset before each cached run; during cached runs a sampler records IOPS and dirty % per
//! second. Results: a table on stdout, and in `--out`: `results.json`, `report.md`,
//! `report.html` (self-contained, with plots) and the plots as `.svg`.

use crate::svg;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_core::units::CoreId;
use tiercache_daemon::registry::{NewCache, Registry, set_param};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server};

/// Arguments of `tiercache bench` (the matrix).
#[derive(clap::Args, Default)]
pub struct Args {
    /// The embedded default: file cache, emulated 10k RPM HDD cores, short runs (~2 minutes).
    #[arg(long)]
    pub quick: bool,
    /// Directory for the report (results.json, report.md, report.html, plots).
    #[arg(long, default_value = "tiercache-bench")]
    pub out: PathBuf,
    /// Seconds per run (default 8 with --quick, 30 otherwise).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Queue depth.
    #[arg(long, default_value_t = 16)]
    pub iodepth: u32,
    /// Cache mode of the cached configuration.
    #[arg(long, default_value = "wb")]
    pub mode: String,
    /// Emulated core device preset (see `tiercache sim` presets).
    #[arg(long, default_value = "hdd-10k-sas")]
    pub core_preset: String,
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
    #[arg(long, default_value = "auto")]
    pub load_generator: String,
    /// SPEC's full procedures: the dirty-full run (P5) for 5 minutes per queue depth.
    #[arg(long)]
    pub full: bool,
    /// Skip the SPEC P4/P5 procedures after the matrix (they are skipped with --only too).
    #[arg(long)]
    pub no_studies: bool,
    /// Peers measured beside tiercache, each over its own copy of the same emulated core:
    /// `auto` (nbdkit's cache filter when nbdkit is installed), `none`, or `nbdkit-cache`.
    #[arg(long, default_value = "auto")]
    pub peers: String,
    /// Sequential cutoff policy of the cached configuration during the runs and beside the
    /// P4 reader: always, full or never (the warm-up runs with it off).
    #[arg(long, default_value = "always")]
    pub seq_cutoff: String,
}

/// The peer: nbdkit's cache filter (writeback, 4K blocks, cache-on-read, as big as our cache)
/// over the nbd plugin, connected to a bare emulated core exported by the bench's server.
const NBDKIT_CACHE: &str = "nbdkit-cache";

/// One workload of the matrix.
struct Workload {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
    mix: Option<u32>,
    random: bool,
}

const MATRIX: [Workload; 5] = [
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

/// Set by Ctrl-C (SIGINT): runs stop early and the report holds what was measured.
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub(crate) fn install_sigint() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

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

pub(crate) fn fio_version() -> Option<String> {
    let o = Command::new("fio").arg("--version").output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

pub(crate) const PERCENTILES: &str = "1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.95:99.99";

/// Runs fio against `uri`; returns its JSON.
fn run_fio(
    uri: &str,
    w: &Workload,
    region: u64,
    qd: u32,
    runtime: u64,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Value, String> {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={}", w.name))
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={}", w.rw))
        .arg(format!("--bs={}", w.bs))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--size={region}"))
        .arg("--time_based")
        .arg(format!("--runtime={runtime}"))
        .arg("--ramp_time=1")
        .arg("--randrepeat=0")
        .arg("--norandommap")
        .arg(format!("--percentile_list={PERCENTILES}"))
        .arg("--output-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(m) = w.mix {
        cmd.arg(format!("--rwmixread={m}"));
    }
    fio_json(cmd, runtime as f64 + 1.0, progress)
}

/// Runs a prepared fio command (`--output-format=json`, stdout and stderr piped), showing
/// progress over `total` seconds and passing Ctrl-C on; returns fio's JSON.
pub(crate) fn fio_json(
    mut cmd: Command,
    total: f64,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Value, String> {
    let child = cmd.spawn().map_err(|e| format!("cannot run fio: {e}"))?;
    let t0 = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let pid = child.id() as i32;
    let d2 = done.clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !d2.load(Ordering::Relaxed) {
                progress((t0.elapsed().as_secs_f64() / total).min(1.0));
                if STOP.load(Ordering::Relaxed) {
                    // SAFETY: signalling our own child process by its pid.
                    unsafe { libc::kill(pid, libc::SIGINT) };
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let out = child.wait_with_output();
        done.store(true, Ordering::Relaxed);
        let out = out.map_err(|e| format!("fio: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // fio may print notes before the JSON.
        let start = text.find('{').ok_or_else(|| {
            format!(
                "fio gave no results: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            )
        })?;
        serde_json::from_str(&text[start..]).map_err(|e| format!("fio's JSON: {e}"))
    })
}

/// IOPS, MB/s, mean, p99 and p99.9 latency (µs), and the latency CDF of one fio job.
pub(crate) type FioNumbers = (f64, f64, f64, f64, f64, Vec<(f64, f64)>);

/// Numbers of one fio job (reads and writes together).
pub(crate) fn parse_fio(v: &Value) -> Result<FioNumbers, String> {
    let job = v["jobs"].get(0).ok_or("fio reported no job")?;
    let mut iops = 0.0;
    let mut bw = 0.0;
    let mut lat_sum = 0.0;
    let mut ios = 0.0;
    let mut p99 = 0.0f64;
    let mut p999 = 0.0f64;
    let mut cdf: Vec<(f64, f64)> = Vec::new();
    for dir in ["read", "write"] {
        let d = &job[dir];
        let n = d["total_ios"].as_f64().unwrap_or(0.0);
        if n <= 0.0 {
            continue;
        }
        iops += d["iops"].as_f64().unwrap_or(0.0);
        bw += d["bw_bytes"].as_f64().unwrap_or(0.0);
        lat_sum += d["clat_ns"]["mean"].as_f64().unwrap_or(0.0) * n;
        ios += n;
        let pct = &d["clat_ns"]["percentile"];
        p99 = p99.max(pct["99.000000"].as_f64().unwrap_or(0.0));
        p999 = p999.max(pct["99.900000"].as_f64().unwrap_or(0.0));
        if let Some(m) = pct.as_object() {
            let mut pts: Vec<(f64, f64)> = m
                .iter()
                .filter_map(|(k, x)| Some((k.parse::<f64>().ok()?, x.as_f64()? / 1000.0)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            // The slower direction's curve (mixed runs): take the pointwise maximum.
            if cdf.is_empty() {
                cdf = pts;
            } else {
                for (c, p) in cdf.iter_mut().zip(pts) {
                    c.1 = c.1.max(p.1);
                }
            }
        }
    }
    let mean = if ios > 0.0 {
        lat_sum / ios / 1000.0
    } else {
        0.0
    };
    Ok((iops, bw / 1e6, mean, p99 / 1000.0, p999 / 1000.0, cdf))
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Server counters for the cached configuration: (requests, hits, dirty %).
fn counters(reg: &Registry) -> (u64, u64, f64) {
    match tiercache_daemon::stats::cache_stats(reg, 1, None, None) {
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

pub(crate) struct Bar {
    pub(crate) tty: bool,
}

impl Bar {
    pub(crate) fn show(&self, label: &str, frac: f64) {
        if !self.tty {
            return;
        }
        let w = 30;
        let n = (frac * w as f64) as usize;
        let mut e = std::io::stderr();
        let _ = write!(
            e,
            "\r  {label:<28} [{}{}] {:3.0}%",
            "#".repeat(n),
            ".".repeat(w - n.min(w)),
            frac * 100.0
        );
        let _ = e.flush();
    }

    pub(crate) fn end(&self) {
        if self.tty {
            eprint!("\r{:70}\r", "");
        }
    }
}

pub(crate) fn git_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

pub(crate) fn host() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|x| x.trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu": cpu,
    })
}

/// Runs the matrix.
pub fn run(a: Args) -> Result<(), String> {
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
    tiercache_io::parse_emu(&format!("emu:{}:/x", a.core_preset))?;
    if !["always", "full", "never"].contains(&a.seq_cutoff.as_str()) {
        return Err(format!(
            "--seq-cutoff {}: want always, full or never",
            a.seq_cutoff
        ));
    }
    let nbdkit = crate::bench_peers::tool_version("nbdkit");
    let peers: Vec<&str> = match a.peers.as_str() {
        "auto" if nbdkit.is_some() => vec![NBDKIT_CACHE],
        "auto" => {
            println!(
                "peers: nbdkit is not installed (apt-get install nbdkit): no nbdkit-cache runs"
            );
            vec![]
        }
        "none" => vec![],
        NBDKIT_CACHE if nbdkit.is_some() => vec![NBDKIT_CACHE],
        NBDKIT_CACHE => {
            return Err(
                "--peers nbdkit-cache: nbdkit is not installed (apt-get install nbdkit)".into(),
            );
        }
        p => return Err(format!("--peers {p}: want auto, none or nbdkit-cache")),
    };
    std::fs::create_dir_all(&a.out).map_err(|e| format!("--out {}: {e}", a.out.display()))?;
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
    let _ = std::fs::remove_dir_all(&scratch);
    res
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
    let core_bytes = (ws * 8).max(4 << 30);
    let seq_region = (cache_bytes * 2).min(core_bytes);
    let file = |n: &str, b: u64| -> Result<String, String> {
        let p = scratch.join(n);
        let f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        f.set_len(b).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p.display().to_string())
    };
    let cache = file("cache.img", cache_bytes)?;
    let base_core = file("core-baseline.img", core_bytes)?;
    let cached_core = file("core-cached.img", core_bytes)?;
    let reg = Arc::new(Registry::new());
    reg.start_cache(NewCache {
        device: &cache,
        id: Some(1),
        mode: Some(&a.mode),
        line_size: None,
        load: false,
        force: false,
    })?;
    let core_dev = format!("emu:{}:{cached_core}", a.core_preset);
    reg.add_core(1, &core_dev, Some(0), Some("cached"))?;
    let engine = reg.engine(1)?;
    let exports = Arc::new(ExportMap::new());
    let bare = tiercache_io::open_emu(&format!("emu:{}:{base_core}", a.core_preset))?;
    exports.insert(
        "baseline",
        "the bare emulated core",
        Arc::new(BackendExport::new(Arc::new(bare))),
    );
    exports.insert(
        "cached",
        "the emulated core through the cache",
        Arc::new(EngineExport::new(engine.clone(), CoreId(0))),
    );
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
    let mut procs = crate::bench_peers::Procs::default();
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
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    println!(
        "tiercache bench{}: {} workloads x (baseline, cached {}, seq-cutoff {}{}), QD {}, {} s each; core {} (emulated), cache {} file ({}); {}",
        if a.quick { " --quick" } else { "" },
        selected.len(),
        a.mode,
        a.seq_cutoff,
        peers.iter().map(|p| format!(", {p}")).collect::<String>(),
        a.iodepth,
        runtime,
        a.core_preset,
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
    set_param(
        &reg,
        1,
        None,
        "seq-cutoff",
        &[("policy".into(), "never".into())],
    )?;
    let warm = Workload {
        name: "warm-up",
        rw: "read",
        bs: "1m",
        mix: None,
        random: false,
    };
    let warm_secs = 600;
    let mut cmd_ok = true;
    // The peers are warmed the same way (nbdkit's cache filter caches what it reads).
    for config in std::iter::once("cached").chain(peers.iter().copied()) {
        let label = format!("warm-up {config}");
        let v = if fio.is_empty() {
            warm_own(&uri(config), ws).map(|_| Value::Null)
        } else {
            run_fio_size(&uri(config), &warm, ws, warm_secs, &|f| bar.show(&label, f))
        };
        bar.end();
        if let Err(e) = v {
            cmd_ok = false;
            eprintln!("{label} failed: {e}");
        }
    }
    set_param(
        &reg,
        1,
        None,
        "seq-cutoff",
        &[("policy".into(), a.seq_cutoff.clone())],
    )?;
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
    let total = selected.len() * configs.len();
    let mut k = 0;
    'outer: for w in selected {
        for &config in &configs {
            if STOP.load(Ordering::Relaxed) {
                break 'outer;
            }
            k += 1;
            let label = format!("[{k}/{total}] {} {config}", w.name);
            let region = if w.random { ws } else { seq_region };
            let cached = config == "cached";
            let before = if cached {
                reg.reset_counters(1)?;
                Some(counters(&reg))
            } else {
                None
            };
            let series = Arc::new(Mutex::new(Vec::new()));
            let sampling = Arc::new(AtomicBool::new(cached));
            let sampler = {
                let reg = reg.clone();
                let series = series.clone();
                let sampling = sampling.clone();
                std::thread::spawn(move || {
                    let t0 = Instant::now();
                    let mut last = counters(&reg).0;
                    let mut next = 1.0;
                    while sampling.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                        let el = t0.elapsed().as_secs_f64();
                        if el >= next {
                            let (n, _, d) = counters(&reg);
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
                run_fio(&uri(config), w, region, a.iodepth, runtime, &|f| {
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
                Err(e) => return Err(format!("{label}: {e}")),
            };
            let (iops, bw, mean, p99, p999, cdf) = v;
            let (hit_ratio, dirty) = match before {
                Some(_) => {
                    let (n, h, d) = counters(&reg);
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
                r.hit_ratio
                    .map(|h| format!(
                        "  hits {:.1}%  dirty {:.1}%",
                        h * 100.0,
                        r.dirty_pct.unwrap_or(0.0)
                    ))
                    .unwrap_or_default()
            );
            results.push(r);
        }
    }
    procs.stop_all();
    server.shutdown();
    drop(engine);
    let _ = reg.stop_cache(1, true, |_, _| {});
    let table = table(&results);
    println!("\n{table}");
    let mut targets = p3_summary(&results);
    if let Some(t) = &targets.1 {
        print!("{t}");
    }
    if a.only.is_none() && !a.no_studies && !STOP.load(Ordering::Relaxed) {
        let plan = crate::bench_studies::Plan::new(
            a.quick,
            a.full,
            a.iodepth,
            &a.core_preset,
            &a.seq_cutoff,
        );
        let show = |l: &str, f: f64| bar.show(l, f);
        let end = || bar.end();
        let ui = crate::bench_studies::Ui {
            show: &show,
            end: &end,
            stop: &STOP,
        };
        match crate::bench_studies::run(&plan, scratch, &ui) {
            Ok((v, t)) => {
                targets.0["p4_p5"] = v;
                targets.1 = Some(targets.1.unwrap_or_default() + &t);
            }
            Err(e) => {
                eprintln!("the SPEC P4/P5 procedures failed: {e}");
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
    write_report(
        &generator, a, runtime, &results, &table, &targets, stopped, peers,
    )?;
    println!("report: {}", a.out.join("report.html").display());
    if stopped {
        println!("(stopped by Ctrl-C: the report holds what was measured)");
    }
    Ok(())
}

/// Runs one workload with tiercache's own load generator.
fn run_own(
    uri: &str,
    w: &Workload,
    region: u64,
    qd: u32,
    runtime: u64,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<FioNumbers, String> {
    use tiercache_loadgen::{JobSpec, Target, run_with};
    let target = Target::parse(uri).map_err(|e| e.to_string())?;
    let mut spec = JobSpec {
        block_size: tiercache_daemon::device::parse_size(w.bs)? as u32,
        queue_depth: qd,
        size: Some(region),
        duration: Some(Duration::from_secs(runtime)),
        ramp: Duration::from_secs(1),
        seed: 42,
        ..JobSpec::default()
    };
    spec.set_rw(w.rw, w.mix.unwrap_or(50) as u8)
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let total = runtime as f64 + 1.0;
    let watcher = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if STOP.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let r = run_with(&target, &spec, &stop, &mut |p| {
        progress((p.elapsed.as_secs_f64() / total).min(1.0))
    });
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let r = r.map_err(|e| e.to_string())?;
    if r.errors > 0 {
        return Err(format!(
            "{} IO errors: {}",
            r.errors,
            r.error_messages.first().cloned().unwrap_or_default()
        ));
    }
    let cdf = r
        .lat_cdf
        .iter()
        .map(|c| (c.fraction * 100.0, c.lat_us))
        .collect();
    Ok((
        r.iops,
        r.bw_mbps,
        r.lat.mean_us,
        r.lat.p99_us,
        r.lat.p999_us,
        cdf,
    ))
}

/// The warm-up pass with tiercache's own client: NBD_CMD_CACHE over the working set, 1 MiB at
/// a time (the server reads each range through the cache, which promotes it).
pub(crate) fn warm_own(uri: &str, size: u64) -> Result<(), String> {
    use tiercache_loadgen::{Connection, Target};
    let target = Target::parse(uri).map_err(|e| e.to_string())?;
    let mut c = Connection::connect(&target).map_err(|e| e.to_string())?;
    let mut off = 0;
    while off < size {
        let n = (size - off).min(1 << 20);
        c.cache(off, n as u32).map_err(|e| e.to_string())?;
        off += n;
    }
    c.close();
    Ok(())
}

/// A sequential pass over `size` bytes, at most `max_secs`.
fn run_fio_size(
    uri: &str,
    w: &Workload,
    size: u64,
    max_secs: u64,
    progress: &dyn Fn(f64),
) -> Result<Value, String> {
    let out = Command::new("fio")
        .arg(format!("--name={}", w.name))
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={}", w.rw))
        .arg(format!("--bs={}", w.bs))
        .arg("--iodepth=4")
        .arg(format!("--size={size}"))
        .arg(format!("--runtime={max_secs}"))
        .arg("--output-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    progress(0.0);
    let o = out.wait_with_output().map_err(|e| e.to_string())?;
    progress(1.0);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .next()
            .unwrap_or("fio failed")
            .to_string());
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let start = text.find('{').ok_or("fio gave no results")?;
    serde_json::from_str(&text[start..]).map_err(|e| e.to_string())
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

/// SPEC P3 and the matrix's half of P4 from the matrix's runs: (JSON, text).
fn p3_summary(results: &[RunResult]) -> (Value, Option<String>) {
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
                "P3 {name}: {x:.1}x the uncached IOPS (target >= {want}x), p99 {lat:.1}% of uncached (target <= 1%)\n"
            );
        }
    }
    for w in ["seqread-512k", "seqwrite-512k"] {
        if let (Some(b), Some(c)) = (get(w, "baseline"), get(w, "cached")) {
            let loss = (1.0 - c.bw_mbps / b.bw_mbps.max(1e-9)) * 100.0;
            v[format!("p4_{w}")] = json!({"bandwidth_loss_pct": loss, "target_pct": 2.0,
                "met": loss <= 2.0});
            t += &format!(
                "P4 {w} with the cutoff: {loss:.1}% bandwidth loss vs uncached (target <= 2%)\n"
            );
        }
    }
    (v, (!t.is_empty()).then(|| format!("\nSPEC targets\n{t}")))
}

#[allow(clippy::too_many_arguments)]
fn write_report(
    generator: &str,
    a: &Args,
    runtime: u64,
    results: &[RunResult],
    table: &str,
    targets: &(Value, Option<String>),
    stopped: bool,
    peers: &[&str],
) -> Result<(), String> {
    let w = |name: &str, body: &str| -> Result<(), String> {
        let p = a.out.join(name);
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
    let doc = json!({
        "tool": "tiercache bench",
        "version": env!("CARGO_PKG_VERSION"),
        "commit": git_commit(),
        "host": host(),
        "config": {
            "quick": a.quick, "runtime_s": runtime, "iodepth": a.iodepth, "mode": a.mode,
            "core": format!("emu:{}", a.core_preset), "cache_size": a.cache_size,
            "working_set": a.working_set, "load_generator": generator,
            "seq_cutoff": a.seq_cutoff, "peers": peers,
        },
        "stopped_early": stopped,
        "runs": runs,
        "spec_targets": targets.0,
    });
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
        "# tiercache bench\n\ncommit {}, {} s per run, QD {}, cache mode {} (sequential cutoff {}), core emu:{} (emulated), cache {} file, working set {}.{}\n\n```\n{}```\n\nPlots: iops.svg, p99.svg, latency-cdf.svg{}; raw numbers: results.json.\n\nHit ratio and dirty % are the server's own counters, reset before each cached run. The baseline is the same emulated device model on its own file, served bare by the same NBD server.{}\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        a.seq_cutoff,
        a.core_preset,
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
        if peers.contains(&NBDKIT_CACHE) {
            " `nbdkit-cache` is nbdkit's cache filter (writeback, 4K blocks, cache-on-read, as big as tiercache's cache, its cache file in the scratch directory) over its own copy of the emulated core, reached through nbdkit's nbd plugin; warmed the same way; its hit ratio is not known."
        } else {
            ""
        }
    );
    let md = match &targets.1 {
        Some(t) => format!(
            "{md}\n## SPEC targets\n\n```\n{}```\n",
            t.trim_start_matches("\nSPEC targets\n")
        ),
        None => md,
    };
    w("report.md", &md)?;
    let html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tiercache bench</title>\n<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head><body>\n<h1>tiercache bench</h1>\n<p>commit {}, {} s per run, QD {}, cache mode {}, core emu:{} (emulated), cache {} file, working set {}.{}</p>\n<pre>{}</pre>\n{}\n{}\n{}\n{}\n<p>Raw numbers: results.json. Hit ratio and dirty % are the server's own counters.</p>\n</body></html>\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        a.core_preset,
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
