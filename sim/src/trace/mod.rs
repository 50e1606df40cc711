//! Block trace readers: the formats people have (our CSV, blkparse text, SNIA MSR Cambridge,
//! Alibaba, Tencent CBS, VMware vscsi, libCacheSim oracleGeneral, fio iologs), read into one
//! list of requests in bytes and microseconds, per device, sorted by time.
//!
//! Every record that is not a request is accounted for: `ignored` counts lines that are not
//! requests by the format's own rules (headers, comments, blkparse events of other actions,
//! fio file actions), `bad` counts lines that should have been requests and could not be read
//! (the first few are kept with `file:line: reason`). In strict mode the first bad line is the
//! error. Offsets and lengths not on 512-byte sectors are widened to whole sectors and counted.
//!
//! | module | format |
//! |---|---|
//! | [`csv`] | ours: `time_us,op,offset,length` |
//! | [`blkparse`] | `blkparse` default text output |
//! | [`msr`] | SNIA MSR Cambridge CSV (Windows filetime, host and disk columns) |
//! | [`alibaba`] | Alibaba block traces (`device_id,opcode,offset,length,timestamp`) |
//! | [`tencent`] | Tencent CBS (`timestamp,offset,size,iotype,volume`; seconds, sectors) |
//! | [`vscsi`] | VMware vscsi binary, versions 1 and 2 (as libCacheSim reads it) |
//! | [`oracle`] | libCacheSim oracleGeneral binary |
//! | [`fio`] | fio iolog versions 2 and 3 |

pub mod alibaba;
pub mod blkparse;
pub mod csv;
pub mod fio;
pub mod msr;
pub mod oracle;
pub mod select;
pub mod tencent;
pub mod vscsi;

use std::borrow::Cow;
use std::collections::HashMap;

pub use select::{DeviceSel, Trace};

/// What a request does.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read.
    Read,
    /// Write.
    Write,
    /// Discard (TRIM/UNMAP).
    Trim,
    /// Flush (no range).
    Flush,
}

/// One request, in bytes and microseconds since the trace's first request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Submission time, µs from the start of the trace.
    pub time_us: u64,
    /// First byte (a multiple of 512).
    pub offset: u64,
    /// Bytes (a multiple of 512; 0 only for flushes).
    pub len: u32,
    /// The operation.
    pub op: Op,
}

impl Request {
    /// End of the range, bytes.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

/// A record as a format's parser returns it (units already bytes and µs; the time base is the
/// format's own, made relative later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Raw<'a> {
    /// Time, µs (any base).
    pub time_us: u64,
    /// Device id (`""` for single-device formats).
    pub dev: Cow<'a, str>,
    /// The operation.
    pub op: Op,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Event stage for formats that log one request several times (blkparse `Q`/`D`/`C`),
    /// 0 elsewhere.
    pub stage: u8,
}

/// What a line or record is.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A request.
    Req(Raw<'a>),
    /// Not a request by the format's rules (header, comment, other event).
    Ignore,
}

/// A text format's line parser (may keep state, e.g. fio's version line).
pub trait LineParser {
    /// Parses one line (without its newline). `Err` is the reason the line is bad.
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String>;
}

/// The formats.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Format {
    /// `time_us,op,offset,length`.
    Csv,
    /// blkparse text.
    Blkparse,
    /// SNIA MSR Cambridge.
    Msr,
    /// Alibaba block traces.
    Alibaba,
    /// Tencent CBS.
    Tencent,
    /// VMware vscsi (binary).
    Vscsi,
    /// libCacheSim oracleGeneral (binary).
    OracleGeneral,
    /// fio iolog v2/v3.
    FioIolog,
}

/// Every format, in the order `--format auto` tries the text ones.
pub const FORMATS: [Format; 8] = [
    Format::Csv,
    Format::Blkparse,
    Format::Msr,
    Format::Alibaba,
    Format::Tencent,
    Format::FioIolog,
    Format::Vscsi,
    Format::OracleGeneral,
];

impl Format {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Blkparse => "blkparse",
            Format::Msr => "msr",
            Format::Alibaba => "alibaba",
            Format::Tencent => "tencent",
            Format::Vscsi => "vscsi",
            Format::OracleGeneral => "oracle-general",
            Format::FioIolog => "fio-iolog",
        }
    }

    /// Parses a `--format` value (`auto` is `None`).
    pub fn parse(s: &str) -> Result<Option<Format>, String> {
        if s == "auto" {
            return Ok(None);
        }
        FORMATS
            .iter()
            .copied()
            .find(|f| f.name() == s)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<&str> = FORMATS.iter().map(|f| f.name()).collect();
                format!("unknown trace format '{s}'; use auto, {}", names.join(", "))
            })
    }

    fn is_binary(self) -> bool {
        matches!(self, Format::Vscsi | Format::OracleGeneral)
    }

    fn line_parser(self) -> Option<Box<dyn LineParser>> {
        Some(match self {
            Format::Csv => Box::new(csv::Parser),
            Format::Blkparse => Box::new(blkparse::Parser::default()),
            Format::Msr => Box::new(msr::Parser),
            Format::Alibaba => Box::new(alibaba::Parser),
            Format::Tencent => Box::new(tencent::Parser),
            Format::FioIolog => Box::new(fio::Parser::default()),
            Format::Vscsi | Format::OracleGeneral => return None,
        })
    }
}

