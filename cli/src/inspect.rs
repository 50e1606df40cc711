//! `tiercache inspect` and `tiercache check`: offline and read-only. They open the cache device
//! for reading only and never write a byte (SPEC C10).
//!
//! `inspect` shows the superblock in force, the configuration and core table, the journal and
//! what a load would bring back. `check` verifies every checksum (both superblock copies, both
//! table areas, both copies of every journal record, every chunk of the current checkpoint) and
//! every cross-reference a load checks (cores named by lines, lines mapped twice, masks), and
//! says what it found, as text or JSON; its exit status says what it found ([`CHECK_EXIT`]).

use serde_json::{Value, json};
use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use tiercache_core::Config;
use tiercache_core::cache::{LoadReport, open, read_superblock, read_tables};
use tiercache_core::units::LineSize;
use tiercache_format::checkpoint::decode_chunk_proven;
use tiercache_format::journal::Entry;
use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::{
    CHECKPOINT_CHUNK_BYTES, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS, Superblock, lines_per_chunk,
};
use tiercache_format::tables::CoreIdentity;

/// Arguments of `inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The cache device (file or block device).
    #[arg(long, value_name = "DEV")]
    cache_device: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The exit statuses of `check`, as its `--help` and docs/CASADM.md list them.
pub const CHECK_EXIT: &str = "Exit status:
  0  the cache loads (every checksum holds, or only findings a load repairs)
  1  damaged: the cache would not load, or the device holds no tiercache cache
  2  usage: the command line was wrong
  3  cannot open or read the device";

/// Arguments of `check`.
#[derive(clap::Args)]
#[command(after_help = CHECK_EXIT)]
pub struct CheckArgs {
    /// The cache device (file or block device).
    #[arg(long, value_name = "DEV")]
    cache_device: PathBuf,
    /// Print one JSON object (what was checked, what was found, `result` and `exit_code`)
    /// instead of text.
    #[arg(long)]
    json: bool,
}

struct Dev {
    f: File,
    len: u64,
    path: PathBuf,
    /// Whether a read failed with an IO error (not merely past the end).
    io_failed: Cell<bool>,
}

impl Dev {
    fn open(path: &PathBuf) -> Result<Dev, String> {
        let f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // Block devices report size 0 in metadata; seek to the end instead.
        let len = std::io::Seek::seek(&mut &f, std::io::SeekFrom::End(0))
            .map_err(|e| format!("cannot size {}: {e}", path.display()))?;
        Ok(Dev {
            f,
            len,
            path: path.clone(),
            io_failed: Cell::new(false),
        })
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), String> {
        if off
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.len)
        {
            return Err(format!(
                "{} is {} bytes; the metadata names bytes {off}..{} (truncated or not this cache's device)",
                self.path.display(),
                self.len,
                off + buf.len() as u64
            ));
        }
        self.f.read_exact_at(buf, off).map_err(|e| {
            self.io_failed.set(true);
            format!("reading {} at byte {off}: {e}", self.path.display())
        })
    }
}

fn base_config() -> Config {
    Config::new(16, LineSize::K4)
}

