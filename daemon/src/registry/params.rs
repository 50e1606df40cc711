//! `set-param` / `get-param`: parameter groups, their values' parsing and their display.

use super::*;

/// The sequential cutoff parameters of `values` applied to `p`.
pub fn apply_cutoff(
    mut p: CutoffParams,
    values: &[(String, String)],
) -> Result<CutoffParams, String> {
    for (k, v) in values {
        match k.as_str() {
            "policy" => {
                p.policy = CutoffPolicy::parse(v).ok_or_else(|| {
                    format!("seq-cutoff policy '{v}' (want {})", CutoffPolicy::one_of())
                })?
            }
            // A bare number is KiB, as casadm's `-t`; a suffix says the unit.
            "threshold" if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
                p.threshold_bytes = v
                    .parse::<u64>()
                    .ok()
                    .and_then(|k| k.checked_mul(1024))
                    .ok_or_else(|| format!("threshold '{v}' is too large"))?
            }
            "threshold" => p.threshold_bytes = crate::device::parse_size(v)?,
            "promotion-count" => p.promotion_count = num(k, v, 1, 65535)?,
            _ => {
                return Err(unknown(
                    k,
                    "seq-cutoff",
                    "policy, threshold, promotion-count",
                ));
            }
        }
    }
    Ok(p)
}

pub(crate) fn num(k: &str, v: &str, lo: u32, hi: u32) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (lo..=hi).contains(n))
        .ok_or_else(|| format!("{k} = '{v}': want a whole number from {lo} to {hi}"))
}

/// A time parameter counted in `unit` (a second or a millisecond): `v` with a unit (`30s`,
/// `1m`, `500ms`, as `get-param` prints it) or a bare number of `unit`; a whole number of
/// `unit` from `lo` to `hi`.
pub(super) fn time(k: &str, v: &str, unit: Duration, lo: u32, hi: u32) -> Result<u32, String> {
    let per = unit.as_nanos().max(1);
    crate::device::parse_time(v, unit)
        .filter(|d| d.as_nanos().is_multiple_of(per))
        .map(|d| d.as_nanos() / per)
        .filter(|n| (u128::from(lo)..=u128::from(hi)).contains(n))
        .map(|n| n as u32)
        .ok_or_else(|| {
            let name = if unit >= Duration::from_secs(1) {
                "seconds"
            } else {
                "milliseconds"
            };
            format!(
                "{k} = '{v}': want a time from {} to {} in whole {name} (e.g. {}; a bare number is {name})",
                show_time(unit, lo),
                show_time(unit, hi),
                show_time(unit, hi / 2),
            )
        })
}

/// A time parameter counted in `unit`, as [`time`] reads it back (`30s`, `1m`, `500ms`).
pub(super) fn show_time(unit: Duration, n: u32) -> String {
    crate::device::format_time(unit * n)
}

/// A percentage parameter: `50` or `50%`, from `lo` to `hi`.
pub(super) fn pct(k: &str, v: &str, lo: u32, hi: u32) -> Result<u32, String> {
    num(k, v.strip_suffix('%').unwrap_or(v), lo, hi)
        .map_err(|_| format!("{k} = '{v}': want a percentage from {lo}% to {hi}%"))
}

pub(super) const SEC: Duration = Duration::from_secs(1);
pub(super) const MS: Duration = Duration::from_millis(1);

pub(crate) fn unknown(k: &str, group: &str, known: &str) -> String {
    format!("unknown parameter '{k}' for {group} (known: {known})")
}

/// The parameter group of mode `wl`'s writeback pacing (`tiercache_core::wl::pace`):
/// `background-fill` (percent of the log), `idle` (ms), `expire` (s), `depth` (writes to the
/// core in flight).
pub const WL_WRITEBACK: &str = "wl-writeback";

/// The error of a parameter group `set-param`/`get-param` do not know.
pub(super) fn unknown_group(name: &str) -> String {
    format!(
        "unknown parameter group '{name}' (want seq-cutoff, cleaning, cleaning-alru, cleaning-acp, promotion, promotion-nhit or {WL_WRITEBACK})"
    )
}

/// The error of a `wl-writeback` parameter asked of a cache in another mode.
pub(super) fn not_wl(cache_id: u16) -> String {
    format!("cache {cache_id} is not in mode wl: {WL_WRITEBACK} is a write-log parameter")
}

