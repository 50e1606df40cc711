//! Text parsers: the Open CAS IO-class CSV (`core/src/policy/ioclass.rs`) and the daemon's TOML
//! config file (`daemon/src/config.rs`).
//!
//! Generators build a model (classes and rules; caches, cores and parameters), write it as
//! text in varied but valid styles, and check that the parser gives back the model — for the
//! CSV, including what [`IoClassTable::classify`] answers, against an evaluator of the model's
//! rules. Mutations add the formats' tokens. Anything the parsers accept is written back with
//! the crates' own writers (`IoClassTable::to_csv`, the `toml` serializer) and must parse to
//! the same value; an accepted IO-class table must also fit the configuration record a
//! persistent cache stores it in.

use crate::mutate::{Rng, Sample};
use crate::round_trip_checked;
use tiercache_core::policy::ioclass::{IoClassTable, IoInfo};
use tiercache_core::units::{CoreId, Lba};
use tiercache_daemon::config::ConfigFile;
use tiercache_format::tables::{ConfigRecord, STRING_MAX, decode_config, encode_config};

// ===== IO-class CSV =====

const OPS: [&str; 6] = ["eq", "ne", "lt", "gt", "le", "ge"];

#[derive(Clone, Debug)]
enum Cond {
    Size(usize, u64),
    Lba(usize, u64),
    Dir(bool),
    Core(usize, u64),
    Class(usize, u64),
}

fn holds(op: usize, a: u64, b: u64) -> bool {
    match op {
        0 => a == b,
        1 => a != b,
        2 => a < b,
        3 => a > b,
        4 => a <= b,
        _ => a >= b,
    }
}

impl Cond {
    fn text(&self, rng: &mut Rng) -> String {
        let num = |rng: &mut Rng, name: &str, op: usize, v: u64| {
            if op == 0 && rng.one_in(3) {
                format!("{name}:{v}")
            } else {
                format!("{name}:{}:{v}", OPS[op])
            }
        };
        match *self {
            Cond::Size(op, v) => num(rng, "request_size", op, v),
            Cond::Lba(op, v) => num(rng, "lba", op, v),
            Cond::Dir(w) => format!("io_direction:{}", if w { "write" } else { "read" }),
            Cond::Core(op, v) => num(rng, "core_id", op, v),
            Cond::Class(op, v) => num(rng, "io_class", op, v),
        }
    }
    fn holds(&self, io: &IoInfo, current: u8) -> bool {
        match *self {
            Cond::Size(op, v) => holds(op, io.bytes, v),
            Cond::Lba(op, v) => holds(op, io.lba.0, v),
            Cond::Dir(w) => io.is_write == w,
            Cond::Core(op, v) => holds(op, io.core.0 as u64, v),
            Cond::Class(op, v) => holds(op, current as u64, v),
        }
    }
}

#[derive(Clone, Debug)]
struct ModelClass {
    id: u8,
    name: String,
    priority: Option<u8>,
    allocation: String,
    pct: u8,
    conds: Vec<Cond>,
    any: bool,
    done: bool,
}

fn gen_cond(rng: &mut Rng) -> Cond {
    let op = rng.below(6) as usize;
    match rng.below(5) {
        0 => {
            let top = 1 << rng.below(20);
            Cond::Size(op, 512 * rng.below(top))
        }
        1 => {
            let bits = if rng.one_in(8) { 64 } else { 16 };
            Cond::Lba(op, rng.interesting(bits))
        }
        2 => Cond::Dir(rng.one_in(2)),
        3 => Cond::Core(op, rng.below(256)),
        _ => Cond::Class(op, rng.below(34)),
    }
}

/// An allocation share as text (at most 4 characters) and the percent it means.
fn gen_allocation(rng: &mut Rng) -> (String, u8) {
    let t = match rng.below(4) {
        0 => 0,
        1 => 1000,
        _ => rng.below(1001),
    };
    let pct = ((t + 5) / 10) as u8;
    let text = match (t, rng.below(3)) {
        (1000, 0) => "1".into(),
        (1000, 1) => "1.0".into(),
        (1000, _) => "1.00".into(),
        (0, 0) => "0".into(),
        (0, 1) => ".0".into(),
        (_, 0) if t % 10 == 0 => format!("0.{:02}", t / 10),
        (_, 1) if t % 100 == 0 => format!("0.{}", t / 100),
        _ => format!(".{t:03}"),
    };
    (text, pct)
}

