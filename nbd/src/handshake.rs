//! The handshake: the server's greeting, option haggling (`NBD_OPT_*`, STARTTLS, meta
//! contexts) up to transmission.

use crate::export::{BlockSizes, Export, Exports};
use crate::proto::{self, info, opt, parse_info_request, rep, tflag};
use crate::server::*;
use crate::tls::TlsConfig;
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What the handshake agreed on.
pub(crate) struct Negotiated {
    pub(crate) export: Arc<dyn Export>,
    pub(crate) size: u64,
    pub(crate) sizes: BlockSizes,
    pub(crate) read_only: bool,
    pub(crate) structured: bool,
    /// `base:allocation` was selected for this export: `NBD_CMD_BLOCK_STATUS` is served.
    pub(crate) block_status: bool,
    /// The client did not ask for `NBD_INFO_BLOCK_SIZE` (`NBD_OPT_EXPORT_NAME`, or
    /// `NBD_OPT_GO` without it): requests at any byte offset and length are served
    /// (`unaligned.rs`).
    pub(crate) liberal: bool,
}

/// The handshake of a connection, with a TLS upgrade in the middle when `tls` is set.
/// Returns the stream to transmit on (a TLS stream after an upgrade) and what was agreed.
pub(crate) fn conn_handshake(
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

pub(crate) fn read_u32(r: &mut (impl Read + ?Sized)) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Cuts `s` to at most [`proto::MAX_STRING`] bytes at a character boundary.
pub(crate) fn cap_str(s: &str) -> &str {
    if s.len() <= proto::MAX_STRING {
        return s;
    }
    let mut n = proto::MAX_STRING;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

pub(crate) fn send_opt(
    s: &mut (impl Write + ?Sized),
    option: u32,
    typ: u32,
    data: &[u8],
) -> io::Result<()> {
    s.write_all(&proto::option_reply(option, typ, data))
}

pub(crate) fn send_err(
    s: &mut (impl Write + ?Sized),
    option: u32,
    typ: u32,
    msg: &str,
) -> io::Result<()> {
    send_opt(s, option, typ, cap_str(msg).as_bytes())
}

/// The transmission flags of an export. `SEND_DF` only with structured replies (the protocol
/// says so): a read's data always goes in one chunk, so `NBD_CMD_FLAG_DF` is always honoured.
pub(crate) fn transmission_flags(read_only: bool, structured: bool) -> u16 {
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
pub(crate) fn handshake<S: Read + Write + ?Sized>(
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
pub(crate) enum Tls {
    /// Not offered (NOTLS): `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_POLICY`.
    Off,
    /// Required (FORCEDTLS) and not yet running: only `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT`
    /// are served.
    Required,
    /// Running.
    Active,
}

/// The state of option haggling.
pub(crate) struct Haggle {
    no_zeroes: bool,
    structured: bool,
    /// The export `base:allocation` was last selected for (`NBD_OPT_SET_META_CONTEXT`).
    meta: Option<String>,
    tls: Tls,
    /// Options received so far (across a TLS upgrade).
    options: usize,
}

/// How option haggling ended.
pub(crate) enum Step {
    /// The connection ends.
    End,
    /// Transmission begins.
    Go(Negotiated),
    /// `NBD_OPT_STARTTLS` was acknowledged: the TLS handshake comes next, then more options.
    StartTls,
}

/// Sends the greeting and reads the client's flags. `None`: the connection ends.
pub(crate) fn greet<S: Read + Write + ?Sized>(s: &mut S, tls: Tls) -> io::Result<Option<Haggle>> {
    s.write_all(&proto::greeting(
        proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES,
    ))?;
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
pub(crate) fn options<S: Read + Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
    st: &mut Haggle,
) -> io::Result<Step> {
    while st.options < MAX_OPTIONS {
        st.options += 1;
        let mut h = [0u8; 16];
        s.read_exact(&mut h)?;
        let Some((option, len)) = proto::parse_option_header(&h) else {
            return Ok(Step::End);
        };
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
        let next = if st.tls == Tls::Required {
            before_tls(s, option, len, st)?
        } else {
            one_option(s, exports, quit, chosen, st, option, data)?
        };
        match next {
            Next::Flush => s.flush()?,
            Next::Read => {}
            Next::Done(step) => return Ok(step),
        }
    }
    Ok(Step::End) // a client that never chooses an export
}

/// What [`options`] does after one option.
enum Next {
    /// Flush the replies written, then read the next option.
    Flush,
    /// Read the next option (the error reply written is not flushed first).
    Read,
    /// Haggling ended.
    Done(Step),
}

/// An option on a listener that requires TLS, before STARTTLS: only STARTTLS and ABORT are
/// taken; anything else is refused with `ERR_TLS_REQD` (`EXPORT_NAME`, which cannot be
/// answered with an error, ends the session).
fn before_tls<S: Write + ?Sized>(
    s: &mut S,
    option: u32,
    len: u32,
    st: &mut Haggle,
) -> io::Result<Next> {
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
            return Ok(Next::Done(Step::StartTls));
        }
        opt::ABORT => {
            let _ = send_opt(s, option, rep::ACK, &[]);
            let _ = s.flush();
            return Ok(Next::Done(Step::End));
        }
        // It cannot be answered with an error: the protocol says end the session.
        opt::EXPORT_NAME => return Ok(Next::Done(Step::End)),
        _ => send_err(
            s,
            option,
            rep::ERR_TLS_REQD,
            "TLS is required: send NBD_OPT_STARTTLS first (with a client certificate \
             this server's CA signed)",
        )?,
    }
    Ok(Next::Flush)
}

/// One option outside TLS-required haggling.
fn one_option<S: Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
    st: &mut Haggle,
    option: u32,
    data: Vec<u8>,
) -> io::Result<Next> {
    let len = data.len();
    match option {
        opt::EXPORT_NAME => return export_name(s, exports, quit, chosen, st, data),
        opt::ABORT => {
            let _ = send_opt(s, option, rep::ACK, &[]);
            let _ = s.flush();
            return Ok(Next::Done(Step::End));
        }
        opt::LIST => {
            if len != 0 {
                send_err(s, option, rep::ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                return Ok(Next::Read);
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
                return Ok(Next::Read);
            }
            st.structured = true;
            send_opt(s, option, rep::ACK, &[])?;
        }
        opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
            meta_context(s, exports, option, &data, st)?;
        }
        opt::INFO | opt::GO => return info_or_go(s, exports, quit, chosen, st, option, &data),
        _ => {
            send_err(s, option, rep::ERR_UNSUP, "option not supported")?;
        }
    }
    Ok(Next::Flush)
}

/// `NBD_OPT_EXPORT_NAME`: the old way to choose an export (no error reply is possible: an
/// unknown or unusable export ends the session).
fn export_name<S: Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
    st: &Haggle,
    data: Vec<u8>,
) -> io::Result<Next> {
    let structured = st.structured;
    let Ok(name) = String::from_utf8(data) else {
        return Ok(Next::Done(Step::End));
    };
    if quit.load(Ordering::Acquire) {
        return Ok(Next::Done(Step::End));
    }
    let Ok(export) = exports.get(&name) else {
        return Ok(Next::Done(Step::End));
    };
    let sizes = export.block_sizes();
    if sizes.check().is_err() {
        return Ok(Next::Done(Step::End));
    }
    let size = export.size();
    let read_only = export.read_only();
    chosen(&name);
    let mut m = Vec::with_capacity(10 + 124);
    m.extend_from_slice(&size.to_be_bytes());
    m.extend_from_slice(&transmission_flags(read_only, structured).to_be_bytes());
    if !st.no_zeroes {
        m.extend_from_slice(&[0u8; 124]);
    }
    s.write_all(&m)?;
    s.flush()?;
    Ok(Next::Done(Step::Go(Negotiated {
        export,
        size,
        sizes,
        read_only,
        structured,
        block_status: structured && st.meta.as_deref() == Some(name.as_str()),
        liberal: true,
    })))
}

