//! The command line itself: enumerated options refused while parsing with the allowed values
//! named, parameter groups as subcommands, times with units (`--io-timeout 1h`), shell
//! completions and man pages generated from the parser, `--version`, `check`'s exit statuses
//! and `--json`, and every parameter of every group read back by `set-param` exactly as
//! `get-param` printed it (through a running daemon, which the test starts and stops).

mod common;

use common::{Daemon, Dir, Opts, refused, tc_at};
use serde_json::Value;

/// An admin socket no daemon listens on.
const NO_DAEMON: &str = "/nonexistent/tiercache-test.sock";

/// `tiercache ARGS` with no daemon anywhere.
fn tc(args: &[&str]) -> (i32, String, String) {
    tc_at(NO_DAEMON, args)
}

/// Refused while parsing: exit 2, one line naming every one of `want`, nothing on stdout.
fn usage(args: &[&str], want: &[&str]) {
    refused(NO_DAEMON, args, 2, want);
}

#[test]
fn enumerated_options_refuse_a_bad_value_while_parsing_and_list_the_allowed_ones() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["start-cache", "--cache-device", "x", "--mode", "fast"],
            "[possible values: wt, wb, wa, wi, pt, wo, wl]",
        ),
        (
            &["start-cache", "--cache-device", "x", "--line-size", "3k"],
            "[possible values: 4k, 8k, 16k, 32k, 64k]",
        ),
        (
            &["set-mode", "--cache-id", "1", "--mode", "w b"],
            "[possible values: wt, wb, wa, wi, pt, wo, wl]",
        ),
        (
            &["daemon", "--log-level", "loud"],
            "[possible values: error, warn, info, debug]",
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
            "[possible values: always, full, never]",
        ),
        (
            &["set-param", "--cache-id", "1", "cleaning", "--policy", "x"],
            "[possible values: alru, acp, nop]",
        ),
        (
            &["set-param", "--cache-id", "1", "promotion", "--policy", "x"],
            "[possible values: always, nhit]",
        ),
        (
            &["completions", "tcsh"],
            "[possible values: bash, elvish, fish, powershell, zsh]",
        ),
        (
            &["bench", "--seq-cutoff", "sometimes"],
            "[possible values: always, full, never]",
        ),
        (&["bench", "--core", "nfs"], "[possible values: emu, rbd]"),
        (
            &["bench", "--load-generator", "x"],
            "[possible values: auto, fio, own]",
        ),
        (
            &["bench", "--mode", "fast"],
            "[possible values: wt, wb, wa, wi, pt, wo, wl]",
        ),
        (
            &["bench", "core", "--eviction", "fifo"],
            "[possible values: lru, s3fifo]",
        ),
        (
            &["bench", "wb-hits", "--path", "x"],
            "[possible values: reactor, threaded, both]",
        ),
        (
            &["sim", "mrc", "--trace", "t", "--method", "x"],
            "[possible values: auto, stack, shards, core]",
        ),
        (
            &["sim", "mrc", "--trace", "t", "--cutoff", "x"],
            "[possible values: always, full, never]",
        ),
        (
            &["sim", "devices", "--trace", "t", "--format", "x"],
            "[possible values: auto, csv, blkparse",
        ),
    ];
    for (args, values) in cases {
        usage(args, &["invalid value", values, "see 'tiercache "]);
    }
}

