//! Flash (NVMe, Optane, SATA SSD) and RAM: parallel units with fixed latencies, per-unit
//! bandwidth, and device-wide bandwidth and IOPS limits.
//!
//! # Model
//!
//! * The device has `channels` parallel units. IOs are dispatched in arrival order (FIFO) to the
//!   first unit to become free, so at most `channels` IOs are in service at once.
//! * An IO's service time on its unit is
//!
//!   ```text
//!   service = latency + bytes / channel_bandwidth       latency = read_latency_us or write_latency_us
//!   ```
//!
//!   The fixed latency plus the transfer of a 4 KiB block is the datasheet's QD1 latency, so
//!   presets set `*_latency_us` to the published latency minus `4096 / channel_mb_s`.
//! * Device-wide limits are enforced by pacing: the device has one pipe, and an IO occupies it
//!   for `max(1 / iops, bytes / bandwidth)` of its kind (`read_iops` / `read_mb_s` or
//!   `write_iops` / `write_mb_s`). An IO cannot start before the pipe is free, so a saturated
//!   device runs at exactly its published IOPS (small IOs) or bandwidth (large IOs), and a mix
//!   of reads and writes shares the budget (a 70/30 mix runs at the weighted harmonic mean of
//!   the two rates, as real drives roughly do).
//! * So: `start = max(now, first free unit, pipe free)`, `done = start + service`.
//! * **Flush** completes `flush_latency_us` after every earlier write has completed (or after
//!   its own submission, whichever is later). It uses no unit or pipe time.
//! * **Trim** completes after `trim_latency_us` and uses no unit or pipe time.
//! * FUA writes cost the same as other writes: the presets model enterprise drives whose write
//!   buffer is power-loss protected.
//!
//! Because dispatch is FIFO and service times are fixed, each IO's completion time is known at
//! submission; the model is deterministic and uses integer time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};
use tiercache_core::units::Nanos;

use crate::{BLOCK, DevIo, Device, IoKind};

fn default_name() -> String {
    "flash".to_string()
}

/// A flash or RAM device's description (the `model = "flash"` variant of
/// [`crate::DeviceSpec`]).
///
/// Rates are in decimal MB/s (10^6 bytes per second) and capacities in decimal GB (10^9 bytes),
/// as datasheets give them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashSpec {
    /// Name reported by [`Device::name`] (default `"flash"`).
    #[serde(default = "default_name")]
    pub name: String,
    /// Capacity in decimal GB (10^9 bytes), used when the model is built with capacity 0.
    pub capacity_gb: f64,
    /// Parallel units (IOs in service at once).
    pub channels: u32,
    /// Fixed part of a read's service time (µs).
    pub read_latency_us: f64,
    /// Fixed part of a write's service time (µs).
    pub write_latency_us: f64,
    /// Transfer rate one IO gets on its unit (MB/s).
    pub channel_mb_s: f64,
    /// Device-wide read bandwidth (MB/s).
    pub read_mb_s: f64,
    /// Device-wide write bandwidth (MB/s).
    pub write_mb_s: f64,
    /// Device-wide read IOPS.
    pub read_iops: f64,
    /// Device-wide write IOPS.
    pub write_iops: f64,
    /// Time a flush takes once earlier writes are done (µs; default 0).
    #[serde(default)]
    pub flush_latency_us: f64,
    /// Time a trim takes (µs; default 0).
    #[serde(default)]
    pub trim_latency_us: f64,
}

impl FlashSpec {
    /// The model's QD1 latency of a 4 KiB read (µs): `read_latency_us + 4096 / channel_mb_s`.
    pub fn read_4k_latency_us(&self) -> f64 {
        self.read_latency_us + 4096.0 / self.channel_mb_s
    }

    /// The model's QD1 latency of a 4 KiB write (µs): `write_latency_us + 4096 / channel_mb_s`.
    pub fn write_4k_latency_us(&self) -> f64 {
        self.write_latency_us + 4096.0 / self.channel_mb_s
    }
}

