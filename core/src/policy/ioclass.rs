//! IO classes: Open CAS's classification CSV, accepted verbatim, and the rules it sets per class
//! (eviction priority, allocation share, pinning).
//!
//! ```text
//! IO class id,IO class name,Eviction priority,Allocation
//! 0,unclassified,22,0
//! 1,request_size:le:131072,1,1
//! ```
//!
//! - The header names the four columns, in any order. Blank lines and `#` comments are skipped.
//! - `IO class id` is 0–33; class 0 must exist and be named `unclassified`.
//! - `IO class name` is the rule: conditions joined by `&` (all must hold) or by `|` (any),
//!   never both; a `done` condition stops classification when the class matches.
//! - `Eviction priority` is 0–255, 0 most important; **empty means pinned** (never evicted for
//!   another class).
//! - `Allocation` is a share of the cache 0.00–1.00 (at most 4 characters), kept in percent.
//!
//! Conditions tiercache evaluates (operators `eq ne lt gt le ge`): `request_size:op:bytes`,
//! `lba:op:block` (the request's first 512-byte block), `io_direction:read|write`,
//! `core_id:op:n`, `io_class:n` (the class chosen so far), `done`. Conditions that need a file
//! system or a kernel (`metadata`, `direct`, `file_size`, `directory`, `extension`,
//! `file_name_prefix`, `file_offset`, `pid`, `process_name`, `wlth`) are refused with an error
//! naming the line and the rule; tiercache sees blocks, not files.
//!
//! Classification follows Open CAS (`cas_cls_classify`): start with class 0; visit classes in
//! id order; a class whose rule holds becomes the current class, and if its rule has `done`,
//! classification stops. So the last match wins unless a match says `done`.

use crate::policy::IO_CLASSES_MAX;
use crate::units::{CoreId, Lba};

/// What a classifier sees of a request.
#[derive(Copy, Clone, Debug)]
pub struct IoInfo {
    /// The core it is for.
    pub core: CoreId,
    /// Write (or write-zeroes, trim) rather than read.
    pub is_write: bool,
    /// First block (512 B).
    pub lba: Lba,
    /// Length in bytes.
    pub bytes: u64,
}

/// One IO class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoClass {
    /// Id, 0–33.
    pub id: u8,
    /// The rule text, as given (`IO class name`).
    pub name: String,
    /// Eviction priority, 0 most important; `None` = pinned.
    pub priority: Option<u8>,
    /// Allocation share, percent of the cache's lines (0–100).
    pub allocation_pct: u8,
}

/// A CSV that cannot be loaded. Nothing changes when this is returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvError {
    /// 1-based line of the text.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for CsvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for CsvError {}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl CmpOp {
    fn parse(s: &str) -> Option<CmpOp> {
        Some(match s {
            "eq" => CmpOp::Eq,
            "ne" => CmpOp::Ne,
            "lt" => CmpOp::Lt,
            "gt" => CmpOp::Gt,
            "le" => CmpOp::Le,
            "ge" => CmpOp::Ge,
            _ => return None,
        })
    }
    #[inline]
    fn holds(self, a: u64, b: u64) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Gt => a > b,
            CmpOp::Le => a <= b,
            CmpOp::Ge => a >= b,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Cond {
    Unclassified,
    Done,
    RequestSize(CmpOp, u64),
    Lba(CmpOp, u64),
    Direction { write: bool },
    CoreId(CmpOp, u64),
    IoClass(u8),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    conds: Vec<Cond>,
    any: bool,
    done: bool,
}

impl Rule {
    #[inline]
    fn holds(&self, io: &IoInfo, current: u8) -> bool {
        let one = |c: &Cond| match *c {
            Cond::Unclassified => false,
            Cond::Done => !self.any,
            Cond::RequestSize(op, v) => op.holds(io.bytes, v),
            Cond::Lba(op, v) => op.holds(io.lba.0, v),
            Cond::Direction { write } => io.is_write == write,
            Cond::CoreId(op, v) => op.holds(io.core.0 as u64, v),
            Cond::IoClass(id) => current == id,
        };
        let mut real = self.conds.iter().filter(|c| **c != Cond::Done).peekable();
        if real.peek().is_none() {
            return self.done; // a bare `done` always matches
        }
        if self.any {
            real.any(one)
        } else {
            real.all(one)
        }
    }
}

/// The IO class table in force: classes by id, with their parsed rules.
#[derive(Clone, Debug)]
pub struct IoClassTable {
    classes: Vec<IoClass>,
    rules: Vec<Rule>,
}