#[test]
fn parameter_groups_are_subcommands_and_their_parameters_are_checked_while_parsing() {
    // `set-param GROUP --help` lists the group's parameters with units.
    let (c, out, _) = tc(&["set-param", "cleaning-alru", "--help"]);
    assert_eq!(c, 0);
    for p in [
        "--wake-up <TIME>",
        "--staleness-time <TIME>",
        "--flush-max-buffers <N>",
        "--activity-threshold <TIME>",
        "a bare number is seconds",
        "a bare number is milliseconds",
    ] {
        assert!(out.contains(p), "{p}: {out}");
    }
    let (c, out, _) = tc(&["set-param", "--help"]);
    assert_eq!(c, 0);
    for g in [
        "seq-cutoff",
        "cleaning-alru",
        "cleaning-acp",
        "promotion-nhit",
        "wl-writeback",
    ] {
        assert!(out.contains(g), "{g}: {out}");
    }
    usage(
        &["set-param", "--cache-id", "1", "cleaning", "--bogus", "1"],
        &[
            "unexpected argument '--bogus'",
            "see 'tiercache set-param cleaning --help'",
        ],
    );
    usage(
        &["set-param", "--cache-id", "1", "nonsense", "--policy", "x"],
        &["unrecognized subcommand 'nonsense'", "set-param --help"],
    );
    usage(
        &["set-param", "--cache-id", "1", "cleaning"],
        &["required arguments were not provided", "--policy"],
    );
    usage(
        &["set-param", "cleaning", "--policy", "nop"],
        &["required arguments were not provided: --cache-id"],
    );
    usage(
        &["get-param", "cleaning"],
        &["required arguments were not provided: --cache-id"],
    );
    usage(
        &[
            "set-param",
            "--cache-id",
            "1",
            "cleaning-alru",
            "--wake-up",
            "soon",
        ],
        &["invalid value 'soon' for '--wake-up <TIME>'", "not a time"],
    );
    usage(
        &[
            "set-param",
            "--cache-id",
            "1",
            "seq-cutoff",
            "--threshold",
            "12q",
        ],
        &["not a size"],
    );
    usage(
        &[
            "set-param",
            "--cache-id",
            "1",
            "promotion-nhit",
            "--trigger",
            "lots",
        ],
        &["not a percentage"],
    );
    // Spellings scripts use: the group's old alias, casadm's long names, --json and --socket
    // after the parameters, --key=value. They parse (and then fail only to reach a daemon).
    for args in [
        &[
            "set-param",
            "--cache-id",
            "1",
            "seq-detect",
            "--promotion-count",
            "8",
        ][..],
        &[
            "set-param",
            "--cache-id",
            "1",
            "promotion-nhit",
            "--insertion-threshold",
            "3",
        ],
        &[
            "set-param",
            "--cache-id",
            "1",
            "promotion-nhit",
            "--trigger-threshold=80",
        ],
        &[
            "set-param",
            "--cache-id",
            "1",
            "cleaning",
            "--policy",
            "nop",
            "--json",
        ],
        &[
            "get-param",
            "--cache-id",
            "1",
            "seq-cutoff",
            "--core-id",
            "0",
            "--json",
        ],
        &[
            "set-param",
            "cleaning",
            "--policy",
            "nop",
            "--cache-id",
            "1",
        ],
    ] {
        let (c, _, err) = tc(args);
        assert_eq!(c, 1, "{args:?}: {err}");
        assert!(err.contains("cannot reach the daemon"), "{args:?}: {err}");
    }
}

#[test]
fn times_take_units_and_the_io_timeout_range_is_the_one_the_message_gives() {
    for t in ["1h", "10ms", "30s", "2m", "1.5s", "90", "1m 30s"] {
        for verb in [
            &["start-cache", "--cache-device", "x"][..],
            &["add-core", "--cache-id", "1", "--core-device", "x"],
        ] {
            let args = [verb, &["--io-timeout", t]].concat();
            let (c, _, err) = tc(&args);
            assert_eq!(c, 1, "{args:?} parses: {err}");
            assert!(err.contains("cannot reach the daemon"), "{args:?}: {err}");
        }
    }
    for t in ["2h", "5ms", "61m", "-1s", "soon", "1M"] {
        usage(
            &[
                "start-cache",
                "--cache-device",
                "x",
                &format!("--io-timeout={t}"),
            ],
            &["want a time from 10ms to 1h", "a bare number is seconds"],
        );
    }
}

#[test]
fn help_says_what_a_new_user_needs() {
    let (c, out, _) = tc(&["--help"]);
    assert_eq!(c, 0);
    assert!(out.starts_with("A userspace block cache"), "{out}");
    for h in [
        "Daemon:",
        "Caches and cores:",
        "Tune:",
        "Examples:",
        "Offline",
    ] {
        assert!(out.contains(h), "{h}: {out}");
    }
    let (c, out, _) = tc(&["start-cache", "--help"]);
    assert_eq!(c, 0);
    assert!(out.contains("- wl:") && out.contains("default wt"), "{out}");
    let (c, out, _) = tc(&["check", "--help"]);
    assert_eq!(c, 0);
    for s in [
        "0  the cache loads",
        "1  damaged",
        "2  usage",
        "3  cannot open",
    ] {
        assert!(out.contains(s), "{s}: {out}");
    }
}

