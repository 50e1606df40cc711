//! `tiercache sim`: run a simulation scenario (shipped or from a file) and print the
//! baseline-vs-cached table; optionally write JSON and a time-series CSV.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::json;
use tiercache_sim::scenario::{Run, SHIPPED, Scenario};
use tiercache_sim::trace::DeviceSel;

/// Arguments of `tiercache sim`.
#[derive(clap::Args)]
pub struct Args {
    /// A shipped scenario name (see --list) or a path to a scenario .toml file.
    scenario: Option<String>,
    /// List the shipped scenarios.
    #[arg(long)]
    list: bool,
    /// Seed (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Run only workloads whose name contains this text.
    #[arg(long)]
    only: Option<String>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Write the per-interval time series as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<String>,
    /// Print the scenario's description and exit.
    #[arg(long)]
    about: bool,
    /// Replay a block trace instead of the scenario's workloads, under each of its configs
    /// (formats as for `sim mrc`; the volume grows to hold the trace).
    #[arg(long, value_name = "FILE")]
    trace: Option<String>,
    /// The trace's format (auto, csv, blkparse, msr, alibaba, tencent, vscsi,
    /// oracle-general, fio-iolog).
    #[arg(long, default_value = "auto", requires = "trace", value_parser = crate::choices::trace_formats())]
    format: String,
    /// The trace's device, for multi-device traces (or `all`).
    #[arg(long, value_name = "ID", requires = "trace")]
    device: Option<String>,
    /// Stop at the trace's first bad record.
    #[arg(long, requires = "trace")]
    strict: bool,
    /// Override every workload's measured duration, simulated seconds (quick looks).
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
}

/// Runs the command.
pub fn run(args: Args) -> Result<(), String> {
    if args.list {
        for (name, text) in SHIPPED {
            let s = Scenario::parse(text)?;
            println!("{name:<20} {}", s.title);
        }
        return Ok(());
    }
    let Some(name) = args.scenario else {
        return Err("name a scenario (tiercache sim --list shows the shipped ones)".into());
    };
    let mut sc = Scenario::load(&name)?;
    if args.about {
        println!("{}\n{}", sc.title, sc.about.trim_end());
        return Ok(());
    }
    if let Some(f) = &args.only {
        sc.workload.retain(|w| w.name.contains(f.as_str()));
        if sc.workload.is_empty() {
            return Err(format!("no workload of {name} matches '{f}'"));
        }
    }
    if let Some(d) = args.duration {
        if !(d > 0.0 && d <= 86_400.0) {
            return Err(format!("--duration {d}: give seconds in (0, 86400]"));
        }
        sc.workload.iter_mut().for_each(|w| w.duration_s = d);
    }
    let seed = args.seed.unwrap_or(sc.seed);
    println!("tiercache sim {} (seed {seed})\n  {}", sc.name, sc.title);
    let t0 = Instant::now();
    let runs = if let Some(path) = &args.trace {
        let ta = crate::sim_mrc::TraceArgs {
            trace: path.clone(),
            format: args.format.clone(),
            device: args.device.clone(),
            strict: args.strict,
        };
        let t = ta.read(DeviceSel::parse(args.device.as_deref()))?;
        let (entries, skipped) = tiercache_sim::workload::trace_entries(&t.requests);
        if skipped > 0 {
            println!(
                "  {skipped} trims and flushes are not replayed (the client model reads and writes)"
            );
        }
        if entries.is_empty() {
            return Err(format!("{path}: no reads or writes in the trace"));
        }
        if let Some(gib) = sc.fit_volume(t.max_end()) {
            println!("  volume grown to {gib} GiB to hold the trace");
        }
        let name = format!(
            "trace {}",
            std::path::Path::new(path)
                .file_name()
                .map_or(path.as_str(), |f| f.to_str().unwrap_or(path))
        );
        sc.workload.truncate(1);
        sc.workload[0].name = name.clone();
        let mut out = Vec::new();
        for c in &sc.config {
            let r = sc.run_trace(&entries, c)?;
            println!(
                "  ran {name:<18} {:<9} {:>10.0} IOPS  ({} events){}",
                c.name,
                r.iops(),
                r.events,
                r.hits.as_ref().map_or(String::new(), |h| format!(
                    "; hit ratio {:.4} (reads {:.4}, writes {:.4}), {} partial hits",
                    1.0 - h.miss_ratio(),
                    1.0 - h.read_miss_ratio(),
                    1.0 - h.write_miss_ratio(),
                    h.partial_hits
                ))
            );
            out.push(Run {
                workload: name.clone(),
                config: c.name.clone(),
                result: r,
            });
        }
        out
    } else {
        sc.run_all(seed, |w, c, r| {
            println!(
                "  ran {w:<18} {c:<9} {:>10.0} IOPS  ({} events, {:.1} s wall)",
                r.iops(),
                r.events,
                t0.elapsed().as_secs_f64()
            );
        })?
    };
    let wall = t0.elapsed().as_secs_f64();
    print!("{}", table(&sc, &runs));
    let sim_s: f64 = runs.iter().map(|r| r.result.seconds + sc.warmup_s).sum();
    let events: u64 = runs.iter().map(|r| r.result.events).sum();
    println!(
        "\nsimulated {sim_s:.1} s in {wall:.1} s wall ({:.0} events/s, {events} events)",
        events as f64 / wall.max(1e-9)
    );
    if let Some(path) = &args.json {
        let v = to_json(&sc, seed, &runs);
        std::fs::write(path, serde_json::to_string_pretty(&v).expect("json"))
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }
    if let Some(path) = &args.csv {
        let mut out = String::from(
            "scenario,workload,config,t_s,iops,lat_mean_us,lat_p99_us,dirty_pct,writeback_lines_s\n",
        );
        for r in &runs {
            for s in &r.result.series {
                let _ = writeln!(
                    out,
                    "{},{},{},{:.3},{:.1},{:.1},{:.1},{:.2},{:.1}",
                    sc.name,
                    r.workload,
                    r.config,
                    s.t_s,
                    s.iops,
                    s.lat_mean_us,
                    s.lat_p99_us,
                    s.dirty_pct,
                    s.writeback_lines_s
                );
            }
        }
        std::fs::write(path, out).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {path}");
    }
    Ok(())
}

