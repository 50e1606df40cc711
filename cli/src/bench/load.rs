//! `tiercache bench load`: how long a persistent cache takes to come back (SPEC P9) — after a
//! clean stop (target: 1 s per 10M lines, serving with the full index) and after a crash
//! (target: 2 s + journal size / cache-device bandwidth). Printed, and written as JSON with
//! `--json`; never asserted (tests do not time things).
//!
//! Method, for each `--lines` size: a sparse cache file with room for that many 4 KiB lines
//! and a sparse core file; a `wb` cache is created through the engine and every line is mapped
//! through `Cache::restore_line` (the load path; `--dirty-pct` of them dirty), so the index is
//! full without writing data; a clean stop writes the final checkpoint. The page cache is
//! dropped (`/proc/sys/vm/drop_caches`, where permitted; the cache device is opened with
//! O_DIRECT anyway), then `Engine::open` is timed until it serves. Next, `--writes` random 4 KiB
//! writes with a flush every 32 fill the journal, the engine is killed (a crash: nothing more is
//! written), the page cache dropped again and the recovery timed. The cache device's bandwidth
//! is measured by reading its metadata regions with O_DIRECT, 1 MiB at a time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tiercache_core::cache::CoreRecord;
use tiercache_core::config::Persist;
use tiercache_core::mode::CacheMode;
use tiercache_core::policy::CleaningPolicy;
use tiercache_core::units::{CoreId, Lba, LineSize};
use tiercache_core::{Cache, Config};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::superblock::{Layout, checkpoint_region_bytes, journal_bytes_for};
use tiercache_io::{AlignedBuf, Backend, FileBackend};
use tiercache_sim::rng::Rng;

/// Arguments of `bench load`.
#[derive(clap::Args)]
pub struct Args {
    /// Cache sizes in lines (4 KiB each), comma-separated; k/m suffixes (powers of 1024).
    #[arg(long, default_value = "1m,16m", value_delimiter = ',')]
    lines: Vec<String>,
    /// Share of lines that are dirty, percent.
    #[arg(long, default_value_t = 10)]
    dirty_pct: u32,
    /// Random 4 KiB writes before the crash (they fill the journal).
    #[arg(long, default_value_t = 20_000)]
    writes: u64,
    /// Journal region in MiB (default: what `start-cache` gives a device of that size, 1/128
    /// of it from 1 to 64 MiB: 32 MiB at 1M lines, 64 MiB at 16M).
    #[arg(long, value_name = "MIB")]
    journal_mib: Option<u64>,
    /// Directory for the sparse device files (default: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write one JSON object with the results to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

fn parse_count(s: &str) -> Result<u32, String> {
    let t = s.trim().to_ascii_lowercase();
    let (n, m) = match t.strip_suffix('m') {
        Some(n) => (n, 1u64 << 20),
        None => match t.strip_suffix('k') {
            Some(n) => (n, 1 << 10),
            None => (t.as_str(), 1),
        },
    };
    n.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(m))
        .filter(|&n| (1024..=(64 << 20)).contains(&n))
        .map(|n| n as u32)
        .ok_or_else(|| format!("--lines '{s}': want a count from 1k to 64m, e.g. 1m or 16m"))
}

/// Drops the page cache when permitted; says whether it did.
fn drop_page_cache() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// Sequential O_DIRECT read bandwidth of `dev` over `[off, off + bytes)`, bytes/s.
fn read_bandwidth(dev: &dyn Backend, off: u64, bytes: u64) -> f64 {
    let mut buf = AlignedBuf::new(1 << 20);
    let t = Instant::now();
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(1 << 20);
        if dev
            .read((off + done) / 512, &mut buf[..n as usize])
            .is_err()
        {
            break;
        }
        done += n;
    }
    done as f64 / t.elapsed().as_secs_f64().max(1e-9)
}

struct Row {
    lines: u32,
    journal_bytes: u64,
    populate_s: f64,
    stop_s: f64,
    load_s: f64,
    load_target_s: f64,
    crash_journal_bytes: u64,
    journal_records: u64,
    recovered_dirty_lines: u32,
    recovery_s: f64,
    bandwidth: f64,
    recovery_target_s: f64,
    page_cache_dropped: bool,
}