#[test]
fn version_names_the_commit_and_what_this_machine_offers() {
    for flag in ["--version", "-V"] {
        let (c, out, _) = tc(&[flag]);
        assert_eq!(c, 0);
        let first = out.lines().next().unwrap_or("");
        assert!(
            first.starts_with("tiercache 0.") && first.contains("(commit "),
            "{out}"
        );
        assert!(out.contains("\nio_uring: "), "{out}");
        assert!(out.contains("\nlibrbd: "), "{out}");
        assert!(out.contains(" profile"), "{out}");
    }
}

#[test]
fn completions_and_man_pages_are_generated_from_the_parser() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef tiercache"),
        ("fish", "complete -c tiercache"),
        ("elvish", "tiercache"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let (c, out, err) = tc(&["completions", shell]);
        assert_eq!(c, 0, "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: no '{marker}'");
        for w in [
            "set-param",
            "cleaning-alru",
            "staleness-time",
            "start-cache",
        ] {
            assert!(out.contains(w), "{shell}: no '{w}'");
        }
    }
    let (c, out, _) = tc(&["man"]);
    assert_eq!(c, 0);
    assert!(
        out.starts_with(".ie") || out.contains(".TH tiercache"),
        "{out}"
    );
    assert!(out.contains("start"), "{out}");
    let d = Dir::new("cli-man");
    let dir = d.path("man1");
    let (c, out, err) = tc(&["man", "--out", &dir]);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("man pages written"), "{out}");
    for page in [
        "tiercache.1",
        "tiercache-start-cache.1",
        "tiercache-set-param-cleaning-alru.1",
        "tiercache-check.1",
    ] {
        let t = std::fs::read_to_string(format!("{dir}/{page}")).unwrap_or_default();
        assert!(t.contains(".TH"), "{page}: {t}");
    }
    let check = std::fs::read_to_string(format!("{dir}/tiercache-check.1")).unwrap();
    assert!(check.contains("cannot open or read the device"), "{check}");
}

/// `get-param GROUP` as text: `key: value` lines (seq-cutoff: one core's).
fn text_params(socket: &str, cache: &str, group: &str) -> Vec<(String, String)> {
    let mut args = vec!["get-param", "--cache-id", cache, group];
    if group == "seq-cutoff" {
        args.extend(["--core-id", "0"]);
    }
    let (c, out, err) = tc_at(socket, &args);
    assert_eq!(c, 0, "{args:?}: {err}");
    let mut kv: Vec<(String, String)> = out
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(k, _)| k.trim() != "core_id")
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    kv.sort();
    kv
}

/// `set-param GROUP --k v ...` with every (k, v).
fn set_all(dm: &Daemon, cache: &str, group: &str, kv: &[(String, String)]) -> String {
    let mut args: Vec<String> = ["set-param", "--cache-id", cache, group]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if group == "seq-cutoff" {
        args.extend(["--core-id".into(), "0".into()]);
    }
    for (k, v) in kv {
        args.push(format!("--{k}"));
        args.push(v.clone());
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    dm.ok(&a)
}

/// (cache id, group, parameters given, what get-param then prints for them).
type Case<'a> = (
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a [(&'a str, &'a str)],
);

/// Sets each case's parameters and sees get-param print them as the case says.
fn set_and_see(dm: &Daemon, cases: &[Case]) {
    for (id, g, set, shown) in cases {
        let kv: Vec<(String, String)> = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        set_all(dm, id, g, &kv);
        let now = text_params(&dm.socket, id, g);
        for (k, v) in *shown {
            assert!(
                now.contains(&(k.to_string(), v.to_string())),
                "{g} --{k} {set:?}: want {v}: {now:?}"
            );
        }
    }
}

const GROUPS: [&str; 6] = [
    "seq-cutoff",
    "cleaning",
    "cleaning-alru",
    "cleaning-acp",
    "promotion",
    "promotion-nhit",
];

