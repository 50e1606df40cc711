//! The discrete-event engine: clients → targets (a cached volume, or a bare device) → device
//! models, on one simulated clock, with the real cache core making every caching decision.
//!
//! One step: find the earliest of (a device completion, a timer, a cache deadline, the next
//! sample), move the clock there, deliver it, and execute whatever the cache answers. Nothing
//! else happens between steps, so a run is a pure function of its inputs and seed.
//!
//! A *target* is what a client request is routed to: in the Ceph scenario, an OSD. It has a
//! server model (threads × CPU time per op, plus a fixed latency for the network and the
//! software stack), a core device region, and optionally a [`Cache`] with a cache device region.
//! Several targets may share a device (two OSD cache partitions on one NVMe drive).
//!
//! Faults ([`Sim::add_fault`]): a device can fail every IO that completes in a window of
//! simulated time (with an error kind), or be very slow (every IO submitted in the window
//! completes a fixed time later). Each sample then records the caches' health
//! ([`RunResult::health`], docs/SAFETY.md "Faults"). Performance scenarios have no faults.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use tiercache_core::Cache;
use tiercache_core::cache::HealthState;
use tiercache_core::event::{Action, Dev, Event, IoError};
use tiercache_core::units::{CoreId, IoId, Lba, Nanos, ReqId};

use crate::device::{DevIo, Device, IoKind};
use crate::stats::{Histogram, Sample};
use crate::workload::{ClientIo, Generator, TraceEntry};

/// The software between a client and a target's cache (for Ceph: network + OSD).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ServerModel {
    /// Ops processed at once.
    pub threads: u32,
    /// CPU time per op, microseconds (capacity: `threads / cpu_us` ops per µs).
    pub cpu_us: f64,
    /// Fixed latency added to every op (network round trip, queues), microseconds.
    pub latency_us: f64,
}

impl ServerModel {
    /// No server: requests go straight to the cache or device.
    pub const NONE: ServerModel = ServerModel {
        threads: 0,
        cpu_us: 0.0,
        latency_us: 0.0,
    };
}

/// A region of a device.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Device index in [`Sim::devices`].
    pub dev: usize,
    /// First block of the region.
    pub offset: u64,
    /// Blocks.
    pub blocks: u64,
}

/// A target's cache.
pub struct CacheSetup {
    /// The cache core, configured and with its core added as core 0.
    pub cache: Cache,
    /// Where cache lines live.
    pub region: Region,
}

/// A target.
pub struct Target {
    /// Its name (shown in per-target output).
    pub name: String,
    /// The server in front of it.
    pub server: ServerModel,
    /// The core (backing) region.
    pub core: Region,
    /// The cache, if this configuration has one.
    pub cache: Option<CacheSetup>,
    /// Extra device IOs a bare target makes per op (see [`ExtraIo`]); none by default.
    pub extra: Option<ExtraIo>,
    /// Extra IOs owed so far (fractional) and made so far.
    extra_owed: f64,
    extra_made: u64,
    busy_threads: u32,
    waiting: VecDeque<u64>,
}

impl Target {
    /// A target with no cache.
    pub fn bare(name: String, server: ServerModel, core: Region) -> Target {
        Target {
            name,
            server,
            core,
            cache: None,
            extra: None,
            extra_owed: 0.0,
            extra_made: 0,
            busy_threads: 0,
            waiting: VecDeque::new(),
        }
    }
    /// A target with a cache.
    pub fn cached(name: String, server: ServerModel, core: Region, cache: CacheSetup) -> Target {
        Target {
            cache: Some(cache),
            ..Target::bare(name, server, core)
        }
    }
}

/// Device IOs a bare target makes besides each op's own, one after the other once the op's
/// IO is done, at scattered 4 KiB places of `region` (for a BlueStore OSD whose RocksDB and
/// WAL share the data disk: the metadata reads and WAL writes it sends to that disk). Counts
/// are per op and may be fractional (owed ones are carried to the next op); reads make reads
/// and writes writes.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ExtraIo {
    /// Where they go.
    pub region: Region,
    /// Per read op.
    pub per_read: f64,
    /// Per write op.
    pub per_write: f64,
}

