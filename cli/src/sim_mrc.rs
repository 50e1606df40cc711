//! `tiercache sim mrc`: the miss-ratio curve of a block trace ("how much cache do I buy?"), and
//! `tiercache sim devices`: the devices a trace holds. See docs/SIZING.md.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::json;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{CutoffPolicy, EvictionPolicy, Named, NhitParams, PromotionPolicy};
use tiercache_core::units::LineSize;
use tiercache_daemon::device::parse_size;
use tiercache_daemon::health::human;
use tiercache_sim::mrc::policy::{MIN_LINES, Policy};
use tiercache_sim::mrc::{Footprint, Point, footprint, knee, max_error, policy, stack};
use tiercache_sim::trace::{DeviceSel, Format, ReadOptions, Request, Trace, read_file};

/// Which trace to read (shared by `sim mrc`, `sim devices` and `sim --trace`).
#[derive(clap::Args, Clone)]
pub struct TraceArgs {
    /// The trace file.
    #[arg(long, value_name = "FILE")]
    pub trace: String,
    /// auto, csv, blkparse, msr, alibaba, tencent, vscsi, oracle-general or fio-iolog.
    #[arg(long, default_value = "auto", value_parser = crate::choices::trace_formats())]
    pub format: String,
    /// The device of a multi-device trace (as `sim devices` lists it), or `all`.
    #[arg(long, value_name = "ID")]
    pub device: Option<String>,
    /// Stop at the first bad record instead of counting it.
    #[arg(long)]
    pub strict: bool,
}

impl TraceArgs {
    /// Reads the trace, printing what was read.
    pub fn read(&self, device: DeviceSel) -> Result<Trace, String> {
        let opts = ReadOptions {
            format: Format::parse(&self.format)?,
            device,
            strict: self.strict,
        };
        let t = read_file(&self.trace, &opts)?;
        println!("{}", t.summary(&self.trace));
        if t.requests.is_empty() {
            return Err(format!("{}: no requests in the trace", self.trace));
        }
        Ok(t)
    }
}

