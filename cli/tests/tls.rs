//! Socket security and TLS of the real daemon (SPEC R7, issue 8 item 4), with real clients:
//!
//! - TLS: certificates made by `openssl` in the test; the daemon with `--tls-cert/--tls-key/
//!   --tls-ca` on loopback TCP and a unix socket; data written and read back with nbdcopy,
//!   nbdinfo and qemu-img (libnbd's `nbds://` URIs with `tls-certificates=DIR`, qemu's
//!   `tls-creds-x509` object), checked against the core file; a client without a certificate,
//!   one with a certificate from another CA and one without TLS are refused (the last with
//!   `NBD_REP_ERR_TLS_REQD`, whose message both clients show);
//! - a TCP listener on a non-loopback address (the machine's own) without TLS, and bad
//!   security flags: the daemon refuses to start with one line, creating nothing;
//! - sockets: admin and NBD unix sockets 0600, or 0660 with `--socket-group` (and the
//!   directory the daemon creates 0750 with the group); the admin socket's peer check run
//!   by clients started as uid `nobody` through `setpriv` (a group member is served, another
//!   uid is refused by the file mode, and — with CAP_DAC_OVERRIDE to get past the file mode —
//!   by the daemon's SO_PEERCRED check with a one-line refusal).
//!
//! Each test starts its own daemon and stops exactly that process.

mod common;

use common::{BIN, Daemon, Dir, Opts, have, run};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use tiercache_testkit::pki::{self, openssl};
use tiercache_testkit::rng::XorShift;

/// Server and client certificates in `dir/pki`, and the client directories libnbd and qemu
/// read (`ca-cert.pem`, `client-cert.pem`, `client-key.pem`): `client` (good), `nocert` (the
/// CA only), `rogue` (a client certificate from another CA).
fn pki(d: &Dir) -> PathBuf {
    let p = d.0.join("pki");
    std::fs::create_dir_all(&p).unwrap();
    pki::good_and_rogue(&p);
    for (dir, cert) in [
        ("client", Some("client")),
        ("nocert", None),
        ("rogue", Some("intruder")),
    ] {
        let c = d.0.join(dir);
        std::fs::create_dir_all(&c).unwrap();
        std::fs::copy(p.join("good-ca.pem"), c.join("ca-cert.pem")).unwrap();
        if dir == "rogue" {
            // Both CAs: the good one checks the server, the other lets qemu accept its own
            // certificate (it checks it before connecting).
            let mut b = std::fs::read(p.join("good-ca.pem")).unwrap();
            b.extend(std::fs::read(p.join("rogue-ca.pem")).unwrap());
            std::fs::write(c.join("ca-cert.pem"), b).unwrap();
        }
        if let Some(n) = cert {
            std::fs::copy(p.join(format!("{n}.pem")), c.join("client-cert.pem")).unwrap();
            std::fs::copy(p.join(format!("{n}-key.pem")), c.join("client-key.pem")).unwrap();
        }
    }
    p
}

/// `n` bytes of a pseudo-random stream seeded by `seed`.
fn data(seed: u64, n: usize) -> Vec<u8> {
    XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).bytes(n)
}

fn mode(p: &str) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.permissions().mode() & 0o777, m.gid())
}

