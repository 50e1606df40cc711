//! What every test of the real `tiercache` binary needs: a temporary directory, a daemon process
//! started by the test (and only that process is ever stopped or killed), the CLI run against
//! its admin socket, and a few helpers around external programs.
//!
//! Each test file includes this with `mod common;` and uses what it needs.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_io::NbdBackend;
#[allow(unused_imports)]
pub use tiercache_testkit::{Dir, Proc, env_u64, free_port, have, run, run_ok, sparse};

pub const BIN: &str = env!("CARGO_BIN_EXE_tiercache");

/// `tiercache ARGS` with the admin socket at `socket` (a daemon's, or none): (exit code,
/// stdout, stderr).
pub fn tc_at(socket: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN)
        .args(args)
        .env("TIERCACHE_SOCKET", socket)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `tiercache ARGS` exits with `code` and says exactly one line, `tiercache: ...` containing
/// every one of `want`, with nothing on stdout; that line.
pub fn refused(socket: &str, args: &[&str], code: i32, want: &[&str]) -> String {
    let (c, out, err) = tc_at(socket, args);
    assert_eq!(c, code, "{args:?}: exit status (stderr: {err})");
    assert_eq!(out, "", "{args:?}: nothing on stdout");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    assert!(err.starts_with("tiercache: "), "{args:?}: {err}");
    for w in want {
        assert!(err.contains(w), "{args:?}: want '{w}' in: {err}");
    }
    err
}

/// How to start a daemon. `Opts::new(&dir)` gives `DIR/admin.sock`, one NBD listener on
/// `DIR/nbd.sock`, no metrics listener and the log in `DIR/daemon.log`.
pub struct Opts {
    pub socket: String,
    /// The unix NBD socket (`None`: the listeners are in `args`).
    pub nbd: Option<String>,
    pub config: Option<String>,
    pub log: String,
    /// More daemon arguments.
    pub args: Vec<String>,
    /// Environment variables for the daemon only.
    pub env: Vec<(String, String)>,
    /// How long the daemon may take to become ready.
    pub ready_within: Duration,
}

