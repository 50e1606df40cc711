//! `tiercache bench core --json`: one JSON object with the keys the issue names (the figures
//! themselves are printed, never asserted).

use std::process::Command;

#[test]
fn bench_core_json_has_the_promised_keys() {
    let path = std::env::temp_dir().join(format!("tiercache-bench-{}.json", std::process::id()));
    // A small cache: under the test command every event also checks the core's invariants,
    // which costs O(lines) (at 65536 lines this test took over 4 minutes there).
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args([
            "bench", "core", "--lines", "4096", "--ops", "5000", "--json",
        ])
        .arg(&path)
        .output()
        .expect("run tiercache");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for k in [
        "read_hit_ns",
        "read_hit_ns_p99",
        "write_hit_ns",
        "write_hit_ns_p99",
        "memcpy_4k_ns",
        "ram_bytes_per_line",
        "read_hit_scattered_ns",
        "mem_dependent_read_ns",
        "mem_cold_copy_4k_ns",
        "engine_ram_hit_ns",
        "engine_ram_hit_zipf_ns",
    ] {
        assert!(
            v[k].as_f64().is_some_and(|x| x > 0.0),
            "{k} missing or not positive in {v}"
        );
    }
    let waits = v["lock_wait"].as_array().expect("lock_wait");
    assert!(
        waits.len() >= 2
            && waits
                .iter()
                .all(|w| w["queued"].as_u64() > Some(0) && w["wake_up_ns"].as_f64() > Some(0.0)),
        "lock_wait: {v}"
    );
    std::fs::remove_file(&path).ok();
    let bad = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["bench", "core", "--lines", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr)
            .trim_end()
            .lines()
            .count(),
        1
    );
}
