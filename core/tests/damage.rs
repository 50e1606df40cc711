//! Damage anywhere is detected (SAFETY point 6): single-byte flips sampled across every on-disk
//! region of a persistent cache — both superblock copies, both table areas, the live journal
//! records (and some stale ones), the current checkpoint's chunks — and the loader
//! (`tiercache_core::cache::open`) either refuses with a message naming `tiercache check`, or
//! loads and then serves, for every block of every core, exactly what the undamaged image
//! serves. Wrong data is never served; the loader never panics.
//!
//! Per seed: a persistent cache (`wb` or `wo`, one seed in four `wt`) runs the model workload
//! (writes, flushes, trims; the harness journal is 16–64 KiB, so commits wrap it and running
//! checkpoints happen) until journal records and a checkpoint exist. Two images are damaged:
//! a crash image (every write the devices completed is kept, so everything acknowledged is
//! there; requests may be in flight) and, after more work, the image of a clean stop. Each
//! flip is loaded; a load that succeeds runs in a new environment whose oracle is what the
//! undamaged image loads as, and every block is read back through the loaded cache.
//!
//! `TIERCACHE_DAMAGE_SEEDS=N` runs more seeds (default 40); `TIERCACHE_DAMAGE_SEED=S` replays one.

mod harness;

use harness::workload::{persistent, random_config, random_step};
use harness::{Content, CrashImages, CrashPattern, Env, Knobs, ReqOp, Rng};
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use tiercache_core::Config;
use tiercache_core::cache::{LoadReport, open};
use tiercache_core::mode::CacheMode;
use tiercache_format::journal::Entry;
use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::{
    CHECKPOINT_CHUNK_BYTES, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS, Superblock, TABLES_OFFSETS,
    lines_per_chunk,
};

const ALIGN: u64 = 4096;

/// The regions flips are sampled from, in report order.
const REGIONS: [&str; 9] = [
    "superblock A",
    "superblock B",
    "tables A",
    "tables B",
    "journal (live, older)",
    "journal (live, newest)",
    "journal (stale)",
    "checkpoint (current)",
    "checkpoint (padding)",
];

/// Regions that must see at least one flip over a run.
const REQUIRED: [&str; 7] = [
    "superblock A",
    "superblock B",
    "tables A",
    "tables B",
    "journal (live, older)",
    "journal (live, newest)",
    "checkpoint (current)",
];

#[derive(Default, Clone, Copy)]
struct Tally {
    tried: u32,
    refused: u32,
    loaded_ok: u32,
    /// Loads (correct) that used the other superblock copy than the undamaged image.
    other_copy: u32,
    /// Of those, loads whose core table lacked a core the undamaged image has (added again).
    fewer_cores: u32,
    bad: u32,
}

#[derive(Default)]
struct Outcome {
    /// (image kind, region) -> tally.
    tally: BTreeMap<(&'static str, &'static str), Tally>,
    failures: Vec<String>,
    commits: u64,
    checkpoints: u64,
}

fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    let s = if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(non-text panic)".to_string()
    };
    s.lines().next().unwrap_or("").to_string()
}

fn load(base: &Config, img: &[u8]) -> Result<(tiercache_core::Cache, LoadReport), String> {
    let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        let s = usize::try_from(off).map_err(|e| e.to_string())?;
        let src = img
            .get(s..s + buf.len())
            .ok_or_else(|| format!("read past the device end at {off}"))?;
        buf.copy_from_slice(src);
        Ok(())
    };
    open(base, &mut read)
}