/// How client requests map onto targets.
pub trait Router: Send {
    /// Appends the (target, target LBA) pairs the request must reach: one for a read, one per
    /// replica for a write. Every one must complete before the client's request does.
    fn route(&self, io: &ClientIo, out: &mut Vec<(usize, u64)>);
    /// Blocks of the client-visible volume.
    fn volume_blocks(&self) -> u64;
}

/// Routes everything to target 0 at the same LBA.
pub struct Direct {
    /// Volume size.
    pub blocks: u64,
}

impl Router for Direct {
    fn route(&self, io: &ClientIo, out: &mut Vec<(usize, u64)>) {
        out.push((0, io.lba));
    }
    fn volume_blocks(&self) -> u64 {
        self.blocks
    }
}

/// What a device token stands for.
#[derive(Copy, Clone, Debug)]
enum Token {
    /// An IO the cache of `target` issued, on device `dev`.
    Cache { target: u32, io: IoId, dev: u32 },
    /// A sub-request sent straight to a bare target's core on device `dev`, with `extra`
    /// IOs ([`ExtraIo`]) still to make after it.
    Bare { sub: u64, dev: u32, extra: u32 },
}

impl Token {
    fn dev(self) -> usize {
        match self {
            Token::Cache { dev, .. } | Token::Bare { dev, .. } => dev as usize,
        }
    }
}

/// What a device does wrong during a [`DeviceFault`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Every IO completing in the window fails with this error.
    Fail(IoError),
    /// Every IO submitted in the window completes this much later than the model says (a very
    /// slow or stalling device; its own queue is not slowed).
    Slow(Nanos),
}

/// A fault of one device over a window of simulated time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeviceFault {
    /// Device index in [`Sim::devices`].
    pub dev: usize,
    /// Start of the window (simulated time since the simulation began).
    pub from: Nanos,
    /// End of the window (exclusive).
    pub until: Nanos,
    /// What goes wrong.
    pub kind: FaultKind,
}

/// The caches' health at the end of a sample interval.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct HealthSample {
    /// End of the interval, simulated milliseconds since the start of the run.
    pub t_s_ms: u64,
    /// Caches degraded (any problem) at that time.
    pub degraded: u32,
    /// Dirty blocks at risk, all caches.
    pub dirty_at_risk_blocks: u64,
}

/// What faults did over a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Device IOs failed by a [`FaultKind::Fail`] window.
    pub io_errors: u64,
    /// Device IOs delayed by a [`FaultKind::Slow`] window.
    pub ios_delayed: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// Sub-request reaches its target's server queue.
    Arrive(u64),
    /// Server CPU work on a sub-request is done; hand it to the cache or device.
    Dispatch(u64),
    /// A sub-request's answer reaches the client.
    Answer(u64),
    /// A device IO delayed by a slow-device fault is done.
    Late(u64),
    /// Entry `n` of a replayed trace is due.
    Trace(u64),
}

#[derive(Copy, Clone, Debug)]
struct Sub {
    client: u64,
    target: u32,
    lba: u64,
    blocks: u32,
    read: bool,
}

#[derive(Copy, Clone, Debug)]
struct ClientReq {
    job: u32,
    start: Nanos,
    pending: u32,
    read: bool,
}

/// Per-run results.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// Client requests completed in the measured window.
    pub ops: u64,
    /// Reads among them.
    pub reads: u64,
    /// Bytes moved by them.
    pub bytes: u64,
    /// Measured window, simulated seconds.
    pub seconds: f64,
    /// Client latency over the window.
    pub latency: Histogram,
    /// One sample per simulated second (or per `sample_every`).
    pub series: Vec<Sample>,
    /// Events processed (all steps, including warm-up).
    pub events: u64,
    /// Client requests that failed.
    pub errors: u64,
    /// The caches' health at each sample (only when the simulation has faults).
    pub health: Vec<HealthSample>,
    /// What the faults did.
    pub faults: FaultStats,
    /// Trace replay: the caches' request counters (hits, partial hits) summed over targets;
    /// `None` without a cache or outside trace replay.
    pub hits: Option<crate::mrc::Point>,
}

