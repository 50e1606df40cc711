//! How a device is recognised, for the core table (SPEC C18): a block device by its WWN or
//! serial (from sysfs), a regular file by its file system's id and its inode.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use tiercache_format::tables::CoreIdentity;

/// The identity of the device or file at `path`.
pub fn of_path(path: &Path) -> Result<CoreIdentity, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if md.file_type().is_block_device() {
        let (maj, min) = (libc_major(md.rdev()), libc_minor(md.rdev()));
        let sys = format!("/sys/dev/block/{maj}:{min}/device");
        let read = |f: &str| {
            std::fs::read_to_string(f)
                .ok()
                .map(|s| s.trim().trim_matches(char::from(0)).to_string())
                .filter(|s| !s.is_empty())
        };
        for f in ["wwid", "serial", "vpd_pg80"] {
            if let Some(s) = read(&format!("{sys}/{f}")) {
                return Ok(CoreIdentity::Block { serial: s });
            }
        }
        // A loop device is its backing file (the same data, whichever loop number it
        // gets); a device-mapper device is its DM UUID.
        let dev = format!("/sys/dev/block/{maj}:{min}");
        if let Some(f) = read(&format!("{dev}/loop/backing_file")) {
            return of_path(Path::new(&f))
                .map_err(|e| format!("{}: its backing file: {e}", path.display()));
        }
        if let Some(u) = read(&format!("{dev}/dm/uuid")) {
            return Ok(CoreIdentity::Block {
                serial: format!("dm:{u}"),
            });
        }
        return Err(format!(
            "{}: the block device reports no WWN, serial, loop backing file or device-mapper UUID in sysfs, so it cannot be told from another one",
            path.display()
        ));
    }
    if !md.is_file() {
        return Err(format!("{}: not a file or block device", path.display()));
    }
    // The file system's id: st_dev and statfs's f_fsid together, 16 bytes.
    let fsid = statfs_fsid(path)?;
    let mut fs = [0u8; 16];
    fs[..8].copy_from_slice(&md.dev().to_le_bytes());
    fs[8..].copy_from_slice(&fsid.to_le_bytes());
    Ok(CoreIdentity::File {
        fs_uuid: fs,
        inode: md.ino(),
    })
}

fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)
}

fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)
}

fn statfs_fsid(path: &Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path holds a NUL byte", path.display()))?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of the
    // size statfs writes; the result is read only if the call succeeded.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(format!(
            "{}: statfs: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: statfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // SAFETY: fsid_t is two i32s with no invalid bit patterns; read it as bytes.
    let raw: [u8; 8] = unsafe { std::mem::transmute(st.f_fsid) };
    Ok(u64::from_le_bytes(raw))
}
