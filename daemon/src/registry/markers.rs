//! RBD dirty markers (SPEC C18; the module docs of `registry`): setting, checking and removing
//! them.

use super::*;

pub(super) fn lock_markers(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cache's identity as the dirty marker names it (its superblock's cache id, in hex).
pub(super) fn engine_uuid(e: &Engine) -> String {
    e.with_cache(|c| {
        c.config()
            .persist
            .as_ref()
            .map(|p| hex(&p.superblock.cache_id))
    })
    .unwrap_or_else(|| "volatile".into())
}

/// Refuses an RBD image whose dirty marker names another cache: that cache holds dirty data
/// the image lacks.
pub(super) fn check_marker(device: &str, r: &RbdBackend, uuid: &str) -> Result<(), String> {
    let mine = format!("dirty in tiercache {uuid}");
    match r.dirty_marker() {
        Ok(Some(v)) if v != mine => Err(format!(
            "{device}: the image is marked '{v}' (image metadata {}): another tiercache cache holds dirty data of it; write that cache back, or if it is gone for good: rbd image-meta remove {} {}",
            tiercache_io::DIRTY_KEY,
            r.target().spec(),
            tiercache_io::DIRTY_KEY
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{device}: reading its dirty marker: {e}")),
    }
}

/// The RBD cores among `cores`, each with how long an update of its dirty marker is waited
/// for: its IO timeout, at most [`RBD_MARKER_WAIT`], and that when it has none.
pub(super) fn rbd_markers(
    cores: &BTreeMap<u16, CoreEntry>,
) -> Vec<(u16, Arc<RbdBackend>, Duration)> {
    cores
        .iter()
        .filter_map(|(i, k)| Some((*i, k.rbd.clone()?, rbd_wait(k.io_timeout, RBD_MARKER_WAIT))))
        .collect()
}

/// How long a librbd call that may wait as long as the cluster is down is waited for: the
/// core's IO timeout, at most `cap`, and `cap` when it has none.
pub(super) fn rbd_wait(io_timeout: Option<Duration>, cap: Duration) -> Duration {
    io_timeout.map_or(cap, |t| t.min(cap))
}

/// Sets the dirty marker of each RBD core that may have dirty data (the mode is lazy, unless
/// `stopped`, or the cache holds dirty lines of it) and removes the others'. The caller holds
/// the registry's marker lock.
pub(super) fn sync_markers(
    e: &Engine,
    cores: &[(u16, Arc<RbdBackend>, Duration)],
    stopped: bool,
) -> Result<(), String> {
    let uuid = engine_uuid(e);
    for (i, r, wait) in cores {
        let want = (lazy_now(e) && !stopped) || core_has_dirty(e, *i);
        r.set_dirty_marker_within(want.then_some(uuid.as_str()), *wait)
            .map_err(|err| format!("core {i}: dirty marker: {err}"))?;
    }
    Ok(())
}

/// The longest a dirty-marker update of an RBD image is waited for (the registry's marker lock
/// is held meanwhile, and a stopping cache waits for it): an unresponsive cluster makes it a
/// `TimedOut` error (logged, or the answer of the command that needed it) instead of a hang. A
/// marker left as it was errs on the safe side only when it says "dirty" (see docs/CEPH.md). A
/// core with a shorter IO timeout waits that long instead.
pub(super) const RBD_MARKER_WAIT: Duration = Duration::from_secs(10);