fn gen_classes(rng: &mut Rng) -> Vec<ModelClass> {
    let big = rng.one_in(16);
    let n = if big { 34 } else { 1 + rng.below(6) } as usize;
    let mut ids: Vec<u8> = (1..34).collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let id = if i == 0 {
            0
        } else {
            ids.swap_remove(rng.below(ids.len() as u64) as usize)
        };
        let (allocation, pct) = gen_allocation(rng);
        let priority = if rng.one_in(5) {
            None
        } else {
            Some(rng.byte())
        };
        let (name, conds, any, done) = if id == 0 {
            ("unclassified".to_string(), vec![], false, false)
        } else if rng.one_in(12) {
            ("done".to_string(), vec![], false, true)
        } else {
            let k = if big {
                rng.range(6, 12)
            } else {
                rng.range(1, 4)
            } as usize;
            let conds: Vec<Cond> = (0..k).map(|_| gen_cond(rng)).collect();
            let any = k > 1 && rng.one_in(3);
            let done = !any && rng.one_in(3);
            let sep = if any { "|" } else { "&" };
            let sep = if rng.one_in(4) {
                format!(" {sep} ")
            } else {
                sep.to_string()
            };
            let mut name = conds
                .iter()
                .map(|c| c.text(rng))
                .collect::<Vec<_>>()
                .join(&sep);
            if done {
                name.push_str(&sep);
                name.push_str("done");
            }
            (name, conds, any, done)
        };
        out.push(ModelClass {
            id,
            name,
            priority,
            allocation,
            pct,
            conds,
            any,
            done,
        });
    }
    out
}

