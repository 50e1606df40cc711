//! `tiercache bench wb-hits`: do cache hits keep their speed while writeback runs? With Ceph on
//! HDDs, cleaning runs all the time, so this is the operator's normal case.
//!
//! Method, for each NBD path (the io_uring reactor that plain sockets use, and the worker
//! threads that TLS connections use, `daemon --nbd-threaded`): a `wb` cache on a file over an
//! emulated 10k RPM HDD core (`emu:hdd-10k-sas`), cleaning `nop`. A clean range is written
//! and written back (so it is cached and clean); then `--dirty-lines` random 4 KiB lines are
//! written elsewhere (dirty). 4K random reads (QD 16) and 256K sequential reads (QD 4) of the
//! clean range — all hits — are measured idle, then again while a `writeback` of the dirty
//! lines runs (started a second before). Printed: IOPS, MB/s and p99 of both, and the ratios;
//! targets: during ≥ 0.8× idle, p99 ≤ 2× idle. The writeback must still be running when the
//! measurement ends, or the row says so. Nothing is asserted (a benchmark, not a test).

use super::kit::daemon::Daemon;
use super::kit::fio::{fio_json, fio_version, json_with_percentiles, parse_fio};
use super::kit::host::host;
use super::kit::procs::{Procs, install_stop_signals};
use super::kit::report::{Bar, git_commit};
use serde_json::{Value, json};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tiercache_daemon::admin::Request;

