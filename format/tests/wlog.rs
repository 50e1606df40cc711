//! The `wl` log records: golden bytes, round trips, refusal of damage, never a panic.

use tiercache_format::wlog::{LOG_BLOCK, LogHeader, LogKind, LogSuper};

fn header() -> LogHeader {
    LogHeader {
        kind: LogKind::Write,
        cache_id: [0xab; 16],
        epoch: 3,
        seq: 0x0102_0304_0506_0708,
        gen_: 9,
        core: 2,
        lba: 4096,
        blocks: 8,
        data_crc: 0xdead_beef,
        durable_seq: 0x0102_0304_0506_0700,
    }
}

fn log_super() -> LogSuper {
    LogSuper {
        cache_id: [7; 16],
        sb_gen: 5,
        epoch: 2,
        ring_blocks: 1000,
        tail_pos: 12345,
        tail_seq: 77,
        tail_gen: 4,
        durable_seq: 80,
    }
}

/// A block holding `payload` as a record of `kind`, padded with zeros.
fn block(kind: tiercache_format::record::RecordKind, payload: &[u8]) -> [u8; LOG_BLOCK] {
    let rec = tiercache_format::record::encode(kind, payload);
    let mut b = [0u8; LOG_BLOCK];
    b[..rec.len()].copy_from_slice(&rec);
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn header_golden_bytes() {
    let b = header().encode();
    assert_eq!(b.len(), LOG_BLOCK);
    // Frame: magic "tcRC", kind 5 (log entry), version 1, payload length 63, CRC32C.
    assert_eq!(hex(&b[..12]), "74635243050001003f000000");
    // Payload: kind, cache id, epoch, seq, generation, core, lba, blocks, data CRC, durable
    // seq.
    assert_eq!(
        hex(&b[16..16 + 63]),
        concat!(
            "01",
            "abababababababababababababababab",
            "03000000",
            "0807060504030201",
            "0900000000000000",
            "0200",
            "0010000000000000",
            "08000000",
            "efbeadde",
            "0007060504030201"
        )
    );
    assert!(b[16 + 63..].iter().all(|&x| x == 0), "padded with zeros");
    assert_eq!(LogHeader::decode(&b), Ok(header()));
}

/// Headers and superblocks written before `durable_seq` existed (payloads of 55 and 60 bytes)
/// still decode, with no durability claim.
#[test]
fn the_form_without_durable_seq_still_decodes() {
    use tiercache_format::record::RecordKind;
    let h = header();
    let b = block(RecordKind::LogEntry, &h.encode()[16..16 + 55]);
    assert_eq!(
        LogHeader::decode(&b),
        Ok(LogHeader {
            durable_seq: 0,
            ..h
        })
    );
    let s = log_super();
    let b = block(RecordKind::LogSuper, &s.encode()[16..16 + 60]);
    assert_eq!(
        LogSuper::decode(&b),
        Ok(LogSuper {
            durable_seq: 0,
            ..s
        })
    );
}

#[test]
fn super_golden_and_pick() {
    let s = log_super();
    let b = s.encode();
    assert_eq!(hex(&b[..12]), "746352430600010044000000");
    assert_eq!(hex(&b[16 + 60..16 + 68]), "5000000000000000");
    assert_eq!(LogSuper::decode(&b), Ok(s.clone()));
    let newer = LogSuper {
        sb_gen: 6,
        ..s.clone()
    }
    .encode();
    assert_eq!(LogSuper::pick(&b, &newer).unwrap().1, 1);
    let mut torn = newer;
    torn[40] ^= 1;
    assert_eq!(
        LogSuper::pick(&b, &torn).unwrap(),
        (s, 0),
        "a damaged copy loses"
    );
    assert!(LogSuper::pick(&torn, &torn).is_err());
}

#[test]
fn every_byte_flip_of_the_frame_and_payload_is_refused() {
    let b = header().encode();
    for i in 0..16 + 63 {
        for bit in 0..8 {
            let mut d = b;
            d[i] ^= 1 << bit;
            assert!(
                LogHeader::decode(&d).is_err(),
                "flip at byte {i} bit {bit} accepted"
            );
        }
    }
    // A superblock is not a header, and the other way round.
    let s = LogSuper {
        cache_id: [1; 16],
        sb_gen: 1,
        epoch: 1,
        ring_blocks: 8,
        tail_pos: 0,
        tail_seq: 1,
        tail_gen: 1,
        durable_seq: 1,
    }
    .encode();
    assert!(LogHeader::decode(&s).is_err());
    assert!(LogSuper::decode(&b).is_err());
}

#[test]
fn never_panics_on_mutated_or_random_input() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let base = header().encode();
    let mut decoded = 0;
    for _ in 0..20_000 {
        let mut d = base.to_vec();
        for _ in 0..1 + next() % 4 {
            let i = (next() % d.len() as u64) as usize;
            d[i] = next() as u8;
        }
        let cut = (next() % (d.len() as u64 + 1)) as usize;
        d.truncate(if next() % 4 == 0 { cut } else { d.len() });
        decoded += LogHeader::decode(&d).is_ok() as u32;
        let _ = LogSuper::decode(&d);
    }
    // Nearly every mutation is caught by the checksum; those in the zero padding are not.
    assert!(decoded < 20_000);
}
