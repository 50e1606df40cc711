//! The server: listeners, the handshake, and the transmission phase of each connection.

use crate::export::{BlockSizes, Export, ExportError, Exports, ReadReply, ReadStart};
use crate::proto::{self, Request, cmd, errno, info, opt, parse_info_request, rep, reply, tflag};
use crate::tls::{Sock, TlsConfig};
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tiercache_io::{AlignedBuf, Extent};

/// Shuts a connection down from another thread: blocked and later reads and writes fail.
pub type Closer = Arc<dyn Fn() + Send + Sync>;

/// Says whether the stream's socket has room in its send buffer now (a small reply written
/// then does not block).
pub type RoomProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// Whether `fd` polls writable at once. For a unix socket that means at least 3/4 of its send
/// buffer is free; for TCP, room above the low-water mark.
pub(crate) fn poll_writable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1, no timeout: poll only reads and writes `p`.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLOUT != 0 && p.revents & (libc::POLLERR | libc::POLLHUP) == 0
}

/// A connected byte stream the server can speak NBD on: unix and TCP sockets here; a TLS
/// stream implements it the same way.
///
/// The handshake runs on the whole stream; transmission splits it into a read half (the
/// connection's reader thread) and a write half (shared by the workers under a lock).
pub trait NbdStream: Read + Write + Send + 'static {
    /// Splits into halves usable from different threads.
    #[allow(clippy::type_complexity)]
    fn split(self: Box<Self>) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)>;
    /// A handle that shuts the stream down (used by [`Server::shutdown`] and on write errors).
    fn closer(&self) -> io::Result<Closer>;
    /// Sets the read timeout (`None`: block for ever).
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Sets the write timeout (`None`: block for ever).
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Runs the server side of a TLS handshake on this stream (after `NBD_OPT_STARTTLS` was
    /// acknowledged) and returns the TLS stream. Unix and TCP sockets can; other streams
    /// answer `Unsupported`, and the connection ends.
    fn start_tls(self: Box<Self>, tls: &TlsConfig) -> io::Result<Box<dyn NbdStream>> {
        let _ = tls;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "TLS is not available on this kind of stream",
        ))
    }
    /// The TLS protocol and cipher suite, once TLS runs on the stream (for logs).
    fn tls_info(&self) -> Option<String> {
        None
    }
    /// A probe of the socket's send buffer ([`RoomProbe`]), if the stream can tell: the
    /// connection's reader then writes small replies itself when they fit, and otherwise (or
    /// without a probe) leaves writing to a worker, so the reader never blocks on a client that
    /// does not read.
    fn room_probe(&self) -> Option<RoomProbe> {
        None
    }
    /// The socket's descriptor, where the stream is a plain socket whose bytes are the NBD
    /// stream itself (unix, TCP; not TLS): the connection then runs on an io_uring reactor
    /// (`reactor.rs`) that reads and writes it directly.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
}

impl NbdStream for UnixStream {
    fn split(self: Box<Self>) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        let w = self.try_clone()?;
        Ok((self, Box::new(w)))
    }
    fn closer(&self) -> io::Result<Closer> {
        let s = self.try_clone()?;
        Ok(Arc::new(move || {
            let _ = s.shutdown(Shutdown::Both);
        }))
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, t)
    }
    fn room_probe(&self) -> Option<RoomProbe> {
        let s = self.try_clone().ok()?;
        Some(Arc::new(move || poll_writable(s.as_raw_fd())))
    }
    fn start_tls(self: Box<Self>, tls: &TlsConfig) -> io::Result<Box<dyn NbdStream>> {
        Ok(Box::new(crate::tls::accept(Sock::Unix(*self), tls)?))
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}

impl NbdStream for TcpStream {
    fn split(self: Box<Self>) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        let w = self.try_clone()?;
        Ok((self, Box::new(w)))
    }
    fn closer(&self) -> io::Result<Closer> {
        let s = self.try_clone()?;
        Ok(Arc::new(move || {
            let _ = s.shutdown(Shutdown::Both);
        }))
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, t)
    }
    fn room_probe(&self) -> Option<RoomProbe> {
        let s = self.try_clone().ok()?;
        Some(Arc::new(move || poll_writable(s.as_raw_fd())))
    }
    fn start_tls(self: Box<Self>, tls: &TlsConfig) -> io::Result<Box<dyn NbdStream>> {
        Ok(Box::new(crate::tls::accept(Sock::Tcp(*self), tls)?))
    }
    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.as_raw_fd())
    }
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Worker threads shared by every connection (requests executing at once).
    pub workers: usize,
    /// Requests in flight per connection (read from the socket, not yet replied); the reader
    /// stops reading requests at this bound.
    pub max_in_flight: usize,
    /// READ/WRITE payload bytes in flight per connection (a single request is always let in).
    pub max_in_flight_bytes: usize,
    /// How long the server waits for each read of the handshake (a client must also choose
    /// an export within 1024 options).
    pub handshake_timeout: Duration,
    /// How long writing a reply may block before the connection is dropped (a client that
    /// stops reading its replies must not hold workers for ever).
    pub write_timeout: Duration,
    /// Mode of unix sockets created by [`Server::listen`] (0o600; 0o660 to share with a group).
    pub socket_mode: u32,
    /// Group (gid) given to unix sockets before they appear, for `socket_mode` 0o660.
    pub socket_group: Option<u32>,
    /// Log each connection's span (export chosen, end, duration) as one `key=value` line on
    /// stderr, in the daemon's log format.
    pub log_connections: bool,
    /// Run plain-socket connections to engine exports on an io_uring reactor each
    /// (`reactor.rs`); off: worker threads, as TLS connections always are.
    pub reactor: bool,
}

/// One log line through the daemon's one formatter (`tiercache_io::log`).
fn log_line(level: &str, msg: &str, kv: &[(&str, String)]) {
    let level = tiercache_io::log::Level::parse(level).unwrap_or(tiercache_io::log::Level::Info);
    if tiercache_io::log::enabled(level) {
        let kv: Vec<(&str, &str)> = kv.iter().map(|(k, v)| (*k, v.as_str())).collect();
        tiercache_io::log::emit(level, msg, &kv);
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            workers: 16,
            max_in_flight: 64,
            max_in_flight_bytes: 128 << 20,
            handshake_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            socket_mode: 0o600,
            socket_group: None,
            log_connections: false,
            reactor: true,
        }
    }
}

/// Where to listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A unix socket at this path.
    Unix(PathBuf),
    /// A TCP address, `HOST:PORT` (loopback unless the listener has TLS).
    Tcp(String),
}

impl ListenAddr {
    /// Parses `unix:PATH` or `tcp:HOST:PORT` (the CLI's `--nbd-listen`).
    pub fn parse(s: &str) -> Result<ListenAddr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(format!("'{s}': want unix:PATH"));
            }
            Ok(ListenAddr::Unix(PathBuf::from(p)))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            if !a.contains(':') {
                return Err(format!("'{s}': want tcp:HOST:PORT"));
            }
            Ok(ListenAddr::Tcp(a.to_string()))
        } else {
            Err(format!(
                "'{s}': want unix:PATH or tcp:HOST:PORT (e.g. tcp:127.0.0.1:10809)"
            ))
        }
    }
}

impl ListenAddr {
    /// For a TCP address, the first address it resolves to that is not loopback (such a
    /// listener needs TLS, SPEC R7); `None` for unix sockets and loopback TCP.
    pub fn non_loopback(&self) -> Result<Option<SocketAddr>, String> {
        match self {
            ListenAddr::Unix(_) => Ok(None),
            ListenAddr::Tcp(spec) => Ok(spec
                .to_socket_addrs()
                .map_err(|e| format!("NBD listen address '{spec}': {e}"))?
                .find(|a| !a.ip().is_loopback())),
        }
    }
}

/// The one-line refusal of a non-loopback TCP listener without TLS.
pub fn non_loopback_refusal(a: &SocketAddr, spec: &str) -> String {
    let spec = if a.to_string() == spec {
        String::new()
    } else {
        format!(" ('{spec}')")
    };
    format!(
        "refusing to serve NBD on non-loopback address {a}{spec} without TLS: pass \
         --tls-cert, --tls-key and --tls-ca (clients must then present a certificate signed by \
         that CA), or listen on 127.0.0.1 or a unix socket"
    )
}

/// An address a listener is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BoundAddr {
    /// A unix socket.
    Unix(PathBuf),
    /// A TCP socket (with the port chosen by the system if port 0 was asked for).
    Tcp(SocketAddr),
}

