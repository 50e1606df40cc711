//! IO classes: Open CAS's classification CSV, accepted verbatim, and the rules it sets per class
//! (eviction priority, allocation share, pinning).
//!
//! ```text
//! IO class id,IO class name,Eviction priority,Allocation
//! 0,unclassified,22,0
//! 1,request_size:le:131072,1,1
//! ```
//!
//! # The file
//!
//! - The first line that is not blank and not a `#` comment is the header. It names the four
//!   columns `IO class id`, `IO class name`, `Eviction priority` and `Allocation`, in any order
//!   (whitespace around a name is ignored, case is not significant). A missing, unknown or
//!   repeated column is refused.
//! - Every further line that is not blank and not a `#` comment is one class, four fields.
//! - `IO class id` is 0–33 ([`IO_CLASSES_MAX`] ids), each at most once; class 0 must exist and be
//!   named `unclassified`. It is the class of every request no other class takes.
//! - `IO class name` is the rule (see below): printable ASCII without quotes, at most
//!   [`IO_CLASS_NAME_MAX`] characters.
//! - `Eviction priority` is 0–255, 0 most important; **empty means pinned** (never evicted for
//!   another class).
//! - `Allocation` is a share of the cache 0.00–1.00 written with at most 4 characters (`0`, `1`,
//!   `0.5`, `.25`, `1.00`), kept in percent, rounded to the nearest.
//! - The whole table, as tiercache stores it ([`IoClassTable::to_csv`]), is at most
//!   [`TABLE_CSV_MAX`] bytes: a persistent cache keeps it in its configuration record. (Open
//!   CAS allows 1023-character rules in 33 classes; a table that long is refused, naming its
//!   size.)
//!
//! # Rules
//!
//! A rule is conditions joined by `&` (all must hold) or by `|` (any must hold), never both.
//! Numeric conditions take `name:op:value` with `op` one of `eq ne lt gt le ge`, or
//! `name:value` (meaning `eq`), values in decimal:
//!
//! | condition | holds when |
//! |---|---|
//! | `request_size:op:n` | the request's length in bytes compares so with `n` |
//! | `lba:op:n` | the request's first 512-byte block compares so with `n` |
//! | `core_id:op:n` | the request's core id (tiercache's [`CoreId`], below [`CORES_MAX`]) compares so |
//! | `io_class:op:n` | the class chosen so far (by lower ids) compares so with `n` (0–33) |
//! | `io_direction:read` / `io_direction:write` | the request reads / writes |
//! | `done` | always; and when the rule matches, classification stops |
//!
//! `done` is the last condition of a `&` rule (`lba:lt:256&done`), or a rule of its own. Open CAS
//! evaluates left to right and stops at `done`, so anywhere else it would silently make the rule
//! match more than it says (in a `|` rule: every request); such rules are refused.
//! `unclassified` is class 0's name and nothing else.
//!
//! Conditions that need a file system or a kernel (`metadata`, `direct`, `file_size`,
//! `directory`, `extension`, `file_name_prefix`, `file_offset`, `pid`, `process_name`, `wlth`)
//! are refused with an error naming the line, the rule and the condition; tiercache sees blocks,
//! not files. So are unknown conditions, bad operators and bad numbers. A CSV is loaded whole or
//! not at all.
//!
//! # Classification
//!
//! As Open CAS's `cas_cls_classify`: start with class 0; visit the other classes in ascending id
//! order; a class whose rule holds becomes the current class, and if its rule has `done`,
//! classification stops. So the last match wins unless a match says `done`. Rules are parsed
//! once into small condition values; [`IoClassTable::classify`] does not allocate.

use crate::policy::IO_CLASSES_MAX;
use crate::units::{CORES_MAX, CoreId, Lba};

/// The longest rule (`IO class name`) accepted, in characters: Open CAS's `OCF_IO_CLASS_NAME_MAX`
/// less its terminating NUL.
pub const IO_CLASS_NAME_MAX: usize = 1023;

/// The longest table accepted, in bytes of [`IoClassTable::to_csv`]: what the configuration
/// record of a persistent cache can hold (`tiercache_format::tables::STRING_MAX`).
pub const TABLE_CSV_MAX: usize = tiercache_format::tables::STRING_MAX;

/// The canonical header, as Open CAS writes it and [`IoClassTable::to_csv`] writes it.
const HEADER: &str = "IO class id,IO class name,Eviction priority,Allocation";

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
    /// What is wrong (one line, no trailing period).
    pub message: String,
}

impl std::fmt::Display for CsvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for CsvError {}

/// A comparison of a numeric condition.
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

/// One parsed condition (`done` is a flag of the rule, not a condition).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Cond {
    RequestSize(CmpOp, u64),
    Lba(CmpOp, u64),
    Write(bool),
    CoreId(CmpOp, u64),
    IoClass(CmpOp, u64),
}

impl Cond {
    #[inline]
    fn holds(self, io: &IoInfo, current: u8) -> bool {
        match self {
            Cond::RequestSize(op, v) => op.holds(io.bytes, v),
            Cond::Lba(op, v) => op.holds(io.lba.0, v),
            Cond::Write(w) => io.is_write == w,
            Cond::CoreId(op, v) => op.holds(u64::from(io.core.0), v),
            Cond::IoClass(op, v) => op.holds(u64::from(current), v),
        }
    }
}

/// The parsed rule of one class other than class 0.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    /// The class it assigns.
    id: u8,
    /// Its conditions; empty for a bare `done` (which always holds).
    conds: Vec<Cond>,
    /// Joined by `|` rather than `&`.
    any: bool,
    /// Ends in `done`: classification stops when it holds.
    done: bool,
}

