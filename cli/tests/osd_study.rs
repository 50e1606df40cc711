//! `tiercache bench --study ceph-osd` (issue 26): BlueStore OSDs whose data device is a bare
//! emulated HDD, the same with DB/WAL on a fast file, or tiercache over the HDD, each attached
//! through NBD (nbd-client where /dev/nbd0 exists, else nbdfuse).
//!
//! - the smallest study end to end (1 OSD, a 64 MiB image, 2 s runs, warm-up at most 30 s): every layout measured,
//!   the report written with the simulator's prediction beside each run and ratio (a
//!   measured reason wherever they differ by more than 1.5x, and the seed study's 12-OSD
//!   cluster), and afterwards no mount, no process and no file of the study left;
//! - bad input: one line, nothing created.
//!
//! The end-to-end test is skipped (with a printed reason) when ceph-osd, fio, or both nbdfuse
//! and /dev/nbd0 are missing.

mod common;

use common::{BIN, Dir, have};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Runs `tiercache bench --study ceph-osd ARGS` with `--out` and `--scratch` under `d`:
/// (success, stdout, stderr).
fn study(d: &Dir, args: &[&str], env_path: Option<&str>) -> (bool, String, String) {
    let mut c = Command::new(BIN);
    c.args(["bench", "--study", "ceph-osd"]).args(args).args([
        "--out",
        &d.path("out"),
        "--scratch",
        &d.path("scratch"),
    ]);
    if let Some(p) = env_path {
        c.env("PATH", p);
    }
    let o = c.output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Nothing of a study under `d`: no report directory, the scratch directory empty.
fn nothing_left(d: &Dir) {
    assert!(!Path::new(&d.path("out")).exists(), "a report was started");
    let left: Vec<_> = std::fs::read_dir(d.path("scratch"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the scratch directory: {left:?}");
}

/// Processes whose command line names `what` (other than this test).
fn processes_naming(what: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(what) {
                v.push(format!("{name}: {c}"));
            }
        }
    }
    v
}

#[test]
fn study_bad_input_is_one_line_and_leaves_nothing() {
    let d = Dir::new("osd-study-bad");
    std::fs::create_dir_all(d.path("scratch")).unwrap();
    let one_line = |args: &[&str], path: Option<&str>, want: &str| {
        let t = Instant::now();
        let (ok, so, se) = study(&d, args, path);
        assert!(!ok, "{args:?} succeeded: {so}");
        assert_eq!(se.lines().count(), 1, "{args:?}: one line: {se}");
        assert!(
            se.starts_with("tiercache: ") && se.contains(want),
            "{args:?}: want '{want}' in: {se}"
        );
        nothing_left(&d);
        println!(
            "{args:?}: {} ({:.2} s)",
            se.trim(),
            t.elapsed().as_secs_f64()
        );
    };
    one_line(
        &["--layouts", "hdd,ssd"],
        None,
        "unknown layout 'ssd' (want a comma-separated list of hdd, hdd+db, tiercache)",
    );
    one_line(&["--osds", "4"], None, "--osds 4: want 1, 2 or 3");
    one_line(&["--image-size", "1000t"], None, "too little disk");
    if Path::new("/dev/nbd0").exists() {
        println!("(not checked: no nbdfuse and no /dev/nbd0 — this host has /dev/nbd0)");
    } else {
        one_line(&["--quick"], Some("/nonexistent"), "there is no /dev/nbd0");
    }
    // A study that does not exist is refused while parsing.
    let o = Command::new(BIN)
        .args(["bench", "--study", "ceph-mon", "--out", &d.path("out")])
        .output()
        .unwrap();
    let se = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && se.contains("invalid value 'ceph-mon'"),
        "{se}"
    );
    nothing_left(&d);
}

