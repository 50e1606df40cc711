//! Physics checks of the device models against their presets' published figures.
//!
//! Each test drives a model directly with a closed-loop driver (QD N: N IOs outstanding, the next
//! one submitted as one completes) over simulated time, prints what it measured, and asserts
//! physical ranges. Nothing here reads a clock.

use tiercache_core::units::Nanos;
use tiercache_sim::device::{self, BLOCK, DevIo, Device, DeviceSpec, IoKind, PRESETS};

/// A 64-bit LCG (Knuth's MMIX constants); the high bits are used.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a closed-loop run measured (after its warm-up).
#[derive(Debug)]
struct Run {
    ios: u64,
    bytes: u64,
    secs: f64,
    lat_sum_ns: u128,
}

impl Run {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.secs
    }
    fn mb_s(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e6
    }
    fn lat_us(&self) -> f64 {
        self.lat_sum_ns as f64 / self.ios as f64 / 1e3
    }
}

/// Keeps `qd` IOs outstanding on `dev`; `next()` gives each new IO as (kind, lba, blocks).
/// Measures the `count` completions after the first `warmup`.
fn closed_loop(
    dev: &mut dyn Device,
    qd: usize,
    warmup: u64,
    count: u64,
    mut next: impl FnMut() -> (IoKind, u64, u32),
) -> Run {
    let mut submitted: Vec<(Nanos, u32)> = Vec::new();
    let mut submit = |dev: &mut dyn Device, now: Nanos, submitted: &mut Vec<(Nanos, u32)>| {
        let (kind, lba, blocks) = next();
        let token = submitted.len() as u64;
        submitted.push((now, blocks));
        dev.submit(
            now,
            DevIo {
                token,
                kind,
                lba,
                blocks,
            },
        );
    };
    for _ in 0..qd {
        submit(dev, Nanos(0), &mut submitted);
    }
    let mut done = Vec::new();
    let mut completed = 0u64;
    let mut t0 = Nanos(0);
    let mut run = Run {
        ios: 0,
        bytes: 0,
        secs: 0.0,
        lat_sum_ns: 0,
    };
    loop {
        let t = dev.next_completion().expect("IOs outstanding");
        done.clear();
        dev.complete_until(t, &mut done);
        for &tok in &done {
            completed += 1;
            let (at, blocks) = submitted[tok as usize];
            if completed == warmup {
                t0 = t;
            } else if completed > warmup {
                run.ios += 1;
                run.bytes += blocks as u64 * BLOCK;
                run.lat_sum_ns += t.since(at).0 as u128;
            }
            if completed == warmup + count {
                run.secs = t.since(t0).0 as f64 / 1e9;
                return run;
            }
            submit(dev, t, &mut submitted);
        }
    }
}

fn build(name: &str) -> Box<dyn Device> {
    device::preset(name).expect("preset parses").build(0)
}

/// Random `blocks`-block IOs aligned to `blocks`, over the first `span` blocks.
fn random(kind: IoKind, span: u64, blocks: u32, seed: u64) -> impl FnMut() -> (IoKind, u64, u32) {
    let mut rng = Lcg(seed);
    let slots = span / blocks as u64;
    move || (kind, rng.below(slots) * blocks as u64, blocks)
}

/// Sequential `blocks`-block IOs from LBA 0.
fn sequential(kind: IoKind, blocks: u32) -> impl FnMut() -> (IoKind, u64, u32) {
    let mut lba = 0;
    move || {
        let io = (kind, lba, blocks);
        lba += blocks as u64;
        io
    }
}

const READ: IoKind = IoKind::Read;
const WRITE: IoKind = IoKind::Write { fua: false };

fn within(measured: f64, target: f64, tol: f64) -> bool {
    (measured - target).abs() <= target * tol
}

#[test]
fn hdd_10k_sas_random_and_sequential() {
    let name = "hdd-10k-sas";
    let cap = build(name).capacity_blocks();
    let mut iops = Vec::new();
    for qd in [1, 16, 32] {
        let mut d = build(name);
        let r = closed_loop(d.as_mut(), qd, 100, 2000, random(READ, cap, 8, 7));
        println!(
            "{name}: 4K random read, full span, QD{qd}: {:.0} IOPS, mean latency {:.2} ms",
            r.iops(),
            r.lat_us() / 1e3
        );
        iops.push(r.iops());
    }
    assert!((150.0..=200.0).contains(&iops[0]), "QD1 {}", iops[0]);
    assert!((300.0..=450.0).contains(&iops[1]), "QD16 {}", iops[1]);
    assert!((300.0..=450.0).contains(&iops[2]), "QD32 {}", iops[2]);
    println!("{name}: QD32 / QD1 = {:.2}", iops[2] / iops[0]);
    assert!(iops[2] / iops[0] >= 1.8);

    let mut d = build(name);
    let short = closed_loop(d.as_mut(), 1, 100, 2000, random(READ, cap / 100, 8, 7));
    println!(
        "{name}: 4K random read, 1% span, QD1: {:.0} IOPS",
        short.iops()
    );
    assert!(
        short.iops() > 1.4 * iops[0],
        "short-stroke {} vs full {}",
        short.iops(),
        iops[0]
    );

    let mut d = build(name);
    let seq = closed_loop(d.as_mut(), 1, 10, 1000, sequential(READ, 1024));
    println!("{name}: 512K sequential read, QD1: {:.1} MB/s", seq.mb_s());
    assert!((150.0..=260.0).contains(&seq.mb_s()), "{}", seq.mb_s());

    let mut d = build(name);
    let w = closed_loop(d.as_mut(), 1, 100, 1000, random(WRITE, cap, 8, 9));
    println!(
        "{name}: 4K random write, full span, QD1: {:.0} IOPS",
        w.iops()
    );
    assert!(w.iops() < iops[0], "writes settle longer than reads");
}

