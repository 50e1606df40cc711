//! Requests at any byte offset and length from clients that negotiated no block sizes
//! (`nbd/src/unaligned.rs`): a raw-socket client on `NBD_OPT_EXPORT_NAME` (and one on
//! `NBD_OPT_GO` without `NBD_INFO_BLOCK_SIZE`) against a mirror of what the export must hold,
//! on the reactor and on worker threads, over the engine and a plain backend; the strict
//! behaviour of a client that did negotiate; a seeded mix of aligned and unaligned requests on
//! several connections at once to the same blocks, checked against an oracle of what each byte
//! may hold; and nbdsh (libnbd with strict mode off, not asking for block sizes).

mod common;

use common::wire::{Client, export_name, opened, ready};
use common::{Setup, have, nbdsh};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiercache_core::units::CoreId;
use tiercache_io::{FaultBackend, FaultConfig, OpKind, RamBackend};
use tiercache_nbd::proto::{cmd, errno};
use tiercache_nbd::{BackendExport, EngineExport, ExportMap, ListenAddr, Server, ServerConfig};

use tiercache_testkit::rng::{SplitMix as Rng, mix};

/// The byte write `id` puts at export offset `p` (never 0, so a write differs from zeros).
fn byte(id: u64, p: u64) -> u8 {
    (mix(id ^ p.wrapping_mul(0x1000_0001)) % 255) as u8 + 1
}

fn payload(id: u64, off: u64, len: u64) -> Vec<u8> {
    (off..off + len).map(|p| byte(id, p)).collect()
}

/// A client and the bytes its export must hold.
struct Mirrored {
    c: Client<UnixStream>,
    mirror: Vec<u8>,
}

impl Mirrored {
    fn write(&mut self, id: u64, off: u64, len: u64, fua: bool) {
        let data = payload(id, off, len);
        let flags = if fua { cmd::FLAG_FUA } else { 0 };
        let (e, _) = self.c.call(cmd::WRITE, flags, off, len as u32, &data);
        assert_eq!(e, 0, "write of {len} B at {off}");
        self.mirror[off as usize..(off + len) as usize].copy_from_slice(&data);
    }

    fn zero(&mut self, typ: u16, off: u64, len: u64, flags: u16) {
        let (e, _) = self.c.call(typ, flags, off, len as u32, &[]);
        assert_eq!(e, 0, "command {typ} of {len} B at {off}");
        self.mirror[off as usize..(off + len) as usize].fill(0);
    }

    fn check(&mut self, off: u64, len: u64) {
        let (e, d) = self.c.call(cmd::READ, 0, off, len as u32, &[]);
        assert_eq!(e, 0, "read of {len} B at {off}");
        let want = &self.mirror[off as usize..(off + len) as usize];
        if let Some(i) = d.iter().zip(want).position(|(a, b)| a != b) {
            panic!(
                "read of {len} B at {off}: byte {} is {:#x}, the mirror says {:#x}",
                off + i as u64,
                d[i],
                want[i]
            );
        }
        assert_eq!(d.len() as u64, len);
    }

    /// [`Mirrored::check`] of a range of any length, in reads of 1 MiB + 14 B.
    fn check_all(&mut self, mut off: u64, end: u64) {
        while off < end {
            let len = ((1 << 20) + 14).min(end - off);
            self.check(off, len);
            off += len;
        }
    }

    fn refused(&mut self, typ: u16, off: u64, len: u64, want: u32) {
        let data = if typ == cmd::WRITE {
            vec![9u8; len as usize]
        } else {
            vec![]
        };
        let (e, _) = self.c.call(typ, 0, off, len as u32, &data);
        assert_eq!(e, want, "command {typ} of {len} B at {off}");
    }
}

