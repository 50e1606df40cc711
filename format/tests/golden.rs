//! Golden bytes: the on-disk encodings are pinned. A change here is a format change: bump
//! FORMAT_VERSION, keep decoding the old bytes, and add the new golden beside the old (see
//! docs/FORMAT.md, "Versions").

use tiercache_format::record::{self, RecordKind};
use tiercache_format::superblock::{CacheState, Layout, SUPERBLOCK_BYTES, Superblock};
use tiercache_format::{DecodeError, FORMAT_VERSION};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A 64 GiB cache device with 4 KiB lines and a 64 MiB journal.
fn sample() -> Superblock {
    let (layout, lines) = Layout::plan(64 << 30, 4096, 64 << 20).unwrap();
    Superblock {
        version: tiercache_format::superblock::SUPERBLOCK_VERSION,
        generation: 7,
        cache_id: *b"0123456789abcdef",
        device_bytes: 64 << 30,
        line_size: 4096,
        lines,
        state: CacheState::Clean,
        checkpoint: 1,
        has_checkpoint: true,
        journal_seq: 42,
        layout,
    }
}

const GOLDEN_SUPERBLOCK_V1: &str = "746965726361636801008800c7152ef207000000000000003031323334353637383961626364656600000000100000000010000000bffd0001010100000000002a000000000000000000100000000000000000040000000000001004000000000000e00f000000000000f013000000000000e00f000000000000d023000000000000f0db0f000000";
const GOLDEN_RECORD_V1: &str =
    "7463524303000100190000001f55f9726c696e6520353a2076616c6964206666206469727479203066";

#[test]
fn superblock_v1_bytes() {
    let sb = sample();
    let bytes = sb.encode();
    assert_eq!(bytes.len(), SUPERBLOCK_BYTES);
    println!("superblock v1 header: {}", hex(&bytes[..136]));
    assert!(bytes[136..].iter().all(|&b| b == 0));
    assert_eq!(
        hex(&bytes[..136]),
        GOLDEN_SUPERBLOCK_V1,
        "superblock encoding changed"
    );
    let mut block = unhex(GOLDEN_SUPERBLOCK_V1);
    block.resize(SUPERBLOCK_BYTES, 0);
    assert_eq!(Superblock::decode(&block).unwrap(), sb);
}

#[test]
fn record_v1_bytes() {
    let bytes = record::encode(RecordKind::Journal, b"line 5: valid ff dirty 0f");
    println!("record v1: {}", hex(&bytes));
    assert_eq!(hex(&bytes), GOLDEN_RECORD_V1, "record encoding changed");
    let golden = unhex(GOLDEN_RECORD_V1);
    let (r, used) = record::decode(&golden).unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(r.kind, RecordKind::Journal);
    assert_eq!(r.payload, b"line 5: valid ff dirty 0f");
}

#[test]
fn layout_is_sane_across_sizes() {
    for &dev in &[8u64 << 20, 100 << 20, 1 << 30, 64 << 30, 2 << 40] {
        for ls in [4096u32, 8192, 16384, 32768, 65536] {
            let Some((l, lines)) = Layout::plan(dev, ls, 64 << 20) else {
                assert!(dev < 200 << 20, "{dev} bytes should fit lines of {ls}");
                continue;
            };
            l.validate(dev).unwrap();
            assert!(l.data.offset % ls as u64 == 0 && l.data.offset % (1 << 20) == 0);
            assert_eq!(l.data.bytes, lines as u64 * ls as u64);
            // The checkpoints hold every line.
            let per = tiercache_format::superblock::checkpoint_bytes_per_line(ls);
            assert!(l.checkpoint[0].bytes >= lines as u64 * per);
            // Metadata is a small share of a big device.
            if dev >= 64 << 30 {
                assert!(
                    l.data.offset < dev / 50,
                    "{dev} {ls}: metadata {} bytes",
                    l.data.offset
                );
            }
        }
    }
    assert!(Layout::plan(1 << 20, 4096, 1 << 20).is_none());
}

