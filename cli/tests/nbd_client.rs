//! The block-device recipe (`contrib/tiercache-nbd@.service`, docs/CEPH.md "Under an OSD"):
//! Debian's `nbd-client` lists the daemon's exports and negotiates one (the attach itself needs
//! the kernel's nbd module and `/dev/nbd0`, absent on some hosts: then only the negotiation is
//! checked); a `wb` cache whose cache device is missing is not exported, so `nbd-client` fails
//! before any device is attached and a unit ordered after it (a ceph-osd) does not start. The
//! unit passes `systemd-analyze verify`.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

fn nbd_client(args: &[&str]) -> (bool, String) {
    let (ok, out, err) = run(Command::new("nbd-client").args(args), 60);
    (ok, out + &err)
}

#[test]
fn nbd_client_attaches_served_exports_only() {
    if !have("nbd-client") {
        println!("SKIPPED: nbd-client is not installed (apt-get install nbd-client)");
        return;
    }
    let d = Dir::new("nbd-client");
    let (cache, core) = (
        d.sparse("cache.img", 64 << 20),
        d.sparse("disk.img", 256 << 20),
    );
    let cfg = d.path("tc.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[cache]]\nid = 1\ndevice = \"{cache}\"\nmode = \"wb\"\n\
             [[cache.core]]\nid = 0\ndevice = \"{core}\"\nexport = \"osd0\"\n"
        ),
    )
    .unwrap();
    let sock = d.path("nbd.sock");
    let attach = [
        "-u",
        "-N",
        "osd0",
        &sock,
        "/dev/nbd0",
        "-b",
        "4096",
        "-t",
        "60",
    ];
    {
        let dm = Daemon::start(Opts::new(&d).config(&cfg));
        let (ok, out) = nbd_client(&["-u", "-l", &sock]);
        assert!(ok && out.contains("osd0: cache 1 core 0"), "{out}");
        let (ok, out) = nbd_client(&attach);
        assert!(out.contains("size = 256MB"), "negotiation: {out}");
        if Path::new("/dev/nbd0").exists() && ok {
            let (ok, out) = nbd_client(&["-d", "/dev/nbd0"]);
            assert!(ok, "{out}");
        } else {
            assert!(!ok, "no /dev/nbd0, yet: {out}");
            println!("no nbd module here: negotiation checked, the attach itself skipped ({out})");
        }
        // Dirty data: the cache device holds what the core lacks.
        use tiercache_io::Backend;
        dm.no_cleaning(1);
        let c = dm.nbd("osd0").unwrap();
        c.write(8, &[0x5a; 4096], true).unwrap();
        drop(c);
        dm.ok(&["stop-cache", "--cache-id", "1", "--no-writeback"]);
    }
    // The cache device is gone: the daemon comes up with the cache detached and does not
    // export its core; nbd-client fails in the negotiation.
    std::fs::rename(&cache, d.path("cache.away")).unwrap();
    let dm = Daemon::start(Opts::new(&d).config(&cfg));
    let (ok, out) = nbd_client(&attach);
    assert!(!ok && !out.contains("size ="), "{out}");
    assert!(dm.ok(&["list"]).contains("detached"));
}

#[test]
fn the_nbd_unit_passes_systemd_analyze() {
    if !have("systemd-analyze") {
        println!("SKIPPED: systemd-analyze is not installed");
        return;
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let d = Dir::new("nbd-unit");
    for (from, to) in [
        ("tiercache.service", "tiercache.service"),
        ("tiercache-nbd@.service", "tiercache-nbd@osd0.service"),
    ] {
        let unit = std::fs::read_to_string(format!("{root}/contrib/{from}")).unwrap();
        std::fs::write(
            d.path(to),
            unit.replace("/usr/local/bin/tiercache", BIN)
                .replace("/usr/sbin/nbd-client", "/bin/true")
                .replace("/usr/sbin/modprobe", "/bin/true"),
        )
        .unwrap();
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", &d.path("tiercache-nbd@osd0.service")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("tiercache")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify: {ours:?}");
}

/// The VM recipe of the README ("Put it under an OSD or a VM"): QEMU opens an export with
/// `-blockdev driver=nbd,server.type=unix,server.path=SOCK,export=NAME`. `qemu-io` and
/// `qemu-img` take the same options through the same block driver, so a guest disk is shown
/// here without a hypervisor: the size as QEMU sees it, a pattern written and read back
/// through QEMU's NBD driver, and the same bytes read by another client after a flush.
#[test]
fn qemu_opens_an_export_as_a_guest_disk() {
    if !(have("qemu-io") && have("qemu-img")) {
        println!("SKIPPED: qemu-io or qemu-img is not installed (apt-get install qemu-utils)");
        return;
    }
    let d = Dir::new("qemu-vm");
    let (cache, core) = (
        d.sparse("cache.img", 64 << 20),
        d.sparse("disk.img", 256 << 20),
    );
    let dm = Daemon::start(Opts::new(&d));
    dm.cache_and_core(&cache, "wb", &core, "vm1");
    let sock = d.path("nbd.sock");
    let opts = format!("driver=nbd,server.type=unix,server.path={sock},export=vm1");
    let (ok, out, err) = run(
        Command::new("qemu-img").args(["info", "--image-opts", &opts]),
        60,
    );
    assert!(ok && out.contains("virtual size: 256 MiB"), "{out}{err}");
    let (ok, out, err) = run(
        Command::new("qemu-io").args([
            "--image-opts",
            &opts,
            "-c",
            "write -P 0x5a 1M 64k",
            "-c",
            "flush",
            "-c",
            "read -P 0x5a 1M 64k",
        ]),
        60,
    );
    assert!(
        ok && !out.contains("Pattern verification failed") && !out.contains("error"),
        "{out}{err}"
    );
    use tiercache_io::Backend;
    let c = dm.nbd("vm1").unwrap();
    let mut b = vec![0u8; 65536];
    c.read((1 << 20) / 512, &mut b).unwrap();
    assert!(
        b.iter().all(|&x| x == 0x5a),
        "the guest's write, read by another client"
    );
}
