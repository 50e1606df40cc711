//! The daemon under systemd's notify protocol, with the test as the service manager: it binds
//! the `NOTIFY_SOCKET` (a path, or an abstract name) and checks that `READY=1` comes only once
//! the configured exports answer, with `STATUS=` naming the caches' states, that `WATCHDOG=1`
//! follows when `WATCHDOG_USEC` is set, and `STOPPING=1` at SIGTERM. And `daemon
//! --check-config`: one line, for a good config and for each bad one, touching nothing.

mod common;

use common::{BIN, Dir};
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_io::Backend;

/// The config of one `wt` cache on `cache` with core `core` exported as `vm`, with the
/// daemon's sockets in `d`.
fn config(d: &Dir, cache: &str, core: &str) -> String {
    let t = format!(
        "[daemon]\nsocket = \"{}\"\nnbd_listen = [\"unix:{}\"]\nmetrics_listen = \"none\"\n\
         [[cache]]\nid = 1\ndevice = \"{cache}\"\nmode = \"wt\"\n\
         [[cache.core]]\nid = 0\ndevice = \"{core}\"\nexport = \"vm\"\n",
        d.path("admin.sock"),
        d.path("nbd.sock")
    );
    let p = d.path("tc.toml");
    std::fs::write(&p, t).unwrap();
    p
}

