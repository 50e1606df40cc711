//! The client side of the handshake: fixed newstyle with `NBD_OPT_GO` (asking for block sizes
//! if the caller wants them), falling back to `NBD_OPT_EXPORT_NAME` for a server without
//! `NBD_OPT_GO` (or, when allowed, one that does not speak fixed newstyle); and what an NBD
//! error value means. Simple replies only (no `NBD_OPT_STRUCTURED_REPLY`), no TLS.

use crate::{
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT,
    NBDMAGIC, OLDSTYLE_MAGIC, OPT_REPLY_MAGIC, OptionReplyHeader, be32, encode_info_request, info,
    opt, option_request, rep,
};
use std::io::{self, Read, Write};

/// Largest option reply accepted during the handshake (replies are tiny; this stops a
/// misbehaving server from making us allocate gigabytes).
const MAX_OPT_REPLY: u32 = 1 << 20;

/// What the client asks of the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    /// Ask for `NBD_INFO_BLOCK_SIZE` in `NBD_OPT_GO` (the client then promises to honour the
    /// minimum block size; without it the server accepts any alignment).
    pub block_sizes: bool,
    /// Refuse a server that does not speak fixed newstyle (instead of going straight to
    /// `NBD_OPT_EXPORT_NAME`).
    pub fixed_newstyle: bool,
}

/// What the server told us about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Export {
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Minimum block size (1 when not advertised).
    pub min_block: u32,
    /// Preferred block size (4096 when not advertised).
    pub pref_block: u32,
    /// Maximum block size for READ/WRITE payloads (32 MiB when not advertised).
    pub max_block: u32,
    /// Negotiated with `NBD_OPT_GO` (else `NBD_OPT_EXPORT_NAME`).
    pub go: bool,
}

/// A failed handshake: the kind to report and a one-line reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeError {
    /// The kind (`InvalidData` for a protocol violation or not an NBD server at all).
    pub kind: io::ErrorKind,
    /// The reason, one line.
    pub msg: String,
    /// The socket failed (or the server closed it) rather than the server answering wrongly
    /// or refusing.
    pub socket: bool,
}

/// A protocol violation (or not an NBD server at all).
fn invalid(msg: impl Into<String>) -> HandshakeError {
    refused(io::ErrorKind::InvalidData, msg)
}

/// An answer of the server that ends the handshake.
fn refused(kind: io::ErrorKind, msg: impl Into<String>) -> HandshakeError {
    HandshakeError {
        kind,
        msg: msg.into(),
        socket: false,
    }
}

/// Describes a handshake IO error.
fn hs_err(what: &str, e: io::Error) -> HandshakeError {
    let (kind, msg) = match e.kind() {
        io::ErrorKind::UnexpectedEof => (
            io::ErrorKind::ConnectionAborted,
            format!("server closed the connection during {what}"),
        ),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => (
            io::ErrorKind::TimedOut,
            format!("no answer from the server during {what} (timed out)"),
        ),
        k => (k, format!("{what}: {e}")),
    };
    HandshakeError {
        kind,
        msg,
        socket: true,
    }
}

