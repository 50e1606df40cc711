//! The on-disk decoders of `tiercache-format`: superblock, record frame, checkpoint chunk,
//! journal entry, core table, configuration record, and the write log's entry header and
//! superblock (`wlog`).
//!
//! `format/tests/golden.rs` already runs 20,000 mutated inputs per decoder for "never panics";
//! these targets add the structure-aware generators (valid values from the encoders, checksum
//! sealed again after a mutation) and the round trips: every generated value decodes to
//! itself, and every input that decodes re-encodes to bytes that decode to the same value —
//! byte for byte where the encoding is canonical.

use crate::mutate::{Field, Rng, Sample};
use crate::round_trip_checked;
use tiercache_format::FORMAT_VERSION;
use tiercache_format::checkpoint::{self, CHUNK_HEADER, CLASSES, LineRecord, UNMAPPED};
use tiercache_format::crc::crc32c;
use tiercache_format::journal::{Entry, LineOp};
use tiercache_format::record::{self, RECORD_HEADER, RecordKind};
use tiercache_format::superblock::{
    CacheState, Layout, SUPERBLOCK_BYTES, Superblock, checkpoint_bytes_per_line,
};
use tiercache_format::tables::{
    ConfigRecord, CoreEntry, CoreIdentity, STRING_MAX, decode_config, decode_cores, encode_config,
    encode_cores,
};
use tiercache_format::wlog::{LOG_BLOCK, LogHeader, LogKind, LogSuper};

// ----- shared generators -----

fn line_size(rng: &mut Rng) -> u32 {
    4096 << rng.below(5)
}

fn blocks_mask(line_size: u32) -> u128 {
    let b = line_size / 512;
    if b == 128 {
        u128::MAX
    } else {
        (1u128 << b) - 1
    }
}

/// Random valid and dirty masks for a line: dirty ⊆ valid ⊆ the line's blocks.
fn masks(rng: &mut Rng, line_size: u32) -> (u128, u128) {
    let m = blocks_mask(line_size);
    let r = |rng: &mut Rng| ((rng.next_u64() as u128) << 64 | rng.next_u64() as u128) & m;
    let valid = match rng.below(4) {
        0 => 0,
        1 => m,
        _ => r(rng),
    };
    let dirty = match rng.below(3) {
        0 => 0,
        1 => valid,
        _ => valid & r(rng),
    };
    (valid, dirty)
}

/// A string for a table field: empty, ASCII, UTF-8 of several widths, or long.
pub(crate) fn string(rng: &mut Rng) -> String {
    const PARTS: &[&str] = &[
        "osd0",
        "vm-1",
        "/dev/sdb",
        "nbd+unix:///e?socket=/s",
        "é",
        "日本",
        "🦀",
        " ",
        "\\",
        "\"",
        "\u{0}",
        "rbd",
        "WWN-5000c500a1b2c3d4",
    ];
    match rng.below(10) {
        0 => String::new(),
        1 => "x".repeat(rng.range(STRING_MAX as u64 - 8, STRING_MAX as u64) as usize),
        _ => (0..rng.below(6)).map(|_| *rng.pick(PARTS)).collect(),
    }
}

// ----- superblock -----

