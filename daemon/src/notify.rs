//! systemd's service notification protocol (`sd_notify(3)`), without libsystemd: one datagram
//! of `KEY=VALUE` lines to the unix socket named by `$NOTIFY_SOCKET` (a path, or an abstract
//! socket name when it starts with `@`). Without `$NOTIFY_SOCKET` (not run by systemd with
//! `Type=notify`) every call does nothing.
//!
//! The daemon sends `READY=1` once every cache of its config is reassembled and every listener
//! is bound, `STATUS=` with the caches' states, `WATCHDOG=1` every half `$WATCHDOG_USEC` from a
//! thread that first checks the daemon answers (it takes the registry's lock), and
//! `STOPPING=1` when it begins to stop.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The address a `$NOTIFY_SOCKET` value names: a path, or an abstract name after `@`.
fn address(s: &str) -> Result<SocketAddr, String> {
    match s.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())
        }
        None => SocketAddr::from_pathname(s),
    }
    .map_err(|e| format!("NOTIFY_SOCKET={s}: {e}"))
}

/// Sends `state` to the socket `socket` names (a `$NOTIFY_SOCKET` value).
fn send(socket: &str, state: &str) -> Result<(), String> {
    let addr = address(socket)?;
    let sock = UnixDatagram::unbound().map_err(|e| format!("notify socket: {e}"))?;
    sock.send_to_addr(state.as_bytes(), &addr)
        .map_err(|e| format!("notify {socket}: {e}"))?;
    Ok(())
}

/// Sends `state` (newline-separated `KEY=VALUE` lines) to the service manager. `Ok(false)`
/// when there is none to tell (`$NOTIFY_SOCKET` unset or empty).
pub fn notify(state: &str) -> Result<bool, String> {
    match std::env::var("NOTIFY_SOCKET") {
        Ok(s) if !s.is_empty() => send(&s, state).map(|_| true),
        _ => Ok(false),
    }
}

/// Sends `state`, logging (not failing on) an error: the daemon runs on without its manager.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        crate::log!(warn, "service manager not notified", error = e);
    }
}

/// The watchdog interval of `$WATCHDOG_USEC` and `$WATCHDOG_PID` values for process `me`: half
/// the timeout, unless the pid is another process's.
fn interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok()?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, if it is set (and
/// `$WATCHDOG_PID`, if set, is this process).
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    interval(usec.as_deref(), pid.as_deref(), std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_path_and_abstract_sockets() {
        let dir = std::env::temp_dir().join(format!("tc-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("n.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        let name = format!("tc-notify-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&address(&format!("@{name}")).unwrap()).unwrap();
        let mut buf = [0u8; 256];
        send(path.to_str().unwrap(), "READY=1\nSTATUS=x").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let nobody = dir.join("nobody");
        let e = send(nobody.to_str().unwrap(), "READY=1").unwrap_err();
        assert!(e.contains("nobody") && !e.contains('\n'), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_watchdog_interval_is_half_the_timeout_of_this_process() {
        let s = Some(Duration::from_secs(1));
        assert_eq!(interval(Some("2000000"), None, 7), s);
        assert_eq!(interval(Some("2000000"), Some("7"), 7), s);
        assert_eq!(interval(Some("2000000"), Some("8"), 7), None);
        assert_eq!(interval(Some("soon"), None, 7), None);
        assert_eq!(interval(Some("0"), None, 7), None);
        assert_eq!(interval(None, Some("7"), 7), None);
    }
}
