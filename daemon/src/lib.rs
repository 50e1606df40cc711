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
//! on stderr ([`log!`], through `tiercache_io::log`: levels, RFC 3339 timestamps, journald
//! priorities).

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

/// Logs one event through the one formatter (`tiercache_io::log`): `ts=… level=… msg="…"
/// key=value …` on stderr, if the level is enabled; values are formatted with `Display`.
#[macro_export]
macro_rules! log {
    ($level:ident, $msg:expr $(, $k:ident = $v:expr)* $(,)?) => {{
        let level = $crate::log_level!($level);
        if $crate::__log::enabled(level) {
            $crate::__log::emit(level, &$msg, &[$((stringify!($k), format!("{}", $v).as_str())),*]);
        }
    }};
}

#[doc(hidden)]
pub use tiercache_io::log as __log;

/// The [`tiercache_io::log::Level`] of a level word (`error`, `warn`, `info`, `debug`).
#[macro_export]
macro_rules! log_level {
    (error) => {
        $crate::__log::Level::Error
    };
    (warn) => {
        $crate::__log::Level::Warn
    };
    (info) => {
        $crate::__log::Level::Info
    };
    (debug) => {
        $crate::__log::Level::Debug
    };
}