fn sb_seal(b: &mut [u8]) {
    if b.len() < 16 {
        return;
    }
    let used = u16::from_le_bytes([b[10], b[11]]) as usize;
    if used < 16 || used > b.len() {
        return;
    }
    b[12..16].fill(0);
    let crc = crc32c(&b[..used]);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// A valid superblock: a layout planned for a random device, random identity and state.
pub fn gen_superblock(rng: &mut Rng) -> Sample {
    let ls = line_size(rng);
    let (device_bytes, layout, lines) = loop {
        let top = 1 << rng.range(23, 42);
        let d = rng.range(4 << 20, top);
        if let Some((l, n)) = Layout::plan(d, ls, rng.range(0, 64 << 20)) {
            break (d, l, n);
        }
    };
    let lines = if rng.one_in(4) {
        rng.below(lines as u64 + 1) as u32
    } else {
        lines
    };
    let mut cache_id = [0u8; 16];
    cache_id.copy_from_slice(&rng.bytes(16));
    let sb = Superblock {
        version: tiercache_format::superblock::SUPERBLOCK_VERSION,
        generation: rng.interesting(64),
        cache_id,
        device_bytes,
        line_size: ls,
        lines,
        state: if rng.one_in(2) {
            CacheState::Clean
        } else {
            CacheState::Running
        },
        checkpoint: rng.below(2) as u8,
        has_checkpoint: rng.one_in(2),
        journal_seq: rng.interesting(64),
        layout,
    };
    let bytes = sb.encode();
    assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
    assert_eq!(Superblock::decode(&bytes), Ok(sb), "superblock round trip");
    round_trip_checked();
    let mut fields = vec![
        Field::le(8, 2),
        Field::le(10, 2),
        Field::le(40, 8),
        Field::le(48, 4),
        Field::le(52, 4),
        Field::le(56, 1),
        Field::le(57, 1),
        Field::le(58, 1),
    ];
    fields.extend((72..136).step_by(8).map(|o| Field::le(o, 8)));
    Sample {
        bytes,
        fields,
        seal: Some(sb_seal),
        dict: &[],
    }
}

/// Fuzz target: one superblock copy. Anything that decodes re-encodes to a block that decodes
/// to the same superblock (the version becomes the current one).
pub fn superblock(data: &[u8]) -> bool {
    let Ok(sb) = Superblock::decode(data) else {
        return false;
    };
    let again = Superblock::decode(&sb.encode()).expect("a decoded superblock re-encodes");
    assert_eq!(
        again,
        Superblock {
            version: tiercache_format::superblock::SUPERBLOCK_VERSION,
            ..sb
        },
        "superblock re-encode"
    );
    round_trip_checked();
    true
}

// ----- checkpoint chunk -----

fn gen_line_records(rng: &mut Rng, ls: u32, n: usize) -> Vec<LineRecord> {
    (0..n)
        .map(|_| {
            if rng.one_in(4) {
                return LineRecord::default();
            }
            let (valid, dirty) = masks(rng, ls);
            LineRecord {
                core: Some(rng.below(255) as u8),
                core_line: rng.interesting(64),
                class: rng.below(CLASSES as u64) as u8,
                valid,
                dirty,
            }
        })
        .collect()
}

/// A valid checkpoint chunk payload.
pub fn gen_checkpoint_chunk(rng: &mut Rng) -> Sample {
    let ls = line_size(rng);
    let max = if rng.one_in(8) { 200 } else { 12 };
    let n = rng.below(max) as usize;
    let first = rng.below(u32::MAX as u64 - n as u64) as u32;
    let seq = rng.interesting(64);
    let lines = gen_line_records(rng, ls, n);
    // Format 2: proven flags on some mapped lines.
    let proven: Vec<bool> = lines
        .iter()
        .map(|l| l.core.is_some() && rng.one_in(2))
        .collect();
    let bytes = checkpoint::encode_chunk_proven(first, seq, &lines, &proven, ls);
    assert_eq!(
        checkpoint::decode_chunk_proven(&bytes, 2),
        Ok((first, seq, lines, proven)),
        "checkpoint chunk round trip"
    );
    round_trip_checked();
    let per = checkpoint_bytes_per_line(ls) as usize;
    let mut fields = vec![Field::le(0, 4), Field::le(4, 4), Field::le(8, 4)];
    for i in 0..n.min(16) {
        let o = CHUNK_HEADER + i * per;
        let flags = o + 10 + 2 * (ls as usize / 512).div_ceil(8);
        fields.extend([
            Field::le(o, 8),
            Field::le(o + 8, 1),
            Field::le(o + 9, 1),
            Field::le(flags, 1),
        ]);
    }
    Sample {
        bytes,
        fields,
        ..Sample::default()
    }
}

/// Checks a chunk payload: if it decodes, the encoder gives back the same bytes.
fn check_chunk(data: &[u8]) -> bool {
    let Ok((first, seq, lines, proven)) = checkpoint::decode_chunk_proven(data, 2) else {
        return false;
    };
    let ls = u32::from_le_bytes(data[8..12].try_into().expect("decoded: has a header"));
    let again = checkpoint::encode_chunk_proven(first, seq, &lines, &proven, ls);
    assert_eq!(again, data, "checkpoint chunk re-encode is not byte-exact");
    round_trip_checked();
    true
}

/// Fuzz target: a checkpoint chunk payload. The encoding is canonical: anything that decodes
/// re-encodes to the same bytes.
pub fn checkpoint_chunk(data: &[u8]) -> bool {
    check_chunk(data)
}

// ----- journal entry -----

fn gen_entry(rng: &mut Rng) -> Entry {
    let ls = line_size(rng);
    let max = if rng.one_in(8) { 300 } else { 10 };
    let n = rng.below(max) as usize;
    let ops = (0..n)
        .map(|_| {
            let line = rng.interesting(32) as u32;
            match rng.below(5) {
                4 => LineOp::Intent {
                    line: line.min(u32::MAX - 64),
                    count: 1 + rng.below(64) as u32,
                },
                0 => LineOp::Map {
                    line,
                    core: rng.below(UNMAPPED as u64) as u8,
                    core_line: rng.interesting(64),
                    class: rng.below(CLASSES as u64) as u8,
                },
                1 => LineOp::Unmap { line },
                2 => {
                    let (valid, dirty) = masks(rng, ls);
                    LineOp::State { line, valid, dirty }
                }
                _ => LineOp::Class {
                    line,
                    class: rng.below(CLASSES as u64) as u8,
                },
            }
        })
        .collect();
    Entry {
        seq: rng.interesting(64),
        line_size: ls,
        ops,
    }
}

/// Tag offsets of an encoded entry (for field edits).
fn entry_fields(e: &Entry) -> Vec<Field> {
    let n = (e.line_size / 512 / 8) as usize;
    let mut fields = vec![Field::le(0, 8), Field::le(8, 4), Field::le(12, 4)];
    let mut o = 16;
    for op in e.ops.iter().take(32) {
        fields.push(Field::le(o, 1));
        match op {
            LineOp::Map { .. } => {
                fields.extend([Field::le(o + 5, 1), Field::le(o + 14, 1)]);
                o += 15;
            }
            LineOp::Unmap { .. } => o += 5,
            LineOp::State { .. } => o += 5 + 2 * n,
            LineOp::Class { .. } => {
                fields.push(Field::le(o + 5, 1));
                o += 6;
            }
            LineOp::Intent { .. } => {
                fields.push(Field::le(o + 5, 4));
                o += 9;
            }
        }
    }
    fields
}

/// A valid journal entry payload.
pub fn gen_journal_entry(rng: &mut Rng) -> Sample {
    let e = gen_entry(rng);
    let bytes = e.encode();
    assert_eq!(
        Entry::decode(&bytes),
        Ok(e.clone()),
        "journal entry round trip"
    );
    round_trip_checked();
    Sample {
        bytes,
        fields: entry_fields(&e),
        ..Sample::default()
    }
}

fn check_entry(data: &[u8]) -> bool {
    let Ok(e) = Entry::decode(data) else {
        return false;
    };
    assert_eq!(
        e.encode(),
        data,
        "journal entry re-encode is not byte-exact"
    );
    round_trip_checked();
    true
}

/// Fuzz target: a journal entry payload (canonical: re-encodes byte for byte).
pub fn journal_entry(data: &[u8]) -> bool {
    check_entry(data)
}

// ----- core table -----

fn gen_cores(rng: &mut Rng) -> Vec<CoreEntry> {
    let n = if rng.one_in(16) {
        rng.range(200, 255)
    } else {
        rng.below(5)
    } as usize;
    let mut ids: Vec<u8> = (0..255).collect();
    let with_devices = rng.one_in(2);
    (0..n)
        .map(|_| {
            let id = ids.swap_remove(rng.below(ids.len() as u64) as usize);
            let identity = match rng.below(4) {
                0 => CoreIdentity::Block {
                    serial: string(rng),
                },
                1 => {
                    let mut fs_uuid = [0u8; 16];
                    fs_uuid.copy_from_slice(&rng.bytes(16));
                    CoreIdentity::File {
                        fs_uuid,
                        inode: rng.interesting(64),
                    }
                }
                2 => CoreIdentity::Rbd {
                    pool_id: rng.interesting(64),
                    image_id: string(rng),
                },
                _ => CoreIdentity::Nbd { uri: string(rng) },
            };
            CoreEntry {
                id,
                size_blocks: rng.interesting(64),
                identity,
                export_name: string(rng),
                cutoff: (
                    rng.range(1, 3) as u8,
                    rng.interesting(64),
                    rng.interesting(32) as u32,
                ),
                device: if with_devices {
                    string(rng)
                } else {
                    String::new()
                },
            }
        })
        .collect()
}

/// Offsets of the core table's count, ids, kinds, string lengths and cutoff codes.
fn cores_fields(cores: &[CoreEntry]) -> Vec<Field> {
    let mut f = vec![Field::le(0, 2)];
    let mut o = 2;
    for c in cores.iter().take(16) {
        f.extend([Field::le(o, 1), Field::le(o + 1, 8), Field::le(o + 9, 1)]);
        o += 10;
        match &c.identity {
            CoreIdentity::Block { serial: s } | CoreIdentity::Nbd { uri: s } => {
                f.push(Field::le(o, 2));
                o += 2 + s.len();
            }
            CoreIdentity::File { .. } => o += 24,
            CoreIdentity::Rbd { image_id, .. } => {
                f.push(Field::le(o + 8, 2));
                o += 10 + image_id.len();
            }
        }
        f.push(Field::le(o, 2));
        o += 2 + c.export_name.len();
        f.push(Field::le(o, 1));
        o += 13;
    }
    f
}

/// A valid core table payload.
pub fn gen_core_table(rng: &mut Rng) -> Sample {
    let cores = gen_cores(rng);
    let bytes = encode_cores(&cores);
    assert_eq!(
        decode_cores(&bytes),
        Ok(cores.clone()),
        "core table round trip"
    );
    round_trip_checked();
    Sample {
        bytes,
        fields: cores_fields(&cores),
        ..Sample::default()
    }
}

fn check_cores(data: &[u8]) -> bool {
    let Ok(cores) = decode_cores(data) else {
        return false;
    };
    let again = encode_cores(&cores);
    // Canonical except one case: a device section whose strings are all empty is omitted by
    // the encoder (tables written before the section existed), and decodes the same.
    let omitted = cores.iter().all(|c| c.device.is_empty()) && again.len() < data.len();
    if !omitted {
        assert_eq!(again, data, "core table re-encode is not byte-exact");
    }
    assert_eq!(decode_cores(&again), Ok(cores), "core table re-encode");
    round_trip_checked();
    true
}

/// Fuzz target: a core table payload.
pub fn core_table(data: &[u8]) -> bool {
    check_cores(data)
}

// ----- configuration record -----

fn gen_config(rng: &mut Rng) -> ConfigRecord {
    let csv = if rng.one_in(3) {
        crate::text::gen_csv_text(rng)
    } else if rng.one_in(8) {
        string(rng)
    } else {
        "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1.00\n".into()
    };
    let csv = if csv.len() > STRING_MAX {
        String::new()
    } else {
        csv
    };
    ConfigRecord {
        mode: rng.range(1, 6) as u8,
        eviction: rng.range(1, 2) as u8,
        promotion: (
            rng.range(1, 2) as u8,
            rng.interesting(32) as u32,
            rng.interesting(8) as u8,
        ),
        cleaning: rng.range(1, 3) as u8,
        alru: [0; 4].map(|_| rng.interesting(32) as u32),
        acp: [0; 2].map(|_| rng.interesting(32) as u32),
        rate: (
            rng.one_in(2),
            rng.interesting(8) as u8,
            rng.interesting(32) as u32,
        ),
        io_classes_csv: csv,
    }
}

/// A valid configuration record payload.
pub fn gen_config_record(rng: &mut Rng) -> Sample {
    let c = gen_config(rng);
    let bytes = encode_config(&c);
    assert_eq!(decode_config(&bytes), Ok(c), "configuration round trip");
    round_trip_checked();
    let fields = [
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 4),
        (7, 1),
        (8, 1),
        (33, 1),
        (34, 1),
        (39, 2),
    ]
    .map(|(o, w)| Field::le(o, w))
    .to_vec();
    Sample {
        bytes,
        fields,
        ..Sample::default()
    }
}

