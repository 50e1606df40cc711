//! Shipped scenarios, run and asserted.
//!
//! - Scenario (b), `dirty-ratio`: with the writeback-rate controller the dirty ratio stays within
//!   5 points of its 50% target and no second's client IOPS falls below half the median; with
//!   plain `alru` (the check can fail) the cache fills with dirty data and throughput collapses.
//! - Every shipped scenario parses and builds.

use tiercache_sim::scenario::{SHIPPED, Scenario};

fn settled(
    series: &[tiercache_sim::stats::Sample],
    from_s: f64,
) -> Vec<tiercache_sim::stats::Sample> {
    series.iter().copied().filter(|s| s.t_s > from_s).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn rate_controller_holds_the_target_without_a_cliff_and_alru_does_not() {
    let sc = Scenario::load("dirty-ratio").unwrap();
    let w = &sc.workload[0];
    let config = |name: &str| sc.config.iter().find(|c| c.name == name).unwrap().clone();
    let rate = sc.run_one(w, &config("rate"), sc.seed).unwrap();
    println!(" t s  dirty%    IOPS   p99 us   (rate controller, target 50%)");
    for s in &rate.series {
        println!(
            "{:>4.0} {:>7.1} {:>7.0} {:>8.0}",
            s.t_s, s.dirty_pct, s.iops, s.lat_p99_us
        );
    }
    // The cache starts empty and absorbs writes at NVMe speed until the controller engages
    // (about 3 s here); judge from 10 s on.
    let s = settled(&rate.series, 10.0);
    assert!(s.len() >= 45);
    for x in &s {
        assert!(
            (x.dirty_pct - 50.0).abs() <= 5.0,
            "t={} dirty {:.1}%",
            x.t_s,
            x.dirty_pct
        );
    }
    let med = median(s.iter().map(|x| x.iops).collect());
    for x in &s {
        assert!(
            x.iops * 2.0 >= med,
            "t={}: {:.0} IOPS, below half the median {med:.0}",
            x.t_s,
            x.iops
        );
    }
    // Contrast: alru alone fills the cache with dirty data and IOPS fall off a cliff.
    let alru = sc.run_one(w, &config("alru"), sc.seed).unwrap();
    let all: Vec<f64> = alru.series.iter().map(|x| x.iops).collect();
    let peak = all.iter().copied().fold(0.0, f64::max);
    let last = alru.series.last().unwrap();
    println!(
        "alru: peak {peak:.0} IOPS, at the end {:.0} IOPS with {:.1}% dirty",
        last.iops, last.dirty_pct
    );
    assert!(last.dirty_pct > 95.0);
    assert!(
        last.iops * 2.0 < peak,
        "alru shows no cliff: the check could not fail"
    );
}

#[test]
fn every_shipped_scenario_parses() {
    for (name, text) in SHIPPED {
        let s = Scenario::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&s.name, name);
        assert!(!s.about.trim().is_empty());
    }
    assert!(
        Scenario::load("nope")
            .unwrap_err()
            .contains("unknown scenario")
    );
    assert!(Scenario::parse("name = 1").is_err());
}

/// A scenario's policy names are the cache core's (`policy::Named`): a name the core does not
/// know is refused with the core's list.
#[test]
fn scenario_policy_names_are_the_cores() {
    let (_, text) = SHIPPED
        .iter()
        .find(|(n, _)| *n == "dirty-ratio")
        .expect("shipped");
    // The cache's default (its first `cleaning`), then a config's own (the `acp` config).
    for from in ["cleaning = \"alru\"", "cleaning = \"acp\""] {
        let bad = text.replacen(from, "cleaning = \"lru\"", 1);
        let e = Scenario::parse(&bad).unwrap_err();
        assert!(e.contains("unknown cleaning policy 'lru'"), "{e}");
        assert!(e.contains("alru, acp or nop"), "{e}");
    }
    let bad = text.replacen("policy = \"full\"", "policy = \"sometimes\"", 1);
    let e = Scenario::parse(&bad).unwrap_err();
    assert!(e.contains("always, full or never"), "{e}");
}

