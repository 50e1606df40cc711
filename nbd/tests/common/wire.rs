//! A hand-written NBD client on raw sockets (every byte under the test's control) and a
//! server with a plain RAM export, for the tests of malformed and hostile input (raw.rs,
//! bad_input.rs).

use super::TmpDir;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_io::RamBackend;
use tiercache_nbd::proto::{self, cmd, info, opt, rep, reply};
use tiercache_nbd::{BackendExport, ExportMap, ListenAddr, Server, ServerConfig};

pub trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

pub struct Client<S: Stream> {
    pub s: S,
    pub structured: bool,
}

/// A request header.
pub fn request(typ: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    proto::request(typ, flags, cookie, offset, len).to_vec()
}

pub use proto::{be32, be64};

/// One option reply: (option, type, data).
pub type OptReply = (u32, u32, Vec<u8>);

impl<S: Stream> Client<S> {
    /// Reads the greeting and sends `cflags`.
    pub fn hello(mut s: S, cflags: u32) -> Client<S> {
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(
            g,
            proto::greeting(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES)
        );
        s.write_all(&cflags.to_be_bytes()).unwrap();
        Client {
            s,
            structured: false,
        }
    }

    pub fn send_opt(&mut self, option: u32, data: &[u8]) {
        self.s
            .write_all(&proto::option_request(option, data))
            .unwrap();
    }

    pub fn read_opt_reply(&mut self) -> std::io::Result<OptReply> {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h)?;
        let h = proto::OptionReplyHeader::decode(&h);
        assert_eq!(h.magic, proto::OPT_REPLY_MAGIC);
        let mut d = vec![0u8; h.len as usize];
        self.s.read_exact(&mut d)?;
        Ok((h.option, h.typ, d))
    }

    /// Sends `option` and reads replies up to the ACK or an error.
    pub fn opt(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        self.send_opt(option, data);
        let mut v = Vec::new();
        loop {
            let r = self.read_opt_reply().unwrap();
            assert_eq!(r.0, option);
            let end = r.1 == rep::ACK || r.1 & rep::ERR != 0;
            v.push(r);
            if end {
                return v;
            }
        }
    }

    pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
        proto::encode_info_request(name, infos)
    }

    /// `NBD_OPT_GO` to `name`; returns the export size.
    pub fn go(&mut self, name: &str) -> u64 {
        self.go_asking(name, &[info::BLOCK_SIZE])
    }

    /// `NBD_OPT_GO` to `name` asking for `infos` (without `NBD_INFO_BLOCK_SIZE`, the client
    /// negotiates no block sizes: any alignment is served); returns the export size.
    pub fn go_asking(&mut self, name: &str, infos: &[u16]) -> u64 {
        let r = self.opt(opt::GO, &Self::info_data(name, infos));
        let last = r.last().unwrap();
        assert_eq!(
            last.1,
            rep::ACK,
            "GO {name}: {:?}",
            String::from_utf8_lossy(&last.2)
        );
        let e = r
            .iter()
            .find(|x| x.1 == rep::INFO && x.2[..2] == info::EXPORT.to_be_bytes())
            .expect("NBD_INFO_EXPORT");
        be64(&e.2[2..])
    }

    pub fn send_req(
        &mut self,
        typ: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) {
        self.try_send_req(typ, flags, cookie, offset, len, data)
            .unwrap();
    }

    pub fn try_send_req(
        &mut self,
        typ: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<()> {
        let mut m = request(typ, flags, cookie, offset, len);
        m.extend_from_slice(data);
        self.s.write_all(&m)
    }

    /// Sends bytes as they are, in one write (several requests at once: [`request`]).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// Reads one reply: (cookie, error, data). `read_len`: the length of the read it answers
    /// (simple replies do not say).
    pub fn reply(&mut self, read_len: impl Fn(u64) -> usize) -> (u64, u32, Vec<u8>) {
        if self.structured {
            let mut h = [0u8; 20];
            self.s.read_exact(&mut h).unwrap();
            let h = proto::StructuredHeader::decode(&h);
            assert_eq!(h.magic, proto::STRUCTURED_REPLY_MAGIC);
            assert_eq!(h.flags, reply::FLAG_DONE);
            let (typ, cookie) = (h.typ, h.cookie);
            let mut p = vec![0u8; h.len as usize];
            self.s.read_exact(&mut p).unwrap();
            match typ {
                reply::TYPE_NONE => (cookie, 0, vec![]),
                reply::TYPE_OFFSET_DATA => (cookie, 0, p[8..].to_vec()),
                reply::TYPE_ERROR => {
                    let n = u16::from_be_bytes([p[4], p[5]]) as usize;
                    assert_eq!(p.len(), 6 + n);
                    assert!(std::str::from_utf8(&p[6..]).is_ok());
                    (cookie, be32(&p), p[6..].to_vec())
                }
                t => panic!("unexpected chunk type {t}"),
            }
        } else {
            let mut h = [0u8; 16];
            self.s.read_exact(&mut h).unwrap();
            let h = proto::SimpleReply::decode(&h);
            assert_eq!(h.magic, proto::SIMPLE_REPLY_MAGIC);
            let (err, cookie) = (h.error, h.cookie);
            let mut d = vec![];
            if err == 0 {
                d = vec![0u8; read_len(cookie)];
                self.s.read_exact(&mut d).unwrap();
            }
            (cookie, err, d)
        }
    }

    /// One request, one reply: (error, data).
    pub fn call(
        &mut self,
        typ: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> (u32, Vec<u8>) {
        self.send_req(typ, flags, 77, offset, len, data);
        let rl = if typ == cmd::READ { len as usize } else { 0 };
        let (c, e, d) = self.reply(|_| rl);
        assert_eq!(c, 77);
        (e, d)
    }

    /// Whether the server closed the connection (EOF or reset) within 5 s.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) | Err(_) => return true,
                Ok(_) => continue, // option replies before the close
            }
        }
    }
}

