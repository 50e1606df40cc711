//! Device faults through the real daemon (SPEC R3, R4, C19; docs/SAFETY.md, "Faults"): the
//! `tiercache` binary as a daemon, cores served by `nbdkit` with its error filter (errors while
//! a file exists, toggled by the test) or its delay filter (a slow core), and a cache device
//! on `faulty:PATH` (errors while `PATH.fail` exists). Each test starts its own nbdkit and
//! daemon processes and stops exactly those.
//!
//! - write-through: core read and write errors reach the client as EIO, the daemon stays up,
//!   `list`/`stats`/metrics say `degraded` and why, the log has one line when it starts and
//!   one when it ends;
//! - write-back: writeback to a failing core is retried and counted, the cache is `degraded`
//!   with the dirty data at risk; `writeback`, `stop-cache` and `remove-core` fail in one line
//!   instead of waiting for ever; once the core works, `stop-cache` writes everything back
//!   (checked on nbdkit's backing file); `stop-cache --no-writeback` keeps the dirty data on
//!   the cache device, and `--load` brings it back;
//! - cache device errors put a write-through cache in pass-through, and it says so until a
//!   probe finds the device working again;
//! - a slow core past its `io_timeout` gives EIO, not a hang.

mod common;

use common::{Daemon, Dir, Opts, Proc, check_set, free_port, have, pattern, sparse, write_set};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_io::{Backend, NbdBackend};

/// The 4 KiB blocks of a file (a core's backing file) hold `version`.
fn check_file(path: &str, blocks: std::ops::Range<u64>, version: u64) {
    let f = std::fs::read(path).unwrap();
    for b in blocks {
        let at = (b * 4096) as usize;
        assert!(
            f[at..at + 4096] == pattern(b, version)[..],
            "{path}: block {b} is not version {version}"
        );
    }
}

/// An nbdkit process started by a test, serving one file on a unix socket; dropping it kills
/// exactly that process.
struct Nbdkit {
    _child: Proc,
    sock: String,
}

impl Nbdkit {
    /// `nbdkit -f -U DIR/NAME.sock FILTERS… file FILE PARAMS…`, ready to connect.
    fn start(d: &Dir, name: &str, filters: &[&str], file: &str, params: &[String]) -> Nbdkit {
        let sock = d.path(&format!("{name}.sock"));
        let mut c = Command::new("nbdkit");
        c.args(["-f", "--exit-with-parent", "-U", &sock])
            .args(filters)
            .arg("file")
            .arg(format!("file={file}"))
            .args(params)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(d.path(&format!("{name}.log"))).expect("nbdkit log file"),
            );
        let _child = Proc::spawn("nbdkit", &mut c);
        let k = Nbdkit { _child, sock };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&k.sock).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nbdkit did not listen on {} within 10 s",
                k.sock
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        k
    }

    /// The core device string for it.
    fn device(&self) -> String {
        format!("nbd:nbd+unix:///?socket={}", self.sock)
    }
}

/// nbdkit with its error filter: every request fails with EIO while `err_file` exists.
fn erroring_core(d: &Dir, file: &str, err_file: &str) -> Nbdkit {
    Nbdkit::start(
        d,
        "core",
        &["--filter=error"],
        file,
        &["error-rate=100%".into(), format!("error-file={err_file}")],
    )
}

/// nbdkit with its delay filter: reads take 10 s; writes are quick (nbdkit 1.32 takes seconds
/// as a bare number).
fn slow_core(d: &Dir, file: &str) -> Nbdkit {
    Nbdkit::start(
        d,
        "core",
        &["--filter=delay"],
        file,
        &["delay-read=10".into()],
    )
}

/// The start of a test on a failing core: the directory `NAME`, a 64 MiB core file served
/// by nbdkit behind its error filter (every request fails while the error file exists) and a
/// cache file of `cache_mib` MiB: (directory, core file, error file, nbdkit, cache file).
/// `None` (a skip line printed) without nbdkit.
fn failing_core(name: &str, cache_mib: u64) -> Option<(Dir, String, String, Nbdkit, String)> {
    if !have("nbdkit") {
        return None;
    }
    let d = Dir::new(name);
    let core_file = d.sparse("core.img", 64 << 20);
    let err = d.path("core.err");
    let core = erroring_core(&d, &core_file, &err);
    let cache = d.sparse("cache.img", cache_mib << 20);
    Some((d, core_file, err, core, cache))
}