/// The acceptance sizes (1 B, 7 B at offset 1, 1 MiB + 14 B at offset 1, across line
/// boundaries, up to the maximum at an odd offset), errors, then a seeded mix; every read
/// compared with the mirror, and the whole export at the end.
fn against_mirror(c: Client<UnixStream>, size: u64, seed: u64) {
    let mut m = Mirrored {
        c,
        mirror: vec![0u8; size as usize],
    };
    let mib = 1u64 << 20;
    m.write(1, 0, 1, false);
    m.check(0, 1);
    m.write(2, 1, 7, false);
    m.check(0, 9);
    m.write(3, 1, mib + 14, false);
    m.check(1, mib + 14);
    m.check(0, mib + 512);
    m.write(4, 4090, 20, true); // across a 4 KiB line
    m.check(4089, 22);
    m.write(5, 8191, 9000, false); // over three lines
    m.check(8000, 10000);
    m.write(6, size - 3, 3, false); // the export's last bytes
    m.check(size - 5, 5);
    m.zero(cmd::TRIM, 3, 100, 0);
    m.check(0, 600);
    m.zero(cmd::TRIM, 4095, 3, cmd::FLAG_FUA);
    m.zero(cmd::WRITE_ZEROES, 513, mib + 14, 0);
    m.check(0, mib + 2048);
    m.zero(cmd::WRITE_ZEROES, 1, 7, cmd::FLAG_FUA | cmd::FLAG_NO_HOLE);
    m.check(0, 16);
    let (e, _) = m.c.call(cmd::CACHE, 0, 3, 5000, &[]);
    assert_eq!(e, 0, "unaligned cache");
    let (e, _) = m.c.call(cmd::FLUSH, 0, 0, 0, &[]);
    assert_eq!(e, 0);
    let max = tiercache_nbd::MAX_BLOCK as u64;
    if size > 2 * max {
        // A trim or zeroing longer than the maximum block size (no payload: served whole).
        m.write(7, 2 * mib, 2 * mib, false);
        m.zero(cmd::WRITE_ZEROES, 2 * mib + 5, max + 3 * mib + 3, 0);
        m.zero(cmd::TRIM, 2 * mib + 700, max + 99, 0);
        m.check_all(2 * mib - 1000, max + 6 * mib);
        // Up to the maximum block size at an odd offset: the covering blocks pass the
        // maximum, so the server splits what it sends to the device.
        m.write(8, 1, max, false);
        m.check(1, max);
    }
    m.refused(cmd::READ, 1, max + 1, errno::EINVAL);
    m.refused(cmd::WRITE, 1, max + 1, errno::EINVAL);
    // Out of range: the same errors as aligned requests, nothing changed.
    m.refused(cmd::WRITE, size - 1, 2, errno::ENOSPC);
    m.refused(cmd::WRITE_ZEROES, size - 1, 2, errno::ENOSPC);
    m.refused(cmd::READ, size - 1, 2, errno::EINVAL);
    m.refused(cmd::TRIM, size, 1, errno::EINVAL);
    m.check(size - 600, 600);
    // A seeded mix over the whole export.
    let mut rng = Rng(seed);
    for id in 100..400 {
        let cap = if rng.below(8) == 0 { 300_000 } else { 9000 };
        let len = 1 + rng.below(cap);
        let off = rng.below(size - len + 1);
        match rng.below(10) {
            0..=4 => m.write(id, off, len, rng.below(4) == 0),
            5 => m.zero(cmd::TRIM, off, len, 0),
            6 => m.zero(cmd::WRITE_ZEROES, off, len, 0),
            _ => m.check(off, len),
        }
    }
    m.check_all(0, size);
    m.c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
}

/// Every server shape: reactor or threads; engine (`disk`) or plain backend (`plain`).
fn setups(tag: &str) -> Vec<(Setup, &'static str)> {
    let mut v = Vec::new();
    for reactor in [true, false] {
        let cfg = ServerConfig {
            reactor,
            ..Default::default()
        };
        for name in ["disk", "plain"] {
            let t = format!(
                "{tag}-{}-{name}",
                if reactor { "reactor" } else { "threads" }
            );
            v.push((Setup::with_config(&t, 64, 8, cfg.clone()), name));
        }
    }
    v
}

#[test]
fn export_name_client_gets_any_alignment_served_like_a_mirror() {
    for (i, (s, name)) in setups("mirror").into_iter().enumerate() {
        let structured = i % 2 == 0;
        let (c, size) = export_name(&s.sock, name, structured);
        println!("{name} (structured: {structured}): {size} bytes");
        against_mirror(c, size, 0x5eed + i as u64);
    }
}

