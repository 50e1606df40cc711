//! Statistics like `casadm -P` (usage, requests, blocks, errors per cache, core and IO class)
//! plus the dirty-data risk of SPEC C20 and the fault state of SPEC C19 (`health`, per cache
//! and per core: [`crate::health`]), as JSON; and the same numbers as Prometheus metrics.

use crate::registry::{CORE_ID_MAX, Registry};
use serde_json::{Value, json};
use std::fmt::Write;
use tiercache_core::Machine;
use tiercache_core::stats::ReqCounters;
use tiercache_core::units::CoreId;

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 * 1000.0 / b as f64).round() / 10.0
    }
}

fn requests(r: &ReqCounters) -> Value {
    let rd = &r.read;
    let wr = &r.write;
    let total = rd.total() + wr.total();
    json!({
        "read_full_hits": rd.full_hit, "read_partial_hits": rd.partial_hit,
        "read_misses": rd.miss, "read_pass_through": rd.pass_through,
        "write_full_hits": wr.full_hit, "write_partial_hits": wr.partial_hit,
        "write_misses": wr.miss, "write_pass_through": wr.pass_through,
        "trims": r.trims, "flushes": r.flushes,
        "total": total,
        "read_hit_pct": pct(rd.full_hit + rd.partial_hit, rd.total()),
        "write_hit_pct": pct(wr.full_hit + wr.partial_hit, wr.total()),
        "hit_pct": pct(rd.full_hit + rd.partial_hit + wr.full_hit + wr.partial_hit, total),
        "pass_through_pct": pct(rd.pass_through + wr.pass_through, total),
        "errors": r.errors,
    })
}

fn blocks(r: &ReqCounters) -> Value {
    json!({"client_bytes_read": r.blocks_read * 512, "client_bytes_written": r.blocks_written * 512})
}