impl RunResult {
    /// Requests per second.
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }
    /// MB/s (10^6 bytes).
    pub fn mb_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// A simulation: devices, targets, a router and a closed-loop workload.
pub struct Sim {
    /// Device models.
    pub devices: Vec<Box<dyn Device>>,
    /// Targets.
    pub targets: Vec<Target>,
    router: Box<dyn Router>,
    now: Nanos,
    timers: BinaryHeap<Reverse<(Nanos, u64, Timer)>>,
    seq: u64,
    tokens: Vec<Option<Token>>,
    free_tokens: Vec<u64>,
    subs: Vec<Option<Sub>>,
    free_subs: Vec<u64>,
    clients: Vec<Option<ClientReq>>,
    free_clients: Vec<u64>,
    actions: Vec<Action>,
    done: Vec<u64>,
    route_buf: Vec<(usize, u64)>,
    events: u64,
    failed: u64,
    /// Per target: the time of the last tick delivered (a deadline at or before it is stale).
    ticked: Vec<Nanos>,
    /// Device faults, and per token the extra delay a slow-device fault gave it.
    faults: Vec<DeviceFault>,
    late: Vec<Nanos>,
    fault_stats: FaultStats,
}

impl Sim {
    /// A simulation over `devices` and `targets`, routing with `router`.
    pub fn new(
        devices: Vec<Box<dyn Device>>,
        targets: Vec<Target>,
        router: Box<dyn Router>,
    ) -> Sim {
        Sim {
            devices,
            targets,
            router,
            now: Nanos(0),
            timers: BinaryHeap::new(),
            seq: 0,
            tokens: Vec::new(),
            free_tokens: Vec::new(),
            subs: Vec::new(),
            free_subs: Vec::new(),
            clients: Vec::new(),
            free_clients: Vec::new(),
            actions: Vec::new(),
            done: Vec::new(),
            route_buf: Vec::new(),
            events: 0,
            failed: 0,
            ticked: Vec::new(),
            faults: Vec::new(),
            late: Vec::new(),
            fault_stats: FaultStats::default(),
        }
    }

    /// Adds a device fault (see the module docs). Times are simulated time since the
    /// simulation began.
    pub fn add_fault(&mut self, f: DeviceFault) {
        self.faults.push(f);
    }

    /// The fault of `kind`'s sort active on `dev` now, if any.
    fn fault_now(&self, dev: usize, slow: bool) -> Option<FaultKind> {
        self.faults
            .iter()
            .filter(|f| f.dev == dev && f.from <= self.now && self.now < f.until)
            .map(|f| f.kind)
            .find(|k| matches!(k, FaultKind::Slow(_)) == slow)
    }

    /// Allocates a token for an IO submitted now on `dev`, noting a slow-device delay.
    fn token(&mut self, t: Token) -> u64 {
        let tok = Self::alloc(&mut self.tokens, &mut self.free_tokens, t);
        if !self.faults.is_empty() {
            if self.late.len() <= tok as usize {
                self.late.resize(tok as usize + 1, Nanos(0));
            }
            self.late[tok as usize] = match self.fault_now(t.dev(), true) {
                Some(FaultKind::Slow(d)) => d,
                _ => Nanos(0),
            };
        }
        tok
    }

    /// A device finished the IO of token `tok`: deliver it now, or later if a slow-device
    /// fault delays it; it fails if a failing-device fault is active.
    fn device_done(&mut self, tok: u64) {
        if let Some(d) = self.late.get_mut(tok as usize)
            && d.0 > 0
        {
            let at = self.now.plus(*d);
            *d = Nanos(0);
            self.fault_stats.ios_delayed += 1;
            self.timer(at, Timer::Late(tok));
            return;
        }
        let owner = self.tokens[tok as usize].take().expect("live token");
        self.free_tokens.push(tok);
        let result = match self.fault_now(owner.dev(), false) {
            Some(FaultKind::Fail(e)) => {
                self.fault_stats.io_errors += 1;
                Err(e)
            }
            _ => Ok(()),
        };
        match owner {
            Token::Cache { target, io, .. } => {
                self.apply(target as usize, Event::IoDone { io, result })
            }
            Token::Bare { sub, extra: 0, .. } => self.sub_done(sub, result.is_ok()),
            Token::Bare { sub, extra, .. } => self.extra_io(sub, extra - 1),
        }
    }

