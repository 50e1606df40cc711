//! NBD URIs (the subset of the NBD URI spec a load generator needs).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::Error;

/// Where an NBD export lives: parsed from `nbd+unix:///NAME?socket=PATH` or
/// `nbd://HOST[:PORT]/NAME` (port 10809 by default; `[v6addr]` accepted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Target {
    /// A unix-domain socket.
    Unix {
        /// The socket's path.
        socket: PathBuf,
        /// The export name (may be empty: the server's default export).
        export: String,
    },
    /// A TCP address.
    Tcp {
        /// Host name or address (IPv6 without brackets).
        host: String,
        /// TCP port.
        port: u16,
        /// The export name (may be empty).
        export: String,
    },
}

impl Target {
    /// Parses an NBD URI; see [`Target`] for the accepted forms.
    pub fn parse(uri: &str) -> Result<Target, Error> {
        let bad = |why: &str| Error::Uri(format!("{uri}: {why}"));
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path, query) = match rest.split_once('?') {
                Some((p, q)) => (p, q),
                None => return Err(bad("missing ?socket=PATH")),
            };
            if !path.is_empty() && !path.starts_with('/') {
                return Err(bad(
                    "nbd+unix URIs have no authority (use nbd+unix:///NAME?...)",
                ));
            }
            let export = percent_decode(path.strip_prefix('/').unwrap_or(path));
            let mut socket = None;
            for kv in query.split('&') {
                if let Some(v) = kv.strip_prefix("socket=") {
                    socket = Some(PathBuf::from(percent_decode(v)));
                }
            }
            let socket = socket.ok_or_else(|| bad("missing socket= in the query"))?;
            Ok(Target::Unix { socket, export })
        } else if let Some(rest) = uri.strip_prefix("nbd://") {
            let rest = rest.split('?').next().unwrap_or("");
            let (auth, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, ""),
            };
            let (host, port) = if let Some(r) = auth.strip_prefix('[') {
                let (h, after) = r.split_once(']').ok_or_else(|| bad("unclosed ["))?;
                (h, after.strip_prefix(':'))
            } else {
                match auth.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (auth, None),
                }
            };
            if host.is_empty() {
                return Err(bad("missing host"));
            }
            let port = match port {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None => 10809,
            };
            Ok(Target::Tcp {
                host: host.to_string(),
                port,
                export: percent_decode(path),
            })
        } else {
            Err(bad("expected nbd+unix:// or nbd://"))
        }
    }

    /// The export name.
    pub fn export(&self) -> &str {
        match self {
            Target::Unix { export, .. } | Target::Tcp { export, .. } => export,
        }
    }
}

impl FromStr for Target {
    type Err = Error;
    fn from_str(s: &str) -> Result<Target, Error> {
        Target::parse(s)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unix { socket, export } => {
                write!(f, "nbd+unix:///{export}?socket={}", socket.display())
            }
            Target::Tcp { host, port, export } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{export}")
            }
            Target::Tcp { host, port, export } => write!(f, "nbd://{host}:{port}/{export}"),
        }
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        assert_eq!(
            Target::parse("nbd+unix:///?socket=/tmp/s").unwrap(),
            Target::Unix {
                socket: "/tmp/s".into(),
                export: String::new()
            }
        );
        assert_eq!(
            Target::parse("nbd+unix:///disk%201?socket=/tmp/a%20b").unwrap(),
            Target::Unix {
                socket: "/tmp/a b".into(),
                export: "disk 1".into()
            }
        );
        assert_eq!(
            Target::parse("nbd://localhost/x").unwrap(),
            Target::Tcp {
                host: "localhost".into(),
                port: 10809,
                export: "x".into()
            }
        );
        assert_eq!(
            Target::parse("nbd://[::1]:1234/").unwrap(),
            Target::Tcp {
                host: "::1".into(),
                port: 1234,
                export: String::new()
            }
        );
        assert_eq!(
            Target::parse("nbd://127.0.0.1:99").unwrap(),
            Target::Tcp {
                host: "127.0.0.1".into(),
                port: 99,
                export: String::new()
            }
        );
        assert!(Target::parse("nbd+unix:///x").is_err());
        assert!(Target::parse("http://x").is_err());
        assert!(Target::parse("nbd://:5/x").is_err());
        for u in ["nbd+unix:///e?socket=/s", "nbd://h:1/e", "nbd://[::1]:2/e"] {
            assert_eq!(Target::parse(u).unwrap().to_string(), u);
        }
    }
}
