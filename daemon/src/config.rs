//! The daemon's config file (TOML): listeners, and every cache with its cores, exports and
//! parameters. `tiercache daemon --config FILE` reassembles everything from it at start,
//! loading the caches that exist and never reformatting one (see [`reassemble`]).
//!
//! ```toml
//! [daemon]
//! socket = "/run/tiercache/admin.sock"          # optional
//! nbd_listen = ["unix:/run/tiercache/nbd.sock"]  # optional
//! metrics_listen = "127.0.0.1:9745"             # optional; "none" turns it off
//! socket_group = "tiercache"                   # optional: who may use the unix sockets
//! tls_cert = "/etc/tiercache/server-cert.pem"   # optional, with tls_key and tls_ca: TLS on
//! tls_key = "/etc/tiercache/server-key.pem"     #   every NBD listener, client certificates
//! tls_ca = "/etc/tiercache/ca-cert.pem"         #   signed by tls_ca required
//! log_level = "info"                            # optional: error, warn, info or debug
//!
//! [[cache]]
//! id = 1
//! device = "/dev/nvme0n1p1"
//! mode = "wb"              # used when the cache is created
//! line_size = "4k"         # used when the cache is created
//! force_bare_core = false  # serve the bare cores if the cache device is missing (unsafe for lazy modes)
//! io_timeout = "30s"       # optional: an IO the cache device does not finish in time fails
//! [cache.params]
//! seq-cutoff = { policy = "full", threshold = "1m" }
//! cleaning = { policy = "alru" }
//!
//! [[cache.core]]
//! id = 0
//! device = "/dev/sdb"
//! export = "osd0"
//! io_timeout = "10s"       # optional: an IO the core device does not finish in time fails (EIO to the client)
//!
//! [[cache.core]]                  # a Ceph RBD image (docs/CEPH.md)
//! id = 1
//! device = "rbd:rbd/vm1"
//! ceph_conf = "/etc/ceph/ceph.conf" # optional (librados's search otherwise)
//! ceph_id = "tiercache"             # optional (default admin)
//! ```
//!
//! `io_timeout` (10ms to 1h; `ms`, `s` or `m`, a bare number is seconds) puts the device behind
//! `tiercache_io::TimeoutBackend`: an IO that takes longer fails with `TimedOut`, which the cache
//! handles as any device error. Without it an IO waits as long as the device takes.

use crate::registry::{NewCache, Registry, set_param};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The whole file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Listeners.
    #[serde(default)]
    pub daemon: DaemonSection,
    /// Caches.
    #[serde(default)]
    pub cache: Vec<CacheSection>,
}

/// `[daemon]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Admin socket path.
    pub socket: Option<String>,
    /// NBD listeners (`unix:PATH`, `tcp:HOST:PORT`).
    pub nbd_listen: Option<Vec<String>>,
    /// Metrics listener (`HOST:PORT`, or `none`).
    pub metrics_listen: Option<String>,
    /// Group (name or gid) that may use the admin and NBD unix sockets (`--socket-group`).
    pub socket_group: Option<String>,
    /// TLS server certificate chain, PEM (`--tls-cert`; with `tls_key` and `tls_ca`).
    pub tls_cert: Option<std::path::PathBuf>,
    /// TLS server private key, PEM (`--tls-key`).
    pub tls_key: Option<std::path::PathBuf>,
    /// CA (PEM) that NBD clients' certificates must chain to (`--tls-ca`).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Log level: `error`, `warn`, `info` (default) or `debug` (`--log-level`).
    pub log_level: Option<String>,
}

/// `[[cache]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// Cache id.
    pub id: u16,
    /// Cache device string.
    pub device: String,
    /// Mode at creation.
    pub mode: Option<String>,
    /// Line size at creation.
    pub line_size: Option<String>,
    /// Serve bare cores when the cache device is missing.
    #[serde(default)]
    pub force_bare_core: bool,
    /// IO timeout of the cache device (`30s`, `500ms`).
    pub io_timeout: Option<String>,
    /// Parameter groups: group name to (parameter to value).
    #[serde(default)]
    pub params: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// Cores.
    #[serde(default)]
    pub core: Vec<CoreSection>,
}

