//! Statistics like `casadm -P` (usage, requests, blocks, errors per cache, core and IO class)
//! plus the dirty-data risk of SPEC C20 and the fault state of SPEC C19 (`health`, per cache
//! and per core: [`crate::health`]), as JSON; and the same numbers as Prometheus metrics.

use crate::registry::{CORE_ID_MAX, Registry};
use serde_json::{Value, json};
use std::fmt::Write;
use tiercache_core::Machine;
use tiercache_core::stats::ReqCounters;
use tiercache_core::units::BLOCK_BYTES;
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
    json!({"client_bytes_read": r.blocks_read * BLOCK_BYTES, "client_bytes_written": r.blocks_written * BLOCK_BYTES})
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
                "dirty_bytes": dirty_blocks * BLOCK_BYTES,
            },
            "blocks": {
                "cache_bytes_read": k.cache_blocks_read * BLOCK_BYTES,
                "cache_bytes_written": k.cache_blocks_written * BLOCK_BYTES,
                "core_bytes_read": k.core_blocks_read * BLOCK_BYTES,
                "core_bytes_written": k.core_blocks_written * BLOCK_BYTES,
            },
            "errors": {"cache": k.cache_errors, "core": k.core_errors,
                "writeback": k.writeback_errors},
            "writeback": {"lines": k.writeback_lines, "bytes": k.writeback_blocks * BLOCK_BYTES,
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
                "size_bytes": s.size_blocks * BLOCK_BYTES,
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
    let wb_blocks = v["writeback"]["bytes"].as_u64().unwrap_or(0) / BLOCK_BYTES;
    let rate = reg.writeback_rate(cache_id, wb_blocks) * BLOCK_BYTES as f64;
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
        "dirty_bytes": dirty * BLOCK_BYTES,
        "entries": entries,
        "generation_lag": w.generation_lag(),
        "log_bytes_used": used * BLOCK_BYTES,
        "log_bytes": ring * BLOCK_BYTES,
        "log_fill_pct": pct(used, ring),
        "read_hits_full": k.read_hits_full,
        "read_hits_partial": k.read_hits_partial,
        "read_misses": k.read_misses,
        "entries_logged": k.entries_logged,
        "logged_bytes": k.blocks_logged * BLOCK_BYTES,
        "entries_written_back": k.entries_written_back,
        "written_back_bytes": k.blocks_written_back * BLOCK_BYTES,
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

/// Prometheus text exposition (format 0.0.4) being written: each family with its HELP and
/// TYPE lines, each sample with its label values escaped.
#[derive(Default)]
struct Exposition {
    out: String,
}

/// A label value escaped for the text format: `\` as `\\`, `"` as `\"`, a newline as `\n`.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A sample value: `NaN`, `+Inf` and `-Inf` as the format spells them.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(
            self.out,
            "# HELP tiercache_{name} {help}\n# TYPE tiercache_{name} {kind}"
        );
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str("tiercache_");
        self.out.push_str(name);
        for (i, (k, val)) in labels.iter().enumerate() {
            self.out.push(if i == 0 { '{' } else { ',' });
            let _ = write!(self.out, "{k}=\"{}\"", escape_label(val));
        }
        if !labels.is_empty() {
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", value(v));
    }
}

/// Sections of a cache's `stats` that only some caches have (`write_log`, at the top and in
/// `health`, in mode `wl`; `metadata` with a journal): a metric read from one is left out
/// where it is absent.
const OPTIONAL_SECTIONS: [&str; 2] = ["write_log", "metadata"];

/// The number at `path` in a `stats` block (a bool as 0 or 1), or `None` where the value is
/// null or its section optional and absent. A key missing from the JSON is a metric that
/// would silently vanish (a key renamed in `stats`): a debug build (every test) stops on it.
fn get(v: &Value, path: &[&str]) -> Option<f64> {
    let mut x = v;
    for k in path {
        match x {
            Value::Null => return None,
            Value::Object(m) => match m.get(*k) {
                Some(y) => x = y,
                None => {
                    debug_assert!(
                        OPTIONAL_SECTIONS.contains(k),
                        "metrics: stats has no {}",
                        path.join(".")
                    );
                    return None;
                }
            },
            _ => {
                debug_assert!(false, "metrics: stats {} is not an object", path.join("."));
                return None;
            }
        }
    }
    x.as_f64()
        .or_else(|| x.as_bool().map(|b| f64::from(u8::from(b))))
}

fn id(v: &Value) -> String {
    v.as_u64().map(|n| n.to_string()).unwrap_or_default()
}