#[test]
fn the_newer_valid_copy_wins_and_damage_is_detected() {
    let a = sample();
    let b = Superblock {
        generation: 8,
        state: CacheState::Running,
        ..a
    };
    let (ea, eb) = (a.encode(), b.encode());
    let (sb, copy) = Superblock::newest(Superblock::decode(&ea), Superblock::decode(&eb)).unwrap();
    assert_eq!((sb.generation, copy), (8, 1));
    // A torn write of B (first 512 bytes only) leaves A in charge.
    let mut torn = ea.clone();
    torn[..512].copy_from_slice(&eb[..512]);
    let (sb, copy) =
        Superblock::newest(Superblock::decode(&ea), Superblock::decode(&torn)).unwrap();
    assert!(
        copy == 0 || sb == b,
        "a torn copy must not be trusted unless whole"
    );
    // Every single-byte flip in the checksummed header is caught.
    for i in 0..136 {
        let mut x = ea.clone();
        x[i] ^= 0x5a;
        assert!(
            Superblock::decode(&x).is_err(),
            "flip at byte {i} not detected"
        );
    }
    // A newer format is refused by name.
    let mut newer = ea.clone();
    newer[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(matches!(
        Superblock::decode(&newer),
        Err(DecodeError::TooNew { .. })
    ));
    assert!(
        Superblock::decode(&newer)
            .unwrap_err()
            .to_string()
            .contains("upgrade")
    );
}

/// Decoders never panic: seeded, structure-aware mutations of valid encodings (flips,
/// truncations, splices, length-field lies), plus pure noise.
#[test]
fn decoders_never_panic() {
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let sb = sample().encode();
    let rec = record::encode(RecordKind::Checkpoint, &[7u8; 300]);
    let mut accepted = 0;
    for i in 0..20_000 {
        let base = if i % 2 == 0 { &sb } else { &rec };
        let mut v = base.clone();
        match next() % 5 {
            0 => {
                for _ in 0..1 + next() % 4 {
                    let p = (next() as usize) % v.len();
                    v[p] ^= 1 << (next() % 8);
                }
            }
            1 => v.truncate((next() as usize) % (v.len() + 1)),
            2 => {
                // Lie about a length field.
                let at = if i % 2 == 0 { 10 } else { 8 };
                let n = (next() as u32).to_le_bytes();
                v[at..at + 2].copy_from_slice(&n[..2]);
            }
            3 => v = (0..(next() % 5000)).map(|_| next() as u8).collect(),
            _ => {
                let p = (next() as usize) % v.len();
                v.splice(
                    p..p,
                    std::iter::repeat_n(next() as u8, (next() % 64) as usize),
                );
            }
        }
        let ok_sb = Superblock::decode(&v).is_ok();
        let ok_rec = record::decode(&v).is_ok();
        accepted += ok_sb as u32 + ok_rec as u32;
    }
    // Some mutations leave a valid structure (e.g. bytes after a record); most must not.
    assert!(
        accepted < 20_000 / 2,
        "{accepted} of 20000 mutated inputs accepted"
    );
}

mod checkpoint {
    use super::hex;
    use tiercache_format::checkpoint::{LineRecord, decode_chunk, encode_chunk};
    use tiercache_format::record::{self, RecordKind};

    fn lines() -> Vec<LineRecord> {
        vec![
            LineRecord {
                core: Some(0),
                core_line: 5,
                class: 1,
                valid: 0xff,
                dirty: 0x0f,
            },
            LineRecord::default(),
            LineRecord {
                core: Some(3),
                core_line: 1 << 33,
                class: 33,
                valid: 0x81,
                dirty: 0,
            },
        ]
    }

    const GOLDEN_CHUNK_V1: &str = "0a0000000300000000100000630000000000000005000000000000000001ff0f000000000000000000000000ff0000000000000000000000020000000321810000000000";

    const GOLDEN_CHUNK_V2: &str = "0a0000000300000000100000630000000000000005000000000000000001ff0f010000000000000000000000ff0000000000000000000000020000000321810001000000";

    #[test]
    fn chunk_v2_proven_flags_bytes_and_round_trip() {
        use tiercache_format::checkpoint::{
            chunk_version, decode_chunk_proven, encode_chunk_proven,
        };
        let proven = vec![true, false, true];
        let p = encode_chunk_proven(10, 99, &lines(), &proven, 4096);
        println!("checkpoint chunk v2: {}", hex(&p));
        assert_eq!(hex(&p), GOLDEN_CHUNK_V2, "checkpoint v2 encoding changed");
        assert_eq!(chunk_version(&proven), 2);
        assert_eq!(chunk_version(&[false, false]), 1);
        assert_eq!(
            decode_chunk_proven(&p, 2).unwrap(),
            (10, 99, lines(), proven.clone())
        );
        // A flag in a chunk framed as version 1 is damage, as is any other flag bit.
        assert!(decode_chunk_proven(&p, 1).is_err());
        assert!(decode_chunk(&p).is_err());
        let mut x = p.clone();
        x[20 + 12] = 2;
        assert!(decode_chunk_proven(&x, 2).is_err());
        // Flags on an unmapped line are refused.
        let mut x = p.clone();
        x[20 + 16 + 12] = 1;
        assert!(decode_chunk_proven(&x, 2).is_err());
        // Version-1 chunks decode through the version-2 path with every flag false.
        let v1 = encode_chunk(10, 99, &lines(), 4096);
        assert_eq!(
            decode_chunk_proven(&v1, 2).unwrap(),
            (10, 99, lines(), vec![false; 3])
        );
        // Every line size has room for the flags byte.
        for ls in [4096u32, 8192, 16384, 32768, 65536] {
            let full = if ls == 65536 {
                u128::MAX
            } else {
                (1u128 << (ls / 512)) - 1
            };
            let l = vec![LineRecord {
                core: Some(7),
                core_line: 9,
                class: 2,
                valid: full,
                dirty: full >> 1,
            }];
            let p = encode_chunk_proven(0, 1, &l, &[true], ls);
            assert_eq!(decode_chunk_proven(&p, 2).unwrap().3, vec![true]);
        }
    }

    /// The checkpoint record built in place (`encode_chunk_record`, what the cache writes) is
    /// byte for byte the chunk payload framed by `record::encode_versioned` and zero-padded.
    #[test]
    fn chunk_record_in_place_equals_the_framed_payload() {
        use tiercache_format::checkpoint::{encode_chunk_proven, encode_chunk_record};
        use tiercache_format::record::{RecordKind, encode_versioned};
        for ls in [4096u32, 8192, 16384, 32768, 65536] {
            let full = if ls == 65536 {
                u128::MAX
            } else {
                (1u128 << (ls / 512)) - 1
            };
            let mut l = lines();
            l.push(LineRecord {
                core: Some(1),
                core_line: u64::MAX,
                class: 0,
                valid: full,
                dirty: full & 0x5555_5555_5555_5555_5555_5555_5555_5555,
            });
            for (proven, version) in [(vec![false; 4], 1u16), (vec![true, false, false, true], 2)] {
                for align in [1usize, 512, 4096] {
                    let payload = encode_chunk_proven(10, 99, &l, &proven, ls);
                    let mut want = encode_versioned(RecordKind::Checkpoint, version, &payload);
                    want.resize(want.len().next_multiple_of(align), 0);
                    let got =
                        encode_chunk_record(10, 99, l.len() as u32, ls, version, align, |i| {
                            (l[i as usize], proven[i as usize])
                        });
                    assert_eq!(
                        got, want,
                        "line size {ls}, version {version}, align {align}"
                    );
                }
            }
        }
    }

    #[test]
    fn chunk_v1_bytes_and_round_trip() {
        let p = encode_chunk(10, 99, &lines(), 4096);
        println!("checkpoint chunk v1: {}", hex(&p));
        assert_eq!(hex(&p), GOLDEN_CHUNK_V1, "checkpoint encoding changed");
        assert_eq!(decode_chunk(&p).unwrap(), (10, 99, lines()));
        // Every line size round-trips, full masks included.
        for ls in [4096u32, 8192, 16384, 32768, 65536] {
            let full = if ls == 65536 {
                u128::MAX
            } else {
                (1u128 << (ls / 512)) - 1
            };
            let l = vec![LineRecord {
                core: Some(7),
                core_line: 9,
                class: 2,
                valid: full,
                dirty: full >> 1,
            }];
            let p = encode_chunk(0, 1, &l, ls);
            assert_eq!(decode_chunk(&p).unwrap().2, l);
            // Framed, damage is caught.
            let framed = record::encode(RecordKind::Checkpoint, &p);
            for i in 0..framed.len() {
                let mut x = framed.clone();
                x[i] ^= 0x01;
                assert!(record::decode(&x).is_err(), "flip at {i} not detected");
            }
        }
    }

    #[test]
    fn impossible_states_are_refused() {
        let p = encode_chunk(0, 1, &lines(), 4096);
        let per = 16;
        // Line 0's dirty byte: make a block dirty that is not valid... valid is ff, so use line 2.
        let mut x = p.clone();
        x[20 + 2 * per + 11] = 0x02; // line 2 dirty bit 1, valid 0x81
        assert!(decode_chunk(&x).unwrap_err().to_string().contains("line 2"));
        let mut x = p.clone();
        x[20 + per + 10] = 0x01; // unmapped line 1 with a valid block
        assert!(
            decode_chunk(&x)
                .unwrap_err()
                .to_string()
                .contains("unmapped")
        );
        let mut x = p.clone();
        x[20 + 9] = 34; // class
        assert!(decode_chunk(&x).is_err());
        let mut x = p.clone();
        x.pop();
        assert!(decode_chunk(&x).is_err());
        let mut x = p;
        x[8..12].copy_from_slice(&3000u32.to_le_bytes());
        assert!(decode_chunk(&x).is_err());
    }

    #[test]
    fn chunk_decoder_never_panics() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let base = encode_chunk(0, 1, &lines(), 4096);
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut v = base.clone();
            match s % 3 {
                0 => {
                    let p = (s >> 8) as usize % v.len();
                    v[p] = (s >> 24) as u8;
                }
                1 => v.truncate((s >> 8) as usize % (v.len() + 1)),
                _ => {
                    let p = (s >> 8) as usize % 12;
                    v[p] = (s >> 24) as u8;
                }
            }
            let _ = decode_chunk(&v);
        }
    }
}