/// `GET /metrics`.
fn metrics(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    r
}

/// The value of the metric line starting with `series` (name and labels).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in the metrics:\n{text}"))
        .parse()
        .unwrap()
}

/// A daemon with a metrics listener, from a config file with one cache and one core.
fn daemon(d: &Dir, cache: &str, mode: &str, core: &str, core_extra: &str) -> (Daemon, u16) {
    let cfg = common::cache_config(d, cache, mode, &[(0, core, "vm", core_extra)]);
    let port = free_port();
    let dm = Daemon::start(
        Opts::new(d)
            .config(&cfg)
            .args(&["--metrics-listen", &format!("127.0.0.1:{port}")]),
    );
    (dm, port)
}

/// Waits (up to `secs`) until `f` holds.
fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "not within {secs} s: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log_lines(dm: &Daemon, what: &str) -> usize {
    dm.log().lines().filter(|l| l.contains(what)).count()
}

#[test]
fn write_through_core_errors_reach_the_client_as_eio_and_the_daemon_stays_up() {
    let Some((d, core_file, err, core, cache)) = failing_core("faults-wt", 32) else {
        return;
    };
    let (dm, port) = daemon(&d, &cache, "wt", &core.device(), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..64, 1);
    assert_eq!(dm.json(&["list"])[0]["state"], "running");

    // The core fails every request: misses and write-through writes fail with EIO, hits are
    // still served; many failed IOs, one log line.
    std::fs::write(&err, "").unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..20 {
        let e = vm.read((1000 + i) * 8, &mut buf).unwrap_err();
        assert!(e.to_string().contains("EIO"), "{e}");
    }
    let e = vm.write(2000 * 8, &pattern(2000, 1), false).unwrap_err();
    assert!(e.to_string().contains("EIO"), "{e}");
    check_set(&vm, 0..64, 1);

    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "degraded", "{l}");
    let why = l[0]["reason"].as_str().unwrap();
    assert!(why.contains("core 0 failed an IO"), "{why}");
    assert!(why.contains("IO error"), "{why}");
    assert_eq!(l[0]["cores"][0]["state"], "degraded", "{l}");
    let (ok, text, _) = dm.tc(&["list"]);
    assert!(ok && text.contains("degraded"), "{text}");

    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["state"], "degraded", "{s}");
    let h = &s["health"];
    assert_eq!(h["state"], "degraded", "{h}");
    assert_eq!(h["problems"][0]["kind"], "core_device", "{h}");
    assert_eq!(h["problems"][0]["core_id"], 0, "{h}");
    assert_eq!(h["problems"][0]["error"], "IO error", "{h}");
    assert!(h["problems"][0]["since"].as_str().unwrap().ends_with("UTC"));
    let ce = &s["cores"][0]["health"]["errors"];
    assert!(ce["reads"].as_u64().unwrap() >= 20, "{ce}");
    assert!(ce["writes"].as_u64().unwrap() >= 1, "{ce}");
    assert_eq!(ce["io"], ce["total"], "{ce}");
    // Nothing dirty in write-through: nothing at risk.
    assert_eq!(h["dirty_at_risk_bytes"], 0, "{h}");

    let m = metrics(port);
    assert_eq!(
        metric(&m, r#"tiercache_cache_state{cache="1",state="degraded"}"#),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            r#"tiercache_core_state{cache="1",core="0",export="vm",state="degraded"}"#
        ),
        1.0
    );
    assert!(
        metric(
            &m,
            r#"tiercache_core_device_errors_total{cache="1",core="0",kind="io"}"#
        ) >= 21.0
    );
    assert_eq!(
        metric(&m, r#"tiercache_writeback_failing{cache="1",core="0"}"#),
        0.0
    );

    dm.wait_log("cache degraded");
    // More errors do not log more lines.
    for i in 0..20 {
        assert!(vm.read((3000 + i) * 8, &mut buf).is_err());
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(log_lines(&dm, "msg=\"cache degraded\""), 1, "{}", dm.log());
    let line = dm
        .log()
        .lines()
        .find(|l| l.contains("cache degraded"))
        .unwrap()
        .to_string();
    assert!(
        line.contains("problem=core_device") && line.contains("core=0"),
        "{line}"
    );

    // The core works again: the next IO on it succeeds, the state clears, one line says so.
    std::fs::remove_file(&err).unwrap();
    vm.read(1000 * 8, &mut buf).unwrap();
    assert_eq!(dm.json(&["list"])[0]["state"], "running");
    dm.wait_log("problem cleared");
    write_set(&vm, 64..80, 2);
    check_file(&core_file, 0..64, 1);
    check_file(&core_file, 64..80, 2);
    assert_eq!(log_lines(&dm, "msg=\"cache degraded\""), 1);
    drop(vm);
    dm.shutdown();
}

#[test]
fn write_back_to_a_failing_core_is_retried_and_alarmed_and_stop_refuses_until_it_works() {
    let Some((d, core_file, err, core, cache)) = failing_core("faults-wb", 32) else {
        return;
    };
    let (dm, port) = daemon(&d, &cache, "wb", &core.device(), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..200, 1);
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["usage"]["dirty_lines"], 200, "{s}");
    assert_eq!(s["health"]["dirty_at_risk_bytes"], 0, "{s}");

    // The core fails: `writeback` retries at once, then says in one line why it cannot finish
    // (no hang).
    std::fs::write(&err, "").unwrap();
    let t = Instant::now();
    let msg = dm.fails(&["writeback", "--cache-id", "1"], "writeback to core 0");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    for want in [
        "has been failing since",
        "UTC",
        "IO error",
        "800.0 KiB of dirty data (200 lines) stay on the cache device",
        "--no-writeback",
    ] {
        assert!(msg.contains(want), "want '{want}' in: {msg}");
    }

    // Degraded, with the dirty data at risk, in list, stats and metrics; retried and counted.
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "degraded", "{l}");
    assert!(
        l[0]["reason"]
            .as_str()
            .unwrap()
            .contains("writeback to core 0 failing"),
        "{l}"
    );
    assert_eq!(l[0]["cores"][0]["state"], "degraded", "{l}");
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let h = &s["health"];
    assert_eq!(h["state"], "degraded", "{h}");
    assert_eq!(h["dirty_at_risk_bytes"], 200 * 4096, "{h}");
    assert_eq!(
        h["writeback"]["failing_cores"],
        serde_json::json!([0]),
        "{h}"
    );
    let wb = h["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "writeback")
        .unwrap_or_else(|| panic!("a writeback problem: {h}"));
    assert_eq!(wb["core_id"], 0);
    assert_eq!(wb["dirty_bytes"], 200 * 4096);
    assert_eq!(wb["error"], "IO error");
    let core_h = &s["cores"][0]["health"];
    assert_eq!(core_h["writeback"]["failing"], true, "{core_h}");
    assert_eq!(core_h["dirty_at_risk_bytes"], 200 * 4096, "{core_h}");
    let retries = core_h["writeback"]["retries"].as_u64().unwrap();
    let failures = core_h["writeback"]["failures"].as_u64().unwrap();
    assert!(failures >= 1, "{core_h}");
    wait_until("writeback is retried (backoff)", 15, || {
        let s = dm.json(&["stats", "--cache-id", "1", "--core-id", "0"]);
        s["cores"][0]["health"]["writeback"]["retries"]
            .as_u64()
            .unwrap()
            > retries
    });
    let m = metrics(port);
    assert_eq!(
        metric(&m, r#"tiercache_writeback_failing{cache="1",core="0"}"#),
        1.0
    );
    assert!(
        metric(
            &m,
            r#"tiercache_writeback_failing_seconds{cache="1",core="0"}"#
        ) > 0.0
    );
    assert!(
        metric(
            &m,
            r#"tiercache_writeback_failures_total{cache="1",core="0"}"#
        ) >= 2.0
    );
    assert!(
        metric(
            &m,
            r#"tiercache_writeback_retries_total{cache="1",core="0"}"#
        ) >= 1.0
    );
    assert_eq!(
        metric(&m, r#"tiercache_dirty_at_risk_bytes{cache="1"}"#),
        (200 * 4096) as f64
    );
    assert_eq!(
        metric(&m, r#"tiercache_cache_state{cache="1",state="degraded"}"#),
        1.0
    );
    dm.wait_log("problem=writeback");
    // Clients still read their data (from the cache).
    check_set(&vm, 0..200, 1);

    // stop-cache and remove-core do not wait for ever: one line each, nothing changed.
    let msg = dm.fails(&["stop-cache", "--cache-id", "1"], "writeback to core 0");
    assert!(
        msg.contains("stop-cache --cache-id 1 --no-writeback") && msg.contains("200 lines"),
        "{msg}"
    );
    let msg = dm.fails(
        &["remove-core", "--cache-id", "1", "--core-id", "0"],
        "writeback to core 0",
    );
    assert!(
        msg.contains("invalidate --cache-id 1 --core-id 0 --force"),
        "{msg}"
    );
    dm.fails(
        &[
            "remove-core",
            "--cache-id",
            "1",
            "--core-id",
            "0",
            "--no-writeback",
        ],
        "has dirty data",
    );
    assert_eq!(dm.json(&["list"])[0]["cores"][0]["export"], "vm");
    // Still exactly one line for the problem, however many retries failed.
    assert_eq!(
        log_lines(&dm, "problem=writeback"),
        1,
        "{}",
        dm.log_tail(20)
    );

    // The core works again: stop-cache retries at once and writes everything back.
    std::fs::remove_file(&err).unwrap();
    drop(vm);
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_lines_kept"], 0, "{v}");
    check_file(&core_file, 0..200, 1);
    dm.wait_log("problem cleared");
    dm.shutdown();
}

#[test]
fn stop_without_writeback_keeps_dirty_data_of_a_failing_core_and_load_brings_it_back() {
    let Some((d, core_file, err, core, cache)) = failing_core("faults-nowb", 32) else {
        return;
    };
    let (dm, _) = daemon(&d, &cache, "wb", &core.device(), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..100, 1);
    drop(vm);
    std::fs::write(&err, "").unwrap();
    dm.fails(&["writeback", "--cache-id", "1"], "writeback to core 0");

    // The force path: stop now, dirty data persisted on the cache device.
    let v = dm.json(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    assert_eq!(v["dirty_lines_kept"], 100, "{v}");
    assert_eq!(dm.json(&["list"]), serde_json::json!([]));
    // Nothing of it reached the core.
    let f = std::fs::read(&core_file).unwrap();
    assert!(
        f[..100 * 4096].iter().all(|&b| b == 0),
        "the core was written"
    );

    // Repaired: the cache loads with its dirty data and writes it back.
    std::fs::remove_file(&err).unwrap();
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(v["loaded"]["dirty_lines"], 100, "{v}");
    check_set(&dm.nbd("vm").unwrap(), 0..100, 1);
    let v = dm.json(&["writeback", "--cache-id", "1"]);
    assert_eq!(v["lines_written_back"], 100, "{v}");
    check_file(&core_file, 0..100, 1);
    dm.shutdown();
}

#[test]
fn cache_device_errors_put_a_write_through_cache_in_pass_through_and_say_so() {
    let d = Dir::new("faults-cachedev");
    let cache_file = d.sparse("cache.img", 32 << 20);
    let core_file = d.sparse("core.img", 64 << 20);
    let cache = format!("faulty:{cache_file}");
    let ctl = format!("{cache_file}.fail");
    let (dm, port) = daemon(&d, &cache, "wt", &core_file, "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..64, 1);
    check_set(&vm, 0..64, 1);

    // Every cache device IO fails: clients see nothing, the cache bypasses its device.
    std::fs::write(&ctl, "").unwrap();
    check_set(&vm, 0..64, 1);
    write_set(&vm, 64..128, 2);
    check_set(&vm, 64..128, 2);
    check_set(&vm, 0..64, 1);
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "degraded", "{l}");
    let why = l[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("cache device failing") && why.contains("bypass"),
        "{why}"
    );
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let cd = &s["health"]["cache_device"];
    assert_eq!(cd["bypass"], true, "{cd}");
    assert!(cd["bypassed_requests"].as_u64().unwrap() > 0, "{cd}");
    assert!(cd["errors"]["total"].as_u64().unwrap() > 0, "{cd}");
    assert_eq!(s["health"]["problems"][0]["kind"], "cache_device");
    assert_eq!(
        metric(&metrics(port), r#"tiercache_cache_bypass{cache="1"}"#),
        1.0
    );
    let log = dm.wait_log("problem=cache_device");
    let line = log
        .lines()
        .find(|l| l.contains("problem=cache_device"))
        .unwrap();
    assert!(
        line.contains("msg=\"cache degraded\"") && line.contains("bypass"),
        "{line}"
    );
    check_file(&core_file, 64..128, 2);

    // The device works again: the next probe (1 s after the first error, then doubling) ends
    // the bypass.
    std::fs::remove_file(&ctl).unwrap();
    wait_until("the cache leaves bypass", 10, || {
        dm.json(&["list"])[0]["state"] == "running"
    });
    dm.wait_log("problem cleared");
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert!(s["health"]["cache_device"]["probes_ok"].as_u64().unwrap() >= 1);
    assert_eq!(
        metric(&metrics(port), r#"tiercache_cache_bypass{cache="1"}"#),
        0.0
    );
    write_set(&vm, 128..160, 3);
    check_set(&vm, 0..64, 1);
    check_set(&vm, 128..160, 3);
    drop(vm);
    dm.shutdown();
}

#[test]
fn a_slow_core_past_its_io_timeout_gives_eio_not_a_hang() {
    if !have("nbdkit") {
        return;
    }
    let d = Dir::new("faults-slow");
    let core_file = d.sparse("core.img", 64 << 20);
    let core = slow_core(&d, &core_file);
    let cache = d.sparse("cache.img", 32 << 20);
    let (dm, port) = daemon(&d, &cache, "wt", &core.device(), "io_timeout = \"500ms\"");
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["cores"][0]["io_timeout_ms"], 500, "{l}");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..16, 1);
    check_set(&vm, 0..16, 1);

    // A miss needs the core, which does not answer within 500 ms: EIO after about that long,
    // well before the core would have answered (not a hang; the bound is loose for a busy
    // machine).
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let e = vm.read(4000 * 8, &mut buf).unwrap_err();
    let took = t.elapsed();
    assert!(e.to_string().contains("EIO"), "{e}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(8),
        "{took:?}"
    );
    check_set(&vm, 0..16, 1);
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["cores"][0]["io_timeout_ms"], 500, "{s}");
    let p = &s["health"]["problems"][0];
    assert_eq!(p["kind"], "core_device", "{s}");
    assert_eq!(p["error"], "timed out", "{s}");
    assert!(
        s["cores"][0]["health"]["errors"]["timed_out"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert!(
        metric(
            &metrics(port),
            r#"tiercache_core_device_errors_total{cache="1",core="0",kind="timed_out"}"#
        ) >= 1.0
    );
    assert_eq!(dm.json(&["list"])[0]["state"], "degraded");
    dm.wait_log("error=\"timed out\"");

    // Bad timeouts are refused in one line, before anything changes.
    let other = d.sparse("other.img", 1 << 20);
    dm.fails(
        &[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            &other,
            "--io-timeout",
            "soon",
        ],
        "invalid value 'soon' for '--io-timeout <TIME>'",
    );
    dm.fails(
        &[
            "add-core",
            "--cache-id",
            "1",
            "--core-device",
            &other,
            "--io-timeout",
            "5ms",
        ],
        "10ms to 1h",
    );
    let v = dm.json(&[
        "add-core",
        "--cache-id",
        "1",
        "--core-device",
        &other,
        "--io-timeout",
        "2s",
    ]);
    assert_eq!(v["core_id"], 1, "{v}");
    assert_eq!(dm.json(&["list"])[0]["cores"][1]["io_timeout_ms"], 2000);
    drop(vm);
    dm.shutdown();
}

#[test]
fn a_config_with_a_bad_io_timeout_is_refused_in_one_line() {
    let d = Dir::new("faults-badcfg");
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{}\"\nio_timeout = \"fast\"\n",
            d.path("cache.img")
        ),
    )
    .unwrap();
    sparse(&d.path("cache.img"), 16 << 20);
    let e = match Daemon::try_start(Opts::new(&d).config(&cfg)) {
        Ok(_) => panic!("the daemon started with io_timeout = \"fast\""),
        Err(e) => e,
    };
    assert!(e.contains("cache 1: io timeout 'fast'"), "{e}");
}

#[test]
fn write_log_writeback_to_a_failing_core_fails_in_one_line_and_recovers() {
    let Some((d, core_file, err, core, cache)) = failing_core("faults-wl", 64) else {
        return;
    };
    // The log is written back all the time: fail the core before anything is written.
    std::fs::write(&err, "").unwrap();
    let (dm, _) = daemon(&d, &cache, "wl", &core.device(), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..50, 1);
    check_set(&vm, 0..50, 1);
    let msg = dm.fails(&["writeback", "--cache-id", "1"], "write log of cache 1");
    assert!(
        msg.contains("core 0 has been failing since") && msg.contains("stay in the log"),
        "{msg}"
    );
    dm.fails(&["stop-cache", "--cache-id", "1"], "--no-writeback");
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["state"], "degraded", "{s}");
    assert!(
        s["health"]["dirty_at_risk_bytes"].as_u64().unwrap() >= 50 * 4096,
        "{s}"
    );
    assert!(
        s["health"]["write_log"]["writeback_errors"]
            .as_u64()
            .unwrap()
            > 0,
        "{s}"
    );

    std::fs::remove_file(&err).unwrap();
    drop(vm);
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_bytes_kept"], 0, "{v}");
    check_file(&core_file, 0..50, 1);
    dm.shutdown();
}

#[test]
fn a_core_flush_failing_at_stop_is_reported_once_and_the_cache_stops() {
    let d = Dir::new("faults-stopflush");
    let core_file = d.sparse("core.img", 16 << 20);
    let cache = d.sparse("cache.img", 16 << 20);
    let ctl = format!("{core_file}.fail");
    let (dm, _) = daemon(&d, &cache, "wt", &format!("faulty:{core_file}"), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..16, 1);
    drop(vm);
    // Only flushes fail: the stop's core flushes (while NBD connections may still hold the
    // engine, and when the last one lets go) fail, the cache stops anyway.
    std::fs::write(&ctl, "flush").unwrap();
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["stopped"], true, "{v}");
    let why = v["core_flush_failed"].as_str().unwrap_or_default();
    assert!(
        why.contains("core 0") && why.contains("injected error"),
        "{v}"
    );
    assert_eq!(dm.json(&["list"]), serde_json::json!([]));
    assert_eq!(
        log_lines(&dm, "core flush failed at stop"),
        1,
        "{}",
        dm.log_tail(20)
    );
    std::fs::remove_file(&ctl).unwrap();
    check_file(&core_file, 0..16, 1);
    dm.shutdown();
}

/// A miss on the slow core (reads take 10 s) fails with EIO after about `want`: the core's IO
/// timeout is in force.
fn times_out_after(vm: &NbdBackend, block: u64, want: Duration) {
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let e = vm.read(block * 8, &mut buf).unwrap_err();
    let took = t.elapsed();
    assert!(e.to_string().contains("EIO"), "{e}");
    assert!(
        took >= want.mul_f64(0.8) && took < want + Duration::from_secs(6),
        "timed out after {took:?}, want about {want:?}"
    );
}

#[test]
fn cores_attached_again_by_load_keep_their_io_timeout_and_add_core_can_set_it() {
    if !have("nbdkit") {
        return;
    }
    let d = Dir::new("faults-loadtimeout");
    let core_file = d.sparse("core.img", 64 << 20);
    let core = slow_core(&d, &core_file);
    let cache = d.sparse("cache.img", 32 << 20);
    let dm = Daemon::start(Opts::new(&d));
    dm.ok(&["start-cache", "--cache-device", &cache, "--mode", "wt"]);
    let dev = core.device();
    let add = |dm: &Daemon, t: &str| {
        dm.json(&[
            "add-core",
            "--cache-id",
            "1",
            "--core-id",
            "0",
            "--core-device",
            &dev,
            "--export",
            "vm",
            "--io-timeout",
            t,
        ])
    };
    add(&dm, "500ms");
    let timeout_ms = |dm: &Daemon| dm.json(&["list"])[0]["cores"][0]["io_timeout_ms"].clone();
    assert_eq!(timeout_ms(&dm), 500);

    // Stopped and loaded again: the recorded core comes back with its timeout, in force.
    dm.ok(&["stop-cache", "--cache-id", "1"]);
    let v = dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(timeout_ms(&dm), 500);
    let vm = dm.nbd("vm").unwrap();
    times_out_after(&vm, 1000, Duration::from_millis(500));

    // add-core --io-timeout on the attached core changes it (it said "already attached" and
    // kept the old one).
    let v = add(&dm, "2s");
    assert_eq!(v["already_attached"], true, "{v}");
    assert_eq!(v["io_timeout_ms"], 2000, "{v}");
    assert_eq!(timeout_ms(&dm), 2000);
    times_out_after(&vm, 1001, Duration::from_secs(2));
    drop(vm);
    dm.shutdown();

    // A new daemon knows no timeout of that core: --load attaches it without one, and
    // add-core --io-timeout puts it behind one.
    let dm = Daemon::start(Opts::new(&d));
    dm.json(&["start-cache", "--cache-device", &cache, "--load"]);
    assert_eq!(timeout_ms(&dm), serde_json::Value::Null);
    let v = add(&dm, "500ms");
    assert_eq!(v["io_timeout_ms"], 500, "{v}");
    assert_eq!(timeout_ms(&dm), 500);
    let vm = dm.nbd("vm").unwrap();
    times_out_after(&vm, 1002, Duration::from_millis(500));
    let s = dm.json(&["stats", "--cache-id", "1"]);
    assert_eq!(s["cores"][0]["io_timeout_ms"], 500, "{s}");
    dm.wait_log("core io timeout set");
    drop(vm);
    dm.shutdown();
}

#[test]
fn a_failing_write_log_device_is_degraded_with_the_logged_data_at_risk() {
    let d = Dir::new("faults-wllog");
    let cache_file = d.sparse("cache.img", 64 << 20);
    let core_file = d.sparse("core.img", 64 << 20);
    let cache_ctl = format!("{cache_file}.fail");
    let core_ctl = format!("{core_file}.fail");
    // The core fails first, so what is logged stays in the log (writeback cannot move it).
    std::fs::write(&core_ctl, "").unwrap();
    let (dm, port) = daemon(
        &d,
        &format!("faulty:{cache_file}"),
        "wl",
        &format!("faulty:{core_file}"),
        "",
    );
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..50, 1);

    // The cache device fails: writes cannot be logged and fail with EIO.
    std::fs::write(&cache_ctl, "").unwrap();
    for b in 100..110 {
        let e = vm.write(b * 8, &pattern(b, 1), false).unwrap_err();
        assert!(e.to_string().contains("EIO"), "{e}");
    }
    let l = dm.json(&["list"]);
    assert_eq!(l[0]["state"], "degraded", "{l}");
    let why = l[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("write log on the cache device failing")
            && why.contains("writes that cannot be logged fail")
            && why.contains("of dirty data at risk"),
        "{why}"
    );
    assert_eq!(l[0]["cores"][0]["state"], "degraded", "{l}");
    let s = dm.json(&["stats", "--cache-id", "1"]);
    let h = &s["health"];
    assert_eq!(s["state"], "degraded", "{s}");
    let p = h["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "log_device")
        .unwrap_or_else(|| panic!("a log_device problem: {h}"))
        .clone();
    assert_eq!(p["error"], "IO error", "{p}");
    assert!(p["errors"].as_u64().unwrap() >= 10, "{p}");
    assert!(p["since"].as_str().unwrap().ends_with("UTC"), "{p}");
    assert!(
        h["dirty_at_risk_bytes"].as_u64().unwrap() >= 50 * 4096,
        "{h}"
    );
    let w = &h["write_log"];
    assert_eq!(w["failing"], true, "{w}");
    assert_eq!(w["episodes"], 1, "{w}");
    assert!(w["device_errors"]["writes"].as_u64().unwrap() >= 10, "{w}");
    assert!(
        h["cache_device"]["errors"]["io"].as_u64().unwrap() >= 10,
        "{h}"
    );
    assert!(
        s["cores"][0]["health"]["dirty_at_risk_bytes"]
            .as_u64()
            .unwrap()
            >= 50 * 4096,
        "{s}"
    );
    let m = metrics(port);
    assert_eq!(
        metric(&m, r#"tiercache_cache_state{cache="1",state="degraded"}"#),
        1.0
    );
    assert_eq!(metric(&m, r#"tiercache_wl_log_failing{cache="1"}"#), 1.0);
    assert!(
        metric(
            &m,
            r#"tiercache_cache_device_errors_total{cache="1",kind="io"}"#
        ) >= 10.0
    );
    assert!(metric(&m, r#"tiercache_dirty_at_risk_bytes{cache="1"}"#) >= (50 * 4096) as f64);
    let log = dm.wait_log("problem=log_device");
    let line = log
        .lines()
        .find(|l| l.contains("problem=log_device"))
        .unwrap();
    assert!(
        line.contains("msg=\"cache degraded\"") && line.contains("error=\"IO error\""),
        "{line}"
    );
    // More failed writes, still one line.
    for b in 110..120 {
        assert!(vm.write(b * 8, &pattern(b, 1), false).is_err());
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        log_lines(&dm, "problem=log_device"),
        1,
        "{}",
        dm.log_tail(20)
    );

    // The device works again: the log's next write succeeds (its retries of the failed
    // entries), the problem ends with one line; the core still fails, so the cache stays
    // degraded for that alone.
    std::fs::remove_file(&cache_ctl).unwrap();
    wait_until("the log device problem ends", 10, || {
        let s = dm.json(&["stats", "--cache-id", "1"]);
        s["health"]["write_log"]["failing"] == false
    });
    dm.wait_log("msg=\"problem cleared\" cache=1 core=- problem=log_device");
    assert_eq!(
        metric(&metrics(port), r#"tiercache_wl_log_failing{cache="1"}"#),
        0.0
    );
    write_set(&vm, 200..210, 2);
    check_set(&vm, 0..50, 1);
    check_set(&vm, 200..210, 2);

    // The core works again: everything logged is written back.
    std::fs::remove_file(&core_ctl).unwrap();
    drop(vm);
    let v = dm.json(&["stop-cache", "--cache-id", "1"]);
    assert_eq!(v["dirty_bytes_kept"], 0, "{v}");
    check_file(&core_file, 0..50, 1);
    check_file(&core_file, 200..210, 2);
    dm.shutdown();
}

#[test]
fn an_nbd_core_whose_server_restarts_is_reconnected_and_written_back() {
    if !have("nbdkit") {
        return;
    }
    let d = Dir::new("faults-nbdrestart");
    let core_file = d.sparse("core.img", 64 << 20);
    let core = Nbdkit::start(&d, "core", &[], &core_file, &[]);
    let sock = core.sock.clone();
    let cache = d.sparse("cache.img", 32 << 20);
    let (dm, _) = daemon(&d, &cache, "wb", &core.device(), "");
    let vm = dm.nbd("vm").unwrap();
    write_set(&vm, 0..100, 1);

    // The server goes away: the core's connections are lost (one line), requests that need
    // the core fail with EIO, the cache's data is still served, writeback fails in one line.
    drop(core);
    dm.wait_log("nbd device lost its server");
    let mut buf = vec![0u8; 4096];
    let e = vm.read(5000 * 8, &mut buf).unwrap_err();
    assert!(e.to_string().contains("EIO"), "{e}");
    check_set(&vm, 0..100, 1);
    dm.fails(&["writeback", "--cache-id", "1"], "writeback to core 0");
    assert_eq!(dm.json(&["list"])[0]["state"], "degraded");

    // It comes back on the same socket: the backend reconnects by itself (one line), the
    // retried writeback puts the dirty data on nbdkit's file, and IO goes through again.
    let _ = std::fs::remove_file(&sock);
    let _core = Nbdkit::start(&d, "core", &[], &core_file, &[]);
    dm.wait_log("nbd device reconnected");
    let v = dm.json(&["writeback", "--cache-id", "1"]);
    assert_eq!(v["lines_written_back"], 100, "{v}");
    check_file(&core_file, 0..100, 1);
    vm.read(5000 * 8, &mut buf).unwrap();
    write_set(&vm, 100..120, 2);
    check_set(&vm, 0..100, 1);
    check_set(&vm, 100..120, 2);
    dm.json(&["writeback", "--cache-id", "1"]);
    check_file(&core_file, 100..120, 2);
    wait_until("the cache is running again", 10, || {
        dm.json(&["list"])[0]["state"] == "running"
    });
    assert_eq!(log_lines(&dm, "nbd device lost its server"), 1);
    assert_eq!(log_lines(&dm, "nbd device reconnected"), 1);
    drop(vm);
    dm.shutdown();
}
