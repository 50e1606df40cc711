//! One device, one owner inside one daemon (SPEC C18, issue 25): `start-cache`, `add-core` and
//! the config file's reassembly refuse a device this daemon already holds as a cache device or
//! a core under another spelling — a symlink, `./`, `..`, an `emu:` wrapper, a loop device over
//! the file, another spelling of an `nbd:` URI — in one line naming the holder, and nothing
//! changes (the list of caches, the refused file's bytes). `ram:` devices are anonymous: two
//! `ram:64m` caches are two caches. The real `tiercache` binary, one daemon per test.
//!
//! A partition against its whole disk runs where the loop driver makes partitions (this
//! sandbox's does not: it prints that it skipped); the unit tests of `daemon/src/identity.rs`
//! check partitions and device-mapper devices with a fake sysfs. The same RBD image under two
//! spellings runs on a real cluster in `cli/tests/ceph.rs`.

mod common;

use common::{Daemon, Dir, Loop, Opts, cache_config, loop_devices_work};
use serde_json::Value;

/// A daemon with cache 1 on `ram:64m` and `DIR/core.img` (64 MiB) attached as core 0 by the
/// device string `core` makes from its path.
fn with_core(d: &Dir, core: impl Fn(&str) -> String) -> (Daemon, String) {
    let path = d.sparse("core.img", 64 << 20);
    let dm = Daemon::start(Opts::new(d));
    dm.ok(&["start-cache", "--cache-device", "ram:64m"]);
    let shown = core(&path);
    let v = dm.json(&["add-core", "--cache-id", "1", "--core-device", &shown]);
    assert_eq!(v["core_id"], 0, "{v}");
    (dm, shown)
}

/// Starts cache 2 on `ram:64m`; the caches listed then (to compare after refusals).
fn second_cache(dm: &Daemon) -> Value {
    dm.ok(&[
        "start-cache",
        "--cache-device",
        "ram:64m",
        "--cache-id",
        "2",
    ]);
    dm.json(&["list"])
}

/// `add-core DEVICE` to cache 1, and to a second cache, is refused naming core 0 of cache 1
/// (`held`, as it was given); the caches listed are unchanged.
fn refused_as_core_0(dm: &Daemon, device: &str, held: &str) {
    let before = second_cache(dm);
    let want = format!("{device} is the same device as core 0 of cache 1 ({held})");
    for cache in ["1", "2"] {
        dm.fails(
            &["add-core", "--cache-id", cache, "--core-device", device],
            &want,
        );
    }
    assert_eq!(dm.json(&["list"]), before, "nothing changed");
}

#[test]
fn a_symlink_to_a_core_is_refused() {
    let d = Dir::new("ident-symlink");
    let (dm, core) = with_core(&d, str::to_string);
    let link = d.path("link.img");
    std::os::unix::fs::symlink(&core, &link).unwrap();
    refused_as_core_0(&dm, &link, &core);
    dm.shutdown();
}

#[test]
fn a_dot_path_to_a_core_is_refused() {
    let d = Dir::new("ident-dot");
    let (dm, core) = with_core(&d, str::to_string);
    refused_as_core_0(&dm, &d.path("./core.img"), &core);
    dm.shutdown();
}

#[test]
fn a_dotdot_path_to_a_core_is_refused() {
    let d = Dir::new("ident-dotdot");
    std::fs::create_dir(d.path("sub")).unwrap();
    let (dm, core) = with_core(&d, str::to_string);
    refused_as_core_0(&dm, &d.path("sub/../core.img"), &core);
    dm.shutdown();
}

/// The case: the file is a core through `emu:`; the bare path is refused as a core
/// and as a cache device, even with `--force`, and the file is not formatted or written.
#[test]
fn the_file_under_an_emu_core_is_refused_and_left_alone() {
    let d = Dir::new("ident-emu");
    let (dm, core) = with_core(&d, |p| format!("emu:hdd-10k-sas:{p}"));
    let path = d.path("core.img");
    refused_as_core_0(&dm, &path, &core);
    let bytes = std::fs::read(&path).unwrap();
    dm.fails(
        &["start-cache", "--cache-device", &path, "--force"],
        &format!("{path} is the same device as core 0 of cache 1 ({core})"),
    );
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "the core file was written"
    );
    dm.shutdown();
}

/// A cache device is never a core: of its own cache or another's.
#[test]
fn the_cache_device_cannot_be_a_core() {
    let d = Dir::new("ident-cache");
    let cache = d.sparse("cache.img", 32 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache]);
    let before = second_cache(&dm);
    let dot = d.path("./cache.img");
    for id in ["1", "2"] {
        dm.fails(
            &["add-core", "--cache-id", id, "--core-device", &dot],
            &format!("{dot} is the same device as the cache device of cache 1 ({cache})"),
        );
        dm.fails(
            &["add-core", "--cache-id", id, "--core-device", &cache],
            &format!("{cache} is already cache 1"),
        );
    }
    dm.fails(
        &["start-cache", "--cache-device", &dot, "--force"],
        "is the same device as the cache device of cache 1",
    );
    assert_eq!(dm.json(&["list"]), before, "nothing changed");
    dm.shutdown();
}