/// How to read a trace.
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// The format; `None`: sniff it.
    pub format: Option<Format>,
    /// Which device(s) to keep.
    pub device: DeviceSel,
    /// Stop at the first bad line.
    pub strict: bool,
}

/// A binary format's record parser.
type RecordParser<'b> = Box<dyn FnMut(&[u8]) -> Result<Line<'static>, String> + 'b>;

/// Bad lines kept verbatim (the rest are only counted).
pub const BAD_SHOWN: usize = 5;

/// Every record read, before device selection: one entry per request with its device index.
pub(crate) struct Collected {
    pub(crate) format: Format,
    pub(crate) devices: Vec<String>,
    pub(crate) recs: Vec<(u32, u8, Request)>,
    pub(crate) records: u64,
    pub(crate) ignored: u64,
    pub(crate) bad: u64,
    pub(crate) bad_shown: Vec<String>,
    pub(crate) widened: u64,
}

impl Collected {
    fn new(format: Format) -> Collected {
        Collected {
            format,
            devices: Vec::new(),
            recs: Vec::new(),
            records: 0,
            ignored: 0,
            bad: 0,
            bad_shown: Vec::new(),
            widened: 0,
        }
    }

    /// Accounts one parsed record; `Err` is a bad line (already located by the caller).
    fn push(&mut self, raw: Raw<'_>, dev_ix: &mut HashMap<String, u32>) -> Result<(), String> {
        let (offset, len) = if raw.op == Op::Flush {
            (0, 0)
        } else {
            if raw.len == 0 {
                return Err("length 0".into());
            }
            let start = raw.offset / 512 * 512;
            let end = raw
                .offset
                .checked_add(raw.len)
                .and_then(|e| e.checked_add(511))
                .ok_or("offset + length overflows")?
                / 512
                * 512;
            if end - start > u32::MAX as u64 / 2 {
                return Err(format!("length {} is over 2 GiB", raw.len));
            }
            if start != raw.offset || end - start != raw.len {
                self.widened += 1;
            }
            (start, (end - start) as u32)
        };
        let d = match dev_ix.get(&*raw.dev) {
            Some(&d) => d,
            None => {
                let d = self.devices.len() as u32;
                self.devices.push(raw.dev.to_string());
                dev_ix.insert(raw.dev.into_owned(), d);
                d
            }
        };
        self.recs.push((
            d,
            raw.stage,
            Request {
                time_us: raw.time_us,
                offset,
                len,
                op: raw.op,
            },
        ));
        Ok(())
    }

    /// Counts one record as parsed: a request, an ignored record, or (`Err`) a bad one.
    fn take(
        &mut self,
        parsed: Result<Line<'_>, String>,
        dev_ix: &mut HashMap<String, u32>,
    ) -> Result<(), String> {
        self.records += 1;
        match parsed? {
            Line::Req(raw) => self.push(raw, dev_ix),
            Line::Ignore => {
                self.ignored += 1;
                Ok(())
            }
        }
    }

    fn bad_line(&mut self, strict: bool, at: String, why: String) -> Result<(), String> {
        let msg = format!("{at}: {why}");
        if strict {
            return Err(msg);
        }
        self.bad += 1;
        if self.bad_shown.len() < BAD_SHOWN {
            self.bad_shown.push(msg);
        }
        Ok(())
    }
}

/// Reads a trace file (see the module docs).
pub fn read_file(path: &str, opts: &ReadOptions) -> Result<Trace, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    read_bytes(path, &bytes, opts)
}

/// Reads a trace from memory; `name` names it in messages.
pub fn read_bytes(name: &str, bytes: &[u8], opts: &ReadOptions) -> Result<Trace, String> {
    let format = match opts.format {
        Some(f) => f,
        None => sniff(bytes).map_err(|e| format!("{name}: {e}"))?,
    };
    let c = collect(name, bytes, format, opts.strict)?;
    select::select(name, c, &opts.device)
}

