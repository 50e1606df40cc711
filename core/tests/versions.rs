//! Every newer tiercache loads every older format (SPEC; docs/FORMAT.md, "Versions"): small
//! cache images of each format version are committed under `core/tests/images/` and this test
//! loads every one of them with today's loader and reads every core block through the loaded
//! cache.
//!
//! Each image set is `v<version>-<name>.expected` (what loading must give: clean or not, lines,
//! dirty lines, cores, and a CRC32C of every core block as read through the cache), the cache
//! device `v<version>-<name>.img` and one image per core `v<version>-<name>.core<id>.img`. The
//! reads are driven by a small driver in this file (not the model harness), so the check stays
//! independent of how the harness evolves.
//!
//! `TIERCACHE_WRITE_IMAGES=1 cargo test -p tiercache-core --test versions` writes the images
//! of the current format version ([`tiercache_format::FORMAT_VERSION`]) with the model harness.
//! Policy (core/tests/images/README.md): images of a released version are never regenerated; a
//! new format version adds new images beside the old ones.

mod harness;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use tiercache_core::cache::open;
use tiercache_core::event::{Action, BufRef, Dev, Event, ReqError};
use tiercache_core::units::{CoreId, IoId, Lba, LineSize, Nanos, ReqId};
use tiercache_core::{Cache, Config};
use tiercache_format::crc::crc32c;

const BS: usize = 512;

fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images")
}

/// What loading an image set must give.
#[derive(Debug, Default, PartialEq)]
struct Expected {
    format_version: u16,
    clean: bool,
    lines: u32,
    dirty_lines: u32,
    dropped_clean_lines: u32,
    /// Clean lines a recovery brings back warm (proven; format version 2). Absent from the
    /// version-1 files: 0.
    warm_clean_lines: u32,
    /// Core id -> size in blocks.
    cores: BTreeMap<u16, u64>,
    /// (core, block) -> (what the block holds, CRC32C of its 512 bytes).
    blocks: BTreeMap<(u16, u64), (String, u32)>,
}

fn unparsable(file: &Path, n: usize, line: &str) -> ! {
    panic!("{}:{}: cannot parse {line:?}", file.display(), n + 1)
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
            let bad = || -> ! { unparsable(file, n, line) };
            let num = |s: &str| s.parse::<u64>().unwrap_or_else(|_| bad());
            match w.as_slice() {
                ["format_version", v] => e.format_version = num(v) as u16,
                ["clean", v] => e.clean = v.parse().unwrap_or_else(|_| bad()),
                ["lines", v] => e.lines = num(v) as u32,
                ["dirty_lines", v] => e.dirty_lines = num(v) as u32,
                ["dropped_clean_lines", v] => e.dropped_clean_lines = num(v) as u32,
                ["warm_clean_lines", v] => e.warm_clean_lines = num(v) as u32,
                ["core", id, "blocks", n] => {
                    e.cores.insert(num(id) as u16, num(n));
                }
                ["block", core, b, what, crc] => {
                    let crc = u32::from_str_radix(crc, 16).unwrap_or_else(|_| bad());
                    e.blocks
                        .insert((num(core) as u16, num(b)), (what.to_string(), crc));
                }
                _ => bad(),
            }
        }
        e
    }

    fn render(&self, name: &str) -> String {
        let mut s = format!(
            "# tiercache format version {} test image `{name}`: what loading it must give.\n\
             # Written once by `TIERCACHE_WRITE_IMAGES=1 cargo test -p tiercache-core --test versions`;\n\
             # never regenerated (see README.md). Block lines: core, block, what the block holds\n\
             # (zero, or w<id>: data of harness write <id>), CRC32C of its 512 bytes (hex).\n",
            self.format_version
        );
        s += &format!("format_version {}\n", self.format_version);
        s += &format!("clean {}\n", self.clean);
        s += &format!("lines {}\n", self.lines);
        s += &format!("dirty_lines {}\n", self.dirty_lines);
        s += &format!("dropped_clean_lines {}\n", self.dropped_clean_lines);
        if self.format_version >= 2 {
            s += &format!("warm_clean_lines {}\n", self.warm_clean_lines);
        }
        for (c, n) in &self.cores {
            s += &format!("core {c} blocks {n}\n");
        }
        for ((c, b), (what, crc)) in &self.blocks {
            s += &format!("block {c} {b} {what} {crc:08x}\n");
        }
        s
    }
}

