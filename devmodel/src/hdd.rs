//! A hard disk with one actuator: seek, rotation, zoned transfer rate and NCQ reordering.
//!
//! # Model
//!
//! One IO is on the media at a time (one actuator). Its service time is
//!
//! ```text
//! service = command_overhead + seek + rotational_wait + transfer
//! ```
//!
//! * **Geometry.** The disk has `C = capacity / (heads * blocks_per_track(middle))` cylinders and
//!   LBAs are mapped linearly onto them: `cyl(lba) = lba * C / capacity`.
//! * **Seek** over `d` cylinders (a common square-root model: the arm accelerates then
//!   decelerates, so short seeks grow like the square root of the distance; the constant term is
//!   the settle time):
//!
//!   ```text
//!   seek(0) = 0
//!   seek(d) = track_to_track + (full_stroke - track_to_track) * sqrt(d / (C - 1))   (+ write_settle for writes)
//!   ```
//!
//!   Over uniformly random cylinder pairs the mean of `sqrt(d / (C - 1))` is 8/15, so the
//!   datasheets' "average seek" (their weighted average over all seek lengths is exactly that
//!   mean) is `track_to_track + 8/15 * (full_stroke - track_to_track)`; presets pick
//!   `full_stroke` from the datasheet average with this relation ([`HddSpec::average_seek_ms`]).
//! * **Transfer rate** is zoned: linear in the LBA from `outer_mb_s` at LBA 0 to `inner_mb_s` at
//!   the last LBA. A track holds `blocks_per_track(lba) = rate(lba) * revolution / 512` blocks.
//! * **Rotation** is tracked over simulated time: the platter's angle at time `t` is
//!   `(t mod rev) / rev`, and block `lba` sits at angle `(lba mod bpt) / bpt`. After the seek the
//!   head waits until the block's angle comes under it (0 to one revolution; half on average).
//!   Transferring `n` blocks takes `n / bpt` revolutions, so the angle stays consistent with the
//!   next block's position.
//! * **Sequential continuation.** An IO that starts at the block where the previous media IO
//!   ended needs neither seek nor rotational wait (the drive's read-ahead and write coalescing
//!   keep streaming; this holds even if the stream paused).
//! * **NCQ.** IOs queue in arrival order. When the head becomes free, among the `ncq_depth`
//!   oldest queued IOs the one with the shortest positioning time (seek + rotational wait, from
//!   the head's current cylinder and the platter's angle) is served next, ties to the oldest.
//!   Aging guard: if the oldest queued IO has waited `max_wait_ms` or more, it is served next
//!   regardless, so no IO waits much longer than that.
//! * **Writes** go to the media (no volatile write cache, `write_cache = false`, which is how
//!   Ceph OSD HDDs are usually run). With `write_cache = true`, a non-FUA write completes once
//!   transferred over the interface (`interface_mb_s`, plus command overhead) into a cache of
//!   `write_cache_mb`, and a background destage of it joins the media queue like any other IO.
//!   When the cache is full, writes go to the media as if the cache were off. Reads are not
//!   served from the write cache, and a destage may begin as soon as its write is accepted.
//! * **Flush** completes when every write *completed* before it was issued is on the media (the
//!   SCSI/NVMe rule): at once without a write cache, after the destages of acknowledged writes
//!   with one. Writes still in flight when the flush arrives are not covered.
//! * **Trim** completes after the command overhead and does not use the actuator.
//!
//! A capacity other than the spec's gives a drive of the same mechanics whose full stroke spans
//! that capacity (the zone rates and the rotation are unchanged).
//!
//! The model is deterministic: it has no randomness and only integer time.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};
use tiercache_core::units::Nanos;

use crate::{BLOCK, DevIo, Device, IoKind};

fn default_name() -> String {
    "hdd".to_string()
}
fn default_ncq_depth() -> u32 {
    32
}
fn default_max_wait_ms() -> f64 {
    1000.0
}
fn default_interface_mb_s() -> f64 {
    600.0
}
fn default_write_cache_mb() -> f64 {
    16.0
}