impl Opts {
    pub fn new(d: &Dir) -> Opts {
        Opts {
            socket: d.path("admin.sock"),
            nbd: Some(d.path("nbd.sock")),
            config: None,
            log: d.path("daemon.log"),
            args: Vec::new(),
            env: Vec::new(),
            ready_within: Duration::from_secs(60),
        }
    }
    pub fn config(mut self, c: &str) -> Opts {
        self.config = Some(c.to_string());
        self
    }
    pub fn log(mut self, l: String) -> Opts {
        self.log = l;
        self
    }
    pub fn args(mut self, a: &[&str]) -> Opts {
        self.args.extend(a.iter().map(|s| s.to_string()));
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Opts {
        self.env.push((k.to_string(), v.to_string()));
        self
    }
    pub fn socket(mut self, s: &str) -> Opts {
        self.socket = s.to_string();
        self
    }
    pub fn no_nbd(mut self) -> Opts {
        self.nbd = None;
        self
    }
    pub fn ready_within(mut self, t: Duration) -> Opts {
        self.ready_within = t;
        self
    }
}

/// Grows or shrinks an existing file in place (a core "resized" under the daemon).
pub fn resize(path: &str, bytes: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .set_len(bytes)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
}

/// 4 KiB of data identifying (block, version).
pub use tiercache_testkit::block_pattern as pattern;

/// Version `version` of each 4 KiB block in `blocks` written through `e`, then a flush.
pub fn write_set(e: &NbdBackend, blocks: impl Iterator<Item = u64>, version: u64) {
    use tiercache_io::Backend;
    for b in blocks {
        e.write(b * 8, &pattern(b, version), false).unwrap();
    }
    e.flush().unwrap();
}

/// Each 4 KiB block in `blocks` read through `e` holds version `version`.
pub fn check_set(e: &NbdBackend, blocks: impl Iterator<Item = u64>, version: u64) {
    use tiercache_io::Backend;
    let mut buf = vec![0u8; 4096];
    for b in blocks {
        e.read(b * 8, &mut buf).unwrap();
        assert!(
            buf == pattern(b, version),
            "block {b} is not version {version}"
        );
    }
}

/// Writes `tc.toml` in `d`: cache 1 on `cache` in `mode`, cleaning `nop` (dirty data stays
/// until a test writes it back), and one `[[cache.core]]` per `(id, device, export, extra
/// TOML lines)`; returns its path.
pub fn cache_config(d: &Dir, cache: &str, mode: &str, cores: &[(u16, &str, &str, &str)]) -> String {
    let mut t = format!(
        "[[cache]]\nid = 1\ndevice = \"{cache}\"\nmode = \"{mode}\"\n[cache.params]\ncleaning = {{ policy = \"nop\" }}\n"
    );
    for (id, device, export, extra) in cores {
        t += &format!("[[cache.core]]\nid = {id}\ndevice = \"{device}\"\nexport = \"{export}\"\n");
        if !extra.is_empty() {
            t += extra;
            t.push('\n');
        }
    }
    let p = d.path("tc.toml");
    std::fs::write(&p, t).unwrap();
    p
}

/// A daemon process started by a test; dropping it kills exactly that process.
pub struct Daemon {
    child: Proc,
    pub socket: String,
    pub nbd: String,
    pub log: String,
    /// Where this process's part of the (appended) log starts.
    log_from: usize,
}

impl Daemon {
    /// Starts the daemon and waits until it logs "daemon ready"; panics if it exits first.
    pub fn start(o: Opts) -> Daemon {
        Daemon::try_start(o).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As `start`, but a daemon that exits before it is ready is an error carrying its log.
    pub fn try_start(o: Opts) -> Result<Daemon, String> {
        // A killed daemon leaves its sockets behind.
        let _ = std::fs::remove_file(&o.socket);
        if let Some(n) = &o.nbd {
            let _ = std::fs::remove_file(n);
        }
        let log_from = std::fs::metadata(&o.log).map_or(0, |m| m.len() as usize);
        let mut cmd = Command::new(BIN);
        cmd.args(["daemon", "--socket", &o.socket, "--metrics-listen", "none"]);
        if let Some(n) = &o.nbd {
            cmd.args(["--nbd-listen", &format!("unix:{n}")]);
        }
        if let Some(c) = &o.config {
            cmd.args(["--config", c]);
        }
        cmd.args(&o.args)
            .envs(o.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&o.log)
                    .unwrap(),
            );
        let child = Proc::spawn("the daemon", &mut cmd);
        let mut dm = Daemon {
            child,
            socket: o.socket,
            nbd: o.nbd.unwrap_or_default(),
            log: o.log,
            log_from,
        };
        let t = Instant::now();
        while !dm.log().contains("daemon ready") {
            if let Some(st) = dm.child.exited() {
                return Err(format!(
                    "the daemon exited ({st}) before it was ready:\n{}",
                    dm.log_tail(15)
                ));
            }
            if t.elapsed() > o.ready_within {
                return Err(format!(
                    "the daemon was not ready within {:?}:\n{}",
                    o.ready_within,
                    dm.log_tail(15)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(dm)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// This process's part of the log.
    pub fn log(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.get(self.log_from..).unwrap_or_default().to_string()
    }

    /// The last `n` lines of this process's log.
    pub fn log_tail(&self, n: usize) -> String {
        let l = self.log();
        let lines: Vec<&str> = l.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Waits (up to `secs`) until the log holds `what` at least `n` times; the log.
    pub fn wait_log_count(&self, what: &str, n: usize, secs: u64) -> String {
        let t = Instant::now();
        loop {
            let l = self.log();
            if l.matches(what).count() >= n {
                return l;
            }
            assert!(
                t.elapsed() < Duration::from_secs(secs),
                "fewer than {n} {what:?} in the log: {l}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to 10 s) until the log holds `what`; the log.
    pub fn wait_log(&self, what: &str) -> String {
        self.wait_log_count(what, 1, 10)
    }

    /// The port of the daemon's (first) TCP NBD listener, from its log.
    pub fn tcp_port(&self) -> u16 {
        let l = self.log();
        let i = l.find("address=tcp:").expect("a TCP listener in the log") + 12;
        let a = &l[i..i + l[i..].find(' ').unwrap()];
        a.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `tiercache ARGS` against this daemon: (success, stdout, stderr). Killed after 300 s.
    pub fn tc(&self, args: &[&str]) -> (bool, String, String) {
        run(
            Command::new(BIN)
                .args(args)
                .env("TIERCACHE_SOCKET", &self.socket),
            300,
        )
    }

    /// `tiercache ARGS`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.tc(args);
        assert!(
            ok,
            "tiercache {args:?} failed: {err}\n{}",
            self.log_tail(10)
        );
        out
    }

    /// Turns cache `id`'s cleaner off (`cleaning --policy nop`): written data stays dirty.
    pub fn no_cleaning(&self, id: u16) {
        let id = id.to_string();
        self.ok(&[
            "set-param",
            "--cache-id",
            &id,
            "cleaning",
            "--policy",
            "nop",
        ]);
    }

    /// `add-core`: `core` added to cache `cache_id` as export `export`; the output.
    pub fn add_core(&self, cache_id: u16, core: &str, export: &str) -> String {
        let id = cache_id.to_string();
        self.ok(&[
            "add-core",
            "--cache-id",
            &id,
            "--core-device",
            core,
            "--export",
            export,
        ])
    }

    /// `data` written at block `lba` of `export` by tiercache's own NBD client and flushed;
    /// the connection closed.
    pub fn write_flushed(&self, export: &str, lba: u64, data: &[u8]) {
        use tiercache_io::Backend;
        let e = self.nbd(export).unwrap();
        e.write(lba, data, false).unwrap();
        e.flush().unwrap();
    }

    /// Cache 1 on `cache` in `mode`, and `core` added to it as export `export`.
    pub fn cache_and_core(&self, cache: &str, mode: &str, core: &str, export: &str) {
        self.ok(&["start-cache", "--cache-device", cache, "--mode", mode]);
        let add = ["add-core", "--cache-id", "1", "--core-device", core];
        self.ok(&[&add[..], &["--export", export]].concat());
    }

    /// `tiercache ARGS --json`, parsed.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_str(&self.ok(&a)).expect("JSON output")
    }

    /// `tiercache ARGS` must fail with one line containing `want`; that line.
    pub fn fails(&self, args: &[&str], want: &str) -> String {
        let (ok, _, err) = self.tc(args);
        assert!(!ok, "tiercache {args:?} should fail");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains(want), "{args:?}: want '{want}' in: {err}");
        err
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd)
    }

    /// tiercache's own NBD client on an export of the unix listener.
    pub fn nbd(&self, export: &str) -> Result<NbdBackend, String> {
        NbdBackend::connect(&self.uri(export)).map_err(|e| e.to_string())
    }

    /// SIGKILL, as a crash (nothing if it already ended).
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Clean stop through the admin socket; waits (up to 60 s) for the process to end.
    pub fn shutdown(mut self) {
        self.ok(&["shutdown"]);
        self.wait_exit();
    }

    /// Clean stop by SIGTERM to exactly this process; waits for it to end.
    pub fn stop(mut self) {
        self.child.signal(libc::SIGTERM);
        self.wait_exit();
    }

    /// Waits (up to 60 s) for the process to end; kills it and panics if it does not.
    fn wait_exit(&mut self) {
        if self.child.wait_exit(Duration::from_secs(60)).is_none() {
            panic!(
                "the daemon did not stop within 60 s:\n{}",
                self.log_tail(15)
            );
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loop device this test attached (detached, and unmounted if mounted, when dropped).
pub struct Loop {
    pub dev: String,
    mnt: Option<String>,
}

impl Loop {
    pub fn attach(file: &str) -> Option<Loop> {
        let o = Command::new("losetup")
            .args(["-f", "--show", file])
            .output()
            .ok()?;
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        (o.status.success() && dev.starts_with("/dev/")).then_some(Loop { dev, mnt: None })
    }

    /// A loop device over `file` with its partitions scanned (`losetup -P`): the device and
    /// the paths of its first two partitions, `None` when the loop driver made none within
    /// 2 s (a driver with `max_part=0`, as in some sandboxes).
    pub fn attach_partitioned(file: &str) -> Option<(Loop, [String; 2])> {
        let o = Command::new("losetup")
            .args(["-P", "-f", "--show", file])
            .output()
            .ok()?;
        let dev = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if !o.status.success() || !dev.starts_with("/dev/") {
            return None;
        }
        let lo = Loop { dev, mnt: None };
        let parts = [format!("{}p1", lo.dev), format!("{}p2", lo.dev)];
        let t = Instant::now();
        while !parts.iter().all(|p| std::path::Path::new(p).exists()) {
            if t.elapsed() > Duration::from_secs(2) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some((lo, parts))
    }

    pub fn mount(&mut self, dir: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
        ok(Command::new("mkfs.ext4").args(["-q", "-F", &self.dev]));
        ok(Command::new("mount").args([&self.dev, dir]));
        self.mnt = Some(dir.to_string());
    }

    pub fn umount(&mut self) {
        if let Some(m) = self.mnt.take() {
            let _ = Command::new("umount").arg(&m).status();
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.umount();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// Whether this machine can make loop devices here (root, `losetup`, the loop driver); a skip
/// line if not.
pub fn loop_devices_work(d: &Dir) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !have("losetup") {
        println!("skipped: needs root and losetup");
        return false;
    }
    let f = d.sparse("probe.img", 1 << 20);
    if Loop::attach(&f).is_none() {
        println!("skipped: no loop device could be attached (no loop driver here?)");
        return false;
    }
    true
}
