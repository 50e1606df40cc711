//! `NBD_CMD_BLOCK_STATUS` with `base:allocation` (issue 25 item 3), with libnbd's tools
//! against the real daemon: `nbdinfo --map` (and `--totals`) on a file core with written,
//! trimmed and zeroed ranges shows what was done; in a `wb` cache, data still dirty over a
//! hole of the core file is reported as data (never a hole over data the core does not have
//! yet), before and after writeback; `nbdcopy` from a sparse export copies bit-exactly and
//! reads fewer bytes than the export holds (the daemon's client read counter).
//!
//! Each test starts its own daemon and stops exactly that process.

mod common;

use common::{Daemon, Dir, Opts, have, run};
use std::process::Command;
use tiercache_io::Backend;

const MIB: u64 = 1 << 20;

/// `nbdinfo --map` of an export: (offset, length, type) per line.
fn map(dm: &Daemon, export: &str) -> Vec<(u64, u64, u32)> {
    let (ok, out, err) = run(Command::new("nbdinfo").args(["--map", &dm.uri(export)]), 60);
    assert!(ok, "nbdinfo --map: {err}");
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

/// The type `map` gives the byte at `off`.
fn type_at(m: &[(u64, u64, u32)], off: u64) -> u32 {
    m.iter()
        .find(|(o, l, _)| *o <= off && off < o + l)
        .map(|x| x.2)
        .unwrap_or_else(|| panic!("offset {off} not in the map {m:?}"))
}

/// Every byte of `[off, off + len)` has type `want` in `m`.
fn all(m: &[(u64, u64, u32)], off: u64, len: u64, want: u32) -> bool {
    (off..off + len)
        .step_by(4096)
        .all(|o| type_at(m, o) == want)
}

fn pattern(seed: u8, n: u64) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed | 1)
        .collect()
}

#[test]
fn nbdinfo_map_shows_written_trimmed_and_zeroed_ranges() {
    if !have("nbdinfo") {
        return;
    }
    let d = Dir::new("bstat-map");
    let core = d.sparse("core.img", 32 * MIB);
    let dm = Daemon::start(Opts::new(&d));
    dm.cache_and_core("ram:16m", "wt", &core, "vm");
    let c = dm.nbd("vm").unwrap();
    // Written: [1, 3) MiB and [8, 10) MiB; trimmed: [8.25, 8.75) MiB; zeroed: [16, 17) MiB
    // (never written) and [20, 21) MiB (written first).
    c.write(2048, &pattern(1, 2 * MIB), false).unwrap();
    c.write(8 * 2048, &pattern(2, 2 * MIB), false).unwrap();
    c.trim(8 * 2048 + 512, 1024).unwrap();
    c.write_zeroes(16 * 2048, 2048, false).unwrap();
    c.write(20 * 2048, &pattern(3, MIB), false).unwrap();
    c.write_zeroes(20 * 2048, 2048, false).unwrap();
    c.flush().unwrap();
    drop(c);

    let m = map(&dm, "vm");
    println!("nbdinfo --map:");
    for (o, l, t) in &m {
        println!("  {o:>10} {l:>10} {t}");
    }
    assert_eq!(m.first().map(|x| x.0), Some(0));
    assert_eq!(
        m.iter().map(|x| x.1).sum::<u64>(),
        32 * MIB,
        "the map covers the export"
    );
    for w in m.windows(2) {
        assert_eq!(w[0].0 + w[0].1, w[1].0, "consecutive");
    }
    // Written data is data (0); never written and trimmed is hole + zero (3).
    assert!(all(&m, MIB, 2 * MIB, 0), "written [1, 3) MiB");
    assert!(all(&m, 8 * MIB, MIB / 4, 0) && all(&m, 8 * MIB + 3 * MIB / 4, MIB + MIB / 4, 0));
    assert!(
        all(&m, 8 * MIB + MIB / 4, MIB / 2, 3),
        "trimmed [8.25, 8.75) MiB"
    );
    // The file backend's O_DIRECT probe at open rewrites block 0 with what it read, which
    // allocates the file's first block: data (of zeros) there is right too.
    let probe = if type_at(&m, 0) == 0 { 4096 } else { 0 };
    assert!(
        all(&m, 4096, MIB - 4096, 3) && all(&m, 3 * MIB, 5 * MIB, 3),
        "never written"
    );
    assert!(all(&m, 24 * MIB, 8 * MIB, 3), "never written, to the end");
    // Zeroed ranges: a hole where the file system zeroes by unwritten extents (ext4, xfs),
    // data where it writes zeros; never anything that does not read as zeros.
    for z in [16 * MIB, 20 * MIB] {
        let t = type_at(&m, z);
        assert!(
            all(&m, z, MIB, t) && (t == 3 || t == 0),
            "zeroed at {z}: {t}"
        );
        println!("zeroed range at {z}: type {t}");
    }

    // --totals: the data is what was written and not trimmed or zeroed.
    let (ok, out, err) = run(
        Command::new("nbdinfo").args(["--map", "--totals", &dm.uri("vm")]),
        60,
    );
    assert!(ok, "nbdinfo --map --totals: {err}");
    println!("nbdinfo --map --totals:\n{out}");
    let data: u64 = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"0")).then(|| f[0].parse::<u64>().ok())?
        })
        .sum();
    let zeroed_data: u64 = [16 * MIB, 20 * MIB]
        .iter()
        .filter(|&&z| type_at(&m, z) == 0)
        .count() as u64
        * MIB;
    assert_eq!(data, 4 * MIB - MIB / 2 + zeroed_data + probe, "{out}");
    dm.stop();
}