/// A hard disk's description (the `model = "hdd"` variant of [`crate::DeviceSpec`]).
///
/// Rates are in decimal MB/s (10^6 bytes per second) and capacities in decimal GB (10^9 bytes),
/// as datasheets give them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HddSpec {
    /// Name reported by [`Device::name`] (default `"hdd"`).
    #[serde(default = "default_name")]
    pub name: String,
    /// Capacity in decimal GB (10^9 bytes), used when the model is built with capacity 0.
    pub capacity_gb: f64,
    /// Spindle speed, revolutions per minute.
    pub rpm: f64,
    /// Recording surfaces (heads); only sets the number of cylinders.
    pub heads: u32,
    /// Seek over one cylinder, settle included (ms).
    pub track_to_track_ms: f64,
    /// Seek over the whole span (ms).
    pub full_stroke_ms: f64,
    /// Extra settle time of a write after a non-zero seek (ms; default 0).
    #[serde(default)]
    pub write_settle_ms: f64,
    /// Media transfer rate at LBA 0, the outer zone (MB/s).
    pub outer_mb_s: f64,
    /// Media transfer rate at the last LBA, the inner zone (MB/s).
    pub inner_mb_s: f64,
    /// IOs the drive reorders among: the oldest `ncq_depth` queued IOs (default 32; 1 is FIFO).
    #[serde(default = "default_ncq_depth")]
    pub ncq_depth: u32,
    /// Aging guard: an IO that has waited this long is served next (ms; default 1000).
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: f64,
    /// Fixed firmware time per command, before the seek (µs; default 0).
    #[serde(default)]
    pub command_overhead_us: f64,
    /// Volatile write cache enabled (default false).
    #[serde(default)]
    pub write_cache: bool,
    /// Host interface rate, used by cached writes (MB/s; default 600, SATA 6 Gb/s).
    #[serde(default = "default_interface_mb_s")]
    pub interface_mb_s: f64,
    /// Write cache size (decimal MB; default 16), used when `write_cache` is on.
    #[serde(default = "default_write_cache_mb")]
    pub write_cache_mb: f64,
}

impl HddSpec {
    /// The model's average seek over uniformly random cylinder pairs, the datasheets' "average
    /// seek" (ms): `track_to_track + 8/15 * (full_stroke - track_to_track)`.
    pub fn average_seek_ms(&self) -> f64 {
        self.track_to_track_ms + (self.full_stroke_ms - self.track_to_track_ms) * 8.0 / 15.0
    }

    /// One revolution (ms).
    pub fn revolution_ms(&self) -> f64 {
        60_000.0 / self.rpm
    }
}

/// A queued or in-service media IO.
#[derive(Copy, Clone, Debug)]
struct Op {
    /// The submitter's token; `None` for a background destage.
    token: Option<u64>,
    /// Submission sequence number (a destage carries its write's).
    seq: u64,
    lba: u64,
    blocks: u32,
    write: bool,
    arrival: Nanos,
}

/// The IO on the media and when it leaves it.
#[derive(Copy, Clone, Debug)]
struct InService {
    op: Op,
    done: Nanos,
}

/// A hard disk model; see the [module documentation](self) for the model.
pub struct Hdd {
    spec: HddSpec,
    capacity: u64,
    rev_ns: u64,
    cylinders: u64,
    t2t_ns: f64,
    stroke_ns: f64,
    settle_ns: f64,
    overhead_ns: u64,
    max_wait_ns: u64,
    ncq: usize,
    iface_ns_per_block: f64,
    cache_limit_blocks: u64,
    /// The cylinder under the head once the current IO (if any) is done.
    head_cyl: u64,
    /// The block after the last media IO's last block.
    next_lba: Option<u64>,
    busy: Option<InService>,
    /// Queued IOs in arrival (= `seq`) order. The choice looks at the `ncq` oldest only, and
    /// takes one out from among them: both cost at most `ncq`, whatever the queue's length.
    queue: VecDeque<Op>,
    /// Sequence numbers of the destages (acknowledged writes not yet on the media) queued or
    /// in service: the oldest is a flush's question, answered without a scan of the queue.
    destages: BTreeSet<u64>,
    /// Completions with known times not yet reported: (time, seq, token).
    ready: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    /// Flushes waiting for earlier writes: (token, seq).
    flushes: Vec<(u64, u64)>,
    cached_blocks: u64,
    iface_free: Nanos,
    seq: u64,
    outstanding: usize,
}