/// Arguments of `tiercache bench wb-hits`.
#[derive(clap::Args)]
pub struct Args {
    /// A smoke run: 10,000 dirty lines, 3 s per measurement (about a minute). Not a
    /// measurement.
    #[arg(long)]
    pub quick: bool,
    /// Dirty 4 KiB lines written back during the measurement (default 100,000; 10,000 with
    /// --quick).
    #[arg(long)]
    pub dirty_lines: Option<u64>,
    /// Seconds per measured run (default 10; 3 with --quick).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// NBD paths to measure: reactor, threaded or both.
    #[arg(long, default_value = "both", value_parser = crate::choices::words::<crate::choices::NbdPath>())]
    pub path: String,
    /// Scratch directory (default: a new one under the system's temporary directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One fio measurement: IOPS, MB/s, p99 (µs).
#[derive(Clone, Copy)]
struct Numbers {
    iops: f64,
    mbps: f64,
    p99_us: f64,
}

impl Numbers {
    fn json(&self) -> Value {
        json!({"iops": self.iops, "mb_s": self.mbps, "p99_us": self.p99_us})
    }
}

/// The two hit workloads: (name, fio rw, block size, queue depth).
const WORKLOADS: [(&str, &str, &str, u32); 2] = [
    ("4K random read", "randread", "4k", 16),
    ("256K sequential read", "read", "256k", 4),
];

/// Runs fio against `uri` (`size` bytes from `offset`).
#[allow(clippy::too_many_arguments)]
fn fio(
    uri: &str,
    rw: &str,
    bs: &str,
    qd: u32,
    offset: u64,
    size: u64,
    runtime: Option<u64>,
    number_ios: Option<u64>,
    bar: &Bar,
    label: &str,
) -> Result<Numbers, String> {
    let mut cmd = Command::new("fio");
    cmd.arg("--name=wbhits")
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--offset={offset}"))
        .arg(format!("--size={size}"));
    json_with_percentiles(&mut cmd);
    let total = match (runtime, number_ios) {
        (Some(t), _) => {
            cmd.arg("--time_based")
                .arg(format!("--runtime={t}"))
                .arg("--ramp_time=1");
            t as f64 + 1.0
        }
        (None, Some(n)) => {
            cmd.arg(format!("--number_ios={n}"));
            // A rough guess for the progress bar (about 5,000 writes/s here).
            (n as f64 / 5000.0).max(1.0)
        }
        // Once over `size` bytes.
        (None, None) => 10.0,
    };
    let v = fio_json(cmd, total, &|f| bar.show(label, f))?;
    bar.end();
    let (iops, mbps, _, p99_us, _, _) = parse_fio(&v)?;
    Ok(Numbers { iops, mbps, p99_us })
}

/// Dirty lines of cache 1 now.
fn dirty_lines(d: &Daemon) -> Result<u64, String> {
    let s = d.stats(1)?;
    s["usage"]["dirty_lines"]
        .as_u64()
        .ok_or_else(|| format!("stats has no usage.dirty_lines: {s}"))
}

/// Measures one NBD path; returns its JSON and prints its table.
fn one_path(
    threaded: bool,
    dirty: u64,
    runtime: u64,
    scratch: &Path,
    bar: &Bar,
) -> Result<Value, String> {
    let path = if threaded { "threaded" } else { "reactor" };
    let dir = scratch.join(path);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The clean range, then the dirty region (4x sparser than the lines written, so the
    // writes are random and distinct), all on one core; the cache holds both.
    let clean = if dirty >= 50_000 {
        256u64 << 20
    } else {
        64 << 20
    };
    let dirty_at = 1u64 << 30;
    let dirty_span = dirty * 16384;
    let cache_bytes = (clean + dirty * 4096) * 2 + (64 << 20);
    let core_bytes = dirty_at + dirty_span;
    let cache = dir.join("cache.img");
    let core = dir.join("core.img");
    for (p, n) in [(&cache, cache_bytes), (&core, core_bytes)] {
        std::fs::File::create(p)
            .and_then(|f| f.set_len(n))
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let mut procs = Procs::default();
    let extra: &[&str] = if threaded { &["--nbd-threaded"] } else { &[] };
    let d = Daemon::start(&mut procs, None, extra, &dir)?;
    let r = (|| {
        d.start_cache(1, &cache.display().to_string(), "wb")?;
        d.call(Request::SetParam {
            cache_id: 1,
            core_id: None,
            name: "cleaning".into(),
            values: vec![("policy".into(), "nop".into())],
        })?;
        d.add_core(1, &format!("emu:hdd-10k-sas:{}", core.display()), "vm")?;
        d.cutoff_never(1)?;
        let uri = d.uri("vm");
        fio(
            &uri,
            "write",
            "1m",
            4,
            0,
            clean,
            None,
            None,
            bar,
            "clean range",
        )?;
        d.call(Request::Writeback {
            cache_id: 1,
            core_id: None,
        })?;
        let n = Some(dirty);
        fio(
            &uri,
            "randwrite",
            "4k",
            16,
            dirty_at,
            dirty_span,
            None,
            n,
            bar,
            "dirty lines",
        )?;
        let dirty_before = dirty_lines(&d)?;
        // Both hit workloads once each (`during`: a label for the progress bar).
        let hits = |during: &str| -> Vec<Result<Numbers, String>> {
            WORKLOADS
                .iter()
                .map(|&(name, rw, bs, qd)| {
                    let label = format!("{name}{during}");
                    fio(&uri, rw, bs, qd, 0, clean, Some(runtime), None, bar, &label)
                })
                .collect()
        };
        let idle: Vec<Numbers> = hits("").into_iter().collect::<Result<_, _>>()?;
        // The writeback, on a thread of its own (the call returns when it is done).
        let (during, running_after, dirty_after) = std::thread::scope(|s| {
            let wb = s.spawn(|| {
                d.call(Request::Writeback {
                    cache_id: 1,
                    core_id: None,
                })
            });
            std::thread::sleep(Duration::from_secs(1));
            let during = hits(", writeback");
            let dirty_after = dirty_lines(&d);
            let running_after = !wb.is_finished();
            // The rest is not needed: cancelled, so that the scope's join of the writeback's
            // thread returns now (it waited for the whole writeback, minutes at 100k lines),
            // and the daemon is stopped without writeback below.
            let _ = d.call(Request::CancelWriteback { cache_id: 1 });
            (during, running_after, dirty_after)
        });
        let during: Vec<Numbers> = during.into_iter().collect::<Result<_, _>>()?;
        let dirty_after = dirty_after?;
        Ok::<_, String>((idle, during, running_after, dirty_before, dirty_after))
    })();
    d.stop(&mut procs, &[1]);
    let (idle, during, running_after, dirty_before, dirty_after) = r?;
    println!(
        "  NBD path: {path}{}",
        if threaded {
            " (worker threads, as TLS connections)"
        } else {
            " (io_uring reactor per connection)"
        }
    );
    println!(
        "    {:<22} {:>10} {:>10} {:>6}   {:>9} {:>9} {:>6}   {:>10} {:>10}",
        "hits", "idle", "during wb", "ratio", "p99 idle", "p99 wb", "ratio", "MB/s idle", "MB/s wb"
    );
    let mut rows = Vec::new();
    for (i, (name, ..)) in WORKLOADS.iter().enumerate() {
        let (a, b) = (idle[i], during[i]);
        let ratio = b.iops / a.iops.max(1e-9);
        let p99_ratio = b.p99_us / a.p99_us.max(1e-9);
        println!(
            "    {:<22} {:>10.0} {:>10.0} {:>5.2}x   {:>7.0}us {:>7.0}us {:>5.2}x   {:>10.1} {:>10.1}",
            name, a.iops, b.iops, ratio, a.p99_us, b.p99_us, p99_ratio, a.mbps, b.mbps
        );
        rows.push(
            json!({"workload": name, "idle": a.json(), "during_writeback": b.json(),
            "ratio": ratio, "p99_ratio": p99_ratio,
            "target_met": ratio >= 0.8 && p99_ratio <= 2.0 && running_after}),
        );
    }
    let cleaned = dirty_before.saturating_sub(dirty_after);
    println!(
        "    writeback: {cleaned} of {dirty_before} dirty lines written back during the hit runs; {}",
        if running_after {
            "still running at the end (valid)"
        } else {
            "it ENDED before the hit runs did: the last runs were not under writeback (use more --dirty-lines)"
        }
    );
    Ok(
        json!({"path": path, "rows": rows, "dirty_lines": dirty_before,
        "written_back_during": cleaned, "writeback_running_after": running_after}),
    )
}

/// Runs `tiercache bench wb-hits`.
pub fn run(a: Args) -> Result<(), String> {
    let paths: &[bool] = match a.path.as_str() {
        "both" => &[false, true],
        "reactor" => &[false],
        "threaded" => &[true],
        p => {
            return Err(format!(
                "unknown --path '{p}': use reactor, threaded or both"
            ));
        }
    };
    let dirty = a
        .dirty_lines
        .unwrap_or(if a.quick { 10_000 } else { 100_000 });
    let runtime = a.runtime.unwrap_or(if a.quick { 3 } else { 10 });
    if !(100..=10_000_000).contains(&dirty) {
        return Err(format!("--dirty-lines {dirty}: give 100 to 10000000"));
    }
    if !(1..=3600).contains(&runtime) {
        return Err(format!("--runtime {runtime}: give 1 to 3600 seconds"));
    }
    if fio_version().is_none() {
        return Err("fio is not installed (apt-get install fio)".into());
    }
    install_stop_signals();
    let (scratch, own) = match &a.scratch {
        Some(p) => (p.clone(), false),
        None => {
            let p = std::env::temp_dir().join(format!("tiercache-wbhits-{}", std::process::id()));
            (p, true)
        }
    };
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let bar = Bar {
        tty: std::io::stderr().is_terminal(),
    };
    println!(
        "tiercache bench wb-hits: hits on a clean range while {dirty} random dirty lines are written back to emu:hdd-10k-sas ({runtime} s runs{})",
        if a.quick {
            ", --quick: a smoke run"
        } else {
            ""
        }
    );
    let mut out = Vec::new();
    let mut err = None;
    for &threaded in paths {
        match one_path(threaded, dirty, runtime, &scratch, &bar) {
            Ok(v) => out.push(v),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    if own {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    if let Some(e) = err {
        return Err(e);
    }
    println!("  targets: hits during writeback >= 0.8x idle IOPS, p99 <= 2x idle");
    if let Some(p) = a.json {
        let j = json!({"dirty_lines": dirty, "runtime_s": runtime, "quick": a.quick,
            "commit": git_commit(), "host": host(), "paths": out});
        std::fs::write(&p, serde_json::to_string_pretty(&j).expect("json") + "\n")
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}
