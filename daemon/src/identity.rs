//! One device, one owner (SPEC C18, issue 25): which storage a device string names, whatever
//! its spelling, so that the registry refuses a device this daemon already holds as a cache
//! device or a core — or one that overlaps it — before opening anything.
//!
//! A device is a set of names for the storage it *is* and a set for the storage it is *part
//! of*:
//! - a regular file (also under `emu:`, `faulty:`, `powercut:`) is its `(st_dev, st_ino)`:
//!   symlinks, `.`, `..` and hard links all come to the same;
//! - a block device is its device number (`st_rdev`: `/dev/disk/by-*` names and other nodes
//!   of the same device come to it); a loop device is also its backing file (sysfs
//!   `loop/backing_file`), so it is the same device as that file and as another loop device
//!   over it; a partition is part of its whole disk (sysfs `partition`, the disk is the parent
//!   directory), and a device-mapper or md device is part of what it is built on (sysfs
//!   `slaves`) — two partitions of one disk do not overlap;
//! - an RBD image is its pool id and image id, and its cluster's fsid when librados gives it
//!   (two `--ceph-conf` files may name one cluster);
//! - an `nbd:` export is its export name at its server's addresses (the socket's canonical
//!   path, or every address the host resolves to, with the port: `tiercache_io::nbd_endpoints`);
//! - a `ram:` device is anonymous: each is its own, and none overlaps another.
//!
//! Two devices overlap when one *is* a name the other is or is part of.

use crate::device::DeviceSpec;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One name of a piece of storage.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// A regular file: `(st_dev, st_ino)`.
    File(u64, u64),
    /// A block device: its device number.
    Block(u64),
    /// An RBD image: cluster fsid (if known), pool id, image id.
    Rbd(Option<String>, u64, String),
    /// An NBD export: one address of its server, and the export name.
    Nbd(String, String),
}

impl Key {
    fn same(&self, o: &Key) -> bool {
        match (self, o) {
            // An unknown fsid matches any: pool id and image id then decide.
            (Key::Rbd(f, p, i), Key::Rbd(g, q, j)) => {
                p == q && i == j && (f.is_none() || g.is_none() || f == g)
            }
            _ => self == o,
        }
    }
}

/// How a device meets one already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// The same storage.
    Same,
    /// The new device is part of the held one (a partition of a held disk).
    PartOf,
    /// The held device is part of the new one (the disk of a held partition).
    Holds,
}

/// Which storage a device is (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    is: Vec<Key>,
    within: Vec<Key>,
    /// The RBD image's ids, for the core table (saves a second connection).
    rbd: Option<tiercache_io::RbdIdentity>,
}

/// sysfs, where block devices are looked up.
const SYSFS: &str = "/sys";

impl Identity {
    /// What `spec` names (`shown` names it in errors). Nothing is opened for writing: files
    /// and block devices are looked at with `stat` and sysfs, an RBD image through a
    /// read-only open, an NBD URI without connecting.
    pub fn of(spec: &DeviceSpec, shown: &str) -> Result<Identity, String> {
        match spec {
            DeviceSpec::Ram(_) => Ok(Identity::default()),
            DeviceSpec::Nbd(uri) => {
                let (at, export) = tiercache_io::nbd_endpoints(uri)
                    .map_err(|why| format!("{shown}: invalid NBD URI: {why}"))?;
                Ok(Identity {
                    is: at
                        .into_iter()
                        .map(|a| Key::Nbd(a, export.clone()))
                        .collect(),
                    ..Identity::default()
                })
            }
            DeviceSpec::Rbd(t) => {
                let id =
                    tiercache_io::rbd_identity(t).map_err(|e| crate::device::rbd_msg(shown, e))?;
                Ok(Identity {
                    is: vec![Key::Rbd(
                        id.cluster_fsid.clone(),
                        id.pool_id,
                        id.image_id.clone(),
                    )],
                    within: Vec::new(),
                    rbd: Some(id),
                })
            }
            DeviceSpec::Path(p)
            | DeviceSpec::Emu(_, p)
            | DeviceSpec::PowerCut(p)
            | DeviceSpec::Faulty(p) => {
                of_path(p, Path::new(SYSFS)).map_err(|e| format!("{shown}: cannot look at it: {e}"))
            }
        }
    }

