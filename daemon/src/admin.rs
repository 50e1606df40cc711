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
    s.write_all(line.as_bytes())
        .map_err(|e| format!("sending to the daemon: {e}"))?;
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
