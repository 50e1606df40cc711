//! A Ceph RBD image as a core, end to end, as a user would run it: a real single-node cluster
//! started on loopback by `scripts/ceph-cluster.sh` (stopped when the test process exits,
//! whatever happens; see io/tests/common/ceph.rs), the real `tiercache` binary as a daemon, a
//! `wb` cache on a file, `add-core --core-device rbd:rbd/IMG --ceph-conf FILE`, 64 MiB of
//! random data through the NBD export with nbdcopy, the exclusive lock against a second
//! client, a SIGKILL of the daemon and a restart from a config file (the dead daemon's lock is
//! taken over, the dirty data recovered), a clean stop keeping the dirty data and another
//! restart, the `tiercache.dirty` image marker through all of it, writeback, stop, and
//! `rbd export` compared bit for bit with what was written.
//!
//! Skipped (with a printed reason) only when ceph-mon is not installed, or nbdcopy is not.

#[path = "../../io/tests/common/ceph.rs"]
mod ceph;
mod common;

use common::{Daemon, Dir, Opts, have, run_ok};
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};
use tiercache_io::Backend;
use tiercache_testkit::rng::XorShift;

const MIB: usize = 1 << 20;

/// `bytes` of seeded pseudo-random data in a file.
fn random_file(path: &str, bytes: usize, seed: u64) -> Vec<u8> {
    let v = XorShift(seed | 1).words(bytes);
    std::fs::File::create(path).unwrap().write_all(&v).unwrap();
    v
}

/// `DIR/tiercache.toml`: cache 1 on `cache` with core 0 the RBD image `spec` (`ceph_conf`
/// `conf`, `ceph_id` admin) exported as `export`; its path.
fn rbd_config(d: &Dir, cache: &str, spec: &str, conf: &str, export: &str) -> String {
    let cfg = d.path("tiercache.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{cache}\"\n\n[[cache.core]]\nid = 0\ndevice = \"rbd:{spec}\"\nceph_conf = \"{conf}\"\nceph_id = \"admin\"\nexport = \"{export}\"\n"
        ),
    )
    .unwrap();
    cfg
}

/// A daemon started from the config file `cfg`, given 90 s to be ready (an RBD core's lock
/// may first have to be taken over from a killed daemon).
fn start_from(d: &Dir, cfg: &str) -> Daemon {
    Daemon::start(
        Opts::new(d)
            .config(cfg)
            .ready_within(Duration::from_secs(90)),
    )
}