/// Journal records at 4 KiB steps of the journal region whose frame and entry decode:
/// (absolute offset, bytes the record occupies, sequence number).
fn journal_records(img: &[u8], sb: &Superblock) -> Vec<(u64, u64, u64)> {
    let j = sb.layout.journal;
    let mut out = Vec::new();
    let mut off = 0;
    while off < j.bytes {
        let buf = &img[(j.offset + off) as usize..j.end() as usize];
        if let Ok((r, used)) = record::decode(buf)
            && r.kind == RecordKind::Journal
            && let Ok(e) = Entry::decode(r.payload)
        {
            out.push((j.offset + off, used as u64, e.seq));
            off += (used as u64).div_ceil(ALIGN) * ALIGN;
            continue;
        }
        off += ALIGN;
    }
    out
}

/// A random offset in `lo..hi` (`None` if empty).
fn pick(rng: &mut Rng, lo: u64, hi: u64) -> Option<u64> {
    (hi > lo).then(|| lo + rng.below(hi - lo))
}

/// Byte offsets to flip, per region, sampled from what the undamaged image holds.
fn sample_offsets(img: &[u8], rng: &mut Rng) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
        buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
        Ok(())
    };
    let (sb, _copy, _) = tiercache_core::cache::read_superblock(&mut read).expect("undamaged");
    // Superblock copies: mostly the 136 checksummed header bytes and just past them.
    for (name, base) in [
        ("superblock A", SUPERBLOCK_OFFSETS[0]),
        ("superblock B", SUPERBLOCK_OFFSETS[1]),
    ] {
        for _ in 0..4 {
            out.push((name, base + rng.below(140)));
        }
        out.push((name, base + 140 + rng.below(SUPERBLOCK_BYTES as u64 - 140)));
    }
    // Table areas: the configuration record, the core-table record, the padding after them.
    for (name, base) in [
        ("tables A", TABLES_OFFSETS[0]),
        ("tables B", TABLES_OFFSETS[1]),
    ] {
        let area = &img[base as usize..base as usize + 60 * 1024];
        let Ok((_, l1)) = record::decode(area) else {
            continue; // never written (a copy the cache has not used yet)
        };
        let Ok((_, l2)) = record::decode(&area[l1..]) else {
            continue;
        };
        let (l1, l2) = (l1 as u64, l2 as u64);
        for _ in 0..2 {
            out.extend(pick(rng, 0, l1).map(|o| (name, base + o)));
            out.extend(pick(rng, l1, l1 + l2).map(|o| (name, base + o)));
        }
        let padded = (l1 + l2).div_ceil(ALIGN) * ALIGN;
        out.extend(pick(rng, l1 + l2, padded).map(|o| (name, base + o)));
    }
    // Journal: the live run (from the superblock's start, consecutive) and some stale records.
    let recs = journal_records(img, &sb);
    let by_seq: BTreeMap<u64, (u64, u64)> = recs.iter().map(|&(o, l, s)| (s, (o, l))).collect();
    let mut live = Vec::new();
    let mut seq = sb.journal_seq;
    while let Some(&r) = by_seq.get(&seq) {
        live.push(r);
        seq += 1;
    }
    let stale: Vec<(u64, u64)> = recs
        .iter()
        .filter(|&&(o, _, _)| !live.iter().any(|&(lo, _)| lo == o))
        .map(|&(o, l, _)| (o, l))
        .collect();
    let mut chosen: Vec<(&str, (u64, u64))> = Vec::new();
    if let Some(&l) = live.last() {
        chosen.push(("journal (live, newest)", l));
        if live.len() > 1 {
            chosen.push(("journal (live, older)", live[0]));
        }
        if live.len() > 2 {
            let r = live[1 + rng.below(live.len() as u64 - 2) as usize];
            chosen.push(("journal (live, older)", r));
        }
    }
    for (name, (o, l)) in chosen {
        // The frame header, then the entry.
        out.push((name, o + rng.below(16)));
        out.extend(pick(rng, 16, l).map(|x| (name, o + x)));
    }
    for _ in 0..2.min(stale.len()) {
        let (o, l) = stale[rng.below(stale.len() as u64) as usize];
        out.push(("journal (stale)", o + rng.below(l)));
    }
    // The current checkpoint: every chunk's frame and chunk header, its line records, and the
    // rest of its slot.
    if sb.has_checkpoint {
        let region = sb.layout.checkpoint[sb.checkpoint as usize];
        let chunks = sb.lines.div_ceil(lines_per_chunk(sb.line_size)) as u64;
        for i in 0..chunks {
            let at = region.offset + i * CHECKPOINT_CHUNK_BYTES;
            let slot = &img[at as usize..(at + CHECKPOINT_CHUNK_BYTES) as usize];
            let (_, used) = record::decode(slot).expect("undamaged chunk");
            let used = used as u64;
            out.push(("checkpoint (current)", at + rng.below(36)));
            out.extend(pick(rng, 36, used).map(|o| ("checkpoint (current)", at + o)));
            out.extend(pick(rng, 36, used).map(|o| ("checkpoint (current)", at + o)));
            out.extend(
                pick(rng, used, CHECKPOINT_CHUNK_BYTES).map(|o| ("checkpoint (padding)", at + o)),
            );
        }
    }
    out
}

