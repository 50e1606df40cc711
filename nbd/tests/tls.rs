//! TLS (SPEC C11, R7) against a hand-written client that speaks TLS with rustls: the
//! protocol's FORCEDTLS mode option by option, transmission inside TLS (pipelined, large,
//! verified), a `close_notify` at the end, clients without a certificate or with one from
//! another CA refused, non-TLS bytes after the ACK, and one-line errors for bad files. The
//! certificates are made by the `openssl` command in each run (the test is skipped, saying so,
//! without it). Interoperability with nbdinfo and qemu-img is in `cli/tests/tls.rs`.

mod common;

use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_io::RamBackend;
use tiercache_nbd::proto::{self, be64, cmd, info, opt, rep, reply};
use tiercache_nbd::{BackendExport, BoundAddr, ExportMap, ListenAddr, Server, ServerConfig};
use tiercache_nbd::{TlsConfig, non_loopback_refusal};

/// Certificates for one test: a CA, a server certificate for 127.0.0.1/localhost, a client
/// certificate, and a client certificate from another CA.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn file(&self, f: &str) -> PathBuf {
        self.dir.join(f)
    }
}

/// The certificates, or `None` (with the skip line printed) without `openssl`.
fn pki(dir: &TmpDir) -> Option<Pki> {
    if !tiercache_testkit::installed("openssl") {
        println!("skipped: the openssl command is not installed (it makes the test certificates)");
        return None;
    }
    let d = dir.0.0.clone();
    tiercache_testkit::pki::good_and_rogue(&d);
    Some(Pki { dir: d })
}

fn server_tls(p: &Pki) -> TlsConfig {
    TlsConfig::from_files(
        &p.file("server.pem"),
        &p.file("server-key.pem"),
        &p.file("good-ca.pem"),
    )
    .expect("server TLS config")
}

/// A client configuration trusting the good CA, presenting `cert` (`None`: no certificate).
fn client_tls(p: &Pki, cert: Option<&str>) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(p.file("good-ca.pem")).unwrap())
        .unwrap();
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match cert {
        Some(name) => b
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(p.file(&format!("{name}.pem"))).unwrap()],
                PrivateKeyDer::from_pem_file(p.file(&format!("{name}-key.pem"))).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    })
}

/// Reads the greeting and answers with fixed newstyle flags.
fn hello<S: Read + Write>(s: &mut S) {
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(be64(&g), proto::NBDMAGIC);
    assert_eq!(be64(&g[8..]), proto::IHAVEOPT);
    s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
}

fn send_opt(s: &mut impl Write, option: u32, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&proto::option_request(option, data))?;
    s.flush()
}

/// Replies to `option` up to the ACK or an error: (type, data) each.
fn replies(s: &mut impl Read, option: u32) -> std::io::Result<Vec<(u32, Vec<u8>)>> {
    let mut v = Vec::new();
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h)?;
        let h = proto::OptionReplyHeader::decode(&h);
        assert_eq!(h.magic, proto::OPT_REPLY_MAGIC);
        assert_eq!(h.option, option);
        let typ = h.typ;
        let mut d = vec![0u8; h.len as usize];
        s.read_exact(&mut d)?;
        let end = typ == rep::ACK || typ & rep::ERR != 0;
        v.push((typ, d));
        if end {
            return Ok(v);
        }
    }
}

fn opt_rs<S: Read + Write>(s: &mut S, option: u32, data: &[u8]) -> Vec<(u32, Vec<u8>)> {
    send_opt(s, option, data).unwrap();
    replies(s, option).unwrap()
}

/// The last reply type of an option.
fn opt_end<S: Read + Write>(s: &mut S, option: u32, data: &[u8]) -> u32 {
    opt_rs(s, option, data).last().unwrap().0
}

fn go_data(name: &str) -> Vec<u8> {
    proto::encode_info_request(name, &[info::BLOCK_SIZE])
}

/// Whether the server ended the connection (EOF, reset, or a TLS alert) within 5 s.
fn ended(s: &mut impl Read) -> bool {
    let mut b = [0u8; 256];
    let t = Instant::now();
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return true,
            Ok(_) if t.elapsed() < Duration::from_secs(5) => continue,
            Ok(_) => return false,
        }
    }
}

/// A server with an 8 MiB RAM export `disk`, TLS on a unix socket and on loopback TCP.
fn tls_server(p: &Pki, dir: &TmpDir) -> (Server, PathBuf, std::net::SocketAddr) {
    let ex = Arc::new(ExportMap::new());
    ex.insert(
        "disk",
        "RAM",
        Arc::new(BackendExport::new(Arc::new(RamBackend::new(8 << 11)))),
    );
    let srv = Server::new(
        ex,
        ServerConfig {
            handshake_timeout: Duration::from_secs(10),
            ..ServerConfig::default()
        },
    );
    let sock = dir.path("tls.sock");
    srv.listen_tls(&ListenAddr::Unix(sock.clone()), Some(server_tls(p)))
        .unwrap();
    let BoundAddr::Tcp(addr) = srv
        .listen_tls(&ListenAddr::Tcp("127.0.0.1:0".into()), Some(server_tls(p)))
        .unwrap()
    else {
        panic!("not TCP")
    };
    (srv, sock, addr)
}

