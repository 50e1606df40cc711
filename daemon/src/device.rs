//! Device strings (SPEC "CLI"): a path (file or block device), `ram:SIZE` (volatile),
//! `emu:PRESET:PATH` (a file with a device model applied in real time), `nbd:URI` (core only),
//! `rbd:POOL/IMAGE[:conf=FILE][:id=ID]` (core only: a Ceph RBD image through librbd, loaded at
//! run time; docs/CEPH.md), and for tests `powercut:PATH` (a file
//! whose writes not covered by a flush wait in a side log that survives the process, so a
//! power cut can be played on it after a SIGKILL: `tiercache_io::OverlayBackend`) and
//! `faulty:PATH` (a file whose IOs fail while the control file `PATH.fail` exists: see
//! [`FaultyFile`]). Opening a device also gives its identity for the core table (SPEC C18).
//!
//! A device may be wrapped in an IO timeout ([`with_timeout`], the `io_timeout` of the config
//! file and `--io-timeout` of `start-cache` / `add-core`): an IO the device does not finish in
//! time fails with `TimedOut`, which the cache handles as any device error (a client whose
//! request needed it gets `EIO`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tiercache_core::units::BLOCK_BYTES;
use tiercache_engine::Device;
use tiercache_format::tables::CoreIdentity;
use tiercache_io::{
    Backend, FileBackend, IoErr, NbdBackend, NbdEvent, RamBackend, RbdBackend, RbdTarget,
    TimeoutBackend,
};

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
    /// A Ceph RBD image (pool/image, config file and client id).
    Rbd(RbdTarget),
    /// A file with a process-surviving volatile write cache (tests of SIGKILL + power cut).
    PowerCut(PathBuf),
    /// A file whose IOs fail while a control file exists (tests of device errors).
    Faulty(PathBuf),
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

/// A size as one token that [`parse_size`] reads back exactly, in the largest power of 1024
/// that divides it: `4KiB`, `1MiB`, `3GiB`, `1000B`.
pub fn format_size(b: u64) -> String {
    ["TiB", "GiB", "MiB", "KiB"]
        .into_iter()
        .zip([40, 30, 20, 10])
        .find(|&(_, sh)| b != 0 && b.is_multiple_of(1 << sh))
        .map_or(format!("{b}B"), |(u, sh)| format!("{}{u}", b >> sh))
}