/// Damages `images.cache` at each sampled offset and loads it.
fn damage_image(
    seed: u64,
    kind: &'static str,
    base: &Config,
    images: &CrashImages,
    legal: &BTreeMap<u16, Vec<std::collections::HashSet<Content>>>,
    rng: &mut Rng,
    out: &mut Outcome,
) {
    let (cache0, report0) = load(base, &images.cache)
        .unwrap_or_else(|e| panic!("seed {seed}: the undamaged {kind} image does not load: {e}"));
    let values = Env::loaded_values(Some(&cache0), images);
    // The undamaged load is the reference: its values must be legal, and the loaded cache must
    // serve them.
    for (core, vals) in &values {
        for (b, v) in vals.iter().enumerate() {
            assert!(
                legal[core][b].contains(v),
                "seed {seed}: the undamaged {kind} image loads core {core} block {b} as {v:?}, legal {:?}",
                legal[core][b]
            );
        }
    }
    let knobs = Knobs {
        p_io_error: 0.0,
        ..Knobs::default()
    };
    let mut env =
        Env::restart_with_oracle(seed, knobs.clone(), clone_images(images), cache0, &values);
    env.check_durability = false;
    env.verify_all();

    for (region, off) in sample_offsets(&images.cache, rng) {
        let x = 1 + rng.below(255) as u8;
        let mut damaged = clone_images(images);
        damaged.cache[off as usize] ^= x;
        let t = out.tally.entry((kind, region)).or_default();
        t.tried += 1;
        let what = format!(
            "seed {seed}, {kind} image, {region}, byte {off:#x} ^= {x:#04x} (replay: TIERCACHE_DAMAGE_SEED={seed})"
        );
        let loaded = match catch_unwind(AssertUnwindSafe(|| load(base, &damaged.cache))) {
            Err(p) => {
                t.bad += 1;
                out.failures
                    .push(format!("{what}: the loader PANICKED: {}", panic_text(p)));
                continue;
            }
            Ok(Err(msg)) => {
                if msg.contains("tiercache check") {
                    t.refused += 1;
                } else {
                    t.bad += 1;
                    out.failures.push(format!(
                        "{what}: refused without naming `tiercache check`: {msg}"
                    ));
                }
                continue;
            }
            Ok(Ok(x)) => x,
        };
        let (cache, report) = loaded;
        let got = Env::loaded_values(Some(&cache), &damaged);
        let mut diffs = Vec::new();
        for (core, vals) in &values {
            for (b, v) in vals.iter().enumerate() {
                let g = got[core][b];
                if g != *v {
                    diffs.push(format!(
                        "core {core} block {b}: {g:?} instead of {v:?} ({})",
                        if legal[core][b].contains(&g) {
                            "a legal crash outcome, but not what the undamaged image holds"
                        } else {
                            "NOT legal even after a crash"
                        }
                    ));
                }
            }
        }
        // After a crash, damage may cost what the crash itself may cost (a record that was
        // still being written, its mirror copy not yet there, is indistinguishable from a torn
        // one) — never more: every block must still be a legal crash outcome, and reads must
        // then return what the loaded cache holds. After a clean stop nothing may differ.
        let all_legal = kind == "crash"
            && values.iter().all(|(core, vals)| {
                (0..vals.len()).all(|b| legal[core][b].contains(&got[core][b]))
            });
        let oracle = if all_legal { &got } else { &values };
        let verified = catch_unwind(AssertUnwindSafe(|| {
            let mut env = Env::restart_with_oracle(seed, knobs.clone(), damaged, cache, oracle);
            env.check_durability = false;
            env.verify_all();
        }));
        if (diffs.is_empty() || all_legal) && verified.is_ok() {
            t.loaded_ok += 1;
            if report.superblock_copy != report0.superblock_copy
                || report.superblock.generation != report0.superblock.generation
            {
                t.other_copy += 1;
            }
            if report.cores.len() < report0.cores.len() {
                t.fewer_cores += 1;
            }
            continue;
        }
        t.bad += 1;
        let n = diffs.len();
        diffs.truncate(3);
        out.failures.push(format!(
            "{what}: loaded (superblock copy {} generation {}, clean {}, {} lines, {} dirty, journal {:?}; undamaged: copy {} generation {}, journal {:?}) and serves WRONG DATA: {n} blocks differ [{}]{}",
            report.superblock_copy,
            report.superblock.generation,
            report.clean,
            report.lines,
            report.dirty_lines,
            report.journal_span,
            report0.superblock_copy,
            report0.superblock.generation,
            report0.journal_span,
            diffs.join("; "),
            match verified {
                Ok(()) => String::new(),
                Err(p) => format!("; reading back: {}", panic_text(p)),
            }
        ));
    }
}

