//! Every newer tiercache loads every older format — for the write log (`wl`) layout too: the
//! committed `core/tests/images/v<version>-wl-*` sets are write-log cache devices (superblocks
//! naming a log region, the read cache's journal and checkpoints, log entries not yet written
//! back) with their core images. This test loads each with today's engine, reads every core
//! block through it, lets the log drain to the cores and checks the cores, then stops, reloads
//! and reads everything again. (The Open CAS-style sets are loaded by
//! `core/tests/versions.rs`; the policy is in `core/tests/images/README.md`.)
//!
//! `TIERCACHE_WRITE_IMAGES=1 cargo test -p tiercache-engine --test wl_images` writes the sets of
//! the current format version ([`tiercache_format::FORMAT_VERSION`]).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_core::Config;
use tiercache_core::units::{CoreId, Lba, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::crc::crc32c;
use tiercache_io::{Backend, RamBackend};

fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/tests/images")
}

/// What the engine is given besides the device (pool sizes).
fn base() -> Config {
    let mut c = Config::new(16, LineSize::K4);
    c.pool_slots = 4;
    c.pool_slot_blocks = 16;
    c
}

/// What loading a set must give.
#[derive(Debug, Default, PartialEq)]
struct Expected {
    format_version: u16,
    clean: bool,
    /// Log entries the scan finds (not yet written back).
    log_entries: usize,
    cores: BTreeMap<u16, u64>,
    /// (core, block) -> (version it holds, CRC32C of its 512 bytes).
    blocks: BTreeMap<(u16, u64), (u64, u32)>,
}

impl Expected {
    fn parse(text: &str, file: &Path) -> Expected {
        let mut e = Expected::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            let bad = || -> ! { panic!("{}:{}: cannot parse {line:?}", file.display(), n + 1) };
            let num = |s: &str| s.parse::<u64>().unwrap_or_else(|_| bad());
            match w.as_slice() {
                ["format_version", v] => e.format_version = num(v) as u16,
                ["clean", v] => e.clean = v.parse().unwrap_or_else(|_| bad()),
                ["log_entries", v] => e.log_entries = num(v) as usize,
                ["core", id, "blocks", n] => {
                    e.cores.insert(num(id) as u16, num(n));
                }
                ["block", core, b, v, crc] => {
                    let v = v.strip_prefix('v').unwrap_or_else(|| bad());
                    let crc = u32::from_str_radix(crc, 16).unwrap_or_else(|_| bad());
                    e.blocks.insert((num(core) as u16, num(b)), (num(v), crc));
                }
                _ => bad(),
            }
        }
        e
    }

    fn render(&self) -> String {
        let mut s = format!(
            "# A write-log cache image set; see README.md in this directory.\nformat_version {}\nclean {}\nlog_entries {}\n",
            self.format_version, self.clean, self.log_entries
        );
        for (c, n) in &self.cores {
            s += &format!("core {c} blocks {n}\n");
        }
        for ((c, b), (v, crc)) in &self.blocks {
            s += &format!("block {c} {b} v{v} {crc:08x}\n");
        }
        s
    }
}

fn ram_from(bytes: &[u8]) -> Device {
    let d = RamBackend::new((bytes.len() / BS) as u64);
    d.write(0, bytes, false).expect("fill");
    Arc::new(d)
}

fn image_of(d: &Device) -> Vec<u8> {
    let mut v = vec![0u8; d.blocks() as usize * BS];
    d.read(0, &mut v).expect("read");
    v
}

/// Reads every block of every core through `e` and checks it against `x`.
fn check_reads(e: &Engine, x: &Expected, what: &str) {
    for (&c, &n) in &x.cores {
        let mut buf = vec![0u8; n as usize * BS];
        e.read(CoreId(c), 0, &mut buf).expect("read");
        for b in 0..n {
            let blk = &buf[b as usize * BS..(b as usize + 1) * BS];
            let (v, crc) = x.blocks[&(c, b)];
            assert_eq!(
                (decode(blk, b), crc32c(blk)),
                (Some(v), crc),
                "{what}: core {c} block {b}"
            );
        }
    }
}

