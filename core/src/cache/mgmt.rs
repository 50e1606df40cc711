//! Management: cores, modes, IO classes, policy parameters, writeback and invalidation
//! commands. Each call either changes what it says or returns an error and changes nothing.
//! After a call that may start work (mode switch, writeback), the driver sends `Event::Tick`.

use super::{Cache, CoreState, FlushState, View};
use crate::mode::CacheMode;
use crate::policy::cutoff::SeqCutoff;
use crate::policy::ioclass::IoClassTable;
use crate::policy::{
    AcpParams, AlruParams, CleaningPolicy, CutoffParams, NhitParams, PromotionPolicy, RateParams,
};
use crate::stats::ReqCounters;
use crate::units::{CoreId, LineId};

/// Why a management call was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MgmtError {
    /// The core id is in use.
    CoreExists(CoreId),
    /// No such core.
    NoSuchCore(CoreId),
    /// The core id is out of range.
    BadCoreId(CoreId),
    /// The core is too large for this line size.
    CoreTooLarge {
        /// Core size in blocks.
        blocks: u64,
        /// Line size in force.
        line_size: crate::units::LineSize,
    },
    /// The cores of the cache together would have more lines than the mapping can name
    /// (`2^32 - 1`, see `map.rs`).
    CoresTooLarge {
        /// Lines the cores would have together.
        lines: u64,
        /// Line size in force.
        line_size: crate::units::LineSize,
    },
    /// The core has requests in flight or dirty data.
    Busy(String),
    /// Lazy modes are refused on a volatile cache device.
    VolatileLazy(CacheMode),
}

impl std::fmt::Display for MgmtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MgmtError::CoreExists(c) => write!(f, "core {} already exists in this cache", c.0),
            MgmtError::NoSuchCore(c) => write!(f, "no core {} in this cache", c.0),
            MgmtError::BadCoreId(c) => {
                write!(
                    f,
                    "core id {} is out of range (0-{})",
                    c.0,
                    crate::units::CORES_MAX - 2
                )
            }
            MgmtError::CoreTooLarge { blocks, line_size } => write!(
                f,
                "a core of {} bytes has more than 2^32 lines of {line_size}; use a larger line size",
                blocks * crate::units::BLOCK_BYTES
            ),
            MgmtError::CoresTooLarge { lines, line_size } => write!(
                f,
                "the cores of this cache would have {lines} lines of {line_size} together, more than the 2^32 - 1 one cache can map; use a larger line size ({})",
                larger_line_size(*lines, *line_size)
            ),
            MgmtError::Busy(why) => f.write_str(why),
            MgmtError::VolatileLazy(m) => write!(
                f,
                "mode {m} keeps dirty data and is refused on a volatile (ram:) cache device"
            ),
        }
    }
}

impl std::error::Error for MgmtError {}

/// The smallest line size at which `lines` lines of `line_size` fit the position space, named
/// for an error message.
fn larger_line_size(lines: u64, line_size: crate::units::LineSize) -> String {
    let bytes = lines.saturating_mul(line_size.bytes());
    [4u64, 8, 16, 32, 64]
        .iter()
        .map(|k| k * 1024)
        .find(|&b| bytes.div_ceil(b) < crate::map::POSITIONS)
        .map_or("even 64 KiB lines are not enough".into(), |b| {
            format!("{} KiB lines fit", b / 1024)
        })
}

