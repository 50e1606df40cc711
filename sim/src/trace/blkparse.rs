//! `blkparse` default text output, one event per line:
//! `maj,min cpu seq seconds.nanoseconds pid action rwbs [sector + blocks] [process]`.
//!
//! A request appears once per stage; queue (`Q`), issue (`D`) and completion (`C`) events are
//! read, and the trace keeps the earliest stage present (`Q`, else `D`, else `C`: see
//! [`stage_name`]); other actions (merges, plugs, remaps, ...) are ignored. RWBS: `D` is a
//! discard (trim), `W` a write, `R` a read, a leading `F` without data a flush. The per-CPU
//! summary blkparse prints at the end is ignored. The device is `maj,min`.

use super::{Line, LineParser, Op, Raw, num, secs_to_us};

/// The parser: remembers whether the closing summary has begun.
#[derive(Default)]
pub struct Parser {
    summary: bool,
}

/// The action letter of a stage number (1 `Q`, 2 `D`, 3 `C`).
pub fn stage_name(stage: u8) -> char {
    match stage {
        1 => 'Q',
        2 => 'D',
        3 => 'C',
        _ => '?',
    }
}

fn is_dev(s: &str) -> bool {
    s.split_once(',').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    })
}

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let first = f.first().copied().unwrap_or("");
        if self.summary {
            return Ok(Line::Ignore);
        }
        if (first.starts_with("CPU") || first == "Total") && line.contains('(') {
            self.summary = true;
            return Ok(Line::Ignore);
        }
        if !is_dev(first) {
            return Err(format!("'{first}' is not a maj,min device"));
        }
        if f.len() < 7 {
            return Err(format!("expected at least 7 fields, got {}", f.len()));
        }
        let stage = match f[5] {
            "Q" => 1,
            "D" => 2,
            "C" => 3,
            a if a.len() <= 2 && a.bytes().all(|c| c.is_ascii_alphabetic()) => {
                return Ok(Line::Ignore);
            }
            a => return Err(format!("'{a}' is not a blkparse action")),
        };
        let time_us = secs_to_us(f[3], "time")?;
        let rwbs = f[6];
        let (offset, len) = if f.len() >= 10 && f[8] == "+" {
            (
                num(f[7], "sector")?
                    .checked_mul(512)
                    .ok_or("sector overflows")?,
                num(f[9], "blocks")?.saturating_mul(512),
            )
        } else {
            (0, 0)
        };
        let op = if rwbs.contains('D') {
            Op::Trim
        } else if rwbs.starts_with('F') && (len == 0 || rwbs.contains('N')) {
            Op::Flush
        } else if rwbs.contains('W') {
            Op::Write
        } else if rwbs.contains('R') {
            Op::Read
        } else if rwbs.contains('N') {
            return Ok(Line::Ignore);
        } else {
            return Err(format!("RWBS '{rwbs}' has no R, W, D or F"));
        };
        if op != Op::Flush && len == 0 {
            return Err("a read, write or discard without 'sector + blocks'".into());
        }
        Ok(Line::Req(Raw {
            time_us,
            dev: f[0].into(),
            op,
            offset,
            len,
            stage,
        }))
    }
}
