//! Loading a persistent cache: superblock, tables, checkpoint, journal replay — after a clean
//! stop (warm: every line comes back) or after a crash (dirty lines come back, and clean blocks
//! only of lines the checkpoint proves equal to the core with no write intent or new mapping
//! after it in the journal; see `meta.rs` and `intent.rs` for why). Pure: the driver supplies a function that reads bytes of
//! the cache device; nothing is written here. The loaded cache then writes a superblock (clean
//! load) or a checkpoint (recovery) before it serves ([`Cache::is_ready`]).

use super::meta::Task;
use super::{Cache, CoreRecord};
use crate::config::{Config, Persist};
use crate::hash::FxHashMap;
use crate::units::{CoreId, LineId, LineSize};
use std::collections::BTreeMap;
use tiercache_format::DecodeError;
use tiercache_format::checkpoint::{LineRecord, decode_chunk_proven};
use tiercache_format::journal::{Entry, LineOp};
use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::{
    CHECKPOINT_CHUNK_BYTES, CacheState, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSETS, Superblock,
    TABLES_BYTES, TABLES_OFFSETS, lines_per_chunk,
};
use tiercache_format::tables::{CoreEntry, decode_config, decode_cores};

/// What loading found.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// The superblock in force and the copy it came from.
    pub superblock: Superblock,
    /// Copy (0 or 1).
    pub superblock_copy: usize,
    /// The other copy could not be decoded (what was wrong), if so.
    pub other_copy_error: Option<String>,
    /// The cache was stopped cleanly (otherwise this load is a recovery).
    pub clean: bool,
    /// The newest format version among the structures loaded (superblock, checkpoint chunks,
    /// journal entries replayed): 2 once a checkpoint proved lines or a write intent was
    /// journaled.
    pub format_version: u16,
    /// Cores in the core table.
    pub cores: Vec<CoreEntry>,
    /// Lines loaded, and how many of them hold dirty data.
    pub lines: u32,
    /// Lines with dirty blocks.
    pub dirty_lines: u32,
    /// Lines whose clean data was dropped because the cache was not stopped cleanly (and
    /// nothing proved them equal to the core).
    pub dropped_clean_lines: u32,
    /// After a crash: lines whose clean blocks came back because the checkpoint proved them
    /// equal to the core and no write intent followed (warm lines after a crash).
    pub warm_clean_lines: u32,
    /// Checkpoint chunks read.
    pub checkpoint_chunks: u32,
    /// Journal records replayed, and the sequence numbers they span.
    pub journal_records: u64,
    /// First and last sequence number replayed (equal-and-empty when none).
    pub journal_span: (u64, u64),
    /// Valid journal records found that replay did not need (older, or after a gap).
    pub journal_ignored: u64,
}

fn damaged(what: &str, e: impl std::fmt::Display) -> String {
    format!(
        "{what} is damaged ({e}); nothing was loaded — run `tiercache check` on the cache device"
    )
}

/// Reads `len` bytes at byte `offset`.
type ReadFn<'a> = &'a mut dyn FnMut(u64, &mut [u8]) -> Result<(), String>;

fn read_vec(read: ReadFn<'_>, offset: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut v = vec![0u8; len];
    read(offset, &mut v)?;
    Ok(v)
}

/// Reads and decodes both superblock copies: the newest valid one, its copy, and what was
/// wrong with the other (if anything).
pub fn read_superblock(read: ReadFn<'_>) -> Result<(Superblock, usize, Option<String>), String> {
    let a = read_vec(read, SUPERBLOCK_OFFSETS[0], SUPERBLOCK_BYTES)?;
    let b = read_vec(read, SUPERBLOCK_OFFSETS[1], SUPERBLOCK_BYTES)?;
    let (da, db) = (Superblock::decode(&a), Superblock::decode(&b));
    let errs = (da.as_ref().err().cloned(), db.as_ref().err().cloned());
    match Superblock::newest(da, db) {
        Ok((sb, copy)) => {
            let other = if copy == 0 { errs.1 } else { errs.0 };
            Ok((sb, copy, other.map(|e| e.to_string())))
        }
        Err((DecodeError::BadMagic { .. }, DecodeError::BadMagic { .. })) => {
            Err("this device holds no tiercache cache (no superblock at either copy)".to_string())
        }
        Err((ea, eb)) => Err(damaged(
            "the superblock",
            format!("copy A: {ea}; copy B: {eb}"),
        )),
    }
}

