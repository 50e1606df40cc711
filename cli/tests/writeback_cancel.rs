//! `writeback` cancelled while it runs, as an operator would: from another shell with
//! `writeback --cancel`, and with Ctrl-C (SIGINT) on the waiting command. The command answers
//! with one line saying what was written back and what is still dirty, exits non-zero, the
//! dirty data stays on the cache, and the daemon goes on serving it. The core is an emulated
//! 10k SAS HDD, so the random dirty lines take many seconds to write back.

mod common;

use common::{BIN, Daemon, Dir, Opts};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_io::{Backend, NbdBackend};

/// Dirty 4 KiB lines written, spread over the core so that writing them back seeks.
const LINES: u64 = 3000;

fn block(i: u64) -> u64 {
    // A stride prime to the 256k 4 KiB blocks of the core.
    i * 7919 % (1 << 18)
}

fn fill(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8 + 1; 4096]
}

fn setup(d: &Dir) -> Daemon {
    let cache = d.sparse("cache.img", 64 << 20);
    let core = d.sparse("core.img", 1 << 30);
    let dm = Daemon::start(Opts::new(d));
    dm.cache_and_core(&cache, "wb", &format!("emu:hdd-10k-sas:{core}"), "vol");
    dm.no_cleaning(1);
    let e = dm.nbd("vol").expect("export served");
    for i in 0..LINES {
        e.write(block(i) * 8, &fill(i), false).unwrap();
    }
    e.flush().unwrap();
    dm
}

fn dirty_lines(dm: &Daemon) -> u64 {
    dm.json(&["stats", "--cache-id", "1"])["usage"]["dirty_lines"]
        .as_u64()
        .unwrap()
}

/// `tiercache writeback --cache-id 1` started in the background, its stderr piped.
fn start_writeback(dm: &Daemon) -> Child {
    Command::new(BIN)
        .args(["writeback", "--cache-id", "1"])
        .env("TIERCACHE_SOCKET", &dm.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until some lines have been written back (the writeback is under way).
fn wait_moving(dm: &Daemon, before: u64) {
    let t = Instant::now();
    while dirty_lines(dm) >= before {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "writeback never moved"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (up to 30 s) for the writeback command; (exit code, stdout, stderr).
fn finish(mut c: Child) -> (Option<i32>, String, String) {
    let t = Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = c.kill();
            panic!("writeback did not return within 30 s of its cancel");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (st.code(), out, err)
}

/// After a cancel: no writeback forced any more (with cleaning `nop` the dirty count holds
/// still once the jobs already running end), dirty data left, and every line still reads back
/// through the export.
fn still_dirty_and_served(dm: &Daemon, err: &str) {
    let t = Instant::now();
    let mut left = dirty_lines(dm);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = dirty_lines(dm);
        if now == left {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "writeback goes on after the cancel ({left} then {now} dirty lines): {err}"
        );
        left = now;
    }
    assert!(left > 0, "dirty data left after the cancel: {err}");
    let e = NbdBackend::connect(&dm.uri("vol")).expect("still served");
    let mut buf = vec![0u8; 4096];
    for i in (0..LINES).step_by(97) {
        e.read(block(i) * 8, &mut buf).unwrap();
        assert!(buf == fill(i), "line {i} reads back");
    }
}

/// The cancelled command's last stderr line.
fn cancelled_line(code: Option<i32>, out: &str, err: &str) -> String {
    assert_ne!(code, Some(0), "a cancelled writeback fails: {err}");
    assert_eq!(out, "", "nothing on stdout");
    let last = err.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("tiercache: writeback of cache 1 cancelled after"),
        "{err}"
    );
    assert!(
        last.contains("written back") && last.contains("still dirty"),
        "{last}"
    );
    last
}

#[test]
fn writeback_cancelled_from_another_shell() {
    let d = Dir::new("wb-cancel");
    let dm = setup(&d);
    let before = dirty_lines(&dm);
    assert_eq!(before, LINES);
    // Nothing running: the cancel says so and succeeds.
    let out = dm.ok(&["writeback", "--cache-id", "1", "--cancel"]);
    assert!(out.starts_with("no writeback was running"), "{out}");

    let c = start_writeback(&dm);
    // Past 10%, so that a progress line (every 10% off a terminal) has come.
    wait_moving(&dm, before * 85 / 100);
    let out = dm.ok(&["writeback", "--cache-id", "1", "--cancel"]);
    assert!(out.starts_with("writeback cancelled (cache 1: "), "{out}");
    let (code, o, err) = finish(c);
    let last = cancelled_line(code, &o, &err);
    assert!(
        err.contains("lines/s, ETA "),
        "progress with rate and ETA: {err}"
    );
    still_dirty_and_served(&dm, &last);
    assert!(dm.log().contains("writeback cancelled"), "logged");
    dm.stop();
}

#[test]
fn ctrl_c_cancels_the_writeback() {
    let d = Dir::new("wb-sigint");
    let dm = setup(&d);
    let before = dirty_lines(&dm);
    let c = start_writeback(&dm);
    wait_moving(&dm, before);
    // SAFETY: SIGINT to the CLI process this test started.
    assert_eq!(unsafe { libc_kill(c.id() as i32, 2) }, 0);
    let (code, o, err) = finish(c);
    assert!(err.contains("cancelling the writeback of cache 1"), "{err}");
    let last = cancelled_line(code, &o, &err);
    still_dirty_and_served(&dm, &last);

    // A writeback whose client is killed outright stops too.
    let left = dirty_lines(&dm);
    let mut c = start_writeback(&dm);
    wait_moving(&dm, left);
    c.kill().unwrap();
    c.wait().unwrap();
    dm.wait_log("writeback cancelled");
    still_dirty_and_served(&dm, "after SIGKILL of the client");

    // And a writeback left to run empties the cache.
    dm.ok(&["writeback", "--cache-id", "1"]);
    assert_eq!(dirty_lines(&dm), 0);
    dm.stop();
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