#[test]
fn study_smallest_end_to_end() {
    for p in ["ceph-osd", "ceph-mon", "fio"] {
        if !have(p) {
            println!("skipped: study_smallest_end_to_end: {p} is not installed");
            return;
        }
    }
    if !have("nbdfuse") && !Path::new("/dev/nbd0").exists() {
        println!("skipped: study_smallest_end_to_end: neither nbdfuse nor /dev/nbd0");
        return;
    }
    let d = Dir::new("osd-study");
    std::fs::create_dir_all(d.path("scratch")).unwrap();
    let t = Instant::now();
    let (ok, so, se) = study(
        &d,
        &[
            "--quick",
            "--osds",
            "1",
            "--image-size",
            "64m",
            "--cache-size",
            "256m",
            "--runtime",
            "2",
        ],
        None,
    );
    println!("{so}");
    println!("study took {:.1} s", t.elapsed().as_secs_f64());
    assert!(ok, "the study failed:\n{so}\n{se}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path("out/results.json")).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    for l in ["hdd", "hdd+db", "tiercache"] {
        for w in ["randread-4k", "randwrite-4k"] {
            let r = runs
                .iter()
                .find(|r| r["layout"] == l && r["workload"] == w)
                .unwrap_or_else(|| panic!("no run of {w} on {l}: {v}"));
            assert!(r["iops"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["lat_p99_us"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(r["hit_ratio"].is_null(), l != "tiercache", "{r}");
        }
    }
    assert_eq!(runs.len(), 6, "{v}");
    let attach = v["config"]["attach"].as_str().unwrap();
    assert!(attach == "nbdfuse" || attach == "nbd-client", "{attach}");
    assert!(
        v["config"]["attach_statement"]
            .as_str()
            .unwrap()
            .contains("same attach")
    );
    // Each layout's OSD had a DB of its own exactly where the layout says.
    for l in v["layouts"].as_array().unwrap() {
        assert_eq!(
            l["osds"][0]["bluefs_dedicated_db"],
            if l["layout"] == "hdd" { "0" } else { "1" },
            "{l}"
        );
    }
    let ratios = v["ratios"].as_array().unwrap();
    assert!(
        ratios
            .iter()
            .any(|r| r["workload"] == "randread-4k" && r["tiercache/hdd+db"].as_f64().is_some()),
        "{v}"
    );
    // The simulator beside reality: calibrated from the runs, a prediction per run and per
    // ratio, a reason (measured) wherever they differ by more than 1.5x, and the seed study's
    // 12-OSD cluster.
    for r in runs {
        assert!(r["predicted"]["iops"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["data_device_requests"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["host_cpu_busy"].as_f64().is_some(), "{r}");
    }
    let p = &v["predicted"];
    let cal = &p["calibration"];
    assert!(cal["cpu_us"].as_f64().unwrap() > 0.0, "{p}");
    assert!(
        cal["from"]["latency_us"].as_str().unwrap().contains("QD 1"),
        "{p}"
    );
    let pr = p["ratios"].as_array().unwrap();
    assert_eq!(pr.len(), 6, "{p}");
    for r in pr {
        let (m, q) = (
            r["measured"].as_f64().unwrap(),
            r["predicted"].as_f64().unwrap(),
        );
        assert!(m > 0.0 && q > 0.0, "{r}");
        let far = (m / q).max(q / m) > 1.5;
        assert_eq!(r["differs"].as_bool(), Some(far), "{r}");
        assert_eq!(
            r["reason"].as_str().is_some_and(|s| s.contains("measured")),
            far,
            "{r}"
        );
    }
    let row = ratios
        .iter()
        .find(|r| r["workload"] == "randread-4k" && r["metric"] == "iops")
        .unwrap();
    assert!(
        row["predicted"]["tiercache/hdd+db"].as_f64().unwrap() > 0.0,
        "{row}"
    );
    let seed = &p["seed_cluster"];
    assert_eq!(
        (seed["nodes"].as_u64(), seed["osds_per_node"].as_u64()),
        (Some(2), Some(6)),
        "{p}"
    );
    assert!(
        seed["runs"][0]["tiercache/hdd+db"].as_f64().unwrap() > 0.0,
        "{p}"
    );
    let md = std::fs::read_to_string(d.path("out/report.md")).unwrap();
    assert!(
        md.contains("x119.5") && md.contains("Micron") && md.contains("nbd"),
        "{md}"
    );
    assert!(
        md.contains("The simulator beside reality")
            && md.contains("seed study's cluster predicted"),
        "{md}"
    );
    // Nothing left: the scratch directory (cluster, files, mounts) is gone, and so is every
    // process and mount that named it.
    let scratch = d.path("scratch");
    let left: Vec<_> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the scratch directory: {left:?}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&scratch), "mounts left: {mounts}");
    let procs = processes_naming(&scratch);
    assert!(procs.is_empty(), "processes left: {procs:?}");
}