/// One metric per cache, core or per core and kind: (name, type, help, path in `stats`).
type Table<'a> = &'a [(&'a str, &'a str, &'a str, &'a [&'a str])];

const ERROR_KINDS: [&str; 3] = ["io", "no_space", "timed_out"];

/// Metrics of each cache, from its `stats` block.
fn cache_metrics(x: &mut Exposition, stats: &[Value]) {
    let table: Table = &[
        ("lines", "gauge", "Cache lines.", &["usage", "lines"]),
        (
            "occupancy_lines",
            "gauge",
            "Lines holding data.",
            &["usage", "occupancy_lines"],
        ),
        (
            "dirty_lines",
            "gauge",
            "Lines holding dirty data.",
            &["usage", "dirty_lines"],
        ),
        (
            "dirty_bytes",
            "gauge",
            "Dirty bytes (lost if the cache device dies).",
            &["risk", "dirty_bytes"],
        ),
        (
            "writeback_eta_seconds",
            "gauge",
            "Time to write every dirty byte back at the recent rate (absent while nothing has been written back yet).",
            &["risk", "writeback_eta_s"],
        ),
        (
            "in_flight_ios",
            "gauge",
            "Device IOs in flight.",
            &["engine", "in_flight"],
        ),
        (
            "dirty_at_risk_bytes",
            "gauge",
            "Dirty bytes held on the cache device while a fault keeps them from the core (writeback failing) or threatens them (cache device failing).",
            &["health", "dirty_at_risk_bytes"],
        ),
        (
            "wl_generation_lag",
            "gauge",
            "Mode wl: sync generations between the one being written back and the open one.",
            &["write_log", "generation_lag"],
        ),
        (
            "cache_bypass",
            "gauge",
            "1 while the cache device is failing and the cache acts as pass-through (no new dirty data).",
            &["health", "cache_device", "bypass"],
        ),
        (
            "wl_log_failing",
            "gauge",
            "Mode wl: 1 while IOs of the write log on the cache device fail (writes that cannot be logged fail; logged data not yet written back is at risk).",
            &["health", "write_log", "failing"],
        ),
        (
            "cache_read_bytes_total",
            "counter",
            "Bytes read from the cache device.",
            &["blocks", "cache_bytes_read"],
        ),
        (
            "cache_written_bytes_total",
            "counter",
            "Bytes written to the cache device.",
            &["blocks", "cache_bytes_written"],
        ),
        (
            "core_read_bytes_total",
            "counter",
            "Bytes read from core devices.",
            &["blocks", "core_bytes_read"],
        ),
        (
            "core_written_bytes_total",
            "counter",
            "Bytes written to core devices.",
            &["blocks", "core_bytes_written"],
        ),
        (
            "writeback_bytes_total",
            "counter",
            "Bytes written back.",
            &["writeback", "bytes"],
        ),
        (
            "evictions_total",
            "counter",
            "Lines evicted.",
            &["evictions"],
        ),
        (
            "bypassed_requests_total",
            "counter",
            "Requests served as pass-through because the cache device was failing.",
            &["health", "cache_device", "bypassed_requests"],
        ),
        (
            "cache_probes_total",
            "counter",
            "Probes (flushes) of a failing cache device.",
            &["health", "cache_device", "probes"],
        ),
    ];
    for (name, kind, help, path) in table {
        x.family(name, kind, help);
        for s in stats {
            if let Some(n) = get(s, path) {
                x.sample(name, &[("cache", &id(&s["cache_id"]))], n);
            }
        }
    }
    x.family(
        "wl_log_fill_ratio",
        "gauge",
        "Mode wl: share of the write log's ring in use, 0 to 1.",
    );
    for s in stats {
        let used = get(s, &["write_log", "log_bytes_used"]);
        if let (Some(used), Some(ring)) = (used, get(s, &["write_log", "log_bytes"])) {
            let r = if ring > 0.0 { used / ring } else { 0.0 };
            x.sample("wl_log_fill_ratio", &[("cache", &id(&s["cache_id"]))], r);
        }
    }
    x.family(
        "cache_device_errors_total",
        "counter",
        "Failed IOs of the cache device by kind (io, no_space, timed_out): client IO, writeback's reads of dirty data and, in mode wl, the write log's IOs.",
    );
    for s in stats {
        for k in ERROR_KINDS {
            let path = ["health", "cache_device", "errors", k];
            if let Some(n) = get(s, &path) {
                let cache = id(&s["cache_id"]);
                x.sample(
                    "cache_device_errors_total",
                    &[("cache", &cache), ("kind", k)],
                    n,
                );
            }
        }
    }
}

/// Metrics of each core of each cache, from its cache's `stats` block.
fn core_metrics(x: &mut Exposition, stats: &[Value]) {
    let table: Table = &[
        (
            "core_dirty_lines",
            "gauge",
            "Dirty lines per core.",
            &["dirty_lines"],
        ),
        (
            "writeback_failing",
            "gauge",
            "1 while writeback to the core keeps failing (its dirty data stays on the cache device and is retried).",
            &["health", "writeback", "failing"],
        ),
        (
            "writeback_failing_seconds",
            "gauge",
            "How long writeback to the core has been failing (0 when it works).",
            &["health", "writeback", "failing_for_s"],
        ),
        (
            "writeback_failures_total",
            "counter",
            "Failed attempts to write dirty data back to the core device (each is retried; a failed read of the dirty data from the cache device counts in tiercache_cache_device_errors_total instead).",
            &["health", "writeback", "failures"],
        ),
        (
            "writeback_retries_total",
            "counter",
            "Writeback attempts to the core that were retries after a failure.",
            &["health", "writeback", "retries"],
        ),
    ];
    let cores = |s: &Value| s["cores"].as_array().cloned().unwrap_or_default();
    for (name, kind, help, path) in table {
        x.family(name, kind, help);
        for s in stats {
            for c in cores(s) {
                // A failing_for_s of null means "not failing": 0.
                let n = get(&c, path).unwrap_or(0.0);
                x.sample(
                    name,
                    &[("cache", &id(&s["cache_id"])), ("core", &id(&c["core_id"]))],
                    n,
                );
            }
        }
    }
    x.family(
        "core_device_errors_total",
        "counter",
        "Failed IOs of the core device by kind (io, no_space, timed_out): client IO and writeback.",
    );
    for s in stats {
        for c in cores(s) {
            for k in ERROR_KINDS {
                if let Some(n) = get(&c, &["health", "errors", k]) {
                    let (cache, core) = (id(&s["cache_id"]), id(&c["core_id"]));
                    x.sample(
                        "core_device_errors_total",
                        &[("cache", &cache), ("core", &core), ("kind", k)],
                        n,
                    );
                }
            }
        }
    }
    x.family(
        "requests_total",
        "counter",
        "Client requests by core, operation and outcome (full_hits, partial_hits, misses, pass_through).",
    );
    for s in stats {
        for c in cores(s) {
            for op in ["read", "write"] {
                for outcome in ["full_hits", "partial_hits", "misses", "pass_through"] {
                    let key = format!("{op}_{outcome}");
                    if let Some(n) = get(&c, &["requests", &key]) {
                        let (cache, core) = (id(&s["cache_id"]), id(&c["core_id"]));
                        x.sample(
                            "requests_total",
                            &[
                                ("cache", &cache),
                                ("core", &core),
                                ("op", op),
                                ("outcome", outcome),
                            ],
                            n,
                        );
                    }
                }
            }
        }
    }
    x.family(
        "hit_ratio",
        "gauge",
        "Share of the core's client requests of the operation that hit the cache (full or partial hits), 0-1, since the counters were last reset (tiercache reset-counters); 0 before the first. For a recent ratio, use rate() of tiercache_requests_total.",
    );
    for s in stats {
        for c in cores(s) {
            for op in ["read", "write"] {
                let n = |o: &str| get(&c, &["requests", &format!("{op}_{o}")]).unwrap_or(0.0);
                let hits = n("full_hits") + n("partial_hits");
                let all = hits + n("misses") + n("pass_through");
                let (cache, core) = (id(&s["cache_id"]), id(&c["core_id"]));
                x.sample(
                    "hit_ratio",
                    &[("cache", &cache), ("core", &core), ("op", op)],
                    if all > 0.0 { hits / all } else { 0.0 },
                );
            }
        }
    }
}

/// Whether this machine gives an io_uring, and whether librbd loads (asked once).
fn found() -> (bool, bool) {
    static FOUND: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        (
            tiercache_io::Ring::new(8).is_ok(),
            tiercache_io::rbd_available().is_ok(),
        )
    })
}

/// `tiercache_build_info`: the version, the commit built, and what this machine gives.
fn build_info(x: &mut Exposition) {
    let (uring, rbd) = found();
    x.family(
        "build_info",
        "gauge",
        "Always 1: the version and git commit of the daemon, and whether io_uring and librbd are usable here (true/false).",
    );
    x.sample(
        "build_info",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", crate::BUILD_COMMIT),
            ("io_uring", if uring { "true" } else { "false" }),
            ("librbd", if rbd { "true" } else { "false" }),
        ],
        1.0,
    );
}