/// A minimal synchronous driver: devices are byte vectors, every IO succeeds, IOs complete in
/// the order they were issued.
struct Driver {
    cache: Cache,
    now: Nanos,
    cache_dev: Vec<u8>,
    cores: BTreeMap<u16, Vec<u8>>,
    pool: Vec<Vec<u8>>,
    bufs: HashMap<ReqId, Vec<u8>>,
    done: HashMap<ReqId, Result<(), ReqError>>,
    pending: VecDeque<(IoId, Action)>,
    next_req: u64,
}

impl Driver {
    fn new(cache: Cache, cache_dev: Vec<u8>, cores: BTreeMap<u16, Vec<u8>>) -> Driver {
        let cfg = cache.config();
        let pool = (0..cfg.pool_slots)
            .map(|_| vec![0u8; cfg.pool_slot_blocks as usize * BS])
            .collect();
        let mut d = Driver {
            cache,
            now: Nanos(1),
            cache_dev,
            cores,
            pool,
            bufs: HashMap::new(),
            done: HashMap::new(),
            pending: VecDeque::new(),
            next_req: 1,
        };
        d.apply(Event::Tick);
        d
    }

    fn apply(&mut self, ev: Event) {
        let mut actions = Vec::new();
        self.cache.apply(self.now, ev, &mut actions);
        for a in actions {
            match a {
                Action::Complete { req, result } => {
                    self.done.insert(req, result);
                }
                Action::Copy { src, dst, blocks } => {
                    let data = self.buf(src, blocks).to_vec();
                    self.buf_mut(dst, blocks).copy_from_slice(&data);
                }
                Action::Read { io, .. }
                | Action::Write { io, .. }
                | Action::WriteZeroes { io, .. }
                | Action::Trim { io, .. }
                | Action::Flush { io, .. } => self.pending.push_back((io, a)),
            }
        }
    }

    fn buf(&self, b: BufRef, blocks: u32) -> &[u8] {
        let len = blocks as usize * BS;
        match b {
            BufRef::Req { req, offset } => {
                &self.bufs[&req][offset as usize * BS..offset as usize * BS + len]
            }
            BufRef::Pool { slot, offset } => {
                &self.pool[slot as usize][offset as usize * BS..offset as usize * BS + len]
            }
            BufRef::Meta { id, offset } => {
                &self.cache.meta_buf(id)[offset as usize * BS..offset as usize * BS + len]
            }
        }
    }

    fn buf_mut(&mut self, b: BufRef, blocks: u32) -> &mut [u8] {
        let len = blocks as usize * BS;
        match b {
            BufRef::Req { req, offset } => {
                let buf = self.bufs.get_mut(&req).expect("live request");
                &mut buf[offset as usize * BS..offset as usize * BS + len]
            }
            BufRef::Pool { slot, offset } => {
                &mut self.pool[slot as usize][offset as usize * BS..offset as usize * BS + len]
            }
            BufRef::Meta { .. } => panic!("metadata buffers are write sources only"),
        }
    }

    fn dev(&mut self, dev: Dev) -> &mut Vec<u8> {
        match dev {
            Dev::Cache => &mut self.cache_dev,
            Dev::Core(c) => self.cores.get_mut(&c.0).expect("known core"),
        }
    }