#[test]
fn every_parameter_round_trips_through_get_param_and_set_param() {
    let d = Dir::new("cli-params");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 64 << 20);
    let wl_cache = d.sparse("wl-cache.img", 64 << 20);
    let wl_core = d.sparse("wl-core.img", 64 << 20);
    let dm = Daemon::start(Opts::new(&d));
    let s = dm.socket.clone();
    dm.ok(&["start-cache", "--cache-device", &cache, "--mode", "wb"]);
    dm.ok(&["add-core", "--cache-id", "1", "--core-device", &core]);
    dm.ok(&[
        "start-cache",
        "--cache-device",
        &wl_cache,
        "--mode",
        "wl",
        "--cache-id",
        "2",
    ]);
    dm.ok(&["add-core", "--cache-id", "2", "--core-device", &wl_core]);
    let every: Vec<(&str, &str)> = GROUPS
        .iter()
        .map(|g| ("1", *g))
        .chain([("2", "wl-writeback")])
        .collect();

    // Units are shown with every value that has one.
    let alru = text_params(&s, "1", "cleaning-alru");
    assert_eq!(
        alru,
        [
            ("activity-threshold", "10s"),
            ("flush-max-buffers", "100"),
            ("staleness-time", "2m"),
            ("wake-up", "20s"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
        "{alru:?}"
    );
    // JSON: numbers, each with its unit in the key.
    assert_eq!(
        dm.json(&["get-param", "--cache-id", "1", "cleaning-alru"]),
        serde_json::json!({"activity_threshold_ms": 10_000, "flush_max_buffers": 100,
            "staleness_time_s": 120, "wake_up_s": 20})
    );
    assert_eq!(
        dm.json(&["get-param", "--cache-id", "1", "seq-cutoff"])[0]["threshold_bytes"],
        1 << 20
    );
    let cut = text_params(&s, "1", "seq-cutoff");
    assert!(
        cut.contains(&("threshold".into(), "1MiB".into())),
        "{cut:?}"
    );

    // Defaults, then values set with bare numbers in each parameter's old unit, then with
    // units: each time, the text get-param prints, given back to set-param, changes nothing.
    let check_round_trip = |what: &str| {
        for (id, g) in &every {
            let before = text_params(&s, id, g);
            assert!(!before.is_empty(), "{g}");
            let json_before = dm.json(&["get-param", "--cache-id", id, g]);
            let echo = set_all(&dm, id, g, &before);
            assert_eq!(
                text_params(&s, id, g),
                before,
                "{what}: {g} changed by its own values; set-param said:\n{echo}"
            );
            // The JSON values given back change nothing either.
            let obj = if json_before.is_array() {
                json_before[0].clone()
            } else {
                json_before.clone()
            };
            let kv: Vec<(String, String)> = obj
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| *k != "core_id")
                .map(|(k, v)| {
                    // Numbers, the unit in the key (`wake_up_s`), never strings with units.
                    assert!(
                        v.is_number() || k == "policy",
                        "{g} {k}: a JSON number: {json_before}"
                    );
                    tiercache_daemon::registry::param_text(k, v)
                })
                .collect();
            set_all(&dm, id, g, &kv);
            assert_eq!(
                dm.json(&["get-param", "--cache-id", id, g]),
                json_before,
                "{what}: {g}: JSON given back"
            );
        }
    };
    check_round_trip("defaults");

    let bare: &[Case] = &[
        (
            "1",
            "seq-cutoff",
            &[("threshold", "1536"), ("policy", "always")],
            &[("threshold", "1536KiB"), ("policy", "always")],
        ),
        (
            "1",
            "cleaning-alru",
            &[("wake-up", "90"), ("activity-threshold", "1500")],
            &[("wake-up", "90s"), ("activity-threshold", "1500ms")],
        ),
        (
            "1",
            "cleaning-acp",
            &[("wake-up", "20")],
            &[("wake-up", "20ms")],
        ),
        (
            "1",
            "promotion-nhit",
            &[("trigger", "75")],
            &[("trigger", "75%")],
        ),
        (
            "2",
            "wl-writeback",
            &[
                ("idle", "3600000"),
                ("expire", "120"),
                ("background-fill", "90"),
            ],
            &[("idle", "1h"), ("expire", "2m"), ("background-fill", "90%")],
        ),
    ];
    set_and_see(&dm, bare);
    check_round_trip("bare numbers");

    let with_units: &[Case] = &[
        (
            "1",
            "seq-cutoff",
            &[("threshold", "2m")],
            &[("threshold", "2MiB")],
        ),
        (
            "1",
            "cleaning-alru",
            &[
                ("wake-up", "1m"),
                ("staleness-time", "1h"),
                ("activity-threshold", "2.5s"),
            ],
            &[
                ("wake-up", "1m"),
                ("staleness-time", "1h"),
                ("activity-threshold", "2500ms"),
            ],
        ),
        (
            "1",
            "cleaning-acp",
            &[("wake-up", "1s")],
            &[("wake-up", "1s")],
        ),
        (
            "2",
            "wl-writeback",
            &[("idle", "250ms"), ("expire", "1m 30s")],
            &[("idle", "250ms"), ("expire", "90s")],
        ),
    ];
    set_and_see(&dm, with_units);
    check_round_trip("units");

    // Out of range or not a whole number of the parameter's unit: one line, nothing changed.
    let before: Vec<_> = every.iter().map(|(id, g)| text_params(&s, id, g)).collect();
    for (args, want) in [
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "cleaning-alru",
                "--wake-up",
                "1500ms",
            ][..],
            "wake-up = '1500ms': want a time from 0s to 1h in whole seconds",
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "cleaning-alru",
                "--staleness-time",
                "2h",
            ],
            "staleness-time = '2h': want a time from 1s to 1h",
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "cleaning-acp",
                "--wake-up",
                "11s",
            ],
            "wake-up = '11s': want a time from 0s to 10s in whole milliseconds",
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "1",
                "promotion-nhit",
                "--trigger",
                "101%",
            ],
            "trigger = '101%': want a percentage from 0% to 100%",
        ),
        (
            &[
                "set-param",
                "--cache-id",
                "2",
                "wl-writeback",
                "--idle",
                "5",
                "--expire",
                "2d",
            ],
            "expire = '2d': want a time from 0s to 24h",
        ),
    ] {
        dm.fails(args, want);
    }
    let after: Vec<_> = every.iter().map(|(id, g)| text_params(&s, id, g)).collect();
    assert_eq!(before, after, "a refused set-param changed something");

    // check on a cache device: loads (0), JSON says so; the daemon is stopped first.
    dm.ok(&["stop-cache", "--cache-id", "1"]);
    dm.shutdown();
    let (c, out, err) = tc(&["check", "--cache-device", &cache, "--json"]);
    assert_eq!(c, 0, "{out}{err}");
    let j: Value = serde_json::from_str(&out).expect("check --json");
    assert_eq!(j["result"], "clean", "{j}");
    assert_eq!(j["exit_code"], 0, "{j}");
    assert_eq!(j["load"]["ok"], true, "{j}");
    assert_eq!(j["superblocks"][0]["ok"], true, "{j}");
}

