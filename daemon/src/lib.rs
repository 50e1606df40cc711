//! # tiercache-daemon: caches, cores and exports, managed through an admin socket
//!
//! `tiercache daemon` runs [`server::run`] in the foreground:
//! - it reassembles every cache of the config file ([`config::reassemble`]): loading the caches
//!   that exist (never reformatting one), creating those whose device is blank, and leaving
//!   the rest `detached` or `incomplete` with the reason shown by `list`;
//! - it serves each core as an NBD export (`tiercache-nbd`) on unix sockets and TCP;
//! - it answers the CLI's verbs on the admin socket ([`admin`], one JSON line per request;
//!   the socket is 0600 and the peer's uid is checked);
//! - it serves `/metrics` in Prometheus text format ([`stats::metrics`]);
//! - it watches every cache's health and logs one line when a device problem starts and one
//!   when it ends ([`health::Watch`]);
//! - under systemd (`Type=notify`) it sends `READY=1` once all that is done, `STATUS=`,
//!   `WATCHDOG=1` and `STOPPING=1` ([`notify`]); `--check-config` checks a config without
//!   starting ([`server::check_config`]);
//! - on SIGTERM/SIGINT or `shutdown`, it stops every cache cleanly (dirty data stays persisted
//!   on the cache device) and removes its sockets.
//!
//! The state of caches and cores is in [`registry`]; logs are one `key=value` line per event
//! on stderr ([`log!`]).

pub mod admin;
pub mod config;
pub mod device;
pub mod devlock;
pub mod health;
pub mod identity;
mod nbd_glue;
pub mod notify;
pub mod registry;
pub mod server;
pub mod stats;

/// The git commit this daemon was built from (short hash, or `unknown`): `build.rs`.
pub const BUILD_COMMIT: &str = env!("TIERCACHE_COMMIT");

/// Logs one structured line to stderr: `ts=… level=… msg="…" key=value …`.
#[macro_export]
macro_rules! log {
    ($level:ident, $msg:expr $(, $k:ident = $v:expr)* $(,)?) => {{
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        #[allow(unused_mut)]
        let mut line = format!(
            "ts={}.{:03} level={} msg={:?}",
            t.as_secs(),
            t.subsec_millis(),
            stringify!($level),
            $msg
        );
        $(
            line.push_str(&format!(" {}={}", stringify!($k), $crate::quote(&format!("{}", $v))));
        )*
        eprintln!("{line}");
    }};
}

/// Quotes a log value when it holds spaces, quotes or `=`.
pub fn quote(s: &str) -> String {
    if s.is_empty() || s.contains([' ', '"', '=', '\n']) {
        format!("{s:?}")
    } else {
        s.to_string()
    }
}