/// Reads the tables beside superblock copy `copy`: configuration and core table.
pub fn read_tables(
    read: ReadFn<'_>,
    copy: usize,
) -> Result<(tiercache_format::tables::ConfigRecord, Vec<CoreEntry>), String> {
    let buf = read_vec(read, TABLES_OFFSETS[copy], TABLES_BYTES)?;
    let (r, used) = record::decode(&buf).map_err(|e| damaged("the configuration record", e))?;
    if r.kind != RecordKind::Config {
        return Err(damaged("the tables", format!("{:?} record first", r.kind)));
    }
    let config = decode_config(r.payload).map_err(|e| damaged("the configuration record", e))?;
    let (r, _) = record::decode(&buf[used..]).map_err(|e| damaged("the core table", e))?;
    if r.kind != RecordKind::CoreTable {
        return Err(damaged("the tables", format!("{:?} record second", r.kind)));
    }
    let cores = decode_cores(r.payload).map_err(|e| damaged("the core table", e))?;
    Ok((config, cores))
}

/// Whether a load from superblock `sb` reads the journal: always, except after a clean stop
/// when the other superblock copy is valid too (`other_valid`; see [`open`]).
pub fn journal_needed(sb: &Superblock, other_valid: bool) -> bool {
    sb.state != CacheState::Clean || !other_valid
}

/// The journal records in the region: every valid one (from either half) by sequence number,
/// and the highest sequence number seen. Records sit at 4 KiB boundaries; anything else is
/// skipped.
pub fn scan_journal(
    read: ReadFn<'_>,
    sb: &Superblock,
) -> Result<(BTreeMap<u64, Entry>, u64), String> {
    let j = sb.layout.journal;
    let buf = read_vec(read, j.offset, j.bytes as usize)?;
    let half = super::meta::journal_half(j.bytes) as usize;
    let mut found = BTreeMap::new();
    let mut max_seq = 0;
    let align = super::meta::RECORD_ALIGN as usize;
    // Every record is in both halves at the same offset; either valid copy will do.
    for copy in [&buf[..half], &buf[half..2 * half]] {
        let mut off = 0usize;
        while off < copy.len() {
            let Ok((r, used)) = record::decode(&copy[off..]) else {
                off += align;
                continue;
            };
            if r.kind == RecordKind::Journal
                && let Ok(e) = Entry::decode(r.payload)
                && e.line_size == sb.line_size
            {
                max_seq = max_seq.max(e.seq);
                found.entry(e.seq).or_insert(e);
                off += used.div_ceil(align) * align;
                continue;
            }
            off += align;
        }
    }
    Ok((found, max_seq))
}

fn apply_op(rec: &mut LineRecord, op: &LineOp) {
    match *op {
        LineOp::Map {
            core,
            core_line,
            class,
            ..
        } => {
            *rec = LineRecord {
                core: Some(core),
                core_line,
                class,
                valid: 0,
                dirty: 0,
            }
        }
        LineOp::Unmap { .. } => *rec = LineRecord::default(),
        LineOp::State { valid, dirty, .. } => {
            if rec.core.is_some() {
                rec.valid = valid;
                rec.dirty = dirty;
            }
        }
        LineOp::Class { class, .. } => {
            if rec.core.is_some() {
                rec.class = class;
            }
        }
        LineOp::Intent { .. } => unreachable!("intents are replayed as ranges"),
    }
}

fn op_line(op: &LineOp) -> u32 {
    match *op {
        LineOp::Map { line, .. }
        | LineOp::Unmap { line }
        | LineOp::State { line, .. }
        | LineOp::Class { line, .. } => line,
        LineOp::Intent { line, .. } => line,
    }
}

