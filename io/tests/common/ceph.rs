//! A throw-away Ceph cluster for a test binary, started and stopped by
//! `scripts/ceph-cluster.sh` (also used by cli/tests/ceph.rs through `#[path]`).
//!
//! [`shared`] starts one cluster per test process (in a fresh temp dir, on free ports) the
//! first time a test asks, and stops it when the process exits: an `atexit` hook runs the
//! script's `stop` (which signals exactly the PIDs it recorded), and the script's watcher
//! (`--watch-pid`, our PID) stops it too if the process is killed outright. A test that
//! panics does not stop the others' cluster. Each test makes its own images in it.
//!
//! [`Cluster::start`] gives a cluster of one's own, stopped on drop (panics included).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The script, from the crate that includes this file (io/ or cli/).
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh")
}

/// Whether the Ceph daemons are installed; prints why the caller skips when they are not.
pub fn installed(test: &str) -> bool {
    let ok = tiercache_testkit::installed("ceph-mon");
    if !ok {
        println!("skipped: {test}: ceph-mon is not installed (scripts/test.sh installs it)");
    }
    ok
}

/// A cluster started by the script in its own directory.
pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    /// How long `start` took (printed by the script as "up in N s").
    pub startup: Duration,
    stopped: std::sync::atomic::AtomicBool,
}

impl Cluster {
    /// Starts a cluster (1 OSD, BlueStore on a sparse file) with `extra` start options.
    /// Panics with the script's output when it fails.
    pub fn start(tag: &str, extra: &[&str]) -> Cluster {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tc-ceph-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let t = Instant::now();
        let out = Command::new(script())
            .arg("start")
            .arg(&dir)
            .args(["--watch-pid", &std::process::id().to_string()])
            .args(["--osd-size", "4G"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/ceph-cluster.sh");
        let startup = t.elapsed();
        let c = Cluster {
            conf: dir.join("ceph.conf"),
            dir,
            startup,
            stopped: false.into(),
        };
        assert!(
            out.status.success(),
            "ceph-cluster.sh start failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "{}(measured by the test: {:.2} s)",
            String::from_utf8_lossy(&out.stdout),
            startup.as_secs_f64()
        );
        c
    }

    /// Stops the cluster (exactly the processes the script started); idempotent.
    pub fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let t = Instant::now();
        let out = Command::new(script())
            .arg("stop")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                println!("cluster stopped in {:.2} s", t.elapsed().as_secs_f64())
            }
            Ok(o) => eprintln!(
                "ceph-cluster.sh stop failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("ceph-cluster.sh stop: {e}"),
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The `env` lines of the script, as (name, value).
    pub fn env(&self) -> Vec<(String, String)> {
        let out = Command::new(script())
            .arg("env")
            .arg(&self.dir)
            .output()
            .expect("ceph-cluster.sh env");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Runs a Ceph CLI tool (`rbd`, `ceph`) against the cluster, bounded by `timeout`.
    pub fn cli(&self, tool: &str, args: &[&str]) -> Output {
        Command::new("timeout")
            .args(["-k", "5", "120", tool, "-c"])
            .arg(&self.conf)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"))
    }

    /// `rbd ARGS`, which must succeed; its stdout.
    pub fn rbd(&self, args: &[&str]) -> String {
        let o = self.cli("rbd", args);
        assert!(
            o.status.success(),
            "rbd {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Creates `rbd/NAME` of `mib` MiB (default features: layering, exclusive-lock, ...).
    pub fn create_image(&self, name: &str, mib: u64) {
        self.rbd(&[
            "create",
            "--size",
            &format!("{mib}M"),
            &format!("rbd/{name}"),
        ]);
    }

    /// The `rbd:` device string of `rbd/NAME` with this cluster's config.
    pub fn device(&self, name: &str) -> String {
        format!("rbd:rbd/{name}:conf={}", self.conf.display())
    }

    /// The value of image metadata `key` (`rbd image-meta get`), `None` when absent.
    pub fn image_meta(&self, name: &str, key: &str) -> Option<String> {
        let o = self.cli("rbd", &["image-meta", "get", &format!("rbd/{name}"), key]);
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

extern "C" fn stop_shared_at_exit() {
    if let Some(c) = SHARED.get() {
        c.stop();
    }
}

/// The test process's shared cluster (started on first use); `None` (with a printed reason)
/// when Ceph is not installed.
pub fn shared(test: &str) -> Option<&'static Cluster> {
    shared_with(test, &[])
}

/// [`shared`], started with `extra` options when this call starts it.
pub fn shared_with(test: &str, extra: &[&str]) -> Option<&'static Cluster> {
    if !installed(test) {
        return None;
    }
    Some(SHARED.get_or_init(|| {
        let c = Cluster::start("shared", extra);
        // SAFETY: registering a plain `extern "C" fn()` with no preconditions; it runs once at
        // process exit (the test harness exits through `exit`), when no test runs any more.
        unsafe { libc::atexit(stop_shared_at_exit) };
        c
    }))
}

/// A unique image name for a test.
pub fn image_name(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{tag}-{}", N.fetch_add(1, Ordering::SeqCst))
}
