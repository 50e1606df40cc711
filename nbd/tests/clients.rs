//! The server against real NBD clients (libnbd's nbdinfo, nbdcopy and nbdsh, qemu-img, fio),
//! exporting a core of a real engine (RAM cache, RAM core). A missing client binary skips its
//! test with "skipped: X not installed".

mod common;

use common::*;
use std::process::Command;

#[test]
fn nbdinfo_shows_exports_and_block_sizes() {
    if !have("nbdinfo") {
        return;
    }
    let s = Setup::new("info", 64, 16);
    let json = run_ok(Command::new("nbdinfo").arg("--json").arg(s.uri("disk")));
    for want in [
        "\"export-size\": 67108864",
        "\"block_size_minimum\": 512",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 33554432",
        "\"can_multi_conn\": true",
        "\"can_fua\": true",
        "\"can_flush\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"can_fast_zero\": true",
        "\"can_cache\": true",
        "\"is_read_only\": false",
        "\"description\": \"cache0-core0 (test)\"",
        "structured",
    ] {
        assert!(json.contains(want), "nbdinfo --json lacks {want}:\n{json}");
    }
    // --list goes through every listed export; "gone" is listed but refused, so nbdinfo
    // reports an error for it after printing the others.
    let list = run(Command::new("nbdinfo").arg("--list").arg(s.uri("")));
    let out = String::from_utf8_lossy(&list.stdout);
    let err = String::from_utf8_lossy(&list.stderr);
    for want in [
        "export=\"disk\"",
        "cache0-core0 (test)",
        "export-size: 67108864",
        "export=\"plain\"",
        "export-size: 8388608",
    ] {
        assert!(
            out.contains(want),
            "nbdinfo --list lacks {want}:\n{out}\n{err}"
        );
    }
    let gone = run(Command::new("nbdinfo").arg(s.uri("gone")));
    assert!(!gone.status.success());
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("gone"), "{err}");
    let missing = run(Command::new("nbdinfo").arg(s.uri("nope")));
    assert!(!missing.status.success());
    // The plain export works too, and the size is read per connection.
    let json = run_ok(Command::new("nbdinfo").arg("--json").arg(s.uri("plain")));
    assert!(json.contains("\"export-size\": 8388608"), "{json}");
}

#[test]
fn nbdcopy_256m_in_and_out_bit_exact() {
    if !have("nbdcopy") {
        return;
    }
    let s = Setup::new("copy", 256, 64);
    let src = s.dir.path("src.img");
    let dst = s.dir.path("dst.img");
    random_file(&src, 256 << 20, 0x5eed);
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=4")
            .arg(&src)
            .arg(s.uri("disk")),
    );
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=2")
            .arg(s.uri("disk"))
            .arg(&dst),
    );
    same_files(&src, &dst);
}

#[test]
fn qemu_img_convert_and_compare() {
    if !have("qemu-img") {
        return;
    }
    let s = Setup::new("qemu", 32, 8);
    let src = s.dir.path("src.img");
    let back = s.dir.path("back.img");
    random_file(&src, 32 << 20, 42);
    let uri = s.uri("disk");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri),
    );
    run_ok(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri),
    );
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&back),
    );
    same_files(&src, &back);
    // A different image must compare different.
    random_file(&back, 32 << 20, 1000);
    let o = run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&back)
        .arg(&uri));
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn fio_randrw_verify_four_connections() {
    if !have("fio") {
        return;
    }
    let s = Setup::new("fio", 64, 16);
    let out = run_ok(
        Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--rw=randrw",
                "--bs=4k",
                "--iodepth=32",
                "--numjobs=4",
                "--size=8m",
                "--offset_increment=16m",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--group_reporting",
            ])
            .arg(format!("--uri={}", s.uri("disk"))),
    );
    println!("{out}");
    assert!(out.contains("err= 0"), "{out}");
    assert!(!out.contains("verify:") || !out.contains("bad"), "{out}");
    assert!(s.server().stats().accepted >= 4, "{:?}", s.server().stats());
}