/// Opens the cache on a device: `base` gives what is not stored (pool sizes and the like);
/// geometry, mode, policies, parameters, IO classes and cores come from the device. Returns the
/// cache — which first writes its superblock (or, after a crash, a checkpoint) and serves once
/// [`Cache::is_ready`] — and what was found. Errors are one line, say what is wrong and which
/// command helps; nothing on the device is changed by a failed open.
pub fn open(base: &Config, read: ReadFn<'_>) -> Result<(Cache, LoadReport), String> {
    let (sb, copy, other) = read_superblock(read)?;
    let line_size = LineSize::ALL
        .into_iter()
        .find(|l| l.bytes() == sb.line_size as u64)
        .ok_or_else(|| damaged("the superblock", format!("line size {}", sb.line_size)))?;
    let (config, cores) = read_tables(read, copy)?;
    let mut cfg = base.clone();
    cfg.lines = sb.lines;
    cfg.line_size = line_size;
    cfg.data_offset = crate::units::Lba(sb.layout.data.offset / 512);
    cfg.volatile = false;
    cfg.persist = Some(Persist {
        superblock: sb,
        superblock_copy: copy,
    });
    let classes = super::tables::apply_config_record(&mut cfg, &config)
        .map_err(|e| damaged("the configuration record", e))?;
    let mut cache = Cache::new(cfg).map_err(|e| damaged("the superblock", e))?;
    cache.classes = classes;
    cache.rebuild_evict_order();
    for e in &cores {
        let id = CoreId(e.id as u16);
        cache
            .add_core(id, e.size_blocks)
            .map_err(|err| damaged("the core table", err))?;
        let p = super::tables::cutoff_params(e).map_err(|err| damaged("the core table", err))?;
        cache
            .set_cutoff(id, p)
            .map_err(|err| damaged("the core table", err))?;
        cache
            .set_core_record(
                id,
                CoreRecord {
                    identity: e.identity.clone(),
                    export_name: e.export_name.clone(),
                    device: e.device.clone(),
                },
            )
            .map_err(|err| damaged("the core table", err))?;
    }

    // Journal: the consecutive run of records from the superblock's start. After a clean stop
    // there is none: the final checkpoint is taken once the cache is quiet (no request, no
    // writeback, no commit; none can start while stopping), so it holds every line's state and
    // every record in the region is older than its sequence. The region is then not read at
    // all — unless the other superblock copy is damaged: a newer copy that said `Running`
    // could be the damaged one, with records after this one's start that replay needs (the
    // scan then refuses the load, below).
    let (found, max_seq) = if journal_needed(&sb, other.is_none()) {
        scan_journal(read, &sb)?
    } else {
        (BTreeMap::new(), 0)
    };
    let mut per_line: FxHashMap<u32, Vec<LineOp>> = FxHashMap::default();
    // Lines with a write intent (or a new mapping) after the checkpoint: not proven.
    let mut unproven = vec![0u64; (sb.lines as usize).div_ceil(64)];
    let mut seq = sb.journal_seq;
    let mut replayed = 0u64;
    let mut format_version = sb.version;
    while let Some(e) = found.get(&seq) {
        format_version = format_version.max(e.version());
        for op in &e.ops {
            match *op {
                LineOp::Intent { line, count } => {
                    let end = line.saturating_add(count).min(sb.lines);
                    for l in line..end {
                        unproven[l as usize / 64] |= 1 << (l % 64);
                    }
                }
                LineOp::Map { line, .. } => {
                    if line < sb.lines {
                        unproven[line as usize / 64] |= 1 << (line % 64);
                    }
                    per_line.entry(line).or_default().push(*op);
                }
                _ => per_line.entry(op_line(op)).or_default().push(*op),
            }
        }
        replayed += 1;
        seq += 1;
    }
    let journal_ignored = found.len() as u64 - replayed;
    // A record is written only after the one before it is durable, so a valid record past the
    // end of the run means a damaged record in it (or a stale superblock copy): refuse.
    if let Some((&late, _)) = found.range(seq + 1..).next() {
        return Err(damaged(
            "the journal",
            format!("record {seq} is missing or damaged but record {late} follows"),
        ));
    }

    // The journal's operations by line, in line order: the chunks below go through the lines
    // in order, so a cursor finds each line's operations (a hash lookup per line cost more).
    let mut per_line: Vec<(u32, Vec<LineOp>)> = per_line.into_iter().collect();
    per_line.sort_unstable_by_key(|e| e.0);
    let mut ops_at = 0;

    // Checkpoint chunks, merged with the journal line by line.
    let clean = sb.state == CacheState::Clean;
    let lpc = lines_per_chunk(sb.line_size);
    let chunks = sb.lines.div_ceil(lpc);
    let mut report = LoadReport {
        superblock: sb,
        superblock_copy: copy,
        other_copy_error: other,
        clean,
        format_version,
        cores,
        lines: 0,
        dirty_lines: 0,
        dropped_clean_lines: 0,
        warm_clean_lines: 0,
        checkpoint_chunks: 0,
        journal_records: replayed,
        journal_span: (sb.journal_seq, seq.saturating_sub(1)),
        journal_ignored,
    };
    for i in 0..chunks {
        let first = i * lpc;
        let count = (first + lpc).min(sb.lines) - first;
        let (recs, proven) = if sb.has_checkpoint {
            let region = sb.layout.checkpoint[sb.checkpoint as usize];
            let buf = read_vec(
                read,
                region.offset + i as u64 * CHECKPOINT_CHUNK_BYTES,
                CHECKPOINT_CHUNK_BYTES as usize,
            )?;
            let what = format!("checkpoint chunk {i}");
            let (r, _) = record::decode(&buf).map_err(|e| damaged(&what, e))?;
            if r.kind != RecordKind::Checkpoint {
                return Err(damaged(&what, format!("{:?} record", r.kind)));
            }
            let (f, cp_seq, recs, proven) =
                decode_chunk_proven(r.payload, r.version).map_err(|e| damaged(&what, e))?;
            if cp_seq != sb.journal_seq {
                return Err(damaged(
                    &what,
                    format!(
                        "it belongs to the checkpoint of journal record {cp_seq}, the superblock names {}",
                        sb.journal_seq
                    ),
                ));
            }
            if f != first || recs.len() as u32 != count {
                return Err(damaged(
                    &what,
                    format!(
                        "it holds lines {f}+{} instead of {first}+{count}",
                        recs.len()
                    ),
                ));
            }
            report.checkpoint_chunks += 1;
            report.format_version = report.format_version.max(r.version);
            (recs, proven)
        } else {
            (
                vec![LineRecord::default(); count as usize],
                vec![false; count as usize],
            )
        };
        // The mapping table is far bigger than the CPU's caches: start loading the slot each
        // line will probe a few lines ahead, so the misses overlap.
        const AHEAD: usize = 16;
        for r in recs.iter().take(AHEAD) {
            if let Some(c) = r.core {
                cache.map.prefetch(CoreId(c as u16), r.core_line);
            }
        }
        for k in 0..recs.len() {
            if let Some(r) = recs.get(k + AHEAD)
                && let Some(c) = r.core
            {
                cache.map.prefetch(CoreId(c as u16), r.core_line);
            }
            let mut rec = recs[k];
            let l = first + k as u32;
            while per_line.get(ops_at).is_some_and(|e| e.0 < l) {
                ops_at += 1;
            }
            if let Some((ol, ops)) = per_line.get(ops_at)
                && *ol == l
            {
                for op in ops {
                    apply_op(&mut rec, op);
                }
            }
            let Some(core) = rec.core else { continue };
            let proven = proven[k] && unproven[l as usize / 64] & (1 << (l % 64)) == 0;
            if !clean && rec.valid != rec.dirty {
                if proven {
                    report.warm_clean_lines += 1;
                } else if rec.dirty == 0 {
                    report.dropped_clean_lines += 1;
                    continue;
                } else {
                    rec.valid = rec.dirty;
                }
            }
            if rec.valid == 0 {
                continue;
            }
            cache
                .restore_at(
                    LineId(l),
                    CoreId(core as u16),
                    rec.core_line,
                    rec.valid,
                    rec.dirty,
                    rec.class,
                )
                .map_err(|e| damaged(&format!("the state of line {l}"), e))?;
            report.lines += 1;
            if rec.dirty != 0 {
                report.dirty_lines += 1;
            }
        }
    }

    let m = cache.meta.as_mut().expect("persistent");
    if clean {
        // The final checkpoint may prove every line: a change needs an intent first. (After a
        // crash every region stays open: nothing is served before the recovery checkpoint,
        // which proves every clean block kept.)
        m.intents.all_proven();
    }
    m.next_seq = (max_seq + 1).max(sb.journal_seq);
    m.reset_tasks();
    m.push_task(if clean {
        Task::Superblock {
            state: CacheState::Running,
        }
    } else {
        Task::Checkpoint {
            state: CacheState::Running,
        }
    });
    Ok((cache, report))
}