#[test]
fn tls_with_client_certificates_nbdinfo_nbdcopy_qemu_img() {
    if !(have("openssl") && have("nbdinfo") && have("nbdcopy") && have("qemu-img")) {
        return;
    }
    let d = Dir::new("tls-serve");
    let p = pki(&d);
    let pf = |f: &str| p.join(f).display().to_string();
    let core = d.path("core.img");
    std::fs::File::create(&core)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let nbd_sock = d.path("nbd.sock");
    let dm = Daemon::start(Opts::new(&d).args(&[
        "--nbd-listen",
        "tcp:127.0.0.1:0",
        "--tls-cert",
        &pf("server.pem"),
        "--tls-key",
        &pf("server-key.pem"),
        "--tls-ca",
        &pf("good-ca.pem"),
    ]));
    // Both sockets are the owner's only.
    assert_eq!(mode(&d.path("admin.sock")).0, 0o600);
    assert_eq!(mode(&nbd_sock).0, 0o600);
    dm.ok(&["start-cache", "--cache-device", "ram:32m", "--mode", "wt"]);
    dm.add_core(1, &core, "vm");
    let port = dm.tcp_port();
    let good = d.path("client");
    let tcp = |dir: &str| format!("nbds://127.0.0.1:{port}/vm?tls-certificates={dir}");
    let unix = |dir: &str| format!("nbds+unix:///vm?socket={nbd_sock}&tls-certificates={dir}");

    // nbdinfo over TLS, TCP and unix.
    for uri in [tcp(&good), unix(&good)] {
        let (ok, out, err) = run(Command::new("nbdinfo").arg(&uri), 60);
        assert!(ok, "nbdinfo {uri}: {err}");
        assert!(out.contains("with TLS"), "{out}");
        assert!(out.contains("export-size: 67108864"), "{out}");
        println!("nbdinfo {uri}: {}", out.lines().next().unwrap_or(""));
    }

    // 4 MiB written by nbdcopy over TCP+TLS, read back by qemu-img over TCP+TLS.
    let a = data(1, 4 << 20);
    std::fs::write(d.path("a.bin"), &a).unwrap();
    let (ok, _, err) = run(
        Command::new("nbdcopy").args([&d.path("a.bin"), &tcp(&good)]),
        120,
    );
    assert!(ok, "nbdcopy write: {err}");
    let obj = |dir: &str| format!("tls-creds-x509,id=tls0,dir={dir},endpoint=client");
    let img = format!("driver=nbd,host=127.0.0.1,port={port},export=vm,tls-creds=tls0");
    let (ok, _, err) = run(
        Command::new("qemu-img").args([
            "convert",
            "--object",
            &obj(&good),
            "--image-opts",
            &img,
            "-O",
            "raw",
            &d.path("back.raw"),
        ]),
        120,
    );
    assert!(ok, "qemu-img convert (read): {err}");
    let back = std::fs::read(d.path("back.raw")).unwrap();
    assert_eq!(back.len(), 64 << 20);
    assert!(back[..4 << 20] == a[..], "qemu-img read what nbdcopy wrote");
    assert!(back[4 << 20..].iter().all(|&b| b == 0));

    // 1 MiB written by qemu-img over TCP+TLS, read back by nbdcopy over unix+TLS.
    let b = data(2, 1 << 20);
    std::fs::write(d.path("b.bin"), &b).unwrap();
    let (ok, _, err) = run(
        Command::new("qemu-img").args([
            "convert",
            "-n",
            "--object",
            &obj(&good),
            "-f",
            "raw",
            &d.path("b.bin"),
            "--target-image-opts",
            &img,
        ]),
        120,
    );
    assert!(ok, "qemu-img convert (write): {err}");
    let (ok, _, err) = run(
        Command::new("nbdcopy").args([&unix(&good), &d.path("back2.raw")]),
        120,
    );
    assert!(ok, "nbdcopy read: {err}");
    let back2 = std::fs::read(d.path("back2.raw")).unwrap();
    let mut want = a.clone();
    want[..1 << 20].copy_from_slice(&b);
    assert!(
        back2[..4 << 20] == want[..],
        "nbdcopy read what qemu-img wrote"
    );
    // Write-through: the core file holds it too.
    let on_core = std::fs::read(&core).unwrap();
    assert!(
        on_core[..4 << 20] == want[..],
        "the core file holds the data"
    );
    println!(
        "data: 4 MiB nbdcopy->qemu-img and 1 MiB qemu-img->nbdcopy over TLS verified, and on \
         the core file"
    );

    // Refused: no client certificate, a certificate from another CA (GnuTLS then sends none:
    // the server names its CA in the request), no TLS at all.
    let mut failed = 0;
    for dir in ["nocert", "rogue"] {
        let (ok, out, err) = run(Command::new("nbdinfo").arg(tcp(&d.path(dir))), 60);
        assert!(!ok, "nbdinfo with {dir} was served: {out}");
        println!("nbdinfo with {dir}/: {}", err.trim());
        failed += 1;
        dm.wait_log_count("NBD TLS handshake failed", failed, 10);
        let (ok, _, err) = run(
            Command::new("qemu-img").args([
                "info",
                "--object",
                &obj(&d.path(dir)),
                "--image-opts",
                &img,
            ]),
            60,
        );
        assert!(!ok, "qemu-img with {dir} was served");
        println!("qemu-img with {dir}/: {}", err.trim());
        failed += 1;
        dm.wait_log_count("NBD TLS handshake failed", failed, 10);
    }
    let l = dm.log();
    assert!(l.contains("error=\"peer sent no certificates\""), "{l}");
    for x in l.lines().filter(|x| x.contains("handshake failed")) {
        println!("daemon: {x}");
    }
    for uri in [
        format!("nbd://127.0.0.1:{port}/vm"),
        format!("nbd+unix:///vm?socket={nbd_sock}"),
    ] {
        let (ok, _, err) = run(
            Command::new("nbdinfo").arg(&uri).env("LIBNBD_DEBUG", "1"),
            60,
        );
        assert!(!ok, "nbdinfo without TLS was served ({uri})");
        assert!(
            err.contains("server error message: TLS is required"),
            "{uri}: {err}"
        );
    }
    let (ok, _, err) = run(
        Command::new("qemu-img").args([
            "info",
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={port},export=vm"),
        ]),
        60,
    );
    assert!(!ok, "qemu-img without TLS was served");
    assert!(
        err.contains("TLS negotiation required")
            && err.contains("server reported: TLS is required"),
        "{err}"
    );
    println!("qemu-img without TLS: {}", err.trim().replace('\n', " | "));
    dm.stop();
    assert!(!Path::new(&nbd_sock).exists(), "NBD socket removed at stop");
}