    /// The simulated time now.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Lines written back so far, all caches.
    pub fn writeback_lines(&self) -> u64 {
        self.targets
            .iter()
            .filter_map(|t| t.cache.as_ref())
            .map(|c| c.cache.counters().writeback_lines)
            .sum()
    }

    /// Blocks of the client-visible volume.
    pub fn volume_blocks(&self) -> u64 {
        self.router.volume_blocks()
    }

    /// Dirty share of all caches' lines, 0..1.
    pub fn dirty_ratio(&self) -> f64 {
        let (mut d, mut t) = (0u64, 0u64);
        for tg in &self.targets {
            if let Some(c) = &tg.cache {
                d += c.cache.dirty_lines() as u64;
                t += c.cache.config().lines as u64;
            }
        }
        if t == 0 { 0.0 } else { d as f64 / t as f64 }
    }

    fn alloc<T>(v: &mut Vec<Option<T>>, free: &mut Vec<u64>, x: T) -> u64 {
        match free.pop() {
            Some(i) => {
                v[i as usize] = Some(x);
                i
            }
            None => {
                v.push(Some(x));
                (v.len() - 1) as u64
            }
        }
    }

    fn timer(&mut self, at: Nanos, t: Timer) {
        self.seq += 1;
        self.timers.push(Reverse((at, self.seq, t)));
    }

    /// Puts trace entry `i` (of the first `due`, sorted by time) on the heap with sequence
    /// number `seq0 + i`.
    fn trace_timer(&mut self, entries: &[TraceEntry], t0: Nanos, i: u64, seq0: u64, due: u64) {
        if i < due {
            let at = t0.plus(Nanos(entries[i as usize].time_us * 1000));
            self.timers.push(Reverse((at, seq0 + i, Timer::Trace(i))));
        }
    }

    /// Starts a client request for `job` now.
    fn start_client(&mut self, job: u32, io: ClientIo) {
        let mut route = std::mem::take(&mut self.route_buf);
        route.clear();
        self.router.route(&io, &mut route);
        let id = Self::alloc(
            &mut self.clients,
            &mut self.free_clients,
            ClientReq {
                job,
                start: self.now,
                pending: route.len() as u32,
                read: io.read,
            },
        );
        for &(target, lba) in &route {
            let sub = Sub {
                client: id,
                target: target as u32,
                lba,
                blocks: io.blocks,
                read: io.read,
            };
            let s = Self::alloc(&mut self.subs, &mut self.free_subs, sub);
            let half = Nanos((self.targets[target].server.latency_us * 500.0) as u64);
            self.timer(self.now.plus(half), Timer::Arrive(s));
        }
        self.route_buf = route;
    }

    fn arrive(&mut self, s: u64) {
        let t = self.subs[s as usize].expect("live sub").target as usize;
        let tg = &mut self.targets[t];
        if tg.server.threads == 0 {
            self.dispatch(s);
        } else if tg.busy_threads < tg.server.threads {
            tg.busy_threads += 1;
            let at = self.now.plus(Nanos((tg.server.cpu_us * 1000.0) as u64));
            self.timer(at, Timer::Dispatch(s));
        } else {
            tg.waiting.push_back(s);
        }
    }