impl Rule {
    #[inline]
    fn holds(&self, io: &IoInfo, current: u8) -> bool {
        if self.any {
            self.conds.iter().any(|c| c.holds(io, current))
        } else {
            // Also a bare `done`: no conditions, always holds.
            self.conds.iter().all(|c| c.holds(io, current))
        }
    }
}

/// The IO class table in force: classes by id, with their parsed rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoClassTable {
    /// Every class, ascending id; the first is class 0.
    classes: Vec<IoClass>,
    /// The rules of the classes other than 0, ascending id.
    rules: Vec<Rule>,
}

impl Default for IoClassTable {
    fn default() -> Self {
        Self::default_table()
    }
}

/// Open CAS conditions tiercache cannot evaluate, with what they would need.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("metadata", "files"),
    ("direct", "files"),
    ("file_size", "files"),
    ("directory", "files"),
    ("extension", "files"),
    ("file_name_prefix", "files"),
    ("file_offset", "files"),
    ("pid", "processes"),
    ("process_name", "processes"),
    ("wlth", "kernel write-lifetime hints"),
];

/// `s` for an error message: one line, printable ASCII, at most 80 characters of it.
fn show(s: &str) -> String {
    const MAX: usize = 80;
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == MAX {
            out.push_str("...");
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

/// A decimal number: ASCII digits only, fitting a `u64`.
fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Checks the characters of a rule, as Open CAS's `partition_is_name_valid` does.
fn check_name(name: &str, line: usize) -> Result<(), CsvError> {
    let err = |message: String| Err(CsvError { line, message });
    if name.is_empty() {
        return err("empty IO class name (the rule)".into());
    }
    if name.len() > IO_CLASS_NAME_MAX {
        return err(format!(
            "IO class name '{}' is {} characters, more than {IO_CLASS_NAME_MAX}",
            show(name),
            name.len()
        ));
    }
    if !name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'"') {
        return err(format!(
            "IO class name '{}' may hold printable ASCII only, without quotes",
            show(name)
        ));
    }
    Ok(())
}

/// Parses the rule of class `id` (not 0), whose characters were checked.
fn parse_rule(text: &str, id: u8, line: usize) -> Result<Rule, CsvError> {
    let err = |message: String| CsvError { line, message };
    let (has_and, has_or) = (text.contains('&'), text.contains('|'));
    if has_and && has_or {
        return Err(err(format!(
            "rule '{}' mixes '&' and '|' (use one kind per rule)",
            show(text)
        )));
    }
    let any = has_or;
    let parts: Vec<&str> = text.split(['&', '|']).map(str::trim).collect();
    let mut conds = Vec::with_capacity(parts.len());
    let mut done = false;
    for (i, &p) in parts.iter().enumerate() {
        // "in rule 'R'", or "in condition 'C' of rule 'R'" when the rule has several.
        let at = if parts.len() == 1 {
            format!("in rule '{}'", show(text))
        } else {
            format!("in condition '{}' of rule '{}'", show(p), show(text))
        };
        if p.is_empty() {
            return Err(err(format!(
                "empty condition in rule '{}' (nothing on one side of '&' or '|')",
                show(text)
            )));
        }
        let mut fields = p.split(':');
        let name = fields.next().unwrap_or_default();
        let args: Vec<&str> = fields.collect();
        let num = |s: &str| {
            parse_u64(s).ok_or_else(|| err(format!("'{}' is not a decimal number {at}", show(s))))
        };
        let cmp = || -> Result<(CmpOp, u64), CsvError> {
            match args.as_slice() {
                [v] => Ok((CmpOp::Eq, num(v)?)),
                [op, v] => {
                    let op = CmpOp::parse(op).ok_or_else(|| {
                        err(format!(
                            "unknown operator '{}' {at} (want eq, ne, lt, gt, le or ge)",
                            show(op)
                        ))
                    })?;
                    Ok((op, num(v)?))
                }
                _ => Err(err(format!(
                    "'{name}' takes {name}:op:value or {name}:value {at}"
                ))),
            }
        };
        let c = match name {
            "done" => {
                if !args.is_empty() {
                    return Err(err(format!("'done' takes no operand {at}")));
                }
                if any {
                    return Err(err(format!(
                        "'done' in a '|' rule makes it match every request {at} (Open CAS \
                         stops at 'done'); write the conditions with '&done', or in a class of \
                         their own"
                    )));
                }
                if i + 1 != parts.len() {
                    return Err(err(format!(
                        "'done' must be the last condition {at} (Open CAS stops at 'done' and \
                         ignores what follows)"
                    )));
                }
                done = true;
                continue;
            }
            "unclassified" => {
                return Err(err(format!(
                    "'unclassified' is class 0's name only, not a condition of class {id} {at}"
                )));
            }
            "request_size" => {
                let (o, v) = cmp()?;
                Cond::RequestSize(o, v)
            }
            "lba" => {
                let (o, v) = cmp()?;
                Cond::Lba(o, v)
            }
            "core_id" => {
                let (o, v) = cmp()?;
                if v >= CORES_MAX as u64 {
                    return Err(err(format!(
                        "core_id value {v} {at} is not a core id (0-{})",
                        CORES_MAX - 1
                    )));
                }
                Cond::CoreId(o, v)
            }
            "io_class" => {
                let (o, v) = cmp()?;
                if v >= IO_CLASSES_MAX as u64 {
                    return Err(err(format!(
                        "io_class value {v} {at} is not a class id (0-{})",
                        IO_CLASSES_MAX - 1
                    )));
                }
                Cond::IoClass(o, v)
            }
            "io_direction" => match args.as_slice() {
                ["read"] => Cond::Write(false),
                ["write"] => Cond::Write(true),
                _ => {
                    return Err(err(format!(
                        "io_direction takes io_direction:read or io_direction:write {at}"
                    )));
                }
            },
            n => {
                if let Some((_, needs)) = UNSUPPORTED.iter().find(|(u, _)| *u == n) {
                    return Err(err(format!(
                        "unsupported classifier '{n}' {at} (tiercache sees blocks, not {needs})"
                    )));
                }
                return Err(err(format!(
                    "unknown classifier '{}' {at} (tiercache knows request_size, lba, \
                     io_direction, core_id, io_class and done)",
                    show(n)
                )));
            }
        };
        conds.push(c);
    }
    Ok(Rule {
        id,
        conds,
        any,
        done,
    })
}

/// Parses an allocation share (0.00–1.00, at most 4 characters) into percent, rounded to the
/// nearest (halves up).
fn parse_allocation(s: &str) -> Option<u8> {
    if s.is_empty() || s.len() > 4 {
        return None;
    }
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return None;
    }
    // At most 4 characters: the whole part is below 10^4, the fraction has at most 3 digits.
    let whole: u32 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut thousandths = whole * 1000;
    let mut scale = 100;
    for b in frac.bytes() {
        thousandths += u32::from(b - b'0') * scale;
        scale /= 10;
    }
    if thousandths > 1000 {
        return None;
    }
    u8::try_from((thousandths + 5) / 10).ok()
}