fn ns(x: f64) -> u64 {
    if x <= 0.0 { 0 } else { x.round() as u64 }
}

impl Hdd {
    /// A disk described by `spec`, of `capacity_blocks` 512-byte blocks (0: the spec's capacity).
    pub fn new(spec: HddSpec, capacity_blocks: u64) -> Hdd {
        let capacity = if capacity_blocks == 0 {
            ((spec.capacity_gb * 1e9) / BLOCK as f64) as u64
        } else {
            capacity_blocks
        }
        .max(1);
        let rev_ns = ns(60e9 / spec.rpm.max(1.0)).max(1);
        let mid_rate = (spec.outer_mb_s + spec.inner_mb_s) / 2.0;
        let mid_bpt = (mid_rate * 1e6 * rev_ns as f64 / 1e9 / BLOCK as f64).max(1.0);
        let cylinders = ((capacity as f64 / (spec.heads.max(1) as f64 * mid_bpt)) as u64).max(1);
        Hdd {
            capacity,
            rev_ns,
            cylinders,
            t2t_ns: spec.track_to_track_ms * 1e6,
            stroke_ns: (spec.full_stroke_ms - spec.track_to_track_ms).max(0.0) * 1e6,
            settle_ns: spec.write_settle_ms * 1e6,
            overhead_ns: ns(spec.command_overhead_us * 1e3),
            max_wait_ns: ns(spec.max_wait_ms * 1e6),
            ncq: spec.ncq_depth.max(1) as usize,
            iface_ns_per_block: BLOCK as f64 * 1e3 / spec.interface_mb_s.max(1e-3),
            cache_limit_blocks: if spec.write_cache {
                (spec.write_cache_mb * 1e6 / BLOCK as f64) as u64
            } else {
                0
            },
            spec,
            head_cyl: 0,
            next_lba: None,
            busy: None,
            queue: VecDeque::new(),
            destages: BTreeSet::new(),
            ready: BinaryHeap::new(),
            flushes: Vec::new(),
            cached_blocks: 0,
            iface_free: Nanos(0),
            seq: 0,
            outstanding: 0,
        }
    }

    /// The spec this model was built from.
    pub fn spec(&self) -> &HddSpec {
        &self.spec
    }

    /// Cylinders of the modelled geometry.
    pub fn cylinders(&self) -> u64 {
        self.cylinders
    }

    fn clamp(&self, lba: u64) -> u64 {
        lba.min(self.capacity - 1)
    }

    fn cyl(&self, lba: u64) -> u64 {
        (self.clamp(lba) as u128 * self.cylinders as u128 / self.capacity as u128) as u64
    }

    /// Media rate at `lba` in bytes per second.
    fn rate(&self, lba: u64) -> f64 {
        let frac = self.clamp(lba) as f64 / self.capacity as f64;
        (self.spec.outer_mb_s - (self.spec.outer_mb_s - self.spec.inner_mb_s) * frac).max(1e-3)
            * 1e6
    }

    /// Blocks per track at `lba`.
    fn bpt(&self, lba: u64) -> u64 {
        ((self.rate(lba) * self.rev_ns as f64 / 1e9 / BLOCK as f64).round() as u64).max(1)
    }

    /// Seek time over `d` cylinders (ns).
    pub fn seek_ns(&self, d: u64, write: bool) -> u64 {
        if d == 0 {
            return 0;
        }
        let max_d = self.cylinders.saturating_sub(1).max(1) as f64;
        let frac = (d as f64 / max_d).min(1.0);
        let settle = if write { self.settle_ns } else { 0.0 };
        ns(self.t2t_ns + self.stroke_ns * frac.sqrt() + settle)
    }

    /// Media transfer time of `blocks` blocks starting at `lba` (ns).
    fn transfer_ns(&self, lba: u64, blocks: u32) -> u64 {
        (blocks as u128 * self.rev_ns as u128 / self.bpt(lba) as u128) as u64
    }