    fn perform(&mut self, a: &Action) {
        match *a {
            Action::Read {
                dev,
                lba,
                blocks,
                buf,
                ..
            } => {
                let s = lba.0 as usize * BS;
                let data = self.dev(dev)[s..s + blocks as usize * BS].to_vec();
                self.buf_mut(buf, blocks).copy_from_slice(&data);
            }
            Action::Write {
                dev,
                lba,
                blocks,
                buf,
                ..
            } => {
                let data = self.buf(buf, blocks).to_vec();
                let s = lba.0 as usize * BS;
                self.dev(dev)[s..s + data.len()].copy_from_slice(&data);
            }
            Action::WriteZeroes {
                dev, lba, blocks, ..
            }
            | Action::Trim {
                dev, lba, blocks, ..
            } => {
                let s = lba.0 as usize * BS;
                self.dev(dev)[s..s + blocks as usize * BS].fill(0);
            }
            Action::Flush { .. } => {}
            Action::Complete { .. } | Action::Copy { .. } => unreachable!(),
        }
    }

    /// Completes IOs and moves time on until the cache is ready and has nothing to do.
    fn run(&mut self) {
        for _ in 0..1_000_000 {
            if let Some((io, a)) = self.pending.pop_front() {
                self.perform(&a);
                self.apply(Event::IoDone { io, result: Ok(()) });
                continue;
            }
            if self.cache.is_ready() && !self.cache.has_work() {
                return;
            }
            self.now = self.now.plus(Nanos::from_ms(100));
            self.apply(Event::Tick);
        }
        panic!("the loaded cache never became idle");
    }

    /// Reads `blocks` blocks of `core` at `lba` through the cache.
    fn read(&mut self, core: u16, lba: u64, blocks: u32) -> Vec<u8> {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        self.bufs.insert(req, vec![0u8; blocks as usize * BS]);
        self.apply(Event::Read {
            req,
            core: CoreId(core),
            lba: Lba(lba),
            blocks,
        });
        self.run();
        let result = self.done.remove(&req).expect("the read completed");
        assert_eq!(result, Ok(()), "read of core {core} blocks {lba}+{blocks}");
        self.bufs.remove(&req).expect("buffer")
    }
}

fn base_config() -> Config {
    // What the device does not store (pool sizes); everything else comes from the image.
    let mut cfg = Config::new(16, LineSize::K4);
    cfg.pool_slots = 4;
    cfg.pool_slot_blocks = 128;
    cfg
}

/// Reads `buf.len()` bytes at byte `off` of a cache device image (the loader's read function).
fn read_image(img: &[u8], off: u64, buf: &mut [u8]) -> Result<(), String> {
    let s = off as usize;
    let src = img
        .get(s..s + buf.len())
        .ok_or_else(|| format!("read past the end at {off}"))?;
    buf.copy_from_slice(src);
    Ok(())
}

