//! `tiercache bench core`: how long the cache core takes to decide, and how much RAM its
//! metadata needs per line (SPEC P6, P7). Printed, and written as JSON with `--json`; never
//! asserted (tests do not time things).
//!
//! Method: a 4 KiB-line cache of `--lines` lines (default 16M) is filled through
//! `Cache::restore_line` (the load path), 20% of its lines only half valid. Heap bytes are
//! counted by the process's allocator before and after, so every per-line structure is in the
//! figure. Then `--ops` reads and writes with Zipf(0.9) keys (20% of them aimed at the half-valid
//! lines, which makes them partial hits) run through `Cache::apply`, each device IO completed at
//! once; one sample is the time from the request event to its completion action, i.e. the
//! core's own work for the whole request. No data is copied (the core never copies): the cost of
//! one 4 KiB copy is measured beside it.

use crate::alloc_count::live_bytes;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;
use tiercache_core::event::{Action, Event};
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::{CleaningPolicy, EvictionPolicy, PromotionPolicy, RateParams};
use tiercache_core::units::{CoreId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};
use tiercache_sim::rng::{Rng, Zipf};

/// Arguments of `bench core`.
#[derive(clap::Args)]
pub struct Args {
    /// Cache lines (4 KiB each).
    #[arg(long, default_value_t = 16 << 20)]
    lines: u32,
    /// Timed requests per measurement.
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    /// Eviction policy: lru or s3fifo.
    #[arg(long, default_value = "s3fifo")]
    eviction: String,
    /// Promotion policy: always or nhit (nhit's sketch counts in the RAM figure).
    #[arg(long, default_value = "always")]
    promotion: String,
    /// Write one JSON object with the results to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

struct Timings {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn summarize(mut v: Vec<u32>) -> Timings {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    Timings {
        p50: at(0.5),
        p99: at(0.99),
        mean,
    }
}

/// Runs one request to completion, completing every device IO at once. Returns whether it was
/// served.
fn run_request(cache: &mut Cache, ev: Event, actions: &mut Vec<Action>, now: Nanos) -> bool {
    actions.clear();
    cache.apply(now, ev, actions);
    let mut i = 0;
    let mut done = false;
    while i < actions.len() {
        match actions[i] {
            Action::Read { io, .. }
            | Action::Write { io, .. }
            | Action::WriteZeroes { io, .. }
            | Action::Trim { io, .. }
            | Action::Flush { io, .. } => {
                cache.apply(now, Event::IoDone { io, result: Ok(()) }, actions);
            }
            Action::Complete { result, .. } => done = result.is_ok(),
            Action::Copy { .. } => {}
        }
        i += 1;
    }
    done
}

/// Runs the benchmark.
pub fn run(args: Args) -> Result<(), String> {
    let eviction = match args.eviction.as_str() {
        "lru" => EvictionPolicy::Lru,
        "s3fifo" => EvictionPolicy::S3Fifo,
        other => {
            return Err(format!(
                "unknown eviction policy '{other}'; use lru or s3fifo"
            ));
        }
    };
    let promotion = match args.promotion.as_str() {
        "always" => PromotionPolicy::Always,
        "nhit" => PromotionPolicy::Nhit,
        other => {
            return Err(format!(
                "unknown promotion policy '{other}'; use always or nhit"
            ));
        }
    };
    if args.lines < 1024 {
        return Err("--lines must be at least 1024".into());
    }
    if args.ops == 0 {
        return Err("--ops must be at least 1".into());
    }
    let lines = args.lines;
    let before = live_bytes();
    let mut cfg = Config::new(lines, LineSize::K4);
    cfg.mode = CacheMode::Wb;
    cfg.eviction = eviction;
    cfg.promotion = promotion;
    cfg.cleaning = CleaningPolicy::Nop;
    cfg.rate = RateParams {
        enabled: false,
        ..RateParams::default()
    };
    let mut cache = Cache::new(cfg)?;
    let core = CoreId(0);
    let core_blocks = lines as u64 * 8 * 2;
    cache
        .add_core(core, core_blocks)
        .map_err(|e| e.to_string())?;
    eprint!("filling {lines} lines ...");
    let t = Instant::now();
    for i in 0..lines as u64 {
        // Lines spread over the core; every fifth line only half valid.
        let valid = if i % 5 == 0 { 0x0f } else { 0xff };
        cache.restore_line(core, i * 2, valid, 0, 0)?;
    }
    eprintln!(" {:.1} s", t.elapsed().as_secs_f64());
    let after = live_bytes();
    let bytes_per_line = (after - before) as f64 / lines as f64;

    let full_lines = lines as u64 - lines as u64 / 5;
    let zipf = Zipf::new(full_lines, 0.9);
    let mut rng = Rng::new(42);
    let mut actions = Vec::with_capacity(16);
    let mut req = 0u64;
    let mut now = Nanos(1);
    // Timer overhead, to read the figures against.
    let mut tov = Vec::with_capacity(100_000);
    for _ in 0..100_000 {
        let t0 = Instant::now();
        let t1 = Instant::now();
        tov.push((t1 - t0).as_nanos() as u32);
    }
    let timer = summarize(tov);

    let pick = |rng: &mut Rng| -> (u64, bool) {
        if rng.below(100) < 20 {
            // A half-valid line: a whole-line read there is a partial hit.
            (rng.below(lines as u64 / 5) * 5, true)
        } else {
            let r = zipf.sample(rng);
            // Rank r → the r-th fully valid line (skip every fifth).
            (r / 4 * 5 + r % 4 + 1, false)
        }
    };

    let mut run_phase = |name: &str, write: bool, cache: &mut Cache| -> (Timings, Timings) {
        eprint!("{name}: {} requests ...", args.ops);
        let mut full = Vec::with_capacity(args.ops as usize);
        let mut partial = Vec::new();
        for _ in 0..args.ops {
            let (line_idx, is_partial) = pick(&mut rng);
            let lba = Lba(line_idx * 2 * 8);
            req += 1;
            now = Nanos(now.0 + 1000);
            let ev = if write {
                Event::Write {
                    req: ReqId(req),
                    core,
                    lba,
                    blocks: 8,
                    fua: false,
                }
            } else {
                Event::Read {
                    req: ReqId(req),
                    core,
                    lba,
                    blocks: 8,
                }
            };
            let t0 = Instant::now();
            let ok = run_request(cache, ev, &mut actions, now);
            let dt = t0.elapsed().as_nanos().min(u32::MAX as u128) as u32;
            black_box(ok);
            if is_partial {
                partial.push(dt)
            } else {
                full.push(dt)
            }
        }
        eprintln!(" done");
        (summarize(full), summarize(partial))
    };
    let (read_hit, read_partial) = run_phase("read", false, &mut cache);
    let (write_hit, write_partial) = run_phase("write", true, &mut cache);
    let counters = cache.core_counters(core).copied().unwrap_or_default();

    // One 4 KiB copy.
    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let n = 2_000_000u32;
    let t = Instant::now();
    for i in 0..n {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst)[0] = i as u8;
    }
    let memcpy_ns = t.elapsed().as_nanos() as f64 / n as f64;

