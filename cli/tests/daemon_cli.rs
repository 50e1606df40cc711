//! The daemon and the management verbs, run as a user would: the real `tiercache` binary, a
//! daemon process per test (stopped by the test, exactly the process it started), data through
//! the NBD exports with tiercache's own NBD client.
//!
//! - lifecycle: create (space printed, file preallocated), refusals (a device holding a cache
//!   or other data, bad arguments: one line, exit 1, nothing changed), add-core, writes over
//!   NBD, stop with dirty data kept, `--load` (incomplete until the core is attached), data
//!   back, parameters, io classes, writeback with progress, invalidate, remove-core;
//! - restart from the config file after a clean stop and after SIGKILL: every cache back with
//!   its dirty data;
//! - a `wb` cache whose cache device is missing: its export is not served and `list` says why.

mod common;

use common::{Daemon, Dir, Opts, check_set, pattern, sparse, write_set};
use tiercache_io::Backend;

#[test]
fn lifecycle_through_the_cli() {
    let d = Dir::new("daemon-life");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 256 << 20);
    let dm = Daemon::start(Opts::new(&d));

    // Bad input: one line, a non-zero exit, nothing created.
    dm.fails(
        &["start-cache", "--cache-device", &cache, "--mode", "xx"],
        "invalid value 'xx' for '--mode <MODE>'",
    );
    dm.fails(
        &["start-cache", "--cache-device", &cache, "--line-size", "3k"],
        "invalid value '3k' for '--line-size <LINE_SIZE>'",
    );
    dm.fails(
        &["start-cache", "--cache-device", "ram:64m", "--mode", "wb"],
        "volatile",
    );
    dm.fails(
        &["start-cache", "--cache-device", "ram:12x"],
        "is not a size",
    );
    dm.fails(
        &["start-cache", "--cache-device", &d.path("nope.img")],
        "no such file",
    );
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &core],
        "no cache 1",
    );
    assert_eq!(dm.json(&["list"]), serde_json::json!([]));

    // A device holding other data is refused without --force.
    let junk = d.path("junk.img");
    std::fs::write(&junk, vec![0x5au8; 8 << 20]).unwrap();
    dm.fails(&["start-cache", "--cache-device", &junk], "holds data");

    // --dry-run: what a new cache would use, and nothing changes (no cache, the sparse file
    // not preallocated). With --load it is refused.
    let plan = dm.json(&[
        "start-cache",
        "--cache-device",
        &cache,
        "--mode",
        "wb",
        "--dry-run",
    ]);
    assert_eq!(plan["dry_run"], true, "{plan}");
    assert!(
        plan["would_create"]["lines"].as_u64().unwrap() > 10_000,
        "{plan}"
    );
    assert_eq!(dm.json(&["list"]), serde_json::json!([]));
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&cache).unwrap();
        assert!(m.blocks() * 512 < 1 << 20, "a dry run preallocates nothing");
    }
    dm.fails(
        &[
            "start-cache",
            "--cache-device",
            &cache,
            "--load",
            "--dry-run",
        ],
        "cannot be used with",
    );

    // Create: the plan is printed first (stderr), the same space in the reply; the file is
    // preallocated.
    let (ok, out, err) = dm.tc(&[
        "start-cache",
        "--cache-device",
        &cache,
        "--mode",
        "wb",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    let lines = plan["would_create"]["lines"].as_u64().unwrap();
    assert!(
        err.starts_with(&format!("cache device {cache}: {lines} lines of 4.0 KiB")),
        "the plan before the format: {err}"
    );
    assert_eq!(v["created"], plan["would_create"]);
    assert_eq!(v["cache_id"], 1);
    assert!(v["created"]["lines"].as_u64().unwrap() > 10_000, "{v}");
    assert!(v["created"]["ram_bytes"].as_u64().unwrap() > 0);
    assert!(v["created"]["metadata_bytes_on_device"].as_u64().unwrap() > 0);
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&cache).unwrap();
        assert!(m.blocks() * 512 >= 64 << 20, "cache file preallocated");
    }
    dm.fails(
        &["start-cache", "--cache-device", &cache],
        "already cache 1",
    );
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &core,
        "--export",
        "vm1",
    ]);
    assert_eq!(v["core_id"], 0);
    dm.fails(
        &["add-core", "--cache-id", "1", "--core-device", &core],
        "already core 0",
    );

    // Data through NBD, stays dirty (cleaning nop).
    dm.no_cleaning(1);
    dm.fails(
        &["set-param", "--cache-id", "1", "cleaning", "--policy", "x"],
        "[possible values: alru, acp, nop]",
    );
    dm.fails(
        &["set-param", "--cache-id", "1", "cleaning", "--bogus", "1"],
        "unexpected argument '--bogus'",
    );
    let e = dm.nbd("vm1").expect("export vm1 served");
    assert_eq!(e.blocks(), (256 << 20) / 512);
    write_set(&e, 0..2000, 1);
    check_set(&e, 0..2000, 1);
    drop(e);
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["usage"]["dirty_lines"], 2000, "{s}");
    assert_eq!(s["risk"]["dirty_bytes"], 2000 * 4096);
    assert!(s["requests"]["write_misses"].as_u64().unwrap() >= 2000);
    assert!(s["requests"]["read_full_hits"].as_u64().unwrap() >= 2000);
    // The engine's IO buffer pool: 64 MiB, every buffer back once the IOs are done.
    let b = &s["engine"]["io_buffers"];
    assert_eq!(b["bytes"], 64 << 20, "{s}");
    assert!(b["peak"].as_u64().unwrap() >= 4096, "{s}");
    // The file cache's IOs ran on the NBD connection's ring (nbd/src/reactor.rs), not on IO
    // threads.
    assert!(s["engine"]["ring_ios"].as_u64().unwrap() >= 2000, "{s}");

    // Stop keeping dirty data; the device now holds a cache: plain start refuses it.
    let v = dm.json(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    assert_eq!(v["dirty_lines_kept"], 2000);
    assert!(dm.nbd("vm1").is_err(), "export gone with its cache");
    dm.fails(&["start-cache", "--cache-device", &cache], "--load");
    dm.fails(
        &[
            "start-cache",
            "--cache-device",
            &cache,
            "--load",
            "--mode",
            "wt",
        ],
        "--load",
    );

    // Load with the core device missing: incomplete until the core is attached; not served
    // meanwhile. (With it present, --load attaches it by itself: see the resize test.)
    std::fs::rename(&core, d.path("core.moved")).unwrap();
    let v = dm.json(&[
        "start-cache",
        "--cache-device",
        &cache,
        "--load",
        "--cache-id",
        "3",
    ]);
    assert_eq!(v["state"], "incomplete", "{v}");
    std::fs::rename(d.path("core.moved"), &core).unwrap();
    assert_eq!(v["loaded"]["dirty_lines"], 2000);
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "incomplete");
    assert_eq!(l[0]["cores"][0]["state"], "detached");
    assert!(dm.nbd("vm1").is_err());
    let other = d.path("other.img");
    sparse(&other, 256 << 20);
    dm.fails(
        &[
            "add-core",
            "--cache-id",
            "3",
            "--core-device",
            &other,
            "--core-id",
            "0",
        ],
        "not the same device",
    );
    let v = dm.json(&["add-core", "--cache-id", "3", "--core-device", &core]);
    assert_eq!(v["state"], "running", "{v}");
    let e = dm.nbd("vm1").expect("served again");
    check_set(&e, 0..2000, 1);
    drop(e);

    // Parameters, IO classes, mode.
    let v = dm.json(&[
        "set-param",
        "--cache-id",
        "3",
        "seq-cutoff",
        "--policy",
        "never",
        "--threshold",
        "2m",
    ]);
    assert_eq!(v[0]["policy"], "never", "--json after the parameters: {v}");
    let v = dm.json(&["get-param", "--cache-id", "3", "seq-cutoff"]);
    assert_eq!(v[0]["policy"], "never");
    assert_eq!(
        v[0]["threshold_bytes"],
        2 << 20,
        "JSON: a number, the unit in the key"
    );
    let csv = d.path("classes.csv");
    std::fs::write(
        &csv,
        "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,1\n1,request_size:le:8192&done,1,0.5\n",
    )
    .unwrap();
    dm.ok(&["io-class", "load", "--cache-id", "3", "--file", &csv]);
    let v = dm.json(&["io-class", "list", "--cache-id", "3"]);
    assert_eq!(v["classes"].as_array().unwrap().len(), 2);
    std::fs::write(
        &csv,
        "IO class id,IO class name,Eviction priority,Allocation\n1,file_name_prefix:x,1,1\n",
    )
    .unwrap();
    dm.fails(
        &["io-class", "load", "--cache-id", "3", "--file", &csv],
        "line 2",
    );
    // Malformed CSV (a row with too few fields, a non-numeric id): refused, nothing changes.
    for bad in [
        "IO class id,IO class name,Eviction priority,Allocation\n1,request_size:le:4096\n",
        "IO class id,IO class name,Eviction priority,Allocation\nx,unclassified,22,0\n",
    ] {
        std::fs::write(&csv, bad).unwrap();
        dm.fails(
            &["io-class", "load", "--cache-id", "3", "--file", &csv],
            "line 2",
        );
    }
    assert_eq!(
        dm.json(&["io-class", "list", "--cache-id", "3"])["classes"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Writeback with progress, then nothing is dirty and the core holds the data.
    let (ok, out, err) = dm.tc(&["writeback", "--cache-id", "3"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("writeback") && err.contains("lines"),
        "progress shown: {err}"
    );
    assert!(out.contains("lines_written_back: 2000"), "{out}");
    assert_eq!(
        dm.json(&["stats", "--cache-id", "3"])["usage"]["dirty_lines"],
        0
    );
    dm.fails(
        &["invalidate", "--cache-id", "3", "--core-id", "0"],
        "--force",
    );
    let v = dm.json(&["invalidate", "--cache-id", "3", "--core-id", "0", "--force"]);
    assert_eq!(v["dirty_bytes_dropped"], 0);
    dm.ok(&["reset-counters", "--cache-id", "3"]);
    assert_eq!(
        dm.json(&["stats", "--cache-id", "3"])["requests"]["total"],
        0
    );
    dm.ok(&["set-mode", "--cache-id", "3", "--mode", "wt"]);
    dm.ok(&["remove-core", "--cache-id", "3", "--core-id", "0"]);
    dm.ok(&["stop-cache", "--cache-id", "3"]);
    // The core file has the data without the cache.
    let raw = std::fs::read(&core).unwrap();
    for b in [0u64, 1, 999, 1999] {
        assert!(
            raw[(b * 4096) as usize..][..4096] == pattern(b, 1)[..],
            "core block {b}"
        );
    }
    // --force formats a device holding a cache.
    dm.ok(&["start-cache", "--cache-device", &cache, "--force"]);
    dm.shutdown();
}

fn config(d: &Dir, mode: &str) -> String {
    let (c0, c1) = (d.path("core0.img"), d.path("core1.img"));
    common::cache_config(
        d,
        &d.path("cache.img"),
        mode,
        &[(0, &c0, "vm1", ""), (1, &c1, "vm2", "")],
    )
}

#[test]
fn restart_from_config_after_clean_stop_and_sigkill() {
    let d = Dir::new("daemon-restart");
    sparse(&d.path("cache.img"), 64 << 20);
    sparse(&d.path("core0.img"), 128 << 20);
    sparse(&d.path("core1.img"), 128 << 20);
    let cfg = config(&d, "wb");

    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}");
    write_set(&dm.nbd("vm1").unwrap(), 0..500, 1);
    write_set(&dm.nbd("vm2").unwrap(), 100..400, 2);
    dm.shutdown();

    // Clean restart: loaded, not reformatted, dirty data back.
    let mut dm = Daemon::start(Opts::new(&d).config(&cfg));
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["usage"]["dirty_lines"], 800, "{s}");
    check_set(&dm.nbd("vm1").unwrap(), 0..500, 1);
    check_set(&dm.nbd("vm2").unwrap(), 100..400, 2);
    // More flushed writes, then SIGKILL.
    write_set(&dm.nbd("vm1").unwrap(), 250..750, 3);
    dm.kill();

    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running", "{l}");
    check_set(&dm.nbd("vm1").unwrap(), 0..250, 1);
    check_set(&dm.nbd("vm1").unwrap(), 250..750, 3);
    check_set(&dm.nbd("vm2").unwrap(), 100..400, 2);
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["usage"]["dirty_lines"], 1050, "{s}");
    dm.shutdown();
}

