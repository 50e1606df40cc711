//! The load generator against a real server: `nbdkit memory`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::NbdKit;
use tiercache_loadgen::{
    Access, Connection, Distribution, JobSpec, Target, VerifyStats, run, run_with,
};

fn target(kit: &NbdKit) -> Target {
    Target::parse(&kit.uri).unwrap()
}

#[test]
fn random_read_write_mix() {
    let Some(kit) = NbdKit::start("random_read_write_mix", &["memory", "1G"]) else {
        return;
    };
    let spec = JobSpec {
        read_pct: 70,
        size: Some(256 << 20),
        duration: Some(Duration::from_millis(2500)),
        ramp: Duration::from_millis(300),
        connections: 2,
        cpus: vec![0],
        fua_pct: 10,
        flush_every: 100,
        ..JobSpec::default()
    };
    let mut calls = 0;
    let r = run_with(
        &target(&kit),
        &spec,
        &Arc::new(AtomicBool::new(false)),
        &mut |p| {
            calls += 1;
            assert!(p.ops < 100_000_000);
        },
    )
    .unwrap();
    println!(
        "randrw70 4k QD16 x2: {:.0} IOPS {:.1} MB/s lat mean {:.1} p50 {:.1} p99 {:.1} p99.9 {:.1} \
         max {:.1} µs; flushes {} (mean {:.1} µs); {:.2} client CPU µs/IO",
        r.iops,
        r.bw_mbps,
        r.lat.mean_us,
        r.lat.p50_us,
        r.lat.p99_us,
        r.lat.p999_us,
        r.lat.max_us,
        r.flushes,
        r.flush_lat.mean_us,
        r.client_cpu_us_per_io
    );
    assert_eq!(r.export_size, 1 << 30);
    assert!(r.ops > 1000, "{} ops", r.ops);
    assert_eq!(r.errors, 0, "{:?}", r.error_messages);
    assert!(
        r.connection_failures.is_empty(),
        "{:?}",
        r.connection_failures
    );
    assert!(!r.stopped);
    let share = r.reads as f64 / r.ops as f64;
    assert!((0.65..0.75).contains(&share), "read share {share}");
    assert!(r.flushes > 0 && r.flushes <= r.writes / 100 + 2);
    assert!((2.4..3.5).contains(&r.elapsed_s), "elapsed {}", r.elapsed_s);
    assert!(calls >= 8, "progress called {calls} times");
    // The time series: about 3 buckets (2.5 s), adding up to the totals.
    assert!(
        (3..=4).contains(&r.samples.len()),
        "{} samples",
        r.samples.len()
    );
    assert_eq!(r.samples.iter().map(|s| s.ops).sum::<u64>(), r.ops);
    assert!(r.samples.last().unwrap().partial);
    let w = r.worst_sample.unwrap();
    assert!(!r.samples[w].partial);
    assert!(r.lat.p50_us <= r.lat.p99_us && r.lat.p99_us <= r.lat.max_us);
    assert!(r.lat.mean_us > 0.0 && r.lat.min_us > 0.0);
    assert_eq!(r.lat.count, r.ops);
    assert_eq!(r.bytes_read + r.bytes_written, r.ops * 4096);
    let json = serde_json::to_value(&r).unwrap();
    for k in [
        "iops",
        "bw_mbps",
        "lat",
        "samples",
        "spec",
        "lat_cdf",
        "worst_sample",
    ] {
        assert!(json.get(k).is_some(), "{k} missing from JSON");
    }
    assert_eq!(json["spec"]["duration_s"], 2.5);
    assert_eq!(json["spec"]["distribution"]["kind"], "uniform");
}