/// `[[cache.core]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreSection {
    /// Core id.
    pub id: u16,
    /// Core device string.
    pub device: String,
    /// Export name (default `cache<N>-core<M>`).
    pub export: Option<String>,
    /// Ceph config file of an `rbd:` core.
    pub ceph_conf: Option<String>,
    /// cephx client id of an `rbd:` core.
    pub ceph_id: Option<String>,
    /// IO timeout of the core device (`10s`, `500ms`).
    pub io_timeout: Option<String>,
}

impl CoreSection {
    /// The device string with the Ceph options folded in (`rbd:POOL/IMAGE:conf=…:id=…`).
    pub fn device_string(&self) -> Result<String, String> {
        crate::device::with_ceph_options(
            &self.device,
            self.ceph_conf.as_deref(),
            self.ceph_id.as_deref(),
        )
    }
}

impl ConfigFile {
    /// Reads and checks a config file; errors are one line naming the file.
    pub fn load(path: &std::path::Path) -> Result<ConfigFile, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Parses and checks config text.
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        let c: ConfigFile = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let mut ids = std::collections::BTreeSet::new();
        let mut exports = std::collections::BTreeSet::new();
        for k in &c.cache {
            if !ids.insert(k.id) {
                return Err(format!("cache id {} appears twice", k.id));
            }
            if k.id == 0 || k.id > crate::registry::CACHE_ID_MAX {
                return Err(format!("cache id {} is out of range", k.id));
            }
            crate::device::DeviceSpec::parse(&k.device)
                .map_err(|e| format!("cache {}: {e}", k.id))?;
            k.timeouts().map_err(|e| format!("cache {}: {e}", k.id))?;
            let mut cores = std::collections::BTreeSet::new();
            for x in &k.core {
                if !cores.insert(x.id) {
                    return Err(format!("cache {}: core id {} appears twice", k.id, x.id));
                }
                crate::device::DeviceSpec::parse(&x.device_string()?)
                    .map_err(|e| format!("cache {} core {}: {e}", k.id, x.id))?;
                let name = x
                    .export
                    .clone()
                    .unwrap_or_else(|| format!("cache{}-core{}", k.id, x.id));
                if !exports.insert(name.clone()) {
                    return Err(format!("export name '{name}' appears twice"));
                }
            }
        }
        Ok(c)
    }
}

/// A TOML error as one line: where (line and column, counted from 1) and what, without the
/// excerpt and caret the parser draws over several lines.
fn syntax_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(r) => {
            // Bytes, not str slicing: the span may start inside a multi-byte character.
            let before = &text.as_bytes()[..r.start.min(text.len())];
            let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
            let start = before
                .iter()
                .rposition(|&c| c == b'\n')
                .map_or(0, |i| i + 1);
            let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
            format!("line {line}, column {column}: {msg}")
        }
        None => msg,
    }
}

impl CacheSection {
    /// The IO timeouts of the cache device and of the cores.
    pub fn timeouts(&self) -> Result<crate::registry::IoTimeouts, String> {
        let parse = |t: &Option<String>| t.as_deref().map(crate::device::parse_timeout).transpose();
        let mut cores = BTreeMap::new();
        for x in &self.core {
            if let Some(t) = parse(&x.io_timeout).map_err(|e| format!("core {}: {e}", x.id))? {
                cores.insert(x.id, t);
            }
        }
        Ok(crate::registry::IoTimeouts {
            cache: parse(&self.io_timeout)?,
            cores,
        })
    }
}

