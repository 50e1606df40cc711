//! A Ceph RBD image as a [`Backend`] (SPEC C2, C14, C18, C22), through librbd loaded at run
//! time; see [`RbdBackend`]. Device string: `rbd:POOL/IMAGE[:conf=FILE][:id=ID]`
//! ([`parse_rbd`]).
//!
//! librados.so.2 and librbd.so.1 are opened with `dlopen` the first time an image is opened:
//! nothing links against Ceph, so tiercache builds and runs on machines without it, and only
//! opening an `rbd:` device there fails ("librbd is not installed: apt-get install librbd1").
//! The C functions used are declared here with the signatures of Ceph 16.2's `librbd.h` and
//! `librados.h` (stable C ABI since long before).

use crate::{AsyncDone, AsyncReq, BLOCK, Backend, IoErr, Req, check_blocks};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::ErrorKind;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// The image metadata key of the dirty marker (SPEC C18).
pub const DIRTY_KEY: &str = "tiercache.dirty";

/// The client id used when none is given (`client.admin`, as the `rbd` tool does).
pub const DEFAULT_CLIENT_ID: &str = "admin";

/// Largest buffer of zeros written at once when librbd has no `rbd_aio_write_zeroes`.
const ZERO_CHUNK: usize = 4 << 20;

/// The form of the device string, for error messages.
const RBD_FORM: &str = "want rbd:POOL/IMAGE[:conf=FILE][:id=ID]";

type RadosT = *mut c_void;
type IoctxT = *mut c_void;
type ImageT = *mut c_void;
type CompT = *mut c_void;

/// `rbd_image_info_t` of librbd.h.
#[repr(C)]
struct ImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

type FnRadosCreate = unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int;
type FnConfReadFile = unsafe extern "C" fn(RadosT, *const c_char) -> c_int;
type FnConfSet = unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int;
type FnConfGet = unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int;
type FnRados = unsafe extern "C" fn(RadosT) -> c_int;
type FnRadosVoid = unsafe extern "C" fn(RadosT);
type FnClusterFsid = unsafe extern "C" fn(RadosT, *mut c_char, usize) -> c_int;
type FnIoctxCreate = unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int;
type FnIoctxGetId = unsafe extern "C" fn(IoctxT) -> i64;
type FnIoctxVoid = unsafe extern "C" fn(IoctxT);
type FnOpen = unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int;
type FnImage = unsafe extern "C" fn(ImageT) -> c_int;
type FnGetSize = unsafe extern "C" fn(ImageT, *mut u64) -> c_int;
type FnGetId = unsafe extern "C" fn(ImageT, *mut c_char, usize) -> c_int;
type FnStat = unsafe extern "C" fn(ImageT, *mut ImageInfo, usize) -> c_int;
type FnCreateCompletion = unsafe extern "C" fn(
    *mut c_void,
    Option<unsafe extern "C" fn(CompT, *mut c_void)>,
    *mut CompT,
) -> c_int;
type FnAioRead = unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompT) -> c_int;
type FnAioWrite = unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompT) -> c_int;
type FnAioWriteZeroes = unsafe extern "C" fn(ImageT, u64, usize, CompT, c_int, c_int) -> c_int;
type FnAioFlush = unsafe extern "C" fn(ImageT, CompT) -> c_int;
type FnComp = unsafe extern "C" fn(CompT) -> c_int;
type FnCompRet = unsafe extern "C" fn(CompT) -> isize;
type FnCompVoid = unsafe extern "C" fn(CompT);
type FnLockAcquire = unsafe extern "C" fn(ImageT, c_int) -> c_int;
type FnMetaGet = unsafe extern "C" fn(ImageT, *const c_char, *mut c_char, *mut usize) -> c_int;
type FnMetaSet = unsafe extern "C" fn(ImageT, *const c_char, *const c_char) -> c_int;
type FnMetaRemove = unsafe extern "C" fn(ImageT, *const c_char) -> c_int;
type FnConfigList = unsafe extern "C" fn(ImageT, *mut ConfigOption, *mut c_int) -> c_int;
type FnConfigListCleanup = unsafe extern "C" fn(*mut ConfigOption, c_int);

/// `rbd_config_option_t` of librbd.h.
#[repr(C)]
struct ConfigOption {
    name: *mut c_char,
    value: *mut c_char,
    source: c_int,
}

/// `RBD_LOCK_MODE_EXCLUSIVE`.
const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

/// The functions of librados and librbd that tiercache calls.
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

/// The last `dlerror()` message, or `what` when there is none.
fn dlerror_or(what: &str) -> String {
    // SAFETY: dlerror takes no arguments; it returns NULL or a NUL-terminated string owned by
    // libc that stays valid until the next dl* call on this thread, and we copy it at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        what.to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`; the handle is never closed (the libraries stay loaded
/// for the life of the process, as librados expects).
fn dlopen(name: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `name` is a NUL-terminated string; dlopen runs the library's initialisers, which
    // for librados/librbd only set up static state.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        Err(dlerror_or("dlopen failed"))
    } else {
        Ok(h)
    }
}

/// The library to open: `$var` when set (a librbd/librados built elsewhere, or a path that
/// does not exist to see what a machine without Ceph does), else `default`.
fn lib_name(var: &str, default: &CStr) -> Result<CString, String> {
    match std::env::var_os(var) {
        Some(v) => CString::new(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()))
            .map_err(|_| format!("{var} contains a NUL byte")),
        None => Ok(default.to_owned()),
    }
}