impl DeviceSpec {
    /// Parses a device string.
    pub fn parse(s: &str) -> Result<DeviceSpec, String> {
        if s.is_empty() {
            return Err("empty device string".into());
        }
        if let Some(size) = s.strip_prefix("ram:") {
            let b = parse_size(size)?;
            if b == 0 || b % BLOCK_BYTES != 0 {
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
        if let Some(p) = s.strip_prefix("faulty:") {
            if p.is_empty() {
                return Err(format!("'{s}': want faulty:PATH"));
            }
            return Ok(DeviceSpec::Faulty(PathBuf::from(p)));
        }
        if s.starts_with("rbd:") {
            return Ok(DeviceSpec::Rbd(tiercache_io::parse_rbd(s)?));
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
            DeviceSpec::Path(p)
            | DeviceSpec::Emu(_, p)
            | DeviceSpec::PowerCut(p)
            | DeviceSpec::Faulty(p) => Some(p),
            _ => None,
        }
    }

    /// Whether the device is there to be opened (a missing file or block device is not).
    pub fn present(&self) -> bool {
        self.path().is_none_or(|p| p.exists())
    }

    /// Opens the device. A local file or block device is claimed first: one daemon per device
    /// ([`crate::devlock`]).
    pub fn open(&self, shown: &str) -> Result<Device, String> {
        let lock = match self {
            DeviceSpec::PowerCut(_) => None, // the overlay takes its own lock
            _ => self
                .path()
                .map(|p| crate::devlock::DeviceLock::take(p, shown))
                .transpose()?,
        };
        let dev: Device = match self {
            DeviceSpec::Path(p) => {
                Arc::new(FileBackend::open(p).map_err(|e| format!("{shown}: cannot open: {e}"))?)
            }
            DeviceSpec::Ram(b) => Arc::new(RamBackend::new(b / BLOCK_BYTES)),
            DeviceSpec::PowerCut(p) => Arc::new(
                tiercache_io::OverlayBackend::open(p)
                    .map_err(|e| format!("{shown}: cannot open: {e}"))?,
            ),
            DeviceSpec::Faulty(p) => Arc::new(FaultyFile {
                inner: FileBackend::open(p).map_err(|e| format!("{shown}: cannot open: {e}"))?,
                ctl: control_file(p),
            }),
            DeviceSpec::Emu(s, _) => Arc::new(tiercache_io::open_emu(s)?),
            DeviceSpec::Nbd(uri) => {
                let b = NbdBackend::connect(uri)
                    .map_err(|e| format!("{shown}: cannot connect: {e}"))?;
                log_nbd_events(&b, shown);
                Arc::new(b)
            }
            DeviceSpec::Rbd(_) => self.open_core(shown)?.0,
        };
        Ok(match lock {
            Some(l) => Arc::new(crate::devlock::Locked::new(dev, l)),
            None => dev,
        })
    }

    /// Opens the device as a core: also gives the RBD handle of an `rbd:` device (for its
    /// dirty marker, SPEC C18), the same object as the device.
    pub fn open_core(&self, shown: &str) -> Result<(Device, Option<Arc<RbdBackend>>), String> {
        match self {
            DeviceSpec::Rbd(t) => {
                let b = Arc::new(RbdBackend::open_target(t).map_err(|e| rbd_msg(shown, e))?);
                Ok((b.clone(), Some(b)))
            }
            _ => Ok((self.open(shown)?, None)),
        }
    }

    /// The identity the core table records (SPEC C18); `held` is what
    /// [`crate::identity::Identity::of`] found (an RBD image's ids are taken from it).
    pub fn identity(
        &self,
        shown: &str,
        held: &crate::identity::Identity,
    ) -> Result<CoreIdentity, String> {
        match self {
            DeviceSpec::Path(p)
            | DeviceSpec::Emu(_, p)
            | DeviceSpec::PowerCut(p)
            | DeviceSpec::Faulty(p) => {
                tiercache_io::identity::of_path(p).map_err(|e| format!("{shown}: {e}"))
            }
            DeviceSpec::Nbd(uri) => Ok(CoreIdentity::Nbd { uri: uri.clone() }),
            DeviceSpec::Ram(_) => Ok(CoreIdentity::Nbd { uri: "ram:".into() }),
            DeviceSpec::Rbd(t) => {
                let id = match held.rbd() {
                    Some(id) => id.clone(),
                    None => tiercache_io::rbd_identity(t).map_err(|e| rbd_msg(shown, e))?,
                };
                Ok(CoreIdentity::Rbd {
                    pool_id: id.pool_id,
                    image_id: id.image_id,
                })
            }
        }
    }
}

/// The control file of `faulty:PATH`: `PATH.fail`.
pub fn control_file(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".fail");
    PathBuf::from(s)
}

/// `faulty:PATH`, a test aid: the file at PATH, whose IOs fail while the control file
/// `PATH.fail` exists. The control file's words choose which IOs fail — `read`, `write`
/// (writes, write-zeroes, trims), `flush`; all of them when it names none — and the error:
/// `eio` (the default), `enospc` or `timeout`. It is read at every IO, so a test switches
/// errors on and off while the daemon runs by creating and removing it.
pub struct FaultyFile {
    inner: FileBackend,
    ctl: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FaultyOp {
    Read,
    Write,
    Flush,
}

impl FaultyFile {
    fn check(&self, op: FaultyOp) -> Result<(), IoErr> {
        let Ok(words) = std::fs::read_to_string(&self.ctl) else {
            return Ok(());
        };
        let has = |w: &str| words.split_whitespace().any(|x| x.eq_ignore_ascii_case(w));
        let named = ["read", "write", "flush"].iter().any(|w| has(w));
        let hit = !named
            || match op {
                FaultyOp::Read => has("read"),
                FaultyOp::Write => has("write"),
                FaultyOp::Flush => has("flush"),
            };
        if !hit {
            return Ok(());
        }
        let what = format!(
            "{}: injected error ({} exists)",
            self.name(),
            self.ctl.display()
        );
        Err(if has("enospc") {
            IoErr::no_space(what)
        } else if has("timeout") {
            IoErr::timed_out(what)
        } else {
            IoErr::Io {
                kind: std::io::ErrorKind::Other,
                msg: what,
            }
        })
    }
}

/// Every IO checks the control file first: synchronous only, no ring descriptor (the ring
/// would bypass the check). Allocation queries go to the file.
impl Backend for FaultyFile {
    tiercache_io::forward_backend!(inner; blocks, extents);
    tiercache_io::sync_only_backend!();

