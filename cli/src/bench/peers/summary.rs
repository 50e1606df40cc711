//! `bench peers`' summaries: the medians of the rounds per configuration, the ratios P1 and P2
//! are judged by, the printed tables and their JSON.

use super::{Plan, Report, Run};
use crate::bench::kit::stats::{median_min_max, median_some};
use serde_json::{Value, json};
use std::fmt::Write as _;

/// Median summary of the measured runs of `part`/`config`/`conns`.
fn cfg_summary(runs: &[&Run]) -> Value {
    let iops: Vec<f64> = runs.iter().map(|r| r.iops).collect();
    let (m, lo, hi) = median_min_max(&iops);
    let f =
        |g: &dyn Fn(&Run) -> f64| median_min_max(&runs.iter().map(|r| g(r)).collect::<Vec<_>>()).0;
    let o = |g: &dyn Fn(&Run) -> Option<f64>| {
        median_some(&runs.iter().map(|r| g(r)).collect::<Vec<_>>())
    };
    let hits: Vec<f64> = runs.iter().filter_map(|r| r.read_hit_ratio).collect();
    json!({
        "runs": runs.len(),
        "iops_median": m, "iops_min": lo, "iops_max": hi,
        "spread_pct": if m > 0.0 { (hi - lo) / m * 100.0 } else { 0.0 },
        "iops_per_round": iops,
        "lat_p50_us_median": f(&|r| r.lat_p50_us),
        "lat_p99_us_median": f(&|r| r.lat_p99_us),
        "server_cpu_us_per_io_median": o(&|r| r.server_cpu_us_per_io),
        "server_cpu_utilization_median": o(&|r| r.server_cpu_util),
        "fio_cpu_us_per_io_median": f(&|r| r.fio_cpu_us_per_io),
        "read_hit_ratio_median": (!hits.is_empty()).then(|| median_min_max(&hits).0),
        "read_hit_ratio_min": hits.iter().copied().reduce(f64::min),
        "hit_ratio_median": o(&|r| r.hit_ratio),
    })
}

fn measured<'a>(rep: &'a Report, part: &str, cfg: &str, conns: u32) -> Vec<&'a Run> {
    rep.runs
        .iter()
        .filter(|r| r.part == part && r.phase == "measure" && r.config == cfg && r.conns == conns)
        // A run cut short by Ctrl-C is in the JSON, not in the medians.
        .filter(|r| !r.cut_short)
        .collect()
}

/// Per-round ratios a/b (rounds where both ran).
fn round_ratios(a: &[&Run], b: &[&Run], f: &dyn Fn(&Run, &Run) -> f64) -> Vec<f64> {
    a.iter()
        .filter_map(|x| b.iter().find(|y| y.round == x.round).map(|y| f(x, y)))
        .collect()
}

fn verdict(x: f64, want: f64) -> &'static str {
    verdict_met(x >= want)
}

fn verdict_met(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map(|x| format!("{x:.1}")).unwrap_or_else(|| "-".into())
}

fn row(t: &mut String, name: &str, s: &Value, hits: bool) {
    let g = |k: &str| s[k].as_f64();
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "-".into());
    let _ = writeln!(
        t,
        "{:<20} {:>8.0} {:>15} {:>7} {:>7.1} {:>8.1} {:>8} {:>13} {:>10.1} {:>8}",
        name,
        g("iops_median").unwrap_or(0.0),
        format!(
            "{:.0}-{:.0}",
            g("iops_min").unwrap_or(0.0),
            g("iops_max").unwrap_or(0.0)
        ),
        format!("{:.1}%", g("spread_pct").unwrap_or(0.0)),
        g("lat_p50_us_median").unwrap_or(0.0),
        g("lat_p99_us_median").unwrap_or(0.0),
        opt(g("server_cpu_utilization_median"), &|x| format!(
            "{:.0}%",
            x * 100.0
        )),
        opt(g("server_cpu_us_per_io_median"), &|x| format!("{x:.1}")),
        g("fio_cpu_us_per_io_median").unwrap_or(0.0),
        opt(g("read_hit_ratio_median").filter(|_| hits), &|h| format!(
            "{:.1}%",
            h * 100.0
        )),
    );
}

fn header(t: &mut String) {
    let _ = writeln!(
        t,
        "{:<20} {:>8} {:>15} {:>7} {:>7} {:>8} {:>8} {:>13} {:>10} {:>8}",
        "config",
        "IOPS med",
        "min-max",
        "spread",
        "p50 us",
        "p99 us",
        "srv CPU",
        "srv CPU-us/IO",
        "fio CPU-us",
        "rd hits"
    );
}

