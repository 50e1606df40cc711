//! NBD URIs (the NBD project's `doc/uri.md`): `nbd://HOST[:PORT][/EXPORT]` and
//! `nbd+unix:///[EXPORT]?socket=PATH`. TLS (`nbds…`) and vsock schemes are refused with a reason.

use crate::MAX_STRING as MAX_NAME;
use std::path::PathBuf;

/// The IANA port of NBD, used when an `nbd://` URI names none.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A unix domain socket.
    Unix(PathBuf),
    /// A TCP host (name or address, IPv6 without brackets) and port.
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    /// The server's address.
    pub target: Target,
    /// The export name (percent-decoded; empty for the default export).
    pub export: String,
}

const USAGE: &str = "expected nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH";

/// Parses `s` (without the `nbd:` device prefix). The error is one line, without the URI.
pub fn parse(s: &str) -> Result<NbdUri, String> {
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains whitespace or control characters".into());
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err(format!("no scheme; {USAGE}"));
    };
    let unix = match scheme.to_ascii_lowercase().as_str() {
        "nbd" => false,
        "nbd+unix" => true,
        "nbds" | "nbds+unix" | "nbds+vsock" => {
            return Err(format!("TLS ({scheme}://) is not supported; {USAGE}"));
        }
        "nbd+vsock" => return Err(format!("vsock is not supported; {USAGE}")),
        _ => return Err(format!("unknown scheme '{scheme}'; {USAGE}")),
    };
    if rest.contains('#') {
        return Err("a fragment ('#') is not allowed".into());
    }
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    let export = decode(path.strip_prefix('/').unwrap_or(path), "export name")?;
    if export.len() > MAX_NAME {
        return Err(format!("export name longer than {MAX_NAME} bytes"));
    }
    if authority.contains('@') {
        return Err("user information ('user@') is not supported".into());
    }

    let mut socket = None;
    for param in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        match key {
            "socket" if unix => {
                if socket.is_some() {
                    return Err("socket= given twice".into());
                }
                socket = Some(decode(value, "socket path")?);
            }
            "socket" => {
                return Err("socket= is only for nbd+unix:// URIs".into());
            }
            k if k.starts_with("tls") => {
                return Err(format!("query parameter '{k}': TLS is not supported"));
            }
            k => return Err(format!("unknown query parameter '{k}'")),
        }
    }

    let target = if unix {
        if !authority.is_empty() {
            return Err(format!(
                "nbd+unix:// takes no host ('{authority}'); use nbd+unix:///EXPORT?socket=PATH"
            ));
        }
        match socket {
            Some(p) if !p.is_empty() => Target::Unix(PathBuf::from(p)),
            _ => return Err("nbd+unix:// needs ?socket=PATH".into()),
        }
    } else {
        let (host, port) = host_port(authority)?;
        Target::Tcp { host, port }
    };
    Ok(NbdUri { target, export })
}