    fn name(&self) -> String {
        format!("faulty:{}", self.inner.name())
    }
    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        self.check(FaultyOp::Read)?;
        self.inner.read(lba, buf)
    }
    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        self.check(FaultyOp::Write)?;
        self.inner.write(lba, buf, fua)
    }
    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        self.check(FaultyOp::Write)?;
        self.inner.write_zeroes(lba, blocks, fua)
    }
    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        self.check(FaultyOp::Write)?;
        self.inner.trim(lba, blocks)
    }
    fn flush(&self) -> Result<(), IoErr> {
        self.check(FaultyOp::Flush)?;
        self.inner.flush()
    }
}

/// Shortest and longest IO timeout accepted.
pub const IO_TIMEOUT_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3600));

/// An IO timeout as `parse_timeout` reads it back: `30s`, `500ms`, `2m`.
pub fn show_timeout(t: Duration) -> String {
    format_time(t)
}

/// A time as one token that [`parse_time`] reads back exactly, in the largest unit that
/// divides it: `500ms`, `30s`, `2m`, `1h` (`0s` for zero).
pub fn format_time(t: Duration) -> String {
    let ns = t.as_nanos();
    let units: [(u128, &str); 6] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    if ns == 0 {
        return "0s".into();
    }
    let (div, unit) = units
        .into_iter()
        .find(|(d, _)| ns.is_multiple_of(*d))
        .unwrap_or((1, "ns"));
    format!("{}{unit}", ns / div)
}

/// A time as a user writes it: a number with a unit as `humantime` reads it (`500ms`, `30s`,
/// `1.5s`, `2m`, `1h`, `1h 30m`), or a bare number, which counts `bare` units (what casadm
/// and older scripts pass). `None` when it is not a time.
pub fn parse_time(s: &str, bare: Duration) -> Option<Duration> {
    let t = s.trim();
    if let Ok(n) = t.parse::<f64>() {
        if !n.is_finite() || n < 0.0 || t.starts_with(['+', '-']) {
            return None;
        }
        return Duration::try_from_secs_f64(bare.as_secs_f64() * n).ok();
    }
    humantime::parse_duration(t).ok()
}

/// Parses an IO timeout: a time with a unit (`500ms`, `30s`, `2m`, `1h`; a bare number is
/// seconds), from 10 ms to 1 hour ([`IO_TIMEOUT_RANGE`]).
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let (lo, hi) = IO_TIMEOUT_RANGE;
    parse_time(s, Duration::from_secs(1))
        .filter(|d| (lo..=hi).contains(d))
        .ok_or_else(|| {
            format!(
                "io timeout '{s}': want a time from {} to {} (e.g. 500ms, 30s, 2m, 1h; a bare number is seconds)",
                format_time(lo),
                format_time(hi)
            )
        })
}

/// `dev` behind an IO timeout (`None`: as it is). Each IO then runs on a helper thread with
/// its own copy of the data (see `tiercache_io::TimeoutBackend`): a little slower, so only
/// where asked for.
pub fn with_timeout(dev: Device, timeout: Option<Duration>) -> Device {
    timed(dev, timeout).0
}

/// One log line when an `nbd:` device loses its server and one when it is connected again
/// (the backend reconnects by itself; requests meanwhile fail, and writeback retries).
fn log_nbd_events(b: &NbdBackend, shown: &str) {
    let shown = shown.to_string();
    b.on_event(move |ev| match ev {
        NbdEvent::Lost { why } => crate::log!(
            warn,
            "nbd device lost its server; reconnecting",
            device = shown,
            reason = why
        ),
        NbdEvent::Mismatch { why } => crate::log!(
            error,
            "nbd device: the server that answers offers another export; not used",
            device = shown,
            reason = why
        ),
        NbdEvent::Reconnected {
            down,
            attempts,
            connections,
        } => crate::log!(
            info,
            "nbd device reconnected",
            device = shown,
            down_s = format!("{:.1}", down.as_secs_f64()),
            attempts = attempts,
            connections = connections
        ),
    });
}

/// The timeout wrapper of a device, kept to change its limit later (`add-core --io-timeout`
/// on a core already attached).
pub type Timed = Arc<TimeoutBackend<Device>>;