/// Counters of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections open now.
    pub open: u64,
    /// Connections that reached transmission.
    pub transmitting: u64,
    /// Connections that ended in the handshake (refused, aborted, malformed, timed out).
    pub handshake_ended: u64,
    /// Requests received in transmission.
    pub requests: u64,
    /// Requests answered with an error.
    pub request_errors: u64,
    /// The most requests that were in flight on one connection at once.
    pub in_flight_max: u64,
    /// Connections whose TLS handshake failed (no or a wrong client certificate, not TLS).
    pub tls_refused: u64,
    /// Device reads and writes a reactor ran with registered (fixed) buffers.
    pub fixed_ios: u64,
    /// Writes of replies to sockets by reactors (`writev` calls, each carrying one or more
    /// replies).
    pub reply_writes: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
    transmitting: AtomicU64,
    handshake_ended: AtomicU64,
    pub(crate) requests: AtomicU64,
    request_errors: AtomicU64,
    pub(crate) in_flight_max: AtomicU64,
    tls_refused: AtomicU64,
    pub(crate) fixed_ios: AtomicU64,
    pub(crate) reply_writes: AtomicU64,
}

pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The most bytes of one reply a connection's reader writes itself (when the socket has room).
const READER_REPLY_MAX: usize = 64 << 10;

/// The worker pool's queue: jobs, "quit", and how many workers wait for a job.
struct PoolQueue {
    jobs: VecDeque<Job>,
    quit: bool,
    idle: usize,
}

/// The worker pool shared by every connection.
pub(crate) struct Pool {
    q: Mutex<PoolQueue>,
    cv: Condvar,
}

impl Pool {
    pub(crate) fn submit(&self, job: Job) {
        let mut g = lock(&self.q);
        g.jobs.push_back(job);
        // A notify is a system call; busy workers take the job without one.
        let wake = g.idle > 0;
        drop(g);
        if wake {
            self.cv.notify_one();
        }
    }

