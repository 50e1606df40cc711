//! NBD URIs as the load generator keeps them (parsed by `tiercache-nbd-proto`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::Error;
use tiercache_nbd_proto::uri;

/// Where an NBD export lives: parsed from `nbd+unix:///NAME?socket=PATH` or
/// `nbd://HOST[:PORT]/NAME` (port 10809 by default; `[v6addr]` accepted; percent-encoding
/// decoded).
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
    /// Parses an NBD URI (`tiercache-nbd-proto`'s parser); see [`Target`] for the accepted
    /// forms.
    pub fn parse(uri: &str) -> Result<Target, Error> {
        let u = uri::parse(uri).map_err(|why| Error::Uri(format!("{uri}: {why}")))?;
        Ok(match u.target {
            uri::Target::Unix(socket) => Target::Unix {
                socket,
                export: u.export,
            },
            uri::Target::Tcp { host, port } => Target::Tcp {
                host,
                port,
                export: u.export,
            },
        })
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
