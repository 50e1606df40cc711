//! The configuration and core table as persistent records: the mapping between the core's
//! types and `tiercache-format`'s codes, both ways.

use super::{Cache, CoreRecord};
use crate::config::Config;
use crate::mode::CacheMode;
use crate::policy::ioclass::IoClassTable;
use crate::policy::{
    AcpParams, AlruParams, CleaningPolicy, CutoffParams, CutoffPolicy, EvictionPolicy, NhitParams,
    PromotionPolicy, RateParams,
};
use crate::units::CoreId;
use tiercache_format::tables::{ConfigRecord, CoreEntry, CoreIdentity};

const MODES: [CacheMode; 6] = [
    CacheMode::Wt,
    CacheMode::Wb,
    CacheMode::Wa,
    CacheMode::Wi,
    CacheMode::Pt,
    CacheMode::Wo,
];

fn mode_code(m: CacheMode) -> u8 {
    MODES
        .iter()
        .position(|&x| x == m)
        .expect("every mode has a code") as u8
        + 1
}

fn cutoff_code(p: CutoffPolicy) -> u8 {
    match p {
        CutoffPolicy::Always => 1,
        CutoffPolicy::Full => 2,
        CutoffPolicy::Never => 3,
    }
}

impl Cache {
    /// The configuration as a persistent record (the mode recorded is the one reads follow; a
    /// switch still writing back is recorded when it completes).
    pub(crate) fn config_record(&self) -> ConfigRecord {
        let c = &self.cfg;
        ConfigRecord {
            mode: mode_code(self.mode),
            eviction: match c.eviction {
                EvictionPolicy::Lru => 1,
                EvictionPolicy::S3Fifo => 2,
            },
            promotion: (
                match c.promotion {
                    PromotionPolicy::Always => 1,
                    PromotionPolicy::Nhit => 2,
                },
                c.nhit.threshold,
                c.nhit.trigger_pct.min(100) as u8,
            ),
            cleaning: match c.cleaning {
                CleaningPolicy::Alru => 1,
                CleaningPolicy::Acp => 2,
                CleaningPolicy::Nop => 3,
            },
            alru: [
                c.alru.wake_up_s,
                c.alru.staleness_time_s,
                c.alru.flush_max_buffers,
                c.alru.activity_threshold_ms,
            ],
            acp: [c.acp.wake_up_ms, c.acp.flush_max_buffers],
            rate: (
                c.rate.enabled,
                c.rate.dirty_target_pct.min(100) as u8,
                c.rate.throttle_max_ms,
            ),
            io_classes_csv: self.classes.to_csv(),
        }
    }

    /// The core table as persistent records.
    pub(crate) fn core_entries(&self) -> Vec<CoreEntry> {
        let mut out = Vec::new();
        for (i, c) in self.cores.iter().enumerate() {
            let Some(c) = c else { continue };
            let p = c.cutoff.params();
            let (identity, export_name, device) = match &c.record {
                Some(r) => (r.identity.clone(), r.export_name.clone(), r.device.clone()),
                None => (
                    CoreIdentity::Nbd { uri: String::new() },
                    String::new(),
                    String::new(),
                ),
            };
            out.push(CoreEntry {
                id: i as u8,
                size_blocks: c.size_blocks,
                identity,
                export_name,
                cutoff: (cutoff_code(p.policy), p.threshold_bytes, p.promotion_count),
                device,
            });
        }
        out
    }

    /// Records a core's identity and export name in the core table (written with the next
    /// superblock; wait for [`Cache::tables_durable`]).
    pub fn set_core_record(&mut self, core: CoreId, record: CoreRecord) -> Result<(), String> {
        let c = self
            .cores
            .get_mut(core.0 as usize)
            .and_then(|c| c.as_mut())
            .ok_or_else(|| format!("no core {}", core.0))?;
        c.record = Some(record);
        self.tables_changed();
        Ok(())
    }

    /// The core table entry of `core` as recorded (identity, export name), if set.
    pub fn core_record(&self, core: CoreId) -> Option<&CoreRecord> {
        self.core(core).and_then(|c| c.record.as_ref())
    }
}

/// Applies a stored configuration record to `cfg`; returns the IO class table it names.
/// Every code and value is checked: a record that decodes but says something impossible is
/// refused with what is wrong.
pub(crate) fn apply_config_record(
    cfg: &mut Config,
    r: &ConfigRecord,
) -> Result<IoClassTable, String> {
    cfg.mode = *MODES
        .get((r.mode as usize).wrapping_sub(1))
        .ok_or_else(|| format!("mode code {}", r.mode))?;
    cfg.eviction = match r.eviction {
        1 => EvictionPolicy::Lru,
        2 => EvictionPolicy::S3Fifo,
        e => return Err(format!("eviction code {e}")),
    };
    cfg.promotion = match r.promotion.0 {
        1 => PromotionPolicy::Always,
        2 => PromotionPolicy::Nhit,
        p => return Err(format!("promotion code {p}")),
    };
    cfg.nhit = NhitParams {
        threshold: r.promotion.1,
        trigger_pct: r.promotion.2 as u32,
    };
    cfg.cleaning = match r.cleaning {
        1 => CleaningPolicy::Alru,
        2 => CleaningPolicy::Acp,
        3 => CleaningPolicy::Nop,
        c => return Err(format!("cleaning code {c}")),
    };
    cfg.alru = AlruParams {
        wake_up_s: r.alru[0],
        staleness_time_s: r.alru[1],
        flush_max_buffers: r.alru[2],
        activity_threshold_ms: r.alru[3],
    };
    cfg.acp = AcpParams {
        wake_up_ms: r.acp[0],
        flush_max_buffers: r.acp[1],
    };
    cfg.rate = RateParams {
        enabled: r.rate.0,
        dirty_target_pct: r.rate.1 as u32,
        throttle_max_ms: r.rate.2,
    };
    IoClassTable::parse_csv(&r.io_classes_csv).map_err(|e| format!("IO classes: {e}"))
}

/// The cutoff parameters a core entry records.
pub(crate) fn cutoff_params(e: &CoreEntry) -> Result<CutoffParams, String> {
    Ok(CutoffParams {
        policy: match e.cutoff.0 {
            1 => CutoffPolicy::Always,
            2 => CutoffPolicy::Full,
            3 => CutoffPolicy::Never,
            c => return Err(format!("cutoff code {c} of core {}", e.id)),
        },
        threshold_bytes: e.cutoff.1,
        promotion_count: e.cutoff.2,
    })
}
