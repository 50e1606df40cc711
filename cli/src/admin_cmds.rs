//! The management verbs (SPEC "CLI"): each sends one request to the daemon's admin socket and
//! prints the answer as text, or as JSON with `--json`. Long verbs show a progress bar on
//! stderr while they run.

use crate::choices::{LineSize, LogLevel, Mode, word};
use crate::params::{Get, ParamGroup, Set};
use clap::Args;
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use tiercache_daemon::admin::{Progress, Request, call, default_socket};

/// Where the daemon is, and how to print.
#[derive(Args, Clone)]
pub struct Conn {
    /// Admin socket (default $TIERCACHE_SOCKET, else $XDG_RUNTIME_DIR/tiercache/admin.sock or
    /// /run/tiercache/admin.sock).
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `tiercache daemon`.
#[derive(Args)]
pub struct DaemonArgs {
    /// Config file to reassemble caches, cores and exports from.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Admin socket path.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// NBD listener: unix:PATH or tcp:HOST:PORT (repeatable).
    #[arg(long = "nbd-listen")]
    pub nbd_listen: Vec<String>,
    /// Prometheus metrics listener HOST:PORT, or "none" (the last one given counts).
    #[arg(long = "metrics-listen", overrides_with = "metrics_listen")]
    pub metrics_listen: Option<String>,
    /// Group (name or gid) allowed to use the admin and NBD unix sockets: they are created
    /// 0660 with this group (0600 without), and its members pass the admin socket's check.
    #[arg(long = "socket-group", value_name = "NAME")]
    pub socket_group: Option<String>,
    /// TLS server certificate (PEM). With --tls-key and --tls-ca, every NBD listener requires
    /// STARTTLS and a client certificate; needed for TCP on a non-loopback address.
    #[arg(long = "tls-cert", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS server private key (PEM).
    #[arg(long = "tls-key", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// CA certificate(s) (PEM) that NBD clients' certificates must be signed by.
    #[arg(long = "tls-ca", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Serve NBD connections with worker threads only, never on an io_uring reactor per
    /// connection (to compare the two, or on a kernel whose io_uring misbehaves).
    #[arg(long = "nbd-threaded")]
    pub nbd_threaded: bool,
    /// Check this config file (with the options given here) and exit: prints one line, what
    /// would run or the first problem; opens no device and binds nothing.
    #[arg(long = "check-config", value_name = "FILE", conflicts_with = "config")]
    pub check_config: Option<PathBuf>,
    /// Log level (default info). Lines go to stderr with RFC 3339 timestamps, and with
    /// journald priorities under systemd.
    #[arg(long = "log-level", value_name = "LEVEL", ignore_case = true)]
    pub log_level: Option<LogLevel>,
}

/// Runs the daemon in the foreground (or checks its config: `--check-config`).
pub fn daemon(a: DaemonArgs) -> Result<(), String> {
    let check = a.check_config.clone();
    let opts = tiercache_daemon::server::Options {
        config: a.config,
        socket: a.socket,
        nbd_listen: a.nbd_listen,
        metrics_listen: a.metrics_listen,
        socket_group: a.socket_group,
        tls_cert: a.tls_cert,
        tls_key: a.tls_key,
        tls_ca: a.tls_ca,
        nbd_threaded: a.nbd_threaded,
        log_level: a.log_level.as_ref().map(word),
    };
    match check {
        Some(f) => {
            println!("{}", tiercache_daemon::server::check_config(&f, &opts)?);
            Ok(())
        }
        None => tiercache_daemon::server::run(opts),
    }
}

/// `start-cache`.
#[derive(Args)]
pub struct StartCache {
    /// Cache device: a path, ram:SIZE or emu:PRESET:PATH.
    #[arg(long)]
    pub cache_device: String,
    /// Cache id (default: the smallest free).
    #[arg(long)]
    pub cache_id: Option<u16>,
    /// Cache mode (default wt; wb, wo and wl need a persistent cache device, not ram:).
    #[arg(long, ignore_case = true)]
    pub mode: Option<Mode>,
    /// Cache line size, fixed at creation (default 4k).
    #[arg(long, ignore_case = true)]
    pub line_size: Option<LineSize>,
    /// Load the cache the device holds.
    #[arg(long, conflicts_with = "force")]
    pub load: bool,
    /// Format the device even if it holds a cache or other data.
    #[arg(long)]
    pub force: bool,
    /// Say what the new cache would use (lines, metadata on the device, RAM) and change
    /// nothing. (Without it, start-cache prints the same before it formats.)
    #[arg(long, conflicts_with = "load")]
    pub dry_run: bool,
    /// IO timeout of the cache device, 10ms to 1h (e.g. 500ms, 30s, 1h; a bare number is
    /// seconds): an IO it does not finish in time fails, and the cache goes on without it
    /// (pass-through until it answers again).
    #[arg(long, value_name = "TIME", value_parser = io_timeout)]
    pub io_timeout: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

/// `add-core`.
#[derive(Args)]
pub struct AddCore {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// Core device: a path, emu:PRESET:PATH, nbd:URI or rbd:POOL/IMAGE.
    #[arg(long)]
    pub core_device: String,
    /// Core id.
    #[arg(long)]
    pub core_id: Option<u16>,
    /// NBD export name (default cache<N>-core<M>).
    #[arg(long)]
    pub export: Option<String>,
    /// Ceph config file for an rbd: core (default: librados's search, $CEPH_CONF then
    /// /etc/ceph/ceph.conf).
    #[arg(long)]
    pub ceph_conf: Option<String>,
    /// cephx client id for an rbd: core (default admin; the keyring is found as librados does).
    #[arg(long)]
    pub ceph_id: Option<String>,
    /// IO timeout of the core device, 10ms to 1h (e.g. 500ms, 30s, 1h; a bare number is
    /// seconds): an IO it does not finish in time fails, and a client request that needed it
    /// gets EIO.
    #[arg(long, value_name = "TIME", value_parser = io_timeout)]
    pub io_timeout: Option<String>,
    #[command(flatten)]
    pub conn: Conn,
}

/// `remove-core`.
#[derive(Args)]
pub struct RemoveCore {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// Core id.
    #[arg(long)]
    pub core_id: u16,
    /// Do not write dirty data back first (refused while the core has any).
    #[arg(long)]
    pub no_writeback: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `stop-cache`.
#[derive(Args)]
pub struct StopCache {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// Keep dirty data on the cache device instead of writing it back first.
    #[arg(long)]
    pub no_writeback: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `list`.
#[derive(Args)]
pub struct List {
    #[command(flatten)]
    pub conn: Conn,
}

/// `stats`.
#[derive(Args)]
pub struct Stats {
    /// Cache id (all caches when absent).
    #[arg(long)]
    pub cache_id: Option<u16>,
    /// Core id.
    #[arg(long)]
    pub core_id: Option<u16>,
    /// IO class id.
    #[arg(long)]
    pub io_class: Option<u8>,
    #[command(flatten)]
    pub conn: Conn,
}

/// Whose parameters `set-param` and `get-param` set or show, and the daemon to ask.
#[derive(Args)]
pub struct ParamAt {
    /// Cache id (required).
    #[arg(long, global = true)]
    pub cache_id: Option<u16>,
    /// Core id (seq-cutoff; every core when absent).
    #[arg(long, global = true)]
    pub core_id: Option<u16>,
    #[command(flatten)]
    pub conn: Conn,
}

/// `set-param`: `tiercache set-param --cache-id 1 seq-cutoff --policy never --threshold 1MiB`.
#[derive(Args)]
#[command(
    after_help = "Each group's parameters: tiercache set-param GROUP --help. Values are read \
in the unit get-param prints them in (30s, 500ms, 1MiB, 80%); a bare number keeps casadm's unit."
)]
pub struct SetParam {
    #[command(flatten)]
    pub at: ParamAt,
    #[command(subcommand)]
    pub group: ParamGroup<Set>,
}

/// `get-param`.
#[derive(Args)]
pub struct GetParam {
    #[command(flatten)]
    pub at: ParamAt,
    #[command(subcommand)]
    pub group: ParamGroup<Get>,
}

/// `set-mode`.
#[derive(Args)]
pub struct SetMode {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// The new mode (wl only at creation: a cache cannot switch to or from it).
    #[arg(long, ignore_case = true)]
    pub mode: Mode,
    #[command(flatten)]
    pub conn: Conn,
}

/// `io-class load` / `io-class list`.
#[derive(clap::Subcommand)]
pub enum IoClass {
    /// Load an Open CAS IO class CSV.
    Load {
        /// Cache id.
        #[arg(long)]
        cache_id: u16,
        /// The CSV file.
        #[arg(long)]
        file: PathBuf,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show the IO classes in force.
    List {
        /// Cache id.
        #[arg(long)]
        cache_id: u16,
        #[command(flatten)]
        conn: Conn,
    },
}

/// `writeback`.
#[derive(Args)]
pub struct Writeback {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// Wait only for this core's dirty data.
    #[arg(long, conflicts_with = "cancel")]
    pub core_id: Option<u16>,
    /// Stop the `writeback` running on this cache (started from another shell): it returns
    /// saying how much it wrote back and how much is still dirty. Ctrl-C on the running
    /// `writeback` does the same.
    #[arg(long)]
    pub cancel: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `invalidate`.
#[derive(Args)]
pub struct Invalidate {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    /// Core id.
    #[arg(long)]
    pub core_id: u16,
    /// Required: dirty data of the core is dropped, not written back.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub conn: Conn,
}

/// `reset-counters`.
#[derive(Args)]
pub struct ResetCounters {
    /// Cache id.
    #[arg(long)]
    pub cache_id: u16,
    #[command(flatten)]
    pub conn: Conn,
}

/// `shutdown`.
#[derive(Args)]
pub struct Shutdown {
    #[command(flatten)]
    pub conn: Conn,
    /// Return once the daemon has begun stopping, without waiting for it to exit (by default
    /// `shutdown` returns when the daemon's process has ended: exports closed, final
    /// checkpoints written, devices flushed).
    #[arg(long)]
    pub no_wait: bool,
}

/// A progress bar on stderr (drawn only on a terminal; otherwise a line every 10% once
/// something is done).
struct Bar {
    tty: bool,
    last_tenth: u64,
    drawn: bool,
    /// When, and at how many units done, the first progress line came.
    first: Option<(std::time::Instant, u64)>,
}

/// `rate` units per second and the time left at that rate, as ` 1234 lines/s, ETA 0:42` (empty
/// until something has moved).
fn rate_eta(rate: Option<f64>, left: u64, unit: &str) -> String {
    match rate {
        Some(r) if r > 0.0 => {
            let eta = (left as f64 / r).ceil() as u64;
            format!(
                ", {r:.0} {unit}/s, ETA {}:{:02}:{:02}",
                eta / 3600,
                eta / 60 % 60,
                eta % 60
            )
        }
        _ => String::new(),
    }
}

impl Bar {
    fn new() -> Bar {
        Bar {
            tty: std::io::stderr().is_terminal(),
            last_tenth: u64::MAX,
            drawn: false,
            first: None,
        }
    }