    /// Seek plus rotational wait for `op` if the head, free at `t`, starts it after the command
    /// overhead.
    fn positioning_ns(&self, t: Nanos, op: &Op) -> u64 {
        if self.next_lba == Some(op.lba) {
            return 0;
        }
        let seek = self.seek_ns(self.cyl(op.lba).abs_diff(self.head_cyl), op.write);
        let arrive = t.0 + self.overhead_ns + seek;
        let bpt = self.bpt(op.lba);
        let sector = (self.clamp(op.lba) % bpt) as u128 * self.rev_ns as u128 / bpt as u128;
        let now_angle = (arrive % self.rev_ns) as u128;
        let rev = self.rev_ns as u128;
        let wait = ((sector + rev - now_angle) % rev) as u64;
        seek + wait
    }

    /// Index in the queue of the IO to serve when the head is free at `t`.
    fn pick(&self, t: Nanos) -> usize {
        let front = self.queue.front().expect("pick on a non-empty queue");
        if t.since(front.arrival).0 >= self.max_wait_ns {
            return 0;
        }
        let n = self.ncq.min(self.queue.len());
        let mut best = (u64::MAX, 0);
        for (i, op) in self.queue.iter().take(n).enumerate() {
            let p = self.positioning_ns(t, op);
            if p < best.0 {
                best = (p, i);
                if p == 0 {
                    break;
                }
            }
        }
        best.1
    }

    /// Puts the chosen queued IO on the media at `t` (the head is free).
    fn start_next(&mut self, t: Nanos) {
        debug_assert!(self.busy.is_none());
        if self.queue.is_empty() {
            return;
        }
        let i = self.pick(t);
        let op = self.queue.remove(i).expect("picked index exists");
        let service =
            self.overhead_ns + self.positioning_ns(t, &op) + self.transfer_ns(op.lba, op.blocks);
        self.busy = Some(InService {
            op,
            done: Nanos(t.0 + service),
        });
    }

    /// Takes the in-service IO off the media at its completion time.
    fn finish(&mut self, b: InService) {
        let end = b.op.lba.saturating_add(b.op.blocks as u64);
        self.head_cyl = self.cyl(end);
        self.next_lba = Some(end);
        match b.op.token {
            Some(tok) => self.ready.push(Reverse((b.done, b.op.seq, tok))),
            None => {
                self.cached_blocks = self.cached_blocks.saturating_sub(b.op.blocks as u64);
                self.destages.remove(&b.op.seq);
            }
        }
        if b.op.write && !self.flushes.is_empty() {
            let oldest = self.oldest_media_write();
            let ready = &mut self.ready;
            self.flushes.retain(|&(tok, seq)| {
                if oldest.is_none_or(|w| w > seq) {
                    ready.push(Reverse((b.done, seq, tok)));
                    false
                } else {
                    true
                }
            });
        }
    }

    /// The sequence number of the oldest *acknowledged* write not yet on the media (a write
    /// cache destage). Writes still in flight to the host are not a flush's business: a flush
    /// covers what completed before it was issued (SCSI SYNCHRONIZE CACHE, NVMe Flush).
    fn oldest_media_write(&self) -> Option<u64> {
        self.destages.first().copied()
    }

    /// Runs the actuator up to `now`.
    fn advance(&mut self, now: Nanos) {
        while let Some(b) = self.busy {
            if b.done > now {
                break;
            }
            self.busy = None;
            self.finish(b);
            self.start_next(b.done);
        }
    }

    fn enqueue(&mut self, op: Op, now: Nanos) {
        self.queue.push_back(op);
        if self.busy.is_none() {
            self.start_next(now);
        }
    }
}

impl Device for Hdd {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn capacity_blocks(&self) -> u64 {
        self.capacity
    }