/// Loads image set `name` (e.g. `v1-clean`) and checks it against its `.expected` file.
fn check_image_set(name: &str) {
    let dir = images_dir();
    let exp_path = dir.join(format!("{name}.expected"));
    let text = std::fs::read_to_string(&exp_path)
        .unwrap_or_else(|e| panic!("{}: {e}", exp_path.display()));
    let exp = Expected::parse(&text, &exp_path);
    let read_img = |f: String| {
        let p = dir.join(&f);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let cache_img = read_img(format!("{name}.img"));
    let cores: BTreeMap<u16, Vec<u8>> = exp
        .cores
        .keys()
        .map(|&c| (c, read_img(format!("{name}.core{c}.img"))))
        .collect();
    for (c, img) in &cores {
        assert_eq!(
            img.len() as u64,
            exp.cores[c] * BS as u64,
            "{name}: core {c} image size"
        );
    }

    let img = &cache_img;
    let mut read = |off: u64, buf: &mut [u8]| read_image(img, off, buf);
    let (cache, report) =
        open(&base_config(), &mut read).unwrap_or_else(|e| panic!("{name}: load failed: {e}"));
    assert_eq!(
        report.format_version, exp.format_version,
        "{name}: format version"
    );
    assert_eq!(report.clean, exp.clean, "{name}: clean");
    assert_eq!(report.lines, exp.lines, "{name}: lines loaded");
    assert_eq!(report.dirty_lines, exp.dirty_lines, "{name}: dirty lines");
    assert_eq!(
        report.dropped_clean_lines, exp.dropped_clean_lines,
        "{name}: clean lines dropped"
    );
    assert_eq!(
        report.warm_clean_lines, exp.warm_clean_lines,
        "{name}: clean lines back warm after the crash"
    );
    let table: BTreeMap<u16, u64> = report
        .cores
        .iter()
        .map(|c| (c.id as u16, c.size_blocks))
        .collect();
    assert_eq!(table, exp.cores, "{name}: core table");

    let mut d = Driver::new(cache, cache_img.clone(), cores);
    d.run();
    let mut checked = 0;
    for (&core, &n) in &exp.cores {
        let mut b = 0;
        while b < n {
            let len = (n - b).min(8) as u32;
            let data = d.read(core, b, len);
            for i in 0..len as u64 {
                let blk = &data[i as usize * BS..(i as usize + 1) * BS];
                let (what, crc) = exp.blocks.get(&(core, b + i)).unwrap_or_else(|| {
                    panic!(
                        "{name}: no expected content for core {core} block {}",
                        b + i
                    )
                });
                let got = crc32c(blk);
                assert_eq!(
                    got,
                    *crc,
                    "{name}: core {core} block {} reads as crc {got:08x} (first bytes {:02x?}), expected {what} (crc {crc:08x})",
                    b + i,
                    &blk[..18]
                );
                checked += 1;
            }
            b += len as u64;
        }
    }
    assert_eq!(
        checked,
        exp.blocks.len(),
        "{name}: every expected block read"
    );
}

/// Every image set in the directory: `<set>.expected` files, but for the write-log sets
/// (`-wl-`), which `engine/tests/wl_images.rs` loads.
fn image_sets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(images_dir())
        .expect("core/tests/images")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".expected")
                .filter(|s| !s.contains("-wl-"))
                .map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_committed_image_loads_and_reads_back() {
    if std::env::var_os("TIERCACHE_WRITE_IMAGES").is_some() {
        generate::write_images();
    }
    let sets = image_sets();
    for required in ["v1-clean", "v1-crashed", "v2-clean", "v2-crashed"] {
        assert!(
            sets.iter().any(|s| s == required),
            "image set {required} is missing from core/tests/images"
        );
    }
    for s in &sets {
        check_image_set(s);
        println!("{s}: loaded and read back");
    }
}

/// The generator: builds the image sets of the current format version with the model harness.
mod generate {
    use super::harness::{CrashImages, Env, Knobs, ReqOp, fill_block};
    use super::*;
    use tiercache_core::mode::CacheMode;
    use tiercache_core::policy::{CleaningPolicy, EvictionPolicy};
    use tiercache_format::FORMAT_VERSION;
    use tiercache_format::superblock::Layout;

    /// 16 lines of 4 KiB, `wb`, LRU, no background cleaning; a compact device: superblocks and
    /// tables, a 16 KiB journal at 128 KiB, two one-chunk checkpoint regions, then the lines
    /// (336 KiB in all).
    fn config(id: &[u8; 16]) -> Config {
        let mut cfg = Config::new(16, LineSize::K4);
        cfg.mode = CacheMode::Wb;
        cfg.eviction = EvictionPolicy::Lru;
        cfg.cleaning = CleaningPolicy::Nop;
        cfg.rate.enabled = false;
        cfg.pool_slots = 4;
        cfg.pool_slot_blocks = 16;
        let ls = cfg.line_size.bytes();
        let layout = Layout::compact(16, ls as u32, 16 << 10, 0);
        let data = layout.data;
        layout.validate(data.end()).expect("valid layout");
        cfg.data_offset = Lba(data.offset / 512);
        cfg.persist = Some(tiercache_core::config::Persist::new_cache(
            *id,
            data.end(),
            cfg.line_size,
            cfg.lines,
            layout,
        ));
        cfg
    }

    fn knobs() -> Knobs {
        Knobs {
            p_io_error: 0.0,
            qd: 4,
            ..Knobs::default()
        }
    }

    const CORES: [(u16, u64); 2] = [(0, 80), (1, 72)];