fn clone_images(i: &CrashImages) -> CrashImages {
    CrashImages {
        cache: i.cache.clone(),
        cores: i.cores.clone(),
    }
}

fn run_seed(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed ^ 0xda4a_9e00);
    let mode = if seed % 4 == 3 {
        CacheMode::Wt
    } else if rng.chance(0.6) {
        CacheMode::Wb
    } else {
        CacheMode::Wo
    };
    let modes = [mode];
    let (cfg, core_sizes) = random_config(&mut rng, &modes);
    let cfg = persistent(cfg, &mut rng);
    let bpl = cfg.line_size.blocks() as u64;
    let knobs = Knobs {
        p_io_error: if rng.chance(0.5) { 0.01 } else { 0.0 },
        p_apply_at_submit: rng.below(3) as f64 * 0.5,
        qd: 1 + rng.below(8) as usize,
        step_ns_max: 3_000_000,
        ..Knobs::default()
    };
    let mut env = Env::new(cfg, seed, knobs);
    env.check_durability = false;
    for (i, &n) in core_sizes.iter().enumerate() {
        env.add_core(i as u16, n);
    }
    let ncores = core_sizes.len() as u64;
    // Enough work for journal records and a running checkpoint (lazy modes).
    let mut steps = 0;
    loop {
        random_step(&mut env, &modes, ncores, bpl);
        steps += 1;
        let mc = env.cache.meta_counters();
        let enough = !mode.is_lazy() || (mc.checkpoints >= 1 && mc.commits >= 8);
        if (steps >= 600 && enough) || steps >= 6000 {
            break;
        }
    }
    let mut out = Outcome::default();
    let base = env.cache.config().clone();

    // (b) A power cut now, every completed write kept. Half the seeds first complete every
    // request and flush every core, so everything acknowledged is also durable.
    if rng.chance(0.5) {
        env.drain();
        for c in 0..ncores {
            env.submit(ReqOp::Flush, c as u16, 0, 0);
        }
        env.drain();
    }
    let legal = env.crash_legal_all();
    let (crash, _) = env.crash_check(CrashPattern::Kept);
    damage_image(seed, "crash", &base, &crash, &legal, &mut rng, &mut out);

    // (a) More work, then a clean stop.
    for _ in 0..300 {
        random_step(&mut env, &modes, ncores, bpl);
    }
    let clean = env.stop_images();
    let legal = env.crash_legal_all();
    damage_image(seed, "clean", &base, &clean, &legal, &mut rng, &mut out);
    let mc = env.cache.meta_counters();
    out.commits = mc.commits;
    out.checkpoints = mc.checkpoints;
    out
}

