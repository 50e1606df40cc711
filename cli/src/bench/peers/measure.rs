//! One fio run of `bench peers`: its job, fio's command line (pinned to the client CPU), the
//! servers' CPU per IO over a window inside the measured part, and the line it prints.

use super::{Job, Lat, Plan, Run, Target};
use crate::bench::kit::fio::{FioNumbers, fio_json, json_with_percentiles, parse_fio};
use crate::bench::kit::procs::{STOP, alive, proc_cpu_secs};
use crate::bench::kit::report::Bar;
use serde_json::{Value, json};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

impl Run {
    pub(super) fn to_json(&self) -> Value {
        let lat = |l: &Option<Lat>| {
            l.as_ref().map(
                |l| json!({"p50_us": l.p50, "p99_us": l.p99, "p99_9_us": l.p999, "mean_us": l.mean}),
            )
        };
        json!({
            "part": self.part, "phase": self.phase, "config": self.config, "round": self.round,
            "connections": self.conns, "iops": self.iops, "read_iops": self.read_iops,
            "write_iops": self.write_iops, "read_ios": self.read_ios, "write_ios": self.write_ios,
            "lat_p50_us": self.lat_p50_us, "lat_p99_us": self.lat_p99_us,
            "lat_p99_9_us": self.lat_p999_us, "lat_mean_us": self.lat_mean_us,
            "read_lat": lat(&self.read_lat), "write_lat": lat(&self.write_lat),
            "fio_usr_cpu_pct": self.fio_usr_pct, "fio_sys_cpu_pct": self.fio_sys_pct,
            "fio_cpu_us_per_io": self.fio_cpu_us_per_io,
            "server_cpu_utilization": self.server_cpu_util,
            "server_cpu_us_per_io": self.server_cpu_us_per_io,
            "read_hit_ratio": self.read_hit_ratio, "hit_ratio": self.hit_ratio,
            "hit_ratio_source": self.hit_source,
            "core_reads": self.core_reads, "core_writes": self.core_writes,
            "cut_short": self.cut_short,
        })
    }
}

pub(super) fn fio_cmd(plan: &Plan, j: &Job) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c")
        .arg(plan.client_cpu.to_string())
        .arg("fio")
        .arg("--name=peers");
    match &j.target {
        Target::Nbd(uri) => {
            c.arg("--ioengine=nbd").arg(format!("--uri={uri}"));
        }
        Target::File(p, _) => {
            c.arg("--ioengine=io_uring")
                .arg("--direct=1")
                .arg(format!("--filename={}", p.display()));
        }
    }
    let size = match &j.target {
        Target::File(_, s) => *s,
        Target::Nbd(_) => j.size,
    };
    c.arg(format!("--rw={}", j.rw))
        .arg("--bs=4k")
        .arg(format!("--iodepth={}", j.qd))
        .arg(format!("--size={size}"))
        .arg("--time_based")
        .arg(format!("--runtime={}ms", j.runtime_ms))
        .arg("--randrepeat=0")
        .arg("--norandommap");
    json_with_percentiles(&mut c);
    if j.ramp_ms > 0 {
        c.arg(format!("--ramp_time={}ms", j.ramp_ms));
    }
    if let Some(m) = j.mix {
        c.arg(format!("--rwmixread={m}"));
    }
    if let Some(z) = j.zipf {
        c.arg(format!("--random_distribution=zipf:{z}"));
    }
    if j.jobs > 1 {
        c.arg(format!("--numjobs={}", j.jobs))
            .arg("--group_reporting");
    }
    c
}

/// Sleeps until `t`; false if `done` was set first.
pub(super) fn sleep_until(t: Instant, done: &AtomicBool) -> bool {
    while Instant::now() < t {
        if done.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5).min(t - Instant::now()));
    }
    true
}

