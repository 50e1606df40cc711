//! Issue 26 item 4: the cache under a live BlueStore OSD survives its daemon.
//!
//! A `tiercache daemon` process (its config file: a `wb` cache on a 256 MiB file, cleaning
//! `nop` so that what the OSD writes stays dirty, over an emulated 10k RPM SAS HDD core on a
//! 4 GiB sparse file, one export) serves the data device of one OSD (`ceph-cluster.sh start
//! --osds 0`, then `add-osd` with the data on the export, attached with nbdfuse — or
//! nbd-client where /dev/nbd0 exists — and DB/WAL on a plain file), in a pool of size 1 with a
//! 64 MiB RBD image:
//!
//! 1. fio's rbd engine writes region A (the first 16 MiB) with `verify=crc32c`, every 4 KiB
//!    block once in random order; the image is exported (`rbd export`) as the reference;
//! 2. a second fio writes random 4 KiB blocks to region B (16-48 MiB) and, 3 s in, the daemon
//!    is SIGKILLed: what the OSD and the load did is printed (the OSD aborts on the IO error,
//!    as on a dead disk; a stalled OSD is stopped);
//! 3. the OSD is stopped, the attach undone, the daemon started again from the same config (its
//!    log must say the cache came back running with dirty lines), the export attached again,
//!    `ceph-bluestore-tool fsck` must pass, the OSD starts, and the image is exported again:
//!    every 4 KiB block outside region B equals the reference, and fio's verify pass
//!    (`verify_only=1`, same seed and offsets, on the exported copy) accepts region A;
//! 4. the clean variant: region C (48-64 MiB) is written the same way, the image exported as
//!    the new reference, `stop-cache` under the OSD writes the dirty data back, then the OSD is
//!    stopped, `start-cache --load` brings the cache back (a clean stop, nothing dirty), the
//!    export is attached again, fsck passes, the OSD starts, and the whole image equals the
//!    reference (fio's verify accepts regions A and C).
//!
//! fio's own verify phase does not read anything with its rbd engine (fio 3.33: `verify_only`
//! and `do_verify=1` both finish without a read, and accept a region never written), so the
//! verify pass runs with fio's file engine on the `rbd export` copy; that it does check is
//! shown on region C before it is written (it must fail there).
//!
//! Skipped, with a printed reason, when ceph-osd, fio (with its rbd engine),
//! ceph-bluestore-tool, or both nbdfuse and /dev/nbd0 are missing. Every process it starts (the
//! daemon, nbdfuse, fio, the cluster's) is stopped by a guard, on failure paths too, and no
//! mount is left.

#[path = "../../io/tests/common/ceph.rs"]
mod ceph;
mod common;
#[allow(dead_code)]
#[path = "../src/nbd_attach.rs"]
mod nbd_attach;