fn unix(sock: &Path) -> std::os::unix::net::UnixStream {
    let s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Hello, STARTTLS (acknowledged), and the TLS session over `s`.
fn upgrade<S: Read + Write>(mut s: S, cfg: Arc<ClientConfig>) -> StreamOwned<ClientConnection, S> {
    hello(&mut s);
    assert_eq!(opt_end(&mut s, opt::STARTTLS, &[]), rep::ACK);
    let conn = ClientConnection::new(cfg, ServerName::try_from("localhost").unwrap()).unwrap();
    StreamOwned::new(conn, s)
}

fn req(typ: u16, flags: u16, cookie: u64, offset: u64, len: u32, data: &[u8]) -> Vec<u8> {
    let mut m = common::wire::request(typ, flags, cookie, offset, len);
    m.extend_from_slice(data);
    m
}

/// One structured reply chunk: (cookie, type, payload).
fn chunk(s: &mut impl Read) -> (u64, u16, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    let h = proto::StructuredHeader::decode(&h);
    assert_eq!(h.magic, proto::STRUCTURED_REPLY_MAGIC);
    assert_eq!(h.flags, reply::FLAG_DONE);
    let mut p = vec![0u8; h.len as usize];
    s.read_exact(&mut p).unwrap();
    (h.cookie, h.typ, p)
}

fn block(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i.wrapping_mul(31) as usize + k * 7 + (k >> 9)) as u8)
        .collect()
}

/// In TLS: options work, STARTTLS again is invalid, GO, then pipelined writes and reads of
/// 256 KiB verified, a flush, and DISC answered by a `close_notify`.
fn session<S: Read + Write>(t: &mut StreamOwned<ClientConnection, S>, seed: u64) {
    assert_eq!(opt_end(t, opt::STARTTLS, &[]), rep::ERR_INVALID);
    let list = opt_rs(t, opt::LIST, &[]);
    assert_eq!(list.len(), 2, "one export and the ACK");
    assert_eq!(&list[0].1[4..], b"diskRAM");
    assert_eq!(opt_end(t, opt::STRUCTURED_REPLY, &[]), rep::ACK);
    let r = opt_rs(t, opt::GO, &go_data("disk"));
    assert_eq!(r.last().unwrap().0, rep::ACK, "{r:?}");
    let n = 32u64;
    let len = 256 << 10;
    let mut m = Vec::new();
    for i in 0..n {
        m.extend_from_slice(&req(
            cmd::WRITE,
            0,
            i,
            i * len as u64,
            len as u32,
            &block(i + seed, len),
        ));
    }
    t.write_all(&m).unwrap();
    t.flush().unwrap();
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let (c, typ, _) = chunk(t);
        assert_eq!(typ, reply::TYPE_NONE);
        seen[c as usize] = true;
    }
    assert!(seen.iter().all(|&x| x));
    let mut m = Vec::new();
    for i in 0..n {
        m.extend_from_slice(&req(cmd::READ, 0, 100 + i, i * len as u64, len as u32, &[]));
    }
    m.extend_from_slice(&req(cmd::FLUSH, 0, 999, 0, 0, &[]));
    t.write_all(&m).unwrap();
    t.flush().unwrap();
    for _ in 0..=n {
        let (c, typ, p) = chunk(t);
        if c == 999 {
            assert_eq!(typ, reply::TYPE_NONE);
            continue;
        }
        assert_eq!(typ, reply::TYPE_OFFSET_DATA);
        let i = c - 100;
        assert_eq!(be64(&p), i * len as u64);
        assert!(p[8..] == block(i + seed, len)[..], "data of block {i}");
    }
    t.write_all(&req(cmd::DISC, 0, 0, 0, 0, &[])).unwrap();
    t.flush().unwrap();
    let mut b = [0u8; 16];
    // A clean TLS end (close_notify) reads as 0; an end without one is an error.
    assert_eq!(t.read(&mut b).unwrap(), 0, "close_notify after DISC");
}