/// Looks `name` up in `h`.
fn dlsym(h: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `h` is a live handle from dlopen (never closed) and `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Resolves a required symbol into a function pointer of type `$t`.
macro_rules! sym {
    ($h:expr, $name:literal, $t:ty) => {{
        let p = dlsym($h, $name).ok_or_else(|| {
            format!(
                "{} lacks {} (too old a Ceph? tiercache needs 16.2 or newer)",
                stringify!($h),
                $name.to_string_lossy()
            )
        })?;
        // SAFETY: `p` is the address of the exported C function of that name, whose signature
        // in Ceph's public headers (librados.h / librbd.h) is exactly `$t`.
        unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
    }};
}

impl Lib {
    fn load() -> Result<Lib, String> {
        // librbd first: it needs librados, so a machine with neither gets the librbd line.
        let librbd = dlopen(&lib_name("TIERCACHE_LIBRBD", c"librbd.so.1")?)
            .map_err(|e| format!("librbd is not installed: apt-get install librbd1 ({e})"))?;
        let librados = dlopen(&lib_name("TIERCACHE_LIBRADOS", c"librados.so.2")?)
            .map_err(|e| format!("librados is not installed: apt-get install librados2 ({e})"))?;
        Ok(Lib {
            rados_create: sym!(librados, c"rados_create", FnRadosCreate),
            rados_conf_read_file: sym!(librados, c"rados_conf_read_file", FnConfReadFile),
            rados_conf_set: sym!(librados, c"rados_conf_set", FnConfSet),
            rados_conf_get: sym!(librados, c"rados_conf_get", FnConfGet),
            rados_connect: sym!(librados, c"rados_connect", FnRados),
            rados_shutdown: sym!(librados, c"rados_shutdown", FnRadosVoid),
            rados_cluster_fsid: sym!(librados, c"rados_cluster_fsid", FnClusterFsid),
            rados_ioctx_create: sym!(librados, c"rados_ioctx_create", FnIoctxCreate),
            rados_ioctx_get_id: sym!(librados, c"rados_ioctx_get_id", FnIoctxGetId),
            rados_ioctx_destroy: sym!(librados, c"rados_ioctx_destroy", FnIoctxVoid),
            rbd_open: sym!(librbd, c"rbd_open", FnOpen),
            rbd_open_read_only: sym!(librbd, c"rbd_open_read_only", FnOpen),
            rbd_close: sym!(librbd, c"rbd_close", FnImage),
            rbd_get_size: sym!(librbd, c"rbd_get_size", FnGetSize),
            rbd_get_id: sym!(librbd, c"rbd_get_id", FnGetId),
            rbd_stat: sym!(librbd, c"rbd_stat", FnStat),
            rbd_aio_create_completion: sym!(
                librbd,
                c"rbd_aio_create_completion",
                FnCreateCompletion
            ),
            rbd_aio_read: sym!(librbd, c"rbd_aio_read", FnAioRead),
            rbd_aio_write: sym!(librbd, c"rbd_aio_write", FnAioWrite),
            rbd_aio_write_zeroes: dlsym(librbd, c"rbd_aio_write_zeroes").map(|p| {
                // SAFETY: the exported C function `rbd_aio_write_zeroes`, whose signature in
                // librbd.h is `FnAioWriteZeroes`.
                unsafe { std::mem::transmute::<*mut c_void, FnAioWriteZeroes>(p) }
            }),
            rbd_aio_flush: sym!(librbd, c"rbd_aio_flush", FnAioFlush),
            rbd_aio_wait_for_complete: sym!(librbd, c"rbd_aio_wait_for_complete", FnComp),
            rbd_aio_get_return_value: sym!(librbd, c"rbd_aio_get_return_value", FnCompRet),
            rbd_aio_release: sym!(librbd, c"rbd_aio_release", FnCompVoid),
            rbd_lock_acquire: sym!(librbd, c"rbd_lock_acquire", FnLockAcquire),
            rbd_lock_release: sym!(librbd, c"rbd_lock_release", FnImage),
            rbd_metadata_get: sym!(librbd, c"rbd_metadata_get", FnMetaGet),
            rbd_metadata_set: sym!(librbd, c"rbd_metadata_set", FnMetaSet),
            rbd_metadata_remove: sym!(librbd, c"rbd_metadata_remove", FnMetaRemove),
            rbd_config_image_list: dlsym(librbd, c"rbd_config_image_list")
                .zip(dlsym(librbd, c"rbd_config_image_list_cleanup"))
                .map(|(l, c)| {
                    // SAFETY: the exported C functions `rbd_config_image_list` and
                    // `rbd_config_image_list_cleanup`, whose signatures in librbd.h are these.
                    unsafe {
                        (
                            std::mem::transmute::<*mut c_void, FnConfigList>(l),
                            std::mem::transmute::<*mut c_void, FnConfigListCleanup>(c),
                        )
                    }
                }),
        })
    }
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

fn lib() -> Result<&'static Lib, IoErr> {
    LIB.get_or_init(Lib::load)
        .as_ref()
        .map_err(|msg| IoErr::Io {
            kind: ErrorKind::NotFound,
            msg: msg.clone(),
        })
}

/// Whether librados and librbd can be loaded on this machine (the error says why not).
pub fn rbd_available() -> Result<(), String> {
    lib().map(drop).map_err(|e| match e {
        IoErr::Io { msg, .. } => msg,
        e => e.to_string(),
    })
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

/// A librados cluster handle (shut down on drop).
struct Cluster {
    lib: &'static Lib,
    h: RadosT,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: `h` came from rados_create and is shut down exactly once, here, after every
        // I/O context and image made from it was closed (they are dropped first).
        unsafe { (self.lib.rados_shutdown)(self.h) }
    }
}

/// A pool's I/O context (destroyed on drop).
struct Ioctx {
    lib: &'static Lib,
    h: IoctxT,
}

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: `h` came from rados_ioctx_create and is destroyed exactly once, here, after
        // the image opened in it was closed.
        unsafe { (self.lib.rados_ioctx_destroy)(self.h) }
    }
}

/// An open image (closed on drop).
struct Image {
    lib: &'static Lib,
    h: ImageT,
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: `h` came from rbd_open/rbd_open_read_only and is closed exactly once, here;
        // no IO is in flight (every completion is waited for before its request returns).
        unsafe { (self.lib.rbd_close)(self.h) };
    }
}

/// The value of option `key` in the image's effective configuration (the config file, then
/// pool and image overrides), or None when librbd cannot say.
fn image_config(lib: &'static Lib, img: &Image, key: &str) -> Option<String> {
    let (list, cleanup) = lib.rbd_config_image_list?;
    let mut n: c_int = 0;
    // SAFETY: with 0 options librbd only writes how many it needs into `n` (-ERANGE).
    unsafe { list(img.h, std::ptr::null_mut(), &mut n) };
    if n <= 0 {
        return None;
    }
    let mut opts: Vec<ConfigOption> = (0..n)
        .map(|_| ConfigOption {
            name: std::ptr::null_mut(),
            value: std::ptr::null_mut(),
            source: 0,
        })
        .collect();
    let mut max = n;
    // SAFETY: `opts` has room for `max` options; librbd fills at most that many.
    let r = unsafe { list(img.h, opts.as_mut_ptr(), &mut max) };
    if r < 0 {
        return None;
    }
    let found = opts.iter().take(max.max(0) as usize).find_map(|o| {
        if o.name.is_null() || o.value.is_null() {
            return None;
        }
        // SAFETY: librbd filled `name` and `value` with NUL-terminated strings.
        let name = unsafe { CStr::from_ptr(o.name) };
        if name.to_bytes() != key.as_bytes() {
            return None;
        }
        // SAFETY: as above.
        let value = unsafe { CStr::from_ptr(o.value) };
        Some(value.to_string_lossy().into_owned())
    });
    // SAFETY: the options librbd filled, released once.
    unsafe { cleanup(opts.as_mut_ptr(), max) };
    found
}

/// Connects to the cluster of `target` and opens its pool.
fn connect(lib: &'static Lib, target: &RbdTarget) -> Result<(Cluster, Ioctx), IoErr> {
    let id = cstring(target.opts.client_id(), "client id")?;
    let mut h: RadosT = std::ptr::null_mut();
    // SAFETY: `h` is a valid out-pointer and `id` a NUL-terminated string that outlives the call.
    let r = unsafe { (lib.rados_create)(&mut h, id.as_ptr()) };
    if r < 0 {
        return Err(rbd_err(r as isize, target, Stage::Connect));
    }
    let cluster = Cluster { lib, h };
    let conf = match &target.opts.conf {
        Some(p) => Some(cstring(&p.to_string_lossy(), "config path")?),
        None => None,
    };
    let conf_ptr = conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: `h` is a live handle; `conf_ptr` is NULL (search the default places) or a
    // NUL-terminated path that outlives the call.
    let r = unsafe { (lib.rados_conf_read_file)(h, conf_ptr) };
    if r < 0 {
        return Err(rbd_err(r as isize, target, Stage::Conf));
    }
    let set = |k: &CStr, v: &CStr| {
        // SAFETY: `h` is a live, not yet connected handle; both strings are NUL-terminated.
        unsafe { (lib.rados_conf_set)(h, k.as_ptr(), v.as_ptr()) }
    };
    // librados's own log lines would interleave with ours on stderr: the error we return says
    // what failed (a `log_file` in the config still gets everything).
    set(c"log_to_stderr", c"false");
    set(c"err_to_stderr", c"false");
    // A cluster that is down would otherwise hold `rados_connect` for 5 minutes (the default
    // client_mount_timeout); a value set in the config is kept.
    let mut buf = [0 as c_char; 64];
    // SAFETY: `h` is live, the key is NUL-terminated and `buf` is writable for its length.
    let r = unsafe {
        (lib.rados_conf_get)(
            h,
            c"client_mount_timeout".as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if r == 0 {
        // SAFETY: rados_conf_get wrote a NUL-terminated string into `buf` (it fails rather than
        // truncate).
        let v = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        if v.trim().parse::<f64>().is_ok_and(|t| t == 300.0) {
            set(c"client_mount_timeout", c"30");
        }
    }
    // SAFETY: `h` is a live handle, configured above.
    let r = unsafe { (lib.rados_connect)(h) };
    if r < 0 {
        return Err(rbd_err(r as isize, target, Stage::Connect));
    }
    let pool = cstring(&target.pool, "pool name")?;
    let mut io: IoctxT = std::ptr::null_mut();
    // SAFETY: `h` is connected, `pool` is NUL-terminated and `io` a valid out-pointer.
    let r = unsafe { (lib.rados_ioctx_create)(h, pool.as_ptr(), &mut io) };
    if r < 0 {
        return Err(rbd_err(r as isize, target, Stage::Pool));
    }
    Ok((cluster, Ioctx { lib, h: io }))
}

/// Opens the image of `target` in `io` (read-only: without taking the lock or a watch for
/// writing).
fn open_image(
    lib: &'static Lib,
    io: &Ioctx,
    target: &RbdTarget,
    read_only: bool,
) -> Result<Image, IoErr> {
    let name = cstring(&target.image, "image name")?;
    let mut img: ImageT = std::ptr::null_mut();
    let f = if read_only {
        lib.rbd_open_read_only
    } else {
        lib.rbd_open
    };
    // SAFETY: `io.h` is a live I/O context, `name` is NUL-terminated, `img` a valid out-pointer
    // and a NULL snapshot name opens the head.
    let r = unsafe { f(io.h, name.as_ptr(), &mut img, std::ptr::null()) };
    if r < 0 {
        return Err(rbd_err(r as isize, target, Stage::Open));
    }
    Ok(Image { lib, h: img })
}

/// The image's id.
/// The fsid of a connected cluster (`None` if librados does not give it).
fn cluster_fsid(c: &Cluster) -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: `c.h` is a connected cluster handle and `buf` is writable for its length.
    let r = unsafe { (c.lib.rados_cluster_fsid)(c.h, buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(r).ok()?.min(buf.len());
    let s = String::from_utf8_lossy(&buf[..n]);
    let s = s.trim_end_matches('\0').trim();
    (!s.is_empty()).then(|| s.to_string())
}

fn image_id(lib: &'static Lib, img: &Image) -> Result<String, isize> {
    let mut buf = vec![0u8; 64];
    loop {
        // SAFETY: `img.h` is an open image and `buf` is writable for its length.
        let r = unsafe { (lib.rbd_get_id)(img.h, buf.as_mut_ptr().cast(), buf.len()) };
        if r == -libc::ERANGE && buf.len() < 1 << 16 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if r < 0 {
            return Err(r as isize);
        }
        let s = CStr::from_bytes_until_nul(&buf).map_err(|_| -(libc::EINVAL as isize))?;
        return Ok(s.to_string_lossy().into_owned());
    }
}

/// The pool id and image id of `target`, read through a read-only open (no lock taken), for
/// the core table's identity before the core is opened.
pub fn rbd_identity(target: &RbdTarget) -> Result<RbdIdentity, IoErr> {
    let lib = lib()?;
    let (cluster, io) = connect(lib, target)?;
    let img = open_image(lib, &io, target, true)?;
    // SAFETY: `io.h` is a live I/O context.
    let pool_id = unsafe { (lib.rados_ioctx_get_id)(io.h) };
    let image_id =
        image_id(lib, &img).map_err(|r| rbd_err(r, target, Stage::Op("reading the image id")))?;
    Ok(RbdIdentity {
        pool_id: pool_id as u64,
        image_id,
        cluster_fsid: cluster_fsid(&cluster),
    })
}

/// One asynchronous librbd request in flight. It borrows the caller's buffer for `'b`, and is
/// always waited for before it goes away (on drop too), so librbd never touches a buffer that
/// was given back.
struct Pending<'b> {
    lib: &'static Lib,
    c: CompT,
    /// Bytes a successful read returns.
    expect: Option<usize>,
    /// What it is, for the error message.
    what: &'static str,
    off: u64,
    len: u64,
    done: bool,
    _buf: PhantomData<&'b mut [u8]>,
}

