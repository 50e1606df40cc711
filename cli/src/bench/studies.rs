//! The SPEC P4 and P5 procedures of `tiercache bench` (P3 comes from the matrix itself):
//!
//! - **stream beside a Zipf reader** (P4): a Zipf 0.9 4K random reader over a working set of
//!   half the cache, warmed; its hit ratio alone, then while a 512K sequential read stream of
//!   4× the cache size runs beside it; and the stream's bandwidth beside the reader vs alone
//!   on the bare core. The reader's hit ratio is the server's own count for its IO class
//!   (4 KiB requests: class 1; larger: class 2; both with the same priority, so the classes
//!   only count and change nothing);
//! - **sequential read over a 50%-dirty range** (P4): every other 4 KiB line of a range of
//!   half the cache written (cleaning `nop`, so they stay dirty), then 512K sequential reads
//!   over the range, through the cache vs on the bare core;
//! - **dirty-full random writes** (P5): at each queue depth 1, 8, 16, 32, 64: the cache filled
//!   with dirty data (cleaning `nop`, sequential cutoff off), then the default cleaner (`alru`)
//!   switched on and 4K random writes over a working set twice the cache size; IOPS, the worst
//!   1-second bucket and dirty % against the same writes on the bare core.
//!
//! They run on their own small cache (so filling it takes seconds) with two emulated cores of
//! the same preset, served by their own NBD server, driven by tiercache's load generator.

use super::kit::report::verdict;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tiercache_core::units::CoreId;
use tiercache_daemon::registry::{NewCache, Registry, set_param};
use tiercache_loadgen::{Connection, Distribution, JobSpec, RunResult, Target, run_with};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server};

/// How long each step runs.
pub struct Plan {
    /// The studies' cache size.
    pub cache_bytes: u64,
    /// Seconds of each baseline run of P5.
    pub p5_baseline_s: u64,
    /// Seconds of each cached run of P5 (SPEC: at least 300).
    pub p5_cached_s: u64,
    /// Seconds of the reader alone (P4).
    pub reader_s: u64,
    /// Queue depth of the sequential reads (the matrix's).
    pub iodepth: u32,
    /// Emulated core preset.
    pub preset: String,
    /// Sequential cutoff policy while the stream runs beside the reader (P4).
    pub seq_cutoff: String,
}

impl Plan {
    /// `--quick` (about 2 minutes), default, or `--full` (SPEC's ≥ 5 minutes per P5 run).
    pub fn new(quick: bool, full: bool, iodepth: u32, preset: &str, seq_cutoff: &str) -> Plan {
        let (cache_bytes, b, c, r) = if full {
            (512 << 20, 30, 300, 30)
        } else if quick {
            (128 << 20, 3, 8, 5)
        } else {
            (256 << 20, 10, 30, 10)
        };
        Plan {
            cache_bytes,
            p5_baseline_s: b,
            p5_cached_s: c,
            reader_s: r,
            iodepth,
            preset: preset.to_string(),
            seq_cutoff: seq_cutoff.to_string(),
        }
    }
}

/// Progress and stop, from the matrix's runner.
pub struct Ui<'a> {
    pub show: &'a (dyn Fn(&str, f64) + Sync),
    pub end: &'a (dyn Fn() + Sync),
    pub stop: &'a AtomicBool,
}

struct Rig {
    reg: Arc<Registry>,
    server: Server,
    sock: std::path::PathBuf,
}

impl Rig {
    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    fn param(&self, group: &str, kv: &[(&str, &str)]) -> Result<(), String> {
        let v: Vec<(String, String)> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        set_param(&self.reg, 1, None, group, &v).map(|_| ())
    }

    fn stats(&self) -> Result<Value, String> {
        tiercache_daemon::stats::cache_stats(&self.reg, 1, None, None)
    }