    fn submit(&mut self, now: Nanos, io: DevIo) {
        self.advance(now);
        self.seq += 1;
        self.outstanding += 1;
        let seq = self.seq;
        let op = |write| Op {
            token: Some(io.token),
            seq,
            lba: io.lba,
            blocks: io.blocks,
            write,
            arrival: now,
        };
        match io.kind {
            IoKind::Read => self.enqueue(op(false), now),
            IoKind::Write { fua } => {
                let blocks = io.blocks as u64;
                if self.spec.write_cache
                    && !fua
                    && self.cached_blocks + blocks <= self.cache_limit_blocks
                {
                    let start = now.max(self.iface_free);
                    let xfer = ns(blocks as f64 * self.iface_ns_per_block);
                    self.iface_free = Nanos(start.0 + xfer);
                    let done = Nanos(start.0 + xfer + self.overhead_ns);
                    self.ready.push(Reverse((done, seq, io.token)));
                    self.cached_blocks += blocks;
                    self.destages.insert(seq);
                    self.enqueue(
                        Op {
                            token: None,
                            ..op(true)
                        },
                        now,
                    );
                } else {
                    self.enqueue(op(true), now);
                }
            }
            IoKind::Flush => {
                if self.oldest_media_write().is_some_and(|w| w < seq) {
                    self.flushes.push((io.token, seq));
                } else {
                    self.ready.push(Reverse((now, seq, io.token)));
                }
            }
            IoKind::Trim => {
                self.ready
                    .push(Reverse((Nanos(now.0 + self.overhead_ns), seq, io.token)))
            }
        }
    }

    /// The earliest completion, or the end of the IO on the media when that comes first (it
    /// may be a background destage whose end reports nothing). `None` when nothing the caller
    /// submitted is outstanding; background destaging then proceeds on the model's own clock.
    fn next_completion(&self) -> Option<Nanos> {
        if self.outstanding == 0 {
            return None;
        }
        let r = self.ready.peek().map(|Reverse((t, _, _))| *t);
        let b = self.busy.map(|b| b.done);
        match (r, b) {
            (Some(r), Some(b)) => Some(r.min(b)),
            (r, b) => r.or(b),
        }
    }

    fn complete_until(&mut self, now: Nanos, done: &mut Vec<u64>) {
        self.advance(now);
        while let Some(&Reverse((t, _, tok))) = self.ready.peek() {
            if t > now {
                break;
            }
            self.ready.pop();
            self.outstanding -= 1;
            done.push(tok);
        }
    }

    fn outstanding(&self) -> usize {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> HddSpec {
        HddSpec {
            name: "t".into(),
            capacity_gb: 1000.0,
            rpm: 10_000.0,
            heads: 4,
            track_to_track_ms: 0.2,
            full_stroke_ms: 6.4,
            write_settle_ms: 0.0,
            outer_mb_s: 240.0,
            inner_mb_s: 130.0,
            ncq_depth: 32,
            max_wait_ms: 1000.0,
            command_overhead_us: 0.0,
            write_cache: false,
            interface_mb_s: 1200.0,
            write_cache_mb: 16.0,
        }
    }

    fn io(token: u64, kind: IoKind, lba: u64, blocks: u32) -> DevIo {
        DevIo {
            token,
            kind,
            lba,
            blocks,
        }
    }

    fn drain(d: &mut Hdd) -> Vec<(u64, Nanos)> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = d.next_completion() {
            buf.clear();
            d.complete_until(t, &mut buf);
            out.extend(buf.iter().map(|&k| (k, t)));
        }
        out
    }

    #[test]
    fn seek_curve() {
        let d = Hdd::new(spec(), 0);
        assert_eq!(d.seek_ns(0, false), 0);
        assert_eq!(
            d.seek_ns(1, false),
            200_000 + ns(6.2e6 * (1.0 / (d.cylinders() - 1) as f64).sqrt())
        );
        assert_eq!(d.seek_ns(d.cylinders() - 1, false), 6_400_000);
        // The mean over random pairs matches the closed form (8/15).
        let n = 400u64;
        let c = d.cylinders();
        let mut sum = 0.0;
        for i in 0..n {
            for j in 0..n {
                sum += d.seek_ns((i * c / n).abs_diff(j * c / n), false) as f64;
            }
        }
        let mean_ms = sum / (n * n) as f64 / 1e6;
        assert!(
            (mean_ms - spec().average_seek_ms()).abs() < 0.05,
            "{mean_ms}"
        );
    }