impl Pending<'_> {
    /// Waits for the request and releases its completion; returns librbd's return value.
    fn wait(&mut self) -> isize {
        if self.done {
            return 0;
        }
        // SAFETY: `c` is a completion that was handed to a successfully issued aio request and
        // not yet released; waiting, reading its value and releasing it once is its protocol.
        let r = unsafe {
            (self.lib.rbd_aio_wait_for_complete)(self.c);
            let r = (self.lib.rbd_aio_get_return_value)(self.c);
            (self.lib.rbd_aio_release)(self.c);
            r
        };
        self.done = true;
        r
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.wait();
    }
}

/// One request of a batch: started parts, or a result known without waiting.
struct Job<'b> {
    early: Option<Result<(), IoErr>>,
    parts: Vec<Pending<'b>>,
    fua: bool,
}

impl Job<'_> {
    fn done(r: Result<(), IoErr>) -> Self {
        Job {
            early: Some(r),
            parts: Vec::new(),
            fua: false,
        }
    }
}

/// Zeros for the fallback without `rbd_aio_write_zeroes` (never freed, shared by every write).
fn zeros() -> &'static [u8] {
    static Z: OnceLock<Vec<u8>> = OnceLock::new();
    Z.get_or_init(|| vec![0u8; ZERO_CHUNK])
}