impl Default for IoClassTable {
    fn default() -> Self {
        Self::default_table()
    }
}

const UNSUPPORTED: &[&str] = &[
    "metadata",
    "direct",
    "file_size",
    "directory",
    "extension",
    "file_name_prefix",
    "file_offset",
    "pid",
    "process_name",
    "wlth",
];

fn parse_rule(text: &str, id: u8, line: usize) -> Result<Rule, CsvError> {
    let err = |m: String| CsvError { line, message: m };
    if text.is_empty() {
        return Err(err("empty IO class name (the rule)".into()));
    }
    if !text.bytes().all(|b| (0x20..0x7f).contains(&b)) || text.contains('"') {
        return Err(err(format!(
            "rule '{text}': printable ASCII without quotes only"
        )));
    }
    if id == 0 && text != "unclassified" {
        return Err(err(format!(
            "class 0 must be named 'unclassified', not '{text}'"
        )));
    }
    let (has_and, has_or) = (text.contains('&'), text.contains('|'));
    if has_and && has_or {
        return Err(err(format!(
            "rule '{text}': mixes '&' and '|' (use one kind)"
        )));
    }
    let any = has_or;
    let mut conds = Vec::new();
    let mut done = false;
    for part in text.split(['&', '|']) {
        let p = part.trim();
        let mut f = p.split(':');
        let name = f.next().unwrap_or("");
        let args: Vec<&str> = f.collect();
        let num = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| err(format!("rule '{text}': '{s}' in '{p}' is not a number")))
        };
        let cmp = |args: &[&str]| -> Result<(CmpOp, u64), CsvError> {
            if args.len() != 2 {
                return Err(err(format!(
                    "rule '{text}': '{p}' needs the form {name}:op:value"
                )));
            }
            let op = CmpOp::parse(args[0]).ok_or_else(|| {
                err(format!(
                    "rule '{text}': operator '{}' in '{p}' is not eq, ne, lt, gt, le or ge",
                    args[0]
                ))
            })?;
            Ok((op, num(args[1])?))
        };
        let c = match name {
            "unclassified" if args.is_empty() => {
                if id != 0 {
                    return Err(err(format!(
                        "rule '{text}': 'unclassified' is class 0's name only"
                    )));
                }
                Cond::Unclassified
            }
            "done" if args.is_empty() => {
                done = true;
                Cond::Done
            }
            "request_size" => {
                let (o, v) = cmp(&args)?;
                Cond::RequestSize(o, v)
            }
            "lba" => {
                let (o, v) = cmp(&args)?;
                Cond::Lba(o, v)
            }
            "core_id" => {
                let (o, v) = cmp(&args)?;
                Cond::CoreId(o, v)
            }
            "io_direction" => match args.as_slice() {
                ["read"] => Cond::Direction { write: false },
                ["write"] => Cond::Direction { write: true },
                _ => {
                    return Err(err(format!(
                        "rule '{text}': '{p}' must be io_direction:read or io_direction:write"
                    )));
                }
            },
            "io_class" => match args.as_slice() {
                [n] => {
                    let v = num(n)?;
                    if v as usize >= IO_CLASSES_MAX {
                        return Err(err(format!("rule '{text}': io_class {v} is not 0-33")));
                    }
                    Cond::IoClass(v as u8)
                }
                _ => return Err(err(format!("rule '{text}': '{p}' must be io_class:N"))),
            },
            n if UNSUPPORTED.contains(&n) => {
                return Err(err(format!(
                    "rule '{text}': classifier '{n}' is not supported (tiercache sees blocks, not files or processes)"
                )));
            }
            n => return Err(err(format!("rule '{text}': unknown classifier '{n}'"))),
        };
        conds.push(c);
    }
    Ok(Rule { conds, any, done })
}

fn parse_allocation(s: &str, line: usize) -> Result<u8, CsvError> {
    let err = || CsvError {
        line,
        message: format!("allocation '{s}' is not a decimal 0.00-1.00 of at most 4 characters"),
    };
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(err());
    }
    let v: f64 = s.parse().map_err(|_| err())?;
    if !(0.0..=1.0).contains(&v) {
        return Err(err());
    }
    Ok((v * 100.0).round() as u8)
}