/// Statistics of one cache (and optionally one core or IO class of it).
pub fn cache_stats(
    reg: &Registry,
    cache_id: u16,
    core_id: Option<u16>,
    io_class: Option<u8>,
) -> Result<Value, String> {
    let e = reg.engine(cache_id)?;
    let es = e.stats();
    let (lsz, _, device) = reg.geometry(cache_id).ok_or("gone")?;
    let (cache_timeout, core_timeouts) = reg.io_timeouts(cache_id);
    let now = e.now();
    let mut v = e.with_machine(|m: &mut Machine| -> Result<Value, String> {
        let m: &Machine = m;
        let c = m.cache();
        let cfg = c.config();
        let k = c.counters();
        let line = cfg.line_size.bytes();
        let dirty_blocks = c.dirty_blocks();
        let health = crate::health::cache_health_json(m, now);
        let mut out = json!({
            "cache_id": cache_id,
            "device": device,
            "state": health["state"].clone(),
            "io_timeout_ms": cache_timeout,
            "mode": c.mode().to_string(),
            "switching_to": c.target_mode().map(|m| m.to_string()),
            "line_size": line,
            "usage": {
                "lines": cfg.lines,
                "occupancy_lines": c.occupancy(),
                "occupancy_pct": pct(c.occupancy() as u64, cfg.lines as u64),
                "free_lines": cfg.lines - c.occupancy(),
                "clean_lines": c.occupancy() - c.dirty_lines(),
                "dirty_lines": c.dirty_lines(),
                "dirty_pct": pct(c.dirty_lines() as u64, cfg.lines as u64),
                "dirty_bytes": dirty_blocks * 512,
            },
            "blocks": {
                "cache_bytes_read": k.cache_blocks_read * 512,
                "cache_bytes_written": k.cache_blocks_written * 512,
                "core_bytes_read": k.core_blocks_read * 512,
                "core_bytes_written": k.core_blocks_written * 512,
            },
            "errors": {"cache": k.cache_errors, "core": k.core_errors,
                "writeback": k.writeback_errors},
            "writeback": {"lines": k.writeback_lines, "bytes": k.writeback_blocks * 512,
                "ios": k.writeback_ios, "running": c.writeback_running()},
            "throttle": {"writes": k.throttled_writes, "seconds": k.throttle_ns as f64 / 1e9},
            "evictions": k.evictions, "deferred": k.deferred, "alloc_failures": k.alloc_failures,
            "merged_core_reads": k.merged_core_reads,
            "engine": {"in_flight": es.in_flight, "in_flight_max": es.in_flight_max,
                "requests": es.requests, "inline_ios": es.inline_ios,
                "thread_ios": es.thread_ios, "ring_ios": es.ring_ios, "async_ios": es.async_ios,
                "merged_ios": es.merged_ios,
                "io_buffers": {"bytes": es.buffer_bytes, "in_use": es.buffer_in_use,
                    "peak": es.buffer_peak, "waits": es.buffer_waits,
                    "larger_than_pool": es.buffer_oversize}},
            "policies": {
                "eviction": c.policy_names().0, "promotion": c.policy_names().1,
                "cleaning": c.policy_names().2,
            },
            "health": health,
        });
        if let Some((used, cap)) = c.journal_fill() {
            out["metadata"] = json!({"journal_bytes_used": used, "journal_bytes": cap,
                "commits": c.meta_counters().commits, "checkpoints": c.meta_counters().checkpoints});
        }
        let mut all = ReqCounters::default();
        let mut cores = Vec::new();
        for id in (0..=CORE_ID_MAX).map(CoreId) {
            let Some(s) = c.core(id) else { continue };
            add(&mut all, &s.counters);
            if core_id.is_some_and(|x| x != id.0) {
                continue;
            }
            let (lines, dirty) = c.core_lines(id);
            cores.push(json!({
                "core_id": id.0,
                "export": s.record.as_ref().map(|r| r.export_name.clone()),
                "size_bytes": s.size_blocks * 512,
                "occupancy_lines": lines,
                "dirty_lines": dirty,
                "dirty_bytes_max": dirty as u64 * line,
                "requests": requests(&s.counters),
                "blocks": blocks(&s.counters),
                "io_timeout_ms": core_timeouts.get(&id.0),
                "health": crate::health::core_health_json(m, id, now),
            }));
        }
        if let Some(x) = core_id
            && cores.is_empty()
        {
            return Err(format!("cache {cache_id} has no core {x}"));
        }
        out["requests"] = requests(&all);
        out["client"] = blocks(&all);
        let client_written = all.blocks_written.max(1);
        out["device_bytes_written_per_client_byte"] = json!(
            ((k.cache_blocks_written + k.core_blocks_written) as f64 / client_written as f64
                * 100.0)
                .round()
                / 100.0
        );
        out["cores"] = json!(cores);
        let mut classes = Vec::new();
        for cl in c.io_classes().classes() {
            if io_class.is_some_and(|x| x != cl.id) {
                continue;
            }
            let r = c.class_counters(cl.id).copied().unwrap_or_default();
            classes.push(json!({"io_class": cl.id, "name": cl.name,
                "occupancy_lines": c.class_lines(cl.id), "requests": requests(&r),
                "blocks": blocks(&r)}));
        }
        if let Some(x) = io_class
            && classes.is_empty()
        {
            return Err(format!("cache {cache_id} has no IO class {x}"));
        }
        out["io_classes"] = json!(classes);
        Ok(out)
    })?;
    if let Some(w) = e.with_machine(|m| m.wl().map(wl_block)) {
        // Mode `wl`: the log is what is dirty and what writeback drains; the counters above
        // ("requests", "usage", per core) are the read cache's.
        v["mode"] = json!("wl");
        v["usage"]["dirty_bytes"] = w["dirty_bytes"].clone();
        v["writeback"]["bytes"] = w["written_back_bytes"].clone();
        // The health block has the log's problem and what is at risk while degraded (every
        // logged byte not yet written back): `crate::health::cache_health_json`.
        v["write_log"] = w;
    }
    // Dirty-data risk (SPEC C20): bytes at risk if the cache device dies, and how long the
    // cleaner needs at the rate it has been writing back.
    let wb_blocks = v["writeback"]["bytes"].as_u64().unwrap_or(0) / 512;
    let rate = reg.writeback_rate(cache_id, wb_blocks) * 512.0;
    let dirty = v["usage"]["dirty_bytes"].as_u64().unwrap_or(0);
    v["risk"] = json!({
        "dirty_bytes": dirty,
        "writeback_bytes_per_s": rate.round(),
        "writeback_eta_s": if dirty == 0 { json!(0) } else if rate > 0.0 {
            json!((dirty as f64 / rate).round()) } else { Value::Null },
    });
    let _ = lsz;
    Ok(v)
}

