//! Promotion (admission): should a miss be inserted into the cache?
//!
//! Contract: [`Promotion::admit`] is called once per request that would insert lines, with the
//! core lines it covers and the cache's occupancy; a request that already has some of its lines
//! mapped is always admitted by the caller without asking (Open CAS does the same, to avoid
//! pass-through plus invalidation). [`Promotion::on_inserted`] is called after lines were mapped.
//! A declined read goes pass-through; a declined write goes write-invalidate.

pub mod always;
pub mod nhit;

use super::{NhitParams, PromotionPolicy};
use crate::units::CoreId;

/// A promotion policy.
pub trait Promotion: Send {
    /// The policy's name as the CLI shows it.
    fn name(&self) -> &'static str;
    /// Should core lines `first..first + count` of `core` be inserted? `used`/`total` is the
    /// cache's occupancy in lines.
    fn admit(&mut self, core: CoreId, first: u64, count: u32, used: u32, total: u32) -> bool;
    /// Core lines `first..first + count` of `core` were mapped.
    fn on_inserted(&mut self, core: CoreId, first: u64, count: u32);
    /// Heap bytes held (for the RAM-per-line figure).
    fn heap_bytes(&self) -> usize;
}

/// Builds the policy `which` for a cache of `lines` lines.
pub fn build(which: PromotionPolicy, nhit: NhitParams, lines: u32) -> Box<dyn Promotion> {
    match which {
        PromotionPolicy::Always => Box::new(always::Always),
        PromotionPolicy::Nhit => Box::new(nhit::Nhit::new(nhit, lines)),
    }
}