#[test]
fn sequential_io_count_and_stop_flag() {
    let Some(kit) = NbdKit::start("sequential_io_count_and_stop_flag", &["memory", "1G"]) else {
        return;
    };
    let t = target(&kit);
    let mut spec = JobSpec {
        block_size: 512 << 10,
        queue_depth: 4,
        size: Some(64 << 20),
        duration: None,
        io_count: Some(300),
        ..JobSpec::default()
    };
    spec.set_rw("write", 0).unwrap();
    assert_eq!(spec.access, Access::Sequential);
    let r = run(&t, &spec).unwrap();
    assert_eq!(r.ops, 300);
    assert_eq!(r.bytes_written, 300 * (512 << 10));
    println!("seqwrite 512k QD4: {:.1} MB/s", r.bw_mbps);

    // No duration and no count: only the stop flag ends it.
    spec.io_count = None;
    spec.set_rw("randread", 0).unwrap();
    spec.block_size = 4096;
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let r = run_with(&t, &spec, &stop, &mut |p| {
        if p.elapsed > Duration::from_millis(700) {
            stop.store(true, Ordering::Relaxed);
        }
    })
    .unwrap();
    assert!(r.stopped);
    assert!(r.ops > 100);
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[test]
fn bad_jobs_are_refused() {
    let Some(kit) = NbdKit::start("bad_jobs_are_refused", &["memory", "1M"]) else {
        return;
    };
    let t = target(&kit);
    let too_big = JobSpec {
        offset: 512 << 10,
        size: Some(1 << 20),
        ..JobSpec::default()
    };
    assert!(run(&t, &too_big).is_err());
    let overlap = JobSpec {
        verify: true,
        connections: 2,
        ..JobSpec::default()
    };
    assert!(run(&t, &overlap).is_err());
    let zipf1 = JobSpec {
        distribution: Distribution::Zipf { theta: 1.0 },
        ..JobSpec::default()
    };
    assert!(run(&t, &zipf1).is_err());
    let odd = JobSpec {
        block_size: 1000,
        ..JobSpec::default()
    };
    assert!(run(&t, &odd).is_err());
    let wrong_export = Target::parse(&kit.uri.replace(":///", ":///nope")).unwrap();
    // nbdkit serves any export name by default; a missing socket fails cleanly.
    let _ = run(
        &wrong_export,
        &JobSpec {
            io_count: Some(1),
            ..JobSpec::default()
        },
    );
    let gone = Target::parse("nbd+unix:///?socket=/nonexistent/sock").unwrap();
    assert!(Connection::connect(&gone).is_err());
}

fn verify_job(seconds: f64) -> JobSpec {
    JobSpec {
        read_pct: 50,
        block_size: 4096,
        queue_depth: 16,
        connections: 2,
        split_region: true,
        size: Some(1 << 20), // 256 blocks: every block is written and read again and again
        duration: Some(Duration::from_secs_f64(seconds)),
        verify: true,
        ..JobSpec::default()
    }
}

fn print_verify(name: &str, v: &VerifyStats) {
    println!(
        "{name}: {} checked, {} checked loosely, {} skipped, {} failures; first: {:?}",
        v.checked,
        v.checked_any,
        v.skipped,
        v.failures,
        v.first_failures.first()
    );
}

#[test]
fn verify_finds_no_error_on_a_correct_server() {
    let Some(kit) = NbdKit::start("verify_finds_no_error", &["memory", "1G"]) else {
        return;
    };
    let t = target(&kit);
    // Hot small region, uniform and Zipf, plus a sequential pass with 64K blocks.
    for (dist, access, bs, size) in [
        (Distribution::Uniform, Access::Random, 4096, 1 << 20),
        (
            Distribution::Zipf { theta: 1.2 },
            Access::Random,
            4096,
            16 << 20,
        ),
        (Distribution::Uniform, Access::Sequential, 64 << 10, 4 << 20),
    ] {
        let spec = JobSpec {
            distribution: dist,
            access,
            block_size: bs,
            size: Some(size),
            ..verify_job(1.5)
        };
        let r = run(&t, &spec).unwrap();
        let v = r.verify.clone().unwrap();
        print_verify(&format!("{dist:?} {access:?} {bs}"), &v);
        assert_eq!(v.failures, 0, "{:?}", v.first_failures);
        assert!(v.checked > 1000, "only {} reads checked", v.checked);
        assert_eq!(r.errors, 0);
        assert!(
            r.connection_failures.is_empty(),
            "{:?}",
            r.connection_failures
        );
    }
}

#[test]
fn verify_reports_a_block_corrupted_behind_its_back() {
    let Some(kit) = NbdKit::start("verify_reports_corruption", &["memory", "1G"]) else {
        return;
    };
    let t = target(&kit);
    let spec = verify_job(2.0);
    let corrupted = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            // A second connection overwrites every block of the region once the run is going.
            std::thread::sleep(Duration::from_millis(700));
            let mut c = Connection::connect(&t).unwrap();
            let junk = vec![0xa5u8; 4096];
            for b in 0..256u64 {
                c.write_at(b * 4096, &junk, false).unwrap();
            }
            c.close();
            corrupted.store(true, Ordering::Relaxed);
        });
        run(&t, &spec).unwrap()
    });
    assert!(corrupted.load(Ordering::Relaxed));
    let v = r.verify.unwrap();
    print_verify("corrupted", &v);
    assert!(v.failures > 0, "the verifier missed 256 corrupted blocks");
    assert!(
        v.first_failures[0].contains("block at offset"),
        "{}",
        v.first_failures[0]
    );
    assert!(
        v.first_failures
            .iter()
            .any(|f| f.contains("no pattern header"))
    );
}