fn seeds() -> (u64, u64) {
    if let Ok(s) = std::env::var("TIERCACHE_DAMAGE_SEED") {
        return (s.parse().expect("seed"), 1);
    }
    let n = std::env::var("TIERCACHE_DAMAGE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    (0, n)
}

#[test]
fn single_byte_damage_is_refused_or_harmless() {
    let (first, n) = seeds();
    let mut tally: BTreeMap<(&'static str, &'static str), Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    let (mut commits, mut checkpoints) = (0, 0);
    for seed in first..first + n {
        let o = match catch_unwind(|| run_seed(seed)) {
            Ok(o) => o,
            Err(e) => {
                eprintln!(
                    "damage test failed at seed {seed}; replay: TIERCACHE_DAMAGE_SEED={seed} cargo test -p tiercache-core --test damage"
                );
                std::panic::resume_unwind(e);
            }
        };
        for (k, t) in o.tally {
            let a = tally.entry(k).or_default();
            a.tried += t.tried;
            a.refused += t.refused;
            a.loaded_ok += t.loaded_ok;
            a.other_copy += t.other_copy;
            a.fewer_cores += t.fewer_cores;
            a.bad += t.bad;
        }
        failures.extend(o.failures);
        commits += o.commits;
        checkpoints += o.checkpoints;
    }
    println!("damage test over {n} seeds ({commits} journal commits, {checkpoints} checkpoints):");
    println!(
        "{:<24}| {:^38} | {:^38}",
        "", "crash image", "clean-stop image"
    );
    println!(
        "{:<24}| {:>6} {:>8} {:>15} {:>6} | {:>6} {:>8} {:>15} {:>6}",
        "region",
        "tried",
        "refused",
        "loaded+correct",
        "WRONG",
        "tried",
        "refused",
        "loaded+correct",
        "WRONG"
    );
    for region in REGIONS {
        let c = tally.get(&("crash", region)).copied().unwrap_or_default();
        let k = tally.get(&("clean", region)).copied().unwrap_or_default();
        let ok = |t: Tally| format!("{} ({}/{})", t.loaded_ok, t.other_copy, t.fewer_cores);
        println!(
            "{:<24}| {:>6} {:>8} {:>15} {:>6} | {:>6} {:>8} {:>15} {:>6}",
            region,
            c.tried,
            c.refused,
            ok(c),
            c.bad,
            k.tried,
            k.refused,
            ok(k),
            k.bad
        );
    }
    println!(
        "loaded+correct (a/b): a = loaded from the other superblock copy, b = of those, its core table lacked a core (added again, as after a crash while adding it)"
    );
    for f in &failures {
        println!("FAIL: {f}");
    }
    assert!(
        failures.is_empty(),
        "{} damaged images were mishandled (listed above); first: {}",
        failures.len(),
        failures[0]
    );
    if n >= 20 {
        for region in REQUIRED {
            let tried: u32 = ["crash", "clean"]
                .iter()
                .map(|k| tally.get(&(*k, region)).map_or(0, |t| t.tried))
                .sum();
            assert!(tried > 0, "coverage too thin: no flip in {region}");
        }
        assert!(checkpoints > 0, "coverage too thin: no checkpoint");
    }
}
