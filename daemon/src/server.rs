//! The daemon's main loop: listeners, the admin socket, signals and clean shutdown.

use crate::admin::{
    Access, Progress, REQUEST_MAX, Request, default_socket, peer_cred, resolve_group, runtime_dir,
};
use crate::config::{ConfigFile, reassemble};
use crate::registry::{IoTimeouts, NewCache, Registry, get_param, set_param};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

/// Daemon options (command line over config file over defaults).
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// Config file.
    pub config: Option<PathBuf>,
    /// Admin socket.
    pub socket: Option<PathBuf>,
    /// NBD listeners (`unix:PATH`, `tcp:HOST:PORT`).
    pub nbd_listen: Vec<String>,
    /// Metrics listener (`HOST:PORT` or `none`).
    pub metrics_listen: Option<String>,
    /// Group (name or gid) that may use the admin and NBD unix sockets: they are created
    /// 0660 with this group instead of 0600, and its members pass the admin peer check.
    pub socket_group: Option<String>,
    /// TLS: the server's certificate chain (PEM). With `tls_key` and `tls_ca`, every NBD
    /// listener requires `NBD_OPT_STARTTLS` and a client certificate signed by `tls_ca`.
    pub tls_cert: Option<PathBuf>,
    /// TLS: the server's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// TLS: the CA (PEM) that client certificates must chain to.
    pub tls_ca: Option<PathBuf>,
    /// NBD connections on worker threads only (no io_uring reactor).
    pub nbd_threaded: bool,
    /// Log level: `error`, `warn`, `info` (default) or `debug`.
    pub log_level: Option<String>,
}

/// What the daemon's sockets require, checked before anything else starts.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// The group of `--socket-group`.
    pub socket_group: Option<u32>,
    /// TLS for every NBD listener.
    pub tls: Option<tiercache_nbd::TlsConfig>,
}

/// Checks the security options against the NBD listeners: the socket group exists; the TLS
/// files are given together and load; a TCP listener on a non-loopback address has TLS
/// (SPEC R7). Errors are one line; nothing is bound or opened.
pub fn security(opts: &Options, nbd_listen: &[String]) -> Result<Security, String> {
    let socket_group = opts
        .socket_group
        .as_deref()
        .map(resolve_group)
        .transpose()?;
    let tls = match (&opts.tls_cert, &opts.tls_key, &opts.tls_ca) {
        (None, None, None) => None,
        (Some(c), Some(k), Some(ca)) => {
            let t = tiercache_nbd::TlsConfig::from_files(c, k, ca)?;
            if let Ok(m) = std::fs::metadata(k)
                && m.permissions().mode() & 0o077 != 0
            {
                crate::log!(
                    warn,
                    "TLS key file is readable by others than its owner; chmod 600 it",
                    file = k.display(),
                    mode = format!("{:o}", m.permissions().mode() & 0o777)
                );
            }
            Some(t)
        }
        (c, k, ca) => {
            let missing: Vec<&str> = [(c, "--tls-cert"), (k, "--tls-key"), (ca, "--tls-ca")]
                .iter()
                .filter(|(v, _)| v.is_none())
                .map(|(_, n)| *n)
                .collect();
            return Err(format!(
                "--tls-cert, --tls-key and --tls-ca go together; missing {}",
                missing.join(" and ")
            ));
        }
    };
    for l in nbd_listen {
        let a = tiercache_nbd::ListenAddr::parse(l)?;
        if tls.is_none()
            && let Some(ip) = a.non_loopback()?
        {
            let spec = l.strip_prefix("tcp:").unwrap_or(l);
            return Err(tiercache_nbd::non_loopback_refusal(&ip, spec));
        }
    }
    Ok(Security { socket_group, tls })
}

/// Default metrics address.
pub const METRICS_DEFAULT: &str = "127.0.0.1:9745";

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it, and
    // pthread_sigmask only changes this thread's mask (inherited by threads spawned after).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// A client (NBD or admin) that goes away while the daemon writes to it must cost only its own
