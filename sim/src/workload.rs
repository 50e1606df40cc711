//! Client workloads: the studies' matrix (4K random read / write / 70-30, 512K sequential read /
//! write) with queue depth, jobs, working-set size and key distribution, plus replay of a
//! trace (read by [`crate::trace`]).
//!
//! A closed-loop workload keeps `jobs × qd` requests outstanding: each completion submits the
//! job's next request at once (what fio does with `iodepth` and `numjobs`). Offsets are drawn
//! from the workload's own seeded PRNG, so a run replays exactly.

use serde::{Deserialize, Serialize};

use crate::rng::{Rng, Zipf};

/// Access pattern.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Offsets drawn from the distribution.
    Random,
    /// Each job walks its own slice of the volume in order, wrapping at its end.
    Sequential,
}

/// How random offsets are distributed over the working set.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Distribution {
    /// Every block-sized slot equally likely.
    #[default]
    Uniform,
    /// Zipf with exponent `theta` (0 < theta < 1; 0.99 is YCSB's default). Hot slots are
    /// scattered over the working set, not packed at its start.
    Zipf {
        /// Skew.
        theta: f64,
    },
    /// `ops_pct` percent of requests go to `space_pct` percent of the working set.
    Hotspot {
        /// Share of requests to the hot region, percent.
        ops_pct: f64,
        /// Size of the hot region, percent of the working set.
        space_pct: f64,
    },
}

/// A workload, as written in a scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Name shown in tables and JSON (e.g. `4K randread`).
    pub name: String,
    /// Random or sequential.
    pub pattern: Pattern,
    /// Reads as a share of requests, percent (100 = read only, 0 = write only).
    pub read_pct: u32,
    /// Request size, KiB.
    pub block_kib: u32,
    /// Requests outstanding per job.
    pub qd: u32,
    /// Jobs (independent request streams).
    pub jobs: u32,
    /// Offset distribution for random patterns.
    #[serde(default)]
    pub distribution: Distribution,
    /// Measured duration, simulated seconds.
    pub duration_s: f64,
    /// Start with an empty cache even when the scenario warms it (streams bigger than any
    /// cache, or data the cache has not seen).
    #[serde(default)]
    pub cold: bool,
}

impl WorkloadSpec {
    /// Checks the numbers; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let w = &self.name;
        if self.read_pct > 100 {
            return Err(format!(
                "workload '{w}': read_pct {} is over 100",
                self.read_pct
            ));
        }
        if self.block_kib == 0 || self.block_kib > 32 * 1024 {
            return Err(format!("workload '{w}': block_kib must be 1..=32768"));
        }
        if self.qd == 0 || self.jobs == 0 || self.qd as u64 * self.jobs as u64 > 65_536 {
            return Err(format!(
                "workload '{w}': qd and jobs must be >= 1 (at most 65536 in all)"
            ));
        }
        if !(self.duration_s > 0.0 && self.duration_s <= 86_400.0) {
            return Err(format!("workload '{w}': duration_s must be in (0, 86400]"));
        }
        match self.distribution {
            Distribution::Uniform => {}
            Distribution::Zipf { theta } if theta > 0.0 && theta < 1.0 => {}
            Distribution::Zipf { theta } => {
                return Err(format!(
                    "workload '{w}': zipf theta {theta} must be in (0, 1)"
                ));
            }
            Distribution::Hotspot { ops_pct, space_pct }
                if (0.0..=100.0).contains(&ops_pct) && space_pct > 0.0 && space_pct <= 100.0 => {}
            Distribution::Hotspot { .. } => {
                return Err(format!(
                    "workload '{w}': hotspot percentages must be in 0..=100"
                ));
            }
        }
        Ok(())
    }

    /// Requests outstanding in all.
    pub fn outstanding(&self) -> u32 {
        self.qd * self.jobs
    }
}

/// One client request: offset and length in 512-byte blocks of the volume.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClientIo {
    /// Read (else write).
    pub read: bool,
    /// First block.
    pub lba: u64,
    /// Blocks.
    pub blocks: u32,
}

/// Draws a workload's requests.
pub struct Generator {
    spec: WorkloadSpec,
    rng: Rng,
    slots: u64,
    slot_blocks: u64,
    zipf: Option<Zipf>,
    /// Per job: next sequential slot.
    cursors: Vec<u64>,
}

impl Generator {
    /// A generator over a working set of `ws_blocks` blocks, seeded.
    pub fn new(spec: &WorkloadSpec, ws_blocks: u64, seed: u64) -> Generator {
        let slot_blocks = spec.block_kib as u64 * 2;
        let slots = (ws_blocks / slot_blocks).max(1);
        let zipf = match spec.distribution {
            Distribution::Zipf { theta } if spec.pattern == Pattern::Random => {
                Some(Zipf::new(slots, theta))
            }
            _ => None,
        };
        let jobs = spec.jobs.max(1) as u64;
        let cursors = (0..jobs).map(|j| j * slots / jobs).collect();
        Generator {
            spec: spec.clone(),
            rng: Rng::new(seed),
            slots,
            slot_blocks,
            zipf,
            cursors,
        }
    }

    /// Scatters rank `r` over `0..n` (a bijection when `n` is not a multiple of the prime).
    fn scatter(r: u64, n: u64) -> u64 {
        ((r as u128 * 2_654_435_761u128) % n as u128) as u64
    }

