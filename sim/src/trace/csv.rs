//! Our own CSV: `time_us,op,offset,length`, time in µs, offset and length in bytes, op `R`,
//! `W`, `T` (trim) or `F` (flush; offset and length 0), any case. A header line naming the
//! columns and `#` comments are ignored.

use super::{Line, LineParser, Op, Raw, csv_fields, num};

/// The parser (stateless).
pub struct Parser;

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let Some(f) = csv_fields(line, &["time_us", "op", "offset", "length"])? else {
            return Ok(Line::Ignore);
        };
        let op = match f[1] {
            "R" | "r" => Op::Read,
            "W" | "w" => Op::Write,
            "T" | "t" => Op::Trim,
            "F" | "f" => Op::Flush,
            o => return Err(format!("op '{o}' is not R, W, T or F")),
        };
        Ok(Line::Req(Raw {
            time_us: num(f[0], "time")?,
            dev: "".into(),
            op,
            offset: num(f[2], "offset")?,
            len: num(f[3], "length")?,
            stage: 0,
        }))
    }
}