    fn run(&self) {
        loop {
            let job = {
                let mut g = lock(&self.q);
                loop {
                    if let Some(j) = g.jobs.pop_front() {
                        break j;
                    }
                    if g.quit {
                        return;
                    }
                    g.idle += 1;
                    g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    g.idle -= 1;
                }
            };
            // A panicking export must not take the worker down: the job's in-flight guard
            // answers the request with EIO and releases its slot while unwinding.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        }
    }
}

struct ConnEntry {
    closer: Closer,
    thread: Option<JoinHandle<()>>,
    /// The export chosen, once in transmission.
    export: Option<String>,
}

struct ListenerEntry {
    thread: JoinHandle<()>,
    /// A unix socket file to remove at shutdown if it is still ours (device, inode).
    unix: Option<(PathBuf, u64, u64)>,
}

pub(crate) struct Inner {
    exports: Arc<dyn Exports>,
    pub(crate) cfg: ServerConfig,
    quit: AtomicBool,
    pub(crate) pool: Pool,
    conns: Mutex<(HashMap<u64, ConnEntry>, u64)>,
    pub(crate) stats: Counters,
}

/// A running NBD server: a worker pool, listeners, and connections.
///
/// Dropping it shuts it down as [`Server::shutdown`] does.
pub struct Server {
    inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    listeners: Mutex<Vec<ListenerEntry>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// Starts a server for `exports` (no listeners yet: see [`Server::listen`] and
    /// [`Server::serve_stream`]).
    pub fn new(exports: Arc<dyn Exports>, cfg: ServerConfig) -> Server {
        let inner = Arc::new(Inner {
            exports,
            cfg: cfg.clone(),
            quit: AtomicBool::new(false),
            pool: Pool {
                q: Mutex::new(PoolQueue {
                    jobs: VecDeque::new(),
                    quit: false,
                    idle: 0,
                }),
                cv: Condvar::new(),
            },
            conns: Mutex::new((HashMap::new(), 0)),
            stats: Counters::default(),
        });
        let workers = (0..cfg.workers.max(1))
            .map(|i| {
                let inner = inner.clone();
                std::thread::Builder::new()
                    .name(format!("nbd-worker-{i}"))
                    .spawn(move || inner.pool.run())
                    .expect("spawn an NBD worker")
            })
            .collect();
        Server {
            inner,
            workers: Mutex::new(workers),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Starts listening on `addr` without TLS and returns the address bound.
    ///
    /// A unix socket is created with [`ServerConfig::socket_mode`] (0600) before anyone can
    /// connect; an existing socket file is removed only if nothing listens on it. A TCP
    /// address must be loopback: NBD over the network needs TLS ([`Server::listen_tls`]).
    pub fn listen(&self, addr: &ListenAddr) -> Result<BoundAddr, String> {
        self.listen_tls(addr, None)
    }

    /// Starts listening on `addr` and returns the address bound. With `tls`, every
    /// connection must upgrade with `NBD_OPT_STARTTLS` and present a client certificate the
    /// configured CA vouches for before any other option is answered (FORCEDTLS: other
    /// options get `NBD_REP_ERR_TLS_REQD`, `NBD_OPT_EXPORT_NAME` ends the connection).
    /// Without `tls`, a TCP address must be loopback (SPEC R7); `NBD_OPT_STARTTLS` gets
    /// `NBD_REP_ERR_POLICY`.
    pub fn listen_tls(
        &self,
        addr: &ListenAddr,
        tls: Option<TlsConfig>,
    ) -> Result<BoundAddr, String> {
        if self.inner.quit.load(Ordering::Acquire) {
            return Err("the NBD server is shutting down".into());
        }
        match addr {
            ListenAddr::Unix(path) => {
                let l = bind_unix(
                    path,
                    self.inner.cfg.socket_mode,
                    self.inner.cfg.socket_group,
                )?;
                let meta = std::fs::metadata(path)
                    .map_err(|e| format!("NBD socket {}: {e}", path.display()))?;
                let fd = l.as_raw_fd();
                let inner = self.inner.clone();
                let thread = std::thread::Builder::new()
                    .name("nbd-accept-unix".into())
                    .spawn(move || {
                        accept_loop(&inner, fd, tls, || match l.accept() {
                            Ok((s, _)) => Some(Box::new(s) as Box<dyn NbdStream>),
                            Err(_) => None,
                        })
                    })
                    .map_err(|e| format!("spawning the NBD accept thread: {e}"))?;
                lock(&self.listeners).push(ListenerEntry {
                    thread,
                    unix: Some((path.clone(), meta.dev(), meta.ino())),
                });
                Ok(BoundAddr::Unix(path.clone()))
            }
            ListenAddr::Tcp(spec) => {
                let addrs: Vec<SocketAddr> = spec
                    .to_socket_addrs()
                    .map_err(|e| format!("NBD listen address '{spec}': {e}"))?
                    .collect();
                if addrs.is_empty() {
                    return Err(format!("NBD listen address '{spec}' resolves to nothing"));
                }
                if tls.is_none()
                    && let Some(a) = addrs.iter().find(|a| !a.ip().is_loopback())
                {
                    return Err(non_loopback_refusal(a, spec));
                }
                let mut last = String::new();
                for a in addrs {
                    match TcpListener::bind(a) {
                        Ok(l) => {
                            let bound = l.local_addr().map_err(|e| e.to_string())?;
                            let fd = l.as_raw_fd();
                            let inner = self.inner.clone();
                            let tls = tls.clone();
                            let thread = std::thread::Builder::new()
                                .name("nbd-accept-tcp".into())
                                .spawn(move || {
                                    accept_loop(&inner, fd, tls, || match l.accept() {
                                        Ok((s, _)) => {
                                            let _ = s.set_nodelay(true);
                                            Some(Box::new(s) as Box<dyn NbdStream>)
                                        }
                                        Err(_) => None,
                                    })
                                })
                                .map_err(|e| format!("spawning the NBD accept thread: {e}"))?;
                            lock(&self.listeners).push(ListenerEntry { thread, unix: None });
                            return Ok(BoundAddr::Tcp(bound));
                        }
                        Err(e) => last = format!("binding NBD listener {a}: {e}"),
                    }
                }
                Err(last)
            }
        }
    }

    /// Serves one already connected stream (a socket accepted elsewhere, a TLS stream, a
    /// socket pair in tests) on a new connection thread.
    pub fn serve_stream(&self, stream: Box<dyn NbdStream>) {
        spawn_conn(&self.inner, stream, None);
    }

    /// Serves one already connected stream with TLS required, as a listener with `tls` does.
    pub fn serve_stream_tls(&self, stream: Box<dyn NbdStream>, tls: TlsConfig) {
        spawn_conn(&self.inner, stream, Some(tls));
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        let s = &self.inner.stats;
        ServerStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            open: s.open.load(Ordering::Relaxed),
            transmitting: s.transmitting.load(Ordering::Relaxed),
            handshake_ended: s.handshake_ended.load(Ordering::Relaxed),
            requests: s.requests.load(Ordering::Relaxed),
            request_errors: s.request_errors.load(Ordering::Relaxed),
            in_flight_max: s.in_flight_max.load(Ordering::Relaxed),
            tls_refused: s.tls_refused.load(Ordering::Relaxed),
            fixed_ios: s.fixed_ios.load(Ordering::Relaxed),
            reply_writes: s.reply_writes.load(Ordering::Relaxed),
        }
    }

    /// Closes every connection to export `name` (after `remove-core`, say): requests already
    /// executing finish, their replies may not reach the client. Returns how many were closed.
    /// New connections are decided by [`Exports::get`] as always.
    pub fn disconnect_export(&self, name: &str) -> usize {
        let g = lock(&self.inner.conns);
        let mut n = 0;
        for e in g.0.values() {
            if e.export.as_deref() == Some(name) {
                (e.closer)();
                n += 1;
            }
        }
        n
    }

    /// Stops listening (unix socket files are removed), closes every connection (requests
    /// already executing finish first; their replies may not reach the client), and joins
    /// every thread. Idempotent; dropping the server does the same.
    pub fn shutdown(&self) {
        {
            let _g = lock(&self.inner.conns);
            self.inner.quit.store(true, Ordering::Release);
        }
        for l in lock(&self.listeners).drain(..) {
            let _ = l.thread.join();
            if let Some((path, dev, ino)) = l.unix
                && let Ok(m) = std::fs::symlink_metadata(&path)
                && m.dev() == dev
                && m.ino() == ino
            {
                let _ = std::fs::remove_file(&path);
            }
        }
        let conns: Vec<ConnEntry> = {
            let mut g = lock(&self.inner.conns);
            g.0.drain().map(|(_, c)| c).collect()
        };
        for c in &conns {
            (c.closer)();
        }
        for c in conns {
            if let Some(t) = c.thread {
                let _ = t.join();
            }
        }
        lock(&self.inner.pool.q).quit = true;
        self.inner.pool.cv.notify_all();
        let workers: Vec<JoinHandle<()>> = lock(&self.workers).drain(..).collect();
        for w in workers {
            let _ = w.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Waits (with `poll`, so shutdown is noticed within 100 ms) for connections on `fd`.
fn accept_loop(
    inner: &Arc<Inner>,
    fd: RawFd,
    tls: Option<TlsConfig>,
    mut accept: impl FnMut() -> Option<Box<dyn NbdStream>>,
) {
    while !inner.quit.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call, and the count is 1.
        let n = unsafe { libc::poll(&mut pfd, 1, 100) };
        if n <= 0 {
            continue;
        }
        if let Some(s) = accept() {
            spawn_conn(inner, s, tls.clone());
        } else {
            // EMFILE and friends: do not spin.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn spawn_conn(inner: &Arc<Inner>, stream: Box<dyn NbdStream>, tls: Option<TlsConfig>) {
    let Ok(closer) = stream.closer() else {
        return;
    };
    // Spawned under the lock, so shutdown (which drains the table under it) either sees the
    // connection with its thread or stops it from starting.
    let mut g = lock(&inner.conns);
    if inner.quit.load(Ordering::Acquire) {
        return;
    }
    g.1 += 1;
    let id = g.1;
    inner.stats.open.fetch_add(1, Ordering::Relaxed);
    let i2 = inner.clone();
    let t = std::thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            // A bug must not leave the connection counted and registered for ever.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_conn(&i2, id, stream, tls)
            }));
            i2.stats.open.fetch_sub(1, Ordering::Relaxed);
            lock(&i2.conns).0.remove(&id);
        });
    if let Ok(t) = t {
        inner.stats.accepted.fetch_add(1, Ordering::Relaxed);
        g.0.insert(
            id,
            ConnEntry {
                closer,
                thread: Some(t),
                export: None,
            },
        );
    } else {
        inner.stats.open.fetch_sub(1, Ordering::Relaxed);
        closer();
    }
}

/// What the handshake agreed on.
struct Negotiated {
    export: Arc<dyn Export>,
    size: u64,
    sizes: BlockSizes,
    read_only: bool,
    structured: bool,
    /// `base:allocation` was selected for this export: `NBD_CMD_BLOCK_STATUS` is served.
    block_status: bool,
    /// The client did not ask for `NBD_INFO_BLOCK_SIZE` (`NBD_OPT_EXPORT_NAME`, or
    /// `NBD_OPT_GO` without it): requests at any byte offset and length are served
    /// (`unaligned.rs`).
    liberal: bool,
}

/// The handshake of a connection, with a TLS upgrade in the middle when `tls` is set.
/// Returns the stream to transmit on (a TLS stream after an upgrade) and what was agreed.
fn conn_handshake(
    inner: &Arc<Inner>,
    id: u64,
    mut stream: Box<dyn NbdStream>,
    tls: Option<&TlsConfig>,
) -> Option<(Box<dyn NbdStream>, Negotiated)> {
    let mut chosen = |name: &str| {
        if let Some(e) = lock(&inner.conns).0.get_mut(&id) {
            e.export = Some(name.to_string());
        }
    };
    let mode = if tls.is_some() {
        Tls::Required
    } else {
        Tls::Off
    };
    let mut st = greet(&mut *stream, mode).ok()??;
    loop {
        match options(
            &mut *stream,
            &*inner.exports,
            &inner.quit,
            &mut chosen,
            &mut st,
        ) {
            Ok(Step::Go(n)) => return Some((stream, n)),
            Ok(Step::End) | Err(_) => return None,
            Ok(Step::StartTls) => {
                let cfg = tls?;
                match stream.start_tls(cfg) {
                    Ok(s) => {
                        if inner.cfg.log_connections {
                            log_line(
                                "info",
                                "NBD TLS established",
                                &[
                                    ("conn", id.to_string()),
                                    ("tls", s.tls_info().unwrap_or_default()),
                                ],
                            );
                        }
                        stream = s;
                        st.tls = Tls::Active;
                    }
                    Err(e) => {
                        inner.stats.tls_refused.fetch_add(1, Ordering::Relaxed);
                        if inner.cfg.log_connections {
                            log_line(
                                "warn",
                                "NBD TLS handshake failed",
                                &[("conn", id.to_string()), ("error", e.to_string())],
                            );
                        }
                        return None;
                    }
                }
            }
        }
    }
}

fn run_conn(inner: &Arc<Inner>, id: u64, stream: Box<dyn NbdStream>, tls: Option<TlsConfig>) {
    let _ = stream.set_read_timeout(Some(inner.cfg.handshake_timeout));
    let _ = stream.set_write_timeout(Some(inner.cfg.handshake_timeout));
    let Some((stream, neg)) = conn_handshake(inner, id, stream, tls.as_ref()) else {
        inner.stats.handshake_ended.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(Some(inner.cfg.write_timeout));
    let Ok(closer) = stream.closer() else {
        return;
    };
    let tls_on = stream.tls_info().is_some();
    let room = stream.room_probe();
    // A plain socket to an engine export runs on a reactor, if the kernel gives it a ring.
    let reactor = match (stream.raw_fd(), neg.export.as_engine()) {
        (Some(fd), Some(_)) if inner.cfg.reactor => {
            crate::reactor::Reactor::new(fd, &inner.cfg).ok()
        }
        _ => None,
    };
    let Ok((r, w)) = stream.split() else {
        return;
    };
    inner.stats.transmitting.fetch_add(1, Ordering::Relaxed);
    let started = std::time::Instant::now();
    let log_export = lock(&inner.conns)
        .0
        .get(&id)
        .and_then(|e| e.export.clone())
        .unwrap_or_default();
    if inner.cfg.log_connections {
        log_line(
            "info",
            "NBD connection",
            &[
                ("conn", id.to_string()),
                ("export", log_export.clone()),
                ("size", neg.size.to_string()),
                ("structured", neg.structured.to_string()),
                ("block_status", neg.block_status.to_string()),
                ("tls", tls_on.to_string()),
            ],
        );
    }
    let conn = Arc::new(Conn {
        rmw: crate::unaligned::Rmw::new(&*neg.export, neg.liberal),
        export: neg.export,
        size: neg.size,
        sizes: crate::unaligned::accepted(neg.sizes, neg.liberal),
        read_only: neg.read_only,
        structured: neg.structured,
        block_status: neg.block_status,
        writer: Mutex::new(w),
        replies: Mutex::new(VecDeque::new()),
        room,
        dead: AtomicBool::new(false),
        closer,
        flight: Mutex::new(Flight::default()),
        flight_cv: Condvar::new(),
        max_in_flight: inner.cfg.max_in_flight.max(1),
        max_in_flight_bytes: inner.cfg.max_in_flight_bytes,
        inner: inner.clone(),
        wake: reactor.as_ref().map(|r| r.waker()),
    });
    let end = match reactor {
        // `r` (the stream's read half) keeps the socket open while the reactor uses it.
        Some(reactor) => reactor.run(&conn),
        None => transmission(&conn, &mut BufReader::with_capacity(64 << 10, r)),
    };
    // Replies of requests still executing go out (or fail) before the socket is shut.
    conn.drain();
    (conn.closer)();
    if inner.cfg.log_connections {
        log_line(
            "info",
            "NBD connection ended",
            &[
                ("conn", id.to_string()),
                ("export", log_export),
                ("seconds", format!("{:.3}", started.elapsed().as_secs_f64())),
                (
                    "how",
                    match end {
                        Ok(()) => "disconnect".to_string(),
                        Err(e) => e.to_string(),
                    },
                ),
            ],
        );
    }
}

fn read_u32(r: &mut (impl Read + ?Sized)) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Cuts `s` to at most [`proto::MAX_STRING`] bytes at a character boundary.
fn cap_str(s: &str) -> &str {
    if s.len() <= proto::MAX_STRING {
        return s;
    }
    let mut n = proto::MAX_STRING;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

fn send_opt(s: &mut (impl Write + ?Sized), option: u32, typ: u32, data: &[u8]) -> io::Result<()> {
    s.write_all(&proto::option_reply(option, typ, data))
}

fn send_err(s: &mut (impl Write + ?Sized), option: u32, typ: u32, msg: &str) -> io::Result<()> {
    send_opt(s, option, typ, cap_str(msg).as_bytes())
}

/// The transmission flags of an export. `SEND_DF` only with structured replies (the protocol
/// says so): a read's data always goes in one chunk, so `NBD_CMD_FLAG_DF` is always honoured.
fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f = tflag::HAS_FLAGS
        | tflag::SEND_FLUSH
        | tflag::SEND_FUA
        | tflag::SEND_TRIM
        | tflag::SEND_WRITE_ZEROES
        | tflag::SEND_FAST_ZERO
        | tflag::SEND_CACHE
        | tflag::CAN_MULTI_CONN;
    if read_only {
        f |= tflag::READ_ONLY;
    }
    if structured {
        f |= tflag::SEND_DF;
    }
    f
}

/// The fixed newstyle handshake without TLS (NOTLS mode: `NBD_OPT_STARTTLS` gets
/// `NBD_REP_ERR_POLICY`). `Ok(None)`: the connection ends (refused, aborted, malformed);
/// `Ok(Some)`: transmission begins.
/// `chosen` is called with the export's name just before the reply that enters transmission,
/// so [`Server::disconnect_export`] reaches a client as soon as its `NBD_OPT_GO` succeeds.
fn handshake<S: Read + Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
) -> io::Result<Option<Negotiated>> {
    let Some(mut st) = greet(s, Tls::Off)? else {
        return Ok(None);
    };
    match options(s, exports, quit, chosen, &mut st)? {
        Step::Go(n) => Ok(Some(n)),
        Step::End | Step::StartTls => Ok(None),
    }
}

/// TLS on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tls {
    /// Not offered (NOTLS): `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_POLICY`.
    Off,
    /// Required (FORCEDTLS) and not yet running: only `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT`
    /// are served.
    Required,
    /// Running.
    Active,
}