#[test]
fn go_without_block_size_is_served_any_alignment_and_with_it_stays_strict() {
    let s = Setup::new("go-liberal", 16, 4);
    // NBD_OPT_GO without NBD_INFO_BLOCK_SIZE: the client never learnt the minimum.
    let (mut c, size) = ready_asking(&s, "disk", &[]);
    assert_eq!(size, 16 << 20);
    let (e, _) = c.call(cmd::WRITE, 0, 1, 7, b"1234567");
    assert_eq!(e, 0);
    let (e, d) = c.call(cmd::READ, 0, 0, 9, &[]);
    assert_eq!((e, d), (0, b"\x001234567\x00".to_vec()));
    // With it: the minimum was promised, so the strict behaviour stays.
    let (mut strict, _) = ready(&s.sock, "disk", true);
    let (e, msg) = strict.call(cmd::WRITE, 0, 1, 7, b"abcdefg");
    assert_eq!(e, errno::EINVAL);
    assert!(
        String::from_utf8_lossy(&msg).contains("minimum block size 512"),
        "{}",
        String::from_utf8_lossy(&msg)
    );
    for (typ, off, len) in [
        (cmd::READ, 1, 7),
        (cmd::TRIM, 0, 3),
        (cmd::WRITE_ZEROES, 7, 512),
    ] {
        let (e, _) = strict.call(typ, 0, off, len, &[]);
        assert_eq!(e, errno::EINVAL, "strict command {typ} at {off}+{len}");
    }
    let (e, d) = strict.call(cmd::READ, 0, 0, 512, &[]);
    assert_eq!(e, 0);
    assert_eq!(
        &d[..9],
        b"\x001234567\x00",
        "a refused request changed nothing"
    );
}

fn ready_asking(s: &Setup, name: &str, infos: &[u16]) -> (Client<UnixStream>, u64) {
    ready_asking_at(&s.sock, name, infos)
}

fn ready_asking_at(sock: &std::path::Path, name: &str, infos: &[u16]) -> (Client<UnixStream>, u64) {
    let mut c = opened(sock, false);
    let size = c.go_asking(name, infos);
    (c, size)
}

// ===== a seeded mix on several connections at once, against an oracle =====

/// The region every connection works on: 16 blocks across a 4 KiB line boundary.
const REGION: (u64, u64) = (3 * 4096 - 2048, 3 * 4096 + 6144);

/// One request as the oracle sees it: the bytes `[lo, hi)` it wrote (`id` 0: zeros), or a
/// read and what it returned; `issue` and `ack` on one clock shared by every connection.
#[derive(Clone, Debug)]
struct Event {
    lo: u64,
    hi: u64,
    id: u64,
    read: Option<Vec<u8>>,
    issue: u64,
    ack: u64,
}

/// The value write `w` gave byte `p` (`w.id` 0: zeros; `u64::MAX`: the start of the round,
/// from `base`).
fn value(w: &Event, p: u64, base: &[u8]) -> u8 {
    match w.id {
        0 => 0,
        u64::MAX => base[(p - REGION.0) as usize],
        id => byte(id, p),
    }
}

/// Whether byte `p` may hold `got` for an observer whose request was issued at `issue` and
/// answered at `ack`: some write covering `p` that began before `ack` and was not followed,
/// at `p`, by another write that ended before `issue` began (every order the requests
/// allow; a merge that lost a concurrent write leaves bytes of an overtaken write).
fn legal(writes: &[&Event], p: u64, got: u8, issue: u64, ack: u64, base: &[u8]) -> bool {
    let covering = || writes.iter().filter(|w| w.lo <= p && p < w.hi);
    let last_start = covering()
        .filter(|w| w.ack < issue)
        .map(|w| w.issue)
        .max()
        .unwrap_or(0);
    covering().any(|w| w.issue < ack && w.ack >= last_start && value(w, p, base) == got)
}

/// Checks every read of a round and the final bytes; returns them (the next round's start).
fn check_round(events: &[Event], base: &[u8], fin: &[u8], round: usize) -> Vec<u8> {
    let start = Event {
        lo: REGION.0,
        hi: REGION.1,
        id: u64::MAX,
        read: None,
        issue: 0,
        ack: 0,
    };
    let mut writes: Vec<&Event> = events.iter().filter(|e| e.read.is_none()).collect();
    writes.push(&start);
    let mut reads = 0;
    for r in events.iter().filter(|e| e.read.is_some()) {
        let data = r.read.as_ref().expect("a read");
        for (i, &got) in data.iter().enumerate() {
            let p = r.lo + i as u64;
            assert!(
                legal(&writes, p, got, r.issue, r.ack, base),
                "round {round}: a read [{}, {}) at clock {}..{} got {got:#x} at byte {p}, which no \
                 order of the requests explains",
                r.lo,
                r.hi,
                r.issue,
                r.ack
            );
        }
        reads += 1;
    }
    for (i, &got) in fin.iter().enumerate() {
        let p = REGION.0 + i as u64;
        assert!(
            legal(&writes, p, got, u64::MAX - 1, u64::MAX, base),
            "round {round}: byte {p} ended as {got:#x}, which no order of the requests explains \
             (a lost update?)"
        );
    }
    println!(
        "round {round}: {} writes and {reads} reads on 4 connections, every byte explained",
        writes.len() - 1
    );
    fin.to_vec()
}

