//! The emulated device ([`EmuBackend`]): data on another backend, timing from a simulator device
//! model applied in real time; and the `emu:PRESET:PATH` device string ([`parse_emu`]).

use crate::{Backend, FileBackend, IoErr, Req, check_blocks, check_bytes};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tiercache_core::units::Nanos;
use tiercache_devmodel::{self as device, DevIo, Device, DeviceSpec, IoKind};

/// Bounds of the spin margin, the time before a completion is due at which the leader stops
/// sleeping and spins on the clock (ns).
const MIN_MARGIN_NS: u64 = 50_000;
const MAX_MARGIN_NS: u64 = 500_000;
/// Added to the oversleep estimate to make the margin (ns).
const MARGIN_PAD_NS: u64 = 25_000;
/// Initial oversleep estimate (ns).
const INITIAL_OVERSLEEP_NS: u64 = 100_000;
/// Step of the oversleep estimate (ns).
const OVERSLEEP_STEP_NS: u64 = 1_000;
/// Timer slack of the leader's thread while it sleeps (ns).
const LEADER_SLACK_NS: libc::c_ulong = 1_000;

/// Largest lateness credit a thread carries (ns).
const MAX_CREDIT_NS: u64 = 10_000_000;
/// A thread's credit lapses when it submits this long after its last return (ns).
const CREDIT_LAPSE_NS: u64 = 10_000_000;

/// Number of condition variables waiters are spread over (by token).
const SLOTS: usize = 64;

/// Source of [`EmuBackend`] identities (for the per-thread lateness credit).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A thread's lateness credit on one backend (see "Lateness compensation" on [`EmuBackend`]).
#[derive(Copy, Clone)]
struct Credit {
    /// The backend it applies to.
    backend: u64,
    /// How far behind the model's schedule the thread is (ns).
    ns: u64,
    /// When its last call returned (the backend's clock).
    returned: Nanos,
}

const NO_CREDIT: Credit = Credit {
    backend: u64::MAX,
    ns: 0,
    returned: Nanos(0),
};

thread_local! {
    /// The calling thread's lateness credit.
    static CREDIT: Cell<Credit> = const { Cell::new(NO_CREDIT) };
}

/// How a call's requests went into the model.
#[derive(Copy, Clone)]
struct Submitted {
    /// The credit the thread had.
    credit: u64,
    /// How much of it backdated the submission.
    used: u64,
}

/// Timing of the requests an [`EmuBackend`] completed: how late calls returned after they could
/// have (after both the model's completion time and the data operation; never early).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EmuStats {
    /// Requests that went through the model and were waited for.
    pub ios: u64,
    /// Sum of the lateness of the returns, in nanoseconds.
    pub late_sum_ns: u64,
    /// Largest lateness of a return, in nanoseconds.
    pub late_max_ns: u64,
    /// The current spin margin (see [`EmuBackend`], Scheduling), in nanoseconds.
    pub spin_margin_ns: u64,
}

impl EmuStats {
    /// Mean lateness of a return in microseconds (0 with no requests).
    pub fn mean_late_us(&self) -> f64 {
        if self.ios == 0 {
            0.0
        } else {
            self.late_sum_ns as f64 / self.ios as f64 / 1e3
        }
    }
}

/// The model and the bookkeeping of who waits for what, under one mutex.
struct Sched {
    model: Box<dyn Device>,
    /// The latest time given to the model (submissions never go before it).
    last: Nanos,
    next_token: u64,
    /// Completed tokens not yet collected by their callers, with their completion times.
    done: HashMap<u64, Nanos>,
    /// Tokens whose callers sleep on their slot (followers).
    waiting: HashSet<u64>,
    /// Whether a caller is the leader (keeps the time).
    leader: bool,
    /// The completion time the leader sleeps towards.
    target: Option<Nanos>,
    /// Estimate of the 95th percentile of how late the leader's timed sleeps wake (ns).
    oversleep_ns: u64,
    buf: Vec<u64>,
}

