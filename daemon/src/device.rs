//! Device strings (SPEC "CLI"): a path (file or block device), `ram:SIZE` (volatile),
//! `emu:PRESET:PATH` (a file with a device model applied in real time), `nbd:URI` (core only),
//! `rbd:POOL/IMAGE` (core only; not in this build yet), and for tests `powercut:PATH` (a file
//! whose writes not covered by a flush wait in a side log that survives the process, so a
//! power cut can be played on it after a SIGKILL: `tiercache_io::OverlayBackend`). Opening a
//! device also gives its identity for the core table (SPEC C18).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_engine::Device;
use tiercache_format::tables::CoreIdentity;
use tiercache_io::{FileBackend, NbdBackend, RamBackend};

/// What a device string names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A file or block device.
    Path(PathBuf),
    /// Volatile memory of this many bytes.
    Ram(u64),
    /// An emulated device: the whole string, and the file under it.
    Emu(String, PathBuf),
    /// Another NBD server's export.
    Nbd(String),
    /// A Ceph RBD image (pool/image).
    Rbd(String),
    /// A file with a process-surviving volatile write cache (tests of SIGKILL + power cut).
    PowerCut(PathBuf),
}

/// Parses a size with an optional `k`/`m`/`g`/`t` suffix (powers of 1024; `b` allowed after).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, mul) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (want a number with k/m/g/t, e.g. 4g)"))
}

impl DeviceSpec {
    /// Parses a device string.
    pub fn parse(s: &str) -> Result<DeviceSpec, String> {
        if s.is_empty() {
            return Err("empty device string".into());
        }
        if let Some(size) = s.strip_prefix("ram:") {
            let b = parse_size(size)?;
            if b == 0 || b % 512 != 0 {
                return Err(format!(
                    "ram:{size}: the size must be a non-zero multiple of 512"
                ));
            }
            return Ok(DeviceSpec::Ram(b));
        }
        if s.starts_with("emu:") {
            let t = tiercache_io::parse_emu(s)?;
            return Ok(DeviceSpec::Emu(s.to_string(), t.path));
        }
        if let Some(uri) = s.strip_prefix("nbd:") {
            if !(uri.starts_with("nbd://")
                || uri.starts_with("nbd+unix://")
                || uri.starts_with("nbds://"))
            {
                return Err(format!(
                    "'{s}': want nbd:URI, e.g. nbd:nbd+unix:///export?socket=/run/x.sock"
                ));
            }
            return Ok(DeviceSpec::Nbd(uri.to_string()));
        }
        if let Some(p) = s.strip_prefix("powercut:") {
            if p.is_empty() {
                return Err(format!("'{s}': want powercut:PATH"));
            }
            return Ok(DeviceSpec::PowerCut(PathBuf::from(p)));
        }
        if let Some(img) = s.strip_prefix("rbd:") {
            return Ok(DeviceSpec::Rbd(img.to_string()));
        }
        Ok(DeviceSpec::Path(PathBuf::from(s)))
    }

    /// Whether the device loses its content when the process ends.
    pub fn volatile(&self) -> bool {
        matches!(self, DeviceSpec::Ram(_))
    }

    /// The local file or block device under it, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            DeviceSpec::Path(p) | DeviceSpec::Emu(_, p) | DeviceSpec::PowerCut(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the device is there to be opened (a missing file or block device is not).
    pub fn present(&self) -> bool {
        self.path().is_none_or(|p| p.exists())
    }

    /// Opens the device.
    pub fn open(&self, shown: &str) -> Result<Device, String> {
        Ok(match self {
            DeviceSpec::Path(p) => {
                Arc::new(FileBackend::open(p).map_err(|e| format!("{shown}: cannot open: {e}"))?)
            }
            DeviceSpec::Ram(b) => Arc::new(RamBackend::new(b / 512)),
            DeviceSpec::PowerCut(p) => Arc::new(
                tiercache_io::OverlayBackend::open(p)
                    .map_err(|e| format!("{shown}: cannot open: {e}"))?,
            ),
            DeviceSpec::Emu(s, _) => Arc::new(tiercache_io::open_emu(s)?),
            DeviceSpec::Nbd(uri) => Arc::new(
                NbdBackend::connect(uri).map_err(|e| format!("{shown}: cannot connect: {e}"))?,
            ),
            DeviceSpec::Rbd(_) => {
                return Err(format!(
                    "{shown}: RBD devices are not in this build yet (Ceph support is issue 7)"
                ));
            }
        })
    }

    /// The identity the core table records (SPEC C18).
    pub fn identity(&self, shown: &str) -> Result<CoreIdentity, String> {
        match self {
            DeviceSpec::Path(p) | DeviceSpec::Emu(_, p) | DeviceSpec::PowerCut(p) => {
                tiercache_engine::identity::of_path(p).map_err(|e| format!("{shown}: {e}"))
            }
            DeviceSpec::Nbd(uri) => Ok(CoreIdentity::Nbd { uri: uri.clone() }),
            DeviceSpec::Ram(_) => Ok(CoreIdentity::Nbd { uri: "ram:".into() }),
            DeviceSpec::Rbd(_) => Err(format!("{shown}: RBD devices are not in this build yet")),
        }
    }
}

/// Allocates every block of a regular file (SPEC C21: no ENOSPC in the middle of a run).
/// Block devices and other kinds are left alone. Returns whether anything was done.
pub fn preallocate(path: &Path) -> Result<bool, String> {
    use std::os::unix::io::AsRawFd;
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !md.is_file() {
        return Ok(false);
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let len = i64::try_from(md.len()).map_err(|_| format!("{}: too large", path.display()))?;
    // SAFETY: a plain system call on a file descriptor we own; no memory is passed.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len) };
    match r {
        0 => Ok(true),
        libc::EOPNOTSUPP => Ok(false),
        e => Err(format!(
            "{}: preallocating {} bytes failed: {}",
            path.display(),
            len,
            std::io::Error::from_raw_os_error(e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2gib"), Ok(2 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn device_strings() {
        assert_eq!(DeviceSpec::parse("ram:1g"), Ok(DeviceSpec::Ram(1 << 30)));
        assert!(DeviceSpec::parse("ram:0").is_err());
        assert!(DeviceSpec::parse("ram:100").is_err());
        assert_eq!(
            DeviceSpec::parse("/dev/sdb"),
            Ok(DeviceSpec::Path("/dev/sdb".into()))
        );
        assert!(DeviceSpec::parse("emu:nope:/x").is_err());
        assert!(matches!(
            DeviceSpec::parse("emu:hdd-10k-sas:/x:y"),
            Ok(DeviceSpec::Emu(_, p)) if p == Path::new("/x:y")
        ));
        assert!(DeviceSpec::parse("nbd:http://x").is_err());
        assert!(DeviceSpec::parse("nbd:nbd+unix:///e?socket=/s").is_ok());
        assert!(DeviceSpec::parse("").is_err());
    }
}