#[test]
fn every_committed_wl_image_loads_and_reads_back() {
    if std::env::var_os("TIERCACHE_WRITE_IMAGES").is_some() {
        generate::write_sets();
    }
    let dir = images_dir();
    let mut sets: Vec<String> = std::fs::read_dir(&dir)
        .expect("images dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".expected")
                .filter(|s| s.contains("-wl-"))
                .map(String::from)
        })
        .collect();
    sets.sort();
    assert!(
        !sets.is_empty(),
        "no write-log image set in {}",
        dir.display()
    );
    for s in &sets {
        let file = dir.join(format!("{s}.expected"));
        let x = Expected::parse(&std::fs::read_to_string(&file).unwrap(), &file);
        assert!(x.format_version <= tiercache_format::FORMAT_VERSION);
        let cache = ram_from(&std::fs::read(dir.join(format!("{s}.img"))).unwrap());
        let cores: Vec<(CoreId, Device)> = x
            .cores
            .keys()
            .map(|&c| {
                let img = std::fs::read(dir.join(format!("{s}.core{c}.img"))).unwrap();
                (CoreId(c), ram_from(&img))
            })
            .collect();
        // The core's loader alone (no writeback can start): the log's entries are found.
        let img = image_of(&cache);
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
            Ok(())
        };
        let (m, _) = tiercache_core::wl::device::open_device(&base(), &mut read)
            .unwrap_or_else(|e| panic!("{s}: the image does not load: {e}"));
        let entries = m
            .wl()
            .unwrap_or_else(|| panic!("{s}: not a write log"))
            .entries();
        assert_eq!(entries, x.log_entries, "{s}: log entries found");
        // Blocks the cores do not hold yet: only the log has them.
        let behind: usize = cores
            .iter()
            .map(|(c, d)| {
                let raw = image_of(d);
                (0..x.cores[&c.0])
                    .filter(|&b| {
                        crc32c(&raw[b as usize * BS..(b as usize + 1) * BS])
                            != x.blocks[&(c.0, b)].1
                    })
                    .count()
            })
            .sum();
        assert!(behind > 0, "{s}: the cores already hold everything");
        let ec = EngineConfig::threads(2);
        let (e, report) =
            Engine::open(&base(), cache.clone(), cores.clone(), ec).expect("the image loads");
        assert!(e.is_wl(), "{s}: a write log");
        assert_eq!(report.clean, x.clean, "{s}: clean stop or recovery");
        check_reads(&e, &x, &format!("{s} loaded"));
        // The log drains to the cores, which then hold every block on their own.
        e.wait(|m| m.wl().expect("wl").is_clean());
        for (c, d) in &cores {
            let raw = image_of(d);
            for b in 0..x.cores[&c.0] {
                let blk = &raw[b as usize * BS..(b as usize + 1) * BS];
                assert_eq!(
                    crc32c(blk),
                    x.blocks[&(c.0, b)].1,
                    "{s}: core {} block {b} after writeback",
                    c.0
                );
            }
        }
        e.stop().expect("stop");
        let (e, report) = Engine::open(&base(), cache, cores, ec).expect("reload");
        assert!(report.clean);
        check_reads(&e, &x, &format!("{s} reloaded after writeback"));
        e.stop().expect("stop");
        println!(
            "{s}: loaded ({} log entries, {behind} core blocks behind the log, clean {}), read back, written back, reloaded",
            x.log_entries, x.clean
        );
    }
}