fn trace_csv(text: &str) -> Vec<tiercache_sim::workload::TraceEntry> {
    let opts = tiercache_sim::trace::ReadOptions {
        format: Some(tiercache_sim::trace::Format::Csv),
        device: Default::default(),
        strict: true,
    };
    let t = tiercache_sim::trace::read_bytes("t.csv", text.as_bytes(), &opts).unwrap();
    tiercache_sim::workload::trace_entries(&t.requests).0
}

#[test]
fn a_trace_replays_open_loop_and_every_request_completes() {
    let sc = Scenario::load("ram-vs-nvme").unwrap();
    // 200 reads of 4 KiB, one every 10 ms: far below what the HDD can serve.
    let text: String = std::iter::once("time_us,op,offset,length\n".to_string())
        .chain(
            (0..200u64).map(|i| format!("{},R,{},4096\n", i * 10_000, (i * 7919 % 100_000) * 4096)),
        )
        .collect();
    let entries = trace_csv(&text);
    for c in &sc.config {
        let r = sc.run_trace(&entries, c).unwrap();
        assert_eq!(r.ops, 200, "{}: every request completes", c.name);
        assert_eq!(r.reads, 200);
        assert_eq!(
            r.hits.is_some(),
            c.cache,
            "{}: hit counts with a cache",
            c.name
        );
        let mean_ms = r.latency.mean_ns() / 1e6;
        if c.cache {
            assert!(mean_ms < 20.0, "{}: {mean_ms} ms", c.name);
        }
    }
    let too_far = trace_csv("0,R,1099511627776,4096");
    assert!(
        sc.run_trace(&too_far, &sc.config[0])
            .unwrap_err()
            .contains("past")
    );
}

#[test]
fn a_trace_replay_honours_warm() {
    // 300 reads of distinct lines, each once: a cold cache hits none; a warm one (ram-vs-nvme
    // warms) starts with the lines the trace touches, and hits all.
    let mut sc = Scenario::load("ram-vs-nvme").unwrap();
    assert!(sc.cache.warm);
    let text: String = std::iter::once("time_us,op,offset,length\n".to_string())
        .chain((0..300u64).map(|i| format!("{},R,{},4096\n", i * 10_000, i * 3 * 4096)))
        .collect();
    let entries = trace_csv(&text);
    let cached = sc.config.iter().find(|c| c.cache).unwrap().clone();
    let warm = sc.run_trace(&entries, &cached).unwrap().hits.unwrap();
    assert_eq!((warm.reads, warm.read_hits), (300, 300));
    sc.cache.warm = false;
    let cold = sc.run_trace(&entries, &cached).unwrap().hits.unwrap();
    assert_eq!((cold.reads, cold.read_hits), (300, 0));
}

#[test]
fn a_device_can_come_from_a_toml_file() {
    let dir = std::env::temp_dir().join(format!("tiercache-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("my-hdd.toml");
    let text = tiercache_sim::device::PRESETS[0]
        .toml
        .replace("rpm = 10000.0", "rpm = 15000.0");
    std::fs::write(&path, text).unwrap();
    let spec = tiercache_sim::device::preset(path.to_str().unwrap()).unwrap();
    match spec {
        tiercache_sim::device::DeviceSpec::Hdd(h) => assert_eq!(h.rpm, 15000.0),
        other => panic!("{other:?}"),
    }
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "model = \"hdd\"\nrpm = \"fast\"\n").unwrap();
    assert!(tiercache_sim::device::preset(bad.to_str().unwrap()).is_err());
    assert!(
        tiercache_sim::device::preset("no-such")
            .unwrap_err()
            .contains("known")
    );
    std::fs::remove_dir_all(&dir).ok();
}
