//! TLS for NBD (`NBD_OPT_STARTTLS`, the protocol's FORCEDTLS mode) with rustls and its
//! `aws-lc-rs` provider (whose RSA takes keys of 2048 to 8192 bits of any size; `ring`'s took
//! only 2048, 3072 and 4096, and refused a 2432-bit `certtool` key; `tls_key.rs` says which keys
//! are taken): the server's certificate and key, and a CA that every client's certificate must
//! chain to (client certificates are required).
//!
//! After the server has acknowledged `NBD_OPT_STARTTLS`, the connection's socket is wrapped in
//! a [`TlsStream`]: the TLS handshake runs on the connection thread, option haggling goes on
//! inside TLS, and for transmission the stream splits into a read half (the connection's
//! reader thread) and a write half (the workers), which share the rustls state under a lock
//! that is never held across a blocking socket read. Ciphertext leaves in the order it was
//! produced: the socket's write lock is taken before the state's lock is let go. The read
//! half never waits for the write half: what it has to send (an alert, a key update) waits in
//! the session for the write half's next write when the write half is busy.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::ServerConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::server::{Closer, NbdStream};

/// The TLS settings of a listener: the server's certificate chain and key, and the CA that
/// client certificates must chain to. Cheap to clone (shared).
#[derive(Clone)]
pub struct TlsConfig {
    server: Arc<rustls::ServerConfig>,
    what: String,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("files", &self.what)
            .finish()
    }
}

fn pem_err(what: &str, path: &Path, e: rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::NoItemsFound => format!(
            "{what} {}: no PEM item of the expected kind",
            path.display()
        ),
        E::Io(e) => format!("{what} {}: {e}", path.display()),
        e => format!("{what} {}: not valid PEM ({e})", path.display()),
    }
}

fn read_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(what, path, e))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no certificate (a PEM \"BEGIN CERTIFICATE\" block) in it",
            path.display()
        ));
    }
    Ok(certs)
}

