//! A Ceph RBD image as a [`Backend`] (SPEC C2, C14, C18, C22), through librbd loaded at run
//! time; see [`RbdBackend`]. Device string: `rbd:POOL/IMAGE[:conf=FILE][:id=ID]`
//! ([`parse_rbd`]).
//!
//! librados.so.2 and librbd.so.1 are opened with `dlopen` the first time an image is opened:
//! nothing links against Ceph, so tiercache builds and runs on machines without it, and only
//! opening an `rbd:` device there fails ("librbd is not installed: apt-get install librbd1").
//! The C functions used are declared here with the signatures of Ceph 16.2's `librbd.h` and
//! `librados.h` (stable C ABI since long before).
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | device strings ([`parse_rbd`]), [`RbdTarget`], errors, the [`RbdBackend`] type |
//! | `ffi.rs` | the C declarations and the library loaded with `dlopen` |
//! | `handle.rs` | cluster, pool and image handles; open, size, dirty marker, helper threads |
//! | `sync.rs` | the synchronous path (aio issued and waited for), batches, the `Backend` impl |
//! | `aio.rs` | the asynchronous path: completion callbacks and the completer thread |

use crate::{AsyncDone, AsyncReq, BLOCK, Backend, IoErr, Req, check_blocks};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::ErrorKind;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

mod aio;
mod ffi;
mod handle;
mod sync;

use aio::*;
use ffi::*;
use handle::*;

pub use ffi::rbd_available;
pub use handle::rbd_identity;

/// The image metadata key of the dirty marker (SPEC C18).
pub const DIRTY_KEY: &str = "tiercache.dirty";

/// The client id used when none is given (`client.admin`, as the `rbd` tool does).
pub const DEFAULT_CLIENT_ID: &str = "admin";

/// Largest buffer of zeros written at once when librbd has no `rbd_aio_write_zeroes`.
const ZERO_CHUNK: usize = 4 << 20;

/// The form of the device string, for error messages.
const RBD_FORM: &str = "want rbd:POOL/IMAGE[:conf=FILE][:id=ID]";

/// The functions of librados and librbd that tiercache calls.
///
/// Declared here, so that every file of this module reaches its fields; [`ffi`] loads it.
struct Lib {
    rados_create: FnRadosCreate,
    rados_conf_read_file: FnConfReadFile,
    rados_conf_set: FnConfSet,
    rados_conf_get: FnConfGet,
    rados_connect: FnRados,
    rados_shutdown: FnRadosVoid,
    rados_cluster_fsid: FnClusterFsid,
    rados_ioctx_create: FnIoctxCreate,
    rados_ioctx_get_id: FnIoctxGetId,
    rados_ioctx_destroy: FnIoctxVoid,
    rbd_open: FnOpen,
    rbd_open_read_only: FnOpen,
    rbd_close: FnImage,
    rbd_get_size: FnGetSize,
    rbd_get_id: FnGetId,
    rbd_stat: FnStat,
    rbd_aio_create_completion: FnCreateCompletion,
    rbd_aio_read: FnAioRead,
    rbd_aio_write: FnAioWrite,
    /// Absent from old librbd (before 14.x): zeros are then written as data.
    rbd_aio_write_zeroes: Option<FnAioWriteZeroes>,
    rbd_aio_flush: FnAioFlush,
    rbd_aio_wait_for_complete: FnComp,
    rbd_aio_get_return_value: FnCompRet,
    rbd_aio_release: FnCompVoid,
    rbd_lock_acquire: FnLockAcquire,
    rbd_lock_release: FnImage,
    rbd_metadata_get: FnMetaGet,
    rbd_metadata_set: FnMetaSet,
    rbd_metadata_remove: FnMetaRemove,
    /// The image's effective configuration (librbd 14 and later).
    rbd_config_image_list: Option<(FnConfigList, FnConfigListCleanup)>,
}

/// How to reach the cluster: `ceph.conf` and the cephx client id. The keyring is found the
/// usual way by librados (the `keyring` option of the config, else
/// `/etc/ceph/$cluster.$name.keyring` and the other default places).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RbdOptions {
    /// The config file; `None` lets librados search (`$CEPH_CONF`, `/etc/ceph/ceph.conf`,
    /// `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The client id (`admin` for `client.admin`); `None` means [`DEFAULT_CLIENT_ID`].
    pub id: Option<String>,
}

impl RbdOptions {
    /// The client id in use.
    pub fn client_id(&self) -> &str {
        self.id.as_deref().unwrap_or(DEFAULT_CLIENT_ID)
    }
}

/// A parsed `rbd:` device string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdTarget {
    /// Pool name.
    pub pool: String,
    /// Image name.
    pub image: String,
    /// Config file and client id.
    pub opts: RbdOptions,
}

