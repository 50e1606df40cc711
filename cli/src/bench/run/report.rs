//! `tiercache bench`'s results: the table, the SPEC targets it checks, the cache device's own
//! ceiling, and the report files (`results.json`, `report.md`, `report.html`, the plots).

use super::{Args, CACHED_RAM, LIBRBD, LIBRBD_WB, NBDKIT_CACHE, RunResult};
use crate::bench::kit::fio::{Workload, parse_fio, run_fio, run_fio_size};
use crate::bench::kit::procs::stopped_by;
use crate::bench::kit::report::{Bar, git_commit, report_header, verdict};
use crate::bench_ceph::FioTarget;
use crate::svg;
use serde_json::{Value, json};
use std::path::Path;

/// What each configuration of the table is, and where its cache lives.
pub(super) fn legend(a: &Args, core: &str, peers: &[&str]) -> String {
    let mut t = format!(
        "baseline: the bare core, {core}\ncached: tiercache {} on a {} file cache (O_DIRECT: the device a deployment uses), sequential cutoff {}\n",
        a.mode, a.cache_size, a.seq_cutoff
    );
    for p in peers {
        t += match *p {
            CACHED_RAM => {
                "cached-ram: tiercache wt on a ram: cache of the same size (process memory, like nbdkit's page-cache-backed filter; wt: a write reaches the core before its reply, as a volatile cache must); 4K random rows only\n"
            }
            NBDKIT_CACHE => {
                "nbdkit-cache: nbdkit's cache filter (writeback, 4K blocks, cache-on-read) over its own copy of the core; its cache is a deleted temp file, i.e. the page cache, lost with the process\n"
            }
            LIBRBD => "librbd: fio's rbd engine on its own image, rbd_cache = false\n",
            LIBRBD_WB => "librbd-wb: fio's rbd engine with librbd's in-memory writeback cache\n",
            _ => "",
        };
    }
    t
}

pub(super) fn table(results: &[RunResult]) -> String {
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

/// The cache device's own IOPS for P3's workloads: fio (io_uring, `O_DIRECT`) on a file of
/// the working set's size beside the cache file, written end to end first (a read of a hole
/// never reaches the device), at the matrix's queue depth and run time. A run that fails is
/// left out (said on stderr).
pub(super) fn device_ceiling(
    scratch: &Path,
    selected: &[&Workload],
    ws: u64,
    qd: u32,
    runtime: u64,
    bar: &Bar,
) -> Vec<(String, f64)> {
    let path = scratch.join("device-ceiling.img");
    let target = FioTarget::File { path: path.clone() };
    let fill = Workload {
        name: "device-fill",
        rw: "write",
        bs: "1m",
        mix: None,
        random: false,
    };
    let mut out = Vec::new();
    let label = "the cache device alone: writing the file";
    let filled = run_fio_size(&target, &fill, ws, 600, &|f| bar.show(label, f));
    bar.end();
    if let Err(e) = filled {
        eprintln!("{label}: {e}");
    } else {
        for w in selected
            .iter()
            .filter(|w| ["randread-4k", "randwrite-4k"].contains(&w.name))
        {
            let label = format!("the cache device alone: {}", w.name);
            let v = run_fio(&target, w, ws, qd, runtime, &|f| bar.show(&label, f))
                .and_then(|v| parse_fio(&v));
            bar.end();
            match v {
                Ok(n) => out.push((w.name.to_string(), n.0)),
                Err(e) => eprintln!("{label}: {e}"),
            }
        }
    }
    let _ = std::fs::remove_file(&path);
    out
}

/// SPEC P3 and the matrix's half of P4 from the matrix's runs, with the cache device's own
/// IOPS (`ceiling`) beside P3's rows: (JSON, text).
pub(super) fn p3_summary(
    results: &[RunResult],
    ceiling: &[(String, f64)],
) -> (Value, Option<String>) {
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
                "{} P3 {name}: {x:.1}x the uncached IOPS (target >= {want}x), p99 {lat:.1}% of uncached (target <= 1%)\n",
                verdict(x >= want && lat <= 1.0)
            );
            if let Some((_, d)) = ceiling.iter().find(|(n, _)| n == w) {
                let most = d / b.iops.max(1e-9);
                v[format!("p3_{w}")]["device_iops"] = json!(d);
                v[format!("p3_{w}")]["device_ceiling_speedup"] = json!(most);
                t += &format!(
                    "     the cache device alone (fio io_uring O_DIRECT, same QD): {d:.0} IOPS, so at most {most:.1}x on this machine; tiercache reaches {:.0}% of the device\n",
                    c.iops / d.max(1e-9) * 100.0
                );
            }
        }
    }
    for w in ["seqread-512k", "seqwrite-512k"] {
        if let (Some(b), Some(c)) = (get(w, "baseline"), get(w, "cached")) {
            let loss = (1.0 - c.bw_mbps / b.bw_mbps.max(1e-9)) * 100.0;
            v[format!("p4_{w}")] = json!({"bandwidth_loss_pct": loss, "target_pct": 2.0,
                "met": loss <= 2.0});
            t += &format!(
                "{} P4 {w} with the cutoff: {loss:.1}% bandwidth loss vs uncached (target <= 2%)\n",
                verdict(loss <= 2.0)
            );
        }
    }
    (
        v,
        (!t.is_empty()).then(|| format!("\nTargets (docs/TARGETS.md says what each id asks)\n{t}")),
    )
}