    /// (requests, hits) of IO class `k`.
    fn class_hits(&self, k: u8) -> Result<(u64, u64), String> {
        let s = tiercache_daemon::stats::cache_stats(&self.reg, 1, None, Some(k))?;
        let r = &s["io_classes"][0]["requests"];
        let hits = ["read_full_hits", "write_full_hits"]
            .iter()
            .map(|x| r[*x].as_u64().unwrap_or(0))
            .sum();
        Ok((r["total"].as_u64().unwrap_or(0), hits))
    }

    fn dirty_pct(&self) -> f64 {
        self.stats()
            .ok()
            .and_then(|s| s["usage"]["dirty_pct"].as_f64())
            .unwrap_or(0.0)
    }
}

/// One load-generator run; `label` for the progress bar.
fn job(rig: &Rig, ui: &Ui, label: &str, export: &str, spec: &JobSpec) -> Result<RunResult, String> {
    let target = Target::parse(&rig.uri(export)).map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let planned = spec.duration.map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let r = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if ui.stop.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let r = run_with(&target, spec, &stop, &mut |p| {
            let f = if planned > 0.0 {
                p.elapsed.as_secs_f64() / planned
            } else {
                0.5
            };
            (ui.show)(label, f.min(1.0))
        });
        stop.store(true, Ordering::Relaxed);
        let _ = watch.join();
        r
    });
    (ui.end)();
    let r = r.map_err(|e| format!("{label}: {e}"))?;
    if r.errors > 0 {
        return Err(format!(
            "{label}: {} IO errors: {}",
            r.errors,
            r.error_messages.first().cloned().unwrap_or_default()
        ));
    }
    Ok(r)
}

fn spec(rw: &str, bs: u32, qd: u32, offset: u64, size: u64) -> JobSpec {
    let mut s = JobSpec {
        block_size: bs,
        queue_depth: qd,
        offset,
        size: Some(size),
        seed: 7,
        ..JobSpec::default()
    };
    s.set_rw(rw, 100).expect("a known rw");
    s
}

fn secs(s: &mut JobSpec, t: u64) {
    s.duration = Some(Duration::from_secs(t));
    s.io_count = None;
}

/// Runs the studies; returns their JSON and a text table.
pub fn run(plan: &Plan, scratch: &Path, ui: &Ui) -> Result<(Value, String), String> {
    let c = plan.cache_bytes;
    let core_bytes = (c * 16).max(2 << 30);
    let file = |n: &str, b: u64| -> Result<String, String> {
        let p = scratch.join(n);
        let f = std::fs::File::create(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        f.set_len(b).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p.display().to_string())
    };
    let cache = file("study-cache.img", c)?;
    let base_core = file("study-core-baseline.img", core_bytes)?;
    let cached_core = file("study-core-cached.img", core_bytes)?;
    let reg = Arc::new(Registry::new());
    reg.start_cache(NewCache {
        device: &cache,
        id: Some(1),
        mode: Some("wb"),
        line_size: None,
        load: false,
        force: false,
        dry_run: false,
    })?;
    reg.add_core(
        1,
        &format!("emu:{}:{cached_core}", plan.preset),
        Some(0),
        Some("cached"),
    )?;
    let engine = reg.engine(1)?;
    let lines_bytes = engine.with_cache(|k| k.config().lines as u64 * 4096);
    let exports = Arc::new(ExportMap::new());
    let bare = tiercache_io::open_emu(&format!("emu:{}:{base_core}", plan.preset))?;
    exports.insert(
        "baseline",
        "bare core",
        Arc::new(BackendExport::new(Arc::new(bare))),
    );
    exports.insert(
        "cached",
        "core through the cache",
        Arc::new(EngineExport::new(engine.clone(), CoreId(0))),
    );
    let sock = scratch.join("studies.sock");
    let server = Server::new(exports, Default::default());
    server.listen(&ListenAddr::Unix(sock.clone()))?;
    let rig = Rig { reg, server, sock };
    println!(
        "\nP4/P5 procedures: their own {} MiB cache ({} MiB of data lines), wb, emulated {} cores",
        c >> 20,
        lines_bytes >> 20,
        plan.preset
    );
    let out = studies(plan, &rig, ui, lines_bytes);
    rig.server.shutdown();
    drop(engine);
    let _ = rig.reg.stop_cache(1, true, |_, _, _| {});
    out
}