#[test]
fn check_exit_status_says_damaged_usage_or_cannot_open() {
    let d = Dir::new("cli-check");
    // Cannot open: 3, one line, nothing on stdout (text) or a JSON verdict.
    let (c, out, err) = tc(&["check", "--cache-device", "/nonexistent/cache.img"]);
    assert_eq!(c, 3, "{err}");
    assert_eq!(out, "");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("tiercache: cannot open"), "{err}");
    let (c, out, _) = tc(&[
        "check",
        "--cache-device",
        "/nonexistent/cache.img",
        "--json",
    ]);
    assert_eq!(c, 3);
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["result"], "cannot-open", "{j}");
    assert_eq!(j["exit_code"], 3, "{j}");
    // A directory opens but cannot be read.
    let (c, _, err) = tc(&["check", "--cache-device", &d.0.display().to_string()]);
    assert_eq!(c, 3, "{err}");
    // Not a cache (zeros): damaged, 1.
    let zeros = d.path("zeros.img");
    std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
    let (c, out, err) = tc(&["check", "--cache-device", &zeros]);
    assert_eq!(c, 1, "{out}{err}");
    assert!(out.contains("no usable superblock"), "{out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (c, out, _) = tc(&["check", "--cache-device", &zeros, "--json"]);
    assert_eq!(c, 1);
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["result"], "damaged", "{j}");
    assert_eq!(j["superblocks"][0]["ok"], false, "{j}");
    // Usage: 2.
    usage(&["check"], &["--cache-device"]);
    usage(&["check", "--cache-device", &zeros, "--jsn"], &["--jsn"]);
}

#[test]
fn arguments_that_are_not_utf8_are_a_usage_error_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(b"x\xff");
    for args in [
        vec![bad],
        vec!["start-cache".as_ref(), "--cache-device".as_ref(), bad],
        vec![
            "set-param".as_ref(),
            "--cache-id".as_ref(),
            "1".as_ref(),
            bad,
        ],
    ] {
        let o = std::process::Command::new(common::BIN)
            .args(&args)
            .env("TIERCACHE_SOCKET", NO_DAEMON)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