fn read_file(path: &str) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut v)
        .unwrap();
    v
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn rbd_core_end_to_end() {
    if !have("nbdcopy") {
        println!("skipped: rbd_core_end_to_end: nbdcopy is not installed (libnbd-bin)");
        return;
    }
    // A killed client's watch, and with it its exclusive lock, is given up after 10 s (30 s by
    // default) on this cluster, so the SIGKILL part waits less.
    let Some(c) = ceph::shared_with(
        "rbd_core_end_to_end",
        &["--set", "osd_client_watch_timeout=10"],
    ) else {
        return;
    };
    let t0 = Instant::now();
    let img = ceph::image_name("e2e");
    c.create_image(&img, 256);
    let spec = format!("rbd/{img}");
    let conf = c.conf.display().to_string();
    let d = Dir::new("ceph-e2e");
    let cache = d.path("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let src = d.path("src.img");
    let data = random_file(&src, 64 * MIB, 0xCE9A);

    // --- A wb cache on a file, the RBD image as its core.
    let mut dm = Daemon::start(Opts::new(&d).ready_within(Duration::from_secs(90)));
    dm.json(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    // Data stays dirty until we write it back.
    dm.json(&[
        "set-param",
        "--cache-id",
        "1",
        "cleaning",
        "--policy",
        "nop",
    ]);
    dm.fails(
        &[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            "rbd:rbd/no-such-image",
            "--ceph-conf",
            &conf,
        ],
        "image rbd/no-such-image not found",
    );
    dm.fails(
        &[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            &cache,
            "--ceph-id",
            "admin",
        ],
        "rbd:POOL/IMAGE devices only",
    );
    assert_eq!(c.image_meta(&img, "tiercache.dirty"), None);
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &format!("rbd:{spec}"),
        "--ceph-conf",
        &conf,
        "--ceph-id",
        "admin",
        "--export",
        "e2e",
    ]);
    assert_eq!(v["core_id"], 0, "{v}");
    let l = dm.json(&["list"]);
    let device = l[0]["cores"][0]["device"].as_str().unwrap().to_string();
    assert_eq!(device, format!("rbd:{spec}:conf={conf}:id=admin"));
    assert_eq!(l[0]["cores"][0]["size_bytes"], 256 << 20);
    // SPEC C18: marked at attach in a lazy mode, before any write.
    let marker = c
        .image_meta(&img, "tiercache.dirty")
        .expect("marker set at attach in wb");
    assert!(marker.starts_with("dirty in tiercache "), "{marker}");
    println!("marker at attach: {marker}");

    // --- 64 MiB of random data through the export: dirty in the cache, not on the image.
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy")
            .args(["--flush", "--connections=4"])
            .arg(&src)
            .arg(dm.uri("e2e")),
    );
    println!("nbdcopy 64 MiB in: {:.2} s", t.elapsed().as_secs_f64());
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let dirty = s["usage"]["dirty_lines"].as_u64().unwrap();
    assert_eq!(dirty, (64 * MIB / 4096) as u64, "{s}");
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str())
    );

    // A second client while tiercache holds the image: its writes are refused (EROFS), so it
    // cannot corrupt the image under the cache. Its reads work and see the image without the
    // cache's dirty data (zeros here): what the marker warns about.
    let o = c.cli(
        "rbd",
        &[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "4K",
            "--io-total",
            "1M",
            &spec,
        ],
    );
    assert!(
        !o.status.success(),
        "a second client wrote to the held image"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stale = d.path("stale.img");
    c.rbd(&["export", "--no-progress", &spec, &stale]);
    assert!(
        read_file(&stale)[..MIB].iter().all(|&b| b == 0),
        "the image holds data that only the cache should have"
    );
    std::fs::remove_file(&stale).unwrap();

    // --- SIGKILL with the data dirty in the cache: the marker stays (it is in the cluster).
    dm.kill();
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str()),
        "marker gone after a crash with dirty data"
    );

    // --- Restart from a config file naming the RBD core with ceph_conf / ceph_id: the cache
    // is recovered, and the core reattached once the killed daemon's lock is given up (its
    // watch times out; librbd then blocklists the dead client and takes the lock).
    let cfg = rbd_config(&d, &cache, &spec, &conf, "e2e");
    let t = Instant::now();
    let dm = start_from(&d, &cfg);
    println!(
        "daemon restarted after SIGKILL in {:.2} s (lock taken over from the dead daemon)",
        t.elapsed().as_secs_f64()
    );
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}\n{}", dm.log());
    assert_eq!(l[0]["dirty_lines"], dirty, "{l}");
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str())
    );

    // --- Clean stop with the dirty data kept on the cache device: the marker stays; the
    // next start takes the released lock at once.
    dm.shutdown();
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str()),
        "marker gone while the cache device holds dirty data"
    );
    let t = Instant::now();
    let dm = start_from(&d, &cfg);
    println!(
        "daemon restarted after a clean stop in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}\n{}", dm.log());
    assert_eq!(l[0]["dirty_lines"], dirty, "{l}");
    let back = d.path("back.img");
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=2")
            .arg(dm.uri("e2e"))
            .arg(&back),
    );
    let got = read_file(&back);
    assert_eq!(got.len(), 256 * MIB);
    assert!(
        got[..64 * MIB] == data[..],
        "read back through the cache differs at {:?}",
        first_diff(&got, &data)
    );
    std::fs::remove_file(&back).unwrap();

    // --- Writeback: everything lands on the image. In wb the marker stays (any write may
    // dirty the core again); switching to wt (nothing dirty) removes it, back to wb sets it.
    let t = Instant::now();
    let v = dm.json(&["writeback", "--cache-id", "1"]);
    println!(
        "writeback of {} lines: {:.2} s ({v})",
        dirty,
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        dm.json(&["stats", "--cache-id", "1"])["usage"]["dirty_lines"],
        0
    );
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str())
    );
    dm.json(&["set-mode", "--cache-id", "1", "--mode", "wt"]);
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty"),
        None,
        "marker kept in wt with nothing dirty"
    );
    dm.json(&["set-mode", "--cache-id", "1", "--mode", "wb"]);
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str())
    );

    // --- Stop: nothing dirty is left, so the marker goes and the lock is released.
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_lines_kept"], 0, "{v}");
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty"),
        None,
        "marker left after a complete writeback and stop"
    );
    let out = d.path("export.img");
    c.rbd(&["export", "--no-progress", &spec, &out]);
    let img_bytes = read_file(&out);
    assert_eq!(img_bytes.len(), 256 * MIB);
    assert!(
        img_bytes[..64 * MIB] == data[..],
        "rbd export differs from what was written, first at byte {:?}",
        first_diff(&img_bytes, &data)
    );
    assert!(
        img_bytes[64 * MIB..].iter().all(|&b| b == 0),
        "rbd export has data past what was written"
    );

    // --- An image marked by another cache is refused (that cache holds its dirty data);
    // once the mark is removed it attaches, and a wt cache sets none.
    let cache2 = d.path("cache2.img");
    std::fs::File::create(&cache2)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let v = dm.json(&["start-cache", "--cache-device", &cache2, "--mode", "wt"]);
    let id2 = v["cache_id"].to_string();
    c.rbd(&[
        "image-meta",
        "set",
        &spec,
        "tiercache.dirty",
        "dirty in tiercache 00000000000000000000000000000bad",
    ]);
    let dev = format!("rbd:{spec}:conf={conf}");
    dm.fails(
        &["add-core", "--cache-id", &id2, "--core-device", &dev],
        "another tiercache cache holds dirty data of it",
    );
    c.rbd(&["image-meta", "remove", &spec, "tiercache.dirty"]);
    dm.json(&["add-core", "--cache-id", &id2, "--core-device", &dev]);
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty"),
        None,
        "marker set in wt"
    );
    dm.shutdown();
    println!(
        "end to end on RBD: {:.1} s (cluster start {:.1} s)",
        t0.elapsed().as_secs_f64(),
        c.startup.as_secs_f64()
    );
}