fn studies(plan: &Plan, rig: &Rig, ui: &Ui, data: u64) -> Result<(Value, String), String> {
    let mut text = String::new();
    let mut doc = json!({"cache_bytes": plan.cache_bytes, "cache_data_bytes": data,
        "preset": plan.preset});
    let stopped = || ui.stop.load(Ordering::Relaxed);
    let s = Study {
        plan,
        rig,
        ui,
        data,
    };
    p4_stream(&s, &mut doc, &mut text)?;
    if stopped() {
        return Ok((doc, text));
    }
    p4_dirty_read(&s, &mut doc, &mut text)?;
    p5_dirty_full(&s, &mut doc, &mut text)?;
    Ok((doc, text))
}

/// What every study reads: the plan, the rig, the UI, the bytes of cache data.
struct Study<'a> {
    plan: &'a Plan,
    rig: &'a Rig,
    ui: &'a Ui<'a>,
    data: u64,
}

/// P4: a 512K stream of 4x the cache beside a Zipf reader (the reader's hit ratio, the
/// stream's bandwidth).
fn p4_stream(s: &Study, doc: &mut Value, text: &mut String) -> Result<(), String> {
    let (plan, rig, ui, data) = (s.plan, s.rig, s.ui, s.data);
    let stopped = || ui.stop.load(Ordering::Relaxed);
    rig.reg.io_class_load(
        1,
        "IO class id,IO class name,Eviction priority,Allocation\n\
         0,unclassified,22,1\n1,request_size:le:4096,22,1\n2,request_size:gt:4096,22,1\n",
    )?;
    let ws = data / 2;
    rig.param("seq-cutoff", &[("policy", "never")])?;
    {
        let target = Target::parse(&rig.uri("cached")).map_err(|e| e.to_string())?;
        let mut conn = Connection::connect(&target).map_err(|e| e.to_string())?;
        let mut off = 0;
        while off < ws {
            let n = (ws - off).min(1 << 20);
            conn.cache(off, n as u32).map_err(|e| e.to_string())?;
            off += n;
        }
        conn.close();
    }
    rig.param("seq-cutoff", &[("policy", &plan.seq_cutoff)])?;
    let mut reader = spec("randread", 4096, 8, 0, ws);
    reader.distribution = Distribution::Zipf { theta: 0.9 };
    secs(&mut reader, plan.reader_s);
    let (n0, h0) = rig.class_hits(1)?;
    let alone = job(rig, ui, "P4 Zipf reader alone", "cached", &reader)?;
    let (n1, h1) = rig.class_hits(1)?;
    let hit_alone = ratio(h1 - h0, n1 - n0);
    let stream_bytes = plan.cache_bytes * 4;
    let stream_off = plan.cache_bytes * 2;
    let mut stream = spec("read", 512 << 10, 4, stream_off, stream_bytes);
    stream.duration = None;
    stream.io_count = Some(stream_bytes / (512 << 10));
    if stopped() {
        return Ok(());
    }
    let stream_base = job(rig, ui, "P4 stream alone (bare)", "baseline", &stream)?;
    let (n2, h2) = rig.class_hits(1)?;
    let (reader_beside, stream_beside) = std::thread::scope(|s| {
        let st = s.spawn(|| job(rig, ui, "P4 stream beside reader", "cached", &stream));
        // The reader runs until the stream has made its pass.
        let mut r = reader.clone();
        r.duration = Some(Duration::from_secs(3600));
        let target = Target::parse(&rig.uri("cached")).map_err(|e| e.to_string());
        let stop = Arc::new(AtomicBool::new(false));
        let rd = {
            let stop = stop.clone();
            s.spawn(move || run_with(&target?, &r, &stop, &mut |_| {}).map_err(|e| e.to_string()))
        };
        let st = st.join().unwrap_or_else(|_| Err("stream panicked".into()));
        stop.store(true, Ordering::Relaxed);
        let rd = rd.join().unwrap_or_else(|_| Err("reader panicked".into()));
        (rd, st)
    });
    let (reader_beside, stream_beside) = (reader_beside?, stream_beside?);
    let (n3, h3) = rig.class_hits(1)?;
    let hit_beside = ratio(h3 - h2, n3 - n2);
    let drop_points = (hit_alone - hit_beside) * 100.0;
    let stream_ratio = stream_beside.bw_mbps / stream_base.bw_mbps.max(1e-9);
    doc["stream_beside_zipf"] = json!({
        "reader_working_set_bytes": ws, "stream_bytes": stream_bytes,
        "reader_hit_ratio_alone": hit_alone, "reader_hit_ratio_beside_stream": hit_beside,
        "reader_hit_drop_points": drop_points,
        "reader_iops_alone": alone.iops, "reader_iops_beside_stream": reader_beside.iops,
        "stream_mbps_bare": stream_base.bw_mbps, "stream_mbps_beside_reader": stream_beside.bw_mbps,
        "stream_ratio": stream_ratio,
        "target": "reader hit ratio drops <= 2 points; stream >= 0.95x uncached",
        "met": drop_points <= 2.0 && stream_ratio >= 0.95,
    });
    *text += &format!(
        "{} P4 stream beside a Zipf reader: reader hits {:.1}% alone, {:.1}% beside a {} MiB 512K stream (drop {:.1} points; target <= 2); stream {:.1} MB/s vs {:.1} bare ({:.2}x; target >= 0.95x)\n",
        verdict(drop_points <= 2.0 && stream_ratio >= 0.95),
        hit_alone * 100.0,
        hit_beside * 100.0,
        stream_bytes >> 20,
        drop_points,
        stream_beside.bw_mbps,
        stream_base.bw_mbps,
        stream_ratio
    );
    println!("  {}", text.lines().last().unwrap_or(""));
    Ok(())
}