/// On an RBD core: how tiercache and librbd's writeback cache compare with the bare image and
/// with each other, per workload: (JSON, text).
pub(super) fn ceph_summary(results: &[RunResult]) -> (Value, Option<String>) {
    let get = |w: &str, c: &str| results.iter().find(|r| r.workload == w && r.config == c);
    let mut v = json!({});
    let mut t = String::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in results {
        if !seen.contains(&r.workload.as_str()) {
            seen.push(&r.workload);
        }
    }
    for w in seen {
        let Some(b) = get(w, "baseline") else {
            continue;
        };
        let mut parts = Vec::new();
        let mut row = json!({});
        for c in ["cached", LIBRBD, LIBRBD_WB] {
            if let Some(r) = get(w, c) {
                let x = r.iops / b.iops.max(1e-9);
                let p99 = r.lat_p99_us / b.lat_p99_us.max(1e-9);
                row[c] = json!({"iops_vs_baseline": x, "p99_vs_baseline": p99});
                parts.push(format!("{c} {x:.2}x IOPS, p99 {p99:.2}x"));
            }
        }
        if let (Some(c), Some(p)) = (get(w, "cached"), get(w, LIBRBD_WB)) {
            let x = c.iops / p.iops.max(1e-9);
            row["cached_vs_librbd_wb"] = json!(x);
            parts.push(format!("tiercache {x:.2}x librbd-wb"));
        }
        v[w] = row;
        t += &format!("{w:<14} vs the bare image: {}\n", parts.join("; "));
    }
    (
        json!({ "ceph": v }),
        (!t.is_empty()).then(|| format!("\nOn Ceph\n{t}")),
    )
}

/// What a report holds: the run's parameters and what it measured.
pub(super) struct ReportInfo<'a> {
    pub(super) a: &'a Args,
    pub(super) runtime: u64,
    pub(super) generator: &'a str,
    /// The core devices, for people.
    pub(super) core: &'a str,
    /// The cluster and client configurations (rbd), else `{}`.
    pub(super) setup: &'a Value,
    pub(super) peers: &'a [&'a str],
    pub(super) results: &'a [RunResult],
    /// The printed table and legend.
    pub(super) table: &'a str,
    /// The targets: (JSON, text).
    pub(super) targets: &'a (Value, Option<String>),
    pub(super) stopped: bool,
}

/// Writes the report into `--out`: `results.json`, the plots, `report.md` and `report.html`.
pub(super) fn write_report(r: &ReportInfo) -> Result<(), String> {
    let w = |name: &str, body: &str| -> Result<(), String> {
        let p = r.a.out_dir().join(name);
        std::fs::write(&p, body).map_err(|e| format!("{}: {e}", p.display()))
    };
    w(
        "results.json",
        &serde_json::to_string_pretty(&results_json(r)).unwrap_or_default(),
    )?;
    let plots = plots(r);
    w("iops.svg", &plots.iops)?;
    w("p99.svg", &plots.p99)?;
    w("latency-cdf.svg", &plots.cdf)?;
    if let Some(s) = &plots.over_time {
        w("randwrite-over-time.svg", s)?;
    }
    w("report.md", &report_md(r, plots.over_time.is_some()))?;
    w("report.html", &report_html(r, plots))?;
    Ok(())
}

/// `results.json`: the header, the configuration, every run, the targets.
fn results_json(r: &ReportInfo) -> Value {
    let (a, runtime, results, targets, stopped) = (r.a, r.runtime, r.results, r.targets, r.stopped);
    let (generator, peers) = (r.generator, r.peers);
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
    report_header(
        "tiercache bench",
        json!({
        "config": {
            "quick": a.quick, "runtime_s": runtime, "iodepth": a.iodepth, "mode": a.mode,
            "core": r.core, "cache_size": a.cache_size, "ceph": r.setup,
            "working_set": a.working_set, "load_generator": generator,
            "seq_cutoff": a.seq_cutoff, "peers": peers,
        },
        "stopped_early": stopped,
        "runs": runs,
        "spec_targets": targets.0,
        }),
    )
}