    fn new_env(id: &[u8; 16], seed: u64) -> Env {
        let mut env = Env::new(config(id), seed, knobs());
        for (c, n) in CORES {
            env.add_core(c, n);
        }
        env
    }

    /// Submits requests (`op`, core, lba, blocks) together, then completes everything.
    fn batch(env: &mut Env, reqs: &[(ReqOp, u16, u64, u32)]) {
        for &(op, c, lba, n) in reqs {
            env.submit(op, c, lba, n);
        }
        env.drain();
    }

    const W: ReqOp = ReqOp::Write { fua: false };
    const R: ReqOp = ReqOp::Read;

    /// Dirty, clean and partially valid lines on both cores, a trim and write-zeroes, journal
    /// records and running checkpoints.
    fn workload(env: &mut Env) {
        // Full and partial lines, dirty.
        batch(
            env,
            &[(W, 0, 0, 16), (W, 0, 20, 3), (W, 1, 8, 8), (W, 1, 33, 1)],
        );
        batch(env, &[(ReqOp::Flush, 0, 0, 0), (ReqOp::Flush, 1, 0, 0)]);
        // Written back: those lines become clean.
        env.writeback_all();
        // Reads bring clean lines in.
        batch(env, &[(R, 0, 40, 16), (R, 1, 48, 8), (R, 1, 64, 8)]);
        // Dirty again, over clean lines and new ones; a trim and write-zeroes drop some.
        batch(
            env,
            &[(W, 0, 2, 2), (W, 0, 56, 8), (W, 1, 0, 5), (W, 1, 50, 2)],
        );
        batch(
            env,
            &[
                (ReqOp::Trim, 0, 60, 2),
                (ReqOp::WriteZeroes { fua: false }, 1, 9, 1),
            ],
        );
        batch(env, &[(ReqOp::Flush, 0, 0, 0), (ReqOp::Flush, 1, 0, 0)]);
        // Acknowledged, not flushed.
        batch(env, &[(W, 0, 70, 4), (W, 1, 24, 8)]);
    }

    fn expected(env: &Env, clean: bool) -> Expected {
        let mut e = Expected {
            format_version: FORMAT_VERSION,
            clean,
            ..Expected::default()
        };
        let bpl = env.cache.config().line_size.blocks() as u64;
        for (c, n) in CORES {
            e.cores.insert(c, n);
            for b in 0..n {
                let mut blk = [0u8; BS];
                let what = match env.newest(c, b) {
                    harness::Content::Zero => "zero".to_string(),
                    harness::Content::Write(id) => {
                        fill_block(&mut blk, c, b, id);
                        format!("w{id}")
                    }
                    harness::Content::Junk => panic!("junk in the oracle"),
                };
                e.blocks.insert((c, b), (what, crc32c(&blk)));
            }
            for cl in 0..n.div_ceil(bpl) {
                if let Some((_, v, d)) = env.cache.line_state(CoreId(c), cl) {
                    if d != 0 {
                        e.lines += 1;
                        e.dirty_lines += 1;
                    } else if v != 0 && clean {
                        e.lines += 1;
                    }
                }
            }
        }
        e
    }

    fn write_set(name: &str, images: &CrashImages, e: &Expected) {
        let dir = images_dir();
        std::fs::create_dir_all(&dir).expect("images dir");
        std::fs::write(dir.join(format!("{name}.img")), &images.cache).expect("write");
        for (c, img) in &images.cores {
            std::fs::write(dir.join(format!("{name}.core{c}.img")), img).expect("write");
        }
        std::fs::write(dir.join(format!("{name}.expected")), e.render(name)).expect("write");
        println!("wrote image set {name}");
    }