impl TlsConfig {
    /// Loads PEM files: `cert` (the server's certificate, then any intermediates), `key` (its
    /// private key: PKCS#8, PKCS#1 or SEC1) and `client_ca` (one or more CA certificates;
    /// clients must present a certificate that chains to one of them). Errors are one line
    /// naming the file.
    pub fn from_files(cert: &Path, key: &Path, client_ca: &Path) -> Result<TlsConfig, String> {
        let chain = read_certs("TLS certificate", cert)?;
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                let found = std::fs::read_to_string(key)
                    .map(|t| crate::tls_key::pem_labels(&t))
                    .unwrap_or_default();
                let found = if found.is_empty() {
                    "no PEM block".to_string()
                } else {
                    format!("only {}", found.join(", "))
                };
                format!(
                    "TLS key {}: no private key (PEM \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC \
                     PRIVATE KEY\") in it, {found}; {}",
                    key.display(),
                    crate::tls_key::SUPPORTED
                )
            }
            e => pem_err("TLS key", key, e),
        })?;
        crate::tls_key::classify(&key_der)
            .check()
            .map_err(|e| format!("TLS key {}: {e}", key.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs("TLS client CA", client_ca)? {
            roots.add(c).map_err(|e| {
                format!(
                    "TLS client CA {}: a certificate rustls cannot use as a trust anchor: {e}",
                    client_ca.display()
                )
            })?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| format!("TLS client CA {}: {e}", client_ca.display()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key_der)
            .map_err(|e| {
                format!(
                    "TLS certificate {} with key {}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
        Ok(TlsConfig {
            server: Arc::new(server),
            what: format!(
                "cert={} key={} client-ca={}",
                cert.display(),
                key.display(),
                client_ca.display()
            ),
        })
    }

    /// A configuration built by the caller (any rustls server settings).
    pub fn from_rustls(server: Arc<rustls::ServerConfig>) -> TlsConfig {
        TlsConfig {
            server,
            what: "custom".into(),
        }
    }
}

/// The socket under a TLS session.
pub(crate) enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    fn fd(&self) -> RawFd {
        match self {
            Sock::Unix(s) => s.as_raw_fd(),
            Sock::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Sock::Unix(s) => s.shutdown(Shutdown::Both),
            Sock::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for &Sock {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).read(b),
            Sock::Tcp(s) => (&*s).read(b),
        }
    }
}

impl Write for &Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match *self {
            Sock::Unix(s) => (&*s).write(b),
            Sock::Tcp(s) => (&*s).write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What both halves share.
struct Shared {
    conn: Mutex<ServerConnection>,
    /// Held while ciphertext is written, taken before `conn` is let go.
    wlock: Mutex<()>,
    sock: Sock,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// rustls's end of stream without `close_notify`, in this server's words (many clients end
/// that way after `NBD_CMD_DISC`).
fn eof_err(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the client closed the connection without a TLS close_notify",
        )
    } else {
        e
    }
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl Shared {
    /// Writes whatever TLS output `c` holds (records, alerts), in order.
    fn send(&self, mut c: MutexGuard<'_, ServerConnection>, out: &mut Vec<u8>) -> io::Result<()> {
        if !c.wants_write() {
            return Ok(());
        }
        out.clear();
        while c.wants_write() {
            c.write_tls(out)?;
        }
        let _w = lock(&self.wlock);
        drop(c);
        (&self.sock).write_all(out)
    }

    /// As [`Shared::send`], for the read half: if the write half is busy writing (perhaps
    /// blocked on a client that is itself blocked writing to us), the output stays queued in
    /// the session and the write half sends it first with its next write, so the read half
    /// never waits for the write half.
    fn send_from_reader(
        &self,
        mut c: MutexGuard<'_, ServerConnection>,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        if !c.wants_write() {
            return Ok(());
        }
        let _w = match self.wlock.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
        };
        out.clear();
        while c.wants_write() {
            c.write_tls(out)?;
        }
        drop(c);
        (&self.sock).write_all(out)
    }
}

/// A TLS session over a connection's socket, established by [`accept`].
pub(crate) struct TlsStream {
    rd: TlsReader,
    wr: TlsWriter,
}

/// The read half: decrypts what arrives, reading the socket without holding the TLS state.
pub(crate) struct TlsReader {
    shared: Arc<Shared>,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    out: Vec<u8>,
}

/// The write half: encrypts and writes.
pub(crate) struct TlsWriter {
    shared: Arc<Shared>,
    out: Vec<u8>,
}

/// Runs the server side of a TLS handshake on `sock` (whose timeouts bound it). A client
/// without a certificate the CA vouches for fails here, with the alert sent.
pub(crate) fn accept(sock: Sock, cfg: &TlsConfig) -> io::Result<TlsStream> {
    let mut conn = ServerConnection::new(cfg.server.clone()).map_err(tls_err)?;
    {
        let mut s = &sock;
        while conn.is_handshaking() {
            let (r, w) = conn.complete_io(&mut s)?;
            if r == 0 && w == 0 && conn.is_handshaking() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "TLS: the client closed the connection in the handshake",
                ));
            }
        }
        while conn.wants_write() {
            conn.write_tls(&mut s)?;
        }
    }
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        wlock: Mutex::new(()),
        sock,
    });
    Ok(TlsStream {
        rd: TlsReader {
            shared: shared.clone(),
            buf: vec![0u8; 64 << 10].into_boxed_slice(),
            pos: 0,
            len: 0,
            out: Vec::new(),
        },
        wr: TlsWriter {
            shared,
            out: Vec::new(),
        },
    })
}

