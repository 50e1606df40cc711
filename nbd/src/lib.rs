//! # tiercache-nbd: the NBD server
//!
//! Serves [`Export`]s (normally cores of the engine, [`EngineExport`]) over the NBD protocol
//! (the NBD project's `doc/proto.md`) on unix sockets and TCP, with TLS ([`TlsConfig`]) where
//! configured and always on non-loopback TCP.
//!
//! ## Protocol
//!
//! - **Handshake**: fixed newstyle only (`NBD_FLAG_FIXED_NEWSTYLE`, `NBD_FLAG_NO_ZEROES`; a
//!   client without `NBD_FLAG_C_FIXED_NEWSTYLE` or with unknown flags is disconnected).
//!   Options: `NBD_OPT_GO` and `NBD_OPT_INFO` (answering `NBD_INFO_EXPORT`, `NBD_INFO_NAME`,
//!   `NBD_INFO_DESCRIPTION`, and always `NBD_INFO_BLOCK_SIZE`), `NBD_OPT_LIST`,
//!   `NBD_OPT_EXPORT_NAME`, `NBD_OPT_ABORT`, `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_STARTTLS`
//!   (see TLS below), `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT` (the one
//!   context `base:allocation`, after structured replies); unknown options get `NBD_REP_ERR_UNSUP` and the handshake goes on; an export that is listed but not served gets `NBD_REP_ERR_UNKNOWN`
//!   with the registry's reason. Option data longer than 64 KiB ends the connection (after
//!   `NBD_REP_ERR_TOO_BIG`) without being read; each handshake read must arrive within
//!   [`ServerConfig::handshake_timeout`], and an export must be chosen within 1024 options.
//! - **Block sizes**: minimum 512 (or more, as the export says), preferred the cache line
//!   size, maximum 32 MiB (the engine's request limit). A client that did not ask for
//!   `NBD_INFO_BLOCK_SIZE` (`NBD_OPT_EXPORT_NAME`, or `NBD_OPT_GO` without it) is served at any
//!   byte offset and length, up to the maximum (`unaligned.rs`: read-modify-write of partly
//!   covered blocks under a per-export range lock that costs nothing until such a client sends
//!   an unaligned request); one that asked must respect the minimum.
//! - **Transmission**: READ, WRITE (FUA), FLUSH, TRIM (FUA: trim, then flush), WRITE_ZEROES
//!   (FUA, `NO_HOLE`, `FAST_ZERO` — zeroing is always fast here, so it is honoured), CACHE (a
//!   read whose data is dropped: warm-up), BLOCK_STATUS (with `base:allocation` negotiated:
//!   holes as `HOLE | ZERO`, the rest allocated, from [`Export::extents`]; `REQ_ONE`
//!   honoured), DISC. Flags sent: `HAS_FLAGS`, `SEND_FLUSH`,
//!   `SEND_FUA`, `SEND_TRIM`, `SEND_WRITE_ZEROES`, `SEND_FAST_ZERO`, `SEND_CACHE`,
//!   `CAN_MULTI_CONN`, `SEND_DF` with structured replies (a read's data is always one chunk)
//!   (and `READ_ONLY` for read-only exports). Simple replies, or structured
//!   replies once negotiated (`OFFSET_DATA` for reads, `ERROR` with a message, `NONE`; every
//!   reply is one chunk with `DONE`).
//! - **Errors** (SPEC R6, R7): reads, trims and caches out of range → `EINVAL`; writes and
//!   write-zeroes past the end → `ENOSPC`; offsets or lengths not a multiple of the minimum
//!   block size, from a client that negotiated block sizes → `EINVAL`; READ, WRITE or CACHE longer than the maximum block size →
//!   `EINVAL` (a refused write's payload is read and dropped, so the stream stays in sync;
//!   TRIM and WRITE_ZEROES carry no payload and may be longer: the export splits them); unknown
//!   commands or flags → `EINVAL`; writes to a read-only export → `EPERM`; device errors →
//!   `EIO`; a stopping cache → `ESHUTDOWN`. The connection keeps working after each. A
//!   request header with a bad magic ends the connection (the stream is out of sync).
//!
//! ## Threads and bounds
//!
//! - One **accept thread** per listener (it polls, so shutdown is seen within 100 ms).
//! - One **reader thread** per connection: it runs the handshake, then parses requests,
//!   answers bad ones itself and hands good ones (a WRITE with its payload, read into an
//!   aligned buffer) to the workers. A READ is first offered to the export from the reader
//!   ([`Export::read_start`]): one that needs no waiting for a device (a hit in a `ram:`
//!   cache) is answered right there, with no hand-off to a worker and back (that round trip
//!   was about half the server's CPU per 4 KiB hit); one that waits for a device is left
//!   started for a worker to finish. The pool and the in-flight bound only notify (a system
//!   call each) when a thread waits.
//! - A **worker pool** ([`ServerConfig::workers`], 16) shared by all connections runs the
//!   requests on the export and writes the replies. Replies go out in completion order (so
//!   out of order), header and data in one gathered write, under a per-connection writer
//!   lock: a worker that finds the lock taken queues its reply for the holder to write and
//!   moves on, so one slow reader holds at most one worker.
//! - **In flight per connection** is bounded: at most [`ServerConfig::max_in_flight`] (64)
//!   requests and [`ServerConfig::max_in_flight_bytes`] (128 MiB) of READ/WRITE payload
//!   between reading a request and sending its reply; at the bound the reader stops reading
//!   the socket, so a client cannot make the server allocate without limit. A reply write
//!   blocked longer than [`ServerConfig::write_timeout`] drops the connection, so a client that
//!   does not read cannot hold the workers.
//! - A client that disconnects (or breaks the protocol) mid-request ends only its own
//!   connection: requests already started finish, their replies are dropped, and the
//!   connection thread exits once none is in flight. A panicking export answers `EIO`.
//! - [`Server::disconnect_export`] closes the connections of one export (a removed core);
//!   new connections are decided by [`Exports::get`].
//! - [`Server::shutdown`] stops the listeners (removing their unix socket files), shuts every
//!   connection's socket, waits for requests in flight, and joins every thread.
//!
//! ## Request statistics
//!
//! An export that has [`Export::request_stats`] gets a latency histogram per operation and its
//! client bytes counted ([`latency`]): each request's time from being received whole to its
//! reply being queued, with atomics only.
//!
//! ## Multi-conn and flush
//!
//! `NBD_FLAG_CAN_MULTI_CONN` is advertised: an [`Export::flush`] must cover every write whose
//! reply was sent before the flush began, on *any* connection. [`EngineExport`] gets this from
//! the engine: its flush of a core makes durable every write completed before it on any thread,
//! and a write is completed before its reply is written. So a client may write on connection
//! A, get the reply, flush on connection B and rely on the write being durable — in every
//! cache mode (in `wt`/`wa`/`wi`/`pt` the flush reaches the core device; in lazy modes it
//! makes the write durable on the cache device, SPEC durability point 1). FUA writes are
//! durable when replied.
//!
//! ## TLS (SPEC C11, R7)
//!
//! A listener started with [`Server::listen_tls`] runs the protocol's FORCEDTLS mode: before
//! TLS, `NBD_OPT_STARTTLS` is acknowledged (with data: `NBD_REP_ERR_INVALID`), `NBD_OPT_ABORT`
//! is acknowledged, `NBD_OPT_EXPORT_NAME` ends the connection (it cannot carry an error), and
//! every other option gets `NBD_REP_ERR_TLS_REQD`. After the ACK the TLS handshake runs
//! (rustls, `aws-lc-rs` provider, TLS 1.2 and 1.3; keys: RSA of 2048 to 8192 bits, ECDSA
//! P-256/P-384/P-521, Ed25519) and the client must present a certificate that
//! chains to the listener's CA, or the handshake fails with an alert and the connection ends
//! ([`ServerStats::tls_refused`]). Option haggling then starts afresh inside TLS (nothing
//! negotiated before survives), a second `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_INVALID`, and
//! transmission runs over TLS: a read half for the reader thread and a write half for the
//! workers share the session, the socket is never read while its state is locked, and a
//! `close_notify` goes out when the connection ends. A listener without TLS (NOTLS) answers
//! `NBD_OPT_STARTTLS` with `NBD_REP_ERR_POLICY`.
//!
//! ## Listeners
//!
//! Unix sockets are created with mode 0600 ([`ServerConfig::socket_mode`]; 0660 with
//! [`ServerConfig::socket_group`]) before anyone can connect (bound in a private directory,
//! chowned and chmodded, then renamed into place); an existing
//! socket file is replaced only if nothing listens on it. A TCP listener on an address that
//! is not loopback is refused unless it has TLS ([`non_loopback_refusal`] says so in one
//! line). Connections are handled through the [`NbdStream`] trait (read, write, split into
//! halves, shut down, upgrade to TLS), so other streams can be served with
//! [`Server::serve_stream`] (or [`Server::serve_stream_tls`]).

#![warn(missing_docs)]

mod export;
mod handshake;
pub mod latency;
pub mod proto;
mod reactor;
mod server;
mod tls;
mod tls_key;
mod transmission;
mod unaligned;

pub use export::{
    BackendExport, BlockSizes, EngineExport, Export, ExportError, ExportMap, Exports, MAX_BLOCK,
    ReadReply, ReadStart,
};
pub use handshake::{Handshake, serve_handshake};
pub use latency::RequestStats;
pub use server::{
    BoundAddr, Closer, ListenAddr, NbdStream, Server, ServerConfig, ServerStats,
    non_loopback_refusal,
};
pub use tls::TlsConfig;