/// The write log's state, like the persistent-cache block of `rbd status`.
fn wl_block(w: &tiercache_core::wl::WriteLog) -> Value {
    let k = w.counters();
    let (used, ring) = w.log_fill();
    let (entries, dirty) = w.pending(None);
    json!({
        "present": true,
        "clean": w.is_clean(),
        "dirty_bytes": dirty * 512,
        "entries": entries,
        "generation_lag": w.generation_lag(),
        "log_bytes_used": used * 512,
        "log_bytes": ring * 512,
        "log_fill_pct": pct(used, ring),
        "read_hits_full": k.read_hits_full,
        "read_hits_partial": k.read_hits_partial,
        "read_misses": k.read_misses,
        "entries_logged": k.entries_logged,
        "logged_bytes": k.blocks_logged * 512,
        "entries_written_back": k.entries_written_back,
        "written_back_bytes": k.blocks_written_back * 512,
        "generations_retired": k.gens_retired,
        "prefix_retires": k.prefix_retires,
        "writes_waited_for_space": k.waited_for_space,
        // Writeback holds while the clients are busy and the log is under its background
        // fill (`set-param wl-writeback`).
        "writeback_held": w.writeback_held(),
        "log_errors": k.log_errors,
        "writeback_errors": k.wb_errors,
    })
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(
        out,
        "# HELP tiercache_{name} {help}\n# TYPE tiercache_{name} {kind}"
    );
}

fn num(v: &Value) -> f64 {
    v.as_f64()
        .or_else(|| v.as_bool().map(|b| f64::from(u8::from(b))))
        .unwrap_or(0.0)
}

/// The fault metrics (SPEC C19, R3) from each cache's `health` blocks.
fn fault_metrics(out: &mut String, stats: &[Value]) {
    let kinds = ["io", "no_space", "timed_out"];
    family(
        out,
        "cache_bypass",
        "gauge",
        "1 while the cache device is failing and the cache acts as pass-through (no new dirty data).",
    );
    for s in stats {
        let _ = writeln!(
            out,
            "tiercache_cache_bypass{{cache=\"{}\"}} {}",
            s["cache_id"],
            num(&s["health"]["cache_device"]["bypass"])
        );
    }
    family(
        out,
        "wl_log_failing",
        "gauge",
        "Mode wl: 1 while IOs of the write log on the cache device fail (writes that cannot be logged fail; logged data not yet written back is at risk).",
    );
    for s in stats {
        let w = &s["health"]["write_log"];
        if w.is_object() {
            let _ = writeln!(
                out,
                "tiercache_wl_log_failing{{cache=\"{}\"}} {}",
                s["cache_id"],
                num(&w["failing"])
            );
        }
    }
    family(
        out,
        "cache_device_errors_total",
        "counter",
        "Cache device errors by kind (io, no_space, timed_out).",
    );
    for s in stats {
        for k in kinds {
            let _ = writeln!(
                out,
                "tiercache_cache_device_errors_total{{cache=\"{}\",kind=\"{k}\"}} {}",
                s["cache_id"],
                num(&s["health"]["cache_device"]["errors"][k])
            );
        }
    }
    let per_core: &[(&str, &str, &str, &[&str])] = &[
        (
            "writeback_failing",
            "gauge",
            "1 while writeback to the core keeps failing (its dirty data stays on the cache device and is retried).",
            &["writeback", "failing"],
        ),
        (
            "writeback_failing_seconds",
            "gauge",
            "How long writeback to the core has been failing (0 when it works).",
            &["writeback", "failing_for_s"],
        ),
        (
            "writeback_failures_total",
            "counter",
            "Failed writeback attempts to the core.",
            &["writeback", "failures"],
        ),
        (
            "writeback_retries_total",
            "counter",
            "Writeback attempts to the core that were retries after a failure.",
            &["writeback", "retries"],
        ),
    ];
    for (name, kind, help, path) in per_core {
        family(out, name, kind, help);
        for s in stats {
            for c in s["cores"].as_array().into_iter().flatten() {
                let mut x = &c["health"];
                for p in *path {
                    x = &x[*p];
                }
                let _ = writeln!(
                    out,
                    "tiercache_{name}{{cache=\"{}\",core=\"{}\"}} {}",
                    s["cache_id"],
                    c["core_id"],
                    num(x)
                );
            }
        }
    }
    family(
        out,
        "core_device_errors_total",
        "counter",
        "Core device errors by kind (io, no_space, timed_out), client IO and writeback.",
    );
    for s in stats {
        for c in s["cores"].as_array().into_iter().flatten() {
            for k in kinds {
                let _ = writeln!(
                    out,
                    "tiercache_core_device_errors_total{{cache=\"{}\",core=\"{}\",kind=\"{k}\"}} {}",
                    s["cache_id"],
                    c["core_id"],
                    num(&c["health"]["errors"][k])
                );
            }
        }
    }
}