/// The policy a `cleaning` or `promotion` group's values choose (`policy=NAME`, the last one
/// given), starting from `current`; `want` lists the names for the error.
fn pick_policy<T: Named>(
    group: &str,
    values: &[(String, String)],
    current: T,
) -> Result<T, String> {
    let mut pol = current;
    for (k, v) in values {
        match k.as_str() {
            "policy" => {
                pol = T::parse(v)
                    .ok_or_else(|| format!("{group} policy '{v}' (want {})", T::one_of()))?
            }
            _ => return Err(unknown(k, group, "policy")),
        }
    }
    Ok(pol)
}

/// `set-param`.
pub fn set_param(
    reg: &Registry,
    cache_id: u16,
    core_id: Option<u16>,
    name: &str,
    values: &[(String, String)],
) -> Result<Value, String> {
    let e = reg.engine(cache_id)?;
    if name == WL_WRITEBACK {
        // Mode `wl`: when the log's writeback runs. Kept in memory (and in the config
        // file's [cache.params], which the daemon applies at start), not on the device.
        e.with_machine(|m| -> Result<(), String> {
            let w = m.wl_mut().ok_or_else(|| not_wl(cache_id))?;
            let mut p = w.pacing();
            for (k, v) in values {
                match k.as_str() {
                    "background-fill" => p.background_fill_pct = pct(k, v, 0, 100)? as u8,
                    "idle" => p.idle = Nanos::from_ms(time(k, v, MS, 0, 3_600_000)? as u64),
                    "expire" => p.expire = Nanos::from_secs(time(k, v, SEC, 0, 86_400)? as u64),
                    "depth" => p.depth = num(k, v, 1, Pacing::DEPTH_MAX)?,
                    _ => return Err(unknown(k, name, "background-fill, idle, expire, depth")),
                }
            }
            w.set_pacing(p)
        })?;
        return get_param(reg, cache_id, core_id, name);
    }
    e.with_cache(|c| -> Result<(), String> {
        let cfg = c.config().clone();
        match name {
            "seq-cutoff" | "seq-detect" => {
                let cores: Vec<CoreId> = match core_id {
                    Some(k) => vec![CoreId(k)],
                    None => (0..=CORE_ID_MAX)
                        .map(CoreId)
                        .filter(|k| c.core(*k).is_some())
                        .collect(),
                };
                // Check every core first, so nothing changes on an error.
                let mut new = Vec::new();
                for k in &cores {
                    let cur = c
                        .core(*k)
                        .ok_or_else(|| format!("cache {cache_id} has no core {}", k.0))?
                        .cutoff
                        .params();
                    new.push((*k, apply_cutoff(cur, values)?));
                }
                for (k, p) in new {
                    c.set_cutoff(k, p).map_err(|e| e.to_string())?;
                }
            }
            "cleaning" => {
                let pol = pick_policy(name, values, cfg.cleaning)?;
                c.set_cleaning(pol, cfg.alru, cfg.acp);
            }
            "cleaning-alru" => {
                let mut a = cfg.alru;
                for (k, v) in values {
                    match k.as_str() {
                        "wake-up" => a.wake_up_s = time(k, v, SEC, 0, 3600)?,
                        "staleness-time" => a.staleness_time_s = time(k, v, SEC, 1, 3600)?,
                        "flush-max-buffers" => a.flush_max_buffers = num(k, v, 1, 10000)?,
                        "activity-threshold" => {
                            a.activity_threshold_ms = time(k, v, MS, 0, 1_000_000)?
                        }
                        _ => {
                            return Err(unknown(
                                k,
                                name,
                                "wake-up, staleness-time, flush-max-buffers, activity-threshold",
                            ));
                        }
                    }
                }
                c.set_cleaning(cfg.cleaning, a, cfg.acp);
            }
            "cleaning-acp" => {
                let mut a = cfg.acp;
                for (k, v) in values {
                    match k.as_str() {
                        "wake-up" => a.wake_up_ms = time(k, v, MS, 0, 10000)?,
                        "flush-max-buffers" => a.flush_max_buffers = num(k, v, 1, 10000)?,
                        _ => return Err(unknown(k, name, "wake-up, flush-max-buffers")),
                    }
                }
                c.set_cleaning(cfg.cleaning, cfg.alru, a);
            }
            "promotion" => {
                let pol = pick_policy(name, values, cfg.promotion)?;
                c.set_promotion(pol, cfg.nhit);
            }
            "promotion-nhit" => {
                let mut n = cfg.nhit;
                for (k, v) in values {
                    match k.as_str() {
                        "threshold" | "insertion-threshold" => n.threshold = num(k, v, 2, 1000)?,
                        "trigger" | "trigger-threshold" => n.trigger_pct = pct(k, v, 0, 100)?,
                        _ => return Err(unknown(k, name, "threshold, trigger")),
                    }
                }
                c.set_promotion(cfg.promotion, n);
            }
            _ => {
                return Err(unknown_group(name));
            }
        }
        Ok(())
    })?;
    e.wait(|c| c.tables_durable());
    get_param(reg, cache_id, core_id, name)
}