/// `NBD_OPT_INFO` and `NBD_OPT_GO`: the export's size and flags, name, description and block
/// sizes; GO then chooses it.
fn info_or_go<S: Write + ?Sized>(
    s: &mut S,
    exports: &dyn Exports,
    quit: &AtomicBool,
    chosen: &mut dyn FnMut(&str),
    st: &Haggle,
    option: u32,
    data: &[u8],
) -> io::Result<Next> {
    let structured = st.structured;
    let Some((name, infos)) = parse_info_request(data) else {
        send_err(
            s,
            option,
            rep::ERR_INVALID,
            "malformed NBD_OPT_INFO/NBD_OPT_GO data",
        )?;
        return Ok(Next::Read);
    };
    if quit.load(Ordering::Acquire) {
        send_err(s, option, rep::ERR_SHUTDOWN, "the server is shutting down")?;
        return Ok(Next::Read);
    }
    let export = match exports.get(&name) {
        Ok(e) => e,
        Err(reason) => {
            send_err(s, option, rep::ERR_UNKNOWN, &reason)?;
            return Ok(Next::Read);
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
        return Ok(Next::Read);
    }
    let size = export.size();
    let read_only = export.read_only();
    let d = proto::info_export(size, transmission_flags(read_only, structured));
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
    let d = proto::info_block_size(sizes.min, sizes.preferred, sizes.max);
    send_opt(s, option, rep::INFO, &d)?;
    if option == opt::GO {
        chosen(&name);
    }
    send_opt(s, option, rep::ACK, &[])?;
    if option != opt::GO {
        return Ok(Next::Flush);
    }
    s.flush()?;
    Ok(Next::Done(Step::Go(Negotiated {
        export,
        size,
        sizes,
        read_only,
        structured,
        block_status: structured && st.meta.as_deref() == Some(name.as_str()),
        liberal: !infos.contains(&info::BLOCK_SIZE),
    })))
}

/// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`: the one context served is
/// `base:allocation` (listed for no query, `base:` or `base:allocation`; selected by
/// `base:allocation`); other queries are ignored, as the protocol says. A SET replaces the
/// selection, even when it fails.
pub(crate) fn meta_context<S: Write + ?Sized>(
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
pub(crate) const MAX_OPTIONS: usize = 1024;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{BackendExport, ExportMap};
    use tiercache_io::RamBackend;

    /// An in-memory stream: reads from `input`, collects what is written.
    type Mem = proto::MemStream<Vec<u8>>;

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
        buf.extend_from_slice(&proto::option_request(o, data));
    }

    #[test]
    fn handshake_go_and_list() {
        let mut i = proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        option(&mut i, opt::LIST, &[]);
        option(&mut i, 1234, b"x");
        option(&mut i, opt::GO, &[0, 0, 0, 1, b'b', 0, 0]);
        option(&mut i, opt::STRUCTURED_REPLY, &[]);
        option(&mut i, opt::GO, &[0, 0, 0, 1, b'a', 0, 0]);
        let mut m = Mem::new(i);
        let n = handshake(&mut m, &exports(), &AtomicBool::new(false), &mut |_| {})
            .unwrap()
            .expect("GO succeeds");
        assert!(n.structured);
        assert_eq!(n.size, 16 * 512);
        assert_eq!(m.input.position() as usize, m.input.get_ref().len());
    }

    /// A seeded xorshift64 generator.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Seeded structure-aware loop (SPEC R5): option sequences with random types, lengths and
    /// bytes, cut at random points; the handshake must end cleanly, never panic.
    #[test]
    fn handshake_never_panics_on_random_input() {
        let ex = exports();
        let quit = AtomicBool::new(false);
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15u64);
        let (mut went, mut ended) = (0, 0);
        for _ in 0..20_000 {
            let mut i = match rnd() % 8 {
                0 => (rnd() as u32).to_be_bytes().to_vec(),
                _ => proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec(),
            };
            for _ in 0..rnd() % 5 {
                let o = [1, 2, 3, 5, 6, 7, 8, 9, rnd() as u32][(rnd() % 9) as usize];
                let mut d: Vec<u8> = (0..rnd() % 24).map(|_| rnd() as u8).collect();
                if rnd().is_multiple_of(2) && (o == opt::GO || o == opt::INFO) {
                    let name = [&b"a"[..], b"b", b"zz"][(rnd() % 3) as usize];
                    d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name);
                    let k = rnd() % 4;
                    d.extend_from_slice(&(k as u16).to_be_bytes());
                    for _ in 0..k {
                        d.extend_from_slice(&((rnd() % 5) as u16).to_be_bytes());
                    }
                }
                if rnd().is_multiple_of(16) {
                    i.extend_from_slice(&rnd().to_be_bytes()); // a bad magic
                } else {
                    option(&mut i, o, &d);
                }
                if rnd().is_multiple_of(16) {
                    let l = i.len();
                    i[l - 3..].copy_from_slice(&[0xff, 0xff, 0xff]); // a huge length
                }
            }
            let cut = (rnd() as usize) % (i.len() + 1);
            if rnd().is_multiple_of(4) {
                i.truncate(cut);
            }
            let mut m = Mem::new(i);
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
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1du64);
        let (mut upgraded, mut ended, mut refused) = (0, 0, 0u64);
        for _ in 0..20_000 {
            let mut i = proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
            for _ in 0..rnd() % 6 {
                let o = [1, 2, 3, 5, 6, 7, 8, 9, rnd() as u32][(rnd() % 9) as usize];
                let mut d: Vec<u8> = (0..rnd() % 12).map(|_| rnd() as u8).collect();
                if o == opt::STARTTLS && rnd().is_multiple_of(2) {
                    d.clear();
                }
                if o == opt::GO || o == opt::INFO {
                    d = vec![0, 0, 0, 1, b'a', 0, 0];
                }
                option(&mut i, o, &d);
            }
            if rnd().is_multiple_of(4) {
                let cut = (rnd() as usize) % (i.len() + 1);
                i.truncate(cut);
            }
            let mut m = Mem::new(i);
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
                let h = proto::OptionReplyHeader::decode(out[k..k + 20].try_into().unwrap());
                let (o, t, l) = (h.option, h.typ, h.len as usize);
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