mod journal {
    use super::hex;
    use tiercache_format::journal::{Entry, LineOp};

    fn entry() -> Entry {
        Entry {
            seq: 99,
            line_size: 8192,
            ops: vec![
                LineOp::Map {
                    line: 4,
                    core: 1,
                    core_line: 77,
                    class: 2,
                },
                LineOp::State {
                    line: 4,
                    valid: 0xffff,
                    dirty: 0x00f0,
                },
                LineOp::Class { line: 4, class: 0 },
                LineOp::Unmap { line: 9 },
            ],
        }
    }

    const GOLDEN_JOURNAL_V1: &str = "630000000000000000200000040000000104000000014d00000000000000020304000000fffff0000404000000000209000000";

    const GOLDEN_JOURNAL_V2: &str =
        "0700000000000000001000000200000005400000001000000003400000000100";

    #[test]
    fn entry_v2_intent_bytes_and_round_trip() {
        let e = Entry {
            seq: 7,
            line_size: 4096,
            ops: vec![
                LineOp::Intent {
                    line: 64,
                    count: 16,
                },
                LineOp::State {
                    line: 64,
                    valid: 0x01,
                    dirty: 0,
                },
            ],
        };
        let p = e.encode();
        println!("journal entry v2: {}", hex(&p));
        assert_eq!(hex(&p), GOLDEN_JOURNAL_V2, "journal v2 encoding changed");
        assert_eq!(Entry::decode(&p).unwrap(), e);
        assert_eq!(e.version(), 2);
        assert_eq!(entry().version(), 1);
        // An empty or overflowing intent is refused.
        let mut x = p.clone();
        x[21..25].copy_from_slice(&0u32.to_le_bytes());
        assert!(Entry::decode(&x).is_err());
        let mut x = p.clone();
        x[17..21].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Entry::decode(&x).is_err());
    }

    #[test]
    fn entry_v1_bytes_and_round_trip() {
        let p = entry().encode();
        println!("journal entry v1: {}", hex(&p));
        assert_eq!(hex(&p), GOLDEN_JOURNAL_V1, "journal encoding changed");
        assert_eq!(Entry::decode(&p).unwrap(), entry());
        let full = Entry {
            seq: 1,
            line_size: 65536,
            ops: vec![LineOp::State {
                line: 0,
                valid: u128::MAX,
                dirty: u128::MAX,
            }],
        };
        assert_eq!(Entry::decode(&full.encode()).unwrap(), full);
    }

    #[test]
    fn lies_and_impossible_states_are_refused() {
        let p = entry().encode();
        let mut x = p.clone();
        x[12..16].copy_from_slice(&1_000_000u32.to_le_bytes());
        assert!(Entry::decode(&x).is_err(), "op count lie");
        let mut x = p.clone();
        x.push(0);
        assert!(
            Entry::decode(&x)
                .unwrap_err()
                .to_string()
                .contains("after the last op")
        );
        let mut x = p.clone();
        x[16] = 9;
        assert!(
            Entry::decode(&x)
                .unwrap_err()
                .to_string()
                .contains("unknown tag")
        );
        // The state op's dirty mask (last 2 bytes of its 1+4+2+2) made not a subset of valid.
        let state_at = 16 + 15;
        let mut x = p;
        x[state_at + 1 + 4] = 0x00;
        x[state_at + 1 + 4 + 1] = 0x00;
        assert!(
            Entry::decode(&x)
                .unwrap_err()
                .to_string()
                .contains("impossible")
        );
    }

    #[test]
    fn journal_decoder_never_panics() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let base = entry().encode();
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut v = base.clone();
            match s % 3 {
                0 => {
                    let p = (s >> 8) as usize % v.len();
                    v[p] = (s >> 24) as u8;
                }
                1 => v.truncate((s >> 8) as usize % (v.len() + 1)),
                _ => v.extend((0..(s >> 40) % 40).map(|i| (s >> (i % 56)) as u8)),
            }
            let _ = Entry::decode(&v);
        }
    }
}