    /// CPU done (or no server): free the thread, start the next waiter, issue the IO.
    fn dispatch(&mut self, s: u64) {
        let sub = self.subs[s as usize].expect("live sub");
        let t = sub.target as usize;
        if self.targets[t].server.threads > 0 {
            if let Some(next) = self.targets[t].waiting.pop_front() {
                let at = self
                    .now
                    .plus(Nanos((self.targets[t].server.cpu_us * 1000.0) as u64));
                self.timer(at, Timer::Dispatch(next));
            } else {
                self.targets[t].busy_threads -= 1;
            }
        }
        if self.targets[t].cache.is_some() {
            let ev = if sub.read {
                Event::Read {
                    req: ReqId(s),
                    core: CoreId(0),
                    lba: Lba(sub.lba),
                    blocks: sub.blocks,
                }
            } else {
                Event::Write {
                    req: ReqId(s),
                    core: CoreId(0),
                    lba: Lba(sub.lba),
                    blocks: sub.blocks,
                    fua: false,
                }
            };
            self.apply(t, ev);
        } else {
            let r = self.targets[t].core;
            let tg = &mut self.targets[t];
            let extra = match tg.extra {
                Some(x) => {
                    tg.extra_owed += if sub.read { x.per_read } else { x.per_write };
                    let n = tg.extra_owed.floor();
                    tg.extra_owed -= n;
                    n as u32
                }
                None => 0,
            };
            let tok = self.token(Token::Bare {
                sub: s,
                dev: r.dev as u32,
                extra,
            });
            let kind = if sub.read {
                IoKind::Read
            } else {
                IoKind::Write { fua: false }
            };
            self.devices[r.dev].submit(
                self.now,
                DevIo {
                    token: tok,
                    kind,
                    lba: r.offset + sub.lba,
                    blocks: sub.blocks,
                },
            );
        }
    }

    /// Makes one of sub-request `s`'s extra IOs, `left` more after it.
    fn extra_io(&mut self, s: u64, left: u32) {
        let sub = self.subs[s as usize].expect("live sub");
        let tg = &mut self.targets[sub.target as usize];
        let x = tg.extra.expect("a target with extra IOs");
        tg.extra_made += 1;
        let slots = (x.region.blocks / 8).max(1);
        let slot = crate::rng::Rng::new(tg.extra_made ^ 0x005e_eddb).next_u64() % slots;
        let tok = self.token(Token::Bare {
            sub: s,
            dev: x.region.dev as u32,
            extra: left,
        });
        let kind = if sub.read {
            IoKind::Read
        } else {
            IoKind::Write { fua: false }
        };
        self.devices[x.region.dev].submit(
            self.now,
            DevIo {
                token: tok,
                kind,
                lba: x.region.offset + slot * 8,
                blocks: 8.min(x.region.blocks) as u32,
            },
        );
    }

    /// Delivers `ev` to target `t`'s cache and executes its actions.
    fn apply(&mut self, t: usize, ev: Event) {
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        let setup = self.targets[t].cache.as_mut().expect("cached target");
        setup.cache.apply(self.now, ev, &mut actions);
        let (cache_r, core_r) = (setup.region, self.targets[t].core);
        for a in actions.drain(..) {
            let (io, dev, kind, lba, blocks) = match a {
                Action::Read {
                    io,
                    dev,
                    lba,
                    blocks,
                    ..
                } => (io, dev, IoKind::Read, lba.0, blocks),
                Action::Write {
                    io,
                    dev,
                    lba,
                    blocks,
                    fua,
                    ..
                } => (io, dev, IoKind::Write { fua }, lba.0, blocks),
                Action::WriteZeroes {
                    io,
                    dev,
                    lba,
                    blocks,
                    ..
                }
                | Action::Trim {
                    io,
                    dev,
                    lba,
                    blocks,
                } => (io, dev, IoKind::Trim, lba.0, blocks),
                Action::Flush { io, dev } => (io, dev, IoKind::Flush, 0, 0),
                Action::Copy { .. } => continue,
                Action::Complete { req, result } => {
                    self.sub_done(req.0, result.is_ok());
                    continue;
                }
            };
            let r = match dev {
                Dev::Cache => cache_r,
                Dev::Core(_) => core_r,
            };
            let tok = self.token(Token::Cache {
                target: t as u32,
                io,
                dev: r.dev as u32,
            });
            let lba = if kind == IoKind::Flush {
                0
            } else {
                r.offset + lba
            };
            self.devices[r.dev].submit(
                self.now,
                DevIo {
                    token: tok,
                    kind,
                    lba,
                    blocks,
                },
            );
        }
        self.actions = actions;
    }

