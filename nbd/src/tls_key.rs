//! What kind of private key a TLS key file holds, and whether the server takes it: RSA of
//! 2048 to 8192 bits (any size in between: GnuTLS's `certtool` makes 2432- and 3072-bit keys
//! by default), ECDSA on P-256, P-384 or P-521, and Ed25519, in PKCS#1, PKCS#8 or SEC1 PEM.
//! Anything else is refused in one line saying what was found and what is supported, before
//! rustls sees the key (its own message for a key it cannot use names neither).
//!
//! The parser reads only the few DER fields it needs (the RSA modulus, the algorithm and
//! curve identifiers); it never panics on any input and never copies key material.

use rustls::pki_types::PrivateKeyDer;

/// What the server takes, for refusals.
pub(crate) const SUPPORTED: &str = "supported: RSA of 2048 to 8192 bits, ECDSA P-256, P-384 or P-521, Ed25519 (PKCS#1, PKCS#8 \
     or SEC1 PEM, unencrypted)";

/// Smallest and largest RSA modulus taken, in bits.
pub(crate) const RSA_BITS: (usize, usize) = (2048, 8192);

/// A private key's kind, as far as the checks need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    /// RSA with a modulus of this many bits.
    Rsa(usize),
    /// ECDSA on this curve (by name; an unknown curve by its OID).
    Ec(String),
    /// Ed25519.
    Ed25519,
    /// Anything else, described.
    Other(String),
}

impl std::fmt::Display for KeyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyKind::Rsa(bits) => write!(f, "RSA key of {bits} bits"),
            KeyKind::Ec(curve) => write!(f, "ECDSA key on curve {curve}"),
            KeyKind::Ed25519 => f.write_str("Ed25519 key"),
            KeyKind::Other(what) => f.write_str(what),
        }
    }
}

impl KeyKind {
    /// `Ok` if the server takes this key, else why not (one line, with what is supported).
    pub(crate) fn check(&self) -> Result<(), String> {
        let why = match self {
            KeyKind::Rsa(bits) if *bits < RSA_BITS.0 => {
                format!("at least {} needed", RSA_BITS.0)
            }
            KeyKind::Rsa(bits) if *bits > RSA_BITS.1 => {
                format!("at most {} supported", RSA_BITS.1)
            }
            KeyKind::Rsa(_) | KeyKind::Ed25519 => return Ok(()),
            KeyKind::Ec(c) if matches!(c.as_str(), "P-256" | "P-384" | "P-521") => return Ok(()),
            KeyKind::Ec(_) | KeyKind::Other(_) => "not supported".to_string(),
        };
        Err(format!("{self}: {why}; {SUPPORTED}"))
    }
}