    #[test]
    fn one_io_costs_seek_rotation_transfer() {
        let mut d = Hdd::new(spec(), 0);
        d.submit(Nanos(0), io(1, IoKind::Read, 0, 8));
        // At t=0 the head is on cylinder 0 at angle 0, over block 0: only the transfer.
        let t = d.next_completion().unwrap();
        assert_eq!(t.0, d.transfer_ns(0, 8));
        // 8 blocks at 240 MB/s: 4096 / 240e6 s = 17.07 us.
        assert!((t.0 as i64 - 17_067).abs() < 50, "{t:?}");
        let mut done = Vec::new();
        d.complete_until(t, &mut done);
        assert_eq!(done, vec![1]);
        assert_eq!(d.outstanding(), 0);
        assert_eq!(d.next_completion(), None);
    }

    #[test]
    fn sequential_continuation_streams() {
        let mut d = Hdd::new(spec(), 0);
        let lba = d.capacity_blocks() / 2;
        d.submit(Nanos(0), io(1, IoKind::Read, lba, 1024));
        let t1 = d.next_completion().unwrap();
        let mut done = Vec::new();
        d.complete_until(t1, &mut done);
        // Even after a pause, the next block streams at once.
        let t = Nanos(t1.0 + 5_000_000);
        d.submit(t, io(2, IoKind::Read, lba + 1024, 1024));
        let t2 = d.next_completion().unwrap();
        assert_eq!(t2.0 - t.0, d.transfer_ns(lba + 1024, 1024));
    }