fn check_config(data: &[u8]) -> bool {
    let Ok(c) = decode_config(data) else {
        return false;
    };
    assert_eq!(
        encode_config(&c),
        data,
        "configuration re-encode is not byte-exact"
    );
    round_trip_checked();
    true
}

/// Fuzz target: a configuration record payload (canonical).
pub fn config_record(data: &[u8]) -> bool {
    check_config(data)
}

// ----- record frame -----

fn record_seal(b: &mut [u8]) {
    if b.len() < RECORD_HEADER {
        return;
    }
    let len = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")) as usize;
    let Some(payload) = b.get(RECORD_HEADER..RECORD_HEADER.saturating_add(len)) else {
        return;
    };
    let crc = tiercache_format::crc::crc32c_update(crc32c(&b[..12]), payload);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// A valid record: a frame around a valid payload of its kind, sometimes padded to its slot.
pub fn gen_record(rng: &mut Rng) -> Sample {
    let (kind, inner) = match rng.below(6) {
        0 => (RecordKind::Config, gen_config_record(rng)),
        1 => (RecordKind::CoreTable, gen_core_table(rng)),
        2 => (RecordKind::Journal, gen_journal_entry(rng)),
        3 => (RecordKind::Checkpoint, gen_checkpoint_chunk(rng)),
        4 => {
            let mut s = gen_log_header(rng);
            s.bytes = record::decode(&s.bytes)
                .expect("a log header")
                .0
                .payload
                .to_vec();
            (RecordKind::LogEntry, s)
        }
        _ => {
            let mut s = gen_log_super(rng);
            s.bytes = record::decode(&s.bytes)
                .expect("a log superblock")
                .0
                .payload
                .to_vec();
            (RecordKind::LogSuper, s)
        }
    };
    let payload = inner.bytes;
    let mut bytes = record::encode(kind, &payload);
    let (r, used) = record::decode(&bytes).expect("an encoded record decodes");
    assert_eq!(
        (r.kind, r.version, r.payload, used),
        (kind, 1, &payload[..], bytes.len()),
        "record round trip"
    );
    round_trip_checked();
    let mut fields = vec![Field::le(4, 2), Field::le(6, 2), Field::le(8, 4)];
    fields.extend(
        inner
            .fields
            .iter()
            .take(8)
            .map(|f| Field::le(f.offset + RECORD_HEADER, f.width)),
    );
    if rng.one_in(8) {
        // Padding, as records sit in 4 KiB slots.
        bytes.resize(bytes.len().div_ceil(4096) * 4096, 0);
    }
    Sample {
        bytes,
        fields,
        seal: Some(record_seal),
        dict: &[],
    }
}

/// Fuzz target: a record frame at the start of the input, then its payload by kind. Accepted
/// when the frame and the payload decode. A decoded frame re-encodes to the same bytes (at the
/// current version) and its payload is checked as by the payload's own target.
pub fn record(data: &[u8]) -> bool {
    let Ok((r, used)) = record::decode(data) else {
        return false;
    };
    assert!(used <= data.len() && used == RECORD_HEADER + r.payload.len());
    let version = if (1..=FORMAT_VERSION).contains(&r.version) {
        r.version
    } else {
        1
    };
    let again = record::encode_versioned(r.kind, version, r.payload);
    if version == r.version {
        assert_eq!(again, data[..used], "record re-encode is not byte-exact");
    }
    let (r2, used2) = record::decode(&again).expect("a re-encoded record decodes");
    assert_eq!((r2.kind, r2.payload, used2), (r.kind, r.payload, used));
    round_trip_checked();
    match r.kind {
        RecordKind::Config => check_config(r.payload),
        RecordKind::CoreTable => check_cores(r.payload),
        RecordKind::Journal => check_entry(r.payload),
        RecordKind::Checkpoint => check_chunk(r.payload),
        RecordKind::LogEntry => check_log_header(data),
        RecordKind::LogSuper => check_log_super(data),
    }
}

// ----- write log (mode wl): entry header and log superblock -----

const LOG_KINDS: [LogKind; 5] = [
    LogKind::Write,
    LogKind::Trim,
    LogKind::Zero,
    LogKind::Pad,
    LogKind::Void,
];

/// A valid log entry header block (a record padded to 512 bytes).
pub fn gen_log_header(rng: &mut Rng) -> Sample {
    let mut cache_id = [0u8; 16];
    cache_id.copy_from_slice(&rng.bytes(16));
    let lba = rng.interesting(64);
    let room = u32::try_from(u64::MAX - lba).unwrap_or(u32::MAX);
    let blocks = (rng.interesting(32) as u32).min(room);
    let h = LogHeader {
        kind: *rng.pick(&LOG_KINDS),
        cache_id,
        epoch: rng.interesting(32) as u32,
        seq: rng.interesting(64),
        gen_: rng.interesting(64),
        core: rng.interesting(16) as u16,
        lba,
        blocks,
        data_crc: rng.next_u64() as u32,
        durable_seq: rng.interesting(64),
    };
    let bytes = h.encode().to_vec();
    assert_eq!(LogHeader::decode(&bytes), Ok(h), "log header round trip");
    round_trip_checked();
    let o = RECORD_HEADER;
    Sample {
        bytes,
        fields: vec![
            Field::le(4, 2),
            Field::le(6, 2),
            Field::le(8, 4),
            Field::le(o, 1),
            Field::le(o + 37, 8),
            Field::le(o + 45, 2),
            Field::le(o + 47, 8),
            Field::le(o + 55, 4),
        ],
        seal: Some(record_seal),
        dict: &[],
    }
}

fn check_log_header(data: &[u8]) -> bool {
    let Ok(h) = LogHeader::decode(data) else {
        return false;
    };
    assert!(h.lba.checked_add(h.blocks as u64).is_some());
    let again = h.encode();
    assert_eq!(again.len(), LOG_BLOCK);
    assert_eq!(LogHeader::decode(&again), Ok(h), "log header re-encode");
    round_trip_checked();
    true
}

/// Fuzz target: a write-log entry header block. Anything that decodes re-encodes to a block
/// that decodes to the same header (not byte-exact: the decoder ignores bytes after the
/// fields, and older record versions).
pub fn log_header(data: &[u8]) -> bool {
    check_log_header(data)
}

/// A valid log superblock copy.
pub fn gen_log_super(rng: &mut Rng) -> Sample {
    let mut cache_id = [0u8; 16];
    cache_id.copy_from_slice(&rng.bytes(16));
    let s = LogSuper {
        cache_id,
        sb_gen: rng.interesting(64),
        epoch: rng.interesting(32) as u32,
        ring_blocks: rng.interesting(64).max(1),
        tail_pos: rng.interesting(64),
        tail_seq: rng.interesting(64),
        tail_gen: rng.interesting(64),
        durable_seq: rng.interesting(64),
    };
    let bytes = s.encode().to_vec();
    assert_eq!(LogSuper::decode(&bytes), Ok(s), "log superblock round trip");
    round_trip_checked();
    let o = RECORD_HEADER;
    Sample {
        bytes,
        fields: vec![
            Field::le(4, 2),
            Field::le(6, 2),
            Field::le(8, 4),
            Field::le(o + 28, 8),
        ],
        seal: Some(record_seal),
        dict: &[],
    }
}

fn check_log_super(data: &[u8]) -> bool {
    let Ok(s) = LogSuper::decode(data) else {
        return false;
    };
    assert!(s.ring_blocks > 0);
    let again = s.encode();
    assert_eq!(
        LogSuper::decode(&again),
        Ok(s.clone()),
        "log superblock re-encode"
    );
    // The copy in force of two: a valid copy always wins over damage, the newer over the older.
    let (p, i) = LogSuper::pick(&again, &data[..data.len() / 2]).expect("one copy is valid");
    assert_eq!((p.sb_gen, i), (s.sb_gen, 0));
    round_trip_checked();
    true
}

/// Fuzz target: a write-log superblock copy (value round trip, as for [`log_header`]).
pub fn log_super(data: &[u8]) -> bool {
    check_log_super(data)
}