fn value_str(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Brings every cache of the config up: a cache device holding a cache is loaded (never
/// reformatted), a blank one (zeros at its start) is created, one holding other data is left
/// alone and reported; missing devices leave the cache `detached` or `incomplete`. Problems are
/// logged and shown by `list`; they do not stop the daemon. Returns the problems.
pub fn reassemble(reg: &Registry, cfg: &ConfigFile) -> Vec<String> {
    let mut problems = Vec::new();
    for k in &cfg.cache {
        let spec = match crate::device::DeviceSpec::parse(&k.device) {
            Ok(s) => s,
            Err(e) => {
                problems.push(format!("cache {}: {e}", k.id));
                continue;
            }
        };
        // Checked when the file was parsed. Remembered for a later `start-cache --load` of
        // this device too (a cache detached now may be loaded once its device is back).
        let io = k.timeouts().unwrap_or_default();
        reg.remember_core_timeouts(&k.device, io.cores.clone());
        let cores = || {
            k.core
                .iter()
                .map(|x| {
                    (
                        x.id,
                        x.device_string().unwrap_or_else(|_| x.device.clone()),
                        x.export
                            .clone()
                            .unwrap_or_else(|| format!("cache{}-core{}", k.id, x.id)),
                        k.force_bare_core,
                    )
                })
                .collect::<Vec<_>>()
        };
        if !spec.present() {
            let why = format!("cache device {} is missing", k.device);
            crate::log!(error, "cache detached", cache = k.id, reason = why);
            problems.push(format!("cache {}: {why}", k.id));
            reg.add_detached(k.id, &k.device, why, cores());
            continue;
        }
        // Load what is there; create only on a blank device. A device another cache or core
        // here already is is refused before the probe opens it.
        let what = match reg.claimable(&spec, &k.device, None) {
            Err(e) => Err(e),
            Ok(_) if spec.volatile() => Ok("nothing"),
            Ok(_) => crate::registry::probe(&k.device),
        };
        let started = match what {
            Ok("cache") => reg
                .start_cache_with(
                    NewCache {
                        device: &k.device,
                        id: Some(k.id),
                        mode: None,
                        line_size: None,
                        load: true,
                        force: false,
                        dry_run: false,
                    },
                    &io,
                )
                .map(|_| ()),
            Ok("nothing") => reg
                .start_cache_with(
                    NewCache {
                        device: &k.device,
                        id: Some(k.id),
                        mode: k.mode.as_deref(),
                        line_size: k.line_size.as_deref(),
                        load: false,
                        force: false,
                        dry_run: false,
                    },
                    &io,
                )
                .map(|_| ()),
            Ok(_) => Err(format!(
                "{} holds data that is not a tiercache cache; format it with `tiercache start-cache --force` if that is intended",
                k.device
            )),
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            crate::log!(error, "cache not started", cache = k.id, reason = e);
            problems.push(format!("cache {}: {e}", k.id));
            // Its cores are listed (never served: the cache did not start).
            let cores: Vec<_> = cores()
                .into_iter()
                .map(|(i, d, x, _)| (i, d, x, false))
                .collect();
            reg.add_detached(k.id, &k.device, e, cores.clone());
            for (i, d, x, _) in cores {
                reg.note_unattached(k.id, i, &d, &x, "the cache did not start");
            }
            continue;
        }
        for (x, (_, device, export, _)) in k.core.iter().zip(cores()) {
            let t = io.cores.get(&x.id).copied();
            let r = x
                .device_string()
                .and_then(|d| reg.add_core_with(k.id, &d, Some(x.id), x.export.as_deref(), t));
            if let Err(e) = r {
                crate::log!(
                    error,
                    "core not attached",
                    cache = k.id,
                    core = x.id,
                    reason = e
                );
                reg.note_unattached(k.id, x.id, &device, &export, &e);
                problems.push(format!("cache {} core {}: {e}", k.id, x.id));
            }
        }
        for (group, values) in &k.params {
            let vals: Vec<(String, String)> = values
                .iter()
                .map(|(a, b)| (a.clone(), value_str(b)))
                .collect();
            if let Err(e) = set_param(reg, k.id, None, group, &vals) {
                crate::log!(
                    error,
                    "parameter not set",
                    cache = k.id,
                    group = group,
                    reason = e
                );
                problems.push(format!("cache {} {group}: {e}", k.id));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let c = ConfigFile::parse(
            r#"
[daemon]
nbd_listen = ["unix:/tmp/x.sock"]
[[cache]]
id = 1
device = "ram:64m"
[cache.params]
seq-cutoff = { policy = "never", threshold = "1m" }
[[cache.core]]
id = 0
device = "/tmp/core.img"
export = "vm1"
"#,
        )
        .unwrap();
        assert_eq!(c.cache[0].core[0].export.as_deref(), Some("vm1"));
        assert!(ConfigFile::parse("[[cache]]\nid = 1\n").is_err());
        assert!(ConfigFile::parse("[[cache]]\nid = 1\ndevice = \"ram:1m\"\nbogus = 2\n").is_err());
        assert!(
            ConfigFile::parse(
                "[[cache]]\nid = 1\ndevice = \"ram:1m\"\n[[cache]]\nid = 1\ndevice = \"ram:2m\"\n"
            )
            .unwrap_err()
            .contains("twice")
        );
        assert!(ConfigFile::parse("[[cache]]\nid = 1\ndevice = \"ram:0\"\n").is_err());
        assert!(ConfigFile::parse("not toml [").is_err());
        // IO timeouts, per cache device and per core.
        let c = ConfigFile::parse(
            "[[cache]]\nid = 1\ndevice = \"ram:1m\"\nio_timeout = \"500ms\"\n[[cache.core]]\nid = 3\ndevice = \"/x\"\nio_timeout = \"2s\"\n",
        )
        .unwrap();
        let t = c.cache[0].timeouts().unwrap();
        assert_eq!(t.cache, Some(std::time::Duration::from_millis(500)));
        assert_eq!(t.cores[&3], std::time::Duration::from_secs(2));
        let e = ConfigFile::parse(
            "[[cache]]\nid = 1\ndevice = \"ram:1m\"\n[[cache.core]]\nid = 3\ndevice = \"/x\"\nio_timeout = \"soon\"\n",
        )
        .unwrap_err();
        assert!(e.contains("cache 1: core 3: io timeout 'soon'"), "{e}");
        // Syntax errors: one line with where and what.
        let e =
            ConfigFile::parse("[[cache]]\nid = 1\ndevice = \"ram:1m\"\nbogus = 2\n").unwrap_err();
        assert!(
            e.starts_with(
                "line 4, column 1: unknown field `bogus`, expected one of `id`, `device`"
            ),
            "{e}"
        );
        assert_eq!(
            ConfigFile::parse("[[cache]]\nid = 1\ndevice = \"é\" x\n").unwrap_err(),
            "line 3, column 14: expected newline, `#`"
        );
        assert_eq!(
            ConfigFile::parse("[[cache]]\nid = \"one\"\ndevice = \"ram:1m\"\n").unwrap_err(),
            "line 2, column 6: invalid type: string \"one\", expected u16"
        );
        let ex = ConfigFile::parse(include_str!("../../contrib/tiercache.toml.example")).unwrap();
        assert_eq!(ex.cache[0].core.len(), 2);
        // RBD cores: the Ceph options become part of the device string; refused elsewhere.
        let c = ConfigFile::parse(
            "[[cache]]\nid = 1\ndevice = \"ram:1m\"\n[[cache.core]]\nid = 0\ndevice = \"rbd:rbd/vm1\"\nceph_conf = \"/etc/ceph/x.conf\"\nceph_id = \"tc\"\n",
        )
        .unwrap();
        assert_eq!(
            c.cache[0].core[0].device_string().unwrap(),
            "rbd:rbd/vm1:conf=/etc/ceph/x.conf:id=tc"
        );
        assert!(
            ConfigFile::parse(
                "[[cache]]\nid = 1\ndevice = \"ram:1m\"\n[[cache.core]]\nid = 0\ndevice = \"/x\"\nceph_id = \"tc\"\n",
            )
            .unwrap_err()
            .contains("rbd:POOL/IMAGE devices only")
        );
        assert!(
            ConfigFile::parse(
                "[[cache]]\nid = 1\ndevice = \"ram:1m\"\n[[cache.core]]\nid = 0\ndevice = \"rbd:nopool\"\n",
            )
            .is_err()
        );
    }
}
