//! A small fio-like driver for tiercache-loadgen.
//!
//! ```text
//! cargo run --release -p tiercache-loadgen --example nbdload -- URI [options]
//!   --rw randread|randwrite|randrw|read|write|rw   (default randread)
//!   --rwmixread PCT   --bs BYTES[k|m]   --iodepth N   --jobs N   --split
//!   --offset BYTES    --size BYTES      --runtime SECS   --number-ios N   --ramp SECS
//!   --zipf THETA      --seed N   --fua PCT   --fsync N   --verify   --json
//! ```
//! Ctrl-C stops the run and prints what was measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tiercache_loadgen::{Distribution, JobSpec, Target, run_with};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn size_arg(s: &str) -> u64 {
    let (num, mul) = match s.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| die(&format!("bad size {s}")))
        * mul
}

fn die(m: &str) -> ! {
    eprintln!("nbdload: {m}");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let uri = args
        .next()
        .unwrap_or_else(|| die("usage: nbdload URI [options]"));
    let target = Target::parse(&uri).unwrap_or_else(|e| die(&e.to_string()));
    let mut spec = JobSpec::default();
    let (mut rw, mut mix, mut json) = ("randread".to_string(), 50u8, false);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        let num = |v: String| {
            v.parse::<f64>()
                .unwrap_or_else(|_| die(&format!("bad {v}")))
        };
        match a.as_str() {
            "--rw" => rw = val(),
            "--rwmixread" => mix = num(val()) as u8,
            "--bs" => spec.block_size = size_arg(&val()) as u32,
            "--iodepth" => spec.queue_depth = num(val()) as u32,
            "--jobs" => spec.connections = num(val()) as u32,
            "--split" => spec.split_region = true,
            "--offset" => spec.offset = size_arg(&val()),
            "--size" => spec.size = Some(size_arg(&val())),
            "--runtime" => spec.duration = Some(Duration::from_secs_f64(num(val()))),
            "--number-ios" => {
                spec.io_count = Some(num(val()) as u64);
                spec.duration = None;
            }
            "--ramp" => spec.ramp = Duration::from_secs_f64(num(val())),
            "--zipf" => spec.distribution = Distribution::Zipf { theta: num(val()) },
            "--seed" => spec.seed = num(val()) as u64,
            "--fua" => spec.fua_pct = num(val()) as u8,
            "--fsync" => spec.flush_every = num(val()) as u64,
            "--verify" => spec.verify = true,
            "--json" => json = true,
            _ => die(&format!("unknown option {a}")),
        }
    }
    spec.set_rw(&rw, mix)
        .unwrap_or_else(|e| die(&e.to_string()));
    // SAFETY: installing an async-signal-safe handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let r = run_with(&target, &spec, &stop, &mut |p| {
        if INTERRUPTED.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
        }
        if !json {
            let plan = p
                .planned
                .map_or(String::new(), |d| format!("/{:.0}s", d.as_secs_f64()));
            eprint!(
                "\r{:6.1}s{plan} {:>10} ops{}   ",
                p.elapsed.as_secs_f64(),
                p.ops,
                { if p.ramping { " (ramp)" } else { "" } }
            );
        }
    })
    .unwrap_or_else(|e| die(&e.to_string()));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("serializable")
        );
        return;
    }
    eprintln!();
    println!(
        "{:.0} IOPS ({:.0} read, {:.0} write), {:.1} MB/s over {:.2} s{}",
        r.iops,
        r.read_iops,
        r.write_iops,
        r.bw_mbps,
        r.elapsed_s,
        if r.stopped { " (stopped)" } else { "" }
    );
    println!(
        "latency µs: mean {:.1} p50 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}; client CPU {:.2} µs/IO",
        r.lat.mean_us,
        r.lat.p50_us,
        r.lat.p99_us,
        r.lat.p999_us,
        r.lat.max_us,
        r.client_cpu_us_per_io
    );
    if let Some(w) = r.worst_sample {
        let s = &r.samples[w];
        println!(
            "worst {:.1}s bucket at {:.0}s: {:.0} IOPS",
            s.duration_s, s.t_s, s.iops
        );
    }
    if r.errors > 0 {
        println!("{} error replies: {:?}", r.errors, r.error_messages);
    }
    if let Some(v) = &r.verify {
        println!(
            "verify: {} checked, {} checked loosely, {} skipped, {} FAILED",
            v.checked, v.checked_any, v.skipped, v.failures
        );
        for f in &v.first_failures {
            println!("  {f}");
        }
    }
    for f in &r.connection_failures {
        println!("connection failure: {f}");
    }
    if r.verify.as_ref().is_some_and(|v| v.failures > 0) || !r.connection_failures.is_empty() {
        std::process::exit(1);
    }
}
