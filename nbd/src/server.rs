//! The server: its configuration, listeners, the worker pool, statistics, and each connection's
//! life (handshake in `handshake.rs`, then transmission on the reactor, `reactor.rs`, or on
//! threads, `transmission.rs`).

use crate::export::Exports;
use crate::tls::{Sock, TlsConfig};
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

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
    /// Submission queue entries of each reactor's ring (256; the kernel rounds up to a power
    /// of two). A full queue is submitted and reaped, never refused: tests make it tiny.
    pub ring_entries: u32,
}

/// One log line through the daemon's one formatter (`tiercache_io::log`).
pub(crate) fn log_line(level: &str, msg: &str, kv: &[(&str, String)]) {
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
            ring_entries: 256,
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
    pub(crate) accepted: AtomicU64,
    pub(crate) open: AtomicU64,
    pub(crate) transmitting: AtomicU64,
    pub(crate) handshake_ended: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) request_errors: AtomicU64,
    pub(crate) in_flight_max: AtomicU64,
    pub(crate) tls_refused: AtomicU64,
    pub(crate) fixed_ios: AtomicU64,
    pub(crate) reply_writes: AtomicU64,
}

pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The most bytes of one reply a connection's reader writes itself (when the socket has room).
pub(crate) const READER_REPLY_MAX: usize = 64 << 10;

/// The worker pool's queue: jobs, "quit", and how many workers wait for a job.
pub(crate) struct PoolQueue {
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

pub(crate) struct ConnEntry {
    pub(crate) closer: Closer,
    pub(crate) thread: Option<JoinHandle<()>>,
    /// The export chosen, once in transmission.
    pub(crate) export: Option<String>,
}

pub(crate) struct ListenerEntry {
    thread: JoinHandle<()>,
    /// A unix socket file to remove at shutdown if it is still ours (device, inode).
    unix: Option<(PathBuf, u64, u64)>,
}

pub(crate) struct Inner {
    pub(crate) exports: Arc<dyn Exports>,
    pub(crate) cfg: ServerConfig,
    pub(crate) quit: AtomicBool,
    pub(crate) pool: Pool,
    pub(crate) conns: Mutex<(HashMap<u64, ConnEntry>, u64)>,
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
pub(crate) fn accept_loop(
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

pub(crate) fn spawn_conn(inner: &Arc<Inner>, stream: Box<dyn NbdStream>, tls: Option<TlsConfig>) {
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

pub(crate) fn run_conn(
    inner: &Arc<Inner>,
    id: u64,
    stream: Box<dyn NbdStream>,
    tls: Option<TlsConfig>,
) {
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

use crate::handshake::conn_handshake;
use crate::transmission::{Conn, Flight, transmission};

/// Binds a unix socket at `path` with `mode`, without a moment where it has other
/// permissions: it is bound inside a fresh 0700 directory next to `path`, chmodded, then
/// renamed into place. A socket file already at `path` is removed only if nothing listens.
pub(crate) fn bind_unix(
    path: &Path,
    mode: u32,
    group: Option<u32>,
) -> Result<UnixListener, String> {
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