/// `get-param`.
/// A `get-param` JSON entry as text, as `set-param` reads it back: the unit moves from the key
/// into the value (`wake_up_ms: 500` is `wake-up: 500ms`, `threshold_bytes: 1048576` is
/// `threshold: 1MiB`, `trigger_pct: 80` is `trigger: 80%`) and `_` becomes `-` (`core_id`
/// stays). Other values are printed as they are (strings without quotes).
pub fn param_text(key: &str, v: &Value) -> (String, String) {
    let n = v.as_u64();
    let (name, text) = match (key, n) {
        ("core_id", _) => return (key.into(), v.to_string()),
        (k, Some(n)) if k.ends_with("_bytes") => (&k[..k.len() - 6], crate::device::format_size(n)),
        (k, Some(n)) if k.ends_with("_ms") => (
            &k[..k.len() - 3],
            crate::device::format_time(Duration::from_millis(n)),
        ),
        (k, Some(n)) if k.ends_with("_s") => (
            &k[..k.len() - 2],
            crate::device::format_time(Duration::from_secs(n)),
        ),
        (k, Some(n)) if k.ends_with("_pct") => (&k[..k.len() - 4], format!("{n}%")),
        (k, _) => (k, v.as_str().map_or_else(|| v.to_string(), str::to_string)),
    };
    (name.replace('_', "-"), text)
}

/// A parameter group's values (`get-param`'s answer, and `set-param`'s): JSON numbers with the
/// unit in the key (`wake_up_ms`, `threshold_bytes`, `trigger_pct`); [`param_text`] gives the
/// text `get-param` prints without `--json`.
pub fn get_param(
    reg: &Registry,
    cache_id: u16,
    core_id: Option<u16>,
    name: &str,
) -> Result<Value, String> {
    if name == WL_WRITEBACK {
        let p = reg
            .engine(cache_id)?
            .with_machine(|m| m.wl().map(|w| w.pacing()))
            .ok_or_else(|| not_wl(cache_id))?;
        return Ok(json!({"background_fill_pct": p.background_fill_pct,
            "idle_ms": p.idle.0 / 1_000_000,
            "expire_s": p.expire.0 / 1_000_000_000,
            "depth": p.depth}));
    }
    reg.with_cache(cache_id, |c| {
        let cfg = c.config();
        Ok(match name {
            "seq-cutoff" | "seq-detect" => {
                let mut v = Vec::new();
                for k in (0..=CORE_ID_MAX).map(CoreId) {
                    if core_id.is_some_and(|x| x != k.0) {
                        continue;
                    }
                    if let Some(s) = c.core(k) {
                        let p = s.cutoff.params();
                        let pol = p.policy.name();
                        v.push(json!({"core_id": k.0, "policy": pol,
                            "threshold_bytes": p.threshold_bytes,
                            "promotion_count": p.promotion_count}));
                    }
                }
                if let Some(k) = core_id
                    && v.is_empty()
                {
                    return Err(format!("cache {cache_id} has no core {k}"));
                }
                json!(v)
            }
            "cleaning" => json!({"policy": cfg.cleaning.name()}),
            "cleaning-alru" => json!({"wake_up_s": cfg.alru.wake_up_s,
                "staleness_time_s": cfg.alru.staleness_time_s,
                "flush_max_buffers": cfg.alru.flush_max_buffers,
                "activity_threshold_ms": cfg.alru.activity_threshold_ms}),
            "cleaning-acp" => json!({"wake_up_ms": cfg.acp.wake_up_ms,
                "flush_max_buffers": cfg.acp.flush_max_buffers}),
            "promotion" => json!({"policy": cfg.promotion.name()}),
            "promotion-nhit" => json!({"threshold": cfg.nhit.threshold,
                "trigger_pct": cfg.nhit.trigger_pct}),
            _ => {
                return Err(unknown_group(name));
            }
        })
    })
}
