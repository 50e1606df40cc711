//! Tencent CBS block traces (SNIA IOTTA, 2018): `timestamp,offset,size,iotype,volume_id`,
//! timestamp in seconds (Unix time), offset and size in 512-byte sectors, iotype `0` read and
//! `1` write. Many volumes per file.

use super::{Line, LineParser, Op, Raw, csv_fields, num};

/// The parser (stateless).
pub struct Parser;

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let Some(f) = csv_fields(
            line,
            &["timestamp", "offset", "size", "iotype", "volume_id"],
        )?
        else {
            return Ok(Line::Ignore);
        };
        num(f[4], "volume id")?;
        let op = match f[3] {
            "0" => Op::Read,
            "1" => Op::Write,
            o => return Err(format!("iotype '{o}' is not 0 (read) or 1 (write)")),
        };
        let sectors = |s: &str, what: &str| {
            num(s, what)?
                .checked_mul(512)
                .ok_or_else(|| format!("{what} '{s}' sectors overflows"))
        };
        Ok(Line::Req(Raw {
            time_us: num(f[0], "timestamp")?
                .checked_mul(1_000_000)
                .ok_or("timestamp overflows")?,
            dev: f[4].into(),
            op,
            offset: sectors(f[1], "offset")?,
            len: sectors(f[2], "size")?,
            stage: 0,
        }))
    }
}
