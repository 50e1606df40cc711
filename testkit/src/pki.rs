//! Test certificates made by the `openssl` command (EC P-256, valid two days), in a directory
//! of the test's: a CA `NAME` is `NAME-ca.pem` and `NAME-ca-key.pem`, a certificate `NAME` is
//! `NAME.pem` and `NAME-key.pem`.

use std::path::Path;
use std::process::Command;

/// The extensions of a server certificate for 127.0.0.1 and localhost.
pub const SERVER_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,\
                              keyEncipherment\nextendedKeyUsage=serverAuth\n\
                              subjectAltName=IP:127.0.0.1,DNS:localhost\n";
/// The extensions of a client certificate.
pub const CLIENT_EXT: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,\
                              keyEncipherment\nextendedKeyUsage=clientAuth\n";

/// `openssl ARGS` in `dir`, which must succeed within 60 s.
pub fn openssl(dir: &Path, args: &[&str]) {
    let (ok, _, err) = crate::run(Command::new("openssl").args(args).current_dir(dir), 60);
    assert!(ok, "openssl {args:?}: {err}");
}

/// `openssl req` options for a new P-256 key, not encrypted.
const NEW_EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

/// A CA `name`: `name-ca.pem`, `name-ca-key.pem`.
pub fn make_ca(dir: &Path, name: &str) {
    let (key, cert, subj) = (
        format!("{name}-ca-key.pem"),
        format!("{name}-ca.pem"),
        format!("/CN=tiercache test CA {name}"),
    );
    let mut args = vec!["req", "-x509"];
    args.extend(NEW_EC_KEY);
    args.extend(["-keyout", &key, "-out", &cert, "-days", "2", "-subj", &subj]);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
    openssl(dir, &args);
}

/// `name.pem` and `name-key.pem` (common name `cn`), signed by CA `ca`, with the extensions
/// `ext`.
pub fn make_cert(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) {
    let (key, csr, subj) = (
        format!("{name}-key.pem"),
        format!("{name}.csr"),
        format!("/CN={cn}"),
    );
    let mut args = vec!["req"];
    args.extend(NEW_EC_KEY);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &args);
    sign(dir, ca, name, ext);
}

/// `name.pem` from the request `name.csr`, signed by CA `ca`, with the extensions `ext`.
pub fn sign(dir: &Path, ca: &str, name: &str, ext: &str) {
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}-ca.pem"),
            "-CAkey",
            &format!("{ca}-ca-key.pem"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

/// The certificates of the TLS tests in `dir`: CAs `good` and `rogue`; `server` (localhost,
/// 127.0.0.1) and `client` signed by `good`; `intruder`, a client certificate signed by
/// `rogue`.
pub fn good_and_rogue(dir: &Path) {
    make_ca(dir, "good");
    make_ca(dir, "rogue");
    make_cert(dir, "good", "server", "localhost", SERVER_EXT);
    make_cert(dir, "good", "client", "tiercache client", CLIENT_EXT);
    make_cert(dir, "rogue", "intruder", "intruder", CLIENT_EXT);
}