/// Splits `HOST[:PORT]` or `[IPV6][:PORT]`.
fn host_port(authority: &str) -> Result<(String, u16), String> {
    if authority.is_empty() {
        return Err(format!("no host; {USAGE}"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err("unterminated '[' in the host".into());
        };
        if after.is_empty() {
            (host, None)
        } else if let Some(p) = after.strip_prefix(':') {
            (host, Some(p))
        } else {
            return Err(format!("unexpected '{after}' after the IPv6 address"));
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => {
                if p.contains(':') {
                    return Err("IPv6 addresses must be in brackets ([::1])".into());
                }
                (h, Some(p))
            }
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("no host; {USAGE}"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(format!("bad port '{p}' (1-65535)")),
        },
    };
    Ok((host.to_string(), port))
}

/// Where an NBD URI (without the `nbd:` device prefix) points, to tell whether two URIs name
/// one export: the addresses of its server and the export name. A unix socket is its
/// canonical path (symlinks, `.` and `..` resolved; as given when that fails); a TCP host is
/// every address it resolves to, with the port (`localhost` and `127.0.0.1` share one),
/// or its lower-cased name when it does not resolve. Two URIs name one export when the export
/// names are equal and the address lists share one.
pub fn endpoints(s: &str) -> Result<(Vec<String>, String), String> {
    use std::net::ToSocketAddrs;
    let u = parse(s)?;
    let at = match &u.target {
        Target::Unix(p) => {
            let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            vec![format!("unix:{}", p.display())]
        }
        Target::Tcp { host, port } => match (host.as_str(), *port).to_socket_addrs() {
            Ok(a) => a.map(|a| format!("tcp:{a}")).collect(),
            Err(_) => vec![format!("tcp:{}:{port}", host.to_ascii_lowercase())],
        },
    };
    Ok((at, u.export))
}

/// Decodes `%XX` escapes; the result must be UTF-8 without NUL.
fn decode(s: &str, what: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(v) => out.push(v),
                None => return Err(format!("bad percent-encoding in the {what}")),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err(format!("the {what} contains NUL"));
    }
    String::from_utf8(out).map_err(|_| format!("the {what} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            target: Target::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
        }
    }

    #[test]
    fn endpoints_of_one_export_spelled_two_ways() {
        let d = std::env::temp_dir().join(format!("tc-uri-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("s.sock"), b"").unwrap();
        let a = endpoints(&format!("nbd+unix:///vm?socket={}/s.sock", d.display())).unwrap();
        let b = endpoints(&format!(
            "nbd+unix:///v%6d?socket={}/sub/../s.sock",
            d.display()
        ));
        assert_eq!(b.unwrap(), a);
        assert_eq!(a.1, "vm");
        let (x, e) = endpoints("nbd://LOCALHOST/vm").unwrap();
        let (y, _) = endpoints("nbd://127.0.0.1:10809/vm").unwrap();
        assert_eq!(e, "vm");
        assert!(x.iter().any(|a| y.contains(a)), "{x:?} {y:?}");
        let (z, _) = endpoints("nbd://127.0.0.1:10810/vm").unwrap();
        assert!(!z.iter().any(|a| y.contains(a)), "another port");
        assert!(endpoints("nbd://").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn good_uris() {
        assert_eq!(
            parse("nbd://example.com").unwrap(),
            tcp("example.com", 10809, "")
        );
        assert_eq!(parse("nbd://h/").unwrap(), tcp("h", 10809, ""));
        assert_eq!(parse("nbd://h:1234/disk").unwrap(), tcp("h", 1234, "disk"));
        assert_eq!(parse("nbd://h//abs").unwrap(), tcp("h", 10809, "/abs"));
        assert_eq!(
            parse("nbd://[::1]:99/a%20b").unwrap(),
            tcp("::1", 99, "a b")
        );
        assert_eq!(parse("NBD://[::1]").unwrap(), tcp("::1", 10809, ""));
        assert_eq!(
            parse("nbd+unix:///exp?socket=/tmp/s%3F").unwrap(),
            NbdUri {
                target: Target::Unix("/tmp/s?".into()),
                export: "exp".into()
            }
        );
        assert_eq!(
            parse("nbd+unix://?socket=/s").unwrap().target,
            Target::Unix("/s".into())
        );
    }

    #[test]
    fn bad_uris() {
        for bad in [
            "",
            "nbd",
            "/tmp/sock",
            "http://h/",
            "nbds://h/",
            "nbds+unix:///?socket=/s",
            "nbd+vsock://1/",
            "nbd://",
            "nbd:///exp",
            "nbd://h:0/",
            "nbd://h:99999/",
            "nbd://h:x/",
            "nbd://h:+5/",
            "nbd://::1/",
            "nbd://[::1/",
            "nbd://[::1]x/",
            "nbd://u@h/",
            "nbd://h/%zz",
            "nbd://h/%00",
            "nbd://h/%ff",
            "nbd://h/#frag",
            "nbd://h/?socket=/s",
            "nbd://h/?tls-certificates=/x",
            "nbd+unix:///",
            "nbd+unix:///?socket=",
            "nbd+unix://host/?socket=/s",
            "nbd+unix:///?socket=/a&socket=/b",
            "nbd+unix:///?sockt=/s",
            "nbd://h/ x",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(!e.contains('\n') && !e.is_empty(), "{bad}: {e}");
        }
        let long = format!("nbd://h/{}", "x".repeat(MAX_NAME + 1));
        assert!(parse(&long).is_err());
    }
}
