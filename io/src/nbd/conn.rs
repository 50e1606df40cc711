//! One transmission-phase connection: callers send under a mutex, one reader thread receives
//! replies (in any order) and hands each to the caller waiting on its cookie.
//!
//! A connection that fails (EOF, a socket error, a protocol error, a timed-out request, a send
//! that failed halfway) is dead for good: every request waiting on it and every later one gets
//! an error carrying the first reason. Whether the *server* ended it (EOF, a reset, a broken
//! pipe: it can no longer carry out anything sent on it) or this side did (a timeout, a protocol
//! error, a close) is kept too: only the first kind may be replaced by a new connection
//! (`NbdBackend`'s reconnection).

use super::proto::{self, Sock, cmd};
use crate::IoErr;
use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tiercache_nbd_proto::SimpleReply;

/// What a caller receives: the payload of a read (empty for other commands) or the error.
type Reply = Result<Vec<u8>, IoErr>;

/// A request waiting for its reply.
struct Waiter {
    tx: Sender<Reply>,
    command: u16,
    offset: u64,
    len: u32,
}

#[derive(Default)]
struct State {
    next_cookie: u64,
    pending: HashMap<u64, Waiter>,
    /// Why the connection is dead, once it is.
    dead: Option<String>,
    /// The server ended it (see the module docs).
    server_ended: bool,
}

/// Called once when a connection dies (after its waiters were failed).
pub(crate) type OnDeath = Box<dyn Fn() + Send + Sync>;

/// A connection in the transmission phase.
pub(crate) struct Conn {
    /// The device name for messages (`nbd:URI`).
    label: String,
    sock: Sock,
    send_lock: Mutex<()>,
    state: Mutex<State>,
    dead: AtomicBool,
    reader: Mutex<Option<JoinHandle<()>>>,
    timeout: Option<Duration>,
    on_death: Option<OnDeath>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks the connection dead when the reader thread ends, however it ends (also by panic),
/// with the reason and whether the server ended it.
struct DieOnExit(Arc<Conn>, String, bool);

impl Drop for DieOnExit {
    fn drop(&mut self) {
        self.0.die_as(std::mem::take(&mut self.1), self.2);
    }
}

/// A sent request; [`Ticket::wait`] returns its reply.
pub(crate) struct Ticket {
    rx: Receiver<Reply>,
    conn: Arc<Conn>,
}

impl Ticket {
    /// Waits for the reply. With a request timeout, a request unanswered for that long kills
    /// the connection (NBD cannot cancel one request) and fails.
    pub fn wait(self) -> Reply {
        let r = match self.conn.timeout {
            None => self.rx.recv().ok(),
            Some(t) => match self.rx.recv_timeout(t) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Disconnected) => None,
                Err(RecvTimeoutError::Timeout) => {
                    self.conn.die(format!(
                        "no reply within the request timeout of {t:?}; connection closed"
                    ));
                    self.rx.recv().ok()
                }
            },
        };
        // No reply means the connection died and dropped our sender.
        r.unwrap_or_else(|| Err(self.conn.lost()))
    }
}

impl Conn {
    /// Takes over a socket that finished its handshake and starts its reader thread.
    pub fn start(
        label: String,
        sock: Sock,
        timeout: Option<Duration>,
        on_death: Option<OnDeath>,
    ) -> Result<Arc<Conn>, String> {
        sock.set_timeouts(None)
            .and_then(|()| sock.set_write_timeout(timeout))
            .map_err(|e| format!("socket setup: {e}"))?;
        let rd = sock.try_clone().map_err(|e| format!("socket dup: {e}"))?;
        let conn = Arc::new(Conn {
            label,
            sock,
            send_lock: Mutex::new(()),
            state: Mutex::new(State::default()),
            dead: AtomicBool::new(false),
            reader: Mutex::new(None),
            timeout,
            on_death,
        });
        let c = Arc::clone(&conn);
        let h = std::thread::Builder::new()
            .name("nbd-reader".into())
            .spawn(move || reader(c, rd))
            .map_err(|e| format!("starting the reader thread: {e}"))?;
        *lock(&conn.reader) = Some(h);
        Ok(conn)
    }

    /// True once the connection failed or was closed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Dead because the server ended it (not by a timeout, a protocol error or a close).
    pub fn server_ended(&self) -> bool {
        self.is_dead() && lock(&self.state).server_ended
    }

    /// Why it died (`None` while alive).
    pub fn why_dead(&self) -> Option<String> {
        lock(&self.state).dead.clone()
    }

    /// The error of a request on a dead connection.
    fn lost(&self) -> IoErr {
        let why = lock(&self.state)
            .dead
            .clone()
            .unwrap_or_else(|| "connection closed".into());
        IoErr::Io {
            kind: io::ErrorKind::ConnectionAborted,
            msg: format!("{}: connection lost: {why}", self.label),
        }
    }