impl RbdTarget {
    /// The canonical device string: `rbd:POOL/IMAGE`, then `:conf=FILE` and `:id=ID` when set.
    pub fn device_string(&self) -> String {
        let mut s = format!("rbd:{}/{}", self.pool, self.image);
        if let Some(c) = &self.opts.conf {
            s.push_str(&format!(":conf={}", c.display()));
        }
        if let Some(i) = &self.opts.id {
            s.push_str(&format!(":id={i}"));
        }
        s
    }

    /// `POOL/IMAGE`.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

fn name_ok(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '@', ':', '\0']) && !s.chars().any(char::is_whitespace)
}

/// Parses `rbd:POOL/IMAGE[:conf=FILE][:id=ID]` (the `rbd:` prefix is optional). Snapshots
/// (`@SNAP`) and RADOS namespaces (`POOL/NS/IMAGE`) are refused; a config path cannot contain
/// `:`.
pub fn parse_rbd(s: &str) -> Result<RbdTarget, String> {
    let shown = s.escape_debug().to_string();
    let rest = s.strip_prefix("rbd:").unwrap_or(s);
    let mut parts = rest.split(':');
    let spec = parts.next().unwrap_or("");
    let Some((pool, image)) = spec.split_once('/') else {
        return Err(format!("'{shown}': no pool/image ({RBD_FORM})"));
    };
    if image.contains('/') {
        return Err(format!(
            "'{shown}': RADOS namespaces (POOL/NAMESPACE/IMAGE) are not supported ({RBD_FORM})"
        ));
    }
    if image.contains('@') {
        return Err(format!(
            "'{shown}': snapshots are read-only and cannot be cores ({RBD_FORM})"
        ));
    }
    if !name_ok(pool) || !name_ok(image) {
        return Err(format!(
            "'{shown}': pool and image names must be non-empty, without spaces ({RBD_FORM})"
        ));
    }
    let mut opts = RbdOptions::default();
    for p in parts {
        match p.split_once('=') {
            Some(("conf", v)) if !v.is_empty() && opts.conf.is_none() => {
                opts.conf = Some(PathBuf::from(v))
            }
            Some(("id", v)) if name_ok(v) && opts.id.is_none() => opts.id = Some(v.to_string()),
            _ => {
                return Err(format!(
                    "'{shown}': bad option '{}' (options are conf=FILE and id=ID, once each; a path cannot contain ':'; {RBD_FORM})",
                    p.escape_debug()
                ));
            }
        }
    }
    Ok(RbdTarget {
        pool: pool.to_string(),
        image: image.to_string(),
        opts,
    })
}

/// What identifies an image whatever its name (SPEC C18; the core table's
/// `CoreIdentity::Rbd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdIdentity {
    /// The pool's id.
    pub pool_id: u64,
    /// The image's id (names can be reused; ids cannot).
    pub image_id: String,
    /// The cluster's fsid, when librados gives it (two config files may name one cluster).
    pub cluster_fsid: Option<String>,
}

/// The symbolic name of an errno value.
fn errno_name(e: c_int) -> &'static str {
    match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ERANGE => "ERANGE",
        libc::EDEADLK => "EDEADLK",
        libc::ENOSYS => "ENOSYS",
        libc::ENODATA => "ENODATA",
        libc::ETIME => "ETIME",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOTCONN => "ENOTCONN",
        libc::ESHUTDOWN => "ESHUTDOWN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EDQUOT => "EDQUOT",
        libc::ECANCELED => "ECANCELED",
        _ => "errno",
    }
}

/// What was being done when librados or librbd failed (it picks the message).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage<'a> {
    /// Reading the config file.
    Conf,
    /// Connecting to the cluster.
    Connect,
    /// Opening the pool.
    Pool,
    /// Opening the image.
    Open,
    /// Taking the exclusive lock.
    Lock,
    /// Anything else (IO, metadata): the string says what.
    Op(&'a str),
}