/// The CSV text of a model, in a random but valid style: columns in any order and case,
/// padding, comments, blank lines, CRLF, a byte-order mark.
fn csv_text(rng: &mut Rng, classes: &[ModelClass]) -> String {
    const COLS: [&str; 4] = [
        "IO class id",
        "IO class name",
        "Eviction priority",
        "Allocation",
    ];
    let mut order = [0usize, 1, 2, 3];
    if rng.one_in(3) {
        for i in (1..4).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
    }
    let pad = |rng: &mut Rng, s: &str| {
        if rng.one_in(6) {
            format!(" {s}  ")
        } else {
            s.to_string()
        }
    };
    let nl = if rng.one_in(6) { "\r\n" } else { "\n" };
    let mut t = String::new();
    if rng.one_in(10) {
        t.push('\u{feff}');
    }
    if rng.one_in(4) {
        t.push_str("# IO classes");
        t.push_str(nl);
        t.push_str(nl);
    }
    let header: Vec<String> = order
        .iter()
        .map(|&c| {
            let name = if rng.one_in(4) {
                COLS[c].to_ascii_uppercase()
            } else {
                COLS[c].to_string()
            };
            pad(rng, &name)
        })
        .collect();
    t.push_str(&header.join(","));
    t.push_str(nl);
    let mut rows: Vec<&ModelClass> = classes.iter().collect();
    for i in (1..rows.len()).rev() {
        rows.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for c in rows {
        let prio = c.priority.map(|p| p.to_string()).unwrap_or_default();
        let fields = [c.id.to_string(), c.name.clone(), prio, c.allocation.clone()];
        let row: Vec<String> = order.iter().map(|&k| pad(rng, &fields[k])).collect();
        t.push_str(&row.join(","));
        t.push_str(nl);
        if rng.one_in(8) {
            t.push_str("  # a comment");
            t.push_str(nl);
        }
    }
    t
}

/// A valid IO-class CSV text (for the configuration record's generator too).
pub(crate) fn gen_csv_text(rng: &mut Rng) -> String {
    let classes = gen_classes(rng);
    csv_text(rng, &classes)
}

/// The canonical CSV (`to_csv`) length of a model.
fn canonical_len(classes: &[ModelClass]) -> usize {
    let header = "IO class id,IO class name,Eviction priority,Allocation\n".len();
    header
        + classes
            .iter()
            .map(|c| {
                let prio = c.priority.map(|p| p.to_string()).unwrap_or_default();
                format!(
                    "{},{},{},{}.{:02}\n",
                    c.id,
                    c.name,
                    prio,
                    c.pct / 100,
                    c.pct % 100
                )
                .len()
            })
            .sum::<usize>()
}

fn classify_model(classes: &[ModelClass], io: &IoInfo) -> u8 {
    let mut sorted: Vec<&ModelClass> = classes.iter().filter(|c| c.id != 0).collect();
    sorted.sort_by_key(|c| c.id);
    let mut current = 0u8;
    for c in sorted {
        let h = if c.any {
            c.conds.iter().any(|x| x.holds(io, current))
        } else {
            c.conds.iter().all(|x| x.holds(io, current))
        };
        if h {
            current = c.id;
            if c.done {
                break;
            }
        }
    }
    current
}

fn gen_io(rng: &mut Rng) -> IoInfo {
    let lba_bits = if rng.one_in(4) { 64 } else { 12 };
    let top = 1 << rng.below(17);
    IoInfo {
        core: CoreId(rng.below(256) as u16),
        is_write: rng.one_in(2),
        lba: Lba(rng.interesting(lba_bits)),
        bytes: 512 * rng.range(1, top),
    }
}

const CSV_DICT: &[&str] = &[
    ",",
    "\n",
    "\r\n",
    "&",
    "|",
    ":",
    "done",
    "&done",
    "|done",
    "eq",
    "ne",
    "lt",
    "gt",
    "le",
    "ge",
    "#",
    " ",
    "\"",
    "unclassified",
    "request_size",
    "lba",
    "core_id",
    "io_class",
    "io_direction",
    "read",
    "write",
    "file_size",
    "pid",
    "0",
    "1",
    "33",
    "34",
    "255",
    "256",
    "1.00",
    "0.5",
    ".25",
    "1.001",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "\u{feff}",
    "é",
    "IO class id",
    "Allocation",
    "Eviction priority",
    "IO class name",
    "\t",
    "\u{0}",
];

/// A valid IO-class CSV; the table it parses to matches the model, and so does classification.
pub fn gen_ioclass_csv(rng: &mut Rng) -> Sample {
    let classes = gen_classes(rng);
    let text = csv_text(rng, &classes);
    match IoClassTable::parse_csv(&text) {
        Ok(t) => {
            let got: Vec<(u8, String, Option<u8>, u8)> = t
                .classes()
                .map(|c| (c.id, c.name.clone(), c.priority, c.allocation_pct))
                .collect();
            let mut want: Vec<(u8, String, Option<u8>, u8)> = classes
                .iter()
                .map(|c| (c.id, c.name.clone(), c.priority, c.pct))
                .collect();
            want.sort_by_key(|c| c.0);
            assert_eq!(got, want, "IO class CSV round trip:\n{text}");
            for _ in 0..8 {
                let io = gen_io(rng);
                assert_eq!(
                    t.classify(&io),
                    classify_model(&classes, &io),
                    "classification of {io:?} by\n{text}"
                );
            }
            round_trip_checked();
        }
        Err(e) => {
            // The one valid-looking table the parser refuses: too long to persist.
            assert!(
                canonical_len(&classes) > STRING_MAX,
                "a valid IO class CSV was refused: {e}\n{text}"
            );
        }
    }
    Sample {
        bytes: text.into_bytes(),
        dict: CSV_DICT,
        ..Sample::default()
    }
}

/// Fuzz target: an IO-class CSV (bytes as UTF-8, invalid sequences replaced). Accepted tables
/// write back (`to_csv`) to text that parses to the same table, classify every request into a
/// class they have, and fit the configuration record a persistent cache writes.
pub fn ioclass_csv(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(t) = IoClassTable::parse_csv(&text) else {
        return false;
    };
    let ids: Vec<u8> = t.classes().map(|c| c.id).collect();
    assert_eq!(ids.first(), Some(&0), "class 0 first");
    assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids.iter().all(|&i| i < 34));
    assert!(t.classes().all(|c| c.allocation_pct <= 100));
    let csv = t.to_csv();
    let back = IoClassTable::parse_csv(&csv)
        .unwrap_or_else(|e| panic!("to_csv output refused: {e}\n{csv}"));
    assert_eq!(back, t, "IO class table re-encode");
    assert_eq!(back.to_csv(), csv);
    let mut rng = Rng::new(data.len() as u64 ^ data.iter().map(|&b| b as u64).sum::<u64>());
    for _ in 0..4 {
        let c = t.classify(&gen_io(&mut rng));
        assert!(t.class(c).is_some(), "classified into missing class {c}");
    }
    // What a persistent cache writes when the table is loaded (core/src/cache/tables.rs).
    let rec = ConfigRecord {
        mode: 1,
        eviction: 1,
        promotion: (1, 3, 80),
        cleaning: 1,
        alru: [20, 120, 100, 10_000],
        acp: [10, 128],
        rate: (true, 50, 200),
        io_classes_csv: csv,
    };
    assert_eq!(decode_config(&encode_config(&rec)), Ok(rec));
    round_trip_checked();
    true
}