fn one(
    dir: &Path,
    lines: u32,
    dirty_pct: u32,
    writes: u64,
    journal_mib: Option<u64>,
) -> Result<Row, String> {
    let ls = LineSize::K4;
    let journal = match journal_mib {
        Some(m) => m.clamp(1, 1 << 14) << 20,
        None => journal_bytes_for(lines as u64 * 4096),
    };
    let cp = checkpoint_region_bytes(lines as u64, 4096).ok_or("too many lines")?;
    let mut bytes = lines as u64 * 4096 + journal + 2 * cp + (4 << 20);
    let (layout, got) = loop {
        let (l, n) = Layout::plan(bytes, 4096, journal).ok_or("layout")?;
        if n >= lines {
            break (l, n);
        }
        bytes += (lines - n) as u64 * 4096 + (1 << 20);
    };
    let cache_path = dir.join("bench-load-cache.img");
    let core_path = dir.join("bench-load-core.img");
    for (p, b) in [(&cache_path, bytes), (&core_path, lines as u64 * 4096 * 2)] {
        let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
        f.set_len(b).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let open = |p: &Path| -> Result<Device, String> {
        Ok(Arc::new(
            FileBackend::open(p).map_err(|e| format!("{}: {e}", p.display()))?,
        ))
    };
    let mut cfg = Config::new(got, ls);
    cfg.mode = CacheMode::Wb;
    cfg.cleaning = CleaningPolicy::Nop;
    cfg.data_offset = Lba(layout.data.offset / 512);
    cfg.pool_slots = 8;
    cfg.pool_slot_blocks = 256;
    cfg.persist = Some(Persist::new_cache([7; 16], bytes, ls, got, layout));
    let core_id = CoreId(0);
    let record = CoreRecord {
        identity: tiercache_engine::identity::of_path(&core_path)?,
        export_name: "bench".into(),
        device: String::new(),
    };
    let ec = EngineConfig::threads(8);
    let e = Engine::create(
        cfg.clone(),
        open(&cache_path)?,
        vec![CoreSpec {
            id: core_id,
            dev: open(&core_path)?,
            record,
        }],
        ec,
    )?;
    let t = Instant::now();
    e.with_cache(|c: &mut Cache| -> Result<(), String> {
        let full = u128::MAX >> (128 - 8);
        let mut rng = Rng::new(lines as u64);
        for i in 0..lines as u64 {
            let dirty = if rng.below(100) < dirty_pct as u64 {
                full
            } else {
                0
            };
            c.restore_line(core_id, i * 2, full, dirty, 0)?;
        }
        Ok(())
    })?;
    let populate_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    e.stop()?;
    let stop_s = t.elapsed().as_secs_f64();

    // Opens the cache as its device holds it: a load after a clean stop, a recovery after a
    // crash.
    let reopen = || -> Result<_, String> {
        Engine::open(
            &cfg,
            open(&cache_path)?,
            vec![(core_id, open(&core_path)?)],
            ec,
        )
    };
    let mut dropped = drop_page_cache();
    let t = Instant::now();
    let (e, rep) = reopen()?;
    let load_s = t.elapsed().as_secs_f64();
    if rep.lines != lines || !rep.clean {
        return Err(format!(
            "the load brought back {} lines (clean: {}), expected {lines} after a clean stop",
            rep.lines, rep.clean
        ));
    }

    // Crash with a busy journal.
    let mut rng = Rng::new(99);
    let mut buf = AlignedBuf::new(4096);
    for i in 0..writes {
        buf[0] = i as u8;
        let l = rng.below(lines as u64 * 2);
        let (r, b) = e.write_owned(core_id, l * 8, buf, false);
        r.map_err(|x| format!("write failed: {x:?}"))?;
        buf = b;
        if i % 32 == 31 {
            e.flush(core_id)
                .map_err(|x| format!("flush failed: {x:?}"))?;
        }
    }
    e.flush(core_id)
        .map_err(|x| format!("flush failed: {x:?}"))?;
    let journal_used = e.with_cache(|c| c.journal_fill().map_or(0, |(u, _)| u));
    e.kill();
    dropped &= drop_page_cache();
    let t = Instant::now();
    let (e, rep) = reopen()?;
    let recovery_s = t.elapsed().as_secs_f64();
    if rep.clean {
        return Err("the crashed cache loaded as if stopped cleanly".into());
    }
    e.kill();
    let dev = FileBackend::open(&cache_path).map_err(|x| x.to_string())?;
    let bw = read_bandwidth(
        &dev,
        layout.journal.offset,
        (journal + 2 * cp).min(512 << 20),
    );
    let _ = std::fs::remove_file(&cache_path);
    let _ = std::fs::remove_file(&core_path);
    Ok(Row {
        lines,
        journal_bytes: journal,
        populate_s,
        stop_s,
        load_s,
        load_target_s: lines as f64 / 10e6,
        crash_journal_bytes: journal_used,
        journal_records: rep.journal_records,
        recovered_dirty_lines: rep.dirty_lines,
        recovery_s,
        bandwidth: bw,
        recovery_target_s: 2.0 + journal as f64 / bw.max(1.0),
        page_cache_dropped: dropped,
    })
}

/// Runs `bench load`.
pub fn run(a: Args) -> Result<(), String> {
    let sizes: Vec<u32> = a
        .lines
        .iter()
        .map(|s| parse_count(s))
        .collect::<Result<_, _>>()?;
    if a.dirty_pct > 100 {
        return Err("--dirty-pct is a percentage (0-100)".into());
    }
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    if !dir.is_dir() {
        return Err(format!("--dir {}: not a directory", dir.display()));
    }
    println!(
        "tiercache bench load: target P9 (cold page cache), 4 KiB lines, wb, {}% dirty",
        a.dirty_pct
    );
    println!(
        "{:>10} {:>9} {:>9} {:>9} {:>10} | {:>11} {:>9} {:>10} {:>10} {:>10}",
        "lines",
        "populate",
        "stop",
        "load",
        "target",
        "journal",
        "records",
        "recovery",
        "target",
        "dev MB/s"
    );
    let mut rows = Vec::new();
    for &n in &sizes {
        let r = one(&dir, n, a.dirty_pct, a.writes, a.journal_mib)?;
        println!(
            "{:>10} {:>8.2}s {:>8.2}s {:>8.3}s {:>9.3}s{} | {:>9}KiB {:>9} {:>9.3}s {:>9.3}s{} {:>10.0}",
            r.lines,
            r.populate_s,
            r.stop_s,
            r.load_s,
            r.load_target_s,
            if r.load_s <= r.load_target_s {
                " "
            } else {
                "!"
            },
            r.crash_journal_bytes / 1024,
            r.journal_records,
            r.recovery_s,
            r.recovery_target_s,
            if r.recovery_s <= r.recovery_target_s {
                " "
            } else {
                "!"
            },
            r.bandwidth / 1e6
        );
        rows.push(r);
    }
    if rows.iter().any(|r| !r.page_cache_dropped) {
        println!(
            "(the page cache could not be dropped: not root; the cache device uses O_DIRECT anyway)"
        );
    }
    println!(
        "load: time until Engine::open serves with the full index after a clean stop (target 1 s per 10M lines)"
    );
    println!(
        "recovery: after a kill with the journal written by --writes random writes (target 2 s + journal region / device bandwidth)"
    );
    println!(
        "journal regions: {} (start-cache's size for the device unless --journal-mib)",
        rows.iter()
            .map(|r| format!("{} MiB at {} lines", r.journal_bytes >> 20, r.lines))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(p) = &a.json {
        let v = serde_json::json!({
            "bench": "load",
            "dirty_pct": a.dirty_pct,
            "writes": a.writes,
            "runs": rows.iter().map(|r| serde_json::json!({
                "lines": r.lines,
                "journal_region_bytes": r.journal_bytes,
                "populate_s": r.populate_s,
                "stop_s": r.stop_s,
                "load_s": r.load_s,
                "load_target_s": r.load_target_s,
                "load_met": r.load_s <= r.load_target_s,
                "crash_journal_bytes": r.crash_journal_bytes,
                "journal_records": r.journal_records,
                "recovered_dirty_lines": r.recovered_dirty_lines,
                "recovery_s": r.recovery_s,
                "recovery_target_s": r.recovery_target_s,
                "recovery_met": r.recovery_s <= r.recovery_target_s,
                "device_read_bytes_per_s": r.bandwidth,
                "page_cache_dropped": r.page_cache_dropped,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(p, serde_json::to_string_pretty(&v).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