/// The machine's own IPv4 address that is not loopback: from `ip`, or from the route a UDP
/// socket would take (nothing is sent).
fn own_address() -> Option<String> {
    if let Ok(o) = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
    {
        let s = String::from_utf8_lossy(&o.stdout);
        for l in s.lines() {
            let mut w = l.split_whitespace();
            while let Some(x) = w.next() {
                if x == "inet"
                    && let Some(a) = w.next()
                {
                    return Some(a.split('/').next().unwrap().to_string());
                }
            }
        }
    }
    let u = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    u.connect("192.0.2.1:9").ok()?;
    let a = u.local_addr().ok()?.ip();
    (!a.is_loopback() && !a.is_unspecified()).then(|| a.to_string())
}

/// `tiercache daemon ARGS` must exit 1 at once with one line containing each of `want`,
/// leaving no socket behind.
fn refuses(d: &Dir, args: &[&str], want: &[&str]) -> String {
    let sock = d.path("refused.sock");
    let (ok, out, err) = run(
        Command::new(BIN)
            .args(["daemon", "--socket", &sock, "--metrics-listen", "none"])
            .args(args),
        30,
    );
    assert!(!ok, "the daemon started with {args:?}: {out}{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    for w in want {
        assert!(err.contains(w), "want {w:?} in: {err}");
    }
    assert!(!Path::new(&sock).exists(), "admin socket left behind");
    println!("refused: {}", err.trim());
    err
}

/// [`refuses`] with TLS files `cert`, `key` and `ca` on the NBD listener `nbd`.
fn refuses_tls(d: &Dir, nbd: &str, files: [&str; 3], want: &[&str]) -> String {
    let [cert, key, ca] = files;
    let tls = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca];
    refuses(d, &[&["--nbd-listen", nbd][..], &tls].concat(), want)
}

#[test]
fn non_loopback_without_tls_and_bad_security_flags_refuse_to_start() {
    let d = Dir::new("tls-refuse");
    let nbd = format!("unix:{}", d.path("n.sock"));
    match own_address() {
        Some(a) => {
            refuses(
                &d,
                &["--nbd-listen", &format!("tcp:{a}:0")],
                &["non-loopback address", &a, "without TLS", "--tls-cert"],
            );
        }
        None => println!("skipped part: this machine has no non-loopback IPv4 address"),
    }
    refuses(
        &d,
        &["--nbd-listen", &nbd, "--nbd-listen", "tcp:0.0.0.0:0"],
        &["non-loopback address 0.0.0.0", "without TLS"],
    );
    assert!(!Path::new(&d.path("n.sock")).exists(), "nothing was bound");
    refuses(
        &d,
        &["--nbd-listen", &nbd, "--tls-cert", "/x.pem"],
        &["go together", "--tls-key and --tls-ca"],
    );
    refuses(
        &d,
        &[
            "--nbd-listen",
            &nbd,
            "--tls-cert",
            &d.path("no.pem"),
            "--tls-key",
            "/k",
            "--tls-ca",
            "/c",
        ],
        &["TLS certificate", "no.pem"],
    );
    refuses(
        &d,
        &["--nbd-listen", &nbd, "--socket-group", "no-such-group-tc"],
        &["--socket-group no-such-group-tc", "no such group"],
    );
    if have("openssl") {
        let p = pki(&d);
        let pf = |f: &str| p.join(f).display().to_string();
        refuses_tls(
            &d,
            &nbd,
            [&pf("server.pem"), &pf("client-key.pem"), &pf("good-ca.pem")],
            &["KeyMismatch"],
        );
    }
}