#[test]
fn nbdsh_commands_and_errors() {
    if !have("nbdsh") {
        return;
    }
    let s = Setup::new("nbdsh", 16, 4);
    let script = r#"
import errno
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(URI)
size = h.get_size()
assert size == 16 << 20, size
assert h.can_multi_conn() and h.can_fua() and h.can_trim() and h.can_zero() and h.can_fast_zero() and h.can_cache()

def expect_err(f, want, what):
    try:
        f()
    except nbd.Error as e:
        assert e.errno == want, "%s: errno %r, want %r (%s)" % (what, e.errno, want, e)
        return
    raise AssertionError("%s: no error" % what)

# FUA write, flush, read back
h.pwrite(b"\xab" * 8192, 4096, nbd.CMD_FLAG_FUA)
h.flush()
assert h.pread(8192, 4096) == b"\xab" * 8192
# trim then read zeros
h.trim(8192, 4096)
assert h.pread(8192, 4096) == b"\0" * 8192
# write zeroes, with and without FAST_ZERO (and NO_HOLE)
h.pwrite(b"\x11" * 65536, 1 << 20)
h.zero(32768, 1 << 20)
assert h.pread(65536, 1 << 20) == b"\0" * 32768 + b"\x11" * 32768
h.zero(32768, (1 << 20) + 32768, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
assert h.pread(65536, 1 << 20) == b"\0" * 65536
# a large zero beyond the maximum block size is split by the export
h.pwrite(b"\x22" * 4096, size - 4096)
h.zero(size, 0)
assert h.pread(4096, size - 4096) == b"\x22" * 4096
h.cache(1 << 20, 0)
# errors, the connection keeps working after each
expect_err(lambda: h.pread(4096, size), errno.EINVAL, "read past the end")
expect_err(lambda: h.pread(4096, size + (1 << 30)), errno.EINVAL, "read far past the end")
expect_err(lambda: h.pwrite(b"x" * 4096, size - 512), errno.ENOSPC, "write past the end")
expect_err(lambda: h.zero(4096, size), errno.ENOSPC, "zero past the end")
expect_err(lambda: h.trim(4096, size), errno.EINVAL, "trim past the end")
expect_err(lambda: h.cache(4096, size), errno.EINVAL, "cache past the end")
expect_err(lambda: h.pread(512, 100), errno.EINVAL, "unaligned read offset")
expect_err(lambda: h.pread(100, 0), errno.EINVAL, "unaligned read length")
expect_err(lambda: h.pwrite(b"x" * 100, 0), errno.EINVAL, "unaligned write")
expect_err(lambda: h.trim(512, 3), errno.EINVAL, "unaligned trim")
expect_err(lambda: h.pread((32 << 20) + 512, 0), errno.EINVAL, "read above the maximum block size")
expect_err(lambda: h.pwrite(b"\0" * ((32 << 20) + 512), 0), errno.EINVAL, "write above the maximum block size")
assert h.pread(8192, 4096) == b"\0" * 8192
h.pwrite(b"\x33" * 4096, 0)
assert h.pread(4096, 0) == b"\x33" * 4096
h.shutdown()

# the same without structured replies (simple replies carry only the errno)
h = nbd.NBD()
h.set_strict_mode(0)
h.set_request_structured_replies(False)
h.connect_uri(URI)
assert not h.get_structured_replies_negotiated()
assert h.pread(4096, 0) == b"\x33" * 4096
expect_err(lambda: h.pread(4096, size), errno.EINVAL, "simple: read past the end")
expect_err(lambda: h.pwrite(b"x" * 4096, size), errno.ENOSPC, "simple: write past the end")
expect_err(lambda: h.pread(100, 0), errno.EINVAL, "simple: unaligned")
assert h.pread(4096, 0) == b"\x33" * 4096
h.shutdown()

# the old NBD_OPT_EXPORT_NAME path
h = nbd.NBD()
h.set_opt_mode(False)
h.set_request_structured_replies(False)
h.set_handshake_flags(nbd.HANDSHAKE_FLAG_FIXED_NEWSTYLE)
h.connect_uri(URI)
assert h.pread(4096, 0) == b"\x33" * 4096
h.shutdown()
print("ok")
"#;
    let out = nbdsh(script, &[("URI", s.uri("disk"))]);
    assert!(out.contains("ok"), "{out}");
    assert!(
        s.server().stats().request_errors >= 15,
        "{:?}",
        s.server().stats()
    );
}

#[test]
fn multi_conn_flush_on_another_connection_reaches_the_engine() {
    if !have("nbdsh") {
        return;
    }
    let s = Setup::new("multiconn", 16, 4);
    let before = flushes(&s.engine);
    let script = r#"
a = nbd.NBD()
a.connect_uri(URI)
b = nbd.NBD()
b.connect_uri(URI)
assert a.can_multi_conn() and b.can_multi_conn()
a.pwrite(b"\x5a" * 65536, 1 << 20)   # replied on A
b.flush()                           # flushed on B
assert b.pread(65536, 1 << 20) == b"\x5a" * 65536
a.shutdown()
b.shutdown()
print("ok")
"#;
    let out = nbdsh(script, &[("URI", s.uri("disk"))]);
    assert!(out.contains("ok"), "{out}");
    let after = flushes(&s.engine);
    assert!(
        after > before,
        "the flush on connection B did not reach the engine"
    );
    // The write is in the engine, seen directly.
    let mut buf = vec![0u8; 65536];
    s.engine
        .read(tiercache_core::units::CoreId(0), (1 << 20) / 512, &mut buf)
        .unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
}