#[test]
fn forced_tls_options_before_starttls_then_a_whole_session_inside_tls() {
    let dir = TmpDir::new("tls-forced");
    let Some(p) = pki(&dir) else { return };
    let (srv, sock, addr) = tls_server(&p, &dir);

    // Before TLS: every option but STARTTLS and ABORT gets ERR_TLS_REQD (the data is read
    // and the handshake goes on); STARTTLS with data is invalid.
    let mut s = unix(&sock);
    hello(&mut s);
    for (o, d) in [
        (opt::LIST, vec![]),
        (opt::STRUCTURED_REPLY, vec![]),
        (opt::INFO, go_data("disk")),
        (opt::GO, go_data("disk")),
        (4242, b"whatever".to_vec()),
    ] {
        let r = opt_rs(&mut s, o, &d);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, rep::ERR_TLS_REQD, "option {o}");
        assert!(
            String::from_utf8_lossy(&r[0].1).contains("STARTTLS"),
            "{:?}",
            String::from_utf8_lossy(&r[0].1)
        );
    }
    assert_eq!(opt_end(&mut s, opt::STARTTLS, b"x"), rep::ERR_INVALID);
    // ABORT is acknowledged.
    assert_eq!(opt_end(&mut s, opt::ABORT, &[]), rep::ACK);
    assert!(ended(&mut s));

    // EXPORT_NAME before TLS cannot be refused with an error: the connection ends.
    let mut s = unix(&sock);
    hello(&mut s);
    send_opt(&mut s, opt::EXPORT_NAME, b"disk").unwrap();
    assert!(ended(&mut s));

    // A whole session over TLS on the unix socket and on loopback TCP.
    let mut t = upgrade(unix(&sock), client_tls(&p, Some("client")));
    session(&mut t, 1);
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut t = upgrade(tcp, client_tls(&p, Some("client")));
    session(&mut t, 2);
    wait_open(&srv, 0);
    let st = srv.stats();
    assert_eq!(st.transmitting, 2, "{st:?}");
    assert_eq!(st.tls_refused, 0, "{st:?}");
    srv.shutdown();
}

#[test]
fn clients_without_a_certificate_from_the_ca_are_refused() {
    let dir = TmpDir::new("tls-refuse");
    let Some(p) = pki(&dir) else { return };
    let (srv, sock, addr) = tls_server(&p, &dir);
    // No certificate, and a certificate signed by another CA: the TLS handshake fails, and
    // nothing of the NBD protocol is answered.
    for (who, cert) in [("no certificate", None), ("another CA", Some("intruder"))] {
        let mut t = upgrade(unix(&sock), client_tls(&p, cert));
        let r = send_opt(&mut t, opt::LIST, &[]).and_then(|_| replies(&mut t, opt::LIST));
        assert!(r.is_err(), "{who}: the server answered {r:?}");
        let tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut t = upgrade(tcp, client_tls(&p, cert));
        let r = send_opt(&mut t, opt::LIST, &[]).and_then(|_| replies(&mut t, opt::LIST));
        assert!(r.is_err(), "{who} over TCP: the server answered {r:?}");
    }
    // Plain NBD bytes where the TLS handshake should be.
    let mut s = unix(&sock);
    hello(&mut s);
    assert_eq!(opt_end(&mut s, opt::STARTTLS, &[]), rep::ACK);
    send_opt(&mut s, opt::LIST, &[]).unwrap();
    assert!(ended(&mut s));
    wait_open(&srv, 0);
    let st = srv.stats();
    assert_eq!(st.tls_refused, 5, "{st:?}");
    assert_eq!(st.transmitting, 0, "{st:?}");
    // The server still serves a good client.
    let mut t = upgrade(unix(&sock), client_tls(&p, Some("client")));
    session(&mut t, 3);
    srv.shutdown();
}

#[test]
fn listeners_without_tls_and_bad_tls_files() {
    let dir = TmpDir::new("tls-files");
    let srv = Server::new(Arc::new(ExportMap::new()), ServerConfig::default());
    // Non-loopback TCP without TLS: refused, in one line that says what to do.
    for a in ["0.0.0.0:0", "[::]:0", "192.0.2.1:10809"] {
        let e = srv.listen(&ListenAddr::Tcp(a.into())).unwrap_err();
        assert!(e.contains("without TLS") && e.contains("--tls-cert"), "{e}");
        assert_eq!(e.lines().count(), 1);
        let e2 = ListenAddr::Tcp(a.into()).non_loopback().unwrap().unwrap();
        assert_eq!(non_loopback_refusal(&e2, a), e);
    }
    assert_eq!(
        ListenAddr::Tcp("127.0.0.1:1".into())
            .non_loopback()
            .unwrap(),
        None
    );
    srv.shutdown();
    let Some(p) = pki(&dir) else { return };
    let f = |c: &str, k: &str, ca: &str| {
        TlsConfig::from_files(&p.file(c), &p.file(k), &p.file(ca)).unwrap_err()
    };
    std::fs::write(p.file("empty.pem"), b"").unwrap();
    std::fs::write(
        p.file("junk.pem"),
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n",
    )
    .unwrap();
    for (e, want) in [
        (f("nope.pem", "server-key.pem", "good-ca.pem"), "nope.pem"),
        (
            f("empty.pem", "server-key.pem", "good-ca.pem"),
            "no certificate",
        ),
        (
            f("server.pem", "server.pem", "good-ca.pem"),
            "no private key",
        ),
        (
            f("server.pem", "client-key.pem", "good-ca.pem"),
            "server.pem",
        ),
        (f("server.pem", "server-key.pem", "empty.pem"), "client CA"),
        (f("server.pem", "server-key.pem", "junk.pem"), "junk.pem"),
    ] {
        assert!(e.contains(want), "want {want:?} in {e:?}");
        assert_eq!(e.lines().count(), 1, "{e}");
        println!("refused: {e}");
    }
}

/// Waits until the server has `n` connections open.
fn wait_open(srv: &Server, n: u64) {
    let t = Instant::now();
    while srv.stats().open != n {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "open connections: {:?}",
            srv.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