/// The NBD server's counts per export: request latency histograms per operation, errors,
/// client bytes. Every current export appears (zeros before its first request).
fn request_metrics(x: &mut Exposition, reg: &Registry) {
    let exports: Vec<(String, Vec<tiercache_nbd::latency::OpSnapshot>, u64, u64)> = reg
        .exports()
        .into_iter()
        .map(|(name, _)| {
            let s = reg.request_stats(&name);
            (name, s.snapshot(), s.read_bytes(), s.written_bytes())
        })
        .collect();
    let bounds: Vec<String> = tiercache_nbd::latency::bucket_bounds()
        .iter()
        .map(|b| value(*b))
        .collect();
    x.family(
        "request_duration_seconds",
        "histogram",
        "NBD requests by export and operation: time from the whole request received to its reply queued for the client.",
    );
    for (export, ops, _, _) in &exports {
        for o in ops {
            for (le, n) in bounds.iter().zip(o.cumulative) {
                let l = [
                    ("export", export.as_str()),
                    ("op", o.op),
                    ("le", le.as_str()),
                ];
                x.sample("request_duration_seconds_bucket", &l, n as f64);
            }
            let l = [("export", export.as_str()), ("op", o.op), ("le", "+Inf")];
            x.sample("request_duration_seconds_bucket", &l, o.count as f64);
            let l = [("export", export.as_str()), ("op", o.op)];
            x.sample("request_duration_seconds_sum", &l, o.sum_seconds);
            x.sample("request_duration_seconds_count", &l, o.count as f64);
        }
    }
    x.family(
        "request_errors_total",
        "counter",
        "NBD requests answered with an error, by export and operation.",
    );
    for (export, ops, _, _) in &exports {
        for o in ops {
            let l = [("export", export.as_str()), ("op", o.op)];
            x.sample("request_errors_total", &l, o.errors as f64);
        }
    }
    x.family(
        "client_read_bytes_total",
        "counter",
        "Bytes sent to NBD clients in successful reads, by export.",
    );
    for (export, _, read, _) in &exports {
        x.sample(
            "client_read_bytes_total",
            &[("export", export)],
            *read as f64,
        );
    }
    x.family(
        "client_written_bytes_total",
        "counter",
        "Bytes received from NBD clients in successful writes, by export.",
    );
    for (export, _, _, written) in &exports {
        x.sample(
            "client_written_bytes_total",
            &[("export", export)],
            *written as f64,
        );
    }
}