/// Runs one fio job; samples the server's CPU inside the measured part of the run.
pub(super) fn measure(
    plan: &Plan,
    j: &Job,
    server: &[u32],
    label: &str,
    bar: &Bar,
) -> Result<Run, String> {
    let cmd = fio_cmd(plan, j);
    let total = (j.ramp_ms + j.runtime_ms) as f64 / 1000.0 + 0.3;
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let a_at = start + Duration::from_millis(j.ramp_ms + 250);
    let b_at = start + Duration::from_millis(j.ramp_ms + j.runtime_ms.saturating_sub(100));
    let (v, cpu) = std::thread::scope(|s| {
        let cpu_of = |pids: &[u32]| -> Option<f64> { pids.iter().map(|p| proc_cpu_secs(*p)).sum() };
        let sampler = (!server.is_empty()).then(|| {
            let done = &done;
            s.spawn(move || -> Option<(f64, f64)> {
                if b_at <= a_at || !sleep_until(a_at, done) {
                    return None;
                }
                let c0 = cpu_of(server)?;
                let t0 = Instant::now();
                if !sleep_until(b_at, done) {
                    return None;
                }
                let c1 = cpu_of(server)?;
                Some((c1 - c0, t0.elapsed().as_secs_f64()))
            })
        });
        let v = fio_json(cmd, total, &|f| bar.show(label, f));
        done.store(true, Ordering::Relaxed);
        let cpu = sampler.and_then(|h| h.join().ok().flatten());
        (v, cpu)
    });
    bar.end();
    let v = v?;
    let job = &v["jobs"][0];
    if let Some(e) = job["error"].as_i64().filter(|e| *e != 0) {
        return Err(format!("fio reported error {e} for {label}"));
    }
    let (iops, _bw, mean, p99, p999, cdf): FioNumbers = parse_fio(&v)?;
    let p50 = cdf
        .iter()
        .find(|(p, _)| (*p - 50.0).abs() < 1e-6)
        .map(|x| x.1)
        .unwrap_or(0.0);
    let dir = |d: &str| -> Option<Lat> {
        let x = &job[d];
        (x["total_ios"].as_u64().unwrap_or(0) > 0).then(|| {
            let pc = &x["clat_ns"]["percentile"];
            let g = |k: &str| pc[k].as_f64().unwrap_or(0.0) / 1000.0;
            Lat {
                p50: g("50.000000"),
                p99: g("99.000000"),
                p999: g("99.900000"),
                mean: x["clat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0,
            }
        })
    };
    let read_ios = job["read"]["total_ios"].as_u64().unwrap_or(0);
    let write_ios = job["write"]["total_ios"].as_u64().unwrap_or(0);
    if let Some(pid) = server.iter().find(|p| !alive(**p)) {
        return Err(format!("{label}: the server process {pid} died"));
    }
    if read_ios + write_ios == 0 && !STOP.load(Ordering::Relaxed) {
        return Err(format!("{label}: fio did no IO"));
    }
    let usr = job["usr_cpu"].as_f64().unwrap_or(0.0);
    let sys = job["sys_cpu"].as_f64().unwrap_or(0.0);
    let runtime_ms = job["job_runtime"].as_f64().unwrap_or(0.0);
    let ios = (read_ios + write_ios).max(1) as f64;
    let (util, per_io) = match cpu {
        Some((c, t)) if t > 0.0 && iops > 0.0 => (Some(c / t), Some(c / t * 1e6 / iops)),
        _ => (None, None),
    };
    Ok(Run {
        iops,
        read_iops: job["read"]["iops"].as_f64().unwrap_or(0.0),
        write_iops: job["write"]["iops"].as_f64().unwrap_or(0.0),
        read_ios,
        write_ios,
        lat_p50_us: p50,
        lat_p99_us: p99,
        lat_p999_us: p999,
        lat_mean_us: mean,
        read_lat: dir("read"),
        write_lat: dir("write"),
        fio_usr_pct: usr,
        fio_sys_pct: sys,
        fio_cpu_us_per_io: (usr + sys) / 100.0 * runtime_ms * 1000.0 / ios,
        server_cpu_util: util,
        server_cpu_us_per_io: per_io,
        cut_short: STOP.load(Ordering::Relaxed),
        ..Run::default()
    })
}

pub(super) fn print_run(r: &Run) {
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "-".into());
    println!(
        "  {:<5} {:<8} r{} {:<20} c{} {:>9.0} IOPS  p50 {:>7.1} us  p99 {:>8.1} us  server {:>6} CPU-us/IO  fio {:>5.1} CPU-us/IO  hits {}",
        r.part,
        r.phase,
        r.round,
        r.config,
        r.conns,
        r.iops,
        r.lat_p50_us,
        r.lat_p99_us,
        opt(r.server_cpu_us_per_io, &|x| format!("{x:.1}")),
        r.fio_cpu_us_per_io,
        opt(r.read_hit_ratio, &|x| format!("{:.1}% (reads)", x * 100.0)),
    );
}
