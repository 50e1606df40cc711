//! `bench wl`'s summary: the medians over rounds per (phase, configuration, QD), the tables,
//! the ratios to librbd and the P8 targets.

use super::{Cfg, Phase, Plan, Report, Run};
use crate::bench::kit::stats::median;
use serde_json::{Value, json};
use std::fmt::Write as _;

/// Medians over rounds of one (phase, config, QD).
#[derive(Clone, Copy)]
struct Row {
    runs: usize,
    iops: f64,
    iops_lo: f64,
    iops_hi: f64,
    p50: f64,
    p99: f64,
    min_bucket: f64,
    med_bucket: f64,
    fio_cpu: f64,
    daemon_cpu: f64,
    filled: bool,
    fill_lo: f64,
    fill_hi: f64,
}

fn row(rep: &Report, p: Phase, c: Cfg, qd: u32) -> Option<Row> {
    let rs: Vec<&Run> = rep
        .runs
        .iter()
        .filter(|r| r.phase == p && r.cfg == c && r.qd == qd)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let f = |g: &dyn Fn(&Run) -> Option<f64>| -> f64 {
        let v: Vec<f64> = rs.iter().filter_map(|r| g(r)).collect();
        median(&v)
    };
    let iops = f(&|r| Some(r.m.iops));
    let p50 = f(&|r| Some(r.m.p50_us));
    let p99 = f(&|r| Some(r.m.p99_us));
    let fio_cpu = f(&|r| r.m.fio_cpu_us_per_io);
    let daemon_cpu = f(&|r| r.m.daemon_cpu_us_per_io);
    let b: Vec<f64> = rs
        .iter()
        .flat_map(|r| r.m.buckets.iter().copied())
        .collect();
    let min_bucket = b.iter().copied().fold(f64::INFINITY, f64::min);
    Some(Row {
        runs: rs.len(),
        iops,
        iops_lo: rs.iter().map(|r| r.m.iops).fold(f64::INFINITY, f64::min),
        iops_hi: rs.iter().map(|r| r.m.iops).fold(0.0, f64::max),
        p50,
        p99,
        min_bucket: if b.is_empty() { f64::NAN } else { min_bucket },
        med_bucket: median(&b),
        fio_cpu,
        daemon_cpu,
        filled: rs.iter().any(|r| r.filled),
        fill_lo: rs
            .iter()
            .filter_map(|r| r.fill_range.map(|x| x.0))
            .fold(f64::NAN, f64::min),
        fill_hi: rs
            .iter()
            .filter_map(|r| r.fill_range.map(|x| x.1))
            .fold(f64::NAN, f64::max),
    })
}

fn num(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".into()
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        a / b
    } else {
        f64::NAN
    }
}

pub(super) fn summarize(plan: &Plan, rep: &Report, fio: &str) -> (String, Value, Value) {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "tiercache bench wl (target P8): fio 4K randwrite, {fio}, {} s runs (+{}/{} s ramp not-full/full), {} round(s){}, images {} MiB",
        plan.runtime,
        plan.ramp(Phase::NotFull),
        plan.ramp(Phase::Full),
        plan.rounds,
        if plan.rounds < 5 {
            " (P8 asks for at least 5)"
        } else {
            ""
        },
        plan.image_bytes >> 20
    );
    let _ = writeln!(
        t,
        "librbd: rbd_cache=false; librbd-wb: rbd_cache=true, policy writeback (32 MiB, 24 MiB dirty); wl: tiercache over NBD, log {} MiB (not full) / {} MiB (full), core opened with rbd_cache=false",
        plan.cache_nf >> 21,
        plan.cache_full >> 21
    );
    let _ = writeln!(
        t,
        "IOPS: median over rounds [min-max]; min bkt: lowest 1-s IOPS bucket; min/med: that / the median bucket; x: wl / librbd, xwb: wl / librbd-wb; cpu/dmn: CPU us per IO (fio incl. librbd / the daemon); log %: wl log fill, lowest-highest sampled in the measured part"
    );
    let mut summary = Vec::new();
    let mut targets = Vec::new();
    for &p in &plan.phases {
        phase_table(plan, rep, p, &mut t, &mut summary);
        p8_targets(plan, rep, p, &mut targets);
    }
    targets_text(&mut t, &targets);
    fills_and_drains(plan, rep, &mut t);
    (t, json!(summary), json!(targets))
}

