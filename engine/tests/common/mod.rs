//! Helpers shared by the engine's tests: a seeded RNG, self-describing block contents, the
//! per-block window of legal values after a power cut, and persistent configurations.
#![allow(dead_code)]

use tiercache_core::Config;
use tiercache_core::cache::CoreRecord;
use tiercache_core::config::Persist;
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{Lba, LineSize};
use tiercache_format::superblock::Layout;
use tiercache_format::tables::CoreIdentity;

pub const BS: usize = 512;

/// The seeded generator (xorshift64; a seed other than 0).
pub use tiercache_testkit::rng::XorShift as Rng;

/// A persistent configuration for a cache device of `device_bytes` (1 MiB journal).
pub fn persistent(device_bytes: u64, ls: LineSize, mode: CacheMode, id: u8) -> Config {
    let (layout, lines) = Layout::plan(device_bytes, ls.bytes() as u32, 1 << 20).expect("plan");
    persistent_in(layout, lines, device_bytes, ls, mode, id)
}

/// The persistent configuration of `lines` lines in `layout` on a cache device of
/// `device_bytes` (8 pool slots of 256 blocks).
fn persistent_in(
    layout: Layout,
    lines: u32,
    device_bytes: u64,
    ls: LineSize,
    mode: CacheMode,
    id: u8,
) -> Config {
    let mut cfg = Config::new(lines, ls);
    cfg.mode = mode;
    cfg.data_offset = Lba(layout.data.offset / 512);
    cfg.pool_slots = 8;
    cfg.pool_slot_blocks = 256;
    cfg.persist = Some(Persist::new_cache(
        [id; 16],
        device_bytes,
        ls,
        lines,
        layout,
    ));
    cfg
}

pub fn record(i: u16) -> CoreRecord {
    CoreRecord {
        identity: CoreIdentity::File {
            fs_uuid: [1; 16],
            inode: i as u64,
        },
        export_name: format!("core{i}"),
        device: String::new(),
    }
}

/// Block content: (block, version) header, then a pattern; version 0 is all zeros.
pub fn fill(buf: &mut [u8], block: u64, version: u64) {
    buf.fill(0);
    if version == 0 {
        return;
    }
    buf[..8].copy_from_slice(&block.to_le_bytes());
    buf[8..16].copy_from_slice(&version.to_le_bytes());
    for (i, b) in buf[16..].iter_mut().enumerate() {
        *b = (version as usize * 31 + i) as u8;
    }
}

/// The version a block holds, `None` if it is not a valid block of this address.
pub fn decode(buf: &[u8], block: u64) -> Option<u64> {
    if buf.iter().all(|&b| b == 0) {
        return Some(0);
    }
    let mut expect = vec![0u8; BS];
    let v = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    fill(&mut expect, block, v);
    (expect == buf).then_some(v)
}

/// Per block of one thread's region: every version written since (and including) the newest
/// one a completed flush covered.
pub struct Window {
    pub since_flush: Vec<Vec<u64>>,
}

impl Window {
    pub fn new(n: usize) -> Window {
        Window {
            since_flush: vec![vec![0]; n],
        }
    }
    pub fn wrote(&mut self, b: usize, v: u64) {
        self.since_flush[b].push(v);
    }
    pub fn flushed(&mut self) {
        for h in &mut self.since_flush {
            let last = *h.last().expect("never empty");
            h.clear();
            h.push(last);
        }
    }
}

/// A `wl` configuration for a cache device of `device_bytes`: a persistent read cache (1 MiB
/// journal) and a write log of `log_bytes`.
pub fn wl_config(
    device_bytes: u64,
    log_bytes: u64,
    ls: LineSize,
    id: u8,
) -> tiercache_core::wl::WlConfig {
    let (layout, lines) =
        Layout::plan_wl(device_bytes, ls.bytes() as u32, 1 << 20, log_bytes).expect("plan");
    let cfg = persistent_in(layout, lines, device_bytes, ls, CacheMode::Wa, id);
    let mut wl = tiercache_core::wl::WlConfig::on_device(cfg).expect("wl config");
    wl.staging_slots = 8;
    wl
}

