//! fio iologs (`write_iolog`, `read_iolog`), versions 2 and 3. The first line says which:
//! `fio version 2 iolog` or `fio version 3 iolog`. Then one action per line:
//! v2 `file action [offset length]`, v3 `time_us file action [offset length]` (fio writes the
//! time in µs since the job started). Actions `read`, `write`, `trim`, `sync`/`datasync`
//! (flushes) are requests; `add`, `open`, `close` are ignored; v2's `wait N` moves time to N ms
//! after the start (v2 has no other timing, so requests between waits share one time). The
//! device is the file name.

use super::{Line, LineParser, Op, Raw, num};

/// The parser: the version line seen, and v2's current time.
#[derive(Default)]
pub struct Parser {
    version: Option<u8>,
    v2_time_us: u64,
}

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let line = line.trim();
        if let Some(v) = line
            .strip_prefix("fio version ")
            .and_then(|r| r.strip_suffix(" iolog"))
        {
            return match v {
                "2" | "3" => {
                    self.version = Some(if v == "2" { 2 } else { 3 });
                    Ok(Line::Ignore)
                }
                _ => Err(format!("fio iolog version {v} is not supported (2 or 3)")),
            };
        }
        let Some(version) = self.version else {
            return Err("no 'fio version 2 iolog' or 'fio version 3 iolog' line before".into());
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let (time_us, rest) = if version == 3 {
            let Some((t, rest)) = f.split_first() else {
                return Err("empty".into());
            };
            (num(t, "time")?, rest)
        } else {
            (self.v2_time_us, &f[..])
        };
        let (file, action, args) = match rest {
            [file, action, args @ ..] => (*file, *action, args),
            _ => return Err("expected 'file action [offset length]'".into()),
        };
        let op = match action {
            "add" | "open" | "close" => return Ok(Line::Ignore),
            "wait" if version == 2 => {
                let ms = num(args.first().copied().unwrap_or(""), "wait")?;
                self.v2_time_us = ms.saturating_mul(1000);
                return Ok(Line::Ignore);
            }
            "read" => Op::Read,
            "write" => Op::Write,
            "trim" => Op::Trim,
            "sync" | "datasync" => Op::Flush,
            a => return Err(format!("'{a}' is not a fio iolog action")),
        };
        let (offset, len) = match (op, args) {
            (Op::Flush, _) => (0, 0),
            (_, [o, l, ..]) => (num(o, "offset")?, num(l, "length")?),
            _ => return Err(format!("{action} without offset and length")),
        };
        Ok(Line::Req(Raw {
            time_us,
            dev: file.into(),
            op,
            offset,
            len,
            stage: 0,
        }))
    }
}