impl Sched {
    fn margin_ns(&self) -> u64 {
        (self.oversleep_ns + MARGIN_PAD_NS).clamp(MIN_MARGIN_NS, MAX_MARGIN_NS)
    }

    /// Learns from one timed sleep that woke `over` ns after it was asked to. A streaming
    /// quantile estimate with fixed steps: up 19 steps when the sleep overslept the estimate,
    /// down one otherwise, so it settles where 1 sleep in 20 oversleeps it (the 95th
    /// percentile), and a rare long stall (a preempted VM) moves it by one step only.
    fn observe_oversleep(&mut self, over: u64) {
        self.oversleep_ns = if over > self.oversleep_ns {
            self.oversleep_ns + 19 * OVERSLEEP_STEP_NS
        } else {
            self.oversleep_ns.saturating_sub(OVERSLEEP_STEP_NS)
        }
        .min(MAX_MARGIN_NS);
    }
}

/// Lowers the calling thread's timer slack (how much later than asked the kernel may end a
/// timed sleep; 50 µs by default) while it lives, and restores it on drop.
struct FineTimer(Option<libc::c_ulong>);

impl FineTimer {
    fn new() -> Self {
        // SAFETY: PR_GET_TIMERSLACK takes no pointers; it returns the calling thread's slack.
        let old = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        if old <= 0 {
            return FineTimer(None);
        }
        // SAFETY: PR_SET_TIMERSLACK takes the slack by value and changes only the calling
        // thread's timer slack, which `drop` restores.
        let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, LEADER_SLACK_NS, 0, 0, 0) };
        FineTimer((r == 0).then_some(old as libc::c_ulong))
    }
}

impl Drop for FineTimer {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: as in `new`: a by-value argument, the calling thread only (a guard is never
            // sent to another thread: it lives across one sleep in `lead`).
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, old, 0, 0, 0) };
        }
    }
}

/// A backend whose data lives on `inner` and whose timing follows a simulator device model
/// ([`tiercache_devmodel`]) applied in real time: the `emu:PRESET:PATH` device.
///
/// Each request is submitted to the model at the current real time (a monotonic clock started
/// when the backend was created, as [`Nanos`]), the data operation runs on the inner backend
/// while the model "services" it, and the call returns once the wall clock has reached the
/// model's completion time for that request. Requests from concurrent callers are all in the
/// model at once, so the model's queueing (an HDD's NCQ reordering and its single actuator, a
/// flash device's parallel units and IOPS caps) takes effect just as in the simulator.
///
/// Reads and writes map to the model's reads and writes (FUA writes to `Write { fua: true }`),
/// trim and write-zeroes to its trim, flush to its flush (and the inner flush).
/// [`Backend::submit_batch`] puts the whole batch into the model at once. The model's capacity
/// is the inner backend's.
///
/// # Scheduling
///
/// One mutex protects the model. There is no timer thread: among the callers waiting for their
/// completions, one at a time is the *leader*. The leader asks the model when the next IO
/// completes, sleeps until shortly before that time on a condition variable (with its thread's
/// timer slack lowered to 1 µs for the sleep), spins on the clock until the time has come,
/// collects what the model completed and wakes the owners of those requests (waiters sleep on
/// one of a set of condition variables chosen by token, so a completion wakes its owner only).
/// When the leader's own request completes it returns at once, without a wake-up hop, and hands
/// the leadership to another waiter. At queue depth 1 the caller is always its own leader and
/// returns within a few microseconds of the completion time on an idle machine. A submission
/// that moves the model's next completion earlier than the time the leader sleeps towards wakes
/// the leader.
///
/// How early the leader stops sleeping (the spin margin) adapts to how late this machine's
/// timed sleeps wake: it follows the 95th percentile of the observed oversleep (timer slack and
/// wake-up latency, ~35-90 µs on an idle small VM) plus 25 µs, between 50 and 500 µs, so that
/// spinning costs at most that per completion.
///
/// # Lateness compensation
///
/// On a busy machine a thread can still be woken late (milliseconds, when other processes hold
/// the CPUs). A closed-loop client would then lose that time at every request and see a slower
/// device than the model. So when a call returns `L` after it could have (after both the
/// model's completion and the data operation), the next request *of the same thread* on the
/// same backend is submitted to the model as of `L` earlier than the real time: when it would
/// have come had the return been on time. Lateness then shows up as jitter (one request late,
/// the next one early), not as lost throughput. The part of the credit the next request cannot
/// use (its backdated completion would fall before it even arrived, or before the model's
/// clock) carries over to the one after. Bounds: a request is never submitted before a time the
/// model has already seen (its clock stays monotonic); the credit is at most 10 ms, and lapses
/// when the thread comes back more than 10 ms after its return (its next request was then not
/// the immediate follow-up of the late one). [`EmuBackend::stats`] reports the lateness.
///
/// Requests the inner backend rejects before any IO (out of range, misaligned) fail at once,
/// without model time; zero-length reads, writes, trims and zeroings do not reach the model.
pub struct EmuBackend<B: Backend = Box<dyn Backend>> {
    inner: B,
    label: String,
    id: u64,
    start: Instant,
    sched: Mutex<Sched>,
    leader_cv: Condvar,
    slots: Box<[Condvar]>,
    /// Bumped when the leader's target moves earlier (ends its spin).
    kick: AtomicU64,
    ios: AtomicU64,
    late_sum_ns: AtomicU64,
    late_max_ns: AtomicU64,
}