/// Where librbd is missing (here: pointed at a path that does not exist), opening an rbd:
/// core fails with one line saying what to install, and everything else still works. Needs
/// no cluster.
#[test]
fn without_librbd_an_rbd_core_is_one_clear_error() {
    let d = Dir::new("ceph-nolib");
    let cache = d.path("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let core = d.path("core.img");
    std::fs::File::create(&core)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    // Only the daemon child sees the variable.
    let dm =
        Daemon::start(Opts::new(&d).env("TIERCACHE_LIBRBD", &d.path("no-such-dir/librbd.so.1")));
    dm.json(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    let err = dm.fails(
        &[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            "rbd:rbd/vm1",
        ],
        "librbd is not installed: apt-get install librbd1",
    );
    println!("{}", err.trim());
    let v = dm.json(&["add-core", "--cache-id", "1", "--core-device", &core]);
    assert_eq!(v["core_id"], 0);
    dm.shutdown();
}

/// Mode `wl` (the write log, SPEC C9) in front of a real RBD image, through the daemon as a
/// user runs it: `start-cache --mode wl` on a file, `add-core rbd:...`, 16 MiB of random data
/// with nbdcopy, then 4K overwrites (some of the same block twice), a TRIM and a write inside
/// the trimmed range with the loadgen client, a flush; the daemon SIGKILLed while the log still
/// holds data (checked in `stats`: the core's config holds librbd's writeback to 20 writes/s
/// with `rbd_qos_write_iops_limit`); a restart from a config file (the lock taken over once the
/// dead daemon's watch times out; the config now without the limit), everything read back
/// bit for bit through NBD, `writeback`, the `write_log` block clean, `stop-cache`, and
/// `rbd export` equal to what was written. The dirty marker is there while the log is
/// attached and gone after the stop.
#[test]
fn wl_cache_on_rbd_sigkill_restart_export() {
    use tiercache_loadgen::{Connection, Target};
    if !have("nbdcopy") {
        println!("skipped: wl_cache_on_rbd_sigkill_restart_export: nbdcopy is not installed");
        return;
    }
    let Some(c) = ceph::shared_with(
        "wl_cache_on_rbd_sigkill_restart_export",
        &["--set", "osd_client_watch_timeout=10"],
    ) else {
        return;
    };
    let t0 = Instant::now();
    let img = ceph::image_name("wl");
    const IMG_MIB: usize = 128;
    c.create_image(&img, IMG_MIB as u64);
    let spec = format!("rbd/{img}");
    let d = Dir::new("ceph-wl");
    let base_conf = std::fs::read_to_string(&c.conf).unwrap();
    let conf = d.path("core.conf");
    std::fs::write(
        &conf,
        format!("{base_conf}\n[client]\nrbd_qos_write_iops_limit = 20\n"),
    )
    .unwrap();
    let cache = d.path("cache.img");
    std::fs::File::create(&cache)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();

    // What the image must hold in the end; every write below is applied here too.
    let mut want = vec![0u8; IMG_MIB * MIB];
    let src = d.path("src.img");
    let base = random_file(&src, 16 * MIB, 0x3A11);
    want[..16 * MIB].copy_from_slice(&base);

    let mut dm = Daemon::start(Opts::new(&d).ready_within(Duration::from_secs(90)));
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--mode", "wl"]);
    assert_eq!(v["created"]["log_bytes"], 128 << 20, "{v}");
    dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &format!("rbd:{spec}"),
        "--ceph-conf",
        &conf,
        "--export",
        "wl",
    ]);
    let marker = c
        .image_meta(&img, "tiercache.dirty")
        .expect("marker set at attach in wl");

    // --- The data: a bulk copy, then small overwrites, a TRIM, a write into the trimmed range.
    let t = Instant::now();
    run_ok(
        Command::new("nbdcopy")
            .args(["--flush", "--connections=4"])
            .arg(&src)
            .arg(dm.uri("wl")),
    );
    let target = Target::parse(&dm.uri("wl")).unwrap();
    let mut conn = Connection::connect(&target).unwrap();
    let mut x = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut next = || x.next();
    let mut block = [0u8; 4096];
    for i in 0..384 {
        // The first 32 blocks are written twice: the later write must win.
        let blk = if i >= 352 {
            (i - 352) as u64 * 7
        } else {
            next() % (16 * MIB as u64 / 4096)
        };
        for ch in block.chunks_mut(8) {
            ch.copy_from_slice(&next().to_le_bytes());
        }
        let off = blk * 4096;
        conn.write_at(off, &block, i % 50 == 0).unwrap();
        want[off as usize..off as usize + 4096].copy_from_slice(&block);
    }
    let (toff, tlen) = (8 * MIB, 64 * 1024);
    conn.trim(toff as u64, tlen as u32).unwrap();
    want[toff..toff + tlen].fill(0);
    let woff = toff + 16 * 1024;
    block.fill(0x5A);
    conn.write_at(woff as u64, &block, false).unwrap();
    want[woff..woff + 4096].copy_from_slice(&block);
    conn.flush().unwrap();
    conn.close();
    println!(
        "16 MiB + 385 small writes + a TRIM through wl in {:.2} s",
        t.elapsed().as_secs_f64()
    );

    // --- SIGKILL while the log holds data not yet on the image.
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let w = &s["write_log"];
    assert_eq!(w["present"], true, "{s}");
    let dirty = w["dirty_bytes"].as_u64().unwrap();
    assert!(dirty > 0, "the log was drained before the kill: {w}");
    println!(
        "before the kill: dirty {dirty} bytes, {} entries, log fill {}%, generation lag {}",
        w["entries"], w["log_fill_pct"], w["generation_lag"]
    );
    dm.kill();
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some(marker.as_str()),
        "marker gone after a crash with data in the log"
    );
    // The image alone is not yet what was written (the log holds the rest).
    let stale = d.path("stale.img");
    c.rbd(&["export", "--no-progress", &spec, &stale]);
    assert!(
        read_file(&stale) != want,
        "the image already held everything at the kill"
    );
    std::fs::remove_file(&stale).unwrap();

    // --- Restart from a config file; writeback at full speed now.
    std::fs::write(&conf, &base_conf).unwrap();
    let cfg = rbd_config(&d, &cache, &spec, &conf, "wl");
    let t = Instant::now();
    let dm = start_from(&d, &cfg);
    println!(
        "wl daemon restarted after SIGKILL in {:.2} s (lock taken over from the dead daemon)",
        t.elapsed().as_secs_f64()
    );
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}\n{}", dm.log());
    assert_eq!(l[0]["mode"], "wl", "{l}");
    let back = d.path("back.img");
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=2")
            .arg(dm.uri("wl"))
            .arg(&back),
    );
    let got = read_file(&back);
    assert_eq!(got.len(), want.len());
    assert!(
        got == want,
        "read back through wl after the restart differs at byte {:?}",
        first_diff(&got, &want)
    );
    std::fs::remove_file(&back).unwrap();

    // --- Writeback: the log drains; the write_log block says so.
    let t = Instant::now();
    dm.json(&["writeback", "--cache-id", "1"]);
    println!("writeback: {:.2} s", t.elapsed().as_secs_f64());
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let w = &s["write_log"];
    assert_eq!(w["present"], true, "{s}");
    assert_eq!(w["dirty_bytes"], 0, "{w}");
    assert_eq!(w["clean"], true, "{w}");
    assert_eq!(w["entries"], 0, "{w}");
    println!("after writeback: {w}");

    // --- Stop: nothing is left in the log, the marker goes, the image is what was written.
    dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty"),
        None,
        "marker left after a complete writeback and stop"
    );
    let out = d.path("export.img");
    c.rbd(&["export", "--no-progress", &spec, &out]);
    let exported = read_file(&out);
    assert_eq!(exported.len(), want.len());
    assert!(
        exported == want,
        "rbd export differs from what was written through wl, first at byte {:?}",
        first_diff(&exported, &want)
    );
    dm.shutdown();
    println!(
        "wl on RBD end to end: {:.1} s (cluster start {:.1} s)",
        t0.elapsed().as_secs_f64(),
        c.startup.as_secs_f64()
    );
}

