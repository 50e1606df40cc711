//! The RBD backend against a real single-node Ceph cluster started on loopback by
//! `scripts/ceph-cluster.sh` (one cluster per test process, stopped at exit; see
//! `common/ceph.rs`): the conformance suite, errors, the exclusive lock, a second client,
//! resize and the dirty marker. Skipped (with a printed reason) only when ceph-mon is not
//! installed.

#[path = "common/ceph.rs"]
mod ceph;

use std::process::Command;
use std::time::Instant;
use tiercache_io::conformance::{self, pattern};
use tiercache_io::{BLOCK, Backend, IoErr, RbdBackend, Req, parse_rbd, rbd_identity};

fn open(dev: &str) -> RbdBackend {
    RbdBackend::open(dev).unwrap_or_else(|e| panic!("open {dev}: {e}"))
}

fn open_err(dev: &str) -> String {
    match RbdBackend::open(dev) {
        Ok(_) => panic!("{dev} opened"),
        Err(e) => {
            let s = e.to_string();
            assert!(!s.contains('\n'), "one line: {s}");
            s
        }
    }
}

#[test]
fn conformance_on_an_rbd_image() {
    let Some(c) = ceph::shared("conformance_on_an_rbd_image") else {
        return;
    };
    let img = ceph::image_name("conf");
    c.create_image(&img, 64);
    let t = Instant::now();
    let b = open(&c.device(&img));
    println!("IO path: {}", b.name());
    assert_eq!(b.blocks(), 64 << 11);
    conformance::conformance(&b);
    println!("conformance: {:.2} s", t.elapsed().as_secs_f64());
    // Identity: what a read-only probe and the open backend say agree.
    let id = b.identity();
    assert!(!id.image_id.is_empty());
    drop(b);
    // Reopen (the lock was released on drop): the flushed pattern is there.
    let b = open(&c.device(&img));
    conformance::verify_persisted(&b);
    let probed = rbd_identity(&parse_rbd(&c.device(&img)).unwrap()).unwrap();
    assert_eq!(probed, b.identity());
    // A batch of many writes issued together, then read back in one batch.
    let bufs: Vec<Vec<u8>> = (0..32u64)
        .map(|i| pattern(77, i * 64, 16 * BLOCK))
        .collect();
    let mut reqs: Vec<Req<'_>> = bufs
        .iter()
        .enumerate()
        .map(|(i, buf)| Req::Write {
            lba: i as u64 * 64,
            buf,
            fua: i % 5 == 0,
        })
        .collect();
    reqs.push(Req::Flush);
    assert!(b.submit_batch(&mut reqs).iter().all(|r| r.is_ok()));
    let mut back: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 16 * BLOCK]).collect();
    let mut reqs: Vec<Req<'_>> = back
        .iter_mut()
        .enumerate()
        .map(|(i, buf)| Req::Read {
            lba: i as u64 * 64,
            buf,
        })
        .collect();
    assert!(b.submit_batch(&mut reqs).iter().all(|r| r.is_ok()));
    assert!(back == bufs, "batch read after batch write");
}