fn identity(i: &CoreIdentity) -> String {
    match i {
        CoreIdentity::Block { serial } => format!("block device, serial {serial}"),
        CoreIdentity::File { fs_uuid, inode } => {
            let u: String = fs_uuid.iter().map(|b| format!("{b:02x}")).collect();
            format!("file, fs {u}, inode {inode}")
        }
        CoreIdentity::Rbd { pool_id, image_id } => format!("rbd pool {pool_id}, image {image_id}"),
        CoreIdentity::Nbd { uri } => format!("nbd {uri}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn journal_words(r: &LoadReport) -> String {
    if r.journal_records == 0 {
        "nothing in the journal to replay".into()
    } else {
        format!(
            "{} journal records to replay ({}..={})",
            r.journal_records, r.journal_span.0, r.journal_span.1
        )
    }
}

/// What a load would bring back, and the configuration it loaded (for the write log's scan).
fn load(dev: &Dev) -> Result<(LoadReport, Config), String> {
    let mut read = |off: u64, buf: &mut [u8]| dev.read(off, buf);
    open(&base_config(), &mut read).map(|(c, r)| (r, c.config().clone()))
}

/// What a write log (mode `wl`) holds: scanned read-only as recovery would.
struct LogSummary {
    entries: usize,
    data_blocks: u64,
    generations: Option<(u64, u64)>,
    ring_bytes: u64,
    used_bytes: u64,
}

/// Scans the write log of a cache whose read cache loaded with configuration `loaded` (the
/// load's error otherwise: without it the log cannot be found).
fn scan_log(
    dev: &Dev,
    loaded: &Result<(LoadReport, Config), String>,
) -> Result<LogSummary, String> {
    let read_cache = loaded.as_ref().map_err(Clone::clone)?.1.clone();
    let cfg = tiercache_core::wl::WlConfig::on_device(read_cache)?;
    let mut read_lba = |lba: tiercache_core::units::Lba, buf: &mut [u8]| dev.read(lba.0 * 512, buf);
    let rec = tiercache_core::wl::scan(&cfg, &mut read_lba)?;
    Ok(LogSummary {
        entries: rec.entries.len(),
        data_blocks: rec
            .entries
            .iter()
            .filter(|h| h.kind.has_data())
            .map(|h| h.blocks as u64)
            .sum(),
        generations: rec
            .entries
            .first()
            .zip(rec.entries.last())
            .map(|(a, b)| (a.gen_, b.gen_)),
        ring_bytes: rec.sb.ring_blocks * 512,
        used_bytes: (rec.head_pos - rec.sb.tail_pos) * 512,
    })
}

fn log_words(l: &LogSummary) -> String {
    format!(
        "{} entries ({} bytes of data not written back{}), {} of {} log bytes in use",
        l.entries,
        l.data_blocks * 512,
        match l.generations {
            Some((a, b)) => format!(", generations {a}..={b}"),
            None => String::new(),
        },
        l.used_bytes,
        l.ring_bytes
    )
}

/// `tiercache inspect`.
pub fn inspect(a: InspectArgs) -> Result<(), String> {
    let dev = Dev::open(&a.cache_device)?;
    let mut read = |off: u64, buf: &mut [u8]| dev.read(off, buf);
    let (sb, copy, other) = read_superblock(&mut read)?;
    let (config, cores) = read_tables(&mut read, copy)?;
    let loaded = load(&dev);
    let wl = sb.layout.log.bytes > 0;
    let mode = if wl {
        "wl"
    } else {
        ["wt", "wb", "wa", "wi", "pt", "wo"]
            .get((config.mode as usize).wrapping_sub(1))
            .copied()
            .unwrap_or("?")
    };
    let log = wl.then(|| scan_log(&dev, &loaded));
    let report = loaded.map(|(r, _)| r);
    if a.json {
        let j = json!({
            "device": a.cache_device.display().to_string(),
            "format_version": sb.version,
            "generation": sb.generation,
            "superblock_copy": copy,
            "other_copy_error": other,
            "cache_id": hex(&sb.cache_id),
            "device_bytes": sb.device_bytes,
            "line_size": sb.line_size,
            "lines": sb.lines,
            "state": if sb.state == tiercache_format::superblock::CacheState::Clean { "clean" } else { "running" },
            "mode": mode,
            "checkpoint": if sb.has_checkpoint { Some(sb.checkpoint) } else { None },
            "journal_seq": sb.journal_seq,
            "regions": {
                "journal": [sb.layout.journal.offset, sb.layout.journal.bytes],
                "checkpoint0": [sb.layout.checkpoint[0].offset, sb.layout.checkpoint[0].bytes],
                "checkpoint1": [sb.layout.checkpoint[1].offset, sb.layout.checkpoint[1].bytes],
                "data": [sb.layout.data.offset, sb.layout.data.bytes],
                "log": [sb.layout.log.offset, sb.layout.log.bytes],
            },
            "write_log": match &log {
                None => serde_json::Value::Null,
                Some(Ok(l)) => json!({"ok": true, "entries": l.entries,
                    "dirty_bytes": l.data_blocks * 512,
                    "generations": l.generations.map(|(a, b)| [a, b]),
                    "log_bytes_used": l.used_bytes, "log_bytes": l.ring_bytes}),
                Some(Err(e)) => json!({"ok": false, "error": e}),
            },
            "cores": cores.iter().map(|c| json!({
                "id": c.id,
                "size_blocks": c.size_blocks,
                "export": c.export_name,
                "device": c.device,
                "identity": identity(&c.identity),
            })).collect::<Vec<_>>(),
            "load": match &report {
                Ok(r) => json!({
                    "ok": true,
                    "clean": r.clean,
                    "lines": r.lines,
                    "dirty_lines": r.dirty_lines,
                    "dropped_clean_lines": r.dropped_clean_lines,
                    "journal_records": r.journal_records,
                    "journal_span": [r.journal_span.0, r.journal_span.1],
                }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
        });
        println!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return Ok(());
    }
    println!("cache device {}", a.cache_device.display());
    println!(
        "  format version {}, cache id {}, superblock copy {} (generation {}){}",
        sb.version,
        hex(&sb.cache_id),
        if copy == 0 { "A" } else { "B" },
        sb.generation,
        match &other {
            Some(e) => format!("; the other copy is unusable: {e}"),
            None => String::new(),
        }
    );
    println!(
        "  {} lines of {} KiB ({} GiB of cache data), device {} bytes",
        sb.lines,
        sb.line_size / 1024,
        sb.layout.data.bytes >> 30,
        sb.device_bytes
    );
    println!(
        "  state {}, mode {mode}, checkpoint {}, journal from record {}",
        if sb.state == tiercache_format::superblock::CacheState::Clean {
            "clean (stopped)"
        } else {
            "running (not stopped cleanly)"
        },
        if sb.has_checkpoint {
            format!("region {}", sb.checkpoint)
        } else {
            "none yet".into()
        },
        sb.journal_seq
    );
    println!("  cores:");
    for c in &cores {
        println!(
            "    {}: export {:?}, device {:?}, {} blocks, {}",
            c.id,
            c.export_name,
            c.device,
            c.size_blocks,
            identity(&c.identity)
        );
    }
    match report {
        Ok(r) => println!(
            "  a load would bring back {} lines ({} dirty){}; journal records {}..{} ({} replayed)",
            r.lines,
            r.dirty_lines,
            if r.clean {
                String::new()
            } else {
                format!(
                    ", dropping {} clean lines (not stopped cleanly)",
                    r.dropped_clean_lines
                )
            },
            r.journal_span.0,
            r.journal_span.1,
            r.journal_records
        ),
        Err(e) => println!("  a load would FAIL: {e}"),
    }
    match log {
        None => {}
        Some(Ok(l)) => println!("  write log: {}", log_words(&l)),
        Some(Err(e)) => println!("  write log: a scan FAILS: {e}"),
    }
    Ok(())
}

/// What `check` found: its text lines and the same as JSON.
struct Report {
    lines: Vec<String>,
    json: serde_json::Map<String, Value>,
    /// Findings that stop the cache from loading.
    problems: u32,
    /// Findings a load repairs.
    notes: u32,
}

impl Report {
    fn say(&mut self, line: String) {
        self.lines.push(line);
    }

    fn set(&mut self, key: &str, v: Value) {
        self.json.insert(key.into(), v);
    }
}

/// `tiercache check`: prints what it found (text, or JSON with `--json`) and returns the exit
/// status of [`CHECK_EXIT`].
pub fn check(a: CheckArgs) -> i32 {
    let mut r = Report {
        lines: vec![format!("checking {} (read-only)", a.cache_device.display())],
        json: serde_json::Map::new(),
        problems: 0,
        notes: 0,
    };
    r.set("device", json!(a.cache_device.display().to_string()));
    let (code, result, error) = match Dev::open(&a.cache_device) {
        Err(e) => (3, "cannot-open", Some(e)),
        Ok(dev) => match check_device(&dev, &mut r) {
            Err(e) if dev.io_failed.get() => (3, "cannot-read", Some(e)),
            Err(e) => (1, "damaged", Some(e)),
            Ok(()) if r.problems > 0 => (
                1,
                "damaged",
                Some(format!(
                    "check found {} problem(s) that stop this cache from loading (see above); its data region is untouched",
                    r.problems
                )),
            ),
            Ok(()) if r.notes > 0 => {
                let n = r.notes;
                r.say(format!(
                    "check: the cache loads ({n} repairable finding(s) above)"
                ));
                (0, "repairable", None)
            }
            Ok(()) => {
                r.say("check: the cache loads and every checksum holds".into());
                (0, "clean", None)
            }
        },
    };
    r.set("problems", json!(r.problems));
    r.set("repairable", json!(r.notes));
    r.set("result", json!(result));
    r.set("error", json!(error));
    r.set("exit_code", json!(code));
    if a.json {
        let j = Value::Object(std::mem::take(&mut r.json));
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else if code != 3 {
        for l in &r.lines {
            println!("{l}");
        }
    }
    if let Some(e) = error {
        eprintln!("tiercache: {e}");
    }
    code
}

/// Checks `dev`, saying what it finds in `r`; an error when it cannot go on.
fn check_device(dev: &Dev, rep: &mut Report) -> Result<(), String> {
    let sb = check_superblocks(dev, rep)?;
    check_journal(dev, &sb, rep)?;
    check_checkpoint(dev, &sb, rep)?;
    check_load(dev, &sb, rep);
    Ok(())
}

/// Both superblock copies and their tables, said in `rep`; the copy in force (the newest
/// good one). An error when neither is usable.
fn check_superblocks(dev: &Dev, rep: &mut Report) -> Result<Superblock, String> {
    let mut best: Option<(Superblock, usize)> = None;
    let mut copies = Vec::new();
    for (i, &off) in SUPERBLOCK_OFFSETS.iter().enumerate() {
        let mut b = vec![0u8; SUPERBLOCK_BYTES];
        dev.read(off, &mut b)?;
        let name = ["A", "B"][i];
        match Superblock::decode(&b) {
            Ok(sb) => {
                let mut read = |o: u64, buf: &mut [u8]| dev.read(o, buf);
                match read_tables(&mut read, i) {
                    Ok((_, cores)) => {
                        rep.say(format!(
                            "  superblock {name}: ok (generation {}), tables ok ({} core(s))",
                            sb.generation,
                            cores.len()
                        ));
                        copies.push(
                            json!({"copy": name, "ok": true, "generation": sb.generation,
                            "tables_ok": true, "cores": cores.len()}),
                        );
                    }
                    Err(e) => {
                        rep.say(format!(
                            "  superblock {name}: ok (generation {}), tables: {e}",
                            sb.generation
                        ));
                        copies.push(
                            json!({"copy": name, "ok": true, "generation": sb.generation,
                            "tables_ok": false, "error": e}),
                        );
                        rep.notes += 1;
                    }
                }
                if best.is_none_or(|(b, _)| sb.generation > b.generation) {
                    best = Some((sb, i));
                }
            }
            Err(e) => {
                rep.say(format!("  superblock {name}: {e}"));
                copies.push(json!({"copy": name, "ok": false, "error": e.to_string()}));
                rep.notes += 1;
            }
        }
    }
    rep.set("superblocks", json!(copies));
    let Some((sb, copy)) = best else {
        rep.say(
            "  no usable superblock: this is not a tiercache cache device, or both copies are damaged"
                .into(),
        );
        return Err("check found no usable superblock".into());
    };
    let name = ["A", "B"][copy];
    rep.say(format!(
        "  in force: copy {name} (generation {})",
        sb.generation
    ));
    rep.set(
        "in_force",
        json!({"copy": name, "generation": sb.generation}),
    );
    Ok(sb)
}

/// The journal: both copies of every record, said in `rep`.
fn check_journal(dev: &Dev, sb: &Superblock, rep: &mut Report) -> Result<(), String> {
    let j = sb.layout.journal;
    let mut jb = vec![0u8; j.bytes as usize];
    dev.read(j.offset, &mut jb)?;
    let half = tiercache_core::cache::journal_half(j.bytes) as usize;
    let mut copies: std::collections::BTreeMap<u64, [bool; 2]> = Default::default();
    let mut damaged_frames = [0u32; 2];
    for (h, part) in [&jb[..half], &jb[half..2 * half]].into_iter().enumerate() {
        let mut off = 0;
        while off < part.len() {
            match record::decode(&part[off..]) {
                Ok((r, used)) if r.kind == RecordKind::Journal => {
                    if let Ok(e) = Entry::decode(r.payload) {
                        copies.entry(e.seq).or_default()[h] = true;
                    }
                    off += used.div_ceil(4096) * 4096;
                    continue;
                }
                Err(tiercache_format::DecodeError::BadChecksum { .. }) => damaged_frames[h] += 1,
                _ => {}
            }
            off += 4096;
        }
    }
    let live: Vec<_> = copies.range(sb.journal_seq..).collect();
    let one_copy = live.iter().filter(|(_, c)| !(c[0] && c[1])).count();
    let bad_frames = damaged_frames[0] + damaged_frames[1];
    rep.say(format!(
        "  journal: {} live records from {} ({} with only one good copy: repaired on load), {} frames with a bad checksum",
        live.len(),
        sb.journal_seq,
        one_copy,
        bad_frames
    ));
    rep.set(
        "journal",
        json!({"live_records": live.len(), "from": sb.journal_seq,
            "one_good_copy": one_copy, "bad_checksum_frames": bad_frames}),
    );
    if one_copy > 0 || bad_frames > 0 {
        rep.notes += 1;
    }
    Ok(())
}

/// The checkpoint's chunks, said in `rep`.
fn check_checkpoint(dev: &Dev, sb: &Superblock, rep: &mut Report) -> Result<(), String> {
    if sb.has_checkpoint {
        let region = sb.layout.checkpoint[sb.checkpoint as usize];
        let lpc = lines_per_chunk(sb.line_size);
        let chunks = sb.lines.div_ceil(lpc);
        let mut bad = Vec::new();
        let mut buf = vec![0u8; CHECKPOINT_CHUNK_BYTES as usize];
        for i in 0..chunks {
            dev.read(region.offset + i as u64 * CHECKPOINT_CHUNK_BYTES, &mut buf)?;
            let ok = match record::decode(&buf) {
                Ok((r, _)) if r.kind == RecordKind::Checkpoint => {
                    match decode_chunk_proven(r.payload, r.version) {
                        Ok((first, seq, _, _)) => first == i * lpc && seq == sb.journal_seq,
                        Err(_) => false,
                    }
                }
                _ => false,
            };
            if !ok {
                if bad.len() < 5 {
                    rep.say(format!(
                        "  checkpoint chunk {i}: damaged or not of this checkpoint"
                    ));
                }
                bad.push(i);
            }
        }
        rep.say(format!(
            "  checkpoint region {}: {chunks} chunks, {} damaged",
            sb.checkpoint,
            bad.len()
        ));
        rep.set(
            "checkpoint",
            json!({"region": sb.checkpoint, "chunks": chunks, "damaged": bad.len(),
                "damaged_chunks": bad.iter().take(100).collect::<Vec<_>>()}),
        );
        if !bad.is_empty() {
            rep.problems += 1;
        }
    } else {
        rep.say("  checkpoint: none yet (a new cache: the journal holds everything)".into());
        rep.set("checkpoint", Value::Null);
    }
    Ok(())
}

/// The cross-references a load checks, and the write log, said in `rep`.
fn check_load(dev: &Dev, sb: &Superblock, rep: &mut Report) {
    let loaded = load(dev);
    match loaded.as_ref().map(|(l, _)| l) {
        Ok(l) => {
            rep.say(format!(
                "  load: ok — {} lines ({} dirty){}, {}",
                l.lines,
                l.dirty_lines,
                if l.clean {
                    ", stopped cleanly".to_string()
                } else {
                    format!(
                        ", not stopped cleanly ({} clean lines would be dropped)",
                        l.dropped_clean_lines
                    )
                },
                journal_words(l)
            ));
            rep.set(
                "load",
                json!({"ok": true, "lines": l.lines, "dirty_lines": l.dirty_lines,
                    "clean": l.clean, "dropped_clean_lines": l.dropped_clean_lines,
                    "journal_records": l.journal_records}),
            );
        }
        Err(e) => {
            rep.say(format!("  load: FAILS — {e}"));
            rep.set("load", json!({"ok": false, "error": e}));
            rep.problems += 1;
        }
    }
    if sb.layout.log.bytes > 0 {
        match scan_log(dev, &loaded) {
            Ok(l) => {
                rep.say(format!("  write log: ok — {}", log_words(&l)));
                rep.set(
                    "write_log",
                    json!({"ok": true, "entries": l.entries, "dirty_bytes": l.data_blocks * 512,
                        "log_bytes_used": l.used_bytes, "log_bytes": l.ring_bytes}),
                );
            }
            Err(e) => {
                rep.say(format!("  write log: FAILS — {e}"));
                rep.set("write_log", json!({"ok": false, "error": e}));
                rep.problems += 1;
            }
        }
    }
}