/// `tiercache bench --core rbd` (issue 6: the Ceph peers) on the test's cluster, given with
/// `--ceph-conf`: the 4K workloads on three images of their own (baseline bare through the NBD
/// server, cached through a `wb` cache, the librbd peers with fio's rbd engine without and with
/// librbd's writeback cache). Every configuration of every workload measured, the client
/// configurations as asked, the cached runs' counters sane, the comparison in the report, and
/// the bench's images removed from the pool afterwards.
#[test]
fn bench_on_rbd_cores_with_the_librbd_peers() {
    let Some(c) = ceph::shared("bench_on_rbd_cores_with_the_librbd_peers") else {
        return;
    };
    if !have("fio") {
        println!("skipped: fio is not installed (apt-get install fio)");
        return;
    }
    let d = Dir::new("ceph-bench");
    let out = d.path("report");
    let conf = c.conf.display().to_string();
    let (ok, so, se) = common::run(
        Command::new(env!("CARGO_BIN_EXE_tiercache")).args([
            "bench",
            "--core",
            "rbd",
            "--ceph-conf",
            &conf,
            "--quick",
            "--runtime",
            "2",
            "--only",
            "4k",
            "--cache-size",
            "128m",
            "--working-set",
            "64m",
            "--out",
            &out,
            "--scratch",
            &d.path(""),
        ]),
        600,
    );
    println!("{so}");
    assert!(ok, "bench --core rbd failed:\n{so}\n{se}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{out}/results.json")).unwrap()).unwrap();
    let cfg = &v["config"];
    assert_eq!(cfg["peers"], serde_json::json!(["librbd", "librbd-wb"]));
    assert_eq!(cfg["ceph"]["librbd_conf"]["rbd_cache"], "false");
    assert_eq!(cfg["ceph"]["librbd_wb_conf"]["rbd_cache"], "true");
    assert_eq!(
        cfg["ceph"]["librbd_wb_conf"]["rbd_cache_policy"],
        "writeback"
    );
    assert_eq!(cfg["ceph"]["cluster"]["started_by_bench"], false);
    assert!(
        cfg["core"]
            .as_str()
            .unwrap()
            .starts_with("rbd:rbd/tc-bench-")
    );
    let runs = v["runs"].as_array().unwrap();
    for w in ["randread-4k", "randwrite-4k", "randrw70-4k"] {
        for config in ["baseline", "cached", "librbd", "librbd-wb"] {
            let r = runs
                .iter()
                .find(|r| r["workload"] == w && r["config"] == config)
                .unwrap_or_else(|| panic!("no {w} {config} run in {v}"));
            assert!(r["iops"].as_f64().unwrap() > 0.0, "{w} {config}: {r}");
            assert!(r["lat_p99_us"].as_f64().unwrap() > 0.0, "{w} {config}: {r}");
            // Only tiercache's own runs have server counters.
            assert_eq!(r["hit_ratio"].is_null(), config != "cached", "{w} {config}");
        }
        let x = &v["spec_targets"]["ceph"][w];
        assert!(
            x["cached"]["iops_vs_baseline"].as_f64().unwrap() > 0.0,
            "{x}"
        );
        assert!(x["cached_vs_librbd_wb"].as_f64().unwrap() > 0.0, "{x}");
    }
    let cached = |w: &str| {
        runs.iter()
            .find(|r| r["workload"] == w && r["config"] == "cached")
            .unwrap()
    };
    // Warmed over the working set: every 4K random read hits; random writes leave dirty data.
    assert!(cached("randread-4k")["hit_ratio"].as_f64().unwrap() > 0.99);
    assert!(cached("randwrite-4k")["dirty_pct"].as_f64().unwrap() > 0.0);
    let md = std::fs::read_to_string(format!("{out}/report.md")).unwrap();
    assert!(
        md.contains("## On Ceph") && md.contains("librbd-wb"),
        "{md}"
    );
    assert!(std::path::Path::new(&format!("{out}/report.html")).is_file());
    let left = c.rbd(&["ls", "rbd"]);
    assert!(
        !left.contains("tc-bench-"),
        "the bench left images behind: {left}"
    );
}