    /// How this device meets `held`, if it does.
    pub fn overlap(&self, held: &Identity) -> Option<Overlap> {
        let any = |a: &[Key], b: &[Key]| a.iter().any(|x| b.iter().any(|y| x.same(y)));
        if any(&self.is, &held.is) {
            Some(Overlap::Same)
        } else if any(&self.within, &held.is) {
            Some(Overlap::PartOf)
        } else if any(&self.is, &held.within) {
            Some(Overlap::Holds)
        } else {
            None
        }
    }

    /// The RBD image's ids, for an `rbd:` device.
    pub fn rbd(&self) -> Option<&tiercache_io::RbdIdentity> {
        self.rbd.as_ref()
    }
}

/// Who holds a device in this daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The cache device of a cache.
    Cache(u16),
    /// A core (cache id, core id).
    Core(u16, u16),
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Cache(c) => write!(f, "the cache device of cache {c}"),
            Holder::Core(c, k) => write!(f, "core {k} of cache {c}"),
        }
    }
}

/// The one-line refusal of `device` because it meets `held_device`, held by `holder`. The
/// same string as the holder's is "already" it (as before identities were compared).
pub fn refusal(device: &str, how: Overlap, holder: Holder, held_device: &str) -> String {
    if device == held_device && how == Overlap::Same {
        return match holder {
            Holder::Cache(c) => format!("{device} is already cache {c}"),
            h => format!("{device} is already {h}"),
        };
    }
    let what = match how {
        Overlap::Same => "is the same device as",
        Overlap::PartOf => "is part of",
        Overlap::Holds => "contains",
    };
    format!("{device} {what} {holder} ({held_device})")
}

/// The identity of the file or block device at `path`, with sysfs at `sys`.
fn of_path(path: &Path, sys: &Path) -> Result<Identity, String> {
    let md = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if md.file_type().is_block_device() {
        return Ok(block(md.rdev(), sys, 0));
    }
    Ok(Identity {
        is: vec![Key::File(md.dev(), md.ino())],
        ..Identity::default()
    })
}

/// Device numbers as `MAJ:MIN` (sysfs's `dev` files and `/sys/dev/block` names).
fn maj_min(rdev: u64) -> String {
    format!("{}:{}", libc::major(rdev), libc::minor(rdev))
}

fn read_rdev(f: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(f).ok()?;
    let (a, b) = s.trim().split_once(':')?;
    Some(libc::makedev(a.parse().ok()?, b.parse().ok()?))
}