/// How a call run by [`RbdBackend::on_helper`] went.
enum Helper<T> {
    /// It returned within the wait.
    Done(T),
    /// An earlier call of its kind has not returned: not started.
    Busy,
    /// No thread could be started for it.
    NoThread(std::io::Error),
    /// It did not return within the wait (it goes on on its thread).
    TimedOut,
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

impl RbdBackend {
    /// Opens `rbd:POOL/IMAGE[:conf=FILE][:id=ID]` and takes its exclusive lock.
    pub fn open(device: &str) -> Result<Self, IoErr> {
        let t = parse_rbd(device).map_err(|msg| IoErr::Io {
            kind: ErrorKind::InvalidInput,
            msg,
        })?;
        Self::open_target(&t)
    }

    /// Opens `target` and takes its exclusive lock.
    pub fn open_target(target: &RbdTarget) -> Result<Self, IoErr> {
        let lib = lib()?;
        let (cluster, io) = connect(lib, target)?;
        let image = open_image(lib, &io, target, false)?;
        // SAFETY: `image.h` is an open image.
        let r = unsafe { (lib.rbd_lock_acquire)(image.h, RBD_LOCK_MODE_EXCLUSIVE) };
        if r < 0 {
            return Err(rbd_err(r as isize, target, Stage::Lock));
        }
        let cluster_fsid = cluster_fsid(&cluster);
        // From here on the lock is released by RbdBackend's Drop.
        let mut b = RbdBackend {
            lib,
            target: target.clone(),
            image,
            io,
            _cluster: cluster,
            identity: RbdIdentity {
                pool_id: 0,
                image_id: String::new(),
                cluster_fsid,
            },
            obj_size: 0,
            size_blocks: AtomicU64::new(0),
            size_query: AtomicBool::new(false),
            marker_op: AtomicBool::new(false),
            completer: OnceLock::new(),
            completed_durable: false,
        };
        // SAFETY: `b.io.h` is a live I/O context.
        b.identity.pool_id = unsafe { (lib.rados_ioctx_get_id)(b.io.h) } as u64;
        b.identity.image_id = image_id(lib, &b.image)
            .map_err(|r| rbd_err(r, target, Stage::Op("reading the image id")))?;
        // SAFETY: ImageInfo is plain data (integers and byte arrays): all zeros is a valid value.
        let mut info: ImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: `b.image.h` is open and `info` is writable for the size passed.
        let r = unsafe { (lib.rbd_stat)(b.image.h, &mut info, std::mem::size_of::<ImageInfo>()) };
        if r < 0 {
            return Err(rbd_err(r as isize, target, Stage::Op("rbd_stat")));
        }
        b.obj_size = info.obj_size;
        b.completed_durable = image_config(lib, &b.image, "rbd_cache").as_deref() == Some("false")
            && image_config(lib, &b.image, "rbd_plugins").is_some_and(|p| p.trim().is_empty());
        b.size_blocks
            .store(info.size / BLOCK as u64, Ordering::Relaxed);
        Ok(b)
    }

    /// The parsed device string.
    pub fn target(&self) -> &RbdTarget {
        &self.target
    }

    /// Pool id and image id (the core table's `CoreIdentity::Rbd`).
    pub fn identity(&self) -> RbdIdentity {
        self.identity.clone()
    }

    /// The image's object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.obj_size
    }

    /// Asks librbd for the current size, remembers it and returns it in blocks.
    pub fn refresh_size(&self) -> Result<u64, IoErr> {
        let mut size = 0u64;
        // SAFETY: the image is open and `size` is a valid out-pointer.
        let r = unsafe { (self.lib.rbd_get_size)(self.image.h, &mut size) };
        if r < 0 {
            return Err(self.err(r as isize, Stage::Op("reading the image size")));
        }
        let blocks = size / BLOCK as u64;
        self.size_blocks.store(blocks, Ordering::Relaxed);
        Ok(blocks)
    }

    /// [`RbdBackend::refresh_size`] on a thread of its own, waited for at most `limit`; `None`
    /// when it fails, takes longer, or an earlier such query has not returned yet (then none
    /// is started). With the cluster unresponsive, librbd's size call can wait for a header
    /// refresh for as long as the cluster is down; a caller that must not hang with it (a new
    /// NBD connection, with the daemon's registry locked) uses the size last seen instead. A
    /// query that outlives the wait finishes on its thread and updates the size then.
    pub fn refresh_size_within(self: &Arc<Self>, limit: Duration) -> Option<u64> {
        match self.on_helper(
            |me| &me.size_query,
            "tc-rbd-size",
            limit,
            |me| me.refresh_size(),
        ) {
            Helper::Done(r) => r.ok(),
            Helper::Busy | Helper::NoThread(_) | Helper::TimedOut => None,
        }
    }

