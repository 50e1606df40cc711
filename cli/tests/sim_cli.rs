//! `tiercache sim` from the outside: listing, errors, and byte-identical JSON for the same seed.

use std::process::Command;

fn tiercache(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(args)
        .output()
        .expect("run tiercache")
}

#[test]
fn list_names_the_shipped_scenarios() {
    let out = tiercache(&["sim", "--list"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["ceph-opencas-2020", "dirty-ratio", "ram-vs-nvme"] {
        assert!(text.contains(name), "{text}");
    }
}

#[test]
fn bad_input_is_one_line_and_exit_1() {
    for args in [
        vec!["sim", "no-such-scenario"],
        vec!["sim", "ram-vs-nvme", "--only", "nothing-matches"],
        vec!["sim", "ram-vs-nvme", "--duration", "0"],
        vec!["sim"],
    ] {
        let out = tiercache(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tiercache: "), "{err}");
    }
}

#[test]
fn same_seed_same_bytes() {
    // Removed at the end unless the test failed.
    let dir = tiercache_testkit::Dir::new("sim-cli");
    let mut outputs = Vec::new();
    for i in 0..2 {
        let json = dir.join(format!("run{i}.json"));
        let csv = dir.join(format!("run{i}.csv"));
        let out = tiercache(&[
            "sim",
            "ram-vs-nvme",
            "--only",
            "16K",
            "--duration",
            "0.05",
            "--seed",
            "7",
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.push((std::fs::read(&json).unwrap(), std::fs::read(&csv).unwrap()));
    }
    assert_eq!(outputs[0], outputs[1], "same seed, different output");
    let v: serde_json::Value = serde_json::from_slice(&outputs[0].0).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for r in runs {
        for k in ["workload", "config", "iops", "lat_mean_us", "lat_p99_us"] {
            assert!(!r[k].is_null(), "missing {k} in {r}");
        }
        assert!(r["iops"].as_f64().unwrap() > 0.0);
    }
}