#[test]
fn missing_cache_device_of_a_wb_cache_is_not_served() {
    let d = Dir::new("daemon-missing");
    sparse(&d.path("cache.img"), 64 << 20);
    sparse(&d.path("core0.img"), 128 << 20);
    sparse(&d.path("core1.img"), 128 << 20);
    let cfg = config(&d, "wb");
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    write_set(&dm.nbd("vm1").unwrap(), 0..100, 1);
    dm.shutdown();
    std::fs::rename(d.path("cache.img"), d.path("cache.moved")).unwrap();

    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "detached", "{l}");
    let why = l[0]["cores"][0]["reason"].as_str().unwrap();
    assert!(
        why.contains("missing") && why.contains("not served"),
        "{why}"
    );
    let r = dm.nbd("vm1");
    assert!(r.is_err(), "the bare core must not be served");
    let (_, text, _) = dm.tc(&["list"]);
    assert!(
        text.contains("detached") && text.contains("missing"),
        "{text}"
    );
    dm.shutdown();

    // Back in place: everything returns with the dirty data.
    std::fs::rename(d.path("cache.moved"), d.path("cache.img")).unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    check_set(&dm.nbd("vm1").unwrap(), 0..100, 1);
    dm.shutdown();
}

#[test]
fn core_growth_is_picked_up_and_a_shrink_below_cached_data_is_refused() {
    let d = Dir::new("daemon-resize");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 64 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    dm.add_core(1, &core, "r");
    let e = dm.nbd("r").unwrap();
    assert_eq!(e.blocks() * 512, 64 << 20);
    drop(e);

    // Grow: the next connection sees the new size and can use it.
    common::resize(&core, 96 << 20);
    let e = dm.nbd("r").unwrap();
    assert_eq!(e.blocks() * 512, 96 << 20);
    let far = (90u64 << 20) / 4096;
    write_set(&e, far..far + 4, 5);
    check_set(&e, far..far + 4, 5);
    drop(e);
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["cores"][0]["size_bytes"], 96 << 20);

    // Shrink below the cached (dirty) data at 90 MiB: refused, not served.
    common::resize(&core, 80 << 20);
    let r = dm.nbd("r");
    assert!(r.is_err(), "a shrink below cached data must be refused");
    let log = std::fs::read_to_string(d.path("daemon.log")).unwrap();
    assert!(
        log.contains("core resize refused") && log.contains("dirty data"),
        "{log}"
    );
    // Grown back: served again with the data.
    common::resize(&core, 96 << 20);
    check_set(&dm.nbd("r").unwrap(), far..far + 4, 5);

    // Restart with a core that grew while the daemon was down: loaded at the new size.
    dm.ok(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    common::resize(&core, 128 << 20);
    // --load attaches the recorded core by itself (by its device string, identity checked).
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "running", "{v}");
    // Attaching it again by the same device is a no-op.
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &core,
        "--core-id",
        "0",
    ]);
    assert_eq!(v["already_attached"], true, "{v}");
    let e = dm.nbd("r").unwrap();
    assert_eq!(e.blocks() * 512, 128 << 20);
    check_set(&e, far..far + 4, 5);
    drop(e);

    // Without cached data past the new end, a shrink is accepted.
    dm.ok(&["writeback", "--cache-id", "1"]);
    dm.ok(&["invalidate", "--cache-id", "1", "--core-id", "0", "--force"]);
    common::resize(&core, 80 << 20);
    assert_eq!(dm.nbd("r").unwrap().blocks() * 512, 80 << 20);
    dm.shutdown();
}