mod tables {
    use super::hex;
    use tiercache_format::tables::*;

    fn cores() -> Vec<CoreEntry> {
        vec![
            CoreEntry {
                id: 0,
                size_blocks: 1 << 31,
                identity: CoreIdentity::Block {
                    serial: "WWN-5000c500a1b2c3d4".into(),
                },
                export_name: "osd0".into(),
                cutoff: (1, 16384, 8),
                device: String::new(),
            },
            CoreEntry {
                id: 3,
                size_blocks: 2048,
                identity: CoreIdentity::File {
                    fs_uuid: [7; 16],
                    inode: 1234,
                },
                export_name: "img".into(),
                cutoff: (2, 1 << 20, 8),
                device: String::new(),
            },
            CoreEntry {
                id: 4,
                size_blocks: 4096,
                identity: CoreIdentity::Rbd {
                    pool_id: 2,
                    image_id: "10226b8b4567".into(),
                },
                export_name: "vm1".into(),
                cutoff: (3, 0, 1),
                device: String::new(),
            },
        ]
    }

    fn config() -> ConfigRecord {
        ConfigRecord {
            mode: 2,
            eviction: 2,
            promotion: (1, 3, 80),
            cleaning: 1,
            alru: [20, 120, 100, 1000],
            acp: [10, 128],
            rate: (true, 50, 200),
            io_classes_csv:
                "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n"
                    .into(),
        }
    }