/// P4: a 512K sequential read over a 50%-dirty range, against the bare core.
fn p4_dirty_read(s: &Study, doc: &mut Value, text: &mut String) -> Result<(), String> {
    let (plan, rig, ui, data) = (s.plan, s.rig, s.ui, s.data);
    rig.param("cleaning", &[("policy", "nop")])?;
    let range_off = plan.cache_bytes * 12;
    let range = data / 2;
    {
        let target = Target::parse(&rig.uri("cached")).map_err(|e| e.to_string())?;
        let mut conn = Connection::connect(&target).map_err(|e| e.to_string())?;
        let buf = vec![0x5au8; 4096];
        let mut off = 0;
        (ui.show)("P4 dirtying every other line", 0.0);
        while off < range {
            conn.write_at(range_off + off, &buf, false)
                .map_err(|e| e.to_string())?;
            off += 8192;
        }
        conn.flush().map_err(|e| e.to_string())?;
        conn.close();
        (ui.end)();
    }
    let dirty_now = rig.dirty_pct();
    let seq = spec("read", 512 << 10, plan.iodepth, range_off, range);
    let mut seq = seq;
    seq.duration = None;
    seq.io_count = Some(range / (512 << 10));
    let sb = job(rig, ui, "P4 50%-dirty seq read (bare)", "baseline", &seq)?;
    let sc = job(rig, ui, "P4 50%-dirty seq read (cached)", "cached", &seq)?;
    let r50 = sc.bw_mbps / sb.bw_mbps.max(1e-9);
    *text += &format!(
        "{} P4 512K sequential read over a 50%-dirty {} MiB range: {:.1} MB/s vs {:.1} bare ({:.2}x; target >= 0.8x)\n",
        verdict(r50 >= 0.8),
        range >> 20,
        sc.bw_mbps,
        sb.bw_mbps,
        r50
    );
    println!("  {}", text.lines().last().unwrap_or(""));
    doc["seq_read_50pct_dirty"] = json!({
        "range_bytes": range, "dirty_pct_of_cache": dirty_now,
        "mbps_bare": sb.bw_mbps, "mbps_cached": sc.bw_mbps, "ratio": r50,
        "target": ">= 0.8x uncached", "met": r50 >= 0.8,
    });

    Ok(())
}