/// Arguments of `tiercache sim devices`.
#[derive(clap::Args)]
pub struct DevicesArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Lists the devices of a trace.
pub fn devices(args: DevicesArgs) -> Result<(), String> {
    let opts = ReadOptions {
        format: Format::parse(&args.trace.format)?,
        device: DeviceSel::All,
        strict: args.trace.strict,
    };
    let t = read_file(&args.trace.trace, &opts)?;
    if args.json {
        let v = json!({
            "trace": args.trace.trace,
            "format": t.format.name(),
            "records": t.records,
            "ignored": t.ignored,
            "bad": t.bad,
            "devices": t.devices.iter().map(|d| json!({
                "id": d.id, "requests": d.requests, "max_end_bytes": d.max_end,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    println!("{}", t.summary(&args.trace.trace));
    println!(
        "  {:<24} {:>12} {:>14}",
        "device", "requests", "highest byte"
    );
    for d in &t.devices {
        let id = if d.id.is_empty() { "-" } else { &d.id };
        println!("  {id:<24} {:>12} {:>14}", d.requests, human(d.max_end));
    }
    Ok(())
}

/// Arguments of `tiercache sim mrc`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    trace: TraceArgs,
    /// Cache sizes: bytes with k/m/g/t (`512m,2g`) or percentages of the footprint
    /// (`1%,5%`). Default: 24 sizes from 0.1% to 100% of the footprint.
    #[arg(long, value_name = "LIST")]
    sizes: Option<String>,
    /// Cache line size: 4k, 8k, 16k, 32k or 64k.
    #[arg(long, default_value = "4k", value_parser = crate::choices::words::<crate::choices::LineSize>())]
    line_size: String,
    /// Cache mode (the core method runs any; the stack method is wt).
    #[arg(long, default_value = "wt", value_parser = crate::choices::words::<crate::choices::Mode>())]
    mode: String,
    /// Eviction: lru or s3fifo.
    #[arg(long, default_value = "lru", value_parser = crate::choices::words::<crate::choices::Eviction>())]
    eviction: String,
    /// Promotion: always or nhit (threshold and trigger below).
    #[arg(long, default_value = "always", value_parser = crate::choices::words::<crate::choices::PromotionPolicy>())]
    promotion: String,
    /// nhit: misses a core line needs to be inserted (2-1000, as `set-param promotion-nhit
    /// --threshold`).
    #[arg(long, value_name = "N", default_value_t = NhitParams::default().threshold, value_parser = clap::value_parser!(u32).range(2..=1000))]
    nhit_threshold: u32,
    /// nhit: occupancy in percent below which every miss is inserted (0-100, as `set-param
    /// promotion-nhit --trigger`); a miss that fits in the free lines always is.
    #[arg(long, value_name = "PCT", default_value_t = NhitParams::default().trigger_pct, value_parser = clap::value_parser!(u32).range(0..=100))]
    nhit_trigger: u32,
    /// Sequential cutoff: always, full or never (threshold 1 MiB).
    #[arg(long, default_value = "never", value_parser = crate::choices::words::<crate::choices::CutoffPolicy>())]
    cutoff: String,
    /// auto, stack (exact textbook LRU, one pass), shards (sampled LRU) or core (the
    /// product's cache core per size). auto: stack when the options are plain LRU
    /// (lru, always, wt, never), shards for those past 50M line accesses, core otherwise.
    #[arg(long, default_value = "auto", value_parser = crate::choices::words::<crate::choices::MrcMethod>())]
    method: String,
    /// SHARDS sampling rate, in (0, 1).
    #[arg(long, default_value_t = 0.01)]
    sample: f64,
    /// Threads for the core method (default: the CPUs available).
    #[arg(long)]
    threads: Option<usize>,
    /// Write the curve as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Write the curve as an SVG chart to FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<String>,
    /// Write the curve as CSV to FILE.
    #[arg(long, value_name = "FILE")]
    csv: Option<String>,
}

/// Line accesses past which `auto` samples (SHARDS) instead of walking every access.
const EXACT_MAX_ACCESSES: u64 = 50_000_000;
/// Line accesses of the prefix on which a SHARDS curve is checked against the exact one.
const CHECK_ACCESSES: u64 = 5_000_000;

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
enum Method {
    Stack,
    Shards,
    Core,
}

impl Method {
    fn describe(self, rate: f64) -> String {
        match self {
            Method::Stack => "exact LRU (stack distances, one pass)".into(),
            Method::Shards => format!("SHARDS-sampled LRU (rate {rate})"),
            Method::Core => "the tiercache core, one run per size".into(),
        }
    }
}

fn parse_choice<T: Copy>(what: &str, s: &str, table: &[(&str, T)]) -> Result<T, String> {
    table
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
            format!("--{what} {s}: use {}", names.join(", "))
        })
}

/// Parses `--sizes` into bytes (percentages of `footprint_bytes`).
fn parse_sizes(list: &str, footprint_bytes: u64) -> Result<Vec<u64>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if let Some(p) = s.strip_suffix('%') {
                let v: f64 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("--sizes: '{s}' is not a percentage"))?;
                if !(v > 0.0 && v <= 1000.0) {
                    return Err(format!("--sizes: '{s}' must be in (0%, 1000%]"));
                }
                Ok((footprint_bytes as f64 * v / 100.0) as u64)
            } else {
                parse_size(s).map_err(|e| format!("--sizes: {e}"))
            }
        })
        .collect()
}

/// The default sizes: 24 log-spaced points from 0.1% to 100% of the footprint, in lines.
fn default_lines(fp_lines: u64) -> Vec<u64> {
    (0..24)
        .map(|i| (fp_lines as f64 * 10f64.powf(-3.0 + 3.0 * i as f64 / 23.0)).round() as u64)
        .collect()
}

