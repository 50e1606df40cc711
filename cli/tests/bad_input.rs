//! The CLI, config, CSV and device part of the bad-input catalogue (docs/BAD_INPUT.md, SPEC
//! R6, C18): every refusal is exactly one line on stderr saying what was wrong, a non-zero
//! exit status, and no change (`list`, parameters, IO classes and the devices' bytes are the
//! same before and after); the daemon stays up. Each test starts the daemons it needs and
//! stops exactly those.

mod common;

use common::{Daemon, Dir, Opts, refused, sparse};
use serde_json::Value;
use tiercache_io::Backend;

/// Everything a refused command must leave as it was.
fn state(dm: &Daemon) -> Vec<Value> {
    let list = dm.json(&["list"]);
    let mut v = vec![list.clone()];
    for c in list.as_array().unwrap() {
        let id = c["cache_id"].to_string();
        if c["state"] == "running" {
            v.push(dm.json(&["io-class", "list", "--cache-id", &id]));
            for g in ["seq-cutoff", "cleaning", "promotion"] {
                v.push(dm.json(&["get-param", "--cache-id", &id, g]));
            }
        }
    }
    v
}

fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn invalid_arguments_are_one_line_and_change_nothing() {
    let d = Dir::new("bad-args");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 64 << 20);
    let blank = d.sparse("blank.img", 64 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &core]);
    let before = state(&dm);
    let s = dm.socket.as_str();
    // Refused by the command line parser: exit 2, clap's message on one line, and where to look.
    for (args, want) in [
        (
            &["frobnicate"][..],
            &[
                "unrecognized subcommand 'frobnicate'",
                "see 'tiercache --help'",
            ][..],
        ),
        (
            &["lst"],
            &[
                "unrecognized subcommand 'lst'",
                "tip: a similar subcommand exists: 'list'",
            ],
        ),
        (
            &["io-class", "bogus"],
            &[
                "unrecognized subcommand 'bogus'",
                "see 'tiercache io-class --help'",
            ],
        ),
        (
            &["start-cache"],
            &[
                "required arguments were not provided: --cache-device <CACHE_DEVICE>",
                "see 'tiercache start-cache --help'",
            ],
        ),
        (
            &["add-core", "--cache-id", "1"],
            &["not provided: --core-device <CORE_DEVICE>"],
        ),
        (
            &["io-class", "load", "--cache-id", "1"],
            &[
                "not provided: --file <FILE>",
                "see 'tiercache io-class load --help'",
            ],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--mode"],
            &["a value is required for '--mode <MODE>'"],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--load", "--force"],
            &["'--load' cannot be used with '--force'"],
        ),
        (
            &["stop-cache", "--cache-id", "abc"],
            &["invalid value 'abc' for '--cache-id <CACHE_ID>': invalid digit"],
        ),
        (
            &["stop-cache", "--cache-id", "1.5"],
            &["invalid value '1.5' for '--cache-id <CACHE_ID>'"],
        ),
        (
            &["stop-cache", "--cache-id", "70000"],
            &["70000 is not in 0..=65535"],
        ),
        (
            &["stop-cache", "--cache-id", "-1"],
            &["unexpected argument '-1' found"],
        ),
        (
            &["remove-core", "--cache-id", "1", "--core-id", "x"],
            &["invalid value 'x' for '--core-id <CORE_ID>'"],
        ),
        (&["stats", "--io-class", "300"], &["300 is not in 0..=255"]),
        (
            &["start-cache", "--cache-device", &blank, "--mode", "xx"],
            &[
                "invalid value 'xx' for '--mode <MODE>' [possible values: wt, wb, wa, wi, pt, wo, wl]",
            ],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--mode", "w b"],
            &["invalid value 'w b' for '--mode <MODE>'"],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--line-size", "3k"],
            &[
                "invalid value '3k' for '--line-size <LINE_SIZE>' [possible values: 4k, 8k, 16k, 32k, 64k]",
            ],
        ),
        (
            &[
                "start-cache",
                "--cache-device",
                &blank,
                "--line-size",
                "128k",
            ],
            &["invalid value '128k'"],
        ),
        (
            &[
                "start-cache",
                "--cache-device",
                &blank,
                "--line-size",
                "5000",
            ],
            &["invalid value '5000'"],
        ),
        (
            &["set-mode", "--cache-id", "1", "--mode", "fast"],
            &["invalid value 'fast' for '--mode <MODE>'"],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "seq-cutoff",
                "--threshold",
                "12q",
            ],
            &["invalid value '12q' for '--threshold <SIZE>': not a size"],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "seq-cutoff",
                "--policy",
                "sometimes",
            ],
            &[
                "invalid value 'sometimes' for '--policy <POLICY>' [possible values: always, full, never]",
            ],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "seq-cutoff",
                "--promotion-count",
                "lots",
            ],
            &["invalid value 'lots' for '--promotion-count <N>': not a whole number"],
        ),
        (
            &["set-param", "--cache-id", "1", "seq-cutoff", "--bogus", "1"],
            &[
                "unexpected argument '--bogus' found",
                "see 'tiercache set-param seq-cutoff --help'",
            ],
        ),
        (
            &["set-param", "--cache-id", "1", "nonsense", "--policy", "x"],
            &[
                "unrecognized subcommand 'nonsense'",
                "see 'tiercache set-param --help'",
            ],
        ),
        (
            &["get-param", "--cache-id", "1", "nonsense"],
            &["unrecognized subcommand 'nonsense'"],
        ),
        (
            &["list", "--bogus"],
            &["unexpected argument '--bogus' found"],
        ),
    ] {
        refused(s, args, 2, want);
    }
    // Refused by the daemon: exit 1, its one line.
    for (args, want) in [
        (
            &["start-cache", "--cache-device", "ram:64q"][..],
            &["'64q' is not a size (want a number with k/m/g/t, e.g. 4g)"][..],
        ),
        (
            &["start-cache", "--cache-device", "ram:100"],
            &["the size must be a non-zero multiple of 512"],
        ),
        (
            &["start-cache", "--cache-device", "ram:"],
            &["'' is not a size"],
        ),
        (
            &["start-cache", "--cache-device", ""],
            &["empty device string"],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--cache-id", "0"],
            &["cache id 0 is out of range"],
        ),
        (
            &["start-cache", "--cache-device", &blank, "--cache-id", "1"],
            &["cache 1 already exists"],
        ),
        (
            &[
                "start-cache",
                "--cache-device",
                &blank,
                "--load",
                "--mode",
                "wt",
            ],
            &["--load takes mode and line size from the device"],
        ),
        (
            &["start-cache", "--cache-device", "nbd:nbd://localhost/x"],
            &["nbd: and rbd: devices can be cores, not cache devices"],
        ),
        (&["stop-cache", "--cache-id", "9"], &["no cache 9"]),
        (
            &["add-core", "--cache-id", "9", "--core-device", &blank],
            &["no cache 9"],
        ),
        (
            &[
                "add-core",
                "--cache-id",
                "1",
                "--core-device",
                &blank,
                "--core-id",
                "255",
            ],
            &["core id 255 is out of range (0-254)"],
        ),
        (
            &[
                "add-core",
                "--cache-id",
                "1",
                "--core-device",
                &blank,
                "--export",
                "two words",
            ],
            &["export name 'two words' must be 1-255 printable ASCII characters"],
        ),
        (
            &[
                "add-core",
                "--cache-id",
                "1",
                "--core-device",
                "emu:floppy:/x",
            ],
            &["unknown device preset 'floppy' (known: hdd-10k-sas"],
        ),
        (
            &[
                "add-core",
                "--cache-id",
                "1",
                "--core-device",
                &blank,
                "--ceph-id",
                "x",
            ],
            &["apply to rbd:POOL/IMAGE devices only"],
        ),
        (
            &["remove-core", "--cache-id", "1", "--core-id", "7"],
            &["cache 1 has no core 7"],
        ),
        (
            &["stats", "--cache-id", "1", "--core-id", "7"],
            &["cache 1 has no core 7"],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "seq-cutoff",
                "--promotion-count",
                "0",
            ],
            &["promotion-count = '0': want a whole number from 1 to 65535"],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "cleaning-alru",
                "--wake-up",
                "2h",
            ],
            &["wake-up = '2h': want a time from 0s to 1h in whole seconds"],
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "wl-writeback",
                "--idle",
                "1",
            ],
            &["cache 1 is not in mode wl: wl-writeback is a write-log parameter"],
        ),
        (
            &["get-param", "--cache-id", "1", "wl-writeback"],
            &["cache 1 is not in mode wl: wl-writeback is a write-log parameter"],
        ),
        (
            &["invalidate", "--cache-id", "1", "--core-id", "0"],
            &["drops the core's cached and unwritten (dirty) data; add --force to do it"],
        ),
    ] {
        refused(s, args, 1, want);
    }
    assert_eq!(state(&dm), before, "a refused command changed something");
    assert!(
        bytes(&blank).iter().all(|&b| b == 0),
        "blank.img was written"
    );
    // No daemon at that socket: one line saying so.
    refused(
        &d.path("nowhere.sock"),
        &["list"],
        1,
        &[
            &format!("cannot reach the daemon at {}", d.path("nowhere.sock")),
            "start it with `tiercache daemon` or pass --socket",
        ],
    );
    dm.shutdown();
}

