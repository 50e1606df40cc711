//! A `tiercache daemon` child of a benchmark, driven through its admin socket.

use super::procs::Procs;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tiercache_daemon::admin::{Request, call};

/// A `tiercache daemon` child of a benchmark, driven through its admin socket.
pub(crate) struct Daemon {
    pub(crate) pid: u32,
    admin: PathBuf,
    nbd: PathBuf,
}

impl Daemon {
    /// Starts the daemon (pinned to `cpu` if given, with `extra` arguments), its sockets and
    /// log in `scratch`.
    pub(crate) fn start(
        procs: &mut Procs,
        cpu: Option<usize>,
        extra: &[&str],
        scratch: &Path,
    ) -> Result<Daemon, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
        let admin = scratch.join("admin.sock");
        let nbd = scratch.join("tc-nbd.sock");
        let mut args = vec![
            "daemon".to_string(),
            "--socket".into(),
            admin.display().to_string(),
            "--metrics-listen".into(),
            "none".into(),
            "--nbd-listen".into(),
            format!("unix:{}", nbd.display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let pid = procs.spawn(
            "tiercache daemon",
            cpu,
            &exe,
            &args,
            &[],
            scratch.join("daemon.log"),
        )?;
        procs.wait_socket(pid, &admin)?;
        procs.wait_socket(pid, &nbd)?;
        Ok(Daemon { pid, admin, nbd })
    }

    pub(crate) fn call(&self, req: Request) -> Result<Value, String> {
        call(&self.admin, &req, |_| {})
    }

    pub(crate) fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.nbd.display())
    }

    pub(crate) fn start_cache(&self, id: u16, dev: &str, mode: &str) -> Result<Value, String> {
        self.call(Request::StartCache {
            cache_device: dev.into(),
            cache_id: Some(id),
            mode: Some(mode.into()),
            line_size: None,
            load: false,
            force: true,
            io_timeout: None,
            dry_run: false,
        })
    }

    pub(crate) fn add_core(&self, id: u16, dev: &str, export: &str) -> Result<Value, String> {
        self.call(Request::AddCore {
            cache_id: id,
            core_device: dev.into(),
            core_id: Some(0),
            export: Some(export.into()),
            io_timeout: None,
        })
    }

    pub(crate) fn cutoff_never(&self, id: u16) -> Result<(), String> {
        self.call(Request::SetParam {
            cache_id: id,
            core_id: None,
            name: "seq-cutoff".into(),
            values: vec![("policy".into(), "never".into())],
        })
        .map(|_| ())
    }

    pub(crate) fn stats(&self, id: u16) -> Result<Value, String> {
        self.call(Request::Stats {
            cache_id: Some(id),
            core_id: None,
            io_class: None,
        })
    }

    pub(crate) fn reset(&self, id: u16) -> Result<(), String> {
        self.call(Request::ResetCounters { cache_id: id })
            .map(|_| ())
    }

    /// Stops the daemon: caches with dirty data are stopped without writeback first (their
    /// devices are scratch files), then `shutdown`; SIGKILL if that takes more than 10 s.
    pub(crate) fn stop(&self, procs: &mut Procs, wb_caches: &[u16]) {
        for id in wb_caches {
            let _ = self.call(Request::StopCache {
                cache_id: *id,
                no_writeback: true,
            });
        }
        let _ = self.call(Request::Shutdown);
        procs.stop(self.pid, Duration::from_secs(10));
    }
}