    // Through the engine, with a RAM cache (a smaller one: the cache's data lives in RAM here).
    eprint!("  engine: 4K read hits through the engine, ram: cache ...");
    let en = crate::bench_engine::measure(lines.min(1 << 18), args.ops.min(1_000_000))?;
    eprintln!(" done");

    println!(
        "tiercache bench core: {lines} lines of 4 KiB, {} requests per phase",
        args.ops
    );
    println!(
        "  eviction {}, promotion {}, mode wb, cleaning nop",
        args.eviction, args.promotion
    );
    println!();
    println!(
        "  {:<34} {:>9} {:>9} {:>9}",
        "request (core decision, ns)", "p50", "p99", "mean"
    );
    for (n, t) in [
        ("4K read, full hit", &read_hit),
        ("4K read, partial hit + backfill", &read_partial),
        ("4K write hit (wb)", &write_hit),
        ("4K write, partial line (wb)", &write_partial),
    ] {
        println!("  {:<34} {:>9.0} {:>9.0} {:>9.0}", n, t.p50, t.p99, t.mean);
    }
    println!(
        "  {:<34} {:>9.0}",
        "timer overhead (included above)", timer.p50
    );
    println!("  {:<34} {:>9.1}", "one 4 KiB memcpy (mean)", memcpy_ns);
    println!(
        "  {:<34} {:>9.0} {:>9.0} {:>9.0}",
        "engine 4K read hit, ram:, QD1", en.hit_p50, en.hit_p99, en.hit_mean
    );
    println!();
    println!(
        "  engine ({} lines, ram: cache), 4K read hits by queues (threads, QD1 each):",
        en.lines
    );
    for (q, iops) in &en.queues {
        println!(
            "    {q} queue{}: {:>10.0} IOPS",
            if *q == 1 { " " } else { "s" },
            iops
        );
    }
    println!();
    println!(
        "  metadata RAM: {:.3} bytes per 4 KiB line (allocator-counted, all per-line structures)",
        bytes_per_line
    );
    println!(
        "  read requests: {} full hits, {} partial hits, {} misses",
        counters.read.full_hit, counters.read.partial_hit, counters.read.miss
    );
    println!(
        "  targets (SPEC P6/P7): decision p50 <= 300 ns; engine hit <= 1000 ns; <= 20 bytes per line"
    );

    if let Some(path) = args.json {
        let j = serde_json::json!({
            "lines": lines,
            "ops": args.ops,
            "eviction": args.eviction,
            "promotion": args.promotion,
            "read_hit_ns": read_hit.p50,
            "read_hit_ns_p99": read_hit.p99,
            "read_partial_ns": read_partial.p50,
            "read_partial_ns_p99": read_partial.p99,
            "write_hit_ns": write_hit.p50,
            "write_hit_ns_p99": write_hit.p99,
            "timer_overhead_ns": timer.p50,
            "memcpy_4k_ns": memcpy_ns,
            "ram_bytes_per_line": bytes_per_line,
            "read_full_hits": counters.read.full_hit,
            "read_partial_hits": counters.read.partial_hit,
            "engine_lines": en.lines,
            "engine_ram_hit_ns": en.hit_p50,
            "engine_ram_hit_ns_p99": en.hit_p99,
            "engine_queues": en.queues.iter().map(|(q, iops)| serde_json::json!({"queues": q, "iops": iops})).collect::<Vec<_>>(),
        });
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&j).expect("json") + "\n",
        )
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
