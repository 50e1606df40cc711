//! External programs and processes started by a test.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Whether `prog` runs (`prog --version`; `openssl version`), quietly.
pub fn installed(prog: &str) -> bool {
    let arg = if prog == "openssl" {
        "version"
    } else {
        "--version"
    };
    Command::new(prog)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `prog` runs (see [`installed`]); prints a skip line if not.
pub fn have(prog: &str) -> bool {
    let ok = installed(prog);
    if !ok {
        println!("skipped: {prog} is not installed");
    }
    ok
}

/// Runs `c` with a time limit (killing exactly that child if it is exceeded): (success,
/// stdout, stderr).
pub fn run(c: &mut Command, secs: u64) -> (bool, String, String) {
    let out = tempfile(".out");
    let err = tempfile(".err");
    let mut child = c
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let t = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} did not finish within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let r = (
        st.success(),
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default(),
    );
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&err);
    r
}

fn tempfile(suffix: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "tc-run-{}-{}{suffix}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// `cmd` must succeed; its stdout (the failure message carries its status, stdout and
/// stderr).
pub fn run_ok(cmd: &mut Command) -> String {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A free TCP port on the loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An environment variable as a number, else `d`.
pub fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// A sparse file of `bytes` at `path` (created or truncated).
pub fn sparse(path: &str, bytes: u64) {
    std::fs::File::create(path).unwrap().set_len(bytes).unwrap();
}

/// A process a test started. Only this process is ever signalled, and dropping the value
/// kills (SIGKILL) and reaps it if it is still there.
pub struct Proc(Option<Child>);

impl Proc {
    /// Spawns `cmd`; panics (naming `what`) if it cannot start.
    pub fn spawn(what: &str, cmd: &mut Command) -> Proc {
        Proc(Some(
            cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}")),
        ))
    }

    /// Its pid (`None` once it was killed or waited for).
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(|c| c.id())
    }

    /// Its exit status if it has ended (reaped; it stays known), `None` while it runs.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.0.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// SIGKILL and reap (nothing if it already ended).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` to exactly this process (nothing once it was reaped).
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.0 {
            // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// Waits up to `limit` for the process to end: its status, or `None` (the process killed
    /// and reaped) if it did not. Either way it is gone afterwards.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let mut c = self.0.take()?;
        let t = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return Some(st);
            }
            if t.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