impl<B: Backend> std::fmt::Debug for EmuBackend<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuBackend")
            .field("name", &self.name())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Makes an error text one line (TOML parse errors span several).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl<B: Backend> EmuBackend<B> {
    /// Wraps `inner` with the timing of the device `spec` describes, named after the spec.
    pub fn new(inner: B, spec: &DeviceSpec) -> Self {
        let model = spec.build(inner.blocks().max(1));
        let label = model.name().to_string();
        Self::with_model(inner, model, label)
    }

    /// Wraps `inner` with the timing of a simulator preset (such as `hdd-10k-sas`, or a path to
    /// a device `.toml` file). The error is one line.
    pub fn with_preset(inner: B, preset: &str) -> Result<Self, String> {
        let spec = device::preset(preset).map_err(|e| one_line(&e))?;
        let model = spec.build(inner.blocks().max(1));
        Ok(Self::with_model(inner, model, preset.to_string()))
    }

    fn with_model(inner: B, model: Box<dyn Device>, label: String) -> Self {
        EmuBackend {
            inner,
            label,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            start: Instant::now(),
            sched: Mutex::new(Sched {
                model,
                last: Nanos(0),
                next_token: 0,
                done: HashMap::new(),
                waiting: HashSet::new(),
                leader: false,
                target: None,
                oversleep_ns: INITIAL_OVERSLEEP_NS,
                buf: Vec::new(),
            }),
            leader_cv: Condvar::new(),
            slots: (0..SLOTS).map(|_| Condvar::new()).collect(),
            kick: AtomicU64::new(0),
            ios: AtomicU64::new(0),
            late_sum_ns: AtomicU64::new(0),
            late_max_ns: AtomicU64::new(0),
        }
    }

    /// The backend holding the data (IO on it bypasses the model).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The model's name as shown by [`Backend::name`] (the preset name).
    pub fn model_name(&self) -> &str {
        &self.label
    }

    /// The emulation's clock: real time since the backend was created, the time base of the
    /// model.
    pub fn elapsed(&self) -> Nanos {
        Nanos(self.start.elapsed().as_nanos() as u64)
    }

    /// How late the calls so far returned after they could have, and the current spin margin.
    pub fn stats(&self) -> EmuStats {
        EmuStats {
            ios: self.ios.load(Ordering::Relaxed),
            late_sum_ns: self.late_sum_ns.load(Ordering::Relaxed),
            late_max_ns: self.late_max_ns.load(Ordering::Relaxed),
            spin_margin_ns: self.lock().margin_ns(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, tok: u64) -> &Condvar {
        &self.slots[(tok % SLOTS as u64) as usize]
    }

    /// Takes the calling thread's lateness credit on this backend at `real` (see "Lateness
    /// compensation" above).
    fn take_credit(&self, real: Nanos) -> u64 {
        let c = CREDIT.with(|c| c.replace(NO_CREDIT));
        if c.backend == self.id && real.since(c.returned).0 <= CREDIT_LAPSE_NS {
            c.ns
        } else {
            0
        }
    }

    /// Submits IOs `(kind, lba, blocks)` to the model at the current time, less the calling
    /// thread's lateness credit; returns their tokens.
    fn submit(&self, ios: impl IntoIterator<Item = (IoKind, u64, u64)>) -> (Vec<u64>, Submitted) {
        let mut g = self.lock();
        let real = self.elapsed();
        let credit = self.take_credit(real);
        let now = Nanos(real.0.saturating_sub(credit)).max(g.last);
        g.last = now;
        let sub = Submitted {
            credit,
            used: real.since(now).0,
        };
        let mut toks = Vec::new();
        for (kind, lba, blocks) in ios {
            let token = g.next_token;
            g.next_token += 1;
            g.model.submit(
                now,
                DevIo {
                    token,
                    kind,
                    lba,
                    blocks: blocks.min(u32::MAX as u64) as u32,
                },
            );
            toks.push(token);
        }
        if g.leader {
            let next = g.model.next_completion();
            if next.is_some() && g.target.is_none_or(|t| next < Some(t)) {
                g.target = next;
                self.kick.fetch_add(1, Ordering::AcqRel);
                self.leader_cv.notify_one();
            }
        }
        (toks, sub)
    }

    /// Moves every IO the model completed by `now` to `done` and wakes its waiting caller.
    fn collect(&self, g: &mut Sched, now: Nanos) {
        let mut buf = std::mem::take(&mut g.buf);
        while let Some(t) = g.model.next_completion() {
            if t > now {
                break;
            }
            buf.clear();
            g.model.complete_until(t, &mut buf);
            g.last = g.last.max(t);
            for &tok in &buf {
                g.done.insert(tok, t);
                if g.waiting.contains(&tok) {
                    self.slot(tok).notify_all();
                }
            }
        }
        g.buf = buf;
    }

    /// Keeps the time until `tok` has completed: sleeps to shortly before the model's next
    /// completion, spins the rest, collects, repeats.
    fn lead<'a>(&'a self, mut g: MutexGuard<'a, Sched>, tok: u64) -> MutexGuard<'a, Sched> {
        loop {
            let now = self.elapsed();
            self.collect(&mut g, now);
            if g.done.contains_key(&tok) {
                return g;
            }
            let Some(t) = g.model.next_completion() else {
                // Nothing outstanding (cannot happen while `tok` is): look again shortly.
                g.target = None;
                g = self
                    .leader_cv
                    .wait_timeout(g, Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            };
            g.target = Some(t);
            let left = t.0.saturating_sub(now.0);
            let margin = g.margin_ns();
            if left > margin {
                let wake = now.0 + (left - margin);
                // The slack is lowered for the sleep only: the syscalls fall in the margin.
                let fine = FineTimer::new();
                let (g2, res) = self
                    .leader_cv
                    .wait_timeout(g, Duration::from_nanos(left - margin))
                    .unwrap_or_else(|e| e.into_inner());
                drop(fine);
                g = g2;
                if res.timed_out() {
                    let over = self.elapsed().0.saturating_sub(wake);
                    g.observe_oversleep(over);
                }
            } else {
                let kick = self.kick.load(Ordering::Acquire);
                drop(g);
                while self.elapsed() < t && self.kick.load(Ordering::Acquire) == kick {
                    std::hint::spin_loop();
                }
                g = self.lock();
            }
        }
    }

    /// If nobody keeps the time while callers wait, wakes one of them to take over.
    fn pass_leadership(&self, g: &Sched) {
        if g.leader {
            return;
        }
        if let Some(&w) = g.waiting.iter().next() {
            self.slot(w).notify_all();
        }
    }

    /// Returns the model's completion time of `tok` once it has completed and the wall clock
    /// has reached that time.
    fn wait(&self, tok: u64) -> Nanos {
        let mut g = self.lock();
        loop {
            if let Some(at) = g.done.remove(&tok) {
                self.pass_leadership(&g);
                return at;
            }
            if !g.leader {
                g.leader = true;
                g = self.lead(g, tok);
                g.leader = false;
                g.target = None;
                continue;
            }
            g.waiting.insert(tok);
            g = self.slot(tok).wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting.remove(&tok);
        }
    }

    /// Waits for `toks`, submitted by this thread as `sub` and whose data operation ended at
    /// `data_done`; records how late the call returns and leaves the thread's new credit: that
    /// lateness plus what it could not use of its old credit.
    fn wait_all(&self, toks: &[u64], sub: Submitted, data_done: Nanos) {
        if toks.is_empty() {
            return;
        }
        let mut done = Nanos(0);
        for &tok in toks {
            done = done.max(self.wait(tok));
        }
        let returned = self.elapsed();
        let late = returned.since(done.max(data_done)).0;
        let n = toks.len() as u64;
        self.ios.fetch_add(n, Ordering::Relaxed);
        self.late_sum_ns.fetch_add(late * n, Ordering::Relaxed);
        self.late_max_ns.fetch_max(late, Ordering::Relaxed);
        // Unused: what the model's clock kept from backdating, and what the backdating gained
        // nothing with because the completion fell before the call could end anyway.
        let unused = (sub.credit - sub.used) + sub.used.min(data_done.since(done).0);
        let ns = (late + unused).min(MAX_CREDIT_NS);
        CREDIT.with(|c| {
            c.set(Credit {
                backend: self.id,
                ns,
                returned,
            })
        });
    }

    /// Runs one request through the model: submit, do `data` on the inner backend, wait.
    fn timed<T>(&self, kind: IoKind, lba: u64, blocks: u64, data: impl FnOnce() -> T) -> T {
        let (toks, sub) = self.submit([(kind, lba, blocks)]);
        let r = data();
        self.wait_all(&toks, sub, self.elapsed());
        r
    }

    /// The model IO of a batch request, `None` when it fails validation or is empty.
    fn model_io(&self, r: &Req<'_>) -> Option<(IoKind, u64, u64)> {
        let n = self.inner.blocks();
        let (kind, lba, blocks) = match *r {
            Req::Read { lba, ref buf } => (IoKind::Read, lba, check_bytes(lba, buf.len(), n)),
            Req::Write { lba, buf, fua } => {
                (IoKind::Write { fua }, lba, check_bytes(lba, buf.len(), n))
            }
            Req::WriteZeroes { lba, blocks, .. } | Req::Trim { lba, blocks } => (
                IoKind::Trim,
                lba,
                check_blocks(lba, blocks, n).map(|()| blocks),
            ),
            Req::Flush => return Some((IoKind::Flush, 0, 0)),
        };
        blocks.ok().filter(|&b| b > 0).map(|b| (kind, lba, b))
    }
}

/// Every IO waits out the device model in the calling thread: synchronous only (an IO
/// submitted asynchronously runs these calls, so the model's latency applies to it too), no
/// ring descriptor (a ring would bypass the model). Allocation queries go to the inner device
/// (no IO is modelled: they move no data).
impl<B: Backend> Backend for EmuBackend<B> {
    crate::forward_backend!(inner; blocks, extents);
    crate::sync_only_backend!();

    fn name(&self) -> String {
        format!("emu:{} over {}", self.label, self.inner.name())
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.inner.blocks())?;
        if n == 0 {
            return self.inner.read(lba, buf);
        }
        self.timed(IoKind::Read, lba, n, || self.inner.read(lba, buf))
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.inner.blocks())?;
        if n == 0 {
            return self.inner.write(lba, buf, fua);
        }
        self.timed(IoKind::Write { fua }, lba, n, || {
            self.inner.write(lba, buf, fua)
        })
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        if blocks == 0 {
            return self.inner.write_zeroes(lba, blocks, fua);
        }
        self.timed(IoKind::Trim, lba, blocks, || {
            self.inner.write_zeroes(lba, blocks, fua)
        })
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        if blocks == 0 {
            return self.inner.trim(lba, blocks);
        }
        self.timed(IoKind::Trim, lba, blocks, || self.inner.trim(lba, blocks))
    }

    fn flush(&self) -> Result<(), IoErr> {
        self.timed(IoKind::Flush, 0, 0, || self.inner.flush())
    }

    fn submit_batch(&self, reqs: &mut [Req<'_>]) -> Vec<Result<(), IoErr>> {
        let ios: Vec<_> = reqs.iter().filter_map(|r| self.model_io(r)).collect();
        if ios.is_empty() {
            return self.inner.submit_batch(reqs);
        }
        let (toks, sub) = self.submit(ios);
        let res = self.inner.submit_batch(reqs);
        self.wait_all(&toks, sub, self.elapsed());
        res
    }
}

/// A parsed `emu:PRESET:PATH` device string (see [`parse_emu`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EmuTarget {
    /// The preset name (or device `.toml` path) as given.
    pub preset: String,
    /// The device model it names.
    pub spec: DeviceSpec,
    /// The file or block device holding the data.
    pub path: PathBuf,
}

impl EmuTarget {
    /// Opens the data file as a [`FileBackend`] and wraps it with the model.
    pub fn open(&self) -> Result<EmuBackend<FileBackend>, IoErr> {
        let inner = FileBackend::open(&self.path)?;
        let model = self.spec.build(inner.blocks().max(1));
        Ok(EmuBackend::with_model(inner, model, self.preset.clone()))
    }
}

const EMU_FORM: &str = "want emu:PRESET:PATH, e.g. emu:hdd-10k-sas:/var/lib/x.img";

/// Parses an emulated-device string `emu:PRESET:PATH` (the path may itself contain `:`).
/// Fails, with one line saying what is wrong, when the string is not of that form or the preset
/// is unknown; never panics. The path is not opened here ([`EmuTarget::open`] does).
pub fn parse_emu(s: &str) -> Result<EmuTarget, String> {
    let shown = s.escape_debug().to_string();
    let Some(rest) = s.strip_prefix("emu:") else {
        return Err(format!("'{shown}' is not an emulated device ({EMU_FORM})"));
    };
    let Some((preset, path)) = rest.split_once(':') else {
        return Err(format!(
            "emulated device '{shown}' has no path ({EMU_FORM})"
        ));
    };
    if preset.is_empty() {
        let names: Vec<&str> = device::PRESETS.iter().map(|p| p.name).collect();
        return Err(format!(
            "emulated device '{shown}' has no preset ({EMU_FORM}; presets: {})",
            names.join(", ")
        ));
    }
    if path.is_empty() {
        return Err(format!(
            "emulated device '{shown}' has no path ({EMU_FORM})"
        ));
    }
    let spec =
        device::preset(preset).map_err(|e| one_line(&format!("emulated device '{shown}': {e}")))?;
    Ok(EmuTarget {
        preset: preset.to_string(),
        spec,
        path: PathBuf::from(path),
    })
}

/// Parses `emu:PRESET:PATH` and opens it: [`parse_emu`] then [`EmuTarget::open`], with a
/// one-line error either way.
pub fn open_emu(s: &str) -> Result<EmuBackend<FileBackend>, String> {
    let t = parse_emu(s)?;
    t.open()
        .map_err(|e| format!("emulated device '{}': {e}", s.escape_debug()))
}