/// The start of the unresponsive-cluster tests: a cluster of the test's own (`name`), a 64 MiB
/// image, a daemon with a 64 MiB `wb` cache (cleaning `nop`) and the image as core 0, export
/// `vm`, with `--io-timeout 2s`.
struct StallSetup {
    c: ceph::Cluster,
    img: String,
    spec: String,
    conf: String,
    d: Dir,
    cache: String,
    dm: Daemon,
}

impl StallSetup {
    fn start(name: &str) -> StallSetup {
        let c = ceph::Cluster::start(name, &[]);
        let img = ceph::image_name(name);
        c.create_image(&img, 64);
        let spec = format!("rbd/{img}");
        let conf = c.conf.display().to_string();
        let d = Dir::new(&format!("ceph-{name}"));
        let cache = d.sparse("cache.img", 64 << 20);
        let dm = Daemon::start(Opts::new(&d).ready_within(Duration::from_secs(90)));
        dm.json(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
        dm.json(&[
            "set-param",
            "--cache-id",
            "1",
            "cleaning",
            "--policy",
            "nop",
        ]);
        dm.json(&[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            &format!("rbd:{spec}"),
            "--ceph-conf",
            &conf,
            "--export",
            "vm",
            "--io-timeout",
            "2s",
        ]);
        StallSetup {
            c,
            img,
            spec,
            conf,
            d,
            cache,
            dm,
        }
    }
}

/// What the unresponsive-cluster tests write to 4 KiB block `b` in round `v`.
fn stall_block(b: u64, v: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (b.wrapping_mul(31) ^ v.wrapping_mul(131) ^ i) as u8)
        .collect()
}