/// Runs the command.
pub fn run(args: Args) -> Result<(), String> {
    let line = LineSize::parse(&args.line_size).ok_or_else(|| {
        format!(
            "--line-size {}: use 4k, 8k, 16k, 32k or 64k",
            args.line_size
        )
    })?;
    let lb = line.bytes();
    let mode = CacheMode::parse(&args.mode).ok_or_else(|| {
        format!(
            "--mode {}: use wt, wb, wa, wi, pt or wo (sim mrc does not run the write log, wl)",
            args.mode
        )
    })?;
    // The core's names (`policy::Named`), the lists the CLI's choices are checked against.
    let eviction = parse_choice("eviction", &args.eviction, EvictionPolicy::names())?;
    let promotion = parse_choice("promotion", &args.promotion, PromotionPolicy::names())?;
    let cutoff = parse_choice("cutoff", &args.cutoff, CutoffPolicy::names())?;
    if !(args.sample > 0.0 && args.sample < 1.0) {
        return Err(format!("--sample {}: give a rate in (0, 1)", args.sample));
    }
    let plain_lru = eviction == EvictionPolicy::Lru
        && promotion == PromotionPolicy::Always
        && mode == CacheMode::Wt
        && cutoff == CutoffPolicy::Never;
    let asked = parse_choice(
        "method",
        &args.method,
        &[
            ("auto", None),
            ("stack", Some(Method::Stack)),
            ("shards", Some(Method::Shards)),
            ("core", Some(Method::Core)),
        ],
    )?;
    if matches!(asked, Some(Method::Stack | Method::Shards)) && !plain_lru {
        return Err(format!(
            "--method {}: the stack methods are textbook LRU (--eviction lru --promotion always --mode wt --cutoff never); use --method core for other policies",
            args.method
        ));
    }
    let t = args
        .trace
        .read(DeviceSel::parse(args.trace.device.as_deref()))?;
    let fp = footprint(&t.requests, lb);
    if fp.lines == 0 {
        return Err(format!(
            "{}: no reads or writes in the trace",
            args.trace.trace
        ));
    }
    let method = asked.unwrap_or(if !plain_lru {
        Method::Core
    } else if fp.line_accesses > EXACT_MAX_ACCESSES {
        Method::Shards
    } else {
        Method::Stack
    });
    if method == Method::Stack && fp.line_accesses >= u32::MAX as u64 {
        return Err(format!(
            "{} line accesses is past what --method stack walks (4G); use --method shards",
            fp.line_accesses
        ));
    }
    let fp_bytes = fp.lines * lb;
    let (lines, raised, floor) = sizes(&args, &fp, lb, method)?;
    print_mix(&fp, lb);
    if raised > 0 {
        println!("  {raised} sizes below {floor} lines raised to {floor} lines");
    }
    let t0 = Instant::now();
    let mut shards_check = None;
    let points = match method {
        Method::Stack => {
            let p = stack::profile(&t.requests, lb, 1.0);
            lines.iter().map(|&n| p.point(n)).collect::<Vec<_>>()
        }
        Method::Shards => {
            let p = stack::profile(&t.requests, lb, args.sample);
            let pts: Vec<Point> = lines.iter().map(|&n| p.point(n)).collect();
            shards_check = Some(check_shards(&t.requests, lb, args.sample, &lines));
            pts
        }
        Method::Core => {
            let threads = args
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let policy = Policy {
                line,
                mode,
                eviction,
                promotion,
                nhit: NhitParams {
                    threshold: args.nhit_threshold,
                    trigger_pct: args.nhit_trigger,
                },
                cutoff,
            };
            policy::run(&t.requests, &policy, &lines, threads)?
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "  method: {}; {} sizes in {secs:.2} s ({} line accesses)",
        method.describe(args.sample),
        points.len(),
        fp.line_accesses
    );
    let nhit = if promotion == PromotionPolicy::Nhit {
        format!(
            " (threshold {}, trigger {}%)",
            args.nhit_threshold, args.nhit_trigger
        )
    } else {
        String::new()
    };
    println!(
        "  policy: eviction {}, promotion {}{nhit}, mode {}, cutoff {}, line {}",
        args.eviction, args.promotion, args.mode, args.cutoff, line
    );
    if let Some((err, n)) = shards_check {
        println!(
            "  SHARDS error against the exact curve on the first {n} requests: max |miss ratio difference| {err:.4}"
        );
    }
    print!("{}", table(&points, fp_bytes));
    let k = knee(&points);
    if let Some(i) = k {
        let p = &points[i];
        println!(
            "  knee: {} ({:.1}% of the footprint), miss ratio {:.4}; beyond it each doubling buys less",
            human(p.bytes),
            100.0 * p.bytes as f64 / fp_bytes as f64,
            p.miss_ratio()
        );
    }
    let name = &args.trace.trace;
    if let Some(path) = &args.json {
        let v = to_json(&t, name, &fp, lb, &args, method, &points, k, shards_check);
        write(path, serde_json::to_string_pretty(&v).expect("json") + "\n")?;
    }
    if let Some(path) = &args.csv {
        write_csv(path, &points, fp_bytes)?;
    }
    if let Some(path) = &args.svg {
        write_svg(path, &points, k, name, &method.describe(args.sample))?;
    }
    Ok(())
}

/// The cache sizes to run, in lines (`--sizes`, else [`default_lines`]), sorted, each at
/// least the method's floor: (sizes, how many were raised to it, the floor).
fn sizes(
    args: &Args,
    fp: &Footprint,
    lb: u64,
    method: Method,
) -> Result<(Vec<u64>, usize, u64), String> {
    let fp_bytes = fp.lines * lb;
    let mut lines: Vec<u64> = match &args.sizes {
        Some(list) => parse_sizes(list, fp_bytes)?
            .iter()
            .map(|b| b / lb)
            .collect(),
        None => default_lines(fp.lines),
    };
    let floor = if method == Method::Core { MIN_LINES } else { 1 };
    let raised = lines.iter().filter(|&&l| l < floor).count();
    lines.iter_mut().for_each(|l| *l = (*l).max(floor));
    lines.sort_unstable();
    lines.dedup();
    if lines.is_empty() {
        return Err("--sizes: no sizes given".into());
    }
    Ok((lines, raised, floor))
}

/// `--csv`: one row per size.
fn write_csv(path: &str, points: &[Point], fp_bytes: u64) -> Result<(), String> {
    let mut o = String::from(
        "bytes,lines,footprint_pct,miss_ratio,read_miss_ratio,write_miss_ratio,partial_hits,core_read_bytes,core_write_bytes,writeback_bytes\n",
    );
    for p in points {
        let _ = writeln!(
            o,
            "{},{},{:.3},{:.6},{:.6},{:.6},{},{},{},{}",
            p.bytes,
            p.lines,
            100.0 * p.bytes as f64 / fp_bytes as f64,
            p.miss_ratio(),
            p.read_miss_ratio(),
            p.write_miss_ratio(),
            p.partial_hits,
            p.core_read_bytes,
            p.core_write_bytes,
            p.writeback_bytes
        );
    }
    write(path, o)
}

/// `--svg`: the curves (all, reads, writes) with the knee marked.
fn write_svg(
    path: &str,
    points: &[Point],
    k: Option<usize>,
    name: &str,
    method: &str,
) -> Result<(), String> {
    let mib = |p: &Point| p.bytes as f64 / (1u64 << 20) as f64;
    let series: Vec<(&str, Vec<(f64, f64)>)> = vec![
        (
            "miss ratio",
            points.iter().map(|p| (mib(p), p.miss_ratio())).collect(),
        ),
        (
            "reads",
            points
                .iter()
                .map(|p| (mib(p), p.read_miss_ratio()))
                .collect(),
        ),
        (
            "writes",
            points
                .iter()
                .map(|p| (mib(p), p.write_miss_ratio()))
                .collect(),
        ),
    ];
    let label = k.map(|i| format!("knee {}", human(points[i].bytes)));
    let marks: Vec<(f64, f64, &str)> = k
        .iter()
        .zip(&label)
        .map(|(&i, l)| (mib(&points[i]), points[i].miss_ratio(), l.as_str()))
        .collect();
    let title = format!("miss ratio by cache size: {name} ({})", method);
    let svg = crate::svg::lines_marked(
        &title,
        "cache size, MiB",
        "miss ratio",
        &series,
        true,
        &marks,
    );
    write(path, svg)
}

fn write(path: &str, text: String) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
    println!("wrote {path}");
    Ok(())
}