/// A key `name-key.pem` made by `cmd` run in `dir` (`{}` standing for the file).
fn make_key(dir: &Path, name: &str, cmd: &[&str]) -> Result<String, String> {
    let key = format!("{name}-key.pem");
    let args: Vec<String> = cmd.iter().map(|a| a.replace("{}", &key)).collect();
    let (ok, _, err) = run(
        Command::new(&args[0]).args(&args[1..]).current_dir(dir),
        120,
    );
    if !ok {
        return Err(format!("{args:?}: {err}"));
    }
    Ok(key)
}

/// A server key `name-key.pem` made by `cmd` and its certificate `name.pem`, made by openssl
/// from that key and signed by the CA `good`.
fn key_and_cert(dir: &Path, name: &str, cmd: &[&str]) {
    let key = make_key(dir, name, cmd).unwrap();
    let csr = format!("{name}.csr");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=localhost",
        ],
    );
    pki::sign(dir, "good", name, pki::SERVER_EXT);
}

/// The PEM label and (from `openssl pkey -text`) the size of a key, for the log.
fn describe_key(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let label = text
        .lines()
        .find_map(|l| l.strip_prefix("-----BEGIN "))
        .unwrap_or("?")
        .trim_end_matches('-')
        .to_string();
    let (_, out, _) = run(
        Command::new("openssl")
            .args(["pkey", "-noout", "-text", "-in"])
            .arg(path),
        30,
    );
    format!("{label}, {}", out.lines().next().unwrap_or("").trim())
}

