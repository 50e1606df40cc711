//! The admin protocol between `tiercache` verbs and the daemon: one JSON request per line on
//! the admin unix socket; the daemon answers with zero or more progress lines
//! (`{"progress":{...}}`) and one final line, `{"ok":true,"result":...}` or
//! `{"ok":false,"error":"one line"}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Largest request line accepted (a CSV of IO classes travels inside one).
pub const REQUEST_MAX: usize = 1 << 20;

/// Who may issue commands on the admin socket (SPEC R7): root, the daemon's own user, and,
/// with `--socket-group`, members of that group (by primary or supplementary group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The daemon's effective uid.
    pub uid: u32,
    /// The configured group.
    pub group: Option<u32>,
}

/// The credentials of a unix socket's peer, as the kernel recorded them when it connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Supplementary groups (`SO_PEERGROUPS`; empty where the kernel does not tell).
    pub groups: Vec<u32>,
}

/// `SO_PEERGROUPS` (Linux 4.13; not in the libc crate).
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's credentials (`SO_PEERCRED`, and `SO_PEERGROUPS` for its groups).
pub fn peer_cred(s: &UnixStream) -> Option<PeerCred> {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the fd is open.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    let mut groups = vec![0 as libc::gid_t; 64];
    for _ in 0..2 {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for writes of `len` bytes; the fd is open.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            break;
        }
        // ERANGE: `len` says how much is needed; anything else: no groups known.
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ERANGE) && n > groups.len()
        {
            groups = vec![0; n];
        } else {
            groups.clear();
            break;
        }
    }
    Some(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

impl Access {
    /// The daemon's policy: its effective uid and the configured group.
    pub fn new(group: Option<u32>) -> Access {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        Access { uid, group }
    }

    /// Whether `p` may issue commands.
    pub fn allows(&self, p: &PeerCred) -> bool {
        p.uid == 0
            || p.uid == self.uid
            || self
                .group
                .is_some_and(|g| p.gid == g || p.groups.contains(&g))
    }

    /// The one-line refusal sent to a peer that may not.
    pub fn refusal(&self, p: Option<&PeerCred>) -> String {
        let who = match p {
            Some(p) => format!("uid {} gid {}", p.uid, p.gid),
            None => "a peer whose credentials are unknown".to_string(),
        };
        let group = match self.group {
            Some(g) => format!(", or members of group {}", group_name(g)),
            None => String::new(),
        };
        format!(
            "permission denied: only root, the daemon's user (uid {}){group} may manage it; \
             this connection is {who}",
            self.uid
        )
    }
}

/// Resolves a group name (or a numeric gid) to a gid.
pub fn resolve_group(name: &str) -> Result<u32, String> {
    if let Ok(g) = name.parse::<u32>() {
        return Ok(g);
    }
    let cname = std::ffi::CString::new(name)
        .map_err(|_| format!("--socket-group {name:?}: not a group name"))?;
    let mut buf = vec![0 as libc::c_char; 4096];
    loop {
        // SAFETY: plain data, filled in by getgrnam_r.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut res: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf` is writable for its length.
        let r = unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                &mut grp,
                buf.as_mut_ptr(),
                buf.len(),
                &mut res,
            )
        };
        if r == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if r != 0 {
            return Err(format!(
                "--socket-group {name}: {}",
                std::io::Error::from_raw_os_error(r)
            ));
        }
        if res.is_null() {
            return Err(format!(
                "--socket-group {name}: no such group (see /etc/group or `getent group`)"
            ));
        }
        return Ok(grp.gr_gid);
    }
}

