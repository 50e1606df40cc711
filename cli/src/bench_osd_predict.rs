//! The simulator beside the ceph-osd study (issue 26 item 3): what the study measures about
//! the machine (CPU of the host and of the OSDs, requests reaching the data devices), the
//! calibration of the simulator's OSD model from it, the prediction per layout and workload,
//! and, where a predicted ratio differs from the measured one by more than 1.5x, the reason
//! as measured.

use super::{Measured, PRESET, Plan, STUDY_CSV};
use serde_json::{Value, json};
use std::path::Path;
use tiercache_sim::osd_study::{Cost, LAYOUTS, Predicted, Study};

/// A predicted ratio this far from the measured one (either way) gets a reason.
pub(super) const DIFFERS: f64 = 1.5;

/// CPU counters at one moment: (host busy jiffies, host total jiffies, ceph-osd jiffies of
/// this study's OSDs).
#[derive(Clone, Copy, Default)]
pub(super) struct Cpu {
    busy: u64,
    total: u64,
    osd: u64,
}

/// The CPU counters now; the OSDs are the `ceph-osd` processes whose command line names
/// `scratch` (this study's cluster).
pub(super) fn cpu_now(scratch: &Path) -> Cpu {
    let mut c = Cpu::default();
    if let Ok(s) = std::fs::read_to_string("/proc/stat")
        && let Some(l) = s.lines().next()
    {
        let v: Vec<u64> = l
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        c.total = v.iter().take(8).sum();
        // idle and iowait are not busy.
        c.busy = c.total - v.get(3).copied().unwrap_or(0) - v.get(4).copied().unwrap_or(0);
    }
    let want = scratch.display().to_string();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let p = e.path();
        if std::fs::read_to_string(p.join("comm")).map_or(true, |s| s.trim() != "ceph-osd") {
            continue;
        }
        let cmd = std::fs::read(p.join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmd).contains(&want) {
            continue;
        }
        // After the command name: the state, then fields 4..; utime and stime are fields 14
        // and 15 of proc(5), so the 12th and 13th after the state.
        if let Ok(st) = std::fs::read_to_string(p.join("stat"))
            && let Some(rest) = st.rsplit_once(')').map(|x| x.1)
        {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            c.osd += n(11) + n(12);
        }
    }
    c
}

/// Between two snapshots over `secs` seconds: (host CPUs busy, 0..1 of all of them;
/// ceph-osd CPU seconds).
pub(super) fn cpu_between(a: Cpu, b: Cpu) -> (f64, f64) {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let total = b.total.saturating_sub(a.total).max(1) as f64;
    (
        b.busy.saturating_sub(a.busy) as f64 / total,
        b.osd.saturating_sub(a.osd) as f64 / hz,
    )
}