/// What each part's summary reads.
struct Sums<'a> {
    plan: &'a Plan,
    rep: &'a Report,
    /// The note a --quick run's headings end with.
    q: &'a str,
}

/// The printed tables and the JSON summary (with the targets met or not).
pub(super) fn summarize(plan: &Plan, rep: &Report) -> (String, Value) {
    let mut t = String::new();
    let mut out = json!({});
    let mut targets = Vec::new();
    let q = if plan.quick {
        " [--quick: smoke run, not a measurement]"
    } else {
        ""
    };
    let s = Sums { plan, rep, q };
    if let Some(v) = p1_summary(&s, &mut t, &mut targets) {
        out["p1"] = v;
    }
    if let Some(v) = conns_summary(&s, &mut t) {
        out["connections"] = v;
    }
    if let Some(v) = p2_summary(&s, &mut t, &mut targets) {
        out["p2"] = v;
    }
    let _ = writeln!(
        t,
        "spread = (max - min) / median over the rounds; srv CPU = the server processes' CPU use (100% = one CPU); CPU-us/IO = CPU time per IO (server: /proc utime+stime; fio: usr+sys)"
    );
    if !targets.is_empty() {
        let met = targets.iter().filter(|x| x["met"] == json!(true)).count();
        let _ = writeln!(
            t,
            "targets met: {met} of {} (docs/TARGETS.md)",
            targets.len()
        );
    }
    out["targets"] = json!(targets);
    (t, out)
}