    #[test]
    fn rotation_wait_is_below_one_revolution() {
        let mut d = Hdd::new(spec(), 0);
        let mut now = Nanos(0);
        let mut x = 12345u64;
        let mut done = Vec::new();
        for k in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let lba = (x >> 20) % (d.capacity_blocks() - 8);
            d.submit(now, io(k, IoKind::Read, lba, 8));
            let t = d.next_completion().unwrap();
            let max = d.seek_ns(d.cylinders(), false) + d.rev_ns + d.transfer_ns(lba, 8);
            assert!(t.0 - now.0 <= max);
            d.complete_until(t, &mut done);
            now = t;
        }
        assert_eq!(done.len(), 500);
    }

    #[test]
    fn ncq_prefers_the_nearest() {
        let mut d = Hdd::new(spec(), 0);
        let cap = d.capacity_blocks();
        // Occupy the head, then queue a far IO before a near one.
        d.submit(Nanos(0), io(1, IoKind::Read, 0, 8));
        d.submit(Nanos(0), io(2, IoKind::Read, cap - 8, 8));
        d.submit(Nanos(0), io(3, IoKind::Read, 8, 8));
        let order: Vec<u64> = drain(&mut d).into_iter().map(|x| x.0).collect();
        assert_eq!(order, vec![1, 3, 2]);
    }

    #[test]
    fn aging_guard_serves_the_starved() {
        let mut s = spec();
        s.max_wait_ms = 50.0;
        let mut d = Hdd::new(s, 0);
        let cap = d.capacity_blocks();
        let mut done = Vec::new();
        // A far IO, then a sequential stream (1 MiB reads, ~4 ms each) that NCQ would always
        // prefer: it needs no positioning at all.
        d.submit(Nanos(0), io(0, IoKind::Read, 0, 2048));
        d.submit(Nanos(0), io(999, IoKind::Read, cap - 8, 8));
        let mut lba = 2048;
        for k in 1..8 {
            d.submit(Nanos(0), io(k, IoKind::Read, lba, 2048));
            lba += 2048;
        }
        let mut k = 8;
        let mut served_at = None;
        while let Some(t) = d.next_completion() {
            done.clear();
            d.complete_until(t, &mut done);
            for &tok in &done {
                if tok == 999 {
                    served_at = Some(t);
                }
                if k < 200 {
                    d.submit(t, io(k, IoKind::Read, lba, 2048));
                    lba += 2048;
                    k += 1;
                }
            }
        }
        // Served right after it has waited 50 ms: one 1 MiB read (~4.4 ms) plus its own seek.
        let t = served_at.expect("the far IO completes");
        assert!(t.0 >= 50_000_000 && t.0 < 70_000_000, "{t:?}");
    }

    #[test]
    fn flush_covers_completed_writes_only() {
        let mut d = Hdd::new(spec(), 0);
        let cap = d.capacity_blocks();
        d.submit(Nanos(0), io(1, IoKind::Write { fua: false }, cap / 2, 8));
        d.submit(Nanos(0), io(2, IoKind::Write { fua: false }, cap / 3, 8));
        d.submit(Nanos(0), io(3, IoKind::Flush, 0, 0));
        d.submit(Nanos(0), io(4, IoKind::Trim, 100, 8));
        let got = drain(&mut d);
        let at = |k| got.iter().find(|x| x.0 == k).unwrap().1;
        // No write cache: completed writes are on the media, and writes still in flight are
        // not covered by a flush issued before they complete.
        assert_eq!(at(3), Nanos(0));
        assert!(at(1) > Nanos(0) && at(2) > Nanos(0));
        assert_eq!(at(4), Nanos(0));
        // With nothing outstanding a flush is instant.
        d.submit(Nanos(1_000_000_000), io(5, IoKind::Flush, 0, 0));
        assert_eq!(d.next_completion(), Some(Nanos(1_000_000_000)));
    }

    #[test]
    fn write_cache_acks_early_and_flush_waits_for_destage() {
        let mut s = spec();
        s.write_cache = true;
        s.command_overhead_us = 10.0;
        let mut d = Hdd::new(s, 0);
        let cap = d.capacity_blocks();
        d.submit(Nanos(0), io(1, IoKind::Write { fua: false }, cap / 2, 8));
        d.submit(Nanos(0), io(2, IoKind::Write { fua: false }, cap / 4, 8));
        d.submit(Nanos(0), io(3, IoKind::Flush, 0, 0));
        d.submit(Nanos(0), io(4, IoKind::Write { fua: true }, cap / 8, 8));
        let got = drain(&mut d);
        let at = |k| got.iter().find(|x| x.0 == k).unwrap().1;
        // 4 KiB at 1200 MB/s is 3.4 us, plus 10 us of overhead.
        assert!(at(1).0 < 20_000 && at(2).0 < 30_000, "{got:?}");
        // The flush waits for both destages, each at least a seek away.
        assert!(at(3).0 > 2 * 200_000, "{got:?}");
        assert!(at(4).0 > 200_000, "{got:?}");
        assert_eq!(d.outstanding(), 0);
        assert_eq!(d.cached_blocks, 0);
    }

    #[test]
    fn the_oldest_destage_is_tracked_without_a_scan() {
        // Random writes (some FUA), reads and flushes into a small write cache: at every step
        // the tracked oldest destage is the one a scan of the queue and the media finds.
        let mut s = spec();
        s.write_cache = true;
        s.write_cache_mb = 0.1;
        let mut d = Hdd::new(s, 0);
        let cap = d.capacity_blocks();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut done = Vec::new();
        for i in 0..3_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let kind = match x % 8 {
                0 => IoKind::Flush,
                1 => IoKind::Write { fua: true },
                2 | 3 => IoKind::Read,
                _ => IoKind::Write { fua: false },
            };
            let now = Nanos(i * 150_000);
            d.complete_until(now, &mut done);
            d.submit(now, io(i, kind, (x >> 8) % (cap - 8), 8));
            let scan = d
                .queue
                .iter()
                .chain(d.busy.as_ref().map(|b| &b.op))
                .filter(|o| o.write && o.token.is_none())
                .map(|o| o.seq)
                .min();
            assert_eq!(d.oldest_media_write(), scan, "step {i}");
        }
        drain(&mut d);
        assert_eq!(d.outstanding(), 0);
    }

    #[test]
    fn capacity_override() {
        let d = Hdd::new(spec(), 1 << 30);
        assert_eq!(d.capacity_blocks(), 1 << 30);
        let d = Hdd::new(spec(), 0);
        assert_eq!(d.capacity_blocks(), (1000e9 / 512.0) as u64);
    }
}