/// The daemon's own output (its stderr) when it refused to start.
fn start_refused(d: &Dir, config: &str) -> String {
    let log = d.path("refused.log");
    let _ = std::fs::remove_file(&log);
    let e = Daemon::try_start(Opts::new(d).config(config).log(log.clone()))
        .err()
        .expect("the daemon must refuse this config");
    assert!(e.contains("exit status: 1"), "{e}");
    assert!(
        !std::path::Path::new(&d.path("admin.sock")).exists(),
        "admin socket left behind"
    );
    let out = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    out
}

#[test]
fn config_errors_refuse_to_start_and_missing_devices_are_reported() {
    let d = Dir::new("bad-config");
    let cfg = d.path("tc.toml");
    let cache = d.sparse("cache.img", 64 << 20);
    // Refused at start: one line, `tiercache: config FILE: where: what`.
    let pre = format!("tiercache: config {cfg}: ");
    for (text, want) in [
        (
            "[[cache]\nid = 1\n",
            "line 1, column 8: invalid table header expected `.`, `]]`",
        ),
        (
            "[[cache]]\nid = 1\ndevice = \"ram:64m\"\nbogus = 2\n",
            "line 4, column 1: unknown field `bogus`, expected one of `id`, `device`",
        ),
        (
            "[demon]\nsocket = \"/x\"\n",
            "line 1, column 2: unknown field `demon`, expected `daemon` or `cache`",
        ),
        (
            "[[cache]]\nid = \"one\"\ndevice = \"ram:64m\"\n",
            "line 2, column 6: invalid type: string \"one\", expected u16",
        ),
        (
            "[[cache]]\nid = 70000\ndevice = \"ram:64m\"\n",
            "line 2, column 6: invalid value: integer `70000`, expected u16",
        ),
        (
            "[[cache]]\nid = 1\ndevice = 5\n",
            "line 3, column 10: invalid type: integer `5`, expected a string",
        ),
        (
            "[[cache]]\nid = 1\n",
            "line 1, column 1: missing field `device`",
        ),
        (
            "[[cache]]\nid = 1\nid = 2\ndevice = \"ram:64m\"\n",
            "line 3, column 1: duplicate key `id`",
        ),
        (
            "[[cache]]\nid = 1\ndevice = \"ram:64m\"\n[[cache]]\nid = 1\ndevice = \"ram:32m\"\n",
            "cache id 1 appears twice",
        ),
        (
            "[[cache]]\nid = 0\ndevice = \"ram:64m\"\n",
            "cache id 0 is out of range",
        ),
        (
            "[[cache]]\nid = 1\ndevice = \"ram:64q\"\n",
            "cache 1: '64q' is not a size",
        ),
        (
            "[[cache]]\nid = 1\ndevice = \"ram:64m\"\n[[cache.core]]\nid = 0\ndevice = \"/a\"\n[[cache.core]]\nid = 0\ndevice = \"/b\"\n",
            "cache 1: core id 0 appears twice",
        ),
        (
            "[[cache]]\nid = 1\ndevice = \"ram:64m\"\n[[cache.core]]\nid = 0\ndevice = \"/a\"\nexport = \"x\"\n[[cache.core]]\nid = 1\ndevice = \"/b\"\nexport = \"x\"\n",
            "export name 'x' appears twice",
        ),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = start_refused(&d, &cfg);
        assert!(out.starts_with(&pre), "{out}");
        assert!(out.contains(want), "want '{want}' in: {out}");
    }
    let out = start_refused(&d, &d.path("none.toml"));
    assert_eq!(
        out.trim(),
        format!(
            "tiercache: config {}: No such file or directory (os error 2)",
            d.path("none.toml")
        )
    );

    // Devices are looked at after the daemon started: a missing one is reported (its log line
    // and `list`), the rest serves.
    let junk = d.path("junk.img");
    std::fs::write(&junk, vec![0x5au8; 1 << 20]).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{cache}\"\n[[cache.core]]\nid = 0\ndevice = \"{}\"\nexport = \"gone\"\n\
             [[cache]]\nid = 2\ndevice = \"{}\"\n[[cache]]\nid = 3\ndevice = \"{junk}\"\n",
            d.path("nocore.img"),
            d.path("nocache.img")
        ),
    )
    .unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let log = dm.log();
    assert!(log.contains("problems=3"), "{log}");
    assert!(
        log.contains(&format!(
            "msg=\"core not attached\" cache=1 core=0 reason=\"{}: no such file or device\"",
            d.path("nocore.img")
        )),
        "{log}"
    );
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "running");
    assert_eq!(l[1]["state"], "detached");
    assert_eq!(
        l[1]["reason"],
        format!("cache device {} is missing", d.path("nocache.img"))
    );
    assert_eq!(l[2]["state"], "detached");
    assert!(
        l[2]["reason"]
            .as_str()
            .unwrap()
            .contains("holds data that is not a tiercache cache"),
        "{l}"
    );
    assert!(dm.nbd("gone").is_err());
    assert!(
        bytes(&junk).iter().all(|&b| b == 0x5a),
        "junk.img was written"
    );
    dm.shutdown();
}