/// P5: dirty-full 4K random writes at QD 1 to 64, against the bare core.
fn p5_dirty_full(s: &Study, doc: &mut Value, text: &mut String) -> Result<(), String> {
    let (plan, rig, ui, data) = (s.plan, s.rig, s.ui, s.data);
    let stopped = || ui.stop.load(Ordering::Relaxed);
    let mut rows = Vec::new();
    let p5_ws = plan.cache_bytes * 2;
    let p5_off = plan.cache_bytes * 14;
    let head = format!(
        "P5 dirty-full 4K random writes over {} MiB (2x the cache), cleaner alru after a nop fill; {} s bare, {} s cached per QD:\n   QD  bare IOPS  cached IOPS  ratio  worst 1-s bucket  dirty %  result (target: ratio >= 0.9, worst >= 0.5)\n",
        p5_ws >> 20,
        plan.p5_baseline_s,
        plan.p5_cached_s
    );
    print!("  {head}");
    *text += &head;
    for qd in [1u32, 8, 16, 32, 64] {
        if stopped() {
            break;
        }
        let mut w = spec("randwrite", 4096, qd, p5_off, p5_ws);
        secs(&mut w, plan.p5_baseline_s);
        let b = job(rig, ui, &format!("P5 QD{qd} bare"), "baseline", &w)?;
        // Fill: every line dirty (sequential writes with the cutoff off, no cleaning).
        rig.param("cleaning", &[("policy", "nop")])?;
        rig.param("seq-cutoff", &[("policy", "never")])?;
        let mut fill = spec("write", 512 << 10, 4, p5_off, p5_ws);
        fill.duration = None;
        fill.io_count = Some(data / (512 << 10));
        job(rig, ui, &format!("P5 QD{qd} fill dirty"), "cached", &fill)?;
        let filled = rig.dirty_pct();
        rig.param("seq-cutoff", &[("policy", "full")])?;
        rig.param("cleaning", &[("policy", "alru")])?;
        secs(&mut w, plan.p5_cached_s);
        let r = job(rig, ui, &format!("P5 QD{qd} cached"), "cached", &w)?;
        let worst = r
            .samples
            .iter()
            .filter(|s| !s.partial)
            .map(|s| s.iops)
            .fold(f64::INFINITY, f64::min);
        let worst = if worst.is_finite() { worst } else { r.iops };
        let ratio = r.iops / b.iops.max(1e-9);
        let worst_ratio = worst / b.iops.max(1e-9);
        let dirty_end = rig.dirty_pct();
        let line = format!(
            "  {qd:>3} {:>10.0} {:>12.0} {:>6.2} {:>10.0} ({:.2}x) {:>7.1}  {}",
            b.iops,
            r.iops,
            ratio,
            worst,
            worst_ratio,
            dirty_end,
            verdict(ratio >= 0.9 && worst_ratio >= 0.5)
        );
        println!("{line}");
        *text += &line;
        *text += "\n";
        rows.push(json!({
            "qd": qd, "baseline_iops": b.iops, "cached_iops": r.iops, "ratio": ratio,
            "worst_second_iops": worst, "worst_second_ratio": worst_ratio,
            "dirty_pct_after_fill": filled, "dirty_pct_end": dirty_end,
            "cached_p99_us": r.lat.p99_us, "baseline_p99_us": b.lat.p99_us,
            "per_second_iops": r.samples.iter().map(|s| s.iops).collect::<Vec<_>>(),
            "met": ratio >= 0.9 && worst_ratio >= 0.5,
        }));
    }
    doc["dirty_full"] = json!({
        "working_set_bytes": p5_ws, "baseline_s": plan.p5_baseline_s,
        "cached_s": plan.p5_cached_s, "runs": rows,
        "target": ">= 0.9x uncached IOPS at each QD, no 1-second bucket below 0.5x",
    });
    Ok(())
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}