impl IoClassTable {
    /// The table in force before any CSV is loaded: class 0 `unclassified`, priority 22 (Open
    /// CAS's default file), allocation 1.00.
    pub fn default_table() -> IoClassTable {
        IoClassTable {
            classes: vec![IoClass {
                id: 0,
                name: "unclassified".into(),
                priority: Some(22),
                allocation_pct: 100,
            }],
            rules: vec![Rule {
                conds: vec![Cond::Unclassified],
                any: false,
                done: false,
            }],
        }
    }

    /// Parses an Open CAS IO class CSV. On error nothing is built; the error names the line.
    pub fn parse_csv(text: &str) -> Result<IoClassTable, CsvError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
        let (hline, header) = lines
            .by_ref()
            .find(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .ok_or(CsvError {
                line: 1,
                message: "empty file: no header".into(),
            })?;
        let cols: Vec<String> = header
            .split(',')
            .map(|c| c.trim().to_ascii_lowercase())
            .collect();
        let col = |name: &str| {
            cols.iter().position(|c| c == name).ok_or_else(|| CsvError {
                line: hline,
                message: format!(
                    "header lacks column '{name}' (want: IO class id,IO class name,Eviction priority,Allocation)"
                ),
            })
        };
        let (c_id, c_name, c_prio, c_alloc) = (
            col("io class id")?,
            col("io class name")?,
            col("eviction priority")?,
            col("allocation")?,
        );
        if cols.len() != 4 {
            return Err(CsvError {
                line: hline,
                message: format!("header has {} columns, want 4", cols.len()),
            });
        }
        let mut rows: Vec<(IoClass, Rule)> = Vec::new();
        for (n, l) in lines {
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() != 4 {
                return Err(CsvError {
                    line: n,
                    message: format!("{} fields, want 4", f.len()),
                });
            }
            let id: u8 = f[c_id]
                .parse()
                .ok()
                .filter(|&i: &u8| (i as usize) < IO_CLASSES_MAX)
                .ok_or_else(|| CsvError {
                    line: n,
                    message: format!("IO class id '{}' is not 0-33", f[c_id]),
                })?;
            if rows.iter().any(|(c, _)| c.id == id) {
                return Err(CsvError {
                    line: n,
                    message: format!("IO class id {id} appears twice"),
                });
            }
            let rule = parse_rule(f[c_name], id, n)?;
            let priority = if f[c_prio].is_empty() {
                None
            } else {
                Some(f[c_prio].parse::<u8>().map_err(|_| CsvError {
                    line: n,
                    message: format!(
                        "eviction priority '{}' is not 0-255 (or empty: pinned)",
                        f[c_prio]
                    ),
                })?)
            };
            let allocation_pct = parse_allocation(f[c_alloc], n)?;
            rows.push((
                IoClass {
                    id,
                    name: f[c_name].to_string(),
                    priority,
                    allocation_pct,
                },
                rule,
            ));
        }
        if !rows.iter().any(|(c, _)| c.id == 0) {
            return Err(CsvError {
                line: hline,
                message: "no class 0 ('unclassified')".into(),
            });
        }
        rows.sort_by_key(|(c, _)| c.id);
        let (classes, rules) = rows.into_iter().unzip();
        Ok(IoClassTable { classes, rules })
    }

    /// The class of a request.
    pub fn classify(&self, io: &IoInfo) -> u8 {
        let mut current = 0u8;
        for (c, r) in self.classes.iter().zip(&self.rules).skip(1) {
            if r.holds(io, current) {
                current = c.id;
                if r.done {
                    break;
                }
            }
        }
        current
    }

    /// A class by id.
    pub fn class(&self, id: u8) -> Option<&IoClass> {
        self.classes.iter().find(|c| c.id == id)
    }

    /// Every class, by id.
    pub fn classes(&self) -> impl Iterator<Item = &IoClass> {
        self.classes.iter()
    }

