//! Real block devices (loop devices over files) as cache and core devices, and SPEC C18's
//! refusals: a device that is mounted, or opened exclusively (`O_EXCL`) by another program, is
//! refused as a core and as a cache device — even with `--force` — in one line, and accepted
//! once it is free. A loop device's identity is its backing file's, so the core it was
//! attached as comes back at `--load`.
//!
//! Needs root and the loop driver (`losetup`) and `mkfs.ext4`; says it skipped otherwise. Every
//! loop device and mount it makes is undone at the end, pass or fail.

mod common;

use common::{Daemon, Dir, Loop, Opts, loop_devices_work};
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use tiercache_io::{Backend, NbdBackend};

/// Whether this machine can make loop devices and file systems here; a skip line if not.
fn can_loop(d: &Dir) -> bool {
    let mkfs = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !mkfs {
        println!("skipped: needs mkfs.ext4");
        return false;
    }
    loop_devices_work(d)
}

#[test]
fn mounted_or_exclusively_open_devices_are_refused_loop_devices_work() {
    let d = Dir::new("blockdev");
    if !can_loop(&d) {
        return;
    }
    let cache = Loop::attach(&d.sparse("cache.img", 64 << 20)).expect("loop");
    let mut core = Loop::attach(&d.sparse("core.img", 128 << 20)).expect("loop");
    let dm = Daemon::start(Opts::new(&d));

    // Mounted: refused as a core and, even with --force, as a cache device.
    core.mount(&d.path("mnt"));
    dm.fails(
        &["start-cache", "--cache-device", &core.dev, "--force"],
        "mounted or opened exclusively",
    );
    dm.ok(&["start-cache", "--cache-device", &cache.dev, "--mode", "wb"]);
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &core.dev],
        "mounted or opened exclusively",
    );
    core.umount();

    // Opened with O_EXCL by another program (here: this test): refused the same way.
    let excl = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&core.dev)
        .expect("O_EXCL open of the loop device");
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &core.dev],
        "mounted or opened exclusively",
    );
    drop(excl);

    // Free: attached, served, and its identity is the backing file's.
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &core.dev,
        "--export",
        "vm",
    ]);
    assert_eq!(v["core_id"], 0, "{v}");
    let uri = format!("nbd+unix:///vm?socket={}", d.path("nbd.sock"));
    let e = NbdBackend::connect(&uri).expect("export served");
    assert_eq!(e.blocks(), (128 << 20) / 512);
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    e.write(2048, &data, false).unwrap();
    e.flush().unwrap();
    drop(e);
    dm.ok(&["stop-cache", "--cache-id", "1"]);
    // Written back to the core device: its backing file holds the data.
    let raw = std::fs::read(d.path("core.img")).unwrap();
    assert_eq!(&raw[2048 * 512..2048 * 512 + data.len()], &data[..]);

    // --load brings the core back on the same loop device (identity: the backing file).
    let v = dm.json(&["start-cache", "--cache-device", &cache.dev, "--load"]);
    assert_eq!(v["state"], "running", "{v}");
    let e = NbdBackend::connect(&uri).expect("export served after --load");
    let mut back = vec![0u8; data.len()];
    e.read(2048, &mut back).unwrap();
    assert_eq!(back, data);
    drop(e);
    dm.ok(&["stop-cache", "--cache-id", "1"]);
    dm.shutdown();
}