#[test]
fn hdd_7k2_sata_random() {
    let name = "hdd-7k2-sata";
    let mut d = build(name);
    let cap = d.capacity_blocks();
    let r = closed_loop(d.as_mut(), 1, 100, 1500, random(READ, cap, 8, 11));
    println!(
        "{name}: 4K random read, full span, QD1: {:.0} IOPS, mean latency {:.2} ms",
        r.iops(),
        r.lat_us() / 1e3
    );
    assert!((75.0..=110.0).contains(&r.iops()), "{}", r.iops());
    let mut d = build(name);
    let r32 = closed_loop(d.as_mut(), 32, 100, 2000, random(READ, cap, 8, 11));
    println!(
        "{name}: 4K random read, full span, QD32: {:.0} IOPS",
        r32.iops()
    );
    assert!(r32.iops() > 1.8 * r.iops());
    let mut d = build(name);
    let seq = closed_loop(d.as_mut(), 1, 10, 500, sequential(READ, 1024));
    println!("{name}: 512K sequential read, QD1: {:.1} MB/s", seq.mb_s());
    assert!((150.0..=220.0).contains(&seq.mb_s()), "{}", seq.mb_s());
}

/// Published figures a flash preset must reproduce: QD1 4K latencies (µs) and 4K IOPS.
struct Published {
    name: &'static str,
    read_lat_us: f64,
    write_lat_us: f64,
    read_iops: f64,
    write_iops: f64,
    /// Queue depth for the IOPS runs.
    qd: usize,
}

const FLASH: &[Published] = &[
    Published {
        name: "nvme-p4510",
        read_lat_us: 77.0,
        write_lat_us: 18.0,
        read_iops: 637_000.0,
        write_iops: 81_500.0,
        qd: 256,
    },
    Published {
        name: "optane-p4800x",
        read_lat_us: 10.0,
        write_lat_us: 10.0,
        read_iops: 550_000.0,
        write_iops: 500_000.0,
        qd: 16,
    },
    Published {
        name: "sata-ssd",
        read_lat_us: 100.0,
        write_lat_us: 40.0,
        read_iops: 98_000.0,
        write_iops: 28_000.0,
        qd: 32,
    },
    Published {
        name: "ram",
        read_lat_us: 0.51,
        write_lat_us: 0.51,
        read_iops: 5_000_000.0,
        write_iops: 5_000_000.0,
        qd: 64,
    },
];

#[test]
fn flash_latency_and_iops() {
    for p in FLASH {
        let cap = build(p.name).capacity_blocks();
        let count = |iops: f64| ((iops * 0.1) as u64).clamp(2000, 100_000);
        for (kind, lat, iops, what) in [
            (READ, p.read_lat_us, p.read_iops, "read"),
            (WRITE, p.write_lat_us, p.write_iops, "write"),
        ] {
            let mut d = build(p.name);
            let q1 = closed_loop(d.as_mut(), 1, 10, 1000, random(kind, cap, 8, 3));
            let mut d = build(p.name);
            let hi = closed_loop(d.as_mut(), p.qd, 1000, count(iops), random(kind, cap, 8, 5));
            println!(
                "{}: 4K random {what}: QD1 latency {:.2} us (published {lat}), QD{} {:.0} IOPS (published {iops})",
                p.name,
                q1.lat_us(),
                p.qd,
                hi.iops()
            );
            assert!(
                within(q1.lat_us(), lat, 0.10),
                "{} QD1 {what} latency {}",
                p.name,
                q1.lat_us()
            );
            assert!(
                within(hi.iops(), iops, 0.10),
                "{} {what} IOPS {}",
                p.name,
                hi.iops()
            );
        }
    }
}