/// Phase `p`'s table: one line per (QD, configuration) with its ratios to librbd (into `t`),
/// each also as JSON (into `summary`).
fn phase_table(plan: &Plan, rep: &Report, p: Phase, t: &mut String, summary: &mut Vec<Value>) {
    let _ = writeln!(
        t,
        "\n{:<8} {:>3} {:<9} {:>7} {:>15} {:>8} {:>9} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>7}",
        p.name(),
        "QD",
        "config",
        "IOPS",
        "[min-max]",
        "p50 us",
        "p99 us",
        "min bkt",
        "min/med",
        "cpu",
        "dmn",
        "IOPSx",
        "p50x",
        "p99x",
        "bkt/x",
        "IOPSxwb",
        "log %"
    );
    for &qd in &plan.qds {
        let base = row(rep, p, Cfg::Librbd, qd);
        let wbr = row(rep, p, Cfg::LibrbdWb, qd);
        for &c in &plan.cfgs {
            let Some(r) = row(rep, p, c, qd) else {
                continue;
            };
            let (x, p50x, p99x, bx) = match (c, base) {
                (Cfg::Librbd, _) | (_, None) => (f64::NAN, f64::NAN, f64::NAN, f64::NAN),
                (_, Some(b)) => (
                    ratio(r.iops, b.iops),
                    ratio(r.p50, b.p50),
                    ratio(r.p99, b.p99),
                    ratio(r.min_bucket, b.iops),
                ),
            };
            let xwb = match (c, wbr) {
                (Cfg::Wl, Some(w)) => ratio(r.iops, w.iops),
                _ => f64::NAN,
            };
            let rx = |v: f64| {
                if v.is_finite() {
                    format!("{v:.2}x")
                } else {
                    "-".into()
                }
            };
            let _ = writeln!(
                t,
                "{:<8} {:>3} {:<9} {:>7} {:>15} {:>8} {:>9} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>7}{}",
                "",
                qd,
                c.name(),
                num(r.iops, 0),
                if r.runs > 1 {
                    format!("[{}-{}]", num(r.iops_lo, 0), num(r.iops_hi, 0))
                } else {
                    String::new()
                },
                num(r.p50, 1),
                num(r.p99, 1),
                num(r.min_bucket, 0),
                num(ratio(r.min_bucket, r.med_bucket), 2),
                num(r.fio_cpu, 1),
                if c == Cfg::Wl {
                    num(r.daemon_cpu, 1)
                } else {
                    "-".into()
                },
                rx(x),
                rx(p50x),
                rx(p99x),
                rx(bx),
                rx(xwb),
                if r.fill_hi.is_finite() {
                    format!("{:.0}-{:.0}", r.fill_lo, r.fill_hi)
                } else {
                    "-".into()
                },
                if r.filled {
                    "  ! log filled during the run"
                } else {
                    ""
                }
            );
            summary.push(json!({
                "phase": p.name(), "config": c.name(), "qd": qd, "runs": r.runs,
                "iops_median": r.iops, "iops_min": r.iops_lo, "iops_max": r.iops_hi,
                "p50_us_median": r.p50, "p99_us_median": r.p99,
                "min_bucket_iops": r.min_bucket, "median_bucket_iops": r.med_bucket,
                "min_over_median_bucket": ratio(r.min_bucket, r.med_bucket),
                "fio_cpu_us_per_io": r.fio_cpu,
                "daemon_cpu_us_per_io": if c == Cfg::Wl { json!(r.daemon_cpu) } else { Value::Null },
                "vs_librbd": {"iops": x, "p50": p50x, "p99": p99x,
                    "min_bucket_over_librbd_iops": bx},
                "wl_vs_librbd_wb_iops": xwb,
                "log_filled_during_not_full_run": r.filled,
                "log_fill_pct_measured_part": if r.fill_hi.is_finite() {
                    json!({"min": r.fill_lo, "max": r.fill_hi}) } else { Value::Null },
            }));
        }
    }
}