    fn sub_done(&mut self, s: u64, ok: bool) {
        let t = self.subs[s as usize].expect("live sub").target as usize;
        if !ok {
            // Counted at the client (only device faults make requests fail).
            self.failed += 1;
        }
        let half = Nanos((self.targets[t].server.latency_us * 500.0) as u64);
        self.timer(self.now.plus(half), Timer::Answer(s));
    }
}

/// How a run is driven.
pub enum Load<'a> {
    /// Closed loop: `jobs × qd` requests outstanding, drawn from the generator.
    Closed {
        /// Request source.
        source: &'a mut Generator,
        /// Jobs.
        jobs: u32,
        /// Requests outstanding per job.
        qd: u32,
    },
    /// Open loop: a trace's requests at their times (from the start of the run), sorted by
    /// time (as the trace readers leave them).
    Trace(&'a [TraceEntry]),
}

/// Measurement settings.
#[derive(Copy, Clone, Debug)]
pub struct Window {
    /// Simulated time before measuring starts.
    pub warmup: Nanos,
    /// Measured time.
    pub duration: Nanos,
    /// Time-series sampling interval.
    pub sample: Nanos,
}

impl Sim {
    fn next_deadline(&self) -> Option<(Nanos, usize)> {
        let mut best: Option<(Nanos, usize)> = None;
        for (i, t) in self.targets.iter().enumerate() {
            if let Some(c) = &t.cache
                && let Some(d) = c.cache.next_deadline()
            {
                let d = if d <= self.ticked[i] {
                    continue;
                } else {
                    d.max(self.now)
                };
                if best.is_none_or(|(b, _)| d < b) {
                    best = Some((d, i));
                }
            }
        }
        best
    }

