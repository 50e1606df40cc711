//! fio: the workload of a run, fio's command line and its JSON parsed into the numbers the
//! reports print; the same runs with tiercache's own load generator (`--load-generator own`).

use super::procs::{STOP, own_group_dying_with_us, stopped_by};
use crate::bench_ceph::FioTarget;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One workload of the matrix.
pub(crate) struct Workload {
    pub(crate) name: &'static str,
    pub(crate) rw: &'static str,
    pub(crate) bs: &'static str,
    pub(crate) mix: Option<u32>,
    pub(crate) random: bool,
}

pub(crate) fn fio_version() -> Option<String> {
    let o = Command::new("fio").arg("--version").output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// How the error of a run whose IO never completed begins.
pub(crate) const STUCK: &str = "IO does not complete";

pub(crate) const PERCENTILES: &str = "1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.95:99.99";

/// What [`fio_json`] wants of a fio command: JSON on stdout with the percentiles the reports
/// read ([`PERCENTILES`]), stdout and stderr piped.
pub(crate) fn json_with_percentiles(cmd: &mut Command) -> &mut Command {
    cmd.arg(format!("--percentile_list={PERCENTILES}"))
        .arg("--output-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
}

/// Runs fio against `uri`; returns its JSON.
pub(crate) fn run_fio(
    target: &FioTarget,
    w: &Workload,
    region: u64,
    qd: u32,
    runtime: u64,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Value, String> {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={}", w.name));
    target.apply(&mut cmd);
    cmd.arg(format!("--rw={}", w.rw))
        .arg(format!("--bs={}", w.bs))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--size={region}"))
        .arg("--time_based")
        .arg(format!("--runtime={runtime}"))
        .arg("--ramp_time=1")
        .arg("--randrepeat=0")
        .arg("--norandommap");
    json_with_percentiles(&mut cmd);
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
    // fio dies with this process, even on SIGKILL; Ctrl-C and SIGTERM reach it through
    // `STOP` below, so it still reports what it measured.
    own_group_dying_with_us(&mut cmd);
    let child = cmd.spawn().map_err(|e| format!("cannot run fio: {e}"))?;
    let t0 = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let stuck = AtomicBool::new(false);
    let pid = child.id() as i32;
    let d2 = done.clone();
    // A run that has not ended this long after its time has IO that never completes.
    let grace = total + 60.0;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut interrupted: Option<Instant> = None;
            while !d2.load(Ordering::Relaxed) {
                progress((t0.elapsed().as_secs_f64() / total).min(1.0));
                let overdue = t0.elapsed().as_secs_f64() > total + grace;
                if overdue {
                    stuck.store(true, Ordering::Relaxed);
                }
                if STOP.load(Ordering::Relaxed) || overdue {
                    // Ctrl-C (or overdue): fio stops and reports; if its IO hangs it cannot,
                    // and is killed 10 s later.
                    let sig = match interrupted {
                        None => {
                            interrupted = Some(Instant::now());
                            libc::SIGINT
                        }
                        Some(t) if t.elapsed() > Duration::from_secs(10) => libc::SIGKILL,
                        Some(_) => 0,
                    };
                    if sig != 0 {
                        // SAFETY: signalling our own child process by its pid.
                        unsafe { libc::kill(pid, sig) };
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        let out = child.wait_with_output();
        done.store(true, Ordering::Relaxed);
        if stuck.load(Ordering::Relaxed) {
            return Err(format!(
                "{STUCK}: the run had not ended {grace:.0} s after its {total:.0} s (on Ceph, `ceph -s` tells why, e.g. a full OSD)"
            ));
        }
        let out = out.map_err(|e| format!("fio: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // fio may print notes before the JSON.
        let start = text.find('{').ok_or_else(|| {
            if STOP.load(Ordering::Relaxed) {
                return format!("stopped by {}", stopped_by());
            }
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

/// Runs one workload with tiercache's own load generator.
pub(crate) fn run_own(
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

/// A sequential pass over `size` bytes, at most `max_secs` (stopped early, like every fio
/// run, by Ctrl-C or SIGTERM).
pub(crate) fn run_fio_size(
    target: &FioTarget,
    w: &Workload,
    size: u64,
    max_secs: u64,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<Value, String> {
    let mut cmd = Command::new("fio");
    cmd.arg(format!("--name={}", w.name));
    target.apply(&mut cmd);
    cmd.arg(format!("--rw={}", w.rw))
        .arg(format!("--bs={}", w.bs))
        .arg("--iodepth=4")
        .arg(format!("--size={size}"))
        .arg(format!("--runtime={max_secs}"))
        .arg("--output-format=json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    fio_json(cmd, max_secs as f64, progress)
}