pub fn connect(sock: &Path) -> UnixStream {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// A client past the greeting, after `NBD_OPT_STRUCTURED_REPLY` if `structured`.
pub fn opened(sock: &Path, structured: bool) -> Client<UnixStream> {
    let mut c = Client::hello(
        connect(sock),
        proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES,
    );
    if structured {
        let r = c.opt(opt::STRUCTURED_REPLY, &[]);
        assert_eq!(r[0].1, rep::ACK);
        c.structured = true;
    }
    c
}

pub fn ready(sock: &Path, name: &str, structured: bool) -> (Client<UnixStream>, u64) {
    let mut c = opened(sock, structured);
    let size = c.go(name);
    (c, size)
}

/// A client in transmission on `name` through `NBD_OPT_EXPORT_NAME` (no block sizes
/// negotiated), after `NBD_OPT_STRUCTURED_REPLY` if `structured`; and the export size.
pub fn export_name(sock: &Path, name: &str, structured: bool) -> (Client<UnixStream>, u64) {
    let mut c = opened(sock, structured);
    c.send_opt(opt::EXPORT_NAME, name.as_bytes());
    let mut b = [0u8; 10];
    c.s.read_exact(&mut b).unwrap();
    (c, be64(&b))
}

/// A server with a plain 8 MiB RAM export `plain` and a refused export `gone`.
pub fn plain_server(tag: &str, cfg: ServerConfig) -> (Server, std::path::PathBuf, TmpDir) {
    let dir = TmpDir::new(tag);
    let ex = Arc::new(ExportMap::new());
    ex.insert(
        "plain",
        "plain RAM",
        Arc::new(BackendExport::new(Arc::new(RamBackend::new(8 << 11)))),
    );
    ex.refuse("gone", "", "cache device missing: not served");
    let srv = Server::new(ex, cfg);
    let sock = dir.path("s.sock");
    srv.listen(&ListenAddr::Unix(sock.clone())).unwrap();
    (srv, sock, dir)
}

pub fn still_serves(sock: &Path) {
    let (mut c, size) = ready(sock, "plain", true);
    assert_eq!(size, 8 << 20);
    let (e, _) = c.call(cmd::WRITE, 0, 4096, 512, &[7u8; 512]);
    assert_eq!(e, 0);
    let (e, d) = c.call(cmd::READ, 0, 4096, 512, &[]);
    assert_eq!((e, d), (0, vec![7u8; 512]));
    c.send_req(cmd::DISC, 0, 0, 0, 0, &[]);
    assert!(c.closed());
}

pub fn wait_open(srv: &Server, n: u64) {
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
