//! Creating a write log, and opening one a scan recovered.

use super::entry::{EState, Entry};
use super::index::{Index, Src};
use super::recovery::Recovered;
use super::stats::WlCounters;
use super::{MgmtFlushState, WlConfig, WriteLog, ZERO_BLOCKS};
use crate::cache::Cache;
use crate::cache::DeviceErrors;
use crate::mode::CacheMode;
use crate::units::{CoreId, Nanos};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use tiercache_format::wlog::{LOG_BLOCK, LogKind};

impl WriteLog {
    fn new_empty(mut cfg: WlConfig, inner: Option<Cache>) -> Result<WriteLog, String> {
        let inner = match inner {
            Some(c) => {
                if c.mode() != CacheMode::Wa {
                    return Err("a write log's read cache must be in mode wa".into());
                }
                cfg.read_cache = c.config().clone();
                c
            }
            None => {
                cfg.read_cache.mode = CacheMode::Wa;
                Cache::new(cfg.read_cache.clone())?
            }
        };
        cfg.validate()?;
        let inner_slots = inner.config().pool_slots;
        let free_slots = (inner_slots..inner_slots + cfg.staging_slots)
            .rev()
            .collect();
        Ok(WriteLog {
            events_applied: 0,
            inner,
            now: Nanos(0),
            epoch: 1,
            ready: false,
            entries: VecDeque::new(),
            index: Index::default(),
            next_seq: 1,
            open_gen: 1,
            open_gen_writes: 0,
            open_gen_blocks: 0,
            head_pos: 0,
            sb_tail_pos: 0,
            sb_tail_seq: 0,
            gen_gate_seq: 0,
            sb_gen: 0,
            sb_copy: 1,
            sb_buf: [0; LOG_BLOCK],
            sb_in_flight: false,
            sb_due: None,
            pins: BTreeMap::new(),
            writing: BTreeSet::new(),
            unacked: BTreeMap::new(),
            pending: VecDeque::new(),
            not_ready: VecDeque::new(),
            flush_waiters: Vec::new(),
            log_writes_done: 0,
            durable_upto: 0,
            durable_seq: 0,
            flush_in_flight: false,
            ios: Vec::new(),
            free_ios: Vec::new(),
            hdr_bufs: Vec::new(),
            free_hdr: Vec::new(),
            reads: HashMap::new(),
            wb_ops: HashMap::new(),
            next_op: 0,
            free_slots,
            slot_refs: vec![0; cfg.staging_slots as usize],
            inner_slots,
            wb_batches: HashMap::new(),
            next_batch: 0,
            wb_flushes_left: 0,
            wb_flushing: false,
            wb_flush_upto: None,
            wb_done_upto: 0,
            space_waiting: false,
            wb_retry_at: None,
            void_retry_at: None,
            inner_events: VecDeque::new(),
            inner_actions: Vec::new(),
            zero: vec![0; ZERO_BLOCKS as usize * 512],
            counters: WlCounters::default(),
            issued_log: Vec::new(),
            cores: Vec::new(),
            create_second_copy: false,
            wb_partial: None,
            failed_entries: BTreeSet::new(),
            wb_flush_failed: false,
            stopping: false,
            stop_flush: MgmtFlushState::No,
            invalidating: BTreeSet::new(),
            inv_seqs: BTreeSet::new(),
            inv_flush: MgmtFlushState::Done,
            wb_paused: false,
            last_request: Nanos(0),
            draining: false,
            wb_cursor: 0,
            wb_active: BTreeSet::new(),
            wb_ranges: BTreeMap::new(),
            wb_max_blocks: 0,
            invalidated_blocks: 0,
            log_device: DeviceErrors::default(),
            log_failing: None,
            log_episodes: 0,
            cfg,
        })
    }

    /// A new, empty write log. It writes both superblock copies before it serves (requests
    /// that arrive earlier wait).
    pub fn create(cfg: WlConfig) -> Result<WriteLog, String> {
        let mut wl = WriteLog::new_empty(cfg, None)?;
        // Copy 0 first, then copy 1, both carrying the tail of an empty log.
        wl.sb_copy = 1;
        wl.sb_due = Some((0, 1));
        wl.create_second_copy = true;
        Ok(wl)
    }

    /// A write log recovered by [`scan`]: every entry found is kept for writeback; a
    /// superblock with a new epoch is written before anything is served.
    pub fn open(cfg: WlConfig, rec: Recovered) -> Result<WriteLog, String> {
        WriteLog::open_with(cfg, None, rec)
    }

    /// [`WriteLog::open`] with a read cache loaded from the cache device (its configuration
    /// replaces `cfg.read_cache`; the cores it records are the log's cores).
    pub fn open_loaded(cfg: WlConfig, inner: Cache, rec: Recovered) -> Result<WriteLog, String> {
        WriteLog::open_with(cfg, Some(inner), rec)
    }

    fn open_with(cfg: WlConfig, inner: Option<Cache>, rec: Recovered) -> Result<WriteLog, String> {
        let mut wl = WriteLog::new_empty(cfg, inner)?;
        for i in 0..=u8::MAX as u16 {
            if let Some(c) = wl.inner.core(CoreId(i)) {
                let size = c.size_blocks;
                if wl.cores.len() <= i as usize {
                    wl.cores.resize(i as usize + 1, None);
                }
                wl.cores[i as usize] = Some(size);
            }
        }
        if rec.sb.cache_id != wl.cfg.cache_id || rec.sb.ring_blocks != wl.cfg.ring_blocks() {
            return Err("the write log on this device belongs to another cache or geometry".into());
        }
        wl.epoch = rec.sb.epoch + 1;
        // What the last run knew durable stays so (the scan found all of it).
        wl.durable_seq = rec.sb.durable_seq.max(rec.sb.tail_seq);
        wl.sb_gen = rec.sb.sb_gen;
        wl.sb_copy = rec.sb_copy;
        wl.sb_tail_pos = rec.sb.tail_pos;
        wl.sb_tail_seq = rec.sb.tail_seq;
        let mut pos = rec.sb.tail_pos;
        let mut last_gen = rec.sb.tail_gen;
        let mut next_seq = rec.sb.tail_seq;
        for h in &rec.entries {
            let e = Entry {
                seq: h.seq,
                gen_: h.gen_,
                kind: h.kind,
                core: h.core,
                lba: h.lba,
                blocks: h.blocks,
                pos,
                state: EState::Logged,
                req: None,
                hdr_buf: None,
                at: Nanos(0),
            };
            if matches!(h.kind, LogKind::Write | LogKind::Trim | LogKind::Zero) {
                let src = if h.kind == LogKind::Write {
                    Src::Log { data_pos: pos + 1 }
                } else {
                    Src::Zero
                };
                wl.index
                    .insert(h.core, h.lba, h.lba + h.blocks as u64, h.seq, pos, src);
            }
            pos += e.span();
            last_gen = last_gen.max(h.gen_);
            next_seq = h.seq + 1;
            wl.entries.push_back(e);
        }
        debug_assert_eq!(pos, rec.head_pos);
        wl.head_pos = rec.head_pos;
        wl.next_seq = next_seq;
        wl.open_gen = last_gen + 1;
        let (tp, ts) = (rec.sb.tail_pos, rec.sb.tail_seq);
        wl.sb_due = Some((tp, ts));
        Ok(wl)
    }
}