/// P1: the table of its configurations and the ram and file targets (into `t` and
/// `targets`); its JSON, None when P1 did not run.
fn p1_summary(s: &Sums, t: &mut String, targets: &mut Vec<Value>) -> Option<Value> {
    let (plan, rep, q) = (s.plan, s.rep, s.q);
    if !(rep.runs.iter().any(|r| r.part == "P1")) {
        return None;
    }
    let p1_cfgs = [
        "tiercache-ram",
        "tiercache-file",
        "tiercache-pt-file",
        "nbdkit-memory",
        "fio-io_uring-device",
    ];
    let _ = writeln!(
        t,
        "P1: 4K random read, QD {}, 1 connection, unix socket, 100% hits; median of {} alternating rounds{q}",
        plan.qd, plan.rounds
    );
    header(t);
    let mut sums = json!({});
    for c in p1_cfgs {
        let runs = measured(rep, "P1", c, 1);
        if runs.is_empty() {
            continue;
        }
        let s = cfg_summary(&runs);
        row(t, c, &s, c.starts_with("tiercache"));
        sums[c] = s;
    }
    let ram = measured(rep, "P1", "tiercache-ram", 1);
    let file = measured(rep, "P1", "tiercache-file", 1);
    let mem = measured(rep, "P1", "nbdkit-memory", 1);
    let dev = measured(rep, "P1", "fio-io_uring-device", 1);
    let med = |v: &[&Run]| median_min_max(&v.iter().map(|r| r.iops).collect::<Vec<_>>()).0;
    let mut ratios = json!({});
    // Median server CPU-µs per IO (fio's own for the device run).
    let cpu = |v: &[&Run], fio: bool| {
        let x: Vec<f64> = v
            .iter()
            .filter_map(|r| {
                if fio {
                    Some(r.fio_cpu_us_per_io)
                } else {
                    r.server_cpu_us_per_io
                }
            })
            .collect();
        (!x.is_empty()).then(|| median_min_max(&x).0)
    };
    if !ram.is_empty() && !mem.is_empty() {
        let x = med(&ram) / med(&mem).max(1e-9);
        let per = round_ratios(&ram, &mem, &|a, b| a.iops / b.iops.max(1e-9));
        let (_, lo, hi) = median_min_max(&per);
        let (c, cmax) = (cpu(&ram, false), cpu(&mem, false).map(|m| 0.6 * m));
        let cpu_met = matches!((c, cmax), (Some(c), Some(m)) if c <= m);
        let met = x >= 1.5 && cpu_met;
        let _ = writeln!(
            t,
            "P1 ram: tiercache ram: / nbdkit memory = {x:.2}x (per round {lo:.2}-{hi:.2}; target >= 1.5); server {} CPU-us per hit (target <= 0.6x nbdkit memory's = {}): {}",
            fmt_opt(c),
            fmt_opt(cmax),
            verdict_met(met)
        );
        // The load generator's own ceiling: fio's nbd engine on one pinned CPU. When it is
        // (nearly) saturated for both servers, the ratio measures the client, not the servers.
        let busy = |v: &[&Run]| {
            median_min_max(
                &v.iter()
                    .map(|r| r.fio_usr_pct + r.fio_sys_pct)
                    .collect::<Vec<_>>(),
            )
            .0
        };
        let (bt, bn) = (busy(&ram), busy(&mem));
        let bound = bt >= 90.0;
        let _ = writeln!(
            t,
            "P1 ram: the client (fio, pinned to CPU {}) was {bt:.0}% busy with tiercache and {bn:.0}% with nbdkit memory{}",
            plan.client_cpu,
            if bound {
                ": tiercache's figure is the load generator's ceiling on this machine, not the server's"
            } else {
                ""
            }
        );
        ratios["ram_over_nbdkit_memory"] = json!({"ratio": x, "per_round": per,
            "target": 1.5, "cpu_us_per_io": c, "cpu_target_us": cmax, "met": met,
            "client_busy_pct": bt, "nbdkit_client_busy_pct": bn, "client_bound": bound});
        targets.push(json!({"id": "P1-ram", "ratio": x, "target": 1.5, "met": met}));
    }
    if !file.is_empty() && !mem.is_empty() && !dev.is_empty() {
        let floor = med(&mem).min(med(&dev));
        let x = med(&file) / floor.max(1e-9);
        let per = file
            .iter()
            .filter_map(|f| {
                let m = mem.iter().find(|r| r.round == f.round)?;
                let d = dev.iter().find(|r| r.round == f.round)?;
                Some(f.iops / m.iops.min(d.iops).max(1e-9))
            })
            .collect::<Vec<_>>();
        let (_, lo, hi) = median_min_max(&per);
        let (c, fio) = (cpu(&file, false), cpu(&dev, true));
        let cmax = fio.map(|f| 1.5 * f);
        let cpu_met = matches!((c, cmax), (Some(c), Some(m)) if c <= m);
        let met = x >= 0.9 && cpu_met;
        let _ = writeln!(
            t,
            "P1 file: tiercache file / min(nbdkit memory, fio io_uring on the cache file) = {x:.2}x (per round {lo:.2}-{hi:.2}; target >= 0.9); server {} CPU-us per hit (target <= 1.5x fio's {} = {}): {}",
            fmt_opt(c),
            fmt_opt(fio),
            fmt_opt(cmax),
            verdict_met(met)
        );
        ratios["file_over_min_nbdkit_device"] = json!({"ratio": x, "per_round": per,
            "floor_iops": floor, "target": 0.9, "cpu_us_per_io": c, "cpu_target_us": cmax,
            "met": met});
        targets.push(json!({"id": "P1-file", "ratio": x, "target": 0.9, "met": met}));
    }
    let pt = measured(rep, "P1", "tiercache-pt-file", 1);
    if !file.is_empty() && !pt.is_empty() {
        let x = med(&file) / med(&pt).max(1e-9);
        let per = round_ratios(&file, &pt, &|a, b| a.iops / b.iops.max(1e-9));
        let (_, lo, hi) = median_min_max(&per);
        let (cf, cp) = (cpu(&file, false), cpu(&pt, false));
        let _ = writeln!(
            t,
            "P1 file, the structure's floor: tiercache file hits / tiercache pt on a file (every read to the device, no cache logic) = {x:.2}x (per round {lo:.2}-{hi:.2}); server {} vs {} CPU-us per IO",
            fmt_opt(cf),
            fmt_opt(cp),
        );
        ratios["file_over_pt_file"] = json!({"ratio": x, "per_round": per,
            "cpu_us_per_io": cf, "pt_cpu_us_per_io": cp});
    }
    let low_hits = rep
        .runs
        .iter()
        .filter(|r| r.part == "P1" && r.read_hit_ratio.is_some_and(|h| h < 0.99))
        .count();
    if low_hits > 0 {
        let _ = writeln!(
            t,
            "P1 warning: {low_hits} tiercache runs had a read hit ratio below 99%"
        );
    }
    t.push('\n');
    Some(json!({"configs": sums, "ratios": ratios}))
}