/// The state of option haggling.
struct Haggle {
    no_zeroes: bool,
    structured: bool,
    /// The export `base:allocation` was last selected for (`NBD_OPT_SET_META_CONTEXT`).
    meta: Option<String>,
    tls: Tls,
    /// Options received so far (across a TLS upgrade).
    options: usize,
}

/// How option haggling ended.
enum Step {
    /// The connection ends.
    End,
    /// Transmission begins.
    Go(Negotiated),
    /// `NBD_OPT_STARTTLS` was acknowledged: the TLS handshake comes next, then more options.
    StartTls,
}

/// Sends the greeting and reads the client's flags. `None`: the connection ends.
fn greet<S: Read + Write + ?Sized>(s: &mut S, tls: Tls) -> io::Result<Option<Haggle>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&proto::NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    s.flush()?;
    let cflags = read_u32(s)?;
    if cflags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Ok(None); // unknown client flags: the protocol says drop the connection
    }
    if cflags & proto::FLAG_C_FIXED_NEWSTYLE == 0 {
        return Ok(None); // only fixed newstyle clients are served
    }
    Ok(Some(Haggle {
        no_zeroes: cflags & proto::FLAG_C_NO_ZEROES != 0,
        structured: false,
        meta: None,
        tls,
        options: 0,
    }))
}