impl Cache {
    /// Attaches core `core` of `size_blocks` blocks. Refused when the core has more than
    /// `2^32 - 1` lines, or when the cache's cores together would (the mapping gives each core a
    /// range of one 32-bit position space, see `map.rs`); the message names a line size that fits.
    pub fn add_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), MgmtError> {
        if core.0 as usize >= crate::units::CORES_MAX - 1 {
            return Err(MgmtError::BadCoreId(core));
        }
        if self.core(core).is_some() {
            return Err(MgmtError::CoreExists(core));
        }
        if size_blocks.div_ceil(self.bpl as u64) > u32::MAX as u64 {
            return Err(MgmtError::CoreTooLarge {
                blocks: size_blocks,
                line_size: self.cfg.line_size,
            });
        }
        let lines = size_blocks.div_ceil(self.bpl as u64);
        if !self.map.add_core(core, lines) {
            return Err(MgmtError::CoresTooLarge {
                lines: self.cores_lines() + lines,
                line_size: self.cfg.line_size,
            });
        }
        let i = core.0 as usize;
        if self.cores.len() <= i {
            self.cores.resize_with(i + 1, || None);
        }
        self.cores[i] = Some(CoreState {
            size_blocks,
            cutoff: SeqCutoff::new(CutoffParams::default()),
            counters: ReqCounters::default(),
            flush: FlushState::default(),
            record: None,
            dirty_lines: 0,
            faults: super::CoreFaults::default(),
        });
        self.tables_changed();
        Ok(())
    }

    /// Lines of every attached core together.
    fn cores_lines(&self) -> u64 {
        self.cores
            .iter()
            .flatten()
            .map(|c| c.size_blocks.div_ceil(self.bpl as u64))
            .sum()
    }

    /// Whether `core` has requests or writeback in flight. Requests parked for their group
    /// commit count, and the commit is asked for now (they are released within one commit).
    fn core_busy(&mut self, core: CoreId) -> bool {
        let parked = self.parked_on(core);
        if parked {
            self.commit_soon();
        }
        self.reqs.values().any(|r| r.core == core) || !self.jobs.is_empty() || parked
    }

    /// Lines mapped to `core`: (lines, dirty lines).
    pub fn core_lines(&self, core: CoreId) -> (u32, u32) {
        let mut n = 0;
        let mut d = 0;
        for l in 0..self.cfg.lines {
            let l = LineId(l);
            if self.map.is_mapped(l) && self.map.position(l).0 == core {
                n += 1;
                if self.state.dirty(l) != 0 {
                    d += 1;
                }
            }
        }
        (n, d)
    }

    /// Changes the recorded size of `core` (SPEC C22: the device grew or shrank). Growing is
    /// accepted unless the cores together would then have more than `2^32 - 1` lines. Shrinking is refused while requests or writeback are in flight, and when
    /// any cached line (clean or dirty) of the core lies past the new end: the cached data would
    /// name blocks the core no longer has. Requests see the new size at once; the core table
    /// records it with the next superblock.
    pub fn resize_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), MgmtError> {
        let Some(cs) = self.core(core) else {
            return Err(MgmtError::NoSuchCore(core));
        };
        let old = cs.size_blocks;
        if size_blocks == old {
            return Ok(());
        }
        if size_blocks.div_ceil(self.bpl as u64) > u32::MAX as u64 {
            return Err(MgmtError::CoreTooLarge {
                blocks: size_blocks,
                line_size: self.cfg.line_size,
            });
        }
        if size_blocks < old {
            if self.core_busy(core) {
                return Err(MgmtError::Busy(format!(
                    "core {} has IO in flight; retry the shrink",
                    core.0
                )));
            }
            let bpl = self.bpl as u64;
            for l in 0..self.cfg.lines {
                let l = LineId(l);
                if !self.map.is_mapped(l) {
                    continue;
                }
                let (c, cl) = self.map.position(l);
                if c == core && (cl + 1) * bpl > size_blocks {
                    let what = if self.state.dirty(l) != 0 {
                        "dirty data"
                    } else {
                        "cached data"
                    };
                    return Err(MgmtError::Busy(format!(
                        "core {} shrank to {} bytes but the cache holds {what} at byte {}; the shrink is refused (grow the device back, or write back and invalidate the core first)",
                        core.0,
                        size_blocks * 512,
                        cl * bpl * 512
                    )));
                }
            }
        }
        let lines = size_blocks.div_ceil(self.bpl as u64);
        if !self.map.resize_core(core, lines) {
            let old_lines = old.div_ceil(self.bpl as u64);
            return Err(MgmtError::CoresTooLarge {
                lines: self.cores_lines() - old_lines + lines,
                line_size: self.cfg.line_size,
            });
        }
        if let Some(c) = self.cores[core.0 as usize].as_mut() {
            c.size_blocks = size_blocks;
        }
        self.tables_changed();
        Ok(())
    }

    /// `core` exists and has no IO in flight (what removing or invalidating it needs).
    fn idle_core(&mut self, core: CoreId) -> Result<(), MgmtError> {
        if self.core(core).is_none() {
            return Err(MgmtError::NoSuchCore(core));
        }
        if self.core_busy(core) {
            return Err(MgmtError::Busy(format!(
                "core {} has IO in flight; retry",
                core.0
            )));
        }
        Ok(())
    }

    /// Detaches `core`. Refused while it has dirty data or IO in flight (write it back first).
    pub fn remove_core(&mut self, core: CoreId) -> Result<(), MgmtError> {
        self.idle_core(core)?;
        let (_, dirty) = self.core_lines(core);
        if dirty > 0 {
            return Err(MgmtError::Busy(format!(
                "core {} has {dirty} dirty lines; run writeback first",
                core.0
            )));
        }
        self.invalidate_core(core).expect("checked");
        self.map.remove_core(core);
        self.cores[core.0 as usize] = None;
        self.tables_changed();
        Ok(())
    }

    /// Drops everything the cache holds for `core`, dirty data included. Returns (lines,
    /// dirty blocks) dropped. Refused while the core has IO in flight.
    pub fn invalidate_core(&mut self, core: CoreId) -> Result<(u32, u64), MgmtError> {
        self.idle_core(core)?;
        let mut lines = 0;
        let mut dirty_blocks = 0u64;
        for l in 0..self.cfg.lines {
            let l = LineId(l);
            if !self.map.is_mapped(l) || self.map.position(l).0 != core {
                continue;
            }
            let d = self.state.dirty(l);
            if d != 0 {
                dirty_blocks += d.count_ones() as u64;
                // Dropping dirty data is what the caller asked for.
                self.note_clean(l);
                let v = self.state.valid(l);
                self.state.set(&mut self.lists, l, v, 0);
                self.meta_note(l);
                let (c, cl) = self.map.position(l);
                let class = self.lists.class(l);
                self.eviction.insert(
                    &mut self.lists,
                    l,
                    class,
                    crate::policy::position_key(c, cl),
                );
            }
            self.free_line(l);
            lines += 1;
        }
        Ok((lines, dirty_blocks))
    }

    /// Switches mode. Leaving a lazy mode with dirty data: writes follow the new mode at once,
    /// every dirty line is written back, then the switch completes ([`Cache::target_mode`]).
    pub fn set_mode(&mut self, mode: CacheMode) -> Result<(), MgmtError> {
        if mode.is_lazy() && self.cfg.volatile {
            return Err(MgmtError::VolatileLazy(mode));
        }
        let cur = self.target_mode.unwrap_or(self.mode);
        if self.mode.is_lazy() && !mode.is_lazy() && (self.dirty_lines > 0 || !self.jobs.is_empty())
        {
            self.target_mode = Some(mode);
        } else {
            let _ = cur;
            self.mode = mode;
            self.target_mode = None;
        }
        self.tables_changed();
        Ok(())
    }

    /// Loads a new IO class table. Lines keep their class ids; a line whose class vanished is
    /// treated as least important with no cap until it is reclassified by a hit.
    pub fn load_io_classes(&mut self, table: IoClassTable) {
        self.classes = table;
        self.rebuild_evict_order();
        self.tables_changed();
    }

    /// Sequential cutoff parameters of `core`.
    pub fn set_cutoff(&mut self, core: CoreId, p: CutoffParams) -> Result<(), MgmtError> {
        let c = self
            .cores
            .get_mut(core.0 as usize)
            .and_then(|c| c.as_mut())
            .ok_or(MgmtError::NoSuchCore(core))?;
        c.cutoff.set_params(p);
        self.tables_changed();
        Ok(())
    }

    /// Replaces the promotion policy.
    pub fn set_promotion(&mut self, which: PromotionPolicy, nhit: NhitParams) {
        self.cfg.promotion = which;
        self.cfg.nhit = nhit;
        self.promotion = crate::policy::promotion::build(which, nhit, self.cfg.lines);
        self.tables_changed();
    }

    /// Replaces the cleaning policy (dirty lines move to the new policy's lists).
    pub fn set_cleaning(&mut self, which: CleaningPolicy, alru: AlruParams, acp: AcpParams) {
        let mut moved = Vec::new();
        for l in 0..self.cfg.lines {
            let l = LineId(l);
            if self.state.dirty(l) != 0 && self.lists.is_linked(l.0) {
                self.cleaning.on_clean(
                    &mut self.lists,
                    l,
                    &View {
                        map: &self.map,
                        locks: &self.locks,
                    },
                );
                moved.push(l);
            }
        }
        self.cfg.cleaning = which;
        self.cfg.alru = alru;
        self.cfg.acp = acp;
        self.cleaning = crate::policy::cleaning::build(which, alru, acp, &mut self.lists, self.bpl);
        for l in moved {
            let view = View {
                map: &self.map,
                locks: &self.locks,
            };
            self.cleaning.on_dirty(&mut self.lists, l, self.now, &view);
        }
        self.cleaner_next = self.now;
        self.tables_changed();
    }

    /// Rate controller parameters.
    pub fn set_rate(&mut self, p: RateParams) {
        self.cfg.rate = p;
        self.rate.set_params(p);
        self.tables_changed();
    }

    /// Writes back every dirty line, regardless of the cleaning policy. Progress:
    /// [`Cache::dirty_lines`] falls to 0; [`Cache::writeback_running`] turns false.
    pub fn start_writeback(&mut self) {
        if self.dirty_lines > 0 {
            self.force_clean = true;
        }
    }

    /// Ends what [`Cache::start_writeback`] started: the lines no longer have to be written back
    /// regardless of the cleaning policy (jobs already running finish). Returns whether a
    /// writeback was running.
    pub fn cancel_writeback(&mut self) -> bool {
        std::mem::take(&mut self.force_clean)
    }

    /// A `writeback` command is running.
    pub fn writeback_running(&self) -> bool {
        self.force_clean
    }
}