/// connection. With SIGPIPE at its default action (the `tiercache` binary restores it for the
/// command-line verbs) the first write to such a socket killed the whole daemon, its caches not
/// stopped; ignored, the write fails with EPIPE and only that connection ends.
fn ignore_sigpipe() {
    // SAFETY: sets a signal's disposition to SIG_IGN; no handler is installed.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

fn wait_signal(set: libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` was initialised by block_signals and `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    sig
}

/// Binds a unix socket readable and writable by its owner only (SPEC R7), or by its owner
/// and `group` (0660), refusing to take over one that a live process still listens on. The
/// socket is created 0600 (umask) and only then given to the group. A directory it creates
/// is 0700 (0750 with the group, so members can reach the socket).
pub fn bind_private(path: &Path, group: Option<u32>) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = if group.is_some() { 0o750 } else { 0o700 };
        if group.is_some() {
            let _ = std::os::unix::fs::chown(dir, None, group);
        }
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "{}: another daemon is listening there; stop it or pass --socket",
                path.display()
            ));
        }
        std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    // SAFETY: umask only changes the process's file creation mask; restored right after.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = l.map_err(|e| format!("{}: {e}", path.display()))?;
    let r = match group {
        Some(g) => std::os::unix::fs::chown(path, None, Some(g))
            .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))),
        None => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)),
    };
    if let Err(e) = r {
        let _ = std::fs::remove_file(path);
        return Err(format!("{}: {e}", path.display()));
    }
    Ok(l)
}

/// The options in force: each from the command line if given there, else from the config
/// file's `[daemon]` section (the TLS files as a set: all from one place).
fn merged(opts: &Options, cfg: &ConfigFile) -> Options {
    let d = &cfg.daemon;
    let tls_cli = opts.tls_cert.is_some() || opts.tls_key.is_some() || opts.tls_ca.is_some();
    let pick = |cli: &Option<PathBuf>, file: &Option<PathBuf>| {
        if tls_cli { cli.clone() } else { file.clone() }
    };
    Options {
        config: opts.config.clone(),
        socket: opts
            .socket
            .clone()
            .or_else(|| d.socket.as_ref().map(PathBuf::from)),
        // The command line's; the config's (an empty list: none) in `listeners`.
        nbd_listen: opts.nbd_listen.clone(),
        metrics_listen: opts
            .metrics_listen
            .clone()
            .or_else(|| d.metrics_listen.clone()),
        socket_group: opts.socket_group.clone().or_else(|| d.socket_group.clone()),
        tls_cert: pick(&opts.tls_cert, &d.tls_cert),
        tls_key: pick(&opts.tls_key, &d.tls_key),
        tls_ca: pick(&opts.tls_ca, &d.tls_ca),
        nbd_threaded: opts.nbd_threaded,
        log_level: opts.log_level.clone().or_else(|| d.log_level.clone()),
    }
}

/// The log level of merged options (`info` when none is given).
fn log_level(o: &Options) -> Result<tiercache_io::log::Level, String> {
    o.log_level.as_deref().map_or(
        Ok(tiercache_io::log::Level::Info),
        tiercache_io::log::Level::parse,
    )
}

/// The admin socket, NBD listeners and metrics address of merged options, defaults filled in.
fn listeners(o: &Options, cfg: &ConfigFile) -> (PathBuf, Vec<String>, String) {
    let socket = o.socket.clone().unwrap_or_else(default_socket);
    let nbd = if !o.nbd_listen.is_empty() {
        o.nbd_listen.clone()
    } else if let Some(l) = &cfg.daemon.nbd_listen {
        l.clone()
    } else {
        vec![format!("unix:{}", runtime_dir().join("nbd.sock").display())]
    };
    let metrics = o
        .metrics_listen
        .clone()
        .unwrap_or_else(|| METRICS_DEFAULT.to_string());
    (socket, nbd, metrics)
}