/// Runs `threads` writer threads on core 0 of `e`, each owning `region` blocks from
/// `t * region`: `ops` random writes (some FUA), trims, flushes and verifying reads (a read must
/// return the newest acknowledged data). Returns each thread's window of legal values.
/// `label` names the run in a failure.
pub fn run_writers(
    e: &tiercache_engine::Engine,
    threads: u64,
    region: u64,
    ops: u64,
    rng: &mut Rng,
    label: &str,
) -> Vec<Window> {
    use tiercache_core::units::CoreId;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let seed = rng.next();
                s.spawn(move || {
                    let mut rng = Rng(seed | 1);
                    let base = t * region;
                    let mut w = Window::new(region as usize);
                    let mut buf = vec![0u8; 16 * BS];
                    for n in 1..ops {
                        let b = rng.below(region - 16) as usize;
                        let len = 1 + rng.below(16) as usize;
                        match rng.below(20) {
                            0 => {
                                e.flush(CoreId(0)).expect("flush");
                                w.flushed();
                            }
                            1 => {
                                e.trim(CoreId(0), base + b as u64, len as u32)
                                    .expect("trim");
                                (b..b + len).for_each(|i| w.wrote(i, 0));
                            }
                            2..=9 => {
                                let v = (t << 40) | n;
                                for i in 0..len {
                                    fill(&mut buf[i * BS..(i + 1) * BS], base + (b + i) as u64, v);
                                }
                                let fua = rng.below(10) == 0;
                                e.write(CoreId(0), base + b as u64, &buf[..len * BS], fua)
                                    .expect("write");
                                (b..b + len).for_each(|i| w.wrote(i, v));
                                if fua {
                                    // FUA makes this write durable, not earlier ones.
                                    for i in b..b + len {
                                        w.since_flush[i] = vec![v];
                                    }
                                }
                            }
                            _ => {
                                e.read(CoreId(0), base + b as u64, &mut buf[..len * BS])
                                    .expect("read");
                                for i in 0..len {
                                    let got =
                                        decode(&buf[i * BS..(i + 1) * BS], base + (b + i) as u64);
                                    assert_eq!(
                                        got,
                                        w.since_flush[b + i].last().copied(),
                                        "{label}: read while running, thread {t} block {}",
                                        b + i
                                    );
                                }
                            }
                        }
                    }
                    w
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    })
}

/// A power cut on both devices with one seeded pattern (keep, drop or tear what no flush
/// covered); returns the pattern and the blocks reverted.
pub fn power_cut_both(
    rng: &mut Rng,
    devs: [&tiercache_io::FaultBackend<tiercache_io::RamBackend>; 2],
) -> (tiercache_io::PowerCutPattern, u64) {
    use tiercache_io::PowerCutPattern;
    let pattern = match rng.below(3) {
        0 => PowerCutPattern::KeepAll,
        1 => PowerCutPattern::DropAll,
        _ => PowerCutPattern::Torn(rng.next()),
    };
    let mut reverted = 0;
    for d in devs {
        reverted += d.power_cut(pattern).expect("power cut").reverted;
    }
    for d in devs {
        d.revive();
    }
    (pattern, reverted)
}

/// Reads every thread's region back and checks each block holds a legal value of its window
/// (the newest flushed write or a later one); returns the values read, in block order.
pub fn check_windows(
    e: &tiercache_engine::Engine,
    windows: &[Window],
    region: u64,
    label: &str,
) -> Vec<u64> {
    use tiercache_core::units::CoreId;
    let mut seen = Vec::new();
    let mut buf = Some(tiercache_io::AlignedBuf::new(region as usize * BS));
    for (t, w) in windows.iter().enumerate() {
        let base = t as u64 * region;
        let (r, b) = e.read_owned(CoreId(0), base, buf.take().expect("buffer"));
        r.expect("read after recovery");
        for i in 0..region as usize {
            let got = decode(&b[i * BS..(i + 1) * BS], base + i as u64);
            let legal = &w.since_flush[i];
            assert!(
                got.is_some_and(|v| legal.contains(&v)),
                "POWER CUT {label}: thread {t} block {i} holds {got:?}, legal {legal:?}"
            );
            seen.push(got.expect("legal"));
        }
        buf = Some(b);
    }
    seen
}