// ===== daemon config (TOML) =====

const DEVICES: &[&str] = &[
    "ram:64m",
    "ram:512",
    "ram:1G",
    "/dev/nvme0n1p1",
    "/dev/disk/by-id/ata-EXAMPLE-HDD1",
    "relative/disk.img",
    "emu:hdd-10k-sas:/tmp/disk.img",
    "emu:nvme-p4510:/tmp/c.img",
    "nbd:nbd+unix:///e?socket=/run/x.sock",
    "nbd:nbd://127.0.0.1:10809/e",
    "rbd:pool/image",
    "powercut:/tmp/p.img",
    "/tmp/dir with spaces/é.img",
];

fn gen_value(rng: &mut Rng, depth: u32) -> toml::Value {
    match rng.below(if depth > 1 { 6 } else { 8 }) {
        0 | 1 => toml::Value::String(
            rng.pick(&["full", "alru", "1m", "8", "never", "", "wb", "é\"\\\n"])
                .to_string(),
        ),
        2 => toml::Value::Integer(rng.interesting(64) as i64),
        3 => toml::Value::Boolean(rng.one_in(2)),
        4 => toml::Value::Float(*rng.pick(&[0.5, -0.0, 1e300, f64::INFINITY, 3.25])),
        5 => toml::Value::Datetime("1979-05-27T07:32:00Z".parse().expect("a datetime")),
        6 => toml::Value::Array(
            (0..rng.below(3))
                .map(|_| gen_value(rng, depth + 1))
                .collect(),
        ),
        _ => toml::Value::Table(
            (0..rng.below(3))
                .map(|i| (format!("k{i}"), gen_value(rng, depth + 1)))
                .collect(),
        ),
    }
}

/// The canonical value of a parsed config: every field, defaults spelled out.
fn config_value(c: &ConfigFile) -> toml::Value {
    use toml::Value as V;
    let mut root = toml::Table::new();
    let mut d = toml::Table::new();
    if let Some(s) = &c.daemon.socket {
        d.insert("socket".into(), V::String(s.clone()));
    }
    if let Some(l) = &c.daemon.nbd_listen {
        d.insert(
            "nbd_listen".into(),
            V::Array(l.iter().map(|s| V::String(s.clone())).collect()),
        );
    }
    if let Some(s) = &c.daemon.metrics_listen {
        d.insert("metrics_listen".into(), V::String(s.clone()));
    }
    root.insert("daemon".into(), V::Table(d));
    let caches = c
        .cache
        .iter()
        .map(|k| {
            let mut t = toml::Table::new();
            t.insert("id".into(), V::Integer(k.id as i64));
            t.insert("device".into(), V::String(k.device.clone()));
            if let Some(m) = &k.mode {
                t.insert("mode".into(), V::String(m.clone()));
            }
            if let Some(l) = &k.line_size {
                t.insert("line_size".into(), V::String(l.clone()));
            }
            t.insert("force_bare_core".into(), V::Boolean(k.force_bare_core));
            let params: toml::Table = k
                .params
                .iter()
                .map(|(g, m)| {
                    let m: toml::Table = m.iter().map(|(a, b)| (a.clone(), b.clone())).collect();
                    (g.clone(), V::Table(m))
                })
                .collect();
            t.insert("params".into(), V::Table(params));
            let cores = k
                .core
                .iter()
                .map(|x| {
                    let mut t = toml::Table::new();
                    t.insert("id".into(), V::Integer(x.id as i64));
                    t.insert("device".into(), V::String(x.device.clone()));
                    if let Some(e) = &x.export {
                        t.insert("export".into(), V::String(e.clone()));
                    }
                    V::Table(t)
                })
                .collect();
            t.insert("core".into(), V::Array(cores));
            V::Table(t)
        })
        .collect();
    root.insert("cache".into(), V::Array(caches));
    V::Table(root)
}

