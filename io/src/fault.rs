use crate::{BLOCK, Backend, IoErr, check_blocks, check_bytes};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// The kinds of operation the [`FaultBackend`] can fail or delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Backend::read`].
    Read,
    /// [`Backend::write`].
    Write,
    /// [`Backend::write_zeroes`].
    WriteZeroes,
    /// [`Backend::trim`].
    Trim,
    /// [`Backend::flush`].
    Flush,
}

impl OpKind {
    /// All kinds, in index order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Write,
        OpKind::WriteZeroes,
        OpKind::Trim,
        OpKind::Flush,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn bit(self) -> u8 {
        1 << self.index()
    }
}

/// The error an injected failure returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InjectedError {
    /// [`IoErr::Injected`]: an IO error (the engine reports `IoError::Io`).
    #[default]
    Io,
    /// [`IoErr::no_space`]: the device is full (ENOSPC; the engine reports `IoError::NoSpace`).
    NoSpace,
    /// [`IoErr::timed_out`]: the device did not answer (the engine reports
    /// `IoError::TimedOut`).
    TimedOut,
}

impl InjectedError {
    const ALL: [InjectedError; 3] = [
        InjectedError::Io,
        InjectedError::NoSpace,
        InjectedError::TimedOut,
    ];

    fn code(self) -> u8 {
        self as u8
    }

    fn error(self, op: OpKind) -> IoErr {
        match self {
            InjectedError::Io => IoErr::Injected { op },
            InjectedError::NoSpace => IoErr::no_space(format!("injected on {op:?}")),
            InjectedError::TimedOut => IoErr::timed_out(format!("injected on {op:?}")),
        }
    }
}

/// Configuration of a [`FaultBackend`]. The default injects nothing and tracks un-flushed
/// writes for [`FaultBackend::power_cut`].
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// Seed of the error-injection random sequence.
    pub seed: u64,
    /// Probability in `0.0..=1.0` that an operation of each kind (indexed as in
    /// [`OpKind::ALL`]) fails with [`IoErr::Injected`] before touching the device.
    pub error_rate: [f64; 5],
    /// Delay added (by sleeping) before each operation of each kind.
    pub delay: [Duration; 5],
    /// The error an injected failure of each kind returns.
    pub error_kind: [InjectedError; 5],
    /// Whether to track un-flushed writes so that [`FaultBackend::power_cut`] can revert them.
    /// It costs a read of the old content at the first overwrite of a block since the last
    /// flush, and serialises writes with each other and with flushes.
    pub track_power_cut: bool,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 0,
            error_rate: [0.0; 5],
            delay: [Duration::ZERO; 5],
            error_kind: [InjectedError::Io; 5],
            track_power_cut: true,
        }
    }
}

impl FaultConfig {
    /// Sets the error probability of one kind of operation.
    pub fn with_error_rate(mut self, op: OpKind, p: f64) -> Self {
        self.error_rate[op.index()] = p;
        self
    }

    /// Sets the delay added before each operation of one kind.
    pub fn with_delay(mut self, op: OpKind, d: Duration) -> Self {
        self.delay[op.index()] = d;
        self
    }

    /// Sets the seed of the error-injection sequence.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the error that injected failures of one kind of operation return.
    pub fn with_error_kind(mut self, op: OpKind, kind: InjectedError) -> Self {
        self.error_kind[op.index()] = kind;
        self
    }
}

/// What happens to un-flushed writes at a [`FaultBackend::power_cut`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerCutPattern {
    /// Every un-flushed write survives.
    KeepAll,
    /// Every block written since the last completed flush returns to its flushed content.
    DropAll,
    /// Each un-flushed 512-byte block independently survives or returns to its flushed content,
    /// chosen by a hash of the seed and the block number (reproducible for the same seed).
    Torn(u64),
}

/// Counts of what a [`FaultBackend::power_cut`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PowerCutReport {
    /// Un-flushed blocks that kept their new content.
    pub kept: u64,
    /// Un-flushed blocks returned to their last flushed content.
    pub reverted: u64,
}

