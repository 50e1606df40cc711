//! SNIA MSR Cambridge traces: `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`,
//! timestamp a Windows filetime (100 ns ticks since 1601), type `Read` or `Write`, offset and
//! size in bytes. The device is `hostname_disk` (`hm_1`), as the published file names say.

use super::{Line, LineParser, Op, Raw, csv_fields, num};

/// The parser (stateless).
pub struct Parser;

impl LineParser for Parser {
    fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        let Some(f) = csv_fields(
            line,
            &[
                "Timestamp",
                "Hostname",
                "DiskNumber",
                "Type",
                "Offset",
                "Size",
                "ResponseTime",
            ],
        )?
        else {
            return Ok(Line::Ignore);
        };
        num(f[2], "disk number")?;
        if f[1].is_empty() {
            return Err("empty hostname".into());
        }
        let op = if f[3].eq_ignore_ascii_case("read") {
            Op::Read
        } else if f[3].eq_ignore_ascii_case("write") {
            Op::Write
        } else {
            return Err(format!("type '{}' is not Read or Write", f[3]));
        };
        Ok(Line::Req(Raw {
            time_us: num(f[0], "timestamp")? / 10,
            dev: format!("{}_{}", f[1], f[2]).into(),
            op,
            offset: num(f[4], "offset")?,
            len: num(f[5], "size")?,
            stage: 0,
        }))
    }
}