fn collect(name: &str, bytes: &[u8], format: Format, strict: bool) -> Result<Collected, String> {
    let mut c = Collected::new(format);
    let mut dev_ix = HashMap::new();
    if format.is_binary() {
        let (size, mut parse): (usize, RecordParser) = match format {
            Format::Vscsi => {
                let v = vscsi::version(bytes).ok_or_else(|| {
                    format!("{name}: not a vscsi trace (no version 1 or 2 record header)")
                })?;
                (v.record_size(), Box::new(move |r| vscsi::parse(v, r)))
            }
            _ => {
                let mut p = oracle::Parser::new(bytes);
                (oracle::RECORD, Box::new(move |r| p.parse(r)))
            }
        };
        let chunks = bytes.chunks_exact(size);
        if !chunks.remainder().is_empty() {
            c.bad_line(
                strict,
                format!("{name}: byte {}", bytes.len() - chunks.remainder().len()),
                format!(
                    "{} trailing bytes, less than one {size}-byte record",
                    chunks.remainder().len()
                ),
            )?;
        }
        for (i, rec) in chunks.enumerate() {
            if let Err(e) = c.take(parse(rec), &mut dev_ix) {
                c.bad_line(strict, format!("{name}: record {}", i + 1), e)?;
            }
        }
        return Ok(c);
    }
    let mut p = format.line_parser().expect("text format");
    for (i, raw_line) in bytes.split(|&b| b == b'\n').enumerate() {
        let r = match std::str::from_utf8(raw_line) {
            Err(_) => Err("not UTF-8 text".to_string()),
            Ok(s) => {
                let s = s.trim_end_matches('\r');
                if s.trim().is_empty() {
                    continue;
                }
                c.take(p.parse(s), &mut dev_ix)
            }
        };
        if let Err(e) = r {
            c.bad_line(strict, format!("{name}:{}", i + 1), e)?;
        }
    }
    Ok(c)
}

/// Guesses the format: binary traces by their record headers, text traces by which parser
/// reads most of the first 64 non-empty lines.
pub fn sniff(bytes: &[u8]) -> Result<Format, String> {
    let head = &bytes[..bytes.len().min(4096)];
    if bytes.is_empty() {
        return Err("the trace is empty".into());
    }
    if head.contains(&0) {
        if vscsi::version(bytes).is_some() {
            return Ok(Format::Vscsi);
        }
        if bytes.len().is_multiple_of(oracle::RECORD) {
            return Ok(Format::OracleGeneral);
        }
        return Err(
            "cannot tell the trace format (binary, but neither vscsi nor oracleGeneral); give --format"
                .into(),
        );
    }
    let text = String::from_utf8_lossy(head);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(64)
        .collect();
    let mut best: Option<(Format, usize)> = None;
    let mut tie = false;
    for f in FORMATS {
        let Some(mut p) = f.line_parser() else {
            continue;
        };
        let n = lines
            .iter()
            .filter(|l| matches!(p.parse(l), Ok(Line::Req(_))))
            .count();
        match best {
            Some((_, b)) if n == b && n > 0 => tie = true,
            Some((_, b)) if n <= b => {}
            _ => {
                best = Some((f, n));
                tie = false;
            }
        }
    }
    match best {
        Some((f, n)) if n > 0 && !tie => Ok(f),
        _ => Err("cannot tell the trace format from its first lines; give --format".into()),
    }
}

/// Splits a CSV line into exactly `names.len()` trimmed fields. `None`: a `#` comment or the
/// header (first field equal to `names[0]`, any case). The error names the columns expected.
pub(crate) fn csv_fields<'a>(
    line: &'a str,
    names: &[&str],
) -> Result<Option<Vec<&'a str>>, String> {
    let f: Vec<&str> = line.split(',').map(str::trim).collect();
    if line.trim_start().starts_with('#') || f[0].eq_ignore_ascii_case(names[0]) {
        return Ok(None);
    }
    if f.len() != names.len() {
        return Err(format!(
            "expected {}, got {} fields",
            names.join(","),
            f.len()
        ));
    }
    Ok(Some(f))
}

/// Parses a decimal unsigned number, naming the field in the error.
pub(crate) fn num(s: &str, what: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("{what} '{}' is not a number", s.trim()))
}

/// Parses seconds with a fraction (`12.345678901`) into µs, without floating point error
/// for up to 9 fraction digits.
pub(crate) fn secs_to_us(s: &str, what: &str) -> Result<u64, String> {
    let bad = || format!("{what} '{s}' is not a time in seconds");
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    let i: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let mut us = 0u64;
    for k in 0..6 {
        us = us * 10 + frac.as_bytes().get(k).map_or(0, |b| (b - b'0') as u64);
    }
    i.checked_mul(1_000_000)
        .and_then(|v| v.checked_add(us))
        .ok_or_else(bad)
}
