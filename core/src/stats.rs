//! Counters: what the cache did, per core and per IO class, plus cache-wide writeback and
//! coverage counters. Plain integers updated by the single owner; the engine snapshots them.
//!
//! The request categories follow Open CAS: a *full hit* had every block it touched valid in
//! the cache; a *partial hit* had some; a *miss* had none; *pass-through* requests bypassed the
//! cache (sequential cutoff, mode `pt`, class allocation 0, promotion declined, no line free).

/// Request outcome counters for one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounters {
    /// Every block valid in the cache.
    pub full_hit: u64,
    /// Some blocks valid.
    pub partial_hit: u64,
    /// No block valid, request went through the cache (inserted or not).
    pub miss: u64,
    /// Bypassed the cache.
    pub pass_through: u64,
}

impl OpCounters {
    /// All requests counted.
    pub fn total(&self) -> u64 {
        self.full_hit + self.partial_hit + self.miss + self.pass_through
    }
}

/// How a request was classified for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every block valid.
    FullHit,
    /// Some blocks valid.
    PartialHit,
    /// None valid.
    Miss,
    /// Bypassed.
    PassThrough,
}

impl OpCounters {
    /// Counts one request.
    pub fn count(&mut self, o: Outcome) {
        match o {
            Outcome::FullHit => self.full_hit += 1,
            Outcome::PartialHit => self.partial_hit += 1,
            Outcome::Miss => self.miss += 1,
            Outcome::PassThrough => self.pass_through += 1,
        }
    }
}

/// Counters for a core or an IO class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReqCounters {
    /// Reads.
    pub read: OpCounters,
    /// Writes (including write-zeroes).
    pub write: OpCounters,
    /// Trims.
    pub trims: u64,
    /// Flushes.
    pub flushes: u64,
    /// Blocks read by clients.
    pub blocks_read: u64,
    /// Blocks written by clients.
    pub blocks_written: u64,
    /// Requests completed with an error.
    pub errors: u64,
}

/// Cache-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Blocks read from the cache device.
    pub cache_blocks_read: u64,
    /// Blocks written to the cache device.
    pub cache_blocks_written: u64,
    /// Blocks read from core devices.
    pub core_blocks_read: u64,
    /// Blocks written to core devices (clients and writeback).
    pub core_blocks_written: u64,
    /// Cache device IO errors.
    pub cache_errors: u64,
    /// Core device IO errors.
    pub core_errors: u64,
    /// Lines evicted.
    pub evictions: u64,
    /// Lines evicted that had been dirty at some point since they were mapped.
    pub evictions_formerly_dirty: u64,
    /// Lines written back and made clean.
    pub writeback_lines: u64,
    /// Blocks written back.
    pub writeback_blocks: u64,
    /// Writeback core writes issued.
    pub writeback_ios: u64,
    /// Writeback attempts that failed (the lines stay dirty and are retried).
    pub writeback_errors: u64,
    /// Client writes that landed on a line while it was being written back.
    pub writeback_races: u64,
    /// Client writes delayed by the rate controller.
    pub throttled_writes: u64,
    /// Total delay imposed by the rate controller, ns.
    pub throttle_ns: u64,
    /// Requests that waited for a line lock ("deferred" in Open CAS).
    pub deferred: u64,
    /// Allocation attempts that found no line (request went pass-through).
    pub alloc_failures: u64,
    /// Reads whose core blocks came in pieces, read from the core as one span with the
    /// cache's blocks laid over it afterwards.
    pub merged_core_reads: u64,
}
