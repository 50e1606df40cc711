//! `tiercache bench peers --quick --json F`: the JSON carries every promised key, every number
//! is positive, the P1 tiercache runs were all hits, and no process it started outlives it.
//! Speed is never asserted. Skipped (with a message) when fio, nbdkit or taskset is missing;
//! scripts/test.sh installs them.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Processes whose command line mentions `dir`.
fn processes_under(dir: &Path) -> Vec<String> {
    let want = dir.display().to_string();
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(c) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let c = String::from_utf8_lossy(&c).replace('\0', " ");
        if c.contains(&want) {
            v.push(format!("{}: {c}", e.file_name().to_string_lossy()));
        }
    }
    v
}

#[test]
fn bench_peers_quick_json() {
    for t in ["fio", "nbdkit", "taskset"] {
        if !have(t) {
            eprintln!("skipped: {t} is not installed (scripts/test.sh installs it)");
            return;
        }
    }
    let base = std::env::temp_dir().join(format!("tc-peers-test-{}", std::process::id()));
    std::fs::create_dir_all(&base).unwrap();
    let json_path = base.join("peers.json");
    let scratch = base.join("scratch");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["bench", "peers", "--quick", "--client-cpu"])
        .arg(if cpus > 1 { "1" } else { "0" })
        .arg("--json")
        .arg(&json_path)
        .arg("--scratch")
        .arg(&scratch)
        .output()
        .expect("run tiercache");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "bench peers failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = processes_under(&scratch);
    assert!(left.is_empty(), "processes left running: {left:?}");
    let v: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    std::fs::remove_dir_all(&base).ok();

    for k in [
        "tool", "commit", "host", "config", "setup", "runs", "summary",
    ] {
        assert!(!v[k].is_null(), "{k} missing");
    }
    assert_eq!(v["stopped_early"], false);
    assert!(v["error"].is_null(), "error: {}", v["error"]);
    let runs = v["runs"].as_array().expect("runs");
    let pos = |r: &Value, k: &str| {
        assert!(
            r[k].as_f64().is_some_and(|x| x > 0.0),
            "{k} missing or not positive in {r}"
        );
    };
    let mut seen = std::collections::BTreeSet::new();
    for r in runs {
        let part = r["part"].as_str().unwrap();
        let cfg = r["config"].as_str().unwrap();
        seen.insert(format!("{part}/{cfg}/{}", r["connections"]));
        for k in [
            "iops",
            "lat_p50_us",
            "lat_p99_us",
            "lat_mean_us",
            "fio_cpu_us_per_io",
        ] {
            pos(r, k);
        }
        if cfg != "fio-io_uring-device" {
            // CPU time comes from /proc in clock ticks (10 ms): a short P2 run of a few
            // hundred IOs against a delayed core may use less than one tick of nbdkit's CPU.
            let nonneg = |k: &str| {
                assert!(
                    r[k].as_f64().is_some_and(|x| x >= 0.0),
                    "{k} missing or negative in {r}"
                );
            };
            if part == "P2" {
                nonneg("server_cpu_us_per_io");
                nonneg("server_cpu_utilization");
            } else {
                pos(r, "server_cpu_us_per_io");
                pos(r, "server_cpu_utilization");
            }
        }
        // The pass-through floor reads the device every time: it has no hits.
        if part == "P1" && cfg.starts_with("tiercache") && cfg != "tiercache-pt-file" {
            let h = r["read_hit_ratio"].as_f64().unwrap();
            assert!(h >= 0.99, "P1 {cfg} read hit ratio {h}");
        }
        if part == "P2" {
            pos(r, "read_iops");
            pos(r, "write_iops");
            let h = r["read_hit_ratio"].as_f64().expect("P2 hit ratio");
            assert!((0.0..=1.0).contains(&h), "P2 hit ratio {h}");
        }
    }
    for want in [
        "P1/tiercache-ram/1",
        "P1/tiercache-file/1",
        "P1/tiercache-pt-file/1",
        "P1/nbdkit-memory/1",
        "P1/fio-io_uring-device/1",
        "P2/tiercache/1",
        "P2/nbdkit-cache/1",
        "conns/tiercache-ram/1",
        "conns/tiercache-ram/4",
        "conns/nbdkit-memory/4",
    ] {
        assert!(seen.contains(want), "no {want} run; saw {seen:?}");
    }
    let s = &v["summary"];
    for c in [
        "tiercache-ram",
        "tiercache-file",
        "nbdkit-memory",
        "fio-io_uring-device",
    ] {
        pos(&s["p1"]["configs"][c], "iops_median");
    }
    for c in ["tiercache", "nbdkit-cache"] {
        pos(&s["p2"]["configs"][c], "iops_median");
    }
    assert_eq!(s["connections"].as_array().map(Vec::len), Some(4));
    let targets = s["targets"].as_array().expect("targets");
    let ids: Vec<&str> = targets.iter().filter_map(|t| t["id"].as_str()).collect();
    assert_eq!(ids, ["P1-ram", "P1-file", "P2"]);
    for t in targets {
        pos(t, "ratio");
        assert!(t["met"].is_boolean(), "{t}");
    }
    assert!(stdout.contains("targets met:"), "{stdout}");
}