/// Un-flushed state: for every block written since the last completed flush, its content as of
/// that flush (captured before its first overwrite), so memory is proportional to un-flushed
/// data.
#[derive(Debug, Default)]
struct Tracker {
    saved: HashMap<u64, Box<[u8]>>,
}

/// A fault-injecting wrapper around another backend.
///
/// - **Errors**: each operation kind fails with its configured probability, from a seeded
///   sequence, with its configured [`InjectedError`] ([`IoErr::Injected`], ENOSPC or a
///   timeout); a failed operation changes nothing. Rates and kinds can be changed while the
///   device is in use ([`FaultBackend::set_error_rate`], [`FaultBackend::set_error_kind`]):
///   rate 1.0 is a device that fails everything from now on.
/// - **Delays**: each operation kind sleeps for its configured delay first; a *very slow
///   device* is a long delay on every kind ([`FaultBackend::set_slow`]), set or lifted at any
///   time.
/// - **Hang**: [`FaultBackend::hang`] makes operations of the given kinds block (before
///   touching the device) until [`FaultBackend::release`]; [`FaultBackend::hung`] says how many
///   are blocked. A hung device for timeout tests (see [`crate::TimeoutBackend`]).
/// - **Power cut**: with [`FaultConfig::track_power_cut`], [`FaultBackend::power_cut`] rewrites
///   the inner device so that blocks written since the last completed flush (and not by a FUA
///   write) are kept, reverted, or torn at 512-byte granularity; then every operation fails with
///   [`IoErr::PoweredOff`] until [`FaultBackend::revive`].
///
/// Errors, delays and hangs are *injection*: [`FaultBackend::set_faults`]`(false)` turns errors
/// and delays off (a hang stays until released).
#[derive(Debug)]
pub struct FaultBackend<B: Backend> {
    inner: B,
    cfg: FaultConfig,
    rng: AtomicU64,
    faults_on: AtomicBool,
    off: AtomicBool,
    tracker: Mutex<Tracker>,
    /// Error probability per kind (`f64` bits), delay per kind (ns), error kind per kind.
    rate: [AtomicU64; 5],
    delay: [AtomicU64; 5],
    kind: [AtomicU8; 5],
    /// Kinds that hang (bit per [`OpKind`]) and operations hung now.
    hang: Mutex<(u8, usize)>,
    hang_cv: Condvar,
    /// Operations that reached the inner device, per kind.
    reached: [AtomicU64; 5],
}