/// One client's requests for a round: a liberal one sends any alignment (on a new connection
/// every 6 requests, so the export turns, and drains the writes admitted before, again and
/// again), a strict one whole blocks; writes, trims, zeroes and reads at random inside
/// [`REGION`].
fn mixer(
    connect: impl Fn() -> Client<UnixStream>,
    liberal: bool,
    seed: u64,
    clock: &AtomicU64,
    log: &Mutex<Vec<Event>>,
) {
    let mut rng = Rng(seed);
    let span = REGION.1 - REGION.0;
    let mut c = connect();
    for k in 0..120u64 {
        if liberal && k % 6 == 5 {
            c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
            c = connect();
        }
        let (lo, len) = if liberal && (k % 6 == 0 || rng.below(4) != 0) {
            let len = 1 + rng.below(1500);
            (REGION.0 + rng.below(span - len + 1), len)
        } else {
            let blocks = 1 + rng.below(4);
            let lo = REGION.0 + 512 * rng.below(span / 512 - blocks + 1);
            (lo, blocks * 512)
        };
        let r = rng.below(10);
        let (typ, id) = match r {
            0..=4 => (cmd::WRITE, (seed << 16) | (k + 1)),
            5 => (cmd::TRIM, 0),
            6 => (cmd::WRITE_ZEROES, 0),
            _ => (cmd::READ, 0),
        };
        let data = if typ == cmd::WRITE {
            payload(id, lo, len)
        } else {
            vec![]
        };
        let issue = clock.fetch_add(1, Ordering::SeqCst) + 1;
        let (e, d) = c.call(typ, 0, lo, len as u32, &data);
        let ack = clock.fetch_add(1, Ordering::SeqCst) + 1;
        assert_eq!(
            e, 0,
            "command {typ} of {len} B at {lo} (liberal: {liberal})"
        );
        log.lock().unwrap().push(Event {
            lo,
            hi: lo + len,
            id,
            read: (typ == cmd::READ).then_some(d),
            issue,
            ack,
        });
    }
    c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
}