/// Mode `wl` through the CLI: refused on `ram:`, created with its log, data served and
/// written back, the `write_log` block in `stats` (and metrics' names), `set-mode` refused both
/// ways, `invalidate` without `--force` refused and with it dropping the log's data, a clean
/// stop that keeps the log, `inspect`/`check` reading it, and a `--load` that serves it.
#[test]
fn wl_cache_through_the_cli() {
    let d = Dir::new("daemon-wl");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 128 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.fails(
        &["start-cache", "--cache-device", "ram:64m", "--mode", "wl"],
        "ram: device loses",
    );
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--mode", "wl"]);
    assert_eq!(v["cache_id"], 1);
    assert_eq!(v["created"]["log_bytes"], 32 << 20, "{v}");
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &core]);
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["mode"], "wl", "{l}");
    dm.fails(
        &["set-mode", "--cache-id", "1", "--mode", "wb"],
        "cannot switch to or from mode wl",
    );
    // When the log's writeback runs: the defaults, a change, a refused value that changes
    // nothing.
    let p = dm.json(&["get-param", "--cache-id", "1", "wl-writeback"]);
    assert_eq!(
        p,
        serde_json::json!({"background_fill_pct": 50, "idle_ms": 500, "expire_s": 30, "depth": 48}),
        "{p}"
    );
    // Writeback holds until the log is 90% full, the clients have been idle an hour or the
    // oldest entry is an hour old: below that, only the `writeback` command drains it.
    let p = dm.json(&[
        "set-param",
        "--cache-id",
        "1",
        "wl-writeback",
        "--background-fill",
        "90",
        "--idle",
        "3600000",
        "--expire",
        "3600",
        "--depth",
        "16",
    ]);
    assert_eq!(
        p,
        serde_json::json!({"background_fill_pct": 90, "idle_ms": 3_600_000, "expire_s": 3600, "depth": 16}),
        "{p}"
    );
    dm.fails(
        &[
            "set-param",
            "--cache-id",
            "1",
            "wl-writeback",
            "--idle",
            "5",
            "--background-fill",
            "101",
        ],
        "background-fill = '101': want a percentage from 0% to 100%",
    );
    dm.fails(
        &[
            "set-param",
            "--cache-id",
            "1",
            "wl-writeback",
            "--depth",
            "0",
        ],
        "depth = '0': want a whole number from 1 to 4096",
    );
    dm.fails(
        &[
            "set-param",
            "--cache-id",
            "1",
            "wl-writeback",
            "--dirty",
            "5",
        ],
        "unexpected argument '--dirty'",
    );
    let p = dm.json(&["get-param", "--cache-id", "1", "wl-writeback"]);
    assert!(
        p["idle_ms"] == 3_600_000 && p["depth"] == 16,
        "a refused set-param changed something: {p}"
    );
    let e = dm.nbd("cache1-core0").unwrap();
    // The longest request advertised fits one log entry (half the ring); a longer write is
    // split by the client and lands whole.
    let max = e.info().max_block as usize;
    assert!(((1 << 20)..16 << 20).contains(&max), "max request {max}");
    let big: Vec<u8> = (0..max + (1 << 20)).map(|i| (i % 249) as u8).collect();
    e.write(8192, &big, false)
        .expect("a write longer than one entry");
    let mut back = vec![0u8; big.len()];
    e.read(8192, &mut back).unwrap();
    assert!(back == big, "the long write reads back");
    write_set(&e, 0..512, 1);
    check_set(&e, 0..512, 1);
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let w = &s["write_log"];
    assert_eq!(w["writeback_held"], true, "{s}");
    assert_eq!(w["entries_written_back"], 0, "{s}");
    assert!(w["dirty_bytes"].as_u64().unwrap() > 0, "{s}");
    // The log drains in blocks, and its progress says so (the command drains it whatever
    // the pacing says).
    let (ok, _, err) = dm.tc(&["writeback", "--cache-id", "1"]);
    assert!(ok, "{err}");
    assert!(
        err.contains("blocks") && !err.contains("lines"),
        "wl writeback progress in blocks: {err}"
    );
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let w = &s["write_log"];
    assert_eq!(s["mode"], "wl");
    assert_eq!(w["present"], true, "{s}");
    assert_eq!(w["clean"], true, "{s}");
    assert_eq!(w["dirty_bytes"], 0);
    assert!(w["entries_logged"].as_u64().unwrap() >= 512, "{s}");
    assert_eq!(
        w["written_back_bytes"],
        512 * 4096 + big.len() as u64,
        "{s}"
    );
    for k in [
        "generation_lag",
        "log_fill_pct",
        "read_hits_full",
        "read_misses",
    ] {
        assert!(w[k].is_number(), "{k}: {s}");
    }
    // The core holds the data.
    let raw = std::fs::read(&core).unwrap();
    for b in 0..512u64 {
        assert_eq!(
            &raw[b as usize * 4096..][..4096],
            &pattern(b, 1)[..],
            "core block {b}"
        );
    }
    // invalidate: refused without --force; with it, drops what is not written back.
    dm.fails(
        &["invalidate", "--cache-id", "1", "--core-id", "0"],
        "--force",
    );
    // A clean stop without writeback keeps the log; inspect and check read it.
    write_set(&e, 0..64, 2);
    drop(e);
    let v = dm.json(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    assert_eq!(v["stopped"], true);
    let dirty_kept = v["dirty_bytes_kept"].as_u64().unwrap();
    let ins = dm.json(&["inspect", "--cache-device", &cache]);
    assert_eq!(ins["mode"], "wl", "{ins}");
    assert_eq!(ins["write_log"]["ok"], true, "{ins}");
    assert_eq!(ins["write_log"]["dirty_bytes"], dirty_kept, "{ins}");
    let chk = dm.ok(&["check", "--cache-device", &cache]);
    assert!(chk.contains("write log: ok"), "{chk}");
    // --load serves the log (the core was attached from the core table).
    dm.ok(&["start-cache", "--cache-device", &cache, "--load"]);
    let e = dm.nbd("cache1-core0").unwrap();
    check_set(&e, 0..64, 2);
    check_set(&e, 64..512, 1);
    // Newer data, then invalidate --force: it reads from the core again.
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let _ = s;
    drop(e);
    dm.ok(&["writeback", "--cache-id", "1"]);
    let v = dm.json(&["invalidate", "--cache-id", "1", "--core-id", "0", "--force"]);
    assert_eq!(
        v["dirty_bytes_dropped"], 0,
        "nothing left after writeback: {v}"
    );
    let e = dm.nbd("cache1-core0").unwrap();
    check_set(&e, 0..64, 2);
    drop(e);
    dm.ok(&["stop-cache", "--cache-id", "1"]);
    dm.shutdown();
}