/// Column positions of the four fields, from the header.
struct Columns {
    id: usize,
    name: usize,
    priority: usize,
    allocation: usize,
}

impl Columns {
    fn parse(header: &str, line: usize) -> Result<Columns, CsvError> {
        let err = |message: String| CsvError { line, message };
        const NAMES: [&str; 4] = [
            "IO class id",
            "IO class name",
            "Eviction priority",
            "Allocation",
        ];
        let mut pos: [Option<usize>; 4] = [None; 4];
        for (i, col) in header.split(',').map(str::trim).enumerate() {
            let Some(k) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(col)) else {
                return Err(err(format!(
                    "unknown column '{}' in the header (want: {HEADER})",
                    show(col)
                )));
            };
            if pos[k].is_some() {
                return Err(err(format!(
                    "column '{}' appears twice in the header",
                    NAMES[k]
                )));
            }
            pos[k] = Some(i);
        }
        let get = |k: usize| {
            pos[k].ok_or_else(|| {
                err(format!(
                    "the header lacks column '{}' (want: {HEADER})",
                    NAMES[k]
                ))
            })
        };
        Ok(Columns {
            id: get(0)?,
            name: get(1)?,
            priority: get(2)?,
            allocation: get(3)?,
        })
    }
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
            rules: Vec::new(),
        }
    }

    /// Parses an Open CAS IO class CSV (see the module documentation). On error nothing is
    /// built; the error names the line (the header's for a missing column or a missing class 0,
    /// line 1 for a text without a header).
    pub fn parse_csv(text: &str) -> Result<IoClassTable, CsvError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let (hline, header) = lines.next().ok_or_else(|| CsvError {
            line: 1,
            message: format!("no header (want: {HEADER})"),
        })?;
        let cols = Columns::parse(header, hline)?;

        let mut seen: [Option<usize>; IO_CLASSES_MAX] = [None; IO_CLASSES_MAX];
        let mut rows: Vec<(IoClass, Option<Rule>)> = Vec::new();
        for (n, l) in lines {
            let err = |message: String| CsvError { line: n, message };
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() != 4 {
                return Err(err(format!(
                    "{} fields, want 4 ({HEADER}; an IO class name holds no comma)",
                    f.len()
                )));
            }
            let (id, name, prio, alloc) = (
                f[cols.id],
                f[cols.name],
                f[cols.priority],
                f[cols.allocation],
            );

            let id = parse_u64(id)
                .filter(|&i| i < IO_CLASSES_MAX as u64)
                .ok_or_else(|| {
                    err(format!(
                        "IO class id '{}' is not 0-{}",
                        show(id),
                        IO_CLASSES_MAX - 1
                    ))
                })? as u8;
            if let Some(first) = seen[usize::from(id)] {
                return Err(err(format!(
                    "IO class id {id} appears twice (first on line {first})"
                )));
            }
            seen[usize::from(id)] = Some(n);

            check_name(name, n)?;
            let rule = if id == 0 {
                if name != "unclassified" {
                    return Err(err(format!(
                        "class 0 must be named 'unclassified', not '{}'",
                        show(name)
                    )));
                }
                None
            } else {
                Some(parse_rule(name, id, n)?)
            };

            let priority = if prio.is_empty() {
                None
            } else {
                let p = parse_u64(prio)
                    .and_then(|p| u8::try_from(p).ok())
                    .ok_or_else(|| {
                        err(format!(
                            "eviction priority '{}' is not 0-255 (or empty: pinned)",
                            show(prio)
                        ))
                    })?;
                Some(p)
            };

            let allocation_pct = parse_allocation(alloc).ok_or_else(|| {
                err(format!(
                    "allocation '{}' is not a decimal 0.00-1.00 of at most 4 characters",
                    show(alloc)
                ))
            })?;

            rows.push((
                IoClass {
                    id,
                    name: name.to_string(),
                    priority,
                    allocation_pct,
                },
                rule,
            ));
        }
        if seen[0].is_none() {
            return Err(CsvError {
                line: hline,
                message: "no class 0 (a row '0,unclassified,<priority>,<allocation>' is needed)"
                    .into(),
            });
        }
        rows.sort_by_key(|(c, _)| c.id);
        let mut classes = Vec::with_capacity(rows.len());
        let mut rules = Vec::with_capacity(rows.len().saturating_sub(1));
        for (c, r) in rows {
            classes.push(c);
            rules.extend(r);
        }
        let table = IoClassTable { classes, rules };
        // A persistent cache stores the table in its configuration record; one that does not
        // fit would stop the cache at its next superblock write (found by the fuzz targets).
        let n = table.to_csv().len();
        if n > TABLE_CSV_MAX {
            return Err(CsvError {
                line: hline,
                message: format!(
                    "the table is {n} bytes as tiercache stores it, more than {TABLE_CSV_MAX} \
                     (use shorter rules or fewer classes)"
                ),
            });
        }
        Ok(table)
    }

    /// The class of a request: the id of an existing class (0 if no rule holds).
    pub fn classify(&self, io: &IoInfo) -> u8 {
        let mut current = 0u8;
        for r in &self.rules {
            if r.holds(io, current) {
                current = r.id;
                if r.done {
                    break;
                }
            }
        }
        current
    }

    /// A class by id.
    pub fn class(&self, id: u8) -> Option<&IoClass> {
        self.classes
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|i| &self.classes[i])
    }

    /// Every class, in ascending id order (class 0 first).
    pub fn classes(&self) -> impl Iterator<Item = &IoClass> {
        self.classes.iter()
    }

    /// The table as an Open CAS CSV, as `casadm --io-class --list --output-format csv` writes it;
    /// [`IoClassTable::parse_csv`] reads it back to an equal table.
    pub fn to_csv(&self) -> String {
        let mut s = String::with_capacity(HEADER.len() + 1 + 32 * self.classes.len());
        s.push_str(HEADER);
        s.push('\n');
        for c in &self.classes {
            let prio = c.priority.map(|p| p.to_string()).unwrap_or_default();
            let pct = c.allocation_pct;
            s.push_str(&format!(
                "{},{},{},{}.{:02}\n",
                c.id,
                c.name,
                prio,
                pct / 100,
                pct % 100
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "IO class id,IO class name,Eviction priority,Allocation\n";
    const STUDY: &str = "IO class id,IO class name,Eviction priority,Allocation\n\
                         0,unclassified,22,0\n\
                         1,request_size:le:131072,1,1\n";

    fn io(bytes: u64, lba: u64, write: bool, core: u16) -> IoInfo {
        IoInfo {
            core: CoreId(core),
            is_write: write,
            lba: Lba(lba),
            bytes,
        }
    }

    fn table(rows: &str) -> IoClassTable {
        IoClassTable::parse_csv(&format!("{H}0,unclassified,22,1\n{rows}"))
            .unwrap_or_else(|e| panic!("{rows:?}: {e}"))
    }

    fn refused(body: &str) -> CsvError {
        match IoClassTable::parse_csv(&format!("{H}{body}")) {
            Ok(t) => panic!("{body:?} was accepted: {t:?}"),
            Err(e) => e,
        }
    }

    fn roundtrip(t: &IoClassTable) {
        let csv = t.to_csv();
        let back = IoClassTable::parse_csv(&csv).unwrap_or_else(|e| panic!("{csv}: {e}"));
        assert_eq!(&back, t, "{csv}");
        assert_eq!(back.to_csv(), csv);
    }

    #[test]
    fn a_table_too_long_to_persist_is_refused() {
        // 33 classes of valid 150-character rules: about 5 KiB as stored.
        let rule = |i: u32| {
            let c: Vec<String> = (0..10)
                .map(|k| format!("lba:ne:{}", 1000 * k + i))
                .collect();
            format!("{}&done", c.join("&"))
        };
        let rows: String = (1..34)
            .map(|i| format!("{i},{},1,0.01\n", rule(i)))
            .collect();
        let e = refused(&format!("0,unclassified,22,1\n{rows}"));
        assert!(e.message.contains("more than 4096"), "{e}");
        assert_eq!(e.line, 1);
        // The same classes with short rules fit.
        let rows: String = (1..34)
            .map(|i| format!("{i},lba:ge:{i},1,0.01\n"))
            .collect();
        let t = table(&rows);
        assert!(t.to_csv().len() <= TABLE_CSV_MAX);
    }

    #[test]
    fn study_csv() {
        let t = IoClassTable::parse_csv(STUDY).unwrap();
        assert_eq!(t.classify(&io(4096, 0, false, 0)), 1);
        assert_eq!(t.classify(&io(4096, 123_456, true, 3)), 1);
        assert_eq!(
            t.classify(&io(131_072, 0, true, 0)),
            1,
            "le includes the bound"
        );
        assert_eq!(t.classify(&io(131_073, 0, false, 0)), 0);
        assert_eq!(t.classify(&io(262_144, 0, false, 0)), 0);
        let c0 = t.class(0).unwrap();
        assert_eq!(
            (c0.name.as_str(), c0.priority, c0.allocation_pct),
            ("unclassified", Some(22), 0)
        );
        let c1 = t.class(1).unwrap();
        assert_eq!(
            (c1.name.as_str(), c1.priority, c1.allocation_pct),
            ("request_size:le:131072", Some(1), 100)
        );
        assert!(t.class(2).is_none());
        assert_eq!(t.classes().map(|c| c.id).collect::<Vec<_>>(), [0, 1]);
        roundtrip(&t);
    }

    #[test]
    fn default_table() {
        let t = IoClassTable::default();
        assert_eq!(t, IoClassTable::default_table());
        let c: Vec<&IoClass> = t.classes().collect();
        assert_eq!(
            c,
            [&IoClass {
                id: 0,
                name: "unclassified".into(),
                priority: Some(22),
                allocation_pct: 100
            }]
        );
        assert_eq!(t.classify(&io(4096, 0, true, 0)), 0);
        assert_eq!(t.classify(&io(u64::MAX, u64::MAX, false, u16::MAX)), 0);
        roundtrip(&t);
        assert_eq!(t.to_csv(), format!("{H}0,unclassified,22,1.00\n"));
    }

    #[test]
    fn priorities_pinning_and_allocation() {
        let t = table("1,done,0,0.5\n2,done,255,.25\n3,done,,1.00\n4,done,7,0\n");
        let p: Vec<_> = t
            .classes()
            .map(|c| (c.id, c.priority, c.allocation_pct))
            .collect();
        assert_eq!(
            p,
            [
                (0, Some(22), 100),
                (1, Some(0), 50),
                (2, Some(255), 25),
                (3, None, 100),
                (4, Some(7), 0)
            ]
        );
        roundtrip(&t);

        for (a, pct) in [
            ("0", 0),
            ("1", 100),
            ("0.5", 50),
            ("0.25", 25),
            ("1.00", 100),
            ("1.0", 100),
            ("1.", 100),
            (".5", 50),
            ("0.29", 29),
            ("0.01", 1),
            (".125", 13),
            (".004", 0),
            (".005", 1),
            (".999", 100),
            ("0000", 0),
            ("0001", 100),
        ] {
            assert_eq!(parse_allocation(a), Some(pct), "{a}");
            let t = IoClassTable::parse_csv(&format!("{H}0,unclassified,1,{a}\n")).unwrap();
            assert_eq!(t.class(0).unwrap().allocation_pct, pct, "{a}");
        }
        for a in [
            "", "1.5", "0.123", "1.01", "1.001", "2", "-0", "+.5", "1e0", "0x1", ".", "..5",
            "0.5.", "nan", "inf", " ", "1,0", "0 5",
        ] {
            assert_eq!(parse_allocation(a), None, "{a:?}");
        }
        for a in ["1.5", "0.123", "-0", "1e0", "x"] {
            let e = refused(&format!("0,unclassified,1,{a}\n"));
            assert_eq!(e.line, 2, "{e}");
            assert!(e.message.contains("allocation"), "{e}");
        }

        for p in ["256", "-1", "x", "+1", "1.0", "99999999999999999999999"] {
            let e = refused(&format!("0,unclassified,{p},1\n"));
            assert_eq!(e.line, 2, "{e}");
            assert!(e.message.contains("priority"), "{e}");
        }
    }

    #[test]
    fn header_columns_in_any_order_case_and_whitespace() {
        let csv = "\u{feff}# tiercache classes\r\n\
                   \r\n\
                   allocation , IO CLASS NAME,io class id,  Eviction Priority  \r\n\
                   1,unclassified,0,22\r\n\
                   # a comment between rows\r\n\
                   \r\n\
                   0.25 , io_direction:write|lba:ge:1000 , 1 ,\r\n\
                   0.5,core_id:eq:2&done,2,3\r\n";
        let t = IoClassTable::parse_csv(csv).unwrap();
        let p: Vec<_> = t
            .classes()
            .map(|c| (c.id, c.name.as_str(), c.priority, c.allocation_pct))
            .collect();
        assert_eq!(
            p,
            [
                (0, "unclassified", Some(22), 100),
                (1, "io_direction:write|lba:ge:1000", None, 25),
                (2, "core_id:eq:2&done", Some(3), 50)
            ]
        );
        roundtrip(&t);
    }

    #[test]
    fn header_errors() {
        let e = IoClassTable::parse_csv("IO class id,Eviction priority,Allocation\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("'IO class name'"), "{e}");
        let e = IoClassTable::parse_csv(
            "IO class id,IO class name,Eviction priority\n0,unclassified,1\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("'Allocation'"), "{e}");
        let e = IoClassTable::parse_csv(
            "IO class id,IO class name,Eviction priority,Allocation,Colour\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("unknown column 'Colour'"), "{e}");
        let e = IoClassTable::parse_csv("IO class id,IO class id,Eviction priority,Allocation\n")
            .unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        let e = IoClassTable::parse_csv("IO_class_id,IO class name,Eviction priority,Allocation\n")
            .unwrap_err();
        assert!(e.message.contains("unknown column 'IO_class_id'"), "{e}");
        for empty in ["", "\n\n", "# only\n# comments\n", "   \n"] {
            let e = IoClassTable::parse_csv(empty).unwrap_err();
            assert_eq!(e.line, 1, "{empty:?}");
            assert!(e.message.contains("no header"), "{e}");
        }
        // The header's own line is reported when comments precede it.
        let e =
            IoClassTable::parse_csv("# c\n\nIO class id,IO class name,Allocation\n").unwrap_err();
        assert_eq!(e.line, 3);
    }

    #[test]
    fn or_rules() {
        let t = table("1,io_direction:write|lba:ge:1000|request_size:lt:512,1,1\n");
        assert_eq!(t.classify(&io(4096, 0, false, 0)), 0);
        assert_eq!(t.classify(&io(4096, 0, true, 0)), 1);
        assert_eq!(t.classify(&io(4096, 1000, false, 0)), 1);
        assert_eq!(t.classify(&io(511, 0, false, 0)), 1);
        let t = table("1,io_direction:write&lba:ge:1000,1,1\n");
        assert_eq!(t.classify(&io(4096, 0, true, 0)), 0, "& needs both");
        assert_eq!(t.classify(&io(4096, 999, true, 0)), 0);
        assert_eq!(t.classify(&io(4096, 1000, true, 0)), 1);
        assert_eq!(t.classify(&io(4096, 1000, false, 0)), 0);
    }

    #[test]
    fn last_match_wins_and_done_stops() {
        let t = table(
            "1,request_size:le:65536,1,1\n\
             2,request_size:le:8192,2,1\n\
             3,request_size:le:4096&done,3,1\n\
             4,request_size:le:2048,4,1\n\
             5,io_direction:read,5,1\n",
        );
        assert_eq!(t.classify(&io(65536, 0, true, 0)), 1);
        assert_eq!(t.classify(&io(8192, 0, true, 0)), 2, "last match wins");
        assert_eq!(t.classify(&io(4096, 0, true, 0)), 3);
        assert_eq!(t.classify(&io(1024, 0, true, 0)), 3, "done stops before 4");
        assert_eq!(t.classify(&io(1024, 0, false, 0)), 3, "done stops before 5");
        assert_eq!(t.classify(&io(8192, 0, false, 0)), 5);
        assert_eq!(t.classify(&io(1 << 20, 0, false, 0)), 5);
        assert_eq!(t.classify(&io(1 << 20, 0, true, 0)), 0);
        // A bare `done` matches everything and stops.
        let t = table("1,lba:ge:0,1,1\n2,done,1,1\n3,lba:ge:0,1,1\n");
        assert_eq!(t.classify(&io(4096, 5, false, 0)), 2);
        // Ids are visited in ascending order whatever the order of the rows.
        let t = table("3,lba:lt:100,1,1\n1,lba:lt:100&done,1,1\n2,lba:lt:50,1,1\n");
        assert_eq!(t.classes().map(|c| c.id).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(t.classify(&io(4096, 10, false, 0)), 1);
        let t = table("3,lba:lt:100,1,1\n1,lba:lt:100,1,1\n2,lba:lt:50&done,1,1\n");
        assert_eq!(t.classify(&io(4096, 10, false, 0)), 2);
        assert_eq!(t.classify(&io(4096, 70, false, 0)), 3);
        roundtrip(&t);
    }

    #[test]
    fn io_class_chaining() {
        let t = table(
            "1,lba:lt:1000,1,1\n\
             2,io_class:1&io_direction:write,1,1\n\
             3,io_class:eq:0&request_size:gt:65536,1,1\n\
             4,io_class:ge:2&core_id:eq:7,1,1\n",
        );
        assert_eq!(t.classify(&io(4096, 10, false, 0)), 1);
        assert_eq!(t.classify(&io(4096, 10, true, 0)), 2);
        assert_eq!(t.classify(&io(4096, 10, true, 7)), 4);
        assert_eq!(t.classify(&io(4096, 10, false, 7)), 1, "class 1 is below 2");
        assert_eq!(t.classify(&io(1 << 20, 5000, false, 0)), 3);
        assert_eq!(
            t.classify(&io(1 << 20, 5000, false, 7)),
            4,
            "3 >= 2 chains on to 4"
        );
        assert_eq!(
            t.classify(&io(1 << 20, 10, false, 7)),
            1,
            "io_class:eq:0 fails after 1"
        );
        assert_eq!(t.classify(&io(4096, 5000, true, 0)), 0);
        roundtrip(&t);
    }

    #[test]
    fn every_condition_and_operator() {
        let ops = [
            ("eq", [false, true, false]),
            ("ne", [true, false, true]),
            ("lt", [true, false, false]),
            ("gt", [false, false, true]),
            ("le", [true, true, false]),
            ("ge", [false, true, true]),
        ];
        for (op, want) in ops {
            for (k, v) in [99u64, 100, 101].into_iter().enumerate() {
                let w = u8::from(want[k]);
                let t = table(&format!("1,request_size:{op}:100,1,1\n"));
                assert_eq!(t.classify(&io(v, 0, false, 0)), w, "request_size {op} {v}");
                let t = table(&format!("1,lba:{op}:100,1,1\n"));
                assert_eq!(t.classify(&io(4096, v, false, 0)), w, "lba {op} {v}");
                let t = table(&format!("1,core_id:{op}:100,1,1\n"));
                assert_eq!(
                    t.classify(&io(4096, 0, false, v as u16)),
                    w,
                    "core_id {op} {v}"
                );
            }
        }
        // `name:value` means eq, as in Open CAS.
        let t = table("1,lba:100,1,1\n");
        assert_eq!(t.classify(&io(1, 100, false, 0)), 1);
        assert_eq!(t.classify(&io(1, 101, false, 0)), 0);
        // io_direction.
        let t = table("1,io_direction:read,1,1\n2,io_direction:write,1,1\n");
        assert_eq!(t.classify(&io(1, 0, false, 0)), 1);
        assert_eq!(t.classify(&io(1, 0, true, 0)), 2);
        // Full u64 range.
        let t = table("1,lba:eq:18446744073709551615,1,1\n");
        assert_eq!(t.classify(&io(1, u64::MAX, false, 0)), 1);
        // Whitespace around conditions is tolerated and kept in the name.
        let t = table("1,lba:lt:5 & done,1,1\n");
        assert_eq!(t.class(1).unwrap().name, "lba:lt:5 & done");
        assert_eq!(t.classify(&io(1, 4, false, 0)), 1);
        roundtrip(&t);
    }

    #[test]
    fn unsupported_classifier_on_line_3() {
        let e = IoClassTable::parse_csv(&format!(
            "{H}0,unclassified,22,1\n1,file_name_prefix:foo,1,1\n"
        ))
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("file_name_prefix"), "{e}");
        assert_eq!(
            e.to_string(),
            "line 3: unsupported classifier 'file_name_prefix' in rule 'file_name_prefix:foo' \
             (tiercache sees blocks, not files)"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(boxed.to_string().starts_with("line 3: "));

        for (u, _) in UNSUPPORTED {
            for cond in [u.to_string(), format!("{u}:x"), format!("{u}:lt:5")] {
                let rule = format!("lba:lt:5&{cond}&done");
                let e = refused(&format!("0,unclassified,22,1\n\n7,{rule},1,1\n"));
                assert_eq!(e.line, 4, "{e}");
                assert!(
                    e.message.contains(&format!("unsupported classifier '{u}'")),
                    "{e}"
                );
                assert!(e.message.contains(&format!("'{cond}'")), "{e}");
                assert!(e.message.contains(&format!("'{rule}'")), "{e}");
            }
        }
    }

    #[test]
    fn refusals_name_the_line() {
        let ok = "0,unclassified,22,1\n";
        let cases: &[(&str, usize, &str)] = &[
            ("1,lba:lt:5&io_direction:read|done,1,1\n", 3, "mixes"),
            ("1,lba:lt:5|io_direction:read&lba:gt:9,1,1\n", 3, "mixes"),
            ("34,done,1,1\n", 3, "not 0-33"),
            ("255,done,1,1\n", 3, "not 0-33"),
            ("x,done,1,1\n", 3, "IO class id 'x'"),
            (",done,1,1\n", 3, "IO class id ''"),
            ("-1,done,1,1\n", 3, "not 0-33"),
            ("1,done,1,1\n1,lba:lt:5,1,1\n", 4, "first on line 3"),
            ("0,unclassified,1,1\n", 3, "first on line 2"),
            ("1,colour:red,1,1\n", 3, "unknown classifier 'colour'"),
            ("1,Lba:lt:5,1,1\n", 3, "unknown classifier 'Lba'"),
            ("1,lba:about:5,1,1\n", 3, "unknown operator 'about'"),
            ("1,lba:LT:5,1,1\n", 3, "unknown operator 'LT'"),
            (
                "1,request_size:le:big,1,1\n",
                3,
                "'big' is not a decimal number",
            ),
            ("1,request_size:le:-1,1,1\n", 3, "not a decimal number"),
            ("1,request_size:le:+1,1,1\n", 3, "not a decimal number"),
            ("1,request_size:le:0x10,1,1\n", 3, "not a decimal number"),
            (
                "1,request_size:le:18446744073709551616,1,1\n",
                3,
                "not a decimal number",
            ),
            ("1,request_size:le:,1,1\n", 3, "not a decimal number"),
            ("1,lba,1,1\n", 3, "lba:op:value"),
            ("1,lba:lt:5:6,1,1\n", 3, "lba:op:value"),
            ("1,io_direction:both,1,1\n", 3, "io_direction:read"),
            ("1,io_direction,1,1\n", 3, "io_direction:read"),
            ("1,io_class:34,1,1\n", 3, "not a class id"),
            ("1,io_class:lt:99,1,1\n", 3, "not a class id"),
            ("1,core_id:eq:256,1,1\n", 3, "not a core id"),
            ("1,lba:lt:5|done,1,1\n", 3, "every request"),
            ("1,done|lba:lt:5,1,1\n", 3, "every request"),
            ("1,done&lba:lt:5,1,1\n", 3, "last condition"),
            ("1,lba:lt:5&done&done,1,1\n", 3, "last condition"),
            ("1,done:1,1,1\n", 3, "no operand"),
            ("1,lba:lt:5&,1,1\n", 3, "empty condition"),
            ("1,&lba:lt:5,1,1\n", 3, "empty condition"),
            ("1,lba:lt:5||lba:gt:9,1,1\n", 3, "empty condition"),
            ("1,unclassified,1,1\n", 3, "class 0's name only"),
            ("1,lba:lt:5&unclassified,1,1\n", 3, "class 0's name only"),
            ("1,,1,1\n", 3, "empty IO class name"),
            ("1,lba:lt:\"5\",1,1\n", 3, "printable ASCII"),
            ("1,lba:lt:5\u{7f},1,1\n", 3, "printable ASCII"),
            ("1,lba:lt:5\u{e9},1,1\n", 3, "printable ASCII"),
            ("1,done,1,1,\n", 3, "5 fields"),
            ("1,done,1\n", 3, "3 fields"),
            ("1\n", 3, "1 fields"),
        ];
        for (body, line, what) in cases {
            let e = refused(&format!("{ok}{body}"));
            assert_eq!(e.line, *line, "{body:?}: {e}");
            assert!(e.message.contains(what), "{body:?}: {e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        // Class 0: misnamed on its own line, missing on the header's line.
        let e = refused("1,done,1,1\n0,other,22,1\n");
        assert_eq!(
            (e.line, e.message.contains("'unclassified'")),
            (3, true),
            "{e}"
        );
        let e = refused("0,Unclassified,22,1\n");
        assert_eq!(e.line, 2, "{e}");
        let e = refused("0,unclassified&done,22,1\n");
        assert_eq!(e.line, 2, "{e}");
        let e = refused("1,done,1,1\n2,done,1,1\n");
        assert_eq!((e.line, e.message.contains("no class 0")), (1, true), "{e}");
        let e = refused("");
        assert_eq!((e.line, e.message.contains("no class 0")), (1, true), "{e}");
        // Names up to Open CAS's limit.
        let long = format!("lba:lt:{}", "1".repeat(IO_CLASS_NAME_MAX - 7));
        assert_eq!(long.len(), IO_CLASS_NAME_MAX);
        let e = refused(&format!("{ok}1,{long},1,1\n"));
        assert!(e.message.contains("not a decimal number"), "{e}"); // accepted length, bad number
        let e = refused(&format!("{ok}1,{long}1,1,1\n"));
        assert!(e.message.contains("more than 1023"), "{e}");
        assert!(
            e.message.len() < 200,
            "long fields are cut in messages: {e}"
        );
        // Control characters are escaped in messages.
        let e = refused("0,unclassified,2\r2,1\n");
        assert!(e.message.contains("'2\\r2'"), "{e}");
    }

    #[test]
    fn to_csv_round_trips() {
        roundtrip(&IoClassTable::default_table());
        roundtrip(&IoClassTable::parse_csv(STUDY).unwrap());
        let t = table(
            "33,io_class:ge:1&done,,0.33\n\
             1,request_size:le:4096|lba:lt:2048,0,.5\n\
             2,lba:7,255,1.\n\
             3,core_id:ne:0&io_direction:write,9,.125\n\
             4,done,1,0\n",
        );
        roundtrip(&t);
        let csv = t.to_csv();
        assert!(csv.starts_with(H), "{csv}");
        assert!(csv.contains("\n33,io_class:ge:1&done,,0.33\n"), "{csv}");
        assert!(
            csv.contains("\n1,request_size:le:4096|lba:lt:2048,0,0.50\n"),
            "{csv}"
        );
        assert!(csv.contains("\n2,lba:7,255,1.00\n"), "{csv}");
        assert!(
            csv.contains("\n3,core_id:ne:0&io_direction:write,9,0.13\n"),
            "{csv}"
        );
        assert!(csv.contains("\n4,done,1,0.00\n"), "{csv}");
        // Classification survives the round trip.
        let back = IoClassTable::parse_csv(&csv).unwrap();
        for (b, l, w, c) in [
            (4096, 0, false, 0),
            (8192, 7, true, 1),
            (1, 99_999, true, 3),
        ] {
            assert_eq!(back.classify(&io(b, l, w, c)), t.classify(&io(b, l, w, c)));
        }
    }

    /// A 64-bit LCG (Knuth's MMIX constants); the high bits are the good ones.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn garbage_never_panics() {
        #[rustfmt::skip]
        const TOKENS: &[&str] = &[
            "0", "1", "33", "34", "255", "256", "0.5", "1.00", ".25", "1.5",
            "18446744073709551616", ",", ",", ",", ":", ":", "&", "|", "\n", "\n", "\r\n", "#",
            " ", "\"", "unclassified", "done", "lba", "request_size", "io_direction", "read",
            "write", "core_id", "io_class", "eq", "ne", "lt", "gt", "le", "ge", "file_name_prefix",
            "pid", "\u{feff}", "\u{e9}", "\t", "IO class id", "IO class name",
            "Eviction priority", "Allocation",
        ];
        // Pieces of valid rows, so that many tables get built and classify; one row in ten
        // gets a bad piece.
        #[rustfmt::skip]
        const CONDS: &[&str] = &[
            "lba:lt:4096", "lba:ge:100", "lba:7", "request_size:le:4096", "request_size:gt:65536",
            "io_direction:read", "io_direction:write", "core_id:eq:1", "core_id:ne:0",
            "io_class:1", "io_class:ge:2", "io_class:eq:0", "io_class:lt:3",
        ];
        const BAD: &[&str] = &["lba:xx:1", "pid:1", "done&lba:lt:1", "lba:lt:1|done", "x"];
        const PRIOS: &[&str] = &["", "0", "1", "22", "255"];
        const ALLOCS: &[&str] = &["0", "1", "0.5", ".25", "1.00"];
        let mut rng = Lcg(0x5eed_1234_abcd_ef01);
        let mut accepted = 0;
        for round in 0..600 {
            let mut bytes: Vec<u8> = Vec::new();
            if round % 3 != 0 {
                bytes.extend_from_slice(H.as_bytes());
                if round % 2 == 0 {
                    bytes.extend_from_slice(b"0,unclassified,22,1\n");
                }
            }
            if round % 5 == 4 {
                // Structured: a header and class 0, then rows of random valid-looking pieces.
                bytes.clear();
                bytes.extend_from_slice(H.as_bytes());
                bytes.extend_from_slice(b"0,unclassified,22,1\n");
                let mut used = [false; IO_CLASSES_MAX];
                for _ in 0..rng.below(8) {
                    let id = 1 + rng.below(IO_CLASSES_MAX - 1);
                    let bad = rng.below(10) == 0;
                    if used[id] && !bad {
                        continue;
                    }
                    used[id] = true;
                    let n = 1 + rng.below(3);
                    let join = if rng.below(2) == 0 { "&" } else { "|" };
                    let mut rule: Vec<&str> =
                        (0..n).map(|_| CONDS[rng.below(CONDS.len())]).collect();
                    if join == "&" && rng.below(3) == 0 {
                        rule.push("done");
                    }
                    if bad {
                        rule.push(BAD[rng.below(BAD.len())]);
                    }
                    let row = format!(
                        "{id},{},{},{}\n",
                        rule.join(join),
                        PRIOS[rng.below(PRIOS.len())],
                        ALLOCS[rng.below(ALLOCS.len())]
                    );
                    bytes.extend_from_slice(row.as_bytes());
                }
            }
            let len = if round % 5 == 4 { 0 } else { rng.below(120) };
            for _ in 0..len {
                match rng.below(4) {
                    // Any byte at all, invalid UTF-8 included.
                    0 => bytes.push(rng.next() as u8),
                    _ => bytes.extend_from_slice(TOKENS[rng.below(TOKENS.len())].as_bytes()),
                }
            }
            let text = String::from_utf8_lossy(&bytes);
            let nlines = text.lines().count().max(1);
            match IoClassTable::parse_csv(&text) {
                Ok(t) => {
                    accepted += 1;
                    let ids: Vec<u8> = t.classes().map(|c| c.id).collect();
                    assert_eq!(ids[0], 0);
                    assert!(ids.windows(2).all(|w| w[0] < w[1]));
                    for _ in 0..8 {
                        let r = io(
                            rng.next() % (1 << 21),
                            rng.next() % 4096,
                            rng.below(2) == 1,
                            rng.below(4) as u16,
                        );
                        let c = t.classify(&r);
                        assert!(t.class(c).is_some(), "{text:?} classified into {c}");
                    }
                    roundtrip(&t);
                }
                Err(e) => {
                    assert!((1..=nlines).contains(&e.line), "{text:?}: {e}");
                    assert!(!e.to_string().contains(['\n', '\r']), "{e}");
                }
            }
        }
        // The structured rounds build tables often enough to exercise classify.
        assert!(accepted >= 50, "only {accepted} of 600 texts were accepted");
    }
}