/// [`with_timeout`], also handing back the wrapper (`None` without a timeout).
pub fn timed(dev: Device, timeout: Option<Duration>) -> (Device, Option<Timed>) {
    match timeout {
        Some(t) => {
            let w = Arc::new(TimeoutBackend::new(dev, t));
            (w.clone(), Some(w))
        }
        None => (dev, None),
    }
}

/// An RBD error as one line: librbd's message (which names the image) without the IO-error
/// wrapping, after the device string when that says more.
pub(crate) fn rbd_msg(shown: &str, e: IoErr) -> String {
    let msg = match e {
        IoErr::Io { msg, .. } => msg,
        e => e.to_string(),
    };
    match msg.split_once(": ") {
        Some((dev, rest)) if shown.starts_with(dev) => format!("{shown}: {rest}"),
        _ => msg,
    }
}

/// The device string of a core given with `--ceph-conf` / `--ceph-id` (add-core, the config
/// file's `ceph_conf` / `ceph_id`): those become the `:conf=` and `:id=` options of an `rbd:`
/// device string. They are refused on other devices, and when the string already says
/// otherwise. Without them the string is returned as given.
pub fn with_ceph_options(
    device: &str,
    conf: Option<&str>,
    id: Option<&str>,
) -> Result<String, String> {
    if conf.is_none() && id.is_none() {
        return Ok(device.to_string());
    }
    let Ok(DeviceSpec::Rbd(mut t)) = DeviceSpec::parse(device) else {
        DeviceSpec::parse(device)?;
        return Err(format!(
            "--ceph-conf and --ceph-id apply to rbd:POOL/IMAGE devices only, not to '{device}'"
        ));
    };
    if let Some(c) = conf {
        let p = PathBuf::from(c);
        if c.is_empty() || c.contains(':') {
            return Err(format!(
                "--ceph-conf '{c}': want a path without ':' (the device string's separator)"
            ));
        }
        match &t.opts.conf {
            Some(old) if *old != p => {
                return Err(format!(
                    "{device} already names the config {}; --ceph-conf {c} contradicts it",
                    old.display()
                ));
            }
            _ => t.opts.conf = Some(p),
        }
    }
    if let Some(i) = id {
        let i = i.strip_prefix("client.").unwrap_or(i);
        match &t.opts.id {
            Some(old) if old != i => {
                return Err(format!(
                    "{device} already names client.{old}; --ceph-id {i} contradicts it"
                ));
            }
            _ => t.opts.id = Some(i.to_string()),
        }
    }
    let s = t.device_string();
    tiercache_io::parse_rbd(&s)?;
    Ok(s)
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
        assert!(matches!(
            DeviceSpec::parse("rbd:rbd/vm1:id=tc"),
            Ok(DeviceSpec::Rbd(t)) if t.pool == "rbd" && t.image == "vm1" && t.opts.client_id() == "tc"
        ));
        assert!(DeviceSpec::parse("rbd:vm1").is_err());
        assert!(DeviceSpec::parse("rbd:rbd/vm1").unwrap().path().is_none());
        assert!(DeviceSpec::parse("faulty:").is_err());
        assert_eq!(
            DeviceSpec::parse("faulty:/x/c.img"),
            Ok(DeviceSpec::Faulty("/x/c.img".into()))
        );
    }

    /// The device strings the tests use (`powercut:`, `faulty:`) open devices that pass the
    /// same conformance suite as every backend (io's `conformance`), opened the way the daemon
    /// opens them; what a flush made durable survives a reopen (and, for `powercut:`, a power
    /// cut that drops everything else), and `faulty:` fails IOs only while its control file
    /// exists.
    #[test]
    fn test_device_strings_pass_the_conformance_suite() {
        use tiercache_io::conformance::{self, pattern};
        use tiercache_io::{OverlayBackend, PowerCutPattern};
        let dir = std::env::temp_dir().join(format!("tc-devconf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let blocks = 4096u64;
        for kind in ["powercut", "faulty", "file"] {
            let path = dir.join(format!("{kind}.img"));
            let f = std::fs::File::create(&path).unwrap();
            f.set_len(blocks * 512).unwrap();
            drop(f);
            let spec = if kind == "file" {
                path.display().to_string()
            } else {
                format!("{kind}:{}", path.display())
            };
            let d = DeviceSpec::parse(&spec).unwrap().open(&spec).unwrap();
            println!("IO path of {spec}: {}", d.name());
            assert_eq!(d.blocks(), blocks);
            conformance::conformance(&*d);
            // Written after the suite's last flush: not durable.
            d.write(0, &pattern(9, 0, 8 * 512), false).unwrap();
            drop(d);
            if kind == "powercut" {
                let r = OverlayBackend::power_cut(&path, PowerCutPattern::DropAll).unwrap();
                assert!(r.reverted >= 8, "the un-flushed write was pending: {r:?}");
            }
            let d = DeviceSpec::parse(&spec).unwrap().open(&spec).unwrap();
            conformance::verify_persisted(&*d);
            let mut b = vec![0u8; 8 * 512];
            d.read(0, &mut b).unwrap();
            assert_eq!(
                b == pattern(9, 0, 8 * 512),
                kind != "powercut",
                "{spec}: an un-flushed write after a power cut (dropped) or a reopen (kept)"
            );
            if kind == "faulty" {
                let ctl = control_file(&path);
                std::fs::write(&ctl, "write enospc").unwrap();
                assert!(matches!(
                    d.write(0, &b, false),
                    Err(e) if e.to_string().contains("injected error")
                ));
                assert!(d.read(0, &mut b).is_ok(), "only writes fail");
                std::fs::remove_file(&ctl).unwrap();
                d.write(0, &b, false).unwrap();
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_timeout("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_timeout("1m 30s"), Ok(Duration::from_secs(90)));
        for bad in [
            "", "x", "5ms", "2h", "-1s", "nan", "1e300", "61m", "-0", "1M",
        ] {
            let e = parse_timeout(bad).unwrap_err();
            assert!(
                e.contains("io timeout") && e.contains("from 10ms to 1h"),
                "{bad}: {e}"
            );
        }
        for b in [0, 1000, 4096, 1 << 20, 3 << 30, 5 << 40, (1 << 20) + 1024] {
            assert_eq!(parse_size(&format_size(b)), Ok(b), "{}", format_size(b));
        }
        for t in [
            "0s", "10ms", "1500ms", "90s", "2m", "1h", "25h", "3us", "7ns",
        ] {
            let d = parse_time(t, Duration::from_secs(1)).unwrap();
            assert_eq!(format_time(d), t, "{t} reads back as itself");
        }
        assert_eq!(
            parse_time("1.5", Duration::from_secs(1)),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_time("20", Duration::from_millis(1)),
            Some(Duration::from_millis(20))
        );
    }

    #[test]
    fn faulty_file_fails_while_its_control_file_exists() {
        let dir = std::env::temp_dir().join(format!("tc-faulty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.img");
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        let s = format!("faulty:{}", p.display());
        let d = DeviceSpec::parse(&s).unwrap().open(&s).unwrap();
        let data = vec![7u8; 4096];
        let mut buf = vec![0u8; 4096];
        d.write(8, &data, false).unwrap();
        let ctl = control_file(&p);
        std::fs::write(&ctl, "").unwrap();
        assert!(d.read(8, &mut buf).is_err());
        assert!(d.write(8, &data, false).is_err());
        assert!(d.flush().is_err());
        std::fs::write(&ctl, "write enospc").unwrap();
        d.read(8, &mut buf).unwrap();
        assert_eq!(buf, data);
        let e = d.write(8, &data, false).unwrap_err();
        assert!(e.is_no_space(), "{e}");
        d.flush().unwrap();
        std::fs::write(&ctl, "flush timeout").unwrap();
        assert!(d.flush().unwrap_err().is_timed_out());
        std::fs::remove_file(&ctl).unwrap();
        d.flush().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ceph_options() {
        assert_eq!(
            with_ceph_options("/dev/sdb", None, None),
            Ok("/dev/sdb".into())
        );
        assert_eq!(
            with_ceph_options("rbd:rbd/vm1", Some("/etc/ceph/c.conf"), Some("client.tc")),
            Ok("rbd:rbd/vm1:conf=/etc/ceph/c.conf:id=tc".into())
        );
        assert_eq!(
            with_ceph_options("rbd:rbd/vm1:id=tc", None, Some("tc")),
            Ok("rbd:rbd/vm1:id=tc".into())
        );
        assert!(with_ceph_options("rbd:rbd/vm1:id=a", None, Some("b")).is_err());
        assert!(with_ceph_options("/dev/sdb", Some("/etc/ceph/ceph.conf"), None).is_err());
        assert!(with_ceph_options("rbd:rbd/vm1", Some("/a:b"), None).is_err());
        assert!(with_ceph_options("rbd:rbd/vm1", None, Some("bad id")).is_err());
    }
}