    const GOLDEN_CORES_V1: &str = "030000000000800000000001140057574e2d3530303063353030613162326333643404006f736430010040000000000000080000000300080000000000000207070707070707070707070707070707d2040000000000000300696d67020000100000000000080000000400100000000000000302000000000000000c003130323236623862343536370300766d3103000000000000000001000000";
    const GOLDEN_CONFIG_V1: &str = "020201030000005001140000007800000064000000e80300000a000000800000000132c80000004b00494f20636c6173732069642c494f20636c617373206e616d652c4576696374696f6e207072696f726974792c416c6c6f636174696f6e0a302c756e636c61737369666965642c32322c310a";

    #[test]
    fn core_table_and_config_v1_bytes_and_round_trip() {
        let c = encode_cores(&cores());
        let g = encode_config(&config());
        println!("core table v1: {}", hex(&c));
        println!("config v1: {}", hex(&g));
        assert_eq!(hex(&c), GOLDEN_CORES_V1, "core table encoding changed");
        assert_eq!(hex(&g), GOLDEN_CONFIG_V1, "config encoding changed");
        assert_eq!(decode_cores(&c).unwrap(), cores());
        assert_eq!(decode_config(&g).unwrap(), config());
        let nbd = vec![CoreEntry {
            id: 9,
            size_blocks: 8,
            identity: CoreIdentity::Nbd {
                uri: "nbd+unix:///x?socket=/tmp/s".into(),
            },
            export_name: "n".into(),
            cutoff: (3, 0, 1),
            device: String::new(),
        }];
        assert_eq!(decode_cores(&encode_cores(&nbd)).unwrap(), nbd);
        // With device strings, a section follows the last core; without, the bytes above.
        let mut with = cores();
        with[1].device = "/var/lib/img".into();
        with[2].device = "rbd:pool/vm1".into();
        let b = encode_cores(&with);
        assert!(hex(&b).starts_with(GOLDEN_CORES_V1));
        assert_eq!(
            hex(&b[GOLDEN_CORES_V1.len() / 2..]),
            "5000000c002f7661722f6c69622f696d670c007262643a706f6f6c2f766d31"
        );
        assert_eq!(decode_cores(&b).unwrap(), with);
        let mut bad = b.clone();
        bad[GOLDEN_CORES_V1.len() / 2] = 0x51;
        assert!(decode_cores(&bad).is_err(), "unknown section refused");
        for cut in GOLDEN_CORES_V1.len() / 2 + 1..b.len() {
            assert!(
                decode_cores(&b[..cut]).is_err(),
                "truncated device section refused"
            );
        }
    }