impl Cache {
    /// Puts a line back as it was: maps `core_line` of `core` with the given valid and dirty
    /// blocks and IO class, bypassing promotion and eviction. Used when loading a cache from
    /// its metadata (and by benchmarks that need a full cache quickly). Only while idle.
    pub fn restore_line(
        &mut self,
        core: CoreId,
        core_line: u64,
        valid: u128,
        dirty: u128,
        class: u8,
    ) -> Result<LineId, String> {
        let Some(l) = self.lists.back(self.free) else {
            return Err("more lines than the cache holds".into());
        };
        self.restore_at(LineId(l), core, core_line, valid, dirty, class)?;
        Ok(LineId(l))
    }

    /// Puts `line` back exactly as the persistent metadata says: the same slot, so the data
    /// on the cache device is found where it was written. Loading only.
    pub(crate) fn restore_at(
        &mut self,
        line: LineId,
        core: CoreId,
        core_line: u64,
        valid: u128,
        dirty: u128,
        class: u8,
    ) -> Result<(), String> {
        let Some(cs) = self.core(core) else {
            return Err(format!(
                "it names core {}, which is not in the core table",
                core.0
            ));
        };
        // Lines of the core, by shift: a division here was a fifth of this function's time in
        // a 16M-line load.
        let core_lines =
            (cs.size_blocks >> self.shift) + u64::from(cs.size_blocks & (self.bpl as u64 - 1) != 0);
        if core_line >= core_lines {
            return Err(format!(
                "core line {core_line} is past the end of core {}",
                core.0
            ));
        }
        let full = crate::units::full_mask(self.bpl);
        if valid & !full != 0 || dirty & !valid != 0 || valid == 0 {
            return Err(format!("bad block masks for core line {core_line}"));
        }
        if class as usize >= crate::policy::IO_CLASSES_MAX {
            return Err(format!("IO class {class} out of range"));
        }
        if line.0 >= self.cfg.lines || self.map.is_mapped(line) {
            return Err(format!("line {} is out of range or mapped twice", line.0));
        }
        if !self.map.insert_checked(line, core, core_line) {
            return Err(format!(
                "core line {core_line} of core {} is mapped twice",
                core.0
            ));
        }
        self.lists.unlink(line.0);
        self.state.set(&mut self.lists, line, valid, dirty);
        self.lists.set_class(line, class);
        self.class_lines[class as usize] += 1;
        if dirty != 0 {
            // Persistent metadata names this dirty line (without persistence the flag is unused).
            self.lists.set_durable_dirty(line, self.meta.is_some());
            self.count_dirty(line, true);
            let view = View {
                map: &self.map,
                locks: &self.locks,
            };
            self.cleaning
                .on_dirty(&mut self.lists, line, self.now, &view);
        } else {
            let key = crate::policy::position_key(core, core_line);
            self.eviction.insert(&mut self.lists, line, class, key);
        }
        Ok(())
    }
}
