//! Attaching an NBD export as an OSD's data device: `nbd-client` onto `/dev/nbdX` where the
//! kernel has nbd devices, else `nbdfuse` (the export as a file in a FUSE mount).
//!
//! Used by `bench --study ceph-osd` (`bench_osd.rs`) and by `cli/tests/osd_kill.rs` (through
//! `#[path]`), so it depends on nothing else of the crate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How an OSD's data device is attached.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Attach {
    /// `nbd-client` (this program) onto `/dev/nbdX`.
    NbdClient(PathBuf),
    /// `nbdfuse` (this program): the export as a file in a FUSE mount.
    Nbdfuse(PathBuf),
}

impl Attach {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Attach::NbdClient(_) => "nbd-client",
            Attach::Nbdfuse(_) => "nbdfuse",
        }
    }
}

/// `name` in `$PATH` (and in /usr/sbin and /sbin, where nbd-client lives).
pub(crate) fn find_prog(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            (name == "nbd-client")
                .then(|| [PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
                .into_iter()
                .flatten(),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `nbd-client` where the kernel has nbd devices, else `nbdfuse`.
pub(crate) fn choose_attach(nbd0: bool) -> Result<Attach, String> {
    if nbd0 && let Some(p) = find_prog("nbd-client") {
        return Ok(Attach::NbdClient(p));
    }
    if let Some(p) = find_prog("nbdfuse") {
        return Ok(Attach::Nbdfuse(p));
    }
    Err(format!(
        "--study ceph-osd: an OSD's data device cannot be attached here: {} and nbdfuse is not installed (apt-get install nbdfuse)",
        if nbd0 {
            "nbd-client is not installed (apt-get install nbd-client)"
        } else {
            "there is no /dev/nbd0 (modprobe nbd, with nbd-client)"
        }
    ))
}

/// The arguments of `nbdfuse` showing `export` of the NBD server on unix socket `sock` as the
/// file `data` (in a FUSE mount at its directory).
pub(crate) fn nbdfuse_args(data: &Path, export: &str, sock: &Path) -> [String; 2] {
    [
        data.display().to_string(),
        format!("nbd+unix:///{export}?socket={}", sock.display()),
    ]
}

/// Waits until nbdfuse shows `file` with `bytes`; `alive` says whether nbdfuse still runs
/// (its error when it does not).
pub(crate) fn wait_fuse_file(
    file: &Path,
    bytes: u64,
    alive: &mut dyn FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let t = Instant::now();
    loop {
        if std::fs::metadata(file).is_ok_and(|m| m.len() == bytes) {
            return Ok(());
        }
        alive()?;
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("nbdfuse did not show {} in 30 s", file.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a file system is mounted at `dir`.
pub(crate) fn mounted(dir: &Path) -> bool {
    let shown = dir.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(&shown))
}

/// Unmounts the FUSE mount at `dir` if it is still mounted (nbdfuse unmounts at SIGTERM; this
/// is for one that was killed or hangs), lazily, then removes the directory.
pub(crate) fn unmount_fuse(dir: &Path) {
    if mounted(dir) {
        for prog in ["fusermount3", "fusermount"] {
            let ok = Command::new(prog)
                .args(["-u", "-z"])
                .arg(dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A `/dev/nbdX` that no client holds (other than those in `taken`).
pub(crate) fn free_nbd_dev(taken: &[(PathBuf, PathBuf)]) -> Result<PathBuf, String> {
    (0..64)
        .map(|i| (i, PathBuf::from(format!("/dev/nbd{i}"))))
        .find(|(i, d)| {
            d.exists()
                && !Path::new(&format!("/sys/block/nbd{i}/pid")).exists()
                && !taken.iter().any(|(_, t)| t == d)
        })
        .map(|(_, d)| d)
        .ok_or_else(|| "no free /dev/nbdX".to_string())
}

/// `nbd-client` (`prog`): `export` of the server on unix socket `sock` as `dev`.
pub(crate) fn nbd_client_attach(
    prog: &Path,
    export: &str,
    sock: &Path,
    dev: &Path,
) -> Result<(), String> {
    let o = Command::new(prog)
        .args(["-u", "-N", export])
        .arg(sock)
        .arg(dev)
        .args(["-b", "4096", "-t", "60"])
        .stdin(Stdio::null())
        .output();
    match o {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "nbd-client {}: {}",
            dev.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("nbd-client: {e}")),
    }
}

/// `nbd-client -d dev`.
pub(crate) fn nbd_client_detach(prog: &Path, dev: &Path) {
    let _ = Command::new(prog)
        .arg("-d")
        .arg(dev)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
