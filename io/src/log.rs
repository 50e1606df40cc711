//! The one log formatter of tiercache's daemon and the crates it runs (the NBD server logs
//! through it too): one logfmt line per event on stderr,
//! `ts=2026-11-27T19:39:42.123Z level=info msg="daemon ready" key=value …`.
//!
//! - **Levels**: `error`, `warn`, `info`, `debug`; lines below the level set with
//!   [`set_level`] (`--log-level`, `log_level` in the config, `TIERCACHE_LOG`; default `info`)
//!   are not formatted at all.
//! - **Timestamps**: RFC 3339 in UTC with milliseconds.
//! - **Values**: written as they are when they are plain words; quoted, with `\"`, `\\`, `\n`,
//!   `\r`, `\t` and other control characters as `\u{…}` escaped, when they hold spaces,
//!   quotes, `=`, backslashes or control characters, or are empty.
//! - **journald**: when stderr is the journal (`$JOURNAL_STREAM` names stderr's device and
//!   inode, as systemd sets it for a service), each line starts with its syslog priority
//!   (`<3>` error, `<4>` warn, `<6>` info, `<7>` debug), so `journalctl -p err` finds errors.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A log level; the value is its syslog priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    /// Something failed: a request, a device, a listener.
    Error = 3,
    /// Something is wrong but handled (a device problem, a refused connection).
    Warn = 4,
    /// What the daemon does: start, stop, caches, cores, connections.
    Info = 6,
    /// Details for finding a problem: each admin request, ...
    Debug = 7,
}

impl Level {
    /// The level's name as written in the log (`warn`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// A level from its name (any case; `warning` and `err` too).
    pub fn parse(s: &str) -> Result<Level, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "error" | "err" => Ok(Level::Error),
            "warn" | "warning" => Ok(Level::Warn),
            "info" => Ok(Level::Info),
            "debug" => Ok(Level::Debug),
            _ => Err(format!(
                "unknown log level '{s}' (want error, warn, info or debug)"
            )),
        }
    }
}

static MAX: AtomicU8 = AtomicU8::new(Level::Info as u8);

/// Logs lines of `level` and more severe from now on.
pub fn set_level(level: Level) {
    MAX.store(level as u8, Ordering::Relaxed);
}

/// Whether a line of `level` is written.
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX.load(Ordering::Relaxed)
}

/// Whether stderr is the journal: `$JOURNAL_STREAM` (`DEVICE:INODE`) is stderr's.
fn journal() -> bool {
    static J: OnceLock<bool> = OnceLock::new();
    *J.get_or_init(|| {
        let Ok(v) = std::env::var("JOURNAL_STREAM") else {
            return false;
        };
        let Some((dev, ino)) = v.split_once(':') else {
            return false;
        };
        // SAFETY: `stat` is plain data; all zeros is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat on fd 2 fills the buffer it is given; no other memory is involved.
        if unsafe { libc::fstat(2, &mut st) } != 0 {
            return false;
        }
        dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino)
    })
}

/// The UTC calendar date and time of day of `t`: (year, month, day, hour, minute, second).
pub fn civil(t: SystemTime) -> (i64, i64, i64, i64, i64, i64) {
    let s = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, day, rem / 3600, rem / 60 % 60, rem % 60)
}

/// `t` in RFC 3339, UTC, milliseconds: `2026-11-27T19:39:42.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, m, d, h, min, s) = civil(t);
    let ms = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_millis();
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{ms:03}Z")
}

/// A logfmt value: as it is when plain, else quoted with escapes.
pub fn quote(v: &str) -> String {
    let plain = !v.is_empty()
        && !v
            .chars()
            .any(|c| c == ' ' || c == '"' || c == '=' || c == '\\' || c.is_control());
    if plain {
        return v.to_string();
    }
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(s, "\\u{{{:x}}}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// The line for an event (without the journal prefix).
pub fn line(level: Level, msg: &str, kv: &[(&str, &str)]) -> String {
    let mut l = format!(
        "ts={} level={} msg={}",
        rfc3339(SystemTime::now()),
        level.name(),
        quote(msg)
    );
    for (k, v) in kv {
        let _ = write!(l, " {k}={}", quote(v));
    }
    l
}

/// Where lines go instead of stderr (see [`to_file`]).
static FILE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Sends every later line to `f` instead of stderr (`None`: back to stderr). For a program
/// that runs the daemon's parts in-process and prints results of its own (`tiercache bench`).
pub fn to_file(f: Option<std::fs::File>) {
    *FILE.lock().unwrap_or_else(|e| e.into_inner()) = f;
}

/// Writes an event's line to stderr (or [`to_file`]'s file), if its level is enabled.
pub fn emit(level: Level, msg: &str, kv: &[(&str, &str)]) {
    if !enabled(level) {
        return;
    }
    let l = line(level, msg, kv);
    if let Some(f) = FILE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        use std::io::Write as _;
        let _ = writeln!(f, "{l}");
        return;
    }
    if journal() {
        eprintln!("<{}>{l}", level as u8);
    } else {
        eprintln!("{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_538_835_961);
        assert_eq!(rfc3339(t), "2026-11-24T16:47:15.961Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn values_are_plain_or_quoted_with_escapes() {
        assert_eq!(quote("vm1"), "vm1");
        assert_eq!(quote("/run/x.sock"), "/run/x.sock");
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote("a b"), "\"a b\"");
        assert_eq!(quote("vol\"x\\y"), "\"vol\\\"x\\\\y\"");
        assert_eq!(quote("a=b"), "\"a=b\"");
        assert_eq!(quote("l1\nl2\t\u{1b}"), "\"l1\\nl2\\t\\u{1b}\"");
        let l = line(
            Level::Warn,
            "cache degraded",
            &[("export", "a b"), ("core", "0")],
        );
        let (ts, rest) = l.split_once(' ').unwrap();
        assert!(ts.starts_with("ts=") && ts.ends_with('Z'), "{l}");
        assert_eq!(
            rest,
            "level=warn msg=\"cache degraded\" export=\"a b\" core=0"
        );
    }

    #[test]
    fn levels_parse_and_filter() {
        assert_eq!(Level::parse("DEBUG"), Ok(Level::Debug));
        assert_eq!(Level::parse("warning"), Ok(Level::Warn));
        assert!(
            Level::parse("loud")
                .unwrap_err()
                .contains("error, warn, info or debug")
        );
        assert!(enabled(Level::Info) && !enabled(Level::Debug));
        set_level(Level::Error);
        assert!(enabled(Level::Error) && !enabled(Level::Warn));
        set_level(Level::Debug);
        assert!(enabled(Level::Debug));
        set_level(Level::Info);
    }
}