/// A flash or RAM device model; see the [module documentation](self) for the model.
pub struct Flash {
    spec: FlashSpec,
    capacity: u64,
    read_lat_ns: u64,
    write_lat_ns: u64,
    flush_ns: u64,
    trim_ns: u64,
    /// Nanoseconds per byte on a unit, and pipe cost per byte and per IO, by direction.
    chan_ns_per_byte: f64,
    read_ns_per_byte: f64,
    write_ns_per_byte: f64,
    read_ns_per_io: f64,
    write_ns_per_io: f64,
    /// Units by the time they become free (ties: lowest index first).
    units: BinaryHeap<Reverse<(Nanos, u32)>>,
    /// When the device-wide pipe is free, in fractional nanoseconds (no rounding drift).
    pipe_free: f64,
    /// When the last write submitted so far completes.
    last_write_done: Nanos,
    /// Outstanding IOs: (completion, seq, token).
    pending: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
}

fn ns(x: f64) -> u64 {
    if x <= 0.0 { 0 } else { x.round() as u64 }
}

impl Flash {
    /// A device described by `spec`, of `capacity_blocks` 512-byte blocks (0: the spec's
    /// capacity).
    pub fn new(spec: FlashSpec, capacity_blocks: u64) -> Flash {
        let capacity = if capacity_blocks == 0 {
            ((spec.capacity_gb * 1e9) / BLOCK as f64) as u64
        } else {
            capacity_blocks
        }
        .max(1);
        let per_byte = |mb_s: f64| 1e3 / mb_s.max(1e-6);
        let per_io = |iops: f64| 1e9 / iops.max(1e-6);
        let units = (0..spec.channels.max(1))
            .map(|i| Reverse((Nanos(0), i)))
            .collect();
        Flash {
            capacity,
            read_lat_ns: ns(spec.read_latency_us * 1e3),
            write_lat_ns: ns(spec.write_latency_us * 1e3),
            flush_ns: ns(spec.flush_latency_us * 1e3),
            trim_ns: ns(spec.trim_latency_us * 1e3),
            chan_ns_per_byte: per_byte(spec.channel_mb_s),
            read_ns_per_byte: per_byte(spec.read_mb_s),
            write_ns_per_byte: per_byte(spec.write_mb_s),
            read_ns_per_io: per_io(spec.read_iops),
            write_ns_per_io: per_io(spec.write_iops),
            spec,
            units,
            pipe_free: 0.0,
            last_write_done: Nanos(0),
            pending: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// The spec this model was built from.
    pub fn spec(&self) -> &FlashSpec {
        &self.spec
    }

    /// Completion time of a read or write of `bytes` submitted at `now`.
    fn data_io(&mut self, now: Nanos, bytes: u64, write: bool) -> Nanos {
        let (lat, per_byte, per_io) = if write {
            (
                self.write_lat_ns,
                self.write_ns_per_byte,
                self.write_ns_per_io,
            )
        } else {
            (self.read_lat_ns, self.read_ns_per_byte, self.read_ns_per_io)
        };
        let Reverse((free, unit)) = self.units.pop().expect("at least one unit");
        let start_f = (now.max(free).0 as f64).max(self.pipe_free);
        let start = Nanos(start_f.ceil() as u64);
        self.pipe_free = start_f + per_io.max(bytes as f64 * per_byte);
        let done = Nanos(start.0 + lat + ns(bytes as f64 * self.chan_ns_per_byte));
        self.units.push(Reverse((done, unit)));
        done
    }
}

impl Device for Flash {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn capacity_blocks(&self) -> u64 {
        self.capacity
    }

    fn submit(&mut self, now: Nanos, io: DevIo) {
        self.seq += 1;
        let bytes = io.blocks as u64 * BLOCK;
        let done = match io.kind {
            IoKind::Read => self.data_io(now, bytes, false),
            IoKind::Write { .. } => {
                let done = self.data_io(now, bytes, true);
                self.last_write_done = self.last_write_done.max(done);
                done
            }
            IoKind::Flush => Nanos(now.max(self.last_write_done).0 + self.flush_ns),
            IoKind::Trim => Nanos(now.0 + self.trim_ns),
        };
        self.pending.push(Reverse((done, self.seq, io.token)));
    }

    fn next_completion(&self) -> Option<Nanos> {
        self.pending.peek().map(|Reverse((t, _, _))| *t)
    }

    fn complete_until(&mut self, now: Nanos, done: &mut Vec<u64>) {
        while let Some(&Reverse((t, _, tok))) = self.pending.peek() {
            if t > now {
                break;
            }
            self.pending.pop();
            done.push(tok);
        }
    }

    fn outstanding(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> FlashSpec {
        FlashSpec {
            name: "t".into(),
            capacity_gb: 100.0,
            channels: 2,
            read_latency_us: 50.0,
            write_latency_us: 20.0,
            channel_mb_s: 1000.0,
            read_mb_s: 2000.0,
            write_mb_s: 1000.0,
            read_iops: 100_000.0,
            write_iops: 50_000.0,
            flush_latency_us: 5.0,
            trim_latency_us: 1.0,
        }
    }

    fn io(token: u64, kind: IoKind, blocks: u32) -> DevIo {
        DevIo {
            token,
            kind,
            lba: 0,
            blocks,
        }
    }

    #[test]
    fn latency_and_units() {
        let mut d = Flash::new(spec(), 0);
        // 4 KiB: 50 us + 4.096 us.
        d.submit(Nanos(0), io(1, IoKind::Read, 8));
        assert_eq!(d.next_completion(), Some(Nanos(54_096)));
        // Second unit, paced 10 us (100K IOPS) behind the first.
        d.submit(Nanos(0), io(2, IoKind::Read, 8));
        // Third waits for a unit.
        d.submit(Nanos(0), io(3, IoKind::Read, 8));
        let mut done = Vec::new();
        d.complete_until(Nanos(1_000_000), &mut done);
        assert_eq!(done, vec![1, 2, 3]);
        assert_eq!(d.outstanding(), 0);
    }

    #[test]
    fn pacing_by_iops_and_bandwidth() {
        let mut s = spec();
        s.channels = 1000;
        let mut d = Flash::new(s, 0);
        for k in 0..100 {
            d.submit(Nanos(0), io(k, IoKind::Read, 8));
        }
        // 100 reads at 100K IOPS: the last starts at 990 us.
        let mut done = Vec::new();
        d.complete_until(Nanos(990_000 + 54_095), &mut done);
        assert_eq!(done.len(), 99);
        d.complete_until(Nanos(990_000 + 54_096), &mut done);
        assert_eq!(done.len(), 100);
        // 1.024 MB writes at 1000 MB/s: one per 1.024 ms.
        let t0 = Nanos(10_000_000);
        for k in 0..10 {
            d.submit(t0, io(k, IoKind::Write { fua: false }, 2000));
        }
        let last = t0.0 + 9 * 1_024_000 + 20_000 + 1_024_000;
        done.clear();
        d.complete_until(Nanos(last - 1), &mut done);
        assert_eq!(done.len(), 9);
        d.complete_until(Nanos(last), &mut done);
        assert_eq!(done.len(), 10);
    }

    #[test]
    fn flush_and_trim() {
        let mut d = Flash::new(spec(), 0);
        d.submit(Nanos(0), io(1, IoKind::Write { fua: false }, 8));
        d.submit(Nanos(0), io(2, IoKind::Flush, 0));
        d.submit(Nanos(0), io(3, IoKind::Trim, 8));
        let mut done = Vec::new();
        d.complete_until(Nanos(1_000), &mut done);
        assert_eq!(done, vec![3]);
        done.clear();
        d.complete_until(Nanos(24_096), &mut done);
        assert_eq!(done, vec![1]);
        d.complete_until(Nanos(29_096), &mut done);
        assert_eq!(done, vec![1, 2]);
        // With no write outstanding a flush takes its own latency.
        d.submit(Nanos(100_000), io(4, IoKind::Flush, 0));
        assert_eq!(d.next_completion(), Some(Nanos(105_000)));
    }
}