/// Issue 25 item 4: the daemon starts with RSA keys of 2048, 2432, 3072 and 4096 bits, ECDSA
/// P-256 and P-384 and Ed25519 keys, made by GnuTLS's `certtool` (its defaults included) and
/// by `openssl`, in PKCS#1, PKCS#8 and SEC1 PEM, and `nbdinfo nbds://` connects with each;
/// a 1024-bit RSA key, an Ed448 key and an encrypted key are refused in one line saying what
/// was found and what is supported.
#[test]
fn tls_keys_of_every_usual_kind_and_size() {
    if !(have("openssl") && have("nbdinfo")) {
        return;
    }
    let d = Dir::new("tls-keys");
    let p = pki(&d);
    let pf = |f: &str| p.join(f).display().to_string();
    let core = d.sparse("core.img", 8 << 20);
    let certtool = have("certtool");
    if !certtool {
        println!("skipped part: certtool (package gnutls-bin) is not installed: no GnuTLS keys");
    }
    let gnutls: &[(&str, &[&str])] = &[
        (
            "gnutls-default",
            &["certtool", "--generate-privkey", "--outfile", "{}"],
        ),
        (
            "gnutls-rsa2432",
            &[
                "certtool",
                "--generate-privkey",
                "--key-type",
                "rsa",
                "--bits",
                "2432",
                "--outfile",
                "{}",
            ],
        ),
        (
            "gnutls-rsa3072",
            &[
                "certtool",
                "--generate-privkey",
                "--key-type",
                "rsa",
                "--bits",
                "3072",
                "--outfile",
                "{}",
            ],
        ),
        (
            "gnutls-ecdsa",
            &[
                "certtool",
                "--generate-privkey",
                "--key-type",
                "ecdsa",
                "--outfile",
                "{}",
            ],
        ),
        (
            "gnutls-ed25519",
            &[
                "certtool",
                "--generate-privkey",
                "--key-type",
                "ed25519",
                "--outfile",
                "{}",
            ],
        ),
    ];
    let openssl_keys: &[(&str, &[&str])] = &[
        (
            "ossl-rsa2048-pkcs1",
            &["openssl", "genrsa", "-traditional", "-out", "{}", "2048"],
        ),
        (
            "ossl-rsa2432-pkcs8",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2432",
                "-out",
                "{}",
            ],
        ),
        (
            "ossl-rsa4096-pkcs8",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:4096",
                "-out",
                "{}",
            ],
        ),
        (
            "ossl-p256-sec1",
            &[
                "openssl",
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "{}",
            ],
        ),
        (
            "ossl-p384-pkcs8",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-384",
                "-out",
                "{}",
            ],
        ),
        (
            "ossl-ed25519",
            &["openssl", "genpkey", "-algorithm", "ed25519", "-out", "{}"],
        ),
        (
            "ossl-p521-pkcs8",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-521",
                "-out",
                "{}",
            ],
        ),
    ];
    let good: Vec<_> = gnutls
        .iter()
        .filter(|_| certtool)
        .chain(openssl_keys)
        .collect();
    let t0 = std::time::Instant::now();
    for (name, cmd) in &good {
        key_and_cert(&p, name, cmd);
    }
    println!(
        "keys and certificates made in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    for (name, _) in &good {
        let key = pf(&format!("{name}-key.pem"));
        let dm = Daemon::start(Opts::new(&d).args(&[
            "--nbd-listen",
            "tcp:127.0.0.1:0",
            "--tls-cert",
            &pf(&format!("{name}.pem")),
            "--tls-key",
            &key,
            "--tls-ca",
            &pf("good-ca.pem"),
        ]));
        dm.cache_and_core("ram:8m", "wt", &core, "vm");
        let uri = format!(
            "nbds://127.0.0.1:{}/vm?tls-certificates={}",
            dm.tcp_port(),
            d.path("client")
        );
        let (ok, out, err) = run(Command::new("nbdinfo").arg(&uri), 60);
        assert!(ok, "{name}: nbdinfo: {err}");
        assert!(
            out.contains("with TLS") && out.contains("export-size: 8388608"),
            "{out}"
        );
        println!(
            "{name} ({}): served, nbdinfo connected",
            describe_key(Path::new(&key))
        );
        dm.stop();
    }

    // Refused, in one line naming the file, what it holds and what is supported.
    let nbd = format!("unix:{}", d.path("n.sock"));
    let bad: &[(&str, &[&str], &[&str])] = &[
        (
            "rsa1024",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:1024",
                "-out",
                "{}",
            ],
            &[
                "RSA key of 1024 bits: at least 2048 needed",
                "supported: RSA of 2048 to 8192 bits",
            ],
        ),
        (
            "ed448",
            &["openssl", "genpkey", "-algorithm", "ed448", "-out", "{}"],
            &["Ed448 key: not supported", "supported:"],
        ),
        (
            "encrypted",
            &[
                "openssl",
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-aes-128-cbc",
                "-pass",
                "pass:x",
                "-out",
                "{}",
            ],
            &[
                "no private key",
                "only ENCRYPTED PRIVATE KEY",
                "unencrypted",
            ],
        ),
    ];
    for (name, cmd, want) in bad {
        // The daemon refuses the key before it compares it with the certificate.
        let key = match make_key(&p, name, cmd) {
            Ok(k) => pf(&k),
            Err(e) => {
                println!("skipped part: {name}: this openssl cannot make it: {e}");
                continue;
            }
        };
        let mut want = want.to_vec();
        want.push(&key);
        refuses_tls(
            &d,
            &nbd,
            [&pf("server.pem"), &key, &pf("good-ca.pem")],
            &want,
        );
    }
}

/// Runs `tiercache ARGS` as uid `nobody` with primary group `gid` and no other group;
/// `dac_override`: with CAP_DAC_OVERRIDE (past file modes, not past the daemon's check).
fn as_nobody(bin: &str, gid: u32, dac_override: bool, args: &[&str]) -> (bool, String, String) {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid",
        "65534",
        "--regid",
        &gid.to_string(),
        "--clear-groups",
    ]);
    if dac_override {
        c.args([
            "--inh-caps",
            "+dac_override",
            "--ambient-caps",
            "+dac_override",
        ]);
    }
    c.arg(bin).args(args);
    run(&mut c, 60)
}