/// Says what a negative return value `r` of librados/librbd means for `target` at `stage`, in
/// one line (without the `rbd:POOL/IMAGE:` prefix).
fn describe(r: isize, target: &RbdTarget, stage: Stage<'_>) -> (ErrorKind, String) {
    let e = c_int::try_from(-r).unwrap_or(libc::EIO);
    let kind = std::io::Error::from_raw_os_error(e).kind();
    let spec = target.spec();
    let client = target.opts.client_id();
    let raw = || {
        let os = std::io::Error::from_raw_os_error(e).to_string();
        let os = os.split(" (os error").next().unwrap_or(&os).to_string();
        format!("{} ({os})", errno_name(e))
    };
    let msg = match (e, stage) {
        (libc::ENOENT, Stage::Conf) => match &target.opts.conf {
            Some(c) => format!("cannot read the ceph config {}: {}", c.display(), raw()),
            None => "no ceph config found (pass --ceph-conf FILE or set CEPH_CONF)".to_string(),
        },
        (libc::ENOENT, Stage::Connect) => format!(
            "no key for client.{client} found (a keyring named by the config's `keyring` option or in /etc/ceph), or the config names no monitor: {}",
            raw()
        ),
        (libc::ENOENT, Stage::Pool) => format!("pool {} not found", target.pool),
        (libc::ENOENT, Stage::Open) => format!("image {spec} not found"),
        (libc::EACCES | libc::EPERM, _) => {
            format!("cephx denied for client.{client} ({})", errno_name(e))
        }
        (libc::ETIMEDOUT | libc::ENOTCONN, _) => format!(
            "cluster not reachable (check --ceph-conf) ({})",
            errno_name(e)
        ),
        (libc::EBUSY | libc::EROFS, _) => format!(
            "image {spec} is locked by another client ({}; `rbd status {spec}` shows its watchers)",
            errno_name(e)
        ),
        (libc::EINVAL, Stage::Lock) => format!(
            "image {spec} cannot be locked: it lacks the exclusive-lock feature (rbd feature enable {spec} exclusive-lock)"
        ),
        (libc::ESHUTDOWN, _) => format!(
            "this client was blocklisted by the cluster (another client broke its lock on {spec}); attach the core again ({})",
            errno_name(e)
        ),
        (_, Stage::Conf) => format!("reading the ceph config failed: {}", raw()),
        (_, Stage::Connect) => format!("connecting to the cluster failed: {}", raw()),
        (_, Stage::Pool) => format!("opening pool {} failed: {}", target.pool, raw()),
        (_, Stage::Open) => format!("opening image {spec} failed: {}", raw()),
        (_, Stage::Lock) => format!("taking the exclusive lock failed: {}", raw()),
        (_, Stage::Op(what)) => format!("{what} failed: {}", raw()),
    };
    let msg = match (stage, e) {
        (Stage::Op(what), libc::EACCES | libc::EPERM | libc::EBUSY | libc::EROFS)
        | (Stage::Op(what), libc::ETIMEDOUT | libc::ENOTCONN | libc::ESHUTDOWN) => {
            format!("{what}: {msg}")
        }
        _ => msg,
    };
    (kind, msg)
}

fn rbd_err(r: isize, target: &RbdTarget, stage: Stage<'_>) -> IoErr {
    let (kind, msg) = describe(r, target, stage);
    IoErr::Io {
        kind,
        msg: format!("rbd:{}: {msg}", target.spec()),
    }
}

fn cstring(s: &str, what: &str) -> Result<CString, IoErr> {
    CString::new(s).map_err(|_| IoErr::Io {
        kind: ErrorKind::InvalidInput,
        msg: format!("{what} {:?} contains a NUL byte", s),
    })
}

/// A Ceph RBD image as a [`Backend`], named `rbd:POOL/IMAGE[:conf=FILE][:id=ID]`.
///
/// - **Connection**: librados reads the config (`conf`, else `$CEPH_CONF` and the default
///   places), connects as `client.ID` (default `client.admin`) with the keyring the config
///   names (or the default places). librados's own stderr logging is turned off (the returned
///   error says what failed) and its `client_mount_timeout` is lowered from 300 s to 30 s unless
///   the config sets it.
/// - **Exclusive lock**: taken at open with `rbd_lock_acquire(EXCLUSIVE)` and held until drop.
///   librbd then refuses every other client's request for the lock, so another client's writes
///   (and maintenance operations that need the lock, such as `rbd resize`, are proxied to us
///   and done by us) fail with `EROFS` while we hold it: `rbd bench --io-type write` exits with
///   "Read-only file system". Opening an image another live client holds fails at once with
///   "image … is locked by another client". A holder that died (SIGKILL) is detected by its
///   lost watch: the next open waits for the watch timeout (about 30 s), blocklists the dead
///   client and takes the lock.
/// - **IO**: asynchronous (`rbd_aio_*` with completions). [`Backend::submit_batch`] issues every
///   request of the batch before waiting for any (a flush in the batch first waits for the
///   requests before it); the single-request methods issue one and wait. FUA is the write
///   followed by a flush (one flush for all FUA writes of a batch). `write_zeroes` and `trim`
///   are `rbd_aio_write_zeroes` (whole objects are deallocated, partial ones zeroed: thin
///   images get space back, and trimmed blocks read back as zeros, which `rbd_aio_discard`
///   does not promise with librbd's default discard granularity); without it (librbd older
///   than 14) zeros are written.
/// - **Size**: [`Backend::blocks`] asks librbd each time (cheap: librbd refreshes its header
///   only when another client changed it), so a grown image (`rbd resize`) is seen; requests
///   are checked against the last size seen and, when they do not fit, against a fresh one.
/// - **Errors**: librbd's negative errno values become [`IoErr::Io`] of the matching kind with
///   one line: `ENOENT` "image POOL/IMAGE not found" (or "pool POOL not found"), `EACCES`/`EPERM`
///   "cephx denied for client.ID", `ETIMEDOUT`/`ENOTCONN` "cluster not reachable (check
///   --ceph-conf)", `EBUSY`/`EROFS` "image POOL/IMAGE is locked by another client", `ESHUTDOWN`
///   "this client was blocklisted", others their errno name and text.
/// - **Dirty marker** (SPEC C18): [`RbdBackend::set_dirty_marker`] writes or removes the image
///   metadata key `tiercache.dirty` = `dirty in tiercache <uuid>`.
pub struct RbdBackend {
    lib: &'static Lib,
    target: RbdTarget,
    // Dropped in this order: image, pool context, cluster handle.
    image: Image,
    io: Ioctx,
    _cluster: Cluster,
    identity: RbdIdentity,
    obj_size: u64,
    /// The size in blocks last seen.
    size_blocks: AtomicU64,
    /// A [`RbdBackend::refresh_size_within`] query is still waiting for librbd.
    size_query: AtomicBool,
    /// A [`RbdBackend::set_dirty_marker_within`] update is still waiting for librbd.
    marker_op: AtomicBool,
    /// Whether a completed write is already durable on the cluster: librbd's own cache is off
    /// for this image (`rbd_cache = false` in its effective configuration), so a write
    /// completes only once the OSDs committed it. A flush then has nothing to make durable.
    completed_durable: bool,
    /// The asynchronous path's completion thread, started by the first
    /// [`Backend::submit_async`].
    completer: OnceLock<Completer>,
}