#[test]
fn errors_are_one_clear_line() {
    let Some(c) = ceph::shared("errors_are_one_clear_line") else {
        return;
    };
    let conf = c.conf.display().to_string();
    // Missing image and pool.
    let e = open_err(&format!("rbd:rbd/no-such-image:conf={conf}"));
    assert!(e.contains("image rbd/no-such-image not found"), "{e}");
    let e = open_err(&format!("rbd:no-such-pool/img:conf={conf}"));
    assert!(e.contains("pool no-such-pool not found"), "{e}");
    // A config file that does not exist.
    let e = open_err(&format!("rbd:rbd/x:conf={}/nope.conf", c.dir.display()));
    assert!(e.contains("cannot read the ceph config"), "{e}");
    // A client the keyring has no key for: the monitors refuse it.
    let e = open_err(&format!("rbd:rbd/x:conf={conf}:id=nobody"));
    assert!(e.contains("cephx denied for client.nobody"), "{e}");
    // A client with a key but no OSD caps: cephx refuses it on the image.
    let img = ceph::image_name("err");
    c.create_image(&img, 16);
    let keyring = c.dir.join("nocaps.keyring");
    let o = c.cli(
        "ceph",
        &[
            "auth",
            "get-or-create",
            "client.nocaps",
            "mon",
            "allow r",
            "-o",
            &keyring.display().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let conf2 = c.dir.join("nocaps.conf");
    let text = std::fs::read_to_string(&c.conf).unwrap()
        + &format!("\n[client.nocaps]\nkeyring = {}\n", keyring.display());
    std::fs::write(&conf2, text).unwrap();
    let e = open_err(&format!("rbd:rbd/{img}:conf={}:id=nocaps", conf2.display()));
    assert!(e.contains("cephx denied for client.nocaps"), "{e}");
    // A cluster that is not there (a closed port; the config's short mount timeout is kept).
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let conf3 = c.dir.join("dead.conf");
    std::fs::write(
        &conf3,
        format!(
            "[global]\nmon_host = 127.0.0.1:{port}\nkeyring = {}\nclient_mount_timeout = 3\n",
            c.dir.join("keyring").display()
        ),
    )
    .unwrap();
    let t = Instant::now();
    let e = open_err(&format!("rbd:rbd/{img}:conf={}", conf3.display()));
    assert!(
        e.contains("cluster not reachable (check --ceph-conf)"),
        "{e}"
    );
    println!(
        "unreachable cluster reported in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // An image without the exclusive-lock feature cannot be held.
    let plain = ceph::image_name("nolock");
    c.rbd(&[
        "create",
        "--size",
        "16M",
        "--image-feature",
        "layering",
        &format!("rbd/{plain}"),
    ]);
    let e = open_err(&c.device(&plain));
    assert!(e.contains("exclusive-lock feature"), "{e}");
    // Bad device strings never reach librbd.
    let e = open_err("rbd:just-a-name");
    assert!(e.contains("rbd:POOL/IMAGE"), "{e}");
    // Requests out of range or misaligned, as on every backend.
    let b = open(&c.device(&img));
    let n = b.blocks();
    assert!(matches!(
        b.write(n, &[0u8; BLOCK], false),
        Err(IoErr::OutOfRange { .. })
    ));
    assert!(matches!(
        b.read(0, &mut [0u8; 100]),
        Err(IoErr::Misaligned { .. })
    ));
}

#[test]
fn exclusive_lock_and_a_second_client() {
    let Some(c) = ceph::shared("exclusive_lock_and_a_second_client") else {
        return;
    };
    let img = ceph::image_name("lock");
    c.create_image(&img, 64);
    let dev = c.device(&img);
    let a = open(&dev);
    let data = pattern(5, 0, 256 * BLOCK);
    a.write(0, &data, true).unwrap();

    // A second opener (another librados client, as another tiercache would be) is refused.
    let t = Instant::now();
    let e = open_err(&dev);
    assert!(
        e.contains(&format!("image rbd/{img} is locked by another client")),
        "{e}"
    );
    println!(
        "second opener refused in {} ms: {e}",
        t.elapsed().as_millis()
    );

    // Another program writing to the image: `rbd bench` fails with EROFS (librbd asks the
    // owner for the lock, our librbd refuses because the lock was taken with
    // rbd_lock_acquire), nothing it wanted to write lands, and we keep the lock.
    let t = Instant::now();
    let o = c.cli(
        "rbd",
        &[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "4K",
            "--io-total",
            "1M",
            &format!("rbd/{img}"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    println!(
        "rbd bench while held: exit {:?} after {} ms: {}",
        o.status.code(),
        t.elapsed().as_millis(),
        err.lines().last().unwrap_or("")
    );
    assert!(!o.status.success(), "rbd bench wrote to a held image");
    assert!(err.contains("Read-only file system"), "{err}");
    let mut back = vec![0u8; data.len()];
    a.read(0, &mut back).unwrap();
    assert!(back == data, "our data changed under the lock");
    a.write(256, &data, false).unwrap();
    a.flush().unwrap();

    // python3-rbd (when Debian's python3 has it) sees the same: ReadOnlyImage on write.
    let py = "import rados, rbd, sys\n\
              c = rados.Rados(conffile=sys.argv[1]); c.connect()\n\
              img = rbd.Image(c.open_ioctx('rbd'), sys.argv[2])\n\
              try:\n    img.write(b'x' * 4096, 0); print('WROTE')\n\
              except rbd.ReadOnlyImage as e: print('EROFS', e)\n\
              print('READ', img.read(0, 16).hex())\n";
    let o = Command::new("timeout")
        .args(["60", "/usr/bin/python3", "-c", py])
        .arg(&c.conf)
        .arg(&img)
        .output();
    match o {
        Ok(o) if o.status.success() => {
            let out = String::from_utf8_lossy(&o.stdout);
            println!(
                "python3-rbd while held: {}",
                out.trim().replace('\n', " | ")
            );
            assert!(out.contains("EROFS"), "{out}");
            // Reads by others are not blocked: they see what we flushed.
            let head: String = data[..16].iter().map(|b| format!("{b:02x}")).collect();
            assert!(out.contains(&format!("READ {head}")), "{out}");
        }
        Ok(o) => println!(
            "python3-rbd not usable here, part skipped: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("python3 not runnable, part skipped: {e}"),
    }

    // Released on drop: the next opener gets the lock at once, and the other program's
    // writes then work.
    drop(a);
    let t = Instant::now();
    let b = open(&dev);
    println!("reopened after release in {} ms", t.elapsed().as_millis());
    let mut back = vec![0u8; data.len()];
    b.read(256, &mut back).unwrap();
    assert!(back == data);
    drop(b);
    c.rbd(&[
        "bench",
        "--io-type",
        "write",
        "--io-size",
        "4K",
        "--io-total",
        "256K",
        &format!("rbd/{img}"),
    ]);
}

#[test]
fn resize_and_dirty_marker() {
    let Some(c) = ceph::shared("resize_and_dirty_marker") else {
        return;
    };
    let img = ceph::image_name("grow");
    c.create_image(&img, 32);
    let b = open(&c.device(&img));
    assert_eq!(b.blocks(), 32 << 11);
    // Another client grows the image while we hold the lock (librbd proxies the resize to
    // the lock owner, us); refresh_size() sees it, blocks() then says so, and the new space is
    // usable. blocks() alone is the size last seen (it never waits for the cluster).
    c.rbd(&["resize", "--size", "48M", &format!("rbd/{img}")]);
    assert_eq!(b.blocks(), 32 << 11);
    assert_eq!(b.refresh_size().unwrap(), 48 << 11);
    assert_eq!(b.blocks(), 48 << 11);
    let last = (48 << 11) - 8;
    b.write(last, &pattern(9, last, 8 * BLOCK), true).unwrap();
    let mut back = vec![0u8; 8 * BLOCK];
    b.read(last, &mut back).unwrap();
    assert!(back == pattern(9, last, 8 * BLOCK));

    // The dirty marker in the image's metadata, as `rbd image-meta get` shows it.
    assert_eq!(c.image_meta(&img, "tiercache.dirty"), None);
    assert_eq!(b.dirty_marker().unwrap(), None);
    b.set_dirty_marker(Some("0123abcd")).unwrap();
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some("dirty in tiercache 0123abcd")
    );
    assert_eq!(
        b.dirty_marker().unwrap().as_deref(),
        Some("dirty in tiercache 0123abcd")
    );
    b.set_dirty_marker(None).unwrap();
    assert_eq!(c.image_meta(&img, "tiercache.dirty"), None);
    b.set_dirty_marker(None).unwrap(); // removing an absent marker is fine
    // The marker outlives the process that set it (it is in the cluster).
    b.set_dirty_marker(Some("feed")).unwrap();
    drop(b);
    assert_eq!(
        c.image_meta(&img, "tiercache.dirty").as_deref(),
        Some("dirty in tiercache feed")
    );
}

/// Submits `req` through the asynchronous path and waits for its completion: the buffer
/// given back, the result, and whether `done` ran on another thread.
fn async_one(
    b: &RbdBackend,
    req: tiercache_io::AsyncReq,
) -> (Option<tiercache_io::AlignedBuf>, Result<(), IoErr>, bool) {
    let (tx, rx) = std::sync::mpsc::channel();
    let me = std::thread::current().id();
    b.submit_async(
        req,
        Box::new(move |buf, r| {
            let _ = tx.send((buf, r, std::thread::current().id() != me));
        }),
    );
    rx.recv().expect("done is called")
}

/// The asynchronous path (`submit_async`, what the engine uses for RBD cores): many requests
/// in flight at once, each completed once on the backend's thread, with the same results and
/// errors as the synchronous calls; FUA and flush with librbd's cache on (real flushes) and
/// off (an image-level `rbd_cache = false`: completed writes are on the OSDs, flushes are
/// free); dropping the backend with requests in flight completes them first.
#[test]
fn asynchronous_requests() {
    use std::sync::mpsc::channel;
    use tiercache_io::{AlignedBuf, AsyncReq};
    let Some(c) = ceph::shared("asynchronous_requests") else {
        return;
    };
    for cache_off in [false, true] {
        let img = ceph::image_name(if cache_off { "async-nc" } else { "async" });
        c.create_image(&img, 16);
        if cache_off {
            c.rbd(&[
                "config",
                "image",
                "set",
                &format!("rbd/{img}"),
                "rbd_cache",
                "false",
            ]);
        }
        let b = open(&c.device(&img));
        println!("{}", b.name());
        assert!(b.is_async());
        assert_eq!(
            b.name().contains("flush: none needed, rbd_cache off"),
            cache_off,
            "{}",
            b.name()
        );
        // 64 writes in flight at once, FUA on every fourth.
        let (tx, rx) = channel();
        for i in 0..64u64 {
            let mut buf = AlignedBuf::new(8 * BLOCK);
            buf.copy_from_slice(&pattern(5, i * 8, 8 * BLOCK));
            let tx = tx.clone();
            b.submit_async(
                AsyncReq::Write {
                    lba: i * 8,
                    buf,
                    fua: i % 4 == 0,
                },
                Box::new(move |buf, r| {
                    let _ = tx.send((i, buf.map(|b| b.len()), r));
                }),
            );
        }
        drop(tx);
        let mut seen: Vec<u64> = rx
            .iter()
            .map(|(i, len, r)| {
                r.unwrap_or_else(|e| panic!("write {i}: {e}"));
                assert_eq!(len, Some(8 * BLOCK), "the buffer comes back");
                i
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..64).collect::<Vec<_>>(), "each completes once");
        let (_, r, other) = async_one(&b, AsyncReq::Flush);
        r.unwrap();
        assert!(other, "done runs on the backend's thread");
        // Read back; zeroes and trim read back as zeros.
        let (buf, r, _) = async_one(
            &b,
            AsyncReq::Read {
                lba: 0,
                buf: AlignedBuf::new(512 * BLOCK),
            },
        );
        r.unwrap();
        assert_eq!(&buf.unwrap()[..], &pattern(5, 0, 512 * BLOCK)[..]);
        let (_, r, _) = async_one(
            &b,
            AsyncReq::WriteZeroes {
                lba: 8,
                blocks: 8,
                fua: true,
            },
        );
        r.unwrap();
        let (_, r, _) = async_one(&b, AsyncReq::Trim { lba: 24, blocks: 8 });
        r.unwrap();
        let mut want = pattern(5, 0, 32 * BLOCK);
        want[8 * BLOCK..16 * BLOCK].fill(0);
        want[24 * BLOCK..32 * BLOCK].fill(0);
        let mut got = vec![0u8; 32 * BLOCK];
        b.read(0, &mut got).unwrap();
        assert!(got == want, "zeroed and trimmed blocks read back as zeros");
        // Errors come through `done` too, from the backend's thread.
        let blocks = b.blocks();
        let (_, r, other) = async_one(
            &b,
            AsyncReq::Read {
                lba: blocks,
                buf: AlignedBuf::new(BLOCK),
            },
        );
        assert!(matches!(r, Err(IoErr::OutOfRange { .. })), "{r:?}");
        assert!(other);
        let (_, r, _) = async_one(
            &b,
            AsyncReq::Write {
                lba: 0,
                buf: AlignedBuf::new(100),
                fua: false,
            },
        );
        assert!(matches!(r, Err(IoErr::Misaligned { len: 100 })), "{r:?}");
        // Dropped with requests in flight: every one completes, then the image closes.
        let (tx, rx) = channel();
        for i in 0..32u64 {
            let mut buf = AlignedBuf::new(8 * BLOCK);
            buf.copy_from_slice(&pattern(6, i * 8, 8 * BLOCK));
            let tx = tx.clone();
            b.submit_async(
                AsyncReq::Write {
                    lba: i * 8,
                    buf,
                    fua: false,
                },
                Box::new(move |_, r| {
                    let _ = tx.send(r);
                }),
            );
        }
        drop(tx);
        drop(b);
        let results: Vec<_> = rx.iter().collect();
        assert_eq!(results.len(), 32);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let b = open(&c.device(&img));
        let mut got = vec![0u8; 256 * BLOCK];
        b.read(0, &mut got).unwrap();
        assert!(
            got == pattern(6, 0, 256 * BLOCK),
            "the writes in flight at the drop landed"
        );
        // The last reference dropped by a `done` (on the completion thread itself) while
        // other requests are in flight: they still complete, and nothing hangs.
        let b = std::sync::Arc::new(b);
        let (tx, rx) = channel();
        for i in 0..17u64 {
            let mut buf = AlignedBuf::new(8 * BLOCK);
            buf.copy_from_slice(&pattern(7, i * 8, 8 * BLOCK));
            let tx = tx.clone();
            let keep = (i == 0).then(|| b.clone());
            b.submit_async(
                AsyncReq::Write {
                    lba: i * 8,
                    buf,
                    fua: false,
                },
                Box::new(move |_, r| {
                    drop(keep);
                    let _ = tx.send(r);
                }),
            );
        }
        drop(tx);
        drop(b);
        let mut n = 0;
        while let Ok(r) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
            r.unwrap();
            n += 1;
        }
        assert_eq!(n, 17, "every request completed");
    }
}