fn spawn(d: &Dir, cfg: &str, env: &[(&str, &str)]) -> Child {
    let log = std::fs::File::create(d.path("daemon.log")).unwrap();
    Command::new(BIN)
        .args(["daemon", "--config", cfg])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// The next notification, within `secs`.
fn next(sock: &UnixDatagram, secs: u64, d: &Dir) -> String {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut buf = [0u8; 4096];
    let n = loop {
        let left = end.saturating_duration_since(Instant::now());
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => break n,
            // A signal to this thread (the harness's) is not the end of the wait.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted && left > Duration::ZERO => {}
            Err(e) => {
                let log = std::fs::read_to_string(d.path("daemon.log")).unwrap_or_default();
                panic!("no notification within {secs} s ({e}); daemon log:\n{log}")
            }
        }
    };
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

fn sigterm_and_wait(c: &mut Child) -> std::process::ExitStatus {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ready_comes_once_the_exports_answer_then_watchdog_and_stopping() {
    let d = Dir::new("notify");
    let cfg = config(
        &d,
        &d.sparse("cache.img", 64 << 20),
        &d.sparse("core.img", 32 << 20),
    );
    let path = d.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let mut child = spawn(
        &d,
        &cfg,
        &[("NOTIFY_SOCKET", &path), ("WATCHDOG_USEC", "400000")],
    );
    // The first notification is READY=1, and at that moment the export answers at once.
    let ready = next(&sock, 60, &d);
    let uri = format!("nbd+unix:///vm?socket={}", d.path("nbd.sock"));
    let c = tiercache_io::NbdBackend::connect(&uri).expect("the export answers at READY=1");
    let mut b = tiercache_io::AlignedBuf::new(4096);
    c.read(0, &mut b).unwrap();
    drop(c);
    let lines: Vec<&str> = ready.lines().collect();
    assert_eq!(lines[0], "READY=1", "{ready:?}");
    assert!(lines.contains(&"STATUS=1 caches: 1 running"), "{ready:?}");
    let log = std::fs::read_to_string(d.path("daemon.log")).unwrap();
    assert!(log.contains("daemon ready"), "{log}");
    // WATCHDOG_USEC 0.4 s: a ping every 0.2 s, with the status.
    let t = Instant::now();
    for _ in 0..3 {
        let w = next(&sock, 5, &d);
        assert!(w.starts_with("WATCHDOG=1\nSTATUS=1 caches"), "{w:?}");
    }
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // SIGTERM: STOPPING=1 before the caches stop; a clean exit.
    let st = sigterm_and_wait(&mut child);
    assert!(st.success(), "{st}");
    let mut got = String::new();
    while !got.starts_with("STOPPING=1") {
        got = next(&sock, 5, &d);
    }
    assert!(got.contains("STATUS=stopping (SIGTERM)"), "{got:?}");
}

#[test]
fn an_abstract_notify_socket_and_a_missing_cache_device_still_get_ready() {
    let d = Dir::new("notify-abs");
    // The cache device does not exist: the cache is detached, and the daemon is ready anyway
    // (the state is in STATUS, `list` and the metrics), without a watchdog when none is asked.
    let cfg = config(&d, &d.path("missing.img"), &d.sparse("core.img", 32 << 20));
    let name = format!("tc-notify-abs-{}", std::process::id());
    let sock = {
        use std::os::linux::net::SocketAddrExt;
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap()
    };
    let mut child = spawn(&d, &cfg, &[("NOTIFY_SOCKET", &format!("@{name}"))]);
    let ready = next(&sock, 60, &d);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(
        ready.contains("STATUS=1 caches: 1 detached; 1 problems at start"),
        "{ready:?}"
    );
    let st = sigterm_and_wait(&mut child);
    assert!(st.success(), "{st}");
    let stopping = next(&sock, 5, &d);
    assert!(
        stopping.starts_with("STOPPING=1"),
        "no watchdog, then stopping: {stopping:?}"
    );
}

/// `tiercache daemon --check-config FILE [ARGS]`: (success, stdout, stderr).
fn check(file: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(["daemon", "--check-config", file])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn check_config_says_one_line_and_touches_nothing() {
    let d = Dir::new("check-config");
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 32 << 20);
    let cfg = config(&d, &cache, &core);
    let (ok, out, err) = check(&cfg, &[]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains(": ok: 1 caches, 1 cores;"), "{out}");
    assert!(out.contains("TLS off, socket group none"), "{out}");
    let base = std::fs::read_to_string(&cfg).unwrap();
    let bad: &[(&str, &str)] = &[
        ("nbd_listen = [", "[daemon]\nbogus = 1\n"),
        ("mode = \"wt\"", "mode = \"fast\""),
        ("id = 0", "id = 0\nio_timeout = \"2h\""),
        ("metrics_listen = \"none\"", "metrics_listen = \"nowhere\""),
        (
            "metrics_listen = \"none\"",
            "metrics_listen = \"none\"\nsocket_group = \"tc-no-such-group\"",
        ),
        (
            "metrics_listen = \"none\"",
            "metrics_listen = \"none\"\ntls_cert = \"/nonexistent/cert.pem\"",
        ),
        (
            "nbd_listen = [\"unix:",
            "nbd_listen = [\"tcp:192.0.2.1:10809\", \"unix:",
        ),
        ("device = \"", "device = \"rbd:pool/image\"\n#"),
    ];
    for (from, to) in bad {
        let text = if from.starts_with("nbd_listen = [") && to.starts_with("[daemon]") {
            format!("{to}{}", base.replace("[daemon]\n", ""))
        } else {
            base.replacen(from, to, 1)
        };
        assert_ne!(text, base, "{from} -> {to}");
        let f = d.path("bad.toml");
        std::fs::write(&f, &text).unwrap();
        let (ok, out, err) = check(&f, &[]);
        assert!(!ok, "accepted:\n{text}\n{out}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("tiercache: "), "{err}");
    }
    // A lazy mode on a volatile cache device.
    let f = d.path("bad.toml");
    let text = base
        .replacen("mode = \"wt\"", "mode = \"wb\"", 1)
        .replacen(&cache, "ram:64m", 1);
    std::fs::write(&f, &text).unwrap();
    let (ok, _, err) = check(&f, &[]);
    assert!(!ok && err.contains("ram: device loses"), "{err}");
    // The command line wins over the file: a group given there is the one checked.
    let (ok, _, err) = check(&cfg, &["--socket-group", "tc-no-such-group"]);
    assert!(!ok && err.contains("tc-no-such-group"), "{err}");
    let (ok, _, err) = check(&d.path("none.toml"), &[]);
    assert!(!ok && err.contains("none.toml"), "{err}");
    // Nothing was touched: no socket, the devices still blank and unchanged in size.
    assert!(!std::path::Path::new(&d.path("admin.sock")).exists());
    assert!(!std::path::Path::new(&d.path("nbd.sock")).exists());
    for (f, len) in [(&cache, 64u64 << 20), (&core, 32 << 20)] {
        let data = std::fs::read(f).unwrap();
        assert_eq!(data.len() as u64, len);
        assert!(data.iter().all(|&b| b == 0), "{f} written");
    }
}

#[test]
fn the_unit_file_verifies_and_the_example_config_checks() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let unit = std::fs::read_to_string(format!("{root}/contrib/tiercache.service")).unwrap();
    for want in [
        "Type=notify",
        "WatchdogSec=",
        "ExecStartPre=/usr/local/bin/tiercache daemon --check-config /etc/tiercache/tiercache.toml",
        "ProtectSystem=strict",
        "io_uring_setup io_uring_enter io_uring_register",
    ] {
        assert!(unit.contains(want), "the unit lacks {want}");
    }
    // The example config the unit's comment installs passes the unit's ExecStartPre.
    let (ok, out, err) = check(&format!("{root}/contrib/tiercache.toml.example"), &[]);
    assert!(ok, "{err}");
    assert!(out.contains(": ok: 1 caches, 2 cores;"), "{out}");
    if !common::have("systemd-analyze") {
        return;
    }
    // systemd's own parser: every directive known and every value valid (it warns on stderr
    // and still exits 0, so the warnings are what is checked).
    let d = Dir::new("unit");
    let f = d.path("tiercache.service");
    std::fs::write(&f, unit.replace("/usr/local/bin/tiercache", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", &f])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("tiercache")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify: {ours:?}");
}

/// Runs the daemon on a config whose core device is missing (one error line at start), with
/// `args` and `env`, until READY=1; then `tiercache list` (an admin request) and SIGTERM. Its
/// log.
fn logged_run(name: &str, args: &[&str], journal: bool) -> String {
    let d = Dir::new(name);
    let cfg = config(&d, &d.sparse("cache.img", 64 << 20), &d.path("missing.img"));
    let path = d.path("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let log = std::fs::File::create(d.path("daemon.log")).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["daemon", "--config", &cfg])
        .args(args)
        .env("NOTIFY_SOCKET", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if journal {
        // What systemd sets when stderr is the journal: stderr's device and inode.
        use std::os::unix::fs::MetadataExt;
        let m = log.metadata().unwrap();
        cmd.env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()));
    }
    let mut child = cmd.stderr(log).spawn().unwrap();
    assert!(next(&sock, 60, &d).starts_with("READY=1"));
    let out = Command::new(BIN)
        .args(["list"])
        .env("TIERCACHE_SOCKET", d.path("admin.sock"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(sigterm_and_wait(&mut child).success());
    std::fs::read_to_string(d.path("daemon.log")).unwrap()
}

/// `ts=2026-11-27T19:39:42.123Z`.
fn rfc3339(ts: &str) -> bool {
    let b = ts.as_bytes();
    ts.len() == 24
        && ts.ends_with('Z')
        && b[4] == b'-'
        && b[10] == b'T'
        && b[19] == b'.'
        && ts[..4].chars().all(|c| c.is_ascii_digit())
}

#[test]
fn log_levels_filter_and_journald_gets_priorities() {
    // warn: the missing core's error line, nothing at info or debug.
    let log = logged_run("log-warn", &["--log-level", "warn"], false);
    assert!(
        log.contains("level=error msg=\"core not attached\""),
        "{log}"
    );
    for l in log.lines() {
        assert!(
            l.contains(" level=error ") || l.contains(" level=warn "),
            "{l}"
        );
        let ts = l.split(' ').next().unwrap().strip_prefix("ts=").unwrap();
        assert!(rfc3339(ts), "{l}");
    }
    // debug under journald: every line with its priority; the admin request at debug.
    let log = logged_run("log-debug", &["--log-level", "DEBUG"], true);
    let prio = |p: &str, what: &str| log.lines().any(|l| l.starts_with(p) && l.contains(what));
    assert!(
        prio("<3>ts=", "level=error msg=\"core not attached\""),
        "{log}"
    );
    assert!(prio("<6>ts=", "level=info msg=\"daemon ready\""), "{log}");
    assert!(
        prio("<7>ts=", "level=debug msg=\"admin request\"") && log.contains(" verb=list "),
        "{log}"
    );
    assert!(log.lines().all(|l| l.starts_with('<')), "{log}");
    // No Rust Debug text: the listener is named as it is given.
    assert!(log.contains("address=unix:/"), "{log}");
    assert!(!log.contains("Unix(") && !log.contains("Some("), "{log}");
    // The default (info) hides debug; a bad level is one line.
    let log = logged_run("log-info", &[], false);
    assert!(
        log.contains("level=info") && !log.contains("level=debug"),
        "{log}"
    );
    let out = Command::new(BIN)
        .args([
            "daemon",
            "--log-level",
            "loud",
            "--socket",
            "/nonexistent/x.sock",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "invalid value 'loud' for '--log-level <LEVEL>' [possible values: error, warn, info, debug]"
        ),
        "{err}"
    );
}