fn print_mix(fp: &Footprint, lb: u64) {
    let m = &fp.mix;
    let n = m.reads + m.writes;
    println!(
        "  footprint {} ({} lines of {}), {n} reads and writes ({:.1}% reads: {} read, {} written), {} trims, {} flushes",
        human(fp.lines * lb),
        fp.lines,
        human(lb),
        100.0 * m.reads as f64 / n.max(1) as f64,
        human(m.read_bytes),
        human(m.write_bytes),
        fp.trims,
        fp.flushes
    );
}

/// SHARDS against exact on a prefix of the trace: the largest miss-ratio difference at the
/// same sizes (scaled to the prefix's footprint), and the prefix's request count.
fn check_shards(reqs: &[Request], lb: u64, rate: f64, lines: &[u64]) -> (f64, usize) {
    let mut acc = 0u64;
    let n = reqs
        .iter()
        .position(|r| {
            acc += tiercache_sim::mrc::lines_of(r, lb).1;
            acc > CHECK_ACCESSES
        })
        .unwrap_or(reqs.len());
    let prefix = &reqs[..n];
    let whole = footprint(reqs, lb).lines.max(1) as f64;
    let part = footprint(prefix, lb).lines as f64;
    let scaled: Vec<u64> = lines
        .iter()
        .map(|&l| ((l as f64 * part / whole).round() as u64).max(1))
        .collect();
    let exact = stack::profile(prefix, lb, 1.0);
    let sampled = stack::profile(prefix, lb, rate);
    let a: Vec<Point> = scaled.iter().map(|&l| exact.point(l)).collect();
    let b: Vec<Point> = scaled.iter().map(|&l| sampled.point(l)).collect();
    (max_error(&a, &b), n)
}