    /// Runs `f` on a thread of its own (named `name`) and waits at most `limit` for it: the
    /// pattern of the librbd calls that can wait for as long as the cluster is down. `busy`
    /// names this kind of call's flag: while one such call has not returned, the next one is
    /// not started ([`Helper::Busy`]); a call that outlives the wait finishes on its thread.
    fn on_helper<T: Send + 'static>(
        self: &Arc<Self>,
        busy: fn(&RbdBackend) -> &AtomicBool,
        name: &str,
        limit: Duration,
        f: impl FnOnce(&RbdBackend) -> T + Send + 'static,
    ) -> Helper<T> {
        if busy(self).swap(true, Ordering::AcqRel) {
            return Helper::Busy;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let r = f(&me);
                busy(&me).store(false, Ordering::Release);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            busy(self).store(false, Ordering::Release);
            return Helper::NoThread(e);
        }
        match rx.recv_timeout(limit) {
            Ok(r) => Helper::Done(r),
            Err(_) => Helper::TimedOut,
        }
    }

    /// Writes (`Some(uuid)`: `tiercache.dirty` = `dirty in tiercache <uuid>`) or removes
    /// (`None`; removing an absent key is fine) the dirty marker in the image's metadata.
    pub fn set_dirty_marker(&self, cache_uuid: Option<&str>) -> Result<(), IoErr> {
        let key = cstring(DIRTY_KEY, "key")?;
        match cache_uuid {
            Some(u) => {
                let v = cstring(&format!("dirty in tiercache {u}"), "marker")?;
                // SAFETY: the image is open; both strings are NUL-terminated.
                let r =
                    unsafe { (self.lib.rbd_metadata_set)(self.image.h, key.as_ptr(), v.as_ptr()) };
                if r < 0 {
                    return Err(self.err(r as isize, Stage::Op("setting the dirty marker")));
                }
            }
            None => {
                // SAFETY: the image is open; the key is NUL-terminated.
                let r = unsafe { (self.lib.rbd_metadata_remove)(self.image.h, key.as_ptr()) };
                if r < 0 && r != -libc::ENOENT {
                    return Err(self.err(r as isize, Stage::Op("removing the dirty marker")));
                }
            }
        }
        Ok(())
    }

    /// [`RbdBackend::set_dirty_marker`] on a thread of its own, waited for at most `limit`.
    /// With the cluster unresponsive, librbd's metadata calls wait for as long as it is down;
    /// a caller that must not hang with them (a cache stopping, the registry locked) gets a
    /// `TimedOut` error instead. An update that outlives the wait finishes on its thread; until
    /// it has returned, a new update is refused at once (also `TimedOut`), so two updates
    /// never race and an old "remove" can never land after a newer "set".
    pub fn set_dirty_marker_within(
        self: &Arc<Self>,
        cache_uuid: Option<&str>,
        limit: Duration,
    ) -> Result<(), IoErr> {
        let uuid = cache_uuid.map(str::to_string);
        match self.on_helper(
            |me| &me.marker_op,
            "tc-rbd-marker",
            limit,
            move |me| me.set_dirty_marker(uuid.as_deref()),
        ) {
            Helper::Done(r) => r,
            Helper::Busy => Err(IoErr::timed_out(
                "an earlier dirty-marker update has not returned (cluster not answering)",
            )),
            Helper::NoThread(e) => Err(IoErr::Io {
                kind: e.kind(),
                msg: format!("cannot start a thread for the dirty-marker update: {e}"),
            }),
            Helper::TimedOut => Err(IoErr::timed_out(format!(
                "updating the dirty marker (limit {} s)",
                limit.as_secs_f64()
            ))),
        }
    }

    /// The value of the dirty marker, if set.
    pub fn dirty_marker(&self) -> Result<Option<String>, IoErr> {
        let key = cstring(DIRTY_KEY, "key")?;
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            // SAFETY: the image is open, the key NUL-terminated, `buf` writable for `len` bytes
            // and `len` a valid in/out pointer.
            let r = unsafe {
                (self.lib.rbd_metadata_get)(
                    self.image.h,
                    key.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    &mut len,
                )
            };
            if r == -libc::ERANGE && len > buf.len() && len < 1 << 20 {
                buf.resize(len, 0);
                continue;
            }
            if r == -libc::ENOENT {
                return Ok(None);
            }
            if r < 0 {
                return Err(self.err(r as isize, Stage::Op("reading the dirty marker")));
            }
            let s = CStr::from_bytes_until_nul(&buf)
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|_| String::from_utf8_lossy(&buf[..len.min(buf.len())]).into());
            return Ok(Some(s));
        }
    }

    fn err(&self, r: isize, stage: Stage<'_>) -> IoErr {
        rbd_err(r, &self.target, stage)
    }

    /// Checks `blocks` at `lba` against the size last seen, and against a fresh one when that
    /// fails (the image may have grown).
    fn check(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        match check_blocks(lba, blocks, self.size_blocks.load(Ordering::Relaxed)) {
            Ok(()) => Ok(()),
            Err(e) => match self.refresh_size() {
                Ok(now) => check_blocks(lba, blocks, now),
                Err(_) => Err(e),
            },
        }
    }

    fn completion(&self) -> Result<CompT, IoErr> {
        let mut c: CompT = std::ptr::null_mut();
        // SAFETY: no callback (NULL) and no argument; `c` is a valid out-pointer.
        let r = unsafe { (self.lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(self.err(r as isize, Stage::Op("creating an aio completion")));
        }
        Ok(c)
    }

    /// Issues one aio request through `issue`, which gets the completion; a request librbd
    /// refuses at once has its completion released here (it will never complete).
    fn issue<'b>(
        &self,
        what: &'static str,
        off: u64,
        len: u64,
        expect: Option<usize>,
        issue: impl FnOnce(CompT) -> c_int,
    ) -> Result<Pending<'b>, IoErr> {
        let c = self.completion()?;
        let r = issue(c);
        if r < 0 {
            // SAFETY: the request was refused, so librbd holds no reference to `c`: release it.
            unsafe { (self.lib.rbd_aio_release)(c) };
            return Err(self.err(r as isize, Stage::Op(what)));
        }
        Ok(Pending {
            lib: self.lib,
            c,
            expect,
            what,
            off,
            len,
            done: false,
            _buf: PhantomData,
        })
    }

    fn start_read<'b>(&self, lba: u64, buf: &'b mut [u8]) -> Job<'b> {
        if buf.len() % BLOCK != 0 {
            return Job::done(Err(IoErr::Misaligned { len: buf.len() }));
        }
        if let Err(e) = self.check(lba, (buf.len() / BLOCK) as u64) {
            return Job::done(Err(e));
        }
        if buf.is_empty() {
            return Job::done(Ok(()));
        }
        let (off, len, img, f) = (
            lba * BLOCK as u64,
            buf.len(),
            self.image.h,
            self.lib.rbd_aio_read,
        );
        let ptr = buf.as_mut_ptr().cast::<c_char>();
        // SAFETY: `ptr` is valid for writes of `len` bytes for 'b, and the returned Pending
        // borrows the buffer for 'b and waits for the read before it is dropped.
        let p = self.issue("read", off, len as u64, Some(len), |c| unsafe {
            f(img, off, len, ptr, c)
        });
        match p {
            Ok(p) => Job {
                early: None,
                parts: vec![p],
                fua: false,
            },
            Err(e) => Job::done(Err(e)),
        }
    }

    fn start_write<'b>(&self, lba: u64, buf: &'b [u8], fua: bool) -> Job<'b> {
        if buf.len() % BLOCK != 0 {
            return Job::done(Err(IoErr::Misaligned { len: buf.len() }));
        }
        if let Err(e) = self.check(lba, (buf.len() / BLOCK) as u64) {
            return Job::done(Err(e));
        }
        if buf.is_empty() {
            return Job {
                early: None,
                parts: Vec::new(),
                fua,
            };
        }
        let (off, len, img, f) = (
            lba * BLOCK as u64,
            buf.len(),
            self.image.h,
            self.lib.rbd_aio_write,
        );
        let ptr = buf.as_ptr().cast::<c_char>();
        // SAFETY: `ptr` is valid for reads of `len` bytes for 'b, and the returned Pending
        // borrows the buffer for 'b and waits for the write before it is dropped.
        let p = self.issue("write", off, len as u64, None, |c| unsafe {
            f(img, off, len, ptr, c)
        });
        match p {
            Ok(p) => Job {
                early: None,
                parts: vec![p],
                fua,
            },
            Err(e) => Job::done(Err(e)),
        }
    }

    fn start_zeroes<'b>(&self, lba: u64, blocks: u64, fua: bool, what: &'static str) -> Job<'b> {
        if let Err(e) = self.check(lba, blocks) {
            return Job::done(Err(e));
        }
        let mut job = Job {
            early: None,
            parts: Vec::new(),
            fua,
        };
        if blocks == 0 {
            return job;
        }
        let (off, len, img) = (lba * BLOCK as u64, blocks * BLOCK as u64, self.image.h);
        if let Some(f) = self.lib.rbd_aio_write_zeroes {
            let Ok(n) = usize::try_from(len) else {
                return Job::done(Err(IoErr::OutOfRange {
                    lba,
                    blocks,
                    dev_blocks: self.size_blocks.load(Ordering::Relaxed),
                }));
            };
            // SAFETY: no buffer is involved; the image is open. Flags 0: zeroes may be thin.
            match self.issue(what, off, len, None, |c| unsafe { f(img, off, n, c, 0, 0) }) {
                Ok(p) => job.parts.push(p),
                Err(e) => return Job::done(Err(e)),
            }
            return job;
        }
        let z = zeros();
        let f = self.lib.rbd_aio_write;
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(z.len() as u64) as usize;
            let o = off + done;
            // SAFETY: `z` is a static buffer of zeros, valid for reads of `n` bytes forever.
            match self.issue(what, o, n as u64, None, |c| unsafe {
                f(img, o, n, z.as_ptr().cast(), c)
            }) {
                Ok(p) => job.parts.push(p),
                Err(e) => {
                    // What was issued is waited for when `job` drops.
                    drop(job);
                    return Job::done(Err(e));
                }
            }
            done += n as u64;
        }
        job
    }

    fn start<'b>(&self, r: &'b mut Req<'_>) -> Job<'b> {
        match r {
            Req::Read { lba, buf } => self.start_read(*lba, buf),
            Req::Write { lba, buf, fua } => self.start_write(*lba, buf, *fua),
            Req::WriteZeroes { lba, blocks, fua } => {
                self.start_zeroes(*lba, *blocks, *fua, "write zeroes")
            }
            Req::Trim { lba, blocks } => self.start_zeroes(*lba, *blocks, false, "trim"),
            Req::Flush => Job::done(self.flush()),
        }
    }

    /// Waits for every part of every job, then flushes once for the FUA writes that succeeded.
    fn finish(&self, jobs: Vec<(usize, Job<'_>)>, out: &mut [Option<Result<(), IoErr>>]) {
        let mut fua_ok = Vec::new();
        for (i, mut job) in jobs {
            let mut res = job.early.take().unwrap_or(Ok(()));
            for p in &mut job.parts {
                let r = p.wait();
                if res.is_err() {
                    continue;
                }
                if r < 0 {
                    let what = format!("{} of {} bytes at byte {}", p.what, p.len, p.off);
                    res = Err(self.err(r, Stage::Op(&what)));
                } else if let Some(n) = p.expect
                    && r as usize != n
                {
                    res = Err(IoErr::Io {
                        kind: ErrorKind::UnexpectedEof,
                        msg: format!(
                            "rbd:{}: read of {} bytes at byte {} returned {r} bytes",
                            self.target.spec(),
                            p.len,
                            p.off
                        ),
                    });
                }
            }
            if res.is_ok() && job.fua {
                fua_ok.push(i);
            }
            out[i] = Some(res);
        }
        if !fua_ok.is_empty()
            && let Err(e) = self.flush()
        {
            for i in fua_ok {
                out[i] = Some(Err(IoErr::Io {
                    kind: ErrorKind::Other,
                    msg: format!("flush after a FUA write: {e}"),
                }));
            }
        }
    }
}