/// The connection sweep: its table (into `t`); its JSON, None when it did not run.
fn conns_summary(s: &Sums, t: &mut String) -> Option<Value> {
    let (plan, rep, q) = (s.plan, s.rep, s.q);
    if !(rep.runs.iter().any(|r| r.part == "conns")) {
        return None;
    }
    let _ = writeln!(
        t,
        "Connections: 4K random read hits, QD {} per connection (fio numjobs = connections), median of {} round{}{q}",
        plan.qd,
        plan.conn_rounds,
        if plan.conn_rounds == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        t,
        "{:>5} {:>14} {:>8} {:>12} {:>14} {:>8} {:>12} {:>9}",
        "conns",
        "tiercache ram",
        "spread",
        "srv CPU-us",
        "nbdkit memory",
        "spread",
        "srv CPU-us",
        "ratio"
    );
    let mut rows = Vec::new();
    for n in 1..=plan.max_conns {
        let a = measured(rep, "conns", "tiercache-ram", n);
        let b = measured(rep, "conns", "nbdkit-memory", n);
        if a.is_empty() && b.is_empty() {
            continue;
        }
        let sa = cfg_summary(&a);
        let sb = cfg_summary(&b);
        let g = |s: &Value, k: &str| s[k].as_f64().unwrap_or(0.0);
        let ratio = g(&sa, "iops_median") / g(&sb, "iops_median").max(1e-9);
        let cpu = |s: &Value| {
            s["server_cpu_us_per_io_median"]
                .as_f64()
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            t,
            "{:>5} {:>14.0} {:>7.1}% {:>12} {:>14.0} {:>7.1}% {:>12} {:>8.2}x",
            n,
            g(&sa, "iops_median"),
            g(&sa, "spread_pct"),
            cpu(&sa),
            g(&sb, "iops_median"),
            g(&sb, "spread_pct"),
            cpu(&sb),
            ratio
        );
        rows.push(
            json!({"connections": n, "tiercache_ram": sa, "nbdkit_memory": sb,
            "ratio": ratio}),
        );
    }
    t.push('\n');
    Some(json!(rows))
}

/// P2: the table of tiercache and nbdkit's cache filter and the target (into `t` and
/// `targets`); its JSON, None when P2 did not run.
fn p2_summary(s: &Sums, t: &mut String, targets: &mut Vec<Value>) -> Option<Value> {
    let (plan, rep, q) = (s.plan, s.rep, s.q);
    if !(rep.runs.iter().any(|r| r.part == "P2")) {
        return None;
    }
    let _ = writeln!(
        t,
        "P2: 4K randrw 70/30, Zipf 0.9, working set {} MiB = 2x the cache, QD {}, cores nbdkit delay {}; median of {} alternating rounds after {} s of warm-up each{q}",
        (2 * plan.s2) >> 20,
        plan.qd,
        plan.delay,
        plan.rounds,
        plan.warm2_ms / 1000
    );
    header(t);
    let mut sums = json!({});
    for c in ["tiercache", "nbdkit-cache"] {
        let runs = measured(rep, "P2", c, 1);
        if runs.is_empty() {
            continue;
        }
        let s = cfg_summary(&runs);
        row(t, c, &s, true);
        sums[c] = s;
    }
    let a = measured(rep, "P2", "tiercache", 1);
    let b = measured(rep, "P2", "nbdkit-cache", 1);
    let mut ratios = json!({});
    if !a.is_empty() && !b.is_empty() {
        let med = |v: &[&Run]| median_min_max(&v.iter().map(|r| r.iops).collect::<Vec<_>>()).0;
        let x = med(&a) / med(&b).max(1e-9);
        let per = round_ratios(&a, &b, &|x, y| x.iops / y.iops.max(1e-9));
        let (_, lo, hi) = median_min_max(&per);
        let _ = writeln!(
            t,
            "P2: tiercache / nbdkit cache filter = {x:.2}x (per round {lo:.2}-{hi:.2}); target >= 1.5: {}",
            verdict(x, 1.5)
        );
        let hit = |v: &[&Run]| median_some(&v.iter().map(|r| r.read_hit_ratio).collect::<Vec<_>>());
        let all = median_some(&a.iter().map(|r| r.hit_ratio).collect::<Vec<_>>());
        let _ = writeln!(
            t,
            "P2 read hit ratios: tiercache {} (reads and writes: {}; its counters), nbdkit cache {} (1 - reads reaching the core / client reads, from a log filter under the cache; nbdkit reports no hit counter)",
            hit(&a)
                .map(|h| format!("{:.1}%", h * 100.0))
                .unwrap_or_else(|| "-".into()),
            all.map(|h| format!("{:.1}%", h * 100.0))
                .unwrap_or_else(|| "-".into()),
            hit(&b)
                .map(|h| format!("{:.1}%", h * 100.0))
                .unwrap_or_else(|| "-".into()),
        );
        ratios["tiercache_over_nbdkit_cache"] = json!({"ratio": x, "per_round": per,
            "target": 1.5, "met": x >= 1.5});
        targets.push(json!({"id": "P2", "ratio": x, "target": 1.5, "met": x >= 1.5}));
    }
    t.push('\n');
    Some(json!({"configs": sums, "ratios": ratios}))
}
