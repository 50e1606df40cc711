//! librados and librbd loaded at run time: the C types and function signatures used (Ceph 16.2's
//! headers), `dlopen`, the symbol table `Lib` (declared in `mod.rs`) filled in.

use super::*;

pub(super) type RadosT = *mut c_void;
pub(super) type IoctxT = *mut c_void;
pub(super) type ImageT = *mut c_void;
pub(super) type CompT = *mut c_void;

/// `rbd_image_info_t` of librbd.h.
#[repr(C)]
pub(super) struct ImageInfo {
    pub(super) size: u64,
    pub(super) obj_size: u64,
    pub(super) num_objs: u64,
    pub(super) order: c_int,
    pub(super) block_name_prefix: [c_char; 24],
    pub(super) parent_pool: i64,
    pub(super) parent_name: [c_char; 96],
}

pub(super) type FnRadosCreate = unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int;
pub(super) type FnConfReadFile = unsafe extern "C" fn(RadosT, *const c_char) -> c_int;
pub(super) type FnConfSet = unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int;
pub(super) type FnConfGet =
    unsafe extern "C" fn(RadosT, *const c_char, *mut c_char, usize) -> c_int;
pub(super) type FnRados = unsafe extern "C" fn(RadosT) -> c_int;
pub(super) type FnRadosVoid = unsafe extern "C" fn(RadosT);
pub(super) type FnClusterFsid = unsafe extern "C" fn(RadosT, *mut c_char, usize) -> c_int;
pub(super) type FnIoctxCreate = unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int;
pub(super) type FnIoctxGetId = unsafe extern "C" fn(IoctxT) -> i64;
pub(super) type FnIoctxVoid = unsafe extern "C" fn(IoctxT);
pub(super) type FnOpen =
    unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int;
pub(super) type FnImage = unsafe extern "C" fn(ImageT) -> c_int;
pub(super) type FnGetSize = unsafe extern "C" fn(ImageT, *mut u64) -> c_int;
pub(super) type FnGetId = unsafe extern "C" fn(ImageT, *mut c_char, usize) -> c_int;
pub(super) type FnStat = unsafe extern "C" fn(ImageT, *mut ImageInfo, usize) -> c_int;
pub(super) type FnCreateCompletion = unsafe extern "C" fn(
    *mut c_void,
    Option<unsafe extern "C" fn(CompT, *mut c_void)>,
    *mut CompT,
) -> c_int;
pub(super) type FnAioRead = unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompT) -> c_int;
pub(super) type FnAioWrite =
    unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompT) -> c_int;
pub(super) type FnAioWriteZeroes =
    unsafe extern "C" fn(ImageT, u64, usize, CompT, c_int, c_int) -> c_int;
pub(super) type FnAioFlush = unsafe extern "C" fn(ImageT, CompT) -> c_int;
pub(super) type FnComp = unsafe extern "C" fn(CompT) -> c_int;
pub(super) type FnCompRet = unsafe extern "C" fn(CompT) -> isize;
pub(super) type FnCompVoid = unsafe extern "C" fn(CompT);
pub(super) type FnLockAcquire = unsafe extern "C" fn(ImageT, c_int) -> c_int;
pub(super) type FnMetaGet =
    unsafe extern "C" fn(ImageT, *const c_char, *mut c_char, *mut usize) -> c_int;
pub(super) type FnMetaSet = unsafe extern "C" fn(ImageT, *const c_char, *const c_char) -> c_int;
pub(super) type FnMetaRemove = unsafe extern "C" fn(ImageT, *const c_char) -> c_int;
pub(super) type FnConfigList = unsafe extern "C" fn(ImageT, *mut ConfigOption, *mut c_int) -> c_int;
pub(super) type FnConfigListCleanup = unsafe extern "C" fn(*mut ConfigOption, c_int);

/// `rbd_config_option_t` of librbd.h.
#[repr(C)]
pub(super) struct ConfigOption {
    pub(super) name: *mut c_char,
    pub(super) value: *mut c_char,
    pub(super) source: c_int,
}

/// `RBD_LOCK_MODE_EXCLUSIVE`.
pub(super) const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;

/// The last `dlerror()` message, or `what` when there is none.
pub(super) fn dlerror_or(what: &str) -> String {
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
pub(super) fn dlopen(name: &CStr) -> Result<*mut c_void, String> {
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
pub(super) fn lib_name(var: &str, default: &CStr) -> Result<CString, String> {
    match std::env::var_os(var) {
        Some(v) => CString::new(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()))
            .map_err(|_| format!("{var} contains a NUL byte")),
        None => Ok(default.to_owned()),
    }
}

/// Looks `name` up in `h`.
pub(super) fn dlsym(h: *mut c_void, name: &CStr) -> Option<*mut c_void> {
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
    pub(super) fn load() -> Result<Lib, String> {
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

pub(super) static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

pub(super) fn lib() -> Result<&'static Lib, IoErr> {
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