/// A block device by its number, from sysfs (what sysfs does not say is left out: the device
/// is then only itself).
fn block(rdev: u64, sys: &Path, depth: u32) -> Identity {
    let mut id = Identity {
        is: vec![Key::Block(rdev)],
        ..Identity::default()
    };
    // Deeper than any real stack of devices: a loop in a (fake) sysfs ends here.
    if depth > 8 {
        return id;
    }
    let node = sys.join("dev/block").join(maj_min(rdev));
    if let Ok(f) = std::fs::read_to_string(node.join("loop/backing_file"))
        && let Ok(md) = std::fs::metadata(f.trim_end_matches('\n'))
    {
        id.is.push(Key::File(md.dev(), md.ino()));
    }
    let mut parents: Vec<u64> = Vec::new();
    if node.join("partition").exists()
        && let Ok(real) = std::fs::canonicalize(&node)
        && let Some(disk) = real.parent().and_then(|d| read_rdev(&d.join("dev")))
    {
        parents.push(disk);
    }
    if let Ok(rd) = std::fs::read_dir(node.join("slaves")) {
        for e in rd.flatten() {
            let dev: PathBuf = sys.join("class/block").join(e.file_name()).join("dev");
            parents.extend(read_rdev(&dev));
        }
    }
    for p in parents {
        let up = block(p, sys, depth + 1);
        id.within.extend(up.is);
        id.within.extend(up.within);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tc-ident-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn of(s: &str) -> Identity {
        Identity::of(&DeviceSpec::parse(s).unwrap(), s).unwrap()
    }

    #[test]
    fn a_file_under_any_spelling_is_one_device() {
        let d = dir("file");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let f = d.join("disk.img");
        std::fs::write(&f, [0u8; 4096]).unwrap();
        symlink(&f, d.join("link.img")).unwrap();
        std::fs::hard_link(&f, d.join("hard.img")).unwrap();
        let base = of(&f.display().to_string());
        let dd = d.display();
        for s in [
            format!("{dd}/./disk.img"),
            format!("{dd}/sub/../disk.img"),
            format!("{dd}/link.img"),
            format!("{dd}/hard.img"),
            format!("emu:hdd-10k-sas:{dd}/disk.img"),
            format!("faulty:{dd}/./disk.img"),
            format!("powercut:{dd}/link.img"),
        ] {
            assert_eq!(of(&s).overlap(&base), Some(Overlap::Same), "{s}");
        }
        std::fs::write(d.join("other.img"), [0u8; 4096]).unwrap();
        assert_eq!(of(&format!("{dd}/other.img")).overlap(&base), None);
        let e = Identity::of(
            &DeviceSpec::parse("/nonexistent/x").unwrap(),
            "/nonexistent/x",
        )
        .unwrap_err();
        assert!(e.starts_with("/nonexistent/x: cannot look at it:"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn ram_devices_are_anonymous() {
        let (a, b) = (of("ram:64m"), of("ram:64m"));
        assert_eq!(a.overlap(&b), None);
        assert_eq!(a.overlap(&a), None);
    }

    #[test]
    fn nbd_exports_by_canonical_uri() {
        let d = dir("nbd");
        std::fs::write(d.join("s.sock"), b"").unwrap();
        symlink(d.join("s.sock"), d.join("l.sock")).unwrap();
        let dd = d.display();
        let a = of(&format!("nbd:nbd+unix:///vm?socket={dd}/s.sock"));
        let b = of(&format!("nbd:nbd+unix:///%76m?socket={dd}/l.sock"));
        assert_eq!(b.overlap(&a), Some(Overlap::Same));
        let c = of(&format!("nbd:nbd+unix:///other?socket={dd}/s.sock"));
        assert_eq!(c.overlap(&a), None, "another export of the same server");
        let t = of("nbd:nbd://localhost/vm");
        assert_eq!(
            of("nbd:nbd://127.0.0.1:10809/vm").overlap(&t),
            Some(Overlap::Same)
        );
        assert_eq!(of("nbd:nbd://127.0.0.1:10900/vm").overlap(&t), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn rbd_images_by_ids_and_cluster() {
        let img = |f: Option<&str>, p: u64, i: &str| Identity {
            is: vec![Key::Rbd(f.map(str::to_string), p, i.to_string())],
            ..Identity::default()
        };
        let a = img(Some("fsid-1"), 3, "abc");
        assert_eq!(
            img(Some("fsid-1"), 3, "abc").overlap(&a),
            Some(Overlap::Same)
        );
        assert_eq!(img(None, 3, "abc").overlap(&a), Some(Overlap::Same));
        assert_eq!(img(Some("fsid-2"), 3, "abc").overlap(&a), None);
        assert_eq!(img(Some("fsid-1"), 4, "abc").overlap(&a), None);
        assert_eq!(img(Some("fsid-1"), 3, "abd").overlap(&a), None);
    }

    /// A fake sysfs: disk 7:0 (a loop device over `backing`) with partitions 259:1 and 259:2,
    /// and a device-mapper device 253:5 over the first partition; as the kernel lays them out
    /// (`/sys/dev/block/M:m` links into `/sys/devices`, partitions under their disk).
    fn fake_sysfs(d: &Path, backing: &Path) -> PathBuf {
        let sys = d.join("sys");
        let disk = sys.join("devices/virtual/block/loop7");
        let w = |p: PathBuf, s: &str| {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, s).unwrap();
        };
        w(disk.join("dev"), "7:0\n");
        w(
            disk.join("loop/backing_file"),
            &format!("{}\n", backing.display()),
        );
        for (n, mm) in [(1, "259:1"), (2, "259:2")] {
            let p = disk.join(format!("loop7p{n}"));
            w(p.join("dev"), &format!("{mm}\n"));
            w(p.join("partition"), &format!("{n}\n"));
        }
        let dm = sys.join("devices/virtual/block/dm-5");
        w(dm.join("dev"), "253:5\n");
        std::fs::create_dir_all(dm.join("slaves/loop7p1")).unwrap();
        std::fs::create_dir_all(sys.join("dev/block")).unwrap();
        std::fs::create_dir_all(sys.join("class/block")).unwrap();
        for (mm, rel) in [
            ("7:0", "loop7"),
            ("259:1", "loop7/loop7p1"),
            ("259:2", "loop7/loop7p2"),
            ("253:5", "dm-5"),
        ] {
            let target = sys.join("devices/virtual/block").join(rel);
            symlink(&target, sys.join("dev/block").join(mm)).unwrap();
            let name = rel.rsplit('/').next().unwrap();
            symlink(&target, sys.join("class/block").join(name)).unwrap();
        }
        sys
    }

    #[test]
    fn block_devices_from_sysfs_partitions_loop_and_dm() {
        let d = dir("sysfs");
        let backing = d.join("backing.img");
        std::fs::write(&backing, [0u8; 512]).unwrap();
        let sys = fake_sysfs(&d, &backing);
        let dev = |a, b| block(libc::makedev(a, b), &sys, 0);
        let file = of_path(&backing, &sys).unwrap();
        let (disk, p1, p2, dm) = (dev(7, 0), dev(259, 1), dev(259, 2), dev(253, 5));
        // The loop device is its backing file, and the same as itself under another node.
        assert_eq!(disk.overlap(&file), Some(Overlap::Same));
        assert_eq!(file.overlap(&disk), Some(Overlap::Same));
        assert_eq!(dev(7, 0).overlap(&disk), Some(Overlap::Same));
        // A partition is part of its disk (and of the disk's backing file); the disk contains
        // it; the two partitions do not overlap.
        assert_eq!(p1.overlap(&disk), Some(Overlap::PartOf));
        assert_eq!(p1.overlap(&file), Some(Overlap::PartOf));
        assert_eq!(disk.overlap(&p1), Some(Overlap::Holds));
        assert_eq!(file.overlap(&p2), Some(Overlap::Holds));
        assert_eq!(p1.overlap(&p2), None);
        // A device-mapper device is part of what it is built on, and of that one's disk.
        assert_eq!(dm.overlap(&p1), Some(Overlap::PartOf));
        assert_eq!(dm.overlap(&disk), Some(Overlap::PartOf));
        assert_eq!(p1.overlap(&dm), Some(Overlap::Holds));
        assert_eq!(dm.overlap(&p2), None);
        // A device sysfs knows nothing of is only itself.
        assert_eq!(dev(8, 16).overlap(&disk), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_refusal_is_one_line_naming_the_holder() {
        let m = refusal(
            "/srv/./disk.img",
            Overlap::Same,
            Holder::Core(1, 0),
            "emu:hdd-10k-sas:/srv/disk.img",
        );
        assert_eq!(
            m,
            "/srv/./disk.img is the same device as core 0 of cache 1 (emu:hdd-10k-sas:/srv/disk.img)"
        );
        let m = refusal("/dev/sdb", Overlap::Holds, Holder::Cache(2), "/dev/sdb1");
        assert_eq!(
            m,
            "/dev/sdb contains the cache device of cache 2 (/dev/sdb1)"
        );
        let m = refusal("/x", Overlap::Same, Holder::Cache(2), "/x");
        assert_eq!(m, "/x is already cache 2");
        let m = refusal("/x", Overlap::Same, Holder::Core(2, 3), "/x");
        assert_eq!(m, "/x is already core 3 of cache 2");
    }
}