/// A config model as its canonical value (see [`config_value`]).
fn gen_config_value(rng: &mut Rng) -> toml::Value {
    use toml::Value as V;
    let mut root = toml::Table::new();
    let mut d = toml::Table::new();
    if rng.one_in(2) {
        d.insert(
            "socket".into(),
            V::String("/run/tiercache/admin.sock".into()),
        );
    }
    if rng.one_in(2) {
        let l = (0..rng.below(3))
            .map(|i| V::String(format!("unix:/run/tc{i}.sock")))
            .collect();
        d.insert("nbd_listen".into(), V::Array(l));
    }
    if rng.one_in(3) {
        d.insert(
            "metrics_listen".into(),
            V::String(rng.pick(&["127.0.0.1:9745", "none"]).to_string()),
        );
    }
    root.insert("daemon".into(), V::Table(d));
    let mut ids: Vec<u16> = Vec::new();
    let mut exports: Vec<String> = Vec::new();
    let caches = (0..rng.below(4))
        .map(|_| {
            let id = loop {
                let id = if rng.one_in(4) {
                    rng.range(1, 16384)
                } else {
                    rng.range(1, 8)
                } as u16;
                if !ids.contains(&id) {
                    ids.push(id);
                    break id;
                }
            };
            let mut t = toml::Table::new();
            t.insert("id".into(), V::Integer(id as i64));
            t.insert("device".into(), V::String(rng.pick(DEVICES).to_string()));
            if rng.one_in(2) {
                let m = *rng.pick(&["wt", "wb", "wa", "wi", "pt", "wo", "bogus"]);
                t.insert("mode".into(), V::String(m.into()));
            }
            if rng.one_in(2) {
                let l = *rng.pick(&["4k", "64k", "8K", "7k"]);
                t.insert("line_size".into(), V::String(l.into()));
            }
            t.insert("force_bare_core".into(), V::Boolean(rng.one_in(4)));
            let mut params = toml::Table::new();
            for _ in 0..rng.below(4) {
                let g = rng
                    .pick(&[
                        "seq-cutoff",
                        "cleaning",
                        "cleaning-alru",
                        "promotion",
                        "a b",
                        "",
                    ])
                    .to_string();
                let m: toml::Table = (0..rng.below(4))
                    .map(|_| {
                        let k = rng
                            .pick(&["policy", "threshold", "wake-up", "x.y", "é"])
                            .to_string();
                        (k, gen_value(rng, 0))
                    })
                    .collect();
                params.insert(g, V::Table(m));
            }
            t.insert("params".into(), V::Table(params));
            let mut core_ids: Vec<u16> = Vec::new();
            let cores = (0..rng.below(4))
                .map(|_| {
                    let cid = loop {
                        let max = if rng.one_in(4) { 65536 } else { 6 };
                        let c = rng.below(max) as u16;
                        if !core_ids.contains(&c) {
                            core_ids.push(c);
                            break c;
                        }
                    };
                    let mut c = toml::Table::new();
                    c.insert("id".into(), V::Integer(cid as i64));
                    c.insert("device".into(), V::String(rng.pick(DEVICES).to_string()));
                    let name = if rng.one_in(3) {
                        None
                    } else {
                        Some(format!("vm{}", rng.below(1000)))
                    };
                    let effective = name.clone().unwrap_or(format!("cache{id}-core{cid}"));
                    if !exports.contains(&effective) {
                        exports.push(effective);
                        if let Some(n) = name {
                            c.insert("export".into(), V::String(n));
                        }
                        Some(V::Table(c))
                    } else {
                        None
                    }
                })
                .collect::<Vec<_>>()
                .into_iter()
                .flatten()
                .collect();
            t.insert("core".into(), V::Array(cores));
            V::Table(t)
        })
        .collect();
    root.insert("cache".into(), V::Array(caches));
    V::Table(root)
}