/// CPUs of this host.
fn host_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The study's parameters as the simulator's study (the single node's failure domain is the
/// OSD, as in `ceph-cluster.sh`'s CRUSH rule, so replicas go to other OSDs).
pub(super) fn study_of(plan: &Plan, iodepth: u32, cache_dev: &str) -> Study {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let workloads = plan
        .workloads
        .iter()
        .map(|w| {
            let read_pct = match (w.mix, w.rw) {
                (Some(m), _) => m,
                (None, rw) if rw.contains("read") => 100,
                _ => 0,
            };
            let kib = w.bs.trim_end_matches('k').parse().unwrap_or(4);
            (w.name.to_string(), w.random, read_pct, kib)
        })
        .collect();
    Study {
        nodes: plan.osds,
        osds_per_node: 1,
        replicas: plan.replicas,
        hdd: PRESET.into(),
        hdd_gib: gib(plan.hdd_bytes),
        // BlueStore allocates from the start of the device: its data (and RocksDB, when it
        // shares the disk) lie in the first part of it.
        span_gib: gib(plan.per_osd) * 1.25,
        data_gib_per_osd: gib(plan.per_osd),
        cache_dev: cache_dev.into(),
        cache_gib_per_osd: gib(plan.cache_bytes),
        osds_per_cache_dev: 1,
        line_kib: 4,
        cutoff_kib: 16,
        ioclass_csv: STUDY_CSV.into(),
        jobs: 1,
        qd: iodepth,
        duration_s: (plan.runtime as f64).min(5.0),
        warmup_s: 0.5,
        workloads,
    }
}

/// OSD ops per client op of `workload` (a write goes to every replica).
fn subops(plan: &Plan, read_pct: u32) -> f64 {
    let r = read_pct as f64 / 100.0;
    r + (1.0 - r) * plan.replicas as f64
}

/// The calibration and the statement of what set each number; `None` without the runs it
/// needs (the tiercache layout's 4K random reads and their QD 1 run).
pub(super) fn calibrate(plan: &Plan, runs: &[Measured]) -> Option<(Cost, Value)> {
    let get = |l: &str, w: &str| runs.iter().find(|r| r.layout == l && r.workload == w);
    let hit = get("tiercache", "randread-4k")?;
    let qd1 = hit.qd1_mean_us?;
    if hit.iops <= 0.0 || hit.seconds <= 0.0 {
        return None;
    }
    let cpu_us = hit.osd_cpu_s * 1e6 / (hit.iops * hit.seconds);
    let latency_us = (qd1 - cpu_us).max(0.0);
    // Data-device requests per OSD op: hdd (RocksDB and WAL on the HDD) less hdd+db.
    let per_op = |l: &str, w: &str, read_pct: u32| {
        get(l, w)
            .filter(|r| r.iops > 0.0 && r.seconds > 0.0)
            .map(|r| r.dev_requests / (r.iops * r.seconds) / subops(plan, read_pct))
    };
    let extra = |w: &str, read_pct: u32| match (
        per_op("hdd", w, read_pct),
        per_op("hdd+db", w, read_pct),
    ) {
        (Some(a), Some(b)) => ((a - b).max(0.0), Some((a, b))),
        _ => (0.0, None),
    };
    let (xr, xr_from) = extra("randread-4k", 100);
    let (xw, xw_from) = extra("randwrite-4k", 0);
    let cost = Cost {
        threads: host_cpus(),
        cpu_us,
        latency_us,
        hdd_extra_per_read: xr,
        hdd_extra_per_write: xw,
    };
    let doc = json!({
        "threads": cost.threads, "cpu_us": cpu_us, "latency_us": latency_us,
        "hdd_extra_per_read": xr, "hdd_extra_per_write": xw,
        "from": {
            "threads": "the host's CPUs (an OSD op can run on any of them)",
            "cpu_us": format!("ceph-osd CPU time (/proc/PID/stat utime+stime) over the tiercache layout's randread-4k run, {:.2} s, per client read ({:.0})", hit.osd_cpu_s, hit.iops * hit.seconds),
            "latency_us": format!("mean latency of a QD 1 randread-4k run on the tiercache layout (every read a hit), {qd1:.0} us, less the CPU per op"),
            "hdd_extra_per_read": xr_from.map_or("no hdd and hdd+db randread-4k runs: 0".to_string(), |(a, b)| format!("data-device requests per OSD read: hdd {a:.2} less hdd+db {b:.2} (the NBD server's counts)")),
            "hdd_extra_per_write": xw_from.map_or("no hdd and hdd+db randwrite-4k runs: 0".to_string(), |(a, b)| format!("data-device requests per OSD write: hdd {a:.2} less hdd+db {b:.2} (the NBD server's counts)")),
        },
    });
    Some((cost, doc))
}

/// The text of the calibration (for the report).
pub(super) fn calibration_text(c: &Cost, doc: &Value) -> String {
    format!(
        "OSD model calibrated on this machine: {} thread(s) x {:.0} CPU-us per op, {:.0} us fixed per op; hdd layout: {:.2} extra HDD reads per read, {:.2} extra HDD writes per write.\n  cpu: {}\n  fixed: {}\n  hdd reads: {}\n  hdd writes: {}\n",
        c.threads,
        c.cpu_us,
        c.latency_us,
        c.hdd_extra_per_read,
        c.hdd_extra_per_write,
        doc["from"]["cpu_us"].as_str().unwrap_or(""),
        doc["from"]["latency_us"].as_str().unwrap_or(""),
        doc["from"]["hdd_extra_per_read"].as_str().unwrap_or(""),
        doc["from"]["hdd_extra_per_write"].as_str().unwrap_or(""),
    )
}

/// Why a run measured `factor` times its prediction, from what was measured during it.
fn reason(r: &Measured, p: &Predicted, plan: &Plan, qd: u32) -> String {
    let ops = (r.iops * r.seconds).max(1.0);
    let mut parts = vec![format!(
        "{} {} measured {:.0} IOPS, predicted {:.0}",
        r.layout, r.workload, r.iops, p.iops
    )];
    let osd_share = r.osd_cpu_s / r.seconds.max(1e-9);
    if r.host_busy >= 0.85 {
        parts.push(format!(
            "the host's {} CPUs were {:.0}% busy (ceph-osd {:.0}% of one CPU, {:.0} CPU-us per client op; the rest every other process: fio, librbd, nbdfuse, the NBD server, and whatever else ran on the host), so the run was CPU-bound, and the model gives the OSD its own measured CPU per op on the host's CPUs and charges nothing for the others",
            host_cpus(),
            r.host_busy * 100.0,
            osd_share * 100.0,
            r.osd_cpu_s * 1e6 / ops
        ));
    } else {
        parts.push(format!(
            "host CPUs {:.0}% busy, ceph-osd {:.0}% of one CPU",
            r.host_busy * 100.0,
            osd_share * 100.0
        ));
    }
    // The first second holds fio's start (librbd connecting): not a stall.
    let per_sec: Vec<f64> = r
        .per_second
        .iter()
        .skip(1)
        .map(|s| s.dev_requests)
        .collect();
    if per_sec.len() >= 2 {
        let mut v = per_sec.clone();
        v.sort_by(f64::total_cmp);
        let (lo, med, hi) = (v[0], v[v.len() / 2], v[v.len() - 1]);
        if lo < 0.1 * med || hi > 10.0 * lo.max(1.0) {
            parts.push(format!(
                "the OSDs stalled: the requests they sent their data devices went from {lo:.0} to {hi:.0} per second (median {med:.0})"
            ));
        }
    }
    parts.push(format!(
        "the data devices served {:.2} requests per OSD op, each in {:.2} ms from receipt to reply, {:.1} in flight on average (in the model the OSD passes all {qd} of the client's on)",
        r.dev_requests / ops / subops(plan, if r.workload.contains("read") { 100 } else { 0 }),
        r.dev_inflight * r.seconds * 1e3 / r.dev_requests.max(1.0),
        r.dev_inflight
    ));
    parts.join("; ")
}

/// The prediction beside the measured runs: the text, and (per run, per ratio) its JSON;
/// `runs_pred[i]` is run i's prediction.
pub(super) struct Beside {
    pub text: String,
    pub runs_pred: Vec<Option<Predicted>>,
    pub ratios: Vec<Value>,
}

/// Compares the prediction with the runs, ratio by ratio.
pub(super) fn beside(plan: &Plan, qd: u32, runs: &[Measured], pred: &[Predicted]) -> Beside {
    let find = |l: &str, w: &str| pred.iter().find(|p| p.layout == l && p.workload == w);
    let mut text = format!(
        "{:<14} {:<10} {:>9} {:>10} {:>10}\n",
        "workload", "layout", "IOPS", "predicted", "pred p99"
    );
    let mut runs_pred = Vec::new();
    for r in runs {
        let p = find(r.layout, r.workload).cloned();
        if let Some(p) = &p {
            text += &format!(
                "{:<14} {:<10} {:>9.0} {:>10.0} {:>10.0}\n",
                r.workload, r.layout, r.iops, p.iops, p.p99_us
            );
        }
        runs_pred.push(p);
    }
    text += &format!(
        "\n{:<14} {:<17} {:>9} {:>10}\n",
        "workload", "ratio (IOPS)", "measured", "predicted"
    );
    let mut ratios = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in runs {
        if !workloads.contains(&r.workload) {
            workloads.push(r.workload);
        }
    }
    for w in workloads {
        for (name, num, den) in super::RATIOS {
            let m = |l: &str| runs.iter().find(|r| r.layout == l && r.workload == w);
            let (Some(mn), Some(md), Some(pn), Some(pd)) =
                (m(num), m(den), find(num, w), find(den, w))
            else {
                continue;
            };
            let measured = mn.iops / md.iops.max(1e-9);
            let predicted = pn.iops / pd.iops.max(1e-9);
            let factor = (measured / predicted.max(1e-9)).max(predicted / measured.max(1e-9));
            let why = (factor > DIFFERS).then(|| {
                // Each layout whose own prediction is off by more than DIFFERS explains it,
                // the furthest first (else the further of the two).
                let off =
                    |r: &Measured, p: &Predicted| (r.iops.max(1e-9) / p.iops.max(1e-9)).ln().abs();
                let mut pair = [(mn, pn), (md, pd)];
                pair.sort_by(|a, b| off(b.0, b.1).total_cmp(&off(a.0, a.1)));
                let far: Vec<String> = pair
                    .iter()
                    .filter(|(r, p)| off(r, p) > DIFFERS.ln())
                    .map(|(r, p)| reason(r, p, plan, qd))
                    .collect();
                if far.is_empty() {
                    reason(pair[0].0, pair[0].1, plan, qd)
                } else {
                    far.join(". ")
                }
            });
            text += &format!(
                "{w:<14} {name:<17} {:>9} {:>10}{}\n",
                format!("x{measured:.2}"),
                format!("x{predicted:.2}"),
                why.as_ref().map_or(String::new(), |y| format!(
                    "  differs by more than {DIFFERS}x (x{factor:.1}): {y}"
                ))
            );
            ratios.push(json!({
                "workload": w, "ratio": name, "measured": measured, "predicted": predicted,
                "factor": factor, "differs": why.is_some(), "reason": why,
            }));
        }
    }
    Beside {
        text,
        runs_pred,
        ratios,
    }
}

/// The seed study's 12-OSD, 2-node cluster with this machine's per-op costs: its ratios.
pub(super) fn seed_cluster(study: &Study, c: &Cost) -> Result<(String, Value), String> {
    let mut seed = study.seed_cluster()?;
    // Hits never reach the HDD and the HDD's seeks are full-stroke either way: a smaller
    // working set per OSD than the shipped scenario's 2 GiB gives the same ratios, faster
    // (the cache holds twice it, so that no OSD's share of the objects overflows its cache).
    seed.data_gib_per_osd = 0.25;
    seed.cache_gib_per_osd = 0.5;
    seed.warmup_s = 0.1;
    seed.duration_s = 0.4;
    // A seed-study node has many cores: the OSD gets the shipped scenario's 4 threads of its
    // measured CPU, not this machine's CPUs.
    let cost = Cost { threads: 4, ..*c };
    let p = seed.predict(&cost, &LAYOUTS)?;
    let iops = |l: &str, w: &str| {
        p.iter()
            .find(|r| r.layout == l && r.workload == w)
            .map_or(0.0, |r| r.iops)
    };
    let mut text = format!(
        "The seed study's cluster predicted ({} nodes x {} OSDs, replica {}, {} jobs x QD {}, {} HDDs, {} cache partitions; OSD: 4 threads x {:.0} CPU-us, {:.0} us fixed):\n",
        seed.nodes,
        seed.osds_per_node,
        seed.replicas,
        seed.jobs,
        seed.qd,
        seed.hdd,
        seed.cache_dev,
        c.cpu_us,
        c.latency_us
    );
    let mut doc = Vec::new();
    for (w, ..) in &seed.workloads {
        let (h, d, t) = (iops("hdd", w), iops("hdd+db", w), iops("tiercache", w));
        let r = |a: f64, b: f64| a / b.max(1e-9);
        text += &format!(
            "  {w:<14} hdd {h:.0}, hdd+db {d:.0}, tiercache {t:.0} IOPS: tiercache/hdd+db x{:.1}, tiercache/hdd x{:.1}, hdd+db/hdd x{:.2}\n",
            r(t, d),
            r(t, h),
            r(d, h)
        );
        doc.push(json!({
            "workload": w, "hdd": h, "hdd+db": d, "tiercache": t,
            "tiercache/hdd+db": r(t, d), "tiercache/hdd": r(t, h), "hdd+db/hdd": r(d, h),
        }));
    }
    Ok((
        text,
        json!({"nodes": seed.nodes, "osds_per_node": seed.osds_per_node, "replicas": seed.replicas,
            "jobs": seed.jobs, "qd": seed.qd, "threads": 4, "runs": doc}),
    ))
}
