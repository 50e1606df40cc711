//! Starting and stopping an `nbdkit` server for the tests.

#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
pub use tiercache_testkit::installed;
use tiercache_testkit::{Dir, Proc};

/// An `nbdkit` process on a unix socket in a private directory; killed (by its own pid)
/// and cleaned up on drop.
pub struct NbdKit {
    // Declared before `dir`: the process is killed before its directory is removed.
    child: Proc,
    dir: Dir,
    /// The URI of its default export.
    pub uri: String,
}

impl NbdKit {
    /// Starts `nbdkit -U SOCK -P PIDFILE -f --exit-with-parent ARGS...`; `None` (after printing a skip
    /// line) when nbdkit is not installed.
    pub fn start(test: &str, args: &[&str]) -> Option<NbdKit> {
        if !installed("nbdkit") {
            println!("skipped: {test}: nbdkit not installed (apt-get install -y nbdkit)");
            return None;
        }
        let dir = Dir::fresh("loadgen");
        let sock = dir.join("nbd.sock");
        let pidfile = dir.join("nbdkit.pid");
        let child = Proc::spawn(
            "nbdkit",
            Command::new("nbdkit")
                .arg("-U")
                .arg(&sock)
                .arg("-P")
                .arg(&pidfile)
                .args(["-f", "--exit-with-parent"])
                .args(args)
                .stdin(Stdio::null()),
        );
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
