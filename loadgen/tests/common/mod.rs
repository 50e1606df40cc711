//! Starting and stopping an `nbdkit` server for the tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// An `nbdkit` process on a unix socket in a private directory; killed (by its own pid)
/// and cleaned up on drop.
pub struct NbdKit {
    child: Child,
    dir: PathBuf,
    /// The URI of its default export.
    pub uri: String,
}

/// True when `prog --version` runs.
pub fn installed(prog: &str) -> bool {
    Command::new(prog)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl NbdKit {
    /// Starts `nbdkit -U SOCK -P PIDFILE -f --exit-with-parent ARGS...`; `None` (after printing a skip
    /// line) when nbdkit is not installed.
    pub fn start(test: &str, args: &[&str]) -> Option<NbdKit> {
        if !installed("nbdkit") {
            println!("skipped: {test}: nbdkit not installed (apt-get install -y nbdkit)");
            return None;
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tiercache-loadgen-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("nbd.sock");
        let pidfile = dir.join("nbdkit.pid");
        let child = Command::new("nbdkit")
            .arg("-U")
            .arg(&sock)
            .arg("-P")
            .arg(&pidfile)
            .args(["-f", "--exit-with-parent"])
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let kit = NbdKit { child, dir, uri };
        let t = Instant::now();
        // nbdkit writes its pidfile once it accepts connections.
        while std::fs::read_to_string(&pidfile).map_or(true, |s| !s.ends_with('\n')) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "nbdkit did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(kit)
    }
}

impl Drop for NbdKit {
    fn drop(&mut self) {
        // Child::kill signals exactly the process we spawned.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