/// Writes a canonical value as a config file, leaving out defaults at random.
fn config_text(rng: &mut Rng, v: &toml::Value) -> String {
    let mut v = v.clone();
    if let toml::Value::Table(root) = &mut v {
        if root
            .get("daemon")
            .and_then(|d| d.as_table())
            .is_some_and(|d| d.is_empty())
            && rng.one_in(2)
        {
            root.remove("daemon");
        }
        if let Some(toml::Value::Array(caches)) = root.get_mut("cache") {
            for c in caches.iter_mut() {
                let toml::Value::Table(t) = c else { continue };
                if t.get("force_bare_core") == Some(&toml::Value::Boolean(false)) && rng.one_in(2) {
                    t.remove("force_bare_core");
                }
                for k in ["params", "core"] {
                    let empty = match t.get(k) {
                        Some(toml::Value::Table(x)) => x.is_empty(),
                        Some(toml::Value::Array(x)) => x.is_empty(),
                        _ => false,
                    };
                    if empty && rng.one_in(2) {
                        t.remove(k);
                    }
                }
            }
            if caches.is_empty() && rng.one_in(2) {
                root.remove("cache");
            }
        }
    }
    let text = if rng.one_in(2) {
        toml::to_string_pretty(&v)
    } else {
        toml::to_string(&v)
    };
    let mut text = text.expect("a config value serializes");
    if rng.one_in(4) {
        text.insert_str(0, "# tiercache config\n\n");
    }
    text
}

const TOML_DICT: &[&str] = &[
    "[[cache]]\n",
    "[[cache.core]]\n",
    "[daemon]\n",
    "[cache.params]\n",
    "[cache]\n",
    "id = ",
    "device = ",
    "export = ",
    "mode = ",
    "line_size = ",
    "force_bare_core = ",
    "nbd_listen = ",
    "=",
    "\"",
    "'",
    "'''",
    "\"\"\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ".",
    "\n",
    "#",
    "\\u0000",
    "\\",
    "0",
    "-1",
    "65535",
    "65536",
    "16385",
    "1e400",
    "nan",
    "inf",
    "true",
    "1979-05-27T07:32:00Z",
    "\"ram:0\"",
    "\"ram:1m\"",
    "\"emu:x:\"",
    "\"nbd:http://x\"",
    "\"\"",
    "0x10",
    "1_000",
];

/// A valid config file; it parses to the model.
pub fn gen_daemon_config(rng: &mut Rng) -> Sample {
    let v = gen_config_value(rng);
    let text = config_text(rng, &v);
    let c = ConfigFile::parse(&text)
        .unwrap_or_else(|e| panic!("a valid config was refused: {e}\n{text}"));
    assert_eq!(
        toml::to_string(&config_value(&c)).expect("serializes"),
        toml::to_string(&v).expect("serializes"),
        "config round trip:\n{text}"
    );
    round_trip_checked();
    Sample {
        bytes: text.into_bytes(),
        dict: TOML_DICT,
        ..Sample::default()
    }
}

/// Fuzz target: the daemon's config file (bytes as UTF-8, invalid sequences replaced).
/// Accepted configs keep the promises of `ConfigFile::parse` (ids unique and in range, device
/// strings valid, export names unique) and write back (`toml` serializer) to text that parses
/// to the same config.
pub fn daemon_config(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(c) = ConfigFile::parse(&text) else {
        return false;
    };
    let mut ids = std::collections::BTreeSet::new();
    let mut exports = std::collections::BTreeSet::new();
    for k in &c.cache {
        assert!(ids.insert(k.id) && (1..=16384).contains(&k.id));
        assert!(tiercache_daemon::device::DeviceSpec::parse(&k.device).is_ok());
        let mut cores = std::collections::BTreeSet::new();
        for x in &k.core {
            assert!(cores.insert(x.id));
            assert!(tiercache_daemon::device::DeviceSpec::parse(&x.device).is_ok());
            let name = x
                .export
                .clone()
                .unwrap_or_else(|| format!("cache{}-core{}", k.id, x.id));
            assert!(exports.insert(name));
        }
    }
    let v = config_value(&c);
    let text2 = toml::to_string(&v).expect("a parsed config serializes");
    let c2 = ConfigFile::parse(&text2)
        .unwrap_or_else(|e| panic!("a parsed config, written back, was refused: {e}\n{text2}"));
    assert_eq!(
        toml::to_string(&config_value(&c2)).expect("serializes"),
        text2,
        "config re-encode"
    );
    round_trip_checked();
    true
}