// SAFETY: librados cluster handles, I/O contexts and librbd image handles may be used from
// any thread and by several threads at once (librbd's API is thread-safe; aio completions are
// waited for by the thread that issued them). The handles are plain pointers only closed in
// Drop, when no other reference exists.
unsafe impl Send for RbdBackend {}
// SAFETY: as for Send: every method takes `&self` and only calls thread-safe librbd functions.
unsafe impl Sync for RbdBackend {}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("name", &self.name())
            .field("identity", &self.identity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        let t = parse_rbd("rbd:rbd/img").unwrap();
        assert_eq!((t.pool.as_str(), t.image.as_str()), ("rbd", "img"));
        assert_eq!(t.opts, RbdOptions::default());
        assert_eq!(t.device_string(), "rbd:rbd/img");
        let t = parse_rbd("rbd:p/i:conf=/etc/ceph/x.conf:id=tc").unwrap();
        assert_eq!(
            t.opts.conf.as_deref(),
            Some(std::path::Path::new("/etc/ceph/x.conf"))
        );
        assert_eq!(t.opts.client_id(), "tc");
        assert_eq!(t.device_string(), "rbd:p/i:conf=/etc/ceph/x.conf:id=tc");
        assert_eq!(
            parse_rbd("p/i:id=a").unwrap().device_string(),
            "rbd:p/i:id=a"
        );
        for bad in [
            "rbd:",
            "rbd:img",
            "rbd:/img",
            "rbd:p/",
            "rbd:p/ns/img",
            "rbd:p/img@snap",
            "rbd:p/img:bogus=1",
            "rbd:p/img:conf=",
            "rbd:p/img:id=a:id=b",
            "rbd:p q/img",
        ] {
            let e = parse_rbd(bad).unwrap_err();
            assert!(
                !e.contains('\n') && e.contains("rbd:POOL/IMAGE"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn error_messages() {
        let t = parse_rbd("rbd:pool/img:id=tc").unwrap();
        let m = |r: c_int, s: Stage<'_>| describe(-(r as isize), &t, s).1;
        assert_eq!(m(libc::ENOENT, Stage::Open), "image pool/img not found");
        assert_eq!(m(libc::ENOENT, Stage::Pool), "pool pool not found");
        assert!(m(libc::EACCES, Stage::Connect).starts_with("cephx denied for client.tc"));
        assert!(m(libc::EPERM, Stage::Open).starts_with("cephx denied for client.tc"));
        assert!(
            m(libc::ETIMEDOUT, Stage::Connect)
                .starts_with("cluster not reachable (check --ceph-conf)")
        );
        assert!(
            m(libc::EROFS, Stage::Lock).starts_with("image pool/img is locked by another client")
        );
        assert!(
            m(libc::EBUSY, Stage::Lock).starts_with("image pool/img is locked by another client")
        );
        assert!(m(libc::EIO, Stage::Op("write")).contains("EIO"));
        assert!(m(libc::EROFS, Stage::Op("write")).starts_with("write: image pool/img is locked"));
        let (kind, _) = describe(-(libc::ENOENT as isize), &t, Stage::Open);
        assert_eq!(kind, ErrorKind::NotFound);
    }
}