fn rd<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut b = [0; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// The `io::ErrorKind` and description of an option error reply (`NBD_REP_ERR_*`).
fn rep_err(t: u32) -> (io::ErrorKind, &'static str) {
    use io::ErrorKind as K;
    match t {
        rep::ERR_UNSUP => (K::Unsupported, "unsupported option"),
        rep::ERR_POLICY => (K::PermissionDenied, "refused by server policy"),
        rep::ERR_INVALID => (K::InvalidInput, "invalid option"),
        rep::ERR_PLATFORM => (K::Unsupported, "unsupported on the server's platform"),
        rep::ERR_TLS_REQD => (
            K::PermissionDenied,
            "TLS required (not supported by this client)",
        ),
        rep::ERR_UNKNOWN => (K::NotFound, "unknown export"),
        rep::ERR_SHUTDOWN => (K::ConnectionAborted, "server is shutting down"),
        rep::ERR_BLOCK_SIZE_REQD => (K::Unsupported, "block size negotiation required"),
        rep::ERR_TOO_BIG => (K::InvalidInput, "request too big"),
        _ => (K::Other, "unknown error"),
    }
}

/// Runs the handshake on a fresh connection `s` and selects `export`.
pub fn handshake<S: Read + Write>(
    s: &mut S,
    export: &str,
    wants: Wants,
) -> Result<Export, HandshakeError> {
    let greeting = |e| hs_err("the greeting", e);
    let magic = u64::from_be_bytes(rd(s).map_err(greeting)?);
    if magic != NBDMAGIC {
        return Err(invalid(format!(
            "not an NBD server (greeting {magic:#018x})"
        )));
    }
    let style = u64::from_be_bytes(rd(s).map_err(greeting)?);
    if style == OLDSTYLE_MAGIC {
        return Err(refused(
            io::ErrorKind::Unsupported,
            "server uses oldstyle negotiation, which is not supported",
        ));
    }
    if style != IHAVEOPT {
        return Err(invalid(format!(
            "not an NBD newstyle server (magic {style:#018x})"
        )));
    }
    let hflags = u16::from_be_bytes(rd(s).map_err(greeting)?);
    let fixed = hflags & FLAG_FIXED_NEWSTYLE != 0;
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    if !fixed && wants.fixed_newstyle {
        return Err(refused(
            io::ErrorKind::Unsupported,
            "server does not speak fixed newstyle",
        ));
    }
    let mut cflags = 0;
    if fixed {
        cflags |= FLAG_C_FIXED_NEWSTYLE;
    }
    if no_zeroes {
        cflags |= FLAG_C_NO_ZEROES;
    }
    send(s, &cflags.to_be_bytes()).map_err(|e| hs_err("sending client flags", e))?;
    if fixed && let Some(x) = opt_go(s, export, wants)? {
        return Ok(x);
    }
    // Non-fixed newstyle, or a server without NBD_OPT_GO.
    send(s, &option_request(opt::EXPORT_NAME, export.as_bytes()))
        .map_err(|e| hs_err("NBD_OPT_EXPORT_NAME", e))?;
    let what = format!("NBD_OPT_EXPORT_NAME (is export '{export}' known to the server?)");
    let size = u64::from_be_bytes(rd(s).map_err(|e| hs_err(&what, e))?);
    let flags = u16::from_be_bytes(rd(s).map_err(|e| hs_err(&what, e))?);
    if !no_zeroes {
        rd::<124>(s).map_err(|e| hs_err(&what, e))?;
    }
    Ok(Export {
        size,
        flags,
        min_block: 1,
        pref_block: 4096,
        max_block: 32 << 20,
        go: false,
    })
}

/// Writes all of `b` and flushes.
fn send(s: &mut impl Write, b: &[u8]) -> io::Result<()> {
    s.write_all(b)?;
    s.flush()
}

/// `NBD_OPT_GO`, asking for block sizes if `wants` says so. `Ok(None)` when the server does not
/// know the option.
fn opt_go<S: Read + Write>(
    s: &mut S,
    export: &str,
    wants: Wants,
) -> Result<Option<Export>, HandshakeError> {
    let infos: &[u16] = if wants.block_sizes {
        &[info::BLOCK_SIZE]
    } else {
        &[]
    };
    send(
        s,
        &option_request(opt::GO, &encode_info_request(export, infos)),
    )
    .map_err(|e| hs_err("NBD_OPT_GO", e))?;
    let mut size_flags = None;
    let mut sizes = None;
    loop {
        let err = |e| hs_err("the reply to NBD_OPT_GO", e);
        let h = OptionReplyHeader::decode(&rd(s).map_err(err)?);
        if h.magic != OPT_REPLY_MAGIC || h.option != opt::GO {
            return Err(invalid(format!(
                "protocol error: bad option reply (magic {:#x}, option {})",
                h.magic, h.option
            )));
        }
        if h.len > MAX_OPT_REPLY {
            return Err(invalid(format!(
                "protocol error: option reply of {} bytes",
                h.len
            )));
        }
        let mut d = vec![0; h.len as usize];
        s.read_exact(&mut d).map_err(err)?;
        match h.typ {
            rep::ACK => break,
            rep::INFO if d.len() >= 2 => {
                let i = u16::from_be_bytes([d[0], d[1]]);
                match i {
                    info::EXPORT if d.len() >= 12 => {
                        let size = u64::from_be_bytes(d[2..10].try_into().unwrap_or([0; 8]));
                        size_flags = Some((size, u16::from_be_bytes([d[10], d[11]])));
                    }
                    info::BLOCK_SIZE if d.len() >= 14 => {
                        sizes = Some((be32(&d[2..]), be32(&d[6..]), be32(&d[10..])))
                    }
                    info::EXPORT | info::BLOCK_SIZE => {
                        return Err(invalid(format!("protocol error: short NBD_INFO {i} reply")));
                    }
                    _ => {}
                }
            }
            rep::ERR_UNSUP => return Ok(None),
            t if t & rep::ERR != 0 => {
                let msg = String::from_utf8_lossy(&d).replace(['\n', '\r'], " ");
                let msg = msg.trim();
                let sep = if msg.is_empty() { "" } else { ": " };
                let (kind, name) = rep_err(t);
                return Err(refused(
                    kind,
                    format!("server refused export '{export}': {name}{sep}{msg}"),
                ));
            }
            _ => {} // unknown non-error replies are ignored
        }
    }
    let Some((size, flags)) = size_flags else {
        return Err(invalid(
            "protocol error: NBD_OPT_GO acknowledged without NBD_INFO_EXPORT",
        ));
    };
    let (min_block, pref_block, max_block) = sizes.unwrap_or((1, 4096, 32 << 20));
    let pow2 = |v: u32| v.is_power_of_two();
    if !pow2(min_block) || min_block > 65536 || max_block < min_block || max_block % min_block != 0
    {
        return Err(invalid(format!(
            "server advertised impossible block sizes (min {min_block}, preferred \
             {pref_block}, max {max_block})"
        )));
    }
    Ok(Some(Export {
        size,
        flags,
        min_block,
        pref_block,
        max_block,
        go: true,
    }))
}

/// The `io::ErrorKind` and name of an NBD error value (`NBD_E*`, errno numbers on Linux).
pub fn errno(e: u32) -> (io::ErrorKind, &'static str) {
    use crate::errno as E;
    use io::ErrorKind as K;
    match e {
        E::EPERM => (K::PermissionDenied, "EPERM"),
        E::EIO => (K::Other, "EIO"),
        E::ENOMEM => (K::OutOfMemory, "ENOMEM"),
        E::EINVAL => (K::InvalidInput, "EINVAL"),
        E::ENOSPC => (K::StorageFull, "ENOSPC"),
        E::EOVERFLOW => (K::InvalidInput, "EOVERFLOW"),
        E::ENOTSUP => (K::Unsupported, "ENOTSUP"),
        E::ESHUTDOWN => (K::ConnectionAborted, "ESHUTDOWN"),
        _ => (K::Other, "unknown NBD error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        MemStream, greeting, info_block_size, info_export, option_reply, parse_option_header,
    };

    fn run(input: Vec<u8>, wants: Wants) -> (Result<Export, HandshakeError>, Vec<u8>) {
        let mut d = MemStream::new(input);
        (handshake(&mut d, "vm", wants), d.out)
    }

    const BOTH: Wants = Wants {
        block_sizes: true,
        fixed_newstyle: false,
    };

    #[test]
    fn go_with_block_sizes() {
        let mut i = greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_vec();
        i.extend(option_reply(opt::GO, rep::INFO, &info_export(1 << 30, 1)));
        i.extend(option_reply(
            opt::GO,
            rep::INFO,
            &info_block_size(512, 4096, 1 << 20),
        ));
        i.extend(option_reply(opt::GO, rep::ACK, &[]));
        let (x, out) = run(i, BOTH);
        let x = x.unwrap();
        assert_eq!(
            (x.size, x.flags, x.min_block, x.max_block),
            (1 << 30, 1, 512, 1 << 20)
        );
        assert!(x.go);
        assert_eq!(be32(&out), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        let (o, len) = parse_option_header(out[4..20].try_into().unwrap()).unwrap();
        assert_eq!(o, opt::GO);
        assert_eq!(
            crate::parse_info_request(&out[20..20 + len as usize]),
            Some(("vm".into(), vec![info::BLOCK_SIZE]))
        );
    }

    #[test]
    fn falls_back_to_export_name() {
        let mut i = greeting(FLAG_FIXED_NEWSTYLE).to_vec();
        i.extend(option_reply(opt::GO, rep::ERR_UNSUP, &[]));
        i.extend((5u64 << 20).to_be_bytes());
        i.extend(3u16.to_be_bytes());
        i.extend([0u8; 124]);
        let wants = Wants {
            block_sizes: false,
            fixed_newstyle: true,
        };
        let (x, out) = run(i, wants);
        let x = x.unwrap();
        assert_eq!((x.size, x.flags, x.go), (5 << 20, 3, false));
        // GO asked for no information.
        assert_eq!(
            crate::parse_info_request(&out[20..28]),
            Some(("vm".into(), vec![]))
        );
    }

    #[test]
    fn refusals_and_violations() {
        let mut i = greeting(FLAG_FIXED_NEWSTYLE).to_vec();
        i.extend(option_reply(opt::GO, rep::ERR_UNKNOWN, b"gone\n"));
        let e = run(i, BOTH).0.unwrap_err();
        assert_eq!(e.kind, io::ErrorKind::NotFound);
        assert_eq!(e.msg, "server refused export 'vm': unknown export: gone");
        assert!(!e.socket);
        let e = run(b"HTTP/1.1 400 Bad".to_vec(), BOTH).0.unwrap_err();
        assert!(e.msg.contains("not an NBD server"), "{e:?}");
        let e = run(greeting(FLAG_FIXED_NEWSTYLE)[..10].to_vec(), BOTH)
            .0
            .unwrap_err();
        assert_eq!(e.kind, io::ErrorKind::ConnectionAborted);
        assert!(e.socket);
        let wants = Wants {
            block_sizes: false,
            fixed_newstyle: true,
        };
        let e = run(greeting(0).to_vec(), wants).0.unwrap_err();
        assert!(e.msg.contains("fixed newstyle"), "{e:?}");
    }
}