    /// Marks the connection dead by this side (keeping the first reason), fails every waiting
    /// request and shuts the socket down so that the reader thread and any blocked sender
    /// return.
    pub fn die(&self, why: String) {
        self.die_as(why, false);
    }

    /// [`Conn::die`], saying whether the server ended the connection.
    fn die_as(&self, why: String, server_ended: bool) {
        let (drained, first) = {
            let mut st = lock(&self.state);
            let first = st.dead.is_none();
            if first {
                st.dead = Some(why);
                st.server_ended = server_ended;
            }
            self.dead.store(true, Ordering::Release);
            (std::mem::take(&mut st.pending), first)
        };
        // Dropping the senders wakes their callers, who then read the reason.
        drop(drained);
        self.sock.shutdown();
        if first && let Some(f) = &self.on_death {
            f();
        }
    }

    /// Sends one request (`payload` for writes) and returns the ticket to wait on.
    pub fn send(
        self: &Arc<Self>,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Ticket {
        let (tx, rx) = mpsc::channel();
        let ticket = Ticket {
            rx,
            conn: Arc::clone(self),
        };
        let cookie = {
            let mut st = lock(&self.state);
            if st.dead.is_some() {
                return ticket; // tx dropped: wait() reports the reason
            }
            let c = st.next_cookie;
            st.next_cookie = c.wrapping_add(1);
            st.pending.insert(
                c,
                Waiter {
                    tx,
                    command,
                    offset,
                    len,
                },
            );
            c
        };
        let hdr = proto::request(command, flags, cookie, offset, len);
        let _g = lock(&self.send_lock);
        if self.is_dead() {
            return ticket; // died while we queued: our waiter was drained
        }
        if let Err(e) = self.sock.send_all(&[&hdr, payload]) {
            // A partly sent request leaves the stream unusable.
            match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    self.die("sending timed out (server not reading)".to_string())
                }
                _ => self.die_as(format!("send failed: {e}"), true),
            }
        }
        ticket
    }

    /// Sends `NBD_CMD_DISC` (if still connected), closes the socket and joins the reader.
    pub fn close(&self) {
        if !self.is_dead() {
            let hdr = proto::request(cmd::DISC, 0, u64::MAX, 0, 0);
            let _g = lock(&self.send_lock);
            let _ = self.sock.send_all(&[&hdr]);
        }
        self.die("disconnected by the client".into());
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }

    fn error_reply(&self, w: &Waiter, err: u32) -> IoErr {
        let (kind, name) = proto::errno(err);
        IoErr::Io {
            kind,
            msg: format!(
                "{}: {} of {} bytes at offset {}: server error {name} ({err})",
                self.label,
                cmd::name(w.command),
                w.len,
                w.offset
            ),
        }
    }
}

/// The reader thread: receives replies until the connection ends.
fn reader(conn: Arc<Conn>, sock: Sock) {
    let mut guard = DieOnExit(Arc::clone(&conn), "reader thread ended".into(), false);
    let why = receive(&conn, &mut BufReader::with_capacity(256 << 10, sock));
    // A socket error or EOF: the server ended it (or the socket was shut down here, after
    // which the first reason, this side's, stands).
    guard.2 = why.starts_with("server closed") || why.starts_with("receive failed");
    guard.1 = why;
}

/// Receives replies; returns why it stopped.
fn receive(conn: &Conn, r: &mut impl Read) -> String {
    let io_why = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => "server closed the connection".to_string(),
        _ => format!("receive failed: {e}"),
    };
    loop {
        let mut h = [0u8; 16];
        if let Err(e) = r.read_exact(&mut h) {
            return io_why(e);
        }
        let SimpleReply {
            magic,
            error: err,
            cookie,
        } = SimpleReply::decode(&h);
        if magic == proto::STRUCTURED_REPLY_MAGIC {
            return "protocol error: structured reply that was not negotiated".into();
        }
        if magic != proto::SIMPLE_REPLY_MAGIC {
            return format!("protocol error: bad reply magic {magic:#010x}");
        }
        let Some(w) = lock(&conn.state).pending.remove(&cookie) else {
            return format!("protocol error: reply to unknown cookie {cookie}");
        };
        let reply = if err != 0 {
            // Simple replies carry no payload on error.
            Err(conn.error_reply(&w, err))
        } else if w.command == cmd::READ {
            let mut data = vec![0u8; w.len as usize];
            if let Err(e) = r.read_exact(&mut data) {
                return io_why(e); // w is dropped: its caller gets the reason
            }
            Ok(data)
        } else {
            Ok(Vec::new())
        };
        let _ = w.tx.send(reply); // the caller may have given up (timeout)
    }
}