/// Option haggling, until transmission, the end, or a TLS upgrade.
fn options<S: Read + Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
    st: &mut Haggle,
) -> io::Result<Step> {
    let no_zeroes = st.no_zeroes;
    while st.options < MAX_OPTIONS {
        st.options += 1;
        let structured = st.structured;
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
        let option = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
        if magic != proto::IHAVEOPT {
            return Ok(Step::End);
        }
        if len > proto::MAX_OPTION_LEN {
            // Nothing this server understands is that long; do not read (or buffer) it.
            let _ = send_err(
                s,
                option,
                rep::ERR_TOO_BIG,
                "option data too long; closing the connection",
            );
            return Ok(Step::End);
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;
        if st.tls == Tls::Required {
            match option {
                opt::STARTTLS if len != 0 => {
                    send_err(
                        s,
                        option,
                        rep::ERR_INVALID,
                        "NBD_OPT_STARTTLS takes no data",
                    )?;
                }
                opt::STARTTLS => {
                    send_opt(s, option, rep::ACK, &[])?;
                    s.flush()?;
                    // Nothing negotiated before TLS survives it (nothing was, here).
                    st.structured = false;
                    st.meta = None;
                    return Ok(Step::StartTls);
                }
                opt::ABORT => {
                    let _ = send_opt(s, option, rep::ACK, &[]);
                    let _ = s.flush();
                    return Ok(Step::End);
                }
                // It cannot be answered with an error: the protocol says end the session.
                opt::EXPORT_NAME => return Ok(Step::End),
                _ => send_err(
                    s,
                    option,
                    rep::ERR_TLS_REQD,
                    "TLS is required: send NBD_OPT_STARTTLS first (with a client certificate \
                     this server's CA signed)",
                )?,
            }
            s.flush()?;
            continue;
        }
        match option {
            opt::EXPORT_NAME => {
                let Ok(name) = String::from_utf8(data) else {
                    return Ok(Step::End);
                };
                if quit.load(Ordering::Acquire) {
                    return Ok(Step::End);
                }
                let Ok(export) = exports.get(&name) else {
                    return Ok(Step::End);
                };
                let sizes = export.block_sizes();
                if sizes.check().is_err() {
                    return Ok(Step::End);
                }
                let size = export.size();
                let read_only = export.read_only();
                chosen(&name);
                let mut m = Vec::with_capacity(10 + 124);
                m.extend_from_slice(&size.to_be_bytes());
                m.extend_from_slice(&transmission_flags(read_only, structured).to_be_bytes());
                if !no_zeroes {
                    m.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&m)?;
                s.flush()?;
                return Ok(Step::Go(Negotiated {
                    export,
                    size,
                    sizes,
                    read_only,
                    structured,
                    block_status: structured && st.meta.as_deref() == Some(name.as_str()),
                    liberal: true,
                }));
            }
            opt::ABORT => {
                let _ = send_opt(s, option, rep::ACK, &[]);
                let _ = s.flush();
                return Ok(Step::End);
            }
            opt::LIST => {
                if len != 0 {
                    send_err(s, option, rep::ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                    continue;
                }
                for (name, desc) in exports.list() {
                    let name = cap_str(&name);
                    let desc = cap_str(&desc);
                    let mut d = Vec::with_capacity(4 + name.len() + desc.len());
                    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                    d.extend_from_slice(name.as_bytes());
                    d.extend_from_slice(desc.as_bytes());
                    send_opt(s, option, rep::SERVER, &d)?;
                }
                send_opt(s, option, rep::ACK, &[])?;
            }
            opt::STARTTLS if st.tls == Tls::Active => {
                send_err(s, option, rep::ERR_INVALID, "TLS is already running")?;
            }
            opt::STARTTLS => {
                send_err(
                    s,
                    option,
                    rep::ERR_POLICY,
                    "TLS is not configured on this listener",
                )?;
            }
            opt::STRUCTURED_REPLY => {
                if len != 0 {
                    send_err(
                        s,
                        option,
                        rep::ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                    continue;
                }
                st.structured = true;
                send_opt(s, option, rep::ACK, &[])?;
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                meta_context(s, exports, option, &data, st)?;
            }
            opt::INFO | opt::GO => {
                let Some((name, infos)) = parse_info_request(&data) else {
                    send_err(
                        s,
                        option,
                        rep::ERR_INVALID,
                        "malformed NBD_OPT_INFO/NBD_OPT_GO data",
                    )?;
                    continue;
                };
                if quit.load(Ordering::Acquire) {
                    send_err(s, option, rep::ERR_SHUTDOWN, "the server is shutting down")?;
                    continue;
                }
                let export = match exports.get(&name) {
                    Ok(e) => e,
                    Err(reason) => {
                        send_err(s, option, rep::ERR_UNKNOWN, &reason)?;
                        continue;
                    }
                };
                let sizes = export.block_sizes();
                if let Err(e) = sizes.check() {
                    send_err(
                        s,
                        option,
                        rep::ERR_UNKNOWN,
                        &format!("export {name:?}: {e}"),
                    )?;
                    continue;
                }
                let size = export.size();
                let read_only = export.read_only();
                let mut d = Vec::with_capacity(12);
                d.extend_from_slice(&info::EXPORT.to_be_bytes());
                d.extend_from_slice(&size.to_be_bytes());
                d.extend_from_slice(&transmission_flags(read_only, structured).to_be_bytes());
                send_opt(s, option, rep::INFO, &d)?;
                if infos.contains(&info::NAME) {
                    let mut d = info::NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(cap_str(&name).as_bytes());
                    send_opt(s, option, rep::INFO, &d)?;
                }
                if infos.contains(&info::DESCRIPTION)
                    && let Some(desc) = exports.description(&name)
                {
                    let mut d = info::DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(cap_str(&desc).as_bytes());
                    send_opt(s, option, rep::INFO, &d)?;
                }
                // Always sent: clients that did not ask may ignore it, and the server's
                // minimum (512) is above the protocol's default of 1.
                let mut d = info::BLOCK_SIZE.to_be_bytes().to_vec();
                d.extend_from_slice(&sizes.min.to_be_bytes());
                d.extend_from_slice(&sizes.preferred.to_be_bytes());
                d.extend_from_slice(&sizes.max.to_be_bytes());
                send_opt(s, option, rep::INFO, &d)?;
                if option == opt::GO {
                    chosen(&name);
                }
                send_opt(s, option, rep::ACK, &[])?;
                if option == opt::GO {
                    s.flush()?;
                    return Ok(Step::Go(Negotiated {
                        export,
                        size,
                        sizes,
                        read_only,
                        structured,
                        block_status: structured && st.meta.as_deref() == Some(name.as_str()),
                        liberal: !infos.contains(&info::BLOCK_SIZE),
                    }));
                }
            }
            _ => {
                send_err(s, option, rep::ERR_UNSUP, "option not supported")?;
            }
        }
        s.flush()?;
    }
    Ok(Step::End) // a client that never chooses an export
}

/// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`: the one context served is
/// `base:allocation` (listed for no query, `base:` or `base:allocation`; selected by
/// `base:allocation`); other queries are ignored, as the protocol says. A SET replaces the
/// selection, even when it fails.
fn meta_context<S: Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    option: u32,
    data: &[u8],
    st: &mut Haggle,
) -> io::Result<()> {
    let set = option == opt::SET_META_CONTEXT;
    if set {
        st.meta = None;
    }
    if !st.structured {
        return send_err(
            s,
            option,
            rep::ERR_INVALID,
            "metadata contexts need structured replies: send NBD_OPT_STRUCTURED_REPLY first",
        );
    }
    let Some((name, queries)) = proto::parse_meta_request(data) else {
        return send_err(
            s,
            option,
            rep::ERR_INVALID,
            "malformed NBD_OPT_LIST_META_CONTEXT/NBD_OPT_SET_META_CONTEXT data",
        );
    };
    if let Err(reason) = exports.get(&name) {
        return send_err(s, option, rep::ERR_UNKNOWN, &reason);
    }
    let base = proto::BASE_ALLOCATION;
    let chosen = if set {
        queries.iter().any(|q| q == base)
    } else {
        queries.is_empty() || queries.iter().any(|q| q == base || q == "base:")
    };
    if chosen {
        let mut d = proto::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        d.extend_from_slice(base.as_bytes());
        send_opt(s, option, rep::META_CONTEXT, &d)?;
        if set {
            st.meta = Some(name);
        }
    }
    send_opt(s, option, rep::ACK, &[])
}

/// Options accepted in one handshake.
const MAX_OPTIONS: usize = 1024;

/// What a handshake run by [`serve_handshake`] agreed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The export chosen.
    pub export: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its block sizes.
    pub sizes: BlockSizes,
    /// Whether it is read-only.
    pub read_only: bool,
    /// Whether structured replies were negotiated.
    pub structured: bool,
    /// Whether `base:allocation` was selected for the export (`NBD_CMD_BLOCK_STATUS` served).
    pub block_status: bool,
    /// Whether the client did not ask for `NBD_INFO_BLOCK_SIZE` (then requests at any byte
    /// offset and length are served; else they must respect `sizes.min`).
    pub liberal: bool,
}

/// Runs the server side of the fixed newstyle handshake on `stream` exactly as a connection
/// does (the same code), without the timeouts and bookkeeping of a [`Server`]: for tests,
/// fuzz targets (`fuzzing/`) and servers that accept connections themselves. `Ok(None)`: the
/// connection would end here; `Ok(Some)`: transmission would begin.
pub fn serve_handshake<S: Read + Write + ?Sized>(
    stream: &mut S,
    exports: &dyn Exports,
) -> io::Result<Option<Handshake>> {
    let mut name = String::new();
    let neg = handshake(stream, exports, &AtomicBool::new(false), &mut |n| {
        name = n.to_string()
    })?;
    Ok(neg.map(|n| Handshake {
        export: name,
        size: n.size,
        sizes: n.sizes,
        read_only: n.read_only,
        structured: n.structured,
        block_status: n.block_status,
        liberal: n.liberal,
    }))
}

/// One connection in transmission.
pub(crate) struct Conn {
    pub(crate) export: Arc<dyn Export>,
    /// Unaligned requests and what makes them atomic (`unaligned.rs`).
    pub(crate) rmw: crate::unaligned::Rmw,
    size: u64,
    sizes: BlockSizes,
    read_only: bool,
    structured: bool,
    block_status: bool,
    writer: Mutex<Box<dyn Write + Send>>,
    /// Replies waiting for the writer.
    pub(crate) replies: Mutex<VecDeque<Reply>>,
    /// Whether the socket has room now (see [`NbdStream::room_probe`]).
    room: Option<RoomProbe>,
    /// A write failed: replies are dropped, requests not yet started are skipped.
    pub(crate) dead: AtomicBool,
    pub(crate) closer: Closer,
    /// (requests, payload bytes) in flight, and whether a thread waits on `flight_cv`.
    flight: Mutex<Flight>,
    flight_cv: Condvar,
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) inner: Arc<Inner>,
    /// Set when the connection runs on a reactor (`reactor.rs`): the reactor alone writes
    /// the socket and counts what is in flight, so [`Conn::send`] and [`Conn::release`] only
    /// queue for it and wake it.
    pub(crate) wake: Option<Arc<crate::reactor::Waker>>,
}