    /// The table as an Open CAS CSV (what `parse_csv` reads back to the same table).
    pub fn to_csv(&self) -> String {
        let mut s = String::from("IO class id,IO class name,Eviction priority,Allocation\n");
        for c in &self.classes {
            let p = c.priority.map_or(String::new(), |p| p.to_string());
            s.push_str(&format!(
                "{},{},{},{:.2}\n",
                c.id,
                c.name,
                p,
                c.allocation_pct as f64 / 100.0
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STUDY: &str = "IO class id,IO class name,Eviction priority,Allocation\n0,unclassified,22,0\n1,request_size:le:131072,1,1\n";

    fn io(bytes: u64, lba: u64, write: bool, core: u16) -> IoInfo {
        IoInfo {
            core: CoreId(core),
            is_write: write,
            lba: Lba(lba),
            bytes,
        }
    }

    #[test]
    fn study_csv() {
        let t = IoClassTable::parse_csv(STUDY).unwrap();
        assert_eq!(t.classify(&io(4096, 0, false, 0)), 1);
        assert_eq!(t.classify(&io(131072, 0, true, 0)), 1);
        assert_eq!(t.classify(&io(262144, 0, false, 0)), 0);
        assert_eq!(t.class(0).unwrap().allocation_pct, 0);
        assert_eq!(t.class(1).unwrap().priority, Some(1));
        assert_eq!(
            IoClassTable::parse_csv(&t.to_csv()).unwrap().classes,
            t.classes
        );
    }

    #[test]
    fn columns_any_order_pinning_or_done_and_chaining() {
        let csv = "Allocation,IO class name,IO class id,Eviction priority\n\
                   1,unclassified,0,22\n\
                   0.25,io_direction:write|lba:ge:1000,1,\n\
                   0.5,core_id:eq:2&done,2,3\n\
                   1.00,io_class:1&request_size:gt:4096,3,7\n";
        let t = IoClassTable::parse_csv(csv).unwrap();
        assert_eq!(
            t.class(1).unwrap().priority,
            None,
            "empty priority is pinned"
        );
        assert_eq!(t.class(1).unwrap().allocation_pct, 25);
        assert_eq!(t.classify(&io(512, 0, false, 0)), 0);
        assert_eq!(t.classify(&io(512, 0, true, 0)), 1, "| rule: either side");
        assert_eq!(t.classify(&io(512, 2000, false, 0)), 1);
        assert_eq!(
            t.classify(&io(8192, 2000, false, 0)),
            3,
            "last match wins, io_class chains"
        );
        assert_eq!(
            t.classify(&io(8192, 2000, false, 2)),
            2,
            "done stops before class 3"
        );
        let back = IoClassTable::parse_csv(&t.to_csv()).unwrap();
        assert_eq!(back.classes, t.classes);
        assert_eq!(back.classify(&io(8192, 2000, false, 2)), 2);
    }

    #[test]
    fn refusals_name_the_line_and_the_rule() {
        let h = "IO class id,IO class name,Eviction priority,Allocation\n";
        let cases: &[(&str, usize, &str)] = &[
            (
                "0,unclassified,22,1\n1,file_name_prefix:foo,1,1\n",
                3,
                "file_name_prefix",
            ),
            (
                "0,unclassified,22,1\n1,lba:lt:5&io_direction:read|done,1,1\n",
                3,
                "mixes",
            ),
            ("0,unclassified,22,1.5\n", 2, "allocation"),
            ("0,unclassified,22,0.125\n", 2, "allocation"),
            ("0,unclassified,22,1\n34,done,1,1\n", 3, "0-33"),
            ("0,unclassified,22,1\n1,done,1,1\n1,done,1,1\n", 4, "twice"),
            ("1,done,1,1\n", 1, "class 0"),
            ("0,other,22,1\n", 2, "unclassified"),
            ("0,unclassified,22,1\n1,lba:about:5,1,1\n", 3, "operator"),
            (
                "0,unclassified,22,1\n1,request_size:le:big,1,1\n",
                3,
                "not a number",
            ),
            ("0,unclassified,256,1\n", 2, "priority"),
            (
                "0,unclassified,22,1\n1,colour:red,1,1\n",
                3,
                "unknown classifier",
            ),
            ("0,unclassified,22\n", 2, "fields"),
        ];
        for (body, line, what) in cases {
            let e = IoClassTable::parse_csv(&format!("{h}{body}")).unwrap_err();
            assert_eq!(e.line, *line, "{body}: {e}");
            assert!(e.message.contains(what), "{body}: {e}");
        }
        let e = IoClassTable::parse_csv("IO class id,Eviction priority,Allocation\n").unwrap_err();
        assert!(e.message.contains("io class name"), "{e}");
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let alphabet = b"0123456789,.:&|_abcdefghijklmnopqrstuvwxyz \n#\"\xff";
        for _ in 0..500 {
            let mut bytes = b"IO class id,IO class name,Eviction priority,Allocation\n".to_vec();
            for _ in 0..(x % 200) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8_lossy(&bytes);
            if let Ok(t) = IoClassTable::parse_csv(&text) {
                let _ = t.classify(&io(4096, 7, true, 1));
            }
        }
    }
}