/// SPEC P8's targets of phase `p`, wl against plain librbd (into `targets`).
fn p8_targets(plan: &Plan, rep: &Report, p: Phase, targets: &mut Vec<Value>) {
    for &qd in &plan.qds {
        let (Some(w), Some(b)) = (row(rep, p, Cfg::Wl, qd), row(rep, p, Cfg::Librbd, qd)) else {
            continue;
        };
        let mut check = |what: &str, v: f64, want: &str, ok: bool| {
            targets.push(json!({"phase": p.name(), "qd": qd, "target": what,
                "value": v, "want": want, "pass": ok}));
        };
        match p {
            Phase::NotFull => {
                if qd <= 16 {
                    let x = ratio(w.iops, b.iops);
                    check("IOPS vs librbd", x, ">= 3x", x >= 3.0);
                }
                if qd == 1 {
                    let x = ratio(w.p50, b.p50);
                    check("p50 latency vs librbd", x, "<= 0.25x", x <= 0.25);
                }
            }
            Phase::Full => {
                let x = ratio(w.iops, b.iops);
                check("IOPS vs librbd", x, ">= 0.7x", x >= 0.7);
                let x = ratio(w.p99, b.p99);
                check("p99 latency vs librbd", x, "<= 2x", x <= 2.0);
                let x = ratio(w.min_bucket, b.iops);
                check("lowest 1-s bucket vs librbd IOPS", x, ">= 0.3x", x >= 0.3);
            }
        }
    }
}

/// The P8 targets, PASS or MISS each (into `t`).
fn targets_text(t: &mut String, targets: &[Value]) {
    if !targets.is_empty() {
        let _ = writeln!(
            t,
            "\nP8 targets (wl / plain librbd, medians; docs/TARGETS.md):"
        );
        let (mut pass, mut miss) = (0, 0);
        for x in targets {
            let ok = x["pass"] == true;
            if ok {
                pass += 1;
            } else {
                miss += 1;
            }
            let _ = writeln!(
                t,
                "  {:<8} QD {:>2}  {:<34} {:>7}  want {:<8} {}",
                x["phase"].as_str().unwrap_or(""),
                x["qd"].as_u64().unwrap_or(0),
                x["target"].as_str().unwrap_or(""),
                num(x["value"].as_f64().unwrap_or(f64::NAN), 2) + "x",
                x["want"].as_str().unwrap_or(""),
                if ok { "PASS" } else { "MISS" }
            );
        }
        let _ = writeln!(t, "  {pass} PASS, {miss} MISS");
    }
}

/// How the full runs' log fills went and how fast the log writes back with no client IO
/// (into `t`).
fn fills_and_drains(plan: &Plan, rep: &Report, t: &mut String) {
    let nfills = rep.fills.len();
    if nfills > 0 {
        let not: usize = rep
            .fills
            .iter()
            .filter(|f| f["fill"]["reached"] != true)
            .count();
        let secs: Vec<f64> = rep
            .fills
            .iter()
            .filter_map(|f| f["fill"]["seconds"].as_f64())
            .collect();
        let _ = writeln!(
            t,
            "\nwl full runs: log filled {} time(s) at QD {} ({}-{} s each){}",
            nfills,
            plan.fill_qd,
            num(secs.iter().copied().fold(f64::INFINITY, f64::min), 1),
            num(secs.iter().copied().fold(0.0, f64::max), 1),
            if not > 0 {
                format!("; {not} time(s) NOT full within the time limit")
            } else {
                String::new()
            }
        );
    }
    for p in [Phase::NotFull, Phase::Full] {
        let r: Vec<f64> = rep
            .drains
            .iter()
            .filter(|d| d["phase"] == p.name() && d["dirty_bytes"].as_u64().unwrap_or(0) >= 4 << 20)
            .filter_map(|d| d["bytes_per_s"].as_f64())
            .collect();
        if !r.is_empty() {
            let m = median(&r);
            let _ = writeln!(
                t,
                "wl writeback to Ceph with no client IO (`writeback` of the {} cache, {} time(s) >= 4 MiB): median {} MiB/s = {} 4K writes/s",
                p.name(),
                r.len(),
                num(m / 1048576.0, 1),
                num(m / 4096.0, 0)
            );
        }
    }
}