/// Prometheus text format (version 0.0.4) of every cache, core, IO class and export; the
/// families are listed with their type and unit in docs/METRICS.md (checked by a test).
pub fn metrics(reg: &Registry) -> String {
    let mut x = Exposition::default();
    build_info(&mut x);
    let states = ["running", "degraded", "incomplete", "detached"];
    x.family(
        "cache_state",
        "gauge",
        "1 for the state the cache is in (running, degraded, incomplete, detached).",
    );
    for cache in reg.ids() {
        let st = reg.state(cache).unwrap_or("detached");
        for s in states {
            let c = cache.to_string();
            x.sample(
                "cache_state",
                &[("cache", &c), ("state", s)],
                f64::from(u8::from(s == st)),
            );
        }
    }
    x.family(
        "core_state",
        "gauge",
        "1 for the state the core is in (running, degraded, incomplete, detached).",
    );
    for cache in reg.ids() {
        for (core, _, export, st) in reg.cores(cache) {
            for s in states {
                let (c, k) = (cache.to_string(), core.to_string());
                let l = [
                    ("cache", &*c),
                    ("core", &k),
                    ("export", &export),
                    ("state", s),
                ];
                x.sample("core_state", &l, f64::from(u8::from(s == st)));
            }
        }
    }
    let stats: Vec<Value> = reg
        .ids()
        .into_iter()
        .filter_map(|id| cache_stats(reg, id, None, None).ok())
        .collect();
    cache_metrics(&mut x, &stats);
    core_metrics(&mut x, &stats);
    x.family("ioclass_occupancy_lines", "gauge", "Lines per IO class.");
    for s in &stats {
        for c in s["io_classes"].as_array().into_iter().flatten() {
            if let Some(n) = get(c, &["occupancy_lines"]) {
                let (cache, class) = (id(&s["cache_id"]), id(&c["io_class"]));
                x.sample(
                    "ioclass_occupancy_lines",
                    &[("cache", &cache), ("io_class", &class)],
                    n,
                );
            }
        }
    }
    request_metrics(&mut x, reg);
    if let Some(n) = reg.nbd_stats() {
        let families = [
            (
                "nbd_connections",
                "gauge",
                "NBD connections open now.",
                n.open,
            ),
            (
                "nbd_connections_accepted_total",
                "counter",
                "NBD connections accepted.",
                n.accepted,
            ),
            (
                "nbd_handshakes_failed_total",
                "counter",
                "NBD connections that ended in the handshake (export refused or unknown, client aborted, malformed, timed out).",
                n.handshake_ended,
            ),
            (
                "nbd_tls_refused_total",
                "counter",
                "NBD connections whose TLS handshake failed (no or a wrong client certificate, not TLS).",
                n.tls_refused,
            ),
        ];
        for (name, kind, help, v) in families {
            x.family(name, kind, help);
            x.sample(name, &[], v as f64);
        }
    }
    x.out
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