/// `tiercache daemon --check-config FILE`: checks the file and the options it gives with the
/// command line's (syntax, ids, device strings, modes, line sizes, timeouts, listeners, the
/// socket group, the TLS files and the non-loopback rule) without opening a device or binding
/// anything. One line: what would run, or the first problem.
pub fn check_config(path: &Path, opts: &Options) -> Result<String, String> {
    let cfg = ConfigFile::load(path)?;
    let o = merged(opts, &cfg);
    let (socket, nbd, metrics) = listeners(&o, &cfg);
    let at = |e: String| format!("config {}: {e}", path.display());
    let level = log_level(&o).map_err(at)?;
    let sec = security(&o, &nbd).map_err(at)?;
    if metrics != "none" {
        std::net::ToSocketAddrs::to_socket_addrs(&metrics).map_err(|e| {
            format!(
                "config {}: metrics_listen '{metrics}': {e} (want HOST:PORT or none)",
                path.display()
            )
        })?;
    }
    let mut cores = 0;
    for k in &cfg.cache {
        let bad = |what: String| format!("config {}: cache {}: {what}", path.display(), k.id);
        if let Some(m) = &k.mode
            && !m.trim().eq_ignore_ascii_case("wl")
            && tiercache_core::mode::CacheMode::parse(m).is_none()
        {
            return Err(bad(format!(
                "unknown mode '{m}' (want wt, wb, wa, wi, pt, wo or wl)"
            )));
        }
        let spec = crate::device::DeviceSpec::parse(&k.device).map_err(&bad)?;
        if matches!(
            spec,
            crate::device::DeviceSpec::Nbd(_) | crate::device::DeviceSpec::Rbd(_)
        ) {
            return Err(bad(format!(
                "{}: nbd: and rbd: devices can be cores, not cache devices",
                k.device
            )));
        }
        let mode = k
            .mode
            .as_deref()
            .unwrap_or("wt")
            .trim()
            .to_ascii_lowercase();
        if spec.volatile() && ["wb", "wo", "wl"].contains(&mode.as_str()) {
            return Err(bad(format!(
                "{}: mode {mode} holds dirty data, which a ram: device loses at a crash",
                k.device
            )));
        }
        if let Some(l) = &k.line_size
            && tiercache_core::units::LineSize::parse(l).is_none()
        {
            return Err(bad(format!(
                "unknown line size '{l}' (want 4k, 8k, 16k, 32k or 64k)"
            )));
        }
        cores += k.core.len();
    }
    Ok(format!(
        "config {}: ok: {} caches, {cores} cores; admin socket {}, NBD {}, metrics {metrics}, TLS {}, socket group {}, log level {}",
        path.display(),
        cfg.cache.len(),
        socket.display(),
        nbd.join(","),
        if sec.tls.is_some() { "on" } else { "off" },
        o.socket_group.as_deref().unwrap_or("none"),
        level.name(),
    ))
}

/// Runs the daemon in the foreground until SIGTERM, SIGINT or `shutdown`.
pub fn run(opts: Options) -> Result<(), String> {
    let sigs = block_signals();
    ignore_sigpipe();
    let cfg = match &opts.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let opts = merged(&opts, &cfg);
    tiercache_io::log::set_level(log_level(&opts)?);
    let (socket, nbd_listen, mut metrics) = listeners(&opts, &cfg);
    let sec = security(&opts, &nbd_listen)?;
    let admin = bind_private(&socket, sec.socket_group)?;
    let access = Access::new(sec.socket_group);
    let reg = Arc::new(Registry::new());
    let mut problems = reassemble(&reg, &cfg);
    let nbd = match crate::nbd_glue::start(reg.clone(), &nbd_listen, &sec, opts.nbd_threaded) {
        Ok(n) => n,
        Err(e) => {
            reg.stop_all();
            let _ = std::fs::remove_file(&socket);
            return Err(e);
        }
    };
    if metrics != "none" {
        match std::net::TcpListener::bind(&metrics) {
            Ok(l) => {
                let r = reg.clone();
                std::thread::spawn(move || serve_metrics(l, r));
            }
            Err(e) => {
                // Counted as a problem, and the ready line says the metrics are not served:
                // a scraper must not be thought to read this daemon's metrics.
                crate::log!(error, "metrics not served", address = metrics, error = e);
                problems.push(format!("metrics listener {metrics}: {e}"));
                metrics = format!("none (bind of {metrics} failed)");
            }
        }
    }
    {
        // One log line when a device problem starts and one when it ends.
        let reg = reg.clone();
        std::thread::spawn(move || {
            loop {
                reg.poll_health();
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        });
    }
    let (tx, rx) = mpsc::channel::<&'static str>();
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let s = wait_signal(sigs);
            let _ = tx.send(if s == libc::SIGINT {
                "SIGINT"
            } else {
                "SIGTERM"
            });
        });
    }
    {
        let reg = reg.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for s in admin.incoming().flatten() {
                let reg = reg.clone();
                let tx = tx.clone();
                std::thread::spawn(move || serve_admin(s, &reg, &tx, access));
            }
        });
    }
    crate::log!(
        info,
        "daemon ready",
        socket = socket.display(),
        nbd = nbd_listen.join(","),
        metrics = metrics,
        tls = sec.tls.is_some(),
        socket_group = sec
            .socket_group
            .map(crate::admin::group_name)
            .unwrap_or_else(|| "none".into()),
        problems = problems.len()
    );
    // Every cache of the config is reassembled and every listener bound: the service manager
    // may start what is ordered after us (an OSD or a VM on one of the exports).
    let at_start = match problems.len() {
        0 => String::new(),
        n => format!("; {n} problems at start (see the log)"),
    };
    crate::notify::tell(&format!("READY=1\nSTATUS={}{at_start}", status(&reg)));
    if let Some(every) = crate::notify::watchdog_interval() {
        let reg = reg.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(every);
                // Taking the registry's lock (as every admin request does) is the check: a
                // daemon stuck behind it stops pinging and is restarted by systemd.
                let st = status(&reg);
                crate::notify::tell(&format!("WATCHDOG=1\nSTATUS={st}"));
            }
        });
    }
    let why = rx.recv().unwrap_or("channel closed");
    crate::notify::tell(&format!("STOPPING=1\nSTATUS=stopping ({why})"));
    crate::log!(info, "daemon stopping", reason = why);
    nbd.shutdown();
    reg.stop_all();
    let _ = std::fs::remove_file(&socket);
    crate::log!(info, "daemon stopped");
    Ok(())
}