    /// The next request of job `job`.
    pub fn next(&mut self, job: usize) -> ClientIo {
        let read = self.rng.below(100) < self.spec.read_pct as u64;
        let slot = match self.spec.pattern {
            Pattern::Sequential => {
                let jobs = self.cursors.len() as u64;
                let j = job as u64 % jobs;
                let (lo, hi) = (
                    j * self.slots / jobs,
                    ((j + 1) * self.slots / jobs).max(j * self.slots / jobs + 1),
                );
                let c = &mut self.cursors[j as usize];
                let s = *c;
                *c = if s + 1 >= hi { lo } else { s + 1 };
                s
            }
            Pattern::Random => match self.spec.distribution {
                Distribution::Uniform => self.rng.below(self.slots),
                Distribution::Zipf { .. } => {
                    let z = self.zipf.as_ref().expect("zipf set up");
                    Self::scatter(z.sample(&mut self.rng), self.slots)
                }
                Distribution::Hotspot { ops_pct, space_pct } => {
                    let hot = ((self.slots as f64 * space_pct / 100.0) as u64).clamp(1, self.slots);
                    let r = if self.rng.unit() * 100.0 < ops_pct || hot == self.slots {
                        self.rng.below(hot)
                    } else {
                        hot + self.rng.below(self.slots - hot)
                    };
                    Self::scatter(r, self.slots)
                }
            },
        };
        ClientIo {
            read,
            lba: slot * self.slot_blocks,
            blocks: self.slot_blocks as u32,
        }
    }
}

/// One line of a replayed trace.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// Submission time since the start, microseconds.
    pub time_us: u64,
    /// The request.
    pub io: ClientIo,
}

/// The reads and writes of a trace read by [`crate::trace`], as replay entries; trims and
/// flushes are not replayed (the client model issues reads and writes only): their count is
/// returned beside.
pub fn trace_entries(reqs: &[crate::trace::Request]) -> (Vec<TraceEntry>, u64) {
    use crate::trace::Op;
    let mut skipped = 0;
    let mut out = Vec::with_capacity(reqs.len());
    for r in reqs {
        if !matches!(r.op, Op::Read | Op::Write) || r.len == 0 {
            skipped += 1;
            continue;
        }
        // Requests past the 32 MiB a client request may carry are cut into pieces.
        let (mut lba, mut left) = (r.offset / 512, r.len / 512);
        while left > 0 {
            let blocks = left.min(65536);
            out.push(TraceEntry {
                time_us: r.time_us,
                io: ClientIo {
                    read: r.op == Op::Read,
                    lba,
                    blocks,
                },
            });
            lba += blocks as u64;
            left -= blocks;
        }
    }
    (out, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pattern: Pattern, dist: Distribution) -> WorkloadSpec {
        WorkloadSpec {
            name: "t".into(),
            pattern,
            read_pct: 70,
            block_kib: 4,
            qd: 4,
            jobs: 2,
            distribution: dist,
            duration_s: 1.0,
            cold: false,
        }
    }

    #[test]
    fn sequential_jobs_walk_their_own_slices() {
        let mut g = Generator::new(&spec(Pattern::Sequential, Distribution::Uniform), 80, 1);
        // 10 slots of 8 blocks, 2 jobs: slots 0..5 and 5..10.
        let a: Vec<u64> = (0..6).map(|_| g.next(0).lba / 8).collect();
        let b: Vec<u64> = (0..6).map(|_| g.next(1).lba / 8).collect();
        assert_eq!(a, vec![0, 1, 2, 3, 4, 0]);
        assert_eq!(b, vec![5, 6, 7, 8, 9, 5]);
    }

    #[test]
    fn mix_and_bounds_and_determinism() {
        for d in [
            Distribution::Uniform,
            Distribution::Zipf { theta: 0.99 },
            Distribution::Hotspot {
                ops_pct: 90.0,
                space_pct: 10.0,
            },
        ] {
            let s = spec(Pattern::Random, d);
            s.validate().unwrap();
            let mut g = Generator::new(&s, 1 << 20, 7);
            let mut g2 = Generator::new(&s, 1 << 20, 7);
            let mut reads = 0;
            for _ in 0..10_000 {
                let io = g.next(0);
                assert_eq!(io, g2.next(0));
                assert!(io.lba + io.blocks as u64 <= 1 << 20);
                assert_eq!(io.lba % 8, 0);
                reads += io.read as u32;
            }
            assert!((6500..7500).contains(&reads), "{reads}");
        }
    }

    #[test]
    fn hotspot_concentrates() {
        let s = spec(
            Pattern::Random,
            Distribution::Hotspot {
                ops_pct: 90.0,
                space_pct: 10.0,
            },
        );
        let mut g = Generator::new(&s, 8 * 1000, 3);
        let mut seen = std::collections::HashMap::new();
        for _ in 0..100_000 {
            *seen.entry(g.next(0).lba).or_insert(0u32) += 1;
        }
        let mut counts: Vec<u32> = seen.values().copied().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u32 = counts[..100].iter().sum();
        assert!(top > 85_000, "top 10% of slots got {top} of 100000");
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason_and_traces_convert() {
        let mut s = spec(Pattern::Random, Distribution::Zipf { theta: 1.5 });
        assert!(s.validate().unwrap_err().contains("theta"));
        s.distribution = Distribution::Uniform;
        s.read_pct = 101;
        assert!(s.validate().unwrap_err().contains("read_pct"));
        let reqs = [
            crate::trace::Request {
                time_us: 0,
                offset: 4096,
                len: 8192,
                op: crate::trace::Op::Write,
            },
            crate::trace::Request {
                time_us: 3,
                offset: 0,
                len: 0,
                op: crate::trace::Op::Flush,
            },
        ];
        let (t, skipped) = trace_entries(&reqs);
        assert_eq!(skipped, 1);
        assert_eq!(
            t,
            vec![TraceEntry {
                time_us: 0,
                io: ClientIo {
                    read: false,
                    lba: 8,
                    blocks: 16
                }
            }]
        );
    }
}