/// `shutdown` returns when the daemon's process has ended (final checkpoint written), not when
/// it has begun stopping; `--no-wait` returns at once.
#[test]
fn shutdown_returns_when_the_daemon_has_exited() {
    let d = Dir::new("shutdown-wait");
    let dm = Daemon::start(Opts::new(&d));
    let (cache, core) = (d.sparse("c.img", 64 << 20), d.sparse("k.img", 128 << 20));
    dm.cache_and_core(&cache, "wb", &core, "v");
    let pid = dm.pid().expect("running");
    assert!(dm.ok(&["shutdown"]).contains("stopping: true"));
    // Ended: gone, or a zombie until this test reaps it.
    let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(st.is_empty() || st.contains(") Z"), "still running: {st}");
    assert!(
        dm.log_tail(3).contains("daemon stopped"),
        "{}",
        dm.log_tail(3)
    );
    drop(dm);
    let dm = Daemon::start(Opts::new(&d));
    assert!(dm.ok(&["shutdown", "--no-wait"]).contains("stopping: true"));
    drop(dm);
}

/// `list` shows, per cache and core, how full, how dirty and how often reads hit; `stats`
/// leads with the same in a line.
#[test]
fn list_shows_occupancy_dirt_and_read_hits() {
    let d = Dir::new("list-glance");
    let dm = Daemon::start(Opts::new(&d));
    let (cache, core) = (d.sparse("c.img", 64 << 20), d.sparse("k.img", 128 << 20));
    dm.cache_and_core(&cache, "wb", &core, "v");
    dm.no_cleaning(1);
    let c = dm.nbd("v").unwrap();
    c.write(0, &[7u8; 64 << 10], false).unwrap();
    let mut b = vec![0u8; 64 << 10];
    c.read(0, &mut b).unwrap(); // hits: the write put it in the cache
    c.read(1 << 16, &mut b).unwrap(); // a miss
    drop(c);
    let l = dm.json(&["list"]);
    let k = &l[0]["cores"][0];
    assert_eq!(k["dirty_lines"], 16, "{l}");
    assert_eq!(k["read_hit_ratio"], 0.5, "{l}");
    assert_eq!(l[0]["read_hit_ratio"], 0.5, "{l}");
    assert!(l[0]["occupancy_lines"].as_u64().unwrap() >= 16, "{l}");
    let text = dm.ok(&["list"]);
    let core_line = text.lines().find(|x| x.contains("k.img")).unwrap();
    assert!(core_line.contains("50.0%"), "{text}");
    // `stats` leads with a line per cache.
    let st = dm.ok(&["stats", "--cache-id", "1"]);
    let first = st.lines().next().unwrap();
    assert!(
        first.starts_with("cache 1 (") && first.contains("read hits 50.0%"),
        "{st}"
    );
    dm.shutdown();
}