/// Writes every byte of `parts` (gathered).
fn write_all_vectored(w: &mut (impl Write + ?Sized), parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut s = &mut slices[..];
    while !s.is_empty() {
        match w.write_vectored(s) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut s, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Requests and payload bytes in flight on a connection, and threads waiting for them to drop.
#[derive(Default)]
struct Flight {
    requests: usize,
    bytes: usize,
    waiters: usize,
}

/// A reply waiting to be written: its header (and error message), the read data, and the
/// in-flight slot (payload bytes) it releases once written.
pub(crate) struct Reply {
    pub(crate) head: Vec<u8>,
    pub(crate) data: Option<AlignedBuf>,
    pub(crate) slot: Option<usize>,
}

impl Conn {
    /// Queues `r` and writes queued replies unless another thread is writing (that thread
    /// then writes this one too): a worker never waits behind another's socket write, so a
    /// client that reads slowly holds at most one worker.
    pub(crate) fn send(&self, r: Reply) {
        lock(&self.replies).push_back(r);
        if let Some(w) = &self.wake {
            return w.wake();
        }
        self.send_queued();
    }

    /// Sends a reply from the connection's reader: written right here if it is small and the
    /// socket has room now, else queued for a worker to write. The reader must not block on a
    /// client that does not read its replies: it would stop reading that client's requests
    /// (a client writing a large WRITE before it reads would then never finish).
    fn send_from_reader(self: &Arc<Self>, r: Reply) {
        let len = r.head.len() + r.data.as_ref().map_or(0, |d| d.len());
        if len <= READER_REPLY_MAX && self.room.as_ref().is_some_and(|room| room()) {
            return self.send(r);
        }
        lock(&self.replies).push_back(r);
        let c = self.clone();
        self.inner.pool.submit(Box::new(move || c.send_queued()));
    }

    /// Writes queued replies unless another thread is writing them.
    fn send_queued(&self) {
        loop {
            let mut w = match self.writer.try_lock() {
                Ok(w) => w,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            self.write_queued(&mut **w);
            drop(w);
            // A reply queued after the last pop but before the unlock is ours to write.
            if lock(&self.replies).is_empty() {
                return;
            }
        }
    }

    /// Writes every queued reply (the caller holds the writer) and releases their slots.
    fn write_queued(&self, w: &mut (dyn Write + Send)) {
        loop {
            let Some(r) = lock(&self.replies).pop_front() else {
                return;
            };
            if !self.dead.load(Ordering::Acquire) {
                let data: &[u8] = r.data.as_deref().unwrap_or(&[]);
                let res = write_all_vectored(w, &[&r.head, data]).and_then(|_| w.flush());
                if res.is_err() {
                    self.dead.store(true, Ordering::Release);
                    (self.closer)(); // the reader wakes up and ends the connection
                }
            }
            if let Some(b) = r.slot {
                self.release(b);
            }
        }
    }

    pub(crate) fn reply_ok(&self, cookie: u64, slot: Option<usize>) {
        self.send(self.ok_reply(cookie, slot));
    }

    /// The reply to a request that succeeded without data.
    pub(crate) fn ok_reply(&self, cookie: u64, slot: Option<usize>) -> Reply {
        let head = if self.structured {
            proto::structured_header(reply::FLAG_DONE, reply::TYPE_NONE, cookie, 0).to_vec()
        } else {
            proto::simple_reply(0, cookie).to_vec()
        };
        Reply {
            head,
            data: None,
            slot,
        }
    }

    fn reply_err(&self, cookie: u64, err: u32, msg: &str, slot: Option<usize>) {
        self.send(self.err_reply(cookie, err, msg, slot));
    }

    /// The reply to a failed request.
    pub(crate) fn err_reply(&self, cookie: u64, err: u32, msg: &str, slot: Option<usize>) -> Reply {
        self.inner
            .stats
            .request_errors
            .fetch_add(1, Ordering::Relaxed);
        let head = if self.structured {
            let msg = cap_str(msg).as_bytes();
            let mut h = proto::structured_header(
                reply::FLAG_DONE,
                reply::TYPE_ERROR,
                cookie,
                6 + msg.len() as u32,
            )
            .to_vec();
            h.extend_from_slice(&err.to_be_bytes());
            h.extend_from_slice(&(msg.len() as u16).to_be_bytes());
            h.extend_from_slice(msg);
            h
        } else {
            proto::simple_reply(err, cookie).to_vec()
        };
        Reply {
            head,
            data: None,
            slot,
        }
    }

    /// The reply to a read, with its data.
    pub(crate) fn data_reply(
        &self,
        cookie: u64,
        offset: u64,
        data: AlignedBuf,
        slot: Option<usize>,
    ) -> Reply {
        let head = if self.structured {
            let sh = proto::structured_header(
                reply::FLAG_DONE,
                reply::TYPE_OFFSET_DATA,
                cookie,
                8 + data.len() as u32,
            );
            let mut h = Vec::with_capacity(sh.len() + 8);
            h.extend_from_slice(&sh);
            h.extend_from_slice(&offset.to_be_bytes());
            h
        } else {
            proto::simple_reply(0, cookie).to_vec()
        };
        Reply {
            head,
            data: Some(data),
            slot,
        }
    }

    /// The reply to `NBD_CMD_BLOCK_STATUS` of `len` bytes: one `base:allocation` chunk whose
    /// descriptors follow `ext` (runs of 512-byte blocks from `skip` bytes before the request's
    /// offset: 0 unless the offset is unaligned), cut at `len` bytes, at most 2^20 of them (the
    /// protocol's bound), only the first with `one` (`NBD_CMD_FLAG_REQ_ONE`). Holes are
    /// `HOLE | ZERO`, the rest 0 (allocated).
    pub(crate) fn block_status_reply(
        &self,
        cookie: u64,
        ext: &[Extent],
        mut skip: u64,
        len: u64,
        one: bool,
        slot: Option<usize>,
    ) -> Reply {
        let mut d = proto::BASE_ALLOCATION_ID.to_be_bytes().to_vec();
        let mut left = len;
        for e in ext {
            let run = e.blocks.saturating_mul(512);
            let before = skip.min(run);
            skip -= before;
            if before == run && run > 0 {
                continue; // wholly before the request's offset
            }
            let n = (run - before).min(left);
            if n == 0 {
                break;
            }
            let flags = if e.hole {
                proto::state::HOLE | proto::state::ZERO
            } else {
                0
            };
            d.extend_from_slice(&(n as u32).to_be_bytes());
            d.extend_from_slice(&flags.to_be_bytes());
            left -= n;
            if one || d.len() >= 4 + 8 * (1 << 20) {
                break;
            }
        }
        if d.len() == 4 {
            // Nothing known (an export that said nothing): all allocated.
            d.extend_from_slice(&(len as u32).to_be_bytes());
            d.extend_from_slice(&0u32.to_be_bytes());
        }
        let mut head = proto::structured_header(
            reply::FLAG_DONE,
            reply::TYPE_BLOCK_STATUS,
            cookie,
            d.len() as u32,
        )
        .to_vec();
        head.extend_from_slice(&d);
        Reply {
            head,
            data: None,
            slot,
        }
    }

    /// Takes an in-flight slot for a request with `bytes` of payload, waiting while the
    /// connection is at its bounds.
    fn acquire(&self, bytes: usize) {
        let mut g = lock(&self.flight);
        while g.requests >= self.max_in_flight
            || (g.bytes > 0 && g.bytes.saturating_add(bytes) > self.max_in_flight_bytes)
        {
            g = self.wait_flight(g);
        }
        g.requests += 1;
        g.bytes += bytes;
        let n = g.requests as u64;
        drop(g);
        self.inner
            .stats
            .in_flight_max
            .fetch_max(n, Ordering::Relaxed);
    }

    pub(crate) fn release(&self, bytes: usize) {
        if self.wake.is_some() {
            // The reactor counts: an empty reply carrying the slot gives it back.
            return self.send(Reply {
                head: Vec::new(),
                data: None,
                slot: Some(bytes),
            });
        }
        let mut g = lock(&self.flight);
        g.requests -= 1;
        g.bytes -= bytes;
        // A notify is a system call: only when the reader (or `drain`) waits.
        let wake = g.waiters > 0;
        drop(g);
        if wake {
            self.flight_cv.notify_all();
        }
    }

    /// Waits on `flight_cv`, counted so `release` knows to notify.
    fn wait_flight<'a>(&self, mut g: MutexGuard<'a, Flight>) -> MutexGuard<'a, Flight> {
        g.waiters += 1;
        let mut g = self.flight_cv.wait(g).unwrap_or_else(|e| e.into_inner());
        g.waiters -= 1;
        g
    }

    /// Waits until every request in flight has been answered and every queued reply written.
    fn drain(&self) {
        let mut g = lock(&self.flight);
        while g.requests > 0 {
            g = self.wait_flight(g);
        }
        drop(g);
        // Replies without a slot (errors and empty replies the reader sends itself) may still be
        // queued behind a worker that is writing (found by the `nbd_session` fuzz target: the
        // socket was shut with the reply to a refused request still queued). Taking the writer
        // waits for that worker; whatever it left is written here.
        let mut w = lock(&self.writer);
        self.write_queued(&mut **w);
    }

    /// Checks a request against the export; `Err((errno, message))` to answer it with.
    pub(crate) fn check(&self, r: &Request) -> Result<(), (u32, String)> {
        r.check_on(self.size, self.sizes, self.read_only, self.block_status)
    }
}

/// A request in flight: its slot goes with its reply; if it is dropped unanswered (a
/// panicking export) it answers EIO.
pub(crate) struct InFlight {
    pub(crate) conn: Arc<Conn>,
    pub(crate) cookie: u64,
    pub(crate) slot: Option<usize>,
    /// The request's command and length, and when it was received (`latency.rs`).
    pub(crate) typ: u16,
    pub(crate) len: u32,
    pub(crate) start: std::time::Instant,
}

impl InFlight {
    /// The guard of `req` on `conn`, its slot the request's data bytes, received now.
    pub(crate) fn new(conn: &Arc<Conn>, req: &Request) -> InFlight {
        InFlight {
            conn: conn.clone(),
            cookie: req.cookie,
            slot: Some(req.data_bytes()),
            typ: req.typ,
            len: req.len,
            start: std::time::Instant::now(),
        }
    }

    /// Takes the slot, to be released by the reply that carries it.
    fn take(&mut self) -> Option<usize> {
        self.slot.take()
    }

    /// Takes the slot for the reply being made (`ok`: not an error), counting the request.
    pub(crate) fn reply(&mut self, ok: bool) -> Option<usize> {
        crate::latency::record(&self.conn, self.typ, self.len.into(), self.start, ok);
        self.take()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(b) = self.slot.take() {
            self.conn.reply_err(
                self.cookie,
                errno::EIO,
                "internal error in the server",
                Some(b),
            );
        }
    }
}

/// Reads and discards `n` bytes (the payload of a refused write).
fn discard(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut buf = [0u8; 16 << 10];
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// The reader side of a connection: parses requests, answers bad ones itself, hands good
/// ones to the workers. Returns at `NBD_CMD_DISC`, end of stream, a read error or a bad magic.
fn transmission(conn: &Arc<Conn>, r: &mut impl Read) -> io::Result<()> {
    let inner = &conn.inner;
    loop {
        let mut h = [0u8; proto::REQUEST_LEN];
        r.read_exact(&mut h)?;
        let Some(req) = Request::decode(&h) else {
            return Ok(()); // not a request: the stream is out of sync, close
        };
        if req.typ == cmd::DISC {
            return Ok(());
        }
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        if let Err((e, msg)) = conn.check(&req) {
            if req.typ == cmd::WRITE {
                discard(r, req.len as u64)?;
            }
            conn.reply_err(req.cookie, e, &msg, None);
            continue;
        }
        if req.len == 0 && req.typ != cmd::FLUSH {
            conn.reply_ok(req.cookie, None);
            continue;
        }
        let bytes = req.data_bytes();
        conn.acquire(bytes);
        let mut guard = InFlight::new(conn, &req);
        // A READ's buffer, when the export left the read to a worker.
        let mut read_buf = None;
        if req.typ == cmd::READ && conn.rmw.aligned(&req) && !conn.dead.load(Ordering::Acquire) {
            // A read that needs no waiting (a hit in a RAM cache) is answered from here: no
            // hand-off to a worker and back. One that waits for a device goes to a worker.
            match conn.export.read_start(req.offset, AlignedBuf::new(bytes)) {
                ReadStart::Done(reply) => {
                    answer_read(conn, &req, reply, guard, true);
                    continue;
                }
                ReadStart::Pending(finish) => {
                    let c = conn.clone();
                    inner.pool.submit(Box::new(move || {
                        let reply = finish();
                        answer_read(&c, &req, reply, guard, false);
                    }));
                    continue;
                }
                ReadStart::NotStarted(buf) => read_buf = Some(buf),
            }
        }
        let payload = if req.typ == cmd::WRITE {
            let mut buf = AlignedBuf::new(bytes);
            if let Err(e) = r.read_exact(&mut buf) {
                // The client is gone; nobody to answer.
                if let Some(b) = guard.take() {
                    conn.release(b);
                }
                return Err(e);
            }
            guard.start = std::time::Instant::now();
            Some(buf)
        } else {
            read_buf
        };
        let c = conn.clone();
        inner
            .pool
            .submit(Box::new(move || execute(&c, req, payload, guard)));
    }
}

/// Answers a read with its data or its error, from the connection's reader or a worker.
pub(crate) fn answer_read(
    c: &Arc<Conn>,
    req: &Request,
    reply: ReadReply,
    mut guard: InFlight,
    from_reader: bool,
) {
    let r = match reply {
        (Ok(()), buf) => c.data_reply(req.cookie, req.offset, buf, guard.reply(true)),
        (Err(err), _) => c.err_reply(
            req.cookie,
            err.errno(),
            &err.to_string(),
            guard.reply(false),
        ),
    };
    if from_reader {
        c.send_from_reader(r);
    } else {
        c.send(r);
    }
}

/// Runs one request on a worker and answers it. `payload`: a WRITE's data, or a READ's buffer
/// if the reader made one.
pub(crate) fn execute(
    c: &Arc<Conn>,
    req: Request,
    payload: Option<AlignedBuf>,
    mut guard: InFlight,
) {
    if c.dead.load(Ordering::Acquire) && req.typ != cmd::WRITE {
        // Nobody will read the answer.
        if let Some(b) = guard.take() {
            c.release(b);
        }
        return;
    }
    let Some(admitted) = c.rmw.admitted(&req) else {
        return crate::unaligned::execute(c, req, payload, guard);
    };
    let e = &c.export;
    let fua = req.flags & cmd::FLAG_FUA != 0;
    let len = req.len as u64;
    let r = match req.typ {
        cmd::READ => {
            let buf = payload.unwrap_or_else(|| AlignedBuf::new(req.len as usize));
            return answer_read(c, &req, e.read_owned(req.offset, buf), guard, false);
        }
        cmd::WRITE => {
            let buf = payload.unwrap_or_else(|| AlignedBuf::new(req.len as usize));
            e.write_owned(req.offset, buf, fua).0
        }
        cmd::FLUSH => e.flush(),
        cmd::TRIM => e
            .trim(req.offset, len)
            .and_then(|_| if fua { e.flush() } else { Ok(()) }),
        // NO_HOLE needs nothing (zeros are written either way) and FAST_ZERO is honoured
        // because zeroing is always fast here.
        cmd::WRITE_ZEROES => e.write_zeroes(req.offset, len, fua),
        cmd::CACHE => e.cache(req.offset, len),
        cmd::BLOCK_STATUS => match e.extents(req.offset, len) {
            Ok(ext) => {
                let one = req.flags & cmd::FLAG_REQ_ONE != 0;
                return c.send(c.block_status_reply(
                    req.cookie,
                    &ext,
                    0,
                    len,
                    one,
                    guard.reply(true),
                ));
            }
            Err(e) => Err(e),
        },
        _ => Err(ExportError::Invalid),
    };
    drop(admitted);
    answer(c, &req, r, guard);
}

/// Answers a request without data with its result.
pub(crate) fn answer(c: &Conn, req: &Request, r: Result<(), ExportError>, mut guard: InFlight) {
    match r {
        Ok(()) => c.reply_ok(req.cookie, guard.reply(true)),
        Err(err) => c.reply_err(
            req.cookie,
            err.errno(),
            &err.to_string(),
            guard.reply(false),
        ),
    }
}

/// Binds a unix socket at `path` with `mode`, without a moment where it has other
/// permissions: it is bound inside a fresh 0700 directory next to `path`, chmodded, then
/// renamed into place. A socket file already at `path` is removed only if nothing listens.
fn bind_unix(path: &Path, mode: u32, group: Option<u32>) -> Result<UnixListener, String> {
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "NBD socket {shown} is in use by a running server; stop it or choose \
                     another path"
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .map_err(|e| format!("removing stale NBD socket {shown}: {e}"))?;
            }
            Err(e) => return Err(format!("NBD socket {shown} exists and is not usable: {e}")),
        },
        Ok(_) => {
            return Err(format!(
                "{shown} exists and is not a socket; refusing to replace it"
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("NBD socket {shown}: {e}")),
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let fname = path
        .file_name()
        .ok_or_else(|| format!("NBD socket path {shown} has no file name"))?
        .to_string_lossy()
        .into_owned();
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmpdir = parent.join(format!(
        ".{fname}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = tmpdir.join("s");
    if tmp.as_os_str().len() < 100
        && std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmpdir)
            .is_ok()
    {
        let r = (|| {
            let l =
                UnixListener::bind(&tmp).map_err(|e| format!("binding NBD socket {shown}: {e}"))?;
            if group.is_some() {
                std::os::unix::fs::chown(&tmp, None, group)
                    .map_err(|e| format!("chgrp NBD socket {shown}: {e}"))?;
            }
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod NBD socket {shown}: {e}"))?;
            std::fs::rename(&tmp, path).map_err(|e| format!("placing NBD socket {shown}: {e}"))?;
            Ok(l)
        })();
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir(&tmpdir);
        return r;
    }
    // The path is too long for a temporary name (or the directory is not writable for one):
    // bind in place and chmod at once.
    let l = UnixListener::bind(path).map_err(|e| format!("binding NBD socket {shown}: {e}"))?;
    let r = match group {
        Some(g) => std::os::unix::fs::chown(path, None, Some(g)),
        None => Ok(()),
    }
    .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)));
    if let Err(e) = r {
        let _ = std::fs::remove_file(path);
        return Err(format!("chmod/chgrp NBD socket {shown}: {e}"));
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{BackendExport, ExportMap};
    use std::io::Cursor;
    use tiercache_io::RamBackend;

    /// An in-memory stream: reads from `input`, collects what is written.
    struct Mem {
        input: Cursor<Vec<u8>>,
        out: Vec<u8>,
    }

    impl Read for Mem {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.input.read(b)
        }
    }

    impl Write for Mem {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.out.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn exports() -> ExportMap {
        let m = ExportMap::new();
        m.insert(
            "a",
            "desc",
            Arc::new(BackendExport::new(Arc::new(RamBackend::new(16)))),
        );
        m.refuse("b", "", "not served");
        m
    }

    fn option(buf: &mut Vec<u8>, o: u32, data: &[u8]) {
        buf.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        buf.extend_from_slice(&o.to_be_bytes());
        buf.extend_from_slice(&(data.len() as u32).to_be_bytes());
        buf.extend_from_slice(data);
    }

    #[test]
    fn info_request_parsing() {
        assert_eq!(
            parse_info_request(&[0, 0, 0, 1, b'a', 0, 1, 0, 3]),
            Some(("a".into(), vec![3]))
        );
        assert_eq!(
            parse_info_request(&[0, 0, 0, 0, 0, 0]),
            Some((String::new(), vec![]))
        );
        for bad in [
            &[][..],
            &[0, 0, 0, 5, b'a'],
            &[0, 0, 0, 1, b'a', 0, 2, 0, 3],
            &[0, 0, 0, 1, b'a', 0, 0, 9],
            &[0, 0, 0, 1, 0xff, 0, 0],
            &[0xff, 0xff, 0xff, 0xff, 0, 0],
        ] {
            assert_eq!(parse_info_request(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn handshake_go_and_list() {
        let mut i = proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(&mut i, opt::LIST, &[]);
        option(&mut i, 1234, b"x");
        option(&mut i, opt::GO, &[0, 0, 0, 1, b'b', 0, 0]);
        option(&mut i, opt::STRUCTURED_REPLY, &[]);
        option(&mut i, opt::GO, &[0, 0, 0, 1, b'a', 0, 0]);
        let mut m = Mem {
            input: Cursor::new(i),
            out: vec![],
        };
        let n = handshake(&mut m, &exports(), &AtomicBool::new(false), &mut |_| {})
            .unwrap()
            .expect("GO succeeds");
        assert!(n.structured);
        assert_eq!(n.size, 16 * 512);
        assert_eq!(m.input.position() as usize, m.input.get_ref().len());
    }

    /// Seeded structure-aware loop (SPEC R5): option sequences with random types, lengths and
    /// bytes, cut at random points; the handshake must end cleanly, never panic.
    #[test]
    fn handshake_never_panics_on_random_input() {
        let ex = exports();
        let quit = AtomicBool::new(false);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut went, mut ended) = (0, 0);
        for _ in 0..20_000 {
            let mut i = match rnd() % 8 {
                0 => (rnd() as u32).to_be_bytes().to_vec(),
                _ => proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec(),
            };
            for _ in 0..rnd() % 5 {
                let o = [1, 2, 3, 5, 6, 7, 8, 9, rnd() as u32][(rnd() % 9) as usize];
                let mut d: Vec<u8> = (0..rnd() % 24).map(|_| rnd() as u8).collect();
                if rnd() % 2 == 0 && (o == opt::GO || o == opt::INFO) {
                    let name = [&b"a"[..], b"b", b"zz"][(rnd() % 3) as usize];
                    d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name);
                    let k = rnd() % 4;
                    d.extend_from_slice(&(k as u16).to_be_bytes());
                    for _ in 0..k {
                        d.extend_from_slice(&((rnd() % 5) as u16).to_be_bytes());
                    }
                }
                if rnd() % 16 == 0 {
                    i.extend_from_slice(&rnd().to_be_bytes()); // a bad magic
                } else {
                    option(&mut i, o, &d);
                }
                if rnd() % 16 == 0 {
                    let l = i.len();
                    i[l - 3..].copy_from_slice(&[0xff, 0xff, 0xff]); // a huge length
                }
            }
            let cut = (rnd() as usize) % (i.len() + 1);
            if rnd() % 4 == 0 {
                i.truncate(cut);
            }
            let mut m = Mem {
                input: Cursor::new(i),
                out: vec![],
            };
            match handshake(&mut m, &ex, &quit, &mut |_| {}) {
                Ok(Some(_)) => went += 1,
                _ => ended += 1,
            }
        }
        println!("transmission reached {went}, ended in the handshake {ended}");
        assert!(went > 100 && ended > 100);
    }

    /// FORCEDTLS before the upgrade, on random option sequences: nothing but STARTTLS and
    /// ABORT is ever acknowledged, no export information leaks, transmission is never entered,
    /// and every other option gets `NBD_REP_ERR_TLS_REQD` (or `ERR_TOO_BIG`/`ERR_INVALID`).
    #[test]
    fn forced_tls_answers_nothing_before_starttls() {
        let ex = exports();
        let quit = AtomicBool::new(false);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut upgraded, mut ended, mut refused) = (0, 0, 0u64);
        for _ in 0..20_000 {
            let mut i = proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            for _ in 0..rnd() % 6 {
                let o = [1, 2, 3, 5, 6, 7, 8, 9, rnd() as u32][(rnd() % 9) as usize];
                let mut d: Vec<u8> = (0..rnd() % 12).map(|_| rnd() as u8).collect();
                if o == opt::STARTTLS && rnd() % 2 == 0 {
                    d.clear();
                }
                if o == opt::GO || o == opt::INFO {
                    d = vec![0, 0, 0, 1, b'a', 0, 0];
                }
                option(&mut i, o, &d);
            }
            if rnd() % 4 == 0 {
                let cut = (rnd() as usize) % (i.len() + 1);
                i.truncate(cut);
            }
            let mut m = Mem {
                input: Cursor::new(i),
                out: vec![],
            };
            let step = greet(&mut m, Tls::Required)
                .ok()
                .flatten()
                .map(|mut st| options(&mut m, &ex, &quit, &mut |_| {}, &mut st));
            match step {
                Some(Ok(Step::StartTls)) => upgraded += 1,
                Some(Ok(Step::Go(_))) => panic!("transmission entered without TLS"),
                _ => ended += 1,
            }
            // Every option reply sent: 20-byte header (magic, option, type, length) + data.
            let out = &m.out[18..];
            let mut k = 0;
            while k + 20 <= out.len() {
                let o = u32::from_be_bytes(out[k + 8..k + 12].try_into().unwrap());
                let t = u32::from_be_bytes(out[k + 12..k + 16].try_into().unwrap());
                let l = u32::from_be_bytes(out[k + 16..k + 20].try_into().unwrap()) as usize;
                match t {
                    rep::ACK => assert!(o == opt::STARTTLS || o == opt::ABORT, "ACK to {o}"),
                    rep::ERR_INVALID => assert_eq!(o, opt::STARTTLS),
                    rep::ERR_TLS_REQD => refused += 1,
                    rep::ERR_TOO_BIG => {}
                    t => panic!("reply {t:#x} to option {o} before TLS"),
                }
                k += 20 + l;
            }
            assert_eq!(k, out.len(), "only whole option replies");
        }
        println!("upgraded {upgraded}, ended {ended}, ERR_TLS_REQD replies {refused}");
        assert!(upgraded > 1000 && ended > 1000 && refused > 1000);
    }
}