    pub fn write_images() {
        let v = FORMAT_VERSION;
        // Stopped cleanly: every line comes back (warm), dirty ones dirty.
        let mut env = new_env(b"tiercache-v1-cln", 1);
        workload(&mut env);
        assert!(env.cache.dirty_lines() > 0 && env.cache.occupancy() > env.cache.dirty_lines());
        let e = expected(&env, true);
        let images = env.stop_images();
        write_set(&format!("v{v}-clean"), &images, &e);

        // Crashed while running (nothing lost: every completed write kept): dirty lines come
        // back; clean ones are dropped (version 1), or come back warm where the running
        // checkpoint proved them and no write intent followed (version 2).
        let mut env = new_env(b"tiercache-v1-crs", 2);
        workload(&mut env);
        batch(&mut env, &[(W, 0, 8, 4), (R, 0, 30, 2)]);
        if v >= 2 {
            // A trim of a clean line the running checkpoint proved: its write intent makes
            // recovery drop it, while the other clean lines come back warm.
            batch(&mut env, &[(ReqOp::Trim, 0, 41, 1)]);
        }
        assert!(
            env.cache.meta_counters().checkpoints > 0,
            "a running checkpoint"
        );
        let mut e = expected(&env, false);
        let images = env.crash_images(harness::CrashPattern::Kept);
        // Clean lines the loader finds in the checkpoint or the journal and drops (clean lines
        // read in since the last checkpoint are in neither): as the loader that wrote the image
        // counts them.
        let img = &images.cache;
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
            Ok(())
        };
        let (_, report) = open(&base_config(), &mut read).expect("the new image loads");
        // Version 2: clean lines a checkpoint proved and no write intent followed come back
        // warm; the others are dropped.
        assert!(
            report.dropped_clean_lines > 0 && report.warm_clean_lines > 0,
            "clean lines to drop and to keep: {report:?}"
        );
        e.dropped_clean_lines = report.dropped_clean_lines;
        e.warm_clean_lines = report.warm_clean_lines;
        e.lines = report.lines;
        write_set(&format!("v{v}-crashed"), &images, &e);
    }
}

/// A load after a clean stop does not read the journal region (`cache::journal_needed`: the
/// final checkpoint holds every line; P9's load time), and it does again — with the same
/// result — when the other superblock copy is damaged, since a damaged newer copy could have
/// named records replay needs. A crashed image always reads it.
#[test]
fn a_clean_image_loads_without_reading_its_journal_unless_a_superblock_copy_is_damaged() {
    use tiercache_core::cache::read_superblock;
    use tiercache_format::superblock::SUPERBLOCK_OFFSETS;
    let load = |img: &[u8]| {
        let mut reads: Vec<(u64, u64)> = Vec::new();
        let mut read = |off: u64, buf: &mut [u8]| -> Result<(), String> {
            reads.push((off, buf.len() as u64));
            read_image(img, off, buf)
        };
        let (_, report) = open(&base_config(), &mut read).expect("the image loads");
        let (sb, _, _) = read_superblock(&mut read).expect("a superblock");
        let j = sb.layout.journal;
        let journal_reads = reads
            .iter()
            .filter(|&&(o, l)| o < j.offset + j.bytes && j.offset < o + l)
            .count();
        (report, journal_reads)
    };
    for name in ["v1-clean", "v2-clean", "v1-crashed", "v2-crashed"] {
        let img = std::fs::read(images_dir().join(format!("{name}.img"))).expect("image");
        let (report, journal_reads) = load(&img);
        if report.clean {
            assert_eq!(journal_reads, 0, "{name}: a clean load read the journal");
        } else {
            assert!(
                journal_reads > 0,
                "{name}: a recovery must scan the journal"
            );
            continue;
        }
        // Damage the copy the load did not use: the journal is scanned, the result the same.
        let mut bad = img.clone();
        let other = SUPERBLOCK_OFFSETS[1 - report.superblock_copy] as usize;
        bad[other + 100] ^= 0x5a;
        let (again, journal_reads) = load(&bad);
        assert!(
            journal_reads > 0,
            "{name}: the other copy damaged, yet no journal scan"
        );
        assert!(
            again.other_copy_error.is_some(),
            "{name}: the damage is reported"
        );
        assert_eq!(
            (
                again.clean,
                again.lines,
                again.dirty_lines,
                again.superblock_copy
            ),
            (
                report.clean,
                report.lines,
                report.dirty_lines,
                report.superblock_copy
            ),
            "{name}: the load with the journal scanned"
        );
    }
}