fn add(a: &mut ReqCounters, b: &ReqCounters) {
    a.read.full_hit += b.read.full_hit;
    a.read.partial_hit += b.read.partial_hit;
    a.read.miss += b.read.miss;
    a.read.pass_through += b.read.pass_through;
    a.write.full_hit += b.write.full_hit;
    a.write.partial_hit += b.write.partial_hit;
    a.write.miss += b.write.miss;
    a.write.pass_through += b.write.pass_through;
    a.trims += b.trims;
    a.flushes += b.flushes;
    a.blocks_read += b.blocks_read;
    a.blocks_written += b.blocks_written;
    a.errors += b.errors;
}

/// Every cache's statistics (those not running appear with their state only).
pub fn all_stats(reg: &Registry) -> Value {
    let mut v = Vec::new();
    for id in reg.ids() {
        match cache_stats(reg, id, None, None) {
            Ok(s) => v.push(s),
            Err(_) => v.push(json!({"cache_id": id, "state": reg.state(id)})),
        }
    }
    json!(v)
}

/// Prometheus text format (version 0.0.4) of every cache, core and IO class.
pub fn metrics(reg: &Registry) -> String {
    let mut out = String::new();
    let states = ["running", "degraded", "incomplete", "detached"];
    let _ = writeln!(
        out,
        "# HELP tiercache_cache_state 1 for the state the cache is in (SPEC C19).\n# TYPE tiercache_cache_state gauge"
    );
    for id in reg.ids() {
        let st = reg.state(id).unwrap_or("detached");
        for s in states {
            let _ = writeln!(
                out,
                "tiercache_cache_state{{cache=\"{id}\",state=\"{s}\"}} {}",
                u8::from(s == st)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP tiercache_core_state 1 for the state the core is in.\n# TYPE tiercache_core_state gauge"
    );
    for id in reg.ids() {
        for (core, _, export, st) in reg.cores(id) {
            for s in states {
                let _ = writeln!(
                    out,
                    "tiercache_core_state{{cache=\"{id}\",core=\"{core}\",export=\"{export}\",state=\"{s}\"}} {}",
                    u8::from(s == st)
                );
            }
        }
    }
    let gauges: &[(&str, &str, &[&str])] = &[
        ("lines", "Cache lines.", &["usage", "lines"]),
        (
            "occupancy_lines",
            "Lines holding data.",
            &["usage", "occupancy_lines"],
        ),
        (
            "dirty_lines",
            "Lines holding dirty data.",
            &["usage", "dirty_lines"],
        ),
        (
            "dirty_bytes",
            "Dirty bytes (lost if the cache device dies).",
            &["risk", "dirty_bytes"],
        ),
        (
            "writeback_eta_seconds",
            "Time to write every dirty byte back at the recent rate.",
            &["risk", "writeback_eta_s"],
        ),
        (
            "in_flight_ios",
            "Device IOs in flight.",
            &["engine", "in_flight"],
        ),
        (
            "dirty_at_risk_bytes",
            "Dirty bytes held on the cache device while a fault keeps them from the core (writeback failing) or threatens them (cache device failing).",
            &["health", "dirty_at_risk_bytes"],
        ),
        (
            "wl_log_fill_ratio",
            "Mode wl: share of the log ring in use (0-100).",
            &["write_log", "log_fill_pct"],
        ),
        (
            "wl_generation_lag",
            "Mode wl: sync generations between the one being written back and the open one.",
            &["write_log", "generation_lag"],
        ),
    ];
    let counters: &[(&str, &str, &[&str])] = &[
        (
            "cache_read_bytes_total",
            "Bytes read from the cache device.",
            &["blocks", "cache_bytes_read"],
        ),
        (
            "cache_written_bytes_total",
            "Bytes written to the cache device.",
            &["blocks", "cache_bytes_written"],
        ),
        (
            "core_read_bytes_total",
            "Bytes read from core devices.",
            &["blocks", "core_bytes_read"],
        ),
        (
            "core_written_bytes_total",
            "Bytes written to core devices.",
            &["blocks", "core_bytes_written"],
        ),
        (
            "cache_errors_total",
            "Cache device errors.",
            &["errors", "cache"],
        ),
        (
            "core_errors_total",
            "Core device errors.",
            &["errors", "core"],
        ),
        (
            "writeback_errors_total",
            "Failed writeback attempts (retried).",
            &["errors", "writeback"],
        ),
        (
            "writeback_bytes_total",
            "Bytes written back.",
            &["writeback", "bytes"],
        ),
        ("evictions_total", "Lines evicted.", &["evictions"]),
        (
            "bypassed_requests_total",
            "Requests served as pass-through because the cache device was failing.",
            &["health", "cache_device", "bypassed_requests"],
        ),
        (
            "cache_probes_total",
            "Probes (flushes) of a failing cache device.",
            &["health", "cache_device", "probes"],
        ),
    ];
    let stats: Vec<Value> = reg
        .ids()
        .into_iter()
        .filter_map(|id| cache_stats(reg, id, None, None).ok())
        .collect();
    for (name, help, path) in gauges.iter().chain(counters.iter()) {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(
            out,
            "# HELP tiercache_{name} {help}\n# TYPE tiercache_{name} {kind}"
        );
        for s in &stats {
            let mut x = s;
            for p in *path {
                x = &x[*p];
            }
            if let Some(n) = x.as_f64() {
                let _ = writeln!(out, "tiercache_{name}{{cache=\"{}\"}} {n}", s["cache_id"]);
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP tiercache_requests_total Client requests by core, operation and outcome.\n# TYPE tiercache_requests_total counter"
    );
    for s in &stats {
        for c in s["cores"].as_array().into_iter().flatten() {
            for (op, outcome) in [
                ("read", "full_hits"),
                ("read", "partial_hits"),
                ("read", "misses"),
                ("read", "pass_through"),
                ("write", "full_hits"),
                ("write", "partial_hits"),
                ("write", "misses"),
                ("write", "pass_through"),
            ] {
                let n = c["requests"][format!("{op}_{outcome}")]
                    .as_u64()
                    .unwrap_or(0);
                let _ = writeln!(
                    out,
                    "tiercache_requests_total{{cache=\"{}\",core=\"{}\",op=\"{op}\",outcome=\"{outcome}\"}} {n}",
                    s["cache_id"], c["core_id"]
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "# HELP tiercache_core_dirty_lines Dirty lines per core.\n# TYPE tiercache_core_dirty_lines gauge"
    );
    for s in &stats {
        for c in s["cores"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "tiercache_core_dirty_lines{{cache=\"{}\",core=\"{}\"}} {}",
                s["cache_id"], c["core_id"], c["dirty_lines"]
            );
        }
    }
    fault_metrics(&mut out, &stats);
    let _ = writeln!(
        out,
        "# HELP tiercache_ioclass_occupancy_lines Lines per IO class.\n# TYPE tiercache_ioclass_occupancy_lines gauge"
    );
    for s in &stats {
        for c in s["io_classes"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "tiercache_ioclass_occupancy_lines{{cache=\"{}\",io_class=\"{}\"}} {}",
                s["cache_id"], c["io_class"], c["occupancy_lines"]
            );
        }
    }
    out
}