/// What an asynchronous request waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AsyncStage {
    /// Its IO.
    Io,
    /// The flush after a FUA write.
    FuaFlush,
}

/// One request of the asynchronous path ([`Backend::submit_async`]). Boxed and handed to
/// librbd as its completion's argument; librbd's callback gives it back to the completer
/// thread, which finishes it. It owns the buffer librbd reads from or writes into, so the
/// buffer lives until librbd is done with it.
struct AsyncOp {
    lib: &'static Lib,
    q: Arc<AsyncQueue>,
    req: AsyncReq,
    done: AsyncDone,
    stage: AsyncStage,
    /// librbd's return value, set by the callback.
    ret: isize,
    /// A result known without (more) IO: a request refused at once, or an empty one.
    early: Option<Result<(), IoErr>>,
}

#[derive(Default)]
struct AsyncState {
    /// Requests librbd has completed (or refused), to be finished by the completer. Boxed:
    /// the box is what went through librbd as the completion's argument.
    ready: std::collections::VecDeque<Box<AsyncOp>>,
    /// Requests submitted whose `done` has not been called yet.
    inflight: u64,
    quit: bool,
}

/// The asynchronous path's queue, between librbd's callbacks and the completer thread.
#[derive(Default)]
struct AsyncQueue {
    st: Mutex<AsyncState>,
    /// The completer waits here for ready requests (or `quit`).
    cv: Condvar,
    /// The backend's Drop waits here for `inflight` to reach 0.
    idle: Condvar,
}

impl AsyncQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, AsyncState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, op: Box<AsyncOp>) {
        let mut st = self.lock();
        let wake = st.ready.is_empty();
        st.ready.push_back(op);
        drop(st);
        if wake {
            self.cv.notify_one();
        }
    }
}

/// What the completer needs of the backend: a FUA write's flush is issued from there, and
/// errors name the image. Valid while requests are in flight (the backend's Drop waits for
/// every one before it closes the image).
struct AsyncCtx {
    lib: &'static Lib,
    img: ImageT,
    target: RbdTarget,
    /// [`RbdBackend::completed_durable`]: a FUA write needs no flush.
    completed_durable: bool,
}

// SAFETY: `img` is an open librbd image handle, usable from any thread (librbd's API is
// thread-safe); it is only used while the backend, which closes it, waits for the requests.
unsafe impl Send for AsyncCtx {}
// SAFETY: as for Send.
unsafe impl Sync for AsyncCtx {}

/// The thread that finishes asynchronous requests — a FUA write's flush, the result, the
/// caller's `done` — so that no caller code runs on librbd's own threads.
struct Completer {
    q: Arc<AsyncQueue>,
    ctx: Arc<AsyncCtx>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    id: std::thread::ThreadId,
}

