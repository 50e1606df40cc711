//! [`Machine`]: the state machine a cache runs — the Open CAS-style [`Cache`] (modes `wt`, `wb`,
//! `wa`, `wi`, `pt`, `wo`) or the [`WriteLog`] (mode `wl`) — behind one driver contract, so
//! that the engine, the simulator and the daemon drive either the same way.

use crate::cache::{Cache, CoreRecord, Health};
use crate::event::{Action, Event};
use crate::units::{CoreId, IoId, Lba, Nanos, ReqId};
use crate::wl::WriteLog;

/// A cache's state machine.
pub enum Machine {
    /// Modes `wt`, `wb`, `wa`, `wi`, `pt`, `wo`.
    Cache(Box<Cache>),
    /// Mode `wl`.
    Wl(Box<WriteLog>),
}

impl Machine {
    /// Applies one event (see [`Cache::apply`] and [`WriteLog::apply`]); `data_crc(req)` must
    /// return the CRC32C of client write `req`'s data (asked only in mode `wl`).
    pub fn apply(
        &mut self,
        now: Nanos,
        event: Event,
        actions: &mut Vec<Action>,
        data_crc: &mut dyn FnMut(ReqId) -> u32,
    ) {
        match self {
            Machine::Cache(c) => c.apply(now, event, actions),
            Machine::Wl(w) => w.apply(now, event, actions, data_crc),
        }
    }

    /// See [`Cache::read_hint`] (a write log gives no hint).
    #[inline]
    pub fn read_hint(&self, core: CoreId, lba: Lba, blocks: u32, hint: impl FnOnce(Lba, u32)) {
        if let Machine::Cache(c) = self {
            c.read_hint(core, lba, blocks, hint);
        }
    }

    /// The earliest time the machine wants a tick.
    pub fn next_deadline(&self) -> Option<Nanos> {
        match self {
            Machine::Cache(c) => c.next_deadline(),
            Machine::Wl(w) => w.next_deadline(),
        }
    }

    /// See [`Cache::take_deadline_moved`] (the write log's read cache's, in mode `wl`).
    pub fn take_deadline_moved(&mut self) -> bool {
        self.cache_mut().take_deadline_moved()
    }

    /// The bytes of a metadata buffer named by an action.
    pub fn meta_buf(&self, id: u32) -> &[u8] {
        match self {
            Machine::Cache(c) => c.meta_buf(id),
            Machine::Wl(w) => w.meta_buf(id),
        }
    }

    /// Whether IO `io` (in flight) is writeback's (cleaning reads of the cache, writes and
    /// flushes of cores), which a driver may run behind client requests' IOs. The write log's
    /// writeback goes to RBD cores through their own asynchronous path and is not told apart.
    pub fn is_writeback_io(&self, io: IoId) -> bool {
        match self {
            Machine::Cache(c) => c.is_writeback_io(io),
            Machine::Wl(_) => false,
        }
    }

    /// Staging slots the driver allocates, and blocks per slot.
    pub fn pool(&self) -> (u32, u32) {
        match self {
            Machine::Cache(c) => (c.config().pool_slots, c.config().pool_slot_blocks),
            Machine::Wl(w) => (w.pool_slots(), w.pool_slot_blocks()),
        }
    }

    /// Whether it serves requests.
    pub fn is_ready(&self) -> bool {
        match self {
            Machine::Cache(c) => c.is_ready(),
            Machine::Wl(w) => w.is_ready(),
        }
    }

    /// Whether every table change is durable.
    pub fn tables_durable(&self) -> bool {
        match self {
            Machine::Cache(c) => c.tables_durable(),
            Machine::Wl(w) => w.tables_durable(),
        }
    }

    /// Begins a clean stop.
    pub fn stop(&mut self) {
        match self {
            Machine::Cache(c) => c.stop(),
            Machine::Wl(w) => w.stop(),
        }
    }

    /// Whether a clean stop has completed.
    pub fn is_stopped(&self) -> bool {
        match self {
            Machine::Cache(c) => c.is_stopped(),
            Machine::Wl(w) => w.is_stopped(),
        }
    }

    /// Attaches a core.
    pub fn add_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), String> {
        match self {
            Machine::Cache(c) => c.add_core(core, size_blocks).map_err(|e| e.to_string()),
            Machine::Wl(w) => w.add_core(core, size_blocks),
        }
    }

    /// Records a core's identity and export name.
    pub fn set_core_record(&mut self, core: CoreId, record: CoreRecord) -> Result<(), String> {
        match self {
            Machine::Cache(c) => c.set_core_record(core, record),
            Machine::Wl(w) => w.set_core_record(core, record),
        }
    }

    /// Detaches a core.
    pub fn remove_core(&mut self, core: CoreId) -> Result<(), String> {
        match self {
            Machine::Cache(c) => c.remove_core(core).map_err(|e| e.to_string()),
            Machine::Wl(w) => w.remove_core(core),
        }
    }

    /// Records a core's new size.
    pub fn resize_core(&mut self, core: CoreId, size_blocks: u64) -> Result<(), String> {
        match self {
            Machine::Cache(c) => c.resize_core(core, size_blocks).map_err(|e| e.to_string()),
            Machine::Wl(w) => w.resize_core(core, size_blocks),
        }
    }

    /// The Open CAS-style cache: the cache itself, or a write log's read cache (for
    /// statistics, policies and records; writes and mode changes of a `wl` cache go through
    /// [`Machine::wl`]).
    pub fn cache(&self) -> &Cache {
        match self {
            Machine::Cache(c) => c,
            Machine::Wl(w) => w.read_cache(),
        }
    }

    /// [`Machine::cache`], mutable.
    pub fn cache_mut(&mut self) -> &mut Cache {
        match self {
            Machine::Cache(c) => c,
            Machine::Wl(w) => w.read_cache_mut(),
        }
    }

    /// The health of the cache (see [`Cache::health`] and, for `wl`, [`WriteLog::health`]:
    /// the log device too).
    pub fn health(&self) -> Health {
        match self {
            Machine::Cache(c) => c.health(),
            Machine::Wl(w) => w.health(),
        }
    }

    /// The health of one core (`None`: no such core).
    pub fn core_health(&self, core: CoreId) -> Option<Health> {
        match self {
            Machine::Cache(c) => c.core_health(core),
            Machine::Wl(w) => w.core_health(core),
        }
    }

    /// Whether any problem is open (cheap).
    pub fn is_degraded(&self) -> bool {
        match self {
            Machine::Cache(c) => c.is_degraded(),
            Machine::Wl(w) => w.is_degraded(),
        }
    }

    /// The write log, in mode `wl`.
    pub fn wl(&self) -> Option<&WriteLog> {
        match self {
            Machine::Wl(w) => Some(w),
            Machine::Cache(_) => None,
        }
    }

    /// The write log, mutable.
    pub fn wl_mut(&mut self) -> Option<&mut WriteLog> {
        match self {
            Machine::Wl(w) => Some(w),
            Machine::Cache(_) => None,
        }
    }
}