#[test]
fn dirty_data_over_a_hole_is_data_and_nbdcopy_skips_holes() {
    if !(have("nbdinfo") && have("nbdcopy")) {
        return;
    }
    let d = Dir::new("bstat-wb");
    let core = d.sparse("core.img", 32 * MIB);
    let cache = d.sparse("cache.img", 32 * MIB);
    let dm = Daemon::start(Opts::new(&d));
    dm.cache_and_core(&cache, "wb", &core, "vm");
    // Data stays dirty until written back.
    let nop = ["cleaning", "--policy", "nop"];
    dm.ok(&[&["set-param", "--cache-id", "1"][..], &nop].concat());
    let c = dm.nbd("vm").unwrap();
    let a = pattern(7, MIB);
    c.write(4 * 2048, &a, false).unwrap();
    c.flush().unwrap();
    drop(c);
    // Dirty in the cache, a hole in the core file: reported as data.
    let on_core = std::fs::read(&core).unwrap();
    assert!(
        on_core[4 * MIB as usize..5 * MIB as usize]
            .iter()
            .all(|&b| b == 0),
        "the data is not on the core yet"
    );
    let m = map(&dm, "vm");
    println!("dirty: {m:?}");
    assert!(
        all(&m, 4 * MIB, MIB, 0),
        "dirty data over a hole is data: {m:?}"
    );
    assert!(
        // (the first 4 KiB may be data: the O_DIRECT probe's rewrite, see the test above)
        all(&m, 4096, 4 * MIB - 4096, 3) && all(&m, 5 * MIB, 27 * MIB, 3),
        "{m:?}"
    );

    // nbdcopy: bit-exact, and it reads fewer bytes than the export holds.
    let read_bytes = |dm: &Daemon| {
        let s = dm.json(&["stats", "--cache-id", "1", "--core-id", "0"]);
        let v = find(&s, "client_bytes_read").unwrap_or_else(|| panic!("{s}"));
        v.as_u64().unwrap()
    };
    let before = read_bytes(&dm);
    let out = d.path("copy.img");
    let (ok, _, err) = run(Command::new("nbdcopy").args([&dm.uri("vm"), &out]), 120);
    assert!(ok, "nbdcopy: {err}");
    let read = read_bytes(&dm) - before;
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got.len() as u64, 32 * MIB);
    assert!(got[4 * MIB as usize..5 * MIB as usize] == a[..], "the data");
    assert!(
        got[..4 * MIB as usize]
            .iter()
            .chain(&got[5 * MIB as usize..])
            .all(|&b| b == 0),
        "zeros elsewhere"
    );
    println!("nbdcopy read {read} bytes of a {} byte export", 32 * MIB);
    assert!(
        read < 32 * MIB,
        "nbdcopy skipped the holes: {read} bytes read"
    );

    // Written back: still data (now on the core); trimmed: a hole again.
    dm.ok(&["writeback", "--cache-id", "1"]);
    let m = map(&dm, "vm");
    assert!(all(&m, 4 * MIB, MIB, 0), "after writeback: {m:?}");
    let c = dm.nbd("vm").unwrap();
    c.trim(4 * 2048, 2048).unwrap();
    drop(c);
    let m = map(&dm, "vm");
    assert!(all(&m, 4096, 32 * MIB - 4096, 3), "after trim: {m:?}");
    dm.stop();
}

/// The first value of key `k` anywhere in `v`.
fn find<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(o) => o.get(k).or_else(|| o.values().find_map(|x| find(x, k))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, k)),
        _ => None,
    }
}