#[test]
fn socket_modes_group_and_admin_peer_credentials() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root (to run clients as another uid with setpriv)");
        return;
    }
    if !Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("skipped: setpriv (util-linux) not installed");
        return;
    }
    let d = Dir::new("tls-group");
    // Others must be able to reach into the test directory, and run a copy of the binary.
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = d.path("tiercache");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nogroup = 65534u32;
    let other = 54321u32; // a gid nobody is in

    // With a group: 0660 sockets of that group, the directory the daemon made 0750.
    let run_dir = d.path("run");
    let admin = format!("{run_dir}/admin.sock");
    let nbd = format!("{run_dir}/nbd.sock");
    let dm = Daemon::start(Opts::new(&d).socket(&admin).no_nbd().args(&[
        "--nbd-listen",
        &format!("unix:{nbd}"),
        "--socket-group",
        "nogroup",
    ]));
    assert_eq!(mode(&admin), (0o660, nogroup));
    assert_eq!(mode(&nbd), (0o660, nogroup));
    assert_eq!(mode(&run_dir), (0o750, nogroup));
    assert!(
        dm.log().contains("socket_group=\"nogroup (65534)\""),
        "{}",
        dm.log()
    );
    // A member of the group is served.
    let (ok, out, err) = as_nobody(&bin, nogroup, false, &["list", "--socket", &admin]);
    assert!(ok, "group member refused: {err}");
    println!("uid nobody, gid nogroup: list -> {:?}", out.trim());
    // Someone else cannot even connect (the file mode).
    let (ok, _, err) = as_nobody(&bin, other, false, &["list", "--socket", &admin]);
    assert!(!ok);
    assert!(err.contains("Permission denied"), "{err}");
    println!("uid nobody, gid {other}: {}", err.trim());
    // Past the file mode with CAP_DAC_OVERRIDE: the daemon's peer check refuses, one line.
    let (ok, _, err) = as_nobody(&bin, other, true, &["list", "--socket", &admin]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "permission denied: only root, the daemon's user (uid 0), or members of \
                      group nogroup (65534) may manage it; this connection is uid 65534 gid \
                      54321"
        ),
        "{err}"
    );
    println!("uid nobody, gid {other}, CAP_DAC_OVERRIDE: {}", err.trim());
    let l = dm.wait_log("admin connection refused");
    assert!(l.contains("uid=65534 gid=54321"), "{l}");
    // A member of the group reaches the NBD socket (the protocol answers: no such export);
    // someone else does not.
    if have("nbdinfo") {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["nbdinfo", "--list", &format!("nbd+unix:///?socket={nbd}")]);
        let (ok, _, err) = run(&mut c, 60);
        assert!(ok, "group member cannot list NBD exports: {err}");
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            "65534",
            "--regid",
            &other.to_string(),
            "--clear-groups",
        ])
        .args(["nbdinfo", "--list", &format!("nbd+unix:///?socket={nbd}")]);
        let (ok, _, err) = run(&mut c, 60);
        assert!(!ok);
        assert!(err.contains("Permission denied"), "{err}");
    }
    dm.stop();

    // Without a group: 0600, and a uid other than root and the daemon's is refused by the
    // peer check even past the file mode, whatever its group.
    let admin2 = d.path("admin2.sock");
    let nbd2 = d.path("nbd2.sock");
    let dm = Daemon::start(
        Opts::new(&d)
            .socket(&admin2)
            .no_nbd()
            .args(&["--nbd-listen", &format!("unix:{nbd2}")]),
    );
    assert_eq!(mode(&admin2).0, 0o600);
    assert_eq!(mode(&nbd2).0, 0o600);
    for gid in [nogroup, 0] {
        let (ok, _, err) = as_nobody(&bin, gid, true, &["list", "--socket", &admin2]);
        assert!(!ok, "gid {gid} served");
        assert!(
            err.contains("permission denied: only root, the daemon's user (uid 0) may manage it"),
            "{err}"
        );
    }
    let (ok, _, err) = as_nobody(&bin, nogroup, false, &["list", "--socket", &admin2]);
    assert!(!ok);
    assert!(err.contains("Permission denied"), "{err}");
    // Root is served.
    dm.ok(&["list"]);
    dm.stop();
}