impl TlsStream {
    /// The negotiated protocol version and cipher suite, for logs.
    pub(crate) fn describe(&self) -> String {
        let c = lock(&self.rd.shared.conn);
        format!(
            "{}/{}",
            c.protocol_version()
                .map(|v| format!("{v:?}"))
                .unwrap_or_default(),
            c.negotiated_cipher_suite()
                .map(|s| format!("{:?}", s.suite()))
                .unwrap_or_default()
        )
    }
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let mut c = lock(&self.shared.conn);
            let mut stalled = None;
            while self.pos < self.len {
                let mut s = &self.buf[self.pos..self.len];
                match c.read_tls(&mut s) {
                    Ok(0) => break, // a close_notify was received: nothing more is taken
                    Ok(k) => self.pos += k,
                    Err(e) => {
                        // Backpressure (plaintext not read yet): read it first.
                        stalled = Some(e);
                        break;
                    }
                }
                if let Err(e) = c.process_new_packets() {
                    let _ = self.shared.send_from_reader(c, &mut self.out); // the alert
                    return Err(tls_err(e));
                }
            }
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(eof_err(e)),
            }
            if let Some(e) = stalled {
                return Err(e);
            }
            if self.pos < self.len {
                // Taken nothing, yet gave nothing: only after a close_notify.
                return Ok(0);
            }
            // Answers to what arrived (key updates), then wait for more without the lock.
            self.shared.send_from_reader(c, &mut self.out)?;
            let n = (&self.shared.sock).read(&mut self.buf)?;
            self.pos = 0;
            self.len = n;
            if n == 0 {
                let mut c = lock(&self.shared.conn);
                let _ = c.read_tls(&mut &[][..]); // records the end of the stream
                return match c.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    r => r.map_err(eof_err),
                };
            }
        }
    }
}

impl Write for TlsWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut c = lock(&self.shared.conn);
        let n = c.writer().write(data)?;
        self.shared.send(c, &mut self.out)?;
        Ok(n)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut c = lock(&self.shared.conn);
        let n = c.writer().write_vectored(bufs)?;
        self.shared.send(c, &mut self.out)?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(()) // every write is sent at once
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.rd.read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.wr.write(data)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.wr.write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl NbdStream for TlsStream {
    fn split(self: Box<Self>) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        let s = *self;
        Ok((Box::new(s.rd), Box::new(s.wr)))
    }

    /// The socket's room: a reply's records are a little larger than the reply, well inside
    /// what a writable socket takes.
    fn room_probe(&self) -> Option<crate::server::RoomProbe> {
        let sh = self.rd.shared.clone();
        Some(Arc::new(move || crate::server::poll_writable(sh.sock.fd())))
    }

    /// Sends a `close_notify` if that cannot block (the state and the socket's write side are
    /// free and the socket takes it at once), then shuts the socket down.
    fn closer(&self) -> io::Result<Closer> {
        let sh = self.rd.shared.clone();
        Ok(Arc::new(move || {
            if let Ok(mut c) = sh.conn.try_lock() {
                c.send_close_notify();
                let mut out = Vec::new();
                while c.wants_write() {
                    if c.write_tls(&mut out).is_err() {
                        break;
                    }
                }
                if let Ok(_w) = sh.wlock.try_lock() {
                    // SAFETY: the fd is open (owned by `sh`), `out` is valid for reads of its
                    // length; MSG_DONTWAIT makes this a best effort that never blocks.
                    unsafe {
                        libc::send(
                            sh.sock.fd(),
                            out.as_ptr().cast(),
                            out.len(),
                            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                        )
                    };
                }
            }
            sh.sock.shutdown();
        }))
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.rd.shared.sock {
            Sock::Unix(s) => s.set_read_timeout(t),
            Sock::Tcp(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match &self.rd.shared.sock {
            Sock::Unix(s) => s.set_write_timeout(t),
            Sock::Tcp(s) => s.set_write_timeout(t),
        }
    }

    fn start_tls(self: Box<Self>, _: &TlsConfig) -> io::Result<Box<dyn NbdStream>> {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "TLS is already running on this connection",
        ))
    }

    fn tls_info(&self) -> Option<String> {
        Some(self.describe())
    }
}