#[test]
fn plain_connection_round_trip() {
    let Some(kit) = NbdKit::start("plain_connection_round_trip", &["memory", "1M"]) else {
        return;
    };
    let mut c = Connection::connect(&target(&kit)).unwrap();
    assert_eq!(c.size(), 1 << 20);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    c.write_at(4096, &data, true).unwrap();
    c.flush().unwrap();
    c.cache(0, 65536).unwrap();
    let mut back = vec![0u8; 8192];
    c.read_at(4096, &mut back).unwrap();
    assert_eq!(back, data);
    // Out of range: an NBD error reply, and the connection survives.
    assert!(c.read_at(1 << 20, &mut back).is_err());
    c.read_at(0, &mut back).unwrap();
    c.close();
}

#[test]
fn tcp_uri() {
    if !common::installed("nbdkit") {
        println!("skipped: tcp_uri: nbdkit not installed");
        return;
    }
    // A free port: bind to port 0, note it, release it, hand it to nbdkit.
    let port = tiercache_testkit::free_port();
    // Killed (exactly this process) when dropped, also if the test fails.
    let mut child = tiercache_testkit::Proc::spawn(
        "nbdkit",
        std::process::Command::new("nbdkit")
            .args([
                "-f",
                "--exit-with-parent",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args(["memory", "64M"]),
    );
    let t = Target::parse(&format!("nbd://127.0.0.1:{port}/")).unwrap();
    let t0 = Instant::now();
    let r = loop {
        match run(
            &t,
            &JobSpec {
                io_count: Some(2000),
                duration: None,
                ..JobSpec::default()
            },
        ) {
            Ok(r) => break r,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    };
    child.kill();
    assert_eq!(r.ops, 2000);
    assert_eq!(r.export_size, 64 << 20);
    println!("tcp: {:.0} IOPS", r.iops);
}

#[test]
fn error_replies_are_counted_not_fatal() {
    let Some(kit) = NbdKit::start(
        "error_replies_are_counted_not_fatal",
        &[
            "--log=null",
            "--filter=error",
            "memory",
            "64M",
            "error-rate=5%",
            "error=EIO",
        ],
    ) else {
        return;
    };
    let spec = JobSpec {
        read_pct: 50,
        duration: Some(Duration::from_millis(800)),
        ..JobSpec::default()
    };
    let r = run(&target(&kit), &spec).unwrap();
    println!(
        "error filter: {} ops, {} errors, first {:?}",
        r.ops,
        r.errors,
        r.error_messages.first()
    );
    assert!(
        r.connection_failures.is_empty(),
        "{:?}",
        r.connection_failures
    );
    assert!(r.ops > 500);
    assert!(r.read_errors > 0 && r.write_errors > 0);
    let share = r.errors as f64 / (r.ops + r.errors) as f64;
    assert!((0.02..0.10).contains(&share), "error share {share}");
    assert!(
        r.error_messages[0].contains("EIO"),
        "{}",
        r.error_messages[0]
    );
    assert_eq!(r.samples.iter().map(|s| s.errors).sum::<u64>(), r.errors);
}

#[test]
fn server_death_keeps_what_was_measured() {
    let Some(kit) = NbdKit::start("server_death", &["memory", "64M"]) else {
        return;
    };
    let t = target(&kit);
    let spec = JobSpec {
        duration: Some(Duration::from_secs(5)),
        ..JobSpec::default()
    };
    let t0 = Instant::now();
    let r = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            drop(kit);
        });
        run(&t, &spec).unwrap()
    });
    println!(
        "server died: {} ops kept, {:?}",
        r.ops, r.connection_failures
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert!(r.ops > 100);
    assert_eq!(r.connection_failures.len(), 1);
}

#[test]
fn verify_reports_stale_data_put_back() {
    let Some(kit) = NbdKit::start("verify_reports_stale_data", &["memory", "1G"]) else {
        return;
    };
    let t = target(&kit);
    let spec = verify_job(1.6);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            // Snapshot the region while the run writes it, then put the old copy back: every
            // block holds a complete, well-formed write of this run, only an older one (a lost
            // write, as a cache that served stale data would produce).
            let mut c = Connection::connect(&t).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            let mut old = vec![0u8; 1 << 20];
            c.read_at(0, &mut old).unwrap();
            std::thread::sleep(Duration::from_millis(500));
            c.write_at(0, &old, false).unwrap();
            c.close();
        });
        run(&t, &spec).unwrap()
    });
    let v = r.verify.unwrap();
    print_verify("stale", &v);
    assert!(
        v.failures > 0,
        "the verifier missed stale data on 256 blocks"
    );
    assert!(
        v.first_failures
            .iter()
            .any(|f| f.contains("found seq") && f.contains("checksum ok"))
    );
}