/// SPEC durability point 6 for the write log: a byte flipped anywhere in the log of a cache
/// stopped cleanly (every entry durable) — superblock copies, reserved blocks, entry headers,
/// entry data — is either refused at load with a message naming `tiercache check`, or loads and
/// every block reads right. A damaged entry must never be taken for the end of the log: that
/// would drop the flushed entries after it and serve older data.
#[test]
fn damage_in_the_write_log_is_refused_or_harmless() {
    let (cache_img, core_imgs, x) = generate::build(false);
    let log = generate::log_region();
    // The log's blocks up to a little past the head: every live entry, and retired ones.
    let used = {
        let read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            buf.copy_from_slice(&cache_img[off as usize..off as usize + buf.len()]);
            Ok(())
        };
        let mut read_lba = |lba: Lba, buf: &mut [u8]| read(lba.0 * BS as u64, buf);
        let rec = tiercache_core::wl::scan(&generate::config(), &mut read_lba).expect("scan");
        assert!(rec.entries.len() >= 6);
        assert!(
            rec.head_pos < rec.sb.ring_blocks,
            "the ring has not wrapped"
        );
        let ring_offset = tiercache_format::wlog::RING_OFFSET_BLOCKS;
        (ring_offset + rec.head_pos + 4).min(log.bytes / BS as u64)
    };
    let (mut refused, mut harmless) = (0, 0);
    let mut seed = 0x5eed_u64;
    for blk in 0..used {
        // Three flips per block: the record frame, the payload, somewhere in the block.
        for k in 0..3u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = match k {
                0 => (seed >> 33) % 16,
                1 => 16 + (seed >> 33) % 63,
                _ => (seed >> 33) % BS as u64,
            };
            let off = (log.offset + blk * BS as u64 + at) as usize;
            let mut img = cache_img.clone();
            img[off] ^= 1 << ((seed >> 13) % 8);
            let mut read = |o: u64, buf: &mut [u8]| -> Result<(), String> {
                buf.copy_from_slice(&img[o as usize..o as usize + buf.len()]);
                Ok(())
            };
            match tiercache_core::wl::device::open_device(&base(), &mut read) {
                Err(e) => {
                    assert!(
                        e.contains("tiercache check"),
                        "log block {blk} byte {at}: refused without naming tiercache check: {e}"
                    );
                    refused += 1;
                }
                Ok(_) => {
                    let cores: Vec<(CoreId, Device)> = core_imgs
                        .iter()
                        .map(|(c, i)| (CoreId(*c), ram_from(i)))
                        .collect();
                    let ec = EngineConfig::threads(2);
                    let (e, _) = Engine::open(&base(), ram_from(&img), cores, ec)
                        .unwrap_or_else(|e| panic!("log block {blk} byte {at}: {e}"));
                    check_reads(&e, &x, &format!("log block {blk} byte {at} flipped"));
                    drop(e);
                    harmless += 1;
                }
            }
        }
    }
    println!(
        "write-log damage: {} flips over {used} log blocks: {refused} refused (naming tiercache check), {harmless} loaded and read right; 0 wrong reads",
        refused + harmless
    );
    assert!(refused > 0 && harmless > 0, "both outcomes seen");
}

/// The generator: builds the write-log image sets of the current format version.
mod generate {
    use super::*;
    use tiercache_core::config::Persist;
    use tiercache_core::mode::CacheMode;
    use tiercache_core::wl::WlConfig;
    use tiercache_format::FORMAT_VERSION;
    use tiercache_format::superblock::{Layout, Region};

    const CORES: [(u16, u64); 2] = [(0, 96), (1, 64)];

    /// A compact device: superblocks and tables, a 16 KiB journal at 128 KiB, a 128 KiB write
    /// log, two one-chunk checkpoint regions, 16 read-cache lines of 4 KiB (400 KiB in all).
    pub fn config() -> WlConfig {
        let mut cfg = base();
        cfg.mode = CacheMode::Wa;
        let ls = cfg.line_size.bytes();
        let layout = Layout::compact(16, ls as u32, 16 << 10, 128 << 10);
        let data = layout.data;
        layout.validate(data.end()).expect("valid layout");
        cfg.data_offset = Lba(data.offset / 512);
        cfg.persist = Some(Persist::new_cache(
            [0x71; 16],
            data.end(),
            cfg.line_size,
            cfg.lines,
            layout,
        ));
        let mut wl = WlConfig::on_device(cfg).expect("wl config");
        wl.staging_slots = 4;
        wl
    }

    /// One set: the fixed workload, then a clean stop or (`crash`) the devices as they are
    /// (every completed write kept, as a power cut that kept everything would leave them).
    fn make(name: &str, crash: bool) {
        let (cache_img, core_imgs, x) = build(crash);
        let dir = images_dir();
        std::fs::write(dir.join(format!("{name}.img")), cache_img).unwrap();
        for (c, img) in core_imgs {
            std::fs::write(dir.join(format!("{name}.core{c}.img")), img).unwrap();
        }
        std::fs::write(dir.join(format!("{name}.expected")), x.render()).unwrap();
        println!("wrote {name}: {} log entries", x.log_entries);
    }

    /// The cache device and its region of the write log.
    pub fn log_region() -> Region {
        config()
            .read_cache
            .persist
            .as_ref()
            .unwrap()
            .superblock
            .layout
            .log
    }

    /// Each core's image, by core id.
    pub type CoreImages = Vec<(u16, Vec<u8>)>;