    /// Units per second since the first progress line (after at least half a second).
    fn rate(&mut self, done: u64) -> Option<f64> {
        let (t0, d0) = *self.first.get_or_insert((std::time::Instant::now(), done));
        let secs = t0.elapsed().as_secs_f64();
        (secs >= 0.5 && done > d0).then(|| (done - d0) as f64 / secs)
    }

    fn show(&mut self, p: &Progress) {
        let frac = if p.total == 0 {
            1.0
        } else {
            p.done as f64 / p.total as f64
        };
        let rate = self.rate(p.done);
        let eta = rate_eta(rate, p.total.saturating_sub(p.done), &p.unit);
        let mut e = std::io::stderr();
        if self.tty {
            let w = 30;
            let n = (frac * w as f64) as usize;
            let _ = write!(
                e,
                "\r{} [{}{}] {:5.1}% {}/{} {}{eta}\x1b[K",
                p.what,
                "#".repeat(n),
                ".".repeat(w - n.min(w)),
                frac * 100.0,
                p.done,
                p.total,
                p.unit
            );
            self.drawn = true;
        } else {
            // Nothing done yet says nothing (and a verb that then fails prints only its
            // one-line error).
            let tenth = (frac * 10.0) as u64;
            if tenth != self.last_tenth && (p.done > 0 || p.total == 0) {
                self.last_tenth = tenth;
                let _ = writeln!(
                    e,
                    "{}: {:.0}% ({}/{} {}{eta})",
                    p.what,
                    frac * 100.0,
                    p.done,
                    p.total,
                    p.unit
                );
            }
        }
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if self.drawn {
            eprintln!();
        }
    }
}

fn send(conn: &Conn, req: Request) -> Result<Value, String> {
    let socket = conn.socket.clone().unwrap_or_else(default_socket);
    let mut bar = Bar::new();
    call(&socket, &req, |p| bar.show(p))
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Prints `v` as `key: value` lines, nested objects indented.
fn print_tree(v: &Value, indent: usize) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match x {
                    Value::Object(_) => {
                        println!("{:indent$}{k}:", "");
                        print_tree(x, indent + 2);
                    }
                    Value::Array(a) if a.iter().any(|y| y.is_object()) => {
                        for y in a {
                            println!("{:indent$}{k}:", "");
                            print_tree(y, indent + 2);
                        }
                    }
                    Value::Null => {}
                    _ => println!("{:indent$}{k}: {}", "", plain(x)),
                }
            }
        }
        Value::Array(a) => {
            for y in a {
                print_tree(y, indent);
                println!();
            }
        }
        _ => println!("{:indent$}{}", "", plain(v)),
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn out(conn: &Conn, v: Value) {
    if conn.json {
        print_json(&v);
    } else {
        print_tree(&v, 0);
    }
}

/// `--io-timeout`, checked while the arguments are parsed (the daemon reads the same words).
fn io_timeout(v: &str) -> Result<String, String> {
    match tiercache_daemon::device::parse_timeout(v) {
        Ok(_) => Ok(v.to_string()),
        // "io timeout 'X': want ..." without what clap already says.
        Err(e) => Err(e.split_once(": ").map_or(e.clone(), |(_, w)| w.to_string())),
    }
}

/// `start-cache`. A new cache's plan (what it will use) is asked for and printed (to stderr)
/// before the device is formatted; `--dry-run` prints it and stops there.
pub fn start_cache(a: StartCache) -> Result<(), String> {
    let req = |dry_run: bool| Request::StartCache {
        cache_device: a.cache_device.clone(),
        cache_id: a.cache_id,
        mode: a.mode.as_ref().map(word),
        line_size: a.line_size.as_ref().map(word),
        load: a.load,
        force: a.force,
        io_timeout: a.io_timeout.clone(),
        dry_run,
    };
    if a.dry_run {
        out(&a.conn, send(&a.conn, req(true))?);
        return Ok(());
    }
    if !a.load {
        let plan = send(&a.conn, req(true))?;
        eprintln!("{}", plan_line(&a.cache_device, &plan["would_create"]));
    }
    out(&a.conn, send(&a.conn, req(false))?);
    Ok(())
}

/// One line on what a new cache will use: `cache device X: 262,144 lines of 4 KiB (1.0 GiB of
/// data), 8.0 MiB of metadata on the device, 6.2 MiB of RAM`.
fn plan_line(device: &str, s: &Value) -> String {
    use tiercache_daemon::health::human;
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let log = match s.get("log_bytes").and_then(Value::as_u64) {
        Some(b) => format!(", a {} write log", human(b)),
        None => String::new(),
    };
    format!(
        "cache device {device}: {} lines of {} ({} of data){log}, {} of metadata on the device, {} of RAM",
        n("lines"),
        human(n("line_size")),
        human(n("data_bytes")),
        human(n("metadata_bytes_on_device")),
        human(n("ram_bytes")),
    )
}

/// `add-core`.
pub fn add_core(a: AddCore) -> Result<(), String> {
    // The Ceph options travel in the device string (`rbd:POOL/IMAGE:conf=FILE:id=ID`), which
    // is also what the cache records for `--load`; the config path is made absolute here
    // because the daemon runs elsewhere.
    let conf = match &a.ceph_conf {
        Some(c) => Some(
            std::path::absolute(c)
                .map_err(|e| format!("--ceph-conf {c}: {e}"))?
                .display()
                .to_string(),
        ),
        None => None,
    };
    let core_device = tiercache_daemon::device::with_ceph_options(
        &a.core_device,
        conf.as_deref(),
        a.ceph_id.as_deref(),
    )?;
    let v = send(
        &a.conn,
        Request::AddCore {
            cache_id: a.cache_id,
            core_device,
            core_id: a.core_id,
            export: a.export,
            io_timeout: a.io_timeout,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `remove-core`.
pub fn remove_core(a: RemoveCore) -> Result<(), String> {
    let v = send(
        &a.conn,
        Request::RemoveCore {
            cache_id: a.cache_id,
            core_id: a.core_id,
            no_writeback: a.no_writeback,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `stop-cache`.
pub fn stop_cache(a: StopCache) -> Result<(), String> {
    let v = send(
        &a.conn,
        Request::StopCache {
            cache_id: a.cache_id,
            no_writeback: a.no_writeback,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `list`: a casadm-like table, or JSON.
pub fn list(a: List) -> Result<(), String> {
    let v = send(&a.conn, Request::List)?;
    if a.conn.json {
        print_json(&v);
        return Ok(());
    }
    println!(
        "{:<6} {:<4} {:<36} {:<11} {:<5} {:>6} {:>6} {:>9}  export / reason",
        "type", "id", "device", "state", "mode", "used", "dirty", "read hits"
    );
    // A share of `of` as a percentage, "-" when unknown.
    let pct = |n: &Value, of: u64| match n.as_u64() {
        Some(n) if of > 0 => format!("{:.1}%", n as f64 * 100.0 / of as f64),
        _ => "-".into(),
    };
    let hits = |v: &Value| {
        v["read_hit_ratio"]
            .as_f64()
            .map_or("-".into(), |r| format!("{:.1}%", r * 100.0))
    };
    for c in v.as_array().into_iter().flatten() {
        let lines = c["lines"].as_u64().unwrap_or(0);
        println!(
            "{:<6} {:<4} {:<36} {:<11} {:<5} {:>6} {:>6} {:>9}  {}",
            "cache",
            plain(&c["cache_id"]),
            plain(&c["device"]),
            plain(&c["state"]),
            plain(&c["mode"]),
            pct(&c["occupancy_lines"], lines),
            pct(&c["dirty_lines"], lines),
            hits(c),
            if c["reason"].is_null() {
                String::new()
            } else {
                plain(&c["reason"])
            }
        );
        for k in c["cores"].as_array().into_iter().flatten() {
            let reason = plain(&k["reason"]);
            println!(
                "{:<6} {:<4} {:<36} {:<11} {:<5} {:>6} {:>6} {:>9}  {}{}",
                "└core",
                plain(&k["core_id"]),
                plain(&k["device"]),
                plain(&k["state"]),
                "",
                "",
                pct(&k["dirty_lines"], lines),
                hits(k),
                plain(&k["export"]),
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                }
            );
        }
    }
    println!(
        "(used and dirty: shares of the cache's lines; read hits since the counters were reset)"
    );
    Ok(())
}

/// `stats`.
pub fn stats(a: Stats) -> Result<(), String> {
    let v = send(
        &a.conn,
        Request::Stats {
            cache_id: a.cache_id,
            core_id: a.core_id,
            io_class: a.io_class,
        },
    )?;
    if !a.conn.json {
        // A line per cache first; the whole block follows.
        let blocks = match &v {
            Value::Array(a) => a.iter().collect(),
            one => vec![one],
        };
        let lines: Vec<String> = blocks.into_iter().filter_map(summary).collect();
        if !lines.is_empty() {
            println!("{}\n", lines.join("\n"));
        }
    }
    out(&a.conn, v);
    Ok(())
}

/// One line saying how a cache is doing, from its `stats` block (`None` for other blocks).
fn summary(c: &Value) -> Option<String> {
    let u = c.get("usage")?;
    let r = &c["requests"];
    let pct = |v: &Value| v.as_f64().map_or("-".to_string(), |p| format!("{p:.1}%"));
    let problems = c["health"]["problems"].as_array().map_or(0, |p| p.len());
    Some(format!(
        "cache {} ({}, {}, {}): {} used, {} dirty ({} MiB), read hits {}, write hits {}, {} requests, {} errors{}",
        plain(&c["cache_id"]),
        plain(&c["device"]),
        plain(&c["mode"]),
        plain(&c["state"]),
        pct(&u["occupancy_pct"]),
        pct(&u["dirty_pct"]),
        u["dirty_bytes"].as_u64().unwrap_or(0) >> 20,
        pct(&r["read_hit_pct"]),
        pct(&r["write_hit_pct"]),
        r["total"].as_u64().unwrap_or(0),
        r["errors"].as_u64().unwrap_or(0),
        if problems > 0 {
            format!(", {problems} problems (see health)")
        } else {
            String::new()
        }
    ))
}

/// `set-param` (its cache id checked by `main`).
pub fn set_param(a: SetParam) -> Result<(), String> {
    let v = send(
        &a.at.conn,
        Request::SetParam {
            cache_id: a.at.cache_id.unwrap_or_default(),
            core_id: a.at.core_id,
            name: a.group.name,
            values: a.group.values,
        },
    )?;
    params_out(&a.at.conn, v);
    Ok(())
}

/// A parameter group's values: as the daemon sent them with `--json` (numbers, the unit in
/// the key), else `key: value` lines with the unit in the value, as `set-param` reads them.
fn params_out(conn: &Conn, v: Value) {
    if conn.json {
        return print_json(&v);
    }
    let text = |o: &Value| -> Value {
        Value::Object(
            o.as_object()
                .into_iter()
                .flatten()
                .map(|(k, x)| {
                    let (k, t) = tiercache_daemon::registry::param_text(k, x);
                    (k, Value::String(t))
                })
                .collect(),
        )
    };
    let t = match &v {
        Value::Array(a) => Value::Array(a.iter().map(text).collect()),
        o => text(o),
    };
    print_tree(&t, 0);
}

/// `get-param` (its cache id checked by `main`).
pub fn get_param(a: GetParam) -> Result<(), String> {
    let v = send(
        &a.at.conn,
        Request::GetParam {
            cache_id: a.at.cache_id.unwrap_or_default(),
            core_id: a.at.core_id,
            name: a.group.name,
        },
    )?;
    params_out(&a.at.conn, v);
    Ok(())
}

/// `set-mode`.
pub fn set_mode(a: SetMode) -> Result<(), String> {
    let v = send(
        &a.conn,
        Request::SetMode {
            cache_id: a.cache_id,
            mode: word(&a.mode),
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `io-class load|list`.
pub fn io_class(a: IoClass) -> Result<(), String> {
    match a {
        IoClass::Load {
            cache_id,
            file,
            conn,
        } => {
            let csv =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let v = send(&conn, Request::IoClassLoad { cache_id, csv })?;
            out(&conn, v);
        }
        IoClass::List { cache_id, conn } => {
            let v = send(&conn, Request::IoClassList { cache_id })?;
            if conn.json {
                print_json(&v);
            } else {
                println!(
                    "{:<4} {:<40} {:<18} {:<10} lines",
                    "id", "name", "eviction priority", "allocation"
                );
                for k in v["classes"].as_array().into_iter().flatten() {
                    println!(
                        "{:<4} {:<40} {:<18} {:<10} {}",
                        plain(&k["id"]),
                        plain(&k["name"]),
                        plain(&k["eviction_priority"]),
                        k["allocation"],
                        k["lines"]
                    );
                }
            }
        }
    }
    Ok(())
}

/// `writeback`: waits with a progress bar; Ctrl-C (SIGINT) or SIGTERM asks the daemon to
/// cancel it (`--cancel` from another shell does the same), and the answer then says what is
/// still dirty. A second signal quits at once and leaves the writeback running.
pub fn writeback(a: Writeback) -> Result<(), String> {
    let socket = a.conn.socket.clone().unwrap_or_else(default_socket);
    if a.cancel {
        let v = call(
            &socket,
            &Request::CancelWriteback {
                cache_id: a.cache_id,
            },
            |_| {},
        )?;
        if a.conn.json {
            print_json(&v);
        } else {
            println!(
                "{} (cache {}: {} lines dirty)",
                if v["was_running"].as_bool() == Some(true) {
                    "writeback cancelled"
                } else {
                    "no writeback was running"
                },
                a.cache_id,
                v["dirty_lines"]
            );
        }
        return Ok(());
    }
    cancel_on_signal(socket, a.cache_id);
    let v = send(
        &a.conn,
        Request::Writeback {
            cache_id: a.cache_id,
            core_id: a.core_id,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts later), and starts a
/// thread that takes them: the first sends `CancelWriteback` for `cache_id` (the waiting
/// request then answers), a second one exits with 130.
fn cancel_on_signal(socket: PathBuf, cache_id: u16) {
    // SAFETY: plain libc calls on a local, initialised signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        set
    };
    std::thread::spawn(move || {
        let mut first = true;
        loop {
            let mut sig = 0;
            // SAFETY: `set` is initialised; `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if !first {
                eprintln!("\nleft the writeback running");
                std::process::exit(130);
            }
            first = false;
            eprintln!(
                "\ncancelling the writeback of cache {cache_id} (again to quit and leave it running)"
            );
            if let Err(e) = call(&socket, &Request::CancelWriteback { cache_id }, |_| {}) {
                eprintln!("{e}");
                std::process::exit(130);
            }
        }
    });
}

/// `invalidate`.
pub fn invalidate(a: Invalidate) -> Result<(), String> {
    if !a.force {
        return Err(
            "invalidate drops the core's cached and unwritten (dirty) data; add --force to do it"
                .into(),
        );
    }
    let v = send(
        &a.conn,
        Request::Invalidate {
            cache_id: a.cache_id,
            core_id: a.core_id,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `reset-counters`.
pub fn reset_counters(a: ResetCounters) -> Result<(), String> {
    let v = send(
        &a.conn,
        Request::ResetCounters {
            cache_id: a.cache_id,
        },
    )?;
    out(&a.conn, v);
    Ok(())
}

/// `shutdown`: asks the daemon to stop and (unless `--no-wait`) waits until its process has
/// ended (the admin socket is a unix socket: the daemon runs on this host).
pub fn shutdown(a: Shutdown) -> Result<(), String> {
    let v = send(&a.conn, Request::Shutdown)?;
    if !a.no_wait
        && let Some(pid) = v["pid"].as_u64()
    {
        let t = std::time::Instant::now();
        let mut said = false;
        while running(pid) {
            if !said && t.elapsed() > std::time::Duration::from_secs(2) {
                eprintln!(
                    "waiting for the daemon (pid {pid}) to stop: final checkpoints, device flushes"
                );
                said = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    out(&a.conn, v);
    Ok(())
}

/// Whether process `pid` still runs (not gone, not a zombie waiting for its parent).
fn running(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "PID (comm) S ...".
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}