/// The name of group `gid` (the number if it has none).
pub fn group_name(gid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: plain data, filled in by getgrgid_r.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut res: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` is writable for its length.
    let r = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut res) };
    if r != 0 || res.is_null() || grp.gr_name.is_null() {
        return gid.to_string();
    }
    // SAFETY: getgrgid_r succeeded, so gr_name points to a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(grp.gr_name) };
    format!("{} ({gid})", name.to_string_lossy())
}

/// A request to the daemon.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "verb", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Create (or with `load`, load) a cache.
    StartCache {
        /// Device string.
        cache_device: String,
        /// Cache id (default: the smallest free, from 1).
        cache_id: Option<u16>,
        /// Mode for a new cache (default `wt`).
        mode: Option<String>,
        /// Line size for a new cache (default 4k).
        line_size: Option<String>,
        /// Load the cache the device holds.
        load: bool,
        /// Format the device even if it holds a cache or other data.
        force: bool,
        /// IO timeout of the cache device (`500ms`, `30s`; none when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        io_timeout: Option<String>,
        /// Only check and say what a new cache would use; change nothing.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dry_run: bool,
    },
    /// Attach a core.
    AddCore {
        /// Cache id.
        cache_id: u16,
        /// Device string.
        core_device: String,
        /// Core id (default: the recorded id of a core with this identity, else the smallest free).
        core_id: Option<u16>,
        /// Export name (default `cache<N>-core<M>`).
        export: Option<String>,
        /// IO timeout of the core device (`500ms`, `30s`; none when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        io_timeout: Option<String>,
    },
    /// Detach a core (writing its dirty data back first unless told not to).
    RemoveCore {
        /// Cache id.
        cache_id: u16,
        /// Core id.
        core_id: u16,
        /// Do not write dirty data back (refused while there is any).
        no_writeback: bool,
    },
    /// Stop a cache (writing dirty data back first unless told not to; dirty data stays
    /// persisted on the cache device then).
    StopCache {
        /// Cache id.
        cache_id: u16,
        /// Keep dirty data on the cache device.
        no_writeback: bool,
    },
    /// Caches and cores with their states.
    List,
    /// Statistics.
    Stats {
        /// Cache id (all caches when absent).
        cache_id: Option<u16>,
        /// Core id.
        core_id: Option<u16>,
        /// IO class id.
        io_class: Option<u8>,
    },
    /// Set parameters of a group (`seq-cutoff`, `cleaning`, `cleaning-alru`, `cleaning-acp`,
    /// `promotion`, `promotion-nhit`).
    SetParam {
        /// Cache id.
        cache_id: u16,
        /// Core id (seq-cutoff only; all cores when absent).
        core_id: Option<u16>,
        /// Group name.
        name: String,
        /// Parameter name to value.
        values: Vec<(String, String)>,
    },
    /// Get the parameters of a group.
    GetParam {
        /// Cache id.
        cache_id: u16,
        /// Core id (seq-cutoff).
        core_id: Option<u16>,
        /// Group name.
        name: String,
    },
    /// Switch mode.
    SetMode {
        /// Cache id.
        cache_id: u16,
        /// New mode.
        mode: String,
    },
    /// Load an IO class table (Open CAS CSV text).
    IoClassLoad {
        /// Cache id.
        cache_id: u16,
        /// The CSV.
        csv: String,
    },
    /// The IO class table in force.
    IoClassList {
        /// Cache id.
        cache_id: u16,
    },
    /// Write all dirty data back (progress lines while it runs).
    Writeback {
        /// Cache id.
        cache_id: u16,
        /// Only wait for this core's dirty data.
        core_id: Option<u16>,
    },
    /// Stop the running `writeback` commands of a cache: each answers with what it wrote back
    /// and what is still dirty.
    CancelWriteback {
        /// Cache id.
        cache_id: u16,
    },
    /// Drop everything a core has in the cache, dirty data included.
    Invalidate {
        /// Cache id.
        cache_id: u16,
        /// Core id.
        core_id: u16,
    },
    /// Zero the counters of a cache.
    ResetCounters {
        /// Cache id.
        cache_id: u16,
    },
    /// Stop every cache cleanly and end the daemon.
    Shutdown,
}

/// Progress of a long request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// What is running.
    pub what: String,
    /// Units done.
    pub done: u64,
    /// Units in all.
    pub total: u64,
    /// Unit name.
    pub unit: String,
}

/// Where the admin socket is by default: `$TIERCACHE_SOCKET`, else
/// `$XDG_RUNTIME_DIR/tiercache/admin.sock`, else `/run/tiercache/admin.sock`.
pub fn default_socket() -> PathBuf {
    if let Some(s) = std::env::var_os("TIERCACHE_SOCKET") {
        return PathBuf::from(s);
    }
    runtime_dir().join("admin.sock")
}

/// `$XDG_RUNTIME_DIR/tiercache` (or `/run/tiercache` for root or without it).
pub fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !root => PathBuf::from(d).join("tiercache"),
        _ => PathBuf::from("/run/tiercache"),
    }
}

/// Sends `req` to the daemon at `socket`; `progress` sees each progress line. Returns the
/// result or the daemon's one-line error.
pub fn call(
    socket: &Path,
    req: &Request,
    mut progress: impl FnMut(&Progress),
) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot reach the daemon at {} ({e}); start it with `tiercache daemon` or pass --socket",
            socket.display()
        )
    })?;
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    if let Err(e) = s.write_all(line.as_bytes()) {
        // A daemon that refuses the connection may have answered and closed already: its
        // answer says more than the broken pipe.
        let mut l = String::new();
        return match BufReader::new(&s).read_line(&mut l) {
            Ok(n) if n > 0 => match serde_json::from_str::<Value>(&l) {
                Ok(v) => Err(v
                    .get("error")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("sending to the daemon: {e}"))),
                Err(_) => Err(format!("sending to the daemon: {e}")),
            },
            _ => Err(format!("sending to the daemon: {e}")),
        };
    }
    let mut r = BufReader::new(s);
    loop {
        let mut l = String::new();
        let n = r
            .read_line(&mut l)
            .map_err(|e| format!("reading the daemon's answer: {e}"))?;
        if n == 0 {
            return Err("the daemon closed the connection without an answer".into());
        }
        let v: Value =
            serde_json::from_str(&l).map_err(|e| format!("bad answer from the daemon: {e}"))?;
        if let Some(p) = v.get("progress") {
            if let Ok(p) = serde_json::from_value::<Progress>(p.clone()) {
                progress(&p);
            }
            continue;
        }
        return match v.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            _ => Err(v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("the daemon gave no reason")
                .to_string()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request::StartCache {
            cache_device: "/x".into(),
            cache_id: Some(1),
            mode: Some("wb".into()),
            line_size: None,
            load: false,
            force: true,
            io_timeout: None,
            dry_run: false,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert!(s.contains("\"verb\":\"start-cache\""), "{s}");
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert!(serde_json::from_str::<Request>(r#"{"verb":"nope"}"#).is_err());
        assert!(
            serde_json::from_str::<Request>(
                r#"{"verb":"set-mode","cache_id":1,"mode":"wb","x":1}"#
            )
            .is_err()
        );
    }
}
