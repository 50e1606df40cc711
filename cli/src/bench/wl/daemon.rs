//! `bench wl`'s daemon: a `tiercache daemon` child pinned to the server CPU, driven through
//! its admin socket (the log's stats, writeback).

use super::Plan;
use crate::bench::kit::procs::own_group_dying_with_us;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiercache_daemon::admin::{Request, call};

/// A `tiercache daemon` child pinned to the server CPU, in its own process group, dying with
/// this process; stopped (SIGTERM, then SIGKILL) on drop.
pub(super) struct Daemon {
    child: Option<Child>,
    pub(super) pid: u32,
    admin: PathBuf,
    nbd: PathBuf,
    log: PathBuf,
}

impl Daemon {
    pub(super) fn start(plan: &Plan, scratch: &Path) -> Result<Daemon, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let admin = scratch.join("admin.sock");
        let nbd = scratch.join("nbd.sock");
        let log = scratch.join("daemon.log");
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new("taskset");
        cmd.arg("-c")
            .arg(plan.server_cpu.to_string())
            .arg(exe)
            .arg("daemon")
            .arg("--socket")
            .arg(&admin)
            .args(["--metrics-listen", "none", "--nbd-listen"])
            .arg(format!("unix:{}", nbd.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f);
        own_group_dying_with_us(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the daemon: {e}"))?;
        let mut d = Daemon {
            pid: child.id(),
            child: Some(child),
            admin,
            nbd,
            log,
        };
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.admin).is_err() || !d.nbd.exists() {
            if let Some(c) = d.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!("the daemon exited ({st}): {}", d.log_tail()));
            }
            if t.elapsed() > Duration::from_secs(60) {
                return Err("the daemon did not come up in 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    pub(super) fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let l: Vec<&str> = s.lines().rev().take(3).collect();
        l.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }

    pub(super) fn call(&self, req: Request) -> Result<Value, String> {
        call(&self.admin, &req, |_| {})
            .map_err(|e| format!("{e} (daemon log: {})", self.log_tail()))
    }

    pub(super) fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd.display())
    }

    /// The `write_log` block of a cache's stats.
    pub(super) fn wl(&self, cache_id: u16) -> Result<Value, String> {
        let s = self.call(Request::Stats {
            cache_id: Some(cache_id),
            core_id: None,
            io_class: None,
        })?;
        let w = s["write_log"].clone();
        if w.is_null() {
            return Err(format!("cache {cache_id} shows no write_log block: {s}"));
        }
        Ok(w)
    }

    /// Writes the log back (waits until it is drained); (seconds, bytes that were dirty).
    pub(super) fn drain(&self, cache_id: u16) -> Result<(f64, u64), String> {
        let dirty = self.wl(cache_id)?["dirty_bytes"].as_u64().unwrap_or(0);
        let t = Instant::now();
        self.call(Request::Writeback {
            cache_id,
            core_id: None,
        })?;
        Ok((t.elapsed().as_secs_f64(), dirty))
    }

    pub(super) fn stop(&mut self, caches: &[u16]) {
        for id in caches {
            let _ = call(
                &self.admin,
                &Request::StopCache {
                    cache_id: *id,
                    no_writeback: true,
                },
                |_| {},
            );
        }
        let _ = call(&self.admin, &Request::Shutdown, |_| {});
        self.end(Duration::from_secs(10));
    }

    pub(super) fn end(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        let t = Instant::now();
        while t.elapsed() < grace {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: signalling our own child, not yet reaped (try_wait said it runs).
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(500));
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.end(Duration::ZERO);
    }
}