/// The plots of a report (SVG).
struct Plots {
    iops: String,
    p99: String,
    cdf: String,
    /// The cached 4K random writes' IOPS and dirty % per second, if they ran.
    over_time: Option<String>,
}

fn plots(r: &ReportInfo) -> Plots {
    let (results, peers) = (r.results, r.peers);
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
    // Bars per workload and configuration, on a log scale.
    let bars = |title: &str, unit: &str, f: &dyn Fn(&RunResult) -> f64| {
        svg::bars(title, unit, &cats, &series(f), true)
    };
    let iops = bars("IOPS per workload (log scale)", "IOPS", &|r| r.iops);
    let p99 = bars("p99 latency per workload (log scale)", "µs", &|r| {
        r.lat_p99_us
    });
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
    Plots {
        iops,
        p99,
        cdf,
        over_time,
    }
}

/// `report.md`: the table and the targets, with what the configurations are.
fn report_md(r: &ReportInfo, over_time: bool) -> String {
    let (a, runtime, table, targets, stopped) = (r.a, r.runtime, r.table, r.targets, r.stopped);
    let peers = r.peers;
    let md = format!(
        "# tiercache bench\n\ncommit {}, {} s per run, QD {}, cache mode {} (sequential cutoff {}), core {}, cache {} file, working set {}.{}\n\n```\n{}```\n\nPlots: iops.svg, p99.svg, latency-cdf.svg{}; raw numbers: results.json.\n\nHit ratio and dirty % are the server's own counters, reset before each cached run. The baseline is {}, served bare by the same NBD server.{}{}\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        a.seq_cutoff,
        r.core,
        a.cache_size,
        a.working_set,
        if stopped {
            format!(" Stopped early ({}): partial results.", stopped_by())
        } else {
            String::new()
        },
        table,
        if over_time {
            ", randwrite-over-time.svg"
        } else {
            ""
        },
        if a.core == "rbd" {
            "another RBD image of the same size, written the same way"
        } else {
            "the same emulated device model on its own file"
        },
        if peers.contains(&NBDKIT_CACHE) {
            " `nbdkit-cache` is nbdkit's cache filter (writeback, 4K blocks, cache-on-read, as big as tiercache's cache, its cache file in the scratch directory) over its own copy of the emulated core, reached through nbdkit's nbd plugin; warmed the same way; its hit ratio is not known."
        } else {
            ""
        },
        if peers.contains(&LIBRBD) || peers.contains(&LIBRBD_WB) {
            " `librbd` and `librbd-wb` are fio's rbd engine on a third image, with `rbd_cache = false` and with librbd's in-memory writeback cache (`rbd_cache = true`, policy writeback, `rbd_cache_writethrough_until_flush = false`, librbd's default 32 MiB); their cache lives in each run's fio process, so they start cold; their hit ratio is not known."
        } else {
            ""
        }
    );
    match &targets.1 {
        Some(t) => {
            // The text's first line is its heading ("SPEC targets", "On Ceph").
            let (head, body) = t
                .trim_start_matches('\n')
                .split_once('\n')
                .unwrap_or(("", t));
            format!("{md}\n## {head}\n\n```\n{body}```\n")
        }
        None => md,
    }
}

/// `report.html`: self-contained, the plots inline.
fn report_html(r: &ReportInfo, plots: Plots) -> String {
    let (a, runtime, table, targets, stopped) = (r.a, r.runtime, r.table, r.targets, r.stopped);
    let Plots {
        iops,
        p99,
        cdf,
        over_time,
    } = plots;
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tiercache bench</title>\n<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head><body>\n<h1>tiercache bench</h1>\n<p>commit {}, {} s per run, QD {}, cache mode {}, core {}, cache {} file, working set {}.{}</p>\n<pre>{}</pre>\n{}\n{}\n{}\n{}\n<p>Raw numbers: results.json. Hit ratio and dirty % are the server's own counters.</p>\n</body></html>\n",
        git_commit(),
        runtime,
        a.iodepth,
        a.mode,
        r.core,
        a.cache_size,
        a.working_set,
        if stopped {
            format!(" <b>Stopped early ({}): partial results.</b>", stopped_by())
        } else {
            String::new()
        },
        (table.to_string() + targets.1.as_deref().unwrap_or(""))
            .replace('&', "&amp;")
            .replace('<', "&lt;"),
        iops,
        p99,
        over_time.unwrap_or_default(),
        cdf
    )
}