fn table(sc: &Scenario, runs: &[Run]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n  {:<18} {:<9} {:>10} {:>9} {:>10} {:>10} {:>9}",
        "workload", "config", "IOPS", "MB/s", "mean us", "p99 us", "vs first"
    );
    for w in &sc.workload {
        let rows: Vec<&Run> = runs.iter().filter(|r| r.workload == w.name).collect();
        let Some(first) = rows.first() else { continue };
        let base = first.result.iops();
        for r in &rows {
            let x = &r.result;
            let _ = writeln!(
                o,
                "  {:<18} {:<9} {:>10.0} {:>9.1} {:>10.0} {:>10.0} {:>8.2}x",
                r.workload,
                r.config,
                x.iops(),
                x.mb_s(),
                x.latency.mean_ns() / 1e3,
                x.latency.quantile_ns(0.99) as f64 / 1e3,
                x.iops() / base.max(1e-9)
            );
        }
        if let Some(p) = sc.published.iter().find(|p| p.workload == w.name)
            && rows.len() >= 2
        {
            let ours = rows[1].result.iops() / base.max(1e-9);
            let _ = writeln!(
                o,
                "  {:<18} published {} ({}); predicted here x{ours:.2} vs x{:.2}",
                "", p.figure, p.source, p.ratio
            );
            if !p.why_different.is_empty() {
                let _ = writeln!(o, "  {:<18} why: {}", "", p.why_different.trim());
            }
        }
    }
    if sc.show_series {
        for r in runs {
            let _ = writeln!(
                o,
                "\n  {} / {}: per {:.1} s",
                r.workload, r.config, sc.sample_s
            );
            let _ = writeln!(
                o,
                "  {:>6} {:>7} {:>9} {:>10} {:>10} {:>9}  dirty",
                "t s", "dirty%", "IOPS", "mean us", "p99 us", "wb/s"
            );
            for s in &r.result.series {
                let bar = "#".repeat((s.dirty_pct / 5.0).round() as usize);
                let _ = writeln!(
                    o,
                    "  {:>6.1} {:>7.1} {:>9.0} {:>10.0} {:>10.0} {:>9.0}  {bar}",
                    s.t_s, s.dirty_pct, s.iops, s.lat_mean_us, s.lat_p99_us, s.writeback_lines_s
                );
            }
        }
    }
    o
}

/// The results as JSON. Deterministic: the same scenario and seed give the same bytes (wall
/// time is printed on the terminal only).
fn to_json(sc: &Scenario, seed: u64, runs: &[Run]) -> serde_json::Value {
    json!({
        "scenario": sc.name,
        "title": sc.title,
        "seed": seed,
        "runs": runs.iter().map(|r| {
            let x = &r.result;
            json!({
                "workload": r.workload,
                "config": r.config,
                "iops": x.iops(),
                "mb_s": x.mb_s(),
                "lat_mean_us": x.latency.mean_ns() / 1e3,
                "lat_p99_us": x.latency.quantile_ns(0.99) as f64 / 1e3,
                "ops": x.ops,
                "seconds": x.seconds,
                "events": x.events,
                "hit_ratio": x.hits.as_ref().map(|h| 1.0 - h.miss_ratio()),
                "read_hit_ratio": x.hits.as_ref().map(|h| 1.0 - h.read_miss_ratio()),
                "write_hit_ratio": x.hits.as_ref().map(|h| 1.0 - h.write_miss_ratio()),
                "partial_hits": x.hits.as_ref().map(|h| h.partial_hits),
                "series": x.series,
            })
        }).collect::<Vec<_>>(),
        "published": sc.published.iter().map(|p| json!({
            "workload": p.workload, "figure": p.figure, "ratio": p.ratio, "source": p.source,
            "why_different": p.why_different,
        })).collect::<Vec<_>>(),
    })
}