/// librbd's completion callback of the asynchronous path: records the return value, releases
/// the completion and queues the request for the completer. Runs on a librbd thread; does
/// nothing else there.
extern "C" fn aio_done(c: CompT, arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<AsyncOp>` that `issue_async` leaked for this completion; librbd
    // calls this exactly once per completion, so the box is taken back exactly once.
    let mut op = unsafe { Box::from_raw(arg.cast::<AsyncOp>()) };
    // SAFETY: `c` is the completion this callback is for; reading its value and releasing it
    // once is its protocol (librbd holds its own reference while the callback runs).
    op.ret = unsafe {
        let r = (op.lib.rbd_aio_get_return_value)(c);
        (op.lib.rbd_aio_release)(c);
        r
    };
    let q = op.q.clone();
    q.push(op);
}

/// Issues one asynchronous librbd request through `issue` with a completion whose callback
/// queues `op` for the completer; a request librbd refuses at once is queued with its error.
/// `op` must not be touched after a successful issue: it may be finished already.
fn issue_async(
    lib: &'static Lib,
    target: &RbdTarget,
    op: Box<AsyncOp>,
    what: &str,
    issue: impl FnOnce(CompT) -> c_int,
) {
    let q = op.q.clone();
    let arg = Box::into_raw(op);
    let mut c: CompT = std::ptr::null_mut();
    // SAFETY: `arg` stays valid until the callback takes it back; `c` is a valid out-pointer.
    let r = unsafe { (lib.rbd_aio_create_completion)(arg.cast(), Some(aio_done), &mut c) };
    let r = if r < 0 {
        r
    } else {
        let r = issue(c);
        if r < 0 {
            // SAFETY: the request was refused, so librbd holds no reference to `c` and will
            // never call the callback: release it.
            unsafe { (lib.rbd_aio_release)(c) };
        }
        r
    };
    if r < 0 {
        // SAFETY: no callback will run for `arg` (no completion, or a refused request): the box
        // is still ours.
        let mut op = unsafe { Box::from_raw(arg) };
        op.early = Some(Err(rbd_err(r as isize, target, Stage::Op(what))));
        q.push(op);
    }
}

impl AsyncCtx {
    /// Finishes a request librbd completed: issues a FUA write's flush, or works out the result
    /// and calls `done`.
    fn finish(&self, mut op: Box<AsyncOp>) {
        let res = match op.early.take() {
            Some(r) => r,
            None => self.result(&op),
        };
        if res.is_ok()
            && !self.completed_durable
            && op.stage == AsyncStage::Io
            && matches!(
                op.req,
                AsyncReq::Write { fua: true, .. } | AsyncReq::WriteZeroes { fua: true, .. }
            )
        {
            op.stage = AsyncStage::FuaFlush;
            let (img, f) = (self.img, self.lib.rbd_aio_flush);
            // SAFETY: the image is open (the backend waits for this request before closing it);
            // a flush takes no buffer.
            issue_async(self.lib, &self.target, op, "flush", |c| unsafe {
                f(img, c)
            });
            return;
        }
        let res = match (res, op.stage) {
            (Err(e), AsyncStage::FuaFlush) => Err(IoErr::Io {
                kind: ErrorKind::Other,
                msg: format!("flush after a FUA write: {e}"),
            }),
            (r, _) => r,
        };
        let AsyncOp { req, done, q, .. } = *op;
        let buf = match req {
            AsyncReq::Read { buf, .. } | AsyncReq::Write { buf, .. } => Some(buf),
            _ => None,
        };
        {
            let mut st = q.lock();
            st.inflight -= 1;
            if st.inflight == 0 {
                q.idle.notify_all();
            }
        }
        done(buf, res);
    }

    /// The result of a completed request from librbd's return value.
    fn result(&self, op: &AsyncOp) -> Result<(), IoErr> {
        let r = op.ret;
        if op.stage == AsyncStage::FuaFlush || matches!(op.req, AsyncReq::Flush) {
            return if r < 0 {
                Err(rbd_err(r, &self.target, Stage::Op("flush")))
            } else {
                Ok(())
            };
        }
        let (what, lba, len) = match &op.req {
            AsyncReq::Read { lba, buf } => ("read", *lba, buf.len() as u64),
            AsyncReq::Write { lba, buf, .. } => ("write", *lba, buf.len() as u64),
            AsyncReq::WriteZeroes { lba, blocks, .. } => ("write zeroes", *lba, blocks * 512),
            AsyncReq::Trim { lba, blocks } => ("trim", *lba, blocks * 512),
            AsyncReq::Flush => unreachable!("handled above"),
        };
        let off = lba * BLOCK as u64;
        if r < 0 {
            let what = format!("{what} of {len} bytes at byte {off}");
            return Err(rbd_err(r, &self.target, Stage::Op(&what)));
        }
        if matches!(op.req, AsyncReq::Read { .. }) && r as u64 != len {
            return Err(IoErr::Io {
                kind: ErrorKind::UnexpectedEof,
                msg: format!(
                    "rbd:{}: read of {len} bytes at byte {off} returned {r} bytes",
                    self.target.spec()
                ),
            });
        }
        Ok(())
    }

    /// The completer's loop: finishes ready requests until `quit` (or, with `until_idle`,
    /// until none is in flight).
    ///
    /// Requests are taken from the queue one at a time, so that a `done` that drops the
    /// backend (its Drop then runs this loop again, on this thread) finds every request not yet
    /// finished still in the queue.
    fn run(&self, q: &AsyncQueue, until_idle: bool) {
        loop {
            let op = {
                let mut st = q.lock();
                loop {
                    if let Some(op) = st.ready.pop_front() {
                        break op;
                    }
                    if st.quit || (until_idle && st.inflight == 0) {
                        return;
                    }
                    st = q.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            };
            self.finish(op);
        }
    }
}

impl RbdBackend {
    fn completer(&self) -> &Completer {
        self.completer.get_or_init(|| {
            let q = Arc::new(AsyncQueue::default());
            let ctx = Arc::new(AsyncCtx {
                lib: self.lib,
                img: self.image.h,
                target: self.target.clone(),
                completed_durable: self.completed_durable,
            });
            let (q2, ctx2) = (q.clone(), ctx.clone());
            let t = std::thread::Builder::new()
                .name("tc-rbd-done".into())
                .spawn(move || ctx2.run(&q2, false))
                .expect("spawn the librbd completion thread");
            Completer {
                q,
                ctx,
                id: t.thread().id(),
                thread: Mutex::new(Some(t)),
            }
        })
    }

    /// Issues `op` (stage `Io`): checks it, then one `rbd_aio_*` call.
    fn start_async(&self, mut op: Box<AsyncOp>) {
        let (img, lib) = (self.image.h, self.lib);
        let blocks = match &op.req {
            AsyncReq::Read { buf, .. } | AsyncReq::Write { buf, .. } => {
                if buf.len() % BLOCK != 0 {
                    op.early = Some(Err(IoErr::Misaligned { len: buf.len() }));
                    op.q.clone().push(op);
                    return;
                }
                (buf.len() / BLOCK) as u64
            }
            AsyncReq::WriteZeroes { blocks, .. } | AsyncReq::Trim { blocks, .. } => *blocks,
            AsyncReq::Flush => 0,
        };
        let lba = match &op.req {
            AsyncReq::Read { lba, .. }
            | AsyncReq::Write { lba, .. }
            | AsyncReq::WriteZeroes { lba, .. }
            | AsyncReq::Trim { lba, .. } => *lba,
            AsyncReq::Flush => 0,
        };
        let checked = self.check(lba, blocks).and_then(|()| {
            usize::try_from(blocks * BLOCK as u64).map_err(|_| IoErr::OutOfRange {
                lba,
                blocks,
                dev_blocks: self.size_blocks.load(Ordering::Relaxed),
            })
        });
        let len = match checked {
            Ok(len) => len,
            Err(e) => {
                op.early = Some(Err(e));
                op.q.clone().push(op);
                return;
            }
        };
        if matches!(op.req, AsyncReq::Flush) && self.completed_durable {
            // Every completed write is on the OSDs already (see `completed_durable`).
            op.early = Some(Ok(()));
            op.q.clone().push(op);
            return;
        }
        if len == 0 && !matches!(op.req, AsyncReq::Flush) {
            // Nothing to do (a FUA write of nothing still flushes, as the sync path does).
            op.early = Some(Ok(()));
            op.q.clone().push(op);
            return;
        }
        let off = lba * BLOCK as u64;
        let t = &self.target;
        match &mut op.req {
            AsyncReq::Read { buf, .. } => {
                let (ptr, f) = (buf.as_mut_ptr().cast::<c_char>(), lib.rbd_aio_read);
                // SAFETY: `ptr` points into the op's own heap buffer, valid for writes of `len`
                // bytes until the callback hands the op back (the op owns the buffer).
                issue_async(lib, t, op, "read", |c| unsafe { f(img, off, len, ptr, c) });
            }
            AsyncReq::Write { buf, .. } => {
                let (ptr, f) = (buf.as_ptr().cast::<c_char>(), lib.rbd_aio_write);
                // SAFETY: as for reads: the op owns the buffer until the callback.
                issue_async(lib, t, op, "write", |c| unsafe { f(img, off, len, ptr, c) });
            }
            AsyncReq::WriteZeroes { .. } | AsyncReq::Trim { .. } => {
                let what = if matches!(op.req, AsyncReq::Trim { .. }) {
                    "trim"
                } else {
                    "write zeroes"
                };
                let f = lib
                    .rbd_aio_write_zeroes
                    .expect("is_async holds only with rbd_aio_write_zeroes");
                // SAFETY: no buffer is involved; the image is open. Flags 0: zeroes may be thin.
                issue_async(lib, t, op, what, |c| unsafe { f(img, off, len, c, 0, 0) });
            }
            AsyncReq::Flush => {
                let f = lib.rbd_aio_flush;
                // SAFETY: the image is open; a flush takes no buffer.
                issue_async(lib, t, op, "flush", |c| unsafe { f(img, c) });
            }
        }
    }
}

impl Backend for RbdBackend {
    fn name(&self) -> String {
        let conf = match &self.target.opts.conf {
            Some(c) => format!(", conf {}", c.display()),
            None => String::new(),
        };
        let zeroes = if self.lib.rbd_aio_write_zeroes.is_some() {
            "rbd_aio_write_zeroes"
        } else {
            "zeros written"
        };
        let flush = if self.completed_durable {
            "flush: none needed, rbd_cache off"
        } else {
            "flush: rbd_aio_flush"
        };
        format!(
            "rbd:{} (client.{}{conf}; librbd aio; {} KiB objects; trim/zeroes: {zeroes}; {flush}; exclusive lock held)",
            self.target.spec(),
            self.target.opts.client_id(),
            self.obj_size >> 10
        )
    }

    /// The size last seen: at open, by [`RbdBackend::refresh_size`], or by a request past
    /// that end (which looks again before it fails). Never a call into librbd: with the
    /// cluster unresponsive, `rbd_get_size` can wait for a header refresh that does not come,
    /// and this is asked on every request's path (range checks, IO timeouts, NBD sizes).
    fn blocks(&self) -> u64 {
        self.size_blocks.load(Ordering::Relaxed)
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let mut r = [Req::Read { lba, buf }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let mut r = [Req::Write { lba, buf, fua }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        let mut r = [Req::WriteZeroes { lba, blocks, fua }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        let mut r = [Req::Trim { lba, blocks }];
        self.submit_batch(&mut r).pop().unwrap_or(Ok(()))
    }

    fn flush(&self) -> Result<(), IoErr> {
        if self.completed_durable {
            return Ok(());
        }
        let (img, f) = (self.image.h, self.lib.rbd_aio_flush);
        // SAFETY: the image is open; a flush takes no buffer.
        let mut p = self.issue("flush", 0, 0, None, |c| unsafe { f(img, c) })?;
        let r = p.wait();
        if r < 0 {
            return Err(self.err(r, Stage::Op("flush")));
        }
        Ok(())
    }

    /// Asynchronous when librbd has `rbd_aio_write_zeroes` (every request is then one aio
    /// call).
    fn is_async(&self) -> bool {
        self.lib.rbd_aio_write_zeroes.is_some()
    }

    /// One `rbd_aio_*` call whose completion callback hands the request to this image's
    /// completion thread (started by the first call), which issues a FUA write's flush and
    /// calls `done`: nothing of the caller runs on librbd's threads, and no thread waits per
    /// request.
    fn submit_async(&self, req: AsyncReq, done: AsyncDone) {
        if !self.is_async() {
            return crate::submit_sync(self, req, done);
        }
        let c = self.completer();
        c.q.lock().inflight += 1;
        let op = Box::new(AsyncOp {
            lib: self.lib,
            q: c.q.clone(),
            req,
            done,
            stage: AsyncStage::Io,
            ret: 0,
            early: None,
        });
        self.start_async(op);
    }

    /// Issues every request before waiting for any; a flush first waits for the requests
    /// before it (and so covers them), as the trait asks.
    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        let mut out: Vec<Option<Result<(), IoErr>>> = (0..reqs.len()).map(|_| None).collect();
        let mut inflight: Vec<(usize, Job<'_>)> = Vec::new();
        for (i, r) in reqs.iter_mut().enumerate() {
            if matches!(r, Req::Flush) {
                self.finish(std::mem::take(&mut inflight), &mut out);
                out[i] = Some(self.flush());
                continue;
            }
            inflight.push((i, self.start(r)));
        }
        self.finish(inflight, &mut out);
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        // Asynchronous requests still in flight are waited for (finished here when this runs
        // on the completion thread itself, from a `done` that dropped the last reference),
        // then the completion thread ends.
        if let Some(c) = self.completer.get() {
            let me = std::thread::current().id() == c.id;
            if me {
                c.ctx.run(&c.q, true);
            } else {
                let mut st = c.q.lock();
                while st.inflight > 0 {
                    st = c.q.idle.wait(st).unwrap_or_else(|e| e.into_inner());
                }
            }
            c.q.lock().quit = true;
            c.q.cv.notify_all();
            let t = c.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(t) = t
                && !me
            {
                let _ = t.join();
            }
        }
        // SAFETY: the image is open and no request is in flight (each is waited for before the
        // call that issued it returns); the fields then close the image, the pool context and
        // the cluster handle, in that order.
        unsafe { (self.lib.rbd_lock_release)(self.image.h) };
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