fn table(points: &[Point], fp_bytes: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\n  {:>11} {:>10} {:>7} {:>7} {:>7} {:>7} {:>9} {:>11} {:>11}",
        "size", "lines", "% fp", "miss", "read", "write", "partial", "core read", "core write"
    );
    for p in points {
        let _ = writeln!(
            o,
            "  {:>11} {:>10} {:>7.2} {:>7.4} {:>7.4} {:>7.4} {:>9} {:>11} {:>11}",
            human(p.bytes),
            p.lines,
            100.0 * p.bytes as f64 / fp_bytes.max(1) as f64,
            p.miss_ratio(),
            p.read_miss_ratio(),
            p.write_miss_ratio(),
            p.partial_hits,
            human(p.core_read_bytes),
            human(p.core_write_bytes)
        );
    }
    o
}

#[allow(clippy::too_many_arguments)]
fn to_json(
    t: &Trace,
    name: &str,
    fp: &Footprint,
    lb: u64,
    args: &Args,
    method: Method,
    points: &[Point],
    knee: Option<usize>,
    shards_check: Option<(f64, usize)>,
) -> serde_json::Value {
    let m = &fp.mix;
    let mut v = json!({
        "trace": {
            "file": name,
            "format": t.format.name(),
            "device": t.device,
            "records": t.records,
            "ignored_records": t.ignored,
            "bad_records": t.bad,
            "widened_to_sectors": t.widened,
            "reordered": t.reordered,
            "other_device_requests": t.other_devices,
            "requests": t.requests.len(),
            "reads": m.reads,
            "writes": m.writes,
            "trims": fp.trims,
            "flushes": fp.flushes,
            "read_bytes": m.read_bytes,
            "write_bytes": m.write_bytes,
            "read_fraction": m.reads as f64 / (m.reads + m.writes).max(1) as f64,
            "line_size": lb,
            "footprint_lines": fp.lines,
            "footprint_bytes": fp.lines * lb,
            "line_accesses": fp.line_accesses,
        },
        "method": match method {
            Method::Stack => "stack",
            Method::Shards => "shards",
            Method::Core => "core",
        },
        "sample_rate": (method == Method::Shards).then_some(args.sample),
        "shards_check": shards_check.map(|(e, n)| json!({"max_abs_error": e, "requests": n})),
        "policy": {
            "eviction": args.eviction, "promotion": args.promotion, "mode": args.mode,
            "cutoff": args.cutoff,
        },
        "knee": knee.map(|i| json!({"bytes": points[i].bytes, "miss_ratio": points[i].miss_ratio()})),
        "sizes": points.iter().map(|p| json!({
            "bytes": p.bytes,
            "lines": p.lines,
            "miss_ratio": p.miss_ratio(),
            "read_miss_ratio": p.read_miss_ratio(),
            "write_miss_ratio": p.write_miss_ratio(),
            "reads": p.reads,
            "writes": p.writes,
            "read_hits": p.read_hits,
            "write_hits": p.write_hits,
            "partial_hits": p.partial_hits,
            "core_read_bytes": p.core_read_bytes,
            "core_write_bytes": p.core_write_bytes,
            "writeback_bytes": p.writeback_bytes,
        })).collect::<Vec<_>>(),
    });
    if args.promotion == "nhit" {
        v["policy"]["nhit"] =
            json!({"threshold": args.nhit_threshold, "trigger_pct": args.nhit_trigger});
    }
    v
}