/// The caches' states in a line (`STATUS=` for the service manager): `2 caches: 1 running, 1
/// degraded`.
fn status(reg: &Registry) -> String {
    let ids = reg.ids();
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for id in &ids {
        *by.entry(reg.state(*id).unwrap_or("detached")).or_default() += 1;
    }
    let parts: Vec<String> = by.iter().map(|(s, n)| format!("{n} {s}")).collect();
    match ids.len() {
        0 => "no caches".into(),
        n => format!("{n} caches: {}", parts.join(", ")),
    }
}

/// Scrapes answered at once; past that a connection gets `503` at once (a scraper that opens
/// connections without end cannot make the daemon spawn threads without end).
pub const METRICS_THREADS: usize = 4;

fn serve_metrics(l: std::net::TcpListener, reg: Arc<Registry>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let active = Arc::new(AtomicUsize::new(0));
    for mut s in l.incoming().flatten() {
        if active.load(Ordering::Acquire) >= METRICS_THREADS {
            // The request is read first (briefly): closing on unread data would reset the
            // connection, and the client would not see the answer.
            let t = Some(std::time::Duration::from_millis(50));
            let _ = s.set_read_timeout(t);
            let _ = s.set_write_timeout(t);
            let _ = s.read(&mut [0u8; 1024]);
            let _ = s.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n",
            );
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let reg = reg.clone();
        let active = active.clone();
        std::thread::spawn(move || {
            /// Gives the slot back however the thread ends.
            struct Slot(Arc<AtomicUsize>);
            impl Drop for Slot {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let _slot = Slot(active);
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            // The request's head (bounded; a scraper's fits), read until its blank line so
            // that closing does not reset a connection whose request came in pieces.
            let mut buf = [0u8; 4096];
            let mut n = 0;
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf[n..]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k,
                }
            }
            let req = String::from_utf8_lossy(&buf[..n]);
            let first = req.lines().next().unwrap_or("");
            let (method, path) = request_line(first);
            let (code, body) = match path {
                "/metrics" if method == "GET" || method == "HEAD" => {
                    ("200 OK", crate::stats::metrics(&reg))
                }
                "/" if method == "GET" || method == "HEAD" => {
                    ("200 OK", "tiercache: metrics at /metrics\n".to_string())
                }
                "/metrics" | "/" => ("405 Method Not Allowed", "GET or HEAD\n".to_string()),
                _ => ("404 Not Found", "see /metrics\n".to_string()),
            };
            // HEAD: the headers GET would send (the same length), no body.
            let _ = write!(
                s,
                "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if method != "HEAD" {
                let _ = s.write_all(body.as_bytes());
            }
        });
    }
}

/// The method and path of an HTTP request line (`GET /metrics HTTP/1.1`); a query string is
/// dropped.
fn request_line(line: &str) -> (&str, &str) {
    let mut w = line.split_ascii_whitespace();
    let method = w.next().unwrap_or("");
    let target = w.next().unwrap_or("");
    (method, target.split('?').next().unwrap_or(""))
}