/// A CSV with the header and `rows`.
fn csv(rows: &str) -> String {
    format!("IO class id,IO class name,Eviction priority,Allocation\n{rows}")
}

#[test]
fn io_class_csv_errors_name_the_line_and_change_nothing() {
    let d = Dir::new("bad-csv");
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", "ram:64m"]);
    let f = d.path("classes.csv");
    std::fs::write(
        &f,
        csv("0,unclassified,22,1\n1,request_size:le:4096,1,0.5\n"),
    )
    .unwrap();
    dm.ok(&["io-class", "load", "--cache-id", "1", "--file", &f]);
    let before = state(&dm);
    for (text, want) in [
        (
            "".to_string(),
            &["line 1: no header (want: IO class id,IO class name,Eviction priority,Allocation)"][..],
        ),
        (
            "IO class id,IO class name,Eviction priority\n0,unclassified,22\n".into(),
            &["line 1: the header lacks column 'Allocation'"],
        ),
        (
            "id,name,prio,alloc\n0,unclassified,22,1\n".into(),
            &["line 1: unknown column 'id' in the header"],
        ),
        (
            csv("0,unclassified,22,1\n1,file_name_prefix:/var,1,1\n"),
            &[
                "line 3: unsupported classifier 'file_name_prefix' in rule 'file_name_prefix:/var' (tiercache sees blocks, not files)",
            ],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,1,1.5\n"),
            &["line 3: allocation '1.5' is not a decimal 0.00-1.00 of at most 4 characters"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,1,-1\n"),
            &["line 3: allocation '-1' is not a decimal"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,1,half\n"),
            &["line 3: allocation 'half' is not a decimal"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,1,1\n1,lba:ge:100,2,1\n"),
            &["line 4: IO class id 1 appears twice (first on line 3)"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,300,1\n"),
            &["line 3: eviction priority '300' is not 0-255 (or empty: pinned)"],
        ),
        (
            csv("0,unclassified,22,1\n99,request_size:le:4096,1,1\n"),
            &["line 3: IO class id '99' is not 0-33"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:le:4096,1\n"),
            &["line 3: 3 fields, want 4"],
        ),
        (
            csv("0,unclassified,22,1\n1,request_size:xx:4096,1,1\n"),
            &[
                "line 3: unknown operator 'xx' in rule 'request_size:xx:4096' (want eq, ne, lt, gt, le or ge)",
            ],
        ),
        (
            csv("1,request_size:le:4096,1,1\n"),
            &["line 1: no class 0 (a row '0,unclassified,<priority>,<allocation>' is needed)"],
        ),
    ] {
        std::fs::write(&f, &text).unwrap();
        refused(
            &dm.socket,
            &["io-class", "load", "--cache-id", "1", "--file", &f],
            1,
            want,
        );
    }
    refused(
        &dm.socket,
        &[
            "io-class",
            "load",
            "--cache-id",
            "1",
            "--file",
            &d.path("none.csv"),
        ],
        1,
        &[&format!(
            "{}: No such file or directory",
            d.path("none.csv")
        )],
    );
    assert_eq!(state(&dm), before, "a refused CSV changed something");
    dm.shutdown();
}

/// A second daemon in the same directory (its own sockets and log).
fn second(d: &Dir) -> Daemon {
    let mut o = Opts::new(d).socket(&d.path("b.sock")).log(d.path("b.log"));
    o.nbd = Some(d.path("b-nbd.sock"));
    Daemon::start(o)
}

#[test]
fn devices_too_small_in_use_elsewhere_or_holding_another_cache() {
    let d = Dir::new("bad-dev");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 64 << 20);
    let tiny = d.sparse("tiny.img", 1 << 20);
    let a = Daemon::start(Opts::new(&d));
    // Too small.
    refused(
        &a.socket,
        &["start-cache", "--cache-device", &tiny],
        1,
        &["the cache device (1048576 bytes) is too small for its metadata and one 4k line"],
    );
    refused(
        &a.socket,
        &["start-cache", "--cache-device", &tiny, "--mode", "wl"],
        1,
        &["too small for a write log"],
    );
    refused(
        &a.socket,
        &["start-cache", "--cache-device", "ram:32k"],
        1,
        &["a cache needs at least 16 lines, this one has 8"],
    );
    assert_eq!(std::fs::metadata(&tiny).unwrap().len(), 1 << 20);
    assert!(bytes(&tiny).iter().all(|&b| b == 0), "tiny.img was written");
    assert_eq!(a.json(&["list"]), serde_json::json!([]));

    // In use by another daemon: the second one is refused, whatever it asks.
    a.ok(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    a.add_core(1, &core, "a");
    a.write_flushed("a", 0, &[7u8; 4096]);
    let b = second(&d);
    b.ok(&["start-cache", "--cache-device", "ram:64m"]);
    let b_before = state(&b);
    let cache_bytes = bytes(&cache);
    let in_use = format!("{cache} is in use by another process");
    for args in [
        &["start-cache", "--cache-device", &cache, "--load"][..],
        &["start-cache", "--cache-device", &cache, "--force"],
        &["start-cache", "--cache-device", &cache],
    ] {
        refused(
            &b.socket,
            args,
            1,
            &[&in_use, "stop the cache that uses it there first"],
        );
    }
    refused(
        &b.socket,
        &["add-core", "--cache-id", "1", "--core-device", &core],
        1,
        &[&format!("{core} is in use by another process")],
    );
    refused(
        &b.socket,
        &["add-core", "--cache-id", "1", "--core-device", &cache],
        1,
        &[&in_use],
    );
    assert_eq!(state(&b), b_before);
    assert!(
        bytes(&cache) == cache_bytes,
        "the refused daemon wrote the cache device"
    );
    // The first daemon was not disturbed.
    let mut buf = vec![0u8; 4096];
    a.nbd("a").unwrap().read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![7u8; 4096]);

    // Within one daemon: a device that is already a cache or a core here, by name.
    refused(
        &a.socket,
        &["start-cache", "--cache-device", &cache, "--force"],
        1,
        &[&format!("{cache} is already cache 1")],
    );
    a.ok(&[
        "start-cache",
        "--cache-device",
        "ram:64m",
        "--cache-id",
        "2",
    ]);
    refused(
        &a.socket,
        &["add-core", "--cache-id", "2", "--core-device", &core],
        1,
        &[&format!("{core} is already core 0 of cache 1")],
    );

    // Stopped there, the device holds that cache: refused without --load or --force, here
    // and in the other daemon, and loaded with --load.
    a.ok(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    refused(
        &a.socket,
        &["start-cache", "--cache-device", &cache],
        1,
        &[
            "holds tiercache cache",
            "--load to load it, or --force to format it",
        ],
    );
    a.shutdown();
    let stopped = bytes(&cache);
    refused(
        &b.socket,
        &["start-cache", "--cache-device", &cache, "--mode", "wt"],
        1,
        &["holds tiercache cache"],
    );
    assert!(
        bytes(&cache) == stopped,
        "a refused start-cache wrote the device"
    );
    let v = b.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "running", "{v}");
    let mut buf = vec![0u8; 4096];
    b.nbd("a").unwrap().read(0, &mut buf).unwrap();
    assert_eq!(buf, vec![7u8; 4096], "the dirty data came along");
    b.shutdown();
}

#[test]
fn load_refuses_a_core_that_was_replaced_or_shrank() {
    let d = Dir::new("bad-core");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 64 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    dm.no_cleaning(1);
    dm.add_core(1, &core, "v");
    dm.write_flushed("v", 8, &[3u8; 4096]);
    dm.ok(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    let moved = d.path("core.real");

    // Another file at the same path (same size): the cache loads, the core is refused (it
    // would get dirty data that belongs to the real one).
    std::fs::rename(&core, &moved).unwrap();
    sparse(&core, 64 << 20);
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "incomplete", "{v}");
    let why = v["cores_not_attached"].as_array().unwrap();
    assert_eq!(why.len(), 1, "{v}");
    let why = why[0].as_str().unwrap();
    let ino = |p: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert!(
        why.starts_with(&format!(
            "core 0 ({core}): core 0 of cache 1 was recorded as file inode {} on file system ",
            ino(&moved)
        )),
        "{why}"
    );
    assert!(
        why.contains(&format!(
            "; {core} is file inode {} on file system ",
            ino(&core)
        )),
        "{why}"
    );
    assert!(why.ends_with(": not the same device"), "{why}");
    assert!(!why.contains('\n'));
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "incomplete");
    assert_eq!(l[0]["cores"][0]["state"], "detached");
    assert!(
        dm.nbd("v").is_err(),
        "an incomplete cache's core is not served"
    );
    refused(
        &dm.socket,
        &["add-core", "--cache-id", "1", "--core-device", &core],
        1,
        &["is none of its recorded cores"],
    );
    assert!(
        bytes(&core).iter().all(|&b| b == 0),
        "the impostor was written"
    );
    dm.ok(&["stop-cache", "--cache-id", "1", "--no-writeback"]);

    // The real core, shrunk: refused the same way.
    std::fs::rename(&moved, &core).unwrap();
    common::resize(&core, 32 << 20);
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "incomplete", "{v}");
    assert_eq!(
        v["cores_not_attached"][0],
        format!(
            "core 0 ({core}): core 0 of cache 1 was 67108864 bytes, {core} is 33554432: it shrank, or it is not the same device"
        )
    );
    assert!(dm.nbd("v").is_err());
    // Its size back: attached, and the dirty data is there.
    common::resize(&core, 64 << 20);
    let v = dm.json(&["add-core", "--cache-id", "1", "--core-device", &core]);
    assert_eq!(v["state"], "running", "{v}");
    let mut buf = vec![0u8; 4096];
    dm.nbd("v").unwrap().read(8, &mut buf).unwrap();
    assert_eq!(buf, vec![3u8; 4096]);
    dm.shutdown();
}

#[test]
fn mode_names_are_taken_in_any_case_on_the_command_line_and_in_the_config() {
    let d = Dir::new("bad-modecase");
    let a = d.sparse("a.img", 64 << 20);
    let b = d.sparse("b.img", 64 << 20);
    let c = d.sparse("c.img", 64 << 20);
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!("[[cache]]\nid = 3\ndevice = \"{c}\"\nmode = \"WL\"\n"),
    )
    .unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    dm.ok(&["start-cache", "--cache-device", &a, "--mode", "WL"]);
    dm.ok(&["start-cache", "--cache-device", &b, "--mode", "Wb"]);
    let modes = |dm: &Daemon| -> Vec<String> {
        dm.json(&["list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|c| format!("{}:{}", c["cache_id"], c["mode"].as_str().unwrap()))
            .collect()
    };
    assert_eq!(modes(&dm), ["1:wl", "2:wb", "3:wl"]);
    let v = dm.json(&["set-mode", "--cache-id", "2", "--mode", "WT"]);
    assert_eq!(v["mode"], "wt", "{v}");
    // Refusals are the same whatever the case.
    refused(
        &dm.socket,
        &["set-mode", "--cache-id", "2", "--mode", "Wl"],
        1,
        &["cannot switch to or from mode wl"],
    );
    refused(
        &dm.socket,
        &["set-mode", "--cache-id", "1", "--mode", "WB"],
        1,
        &["cannot switch to or from mode wl"],
    );
    refused(
        &dm.socket,
        &["start-cache", "--cache-device", "ram:64m", "--mode", "WL"],
        1,
        &["ram: device loses"],
    );
    assert_eq!(modes(&dm), ["1:wl", "2:wt", "3:wl"]);
    dm.shutdown();
}

#[test]
fn config_cores_that_do_not_attach_at_start_are_listed_with_their_error() {
    let d = Dir::new("bad-cfgcore");
    let c1 = d.sparse("c1.img", 64 << 20);
    let here = d.sparse("here.img", 16 << 20);
    let gone = d.path("gone.img");
    let gone2 = d.path("gone2.img");
    let junk = d.path("junk.img");
    std::fs::write(&junk, vec![0x5au8; 1 << 20]).unwrap();
    let j0 = d.sparse("j0.img", 16 << 20);
    // Cache 4: loaded from its device, its recorded core missing now (incomplete).
    let c4 = d.sparse("c4.img", 64 << 20);
    let c4core = d.sparse("c4core.img", 16 << 20);
    {
        let dm = Daemon::start(Opts::new(&d));
        dm.ok(&["start-cache", "--cache-device", &c4, "--cache-id", "4"]);
        dm.ok(&["add-core", "--cache-id", "4", "--core-device", &c4core]);
        dm.ok(&["stop-cache", "--cache-id", "4"]);
        dm.shutdown();
    }
    std::fs::remove_file(&c4core).unwrap();
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{c1}\"\n\
             [[cache.core]]\nid = 0\ndevice = \"{gone}\"\nexport = \"gone\"\n\
             [[cache.core]]\nid = 1\ndevice = \"{here}\"\nexport = \"here\"\n\
             [[cache.core]]\nid = 2\ndevice = \"{gone2}\"\nexport = \"gone2\"\n\
             [[cache]]\nid = 3\ndevice = \"{junk}\"\n\
             [[cache.core]]\nid = 0\ndevice = \"{j0}\"\nexport = \"j0\"\n\
             [[cache]]\nid = 4\ndevice = \"{c4}\"\n\
             [[cache.core]]\nid = 0\ndevice = \"{c4core}\"\nexport = \"c4\"\n"
        ),
    )
    .unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let l = dm.json(&["list"]);
    let core = |cache: usize, core: usize| l[cache]["cores"][core].clone();
    // A running cache lists the configured core that did not attach, with the error.
    assert_eq!(l[0]["state"], "running", "{l}");
    let k = core(0, 0);
    assert_eq!(k["core_id"], 0, "{l}");
    assert_eq!(k["state"], "detached", "{l}");
    assert_eq!(k["device"], gone.as_str(), "{l}");
    assert_eq!(k["export"], "gone", "{l}");
    let why = k["reason"].as_str().unwrap();
    assert!(
        why.contains("not attached at start")
            && why.contains(&format!("{gone}: no such file or device"))
            && why.contains(&format!(
                "`tiercache add-core --cache-id 1 --core-device {gone}`"
            )),
        "{why}"
    );
    assert_eq!(core(0, 1)["state"], "running", "{l}");
    assert_eq!(core(0, 2)["state"], "detached", "{l}");
    // A cache that did not start lists its cores, not served.
    assert_eq!(l[1]["state"], "detached", "{l}");
    let k = core(1, 0);
    assert_eq!(k["state"], "detached", "{l}");
    assert!(
        k["reason"]
            .as_str()
            .unwrap()
            .contains("the cache did not start: not served"),
        "{l}"
    );
    // An incomplete cache's recorded core says why it is not attached.
    assert_eq!(l[2]["state"], "incomplete", "{l}");
    let why = core(2, 0)["reason"].as_str().unwrap().to_string();
    assert!(why.contains("no such file or device"), "{l}");
    // The table says it too.
    let (ok, text, _) = dm.tc(&["list"]);
    assert!(ok, "{text}");
    let line = text.lines().find(|x| x.contains("gone.img")).unwrap();
    assert!(
        line.contains("detached") && line.contains("no such file or device"),
        "{text}"
    );
    // Not served, and verbs on it say why in one line; stats shows the attached cores.
    let e = dm.nbd("gone").unwrap_err();
    assert!(!e.is_empty());
    dm.fails(
        &["writeback", "--cache-id", "1", "--core-id", "0"],
        "core 0 of cache 1 is not attached at start",
    );
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["cores"].as_array().unwrap().len(), 1, "{s}");
    // Fixed: add-core by its device attaches it in its place, with its export name.
    sparse(&gone, 16 << 20);
    let v = dm.json(&["add-core", "--cache-id", "1", "--core-device", &gone]);
    assert_eq!(v["core_id"], 0, "{v}");
    assert_eq!(v["export"], "gone", "{v}");
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["cores"][0]["state"], "running", "{l}");
    assert!(
        l[0]["cores"][0]["reason"].as_str().unwrap().is_empty(),
        "{l}"
    );
    dm.write_flushed("gone", 0, &[7u8; 4096]);
    // remove-core drops one that never attached.
    dm.json(&["remove-core", "--cache-id", "1", "--core-id", "2"]);
    let l = dm.json(&["list"]);
    let ids: Vec<u64> = l[0]["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["core_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [0, 1], "{l}");
    dm.shutdown();
}