/// SplitMix64 finaliser: a well-mixed 64-bit hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl<B: Backend> FaultBackend<B> {
    /// Wraps `inner` with the given configuration. Faults are on; the device is powered.
    pub fn new(inner: B, cfg: FaultConfig) -> Self {
        FaultBackend {
            inner,
            rng: AtomicU64::new(mix(cfg.seed)),
            rate: cfg.error_rate.map(|p| AtomicU64::new(p.to_bits())),
            delay: cfg
                .delay
                .map(|d| AtomicU64::new(d.as_nanos().min(u64::MAX as u128) as u64)),
            kind: cfg.error_kind.map(|k| AtomicU8::new(k.code())),
            cfg,
            faults_on: AtomicBool::new(true),
            off: AtomicBool::new(false),
            tracker: Mutex::new(Tracker::default()),
            hang: Mutex::new((0, 0)),
            hang_cv: Condvar::new(),
            reached: Default::default(),
        }
    }

    /// Sets the error probability of one kind of operation, from now on.
    pub fn set_error_rate(&self, op: OpKind, p: f64) {
        self.rate[op.index()].store(p.to_bits(), Ordering::SeqCst);
    }

    /// Sets the error probability of every kind of operation (1.0: the device fails
    /// everything; 0.0: it works again).
    pub fn set_error_rate_all(&self, p: f64) {
        for op in OpKind::ALL {
            self.set_error_rate(op, p);
        }
    }

    /// Sets the error injected failures of one kind of operation return, from now on.
    pub fn set_error_kind(&self, op: OpKind, kind: InjectedError) {
        self.kind[op.index()].store(kind.code(), Ordering::SeqCst);
    }

    /// Sets the delay added before each operation of one kind, from now on.
    pub fn set_delay(&self, op: OpKind, d: Duration) {
        self.delay[op.index()].store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::SeqCst);
    }

    /// A very slow device: every operation waits `d` first (`Duration::ZERO`: normal again).
    pub fn set_slow(&self, d: Duration) {
        for op in OpKind::ALL {
            self.set_delay(op, d);
        }
    }

    /// Makes operations of the kinds in `ops` block before touching the device until
    /// [`FaultBackend::release`] (operations already past that point are not affected).
    pub fn hang(&self, ops: &[OpKind]) {
        let mut h = self.hang.lock().unwrap_or_else(|e| e.into_inner());
        for op in ops {
            h.0 |= op.bit();
        }
    }

    /// Lets every hung operation go on, and stops hanging new ones.
    pub fn release(&self) {
        let mut h = self.hang.lock().unwrap_or_else(|e| e.into_inner());
        h.0 = 0;
        self.hang_cv.notify_all();
    }

    /// Operations blocked by [`FaultBackend::hang`] now.
    pub fn hung(&self) -> usize {
        self.hang.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Operations of kind `op` that got past injection to the inner device so far.
    pub fn reached(&self, op: OpKind) -> u64 {
        self.reached[op.index()].load(Ordering::SeqCst)
    }

    /// The wrapped device (bypassing injection and tracking).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Unwraps the inner device, dropping any un-flushed tracking state.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// Turns error and delay injection on or off (power-cut tracking is not affected).
    pub fn set_faults(&self, on: bool) {
        self.faults_on.store(on, Ordering::SeqCst);
    }

    /// Number of blocks written since the last completed flush (tracked for power cut).
    pub fn unflushed_blocks(&self) -> usize {
        self.lock().saved.len()
    }

    /// Whether the device is off after a power cut.
    pub fn is_powered_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    /// Cuts the power: rewrites the inner device so that each block written since the last
    /// completed flush is kept or returned to its flushed content as `pattern` says, flushes the
    /// inner device, and refuses all IO with [`IoErr::PoweredOff`] until [`FaultBackend::revive`].
    ///
    /// Blocks covered by a completed flush or written with FUA are never changed. Returns an
    /// error when tracking is off or the inner device fails (the device is off either way).
    pub fn power_cut(&self, pattern: PowerCutPattern) -> Result<PowerCutReport, IoErr> {
        let mut t = self.lock();
        self.off.store(true, Ordering::SeqCst);
        if !self.cfg.track_power_cut {
            return Err(IoErr::Io {
                kind: std::io::ErrorKind::Unsupported,
                msg: "power cut needs FaultConfig::track_power_cut".into(),
            });
        }
        let mut report = PowerCutReport::default();
        let mut blocks: Vec<u64> = t.saved.keys().copied().collect();
        blocks.sort_unstable();
        for lba in blocks {
            let revert = match pattern {
                PowerCutPattern::KeepAll => false,
                PowerCutPattern::DropAll => true,
                PowerCutPattern::Torn(seed) => mix(mix(seed) ^ lba) & 1 == 1,
            };
            if revert {
                self.inner.write(lba, &t.saved[&lba], false)?;
                report.reverted += 1;
            } else {
                report.kept += 1;
            }
        }
        self.inner.flush()?;
        t.saved.clear();
        Ok(report)
    }

    /// Powers the device back on after [`FaultBackend::power_cut`].
    pub fn revive(&self) {
        self.off.store(false, Ordering::SeqCst);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies power state, hang, delay and error injection for one operation.
    fn gate(&self, op: OpKind) -> Result<(), IoErr> {
        if self.off.load(Ordering::SeqCst) {
            return Err(IoErr::PoweredOff);
        }
        {
            let mut h = self.hang.lock().unwrap_or_else(|e| e.into_inner());
            if h.0 & op.bit() != 0 {
                h.1 += 1;
                while h.0 & op.bit() != 0 {
                    h = self.hang_cv.wait(h).unwrap_or_else(|e| e.into_inner());
                }
                h.1 -= 1;
            }
        }
        if self.faults_on.load(Ordering::Relaxed) {
            let d = self.delay[op.index()].load(Ordering::Relaxed);
            if d > 0 {
                std::thread::sleep(Duration::from_nanos(d));
            }
            let p = f64::from_bits(self.rate[op.index()].load(Ordering::Relaxed));
            if p > 0.0 {
                let r = mix(self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed));
                let u = (r >> 11) as f64 / (1u64 << 53) as f64;
                if u < p {
                    let k = self.kind[op.index()].load(Ordering::Relaxed);
                    let kind = InjectedError::ALL[(k as usize).min(2)];
                    return Err(kind.error(op));
                }
            }
        }
        self.reached[op.index()].fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Runs a modifying operation on `lba .. lba + blocks`: captures the flushed content of
    /// blocks not yet saved, runs `f`, and forgets the blocks again when `fua` made them durable.
    fn tracked(
        &self,
        lba: u64,
        blocks: u64,
        fua: bool,
        f: impl FnOnce() -> Result<(), IoErr>,
    ) -> Result<(), IoErr> {
        if !self.cfg.track_power_cut {
            return f();
        }
        let mut t = self.lock();
        if self.off.load(Ordering::SeqCst) {
            return Err(IoErr::PoweredOff);
        }
        if !fua {
            // Read the old content of the longest runs of not-yet-saved blocks.
            let mut b = lba;
            while b < lba + blocks {
                if t.saved.contains_key(&b) {
                    b += 1;
                    continue;
                }
                let start = b;
                while b < lba + blocks && !t.saved.contains_key(&b) && b - start < 2048 {
                    b += 1;
                }
                let mut old = vec![0u8; (b - start) as usize * BLOCK];
                self.inner.read(start, &mut old)?;
                for (i, chunk) in old.chunks_exact(BLOCK).enumerate() {
                    t.saved.insert(start + i as u64, chunk.into());
                }
            }
        }
        let r = f();
        if fua && r.is_ok() {
            for b in lba..lba + blocks {
                t.saved.remove(&b);
            }
        }
        r
    }
}

/// Every IO goes through the fault gates and the power-cut tracking: synchronous only (an IO
/// submitted asynchronously runs these calls), no ring descriptor. Allocation queries get the
/// trait's default ("allocated"): an injected fault is not modelled for them.
impl<B: Backend> Backend for FaultBackend<B> {
    crate::forward_backend!(inner; blocks);
    crate::sync_only_backend!();

    fn name(&self) -> String {
        format!("fault({})", self.inner.name())
    }

    fn read(&self, lba: u64, buf: &mut [u8]) -> Result<(), IoErr> {
        self.gate(OpKind::Read)?;
        self.inner.read(lba, buf)
    }

    fn write(&self, lba: u64, buf: &[u8], fua: bool) -> Result<(), IoErr> {
        let n = check_bytes(lba, buf.len(), self.inner.blocks())?;
        self.gate(OpKind::Write)?;
        self.tracked(lba, n, fua, || self.inner.write(lba, buf, fua))
    }

    fn write_zeroes(&self, lba: u64, blocks: u64, fua: bool) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        self.gate(OpKind::WriteZeroes)?;
        self.tracked(lba, blocks, fua, || {
            self.inner.write_zeroes(lba, blocks, fua)
        })
    }

    fn trim(&self, lba: u64, blocks: u64) -> Result<(), IoErr> {
        check_blocks(lba, blocks, self.inner.blocks())?;
        self.gate(OpKind::Trim)?;
        self.tracked(lba, blocks, false, || self.inner.trim(lba, blocks))
    }

    fn flush(&self) -> Result<(), IoErr> {
        self.gate(OpKind::Flush)?;
        if !self.cfg.track_power_cut {
            return self.inner.flush();
        }
        // Writes hold the tracker lock for their whole duration, so holding it here makes
        // "completed before the flush" exact: nothing is in flight while the inner flush runs.
        let mut t = self.lock();
        if self.off.load(Ordering::SeqCst) {
            return Err(IoErr::PoweredOff);
        }
        self.inner.flush()?;
        t.saved.clear();
        Ok(())
    }
}