/// One DER element: (tag, contents, what follows). `None` if it is cut or its length is
/// not one this parser takes (indefinite, or more than 4 length bytes).
fn tlv(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = d.split_first()?;
    let (&l0, rest) = rest.split_first()?;
    let (len, rest) = if l0 < 0x80 {
        (l0 as usize, rest)
    } else {
        let n = (l0 & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The contents of an element with tag `want`, and what follows.
fn expect(d: &[u8], want: u8) -> Option<(&[u8], &[u8])> {
    let (tag, body, rest) = tlv(d)?;
    (tag == want).then_some((body, rest))
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;

/// Bits of a non-negative DER INTEGER's value.
fn int_bits(v: &[u8]) -> usize {
    let v = match v.iter().position(|&b| b != 0) {
        Some(i) => &v[i..],
        None => return 0,
    };
    (v.len() - 1) * 8 + (8 - v[0].leading_zeros() as usize)
}

/// Known algorithm and curve identifiers (DER contents of the OID).
fn oid_name(oid: &[u8]) -> Option<&'static str> {
    Some(match oid {
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01] => "rsaEncryption",
        [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a] => "RSA-PSS",
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01] => "ecPublicKey",
        [0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01] => "DSA",
        [0x2b, 0x65, 0x6e] => "X25519",
        [0x2b, 0x65, 0x6f] => "X448",
        [0x2b, 0x65, 0x70] => "Ed25519",
        [0x2b, 0x65, 0x71] => "Ed448",
        [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07] => "P-256",
        [0x2b, 0x81, 0x04, 0x00, 0x22] => "P-384",
        [0x2b, 0x81, 0x04, 0x00, 0x23] => "P-521",
        [0x2b, 0x81, 0x04, 0x00, 0x0a] => "secp256k1",
        _ => return None,
    })
}

/// An OID in dotted form (for ones this parser does not name).
fn oid_dotted(oid: &[u8]) -> String {
    let mut parts = Vec::new();
    let mut v: u64 = 0;
    for (i, &b) in oid.iter().enumerate() {
        v = (v << 7) | (b & 0x7f) as u64;
        if b & 0x80 == 0 {
            if parts.is_empty() {
                let first = (v / 40).min(2);
                parts.push(first);
                parts.push(v - first * 40);
            } else {
                parts.push(v);
            }
            v = 0;
        } else if i == oid.len() - 1 || v > u64::MAX >> 8 {
            return "a malformed OID".into();
        }
    }
    parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

fn curve_name(oid: &[u8]) -> String {
    oid_name(oid).map_or_else(|| oid_dotted(oid), str::to_string)
}

/// PKCS#1 `RSAPrivateKey`: version, then the modulus.
fn pkcs1(d: &[u8]) -> Option<KeyKind> {
    let (seq, _) = expect(d, SEQUENCE)?;
    let (_version, rest) = expect(seq, INTEGER)?;
    let (n, _) = expect(rest, INTEGER)?;
    Some(KeyKind::Rsa(int_bits(n)))
}

/// SEC1 `ECPrivateKey`: version 1, the private key, then `[0]` the curve (when present; else
/// the private key's length says which curve it most likely is).
fn sec1(d: &[u8], curve: Option<&[u8]>) -> Option<KeyKind> {
    let (seq, _) = expect(d, SEQUENCE)?;
    let (_version, rest) = expect(seq, INTEGER)?;
    let (key, rest) = expect(rest, OCTET_STRING)?;
    let named = match tlv(rest) {
        Some((0xa0, params, _)) => expect(params, OID).map(|(oid, _)| oid),
        _ => None,
    };
    Some(KeyKind::Ec(match named.or(curve) {
        Some(oid) => curve_name(oid),
        None => match key.len() {
            32 => "P-256".into(),
            48 => "P-384".into(),
            66 => "P-521".into(),
            n => format!("unknown ({n}-byte private key)"),
        },
    }))
}

/// PKCS#8 `PrivateKeyInfo`: version, the algorithm (and its parameters), the key.
fn pkcs8(d: &[u8]) -> Option<KeyKind> {
    let (seq, _) = expect(d, SEQUENCE)?;
    let (_version, rest) = expect(seq, INTEGER)?;
    let (alg, rest) = expect(rest, SEQUENCE)?;
    let (key, _) = expect(rest, OCTET_STRING)?;
    let (oid, params) = expect(alg, OID)?;
    Some(match oid_name(oid) {
        Some("rsaEncryption") => pkcs1(key)?,
        Some("ecPublicKey") => sec1(key, expect(params, OID).map(|(c, _)| c))?,
        Some("Ed25519") => KeyKind::Ed25519,
        Some("RSA-PSS") => match pkcs1(key)? {
            KeyKind::Rsa(bits) => KeyKind::Other(format!(
                "RSA-PSS key of {bits} bits (an RSA key restricted to PSS)"
            )),
            k => k,
        },
        Some(name) => KeyKind::Other(format!("{name} key")),
        None => KeyKind::Other(format!("key of algorithm {}", oid_dotted(oid))),
    })
}

/// The kind of `key`, or `Other` if its DER cannot be read.
pub(crate) fn classify(key: &PrivateKeyDer<'_>) -> KeyKind {
    let (kind, what) = match key {
        PrivateKeyDer::Pkcs1(k) => (pkcs1(k.secret_pkcs1_der()), "PKCS#1 RSA"),
        PrivateKeyDer::Sec1(k) => (sec1(k.secret_sec1_der(), None), "SEC1 EC"),
        PrivateKeyDer::Pkcs8(k) => (pkcs8(k.secret_pkcs8_der()), "PKCS#8"),
        _ => (None, "unknown kind of"),
    };
    kind.unwrap_or_else(|| KeyKind::Other(format!("a malformed {what} private key")))
}

/// What a key file holds when no usable private key was found in it: the PEM labels seen
/// (e.g. "ENCRYPTED PRIVATE KEY", "DSA PRIVATE KEY"), for the refusal.
pub(crate) fn pem_labels(text: &str) -> Vec<String> {
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-----BEGIN "))
        .filter_map(|l| l.strip_suffix("-----"))
        .map(str::to_string)
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer};

    fn der(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        if body.len() < 0x80 {
            v.push(body.len() as u8);
        } else {
            v.extend_from_slice(&[0x82, (body.len() >> 8) as u8, body.len() as u8]);
        }
        v.extend_from_slice(body);
        v
    }

    fn rsa1(bits: usize) -> Vec<u8> {
        let mut n = vec![0u8, 0x80];
        n.resize(bits / 8 + 1, 0x11);
        [
            der(INTEGER, &[0]),
            der(INTEGER, &n),
            der(INTEGER, &[1, 0, 1]),
        ]
        .concat()
    }

    #[test]
    fn kinds_and_verdicts() {
        for bits in [1024, 2048, 2432, 3072, 8192, 16384] {
            let k = PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der(SEQUENCE, &rsa1(bits))));
            assert_eq!(classify(&k), KeyKind::Rsa(bits));
            assert_eq!(classify(&k).check().is_ok(), (2048..=8192).contains(&bits));
        }
        let e = KeyKind::Rsa(1024).check().unwrap_err();
        assert!(
            e.starts_with("RSA key of 1024 bits: at least 2048 needed; supported: RSA"),
            "{e}"
        );
        // PKCS#8 wrapping the same PKCS#1 key.
        let alg = der(
            SEQUENCE,
            &[
                der(OID, &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 1]),
                der(5, &[]),
            ]
            .concat(),
        );
        let p8 = der(
            SEQUENCE,
            &[
                der(INTEGER, &[0]),
                alg,
                der(OCTET_STRING, &der(SEQUENCE, &rsa1(2432))),
            ]
            .concat(),
        );
        let k = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p8));
        assert_eq!(classify(&k), KeyKind::Rsa(2432));
        // SEC1 with and without the curve; Ed448 in PKCS#8.
        let p256 = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        let ec = |curve: Option<&[u8]>, keylen: usize| {
            let mut b = [der(INTEGER, &[1]), der(OCTET_STRING, &vec![7; keylen])].concat();
            if let Some(c) = curve {
                b.extend(der(0xa0, &der(OID, c)));
            }
            PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der(SEQUENCE, &b)))
        };
        assert_eq!(classify(&ec(Some(&p256), 32)), KeyKind::Ec("P-256".into()));
        assert_eq!(classify(&ec(None, 48)), KeyKind::Ec("P-384".into()));
        let k = classify(&ec(Some(&[0x2b, 0x81, 0x04, 0x00, 0x0a]), 32));
        assert_eq!(k, KeyKind::Ec("secp256k1".into()));
        assert!(
            k.check()
                .unwrap_err()
                .starts_with("ECDSA key on curve secp256k1: not supported")
        );
        let ed448 = der(
            SEQUENCE,
            &[
                der(INTEGER, &[0]),
                der(SEQUENCE, &der(OID, &[0x2b, 0x65, 0x71])),
                der(OCTET_STRING, &[0; 59]),
            ]
            .concat(),
        );
        let k = classify(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ed448)));
        assert_eq!(k, KeyKind::Other("Ed448 key".into()));
        assert_eq!(
            oid_dotted(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 1, 1, 1]),
            "1.2.840.113549.1.1.1"
        );
    }

    #[test]
    fn never_panics_on_garbage() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2000usize {
            let mut v = Vec::with_capacity(len % 300);
            for _ in 0..len % 300 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            if len % 3 == 0 && !v.is_empty() {
                v[0] = SEQUENCE;
            }
            let _ = classify(&PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(v.clone())));
            let _ = classify(&PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(v.clone())));
            let _ = classify(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(v.clone())));
            let _ = oid_dotted(&v);
        }
        assert_eq!(
            pem_labels(
                "x\n-----BEGIN ENCRYPTED PRIVATE KEY-----\nAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
            ),
            vec!["ENCRYPTED PRIVATE KEY".to_string()]
        );
    }
}