    /// The images of one set (the cache device, the cores) and what loading them must give.
    pub fn build(crash: bool) -> (Vec<u8>, CoreImages, Expected) {
        let cfg = config();
        let cache: Device = Arc::new(RamBackend::new(
            cfg.read_cache
                .persist
                .as_ref()
                .unwrap()
                .superblock
                .device_bytes
                / BS as u64,
        ));
        let mut newest: BTreeMap<(u16, u64), u64> = BTreeMap::new();
        let cores: Vec<(u16, Device)> = CORES
            .iter()
            .map(|&(c, n)| {
                // The cores start with data of their own: version 1 everywhere.
                let d = RamBackend::new(n);
                let mut b = vec![0u8; BS];
                for i in 0..n {
                    fill(&mut b, i, 1);
                    d.write(i, &b, false).unwrap();
                    newest.insert((c, i), 1);
                }
                (c, Arc::new(d) as Device)
            })
            .collect();
        let specs = cores
            .iter()
            .map(|(c, d)| CoreSpec {
                id: CoreId(*c),
                dev: d.clone(),
                record: record(*c),
            })
            .collect();
        let e =
            Engine::create_wl(cfg, cache.clone(), specs, EngineConfig::threads(2)).expect("create");
        let write = |newest: &mut BTreeMap<(u16, u64), u64>, c: u16, lba: u64, n: u64, v: u64| {
            let mut buf = vec![0u8; n as usize * BS];
            for i in 0..n {
                fill(&mut buf[i as usize * BS..(i as usize + 1) * BS], lba + i, v);
                newest.insert((c, lba + i), v);
            }
            e.write(CoreId(c), lba, &buf, v.is_multiple_of(4))
                .expect("write");
        };
        // Written back: full and partial lines on both cores, then reads that fill the read
        // cache.
        for k in 0..4 {
            write(&mut newest, 0, k * 8, 8, 2);
        }
        write(&mut newest, 1, 8, 16, 2);
        write(&mut newest, 1, 41, 3, 2);
        e.flush(CoreId(0)).unwrap();
        e.wait(|m| m.wl().unwrap().is_clean());
        let mut r = vec![0u8; 16 * BS];
        e.read(CoreId(0), 32, &mut r).unwrap();
        e.read(CoreId(1), 0, &mut r).unwrap();
        // Left in the log: overwrites, a trim, write-zeroes, a FUA write, a flush, then writes
        // no flush covered.
        e.with_machine(|m| m.wl_mut().unwrap().set_writeback_paused(true));
        write(&mut newest, 0, 4, 8, 3);
        e.trim(CoreId(0), 16, 4).unwrap();
        (16..20).for_each(|b| {
            newest.insert((0, b), 0);
        });
        e.write_zeroes(CoreId(1), 10, 4, false).unwrap();
        (10..14).for_each(|b| {
            newest.insert((1, b), 0);
        });
        write(&mut newest, 0, 40, 4, 4);
        e.flush(CoreId(0)).unwrap();
        write(&mut newest, 1, 30, 4, 5);
        write(&mut newest, 0, 90, 6, 5);
        let log_entries = e.with_machine(|m| m.wl().unwrap().entries());
        assert!(log_entries >= 6, "entries left in the log: {log_entries}");
        let core_imgs: Vec<(u16, Vec<u8>)>;
        let cache_img;
        if crash {
            cache_img = image_of(&cache);
            core_imgs = cores.iter().map(|(c, d)| (*c, image_of(d))).collect();
            drop(e); // no stop: the images are what a power cut keeping everything leaves
        } else {
            e.stop().expect("stop");
            cache_img = image_of(&cache);
            core_imgs = cores.iter().map(|(c, d)| (*c, image_of(d))).collect();
        }
        let mut x = Expected {
            format_version: FORMAT_VERSION,
            clean: !crash,
            log_entries,
            cores: CORES.iter().copied().collect(),
            blocks: BTreeMap::new(),
        };
        let mut b = vec![0u8; BS];
        for (&(c, i), &v) in &newest {
            fill(&mut b, i, v);
            x.blocks.insert((c, i), (v, crc32c(&b)));
        }
        (cache_img, core_imgs, x)
    }

    pub fn write_sets() {
        make(&format!("v{FORMAT_VERSION}-wl-clean"), false);
        make(&format!("v{FORMAT_VERSION}-wl-crashed"), true);
    }
}
