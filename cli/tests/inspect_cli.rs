//! `tiercache inspect` and `tiercache check` on a real cache device (a file written by the
//! engine): what they show, that they never write, and that damage is found and named.

use std::process::Command;
use std::sync::Arc;
use tiercache_core::Config;
use tiercache_core::cache::CoreRecord;
use tiercache_core::config::Persist;
use tiercache_core::mode::CacheMode;
use tiercache_core::units::{CoreId, Lba, LineSize};
use tiercache_engine::{CoreSpec, Device, Engine, EngineConfig};
use tiercache_format::superblock::Layout;
use tiercache_format::tables::CoreIdentity;
use tiercache_io::{FileBackend, RamBackend};

fn tiercache(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .output()
        .expect("run tiercache");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn inspect_and_check_a_cache_device_and_find_damage() {
    // Removed at the end unless the test failed.
    let dir = tiercache_testkit::Dir::new("inspect");
    let path = dir.join("cache.img");
    let bytes: u64 = 8 << 20;
    let (layout, lines) = Layout::plan(bytes, 4096, 1 << 20).unwrap();
    let mut cfg = Config::new(lines, LineSize::K4);
    cfg.mode = CacheMode::Wb;
    cfg.data_offset = Lba(layout.data.offset / 512);
    cfg.persist = Some(Persist::new_cache(
        [5; 16],
        bytes,
        LineSize::K4,
        lines,
        layout,
    ));
    {
        let cache: Device = Arc::new(FileBackend::create(&path, bytes / 512, false).unwrap());
        let core: Device = Arc::new(RamBackend::new(8192));
        let e = Engine::create(
            cfg,
            cache,
            vec![CoreSpec {
                id: CoreId(0),
                dev: core,
                record: CoreRecord {
                    identity: CoreIdentity::Nbd {
                        uri: "nbd+unix:///x?socket=/tmp/s".into(),
                    },
                    export_name: "vol0".into(),
                    device: String::new(),
                },
            }],
            EngineConfig::default(),
        )
        .unwrap();
        for i in 0..40u64 {
            e.write(CoreId(0), i * 8, &[i as u8 + 1; 4096], false)
                .unwrap();
        }
        e.flush(CoreId(0)).unwrap();
        e.stop().unwrap();
    }
    let dev = path.to_str().unwrap();
    let before = std::fs::read(&path).unwrap();

    let (code, out, err) = tiercache(&["inspect", "--cache-device", dev]);
    println!("{out}{err}");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("state clean (stopped), mode wb"), "{out}");
    assert!(out.contains("export \"vol0\""), "{out}");
    assert!(
        out.contains("a load would bring back 40 lines (40 dirty)"),
        "{out}"
    );

    let (code, out, _) = tiercache(&["inspect", "--cache-device", dev, "--json"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["lines"], lines);
    assert_eq!(j["load"]["dirty_lines"], 40);
    assert_eq!(j["cores"][0]["export"], "vol0");

    let (code, out, err) = tiercache(&["check", "--cache-device", dev]);
    println!("{out}{err}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("every checksum holds"), "{out}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect and check never write"
    );

    // A damaged checkpoint chunk: named, and the cache is refused.
    let mut img = before.clone();
    img[layout.checkpoint[0].offset as usize + 100] ^= 0x5a;
    img[layout.checkpoint[1].offset as usize + 100] ^= 0x5a;
    std::fs::write(&path, &img).unwrap();
    let (code, out, err) = tiercache(&["check", "--cache-device", dev]);
    println!("{out}{err}");
    assert_eq!(code, 1);
    assert!(out.contains("checkpoint chunk 0: damaged"), "{out}");
    assert!(
        out.contains("load: FAILS") && out.contains("tiercache check"),
        "{out}"
    );
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");

    // A damaged superblock copy: the other one is used, and check says so.
    let mut img = before.clone();
    img[20] ^= 0xff;
    std::fs::write(&path, &img).unwrap();
    let (code, out, _) = tiercache(&["check", "--cache-device", dev]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("superblock A: "), "{out}");
    assert!(out.contains("repairable finding"), "{out}");

    // Not a cache at all.
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let (code, _, err) = tiercache(&["inspect", "--cache-device", dev]);
    assert_eq!(code, 1);
    assert!(err.contains("holds no tiercache cache"), "{err}");
    let (code, _, err) = tiercache(&["inspect", "--cache-device", "/nonexistent/x"]);
    assert_eq!(code, 1);
    assert!(err.starts_with("tiercache: cannot open"), "{err}");
}
