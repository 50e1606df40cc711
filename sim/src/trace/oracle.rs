//! libCacheSim's oracleGeneral binary traces: 24-byte little-endian records
//! `clock_time u32 (s), obj_id u64, obj_size u32, next_access_vtime i64`. All requests are
//! reads (the format has no operation). `obj_id` is a hash of the original key, not an
//! address, so each distinct object is placed in its own slot: slot k (in order of first
//! appearance) at `k × slot`, where `slot` is the largest object size rounded up to a power of
//! two (at least 4 KiB), so no two objects share a cache line of up to that size.

use super::{Line, Op, Raw};
use std::collections::HashMap;

/// Bytes per record.
pub const RECORD: usize = 24;

/// Parses records in order, placing objects in slots (state: the slots given so far).
pub struct Parser {
    slot: u64,
    slots: HashMap<u64, u64>,
}

impl Parser {
    /// A parser for the records in `bytes` (read once here for the largest object).
    pub fn new(bytes: &[u8]) -> Parser {
        let largest = bytes
            .chunks_exact(RECORD)
            .map(|r| u32::from_le_bytes(r[12..16].try_into().expect("4 bytes")) as u64)
            .max()
            .unwrap_or(512);
        Parser {
            slot: largest.next_power_of_two().max(4096),
            slots: HashMap::new(),
        }
    }

    /// Parses one record.
    pub fn parse(&mut self, r: &[u8]) -> Result<Line<'static>, String> {
        let time = u32::from_le_bytes(r[0..4].try_into().expect("4 bytes"));
        let id = u64::from_le_bytes(r[4..12].try_into().expect("8 bytes"));
        let size = u32::from_le_bytes(r[12..16].try_into().expect("4 bytes"));
        if size == 0 {
            return Err("object size 0".into());
        }
        let n = self.slots.len() as u64;
        let k = *self.slots.entry(id).or_insert(n);
        Ok(Line::Req(Raw {
            time_us: time as u64 * 1_000_000,
            dev: "".into(),
            op: Op::Read,
            offset: k
                .checked_mul(self.slot)
                .ok_or("too many objects to place")?,
            len: size as u64,
            stage: 0,
        }))
    }
}