    /// Runs `load` through the window; returns what the clients saw.
    pub fn run(&mut self, mut load: Load<'_>, w: Window) -> RunResult {
        self.ticked = vec![Nanos(0); self.targets.len()];
        let t0 = self.now;
        let measure_from = t0.plus(w.warmup);
        let end = measure_from.plus(w.duration);
        let mut res = RunResult {
            seconds: w.duration.0 as f64 / 1e9,
            ..RunResult::default()
        };
        let mut interval = Histogram::default();
        let mut interval_ops = 0u64;
        let mut next_sample = measure_from.plus(w.sample);
        let mut wb_mark = self.writeback_lines();
        let (mut trace_seq, mut trace_due) = (0, 0);
        match &mut load {
            Load::Closed { source, jobs, qd } => {
                for job in 0..*jobs {
                    for _ in 0..*qd {
                        let io = source.next(job as usize);
                        self.start_client(job, io);
                    }
                }
            }
            Load::Trace(entries) => {
                // Only the next entry is on the heap (a heap of a million arrivals made every
                // pop cost 20 cache misses). Entry `i` keeps the sequence number it had when
                // every entry was pushed here at once (`trace_seq + i`), so timers of equal
                // time still run in the same order.
                debug_assert!(entries.is_sorted_by_key(|e| e.time_us), "trace not sorted");
                let due = entries
                    .iter()
                    .take_while(|e| t0.plus(Nanos(e.time_us * 1000)) < end)
                    .count();
                trace_seq = self.seq + 1;
                trace_due = due as u64;
                self.seq += trace_due;
                self.trace_timer(entries, t0, 0, trace_seq, trace_due);
            }
        }
        let mut done = std::mem::take(&mut self.done);
        let mut finished: Vec<(u32, Nanos, bool)> = Vec::new();
        loop {
            let t_dev = self
                .devices
                .iter()
                .filter_map(|d| d.next_completion())
                .min();
            let t_timer = self.timers.peek().map(|Reverse((t, _, _))| *t);
            let t_dl = self.next_deadline();
            let mut t = end.min(next_sample);
            for x in [t_dev, t_timer, t_dl.map(|x| x.0)].into_iter().flatten() {
                t = t.min(x);
            }
            self.now = self.now.max(t);
            if self.now >= next_sample && next_sample <= end {
                res.series.push(Sample {
                    t_s: next_sample.since(t0).0 as f64 / 1e9,
                    iops: interval_ops as f64 * 1e9 / w.sample.0 as f64,
                    lat_mean_us: interval.mean_ns() / 1e3,
                    lat_p99_us: interval.quantile_ns(0.99) as f64 / 1e3,
                    dirty_pct: self.dirty_ratio() * 100.0,
                    writeback_lines_s: (self.writeback_lines() - wb_mark) as f64 * 1e9
                        / w.sample.0 as f64,
                });
                wb_mark = self.writeback_lines();
                if !self.faults.is_empty() {
                    let mut h = HealthSample {
                        t_s_ms: next_sample.since(t0).0 / 1_000_000,
                        degraded: 0,
                        dirty_at_risk_blocks: 0,
                    };
                    for tg in &self.targets {
                        if let Some(c) = &tg.cache {
                            let x = c.cache.health();
                            h.degraded += (x.state == HealthState::Degraded) as u32;
                            h.dirty_at_risk_blocks += x.dirty_at_risk_blocks;
                        }
                    }
                    res.health.push(h);
                }
                interval = Histogram::default();
                interval_ops = 0;
                next_sample = next_sample.plus(w.sample);
                continue;
            }
            if self.now >= end {
                break;
            }
            self.events += 1;
            // Device completions.
            for d in 0..self.devices.len() {
                if self.devices[d]
                    .next_completion()
                    .is_some_and(|c| c <= self.now)
                {
                    done.clear();
                    self.devices[d].complete_until(self.now, &mut done);
                    for &tok in &done {
                        self.device_done(tok);
                    }
                }
            }
            // Timers.
            while let Some(Reverse((at, _, tm))) = self.timers.peek().copied() {
                if at > self.now {
                    break;
                }
                self.timers.pop();
                match tm {
                    Timer::Arrive(s) => self.arrive(s),
                    Timer::Dispatch(s) => self.dispatch(s),
                    Timer::Answer(s) => {
                        let sub = self.subs[s as usize].take().expect("live sub");
                        self.free_subs.push(s);
                        let c = self.clients[sub.client as usize]
                            .as_mut()
                            .expect("live client");
                        c.pending -= 1;
                        if c.pending == 0 {
                            let c = self.clients[sub.client as usize]
                                .take()
                                .expect("live client");
                            self.free_clients.push(sub.client);
                            finished.push((c.job, c.start, c.read));
                            let _ = sub.blocks;
                            let bytes = sub.blocks as u64 * 512;
                            if self.now >= measure_from {
                                let lat = self.now.since(c.start);
                                res.ops += 1;
                                res.reads += c.read as u64;
                                res.bytes += bytes;
                                res.latency.record(lat.0);
                                interval.record(lat.0);
                                interval_ops += 1;
                            }
                        }
                    }
                    Timer::Trace(i) => {
                        if let Load::Trace(entries) = &load {
                            self.trace_timer(entries, t0, i + 1, trace_seq, trace_due);
                            self.start_client(u32::MAX, entries[i as usize].io);
                        }
                    }
                    Timer::Late(tok) => self.device_done(tok),
                }
            }
            // Closed loop: each finished request starts its job's next one.
            if let Load::Closed { source, .. } = &mut load {
                for &(job, _, _) in &finished {
                    let io = source.next(job as usize);
                    self.start_client(job, io);
                }
            }
            finished.clear();
            // Cache deadlines.
            if let Some((d, i)) = t_dl
                && d <= self.now
            {
                self.ticked[i] = self.now;
                self.apply(i, Event::Tick);
            }
        }
        self.done = done;
        res.events = self.events;
        res.errors = self.failed;
        res.faults = self.fault_stats.clone();
        res
    }
}