#[test]
fn concurrent_aligned_and_unaligned_requests_to_the_same_blocks_match_the_oracle() {
    for (i, (s, name)) in setups("oracle").into_iter().enumerate() {
        let mut base = vec![0u8; (REGION.1 - REGION.0) as usize];
        for round in 0..3 {
            let clock = Arc::new(AtomicU64::new(0));
            let log = Arc::new(Mutex::new(Vec::new()));
            let threads: Vec<_> = (0..4)
                .map(|k| {
                    let (clock, log) = (clock.clone(), log.clone());
                    let seed = mix((i * 100 + round * 10 + k) as u64) & 0xffff_ffff;
                    let sock = s.sock.clone();
                    std::thread::spawn(move || {
                        let connect = || match k {
                            0 => export_name(&sock, name, false).0,
                            1 => ready_asking_at(&sock, name, &[]).0,
                            _ => ready(&sock, name, k == 2).0,
                        };
                        mixer(connect, k < 2, seed, &clock, &log)
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("a connection's requests failed");
            }
            let (mut c, _) = ready(&s.sock, name, false);
            let (e, fin) = c.call(cmd::READ, 0, REGION.0, (REGION.1 - REGION.0) as u32, &[]);
            assert_eq!(e, 0);
            let events = log.lock().unwrap().clone();
            print!("{name} #{i}: ");
            base = check_round(&events, &base, &fin, round);
        }
    }
}

// ===== nbdsh =====

#[test]
fn nbdsh_without_block_sizes_and_strict_mode_matches_a_mirror_file() {
    if !have("nbdsh") {
        return;
    }
    let s = Setup::new("nbdsh-unaligned", 16, 4);
    let mirror = s.dir.path("mirror.img");
    let script = r#"
import os
h = nbd.NBD()
h.set_strict_mode(0)
h.set_request_block_size(False)
h.add_meta_context("base:allocation")
h.connect_uri(URI)
size = h.get_size()
m = bytearray(size)
def w(off, data, flags=0):
    h.pwrite(data, off, flags)
    m[off:off + len(data)] = data
def z(off, n, trim=False):
    if trim:
        h.trim(n, off)
    else:
        h.zero(n, off)
    m[off:off + n] = bytes(n)
def r(off, n):
    got = h.pread(n, off)
    assert got == bytes(m[off:off + n]), "read %d B at %d differs from the mirror" % (n, off)
w(0, b"\x01")
w(1, b"ABCDEFG")
w(1, os.urandom((1 << 20) + 14), nbd.CMD_FLAG_FUA)
r(0, (1 << 20) + 512)
w(4090, b"x" * 20)
r(4089, 22)
z(3, 100, trim=True)
z(513, (1 << 20) + 14)
z(1, 7)
r(0, (1 << 20) + 2048)
w(size - 3, b"end")
r(size - 7, 7)
h.cache(5000, 3)
h.flush()
# block status at an odd offset: the extents start there and add up to the length asked
z(8192, 65536)
w(8192 + 65536, b"d" * 4096)
seen = []
def cb(meta, off, ents, err):
    seen.extend(ents)
    return 0
h.block_status(65536 + 100, 8192 + 7, cb)
assert seen, seen
lens = seen[0::2]
assert sum(lens) <= 65536 + 100 and lens[0] == 65536 - 7, seen
assert seen[1] & 1, seen
r(0, size)
h.shutdown()
open(MIRROR, "wb").write(m)
print("ok")
"#;
    let out = nbdsh(
        script,
        &[
            ("URI", s.uri("disk")),
            ("MIRROR", mirror.display().to_string()),
        ],
    );
    assert!(out.contains("ok"), "{out}");
    // The export read through a strict connection equals the mirror file nbdsh left.
    let want = std::fs::read(&mirror).unwrap();
    let (mut c, size) = ready(&s.sock, "disk", true);
    assert_eq!(size as usize, want.len());
    let mut off = 0;
    while off < size {
        let n = (4u64 << 20).min(size - off);
        let (e, d) = c.call(cmd::READ, 0, off, n as u32, &[]);
        assert_eq!(e, 0);
        assert!(
            d == want[off as usize..(off + n) as usize],
            "the export differs from the mirror in [{off}, {})",
            off + n
        );
        off += n;
    }
}

// ===== the drain: a write admitted before the first unaligned request =====

/// On the threads (a plain backend export) and on the reactor (an engine export whose
/// write-through core holds the write): a write admitted to the fast path is held by the
/// device; a liberal connection then sends an unaligned write to the same block. Its merge
/// must not reach the device before the held write completes, and must then merge into it.
/// (Without the drain the plain export fails this; the engine also orders requests to one
/// line itself, so there the merge's read would wait for the held write anyway.)
#[test]
fn a_merge_waits_for_writes_admitted_before_its_connection_turned() {
    for on_engine in [false, true] {
        let dir = common::TmpDir::new("drain");
        let dev = Arc::new(FaultBackend::new(
            RamBackend::new(64),
            FaultConfig::default(),
        ));
        let export: Arc<dyn tiercache_nbd::Export> = if on_engine {
            Arc::new(EngineExport::new(
                common::engine_on(Arc::new(RamBackend::new(2048)), dev.clone(), 4),
                CoreId(0),
            ))
        } else {
            Arc::new(BackendExport::new(dev.clone()))
        };
        let ex = Arc::new(ExportMap::new());
        ex.insert("s", "", export);
        let srv = Server::new(ex, ServerConfig::default());
        let sock = dir.path("s.sock");
        srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
        held_write_then_merge(&sock, &dev, on_engine);
        srv.shutdown();
    }
}

fn held_write_then_merge(sock: &std::path::Path, dev: &FaultBackend<RamBackend>, on_engine: bool) {
    let (mut strict, _) = ready(sock, "s", false);
    let (mut liberal, _) = export_name(sock, "s", false);
    // Admitted on the fast path (no connection has turned yet), then held by the device.
    dev.hang(&[OpKind::Write]);
    strict.send_req(cmd::WRITE, 0, 1, 0, 512, &[0xaa; 512]);
    let t = Instant::now();
    while dev.hung() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the write never reached the device"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The liberal connection turns; its merge must wait for that write (a merge that read the
    // block now would write the old bytes back over the write).
    liberal.send_req(cmd::WRITE, 0, 2, 1, 1, &[0x55]);
    std::thread::sleep(Duration::from_millis(200));
    let hung = dev.hung();
    dev.release(); // before any assertion: a failing test must not leave the server hung
    assert_eq!(
        hung, 1,
        "engine: {on_engine}: the merge went ahead while a write admitted before it was in flight"
    );
    assert_eq!(strict.reply(|_| 0), (1, 0, vec![]));
    assert_eq!(liberal.reply(|_| 0), (2, 0, vec![]));
    let (e, d) = liberal.call(cmd::READ, 0, 0, 512, &[]);
    assert_eq!(e, 0);
    let mut want = vec![0xaa; 512];
    want[1] = 0x55;
    assert!(
        d == want,
        "engine: {on_engine}: block 0 starts {:x?}",
        &d[..4]
    );
}