/// A loop device over a core's file is that file.
#[test]
fn a_loop_device_over_a_core_is_refused() {
    let d = Dir::new("ident-loop");
    if !loop_devices_work(&d) {
        return;
    }
    let (dm, core) = with_core(&d, str::to_string);
    let lo = Loop::attach(&core).expect("loop");
    refused_as_core_0(&dm, &lo.dev, &core);
    dm.shutdown();
}

/// A partition is part of its whole disk: with the disk (a loop device over a partitioned
/// file) held as core 0, its partition is refused, and with a partition held, the disk is;
/// the other partition of the same disk is another device and is accepted.
#[test]
fn a_partition_and_its_disk_overlap() {
    let d = Dir::new("ident-part");
    if !loop_devices_work(&d) || !common::have("parted") {
        println!("skipped: needs loop devices and parted");
        return;
    }
    let img = d.sparse("disk.img", 64 << 20);
    let parted = std::process::Command::new("parted")
        .args(["-s", &img, "mklabel", "gpt"])
        .args([
            "mkpart", "a", "1MiB", "30MiB", "mkpart", "b", "30MiB", "60MiB",
        ])
        .status()
        .unwrap();
    assert!(parted.success(), "parted");
    let Some((lo, [p1, p2])) = Loop::attach_partitioned(&img) else {
        println!("skipped: the loop driver made no partitions here (max_part=0?)");
        return;
    };
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", "ram:64m"]);
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &lo.dev]);
    let before = dm.json(&["list"]);
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &p1],
        &format!("{p1} is part of core 0 of cache 1 ({})", lo.dev),
    );
    assert_eq!(dm.json(&["list"]), before, "nothing changed");
    dm.ok(&["remove-core", "--cache-id", "1", "--core-id", "0"]);
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &p1]);
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &lo.dev],
        &format!("{} contains core 0 of cache 1 ({p1})", lo.dev),
    );
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &p2]);
    dm.shutdown();
    drop(lo);
}

/// An `nbd:` core (another tiercache daemon's export) is refused under another spelling of
/// its URI: the socket through `./`, the export name percent-encoded.
#[test]
fn the_same_nbd_export_spelled_two_ways_is_refused() {
    let (d, remote_dir) = (Dir::new("ident-nbd"), Dir::new("ident-nbd-remote"));
    let remote = Daemon::start(Opts::new(&remote_dir));
    remote.ok(&["start-cache", "--cache-device", "ram:64m"]);
    let file = remote_dir.sparse("disk.img", 32 << 20);
    remote.add_core(1, &file, "vm");
    let (dm, core) = with_core(&d, |_| format!("nbd:{}", remote.uri("vm")));
    let again = format!(
        "nbd:nbd+unix:///%76m?socket={}",
        remote_dir.path("./nbd.sock")
    );
    refused_as_core_0(&dm, &again, &core);
    dm.shutdown();
    remote.shutdown();
}

#[test]
fn two_ram_caches_and_two_different_files_are_accepted() {
    let d = Dir::new("ident-ok");
    let (a, b) = (d.sparse("a.img", 32 << 20), d.sparse("b.img", 32 << 20));
    let dm = Daemon::start(Opts::new(&d));
    for id in [1, 2] {
        let v = dm.json(&["start-cache", "--cache-device", "ram:64m"]);
        assert_eq!(v["cache_id"], id, "{v}");
    }
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &a]);
    dm.ok(&["add-core", "--cache-id", "2", "--core-device", &b]);
    // The same core added again by its id (as reassembly does), under another spelling:
    // already attached, not another holder.
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-id",
        "0",
        "--core-device",
        &d.path("./a.img"),
    ]);
    assert_eq!(v["already_attached"], true, "{v}");
    dm.shutdown();
}

/// Reassembly from the config file: the second spelling of a core is not attached, with the
/// refusal as its reason; the first is served.
#[test]
fn the_config_file_cannot_attach_a_core_twice() {
    let d = Dir::new("ident-config");
    let cache = d.sparse("cache.img", 32 << 20);
    let core = d.sparse("core.img", 32 << 20);
    let dot = d.path("./core.img");
    let cfg = cache_config(&d, &cache, "wt", &[(0, &core, "a", ""), (1, &dot, "b", "")]);
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let want = format!("{dot} is the same device as core 0 of cache 1 ({core})");
    let log = dm.wait_log("core not attached");
    assert!(log.contains(&want), "{log}");
    let list = dm.json(&["list"]).to_string();
    assert!(list.contains(&want), "{list}");
    assert!(dm.nbd("a").is_ok(), "the first spelling is served");
    assert!(dm.nbd("b").is_err(), "the second is not");
    dm.shutdown();
}