/// Stops (SIGSTOP) or resumes (SIGCONT) the OSDs of a cluster; resumes them when dropped, so
/// a failing test leaves no stopped process behind.
struct Stalled<'a>(&'a ceph::Cluster, Vec<String>);

impl<'a> Stalled<'a> {
    fn start(c: &'a ceph::Cluster) -> Stalled<'a> {
        let pids: Vec<String> = std::fs::read_to_string(c.dir.join("pids"))
            .expect("the script's pid list")
            .lines()
            .filter_map(|l| l.strip_prefix("osd."))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect();
        assert!(!pids.is_empty(), "the cluster has OSDs");
        for p in &pids {
            run_ok(Command::new("kill").args(["-STOP", p]));
        }
        // kill(2) returns once the signal is queued; every thread of the OSD stops when it
        // next runs, which on a loaded machine can be after the test's next request reached
        // it. Wait until all of them are stopped (state T in /proc).
        let t = Instant::now();
        for p in &pids {
            while !all_threads_stopped(p) {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "OSD {p} is not stopped 30 s after SIGSTOP"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Stalled(c, pids)
    }
}

/// Whether every thread of process `pid` is stopped (or gone).
fn all_threads_stopped(pid: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        // The state follows the command name in parentheses, which may itself hold spaces.
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |st| {
            st.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}

impl Drop for Stalled<'_> {
    fn drop(&mut self) {
        for p in &self.1 {
            let _ = Command::new("kill").args(["-CONT", p]).status();
        }
        let _ = self.0;
    }
}

/// An unresponsive cluster (its OSD stopped with SIGSTOP), SPEC R3: with `--io-timeout 2s`
/// on the RBD core, a read the cache cannot serve (data written back and invalidated before)
/// fails with EIO after about 2 s instead of hanging; writes to the `wb` cache are still absorbed and flushed (to the cache device);
/// cached data reads back; the daemon answers `list` and `stats`, which shows the core's
/// problem. Once the OSD runs again, reads of the core work, writeback drains everything, and
/// `rbd export` holds exactly what was written. The cluster is the test's own (stopping the
/// shared one's OSD would stall the other tests).
#[test]
fn an_unresponsive_cluster_times_out_and_the_daemon_stays_up() {
    const TEST: &str = "an_unresponsive_cluster_times_out_and_the_daemon_stays_up";
    if !ceph::installed(TEST) {
        return;
    }
    let StallSetup { c, spec, d, dm, .. } = StallSetup::start("stall");
    let vm = dm.nbd("vm").unwrap();
    for b in 0..64 {
        vm.write(b * 8, &stall_block(b, 1), false).unwrap();
    }
    vm.flush().unwrap();
    // Written back and dropped from the cache: blocks 0..64 are on the image only (a read of
    // a block never written would not reach an OSD: librbd's object map knows it is zeros).
    dm.json(&["writeback", "--cache-id", "1"]);
    let inv = dm.json(&["invalidate", "--cache-id", "1", "--core-id", "0", "--force"]);
    assert_eq!(inv["dirty_bytes_dropped"], 0, "written back before: {inv}");

    let stall = Stalled::start(&c);
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let r = vm.read(10 * 8, &mut buf);
    if r.is_ok() {
        let what = if buf == stall_block(10, 1) {
            "the data written"
        } else if buf.iter().all(|&b| b == 0) {
            "zeros"
        } else {
            "other data"
        };
        let s = dm.json(&["stats", "--cache-id", "1"]);
        panic!(
            "a read of the stalled core succeeded after {:?} with {what}; invalidate said {inv}; stats: {s}",
            t.elapsed()
        );
    }
    let e = r.expect_err("a read of the stalled core fails");
    let took = t.elapsed();
    assert!(e.to_string().contains("EIO"), "{e}");
    assert!(
        took >= Duration::from_millis(1600) && took < Duration::from_secs(15),
        "the read failed after {took:?}; the timeout is 2 s"
    );
    for b in 64..128 {
        vm.write(b * 8, &stall_block(b, 2), false)
            .expect("a wb write is absorbed while the core stalls");
    }
    vm.flush()
        .expect("a flush in wb reaches the cache device only");
    for b in 64..128 {
        vm.read(b * 8, &mut buf).expect("a cached block reads");
        assert!(buf == stall_block(b, 2), "block {b}");
    }
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["cores"][0]["export"], "vm", "{l}");
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let problems = s["health"]["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let p = problems
        .iter()
        .find(|p| p["kind"] == "core_device")
        .unwrap_or_else(|| panic!("a core_device problem while the core stalls: {s}"));
    println!("while the OSD is stopped: read failed after {took:?}; stats: {p}");
    // A new connection while the cluster stalls: the image's size (a grown image is picked up
    // by the next connection) is asked of librbd on a thread of its own and waited for at most
    // the core's IO timeout, so neither the connection nor the registry hangs with it.
    let t = Instant::now();
    let vm2 = dm
        .nbd("vm")
        .expect("a new connection while the core stalls");
    let took2 = t.elapsed();
    assert!(took2 < Duration::from_secs(15), "connecting took {took2:?}");
    drop(vm2);
    dm.json(&["list"]);
    println!("a new connection while the OSD is stopped took {took2:?}");

    drop(stall);
    // The late read is done with by now or soon; reads of the core work again.
    let t = Instant::now();
    loop {
        match vm.read(10 * 8, &mut buf) {
            Ok(()) => break,
            Err(e) if t.elapsed() < Duration::from_secs(60) => {
                println!("after SIGCONT: {e}; again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the core still fails 60 s after the OSD resumed: {e}"),
        }
    }
    assert!(buf == stall_block(10, 1), "block 10 from the image");
    drop(vm);
    // SPEC C22 on RBD: the image grows (another client resizes it; librbd proxies that to us,
    // the lock holder) and the next connection sees the new size and can write at its end.
    c.rbd(&["resize", "--size", "96M", &spec]);
    let vm = dm.nbd("vm").unwrap();
    assert_eq!(vm.blocks(), 96 << 11, "the new connection's size");
    let last = (96 << 11) - 8;
    vm.write(last, &stall_block(999, 3), true).unwrap();
    vm.read(last, &mut buf).unwrap();
    assert!(buf == stall_block(999, 3), "the grown image's last block");
    drop(vm);
    dm.json(&["writeback", "--cache-id", "1"]);
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_lines_kept"], 0, "{v}");
    let out = d.path("export.img");
    c.rbd(&["export", "--no-progress", &spec, &out]);
    let got = read_file(&out);
    for b in 0..128u64 {
        let want = stall_block(b, if b < 64 { 1 } else { 2 });
        assert!(
            got[b as usize * 4096..][..4096] == want[..],
            "rbd export: block {b} is not what was written"
        );
    }
    assert_eq!(got.len(), 96 << 20, "rbd export of the grown image");
    assert!(got[128 * 4096..(96 << 20) - 4096].iter().all(|&x| x == 0));
    assert!(
        got[(96 << 20) - 4096..] == stall_block(999, 3)[..],
        "the grown image's last block"
    );
    dm.shutdown();
    c.stop();
}

/// SIGTERM while the cluster is unresponsive (its OSD stopped with SIGSTOP) and a read of the
/// image is stuck in librbd: the daemon still stops, within a bound, and keeps the `wb` cache's
/// dirty data on the cache device (a stop never needs the core). After the OSD resumes, a
/// daemon started from a config file brings the cache back with that data, which then writes
/// back and reads back through `rbd export`.
#[test]
fn sigterm_while_the_cluster_is_unresponsive_stops_and_keeps_dirty_data() {
    const TEST: &str = "sigterm_while_the_cluster_is_unresponsive_stops_and_keeps_dirty_data";
    if !ceph::installed(TEST) {
        return;
    }
    let StallSetup {
        c,
        img,
        spec,
        conf,
        d,
        cache,
        dm,
    } = StallSetup::start("term");
    let vm = dm.nbd("vm").unwrap();
    // Blocks 0..32 on the image only (written back, then dropped from the cache).
    for b in 0..32 {
        vm.write(b * 8, &stall_block(b, 1), false).unwrap();
    }
    vm.flush().unwrap();
    dm.json(&["writeback", "--cache-id", "1"]);
    dm.json(&["invalidate", "--cache-id", "1", "--core-id", "0", "--force"]);
    // Blocks 32..96 dirty in the cache (cleaning is nop), flushed.
    for b in 32..96 {
        vm.write(b * 8, &stall_block(b, 2), false).unwrap();
    }
    vm.flush().unwrap();

    let stall = Stalled::start(&c);
    let mut buf = vec![0u8; 4096];
    let e = vm
        .read(5 * 8, &mut buf)
        .expect_err("a read of the stalled core fails");
    assert!(e.to_string().contains("EIO"), "{e}");
    drop(vm);
    let t = Instant::now();
    dm.stop();
    let took = t.elapsed();
    println!("SIGTERM with the OSD stopped and a librbd read stuck: the daemon ended in {took:?}");
    assert!(
        took < Duration::from_secs(30),
        "the daemon took {took:?} to stop"
    );
    assert!(
        dm_log_has(&d, "dirty marker not updated"),
        "the stop says the marker could not be updated"
    );
    drop(stall);
    // The marker set while the cache ran stays: the image still has dirty data in the cache.
    let marker = c.image_meta(&img, "tiercache.dirty");
    assert!(
        marker
            .as_deref()
            .is_some_and(|m| m.starts_with("dirty in tiercache")),
        "the image's dirty marker after the stop: {marker:?}"
    );

    // Back, from a config file, with the dirty data it kept.
    let cfg = rbd_config(&d, &cache, &spec, &conf, "vm");
    let dm = start_from(&d, &cfg);
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}\n{}", dm.log());
    let s = dm.json(&["stats", "--cache-id", "1"]);
    println!("after the restart: {}", s["usage"]);
    let vm = dm.nbd("vm").unwrap();
    for b in 0..96u64 {
        vm.read(b * 8, &mut buf).unwrap();
        assert!(
            buf == stall_block(b, if b < 32 { 1 } else { 2 }),
            "block {b} after the restart"
        );
    }
    drop(vm);
    dm.json(&["writeback", "--cache-id", "1"]);
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_lines_kept"], 0, "{v}");
    let out = d.path("export.img");
    c.rbd(&["export", "--no-progress", &spec, &out]);
    let got = read_file(&out);
    for b in 0..96u64 {
        assert!(
            got[b as usize * 4096..][..4096] == stall_block(b, if b < 32 { 1 } else { 2 })[..],
            "rbd export: block {b}"
        );
    }
    dm.shutdown();
    c.stop();
}

/// Whether the daemon log in `d` has a line containing `what`.
fn dm_log_has(d: &Dir, what: &str) -> bool {
    std::fs::read_to_string(d.path("daemon.log")).is_ok_and(|l| l.contains(what))
}

/// Issue 25 item 1 on a real cluster: an RBD image is its pool id and image id, so the image a
/// cache holds is refused under another spelling — another config file naming the same cluster,
/// as a `conf=` option or `--ceph-conf` — into the same cache or another, naming the holder.
#[test]
fn the_same_rbd_image_spelled_two_ways_is_refused() {
    let Some(c) = ceph::shared("the_same_rbd_image_spelled_two_ways_is_refused") else {
        return;
    };
    let img = ceph::image_name("ident");
    c.create_image(&img, 64);
    let d = Dir::new("ceph-ident");
    // A copy of the cluster's config: another file, the same cluster (fsid).
    let conf2 = d.path("other.conf");
    std::fs::copy(&c.conf, &conf2).unwrap();
    let dm = Daemon::start(Opts::new(&d).ready_within(Duration::from_secs(90)));
    dm.ok(&["start-cache", "--cache-device", "ram:64m"]);
    let held = c.device(&img);
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &held]);
    dm.ok(&[
        "start-cache",
        "--cache-device",
        "ram:64m",
        "--cache-id",
        "2",
    ]);
    let before = dm.json(&["list"]);
    let want = format!("is the same device as core 0 of cache 1 ({held})");
    let other = format!("rbd:rbd/{img}:conf={conf2}");
    for cache in ["1", "2"] {
        dm.fails(
            &["add-core", "--cache-id", cache, "--core-device", &other],
            &want,
        );
    }
    let bare = format!("rbd:rbd/{img}");
    let flag = ["--core-device", &bare, "--ceph-conf", &conf2];
    dm.fails(
        &[&["add-core", "--cache-id", "2"][..], &flag].concat(),
        &want,
    );
    assert_eq!(dm.json(&["list"]), before, "nothing changed");
    dm.shutdown();
}