#[test]
fn nvme_p4510_sequential() {
    let name = "nvme-p4510";
    let mut d = build(name);
    let r = closed_loop(d.as_mut(), 32, 100, 20_000, sequential(READ, 256));
    println!(
        "{name}: 128K sequential read, QD32: {:.0} MB/s (published 3200)",
        r.mb_s()
    );
    assert!(within(r.mb_s(), 3200.0, 0.10), "{}", r.mb_s());
    let mut d = build(name);
    let w = closed_loop(d.as_mut(), 32, 100, 10_000, sequential(WRITE, 256));
    println!(
        "{name}: 128K sequential write, QD32: {:.0} MB/s (published 2000)",
        w.mb_s()
    );
    assert!(within(w.mb_s(), 2000.0, 0.10), "{}", w.mb_s());
    let mut d = build(name);
    let q1 = closed_loop(d.as_mut(), 1, 10, 1000, sequential(READ, 256));
    println!("{name}: 128K sequential read, QD1: {:.0} MB/s", q1.mb_s());
    assert!(q1.mb_s() < r.mb_s());
}

#[test]
fn every_preset_parses_and_serves_writes_flush_and_trim() {
    for p in PRESETS {
        let spec = device::preset(p.name).unwrap_or_else(|e| panic!("{e}"));
        match &spec {
            DeviceSpec::Hdd(s) => assert_eq!(s.name, p.name),
            DeviceSpec::Flash(s) => assert_eq!(s.name, p.name),
        }
        assert_eq!(device::parse_spec(p.toml).unwrap(), spec);
        let mut d = spec.build(0);
        assert_eq!(d.name(), p.name);
        let cap = d.capacity_blocks();
        assert!(cap > 1 << 20, "{}: capacity {cap}", p.name);
        let mut rng = Lcg(1);
        for k in 0..8 {
            d.submit(
                Nanos(0),
                DevIo {
                    token: k,
                    kind: WRITE,
                    lba: rng.below(cap / 8) * 8,
                    blocks: 8,
                },
            );
        }
        d.submit(
            Nanos(0),
            DevIo {
                token: 8,
                kind: IoKind::Flush,
                lba: 0,
                blocks: 0,
            },
        );
        d.submit(
            Nanos(0),
            DevIo {
                token: 9,
                kind: IoKind::Trim,
                lba: 0,
                blocks: 8,
            },
        );
        let mut at = [None; 10];
        let mut done = Vec::new();
        while let Some(t) = d.next_completion() {
            done.clear();
            d.complete_until(t, &mut done);
            for &k in &done {
                at[k as usize] = Some(t);
            }
        }
        assert_eq!(d.outstanding(), 0);
        let at: Vec<Nanos> = at.iter().map(|t| t.expect("every IO completes")).collect();
        let last_write = at[..8].iter().max().unwrap();
        println!(
            "{}: 8 random 4K writes done by {:.1} us, flush at {:.1} us",
            p.name,
            last_write.0 as f64 / 1e3,
            at[8].0 as f64 / 1e3
        );
        // A flush covers writes completed before it was issued (SCSI/NVMe); these were in flight
        // with it, so only completion is required. The write-cache case is in hdd.rs's tests.
        assert!(at[8] >= Nanos(0) && *last_write > Nanos(0), "{}", p.name);
        // The preset's capacity is its own and a scenario's overrides it.
        assert_eq!(spec.build(1 << 21).capacity_blocks(), 1 << 21);
    }
    assert!(device::preset("no-such-device").is_err());
    // Unknown keys are refused.
    let typo = PRESETS[0].toml.replace("rpm =", "rmp =");
    assert!(device::parse_spec(&typo).is_err());
    let extra = format!("{}\nbogus = 1\n", PRESETS[2].toml);
    assert!(device::parse_spec(&extra).is_err());
}

/// A mixed sequence of reads, writes, flushes and trims, submitted at QD8; returns every
/// completion as (token, time).
fn replay(name: &str) -> Vec<(u64, Nanos)> {
    let mut d = build(name);
    let cap = d.capacity_blocks();
    let mut rng = Lcg(42);
    let mut out = Vec::new();
    let mut next_token = 0u64;
    let mut submit = |d: &mut dyn Device, now: Nanos, rng: &mut Lcg| {
        let kind = match rng.below(10) {
            0..=5 => READ,
            6..=7 => WRITE,
            8 => IoKind::Flush,
            _ => IoKind::Trim,
        };
        let blocks = 8 << rng.below(5);
        d.submit(
            now,
            DevIo {
                token: next_token,
                kind,
                lba: rng.below(cap - 256),
                blocks,
            },
        );
        next_token += 1;
    };
    for _ in 0..8 {
        submit(d.as_mut(), Nanos(0), &mut rng);
    }
    let mut done = Vec::new();
    while out.len() < 2000 {
        let t = d.next_completion().expect("outstanding");
        done.clear();
        d.complete_until(t, &mut done);
        for &k in &done {
            out.push((k, t));
            submit(d.as_mut(), t, &mut rng);
        }
    }
    out
}

#[test]
fn deterministic() {
    for name in ["hdd-10k-sas", "nvme-p4510"] {
        let a = replay(name);
        let b = replay(name);
        assert_eq!(a, b, "{name}");
        println!(
            "{name}: 2000 mixed IOs replay identically, last at {:.3} ms",
            a.last().unwrap().1.0 as f64 / 1e6
        );
    }
}