    #[test]
    fn repeated_ids_bad_codes_and_garbage_are_refused() {
        let mut two = cores();
        two[1].id = 0;
        // The encoder does not check id uniqueness (a cache never has two cores with one id);
        // the decoder must.
        let e = decode_cores(&encode_cores(&two)).unwrap_err();
        assert!(e.to_string().contains("repeated"), "{e}");
        let mut g = encode_config(&config());
        g[0] = 9;
        assert!(decode_config(&g).is_err());
        let mut s = 0x1234_5678u64;
        let base = encode_cores(&cores());
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut v = base.clone();
            let p = (s >> 8) as usize % v.len();
            v[p] = (s >> 20) as u8;
            if s.is_multiple_of(4) {
                v.truncate((s >> 30) as usize % v.len());
            }
            let _ = decode_cores(&v);
            let _ = decode_config(&v);
        }
    }
}

/// A `wl` cache's superblock names its write-log region (checksum over 152 bytes); every other
/// superblock keeps the version-1 encoding above byte for byte.
#[test]
fn superblock_with_write_log_round_trips() {
    let (layout, lines) = Layout::plan_wl(64 << 30, 4096, 64 << 20, 1 << 30).unwrap();
    assert_eq!(layout.log.offset, layout.journal.end());
    assert_eq!(layout.log.bytes, 1 << 30);
    assert_eq!(layout.checkpoint[0].offset, layout.log.end());
    layout.validate(64 << 30).unwrap();
    let sb = Superblock {
        layout,
        lines,
        ..sample()
    };
    let block = sb.encode();
    assert_eq!(u16::from_le_bytes([block[10], block[11]]), 152);
    assert_eq!(&block[136..144], &layout.log.offset.to_le_bytes());
    assert_eq!(Superblock::decode(&block).unwrap(), sb);
    // The log region is covered by the checksum.
    let mut x = block.clone();
    x[140] ^= 1;
    assert!(Superblock::decode(&x).is_err());
    // A log overlapping the data region is refused.
    let mut bad = sb;
    bad.layout.log.offset = bad.layout.data.offset;
    assert!(Superblock::decode(&bad.encode()).is_err());
}