fn serve_admin(s: UnixStream, reg: &Registry, tx: &mpsc::Sender<&'static str>, access: Access) {
    let mut out = match s.try_clone() {
        Ok(o) => o,
        Err(_) => return,
    };
    let mut send = |v: Value| {
        let mut l = v.to_string();
        l.push('\n');
        out.write_all(l.as_bytes()).is_ok()
    };
    let peer = peer_cred(&s);
    match &peer {
        Some(p) if access.allows(p) => {}
        p => {
            crate::log!(
                warn,
                "admin connection refused",
                uid = p.as_ref().map(|p| p.uid.to_string()).unwrap_or("?".into()),
                gid = p.as_ref().map(|p| p.gid.to_string()).unwrap_or("?".into()),
                pid = p.as_ref().map(|p| p.pid.to_string()).unwrap_or("?".into())
            );
            // The request is read (bounded, within 5 s) and dropped first, so the client has
            // finished writing and reads the refusal instead of a broken pipe.
            let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let mut r = BufReader::new((&s).take(REQUEST_MAX as u64 + 1));
            let _ = r.read_line(&mut String::new());
            send(json!({"ok": false, "error": access.refusal(p.as_ref())}));
            return;
        }
    }
    let mut r = BufReader::new(s.take(REQUEST_MAX as u64 + 1));
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(n) if n > REQUEST_MAX => {
            send(json!({"ok": false, "error": "request too long"}));
            return;
        }
        Ok(0) | Err(_) => return,
        Ok(_) => {}
    }
    let req: Request = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => {
            send(json!({"ok": false, "error": format!("bad request: {e}")}));
            return;
        }
    };
    let mut progress = |what: &str, done: u64, total: u64, unit: &str| {
        send(json!({"progress": Progress {
            what: what.to_string(), done, total, unit: unit.into() }}))
    };
    crate::log!(
        debug,
        "admin request",
        uid = peer.as_ref().map_or(0, |p| p.uid),
        verb = serde_json::to_value(&req)
            .ok()
            .and_then(|v| v["verb"].as_str().map(String::from))
            .unwrap_or_default(),
        bytes = line.len()
    );
    let shutdown = matches!(req, Request::Shutdown);
    let res = handle(reg, req, &mut progress);
    let v = match res {
        Ok(v) => json!({"ok": true, "result": v}),
        Err(e) => json!({"ok": false, "error": e}),
    };
    send(v);
    if shutdown {
        let _ = tx.send("shutdown request");
    }
}

/// Carries out one request.
pub fn handle(
    reg: &Registry,
    req: Request,
    progress: &mut dyn FnMut(&str, u64, u64, &str) -> bool,
) -> Result<Value, String> {
    match req {
        Request::StartCache {
            cache_device,
            cache_id,
            mode,
            line_size,
            load,
            force,
            io_timeout,
            dry_run,
        } => reg.start_cache_with(
            NewCache {
                device: &cache_device,
                id: cache_id,
                mode: mode.as_deref(),
                line_size: line_size.as_deref(),
                load,
                force,
                dry_run,
            },
            &IoTimeouts {
                cache: io_timeout
                    .as_deref()
                    .map(crate::device::parse_timeout)
                    .transpose()?,
                cores: Default::default(),
            },
        ),
        Request::AddCore {
            cache_id,
            core_device,
            core_id,
            export,
            io_timeout,
        } => reg.add_core_with(
            cache_id,
            &core_device,
            core_id,
            export.as_deref(),
            io_timeout
                .as_deref()
                .map(crate::device::parse_timeout)
                .transpose()?,
        ),
        Request::RemoveCore {
            cache_id,
            core_id,
            no_writeback,
        } => reg.remove_core(cache_id, core_id, no_writeback, |d, t, u| {
            progress("writeback", d, t, u);
        }),
        Request::StopCache {
            cache_id,
            no_writeback,
        } => reg.stop_cache(cache_id, no_writeback, |d, t, u| {
            progress("writeback", d, t, u);
        }),
        Request::List => Ok(reg.list()),
        Request::Stats {
            cache_id,
            core_id,
            io_class,
        } => match cache_id {
            Some(id) => crate::stats::cache_stats(reg, id, core_id, io_class),
            None if core_id.is_some() || io_class.is_some() => {
                Err("--core-id and --io-class need --cache-id".into())
            }
            None => Ok(crate::stats::all_stats(reg)),
        },
        Request::SetParam {
            cache_id,
            core_id,
            name,
            values,
        } => set_param(reg, cache_id, core_id, &name, &values),
        Request::GetParam {
            cache_id,
            core_id,
            name,
        } => get_param(reg, cache_id, core_id, &name),
        Request::SetMode { cache_id, mode } => reg.set_mode(cache_id, &mode),
        Request::IoClassLoad { cache_id, csv } => reg.io_class_load(cache_id, &csv),
        Request::IoClassList { cache_id } => reg.io_class_list(cache_id),
        // A client that went away (Ctrl-C, killed) cancels its writeback.
        Request::Writeback { cache_id, core_id } => reg.writeback(cache_id, core_id, |d, t, u| {
            if !progress("writeback", d, t, u) {
                let _ = reg.cancel_writeback(cache_id);
            }
        }),
        Request::CancelWriteback { cache_id } => reg.cancel_writeback(cache_id),
        Request::Invalidate { cache_id, core_id } => reg.invalidate(cache_id, core_id),
        Request::ResetCounters { cache_id } => reg.reset_counters(cache_id),
        Request::Shutdown => Ok(json!({"stopping": true, "pid": std::process::id()})),
    }
}