/// The persistence rule of docs/CASADM.md: mode and parameters changed at run time are on the
/// cache device, so a restart without a config file and `start-cache --load` bring them back.
#[test]
fn mode_and_parameters_survive_a_restart_without_a_config() {
    let d = Dir::new("persist-params");
    let (cache, core) = (d.sparse("c.img", 64 << 20), d.sparse("k.img", 128 << 20));
    let dm = Daemon::start(Opts::new(&d));
    dm.cache_and_core(&cache, "wb", &core, "v");
    let cutoff = ["seq-cutoff", "--policy", "never", "--threshold", "2m"];
    dm.ok(&[&["set-param", "--cache-id", "1"][..], &cutoff].concat());
    dm.ok(&[
        "set-param",
        "--cache-id",
        "1",
        "cleaning",
        "--policy",
        "acp",
    ]);
    dm.ok(&["set-mode", "--cache-id", "1", "--mode", "wt"]);
    dm.shutdown();
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache, "--load"]);
    let s = dm.ok(&["get-param", "--cache-id", "1", "seq-cutoff"]);
    assert!(
        s.contains("policy: never") && s.contains("threshold: 2MiB"),
        "{s}"
    );
    let c = dm.ok(&["get-param", "--cache-id", "1", "cleaning"]);
    assert!(c.contains("policy: acp"), "{c}");
    assert_eq!(dm.json(&["list"])[0]["mode"], "wt");
    dm.shutdown();
}
