//! Handles: the cluster connection, the pool's I/O context, the open image (each closed on drop),
//! the image's identity and config; opening an [`RbdBackend`], its size, its dirty marker, calls
//! with a time limit on a helper thread.

use super::*;

/// A librados cluster handle (shut down on drop).
pub(super) struct Cluster {
    pub(super) lib: &'static Lib,
    pub(super) h: RadosT,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: `h` came from rados_create and is shut down exactly once, here, after every
        // I/O context and image made from it was closed (they are dropped first).
        unsafe { (self.lib.rados_shutdown)(self.h) }
    }
}

/// A pool's I/O context (destroyed on drop).
pub(super) struct Ioctx {
    pub(super) lib: &'static Lib,
    pub(super) h: IoctxT,
}

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: `h` came from rados_ioctx_create and is destroyed exactly once, here, after
        // the image opened in it was closed.
        unsafe { (self.lib.rados_ioctx_destroy)(self.h) }
    }
}

/// An open image (closed on drop).
pub(super) struct Image {
    pub(super) lib: &'static Lib,
    pub(super) h: ImageT,
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
pub(super) fn image_config(lib: &'static Lib, img: &Image, key: &str) -> Option<String> {
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
pub(super) fn connect(lib: &'static Lib, target: &RbdTarget) -> Result<(Cluster, Ioctx), IoErr> {
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
pub(super) fn open_image(
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
pub(super) fn cluster_fsid(c: &Cluster) -> Option<String> {
    let mut buf = [0u8; 64];
    // SAFETY: `c.h` is a connected cluster handle and `buf` is writable for its length.
    let r = unsafe { (c.lib.rados_cluster_fsid)(c.h, buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(r).ok()?.min(buf.len());
    let s = String::from_utf8_lossy(&buf[..n]);
    let s = s.trim_end_matches('\0').trim();
    (!s.is_empty()).then(|| s.to_string())
}

pub(super) fn image_id(lib: &'static Lib, img: &Image) -> Result<String, isize> {
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

/// How a call run by [`RbdBackend::on_helper`] went.
pub(super) enum Helper<T> {
    /// It returned within the wait.
    Done(T),
    /// An earlier call of its kind has not returned: not started.
    Busy,
    /// No thread could be started for it.
    NoThread(std::io::Error),
    /// It did not return within the wait (it goes on on its thread).
    TimedOut,
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
    pub(super) fn on_helper<T: Send + 'static>(
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
