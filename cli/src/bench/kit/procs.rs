//! Child processes of a benchmark (started pinned, in their own process group, dying with
//! this process, stopped on drop), what `/proc` says about them, and Ctrl-C.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Set by Ctrl-C (SIGINT), SIGTERM or SIGHUP: runs stop early, the report holds what was
/// measured, and everything the run started is torn down (servers, fio, mounts).
pub(crate) static STOP: AtomicBool = AtomicBool::new(false);

/// The signals that ask a benchmark to stop.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The signal that set `STOP` (0 while none has).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
    if STOP.swap(true, Ordering::Relaxed) {
        // A second signal: the default action (the children die with us: PR_SET_PDEATHSIG).
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Makes Ctrl-C, SIGTERM (`kill`, `systemctl stop`, a CI timeout) and SIGHUP (a closed
/// terminal) stop the run cleanly; a second one ends the process at once.
pub(crate) fn install_stop_signals() {
    for sig in STOP_SIGNALS {
        // SAFETY: the handler only touches an atomic and async-signal-safe calls.
        unsafe {
            libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t);
        }
    }
}

/// How the run was stopped, for the report: "Ctrl-C", "SIGTERM" or "SIGHUP".
pub(crate) fn stopped_by() -> &'static str {
    match STOP_SIGNAL.load(Ordering::Relaxed) {
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "Ctrl-C",
    }
}

/// Every child process this run started; dropping it stops them all (SIGTERM, then SIGKILL
/// after a grace period), so errors and Ctrl-C leave nothing behind.
#[derive(Default)]
pub(crate) struct Procs {
    list: Vec<(String, Child, PathBuf)>,
}

impl Procs {
    /// Starts `prog args` (pinned to `cpu` if given), in its own process group (Ctrl-C is
    /// ours to handle), dying with this process, stderr (and stdout) into `log`.
    pub(crate) fn spawn(
        &mut self,
        name: &str,
        cpu: Option<usize>,
        prog: &Path,
        args: &[String],
        env: &[(&str, &Path)],
        log: PathBuf,
    ) -> Result<u32, String> {
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let f2 = f.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpu.to_string()).arg(prog);
                c
            }
            None => Command::new(prog),
        };
        cmd.args(args).stdin(Stdio::null()).stdout(f).stderr(f2);
        own_group_dying_with_us(&mut cmd);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        let pid = child.id();
        self.list.push((name.to_string(), child, log));
        Ok(pid)
    }

    /// Fails with the end of the child's log if it has exited.
    pub(crate) fn check(&mut self, pid: u32) -> Result<(), String> {
        for (name, c, log) in &mut self.list {
            if c.id() == pid
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!("{name} exited ({st}): {}", log_tail(log)));
            }
        }
        Ok(())
    }

    /// Waits until `sock` accepts connections (the child `pid` must stay up meanwhile).
    pub(crate) fn wait_socket(&mut self, pid: u32, sock: &Path) -> Result<(), String> {
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            self.check(pid)?;
            if t.elapsed() > Duration::from_secs(60) {
                return Err(format!("{} did not come up in 60 s", sock.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops one child: SIGTERM, up to `grace`, then SIGKILL.
    pub(crate) fn stop(&mut self, pid: u32, grace: Duration) {
        if let Some(i) = self.list.iter().position(|(_, c, _)| c.id() == pid) {
            let (_, mut c, _) = self.list.remove(i);
            terminate(&mut c, grace);
        }
    }

    pub(crate) fn stop_all(&mut self) {
        while let Some((_, mut c, _)) = self.list.pop() {
            terminate(&mut c, Duration::from_secs(3));
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Puts `cmd`'s child in a process group of its own (Ctrl-C is ours to handle) and makes
/// it die with this process.
pub(crate) fn own_group_dying_with_us(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
    // parent; the child is killed when the thread that started it (this program's main
    // thread) ends.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}

fn terminate(c: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = c.try_wait() {
        return;
    }
    // SAFETY: signalling our own child, which has not been reaped (try_wait said it runs), so
    // its pid is still ours.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < grace {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// CPU seconds (user + system, all threads) the process has used so far.
pub(crate) fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime); `rest` starts at field 3.
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((ut + st) / hz)
}

/// Whether the process `pid` exists and has not exited.
pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].trim_start().chars().next())
            .is_some_and(|st| st != 'Z' && st != 'X')
    })
}

/// Whether the process `pid` has `path` open with O_DIRECT (on any of its descriptors for
/// it: the daemon also holds a read-only one for the device's identity and lock).
pub(crate) fn opened_direct(pid: u32, path: &Path) -> Option<bool> {
    let want = std::fs::canonicalize(path).ok()?;
    let mut seen = None;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        if std::fs::read_link(e.path()).ok().as_deref() == Some(want.as_path()) {
            let Ok(info) = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            )) else {
                continue;
            };
            let Some(flags) = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| i64::from_str_radix(f.trim(), 8).ok())
            else {
                continue;
            };
            let direct = flags & libc::O_DIRECT as i64 != 0;
            seen = Some(seen.unwrap_or(false) || direct);
        }
    }
    seen
}

/// Bytes allocated to the deleted temporary files `pid` holds open (nbdkit's cache file).
pub(crate) fn deleted_file_bytes(pid: u32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = None;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let deleted =
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().ends_with(" (deleted)"));
        if deleted && let Ok(m) = std::fs::metadata(e.path()) {
            *total.get_or_insert(0) += m.blocks() * 512;
        }
    }
    total
}