use ceph::{Cluster, script};
use common::{Daemon, Dir, Opts, cache_config, sparse};
use nbd_attach::{
    Attach, choose_attach, find_prog, free_nbd_dev, mounted, nbd_client_attach, nbd_client_detach,
    nbdfuse_args, unmount_fuse, wait_fuse_file,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const IMAGE: u64 = 64 * MIB;
const CORE_BYTES: u64 = 4 << 30;
const CACHE_BYTES: u64 = 256 * MIB;
const BLOCK: usize = 4096;
/// Region A (written before the kill), B (the load at the kill), C (before the stop-cache).
const A: (u64, u64) = (0, 16 * MIB);
const B: (u64, u64) = (16 * MIB, 48 * MIB);
const C: (u64, u64) = (48 * MIB, 64 * MIB);
const POOL: &str = "kill";
const EXPORT: &str = "osd0";

/// A child process of the test, killed (SIGKILL) and reaped when dropped.
struct Proc(Option<Child>);

impl Proc {
    fn running(&mut self) -> bool {
        self.0
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGTERM, up to `secs` for it to end, then SIGKILL; reaped.
    fn stop(&mut self, secs: u64) {
        let Some(mut c) = self.0.take() else { return };
        // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while c.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The export attached as the OSD's data device; detached when dropped.
struct Attached {
    how: Attach,
    /// The FUSE file, or `/dev/nbdX` (the same path at every attach: the OSD records it).
    data: PathBuf,
    nbdfuse: Proc,
    attached: bool,
}

impl Attached {
    fn new(how: Attach, d: &Dir) -> Attached {
        let data = match &how {
            Attach::Nbdfuse(_) => PathBuf::from(d.path("mnt/data")),
            Attach::NbdClient(_) => free_nbd_dev(&[]).expect("a free /dev/nbdX"),
        };
        Attached {
            how,
            data,
            nbdfuse: Proc(None),
            attached: false,
        }
    }

    fn attach(&mut self, d: &Dir, sock: &Path) {
        match &self.how {
            Attach::Nbdfuse(prog) => {
                let mnt = self.data.parent().unwrap();
                std::fs::create_dir_all(mnt).unwrap();
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(d.path("nbdfuse.log"))
                    .unwrap();
                let child = Command::new(prog)
                    .args(nbdfuse_args(&self.data, EXPORT, sock))
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .expect("spawn nbdfuse");
                self.nbdfuse = Proc(Some(child));
                self.attached = true;
                let nbdfuse = &mut self.nbdfuse;
                wait_fuse_file(&self.data, CORE_BYTES, &mut || {
                    if nbdfuse.running() {
                        Ok(())
                    } else {
                        Err("nbdfuse exited".into())
                    }
                })
                .unwrap_or_else(|e| panic!("{e}: {}", read(&d.path("nbdfuse.log"))));
            }
            Attach::NbdClient(prog) => {
                nbd_client_attach(prog, EXPORT, sock, &self.data).unwrap();
                self.attached = true;
            }
        }
    }

    /// Undone: nbdfuse stopped (it unmounts at SIGTERM; a lazy unmount otherwise), or the nbd
    /// device disconnected.
    fn detach(&mut self) {
        if !std::mem::take(&mut self.attached) {
            return;
        }
        match &self.how {
            Attach::Nbdfuse(_) => {
                self.nbdfuse.stop(5);
                unmount_fuse(self.data.parent().unwrap());
            }
            Attach::NbdClient(prog) => nbd_client_detach(prog, &self.data),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.detach();
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `ceph-cluster.sh VERB DIR ARGS`, which must succeed; its stdout.
fn cluster_sh(c: &Cluster, verb: &str, args: &[&str]) -> String {
    let o = Command::new(script())
        .arg(verb)
        .arg(&c.dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "ceph-cluster.sh {verb} {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Whether the last `osd.ID` process the script started runs.
fn osd_running(c: &Cluster, id: &str) -> bool {
    let name = format!("osd.{id} ");
    cluster_sh(c, "status", &[])
        .lines()
        .rfind(|l| l.starts_with(&name))
        .is_some_and(|l| l.ends_with("running"))
}

fn ceph_ok(c: &Cluster, tool: &str, args: &[&str]) -> String {
    let o = c.cli(tool, args);
    assert!(
        o.status.success(),
        "{tool} {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The job both fio runs share: random 4 KiB writes over `(from, to)`, each block once, with
/// crc32c verify headers, seed `seed`.
fn fio_job(region: (u64, u64), seed: u64) -> Vec<String> {
    vec![
        "--bs=4k".into(),
        "--rw=randwrite".into(),
        format!("--offset={}", region.0),
        format!("--size={}", region.1 - region.0),
        "--verify=crc32c".into(),
        format!("--randseed={seed}"),
    ]
}

/// fio's rbd engine writing `fio_job` on the image at QD 16, without its verify phase
/// (`extra`: more options).
fn fio_rbd(c: &Cluster, region: (u64, u64), seed: u64, extra: &[&str]) -> Command {
    let mut f = Command::new("fio");
    f.env("CEPH_CONF", &c.conf)
        .args(["--name=w", "--ioengine=rbd", "--clientname=admin"])
        .arg(format!("--pool={POOL}"))
        .args(["--rbdname=img", "--iodepth=16", "--do_verify=0"])
        .args(fio_job(region, seed))
        .args(extra)
        .stdin(Stdio::null());
    f
}

/// fio's verify pass of the same job (`verify_only=1`) with its file engine on an exported
/// copy: (passed, its output).
fn fio_verify(file: &str, region: (u64, u64), seed: u64) -> (bool, String) {
    let o = Command::new("fio")
        .args(["--name=v", "--verify_only=1"])
        .arg(format!("--filename={file}"))
        .args(fio_job(region, seed))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // Every block read: fio's read line gives the bytes ("(16.0MiB/13msec)").
    let read_all = out.contains(&format!(
        "({:.1}MiB/",
        (region.1 - region.0) as f64 / MIB as f64
    ));
    (
        o.status.success() && !out.contains("verify:") && read_all,
        out,
    )
}

/// fio (`fio_rbd`) writes `region` with `seed`; then the image is exported into `file`: its
/// bytes.
fn write_and_export(c: &Cluster, region: (u64, u64), seed: u64, file: &str) -> Vec<u8> {
    let o = fio_rbd(c, region, seed, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fio: {err}");
    export(c, file)
}

/// `rbd export` of the image into `file`; its bytes.
fn export(c: &Cluster, file: &str) -> Vec<u8> {
    let _ = std::fs::remove_file(file);
    ceph_ok(c, "rbd", &["export", &format!("{POOL}/img"), file]);
    let v = std::fs::read(file).unwrap();
    assert_eq!(v.len() as u64, IMAGE);
    v
}

/// The 4 KiB blocks of `got` that differ from `want` in `regions`: (blocks compared, the byte
/// offsets of those that differ).
fn differing(want: &[u8], got: &[u8], regions: &[(u64, u64)]) -> (usize, Vec<u64>) {
    let mut n = 0;
    let mut bad = Vec::new();
    for &(from, to) in regions {
        for off in (from as usize..to as usize).step_by(BLOCK) {
            n += 1;
            if want[off..off + BLOCK] != got[off..off + BLOCK] {
                bad.push(off as u64);
            }
        }
    }
    (n, bad)
}

/// `ceph-bluestore-tool fsck` on the stopped OSD's directory, which must pass; its output.
fn fsck(c: &Cluster, id: &str) -> String {
    let t = Instant::now();
    let o = Command::new("ceph-bluestore-tool")
        .args(["fsck", "--path"])
        .arg(c.dir.join(format!("osd/ceph-{id}")))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        o.status.success() && out.contains("fsck success"),
        "fsck failed ({}): {out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    println!("fsck: {out} ({:.1} s)", t.elapsed().as_secs_f64());
    out
}

/// The cache's dirty bytes (`stats --json`).
fn dirty_bytes(dm: &Daemon) -> u64 {
    dm.json(&["stats", "--cache-id", "1"])["usage"]["dirty_bytes"]
        .as_u64()
        .unwrap()
}

/// The OSD's log from byte `from` on.
fn osd_log(c: &Cluster, id: &str, from: usize) -> String {
    let log = read(
        &c.dir
            .join(format!("log/osd.{id}.log"))
            .display()
            .to_string(),
    );
    log.get(from..).unwrap_or_default().to_string()
}

/// What the OSD logged about its device from byte `from` of its log on: the first error
/// line of its block device (`bdev(...)`, level -1) and the abort it led to, if any.
fn osd_device_errors(c: &Cluster, id: &str, from: usize) -> String {
    let log = osd_log(c, id, from);
    let err = log
        .lines()
        .find(|l| l.contains(" -1 bdev("))
        .map(|l| l.split_once(" -1 ").map_or(l, |x| x.1))
        .unwrap_or("no device error in its log");
    let abort = log
        .lines()
        .find(|l| l.contains("ceph_abort"))
        .map(|l| format!(", then {}", l.trim()))
        .unwrap_or_default();
    format!("{err}{abort}")
}

/// Waits up to `secs` for the OSD to exit; what happened (its device errors logged after
/// byte `from` of its log).
fn watch_osd(c: &Cluster, id: &str, from: usize, secs: u64) -> String {
    let t = Instant::now();
    while osd_running(c, id) && t.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let what = osd_device_errors(c, id, from);
    if osd_running(c, id) {
        format!("still ran {secs} s later: {what}")
    } else {
        format!("exited within {:.1} s: {what}", t.elapsed().as_secs_f64())
    }
}

/// The length of the OSD's log.
fn osd_log_len(c: &Cluster, id: &str) -> usize {
    osd_log(c, id, 0).len()
}

fn stamp(t0: Instant, what: &str) {
    println!("[{:6.1} s] {what}", t0.elapsed().as_secs_f64());
}

#[test]
fn osd_survives_sigkill_and_stop_of_its_cache_daemon() {
    for p in ["ceph-osd", "ceph-mon", "rbd", "ceph-bluestore-tool", "fio"] {
        // (ceph-bluestore-tool has no --version: looked up, not run.)
        if find_prog(p).is_none() {
            println!(
                "skipped: osd_survives_sigkill_and_stop_of_its_cache_daemon: {p} is not installed"
            );
            return;
        }
    }
    let rbd_engine = Command::new("fio")
        .arg("--enghelp=rbd")
        .output()
        .is_ok_and(|o| o.status.success());
    if !rbd_engine {
        println!(
            "skipped: osd_survives_sigkill_and_stop_of_its_cache_daemon: fio has no rbd engine"
        );
        return;
    }
    let how = match choose_attach(Path::new("/dev/nbd0").exists()) {
        Ok(a) => a,
        Err(e) => {
            println!("skipped: osd_survives_sigkill_and_stop_of_its_cache_daemon: {e}");
            return;
        }
    };
    let t0 = Instant::now();
    let d = Dir::new("osd-kill");
    let core = d.path("core.hdd");
    sparse(&core, CORE_BYTES);
    let cache = d.sparse("cache.img", CACHE_BYTES);
    let cfg = cache_config(
        &d,
        &cache,
        "wb",
        &[(0, &format!("emu:hdd-10k-sas:{core}"), EXPORT, "")],
    );
    let mut dm = Daemon::start(Opts::new(&d).config(&cfg));
    let sock = PathBuf::from(&dm.nbd);
    let mut att = Attached::new(how, &d);
    att.attach(&d, &sock);
    stamp(
        t0,
        &format!(
            "daemon up, export attached with {} as {}",
            att.how.name(),
            att.data.display()
        ),
    );
    // Declared after the attach: dropped (its OSD stopped) before the attach is undone.
    let cl = Cluster::start(
        "osd-kill",
        &["--osds", "0", "--set", "osd_client_watch_timeout=10"],
    );
    let data = att.data.display().to_string();
    let db = d.path("osd0.db");
    let id = cluster_sh(
        &cl,
        "add-osd",
        &[
            "--block",
            &data,
            "--db",
            &db,
            "--db-size",
            "2G",
            "--opt",
            "bluestore_default_buffered_read=false",
        ],
    )
    .lines()
    .last()
    .unwrap()
    .trim()
    .to_string();
    ceph_ok(&cl, "ceph", &["osd", "pool", "create", POOL, "8", "8"]);
    ceph_ok(
        &cl,
        "ceph",
        &[
            "osd",
            "pool",
            "set",
            POOL,
            "size",
            "1",
            "--yes-i-really-mean-it",
        ],
    );
    ceph_ok(&cl, "rbd", &["pool", "init", POOL]);
    ceph_ok(
        &cl,
        "rbd",
        &["create", "--size", "64M", &format!("{POOL}/img")],
    );
    stamp(
        t0,
        &format!("osd.{id} up on the export, pool {POOL} (size 1), image {POOL}/img 64 MiB"),
    );

    // 1. Region A, verify headers and all.
    let ref1 = write_and_export(&cl, A, 1, &d.path("ref1.img"));
    let (ok, out) = fio_verify(&d.path("ref1.img"), A, 1);
    assert!(ok, "region A does not verify before the kill: {out}");
    // fio's verify does check: region C, never written, fails it.
    let (ok, out) = fio_verify(&d.path("ref1.img"), C, 2);
    assert!(!ok && out.contains("bad magic header"), "{out}");
    let dirty = dirty_bytes(&dm);
    assert!(dirty > 0);
    stamp(
        t0,
        &format!(
            "region A written by fio (verify=crc32c) and exported; {dirty} bytes dirty in the cache"
        ),
    );

    // 2. The kill under random writes.
    let mut load = Proc(Some(
        fio_rbd(
            &cl,
            B,
            3,
            &[
                "--verify=0",
                "--norandommap",
                "--time_based",
                "--runtime=120",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    ));
    std::thread::sleep(Duration::from_secs(3));
    assert!(load.running(), "the load ended early");
    let dirty_at_kill = dirty_bytes(&dm);
    let mark = osd_log_len(&cl, &id);
    dm.kill();
    stamp(
        t0,
        &format!("daemon SIGKILLed during random writes to region B ({dirty_at_kill} bytes dirty)"),
    );
    let seen = watch_osd(&cl, &id, mark, 15);
    stamp(t0, &format!("the OSD {seen}"));
    stamp(
        t0,
        &format!(
            "the fio load {}",
            if load.running() {
                "is stalled (its writes wait for the OSD): stopped"
            } else {
                "ended"
            }
        ),
    );
    load.stop(5);
    cluster_sh(&cl, "stop-osd", &[&id]);
    att.detach();
    if let Attach::Nbdfuse(_) = att.how {
        assert!(
            !mounted(att.data.parent().unwrap()),
            "the FUSE mount is left"
        );
    }

    // 3. Back from the config.
    let dm2 = Daemon::start(Opts::new(&d).config(&cfg));
    let log = dm2.log();
    let running = log
        .lines()
        .find(|l| l.contains("msg=\"cache running\""))
        .unwrap_or_else(|| panic!("no 'cache running' line: {log}"));
    let n: u64 = running
        .split("dirty_lines=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(n > 0, "the recovered cache has no dirty line: {running}");
    stamp(t0, &format!("daemon restarted from its config: {running}"));
    dm = dm2;
    att.attach(&d, &sock);
    let fsck1 = fsck(&cl, &id);
    cluster_sh(&cl, "start-osd", &[&id]);
    stamp(t0, &format!("fsck: {fsck1}; osd.{id} up again"));
    let got = export(&cl, &d.path("after-kill.img"));
    let (blocks, bad) = differing(&ref1, &got, &[A, C]);
    assert!(
        bad.is_empty(),
        "after the kill, {} of {blocks} blocks differ, first at {:?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
    let (ok, out) = fio_verify(&d.path("after-kill.img"), A, 1);
    assert!(ok, "region A does not verify after the kill: {out}");
    stamp(
        t0,
        &format!(
            "after the kill: {blocks} of {blocks} blocks of regions A and C equal the export before it; fio verify of region A passes"
        ),
    );

    // 4. The clean variant: stop-cache with dirty data under the OSD.
    let ref2 = write_and_export(&cl, C, 2, &d.path("ref2.img"));
    let dirty = dirty_bytes(&dm);
    assert!(dirty > 0);
    let t = Instant::now();
    let mark = osd_log_len(&cl, &id);
    let stop = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(stop["dirty_lines_kept"], 0, "{stop}");
    stamp(
        t0,
        &format!(
            "region C written and exported; stop-cache with {dirty} bytes dirty wrote them back in {:.1} s: {stop}",
            t.elapsed().as_secs_f64()
        ),
    );
    let seen = watch_osd(&cl, &id, mark, 3);
    stamp(t0, &format!("the OSD (idle) {seen}"));
    cluster_sh(&cl, "stop-osd", &[&id]);
    stamp(
        t0,
        &format!(
            "the OSD stopped (SIGTERM): {}",
            osd_device_errors(&cl, &id, mark)
        ),
    );
    att.detach();
    let load = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(load["state"], "running", "{load}");
    assert_eq!(load["loaded"]["clean_stop"], true, "{load}");
    assert_eq!(load["loaded"]["dirty_lines"], 0, "{load}");
    stamp(t0, &format!("start-cache --load: {}", load["loaded"]));
    att.attach(&d, &sock);
    let fsck2 = fsck(&cl, &id);
    cluster_sh(&cl, "start-osd", &[&id]);
    let got = export(&cl, &d.path("after-stop.img"));
    let (blocks, bad) = differing(&ref2, &got, &[(0, IMAGE)]);
    assert!(
        bad.is_empty(),
        "after stop-cache, {} of {blocks} blocks differ, first at {:?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
    for (r, seed) in [(A, 1), (C, 2)] {
        let (ok, out) = fio_verify(&d.path("after-stop.img"), r, seed);
        assert!(ok, "region {r:?} does not verify after stop-cache: {out}");
    }
    stamp(
        t0,
        &format!(
            "fsck: {fsck2}; osd.{id} up; {blocks} of {blocks} blocks equal the export before stop-cache; fio verify of regions A and C passes"
        ),
    );

    // Everything down, in order: the OSD and the cluster, the attach, the daemon.
    drop(cl);
    att.detach();
    if let Attach::Nbdfuse(_) = att.how {
        assert!(
            !mounted(att.data.parent().unwrap()),
            "the FUSE mount is left"
        );
    }
    dm.shutdown();
    stamp(t0, "cluster stopped, export detached, daemon shut down");
}
