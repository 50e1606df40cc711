//! Alibaba block traces (alibaba/block-traces, 2020): `device_id,opcode,offset,length,timestamp`,
//! opcode `R` or `W`, offset and length in bytes, timestamp in µs (Unix time). Many devices
//! per file.

use super::{Line, LineParser, Op, Raw, csv_fields, num};

/// The parser (stateless).
pub struct Parser;

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let Some(f) = csv_fields(
            line,
            &["device_id", "opcode", "offset", "length", "timestamp"],
        )?
        else {
            return Ok(Line::Ignore);
        };
        num(f[0], "device id")?;
        let op = match f[1] {
            "R" | "r" => Op::Read,
            "W" | "w" => Op::Write,
            o => return Err(format!("opcode '{o}' is not R or W")),
        };
        Ok(Line::Req(Raw {
            time_us: num(f[4], "timestamp")?,
            dev: f[0].into(),
            op,
            offset: num(f[2], "offset")?,
            len: num(f[3], "length")?,
            stage: 0,
        }))
    }
}
